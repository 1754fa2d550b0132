/* tern grammar bench: MaskBench-format files (../shared/data/README.md).
 * For every file: compile its schema (timed), then walk every test
 * instance, serialized as Python's json.dumps does (", " and ": "
 * separators, ASCII-only escapes), token by token, computing every mask
 * (timed) and checking that each token is allowed; an instance is
 * accepted when every token was allowed and a stop token is allowed at
 * the end. The token-level verdict is also checked against the byte-level
 * grammar_check_text (disagreements are counted: they would be bugs).
 * Times are this thread's CPU time (CLOCK_THREAD_CPUTIME_ID). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/json.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "cli/cmd_grammar.h"
#include "tokenizer/tokenizer.h"

static void dumps_string(tern_sbuf *b, const char *s, size_t len)
{
    char tmp[16];
    tern_sbuf_put(b, "\"", 1);
    for (size_t i = 0; i < len;) {
        uint8_t c = (uint8_t)s[i];
        uint32_t cp = c;
        size_t n = 1;
        if (c >= 0xF0 && i + 3 < len) {
            cp = ((uint32_t)(c & 7) << 18) | ((uint32_t)(s[i + 1] & 0x3F) << 12) | ((uint32_t)(s[i + 2] & 0x3F) << 6) |
                 (uint32_t)(s[i + 3] & 0x3F);
            n = 4;
        } else if (c >= 0xE0 && i + 2 < len) {
            cp = ((uint32_t)(c & 15) << 12) | ((uint32_t)(s[i + 1] & 0x3F) << 6) | (uint32_t)(s[i + 2] & 0x3F);
            n = 3;
        } else if (c >= 0xC0 && i + 1 < len) {
            cp = ((uint32_t)(c & 31) << 6) | (uint32_t)(s[i + 1] & 0x3F);
            n = 2;
        }
        i += n;
        switch (cp) {
        case '"': tern_sbuf_str(b, "\\\""); continue;
        case '\\': tern_sbuf_str(b, "\\\\"); continue;
        case '\n': tern_sbuf_str(b, "\\n"); continue;
        case '\r': tern_sbuf_str(b, "\\r"); continue;
        case '\t': tern_sbuf_str(b, "\\t"); continue;
        case '\b': tern_sbuf_str(b, "\\b"); continue;
        case '\f': tern_sbuf_str(b, "\\f"); continue;
        default: break;
        }
        if (cp >= 0x20 && cp < 0x7F) {
            tmp[0] = (char)cp;
            tern_sbuf_put(b, tmp, 1);
        } else if (cp < 0x10000) {
            snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            tern_sbuf_str(b, tmp);
        } else {
            uint32_t v = cp - 0x10000;
            snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            tern_sbuf_str(b, tmp);
        }
    }
    tern_sbuf_put(b, "\"", 1);
}

/* Python json.dumps(o) with the default separators and ensure_ascii. */
static void dumps(tern_sbuf *b, json_object *o)
{
    char tmp[64];
    switch (json_object_get_type(o)) {
    case json_type_null:
        tern_sbuf_str(b, "null");
        break;
    case json_type_boolean:
        tern_sbuf_str(b, json_object_get_boolean(o) ? "true" : "false");
        break;
    case json_type_int:
        snprintf(tmp, sizeof tmp, "%lld", (long long)json_object_get_int64(o));
        tern_sbuf_str(b, tmp);
        break;
    case json_type_double:
        /* json-c keeps the number's source text, which Python wrote */
        tern_sbuf_str(b, json_object_to_json_string(o));
        break;
    case json_type_string:
        dumps_string(b, json_object_get_string(o), (size_t)json_object_get_string_len(o));
        break;
    case json_type_array: {
        size_t n = json_object_array_length(o);
        tern_sbuf_str(b, "[");
        for (size_t i = 0; i < n; i++) {
            if (i)
                tern_sbuf_str(b, ", ");
            dumps(b, json_object_array_get_idx(o, i));
        }
        tern_sbuf_str(b, "]");
        break;
    }
    case json_type_object: {
        int first = 1;
        tern_sbuf_str(b, "{");
        json_object_object_foreach(o, k, val) {
            if (!first)
                tern_sbuf_str(b, ", ");
            first = 0;
            dumps_string(b, k, strlen(k));
            tern_sbuf_str(b, ": ");
            dumps(b, val);
        }
        tern_sbuf_str(b, "}");
        break;
    }
    }
}

/* Thread CPU time in seconds: the bench runs one thread on a machine that
 * may be shared, so wall time would count other processes' slices. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct dvec {
    double *v;
    size_t n, cap;
} dvec;

static void dv_push(dvec *d, double x)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 1024;
        double *nv = realloc(d->v, cap * sizeof *nv);
        if (!nv)
            return;
        d->v = nv;
        d->cap = cap;
    }
    d->v[d->n++] = x;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(dvec *d, double p)
{
    if (!d->n)
        return 0;
    size_t i = (size_t)(p * (double)(d->n - 1) + 0.5);
    return d->v[i];
}

static double avg(const dvec *d)
{
    double s = 0;
    for (size_t i = 0; i < d->n; i++)
        s += d->v[i];
    return d->n ? s / (double)d->n : 0;
}

/* Values of the sorted d above us. */
static size_t over_us(const dvec *d, double us)
{
    size_t n = 0;
    for (size_t i = d->n; i > 0 && d->v[i - 1] > us; i--)
        n++;
    return n;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int grammar_bench_run(const grammar_spec *spec, const grammar_bench_opts *o)
{
    const char *tok_dir = o->tokenizer, *data_dir = o->data;
    long long limit = o->limit;
    int jsonl = o->jsonl;
    tern_err err = {0};
    tern_tokenizer *tok = tokenizer_load(tok_dir, &err);
    if (!tok) {
        fprintf(stderr, "tern grammar bench: %s\n", err.msg);
        return 2;
    }
    double tv0 = cpu_s();
    grammar_vocab *v = grammar_vocab_new(tok, 0, NULL, 0, &err);
    double vocab_ms = (cpu_s() - tv0) * 1e3;
    if (!v) {
        fprintf(stderr, "tern grammar bench: %s\n", err.msg);
        tokenizer_free(tok);
        return 2;
    }
    DIR *d = opendir(data_dir);
    if (!d) {
        fprintf(stderr, "tern grammar bench: cannot open %s\n", data_dir);
        grammar_vocab_free(v);
        tokenizer_free(tok);
        return 2;
    }
    char **names = NULL;
    size_t n_names = 0, cap_names = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json") || (o->match && !strstr(e->d_name, o->match)))
            continue;
        if (n_names == cap_names) {
            cap_names = cap_names ? cap_names * 2 : 256;
            char **nn = realloc(names, cap_names * sizeof *nn);
            if (!nn)
                break;
            names = nn;
        }
        names[n_names++] = strdup(e->d_name);
    }
    closedir(d);
    if (n_names)
        qsort(names, n_names, sizeof *names, cmp_str);
    if (limit >= 0 && (size_t)limit < n_names)
        for (size_t i = (size_t)limit; i < n_names; i++)
            free(names[i]), names[i] = NULL;
    size_t n_files = limit >= 0 && (size_t)limit < n_names ? (size_t)limit : n_names;

    long schemas = 0, compiled = 0, unsupported = 0, failed = 0, valid_total = 0, valid_acc = 0,
         invalid_total = 0, invalid_acc = 0, mismatch = 0, errors = 0;
    long long walks = 0, walk_nodes = 0, class_walks = 0, count_walks = 0, steps = 0, class_builds = 0, class_nodes = 0;
    dvec masks = {0}, comp = {0}, ttfm = {0};
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *mask = calloc(nw, sizeof *mask);
    tern_sbuf text = {0};
    for (size_t f = 0; f < n_files && mask; f++) {
        char *path = tern_path_join(data_dir, names[f]);
        json_object *doc = path ? tern_json_parse_file(path, &err) : NULL;
        free(path);
        if (!doc)
            continue;
        json_object *schema = NULL, *tests = NULL;
        json_object_object_get_ex(doc, "schema", &schema);
        json_object_object_get_ex(doc, "tests", &tests);
        schemas++;
        double t0 = cpu_s();
        char *ebnf = NULL;
        grammar_compiled *cg = NULL;
        grammar_matcher *m = NULL;
        tern_err_clear(&err);
        int rc = grammar_spec_schema_to_ebnf(spec, schema, &ebnf, &err);
        if (!rc) {
            cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &err);
            m = cg ? grammar_matcher_new(cg, &err) : NULL;
        }
        double t1 = cpu_s();
        if (!m) {
            if (err.code == TERN_EUNSUPPORTED)
                unsupported++;
            else
                failed++;
            if (jsonl)
                printf("{\"file\": \"%s\", \"status\": \"%s\", \"error\": \"%s\"}\n", names[f],
                       err.code == TERN_EUNSUPPORTED ? "unsupported" : "failed", tern_err_name(err.code));
            free(ebnf);
            grammar_compiled_free(cg);
            json_object_put(doc);
            continue;
        }
        compiled++;
        dv_push(&comp, (t1 - t0) * 1e3);
        int first_mask = 1;
        long f_valid = 0, f_valid_acc = 0, f_invalid = 0, f_invalid_acc = 0;
        size_t n_tests = tests ? json_object_array_length(tests) : 0;
        for (size_t k = 0; k < n_tests; k++) {
            json_object *t = json_object_array_get_idx(tests, k), *data = NULL, *valid = NULL;
            json_object_object_get_ex(t, "data", &data);
            json_object_object_get_ex(t, "valid", &valid);
            int is_valid = json_object_get_boolean(valid);
            text.n = 0;
            dumps(&text, data);
            if (text.oom || !text.s)
                break;
            int32_t *ids = NULL;
            size_t n_ids = 0;
            if (tokenizer_encode(tok, text.s, text.n, 0, &ids, &n_ids, &err)) {
                errors++;
                continue;
            }
            grammar_matcher_reset(m);
            int ok = 1;
            for (size_t i = 0; i <= n_ids && ok; i++) {
                grammar_compiled_stats s0, s1;
                grammar_compiled_stats_get(cg, &s0);
                double a = cpu_s();
                int n = grammar_matcher_fill_next_token_bitmask(m, mask, nw);
                double b = cpu_s();
                dv_push(&masks, (b - a) * 1e6);
                if (jsonl && o->slow_us >= 0 && (b - a) * 1e6 >= (double)o->slow_us) {
                    grammar_compiled_stats_get(cg, &s1);
                    printf("{\"file\": \"%s\", \"slow_mask_us\": %.1f, \"instance\": %zu, \"token\": %zu, "
                           "\"allowed\": %d, \"walks\": %lld, \"child_walks\": %lld, \"walk_nodes\": %lld, "
                           "\"shared_hits\": %lld, \"steps\": %lld, \"class_builds\": %lld, \"class_nodes\": %lld}\n",
                           names[f], (b - a) * 1e6, k, i, n, s1.entries - s0.entries, s1.children - s0.children,
                           s1.walk_nodes - s0.walk_nodes, s1.shared_hits - s0.shared_hits, s1.steps - s0.steps,
                           s1.class_builds - s0.class_builds, s1.class_nodes - s0.class_nodes);
                }
                if (first_mask) {
                    dv_push(&ttfm, (b - t0) * 1e3);
                    first_mask = 0;
                }
                if (n < 0) {
                    errors++;
                    ok = 0;
                    break;
                }
                if (i == n_ids) {
                    ok = grammar_matcher_can_end(m);
                    break;
                }
                int32_t id = ids[i];
                if (!((mask[id / 32] >> (id % 32)) & 1)) {
                    ok = 0;
                    break;
                }
                if (grammar_matcher_accept_token(m, id) != 1) {
                    mismatch++; /* allowed by the mask but not accepted */
                    ok = 0;
                }
            }
            free(ids);
            int byte_ok = grammar_check_text(grammar_compiled_grammar(cg), text.s, text.n) == 1;
            if (byte_ok != ok)
                mismatch++;
            if (is_valid) {
                f_valid++;
                f_valid_acc += ok;
            } else {
                f_invalid++;
                f_invalid_acc += ok;
            }
        }
        valid_total += f_valid;
        valid_acc += f_valid_acc;
        invalid_total += f_invalid;
        invalid_acc += f_invalid_acc;
        if (jsonl)
            printf("{\"file\": \"%s\", \"status\": \"compiled\", \"compile_ms\": %.3f, \"valid\": %ld, "
                   "\"valid_accepted\": %ld, \"invalid\": %ld, \"invalid_accepted\": %ld}\n",
                   names[f], (t1 - t0) * 1e3, f_valid, f_valid_acc, f_invalid, f_invalid_acc);
        grammar_compiled_stats gs;
        grammar_compiled_stats_get(cg, &gs);
        walks += gs.entries + gs.children;
        walk_nodes += gs.walk_nodes;
        class_walks += gs.class_walks;
        count_walks += gs.count_walks;
        steps += gs.steps;
        class_builds += gs.class_builds;
        class_nodes += gs.class_nodes;
        grammar_matcher_free(m);
        grammar_compiled_free(cg);
        free(ebnf);
        json_object_put(doc);
    }
    double mavg = avg(&masks), cavg = avg(&comp);
    if (masks.n)
        qsort(masks.v, masks.n, sizeof *masks.v, cmp_d);
    if (comp.n)
        qsort(comp.v, comp.n, sizeof *comp.v, cmp_d);
    if (ttfm.n)
        qsort(ttfm.v, ttfm.n, sizeof *ttfm.v, cmp_d);
    printf("{\"engine\": \"tern\", \"schemas\": %ld, \"compiled\": %ld, \"unsupported\": %ld, \"failed\": %ld, "
           "\"compile_ms_p50\": %.3f, \"compile_ms_avg\": %.3f, \"compile_ms_p99\": %.3f, "
           "\"first_mask_ms_p50\": %.3f, \"masks\": %zu, "
           "\"mask_us_avg\": %.2f, \"mask_us_p50\": %.2f, \"mask_us_p99\": %.2f, \"mask_us_max\": %.1f, "
           "\"valid_total\": %ld, \"valid_accepted\": %ld, \"invalid_total\": %ld, \"invalid_accepted\": %ld, "
           "\"token_vs_byte_mismatch\": %ld, \"errors\": %ld, \"walks\": %lld, \"class_walks\": %lld, "
           "\"count_walks\": %lld, \"walk_nodes\": %lld, \"steps\": %lld, \"class_builds\": %lld, \"class_nodes\": %lld, "
           "\"masks_over_1ms\": %zu, "
           "\"masks_over_2ms\": %zu, \"vocab_ms\": %.1f}\n",
           schemas, compiled, unsupported, failed, pct(&comp, 0.5), cavg, pct(&comp, 0.99), pct(&ttfm, 0.5),
           masks.n, mavg, pct(&masks, 0.5), pct(&masks, 0.99), masks.n ? masks.v[masks.n - 1] : 0.0, valid_total,
           valid_acc, invalid_total, invalid_acc, mismatch, errors, walks, class_walks, count_walks, walk_nodes, steps,
           class_builds, class_nodes,
           over_us(&masks, 1000), over_us(&masks, 2000), vocab_ms);
    free(masks.v);
    free(comp.v);
    free(ttfm.v);
    free(text.s);
    free(mask);
    for (size_t i = 0; i < n_files; i++)
        free(names[i]);
    free(names);
    grammar_vocab_free(v);
    tokenizer_free(tok);
    return 0;
}
