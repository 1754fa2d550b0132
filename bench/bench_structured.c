/* bench_structured: the cost of grammar-constrained decoding.
 *
 *   bench_structured MODEL_DIR [--tokens N] [--clients 1,16] [--prompt-len N]
 *
 * For each batch size, the same greedy requests run twice through the
 * engine, without and with a JSON-schema grammar on every row (the
 * adapter of src/engine/constraint.c over the compile cache), and it
 * prints aggregate decode tokens/s, time to first token and the overhead.
 * The grammar (an array of at least 50 objects) cannot end before
 * max_tokens, so both runs decode the same number of tokens. Then compile
 * times: cold (parse + automaton + every token set) and cached, per spec. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "grammar/cache.h"
#include "grammar/frontend.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

static const char *const LONG_SCHEMA =
    "{\"type\":\"array\",\"minItems\":50,\"items\":{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
    "{\"enum\":[\"a\",\"b\",\"c\"]}}},\"required\":[\"name\",\"age\",\"tags\"]}}";

typedef struct spec {
    const char *name;
    int kind; /* 0 schema, 1 builtin json, 2 regex */
    const char *text;
} spec;

static const spec SPECS[] = {
    {"json_object (builtin)", 1, NULL},
    {"schema: array of objects", 0, NULL /* LONG_SCHEMA */},
    {"schema: nested + $ref + enum", 0,
     "{\"$defs\":{\"pt\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":{\"type\":"
     "\"integer\"}},\"required\":[\"x\",\"y\"]}},\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/pt\"},"
     "\"b\":{\"$ref\":\"#/$defs/pt\"},\"color\":{\"enum\":[\"red\",\"green\"]},\"name\":{\"type\":\"string\","
     "\"maxLength\":30}},\"required\":[\"a\",\"b\",\"color\"]}"},
    {"regex: date-time", 2, "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z"},
};

static int build(void *user, char **out, tern_err *err)
{
    const spec *s = user;
    if (s->kind == 1) {
        *out = grammar_json_builtin_ebnf(GRAMMAR_JSON_OBJECT, 1, 20);
        return *out ? 0 : tern_err_set(err, TERN_ENOMEM, "oom");
    }
    if (s->kind == 2)
        return grammar_regex_to_ebnf(s->text, strlen(s->text), out, err);
    const char *t = s->text ? s->text : LONG_SCHEMA;
    json_object *o = tern_json_parse(t, strlen(t), err);
    if (!o)
        return err->code;
    int rc = grammar_schema_to_ebnf(o, NULL, out, err);
    json_object_put(o);
    return rc;
}

static void make_prompt(int32_t *ids, int n, int seed, int n_vocab)
{
    for (int i = 0; i < n; i++)
        ids[i] = 10 + (int32_t)(((unsigned)(i + 1) * 2654435761u + (unsigned)seed * 40503u) % (unsigned)(n_vocab - 20));
}

static void release_ref(void *user)
{
    void **p = user; /* {cache, ref} */
    grammar_cache_release(p[0], p[1]);
    free(p);
}

typedef struct result {
    double tps, ttft_p50, ttft_max;
    long tokens;
} result;

/* Tokens row 0 generated in the last grammar run, for the mask replay. */
static int32_t g_row0[4096];
static int g_n_row0;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int run(tern_model *m, tern_tokenizer *tok, grammar_cache *gc, int clients, int n_tokens, int prompt_len,
               int with_grammar, result *res)
{
    tern_err err = {0};
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = clients;
    o.prefix_cache = 0;
    tern_engine *e = engine_new(m, tok, &o, &err);
    if (!e)
        goto fail;
    engine_req **reqs = calloc((size_t)clients, sizeof *reqs);
    double *ttft = calloc((size_t)clients, sizeof *ttft);
    int32_t *ids = malloc((size_t)prompt_len * sizeof *ids);
    double t0 = tern_time_s(), first = 0, last = 0;
    int32_t V = model_config_get(m)->n_vocab;
    if (with_grammar)
        g_n_row0 = 0;
    for (int c = 0; c < clients; c++) {
        make_prompt(ids, prompt_len, c, V);
        engine_params p;
        engine_params_default(&p);
        p.prompt = ids;
        p.n_prompt = (size_t)prompt_len;
        p.max_tokens = n_tokens;
        p.ignore_eos = 1;
        p.sample.temperature = 0;
        if (with_grammar) {
            int hit;
            double ms;
            grammar_cache_ref *ref = grammar_cache_get(gc, "long", 4, build, (void *)&SPECS[1], &hit, &ms, &err);
            void **rel = malloc(2 * sizeof *rel);
            if (!ref || !rel)
                goto fail;
            rel[0] = gc;
            rel[1] = ref;
            if (constraint_grammar_new(grammar_cache_ref_compiled(ref), NULL, V, release_ref, rel, &p.constraint,
                                       &p.constraint_ctx, &err))
                goto fail;
        }
        if (!(reqs[c] = engine_submit(e, &p, NULL, NULL, &err)))
            goto fail;
    }
    long total = 0;
    for (int c = 0; c < clients; c++) {
        engine_event ev;
        while (engine_req_next(reqs[c], &ev, -1)) {
            int fin = ev.kind == ENGINE_EV_FINISH;
            if (c == 0 && with_grammar && ev.kind == ENGINE_EV_TOKEN && g_n_row0 < 4096)
                g_row0[g_n_row0++] = ev.token;
            if (fin) {
                ttft[c] = ev.usage.ttft_s;
                total += ev.usage.n_generated;
                double f = ev.usage.ttft_s, l = ev.usage.ttft_s + ev.usage.decode_s;
                if (c == 0 || f < first)
                    first = f;
                if (l > last)
                    last = l;
                if (ev.finish == ENGINE_FINISH_ERROR)
                    fprintf(stderr, "bench_structured: row error: %s\n", ev.error);
            }
            engine_event_clear(&ev);
            if (fin)
                break;
        }
        engine_req_release(reqs[c]);
    }
    (void)t0;
    qsort(ttft, (size_t)clients, sizeof *ttft, cmp_d);
    /* decode rate: tokens after each row's first, over the span in which rows decoded */
    res->tps = last > first ? (double)(total - clients) / (last - first) : 0;
    res->ttft_p50 = ttft[clients / 2];
    res->ttft_max = ttft[clients - 1];
    res->tokens = total;
    free(reqs), free(ttft), free(ids);
    engine_free(e);
    return 0;
fail:
    fprintf(stderr, "bench_structured: %s\n", err.msg);
    return 1;
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *levels = "1,16";
    int n_tokens = 64, prompt_len = 32, reps = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prompt-len") && i + 1 < argc)
            prompt_len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
            levels = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            dir = argv[i];
    }
    if (!dir || reps < 1) {
        fprintf(stderr, "usage: bench_structured MODEL_DIR [--tokens N] [--clients 1,16] [--prompt-len N] [--reps N]\n");
        return 2;
    }
    tern_err err = {0};
    tern_model *m = model_load(dir, 0, &err);
    tern_tokenizer *tok = m ? tokenizer_load(dir, &err) : NULL;
    if (!tok) {
        fprintf(stderr, "bench_structured: %s\n", err.msg);
        return 1;
    }
    double tv = tern_time_s();
    const model_config *mc = model_config_get(m);
    grammar_vocab *v = grammar_vocab_new(tok, mc->n_vocab, mc->eos_ids, (size_t)mc->n_eos, &err);
    grammar_cache *gc = v ? grammar_cache_new(v, 0, NULL, &err) : NULL;
    if (!gc) {
        fprintf(stderr, "bench_structured: %s\n", err.msg);
        return 1;
    }
    printf("model %s: vocabulary prepared in %.1f ms (%d tokens)\n", dir, (tern_time_s() - tv) * 1e3,
           tokenizer_vocab_size(tok));

    printf("\ncompile (parse + automaton + all token sets) vs cached lookup\n");
    printf("%-30s %12s %12s %14s\n", "spec", "cold ms", "cached ms", "1st mask ms");
    for (size_t i = 0; i < sizeof SPECS / sizeof SPECS[0]; i++) {
        int hit;
        double cold = 0, warm = 0;
        char key[32];
        snprintf(key, sizeof key, "spec%zu", i);
        grammar_cache_ref *r = grammar_cache_get(gc, key, strlen(key), build, (void *)&SPECS[i], &hit, &cold, &err);
        if (!r) {
            fprintf(stderr, "bench_structured: %s: %s\n", SPECS[i].name, err.msg);
            return 1;
        }
        grammar_cache_ref *r2 = grammar_cache_get(gc, key, strlen(key), build, (void *)&SPECS[i], &hit, &warm, &err);
        /* the first mask of a fresh matcher (lazy caller-chain entries included) */
        const engine_constraint_ops *ops;
        void *ctx;
        double first_ms = -1;
        int32_t nw = (mc->n_vocab + 31) / 32;
        uint32_t *mask = malloc((size_t)nw * sizeof *mask);
        if (mask && constraint_grammar_new(grammar_cache_ref_compiled(r), NULL, mc->n_vocab, NULL, NULL, &ops,
                                           &ctx, &err) == 0) {
            double t = tern_time_s();
            ops->fill_mask(ctx, mask, nw);
            first_ms = (tern_time_s() - t) * 1e3;
            ops->free(ctx);
        }
        free(mask);
        printf("%-30s %12.3f %12.4f %14.3f\n", SPECS[i].name, cold, warm, first_ms);
        grammar_cache_release(gc, r);
        grammar_cache_release(gc, r2);
    }

    printf("\ngreedy decode, %d tokens per row, %d-token prompts, best of %d runs\n", n_tokens, prompt_len, reps);
    printf("%8s %10s %12s %12s %12s\n", "clients", "grammar", "decode tok/s", "ttft p50 s", "ttft max s");
    for (const char *s = levels; *s;) {
        int c = atoi(s);
        result r[2];
        memset(r, 0, sizeof r);
        /* interleaved, best of reps: a busy machine hurts both alike */
        for (int k = 0; k < reps && c > 0; k++)
            for (int g = 0; g < 2; g++) {
                result x;
                if (run(m, tok, gc, c, n_tokens, prompt_len, g, &x))
                    return 1;
                if (x.tps > r[g].tps)
                    r[g] = x;
            }
        if (c > 0) {
            printf("%8d %10s %12.1f %12.4f %12.4f\n", c, "none", r[0].tps, r[0].ttft_p50, r[0].ttft_max);
            printf("%8d %10s %12.1f %12.4f %12.4f   overhead %.1f%% (tokens %ld vs %ld)\n", c, "schema", r[1].tps,
                   r[1].ttft_p50, r[1].ttft_max, r[0].tps > 0 ? 100.0 * (r[0].tps - r[1].tps) / r[0].tps : 0,
                   r[1].tokens, r[0].tokens);
        }
        s = strchr(s, ',');
        if (!s)
            break;
        s++;
    }
    /* The grammar's own cost per token, free of model time: replay row 0's
     * tokens through a fresh constraint, timing mask fill + accept. */
    {
        int hit;
        double ms;
        grammar_cache_ref *ref = grammar_cache_get(gc, "long", 4, build, (void *)&SPECS[1], &hit, &ms, &err);
        const engine_constraint_ops *ops;
        void *ctx;
        int32_t nw = (mc->n_vocab + 31) / 32;
        uint32_t *mask = malloc((size_t)nw * sizeof *mask);
        double best = 1e9;
        for (int k = 0; k < 5 && ref && mask; k++) {
            if (constraint_grammar_new(grammar_cache_ref_compiled(ref), NULL, mc->n_vocab, NULL, NULL, &ops, &ctx,
                                       &err))
                break;
            double t = tern_time_s();
            int n = 0;
            for (; n < g_n_row0; n++)
                if (ops->fill_mask(ctx, mask, nw) || ops->accept(ctx, g_row0[n]))
                    break;
            t = tern_time_s() - t;
            ops->free(ctx);
            if (n > 0 && t / n < best)
                best = t / n;
        }
        if (best < 1e9)
            printf("\ngrammar cost per token (mask fill + accept, row 0's %d tokens replayed): %.2f us\n", g_n_row0,
                   best * 1e6);
        free(mask);
        grammar_cache_release(gc, ref);
    }
    grammar_cache_free(gc);
    grammar_vocab_free(v);
    tokenizer_free(tok);
    model_free(m);
    return 0;
}
