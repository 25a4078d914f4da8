// Cache writes. KV: one decode step of K or V, [batch·heads, head_dim], appended at position
// `pos` to INT8 blocks of 512 bytes ([batch·heads, max_blocks, 512], 512 / head_dim tokens per
// block) with one f32 scale per (batch·head, block); a step that needs a larger scale requantizes
// the tokens already in its block. One thread block per batch·head. (Image features go to INT4
// groups of 64 with binary16 scales through the dynamic quantize kernels.)
#include "mmq_blocks.cuh"

template <typename In>
__device__ void mmq_kv_append_impl(const In* step, int64_t bh_count, int64_t head_dim,
                                   int64_t max_blocks, int64_t pos, int8_t* cache,
                                   float* scales) {
    __shared__ float red[32];
    int64_t per_block = 512 / head_dim;
    int64_t blk = pos / per_block;
    int64_t slot = pos - blk * per_block;
    for (int64_t bh = blockIdx.x; bh < bh_count; bh += gridDim.x) {
        const In* x = step + bh * head_dim;
        float amax = 0.0f;
        for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
            amax = fmaxf(amax, fabsf(mmq_to_f32(x[i])));
        }
        for (int off = 16; off > 0; off >>= 1) {
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        }
        if ((threadIdx.x & 31) == 0) {
            red[threadIdx.x >> 5] = amax;
        }
        __syncthreads();
        amax = red[0];
        for (int w = 1; w < (int)((blockDim.x + 31) >> 5); ++w) {
            amax = fmaxf(amax, red[w]);
        }
        __syncthreads();
        float* sp = scales + bh * max_blocks + blk;
        float s_old = slot > 0 ? *sp : 0.0f;
        float s_new = mmq_kv_scale(s_old, amax);
        int8_t* block = cache + (bh * max_blocks + blk) * 512;
        if (slot > 0 && s_new != s_old) {
            for (int64_t i = threadIdx.x; i < slot * head_dim; i += blockDim.x) {
                block[i] = mmq_kv_requant(block[i], s_old, s_new);
            }
        }
        for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
            block[slot * head_dim + i] = mmq_kv_code(mmq_to_f32(x[i]), s_new);
        }
        __syncthreads();  // every thread has read s_old before it is replaced
        if (threadIdx.x == 0) {
            *sp = s_new;
        }
    }
}

#define MMQ_KV_KERNEL(in_name, In)                                                            \
    extern "C" __global__ void mmq_kv_append_##in_name(const In* step, int64_t bh_count,      \
                                                       int64_t head_dim, int64_t max_blocks,  \
                                                       int64_t pos, int8_t* cache,            \
                                                       float* scales) {                       \
        mmq_kv_append_impl<In>(step, bh_count, head_dim, max_blocks, pos, cache, scales);     \
    }
MMQ_KV_KERNEL(f32, float)
MMQ_KV_KERNEL(f16, mmq_f16)
MMQ_KV_KERNEL(bf16, mmq_bf16)
