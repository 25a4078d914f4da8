//! `.npz` archives (and the `.npy` arrays in them) as inputs and calibration samples arrive:
//! the archive layer (members, names, checksums), each member's header, then the data. Arrays
//! are limited to 16 MiB (`--max-memory`), so an inflate bomb among the seeds (the hostile
//! corpus holds one of 64 MiB) is refused from its header instead of inflated for seconds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    mmq_kernels::set_memory_limit(16 << 20);
    let _ = mmq_kernels::io::npz_headers_from_bytes(data);
    let _ = mmq_kernels::io::npz_from_bytes(data);
    let _ = mmq_kernels::io::npy_from_bytes(data);
});
