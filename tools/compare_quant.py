#!/usr/bin/env python3
"""Compares `mmq compile --quant ...` with `onnxruntime.quantization` on the same samples.

    .venv-fixtures/bin/python tools/compare_quant.py --mmq target/release/mmq [--json OUT.json]
        [--only vit,clip] [--model NAME=MODEL.onnx[,INPUTS.npz|,SAMPLES_DIR] ...]
        [--schemes int8,int8-dynamic,int4] [--calib 16] [--held 8] [--repeat 3] [--rounds 30]
        [--warmup 3] [--threads 0] [--keep DIR]
        [--mmq-cmd TEMPLATE] [--mmq-cmd-for SCHEME=TEMPLATE ...]

(`.venv/bin/python` works too, except that ONNX Runtime's MatMulNBitsQuantizer imports
`onnx_ir`, which only `.venv-fixtures` and `.venv-compare` (tools/requirements-compare.txt) have;
without it that column reads "error: ...". tools/real_models.py prepares real-weight models
shipped in PyPI packages with realistic samples and prints their --model arguments.)

For every subject (each fixture under tests/fixtures, each --model) it

  1. writes --calib calibration samples and --held held-back samples as one `.npz` per sample,
     keyed by input name, drawn from the subject's stored inputs (same shapes; float inputs
     normal with the stored mean and spread; integer inputs that index an embedding table
     uniform over its rows; masks, positions and other integers kept as stored); both tools
     read the same calibration folder. A --model whose second part is a folder with `calib/`
     and `held/` subfolders of such `.npz` files uses those samples as they are;
  2. quantizes with each tool, in a child process, --repeat times (the median is reported),
     timing only the tool:
        int8          mmq --quant int8         vs quantize_static (QDQ, per channel, MinMax)
        int8-dynamic  mmq --quant int8-dynamic vs quantize_dynamic (QInt8)
        int4          mmq --quant int4         vs MatMulNBitsQuantizer (4 bits, block 32, symmetric);
                      only for models with a MatMul or Gemm, "n/a" otherwise
        fp8           mmq --quant fp8          (no ONNX Runtime counterpart)
     The mmq command is a template (--mmq-cmd for every scheme, --mmq-cmd-for SCHEME=... for
     one) with the fields {mmq} {model} {out} {calib} {scheme} {block} {report}; the default is
     DEFAULT_MMQ_CMD below. When the template writes {report}, the row also shows the cosine
     mmq's own accuracy report measured in its interpreter;
  3. in a child process per subject: runs the original and every quantized model in ONNX
     Runtime (default graph optimizations) on the held-back samples and reports the cosine of
     the main output (the first floating-point output with at least two elements, as in mmq's
     report) against the original's (mean and minimum over samples)
     and the top-1 agreement along its last axis; then times every model on the first held-back
     sample in interleaved rounds (one run of each model per round, the order rotating), and
     reports medians and the ratio to the original.

A tool or model that fails puts "error: ..." in its cells and the run goes on. Prints one
markdown table per subject; --json writes every number.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
ERROR_MAX = 400

DEFAULT_MMQ_CMD = ("{mmq} compile {model} --target ort -o {out} --quant {scheme} "
                   "--calib {calib} --report {report}")
DEFAULT_MMQ_CMD_FOR = {
    "int4": ("{mmq} compile {model} --target ort -o {out} --quant int4 --block {block} "
             "--calib {calib} --report {report}"),
}
# scheme -> the ONNX Runtime tool it is compared with
ORT_TOOL = {
    "int8": "quantize_static",
    "int8-dynamic": "quantize_dynamic",
    "int4": "MatMulNBitsQuantizer",
    "fp8": None,
}
SCHEMES = tuple(ORT_TOOL)


# --------------------------------------------------------------------------
# helpers


def short(text: Any, limit: int = ERROR_MAX) -> str:
    parts = [line.strip() for line in str(text).splitlines()]
    line = "; ".join(p for p in parts if p)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def err(text: Any) -> str:
    return "error: " + short(text)


def is_err(x: Any) -> bool:
    return isinstance(x, str) and x.startswith("error:")


def failure_reason(proc: subprocess.CompletedProcess) -> str:
    """The most telling line of a failed command: the last error-looking line of stderr."""
    lines = [l.strip() for l in (proc.stderr or "").splitlines() if l.strip()]
    if proc.returncode < 0:
        return f"killed by signal {-proc.returncode}"
    for line in reversed(lines):
        if "error" in line.lower() or "exception" in line.lower():
            return f"exit {proc.returncode}: {line}"
    return f"exit {proc.returncode}: {lines[-1] if lines else '(no output)'}"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def markdown(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(x: Any) -> str:
        return fmt(x).replace("|", "\\|")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# --------------------------------------------------------------------------
# samples


def embedding_vocab(model_path: Path) -> dict[str, int]:
    """Graph input name -> rows of the embedding table it indexes (a Gather whose data is an
    initializer or Constant and whose indices are the input, possibly through Cast/Reshape/
    Unsqueeze/Flatten)."""
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    g = m.graph
    shapes = {i.name: list(i.dims) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and n.output:
                    shapes[n.output[0]] = list(a.t.dims)
    source = {}  # value -> graph input it is a pass-through of
    inputs = {i.name for i in g.input}
    for name in inputs:
        source[name] = name
    vocab: dict[str, int] = {}
    for n in g.node:
        if n.op_type in ("Cast", "Reshape", "Unsqueeze", "Flatten", "Squeeze", "Identity") \
                and n.input and n.input[0] in source:
            for o in n.output:
                source[o] = source[n.input[0]]
        if n.op_type == "Gather" and len(n.input) >= 2 and n.input[1] in source:
            data = shapes.get(n.input[0])
            axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
            if data and axis == 0:
                name = source[n.input[1]]
                vocab[name] = min(vocab.get(name, data[0]), data[0])
    return vocab


def template_inputs(model_path: Path, inputs_npz: Path | None) -> dict[str, Any]:
    """The stored inputs, or, without a file, arrays built from the declared input types
    (symbolic dims: 1 for batch-like names, 8 otherwise)."""
    import numpy as np
    import onnx

    if inputs_npz is not None and inputs_npz.exists():
        with np.load(inputs_npz) as z:
            return {k: z[k] for k in z.files}
    m = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dims = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            else:
                dims.append(1 if "batch" in d.dim_param.lower() else 8)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            out[i.name] = np.zeros(dims, dtype)
        elif "mask" in i.name.lower():
            out[i.name] = np.ones(dims, dtype)
        elif "position" in i.name.lower():
            out[i.name] = np.broadcast_to(np.arange(dims[-1] if dims else 1), dims).astype(dtype)
        else:
            out[i.name] = np.zeros(dims, dtype)
    return out


def draw_sample(template: dict[str, Any], vocab: dict[str, int], rng) -> dict[str, Any]:
    import numpy as np

    out = {}
    for name, ref in template.items():
        if np.issubdtype(ref.dtype, np.floating):
            mean = float(ref.mean()) if ref.size else 0.0
            std = float(ref.std()) if ref.size else 1.0
            std = std if std > 0 else 1.0
            out[name] = (rng.standard_normal(ref.shape) * std + mean).astype(ref.dtype)
        elif name in vocab and np.issubdtype(ref.dtype, np.integer):
            out[name] = rng.integers(0, vocab[name], size=ref.shape).astype(ref.dtype)
        else:
            out[name] = ref.copy()
    return out


def write_samples(model_path: Path, inputs_npz: Path | None, workdir: Path, n_calib: int,
                  n_held: int, seed: int) -> tuple[Path, Path]:
    import numpy as np

    if inputs_npz is not None and inputs_npz.is_dir():
        calib, held = inputs_npz / "calib", inputs_npz / "held"
        for d in (calib, held):
            if not any(d.glob("*.npz")):
                raise ValueError(f"{d} holds no .npz samples")
        return calib, held
    template = template_inputs(model_path, inputs_npz)
    vocab = embedding_vocab(model_path)
    rng = np.random.default_rng(seed)
    calib, held = workdir / "calib", workdir / "held"
    for d, n in ((calib, n_calib), (held, n_held)):
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            np.savez(d / f"{i:04d}.npz", **draw_sample(template, vocab, rng))
    return calib, held


# --------------------------------------------------------------------------
# quantization tools (each in a child process: `compare_quant.py --child-tool ...`)


def child_tool(tool: str, model: str, out: str, calib: str, block: int) -> dict[str, Any]:
    """Runs one ONNX Runtime quantization tool; returns its time (imports excluded)."""
    import numpy as np
    import onnx
    from onnxruntime import quantization as q

    files = sorted(Path(calib).glob("*.npz"))

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(files)

        def get_next(self):
            f = next(self.it, None)
            if f is None:
                return None
            with np.load(f) as z:
                return {k: z[k] for k in z.files}

        def rewind(self) -> None:
            self.it = iter(files)

    if tool == "quantize_static":
        start = time.perf_counter()
        q.quantize_static(model, out, Reader(), quant_format=q.QuantFormat.QDQ, per_channel=True,
                          calibrate_method=q.CalibrationMethod.MinMax,
                          activation_type=q.QuantType.QInt8, weight_type=q.QuantType.QInt8)
    elif tool == "quantize_dynamic":
        start = time.perf_counter()
        q.quantize_dynamic(model, out, weight_type=q.QuantType.QInt8)
    elif tool == "MatMulNBitsQuantizer":
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        start = time.perf_counter()
        qz = MatMulNBitsQuantizer(onnx.load(model), block_size=block, is_symmetric=True)
        qz.process()
        qz.model.save_model_to_file(out, use_external_data_format=False)
    else:
        raise ValueError(f"unknown tool {tool}")
    return {"seconds": time.perf_counter() - start}


def run_ort_tool(tool: str, model: Path, out: Path, calib: Path, args) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child-tool", tool, str(model), str(out), str(calib),
           str(args.block)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": err(f"timed out after {args.timeout} s")}
    if proc.returncode != 0:
        return {"error": err(failure_reason(proc))}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": err(f"unreadable child output: {proc.stdout[-200:]}")}


def mmq_template(scheme: str, args) -> str:
    for spec in args.mmq_cmd_for:
        s, _, t = spec.partition("=")
        if s == scheme:
            return t
    if args.mmq_cmd:
        return args.mmq_cmd
    return DEFAULT_MMQ_CMD_FOR.get(scheme, DEFAULT_MMQ_CMD)


def run_mmq(scheme: str, model: Path, out: Path, calib: Path, report: Path, args) -> dict[str, Any]:
    template = mmq_template(scheme, args)
    try:
        cmd = shlex.split(template.format(mmq=shlex.quote(str(args.mmq)),
                                          model=shlex.quote(str(model)),
                                          out=shlex.quote(str(out)),
                                          calib=shlex.quote(str(calib)), scheme=scheme,
                                          block=args.block, report=shlex.quote(str(report))))
    except (KeyError, ValueError, IndexError) as e:
        return {"error": err(f"bad --mmq-cmd template {template!r}: {e}")}
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": err(f"timed out after {args.timeout} s"), "command": cmd}
    except OSError as e:
        return {"error": err(e), "command": cmd}
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": err(failure_reason(proc)), "command": cmd}
    rec: dict[str, Any] = {"seconds": seconds, "command": cmd}
    if "{report}" in template and report.exists():
        try:
            e2e = (json.loads(report.read_text()).get("accuracy") or {}).get("end_to_end") or {}
            rec["report_cosine_mean"] = e2e.get("cosine_mean")
            rec["report_top1"] = e2e.get("top1_agreement")
        except (OSError, ValueError) as e:
            rec["report_cosine_mean"] = err(f"unreadable report: {e}")
    if not out.exists():
        return {"error": err(f"mmq wrote no {out.name}"), "command": cmd}
    return rec


# --------------------------------------------------------------------------
# measurement (in a child process: `compare_quant.py --child-measure SPEC.json`)


def child_measure(spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import onnxruntime as ort

    held = [dict(np.load(f)) for f in sorted(Path(spec["held"]).glob("*.npz"))]
    models: dict[str, str] = spec["models"]  # label -> path; "fp32" is the original

    def session(path: str):
        so = ort.SessionOptions()
        if spec["threads"] > 0:
            so.intra_op_num_threads = spec["threads"]
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    result: dict[str, Any] = {}
    sessions = {}
    for label, path in models.items():
        try:
            sessions[label] = session(path)
        except Exception as e:  # noqa: BLE001 - any ORT failure is reported, not fatal
            result[label] = {"error": err(f"ONNX Runtime cannot load it: {e}")}
    if "fp32" not in sessions:
        return result

    def feeds(s, sample):
        names = {i.name for i in s.get_inputs()}
        return {k: v for k, v in sample.items() if k in names}

    # The main output: the first float output with at least two elements, else the first.
    first = sessions["fp32"].run(None, feeds(sessions["fp32"], held[0]))
    floats = [i for i, o in enumerate(first) if np.issubdtype(np.asarray(o).dtype, np.floating)]
    main = next((i for i in floats if np.asarray(first[i]).size >= 2), floats[0] if floats else 0)
    result["main_output"] = sessions["fp32"].get_outputs()[main].name
    ref = [sessions["fp32"].run(None, feeds(sessions["fp32"], x))[main] for x in held]
    for label, s in list(sessions.items()):
        try:
            outs = [s.run(None, feeds(s, x))[main] for x in held]
        except Exception as e:  # noqa: BLE001
            result[label] = {"error": err(f"ONNX Runtime cannot run it: {e}")}
            del sessions[label]
            continue
        cos, agree, rows = [], 0, 0
        for a, b in zip(ref, outs):
            a64 = np.asarray(a, np.float64).ravel()
            b64 = np.asarray(b, np.float64).ravel()
            if a64.shape != b64.shape:
                cos = None
                break
            d = float(np.linalg.norm(a64) * np.linalg.norm(b64))
            cos.append(1.0 if np.array_equal(a64, b64) else (float(a64 @ b64) / d if d else 0.0))
            if a.ndim >= 1 and a.shape[-1] > 1:
                ra = np.asarray(a).reshape(-1, a.shape[-1]).argmax(-1)
                rb = np.asarray(b).reshape(-1, a.shape[-1]).argmax(-1)
                agree += int((ra == rb).sum())
                rows += ra.size
        result[label] = {
            "cosine_mean": statistics.fmean(cos) if cos else err("output shapes differ"),
            "cosine_min": min(cos) if cos else None,
            "top1": agree / rows if rows else None,
        }

    # Latency: interleaved rounds on the first held-back sample, order rotating each round.
    labels = list(sessions)
    times: dict[str, list[float]] = {k: [] for k in labels}
    x = held[0]
    for r in range(spec["warmup"] + spec["rounds"]):
        order = labels[r % len(labels):] + labels[: r % len(labels)]
        for label in order:
            s = sessions[label]
            f = feeds(s, x)
            start = time.perf_counter()
            s.run(None, f)
            if r >= spec["warmup"]:
                times[label].append(time.perf_counter() - start)
    base = statistics.median(times["fp32"])
    for label in labels:
        med = statistics.median(times[label])
        result[label]["latency_ms"] = med * 1e3
        result[label]["x_fp32"] = med / base if base else None
    return result


def measure(models: dict[str, Path], held: Path, workdir: Path, args) -> dict[str, Any]:
    spec = {"models": {k: str(v) for k, v in models.items()}, "held": str(held),
            "rounds": args.rounds, "warmup": args.warmup, "threads": args.threads}
    spec_path = workdir / "measure.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, __file__, "--child-measure", str(spec_path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout * 4)
    except subprocess.TimeoutExpired:
        return {k: {"error": err("measurement timed out")} for k in models}
    if proc.returncode != 0:
        return {k: {"error": err(failure_reason(proc))} for k in models}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {k: {"error": err("unreadable measurement output")} for k in models}


# --------------------------------------------------------------------------
# driver


def subjects(args) -> list[tuple[str, Path, Path | None]]:
    out = []
    for d in sorted(FIXTURES.iterdir()):
        if d.is_dir() and (d / "model.onnx").exists():
            out.append((d.name, d / "model.onnx", d / "inputs.npz"))
    if args.only:
        wanted = set(args.only.split(","))
        out = [s for s in out if s[0] in wanted]
    for spec in args.model:
        name, _, rest = spec.partition("=")
        model, _, inputs = rest.partition(",")
        out.append((name, Path(model), Path(inputs) if inputs else None))
    return out


def has_matmul(model_path: Path) -> bool:
    """Whether the model (main graph or a subgraph) has a MatMul or Gemm, which int4 quantizes."""
    import onnx

    def walk(g) -> bool:
        for n in g.node:
            if n.op_type in ("MatMul", "Gemm"):
                return True
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH and walk(a.g):
                    return True
                if a.type == onnx.AttributeProto.GRAPHS and any(walk(x) for x in a.graphs):
                    return True
        return False

    return walk(onnx.load(str(model_path), load_external_data=False).graph)


QUANT_OPS = {"QuantizeLinear": "Q", "DequantizeLinear": "DQ", "DynamicQuantizeLinear": "DynQ",
             "MatMulInteger": "MatMulInt", "ConvInteger": "ConvInt", "QLinearConv": "QLinearConv",
             "QLinearMatMul": "QLinearMatMul", "MatMulNBits": "MatMulNBits",
             "DynamicQuantizeMatMul": "DynQMatMul", "QGemm": "QGemm", "QAttention": "QAttention"}


def quant_summary(path: Path) -> dict[str, Any]:
    """File size and the quantization ops of a model (main graph and subgraphs)."""
    import collections

    import onnx

    counts: collections.Counter = collections.Counter()

    def walk(g) -> None:
        for n in g.node:
            if n.op_type in QUANT_OPS:
                counts[QUANT_OPS[n.op_type]] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    try:
        walk(onnx.load(str(path), load_external_data=False).graph)
    except Exception as e:  # noqa: BLE001 - the measurement reports unloadable models
        return {"size_mib": path.stat().st_size / 2**20, "quant_ops": err(f"unreadable: {e}")}
    return {"size_mib": path.stat().st_size / 2**20,
            "quant_ops": ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"}


def repeated(run, n: int) -> dict[str, Any]:
    """Runs a tool n times; the last run's record with the median time and every time."""
    times, rec = [], {}
    for _ in range(max(1, n)):
        rec = run()
        if "error" in rec:
            return rec
        times.append(rec["seconds"])
    rec["seconds"] = statistics.median(times)
    rec["runs_s"] = times
    return rec


def compare_one(name: str, model: Path, inputs: Path | None, workdir: Path, args) -> dict[str, Any]:
    rec: dict[str, Any] = {"model": str(model), "rows": {}}
    try:
        calib, held = write_samples(model, inputs, workdir, args.calib, args.held, args.seed)
    except Exception as e:  # noqa: BLE001
        rec["error"] = err(f"cannot write samples: {e}")
        return rec
    produced: dict[str, Path] = {"fp32": model}
    try:
        matmul = has_matmul(model)
    except Exception:  # noqa: BLE001 - an unreadable model fails in the tools, with their message
        matmul = True
    for scheme in args.schemes:
        if scheme == "int4" and not matmul:
            rec["rows"]["mmq int4"] = {"skipped": "n/a: no MatMul/Gemm"}
            continue
        out = workdir / f"mmq-{scheme}.onnx"
        log(f"[{name}] mmq {scheme}")
        report = workdir / f"mmq-{scheme}.report.json"
        r = repeated(lambda: run_mmq(scheme, model, out, calib, report, args), args.repeat)
        rec["rows"][f"mmq {scheme}"] = r
        if "error" not in r:
            produced[f"mmq {scheme}"] = out
            r.update(quant_summary(out))
        tool = ORT_TOOL.get(scheme)
        if tool:
            label = f"ort {tool}"
            if label in rec["rows"]:
                continue
            out = workdir / f"ort-{tool}.onnx"
            log(f"[{name}] {tool}")
            r = repeated(lambda: run_ort_tool(tool, model, out, calib, args), args.repeat)
            rec["rows"][label] = r
            if "error" not in r:
                produced[label] = out
                r.update(quant_summary(out))
    log(f"[{name}] measuring {len(produced)} models")
    measured = measure(produced, held, workdir, args)
    rec["fp32"] = measured.get("fp32", {})
    rec["main_output"] = measured.get("main_output")
    for label, m in measured.items():
        if label in rec["rows"] and isinstance(m, dict):
            rec["rows"][label].update({k: v for k, v in m.items() if k not in rec["rows"][label]})
    return rec


def render_summary(results: dict[str, Any], args) -> str:
    """One row per subject and scheme, mmq next to its ONNX Runtime counterpart."""
    headers = ["model", "scheme", "cosine mmq", "cosine ORT", "x FP32 mmq", "x FP32 ORT",
               "tool s mmq", "tool s ORT", "tool s mmq/ORT"]
    rows = []

    def cell(r: dict[str, Any] | None, key: str) -> Any:
        if r is None:
            return None
        if "skipped" in r:
            return r["skipped"]
        if "error" in r:
            return "error" if key != "cosine_mean" else r["error"]
        return r.get(key)

    for name, rec in results.items():
        if "error" in rec:
            rows.append([name, rec["error"]] + [None] * 7)
            continue
        for scheme in args.schemes:
            m = rec["rows"].get(f"mmq {scheme}")
            tool = ORT_TOOL.get(scheme)
            o = rec["rows"].get(f"ort {tool}") if tool else None
            if m is None and o is None:
                continue
            ms, os_ = cell(m, "seconds"), cell(o, "seconds")
            ratio = ms / os_ if isinstance(ms, float) and isinstance(os_, float) and os_ else None
            rows.append([name, scheme, cell(m, "cosine_mean"), cell(o, "cosine_mean"),
                         cell(m, "x_fp32"), cell(o, "x_fp32"), ms, os_,
                         None if ratio is None else f"{ratio:.2f}"])
    return markdown(headers, rows) + "\n"


def render(results: dict[str, Any], args) -> str:
    out = ["## Summary\n", render_summary(results, args), "## Per model\n"]
    headers = ["tool", "tool s", "cosine mean", "cosine min", "top-1", "latency ms", "x FP32",
               "MiB", "quantization ops", "mmq report cosine"]
    for name, rec in results.items():
        out.append(f"### {name} (main output: {rec.get('main_output') or '-'})\n")
        if "error" in rec:
            out.append(rec["error"] + "\n")
            continue
        fp = rec.get("fp32", {})
        rows = [["fp32 (original)", None, None, None, None, fp.get("latency_ms", fp.get("error")),
                 1.0 if "latency_ms" in fp else None, Path(rec["model"]).stat().st_size / 2**20,
                 None, None]]
        for label, r in rec["rows"].items():
            if "skipped" in r:
                rows.append([label, r["skipped"]] + [None] * 8)
                continue
            if "error" in r:
                rows.append([label, r["error"]] + [None] * 8)
                continue
            cos = r.get("cosine_mean")
            rows.append([label, r.get("seconds"), cos, r.get("cosine_min"), r.get("top1"),
                         r.get("latency_ms"), r.get("x_fp32"), r.get("size_mib"),
                         r.get("quant_ops"), r.get("report_cosine_mean")])
        out.append(markdown(headers, rows) + "\n")
    out.append(f"calibration samples {args.calib}, held-back {args.held} (or a --model's own), "
               f"tool s: median of {args.repeat} runs, latency: median of "
               f"{args.rounds} interleaved rounds after {args.warmup} warm-up, threads "
               f"{args.threads or 'default'}; tool s: mmq wall time incl. process start, "
               "ONNX Runtime tools: the call alone\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child-tool"]:
        tool, model, out, calib, block = argv[1:6]
        print(json.dumps(child_tool(tool, model, out, calib, int(block))))
        return 0
    if argv[:1] == ["--child-measure"]:
        print(json.dumps(child_measure(json.loads(Path(argv[1]).read_text()))))
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mmq", default=str(REPO_ROOT / "target/release/mmq"))
    p.add_argument("--only", help="comma-separated fixture names")
    p.add_argument("--model", action="append", default=[],
                   help="NAME=MODEL.onnx[,INPUTS.npz]: another subject (repeatable)")
    p.add_argument("--schemes", default="int8,int8-dynamic,int4",
                   type=lambda s: [x for x in s.split(",") if x])
    p.add_argument("--calib", type=int, default=16, help="calibration samples")
    p.add_argument("--held", type=int, default=8, help="held-back samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=3, help="runs of each tool (median reported)")
    p.add_argument("--block", type=int, default=32, help="INT4 block size (both tools)")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ORT default)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per tool run")
    p.add_argument("--mmq-cmd", help=f"mmq command template (default: {DEFAULT_MMQ_CMD!r})")
    p.add_argument("--mmq-cmd-for", action="append", default=[], metavar="SCHEME=TEMPLATE",
                   help="mmq command template for one scheme")
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--keep", type=Path, help="keep samples and models in this folder")
    args = p.parse_args(argv)
    bad = [s for s in args.schemes if s not in SCHEMES]
    if bad:
        p.error(f"unknown scheme(s) {', '.join(bad)} (known: {', '.join(SCHEMES)})")
    args.mmq = Path(args.mmq)

    root = args.keep or Path(tempfile.mkdtemp(prefix="compare_quant."))
    results: dict[str, Any] = {}
    try:
        for name, model, inputs in subjects(args):
            workdir = root / name
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.mkdir(parents=True)
            results[name] = compare_one(name, model, inputs, workdir, args)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print(render(results, args))
    if args.json:
        args.json.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
