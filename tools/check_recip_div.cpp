// x / s by the reciprocal, as the CUDA kernels divide by a shared scale (mmq_recip and
// mmq_div_fast from kernels/cuda/mmq_quant.cuh, included as they are), against the division,
// over N random pairs (default 10^9):
//
//     c++ -std=c++17 -O2 -ffp-contract=off -Ikernels/cuda tools/check_recip_div.cpp -o /tmp/crd
//     /tmp/crd 1000000000
//
// Scales cover [2^-60, 2^60) with adversarial significands (all ones, near one, near a power of
// two); dividends lie near multiples of s by half-integers and by values in [2^-12, 2^14), a few
// ulps off, or are random bits; one in a thousand is ±0. Prints how many quotients differ in
// their bits, and how many of those matter: |x / s| >= 2^-12, or another sign. The kernels rely
// on that second count being 0 (the Rust test runs 4·10^6 pairs of the same kind each build).
#include <stdio.h>
#include <stdlib.h>

#include "mmq_quant.cuh"

static uint64_t state = 88172645463325252ull;
static uint64_t next() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

int main(int argc, char** argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000000L;
    long differ = 0, matter = 0;
    for (long i = 0; i < n; ++i) {
        uint64_t r1 = next(), r2 = next();
        uint32_t man = (uint32_t)(r1 >> 8) & 0x7fffff;
        switch ((r1 >> 40) % 8) {
            case 0: man = 0x7fffff; break;
            case 1: man = 0x7fffff - (uint32_t)((r1 >> 44) & 0xff); break;
            case 2: man = (uint32_t)(r1 >> 44) & 0xff; break;
            case 3: man = 0; break;
            default: break;
        }
        float s = mmq_bits_f32(((67u + (uint32_t)(r1 % 120)) << 23) | man);
        float x;
        int kind = (int)(r2 >> 60);
        if (kind < 10) {
            float q = ldexpf((float)((r2 >> 8) & 0xffffff) / 16777216.0f + 0.5f,
                             (int)((r2 >> 40) % 26) - 12);
            x = mmq_bits_f32(mmq_f32_bits(q * s) + (uint32_t)((r2 >> 50) % 9) - 4);
        } else if (kind < 12) {
            float q = (float)((int)((r2 >> 8) % 1024) - 512) + 0.5f;
            x = mmq_bits_f32(mmq_f32_bits(q * s) + (uint32_t)((r2 >> 50) % 5) - 2);
        } else {
            x = mmq_bits_f32((uint32_t)r2);
        }
        if ((r2 >> 20) % 1000 == 0) {
            x = 0.0f;
        }
        if (r2 & 1) {
            x = -x;
        }
        float want = x / s;
        MmqRecip d = mmq_recip(s);
        if (!d.fast) {
            printf("s = %a: outside the reciprocal's range\n", s);
            return 1;
        }
        float got = mmq_div_fast(x, d);
        if (mmq_f32_bits(got) == mmq_f32_bits(want) || (want != want && got != got)) {
            continue;
        }
        ++differ;
        if (fabsf(want) >= 0x1p-12f || signbit(got) != signbit(want)) {
            if (matter < 10) {
                printf("x = %a, s = %a: %a, not %a\n", x, s, got, want);
            }
            ++matter;
        }
    }
    printf("%ld pairs: %ld quotients differ in their bits, %ld where a code depends on them\n", n,
           differ, matter);
    return matter != 0;
}
