#!/usr/bin/env python3
"""Generate the transformer export matrix under tests/fixtures/matrix/.

The fixtures in tests/fixtures/ (tools/gen_fixtures.py) use one exporter and
eager attention.  Real-world ONNX files differ mostly in *how* the exporter
spelled attention, masks, norms and shapes, so this generator exports the same
small models several ways:

  families  vit, clip, gpt2, gpt2_kv, bert, llama_gqa_kv, qwen2_kv, siglip, llava
  variants  dynamo18_sdpa_dynamic     torch.onnx.export(dynamo=True, opset 18), SDPA, named Dims
            dynamo20_eager_static     dynamo, opset 20, eager attention, static shapes
            dynamo23_sdpa_dynamic     dynamo, opset 23 (may emit the standard Attention op)
            torchscript17_sdpa_dynamic  dynamo=False, opset 17, SDPA, dynamic_axes
            torchscript17_eager_static  dynamo=False, opset 17, eager attention, static

A cell is ``<family>_<variant>``.  Every family uses tiny configs (hidden 32,
4 heads, vocab 128, random weights from a fixed per-family seed, so all cells
of one family share weights and inputs; every parameter, biases and norm
scales included, is overwritten with random values so that no exporter can
drop or merge "all zeros"/"all ones" initializers).  Dynamic cells are also
compared with PyTorch on two other input shapes.  Each produced cell directory
holds

* ``model.onnx``  -- float32, weights embedded; of the dynamo exporter's per-node
  metadata only ``pkg.torch.onnx.name_scopes`` and the rewriter rule names are
  kept (stack traces, class paths and FX node text are stripped for size);
* ``inputs.npz``  -- one array per graph input, keyed by the exact input name
  (batch 2; where the model takes an attention mask one row is left-padded);
* ``outputs.npz`` -- ONNX Runtime (CPUExecutionProvider) outputs on those inputs.

``tests/fixtures/matrix/transformers.json`` lists every cell (also those that
failed to export, with an ``error`` and no directory): family, exporter,
opset, attention implementation, shapes, number of Softmax and standard
``Attention`` nodes, and notes (op highlights, size, anything unusual such as
an ONNX Runtime / PyTorch difference above 1e-3).

Run through ``tools/gen_matrix.sh`` (pinned versions of
tools/requirements-fixtures.txt)::

    tools/gen_matrix.sh                       # all cells
    tools/gen_matrix.sh --only gpt2_kv        # cells whose name starts with gpt2_kv
    tools/gen_matrix.sh --only llava_dynamo23 --only vit
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import logging
import os
import shutil
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.export import Dim  # noqa: E402

import transformers  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertModel,
    CLIPConfig,
    CLIPModel,
    CLIPVisionConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    SiglipVisionConfig,
    SiglipVisionModel,
    ViTConfig,
    ViTModel,
)

from gen_fixtures import (  # noqa: E402
    CausalLMWithPast,
    CLIPWrapper,
    TinyLlava,
    check_onnx,
    kv_args,
    kv_interface,
    opset_of,
    randint,
    randn,
    run_ort,
    save_npz,
    seed_everything,
    strip_stack_traces,
    to_tuple,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
MATRIX_DIR = REPO_ROOT / "tests" / "fixtures" / "matrix"
MANIFEST_NAME = "transformers.json"
TOLERANCE = 1e-3


@dataclass(frozen=True)
class Variant:
    exporter: str  # "dynamo" | "torchscript"
    opset: int
    attn: str  # "sdpa" | "eager"
    shapes: str  # "static" | "dynamic"

    @property
    def suffix(self) -> str:
        return f"{self.exporter}{self.opset}_{self.attn}_{self.shapes}"


VARIANTS = [
    Variant("dynamo", 18, "sdpa", "dynamic"),
    Variant("dynamo", 20, "eager", "static"),
    Variant("dynamo", 23, "sdpa", "dynamic"),
    Variant("torchscript", 17, "sdpa", "dynamic"),
    Variant("torchscript", 17, "eager", "static"),
]


@dataclass
class Case:
    """One family's model and inputs, built for a given attention implementation."""

    model: nn.Module
    args: tuple  # positional inputs, in the order of input_names
    input_names: list[str]
    output_names: list[str]
    dynamic_shapes: object  # for torch.export (dynamo)
    dynamic_axes: dict  # for the TorchScript exporter
    alt_args: list[tuple] = field(default_factory=list)  # other shapes (dynamic cells)
    notes: str = ""


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def set_attn(config, impl: str) -> None:
    """Select the attention implementation on a config and its sub-configs."""
    config._attn_implementation = impl
    for key in ("text_config", "vision_config"):
        sub = getattr(config, key, None)
        if sub is not None:
            set_attn(sub, impl)


def randomize_(model: nn.Module, seed: int) -> nn.Module:
    """Overwrite every parameter with seeded random values.

    Freshly constructed models have all-zero biases and all-one norm scales,
    which the exporters' optimizers then drop or deduplicate; random values
    keep every bias and scale a distinct initializer.  Matrices get std
    1/sqrt(fan_in) so activations and attention scores stay O(1).
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 0:
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if p.ndim == 1:
                p.copy_(0.1 * noise if name.endswith("bias") else 1.0 + 0.1 * noise)
            else:
                p.copy_(noise / float(p[0].numel()) ** 0.5)
    return model.eval()


def left_padded_mask(batch: int, seq: int, pad: int) -> torch.Tensor:
    """All ones except the first ``pad`` positions of the last row (left padding)."""
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if batch > 1 and pad:
        mask[-1, :pad] = 0
    return mask


def max_diff(name: str, ort_out: dict[str, np.ndarray], torch_out: tuple,
             output_names: list[str]) -> float:
    """Largest |ORT - torch| over all outputs; NaN placement must agree."""
    worst = 0.0
    for key, ref in zip(output_names, torch_out):
        got = ort_out[key]
        ref = ref.detach().cpu().numpy()
        if got.shape != ref.shape:
            raise RuntimeError(f"{name}: output {key} shape {got.shape} != torch {ref.shape}")
        if got.size == 0:
            continue
        g, r = got.astype(np.float64), ref.astype(np.float64)
        if not np.array_equal(np.isnan(g), np.isnan(r)):
            return float("inf")
        ok = ~np.isnan(g)
        if ok.any():
            worst = max(worst, float(np.max(np.abs(g[ok] - r[ok]))))
    return worst


def unpadded_diff(feeds: dict[str, np.ndarray], ort_out: dict[str, np.ndarray], torch_out: tuple,
                  output_names: list[str]) -> float | None:
    """Max |ORT - torch| over [batch, seq, ...] outputs restricted to attention_mask == 1."""
    mask = feeds.get("attention_mask")
    if mask is None:
        return None
    worst, seen = 0.0, False
    for key, ref in zip(output_names, torch_out):
        got, ref = ort_out[key], ref.detach().cpu().numpy()
        if got.shape[:2] != mask.shape:
            continue
        keep = mask.astype(bool)
        worst = max(worst, float(np.max(np.abs(got[keep].astype(np.float64) - ref[keep]))))
        seen = True
    return worst if seen else None


@contextlib.contextmanager
def quiet():
    """Silence the exporters' progress printing (they print to stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield buf


def export_cell(case: Case, variant: Variant, path: Path) -> onnx.ModelProto:
    model = case.model.eval()
    dynamic = variant.shapes == "dynamic"
    if variant.exporter == "dynamo":
        with torch.no_grad(), quiet():
            program = torch.onnx.export(
                model,
                case.args,
                dynamo=True,
                opset_version=variant.opset,
                dynamic_shapes=case.dynamic_shapes if dynamic else None,
                input_names=case.input_names,
                output_names=case.output_names,
                external_data=False,
                optimize=True,
                verbose=False,
            )
        proto = program.model_proto
        strip_stack_traces(proto)
        strip_debug_metadata(proto)
    else:
        tmp = path.with_suffix(".tmp.onnx")
        with torch.no_grad(), quiet():
            torch.onnx.export(
                model,
                case.args,
                str(tmp),
                dynamo=False,
                opset_version=variant.opset,
                input_names=case.input_names,
                output_names=case.output_names,
                dynamic_axes=case.dynamic_axes if dynamic else None,
            )
        proto = onnx.load(str(tmp), load_external_data=True)
        for p in tmp.parent.glob(tmp.name + "*"):
            p.unlink()
    onnx.save_model(proto, str(path))
    return proto


# Per-node metadata the dynamo exporter writes.  The stack traces are always
# removed (strip_stack_traces); of the rest only the compact module path and
# the rewriter rule name are kept, the verbose duplicates (full class paths,
# FX node text) would take about a third of each file.
KEPT_NODE_METADATA = {"pkg.torch.onnx.name_scopes", "pkg.onnxscript.rewriter.rule_name"}


def strip_debug_metadata(proto: onnx.ModelProto) -> None:
    def strip_node(node: onnx.NodeProto) -> None:
        kept = [p for p in node.metadata_props if p.key in KEPT_NODE_METADATA]
        if len(kept) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(kept)
        for attr in node.attribute:
            if attr.HasField("g"):
                for n in attr.g.node:
                    strip_node(n)
            for g in attr.graphs:
                for n in g.node:
                    strip_node(n)

    for node in proto.graph.node:
        strip_node(node)
    for func in proto.functions:
        for node in func.node:
            strip_node(node)


def op_histogram(proto: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(
        (n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
        for n in proto.graph.node
    )


# ops worth naming in the notes, in this order
HIGHLIGHT_OPS = [
    "Attention", "Softmax", "RotaryEmbedding", "LayerNormalization", "RMSNormalization",
    "SimplifiedLayerNormalization", "ReduceMean", "Pow", "Sqrt", "Reciprocal", "Gelu", "Erf",
    "Tanh", "Sigmoid", "IsNaN", "IsInf", "Where", "Trilu", "LessOrEqual", "GreaterOrEqual",
    "GatherND", "CumSum", "ArgMax", "Range", "Expand", "Tile", "Mod", "Cos", "Sin", "Neg",
    "Einsum", "Gemm", "FusedMatMul", "If", "Loop", "ScatterND",
]


def describe(proto: onnx.ModelProto, size: int) -> str:
    ops = op_histogram(proto)
    parts = [f"{k}={ops[k]}" for k in HIGHLIGHT_OPS if ops.get(k)]
    other = sorted(k for k in ops if "::" in k)
    if other:
        parts.append("custom domains: " + ",".join(other))
    if proto.functions:
        parts.append(f"{len(proto.functions)} local functions")
    return f"{len(proto.graph.node)} nodes, {size / 1024:.0f} KiB; " + ", ".join(parts)


# --------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------

VOCAB = 128


class VisionWrapper(nn.Module):
    """pixel_values -> (last_hidden_state, pooler_output) of a ViT / SigLIP vision model."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values, return_dict=True)
        return out.last_hidden_state, out.pooler_output


def image_case(model: nn.Module, seed: int, notes: str) -> Case:
    rng = np.random.default_rng(seed)
    b = Dim("batch", min=1, max=64)
    return Case(
        model=VisionWrapper(model),
        args=(randn(rng, 2, 3, 32, 32),),
        input_names=["pixel_values"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_shapes=({0: b},),
        dynamic_axes={"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"},
                      "pooler_output": {0: "batch"}},
        alt_args=[(randn(rng, 1, 3, 32, 32),), (randn(rng, 3, 3, 32, 32),)],
        notes=notes,
    )


def case_vit(attn: str) -> Case:
    seed_everything(101)
    cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, image_size=32, patch_size=8, num_channels=3)
    set_attn(cfg, attn)
    model = randomize_(ViTModel(cfg, add_pooling_layer=True), 101)
    return image_case(model, 101, "ViTModel hidden 32, 2 layers, 17 tokens, Tanh pooler")


def case_siglip(attn: str) -> Case:
    seed_everything(107)
    cfg = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, image_size=32, patch_size=8,
                             num_channels=3, vision_use_head=True)
    set_attn(cfg, attn)
    model = randomize_(SiglipVisionModel(cfg), 107)
    return image_case(model, 107, "SiglipVisionModel hidden 32, 2 layers, 16 tokens, "
                      "gelu_pytorch_tanh MLP, pooler = torch.nn.MultiheadAttention probe head "
                      "(not affected by attn_implementation)")


CLIP_BOS, CLIP_EOS = 126, 127


def clip_text(rng: np.random.Generator, lengths: list[int], seq: int) -> tuple:
    """Left-padded captions: [0.., BOS, tokens.., EOS]."""
    ids = rng.integers(1, 120, size=(len(lengths), seq), dtype=np.int64)
    mask = np.ones((len(lengths), seq), dtype=np.int64)
    for row, n in enumerate(lengths):
        pad = seq - n
        ids[row, :pad] = 0
        mask[row, :pad] = 0
        ids[row, pad] = CLIP_BOS
        ids[row, seq - 1] = CLIP_EOS
    return torch.from_numpy(ids), torch.from_numpy(mask)


def case_clip(attn: str) -> Case:
    seed_everything(102)
    rng = np.random.default_rng(102)
    text_cfg = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=4, max_position_embeddings=16, projection_dim=32,
                    bos_token_id=CLIP_BOS, eos_token_id=CLIP_EOS, pad_token_id=0)
    vision_cfg = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, image_size=32, patch_size=8, num_channels=3,
                      projection_dim=32)
    cfg = CLIPConfig(text_config=text_cfg, vision_config=vision_cfg, projection_dim=32)
    set_attn(cfg, attn)
    model = CLIPWrapper(randomize_(CLIPModel(cfg), 102))
    args = (*clip_text(rng, [8, 5], 8), randn(rng, 2, 3, 32, 32))
    alt = [(*clip_text(rng, [5], 5), randn(rng, 3, 3, 32, 32)),
           (*clip_text(rng, [12, 3, 7], 12), randn(rng, 1, 3, 32, 32))]
    tb, s, ib = Dim("text_batch", min=1, max=64), Dim("seq", min=2, max=16), Dim("image_batch", min=1, max=64)
    return Case(
        model=model, args=args,
        input_names=["input_ids", "attention_mask", "pixel_values"],
        output_names=["logits_per_image", "text_embeds", "image_embeds"],
        dynamic_shapes=({0: tb, 1: s}, {0: tb, 1: s}, {0: ib}),
        dynamic_axes={"input_ids": {0: "text_batch", 1: "seq"},
                      "attention_mask": {0: "text_batch", 1: "seq"},
                      "pixel_values": {0: "image_batch"},
                      "logits_per_image": {0: "image_batch", 1: "text_batch"},
                      "text_embeds": {0: "text_batch"}, "image_embeds": {0: "image_batch"}},
        alt_args=alt,
        notes="CLIPModel text+vision hidden 32, 1+1 layers; text causal+padding mask, "
              "quick_gelu (x*Sigmoid(1.702x)), EOS pooling (ArgMax/Gather); caption 2 left-padded by 3",
    )


def gpt2_config(attn: str) -> GPT2Config:
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     n_inner=64, bos_token_id=0, eos_token_id=0)
    set_attn(cfg, attn)
    return cfg


class LogitsWrapper(nn.Module):
    """(input_ids, attention_mask) -> logits, without KV cache."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                          return_dict=True).logits


def case_gpt2(attn: str) -> Case:
    seed_everything(103)
    rng = np.random.default_rng(103)
    model = LogitsWrapper(randomize_(GPT2LMHeadModel(gpt2_config(attn)), 103))

    def ids_mask(batch, seq, pad):
        return randint(rng, VOCAB, batch, seq), left_padded_mask(batch, seq, pad)

    b, s = Dim("batch", min=1, max=64), Dim("seq", min=1, max=32)
    return Case(
        model=model, args=ids_mask(2, 6, 2),
        input_names=["input_ids", "attention_mask"], output_names=["logits"],
        dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}),
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                      "logits": {0: "batch", 1: "seq"}},
        alt_args=[ids_mask(1, 1, 0), ids_mask(3, 9, 4)],
        notes="GPT2LMHeadModel n_embd 32, 2 layers, Conv1D (addmm) projections, gelu_new (explicit tanh formula), "
              "tied lm_head, no KV cache; row 2 left-padded by 2 (fully masked query rows)",
    )


def kv_case(model: nn.Module, rng: np.random.Generator, n_layers: int, n_kv_heads: int,
            head_dim: int, with_position_ids: bool, notes: str) -> Case:
    """The KV-cache interface of gen_fixtures.export_causal_lm_with_past."""
    wrapper = CausalLMWithPast(model, with_position_ids)
    shape = dict(n_layers=n_layers, n_kv_heads=n_kv_heads, head_dim=head_dim, vocab=VOCAB,
                 with_position_ids=with_position_ids)
    args = kv_args(rng, batch=2, seq=3, past_seq=5, pad_first=True, **shape)
    alt = [kv_args(rng, batch=1, seq=1, past_seq=9, pad_first=False, **shape),
           kv_args(rng, batch=3, seq=4, past_seq=2, pad_first=True, **shape)]
    input_names, output_names, dynamic_shapes, axes = kv_interface(n_layers, with_position_ids)
    return Case(
        model=wrapper, args=args, input_names=input_names, output_names=output_names,
        dynamic_shapes=dynamic_shapes, dynamic_axes=axes, alt_args=alt,
        notes=notes + "; decode step batch 2, seq 3, past 5, row 2's first cached position masked",
    )


def case_gpt2_kv(attn: str) -> Case:
    seed_everything(104)
    model = randomize_(GPT2LMHeadModel(gpt2_config(attn)), 104)
    return kv_case(model, np.random.default_rng(104), 2, 4, 8, False,
                   "GPT2LMHeadModel as in gpt2 with DynamicCache past/present (Concat on axis 2)")


def llama_config(attn: str, **kw) -> LlamaConfig:
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    base.update(kw)
    cfg = LlamaConfig(**base)
    set_attn(cfg, attn)
    return cfg


def case_llama_gqa_kv(attn: str) -> Case:
    seed_everything(105)
    model = randomize_(LlamaForCausalLM(llama_config(attn)), 105)
    return kv_case(model, np.random.default_rng(105), 2, 2, 8, True,
                   "LlamaForCausalLM hidden 32, 2 layers, 4 q / 2 kv heads, head_dim 8, RMSNorm, "
                   "SwiGLU, RoPE from position_ids, untied lm_head")


def case_qwen2_kv(attn: str) -> Case:
    seed_everything(106)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    set_attn(cfg, attn)
    model = randomize_(Qwen2ForCausalLM(cfg), 106)
    return kv_case(model, np.random.default_rng(106), 2, 2, 8, True,
                   "Qwen2ForCausalLM hidden 32, 2 layers, 4 q / 2 kv heads, head_dim 8, q/k/v bias, "
                   "RMSNorm, SwiGLU, RoPE, tied lm_head")


def case_bert(attn: str) -> Case:
    seed_everything(108)
    rng = np.random.default_rng(108)
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=32, type_vocab_size=2)
    set_attn(cfg, attn)
    model = randomize_(BertModel(cfg, add_pooling_layer=True), 108)

    class BertWrapper(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids, return_dict=True)
            return out.last_hidden_state, out.pooler_output

    def inputs(batch, seq, pad):
        ids = randint(rng, VOCAB, batch, seq)
        mask = left_padded_mask(batch, seq, pad)
        types = torch.zeros(batch, seq, dtype=torch.int64)
        types[:, seq // 2:] = 1
        return ids, mask, types

    b, s = Dim("batch", min=1, max=64), Dim("seq", min=2, max=32)
    return Case(
        model=BertWrapper(model), args=inputs(2, 8, 3),
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}, {0: b, 1: s}),
        dynamic_axes={n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask",
                                                           "token_type_ids", "last_hidden_state")}
        | {"pooler_output": {0: "batch"}},
        alt_args=[inputs(1, 5, 0), inputs(3, 16, 6)],
        notes="BertModel (MiniLM-like) hidden 32, 2 layers, exact gelu, bidirectional padding mask, "
              "Tanh pooler; token_type_ids second half 1; row 2 left-padded by 3",
    )


class TinyLlavaMasked(TinyLlava):
    """gen_fixtures.TinyLlava plus an attention mask over the text tokens.

    Position ids are derived from the mask as in ``generate`` (cumsum - 1,
    1 at padding), so they carry the batch dimension.
    """

    def forward(self, pixel_values, input_ids, attention_mask):
        image_embeds = self.vision(pixel_values)
        token_embeds = self.language_model.embed_tokens(input_ids)
        embeds = torch.cat([image_embeds, token_embeds], dim=1)
        image_mask = torch.ones(image_embeds.shape[:2], dtype=attention_mask.dtype,
                                device=attention_mask.device)
        mask = torch.cat([image_mask, attention_mask], dim=1)
        position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        hidden = self.language_model(inputs_embeds=embeds, attention_mask=mask,
                                     position_ids=position_ids, use_cache=False,
                                     return_dict=True).last_hidden_state
        return self.lm_head(hidden)


def case_llava(attn: str) -> Case:
    seed_everything(109)
    rng = np.random.default_rng(109)
    vision_cfg = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=4, image_size=32, patch_size=8,
                                  num_channels=3, projection_dim=32)
    set_attn(vision_cfg, attn)
    model = randomize_(TinyLlavaMasked(vision_cfg, llama_config(attn, num_hidden_layers=1)), 109)

    def inputs(batch, seq, pad):
        return randn(rng, batch, 3, 32, 32), randint(rng, VOCAB, batch, seq), left_padded_mask(batch, seq, pad)

    b, s = Dim("batch", min=1, max=64), Dim("seq", min=1, max=200)
    return Case(
        model=model, args=inputs(2, 6, 2),
        input_names=["pixel_values", "input_ids", "attention_mask"], output_names=["logits"],
        dynamic_shapes=({0: b}, {0: b, 1: s}, {0: b, 1: s}),
        dynamic_axes={"pixel_values": {0: "batch"}, "input_ids": {0: "batch", 1: "seq"},
                      "attention_mask": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "total_seq"}},
        alt_args=[inputs(1, 1, 0), inputs(3, 9, 4)],
        notes="CLIP vision (hidden 32, penultimate layer, 16 patch tokens) -> Linear/GELU/Linear "
              "projector -> Concat before token embeddings -> LlamaModel (as llama_gqa_kv, no cache) "
              "(1 layer) -> lm_head; attention_mask covers the text tokens (image tokens always "
              "attended), position_ids = cumsum(mask) - 1 inside the graph; row 2's first 2 text "
              "tokens masked",
    )


FAMILIES: dict[str, Callable[[str], Case]] = {
    "vit": case_vit,
    "clip": case_clip,
    "gpt2": case_gpt2,
    "gpt2_kv": case_gpt2_kv,
    "bert": case_bert,
    "llama_gqa_kv": case_llama_gqa_kv,
    "qwen2_kv": case_qwen2_kv,
    "siglip": case_siglip,
    "llava": case_llava,
}


# Cells of one family only: the dynamo exporter at opset 17 writes SDPA's K transposed through
# Reshape/Transpose/Reshape with the head size as an `unk__` symbol of its own shape inference.
EXTRA_CELLS = [("bert", Variant("dynamo", 17, "sdpa", "dynamic"))]


def all_cells() -> list[tuple[str, str, Variant]]:
    cells = [(f"{fam}_{v.suffix}", fam, v) for fam in FAMILIES for v in VARIANTS]
    return cells + [(f"{fam}_{v.suffix}", fam, v) for fam, v in EXTRA_CELLS]


# --------------------------------------------------------------------------
# one cell
# --------------------------------------------------------------------------


def short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    msg = " | ".join(lines[:3])
    return msg[:400]


def gen_cell(out_root: Path, cell: str, family: str, variant: Variant) -> dict:
    entry = dict(cell=cell, family=family, exporter=variant.exporter, opset=variant.opset,
                 attn=variant.attn, shapes=variant.shapes)
    out_dir = out_root / cell
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    path = out_dir / "model.onnx"
    try:
        case = FAMILIES[family](variant.attn)
        case.model.eval()
        with torch.no_grad():
            ref = to_tuple(case.model(*case.args))
        try:
            proto = export_cell(case, variant, path)
        except Exception as exc:
            raise RuntimeError(f"export failed: {short_error(exc)}") from exc
        check_onnx(path)
        notes = [case.notes]
        actual = opset_of(proto)
        if actual != variant.opset:
            notes.append(f"exporter wrote opset {actual} instead of the requested {variant.opset}")
            entry["opset"] = actual
        feeds = {n: a.detach().numpy() for n, a in zip(case.input_names, case.args)}
        outs = run_ort(path, feeds)
        if list(outs) != case.output_names:
            raise RuntimeError(f"graph outputs {list(outs)} != {case.output_names}")
        diff = max_diff(cell, outs, ref, case.output_names)
        if diff > TOLERANCE:
            msg = f"MISMATCH: ORT differs from PyTorch by {diff:.3g} on the stored inputs"
            unpadded = unpadded_diff(feeds, outs, ref, case.output_names)
            if unpadded is not None:
                msg += f" (max diff {unpadded:.2g} at positions where attention_mask is 1)"
            notes.append(msg)
        nonfinite = [k for k, v in outs.items() if not np.all(np.isfinite(v))]
        if nonfinite:
            notes.append(f"non-finite values in {nonfinite}")
        if variant.shapes == "dynamic":
            alt_diff = 0.0
            try:
                for alt in case.alt_args:
                    with torch.no_grad():
                        alt_ref = to_tuple(case.model(*alt))
                    alt_outs = run_ort(path, {n: a.detach().numpy()
                                              for n, a in zip(case.input_names, alt)})
                    alt_diff = max(alt_diff, max_diff(cell, alt_outs, alt_ref, case.output_names))
            except Exception as exc:
                notes.append(f"DYNAMIC SHAPES BROKEN: other input shapes fail in ORT ({short_error(exc)[:200]})")
            else:
                if alt_diff > TOLERANCE:
                    notes.append(f"MISMATCH at other input shapes: max diff {alt_diff:.3g}")
        save_npz(out_dir / "inputs.npz", feeds)
        save_npz(out_dir / "outputs.npz", outs)
        ops = op_histogram(proto)
        size = path.stat().st_size
        entry["softmax"] = ops.get("Softmax", 0)
        entry["attention_ops"] = ops.get("Attention", 0)
        notes.insert(1, describe(proto, size))
        entry["notes"] = "; ".join(n for n in notes if n)
        print(f"  ok: {size / 1024:.0f} KiB, Softmax={entry['softmax']}, "
              f"Attention={entry['attention_ops']}, max diff {diff:.2g}")
        for n in notes[2:]:
            print(f"  note: {n}")
    except Exception as exc:
        if os.environ.get("GEN_MATRIX_DEBUG"):
            traceback.print_exc()
        shutil.rmtree(out_dir, ignore_errors=True)
        entry["error"] = str(exc)[:400] if str(exc).startswith("export failed") else short_error(exc)
        entry["notes"] = ""
        print(f"  FAILED: {entry['error']}")
    return entry


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------


def write_manifest(out_root: Path, entries: dict[str, dict]) -> None:
    path = out_root / MANIFEST_NAME
    old = []
    if path.exists():
        old = json.loads(path.read_text())
    merged = {e["cell"]: e for e in old}
    merged.update(entries)
    order = {cell: i for i, (cell, _, _) in enumerate(all_cells())}
    rows = sorted(merged.values(), key=lambda e: (order.get(e["cell"], len(order)), e["cell"]))
    keys = ["cell", "family", "exporter", "opset", "attn", "shapes", "softmax", "attention_ops",
            "notes", "error"]
    rows = [{k: e[k] for k in keys if k in e} | {k: v for k, v in e.items() if k not in keys}
            for e in rows]
    path.write_text(json.dumps(rows, indent=1) + "\n")


def main() -> int:
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    logging.getLogger("onnxscript").setLevel(logging.ERROR)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", metavar="CELL_PREFIX",
                        help="generate only cells whose name starts with this (repeatable)")
    parser.add_argument("--out", type=Path, default=MATRIX_DIR,
                        help=f"output root (default: {MATRIX_DIR})")
    parser.add_argument("--list", action="store_true", help="list the cell names and exit")
    args = parser.parse_args()

    cells = all_cells()
    if args.only:
        cells = [c for c in cells if any(c[0].startswith(p) for p in args.only)]
        if not cells:
            parser.error(f"no cell starts with {args.only}")
    if args.list:
        for cell, _, _ in cells:
            print(cell)
        return 0

    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"onnx {onnx.__version__}, onnxruntime {ort.__version__}")
    args.out.mkdir(parents=True, exist_ok=True)
    entries = {}
    for cell, family, variant in cells:
        print(f"[{cell}]", flush=True)
        entries[cell] = gen_cell(args.out, cell, family, variant)
        write_manifest(args.out, {cell: entries[cell]})
    failed = [c for c, e in entries.items() if "error" in e]
    flagged = [c for c, e in entries.items() if "MISMATCH" in e.get("notes", "")
               or "BROKEN" in e.get("notes", "")]
    print(f"{len(entries) - len(failed)} cells written, {len(failed)} failed to export"
          + (": " + ", ".join(failed) if failed else ""))
    if flagged:
        print("flagged (see notes): " + ", ".join(flagged))
    return 0


if __name__ == "__main__":
    sys.exit(main())
