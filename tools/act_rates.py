#!/usr/bin/env python3
"""The fused contrib ops the ORT target emits besides attention and norms, against the standard
ops they replace, as ONNX Runtime runs them at its default optimization level (which fuses some
standard forms by itself), 1 intra-op thread, interleaved in one process:

- `BiasGelu(x, b)` against `Add(x, b)` and the exact GELU `0.5 * y * (1 + Erf(y / sqrt(2)))`;
- `FastGelu(x, b)` against `Add` and the tanh approximation;
- `QuickGelu(x)` (alpha 1.702) against `x * Sigmoid(1.702 * x)`;
- `FusedMatMul(a, b, transB = 1, alpha)` against `MatMul(a, Transpose(b)) * alpha`.

Sizes are tokens x hidden (the MatMul multiplies [tokens, hidden] by [hidden, hidden]ᵀ). Prints a
Markdown table of medians (microseconds) and fused / standard ratios; docs/benchmarks.md
quotes it.

    .venv/bin/python tools/act_rates.py [--rounds 300] [--sizes 17x32,197x384,...]
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

DEFAULT_SIZES = "17x32,64x64,197x384,197x768,1x4096,512x1024"
MS = "com.microsoft"


def graph(name, tok, hid, nodes, inits, extra_inputs=()):
    ins = [h.make_tensor_value_info("x", T.FLOAT, [1, tok, hid])]
    ins += [h.make_tensor_value_info(n, T.FLOAT, s) for n, s in extra_inputs]
    outs = [h.make_tensor_value_info("y", T.FLOAT, None)]
    g = h.make_graph(nodes, name, ins, outs, inits)
    ops = [h.make_opsetid("", 17), h.make_opsetid(MS, 1)]
    return h.make_model(g, opset_imports=ops, ir_version=9).SerializeToString()


def c(name, value):
    return nh.from_array(np.asarray(value, np.float32), name)


def pairs(tok, hid):
    rng = np.random.default_rng(0)
    bias = c("b", 0.1 * rng.standard_normal(hid))
    w = c("w", rng.standard_normal((hid, hid)) / np.sqrt(hid))
    n = h.make_node
    exact = [n("Add", ["x", "b"], ["u"]), n("Div", ["u", "r2"], ["d"]), n("Erf", ["d"], ["e"]),
             n("Add", ["e", "one"], ["e1"]), n("Mul", ["u", "e1"], ["m"]),
             n("Mul", ["m", "half"], ["y"])]
    k = np.sqrt(2 / np.pi)
    tanh = [n("Add", ["x", "b"], ["u"]), n("Mul", ["u", "u"], ["u2"]), n("Mul", ["u2", "u"], ["u3"]),
            n("Mul", ["u3", "c3"], ["t0"]), n("Add", ["u", "t0"], ["t1"]),
            n("Mul", ["t1", "k"], ["t2"]), n("Tanh", ["t2"], ["t3"]), n("Add", ["t3", "one"], ["t4"]),
            n("Mul", ["u", "t4"], ["t5"]), n("Mul", ["t5", "half"], ["y"])]
    consts = [bias, c("r2", np.sqrt(2)), c("one", 1.0), c("half", 0.5), c("c3", 0.044715), c("k", k)]
    return {
        "BiasGelu": (graph("fused", tok, hid, [n("BiasGelu", ["x", "b"], ["y"], domain=MS)], [bias]),
                     graph("std", tok, hid, exact, consts)),
        "FastGelu": (graph("fused", tok, hid, [n("FastGelu", ["x", "b"], ["y"], domain=MS)], [bias]),
                     graph("std", tok, hid, tanh, consts)),
        "QuickGelu": (graph("fused", tok, hid,
                            [n("QuickGelu", ["x"], ["y"], domain=MS, alpha=1.702)], []),
                      graph("std", tok, hid, [n("Mul", ["x", "a"], ["s0"]),
                                              n("Sigmoid", ["s0"], ["s1"]),
                                              n("Mul", ["x", "s1"], ["y"])], [c("a", 1.702)])),
        "FusedMatMul": (graph("fused", tok, hid,
                              [n("FusedMatMul", ["x", "w"], ["y"], domain=MS, transB=1,
                                 alpha=0.125)], [w]),
                        graph("std", tok, hid, [n("Transpose", ["w"], ["wt"], perm=[1, 0]),
                                                n("MatMul", ["x", "wt"], ["m"]),
                                                n("Mul", ["m", "s"], ["y"])], [w, c("s", 0.125)])),
    }


def medians(models, x, rounds):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    ss = [ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]) for m in models]
    for s in ss:
        for _ in range(5):
            s.run(None, {"x": x})
    t = [[] for _ in ss]
    for _ in range(rounds):
        for i, s in enumerate(ss):
            a = time.perf_counter()
            s.run(None, {"x": x})
            t[i].append(time.perf_counter() - a)
    return [float(np.median(v)) * 1e6 for v in t]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    args = ap.parse_args()
    print(f"onnxruntime {ort.__version__}, 1 thread, medians of {args.rounds} interleaved runs")
    print("| op | tokens x hidden | fused µs | standard µs (default opt) | fused / standard |")
    print("|---|---|---|---|---|")
    for size in args.sizes.split(","):
        tok, hid = (int(v) for v in size.split("x"))
        x = np.random.default_rng(1).standard_normal((1, tok, hid)).astype(np.float32)
        for op, (fused, std) in pairs(tok, hid).items():
            f, s = medians([fused, std], x, args.rounds)
            print(f"| {op} | {tok} x {hid} | {f:.1f} | {s:.1f} | {f / s:.2f} |", flush=True)


if __name__ == "__main__":
    main()
