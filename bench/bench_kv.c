/* Decode speed per KV type at long contexts: the cache of one sequence is
 * filled with C positions of random K/V (kv_row_store, the same encoding
 * the forward does; a prefill of 32k tokens would take minutes on a small
 * CPU and measures something else), then N single-token forwards at
 * positions C, C+1, ... are timed. Prints one line per (type, context):
 * decode tokens/s (and per process CPU second: with --threads 1 a measure
 * that a shared machine's load does not move) and the KV bytes one step
 * reads. On a device (cuda) the
 * cache lives there only: nothing is filled (the device cache holds
 * whatever its memory held - the attention reads every position all the
 * same, and its speed does not depend on the values).
 *
 *   bench_kv [--ctx 8192,32768] [--tokens 8] [--types f32,bf16,q8,q4,r4]
 *            [--threads N] [--device cpu|cuda] MODEL_DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t g_rng = 88172645463325252ull;
static float frand(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *ctxs = "8192,32768", *types = "f32,bf16,f16,q8,q4,r4,r3", *device = "cpu";
    int n_tok = 8, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx") && i + 1 < argc)
            ctxs = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n_tok = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc)
            types = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else
            dir = argv[i];
    }
    if (!dir || n_tok < 1) {
        fprintf(stderr, "usage: bench_kv [--ctx 8192,32768] [--tokens N] [--types LIST] [--threads N] "
                        "[--device cpu|cuda] MODEL_DIR\n");
        return 2;
    }
    tern_err err = {0};
    model_load_opts lo = {threads, device};
    tern_model *m = model_load_ex(dir, &lo, &err);
    if (!m) {
        fprintf(stderr, "bench_kv: %s\n", err.msg);
        return 1;
    }
    const model_config *c = model_config_get(m);
    int V = c->n_vocab, kvd = model_kv_dim(m);
    float *logits = malloc((size_t)V * sizeof *logits), *k = malloc((size_t)kvd * 4), *v = malloc((size_t)kvd * 4),
          *rot = malloc((size_t)kvd * 4);
    printf("model %s, %d threads, %d layers, %d KV heads of %d\n", dir, model_n_threads(m), c->n_layer, c->n_kv_head,
           c->head_dim);
    char tl[256];
    snprintf(tl, sizeof tl, "%s", types);
    for (char *ts = strtok(tl, ","); ts; ts = strtok(NULL, ",")) {
        kv_spec s;
        kv_spec_init(&s, KV_F32);
        if (kv_type_parse(ts, &s.type, &err)) {
            fprintf(stderr, "bench_kv: %s\n", err.msg);
            return 2;
        }
        char cl[128];
        snprintf(cl, sizeof cl, "%s", ctxs);
        char *save = NULL;
        for (char *cs = strtok_r(cl, ",", &save); cs; cs = strtok_r(NULL, ",", &save)) {
            int C = atoi(cs);
            if (C < 1 || C + n_tok > c->max_pos) {
                printf("%-5s ctx %6d: past the model's %d positions\n", ts, C, c->max_pos);
                continue;
            }
            kv_pool kv;
            kv_seq seq = {0};
            int nb = (C + n_tok) / KV_BLOCK_DEFAULT + 2, on_host = !strcmp(device, "cpu");
            if (model_kv_pool_init(m, &kv, &s, KV_BLOCK_DEFAULT, nb, 0, on_host, &err) ||
                kv_seq_reserve(&kv, &seq, C + n_tok, &err)) {
                printf("%-5s ctx %6d: %s\n", ts, C, err.msg);
                continue;
            }
            for (int l = 0; on_host && l < c->n_layer; l++)
                for (int p = 0; p < C; p++) {
                    for (int e = 0; e < kvd; e++) {
                        k[e] = frand() * 2.0f;
                        v[e] = frand();
                    }
                    kv_row_store(&kv, &seq, l, p, k, v, rot);
                }
            seq.n_tokens = C;
            double t0 = 0, c0 = 0;
            for (int i = -1; i < n_tok; i++) { /* one warm-up step */
                if (i == 0) {
                    t0 = now_s();
                    c0 = cpu_s();
                }
                int32_t tok = 1 + (i + 1) % 100, pos = C + (i < 0 ? 0 : i), row = 0;
                kv_seq *sp = &seq;
                fwd_batch b = {1, &tok, &pos, &sp, 1, &row};
                if (model_forward(m, &kv, &b, logits, &err)) {
                    fprintf(stderr, "bench_kv: %s\n", err.msg);
                    return 1;
                }
                if (i < 0)
                    seq.n_tokens = C; /* the warm-up position is written again */
            }
            double dt = now_s() - t0, dc = cpu_s() - c0;
            size_t kv_step = kv_spec_block_bytes(&s, c->n_layer, c->n_kv_head, c->head_dim, 1, 0) * (size_t)C;
            printf("%-5s ctx %6d: decode %8.2f tok/s (%8.2f a CPU second), KV read per token %8.1f MB\n", ts, C,
                   n_tok / dt, n_tok / dc, kv_step / 1e6);
            fflush(stdout);
            kv_seq_free(&kv, &seq);
            kv_pool_free(&kv);
        }
    }
    free(logits);
    free(k);
    free(v);
    free(rot);
    model_free(m);
    return 0;
}
