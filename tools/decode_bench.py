#!/usr/bin/env python3
"""One-token decode over a 512-token past: mmq's INT4 outputs against ONNX Runtime's, in one
process, interleaved (docs/benchmarks.md, "INT4 decode").

    .venv-compare/bin/python tools/decode_bench.py --mmq target/release/mmq OUT_DIR \\
        [--layers 4 --hidden 2048 --inter 5632 --heads 16 --vocab 8000 --past 512]
        [--threads 2 --runs 30] [--variants mmq:32,mmq:128,mmq:32:4,ort:32,ort:128:4]

The model is a LLaMA-style decoder step written here with random weights (no embedding: the
input is the token's hidden state; RMS norms, attention over the past keys and values, a SiLU
MLP, an LM head), batch 1, float32, its weights in external data. Each variant is one INT4
output: `mmq:BLOCK[:LEVEL]` is `mmq compile --target ort --quant int4 --block BLOCK` (LEVEL:
`--int4-accuracy-level LEVEL`; none: the target's choice), `ort:BLOCK[:LEVEL]` is ONNX Runtime's
`MatMulNBitsQuantizer` (symmetric, `accuracy_level` LEVEL), `mmq-O2` is the float32 model through
`mmq compile --target ort -O2` (no quantization). Every session (the float32 model
too) is loaded once; then each round runs every session once, in order, and the median time
per session is reported with its ratio to float32 and the cosine of its logits to float32's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def build(out: Path, layers: int, hidden: int, inter: int, heads: int, vocab: int,
          past: int):
    rng = np.random.default_rng(0)
    hd = hidden // heads
    inits, nodes = [], []

    def weight(name, shape, scale):
        inits.append(nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def const(name, arr):
        inits.append(nh.from_array(np.asarray(arr), name))
        return name

    const("axes_last", np.array([-1], np.int64))
    const("eps", np.array(1e-5, np.float32))
    const("shape_heads", np.array([1, 1, heads, hd], np.int64))
    const("shape_hidden", np.array([1, 1, hidden], np.int64))
    const("attn_scale", np.array(1.0 / np.sqrt(hd), np.float32))

    def rms(x, tag):
        g = weight(f"{tag}.gamma", [hidden], 0.1)
        nodes.extend([
            h.make_node("Mul", [x, x], [f"{tag}.sq"]),
            h.make_node("ReduceMean", [f"{tag}.sq", "axes_last"], [f"{tag}.ms"], keepdims=1),
            h.make_node("Add", [f"{tag}.ms", "eps"], [f"{tag}.mse"]),
            h.make_node("Sqrt", [f"{tag}.mse"], [f"{tag}.rms"]),
            h.make_node("Div", [x, f"{tag}.rms"], [f"{tag}.n"]),
            h.make_node("Mul", [f"{tag}.n", g], [f"{tag}.out"]),
        ])
        return f"{tag}.out"

    def linear(x, tag, k, n):
        w = weight(f"{tag}.weight", [k, n], 1.0 / np.sqrt(k))
        nodes.append(h.make_node("MatMul", [x, w], [f"{tag}.out"]))
        return f"{tag}.out"

    inputs = [h.make_tensor_value_info("hidden", T.FLOAT, [1, 1, hidden])]
    outputs = [h.make_tensor_value_info("logits", T.FLOAT, [1, 1, vocab])]
    x = "hidden"
    for i in range(layers):
        p = f"l{i}"
        n = rms(x, f"{p}.ln1")
        q, k, v = (linear(n, f"{p}.{t}", hidden, hidden) for t in "qkv")
        heads_of = {}
        for t, val in (("q", q), ("k", k), ("v", v)):
            nodes.append(h.make_node("Reshape", [val, "shape_heads"], [f"{p}.{t}4"]))
            nodes.append(h.make_node("Transpose", [f"{p}.{t}4"], [f"{p}.{t}h"], perm=[0, 2, 1, 3]))
            heads_of[t] = f"{p}.{t}h"
        for t in "kv":
            inputs.append(h.make_tensor_value_info(f"past.{i}.{t}", T.FLOAT, [1, heads, past, hd]))
            outputs.append(h.make_tensor_value_info(f"present.{i}.{t}", T.FLOAT, [1, heads, past + 1, hd]))
            nodes.append(h.make_node("Concat", [f"past.{i}.{t}", heads_of[t]], [f"present.{i}.{t}"], axis=2))
        nodes.extend([
            h.make_node("Transpose", [f"present.{i}.k"], [f"{p}.kt"], perm=[0, 1, 3, 2]),
            h.make_node("MatMul", [heads_of["q"], f"{p}.kt"], [f"{p}.s"]),
            h.make_node("Mul", [f"{p}.s", "attn_scale"], [f"{p}.ss"]),
            h.make_node("Softmax", [f"{p}.ss"], [f"{p}.p"], axis=-1),
            h.make_node("MatMul", [f"{p}.p", f"present.{i}.v"], [f"{p}.o4"]),
            h.make_node("Transpose", [f"{p}.o4"], [f"{p}.ot"], perm=[0, 2, 1, 3]),
            h.make_node("Reshape", [f"{p}.ot", "shape_hidden"], [f"{p}.o"]),
        ])
        o = linear(f"{p}.o", f"{p}.wo", hidden, hidden)
        nodes.append(h.make_node("Add", [x, o], [f"{p}.h1"]))
        n2 = rms(f"{p}.h1", f"{p}.ln2")
        g = linear(n2, f"{p}.gate", hidden, inter)
        u = linear(n2, f"{p}.up", hidden, inter)
        nodes.extend([
            h.make_node("Sigmoid", [g], [f"{p}.gs"]),
            h.make_node("Mul", [g, f"{p}.gs"], [f"{p}.silu"]),
            h.make_node("Mul", [f"{p}.silu", u], [f"{p}.act"]),
        ])
        d = linear(f"{p}.act", f"{p}.down", inter, hidden)
        nodes.append(h.make_node("Add", [f"{p}.h1", d], [f"{p}.h2"]))
        x = f"{p}.h2"
    n = rms(x, "final")
    w = weight("lm_head.weight", [hidden, vocab], 1.0 / np.sqrt(hidden))
    nodes.append(h.make_node("MatMul", [n, w], ["logits"]))
    g = h.make_graph(nodes, "decoder_step", inputs, outputs, inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 18)])
    m.ir_version = 9
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(m, out / "model.onnx", save_as_external_data=True, location="model.onnx.data",
              size_threshold=1024)
    feeds = {"hidden": rng.standard_normal([1, 1, hidden]).astype(np.float32)}
    for i in range(layers):
        for t in "kv":
            feeds[f"past.{i}.{t}"] = rng.standard_normal([1, heads, past, hd]).astype(np.float32)
    np.savez(out / "inputs.npz", **feeds)


def quantize(variant: str, src: Path, out: Path, mmq: str) -> Path:
    tool, *rest = variant.split(":")
    block, *level = rest or ["0"]
    dst = out / variant.replace(":", "_")
    # Made again on every run: an output left by an earlier mmq would measure that mmq.
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir(parents=True)
    model = dst / "model.onnx"
    if tool == "mmq-O2":
        subprocess.run([mmq, "compile", str(src), "--target", "ort", "-O2", "-o", str(model)],
                       check=True, stdout=subprocess.DEVNULL)
    elif tool == "mmq":
        cmd = [mmq, "compile", str(src), "--target", "ort", "--quant", "int4", "--block", block,
               "--no-accuracy", "-o", str(model)]
        if level:
            cmd += ["--int4-accuracy-level", level[0]]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    else:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        qz = MatMulNBitsQuantizer(onnx.load(str(src)), block_size=int(block), is_symmetric=True,
                                  accuracy_level=int(level[0]) if level else None)
        qz.process()
        qz.model.save_model_to_file(str(model), use_external_data_format=True)
    return model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--mmq", default="target/release/mmq")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--inter", type=int, default=5632)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--past", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--variants", default="mmq:32,mmq:128,mmq:32:4,mmq:128:4,ort:32,ort:128:4")
    a = p.parse_args(argv)
    import onnxruntime as ort

    src = a.out / "fp32" / "model.onnx"
    # The float32 model is kept between runs only while its shape arguments are the same.
    shape = {k: getattr(a, k) for k in ("layers", "hidden", "inter", "heads", "vocab", "past")}
    stamp = src.parent / "shape.json"
    if not src.exists() or not stamp.exists() or json.loads(stamp.read_text()) != shape:
        shutil.rmtree(src.parent, ignore_errors=True)
        build(src.parent, **shape)
        stamp.write_text(json.dumps(shape))
    feeds = dict(np.load(src.parent / "inputs.npz"))
    models = {"fp32": src}
    for v in a.variants.split(","):
        models[v] = quantize(v, src, a.out, a.mmq)
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sessions = {k: ort.InferenceSession(str(m), so, providers=["CPUExecutionProvider"])
                for k, m in models.items()}
    logits = {}
    for k, s in sessions.items():
        names = {i.name for i in s.get_inputs()}
        logits[k] = s.run(["logits"], {n: v for n, v in feeds.items() if n in names})[0].ravel()
    times = {k: [] for k in sessions}
    for _ in range(a.runs):
        for k, s in sessions.items():
            t = time.perf_counter()
            s.run(["logits"], feeds)
            times[k].append(time.perf_counter() - t)
    base = statistics.median(times["fp32"])
    rows = []
    for k in sessions:
        med = statistics.median(times[k])
        ref, got = logits["fp32"], logits[k]
        cos = float(np.dot(ref, got) / (np.linalg.norm(ref) * np.linalg.norm(got)))
        attrs = set()
        for node in onnx.load(str(models[k]), load_external_data=False).graph.node:
            if node.op_type == "MatMulNBits":
                for at in node.attribute:
                    if at.name in ("accuracy_level", "block_size"):
                        attrs.add(f"{at.name}={h.get_attribute_value(at)}")
        rows.append({"variant": k, "median_ms": med * 1e3, "x_fp32": med / base, "cosine": cos,
                     "attrs": sorted(attrs)})
        print(f"{k:<12} {med * 1e3:8.2f} ms  x{med / base:5.2f}  cos {cos:.5f}  {' '.join(sorted(attrs))}")
    (a.out / "decode_bench.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
