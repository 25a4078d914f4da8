#!/usr/bin/env python3
"""Regenerates the INT8 placement rates of a target (`PlaceRates` in `passes/src/targets/ort/mod.rs`).

The placement cost model (docs/quantization.md, "Where INT8 pays") prices a quantized product as
`int_kernel + macs * int_mac` plus its activation quantization `q_kernel + elements * element`,
and the float product it would replace as `kernel + macs * float_mac`. This benchmark times, on
ONNX Runtime's CPU provider, for products M x K x N from 17x32x32 to 512x768x3072:

- a float `MatMul` (x[M,K] @ W[K,N]);
- the quantized unit mmq emits, `QuantizeLinear -> DequantizeLinear` on x and a per-column
  INT8 weight through `DequantizeLinear` into `MatMul` (ONNX Runtime fuses it into
  `QuantizeLinear -> MatMulIntegerToFloat`);
- a standalone `QuantizeLinear` of x (what the unit pays to quantize its activation);
- the INT4 weight-only product mmq emits for `--quant int4`, `com.microsoft.MatMulNBits` with
  symmetric blocks of 32 along K and `accuracy_level` 4;

then fits each by least squares on (1, multiply-accumulates) or (1, elements) with the median
times, and prints the table, the fitted rates, and a Rust literal to paste into the target's
module. `absorbed` (a Q/DQ folded into the kernel next to it) is not measured: it stays a small
constant. Run it on the machine the target stands for, nothing else busy:

    .venv/bin/python tools/place_rates.py [--threads 1] [--rounds 200]
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

SHAPES = [(17, 32, 32), (17, 32, 128), (64, 64, 64), (64, 64, 256), (128, 256, 256),
          (128, 768, 768), (128, 768, 3072), (1, 768, 768), (1, 4096, 4096), (512, 768, 768),
          (257, 384, 1536), (1, 384, 1536)]


def product(m, k, n, quant):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)
    inits, nodes = [], []
    if quant:
        s = np.abs(w).max(0) / 63
        inits += [nh.from_array(np.round(w / s).astype(np.int8), "wq"),
                  nh.from_array(s.astype(np.float32), "ws"),
                  nh.from_array(np.zeros(n, np.int8), "wz"),
                  nh.from_array(np.array(0.02, np.float32), "xs"),
                  nh.from_array(np.array(128, np.uint8), "xz")]
        nodes += [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
                  h.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
                  h.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=1),
                  h.make_node("MatMul", ["xd", "wd"], ["y"])]
        out = h.make_tensor_value_info("y", T.FLOAT, [m, n])
    else:
        inits += [nh.from_array(w, "w")]
        nodes += [h.make_node("MatMul", ["x", "w"], ["y"])]
        out = h.make_tensor_value_info("y", T.FLOAT, [m, n])
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [m, k])], [out], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def nbits(m, k, n):
    """`MatMulNBits`, 4-bit symmetric blocks of 32 along K (codes 8 +- 7), level 4."""
    rng = np.random.default_rng(0)
    blocks = k // 32
    codes = rng.integers(1, 16, size=(n, blocks, 32), dtype=np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    inits = [nh.from_array(packed, "b"),
             nh.from_array(np.full(n * blocks, 0.01, np.float32), "s")]
    nodes = [h.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain="com.microsoft",
                         K=k, N=n, bits=4, block_size=32, accuracy_level=4)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [m, k])],
                     [h.make_tensor_value_info("y", T.FLOAT, [m, n])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17),
                                          h.make_opsetid("com.microsoft", 1)]).SerializeToString()


def quantize_only(m, k):
    inits = [nh.from_array(np.array(0.02, np.float32), "xs"),
             nh.from_array(np.array(128, np.uint8), "xz")]
    nodes = [h.make_node("QuantizeLinear", ["x", "xs", "xz"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [m, k])],
                     [h.make_tensor_value_info("y", T.UINT8, [m, k])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def medians(models, x, rounds, threads):
    """Median microseconds of each model, runs interleaved so drift hits all alike."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sessions = [ort.InferenceSession(b, so, providers=["CPUExecutionProvider"]) for b in models]
    times = [[] for _ in sessions]
    for _ in range(5):
        for s in sessions:
            s.run(None, {"x": x})
    for _ in range(rounds):
        for i, s in enumerate(sessions):
            t = time.perf_counter()
            s.run(None, {"x": x})
            times[i].append(time.perf_counter() - t)
    return [float(np.median(t)) * 1e6 for t in times]


def fit(xs, ys):
    """Least-squares (intercept, slope) of ys on xs."""
    a = np.stack([np.ones(len(xs)), np.asarray(xs, np.float64)], axis=1)
    (c, r), *_ = np.linalg.lstsq(a, np.asarray(ys, np.float64), rcond=None)
    return float(c), float(r)


def fit3(ws, macs, ys):
    """Least squares of ys on (1, weights, macs), each row weighted by 1 / y."""
    y = np.asarray(ys, np.float64)
    a = np.stack([np.ones(len(ws)), np.asarray(ws, np.float64), np.asarray(macs, np.float64)],
                 axis=1)
    c, *_ = np.linalg.lstsq(a / y[:, None], np.ones(len(ys)), rcond=None)
    return [float(v) for v in c]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    ap.add_argument("--rounds", type=int, default=200,
                    help="timed runs per model for small products (a tenth for large ones)")
    args = ap.parse_args()
    rows = []
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s)")
    print(f"{'M':>5} {'K':>5} {'N':>5} {'float_us':>10} {'int_us':>10} {'q_us':>8} {'int/float':>9}"
          f" {'int4_us':>9} {'int4/float':>10}")
    for m, k, n in SHAPES:
        x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
        rounds = args.rounds if m * k * n < 1e7 else max(args.rounds // 10, 10)
        f, q, qo, q4 = medians([product(m, k, n, 0), product(m, k, n, 1), quantize_only(m, k),
                                nbits(m, k, n)], x, rounds, args.threads)
        rows.append((m, k, n, f, q, qo, q4))
        print(f"{m:>5} {k:>5} {n:>5} {f:>10.1f} {q:>10.1f} {qo:>8.1f} {q / f:>9.3f}"
              f" {q4:>9.1f} {q4 / f:>10.3f}")
    macs = [m * k * n for m, k, n, *_ in rows]
    elems = [m * k for m, k, *_ in rows]
    kernel, float_mac = fit(macs, [r[3] for r in rows])
    q_kernel, element = fit(elems, [r[5] for r in rows])
    # The unit's own time less its activation quantization is the integer product.
    int_kernel, int_mac = fit(macs, [r[4] - (q_kernel + e * element) for r, e in zip(rows, elems)])
    # INT4 reads half a byte per weight where float reads four: both forms priced per kernel,
    # per weight (what one-row products are bound by) and per multiply-accumulate, fitted on
    # relative error (Int4Rates).
    weights = [k * n for _, k, n, *_ in rows]
    f3 = fit3(weights, macs, [r[3] for r in rows])
    n3 = fit3(weights, macs, [r[6] for r in rows])
    print()
    print("fitted (microseconds; rates per multiply-accumulate or element):")
    print(f"  float kernel {kernel:.2f}, {1 / float_mac:,.0f} MACs/us")
    print(f"  int kernel   {int_kernel:.2f}, {1 / int_mac:,.0f} MACs/us")
    print(f"  quantize     {q_kernel:.2f}, {1 / element:,.0f} elements/us")

    print()
    print("PlaceRates {")
    print(f"    kernel: {max(kernel, 0.1):.2f},")
    print(f"    int_kernel: {max(int_kernel, 0.1):.2f},")
    print(f"    q_kernel: {max(q_kernel, 0.1):.2f},")
    for name, rate in [("float_mac", float_mac), ("int_mac", int_mac), ("element", element)]:
        print(f"    {name}: 1.0 / {round(1 / rate):_}.0,")
    print("    absorbed: 0.05,")
    print("}")
    print()
    print("Int4Rates {")
    for prefix, (kern, per_w, per_mac) in [("float", f3), ("nbits", n3)]:
        print(f"    {prefix}_kernel: {kern:.2f},")
        print(f"    {prefix}_weight: 1.0 / {round(1 / per_w):_}.0,")
        print(f"    {prefix}_mac: 1.0 / {round(1 / per_mac):_}.0,")
    print("}")


if __name__ == "__main__":
    main()
