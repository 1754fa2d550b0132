/* tern bench: the feature-matrix benchmark. A cell is one point of the
 * matrix (output feature x speculation x concurrent streams x prefix cache
 * x KV type, or the same load against another server over HTTP); running
 * it submits real requests, validates every output and reduces the timings
 * to the numbers of report.json. cmd_bench.c plans the matrix and draws the
 * progress bar; bench_work.c holds the workload and its validators;
 * bench_local.c runs a cell through the engine, bench_http.c through an
 * OpenAI-compatible server; bench_report.c writes report.json, report.md
 * and the gnuplot plots. */
#ifndef TERN_CLI_BENCH_H
#define TERN_CLI_BENCH_H

#include <stddef.h>

#include "base/err.h"
#include "engine/engine.h"
#include "grammar/cache.h"
#include "template/template.h"

/* ---- the workload (bench_work.c) ---- */

typedef enum bench_feature {
    BENCH_PLAIN = 0, /* free text, ignore_eos: every request decodes max_tokens */
    BENCH_JSON,      /* response_format json_schema: a bounded object */
    BENCH_REGEX,     /* a regular expression */
    BENCH_CHOICE,    /* one of a few strings */
    BENCH_N_FEATURES
} bench_feature;

typedef enum bench_spec { BENCH_SPEC_NONE = 0, BENCH_SPEC_DRAFT, BENCH_SPEC_NGRAM, BENCH_N_SPECS } bench_spec;

const char *bench_feature_name(bench_feature f); /* "plain", "json_schema", "regex", "choice" */
const char *bench_spec_name(bench_spec s);       /* "none", "draft", "ngram" */
/* -1 if unknown. */
int bench_feature_parse(const char *s, size_t len);

/* The shared system prompt (what a warm prefix cache holds) and the
 * rotating user messages: request i of a cell asks message i % n. */
const char *bench_system_prompt(void);
int bench_n_messages(void);
const char *bench_message(int i);

/* The feature's constraint as the OpenAI-compatible request states it:
 * the JSON schema text, the regex, or the choice list as a JSON array
 * (NULL for plain). Static strings. */
const char *bench_feature_spec(bench_feature f);

/* Checks an output against its feature with parsers independent of the
 * grammar engine (json-c and a hand check of the schema's rules, PCRE2
 * anchored at both ends, string equality). 0 valid; else -1 with why[]
 * (cap bytes) saying what is wrong. Plain output is always valid. */
int bench_output_check(bench_feature f, const char *text, size_t len, char *why, size_t cap);

/* EBNF of a feature's constraint for the grammar compile cache
 * (grammar_cache_build_fn); user is the feature cast to a pointer. */
int bench_feature_ebnf(void *user, char **ebnf_out, tern_err *err);

/* ---- a cell ---- */

typedef struct bench_result {
    int n_requests, n_failed, n_invalid; /* ran, failed (any reason), of which invalid grammar output */
    long long n_tokens;                  /* generated, over the requests that finished */
    long long n_prompt, n_cached;        /* prompt tokens and how many came from the prefix cache */
    double wall_s;                       /* first submit to last finish */
    double tok_s;                        /* n_tokens / wall_s */
    double ttft_p50, ttft_p99;           /* seconds, submit to first token, over requests */
    double itl_p50, itl_p99;             /* seconds, each request's mean gap between tokens, over requests */
    long long n_drafted, n_accepted;     /* speculation (0 when none) */
    double grammar_us_per_token;         /* mask + accept + rollback time per constrained token; -1 none */
    double rss_peak_mb;                  /* process resident memory, highest sample during the cell */
    double kv_peak_mb;                   /* KV blocks in use at the highest sample (engine cells) */
    char error[256];                     /* the first failure's reason ("" if none) */
} bench_result;

typedef struct bench_cell {
    bench_feature feature;
    bench_spec spec;
    int concurrency;   /* streams kept busy at once */
    int warm;          /* 1: prefix cache on and primed with the system prompt; 0: off */
    const char *kv_type; /* "default" (the engine's), or a --kv-types name */
    int remote;        /* 1: the --compare server */
    int done;          /* ran (its result is filled) */
    bench_result r;
} bench_cell;

/* How much load a cell puts on: n_requests in all, concurrency at a time,
 * each generating at most max_tokens. */
typedef struct bench_load {
    int n_requests;
    int max_tokens;
} bench_load;

/* ---- through the engine (bench_local.c) ---- */

typedef struct bench_local {
    tern_model *model, *draft;        /* borrowed; draft may be NULL */
    const tern_tokenizer *tok;        /* borrowed */
    grammar_cache *gcache;            /* borrowed: compiled once per feature */
    int32_t **prompts;                /* [n_messages][n_prompt[i]] rendered and tokenized */
    size_t *n_prompt;
    int n_prompts;
    int n_draft;                      /* draft tokens per step */
} bench_local;

/* Renders every workload message with the model's chat template and
 * tokenizes it into b->prompts. Returns 0 or a negative TERN_E*. */
int bench_local_prompts(bench_local *b, const char *model_dir, tern_err *err);
void bench_local_free(bench_local *b); /* frees the prompts */

/* Runs the cell through a fresh engine and fills cell->r. A request that
 * fails or whose output does not validate counts as failed; the return is
 * negative only when the cell could not run at all (engine start, grammar
 * compile), with the reason in cell->r.error too. */
int bench_local_run(bench_local *b, bench_cell *cell, const bench_load *load, tern_err *err);

/* ---- over HTTP (bench_http.c) ---- */

typedef struct bench_http {
    char host[256], port[16], base[256]; /* from http://HOST[:PORT][/BASE] ; base without /v1 */
    char model[256];                     /* the server's first model (GET /v1/models) */
} bench_http;

/* Parses url and asks the server for its model. Only plain http. */
int bench_http_open(bench_http *h, const char *url, tern_err *err);
/* The same load through POST /v1/chat/completions (stream), the feature as
 * structured_outputs json, guided_regex or guided_choice, after one
 * unclocked request that primes the server's prefix cache with the shared
 * prompt (as the engine's warm cells). Fills cell->r as bench_local_run
 * does (no speculation, grammar or KV numbers). */
int bench_http_run(bench_http *h, bench_cell *cell, const bench_load *load, tern_err *err);

/* ---- shared numbers (bench_work.c) ---- */

/* The q-quantile (0..1) of v[0..n) by nearest rank; sorts v. 0 if n == 0. */
double bench_quantile(double *v, int n, double q);
/* Current resident set size of this process, MiB. */
double bench_rss_mb(void);

/* ---- output (bench_report.c) ---- */

typedef struct bench_run_info {
    const char *model_dir, *draft_dir, *device, *compare_url, *compare_model;
    int quick, n_draft, n_threads;
    int min_requests, requests_per_stream, max_tokens; /* a cell runs max(min, per_stream x streams) */
    double compile_ms[BENCH_N_FEATURES];              /* each grammar's first compile; -1 none */
    double total_s;
    const char *kv_note; /* why the KV axis has the values it has */
} bench_run_info;

/* Writes DIR/report.json, DIR/report.md, the plots' data and script, and
 * runs gnuplot for DIR/{throughput,latency,speedup}.{png,svg}. Returns 0,
 * or a negative TERN_E* (gnuplot missing or failing is TERN_EUNSUPPORTED /
 * TERN_EIO after the reports are written). */
int bench_report_write(const char *dir, const bench_run_info *info, const bench_cell *cells, int n_cells,
                       tern_err *err);

#endif
