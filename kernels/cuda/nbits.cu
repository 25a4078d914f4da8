// INT4 weight-only matrix products in the layout of com.microsoft MatMulNBits (bits 4): one
// packed weight serves ONNX Runtime and these kernels. Y[M, N] = A[M, K] · dequant(B)ᵀ (+ bias),
// A, scales, bias and Y binary16, f32 accumulation. K is a multiple of the block size, which is
// at least 32.
//
// GEMV (decode, M = 1..8): one warp per output column; each lane reads 16 bytes of B (32 codes of
// one block) per step with a 128-bit streaming load, two steps in flight, and the matching 32
// values of every row of A (through L1); codes minus zero point are exact f32, and each block's
// scale multiplies its partial sum once.
// GEMM (prefill): 64×64 output tiles, K steps of 32 staged in shared memory as f32.
#include "mmq_blocks.cuh"

// 16 bytes of B, streamed: read once, so kept out of L1 (which holds A for the whole block).
__device__ __forceinline__ uint4 mmq_ld_stream(const uint8_t* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// One lane's step: 32 K from k0 of column n, for every row of A.
template <int M>
__device__ __forceinline__ void mmq_nbits_gemv_step(const mmq_f16* a, uint4 wq, int64_t k0,
                                                    int64_t n, const mmq_f16* scales,
                                                    const uint8_t* zeros, int64_t k,
                                                    int64_t k_blocks, int block_log2,
                                                    float acc[M]) {
    uint32_t wb[4] = {wq.x, wq.y, wq.z, wq.w};
    int64_t kb = k0 >> block_log2;
    float s = mmq_f16_to_f32(mmq_ldg(&scales[n * k_blocks + kb].bits));
    float d[32];
    mmq_nbits_codes32(wb, mmq_nbits_zero(zeros, n, kb, k_blocks), d);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        float av[32];
        const uint4* ap = reinterpret_cast<const uint4*>(a + m * k + k0);
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint4 aq = __ldg(ap + q);
            uint32_t w[4] = {aq.x, aq.y, aq.z, aq.w};
            mmq_unpack8(w, mmq_f16(), av + 8 * q);
        }
        acc[m] += mmq_nbits_dot32(d, av) * s;
    }
}

template <int M>
__device__ void mmq_nbits_gemv_impl(const mmq_f16* a, const uint8_t* b, const mmq_f16* scales,
                                    const uint8_t* zeros, const mmq_f16* bias, mmq_f16* y,
                                    int64_t n_total, int64_t k, int64_t block) {
    int lane = threadIdx.x & 31;
    int warps = blockDim.x >> 5;
    int64_t k_blocks = k / block;
    int block_log2 = __ffsll(block) - 1;  // the block is a power of two
    for (int64_t n = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); n < n_total;
         n += (int64_t)gridDim.x * warps) {
        float acc[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
            acc[m] = 0.0f;
        }
        const uint8_t* brow = b + n * (k / 2);
        // Two steps per iteration, both loads issued before either is used.
        int64_t k0 = (int64_t)lane * 32;
        for (; k0 + 1024 < k; k0 += 2048) {
            uint4 w0 = mmq_ld_stream(brow + k0 / 2);
            uint4 w1 = mmq_ld_stream(brow + (k0 + 1024) / 2);
            mmq_nbits_gemv_step<M>(a, w0, k0, n, scales, zeros, k, k_blocks, block_log2, acc);
            mmq_nbits_gemv_step<M>(a, w1, k0 + 1024, n, scales, zeros, k, k_blocks, block_log2,
                                   acc);
        }
        if (k0 < k) {
            uint4 w0 = mmq_ld_stream(brow + k0 / 2);
            mmq_nbits_gemv_step<M>(a, w0, k0, n, scales, zeros, k, k_blocks, block_log2, acc);
        }
        float bn = bias ? mmq_f16_to_f32(mmq_ldg(&bias[n].bits)) : 0.0f;
#pragma unroll
        for (int m = 0; m < M; ++m) {
            float v = acc[m];
            for (int off = 16; off > 0; off >>= 1) {
                v += __shfl_xor_sync(0xffffffffu, v, off);
            }
            if (lane == 0) {
                y[m * n_total + n].bits = mmq_f32_to_f16(v + bn);
            }
        }
    }
}

#define MMQ_GEMV_KERNEL(M)                                                                    \
    extern "C" __global__ void mmq_nbits_gemv_m##M(                                           \
        const mmq_f16* a, const uint8_t* b, const mmq_f16* scales, const uint8_t* zeros,      \
        const mmq_f16* bias, mmq_f16* y, int64_t n, int64_t k, int64_t block) {               \
        mmq_nbits_gemv_impl<M>(a, b, scales, zeros, bias, y, n, k, block);                    \
    }
MMQ_GEMV_KERNEL(1)
MMQ_GEMV_KERNEL(2)
MMQ_GEMV_KERNEL(3)
MMQ_GEMV_KERNEL(4)
MMQ_GEMV_KERNEL(5)
MMQ_GEMV_KERNEL(6)
MMQ_GEMV_KERNEL(7)
MMQ_GEMV_KERNEL(8)

// 256 threads, a 16×16 grid of 4×4 output fragments; grid (ceil(N / 64), ceil(M / 64)).
extern "C" __global__ void mmq_nbits_gemm(const mmq_f16* a, const uint8_t* b,
                                          const mmq_f16* scales, const uint8_t* zeros,
                                          const mmq_f16* bias, mmq_f16* y, int64_t m_total,
                                          int64_t n_total, int64_t k, int64_t block) {
    __shared__ float as[32][64];
    __shared__ float bs[32][64];
    int tid = threadIdx.x;
    int tx = tid & 15;
    int ty = tid >> 4;
    int64_t row0 = (int64_t)blockIdx.y * 64;
    int64_t col0 = (int64_t)blockIdx.x * 64;
    int64_t k_blocks = k / block;
    float acc[4][4];
    for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
            acc[i][j] = 0.0f;
        }
    }
    // Loader roles: A, row tid / 4, K offset (tid % 4) · 8; B, column tid / 4, the same K range.
    int lr = tid >> 2;
    int lk = (tid & 3) * 8;
    for (int64_t k0 = 0; k0 < k; k0 += 32) {
        float v[8];
        int64_t m = row0 + lr;
        if (m < m_total) {
            mmq_load_span(a, m * k + k0 + lk, 8, true, v);
        } else {
            for (int e = 0; e < 8; ++e) {
                v[e] = 0.0f;
            }
        }
        for (int e = 0; e < 8; ++e) {
            as[lk + e][lr] = v[e];
        }
        int64_t n = col0 + lr;
        if (n < n_total) {
            int64_t kb = k0 / block;
            float s = mmq_f16_to_f32(mmq_ldg(&scales[n * k_blocks + kb].bits));
            float z = mmq_nbits_zero(zeros, n, kb, k_blocks);
            uint32_t w = __ldg(reinterpret_cast<const unsigned int*>(b + n * (k / 2) + (k0 + lk) / 2));
            for (int e = 0; e < 8; ++e) {
                bs[lk + e][lr] = mmq_nbits_weight((w >> (4 * e)) & 0xfu, z, s);
            }
        } else {
            for (int e = 0; e < 8; ++e) {
                bs[lk + e][lr] = 0.0f;
            }
        }
        __syncthreads();
        for (int kk = 0; kk < 32; ++kk) {
            float af[4], bf[4];
            for (int i = 0; i < 4; ++i) {
                af[i] = as[kk][ty * 4 + i];
                bf[i] = bs[kk][tx * 4 + i];
            }
            for (int i = 0; i < 4; ++i) {
                for (int j = 0; j < 4; ++j) {
                    acc[i][j] += af[i] * bf[j];
                }
            }
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
        int64_t m = row0 + ty * 4 + i;
        for (int j = 0; j < 4; ++j) {
            int64_t n = col0 + tx * 4 + j;
            if (m < m_total && n < n_total) {
                float bn = bias ? mmq_f16_to_f32(mmq_ldg(&bias[n].bits)) : 0.0f;
                y[m * n_total + n].bits = mmq_f32_to_f16(acc[i][j] + bn);
            }
        }
    }
}

// The dense binary16 GEMV the INT4 GEMV is measured against (and that unquantized decode layers
// can use): Y[M, N] = A[M, K] · W[N, K]ᵀ, one warp per column, 128-bit loads of W and A, f32
// accumulation. K is a multiple of 8.
template <int M>
__device__ void mmq_dense_gemv_impl(const mmq_f16* a, const mmq_f16* w, mmq_f16* y,
                                    int64_t n_total, int64_t k) {
    int lane = threadIdx.x & 31;
    int warps = blockDim.x >> 5;
    for (int64_t n = (int64_t)blockIdx.x * warps + (threadIdx.x >> 5); n < n_total;
         n += (int64_t)gridDim.x * warps) {
        float acc[M];
        for (int m = 0; m < M; ++m) {
            acc[m] = 0.0f;
        }
        for (int64_t k0 = (int64_t)lane * 8; k0 < k; k0 += 32 * 8) {
            float wv[8];
            mmq_load_span(w, n * k + k0, 8, true, wv);
            for (int m = 0; m < M; ++m) {
                float av[8];
                mmq_load_span(a, m * k + k0, 8, true, av);
                for (int j = 0; j < 8; ++j) {
                    acc[m] += av[j] * wv[j];
                }
            }
        }
        for (int m = 0; m < M; ++m) {
            float v = acc[m];
            for (int off = 16; off > 0; off >>= 1) {
                v += __shfl_xor_sync(0xffffffffu, v, off);
            }
            if (lane == 0) {
                y[m * n_total + n].bits = mmq_f32_to_f16(v);
            }
        }
    }
}

#define MMQ_DENSE_GEMV_KERNEL(M)                                                              \
    extern "C" __global__ void mmq_dense_gemv_m##M(const mmq_f16* a, const mmq_f16* w,        \
                                                   mmq_f16* y, int64_t n, int64_t k) {        \
        mmq_dense_gemv_impl<M>(a, w, y, n, k);                                                \
    }
MMQ_DENSE_GEMV_KERNEL(1)
MMQ_DENSE_GEMV_KERNEL(4)
MMQ_DENSE_GEMV_KERNEL(8)
