"""Residual norms in ONNX Runtime: the fused contrib ops against the standard ops they replace.

For each size (tokens x hidden) it times, interleaved in one process with 1 intra-op thread:

- `Add` + `LayerNormalization` with graph optimizations off, and at ONNX Runtime's default level
  (which fuses the pair into `SkipLayerNormalization` by itself where it can);
- `com.microsoft.SkipLayerNormalization`;
- `Add` + `RMSNormalization` (opset 23) and `com.microsoft.SkipSimplifiedLayerNormalization`.

The sum of the residual add is a graph output in every variant, as in a transformer's residual
stream, where the sum feeds the next block. Prints a Markdown table of medians (microseconds)
and the fused/unfused ratios; `docs/benchmarks.md` quotes it.

    .venv/bin/python tools/norm_rates.py [--rounds 300] [--sizes 17x32,197x768,...]
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

DEFAULT_SIZES = "17x32,197x32,1x4096,197x768,512x4096"


def model(tok, hid, variant):
    rng = np.random.default_rng(0)
    gamma = (1 + 0.1 * rng.standard_normal(hid)).astype(np.float32)
    beta = (0.1 * rng.standard_normal(hid)).astype(np.float32)
    inits = [h.make_tensor("g", T.FLOAT, [hid], gamma), h.make_tensor("b", T.FLOAT, [hid], beta)]
    ins = [h.make_tensor_value_info(n, T.FLOAT, [1, tok, hid]) for n in ("x", "r")]
    outs = [h.make_tensor_value_info(n, T.FLOAT, [1, tok, hid]) for n in ("y", "s")]
    ms = "com.microsoft"
    nodes = {
        "add+ln": [
            h.make_node("Add", ["x", "r"], ["s"]),
            h.make_node("LayerNormalization", ["s", "g", "b"], ["y"], epsilon=1e-6, axis=-1),
        ],
        "skipln": [
            h.make_node("SkipLayerNormalization", ["x", "r", "g", "b"], ["y", "", "", "s"],
                        domain=ms, epsilon=1e-6),
        ],
        "add+rms": [
            h.make_node("Add", ["x", "r"], ["s"]),
            h.make_node("RMSNormalization", ["s", "g"], ["y"], epsilon=1e-6, axis=-1),
        ],
        "skiprms": [
            h.make_node("SkipSimplifiedLayerNormalization", ["x", "r", "g"], ["y", "", "", "s"],
                        domain=ms, epsilon=1e-6),
        ],
    }[variant]
    g = h.make_graph(nodes, variant, ins, outs, inits)
    ops = [h.make_opsetid("", 23), h.make_opsetid(ms, 1)]
    return h.make_model(g, opset_imports=ops, ir_version=10).SerializeToString()


def session(tok, hid, variant, optimize):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model(tok, hid, variant), so,
                                providers=["CPUExecutionProvider"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300, help="timed rounds (fewer on big sizes)")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="tokens x hidden, comma-separated")
    args = ap.parse_args()
    names = [("add+ln", False), ("add+ln", True), ("skipln", True), ("add+rms", False),
             ("skiprms", True)]
    print(f"ONNX Runtime {ort.__version__}, 1 intra-op thread, medians in microseconds\n")
    print("| tokens x hidden | Add+LN (no opt) | Add+LN (default opt) | SkipLN | SkipLN / Add+LN "
          "| Add+RMS (no opt) | SkipSimplifiedLN | SkipSimplifiedLN / Add+RMS |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        tok, hid = (int(x) for x in size.lower().split("x"))
        sessions = [session(tok, hid, v, o) for v, o in names]
        rng = np.random.default_rng(1)
        feeds = {n: rng.standard_normal((1, tok, hid)).astype(np.float32) for n in ("x", "r")}
        ref = sessions[0].run(None, feeds)
        for s in sessions[1:3]:
            got = s.run(None, feeds)
            assert all(np.abs(a - b).max() < 1e-3 for a, b in zip(ref, got)), "LN variants differ"
        rounds = args.rounds if tok * hid <= 200_000 else max(30, args.rounds // 5)
        for s in sessions:
            for _ in range(5):
                s.run(None, feeds)
        times = [[] for _ in sessions]
        for _ in range(rounds):
            for i, s in enumerate(sessions):
                t = time.perf_counter()
                s.run(None, feeds)
                times[i].append(time.perf_counter() - t)
        m = [float(np.median(t)) * 1e6 for t in times]
        print(f"| {tok} x {hid} | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | {m[2] / m[0]:.2f} "
              f"| {m[3]:.1f} | {m[4]:.1f} | {m[4] / m[3]:.2f} |")


if __name__ == "__main__":
    main()
