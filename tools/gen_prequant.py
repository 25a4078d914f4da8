"""Writes tests/fixtures/prequant/: a small MLP whose weights the model already stores quantized,
in the forms exporters write (run with .venv/bin/python; the files are committed):

- `Mul(Cast(W_i8), s)`: symmetric int8 codes, one scale per output column (what
  `torch.onnx` writes for `w_int8.float() * scale`);
- `Mul(Sub(Cast(W_u8), z), s)`: asymmetric uint8 codes, one f32 zero point, per-column scales;
- `Mul(Sub(Cast(W_i8), Cast(z_i8)), s)`: per-column int8 zero points stored as codes;
- `DequantizeLinear(W_i8, s, axis=1)`: weight-only Q/DQ.

`outputs.npz` holds ONNX Runtime's outputs with graph optimizations off (the model's own float
arithmetic; ONNX Runtime's default optimizations compute the DequantizeLinear product with int8
activations).
"""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "prequant"
D, H, C = 64, 96, 16


def main() -> None:
    rng = np.random.default_rng(7)
    inits, nodes = [], []

    def const(name, a):
        inits.append(nh.from_array(a, name))
        return name

    def scales(n, fan_in):
        # Activations of about unit size through the ReLUs: codes up to 127 times about
        # 3 / (127 sqrt(fan_in)).
        return (rng.random(n).astype(np.float32) + 0.5) * 3 / (127 * np.sqrt(fan_in)).astype(np.float32)

    # fc1: Cast(int8) * per-column scale
    const("fc1.codes", rng.integers(-127, 128, (D, H)).astype(np.int8))
    const("fc1.scale", scales(H, D))
    nodes += [h.make_node("Cast", ["fc1.codes"], ["fc1.w_float"], to=T.FLOAT, name="fc1/cast"),
              h.make_node("Mul", ["fc1.w_float", "fc1.scale"], ["fc1.weight"], name="fc1/scale"),
              h.make_node("MatMul", ["x", "fc1.weight"], ["h1"], name="fc1/matmul"),
              h.make_node("Relu", ["h1"], ["a1"], name="act1")]
    # fc2: (Cast(uint8) - z) * per-column scale, one f32 zero point
    const("fc2.codes", rng.integers(0, 256, (H, H)).astype(np.uint8))
    const("fc2.zero", np.array(128.0, np.float32))
    const("fc2.scale", scales(H, H).reshape(1, H))
    nodes += [h.make_node("Cast", ["fc2.codes"], ["fc2.w_float"], to=T.FLOAT, name="fc2/cast"),
              h.make_node("Sub", ["fc2.w_float", "fc2.zero"], ["fc2.w_centered"], name="fc2/zero"),
              h.make_node("Mul", ["fc2.w_centered", "fc2.scale"], ["fc2.weight"], name="fc2/scale"),
              h.make_node("MatMul", ["a1", "fc2.weight"], ["h2"], name="fc2/matmul"),
              h.make_node("Relu", ["h2"], ["a2"], name="act2")]
    # fc3: (Cast(int8) - Cast(int8 zero points)) * per-column scale
    const("fc3.codes", rng.integers(-100, 100, (H, H)).astype(np.int8))
    const("fc3.zero", rng.integers(-8, 8, H).astype(np.int8))
    const("fc3.scale", scales(H, H))
    nodes += [h.make_node("Cast", ["fc3.codes"], ["fc3.w_float"], to=T.FLOAT, name="fc3/cast"),
              h.make_node("Cast", ["fc3.zero"], ["fc3.z_float"], to=T.FLOAT, name="fc3/cast_zero"),
              h.make_node("Sub", ["fc3.w_float", "fc3.z_float"], ["fc3.w_centered"], name="fc3/zero"),
              h.make_node("Mul", ["fc3.scale", "fc3.w_centered"], ["fc3.weight"], name="fc3/scale"),
              h.make_node("MatMul", ["a2", "fc3.weight"], ["h3"], name="fc3/matmul"),
              h.make_node("Relu", ["h3"], ["a3"], name="act3")]
    # head: weight-only DequantizeLinear
    const("head.codes", rng.integers(-127, 128, (H, C)).astype(np.int8))
    const("head.scale", scales(C, H))
    nodes += [h.make_node("DequantizeLinear", ["head.codes", "head.scale"], ["head.weight"], axis=1,
                          name="head/dequantize"),
              h.make_node("MatMul", ["a3", "head.weight"], ["logits"], name="head/matmul")]
    g = h.make_graph(nodes, "prequant", [h.make_tensor_value_info("x", T.FLOAT, ["batch", D])],
                     [h.make_tensor_value_info("logits", T.FLOAT, ["batch", C])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 21)], producer_name="gen_prequant")
    m.ir_version = 10
    onnx.checker.check_model(m, full_check=True)
    OUT.mkdir(parents=True, exist_ok=True)
    onnx.save(m, OUT / "model.onnx")
    x = rng.standard_normal((2, D)).astype(np.float32)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    (y,) = ort.InferenceSession(m.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.savez(OUT / "inputs.npz", x=x)
    np.savez(OUT / "outputs.npz", logits=y)


if __name__ == "__main__":
    main()
