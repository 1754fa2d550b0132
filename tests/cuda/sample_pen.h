/* Penalty rows of the sampling kernel tests (test_cuda_serving.c,
 * sample_emu.cpp): SK_NPEN distinct ids - the row's largest logit, so the
 * penalties move the argmax and the top of the distribution, then steps of
 * 37 from it (V > 37 * SK_NPEN keeps them apart) - with output counts 0-3
 * (the first 1 or more), and the
 * parameters of sample_params' repetition / presence / frequency
 * penalties. */
#ifndef TERN_TESTS_CUDA_SAMPLE_PEN_H
#define TERN_TESTS_CUDA_SAMPLE_PEN_H

#include <stdint.h>

#include "base/rng.h"

#define SK_NPEN 16
#define SK_REP 1.7f
#define SK_PRES 0.6f
#define SK_FREQ 0.9f

static inline void sk_penalties(int V, const float *logits, tern_rng *rng, int32_t *ids, int32_t *counts)
{
    int32_t a = 0;
    for (int32_t t = 1; t < V; t++)
        if (logits[t] > logits[a]) /* NaN never wins */
            a = t;
    for (int i = 0; i < SK_NPEN; i++) {
        ids[i] = (a + 37 * i) % V;
        counts[i] = (int32_t)(tern_rng_u32(rng) % 4u) + (i == 0);
    }
}

#endif
