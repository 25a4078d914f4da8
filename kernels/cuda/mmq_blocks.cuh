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

// Which scale (and zero point) element `i` of a row-major tensor uses. Mirrors
// `mmq_kernels::cuda::ScaleMap` field for field.
struct MmqScaleMap {
    int64_t mode;      // 0 per tensor, 1 per axis, 2 per group along the last axis
    int64_t axis_len;  // per axis: the axis' length
    int64_t inner;     // per axis: the number of elements after the axis
    int64_t row_len;   // per group: the last axis' length
    int64_t group;     // per group: elements per group
    int64_t chunk_uniform;  // nonzero: the 8 elements of every chunk (from a multiple of 8) share one
};

MMQ_HD int64_t mmq_scale_index(const MmqScaleMap& m, int64_t i) {
    if (m.mode == 0) {
        return 0;
    }
    if (m.mode == 1) {
        return (i / m.inner) % m.axis_len;
    }
    int64_t row = i / m.row_len;
    int64_t col = i - row * m.row_len;
    int64_t groups = (m.row_len + m.group - 1) / m.group;
    return row * groups + col / m.group;
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

// The code of x (its bits, 8 or 4 wide) in format F.
template <int F>
MMQ_HD uint32_t mmq_encode(float x, float scale, int32_t zero, bool saturate) {
    if (mmq_fmt<F>::is_float) {
        return mmq_encode_e4m3(x / scale, saturate);
    }
    int32_t q = mmq_quantize_int(x, scale, zero, mmq_fmt<F>::lo, mmq_fmt<F>::hi);
    return (uint32_t)q & (mmq_fmt<F>::bits == 8 ? 0xffu : 0xfu);
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
    for (int j = 0; j < cnt; ++j) {
        v[j] = x[i0 + j];
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
    for (int j = 0; j < cnt; ++j) {
        v[j] = mmq_to_f32(x[i0 + j]);
    }
}

// `cnt` values as f32 to y + i0 in type T; `vec` as for loads.
template <typename T>
MMQ_HD void mmq_store_span(T* y, int64_t i0, int cnt, bool vec, const float v[8]) {
#if defined(__CUDA_ARCH__)
    if (vec && cnt == 8) {
        uint32_t w[4];
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
    for (int j = 0; j < cnt; ++j) {
        y[i0 + j] = mmq_from_f32<T>(v[j]);
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
    for (int j = 0; j < cnt; ++j) {
        y[i0 + j] = v[j];
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
        for (int j = 0; j < cnt; ++j) {
            out[i0 + j] = (uint8_t)c[j];
        }
    } else {
#if defined(__CUDA_ARCH__)
        if (vec && cnt == 8) {
            uint32_t w = 0;
            for (int j = 0; j < 8; ++j) {
                w |= c[j] << (4 * j);
            }
            *reinterpret_cast<uint32_t*>(out + i0 / 2) = w;
            return;
        }
#endif
        for (int j = 0; j < cnt; j += 2) {
            out[(i0 + j) / 2] = mmq_pack_int4((int32_t)c[j], j + 1 < cnt ? (int32_t)c[j + 1] : 0);
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
            for (int j = 0; j < 4; ++j) {
                c[j] = (w.x >> (8 * j)) & 0xffu;
                c[4 + j] = (w.y >> (8 * j)) & 0xffu;
            }
            return;
        }
#endif
        for (int j = 0; j < cnt; ++j) {
            c[j] = codes[i0 + j];
        }
    } else {
#if defined(__CUDA_ARCH__)
        if (vec && cnt == 8) {
            uint32_t w = __ldg(reinterpret_cast<const unsigned int*>(codes + i0 / 2));
            for (int j = 0; j < 8; ++j) {
                c[j] = (w >> (4 * j)) & 0xfu;
            }
            return;
        }
#endif
        for (int j = 0; j < cnt; ++j) {
            uint8_t b = codes[(i0 + j) / 2];
            c[j] = (j & 1) ? (uint32_t)(b >> 4) : (uint32_t)(b & 0xfu);
        }
    }
    (void)vec;
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
    mmq_load_span(x, i0, cnt, vec, v);
    if (map.chunk_uniform) {
        int64_t j = mmq_scale_index(map, i0);
        float s = mmq_ldg(scales + j);
        int32_t z = mmq_zero<F>(zeros, j);
        for (int e = 0; e < cnt; ++e) {
            c[e] = mmq_encode<F>(v[e], s, z, saturate);
        }
    } else {
        for (int e = 0; e < cnt; ++e) {
            int64_t j = mmq_scale_index(map, i0 + e);
            c[e] = mmq_encode<F>(v[e], mmq_ldg(scales + j), mmq_zero<F>(zeros, j), saturate);
        }
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
    mmq_load_codes<F>(codes, i0, cnt, vec, c);
    for (int e = 0; e < cnt; ++e) {
        int64_t j = map.chunk_uniform ? mmq_scale_index(map, i0) : mmq_scale_index(map, i0 + e);
        v[e] = mmq_decode<F>(c[e], mmq_ldg(scales + j), mmq_zero<F>(zeros, j));
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
    uint32_t c[8];
    mmq_load_span(x, a, cnt, vec, v);
    for (int e = 0; e < cnt; ++e) {
        c[e] = mmq_encode<F>(v[e], s, z, saturate);
    }
    mmq_store_codes<F>(out, a, cnt, vec, c);
}

// The group `g` of a [rows, row_len] tensor cut into groups of `group` along each row: its first
// element and its length.
MMQ_HD void mmq_group_span(int64_t g, int64_t row_len, int64_t group, int64_t* first,
                           int64_t* len) {
    int64_t per_row = (row_len + group - 1) / group;
    int64_t row = g / per_row;
    int64_t col = (g - row * per_row) * group;
    *first = row * row_len + col;
    *len = row_len - col < group ? row_len - col : group;
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

// The weight of one code.
MMQ_HD float mmq_nbits_weight(uint32_t code, float zero, float scale) {
    return ((float)code - zero) * scale;
}

// Σ a[j] · w[j] over 32 consecutive K of one block, w decoded from 16 packed bytes.
MMQ_HD float mmq_nbits_dot32(const uint32_t wb[4], const float a[32], float zero, float scale) {
    float acc = 0.0f;
    for (int q = 0; q < 4; ++q) {
        for (int j = 0; j < 8; ++j) {
            uint32_t code = (wb[q] >> (4 * j)) & 0xfu;
            acc += a[8 * q + j] * mmq_nbits_weight(code, zero, scale);
        }
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
