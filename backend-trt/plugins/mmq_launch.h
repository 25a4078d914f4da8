// The CUDA side of mmq's TensorRT plugins: one launcher per plugin, C linkage, compiled by nvcc
// in mmq_launch.cu from the kernels of kernels/cuda. Each returns 0 or a cudaError_t.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

extern "C" {

// Element types of float tensors: 0 float32, 1 float16.
enum { MMQ_F32 = 0, MMQ_F16 = 1 };

// Which scale and zero point element i uses: mode 0 per tensor, 1 per axis (axis_len, inner),
// 2 in groups of `group` along rows of `row_len`.
struct MmqScaleSpec {
    int64_t mode;
    int64_t axis_len;
    int64_t inner;
    int64_t row_len;
    int64_t group;
};

// int8 codes (saturating, round half to even) of n elements of x with scales and int8 zero points
// (null: 0).
int mmq_launch_quantize(const void* x, int32_t x_type, int64_t n, const float* scales,
                        const int8_t* zeros, MmqScaleSpec spec, int8_t* out, cudaStream_t stream);

// (q - zero) * scale into float32 (zeros null: 0).
int mmq_launch_dequantize(const int8_t* q, int64_t n, const float* scales, const int8_t* zeros,
                          MmqScaleSpec spec, float* out, cudaStream_t stream);

// Rows of row_len in blocks of `group`: symmetric int8 codes with each block's scale
// absmax / 127 (scales [rows, ceil(row_len / group)]).
int mmq_launch_dynamic_quantize(const void* x, int32_t x_type, int64_t rows, int64_t row_len,
                                int64_t group, int8_t* out, float* scales, cudaStream_t stream);

// y[m, n] = a[m, k] · dequant(b)[n, k]ᵀ (+ bias), binary16 in and out.
int mmq_launch_nbits(const void* a, const uint8_t* b, const void* scales, const uint8_t* zeros,
                     const void* bias, void* y, int64_t m, int64_t n, int64_t k, int64_t block,
                     cudaStream_t stream);
}
