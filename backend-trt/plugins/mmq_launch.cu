// Launchers of mmq's plugin kernels: the kernels of kernels/cuda (copied beside this file),
// launched on TensorRT's stream with the configurations mmq_kernels::cuda uses.
#include "mmq_launch.h"

#include "nbits.cu"
#include "quantize.cu"

namespace {

unsigned grid_for(int64_t work, int64_t per_block) {
    int64_t g = (work + per_block - 1) / per_block;
    if (g < 1) {
        g = 1;
    }
    return (unsigned)(g > 65535 ? 65535 : g);
}

MmqScaleMap scale_map(MmqScaleSpec s, int64_t n) {
    return mmq_scale_map(s.mode, s.axis_len, s.inner, s.row_len, s.group, n);
}

int last_error() { return (int)cudaGetLastError(); }

// The compute capability's major number of the current device (tensor-core kernels need 8).
int sm_major() {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        return 0;
    }
    return major;
}

}  // namespace

extern "C" int mmq_launch_quantize(const void* x, int32_t x_type, int64_t n, const float* scales,
                                   const int8_t* zeros, MmqScaleSpec spec, int8_t* out,
                                   cudaStream_t stream) {
    MmqScaleMap map = scale_map(spec, n);
    unsigned grid = grid_for((n + 7) / 8, 256);
    const uint8_t* z = reinterpret_cast<const uint8_t*>(zeros);
    uint8_t* o = reinterpret_cast<uint8_t*>(out);
    if (x_type == MMQ_F16) {
        mmq_quantize_f16_i8<<<grid, 256, 0, stream>>>(static_cast<const mmq_f16*>(x), n, scales,
                                                      z, map, 1, 1, o);
    } else {
        mmq_quantize_f32_i8<<<grid, 256, 0, stream>>>(static_cast<const float*>(x), n, scales, z,
                                                      map, 1, 1, o);
    }
    return last_error();
}

extern "C" int mmq_launch_dequantize(const int8_t* q, int64_t n, const float* scales,
                                     const int8_t* zeros, MmqScaleSpec spec, float* out,
                                     cudaStream_t stream) {
    MmqScaleMap map = scale_map(spec, n);
    unsigned grid = grid_for((n + 7) / 8, 256);
    mmq_dequantize_i8_f32<<<grid, 256, 0, stream>>>(reinterpret_cast<const uint8_t*>(q), n,
                                                    scales,
                                                    reinterpret_cast<const uint8_t*>(zeros), map,
                                                    1, out);
    return last_error();
}

extern "C" int mmq_launch_dynamic_quantize(const void* x, int32_t x_type, int64_t rows,
                                           int64_t row_len, int64_t group, int8_t* out,
                                           float* scales, cudaStream_t stream) {
    // As mmq_kernels::cuda: groups of up to MMQ_WARP_GROUP values take lanes of a warp
    // (MMQ_LANE_BYTES of input a lane), longer ones a block with enough threads to hold the group
    // in registers (MMQ_HELD_BYTES of input each); one wave of resident blocks strides over the
    // groups.
    if (group < 1 || group > 0x7fffffff || (row_len + group - 1) / group > 0x7fffffff) {
        return (int)cudaErrorInvalidValue;  // the kernels index groups in 32 bits
    }
    int64_t in_bytes = x_type == MMQ_F16 ? 2 : 4;
    bool warp = group <= MMQ_WARP_GROUP;
    int threads = 256;
    int64_t per_block = 1;
    if (warp) {
        int lanes = 1;
        while (lanes * (MMQ_LANE_BYTES / in_bytes) < group) {
            lanes *= 2;
        }
        per_block = 8 * (32 / lanes);
    } else {
        int64_t held = MMQ_HELD_BYTES / in_bytes;
        int64_t chunks = (group + held - 1) / held;
        threads = 32;
        while (threads < chunks && threads < 512) {
            threads *= 2;
        }
    }
    const void* kernel =
        x_type == MMQ_F16
            ? (warp ? reinterpret_cast<const void*>(mmq_quantize_dynamic_warp_f16_i8_f32s)
                    : reinterpret_cast<const void*>(mmq_quantize_dynamic_blocks_f16_i8_f32s))
            : (warp ? reinterpret_cast<const void*>(mmq_quantize_dynamic_warp_f32_i8_f32s)
                    : reinterpret_cast<const void*>(mmq_quantize_dynamic_blocks_f32_i8_f32s));
    int dev = 0, sms = 1, per_sm = 1;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess) {
        return last_error();
    }
    int64_t wave = (int64_t)sms * (per_sm < 1 ? 1 : per_sm);
    int64_t groups = rows * ((row_len + group - 1) / group);
    int64_t blocks = (groups + per_block - 1) / per_block;
    unsigned grid = (unsigned)(blocks < 1 ? 1 : (blocks < wave ? blocks : wave));
    // The four kernels share one parameter list.
    const void* xp = x;
    int32_t symmetric = 1;
    int32_t vec = row_len % 8 == 0 && group % 8 == 0;
    uint8_t* codes = reinterpret_cast<uint8_t*>(out);
    uint8_t* no_zeros = nullptr;
    void* args[] = {&xp, &rows, &row_len, &group, &symmetric, &vec, &codes, &scales, &no_zeros};
    return (int)cudaLaunchKernel(kernel, dim3(grid), dim3((unsigned)threads), args, 0, stream);
}

extern "C" int mmq_launch_nbits(const void* a, const uint8_t* b, const void* scales,
                                const uint8_t* zeros, const void* bias, void* y, int64_t m,
                                int64_t n, int64_t k, int64_t block, cudaStream_t stream) {
    const mmq_f16* av = static_cast<const mmq_f16*>(a);
    const mmq_f16* sv = static_cast<const mmq_f16*>(scales);
    const mmq_f16* bv = static_cast<const mmq_f16*>(bias);
    mmq_f16* yv = static_cast<mmq_f16*>(y);
    bool small = block < 128;  // blocks of 32 and 64: K a multiple of 128
    if (m >= 1 && m <= 8 && (!small || k % 128 == 0) && k <= 0x7fffffff && sm_major() >= 8) {
        // The lean tensor-core GEMV (32-bit K), with or without zero points.
        unsigned grid = grid_for(n, 16);
#define MMQ_GEMV_TC_CASE(M)                                                                     \
    case M:                                                                                     \
        if (small && zeros) {                                                                   \
            mmq_nbits_gemv_lean_small_zp_m##M<<<grid, 32 * MMQ_TC_WARPS, 0, stream>>>(          \
                av, b, sv, zeros, bv, yv, n, k, block);                                         \
        } else if (small) {                                                                     \
            mmq_nbits_gemv_lean_small_m##M<<<grid, 32 * MMQ_TC_WARPS, 0, stream>>>(             \
                av, b, sv, zeros, bv, yv, n, k, block);                                         \
        } else if (zeros) {                                                                     \
            mmq_nbits_gemv_lean_zp_m##M<<<grid, 32 * MMQ_TC_WARPS, 0, stream>>>(                \
                av, b, sv, zeros, bv, yv, n, k, block);                                         \
        } else {                                                                                \
            mmq_nbits_gemv_lean_m##M<<<grid, 32 * MMQ_TC_WARPS, 0, stream>>>(                   \
                av, b, sv, zeros, bv, yv, n, k, block);                                         \
        }                                                                                       \
        break;
        switch (m) {
            MMQ_GEMV_TC_CASE(1)
            MMQ_GEMV_TC_CASE(2)
            MMQ_GEMV_TC_CASE(3)
            MMQ_GEMV_TC_CASE(4)
            MMQ_GEMV_TC_CASE(5)
            MMQ_GEMV_TC_CASE(6)
            MMQ_GEMV_TC_CASE(7)
            MMQ_GEMV_TC_CASE(8)
            default:
                break;
        }
#undef MMQ_GEMV_TC_CASE
    } else if (m >= 1 && m <= 8) {
        const int warps = 4;
        unsigned grid = grid_for(n, warps);
#define MMQ_GEMV_CASE(M)                                                                        \
    case M:                                                                                     \
        mmq_nbits_gemv_m##M<<<grid, 32 * warps, 0, stream>>>(av, b, sv, zeros, bv, yv, n, k,    \
                                                             block);                            \
        break;
        switch (m) {
            MMQ_GEMV_CASE(1)
            MMQ_GEMV_CASE(2)
            MMQ_GEMV_CASE(3)
            MMQ_GEMV_CASE(4)
            MMQ_GEMV_CASE(5)
            MMQ_GEMV_CASE(6)
            MMQ_GEMV_CASE(7)
            MMQ_GEMV_CASE(8)
            default:
                break;
        }
#undef MMQ_GEMV_CASE
    } else if (m > 8) {
        dim3 grid((unsigned)((n + 63) / 64), (unsigned)((m + 63) / 64), 1);
        mmq_nbits_gemm<<<grid, 256, 0, stream>>>(av, b, sv, zeros, bv, yv, m, n, k, block);
    }
    return last_error();
}
