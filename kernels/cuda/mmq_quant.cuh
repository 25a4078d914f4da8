// Element math of mmq's quantization kernels, shared by the CUDA kernels (device) and the CPU
// checks (host): one definition of every rounding and saturation rule, compared bit for bit
// with the Rust reference (`mmq_kernels::ops::quant`, `mmq_kernels::numeric`) on every build.
//
// Rounding is round-half-even: `rintf` under the default rounding mode on the host, and on the
// device (nvcc maps `rintf` to `cvt.rni`); nothing here may be built with fast-math.
#pragma once

#if defined(__CUDACC_RTC__)
// NVRTC has no C library headers; the math functions are built in.
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <math.h>
#include <stdint.h>
#include <string.h>
#endif

#if defined(__CUDACC__)
#define MMQ_HD __host__ __device__ __forceinline__
#else
#define MMQ_HD inline
#endif

// Inline PTX: compiled for the device, except under the CPU emulator (`emu.h`, which defines
// MMQ_EMULATE and __CUDA_ARCH__ so the device paths run on the host). There every `asm` below
// has a C++ twin: the conversions take the software path, which is what the hardware computes.
#if defined(__CUDA_ARCH__) && !defined(MMQ_EMULATE)
#define MMQ_PTX 1
#else
#define MMQ_PTX 0
#endif

// The bits of an f32 and back.
MMQ_HD uint32_t mmq_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

MMQ_HD float mmq_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

// A quiet NaN.
MMQ_HD float mmq_nan() { return mmq_bits_f32(0x7fc00000u); }

// IEEE binary16 and bfloat16 are carried as their bits, so the same code builds under nvcc, NVRTC
// and a host C++ compiler without the CUDA half headers.
struct mmq_f16 {
    uint16_t bits;
};
struct mmq_bf16 {
    uint16_t bits;
};

// binary16 → f32 (exact). On the device this is the hardware conversion (the same value; a
// NaN's payload may differ, and NaN is only ever tested as NaN).
MMQ_HD float mmq_f16_to_f32(uint16_t h) {
#if MMQ_PTX
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return mmq_bits_f32(mmq_f32_bits(v) | sign);
    }
    if (e == 31) {
        return mmq_bits_f32(sign | 0x7f800000u | (m << 13));
    }
    return mmq_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
#endif
}

// f32 → binary16, round to nearest even; overflow becomes infinity; NaN stays NaN (quiet). On
// the device, the hardware conversion (`cvt.rn`, the same rounding).
MMQ_HD uint16_t mmq_f32_to_f16(float x) {
#if MMQ_PTX
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    uint32_t u = mmq_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        uint32_t man = a & 0x7fffffu;
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0u) | (man >> 13));
    }
    if (a >= 0x477ff000u) {  // >= 65520 rounds past the largest finite value
        return (uint16_t)(sign | 0x7c00u);
    }
    if (a < 0x38800000u) {  // below 2^-14: a subnormal (or zero) code, round(a * 2^24)
        float s = rintf(mmq_bits_f32(a) * 16777216.0f);
        return (uint16_t)(sign | (uint16_t)s);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
#endif
}

// bfloat16 → f32 (exact).
MMQ_HD float mmq_bf16_to_f32(uint16_t h) { return mmq_bits_f32((uint32_t)h << 16); }

// f32 → bfloat16, round to nearest even; NaN stays NaN (quiet); on the device, `cvt.rn`.
MMQ_HD uint16_t mmq_f32_to_bf16(float x) {
#if MMQ_PTX
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
#else
    uint32_t u = mmq_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (uint16_t)((u >> 16) | 0x40u);
    }
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

// Loads and stores of the three activation types as f32.
MMQ_HD float mmq_to_f32(float x) { return x; }
MMQ_HD float mmq_to_f32(mmq_f16 x) { return mmq_f16_to_f32(x.bits); }
MMQ_HD float mmq_to_f32(mmq_bf16 x) { return mmq_bf16_to_f32(x.bits); }

template <typename T>
MMQ_HD T mmq_from_f32(float x);
template <>
MMQ_HD float mmq_from_f32<float>(float x) {
    return x;
}
template <>
MMQ_HD mmq_f16 mmq_from_f32<mmq_f16>(float x) {
    mmq_f16 h = {mmq_f32_to_f16(x)};
    return h;
}
template <>
MMQ_HD mmq_bf16 mmq_from_f32<mmq_bf16>(float x) {
    mmq_bf16 h = {mmq_f32_to_bf16(x)};
    return h;
}

// x rounded to the nearest integer, ties to even.
MMQ_HD float mmq_round_half_even(float x) { return rintf(x); }

// The integer code of a quotient q = x / scale in [lo, hi]: saturate(round(q) + zero); NaN
// quantizes to the zero point.
MMQ_HD int32_t mmq_quantize_q(float q, int32_t zero, int32_t lo, int32_t hi) {
    if (q != q) {
        q = 0.0f;
    }
    // lo - zero and hi - zero are exact in f32 for every 8- and 4-bit range. Clamping to these
    // integers before rounding gives what rounding first gives.
    float lo_f = (float)(lo - zero);
    float hi_f = (float)(hi - zero);
    q = q < lo_f ? lo_f : (q > hi_f ? hi_f : q);
    // Round half to even by one add: |q| <= 255, so 1.5 · 2^23 + q lies in [2^23, 2^24), where
    // the spacing of f32 values is 1, and the integer is its low mantissa bits (no conversion
    // instruction on the device).
    return (int32_t)(mmq_f32_bits(q + 12582912.0f) - 0x4b400000u) + zero;
}

// ONNX QuantizeLinear to an integer range [lo, hi]: saturate(round(x / scale) + zero), the
// division in f32; NaN quantizes to the zero point.
MMQ_HD int32_t mmq_quantize_int(float x, float scale, int32_t zero, int32_t lo, int32_t hi) {
    return mmq_quantize_q(x / scale, zero, lo, hi);
}

// Division by a scale many elements share: its reciprocal once, then per element Markstein's
// correction, q0 = x r, e = x - s q0 (exact, by FMA), q = q0 + e r. With 2^-60 <= |s| <= 2^60
// (`fast`), q is x / s bit for bit wherever |x / s| >= 2^-12, and otherwise a value of the same
// sign below 2^-12 in magnitude: every code is then the same, since integer codes round such
// values to 0 and E4M3FN to ±0 with the quotient's sign (tools/check_recip_div.c compares the two
// over 10^9 pairs; the host checks compare every code with the reference). An infinite or NaN
// x r is returned as it is. Outside that range of scales the caller divides.
struct MmqRecip {
    float s;
    float r;
    bool fast;
};

MMQ_HD MmqRecip mmq_recip(float s) {
    MmqRecip d;
    d.s = s;
    d.r = 1.0f / s;
    float a = fabsf(s);
    d.fast = a >= 0x1p-60f && a <= 0x1p60f;
    return d;
}

// x / d.s as above; needs d.fast.
MMQ_HD float mmq_div_fast(float x, const MmqRecip& d) {
    float q0 = x * d.r;
    if (!(fabsf(q0) <= 3.40282347e38f)) {
        return q0;
    }
    float e = fmaf(-d.s, q0, x);
    return copysignf(fmaf(e, d.r, q0), q0);
}

// An integer of magnitude below 2^22 as f32 (exact). On the device, two adds in place of a
// conversion instruction: 1.5 · 2^23 + v has v in its low mantissa bits.
MMQ_HD float mmq_small_int_to_f32(int32_t v) {
#if defined(__CUDA_ARCH__)
    return __int_as_float(0x4b400000 + v) - 12582912.0f;
#else
    return (float)v;
#endif
}

// ONNX DequantizeLinear of one integer code: (q - zero) * scale, rounded once to f32 (the
// difference is exact in f32, so the product is correctly rounded as in f64 then f32).
MMQ_HD float mmq_dequantize_int(int32_t q, float scale, int32_t zero) {
    return mmq_small_int_to_f32(q - zero) * scale;
}

// The FP8 E4M3FN code of x (finite only: no infinities, largest finite 448), rounding to
// nearest even; out-of-range values and infinities saturate to +-448 when `saturate`, else
// become NaN. Every NaN is 0xff, as in the reference (and ONNX Runtime). The software form: the
// host's, and the definition the device's conversion is checked against.
MMQ_HD uint8_t mmq_encode_e4m3_soft(float x, bool saturate) {
    const int bias = 7;
    const int man_bits = 3;
    const int max_code = 0x7e;
    const uint8_t nan = 0xff;
    if (x != x) {
        return nan;
    }
    uint8_t sign = (mmq_f32_bits(x) >> 31) ? 0x80 : 0x00;
    float a = fabsf(x);
    if (mmq_f32_bits(a) == 0x7f800000u) {
        return saturate ? (uint8_t)(max_code | sign) : nan;
    }
    if (a == 0.0f) {
        return sign;
    }
    int e2;
    frexpf(a, &e2);  // a = m * 2^e2 with m in [0.5, 1): floor(log2 a) = e2 - 1
    int exp = e2 - 1;
    const int min_normal_exp = 1 - bias;
    if (exp < min_normal_exp) {
        exp = min_normal_exp;
    }
    // a / 2^(exp - man_bits) is exact (a power-of-two scaling within f32's range).
    float q = mmq_round_half_even(ldexpf(a, man_bits - exp));
    float code = (float)((exp + bias - 1) * (1 << man_bits)) + q;
    if (code > (float)max_code) {
        return saturate ? (uint8_t)(max_code | sign) : nan;
    }
    return (uint8_t)((uint8_t)code | sign);
}

// The value of an FP8 E4M3FN code, in software.
MMQ_HD float mmq_decode_e4m3_soft(uint8_t code) {
    const int bias = 7;
    uint8_t mag = code & 0x7f;
    if (mag == 0x7f) {
        return mmq_nan();
    }
    int e = mag >> 3;
    int m = mag & 0x7;
    float v = e == 0 ? ldexpf((float)m, 1 - bias - 3) : ldexpf((float)(8 + m), e - bias - 3);
    return (code & 0x80) ? -v : v;
}

// `cvt.rn.satfinite.e4m3x2.f32` of (0, x): x's code in the low byte, rounded to nearest even,
// finite values and infinities beyond ±448 saturated to ±448, NaN as 0x7f.
MMQ_HD uint16_t mmq_cvt_e4m3x2(float x) {
#if MMQ_PTX
    uint16_t pair;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(x));
    return pair;
#else
    return x != x ? (uint16_t)0x7f : (uint16_t)mmq_encode_e4m3_soft(x, true);
#endif
}

// `cvt.rn.f16x2.e4m3x2`: two E4M3 codes as binary16 values (exact; NaN stays NaN).
MMQ_HD uint32_t mmq_cvt_f16x2_e4m3x2(uint16_t codes) {
#if MMQ_PTX
    uint32_t pair;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(pair) : "h"(codes));
    return pair;
#else
    uint32_t lo = mmq_f32_to_f16(mmq_decode_e4m3_soft((uint8_t)(codes & 0xffu)));
    uint32_t hi = mmq_f32_to_f16(mmq_decode_e4m3_soft((uint8_t)(codes >> 8)));
    return lo | (hi << 16);
#endif
}

// The FP8 E4M3FN code of x, as `mmq_encode_e4m3_soft` defines it.
MMQ_HD uint8_t mmq_encode_e4m3(float x, bool saturate) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    // The hardware conversion rounds the same way and saturates to ±448 (infinities too); NaN
    // becomes 0x7f there, and a value past the largest code's rounding range (|x| > 464: 464
    // itself ties to 448) is NaN without `saturate`.
    if (x != x || (!saturate && fabsf(x) > 464.0f)) {
        return 0xff;
    }
    return (uint8_t)(mmq_cvt_e4m3x2(x) & 0xffu);
#else
    return mmq_encode_e4m3_soft(x, saturate);
#endif
}

// The value of an FP8 E4M3FN code.
MMQ_HD float mmq_decode_e4m3(uint8_t code) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    // Exact through binary16 (every E4M3 value is a binary16 value; 0x7f and 0xff are NaN).
    return mmq_f16_to_f32((uint16_t)(mmq_cvt_f16x2_e4m3x2((uint16_t)code) & 0xffffu));
#else
    return mmq_decode_e4m3_soft(code);
#endif
}

// Two 4-bit codes in one byte, the first in the low nibble (the layout of ONNX INT4 tensors and
// MatMulNBits).
MMQ_HD uint8_t mmq_pack_int4(int32_t first, int32_t second) {
    return (uint8_t)((first & 0xf) | ((second & 0xf) << 4));
}

// Nibble `index` (0 low, 1 high) of a packed byte as a signed (-8..7) or unsigned (0..15) value.
MMQ_HD int32_t mmq_unpack_int4(uint8_t byte, int index, bool is_signed) {
    int32_t v = index ? (byte >> 4) : (byte & 0xf);
    return is_signed && v >= 8 ? v - 16 : v;
}
