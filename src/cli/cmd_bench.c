/* tern bench: what this machine and model do with each serving feature.
 * Plans the matrix - output feature (plain, json_schema, regex, choice) x
 * speculation (none, draft model, prompt lookup) x concurrent streams x
 * prefix cache (cold, warm) x KV type - runs every cell through the real
 * engine (bench_local.c), optionally the same load against another server
 * (bench_http.c), and writes the reports and plots (bench_report.c). A
 * progress bar on a terminal, one line per cell otherwise. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "bench.h"
#include "cli.h"
#include "model/kv.h"

#define BENCH_USAGE                                                                                            \
    "usage: tern bench MODEL_DIR [--draft DIR] [--device cpu|cuda|cuda:N|auto] [--out DIR] [--quick]\n"        \
    "                  [--compare URL] [--streams 1,4,16,64] [--features plain,json_schema,regex,choice]\n"     \
    "                  [--kv-types f32,bf16,f16,q8,q4,r4,r3]\n"                                                  \
    "                  [--requests N] [--max-tokens N] [--num-draft-tokens K] [-t|--threads N]\n"

/* Why the KV axis has one value: the engine has no KV storage types yet. */
#define KV_NOTE "plain decoding, cold cache, no speculation, once per --kv-types entry; every other cell uses the default KV type"

static int parse_list(const char *s, int *out, int cap, int lo, int hi)
{
    int n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (errno || end == s || v < lo || v > hi || n == cap)
            return -1;
        out[n++] = (int)v;
        if (*end == ',')
            end++;
        else if (*end)
            return -1;
        s = end;
    }
    return n;
}

static int parse_features(const char *s, int *on)
{
    memset(on, 0, BENCH_N_FEATURES * sizeof *on);
    int n = 0;
    while (*s) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        int f = bench_feature_parse(s, len);
        if (f < 0)
            return -1;
        n += !on[f];
        on[f] = 1;
        s += len + (e ? 1 : 0);
    }
    return n;
}

static int mkdir_p(const char *dir)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(buf, 0755) && errno != EEXIST)
                return -1;
            *p = '/';
        }
    return mkdir(buf, 0755) && errno != EEXIST ? -1 : 0;
}

typedef struct progress {
    int tty, n_cells;
    double t0;
} progress;

static void cell_label(const bench_cell *c, char *buf, size_t cap)
{
    if (c->remote)
        snprintf(buf, cap, "compare %s, %d streams", bench_feature_name(c->feature), c->concurrency);
    else
        snprintf(buf, cap, "%s%s%s, %d streams, %s cache", bench_feature_name(c->feature),
                 c->spec ? " +" : "", c->spec ? bench_spec_name(c->spec) : "", c->concurrency,
                 c->warm ? "warm" : "cold");
}

static void progress_show(const progress *p, int done, const bench_cell *next)
{
    if (!p->tty || !next)
        return;
    const int width = 28;
    double el = tern_time_s() - p->t0;
    char label[128], eta[32] = "";
    cell_label(next, label, sizeof label);
    if (done > 0)
        snprintf(eta, sizeof eta, ", ~%.0f s left", el / done * (p->n_cells - done));
    fputs("\r\033[K[", stderr);
    for (int i = 0; i < width; i++)
        fputc(i < done * width / p->n_cells ? '=' : (i == done * width / p->n_cells ? '>' : ' '), stderr);
    fprintf(stderr, "] %d/%d %s (%.0f s%s)", done, p->n_cells, label, el, eta);
    fflush(stderr);
}

static void progress_cell_done(const progress *p, int done, const bench_cell *c)
{
    if (p->tty)
        return;
    char label[128];
    cell_label(c, label, sizeof label);
    fprintf(stderr, "[%d/%d] %s: %.1f tok/s, ttft p50 %.0f ms, %d/%d requests ok (%.1f s)\n", done, p->n_cells, label,
            c->r.tok_s, c->r.ttft_p50 * 1e3, c->r.n_requests - c->r.n_failed, c->r.n_requests, c->r.wall_s);
    fflush(stderr);
}

int cmd_bench(int argc, char **argv)
{
    const char *dir = NULL, *draft_dir = NULL, *device = NULL, *out_dir = "bench-report", *compare = NULL, *v;
    const char *streams_arg = NULL, *features_arg = NULL, *kv_arg = NULL;
    long long threads = 0, min_req = -1, max_tokens = -1, n_draft = 4;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if ((v = cli_flag_value(argc, argv, &i, "--draft")) || (v = cli_flag_value(argc, argv, &i, "--draft-model")))
            draft_dir = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--device")))
            device = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--out")))
            out_dir = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--compare")))
            compare = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--streams")))
            streams_arg = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--features")))
            features_arg = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--kv-types")))
            kv_arg = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--requests"))) {
            if (cli_parse_int(v, 1, 100000, &min_req))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--max-tokens"))) {
            if (cli_parse_int(v, 1, 1 << 16, &max_tokens))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--num-draft-tokens"))) {
            if (cli_parse_int(v, 1, ENGINE_MAX_DRAFT, &n_draft))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads")) || (v = cli_flag_value(argc, argv, &i, "-t"))) {
            if (cli_parse_int(v, 1, 1024, &threads))
                goto bad_value;
        } else if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "tern bench: unexpected argument '%s'\n%s", argv[i], BENCH_USAGE);
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "tern bench: bad value for %s\n", argv[i - 1]);
        return 2;
    }
    if (!dir) {
        fputs(BENCH_USAGE, stderr);
        return 2;
    }
    int streams[16], n_streams, on[BENCH_N_FEATURES];
    n_streams = parse_list(streams_arg ? streams_arg : quick ? "1,8" : "1,4,16,64", streams, 16, 1, 1024);
    if (n_streams <= 0) {
        fprintf(stderr, "tern bench: bad value for --streams (a list such as 1,4,16)\n");
        return 2;
    }
    if (parse_features(features_arg ? features_arg : "plain,json_schema,regex,choice", on) <= 0) {
        fprintf(stderr, "tern bench: bad value for --features (of plain, json_schema, regex, choice)\n");
        return 2;
    }
    /* the KV axis: every type by default, q8 and q4 when quick, none with "" */
    const char *kv_names[KV_TYPE_COUNT];
    int n_kv = 0;
    static char kv_buf[256];
    snprintf(kv_buf, sizeof kv_buf, "%s", kv_arg ? kv_arg : quick ? "q8,q4" : "f32,bf16,f16,q8,q4,r4,r3");
    for (char *save = NULL, *t = strtok_r(kv_buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        kv_type kt;
        tern_err ke = {0};
        if (kv_type_parse(t, &kt, &ke) || n_kv == KV_TYPE_COUNT) {
            fprintf(stderr, "tern bench: bad value for --kv-types: %s\n", ke.msg[0] ? ke.msg : t);
            return 2;
        }
        kv_names[n_kv++] = t;
    }
    int per_stream = quick ? 1 : 2;
    if (min_req < 0)
        min_req = quick ? 4 : 8;
    if (max_tokens < 0)
        max_tokens = quick ? 32 : 64;

    tern_err err = {0};
    int rc = 1;
    tern_model *m = NULL, *draft = NULL;
    tern_tokenizer *tok = NULL;
    grammar_vocab *gv = NULL;
    grammar_cache *gc = NULL;
    bench_cell *cells = NULL;
    bench_local bl = {0};
    bench_http bh;
    bench_run_info info = {0};
    char dev_buf[32];
    if (mkdir_p(out_dir)) {
        tern_err_set(&err, TERN_EIO, "cannot create %s: %s", out_dir, strerror(errno));
        goto out;
    }
    if (compare && bench_http_open(&bh, compare, &err))
        goto out;
    if (!(m = cli_load_model(dir, device, (int)threads, dev_buf, sizeof dev_buf, &err)))
        goto out;
    if (!(tok = tokenizer_load(dir, &err)))
        goto out;
    model_load_opts lo = {(int)threads, dev_buf};
    if (draft_dir && !(draft = cli_load_draft(draft_dir, tok, &lo, &err)))
        goto out;
    const model_config *mc = model_config_get(m);
    if (!(gv = grammar_vocab_new(tok, mc->n_vocab, mc->eos_ids, (size_t)mc->n_eos, &err)))
        goto out;
    if (!(gc = grammar_cache_new(gv, 0, NULL, &err)))
        goto out;
    bl.model = m;
    bl.draft = draft;
    bl.tok = tok;
    bl.gcache = gc;
    bl.n_draft = (int)n_draft;
    if (bench_local_prompts(&bl, dir, &err))
        goto out;
    /* compile each grammar once before any clock runs (a failure here
     * fails that feature's cells, which then report it) */
    for (int f = 0; f < BENCH_N_FEATURES; f++) {
        info.compile_ms[f] = -1;
        if (f == BENCH_PLAIN || !on[f])
            continue;
        int hit;
        tern_err ce = {0};
        const char *key = bench_feature_name((bench_feature)f);
        grammar_cache_ref *ref = grammar_cache_get(gc, key, strlen(key), bench_feature_ebnf, (void *)(intptr_t)f,
                                                   &hit, &info.compile_ms[f], &ce);
        grammar_cache_release(gc, ref);
    }

    /* the matrix: quick keeps the warm cache to runs without speculation */
    int max_cells = 2 * BENCH_N_FEATURES * BENCH_N_SPECS * n_streams + BENCH_N_FEATURES * n_streams + n_kv * n_streams,
        n_cells = 0;
    if (!(cells = calloc((size_t)max_cells, sizeof *cells))) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (int warm = 0; warm < 2; warm++)
        for (int s = 0; s < BENCH_N_SPECS; s++) {
            if ((s == BENCH_SPEC_DRAFT && !draft) || (quick && warm && s != BENCH_SPEC_NONE))
                continue;
            for (int k = 0; k < n_streams; k++)
                for (int f = 0; f < BENCH_N_FEATURES; f++)
                    if (on[f])
                        cells[n_cells++] = (bench_cell){.feature = (bench_feature)f, .spec = (bench_spec)s,
                                                        .concurrency = streams[k], .warm = warm, .kv_type = "default"};
        }
    /* the KV types: plain decoding, cold, at each stream count (quick: the largest) */
    if (on[BENCH_PLAIN])
        for (int t = 0; t < n_kv; t++)
            for (int k = quick ? n_streams - 1 : 0; k < n_streams; k++)
                cells[n_cells++] = (bench_cell){.feature = BENCH_PLAIN, .spec = BENCH_SPEC_NONE,
                                                .concurrency = streams[k], .kv_type = kv_names[t]};
    if (compare)
        for (int k = 0; k < n_streams; k++)
            for (int f = 0; f < BENCH_N_FEATURES; f++)
                if (on[f])
                    cells[n_cells++] = (bench_cell){.feature = (bench_feature)f, .concurrency = streams[k],
                                                    .kv_type = "default", .remote = 1};

    progress pg = {isatty(2), n_cells, tern_time_s()};
    fprintf(stderr, "tern bench: %d cells on %s%s%s -> %s/\n", n_cells, dir, draft ? " with draft " : "",
            draft ? draft_dir : "", out_dir);
    for (int i = 0; i < n_cells; i++) {
        bench_cell *c = &cells[i];
        progress_show(&pg, i, c);
        bench_load load = {(int)min_req, (int)max_tokens};
        if (per_stream * c->concurrency > load.n_requests)
            load.n_requests = per_stream * c->concurrency;
        tern_err ce = {0};
        if (c->remote)
            bench_http_run(&bh, c, &load, &ce);
        else
            bench_local_run(&bl, c, &load, &ce);
        progress_cell_done(&pg, i + 1, c);
    }
    if (pg.tty)
        fputs("\r\033[K", stderr);

    info.model_dir = dir;
    info.draft_dir = draft ? draft_dir : NULL;
    info.device = dev_buf;
    info.compare_url = compare;
    info.compare_model = compare ? bh.model : NULL;
    info.quick = quick;
    info.n_draft = (int)n_draft;
    info.n_threads = threads > 0 ? (int)threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    info.min_requests = (int)min_req;
    info.requests_per_stream = per_stream;
    info.max_tokens = (int)max_tokens;
    info.kv_note = KV_NOTE;
    info.total_s = tern_time_s() - pg.t0;
    int failed = 0;
    long long reqs = 0, freqs = 0;
    for (int i = 0; i < n_cells; i++) {
        failed += cells[i].r.n_failed > 0 || cells[i].r.n_requests == 0;
        reqs += cells[i].r.n_requests;
        freqs += cells[i].r.n_failed;
    }
    int wrc = bench_report_write(out_dir, &info, cells, n_cells, &err);
    fprintf(stderr, "tern bench: %d cells (%d failed), %lld requests (%lld failed) in %.0f s; %s/report.md\n",
            n_cells, failed, reqs, freqs, info.total_s, out_dir);
    if (wrc == TERN_EUNSUPPORTED) /* no gnuplot: the reports stand, the plots are left to render elsewhere */
        fprintf(stderr, "tern bench: warning: %s\n", err.msg);
    else if (wrc)
        goto out;
    rc = 0;
    goto out_quiet;
out:
    fprintf(stderr, "tern bench: %s\n", err.msg);
out_quiet:
    free(cells);
    bench_local_free(&bl);
    grammar_cache_free(gc);
    grammar_vocab_free(gv);
    tokenizer_free(tok);
    model_free(draft);
    model_free(m);
    return rc;
}
