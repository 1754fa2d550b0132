/* bench_cuda: the CUDA backend's speed next to the roofline, and its logits
 * next to the CPU backend's.
 *
 *   bench_cuda [--prompt N] [--tokens N] [--check N] MODEL_DIR...
 *
 * Per model: weight bytes one decode step reads (model_weight_bytes), the
 * device-to-device copy bandwidth (bytes read + written per second), the
 * roofline bandwidth / weight bytes, batch-1 decode tokens/s after an
 * N-token prompt, aggregate decode tokens/s at batch 8 and 32 (each row its
 * own sequence), and prefill tokens/s of a 512-token prompt in one batch.
 * --check N first runs an N-token prompt and 4 greedy steps on both the CPU
 * and the GPU and prints the logits' relative L2 error and whether the
 * greedy ids agree (0 skips it). Without a CUDA build it says so. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "model/backend.h"
#include "model/model.h"
#ifdef TERN_CUDA
#include "tensor/cuda/cuda_kernels.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die(const tern_err *e)
{
    fprintf(stderr, "bench_cuda: %s\n", e->msg);
    return 1;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Prefill n_prompt tokens of B sequences (one batch each), then `steps`
 * decode steps of all B together; seconds spent in the steps after the
 * first two (graph capture, warm-up). */
static double decode_run(tern_model *m, kv_pool *kv, int B, int n_prompt, int steps, const int32_t *prompt,
                         float *logits, tern_err *err)
{
    kv_seq *seq = calloc((size_t)B, sizeof *seq);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n_prompt > B ? n_prompt : B));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B), *rows = malloc(sizeof(int32_t) * (size_t)B);
    kv_seq **sp = malloc(sizeof(kv_seq *) * (size_t)(n_prompt > B ? n_prompt : B));
    double t0 = 0, dt = -1;
    int V = m->cfg.n_vocab;
    for (int s = 0; s < B; s++) {
        if (kv_seq_reserve(kv, &seq[s], n_prompt + steps, err))
            goto out;
        for (int i = 0; i < n_prompt; i++) {
            pos[i] = i;
            sp[i] = &seq[s];
        }
        int32_t last = n_prompt - 1;
        fwd_batch b = {n_prompt, prompt, pos, sp, 1, &last};
        if (model_forward(m, kv, &b, logits + (size_t)s * V, err))
            goto out;
        tok[s] = argmax(logits + (size_t)s * V, V);
    }
    for (int st = 0; st < steps; st++) {
        if (st == 2)
            t0 = now_s();
        for (int s = 0; s < B; s++) {
            pos[s] = n_prompt + st;
            sp[s] = &seq[s];
            rows[s] = s;
        }
        fwd_batch b = {B, tok, pos, sp, B, rows};
        if (model_forward(m, kv, &b, logits, err))
            goto out;
        for (int s = 0; s < B; s++)
            tok[s] = argmax(logits + (size_t)s * V, V);
    }
    dt = now_s() - t0;
out:
    for (int s = 0; s < B; s++)
        kv_seq_free(kv, &seq[s]);
    free(seq);
    free(pos);
    free(tok);
    free(rows);
    free(sp);
    return dt;
}

static double prefill_run(tern_model *m, kv_pool *kv, int n, const int32_t *prompt, float *logits, tern_err *err)
{
    kv_seq seq = {0};
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), last = n - 1;
    kv_seq **sp = malloc(sizeof(kv_seq *) * (size_t)n);
    double best = -1;
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        sp[i] = &seq;
    }
    if (!kv_seq_reserve(kv, &seq, n, err))
        for (int rep = 0; rep < 3; rep++) {
            fwd_batch b = {n, prompt, pos, sp, 1, &last};
            double t = now_s();
            if (model_forward(m, kv, &b, logits, err)) {
                best = -1;
                break;
            }
            t = now_s() - t;
            if (rep > 0 && (best < 0 || t < best))
                best = t;
        }
    kv_seq_free(kv, &seq);
    free(pos);
    free(sp);
    return best;
}

/* n-token prompt + 4 greedy steps on the current backend; logits [5][V]. */
static int check_run(tern_model *m, kv_pool *kv, int n, const int32_t *prompt, float *lg, int32_t *ids, tern_err *err)
{
    kv_seq seq = {0};
    int32_t pos[512], last = n - 1;
    kv_seq *sp[512];
    int V = m->cfg.n_vocab, rc;
    if ((rc = kv_seq_reserve(kv, &seq, n + 4, err)))
        return rc;
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        sp[i] = &seq;
    }
    fwd_batch b = {n, prompt, pos, sp, 1, &last};
    if ((rc = model_forward(m, kv, &b, lg, err)))
        goto out;
    for (int s = 0; s < 4; s++) {
        ids[s] = argmax(lg + (size_t)s * V, V);
        int32_t p = n + s, zero = 0;
        kv_seq *q = &seq;
        fwd_batch d = {1, &ids[s], &p, &q, 1, &zero};
        if ((rc = model_forward(m, kv, &d, lg + (size_t)(s + 1) * V, err)))
            goto out;
    }
out:
    kv_seq_free(kv, &seq);
    return rc;
}
#endif

int main(int argc, char **argv)
{
    int n_prompt = 128, steps = 64, check = 32;
    int first = 1;
    for (; first < argc && argv[first][0] == '-'; first += 2) {
        if (first + 1 >= argc)
            break;
        if (!strcmp(argv[first], "--prompt"))
            n_prompt = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--tokens"))
            steps = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--check"))
            check = atoi(argv[first + 1]);
        else
            break;
    }
    if (first >= argc || n_prompt < 1 || n_prompt > 512 || steps < 4 || check < 0 || check > 500) {
        fprintf(stderr, "usage: bench_cuda [--prompt N<=512] [--tokens N>=4] [--check N] MODEL_DIR...\n");
        return 2;
    }
#ifndef TERN_CUDA
    fprintf(stderr, "bench_cuda: this tern was built without CUDA (make CUDA=1)\n");
    return 2;
#else
    if (model_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_cuda: no GPU\n");
        return 2;
    }
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10);
    printf("device copy bandwidth (read + write): %.0f GB/s\n", bw / 1e9);
    printf("%-28s %8s %9s %9s %7s %9s %9s %9s %9s %10s %s\n", "model", "weightGB", "roof t/s", "b1 t/s", "%roof",
           "b8 t/s", "b32 t/s", "b8 blas", "b32 blas", "prefill/s", "check");
    for (int a = first; a < argc; a++) {
        tern_err err = {0};
        model_load_opts o = {0, "cpu"};
        tern_model *m = model_load_ex(argv[a], &o, &err);
        if (!m)
            return die(&err);
        model_backend *cpu = m->be, *gpu = model_backend_cuda_new(m, 0, &err);
        if (!gpu)
            return die(&err);
        const model_config *c = &m->cfg;
        int V = c->n_vocab, maxlen = 512 + 8;
        if (n_prompt + steps > maxlen)
            maxlen = n_prompt + steps;
        int bs = 16, per = (maxlen + bs - 1) / bs + 1;
        kv_pool kv;
        if (kv_pool_init(&kv, c->n_layer, c->n_kv_head * c->head_dim, bs, 32 * per + 64, &err))
            return die(&err);
        int32_t prompt[512];
        tern_rng r;
        tern_rng_seed(&r, 42, 0);
        for (int i = 0; i < 512; i++)
            prompt[i] = (int32_t)(tern_rng_f32(&r) * (V - 1));
        float *logits = malloc((size_t)32 * V * sizeof(float)), *lc = malloc((size_t)5 * V * sizeof(float));
        char chk[96] = "-";
        if (check > 0) {
            int32_t idc[4], idg[4];
            m->be = cpu;
            if (check_run(m, &kv, check, prompt, lc, idc, &err))
                return die(&err);
            m->be = gpu;
            if (check_run(m, &kv, check, prompt, logits, idg, &err))
                return die(&err);
            double num = 0, den = 0, num0 = 0, den0 = 0;
            for (size_t i = 0; i < (size_t)5 * V; i++) {
                double d = (double)logits[i] - lc[i];
                num += d * d;
                den += (double)lc[i] * lc[i];
                if (i < (size_t)V) {
                    num0 += d * d;
                    den0 += (double)lc[i] * lc[i];
                }
            }
            snprintf(chk, sizeof chk, "prefill rel %.2e, 5 steps rel %.2e, greedy %s", sqrt(num0 / den0),
                     sqrt(num / den), memcmp(idc, idg, sizeof idc) ? "DIFFER" : "same");
        }
        m->be = gpu;
        double wb = (double)model_weight_bytes(m);
        double t1 = decode_run(m, &kv, 1, n_prompt, steps, prompt, logits, &err);
        double t8 = t1 >= 0 ? decode_run(m, &kv, 8, n_prompt, steps, prompt, logits, &err) : -1;
        double t32 = t8 >= 0 ? decode_run(m, &kv, 32, n_prompt, steps, prompt, logits, &err) : -1;
        double tp = t32 >= 0 ? prefill_run(m, &kv, 512, prompt, logits, &err) : -1;
        if (tp < 0)
            return die(&err);
        /* batches through cuBLAS (TERN_CUDA_GEMM_MIN_T=2): faster, not batch-invariant */
        setenv("TERN_CUDA_GEMM_MIN_T", "2", 1);
        model_backend *blas = model_backend_cuda_new(m, 0, &err);
        unsetenv("TERN_CUDA_GEMM_MIN_T");
        if (!blas)
            return die(&err);
        m->be = blas;
        double c8 = decode_run(m, &kv, 8, n_prompt, steps, prompt, logits, &err);
        double c32 = c8 >= 0 ? decode_run(m, &kv, 32, n_prompt, steps, prompt, logits, &err) : -1;
        m->be = gpu;
        blas->free(blas);
        if (c32 < 0)
            return die(&err);
        const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
        double b1 = (steps - 2) / t1, roof = bw / wb;
        printf("%-28s %8.2f %9.0f %9.1f %6.0f%% %9.0f %9.0f %9.0f %9.0f %10.0f %s\n", name, wb / 1e9, roof, b1,
               100 * b1 / roof, 8 * (steps - 2) / t8, 32 * (steps - 2) / t32, 8 * (steps - 2) / c8,
               32 * (steps - 2) / c32, 512 / tp, chk);
        fflush(stdout);
        m->be = cpu;
        gpu->free(gpu);
        kv_pool_free(&kv);
        free(logits);
        free(lc);
        model_free(m);
    }
    return 0;
#endif
}
