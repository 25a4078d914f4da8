//! Precision maps (TOML): parse, and print back what parses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mmq_passes::quant::precision::PrecisionMap;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((map, _)) = PrecisionMap::parse(text) {
        let back = map.to_toml();
        assert!(PrecisionMap::parse(&back).is_ok(), "printed map does not parse:\n{back}");
    }
});
