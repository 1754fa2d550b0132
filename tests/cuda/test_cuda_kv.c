/* KV types (bf16, f16, q8, q4, r4, r3, f8; with and without 16-bit sink blocks) on the
 * CUDA backend, against the CPU (every test but the first skips without a
 * GPU; the first, without one, that the CPU reference reads every type):
 *  - attention over one typed pool, CPU backend vs CUDA table path: the
 *    decode kernel (relative L2 error <= 1e-4: the same stored codes, only
 *    the order of the sums and the CPU's fused a*sum(q*c) + b*sum(q)
 *    differ) and the tiled prefill kernels (TF32 tensor cores <= 3e-3, f32
 *    <= 1e-4), every window / soft-cap mode, hd 64, 128, 256;
 *  - the KV write: tcu_qkv_post's encoded rows equal kv_row_store's bytes
 *    (RoPE at angle 0, so both encode the same floats), a sink row too;
 *    copy-on-write from a sink block to a quantized one on the device equals
 *    the host's re-encoding byte for byte;
 *  - the forward on tern-demo per type, GPU vs CPU (prefill in chunks of
 *    24: the GEMV path), logits within a per-type bound;
 *  - greedy decoding of the HF golden prompts on the GPU with bf16 KV
 *    equals f32 KV (a divergence only where f32's own top-2 gap is below
 *    5e-3, the rule of test_golden). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>

#include "base/json.h"
#include "base/rng.h"
#include "model/backend_cuda.h"
#include "model/model_int.h"
#include "tensor/kernels.h"
#include "test_util.h"
#ifdef TERN_CUDA
#include <cuda_runtime.h>

#include "model/backend_cuda_kv.h"
#include "tensor/cuda/cuda_kernels.h"
#endif

static int have_gpu(void) { return model_cuda_device_count() > 0; }

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

#ifdef TERN_CUDA
/* Random K/V values in [-a, a] with an outlier channel every 37 elements. */
static void fill_kv(tern_rng *r, float *x, size_t n, float a)
{
    for (size_t i = 0; i < n; i++)
        x[i] = a * (tern_rng_f32(r) * 2.0f - 1.0f) * (i % 37 == 5 ? 6.0f : 1.0f);
}
#endif

static const kv_type g_types[] = {KV_BF16, KV_F16, KV_Q8, KV_Q4, KV_R4, KV_R3, KV_F8};
#define N_TYPES (sizeof g_types / sizeof *g_types)

#ifdef TERN_CUDA
/* tiles: tcu_opts.attn_tiles, the batch kernels that a step of several
 * sequences takes (0: the per-head / grouped ones; -1 the default); z:
 * tcu_opts.attn_z */
static model_backend *gpu_new_opts(int tiled, int gqa, int tiles, int z)
{
    tern_err err = {0};
    tcu_opts o;
    tcu_opts_init(&o);
    o.attn_gqa = gqa;
    if (tiles >= 0)
        o.attn_tiles = tiles;
    o.attn_z = z;
    if (tiled >= 0)
        o.attn_tiled = tiled;
    model_backend *b = model_backend_cuda_new_opts(NULL, 0, &o, &err);
    if (!b)
        fail_msg("%s", err.msg);
    return b;
}

static model_backend *gpu_new(int tiled) { return gpu_new_opts(tiled, 1, -1, 0); }
#endif

static void test_declared(void **state)
{
    (void)state;
    if (have_gpu())
        skip();
    /* without a GPU (or CUDA) nothing to run: the CPU side still reads every type */
    tern_err err = {0};
    model_backend *cpu = model_backend_cpu_new(1, &err);
    assert_non_null(cpu);
    for (size_t i = 0; i < N_TYPES; i++)
        assert_true(cpu->kv_types & (1u << g_types[i]));
    cpu->free(cpu);
}

#ifdef TERN_CUDA
/* One typed pool of 2 layers, three sequences of 5, 141 and 700 positions
 * (interleaved reservations), every position written by kv_row_store. */
static void pool_fill(tern_rng *r, kv_pool *kv, kv_seq *s, int hd, int n_kv)
{
    tern_err err = {0};
    int lens[3] = {5, 141, 700};
    for (int step = 1; step <= 44; step++)
        for (int i = 0; i < 3; i++) {
            int want = lens[i] * step / 44;
            if (want > 0)
                assert_int_equal(kv_seq_reserve(kv, &s[i], want, &err), 0);
        }
    size_t kd = (size_t)n_kv * hd;
    float *k = malloc(kd * sizeof(float)), *v = malloc(kd * sizeof(float)), *rot = malloc(kd * sizeof(float));
    for (int i = 0; i < 3; i++) {
        for (int p = 0; p < lens[i]; p++)
            for (int l = 0; l < kv->n_layer; l++) {
                fill_kv(r, k, kd, 1.0f);
                fill_kv(r, v, kd, 1.0f);
                kv_row_store(kv, &s[i], l, p, k, v, rot);
            }
        s[i].n_tokens = lens[i];
    }
    free(k);
    free(v);
    free(rot);
}
#endif

static void test_kv_attention(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
#ifdef TERN_CUDA
    tern_err err = {0};
    /* gpus[0]: the decode kernel of one block a q head (tcu_opts.attn_gqa
     * 0); [1], [2]: the tiled prefill kernels (the big batch) and the
     * grouped decode kernel (the small one); [3], [4], [5]: the small batch
     * (several sequences) on the batch tiles 1, 2 (16-bit pools; the others
     * take 1's), 2 with every block walking all its splits; [6], [7]: tiles
     * 3 (tensor cores), alone and with one block walking all splits */
    model_backend *cpu = model_backend_cpu_new(2, &err),
                  *gpus[8] = {gpu_new_opts(-1, 0, 0, 0),           gpu_new(TCU_ATTN_TILED_F32),
                              gpu_new_opts(TCU_ATTN_TILED_TF32, 1, 0, 0), gpu_new_opts(-1, 1, 1, 0),
                              gpu_new_opts(-1, 1, 2, 0),                  gpu_new_opts(-1, 1, 2, 1),
                              gpu_new_opts(-1, 1, 3, 0),                  gpu_new_opts(-1, 1, 3, 1)};
    static const char *const names[8] = {" per q head",    " tiled f32",          " tiled tf32 / grouped",
                                         " batch tiles 1", " batch tiles 2",      " batch tiles 2, z 1",
                                         " batch tiles 3", " batch tiles 3, z 1"};
    tern_rng r;
    tern_rng_seed(&r, 25, 2);
    const int hds[] = {64, 128, 256};
    /* q heads / kv heads: groups of 4, 7 (the grouped kernel's registers
     * for 8; its fallback at hd 256) and 1 */
    const int heads[][2] = {{8, 2}, {7, 1}, {3, 3}};
    for (size_t hc = 0; hc < sizeof heads / sizeof *heads; hc++)
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
        for (size_t ti = 0; ti < N_TYPES; ti++)
            for (int qs = 0; qs <= (kv_type_is_quant(g_types[ti]) ? 20 : 0); qs += 20) {
                int hd = hds[hi], n_head = heads[hc][0], n_kv = heads[hc][1], n_layer = 2;
                kv_spec sp;
                kv_spec_init(&sp, g_types[ti]);
                sp.quant_start = qs;
                kv_pool kv;
                if (kv_pool_init_spec(&kv, &sp, n_layer, n_kv * hd, hd, 16, 96, qs ? 4 : 0, 1, &err))
                    fail_msg("%s", err.msg);
                kv_seq s[3] = {{0}};
                pool_fill(&r, &kv, s, hd, n_kv);
                for (int big = 0; big < (hc == 0 ? 2 : 1); big++) {
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
                    float *q = malloc(qn * sizeof(float)), *oc = malloc(qn * sizeof(float)),
                          *og = malloc(qn * sizeof(float));
                    fill_kv(&r, q, qn, 1.0f);
                    const struct {
                        int window;
                        float softcap;
                    } modes[] = {{0, 0.0f}, {20, 0.0f}, {0, 5.0f}, {300, 50.0f}};
                    static const int small[] = {0, 2, 3, 4, 5, 6, 7}, large[] = {1, 2};
                    const int n_tm = big ? 2 : 7;
                    for (int ki = 0; ki < n_tm; ki++)
                        for (size_t mi = 0; mi < sizeof modes / sizeof *modes; mi++) {
                            const int tm = big ? large[ki] : small[ki];
                            const double tol = big && tm == 2 ? 3e-3 : 1e-4;
                            for (size_t e = 0; e < qn; e++)
                                og[e] = NAN;
                            model_attn a = {&kv, &b, 1, n_head, n_kv, hd, modes[mi].window, 1.0f / sqrtf((float)hd),
                                            modes[mi].softcap, q, oc, NULL};
                            assert_int_equal(cpu->attention(cpu, &a, &err), 0);
                            a.out = og;
                            if (gpus[tm]->attention(gpus[tm], &a, &err))
                                fail_msg("%s", err.msg);
                            double e = rel_err(og, oc, qn);
                            if (mi == 0 || !(e <= tol))
                                print_message("kv %s%s hd %d heads %d/%d T %d%s window %d softcap %g: rel err %.3g "
                                              "(tol %g)\n",
                                              kv_type_name(g_types[ti]), qs ? " +sinks" : "", hd, n_head, n_kv, T,
                                              names[tm], modes[mi].window,
                                              modes[mi].softcap, e, tol);
                            if (!(e <= tol))
                                fail_msg("kv %s hd %d heads %d/%d T %d kernel %d mode %zu: relative error %g",
                                         kv_type_name(g_types[ti]), hd, n_head, n_kv, T, tm, mi, e);
                        }
                    free(q);
                    free(oc);
                    free(og);
                }
                for (int i = 0; i < 3; i++)
                    kv_seq_free(&kv, &s[i]);
                kv_pool_free(&kv);
            }
    for (int g = 0; g < 8; g++)
        gpus[g]->free(gpus[g]);
    cpu->free(cpu);
#endif
}

#ifdef TERN_CUDA
#define CK(x) assert_int_equal((int)(x), 0)

/* Device bytes of layer 0 (K or V) of a mirror, downloaded. */
static uint8_t *mirror_get(const cu_kvm *m, int is_v, size_t n)
{
    uint8_t *h = malloc(n);
    CK(cudaMemcpy(h, is_v ? m->v : m->k, n, cudaMemcpyDeviceToHost));
    return h;
}
#endif

static void test_kv_write(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
#ifdef TERN_CUDA
    tern_err err = {0};
    tern_rng r;
    tern_rng_seed(&r, 26, 2);
    const int hds[] = {64, 128};
    for (size_t hi = 0; hi < 2; hi++)
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            const int hd = hds[hi], n_kv = 2, n_head = 2, bs = 16, nb = 4, T = 3;
            kv_type t = g_types[ti];
            kv_spec sp;
            kv_spec_init(&sp, t);
            sp.quant_start = 1; /* block 0 a sink block (bf16 in the quantized types) */
            kv_pool kv;
            if (kv_pool_init_spec(&kv, &sp, 1, n_kv * hd, hd, bs, nb, 1, 1, &err))
                fail_msg("%s", err.msg);
            size_t bytes = cu_kvm_bytes(&kv);
            void *dk = NULL, *dv = NULL;
            CK(cudaMalloc(&dk, bytes));
            CK(cudaMalloc(&dv, bytes));
            CK(cudaMemset(dk, 0, bytes));
            CK(cudaMemset(dv, 0, bytes));
            memset(kv.mem_k, 0, bytes);
            memset(kv.mem_v, 0, bytes);
            cu_kvm m = {0};
            if (cu_kvm_set(&m, &kv, dk, dv, &err))
                fail_msg("%s", err.msg);
            /* one sequence over blocks 0 (sink) and 2 (regular): positions 3, 16 + 5, 16 + 15 */
            kv_seq s = {0};
            int32_t blocks[2] = {0, 2};
            s.blocks = blocks;
            s.n_blocks = 2;
            int32_t pos[3] = {3, 21, 31}, bt_off[3] = {0, 0, 0};
            size_t kd = (size_t)n_kv * hd, qd = (size_t)n_head * hd;
            float *q = calloc((size_t)T * qd, sizeof(float)), *k = malloc((size_t)T * kd * sizeof(float)),
                  *v = malloc((size_t)T * kd * sizeof(float)), *rot = malloc(kd * sizeof(float));
            fill_kv(&r, k, (size_t)T * kd, 2.0f);
            fill_kv(&r, v, (size_t)T * kd, 2.0f);
            for (int i = 0; i < T; i++)
                kv_row_store(&kv, &s, 0, pos[i], k + (size_t)i * kd, v + (size_t)i * kd, rot);
            float *dq, *dkk, *dvv, *dfreq;
            int32_t *dpos, *dbt, *dblk;
            CK(cudaMalloc((void **)&dq, (size_t)T * qd * sizeof(float)));
            CK(cudaMalloc((void **)&dkk, (size_t)T * kd * sizeof(float)));
            CK(cudaMalloc((void **)&dvv, (size_t)T * kd * sizeof(float)));
            CK(cudaMalloc((void **)&dfreq, (size_t)hd / 2 * sizeof(float)));
            CK(cudaMalloc((void **)&dpos, sizeof pos));
            CK(cudaMalloc((void **)&dbt, sizeof bt_off));
            CK(cudaMalloc((void **)&dblk, sizeof blocks));
            CK(cudaMemcpy(dq, q, (size_t)T * qd * sizeof(float), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dkk, k, (size_t)T * kd * sizeof(float), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dvv, v, (size_t)T * kd * sizeof(float), cudaMemcpyHostToDevice));
            CK(cudaMemset(dfreq, 0, (size_t)hd / 2 * sizeof(float))); /* RoPE at angle 0: K as given */
            CK(cudaMemcpy(dpos, pos, sizeof pos, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dbt, bt_off, sizeof bt_off, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dblk, blocks, sizeof blocks, cudaMemcpyHostToDevice));
            tcu_qkv_args qa = {dq,   dkk,  dvv,  NULL, NULL, NULL, NULL, NULL, dfreq, dpos, dbt, dblk,
                               cu_kvm_layer(&m, 0), 0, T, n_head, n_kv, hd, 1e-5f, 1.0f, 0, NULL};
            CK(tcu_qkv_post(&qa, NULL, NULL));
            /* copy-on-write from the sink block 0 to the regular block 3, both sides */
            CK(cu_kvm_block_copy(&m, 3, 0, NULL));
            CK(cudaDeviceSynchronize());
            assert_int_equal(kv_block_copy(&kv, 3, 0), 0);
            for (int is_v = 0; is_v < 2; is_v++) {
                uint8_t *dev = mirror_get(&m, is_v, bytes), *host = is_v ? kv.mem_v : kv.mem_k;
                size_t diff = 0;
                for (size_t i = 0; i < bytes; i++)
                    diff += dev[i] != host[i];
                print_message("kv write %s hd %d %s: %zu of %zu bytes differ\n", kv_type_name(t), hd,
                              is_v ? "V" : "K", diff, bytes);
                if (diff)
                    fail_msg("kv write %s hd %d: the device's %s bytes differ from kv_row_store's / kv_block_copy's "
                             "in %zu places", kv_type_name(t), hd, is_v ? "V" : "K", diff);
                free(dev);
            }
            cudaFree(dq);
            cudaFree(dkk);
            cudaFree(dvv);
            cudaFree(dfreq);
            cudaFree(dpos);
            cudaFree(dbt);
            cudaFree(dblk);
            cudaFree(dk);
            cudaFree(dv);
            cu_kvm_clear(&m);
            free(q);
            free(k);
            free(v);
            free(rot);
            s.blocks = NULL;
            kv_pool_free(&kv);
        }
#endif
}

/* Prefill of n tokens in chunks of 24, then n_dec greedy steps, with a
 * pool of spec (NULL: f32); every step's logits into out[1 + n_dec][V]
 * (the prefill's last row first), the greedy ids into ids. */
static void run_model(tern_model *m, const kv_spec *spec, const int32_t *prompt, int n, int n_dec, float *out,
                      int32_t *ids)
{
    tern_err err = {0};
    kv_pool kv;
    kv_seq seq = {0};
    int V = model_config_get(m)->n_vocab;
    if (model_kv_pool_init(m, &kv, spec, 16, (n + n_dec) / 16 + 2, 0, 1, &err))
        fail_msg("%s", err.msg);
    assert_int_equal(kv_seq_reserve(&kv, &seq, n + n_dec, &err), 0);
    int32_t pos[24];
    kv_seq *seqs[24];
    for (int c0 = 0; c0 < n; c0 += 24) {
        int c = n - c0 < 24 ? n - c0 : 24;
        for (int i = 0; i < c; i++) {
            pos[i] = c0 + i;
            seqs[i] = &seq;
        }
        int32_t last = c - 1;
        fwd_batch b = {c, prompt + c0, pos, seqs, 1, &last};
        if (model_forward(m, &kv, &b, out, &err))
            fail_msg("%s", err.msg);
    }
    for (int s = 0; s < n_dec; s++) {
        const float *lg = out + (size_t)s * V;
        int32_t best = 0;
        for (int t = 1; t < V; t++)
            if (lg[t] > lg[best])
                best = t;
        ids[s] = best;
        int32_t p = n + s, zero = 0;
        kv_seq *sq = &seq;
        fwd_batch d = {1, &ids[s], &p, &sq, 1, &zero};
        if (model_forward(m, &kv, &d, out + (size_t)(s + 1) * V, &err))
            fail_msg("%s", err.msg);
    }
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
}

static void test_kv_forward(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    tern_err err = {0};
    model_load_opts lo = {2, "cuda"};
    tern_model *cpu = model_load(repo_path("models/tern-demo"), 2, &err);
    if (!cpu)
        fail_msg("%s", err.msg);
    tern_model *gpu = model_load_ex(repo_path("models/tern-demo"), &lo, &err);
    if (!gpu)
        fail_msg("%s", err.msg);
    int V = model_config_get(cpu)->n_vocab, n = 60, n_dec = 16;
    int32_t prompt[60], ids_c[16], ids_g[16];
    for (int i = 0; i < n; i++)
        prompt[i] = (int32_t)((i * 7919 + 13) % (V - 1)) + 1;
    float *lc = malloc((size_t)(n_dec + 1) * V * sizeof(float)), *lg = malloc((size_t)(n_dec + 1) * V * sizeof(float));
    /* the bound per type: logits of the whole run, GPU vs CPU (both read the same kind of codes; a code may
     * still round the other way where the products' summation order moved a K or V across a boundary) */
    const double tol[] = {1e-4, 1e-3, 1e-4, 3e-3, 3e-2, 3e-2, 3e-2, 1e-2};
    const kv_type types[] = {KV_F32, KV_BF16, KV_F16, KV_Q8, KV_Q4, KV_R4, KV_R3, KV_F8};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        kv_spec sp;
        kv_spec_init(&sp, types[ti]);
        run_model(cpu, &sp, prompt, n, n_dec, lc, ids_c);
        /* the GPU follows the CPU's tokens: run_model's greedy ids are its own, so compare the prefix that agrees */
        run_model(gpu, &sp, prompt, n, n_dec, lg, ids_g);
        int same = 0;
        while (same < n_dec && ids_c[same] == ids_g[same])
            same++;
        double e = rel_err(lg, lc, (size_t)(same + 1) * V);
        print_message("forward tern-demo kv %s: logits rel err %.3g over %d steps (tol %g), greedy %d/%d equal\n",
                      kv_type_name(types[ti]), e, same + 1, tol[ti], same, n_dec);
        if (!(e <= tol[ti]))
            fail_msg("forward kv %s: GPU logits differ from the CPU's by %g", kv_type_name(types[ti]), e);
    }
    free(lc);
    free(lg);
    model_free(cpu);
    model_free(gpu);
}

/* ---- bf16 KV greedy == f32 KV greedy on the HF golden prompts (GPU) ---- */

#define KV_TIE_GAP 5e-3

static int json_ids(json_object *a, int32_t *out, int cap)
{
    int n = (int)json_object_array_length(a);
    if (n > cap)
        n = cap;
    for (int i = 0; i < n; i++)
        out[i] = json_object_get_int(json_object_array_get_idx(a, i));
    return n;
}

/* Returns the number of prompts checked (0: the model is not here). */
static int golden_one(const char *name, const char *dir, json_object *g, int *n_tie)
{
    tern_err err = {0};
    model_load_opts lo = {2, "cuda"};
    tern_model *m = model_load_ex(dir, &lo, &err);
    if (!m) {
        print_message("golden %s: skipped (%s)\n", name, err.msg);
        return 0;
    }
    json_object *prompts;
    assert_true(json_object_object_get_ex(g, "prompts", &prompts));
    int V = model_config_get(m)->n_vocab, n_dec = 32, checked = 0;
    float *l32 = malloc((size_t)(n_dec + 1) * V * sizeof(float)), *l16 = malloc((size_t)(n_dec + 1) * V * sizeof(float));
    for (size_t p = 0; p < json_object_array_length(prompts); p++) {
        json_object *pr = json_object_array_get_idx(prompts, p), *arr;
        assert_true(json_object_object_get_ex(pr, "ids", &arr));
        int32_t ids[64], g32[32], g16[32];
        int n = json_ids(arr, ids, 64);
        kv_spec s32, s16;
        kv_spec_init(&s32, KV_F32);
        kv_spec_init(&s16, KV_BF16);
        run_model(m, &s32, ids, n, n_dec, l32, g32);
        run_model(m, &s16, ids, n, n_dec, l16, g16);
        for (int k = 0; k < n_dec; k++) {
            if (g32[k] == g16[k])
                continue;
            /* f32's own top-2 gap at the step where they part */
            const float *row = l32 + (size_t)k * V;
            float b1 = -INFINITY, b2 = -INFINITY;
            for (int t = 0; t < V; t++)
                if (row[t] > b1) {
                    b2 = b1;
                    b1 = row[t];
                } else if (row[t] > b2) {
                    b2 = row[t];
                }
            if (b1 - b2 >= KV_TIE_GAP)
                fail_msg("golden %s prompt %zu: bf16 KV greedy step %d gives %d, f32 KV %d (gap %g)", name, p, k,
                         g16[k], g32[k], b1 - b2);
            (*n_tie)++;
            break;
        }
        checked++;
    }
    free(l32);
    free(l16);
    model_free(m);
    return checked;
}

static void test_kv_goldens(void **state)
{
    (void)state;
    if (!have_gpu())
        skip();
    DIR *d = opendir(repo_path("tests/golden"));
    assert_non_null(d);
    struct dirent *e;
    int n_models = 0, n_prompts = 0, n_tie = 0;
    const char *bin = getenv("TERN_BUILD");
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") || !strcmp(e->d_name, "manifest.json") ||
            !strncmp(e->d_name, "embed_", 6))
            continue;
        char rel[512];
        snprintf(rel, sizeof rel, "tests/golden/%s", e->d_name);
        tern_err err = {0};
        json_object *g = tern_json_parse_file(repo_path(rel), &err), *args, *repo, *shared;
        assert_non_null(g);
        int got = 0;
        if (json_object_object_get_ex(g, "make_fixture_args", &args)) {
            char tmp[64] = "/tmp/tern-kvgold-XXXXXX", cmd[4096];
            assert_non_null(mkdtemp(tmp));
            int n = snprintf(cmd, sizeof cmd, "%s/tools/make_fixture --out %s --tokenizer %s >/dev/null",
                             bin ? bin : "build", tmp, shared_path("models/stories260K"));
            for (size_t i = 0; i < json_object_array_length(args); i++)
                n += snprintf(cmd + n, sizeof cmd - (size_t)n, " %s",
                              json_object_get_string(json_object_array_get_idx(args, i)));
            assert_int_equal(system(cmd), 0);
            got = golden_one(e->d_name, tmp, g, &n_tie);
            snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
            assert_int_equal(system(cmd), 0);
        } else if (json_object_object_get_ex(g, "repo_model", &repo)) {
            got = golden_one(e->d_name, repo_path(json_object_get_string(repo)), g, &n_tie);
        } else if (json_object_object_get_ex(g, "shared_model", &shared)) {
            got = golden_one(e->d_name, shared_path(json_object_get_string(shared)), g, &n_tie);
        }
        json_object_put(g);
        n_models += got > 0;
        n_prompts += got;
    }
    closedir(d);
    print_message("goldens on the GPU: %d models, %d prompts, bf16 KV greedy == f32 KV greedy except %d at a "
                  "near-tie (gap < %g)\n", n_models, n_prompts, n_tie, KV_TIE_GAP);
    assert_true(n_models >= 4);
}

int main(void)
{
    /* the CPU reference with f32-exact products, and the GPU models too (--exact-products reaches the
     * backend's options): the forwards then differ only in the order of sums */
    tern_kernels_exact_set(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declared),    cmocka_unit_test(test_kv_attention), cmocka_unit_test(test_kv_write),
        cmocka_unit_test(test_kv_forward), cmocka_unit_test(test_kv_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
