#!/usr/bin/env python3
"""Decoder packages side by side in onnxruntime-genai, and mmq.Pipeline with an INT8 KV cache.

    python tools/genai_bench.py --fp32 FP32_DIR --package NAME=DIR [--package NAME=DIR ...]
        [--pipeline NAME=DIR] [--prompt 128] [--new 128] [--threads 1,2] [--repeat 3]

Every DIR holds a genai_config.json (an onnxruntime-genai model builder output, or an
`mmq compile --package` output); `--pipeline` packages run with `mmq.Pipeline` instead (any
package, those without a genai_config.json too: an INT8 KV cache in blocks). Each measurement runs in a fresh process
(for its peak memory): a prompt of --prompt token ids (fixed seed), then exactly --new greedy
tokens (end-of-sequence suppressed). Reported per package and thread count: the median over
--repeat runs of decode tokens/s and prefill seconds, the peak RSS, and the cosine of the step-1
logits (the prompt's last position) against the FP32 package's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import numpy as np
kind, path, prompt_len, new, threads, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rng = np.random.default_rng(0)
prompt = [1] + rng.integers(3, vocab, prompt_len - 1).tolist()
if kind == "genai":
    import onnxruntime_genai as og
    model = og.Model(path)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=prompt_len + new, min_length=prompt_len + new, do_sample=False)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(prompt)
    logits = np.asarray(gen.get_output("logits")).reshape(-1, vocab)[-1]
    t1 = time.perf_counter()
    n = 0
    while not gen.is_done():
        gen.generate_next_token()
        n += 1
    t2 = time.perf_counter()
    kv = None
else:
    sys.path.insert(0, sys.argv[7])
    import importlib.util
    spec = importlib.util.spec_from_file_location("pipeline", sys.argv[7] + "/mmq/pipeline.py")
    pl = importlib.util.module_from_spec(spec); spec.loader.exec_module(pl)
    p = pl.Pipeline(path, intra_op_num_threads=threads)
    # Step-1 logits: one forward pass of the prompt with an empty cache.
    sess = p.sessions[p.spec["generation"]["stage"]]
    feeds = {"input_ids": np.array([prompt], np.int64),
             "attention_mask": np.ones((1, prompt_len), np.int64),
             "position_ids": np.arange(prompt_len, dtype=np.int64)[None]}
    for i in sess.get_inputs():
        if "past" in i.name:
            shape = [1 if k == 0 else (d if isinstance(d, int) else 0) for k, d in enumerate(i.shape)]
            feeds[i.name] = np.zeros(shape, np.int8 if i.type == "tensor(int8)" else np.float32)
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in sess.get_inputs()}}
    logits = sess.run(["logits"], feeds)[0].reshape(-1, vocab)[-1]
    p.spec["generation"]["eos_token_id"] = []
    t0 = time.perf_counter()
    tokens = []
    for i, t in enumerate(p.stream(prompt, max_new_tokens=new)):
        if i == 0:
            t1 = time.perf_counter()
        tokens.append(t)
    t2 = time.perf_counter()
    n = len(tokens) - 1
    kv = p.kv_bytes
print(json.dumps({"prefill_s": t1 - t0, "decode_tps": n / (t2 - t1), "tokens": n,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "logits": logits.astype(float).tolist(), "kv_pool_bytes": kv}))
"""


def with_threads(src: Path, threads: int, tmp: Path) -> Path:
    """A copy of the package whose genai_config.json runs the decoder on `threads` threads
    (the model files are linked, not copied)."""
    dst = tmp / f"{src.name}-t{threads}"
    if dst.exists():
        return dst
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "genai_config.json":
            (dst / f.name).symlink_to(f.resolve())
    config = json.loads((src / "genai_config.json").read_text())
    opts = config["model"]["decoder"].setdefault("session_options", {})
    opts["intra_op_num_threads"] = threads
    opts["inter_op_num_threads"] = 1
    (dst / "genai_config.json").write_text(json.dumps(config))
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fp32", required=True, help="the FP32 reference package (genai)")
    ap.add_argument("--package", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--pipeline", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--python-src", default=str(Path(__file__).resolve().parents[1] / "python"))
    args = ap.parse_args()
    vocab = json.loads((Path(args.fp32) / "genai_config.json").read_text())["model"]["vocab_size"]
    entries = [("fp32", "genai", Path(args.fp32))]
    entries += [(s.split("=", 1)[0], "genai", Path(s.split("=", 1)[1])) for s in args.package]
    entries += [(s.split("=", 1)[0], "pipeline", Path(s.split("=", 1)[1])) for s in args.pipeline]
    threads = [int(t) for t in args.threads.split(",")]
    results: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeat):  # interleaved, so drift hits every package alike
            for name, kind, path in entries:
                for t in threads:
                    run_path = with_threads(path, t, Path(tmp)) if kind == "genai" else path
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, kind, str(run_path), str(args.prompt),
                         str(args.new), str(t), str(vocab), args.python_src],
                        capture_output=True, text=True,
                    )
                    if out.returncode != 0:
                        print(f"{name} t={t}: {out.stderr[-2000:]}", file=sys.stderr)
                        return 1
                    results.setdefault((name, t), []).append(json.loads(out.stdout))
    import numpy as np

    ref = {t: np.array(results[("fp32", t)][0]["logits"]) for t in threads}
    print(f"prompt {args.prompt} + {args.new} new tokens, median of {args.repeat} runs")
    print("| package | threads | decode tokens/s | prefill s | peak RSS MiB | step-1 cosine vs FP32 | KV pool bytes |")
    print("|---|---|---|---|---|---|---|")
    for name, kind, _ in entries:
        for t in threads:
            rs = results[(name, t)]
            lg = np.array(rs[0]["logits"])
            cos = float(lg @ ref[t] / (np.linalg.norm(lg) * np.linalg.norm(ref[t])))
            kv = rs[0]["kv_pool_bytes"]
            print(f"| {name} ({kind}) | {t} | {statistics.median(r['decode_tps'] for r in rs):.1f} "
                  f"| {statistics.median(r['prefill_s'] for r in rs):.3f} "
                  f"| {max(r['peak_rss_mib'] for r in rs):.0f} | {cos:.5f} | {kv if kv else '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
