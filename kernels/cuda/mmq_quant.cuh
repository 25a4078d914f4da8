// Element math of mmq's quantization kernels, shared by the CUDA kernels (device) and the CPU
// checks (host): one definition of every rounding and saturation rule, compared bit for bit
// with the Rust reference (`mmq_kernels::ops::quant`, `mmq_kernels::numeric`) on every build.
//
// Rounding is round-half-even: `rintf` under the default rounding mode on the host, and on the
// device (nvcc maps `rintf` to `cvt.rni`); nothing here may be built with fast-math.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define MMQ_HD __host__ __device__ __forceinline__
#else
#include <math.h>
#define MMQ_HD static inline
#endif

// x rounded to the nearest integer, ties to even.
MMQ_HD float mmq_round_half_even(float x) { return rintf(x); }

// ONNX QuantizeLinear to an integer range [lo, hi]: saturate(round(x / scale) + zero), the
// division in f32; NaN quantizes to the zero point.
MMQ_HD int32_t mmq_quantize_int(float x, float scale, int32_t zero, int32_t lo, int32_t hi) {
    float q = x / scale;
    if (q != q) {
        q = 0.0f;
    }
    float r = mmq_round_half_even(q);
    // lo - zero and hi - zero are exact in f32 for every 8- and 4-bit range.
    float lo_f = (float)(lo - zero);
    float hi_f = (float)(hi - zero);
    r = r < lo_f ? lo_f : (r > hi_f ? hi_f : r);
    return (int32_t)r + zero;
}

// ONNX DequantizeLinear of one integer code: (q - zero) * scale, rounded once to f32 (the
// difference is exact in f32, so the product is correctly rounded as in f64 then f32).
MMQ_HD float mmq_dequantize_int(int32_t q, float scale, int32_t zero) {
    return (float)(q - zero) * scale;
}

// The FP8 E4M3FN code of x (finite only: no infinities, largest finite 448), rounding to
// nearest even; out-of-range values and infinities saturate to +-448 when `saturate`, else
// become NaN. Every NaN is 0xff, as in the reference (and ONNX Runtime).
MMQ_HD uint8_t mmq_encode_e4m3(float x, bool saturate) {
    const int bias = 7;
    const int man_bits = 3;
    const int max_code = 0x7e;
    const uint8_t nan = 0xff;
    if (x != x) {
        return nan;
    }
    uint8_t sign = signbit(x) ? 0x80 : 0x00;
    float a = fabsf(x);
    if (isinf(a)) {
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

// The value of an FP8 E4M3FN code.
MMQ_HD float mmq_decode_e4m3(uint8_t code) {
    const int bias = 7;
    uint8_t mag = code & 0x7f;
    if (mag == 0x7f) {
        return NAN;
    }
    int e = mag >> 3;
    int m = mag & 0x7;
    float v = e == 0 ? ldexpf((float)m, 1 - bias - 3) : ldexpf((float)(8 + m), e - bias - 3);
    return (code & 0x80) ? -v : v;
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
