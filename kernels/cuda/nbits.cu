// INT4 weight-only matrix products in the layout of com.microsoft MatMulNBits (bits 4): one
// packed weight serves ONNX Runtime and these kernels. Y[M, N] = A[M, K] · dequant(B)ᵀ (+ bias),
// A, scales, bias and Y binary16, f32 accumulation. K is a multiple of the block size, which is
// at least 32.
//
// GEMV (decode, M = 1..8): one warp per output column; each lane reads 16 bytes of B (32 codes of
// one block) per step with a 128-bit streaming load, four steps in flight, and the matching 32
// values of every row of A (through L1); codes minus zero point are exact f32, and each block's
// scale multiplies its partial sum once.
// GEMM (prefill): 64×64 output tiles, K steps of 32 staged in shared memory as f32.
#include "mmq_blocks.cuh"

// 16 bytes of B, streamed: read once, so kept out of L1 (which holds A for the whole block).
__device__ __forceinline__ uint4 mmq_ld_stream(const uint8_t* p) {
#if !defined(MMQ_EMULATE)
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#else
    return __ldg(reinterpret_cast<const uint4*>(p));
#endif
}

// One lane's step: 32 K from k0 of column n, for every row of A.
template <int M>
__device__ __forceinline__ void mmq_nbits_gemv_step(const mmq_f16* a, uint4 wq,
                                                    MmqNbitsSide side, int64_t k0, int64_t k,
                                                    int block_log2, float acc[M]) {
    uint32_t wb[4] = {wq.x, wq.y, wq.z, wq.w};
    int64_t kb = k0 >> block_log2;
    float s = mmq_nbits_side_scale(side);
    float d[32];
    mmq_nbits_codes32(wb, mmq_nbits_side_zero(side, kb), d);
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

#define MMQ_GEMV_DEPTH 4
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
        // Lane steps k0 = 32 lane + 1024 i; MMQ_GEMV_DEPTH loads stay in flight: a step's bytes
        // are consumed as the load DEPTH steps ahead is issued.
        uint4 w[MMQ_GEMV_DEPTH];
        MmqNbitsSide side[MMQ_GEMV_DEPTH];
#pragma unroll
        for (int p = 0; p < MMQ_GEMV_DEPTH; ++p) {
            int64_t kp = (int64_t)lane * 32 + (int64_t)p * 1024;
            if (kp < k) {
                w[p] = mmq_ld_stream(brow + kp / 2);
                side[p] = mmq_nbits_side(scales, zeros, n, kp >> block_log2, k_blocks);
            }
        }
        for (int64_t k0 = (int64_t)lane * 32; k0 < k; k0 += MMQ_GEMV_DEPTH * 1024) {
#pragma unroll
            for (int p = 0; p < MMQ_GEMV_DEPTH; ++p) {
                int64_t kp = k0 + (int64_t)p * 1024;
                if (kp < k) {
                    uint4 cur = w[p];
                    MmqNbitsSide cur_side = side[p];
                    int64_t next = kp + MMQ_GEMV_DEPTH * 1024;
                    if (next < k) {
                        w[p] = mmq_ld_stream(brow + next / 2);
                        side[p] = mmq_nbits_side(scales, zeros, n, next >> block_log2, k_blocks);
                    }
                    mmq_nbits_gemv_step<M>(a, cur, cur_side, kp, k, block_log2, acc);
                }
            }
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

// ---- The tensor-core GEMV (sm_80 and later, quantization blocks of 128 or more): a block of
// MMQ_TC_WARPS warps computes 16 output columns for every row of A (M <= 8, the n8 side of
// mma.m16n8k16); its warps split K in steps of 128. In a step, lane (g = lane / 4, t = lane % 4)
// reads the 32 codes at K = base + 32 t .. + 31 of columns n0 + g and n0 + g + 8 (16 bytes each,
// later steps' already in flight) and the 32 matching values of row g of A. mma sums over its 16
// K slots in any order, so the slots are assigned to suit the unpacking: 8 codes become binary16
// pairs (c0, c4), (c1, c5), (c2, c6), (c3, c7) with two logic operations per pair (1024 + c in
// binary16 has c in its low mantissa bits), code minus zero point exactly; A's values are paired
// the same way with byte permutes. Products are exact and sums f32; a step lies in one block, so
// its sum is scaled once, in f32.
#define MMQ_TC_WARPS 8

// a - b and a · b + c on binary16 pairs, each rounded once to nearest even.
__device__ __forceinline__ uint32_t mmq_sub_f16x2(uint32_t a, uint32_t b) {
#if defined(MMQ_EMULATE)
    return mmq_emu_sub_f16x2(a, b);
#else
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
#endif
}

__device__ __forceinline__ uint32_t mmq_fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
#if defined(MMQ_EMULATE)
    return mmq_emu_fma_f16x2(a, b, c);
#else
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

// (a & b) | c in one instruction.
__device__ __forceinline__ uint32_t mmq_and_or(uint32_t a, uint32_t b, uint32_t c) {
#if defined(MMQ_EMULATE)
    return (a & b) | c;
#else
    uint32_t d;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
#endif
}

// Binary16 pairs of 8 codes minus zero point z: (c0 - z, c4 - z), (c1 - z, c5 - z), ...;
// z1024 = (1024 + z) twice, z64 = (-64 - z) twice.
__device__ __forceinline__ void mmq_tc_codes(uint32_t w, uint32_t z1024, uint32_t z64,
                                             uint32_t d[4]) {
    const uint32_t lo = 0x000f000fu, hi = 0x00f000f0u, magic = 0x64006400u;
    const uint32_t sixteenth = 0x2c002c00u;  // (1/16, 1/16)
    uint32_t w2 = w >> 8;
    // (1024 + c0, 1024 + c4) less z1024; (1024 + 16 c1, 1024 + 16 c5) / 16 less 64 + z; ...
    d[0] = mmq_sub_f16x2(mmq_and_or(w, lo, magic), z1024);
    d[1] = mmq_fma_f16x2(mmq_and_or(w, hi, magic), sixteenth, z64);
    d[2] = mmq_sub_f16x2(mmq_and_or(w2, lo, magic), z1024);
    d[3] = mmq_fma_f16x2(mmq_and_or(w2, hi, magic), sixteenth, z64);
}

// (1024 + z, 1024 + z) and (-64 - z, -64 - z) in binary16 for zero point z (0..15).
__device__ __forceinline__ void mmq_tc_zero(float z, uint32_t* z1024, uint32_t* z64) {
    uint32_t a = mmq_f32_to_f16(1024.0f + z);
    uint32_t b = mmq_f32_to_f16(-64.0f - z);
    *z1024 = a | (a << 16);
    *z64 = b | (b << 16);
}

__device__ __forceinline__ void mmq_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(MMQ_EMULATE)
    mmq_emu_mma_m16n8k16(c, a0, a1, a2, a3, b0, b1);
#elif __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();  // the launchers use the tensor-core GEMV on sm_80 and later only
#endif
}

// A lane's two columns: their codes, scales and zero points (zero points null: 8).
struct MmqTcRows {
    const uint8_t* bg;
    const uint8_t* bh;
    const mmq_f16* sg;
    const mmq_f16* sh;
    const uint8_t* zg;
    const uint8_t* zh;
};

// What a step loads ahead: 16 bytes of codes and the scale bits of each column, and the bytes
// holding their zero points.
struct MmqTcLoad {
    uint4 wg, wh;
    uint16_t sg, sh;
    uint8_t zg, zh;
};

__device__ __forceinline__ MmqTcLoad mmq_tc_load(const MmqTcRows& r, int64_t kt, int block_log2) {
    int64_t kb = kt >> block_log2;
    MmqTcLoad l;
    l.wg = mmq_ld_stream(r.bg + kt / 2);
    l.wh = mmq_ld_stream(r.bh + kt / 2);
    l.sg = mmq_ldg(&r.sg[kb].bits);
    l.sh = mmq_ldg(&r.sh[kb].bits);
    l.zg = r.zg ? mmq_ldg(r.zg + kb / 2) : (uint8_t)0x88;
    l.zh = r.zh ? mmq_ldg(r.zh + kb / 2) : (uint8_t)0x88;
    return l;
}

// One step of a lane: the 32 codes at K = kt .. kt + 31 of its two columns against row g of A,
// into c. The quad's 128 K lie in one quantization block (blocks of at least 128), so the step's
// sum is scaled once per column, in f32.
template <int M>
__device__ __forceinline__ void mmq_tc_step(const mmq_f16* arow, bool has_row, const MmqTcLoad& l,
                                            int64_t kt, int block_log2, float c[4]) {
    int64_t kb = kt >> block_log2;
    MmqNbitsSide side_g = {l.sg, l.zg}, side_h = {l.sh, l.zh};
    uint32_t zg1024, zg64, zh1024, zh64;
    mmq_tc_zero(mmq_nbits_side_zero(side_g, kb), &zg1024, &zg64);
    mmq_tc_zero(mmq_nbits_side_zero(side_h, kb), &zh1024, &zh64);
    uint32_t ag[4] = {l.wg.x, l.wg.y, l.wg.z, l.wg.w};
    uint32_t ah[4] = {l.wh.x, l.wh.y, l.wh.z, l.wh.w};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        uint32_t dg[4], dh[4];
        mmq_tc_codes(ag[j], zg1024, zg64, dg);
        mmq_tc_codes(ah[j], zh1024, zh64, dh);
        uint32_t x0 = 0, x1 = 0, x2 = 0, x3 = 0;
        if (has_row) {
            uint4 av = __ldg(reinterpret_cast<const uint4*>(arow + kt + 8 * j));
            x0 = __byte_perm(av.x, av.z, 0x5410);  // (a0, a4)
            x1 = __byte_perm(av.x, av.z, 0x7632);  // (a1, a5)
            x2 = __byte_perm(av.y, av.w, 0x5410);  // (a2, a6)
            x3 = __byte_perm(av.y, av.w, 0x7632);  // (a3, a7)
        }
        // Slots 2t, 2t + 1 hold (c0, c4) and slots 2t + 8, 2t + 9 hold (c1, c5); then the same
        // for (c2, c6) and (c3, c7).
        mmq_mma(d, dg[0], dh[0], dg[1], dh[1], x0, x1);
        mmq_mma(d, dg[2], dh[2], dg[3], dh[3], x2, x3);
    }
    float sg = mmq_nbits_side_scale(side_g);
    float sh = mmq_nbits_side_scale(side_h);
    c[0] += sg * d[0];
    c[1] += sg * d[1];
    c[2] += sh * d[2];
    c[3] += sh * d[3];
}

// The end of a tensor-core GEMV block's group of 16 columns: the warps' partial sums through
// shared memory into warp 0, plus the bias, as binary16. Lane (g, t) holds c[0], c[1] for column
// n0 + g, rows m = 2t, 2t + 1 of A, and c[2], c[3] for column n0 + g + 8.
template <int M>
__device__ __forceinline__ void mmq_tc_finish(float (*part)[32][4], float c[4], int64_t n0,
                                              int64_t n_total, const mmq_f16* bias, mmq_f16* y) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        part[warp][lane][i] = c[i];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int w = 1; w < MMQ_TC_WARPS; ++w) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                c[i] += part[w][lane][i];
            }
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int64_t n = n0 + (lane >> 2) + (i >= 2 ? 8 : 0);
            const int m = 2 * (lane & 3) + (i & 1);
            if (m < M && n < n_total) {
                float bn = bias ? mmq_f16_to_f32(mmq_ldg(&bias[n].bits)) : 0.0f;
                y[m * n_total + n].bits = mmq_f32_to_f16(c[i] + bn);
            }
        }
    }
    __syncthreads();  // `part` is free for the next group
}

// Steps each lane keeps in flight (16 bytes of each of its two columns per step, with their
// scales and zero points).
#define MMQ_TC_DEPTH 3

template <int M>
__device__ void mmq_nbits_gemv_tc_impl(const mmq_f16* a, const uint8_t* b,
                                       const mmq_f16* scales, const uint8_t* zeros,
                                       const mmq_f16* bias, mmq_f16* y, int64_t n_total,
                                       int64_t k, int64_t block) {
    __shared__ float part[MMQ_TC_WARPS][32][4];
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int g = lane >> 2;
    int t = lane & 3;
    int64_t k_blocks = k / block;
    int64_t zero_row = (k_blocks + 1) / 2;
    int block_log2 = __ffsll(block) - 1;
    bool has_row = g < M;
    const mmq_f16* arow = a + (has_row ? g : 0) * k;
    const int64_t step = MMQ_TC_WARPS * 128;
    // Blocks stride over groups of 16 columns.
    for (int64_t n0 = (int64_t)blockIdx.x * 16; n0 < n_total; n0 += (int64_t)gridDim.x * 16) {
        int64_t rg = n0 + g < n_total ? n0 + g : n_total - 1;  // rows past N read row N - 1
        int64_t rh = n0 + g + 8 < n_total ? n0 + g + 8 : n_total - 1;
        MmqTcRows rows = {b + rg * (k / 2),
                          b + rh * (k / 2),
                          scales + rg * k_blocks,
                          scales + rh * k_blocks,
                          zeros ? zeros + rg * zero_row : nullptr,
                          zeros ? zeros + rh * zero_row : nullptr};
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        // The lane's 32 K of its warp's steps: kt0, kt0 + step, ...; MMQ_TC_DEPTH in flight. K is
        // a multiple of the block, so of 128: a step is whole.
        int64_t kt0 = (int64_t)warp * 128 + 32 * t;
        MmqTcLoad ahead[MMQ_TC_DEPTH];
#pragma unroll
        for (int p = 0; p < MMQ_TC_DEPTH; ++p) {
            if (kt0 + p * step < k) {
                ahead[p] = mmq_tc_load(rows, kt0 + p * step, block_log2);
            }
        }
        for (int64_t kt = kt0; kt < k; kt += MMQ_TC_DEPTH * step) {
#pragma unroll
            for (int p = 0; p < MMQ_TC_DEPTH; ++p) {
                int64_t kp = kt + p * step;
                if (kp < k) {
                    MmqTcLoad cur = ahead[p];
                    int64_t next = kp + MMQ_TC_DEPTH * step;
                    if (next < k) {
                        ahead[p] = mmq_tc_load(rows, next, block_log2);
                    }
                    mmq_tc_step<M>(arow, has_row, cur, kp, block_log2, c);
                }
            }
        }
        mmq_tc_finish<M>(part, c, n0, n_total, bias, y);
    }
}

// ---- The lean tensor-core GEMV: the arithmetic of the kernel above (the same fragments, the same
// exact products and f32 sums, scaled once per step) with half the instructions per code, its
// predecessor having been measured as bound by instruction issue and load latency rather than by
// memory. Indices are 32-bit (K < 2^31) and each lane's pointers advance by a constant per step;
// a step's codes, scale bits, zero-point bytes and A fragments are all loaded MMQ_LEAN_DEPTH - 1
// steps ahead, into a ring whose slot is refilled right after it is consumed (no copies); without
// zero points (the common symmetric case, a template parameter) the code offsets are constants,
// and with them they are built from the nibble with integer operations (1024 + z is 0x6400 + z
// in binary16, -64 - z is 0xd400 + 16 z).
#define MMQ_LEAN_DEPTH 3

// A pointer the compiler must keep in a register: left to itself, ptxas recomputes a lane's row
// pointers (64-bit clamps and products) at every step.
template <typename T>
__device__ __forceinline__ T* mmq_kept(T* p) {
#if !defined(MMQ_EMULATE)
    asm("" : "+l"(p));
#endif
    return p;
}

// What one step of a lane reads: 16 bytes of codes of each of its two columns, their scale bits
// (column g low, g + 8 high), their zero-point bytes, and 64 bytes of its row of A.
template <bool Small>
struct MmqLeanSlot {
    uint4 wg, wh;
    uint32_t scales;
    uint32_t zeros;
    uint4 a[4];
};

// Blocks of 32 and 64 (`Small`): a step's 128 K span 4 or 2 blocks, and the 16 K slots of one mma
// must lie in one block to be scaled once. Lane t then takes, of each of the step's four pieces
// of 32 K, the 8 at 32 j + 8 t (4 bytes of codes of each column, 16 bytes of A), so a piece's two
// mma lie in one block and are scaled by its scale; a step reads the 4 or 2 scale and zero-point
// nibbles of each column at once.
template <>
struct MmqLeanSlot<true> {
    uint4 wg, wh;      // piece j's 8 codes in word j
    uint2 sg, sh;      // the step's scales of columns g and g + 8 (binary16, block order)
    uint32_t zeros;    // their zero-point nibbles: column g low half, g + 8 high half
    uint4 a[4];
};

// The binary16 pairs that turn codes with zero point z into code - z (`mmq_tc_codes`): 1024 + z
// and -64 - z·16, each twice; z = 8 without zero points (1032, -72).
struct MmqLeanZero {
    uint32_t z1024, z64;
};

__device__ __forceinline__ MmqLeanZero mmq_lean_zero(uint32_t z) {
    return {(0x6400u + z) * 0x10001u, (0xd400u + (z << 4)) * 0x10001u};
}

// One piece of a lean step: 8 codes of columns g (wg) and g + 8 (wh) against the matching 8
// values of A (av), two mma into d.
__device__ __forceinline__ void mmq_lean_piece(uint32_t wg, uint32_t wh, uint4 av, MmqLeanZero zg,
                                               MmqLeanZero zh, float d[4]) {
    uint32_t dg[4], dh[4];
    mmq_tc_codes(wg, zg.z1024, zg.z64, dg);
    mmq_tc_codes(wh, zh.z1024, zh.z64, dh);
    // Lanes without a row of A hold zeros there (set once, never loaded).
    const uint32_t x0 = __byte_perm(av.x, av.z, 0x5410);  // (a0, a4)
    const uint32_t x1 = __byte_perm(av.x, av.z, 0x7632);  // (a1, a5)
    const uint32_t x2 = __byte_perm(av.y, av.w, 0x5410);  // (a2, a6)
    const uint32_t x3 = __byte_perm(av.y, av.w, 0x7632);  // (a3, a7)
    mmq_mma(d, dg[0], dh[0], dg[1], dh[1], x0, x1);
    mmq_mma(d, dg[2], dh[2], dg[3], dh[3], x2, x3);
}

template <int M, bool Zeros, bool Small>
__device__ void mmq_nbits_gemv_lean_impl(const mmq_f16* a, const uint8_t* b,
                                         const mmq_f16* scales, const uint8_t* zeros,
                                         const mmq_f16* bias, mmq_f16* y, int64_t n_total,
                                         int64_t k64, int64_t block) {
    __shared__ float part[MMQ_TC_WARPS][32][4];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g = lane >> 2;
    const int t = lane & 3;
    const int k = (int)k64;
    const int block_log2 = __ffsll(block) - 1;
    const int k_blocks = k >> block_log2;
    const int zero_row = (k_blocks + 1) >> 1;
    const bool has_row = g < M;
    // The warp's steps: K = 128 (warp + 8 s) + 32 t for s < count (K is a multiple of 128).
    const int chunks = k >> 7;
    const int count = chunks > warp ? (chunks - warp + MMQ_TC_WARPS - 1) / MMQ_TC_WARPS : 0;
    const int kt0 = warp * 128 + (Small ? 8 * t : 32 * t);
    const int step = MMQ_TC_WARPS * 128;
    const mmq_f16* arow0 = a + (size_t)(has_row ? g : 0) * k + kt0;
    for (int64_t n0 = (int64_t)blockIdx.x * 16; n0 < n_total; n0 += (int64_t)gridDim.x * 16) {
        const int64_t rg = n0 + g < n_total ? n0 + g : n_total - 1;  // rows past N read row N - 1
        const int64_t rh = n0 + g + 8 < n_total ? n0 + g + 8 : n_total - 1;
        const uint8_t* bg = mmq_kept(b + rg * (k / 2) + kt0 / 2);
        const uint8_t* bh = mmq_kept(b + rh * (k / 2) + kt0 / 2);
        const mmq_f16* sg = mmq_kept(scales + rg * k_blocks);
        const mmq_f16* sh = mmq_kept(scales + rh * k_blocks);
        const uint8_t* zg = Zeros ? mmq_kept(zeros + rg * zero_row) : nullptr;
        const uint8_t* zh = Zeros ? mmq_kept(zeros + rh * zero_row) : nullptr;
        const mmq_f16* arow = mmq_kept(arow0);
        auto load_small = [&](MmqLeanSlot<true>& l, int s) {
            const int off = s * step;
            const int kb = (kt0 + off) >> block_log2;
            {
                const uint8_t* pg = bg + off / 2;
                const uint8_t* ph = bh + off / 2;
                auto word = [](const uint8_t* p) {
                    return mmq_ldg(reinterpret_cast<const uint32_t*>(p));
                };
                l.wg = make_uint4(word(pg), word(pg + 16), word(pg + 32), word(pg + 48));
                l.wh = make_uint4(word(ph), word(ph + 16), word(ph + 32), word(ph + 48));
                // The step's first block kb is a multiple of 4 (blocks of 32) or 2 (64): its
                // scales and zero-point nibbles are aligned runs.
                if (block_log2 == 5) {
                    l.sg = mmq_ldg(reinterpret_cast<const uint2*>(sg + kb));
                    l.sh = mmq_ldg(reinterpret_cast<const uint2*>(sh + kb));
                } else {
                    l.sg = make_uint2(mmq_ldg(reinterpret_cast<const uint32_t*>(sg + kb)), 0u);
                    l.sh = make_uint2(mmq_ldg(reinterpret_cast<const uint32_t*>(sh + kb)), 0u);
                }
                if (Zeros) {
                    if (block_log2 == 5) {
                        l.zeros =
                            (uint32_t)mmq_ldg(reinterpret_cast<const uint16_t*>(zg + (kb >> 1))) |
                            ((uint32_t)mmq_ldg(reinterpret_cast<const uint16_t*>(zh + (kb >> 1)))
                             << 16);
                    } else {
                        l.zeros = (uint32_t)mmq_ldg(zg + (kb >> 1)) |
                                  ((uint32_t)mmq_ldg(zh + (kb >> 1)) << 16);
                    }
                }
                if (has_row) {
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        l.a[j] = __ldg(reinterpret_cast<const uint4*>(arow + off + 32 * j));
                    }
                }
            }
        };
        auto load_wide = [&](MmqLeanSlot<false>& l, int s) {
            const int off = s * step;
            const int kb = (kt0 + off) >> block_log2;
            l.wg = mmq_ld_stream(bg + off / 2);
            l.wh = mmq_ld_stream(bh + off / 2);
            l.scales = (uint32_t)mmq_ldg(&sg[kb].bits) | ((uint32_t)mmq_ldg(&sh[kb].bits) << 16);
            if (Zeros) {
                l.zeros = (uint32_t)mmq_ldg(zg + (kb >> 1)) | ((uint32_t)mmq_ldg(zh + (kb >> 1)) << 8);
            }
            if (has_row) {
                const uint4* ap = reinterpret_cast<const uint4*>(arow + off);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    l.a[j] = __ldg(ap + j);
                }
            }
        };
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        // A small-block step: each piece's two mma in a sum of their own, scaled by the piece's
        // block.
        auto use_small = [&](const MmqLeanSlot<true>& l) {
            const uint32_t wg[4] = {l.wg.x, l.wg.y, l.wg.z, l.wg.w};
            const uint32_t wh[4] = {l.wh.x, l.wh.y, l.wh.z, l.wh.w};
            const int piece_log2 = block_log2 - 5;  // pieces of 32 K per block: 1 or 2
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int jb = j >> piece_log2;  // the piece's block in the step
                MmqLeanZero zg = mmq_lean_zero(8), zh = zg;
                if (Zeros) {
                    zg = mmq_lean_zero((l.zeros >> (4 * jb)) & 0xfu);
                    zh = mmq_lean_zero((l.zeros >> (16 + 4 * jb)) & 0xfu);
                }
                float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mmq_lean_piece(wg[j], wh[j], l.a[j], zg, zh, d);
                const int half = 16 * (jb & 1);
                const uint32_t bits_g = jb < 2 ? l.sg.x : l.sg.y;
                const uint32_t bits_h = jb < 2 ? l.sh.x : l.sh.y;
                const float s_g = mmq_f16_to_f32((uint16_t)(bits_g >> half));
                const float s_h = mmq_f16_to_f32((uint16_t)(bits_h >> half));
                c[0] += s_g * d[0];
                c[1] += s_g * d[1];
                c[2] += s_h * d[2];
                c[3] += s_h * d[3];
            }
        };
        auto use_wide = [&](const MmqLeanSlot<false>& l, int s) {
            MmqLeanZero zg = mmq_lean_zero(8), zh = zg;
            if (Zeros) {
                const int kb = (kt0 + s * step) >> block_log2;
                const int shift = (kb & 1) * 4;
                zg = mmq_lean_zero((l.zeros >> shift) & 0xfu);
                zh = mmq_lean_zero((l.zeros >> (8 + shift)) & 0xfu);
            }
            const uint32_t wg[4] = {l.wg.x, l.wg.y, l.wg.z, l.wg.w};
            const uint32_t wh[4] = {l.wh.x, l.wh.y, l.wh.z, l.wh.w};
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                mmq_lean_piece(wg[j], wh[j], l.a[j], zg, zh, d);
            }
            const float s_g = mmq_f16_to_f32((uint16_t)(l.scales & 0xffffu));
            const float s_h = mmq_f16_to_f32((uint16_t)(l.scales >> 16));
            c[0] += s_g * d[0];
            c[1] += s_g * d[1];
            c[2] += s_h * d[2];
            c[3] += s_h * d[3];
        };
        auto load = [&](MmqLeanSlot<Small>& l, int s) {
            if constexpr (Small) {
                load_small(l, s);
            } else {
                load_wide(l, s);
            }
        };
        auto use = [&](const MmqLeanSlot<Small>& l, int s) {
            if constexpr (Small) {
                use_small(l);
            } else {
                use_wide(l, s);
            }
        };
        // The small form with zero points holds one step fewer: 128 registers hold no more.
        constexpr int depth = Small && Zeros ? MMQ_LEAN_DEPTH - 1 : MMQ_LEAN_DEPTH;
        MmqLeanSlot<Small> ring[depth];
#pragma unroll
        for (int p = 0; p < depth; ++p) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                ring[p].a[j] = make_uint4(0, 0, 0, 0);
            }
            if (p < count) {
                load(ring[p], p);
            }
        }
        for (int s0 = 0; s0 < count; s0 += depth) {
#pragma unroll
            for (int p = 0; p < depth; ++p) {
                const int s = s0 + p;
                if (s < count) {
                    use(ring[p], s);
                    if (s + depth < count) {
                        load(ring[p], s + depth);
                    }
                }
            }
        }
        mmq_tc_finish<M>(part, c, n0, n_total, bias, y);
    }
}

#define MMQ_GEMV_LEAN_KERNEL(M)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_TC_WARPS, 2) mmq_nbits_gemv_lean_m##M( \
        const mmq_f16* a, const uint8_t* b, const mmq_f16* scales, const uint8_t* zeros,      \
        const mmq_f16* bias, mmq_f16* y, int64_t n, int64_t k, int64_t block) {               \
        mmq_nbits_gemv_lean_impl<M, false, false>(a, b, scales, zeros, bias, y, n, k, block); \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_TC_WARPS, 2)                        \
        mmq_nbits_gemv_lean_zp_m##M(const mmq_f16* a, const uint8_t* b, const mmq_f16* scales, \
                                    const uint8_t* zeros, const mmq_f16* bias, mmq_f16* y,    \
                                    int64_t n, int64_t k, int64_t block) {                    \
        mmq_nbits_gemv_lean_impl<M, true, false>(a, b, scales, zeros, bias, y, n, k, block);  \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_TC_WARPS, 2)                        \
        mmq_nbits_gemv_lean_small_m##M(const mmq_f16* a, const uint8_t* b,                    \
                                       const mmq_f16* scales, const uint8_t* zeros,            \
                                       const mmq_f16* bias, mmq_f16* y, int64_t n, int64_t k,  \
                                       int64_t block) {                                        \
        mmq_nbits_gemv_lean_impl<M, false, true>(a, b, scales, zeros, bias, y, n, k, block);  \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_TC_WARPS, 2)                        \
        mmq_nbits_gemv_lean_small_zp_m##M(const mmq_f16* a, const uint8_t* b,                 \
                                          const mmq_f16* scales, const uint8_t* zeros,         \
                                          const mmq_f16* bias, mmq_f16* y, int64_t n,          \
                                          int64_t k, int64_t block) {                          \
        mmq_nbits_gemv_lean_impl<M, true, true>(a, b, scales, zeros, bias, y, n, k, block);   \
    }
MMQ_GEMV_LEAN_KERNEL(1)
MMQ_GEMV_LEAN_KERNEL(2)
MMQ_GEMV_LEAN_KERNEL(3)
MMQ_GEMV_LEAN_KERNEL(4)
MMQ_GEMV_LEAN_KERNEL(5)
MMQ_GEMV_LEAN_KERNEL(6)
MMQ_GEMV_LEAN_KERNEL(7)
MMQ_GEMV_LEAN_KERNEL(8)

#define MMQ_GEMV_KERNEL(M)                                                                    \
    extern "C" __global__ void mmq_nbits_gemv_m##M(                                           \
        const mmq_f16* a, const uint8_t* b, const mmq_f16* scales, const uint8_t* zeros,      \
        const mmq_f16* bias, mmq_f16* y, int64_t n, int64_t k, int64_t block) {               \
        mmq_nbits_gemv_impl<M>(a, b, scales, zeros, bias, y, n, k, block);                    \
    }
#define MMQ_GEMV_TC_KERNEL(M)                                                                 \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_TC_WARPS, 2) mmq_nbits_gemv_tc_m##M( \
        const mmq_f16* a, const uint8_t* b, const mmq_f16* scales, const uint8_t* zeros,      \
        const mmq_f16* bias, mmq_f16* y, int64_t n, int64_t k, int64_t block) {               \
        mmq_nbits_gemv_tc_impl<M>(a, b, scales, zeros, bias, y, n, k, block);                 \
    }
MMQ_GEMV_TC_KERNEL(1)
MMQ_GEMV_TC_KERNEL(2)
MMQ_GEMV_TC_KERNEL(3)
MMQ_GEMV_TC_KERNEL(4)
MMQ_GEMV_TC_KERNEL(5)
MMQ_GEMV_TC_KERNEL(6)
MMQ_GEMV_TC_KERNEL(7)
MMQ_GEMV_TC_KERNEL(8)

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
