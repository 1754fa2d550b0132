/* bench_engine: the step loop under concurrency.
 *
 *   bench_engine MODEL_DIR [--tokens N] [--prompt-len N] [--clients 1,4,16,64]
 *                [--temperature T] [--logprobs N] [--device cpu|cuda|auto]
 *
 * For each concurrency level, submits that many requests at once (greedy,
 * or sampled at --temperature with a seed each; --logprobs N: with
 * logprobs and N alternatives - on a GPU the device sampler reports them,
 * TERN_GPU_SAMPLING=0 brings the logits down for the host's)
 * (distinct prompts of --prompt-len tokens) and prints the aggregate
 * tokens/s (every generated token over the whole wall time, prefills
 * included), the aggregate decode tokens/s (the tokens after each first one
 * over the wall time after the last first token: the steps where all
 * streams decode together), per-stream decode tokens/s (median) and time to
 * first token (p50, max). A one-request warm-up runs first, so that the
 * first level does not pay for faulting the weights in. Then the prefix
 * cache: the same long prompt twice, cold and cached, TTFT each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/engine.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void make_prompt(int32_t *ids, int n, int seed, int n_vocab)
{
    for (int i = 0; i < n; i++)
        ids[i] = 10 + (int32_t)(((unsigned)(i + 1) * 2654435761u + (unsigned)seed * 40503u) % (unsigned)(n_vocab - 20));
}

/* What each request samples with (--temperature, --logprobs). */
static float g_temperature = 0.0f;
static int g_logprobs = -1;

/* clients < 0: one request, nothing printed (the warm-up). */
static int run_level(tern_model *m, tern_tokenizer *tok, int clients, int n_tokens, int prompt_len)
{
    int quiet = clients < 0;
    if (quiet)
        clients = 1;
    tern_err err = {0};
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = clients;
    o.prefix_cache = 0;
    tern_engine *e = engine_new(m, tok, &o, &err);
    if (!e) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        return 1;
    }
    engine_req **reqs = calloc((size_t)clients, sizeof *reqs);
    double *ttft = calloc((size_t)clients, sizeof *ttft), *tps = calloc((size_t)clients, sizeof *tps);
    int32_t *ids = malloc((size_t)prompt_len * sizeof *ids);
    double t0 = tern_time_s();
    for (int c = 0; c < clients; c++) {
        make_prompt(ids, prompt_len, c, model_config_get(m)->n_vocab);
        engine_params p;
        engine_params_default(&p);
        p.prompt = ids;
        p.n_prompt = (size_t)prompt_len;
        p.max_tokens = n_tokens;
        p.ignore_eos = 1;
        p.sample.temperature = g_temperature;
        p.sample.seed = 1000 + (uint64_t)c;
        p.sample.n_logprobs = g_logprobs;
        if (!(reqs[c] = engine_submit(e, &p, NULL, NULL, &err))) {
            fprintf(stderr, "bench_engine: %s\n", err.msg);
            return 1;
        }
    }
    long total = 0, decoded = 0;
    for (int c = 0; c < clients; c++) {
        engine_event ev;
        while (engine_req_next(reqs[c], &ev, -1)) {
            int fin = ev.kind == ENGINE_EV_FINISH;
            if (fin) {
                ttft[c] = ev.usage.ttft_s;
                tps[c] = ev.usage.decode_s > 0 ? (ev.usage.n_generated - 1) / ev.usage.decode_s : 0;
                total += ev.usage.n_generated;
                decoded += ev.usage.n_generated - 1;
            }
            engine_event_clear(&ev);
            if (fin)
                break;
        }
        engine_req_release(reqs[c]);
    }
    double wall = tern_time_s() - t0;
    qsort(ttft, (size_t)clients, sizeof *ttft, cmp_d);
    qsort(tps, (size_t)clients, sizeof *tps, cmp_d);
    if (!quiet)
        printf("%8d %12.1f %13.1f %14.1f %12.3f %12.3f\n", clients, total / wall,
               wall > ttft[clients - 1] ? decoded / (wall - ttft[clients - 1]) : 0.0, tps[clients / 2],
               ttft[clients / 2], ttft[clients - 1]);
    free(reqs), free(ttft), free(tps), free(ids);
    engine_free(e);
    return 0;
}

static double prefix_ttft(tern_engine *e, const int32_t *ids, int n)
{
    tern_err err = {0};
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = (size_t)n;
    p.max_tokens = 1;
    p.sample.temperature = 0;
    engine_req *r = engine_submit(e, &p, NULL, NULL, &err);
    if (!r)
        return -1;
    engine_event ev;
    double t = -1;
    while (engine_req_next(r, &ev, -1)) {
        int fin = ev.kind == ENGINE_EV_FINISH;
        if (fin)
            t = ev.usage.ttft_s;
        engine_event_clear(&ev);
        if (fin)
            break;
    }
    engine_req_release(r);
    return t;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *levels = "1,4,16,64", *device = "cpu";
    int n_tokens = 32, prompt_len = 64, long_len = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt-len") && i + 1 < argc)
            prompt_len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
            levels = argv[++i];
        else if (!strcmp(argv[i], "--long-prompt") && i + 1 < argc)
            long_len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--temperature") && i + 1 < argc)
            g_temperature = (float)atof(argv[++i]);
        else if (!strcmp(argv[i], "--logprobs") && i + 1 < argc)
            g_logprobs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--device") && i + 1 < argc)
            device = argv[++i];
        else
            dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: bench_engine MODEL_DIR [--tokens N] [--prompt-len N] [--clients 1,4,16,64] "
                        "[--long-prompt N] [--temperature T] [--logprobs N] [--device cpu|cuda|auto]\n");
        return 2;
    }
    tern_err err = {0};
    model_load_opts lo = {0, device};
    tern_model *m = model_load_ex(dir, &lo, &err);
    tern_tokenizer *tok = m ? tokenizer_load(dir, &err) : NULL;
    if (!tok) {
        fprintf(stderr, "bench_engine: %s\n", err.msg);
        return 1;
    }
    printf("model %s on %s, %d generated tokens per request, %d-token prompts, temperature %g, logprobs %d\n", dir,
           device, n_tokens, prompt_len, g_temperature, g_logprobs);
    printf("%8s %12s %13s %14s %12s %12s\n", "clients", "agg tok/s", "decode tok/s", "stream tok/s", "ttft p50 s",
           "ttft max s");
    if (run_level(m, tok, -1, 4, 4)) /* warm-up: the weights faulted in, nothing printed */
        return 1;
    for (const char *s = levels; *s;) {
        int c = atoi(s);
        if (c > 0 && run_level(m, tok, c, n_tokens, prompt_len))
            return 1;
        s = strchr(s, ',');
        if (!s)
            break;
        s++;
    }
    int max_pos = model_config_get(m)->max_pos;
    if (long_len >= max_pos)
        long_len = max_pos - 2;
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = 1;
    tern_engine *e = engine_new(m, tok, &o, &err);
    int32_t *ids = malloc((size_t)long_len * sizeof *ids);
    make_prompt(ids, long_len, 7, model_config_get(m)->n_vocab);
    double cold = prefix_ttft(e, ids, long_len), warm = prefix_ttft(e, ids, long_len);
    printf("prefix cache, %d-token prompt: cold ttft %.3f s, cached %.3f s, speed-up %.1fx\n", long_len, cold, warm,
           warm > 0 ? cold / warm : 0);
    free(ids);
    engine_free(e);
    tokenizer_free(tok);
    model_free(m);
    return 0;
}
