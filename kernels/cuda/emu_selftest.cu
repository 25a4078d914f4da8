// Kernels that break CUDA's rules on purpose, compiled into the CPU emulator only (never into the
// fatbin), so its tests can show each rule is enforced.

// The first half of each warp shuffles, the second half waits at __syncthreads.
extern "C" __global__ void mmq_selftest_divergent_shuffle(int32_t* out) {
    int v = (int)threadIdx.x;
    if (threadIdx.x % 32 < 16) {
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = v;
}

// Every lane gets its neighbour's index: a correct use, for contrast.
extern "C" __global__ void mmq_selftest_shuffle(int32_t* out) {
    int v = (int)threadIdx.x;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, v, 1);
}
