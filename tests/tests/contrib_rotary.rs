//! `com.microsoft.RotaryEmbedding` in the interpreter against ONNX Runtime: 3-D input with
//! `num_heads`, 4-D input, interleaved and half-split pairs, a partial rotary dimension, and
//! position ids as one start position or one id per token.

/// Writes each case's model, inputs and ONNX Runtime's outputs under `dir/CASE/`.
const MAKE: &str = r#"
import sys, pathlib
import numpy as np, onnx, onnxruntime as ort
from onnx import helper, TensorProto
out = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(7)
cases = {
    # name: (input shape, attributes, position ids)
    "3d_half": ((2, 5, 32), dict(num_heads=4), np.array([3], np.int64)),
    "3d_interleaved": ((2, 5, 32), dict(num_heads=4, interleaved=1), np.array([[0, 1, 2, 3, 4], [7, 6, 5, 4, 3]], np.int64)),
    "4d_partial": ((1, 2, 6, 16), dict(rotary_embedding_dim=8, num_heads=2), np.array([[5, 6, 7, 8, 9, 10]], np.int64)),
}
for name, (shape, attrs, pos) in cases.items():
    d = shape[-1] // attrs.get("num_heads", 1) if len(shape) == 3 else shape[-1]
    rd = attrs.get("rotary_embedding_dim", d)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain="com.microsoft", **attrs)
    g = helper.make_graph([node], name, [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
        helper.make_tensor_value_info("pos", TensorProto.INT64, pos.shape),
        helper.make_tensor_value_info("cos", TensorProto.FLOAT, (16, rd // 2)),
        helper.make_tensor_value_info("sin", TensorProto.FLOAT, (16, rd // 2)),
    ], [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    angle = np.arange(16)[:, None] / (100.0 ** (np.arange(rd // 2)[None, :] / (rd // 2)))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32), "pos": pos,
             "cos": np.cos(angle).astype(np.float32), "sin": np.sin(angle).astype(np.float32)}
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    onnx.save(m, d / "model.onnx")
    y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.savez(d / "inputs.npz", **feeds)
    np.savez(d / "outputs.npz", y=y)
print("\n".join(cases))
"#;

#[test]
fn contrib_rotary_embedding_matches_onnx_runtime() {
    mmq_tests::check_oracle_cases(
        "contrib-rotary",
        "the RotaryEmbedding cases",
        MAKE,
        mmq_ir::OpKind::MsRotaryEmbedding,
        3,
        1e-5,
    );
}
