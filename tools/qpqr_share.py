#!/usr/bin/env python3
"""N processes serving one model share one QPQR table: RSS and PSS per process.

Builds a model of 4 MatMuls with 2048x2048 random weights (onnx + numpy), compiles it with
`mmq compile --quant int4 --qparams`, then starts N processes that hold the table
(`compiler/examples/qparams_map.rs`: mapped read-only and shared, or with --copy read into
private memory) and reads /proc/PID/smaps_rollup and the table's mapping in /proc/PID/smaps.

    tools/qpqr_share.py [--processes 8] [--mmq target/release/mmq] [--holder PATH]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(path: str, layers: int, dim: int) -> None:
    rng = np.random.default_rng(0)
    nodes, inits = [], []
    x = "x"
    for i in range(layers):
        w = f"w{i}"
        inits.append(numpy_helper.from_array((rng.standard_normal((dim, dim)) * 0.02).astype(np.float32), w))
        nodes.append(helper.make_node("MatMul", [x, w], [f"y{i}"]))
        x = f"y{i}"
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", dim])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", dim])],
        inits,
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), path)


def kib(field: str, text: str) -> int:
    for line in text.splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def mapping(pid: int, table: str) -> tuple[int, int]:
    """(Rss, Pss) in KiB of the table's mapping in process `pid`."""
    rss = pss = 0
    inside = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3] if len(head) > 3 else False:
                inside = line.rstrip().endswith(table)
            elif inside and line.startswith("Rss:"):
                rss += int(head[1])
            elif inside and line.startswith("Pss:"):
                pss += int(head[1])
    return rss, pss


def run(holder: str, table: str, n: int, copy: bool) -> list[tuple[int, int, int, int, int]]:
    procs = []
    for _ in range(n):
        p = subprocess.Popen([holder, table] + (["--copy"] if copy else []),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline().split()
        assert line and line[0] == "ready", line
        procs.append(p)
    rows = []
    for p in procs:
        with open(f"/proc/{p.pid}/smaps_rollup") as f:
            roll = f.read()
        mrss, mpss = mapping(p.pid, table)
        rows.append((p.pid, kib("Rss", roll), kib("Pss", roll), mrss, mpss))
    for p in procs:
        p.stdin.close()
        p.wait()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--mmq", default="target/release/mmq")
    ap.add_argument("--holder", default="target/release/examples/qparams_map")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=2048)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="qpqr-share-") as tmp:
        src, out, table = (os.path.join(tmp, n) for n in ("m.onnx", "m.int4.onnx", "m.qpqr"))
        model(src, a.layers, a.dim)
        subprocess.run([a.mmq, "compile", src, "--target", "ort", "--quant", "int4",
                        "--no-accuracy", "-o", out, "--qparams", table], check=True)
        size = os.path.getsize(table)
        print(f"table: {size} bytes ({size / 1024:.0f} KiB), {a.processes} processes\n")
        for copy in (False, True):
            rows = run(a.holder, table, a.processes, copy)
            how = "read into private memory (--copy)" if copy else "mapped shared (QParamTable::open)"
            print(f"{how}:\n")
            print("| process | RSS KiB | PSS KiB | table mapping RSS KiB | table mapping PSS KiB |")
            print("|---|---|---|---|---|")
            for i, (_, rss, pss, mrss, mpss) in enumerate(rows):
                print(f"| {i} | {rss} | {pss} | {mrss} | {mpss} |")
            print(f"| sum | {sum(r[1] for r in rows)} | {sum(r[2] for r in rows)} | "
                  f"{sum(r[3] for r in rows)} | {sum(r[4] for r in rows)} |\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
