"""Running an mmq deployment package on ONNX Runtime.

>>> import mmq
>>> p = mmq.Pipeline("pkg")                     # mmq compile ... --package -o pkg
>>> p.generate([1, 17, 33], max_new_tokens=16)   # greedy token ids
>>> for token in p.stream([1, 17, 33], pixel_values=image):
...     print(token)
>>> p.last_stats                                # tokens/s, first-token latency, cache hits

A package is a directory written by ``mmq compile MODEL... --package -o DIR``: the compiled
models and ``pipeline.json`` (stages, bindings, cache layouts, generation settings, hashes).
:class:`Pipeline` runs it as one pipeline:

- the vision encoder runs once per distinct image: its features (INT4 codes and scales with
  ``--image-cache int4``) are kept by the image's content (SHA-256 of its bytes, shape and
  dtype), so a second request with the same image does not run the encoder;
- a decoder with a KV cache reads the image features with the prompt (which holds the
  placeholder tokens the model expects for them) and none (token dim 0) at later steps;
- the decoder's KV cache (float, or INT8 codes with ``--kv-cache int8``) lives in one
  128-byte-aligned pool (``Pipeline.kv_pool``) laid out when the pipeline is opened, each cache
  tensor sized for the context length. Where the package says the past shares the present's
  buffer (``kv_cache.shared_buffer``: the decoder's ``GroupQueryAttention`` appends the new
  tokens in place), each cache tensor has one slot, bound once as both past and present. Else
  it has two: ONNX Runtime's I/O binding writes a step's ``present`` outputs into one slot and
  the next step reads them as ``past`` from there. Either way no cache tensor is copied between
  steps. Element types numpy cannot address (FP8, INT4 caches) stay in ONNX Runtime's own
  buffers, handed from step to step as ``OrtValue`` (still no copy).

Needs ``onnxruntime`` >= 1.17 (tested with 1.32, CPUExecutionProvider); batch 1.
The reference interpreter (``mmq generate DIR``) defines the results this must agree with.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Pipeline"]

_ALIGN = 128
# ONNX Runtime type strings numpy can address directly.
_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}


def _ort():
    import onnxruntime as ort

    return ort


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _image_key(images: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(images):
        a = _contiguous(images[name])
        h.update(name.encode())
        h.update(str(a.dtype).encode())
        h.update(str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


class _Slot:
    """One cache tensor's two regions of the pool (ping-pong) and its shape rule."""

    def __init__(self, past: str, present: str, dtype: Any, shape: list, axis: int, tokens_of,
                 offsets: list[int]):
        self.past, self.present, self.dtype = past, present, dtype
        self.shape = shape  # the input's dims; ints, or None for the batch and token dims
        self.axis = axis  # the dim that grows with the tokens
        self.tokens_of = tokens_of  # tokens -> that dim's size
        self.offsets = offsets  # the regions' byte offsets in the pool (one when shared)

    def shape_at(self, tokens: int) -> list[int]:
        """The tensor's shape holding ``tokens`` tokens (batch 1)."""
        shape = list(self.shape)
        shape[0] = 1
        shape[self.axis] = self.tokens_of(tokens)
        return shape


class Pipeline:
    """A deployment package on ONNX Runtime; see the module documentation."""

    def __init__(
        self,
        path: str | Path,
        *,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        intra_op_num_threads: int | None = None,
        image_cache_size: int = 16,
        verify: bool = True,
    ) -> None:
        ort = _ort()
        self.dir = Path(path)
        spec_path = self.dir / "pipeline.json"
        if not spec_path.is_file():
            raise FileNotFoundError(
                f"{self.dir}: not a package (no pipeline.json; `mmq compile MODEL... --package "
                f"-o DIR` writes one)"
            )
        self.spec = json.loads(spec_path.read_text())
        if self.spec.get("format") != "mmq-pipeline" or self.spec.get("version") != 1:
            raise ValueError(f"{spec_path}: not an mmq-pipeline version 1 description")
        if verify:
            for stage in self.spec["stages"]:
                names = [f["file"] for f in stage["files"]]
                if stage["file"] not in names or any(
                    Path(n).is_absolute() or Path(n).name != n for n in names
                ):
                    raise ValueError(
                        f"{spec_path}: stage {stage['name']} loads {stage['file']} or lists "
                        f"files that are not plain names among its hashed files"
                    )
                for f in stage["files"]:
                    got = _sha256(self.dir / f["file"])
                    if got != f["sha256"]:
                        raise ValueError(
                            f"{self.dir / f['file']}: SHA-256 {got}, pipeline.json says "
                            f"{f['sha256']}: the file changed after the package was written"
                        )
        opts = ort.SessionOptions()
        if intra_op_num_threads is not None:
            opts.intra_op_num_threads = intra_op_num_threads
        self.sessions = {
            s["name"]: ort.InferenceSession(
                str(self.dir / s["file"]), sess_options=opts, providers=list(providers)
            )
            for s in self.spec["stages"]
        }
        # (stage, input) -> (stage, output) that feeds it.
        self._sources = {
            (b["to"]["stage"], b["to"]["port"]): (b["from"]["stage"], b["from"]["port"])
            for b in self.spec["bindings"]
        }
        self._images: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._image_cache_size = image_cache_size
        self.last_stats: dict[str, Any] = {}
        self.kv_pool = np.zeros(0, np.uint8)
        self._slots: list[_Slot] = []
        self._kv_other: list[tuple[str, str]] = []  # (past, present) kept as OrtValues
        self._shared = False  # one region per cache tensor, bound as past and present
        self._layout_kv()

    # ------------------------------------------------------------------ layout

    def _layout_kv(self) -> None:
        kv = self.spec.get("kv_cache")
        gen = self.spec.get("generation")
        if not kv or not gen:
            return
        sess = self.sessions[kv["stage"]]
        inputs = {i.name: i for i in sess.get_inputs()}
        context = int(gen["context_length"])
        scales = kv.get("scales") or {}
        pairs = []
        for p in kv["pairs"]:
            pairs.append((p["past"], p["present"], False))
            if p.get("past_scale"):
                pairs.append((p["past_scale"], p["present_scale"], True))
        found = []  # (slot arguments but the offsets, bytes)
        for past, present, is_scale in pairs:
            info = inputs[past]
            dtype = _NUMPY.get(info.type)
            if dtype is None:
                self._kv_other.append((past, present))
                continue
            dims = [d if isinstance(d, int) else None for d in info.shape]
            if is_scale and scales.get("kind") == "blocks":
                per = int(scales["tokens"])
                axis = len(dims) - 1

                def tokens_of(t, per=per):
                    return -(-t // per)
            else:
                axis = 2 if len(dims) == 4 else len(dims) - 2

                def tokens_of(t):
                    return t
            shape = list(dims)
            shape[0] = 1
            shape[axis] = tokens_of(context)
            if any(d is None for d in shape):
                self._kv_other.append((past, present))
                continue
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            found.append(((past, present, dtype, dims, axis, tokens_of), nbytes))
        # One region per cache tensor, bound as both past and present, where the package says the
        # past shares the present's buffer and every cache is in the pool; else two.
        self._shared = bool(kv.get("shared_buffer")) and not self._kv_other
        offset = 0
        for args, nbytes in found:
            offs = []
            for _ in range(1 if self._shared else 2):
                offs.append(offset)
                offset += -(-nbytes // _ALIGN) * _ALIGN
            self._slots.append(_Slot(*args, offs))
        # One pool, its start aligned too.
        raw = np.zeros(offset + _ALIGN, np.uint8)
        start = (-raw.ctypes.data) % _ALIGN
        self.kv_pool = raw[start : start + offset]
        self._pool_owner = raw

    @property
    def kv_bytes(self) -> int:
        """Bytes the pool reserves for the KV cache (both slots of every tensor)."""
        return int(self.kv_pool.nbytes)

    # ------------------------------------------------------------------ running

    def _stage_feeds(self, stage: dict, feeds: Mapping[str, Any], produced: dict) -> dict:
        out = {}
        for inp in self.sessions[stage["name"]].get_inputs():
            source = self._sources.get((stage["name"], inp.name))
            if source:
                out[inp.name] = produced[source]
            elif inp.name in feeds:
                out[inp.name] = feeds[inp.name]
            else:
                raise KeyError(
                    f"stage {stage['name']}: input {inp.name} ({inp.type} {inp.shape}) is not "
                    f"given (given: {', '.join(sorted(feeds)) or 'nothing'})"
                )
        return out

    def _run_stage(self, stage: dict, feeds: dict) -> dict[str, Any]:
        """Runs one stage on numpy arrays or OrtValues; returns its outputs as OrtValues."""
        ort = _ort()
        sess = self.sessions[stage["name"]]
        values = {
            k: v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(
                _contiguous(v)
            )
            for k, v in feeds.items()
        }
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run_with_ort_values(names, values)))

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One forward pass of the whole pipeline; every stage's outputs by name
        (``STAGE.NAME`` where two stages have an output of one name)."""
        produced: dict[tuple[str, str], Any] = {}
        results = []
        for stage in self.spec["stages"]:
            out = self._run_stage(stage, self._stage_feeds(stage, feeds, produced))
            for name, v in out.items():
                produced[(stage["name"], name)] = v
                results.append((stage["name"], name, v))
        counts: dict[str, int] = {}
        for _, n, _ in results:
            counts[n] = counts.get(n, 0) + 1
        return {
            (f"{s}.{n}" if counts[n] > 1 else n): _numpy(v) for s, n, v in results
        }

    def _vision(self, images: Mapping[str, np.ndarray], until: str) -> dict:
        """The outputs of the stages before the decoder, from the image cache when these
        images were seen before."""
        if not images:
            return {}
        key = _image_key(images)
        hit = key in self._images
        if hit:
            self._images.move_to_end(key)
            produced = self._images[key]
        else:
            produced = {}
            for stage in self.spec["stages"]:
                if stage["name"] == until:
                    break
                out = self._run_stage(stage, self._stage_feeds(stage, images, produced))
                for name, v in out.items():
                    produced[(stage["name"], name)] = v
            self._images[key] = produced
            while len(self._images) > self._image_cache_size:
                self._images.popitem(last=False)
        self.last_stats["image_cache_hit"] = hit
        return produced

    def stream(
        self,
        input_ids: Sequence[int] | np.ndarray,
        pixel_values: np.ndarray | None = None,
        max_new_tokens: int = 16,
        *,
        images: Mapping[str, np.ndarray] | None = None,
    ) -> Iterator[int]:
        """Greedy generation, one token at a time; see :meth:`generate`."""
        ort = _ort()
        gen = self.spec.get("generation")
        if not gen:
            raise ValueError(f"{self.dir}: the package has no decoder stage")
        prompt = [int(t) for t in np.asarray(input_ids).ravel()]
        if not prompt:
            raise ValueError("input_ids holds no token")
        if len(prompt) >= int(gen["context_length"]):
            raise ValueError(
                f"the prompt of {len(prompt)} tokens leaves no room in the context length of "
                f"{gen['context_length']}"
            )
        images = dict(images or {})
        if pixel_values is not None:
            images["pixel_values"] = pixel_values
        self.last_stats = {"image_cache_hit": None}
        start = time.perf_counter()
        stage = next(s for s in self.spec["stages"] if s["name"] == gen["stage"])
        produced = self._vision(images, gen["stage"])
        vision_s = time.perf_counter() - start
        sess = self.sessions[stage["name"]]
        kv = self.spec.get("kv_cache")
        if kv and kv["stage"] != stage["name"]:
            kv = None
        out_names = [o.name for o in sess.get_outputs()]
        inputs = sess.get_inputs()
        other_cache: dict[str, Any] = {}
        if kv:
            infos = {i.name: i for i in inputs}
            for past, _ in self._kv_other:
                other_cache[past] = _empty(infos[past])
        past_slots = {s.past: s for s in self._slots}
        present_slots = {s.present: s for s in self._slots}
        fixed_names = {gen["input_ids"], gen.get("attention_mask"), gen.get("position_ids")}
        # The other inputs, decided once: (the prompt step's value, a later step's value).
        features: dict[str, tuple[Any, Any]] = {}
        for inp in inputs:
            name = inp.name
            if name in past_slots or name in other_cache or name in fixed_names:
                continue
            source = self._sources.get((stage["name"], name))
            if source:
                value = produced[source]
                features[name] = (value, _no_tokens(value) if kv else value)
            elif name in images:
                features[name] = (images[name], images[name])
            else:
                raise KeyError(
                    f"stage {stage['name']}: input {name} ({inp.type} {inp.shape}) is not given"
                )
        eos = set(gen.get("eos_token_id") or [])
        context = int(gen["context_length"])
        tokens = list(prompt)
        done = 0
        new = 0
        first_at = None
        which = 0
        io = sess.io_binding()
        # What each input and output binds to, decided once: a cache slot of the pool (its
        # address per half is fixed, only the token count changes), the other cache values,
        # the token inputs, the features.
        base = self.kv_pool.ctypes.data if self._slots else 0
        slot_inputs = [(i.name, past_slots[i.name]) for i in inputs if i.name in past_slots]
        other_inputs = [i.name for i in inputs if i.name in other_cache]
        value_inputs = [
            i.name for i in inputs if i.name not in past_slots and i.name not in other_cache
        ]
        # In the outputs' order: `get_outputs` returns them in the order they were bound.
        outputs = [(n, present_slots.get(n)) for n in out_names]
        logits_at = out_names.index(gen["logits"])
        shared = kv is not None and self._shared
        if shared:
            # Each cache's one buffer, of the context length, is bound once as its past and
            # its present; a step rebinds the token inputs alone (a rebound name keeps its
            # place, so the outputs keep their order).
            for name, slot in slot_inputs:
                io.bind_input(name, "cpu", 0, slot.dtype, slot.shape_at(context),
                              base + slot.offsets[0])
            for name, slot in outputs:
                if slot is None:
                    io.bind_output(name, "cpu")
                else:
                    io.bind_output(name, "cpu", 0, slot.dtype, slot.shape_at(context),
                                   base + slot.offsets[0])
        while new < max_new_tokens and len(tokens) < context:
            step = tokens[done:] if kv else tokens
            past = done if kv else 0
            fixed = _fixed(gen, step, past)
            if not shared:
                io.clear_binding_inputs()
                io.clear_binding_outputs()
                for name, slot in slot_inputs:
                    io.bind_input(name, "cpu", 0, slot.dtype, slot.shape_at(past),
                                  base + slot.offsets[which])
                for name in other_inputs:
                    io.bind_ortvalue_input(name, other_cache[name])
            for name in value_inputs:
                value = fixed[name] if name in fixed else features[name][1 if past else 0]
                if isinstance(value, ort.OrtValue):
                    io.bind_ortvalue_input(name, value)
                else:
                    io.bind_cpu_input(name, _contiguous(value))
            total = past + len(step)
            for name, slot in outputs:
                if slot is None:  # ONNX Runtime allocates it (its shape changes)
                    io.bind_output(name, "cpu")
                elif not shared:
                    io.bind_output(name, "cpu", 0, slot.dtype, slot.shape_at(total),
                                   base + slot.offsets[1 - which])
            sess.run_with_iobinding(io)
            outs = io.get_outputs()
            logits = outs[logits_at].numpy()
            if self._kv_other:
                by_name = dict(zip(out_names, outs))
                for past_name, present_name in self._kv_other:
                    other_cache[past_name] = by_name[present_name]
            which = 1 - which
            token = int(logits.reshape(-1, logits.shape[-1])[-1].argmax())
            if kv:
                done = len(tokens)
            tokens.append(token)
            new += 1
            if first_at is None:
                first_at = time.perf_counter()
            yield token
            if token in eos:
                break
        end = time.perf_counter()
        self.last_stats.update(
            tokens=new,
            prompt_tokens=len(prompt),
            vision_seconds=vision_s,
            first_token_seconds=(first_at - start) if first_at else None,
            tokens_per_second=((new - 1) / (end - first_at)) if first_at and new > 1 else None,
            kv_pool_bytes=self.kv_bytes,
        )

    def generate(
        self,
        input_ids: Sequence[int] | np.ndarray,
        pixel_values: np.ndarray | None = None,
        max_new_tokens: int = 16,
        *,
        images: Mapping[str, np.ndarray] | None = None,
    ) -> list[int]:
        """Greedy generation: the vision encoder on the images (``pixel_values``, or every
        image input by name in ``images``; skipped when the same images were seen before),
        then the decoder on the prompt and each new token until ``max_new_tokens``, an
        end-of-sequence token or the context length. Returns the new token ids; timings in
        :attr:`last_stats`."""
        return list(self.stream(input_ids, pixel_values, max_new_tokens, images=images))


def _contiguous(a: Any) -> np.ndarray:
    """``a`` as a C-contiguous array, a 0-d array staying 0-d (``np.ascontiguousarray`` would
    make it shape [1])."""
    return np.require(np.asarray(a), requirements="C")


def _fixed(gen: dict, step: Sequence[int], past: int) -> dict[str, np.ndarray]:
    """The decoder's token, mask and position inputs for a step of ``step`` new tokens after
    ``past`` cached ones."""
    out = {gen["input_ids"]: np.asarray([step], np.int64)}
    if gen.get("attention_mask"):
        out[gen["attention_mask"]] = np.ones((1, past + len(step)), np.int64)
    if gen.get("position_ids"):
        out[gen["position_ids"]] = np.arange(past, past + len(step), dtype=np.int64)[None]
    return out


def _no_tokens(v: Any) -> Any:
    """``v`` with no token (dim 1 of size 0): the image features of a step after the prompt."""
    ort = _ort()
    shape = list(v.shape())
    if len(shape) >= 2:
        shape[1] = 0
    onnx_type = {"tensor(int4)": 22, "tensor(float8e4m3fn)": 17}.get(v.data_type())
    if onnx_type is not None:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(shape, np.int8), onnx_type)
    return ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, v.numpy().dtype))


def _empty(info) -> Any:
    """A zero-token ``OrtValue`` for a cache input numpy cannot address (FP8, INT4)."""
    ort = _ort()
    onnx_types = {"tensor(float8e4m3fn)": (17, np.uint8), "tensor(int4)": (22, np.int8)}
    shape = [1 if k == 0 else (d if isinstance(d, int) else 0) for k, d in enumerate(info.shape)]
    onnx_type, np_type = onnx_types[info.type]
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(np.zeros(shape, np_type), onnx_type)


def _numpy(v: Any) -> np.ndarray:
    """An output as numpy: INT4 codes unpacked to int8 values, FP8 codes as their uint8 bits."""
    import ctypes

    kind = v.data_type()
    if kind not in ("tensor(int4)", "tensor(float8e4m3fn)"):
        return v.numpy()
    shape = v.shape()
    n = int(np.prod(shape))
    nbytes = (n + 1) // 2 if kind == "tensor(int4)" else n
    raw = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(v.data_ptr()), np.uint8).copy()
    if kind == "tensor(float8e4m3fn)":
        return raw.reshape(shape)
    codes = np.empty(2 * nbytes, np.int8)
    codes[0::2] = (raw & 0x0F).astype(np.int8)
    codes[1::2] = (raw >> 4).astype(np.int8)
    codes = np.where(codes > 7, codes - 16, codes).astype(np.int8)
    return codes[:n].reshape(shape)
