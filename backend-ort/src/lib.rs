//! ONNX Runtime backend.
