//! Element codes of the small float and integer types (fp8, fp4, e8m0, int4, int2) and their
//! conversions, with ONNX's rules: round to nearest even, saturation or NaN/inf on overflow.

use mmq_ir::DType;

/// Layout of a small float format.
#[derive(Clone, Copy, Debug)]
struct Fmt {
    exp_bits: u32,
    man_bits: u32,
    bias: i32,
    /// "fnuz": no negative zero, NaN is 0x80, no infinities.
    uz: bool,
    /// Has infinities (E5M2).
    inf: bool,
}

fn fmt(dtype: DType) -> Option<Fmt> {
    Some(match dtype {
        DType::F8E4M3FN => Fmt {
            exp_bits: 4,
            man_bits: 3,
            bias: 7,
            uz: false,
            inf: false,
        },
        DType::F8E4M3FNUZ => Fmt {
            exp_bits: 4,
            man_bits: 3,
            bias: 8,
            uz: true,
            inf: false,
        },
        DType::F8E5M2 => Fmt {
            exp_bits: 5,
            man_bits: 2,
            bias: 15,
            uz: false,
            inf: true,
        },
        DType::F8E5M2FNUZ => Fmt {
            exp_bits: 5,
            man_bits: 2,
            bias: 16,
            uz: true,
            inf: false,
        },
        DType::F4E2M1 => Fmt {
            exp_bits: 2,
            man_bits: 1,
            bias: 1,
            uz: false,
            inf: false,
        },
        _ => return None,
    })
}

impl Fmt {
    fn bits(self) -> u32 {
        1 + self.exp_bits + self.man_bits
    }
    fn sign_bit(self) -> u8 {
        1 << (self.bits() - 1)
    }
    /// The largest finite magnitude code (without sign).
    fn max_code(self) -> u8 {
        let all = (1u16 << (self.bits() - 1)) as u8 - 1;
        if self.inf {
            // E5M2: exponent all-ones is inf/NaN.
            all - ((1 << self.man_bits) as u8 - 1) - 1
        } else if self.uz || self.exp_bits == 2 {
            all
        } else {
            // E4M3FN: S.1111.111 is NaN.
            all - 1
        }
    }
    fn nan_code(self) -> u8 {
        if self.uz {
            0x80
        } else if self.exp_bits == 2 {
            // fp4 has no NaN; ONNX maps NaN to the largest positive value's sign-less code 0x7.
            0x7
        } else {
            ((1u16 << (self.bits() - 1)) as u8 - 1) | self.sign_bit()
        }
    }
    fn magnitude(self, code: u8) -> f64 {
        let man_mask = (1u8 << self.man_bits) - 1;
        let e = i32::from((code >> self.man_bits) & ((1 << self.exp_bits) - 1));
        let m = f64::from(code & man_mask);
        let scale = f64::from(1u32 << self.man_bits);
        if e == 0 {
            m / scale * 2f64.powi(1 - self.bias)
        } else {
            (1.0 + m / scale) * 2f64.powi(e - self.bias)
        }
    }
}

/// The value of `code` in a small type. Integers (u4, i4, u2, i2) decode to their integer value.
pub fn decode(dtype: DType, code: u8) -> f32 {
    match dtype {
        DType::U4 => f32::from(code & 0xf),
        DType::I4 => f32::from(((code << 4) as i8) >> 4),
        DType::U2 => f32::from(code & 0x3),
        DType::I2 => f32::from(((code << 6) as i8) >> 6),
        DType::F8E8M0 => {
            if code == 0xff {
                f32::NAN
            } else {
                2f32.powi(i32::from(code) - 127)
            }
        }
        _ => {
            let Some(f) = fmt(dtype) else { return f32::NAN };
            let sign = code & f.sign_bit() != 0;
            let mag_code = code & !f.sign_bit();
            if f.uz && code == 0x80 {
                return f32::NAN;
            }
            if !f.uz && f.exp_bits > 2 && mag_code > f.max_code() {
                if f.inf && mag_code == f.max_code() + 1 {
                    return if sign {
                        f32::NEG_INFINITY
                    } else {
                        f32::INFINITY
                    };
                }
                return f32::NAN;
            }
            let v = f.magnitude(mag_code) as f32;
            if sign { -v } else { v }
        }
    }
}

/// Rounds half to even.
pub fn round_half_even(x: f64) -> f64 {
    // Adding and removing 2^52 (with x's sign) rounds to an integer, ties to even, below 2^52;
    // larger values (and NaN, ±∞) already are integers. `round_ties_even` is a library call on
    // the baseline x86-64 target (no SSE4.1), and this sits in every element of QuantizeLinear.
    const TWO52: f64 = 4_503_599_627_370_496.0;
    if x.abs() < TWO52 {
        let m = TWO52.copysign(x);
        ((x + m) - m).copysign(x)
    } else {
        x
    }
}

/// The code of `x` in a small float type, rounding to nearest even. With `saturate`, values out of
/// range (and infinities, for types without them) become the largest finite value of that sign;
/// without it they become NaN (or infinity for E5M2). Integer types round half to even and clamp.
pub fn encode(dtype: DType, x: f32, saturate: bool) -> u8 {
    match dtype {
        DType::U4 => round_half_even(f64::from(x)).clamp(0.0, 15.0) as u8,
        DType::I4 => (round_half_even(f64::from(x)).clamp(-8.0, 7.0) as i8 as u8) & 0xf,
        DType::U2 => round_half_even(f64::from(x)).clamp(0.0, 3.0) as u8,
        DType::I2 => (round_half_even(f64::from(x)).clamp(-2.0, 1.0) as i8 as u8) & 0x3,
        DType::F8E8M0 => encode_e8m0(x, saturate),
        _ => {
            let Some(f) = fmt(dtype) else { return 0 };
            encode_float(f, x, saturate)
        }
    }
}

fn encode_e8m0(x: f32, saturate: bool) -> u8 {
    if x.is_nan() || x <= 0.0 && !saturate {
        return 0xff;
    }
    if x.is_infinite() {
        return if saturate { 0xfe } else { 0xff };
    }
    if x <= 0.0 {
        return 0;
    }
    // Round the exponent up (ONNX's default rounding for E8M0 is "up").
    let e = f64::from(x).log2().ceil() as i32;
    let code = e + 127;
    if code > 254 {
        if saturate { 0xfe } else { 0xff }
    } else {
        code.max(0) as u8
    }
}

fn encode_float(f: Fmt, x: f32, saturate: bool) -> u8 {
    if x.is_nan() {
        return f.nan_code();
    }
    let sign = x.is_sign_negative();
    let sign_bits = if sign { f.sign_bit() } else { 0 };
    let overflow = || {
        if saturate || f.exp_bits == 2 {
            f.max_code() | sign_bits
        } else if f.inf {
            (f.max_code() + 1) | sign_bits
        } else {
            f.nan_code()
        }
    };
    let a = f64::from(x.abs());
    if x.is_infinite() {
        return overflow();
    }
    if a == 0.0 {
        return if f.uz { 0 } else { sign_bits };
    }
    let min_normal_exp = 1 - f.bias;
    let exp = (a.log2().floor() as i32).max(min_normal_exp);
    // Quantum at this exponent.
    let quantum = 2f64.powi(exp - f.man_bits as i32);
    let q = round_half_even(a / quantum);
    // code = ((exp + bias) << man_bits) + (q - 2^man_bits) for normal numbers, and q for
    // subnormals (biased exponent 0); both are `(exp + bias - 1) * 2^man_bits + q`, and a mantissa
    // that rounds up to 2^(man_bits + 1) carries into the exponent by itself.
    let code = f64::from(exp + f.bias - 1) * f64::from(1u32 << f.man_bits) + q;
    if code > f64::from(f.max_code()) {
        return overflow();
    }
    let code = code as u8;
    if code == 0 && f.uz {
        return 0;
    }
    code | sign_bits
}

#[cfg(test)]
mod tests {

    #[test]
    fn round_half_even_is_the_standard_rounding() {
        let mut xs = vec![
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.49999999999999994,
            -0.0,
            0.0,
            0.3,
            -0.3,
            4_503_599_627_370_495.5,
            2_251_799_813_685_247.5,
            2_251_799_813_685_248.5,
            9.007_199_254_740_993e15,
            1e300,
            -1e300,
            f64::MIN_POSITIVE,
            5e-324,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let mut state = 7u64;
        for _ in 0..100_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            xs.push(f64::from_bits(state));
            xs.push((state >> 11) as f64 / 1024.0 - 4e12);
        }
        for x in xs {
            let (got, want) = (round_half_even(x), x.round_ties_even());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{x:e}: {got:e} against {want:e}"
            );
        }
    }

    use super::*;

    #[test]
    fn every_fp8_code_round_trips() {
        for dtype in [
            DType::F8E4M3FN,
            DType::F8E4M3FNUZ,
            DType::F8E5M2,
            DType::F8E5M2FNUZ,
            DType::F4E2M1,
        ] {
            let limit = if dtype == DType::F4E2M1 { 16 } else { 256 };
            for code in 0..limit {
                let code = code as u8;
                let v = decode(dtype, code);
                if v.is_nan() || v.is_infinite() {
                    continue;
                }
                let back = encode(dtype, v, true);
                let expect =
                    if v == 0.0 && (dtype == DType::F8E4M3FNUZ || dtype == DType::F8E5M2FNUZ) {
                        0
                    } else {
                        code
                    };
                assert_eq!(back, expect, "{dtype} code {code:#x} value {v}");
            }
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(decode(DType::F8E4M3FN, 0x7e), 448.0);
        assert_eq!(encode(DType::F8E4M3FN, 1000.0, true), 0x7e);
        assert!(decode(DType::F8E4M3FN, encode(DType::F8E4M3FN, 1000.0, false)).is_nan());
        assert_eq!(decode(DType::F8E5M2, 0x7b), 57344.0);
        assert_eq!(
            decode(DType::F8E5M2, encode(DType::F8E5M2, 1e6, false)),
            f32::INFINITY
        );
        assert_eq!(decode(DType::F4E2M1, 0x7), 6.0);
        assert_eq!(decode(DType::F4E2M1, 0x1), 0.5);
        // ties to even: 1.0625 lies between 1.0 and 1.125 in E4M3 → 1.0
        assert_eq!(
            decode(DType::F8E4M3FN, encode(DType::F8E4M3FN, 1.0625, true)),
            1.0
        );
        assert_eq!(
            decode(DType::F8E4M3FN, encode(DType::F8E4M3FN, 1.1875, true)),
            1.25
        );
        assert_eq!(decode(DType::I4, encode(DType::I4, -9.0, true)), -8.0);
        assert_eq!(decode(DType::I4, encode(DType::I4, 2.5, true)), 2.0);
    }
}
