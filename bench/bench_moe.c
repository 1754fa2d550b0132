/* bench_moe: a mixture of experts' decode speed on the GPU next to its
 * active-weights roofline, with the experts in device memory (default) or
 * in pinned host memory behind a device cache (--experts-in host).
 *
 *   bench_moe [--experts-in host] [--expert-cache SIZE] [--prompt N]
 *             [--tokens N] [--batch B,B,...] MODEL_DIR
 *
 * Per batch size B: B sequences, each prefilled with an N-token prompt
 * alone, then --tokens decode steps of all B together, the greedy ids
 * picked on the device (as the engine's greedy steps); tokens/s summed over
 * the batch, timed after two warm-up steps. The roofline is the device's
 * copy bandwidth (bytes read + written a second) over model_weight_bytes -
 * for a mixture, the router and the experts one token runs. With experts
 * in host memory, the expert counters over the decode steps: picks read
 * from the cache and from host memory (the hit rate), bytes copied into
 * the cache and their rate. SIZE as 8G, 512M, 1.5G. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
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
    fprintf(stderr, "bench_moe: %s\n", e->msg);
    return 1;
}

static int parse_size(const char *v, size_t *out)
{
    char *end;
    double x = strtod(v, &end), mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024, end++;
    if (end == v || *end || !(x >= 0))
        return -1;
    *out = (size_t)(x * mul);
    return 0;
}

/* B sequences prefilled alone, then steps decode steps of all B; seconds of
 * the steps after the first two, -1 on failure. */
static double decode_run(tern_model *m, kv_pool *kv, int B, int n_prompt, int steps, const int32_t *prompt,
                         model_experts_stats *x0, tern_err *err)
{
    kv_seq *seq = calloc((size_t)B, sizeof *seq);
    const int n = n_prompt > B ? n_prompt : B;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *tok = malloc(sizeof(int32_t) * (size_t)B),
            *rows = malloc(sizeof(int32_t) * (size_t)B);
    kv_seq **sp = malloc(sizeof(kv_seq *) * (size_t)n);
    double t0 = 0, dt = -1;
    for (int s = 0; s < B; s++) {
        if (kv_seq_reserve(kv, &seq[s], n_prompt + steps, err))
            goto out;
        for (int i = 0; i < n_prompt; i++) {
            pos[i] = i;
            sp[i] = &seq[s];
        }
        int32_t last = n_prompt - 1;
        fwd_batch b = {n_prompt, prompt, pos, sp, 1, &last};
        if (model_forward_start(m, kv, &b, err) || model_forward_argmax(m, NULL, 0, NULL, &tok[s], err))
            goto out;
    }
    for (int st = 0; st < steps; st++) {
        if (st == 2) {
            t0 = now_s();
            model_experts_stats_get(m, x0);
        }
        for (int s = 0; s < B; s++) {
            pos[s] = n_prompt + st;
            sp[s] = &seq[s];
            rows[s] = s;
        }
        fwd_batch b = {B, tok, pos, sp, B, rows};
        if (model_forward_start(m, kv, &b, err) || model_forward_argmax(m, NULL, 0, NULL, tok, err))
            goto out;
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
#endif

int main(int argc, char **argv)
{
#ifndef TERN_CUDA
    (void)argc;
    (void)argv;
    fprintf(stderr, "bench_moe: this tern was built without CUDA (make CUDA=1)\n");
    return 2;
#else
    int n_prompt = 128, steps = 66, where = MODEL_EXPERTS_MAPPED, batches[8] = {1, 32}, n_b = 2;
    size_t cache = 0;
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            dir = a;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_moe: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--prompt"))
            n_prompt = atoi(v);
        else if (!strcmp(a, "--tokens"))
            steps = atoi(v);
        else if (!strcmp(a, "--experts-in") && !strcmp(v, "host"))
            where = MODEL_EXPERTS_HOST;
        else if (!strcmp(a, "--expert-cache") && !parse_size(v, &cache))
            ;
        else if (!strcmp(a, "--batch")) {
            n_b = 0;
            for (const char *p = v; *p && n_b < 8; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
                batches[n_b++] = atoi(p);
        } else {
            fprintf(stderr, "bench_moe: bad option %s %s\n", a, v);
            return 2;
        }
    }
    if (!dir || n_prompt < 1 || steps < 3) {
        fprintf(stderr, "usage: bench_moe [--experts-in host] [--expert-cache SIZE] [--prompt N] [--tokens N] "
                        "[--batch B,...] MODEL_DIR\n");
        return 2;
    }
    if (model_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_moe: no GPU\n");
        return 2;
    }
    if (where == MODEL_EXPERTS_HOST)
        model_experts_opts_set(MODEL_EXPERTS_HOST, cache);
    tern_err err = {0};
    model_load_opts o = {0, "cuda"};
    double tl = now_s();
    tern_model *m = model_load_ex(dir, &o, &err);
    if (!m)
        return die(&err);
    tl = now_s() - tl;
    const model_config *c = model_config_get(m);
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10), wb = (double)model_weight_bytes(m);
    printf("%s: %d layers, %d experts (%d a token), load %.1f s; active weights %.1f MB a token, copy bandwidth %.0f "
           "GB/s, roofline %.1f tok/s; experts in %s%s\n",
           dir, c->n_layer, c->n_expert, c->n_expert_used, tl, wb / 1e6, bw / 1e9, bw / wb,
           where == MODEL_EXPERTS_HOST ? "host memory" : "device memory",
           where == MODEL_EXPERTS_HOST ? " behind a device cache" : "");
    int maxb = 1;
    for (int i = 0; i < n_b; i++)
        maxb = batches[i] > maxb ? batches[i] : maxb;
    const int bs = 16, per = (n_prompt + steps + bs - 1) / bs + 1;
    kv_pool kv;
    if (kv_pool_init(&kv, c->n_layer, model_kv_dim(m), bs, maxb * per + 8, &err))
        return die(&err);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    tern_rng r;
    tern_rng_seed(&r, 42, 0);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(tern_rng_f32(&r) * (c->n_vocab - 1));
    for (int i = 0; i < n_b; i++) {
        model_experts_stats x0, x1;
        memset(&x0, 0, sizeof x0);
        double dt = decode_run(m, &kv, batches[i], n_prompt, steps, prompt, &x0, &err);
        if (dt < 0)
            return die(&err);
        double tps = (double)batches[i] * (steps - 2) / dt;
        printf("  b%-3d %9.1f tok/s", batches[i], tps);
        if (batches[i] == 1)
            printf(" (%.0f%% of the roofline)", 100.0 * tps / (bw / wb));
        if (model_experts_stats_get(m, &x1) == 0 && x1.where == MODEL_EXPERTS_HOST) {
            double h = (double)(x1.hits - x0.hits), ms = (double)(x1.misses - x0.misses);
            double gb = (x1.streamed_bytes - x0.streamed_bytes) / 1e9, s = x1.stream_seconds - x0.stream_seconds;
            printf("; experts: hit rate %.1f%% of %.0f picks, %.2f GB copied into the cache at %.1f GB/s, %.2f of "
                   "%.2f GB cached",
                   h + ms > 0 ? 100 * h / (h + ms) : 0.0, h + ms, gb, s > 0 ? gb / s : 0.0, x1.resident_bytes / 1e9,
                   x1.cache_bytes / 1e9);
        }
        printf("\n");
        fflush(stdout);
    }
    kv_pool_free(&kv);
    free(prompt);
    model_free(m);
    return 0;
#endif
}
