//! `com.microsoft.GroupQueryAttention` in the interpreter against ONNX Runtime: a first run
//! without a past, decode steps with a past that grows (two rows of different lengths) and with
//! the past as long as the present (onnxruntime-genai's shared buffer), Q/K/V packed in the query,
//! a local window and an explicit scale; the output and both present caches are compared.

/// Writes each case's model, inputs and ONNX Runtime's outputs under `dir/CASE/`.
const MAKE: &str = r#"
import sys, pathlib
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
out = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(11)
N, KV, D = 4, 2, 8
cases = {
    # name: (batch, new tokens, past length, seqlens_k, total, packed, attributes)
    "first_run": (1, 5, 0, [4], 5, False, {}),
    "decode_grown": (2, 1, 6, [6, 4], 7, False, {}),
    "decode_shared": (2, 1, 9, [6, 4], 7, False, {}),
    "packed_window_scale": (1, 3, 4, [6], 7, True, dict(local_window_size=3, scale=0.3)),
}
for name, (b, s, p, seqlens, total, packed, attrs) in cases.items():
    feeds = {}
    if packed:
        feeds["q"] = rng.standard_normal((b, s, (N + 2 * KV) * D)).astype(np.float32)
        ins = ["q", "", ""]
    else:
        feeds["q"] = rng.standard_normal((b, s, N * D)).astype(np.float32)
        feeds["k"] = rng.standard_normal((b, s, KV * D)).astype(np.float32)
        feeds["v"] = rng.standard_normal((b, s, KV * D)).astype(np.float32)
        ins = ["q", "k", "v"]
    if p:
        feeds["past_k"] = rng.standard_normal((b, KV, p, D)).astype(np.float32)
        feeds["past_v"] = rng.standard_normal((b, KV, p, D)).astype(np.float32)
        ins += ["past_k", "past_v"]
    else:
        ins += ["", ""]
    feeds["seqlens_k"] = np.array(seqlens, np.int32)
    feeds["total"] = np.array(total, np.int32)
    ins += ["seqlens_k", "total"]
    node = helper.make_node("GroupQueryAttention", ins, ["y", "present_k", "present_v"],
                            domain="com.microsoft", num_heads=N, kv_num_heads=KV, **attrs)
    g = helper.make_graph([node], name,
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ["y", "present_k", "present_v"]])
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
    let cases = mmq_tests::oracle_cases("contrib-gqa", "the GroupQueryAttention cases", MAKE);
    for case in &cases {
        assert!(
            matches!(case.first_op(), mmq_ir::Op::GroupQueryAttention { .. }),
            "{}: {:?}",
            case.name,
            case.first_op()
        );
        case.check(1e-5);
    }
    assert_eq!(cases.len(), 4);
}
