"""Writes single-op models and their inputs for the interpreter benchmark
(`cargo bench -p mmq-tests --bench interp`): `python tools/gen_op_bench.py OUT_DIR`. The sizes are
those of a MiniLM-L6 sentence encoder's MLP at batch 4 (4 x 128 tokens x 1536)."""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h

SHAPE = [4, 128, 1536]


def main(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(SHAPE) * 2).astype(np.float32)
    for name, node, opset in [
        ("gelu", h.make_node("Gelu", ["x"], ["y"]), 20),
        ("erf", h.make_node("Erf", ["x"], ["y"]), 17),
    ]:
        g = h.make_graph([node], name, [h.make_tensor_value_info("x", T.FLOAT, SHAPE)],
                         [h.make_tensor_value_info("y", T.FLOAT, SHAPE)])
        m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
        m.ir_version = 9
        d = out / name
        d.mkdir(exist_ok=True)
        onnx.save(m, d / "model.onnx")
        np.savez(d / "inputs.npz", x=x)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
