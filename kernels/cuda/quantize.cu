// Quantize and dequantize kernels: per tensor, per axis and per group with given scales and zero
// points (grid-stride loops over chunks of eight elements, 128-bit loads when aligned), and
// dynamic per group / per token quantization (one block per group: min/max reduction, the
// group's scale and zero point, then the codes, in one pass over the data).
#include "mmq_blocks.cuh"

// How a launch finds its scales: one for the tensor, one per chunk (every chunk inside one scale),
// eight consecutive ones per chunk (per channel along the last axis, channels a multiple of 8),
// or one lookup per element.
enum MmqChunkScales { MMQ_ONE, MMQ_PER_CHUNK, MMQ_RUN, MMQ_PER_ELEMENT };

#define MMQ_COMMA ,
// Calls name<..., How>(args) with the kind of scales `how` as a template argument, so each kind
// gets its own loop.
#define MMQ_BY_HOW(how, name, targs, args)                          \
    switch (how) {                                                  \
        case MMQ_ONE: name<targs, MMQ_ONE> args; break;             \
        case MMQ_PER_CHUNK: name<targs, MMQ_PER_CHUNK> args; break; \
        case MMQ_RUN: name<targs, MMQ_RUN> args; break;             \
        default: name<targs, MMQ_PER_ELEMENT> args; break;          \
    }

__device__ __forceinline__ MmqChunkScales mmq_chunk_scales(const MmqScaleMap& map, bool vec) {
    if (map.mode == 0) {
        return MMQ_ONE;
    }
    if (map.chunk_uniform) {
        return MMQ_PER_CHUNK;
    }
    // Vector loads of the scales too: the launchers' `vec` also vouches for their alignment.
    if (vec && map.mode == 1 && map.inner == 1 && map.axis_len % 8 == 0) {
        return MMQ_RUN;
    }
    return MMQ_PER_ELEMENT;
}

// The scales and zero points j0 .. j0 + 7 (j0 a multiple of 8) with vector loads.
template <int F>
__device__ __forceinline__ void mmq_load_run(const float* scales, const uint8_t* zeros,
                                             int64_t j0, float s[8], int32_t z[8]) {
    float4 a = __ldg(reinterpret_cast<const float4*>(scales + j0));
    float4 b = __ldg(reinterpret_cast<const float4*>(scales + j0) + 1);
    s[0] = a.x, s[1] = a.y, s[2] = a.z, s[3] = a.w;
    s[4] = b.x, s[5] = b.y, s[6] = b.z, s[7] = b.w;
    uint32_t c[8];
    if (zeros == 0 || mmq_fmt<F>::is_float) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            z[e] = 0;
        }
        return;
    }
    mmq_load_codes<F>(zeros, j0, 8, true, c);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        uint32_t u = c[e];
        z[e] = !mmq_fmt<F>::is_signed ? (int32_t)u
               : mmq_fmt<F>::bits == 8 ? (int32_t)(int8_t)u
                                       : (u >= 8 ? (int32_t)u - 16 : (int32_t)u);
    }
}

// A chunk as loaded: its eight values (inputs or codes) and, by the kind of scales, its scale and
// zero point (per chunk) or its eight of each (a run), read together with the values so that a
// chunk's loads are all in flight before it is used.
template <typename T>
struct MmqChunk {
    T v[8];
    float s[8];
    int32_t z[8];
};

// The scales and zero points of the chunk at element a, by the kind of scales (per tensor: none).
template <int F, MmqChunkScales How, typename T>
__device__ __forceinline__ void mmq_load_chunk_scales(MmqChunk<T>& ch, int64_t a,
                                                      const float* scales, const uint8_t* zeros,
                                                      const MmqScaleMap& map) {
    if (How == MMQ_PER_CHUNK) {
        int64_t j0 = mmq_scale_index(map, a);
        ch.s[0] = mmq_ldg(scales + j0);
        ch.z[0] = mmq_zero<F>(zeros, j0);
    } else if (How == MMQ_RUN) {
        mmq_load_run<F>(scales, zeros, mmq_scale_index(map, a), ch.s, ch.z);
    }
}

// Codes the `cnt` loaded values of the chunk at element a.
template <int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_quantize_loaded(const MmqChunk<float>& ch, int64_t a, int cnt,
                                                    const MmqRecip& d0, int32_t z0, bool saturate,
                                                    bool vec, uint8_t* out) {
    if (How == MMQ_ONE) {
        mmq_code_span_fast<F>(ch.v, a, cnt, vec, d0, z0, saturate, out);
    } else if (How == MMQ_PER_CHUNK) {
        mmq_code_span<F>(ch.v, a, cnt, vec, ch.s[0], ch.z[0], saturate, out);
    } else {
        uint32_t c[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            c[e] = mmq_encode<F>(ch.v[e], ch.s[e], ch.z[e], saturate);
        }
        mmq_store_codes<F>(out, a, cnt, vec, c);
    }
}

// Grid-stride over the chunks of eight of n elements: with `pairs`, two full chunks per step (both
// loaded before either is used, so each thread keeps two chunks' loads in flight), then the rest
// one by one; `by_element` maps go chunk by chunk through `one`. `load(a, cnt, vec, chunk)` reads
// chunk a (a `Chunk`); `use(chunk, a, cnt, vec)` codes or decodes and stores it.
template <typename Chunk, typename Load, typename Use, typename One>
__device__ __forceinline__ void mmq_for_chunks(int64_t n, bool vec, bool pairs, bool by_element,
                                               Load load, Use use, One one) {
    int64_t chunks = (n + 7) / 8;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (by_element) {
        for (; c < chunks; c += stride) {
            one(c);
        }
        return;
    }
    if (vec && pairs) {
        for (; (c + stride) * 8 + 8 <= n; c += 2 * stride) {
            Chunk v0, v1;
            load(c * 8, 8, true, v0);
            load((c + stride) * 8, 8, true, v1);
            use(v0, c * 8, 8, true);
            use(v1, (c + stride) * 8, 8, true);
        }
    }
    for (; c < chunks; c += stride) {
        int cnt = n - c * 8 < 8 ? (int)(n - c * 8) : 8;
        Chunk v;
        load(c * 8, cnt, vec, v);
        use(v, c * 8, cnt, vec);
    }
}

template <typename In, int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_quantize_loop(const In* x, int64_t n, const float* scales,
                                                  const uint8_t* zeros, const MmqScaleMap& map,
                                                  const MmqRecip& d0, int32_t z0, bool sat,
                                                  bool vec, uint8_t* out) {
    // A run's eight scales and zero points per chunk: one chunk per step (registers).
    mmq_for_chunks<MmqChunk<float>>(
        n, vec, How != MMQ_RUN, How == MMQ_PER_ELEMENT,
        [&](int64_t a, int cnt, bool v, MmqChunk<float>& ch) {
            mmq_load_span(x, a, cnt, v, ch.v);
            mmq_load_chunk_scales<F, How>(ch, a, scales, zeros, map);
        },
        [&](const MmqChunk<float>& ch, int64_t a, int cnt, bool v) {
            mmq_quantize_loaded<F, How>(ch, a, cnt, d0, z0, sat, v, out);
        },
        [&](int64_t chunk) {
            mmq_quantize_chunk<In, F>(x, n, scales, zeros, map, sat, vec, out, chunk);
        });
}

template <typename In, int F>
__device__ void mmq_quantize_impl(const In* x, int64_t n, const float* scales,
                                  const uint8_t* zeros, MmqScaleMap map, int32_t saturate,
                                  int32_t vec, uint8_t* out) {
    MmqRecip d0 = mmq_recip(mmq_ldg(scales));
    int32_t z0 = mmq_zero<F>(zeros, 0);
    MmqChunkScales how = mmq_chunk_scales(map, vec != 0);
    // A tensor's one scale out of the reciprocal's range (rare) takes the element path, which
    // divides; the per-tensor loop then has the reciprocal alone.
    if (how == MMQ_ONE && !d0.fast) {
        how = MMQ_PER_ELEMENT;
    }
    MMQ_BY_HOW(how, mmq_quantize_loop, In MMQ_COMMA F,
               (x, n, scales, zeros, map, d0, z0, saturate != 0, vec != 0, out))
}

// Decodes the codes of the chunk at element a and stores them.
template <typename Out, int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_dequantize_loaded(const MmqChunk<uint32_t>& ch, int64_t a,
                                                      int cnt, float s0, int32_t z0, bool vec,
                                                      Out* y) {
    float v[8];
    if (How == MMQ_RUN) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] = mmq_decode<F>(ch.v[e], ch.s[e], ch.z[e]);
        }
    } else {
        float s = How == MMQ_PER_CHUNK ? ch.s[0] : s0;
        int32_t z = How == MMQ_PER_CHUNK ? ch.z[0] : z0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] = mmq_decode<F>(ch.v[e], s, z);
        }
    }
    mmq_store_span(y, a, cnt, vec, v);
}

template <typename Out, int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_dequantize_loop(const uint8_t* codes, int64_t n,
                                                    const float* scales, const uint8_t* zeros,
                                                    const MmqScaleMap& map, float s0, int32_t z0,
                                                    bool vec, Out* y) {
    mmq_for_chunks<MmqChunk<uint32_t>>(
        n, vec, How != MMQ_RUN, How == MMQ_PER_ELEMENT,
        [&](int64_t a, int cnt, bool v, MmqChunk<uint32_t>& ch) {
            mmq_load_codes<F>(codes, a, cnt, v, ch.v);
            mmq_load_chunk_scales<F, How>(ch, a, scales, zeros, map);
        },
        [&](const MmqChunk<uint32_t>& ch, int64_t a, int cnt, bool v) {
            mmq_dequantize_loaded<Out, F, How>(ch, a, cnt, s0, z0, v, y);
        },
        [&](int64_t chunk) {
            mmq_dequantize_chunk<Out, F>(codes, n, scales, zeros, map, vec, y, chunk);
        });
}

template <typename Out, int F>
__device__ void mmq_dequantize_impl(const uint8_t* codes, int64_t n, const float* scales,
                                    const uint8_t* zeros, MmqScaleMap map, int32_t vec, Out* y) {
    float s0 = mmq_ldg(scales);
    int32_t z0 = mmq_zero<F>(zeros, 0);
    MMQ_BY_HOW(mmq_chunk_scales(map, vec != 0), mmq_dequantize_loop, Out MMQ_COMMA F,
               (codes, n, scales, zeros, map, s0, z0, vec != 0, y))
}

// min and max over the block (every thread gets the result); `red` holds 64 floats.
__device__ void mmq_block_minmax(float* mn, float* mx, float* red) {
    for (int off = 16; off > 0; off >>= 1) {
        *mn = fminf(*mn, __shfl_xor_sync(0xffffffffu, *mn, off));
        *mx = fmaxf(*mx, __shfl_xor_sync(0xffffffffu, *mx, off));
    }
    int warp = threadIdx.x >> 5;
    int warps = (blockDim.x + 31) >> 5;
    if ((threadIdx.x & 31) == 0) {
        red[warp] = *mn;
        red[32 + warp] = *mx;
    }
    __syncthreads();
    *mn = red[0];
    *mx = red[32];
    for (int w = 1; w < warps; ++w) {
        *mn = fminf(*mn, red[w]);
        *mx = fmaxf(*mx, red[32 + w]);
    }
    __syncthreads();
}

// Folds the first `cnt` of v into [mn, mx].
__device__ __forceinline__ void mmq_span_minmax(const float v[8], int cnt, float* mn, float* mx) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        if (e < cnt) {
            *mn = fminf(*mn, v[e]);
            *mx = fmaxf(*mx, v[e]);
        }
    }
}

// One block per group (grid-stride over groups); blockDim.x a multiple of 32. A group of at most
// MMQ_HELD chunks per thread is read once: its values stay in registers between the reduction
// and the coding; a longer group is read twice.
#define MMQ_HELD 2
template <typename In, int F, bool ScaleF16>
__device__ void mmq_quantize_dynamic_impl(const In* x, int64_t rows, int64_t row_len,
                                          int64_t group, int32_t symmetric, int32_t vec,
                                          uint8_t* out, void* scales, uint8_t* zeros) {
    __shared__ float red[64];
    int64_t per_row = (row_len + group - 1) / group;
    for (int64_t g = blockIdx.x; g < rows * per_row; g += gridDim.x) {
        int64_t first, len;
        mmq_group_span(g, row_len, group, &first, &len);
        float mn = mmq_bits_f32(0x7f800000u);  // +inf
        float mx = -mn;
        bool held = len <= (int64_t)blockDim.x * 8 * MMQ_HELD;
        float h[MMQ_HELD][8];
        if (held) {
#pragma unroll
            for (int r = 0; r < MMQ_HELD; ++r) {
                int64_t c = threadIdx.x + (int64_t)r * blockDim.x;
                int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                if (cnt > 0) {
                    mmq_load_span(x, first + c * 8, cnt, vec != 0, h[r]);
                    mmq_span_minmax(h[r], cnt, &mn, &mx);
                }
            }
        } else {
            for (int64_t c = threadIdx.x; c * 8 < len; c += blockDim.x) {
                int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                float v[8];
                mmq_load_span(x, first + c * 8, cnt, vec != 0, v);
                mmq_span_minmax(v, cnt, &mn, &mx);
            }
        }
        mmq_block_minmax(&mn, &mx, red);
        float s;
        int32_t z;
        mmq_group_qparams<F>(mn, mx, symmetric != 0, ScaleF16, &s, &z);
        MmqRecip d = mmq_recip(s);
        if (threadIdx.x == 0) {
            mmq_store_group_params(g, s, z, ScaleF16, scales, zeros);
        }
        // Held values are coded by the reciprocal; a scale out of its range (rare: a group of
        // tiny or huge values) reads the group again and divides.
        if (held && d.fast) {
#pragma unroll
            for (int r = 0; r < MMQ_HELD; ++r) {
                int64_t c = threadIdx.x + (int64_t)r * blockDim.x;
                int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                if (cnt > 0) {
                    mmq_code_span_fast<F>(h[r], first + c * 8, cnt, vec != 0, d, z, true, out);
                }
            }
        } else {
            for (int64_t c = threadIdx.x; c * 8 < len; c += blockDim.x) {
                int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                float v[8];
                mmq_load_span(x, first + c * 8, cnt, vec != 0, v);
                mmq_code_span<F>(v, first + c * 8, cnt, vec != 0, d, z, true, out);
            }
        }
    }
}

#define MMQ_QUANT_KERNELS(in_name, In, fmt_name, F)                                              \
    extern "C" __global__ void __launch_bounds__(256, 4) mmq_quantize_##in_name##_##fmt_name(   \
        const In* x, int64_t n, const float* scales, const uint8_t* zeros, MmqScaleMap map,     \
        int32_t saturate, int32_t vec, uint8_t* out) {                                          \
        mmq_quantize_impl<In, F>(x, n, scales, zeros, map, saturate, vec, out);                 \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 4) mmq_dequantize_##fmt_name##_##in_name( \
        const uint8_t* codes, int64_t n, const float* scales, const uint8_t* zeros,             \
        MmqScaleMap map, int32_t vec, In* y) {                                                  \
        mmq_dequantize_impl<In, F>(codes, n, scales, zeros, map, vec, y);                       \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(512) mmq_quantize_dynamic_##in_name##_##fmt_name##_f32s(              \
        const In* x, int64_t rows, int64_t row_len, int64_t group, int32_t symmetric,          \
        int32_t vec, uint8_t* out, float* scales, uint8_t* zeros) {                             \
        mmq_quantize_dynamic_impl<In, F, false>(x, rows, row_len, group, symmetric, vec, out,   \
                                                scales, zeros);                                 \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(512) mmq_quantize_dynamic_##in_name##_##fmt_name##_f16s(              \
        const In* x, int64_t rows, int64_t row_len, int64_t group, int32_t symmetric,          \
        int32_t vec, uint8_t* out, uint16_t* scales, uint8_t* zeros) {                          \
        mmq_quantize_dynamic_impl<In, F, true>(x, rows, row_len, group, symmetric, vec, out,    \
                                               scales, zeros);                                  \
    }

#define MMQ_QUANT_KERNELS_ALL_FORMATS(in_name, In)        \
    MMQ_QUANT_KERNELS(in_name, In, i8, MMQ_FMT_I8)        \
    MMQ_QUANT_KERNELS(in_name, In, u8, MMQ_FMT_U8)        \
    MMQ_QUANT_KERNELS(in_name, In, i4, MMQ_FMT_I4)        \
    MMQ_QUANT_KERNELS(in_name, In, u4, MMQ_FMT_U4)        \
    MMQ_QUANT_KERNELS(in_name, In, e4m3, MMQ_FMT_E4M3)

MMQ_QUANT_KERNELS_ALL_FORMATS(f32, float)
MMQ_QUANT_KERNELS_ALL_FORMATS(f16, mmq_f16)
MMQ_QUANT_KERNELS_ALL_FORMATS(bf16, mmq_bf16)
