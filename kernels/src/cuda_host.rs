//! The element math of the CUDA kernels (`kernels/cuda/mmq_quant.cuh`), compiled for the host by
//! `build.rs`, against the Rust reference: every function, bit for bit, over the edges (ties,
//! ±0, NaN, ±Inf, saturation, ±448 and subnormals for FP8, every FP8 code, nibble order, odd
//! lengths).

#![allow(
    unsafe_code,
    reason = "the kernel bodies compiled for the host are C functions"
)]

#[cfg(mmq_host_cuh)]
mod checks {
    use mmq_ir::DType;

    use crate::numeric;
    use crate::quant::{dequantize_value, quantize_value};

    mod ffi {
        unsafe extern "C" {
            pub fn mmq_host_quantize_int(
                x: *const f32,
                n: usize,
                scale: f32,
                zero: i32,
                lo: i32,
                hi: i32,
                out: *mut i32,
            );
            pub fn mmq_host_dequantize_int(
                q: *const i32,
                n: usize,
                scale: f32,
                zero: i32,
                out: *mut f32,
            );
            pub fn mmq_host_encode_e4m3(x: *const f32, n: usize, saturate: i32, out: *mut u8);
            pub fn mmq_host_decode_e4m3(code: *const u8, n: usize, out: *mut f32);
            pub fn mmq_host_pack_int4(v: *const i32, n: usize, out: *mut u8);
            pub fn mmq_host_unpack_int4(byte: u8, index: i32, is_signed: i32) -> i32;
            pub fn mmq_host_div_recip(x: *const f32, n: usize, s: f32, out: *mut f32) -> i32;
        }
    }

    /// Safe wrappers over the host build (each writes exactly `n` outputs for `n` inputs).
    mod host {
        use super::ffi;

        pub fn quantize_int(x: &[f32], scale: f32, zero: i32, (lo, hi): (i32, i32)) -> Vec<i32> {
            let mut out = vec![0; x.len()];
            // SAFETY: both buffers hold `x.len()` elements.
            unsafe {
                ffi::mmq_host_quantize_int(
                    x.as_ptr(),
                    x.len(),
                    scale,
                    zero,
                    lo,
                    hi,
                    out.as_mut_ptr(),
                )
            };
            out
        }

        pub fn dequantize_int(q: &[i32], scale: f32, zero: i32) -> Vec<f32> {
            let mut out = vec![0.0; q.len()];
            // SAFETY: both buffers hold `q.len()` elements.
            unsafe {
                ffi::mmq_host_dequantize_int(q.as_ptr(), q.len(), scale, zero, out.as_mut_ptr())
            };
            out
        }

        pub fn encode_e4m3(x: &[f32], saturate: bool) -> Vec<u8> {
            let mut out = vec![0; x.len()];
            // SAFETY: both buffers hold `x.len()` elements.
            unsafe {
                ffi::mmq_host_encode_e4m3(
                    x.as_ptr(),
                    x.len(),
                    i32::from(saturate),
                    out.as_mut_ptr(),
                )
            };
            out
        }

        pub fn decode_e4m3(codes: &[u8]) -> Vec<f32> {
            let mut out = vec![0.0; codes.len()];
            // SAFETY: both buffers hold `codes.len()` elements.
            unsafe { ffi::mmq_host_decode_e4m3(codes.as_ptr(), codes.len(), out.as_mut_ptr()) };
            out
        }

        pub fn pack_int4(v: &[i32]) -> Vec<u8> {
            let mut out = vec![0; v.len().div_ceil(2)];
            // SAFETY: `out` holds ceil(n / 2) bytes, what the function writes for `n` values.
            unsafe { ffi::mmq_host_pack_int4(v.as_ptr(), v.len(), out.as_mut_ptr()) };
            out
        }

        /// `x / s` by the kernels' reciprocal, or `None` where `s` is out of its range.
        pub fn div_recip(x: &[f32], s: f32) -> Option<Vec<f32>> {
            let mut out = vec![0.0; x.len()];
            // SAFETY: both buffers hold `x.len()` elements.
            let fast = unsafe { ffi::mmq_host_div_recip(x.as_ptr(), x.len(), s, out.as_mut_ptr()) };
            (fast != 0).then_some(out)
        }

        pub fn unpack_int4(byte: u8, index: i32, signed: bool) -> i32 {
            // SAFETY: a pure function of its arguments.
            unsafe { ffi::mmq_host_unpack_int4(byte, index, i32::from(signed)) }
        }
    }

    /// Values that exercise rounding and saturation at `scale`: ties `(k + 0.5) * scale`, their
    /// neighbours, signed zeros, NaN, infinities, huge and subnormal values, and a pseudo-random
    /// spread.
    fn edge_values(scale: f32) -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
            3e38,
        ];
        for k in -300..300 {
            let t = (k as f32 + 0.5) * scale;
            v.extend([
                t,
                f32::from_bits(t.to_bits() + 1),
                f32::from_bits(t.to_bits().saturating_sub(1)),
            ]);
            v.push(k as f32 * scale);
        }
        let mut s: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let bits = (s >> 32) as u32;
            let x = f32::from_bits(bits);
            v.push(x);
            v.push((bits as f32 / u32::MAX as f32 - 0.5) * 600.0 * scale);
        }
        v
    }

    /// Every f32 with its 12 low mantissa bits zero (all signs, exponents and the top 11 mantissa
    /// bits), and the midpoints and neighbours of every finite FP8 E4M3 value.
    fn e4m3_values() -> Vec<f32> {
        let mut v: Vec<f32> = (0..1u32 << 20).map(|i| f32::from_bits(i << 12)).collect();
        let finite: Vec<f32> = (0..0x7fu8)
            .map(|c| numeric::decode(DType::F8E4M3FN, c))
            .collect();
        for w in finite.windows(2) {
            let mid = (w[0] + w[1]) / 2.0;
            for m in [mid, -mid] {
                v.extend([
                    m,
                    f32::from_bits(m.to_bits() + 1),
                    f32::from_bits(m.to_bits() - 1),
                ]);
            }
        }
        v.extend([
            448.0,
            -448.0,
            464.0,
            -464.0,
            464.0001,
            479.9,
            480.0,
            1e30,
            2f32.powi(-9),
            2f32.powi(-10),
            3.0 * 2f32.powi(-11),
        ]);
        v
    }

    fn same_bits(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn integer_quantization_matches_the_reference() {
        for dtype in [DType::I8, DType::U8, DType::I4, DType::U4] {
            let range = crate::quant::integer_range(dtype).expect("integer type");
            let zeros: &[i32] = if range.0 < 0 {
                &[0, 3, -5]
            } else {
                &[0, 8, range.1 / 2 + 1]
            };
            for &scale in &[1.0f32, 0.1, 0.007_812_5, 3.7, 1e-6] {
                let x = edge_values(scale);
                for &zero in zeros {
                    let got = host::quantize_int(&x, scale, zero, range);
                    for (xi, g) in x.iter().zip(&got) {
                        let want = quantize_value(*xi, scale, zero, range);
                        assert_eq!(*g, want, "{dtype:?} x={xi:e} scale={scale} zero={zero}");
                    }
                    let q: Vec<i32> = (range.0..=range.1).collect();
                    let back = host::dequantize_int(&q, scale, zero);
                    for (qi, b) in q.iter().zip(back) {
                        let want =
                            dequantize_value(f64::from(*qi), f64::from(scale), f64::from(zero))
                                as f32;
                        assert!(
                            same_bits(b, want),
                            "{dtype:?} q={qi} scale={scale} zero={zero}: {b} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn fp8_e4m3_matches_the_reference_on_every_edge() {
        let x = e4m3_values();
        for saturate in [true, false] {
            let got = host::encode_e4m3(&x, saturate);
            let mut bad = Vec::new();
            for (xi, g) in x.iter().zip(&got) {
                let want = numeric::encode(DType::F8E4M3FN, *xi, saturate);
                if *g != want && bad.len() < 10 {
                    bad.push(format!(
                        "x={xi:e} ({:#010x}) saturate={saturate}: {g:#04x} vs {want:#04x}",
                        xi.to_bits()
                    ));
                }
            }
            assert!(bad.is_empty(), "{}", bad.join("\n"));
        }
        // ±448 is the largest finite value; beyond it saturation or NaN.
        assert_eq!(
            host::encode_e4m3(&[448.0, -448.0, 1e9, f32::INFINITY], true),
            [0x7e, 0xfe, 0x7e, 0x7e]
        );
        assert_eq!(
            host::encode_e4m3(&[1e9, f32::NEG_INFINITY, f32::NAN], false),
            [0xff, 0xff, 0xff]
        );
        let codes: Vec<u8> = (0..=255).collect();
        let decoded = host::decode_e4m3(&codes);
        for (c, d) in codes.iter().zip(decoded) {
            assert!(
                same_bits(d, numeric::decode(DType::F8E4M3FN, *c)),
                "code {c:#04x}: {d}"
            );
        }
    }

    /// The kernels divide by a shared scale through its reciprocal (`mmq_div_fast`): the quotient
    /// must be `x / s` bit for bit wherever a code can depend on it (|x / s| >= 2^-12), and keep
    /// its sign below that. Scales with adversarial significands (all ones, near one, near a power
    /// of two), dividends near multiples of s by half-integers and powers of two (and a few ulps
    /// off), random bits, and the special values. `tools/check_recip_div.cpp` runs the same over
    /// 10^9 pairs.
    #[test]
    fn division_by_the_reciprocal_is_the_division_where_codes_depend_on_it() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut checked = 0usize;
        for round in 0..40_000 {
            let r = next();
            let man = match round % 6 {
                0 => 0x7f_ffff,
                1 => 0x7f_ffff - (r >> 40) as u32 % 256,
                2 => (r >> 40) as u32 % 256,
                3 => 0,
                _ => (r >> 8) as u32 & 0x7f_ffff,
            };
            // Exponents over the whole fast range, [2^-60, 2^60).
            let s = f32::from_bits(((67 + (r % 120) as u32) << 23) | man);
            let mut x: Vec<f32> = (0..96)
                .map(|i| {
                    let r = next();
                    let v = match i % 4 {
                        0 => ((r % 1024) as f32 - 512.0 + 0.5) * s,
                        1 => {
                            (((r >> 10) % (1 << 24)) as f32 / 16_777_216.0 + 0.5)
                                * 2f32.powi((r >> 40) as i32 % 26 - 12)
                                * s
                        }
                        2 => f32::from_bits(r as u32),
                        _ => 2f32.powi((r >> 20) as i32 % 20 - 10) * s,
                    };
                    let v = f32::from_bits(
                        v.to_bits()
                            .wrapping_add(((r >> 50) % 9) as u32)
                            .wrapping_sub(4),
                    );
                    if r & 1 == 1 { -v } else { v }
                })
                .collect();
            x.extend([
                0.0,
                -0.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                f32::NAN,
                f32::MAX,
                -f32::MAX,
                f32::from_bits(1),
                -f32::from_bits(1),
                f32::MIN_POSITIVE,
            ]);
            let got = host::div_recip(&x, s).expect("a scale in the fast range");
            for (&xi, &g) in x.iter().zip(&got) {
                let want = xi / s;
                if want.is_nan() {
                    assert!(g.is_nan(), "{xi:e} / {s:e}: {g:e}");
                } else if want.abs() >= 2f32.powi(-12) {
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{xi:e} / {s:e}: {g:e} vs {want:e}"
                    );
                } else {
                    assert!(
                        g.is_sign_negative() == want.is_sign_negative() && g.abs() < 2f32.powi(-12),
                        "{xi:e} / {s:e}: {g:e} vs {want:e}"
                    );
                }
                checked += 1;
            }
        }
        assert!(checked > 4_000_000);
        // The range's ends, and past them (the kernels divide there).
        for (s, fast) in [
            (2f32.powi(-60), true),
            (2f32.powi(60), true),
            (-2f32.powi(60), true),
            (2f32.powi(-61), false),
            (2f32.powi(61), false),
            (0.0, false),
            (f32::INFINITY, false),
            (f32::NAN, false),
        ] {
            assert_eq!(host::div_recip(&[1.0], s).is_some(), fast, "{s:e}");
        }
    }

    #[test]
    fn int4_packs_the_first_value_in_the_low_nibble() {
        let v: Vec<i32> = (-8..8).chain([3]).collect(); // odd length: the last byte's high nibble is 0
        let packed = host::pack_int4(&v);
        assert_eq!(packed.len(), 9);
        for (i, x) in v.iter().enumerate() {
            let byte = packed[i / 2];
            assert_eq!(
                host::unpack_int4(byte, (i % 2) as i32, true),
                *x,
                "value {i}"
            );
            // The reference's nibble decoding agrees.
            let nibble = if i % 2 == 0 { byte & 0xf } else { byte >> 4 };
            assert_eq!(numeric::decode(DType::I4, nibble) as i32, *x);
            assert_eq!(numeric::encode(DType::I4, *x as f32, true), nibble);
        }
        assert_eq!(packed[8] >> 4, 0);
        assert_eq!(host::unpack_int4(0xf1, 1, false), 15);
        assert_eq!(host::unpack_int4(0xf1, 0, false), 1);
    }
}

/// Without a C++ compiler the element math is not checked: say so instead of passing.
#[cfg(not(mmq_host_cuh))]
#[test]
fn element_math_is_checked_on_the_host() {
    panic!(
        "kernels/cuda/mmq_quant.cuh was not compiled for the host (no C++ compiler; see the \
         build warning): its element math is unchecked. Install g++ or clang++."
    );
}

/// The kernels' constant division (`MmqDiv`) is exact for every 32-bit dividend: each divisor
/// over its edges (0, d - 1, d, d + 1, multiples, 2^32 - 1) and a pseudo-random sweep.
#[test]
fn the_kernels_constant_division_is_exact() {
    use crate::cuda::RawDiv;
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut divisors: Vec<u64> = vec![
        1,
        2,
        3,
        5,
        7,
        8,
        10,
        37,
        40,
        128,
        641,
        4096,
        11008,
        65_537,
        1 << 31,
        (1 << 31) - 1,
        (1 << 32) - 1,
    ];
    divisors.extend((0..200).map(|_| 1 + next() % u64::from(u32::MAX)));
    divisors.extend((0..200).map(|_| 1 + next() % 5000));
    for d in divisors {
        let div = RawDiv::by(d);
        let mut xs: Vec<u64> = vec![0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, u64::from(u32::MAX)];
        xs.extend((1..64).map(|k| d * k + k % 3));
        xs.extend((0..500).map(|_| next() & u64::from(u32::MAX)));
        for x in xs.into_iter().filter(|&x| x <= u64::from(u32::MAX)) {
            assert_eq!(u64::from(div.quotient(x as u32)), x / d, "{x} / {d}");
        }
    }
}
