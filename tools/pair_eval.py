#!/usr/bin/env python3
"""Runs pairs of ONNX models (an original and its conversion) in ONNX Runtime on the same inputs
and reports whether their outputs are bitwise identical.

    pair_eval.py PAIRS.tsv -o RESULT.json

PAIRS.tsv has one line per pair: ORIGINAL<TAB>CONVERTED. Inputs come from the original's
`test_data_set_0/input_*.pb` when that folder exists beside it, else are drawn (fixed seed) from
the declared input types, with symbolic dims set to 2. Both models run with graph optimizations
disabled on one thread, so equal graphs give equal bits. Per pair the result records
`original` ("ok" or why ONNX Runtime cannot run it), `converted` ("identical" or why not) and
`checker` (onnx.checker with full_check on the conversion, "ok" or the error; "original fails
too" when the original fails the same check).
"""

import argparse
import glob
import json
import os
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort


def short(exc):
    return " ".join(str(exc).split())[:200]


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


RANDOM = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
}


def inputs_for(original, sess):
    data = os.path.join(os.path.dirname(original), "test_data_set_0")
    names = [i.name for i in sess.get_inputs()]
    if os.path.isdir(data):
        feeds = {}
        for k, path in enumerate(sorted(glob.glob(os.path.join(data, "input_*.pb")))):
            t = onnx.TensorProto()
            with open(path, "rb") as f:
                t.ParseFromString(f.read())
            name = t.name or (names[k] if k < len(names) else None)
            if name in names:
                feeds[name] = onnx.numpy_helper.to_array(t)
        if len(feeds) == len(names):
            return feeds
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        if i.type not in RANDOM:
            raise RuntimeError(f"no sample data for input {i.name} of type {i.type}")
        shape = [d if isinstance(d, int) else 2 for d in i.shape]
        feeds[i.name] = rng.standard_normal(shape).astype(RANDOM[i.type])
    return feeds


def same(a, b):
    if isinstance(a, list) or isinstance(b, list):
        return isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and all(
            same(x, y) for x, y in zip(a, b))
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind in "OUS":
        return bool(np.array_equal(a, b))
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def check(path):
    try:
        onnx.checker.check_model(path, full_check=True)
        return "ok"
    except Exception as exc:  # noqa: BLE001
        return short(exc)


def evaluate(original, converted):
    r = {}
    try:
        s1 = session(original)
        feeds = inputs_for(original, s1)
        expected = s1.run(None, feeds)
        r["original"] = "ok"
    except Exception as exc:  # noqa: BLE001
        r["original"] = "fail: " + short(exc)
    if not os.path.exists(converted):
        r["converted"] = "missing"
        return r
    c = check(converted)
    if c != "ok" and check(original) != "ok":
        c = "original fails too"
    r["checker"] = c
    if r["original"] != "ok":
        return r
    try:
        s2 = session(converted)
        names = [o.name for o in s1.get_outputs()]
        got = s2.run(names, feeds)
        r["converted"] = "identical" if all(same(x, y) for x, y in zip(expected, got)) else "outputs differ"
    except Exception as exc:  # noqa: BLE001
        r["converted"] = "fail: " + short(exc)
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pairs")
    p.add_argument("-o", "--output", required=True)
    a = p.parse_args()
    results = {}
    with open(a.pairs) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            original, converted = line.split("\t")
            results[original] = evaluate(original, converted)
    with open(a.output, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    n = sum(1 for r in results.values() if r.get("converted") == "identical")
    print(f"{n} of {len(results)} conversions give identical outputs")


if __name__ == "__main__":
    sys.exit(main())
