// The CPU emulator's runtime (see emu.h): launches, the fiber scheduler, barriers, warp
// collectives and the binary16 arithmetic of the PTX twins.
#include "emu.h"

#include <stdio.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "emu_abi.h"

// The element math (its software conversions, MMQ_EMULATE being set), in a namespace of its own
// as in emu_kernels.cpp.
namespace mmq_emu_math {
#include "mmq_quant.cuh"
}

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local uint3 blockDim;
thread_local uint3 gridDim;

namespace {

enum State { READY, AT_BLOCK_BARRIER, AT_WARP_BARRIER, DONE };

struct Fiber {
    ucontext_t ctx;
    State state;
    uint3 tid;
    unsigned int warp;
    unsigned int lane;
};

// What the lanes of a warp exchange at a collective.
struct Warp {
    uint32_t live;  // the lanes released from the last warp barrier
    uint32_t slot[32];
    uint32_t frag[32][10];  // mma: a0..a3, b0, b1, c0..c3 (as bits)
};

struct Launch {
    ucontext_t scheduler;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    Fiber* current = nullptr;
    void (*thunk)(void**) = nullptr;
    void** args = nullptr;
    const MmqEmuRange* ranges = nullptr;
    size_t range_count = 0;
    std::string error;
};

thread_local Launch* g_launch = nullptr;

// Fiber stacks, kept per host thread between launches: a guard page under each.
struct Stacks {
    char* base = nullptr;
    size_t count = 0;
    ~Stacks() {
        if (base) {
            munmap(base, count * kSize);
        }
    }
    static constexpr size_t kSize = 256 * 1024;
    bool reserve(size_t n) {
        if (n <= count) {
            return true;
        }
        if (base) {
            munmap(base, count * kSize);
            base = nullptr;
            count = 0;
        }
        void* p = mmap(nullptr, n * kSize, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            return false;
        }
        base = static_cast<char*>(p);
        count = n;
        long page = sysconf(_SC_PAGESIZE);
        for (size_t i = 0; i < n; ++i) {
            mprotect(base + i * kSize, (size_t)page, PROT_NONE);
        }
        return true;
    }
};

thread_local Stacks g_stacks;

std::string where(const Fiber* f) {
    char buf[128];
    snprintf(buf, sizeof buf, "block (%u, %u, %u) thread (%u, %u, %u): ", blockIdx.x, blockIdx.y,
             blockIdx.z, f->tid.x, f->tid.y, f->tid.z);
    return buf;
}

void fiber_main() {
    Launch* l = g_launch;
    l->thunk(l->args);
    l->current->state = DONE;
    // Returning resumes the scheduler (uc_link).
}

// Parks the current fiber in `state` and runs the scheduler until it is released.
void park(State state) {
    Launch* l = g_launch;
    Fiber* f = l->current;
    f->state = state;
    swapcontext(&f->ctx, &l->scheduler);
    l->current = f;
}

Warp& current_warp() { return g_launch->warps[g_launch->current->warp]; }

// Runs one thread block; false (with `error` set) on a failure or a deadlock.
bool run_block(Launch* l, size_t threads, const ucontext_t& base) {
    for (size_t i = 0; i < threads; ++i) {
        Fiber& f = l->fibers[i];
        f.ctx = base;
        f.ctx.uc_stack.ss_sp = g_stacks.base + i * Stacks::kSize;
        f.ctx.uc_stack.ss_size = Stacks::kSize;
        f.ctx.uc_link = &l->scheduler;
        makecontext(&f.ctx, fiber_main, 0);
        f.state = READY;
    }
    for (;;) {
        for (size_t i = 0; i < threads; ++i) {
            Fiber& f = l->fibers[i];
            if (f.state != READY) {
                continue;
            }
            threadIdx = f.tid;
            l->current = &f;
            swapcontext(&l->scheduler, &f.ctx);
            if (!l->error.empty()) {
                return false;
            }
        }
        size_t done = 0, at_block = 0;
        for (size_t i = 0; i < threads; ++i) {
            done += l->fibers[i].state == DONE;
            at_block += l->fibers[i].state == AT_BLOCK_BARRIER;
        }
        if (done == threads) {
            return true;
        }
        // A warp whose live lanes all wait at a warp barrier goes on; failing that, a block whose
        // live threads all wait at __syncthreads.
        bool released = false;
        for (size_t w = 0; w * 32 < threads; ++w) {
            size_t lo = w * 32, hi = lo + 32 < threads ? lo + 32 : threads;
            uint32_t waiting = 0, live = 0;
            for (size_t i = lo; i < hi; ++i) {
                State s = l->fibers[i].state;
                live |= (uint32_t)(s != DONE) << (i - lo);
                waiting |= (uint32_t)(s == AT_WARP_BARRIER) << (i - lo);
            }
            if (live != 0 && waiting == live) {
                l->warps[w].live = live;
                for (size_t i = lo; i < hi; ++i) {
                    if (l->fibers[i].state == AT_WARP_BARRIER) {
                        l->fibers[i].state = READY;
                    }
                }
                released = true;
            }
        }
        if (!released && at_block + done == threads) {
            for (size_t i = 0; i < threads; ++i) {
                if (l->fibers[i].state == AT_BLOCK_BARRIER) {
                    l->fibers[i].state = READY;
                }
            }
            released = true;
        }
        if (!released) {
            for (size_t i = 0; i < threads; ++i) {
                if (l->fibers[i].state != DONE) {
                    l->error = where(&l->fibers[i]) +
                               "deadlock: threads wait at different barriers (a __syncthreads "
                               "or a warp collective that not every live thread reaches)";
                    return false;
                }
            }
        }
    }
}

// binary16 bits as a double (exact).
double f16_to_f64(uint16_t h) { return (double)mmq_emu_math::mmq_f16_to_f32(h); }

// A double rounded once to binary16, to nearest even: rounded to the binary16 spacing at its
// magnitude in double (exact there), the value is a binary16 value, or 65536 and past the
// largest, which the conversion takes to infinity.
uint16_t f64_to_f16(double x) {
    if (x != x || x == 0.0 || fabs(x) == INFINITY) {
        return mmq_emu_math::mmq_f32_to_f16((float)x);
    }
    int e2;
    frexp(fabs(x), &e2);
    int exp = e2 - 1 < -14 ? -14 : e2 - 1;  // the binary exponent, subnormals at 2^-14
    // In units of 2^(exp - 10), the value's binary16 neighbours are consecutive integers.
    double v = ldexp(rint(ldexp(x, 10 - exp)), exp - 10);
    return mmq_emu_math::mmq_f32_to_f16((float)v);
}

}  // namespace

void mmq_emu_fail(const char* what) {
    Launch* l = g_launch;
    if (l->error.empty()) {
        l->error = where(l->current) + what;
    }
    l->current->state = DONE;
    setcontext(&l->scheduler);
    __builtin_unreachable();
}

void mmq_emu_check_load(const void* p, size_t bytes, size_t align) {
    uintptr_t a = (uintptr_t)p;
    char msg[160];
    if (a % align != 0) {
        snprintf(msg, sizeof msg, "misaligned %zu-byte load at %#lx (needs %zu-byte alignment)",
                 bytes, (unsigned long)a, align);
        mmq_emu_fail(msg);
    }
    Launch* l = g_launch;
    for (size_t i = 0; i < l->range_count; ++i) {
        if (a >= l->ranges[i].base && a + bytes <= l->ranges[i].base + l->ranges[i].bytes) {
            return;
        }
    }
    snprintf(msg, sizeof msg, "%zu-byte load at %#lx outside every buffer argument", bytes,
             (unsigned long)a);
    mmq_emu_fail(msg);
}

void __syncthreads() { park(AT_BLOCK_BARRIER); }

uint32_t mmq_emu_shfl_xor(uint32_t v, int lane_mask) {
    Fiber* f = g_launch->current;
    Warp& w = current_warp();
    w.slot[f->lane] = v;
    park(AT_WARP_BARRIER);
    unsigned int src = f->lane ^ (unsigned int)lane_mask;
    if (src >= 32 || !((w.live >> src) & 1u)) {
        mmq_emu_fail("shuffle from a lane that is not live");
    }
    uint32_t r = w.slot[src];
    park(AT_WARP_BARRIER);  // every lane has read before a slot is written again
    return r;
}

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 with the PTX fragment layout: lane (g, t) =
// (lane / 4, lane % 4) holds A[g][2t, 2t+1] (a0), A[g+8][2t, 2t+1] (a1), A[g][2t+8, 2t+9] (a2),
// A[g+8][2t+8, 2t+9] (a3); B[2t, 2t+1][g] (b0), B[2t+8, 2t+9][g] (b1); C and D [g][2t, 2t+1]
// (c0, c1), [g+8][2t, 2t+1] (c2, c3). Products are exact; each sum is rounded once to f32.
void mmq_emu_mma_m16n8k16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                          uint32_t b0, uint32_t b1) {
    Fiber* f = g_launch->current;
    Warp& w = current_warp();
    uint32_t* mine = w.frag[f->lane];
    uint32_t in[6] = {a0, a1, a2, a3, b0, b1};
    memcpy(mine, in, sizeof in);
    memcpy(mine + 6, c, 16);
    park(AT_WARP_BARRIER);
    if (w.live != 0xffffffffu) {
        mmq_emu_fail("mma.sync with lanes that are not live");
    }
    auto half = [](uint32_t reg, int hi) { return f16_to_f64((uint16_t)(hi ? reg >> 16 : reg)); };
    auto a_at = [&](int row, int k) {
        const uint32_t* src = w.frag[(row % 8) * 4 + (k % 8) / 2];
        int reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
        return half(src[reg], k % 2);
    };
    auto b_at = [&](int k, int col) {
        const uint32_t* src = w.frag[col * 4 + (k % 8) / 2];
        return half(src[4 + (k >= 8 ? 1 : 0)], k % 2);
    };
    unsigned int g = f->lane / 4, t = f->lane % 4;
    float d[4];
    for (int i = 0; i < 4; ++i) {
        int row = (int)g + (i >= 2 ? 8 : 0);
        int col = (int)(2 * t) + (i & 1);
        double s = c[i];
        for (int k = 0; k < 16; ++k) {
            s += a_at(row, k) * b_at(k, col);
        }
        d[i] = (float)s;
    }
    park(AT_WARP_BARRIER);  // every lane has read the fragments
    memcpy(c, d, sizeof d);
}

uint32_t mmq_emu_sub_f16x2(uint32_t a, uint32_t b) {
    uint32_t r = 0;
    for (int h = 0; h < 2; ++h) {
        double x = f16_to_f64((uint16_t)(a >> (16 * h)));
        double y = f16_to_f64((uint16_t)(b >> (16 * h)));
        r |= (uint32_t)f64_to_f16(x - y) << (16 * h);  // exact in double, one rounding
    }
    return r;
}

uint32_t mmq_emu_fma_f16x2(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t r = 0;
    for (int h = 0; h < 2; ++h) {
        double x = f16_to_f64((uint16_t)(a >> (16 * h)));
        double y = f16_to_f64((uint16_t)(b >> (16 * h)));
        double z = f16_to_f64((uint16_t)(c >> (16 * h)));
        // x·y is exact in double; fma rounds the sum once in double, then to binary16.
        r |= (uint32_t)f64_to_f16(fma(x, y, z)) << (16 * h);
    }
    return r;
}

int mmq_emu_run(const uint32_t grid[3], const uint32_t block[3], void (*thunk)(void**),
                void** args, const MmqEmuRange* ranges, size_t range_count, char* err,
                size_t err_len) {
    size_t threads = (size_t)block[0] * block[1] * block[2];
    if (threads == 0 || threads > 1024 || grid[0] == 0 || grid[1] == 0 || grid[2] == 0) {
        snprintf(err, err_len, "invalid launch: grid (%u, %u, %u), block (%u, %u, %u)", grid[0],
                 grid[1], grid[2], block[0], block[1], block[2]);
        return 2;
    }
    if (!g_stacks.reserve(threads)) {
        snprintf(err, err_len, "cannot map %zu fiber stacks", threads);
        return 2;
    }
    Launch l;
    l.thunk = thunk;
    l.args = args;
    l.ranges = ranges;
    l.range_count = range_count;
    l.fibers.resize(threads);
    l.warps.resize((threads + 31) / 32);
    for (size_t i = 0; i < threads; ++i) {
        Fiber& f = l.fibers[i];
        f.tid = uint3{(unsigned int)(i % block[0]), (unsigned int)(i / block[0] % block[1]),
                      (unsigned int)(i / block[0] / block[1])};
        f.warp = (unsigned int)(i / 32);
        f.lane = (unsigned int)(i % 32);
    }
    ucontext_t base;
    getcontext(&base);
    Launch* outer = g_launch;
    g_launch = &l;
    blockDim = uint3{block[0], block[1], block[2]};
    gridDim = uint3{grid[0], grid[1], grid[2]};
    bool ok = true;
    for (uint32_t z = 0; ok && z < grid[2]; ++z) {
        for (uint32_t y = 0; ok && y < grid[1]; ++y) {
            for (uint32_t x = 0; ok && x < grid[0]; ++x) {
                blockIdx = uint3{x, y, z};
                ok = run_block(&l, threads, base);
            }
        }
    }
    g_launch = outer;
    if (!ok) {
        snprintf(err, err_len, "%s", l.error.c_str());
        return 2;
    }
    return 0;
}
