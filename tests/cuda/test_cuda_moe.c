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
 * quarter of them give the same bits, with picks counted; the throughput
 * mode's tensor-core expert GEMM (moe_tc.cu) one layer at a time against
 * a double reference (fragment mapping, bf16 / 4-bit / MXFP4, T 2-300, a
 * token alone == in the batch bitwise) and in whole models against the
 * CPU. Skipped without a GPU; in a build without CUDA the backend's
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
#include "tensor/kernels.h"
#include "test_util.h"
#ifdef TERN_CUDA
#include <cuda_runtime.h>

#include "tensor/cuda/cuda_moe.h"
#endif

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

    /* batched == alone, bit for bit - the warp kernels at every step (13:
     * the default without TCU_MOE_TC, whose steps of 2+ tokens would meet
     * the warp kernels' one-token steps; check_moe_tc tests its own) */
    setenv("TERN_CUDA_GEMV", "staged,by-shape,by-shape", 1);
    setenv("TERN_CUDA_MOE", "13", 1);
    mg = model_load_ex(mdir, &og, &err);
    unsetenv("TERN_CUDA_GEMV");
    unsetenv("TERN_CUDA_MOE");
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

#ifdef TERN_CUDA
/* The tensor-core expert GEMM in a whole model: TERN_CUDA_MOE 61 (the
 * defaults plus TCU_MOE_TC_ALL: every step, decode steps too, takes it) in
 * the throughput mode against the CPU's exact products - a 48-token prompt
 * and 12 greedy steps within the bf16 envelope - and three sequences
 * decoding batched == alone, bit for bit (the one-sequence GEMVs for the
 * dense products). */
static void check_moe_tc(const char *args, int bits, double tol)
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
    tern_kernels_exact_set(1);
    tern_model *mc = model_load_ex(mdir, &oc, &err), *mg = NULL;
    tern_kernels_exact_set(0);
    setenv("TERN_CUDA_MOE", "61", 1);
    setenv("TERN_CUDA_GEMV", "staged,by-shape,by-shape", 1);
    if (mc)
        mg = model_load_ex(mdir, &og, &err);
    unsetenv("TERN_CUDA_MOE");
    unsetenv("TERN_CUDA_GEMV");
    if (!mc || !mg)
        fail_msg("%s: %s", args, err.msg);
    tern_kernels_exact_set(1);
    const int n_dec = 12, n_prompt = 48, V = model_config_get(mc)->n_vocab;
    int32_t prompt[64], idc[16], idg[16];
    tern_rng r;
    tern_rng_seed(&r, 11, (uint64_t)n_prompt);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(tern_rng_f32(&r) * (V - 1));
    const size_t nl = (size_t)(n_dec + 1) * V;
    float *lc = malloc(nl * sizeof(float)), *lg = malloc(nl * sizeof(float));
    assert_true(lc && lg);
    run_model(mc, prompt, n_prompt, n_dec, lc, idc);
    run_model(mg, prompt, n_prompt, n_dec, lg, idg);
    tern_kernels_exact_set(0);
    const double e0 = rel_err(lg, lc, (size_t)V), ea = rel_err(lg, lc, nl);
    const int same = !memcmp(idc, idg, sizeof(int32_t) * n_dec);
    print_message("moe tc %s bits %d prompt %d: prefill rel err %.3g, all steps %.3g, greedy ids %s\n", args, bits,
                  n_prompt, e0, ea, same ? "identical" : "differ");
    if (!(e0 <= tol) || (same && !(ea <= tol)))
        fail_msg("%s bits %d: tensor-core experts: logits relative error %g / %g over %g", args, bits, e0, ea, tol);
    const int nd = 6;
    float *pa = malloc((size_t)nd * 3 * V * sizeof(float)), *pb = malloc((size_t)nd * 3 * V * sizeof(float));
    assert_true(pa && pb);
    run_three(mg, 0, nd, pa);
    run_three(mg, 1, nd, pb);
    for (size_t i = 0; i < (size_t)nd * 3 * V; i++)
        if (pa[i] != pb[i])
            fail_msg("%s bits %d: tensor-core experts: step %zu row %zu logit %zu batched %.9g, alone %.9g", args,
                     bits, i / (3 * (size_t)V), i / V % 3, i % V, pb[i], pa[i]);
    print_message("  three sequences a step: batched == alone bitwise\n");
    free(pa);
    free(pb);
    free(lc);
    free(lg);
    model_free(mc);
    model_free(mg);
    sh("rm -rf %s", dir);
}
#endif

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

#ifdef TERN_CUDA
/* ---- the tensor-core grouped expert GEMM (moe_tc.cu), one layer through
 * tcu_moe: gate/up's bf16 activations against a double reference from the
 * same bf16-rounded normed activations, the layer's output against a
 * double reference from the kernel's own h, and each token alone == its
 * row in the batch, bit for bit ---- */

#define TC_CU(x)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess)                                                                                         \
            fail_msg("%s: %s", #x, cudaGetErrorString(e_));                                                           \
    } while (0)

static uint16_t tc_bf16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static double tc_bf16_d(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    int kind, E, K, dim, ff, group, gpt_oss, onehot;
} tc_case;

/* One expert matrix [n_out][n_in] of kind c->kind: its stored bytes and
 * scales (device copies in *dw, *dsb) and its values as doubles (v). */
static void tc_matrix(const tc_case *c, int n_out, int n_in, int which, int e, tern_rng *r, float *v, void **dw,
                      void **dsb)
{
    size_t nb = 0, ns = 0;
    uint8_t *w = NULL, *sb = NULL;
    if (c->kind == TCU_BF16) {
        nb = (size_t)n_out * n_in * 2;
        w = malloc(nb);
        assert_non_null(w);
        uint16_t *h = (uint16_t *)w;
        for (int o = 0; o < n_out; o++)
            for (int i = 0; i < n_in; i++) {
                float f = (tern_rng_f32(r) * 2.0f - 1.0f) * 0.08f;
                if (c->onehot) /* row o reads input (o * (2 which + 1) + e) % n_in alone */
                    f = i == (o * (2 * which + 1) + e) % n_in ? (which == 1 ? 0.5f : 1.0f) : 0.0f;
                h[(size_t)o * n_in + i] = tc_bf16_rn(f);
                v[(size_t)o * n_in + i] = (float)tc_bf16_d(h[(size_t)o * n_in + i]);
            }
    } else {
        nb = (size_t)n_out * n_in / 2;
        w = calloc(nb, 1);
        const int gs = c->kind == TCU_MX4 ? 32 : c->group;
        const int ng = n_in / gs;
        ns = c->kind == TCU_MX4 ? (size_t)n_out * ng : (size_t)n_out * ng * 2 * sizeof(float);
        sb = malloc(ns);
        assert_true(w && sb);
        for (int o = 0; o < n_out; o++)
            for (int gi = 0; gi < ng; gi++) {
                double sc, bi = 0.0;
                if (c->kind == TCU_MX4) {
                    const unsigned ex = 118u + (unsigned)(tern_rng_f32(r) * 6.0f); /* 2^-9 .. 2^-4 */
                    sb[(size_t)o * ng + gi] = (uint8_t)ex;
                    sc = ldexp(1.0, (int)ex - 127);
                } else {
                    float *p = (float *)sb + ((size_t)o * ng + gi) * 2;
                    p[0] = 0.004f + 0.01f * tern_rng_f32(r);
                    p[1] = -0.03f + 0.01f * tern_rng_f32(r);
                    sc = p[0], bi = p[1];
                }
                for (int i = gi * gs; i < (gi + 1) * gs; i++) {
                    const unsigned code = (unsigned)(tern_rng_f32(r) * 16.0f) & 15u;
                    w[((size_t)o * n_in + i) / 2] |= (uint8_t)(code << (4 * (i & 1)));
                    v[(size_t)o * n_in + i] = (float)(c->kind == TCU_MX4 ? 0.5 * tern_mx_v2(code) * sc
                                                                         : sc * code + bi);
                }
            }
    }
    TC_CU(cudaMalloc(dw, nb));
    TC_CU(cudaMemcpy(*dw, w, nb, cudaMemcpyHostToDevice));
    *dsb = NULL;
    if (sb) {
        TC_CU(cudaMalloc(dsb, ns));
        TC_CU(cudaMemcpy(*dsb, sb, ns, cudaMemcpyHostToDevice));
    }
    free(w);
    free(sb);
}

static double tc_act(const tc_case *c, const float *bg, const float *bu, double g, double u)
{
    if (c->gpt_oss) {
        const double lim = 7.0;
        g += *bg, u += *bu;
        g = g > lim ? lim : g;
        u = u > lim ? lim : u < -lim ? -lim : u;
        return (u + 1.0) * g / (1.0 + exp(-1.702 * g));
    }
    return g / (1.0 + exp(-g)) * u;
}

/* The layer's device state for one case (experts, router, scratch for maxT). */
typedef struct {
    tcu_experts ex;
    tcu_moe_scratch s;
    void *dev[3 * TCU_MOE_MAX_EXPERTS * 2 + 16];
    int n_dev;
    float *wv[3]; /* values: gate, up [E][ff][dim], down [E][dim][ff] (MLX: scale q + bias rounded to f32) */
    float *bg, *bu, *bd;
    float *x, *xn, *ng; /* device: [maxT][dim], [maxT][dim], [dim] */
} tc_layer;

static void *tc_dev(tc_layer *L, size_t bytes)
{
    void *p = NULL;
    TC_CU(cudaMalloc(&p, bytes ? bytes : 4));
    TC_CU(cudaMemset(p, 0, bytes ? bytes : 4));
    L->dev[L->n_dev++] = p;
    return p;
}

static void tc_layer_init(tc_layer *L, const tc_case *c, int maxT, uint64_t seed)
{
    memset(L, 0, sizeof *L);
    tern_rng r;
    tern_rng_seed(&r, seed, 7);
    const int E = c->E, D = c->dim, F = c->ff;
    const void **tab = calloc((size_t)E * 6, sizeof(void *));
    assert_non_null(tab);
    for (int m = 0; m < 3; m++) {
        L->wv[m] = malloc((size_t)E * F * D * sizeof(float));
        assert_non_null(L->wv[m]);
    }
    for (int e = 0; e < E; e++)
        for (int m = 0; m < 3; m++) {
            void *dw, *dsb;
            tc_matrix(c, m < 2 ? F : D, m < 2 ? D : F, m, e, &r, L->wv[m] + (size_t)e * F * D, &dw, &dsb);
            L->dev[L->n_dev++] = dw;
            if (dsb)
                L->dev[L->n_dev++] = dsb;
            tab[e * 6 + m] = dw;
            tab[e * 6 + 3 + m] = dsb;
        }
    void *dtab = tc_dev(L, (size_t)E * 6 * sizeof(void *));
    TC_CU(cudaMemcpy(dtab, tab, (size_t)E * 6 * sizeof(void *), cudaMemcpyHostToDevice));
    free(tab);
    uint16_t *rw = malloc((size_t)E * D * 2);
    float *hg = malloc((size_t)D * sizeof(float));
    assert_true(rw && hg);
    for (size_t i = 0; i < (size_t)E * D; i++)
        rw[i] = tc_bf16_rn((tern_rng_f32(&r) * 2.0f - 1.0f) * 0.1f);
    void *drw = tc_dev(L, (size_t)E * D * 2);
    TC_CU(cudaMemcpy(drw, rw, (size_t)E * D * 2, cudaMemcpyHostToDevice));
    for (int i = 0; i < D; i++)
        hg[i] = 0.8f + 0.4f * tern_rng_f32(&r);
    L->ng = tc_dev(L, (size_t)D * sizeof(float));
    TC_CU(cudaMemcpy(L->ng, hg, (size_t)D * sizeof(float), cudaMemcpyHostToDevice));
    free(rw);
    free(hg);
    tcu_experts *ex = &L->ex;
    ex->router.w = drw;
    ex->router.n_out = E;
    ex->router.kind = TCU_BF16;
    ex->tab = dtab;
    ex->kind = c->kind;
    ex->group = c->kind == TCU_MX4 ? 32 : c->kind == TCU_Q4 ? c->group : 0;
    ex->n_expert = E, ex->n_used = c->K, ex->dim = D, ex->ff = F, ex->norm_topk = 1;
    if (c->gpt_oss) {
        L->bg = malloc((size_t)E * F * sizeof(float));
        L->bu = malloc((size_t)E * F * sizeof(float));
        L->bd = malloc((size_t)E * D * sizeof(float));
        float *rb = malloc((size_t)E * sizeof(float));
        assert_true(L->bg && L->bu && L->bd && rb);
        for (size_t i = 0; i < (size_t)E * F; i++)
            L->bg[i] = 0.2f * (tern_rng_f32(&r) - 0.5f), L->bu[i] = 0.2f * (tern_rng_f32(&r) - 0.5f);
        for (size_t i = 0; i < (size_t)E * D; i++)
            L->bd[i] = 0.2f * (tern_rng_f32(&r) - 0.5f);
        for (int i = 0; i < E; i++)
            rb[i] = 0.1f * (tern_rng_f32(&r) - 0.5f);
        float *d[4];
        const float *h[4] = {L->bg, L->bu, L->bd, rb};
        const size_t n[4] = {(size_t)E * F, (size_t)E * F, (size_t)E * D, (size_t)E};
        for (int i = 0; i < 4; i++) {
            d[i] = tc_dev(L, n[i] * sizeof(float));
            TC_CU(cudaMemcpy(d[i], h[i], n[i] * sizeof(float), cudaMemcpyHostToDevice));
        }
        free(rb);
        ex->b_gate = d[0], ex->b_up = d[1], ex->b_down = d[2], ex->router_b = d[3];
        ex->topk_softmax = 1, ex->swiglu_clamp = 1, ex->swiglu_limit = 7.0f, ex->swiglu_alpha = 1.702f;
    }
    const size_t TK = (size_t)maxT * c->K;
    L->s.rl = tc_dev(L, (size_t)maxT * E * sizeof(float));
    L->s.wt = tc_dev(L, TK * sizeof(float));
    L->s.sel = tc_dev(L, TK * sizeof(int32_t));
    L->s.meta = tc_dev(L, tcu_moe_meta_len(E, c->K, maxT) * sizeof(int32_t));
    L->s.h = tc_dev(L, TK * F * sizeof(float));
    L->s.y = tc_dev(L, TK * D * sizeof(float));
    L->s.cnt = tc_dev(L, tcu_moe_cnt_len(D, E) * sizeof(int32_t));
    L->x = tc_dev(L, (size_t)maxT * D * sizeof(float));
    L->xn = tc_dev(L, (size_t)maxT * D * sizeof(float));
}

static void tc_layer_free(tc_layer *L)
{
    for (int i = 0; i < L->n_dev; i++)
        cudaFree(L->dev[i]);
    for (int m = 0; m < 3; m++)
        free(L->wv[m]);
    free(L->bg);
    free(L->bu);
    free(L->bd);
}

/* x[T][dim] (host) through the layer with tcu_opts.moe = moe: out (host). */
static void tc_run(tc_layer *L, const float *x, int T, int moe, float *out)
{
    tcu_opts op;
    tcu_opts_init(&op);
    op.exact = 0;
    op.moe = moe;
    const size_t n = (size_t)T * L->ex.dim * sizeof(float);
    TC_CU(cudaMemcpy(L->x, x, n, cudaMemcpyHostToDevice));
    const int rc = tcu_moe(&L->ex, &L->s, L->x, L->ng, 1e-6f, L->xn, T, &op, NULL);
    if (rc)
        fail_msg("tcu_moe: %s", cudaGetErrorString((cudaError_t)rc));
    TC_CU(cudaDeviceSynchronize());
    TC_CU(cudaMemcpy(out, L->x, n, cudaMemcpyDeviceToHost));
}

static void tc_check(const tc_case *c, const int *Ts, int nT)
{
    int maxT = 0;
    for (int i = 0; i < nT; i++)
        maxT = Ts[i] > maxT ? Ts[i] : maxT;
    tc_layer L;
    tc_layer_init(&L, c, maxT, (uint64_t)(c->E * 131 + c->dim * 7 + c->ff + c->kind * 1000 + c->K));
    const int D = c->dim, F = c->ff, K = c->K;
    const int moe = TCU_MOE_DOWN_EARLY | TCU_MOE_WAVES | TCU_MOE_TC | TCU_MOE_TC_ALL;
    const char *kn = c->kind == TCU_BF16 ? "bf16" : c->kind == TCU_Q4 ? "q4" : "mxfp4";
    for (int ti = 0; ti < nT; ti++) {
        const int T = Ts[ti];
        tern_rng r;
        tern_rng_seed(&r, 99, (uint64_t)T);
        float *x0 = malloc((size_t)T * D * sizeof(float)), *xo = malloc((size_t)T * D * sizeof(float));
        float *xn = malloc((size_t)T * D * sizeof(float)), *wt = malloc((size_t)T * K * sizeof(float));
        float *x1 = malloc((size_t)D * sizeof(float));
        int32_t *sel = malloc((size_t)T * K * sizeof(int32_t));
        uint16_t *h = malloc((size_t)T * K * F * 2);
        double *xb = malloc((size_t)D * sizeof(double));
        assert_true(x0 && xo && xn && wt && x1 && sel && h && xb);
        for (size_t i = 0; i < (size_t)T * D; i++)
            x0[i] = tern_rng_f32(&r) * 2.0f - 1.0f;
        tc_run(&L, x0, T, moe, xo);
        TC_CU(cudaMemcpy(xn, L.xn, (size_t)T * D * sizeof(float), cudaMemcpyDeviceToHost));
        TC_CU(cudaMemcpy(wt, L.s.wt, (size_t)T * K * sizeof(float), cudaMemcpyDeviceToHost));
        TC_CU(cudaMemcpy(sel, L.s.sel, (size_t)T * K * sizeof(int32_t), cudaMemcpyDeviceToHost));
        TC_CU(cudaMemcpy(h, L.s.h, (size_t)T * K * F * 2, cudaMemcpyDeviceToHost));
        /* gate/up: h against act(gate . xb, up . xb), xb = bf16(xn); down
         * and the sum: x against x0 + sum_k w (down . h + b) */
        double hd = 0, hr = 0, xd = 0, xr = 0;
        int bad_t = -1, bad_r = -1;
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < D; i++)
                xb[i] = tc_bf16_d(tc_bf16_rn(xn[(size_t)t * D + i]));
            for (int k = 0; k < K; k++) {
                const int e = sel[t * K + k];
                const uint16_t *hp = h + ((size_t)t * K + k) * F;
                for (int f = 0; f < F; f++) {
                    const float *gr = L.wv[0] + ((size_t)e * F + f) * D, *ur = L.wv[1] + ((size_t)e * F + f) * D;
                    double g = 0, u = 0, sg = 0, su = 0;
                    for (int i = 0; i < D; i++) {
                        g += gr[i] * xb[i], u += ur[i] * xb[i];
                        sg += fabs(gr[i] * xb[i]), su += fabs(ur[i] * xb[i]);
                    }
                    const double ref = tc_act(c, L.bg ? L.bg + (size_t)e * F + f : NULL,
                                              L.bu ? L.bu + (size_t)e * F + f : NULL, g, u);
                    const double d = tc_bf16_d(hp[f]) - ref;
                    /* bf16 rounding of h (2^-9 of |ref|) and the f32 sums'
                     * error (2e-5 of the terms' magnitudes, through the
                     * activation's slopes); a wrong fragment is off by |ref| */
                    const double tol = 0x1p-8 * fabs(ref) + 2e-5 * (1.2 * sg * (fabs(u) + 1.0) + su * (fabs(g) + 1.0));
                    if (fabs(d) > tol && bad_t < 0)
                        bad_t = t, bad_r = f;
                    hd += d * d, hr += ref * ref;
                }
            }
            for (int o = 0; o < D; o++) {
                double acc = 0;
                for (int k = 0; k < K; k++) {
                    const int e = sel[t * K + k];
                    const float *dr = L.wv[2] + ((size_t)e * D + o) * F;
                    const uint16_t *hp = h + ((size_t)t * K + k) * F;
                    double y = 0;
                    for (int f = 0; f < F; f++)
                        y += dr[f] * tc_bf16_d(hp[f]);
                    if (L.bd)
                        y += L.bd[(size_t)e * D + o];
                    acc += y * wt[t * K + k];
                }
                const double d = (double)xo[(size_t)t * D + o] - x0[(size_t)t * D + o] - acc;
                xd += d * d, xr += acc * acc;
            }
        }
        const double eh = sqrt(hd / (hr > 0 ? hr : 1)), ex = sqrt(xd / (xr > 0 ? xr : 1));
        print_message("moe tc %s E %d K %d dim %d ff %d%s%s T %d: h rel err %.3g, layer rel err %.3g\n", kn, c->E, K, D,
                      F, c->gpt_oss ? " gpt_oss" : "", c->onehot ? " one-hot" : "", T, eh, ex);
        if (bad_t >= 0)
            fail_msg("%s T %d: h of token %d row %d off by more than bf16 rounding (fragment mapping?)", kn, T, bad_t,
                     bad_r);
        if (!(eh < 3e-3) || !(ex < 1e-4))
            fail_msg("%s T %d: relative error h %g (tol 3e-3), layer %g (tol 1e-4)", kn, T, eh, ex);
        /* bf16 tiles with the next steps prefetched (TCU_MOE_TC_PF): the
         * same bits */
        if (c->kind == TCU_BF16) {
            float *xp = malloc((size_t)T * D * sizeof(float));
            assert_non_null(xp);
            tc_run(&L, x0, T, moe | TCU_MOE_TC_PF, xp);
            if (memcmp(xp, xo, (size_t)T * D * sizeof(float)))
                fail_msg("%s T %d: TERN_CUDA_MOE bit %d changes the bits", kn, T, TCU_MOE_TC_PF);
            free(xp);
        }
        /* each token alone through the same kernel: its row's bits */
        const int step = T > 64 ? 7 : 1;
        for (int t = 0; t < T; t += step) {
            tc_run(&L, x0 + (size_t)t * D, 1, moe, x1);
            if (memcmp(x1, xo + (size_t)t * D, (size_t)D * sizeof(float)))
                fail_msg("%s T %d: token %d alone differs from its row in the batch", kn, T, t);
        }
        free(x0);
        free(xo);
        free(xn);
        free(wt);
        free(x1);
        free(sel);
        free(h);
        free(xb);
    }
    tc_layer_free(&L);
}

static void test_moe_tc(void **state)
{
    (void)state;
    if (model_cuda_device_count() <= 0)
        skip();
    static const int T_all[] = {2, 9, 33, 64, 128, 300}, T_few[] = {9, 33}, T_mid[] = {9, 128, 300};
    /* the fragment mapping: one-hot rows, each output one input */
    const tc_case onehot = {TCU_BF16, 8, 2, 256, 768, 0, 0, 1};
    tc_check(&onehot, T_few, 2);
    const tc_case bf_small = {TCU_BF16, 8, 2, 256, 768, 0, 0, 0};
    tc_check(&bf_small, T_all, 6);
    const tc_case bf_wide = {TCU_BF16, 32, 8, 2048, 768, 0, 0, 0}; /* Qwen3-30B-A3B's widths */
    tc_check(&bf_wide, T_few, 2);
    const tc_case bf_many = {TCU_BF16, 128, 8, 256, 768, 0, 0, 0}; /* its expert count */
    const int T_many[] = {33, 128};
    tc_check(&bf_many, T_many, 2);
    const tc_case bf_oss = {TCU_BF16, 32, 4, 256, 1088, 0, 1, 0};
    tc_check(&bf_oss, T_mid, 3);
    const tc_case q4_64 = {TCU_Q4, 8, 2, 256, 768, 64, 0, 0};
    tc_check(&q4_64, T_all, 6);
    const tc_case q4_32 = {TCU_Q4, 32, 4, 256, 1088, 32, 0, 0};
    const int T128[] = {128};
    tc_check(&q4_32, T128, 1);
    const tc_case q4_128 = {TCU_Q4, 16, 4, 512, 768, 128, 0, 0};
    const int T64[] = {64};
    tc_check(&q4_128, T64, 1);
    const tc_case mx_oss = {TCU_MX4, 32, 4, 256, 1088, 32, 1, 0};
    tc_check(&mx_oss, T_mid, 3);
    const tc_case mx_small = {TCU_MX4, 8, 2, 256, 768, 32, 0, 0};
    const int T300[] = {300};
    tc_check(&mx_small, T300, 1);
    /* whole models: qwen3_moe bf16 and 4-bit, gpt_oss bf16 and MXFP4 */
    const char *q = "--family qwen3_moe --dim 256 --layers 3 --heads 8 --kv-heads 2 --head-dim 32 --ff 384 "
                    "--experts 16 --top-k 4 --moe-ff 128 --norm-topk 1 --seed 41 --dtype bf16";
    check_moe_tc(q, 0, 2e-2);
    check_moe_tc(q, 4, 2e-2);
    const char *g = "--family gpt_oss --dim 64 --layers 4 --heads 4 --kv-heads 2 --head-dim 32 --experts 8 "
                    "--top-k 4 --moe-ff 64 --sliding-window 16 --seed 31 --dtype bf16";
    char gm[400];
    snprintf(gm, sizeof gm, "%s --mxfp4 1", g);
    check_moe_tc(g, 0, 2e-2);
    check_moe_tc(gm, 0, 2e-2);
}
#endif

/* An argument: only the tests whose names match it (cmocka's pattern). */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_forward),
        cmocka_unit_test(test_gpt_oss),
#ifdef TERN_CUDA
        cmocka_unit_test(test_moe_tc),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
