/* What serving needs from the CUDA backend beyond the forward, on a GPU
 * (skipped without one; label cuda): the masked argmax kernel against a
 * host reference (ties, -inf, NaN, empty masks, a vocabulary that is not a
 * multiple of 32); device greedy sampling (forward_start/argmax_finish) on
 * the demo model against the CPU forward's logits; copy-on-write of a
 * shared, partly filled block reaching the device mirror (a forked
 * sequence continues differently from its parent: logits against the
 * CPU); the engine's KV budget in GPU memory (a budget larger than the GPU
 * is an error; the default fits). */
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
    cudaFree(dx);
    cudaFree(dm);
    cudaFree(don);
    cudaFree(dids);
    free(x);
    free(mk);
#endif
}

static tern_model *g_cpu, *g_gpu;

static int setup(void **state)
{
    (void)state;
    if (!have_gpu())
        return 0;
    tern_err err;
    setenv("TERN_CUDA_GEMM_MIN_T", "1000000", 1); /* GEMV everywhere: f32 accumulation, tight tolerances */
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
    assert_int_equal(kv_pool_init(&kv, m->cfg.n_layer, m->cfg.n_kv_head * m->cfg.head_dim, 16, 16, &err), 0);
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
    size_t n = (size_t)4 * g_cpu->cfg.n_vocab;
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
    model_backend *be = g_gpu->be;
    assert_non_null(be->forward_start);
    assert_non_null(be->argmax_finish);
    tern_err err;
    int32_t V = g_cpu->cfg.n_vocab, nw = (V + 31) / 32;
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
        assert_int_equal(kv_pool_init(&kv, m->cfg.n_layer, m->cfg.n_kv_head * m->cfg.head_dim, 16, 8, &err), 0);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_argmax_kernel),
        cmocka_unit_test(test_fork_copy_on_write),
        cmocka_unit_test(test_device_greedy),
        cmocka_unit_test(test_kv_budget),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
