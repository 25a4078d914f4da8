#!/usr/bin/env python3
"""Compiles the real-weight models that PyPI packages ship at -O2 and checks ONNX Runtime on them.

    .venv-compare/bin/python tools/check_real_o2.py --mmq target/release/mmq [--rounds N] [NAME...]

For each model (installed by tools/requirements-compare-models.txt into .venv-compare) it runs
`mmq compile MODEL --target ort -O2`, loads the original and the output in ONNX Runtime, feeds
both the same seeded random inputs (sizes fitting each model) and prints the largest
`|out - ref| / (1 + |ref|)`, the BatchNormalization and Conv→Relu counts before and after, and
the node counts, and ONNX Runtime's latency of the output against the original's (one intra-op
thread, both sessions run in turn for --rounds rounds after warmup, ratio of the medians; below
1 the output is faster). A model whose package is missing is skipped with a note.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

SITE = Path(sysconfig.get_paths()["purelib"])
# name: (file inside site-packages, {input: shape} for the dims the file leaves open)
MODELS = {
    "ppocr-det-v6": ("rapidocr/models/PP-OCRv6_det_small.onnx", {"x": [1, 3, 96, 160]}),
    "ppocr-cls": ("rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx", {"x": [1, 3, 48, 192]}),
    "ppocr-rec-v6": ("rapidocr/models/PP-OCRv6_rec_small.onnx", {"x": [1, 3, 48, 160]}),
    "ddddocr": ("ddddocr/common.onnx", {"input1": [1, 1, 64, 160]}),
    "ddddocr-det": ("ddddocr/common_det.onnx", {}),
    "magika": ("magika/models/standard_v3_3/model.onnx", {}),
    "nudenet-320n": ("nudenet/320n.onnx", {"images": [1, 3, 320, 320]}),
    "silero-vad": ("silero_vad/data/silero_vad.onnx", {"input": [1, 512], "state": [2, 1, 128]}),
    "silero-vad-16k-op15": ("silero_vad/data/silero_vad_16k_op15.onnx",
                            {"input": [1, 512], "state": [2, 1, 128]}),
    "silero-vad-ifless": ("silero_vad/data/silero_vad_op18_ifless.onnx",
                          {"input": [1, 512], "state": [2, 1, 128]}),
}


def op_counts(g: onnx.GraphProto, c: collections.Counter) -> collections.Counter:
    for n in g.node:
        c[n.op_type] += 1
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                op_counts(a.g, c)
    return c


def conv_relu(g: onnx.GraphProto) -> int:
    users = collections.defaultdict(list)
    for n in g.node:
        for i in n.input:
            users[i].append(n)
    return sum(1 for n in g.node if n.op_type == "Conv"
               and [u.op_type for u in users[n.output[0]]] == ["Relu"])


def feeds(sess: ort.InferenceSession, shapes: dict, rng) -> dict:
    out = {}
    for i in sess.get_inputs():
        shape = shapes.get(i.name) or [d if isinstance(d, int) else 1 for d in i.shape]
        if "int64" in i.type:
            out[i.name] = (np.array(16000, np.int64) if i.name == "sr"
                           else rng.integers(0, 200, size=shape).astype(np.int64))
        elif "int32" in i.type:
            out[i.name] = rng.integers(0, 200, size=shape).astype(np.int32)
        elif "float16" in i.type:
            out[i.name] = rng.standard_normal(shape).astype(np.float16)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mmq", required=True)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("names", nargs="*")
    a = p.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (rel, shapes) in MODELS.items():
            if a.names and name not in a.names:
                continue
            src = SITE / rel
            if not src.exists():
                print(f"{name}: not installed ({rel})")
                continue
            out = Path(tmp) / f"{name}.onnx"
            r = subprocess.run([a.mmq, "compile", str(src), "--target", "ort", "-O2", "-o", str(out)],
                               capture_output=True, text=True)
            if r.returncode:
                print(f"{name}: mmq failed: {r.stderr.strip().splitlines()[-1:]}")
                bad += 1
                continue
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
            s0 = ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
            try:
                s1 = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
                f = feeds(s0, shapes, np.random.default_rng(0))
                err = max((float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))
                                        / (1 + np.abs(x.astype(np.float64)))))
                           if x.size else 0.0)
                          for x, y in zip(s0.run(None, f), s1.run(None, f)))
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                print(f"{name}: ONNX Runtime: {str(e)[:200]}")
                bad += 1
                continue
            g0, g1 = onnx.load(str(src)).graph, onnx.load(str(out)).graph
            c0, c1 = op_counts(g0, collections.Counter()), op_counts(g1, collections.Counter())
            times = ([], [])
            for r in range(a.rounds + 3):
                for sess, t in zip((s0, s1), times):
                    start = time.perf_counter()
                    sess.run(None, f)
                    if r >= 3:
                        t.append(time.perf_counter() - start)
            m0, m1 = statistics.median(times[0]), statistics.median(times[1])
            print(f"{name}: max err {err:.1e}; BatchNormalization {c0['BatchNormalization']} -> "
                  f"{c1['BatchNormalization']}; Conv->Relu {conv_relu(g0)} -> {conv_relu(g1)}; "
                  f"nodes {sum(c0.values())} -> {sum(c1.values())}; latency "
                  f"{m0 * 1e3:.2f} -> {m1 * 1e3:.2f} ms (x{m1 / m0:.2f})")
            bad += err > 1e-4
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
