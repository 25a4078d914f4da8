"""Quantized KV and image caches: greedy decode loops in ONNX Runtime against the float model."""

import glob
import os

import numpy as np
import onnx
import pytest

import mmq
from conftest import fixture
from decode import cosine, greedy

# Bits per element of a cache tensor's element type.
_BITS = {
    onnx.TensorProto.FLOAT: 32,
    onnx.TensorProto.FLOAT16: 16,
    onnx.TensorProto.INT8: 8,
    onnx.TensorProto.FLOAT8E4M3FN: 8,
    onnx.TensorProto.INT4: 4,
}


def ids(token: np.ndarray) -> dict[str, np.ndarray]:
    return {"input_ids": token}


def cache_bits_per_token(model: onnx.ModelProto, tokens: int) -> float:
    """Bits the present outputs hold per token after `tokens` tokens (scales included), from
    the declared shapes with batch 1."""
    total = 0.0
    for o in model.graph.output:
        if not o.name.startswith("present"):
            continue
        t = o.type.tensor_type
        n = 1
        for i, d in enumerate(t.shape.dim):
            if d.HasField("dim_value"):
                n *= d.dim_value
            elif i == 0:
                n *= 1
            else:
                # A token count (seq + past_seq) or a block count ((… + 31) / 32).
                text = d.dim_param
                if "/" in text:
                    div = int(text.rsplit("/", 1)[1].strip(" )"))
                    n *= -(-tokens // div)
                else:
                    n *= tokens
        total += n * _BITS[t.elem_type]
    return total / tokens


def compare(float_path, quant_path, prompt, steps):
    """Teacher-forced comparison: both models see the float model's greedy tokens."""
    ref_tokens, ref_logits = greedy(str(float_path), prompt, steps, ids)
    _, logits = greedy(str(quant_path), prompt, steps, ids, forced=ref_tokens)
    cos = [cosine(a, b) for a, b in zip(ref_logits, logits)]
    agree = sum(int(a.argmax() == b.argmax()) for a, b in zip(ref_logits, logits))
    return min(cos), agree, ref_tokens


PROMPT = {"input_ids": np.array([[5, 17, 42, 99, 3]], np.int64)}


@pytest.mark.parametrize(
    "fmt, min_cos, min_agree, min_ratio",
    [("int8", 0.9999, 64, 3.9), ("fp8", 0.999, 60, 3.9), ("int4", 0.995, 60, 6.0)],
)
def test_kv_cache_decodes_64_steps_like_the_float_model(tmp_path, fmt, min_cos, min_agree, min_ratio):
    src = fixture("llama_gqa_kv") / "model.onnx"
    out = tmp_path / f"llama.{fmt}.onnx"
    model = mmq.compile(str(src), kv_cache=fmt, output=out, progress=False)
    names = [i.name for i in model.graph.input]
    assert "past_key_values.0.key_scale" in names
    assert names.index("past_key_values.0.key_scale") == names.index("past_key_values.0.key") + 1
    outs = [o.name for o in model.graph.output]
    assert "present.1.value_scale" in outs
    worst, agree, _ = compare(src, out, PROMPT, 64)
    ratio = cache_bits_per_token(onnx.load(src), 512) / cache_bits_per_token(model, 512)
    print(f"kv {fmt}: min logits cosine {worst:.5f}, argmax {agree}/64, memory {ratio:.2f}x")
    assert worst >= min_cos, f"{fmt}: min logits cosine {worst:.5f} over 64 steps"
    assert agree >= min_agree, f"{fmt}: argmax agrees on {agree}/64 steps"
    assert ratio >= min_ratio, f"{fmt}: cache memory only {ratio:.2f}x smaller"


def test_int8_kv_cache_generates_the_same_tokens():
    src = fixture("llama_gqa_kv") / "model.onnx"
    model = mmq.compile(str(src), kv_cache="int8", progress=False)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"mmq-kv-{os.getpid()}.onnx")
    onnx.save(model, path)
    try:
        ref, _ = greedy(str(src), PROMPT, 64, ids)
        got, _ = greedy(path, PROMPT, 64, ids)
    finally:
        os.remove(path)
    assert got == ref


# Every dynamic KV-cache cell of the export matrix (three families, three exporters/opsets).
CELLS = sorted(
    c for c in glob.glob(str(fixture("matrix") / "*_kv_*")) if "static" not in c
)


@pytest.mark.parametrize("cell", CELLS, ids=os.path.basename)
@pytest.mark.parametrize("fmt, min_cos", [("int8", 0.999), ("fp8", 0.97), ("int4", 0.97)])
def test_kv_cache_on_every_export_form(tmp_path, cell, fmt, min_cos):
    src = os.path.join(cell, "model.onnx")
    out = tmp_path / "model.onnx"
    mmq.compile(src, kv_cache=fmt, output=out, progress=False)
    # The matrix models have 32 positions.
    prompt = {"input_ids": np.array([[5, 17, 12, 29, 3]], np.int64)}
    worst, agree, _ = compare(src, out, prompt, 24)
    print(f"{os.path.basename(cell)} kv {fmt}: min logits cosine {worst:.5f}, argmax {agree}/24")
    assert worst >= min_cos, f"min logits cosine {worst:.5f}"
    if fmt == "int8":
        assert agree == 24


def test_kv_cache_errors_name_the_problem(tmp_path):
    with pytest.raises(mmq.MmqError, match="no graph has a KV cache"):
        mmq.compile(str(fixture("vit") / "model.onnx"), kv_cache="int8", progress=False)
    with pytest.raises(mmq.MmqError, match=r"writes KV caches as int8 blocks through its plugins"):
        mmq.compile(
            str(fixture("llama_gqa_kv") / "model.onnx"),
            target="trt",
            kv_cache="fp8",
            output=tmp_path / "pkg",
            progress=False,
        )
    with pytest.raises(mmq.MmqError, match="unknown cache format 'int2'"):
        mmq.compile(str(fixture("llama_gqa_kv") / "model.onnx"), kv_cache="int2", progress=False)


def test_image_and_kv_caches_decode_a_multimodal_chat_like_fp32(tmp_path, mmq_bin):
    """CLIP vision tower + projector -> 16 image tokens, prefilled into a LLaMA decoder with a
    KV cache before 5 text tokens, then 64 one-token steps: INT4 image features and an INT8 KV
    cache against fp32 everything."""
    import subprocess

    import onnxruntime as ort

    from decode import with_image_input

    enc = fixture("pipeline") / "vision_encoder.onnx"
    dec = tmp_path / "decoder.onnx"
    onnx.save(with_image_input(onnx.load(fixture("llama_gqa_kv") / "model.onnx"), 64), dec)
    out = tmp_path / "out"
    subprocess.run(
        [mmq_bin, "compile", enc, dec, "--target", "ort", "-o", out,
         "--image-cache", "int4", "--kv-cache", "int8"],
        check=True,
    )
    pixels = np.load(fixture("pipeline") / "inputs.npz")["pixel_values"][:1]
    ids0 = np.array([[0] * 16 + [5, 17, 42, 99, 3]], np.int64)

    # fp32: features as floats, float cache.
    feats = ort.InferenceSession(str(enc)).run(["image_embeds"], {"pixel_values": pixels})[0]
    no_image = np.zeros((1, 0, 64), np.float32)
    ref_tokens, ref_logits = greedy(
        str(dec), {"input_ids": ids0, "image_embeds": feats}, 64,
        lambda t: {"input_ids": t, "image_embeds": no_image},
    )

    # Quantized: the encoder's INT4 codes and binary16 scales go to the decoder as they are.
    qenc = ort.InferenceSession(str(out / "vision_encoder.onnx"))
    codes, scales = qenc.run_with_ort_values(
        ["image_embeds", "image_embeds_scale"],
        {"pixel_values": ort.OrtValue.ortvalue_from_numpy(pixels)},
    )
    assert codes.data_type() == "tensor(int4)" and scales.data_type() == "tensor(float16)"
    assert scales.shape() == [1, 16, 1]
    empty = {
        "image_embeds": ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            np.zeros((1, 0, 64), np.int8), onnx.TensorProto.INT4
        ),
        "image_embeds_scale": ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 0, 1), np.float16)),
    }
    _, logits = greedy(
        str(out / "decoder.onnx"),
        {"input_ids": ids0, "image_embeds": codes, "image_embeds_scale": scales}, 64,
        lambda t: {"input_ids": t, **empty},
        forced=ref_tokens,
    )
    cos = [cosine(a, b) for a, b in zip(ref_logits, logits)]
    agree = sum(int(a.argmax() == b.argmax()) for a, b in zip(ref_logits, logits))
    print(f"image int4 + kv int8: min logits cosine {min(cos):.5f}, argmax {agree}/64")
    assert min(cos) >= 0.99, f"min logits cosine {min(cos):.5f}"
    assert agree >= 62, f"argmax agrees on {agree}/64 steps"
    # An image's features: 16 x 64 fp32 = 4096 bytes against 512 bytes of codes + 32 of scales.
    qbytes = 16 * 64 // 2 + 16 * 2
    assert 16 * 64 * 4 / qbytes >= 7.5


def test_a_model_reading_its_scales_from_the_qparams_table_runs_as_before(tmp_path, mmq_bin):
    import subprocess

    import onnxruntime as ort

    src = fixture("llama_gqa_kv") / "model.onnx"
    base = ["compile", str(src), "--target", "ort", "--quant", "int4", "--no-accuracy"]
    subprocess.run([mmq_bin, *base, "-o", tmp_path / "plain.onnx"], check=True)
    subprocess.run(
        [mmq_bin, *base, "-o", tmp_path / "m.onnx", "--qparams", tmp_path / "m.qpqr"], check=True
    )
    model = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    refs = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert refs and all(
        dict((e.key, e.value) for e in t.external_data)["location"] == "m.qpqr" for t in refs
    )
    feeds = dict(np.load(fixture("llama_gqa_kv") / "inputs.npz"))
    want = ort.InferenceSession(str(tmp_path / "plain.onnx")).run(None, feeds)
    got = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, feeds)
    for a, b in zip(want, got):
        assert np.array_equal(a, b)
    out = subprocess.run(
        [mmq_bin, "qparams", "verify", tmp_path / "m.qpqr"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "checksum matches" in out.stdout
    data = bytearray((tmp_path / "m.qpqr").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "m.qpqr").write_bytes(bytes(data))
    out = subprocess.run(
        [mmq_bin, "qparams", "verify", tmp_path / "m.qpqr"], capture_output=True, text=True
    )
    assert out.returncode == 1 and "checksum" in out.stderr
