/* The CUDA backend against the CPU backend (the reference), on fresh random
 * inputs: every weight kind's product (GEMV and cuBLAS paths), paged
 * attention (GQA, windows, soft-capping, gpt_oss's sinks - one above
 * every score too -, several sequences and blocks, split decode and tiled
 * prefill kernels), batch invariance of the GEMV path, and whole forwards
 * of random fixtures of several families (bf16 and 4-bit, YaRN's attention
 * factor; gpt_oss: test_cuda_moe.c). Skipped when no GPU is visible;
 * in a build without CUDA it checks the "not built" errors instead.
 *
 * Tolerances (relative L2 error ||gpu - cpu|| / ||cpu||): f32-accumulated
 * paths (GEMV, attention, forward through them) 2e-5 - only the summation
 * order differs; cuBLAS products with bf16-rounded inputs 1e-2, f16 2e-3. */
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/rng.h"
#include "model/backend_cuda.h"
#include "model/model_int.h"
#include "model/quant.h"
#include "tensor/kernels.h"
#include "test_util.h"
#ifdef TERN_CUDA
#include <cuda_runtime.h>

#include "model/backend_cuda_lt.h"
#include "tensor/cuda/cuda_kernels.h"
#endif

static int have_gpu(void) { return model_cuda_device_count() > 0; }

static const char *gemv_name(int v)
{
#ifdef TERN_CUDA
    return tcu_gemv_name(v);
#else
    (void)v;
    return "-";
#endif
}

/* A table-path GPU backend with exact products (the f32-accurate kernels
 * these tests hold to 2e-5) whose GEMVs take kernel `gemv` (TCU_GEMV_*) for
 * every weight kind and whose prefill attention is `tiled`
 * (TCU_ATTN_TILED_*); -1 keeps the default. */
static model_backend *gpu_new(int gemv, int tiled)
{
    tern_err err = {0};
#ifdef TERN_CUDA
    tcu_opts o;
    tcu_opts_init(&o);
    o.exact = 1;
    if (gemv >= 0)
        o.gemv_bf16 = o.gemv_q4 = o.gemv_q8 = gemv;
    if (tiled >= 0)
        o.attn_tiled = tiled;
    model_backend *b = model_backend_cuda_new_opts(NULL, 0, &o, &err);
#else
    (void)gemv;
    (void)tiled;
    model_backend *b = model_backend_cuda_new(NULL, 0, &err);
#endif
    if (!b)
        fail_msg("%s", err.msg);
    return b;
}

#ifdef TERN_CUDA
/* The default options with exact products and kernel `gemv` for every
 * weight kind. */
static tcu_opts opts_gemv(int gemv)
{
    tcu_opts o;
    tcu_opts_init(&o);
    o.exact = 1;
    o.gemv_bf16 = o.gemv_q4 = o.gemv_q8 = gemv;
    return o;
}
#endif

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

static void fill(tern_rng *r, float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        x[i] = a * (tern_rng_f32(r) * 2.0f - 1.0f);
}

/* A random weight of a kind: 0 f32, 1 bf16, 2 f16, 4/8 quantized (scales bf16). */
typedef struct test_w {
    model_weight w;
    void *buf;
} test_w;

static void make_weight(tern_rng *r, test_w *t, int kind, int n_out, int n_in, int group)
{
    memset(t, 0, sizeof *t);
    float *f = malloc((size_t)n_out * n_in * sizeof(float));
    assert_non_null(f);
    fill(r, f, (size_t)n_out * n_in, 0.05f);
    t->w.n_out = n_out;
    t->w.n_in = n_in;
    if (kind == 4 || kind == 8) {
        int ng = n_in / group;
        uint32_t *words = calloc((size_t)n_out * n_in * kind / 32, sizeof(uint32_t));
        float *sc = malloc((size_t)ng * sizeof(float)), *bi = malloc((size_t)ng * sizeof(float));
        t->w.sb = malloc((size_t)n_out * ng * 2 * sizeof(float));
        assert_true(words && sc && bi && t->w.sb);
        for (int o = 0; o < n_out; o++) {
            model_quant_row(f + (size_t)o * n_in, n_in, kind, group, TERN_BF16, words + (size_t)o * n_in * kind / 32, sc,
                            bi);
            for (int g = 0; g < ng; g++) {
                t->w.sb[((size_t)o * ng + g) * 2] = sc[g];
                t->w.sb[((size_t)o * ng + g) * 2 + 1] = bi[g];
            }
        }
        free(sc);
        free(bi);
        free(f);
        t->buf = words;
        t->w.dtype = TERN_BF16;
        t->w.qbits = kind;
        t->w.group = group;
    } else if (kind == 3) {
        /* FP8 E4M3, group = the scales' column block (0: a scale a row, -1:
         * one for the matrix), 128 rows a block when blocked */
        const int fc = group > 0 ? group : n_in, fr = group > 0 ? 128 : group == 0 ? 1 : n_out;
        const int ncol = (n_in + fc - 1) / fc, nrow = (n_out + fr - 1) / fr;
        uint8_t *q = malloc((size_t)n_out * n_in);
        t->w.fs = malloc((size_t)nrow * ncol * sizeof(float));
        assert_true(q && t->w.fs);
        for (int rb = 0; rb < nrow; rb++)
            for (int c = 0; c < ncol; c++) {
                float amax = 0.0f;
                for (int o = rb * fr; o < n_out && o < (rb + 1) * fr; o++)
                    for (int i = c * fc; i < n_in && i < (c + 1) * fc; i++)
                        amax = fmaxf(amax, fabsf(f[(size_t)o * n_in + i]));
                const float sc = amax > 0.0f ? amax / 448.0f : 1.0f;
                t->w.fs[rb * ncol + c] = sc;
                for (int o = rb * fr; o < n_out && o < (rb + 1) * fr; o++)
                    for (int i = c * fc; i < n_in && i < (c + 1) * fc; i++)
                        q[(size_t)o * n_in + i] = tern_f32_to_f8e4m3(f[(size_t)o * n_in + i] / sc);
            }
        free(f);
        t->buf = q;
        t->w.dtype = TERN_F8E4M3;
        t->w.fs_rows = fr;
        t->w.fs_cols = fc;
    } else if (kind == 0) {
        t->buf = f;
        t->w.dtype = TERN_F32;
    } else {
        uint16_t *h = malloc((size_t)n_out * n_in * sizeof(uint16_t));
        assert_non_null(h);
        for (size_t i = 0; i < (size_t)n_out * n_in; i++)
            h[i] = kind == 1 ? tern_f32_to_bf16(f[i]) : tern_f32_to_f16(f[i]);
        free(f);
        t->buf = h;
        t->w.dtype = kind == 1 ? TERN_BF16 : TERN_F16;
    }
    t->w.data = t->buf;
}

static void free_weight(test_w *t)
{
    free(t->buf);
    free(t->w.sb);
    free(t->w.fs);
}

static void test_not_built_or_no_gpu(void **state)
{
    (void)state;
    tern_err err = {0};
    model_load_opts o = {1, "tpu"};
    assert_null(model_load_ex("/nonexistent-model-dir", &o, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    if (!have_gpu()) {
        model_backend *be = model_backend_cuda_new(NULL, 0, &err);
        assert_null(be);
        assert_int_equal(err.code, TERN_EUNSUPPORTED);
        skip();
    }
    model_backend *be = model_backend_cuda_new(NULL, 99, &err); /* no such GPU */
    assert_null(be);
    assert_int_equal(err.code, TERN_EINVAL);
}

/* The options: the environment's overrides parsed by name and range, a
 * malformed one an error naming its variable (before any GPU is touched),
 * options out of range refused; without CUDA, "not built". */
static void test_opts(void **state)
{
    (void)state;
    tern_err err = {0};
#ifdef TERN_CUDA
    tcu_opts o, d;
    tcu_opts_init(&d);
    tern_kernels_exact_set(0); /* main sets it for the CPU reference */
    const int rc0 = model_cuda_opts_from_env(&o, &err);
    tern_kernels_exact_set(1); /* back before any assertion: the later tests' CPU reference needs it */
    assert_int_equal(rc0, 0);
    assert_memory_equal(&o, &d, sizeof o);
    assert_int_equal(d.gemv_bf16, TCU_GEMV_AUTO);
    assert_int_equal(d.gemv_q8, TCU_GEMV_BY_SHAPE);
    assert_int_equal(d.exact, 0);
    assert_int_equal(d.tc_max_t, 128);
    assert_int_equal(d.lt_cat, TCU_CAT_QKV | TCU_CAT_GU);
    /* --exact-products: exact products, no cuBLAS - unless the environment says */
    tern_kernels_exact_set(1);
    assert_int_equal(model_cuda_opts_from_env(&o, &err), 0);
    assert_int_equal(o.exact, 1);
    assert_int_equal(o.gemm_min_t, INT_MAX);
    setenv("TERN_CUDA_GEMM_MIN_T", "40", 1);
    assert_int_equal(model_cuda_opts_from_env(&o, &err), 0);
    assert_int_equal(o.exact, 1);
    assert_int_equal(o.gemm_min_t, 40);
    unsetenv("TERN_CUDA_GEMM_MIN_T");
    setenv("TERN_CUDA_TC_MAX_T", "64", 1);
    assert_int_equal(model_cuda_opts_from_env(&o, &err), 0);
    assert_int_equal(o.tc_max_t, 64);
    unsetenv("TERN_CUDA_TC_MAX_T");
    setenv("TERN_CUDA_GEMV", "staged,by-shape,tensor", 1);
    setenv("TERN_CUDA_ATTN_TILED", "0", 1);
    setenv("TERN_CUDA_RING", "31", 1);
    assert_int_equal(model_cuda_opts_from_env(&o, &err), 0);
    assert_int_equal(o.gemv_bf16, TCU_GEMV_STAGED);
    assert_int_equal(o.gemv_q4, TCU_GEMV_BY_SHAPE);
    assert_int_equal(o.gemv_q8, TCU_GEMV_TENSOR);
    assert_int_equal(o.attn_tiled, TCU_ATTN_TILED_OFF);
    assert_int_equal(o.ring, 31);
    assert_int_equal(o.pdl, d.pdl);
    setenv("TERN_CUDA_GEMV", "plain", 1);
    assert_int_equal(model_cuda_opts_from_env(&o, &err), 0);
    assert_true(o.gemv_bf16 == TCU_GEMV_PLAIN && o.gemv_q4 == TCU_GEMV_PLAIN && o.gemv_q8 == TCU_GEMV_PLAIN);
    unsetenv("TERN_CUDA_ATTN_TILED");
    unsetenv("TERN_CUDA_RING");
    const char *bad_gemv[] = {"staged,foo", "staged,staged", "auto,auto,auto,auto", "", "17", "staged,"};
    for (size_t i = 0; i < sizeof bad_gemv / sizeof *bad_gemv; i++) {
        setenv("TERN_CUDA_GEMV", bad_gemv[i], 1);
        assert_int_equal(model_cuda_opts_from_env(&o, &err), TERN_EINVAL);
        assert_non_null(strstr(err.msg, "TERN_CUDA_GEMV"));
        assert_null(model_backend_cuda_new(NULL, 0, &err));
        assert_int_equal(err.code, TERN_EINVAL);
    }
    unsetenv("TERN_CUDA_GEMV");
    const char *bad_int[][2] = {{"TERN_CUDA_PDL", "2"},        {"TERN_CUDA_GRAPHS", "yes"},
                                {"TERN_CUDA_GEMM_MIN_T", "0"}, {"TERN_CUDA_EARLY", "32"},
                                {"TERN_CUDA_ATTN_TILED", "3"}, {"TERN_CUDA_SPLIT_LEN1", "-1"},
                                {"TERN_CUDA_TC_MAX_T", "129"}, {"TERN_CUDA_INVARIANT", "4"},
                                {"TERN_CUDA_LT_CAT", "4"}};
    for (size_t i = 0; i < sizeof bad_int / sizeof *bad_int; i++) {
        setenv(bad_int[i][0], bad_int[i][1], 1);
        assert_int_equal(model_cuda_opts_from_env(&o, &err), TERN_EINVAL);
        assert_non_null(strstr(err.msg, bad_int[i][0]));
        unsetenv(bad_int[i][0]);
    }
    o = d;
    o.gemv_q4 = TCU_GEMV_N;
    assert_null(model_backend_cuda_new_opts(NULL, 0, &o, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    o = d;
    o.attn_tiled = 7;
    assert_null(model_backend_cuda_new_opts(NULL, 0, &o, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    o = d;
    o.exact = 2;
    assert_null(model_backend_cuda_new_opts(NULL, 0, &o, &err));
    assert_int_equal(err.code, TERN_EINVAL);
    char desc[512];
    tcu_opts_format(&d, desc, sizeof desc);
    assert_non_null(strstr(desc, "products throughput; gemv bf16 auto, 4-bit auto, 8-bit by-shape"));
#else
    tcu_opts o;
    assert_int_equal(model_cuda_opts_from_env(&o, &err), TERN_EUNSUPPORTED);
    assert_null(model_backend_cuda_new_opts(NULL, 0, &o, &err));
    assert_int_equal(err.code, TERN_EUNSUPPORTED);
#endif
}

static void test_matmul(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    tern_err err = {0};
    model_backend *cpu = model_backend_cpu_new(2, &err);
    assert_non_null(cpu);
    tern_rng r;
    tern_rng_seed(&r, 1234, 1);
    /* kind 3: FP8, scales a 128 x 128 block, a 1 x 96 one (a partial last block), a row, the matrix */
    const int kinds[][2] = {{0, 0}, {1, 0}, {2, 0}, {4, 32}, {4, 64}, {4, 128}, {8, 32}, {8, 64},
                            {3, 128}, {3, 96}, {3, 0}, {3, -1}};
    const int Ts[] = {1, 3, 9, 20, 40};
    const int outs[3] = {136, 40, 72};
#ifdef TERN_CUDA
    enum { n_var = TCU_GEMV_N };
#else
    enum { n_var = 1 };
#endif
    model_backend *gpus[n_var]; /* one a GEMV kernel (TCU_GEMV_*) */
    for (int v = 0; v < n_var; v++)
        gpus[v] = gpu_new(v, -1);
    /* 3584 inputs: an 8-token tile of 4-bit chunks stages activations in two panels */
    const size_t nk = sizeof kinds / sizeof *kinds;
    for (size_t kk = 0; kk < 2 * nk; kk++) {
        const size_t ki = kk % nk;
        const int n_in = kk < nk ? 512 : 3584;
        test_w tw[3];
        for (int i = 0; i < 3; i++)
            make_weight(&r, &tw[i], kinds[ki][0], outs[i], n_in, kinds[ki][1]);
        const model_weight *w[3] = {&tw[0].w, &tw[1].w, &tw[2].w};
        /* every (T, GEMV kernel) pair; T >= 33 (cuBLAS) once */
        const int nT = (int)(sizeof Ts / sizeof *Ts);
        for (int tv = 0; tv < nT * n_var; tv++) {
            const int T = Ts[tv / n_var], var = tv % n_var;
            if (T >= 33 && var > 0)
                continue;
            model_backend *gpu = gpus[var]; /* every GEMV kernel keeps the contract */
            float *X = malloc((size_t)T * n_in * sizeof(float));
            float *yc[3], *yg[3];
            fill(&r, X, (size_t)T * n_in, 1.0f);
            for (int i = 0; i < 3; i++) {
                yc[i] = malloc((size_t)T * outs[i] * sizeof(float));
                yg[i] = malloc((size_t)T * outs[i] * sizeof(float));
                for (size_t e = 0; e < (size_t)T * outs[i]; e++)
                    yg[i][e] = NAN; /* poison: every output must be written */
            }
            assert_int_equal(cpu->matmul(cpu, 3, w, X, yc, T, &err), 0);
            if (gpu->matmul(gpu, 3, w, X, yg, T, &err))
                fail_msg("%s", err.msg);
            int cublas = T >= 33;
            double tol = !cublas || kinds[ki][0] == 0 ? 2e-5 : kinds[ki][0] == 2 ? 2e-3 : 1e-2;
            for (int i = 0; i < 3; i++) {
                double e = rel_err(yg[i], yc[i], (size_t)T * outs[i]);
                print_message("matmul kind %d group %d n_in %d T %d gemv %s mat %d: rel err %.3g (tol %.0e)\n",
                              kinds[ki][0], kinds[ki][1], n_in, T, gemv_name(var), i, e, tol);
                if (!(e <= tol))
                    fail_msg("kind %d n_in %d T %d gemv %s: relative error %g over %g", kinds[ki][0], n_in, T,
                             gemv_name(var), e, tol);
            }
            /* batch invariance of the GEMV path: each row alone = its row in the batch */
            if (!cublas && T > 1) {
                float *one[3];
                for (int i = 0; i < 3; i++)
                    one[i] = malloc((size_t)outs[i] * sizeof(float));
                for (int t = 0; t < T; t += T - 1) {
                    if (gpu->matmul(gpu, 3, w, X + (size_t)t * n_in, one, 1, &err))
                        fail_msg("%s", err.msg);
                    for (int i = 0; i < 3; i++)
                        assert_memory_equal(one[i], yg[i] + (size_t)t * outs[i], (size_t)outs[i] * sizeof(float));
                }
                for (int i = 0; i < 3; i++)
                    free(one[i]);
            }
            for (int i = 0; i < 3; i++) {
                free(yc[i]);
                free(yg[i]);
            }
            free(X);
        }
        for (int i = 0; i < 3; i++)
            free_weight(&tw[i]);
    }
    for (int v = 0; v < n_var; v++)
        gpus[v]->free(gpus[v]);
    cpu->free(cpu);
}

/* The FP8 tensor-core product (throughput mode) against a reference of the
 * same quantized activations (the host quantizes them as tcu_quant_f8
 * does: scale max|x| / 448 a token and 128 inputs, codes rounded to
 * nearest even), for block-128, per-row and per-matrix weight scales; each
 * row alone is the same bits as in the batch. */
static void test_f8_mma(void **state)
{
    (void)state;
#ifdef TERN_CUDA
    if (!have_gpu())
        skip();
    tern_err err = {0};
    tcu_opts o;
    tcu_opts_init(&o);
    o.f8_tc = 2; /* throughput, every step on the FP8 tensor cores (a one-token product too) */
    model_backend *gpu = model_backend_cuda_new_opts(NULL, 0, &o, &err);
    if (!gpu)
        fail_msg("%s", err.msg);
    tern_rng r;
    tern_rng_seed(&r, 808, 1);
    const int groups[] = {128, 0, -1}, Ts[] = {1, 5, 32, 33, 100};
    const int n_in = 640, n_out = 200; /* 5 blocks of 128; 13 row tiles, the last partial */
    for (size_t gi = 0; gi < sizeof groups / sizeof *groups; gi++) {
        test_w tw;
        make_weight(&r, &tw, 3, n_out, n_in, groups[gi]);
        const model_weight *w = &tw.w;
        const int fc = tw.w.fs_cols, ncol = (n_in + fc - 1) / fc;
        const uint8_t *q = tw.buf;
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            const int T = Ts[ti], nb = n_in / 128;
            float *X = malloc((size_t)T * n_in * sizeof(float)), *Y = malloc((size_t)T * n_out * sizeof(float));
            float *one = malloc((size_t)n_out * sizeof(float)), *xs = malloc((size_t)T * nb * sizeof(float));
            uint8_t *x8 = malloc((size_t)T * n_in);
            assert_true(X && Y && one && xs && x8);
            fill(&r, X, (size_t)T * n_in, 1.0f);
            for (int i = 0; i < T * n_in; i += 97)
                X[i] *= 40.0f; /* outliers: blocks of unlike ranges */
            for (int t = 0; t < T; t++)
                for (int c = 0; c < nb; c++) {
                    float m = 0.0f;
                    for (int k = c * 128; k < c * 128 + 128; k++)
                        m = fmaxf(m, fabsf(X[(size_t)t * n_in + k]));
                    const float sc = m > 0.0f ? m / 448.0f : 1.0f;
                    xs[t * nb + c] = sc;
                    for (int k = c * 128; k < c * 128 + 128; k++)
                        x8[(size_t)t * n_in + k] = tern_f32_to_f8e4m3(X[(size_t)t * n_in + k] / sc);
                }
            float *Yp[1] = {Y};
            if (gpu->matmul(gpu, 1, &w, X, Yp, T, &err))
                fail_msg("%s", err.msg);
            double num = 0.0, den = 0.0;
            for (int t = 0; t < T; t++)
                for (int o2 = 0; o2 < n_out; o2++) {
                    double y = 0.0;
                    for (int c = 0; c < nb; c++) {
                        double p = 0.0;
                        for (int k = c * 128; k < c * 128 + 128; k++)
                            p += (double)tern_f8e4m3_to_f32(q[(size_t)o2 * n_in + k]) *
                                 tern_f8e4m3_to_f32(x8[(size_t)t * n_in + k]);
                        y += p * tw.w.fs[(o2 / tw.w.fs_rows) * ncol + c * 128 / fc] * xs[t * nb + c];
                    }
                    const double d = Y[(size_t)t * n_out + o2] - y;
                    num += d * d;
                    den += y * y;
                }
            const double e = sqrt(num / (den > 0 ? den : 1));
            print_message("fp8 tensor cores, scales %d, T %d: rel err %.3g against the quantized reference (tol 1e-5)\n",
                          groups[gi], T, e);
            if (!(e <= 1e-5))
                fail_msg("fp8 tensor cores scales %d T %d: relative error %g", groups[gi], T, e);
            float *Op[1] = {one};
            for (int t = 0; t < T; t += (T > 1 ? T - 1 : 1)) {
                if (gpu->matmul(gpu, 1, &w, X + (size_t)t * n_in, Op, 1, &err))
                    fail_msg("%s", err.msg);
                assert_memory_equal(one, Y + (size_t)t * n_out, (size_t)n_out * sizeof(float));
            }
            free(X);
            free(Y);
            free(one);
            free(xs);
            free(x8);
        }
        free_weight(&tw);
    }
    gpu->free(gpu);
#else
    skip();
#endif
}

#ifdef TERN_CUDA
/* x rounded to bf16 (nearest even; finite x), as the device rounds it */
static float q4t_bf16(float x) { return tern_bf16_to_f32(tern_f32_to_bf16(x)); }

/* Device copies of a test weight as a TCU_Q4 tcu_mat (y: [128][n_out]). */
static tcu_mat q4t_upload(const test_w *tw)
{
    const model_weight *w = &tw->w;
    tcu_mat m = {0};
    void *dw = NULL, *dsb = NULL, *dy = NULL;
    const size_t nb = (size_t)w->n_out * w->n_in / 2, ns = (size_t)w->n_out * (w->n_in / w->group) * 2;
    assert_int_equal(cudaMalloc(&dw, nb), 0);
    assert_int_equal(cudaMalloc(&dsb, ns * sizeof(float)), 0);
    assert_int_equal(cudaMalloc(&dy, (size_t)128 * w->n_out * sizeof(float)), 0);
    assert_int_equal(cudaMemcpy(dw, tw->buf, nb, cudaMemcpyHostToDevice), 0);
    assert_int_equal(cudaMemcpy(dsb, w->sb, ns * sizeof(float), cudaMemcpyHostToDevice), 0);
    m.w = dw;
    m.sb = dsb;
    m.y = dy;
    m.n_out = w->n_out;
    m.kind = TCU_Q4;
    m.group = w->group;
    return m;
}

static void q4t_free(tcu_mat *m)
{
    cudaFree((void *)m->w);
    cudaFree((void *)m->sb);
    cudaFree(m->y);
}

/* tcu_q4_prep + tcu_q4_mm of the first T rows of dX (device, [T][n_in]) with
 * tile configuration `tile` (0: by T); m[k].y's first T rows to Y[k].
 * accumulate -1: SiLU(gate) * up fused (glu 1), -3: the product then
 * tcu_glu. */
static void q4t_run(int n, const tcu_mat *m, int n_in, const float *dX, int T, int accumulate, int tile, float **Y)
{
    tcu_opts o;
    tcu_opts_init(&o);
    o.q4_tile = tile;
    uint16_t *xb = NULL;
    float *xs = NULL;
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), 0);
    assert_int_equal(cudaMalloc((void **)&xb, (size_t)T * n_in * sizeof(uint16_t)), 0);
    assert_int_equal(cudaMalloc((void **)&xs, (size_t)T * (n_in / 32) * sizeof(float)), 0);
    int rc = tcu_q4_prep(dX, NULL, NULL, NULL, 0.0f, T, n_in, m[0].group, xb, xs, &o, (tcu_stream)st);
    if (!rc)
        rc = tcu_q4_mm(n, m, n_in, xb, xs, T, accumulate > 0 ? accumulate : 0, accumulate == -1 || accumulate == -2 ? -accumulate : 0, &o,
                       (tcu_stream)st);
    if (!rc && accumulate == -3) /* unfused: tcu_glu after the product */
        rc = tcu_glu(m[0].y, m[1].y, (long)T * m[0].n_out, 0, &o, (tcu_stream)st);
    if (!rc)
        rc = (int)cudaStreamSynchronize(st);
    if (rc)
        fail_msg("4-bit GEMM, T %d tile %d: %s", T, tile, cudaGetErrorString((cudaError_t)rc));
    for (int k = 0; k < n; k++)
        assert_int_equal(cudaMemcpy(Y[k], m[k].y, (size_t)T * m[k].n_out * sizeof(float), cudaMemcpyDeviceToHost), 0);
    cudaFree(xb);
    cudaFree(xs);
    cudaStreamDestroy(st);
}

static int q4t_code(const test_w *tw, int r, int i)
{
    const uint32_t *words = tw->buf;
    return (int)((words[((size_t)r * tw->w.n_in + i) / 8] >> (4 * (i % 8))) & 15u);
}

/* The 4-bit tensor-core GEMM (gemm_q4.cu, the throughput mode's batched
 * 4-bit products):
 * - fragment mapping: one nonzero code a row (code 1-15 at an input that
 *   walks every k slot), scale 1, bias 0 - each output must be exactly
 *   code x the token's bf16-rounded input, for groups of 32, 64 and 128;
 * - random weights (model_quant_row) and inputs with outliers, shapes with
 *   rows off the tiles, n_in 1024-14336, groups 32 / 64 / 128, one and two
 *   matrices a launch: every element of T = 1, 2, 5, 8, 17, 32, 64, 100,
 *   128 within 1e-5 of sum |terms| of a double reference of the same
 *   rounded inputs, codes, scales and biases; each token alone (T = 1, the
 *   same kernel) equal bitwise to its row in every batch; every tile
 *   configuration equal bitwise to the default; accumulate = y + the product;
 *   gate/up with the SiLU product fused = the product then tcu_glu, bitwise. */
static void test_q4_mma(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    tern_rng r;
    tern_rng_seed(&r, 4404, 1);
    /* fragment mapping */
    const int groups[] = {32, 64, 128};
    for (int gi = 0; gi < 3; gi++) {
        const int n_out = 80, n_in = 512, G = groups[gi], ng = n_in / G, T = 17;
        test_w tw;
        memset(&tw, 0, sizeof tw);
        uint32_t *words = calloc((size_t)n_out * n_in / 8, sizeof(uint32_t));
        tw.w.sb = calloc((size_t)n_out * ng * 2, sizeof(float));
        assert_true(words && tw.w.sb);
        int *at = malloc((size_t)n_out * sizeof(int));
        assert_non_null(at);
        for (int o2 = 0; o2 < n_out; o2++) {
            at[o2] = (o2 * 37 + 11) % n_in;
            words[((size_t)o2 * n_in + at[o2]) / 8] |= (uint32_t)(1 + o2 % 15) << (4 * (at[o2] % 8));
            for (int g = 0; g < ng; g++)
                tw.w.sb[((size_t)o2 * ng + g) * 2] = 1.0f;
        }
        tw.buf = words;
        tw.w.n_out = n_out;
        tw.w.n_in = n_in;
        tw.w.qbits = 4;
        tw.w.group = G;
        tcu_mat m = q4t_upload(&tw);
        float *X = malloc((size_t)T * n_in * sizeof(float)), *Y = malloc((size_t)T * n_out * sizeof(float)), *dX;
        assert_true(X && Y);
        fill(&r, X, (size_t)T * n_in, 3.0f);
        assert_int_equal(cudaMalloc((void **)&dX, (size_t)T * n_in * sizeof(float)), 0);
        assert_int_equal(cudaMemcpy(dX, X, (size_t)T * n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
        q4t_run(1, &m, n_in, dX, T, 0, 0, &Y);
        int bad = 0;
        for (int t = 0; t < T; t++)
            for (int o2 = 0; o2 < n_out; o2++) {
                const float want = (float)(1 + o2 % 15) * q4t_bf16(X[(size_t)t * n_in + at[o2]]);
                if (Y[(size_t)t * n_out + o2] != want && bad++ < 5)
                    print_message("  q4 mapping g%d: token %d row %d (input %d) %g, want %g\n", G, t, o2, at[o2],
                                  Y[(size_t)t * n_out + o2], want);
            }
        print_message("4-bit GEMM fragment mapping, group %d: %s\n", G, bad ? "WRONG" : "exact");
        if (bad)
            fail_msg("4-bit GEMM fragment mapping, group %d: %d outputs wrong", G, bad);
        cudaFree(dX);
        q4t_free(&m);
        free(X);
        free(Y);
        free(at);
        free_weight(&tw);
    }

    /* random weights: {n matrices, rows of each, n_in, group} */
    static const struct {
        int n, rows[2], n_in, group;
    } cases[] = {{1, {200, 0}, 2048, 64}, {1, {1000, 0}, 4096, 32}, {1, {96, 0}, 14336, 64},
                 {1, {300, 0}, 1024, 128}, {2, {200, 72}, 2048, 64}, {2, {328, 328}, 4096, 64}};
    const int Ts[] = {1, 2, 5, 8, 17, 32, 64, 100, 128}, TM = 128;
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        const int n = cases[ci].n, n_in = cases[ci].n_in, G = cases[ci].group, ng = n_in / G;
        test_w tw[2];
        tcu_mat m[2];
        float *Yb[2], *Y1[2], *Yc[2];
        double *ref[2], *mag[2];
        float *X = malloc((size_t)TM * n_in * sizeof(float)), *Xr = malloc((size_t)TM * n_in * sizeof(float)), *dX;
        assert_true(X && Xr);
        fill(&r, X, (size_t)TM * n_in, 1.0f);
        for (size_t i = 0; i < (size_t)TM * n_in; i += 89)
            X[i] *= 30.0f; /* outliers */
        for (size_t i = 0; i < (size_t)TM * n_in; i++)
            Xr[i] = q4t_bf16(X[i]);
        assert_int_equal(cudaMalloc((void **)&dX, (size_t)TM * n_in * sizeof(float)), 0);
        assert_int_equal(cudaMemcpy(dX, X, (size_t)TM * n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
        for (int k = 0; k < n; k++) {
            const int n_out = cases[ci].rows[k];
            make_weight(&r, &tw[k], 4, n_out, n_in, G);
            m[k] = q4t_upload(&tw[k]);
            Yb[k] = malloc((size_t)TM * n_out * sizeof(float));
            Y1[k] = malloc((size_t)TM * n_out * sizeof(float));
            Yc[k] = malloc((size_t)TM * n_out * sizeof(float));
            ref[k] = malloc((size_t)TM * n_out * sizeof(double));
            mag[k] = malloc((size_t)TM * n_out * sizeof(double));
            assert_true(Yb[k] && Y1[k] && Yc[k] && ref[k] && mag[k]);
            /* the reference: sum over groups of scale * P + bias * S in double */
            int *codes = malloc((size_t)n_in * sizeof(int));
            assert_non_null(codes);
            for (int o2 = 0; o2 < n_out; o2++) {
                for (int i = 0; i < n_in; i++)
                    codes[i] = q4t_code(&tw[k], o2, i);
                for (int t = 0; t < TM; t++) {
                    const float *xr = Xr + (size_t)t * n_in;
                    double y = 0.0, a = 0.0;
                    for (int g = 0; g < ng; g++) {
                        double p = 0.0, pa = 0.0, sx = 0.0, sa = 0.0;
                        for (int i = g * G; i < (g + 1) * G; i++) {
                            p += (double)codes[i] * xr[i];
                            pa += (double)codes[i] * fabs(xr[i]);
                            sx += xr[i];
                            sa += fabs(xr[i]);
                        }
                        const double sc = tw[k].w.sb[((size_t)o2 * ng + g) * 2],
                                     bi = tw[k].w.sb[((size_t)o2 * ng + g) * 2 + 1];
                        y += sc * p + bi * sx;
                        a += fabs(sc) * pa + fabs(bi) * sa;
                    }
                    ref[k][(size_t)t * n_out + o2] = y;
                    mag[k][(size_t)t * n_out + o2] = a;
                }
            }
            free(codes);
        }
        /* each token alone */
        for (int t = 0; t < TM; t++) {
            float *Yt[2];
            for (int k = 0; k < n; k++)
                Yt[k] = Y1[k] + (size_t)t * m[k].n_out;
            q4t_run(n, m, n_in, dX + (size_t)t * n_in, 1, 0, 0, Yt);
        }
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            const int T = Ts[ti];
            q4t_run(n, m, n_in, dX, T, 0, 0, Yb);
            double worst = 0.0;
            int nbad = 0, ndiff = 0;
            for (int k = 0; k < n; k++) {
                const int n_out = m[k].n_out;
                for (size_t i = 0; i < (size_t)T * n_out; i++) {
                    const double e = fabs(Yb[k][i] - ref[k][i]) / (mag[k][i] > 0 ? mag[k][i] : 1e-30);
                    if (e > worst || !isfinite(Yb[k][i]))
                        worst = isfinite(Yb[k][i]) ? e : INFINITY;
                    nbad += !(e <= 1e-5);
                }
                ndiff += memcmp(Yb[k], Y1[k], (size_t)T * n_out * sizeof(float)) != 0;
            }
            print_message("4-bit GEMM %d x (%d%s%d) x %d g%d, T %d: max err / sum|terms| %.3g (tol 1e-5), tokens alone "
                          "= batch: %s\n",
                          n, m[0].n_out, n > 1 ? "+" : "", n > 1 ? m[1].n_out : 0, n_in, G, T, worst,
                          ndiff ? "DIFFER" : "bitwise");
            if (nbad)
                fail_msg("4-bit GEMM case %zu T %d: %d elements off the reference (worst %g)", ci, T, nbad, worst);
            if (ndiff)
                fail_msg("4-bit GEMM case %zu T %d: a token in the batch differs from the token alone", ci, T);
        }
        /* every tile configuration = the default, bitwise (T 100: several token tiles for the small ones) */
        for (int tile = 1; tile <= 24; tile++) {
            q4t_run(n, m, n_in, dX, 100, 0, tile, Yc);
            for (int k = 0; k < n; k++)
                if (memcmp(Yc[k], Y1[k], (size_t)100 * m[k].n_out * sizeof(float)))
                    fail_msg("4-bit GEMM case %zu: tile configuration %d differs from the default", ci, tile);
        }
        /* accumulate: y + the product, one rounding */
        for (int k = 0; k < n; k++) {
            fill(&r, Yc[k], (size_t)32 * m[k].n_out, 1.0f);
            assert_int_equal(cudaMemcpy(m[k].y, Yc[k], (size_t)32 * m[k].n_out * sizeof(float), cudaMemcpyHostToDevice),
                             0);
        }
        q4t_run(n, m, n_in, dX, 32, 1, 0, Yb);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < (size_t)32 * m[k].n_out; i++)
                if (Yb[k][i] != Yc[k][i] + Y1[k][i])
                    fail_msg("4-bit GEMM case %zu: accumulate gives %g, want %g + %g", ci, Yb[k][i], Yc[k][i],
                             Y1[k][i]);
        if (n == 2 && m[0].n_out == m[1].n_out) { /* SwiGLU fused = the product then tcu_glu, bitwise */
            float *Yg[2] = {Yb[0], Yb[1]}, *Yu[2] = {Yc[0], Yc[1]};
            for (int tile = 0; tile <= 24; tile += 3) {
                q4t_run(2, m, n_in, dX, 17, -3, tile, Yu);
                q4t_run(2, m, n_in, dX, 17, -1, tile, Yg);
                if (memcmp(Yg[0], Yu[0], (size_t)17 * m[0].n_out * sizeof(float)))
                    fail_msg("4-bit GEMM case %zu tile %d: fused SwiGLU differs from tcu_glu after the product", ci,
                             tile);
            }
            print_message("4-bit GEMM case %zu: fused SwiGLU = product + tcu_glu, bitwise\n", ci);
        }
        print_message("4-bit GEMM case %zu: 24 tile configurations bitwise, accumulate exact\n", ci);
        for (int k = 0; k < n; k++) {
            q4t_free(&m[k]);
            free_weight(&tw[k]);
            free(Yb[k]);
            free(Y1[k]);
            free(Yc[k]);
            free(ref[k]);
            free(mag[k]);
        }
        cudaFree(dX);
        free(X);
        free(Xr);
    }
}
#else
static void test_q4_mma(void **state)
{
    (void)state;
    skip();
}
#endif

#ifdef TERN_CUDA
/* h (n values) as bf16 (f16 when f16) into a new device buffer. */
static uint16_t *lc_half_up(const float *h, size_t n, int f16)
{
    uint16_t *b = malloc(n * sizeof(uint16_t)), *d = NULL;
    assert_non_null(b);
    for (size_t i = 0; i < n; i++)
        b[i] = f16 ? tern_f32_to_f16(h[i]) : tern_f32_to_bf16(h[i]);
    assert_int_equal(cudaMalloc((void **)&d, n * sizeof(uint16_t)), 0);
    assert_int_equal(cudaMemcpy(d, b, n * sizeof(uint16_t), cudaMemcpyHostToDevice), 0);
    free(b);
    return d;
}

static float *lc_f32_up(const float *h, size_t n)
{
    float *d = NULL;
    assert_int_equal(cudaMalloc((void **)&d, (n ? n : 1) * sizeof(float)), 0);
    if (h)
        assert_int_equal(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice), 0);
    else
        assert_int_equal(cudaMemset(d, 0, (n ? n : 1) * sizeof(float)), 0);
    return d;
}

/* n bytes of two device buffers the same? */
static int lc_same(const void *a, const void *b, size_t n)
{
    void *ha = malloc(n), *hb = malloc(n);
    assert_true(ha && hb);
    assert_int_equal(cudaMemcpy(ha, a, n, cudaMemcpyDeviceToHost), 0);
    assert_int_equal(cudaMemcpy(hb, b, n, cudaMemcpyDeviceToHost), 0);
    const int same = !memcmp(ha, hb, n);
    free(ha);
    free(hb);
    return same;
}

/* The merged cuBLASLt products (tcu_opts.lt_cat) piece by piece, fresh
 * random inputs, bf16 and f16:
 *  - one GEMM over q/k/v's rows stored side by side: each token's row the
 *    same bits at T = 1 ... 128 (batch invariance of the merged shape), and
 *    within 1e-5 of the three GEMMs a matrix (reported: bitwise or not) and
 *    of a double reference;
 *  - tcu_qkv_post on the merged [T][q + k + v] rows (ld, q_out) = on the
 *    three products' own buffers, bitwise: q, and K / V in the pool (biases,
 *    q/k norms, RoPE);
 *  - tcu_glu_half on [T][2 n_ff] gate/up rows = on the two buffers = tcu_glu
 *    then rounding, bitwise (SiLU and GELU). */
static void test_lt_cat(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    enum { NIN = 256, HD = 32, NH = 8, NKV = 2, NFF = 384, TMAX = 128, QT = 5, BS = 16 };
    const int qd = NH * HD, kvd = NKV * HD, M = qd + 2 * kvd, Ts[] = {1, 2, 3, 8, 32, 100, 128};
    tern_rng r;
    tern_rng_seed(&r, 2027, 12);
    assert_int_equal(cudaSetDevice(0), 0);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), 0);
    tern_err err = {0};
    cu_lt *lt = NULL;
    if (cu_lt_new(&lt, st, 0, &err))
        fail_msg("%s", err.msg);
    float *W = malloc(sizeof(float) * (size_t)(M + 2 * NFF) * NIN), *X = malloc(sizeof(float) * TMAX * NIN);
    float *ref = malloc(sizeof(float) * TMAX * (M + 2 * NFF)), *got = malloc(sizeof(float) * TMAX * (M + 2 * NFF));
    assert_true(W && X && ref && got);
    for (int f16 = 0; f16 < 2; f16++) {
        fill(&r, W, (size_t)(M + 2 * NFF) * NIN, 0.05f);
        fill(&r, X, (size_t)TMAX * NIN, 1.0f);
        for (size_t i = 0; i < (size_t)(M + 2 * NFF) * NIN; i++) /* the values the device sees */
            W[i] = f16 ? tern_f16_to_f32(tern_f32_to_f16(W[i])) : tern_bf16_to_f32(tern_f32_to_bf16(W[i]));
        for (size_t i = 0; i < (size_t)TMAX * NIN; i++)
            X[i] = f16 ? tern_f16_to_f32(tern_f32_to_f16(X[i])) : tern_bf16_to_f32(tern_f32_to_bf16(X[i]));
        uint16_t *dW = lc_half_up(W, (size_t)M * NIN, f16), *dWgu = lc_half_up(W + (size_t)M * NIN,
                                                                                  (size_t)2 * NFF * NIN, f16);
        uint16_t *dX = lc_half_up(X, (size_t)TMAX * NIN, f16);
        float *dY = lc_f32_up(NULL, (size_t)TMAX * M), *dS = lc_f32_up(NULL, (size_t)TMAX * M);
        /* merged q/k/v at T = 128, then every T's rows against it */
        if (cu_lt_matmul(lt, dW, f16, dX, dY, M, NIN, TMAX, 0, &err))
            fail_msg("%s", err.msg);
        assert_int_equal(cudaStreamSynchronize(st), 0);
        assert_int_equal(cudaMemcpy(ref, dY, sizeof(float) * TMAX * M, cudaMemcpyDeviceToHost), 0);
        for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
            if (cu_lt_matmul(lt, dW, f16, dX, dS, M, NIN, Ts[ti], 0, &err))
                fail_msg("%s", err.msg);
            assert_int_equal(cudaStreamSynchronize(st), 0);
            assert_int_equal(cudaMemcpy(got, dS, sizeof(float) * Ts[ti] * M, cudaMemcpyDeviceToHost), 0);
            if (memcmp(got, ref, sizeof(float) * Ts[ti] * M))
                fail_msg("%s merged q/k/v GEMM (%d rows): tokens of T = %d differ from T = %d", f16 ? "f16" : "bf16",
                         M, Ts[ti], TMAX);
        }
        /* against a double reference and the three GEMMs a matrix */
        double num = 0, den = 0;
        for (int t = 0; t < TMAX; t++)
            for (int o = 0; o < M; o++) {
                double s = 0;
                for (int i = 0; i < NIN; i++)
                    s += (double)W[(size_t)o * NIN + i] * X[(size_t)t * NIN + i];
                num += (ref[(size_t)t * M + o] - s) * (ref[(size_t)t * M + o] - s);
                den += s * s;
            }
        const double e_ref = sqrt(num / den);
        const int rows[3] = {qd, kvd, kvd}, off[3] = {0, qd, qd + kvd};
        num = den = 0;
        int same = 1;
        for (int k = 0; k < 3; k++) {
            if (cu_lt_matmul(lt, dW + (size_t)off[k] * NIN, f16, dX, dS, rows[k], NIN, TMAX, 0, &err))
                fail_msg("%s", err.msg);
            assert_int_equal(cudaStreamSynchronize(st), 0);
            assert_int_equal(cudaMemcpy(got, dS, sizeof(float) * TMAX * rows[k], cudaMemcpyDeviceToHost), 0);
            for (int t = 0; t < TMAX; t++)
                for (int o = 0; o < rows[k]; o++) {
                    const float a = got[(size_t)t * rows[k] + o], b = ref[(size_t)t * M + off[k] + o];
                    same &= !memcmp(&a, &b, sizeof a);
                    num += ((double)a - b) * ((double)a - b);
                    den += (double)b * b;
                }
        }
        const double e_sep = sqrt(num / den);
        print_message("merged q/k/v GEMM %s (%d x %d): T = 1..128 bitwise per token; rel %.3g to double, %.3g to "
                      "a GEMM a matrix (%s)\n",
                      f16 ? "f16" : "bf16", M, NIN, e_ref, e_sep, same ? "bitwise" : "not bitwise");
        if (!(e_ref < 1e-5) || !(e_sep < 1e-5))
            fail_msg("merged q/k/v GEMM: rel %g to double, %g to the separate GEMMs", e_ref, e_sep);

        /* tcu_qkv_post: merged rows (ld, q_out) against the three buffers */
        float bias[512], nq[HD], nk[HD], invf[HD / 2];
        fill(&r, bias, (size_t)M, 0.5f);
        for (int e = 0; e < HD; e++) {
            nq[e] = 1.0f + 0.25f * (tern_rng_f32(&r) - 0.5f);
            nk[e] = 1.0f + 0.25f * (tern_rng_f32(&r) - 0.5f);
        }
        for (int e = 0; e < HD / 2; e++)
            invf[e] = powf(10000.0f, -2.0f * e / HD);
        int32_t hin[3 * QT];
        for (int i = 0; i < QT; i++) {
            hin[i] = 3 + 2 * i;        /* pos, within each token's own block */
            hin[QT + i] = i;           /* bt_off */
            hin[2 * QT + i] = QT - 1 - i; /* blk */
        }
        int32_t *din = NULL;
        assert_int_equal(cudaMalloc((void **)&din, sizeof hin), 0);
        assert_int_equal(cudaMemcpy(din, hin, sizeof hin, cudaMemcpyHostToDevice), 0);
        float *dbias = lc_f32_up(bias, (size_t)M), *dnq = lc_f32_up(nq, HD), *dnk = lc_f32_up(nk, HD),
              *dinv = lc_f32_up(invf, HD / 2);
        const size_t pool = (size_t)QT * BS * kvd;
        float *kv1 = lc_f32_up(NULL, 2 * pool), *kv2 = lc_f32_up(NULL, 2 * pool), *dQ = lc_f32_up(NULL, (size_t)QT * M),
              *dQ2 = lc_f32_up(NULL, (size_t)QT * qd);
        assert_int_equal(cudaMemcpy2D(dQ, sizeof(float) * qd, dY, sizeof(float) * M, sizeof(float) * qd, QT,
                                      cudaMemcpyDeviceToDevice), 0);
        assert_int_equal(cudaMemcpy2D(dQ + (size_t)QT * qd, sizeof(float) * kvd, dY + qd, sizeof(float) * M,
                                      sizeof(float) * kvd, QT, cudaMemcpyDeviceToDevice), 0);
        assert_int_equal(cudaMemcpy2D(dQ + (size_t)QT * (qd + kvd), sizeof(float) * kvd, dY + qd + kvd,
                                      sizeof(float) * M, sizeof(float) * kvd, QT, cudaMemcpyDeviceToDevice), 0);
        for (int norm = 0; norm < 2; norm++) {
            tcu_qkv_args a;
            memset(&a, 0, sizeof a);
            a.q = dQ;
            a.k = dQ + (size_t)QT * qd;
            a.v = dQ + (size_t)QT * (qd + kvd);
            a.bq = dbias;
            a.bk = dbias + qd;
            a.bv = dbias + qd + kvd;
            a.qn = norm ? dnq : NULL;
            a.kn = norm ? dnk : NULL;
            a.inv_freq = dinv;
            a.pos = din;
            a.bt_off = din + QT;
            a.blk = din + 2 * QT;
            a.kv.k = kv1;
            a.kv.v = kv1 + pool;
            a.kv.n_blocks = QT;
            a.kv.block_size = BS;
            a.kv.kv_dim = kvd;
            a.T = QT;
            a.n_head = NH;
            a.n_kv_head = NKV;
            a.hd = HD;
            a.eps = 1e-5f;
            tcu_qkv_args b = a;
            b.q = dY;
            b.k = dY + qd;
            b.v = dY + qd + kvd;
            b.ld = M;
            b.q_out = dQ2;
            b.kv.k = kv2;
            b.kv.v = kv2 + pool;
            if (norm) { /* the second pass on the first's outputs: fresh copies of the rows */
                if (cu_lt_matmul(lt, dW, f16, dX, dY, M, NIN, QT, 0, &err))
                    fail_msg("%s", err.msg);
                assert_int_equal(cudaStreamSynchronize(st), 0);
                assert_int_equal(cudaMemcpy2D(dQ, sizeof(float) * qd, dY, sizeof(float) * M, sizeof(float) * qd, QT,
                                              cudaMemcpyDeviceToDevice), 0);
                assert_int_equal(cudaMemcpy2D(dQ + (size_t)QT * qd, sizeof(float) * kvd, dY + qd, sizeof(float) * M,
                                              sizeof(float) * kvd, QT, cudaMemcpyDeviceToDevice), 0);
                assert_int_equal(cudaMemcpy2D(dQ + (size_t)QT * (qd + kvd), sizeof(float) * kvd, dY + qd + kvd,
                                              sizeof(float) * M, sizeof(float) * kvd, QT, cudaMemcpyDeviceToDevice), 0);
            }
            const int c0 = tcu_cat_launches();
            assert_int_equal(tcu_qkv_post(&a, NULL, (tcu_stream)st), 0);
            assert_int_equal(tcu_qkv_post(&b, NULL, (tcu_stream)st), 0);
            assert_int_equal(cudaStreamSynchronize(st), 0);
            assert_int_equal(tcu_cat_launches(), c0 + 1);
            if (!lc_same(dQ, dQ2, sizeof(float) * QT * qd) || !lc_same(kv1, kv2, sizeof(float) * 2 * pool))
                fail_msg("tcu_qkv_post on merged rows (ld %d) differs from the three buffers' (%s, norms %d)", M,
                         f16 ? "f16" : "bf16", norm);
            tcu_qkv_args bad = b;
            bad.q_out = NULL; /* ld without q_out: refused */
            assert_int_not_equal(tcu_qkv_post(&bad, NULL, (tcu_stream)st), 0);
        }
        print_message("tcu_qkv_post on merged rows = on the three buffers, bitwise (q, K/V; biases, norms, RoPE)\n");
        cudaFree(din);
        cudaFree(dbias);
        cudaFree(dnq);
        cudaFree(dnk);
        cudaFree(dinv);
        cudaFree(kv1);
        cudaFree(kv2);
        cudaFree(dQ);
        cudaFree(dQ2);

        /* gate/up: one GEMM of 2 n_ff rows, then tcu_glu_half on its rows */
        const int T = 37;
        float *dGU = lc_f32_up(NULL, (size_t)T * 2 * NFF), *dG = lc_f32_up(NULL, (size_t)T * NFF),
              *dU = lc_f32_up(NULL, (size_t)T * NFF), *dR = lc_f32_up(NULL, (size_t)T * NFF),
              *dA = lc_f32_up(NULL, (size_t)T * NFF);
        uint16_t *dH1 = NULL, *dH2 = NULL;
        assert_int_equal(cudaMalloc((void **)&dH1, sizeof(uint16_t) * T * NFF), 0);
        assert_int_equal(cudaMalloc((void **)&dH2, sizeof(uint16_t) * T * NFF), 0);
        if (cu_lt_matmul(lt, dWgu, f16, dX, dGU, 2 * NFF, NIN, T, 0, &err))
            fail_msg("%s", err.msg);
        assert_int_equal(cudaStreamSynchronize(st), 0); /* (the copies below run on the legacy stream) */
        for (int gelu = 0; gelu < 2; gelu++) {
            assert_int_equal(cudaMemcpy2D(dG, sizeof(float) * NFF, dGU, sizeof(float) * 2 * NFF, sizeof(float) * NFF,
                                          T, cudaMemcpyDeviceToDevice), 0);
            assert_int_equal(cudaMemcpy2D(dU, sizeof(float) * NFF, dGU + NFF, sizeof(float) * 2 * NFF,
                                          sizeof(float) * NFF, T, cudaMemcpyDeviceToDevice), 0);
            assert_int_equal(cudaMemcpy(dR, dG, sizeof(float) * T * NFF, cudaMemcpyDeviceToDevice), 0);
            const int c0 = tcu_cat_launches();
            assert_int_equal(tcu_glu(dR, dU, (long)T * NFF, gelu, NULL, (tcu_stream)st), 0);
            assert_int_equal(tcu_glu_half(dG, dG, dU, NFF, dH1, T, NFF, gelu, f16, NULL, (tcu_stream)st), 0);
            assert_int_equal(tcu_glu_half(dA, dGU, dGU + NFF, 2 * NFF, dH2, T, NFF, gelu, f16, NULL, (tcu_stream)st),
                             0);
            assert_int_equal(cudaStreamSynchronize(st), 0);
            assert_int_equal(tcu_cat_launches(), c0 + 1);
            if (!lc_same(dR, dG, sizeof(float) * T * NFF) || !lc_same(dA, dG, sizeof(float) * T * NFF) ||
                !lc_same(dH1, dH2, sizeof(uint16_t) * T * NFF))
                fail_msg("tcu_glu_half on [T][2 n_ff] rows differs from the two buffers' (%s, gelu %d)",
                         f16 ? "f16" : "bf16", gelu);
            /* no f32 output: the same 16-bit copy */
            assert_int_equal(cudaMemset(dH1, 0, sizeof(uint16_t) * T * NFF), 0);
            assert_int_equal(tcu_glu_half(NULL, dGU, dGU + NFF, 2 * NFF, dH1, T, NFF, gelu, f16, NULL, (tcu_stream)st),
                             0);
            assert_int_equal(cudaStreamSynchronize(st), 0);
            if (!lc_same(dH1, dH2, sizeof(uint16_t) * T * NFF))
                fail_msg("tcu_glu_half without the f32 output: another 16-bit copy");
            /* the 16-bit copy is the f32 result rounded */
            float *a = malloc(sizeof(float) * T * NFF);
            uint16_t *h = malloc(sizeof(uint16_t) * T * NFF);
            assert_true(a && h);
            assert_int_equal(cudaMemcpy(a, dA, sizeof(float) * T * NFF, cudaMemcpyDeviceToHost), 0);
            assert_int_equal(cudaMemcpy(h, dH2, sizeof(uint16_t) * T * NFF, cudaMemcpyDeviceToHost), 0);
            for (int i = 0; i < T * NFF; i++)
                if (h[i] != (f16 ? tern_f32_to_f16(a[i]) : tern_f32_to_bf16(a[i])))
                    fail_msg("tcu_glu_half: element %d's 16-bit copy is not its f32 value rounded", i);
            free(a);
            free(h);
        }
        print_message("tcu_glu_half on merged gate/up rows = on two buffers = tcu_glu, bitwise (SiLU, GELU)\n");
        cudaFree(dGU);
        cudaFree(dG);
        cudaFree(dU);
        cudaFree(dR);
        cudaFree(dA);
        cudaFree(dH1);
        cudaFree(dH2);
        cudaFree(dW);
        cudaFree(dWgu);
        cudaFree(dX);
        cudaFree(dY);
        cudaFree(dS);
    }
    free(W);
    free(X);
    free(ref);
    free(got);
    cu_lt_free(lt);
    cudaStreamDestroy(st);
}

/* cuBLASLt with each shape's split-K (tcu_opts.lt_splitk) at shapes the
 * heuristic may split (8B's o and down, gpt-oss-20b's o and down): every
 * T's rows the same bits as T = 512's, written and accumulated into (the
 * residual adds), and within 5e-5 of the unsplit product (f32 sums of
 * 14336 terms in another order). */
static void test_lt_splitk(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    enum { TMAX = 512 };
    const int shapes[][2] = {{4096, 4096}, {4096, 14336}, {2880, 4096}, {2880, 2880}},
              Ts[] = {1, 2, 3, 8, 17, 32, 64, 100, 128, 512};
    tern_rng r;
    tern_rng_seed(&r, 2028, 3);
    assert_int_equal(cudaSetDevice(0), 0);
    cudaStream_t st;
    assert_int_equal(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), 0);
    tern_err err = {0};
    cu_lt *lt = NULL, *lt0 = NULL;
    if (cu_lt_new(&lt, st, 1, &err) || cu_lt_new(&lt0, st, 0, &err))
        fail_msg("%s", err.msg);
    int split = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int M = shapes[si][0], K = shapes[si][1];
        const int sk = cu_lt_splitk(lt, M, K, 0);
        print_message("cuBLASLt %d x %d: split-K %d\n", M, K, sk);
        split |= sk > 1;
        float *W = malloc(sizeof(float) * (size_t)M * K), *X = malloc(sizeof(float) * TMAX * K);
        float *Y0 = malloc(sizeof(float) * TMAX * M), *ref = malloc(sizeof(float) * TMAX * M),
              *refa = malloc(sizeof(float) * TMAX * M), *got = malloc(sizeof(float) * TMAX * M);
        assert_true(W && X && Y0 && ref && refa && got);
        fill(&r, W, (size_t)M * K, 0.05f);
        fill(&r, X, (size_t)TMAX * K, 1.0f);
        fill(&r, Y0, (size_t)TMAX * M, 1.0f);
        uint16_t *dW = lc_half_up(W, (size_t)M * K, 0), *dX = lc_half_up(X, (size_t)TMAX * K, 0);
        float *dY = lc_f32_up(NULL, (size_t)TMAX * M);
        for (int acc = 0; acc < 2; acc++)
            for (int ti = (int)(sizeof Ts / sizeof *Ts) - 1; ti >= 0; ti--) {
                const int T = Ts[ti];
                assert_int_equal(cudaMemcpy(dY, Y0, sizeof(float) * TMAX * M, cudaMemcpyHostToDevice), 0);
                if (cu_lt_matmul(lt, dW, 0, dX, dY, M, K, T, acc, &err))
                    fail_msg("%s", err.msg);
                assert_int_equal(cudaStreamSynchronize(st), 0);
                float *dst = T == TMAX ? (acc ? refa : ref) : got;
                assert_int_equal(cudaMemcpy(dst, dY, sizeof(float) * T * M, cudaMemcpyDeviceToHost), 0);
                if (T < TMAX && memcmp(got, acc ? refa : ref, sizeof(float) * T * M))
                    fail_msg("%d x %d split-K %d%s: the rows of T = %d differ from T = %d's", M, K, sk,
                             acc ? " accumulated" : "", T, TMAX);
            }
        if (cu_lt_matmul(lt0, dW, 0, dX, dY, M, K, TMAX, 0, &err))
            fail_msg("%s", err.msg);
        assert_int_equal(cudaStreamSynchronize(st), 0);
        assert_int_equal(cudaMemcpy(got, dY, sizeof(float) * TMAX * M, cudaMemcpyDeviceToHost), 0);
        double num = 0, den = 0;
        for (size_t i = 0; i < (size_t)TMAX * M; i++) {
            num += ((double)ref[i] - got[i]) * ((double)ref[i] - got[i]);
            den += (double)got[i] * got[i];
        }
        print_message("  split against unsplit: rel err %.3g\n", sqrt(num / den));
        assert_true(sqrt(num / den) < 5e-5);
        cudaFree(dW);
        cudaFree(dX);
        cudaFree(dY);
        free(W);
        free(X);
        free(Y0);
        free(ref);
        free(refa);
        free(got);
    }
    assert_true(split); /* else the test checks nothing new */
    cu_lt_free(lt);
    cu_lt_free(lt0);
    cudaStreamDestroy(st);
}
#else
static void test_lt_cat(void **state)
{
    (void)state;
    skip();
}
static void test_lt_splitk(void **state)
{
    (void)state;
    skip();
}
#endif

static void test_attention(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    tern_err err = {0};
    /* the tiled prefill kernels: [1] f32, [2] TF32 tensor cores (TCU_ATTN_TILED_*) */
    model_backend *cpu = model_backend_cpu_new(2, &err), *gpus[3] = {NULL, gpu_new(-1, 1), gpu_new(-1, 2)};
    tern_rng r;
    tern_rng_seed(&r, 99, 2);
    const int hds[] = {64, 128, 256};
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++) {
        int hd = hds[hi], n_head = 8, n_kv = 2, n_layer = 2;
        kv_pool kv;
        assert_int_equal(kv_pool_init(&kv, n_layer, n_kv * hd, 16, 96, &err), 0);
        fill(&r, kv.k, (size_t)n_layer * 96 * 16 * n_kv * hd, 1.0f);
        fill(&r, kv.v, (size_t)n_layer * 96 * 16 * n_kv * hd, 1.0f);
        kv_seq s[3] = {{0}};
        /* interleaved reservations so block tables are not contiguous */
        int lens[3] = {5, 141, 700};
        for (int step = 1; step <= 44; step++)
            for (int i = 0; i < 3; i++) {
                int want = lens[i] * step / 44;
                if (want > 0)
                    assert_int_equal(kv_seq_reserve(&kv, &s[i], want, &err), 0);
            }
        /* batch: seq0 at 4, seq1 at 30..36 (a prefill chunk), seq2 at 699;
         * then the same with seq1 at 30..140: 113 tokens, the tiled
         * prefill kernel (two tiles of seq1, one of 47) */
        for (int big = 0; big < 2; big++) {
            int32_t pos[120];
            kv_seq *seqs[120];
            int T = 0;
            pos[T] = 4;
            seqs[T++] = &s[0];
            for (int p = 30; p <= (big ? 140 : 36); p++) {
                pos[T] = p;
                seqs[T++] = &s[1];
            }
            pos[T] = 699;
            seqs[T++] = &s[2];
            fwd_batch b = {T, NULL, pos, seqs, 0, NULL};
            size_t qn = (size_t)T * n_head * hd;
            float *q = malloc(qn * sizeof(float)), *oc = malloc(qn * sizeof(float)), *og = malloc(qn * sizeof(float));
            fill(&r, q, qn, 1.0f);
            /* sinks (gpt_oss): 1 - a logit a head in [-3, 3], 2 - 30 a
             * head, above every score (the maximum is the sink's) */
            const struct {
                int window;
                float softcap;
                int sinks;
            } modes[] = {{0, 0.0f, 0}, {20, 0.0f, 0}, {0, 5.0f, 0}, {300, 50.0f, 0},
                         {0, 0.0f, 1}, {20, 0.0f, 2}, {300, 50.0f, 1}};
            float sinks[2][8];
            for (int h = 0; h < n_head; h++) {
                sinks[0][h] = 6.0f * tern_rng_f32(&r) - 3.0f;
                sinks[1][h] = 30.0f;
            }
            /* the big batch takes the tiled kernels: tensor cores (TF32
             * inputs, tolerance 3e-3) and f32 (2e-5) */
            for (int tm = big ? 1 : 2; tm <= 2; tm++)
            for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
                model_backend *gpu = gpus[tm];
                const double tol = big && tm == 2 ? 3e-3 : 2e-5;
                for (size_t e = 0; e < qn; e++)
                    og[e] = NAN;
                model_attn a = {&kv, &b, 1, n_head, n_kv, hd, modes[mi].window, 1.0f / sqrtf((float)hd), modes[mi].softcap,
                                q, oc, modes[mi].sinks ? sinks[modes[mi].sinks - 1] : NULL};
                assert_int_equal(cpu->attention(cpu, &a, &err), 0);
                a.out = og;
                if (gpu->attention(gpu, &a, &err))
                    fail_msg("%s", err.msg);
                double e = rel_err(og, oc, qn);
                print_message("attention hd %d T %d%s window %d softcap %g%s: rel err %.3g (tol %g)\n", hd, T,
                              !big ? "" : tm == 1 ? " tiled f32" : " tiled tf32", modes[mi].window, modes[mi].softcap,
                              modes[mi].sinks == 1 ? " sinks" : modes[mi].sinks == 2 ? " sinks above every score" : "",
                              e, tol);
                if (!(e <= tol))
                    fail_msg("attention hd %d T %d kernel %d mode %zu: relative error %g", hd, T, tm, mi, e);
            }
            free(q);
            free(oc);
            free(og);
        }
        for (int i = 0; i < 3; i++)
            kv_seq_free(&kv, &s[i]);
        kv_pool_free(&kv);
    }
    gpus[1]->free(gpus[1]);
    gpus[2]->free(gpus[2]);
    cpu->free(cpu);
}

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

#include "run_model.h"

/* Two sequences decoding in the same steps (the batched kernels: the
 * tensor-core GEMV, attention split by each token's length - the long one past a split,
 * the q/k/v post-processing fused at two tokens), prompts prefilled in
 * chunks of 25 (the f32-accurate GEMV path); fixed tokens, so that the CPU
 * and the GPU run the same steps. Logits of every decode step into out
 * [n_dec][2][V]. */
static void run_pair(tern_model *m, int n_dec, float *out)
{
    enum { LA = 150, LB = 20 };
    tern_err err = {0};
    kv_pool kv;
    kv_seq sa = {0}, sb = {0};
    const int V = model_config_get(m)->n_vocab;
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 32, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &sa, LA + n_dec, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &sb, LB + n_dec, &err), 0);
    int32_t tok[LA + LB], pos[LA + LB];
    kv_seq *seqs[LA + LB];
    for (int i = 0; i < LA + LB; i++)
        tok[i] = (int32_t)((i * 7919 + 13) % V);
    float *scratch = malloc((size_t)V * sizeof(float));
    assert_non_null(scratch);
    for (int sq = 0; sq < 2; sq++) { /* prompts, chunk by chunk */
        const int len = sq ? LB : LA, at = sq ? LA : 0;
        for (int c0 = 0; c0 < len; c0 += 25) {
            const int n = len - c0 < 25 ? len - c0 : 25;
            for (int i = 0; i < n; i++) {
                pos[i] = c0 + i;
                seqs[i] = sq ? &sb : &sa;
            }
            int32_t last = n - 1;
            fwd_batch b = {n, tok + at + c0, pos, seqs, 1, &last};
            if (model_forward(m, &kv, &b, scratch, &err))
                fail_msg("%s", err.msg);
        }
    }
    for (int s = 0; s < n_dec; s++) {
        int32_t t2[2] = {(int32_t)((s * 31 + 5) % V), (int32_t)((s * 17 + 9) % V)}, p2[2] = {LA + s, LB + s},
                rows[2] = {0, 1};
        kv_seq *q2[2] = {&sa, &sb};
        fwd_batch d = {2, t2, p2, q2, 2, rows};
        if (model_forward(m, &kv, &d, out + (size_t)s * 2 * V, &err))
            fail_msg("%s", err.msg);
    }
    free(scratch);
    kv_seq_free(&kv, &sa);
    kv_seq_free(&kv, &sb);
    kv_pool_free(&kv);
}

/* run_model's logits on the GPU with var=val while the model loads: the
 * same bits as ref? */
static int same_logits_with(const char *mdir, const char *var, const char *val, const int32_t *prompt, int n_prompt,
                            int n_dec, const float *ref)
{
    tern_err err = {0};
    model_load_opts og = {0, "cuda"};
    setenv(var, val, 1);
    tern_model *m = model_load_ex(mdir, &og, &err);
    unsetenv(var);
    if (!m)
        fail_msg("%s", err.msg);
    size_t n = (size_t)(n_dec + 1) * model_config_get(m)->n_vocab;
    float *l = malloc(n * sizeof(float));
    int32_t ids[16];
    assert_non_null(l);
    run_model(m, prompt, n_prompt, n_dec, l, ids);
    const int same = !memcmp(l, ref, n * sizeof(float));
    free(l);
    model_free(m);
    return same;
}

/* check_family's GPU model runs in the throughput mode (--exact-products
 * off): the two-sequence steps are compared too, within tol */
static int g_throughput;

static void check_family(const char *family, const char *extra, int bits, int n_prompt, double tol)
{
    const char *build = getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build";
    const char *bin = getenv("TERN_BIN") ? getenv("TERN_BIN") : "build/tern";
    char dir[] = "/tmp/tern_cuda_XXXXXX";
    assert_non_null(mkdtemp(dir));
    sh("%s/tools/make_fixture --family %s --dim 256 --layers 3 --heads 8 --kv-heads 2 --ff 512 --vocab 512 "
       "--dtype bf16 %s --out %s/m --tokenizer %s >/dev/null",
       build, family, extra, dir, shared_path("models/stories260K"));
    char mdir[256];
    snprintf(mdir, sizeof mdir, "%s/m", dir);
    if (bits < 0) { /* FP8: 128 x 128 block scales */
        sh("%s convert %s/m %s/q --fp8 2>/dev/null", bin, dir, dir);
        snprintf(mdir, sizeof mdir, "%s/q", dir);
    } else if (bits) {
        sh("%s convert %s/m %s/q --bits %d --group-size 64 2>/dev/null", bin, dir, dir, bits);
        snprintf(mdir, sizeof mdir, "%s/q", dir);
    }
    tern_err err = {0};
    model_load_opts oc = {2, "cpu"}, og = {0, "cuda"};
    tern_model *mc = model_load_ex(mdir, &oc, &err), *mg = NULL;
    if (!mc || !(mg = model_load_ex(mdir, &og, &err)))
        fail_msg("%s", err.msg);
    int n_dec = 12, V = model_config_get(mc)->n_vocab;
    int32_t prompt[64], idc[16], idg[16];
    tern_rng r;
    tern_rng_seed(&r, 7, (uint64_t)n_prompt);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(tern_rng_f32(&r) * (V - 1));
    float *lc = malloc((size_t)(n_dec + 1) * V * sizeof(float)), *lg = malloc((size_t)(n_dec + 1) * V * sizeof(float));
    run_model(mc, prompt, n_prompt, n_dec, lc, idc);
    /* GPU on its own greedy path; compare logits along the CPU's tokens too */
    run_model(mg, prompt, n_prompt, n_dec, lg, idg);
    /* decode steps fuse the q/k/v post-processing into the attention
     * (tcu_qkv_attention, the first K/V rows loaded before the wait for
     * the q/k/v product): bit for bit the values of the two launches */
    if (!same_logits_with(mdir, "TERN_CUDA_QKV_FUSE", "0", prompt, n_prompt, n_dec, lg))
        fail_msg("%s: fused q/k/v + attention logits differ from the two launches'", family);
    /* every product's first weights requested before its wait (down by
     * default, tcu_gemv_args.early) against none: the same bits */
    if (!same_logits_with(mdir, "TERN_CUDA_EARLY", "31", prompt, n_prompt, n_dec, lg) ||
        !same_logits_with(mdir, "TERN_CUDA_EARLY", "0", prompt, n_prompt, n_dec, lg))
        fail_msg("%s: logits change with the products' early weight requests", family);
    /* every product's bf16 weights through the shared-memory ring
     * (tcu_gemv_args.ring) against none: the same bits */
#ifdef TERN_CUDA
    const int rings0 = tcu_gemv_ring_count();
    if (!same_logits_with(mdir, "TERN_CUDA_RING", "31", prompt, n_prompt, n_dec, lg) ||
        !same_logits_with(mdir, "TERN_CUDA_RING", "0", prompt, n_prompt, n_dec, lg))
        fail_msg("%s: logits change with the shared-memory weight ring", family);
    if (!bits && g_throughput && tcu_gemv_ring_count() == rings0) /* exact products take no ring */
        fail_msg("%s: no product took the shared-memory ring", family);
#endif
    if (tol < 1e-3 || g_throughput) { /* two sequences a step, against the CPU doing the same */
        const int nd = 6;
        float *pc = malloc((size_t)nd * 2 * V * sizeof(float)), *pg = malloc((size_t)nd * 2 * V * sizeof(float));
        assert_true(pc && pg);
        run_pair(mc, nd, pc);
        run_pair(mg, nd, pg);
        double ep = rel_err(pg, pc, (size_t)nd * 2 * V);
        print_message("  two sequences a step (positions 150+ and 20+), %d steps: rel err %.3g\n", nd, ep);
        if (!(ep <= tol))
            fail_msg("%s: batched decode logits relative error %g over %g", family, ep, tol);
        free(pc);
        free(pg);
    }
    double e = rel_err(lg, lc, (size_t)V); /* prefill logits */
    int same = !memcmp(idc, idg, sizeof(int32_t) * n_dec);
    print_message("forward %s %s bits %d prompt %d: prefill rel err %.3g, greedy ids %s\n", family, extra, bits,
                  n_prompt, e, same ? "identical" : "differ");
    if (!(e <= tol))
        fail_msg("%s: prefill logits relative error %g over %g", family, e, tol);
    if (same) {
        double ed = rel_err(lg, lc, (size_t)(n_dec + 1) * V);
        print_message("  all %d steps: rel err %.3g\n", n_dec + 1, ed);
        if (!(ed <= tol))
            fail_msg("%s: decode logits relative error %g over %g", family, ed, tol);
    } else if (tol < 1e-3) {
        fail_msg("%s: greedy ids differ on an f32-accumulated path", family);
    }
    free(lc);
    free(lg);
    model_free(mc);
    model_free(mg);
    sh("rm -rf %s", dir);
}

#ifdef TERN_CUDA
/* out = (x * r) * g, r = 1 / sqrt(mean(x^2) + eps): one row of n, the
 * fused norm as the kernels round it */
static void norm_row_ref(const float *x, const float *g, int n, float eps, float *out)
{
    double ss = 0;
    for (int e = 0; e < n; e++)
        ss += (double)x[e] * x[e];
    const float rn = (float)(1.0 / sqrt(ss / n + eps));
    for (int e = 0; e < n; e++)
        out[e] = (x[e] * rn) * g[e];
}
#endif

/* The default 4-bit GEMV picks its rows per warp by shape (and, at T = 1,
 * 3 on norm-fused launches with >= 16 rows per SM, 6 with >= 200): those
 * launches against the CPU on the norm's output, and each token alone
 * bit-identical to its row of a 3-token batch (the 8-token tile, 4 or 2
 * rows a warp). test_matmul's products are too small and unnormed to
 * reach them. */
static void test_gemv_rows_by_shape(void **state)
{
    (void)state;
#ifdef TERN_CUDA
    if (!have_gpu())
        skip();
    tern_err err = {0};
    model_backend *cpu = model_backend_cpu_new(2, &err);
    assert_non_null(cpu);
    tern_rng r;
    tern_rng_seed(&r, 99, 1);
    int n_sm = 0;
    assert_int_equal(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0), 0);
    const int n_in = 256, T = 3, group = 64;
    const float eps = 1e-5f;
    const int shapes[2] = {16 * n_sm + 5, 200 * n_sm + 3};
    const tcu_opts o = opts_gemv(TCU_GEMV_BY_SHAPE);
    for (int si = 0; si < 2; si++) {
        const int rows = shapes[si];
        test_w tw;
        make_weight(&r, &tw, 4, rows, n_in, group);
        float *x = malloc((size_t)T * n_in * sizeof(float)), *g = malloc(n_in * sizeof(float));
        float *xn = malloc((size_t)T * n_in * sizeof(float)), *yc = malloc((size_t)T * rows * sizeof(float));
        float *yb = malloc((size_t)T * rows * sizeof(float)), *y1 = malloc((size_t)rows * sizeof(float));
        assert_true(x && g && xn && yc && yb && y1);
        fill(&r, x, (size_t)T * n_in, 1.0f);
        fill(&r, g, n_in, 1.0f);
        for (int t = 0; t < T; t++)
            norm_row_ref(x + (size_t)t * n_in, g, n_in, eps, xn + (size_t)t * n_in);
        const model_weight *w = &tw.w;
        assert_int_equal(cpu->matmul(cpu, 1, &w, xn, &yc, T, &err), 0);

        void *dw;
        float *dsb, *dx, *dg, *dy, *dn;
        const size_t wbytes = (size_t)rows * n_in / 2, sbn = (size_t)rows * (n_in / group) * 2;
        assert_int_equal(cudaMalloc(&dw, wbytes), 0);
        assert_int_equal(cudaMalloc((void **)&dsb, sbn * sizeof(float)), 0);
        assert_int_equal(cudaMalloc((void **)&dx, (size_t)T * n_in * sizeof(float)), 0);
        assert_int_equal(cudaMalloc((void **)&dg, n_in * sizeof(float)), 0);
        assert_int_equal(cudaMalloc((void **)&dy, (size_t)T * rows * sizeof(float)), 0);
        assert_int_equal(cudaMalloc((void **)&dn, (size_t)T * n_in * sizeof(float)), 0);
        assert_int_equal(cudaMemcpy(dw, tw.buf, wbytes, cudaMemcpyHostToDevice), 0);
        assert_int_equal(cudaMemcpy(dsb, tw.w.sb, sbn * sizeof(float), cudaMemcpyHostToDevice), 0);
        assert_int_equal(cudaMemcpy(dx, x, (size_t)T * n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
        assert_int_equal(cudaMemcpy(dg, g, n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
        tcu_gemv_args a;
        memset(&a, 0, sizeof a);
        a.n = 1;
        a.m[0] = (tcu_mat){dw, dsb, dy, rows, TCU_Q4, group};
        a.x = dx;
        a.n_in = n_in;
        a.T = T;
        a.norm_g = dg;
        a.norm_out = dn;
        a.norm_eps = eps;
        assert_int_equal(tcu_gemv(&a, &o, NULL), 0);
        assert_int_equal(cudaMemcpy(yb, dy, (size_t)T * rows * sizeof(float), cudaMemcpyDeviceToHost), 0);
        const double e = rel_err(yb, yc, (size_t)T * rows);
        print_message("4-bit GEMV by shape, %d rows, fused norm, T %d: rel err %.3g (tol 2e-5)\n", rows, T, e);
        assert_true(e <= 2e-5);
        for (int t = 0; t < T; t++) {
            a.T = 1;
            a.x = dx + (size_t)t * n_in;
            assert_int_equal(tcu_gemv(&a, &o, NULL), 0);
            assert_int_equal(cudaMemcpy(y1, dy, (size_t)rows * sizeof(float), cudaMemcpyDeviceToHost), 0);
            assert_memory_equal(y1, yb + (size_t)t * rows, (size_t)rows * sizeof(float));
        }
        cudaFree(dw);
        cudaFree(dsb);
        cudaFree(dx);
        cudaFree(dg);
        cudaFree(dy);
        cudaFree(dn);
        free(x);
        free(g);
        free(xn);
        free(yc);
        free(yb);
        free(y1);
        free_weight(&tw);
    }
    cpu->free(cpu);
#else
    skip();
#endif
}

/* The shared-memory ring GEMV (tcu_gemv_args.ring: one token, bf16) sums
 * each row as TCU_GEMV_STAGED does: the same bits, on shapes whose blocks wrap
 * the ring several times (q/k/v-like rows across three matrices with a
 * fused norm over a gathered row, a SwiGLU and a GELU pair, a down
 * product accumulating into its output), and near a double reference; a
 * launch too wide for its 8 slots keeps the register kernel. */
static void test_gemv_ring(void **state)
{
    (void)state;
#ifdef TERN_CUDA
    if (!have_gpu())
        skip();
    tern_rng r;
    tern_rng_seed(&r, 4242, 1);
    const struct {
        int n_in, n, glu, norm, acc, rows[3], takes; /* takes: the ring has room for its 8 slots */
    } cases[] = {
        {4096, 3, 0, 1, 0, {4096, 1024, 1024}, 1},
        {4096, 2, 1, 1, 0, {14336, 14336, 0}, 1},
        {2048, 2, 2, 1, 0, {1500, 1500, 0}, 1},
        {8192, 1, 0, 0, 1, {1500, 0, 0}, 1},
        {512, 1, 0, 0, 0, {77, 0, 0}, 1},
        {14336, 1, 0, 0, 1, {600, 0, 0}, 0}, /* 8B down: the register kernel */
    };
    const size_t ncase = sizeof cases / sizeof *cases;
    for (size_t cj = 0; cj < 2 * ncase; cj++) { /* bf16, then FP8 with 128 x 128 block scales */
        const size_t ci = cj % ncase;
        const int f8 = cj >= ncase;
        const int n_in = cases[ci].n_in, n = cases[ci].n, glu = cases[ci].glu;
        const int xrow = 1; /* the norm reads row 1 of two */
        float *x = malloc(2 * (size_t)n_in * sizeof(float)), *g = malloc((size_t)n_in * sizeof(float));
        float *xn = malloc((size_t)n_in * sizeof(float));
        assert_true(x && g && xn);
        fill(&r, x, 2 * (size_t)n_in, 1.0f);
        fill(&r, g, (size_t)n_in, 1.0f);
        if (cases[ci].norm)
            norm_row_ref(x + (size_t)xrow * n_in, g, n_in, 1e-5f, xn);
        else
            memcpy(xn, x + (size_t)xrow * n_in, (size_t)n_in * sizeof(float));
        tcu_gemv_args a;
        memset(&a, 0, sizeof a);
        a.n = n;
        a.n_in = n_in;
        a.T = 1;
        a.glu = glu;
        a.accumulate = cases[ci].acc;
        float *dx, *dg, *dn;
        int32_t *drow;
        assert_int_equal(cudaMalloc((void **)&dx, 2 * (size_t)n_in * sizeof(float)), 0);
        assert_int_equal(cudaMalloc((void **)&dg, (size_t)n_in * sizeof(float)), 0);
        assert_int_equal(cudaMalloc((void **)&dn, (size_t)n_in * sizeof(float)), 0);
        assert_int_equal(cudaMalloc((void **)&drow, sizeof(int32_t)), 0);
        assert_int_equal(cudaMemcpy(dx, x, 2 * (size_t)n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
        assert_int_equal(cudaMemcpy(dg, g, (size_t)n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
        assert_int_equal(cudaMemcpy(drow, &xrow, sizeof(int32_t), cudaMemcpyHostToDevice), 0);
        a.x = cases[ci].norm ? dx : dx + (size_t)xrow * n_in;
        if (cases[ci].norm) {
            a.norm_g = dg;
            a.norm_out = dn;
            a.norm_eps = 1e-5f;
            a.norm_rows = drow;
        }
        test_w tw[3];
        double *ref[3];
        float *y0[3] = {NULL, NULL, NULL};
        for (int k = 0; k < n; k++) {
            const int rows = cases[ci].rows[k];
            const size_t nw = (size_t)rows * n_in;
            make_weight(&r, &tw[k], f8 ? 3 : 1, rows, n_in, f8 ? 128 : 0);
            const uint16_t *hw = tw[k].buf;
            const uint8_t *h8 = tw[k].buf;
            const int ncol = (n_in + 127) / 128;
            ref[k] = malloc((size_t)rows * sizeof(double));
            y0[k] = malloc((size_t)rows * sizeof(float));
            assert_true(ref[k] && y0[k]);
            fill(&r, y0[k], (size_t)rows, 1.0f); /* what an accumulating product adds to */
            for (int o = 0; o < rows; o++) {
                double d = 0.0;
                for (int i = 0; i < n_in; i++)
                    d += (f8 ? (double)tern_f8e4m3_to_f32(h8[(size_t)o * n_in + i]) *
                                   tw[k].w.fs[(o / 128) * ncol + i / 128]
                             : (double)tern_bf16_to_f32(hw[(size_t)o * n_in + i])) *
                         xn[i];
                ref[k][o] = d;
            }
            void *dw;
            float *dy, *dsb = NULL;
            const size_t wb = nw * (f8 ? 1 : sizeof(uint16_t));
            assert_int_equal(cudaMalloc(&dw, wb), 0);
            assert_int_equal(cudaMalloc((void **)&dy, (size_t)rows * sizeof(float)), 0);
            assert_int_equal(cudaMemcpy(dw, tw[k].buf, wb, cudaMemcpyHostToDevice), 0);
            if (f8) { /* the backend's device layout: a {scale, 0} pair a row and column block */
                float *sb = calloc((size_t)rows * ncol * 2, sizeof(float));
                assert_non_null(sb);
                for (int o = 0; o < rows; o++)
                    for (int c = 0; c < ncol; c++)
                        sb[((size_t)o * ncol + c) * 2] = tw[k].w.fs[(o / 128) * ncol + c];
                assert_int_equal(cudaMalloc((void **)&dsb, (size_t)rows * ncol * 2 * sizeof(float)), 0);
                assert_int_equal(
                    cudaMemcpy(dsb, sb, (size_t)rows * ncol * 2 * sizeof(float), cudaMemcpyHostToDevice), 0);
                free(sb);
            }
            a.m[k] = (tcu_mat){dw, dsb, dy, rows, f8 ? TCU_F8 : TCU_BF16, f8 ? 128 : 0};
        }
        const int rows0 = cases[ci].rows[0];
        float *yv[2][3];
        const tcu_opts o = opts_gemv(TCU_GEMV_STAGED);
        for (int ring = 0; ring < 2; ring++) {
            a.ring = ring;
            for (int k = 0; k < n; k++)
                assert_int_equal(cudaMemcpy(a.m[k].y, y0[k], (size_t)a.m[k].n_out * sizeof(float),
                                            cudaMemcpyHostToDevice), 0);
            const int before = tcu_gemv_ring_count();
            assert_int_equal(tcu_gemv(&a, &o, NULL), 0);
            assert_int_equal(cudaDeviceSynchronize(), 0);
            const int took = tcu_gemv_ring_count() - before, want = ring && cases[ci].takes;
            if (took != want)
                fail_msg("case %zu: the ring was %s", ci, want ? "not taken" : "taken for a too wide row");
            for (int k = 0; k < (glu ? 1 : n); k++) {
                yv[ring][k] = malloc((size_t)a.m[k].n_out * sizeof(float));
                assert_non_null(yv[ring][k]);
                assert_int_equal(cudaMemcpy(yv[ring][k], a.m[k].y, (size_t)a.m[k].n_out * sizeof(float),
                                            cudaMemcpyDeviceToHost), 0);
            }
        }
        double num = 0.0, den = 0.0;
        for (int k = 0; k < (glu ? 1 : n); k++) {
            const int rows = a.m[k].n_out;
            assert_memory_equal(yv[0][k], yv[1][k], (size_t)rows * sizeof(float));
            for (int o = 0; o < rows; o++) {
                double want = ref[k][o];
                if (glu) {
                    const double v = ref[0][o], u = ref[1][o];
                    want = (glu == 2 ? 0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
                                     : v / (1.0 + exp(-v))) *
                           u;
                } else if (cases[ci].acc) {
                    want += y0[k][o];
                }
                num += (yv[1][k][o] - want) * (yv[1][k][o] - want);
                den += want * want;
            }
            free(yv[0][k]);
            free(yv[1][k]);
        }
        const double e = sqrt(num / (den > 0 ? den : 1));
        print_message(
            "ring GEMV %s n_in %d, %d rows x %d%s%s%s: same bits as the staged kernel, rel err %.3g (tol 1e-5)\n",
            f8 ? "FP8" : "bf16", n_in, rows0, n, glu ? ", GLU" : "", cases[ci].norm ? ", fused norm" : "", cases[ci].acc ? ", accumulate" : "", e);
        if (!(e <= 1e-5))
            fail_msg("ring GEMV case %zu: relative error %g", ci, e);
        for (int k = 0; k < n; k++) {
            cudaFree((void *)a.m[k].w);
            cudaFree((void *)a.m[k].sb);
            cudaFree(a.m[k].y);
            free_weight(&tw[k]);
            free(ref[k]);
            free(y0[k]);
        }
        cudaFree(dx);
        cudaFree(dg);
        cudaFree(dn);
        cudaFree(drow);
        free(x);
        free(g);
        free(xn);
    }
#else
    skip();
#endif
}

/* The tensor-core GEMV (TCU_GEMV_TENSOR) above one pass of tokens splits
 * the activations once per launch into tcu_gemv_args.stage; without a
 * stage every block splits its own. Both must give the same bits (fused
 * norm over gathered rows, several matrices, the SwiGLU epilogue, launches
 * of 32 / 128 tokens), match the CPU's exact products - exact mode within
 * 2e-5, the throughput mode (activations rounded once to bf16) within the
 * bf16 envelope, 4e-3 - and give each token alone (T = 1: never staged)
 * its row of the batch, bit for bit, in both modes: batches of 2, 8, 32,
 * 100 and 128 in the throughput mode (each an n-tile count of its own). */
static void test_gemv_stage(void **state)
{
    (void)state;
#ifdef TERN_CUDA
    if (!have_gpu())
        skip();
    tern_err err = {0};
    model_backend *cpu = model_backend_cpu_new(2, &err);
    assert_non_null(cpu);
    tern_rng r;
    tern_rng_seed(&r, 4242, 3);
    enum { TMAX = 128 };
    const int n_in = 3584, kinds[2][2] = {{1, 0}, {4, 64}};
    const int Ts[2][5] = {{2, 8, 32, 100, 128}, {3, 20, 40, 0, 0}}; /* throughput, exact */
    const int outs[2] = {200, 136};
    const float eps = 1e-5f;
    float *x = malloc((size_t)TMAX * n_in * sizeof(float)), *g = malloc(n_in * sizeof(float));
    float *xn = malloc((size_t)TMAX * n_in * sizeof(float));
    int32_t rows[TMAX];
    assert_true(x && g && xn);
    fill(&r, x, (size_t)TMAX * n_in, 1.0f);
    fill(&r, g, n_in, 1.0f);
    for (int t = 0; t < TMAX; t++) { /* token t reads x row TMAX - 1 - t */
        rows[t] = TMAX - 1 - t;
        norm_row_ref(x + (size_t)rows[t] * n_in, g, n_in, eps, xn + (size_t)t * n_in);
    }
    float *dx, *dg, *dn, *dy[2];
    int32_t *drows;
    void *stage;
    const size_t stage_bytes = (size_t)n_in * 272; /* 128 tokens a bf16 an input + 4-bit group sums */
    assert_int_equal(cudaMalloc((void **)&dx, (size_t)TMAX * n_in * sizeof(float)), 0);
    assert_int_equal(cudaMalloc((void **)&dg, n_in * sizeof(float)), 0);
    assert_int_equal(cudaMalloc((void **)&dn, (size_t)TMAX * n_in * sizeof(float)), 0);
    assert_int_equal(cudaMalloc((void **)&drows, sizeof rows), 0);
    assert_int_equal(cudaMalloc(&stage, stage_bytes), 0);
    assert_int_equal(cudaMemcpy(dx, x, (size_t)TMAX * n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
    assert_int_equal(cudaMemcpy(dg, g, n_in * sizeof(float), cudaMemcpyHostToDevice), 0);
    assert_int_equal(cudaMemcpy(drows, rows, sizeof rows, cudaMemcpyHostToDevice), 0);
    for (int ki = 0; ki < 2; ki++)
        for (int glu = 0; glu < 2; glu++) {
            const int kind = kinds[ki][0], group = kinds[ki][1], q = kind == 4;
            const int n_out[2] = {outs[0], glu ? outs[0] : outs[1]};
            test_w tw[2];
            void *dw[2];
            float *dsb[2] = {NULL, NULL}, *yc[2], *ys = malloc((size_t)TMAX * (outs[0] + outs[1]) * sizeof(float));
            float *yu = malloc((size_t)TMAX * (outs[0] + outs[1]) * sizeof(float)), *y1 = malloc(outs[0] * sizeof(float));
            assert_true(ys && yu && y1);
            tcu_gemv_args a;
            memset(&a, 0, sizeof a);
            for (int k = 0; k < 2; k++) {
                make_weight(&r, &tw[k], kind, n_out[k], n_in, group);
                const size_t wb = q ? (size_t)n_out[k] * n_in / 2 : (size_t)n_out[k] * n_in * 2;
                const size_t sbn = q ? (size_t)n_out[k] * (n_in / group) * 2 : 0;
                assert_int_equal(cudaMalloc(&dw[k], wb), 0);
                assert_int_equal(cudaMemcpy(dw[k], tw[k].buf, wb, cudaMemcpyHostToDevice), 0);
                if (q) {
                    assert_int_equal(cudaMalloc((void **)&dsb[k], sbn * sizeof(float)), 0);
                    assert_int_equal(cudaMemcpy(dsb[k], tw[k].w.sb, sbn * sizeof(float), cudaMemcpyHostToDevice), 0);
                }
                assert_int_equal(cudaMalloc((void **)&dy[k], (size_t)TMAX * n_out[k] * sizeof(float)), 0);
                a.m[k] = (tcu_mat){dw[k], dsb[k], dy[k], n_out[k], q ? TCU_Q4 : TCU_BF16, group};
                yc[k] = malloc((size_t)TMAX * n_out[k] * sizeof(float));
                assert_non_null(yc[k]);
            }
            const model_weight *w[2] = {&tw[0].w, &tw[1].w};
            assert_int_equal(cpu->matmul(cpu, 2, w, xn, yc, TMAX, &err), 0);
            if (glu)
                for (size_t i = 0; i < (size_t)TMAX * n_out[0]; i++)
                    yc[0][i] = yc[0][i] / (1.0f + expf(-yc[0][i])) * yc[1][i];
            a.n = 2;
            a.glu = glu;
            a.x = dx;
            a.n_in = n_in;
            a.norm_g = dg;
            a.norm_out = dn;
            a.norm_eps = eps;
            a.norm_rows = drows;
            const int nm = glu ? 1 : 2;
            for (int tv = 0; tv < 10; tv++) {
                const int ex = tv / 5, T = Ts[ex][tv % 5];
                if (!T)
                    continue;
                tcu_opts o = opts_gemv(TCU_GEMV_TENSOR);
                o.exact = ex;
                const double tol = ex ? 2e-5 : 4e-3;
                a.T = T;
                for (int st = 0; st < 2; st++) { /* unstaged, then staged */
                    a.stage = st ? stage : NULL;
                    a.stage_bytes = st ? stage_bytes : 0;
                    for (int k = 0; k < 2; k++)
                        assert_int_equal(cudaMemset(dy[k], 0xff, (size_t)TMAX * n_out[k] * sizeof(float)), 0);
                    assert_int_equal(cudaMemset(stage, 0xff, stage_bytes), 0);
                    assert_int_equal(tcu_gemv(&a, &o, NULL), 0);
                    uint32_t first; /* token 0's first hi pair: written by the stage kernel only when staged */
                    assert_int_equal(cudaMemcpy(&first, stage, sizeof first, cudaMemcpyDeviceToHost), 0);
                    /* staged above two tokens (a fused norm) */
                    assert_true(st && T > 2 ? first != 0xffffffffu : first == 0xffffffffu);
                    float *h = st ? ys : yu;
                    for (int k = 0, off = 0; k < nm; off += T * n_out[k], k++)
                        assert_int_equal(cudaMemcpy(h + off, dy[k], (size_t)T * n_out[k] * sizeof(float),
                                                    cudaMemcpyDeviceToHost),
                                         0);
                }
                size_t n = (size_t)T * (glu ? n_out[0] : n_out[0] + n_out[1]);
                double e = 0;
                for (int k = 0, off = 0; k < nm; off += T * n_out[k], k++) {
                    double ek = rel_err(ys + off, yc[k], (size_t)T * n_out[k]);
                    e = ek > e ? ek : e;
                }
                print_message("tensor-core GEMV %s kind %d glu %d T %d: staged = unstaged bitwise, rel err %.3g "
                              "(tol %.0e)\n",
                              ex ? "exact" : "throughput", kind, glu, T, e, tol);
                assert_memory_equal(ys, yu, n * sizeof(float));
                if (!(e <= tol))
                    fail_msg("tensor-core GEMV %s kind %d glu %d T %d: rel err %g over %g", ex ? "exact" : "throughput",
                             kind, glu, T, e, tol);
                /* the first, a middle and the last token alone: their rows of the batch */
                const int probe[3] = {0, T / 2, T - 1};
                for (int pi = 0; pi < 3; pi++) {
                    const int t = probe[pi];
                    tcu_gemv_args b = a;
                    b.T = 1;
                    b.norm_rows = drows + t;
                    assert_int_equal(tcu_gemv(&b, &o, NULL), 0);
                    assert_int_equal(cudaMemcpy(y1, dy[0], n_out[0] * sizeof(float), cudaMemcpyDeviceToHost), 0);
                    if (memcmp(y1, ys + (size_t)t * n_out[0], n_out[0] * sizeof(float)))
                        fail_msg("tensor-core GEMV %s kind %d glu %d: token %d alone differs from its row in a "
                                 "batch of %d",
                                 ex ? "exact" : "throughput", kind, glu, t, T);
                }
            }
            for (int k = 0; k < 2; k++) {
                cudaFree(dw[k]);
                cudaFree(dsb[k]);
                cudaFree(dy[k]);
                free(yc[k]);
                free_weight(&tw[k]);
            }
            free(ys);
            free(yu);
            free(y1);
        }
    cudaFree(dx);
    cudaFree(dg);
    cudaFree(dn);
    cudaFree(drows);
    cudaFree(stage);
    free(x);
    free(g);
    free(xn);
    cpu->free(cpu);
#else
    skip();
#endif
}

/* B sequences (prompts of 20-169 tokens, prefilled one chunk of 25 at a
 * time) decoding n_dec steps together, every row's logits out; sequence
 * 0's logits of each step into out [n_dec][V]. */
/* Sequence 0's decode logits (n_dec steps) in a batch of B sequences; rev:
 * it is the step's last row instead of the first. */
static void run_batch(tern_model *m, int B, int n_dec, float *out, int rev)
{
    tern_err err = {0};
    const int V = model_config_get(m)->n_vocab;
    kv_pool kv;
    kv_seq *sq = calloc((size_t)B, sizeof *sq);
    int32_t *tok = malloc((size_t)B * sizeof(int32_t)), *pos = malloc((size_t)B * sizeof(int32_t)),
            *rows = malloc((size_t)B * sizeof(int32_t));
    kv_seq **sp = malloc((size_t)B * sizeof(kv_seq *));
    float *lg = malloc((size_t)B * V * sizeof(float));
    assert_true(sq && tok && pos && rows && sp && lg);
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, B * 12 + 8, &err), 0);
    for (int i = 0; i < B; i++) {
        const int len = 20 + (i * 37) % 150;
        assert_int_equal(kv_seq_reserve(&kv, &sq[i], len + n_dec, &err), 0);
        for (int c0 = 0; c0 < len; c0 += 25) {
            const int n = len - c0 < 25 ? len - c0 : 25;
            int32_t ct[25], cp[25], last = n - 1;
            kv_seq *cs[25];
            for (int j = 0; j < n; j++) {
                ct[j] = (int32_t)(((c0 + j) * 7919 + 13 * i + 5) % V);
                cp[j] = c0 + j;
                cs[j] = &sq[i];
            }
            fwd_batch b = {n, ct, cp, cs, 1, &last};
            if (model_forward(m, &kv, &b, lg, &err))
                fail_msg("%s", err.msg);
        }
    }
    for (int s = 0; s < n_dec; s++) {
        for (int i = 0; i < B; i++) {
            const int r = rev ? B - 1 - i : i;
            tok[r] = (int32_t)((s * 31 + 7 * i + 3) % V);
            pos[r] = 20 + (i * 37) % 150 + s;
            sp[r] = &sq[i];
            rows[r] = r;
        }
        fwd_batch d = {B, tok, pos, sp, B, rows};
        if (model_forward(m, &kv, &d, lg, &err))
            fail_msg("%s", err.msg);
        memcpy(out + (size_t)s * V, lg + (size_t)(rev ? B - 1 : 0) * V, (size_t)V * sizeof(float));
    }
    for (int i = 0; i < B; i++)
        kv_seq_free(&kv, &sq[i]);
    kv_pool_free(&kv);
    free(sq);
    free(tok);
    free(pos);
    free(rows);
    free(sp);
    free(lg);
}

/* Batch invariance of the whole forward: a sequence's decode logits are
 * the same bits in steps of 2, 3, 8, 32, 100 and 128 sequences, as the
 * first row and as the last (each its own cuBLASLt tile or GEMV tiling,
 * graphs per size), bf16 and 4-bit, in the throughput mode (the default:
 * bf16-rounded activations - cuBLASLt without split-K for bf16, the
 * tensor-core GEMV for 4-bit - and the tiled batch attention) and with
 * exact products - where it also equals the sequence decoding alone. The
 * bf16 batches run q/k/v and gate/up as one cuBLASLt GEMM each
 * (tcu_opts.lt_cat; checked that they did), and a GEMM a matrix stays
 * within 1e-3 of them. */
static void test_batch_invariance(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    const char *build = getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build";
    const char *bin = getenv("TERN_BIN") ? getenv("TERN_BIN") : "build/tern";
    char dir[] = "/tmp/tern_cuda_XXXXXX";
    assert_non_null(mkdtemp(dir));
    sh("%s/tools/make_fixture --family llama --dim 256 --layers 3 --heads 8 --kv-heads 2 --ff 512 --vocab 512 "
       "--dtype bf16 --out %s/m --tokenizer %s >/dev/null",
       build, dir, shared_path("models/stories260K"));
    sh("%s convert %s/m %s/q --bits 4 --group-size 64 2>/dev/null", bin, dir, dir);
    const int Bs[] = {1, 2, 3, 8, 32, 100, 128}, nB = (int)(sizeof Bs / sizeof *Bs), n_dec = 4;
    /* modes: throughput, exact, throughput with tcu_opts.invariant (one
     * sequence on the batched products and attention splits) */
    for (int mi = 0; mi < 6; mi++) {
        const int mode = mi / 2, exact = mode == 1, inv = mode == 2, q = mi % 2;
        const char *mname = exact ? "exact" : inv ? "invariant" : "throughput";
        char mdir[256];
        snprintf(mdir, sizeof mdir, "%s/%s", dir, q ? "q" : "m");
        tern_err err = {0};
        model_load_opts og = {0, "cuda"};
        tern_kernels_exact_set(exact);
        if (inv)
            setenv("TERN_CUDA_INVARIANT", "3", 1);
#ifdef TERN_CUDA
        const int cat0 = tcu_cat_launches();
#endif
        tern_model *m = model_load_ex(mdir, &og, &err);
        unsetenv("TERN_CUDA_INVARIANT");
        tern_kernels_exact_set(1);
        if (!m)
            fail_msg("%s", err.msg);
        const size_t n = (size_t)n_dec * model_config_get(m)->n_vocab;
        float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
        assert_true(ref && got);
        run_batch(m, 2, n_dec, ref, 0);
        for (int bi = 0; bi < nB + 2; bi++) {
            /* then 8 and 128 again with the sequence in the last row */
            const int B = bi < nB ? Bs[bi] : bi == nB ? 8 : 128, rev = bi >= nB;
            if (B == 2)
                continue;
            run_batch(m, B, n_dec, got, rev);
            const int same = !memcmp(got, ref, n * sizeof(float));
            print_message("batch invariance %s %s: sequence 0 in a batch of %d%s = in a batch of 2: %s (rel %.3g)\n",
                          mname, q ? "4-bit" : "bf16", B, rev ? " (last row)" : "", same ? "bitwise" : "DIFFERS",
                          rel_err(got, ref, n));
            /* throughput alone: the one-sequence kernels (f32 products,
             * short attention splits) - expected to differ, within the
             * bf16 envelope */
            if (B == 1 && !exact && !inv) {
                assert_true(rel_err(got, ref, n) < 2e-2);
                continue;
            }
            if (!same)
                fail_msg("%s %s: sequence 0's logits in a batch of %d%s differ from a batch of 2", mname,
                         q ? "4-bit" : "bf16", B, rev ? " (last row)" : "");
        }
#ifdef TERN_CUDA
        /* bf16 batches are cuBLASLt steps: q/k/v and gate/up as one GEMM
         * each (tcu_opts.lt_cat), what the bits above were of */
        if (!q && !exact && tcu_cat_launches() == cat0)
            fail_msg("%s bf16: no step took the merged q/k/v and gate/up products", mname);
        if (!q && !exact && !inv) { /* a GEMM a matrix instead: the bf16 envelope (bitwise where the
                                     * GEMM's sums do not depend on its rows) */
            setenv("TERN_CUDA_LT_CAT", "0", 1);
            tern_kernels_exact_set(0);
            tern_model *m0 = model_load_ex(mdir, &og, &err);
            tern_kernels_exact_set(1);
            unsetenv("TERN_CUDA_LT_CAT");
            if (!m0)
                fail_msg("%s", err.msg);
            run_batch(m0, 8, n_dec, got, 0);
            const double e0 = rel_err(got, ref, n);
            print_message("batch of 8, a cuBLASLt GEMM a matrix (TERN_CUDA_LT_CAT=0) against the merged GEMMs: %s "
                          "(rel %.3g)\n",
                          memcmp(got, ref, n * sizeof(float)) ? "differs" : "bitwise", e0);
            if (!(e0 < 1e-3))
                fail_msg("the merged products' logits differ from a GEMM a matrix by %g", e0);
            model_free(m0);
        }
#endif
        free(ref);
        free(got);
        model_free(m);
    }
    sh("rm -rf %s", dir);
}

static void test_forward(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    check_family("llama", "", 0, 20, 2e-5);
    check_family("qwen2", "", 0, 20, 2e-5);
    check_family("qwen3", "", 0, 20, 2e-5);
    check_family("gemma2", "--attn-softcap 50 --final-softcap 30 --sliding-window 8", 0, 20, 2e-5);
    /* YaRN: its frequencies, and cos / sin scaled by the attention factor
     * (0.1 ln 4 + 1) in the device RoPE */
    check_family("qwen3", "--rope-scaling yarn --rope-factor 4 --rope-orig 64", 0, 20, 2e-5);
    check_family("llama", "", 4, 20, 2e-5);
    check_family("llama", "", 8, 20, 2e-5);
    check_family("qwen3", "", -1, 20, 2e-5); /* FP8 (tern convert --fp8) */
    /* prompt through cuBLAS (bf16-rounded activations): the bf16 envelope */
    check_family("llama", "", 0, 48, 2e-2);
    check_family("llama", "", 4, 48, 2e-2);
    check_family("llama", "", -1, 48, 2e-2);
    /* the throughput mode (the default without --exact-products): steps of
     * two sequences through the tensor-core GEMV with activations rounded
     * once to bf16 - the bf16 envelope (16-bit weights: the CPU reference
     * does not depend on the switch) */
    tern_kernels_exact_set(0);
    g_throughput = 1;
    check_family("llama", "", 0, 20, 2e-2);
    check_family("qwen3", "", 0, 20, 2e-2);
    /* a YaRN prompt through cuBLAS and the tiled prefill attention */
    check_family("qwen3", "--rope-scaling yarn --rope-factor 4 --rope-orig 64", 0, 48, 2e-2);
    /* FP8 on the tensor cores: activations rounded to E4M3 (3 bits) a token
     * and 128 inputs - the FP8 envelope (measured 5.5e-2 on this model) */
    check_family("llama", "", -1, 20, 1e-1);
    g_throughput = 0;
    tern_kernels_exact_set(1);
}

/* An argument: only the tests whose names match it (cmocka's pattern). */
int main(int argc, char **argv)
{
    if (argc > 1)
        cmocka_set_test_filter(argv[1]);
    /* the CPU reference: f32-activation (exact) products, not the integer ones */
    tern_kernels_exact_set(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_not_built_or_no_gpu),
        cmocka_unit_test(test_opts),
        cmocka_unit_test(test_matmul),
        cmocka_unit_test(test_f8_mma),
        cmocka_unit_test(test_q4_mma),
        cmocka_unit_test(test_lt_cat),
        cmocka_unit_test(test_lt_splitk),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gemv_rows_by_shape),
        cmocka_unit_test(test_gemv_stage),
        cmocka_unit_test(test_gemv_ring),
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_batch_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
