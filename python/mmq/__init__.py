"""mmq: quantize, fuse and compile multimodal ONNX models for ONNX Runtime.

>>> import mmq
>>> model = mmq.load("model.onnx")
>>> print(model.inspect())                       # the IR as text
>>> q = mmq.compile("model.onnx", quant="int8", calibration=samples())  # onnx.ModelProto
>>> outputs = mmq.run(q, {"pixel_values": x})     # dict of numpy arrays

Models go in as a path, serialized bytes or an ``onnx.ModelProto``; large models should be
given as paths (with ``output=``), so that their weights never pass through one protobuf in
memory. Every failure raises :class:`MmqError`, whose message is the rendered diagnostic.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np

from . import _mmq
from ._mmq import MmqError
from .pipeline import Pipeline

__all__ = ["MmqError", "Model", "Pipeline", "compile", "load", "run", "__version__"]
__version__: str = _mmq.__version__

# What `mmq compile` prints goes to this logger: the passes' notes at INFO, warnings (a rule
# whose scheme left nodes float, TensorRT refusals) at WARNING. With no logging configured,
# Python prints WARNING and above on stderr.
_log = logging.getLogger("mmq")

ModelLike = Union[str, os.PathLike, bytes, "onnx.ModelProto", "Model"]  # noqa: F821
Sample = Mapping[str, np.ndarray]


def _npy(array: Any, what: str) -> bytes:
    try:
        # np.require keeps a 0-d array 0-d (np.ascontiguousarray makes it shape [1]).
        a = np.require(np.asarray(array), requirements="C")
    except (ValueError, TypeError) as e:
        raise TypeError(f"{what}: expected an array, got {type(array).__name__} ({e})") from None
    if a.dtype.kind not in "biufU":
        raise TypeError(
            f"{what}: expected an array of numbers, booleans or strings, got dtype {a.dtype} "
            f"(from {type(array).__name__})"
        )
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _arrays(sample: Sample, what: str) -> list[tuple[str, bytes]]:
    if not isinstance(sample, Mapping):
        raise TypeError(f"{what}: expected a dict of input name to array, got {type(sample).__name__}")
    out = []
    for name, value in sample.items():
        if not isinstance(name, str):
            raise TypeError(f"{what}: input names are strings, got {type(name).__name__} {name!r}")
        out.append((name, _npy(value, f"{what}: input '{name}'")))
    return out


def _expect(name: str, value: Any, kind: type | tuple[type, ...], optional: bool = False) -> None:
    """Raises TypeError unless ``value`` is of ``kind`` (``None`` too when ``optional``); a bool
    is not taken for a number."""
    if value is None and optional:
        return
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        ok = False
    else:
        ok = isinstance(value, kinds)
    if not ok:
        names = " or ".join(k.__name__ for k in kinds) + (" or None" if optional else "")
        raise TypeError(f"{name}: expected {names}, got {type(value).__name__} {value!r}")


def _model_path(model: ModelLike, tmp: str) -> str:
    """A path to the model: paths as given; bytes and ModelProtos written into `tmp`."""
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    if isinstance(model, Model):
        return model.path
    path = os.path.join(tmp, "model.onnx")
    if isinstance(model, (bytes, bytearray, memoryview)):
        Path(path).write_bytes(bytes(model))
        return path
    if hasattr(model, "SerializeToString"):
        import onnx

        # Past 2 GiB a ModelProto cannot be serialized in one piece: weights go beside it.
        big = model.ByteSize() > (1 << 31) - (1 << 20)
        onnx.save_model(model, path, save_as_external_data=big, location="model.onnx.data")
        return path
    raise TypeError(
        f"model: expected a path, bytes or an onnx.ModelProto, got {type(model).__name__}"
    )


class _Progress:
    """A progress bar on stderr (tqdm when it is installed), fed by the native callbacks."""

    def __init__(self) -> None:
        self._bar: Any = None
        self._n = 0
        self._total: int | None = None
        self._what = ""

    def __call__(self, event: str, total: int | None) -> None:
        if event == "advance":
            self._n += 1
            if self._bar is not None:
                self._bar.update(1)
            else:
                of = f"/{self._total}" if self._total else ""
                sys.stderr.write(f"\r{self._what} {self._n}{of} samples")
                sys.stderr.flush()
        elif event == "finish":
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif self._n:
                sys.stderr.write("\n")
                sys.stderr.flush()
            self._n = 0
        else:
            self._what, self._total, self._n = event, total, 0
            try:
                from tqdm import tqdm  # type: ignore[import-not-found]

                self._bar = tqdm(total=total, desc=event, unit="sample", leave=False)
            except ImportError:
                self._bar = None


def compile(
    model: ModelLike,
    target: str = "ort",
    level: int = 2,
    quant: str | None = None,
    precision_map: str | os.PathLike | None = None,
    calibration: Iterable[Sample] | str | os.PathLike | int | None = None,
    observer: str | None = None,
    report: bool = False,
    *,
    output: str | os.PathLike | None = None,
    placement: Literal["cost", "all"] = "cost",
    smoothquant: float | None = None,
    awq: bool = False,
    block: int | None = None,
    asym: bool = False,
    int4_accuracy_level: int | None = None,
    modality: Mapping[str, str] | None = None,
    auto: float | None = None,
    progress: bool | None = None,
    symbols: Mapping[str, str | tuple[int, int, int]] | None = None,
    kv_cache: Literal["int8", "fp8", "int4"] | None = None,
    image_cache: Literal["int4"] | None = None,
    granularity: Literal["per-tensor", "per-token", "per-patch"] | None = None,
    skip_non_finite: bool = False,
    main_output: str | None = None,
    package: bool = False,
    generation_config: str | os.PathLike | None = None,
    tokenizer: str | os.PathLike | None = None,
) -> Any:
    """Optimizes and quantizes a model for a target; the same as ``mmq compile``.

    Args:
        model: a path, serialized bytes or an ``onnx.ModelProto``.
        target: ``"ort"`` (ONNX Runtime) or ``"trt"`` (TensorRT: writes a package directory,
            ``output`` is required, and the package's manifest is returned; see docs/trt.md).
        level: 0 (import and export only), 1 (canonicalize, const-fold, dce) or 2 (also the
            fusions).
        quant: ``"int8"``, ``"int8-dynamic"``, ``"int4"``, ``"fp8"``, ``"fp16"``, or ``"mixed"``
            with a ``precision_map``.
        precision_map: a precision map file (TOML), or its text.
        calibration: the samples: any iterable of ``{input name: array}`` (like ONNX Runtime's
            ``CalibrationDataReader``), a directory of ``.npz`` files, or a number of random
            samples. ``None``: 16 random samples.
        observer: ``minmax`` (``None``: the default), ``ema[:MOMENTUM]``, ``percentile[:P]``,
            ``entropy``, ``mse`` or ``auto`` (each of the four compared on the INT8 model, the
            best kept); schemes that calibrate only (``int8``, ``fp8``, ``mixed``, ``auto``).
        report: also return the compile report (passes, times, accuracy) as a dict.
        output: write the model here (large weights beside it) and return it without loading
            its external weights.
        placement: which INT8 units stay integer.
        smoothquant: SmoothQuant strength before INT8.
        awq: AWQ scales before INT4.
        block: INT4 block size (``None``: 32); INT4 plans only (``int4``, ``mixed``, ``auto``).
        asym: asymmetric INT4 blocks.
        int4_accuracy_level: ``MatMulNBits``' ``accuracy_level`` (4: int8 compute, 0: left
            out); ``None``: the target's choice (4 on ``"ort"``).
        modality: input name to ``vision``, ``text``, ``audio`` or ``shared``.
        auto: choose a scheme per node for this end-to-end cosine.
        progress: show calibration progress on stderr; by default only when stderr is a
            terminal (never into a log file).
        symbols: ``target="trt"``: optimization profiles, symbol name to ``"MIN:OPT:MAX"`` or
            ``(min, opt, max)``.
        kv_cache: quantize the KV cache at the graph interface: each ``past…`` input and its
            ``present…`` output become codes plus ``<name>_scale`` (see docs/caches.md).
        image_cache: ``"int4"``: vision feature outputs become INT4 codes plus
            ``<name>_scale``.
        granularity: run-time activation scales of ``quant="int8-dynamic"``: one per tensor,
            or one per row (``"per-token"``, ``"per-patch"``).
        skip_non_finite: a node whose weight holds NaN or an infinity stays in float, with a
            warning, instead of raising (``--skip-non-finite``).
        main_output: the output the accuracy figures and ``auto`` measure
            (``--main-output``); ``None``: the first floating-point output named like logits,
            an embedding or a pooled output, else the first floating-point output.
        package: write a deployment package into the directory ``output`` (required): the
            compiled models, ``pipeline.json`` and, where the decoder fits onnxruntime-genai's
            contract, ``genai_config.json`` (``--package``; ``mmq.Pipeline`` runs it).
        generation_config: with ``package``: a Hugging Face ``generation_config.json`` or
            ``config.json`` (bos/eos/pad ids, the context length).
        tokenizer: with ``package``: a ``tokenizer.json`` to copy in.

    Returns:
        the compiled ``onnx.ModelProto`` (``target="trt"``: the package manifest as a dict;
        ``package=True``: its ``pipeline.json`` as a dict), or ``(result, report)`` with
        ``report=True``.

    Raises:
        MmqError: the model or an option is wrong, or a pass failed.
    """
    import onnx

    for name, value, kind, optional in [
        ("target", target, str, False),
        ("level", level, int, False),
        ("quant", quant, str, True),
        ("observer", observer, str, True),
        ("report", report, bool, False),
        ("placement", placement, str, False),
        ("smoothquant", smoothquant, (int, float), True),
        ("awq", awq, bool, False),
        ("block", block, int, True),
        ("asym", asym, bool, False),
        ("int4_accuracy_level", int4_accuracy_level, int, True),
        ("modality", modality, Mapping, True),
        ("auto", auto, (int, float), True),
        ("progress", progress, bool, True),
        ("symbols", symbols, Mapping, True),
        ("kv_cache", kv_cache, str, True),
        ("image_cache", image_cache, str, True),
        ("granularity", granularity, str, True),
        ("skip_non_finite", skip_non_finite, bool, False),
        ("main_output", main_output, str, True),
        ("precision_map", precision_map, (str, os.PathLike), True),
        ("output", output, (str, os.PathLike), True),
        ("package", package, bool, False),
        ("generation_config", generation_config, (str, os.PathLike), True),
        ("tokenizer", tokenizer, (str, os.PathLike), True),
    ]:
        _expect(name, value, kind, optional)
    for k, v in (modality or {}).items():
        _expect(f"modality[{k!r}]", v, str)
    if target == "trt" and output is None:
        raise ValueError("target='trt' writes a package directory: pass output=DIR")
    if package and output is None:
        raise ValueError("package=True writes a package directory: pass output=DIR")
    profiles = {
        str(k): v if isinstance(v, str) else ":".join(str(int(x)) for x in v)
        for k, v in (symbols or {}).items()
    }
    options: dict[str, Any] = {
        "target": target,
        "level": int(level),
        "quant": quant,
        "precision_map": None,
        "precision_map_text": None,
        "calibration_dir": None,
        "calibration_random": None,
        "observer": observer,
        "placement": placement,
        "smoothquant": None if smoothquant is None else float(smoothquant),
        "awq": bool(awq),
        "block": None if block is None else int(block),
        "asym": bool(asym),
        "int4_accuracy_level": None if int4_accuracy_level is None else int(int4_accuracy_level),
        "modality": dict(modality or {}),
        "auto": None if auto is None else float(auto),
        "accuracy": "full" if report else "off",
        "symbols": profiles,
        "kv_cache": kv_cache,
        "image_cache": image_cache,
        "granularity": granularity,
        "skip_non_finite": skip_non_finite,
        "main_output": main_output,
        "package": package,
        "generation_config": None if generation_config is None else os.fspath(generation_config),
        "tokenizer": None if tokenizer is None else os.fspath(tokenizer),
    }
    if precision_map is not None:
        text = os.fspath(precision_map)
        key = "precision_map_text" if "\n" in text else "precision_map"
        options[key] = text
    samples = None
    if isinstance(calibration, bool):
        raise TypeError("calibration: expected samples, a directory or a count, got a bool")
    if isinstance(calibration, int):
        options["calibration_random"] = calibration
    elif isinstance(calibration, (str, os.PathLike)):
        options["calibration_dir"] = os.fspath(calibration)
    elif calibration is not None:
        try:
            it = iter(calibration)
        except TypeError:
            raise TypeError(
                "calibration: expected samples (an iterable of dicts), a directory or a count, "
                f"got {type(calibration).__name__}"
            ) from None
        # Read one sample at a time as calibration asks for it (an endless iterator is fine).
        samples = (_arrays(s, f"calibration sample {i}") for i, s in enumerate(it))
    with tempfile.TemporaryDirectory(prefix="mmq-") as tmp:
        src = _model_path(model, tmp)
        out = os.fspath(output) if output is not None else os.path.join(tmp, "out.onnx")
        if progress is None:
            progress = sys.stderr.isatty()
        report_json, warnings = _mmq.compile(
            [src], out, json.dumps(options), samples, _Progress() if progress else None
        )
        compile_report = json.loads(report_json)
        _log_compile(compile_report, warnings)
        if target == "trt" or package:
            name = "pipeline.json" if package else "manifest.json"
            with open(os.path.join(out, name), encoding="utf-8") as f:
                result = json.load(f)
        else:
            result = onnx.load_model(out, load_external_data=output is None)
    if report:
        return result, compile_report
    return result


def _log_compile(report: dict, warnings: str) -> None:
    """The passes' notes and the warnings of a compilation, to the ``mmq`` logger."""
    for p in report.get("passes", []):
        for note in p.get("notes", []):
            level = logging.WARNING if "warning:" in note else logging.INFO
            _log.log(level, "%s: %s", p.get("name", "?"), note)
    for line in warnings.splitlines():
        if line.strip():
            _log.warning("%s", line.removeprefix("warning: "))


class Model:
    """A loaded, verified model."""

    def __init__(self, native: Any, path: str, keep: Any = None) -> None:
        self._native = native
        self.path = path
        self._keep = keep

    @property
    def inputs(self) -> list[str]:
        """The input names of the first graph."""
        return list(self._native.inputs)

    @property
    def outputs(self) -> list[str]:
        """The output names of the first graph."""
        return list(self._native.outputs)

    def inspect(self, format: Literal["text", "json"] = "text") -> Any:
        """The IR as ``.mmir`` text, or (``format="json"``) a summary dict: symbols, graphs with
        inputs, outputs and op counts, constants, weight bytes."""
        text = self._native.inspect(format)
        return json.loads(text) if format == "json" else text

    def run(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Runs the model in the reference interpreter (see :func:`run`)."""
        return _run(self._native, inputs)


def load(model: ModelLike) -> Model:
    """Loads and verifies a model (a path to ONNX or ``.mmir``, bytes, or an ``onnx.ModelProto``)."""
    if isinstance(model, Model):
        return model
    keep = None
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
    else:
        keep = tempfile.TemporaryDirectory(prefix="mmq-")
        path = _model_path(model, keep.name)
    return Model(_mmq.load([path]), path, keep)


def _run(native: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    outs = _mmq.run(native, _arrays(inputs, "inputs"))
    result: dict[str, Any] = {}
    for name, arrays, is_sequence in outs:
        values = [np.load(io.BytesIO(b), allow_pickle=False) for b in arrays]
        result[name] = values if is_sequence else (values[0] if values else None)
    return result


def run(model: ModelLike, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Runs a model's first graph in mmq's reference interpreter.

    Args:
        model: a path, bytes, an ``onnx.ModelProto`` or a :class:`Model`.
        inputs: input name to array.

    Returns:
        output name to array (a list of arrays for a sequence, ``None`` for an empty optional).
    """
    return load(model).run(inputs)
