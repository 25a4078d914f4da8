//! QPQR tables: open (layout validation), read every entry through its offsets, verify. The
//! input's checksum is recomputed first (as a tool that edits a table in place would leave
//! it), so `verify` goes past the checksum to the meaning of the entries: scales, zero points,
//! group sizes, names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmq_compiler::qparams::QParamTable;

/// Where a table stores its checksum: xxh3-64 of the file with these 8 bytes zeroed.
const CHECKSUM_AT: usize = 56;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    if bytes.len() >= CHECKSUM_AT + 8 {
        bytes[CHECKSUM_AT..CHECKSUM_AT + 8].fill(0);
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
        bytes[CHECKSUM_AT..CHECKSUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
    }
    let path = std::env::temp_dir().join(format!("mmq-fuzz-{}.qpqr", std::process::id()));
    if std::fs::write(&path, &bytes).is_err() {
        return;
    }
    if let Ok(t) = QParamTable::open(&path) {
        for e in t.entries() {
            let _ = (t.pairs(e), t.raw(e));
        }
        let _ = t.verify();
    }
});
