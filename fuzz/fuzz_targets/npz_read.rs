//! `.npz` archives (and the `.npy` arrays in them) as inputs and calibration samples arrive:
//! the archive layer (members, names, checksums), each member's header, then the data.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = mmq_kernels::io::npz_headers_from_bytes(data);
    let _ = mmq_kernels::io::npz_from_bytes(data);
    let _ = mmq_kernels::io::npy_from_bytes(data);
});
