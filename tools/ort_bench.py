#!/usr/bin/env python3
"""Times ONNX Runtime on one model: median seconds per run for each thread count.

    ort_bench.py MODEL.onnx INPUTS.npz --threads 1,2 --runs N [--cold]

Prints one JSON object: {"1": median_seconds, "2": median_seconds}. Only the inputs the model
declares are fed; default graph optimizations are on, as users run it. With --cold each timed
run creates the session (loading and optimizing the model) and runs it once.
"""

import argparse
import json
import statistics
import time

import numpy as np
import onnxruntime as ort


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("inputs")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--cold", action="store_true")
    a = p.parse_args()
    data = np.load(a.inputs)
    out = {}
    for n in [int(t) for t in a.threads.split(",")]:
        so = ort.SessionOptions()
        so.intra_op_num_threads = n
        so.inter_op_num_threads = 1
        so.log_severity_level = 3
        def session():
            return ort.InferenceSession(a.model, so, providers=["CPUExecutionProvider"])

        s = session()
        feeds = {i.name: data[i.name] for i in s.get_inputs() if i.name in data}
        s.run(None, feeds)
        times = []
        for _ in range(a.runs):
            t = time.perf_counter()
            if a.cold:
                s = session()
            s.run(None, feeds)
            times.append(time.perf_counter() - t)
        out[str(n)] = statistics.median(times)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
