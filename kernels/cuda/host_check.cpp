// The element math of mmq_quant.cuh compiled for the CPU, over arrays, so the Rust tests can
// compare it with the Rust reference (kernels/src/cuda_host.rs).
#include <stddef.h>

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
}
