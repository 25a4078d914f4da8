//! `com.microsoft.GroupQueryAttention` in the interpreter against ONNX Runtime: a first run
//! without a past, decode steps with a past that grows (two rows of different lengths) and with
//! the past as long as the present (onnxruntime-genai's shared buffer), Q/K/V packed in the query,
//! a local window and an explicit scale, and INT8 caches with static scales (per tensor and per
//! channel: a first run, a grown past and a shared buffer, with values that round half to even
//! and saturate), and the op's own rotary embedding (`do_rotary`: packed and not, positions from
//! the past or from `position_ids`, interleaved and partial, before an INT8 cache); the output
//! and both present caches are compared.

/// Writes each case's model, inputs and ONNX Runtime's outputs under `dir/CASE/`.
const MAKE: &str = r#"
import sys, pathlib
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
out = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(11)
N, KV = 4, 2
cases = {
    # name: (batch, new tokens, past length, seqlens_k, total, packed, attributes, quantized,
    #        rotary)
    "first_run": (1, 5, 0, [4], 5, False, {}, None, None),
    "decode_grown": (2, 1, 6, [6, 4], 7, False, {}, None, None),
    "decode_shared": (2, 1, 9, [6, 4], 7, False, {}, None, None),
    "packed_window_scale": (1, 3, 4, [6], 7, True, dict(local_window_size=3, scale=0.3), None, None),
    "int8_channel_first_run": (1, 5, 0, [4], 5, False, {}, "PER_CHANNEL", None),
    "int8_channel_grown": (2, 1, 6, [6, 4], 7, False, {}, "PER_CHANNEL", None),
    "int8_tensor_shared": (1, 2, 9, [6], 7, False, {}, "PER_TENSOR", None),
    "rotary_packed_first_run": (1, 5, 0, [4], 5, True, {}, None, dict(half=8)),
    "rotary_positions_interleaved_partial": (
        2, 1, 6, [6, 4], 7, False, {}, None, dict(half=8, D=32, interleaved=1, positions=[9, 2])),
    "rotary_int8_shared": (1, 2, 9, [6], 7, True, {}, "PER_CHANNEL", dict(half=8)),
}
for name, (b, s, p, seqlens, total, packed, attrs, quant, rot) in cases.items():
    # ONNX Runtime rotates head sizes that are multiples of 16, and multiples of 16 channels.
    D = rot.get("D", 16) if rot else 8
    feeds = {}
    if packed:
        feeds["q"] = rng.standard_normal((b, s, (N + 2 * KV) * D)).astype(np.float32)
        ins = ["q", "", ""]
    else:
        feeds["q"] = rng.standard_normal((b, s, N * D)).astype(np.float32)
        feeds["k"] = rng.standard_normal((b, s, KV * D)).astype(np.float32)
        feeds["v"] = rng.standard_normal((b, s, KV * D)).astype(np.float32)
        ins = ["q", "k", "v"]
    if quant:
        shape = (1, KV, 1, D) if quant == "PER_CHANNEL" else (1,)
        # Powers of two: a value of a half-way multiple of its scale rounds to even exactly.
        feeds["k_scale"] = (2.0 ** rng.integers(-6, -3, shape)).astype(np.float32)
        feeds["v_scale"] = (2.0 ** rng.integers(-6, -3, shape)).astype(np.float32)
        ks = np.broadcast_to(feeds["k_scale"].reshape(-1, 1, D) if quant == "PER_CHANNEL"
                             else feeds["k_scale"], (KV, 1, D)).reshape(KV * D)
        if not packed and not rot:
            feeds["k"][..., :4] = ks[:4] * np.array([2.5, -2.5, 3.5, 200.0], np.float32)
        attrs = dict(attrs, k_quant_type=quant, v_quant_type=quant, kv_cache_bit_width=8)
    cache = np.int8 if quant else np.float32
    if p or quant:  # a quantized cache's type is its past's: an empty past on a first run
        if quant:
            feeds["past_k"] = rng.integers(-128, 128, (b, KV, p, D)).astype(np.int8)
            feeds["past_v"] = rng.integers(-128, 128, (b, KV, p, D)).astype(np.int8)
        else:
            feeds["past_k"] = rng.standard_normal((b, KV, p, D)).astype(np.float32)
            feeds["past_v"] = rng.standard_normal((b, KV, p, D)).astype(np.float32)
        ins += ["past_k", "past_v"]
    else:
        ins += ["", ""]
    feeds["seqlens_k"] = np.array(seqlens, np.int32)
    feeds["total"] = np.array(total, np.int32)
    ins += ["seqlens_k", "total"]
    # Inputs 7 to 13: cos_cache, sin_cache, position_ids, attention_bias, head_sink, k_scale,
    # v_scale.
    extra = [""] * 7
    if rot:
        half = rot["half"]
        angles = np.outer(np.arange(32), 1 / 10000 ** (np.arange(half) / half)).astype(np.float32)
        feeds["cos"], feeds["sin"] = np.cos(angles), np.sin(angles)
        extra[0:2] = ["cos", "sin"]
        if "positions" in rot:
            feeds["pos"] = (np.array(rot["positions"])[:, None] + np.arange(s)[None]).astype(np.int64)
            extra[2] = "pos"
        attrs = dict(attrs, do_rotary=1, rotary_interleaved=rot.get("interleaved", 0))
    if quant:
        extra[5:7] = ["k_scale", "v_scale"]
    while extra and not extra[-1]:
        extra.pop()
    ins += extra
    node = helper.make_node("GroupQueryAttention", ins, ["y", "present_k", "present_v"],
                            domain="com.microsoft", num_heads=N, kv_num_heads=KV, **attrs)
    g = helper.make_graph([node], name,
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in feeds.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        + [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(cache)), None)
           for o in ["present_k", "present_v"]])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    y, pk, pv = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(m, d / "model.onnx")
    np.savez(d / "inputs.npz", **feeds)
    np.savez(d / "outputs.npz", y=y, present_k=pk, present_v=pv)
print("\n".join(cases))
"#;

#[test]
fn contrib_group_query_attention_matches_onnx_runtime() {
    mmq_tests::check_oracle_cases(
        "contrib-gqa",
        "the GroupQueryAttention cases",
        MAKE,
        mmq_ir::OpKind::GroupQueryAttention,
        10,
        1e-5,
    );
}
