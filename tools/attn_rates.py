#!/usr/bin/env python3
"""Times one self-attention block on ONNX Runtime's CPU provider, as the exporter wrote it
(MatMul/Softmax/MatMul with the heads split by Reshape/Transpose, a padding mask) and as
`mmq compile -O2` fuses it (`com.microsoft.MultiHeadAttention`), over heads, head sizes, batch
and sequence lengths: the rates behind the ORT target's choice of where fused attention pays.

    MMQ_BIN=target/release/mmq .venv/bin/python tools/attn_rates.py [--threads 1] [--runs 200]

Prints one row per shape: median microseconds of each form and their ratio (fused / unfused;
below 1 the fused form is faster). Inputs are the block's Q/K/V projections' input `x`
(`[batch, seq, heads * head]`) and the mask.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

REPO = Path(__file__).resolve().parent.parent
MMQ = os.environ.get("MMQ_BIN", str(REPO / "target/release/mmq"))


def block(heads: int, head: int) -> onnx.ModelProto:
    """A BERT self-attention block in the TorchScript exporter's form."""
    rng = np.random.default_rng(0)
    d = heads * head
    inits, nodes = [], []

    def c(name, a):
        inits.append(nh.from_array(np.asarray(a), name))

    for n in "qkv":
        c(f"W{n}", (rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32))
        c(f"b{n}", (rng.standard_normal(d) * 0.1).astype(np.float32))
        nodes += [h.make_node("MatMul", ["x", f"W{n}"], [f"{n}0"]),
                  h.make_node("Add", [f"{n}0", f"b{n}"], [f"{n}1"]),
                  h.make_node("Reshape", [f"{n}1", "shape4"], [f"{n}2"])]
    c("shape4", np.array([0, 0, heads, head], np.int64))
    c("shape3", np.array([0, 0, d], np.int64))
    c("sqrt_d", np.array(np.sqrt(head), np.float32))
    c("one", np.array(1.0, np.float32))
    c("fmin", np.array(np.finfo(np.float32).min, np.float32))
    c("ax1", np.array([1], np.int64))
    c("ax2", np.array([2], np.int64))
    nodes += [
        h.make_node("Transpose", ["q2"], ["q3"], perm=[0, 2, 1, 3]),
        h.make_node("Transpose", ["k2"], ["k3"], perm=[0, 2, 3, 1]),
        h.make_node("Transpose", ["v2"], ["v3"], perm=[0, 2, 1, 3]),
        h.make_node("MatMul", ["q3", "k3"], ["s0"]),
        h.make_node("Div", ["s0", "sqrt_d"], ["s1"]),
        h.make_node("Unsqueeze", ["mask", "ax1"], ["m1"]),
        h.make_node("Unsqueeze", ["m1", "ax2"], ["m2"]),
        h.make_node("Cast", ["m2"], ["m3"], to=T.FLOAT),
        h.make_node("Sub", ["one", "m3"], ["m4"]),
        h.make_node("Mul", ["m4", "fmin"], ["m5"]),
        h.make_node("Add", ["s1", "m5"], ["s2"]),
        h.make_node("Softmax", ["s2"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v3"], ["o0"]),
        h.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["o1", "shape3"], ["y"]),
    ]
    g = h.make_graph(nodes, "attn", [h.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", d]),
                                     h.make_tensor_value_info("mask", T.INT64, ["batch", "seq"])],
                     [h.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", d])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def median_us(session: ort.InferenceSession, feeds: dict, runs: int) -> float:
    for _ in range(max(5, runs // 10)):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e6)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=200)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    rng = np.random.default_rng(1)
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s), median of {args.runs}")
    print("| heads x head | batch x seq | unfused us | fused us | fused / unfused |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for heads, head in [(4, 8), (4, 16), (4, 32), (8, 64), (12, 64)]:
            src, out = Path(tmp) / "src.onnx", Path(tmp) / "o2.onnx"
            onnx.save(block(heads, head), src)
            subprocess.run([MMQ, "compile", str(src), "-o", str(out), "-q"], check=True)
            fused = onnx.load(out)
            assert any(n.op_type == "MultiHeadAttention" for n in fused.graph.node), "not fused"
            a = ort.InferenceSession(str(src), opts, providers=["CPUExecutionProvider"])
            b = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
            for batch, seq in [(1, 8), (1, 32), (2, 32), (1, 128), (4, 128), (1, 512)]:
                x = rng.standard_normal((batch, seq, heads * head)).astype(np.float32)
                mask = np.ones((batch, seq), np.int64)
                mask[0, seq * 3 // 4:] = 0
                feeds = {"x": x, "mask": mask}
                ta, tb = median_us(a, feeds, args.runs), median_us(b, feeds, args.runs)
                print(f"| {heads} x {head} | {batch} x {seq} | {ta:.0f} | {tb:.0f} | {tb / ta:.2f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
