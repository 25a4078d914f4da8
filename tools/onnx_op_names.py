#!/usr/bin/env python3
"""Writes ir/src/onnx_ops.txt: every operator name of the ONNX default domain (all opsets) that the
installed onnx package defines. The verifier refuses default-domain ops outside the list.

    .venv/bin/python tools/onnx_op_names.py
"""

import pathlib

import onnx
import onnx.defs

schemas = [s for s in onnx.defs.get_all_schemas_with_history() if s.domain in ("", "ai.onnx")]
names = sorted({s.name for s in schemas})
top = max(s.since_version for s in schemas)
out = pathlib.Path(__file__).resolve().parents[1] / "ir" / "src" / "onnx_ops.txt"
with open(out, "w") as f:
    f.write(f"# Operator names of the ONNX default domain, every opset up to {top} (onnx {onnx.__version__}:\n")
    f.write("# onnx.defs.get_all_schemas_with_history()), one per line; regenerate with\n")
    f.write("# tools/onnx_op_names.py.\n")
    for n in names:
        f.write(n + "\n")
print(f"{out}: {len(names)} operators, opsets up to {top}")
