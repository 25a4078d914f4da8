// The CPU emulator of mmq's CUDA kernels: what a kernel source needs from CUDA, for a host C++
// compiler. `emu_kernels.cpp` includes this, then the kernels' combined source; `emu.cpp` runs a
// launch: every thread block in turn, each CUDA thread of the block as a fiber, switched at
// `__syncthreads` and at the warp collectives (shuffles, `mma`), which exchange values through
// the warp as the hardware does. The device paths of the sources are what runs (`__CUDA_ARCH__`
// is 900); each inline PTX instruction has a C++ twin (`MMQ_EMULATE`).
//
// What the emulator checks beyond the results: every `__ldg` and streaming load is aligned and
// lies inside one of the launch's buffer arguments; live threads of a block waiting at different
// collectives (some at `__syncthreads`, some at a shuffle) are a deadlock and an error (threads that
// have exited count as arrived at `__syncthreads`, as on the hardware); a shuffle from a lane that
// is not live is an error; `mma` needs all 32 lanes. Each error names the block and thread. Races
// are not detected: the fibers of a block run in a fixed order.
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MMQ_EMULATE 1
#define __CUDA_ARCH__ 900
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
// One block runs at a time on a host thread, all its fibers on that thread.
#define __shared__ static thread_local
#define __launch_bounds__(...)

struct uint3 {
    unsigned int x, y, z;
};
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};

inline uint2 make_uint2(unsigned int x, unsigned int y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
    return uint4{x, y, z, w};
}
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local uint3 blockDim;
extern thread_local uint3 gridDim;

// Ends the current CUDA thread's launch with an error (the fiber never resumes).
[[noreturn]] void mmq_emu_fail(const char* what);
// Checks a read-only load of `bytes` at `p`: aligned to `align`, inside a buffer argument.
void mmq_emu_check_load(const void* p, size_t bytes, size_t align);
void __syncthreads();
// The collectives of the current warp (all its live lanes must call them together).
uint32_t mmq_emu_shfl_xor(uint32_t v, int lane_mask);
void mmq_emu_mma_m16n8k16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                          uint32_t b0, uint32_t b1);
// `sub.rn.f16x2` and `fma.rn.f16x2`.
uint32_t mmq_emu_sub_f16x2(uint32_t a, uint32_t b);
uint32_t mmq_emu_fma_f16x2(uint32_t a, uint32_t b, uint32_t c);

[[noreturn]] inline void __trap() { mmq_emu_fail("__trap()"); }

template <typename T>
inline T __ldg(const T* p) {
    mmq_emu_check_load(p, sizeof(T), alignof(T));
    return *p;
}

template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    if (mask != 0xffffffffu) {
        mmq_emu_fail("__shfl_xor_sync with a partial mask");
    }
    uint32_t bits;
    memcpy(&bits, &v, 4);
    bits = mmq_emu_shfl_xor(bits, lane_mask);
    memcpy(&v, &bits, 4);
    return v;
}

inline unsigned int __float_as_uint(float x) {
    unsigned int u;
    memcpy(&u, &x, 4);
    return u;
}
inline float __uint_as_float(unsigned int u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
inline float __int_as_float(int i) {
    float x;
    memcpy(&x, &i, 4);
    return x;
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((uint64_t)a * b) >> 32);
}
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
// Byte i of the result is byte (s >> 4i) & 7 of the eight bytes y:x (x's low byte is byte 0).
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    uint64_t b = ((uint64_t)y << 32) | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; ++i) {
        r |= (unsigned int)((b >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    }
    return r;
}
