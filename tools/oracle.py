#!/usr/bin/env python3
"""Reference oracle for mmq: ONNX checker and ONNX Runtime (CPU) execution.

Run with the project virtual environment (see tools/setup-venv.sh):

    .venv/bin/python tools/oracle.py SUBCOMMAND ...

Subcommands:

  node-dump OUTDIR [--with-data]
      Build every case of the ONNX node test suite in memory and write
      OUTDIR/<case>/model.onnx for each, plus OUTDIR/cases.txt (sorted names).
      With --with-data, also write the case's first data set in the standard
      layout OUTDIR/<case>/test_data_set_0/{input,output}_<i>.pb (TensorProto
      named after the graph input/output; bfloat16, float8 and int4 keep their
      element type) and OUTDIR/<case>/tolerance.txt ("RTOL ATOL"). A sequence
      is a directory <stem>.seq/ holding 0.pb, 1.pb, ..., dtype.txt (the ONNX
      element type code) and name.txt (the value's name); an optional is
      <stem>.opt.pb or <stem>.opt.seq/ when it holds a value and a file
      <stem>.none holding the value's name when it does not.
      Any other value is a marker file <stem>.unsupported holding its kind.

  node-eval CASEDIR --converted CONVDIR -o RESULT.json [--only NAME...]
      For each node test case (restricted to CASEDIR/cases.txt when present),
      run the original model and CONVDIR/<case>/model.onnx in ONNX Runtime on
      the case inputs and compare with the expected outputs the way the ONNX
      backend test runner does. Also run the full ONNX checker on the
      converted model. Writes a JSON object keyed by case name:
          {"original": "pass" | "fail: ...",
           "converted": "pass" | "fail: ..." | "missing",
           "checker": "ok" | "<first error line>" | "missing"}
      Cases run in worker processes, so a crash or hang inside ONNX Runtime
      is recorded as a failure of that case and the run continues.

  check MODEL.onnx
      onnx.checker.check_model(MODEL, full_check=True); exit 1 on error.

  run-compare MODEL.onnx INPUTS.npz EXPECTED.npz [--exact | --tol RTOL] [--atol ATOL]
      Run MODEL on the inputs and compare every output named in EXPECTED.npz.
      Prints the max abs diff per output; exit 1 on mismatch.

  run MODEL.onnx INPUTS.npz -o OUT.npz
      Run MODEL on the inputs and save all outputs.

  run-pipeline PACKAGE_DIR INPUTS.npz -o OUT.npz
      Run an mmq package's stages (pipeline.json) in order in ONNX Runtime, each input
      taken from the output bound to it or from INPUTS.npz by name; save every stage's
      outputs (as STAGE.NAME where two stages have an output of one name).

Only the standard library, onnx, onnxruntime and numpy are used.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REASON_MAX = 200
DEFAULT_RTOL = 1e-3
DEFAULT_ATOL = 1e-7
DEFAULT_CASE_TIMEOUT = 120.0

PHASES = ("original", "checker", "converted")

# ONNX Runtime tensor types that its Python API converts to numpy directly.
NUMPY_TENSOR_TYPES = frozenset(
    f"tensor({t})"
    for t in (
        "float", "double", "float16", "int8", "int16", "int32", "int64", "uint8",
        "uint16", "uint32", "uint64", "bool", "string", "complex64", "complex128",
    )
)


# --------------------------------------------------------------------------
# helpers


def short(text: str, limit: int = REASON_MAX) -> str:
    """Collapse text to one line of at most `limit` characters."""
    parts = [line.strip() for line in str(text).splitlines()]
    line = "; ".join(p for p in parts if p)
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


def first_line(text: str, limit: int = REASON_MAX) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return short(line, limit)
    return ""


def exc_reason(exc: BaseException) -> str:
    msg = short(str(exc))
    name = type(exc).__name__
    if not msg:
        return name
    if isinstance(exc, AssertionError):
        return short(msg)
    return short(f"{name}: {msg}")


def fail(reason: str) -> str:
    return short(f"fail: {reason}")


def make_session(model: str | bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    # As in onnxruntime.backend: never hide a failure behind a provider fallback.
    sess.disable_fallback()
    return sess


# Ops that ONNX Runtime registers in the default ONNX domain although ONNX has no such
# operator (ONNX Runtime's own transformer optimizer writes them there too). The checker knows
# no schema for them, so they are checked as if they were in ONNX Runtime's contrib domain.
ORT_DEFAULT_DOMAIN_OPS = {"SimplifiedLayerNormalization"}


def check_model(path: str) -> None:
    import onnx

    model = onnx.load(path, load_external_data=False)
    moved = False
    for node in model.graph.node:
        if node.domain in ("", "ai.onnx") and node.op_type in ORT_DEFAULT_DOMAIN_OPS:
            node.domain = "com.microsoft"
            moved = True
    if not moved:
        onnx.checker.check_model(path, full_check=True)
        return
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    onnx.checker.check_model(model, full_check=True)


# --------------------------------------------------------------------------
# node test suite


def collect_cases() -> list[Any]:
    """All node test cases, built in memory (the onnx wheel ships no data)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import numpy as np
        from onnx.backend.test.case.node import collect_testcases

        with np.errstate(all="ignore"):
            return list(collect_testcases())


def normalize_value(value: Any) -> Any:
    """Case data as ONNX Runtime takes it (TensorProto -> ndarray, scalar -> 0-d)."""
    import numpy as np
    import onnx

    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, np.generic):
        return np.asarray(value)
    if isinstance(value, list):
        return [normalize_value(v) for v in value]
    return value


def graph_input_names(model: Any) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    inits |= {t.values.name for t in model.graph.sparse_initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def is_exotic(value: Any) -> bool:
    """True for ndarrays of ml_dtypes types (bfloat16, float8, int4, ...)."""
    import numpy as np

    return isinstance(value, np.ndarray) and value.dtype.type.__module__.startswith("ml_dtypes")


def exotic_to_ortvalue(value: Any) -> Any:
    """ndarray of an ml_dtypes type -> OrtValue, via the ONNX raw (packed) layout."""
    import ctypes

    import onnx
    import onnxruntime as ort

    tp = onnx.numpy_helper.from_array(value)
    raw = tp.raw_data
    ov = ort.OrtValue.ortvalue_from_shape_and_type(list(value.shape), tp.data_type, "cpu", 0)
    if ov.tensor_size_in_bytes() != len(raw):
        raise ValueError(
            f"size mismatch for {value.dtype} input: {len(raw)} bytes vs "
            f"{ov.tensor_size_in_bytes()} in ONNX Runtime"
        )
    if raw:
        ctypes.memmove(ov.data_ptr(), raw, len(raw))
    return ov


def ortvalue_to_value(ov: Any) -> Any:
    """OrtValue -> ndarray, reading element types numpy lacks through raw bytes."""
    import ctypes

    import onnx

    # ONNX element types numpy represents natively (FLOAT ... COMPLEX128);
    # for others ONNX Runtime either fails or returns raw uint8 codes.
    if not ov.is_tensor() or 1 <= ov.element_type() <= 15:
        return ov.numpy()
    size = ov.tensor_size_in_bytes()
    raw = ctypes.string_at(ov.data_ptr(), size) if size else b""
    tp = onnx.helper.make_tensor("out", ov.element_type(), list(ov.shape()), raw, raw=True)
    return onnx.numpy_helper.to_array(tp)


def session_run(sess: Any, out_names: list[str], feeds: dict[str, Any]) -> list[Any]:
    """sess.run, except that element types numpy lacks (bfloat16, float8, int4,
    ...) go through OrtValues, which the plain API cannot convert."""
    import onnxruntime as ort

    exotic = any(is_exotic(v) for v in feeds.values())
    if not exotic:
        declared = {o.name: o.type for o in sess.get_outputs()}
        exotic = any(
            t.startswith("tensor(") and t not in NUMPY_TENSOR_TYPES
            for t in (declared.get(n, "") for n in out_names)
        )
    if not exotic:
        return list(sess.run(out_names, feeds))
    ort_feeds = {
        k: exotic_to_ortvalue(v) if is_exotic(v) else ort.OrtValue.ortvalue_from_numpy(v)
        for k, v in feeds.items()
    }
    outs = sess.run_with_ort_values(out_names, ort_feeds)
    return [ortvalue_to_value(ov) for ov in outs]


def run_case(model: str | bytes, case: Any) -> str:
    """Run one model on every data set of a case and compare like the backend runner."""
    from onnx.backend.test.runner import Runner

    try:
        sess = make_session(model)
    except Exception as exc:  # noqa: BLE001
        return fail(exc_reason(exc))
    # Inputs are positional in the case; bind them to the original model's
    # input names so a converted model may order its inputs differently.
    in_names = graph_input_names(case.model)
    out_names = [o.name for o in case.model.graph.output]
    for inputs, ref_outputs in case.data_sets:
        try:
            feeds = {
                name: normalize_value(value)
                for name, value in zip(in_names, inputs)
            }
            outputs = session_run(sess, out_names, feeds)
        except Exception as exc:  # noqa: BLE001
            return fail(exc_reason(exc))
        try:
            refs = [normalize_value(r) for r in ref_outputs]
            Runner.assert_similar_outputs(
                ref_outputs=refs,
                outputs=list(outputs),
                rtol=getattr(case, "rtol", DEFAULT_RTOL),
                atol=getattr(case, "atol", DEFAULT_ATOL),
                model_dir=None,
            )
        except Exception as exc:  # noqa: BLE001
            return fail(exc_reason(exc))
    return "pass"


def run_phase(case: Any, phase: str, convdir: Path) -> str:
    if phase == "original":
        return run_case(case.model.SerializeToString(), case)
    conv = convdir / case.name / "model.onnx"
    if not conv.is_file():
        return "missing"
    if phase == "checker":
        try:
            check_model(str(conv))
        except Exception as exc:  # noqa: BLE001
            return first_line(f"{type(exc).__name__}: {exc}") or type(exc).__name__
        return "ok"
    if phase == "converted":
        return run_case(str(conv), case)
    raise ValueError(f"unknown phase {phase}")


def seq_elem_type(type_proto: Any) -> int:
    """The ONNX element type code of a sequence's tensors from its TypeProto (0 when unknown)."""
    if type_proto is not None and type_proto.HasField("sequence_type"):
        elem = type_proto.sequence_type.elem_type
        if elem.HasField("tensor_type"):
            return elem.tensor_type.elem_type
    return 0


def write_case_value(d: Path, stem: str, name: str, value: Any, type_proto: Any = None) -> None:
    """One case value, typed by `type_proto` (the graph input/output type, when known):
    a tensor as `stem.pb` (a named TensorProto); a sequence as a directory `stem.seq/` holding
    `0.pb`, `1.pb`, ..., `dtype.txt` (the ONNX element type code, so that an empty sequence
    keeps its type) and `name.txt` (the value's name); an optional as `stem.opt.pb` /
    `stem.opt.seq/` when it holds a value and as a file `stem.none` holding the value's name
    when it does not. Anything else becomes a `stem.unsupported`
    marker holding its kind."""
    import numpy as np
    import onnx

    value = normalize_value(value)
    if type_proto is not None and type_proto.HasField("optional_type"):
        if value is None:
            (d / f"{stem}.none").write_text(name + "\n")
            return
        write_case_value(d, f"{stem}.opt", name, value, type_proto.optional_type.elem_type)
        return
    if isinstance(value, np.ndarray):
        # from_array keeps ml_dtypes element types (bfloat16, float8, int4) as ONNX types.
        tp = onnx.numpy_helper.from_array(value, name)
        (d / f"{stem}.pb").write_bytes(tp.SerializeToString())
        return
    if isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
        seq = d / f"{stem}.seq"
        seq.mkdir(exist_ok=True)
        elem_type = seq_elem_type(type_proto)
        for k, v in enumerate(value):
            tp = onnx.numpy_helper.from_array(v, f"{name}_{k}")
            elem_type = elem_type or tp.data_type
            (seq / f"{k}.pb").write_bytes(tp.SerializeToString())
        (seq / "dtype.txt").write_text(f"{elem_type}\n")
        (seq / "name.txt").write_text(name + "\n")
        return
    if value is None:
        (d / f"{stem}.none").write_text(name + "\n")
        return
    kind = "sequence" if isinstance(value, list) else type(value).__name__
    (d / f"{stem}.unsupported").write_text(kind + "\n")


def write_case_data(d: Path, case: Any) -> None:
    """The first data set of a case in the ONNX backend test layout, plus its tolerances."""
    rtol = getattr(case, "rtol", DEFAULT_RTOL)
    atol = getattr(case, "atol", DEFAULT_ATOL)
    (d / "tolerance.txt").write_text(f"{rtol!r} {atol!r}\n")
    if not case.data_sets:
        return
    inputs, outputs = case.data_sets[0]
    data = d / "test_data_set_0"
    data.mkdir(exist_ok=True)
    in_names = graph_input_names(case.model)
    in_types = {i.name: i.type for i in case.model.graph.input}
    outs = list(case.model.graph.output)
    for i, (name, value) in enumerate(zip(in_names, inputs)):
        write_case_value(data, f"input_{i}", name, value, in_types.get(name))
    for i, (out, value) in enumerate(zip(outs, outputs)):
        write_case_value(data, f"output_{i}", out.name, value, out.type)


def cmd_node_dump(args: argparse.Namespace) -> int:
    import numpy as np
    import onnx

    t0 = time.monotonic()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    cases = collect_cases()
    names = []
    for case in cases:
        d = out / case.name
        d.mkdir(exist_ok=True)
        onnx.save(case.model, str(d / "model.onnx"))
        if args.with_data:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                write_case_data(d, case)
        names.append(case.name)
    names = sorted(set(names))
    (out / "cases.txt").write_text("".join(n + "\n" for n in names))
    print(f"node-dump: wrote {len(names)} cases to {out} in {time.monotonic() - t0:.1f}s")
    return 0


def cmd_node_worker(args: argparse.Namespace) -> int:
    """Internal: evaluate tasks read from stdin, report JSON lines on fd args.fd."""
    report = os.fdopen(args.fd, "w", buffering=1)
    tasks = json.loads(sys.stdin.read())
    by_name = {c.name: c for c in collect_cases()}
    convdir = Path(args.converted)
    report.write(json.dumps({"ready": True}) + "\n")
    for name, phase in tasks:
        report.write(json.dumps({"start": [name, phase]}) + "\n")
        case = by_name.get(name)
        if case is None:
            result = fail("unknown case")
        else:
            try:
                result = run_phase(case, phase, convdir)
            except Exception as exc:  # noqa: BLE001
                result = fail(exc_reason(exc))
        report.write(json.dumps({"done": [name, phase, result]}) + "\n")
    report.close()
    return 0


class Worker:
    """One worker process evaluating a queue of (case, phase) tasks."""

    def __init__(self, tasks: list[tuple[str, str]], convdir: str, timeout: float):
        self.pending = list(tasks)
        self.convdir = convdir
        self.timeout = timeout
        self.proc: subprocess.Popen | None = None
        self.reader = None
        self.buf = b""
        self.current: tuple[str, str] | None = None
        self.deadline = 0.0
        self.errlog = None
        self.ready = False

    def start(self) -> None:
        rfd, wfd = os.pipe()
        self.errlog = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "_node-worker",
             "--converted", self.convdir, "--fd", str(wfd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self.errlog,
            pass_fds=(wfd,),
        )
        os.close(wfd)
        self.reader = os.fdopen(rfd, "rb", buffering=0)
        os.set_blocking(rfd, False)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(self.pending).encode())
        self.proc.stdin.close()
        self.buf = b""
        self.current = None
        self.ready = False
        # Collecting the test cases takes a while; allow for it.
        self.deadline = time.monotonic() + self.timeout + 300

    def stderr_tail(self) -> str:
        if self.errlog is None:
            return ""
        self.errlog.seek(0, os.SEEK_END)
        size = self.errlog.tell()
        self.errlog.seek(max(0, size - 4096))
        lines = [l for l in self.errlog.read().decode(errors="replace").splitlines() if l.strip()]
        return lines[-1].strip() if lines else ""

    def on_data(self, results: dict) -> bool:
        """Consume available output; return False at end of stream."""
        assert self.reader is not None
        chunk = self.reader.read(65536)
        if chunk is None:
            return True
        if not chunk:
            return False
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if "ready" in msg:
                self.ready = True
            elif "start" in msg:
                self.current = tuple(msg["start"])
                self.deadline = time.monotonic() + self.timeout
            elif "done" in msg:
                name, phase, result = msg["done"]
                results.setdefault(name, {})[phase] = result
                if self.pending and tuple(self.pending[0]) == (name, phase):
                    self.pending.pop(0)
                self.current = None
        return True

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self.finish()

    def finish(self) -> int | None:
        rc = None
        if self.proc is not None:
            rc = self.proc.wait()
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        return rc

    def abandon_current(self, results: dict, reason: str) -> None:
        """Record the task in progress (or the next one) as failed and drop it.

        A worker that dies before it is ready would die again: give up on all
        of its tasks then.
        """
        if not self.ready:
            for name, phase in self.pending:
                results.setdefault(name, {})[phase] = fail(f"worker failed to start: {reason}")
            self.pending = []
            return
        task = self.current or (tuple(self.pending[0]) if self.pending else None)
        if task is None:
            return
        name, phase = task
        results.setdefault(name, {})[phase] = fail(reason)
        self.pending = [t for t in self.pending if tuple(t) != task]
        self.current = None


def describe_exit(rc: int | None) -> str:
    if rc is not None and rc < 0:
        try:
            return f"worker killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"worker killed by signal {-rc}"
    return f"worker exited with status {rc}"


def run_workers(tasks_per_worker: list[list[tuple[str, str]]], convdir: str,
                timeout: float, results: dict) -> int:
    """Drive the workers to completion, restarting any that crash or hang."""
    workers = [Worker(t, convdir, timeout) for t in tasks_per_worker if t]
    restarts = 0
    sel = selectors.DefaultSelector()
    for w in workers:
        w.start()
        sel.register(w.reader, selectors.EVENT_READ, w)
    active = set(workers)
    while active:
        now = time.monotonic()
        wait = max(0.0, min(w.deadline for w in active) - now)
        for key, _ in sel.select(timeout=min(wait, 5.0)):
            w = key.data
            if w.on_data(results):
                continue
            sel.unregister(w.reader)
            rc = w.finish()
            if w.pending:
                reason = describe_exit(rc)
                tail = w.stderr_tail()
                if tail:
                    reason += f" ({tail})"
                w.abandon_current(results, reason)
            if w.pending:
                restarts += 1
                w.start()
                sel.register(w.reader, selectors.EVENT_READ, w)
            else:
                active.discard(w)
        now = time.monotonic()
        for w in list(active):
            if now > w.deadline and w.reader is not None:
                sel.unregister(w.reader)
                w.kill()
                w.abandon_current(results, f"timeout after {timeout:g}s")
                if w.pending:
                    restarts += 1
                    w.start()
                    sel.register(w.reader, selectors.EVENT_READ, w)
                else:
                    active.discard(w)
    return restarts


def cmd_node_eval(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    casedir = Path(args.casedir)
    listing = casedir / "cases.txt"
    if listing.is_file():
        names = [l.strip() for l in listing.read_text().splitlines() if l.strip()]
    elif casedir.is_dir():
        names = sorted(p.name for p in casedir.iterdir() if (p / "model.onnx").is_file())
    else:
        print(f"node-eval: {casedir} is not a directory", file=sys.stderr)
        return 2
    if args.only:
        wanted = set(args.only)
        unknown = wanted - set(names)
        if unknown:
            print(f"node-eval: unknown case(s): {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        names = [n for n in names if n in wanted]
    names = sorted(set(names))
    jobs = max(1, min(args.jobs, len(names) or 1))
    buckets: list[list[tuple[str, str]]] = [[] for _ in range(jobs)]
    for i, name in enumerate(names):
        buckets[i % jobs].extend((name, phase) for phase in PHASES)

    results: dict[str, dict[str, str]] = {}
    restarts = run_workers(buckets, str(Path(args.converted).resolve()), args.timeout, results)
    for name in names:
        rec = results.setdefault(name, {})
        for phase in PHASES:
            rec.setdefault(phase, fail("not evaluated"))

    out = Path(args.output)
    if out.parent:
        out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")

    n = len(names)
    orig = sum(r["original"] == "pass" for r in results.values())
    present = [r for r in results.values() if r["converted"] != "missing"]
    conv = sum(r["converted"] == "pass" for r in present)
    checked = sum(r["checker"] == "ok" for r in present)
    both = sum(r["original"] == "pass" and r["converted"] == "pass" for r in present)
    print(
        f"node-eval: {n} cases; original pass {orig}/{n}; converted present {len(present)}, "
        f"pass {conv} (of which original also passes: {both}); checker ok {checked}; "
        f"worker restarts {restarts}; {time.monotonic() - t0:.1f}s"
    )
    return 0


# --------------------------------------------------------------------------
# single-model commands


def cmd_check(args: argparse.Namespace) -> int:
    try:
        check_model(args.model)
    except Exception as exc:  # noqa: BLE001
        print(f"{args.model}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def load_npz(path: str) -> dict[str, Any]:
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def to_ort_value(value: Any) -> Any:
    if value.dtype.kind == "U":
        return value.astype(object)
    return value


def run_model(model: str, inputs_path: str):
    """Returns (session, {output name: value}) after feeding the graph inputs."""
    sess = make_session(model)
    data = load_npz(inputs_path)
    wanted = [i.name for i in sess.get_inputs()]
    missing = [n for n in wanted if n not in data]
    if missing:
        raise KeyError(f"inputs missing from {inputs_path}: {', '.join(missing)}")
    feeds = {n: to_ort_value(data[n]) for n in wanted}
    names = [o.name for o in sess.get_outputs()]
    values = session_run(sess, names, feeds)
    return sess, dict(zip(names, values))


def max_abs_diff(a: Any, b: Any) -> float:
    import numpy as np

    if a.shape != b.shape or a.size == 0:
        return 0.0
    if a.dtype.kind in "OUSV" or b.dtype.kind in "OUSV":
        return 0.0 if np.array_equal(a, b) else float("inf")
    x = a.astype(np.float64)
    y = b.astype(np.float64)
    nan_x, nan_y = np.isnan(x), np.isnan(y)
    if np.any(nan_x != nan_y):
        return float("nan")
    mask = ~nan_x
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(x[mask] - y[mask])
    d = np.where(np.isnan(d), 0.0, d)  # inf - inf of equal sign
    return float(d.max()) if d.size else 0.0


def cmd_run_compare(args: argparse.Namespace) -> int:
    import numpy as np

    try:
        _, got = run_model(args.model, args.inputs)
    except Exception as exc:  # noqa: BLE001
        print(f"run-compare: {exc_reason(exc)}", file=sys.stderr)
        return 1
    expected = load_npz(args.expected)
    if args.produced_only:
        expected = {k: v for k, v in expected.items() if k in got}
        if not expected:
            print("no expected output is produced by this model", file=sys.stderr)
            return 1
    ok = True
    for name in sorted(expected):
        exp = to_ort_value(expected[name])
        if name not in got:
            print(f"{name}: MISSING from model outputs")
            ok = False
            continue
        out = got[name]
        if not isinstance(out, np.ndarray):
            print(f"{name}: model output is {type(out).__name__}, not a tensor")
            ok = False
            continue
        problems = []
        if out.dtype != exp.dtype:
            problems.append(f"dtype {out.dtype} != expected {exp.dtype}")
        if out.shape != exp.shape:
            problems.append(f"shape {out.shape} != expected {exp.shape}")
        diff = max_abs_diff(out, exp)
        if not problems:
            if args.exact:
                same = (
                    np.array_equal(out, exp)
                    if out.dtype.kind == "O"
                    else np.ascontiguousarray(out).tobytes() == np.ascontiguousarray(exp).tobytes()
                )
                if not same:
                    problems.append("not bitwise identical")
            elif out.dtype.kind in "OUSb":
                if not np.array_equal(out, exp):
                    problems.append("values differ")
            else:
                try:
                    np.testing.assert_allclose(out, exp, rtol=args.tol, atol=args.atol)
                except AssertionError:
                    problems.append(f"exceeds rtol={args.tol:g} atol={args.atol:g}")
        status = "ok" if not problems else "MISMATCH: " + "; ".join(problems)
        print(f"{name}: max abs diff {diff:.6g} {status}")
        ok = ok and not problems
    return 0 if ok else 1


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np

    try:
        _, got = run_model(args.model, args.inputs)
    except Exception as exc:  # noqa: BLE001
        print(f"run: {exc_reason(exc)}", file=sys.stderr)
        return 1
    arrays = {}
    for name, value in got.items():
        if value is None:
            print(f"run: output {name} is an empty optional; not saved", file=sys.stderr)
        elif isinstance(value, list):
            # Sequence outputs: one entry per element, named NAME[i].
            for i, v in enumerate(value):
                arrays[f"{name}[{i}]"] = v
        else:
            arrays[name] = value
    for k, v in arrays.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "O":
            arrays[k] = v.astype(str)  # string tensors, saved without pickling
    np.savez(args.output, **arrays)
    return 0


def cmd_run_pipeline(args: argparse.Namespace) -> int:
    import numpy as np

    root = Path(args.package)
    spec = json.loads((root / "pipeline.json").read_text())
    feeds_all = load_npz(args.inputs)
    produced: dict[tuple[str, str], Any] = {}
    results: list[tuple[str, str, Any]] = []
    for stage in spec["stages"]:
        sess = make_session(str(root / stage["file"]))
        feeds = {}
        for inp in sess.get_inputs():
            bound = [b for b in spec["bindings"]
                     if b["to"]["stage"] == stage["name"] and b["to"]["port"] == inp.name]
            if bound:
                feeds[inp.name] = produced[(bound[0]["from"]["stage"], bound[0]["from"]["port"])]
            elif inp.name in feeds_all:
                feeds[inp.name] = to_ort_value(feeds_all[inp.name])
            else:
                print(f"run-pipeline: stage {stage['name']}: input {inp.name} not given",
                      file=sys.stderr)
                return 1
        names = [o.name for o in sess.get_outputs()]
        for name, value in zip(names, session_run(sess, names, feeds)):
            produced[(stage["name"], name)] = value
            results.append((stage["name"], name, value))
    counts: dict[str, int] = {}
    for _, name, _ in results:
        counts[name] = counts.get(name, 0) + 1
    arrays = {(f"{st}.{n}" if counts[n] > 1 else n): v for st, n, v in results}
    np.savez(args.output, **arrays)
    return 0


# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Run SUBCOMMAND --help for its arguments.",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")

    s = sub.add_parser("node-dump", help="write every ONNX node test model")
    s.add_argument("outdir")
    s.add_argument("--with-data", action="store_true",
                   help="also write each case's first data set as TensorProto files")
    s.set_defaults(func=cmd_node_dump)

    s = sub.add_parser("node-eval", help="evaluate converted node test models")
    s.add_argument("casedir")
    s.add_argument("--converted", required=True, help="folder of <case>/model.onnx")
    s.add_argument("-o", "--output", required=True, help="result JSON path")
    s.add_argument("--only", nargs="+", metavar="NAME", help="evaluate only these cases")
    s.add_argument("-j", "--jobs", type=int, default=1, help="worker processes (default 1)")
    s.add_argument("--timeout", type=float, default=DEFAULT_CASE_TIMEOUT,
                   help=f"seconds per case phase (default {DEFAULT_CASE_TIMEOUT:g})")
    s.set_defaults(func=cmd_node_eval)

    s = sub.add_parser("_node-worker")  # internal, used by node-eval
    s.add_argument("--converted", required=True)
    s.add_argument("--fd", type=int, required=True)
    s.set_defaults(func=cmd_node_worker)

    s = sub.add_parser("check", help="run the full ONNX checker")
    s.add_argument("model")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("run-compare", help="run a model and compare with expected outputs")
    s.add_argument("model")
    s.add_argument("inputs")
    s.add_argument("expected")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--exact", action="store_true", help="require bitwise-identical outputs")
    g.add_argument("--tol", type=float, default=DEFAULT_RTOL, metavar="RTOL",
                   help=f"relative tolerance (default {DEFAULT_RTOL:g})")
    s.add_argument("--atol", type=float, default=DEFAULT_ATOL,
                   help=f"absolute tolerance (default {DEFAULT_ATOL:g})")
    s.add_argument("--produced-only", action="store_true",
                   help="compare only the expected outputs the model produces (one model of a "
                        "multi-file pipeline); at least one must match by name")
    s.set_defaults(func=cmd_run_compare)

    s = sub.add_parser("run", help="run a model and save its outputs")
    s.add_argument("model")
    s.add_argument("inputs")
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("run-pipeline", help="run an mmq package's stages in order")
    s.add_argument("package")
    s.add_argument("inputs")
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=cmd_run_pipeline)

    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
