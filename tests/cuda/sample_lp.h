/* Logprobs and min_tokens rows of the sampling kernel tests
 * (test_cuda_serving.c, sample_emu.cpp): a case's min_tokens stop set -
 * the row's argmax (EOS as the likeliest token) and two more ids -, which
 * rows ask for logprobs and with how many alternatives (-1 .. 20, clamped
 * by the kernel), and the check of a row's tcu_sample_lp against
 * sref_logprobs (tests/sample_ref.h): ids equal, values within tol
 * (relative above 1). */
#ifndef TERN_TESTS_CUDA_SAMPLE_LP_H
#define TERN_TESTS_CUDA_SAMPLE_LP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "sample_ref.h"
#include "tensor/cuda/cuda_sample.h"

#define SK_NSUP 3

static inline void sk_stops(int V, const float *x, int32_t *sup)
{
    int32_t a = 0;
    for (int32_t t = 1; t < V; t++)
        if (x[t] > x[a]) /* NaN never wins */
            a = t;
    sup[0] = a;
    sup[1] = (a + 5) % V;
    sup[2] = (a * 7 + 3) % V;
}

/* Row j of case c: logprobs on most rows, n_top -1 .. 20. */
static inline int sk_lp(int j) { return j % 4 != 3; }
static inline int sk_ntop(int j, int c) { return (j * 7 + c) % 22 - (j % 5 == 0); }

/* 0 when d (the kernel's logprobs for a draw of id) agrees with the
 * reference over its nominal kept set; rows whose kept set is within eps
 * of a cut (k_lo != k_hi) or drew nothing are not checked (0). */
static inline int sk_lp_check(const sref_row *R, int32_t id, int n_top, const tcu_sample_lp *d, double tol,
                              const char *what)
{
    if (id < 0 || R->k_lo != R->k_hi)
        return 0;
    double lp, tl[TCU_SAMPLE_MAX_TOP];
    int32_t ti[TCU_SAMPLE_MAX_TOP];
    int want = n_top < 0 ? 0 : n_top > TCU_SAMPLE_MAX_TOP ? TCU_SAMPLE_MAX_TOP : n_top;
    want = sref_logprobs(R, R->k_nom, id, want, &lp, ti, tl);
    int bad = d->n_top != want || !(fabs(d->logprob - lp) <= tol * (1 + fabs(lp)));
    for (int j = 0; !bad && j < want; j++)
        bad = d->top_id[j] != ti[j] || !(fabs(d->top_lp[j] - tl[j]) <= tol * (1 + fabs(tl[j])));
    if (bad) {
        printf("%s: logprobs of id %d: kernel %.7g with %d top, reference %.7g with %d top\n", what, id, d->logprob,
               d->n_top, lp, want);
        for (int j = 0; j < want || j < d->n_top; j++)
            if (j < TCU_SAMPLE_MAX_TOP)
                printf("  top %d: kernel %d %.7g, reference %d %.7g\n", j, j < d->n_top ? d->top_id[j] : -1,
                       j < d->n_top ? d->top_lp[j] : 0.0, j < want ? ti[j] : -1, j < want ? tl[j] : 0.0);
    }
    return bad;
}

#endif
