//! `.mmir` text: parse, then (when that succeeds) verify and print.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((m, _)) = mmq_ir::text::parse(text)
        && mmq_ir::verify::verify(&m).is_ok()
    {
        let _ = mmq_ir::text::print(&m);
    }
});
