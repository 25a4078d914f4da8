//! QPQR tables: open (layout validation), read every entry through its offsets, verify.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmq_compiler::qparams::QParamTable;

fuzz_target!(|data: &[u8]| {
    let path = std::env::temp_dir().join(format!("mmq-fuzz-{}.qpqr", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(t) = QParamTable::open(&path) {
        for e in t.entries() {
            let _ = (t.pairs(e), t.raw(e));
        }
        let _ = t.verify();
    }
});
