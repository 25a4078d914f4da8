#!/usr/bin/env python3
"""Compares `mmq compile --target ort -O2` with ONNX Runtime's transformers optimizer.

Run with the fixture virtual environment (it has onnx, onnxruntime, torch and sympy, which
`python -m onnxruntime.transformers.optimizer` needs):

    .venv-fixtures/bin/python tools/compare_ort.py --mmq target/release/mmq [--json OUT.json]
        [--only vit,llava] [--repeat 3] [--rounds 40] [--warmup 5] [--keep DIR]

For every fixture model (tests/fixtures/*; the two graphs of `pipeline` separately) it

  1. runs `mmq compile MODEL --target ort -O2 -o OUT.onnx` (median wall time of --repeat runs);
  2. runs `python -m onnxruntime.transformers.optimizer` with each model type that fits the
     architecture (heads and hidden size read from tools/gen_fixtures.py), keeps the variant with
     the most fused nodes and times it (median of --repeat runs, the first being the variant run);
  3. counts fused ops in the original, the mmq output and the ORT optimizer output;
  4. measures ONNX Runtime latency (default graph optimizations; 1 intra-op thread and the
     default thread count) of the three models, interleaved round-robin in one process;
  5. reports the largest error of every output against the original model's ONNX Runtime output,
     as max |out - ref| / (1 + |ref|) (goal: <= 1e-4).

It prints one markdown table per section and, with --json, writes every number. A tool or model
that fails puts "error: ..." in its cells and the run continues; latency and accuracy run in a
child process per fixture, so a crash inside ONNX Runtime is reported, not fatal.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
GENERATOR = REPO_ROOT / "tools" / "gen_fixtures.py"
ERROR_MAX = 160
GOAL = 1e-4

# Op-count categories (op_type in any domain).
ATTENTION_OPS = ("Attention", "MultiHeadAttention", "GroupQueryAttention", "PackedAttention",
                 "PackedMultiHeadAttention")
NORM_OPS = ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
            "SkipSimplifiedLayerNormalization", "RMSNormalization")
GELU_OPS = ("Gelu", "FastGelu", "BiasGelu", "QuickGelu")
SINGLE_OPS = ("FusedConv", "FusedMatMul", "Gemm", "RotaryEmbedding", "Softmax",
              "BatchNormalization")
SHORT = {
    "Attention": "Attn", "MultiHeadAttention": "MHA", "GroupQueryAttention": "GQA",
    "PackedAttention": "PackedAttn", "PackedMultiHeadAttention": "PackedMHA",
    "LayerNormalization": "LN", "SkipLayerNormalization": "SkipLN",
    "SimplifiedLayerNormalization": "RMS", "SkipSimplifiedLayerNormalization": "SkipRMS",
    "RMSNormalization": "RMSNorm",
    "Gelu": "Gelu", "FastGelu": "FastGelu", "BiasGelu": "BiasGelu", "QuickGelu": "QuickGelu",
}


# --------------------------------------------------------------------------
# fixtures and the generator's configurations


@dataclass
class Variant:
    """One invocation of the ORT transformers optimizer."""

    model_type: str
    num_heads: int
    hidden_size: int

    def label(self) -> str:
        return f"{self.model_type} (heads {self.num_heads}, hidden {self.hidden_size})"


@dataclass
class Subject:
    """One fixture model."""

    name: str
    path: Path
    variants: list[Variant] = field(default_factory=list)
    note: str = ""

    @property
    def inputs(self) -> Path:
        return self.path.parent / "inputs.npz"


# (heads, hidden) per tower when tools/gen_fixtures.py cannot be read; the generator is the
# source of truth and is parsed below.
FALLBACK_CONFIGS = {
    "vit": (4, 64),           # tiny_vit_config
    "clip_vision": (4, 32),   # tiny_clip_vision_config
    "clip_text": (4, 32),     # gen_clip: text_cfg
    "gpt2": (4, 32),          # gen_gpt2_kv: GPT2Config
    "llama": (4, 64),         # tiny_llama_config
}


def generator_configs(path: Path = GENERATOR) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """(heads, hidden) per tower, read from the keyword constants of the generator's config
    calls, by enclosing function; returns the table and notes on what fell back."""
    configs = dict(FALLBACK_CONFIGS)
    notes: list[str] = []
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError) as exc:
        return configs, [f"cannot read {path.name} ({exc}); built-in configs used"]

    per_function: dict[str, dict[str, Any]] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        kws: dict[str, Any] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                for kw in node.keywords:
                    if kw.arg and isinstance(kw.value, ast.Constant):
                        kws.setdefault(kw.arg, kw.value.value)
        per_function[fn.name] = kws

    wanted = {
        "vit": ("tiny_vit_config", "num_attention_heads", "hidden_size"),
        "clip_vision": ("tiny_clip_vision_config", "num_attention_heads", "hidden_size"),
        "clip_text": ("gen_clip", "num_attention_heads", "hidden_size"),
        "gpt2": ("gen_gpt2_kv", "n_head", "n_embd"),
        "llama": ("tiny_llama_config", "num_attention_heads", "hidden_size"),
    }
    for key, (fn, heads_kw, hidden_kw) in wanted.items():
        kws = per_function.get(fn, {})
        heads, hidden = kws.get(heads_kw), kws.get(hidden_kw)
        if isinstance(heads, int) and isinstance(hidden, int):
            configs[key] = (heads, hidden)
        else:
            notes.append(f"{key}: {fn}() has no constant {heads_kw}/{hidden_kw}; "
                         f"built-in {FALLBACK_CONFIGS[key]} used")
    return configs, notes


def subjects(configs: dict[str, tuple[int, int]]) -> list[Subject]:
    """Every fixture model with the optimizer model types to try, best guesses first."""

    def v(model_type: str, tower: str) -> Variant:
        heads, hidden = configs[tower]
        return Variant(model_type, heads, hidden)

    decoder = [v("gpt2", "llama"), v("bert", "llama"), v("qwen3", "llama")]
    clip_vision = [v("clip", "clip_vision"), v("vit", "clip_vision")]
    return [
        Subject("vit", FIXTURES / "vit/model.onnx", [v("vit", "vit")]),
        Subject("vit_dynamic", FIXTURES / "vit_dynamic/model.onnx", [v("vit", "vit")]),
        Subject("clip", FIXTURES / "clip/model.onnx", [v("clip", "clip_text")],
                note="text and vision towers share heads/hidden"
                if configs["clip_text"] == configs["clip_vision"]
                else "heads/hidden of the text tower; the vision tower differs"),
        Subject("gpt2_kv", FIXTURES / "gpt2_kv/model.onnx",
                [v("gpt2", "gpt2"), v("bert", "gpt2")]),
        Subject("llama_gqa_kv", FIXTURES / "llama_gqa_kv/model.onnx", decoder),
        Subject("llava", FIXTURES / "llava/model.onnx",
                [v("clip", "clip_vision")] + decoder,
                note="vision tower and decoder differ in hidden size; one value per run"),
        Subject("qat_cnn", FIXTURES / "qat_cnn/model.onnx", [Variant("bert", 0, 0)],
                note="no CNN model type: bert with ONNX Runtime's basic graph optimizations"),
        Subject("pipeline/vision_encoder", FIXTURES / "pipeline/vision_encoder.onnx",
                clip_vision),
        Subject("pipeline/decoder", FIXTURES / "pipeline/decoder.onnx", decoder),
    ]


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


def tail_reason(proc: subprocess.CompletedProcess) -> str:
    """The most telling line of a failed command: the last error-looking line of stderr."""
    lines = [l.strip() for l in (proc.stderr or "").splitlines() if l.strip()]
    if proc.returncode < 0:
        try:
            head = f"killed by {signal.Signals(-proc.returncode).name}"
        except ValueError:
            head = f"killed by signal {-proc.returncode}"
    else:
        head = f"exit {proc.returncode}"
    for line in reversed(lines):
        if "error" in line.lower() or "exception" in line.lower():
            return f"{head}: {line}"
    return f"{head}: {lines[-1]}" if lines else head


def run_timed(cmd: list[str], timeout: float) -> tuple[float | None, str | None]:
    """Runs cmd; returns (seconds, None) or (None, reason)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              cwd=REPO_ROOT)
    except subprocess.TimeoutExpired:
        return None, f"timeout after {timeout:g}s"
    except OSError as exc:
        return None, f"cannot run {cmd[0]}: {exc}"
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        return None, tail_reason(proc)
    return dt, None


def fmt_num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if is_err(x):
        return str(x)
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) < 1e-3 and x != 0 else f"{x:.{digits}f}"
    return str(x)


def markdown(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(x: Any) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


# --------------------------------------------------------------------------
# op counts


def count_ops(path: Path) -> dict[str, Any]:
    """Op counts of one ONNX file (nested graphs included)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops: dict[str, int] = {}
    relu_after_conv = 0

    def walk(graph: Any) -> None:
        nonlocal relu_after_conv
        producer = {}
        for node in graph.node:
            for o in node.output:
                producer[o] = node
        for node in graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
            if node.op_type == "Relu" and node.input:
                src = producer.get(node.input[0])
                if src is not None and src.op_type == "BatchNormalization" and src.input:
                    src = producer.get(src.input[0])
                if src is not None and src.op_type in ("Conv", "FusedConv"):
                    relu_after_conv += 1
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)

    def group(names: tuple[str, ...]) -> dict[str, Any]:
        kinds = {n: ops[n] for n in names if ops.get(n)}
        return {"total": sum(kinds.values()), "kinds": kinds}

    return {
        "nodes": sum(ops.values()),
        "attention": group(ATTENTION_OPS),
        "norms": group(NORM_OPS),
        "gelu": group(GELU_OPS),
        **{op: ops.get(op, 0) for op in SINGLE_OPS},
        "relu_after_conv": relu_after_conv,
        "ops": dict(sorted(ops.items())),
    }


def fused_score(c: dict[str, Any]) -> int:
    """How much an optimizer fused: the number of fused nodes it produced."""
    return (c["attention"]["total"] + c["norms"]["total"] + c["gelu"]["total"]
            + c["FusedConv"] + c["FusedMatMul"] + c["RotaryEmbedding"])


def group_cell(g: dict[str, Any]) -> str:
    if not g["total"]:
        return "0"
    kinds = ", ".join(f"{SHORT.get(k, k)} {n}" for k, n in g["kinds"].items())
    return f"{g['total']} ({kinds})"


# --------------------------------------------------------------------------
# latency and accuracy (child process)


def measure(orig: str, others: dict[str, str], inputs: str, rounds: int, warmup: int,
            threads: list[int]) -> dict[str, Any]:
    """Latency per thread count and output errors; every model failure is recorded."""
    import numpy as np
    import onnxruntime as ort

    with np.load(inputs, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    models = {"original": orig, **others}
    result: dict[str, Any] = {"latency": {}, "accuracy": {}}

    def session(path: str, intra: int):
        so = ort.SessionOptions()
        so.intra_op_num_threads = intra
        so.log_severity_level = 3
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        missing = [k for k in names if k not in arrays]
        if missing:
            raise KeyError(f"inputs missing from {Path(inputs).name}: {', '.join(missing)}")
        return sess, {k: arrays[k] for k in names}

    # Accuracy, against the original's outputs (1 intra-op thread).
    refs: dict[str, Any] | None = None
    try:
        sess, feeds = session(orig, 1)
        names = [o.name for o in sess.get_outputs()]
        refs = dict(zip(names, sess.run(names, feeds)))
    except Exception as exc:  # noqa: BLE001
        result["accuracy"]["original"] = err(f"{type(exc).__name__}: {exc}")
    for key, path in others.items():
        if refs is None:
            result["accuracy"][key] = err("original does not run")
            continue
        try:
            sess, feeds = session(path, 1)
            got = dict(zip([o.name for o in sess.get_outputs()],
                           sess.run(None, feeds)))
            per: dict[str, Any] = {}
            for name, ref in refs.items():
                if name not in got:
                    per[name] = err("output missing")
                    continue
                out = np.asarray(got[name])
                if out.shape != ref.shape:
                    per[name] = err(f"shape {out.shape} != {ref.shape}")
                    continue
                if ref.dtype.kind not in "fc":
                    per[name] = 0.0 if np.array_equal(out, ref) else float("inf")
                    continue
                x = out.astype(np.float64)
                y = ref.astype(np.float64)
                if np.any(np.isnan(x) != np.isnan(y)):
                    per[name] = float("nan")
                    continue
                with np.errstate(invalid="ignore"):
                    rel = np.abs(x - y) / (1.0 + np.abs(y))
                rel = np.where(np.isnan(rel), 0.0, rel)
                per[name] = float(rel.max()) if rel.size else 0.0
            result["accuracy"][key] = per
        except Exception as exc:  # noqa: BLE001
            result["accuracy"][key] = err(f"{type(exc).__name__}: {exc}")

    # Latency: round-robin over the models that load, after warmup.
    for n in threads:
        label = str(n) if n else "default"
        entry: dict[str, Any] = {}
        live = {}
        for key, path in models.items():
            try:
                sess, feeds = session(path, n)
                for _ in range(warmup):
                    sess.run(None, feeds)
                live[key] = (sess, feeds)
            except Exception as exc:  # noqa: BLE001
                entry[key] = err(f"{type(exc).__name__}: {exc}")
        times: dict[str, list[float]] = {k: [] for k in live}
        for _ in range(rounds):
            for key, (sess, feeds) in live.items():
                t = time.perf_counter()
                sess.run(None, feeds)
                times[key].append(time.perf_counter() - t)
        for key, ts in times.items():
            entry[key] = statistics.median(ts)
        result["latency"][label] = entry
    return result


def measure_in_child(orig: Path, others: dict[str, Path], inputs: Path, args) -> dict[str, Any]:
    spec = {"orig": str(orig), "others": {k: str(v) for k, v in others.items()},
            "inputs": str(inputs), "rounds": args.rounds, "warmup": args.warmup,
            "threads": [1, 0]}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_measure", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": err(f"measurement timed out after {args.timeout:g}s")}
    if proc.returncode != 0:
        return {"error": err(f"measurement process: {tail_reason(proc)}")}
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        return {"error": err(f"measurement output unreadable: {exc}")}


# --------------------------------------------------------------------------
# the comparison


def compile_mmq(s: Subject, out: Path, args) -> dict[str, Any]:
    cmd = [args.mmq, "compile", str(s.path), "--target", "ort", "-O2", "-o", str(out)]
    times = []
    for _ in range(args.repeat):
        if out.exists():
            out.unlink()
        dt, reason = run_timed(cmd, args.timeout)
        if reason is not None:
            return {"error": err(reason), "command": " ".join(cmd)}
        times.append(dt)
    if not out.is_file():
        return {"error": err(f"no output written at {out}"), "command": " ".join(cmd)}
    return {"seconds": statistics.median(times), "runs": times, "output": str(out)}


def ort_optimize(s: Subject, workdir: Path, args) -> dict[str, Any]:
    """Every variant once; the best one repeated for its median time."""
    res: dict[str, Any] = {"variants": []}
    best = None
    for v in s.variants:
        out = workdir / f"ort_{v.model_type}.onnx"
        cmd = [args.ort_python, "-m", "onnxruntime.transformers.optimizer",
               "--input", str(s.path), "--output", str(out), "--model_type", v.model_type,
               "--num_heads", str(v.num_heads), "--hidden_size", str(v.hidden_size)]
        entry: dict[str, Any] = {"model_type": v.model_type, "num_heads": v.num_heads,
                                 "hidden_size": v.hidden_size, "command": " ".join(cmd)}
        dt, reason = run_timed(cmd, args.timeout)
        if reason is None and not out.is_file():
            reason = f"exit 0 but no output at {out}"
        if reason is not None:
            entry["error"] = err(reason)
        else:
            entry["runs"] = [dt]
            entry["output"] = str(out)
            try:
                entry["counts"] = count_ops(out)
                score = fused_score(entry["counts"])
                entry["fused"] = score
                if best is None or score > best[0]:
                    best = (score, entry, cmd)
            except Exception as exc:  # noqa: BLE001
                entry["error"] = err(f"cannot read output: {exc}")
        res["variants"].append(entry)
    if best is None:
        res["error"] = err("no model type succeeded: " + "; ".join(
            f"{e['model_type']}: {e.get('error', '?')}" for e in res["variants"]))
        return res
    _, entry, cmd = best
    for _ in range(args.repeat - 1):
        dt, reason = run_timed(cmd, args.timeout)
        if reason is not None:
            entry["error_on_repeat"] = err(reason)
            break
        entry["runs"].append(dt)
    entry["seconds"] = statistics.median(entry["runs"])
    res.update(best=entry["model_type"], seconds=entry["seconds"], output=entry["output"],
               counts=entry["counts"])
    return res


def compare_one(s: Subject, workdir: Path, args) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"model": str(s.path.relative_to(REPO_ROOT)), "note": s.note}
    if not s.path.is_file():
        rec["error"] = err(f"missing {s.path}")
        return rec
    try:
        rec["original"] = {"counts": count_ops(s.path)}
    except Exception as exc:  # noqa: BLE001
        rec["original"] = {"error": err(exc)}
    log(f"{s.name}: mmq compile")
    rec["mmq"] = compile_mmq(s, workdir / "mmq.onnx", args)
    if "output" in rec["mmq"]:
        try:
            rec["mmq"]["counts"] = count_ops(Path(rec["mmq"]["output"]))
        except Exception as exc:  # noqa: BLE001
            rec["mmq"]["counts"] = err(f"cannot read output: {exc}")
    log(f"{s.name}: ORT transformers optimizer ({', '.join(v.model_type for v in s.variants)})")
    rec["ort"] = ort_optimize(s, workdir, args)
    if args.skip_latency:
        return rec
    others = {k: Path(rec[k]["output"]) for k in ("mmq", "ort")
              if "output" in rec[k] and "error" not in rec[k]}
    log(f"{s.name}: latency and accuracy ({args.rounds} rounds)")
    m = measure_in_child(s.path, others, s.inputs, args)
    # A tool that produced nothing shows its error in the measurement cells too.
    for key in ("mmq", "ort"):
        if key not in others and "error" not in m:
            reason = rec[key].get("error") or err("no output")
            m["accuracy"][key] = reason
            for entry in m["latency"].values():
                entry[key] = reason
    rec["measure"] = m
    return rec


def log(msg: str) -> None:
    print(f"[compare_ort] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# report


def counts_of(rec: dict[str, Any], key: str) -> dict[str, Any] | str:
    part = rec.get(key, {})
    if "counts" in part:
        return part["counts"]  # a dict, or the error reading the model
    return part.get("error") or rec.get("error") or err("not run")


def render(results: dict[str, dict[str, Any]]) -> str:
    out = []

    rows = []
    for name, rec in results.items():
        mmq, ort_ = rec.get("mmq", {}), rec.get("ort", {})
        variants = "; ".join(
            f"{v['model_type']}: " + (v["error"] if "error" in v else f"{v['fused']} fused")
            for v in ort_.get("variants", []))
        rows.append([name, fmt_num(mmq.get("seconds", mmq.get("error"))),
                     fmt_num(ort_.get("seconds", ort_.get("error"))),
                     ort_.get("best", "-"), variants or "-"])
    out.append("### Compile time (median wall seconds)\n\n" + markdown(
        ["fixture", "mmq -O2", "ORT optimizer", "ORT model type", "ORT variants tried"], rows))

    rows = []
    for name, rec in results.items():
        blocks = counts_of(rec, "original")
        blocks = blocks["Softmax"] if isinstance(blocks, dict) else "-"
        for key, label in (("original", "original"), ("mmq", "mmq -O2"),
                           ("ort", f"ORT {rec.get('ort', {}).get('best', '')}".strip())):
            c = counts_of(rec, key)
            if isinstance(c, str):
                rows.append([name, label, blocks, c] + [""] * 9)
                continue
            rows.append([name, label, blocks, group_cell(c["attention"]), group_cell(c["norms"]),
                         group_cell(c["gelu"]), c["FusedConv"], c["FusedMatMul"], c["Gemm"],
                         c["RotaryEmbedding"], c["BatchNormalization"], c["relu_after_conv"],
                         c["nodes"]])
    out.append("### Fused ops (blocks = Softmax nodes in the original)\n\n" + markdown(
        ["fixture", "model", "blocks", "attention", "norms", "gelu", "FusedConv", "FusedMatMul",
         "Gemm", "Rotary", "BN left", "Relu after Conv", "nodes"], rows))

    rows = []
    for name, rec in results.items():
        for v in rec.get("ort", {}).get("variants", []):
            c = v.get("counts")
            if c is None:
                rows.append([name, v["model_type"], v["num_heads"], v["hidden_size"],
                             v.get("error", "-"), "", "", "", ""])
            else:
                rows.append([name, v["model_type"], v["num_heads"], v["hidden_size"], "ok",
                             group_cell(c["attention"]), group_cell(c["norms"]),
                             group_cell(c["gelu"]), c["RotaryEmbedding"]])
    out.append("### ORT optimizer, every model type tried\n\n" + markdown(
        ["fixture", "model type", "heads", "hidden", "status", "attention", "norms", "gelu",
         "Rotary"], rows))

    rows = []
    for name, rec in results.items():
        m = rec.get("measure")
        if m is None:
            continue
        if "error" in m:
            rows.append([name, "-", m["error"], "", "", "", ""])
            continue
        for threads, entry in m["latency"].items():
            def ms(key: str) -> str:
                x = entry.get(key)
                if x is None:
                    return "-"
                return x if is_err(x) else f"{x * 1e3:.3f}"

            def ratio(key: str) -> str:
                a, b = entry.get(key), entry.get("original")
                if isinstance(a, float) and isinstance(b, float) and b > 0:
                    return f"{a / b:.3f}"
                return "-"

            rows.append([name, threads, ms("original"), ms("mmq"), ms("ort"), ratio("mmq"),
                         ratio("ort")])
    if rows:
        out.append("### ONNX Runtime latency (median ms, default graph optimizations)\n\n"
                   + markdown(["fixture", "intra-op threads", "original", "mmq -O2",
                               "ORT optimizer", "mmq/original", "ORT/original"], rows))

    rows = []
    for name, rec in results.items():
        m = rec.get("measure")
        if m is None or "error" in m:
            continue
        acc = m["accuracy"]
        if "original" in acc:
            rows.append([name, "-", acc["original"], ""])
            continue
        outputs: list[str] = []
        for key in ("mmq", "ort"):
            if isinstance(acc.get(key), dict):
                outputs += [o for o in acc[key] if o not in outputs]
        if not outputs:
            rows.append([name, "-", acc.get("mmq", "-"), acc.get("ort", "-")])

        def cell(key: str, o: str) -> str:
            a = acc.get(key)
            if a is None:
                return "-"
            if isinstance(a, str):
                return a
            x = a.get(o)
            if isinstance(x, float):
                return f"{x:.2e}" + ("" if x <= GOAL else " FAIL")
            return str(x)

        for o in outputs:
            rows.append([name, o, cell("mmq", o), cell("ort", o)])
    if rows:
        out.append(f"### Max error vs the original, |out - ref| / (1 + |ref|) (goal <= {GOAL:g})"
                   "\n\n" + markdown(["fixture", "output", "mmq -O2", "ORT optimizer"], rows))
    return "\n\n".join(out) + "\n"


# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_measure"]:  # internal: one fixture's latency and accuracy
        spec = json.loads(argv[1])
        res = measure(spec["orig"], spec["others"], spec["inputs"], spec["rounds"],
                      spec["warmup"], spec["threads"])
        print(json.dumps(res))
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Tables are described in docs/benchmarks.md.")
    p.add_argument("--mmq", required=True, help="the mmq binary")
    p.add_argument("--json", metavar="OUT.json", help="write every number here")
    p.add_argument("--only", help="comma-separated fixture names (e.g. vit,pipeline/decoder)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per tool (default 3)")
    p.add_argument("--rounds", type=int, default=40, help="latency rounds (default 40, min 30)")
    p.add_argument("--warmup", type=int, default=5, help="warmup runs per session (default 5)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per tool run or measurement (default 600)")
    p.add_argument("--ort-python", default=sys.executable,
                   help="Python that runs the ORT optimizer (default: this one)")
    p.add_argument("--keep", metavar="DIR", help="keep the optimized models under DIR")
    p.add_argument("--skip-latency", action="store_true",
                   help="skip latency and accuracy (compile times and op counts only)")
    args = p.parse_args(argv)
    if args.rounds < 30:
        p.error("--rounds must be at least 30")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if os.sep in args.mmq or (os.altsep and os.altsep in args.mmq):
        args.mmq = str(Path(args.mmq).resolve())

    configs, notes = generator_configs()
    todo = subjects(configs)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        known = {s.name for s in todo}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            p.error(f"unknown fixture(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        todo = [s for s in todo if s.name in wanted]
    for n in notes:
        log(n)

    if args.keep:
        root = Path(args.keep).resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.mkdtemp(prefix="compare_ort."))
    results: dict[str, dict[str, Any]] = {}
    try:
        for s in todo:
            try:
                results[s.name] = compare_one(s, root / s.name.replace("/", "_"), args)
            except Exception as exc:  # noqa: BLE001
                results[s.name] = {"error": err(f"{type(exc).__name__}: {exc}")}
        report = render(results)
        print(report)
        if args.json:
            doc = {"configs": {k: {"num_heads": h, "hidden_size": n}
                               for k, (h, n) in configs.items()},
                   "config_notes": notes, "goal": GOAL, "rounds": args.rounds,
                   "warmup": args.warmup, "repeat": args.repeat, "fixtures": results}
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
