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

With --matrix the subjects are the exported cells of the export matrix instead
(tests/fixtures/matrix/transformers.json and cnn.json, written by tools/gen_matrix.py; entries
with an "error" were not exported and are skipped). Model types per family: vit -> vit,
clip -> clip, siglip -> vit and clip, gpt2 and gpt2_kv -> gpt2, bert -> bert, llama_gqa_kv and
qwen2_kv -> gpt2 and bert, llava -> clip and gpt2, CNN cells -> bert with heads/hidden 0 (basic
graph optimizations); heads and hidden size are read from tools/gen_matrix.py. Errors are taken
against the stored outputs.npz of each cell, latency uses 1 intra-op thread unless --threads
says otherwise, and the report is one table row per cell (attention blocks = Softmax nodes plus
standard Attention ops of the source; fused = attention ops in the output, any domain):

    .venv-fixtures/bin/python tools/compare_ort.py --mmq target/release/mmq --matrix
        [--only vit,gpt2_kv_dynamo18] [--threads 1,0] [--json OUT.json]

It prints one markdown table per section and, with --json, writes every number. A tool or model
that fails puts "error: ..." in its cells and the run continues; latency and accuracy run in a
child process per fixture, so a crash inside ONNX Runtime is reported, not fatal.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
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
    stored: Path | None = None  # reference outputs (matrix cells: outputs.npz)
    meta: dict[str, Any] = field(default_factory=dict)  # the manifest entry (matrix cells)

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
# the export matrix (--matrix): tests/fixtures/matrix/, written by tools/gen_matrix.py

MATRIX = FIXTURES / "matrix"
MATRIX_GENERATOR = REPO_ROOT / "tools" / "gen_matrix.py"

# Where each family's (heads, hidden) is set in tools/gen_matrix.py: the function whose config
# call carries the keywords. Every family is hidden 32 / 4 heads at the time of writing; these
# are the fallbacks when the generator cannot be read.
MATRIX_TOWERS = {
    "vit": "case_vit",
    "clip": "case_clip",
    "siglip": "case_siglip",
    "gpt2": "gpt2_config",
    "bert": "case_bert",
    "llama": "llama_config",
    "qwen2": "case_qwen2_kv",
    "llava_vision": "case_llava",
}
MATRIX_FALLBACK = (4, 32)

# Optimizer model types per family, in the order tried, with the tower that gives heads/hidden.
MATRIX_TYPES: dict[str, list[tuple[str, str]]] = {
    "vit": [("vit", "vit")],
    "clip": [("clip", "clip")],
    "siglip": [("vit", "siglip"), ("clip", "siglip")],
    "gpt2": [("gpt2", "gpt2")],
    "gpt2_kv": [("gpt2", "gpt2")],
    "bert": [("bert", "bert")],
    "llama_gqa_kv": [("gpt2", "llama"), ("bert", "llama")],
    "qwen2_kv": [("gpt2", "qwen2"), ("bert", "qwen2")],
    "llava": [("clip", "llava_vision"), ("gpt2", "llama")],
}


def matrix_configs(path: Path = MATRIX_GENERATOR) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """(heads, hidden) per tower of tools/gen_matrix.py, from the keyword constants
    (num_attention_heads/hidden_size or n_head/n_embd) inside each tower's function."""
    configs = {k: MATRIX_FALLBACK for k in MATRIX_TOWERS}
    notes: list[str] = []
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError) as exc:
        return configs, [f"cannot read {path.name} ({exc}); {MATRIX_FALLBACK} used"]
    per_function: dict[str, dict[str, Any]] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            kws: dict[str, Any] = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    for kw in node.keywords:
                        if kw.arg and isinstance(kw.value, ast.Constant):
                            kws.setdefault(kw.arg, kw.value.value)
            per_function[fn.name] = kws
    for tower, fn in MATRIX_TOWERS.items():
        kws = per_function.get(fn, {})
        heads = kws.get("num_attention_heads", kws.get("n_head"))
        hidden = kws.get("hidden_size", kws.get("n_embd"))
        if isinstance(heads, int) and isinstance(hidden, int):
            configs[tower] = (heads, hidden)
        else:
            notes.append(f"{tower}: {fn}() has no constant heads/hidden; {MATRIX_FALLBACK} used")
    return configs, notes


def matrix_subjects(configs: dict[str, tuple[int, int]]) -> tuple[list[Subject], list[str]]:
    """Every exported cell of the two matrix manifests; notes on the entries skipped."""
    todo: list[Subject] = []
    notes: list[str] = []
    for entry in json.loads((MATRIX / "transformers.json").read_text()):
        name = entry["cell"]
        if "error" in entry:
            notes.append(f"{name}: not exported ({short(entry['error'], 80)})")
            continue
        family = entry["family"]
        types = MATRIX_TYPES.get(family)
        if types is None:
            notes.append(f"{name}: unknown family {family}; bert with heads/hidden 0 tried")
            types = []
        variants = [Variant(t, *configs[tower]) for t, tower in types] or [Variant("bert", 0, 0)]
        todo.append(Subject(name, MATRIX / name / "model.onnx", variants,
                            stored=MATRIX / name / "outputs.npz",
                            meta={"kind": "transformer", **entry}))
    for entry in json.loads((MATRIX / "cnn.json").read_text()):
        name = entry["case"]
        if "error" in entry:
            notes.append(f"{name}: not exported ({short(entry['error'], 80)})")
            continue
        todo.append(Subject(name, MATRIX / name / "model.onnx", [Variant("bert", 0, 0)],
                            note="no CNN model type: bert with ONNX Runtime's basic graph "
                                 "optimizations", stored=MATRIX / name / "outputs.npz",
                            meta={"kind": "cnn", **entry}))
    return todo, notes


def attention_by_domain(path: Path) -> dict[str, int]:
    """Attention-like ops of one model (nested graphs included), keyed "Attention" for the
    standard ONNX op and by op_type for contrib ops (com.microsoft)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    out: dict[str, int] = {}

    def walk(graph: Any) -> None:
        for node in graph.node:
            if node.op_type in ATTENTION_OPS:
                std = node.domain in ("", "ai.onnx")
                key = node.op_type + ("" if std else " (ms)")
                out[key] = out.get(key, 0) + 1
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g)
                for g in attr.graphs:
                    walk(g)

    walk(model.graph)
    return out


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
            threads: list[int], stored: str | None = None) -> dict[str, Any]:
    """Latency per thread count and output errors; every model failure is recorded.

    Errors are taken against the original model's ONNX Runtime outputs, or, with `stored` (an
    outputs.npz keyed by output name), against those stored outputs; then the original itself
    is checked against them too (under accuracy["original"], a dict like the others)."""
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
    checked = others
    if stored is not None:
        try:
            with np.load(stored, allow_pickle=False) as data:
                refs = {k: data[k] for k in data.files}
        except Exception as exc:  # noqa: BLE001
            result["accuracy"]["original"] = err(f"cannot read {stored}: {exc}")
        checked = {"original": orig, **others}
    else:
        try:
            sess, feeds = session(orig, 1)
            names = [o.name for o in sess.get_outputs()]
            refs = dict(zip(names, sess.run(names, feeds)))
        except Exception as exc:  # noqa: BLE001
            result["accuracy"]["original"] = err(f"{type(exc).__name__}: {exc}")
    for key, path in checked.items():
        if refs is None:
            if key not in result["accuracy"]:
                result["accuracy"][key] = err("original does not run" if stored is None
                                              else "no stored outputs")
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


def measure_in_child(orig: Path, others: dict[str, Path], inputs: Path, args,
                     stored: Path | None = None) -> dict[str, Any]:
    spec = {"orig": str(orig), "others": {k: str(v) for k, v in others.items()},
            "inputs": str(inputs), "rounds": args.rounds, "warmup": args.warmup,
            "threads": getattr(args, "threads_list", [1, 0]),
            "stored": str(stored) if stored is not None else None}
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
    m = measure_in_child(s.path, others, s.inputs, args, s.stored)
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
# the export matrix report

ATTN_SHORT = {"Attention": "onnx Attention", "Attention (ms)": "Attention",
              "MultiHeadAttention (ms)": "MHA", "GroupQueryAttention (ms)": "GQA",
              "PackedAttention (ms)": "PackedAttn", "PackedMultiHeadAttention (ms)": "PackedMHA"}
SLOWER = 1.02  # a latency ratio above this counts as slower than the original


def compare_matrix_one(s: Subject, workdir: Path, args) -> dict[str, Any]:
    """compare_one plus the attention ops by domain (standard Attention vs contrib ops)."""
    rec = compare_one(s, workdir, args)
    rec["cell"] = s.meta
    attn: dict[str, Any] = {}
    for key, path in (("original", s.path), ("mmq", rec.get("mmq", {}).get("output")),
                      ("ort", rec.get("ort", {}).get("output"))):
        if path:
            try:
                attn[key] = attention_by_domain(Path(path))
            except Exception as exc:  # noqa: BLE001
                attn[key] = err(f"cannot read {path}: {exc}")
    rec["attention_by_domain"] = attn
    return rec


def matrix_blocks(rec: dict[str, Any]) -> int | str:
    """Attention blocks of the source: Softmax nodes plus standard Attention ops."""
    c = counts_of(rec, "original")
    if isinstance(c, str):
        return c
    return c["Softmax"] + rec.get("attention_by_domain", {}).get("original", {}).get("Attention", 0)


def matrix_fused(rec: dict[str, Any], key: str) -> int | str:
    c = counts_of(rec, key)
    return c if isinstance(c, str) else c["attention"]["total"]


def fused_cell(rec: dict[str, Any], key: str, blocks: Any) -> str:
    n = matrix_fused(rec, key)
    if isinstance(n, str):
        return n
    kinds = rec.get("attention_by_domain", {}).get(key)
    text = f"{n}/{blocks}"
    if isinstance(kinds, dict) and kinds:
        text += " " + "+".join(ATTN_SHORT.get(k, k) for k in kinds)
    return text


def ratios(rec: dict[str, Any], key: str) -> list[float | str]:
    """Latency ratio key/original per thread count, in measurement order."""
    m = rec.get("measure")
    if m is None:
        return []
    if "error" in m:
        return [m["error"]]
    out: list[float | str] = []
    for entry in m["latency"].values():
        a, b = entry.get(key), entry.get("original")
        if isinstance(a, float) and isinstance(b, float) and b > 0:
            out.append(a / b)
        else:
            out.append(next((x for x in (a, b) if is_err(x)), "-"))
    return out


def ratio_cell(rec: dict[str, Any], key: str) -> str:
    rs = ratios(rec, key)
    if not rs:
        return "-"
    return " / ".join(f"{r:.2f}" if isinstance(r, float) else str(r) for r in rs)


def max_err(rec: dict[str, Any], key: str) -> float | str | None:
    m = rec.get("measure")
    if m is None:
        return None
    if "error" in m:
        return m["error"]
    a = m["accuracy"].get(key)
    if a is None or isinstance(a, str):
        return a
    worst = 0.0
    for x in a.values():
        if is_err(x):
            return x
        if x != x or x > worst:  # NaN wins
            worst = x
    return worst


def err_cell(rec: dict[str, Any], key: str) -> str:
    x = max_err(rec, key)
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.1e}" + ("" if x <= GOAL else " FAIL")
    return str(x)


def exporter_cell(meta: dict[str, Any]) -> str:
    return f"{str(meta.get('exporter', '?')).split(' ')[0]} {meta.get('opset', '?')}"


def render_matrix(results: dict[str, dict[str, Any]], threads: list[int]) -> str:
    labels = " / ".join("1 thread" if n == 1 else ("default threads" if n == 0 else f"{n} threads")
                        for n in threads)
    out = []
    tf = {k: r for k, r in results.items() if r.get("cell", {}).get("kind") == "transformer"}
    cnn = {k: r for k, r in results.items() if r.get("cell", {}).get("kind") == "cnn"}
    other = {k: r for k, r in results.items() if k not in tf and k not in cnn}

    rows = []
    tot = {"blocks": 0, "mmq": 0, "ort": 0, "mmq_std": 0, "ort_std": 0, "src_std": 0}
    slower: list[str] = []
    incomplete: list[str] = []
    errors: list[str] = []
    for name, rec in tf.items():
        meta = rec["cell"]
        blocks = matrix_blocks(rec)
        best = rec.get("ort", {}).get("best")
        ort_cell = fused_cell(rec, "ort", blocks) + (f" ({best})" if best else "")
        rows.append([name, exporter_cell(meta), meta.get("attn", "?"), blocks,
                     fused_cell(rec, "mmq", blocks), ort_cell, ratio_cell(rec, "mmq"),
                     ratio_cell(rec, "ort"), err_cell(rec, "mmq")])
        if isinstance(blocks, int):
            tot["blocks"] += blocks
            byd = rec.get("attention_by_domain", {})
            tot["src_std"] += byd.get("original", {}).get("Attention", 0)
            expected = meta.get("softmax", 0) + meta.get("attention_ops", 0)
            if expected != blocks:
                errors.append(f"{name}: {blocks} blocks counted, manifest says {expected}")
            for key in ("mmq", "ort"):
                n = matrix_fused(rec, key)
                if isinstance(n, int):
                    tot[key] += n
                    d = byd.get(key)
                    tot[key + "_std"] += d.get("Attention", 0) if isinstance(d, dict) else 0
                    if key == "mmq" and n < blocks:
                        incomplete.append(f"{name} ({n}/{blocks})")
        for key in ("mmq", "ort"):
            e = rec.get(key, {}).get("error")
            if e:
                errors.append(f"{name}: {key}: {e}")
        r = ratios(rec, "mmq")
        if r and isinstance(r[0], float) and r[0] > SLOWER:
            slower.append(f"{name} ({ratio_cell(rec, 'mmq')})")
    out.append("### Transformer cells\n\n" + markdown(
        ["cell", "exporter/opset", "attn", "blocks", "mmq fused", "ORT fused (model type)",
         f"latency mmq/original ({labels})", f"latency ORT-opt/original ({labels})",
         "mmq max err"], rows))
    out.append(
        f"Totals over {len(tf)} transformer cells: {tot['blocks']} attention blocks; fused by "
        f"mmq {tot['mmq']}/{tot['blocks']}, by the ORT optimizer {tot['ort']}/{tot['blocks']}. "
        f"{tot['src_std']} of the blocks are standard `Attention` ops in the source; the outputs "
        f"keep {tot['mmq_std']} (mmq) and {tot['ort_std']} (ORT) of those as they are.")

    rows = []
    for name, rec in cnn.items():
        meta = rec["cell"]
        cs = [counts_of(rec, k) for k in ("original", "mmq", "ort")]

        def three(f: Any) -> str:
            return " / ".join(str(f(c)) if isinstance(c, dict) else "error" for c in cs)

        rows.append([name, exporter_cell(meta), three(lambda c: c["nodes"]),
                     three(lambda c: c["FusedConv"]), three(lambda c: c["BatchNormalization"]),
                     ratio_cell(rec, "mmq"), ratio_cell(rec, "ort"), err_cell(rec, "mmq")])
        for key in ("mmq", "ort"):
            e = rec.get(key, {}).get("error")
            if e:
                errors.append(f"{name}: {key}: {e}")
        r = ratios(rec, "mmq")
        if r and isinstance(r[0], float) and r[0] > SLOWER:
            slower.append(f"{name} ({ratio_cell(rec, 'mmq')})")
    if rows:
        out.append("### CNN cells (ORT optimizer: bert, basic graph optimizations)\n\n" + markdown(
            ["cell", "exporter/opset", "nodes orig / mmq / ORT", "FusedConv orig / mmq / ORT",
             "BN orig / mmq / ORT", f"latency mmq/original ({labels})",
             f"latency ORT-opt/original ({labels})", "mmq max err"], rows))

    rows = []
    for name, rec in results.items():
        vs = rec.get("ort", {}).get("variants", [])
        rows.append([name, "; ".join(
            f"{v['model_type']} ({v['num_heads']}/{v['hidden_size']}): "
            + (v["error"] if "error" in v else
               f"{v['counts']['attention']['total']} attention, {v['fused']} fused nodes")
            for v in vs) or rec.get("error", "-")])
    out.append("### ORT optimizer, every model type tried (heads/hidden)\n\n"
               + markdown(["cell", "variants"], rows))

    rows = []
    for name, rec in results.items():
        m = rec.get("measure")
        if m is None or "error" in m:
            continue
        rows.append([name, err_cell(rec, "original"), err_cell(rec, "mmq"), err_cell(rec, "ort")])
    if rows:
        out.append("### Max error vs the stored outputs.npz, |out - ref| / (1 + |ref|), all "
                   "outputs\n\n" + markdown(["cell", "original", "mmq -O2", "ORT optimizer"],
                                                rows))

    for name, rec in other.items():
        errors.append(f"{name}: {rec.get('error', 'no result')}")
    for name, rec in results.items():
        m = rec.get("measure")
        if isinstance(m, dict) and "error" in m:
            errors.append(f"{name}: measurement: {m['error']}")
    summary = [f"mmq slower than the original (ratio > {SLOWER}, first thread count): "
               + (", ".join(slower) or "none"),
               "mmq fusion incomplete: " + (", ".join(incomplete) or "none"),
               "errors: " + ("; ".join(errors) or "none")]
    out.append("### Summary\n\n" + "\n".join(f"- {line}" for line in summary))
    return "\n\n".join(out) + "\n"


# --------------------------------------------------------------------------


@contextlib.contextmanager
def work_dir(args, prefix: str):
    """`--keep DIR` (created, kept), else a temporary directory removed afterwards."""
    if args.keep:
        root = Path(args.keep).resolve()
        root.mkdir(parents=True, exist_ok=True)
        yield root
        return
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_measure"]:  # internal: one fixture's latency and accuracy
        spec = json.loads(argv[1])
        res = measure(spec["orig"], spec["others"], spec["inputs"], spec["rounds"],
                      spec["warmup"], spec["threads"], spec.get("stored"))
        print(json.dumps(res))
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Tables are described in docs/benchmarks.md.")
    p.add_argument("--mmq", required=True, help="the mmq binary")
    p.add_argument("--json", metavar="OUT.json", help="write every number here")
    p.add_argument("--only", help="comma-separated fixture names (e.g. vit,pipeline/decoder); "
                   "with --matrix, cell names or prefixes (e.g. vit,gpt2_kv_dynamo18)")
    p.add_argument("--matrix", action="store_true",
                   help="the export matrix instead of the fixtures: every exported cell of "
                   "tests/fixtures/matrix/{transformers,cnn}.json, errors against the stored "
                   "outputs.npz")
    p.add_argument("--threads", metavar="N,N",
                   help="intra-op thread counts for latency, 0 = ONNX Runtime's default "
                   "(default 1,0; with --matrix 1)")
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
    try:
        args.threads_list = ([int(t) for t in args.threads.split(",") if t.strip()]
                             if args.threads else ([1] if args.matrix else [1, 0]))
    except ValueError:
        p.error("--threads takes comma-separated integers")
    if not args.threads_list or any(t < 0 for t in args.threads_list):
        p.error("--threads takes comma-separated integers >= 0")

    if args.matrix:
        return run_matrix(args, p)

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

    results: dict[str, dict[str, Any]] = {}
    with work_dir(args, "compare_ort.") as root:
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
    return 0


def run_matrix(args, p: argparse.ArgumentParser) -> int:
    configs, notes = matrix_configs()
    todo, skipped = matrix_subjects(configs)
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if not any(s.name.startswith(w) for s in todo)]
        if unknown:
            p.error(f"no matrix cell starts with {', '.join(unknown)}")
        todo = [s for s in todo if any(s.name.startswith(w) for w in wanted)]
    for n in notes + skipped:
        log(n)

    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    with work_dir(args, "compare_ort_matrix.") as root:
        for i, s in enumerate(todo, 1):
            log(f"[{i}/{len(todo)}] {s.name}")
            try:
                results[s.name] = compare_matrix_one(s, root / s.name, args)
            except Exception as exc:  # noqa: BLE001
                results[s.name] = {"cell": s.meta, "error": err(f"{type(exc).__name__}: {exc}")}
        report = render_matrix(results, args.threads_list)
        print(report)
        log(f"{len(todo)} cells in {time.perf_counter() - t0:.0f} s")
        if args.json:
            import onnxruntime

            doc = {"matrix": True, "configs": {k: {"num_heads": h, "hidden_size": n}
                                               for k, (h, n) in configs.items()},
                   "config_notes": notes, "skipped": skipped, "goal": GOAL,
                   "rounds": args.rounds, "warmup": args.warmup, "repeat": args.repeat,
                   "threads": args.threads_list, "onnxruntime": onnxruntime.__version__,
                   "cpu_count": os.cpu_count(), "cells": results}
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
