/* Mixtures of experts on the CUDA backend (src/tensor/cuda/moe.cu,
 * src/model/backend_cuda_moe.c) against the CPU backend on random
 * fixtures: qwen3_moe (with dense and sparse layers mixed, norm_topk on and
 * off), mixtral and gpt_oss (router bias, top-k then softmax, clamped
 * SwiGLU with expert biases, attention sinks, o bias, sliding windows,
 * YaRN; f32, bf16 and MXFP4 experts decoded to bf16 at upload), f32, bf16
 * and 4/8-bit experts - a prompt and greedy
 * steps, logits within the f32-accumulation tolerance and greedy ids equal
 * (the CPU on its exact f32-activation products) - and the batch contract:
 * three sequences decoding in one step give each sequence's logits alone,
 * bit for bit; and experts in pinned host memory behind a cache of a
 * quarter of them give the same bits, with picks counted. Skipped without a GPU; in a build without CUDA the backend's
 * "not built" error stands for it. The HF goldens of the MoE fixtures run
 * on the GPU through model_test_golden (TERN_TEST_DEVICE=cuda). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/rng.h"
#include "model/backend_cuda.h"
#include "model/model_int.h"
#include "test_util.h"

static const char *build_dir(void) { return getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build"; }
static const char *bin(void) { return getenv("TERN_BIN") ? getenv("TERN_BIN") : "build/tern"; }

static void sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

static double rel_err(const float *a, const float *ref, size_t n)
{
    double d = 0.0, r = 0.0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

#include "run_model.h"

/* Three sequences (prompts of 5, 9 and 14 tokens, each prefilled alone),
 * then n_dec decode steps of fixed tokens: one step of three rows
 * (batched) or three steps of one. Logits into out[n_dec][3][V]. */
static void run_three(tern_model *m, int batched, int n_dec, float *out)
{
    tern_err err = {0};
    const int V = model_config_get(m)->n_vocab, len[3] = {5, 9, 14};
    kv_pool kv;
    kv_seq sq[3] = {{0}, {0}, {0}};
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 24, &err), 0);
    float *scratch = malloc((size_t)V * sizeof(float));
    assert_non_null(scratch);
    for (int s = 0; s < 3; s++) {
        int32_t tok[16], pos[16], last = len[s] - 1;
        kv_seq *seqs[16];
        assert_int_equal(kv_seq_reserve(&kv, &sq[s], len[s] + n_dec, &err), 0);
        for (int i = 0; i < len[s]; i++) {
            tok[i] = (int32_t)((i * 7919 + 13 * s + 1) % V);
            pos[i] = i;
            seqs[i] = &sq[s];
        }
        fwd_batch b = {len[s], tok, pos, seqs, 1, &last};
        if (model_forward(m, &kv, &b, scratch, &err))
            fail_msg("%s", err.msg);
    }
    for (int st = 0; st < n_dec; st++) {
        int32_t t3[3], p3[3], rows[3] = {0, 1, 2};
        kv_seq *q3[3];
        for (int s = 0; s < 3; s++) {
            t3[s] = (int32_t)((st * 31 + 17 * s + 5) % V);
            p3[s] = len[s] + st;
            q3[s] = &sq[s];
        }
        float *o = out + (size_t)st * 3 * V;
        if (batched) {
            fwd_batch d = {3, t3, p3, q3, 3, rows};
            if (model_forward(m, &kv, &d, o, &err))
                fail_msg("%s", err.msg);
        } else {
            for (int s = 0; s < 3; s++) {
                int32_t zero = 0;
                fwd_batch d = {1, &t3[s], &p3[s], &q3[s], 1, &zero};
                if (model_forward(m, &kv, &d, o + (size_t)s * V, &err))
                    fail_msg("%s", err.msg);
            }
        }
    }
    free(scratch);
    for (int s = 0; s < 3; s++)
        kv_seq_free(&kv, &sq[s]);
    kv_pool_free(&kv);
}

/* A fixture (make_fixture args), converted to bits (0: as made), on the CPU
 * and the GPU: the prompt's and 12 greedy steps' logits within tol, the
 * ids equal; then three sequences batched against alone on the GPU, bit
 * for bit (the one-sequence GEMV kernels everywhere, as docs/cuda.md says
 * exact invariance needs). */
/* check_moe's first GPU model in the throughput mode (cuBLAS from 33
 * tokens, the tiled prefill attention) rather than with exact products */
static int g_throughput;

static void check_moe(const char *args, int bits, int n_prompt, double tol, int host_too)
{
    char dir[] = "/tmp/tern_cuda_moe_XXXXXX";
    assert_non_null(mkdtemp(dir));
    sh("%s/tools/make_fixture %s --vocab 512 --out %s/m --tokenizer %s >/dev/null", build_dir(), args, dir,
       shared_path("models/stories260K"));
    char mdir[300];
    snprintf(mdir, sizeof mdir, "%s/m", dir);
    if (bits) {
        sh("%s convert %s/m %s/q --bits %d --group-size 32 2>/dev/null", bin(), dir, dir, bits);
        snprintf(mdir, sizeof mdir, "%s/q", dir);
    }
    tern_err err = {0};
    model_load_opts oc = {2, "cpu"}, og = {0, "cuda"};
    tern_kernels_exact_set(1); /* the CPU's f32-activation products: the reference */
    tern_model *mc = model_load_ex(mdir, &oc, &err), *mg = NULL;
    if (g_throughput)
        tern_kernels_exact_set(0);
    if (!mc || !(mg = model_load_ex(mdir, &og, &err)))
        fail_msg("%s: %s", args, err.msg);
    tern_kernels_exact_set(1);
    assert_true(model_config_get(mc)->n_expert > 0);
    const int n_dec = 12, V = model_config_get(mc)->n_vocab;
    int32_t prompt[64], idc[16], idg[16];
    tern_rng r;
    tern_rng_seed(&r, 11, (uint64_t)n_prompt);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(tern_rng_f32(&r) * (V - 1));
    size_t nl = (size_t)(n_dec + 1) * V;
    float *lc = malloc(nl * sizeof(float)), *lg = malloc(nl * sizeof(float));
    assert_true(lc && lg);
    run_model(mc, prompt, n_prompt, n_dec, lc, idc);
    run_model(mg, prompt, n_prompt, n_dec, lg, idg);
    const double e0 = rel_err(lg, lc, (size_t)V);
    const int same = !memcmp(idc, idg, sizeof(int32_t) * n_dec);
    const double ea = same ? rel_err(lg, lc, nl) : e0;
    print_message("moe %s bits %d prompt %d: prefill rel err %.3g, all steps %.3g, greedy ids %s\n", args, bits,
                  n_prompt, e0, ea, same ? "identical" : "differ");
    if (!(e0 <= tol) || !(ea <= tol))
        fail_msg("%s bits %d: logits relative error %g / %g over %g", args, bits, e0, ea, tol);
    if (!same && tol < 1e-3)
        fail_msg("%s bits %d: greedy ids differ from the CPU's on an f32-accumulated path", args, bits);
    model_free(mg);
    tern_kernels_exact_set(0);

    /* --experts-in host with a cache of a quarter of the experts' bytes:
     * the same bits as every expert in device memory (the same kernels over
     * the same bytes, read from host memory or the cache), picks counted */
    if (host_too) {
        const model_config *c = model_config_get(mc);
        size_t one = 0;
        for (int l = 0; l < c->n_layer && !one; l++)
            for (int k = 0; mc->layers[l].experts && k < 3; k++) {
                const model_weight *w = &mc->layers[l].experts[k];
                one += (size_t)w->n_out * w->n_in * (w->qbits ? w->qbits : 8 * (int)tern_dtype_size(w->dtype)) / 8 +
                       (w->qbits ? (size_t)w->n_out * (w->n_in / w->group) * 8 : 0) + 256;
            }
        model_experts_opts_set(MODEL_EXPERTS_HOST, one * c->n_expert * c->n_layer / 4);
        tern_kernels_exact_set(1); /* as the device-memory run above was loaded */
        tern_model *mh = model_load_ex(mdir, &og, &err);
        tern_kernels_exact_set(0);
        model_experts_opts_set(MODEL_EXPERTS_MAPPED, 0);
        if (!mh)
            fail_msg("%s: --experts-in host: %s", args, err.msg);
        float *lh = malloc(nl * sizeof(float));
        int32_t idh[16];
        assert_non_null(lh);
        run_model(mh, prompt, n_prompt, n_dec, lh, idh);
        run_model(mh, prompt, n_prompt, n_dec, lh, idh); /* again: experts cached by the first run */
        model_experts_stats st;
        assert_int_equal(model_experts_stats_get(mh, &st), 0);
        print_message("  experts in host memory, a cache of a quarter: %llu hits, %llu misses, %.3g MB copied in, "
                      "%.3g MB held\n",
                      (unsigned long long)st.hits, (unsigned long long)st.misses, st.streamed_bytes / 1e6,
                      st.resident_bytes / 1e6);
        if (memcmp(lh, lg, nl * sizeof(float)))
            fail_msg("%s: logits with experts in host memory differ from experts in device memory", args);
        if (!(st.hits > 0 && st.misses > 0 && st.resident_bytes > 0 && st.resident_bytes <= st.cache_bytes))
            fail_msg("%s: host-memory expert counters: %llu hits, %llu misses, %zu of %zu bytes held", args,
                     (unsigned long long)st.hits, (unsigned long long)st.misses, st.resident_bytes, st.cache_bytes);
        free(lh);
        model_free(mh);
    }

    /* batched == alone, bit for bit */
    setenv("TERN_CUDA_GEMV", "staged,by-shape,by-shape", 1);
    mg = model_load_ex(mdir, &og, &err);
    unsetenv("TERN_CUDA_GEMV");
    if (!mg)
        fail_msg("%s", err.msg);
    const int nd = 6;
    float *pa = malloc((size_t)nd * 3 * V * sizeof(float)), *pb = malloc((size_t)nd * 3 * V * sizeof(float));
    assert_true(pa && pb);
    run_three(mg, 0, nd, pa);
    run_three(mg, 1, nd, pb);
    for (size_t i = 0; i < (size_t)nd * 3 * V; i++)
        if (pa[i] != pb[i])
            fail_msg("%s bits %d: step %zu row %zu logit %zu batched %.9g, alone %.9g", args, bits, i / (3 * (size_t)V),
                     i / V % 3, i % V, pb[i], pa[i]);
    /* the expert kernels' other forms (tcu_opts.moe: down's weights
     * requested after the wait, 4 down rows a warp, a block a row tile
     * rather than about a wave of blocks, a 4-bit token's experts in three
     * launches rather than one - alone too): the same bits */
    static const char *const variants[] = {"0", "3", "5", "6"};
    float *pv = malloc((size_t)nd * 3 * V * sizeof(float));
    assert_non_null(pv);
    for (int i = 0; i < (int)(sizeof variants / sizeof *variants); i++) {
        setenv("TERN_CUDA_GEMV", "staged,by-shape,by-shape", 1);
        setenv("TERN_CUDA_MOE", variants[i], 1);
        tern_model *mv = model_load_ex(mdir, &og, &err);
        unsetenv("TERN_CUDA_GEMV");
        unsetenv("TERN_CUDA_MOE");
        if (!mv)
            fail_msg("%s", err.msg);
        run_three(mv, 1, nd, pv);
        if (memcmp(pv, pb, (size_t)nd * 3 * V * sizeof(float)))
            fail_msg("%s bits %d: TERN_CUDA_MOE=%s changes the batched logits", args, bits, variants[i]);
        run_three(mv, 0, nd, pv);
        if (memcmp(pv, pb, (size_t)nd * 3 * V * sizeof(float)))
            fail_msg("%s bits %d: TERN_CUDA_MOE=%s changes the logits alone", args, bits, variants[i]);
        model_free(mv);
    }
    free(pv);
    /* and the batched decode against the CPU's */
    float *pc = malloc((size_t)nd * 3 * V * sizeof(float));
    assert_non_null(pc);
    tern_kernels_exact_set(1);
    run_three(mc, 1, nd, pc);
    tern_kernels_exact_set(0);
    const double eb = rel_err(pb, pc, (size_t)nd * 3 * V);
    print_message("  three sequences a step: batched == alone bitwise (down kernel forms alike), rel err vs CPU %.3g\n",
                  eb);
    if (!(eb <= tol))
        fail_msg("%s bits %d: batched decode relative error %g over %g", args, bits, eb, tol);
    free(pa);
    free(pb);
    free(pc);
    free(lc);
    free(lg);
    model_free(mc);
    model_free(mg);
    sh("rm -rf %s", dir);
}

static void test_moe_forward(void **state)
{
    (void)state;
    if (model_cuda_device_count() <= 0) {
        tern_err err = {0};
        model_backend *b = model_backend_cuda_new(NULL, 0, &err);
        assert_null(b);
        assert_int_not_equal(err.code, 0);
        skip();
    }
    const char *q = "--family qwen3_moe --dim 256 --layers 3 --heads 8 --kv-heads 2 --head-dim 32 --ff 384 "
                    "--experts 16 --top-k 4 --moe-ff 128 --norm-topk 1 --seed 41";
    char qb[400];
    snprintf(qb, sizeof qb, "%s --dtype bf16", q);
    check_moe(q, 0, 20, 2e-5, 0);  /* f32 */
    check_moe(qb, 0, 20, 2e-5, 1); /* bf16 */
    check_moe(qb, 4, 20, 2e-5, 1);
    check_moe(qb, 8, 20, 2e-5, 0);
    /* dense and sparse layers mixed, no renormalization, 6 of 24 experts */
    check_moe("--family qwen3_moe --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --ff 192 --experts 24 "
              "--top-k 6 --moe-ff 96 --norm-topk 0 --sparse-step 2 --mlp-only 2 --seed 42 --dtype bf16",
              0, 20, 2e-5, 0);
    /* mixtral: 4 experts, 2 a token - more than a pass of 8 tokens an expert in the prompt */
    check_moe("--family mixtral --dim 256 --layers 2 --heads 8 --kv-heads 2 --ff 256 --experts 4 --top-k 2 "
              "--seed 43 --dtype bf16",
              0, 24, 2e-5, 0);
    /* a prompt through cuBLAS for the dense products (bf16-rounded activations) */
    check_moe(qb, 0, 48, 2e-2, 0);
}

/* gpt_oss (tests/golden/manifest.json's fixture, 512 tokens): 20 prompt
 * tokens and 12 steps cross the sliding window (16) and take several
 * attention splits a decode step; f32, bf16 and MXFP4 experts (TCU_MX4:
 * the codes and scale bytes as stored, the same values as the CPU's, so the
 * same tolerance); a 48-token prompt in the throughput mode through cuBLAS
 * and the tiled prefill attention with sinks (the bf16 envelope); MXFP4
 * experts in host memory behind a device cache (the same bits; plain
 * gpt_oss experts are transposed at load, so the CPU refuses host);
 * `tern convert --bits 8|4` folders (mlx-lm's layout) from bf16 and MXFP4. */
static void test_gpt_oss(void **state)
{
    (void)state;
    if (model_cuda_device_count() <= 0)
        skip();
    const char *g = "--family gpt_oss --dim 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 "
                    "--top-k 4 --moe-ff 64 --sliding-window 16 --seed 31";
    char gb[400], gm[400];
    snprintf(gb, sizeof gb, "%s --dtype bf16", g);
    snprintf(gm, sizeof gm, "%s --dtype bf16 --mxfp4 1", g);
    check_moe(g, 0, 20, 2e-5, 0);
    check_moe(gb, 0, 20, 2e-5, 0);
    check_moe(gm, 0, 20, 2e-5, 1); /* and --experts-in host */
    /* tern convert --bits: mlx-lm's layout (separate gate / up / down, MLX affine), the other families' kernels */
    check_moe(gb, 8, 20, 2e-5, 1);
    check_moe(gb, 4, 20, 2e-5, 0);
    check_moe(gm, 8, 20, 2e-5, 0);
    /* wider: 8 heads of 64 over 2 kv heads, 32 experts, 4 a token */
    check_moe("--family gpt_oss --dim 256 --layers 2 --heads 8 --kv-heads 2 --head-dim 64 --experts 32 --top-k 4 "
              "--moe-ff 128 --sliding-window 8 --seed 33 --dtype bf16 --mxfp4 1",
              0, 20, 2e-5, 0);
    /* expert rows past the short-row down kernel (1088 > 1024 bf16): moe_down_kernel's sum with the biases */
    check_moe("--family gpt_oss --dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 --top-k 4 "
              "--moe-ff 1088 --sliding-window 16 --seed 35 --dtype bf16",
              0, 20, 2e-5, 0);
    check_moe("--family gpt_oss --dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 --top-k 4 "
              "--moe-ff 1088 --sliding-window 16 --seed 36 --dtype bf16 --mxfp4 1",
              0, 20, 2e-5, 0);
    g_throughput = 1;
    check_moe(gb, 0, 48, 2e-2, 0);
    check_moe(gm, 0, 48, 2e-2, 0);
    g_throughput = 0;
}

/* An argument: only the tests whose names match it (cmocka's pattern). */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_forward),
        cmocka_unit_test(test_gpt_oss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
