//! ONNX frontend.
