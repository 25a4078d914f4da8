// Quantize and dequantize kernels: per tensor, per axis and per group with given scales and zero
// points (grid-stride loops over chunks of eight elements, 128-bit loads when aligned), and
// dynamic per group / per token quantization (one block per group: min/max reduction, the
// group's scale and zero point, then the codes, in one pass over the data).
#include "mmq_blocks.cuh"

#define MMQ_GRID_STRIDE(i, count)                                                             \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (count);              \
         i += (int64_t)gridDim.x * blockDim.x)

template <typename In, int F>
__device__ void mmq_quantize_impl(const In* x, int64_t n, const float* scales,
                                  const uint8_t* zeros, MmqScaleMap map, int32_t saturate,
                                  int32_t vec, uint8_t* out) {
    MMQ_GRID_STRIDE(chunk, (n + 7) / 8) {
        mmq_quantize_chunk<In, F>(x, n, scales, zeros, map, saturate != 0, vec != 0, out, chunk);
    }
}

template <typename Out, int F>
__device__ void mmq_dequantize_impl(const uint8_t* codes, int64_t n, const float* scales,
                                    const uint8_t* zeros, MmqScaleMap map, int32_t vec, Out* y) {
    MMQ_GRID_STRIDE(chunk, (n + 7) / 8) {
        mmq_dequantize_chunk<Out, F>(codes, n, scales, zeros, map, vec != 0, y, chunk);
    }
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
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        if (e < cnt) {
                            mn = fminf(mn, h[r][e]);
                            mx = fmaxf(mx, h[r][e]);
                        }
                    }
                }
            }
        } else {
            for (int64_t c = threadIdx.x; c * 8 < len; c += blockDim.x) {
                int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                float v[8];
                mmq_load_span(x, first + c * 8, cnt, vec != 0, v);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    if (e < cnt) {
                        mn = fminf(mn, v[e]);
                        mx = fmaxf(mx, v[e]);
                    }
                }
            }
        }
        mmq_block_minmax(&mn, &mx, red);
        float s;
        int32_t z;
        mmq_group_qparams<F>(mn, mx, symmetric != 0, ScaleF16, &s, &z);
        if (threadIdx.x == 0) {
            mmq_store_group_params(g, s, z, ScaleF16, scales, zeros);
        }
        if (held) {
#pragma unroll
            for (int r = 0; r < MMQ_HELD; ++r) {
                int64_t c = threadIdx.x + (int64_t)r * blockDim.x;
                int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                if (cnt > 0) {
                    mmq_code_span<F>(h[r], first + c * 8, cnt, vec != 0, s, z, true, out);
                }
            }
        } else {
            for (int64_t c = threadIdx.x; c * 8 < len; c += blockDim.x) {
                int cnt = len - c * 8 < 8 ? (int)(len - c * 8) : 8;
                mmq_quantize_span<In, F>(x, first + c * 8, cnt, vec != 0, s, z, true, out);
            }
        }
    }
}

#define MMQ_QUANT_KERNELS(in_name, In, fmt_name, F)                                              \
    extern "C" __global__ void mmq_quantize_##in_name##_##fmt_name(                             \
        const In* x, int64_t n, const float* scales, const uint8_t* zeros, MmqScaleMap map,     \
        int32_t saturate, int32_t vec, uint8_t* out) {                                          \
        mmq_quantize_impl<In, F>(x, n, scales, zeros, map, saturate, vec, out);                 \
    }                                                                                           \
    extern "C" __global__ void mmq_dequantize_##fmt_name##_##in_name(                           \
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
