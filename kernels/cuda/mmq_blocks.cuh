// The bodies of mmq's CUDA kernels, shared by the device kernels (`quantize.cu`, `nbits.cu`,
// `cache.cu`) and the CPU checks (`host_check.cpp` runs the same functions over every index a
// grid would cover): how an element finds its scale and zero point, how a chunk of eight
// elements is loaded, coded and stored, how a group's scale is computed, how a MatMulNBits weight
// is decoded, how a KV step is appended to a block. Only the thread mapping, the vector loads and
// the reductions are device-only.
#pragma once

#include "mmq_quant.cuh"

// Code formats. Their numbers are part of the launch API (`mmq_kernels::cuda::Format`).
#define MMQ_FMT_I8 0
#define MMQ_FMT_U8 1
#define MMQ_FMT_I4 2
#define MMQ_FMT_U4 3
#define MMQ_FMT_E4M3 4

template <int F>
struct mmq_fmt;
template <>
struct mmq_fmt<MMQ_FMT_I8> {
    enum { bits = 8, lo = -128, hi = 127, is_signed = 1, is_float = 0 };
};
template <>
struct mmq_fmt<MMQ_FMT_U8> {
    enum { bits = 8, lo = 0, hi = 255, is_signed = 0, is_float = 0 };
};
template <>
struct mmq_fmt<MMQ_FMT_I4> {
    enum { bits = 4, lo = -8, hi = 7, is_signed = 1, is_float = 0 };
};
template <>
struct mmq_fmt<MMQ_FMT_U4> {
    enum { bits = 4, lo = 0, hi = 15, is_signed = 0, is_float = 0 };
};
template <>
struct mmq_fmt<MMQ_FMT_E4M3> {
    enum { bits = 8, lo = -448, hi = 448, is_signed = 1, is_float = 1 };  // the finite range
};

// Unrolls the fixed-length loops over a chunk's eight elements on the device (their arrays then
// stay in registers); a tail chunk's shorter length is a predicate inside the loop, never its
// bound.
#if defined(__CUDA_ARCH__)
#define MMQ_UNROLL _Pragma("unroll")
#else
#define MMQ_UNROLL
#endif

// Division of a 32-bit value by a constant d >= 1 as a multiply-high, an add and a shift
// (Granlund and Montgomery): `mul` = floor(2^32 (2^shift - d) / d) + 1 with shift = ceil(log2 d).
struct MmqDiv {
    uint32_t mul;
    uint32_t shift;
};

MMQ_HD MmqDiv mmq_div_by(uint64_t d) {
    uint32_t shift = 0;
    while (shift < 32 && ((uint64_t)1 << shift) < d) {
        ++shift;
    }
    MmqDiv r;
    r.mul = (uint32_t)((((uint64_t)1 << 32) * (((uint64_t)1 << shift) - d)) / d + 1);
    r.shift = shift;
    return r;
}

MMQ_HD uint32_t mmq_div(uint32_t x, MmqDiv d) {
#if defined(__CUDA_ARCH__)
    uint32_t t = __umulhi(x, d.mul);
#else
    uint32_t t = (uint32_t)(((uint64_t)x * d.mul) >> 32);
#endif
    return (uint32_t)(((uint64_t)t + x) >> d.shift);
}

// Which scale (and zero point) element `i` of a row-major tensor uses. Mirrors
// `mmq_kernels::cuda::RawScaleMap` field for field; `mmq_scale_map` builds it.
struct MmqScaleMap {
    int64_t mode;      // 0 per tensor, 1 per axis, 2 per group along the last axis
    int64_t axis_len;  // per axis: the axis' length
    int64_t inner;     // per axis: the number of elements after the axis
    int64_t row_len;   // per group: the last axis' length
    int64_t group;     // per group: elements per group
    int64_t chunk_uniform;  // nonzero: the 8 elements of every chunk (from a multiple of 8) share one
    int64_t fast;      // nonzero: every element index fits in 32 bits, so the divisions below apply
    int64_t groups;    // per group: groups per row
    MmqDiv inner_div;  // by inner
    MmqDiv axis_div;   // by axis_len
    MmqDiv row_div;    // by row_len
    MmqDiv group_div;  // by group
};

// The map of `n` elements: mode 0 per tensor, 1 per axis (axis_len, inner), 2 per group (row_len,
// group); the other arguments of a mode are ignored. The launchers check the shapes first.
MMQ_HD MmqScaleMap mmq_scale_map(int64_t mode, int64_t axis_len, int64_t inner, int64_t row_len,
                                 int64_t group, int64_t n) {
    MmqScaleMap m = {};
    m.mode = mode;
    m.fast = n <= (int64_t)0xffffffff;
    if (mode == 0) {
        m.chunk_uniform = 1;
    } else if (mode == 1) {
        m.axis_len = axis_len;
        m.inner = inner;
        m.chunk_uniform = inner % 8 == 0;
        m.inner_div = mmq_div_by((uint64_t)inner);
        m.axis_div = mmq_div_by((uint64_t)axis_len);
    } else {
        m.row_len = row_len;
        m.group = group;
        m.groups = (row_len + group - 1) / group;
        m.chunk_uniform = group % 8 == 0 && row_len % 8 == 0;
        m.row_div = mmq_div_by((uint64_t)row_len);
        m.group_div = mmq_div_by((uint64_t)group);
    }
    return m;
}

MMQ_HD int64_t mmq_scale_index(const MmqScaleMap& m, int64_t i) {
    if (m.mode == 0) {
        return 0;
    }
    if (m.fast) {
        uint32_t u = (uint32_t)i;
        if (m.mode == 1) {
            uint32_t q = mmq_div(u, m.inner_div);
            return q - mmq_div(q, m.axis_div) * (uint32_t)m.axis_len;
        }
        uint32_t row = mmq_div(u, m.row_div);
        uint32_t col = u - row * (uint32_t)m.row_len;
        return (int64_t)row * m.groups + mmq_div(col, m.group_div);
    }
    if (m.mode == 1) {
        return (i / m.inner) % m.axis_len;
    }
    int64_t row = i / m.row_len;
    int64_t col = i - row * m.row_len;
    int64_t groups = (m.row_len + m.group - 1) / m.group;
    return row * groups + col / m.group;
}

// The scale indices of the `cnt` elements from i0 of a chunk whose elements may use different
// scales: a counter for a per-axis map, else one lookup each.
MMQ_HD void mmq_chunk_scale_indices(const MmqScaleMap& m, int64_t i0, int cnt, int64_t j[8]) {
    if (m.mode == 0) {
        MMQ_UNROLL
        for (int e = 0; e < 8; ++e) {
            j[e] = 0;
        }
    } else if (m.mode == 1) {
        // Element i0 + e: axis index (q0 + (r0 + e) / inner) mod axis_len.
        int64_t r, a;
        if (m.fast) {
            uint32_t q = mmq_div((uint32_t)i0, m.inner_div);
            r = (uint32_t)i0 - q * (uint32_t)m.inner;
            a = q - mmq_div(q, m.axis_div) * (uint32_t)m.axis_len;
        } else {
            int64_t q0 = i0 / m.inner;
            r = i0 - q0 * m.inner;
            a = q0 % m.axis_len;
        }
        MMQ_UNROLL
        for (int e = 0; e < 8; ++e) {
            j[e] = a;
            if (++r == m.inner) {
                r = 0;
                a = a + 1 == m.axis_len ? 0 : a + 1;
            }
        }
    } else {
        MMQ_UNROLL
        for (int e = 0; e < 8; ++e) {
            j[e] = e < cnt ? mmq_scale_index(m, i0 + e) : 0;
        }
    }
}

// A read-only load (through the texture path on the device).
template <typename T>
MMQ_HD T mmq_ldg(const T* p) {
#if defined(__CUDA_ARCH__)
    return __ldg(p);
#else
    return *p;
#endif
}

// Zero point `j` stored in format F: one byte per value for 8-bit formats, two per byte (low
// nibble first) for 4-bit formats; absent zero points are 0. FP8 has none.
template <int F>
MMQ_HD int32_t mmq_zero(const uint8_t* zeros, int64_t j) {
    if (zeros == 0 || mmq_fmt<F>::is_float) {
        return 0;
    }
    if (mmq_fmt<F>::bits == 8) {
        uint8_t b = mmq_ldg(zeros + j);
        return mmq_fmt<F>::is_signed ? (int32_t)(int8_t)b : (int32_t)b;
    }
    return mmq_unpack_int4(mmq_ldg(zeros + (j >> 1)), (int)(j & 1), mmq_fmt<F>::is_signed != 0);
}

// The code (its bits, 8 or 4 wide) in format F of the quotient q = x / scale.
template <int F>
MMQ_HD uint32_t mmq_encode_q(float q, int32_t zero, bool saturate) {
    if (mmq_fmt<F>::is_float) {
        return mmq_encode_e4m3(q, saturate);
    }
    int32_t c = mmq_quantize_q(q, zero, mmq_fmt<F>::lo, mmq_fmt<F>::hi);
    return (uint32_t)c & (mmq_fmt<F>::bits == 8 ? 0xffu : 0xfu);
}

// The code of x (its bits, 8 or 4 wide) in format F.
template <int F>
MMQ_HD uint32_t mmq_encode(float x, float scale, int32_t zero, bool saturate) {
    return mmq_encode_q<F>(x / scale, zero, saturate);
}

// The value of a code of format F.
template <int F>
MMQ_HD float mmq_decode(uint32_t code, float scale, int32_t zero) {
    if (mmq_fmt<F>::is_float) {
        return mmq_decode_e4m3((uint8_t)code) * scale;
    }
    int32_t q = (int32_t)code;
    if (mmq_fmt<F>::is_signed) {
        q = mmq_fmt<F>::bits == 8 ? (int32_t)(int8_t)code : (code >= 8 ? q - 16 : q);
    }
    return mmq_dequantize_int(q, scale, zero);
}

// Eight values from 16 bytes already in registers.
MMQ_HD void mmq_unpack8(const uint32_t w[4], mmq_f16, float v[8]) {
    for (int j = 0; j < 4; ++j) {
        v[2 * j] = mmq_f16_to_f32((uint16_t)(w[j] & 0xffffu));
        v[2 * j + 1] = mmq_f16_to_f32((uint16_t)(w[j] >> 16));
    }
}
MMQ_HD void mmq_unpack8(const uint32_t w[4], mmq_bf16, float v[8]) {
    for (int j = 0; j < 4; ++j) {
        v[2 * j] = mmq_bf16_to_f32((uint16_t)(w[j] & 0xffffu));
        v[2 * j + 1] = mmq_bf16_to_f32((uint16_t)(w[j] >> 16));
    }
}

// `cnt` (at most 8) values from x + i0 as f32; `vec`: x + i0 is 16-byte aligned, so a full
// chunk is read with 128-bit loads on the device.
MMQ_HD void mmq_load_span(const float* x, int64_t i0, int cnt, bool vec, float v[8]) {
#if defined(__CUDA_ARCH__)
    if (vec && cnt == 8) {
        float4 a = __ldg(reinterpret_cast<const float4*>(x + i0));
        float4 b = __ldg(reinterpret_cast<const float4*>(x + i0) + 1);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
        v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        return;
    }
#else
    (void)vec;
#endif
    MMQ_UNROLL
    for (int j = 0; j < 8; ++j) {
        if (j < cnt) {
            v[j] = x[i0 + j];
        }
    }
}

template <typename H>
MMQ_HD void mmq_load_span(const H* x, int64_t i0, int cnt, bool vec, float v[8]) {
#if defined(__CUDA_ARCH__)
    if (vec && cnt == 8) {
        uint4 q = __ldg(reinterpret_cast<const uint4*>(x + i0));
        uint32_t w[4] = {q.x, q.y, q.z, q.w};
        mmq_unpack8(w, H(), v);
        return;
    }
#else
    (void)vec;
#endif
    MMQ_UNROLL
    for (int j = 0; j < 8; ++j) {
        if (j < cnt) {
            v[j] = mmq_to_f32(x[i0 + j]);
        }
    }
}

// `cnt` values as f32 to y + i0 in type T; `vec` as for loads.
template <typename T>
MMQ_HD void mmq_store_span(T* y, int64_t i0, int cnt, bool vec, const float v[8]) {
#if defined(__CUDA_ARCH__)
    if (vec && cnt == 8) {
        uint32_t w[4];
        MMQ_UNROLL
        for (int j = 0; j < 4; ++j) {
            w[j] = (uint32_t)mmq_from_f32<T>(v[2 * j]).bits |
                   ((uint32_t)mmq_from_f32<T>(v[2 * j + 1]).bits << 16);
        }
        *reinterpret_cast<uint4*>(y + i0) = make_uint4(w[0], w[1], w[2], w[3]);
        return;
    }
#else
    (void)vec;
#endif
    MMQ_UNROLL
    for (int j = 0; j < 8; ++j) {
        if (j < cnt) {
            y[i0 + j] = mmq_from_f32<T>(v[j]);
        }
    }
}

MMQ_HD void mmq_store_span(float* y, int64_t i0, int cnt, bool vec, const float v[8]) {
#if defined(__CUDA_ARCH__)
    if (vec && cnt == 8) {
        reinterpret_cast<float4*>(y + i0)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(y + i0)[1] = make_float4(v[4], v[5], v[6], v[7]);
        return;
    }
#else
    (void)vec;
#endif
    MMQ_UNROLL
    for (int j = 0; j < 8; ++j) {
        if (j < cnt) {
            y[i0 + j] = v[j];
        }
    }
}

// `cnt` codes of format F for elements i0.. (i0 even for 4-bit formats; an odd count leaves the
// last byte's high nibble 0). `vec`: full chunks are written as one 64-bit (8-bit formats) or
// 32-bit (4-bit formats) store.
template <int F>
MMQ_HD void mmq_store_codes(uint8_t* out, int64_t i0, int cnt, bool vec, const uint32_t c[8]) {
    if (mmq_fmt<F>::bits == 8) {
#if defined(__CUDA_ARCH__)
        if (vec && cnt == 8) {
            uint2 w;
            w.x = c[0] | (c[1] << 8) | (c[2] << 16) | (c[3] << 24);
            w.y = c[4] | (c[5] << 8) | (c[6] << 16) | (c[7] << 24);
            *reinterpret_cast<uint2*>(out + i0) = w;
            return;
        }
#endif
        MMQ_UNROLL
        for (int j = 0; j < 8; ++j) {
            if (j < cnt) {
                out[i0 + j] = (uint8_t)c[j];
            }
        }
    } else {
#if defined(__CUDA_ARCH__)
        if (vec && cnt == 8) {
            uint32_t w = 0;
            MMQ_UNROLL
            for (int j = 0; j < 8; ++j) {
                w |= c[j] << (4 * j);
            }
            *reinterpret_cast<uint32_t*>(out + i0 / 2) = w;
            return;
        }
#endif
        MMQ_UNROLL
        for (int j = 0; j < 8; j += 2) {
            if (j < cnt) {
                out[(i0 + j) / 2] =
                    mmq_pack_int4((int32_t)c[j], j + 1 < cnt ? (int32_t)c[j + 1] : 0);
            }
        }
    }
    (void)vec;
}

// `cnt` codes of format F for elements i0.. (i0 even for 4-bit formats).
template <int F>
MMQ_HD void mmq_load_codes(const uint8_t* codes, int64_t i0, int cnt, bool vec, uint32_t c[8]) {
    if (mmq_fmt<F>::bits == 8) {
#if defined(__CUDA_ARCH__)
        if (vec && cnt == 8) {
            uint2 w = __ldg(reinterpret_cast<const uint2*>(codes + i0));
            MMQ_UNROLL
            for (int j = 0; j < 4; ++j) {
                c[j] = (w.x >> (8 * j)) & 0xffu;
                c[4 + j] = (w.y >> (8 * j)) & 0xffu;
            }
            return;
        }
#endif
        MMQ_UNROLL
        for (int j = 0; j < 8; ++j) {
            c[j] = j < cnt ? codes[i0 + j] : 0u;
        }
    } else {
#if defined(__CUDA_ARCH__)
        if (vec && cnt == 8) {
            uint32_t w = __ldg(reinterpret_cast<const unsigned int*>(codes + i0 / 2));
            MMQ_UNROLL
            for (int j = 0; j < 8; ++j) {
                c[j] = (w >> (4 * j)) & 0xfu;
            }
            return;
        }
#endif
        MMQ_UNROLL
        for (int j = 0; j < 8; ++j) {
            uint8_t b = j < cnt ? codes[(i0 + j) / 2] : (uint8_t)0;
            c[j] = (j & 1) ? (uint32_t)(b >> 4) : (uint32_t)(b & 0xfu);
        }
    }
    (void)vec;
}

// Codes `cnt` values already loaded (elements a.., a even for 4-bit formats) with one scale,
// given as its reciprocal (`mmq_recip`), which must be `fast`.
template <int F>
MMQ_HD void mmq_code_span_fast(const float v[8], int64_t a, int cnt, bool vec, const MmqRecip& d,
                               int32_t z, bool saturate, uint8_t* out) {
    uint32_t c[8];
    MMQ_UNROLL
    for (int e = 0; e < 8; ++e) {
        c[e] = e < cnt ? mmq_encode_q<F>(mmq_div_fast(v[e], d), z, saturate) : 0u;
    }
    mmq_store_codes<F>(out, a, cnt, vec, c);
}

// The same for any scale: by the reciprocal where it is `fast`, else by division.
template <int F>
MMQ_HD void mmq_code_span(const float v[8], int64_t a, int cnt, bool vec, const MmqRecip& d,
                          int32_t z, bool saturate, uint8_t* out) {
    if (d.fast) {
        mmq_code_span_fast<F>(v, a, cnt, vec, d, z, saturate, out);
        return;
    }
    uint32_t c[8];
    MMQ_UNROLL
    for (int e = 0; e < 8; ++e) {
        c[e] = e < cnt ? mmq_encode<F>(v[e], d.s, z, saturate) : 0u;
    }
    mmq_store_codes<F>(out, a, cnt, vec, c);
}

template <int F>
MMQ_HD void mmq_code_span(const float v[8], int64_t a, int cnt, bool vec, float s, int32_t z,
                          bool saturate, uint8_t* out) {
    mmq_code_span<F>(v, a, cnt, vec, mmq_recip(s), z, saturate, out);
}

// Quantizes chunk `chunk` (elements 8·chunk .. min(8·chunk + 8, n)) of x with the scales and zero
// points `map` assigns.
template <typename In, int F>
MMQ_HD void mmq_quantize_chunk(const In* x, int64_t n, const float* scales, const uint8_t* zeros,
                               const MmqScaleMap& map, bool saturate, bool vec, uint8_t* out,
                               int64_t chunk) {
    int64_t i0 = chunk * 8;
    int cnt = n - i0 < 8 ? (int)(n - i0) : 8;
    float v[8];
    uint32_t c[8];
    int64_t j[8];
    mmq_load_span(x, i0, cnt, vec, v);
    if (map.chunk_uniform) {
        int64_t j0 = mmq_scale_index(map, i0);
        mmq_code_span<F>(v, i0, cnt, vec, mmq_ldg(scales + j0), mmq_zero<F>(zeros, j0), saturate,
                         out);
        return;
    }
    mmq_chunk_scale_indices(map, i0, cnt, j);
    MMQ_UNROLL
    for (int e = 0; e < 8; ++e) {
        c[e] = e < cnt ? mmq_encode<F>(v[e], mmq_ldg(scales + j[e]), mmq_zero<F>(zeros, j[e]),
                                       saturate)
                       : 0u;
    }
    mmq_store_codes<F>(out, i0, cnt, vec, c);
}

// Dequantizes chunk `chunk` of n codes to y.
template <typename Out, int F>
MMQ_HD void mmq_dequantize_chunk(const uint8_t* codes, int64_t n, const float* scales,
                                 const uint8_t* zeros, const MmqScaleMap& map, bool vec, Out* y,
                                 int64_t chunk) {
    int64_t i0 = chunk * 8;
    int cnt = n - i0 < 8 ? (int)(n - i0) : 8;
    uint32_t c[8];
    float v[8];
    int64_t j[8];
    mmq_load_codes<F>(codes, i0, cnt, vec, c);
    if (map.chunk_uniform) {
        int64_t j0 = mmq_scale_index(map, i0);
        float s = mmq_ldg(scales + j0);
        int32_t z = mmq_zero<F>(zeros, j0);
        MMQ_UNROLL
        for (int e = 0; e < 8; ++e) {
            v[e] = mmq_decode<F>(c[e], s, z);
        }
    } else {
        mmq_chunk_scale_indices(map, i0, cnt, j);
        MMQ_UNROLL
        for (int e = 0; e < 8; ++e) {
            v[e] = e < cnt ? mmq_decode<F>(c[e], mmq_ldg(scales + j[e]), mmq_zero<F>(zeros, j[e]))
                           : 0.0f;
        }
    }
    mmq_store_span(y, i0, cnt, vec, v);
}

// The scale and zero point of a group whose values span [mn, mx], as stored: symmetric groups
// map the largest magnitude to the format's largest positive code (127, 7, 448) with zero point 0
// (signed) or the middle code (unsigned: 128, 8); asymmetric groups map [min(mn, 0), max(mx, 0)]
// onto the whole code range (an empty range counts as 1), as ONNX DynamicQuantizeLinear does for
// u8. A zero scale becomes 1. With `scale_f16` the scale is rounded to binary16 (at most 65504)
// before the zero point and the codes are computed from it.
template <int F>
MMQ_HD void mmq_group_qparams(float mn, float mx, bool symmetric, bool scale_f16, float* scale,
                              int32_t* zero) {
    float s;
    int32_t z = 0;
    float amax = fmaxf(fabsf(mn), fabsf(mx));
    if (mmq_fmt<F>::is_float) {
        s = amax / (float)mmq_fmt<F>::hi;
    } else if (symmetric) {
        z = mmq_fmt<F>::is_signed ? 0 : (mmq_fmt<F>::hi + 1) / 2;
        s = amax / (float)(mmq_fmt<F>::hi - z);
    } else {
        float lo = fminf(mn, 0.0f);
        float hi = fmaxf(mx, 0.0f);
        float range = hi == lo ? 1.0f : hi - lo;
        s = range / (float)(mmq_fmt<F>::hi - mmq_fmt<F>::lo);
    }
    if (!(s > 0.0f)) {
        s = 1.0f;
    }
    if (scale_f16) {
        s = mmq_f16_to_f32(mmq_f32_to_f16(fminf(s, 65504.0f)));
        if (s == 0.0f) {
            s = 1.0f;
        }
    }
    if (!mmq_fmt<F>::is_float && !symmetric) {
        float zf = (float)mmq_fmt<F>::lo - fminf(mn, 0.0f) / s;
        zf = fminf(fmaxf(zf, (float)mmq_fmt<F>::lo), (float)mmq_fmt<F>::hi);
        z = (int32_t)mmq_round_half_even(zf);
    }
    *scale = s;
    *zero = z;
}

// Quantizes elements [a, a + cnt) (cnt at most 8, a even for 4-bit formats) with one scale.
template <typename In, int F>
MMQ_HD void mmq_quantize_span(const In* x, int64_t a, int cnt, bool vec, float s, int32_t z,
                              bool saturate, uint8_t* out) {
    float v[8];
    mmq_load_span(x, a, cnt, vec, v);
    mmq_code_span<F>(v, a, cnt, vec, s, z, saturate, out);
}

// Group `col` of row `row` of a [rows, row_len] tensor cut into groups of `group` along each
// row: its first element and its length.
MMQ_HD void mmq_group_at(int64_t row, int64_t col, int64_t row_len, int64_t group,
                         int64_t* first, int64_t* len) {
    int64_t c = col * group;
    *first = row * row_len + c;
    *len = row_len - c < group ? row_len - c : group;
}

// The same for group `g` counted over the whole tensor.
MMQ_HD void mmq_group_span(int64_t g, int64_t row_len, int64_t group, int64_t* first,
                           int64_t* len) {
    int64_t per_row = (row_len + group - 1) / group;
    int64_t row = g / per_row;
    mmq_group_at(row, g - row * per_row, row_len, group, first, len);
}

// Stores a group's scale (f32 or binary16) and zero point (one byte, the code's bits).
MMQ_HD void mmq_store_group_params(int64_t g, float s, int32_t z, bool scale_f16,
                                   void* scales, uint8_t* zeros) {
    if (scale_f16) {
        static_cast<uint16_t*>(scales)[g] = mmq_f32_to_f16(s);
    } else {
        static_cast<float*>(scales)[g] = s;
    }
    if (zeros) {
        zeros[g] = (uint8_t)(z & 0xff);
    }
}

// ---- MatMulNBits (bits 4): B [N, K / block, block / 2] bytes, codes low nibble first along K;
// scales binary16 [N, K / block]; zero points packed 4-bit [N, ceil((K / block) / 2)], absent = 8.

// The zero point of row n, block kb.
MMQ_HD float mmq_nbits_zero(const uint8_t* zeros, int64_t n, int64_t kb, int64_t k_blocks) {
    if (zeros == 0) {
        return 8.0f;
    }
    int64_t per_row = (k_blocks + 1) / 2;
    return (float)mmq_unpack_int4(mmq_ldg(zeros + n * per_row + kb / 2), (int)(kb & 1), false);
}

// The scale and zero point of row n, block kb, as loaded (binary16 bits; the byte holding the zero
// point, 0x88 without zero points): the GEMVs load them steps ahead, with the codes, and decode
// them when the step runs.
struct MmqNbitsSide {
    uint16_t scale;
    uint8_t zero;
};

MMQ_HD MmqNbitsSide mmq_nbits_side(const mmq_f16* scales, const uint8_t* zeros, int64_t n,
                                   int64_t kb, int64_t k_blocks) {
    MmqNbitsSide side;
    side.scale = mmq_ldg(&scales[n * k_blocks + kb].bits);
    side.zero = zeros ? mmq_ldg(zeros + n * ((k_blocks + 1) / 2) + kb / 2) : (uint8_t)0x88;
    return side;
}

MMQ_HD float mmq_nbits_side_scale(MmqNbitsSide side) { return mmq_f16_to_f32(side.scale); }

MMQ_HD float mmq_nbits_side_zero(MmqNbitsSide side, int64_t kb) {
    return (float)mmq_unpack_int4(side.zero, (int)(kb & 1), false);
}

// The weight of one code.
MMQ_HD float mmq_nbits_weight(uint32_t code, float zero, float scale) {
    return ((float)code - zero) * scale;
}

// The 32 codes of 16 packed bytes (one block's run of 32 K) minus the block's zero point, as f32:
// 2^23 + code has the code in its low mantissa bits, so one subtraction gives code - zero exactly.
MMQ_HD void mmq_nbits_codes32(const uint32_t wb[4], float zero, float d[32]) {
    float off = 8388608.0f + zero;
    MMQ_UNROLL
    for (int q = 0; q < 4; ++q) {
        MMQ_UNROLL
        for (int j = 0; j < 8; ++j) {
            d[8 * q + j] = mmq_bits_f32(0x4b000000u | ((wb[q] >> (4 * j)) & 0xfu)) - off;
        }
    }
}

// Σ a[j] · d[j] over those 32 K (the block's scale is applied once, to the sum).
MMQ_HD float mmq_nbits_dot32(const float d[32], const float a[32]) {
    float acc = 0.0f;
    MMQ_UNROLL
    for (int j = 0; j < 32; ++j) {
        acc += a[j] * d[j];
    }
    return acc;
}

// ---- KV cache: INT8 blocks of 512 bytes per (batch·head); a block holds 512 / head_dim tokens;
// one f32 scale per (batch·head, block). A block's scale only grows: a step whose largest
// magnitude needs a larger scale requantizes the tokens already in the block.

// The scale of a block after a step whose largest magnitude is amax (s_old is 0 for a new block).
MMQ_HD float mmq_kv_scale(float s_old, float amax) { return fmaxf(s_old, amax / 127.0f); }

// The code of one value at scale s (codes in [-127, 127]; a zero scale codes 0).
MMQ_HD int8_t mmq_kv_code(float x, float s) {
    return s == 0.0f ? (int8_t)0 : (int8_t)mmq_quantize_int(x, s, 0, -127, 127);
}

// A code at scale s_old recoded at scale s_new >= s_old.
MMQ_HD int8_t mmq_kv_requant(int8_t q, float s_old, float s_new) {
    return (int8_t)mmq_round_half_even((float)q * (s_old / s_new));
}
