// Quantize and dequantize kernels: per tensor, per axis and per group with given scales and zero
// points (grid-stride loops over chunks of eight elements, 128-bit loads when aligned), and
// dynamic per group / per token quantization (a group's min/max reduction, its scale and zero
// point, then its codes, in one pass over the data: short groups by lanes of a warp, long ones by
// a block).
#include "mmq_blocks.cuh"

// How a launch finds its scales: one for the tensor, one per chunk (every chunk inside one scale),
// eight consecutive ones per chunk (per channel along the last axis, channels a multiple of 8),
// or one lookup per element.
enum MmqChunkScales { MMQ_ONE, MMQ_PER_CHUNK, MMQ_RUN, MMQ_PER_ELEMENT };

#define MMQ_COMMA ,
// Calls name<..., How>(args) with the kind of scales `how` as a template argument, so each kind
// gets its own loop.
#define MMQ_BY_HOW(how, name, targs, args)                          \
    switch (how) {                                                  \
        case MMQ_ONE: name<targs, MMQ_ONE> args; break;             \
        case MMQ_PER_CHUNK: name<targs, MMQ_PER_CHUNK> args; break; \
        case MMQ_RUN: name<targs, MMQ_RUN> args; break;             \
        default: name<targs, MMQ_PER_ELEMENT> args; break;          \
    }

__device__ __forceinline__ MmqChunkScales mmq_chunk_scales(const MmqScaleMap& map, bool vec) {
    if (map.mode == 0) {
        return MMQ_ONE;
    }
    if (map.chunk_uniform) {
        return MMQ_PER_CHUNK;
    }
    // Vector loads of the scales too: the launchers' `vec` also vouches for their alignment.
    if (vec && map.mode == 1 && map.inner == 1 && map.axis_len % 8 == 0) {
        return MMQ_RUN;
    }
    return MMQ_PER_ELEMENT;
}

// The scales and zero points j0 .. j0 + 7 (j0 a multiple of 8) with vector loads.
template <int F>
__device__ __forceinline__ void mmq_load_run(const float* scales, const uint8_t* zeros,
                                             int64_t j0, float s[8], int32_t z[8]) {
    float4 a = __ldg(reinterpret_cast<const float4*>(scales + j0));
    float4 b = __ldg(reinterpret_cast<const float4*>(scales + j0) + 1);
    s[0] = a.x, s[1] = a.y, s[2] = a.z, s[3] = a.w;
    s[4] = b.x, s[5] = b.y, s[6] = b.z, s[7] = b.w;
    uint32_t c[8];
    if (zeros == 0 || mmq_fmt<F>::is_float) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            z[e] = 0;
        }
        return;
    }
    mmq_load_codes<F>(zeros, j0, 8, true, c);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        uint32_t u = c[e];
        z[e] = !mmq_fmt<F>::is_signed ? (int32_t)u
               : mmq_fmt<F>::bits == 8 ? (int32_t)(int8_t)u
                                       : (u >= 8 ? (int32_t)u - 16 : (int32_t)u);
    }
}

// A chunk as loaded: its eight values (inputs or codes) and, by the kind of scales, its scale and
// zero point (per chunk) or its eight of each (a run), read together with the values so that a
// chunk's loads are all in flight before it is used.
template <typename T>
struct MmqChunk {
    T v[8];
    float s[8];
    int32_t z[8];
};

// The scales and zero points of the chunk at element a, by the kind of scales (per tensor: none).
template <int F, MmqChunkScales How, typename T>
__device__ __forceinline__ void mmq_load_chunk_scales(MmqChunk<T>& ch, int64_t a,
                                                      const float* scales, const uint8_t* zeros,
                                                      const MmqScaleMap& map) {
    if (How == MMQ_PER_CHUNK) {
        int64_t j0 = mmq_scale_index(map, a);
        ch.s[0] = mmq_ldg(scales + j0);
        ch.z[0] = mmq_zero<F>(zeros, j0);
    } else if (How == MMQ_RUN) {
        mmq_load_run<F>(scales, zeros, mmq_scale_index(map, a), ch.s, ch.z);
    }
}

// Codes the `cnt` loaded values of the chunk at element a.
template <int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_quantize_loaded(const MmqChunk<float>& ch, int64_t a, int cnt,
                                                    const MmqRecip& d0, int32_t z0, bool saturate,
                                                    bool vec, uint8_t* out) {
    if (How == MMQ_ONE) {
        mmq_code_span_fast<F>(ch.v, a, cnt, vec, d0, z0, saturate, out);
    } else if (How == MMQ_PER_CHUNK) {
        mmq_code_span<F>(ch.v, a, cnt, vec, ch.s[0], ch.z[0], saturate, out);
    } else {
        uint32_t c[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            c[e] = mmq_encode<F>(ch.v[e], ch.s[e], ch.z[e], saturate);
        }
        mmq_store_codes<F>(out, a, cnt, vec, c);
    }
}

// Grid-stride over the chunks of eight of n elements: with `pairs`, two full chunks per step (both
// loaded before either is used, so each thread keeps two chunks' loads in flight), then the rest
// one by one; `by_element` maps go chunk by chunk through `one`. `load(a, cnt, vec, chunk)` reads
// chunk a (a `Chunk`); `use(chunk, a, cnt, vec)` codes or decodes and stores it.
template <typename Chunk, typename Load, typename Use, typename One>
__device__ __forceinline__ void mmq_for_chunks(int64_t n, bool vec, bool pairs, bool by_element,
                                               Load load, Use use, One one) {
    int64_t chunks = (n + 7) / 8;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (by_element) {
        for (; c < chunks; c += stride) {
            one(c);
        }
        return;
    }
    if (vec && pairs) {
        for (; (c + stride) * 8 + 8 <= n; c += 2 * stride) {
            Chunk v0, v1;
            load(c * 8, 8, true, v0);
            load((c + stride) * 8, 8, true, v1);
            use(v0, c * 8, 8, true);
            use(v1, (c + stride) * 8, 8, true);
        }
    }
    for (; c < chunks; c += stride) {
        int cnt = n - c * 8 < 8 ? (int)(n - c * 8) : 8;
        Chunk v;
        load(c * 8, cnt, vec, v);
        use(v, c * 8, cnt, vec);
    }
}

template <typename In, int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_quantize_loop(const In* x, int64_t n, const float* scales,
                                                  const uint8_t* zeros, const MmqScaleMap& map,
                                                  const MmqRecip& d0, int32_t z0, bool sat,
                                                  bool vec, uint8_t* out) {
    // A run's eight scales and zero points per chunk: one chunk per step (registers).
    mmq_for_chunks<MmqChunk<float>>(
        n, vec, How != MMQ_RUN, How == MMQ_PER_ELEMENT,
        [&](int64_t a, int cnt, bool v, MmqChunk<float>& ch) {
            mmq_load_span(x, a, cnt, v, ch.v);
            mmq_load_chunk_scales<F, How>(ch, a, scales, zeros, map);
        },
        [&](const MmqChunk<float>& ch, int64_t a, int cnt, bool v) {
            mmq_quantize_loaded<F, How>(ch, a, cnt, d0, z0, sat, v, out);
        },
        [&](int64_t chunk) {
            mmq_quantize_chunk<In, F>(x, n, scales, zeros, map, sat, vec, out, chunk);
        });
}

template <typename In, int F>
__device__ void mmq_quantize_impl(const In* x, int64_t n, const float* scales,
                                  const uint8_t* zeros, MmqScaleMap map, int32_t saturate,
                                  int32_t vec, uint8_t* out) {
    MmqRecip d0 = mmq_recip(mmq_ldg(scales));
    int32_t z0 = mmq_zero<F>(zeros, 0);
    MmqChunkScales how = mmq_chunk_scales(map, vec != 0);
    // A tensor's one scale out of the reciprocal's range (rare) takes the element path, which
    // divides; the per-tensor loop then has the reciprocal alone.
    if (how == MMQ_ONE && !d0.fast) {
        how = MMQ_PER_ELEMENT;
    }
    MMQ_BY_HOW(how, mmq_quantize_loop, In MMQ_COMMA F,
               (x, n, scales, zeros, map, d0, z0, saturate != 0, vec != 0, out))
}

// Decodes the codes of the chunk at element a and stores them.
template <typename Out, int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_dequantize_loaded(const MmqChunk<uint32_t>& ch, int64_t a,
                                                      int cnt, float s0, int32_t z0, bool vec,
                                                      Out* y) {
    float v[8];
    if (How == MMQ_RUN) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] = mmq_decode<F>(ch.v[e], ch.s[e], ch.z[e]);
        }
    } else {
        float s = How == MMQ_PER_CHUNK ? ch.s[0] : s0;
        int32_t z = How == MMQ_PER_CHUNK ? ch.z[0] : z0;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[e] = mmq_decode<F>(ch.v[e], s, z);
        }
    }
    mmq_store_span(y, a, cnt, vec, v);
}

template <typename Out, int F, MmqChunkScales How>
__device__ __forceinline__ void mmq_dequantize_loop(const uint8_t* codes, int64_t n,
                                                    const float* scales, const uint8_t* zeros,
                                                    const MmqScaleMap& map, float s0, int32_t z0,
                                                    bool vec, Out* y) {
    mmq_for_chunks<MmqChunk<uint32_t>>(
        n, vec, How != MMQ_RUN, How == MMQ_PER_ELEMENT,
        [&](int64_t a, int cnt, bool v, MmqChunk<uint32_t>& ch) {
            mmq_load_codes<F>(codes, a, cnt, v, ch.v);
            mmq_load_chunk_scales<F, How>(ch, a, scales, zeros, map);
        },
        [&](const MmqChunk<uint32_t>& ch, int64_t a, int cnt, bool v) {
            mmq_dequantize_loaded<Out, F, How>(ch, a, cnt, s0, z0, v, y);
        },
        [&](int64_t chunk) {
            mmq_dequantize_chunk<Out, F>(codes, n, scales, zeros, map, vec, y, chunk);
        });
}

template <typename Out, int F>
__device__ void mmq_dequantize_impl(const uint8_t* codes, int64_t n, const float* scales,
                                    const uint8_t* zeros, MmqScaleMap map, int32_t vec, Out* y) {
    float s0 = mmq_ldg(scales);
    int32_t z0 = mmq_zero<F>(zeros, 0);
    MMQ_BY_HOW(mmq_chunk_scales(map, vec != 0), mmq_dequantize_loop, Out MMQ_COMMA F,
               (codes, n, scales, zeros, map, s0, z0, vec != 0, y))
}

// Folds the first `cnt` of v into [mn, mx].
__device__ __forceinline__ void mmq_span_minmax(const float v[8], int cnt, float* mn, float* mx) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        if (e < cnt) {
            *mn = fminf(*mn, v[e]);
            *mx = fmaxf(*mx, v[e]);
        }
    }
}

// min and max over aligned runs of `width` lanes (a power of two up to 32); every lane of the
// warp takes part.
__device__ __forceinline__ void mmq_lanes_minmax(float* mn, float* mx, int width) {
    for (int off = width >> 1; off > 0; off >>= 1) {
        *mn = fminf(*mn, __shfl_xor_sync(0xffffffffu, *mn, off));
        *mx = fmaxf(*mx, __shfl_xor_sync(0xffffffffu, *mx, off));
    }
}

// Up to eight input values as loaded, not yet converted to f32, so that loads issued for the
// next group are not waited for until that group's turn (binary16 inputs: two per word).
template <typename In>
struct MmqRawSpan {
    uint32_t w[sizeof(In) * 2];
};

__device__ __forceinline__ uint32_t mmq_raw_bits(float x) { return mmq_f32_bits(x); }
__device__ __forceinline__ uint32_t mmq_raw_bits(mmq_f16 x) { return x.bits; }
__device__ __forceinline__ uint32_t mmq_raw_bits(mmq_bf16 x) { return x.bits; }

// The `cnt` (at most 8) values at x + i0; `vec` as for `mmq_load_span`.
template <typename In>
__device__ __forceinline__ void mmq_load_raw(const In* x, int64_t i0, int cnt, bool vec,
                                             MmqRawSpan<In>* r) {
    constexpr int words = (int)sizeof(In) * 2;
    if (vec && cnt == 8) {
        const uint4* p = reinterpret_cast<const uint4*>(x + i0);
#pragma unroll
        for (int q = 0; q < words / 4; ++q) {
            uint4 u = __ldg(p + q);
            r->w[4 * q] = u.x, r->w[4 * q + 1] = u.y, r->w[4 * q + 2] = u.z, r->w[4 * q + 3] = u.w;
        }
        return;
    }
#pragma unroll
    for (int q = 0; q < words; ++q) {
        r->w[q] = 0;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        if (e < cnt) {
            uint32_t b = mmq_raw_bits(x[i0 + e]);
            r->w[sizeof(In) == 4 ? e : e >> 1] |= sizeof(In) == 4 ? b : b << (16 * (e & 1));
        }
    }
}

__device__ __forceinline__ void mmq_unpack_raw(const MmqRawSpan<float>& r, float v[8]) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        v[e] = mmq_bits_f32(r.w[e]);
    }
}
template <typename H>
__device__ __forceinline__ void mmq_unpack_raw(const MmqRawSpan<H>& r, float v[8]) {
    mmq_unpack8(r.w, H(), v);
}

// The values of the chunk of 8 at offset c of a span of `left` values (0 past its end).
__device__ __forceinline__ int mmq_chunk_count(int left, int c) {
    return left - c <= 0 ? 0 : (left - c < 8 ? left - c : 8);
}

// The kernels' group count (rows of `row_len` in groups of `group`).
__device__ __forceinline__ int64_t mmq_dynamic_groups(int64_t rows, int64_t row_len,
                                                      int64_t group) {
    return rows * ((row_len + group - 1) / group);
}

// Groups of at most MMQ_WARP_GROUP values are coded by lanes of one warp, longer ones by a block.
#define MMQ_WARP_GROUP 256

// Input bytes a lane of the warp kernel holds: 16 binary16 or 8 f32 values, in chunks of 8.
#define MMQ_LANE_BYTES 32

// Lanes per group in the warp kernel: a power of two with `per_lane` values a lane covering the
// group.
__device__ __forceinline__ int mmq_group_lanes(int64_t group, int per_lane) {
    int lanes = 1;
    while (lanes * per_lane < group) {
        lanes <<= 1;
    }
    return lanes;
}

// A walk over the groups of rows of `row_len` cut into groups of `group`: group g is group `col`
// of row `row`; the walk starts at group `g0` and steps `step` groups at a time by additions (the
// kernels' loops would otherwise divide by the groups per row at every step).
struct MmqGroupWalk {
    // Groups per row, and column indices, are 32-bit (the launchers check).
    int64_t row, step_row;
    int32_t col, step_col, per_row;

    __device__ MmqGroupWalk(int64_t g0, int64_t step, int64_t row_len, int64_t group) {
        per_row = (int32_t)((row_len + group - 1) / group);
        row = g0 / per_row;
        col = (int32_t)(g0 - row * per_row);
        step_row = step / per_row;
        step_col = (int32_t)(step - step_row * per_row);
    }

    __device__ __forceinline__ void next() {
        row += step_row, col += step_col;
        if (col >= per_row) {
            col -= per_row, ++row;
        }
    }

    // The current group's first element and length (0 from row `rows` on).
    __device__ __forceinline__ void span(int64_t rows, int64_t row_len, int64_t group,
                                         int64_t* first, int* len) const {
        int64_t l = 0;
        *first = 0;
        if (row < rows) {
            mmq_group_at(row, col, row_len, group, first, &l);
        }
        *len = (int)l;
    }
};

// Groups of at most MMQ_WARP_GROUP values: each takes `lanes` lanes, MMQ_LANE_BYTES of input per
// lane, so a warp codes 32 / lanes groups at a time, reduces them by shuffles (no barrier) and
// holds their values in registers between the reduction and the coding. Warps stride over the
// groups and load their next groups' values before reducing and coding the current ones.
template <typename In, int F, bool ScaleF16>
__device__ void mmq_quantize_dynamic_warp(const In* x, int64_t rows, int64_t row_len,
                                          int64_t group, bool symmetric, bool vec, uint8_t* out,
                                          void* scales, uint8_t* zeros) {
    constexpr int CHUNKS = MMQ_LANE_BYTES / (8 * (int)sizeof(In));  // chunks of 8 a lane
    int64_t groups = mmq_dynamic_groups(rows, row_len, group);
    int lanes = mmq_group_lanes(group, 8 * CHUNKS);
    int per_warp = 32 / lanes;
    int lane = threadIdx.x & 31;
    int col = (lane % lanes) * 8 * CHUNKS;
    int64_t step = (((int64_t)gridDim.x * blockDim.x) >> 5) * per_warp;
    // This lane's group: one of its warp's per_warp groups, then those `step` groups on; the
    // warp's first group is g - sub.
    int sub = lane / lanes;
    int64_t g = (((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5) * per_warp + sub;
    MmqGroupWalk walk(g, step, row_len, group);
    // This lane's first element in the walk's group and the values left from it (none: <= 0).
    auto place = [&](int64_t* a, int* left) {
        int len;
        walk.span(rows, row_len, group, a, &len);
        *a += col;
        *left = len - col;
    };
    auto load = [&](int64_t a, int left, MmqRawSpan<In> raw[CHUNKS]) {
#pragma unroll
        for (int r = 0; r < CHUNKS; ++r) {
            mmq_load_raw(x + a, r * 8, mmq_chunk_count(left, r * 8), vec, &raw[r]);
        }
    };
    int64_t a;
    int left;
    place(&a, &left);
    MmqRawSpan<In> raw[CHUNKS], next_raw[CHUNKS];
    load(a, left, raw);
    for (; g - sub < groups; g += step) {
        float mn = mmq_bits_f32(0x7f800000u);  // +inf
        float mx = -mn;
#pragma unroll
        for (int r = 0; r < CHUNKS; ++r) {
            float v[8];
            mmq_unpack_raw(raw[r], v);
            mmq_span_minmax(v, mmq_chunk_count(left, r * 8), &mn, &mx);
        }
        walk.next();
        int64_t a_next;
        int left_next;
        place(&a_next, &left_next);
        load(a_next, left_next, next_raw);
        mmq_lanes_minmax(&mn, &mx, lanes);
        if (g < groups) {
            float s;
            int32_t z;
            mmq_group_qparams<F>(mn, mx, symmetric, ScaleF16, &s, &z);
            MmqRecip d = mmq_recip(s);
            if (col == 0) {
                mmq_store_group_params(g, s, z, ScaleF16, scales, zeros);
            }
#pragma unroll
            for (int r = 0; r < CHUNKS; ++r) {
                int cnt = mmq_chunk_count(left, r * 8);
                if (cnt > 0) {
                    float v[8];
                    mmq_unpack_raw(raw[r], v);
                    mmq_code_span<F>(v, a + r * 8, cnt, vec, d, z, true, out);
                }
            }
        }
        a = a_next, left = left_next;
#pragma unroll
        for (int r = 0; r < CHUNKS; ++r) {
            raw[r] = next_raw[r];
        }
    }
}

// Longer groups: one block per group (blockDim.x a multiple of 32), blocks striding over the
// groups. A group of at most MMQ_HELD_BYTES of input per thread (32 binary16 or 16 f32 values)
// is read once: its values stay in registers between the reduction and the coding, and the block
// loads its next group's values before reducing and coding the current one. A longer group is
// read twice.
#define MMQ_HELD_BYTES 64
template <typename In, int F, bool ScaleF16, bool held>
__device__ void mmq_quantize_dynamic_block(const In* x, int64_t rows, int64_t row_len,
                                           int64_t group, bool symmetric, bool vec, uint8_t* out,
                                           void* scales, uint8_t* zeros) {
    constexpr int CHUNKS = MMQ_HELD_BYTES / (8 * (int)sizeof(In));  // chunks of 8 a thread
    // Per-warp partial results, two sets used in turn: one barrier per group.
    __shared__ float red[2][64];
    int warp = threadIdx.x >> 5;
    int warp_count = blockDim.x >> 5;
    int stride = blockDim.x * 8;
    // Offsets inside a group are 32-bit (the launchers keep groups under 2^31 values).
    MmqGroupWalk walk(blockIdx.x, gridDim.x, row_len, group);
    auto load_held = [&](const In* xg, int len, MmqRawSpan<In> raw[CHUNKS]) {
#pragma unroll
        for (int r = 0; r < CHUNKS; ++r) {
            int c = threadIdx.x * 8 + r * stride;
            mmq_load_raw(xg, c, held ? mmq_chunk_count(len, c) : 0, vec, &raw[r]);
        }
    };
    int64_t first;
    int len;
    walk.span(rows, row_len, group, &first, &len);
    // This group's values and the next group's, as loaded (converted where used: binary16 pairs
    // take half the registers of their f32 values).
    MmqRawSpan<In> raw[CHUNKS], next_raw[CHUNKS];
    load_held(x + first, len, raw);
    // Every group has a value: length 0 is the end of the walk.
    for (int turn = 0; len > 0; turn ^= 1) {
        const In* xg = x + first;
        uint8_t* og = out + (mmq_fmt<F>::bits == 8 ? first : first / 2);
        float mn = mmq_bits_f32(0x7f800000u);  // +inf
        float mx = -mn;
        if (held) {
#pragma unroll
            for (int r = 0; r < CHUNKS; ++r) {
                float v[8];
                mmq_unpack_raw(raw[r], v);
                mmq_span_minmax(v, mmq_chunk_count(len, threadIdx.x * 8 + r * stride), &mn,
                                &mx);
            }
        } else {
            for (int c = threadIdx.x * 8; c < len; c += stride) {
                int cnt = mmq_chunk_count(len, c);
                float v[8];
                mmq_load_span(xg, c, cnt, vec, v);
                mmq_span_minmax(v, cnt, &mn, &mx);
            }
        }
        mmq_lanes_minmax(&mn, &mx, 32);
        if ((threadIdx.x & 31) == 0) {
            red[turn][warp] = mn;
            red[turn][32 + warp] = mx;
        }
        __syncthreads();
        mn = red[turn][0];
        mx = red[turn][32];
        for (int k = 1; k < warp_count; ++k) {
            mn = fminf(mn, red[turn][k]);
            mx = fmaxf(mx, red[turn][32 + k]);
        }
        float s;
        int32_t z;
        mmq_group_qparams<F>(mn, mx, symmetric, ScaleF16, &s, &z);
        MmqRecip d = mmq_recip(s);
        if (threadIdx.x == 0) {
            int64_t g = walk.row * walk.per_row + walk.col;
            mmq_store_group_params(g, s, z, ScaleF16, scales, zeros);
        }
        // The next group's loads go out before this group's codes.
        int64_t next_first;
        int next_len;
        walk.next();
        walk.span(rows, row_len, group, &next_first, &next_len);
        load_held(x + next_first, next_len, next_raw);
        // Held values are coded by the reciprocal; a scale out of its range (rare: a group of
        // tiny or huge values) reads the group again and divides.
        if (held && d.fast) {
#pragma unroll
            for (int r = 0; r < CHUNKS; ++r) {
                int c = threadIdx.x * 8 + r * stride;
                int cnt = mmq_chunk_count(len, c);
                if (cnt > 0) {
                    float v[8];
                    mmq_unpack_raw(raw[r], v);
                    mmq_code_span_fast<F>(v, c, cnt, vec, d, z, true, og);
                }
            }
        } else {
            for (int c = threadIdx.x * 8; c < len; c += stride) {
                int cnt = mmq_chunk_count(len, c);
                float v[8];
                mmq_load_span(xg, c, cnt, vec, v);
                mmq_code_span<F>(v, c, cnt, vec, d, z, true, og);
            }
        }
        first = next_first, len = next_len;
#pragma unroll
        for (int r = 0; r < CHUNKS; ++r) {
            raw[r] = next_raw[r];
        }
    }
}

template <typename In, int F, bool ScaleF16>
__device__ void mmq_quantize_dynamic_blocks(const In* x, int64_t rows, int64_t row_len,
                                            int64_t group, bool symmetric, bool vec,
                                            uint8_t* out, void* scales, uint8_t* zeros) {
    if (group * (int64_t)sizeof(In) <= (int64_t)blockDim.x * MMQ_HELD_BYTES) {
        mmq_quantize_dynamic_block<In, F, ScaleF16, true>(x, rows, row_len, group, symmetric,
                                                          vec, out, scales, zeros);
    } else {
        mmq_quantize_dynamic_block<In, F, ScaleF16, false>(x, rows, row_len, group, symmetric,
                                                           vec, out, scales, zeros);
    }
}

// Dynamic quantization, one entry point per form (`warp`: groups of up to MMQ_WARP_GROUP values,
// 256 threads a block; `blocks`: longer groups, up to 512 threads), each with a register budget
// that holds its values without spilling (at most 85 and 128 registers).
#define MMQ_DYNAMIC_KERNEL(form, bounds, in_name, In, fmt_name, F, s_name, S, scale_f16)         \
    extern "C" __global__ void __launch_bounds__(bounds)                                        \
        mmq_quantize_dynamic_##form##_##in_name##_##fmt_name##_##s_name(                         \
            const In* x, int64_t rows, int64_t row_len, int64_t group, int32_t symmetric,        \
            int32_t vec, uint8_t* out, S* scales, uint8_t* zeros) {                              \
        mmq_quantize_dynamic_##form<In, F, scale_f16>(x, rows, row_len, group, symmetric != 0,   \
                                                      vec != 0, out, scales, zeros);            \
    }

#define MMQ_QUANT_KERNELS(in_name, In, fmt_name, F)                                              \
    extern "C" __global__ void __launch_bounds__(256, 4) mmq_quantize_##in_name##_##fmt_name(   \
        const In* x, int64_t n, const float* scales, const uint8_t* zeros, MmqScaleMap map,     \
        int32_t saturate, int32_t vec, uint8_t* out) {                                          \
        mmq_quantize_impl<In, F>(x, n, scales, zeros, map, saturate, vec, out);                 \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, 4) mmq_dequantize_##fmt_name##_##in_name( \
        const uint8_t* codes, int64_t n, const float* scales, const uint8_t* zeros,             \
        MmqScaleMap map, int32_t vec, In* y) {                                                  \
        mmq_dequantize_impl<In, F>(codes, n, scales, zeros, map, vec, y);                       \
    }                                                                                           \
    MMQ_DYNAMIC_KERNEL(warp, 256 MMQ_COMMA 3, in_name, In, fmt_name, F, f32s, float, false)     \
    MMQ_DYNAMIC_KERNEL(warp, 256 MMQ_COMMA 3, in_name, In, fmt_name, F, f16s, uint16_t, true)   \
    MMQ_DYNAMIC_KERNEL(blocks, 512 MMQ_COMMA 1, in_name, In, fmt_name, F, f32s, float, false)   \
    MMQ_DYNAMIC_KERNEL(blocks, 512 MMQ_COMMA 1, in_name, In, fmt_name, F, f16s, uint16_t, true)

#define MMQ_QUANT_KERNELS_ALL_FORMATS(in_name, In)        \
    MMQ_QUANT_KERNELS(in_name, In, i8, MMQ_FMT_I8)        \
    MMQ_QUANT_KERNELS(in_name, In, u8, MMQ_FMT_U8)        \
    MMQ_QUANT_KERNELS(in_name, In, i4, MMQ_FMT_I4)        \
    MMQ_QUANT_KERNELS(in_name, In, u4, MMQ_FMT_U4)        \
    MMQ_QUANT_KERNELS(in_name, In, e4m3, MMQ_FMT_E4M3)

MMQ_QUANT_KERNELS_ALL_FORMATS(f32, float)
MMQ_QUANT_KERNELS_ALL_FORMATS(f16, mmq_f16)
MMQ_QUANT_KERNELS_ALL_FORMATS(bf16, mmq_bf16)
