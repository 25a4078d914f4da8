#!/usr/bin/env python3
"""Tries the hostile-input classes again on a built `mmq` and the installed Python package, with
many variations each, and prints how many cases held per class (the counts in docs/testing.md).

    MMQ_BIN=target/debug/mmq .venv/bin/python tools/hostile_probe.py [--seed N]

A case holds when mmq refuses what it must refuse (exit 1 or 2, never 101 or a signal), answers
what ONNX Runtime answers, leaves its inputs and any special file unchanged, and prints no raw
control characters. Item 6 (`qparams verify` on tables edited in place) is tried by the
`qpqr_read` fuzzer, which recomputes each input's checksum. Special files are made in a temporary directory (`mkfifo`, and `mknod` as
root with the null device's numbers): never the system's own devices.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

REPO = Path(__file__).resolve().parent.parent
MMQ = str(Path(os.environ.get("MMQ_BIN", REPO / "target/debug/mmq")).resolve())
VIT = str(REPO / "tests/fixtures/vit/model.onnx")
DEC = str(REPO / "tests/fixtures/pipeline/decoder.onnx")

results: dict[str, list[int]] = {}
failures: list[str] = []
deviations: dict[str, list[str]] = {}


def record(cls: str, ok: bool, what: str) -> None:
    held = results.setdefault(cls, [0, 0])
    held[1] += 1
    if ok:
        held[0] += 1
    else:
        failures.append(f"{cls}: {what}")


def mmq(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([MMQ, *args], cwd=cwd, capture_output=True, timeout=timeout)


def refused(p: subprocess.CompletedProcess) -> bool:
    return p.returncode in (1, 2)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model(nodes, inputs, outputs, inits=(), opset=18) -> onnx.ModelProto:
    g = h.make_graph(nodes, "probe", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], producer_name="probe")
    m.ir_version = 10
    return m


def ort_loads(m: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return True
    except Exception:  # noqa: BLE001 - any refusal counts
        return False


def special_outputs(tmp: Path) -> None:
    """Item 1: an output path that names a FIFO or a character device."""
    (tmp / "in.npz").write_bytes((REPO / "tests/fixtures/vit/inputs.npz").read_bytes())
    (tmp / "report.json").write_text("{}")
    commands = [
        ["compile", VIT, "-o", "{}"],
        ["compile", VIT, "-o", "out.onnx", "--report", "{}"],
        ["compile", VIT, "--quant", "int8", "--calib-random", "2", "--no-accuracy", "-o",
         "out.onnx", "--qparams", "{}"],
        ["compile", VIT, "--auto", "0.9", "--calib-random", "2", "-o", "out.onnx", "--auto-map",
         "{}"],
        ["run", VIT, "--inputs", "in.npz", "-o", "{}"],
        ["convert", VIT, "-o", "{}"],
        ["opt", VIT, "--rules", "simplify", "-o", "{}"],
        ["report", "report.json", "-o", "{}"],
        ["plan-cache", DEC, "--budget", "1GiB", "-o", "{}"],
    ]
    kinds = ["fifo"] + (["chardev"] if os.geteuid() == 0 else [])
    for kind in kinds:
        node = tmp / f"special-{kind}"
        if kind == "fifo":
            os.mkfifo(node)
        else:
            os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        for args in commands:
            p = mmq([a.replace("{}", str(node)) for a in args], tmp)
            mode = os.lstat(node).st_mode
            still = stat.S_ISFIFO(mode) if kind == "fifo" else stat.S_ISCHR(mode)
            record("1 special files at outputs", p.returncode == 2 and still,
                   f"{kind} {args[0]} {args[-2]}: exit {p.returncode}")
        node.unlink()


def outputs_onto_inputs(tmp: Path) -> None:
    """Item 2: an output onto this run's own inputs or onto another output."""
    calib = tmp / "calib"
    calib.mkdir()
    (calib / "s.npz").write_bytes((REPO / "tests/fixtures/vit/inputs.npz").read_bytes())
    pmap = tmp / "map.toml"
    pmap.write_text('[default]\nscheme = "int8"\n')
    base = ["compile", VIT, "--quant", "mixed", "--precision-map", str(pmap), "--calib",
            str(calib), "--no-accuracy"]
    cases = [
        base + ["-o", "o.onnx", "--qparams", str(pmap)],
        base + ["-o", "o.onnx", "--qparams", str(calib / "s.npz")],
        base + ["-o", "o.onnx", "--qparams", "same.json", "--report", "same.json"],
        base + ["-o", "same.onnx", "--qparams", "same.onnx"],
        base + ["-o", str(pmap)],
        base + ["-o", str(calib / "s.npz")],
        ["compile", VIT, "-o", "r.json", "--report", "r.json"],
        ["run", VIT, "--inputs", str(calib / "s.npz"), "-o", str(calib / "s.npz")],
        ["convert", VIT, "-o", VIT],
        ["opt", VIT, "--rules", "simplify", "-o", VIT],
    ]
    watched = [pmap, calib / "s.npz", Path(VIT)]
    for args in cases:
        before = [digest(p) for p in watched]
        p = mmq(args, tmp)
        same = before == [digest(p) for p in watched]
        record("2 outputs onto inputs", refused(p) and same,
               f"{' '.join(args[-4:])}: exit {p.returncode}, inputs unchanged: {same}")


def interpreter_answers(tmp: Path, rng: np.random.Generator) -> None:
    """Item 3: Einsum with repeated output labels, Slice at INT64 extremes, If of two types,
    floats cast to strings: no panic, ONNX Runtime's answers."""
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 2])
    y = h.make_tensor_value_info("y", T.FLOAT, None)
    np.savez(tmp / "x22.npz", x=np.arange(4, dtype=np.float32).reshape(2, 2))
    for eq in ["ij->jj", "ij->iij", "ij,jk->ikk", "ij->jij", "ii->ii", "ij,ij->jjj"]:
        ins = ["x", "x"] if "," in eq else ["x"]
        f = tmp / "einsum.onnx"
        onnx.save(model([h.make_node("Einsum", ins, ["y"], equation=eq)], [x], [y], opset=12), f)
        p = mmq(["run", str(f), "--inputs", str(tmp / "x22.npz")], tmp)
        record("3 interpreter answers", refused(p), f"Einsum {eq}: exit {p.returncode}")
    # Slices at and near the INT64 extremes, 400 of them in one model.
    lo, hi = -(2**63), 2**63 - 1
    near = [lo, lo + 1, -(2**62), -7, -5, -1, 0, 1, 4, 5, 7, 2**62, hi - 1, hi]
    nodes, inits, outs, cases = [], [], [], []
    for k in range(400):
        start, end = (int(v) for v in rng.choice(near, 2))
        step = int(rng.choice([v for v in near if v != 0]))
        cases.append((start, end, step))
        for n, v in (("s", start), ("e", end), ("t", step)):
            inits.append(nh.from_array(np.array([v], np.int64), f"{n}{k}"))
        nodes.append(h.make_node("Slice", ["v", f"s{k}", f"e{k}", "axis", f"t{k}"], [f"y{k}"]))
        outs.append(h.make_tensor_value_info(f"y{k}", T.FLOAT, None))
    inits.append(nh.from_array(np.array([0], np.int64), "axis"))
    f = tmp / "slices.onnx"
    onnx.save(model(nodes, [h.make_tensor_value_info("v", T.FLOAT, [5])], outs, inits, 13), f)
    v = np.arange(5, dtype=np.float32)
    np.savez(tmp / "v5.npz", v=v)
    # The oracle is the specification's formula (Slice-13: negative indices count from the end,
    # then start clamps to [0, dim] or [0, dim - 1] and end to [0, dim] or [-1, dim - 1] for
    # positive or negative steps), in Python's unbounded integers. ONNX Runtime (end INT64_MAX
    # with a negative step) and the ONNX reference implementation (numpy's slicing: a start
    # before the first element with a negative step) each differ from it in some cases,
    # counted apart.
    from onnx.reference import ReferenceEvaluator

    def spec(start: int, end: int, step: int) -> np.ndarray:
        dim = len(v)
        start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        return v[list(range(start, end, step))]

    by_ref = ReferenceEvaluator(str(f)).run(None, {"v": v})
    by_ort = ort.InferenceSession(str(f)).run(None, {"v": v})
    p = mmq(["run", str(f), "--inputs", str(tmp / "v5.npz"), "-o", "slices.npz"], tmp)
    got = np.load(tmp / "slices.npz") if p.returncode == 0 else {}
    for k, case in enumerate(cases):
        want = spec(*case)
        ok = f"y{k}" in got and np.array_equal(got[f"y{k}"], want)
        record("3 interpreter answers", ok, f"Slice{case}")
        for who, answer in (("ONNX Runtime", by_ort[k]), ("the ONNX reference", by_ref[k])):
            if not np.array_equal(answer, want):
                deviations.setdefault(who, []).append(f"Slice{case}: {answer}, spec {want}")
    # If whose branches return different element types: refused by run and compile.
    then_g = h.make_graph([h.make_node("Neg", ["c"], ["a"])], "then", [],
                          [h.make_tensor_value_info("a", T.FLOAT, [1])])
    else_g = h.make_graph([h.make_node("Cast", ["c"], ["b"], to=T.INT64)], "else", [],
                          [h.make_tensor_value_info("b", T.INT64, [1])])
    f = tmp / "if.onnx"
    onnx.save(model([h.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)],
                    [h.make_tensor_value_info("c", T.FLOAT, [1]),
                     h.make_tensor_value_info("cond", T.BOOL, [])], [y]), f)
    np.savez(tmp / "if.npz", c=np.ones(1, np.float32), cond=np.array(True))
    p = mmq(["run", str(f), "--inputs", str(tmp / "if.npz")], tmp)
    record("3 interpreter answers", refused(p), f"If of two types: exit {p.returncode}")
    # 4,000 floats of every kind cast to strings, f32 and f64.
    n = 4000
    mant = rng.uniform(1, 10, n) * rng.choice([-1, 1], n)
    vals = mant * 10.0 ** rng.integers(-45, 39, n)
    vals[:12] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 1e-45, 0.1, 1e-4, 1e8, 99999999.5,
                 3.4028235e38]
    f = tmp / "cast.onnx"
    onnx.save(model([h.make_node("Cast", ["f"], ["s"], to=T.STRING),
                     h.make_node("Cast", ["d"], ["t"], to=T.STRING)],
                    [h.make_tensor_value_info("f", T.FLOAT, [n]),
                     h.make_tensor_value_info("d", T.DOUBLE, [n])],
                    [h.make_tensor_value_info("s", T.STRING, [n]),
                     h.make_tensor_value_info("t", T.STRING, [n])], opset=21), f)
    with np.errstate(over="ignore"):
        feeds = {"f": vals.astype(np.float32), "d": vals.astype(np.float64)}
    np.savez(tmp / "cast.npz", **feeds)
    want = ort.InferenceSession(str(f)).run(None, feeds)
    p = mmq(["run", str(f), "--inputs", str(tmp / "cast.npz"), "-o", "cast_out.npz"], tmp)
    got = np.load(tmp / "cast_out.npz") if p.returncode == 0 else {}
    for name, w in zip(["s", "t"], want):
        g = got[name] if name in got else np.array([""] * n)
        for i in range(n):
            record("3 interpreter answers", str(g[i]) == str(w[i]),
                   f"Cast {name}[{i}] {vals[i]!r}: {g[i]!r} vs {w[i]!r}")


def invalid_graphs(tmp: Path) -> None:
    """Item 4: graphs ONNX Runtime will not load compile to an error naming the node."""
    fx = h.make_tensor_value_info("x", T.FLOAT, [2, 2])
    y = h.make_tensor_value_info("y", T.FLOAT, None)
    cases = {
        "add float and string": model(
            [h.make_node("Add", ["x", "s"], ["y"], name="bad")],
            [fx, h.make_tensor_value_info("s", T.STRING, [2, 2])], [y]),
        "reshape two -1": model(
            [h.make_node("Reshape", ["x", "shape"], ["y"], name="bad")], [fx], [y],
            [nh.from_array(np.array([-1, -1], np.int64), "shape")]),
    }
    for eq in ["ij->jj", "ij,jk", "ij->k", "ijk->i", "i j->", "ij,jk,kl->il", "...ijk->i",
               "i->i"]:
        ins = ["x"] * (eq.split("->")[0].count(",") + 1)
        cases[f"einsum {eq}"] = model([h.make_node("Einsum", ins, ["y"], name="bad",
                                                   equation=eq)], [fx], [y], opset=12)
    for what, m in cases.items():
        if ort_loads(m):
            continue  # ONNX Runtime takes it: not an invalid graph
        f = tmp / "invalid.onnx"
        onnx.save(m, f)
        p = mmq(["compile", str(f), "-o", "out.onnx"], tmp)
        record("4 invalid graphs", refused(p) and b"bad" in p.stderr,
               f"{what}: exit {p.returncode}")


def archives(tmp: Path, rng: np.random.Generator) -> None:
    """Item 5: wrong CRC-32s, one array under two names, inflate bombs."""
    f = tmp / "relu.onnx"
    onnx.save(model([h.make_node("Relu", ["x"], ["y"])],
                    [h.make_tensor_value_info("x", T.FLOAT, [64])],
                    [h.make_tensor_value_info("y", T.FLOAT, None)]), f)

    def npy(a):
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    data = npy(rng.standard_normal(64).astype(np.float32))
    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", method) as z:
            z.writestr("x.npy", data)
        good = buf.getvalue()
        info = zipfile.ZipFile(io.BytesIO(good)).getinfo("x.npy")
        first = info.header_offset + 30 + len(info.filename)
        for _ in range(50):
            bad = bytearray(good)
            at = int(rng.integers(first, first + info.compress_size))
            bad[at] ^= 1 << int(rng.integers(0, 8))
            (tmp / "bad.npz").write_bytes(bytes(bad))
            p = mmq(["run", str(f), "--inputs", str(tmp / "bad.npz")], tmp)
            record("5 archives", refused(p), f"flipped byte {at}: exit {p.returncode}")
    for names in (["x.npy", "x"], ["x", "x.npy"], ["x.npy", "x.npy"]):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for n in names:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    z.writestr(n, data)
        (tmp / "dup.npz").write_bytes(buf.getvalue())
        p = mmq(["run", str(f), "--inputs", str(tmp / "dup.npz")], tmp)
        twice = b"second time" in p.stderr or b"appears twice" in p.stderr
        record("5 archives", refused(p) and twice, f"names {names}")
    for rows in (1 << 16, 1 << 20, 1 << 22):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("x.npy", npy(np.zeros((rows, 64), np.float32)))
        (tmp / "bomb.npz").write_bytes(buf.getvalue())
        start = time.perf_counter()
        p = mmq(["run", str(f), "--inputs", str(tmp / "bomb.npz")], tmp)
        took = time.perf_counter() - start
        record("5 archives", refused(p) and b"rank 2 instead of 1" in p.stderr and took < 5,
               f"bomb of {rows * 256} bytes: exit {p.returncode} in {took:.1f} s")


def escapes(tmp: Path) -> None:
    """Item 7: control characters in node, input and output names never reach the terminal."""
    for c in [*range(1, 32), 127]:
        if chr(c) == "\n":
            continue
        name = f"n{chr(c)}x"
        m = model([h.make_node("Relu", [name], ["y"], name=name)],
                  [h.make_tensor_value_info(name, T.FLOAT, [2])],
                  [h.make_tensor_value_info("y", T.FLOAT, None)])
        f = tmp / "esc.onnx"
        onnx.save(m, f)
        np.savez(tmp / "esc.npz", **{name: np.ones(2, np.float32)})
        for args in (["verify", str(f)], ["run", str(f), "--inputs", str(tmp / "esc.npz")],
                     ["compile", str(f), "-o", "esc_out.onnx"], ["inspect", str(f)],
                     ["run", str(f)]):
            p = mmq(args, tmp)
            out = p.stdout + p.stderr
            raw = any(b == c for b in out) if c not in (9,) else False
            record("7 terminal escapes", not raw and p.returncode in (0, 1, 2),
                   f"0x{c:02x} in {args[0]}: exit {p.returncode}")


def big_precision_map(tmp: Path) -> None:
    """Item 8: a precision map of 50,000 rules compiles in about a second."""
    rules = "".join(f'[[rule]]\nname = "r{i}"\nnodes = ["node_{i}_*"]\nscheme = "int8"\n\n'
                    for i in range(50000))
    (tmp / "big.toml").write_text('[default]\nscheme = "int8"\n\n' + rules)
    start = time.perf_counter()
    p = mmq(["compile", VIT, "--quant", "mixed", "--precision-map", "big.toml", "--calib-random",
             "2", "--no-accuracy", "-o", "big.onnx", "-q"], tmp, timeout=300)
    took = time.perf_counter() - start
    record("8 precision map of 50,000 rules", p.returncode == 0 and took < 10,
           f"exit {p.returncode} in {took:.1f} s: {p.stderr[-300:]!r}")


def python_api(tmp: Path) -> None:
    """Item 9: scalars, wrong-dtype endless samples, TypeErrors (Ctrl-C is in the tests)."""
    import mmq as py

    g = model([h.make_node("Mul", ["s", "v"], ["y"])],
              [h.make_tensor_value_info("s", T.FLOAT, []),
               h.make_tensor_value_info("v", T.FLOAT, [3])],
              [h.make_tensor_value_info("y", T.FLOAT, [3])])
    for s in (np.float32(2), np.array(2, np.float32)):
        got = py.run(g, {"s": s, "v": np.ones(3, np.float32)})["y"]
        record("9 Python", np.array_equal(got, [2, 2, 2]), f"scalar {type(s).__name__}")
    got = None
    try:
        py.run(g, {"s": np.ones(1, np.float32), "v": np.ones(3, np.float32)})
    except py.MmqError:
        got = "refused"
    record("9 Python", got == "refused", "a [1] array for a scalar input")
    pulled = []

    def endless():
        while True:
            pulled.append(1)
            yield {"pixel_values": np.zeros((2, 3, 32, 32), np.float64)}

    try:
        py.compile(VIT, quant="int8", calibration=endless())
        ok = False
    except py.MmqError as e:
        ok = "dtype f64" in str(e) and len(pulled) == 1
    record("9 Python", ok, "endless wrong-dtype samples")
    for kwargs in ({"level": "2"}, {"block": 3.5}, {"awq": 1}, {"smoothquant": "x"},
                   {"modality": {"pixel_values": 3}}, {"quant": 8}, {"calibration": object()},
                   {"quant": "int8", "calibration": [{"pixel_values": {"a": 1}}]},
                   {"quant": "int8", "calibration": [{"pixel_values": [[1.0], [2.0, 3.0]]}]},
                   {"quant": "int8", "calibration": [[1, 2]]}):
        try:
            py.compile(VIT, output=tmp / "py.onnx", **kwargs)
            kind = "none"
        except TypeError:
            kind = "TypeError"
        except Exception as e:  # noqa: BLE001
            kind = type(e).__name__
        record("9 Python", kind == "TypeError", f"{kwargs}: {kind}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="mmq-probe-") as d:
        tmp = Path(d)
        for step in (special_outputs, outputs_onto_inputs, invalid_graphs, escapes,
                     big_precision_map, python_api):
            step(tmp)
        for step in (interpreter_answers, archives):
            step(tmp, rng)
    print("| class | cases | held |")
    print("|---|---|---|")
    for cls, (held, total) in sorted(results.items()):
        print(f"| {cls} | {total} | {held} |")
    for who, cases in deviations.items():
        print(f"{who} differs from the specification in {len(cases)} cases, e.g. {cases[0]}")
    for f in failures[:50]:
        print("FAILED", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
