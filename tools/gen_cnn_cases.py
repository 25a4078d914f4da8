#!/usr/bin/env python3
"""Generate small ONNX test models for the CNN / QAT / paddle / subgraph matrix.

Each case is written to ``tests/fixtures/matrix/<case>/`` as

* ``model.onnx``  -- float32, weights embedded, < 200 KB;
* ``inputs.npz``  -- one array per graph input, keyed by the exact input name;
* ``outputs.npz`` -- one array per graph output, keyed by the exact output name,
  computed by ONNX Runtime (CPUExecutionProvider) from ``inputs.npz``;

and described in ``tests/fixtures/matrix/cnn.json`` (a list of
``{"case", "exporter", "opset", "batchnorm", "conv_relu", "qdq", "notes", ...}``;
``batchnorm`` counts BatchNormalization nodes, ``conv_relu`` counts Conv nodes
whose only consumer is a Relu, ``qdq`` counts QuantizeLinear nodes, all of them
including nodes inside subgraphs).  A case that cannot be produced is recorded
with an ``"error"`` entry instead of being dropped.

The cases cover the ways exporters emit CNNs:

* PyTorch's own quantization-aware training flow (``torch.ao.quantization``,
  eager mode and FX graph mode) exported with the TorchScript exporter, which
  is not the hand-rolled fake quantization of ``gen_fixtures.py``'s ``qat_cnn``:
  BN-aware weight fake quantization ``W*(gamma/sigma) -> Q -> DQ -> Conv ->
  Div(gamma/sigma) -> BatchNormalization``, reduce-range activations
  ``Q -> Clip(0..127) -> DQ``, zero points cast at run time;
* a DB-text-detector-style head (ConvTranspose upsampling, BatchNormalization,
  Sigmoid), with the dynamo and TorchScript exporters, and BatchNormalization
  *before* a convolution (pre-activation blocks);
* a classifier/segmenter whose dims are written the way paddle2onnx writes them
  (every dynamic dim ``"?"``, or ``-1``, or ``p2o.DynamicDimension.N``) with the
  weights in ``Constant`` nodes;
* weights inside ``If`` branches (silero-vad-like, with ``LSTM``) and a
  ``Loop`` body with a weight.

Models built from torch are compared against PyTorch (max abs diff recorded as
``torch_max_abs_diff``); models built with ``onnx.helper`` get their weights
from torch modules and are compared against the torch computation too.

Usage (with the pinned ``.venv-fixtures`` from ``tools/gen_fixtures.sh``)::

    .venv-fixtures/bin/python tools/gen_cnn_cases.py               # every case
    .venv-fixtures/bin/python tools/gen_cnn_cases.py --only if_weights
    .venv-fixtures/bin/python tools/gen_cnn_cases.py --list
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import io
import json
import logging
import os
import re
import shutil
import sys
import traceback
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for gen_fixtures' helpers
sys.dont_write_bytecode = True  # no tools/__pycache__ from that import

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from torch import nn  # noqa: E402
from torch.export import Dim  # noqa: E402

from gen_fixtures import (  # noqa: E402
    check_onnx,
    opset_of,
    run_ort,
    save_npz,
    seed_everything,
    strip_stack_traces,
    summarize,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
MATRIX_DIR = REPO_ROOT / "tests" / "fixtures" / "matrix"
MANIFEST = "cnn.json"
MAX_BYTES = 200 * 1024
TOLERANCE = 1e-3


class CaseError(RuntimeError):
    """A case that cannot be produced; recorded in the manifest."""


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def fresh_dir(out_root: Path, name: str) -> Path:
    d = out_root / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


def all_nodes(graph: onnx.GraphProto):
    """Every node of ``graph`` and of its subgraphs (depth first)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from all_nodes(g)


def subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read (including outer-scope captures)."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            for n in all_nodes(g):
                names.update(n.input)
            names.update(o.name for o in g.output)
    return names


def count_conv_relu(graph: onnx.GraphProto) -> int:
    """Conv nodes whose only consumer (in their graph) is a single Relu."""
    total = 0
    consumers: dict[str, list[str]] = collections.defaultdict(list)
    for node in graph.node:
        for name in set(node.input) | subgraph_inputs(node):
            consumers[name].append(node.op_type)
    for out in graph.output:
        consumers[out.name].append("<graph output>")
    for node in graph.node:
        if node.op_type == "Conv" and consumers.get(node.output[0]) == ["Relu"]:
            total += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                total += count_conv_relu(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                total += sum(count_conv_relu(g) for g in attr.graphs)
    return total


def op_counts(proto: onnx.ModelProto) -> dict[str, int]:
    ops = collections.Counter(
        (n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}")
        for n in all_nodes(proto.graph)
    )
    return dict(sorted(ops.items()))


def dims_of(vi: onnx.ValueInfoProto) -> list:
    out = []
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_param"):
            out.append(d.dim_param)
        elif d.HasField("dim_value"):
            out.append(d.dim_value)
        else:
            out.append(None)
    return out


def max_abs_diff(ort_out: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> float:
    worst = 0.0
    for key, want in ref.items():
        got = ort_out[key]
        if got.shape != want.shape:
            raise CaseError(f"output {key}: ORT shape {got.shape} != reference {want.shape}")
        if got.size:
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))))
    return worst


def torch_outputs(model: nn.Module, args: tuple, output_names: list[str]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        out = model(*args)
    if isinstance(out, torch.Tensor):
        out = (out,)
    return {n: t.detach().cpu().numpy() for n, t in zip(output_names, out)}


def randomize_bn(model: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial BatchNorm affine parameters and running statistics."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.2)
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.2)
                m.running_var.copy_(torch.rand(c, generator=gen) * 1.5 + 0.5)


@contextlib.contextmanager
def quiet_stdout():
    """Silence stdout, also at the file-descriptor level (C++ prints)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(io.StringIO()):
            os.dup2(devnull.fileno(), 1)
            try:
                yield
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
    finally:
        os.close(saved)


def ts_export(model: nn.Module, args: tuple, input_names, output_names, opset: int,
              dynamic_axes=None, training=torch.onnx.TrainingMode.PRESERVE,
              do_constant_folding: bool = False) -> onnx.ModelProto:
    """TorchScript exporter (dynamo=False) into memory."""
    buf = io.BytesIO()
    # On failure the TorchScript exporter prints the whole partial graph to stdout.
    with torch.no_grad(), quiet_stdout():
        torch.onnx.export(
            model, args, buf, dynamo=False, opset_version=opset, input_names=input_names,
            output_names=output_names, dynamic_axes=dynamic_axes, training=training,
            do_constant_folding=do_constant_folding,
        )
    return onnx.load_from_string(buf.getvalue())


def dynamo_export(model: nn.Module, args: tuple, input_names, output_names, opset: int,
                  dynamic_shapes=None, optimize: bool = True) -> onnx.ModelProto:
    with torch.no_grad():
        program = torch.onnx.export(
            model, args, dynamo=True, opset_version=opset, input_names=input_names,
            output_names=output_names, dynamic_shapes=dynamic_shapes, optimize=optimize,
            verbose=False,
        )
    proto = program.model_proto
    strip_stack_traces(proto)
    return proto


class Case:
    """Accumulates one manifest entry."""

    current: "Case | None" = None

    def __init__(self, name: str, exporter: str, notes: str = ""):
        self.entry: dict = {"case": name, "exporter": exporter, "opset": None,
                            "batchnorm": None, "conv_relu": None, "qdq": None, "notes": notes}
        Case.current = self  # so that a failure can still be recorded with these notes


def write_case(out_root: Path, name: str, proto: onnx.ModelProto, feeds: dict[str, np.ndarray],
               ref: dict[str, np.ndarray] | None, entry: dict,
               alt: list[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = ()) -> None:
    """Save, check, run and compare one model; fill ``entry``."""
    out_dir = fresh_dir(out_root, name)
    path = out_dir / "model.onnx"
    onnx.save_model(proto, str(path))
    check_onnx(path)
    outs = run_ort(path, feeds)
    if ref is not None:
        if list(ref) != list(outs):
            raise CaseError(f"graph outputs {list(outs)} != reference outputs {list(ref)}")
        diffs = [max_abs_diff(outs, ref)]
        for alt_feeds, alt_ref in alt:
            diffs.append(max_abs_diff(run_ort(path, alt_feeds), alt_ref))
        entry["torch_max_abs_diff"] = float(f"{max(diffs):.3g}")
        if max(diffs) > TOLERANCE:
            entry["notes"] += f" ORT differs from PyTorch by {max(diffs):.3g} (> {TOLERANCE})."
            print(f"  WARNING: {name}: ORT differs from the reference by {max(diffs):.3g}")
    save_npz(out_dir / "inputs.npz", feeds)
    save_npz(out_dir / "outputs.npz", outs)
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise CaseError(f"model is {size} bytes (> {MAX_BYTES})")
    ops = op_counts(proto)
    entry.update(
        opset=opset_of(proto),
        batchnorm=ops.get("BatchNormalization", 0),
        conv_relu=count_conv_relu(proto.graph),
        qdq=ops.get("QuantizeLinear", 0),
        bytes=size,
        inputs={vi.name: dims_of(vi) for vi in proto.graph.input},
        outputs={vi.name: dims_of(vi) for vi in proto.graph.output},
        stored_shapes={k: list(v.shape) for k, v in feeds.items()},
        ops=ops,
    )
    summarize(path, proto, entry["exporter"])


def np_feeds(names: list[str], args: tuple) -> dict[str, np.ndarray]:
    return {n: a.detach().cpu().numpy() for n, a in zip(names, args)}


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


# --------------------------------------------------------------------------
# 1. eager-mode QAT (torch.ao.quantization)
# --------------------------------------------------------------------------

import torch.ao.quantization as tq  # noqa: E402


class EagerQATNet(nn.Module):
    """Three Conv-BN-ReLU blocks (bias False / True / False), two Conv-BN blocks without
    ReLU, one Conv-ReLU, two residual adds (``FloatFunctional.add`` + ``nn.ReLU`` and
    ``FloatFunctional.add_relu``), global average pool, Linear."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(16)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(16)
        self.relu3 = nn.ReLU()
        self.conv4 = nn.Conv2d(16, 16, 3, padding=1, bias=True)
        self.bn4 = nn.BatchNorm2d(16)
        self.skip_add = nn.quantized.FloatFunctional()
        self.relu_add = nn.ReLU()
        self.conv6 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn6 = nn.BatchNorm2d(16)
        self.skip_add_relu = nn.quantized.FloatFunctional()
        self.conv5 = nn.Conv2d(16, 16, 1, bias=True)
        self.relu5 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)
        self.dequant = tq.DeQuantStub()

    FUSE = [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"], ["conv3", "bn3", "relu3"],
            ["conv4", "bn4"], ["conv6", "bn6"], ["conv5", "relu5"]]

    def forward(self, x):
        x = self.quant(x)
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        y = self.relu3(self.bn3(self.conv3(x)))
        y = self.bn4(self.conv4(y))
        x = self.relu_add(self.skip_add.add(x, y))
        y = self.bn6(self.conv6(x))
        x = self.skip_add_relu.add_relu(x, y)
        x = self.relu5(self.conv5(x))
        x = torch.flatten(self.pool(x), 1)
        return self.dequant(self.fc(x))


def train_qat(model: nn.Module, seed: int, steps: int = 20) -> None:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model.train()
    for _ in range(steps):
        x = torch.randn(8, 3, 32, 32, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


_QAT_STATE: dict = {}


def eager_qat_model(version: int) -> nn.Module:
    """Fused, prepared and trained eager QAT model (cached per qconfig version)."""
    if version not in _QAT_STATE:
        seed_everything(101)
        model = EagerQATNet()
        model.train()
        model = tq.fuse_modules_qat(model, EagerQATNet.FUSE)
        model.qconfig = tq.get_default_qat_qconfig("fbgemm", version)
        tq.prepare_qat(model, inplace=True)
        train_qat(model, seed=102)
        model.apply(tq.disable_observer)
        _QAT_STATE[version] = model
    return copy.deepcopy(_QAT_STATE[version])


QAT_IN, QAT_OUT = ["input"], ["logits"]
QAT_AXES = {"input": {0: "batch"}, "logits": {0: "batch"}}

QAT_PATTERN_NOTES = (
    "BN-aware weight fake quant: s=Div(bn.weight, Sqrt(Add(bn.running_var, eps))); "
    "Mul(W, Reshape(s,[-1,1,1,1])) -> QuantizeLinear(scale f32[Cout], zp Cast(int32[Cout]->int8), axis=0) "
    "-> DequantizeLinear -> Conv(x, Wdq, Constant zeros f32[Cout]) -> Div(conv, Reshape(s,[1,-1,1,1])) "
    "[-> Add(Reshape(conv.bias,[1,-1,1,1])) when bias=True] -> BatchNormalization(5 inputs) [-> Relu] "
    "-> QuantizeLinear(scale f32[1], zp Cast(int32[1]->uint8)) -> Clip(q, '', uint8 127) -> DequantizeLinear "
    "(reduce_range: activations 0..127). Conv-ReLU without BN: Q/DQ(W) -> Conv(x, Wdq, bias) -> Relu -> Q/Clip/DQ. "
    "Linear: Q/DQ(W per-channel axis 0) -> Gemm(transB=1) -> Q/Clip/DQ."
)


def gen_qat_eager_ts17(out_root: Path) -> dict:
    name = "qat_eager_ts17"
    case = Case(name, "torchscript (dynamo=False, training=PRESERVE, do_constant_folding=False)",
                "torch.ao.quantization eager QAT: fuse_modules_qat + get_default_qat_qconfig('fbgemm', version=0) "
                "(FakeQuantize + MovingAverage(PerChannel)MinMaxObserver) + prepare_qat, 20 SGD steps, "
                "disable_observer, freeze_bn_stats, exported with the model in train() mode (BN frozen -> "
                "inference-form BatchNormalization, training_mode=0, 1 output). " + QAT_PATTERN_NOTES +
                " Residuals: FloatFunctional.add -> Add -> Q/Clip/DQ -> Relu (nn.ReLU after add has no observer, "
                "so the next Conv-BN input is not Q/DQ'd); FloatFunctional.add_relu -> Add -> Relu -> Q/Clip/DQ.")
    model = eager_qat_model(0)
    model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
    model.train()
    gen = torch.Generator().manual_seed(103)
    args = (randn(gen, 2, 3, 32, 32),)
    alt_args = (randn(gen, 5, 3, 32, 32),)
    proto = ts_export(model, args, QAT_IN, QAT_OUT, 17, dynamic_axes=QAT_AXES)
    write_case(out_root, name, proto, np_feeds(QAT_IN, args), torch_outputs(model, args, QAT_OUT),
               case.entry, alt=[(np_feeds(QAT_IN, alt_args), torch_outputs(model, alt_args, QAT_OUT))])
    return case.entry


def gen_qat_eager_ts17_eval(out_root: Path) -> dict:
    name = "qat_eager_ts17_eval"
    case = Case(name, "torchscript (dynamo=False, training=EVAL, do_constant_folding=False)",
                "Same trained model as qat_eager_ts17 but model.eval() and training=TrainingMode.EVAL. "
                "Graph identical except that the EVAL export deduplicates equal initializers: several "
                "zero_point initializers (int32) are replaced by Identity nodes reading another layer's "
                "zero_point (e.g. Identity(conv1.activation_post_process.zero_point) -> "
                "conv2.activation_post_process.zero_point), then Cast -> Q/DQ as usual.")
    model = eager_qat_model(0)
    model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
    model.eval()
    gen = torch.Generator().manual_seed(103)
    args = (randn(gen, 2, 3, 32, 32),)
    alt_args = (randn(gen, 5, 3, 32, 32),)
    proto = ts_export(model, args, QAT_IN, QAT_OUT, 17, dynamic_axes=QAT_AXES,
                      training=torch.onnx.TrainingMode.EVAL)
    write_case(out_root, name, proto, np_feeds(QAT_IN, args), torch_outputs(model, args, QAT_OUT),
               case.entry, alt=[(np_feeds(QAT_IN, alt_args), torch_outputs(model, alt_args, QAT_OUT))])
    return case.entry


def gen_qat_eager_ts17_bntrain(out_root: Path) -> dict:
    name = "qat_eager_ts17_bntrain"
    case = Case(name, "torchscript (dynamo=False, training=PRESERVE, do_constant_folding=False)",
                "Same trained model as qat_eager_ts17 but WITHOUT freeze_bn_stats, exported in train() mode: "
                "every BatchNormalization has training_mode=1 and 3 outputs (Y, running_mean, running_var; "
                "the last two unused), i.e. BN normalizes with batch statistics, the output depends on the "
                "whole batch. The Mul/Div(gamma/sigma) around the Conv still use running_var. Otherwise as "
                "qat_eager_ts17.")
    model = eager_qat_model(0)
    model.train()
    gen = torch.Generator().manual_seed(103)
    args = (randn(gen, 2, 3, 32, 32),)
    ref = torch_outputs(copy.deepcopy(model), args, QAT_OUT)
    proto = ts_export(copy.deepcopy(model), args, QAT_IN, QAT_OUT, 17, dynamic_axes=QAT_AXES)
    write_case(out_root, name, proto, np_feeds(QAT_IN, args), ref, case.entry)
    if case.entry["torch_max_abs_diff"] > TOLERANCE:
        step = float(model.fc.activation_post_process.scale)
        case.entry["notes"] += (f" The difference is {case.entry['torch_max_abs_diff'] / step:.2f} x the "
                                f"logits' quantization step ({step:.3g}): batch-statistics BN computed in a "
                                "different order flips the rounding of a few fake-quantized values. The "
                                "stored outputs are ORT's.")
    return case.entry


def gen_qat_eager_default_qconfig_ts17(out_root: Path) -> dict:
    name = "qat_eager_default_qconfig_ts17"
    Case(name, "torchscript (dynamo=False, training=PRESERVE, do_constant_folding=False)",
         "get_default_qat_qconfig('fbgemm') with the default version=1 uses "
         "FusedMovingAvgObsFakeQuantize (aten::fused_moving_avg_obs_fake_quant), which the "
         "TorchScript exporter cannot export (no symbolic); the other QAT cases use version=0 "
         "(FakeQuantize + MovingAverage(PerChannel)MinMaxObserver).")
    model = eager_qat_model(1)
    model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
    args = (torch.zeros(2, 3, 32, 32),)
    ts_export(model, args, QAT_IN, QAT_OUT, 17, dynamic_axes=QAT_AXES)
    raise CaseError("export unexpectedly succeeded; turn this into a real case")  # pragma: no cover


def gen_qat_eager_dynamo18(out_root: Path) -> dict:
    name = "qat_eager_dynamo18"
    case = Case(name, "dynamo (opset 18)",
                "Eager QAT model (version=0 qconfig, observers disabled, BN frozen, eval) with the dynamo "
                "exporter: torch.export (strict and non-strict) fails on FakeQuantize.forward's "
                "data-dependent `if self.fake_quant_enabled[0] == 1` (GuardOnDataDependentSymNode).")
    model = eager_qat_model(0)
    model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
    model.eval()
    gen = torch.Generator().manual_seed(103)
    args = (randn(gen, 2, 3, 32, 32),)
    proto = dynamo_export(model, args, QAT_IN, QAT_OUT, 18)
    write_case(out_root, name, proto, np_feeds(QAT_IN, args), torch_outputs(model, args, QAT_OUT),
               case.entry)
    return case.entry


# --------------------------------------------------------------------------
# 2. FX-graph-mode QAT
# --------------------------------------------------------------------------


class FxQATNet(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(16)
        self.conv4 = nn.Conv2d(16, 16, 3, padding=1, bias=True)
        self.bn4 = nn.BatchNorm2d(16)
        self.conv5 = nn.Conv2d(16, 16, 1, bias=True)
        self.relu5 = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))                # nn.ReLU: fused ConvBnReLU2d
        x = nn.functional.relu(self.bn2(self.conv2(x)))        # F.relu: fused ConvBnReLU2d
        y = torch.relu(self.bn3(self.conv3(x)))                # torch.relu: NOT fused
        y = self.bn4(self.conv4(y))                            # ConvBn2d
        x = nn.functional.relu(x + y)                          # add + relu: one observer after relu
        x = self.relu5(self.conv5(x))                          # ConvReLU2d
        x = torch.flatten(self.pool(x), 1)
        return self.fc(x)


def fx_qat_model(version: int) -> nn.Module:
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    seed_everything(201)
    model = FxQATNet().train()
    qmap = tq.get_default_qat_qconfig_mapping("fbgemm", version)
    model = prepare_qat_fx(model, qmap, (torch.zeros(1, 3, 32, 32),))
    train_qat(model, seed=202)
    model.apply(tq.disable_observer)
    model.apply(torch.ao.nn.intrinsic.qat.freeze_bn_stats)
    return model


def gen_qat_fx_ts17(out_root: Path) -> dict:
    name = "qat_fx_ts17"
    case = Case(name, "torchscript (dynamo=False, training=PRESERVE, do_constant_folding=False)",
                "torch.ao.quantization.quantize_fx.prepare_qat_fx with get_default_qat_qconfig_mapping("
                "'fbgemm', version=0), 20 SGD steps, disable_observer, freeze_bn_stats, exported in train() "
                "mode (BN frozen: training_mode=0, 1 output). Input gets Q/Clip/DQ. " + QAT_PATTERN_NOTES +
                " FX specifics: conv1 (nn.ReLU) and conv2 (F.relu) fused -> ...BatchNormalization -> Relu -> "
                "Q/Clip/DQ; conv3 followed by torch.relu is NOT fused -> BatchNormalization -> Q/Clip/DQ -> "
                "Relu -> Q/Clip/DQ; conv4 Conv-BN -> Q/Clip/DQ; residual Add -> Relu -> Q/Clip/DQ; conv5 "
                "Conv -> Relu -> Q/Clip/DQ; GlobalAveragePool and Flatten each followed by a Q/Clip/DQ "
                "sharing the previous scale/zero point initializers.")
    model = fx_qat_model(0)
    model.train()
    gen = torch.Generator().manual_seed(203)
    args = (randn(gen, 2, 3, 32, 32),)
    alt_args = (randn(gen, 5, 3, 32, 32),)
    proto = ts_export(model, args, QAT_IN, QAT_OUT, 17, dynamic_axes=QAT_AXES)
    write_case(out_root, name, proto, np_feeds(QAT_IN, args), torch_outputs(model, args, QAT_OUT),
               case.entry, alt=[(np_feeds(QAT_IN, alt_args), torch_outputs(model, alt_args, QAT_OUT))])
    return case.entry


def gen_qat_fx_default_qconfig_ts17(out_root: Path) -> dict:
    name = "qat_fx_default_qconfig_ts17"
    Case(name, "torchscript (dynamo=False, training=PRESERVE, do_constant_folding=False)",
         "prepare_qat_fx with the default get_default_qat_qconfig_mapping('fbgemm') (version=1, "
         "FusedMovingAvgObsFakeQuantize): not exportable by the TorchScript exporter.")
    model = fx_qat_model(1)
    args = (torch.zeros(2, 3, 32, 32),)
    ts_export(model, args, QAT_IN, QAT_OUT, 17, dynamic_axes=QAT_AXES)
    raise CaseError("export unexpectedly succeeded; turn this into a real case")  # pragma: no cover


# --------------------------------------------------------------------------
# 3. DB-detector-style head (ConvTranspose + BN + Sigmoid), BN before Conv
# --------------------------------------------------------------------------


class DBDetector(nn.Module):
    """Backbone with stride-2 Conv-BN-ReLU, DB-style head: Conv-BN-ReLU ->
    ConvTranspose(k2, s2, groups 1, bias) -> BN -> ReLU -> ConvTranspose(k2, s2, groups 2,
    no bias) -> BN -> ReLU -> Conv1x1 -> Sigmoid (probability map at input resolution)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(8), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.head_conv = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False),
                                       nn.BatchNorm2d(16), nn.ReLU())
        self.up1 = nn.ConvTranspose2d(16, 8, 2, stride=2, groups=1, bias=True)
        self.up1_bn = nn.BatchNorm2d(8)
        self.up2 = nn.ConvTranspose2d(8, 8, 2, stride=2, groups=2, bias=False)
        self.up2_bn = nn.BatchNorm2d(8)
        self.out_conv = nn.Conv2d(8, 1, 1)

    def forward(self, x):
        x = self.head_conv(self.down(self.stem(x)))
        x = torch.relu(self.up1_bn(self.up1(x)))
        x = torch.relu(self.up2_bn(self.up2(x)))
        return torch.sigmoid(self.out_conv(x))


def detector_model() -> nn.Module:
    seed_everything(301)
    model = DBDetector()
    randomize_bn(model, torch.Generator().manual_seed(302))
    return model.eval()


DET_IN, DET_OUT = ["x"], ["maps"]


def detector_args():
    gen = torch.Generator().manual_seed(303)
    return (randn(gen, 1, 3, 32, 32),), (randn(gen, 2, 3, 64, 96),)


DET_PATTERN = (
    "Conv(k3,s2,p1,no bias) -> BatchNormalization -> Relu (x3; the last one k3 s1 p1), "
    "ConvTranspose(W f32[16,8,2,2], B f32[8], group=1, strides=[2,2], pads=0, output_padding=0, "
    "kernel_shape=[2,2]) -> BatchNormalization -> Relu, ConvTranspose(W f32[8,4,2,2] (= [Cin, Cout/group, "
    "kH, kW]), no B, group=2, strides=[2,2]) -> BatchNormalization -> Relu, Conv 1x1 (8->1, bias) -> "
    "Sigmoid. ")


def gen_detector_ts17(out_root: Path) -> dict:
    name = "detector_ts17"
    case = Case(name, "torchscript (dynamo=False, training=PRESERVE, do_constant_folding=False)",
                "DB text-detector-style head, model.eval(); PRESERVE keeps inference-form "
                "BatchNormalization (training_mode=0, 1 output, 5 inputs X, scale, B, mean, var; "
                "epsilon=1e-5, momentum=0.9). " + DET_PATTERN +
                "Dynamic batch/height/width via dynamic_axes (output dims are exporter-generated names).")
    model = detector_model()
    args, alt_args = detector_args()
    axes = {"x": {0: "batch", 2: "height", 3: "width"},
            "maps": {0: "batch", 2: "maps_height", 3: "maps_width"}}
    proto = ts_export(model, args, DET_IN, DET_OUT, 17, dynamic_axes=axes)
    write_case(out_root, name, proto, np_feeds(DET_IN, args), torch_outputs(model, args, DET_OUT),
               case.entry, alt=[(np_feeds(DET_IN, alt_args), torch_outputs(model, alt_args, DET_OUT))])
    return case.entry


def det_dynamic_shapes():
    return {"x": {0: Dim("batch", min=1, max=64), 2: Dim("height", min=8, max=4096),
                  3: Dim("width", min=8, max=4096)}}


def gen_detector_dynamo18(out_root: Path) -> dict:
    name = "detector_dynamo18"
    case = Case(name, "dynamo (opset 18, optimize=False)",
                "DB text-detector-style head, model.eval(), dynamo exporter with optimize=False so that "
                "BatchNormalization is kept (inference form: training_mode attribute absent = 0, 1 output). "
                + DET_PATTERN + "Bias-less Conv gets a zero bias built at run time: "
                "Shape(W, start=0, end=1) -> Expand(Constant [1]) ; CastLike(Constant 0.0, x) -> Expand -> "
                "Conv's 3rd input. Output dims are sympy expressions of height/width.")
    model = detector_model()
    args, alt_args = detector_args()
    proto = dynamo_export(model, args, DET_IN, DET_OUT, 18, dynamic_shapes=det_dynamic_shapes(),
                          optimize=False)
    write_case(out_root, name, proto, np_feeds(DET_IN, args), torch_outputs(model, args, DET_OUT),
               case.entry, alt=[(np_feeds(DET_IN, alt_args), torch_outputs(model, alt_args, DET_OUT))])
    return case.entry


def gen_detector_dynamo18_opt(out_root: Path) -> dict:
    name = "detector_dynamo18_opt"
    case = Case(name, "dynamo (opset 18, optimize=True, the default)",
                "Same model as detector_dynamo18 with the default optimize=True: the onnxscript optimizer "
                "folds every BatchNormalization into the preceding Conv / ConvTranspose (including the "
                "group=2 ConvTranspose), so the graph is Conv -> Relu / ConvTranspose -> Relu with new "
                "weights and biases, no BatchNormalization.")
    model = detector_model()
    args, alt_args = detector_args()
    proto = dynamo_export(model, args, DET_IN, DET_OUT, 18, dynamic_shapes=det_dynamic_shapes(),
                          optimize=True)
    write_case(out_root, name, proto, np_feeds(DET_IN, args), torch_outputs(model, args, DET_OUT),
               case.entry, alt=[(np_feeds(DET_IN, alt_args), torch_outputs(model, alt_args, DET_OUT))])
    return case.entry


class BNBeforeConv(nn.Module):
    """BN directly before Conv: input BN -> Conv3x3 (padded, so not exactly foldable into the
    conv at the borders), pre-activation residual block BN -> ReLU -> Conv -> BN -> ReLU -> Conv
    (+ skip), BN -> Conv1x1 (pad 0: exactly foldable), BN -> ReLU -> GAP -> Linear."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.bn_in = nn.BatchNorm2d(3)
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1, bias=True)
        self.pre_bn1 = nn.BatchNorm2d(8)
        self.pre_conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.pre_bn2 = nn.BatchNorm2d(8)
        self.pre_conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn_proj = nn.BatchNorm2d(8)
        self.conv_proj = nn.Conv2d(8, 16, 1, stride=2, bias=False)
        self.bn_out = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.conv_in(self.bn_in(x))
        h = self.pre_conv1(torch.relu(self.pre_bn1(x)))
        h = self.pre_conv2(torch.relu(self.pre_bn2(h)))
        x = x + h
        x = self.conv_proj(self.bn_proj(x))
        x = torch.relu(self.bn_out(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def gen_bn_before_conv_ts17(out_root: Path) -> dict:
    name = "bn_before_conv_ts17"
    case = Case(name, "torchscript (dynamo=False, training=PRESERVE, do_constant_folding=False)",
                "BatchNormalization BEFORE Conv, model.eval(), inference-form BN (training_mode=0, 1 output). "
                "input -> BatchNormalization(3 ch) -> Conv(3->8, k3, pads 1, bias) [BN->Conv with zero "
                "padding: folding BN into this conv is only exact in the interior]; pre-activation block "
                "BatchNormalization -> Relu -> Conv(k3 p1, no bias) twice, residual Add; BatchNormalization -> "
                "Conv(8->16, k1, stride 2, pads 0, no bias) [exactly foldable]; BatchNormalization -> Relu -> "
                "GlobalAveragePool -> Flatten -> Gemm.")
    seed_everything(401)
    model = BNBeforeConv()
    randomize_bn(model, torch.Generator().manual_seed(402))
    model.eval()
    gen = torch.Generator().manual_seed(403)
    args = (randn(gen, 2, 3, 32, 32),)
    alt_args = (randn(gen, 3, 3, 32, 32),)
    names_in, names_out = ["input"], ["logits"]
    proto = ts_export(model, args, names_in, names_out, 17,
                      dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    write_case(out_root, name, proto, np_feeds(names_in, args), torch_outputs(model, args, names_out),
               case.entry, alt=[(np_feeds(names_in, alt_args), torch_outputs(model, alt_args, names_out))])
    return case.entry


# --------------------------------------------------------------------------
# 4. paddle2onnx-style dims and Constant weights
# --------------------------------------------------------------------------


class PaddleLikeNet(nn.Module):
    """PP-LCNet-like classifier + segmentation map: Conv-BN-Hardswish blocks (opset 11
    exports Hardswish as HardSigmoid * x), flatten via Reshape(Shape), softmax logits, and a
    1x1-conv map upsampled back to the input size (Resize with sizes from Shape(x))."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False)   # depthwise
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 16, 1, bias=False)                       # pointwise
        self.bn3 = nn.BatchNorm2d(16)
        self.conv4 = nn.Conv2d(16, 16, 3, stride=2, padding=1, bias=False)
        self.bn4 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, num_classes)
        self.seg = nn.Conv2d(16, 1, 1)

    def forward(self, x):
        f = nn.functional.hardswish(self.bn1(self.conv1(x)))
        f = torch.relu(self.bn2(self.conv2(f)))
        f = nn.functional.hardswish(self.bn3(self.conv3(f)))
        f = torch.relu(self.bn4(self.conv4(f)))
        pooled = nn.functional.adaptive_avg_pool2d(f, 1)
        logits = self.fc(pooled.reshape(pooled.shape[0], -1))
        probs = torch.softmax(logits, dim=-1)
        seg = nn.functional.interpolate(self.seg(f), size=(x.shape[2], x.shape[3]), mode="nearest")
        return probs, torch.sigmoid(seg)


PADDLE_IN = ["x"]
PADDLE_OUT = ["softmax_0.tmp_0", "sigmoid_0.tmp_0"]
PADDLE_OPSET = 11


def initializers_to_constants(proto: onnx.ModelProto) -> None:
    """Move every initializer into a Constant node at the top of the graph (paddle2onnx style)."""
    graph = proto.graph
    consts = [helper.make_node("Constant", [], [init.name], name=f"p2o.Constant.{i}", value=init)
              for i, init in enumerate(graph.initializer)]
    init_names = {init.name for init in graph.initializer}
    kept_inputs = [vi for vi in graph.input if vi.name not in init_names]
    del graph.initializer[:]
    del graph.input[:]
    graph.input.extend(kept_inputs)
    nodes = consts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)


def rewrite_dynamic_dims(proto: onnx.ModelProto, style: str) -> None:
    """Rewrite every symbolic/unknown dim of inputs, outputs and value_info.

    style "?"   : dim_param "?" everywhere (paddle2onnx before 1.2);
    style "-1"  : dim_value -1 everywhere;
    style "p2o" : graph inputs get p2o.DynamicDimension.0/.1/.2 (batch, height, width) in order,
                  every other dynamic dim occurrence (outputs, value_info) a fresh
                  p2o.DynamicDimension.N, N counting on.
    """
    counter = [0]

    def fresh() -> str:
        name = f"p2o.DynamicDimension.{counter[0]}"
        counter[0] += 1
        return name

    def fix(vi: onnx.ValueInfoProto) -> None:
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            return
        for d in t.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                continue
            if style == "?":
                d.dim_param = "?"
            elif style == "-1":
                d.dim_value = -1  # (clears dim_param: same oneof)
            elif style == "p2o":
                d.dim_param = fresh()
            else:
                raise ValueError(style)

    for vi in list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info):
        fix(vi)
    if style == "-1":
        # ONNX's strict shape inference (check_model(full_check=True)) rejects value_info that
        # says -1 where it infers a number (e.g. Conv output "(0) vs (-1)"), so value_info
        # entries holding a -1 are dropped; the all-static ones (shape tensors) are kept.
        kept = [vi for vi in proto.graph.value_info
                if all(d.dim_value >= 0 or d.HasField("dim_param") for d in vi.type.tensor_type.shape.dim)]
        del proto.graph.value_info[:]
        proto.graph.value_info.extend(kept)


def paddle_base() -> tuple[onnx.ModelProto, nn.Module, tuple, tuple]:
    seed_everything(501)
    model = PaddleLikeNet()
    randomize_bn(model, torch.Generator().manual_seed(502))
    model.eval()
    gen = torch.Generator().manual_seed(503)
    args = (randn(gen, 1, 3, 48, 192),)          # non-square on purpose
    alt_args = (randn(gen, 2, 3, 64, 96),)
    axes = {"x": {0: "batch", 2: "height", 3: "width"},
            PADDLE_OUT[0]: {0: "batch"},
            PADDLE_OUT[1]: {0: "batch", 2: "height", 3: "width"}}
    proto = ts_export(model, args, PADDLE_IN, PADDLE_OUT, PADDLE_OPSET, dynamic_axes=axes,
                      do_constant_folding=True)
    initializers_to_constants(proto)
    # The exporter cannot infer the channel dim of the Resize output; paddle2onnx writes it.
    seg_dims = proto.graph.output[1].type.tensor_type.shape.dim
    seg_dims[1].Clear()
    seg_dims[1].dim_value = 1
    # value_info for every intermediate (shape-related ones included), as paddle2onnx's
    # shape inference leaves them.
    del proto.graph.value_info[:]
    proto = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    return proto, model, args, alt_args


def gen_paddle_variant(out_root: Path, name: str, style: str, notes: str) -> dict:
    case = Case(name, f"torchscript (dynamo=False, opset {PADDLE_OPSET}, training=PRESERVE) + "
                "paddle2onnx-style rewrite", notes)
    proto, model, args, alt_args = paddle_base()
    rewrite_dynamic_dims(proto, style)
    ref = torch_outputs(model, args, PADDLE_OUT)
    alt_ref = torch_outputs(model, alt_args, PADDLE_OUT)
    write_case(out_root, name, proto, np_feeds(PADDLE_IN, args), ref, case.entry,
               alt=[(np_feeds(PADDLE_IN, alt_args), alt_ref)])
    case.entry["value_info_count"] = len(proto.graph.value_info)
    return case.entry


PADDLE_COMMON = (
    "Opset 11, paddle-style names (input 'x' f32[N,3,H,W]; outputs 'softmax_0.tmp_0' [N,10] and "
    "'sigmoid_0.tmp_0' [N,1,H,W]); all weights are Constant nodes (named p2o.Constant.<i>, outputs keep "
    "the torch initializer names) placed first, no initializers. Conv -> BatchNormalization (inference) -> "
    "HardSigmoid(alpha=1/6, beta=0.5) * x (Hardswish at opset 11) / Relu; depthwise Conv group=8; "
    "GlobalAveragePool -> Reshape(shape from Shape/Gather/Unsqueeze/Concat) -> Gemm -> Softmax(axis=1); "
    "seg: Conv1x1 -> Resize(nearest, sizes = Concat(Shape(conv)[0:2], Shape(x)[2:4]) via Slice) -> "
    "Sigmoid. value_info for every intermediate (shape tensors included) from ONNX shape inference. "
    "Stored input is 1x3x48x192 (non-square); ORT also checked at 2x3x64x96. ")


def gen_paddle_dims(out_root: Path) -> dict:
    return gen_paddle_variant(
        out_root, "paddle_dims", "?",
        PADDLE_COMMON + "Every dynamic dim in inputs, outputs and value_info is dim_param '?' "
        "(x: ['?',3,'?','?']); the '?'s are NOT one symbol: batch=1, height=48, width=192 here.")


def gen_paddle_dims_neg1(out_root: Path) -> dict:
    return gen_paddle_variant(
        out_root, "paddle_dims_neg1", "-1",
        PADDLE_COMMON + "Every dynamic dim in inputs and outputs is dim_value -1 (x: [-1,3,-1,-1], "
        "softmax_0.tmp_0: [-1,10], sigmoid_0.tmp_0: [-1,1,-1,-1]); ORT reads -1 as unknown. value_info "
        "entries that would hold a -1 are dropped (ONNX strict shape inference / full_check rejects "
        "them: 'Inferred shape and existing shape differ in dimension 2: (0) vs (-1)' because it "
        "computes Conv output dims from -1 as numbers); fully static value_info (shape tensors) kept.")


def gen_paddle_dims_p2o(out_root: Path) -> dict:
    return gen_paddle_variant(
        out_root, "paddle_dims_p2o", "p2o",
        PADDLE_COMMON + "Dynamic dims use paddle2onnx>=1.2 names: x is [p2o.DynamicDimension.0, 3, "
        "p2o.DynamicDimension.1, p2o.DynamicDimension.2]; every further dynamic dim occurrence "
        "(outputs, then value_info in order) gets a fresh name p2o.DynamicDimension.3, .4, ... even "
        "when it equals an input dim (e.g. softmax output batch is .3, not .0).")


# --------------------------------------------------------------------------
# 5. weights inside subgraphs: If (silero-vad-like, LSTM) and Loop
# --------------------------------------------------------------------------

SUB_OPSET = 17
SUB_IR = 8
F32 = TensorProto.FLOAT


def vi(name: str, elem: int, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


def t2np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def lstm_onnx_weights(lstm: nn.LSTM) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch (i, f, g, o) gate order -> ONNX (i, o, f, c); adds the num_directions axis."""
    def reorder(w: torch.Tensor) -> np.ndarray:
        i, f, g, o = w.detach().chunk(4, 0)
        return t2np(torch.cat([i, o, f, g], 0))

    w = reorder(lstm.weight_ih_l0)[None]
    r = reorder(lstm.weight_hh_l0)[None]
    b = np.concatenate([reorder(lstm.bias_ih_l0), reorder(lstm.bias_hh_l0)])[None]
    return w, r, b


class VadBranch(nn.Module):
    def __init__(self, kernel: int, stride: int, hidden: int = 16):
        super().__init__()
        self.conv = nn.Conv1d(1, hidden, kernel, stride=stride)
        self.lstm = nn.LSTM(hidden, hidden)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, x, h0, c0):
        f = torch.relu(self.conv(x.unsqueeze(1)))          # [B, H, T]
        y, (hn, cn) = self.lstm(f.permute(2, 0, 1), (h0, c0))
        prob = torch.sigmoid(self.fc(hn[0]))                # [B, 1]
        return prob, torch.cat([hn, cn], 0)


class VadLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.b16k = VadBranch(kernel=64, stride=32)
        self.b8k = VadBranch(kernel=32, stride=16)

    def forward(self, x, state, sr: int):
        h0, c0 = state[0:1], state[1:2]
        return (self.b16k if sr == 16000 else self.b8k)(x, h0, c0)


def vad_branch_graph(prefix: str, branch: VadBranch, samples: int, weights_as: str) -> onnx.GraphProto:
    """One If branch: Unsqueeze -> Conv -> Relu -> Transpose -> LSTM -> Squeeze -> MatMul -> Add
    -> Sigmoid, and Concat(Y_h, Y_c) for the new state. Captures x, h0, c0 from the outer scope."""
    hidden = branch.lstm.hidden_size
    k, s = branch.conv.kernel_size[0], branch.conv.stride[0]
    steps = (samples - k) // s + 1
    w, r, b = lstm_onnx_weights(branch.lstm)
    weights = {
        f"{prefix}/conv.weight": t2np(branch.conv.weight),
        f"{prefix}/conv.bias": t2np(branch.conv.bias),
        f"{prefix}/lstm.W": w,
        f"{prefix}/lstm.R": r,
        f"{prefix}/lstm.B": b,
        f"{prefix}/fc.weight_t": t2np(branch.fc.weight).T.copy(),
        f"{prefix}/fc.bias": t2np(branch.fc.bias),
        f"{prefix}/axes1": np.array([1], np.int64),
        f"{prefix}/axes0": np.array([0], np.int64),
    }
    p = prefix
    nodes = [
        helper.make_node("Unsqueeze", ["x", f"{p}/axes1"], [f"{p}/x3"], name=f"{p}/Unsqueeze"),
        helper.make_node("Conv", [f"{p}/x3", f"{p}/conv.weight", f"{p}/conv.bias"], [f"{p}/conv"],
                         name=f"{p}/Conv", kernel_shape=[k], strides=[s], pads=[0, 0], dilations=[1],
                         group=1),
        helper.make_node("Relu", [f"{p}/conv"], [f"{p}/relu"], name=f"{p}/Relu"),
        helper.make_node("Transpose", [f"{p}/relu"], [f"{p}/seq"], name=f"{p}/Transpose", perm=[2, 0, 1]),
        helper.make_node("LSTM", [f"{p}/seq", f"{p}/lstm.W", f"{p}/lstm.R", f"{p}/lstm.B", "", "h0", "c0"],
                         [f"{p}/Y", f"{p}/Y_h", f"{p}/Y_c"], name=f"{p}/LSTM", hidden_size=hidden,
                         direction="forward"),
        helper.make_node("Squeeze", [f"{p}/Y_h", f"{p}/axes0"], [f"{p}/h_last"], name=f"{p}/Squeeze"),
        helper.make_node("MatMul", [f"{p}/h_last", f"{p}/fc.weight_t"], [f"{p}/fc_mm"], name=f"{p}/MatMul"),
        helper.make_node("Add", [f"{p}/fc_mm", f"{p}/fc.bias"], [f"{p}/fc"], name=f"{p}/Add"),
        helper.make_node("Sigmoid", [f"{p}/fc"], [f"{p}/prob"], name=f"{p}/Sigmoid"),
        helper.make_node("Concat", [f"{p}/Y_h", f"{p}/Y_c"], [f"{p}/state"], name=f"{p}/Concat", axis=0),
    ]
    value_info = [
        vi(f"{p}/x3", F32, ["batch", 1, samples]),
        vi(f"{p}/conv", F32, ["batch", hidden, steps]),
        vi(f"{p}/relu", F32, ["batch", hidden, steps]),
        vi(f"{p}/seq", F32, [steps, "batch", hidden]),
        vi(f"{p}/Y", F32, [steps, 1, "batch", hidden]),
        vi(f"{p}/Y_h", F32, [1, "batch", hidden]),
        vi(f"{p}/Y_c", F32, [1, "batch", hidden]),
        vi(f"{p}/h_last", F32, ["batch", hidden]),
        vi(f"{p}/fc_mm", F32, ["batch", 1]),
        vi(f"{p}/fc", F32, ["batch", 1]),
    ]
    outputs = [vi(f"{p}/prob", F32, ["batch", 1]), vi(f"{p}/state", F32, [2, "batch", hidden])]
    if weights_as == "initializers":
        inits = [numpy_helper.from_array(a, n) for n, a in weights.items()]
    else:
        inits = []
        nodes = [helper.make_node("Constant", [], [n], name=f"{n}/Constant",
                                  value=numpy_helper.from_array(a, n)) for n, a in weights.items()] + nodes
    return helper.make_graph(nodes, f"{p}_branch", [], outputs, inits, value_info=value_info)


def gen_if_weights(out_root: Path) -> dict:
    name = "if_weights"
    case = Case(name, "onnx.helper (weights from torch modules)",
                "silero-vad-like: inputs x f32[batch,512], state f32[2,batch,16], sr int64[] (scalar). "
                "Main graph: Split(state, axis 0) -> h0, c0 f32[1,batch,16]; cond = Equal(sr, Constant "
                "int64 16000); If(cond) with two outputs (prob f32[batch,1], stateN f32[2,batch,16]). "
                "then_branch (16 kHz) holds its weights as subgraph INITIALIZERS, else_branch (8 kHz) as "
                "Constant nodes inside the subgraph; each: Unsqueeze(x, [1]) -> Conv1d(16x1xK, bias, "
                "K=64 s=32 / K=32 s=16) -> Relu -> Transpose(perm [2,0,1]) -> LSTM(hidden 16, W [1,64,16], "
                "R [1,64,16], B [1,128], seq_lens '', initial_h h0, initial_c c0 from the outer scope) -> "
                "Squeeze(Y_h,[0]) -> MatMul(W^T [16,1]) -> Add(b [1]) -> Sigmoid; Concat(Y_h, Y_c, axis 0). "
                "Branch outputs and every intermediate have typed value_info with dim 'batch'. Stored "
                "sr=16000; ORT also checked against torch with sr=8000. If output shapes given as "
                "[batch,1] / [2,batch,16].")
    seed_everything(601)
    model = VadLike().eval()
    hidden, samples = 16, 512
    then_g = vad_branch_graph("then", model.b16k, samples, "initializers")
    else_g = vad_branch_graph("else", model.b8k, samples, "constants")
    nodes = [
        helper.make_node("Split", ["state"], ["h0", "c0"], name="Split", axis=0),
        helper.make_node("Constant", [], ["sr16k"], name="Constant_sr",
                         value=numpy_helper.from_array(np.array(16000, np.int64), "sr16k")),
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="Equal"),
        helper.make_node("If", ["is16k"], ["output", "stateN"], name="If",
                         then_branch=then_g, else_branch=else_g),
    ]
    graph = helper.make_graph(
        nodes, "vad_like",
        [vi("x", F32, ["batch", samples]), vi("state", F32, [2, "batch", hidden]), vi("sr", TensorProto.INT64, [])],
        [vi("output", F32, ["batch", 1]), vi("stateN", F32, [2, "batch", hidden])],
        value_info=[vi("h0", F32, [1, "batch", hidden]), vi("c0", F32, [1, "batch", hidden]),
                    vi("is16k", TensorProto.BOOL, [])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", SUB_OPSET)],
                              producer_name="gen_cnn_cases", ir_version=SUB_IR)
    gen = torch.Generator().manual_seed(602)

    def sample(batch: int, sr: int):
        x = randn(gen, batch, samples) * 0.3
        state = randn(gen, 2, batch, hidden) * 0.1
        feeds = {"x": t2np(x), "state": t2np(state), "sr": np.array(sr, np.int64)}
        with torch.no_grad():
            prob, st = model(x, state, sr)
        return feeds, {"output": t2np(prob), "stateN": t2np(st)}

    feeds, ref = sample(2, 16000)
    write_case(out_root, name, proto, feeds, ref, case.entry, alt=[sample(3, 8000), sample(1, 16000)])
    return case.entry


def gen_loop_body(out_root: Path) -> dict:
    name = "loop_body"
    case = Case(name, "onnx.helper (weights from torch)",
                "Loop with a weight in its body: inputs x f32[batch,16], n int64[] (trip count). "
                "Loop(M=n, cond='' (absent), v_initial=x) body(iter int64[], cond_in bool[], h f32[batch,16]) "
                "-> (cond_out = Identity(cond_in), h_next = Tanh(Add(MatMul(h, W1 [16,16] body "
                "INITIALIZER), b1 [16] main-graph initializer captured from the outer scope)), scan output "
                "y = MatMul(h_next, W2 [16,8] Constant node inside the body)). Outputs h_final "
                "f32[batch,16] and ys f32[iterations,batch,8]. Body inputs/outputs and intermediates have "
                "typed value_info. Stored n=3; also checked with n=1 and n=5.")
    seed_everything(701)
    lin1 = nn.Linear(16, 16)
    lin2 = nn.Linear(16, 8, bias=False)
    w1 = t2np(lin1.weight).T.copy()
    b1 = t2np(lin1.bias)
    w2 = t2np(lin2.weight).T.copy()
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body/Identity"),
            helper.make_node("MatMul", ["h", "body/W1"], ["body/mm"], name="body/MatMul"),
            helper.make_node("Add", ["body/mm", "b1"], ["body/add"], name="body/Add"),
            helper.make_node("Tanh", ["body/add"], ["h_next"], name="body/Tanh"),
            helper.make_node("Constant", [], ["body/W2"], name="body/W2/Constant",
                             value=numpy_helper.from_array(w2, "body/W2")),
            helper.make_node("MatMul", ["h_next", "body/W2"], ["y"], name="body/MatMul_1"),
        ],
        "loop_body",
        [vi("iter", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []), vi("h", F32, ["batch", 16])],
        [vi("cond_out", TensorProto.BOOL, []), vi("h_next", F32, ["batch", 16]), vi("y", F32, ["batch", 8])],
        [numpy_helper.from_array(w1, "body/W1")],
        value_info=[vi("body/mm", F32, ["batch", 16]), vi("body/add", F32, ["batch", 16]),
                    vi("body/W2", F32, [16, 8])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["h_final", "ys"], name="Loop", body=body)],
        "loop_model",
        [vi("x", F32, ["batch", 16]), vi("n", TensorProto.INT64, [])],
        [vi("h_final", F32, ["batch", 16]), vi("ys", F32, ["iterations", "batch", 8])],
        [numpy_helper.from_array(b1, "b1")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", SUB_OPSET)],
                              producer_name="gen_cnn_cases", ir_version=SUB_IR)
    gen = torch.Generator().manual_seed(702)

    def sample(batch: int, n: int):
        x = randn(gen, batch, 16)
        h, ys = x, []
        with torch.no_grad():
            for _ in range(n):
                h = torch.tanh(lin1(h))
                ys.append(lin2(h))
        return ({"x": t2np(x), "n": np.array(n, np.int64)},
                {"h_final": t2np(h), "ys": t2np(torch.stack(ys))})

    feeds, ref = sample(2, 3)
    write_case(out_root, name, proto, feeds, ref, case.entry, alt=[sample(1, 1), sample(4, 5)])
    return case.entry


# --------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------

CASES = {
    "qat_eager_ts17": gen_qat_eager_ts17,
    "qat_eager_ts17_eval": gen_qat_eager_ts17_eval,
    "qat_eager_ts17_bntrain": gen_qat_eager_ts17_bntrain,
    "qat_eager_default_qconfig_ts17": gen_qat_eager_default_qconfig_ts17,
    "qat_eager_dynamo18": gen_qat_eager_dynamo18,
    "qat_fx_ts17": gen_qat_fx_ts17,
    "qat_fx_default_qconfig_ts17": gen_qat_fx_default_qconfig_ts17,
    "detector_ts17": gen_detector_ts17,
    "detector_dynamo18": gen_detector_dynamo18,
    "detector_dynamo18_opt": gen_detector_dynamo18_opt,
    "bn_before_conv_ts17": gen_bn_before_conv_ts17,
    "paddle_dims": gen_paddle_dims,
    "paddle_dims_neg1": gen_paddle_dims_neg1,
    "paddle_dims_p2o": gen_paddle_dims_p2o,
    "if_weights": gen_if_weights,
    "loop_body": gen_loop_body,
}

# Cases expected to fail (the failure itself is the information recorded).
EXPECTED_ERRORS = {"qat_eager_default_qconfig_ts17", "qat_eager_dynamo18", "qat_fx_default_qconfig_ts17"}


def run_case(name: str, out_root: Path) -> dict:
    fn = CASES[name]
    Case.current = None
    try:
        return fn(out_root)
    except Exception as exc:  # recorded, not dropped
        if os.environ.get("GEN_CNN_DEBUG"):
            traceback.print_exc()
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
        if "## Exception summary" in text:  # torch.export failures: keep the root cause
            text = text.split("## Exception summary", 1)[1]
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        msg = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        print(f"  ERROR: {msg[:400]}")
        case = Case.current
        entry = dict(case.entry) if case is not None and case.entry["case"] == name else {
            "case": name, "exporter": None, "opset": None, "batchnorm": None, "conv_relu": None,
            "qdq": None, "notes": ""}
        entry["error"] = msg[:1000]
        d = out_root / name
        if d.exists():
            shutil.rmtree(d)
        return entry


def main() -> int:
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    logging.getLogger("torch.onnx._internal.exporter._core").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=sorted(CASES), action="append",
                        help="regenerate only this case (may be repeated); the manifest keeps the others")
    parser.add_argument("--out", type=Path, default=MATRIX_DIR, help=f"output root (default: {MATRIX_DIR})")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(CASES))
        return 0

    # Single-threaded for bit-reproducible training and reference outputs.
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, onnx {onnx.__version__}, onnxruntime {ort.__version__}")
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / MANIFEST
    entries: dict[str, dict] = {}
    if args.only and manifest_path.exists():
        entries = {e["case"]: e for e in json.loads(manifest_path.read_text())}
    names = args.only or list(CASES)
    unexpected = []
    for name in names:
        print(f"[{name}]")
        entry = run_case(name, args.out)
        entries[name] = entry
        if ("error" in entry) != (name in EXPECTED_ERRORS):
            unexpected.append(name)
    ordered = [entries[n] for n in CASES if n in entries]
    manifest_path.write_text(json.dumps(ordered, indent=1) + "\n")
    print(f"wrote {manifest_path.relative_to(REPO_ROOT) if manifest_path.is_relative_to(REPO_ROOT) else manifest_path}")
    if unexpected:
        print(f"UNEXPECTED: {', '.join(unexpected)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
