/* What serving needs from the CUDA backend beyond the forward, on a GPU
 * (skipped without one; label cuda): the masked argmax kernel against a
 * host reference (ties, -inf, NaN, empty masks, a vocabulary that is not a
 * multiple of 32); the sampling kernel (tcu_sample_rows) against the
 * double-precision reference of tests/sample_ref.h - for random rows of
 * 1000 and 151936 tokens (ties, -inf, NaN, masks, biases) and many
 * parameter sets, the id at each u of a grid must be the reference's
 * inverse CDF at u, up to u within 2e-6 of a boundary; most rows with
 * logprobs (0-20 alternatives: ids equal to the reference's, values within
 * 1e-5), min_tokens stop sets holding the argmax (never drawn), and a
 * launch mixing every case equal to each row alone, bit for bit; device
 * greedy sampling (forward_start/argmax_finish) and device sampling
 * (sample_finish, with logprobs and a min_tokens stop set) on the demo
 * model against the CPU forward's logits;
 * copy-on-write of a
 * shared, partly filled block reaching the device mirror (a forked
 * sequence continues differently from its parent: logits against the
 * CPU); the engine's KV budget in GPU memory (a budget larger than the GPU
 * is an error; the default fits); the engine on the GPU with logprobs and
 * min_tokens rows sampled on the device against the same engine with the
 * host's sampler over the same GPU logits (TERN_GPU_SAMPLING=0): the same
 * tokens, logprobs within 1e-5. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/rng.h"
#include "engine/engine.h"
#include "model/backend.h"
#include "model/model.h"
#include "sample_ref.h"
#include "tensor/kernels.h"
#include "test_util.h"
#ifdef TERN_CUDA
#include <cuda_runtime_api.h>

#include "tensor/cuda/cuda_sample.h"
#endif

static int have_gpu(void) { return model_cuda_device_count() > 0; }

/* The host reference of the device's masked argmax (cuda_sample.h). */
static int32_t ref_argmax(const float *x, int32_t V, const uint32_t *mk)
{
    int32_t best = -1;
    for (int32_t t = 0; t < V; t++) {
        if ((mk && !(mk[t >> 5] >> (t & 31) & 1)) || isnan(x[t]))
            continue;
        if (best < 0 || x[t] > x[best])
            best = t;
    }
    if (mk && best >= 0 && x[best] == -INFINITY)
        best = -1;
    return best;
}

static void test_argmax_kernel(void **state)
{
    (void)state;
#ifndef TERN_CUDA
    skip();
#else
    if (!have_gpu())
        skip();
    enum { R = 9, V = 1000, NW = (V + 31) / 32 };
    float *x = malloc(sizeof(float) * R * V);
    uint32_t *mk = calloc((size_t)R * NW, 4);
    int32_t on[R], ids[R], want[R];
    tern_rng rng;
    tern_rng_seed(&rng, 7, 1);
    for (int i = 0; i < R * V; i++)
        x[i] = tern_rng_f32(&rng) * 10.0f - 5.0f;
    for (int r = 0; r < R; r++) {
        on[r] = r % 2;
        for (int w = 0; w < NW; w++)
            mk[r * NW + w] = tern_rng_u32(&rng);
    }
    x[0 * V + 7] = x[0 * V + 500] = 9.0f; /* tie: the lower id */
    x[1 * V + 999] = 9.5f;                /* the last id, masked in row 1 unless its bit is set */
    mk[1 * NW + 999 / 32] |= 1u << (999 % 32);
    for (int t = 0; t < V; t++)
        x[2 * V + t] = -INFINITY; /* unmasked all -inf: id 0 like the CPU */
    for (int t = 0; t < V; t++)
        x[3 * V + t] = -INFINITY; /* masked all -inf: nothing allowed */
    memset(mk + 5 * NW, 0, NW * 4); /* row 5: empty mask */
    x[4 * V + 3] = NAN;
    x[6 * V + 10] = NAN;
    x[6 * V + 11] = 100.0f;
    for (int r = 0; r < R; r++)
        want[r] = ref_argmax(x + (size_t)r * V, V, on[r] ? mk + (size_t)r * NW : NULL);
    assert_int_equal(want[0], 7);
    assert_int_equal(want[2], 0);
    assert_int_equal(want[3], -1);
    assert_int_equal(want[5], -1);
    float *dx;
    uint32_t *dm;
    int32_t *don, *dids;
    assert_int_equal(cudaMalloc((void **)&dx, sizeof(float) * R * V), 0);
    assert_int_equal(cudaMalloc((void **)&dm, 4 * R * NW), 0);
    assert_int_equal(cudaMalloc((void **)&don, 4 * R), 0);
    assert_int_equal(cudaMalloc((void **)&dids, 4 * R), 0);
    cudaMemcpy(dx, x, sizeof(float) * R * V, cudaMemcpyHostToDevice);
    cudaMemcpy(dm, mk, 4 * R * NW, cudaMemcpyHostToDevice);
    cudaMemcpy(don, on, 4 * R, cudaMemcpyHostToDevice);
    assert_int_equal(tcu_argmax_rows(dx, R, V, dm, NW, don, dids, NULL), 0);
    assert_int_equal(cudaMemcpy(ids, dids, 4 * R, cudaMemcpyDeviceToHost), 0);
    for (int r = 0; r < R; r++)
        if (ids[r] != want[r])
            fail_msg("row %d: device %d, reference %d", r, ids[r], want[r]);
    /* no masks at all */
    assert_int_equal(tcu_argmax_rows(dx, R, V, NULL, 0, NULL, dids, NULL), 0);
    assert_int_equal(cudaMemcpy(ids, dids, 4 * R, cudaMemcpyDeviceToHost), 0);
    for (int r = 0; r < R; r++)
        assert_int_equal(ids[r], ref_argmax(x + (size_t)r * V, V, NULL));
    /* a vocabulary that is not a multiple of 4 (rows not 16-byte aligned:
     * the scalar scan), same buffers read as rows of V - 1 */
    assert_int_equal(tcu_argmax_rows(dx, R, V - 1, dm, NW, don, dids, NULL), 0);
    assert_int_equal(cudaMemcpy(ids, dids, 4 * R, cudaMemcpyDeviceToHost), 0);
    for (int r = 0; r < R; r++)
        assert_int_equal(ids[r], ref_argmax(x + (size_t)r * (V - 1), V - 1, on[r] ? mk + (size_t)r * NW : NULL));
    cudaFree(dx);
    cudaFree(dm);
    cudaFree(don);
    cudaFree(dids);
    free(x);
    free(mk);
#endif
}

#ifdef TERN_CUDA
/* One parameter set of the sampling kernel test. */
typedef struct skcase {
    float t, top_p, min_p;
    int top_k, n_bias, masked, pen, sup;
} skcase;

static const skcase sk_cases[] = {
    {1.0f, 1.0f, 0, 0, 0, 0, 0, 0},     /* the OpenAI default: id order over everything */
    {0.7f, 0.9f, 0, 0, 0, 0, 0, 0},     /* top-p */
    {1.0f, 1.0f, 0, 40, 0, 0, 0, 0},    /* top-k */
    {1.3f, 0.95f, 0.05f, 50, 0, 1, 0, 0},
    {0.5f, 1.0f, 0.1f, 0, 3, 0, 0, 0},  /* min-p, biases (a repeated id) */
    {2.0f, 0.5f, 0, 7, 2, 1, 0, 0},
    {1.0f, 0.3f, 0, 0, 0, 1, 0, 0},
    {0.9f, 1.0f, 0.9f, 0, 0, 0, 0, 0},
    {1.0f, 1.0f, 0, 1, 0, 0, 0, 0},     /* top-k 1: the argmax */
    {1.0f, 1.0f, 0, 3, 0, 1, 0, 0},
    {3.0f, 0.99f, 0, 1000000, 1, 0, 0, 0}, /* top-k beyond the vocabulary */
    {1.0f, 1.0f, 0, 0, 2, 1, 0, 0},
    {0.35f, 0.8f, 0.01f, 100, 1, 1, 0, 0},
    {0.0f, 1.0f, 0, 0, 2, 1, 0, 0},     /* greedy with bias and mask */
    {0.0f, 1.0f, 0, 0, 0, 0, 0, 0},     /* plain greedy */
    {0.8f, 0.9f, 0, 40, 1, 1, 1, 0}, /* penalties (with a bias, a mask and truncations) */
    {0.0f, 1.0f, 0, 0, 0, 0, 1, 0},  /* greedy with penalties */
    {0.0f, 1.0f, 0, 0, 0, 0, 0, 1},  /* min_tokens: greedy, the stop set holds the argmax */
    {1.0f, 1.0f, 0, 0, 0, 1, 0, 1},  /* min_tokens, sampled, masked */
    {0.7f, 0.9f, 0, 40, 1, 0, 1, 1}, /* min_tokens with penalties, a bias and truncations */
};
#define SK_NC (int)(sizeof sk_cases / sizeof sk_cases[0])
#include "cuda/sample_lp.h"
#include "cuda/sample_pen.h"

/* Totals of the logprobs and min_tokens checks of a sweep. */
typedef struct sk_tally {
    int n_lp, lp_bad, sup_hit;
} sk_tally;


/* Runs every parameter set over fresh random rows of V tokens, NU values of
 * u each (0, the largest u below 1, then stratified); returns the number of
 * draws the reference does not accept. variant: 0 = logits on a 1/64 grid
 * (ties), 1 = 8 distinct values (huge tie groups), 2 = grid with NaNs. */
static int sample_kernel_sweep(int V, int variant, int NU, tern_rng *rng, int *n_draws, int *n_exact, sk_tally *ty)
{
    int NW = (V + 31) / 32, bad = 0;
    tcu_sample_lp *lps = calloc((size_t)NU, sizeof *lps), *lps2 = calloc((size_t)NU, sizeof *lps), *dlp;
    int32_t *dsi;
    assert_int_equal(cudaMalloc((void **)&dlp, sizeof *lps * NU), 0);
    assert_int_equal(cudaMalloc((void **)&dsi, 4 * SK_NSUP), 0);
    float *base = malloc(sizeof(float) * V), *lg = malloc(sizeof(float) * V * NU);
    uint32_t *mk = malloc(4 * (size_t)NW), *mks = malloc(4 * (size_t)NW * NU);
    tcu_sample_param *P = malloc(sizeof *P * NU);
    int32_t *on = malloc(4 * (size_t)NU), *ids = malloc(4 * (size_t)NU), *ids2 = malloc(4 * (size_t)NU);
    double *us = malloc(sizeof *us * NU);
    float *dlg, *dbv;
    uint32_t *dmk;
    int32_t *don, *dids, *dbi;
    tcu_sample_param *dP;
    assert_int_equal(cudaMalloc((void **)&dlg, sizeof(float) * V * NU), 0);
    assert_int_equal(cudaMalloc((void **)&dmk, 4 * (size_t)NW * NU), 0);
    assert_int_equal(cudaMalloc((void **)&dP, sizeof *P * NU), 0);
    assert_int_equal(cudaMalloc((void **)&don, 4 * (size_t)NU), 0);
    assert_int_equal(cudaMalloc((void **)&dids, 4 * (size_t)NU), 0);
    assert_int_equal(cudaMalloc((void **)&dbi, 4 * 4), 0);
    assert_int_equal(cudaMalloc((void **)&dbv, 4 * 4), 0);
    int32_t *dpi, *dpc;
    assert_int_equal(cudaMalloc((void **)&dpi, 4 * SK_NPEN), 0);
    assert_int_equal(cudaMalloc((void **)&dpc, 4 * SK_NPEN), 0);
    for (int c = 0; c < SK_NC; c++) {
        const skcase *k = &sk_cases[c];
        for (int i = 0; i < V; i++)
            base[i] = variant == 1 ? (float)(tern_rng_u32(rng) % 8) / 4.0f
                                   : (float)((int)(tern_rng_u32(rng) % 1536) - 768) / 64.0f;
        for (int i = c % 7; i < V; i += 7)
            base[i] = -INFINITY;
        if (variant == 2)
            for (int i = 3; i < V; i += 101)
                base[i] = NAN;
        for (int w = 0; w < NW; w++)
            mk[w] = tern_rng_u32(rng) | tern_rng_u32(rng); /* about 3/4 allowed */
        int32_t bid[4];
        float bvl[4];
        for (int b = 0; b < k->n_bias; b++) {
            bid[b] = (int32_t)(tern_rng_u32(rng) % (uint32_t)V);
            bvl[b] = (float)((int)(tern_rng_u32(rng) % 400) - 100) / 16.0f;
        }
        if (k->n_bias >= 2)
            bid[1] = bid[0];
        int32_t pid[SK_NPEN], pcn[SK_NPEN], sup[SK_NSUP];
        sk_penalties(V, base, rng, pid, pcn);
        sk_stops(V, base, sup);
        const int nsup = k->sup ? SK_NSUP : 0;
        sref_params sp = {k->t, k->top_p, k->min_p, k->top_k, bid, bvl, k->n_bias,
                          k->pen, SK_REP, SK_PRES, SK_FREQ, pid, pcn, k->pen ? SK_NPEN : 0, sup, nsup};
        sref_row R;
        sref_prepare(&R, base, V, &sp, k->masked ? mk : NULL, 2e-6);
        for (int j = 0; j < NU; j++) {
            memcpy(lg + (size_t)j * V, base, sizeof(float) * V);
            memcpy(mks + (size_t)j * NW, mk, 4 * (size_t)NW);
            us[j] = j == 0 ? 0.0 : j == 1 ? 1.0 - 0x1p-53 : (j - 2 + tern_rng_f64(rng)) / (NU - 2);
            tcu_sample_param q = {us[j], k->t, k->top_p, k->min_p, k->top_k, 0, k->n_bias,
                                  SK_REP, SK_PRES, SK_FREQ, 0, k->pen ? SK_NPEN : 0, k->pen,
                                  0, nsup, sk_lp(j), sk_ntop(j, c), j};
            P[j] = q;
            on[j] = k->masked;
        }
        cudaMemcpy(dsi, sup, 4 * SK_NSUP, cudaMemcpyHostToDevice);
        cudaMemcpy(dmk, mks, 4 * (size_t)NW * NU, cudaMemcpyHostToDevice);
        cudaMemcpy(dP, P, sizeof *P * NU, cudaMemcpyHostToDevice);
        cudaMemcpy(don, on, 4 * (size_t)NU, cudaMemcpyHostToDevice);
        cudaMemcpy(dbi, bid, 4 * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dbv, bvl, 4 * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dpi, pid, 4 * SK_NPEN, cudaMemcpyHostToDevice);
        cudaMemcpy(dpc, pcn, 4 * SK_NPEN, cudaMemcpyHostToDevice);
        for (int rep = 0; rep < 2; rep++) { /* twice: the same ids (biases are added in place: fresh logits) */
            cudaMemcpy(dlg, lg, sizeof(float) * V * NU, cudaMemcpyHostToDevice);
            int rc = tcu_sample_rows(dlg, NU, V, dP, dbi, dbv, dpi, dpc, dsi, dmk, NW, don, dids, dlp, NULL);
            if (!rc)
                rc = (int)cudaMemcpy(rep ? ids2 : ids, dids, 4 * (size_t)NU, cudaMemcpyDeviceToHost);
            if (!rc)
                rc = (int)cudaMemcpy(rep ? lps2 : lps, dlp, sizeof *lps * NU, cudaMemcpyDeviceToHost);
            if (rc)
                fail_msg("tcu_sample_rows, V %d case %d: %s", V, c, cudaGetErrorString((cudaError_t)rc));
        }
        for (int j = 0; j < NU; j++) {
            int32_t want = sref_draw(&R, R.k_nom, us[j]);
            (*n_draws)++;
            *n_exact += ids[j] == want;
            for (int q = 0; q < nsup; q++)
                ty->sup_hit += ids[j] == sup[q];
            if (sk_lp(j) && ids[j] >= 0) {
                char what[96];
                snprintf(what, sizeof what, "V %d variant %d case %d row %d", V, variant, c, j);
                ty->n_lp++;
                int lb = sk_lp_check(&R, ids[j], sk_ntop(j, c), &lps[j], 1e-5, what);
                if (!lb && ids2[j] == ids[j] && memcmp(&lps[j], &lps2[j], sizeof lps[j])) {
                    printf("%s: logprobs not deterministic\n", what);
                    lb = 1;
                }
                ty->lp_bad += lb;
            }
            if (ids2[j] != ids[j]) {
                printf("V %d variant %d case %d u %.17g: not deterministic: %d then %d\n", V, variant, c, us[j], ids[j],
                       ids2[j]);
                bad++;
                continue;
            }
            if (sref_accepts(&R, ids[j], us[j], 2e-6))
                continue;
            if (bad++ < 12) {
                int32_t pj = !R.greedy && R.n > 0 && ids[j] >= 0 && ids[j] < V ? R.pos[ids[j]] : -1;
                double z = R.n ? R.cum[R.k_nom - 1] : 1;
                printf("V %d variant %d case %d (T %.2f top_k %d top_p %.2f min_p %.2f bias %d mask %d) u %.17g: "
                       "kernel %d (reference position %d, interval [%.9f, %.9f)), reference %d; kept %d (%d..%d) of "
                       "%d, argmax %d\n",
                       V, variant, c, k->t, k->top_k, k->top_p, k->min_p, k->n_bias, k->masked, us[j], ids[j], pj,
                       pj > 0 ? R.cum[pj - 1] / z : 0.0, pj >= 0 ? R.cum[pj] / z : -1.0, want, R.k_nom, R.k_lo,
                       R.k_hi, R.n, R.argmax);
            }
        }
        sref_free(&R);
    }
    cudaFree(dlg);
    cudaFree(dmk);
    cudaFree(dP);
    cudaFree(don);
    cudaFree(dids);
    cudaFree(dbi);
    cudaFree(dbv);
    cudaFree(dpi);
    cudaFree(dpc);
    cudaFree(dlp);
    cudaFree(dsi);
    free(lps);
    free(lps2);
    free(base);
    free(lg);
    free(mk);
    free(mks);
    free(P);
    free(on);
    free(ids);
    free(ids2);
    free(us);
    return bad;
}

/* One launch of NC rows of V tokens, row c under case c (fresh logits,
 * lists, u; logprobs on two rows of three) against each row launched
 * alone: the same id and the same logprobs bytes (batch invariance).
 * Returns the rows that differ. */
static int sample_kernel_mixed(int V, tern_rng *rng)
{
    enum { NC = SK_NC };
    const int NW = (V + 31) / 32;
    float *lg = malloc(sizeof(float) * V * NC), bv[4 * NC], *dlg, *dbv;
    uint32_t *mk = malloc(4 * (size_t)NW * NC), *dmk;
    int32_t bi[4 * NC], pi[SK_NPEN * NC], pc[SK_NPEN * NC], si[SK_NSUP * NC], on[NC], ids[NC], aid;
    int32_t *dbi, *dpi, *dpc, *dsi, *don, *dids;
    tcu_sample_param P[NC], *dP;
    tcu_sample_lp lp[NC], alp, *dlp;
    for (int c = 0; c < NC; c++) {
        const skcase *k = &sk_cases[c];
        float *x = lg + (size_t)c * V;
        for (int i = 0; i < V; i++)
            x[i] = (float)((int)(tern_rng_u32(rng) % 1536) - 768) / 64.0f;
        for (int i = c % 7; i < V; i += 7)
            x[i] = -INFINITY;
        for (int w = 0; w < NW; w++)
            mk[(size_t)c * NW + w] = tern_rng_u32(rng) | tern_rng_u32(rng);
        for (int b = 0; b < 4; b++) {
            bi[4 * c + b] = (int32_t)(tern_rng_u32(rng) % (uint32_t)V);
            bv[4 * c + b] = (float)((int)(tern_rng_u32(rng) % 400) - 100) / 16.0f;
        }
        sk_penalties(V, x, rng, pi + SK_NPEN * c, pc + SK_NPEN * c);
        sk_stops(V, x, si + SK_NSUP * c);
        tcu_sample_param q = {tern_rng_f64(rng), k->t, k->top_p, k->min_p, k->top_k, 4 * c, k->n_bias,
                              SK_REP, SK_PRES, SK_FREQ, SK_NPEN * c, k->pen ? SK_NPEN : 0, k->pen,
                              SK_NSUP * c, k->sup ? SK_NSUP : 0, c % 3 != 1, sk_ntop(c, c), c};
        P[c] = q;
        on[c] = k->masked;
    }
    assert_int_equal(cudaMalloc((void **)&dlg, sizeof(float) * V * NC), 0);
    assert_int_equal(cudaMalloc((void **)&dmk, 4 * (size_t)NW * NC), 0);
    assert_int_equal(cudaMalloc((void **)&dbi, sizeof bi), 0);
    assert_int_equal(cudaMalloc((void **)&dbv, sizeof bv), 0);
    assert_int_equal(cudaMalloc((void **)&dpi, sizeof pi), 0);
    assert_int_equal(cudaMalloc((void **)&dpc, sizeof pc), 0);
    assert_int_equal(cudaMalloc((void **)&dsi, sizeof si), 0);
    assert_int_equal(cudaMalloc((void **)&don, sizeof on), 0);
    assert_int_equal(cudaMalloc((void **)&dids, sizeof ids), 0);
    assert_int_equal(cudaMalloc((void **)&dP, sizeof P), 0);
    assert_int_equal(cudaMalloc((void **)&dlp, sizeof lp), 0);
    cudaMemcpy(dlg, lg, sizeof(float) * V * NC, cudaMemcpyHostToDevice);
    cudaMemcpy(dmk, mk, 4 * (size_t)NW * NC, cudaMemcpyHostToDevice);
    cudaMemcpy(dbi, bi, sizeof bi, cudaMemcpyHostToDevice);
    cudaMemcpy(dbv, bv, sizeof bv, cudaMemcpyHostToDevice);
    cudaMemcpy(dpi, pi, sizeof pi, cudaMemcpyHostToDevice);
    cudaMemcpy(dpc, pc, sizeof pc, cudaMemcpyHostToDevice);
    cudaMemcpy(dsi, si, sizeof si, cudaMemcpyHostToDevice);
    cudaMemcpy(don, on, sizeof on, cudaMemcpyHostToDevice);
    cudaMemcpy(dP, P, sizeof P, cudaMemcpyHostToDevice);
    memset(lp, 0, sizeof lp);
    cudaMemcpy(dlp, lp, sizeof lp, cudaMemcpyHostToDevice);
    assert_int_equal(tcu_sample_rows(dlg, NC, V, dP, dbi, dbv, dpi, dpc, dsi, dmk, NW, don, dids, dlp, NULL), 0);
    assert_int_equal(cudaMemcpy(ids, dids, sizeof ids, cudaMemcpyDeviceToHost), 0);
    assert_int_equal(cudaMemcpy(lp, dlp, sizeof lp, cudaMemcpyDeviceToHost), 0);
    int bad = 0, n_lp = 0;
    for (int c = 0; c < NC; c++) {
        tcu_sample_param one = P[c];
        one.lp_slot = 0;
        memset(&alp, 0, sizeof alp);
        cudaMemcpy(dP, &one, sizeof one, cudaMemcpyHostToDevice);
        cudaMemcpy(dlp, &alp, sizeof alp, cudaMemcpyHostToDevice);
        cudaMemcpy(dlg, lg + (size_t)c * V, sizeof(float) * V, cudaMemcpyHostToDevice); /* the rows were edited */
        assert_int_equal(tcu_sample_rows(dlg, 1, V, dP, dbi, dbv, dpi, dpc, dsi, dmk + (size_t)c * NW, NW, don + c,
                                         dids, dlp, NULL),
                         0);
        assert_int_equal(cudaMemcpy(&aid, dids, 4, cudaMemcpyDeviceToHost), 0);
        assert_int_equal(cudaMemcpy(&alp, dlp, sizeof alp, cudaMemcpyDeviceToHost), 0);
        n_lp += one.lp && aid >= 0;
        if (aid != ids[c] || (one.lp && memcmp(&alp, &lp[c], sizeof alp))) {
            printf("mixed launch, V %d row %d (case %d): id %d alone, %d in the batch%s\n", V, c, c, aid, ids[c],
                   aid == ids[c] ? " (logprobs differ)" : "");
            bad++;
        }
    }
    printf("mixed launch, V %d: %d rows (%d with logprobs), %d differ from the row alone\n", V, NC, n_lp, bad);
    cudaFree(dlg);
    cudaFree(dmk);
    cudaFree(dbi);
    cudaFree(dbv);
    cudaFree(dpi);
    cudaFree(dpc);
    cudaFree(dsi);
    cudaFree(don);
    cudaFree(dids);
    cudaFree(dP);
    cudaFree(dlp);
    free(lg);
    free(mk);
    return bad;
}
#endif

static void test_sample_kernel(void **state)
{
    (void)state;
#ifndef TERN_CUDA
    skip();
#else
    if (!have_gpu())
        skip();
    tern_rng rng;
    tern_rng_seed(&rng, 21, 3);
    int bad = 0;
    static const int vocabs[] = {1000, 151936};
    for (int v = 0; v < 2; v++)
        for (int variant = 0; variant < 3; variant++) {
            int draws = 0, exact = 0;
            sk_tally ty = {0, 0, 0};
            int b = sample_kernel_sweep(vocabs[v], variant, v ? 24 : 64, &rng, &draws, &exact, &ty);
            printf("sampling kernel, V %d, logits variant %d: %d draws, %d the reference's exact inverse CDF, %d "
                   "rejected\n",
                   vocabs[v], variant, draws, exact, b);
            printf("logprobs, V %d, logits variant %d: %d rows against the double reference, %d wrong; %d draws of "
                   "a min_tokens stop id\n",
                   vocabs[v], variant, ty.n_lp, ty.lp_bad, ty.sup_hit);
            bad += b + ty.lp_bad + ty.sup_hit;
        }
    for (int v = 0; v < 2; v++)
        bad += sample_kernel_mixed(vocabs[v], &rng);
    /* rows where nothing can be drawn: -1; and the argmax rule at temperature 0 */
    enum { V = 3000, NW = (V + 31) / 32, R = 4 };
    float *x = malloc(sizeof(float) * V * R);
    uint32_t *mk = calloc((size_t)R * NW, 4);
    int32_t on[R] = {1, 0, 0, 1}, ids[R];
    for (int i = 0; i < V * R; i++)
        x[i] = (float)(i % 17);
    for (int t = 0; t < V; t++)
        x[1 * V + t] = x[2 * V + t] = -INFINITY; /* row 0: empty mask; rows 1, 2: all -inf */
    for (int w = 0; w < NW; w++)
        mk[3 * NW + w] = 0x80000001u; /* row 3: ids 0 and 31 mod 32 allowed */
    /* rows 0 and 3 also ask for logprobs: none for row 0 (nothing drawn) */
    tcu_sample_param P[R] = {{0.5, 1.0f, 1.0f, 0, 0, 0, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0, 1, 5, 0},
                             {0.5, 1.0f, 0.9f, 0, 0, 0, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
                             {0.5, 0.0f, 1.0f, 0, 0, 0, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
                             {0.5, 0.0f, 1.0f, 0, 0, 0, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0, 1, 20, 1}};
    tcu_sample_lp elp[2], *delp;
    assert_int_equal(cudaMalloc((void **)&delp, sizeof elp), 0);
    float *dx;
    uint32_t *dm;
    int32_t *don, *dids;
    tcu_sample_param *dP;
    assert_int_equal(cudaMalloc((void **)&dx, sizeof(float) * V * R), 0);
    assert_int_equal(cudaMalloc((void **)&dm, 4 * R * NW), 0);
    assert_int_equal(cudaMalloc((void **)&don, 4 * R), 0);
    assert_int_equal(cudaMalloc((void **)&dids, 4 * R), 0);
    assert_int_equal(cudaMalloc((void **)&dP, sizeof P), 0);
    cudaMemcpy(dx, x, sizeof(float) * V * R, cudaMemcpyHostToDevice);
    cudaMemcpy(dm, mk, 4 * R * NW, cudaMemcpyHostToDevice);
    cudaMemcpy(don, on, 4 * R, cudaMemcpyHostToDevice);
    cudaMemcpy(dP, P, sizeof P, cudaMemcpyHostToDevice);
    assert_int_equal(tcu_sample_rows(dx, R, V, dP, NULL, NULL, NULL, NULL, NULL, dm, NW, don, dids, delp, NULL), 0);
    assert_int_equal(cudaMemcpy(ids, dids, 4 * R, cudaMemcpyDeviceToHost), 0);
    assert_int_equal(cudaMemcpy(elp, delp, sizeof elp, cudaMemcpyDeviceToHost), 0);
    int32_t want3 = ref_argmax(x + 3 * V, V, mk + 3 * NW);
    printf("edge rows: %d %d %d %d (want -1 -1 0 %d); logprobs of row 0: %d top, of row 3: %d top, first %d\n",
           ids[0], ids[1], ids[2], ids[3], want3, elp[0].n_top, elp[1].n_top, elp[1].top_id[0]);
    if (ids[0] != -1 || ids[1] != -1 || ids[2] != 0 || ids[3] != want3)
        bad++;
    /* row 3 allows ids 0 and 31 mod 32 of x[i] = i % 17: the 20 best are the allowed ids with the largest x */
    if (elp[0].n_top != 0 || elp[1].n_top != 20 || elp[1].top_id[0] != want3)
        bad++;
    cudaFree(delp);
    /* bad arguments are errors, not launches */
    assert_int_not_equal(tcu_sample_rows(dx, R, TCU_SAMPLE_MAX_VOCAB + 1, dP, NULL, NULL, NULL, NULL, NULL, NULL, 0,
                                         NULL, dids, NULL, NULL),
                         0);
    assert_int_not_equal(tcu_sample_rows(dx, R, V, dP, NULL, NULL, NULL, NULL, NULL, dm, 1, don, dids, NULL, NULL), 0);
    cudaGetLastError();
    /* time: 64 rows of 151936 tokens, top-p 0.9 and the default, then
     * with 20 logprobs: the default, top-p 0.9 and greedy */
    {
        enum { TR = 64, TV = 151936 };
        float *tl;
        tcu_sample_param *tp, hp[TR];
        int32_t *ti;
        tcu_sample_lp *tlp;
        assert_int_equal(cudaMalloc((void **)&tl, sizeof(float) * TR * TV), 0);
        assert_int_equal(cudaMalloc((void **)&tp, sizeof hp), 0);
        assert_int_equal(cudaMalloc((void **)&ti, 4 * TR), 0);
        assert_int_equal(cudaMalloc((void **)&tlp, sizeof *tlp * TR), 0);
        float *hl = malloc(sizeof(float) * TV);
        for (int i = 0; i < TV; i++)
            hl[i] = tern_rng_f32(&rng) * 20.0f - 10.0f;
        for (int r = 0; r < TR; r++)
            cudaMemcpy(tl + (size_t)r * TV, hl, sizeof(float) * TV, cudaMemcpyHostToDevice);
        free(hl);
        static const char *names[] = {"no truncation", "top-p 0.9", "top-k 40", "no truncation, 20 logprobs",
                                      "top-p 0.9, 20 logprobs", "greedy, 20 logprobs"};
        for (int mode = 0; mode < 6; mode++) {
            const int m3 = mode % 3, lp = mode >= 3;
            for (int r = 0; r < TR; r++) {
                tcu_sample_param q = {(r + 0.5) / TR, lp && m3 == 2 ? 0.0f : 1.0f, m3 == 1 ? 0.9f : 1.0f, 0,
                                      !lp && m3 == 2 ? 40 : 0, 0, 0, 1.0f, 0, 0, 0, 0, 0, 0, 0, lp, 20, r};
                hp[r] = q;
            }
            cudaMemcpy(tp, hp, sizeof hp, cudaMemcpyHostToDevice);
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            tcu_sample_rows(tl, TR, TV, tp, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, ti, tlp, NULL); /* warm-up */
            cudaEventRecord(e0, NULL);
            for (int it = 0; it < 10; it++)
                tcu_sample_rows(tl, TR, TV, tp, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, ti, tlp, NULL);
            cudaEventRecord(e1, NULL);
            assert_int_equal(cudaEventSynchronize(e1), 0);
            float ms = 0;
            cudaEventElapsedTime(&ms, e0, e1);
            printf("tcu_sample_rows, %d rows of %d tokens, %s: %.3f ms per launch\n", TR, TV, names[mode], ms / 10);
            cudaEventDestroy(e0);
            cudaEventDestroy(e1);
        }
        cudaFree(tl);
        cudaFree(tp);
        cudaFree(ti);
        cudaFree(tlp);
    }
    cudaFree(dx);
    cudaFree(dm);
    cudaFree(don);
    cudaFree(dids);
    cudaFree(dP);
    free(x);
    free(mk);
    if (bad)
        fail_msg("%d sampling kernel checks failed (details above)", bad);
#endif
}

static tern_model *g_cpu, *g_gpu;

static int setup(void **state)
{
    (void)state;
    if (!have_gpu())
        return 0;
    tern_err err;
    /* exact products, GEMV everywhere: f32 accumulation, tight tolerances */
    tern_kernels_exact_set(1);
    setenv("TERN_CUDA_GEMM_MIN_T", "1000000", 1);
    model_load_opts lo = {2, "cuda"};
    g_cpu = model_load(repo_path("models/tern-demo"), 2, &err);
    g_gpu = g_cpu ? model_load_ex(repo_path("models/tern-demo"), &lo, &err) : NULL;
    if (!g_gpu) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    model_free(g_gpu);
    model_free(g_cpu);
    return 0;
}

static double rel_err(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Runs the same script of sequence operations on one model: A gets 20
 * tokens; B forks A's first 20 (its last block is shared and partly
 * filled); then one batch feeds A 4 more tokens and B 4 different ones
 * (B's reserve copies the shared block); logits of the last 2 positions of
 * each. */
static void fork_script(tern_model *m, float *logits)
{
    tern_err err;
    kv_pool kv;
    kv_seq a = {0}, b = {0};
    int32_t tok[24], pos[24], rows[4];
    kv_seq *seqs[24];
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 16, &err), 0);
    for (int i = 0; i < 20; i++) {
        tok[i] = 100 + 37 * i;
        pos[i] = i;
        seqs[i] = &a;
    }
    assert_int_equal(kv_seq_reserve(&kv, &a, 20, &err), 0);
    fwd_batch b1 = {20, tok, pos, seqs, 0, NULL};
    assert_int_equal(model_forward(m, &kv, &b1, NULL, &err), 0);
    assert_int_equal(kv_seq_fork(&kv, &a, &b, 20, &err), 0);
    assert_int_equal(kv.ref[a.blocks[1]], 2);
    assert_int_equal(kv_seq_reserve(&kv, &a, 24, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &b, 24, &err), 0);
    assert_int_not_equal(a.blocks[1], b.blocks[1]); /* copied on write */
    for (int i = 0; i < 8; i++) {
        tok[i] = i < 4 ? 2000 + i : 3000 + 11 * i;
        pos[i] = 20 + i % 4;
        seqs[i] = i < 4 ? &a : &b;
    }
    rows[0] = 2, rows[1] = 3, rows[2] = 6, rows[3] = 7;
    fwd_batch b2 = {8, tok, pos, seqs, 4, rows};
    assert_int_equal(model_forward(m, &kv, &b2, logits, &err), 0);
    kv_seq_free(&kv, &a);
    kv_seq_free(&kv, &b);
    kv_pool_free(&kv);
}

static void test_fork_copy_on_write(void **state)
{
    (void)state;
    if (!g_gpu)
        skip();
    size_t n = (size_t)4 * model_config_get(g_cpu)->n_vocab;
    float *lc = malloc(n * sizeof(float)), *lg = malloc(n * sizeof(float));
    fork_script(g_cpu, lc);
    fork_script(g_gpu, lg);
    double e = rel_err(lg, lc, n);
    printf("fork + copy-on-write logits: rel. error %.2e\n", e);
    assert_true(e < 2e-5);
    free(lc);
    free(lg);
}

static void test_device_greedy(void **state)
{
    (void)state;
    if (!g_gpu)
        skip();
    model_backend *be = model_backend_get(g_gpu);
    assert_non_null(be->forward_start);
    assert_non_null(be->argmax_finish);
    tern_err err;
    int32_t V = model_config_get(g_cpu)->n_vocab, nw = (V + 31) / 32;
    enum { S = 3, L = 12 };
    float *lc = malloc(sizeof(float) * S * V);
    uint32_t *mk = malloc(4 * (size_t)S * nw);
    uint8_t on[S] = {0, 1, 1};
    int32_t ids[S];
    tern_rng rng;
    tern_rng_seed(&rng, 3, 1);
    for (int i = 0; i < S * nw; i++)
        mk[i] = tern_rng_u32(&rng) & tern_rng_u32(&rng); /* about a quarter allowed */
    for (int run = 0; run < 2; run++) {
        tern_model *m = run ? g_gpu : g_cpu;
        kv_pool kv;
        kv_seq sq[S];
        memset(sq, 0, sizeof sq);
        int32_t tok[S * L], pos[S * L], rows[S];
        kv_seq *seqs[S * L];
        assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 8, &err), 0);
        for (int s = 0; s < S; s++) {
            assert_int_equal(kv_seq_reserve(&kv, &sq[s], L, &err), 0);
            for (int i = 0; i < L; i++) {
                tok[s * L + i] = (int32_t)(tern_rng_u32(&rng) % (uint32_t)V);
                pos[s * L + i] = i;
                seqs[s * L + i] = &sq[s];
            }
            rows[s] = s * L + L - 1;
        }
        fwd_batch b = {S * L, tok, pos, seqs, S, rows};
        if (run == 0) {
            assert_int_equal(model_forward(m, &kv, &b, lc, &err), 0);
        } else {
            assert_int_equal(be->forward_start(be, m, &kv, &b, &err), 0);
            assert_int_equal(be->argmax_finish(be, mk, nw, on, ids, &err), 0);
            for (int s = 0; s < S; s++) {
                const float *x = lc + (size_t)s * V;
                const uint32_t *m_s = on[s] ? mk + (size_t)s * nw : NULL;
                int32_t want = ref_argmax(x, V, m_s);
                printf("row %d: device %d, CPU logits %d\n", s, ids[s], want);
                assert_true(want >= 0 && ids[s] >= 0 && ids[s] < V);
                assert_true(!m_s || (m_s[ids[s] >> 5] >> (ids[s] & 31) & 1)); /* allowed */
                /* the same id, or a near tie on the CPU's logits (GPU and CPU sums differ ~1e-6) */
                assert_true(ids[s] == want || fabsf(x[ids[s]] - x[want]) < 1e-4f * (1.0f + fabsf(x[want])));
            }
            /* finish without a start is an error, not a hang */
            assert_int_not_equal(be->argmax_finish(be, mk, nw, on, ids, &err), 0);
        }
        for (int s = 0; s < S; s++)
            kv_seq_free(&kv, &sq[s]);
        kv_pool_free(&kv);
        tern_rng_seed(&rng, 3, 1); /* the same tokens for the second run */
        for (int i = 0; i < S * nw; i++)
            {
            (void)tern_rng_u32(&rng);
            (void)tern_rng_u32(&rng);
        }
    }
    free(lc);
    free(mk);
}

/* sample_finish on the demo model: 3 sequences, each row with its own
 * parameters (the default, top-p with a mask, greedy with a bias), several
 * u; the ids against the reference over the CPU forward's logits (GPU and
 * CPU logits differ ~1e-6, hence the wider eps). Every row reports
 * logprobs (5, 20 and 3 alternatives), checked against the reference's
 * within 1e-4 (a top id may differ from the reference's only where their
 * reference values are that close); rows 0 and 2 carry a min_tokens stop
 * set holding their argmax, which must never be drawn. */
static int lp_device_check(const sref_row *R, int32_t id, int n_top, const sample_result *d, int s)
{
    if (id < 0 || R->k_lo != R->k_hi)
        return 0;
    double lp, tl[SAMPLE_MAX_LOGPROBS], other, tol = 1e-4;
    int32_t ti[SAMPLE_MAX_LOGPROBS], ox;
    int want = sref_logprobs(R, R->k_nom, id, n_top, &lp, ti, tl);
    int bad = d->id != id || d->n_top != want || !(fabs(d->logprob - lp) <= tol * (1 + fabs(lp)));
    for (int j = 0; !bad && j < want; j++) {
        bad = !(fabs(d->top[j].logprob - tl[j]) <= tol * (1 + fabs(tl[j])));
        if (!bad && d->top[j].id != ti[j]) { /* a near tie of GPU and CPU logits */
            sref_logprobs(R, R->k_nom, d->top[j].id, 0, &other, &ox, &other);
            bad = !(fabs(other - tl[j]) <= tol * (1 + fabs(tl[j])));
        }
    }
    if (bad)
        printf("sample_finish row %d: logprobs of %d: device %.7g with %d top (first %d %.7g), reference %.7g with %d "
               "top (first %d %.7g)  <- MISMATCH\n",
               s, id, d->logprob, d->n_top, d->n_top ? d->top[0].id : -1, d->n_top ? d->top[0].logprob : 0.0f, lp,
               want, want ? ti[0] : -1, want ? tl[0] : 0.0);
    return bad;
}

static void test_device_sample_finish(void **state)
{
    (void)state;
    if (!g_gpu)
        skip();
    model_backend *be = model_backend_get(g_gpu);
    assert_non_null(be->sample_finish);
    tern_err err;
    int32_t V = model_config_get(g_cpu)->n_vocab, nw = (V + 31) / 32;
    enum { S = 3, L = 12, NU = 8 };
    float *lc = malloc(sizeof(float) * S * V);
    uint32_t *mk = malloc(4 * (size_t)S * nw);
    uint8_t on[S] = {0, 1, 1};
    int32_t ids[S];
    tern_rng rng;
    tern_rng_seed(&rng, 5, 1);
    for (int i = 0; i < S * nw; i++)
        mk[i] = tern_rng_u32(&rng) | tern_rng_u32(&rng);
    int32_t tok[S * L], pos[S * L], rows[S];
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < L; i++) {
            tok[s * L + i] = (int32_t)(tern_rng_u32(&rng) % (uint32_t)V);
            pos[s * L + i] = i;
        }
        rows[s] = s * L + L - 1;
    }
    const sample_bias bias[2] = {{7, 3.0f}, {9, -2.0f}};
    /* row 1 with penalties (set once its CPU logits are known): its
     * largest logit's id, so the penalties move the top of the
     * distribution, and the distinct ids of its first 6 tokens; output
     * counts 0-2 */
    uint32_t *count = calloc((size_t)V, sizeof *count);
    int32_t pid[7], pcn[7], np = 0;
    assert_non_null(count);
    sample_result res[S];
    int32_t stop[S][1];
    dev_sample_row dr[S] = {{1.0f, 1.0f, 0.0f, 0, NULL, 0, 0, 1.0f, 0, 0, NULL, 0, NULL, stop[0], 1, &res[0], 5},
                            {0.8f, 0.9f, 0.0f, 0, NULL, 0, 0, 1.6f, 0.5f, 0.8f, pid, np, count, NULL, 0, &res[1], 20},
                            {0.0f, 1.0f, 0.0f, 0, bias, 2, 0, 1.0f, 0, 0, NULL, 0, NULL, stop[2], 1, &res[2], 3}};
    int bad = 0, same = 0, lp_bad = 0, stop_hit = 0;
    for (int run = 0; run < 2; run++) {
        tern_model *m = run ? g_gpu : g_cpu;
        kv_pool kv;
        kv_seq sq[S];
        memset(sq, 0, sizeof sq);
        kv_seq *seqs[S * L];
        assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 8, &err), 0);
        for (int s = 0; s < S; s++) {
            assert_int_equal(kv_seq_reserve(&kv, &sq[s], L, &err), 0);
            for (int i = 0; i < L; i++)
                seqs[s * L + i] = &sq[s];
        }
        fwd_batch b = {S * L, tok, pos, seqs, S, rows};
        if (run == 0) {
            assert_int_equal(model_forward(m, &kv, &b, lc, &err), 0);
        } else {
            int32_t top = 0;
            for (int32_t t = 1; t < V; t++)
                top = lc[(size_t)V + t] > lc[(size_t)V + top] ? t : top;
            pid[np++] = top;
            for (int i = 0; i < 6; i++) {
                int dup = 0;
                for (int k = 0; k < np; k++)
                    dup |= pid[k] == tok[L + i];
                if (!dup)
                    pid[np++] = tok[L + i];
            }
            for (int k = 0; k < np; k++)
                pcn[k] = (int32_t)(count[pid[k]] = (uint32_t)(k % 3));
            dr[1].n_pen = np;
            for (int s = 0; s < S; s += 2) { /* the row's allowed argmax (with row 2's bias) as its stop id */
                const float *x = lc + (size_t)s * V;
                const uint32_t *m_s = on[s] ? mk + (size_t)s * nw : NULL;
                int32_t a = -1;
                for (int32_t t = 0; t < V; t++) {
                    if (m_s && !(m_s[t >> 5] >> (t & 31) & 1))
                        continue;
                    float xt = x[t] + (s == 2 ? (t == 7 ? 3.0f : t == 9 ? -2.0f : 0.0f) : 0.0f);
                    float xa = a < 0 ? -INFINITY : x[a] + (s == 2 ? (a == 7 ? 3.0f : a == 9 ? -2.0f : 0.0f) : 0.0f);
                    a = a < 0 || xt > xa ? t : a;
                }
                stop[s][0] = a;
            }
            for (int k = 0; k < NU; k++) {
                for (int s = 0; s < S; s++)
                    dr[s].u = (k + 0.5) / NU;
                assert_int_equal(be->forward_start(be, m, &kv, &b, &err), 0);
                assert_int_equal(be->sample_finish(be, dr, mk, nw, on, ids, &err), 0);
                for (int s = 0; s < S; s++) {
                    int32_t bid[2] = {bias[0].id, bias[1].id};
                    float bv[2] = {bias[0].bias, bias[1].bias};
                    const int pen = dr[s].n_pen > 0;
                    sref_params sp = {dr[s].temperature, dr[s].top_p, dr[s].min_p, dr[s].top_k, bid, bv, dr[s].n_bias,
                                      pen, dr[s].rep, dr[s].pres, dr[s].freq, pid, pcn, pen ? np : 0,
                                      dr[s].stop, dr[s].n_stop};
                    sref_row R;
                    const uint32_t *m_s = on[s] ? mk + (size_t)s * nw : NULL;
                    sref_prepare(&R, lc + (size_t)s * V, V, &sp, m_s, 1e-4);
                    stop_hit += dr[s].n_stop && ids[s] == dr[s].stop[0];
                    lp_bad += lp_device_check(&R, ids[s], dr[s].n_top, &res[s], s);
                    int32_t want = sref_draw(&R, R.k_nom, dr[s].u);
                    int ok = ids[s] >= 0 && ids[s] < V && (!m_s || (m_s[ids[s] >> 5] >> (ids[s] & 31) & 1));
                    if (ok && R.greedy) { /* the argmax, or a near tie of GPU and CPU logits */
                        float bx = 0, bw = 0;
                        for (int q = 0; q < 2; q++) {
                            bx += bid[q] == ids[s] ? bv[q] : 0;
                            bw += bid[q] == want ? bv[q] : 0;
                        }
                        float xi = lc[(size_t)s * V + ids[s]] + bx, xw = lc[(size_t)s * V + want] + bw;
                        ok = ids[s] == want || fabsf(xi - xw) < 1e-4f * (1.0f + fabsf(xw));
                    } else if (ok) {
                        ok = sref_accepts(&R, ids[s], dr[s].u, 1e-4);
                    }
                    if (!ok)
                        printf("sample_finish row %d u %.4f: device %d, reference on the CPU logits %d  <- MISMATCH\n",
                               s, dr[s].u, ids[s], want);
                    bad += !ok;
                    same += ids[s] == want;
                    sref_free(&R);
                }
            }
            /* finish without a start is an error, not a hang */
            assert_int_not_equal(be->sample_finish(be, dr, mk, nw, on, ids, &err), 0);
        }
        for (int s = 0; s < S; s++)
            kv_seq_free(&kv, &sq[s]);
        kv_pool_free(&kv);
    }
    printf("sample_finish on the demo model: %d draws, %d the reference's id on the CPU logits, %d rejected; logprobs: "
           "%d wrong; %d draws of a min_tokens stop id\n",
           S * NU, same, bad, lp_bad, stop_hit);
    free(count);
    free(lc);
    free(mk);
    if (bad || lp_bad || stop_hit)
        fail_msg("%d device draws disagree with the reference, %d logprobs, %d stop ids drawn (above)", bad, lp_bad,
                 stop_hit);
}

static void test_kv_budget(void **state)
{
    (void)state;
    if (!g_gpu)
        skip();
    tern_err err = {0};
    tern_tokenizer *tok = tokenizer_load(repo_path("models/tern-demo"), &err);
    assert_non_null(tok);
    engine_opts o;
    engine_opts_default(&o);
    o.kv_budget_bytes = (size_t)4000 << 30;
    tern_engine *e = engine_new(g_gpu, tok, &o, &err);
    assert_null(e);
    printf("%s\n", err.msg);
    assert_non_null(strstr(err.msg, "does not fit in GPU memory"));
    o.kv_budget_bytes = 0;
    e = engine_new(g_gpu, tok, &o, &err);
    if (!e)
        fail_msg("%s", err.msg);
    engine_stats st;
    engine_stats_get(e, &st);
    printf("default KV: %d blocks, %zu MB\n", st.kv_blocks_total, st.kv_bytes_total >> 20);
    assert_true(st.kv_blocks_total > 2);
    engine_free(e);
    tokenizer_free(tok);
}

/* ---- the engine on the GPU: device-sampled logprobs and min_tokens ---- */

typedef struct eng_out {
    int32_t ids[32];
    sample_result lp[32];
    int n, n_lp;
    engine_finish finish;
} eng_out;

/* Row kinds: greedy, untruncated, truncated, penalized rows with logprobs
 * (3, 5, 20, 0 alternatives); min_tokens rows whose stop id is the argmax
 * (+100 bias): EOS for a greedy row with logprobs, a stop_token_ids entry
 * for a sampled one. */
#define EK 6
static sample_bias g_ebias[1], g_sbias[1];
static int32_t g_estop[1] = {321};
static void eng_kind(int k, engine_params *p)
{
    engine_params_default(p);
    p->max_tokens = 12;
    p->ignore_eos = 1;
    sample_params *sp = &p->sample;
    sp->seed = 700 + (uint64_t)k;
    g_ebias[0].id = model_config_get(g_gpu)->eos_ids[0], g_ebias[0].bias = 100.0f;
    g_sbias[0].id = g_estop[0], g_sbias[0].bias = 100.0f;
    switch (k) {
    case 0: sp->temperature = 0, sp->n_logprobs = 3; break;
    case 1: sp->temperature = 1.0f, sp->n_logprobs = 5; break;
    case 2: sp->temperature = 0.9f, sp->top_k = 40, sp->top_p = 0.8f, sp->min_p = 0.02f, sp->n_logprobs = 20; break;
    case 3:
        sp->temperature = 0.8f, sp->top_k = 30, sp->repetition_penalty = 1.5f, sp->presence_penalty = 0.5f;
        sp->n_logprobs = 0;
        break;
    case 4:
        sp->temperature = 0, sp->bias = g_ebias, sp->n_bias = 1, sp->n_logprobs = 4;
        p->ignore_eos = 0, p->min_tokens = 5;
        break;
    default:
        sp->temperature = 0.7f, sp->top_p = 0.9f, sp->bias = g_sbias, sp->n_bias = 1, sp->n_logprobs = 2;
        p->stop_ids = g_estop, p->n_stop_ids = 1, p->min_tokens = 4;
        break;
    }
}

static void eng_run(tern_engine *e, tern_tokenizer *tok, int k, eng_out *o)
{
    static const char *prompts[] = {"The old lighthouse", "Hello! Who are you?", "Small models are useful"};
    engine_params p;
    eng_kind(k, &p);
    int32_t *ids;
    size_t n;
    tern_err err;
    const char *pr = prompts[k % 3];
    assert_int_equal(tokenizer_encode(tok, pr, strlen(pr), 1, &ids, &n, &err), 0);
    p.prompt = ids;
    p.n_prompt = n;
    engine_req *r = engine_submit(e, &p, NULL, NULL, &err);
    free(ids);
    if (!r)
        fail_msg("%s", err.msg);
    memset(o, 0, sizeof *o);
    engine_event ev;
    while (engine_req_next(r, &ev, -1)) {
        if (ev.kind == ENGINE_EV_TOKEN) {
            if (o->n < 32) {
                if (ev.has_logprob)
                    o->lp[o->n_lp++] = ev.lp;
                o->ids[o->n++] = ev.token;
            }
        } else {
            o->finish = ev.finish;
            engine_event_clear(&ev);
            break;
        }
        engine_event_clear(&ev);
    }
    engine_req_release(r);
}

static void test_engine_device_logprobs(void **state)
{
    (void)state;
    if (!g_gpu)
        skip();
    tern_err err = {0};
    tern_tokenizer *tok = tokenizer_load(repo_path("models/tern-demo"), &err);
    assert_non_null(tok);
    assert_true(model_config_get(g_gpu)->n_eos > 0);
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = 4;
    eng_out host[EK], dev;
    setenv("TERN_GPU_SAMPLING", "0", 1); /* read by engine_new */
    tern_engine *e = engine_new(g_gpu, tok, &o, &err);
    unsetenv("TERN_GPU_SAMPLING");
    if (!e)
        fail_msg("%s", err.msg);
    for (int k = 0; k < EK; k++) /* one at a time: the same GPU logits in both engines */
        eng_run(e, tok, k, &host[k]);
    engine_free(e);
    e = engine_new(g_gpu, tok, &o, &err);
    if (!e)
        fail_msg("%s", err.msg);
    int bad = 0, n_lp = 0;
    for (int k = 0; k < EK; k++) {
        engine_params p;
        eng_kind(k, &p);
        eng_run(e, tok, k, &dev);
        const eng_out *h = &host[k];
        int b = dev.n != h->n || memcmp(dev.ids, h->ids, sizeof(int32_t) * (size_t)dev.n) || dev.finish != h->finish ||
                dev.n_lp != h->n_lp || dev.n_lp != (p.sample.n_logprobs >= 0 ? dev.n : 0);
        if (p.min_tokens > 0) { /* the stop id exactly after min_tokens tokens */
            int32_t stop = k == 4 ? g_ebias[0].id : g_estop[0];
            b |= dev.n != p.min_tokens + 1 || dev.ids[p.min_tokens] != stop || dev.finish != ENGINE_FINISH_STOP;
        }
        for (int i = 0; !b && i < dev.n_lp; i++) {
            const sample_result *x = &dev.lp[i], *y = &h->lp[i];
            b = x->id != dev.ids[i] || x->n_top != y->n_top ||
                !(fabsf(x->logprob - y->logprob) <= 1e-5f * (1 + fabsf(y->logprob)));
            for (int j = 0; !b && j < x->n_top; j++) { /* ids may differ only where the values (nearly) tie */
                float d = fabsf(x->top[j].logprob - y->top[j].logprob), a = 1 + fabsf(y->top[j].logprob);
                b = !(d <= 1e-5f * a) || (x->top[j].id != y->top[j].id && !(d <= 2e-6f * a));
            }
            n_lp++;
        }
        printf("engine on the GPU, kind %d: %d tokens (host sampler %d), %d with logprobs, first logprob %.6f (host "
               "%.6f)%s\n",
               k, dev.n, h->n, dev.n_lp, dev.n_lp ? dev.lp[0].logprob : 0.0f, h->n_lp ? h->lp[0].logprob : 0.0f,
               b ? "  <- MISMATCH" : "");
        bad += b;
    }
    engine_free(e);
    tokenizer_free(tok);
    printf("engine on the GPU: %d kinds, %d tokens' logprobs compared, %d kinds differ from the host sampler\n", EK,
           n_lp, bad);
    if (bad)
        fail_msg("%d row kinds differ between the device sampler and the host's (above)", bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax_kernel),
        cmocka_unit_test(test_sample_kernel),
        cmocka_unit_test(test_fork_copy_on_write),
        cmocka_unit_test(test_device_greedy),
        cmocka_unit_test(test_device_sample_finish),
        cmocka_unit_test(test_kv_budget),
        cmocka_unit_test(test_engine_device_logprobs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
