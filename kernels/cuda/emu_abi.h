// What the emulator's two units share, and what Rust calls (`mmq_kernels::cuda`, the emulated
// device).
#pragma once

#include <stddef.h>
#include <stdint.h>

// A buffer argument of a launch: loads must lie inside one.
struct MmqEmuRange {
    uintptr_t base;
    size_t bytes;
};

// Runs `thunk(args)` as the body of every CUDA thread of the grid. 0, or 2 with the error in
// `err` (NUL-terminated).
int mmq_emu_run(const uint32_t grid[3], const uint32_t block[3], void (*thunk)(void**),
                void** args, const MmqEmuRange* ranges, size_t range_count, char* err,
                size_t err_len);
