/* Small deterministic random generator (PCG32 style), for sampling and fixtures:
 * the same seed always gives the same stream on every platform. */
#ifndef TERN_BASE_RNG_H
#define TERN_BASE_RNG_H

#include <stdint.h>

typedef struct tern_rng { uint64_t state, inc; } tern_rng;

static inline uint32_t tern_rng_u32(tern_rng *r)
{
    uint64_t old = r->state;
    r->state = old * 6364136223846793005ULL + r->inc;
    uint32_t xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((-rot) & 31));
}

static inline void tern_rng_seed(tern_rng *r, uint64_t seed, uint64_t stream)
{
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    tern_rng_u32(r);
    r->state += seed;
    tern_rng_u32(r);
}

/* Skips delta draws of tern_rng_u32 in O(log delta) (the LCG's jump-ahead),
 * so a long stream can be produced in parallel pieces. */
static inline void tern_rng_advance(tern_rng *r, uint64_t delta)
{
    uint64_t mul = 6364136223846793005ULL, add = r->inc, acc_mul = 1, acc_add = 0;
    for (; delta; delta >>= 1) {
        if (delta & 1) {
            acc_mul *= mul;
            acc_add = acc_add * mul + add;
        }
        add = (mul + 1) * add;
        mul *= mul;
    }
    r->state = acc_mul * r->state + acc_add;
}

/* Uniform in [0, 1) with 24 bits, exactly representable as float. */
static inline float tern_rng_f32(tern_rng *r) { return (float)(tern_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }
/* Uniform in [0, 1) with 53 bits. */
static inline double tern_rng_f64(tern_rng *r)
{
    uint64_t a = tern_rng_u32(r) >> 5, b = tern_rng_u32(r) >> 6;
    return (double)(a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

#endif
