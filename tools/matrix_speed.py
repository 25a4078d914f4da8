#!/usr/bin/env python3
"""Each export-matrix cell with a LayerNormalization: the export against `mmq compile -O2`
(target/release/mmq) on ONNX Runtime's CPU provider, 1 thread, 300 interleaved runs on the cell's
inputs; prints the medians and the cells where -O2 is more than 2 % slower.

    .venv/bin/python tools/matrix_speed.py
"""
import sys, subprocess, time, pathlib, numpy as np, onnxruntime as ort, onnx
root = pathlib.Path("tests/fixtures/matrix")
rows = []
for d in sorted(p for p in root.iterdir() if (p / "model.onnx").exists()):
    m = onnx.load(str(d / "model.onnx"), load_external_data=False)
    if not any(n.op_type == "LayerNormalization" for n in m.graph.node):
        continue
    out = f"/tmp/ms/{d.name}.onnx"
    pathlib.Path("/tmp/ms").mkdir(exist_ok=True)
    r = subprocess.run(["target/release/mmq", "compile", str(d / "model.onnx"), "-o", out], capture_output=True, text=True)
    if r.returncode:
        print(d.name, "compile failed", r.stderr[-200:]); continue
    sums = onnx.load(out, load_external_data=False)
    nsum = sum(n.op_type == "Sum" for n in sums.graph.node)
    x = dict(np.load(d / "inputs.npz"))
    so = ort.SessionOptions(); so.intra_op_num_threads = 1
    ss = [ort.InferenceSession(p, so, providers=["CPUExecutionProvider"]) for p in (str(d / "model.onnx"), out)]
    feeds = [{i.name: x[i.name] for i in s.get_inputs() if i.name in x} for s in ss]
    ts = [[], []]
    for _ in range(10):
        for s, f in zip(ss, feeds): s.run(None, f)
    for _ in range(300):
        for i, (s, f) in enumerate(zip(ss, feeds)):
            a = time.perf_counter(); s.run(None, f); ts[i].append(time.perf_counter() - a)
    a, b = (np.median(t) * 1e6 for t in ts)
    rows.append((d.name, nsum, a, b))
    print(f"{d.name:45} sums {nsum:2}  export {a:8.1f} us  -O2 {b:8.1f} us  {b/a:.3f}", flush=True)
print("slower than the export:", [r[0] for r in rows if r[3] > r[2] * 1.02])
