"""Run-time activation scales per token / per patch (`granularity`), and the per-layer
granularity and symmetry analysis of the compile report."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mmq
from conftest import fixture
from decode import cosine


def run(model: onnx.ModelProto, feeds, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)


@pytest.mark.parametrize(
    "cell",
    ["llava_dynamo20_eager_static", "vit_dynamo18_sdpa_dynamic", "qwen2_kv_torchscript17_sdpa_dynamic"],
)
def test_per_token_int8_runs_in_onnx_runtime_close_to_float(cell):
    d = fixture("matrix") / cell
    feeds = dict(np.load(d / "inputs.npz"))
    want = dict(np.load(d / "outputs.npz"))
    model = mmq.compile(
        str(d / "model.onnx"), quant="int8-dynamic", granularity="per-token",
        placement="all", progress=False,
    )
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulInteger") > 0 and "DynamicQuantizeLinear" not in ops
    names = [o.name for o in model.graph.output]
    got = dict(zip(names, run(model, feeds)))
    # ONNX Runtime's own fusions must not change the result (one of them reads a per-row scale
    # as one scale for the tensor; the emitted form keeps out of its pattern).
    plain = dict(zip(names, run(model, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)))
    for name in names:
        if got[name].dtype.kind != "f":
            continue
        assert cosine(got[name], plain[name]) > 0.9999, name
        c = cosine(got[name], want[name])
        print(f"{cell} {name}: per-token INT8 cosine {c:.6f}")
        assert c > 0.999, f"{name}: {c}"


def test_granularity_needs_the_dynamic_scheme_and_maps_say_where():
    vit = str(fixture("vit") / "model.onnx")
    with pytest.raises(mmq.MmqError, match=r'^granularity="per-token" needs quant="int8-dynamic", not quant="int8"$'):
        mmq.compile(vit, quant="int8", granularity="per-token", progress=False)
    with pytest.raises(mmq.MmqError, match="unknown activation granularity 'per-row'"):
        mmq.compile(vit, quant="int8-dynamic", granularity="per-row", progress=False)
    bad = '[default]\nscheme = "int8"\ngranularity = "per-patch"\n'
    with pytest.raises(mmq.MmqError, match="need scheme \"int8-dynamic\""):
        mmq.compile(vit, quant="mixed", precision_map=bad, progress=False)
    good = '[default]\nscheme = "int8-dynamic"\ngranularity = "per-patch"\n'
    model = mmq.compile(vit, quant="mixed", precision_map=good, placement="all", progress=False)
    assert "MatMulInteger" in [n.op_type for n in model.graph.node]


def test_report_compares_granularities_per_layer_and_modality():
    _, report = mmq.compile(
        str(fixture("pipeline") / "vision_encoder.onnx"), quant="int8-dynamic",
        report=True, progress=False,
    )
    (analysis,) = report["activations"]
    vision = next(m for m in analysis["modalities"] if m["modality"] == "vision")
    assert vision["layers"] == len(analysis["layers"]) == 8
    per_tensor_sym, per_tensor_asym, per_patch = vision["mean_sqnr_db"]
    print(f"vision encoder: per-tensor sym {per_tensor_sym:.2f} dB, asym {per_tensor_asym:.2f} dB, per-patch {per_patch:.2f} dB")
    # One scale per patch is finer than one per tensor with the same (symmetric) code range.
    assert per_patch > per_tensor_sym
    assert all(layer["per_row_name"] == "per-patch" for layer in analysis["layers"])
