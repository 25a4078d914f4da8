//! ONNX bytes: decode and import, then (when that succeeds) verify and export again.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = mmq_onnx::LoadOptions::default();
    let Ok(m) = mmq_onnx::load_bytes(bytes::Bytes::copy_from_slice(data), None, "fuzz.onnx", &opts)
    else {
        return;
    };
    if mmq_ir::verify::verify(&m).is_err() {
        return;
    }
    for e in &m.entries {
        let _ = mmq_backend_ort::to_model_proto(&m, e.graph, &mut mmq_backend_ort::InlineSink);
    }
});
