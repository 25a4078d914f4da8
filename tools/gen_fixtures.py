#!/usr/bin/env python3
"""Generate the ONNX test fixtures under tests/fixtures/.

Every fixture is a small model with a real architecture (built from a
``transformers`` config class or plain ``torch.nn`` modules) and randomly
initialised weights drawn from fixed seeds, exported to ONNX, together with:

* ``inputs.npz``  -- one array per ONNX graph input, keyed by the exact input name;
* ``outputs.npz`` -- one array per ONNX graph output, keyed by the exact output
  name, computed by ONNX Runtime (CPUExecutionProvider) on the exported model
  fed with ``inputs.npz``.

Nothing is downloaded: configurations are written out here and weights are
random.  Run through ``tools/gen_fixtures.sh`` so that the pinned versions in
``tools/requirements-fixtures.txt`` are used.

Usage::

    tools/gen_fixtures.sh                     # regenerate every fixture
    tools/gen_fixtures.sh --only clip         # regenerate one fixture
    tools/gen_fixtures.sh --big-llama DIR     # large LLaMA with external data
"""

from __future__ import annotations

import argparse
import collections
import inspect
import logging
import os
import shutil
import sys
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.export import Dim  # noqa: E402

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    CLIPConfig,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    DynamicCache,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    MistralConfig,
    MistralForCausalLM,
    ViTConfig,
    ViTModel,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES_DIR = REPO_ROOT / "tests" / "fixtures"

# Opset used with the TorchScript exporter (dynamo=False).  The dynamo
# exporter keeps its own default opset.
TORCHSCRIPT_OPSET = 17

# Attention is exported with the plain "eager" implementation so that the
# graphs contain MatMul/Softmax attention rather than fused kernels.
ATTN_IMPL = "eager"


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def seed_everything(seed: int) -> np.random.Generator:
    torch.manual_seed(seed)
    np.random.seed(seed)
    return np.random.default_rng(seed)


def set_attn_impl(config) -> None:
    """Select the eager attention implementation on a config and its sub-configs."""
    try:
        config._attn_implementation = ATTN_IMPL
    except Exception:  # pragma: no cover - depends on transformers version
        pass
    for key in ("text_config", "vision_config"):
        sub = getattr(config, key, None)
        if sub is not None:
            set_attn_impl(sub)


def to_tuple(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


def export_model(
    model: nn.Module,
    args: tuple,
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic_shapes=None,
    dynamic_axes=None,
    prefer_dynamo: bool = True,
    external_data: bool = False,
    torchscript_kwargs: dict | None = None,
) -> str:
    """Export ``model`` to ``path``; returns a description of the exporter used.

    The dynamo exporter is tried first (when ``prefer_dynamo``), with
    ``dynamic_shapes`` built from named ``torch.export.Dim`` objects.  If it
    fails, the TorchScript exporter is used with ``dynamic_axes``.
    """
    model.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    if prefer_dynamo:
        try:
            with torch.no_grad():
                program = torch.onnx.export(
                    model,
                    args,
                    dynamo=True,
                    dynamic_shapes=dynamic_shapes,
                    input_names=input_names,
                    output_names=output_names,
                    external_data=external_data,
                    optimize=True,
                    verbose=False,
                )
            proto = program.model_proto
            strip_stack_traces(proto)
            save_proto(proto, path, external_data)
            return f"dynamo (opset {opset_of(proto)})"
        except Exception as exc:  # fall back below
            errors.append(exc)
            print(f"  dynamo export failed ({type(exc).__name__}: {str(exc)[:300]}); "
                  "falling back to TorchScript exporter", file=sys.stderr)
            if os.environ.get("GEN_FIXTURES_DEBUG"):
                traceback.print_exc()
    if dynamic_axes is None:
        raise RuntimeError(f"no dynamic_axes for TorchScript fallback: {errors}")
    kwargs = dict(
        opset_version=TORCHSCRIPT_OPSET,
        input_names=input_names,
        output_names=output_names,
        dynamic_axes=dynamic_axes,
        dynamo=False,
    )
    kwargs.update(torchscript_kwargs or {})
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(model, args, str(tmp), **kwargs)
    proto = onnx.load(str(tmp), load_external_data=True)
    tmp.unlink()
    for p in tmp.parent.glob(tmp.name + "*"):
        p.unlink()
    save_proto(proto, path, external_data)
    return f"torchscript (opset {opset_of(proto)})"


def strip_stack_traces(proto: onnx.ModelProto) -> None:
    """Drop the per-node Python stack traces the dynamo exporter records.

    They hold absolute paths and line numbers of the generating machine, so
    keeping them would make the fixtures differ between checkouts.  All other
    metadata is kept as exported.
    """
    key = "pkg.torch.onnx.stack_trace"

    def strip_graph(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            strip_nodes_props(node)

    def strip_nodes_props(node: onnx.NodeProto) -> None:
        kept = [p for p in node.metadata_props if p.key != key]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
        for attr in node.attribute:
            if attr.HasField("g"):
                strip_graph(attr.g)
            for g in attr.graphs:
                strip_graph(g)

    strip_graph(proto.graph)
    for func in proto.functions:
        for node in func.node:
            strip_nodes_props(node)


def save_proto(proto: onnx.ModelProto, path: Path, external_data: bool) -> None:
    if external_data:
        location = path.name + ".data"
        data_path = path.parent / location
        if data_path.exists():
            data_path.unlink()
        onnx.save_model(
            proto,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=location,
            size_threshold=1024,
        )
    else:
        onnx.save_model(proto, str(path))


def opset_of(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return -1


def check_onnx(path: Path) -> onnx.ModelProto:
    """Run the full ONNX checker and strict shape inference (checking only)."""
    onnx.checker.check_model(str(path), full_check=True)
    proto = onnx.load(str(path), load_external_data=False)
    onnx.shape_inference.infer_shapes_path(str(path), str(path) + ".inferred.tmp",
                                           check_type=True, strict_mode=True)
    os.unlink(str(path) + ".inferred.tmp")
    return proto


def run_ort(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    graph_inputs = [i.name for i in sess.get_inputs()]
    missing = set(graph_inputs) - set(feeds)
    extra = set(feeds) - set(graph_inputs)
    if missing or extra:
        raise RuntimeError(f"{path.name}: input mismatch, missing={missing} extra={extra}")
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(names, {k: feeds[k] for k in graph_inputs})
    return dict(zip(names, values))


def compare(name: str, ort_out: dict[str, np.ndarray], torch_out: tuple, output_names) -> None:
    for key, ref in zip(output_names, torch_out):
        got = ort_out[key]
        ref = ref.detach().cpu().numpy()
        if got.shape != ref.shape:
            raise RuntimeError(f"{name}: output {key} shape {got.shape} != torch {ref.shape}")
        diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64)))) if got.size else 0.0
        if diff > 1e-3:
            raise RuntimeError(f"{name}: output {key} differs from torch by {diff}")


def shape_str(vi: onnx.ValueInfoProto) -> str:
    t = vi.type.tensor_type
    elem = onnx.TensorProto.DataType.Name(t.elem_type).lower()
    if not t.HasField("shape"):
        return f"{elem}[?]"
    dims = []
    for d in t.shape.dim:
        if d.HasField("dim_param"):
            dims.append(repr(d.dim_param))
        elif d.HasField("dim_value"):
            dims.append(str(d.dim_value))
        else:
            dims.append("?")
    return f"{elem}[{', '.join(dims)}]"


def summarize(path: Path, proto: onnx.ModelProto, exporter: str) -> None:
    ops = collections.Counter(
        (n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
        for n in proto.graph.node
    )
    size = path.stat().st_size
    data = path.parent / (path.name + ".data")
    extra = f" + {data.stat().st_size / 2**20:.1f} MiB external data" if data.exists() else ""
    print(f"  {path.relative_to(path.parent.parent)}: {size / 2**10:.1f} KiB{extra}, "
          f"{exporter}, {len(proto.graph.node)} nodes")
    print("    ops: " + ", ".join(f"{k}={v}" for k, v in ops.most_common()))
    for kind, values in (("in ", proto.graph.input), ("out", proto.graph.output)):
        for i, vi in enumerate(values):
            if i == 8 and len(values) > 10:
                print(f"    {kind} ... {len(values) - 8} more")
                break
            print(f"    {kind} {vi.name}: {shape_str(vi)}")
    params = sorted({d.dim_param for vi in list(proto.graph.value_info) + list(proto.graph.output)
                     + list(proto.graph.input)
                     for d in vi.type.tensor_type.shape.dim if d.HasField("dim_param")})
    print("    dim_params: " + ", ".join(repr(p) for p in params))


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # np.savez_compressed stores keys verbatim (dots and slashes included).
    np.savez_compressed(str(path), **arrays)


def export_and_verify(
    name: str,
    model: nn.Module,
    args: tuple,
    path: Path,
    input_names: list[str],
    output_names: list[str],
    alt_args: list[tuple] = (),
    **export_kwargs,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Export, check and run one model; returns (inputs, outputs) keyed by graph names.

    ``args`` are positional tensors in the order of ``input_names``.  The ONNX
    Runtime outputs are compared against PyTorch, also for every tuple in
    ``alt_args`` (other input shapes, to exercise the dynamic dimensions).
    """
    model.eval()
    with torch.no_grad():
        ref = to_tuple(model(*args))
    exporter = export_model(model, args, path, input_names, output_names, **export_kwargs)
    proto = check_onnx(path)
    feeds = {n: a.detach().numpy() for n, a in zip(input_names, args)}
    outs = run_ort(path, feeds)
    if list(outs) != output_names:
        raise RuntimeError(f"{name}: graph outputs {list(outs)} != {output_names}")
    compare(name, outs, ref, output_names)
    for alt in alt_args:
        with torch.no_grad():
            alt_ref = to_tuple(model(*alt))
        alt_outs = run_ort(path, {n: a.detach().numpy() for n, a in zip(input_names, alt)})
        compare(name + " (alternative shapes)", alt_outs, alt_ref, output_names)
    summarize(path, proto, exporter)
    return feeds, outs


def fresh_dir(out_root: Path, name: str) -> Path:
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


# --------------------------------------------------------------------------
# KV-cache wrappers
# --------------------------------------------------------------------------


def build_cache(config, flat_past: tuple, full: bool = False) -> DynamicCache:
    """Build a DynamicCache from (key0, value0, key1, value1, ...); with `full`, of plain
    full-length layers (a sliding-window model keeps every key and masks the window)."""
    cache = DynamicCache() if full else DynamicCache(config=config)
    for layer in range(len(flat_past) // 2):
        cache.update(flat_past[2 * layer], flat_past[2 * layer + 1], layer)
    return cache


def flatten_cache(cache) -> tuple:
    flat = []
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            flat += [layer.keys, layer.values]
    else:  # older cache layout
        for k, v in zip(cache.key_cache, cache.value_cache):
            flat += [k, v]
    return tuple(flat)


class CausalLMWithPast(nn.Module):
    """Flat-tensor wrapper: (input_ids, attention_mask, [position_ids], k0, v0, ...)
    -> (logits, present k0, present v0, ...)."""

    def __init__(self, model: nn.Module, with_position_ids: bool, full_cache: bool = False):
        super().__init__()
        self.model = model
        self.with_position_ids = with_position_ids
        self.full_cache = full_cache
        # Recent transformers releases renamed `past_key_values` to `cache`.
        params = inspect.signature(model.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def forward(self, input_ids, attention_mask, *rest):
        if self.with_position_ids:
            position_ids, past = rest[0], rest[1:]
        else:
            position_ids, past = None, rest
        cache = build_cache(self.model.config, past, self.full_cache)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            return_dict=True,
            **{self.cache_kwarg: cache},
        )
        present = getattr(out, "cache", None)
        if present is None:
            present = out.past_key_values
        return (out.logits,) + flatten_cache(present)


def kv_names(n_layers: int) -> tuple[list[str], list[str]]:
    past, present = [], []
    for i in range(n_layers):
        past += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        present += [f"present.{i}.key", f"present.{i}.value"]
    return past, present


def kv_args(
    rng: np.random.Generator,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    vocab: int,
    with_position_ids: bool,
    batch: int,
    seq: int,
    past_seq: int,
    pad_first: bool,
) -> tuple:
    """Random (input_ids, attention_mask, [position_ids], past k/v...) for a decode step."""
    total = past_seq + seq
    input_ids = torch.from_numpy(rng.integers(0, vocab, size=(batch, seq), dtype=np.int64))
    attention_mask = torch.ones(batch, total, dtype=torch.int64)
    if pad_first and batch > 1:
        # left padding on the last row: its first cached position is masked out
        attention_mask[-1, 0] = 0
    args = [input_ids, attention_mask]
    if with_position_ids:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past_seq:].contiguous()
        args.append(position_ids)
    for _ in range(2 * n_layers):
        args.append(torch.from_numpy(
            rng.standard_normal((batch, n_kv_heads, past_seq, head_dim)).astype(np.float32)))
    return tuple(args)


def kv_interface(n_layers: int, with_position_ids: bool) -> tuple[list, list, tuple, dict]:
    """Input and output names, dynamo dynamic_shapes and TorchScript dynamic_axes of a
    CausalLMWithPast decode step."""
    past_names, present_names = kv_names(n_layers)
    input_names = ["input_ids", "attention_mask"] + (["position_ids"] if with_position_ids else [])
    input_names += past_names
    output_names = ["logits"] + present_names
    b = Dim("batch", min=1, max=64)
    s = Dim("seq", min=1, max=1024)
    p = Dim("past_seq", min=1, max=1024)
    t = Dim("total_seq", min=2, max=2048)
    rest = ([{0: b, 1: s}] if with_position_ids else []) + [{0: b, 2: p}] * (2 * n_layers)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total_seq"},
            "logits": {0: "batch", 1: "seq"}}
    if with_position_ids:
        axes["position_ids"] = {0: "batch", 1: "seq"}
    axes.update({n: {0: "batch", 2: "past_seq"} for n in past_names})
    axes.update({n: {0: "batch", 2: "total_seq"} for n in present_names})
    # forward(input_ids, attention_mask, *rest)
    return input_names, output_names, ({0: b, 1: s}, {0: b, 1: t}, tuple(rest)), axes


def export_causal_lm_with_past(
    name: str,
    out_dir: Path,
    model: nn.Module,
    n_layers: int,
    n_kv_heads: int,
    head_dim: int,
    vocab: int,
    with_position_ids: bool,
    rng: np.random.Generator,
    external_data: bool = False,
    check_alt_shapes: bool = True,
    prefer_dynamo: bool = True,
    full_cache: bool = False,
) -> None:
    wrapper = CausalLMWithPast(model, with_position_ids, full_cache).eval()
    shape = dict(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, vocab=vocab,
                 with_position_ids=with_position_ids)
    args = kv_args(rng, batch=2, seq=3, past_seq=5, pad_first=True, **shape)
    alt = [kv_args(rng, batch=1, seq=1, past_seq=9, pad_first=False, **shape),
           kv_args(rng, batch=3, seq=4, past_seq=2, pad_first=True, **shape)]
    input_names, output_names, dynamic_shapes, axes = kv_interface(n_layers, with_position_ids)

    feeds, outs = export_and_verify(
        name, wrapper, args, out_dir / "model.onnx", input_names, output_names,
        alt_args=alt if check_alt_shapes else [],
        dynamic_shapes=dynamic_shapes,
        dynamic_axes=axes,
        external_data=external_data,
        prefer_dynamo=prefer_dynamo,
    )
    save_npz(out_dir / "inputs.npz", feeds)
    save_npz(out_dir / "outputs.npz", outs)


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------


def randn(rng: np.random.Generator, *shape: int) -> torch.Tensor:
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def randint(rng: np.random.Generator, high: int, *shape: int, low: int = 0) -> torch.Tensor:
    return torch.from_numpy(rng.integers(low, high, size=shape, dtype=np.int64))


def tiny_vit_config() -> ViTConfig:
    cfg = ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        image_size=32,
        patch_size=8,
        num_channels=3,
    )
    set_attn_impl(cfg)
    return cfg


class ViTWrapper(nn.Module):
    def __init__(self, model: ViTModel, interpolate: bool):
        super().__init__()
        self.model = model
        self.interpolate = interpolate

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values, interpolate_pos_encoding=self.interpolate,
                         return_dict=True)
        return out.last_hidden_state, out.pooler_output


def gen_vit(out_root: Path) -> None:
    name = "vit"
    rng = seed_everything(1)
    out_dir = fresh_dir(out_root, name)
    model = ViTWrapper(ViTModel(tiny_vit_config()), interpolate=False)
    feeds, outs = export_and_verify(
        name, model, (randn(rng, 2, 3, 32, 32),), out_dir / "model.onnx",
        ["pixel_values"], ["last_hidden_state", "pooler_output"],
        alt_args=[(randn(rng, 1, 3, 32, 32),), (randn(rng, 5, 3, 32, 32),)],
        dynamic_shapes=({0: Dim("batch", min=1, max=64)},),
        dynamic_axes={"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"},
                      "pooler_output": {0: "batch"}},
    )
    save_npz(out_dir / "inputs.npz", feeds)
    save_npz(out_dir / "outputs.npz", outs)


def gen_vit_dynamic(out_root: Path) -> None:
    name = "vit_dynamic"
    rng = seed_everything(2)
    out_dir = fresh_dir(out_root, name)
    model = ViTWrapper(ViTModel(tiny_vit_config()), interpolate=True)
    # 48x40 pixels = 6x5 patches of 8x8 (the position table is for 4x4 patches,
    # so the position embeddings are resized bicubically inside the graph).
    feeds, outs = export_and_verify(
        name, model, (randn(rng, 2, 3, 48, 40),), out_dir / "model.onnx",
        ["pixel_values"], ["last_hidden_state", "pooler_output"],
        alt_args=[(randn(rng, 1, 3, 32, 64),), (randn(rng, 3, 3, 24, 24),),
                  (randn(rng, 1, 3, 37, 29),)],
        dynamic_shapes=({0: Dim("batch", min=1, max=64),
                         2: Dim("height", min=16, max=512),
                         3: Dim("width", min=16, max=512)},),
        dynamic_axes={"pixel_values": {0: "batch", 2: "height", 3: "width"},
                      "last_hidden_state": {0: "batch", 1: "seq"},
                      "pooler_output": {0: "batch"}},
    )
    save_npz(out_dir / "inputs.npz", feeds)
    save_npz(out_dir / "outputs.npz", outs)


class CLIPWrapper(nn.Module):
    def __init__(self, model: CLIPModel):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, pixel_values):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         pixel_values=pixel_values, return_dict=True)
        return out.logits_per_image, out.text_embeds, out.image_embeds


CLIP_BOS, CLIP_EOS = 254, 255


def tiny_clip_vision_config() -> CLIPVisionConfig:
    cfg = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        num_channels=3,
        projection_dim=32,
    )
    set_attn_impl(cfg)
    return cfg


def clip_text(rng: np.random.Generator, lengths: list[int], seq: int) -> tuple:
    ids = rng.integers(1, 250, size=(len(lengths), seq), dtype=np.int64)
    mask = np.ones((len(lengths), seq), dtype=np.int64)
    for row, n in enumerate(lengths):
        ids[row, 0] = CLIP_BOS
        ids[row, n - 1] = CLIP_EOS
        ids[row, n:] = 0
        mask[row, n:] = 0
    return torch.from_numpy(ids), torch.from_numpy(mask)


def gen_clip(out_root: Path) -> None:
    name = "clip"
    rng = seed_everything(3)
    out_dir = fresh_dir(out_root, name)
    text_cfg = dict(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=32,
        projection_dim=32,
        bos_token_id=CLIP_BOS,
        eos_token_id=CLIP_EOS,
        pad_token_id=0,
    )
    cfg = CLIPConfig(text_config=text_cfg, vision_config=tiny_clip_vision_config().to_dict(),
                     projection_dim=32)
    set_attn_impl(cfg)
    model = CLIPWrapper(CLIPModel(cfg))
    # three captions (lengths 8, 6, 4; right-padded) against two images
    args = (*clip_text(rng, [8, 6, 4], 8), randn(rng, 2, 3, 32, 32))
    alt = [(*clip_text(rng, [5], 5), randn(rng, 4, 3, 32, 32)),
           (*clip_text(rng, [12, 3], 12), randn(rng, 1, 3, 32, 32))]
    tb = Dim("text_batch", min=1, max=64)
    s = Dim("seq", min=2, max=32)
    ib = Dim("image_batch", min=1, max=64)
    feeds, outs = export_and_verify(
        name, model, args, out_dir / "model.onnx",
        ["input_ids", "attention_mask", "pixel_values"],
        ["logits_per_image", "text_embeds", "image_embeds"],
        alt_args=alt,
        dynamic_shapes=({0: tb, 1: s}, {0: tb, 1: s}, {0: ib}),
        dynamic_axes={"input_ids": {0: "text_batch", 1: "seq"},
                      "attention_mask": {0: "text_batch", 1: "seq"},
                      "pixel_values": {0: "image_batch"},
                      "logits_per_image": {0: "image_batch", 1: "text_batch"},
                      "text_embeds": {0: "text_batch"},
                      "image_embeds": {0: "image_batch"}},
    )
    save_npz(out_dir / "inputs.npz", feeds)
    save_npz(out_dir / "outputs.npz", outs)


def gen_gpt2_kv(out_root: Path) -> None:
    name = "gpt2_kv"
    rng = seed_everything(4)
    out_dir = fresh_dir(out_root, name)
    cfg = GPT2Config(vocab_size=256, n_positions=128, n_embd=32, n_layer=2, n_head=4,
                     n_inner=128, bos_token_id=0, eos_token_id=0)
    set_attn_impl(cfg)
    model = GPT2LMHeadModel(cfg)
    export_causal_lm_with_past(name, out_dir, model, n_layers=2, n_kv_heads=4, head_dim=8,
                               vocab=256, with_position_ids=False, rng=rng)


def tiny_llama_config(**kw) -> LlamaConfig:
    base = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    base.update(kw)
    cfg = LlamaConfig(**base)
    set_attn_impl(cfg)
    return cfg


def gen_llama_gqa_kv(out_root: Path) -> None:
    name = "llama_gqa_kv"
    rng = seed_everything(5)
    out_dir = fresh_dir(out_root, name)
    model = LlamaForCausalLM(tiny_llama_config())
    export_causal_lm_with_past(name, out_dir, model, n_layers=2, n_kv_heads=2, head_dim=16,
                               vocab=256, with_position_ids=True, rng=rng)


def gen_mistral_sw_kv(out_root: Path) -> None:
    """Mistral with a sliding window of 4 keys, shorter than the fixtures' sequences: the
    export's mask holds the window, and the cache at the interface keeps every key."""
    name = "mistral_sw_kv"
    rng = seed_everything(7)
    out_dir = fresh_dir(out_root, name)
    cfg = MistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
        sliding_window=4, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
        eos_token_id=2, pad_token_id=0,
    )
    set_attn_impl(cfg)
    model = MistralForCausalLM(cfg)
    export_causal_lm_with_past(name, out_dir, model, n_layers=2, n_kv_heads=2, head_dim=16,
                               vocab=256, with_position_ids=True, rng=rng, full_cache=True)


class VisionProjector(nn.Module):
    """CLIP vision tower -> penultimate hidden layer without CLS -> MLP projector."""

    def __init__(self, vision_cfg: CLIPVisionConfig, text_hidden: int):
        super().__init__()
        self.vision_tower = CLIPVisionModel(vision_cfg)
        self.projector = nn.Sequential(
            nn.Linear(vision_cfg.hidden_size, text_hidden),
            nn.GELU(),
            nn.Linear(text_hidden, text_hidden),
        )

    def forward(self, pixel_values):
        out = self.vision_tower(pixel_values=pixel_values, output_hidden_states=True, return_dict=True)
        features = out.hidden_states[-2][:, 1:]
        return self.projector(features)


class TinyLlava(nn.Module):
    def __init__(self, vision_cfg: CLIPVisionConfig, text_cfg: LlamaConfig):
        super().__init__()
        self.vision = VisionProjector(vision_cfg, text_cfg.hidden_size)
        self.language_model = LlamaModel(text_cfg)
        self.lm_head = nn.Linear(text_cfg.hidden_size, text_cfg.vocab_size, bias=False)

    def forward(self, pixel_values, input_ids):
        image_embeds = self.vision(pixel_values)
        token_embeds = self.language_model.embed_tokens(input_ids)
        embeds = torch.cat([image_embeds, token_embeds], dim=1)
        hidden = self.language_model(inputs_embeds=embeds, use_cache=False,
                                     return_dict=True).last_hidden_state
        return self.lm_head(hidden)


def gen_llava(out_root: Path) -> None:
    name = "llava"
    rng = seed_everything(6)
    out_dir = fresh_dir(out_root, name)
    model = TinyLlava(tiny_clip_vision_config(), tiny_llama_config())
    b, s = Dim("batch", min=1, max=64), Dim("seq", min=2, max=200)
    feeds, outs = export_and_verify(
        name, model, (randn(rng, 2, 3, 32, 32), randint(rng, 256, 2, 7)), out_dir / "model.onnx",
        ["pixel_values", "input_ids"], ["logits"],
        alt_args=[(randn(rng, 1, 3, 32, 32), randint(rng, 256, 1, 2)),
                  (randn(rng, 3, 3, 32, 32), randint(rng, 256, 3, 20))],
        dynamic_shapes=({0: b}, {0: b, 1: s}),
        dynamic_axes={"pixel_values": {0: "batch"}, "input_ids": {0: "batch", 1: "seq"},
                      "logits": {0: "batch", 1: "total_seq"}},
    )
    save_npz(out_dir / "inputs.npz", feeds)
    save_npz(out_dir / "outputs.npz", outs)


class EmbedsDecoder(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.model = LlamaForCausalLM(cfg)

    def forward(self, inputs_embeds):
        return self.model(inputs_embeds=inputs_embeds, use_cache=False, return_dict=True).logits


def gen_pipeline(out_root: Path) -> None:
    name = "pipeline"
    rng = seed_everything(7)
    out_dir = fresh_dir(out_root, name)
    text_cfg = tiny_llama_config()
    encoder = VisionProjector(tiny_clip_vision_config(), text_cfg.hidden_size)
    decoder = EmbedsDecoder(text_cfg)
    hidden = text_cfg.hidden_size

    enc_feeds, enc_outs = export_and_verify(
        name, encoder, (randn(rng, 2, 3, 32, 32),), out_dir / "vision_encoder.onnx",
        ["pixel_values"], ["image_embeds"],
        alt_args=[(randn(rng, 1, 3, 32, 32),), (randn(rng, 3, 3, 32, 32),)],
        dynamic_shapes=({0: Dim("batch", min=1, max=64)},),
        dynamic_axes={"pixel_values": {0: "batch"}, "image_embeds": {0: "batch"}},
    )

    # Decoder input: the (ONNX Runtime) image embeddings followed by the
    # embeddings of five text tokens.
    token_ids = randint(rng, 256, 2, 5)
    with torch.no_grad():
        token_embeds = decoder.model.model.embed_tokens(token_ids)
    inputs_embeds = torch.cat([torch.from_numpy(enc_outs["image_embeds"]), token_embeds], dim=1)
    dec_feeds, dec_outs = export_and_verify(
        name, decoder, (inputs_embeds,), out_dir / "decoder.onnx",
        ["inputs_embeds"], ["logits"],
        alt_args=[(randn(rng, 1, 3, hidden),), (randn(rng, 3, 30, hidden),)],
        dynamic_shapes=({0: Dim("batch", min=1, max=64), 1: Dim("seq", min=2, max=256)},),
        dynamic_axes={"inputs_embeds": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
    )

    if (set(enc_feeds) & set(dec_feeds)) or (set(enc_outs) & set(dec_outs)):
        def prefixed(prefix, arrays):
            return {f"{prefix}.{k}": v for k, v in arrays.items()}
        inputs = {**prefixed("vision_encoder", enc_feeds), **prefixed("decoder", dec_feeds)}
        outputs = {**prefixed("vision_encoder", enc_outs), **prefixed("decoder", dec_outs)}
    else:
        inputs = {**enc_feeds, **dec_feeds}
        outputs = {**enc_outs, **dec_outs}
    save_npz(out_dir / "inputs.npz", inputs)
    save_npz(out_dir / "outputs.npz", outputs)


# --- quantization-aware-trained CNN --------------------------------------
#
# Training uses torch's fake-quantization ops.  After training the
# quantization parameters are frozen to Python numbers, and export goes through
# autograd functions whose ONNX symbolic emits QuantizeLinear/DequantizeLinear
# with constant scale/zero-point tensors of the proper element types (uint8
# activations, per-channel symmetric int8 weights).


class _FakeQuantPerTensor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale: float, zero_point: int):
        return torch.fake_quantize_per_tensor_affine(x, scale, zero_point, 0, 255)

    @staticmethod
    def symbolic(g, x, scale: float, zero_point: int):
        s = g.op("Constant", value_t=torch.tensor(scale, dtype=torch.float32))
        z = g.op("Constant", value_t=torch.tensor(zero_point, dtype=torch.uint8))
        return g.op("DequantizeLinear", g.op("QuantizeLinear", x, s, z), s, z)


class _FakeQuantPerChannel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, scales: tuple, axis: int):
        scale = torch.tensor(scales, dtype=torch.float32)
        zero_point = torch.zeros(len(scales), dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(w, scale, zero_point, axis, -128, 127)

    @staticmethod
    def symbolic(g, w, scales: tuple, axis: int):
        s = g.op("Constant", value_t=torch.tensor(scales, dtype=torch.float32))
        z = g.op("Constant", value_t=torch.zeros(len(scales), dtype=torch.int8))
        q = g.op("QuantizeLinear", w, s, z, axis_i=axis)
        return g.op("DequantizeLinear", q, s, z, axis_i=axis)


class FakeQuantAct(nn.Module):
    """Per-tensor uint8 fake quantization with an EMA min/max observer."""

    def __init__(self, momentum: float = 0.1):
        super().__init__()
        self.momentum = momentum
        self.register_buffer("min_val", torch.tensor(0.0))
        self.register_buffer("max_val", torch.tensor(1.0))
        self.observed = False
        self.frozen: tuple[float, int] | None = None

    def qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        lo = torch.clamp(self.min_val, max=0.0)
        hi = torch.maximum(torch.clamp(self.max_val, min=0.0), lo + 1e-6)
        scale = (hi - lo) / 255.0
        zero_point = torch.clamp(torch.round(-lo / scale), 0, 255).to(torch.int32)
        return scale.float(), zero_point

    def freeze(self) -> None:
        scale, zero_point = self.qparams()
        self.frozen = (float(scale), int(zero_point))

    def forward(self, x):
        if self.frozen is not None:
            return _FakeQuantPerTensor.apply(x, *self.frozen)
        if self.training:
            with torch.no_grad():
                lo, hi = x.min(), x.max()
                if not self.observed:
                    self.min_val.copy_(lo)
                    self.max_val.copy_(hi)
                    self.observed = True
                else:
                    self.min_val.lerp_(lo, self.momentum)
                    self.max_val.lerp_(hi, self.momentum)
        scale, zero_point = self.qparams()
        return torch.fake_quantize_per_tensor_affine(x, scale, zero_point, 0, 255)


class QATConv(nn.Module):
    """Conv (per-channel symmetric int8 fake-quantized weights) -> BatchNorm -> ReLU -> FakeQuant."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size=3, padding=1, bias=True)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.act_fq = FakeQuantAct()
        self.frozen_scales: tuple | None = None

    def weight_scales(self) -> torch.Tensor:
        amax = self.conv.weight.detach().abs().amax(dim=(1, 2, 3)).clamp(min=1e-8)
        return (amax / 127.0).float()

    def freeze(self) -> None:
        self.frozen_scales = tuple(float(v) for v in self.weight_scales())
        self.act_fq.freeze()

    def quantized_weight(self):
        w = self.conv.weight
        if self.frozen_scales is not None:
            return _FakeQuantPerChannel.apply(w, self.frozen_scales, 0)
        zero_point = torch.zeros(w.shape[0], dtype=torch.int32)
        return torch.fake_quantize_per_channel_affine(w, self.weight_scales(), zero_point, 0, -128, 127)

    def forward(self, x):
        x = nn.functional.conv2d(x, self.quantized_weight(), self.conv.bias, padding=1)
        return self.act_fq(self.relu(self.bn(x)))


class QATCNN(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.input_fq = FakeQuantAct()
        self.block1 = QATConv(3, 8)
        self.pool1 = nn.MaxPool2d(2)
        self.block2 = QATConv(8, 16)
        self.pool2 = nn.MaxPool2d(2)
        self.block3 = QATConv(16, 32)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def freeze(self) -> None:
        self.input_fq.freeze()
        for block in (self.block1, self.block2, self.block3):
            block.freeze()

    def forward(self, x):
        x = self.input_fq(x)
        x = self.pool1(self.block1(x))
        x = self.pool2(self.block2(x))
        x = self.block3(x)
        x = torch.flatten(self.gap(x), 1)
        return self.fc(x)


def gen_qat_cnn(out_root: Path) -> None:
    name = "qat_cnn"
    rng = seed_everything(8)
    out_dir = fresh_dir(out_root, name)
    model = QATCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model.train()
    for _ in range(20):
        x = torch.randn(16, 3, 32, 32)
        y = torch.randint(0, 10, (16,))
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.freeze()

    # TorchScript exporter: PRESERVE (with the model in eval mode) keeps the
    # inference-mode BatchNormalization nodes instead of fusing them into the
    # convolutions, and no constant folding keeps the weight Q/DQ pairs.
    path = out_dir / "model.onnx"
    feeds, outs = export_and_verify(
        name, model, (randn(rng, 2, 3, 32, 32),), path, ["input"], ["logits"],
        alt_args=[(randn(rng, 1, 3, 32, 32),), (randn(rng, 7, 3, 32, 32),)],
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        prefer_dynamo=False,
        torchscript_kwargs=dict(training=torch.onnx.TrainingMode.PRESERVE,
                                do_constant_folding=False),
    )
    ops = collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    if ops["BatchNormalization"] != 3 or ops["QuantizeLinear"] != 7 or ops["Conv"] != 3:
        raise RuntimeError(f"{name}: unexpected op counts {dict(ops)}")
    save_npz(out_dir / "inputs.npz", feeds)
    save_npz(out_dir / "outputs.npz", outs)


# --- large model (not committed) ------------------------------------------


def gen_big_llama(out_dir: Path, layers: int = 32) -> None:
    name = "big_llama"
    rng = seed_everything(9)
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in ("model.onnx", "model.onnx.data", "inputs.npz", "outputs.npz"):
        if (out_dir / p).exists():
            (out_dir / p).unlink()
    cfg = tiny_llama_config(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
    )
    with torch.no_grad():
        model = LlamaForCausalLM(cfg).eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"  {name}: {n_params / 1e6:.1f}M parameters ({n_params * 4 / 2**30:.2f} GiB f32)")
    export_causal_lm_with_past(name, out_dir, model, n_layers=layers, n_kv_heads=4, head_dim=64,
                               vocab=32000, with_position_ids=True, rng=rng, external_data=True,
                               check_alt_shapes=False)


FIXTURES = {
    "vit": gen_vit,
    "vit_dynamic": gen_vit_dynamic,
    "clip": gen_clip,
    "gpt2_kv": gen_gpt2_kv,
    "llama_gqa_kv": gen_llama_gqa_kv,
    "mistral_sw_kv": gen_mistral_sw_kv,
    "llava": gen_llava,
    "qat_cnn": gen_qat_cnn,
    "pipeline": gen_pipeline,
}


def main() -> int:
    # the exporter logs one line per optional torchvision op it cannot register
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
    warnings.filterwarnings("ignore", message=".*will not be used, since it shares the same shape.*")
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(FIXTURES), action="append",
                        help="regenerate only this fixture (may be repeated)")
    parser.add_argument("--out", type=Path, default=FIXTURES_DIR,
                        help=f"output root (default: {FIXTURES_DIR})")
    parser.add_argument("--big-llama", type=Path, metavar="DIR",
                        help="also write a 32-layer LLaMA (~1.6 GiB, external data) to DIR")
    parser.add_argument("--big-llama-layers", type=int, default=32, metavar="N",
                        help="decoder layers of the --big-llama model (default 32)")
    args = parser.parse_args()

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"onnx {onnx.__version__}, onnxruntime {ort.__version__}")
    if args.big_llama is not None and args.only is None:
        names = []
    else:
        names = args.only or list(FIXTURES)
    failed = []
    for fixture in names:
        print(f"[{fixture}]")
        try:
            FIXTURES[fixture](args.out)
        except Exception:
            traceback.print_exc()
            failed.append(fixture)
    if args.big_llama is not None:
        print("[big_llama]")
        try:
            gen_big_llama(args.big_llama, args.big_llama_layers)
        except Exception:
            traceback.print_exc()
            failed.append("big_llama")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
