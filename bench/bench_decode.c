/* bench_decode: batch-1 decode speed of the CPU forward pass next to this
 * machine's memory-bandwidth floor.
 *
 *   bench_decode [--tokens N] [--prompt N] [--threads N] [--runs N] [--exact-products] [--profile]
 *                [--streams 1,4,16] MODEL_DIR...
 *
 * The floor is what a perfect kernel could do: measured read bandwidth
 * divided by the weight bytes one decode step must read (quantized: packed
 * values plus the scale/bias pairs the kernels read: bf16 where the file
 * stores bf16 scales, else f32). Also prints
 * prefill tokens/s for a --prompt-token prompt (one batch), after one
 * untimed token (llama-bench's warm-up run: the weights read in place are
 * faulted in there). With --runs N
 * every number is the best of N runs (the bandwidth too), for noisy shared
 * machines. The last two columns divide by the process's CPU seconds
 * instead of wall time: the rate one thread would reach with its core to
 * itself (with --threads 1 a load-independent measure on a busy machine;
 * with more threads the pool's spinning counts too). Quantized weights use
 * the integer products (int8 activations)
 * unless --exact-products (f32 activations); the header line says which.
 * --profile: the decode step split by backend call (a wrapper backend times
 * each product class and the attention - a mixture's router and its
 * chosen experts' grouped products too; the rest of the step is the
 * forward's own element-wise work) with each product class's weight bytes
 * per second; the same for the prefill. --streams: the aggregate decode
 * tokens/s of N sequences decoding together (16-token prompts, --tokens
 * steps of N rows), and its ratio to one stream's (with --profile, each
 * split as above). The header also gives the pool's cost a job (jobs of no
 * work). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>

#include "base/log.h"
#include "base/pool.h"
#include "model/backend.h"
#include "model/model.h"
#include "tensor/kernels.h"

typedef struct bw_job {
    const float *buf;
    long n;
    float *partial;
} bw_job;

/* Sums [b, e) with wide loads so the loop is bound by memory, not adds. */
__attribute__((target("avx2"))) static void bw_run(void *ctx, long b, long e, int w)
{
    bw_job *j = ctx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (long i = b & ~31L; i + 32 <= e; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(j->buf + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(j->buf + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(j->buf + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(j->buf + i + 24));
    }
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    j->partial[w] += out[0] + out[7];
}

/* Read bandwidth with every thread streaming its own part of 1 GiB. */
static double measure_bandwidth(tern_pool *pool)
{
    long n = (1L << 30) / sizeof(float);
    float *buf = aligned_alloc(64, (size_t)n * sizeof(float));
    if (!buf)
        return 0;
    for (long i = 0; i < n; i++)
        buf[i] = (float)(i & 7);
    float partial[256] = {0};
    bw_job j = {buf, n, partial};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t = tern_time_s();
        tern_pool_for(pool, n, 1 << 16, bw_run, &j);
        double dt = tern_time_s() - t;
        double gbs = (double)n * sizeof(float) / dt / 1e9;
        if (gbs > best)
            best = gbs;
    }
    free(buf);
    return best;
}

/* Re-measures between runs, so the floor uses the best bandwidth seen. */
/* CPU seconds of the whole process: with wall time, the share of its
 * threads' cores it actually got (low on a busy shared machine). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The weight bytes a decode step reads: with the integer products, the
 * bf16 scale pairs where the model has them (model_weight_bytes_cpu). */
static double decode_bytes(const tern_model *m)
{
    return (double)(tern_kernels_exact_get() ? model_weight_bytes(m) : model_weight_bytes_cpu(m));
}

/* ---- --profile: a backend that times the CPU backend's calls ---- */

enum { PR_QKV, PR_O, PR_ROUTER, PR_GATEUP, PR_DOWN, PR_HEAD, PR_OTHER, PR_ATTN, PR_N };
static const char *const pr_names[PR_N] = {"q/k/v", "o", "router", "gate/up", "down", "lm head", "other product",
                                           "attention"};

typedef struct prof_backend {
    model_backend base;
    model_backend *in;
    const tern_model *m;
    double s[PR_N];
    double bytes[PR_N];
    long calls[PR_N];
    int last;               /* the class of the previous call */
    double bytes_per_param; /* the model's average */
} prof_backend;

/* The product classes in the forward's call order: per layer q/k/v (3
 * matrices), attention, o, gate/up (2), down; the lm head is the single
 * product right after a down. A mixture's layer (every layer sparse, as
 * Qwen3-MoE): o, the router (one matrix), then the chosen experts' gate/up
 * and down as two grouped products. Weight bytes are estimated from the
 * config's shapes at the model's average bytes per parameter (every product
 * of a converted model has the same bits; a mixture's router stays 16-bit,
 * so its rate is understated). */
static int prof_class(prof_backend *p, int n)
{
    int moe = model_config_get(p->m)->n_expert > 0;
    int k = n == 3 ? PR_QKV : n == 2 ? PR_GATEUP : p->last == PR_ATTN ? PR_O : moe && p->last == PR_O ? PR_ROUTER
          : p->last == PR_GATEUP ? PR_DOWN : p->last == PR_DOWN ? PR_HEAD : PR_OTHER;
    p->last = k;
    return k;
}

static double prof_params(const model_config *c, int k)
{
    double qd = (double)c->n_head * c->head_dim, kvd = (double)c->n_kv_head * c->head_dim;
    switch (k) {
    case PR_QKV: return c->dim * (qd + 2 * kvd);
    case PR_O: return c->dim * qd;
    case PR_ROUTER: return (double)c->dim * c->n_expert;
    case PR_GATEUP: return 2.0 * c->dim * (c->n_expert ? (double)c->n_expert_used * c->n_ff_expert : c->n_ff);
    case PR_DOWN: return (double)c->dim * (c->n_expert ? (double)c->n_expert_used * c->n_ff_expert : c->n_ff);
    case PR_HEAD: return (double)c->dim * c->n_vocab;
    default: return 0;
    }
}

static int prof_matmul(model_backend *be, int n, const model_weight *const *w, const float *X, float *const *Y,
                       int T, tern_err *err)
{
    prof_backend *p = (prof_backend *)be;
    double t = tern_time_s();
    int rc = p->in->matmul(p->in, n, w, X, Y, T, err);
    (void)w;
    int k = prof_class(p, n);
    p->s[k] += tern_time_s() - t;
    p->bytes[k] += prof_params(model_config_get(p->m), k) * p->bytes_per_param;
    p->calls[k]++;
    return rc;
}

/* A mixture's chosen experts: gate/up, then down (backend.h). */
static int prof_matmul_grouped(model_backend *be, int n, const model_weight *const *w, const float *const *X,
                               float *const *Y, const int *T, tern_err *err)
{
    prof_backend *p = (prof_backend *)be;
    const model_config *c = model_config_get(p->m);
    double t = tern_time_s();
    int rc = p->in->matmul_grouped(p->in, n, w, X, Y, T, err);
    int k = p->last == PR_GATEUP ? PR_DOWN : PR_GATEUP;
    p->last = k;
    p->s[k] += tern_time_s() - t;
    p->bytes[k] += (double)n * c->dim * c->n_ff_expert * p->bytes_per_param;
    p->calls[k]++;
    return rc;
}

static int prof_attention(model_backend *be, const model_attn *a, tern_err *err)
{
    prof_backend *p = (prof_backend *)be;
    double t = tern_time_s();
    int rc = p->in->attention(p->in, a, err);
    p->s[PR_ATTN] += tern_time_s() - t;
    p->last = PR_ATTN;
    p->calls[PR_ATTN]++;
    return rc;
}

static int prof_n_threads(const model_backend *be)
{
    const prof_backend *p = (const prof_backend *)be;
    return p->in->n_threads(p->in);
}

static void prof_free(model_backend *be) { (void)be; }

static void prof_par_for(model_backend *be, long n, long grain, void (*fn)(void *ctx, long b, long e, int worker),
                         void *ctx)
{
    prof_backend *p = (prof_backend *)be;
    if (p->in->par_for)
        p->in->par_for(p->in, n, grain, fn, ctx);
    else
        fn(ctx, 0, n, 0);
}

static void prof_print(const prof_backend *p, const char *what, int steps, double total)
{
    double in_be = 0;
    printf("  %s profile, %d step%s: %.3f ms a step\n", what, steps, steps > 1 ? "s" : "", 1e3 * total / steps);
    for (int k = 0; k < PR_N; k++) {
        if (!p->calls[k])
            continue;
        in_be += p->s[k];
        printf("    %-14s %8.3f ms %5.1f%%  %4ld calls", pr_names[k], 1e3 * p->s[k] / steps, 100 * p->s[k] / total,
               p->calls[k] / steps);
        if (p->bytes[k] > 0)
            printf("  %6.1f GB/s of weights (est.)", p->bytes[k] / p->s[k] / 1e9);
        printf("\n");
    }
    printf("    %-14s %8.3f ms %5.1f%%  (the forward's element-wise work, the calls' overhead)\n", "rest",
           1e3 * (total - in_be) / steps, 100 * (total - in_be) / total);
}

/* Times a prefill of n_prompt tokens (the sequence emptied first), then
 * n_tokens decode steps after it, and prints each split. */
static int profile_run(tern_model *m, kv_pool *kv, kv_seq *seq, const int32_t *tok, const int32_t *pos,
                       kv_seq **seqs, int n_prompt, int n_tokens, float *logits)
{
    prof_backend p = {0};
    p.in = model_backend_get(m);
    p.base = *p.in;
    p.base.name = "profile";
    p.base.matmul = prof_matmul;
    p.base.matmul_grouped = p.in->matmul_grouped ? prof_matmul_grouped : NULL;
    p.base.attention = prof_attention;
    p.base.n_threads = prof_n_threads;
    p.base.free = prof_free;
    p.base.par_for = prof_par_for;
    p.m = m;
    double params = 0;
    for (int k = 0; k < PR_ATTN; k++)
        params += prof_params(model_config_get(m), k) * (k == PR_HEAD ? 1 : model_config_get(m)->n_layer);
    p.bytes_per_param = decode_bytes(m) / params;
    model_backend *own = model_backend_swap(m, &p.base);
    tern_err err = {0};
    int32_t last = n_prompt - 1, zero = 0;
    int rc = 1;
    kv_seq_truncate(kv, seq, 0);
    if (kv_seq_reserve(kv, seq, n_prompt + n_tokens + 1, &err))
        goto out;
    fwd_batch pb = {n_prompt, tok, pos, seqs, 1, &last};
    double t0 = tern_time_s();
    if (model_forward(m, kv, &pb, logits, &err))
        goto out;
    prof_print(&p, "prefill", 1, tern_time_s() - t0);
    memset(p.s, 0, sizeof p.s), memset(p.bytes, 0, sizeof p.bytes), memset(p.calls, 0, sizeof p.calls);
    t0 = tern_time_s();
    for (int i = 0; i < n_tokens; i++) {
        int32_t q = n_prompt + i;
        fwd_batch db = {1, &tok[q], &pos[q], &seqs[q], 1, &zero};
        if (model_forward(m, kv, &db, logits, &err))
            goto out;
    }
    prof_print(&p, "decode", n_tokens, tern_time_s() - t0);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "bench_decode: %s\n", err.msg);
    model_backend_swap(m, own);
    return rc;
}

/* N streams decoding together: N sequences, each with a 16-token prompt
 * (one batch for all), then n_tokens steps of N decode rows (weights read
 * once a step for all rows). Returns the aggregate decode tokens/s, or -1. */
static double streams_run(tern_model *m, int n_streams, int n_tokens, int profile, double *per_cpu_s)
{
    const model_config *c = model_config_get(m);
    int P = 16, ctx = P + n_tokens + 1, n = n_streams * P;
    tern_err err = {0};
    kv_pool kv;
    double tps = -1;
    if (kv_pool_init(&kv, c->n_layer, model_kv_dim(m), KV_BLOCK_DEFAULT,
                     n_streams * (ctx / KV_BLOCK_DEFAULT + 2), &err)) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        return -1;
    }
    kv_seq *seq = calloc((size_t)n_streams, sizeof *seq);
    kv_seq **seqs = malloc((size_t)n * sizeof *seqs);
    int32_t *tok = malloc((size_t)n * sizeof *tok), *pos = malloc((size_t)n * sizeof *pos);
    int32_t *out = malloc((size_t)n_streams * sizeof *out);
    float *logits = malloc((size_t)n_streams * c->n_vocab * sizeof *logits);
    prof_backend p = {0};
    model_backend *own = NULL;
    if (!seq || !seqs || !tok || !pos || !out || !logits)
        goto out;
    for (int i = 0; i < n_streams; i++)
        if (kv_seq_reserve(&kv, &seq[i], ctx, &err)) {
            fprintf(stderr, "bench_decode: %s\n", err.msg);
            goto out;
        }
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(((i % P) * 7919 + (i / P) * 104729 + 13) % c->n_vocab);
        pos[i] = i % P;
        seqs[i] = &seq[i / P];
    }
    for (int i = 0; i < n_streams; i++)
        out[i] = i * P + P - 1;
    fwd_batch pb = {n, tok, pos, seqs, n_streams, out};
    if (model_forward(m, &kv, &pb, logits, &err)) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        goto out;
    }
    for (int i = 0; i < n_streams; i++) {
        seqs[i] = &seq[i];
        out[i] = i;
    }
    if (profile) {
        p.in = model_backend_get(m);
        p.base = *p.in;
        p.base.matmul = prof_matmul;
        p.base.matmul_grouped = p.in->matmul_grouped ? prof_matmul_grouped : NULL;
        p.base.attention = prof_attention;
        p.base.n_threads = prof_n_threads;
        p.base.free = prof_free;
        p.base.par_for = prof_par_for;
    p.base.par_for = prof_par_for;
        p.m = m;
        double params = 0;
        for (int k = 0; k < PR_ATTN; k++)
            params += prof_params(c, k) * (k == PR_HEAD ? 1 : c->n_layer);
        p.bytes_per_param = decode_bytes(m) / params;
        own = model_backend_swap(m, &p.base);
    }
    double t0 = tern_time_s(), c0 = cpu_s();
    for (int s = 0; s < n_tokens; s++) {
        for (int i = 0; i < n_streams; i++) {
            tok[i] = (int32_t)((s * 7919 + i * 31 + 5) % c->n_vocab);
            pos[i] = P + s;
        }
        fwd_batch db = {n_streams, tok, pos, seqs, n_streams, out};
        if (model_forward(m, &kv, &db, logits, &err)) {
            fprintf(stderr, "bench_decode: %s\n", err.msg);
            goto out;
        }
    }
    double dt = tern_time_s() - t0;
    tps = (double)n_streams * n_tokens / dt;
    *per_cpu_s = (double)n_streams * n_tokens / (cpu_s() - c0);
    if (profile) {
        char what[64];
        snprintf(what, sizeof what, "%d-stream decode", n_streams);
        prof_print(&p, what, n_tokens, dt);
    }
out:
    if (own)
        model_backend_swap(m, own);
    for (int i = 0; seq && i < n_streams; i++)
        kv_seq_free(&kv, &seq[i]);
    kv_pool_free(&kv);
    free(seq), free(seqs), free(tok), free(pos), free(out), free(logits);
    return tps;
}

static void nop_run(void *ctx, long b, long e, int w)
{
    (void)ctx, (void)b, (void)e, (void)w;
}

/* The pool's own cost a job (what every product, attention and
 * element-wise job of a decode step pays besides its work): 2000 jobs of
 * no work, static parts and claimed items, microseconds each. */
static void pool_latency(tern_pool *pool, double *us)
{
    for (int k = 0; k < 2; k++) {
        double t = tern_time_s();
        for (int i = 0; i < 2000; i++)
            if (k)
                tern_pool_for_chunks(pool, 64, 1, nop_run, NULL);
            else
                tern_pool_for(pool, tern_pool_size(pool), 1, nop_run, NULL);
        us[k] = (tern_time_s() - t) / 2000 * 1e6;
    }
}

static double measure_bandwidth_quick(int threads)
{
    tern_pool *pool = tern_pool_new(threads);
    double bw = pool ? measure_bandwidth(pool) : 0;
    tern_pool_free(pool);
    return bw;
}

int main(int argc, char **argv)
{
    int n_tokens = 64, n_prompt = 512, threads = 0, runs = 1, profile = 0;
    char *streams = NULL;
    const char *dirs[16];
    int n_dirs = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt") && i + 1 < argc)
            n_prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--exact-products"))
            tern_kernels_exact_set(1);
        else if (!strcmp(argv[i], "--streams") && i + 1 < argc)
            streams = argv[++i];
        else if (!strcmp(argv[i], "--profile"))
            profile = 1;
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (n_dirs < 16)
            dirs[n_dirs++] = argv[i];
    }
    if (!n_dirs || n_tokens < 2 || n_prompt < 1 || runs < 1) {
        fprintf(stderr, "usage: bench_decode [--tokens N] [--prompt N] [--threads N] [--runs N] [--exact-products] [--profile] [--streams 1,4,16] MODEL_DIR...\n");
        return 2;
    }
    tern_pool *pool = tern_pool_new(threads);
    double bw = measure_bandwidth(pool);
    printf("memory read bandwidth: %.1f GB/s (%d threads)\n", bw, tern_pool_size(pool));
    double us[2];
    pool_latency(pool, us);
    printf("pool: a job of no work %.2f us (a part a worker), %.2f us (64 items claimed one by one)\n", us[0], us[1]);
    tern_pool_free(pool);
    printf("quantized products: %s\n", tern_kernels_exact_get() ? "exact (f32 activations)" : "integer (int8 activations)");
    printf("%-28s %6s %10s %10s %10s %8s %12s %8s %14s %14s\n", "model", "isa", "weights", "decode", "floor",
           "of floor", "prefill", "cpu got", "decode/cpu-s", "prefill/cpu-s");
    for (int d = 0; d < n_dirs; d++) {
        tern_err err = {0};
        tern_model *m = model_load(dirs[d], threads, &err);
        if (!m) {
            fprintf(stderr, "bench_decode: %s\n", err.msg);
            return 1;
        }
        const model_config *c = model_config_get(m);
        int ctx = n_prompt + n_tokens + 1;
        kv_pool kv;
        kv_seq seq = {0};
        if (kv_pool_init(&kv, c->n_layer, model_kv_dim(m), KV_BLOCK_DEFAULT, ctx / KV_BLOCK_DEFAULT + 2, &err) ||
            kv_seq_reserve(&kv, &seq, ctx, &err)) {
            fprintf(stderr, "bench_decode: %s\n", err.msg);
            return 1;
        }
        int32_t *tok = malloc((size_t)ctx * sizeof *tok), *pos = malloc((size_t)ctx * sizeof *pos);
        kv_seq **seqs = malloc((size_t)ctx * sizeof *seqs);
        float *logits = malloc((size_t)c->n_vocab * sizeof *logits);
        for (int i = 0; i < ctx; i++) {
            tok[i] = (int32_t)((i * 7919 + 13) % c->n_vocab);
            pos[i] = i;
            seqs[i] = &seq;
        }
        int32_t last = n_prompt - 1;
        double t_prefill = 1e30, t_decode = 1e30, cpu_share = 0, cpu_prefill = 1e30, cpu_decode = 1e30;
        /* one untimed token first, as llama-bench's warm-up run: the weights
         * read in place are faulted in from the file's mapping there, not in
         * the timed prefill (a 1B bf16 model's 512-token prefill measured
         * 38.8 t/s cold against 153.5 warm) */
        if (kv_seq_reserve(&kv, &seq, 1, &err)) {
            fprintf(stderr, "bench_decode: %s\n", err.msg);
            return 1;
        }
        int32_t zero0 = 0;
        fwd_batch wb0 = {1, tok, pos, seqs, 1, &zero0};
        if (model_forward(m, &kv, &wb0, logits, &err)) {
            fprintf(stderr, "bench_decode: %s\n", err.msg);
            return 1;
        }
        for (int run = 0; run < runs; run++) {
            kv_seq_truncate(&kv, &seq, 0);
            if (kv_seq_reserve(&kv, &seq, ctx, &err)) {
                fprintf(stderr, "bench_decode: %s\n", err.msg);
                return 1;
            }
            fwd_batch pb = {n_prompt, tok, pos, seqs, 1, &last};
            double t0 = tern_time_s(), c0 = cpu_s();
            if (model_forward(m, &kv, &pb, logits, &err)) {
                fprintf(stderr, "bench_decode: %s\n", err.msg);
                return 1;
            }
            double tp = tern_time_s() - t0, cp = cpu_s() - c0;
            int32_t zero = 0;
            double t1 = tern_time_s(), c1 = cpu_s();
            for (int i = 0; i < n_tokens; i++) {
                int32_t p = n_prompt + i;
                fwd_batch db = {1, &tok[p], &pos[p], &seqs[p], 1, &zero};
                if (model_forward(m, &kv, &db, logits, &err)) {
                    fprintf(stderr, "bench_decode: %s\n", err.msg);
                    return 1;
                }
            }
            double td = tern_time_s() - t1, cd = cpu_s() - c1;
            if (td < t_decode)
                cpu_share = cd / (td * model_n_threads(m));
            cpu_prefill = cp < cpu_prefill ? cp : cpu_prefill;
            cpu_decode = cd < cpu_decode ? cd : cpu_decode;
            t_prefill = tp < t_prefill ? tp : t_prefill;
            t_decode = td < t_decode ? td : t_decode;
            double b2 = run + 1 < runs ? measure_bandwidth_quick(threads) : 0;
            bw = b2 > bw ? b2 : bw;
        }
        double tps = n_tokens / t_decode;
        double wb = decode_bytes(m);
        double floor_tps = bw * 1e9 / wb;
        const char *name = strrchr(dirs[d], '/') ? strrchr(dirs[d], '/') + 1 : dirs[d];
        printf("%-28s %6s %8.1fMB %7.2f t/s %7.2f t/s %7.0f%% %9.2f t/s %7.0f%% %10.2f t/s %10.2f t/s\n", name,
               tern_kernels_best()->isa, wb / 1e6, tps, floor_tps, 100.0 * tps / floor_tps, n_prompt / t_prefill,
               100.0 * cpu_share, n_tokens / cpu_decode, n_prompt / cpu_prefill);
        if (profile && profile_run(m, &kv, &seq, tok, pos, seqs, n_prompt, n_tokens, logits))
            return 1;
        if (streams) {
            double one = 0, one_c = 0;
            for (char *q = streams; *q;) {
                int ns = (int)strtol(q, &q, 10);
                if (*q == ',')
                    q++;
                if (ns < 1)
                    break;
                double tc = 0, t = streams_run(m, ns, n_tokens, profile, &tc);
                if (t < 0)
                    return 1;
                if (ns == 1 || one == 0)
                    one = t / ns, one_c = tc / ns;
                printf("  %3d streams: %8.2f t/s aggregate decode (%.2fx one stream), %8.2f t/s per CPU second "
                       "(%.2fx)\n", ns, t, t / one, tc, tc / one_c);
            }
        }
        free(tok), free(pos), free(seqs), free(logits);
        kv_seq_free(&kv, &seq);
        kv_pool_free(&kv);
        model_free(m);
    }
    return 0;
}
