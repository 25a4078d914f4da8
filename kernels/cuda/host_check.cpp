// The element math of mmq_quant.cuh compiled for the CPU, over arrays, so the Rust tests can
// compare it with the Rust reference (kernels/src/cuda_host.rs).
#include <stddef.h>
#include <string.h>

#include <type_traits>

#include "mmq_quant.cuh"

extern "C" {

void mmq_host_quantize_int(const float* x, size_t n, float scale, int32_t zero, int32_t lo,
                           int32_t hi, int32_t* out) {
    for (size_t i = 0; i < n; ++i) {
        out[i] = mmq_quantize_int(x[i], scale, zero, lo, hi);
    }
}

void mmq_host_dequantize_int(const int32_t* q, size_t n, float scale, int32_t zero, float* out) {
    for (size_t i = 0; i < n; ++i) {
        out[i] = mmq_dequantize_int(q[i], scale, zero);
    }
}

void mmq_host_encode_e4m3(const float* x, size_t n, int saturate, uint8_t* out) {
    for (size_t i = 0; i < n; ++i) {
        out[i] = mmq_encode_e4m3(x[i], saturate != 0);
    }
}

void mmq_host_decode_e4m3(const uint8_t* code, size_t n, float* out) {
    for (size_t i = 0; i < n; ++i) {
        out[i] = mmq_decode_e4m3(code[i]);
    }
}

void mmq_host_pack_int4(const int32_t* v, size_t n, uint8_t* out) {
    for (size_t i = 0; i + 1 < n; i += 2) {
        out[i / 2] = mmq_pack_int4(v[i], v[i + 1]);
    }
    if (n % 2) {
        out[n / 2] = mmq_pack_int4(v[n - 1], 0);
    }
}

int32_t mmq_host_unpack_int4(uint8_t byte, int index, int is_signed) {
    return mmq_unpack_int4(byte, index, is_signed != 0);
}

// x / s by the reciprocal (mmq_recip, mmq_div_fast); 0 (and nothing written) where s is out of
// the reciprocal's range.
int mmq_host_div_recip(const float* x, size_t n, float s, float* out) {
    MmqRecip d = mmq_recip(s);
    if (!d.fast) {
        return 0;
    }
    for (size_t i = 0; i < n; ++i) {
        out[i] = mmq_div_fast(x[i], d);
    }
    return 1;
}
}

// ---- The kernel bodies of mmq_blocks.cuh, run over every index a grid covers (scalar loads and
// stores: the device takes its vector path only where the data is aligned, with the same math).
#include "mmq_blocks.cuh"

namespace {

// Calls f(In*) with x cast to the activation type `in` (0 f32, 1 binary16, 2 bfloat16).
template <typename Fn>
void with_type(int in, void* x, Fn f) {
    if (in == 0) {
        f(static_cast<float*>(x));
    } else if (in == 1) {
        f(static_cast<mmq_f16*>(x));
    } else {
        f(static_cast<mmq_bf16*>(x));
    }
}

template <typename Fn>
void with_format(int fmt, Fn f) {
    switch (fmt) {
        case MMQ_FMT_I8: f.template operator()<MMQ_FMT_I8>(); break;
        case MMQ_FMT_U8: f.template operator()<MMQ_FMT_U8>(); break;
        case MMQ_FMT_I4: f.template operator()<MMQ_FMT_I4>(); break;
        case MMQ_FMT_U4: f.template operator()<MMQ_FMT_U4>(); break;
        default: f.template operator()<MMQ_FMT_E4M3>(); break;
    }
}

}  // namespace

extern "C" {

uint16_t mmq_host_f32_to_f16(float x) { return mmq_f32_to_f16(x); }
float mmq_host_f16_to_f32(uint16_t h) { return mmq_f16_to_f32(h); }
uint16_t mmq_host_f32_to_bf16(float x) { return mmq_f32_to_bf16(x); }
float mmq_host_bf16_to_f32(uint16_t h) { return mmq_bf16_to_f32(h); }

MmqScaleMap mmq_host_scale_map(int64_t mode, int64_t axis_len, int64_t inner, int64_t row_len,
                               int64_t group, int64_t n) {
    return mmq_scale_map(mode, axis_len, inner, row_len, group, n);
}

void mmq_host_quantize(int in, int fmt, const void* x, int64_t n, const float* scales,
                       const uint8_t* zeros, MmqScaleMap map, int saturate, uint8_t* out) {
    with_type(in, const_cast<void*>(x), [&](auto* xt) {
        with_format(fmt, [&]<int F>() {
            for (int64_t c = 0; c * 8 < n; ++c) {
                mmq_quantize_chunk<std::remove_pointer_t<decltype(xt)>, F>(
                    xt, n, scales, zeros, map, saturate != 0, false, out, c);
            }
        });
    });
}

void mmq_host_dequantize(int fmt, int out_type, const uint8_t* codes, int64_t n,
                         const float* scales, const uint8_t* zeros, MmqScaleMap map, void* y) {
    with_type(out_type, y, [&](auto* yt) {
        with_format(fmt, [&]<int F>() {
            for (int64_t c = 0; c * 8 < n; ++c) {
                mmq_dequantize_chunk<std::remove_pointer_t<decltype(yt)>, F>(codes, n, scales,
                                                                             zeros, map, false,
                                                                             yt, c);
            }
        });
    });
}

void mmq_host_quantize_dynamic(int in, int fmt, const void* x, int64_t rows, int64_t row_len,
                               int64_t group, int symmetric, int scale_f16, uint8_t* out,
                               void* scales, uint8_t* zeros) {
    with_type(in, const_cast<void*>(x), [&](auto* xt) {
        using In = std::remove_pointer_t<decltype(xt)>;
        with_format(fmt, [&]<int F>() {
            int64_t per_row = (row_len + group - 1) / group;
            for (int64_t g = 0; g < rows * per_row; ++g) {
                int64_t first, len;
                mmq_group_span(g, row_len, group, &first, &len);
                float mn = mmq_bits_f32(0x7f800000u);
                float mx = -mn;
                for (int64_t i = 0; i < len; ++i) {
                    float v = mmq_to_f32(xt[first + i]);
                    mn = fminf(mn, v);
                    mx = fmaxf(mx, v);
                }
                float s;
                int32_t z;
                mmq_group_qparams<F>(mn, mx, symmetric != 0, scale_f16 != 0, &s, &z);
                mmq_store_group_params(g, s, z, scale_f16 != 0, scales, zeros);
                for (int64_t c = 0; c * 8 < len; ++c) {
                    int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                    mmq_quantize_span<In, F>(xt, first + c * 8, cnt, false, s, z, true, out);
                }
            }
        });
    });
}

// The GEMV as the device runs it: lane l takes K chunks l·32, l·32 + 1024, ...; the 32 lane sums
// are combined in the butterfly order of the warp shuffles.
void mmq_host_nbits_gemv(const uint16_t* a, int64_t m_rows, const uint8_t* b,
                         const uint16_t* scales, const uint8_t* zeros, const uint16_t* bias,
                         uint16_t* y, int64_t n_total, int64_t k, int64_t block) {
    int64_t k_blocks = k / block;
    for (int64_t n = 0; n < n_total; ++n) {
        for (int64_t m = 0; m < m_rows; ++m) {
            float lanes[32];
            for (int lane = 0; lane < 32; ++lane) {
                float acc = 0.0f;
                for (int64_t k0 = lane * 32; k0 < k; k0 += 1024) {
                    uint32_t wb[4];
                    memcpy(wb, b + n * (k / 2) + k0 / 2, sizeof wb);
                    int64_t kb = k0 / block;
                    float s = mmq_f16_to_f32(scales[n * k_blocks + kb]);
                    float z = mmq_nbits_zero(zeros, n, kb, k_blocks);
                    float av[32];
                    for (int j = 0; j < 32; ++j) {
                        av[j] = mmq_f16_to_f32(a[m * k + k0 + j]);
                    }
                    float d[32];
                    mmq_nbits_codes32(wb, z, d);
                    acc += mmq_nbits_dot32(d, av) * s;
                }
                lanes[lane] = acc;
            }
            for (int off = 16; off > 0; off >>= 1) {
                float next[32];
                for (int lane = 0; lane < 32; ++lane) {
                    next[lane] = lanes[lane] + lanes[lane ^ off];
                }
                memcpy(lanes, next, sizeof lanes);
            }
            float bn = bias ? mmq_f16_to_f32(bias[n]) : 0.0f;
            y[m * n_total + n] = mmq_f32_to_f16(lanes[0] + bn);
        }
    }
}

// The GEMM as the device runs it: each output sums K in order.
void mmq_host_nbits_gemm(const uint16_t* a, int64_t m_rows, const uint8_t* b,
                         const uint16_t* scales, const uint8_t* zeros, const uint16_t* bias,
                         uint16_t* y, int64_t n_total, int64_t k, int64_t block) {
    int64_t k_blocks = k / block;
    for (int64_t m = 0; m < m_rows; ++m) {
        for (int64_t n = 0; n < n_total; ++n) {
            float acc = 0.0f;
            for (int64_t kk = 0; kk < k; ++kk) {
                int64_t kb = kk / block;
                float s = mmq_f16_to_f32(scales[n * k_blocks + kb]);
                float z = mmq_nbits_zero(zeros, n, kb, k_blocks);
                uint8_t byte = b[n * (k / 2) + kk / 2];
                uint32_t code = (kk & 1) ? (uint32_t)(byte >> 4) : (uint32_t)(byte & 0xfu);
                acc += mmq_f16_to_f32(a[m * k + kk]) * mmq_nbits_weight(code, z, s);
            }
            float bn = bias ? mmq_f16_to_f32(bias[n]) : 0.0f;
            y[m * n_total + n] = mmq_f32_to_f16(acc + bn);
        }
    }
}

void mmq_host_kv_append(int in, const void* step, int64_t bh_count, int64_t head_dim,
                        int64_t max_blocks, int64_t pos, int8_t* cache, float* scales) {
    with_type(in, const_cast<void*>(step), [&](auto* xt) {
        int64_t per_block = 512 / head_dim;
        int64_t blk = pos / per_block;
        int64_t slot = pos - blk * per_block;
        for (int64_t bh = 0; bh < bh_count; ++bh) {
            const auto* x = xt + bh * head_dim;
            float amax = 0.0f;
            for (int64_t i = 0; i < head_dim; ++i) {
                amax = fmaxf(amax, fabsf(mmq_to_f32(x[i])));
            }
            float* sp = scales + bh * max_blocks + blk;
            float s_old = slot > 0 ? *sp : 0.0f;
            float s_new = mmq_kv_scale(s_old, amax);
            int8_t* block = cache + (bh * max_blocks + blk) * 512;
            if (slot > 0 && s_new != s_old) {
                for (int64_t i = 0; i < slot * head_dim; ++i) {
                    block[i] = mmq_kv_requant(block[i], s_old, s_new);
                }
            }
            for (int64_t i = 0; i < head_dim; ++i) {
                block[slot * head_dim + i] = mmq_kv_code(mmq_to_f32(x[i]), s_new);
            }
            *sp = s_new;
        }
    });
}
}
