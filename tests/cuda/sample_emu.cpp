// tcu_sample_rows' kernel source run on the CPU (tests/cuda/emu/cuda_runtime.h
// stands in for CUDA) against the double-precision reference of
// tests/sample_ref.h: random rows (logits on a 1/64 grid with ties, 8-valued
// rows with huge tie groups, NaNs; -inf, masks, repeated-id biases) under 15
// parameter sets and a grid of u; each id must be the reference's inverse CDF
// at u (u within 2e-6 of a boundary aside), the same for two block sizes;
// most rows also ask for logprobs (0-20 alternatives: ids equal to
// sref_logprobs', values within 1e-5), some cases mask a min_tokens stop set
// holding the row's argmax (never drawn); and a batch mixing every case
// equals each row launched alone, ids and logprobs bit for bit.
// Built and run by sample_emu.sh (ctest cuda.sample_emu), which feeds it the
// kernels of src/tensor/cuda/sample.cu (everything before the launchers) as
// sample_body.inc. Exit 0 = all accepted.
#include <cuda_runtime.h>
thread_local emu_dim threadIdx, blockIdx;
emu_dim blockDim;
pthread_barrier_t emu_bar;
#include "sample_body.inc"
extern "C" {
#include "base/rng.h"
#include "sample_ref.h"
#include "cuda/sample_pen.h"
#include "cuda/sample_lp.h"
}

struct emu_launch {
    float *lg;
    int rows, V;
    const tcu_sample_param *P;
    const int32_t *bi;
    const float *bv;
    const int32_t *pi, *pc, *si;
    const uint32_t *mk;
    int nw;
    const int32_t *on;
    int32_t *ids;
    tcu_sample_lp *lp;
};
struct emu_thread {
    int tid;
    const emu_launch *L;
};

static void *emu_run(void *arg)
{
    const emu_thread *t = (const emu_thread *)arg;
    const emu_launch *L = t->L;
    threadIdx.x = t->tid;
    for (int r = 0; r < L->rows; r++) { // the block's rows one after another
        blockIdx.x = r;
        sample_rows_kernel(L->lg, L->V, L->P, L->bi, L->bv, L->pi, L->pc, L->si, L->mk, L->nw, L->on, L->ids,
                           L->lp);
        pthread_barrier_wait(&emu_bar);
    }
    return nullptr;
}

static void launch(int nt, const emu_launch &L)
{
    blockDim.x = nt;
    pthread_barrier_init(&emu_bar, nullptr, nt);
    pthread_t th[1024];
    emu_thread a[1024];
    for (int t = 0; t < nt; t++) {
        a[t] = {t, &L};
        pthread_create(&th[t], nullptr, emu_run, &a[t]);
    }
    for (int t = 0; t < nt; t++)
        pthread_join(th[t], nullptr);
    pthread_barrier_destroy(&emu_bar);
}

struct skcase {
    float t, top_p, min_p;
    int top_k, n_bias, masked, pen, sup;
};
static const skcase cases[] = {
    {1.0f, 1.0f, 0, 0, 0, 0, 0},   {0.7f, 0.9f, 0, 0, 0, 0, 0},      {1.0f, 1.0f, 0, 40, 0, 0, 0},
    {1.3f, 0.95f, 0.05f, 50, 0, 1, 0}, {0.5f, 1.0f, 0.1f, 0, 3, 0, 0}, {2.0f, 0.5f, 0, 7, 2, 1, 0},
    {1.0f, 0.3f, 0, 0, 0, 1, 0},   {0.9f, 1.0f, 0.9f, 0, 0, 0, 0},   {1.0f, 1.0f, 0, 1, 0, 0, 0},
    {1.0f, 1.0f, 0, 3, 0, 1, 0},   {3.0f, 0.99f, 0, 1000000, 1, 0, 0}, {1.0f, 1.0f, 0, 0, 2, 1, 0},
    {0.35f, 0.8f, 0.01f, 100, 1, 1, 0}, {0.0f, 1.0f, 0, 0, 2, 1, 0}, {0.0f, 1.0f, 0, 0, 0, 0, 0},
    {0.8f, 0.9f, 0, 40, 1, 1, 1},   {0.0f, 1.0f, 0, 0, 0, 0, 1}, /* penalties */
    {0.0f, 1.0f, 0, 0, 0, 0, 0, 1}, {1.0f, 1.0f, 0, 0, 0, 1, 0, 1}, {0.7f, 0.9f, 0, 40, 1, 0, 1, 1}, /* min_tokens */
};


int main(int argc, char **argv)
{
    const int V = argc > 1 ? atoi(argv[1]) : 1000, NU = argc > 2 ? atoi(argv[2]) : 8, NW = (V + 31) / 32;
    const int NC = sizeof cases / sizeof cases[0];
    tern_rng rng;
    tern_rng_seed(&rng, 11, 2);
    float *base = (float *)malloc(sizeof(float) * V), *lg = (float *)malloc(sizeof(float) * V * NU);
    uint32_t *mk = (uint32_t *)malloc(4 * (size_t)NW), *mks = (uint32_t *)malloc(4 * (size_t)NW * NU);
    tcu_sample_param *P = (tcu_sample_param *)malloc(sizeof *P * NU);
    int32_t *on = (int32_t *)malloc(4 * (size_t)NU), *ids = (int32_t *)malloc(4 * (size_t)NU),
            *ids2 = (int32_t *)malloc(4 * (size_t)NU);
    tcu_sample_lp *lps = (tcu_sample_lp *)calloc(NU, sizeof *lps), *lps2 = (tcu_sample_lp *)calloc(NU, sizeof *lps);
    double *us = (double *)malloc(sizeof *us * NU);
    int bad = 0, total = 0, exact = 0, n_lp = 0, lp_bad = 0, sup_hit = 0;
    // the mixed batch: row c takes case c's logits, parameters and lists
    float *mix_lg = (float *)malloc(sizeof(float) * V * NC), *mix_run = (float *)malloc(sizeof(float) * V * NC);
    uint32_t *mix_mk = (uint32_t *)malloc(4 * (size_t)NW * NC);
    tcu_sample_param *mix_P = (tcu_sample_param *)malloc(sizeof *mix_P * NC);
    int32_t *mix_on = (int32_t *)malloc(4 * (size_t)NC), mix_bi[4 * 32], mix_pi[SK_NPEN * 32], mix_pc[SK_NPEN * 32],
            mix_si[SK_NSUP * 32];
    float mix_bv[4 * 32];
    if (NC > 32)
        abort();
    for (int variant = 0; variant < 3; variant++)
        for (int c = 0; c < NC; c++) {
            const skcase *k = &cases[c];
            for (int i = 0; i < V; i++)
                base[i] = variant == 1 ? (float)(tern_rng_u32(&rng) % 8) / 4.0f
                                       : (float)((int)(tern_rng_u32(&rng) % 1536) - 768) / 64.0f;
            for (int i = c % 7; i < V; i += 7)
                base[i] = -INFINITY;
            if (variant == 2)
                for (int i = 3; i < V; i += 101)
                    base[i] = NAN;
            for (int w = 0; w < NW; w++)
                mk[w] = tern_rng_u32(&rng) | tern_rng_u32(&rng);
            int32_t bid[4];
            float bvl[4];
            for (int b = 0; b < k->n_bias; b++) {
                bid[b] = (int32_t)(tern_rng_u32(&rng) % (uint32_t)V);
                bvl[b] = (float)((int)(tern_rng_u32(&rng) % 400) - 100) / 16.0f;
            }
            if (k->n_bias >= 2)
                bid[1] = bid[0];
            int32_t pid[SK_NPEN], pcn[SK_NPEN], sup[SK_NSUP];
            sk_penalties(V, base, &rng, pid, pcn);
            sk_stops(V, base, sup);
            const int nsup = k->sup ? SK_NSUP : 0;
            sref_params sp = {k->t, k->top_p, k->min_p, k->top_k, bid, bvl, k->n_bias,
                              k->pen, SK_REP, SK_PRES, SK_FREQ, pid, pcn, k->pen ? SK_NPEN : 0, sup, nsup};
            sref_row R;
            sref_prepare(&R, base, V, &sp, k->masked ? mk : nullptr, 2e-6);
            for (int j = 0; j < NU; j++) {
                us[j] = j == 0 ? 0.0 : j == 1 ? 1.0 - 0x1p-53 : (j - 2 + tern_rng_f64(&rng)) / (NU - 2);
                P[j] = {us[j], k->t, k->top_p, k->min_p, k->top_k, 0, k->n_bias,
                        SK_REP, SK_PRES, SK_FREQ, 0, k->pen ? SK_NPEN : 0, k->pen,
                        0, nsup, sk_lp(j), sk_ntop(j, c), j};
                on[j] = k->masked;
            }
            if (variant == 0) { // the mixed batch's row c
                memcpy(mix_lg + (size_t)c * V, base, sizeof(float) * V);
                memcpy(mix_mk + (size_t)c * NW, mk, 4 * (size_t)NW);
                memcpy(mix_bi + 4 * c, bid, sizeof bid);
                memcpy(mix_bv + 4 * c, bvl, sizeof bvl);
                memcpy(mix_pi + SK_NPEN * c, pid, sizeof pid);
                memcpy(mix_pc + SK_NPEN * c, pcn, sizeof pcn);
                memcpy(mix_si + SK_NSUP * c, sup, sizeof sup);
                mix_P[c] = P[c % NU];
                mix_P[c].u = 0.37 + 0.01 * c;
                mix_P[c].bias_off = 4 * c;
                mix_P[c].pen_off = SK_NPEN * c;
                mix_P[c].sup_off = SK_NSUP * c;
                mix_P[c].lp = c % 3 != 1;
                mix_P[c].lp_slot = c;
                mix_on[c] = k->masked;
            }
            for (int pass = 0; pass < 2; pass++) { // block sizes 32 and 64: the same ids
                for (int j = 0; j < NU; j++) {
                    memcpy(lg + (size_t)j * V, base, sizeof(float) * V);
                    memcpy(mks + (size_t)j * NW, mk, 4 * (size_t)NW);
                }
                emu_launch L = {lg, NU, V, P, bid, bvl, pid, pcn, sup, mks, NW, on, pass ? ids2 : ids,
                                pass ? lps2 : lps};
                launch(pass ? 64 : 32, L);
            }
            for (int j = 0; j < NU; j++) {
                total++;
                int32_t want = sref_draw(&R, R.k_nom, us[j]);
                exact += ids[j] == want;
                for (int q = 0; q < nsup; q++)
                    sup_hit += ids[j] == sup[q];
                if (sk_lp(j) && ids[j] >= 0) {
                    char what[96];
                    snprintf(what, sizeof what, "variant %d case %d row %d", variant, c, j);
                    n_lp++;
                    int lb = sk_lp_check(&R, ids[j], sk_ntop(j, c), &lps[j], 1e-5, what);
                    if (!lb && ids2[j] == ids[j] && memcmp(&lps[j], &lps2[j], sizeof lps[j])) {
                        printf("%s: logprobs differ between 32 and 64 threads\n", what);
                        lb = 1;
                    }
                    lp_bad += lb;
                }
                if (ids[j] == ids2[j] && sref_accepts(&R, ids[j], us[j], 2e-6))
                    continue;
                if (bad++ < 12)
                    printf("variant %d case %d (T %.2f top_k %d top_p %.2f min_p %.2f bias %d mask %d) u %.17g: "
                           "kernel %d / %d (32 / 64 threads), reference %d; kept %d (%d..%d) of %d\n",
                           variant, c, k->t, k->top_k, k->top_p, k->min_p, k->n_bias, k->masked, us[j], ids[j],
                           ids2[j], want, R.k_nom, R.k_lo, R.k_hi, R.n);
            }
            sref_free(&R);
        }
    printf("sampling kernel on the CPU, V %d: %d draws, %d the reference's exact inverse CDF, %d rejected\n", V, total,
           exact, bad);
    printf("logprobs on the CPU, V %d: %d rows checked against the double reference, %d wrong; %d draws of a "
           "min_tokens stop id\n", V, n_lp, lp_bad, sup_hit);
    // every case in one launch against each row alone (64 threads)
    int mix_bad = 0;
    {
        int32_t mids[32], aid[1];
        tcu_sample_lp mlp[32], alp[1];
        memset(mlp, 0, sizeof mlp);
        memcpy(mix_run, mix_lg, sizeof(float) * V * NC);
        emu_launch L = {mix_run, NC, V, mix_P, mix_bi, mix_bv, mix_pi, mix_pc, mix_si, mix_mk, NW, mix_on, mids, mlp};
        launch(64, L);
        for (int c = 0; c < NC; c++) {
            tcu_sample_param one = mix_P[c];
            one.lp_slot = 0;
            memset(alp, 0, sizeof alp);
            memcpy(mix_run, mix_lg + (size_t)c * V, sizeof(float) * V);
            emu_launch A = {mix_run, 1, V, &one, mix_bi, mix_bv, mix_pi, mix_pc, mix_si, mix_mk + (size_t)c * NW, NW,
                            mix_on + c, aid, alp};
            launch(64, A);
            if (aid[0] != mids[c] || (one.lp && memcmp(&alp[0], &mlp[c], sizeof alp[0]))) {
                printf("mixed batch row %d: id %d alone, %d in the batch (or its logprobs differ)\n", c, aid[0],
                       mids[c]);
                mix_bad++;
            }
        }
        printf("mixed batch of %d rows (%d with logprobs): %d differ from the row alone\n", NC,
               NC - NC / 3, mix_bad);
    }
    free(mix_lg);
    free(mix_run);
    free(mix_mk);
    free(mix_P);
    free(mix_on);
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
    return bad != 0 || lp_bad != 0 || sup_hit != 0 || mix_bad != 0;
}
