/* tern bench's output: report.json (every cell, with the run's settings),
 * report.md (the table, each feature's cost against plain decoding and
 * each speculation's speed-up against none), and the plots - data files
 * and a gnuplot script written beside the reports, rendered to PNG and SVG
 * by Debian's gnuplot. The derived numbers (speed-up, overhead) are
 * computed once here, so the JSON and the table cannot disagree. */
#include <fcntl.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

static const bench_cell *find(const bench_cell *cells, int n, const bench_cell *like, bench_feature f, bench_spec s)
{
    for (int i = 0; i < n; i++) {
        const bench_cell *c = &cells[i];
        if (c->done && c->feature == f && c->spec == s && c->concurrency == like->concurrency &&
            c->warm == like->warm && c->remote == like->remote && !strcmp(c->kv_type, like->kv_type))
            return c;
    }
    return NULL;
}

static int cell_ok(const bench_cell *c)
{
    return c->done && c->r.n_failed == 0 && c->r.n_requests > 0;
}

/* tok/s of c over the same cell without speculation; NAN if none. */
static double spec_speedup(const bench_cell *cells, int n, const bench_cell *c)
{
    if (c->spec == BENCH_SPEC_NONE)
        return NAN;
    const bench_cell *b = find(cells, n, c, c->feature, BENCH_SPEC_NONE);
    return b && cell_ok(b) && cell_ok(c) && b->r.tok_s > 0 ? c->r.tok_s / b->r.tok_s : NAN;
}

/* Inter-token time without speculation over with it: the decode speed-up
 * alone, free of prefill and queueing; NAN if none. */
static double spec_decode_speedup(const bench_cell *cells, int n, const bench_cell *c)
{
    if (c->spec == BENCH_SPEC_NONE)
        return NAN;
    const bench_cell *b = find(cells, n, c, c->feature, BENCH_SPEC_NONE);
    return b && cell_ok(b) && cell_ok(c) && c->r.itl_p50 > 0 && b->r.itl_p50 > 0 ? b->r.itl_p50 / c->r.itl_p50 : NAN;
}

/* The feature's decode cost per token over plain's (same speculation,
 * streams, cache), in percent of plain's inter-token time; NAN if none. */
static double feature_overhead(const bench_cell *cells, int n, const bench_cell *c)
{
    if (c->feature == BENCH_PLAIN)
        return NAN;
    const bench_cell *b = find(cells, n, c, BENCH_PLAIN, c->spec);
    return b && cell_ok(b) && cell_ok(c) && b->r.itl_p50 > 0 && c->r.itl_p50 > 0
               ? 100.0 * (c->r.itl_p50 / b->r.itl_p50 - 1.0)
               : NAN;
}

static double acceptance(const bench_cell *c)
{
    return c->r.n_drafted > 0 ? (double)c->r.n_accepted / (double)c->r.n_drafted : NAN;
}

static json_object *num_or_null(double v, double scale)
{
    return isnan(v) ? NULL : json_object_new_double(round(v * scale * 1000.0) / 1000.0);
}

/* ---- report.json ---- */

static int write_json(const char *path, const bench_run_info *info, const bench_cell *cells, int n, tern_err *err)
{
    json_object *o = json_object_new_object(), *arr = json_object_new_array();
    json_object_object_add(o, "model", json_object_new_string(info->model_dir));
    json_object_object_add(o, "draft", info->draft_dir ? json_object_new_string(info->draft_dir) : NULL);
    json_object_object_add(o, "device", json_object_new_string(info->device));
    json_object_object_add(o, "threads", json_object_new_int(info->n_threads));
    json_object_object_add(o, "quick", json_object_new_boolean(info->quick));
    json_object_object_add(o, "n_draft", json_object_new_int(info->n_draft));
    json_object *load = json_object_new_object();
    json_object_object_add(load, "min_requests_per_cell", json_object_new_int(info->min_requests));
    json_object_object_add(load, "requests_per_stream", json_object_new_int(info->requests_per_stream));
    json_object_object_add(load, "max_tokens", json_object_new_int(info->max_tokens));
    json_object_object_add(load, "grammar_max_tokens",
                           json_object_new_int(info->max_tokens < 64 ? 64 : info->max_tokens));
    json_object_object_add(load, "sampling", json_object_new_string("greedy"));
    json_object_object_add(o, "load", load);
    json_object *cm = json_object_new_object();
    for (int f = 1; f < BENCH_N_FEATURES; f++)
        json_object_object_add(cm, bench_feature_name((bench_feature)f), num_or_null(info->compile_ms[f] >= 0 ?
                               info->compile_ms[f] : NAN, 1));
    json_object_object_add(o, "grammar_compile_ms", cm);
    json_object *kv = json_object_new_array();
    json_object_array_add(kv, json_object_new_string("default"));
    json_object_object_add(o, "kv_types", kv);
    json_object_object_add(o, "kv_note", json_object_new_string(info->kv_note));
    if (info->compare_url) {
        json_object *cmp = json_object_new_object();
        json_object_object_add(cmp, "url", json_object_new_string(info->compare_url));
        json_object_object_add(cmp, "model", json_object_new_string(info->compare_model ? info->compare_model : ""));
        json_object_object_add(o, "compare", cmp);
    }
    json_object_object_add(o, "total_seconds", json_object_new_double(round(info->total_s * 10) / 10));
    long long req = 0, freq = 0;
    int fcells = 0;
    for (int i = 0; i < n; i++) {
        const bench_cell *c = &cells[i];
        const bench_result *r = &c->r;
        json_object *e = json_object_new_object(), *t = json_object_new_object(), *l = json_object_new_object();
        json_object *mem = json_object_new_object();
        json_object_object_add(e, "target", json_object_new_string(c->remote ? "compare" : "tern"));
        json_object_object_add(e, "feature", json_object_new_string(bench_feature_name(c->feature)));
        json_object_object_add(e, "spec", json_object_new_string(bench_spec_name(c->spec)));
        json_object_object_add(e, "concurrency", json_object_new_int(c->concurrency));
        json_object_object_add(e, "prefix_cache",
                               json_object_new_string(c->remote ? "primed" : c->warm ? "warm" : "cold"));
        json_object_object_add(e, "kv_type", json_object_new_string(c->kv_type));
        json_object_object_add(e, "requests", json_object_new_int(r->n_requests));
        json_object_object_add(e, "failed", json_object_new_int(r->n_failed));
        json_object_object_add(e, "invalid", json_object_new_int(r->n_invalid));
        json_object_object_add(e, "ok", json_object_new_boolean(cell_ok(c)));
        json_object_object_add(e, "error", r->error[0] ? json_object_new_string(r->error) : NULL);
        json_object_object_add(e, "tokens", json_object_new_int64(r->n_tokens));
        json_object_object_add(e, "wall_s", num_or_null(r->wall_s, 1));
        json_object_object_add(e, "tok_s", num_or_null(r->tok_s, 1));
        json_object_object_add(t, "p50", num_or_null(r->ttft_p50, 1e3));
        json_object_object_add(t, "p99", num_or_null(r->ttft_p99, 1e3));
        json_object_object_add(e, "ttft_ms", t);
        json_object_object_add(l, "p50", num_or_null(r->itl_p50, 1e3));
        json_object_object_add(l, "p99", num_or_null(r->itl_p99, 1e3));
        json_object_object_add(e, "inter_token_ms", l);
        json_object_object_add(e, "drafted", json_object_new_int64(r->n_drafted));
        json_object_object_add(e, "accepted", json_object_new_int64(r->n_accepted));
        json_object_object_add(e, "acceptance", num_or_null(acceptance(c), 1));
        json_object_object_add(e, "speedup_vs_no_spec", num_or_null(spec_speedup(cells, n, c), 1));
        json_object_object_add(e, "decode_speedup_vs_no_spec", num_or_null(spec_decode_speedup(cells, n, c), 1));
        json_object_object_add(e, "overhead_vs_plain_pct", num_or_null(feature_overhead(cells, n, c), 1));
        json_object_object_add(e, "grammar_us_per_token",
                               r->grammar_us_per_token >= 0 ? num_or_null(r->grammar_us_per_token, 1) : NULL);
        json_object_object_add(e, "prompt_tokens", json_object_new_int64(r->n_prompt));
        json_object_object_add(e, "cached_tokens", json_object_new_int64(r->n_cached));
        json_object_object_add(mem, "rss_peak_mb", num_or_null(r->rss_peak_mb, 1));
        json_object_object_add(mem, "kv_peak_mb", num_or_null(r->kv_peak_mb, 1));
        json_object_object_add(e, "memory", mem);
        json_object_array_add(arr, e);
        req += r->n_requests;
        freq += r->n_failed;
        fcells += !cell_ok(c);
    }
    json_object_object_add(o, "cells", arr);
    json_object *s = json_object_new_object();
    json_object_object_add(s, "cells", json_object_new_int(n));
    json_object_object_add(s, "failed_cells", json_object_new_int(fcells));
    json_object_object_add(s, "requests", json_object_new_int64(req));
    json_object_object_add(s, "failed_requests", json_object_new_int64(freq));
    json_object_object_add(o, "summary", s);
    int rc = 0;
    if (json_object_to_file_ext(path, o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED))
        rc = tern_err_set(err, TERN_EIO, "cannot write %s", path);
    json_object_put(o);
    return rc;
}

/* ---- report.md ---- */

static void md_num(FILE *f, double v, const char *fmt)
{
    if (isnan(v))
        fputs(" - |", f);
    else {
        fputc(' ', f);
        fprintf(f, fmt, v);
        fputs(" |", f);
    }
}

static int write_md(const char *path, const bench_run_info *info, const bench_cell *cells, int n, tern_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return tern_err_set(err, TERN_EIO, "cannot write %s", path);
    fprintf(f, "# tern bench\n\nModel `%s`%s%s%s on %s (%d threads), %s matrix, %.0f s in all.\n\n", info->model_dir,
            info->draft_dir ? ", draft `" : "", info->draft_dir ? info->draft_dir : "", info->draft_dir ? "`" : "",
            info->device, info->n_threads, info->quick ? "quick" : "full", info->total_s);
    fprintf(f,
            "Each cell keeps `streams` requests in flight until max(%d, %d x streams) requests have run (greedy; "
            "plain rows decode %d tokens, constrained rows until their grammar completes, at most %d). Every constrained output is "
            "checked (json-c, PCRE2, string equality): an invalid one fails its cell. TTFT is submit to first "
            "token; inter-token is each request's mean gap between tokens; p50/p99 are over the cell's requests. "
            "*vs plain* is the feature's inter-token time over plain decoding's in the same setting; *speed-up* "
            "is tok/s over the same cell without speculation (report.json also has the decode speed-up, from "
            "inter-token times). Warm cache: the shared system prompt was cached "
            "before the clock started. KV types: %s.\n\n",
            info->min_requests, info->requests_per_stream, info->max_tokens,
            info->max_tokens < 64 ? 64 : info->max_tokens, info->kv_note);
    for (int remote = 0; remote < 2; remote++) {
        int any = 0;
        for (int i = 0; i < n; i++)
            any |= cells[i].remote == remote;
        if (!any)
            continue;
        if (remote)
            fprintf(f, "\n## The same load against %s (model `%s`)\n\nThat server's own speculation and cache "
                       "settings apply; one unclocked request primes its prefix cache with the shared prompt.\n\n",
                    info->compare_url, info->compare_model ? info->compare_model : "?");
        else
            fprintf(f, "## Matrix\n\n");
        fprintf(f, "| feature | spec | streams | cache | KV | requests (failed) | tok/s | vs plain | TTFT p50 / p99 ms "
                   "| inter-token p50 / p99 ms | acceptance | speed-up | grammar us/tok | RSS MB | KV MB | status |\n");
        fprintf(f, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for (int i = 0; i < n; i++) {
            const bench_cell *c = &cells[i];
            const bench_result *r = &c->r;
            if (c->remote != remote)
                continue;
            fprintf(f, "| %s | %s | %d | %s | %s | %d (%d) |", bench_feature_name(c->feature), bench_spec_name(c->spec),
                    c->concurrency, remote ? "primed" : c->warm ? "warm" : "cold", c->kv_type, r->n_requests,
                    r->n_failed);
            md_num(f, r->tok_s, "%.1f");
            double ov = feature_overhead(cells, n, c);
            if (isnan(ov))
                fputs(" - |", f);
            else
                fprintf(f, " %+.0f%% |", ov);
            fprintf(f, " %.1f / %.1f | %.2f / %.2f |", r->ttft_p50 * 1e3, r->ttft_p99 * 1e3, r->itl_p50 * 1e3,
                    r->itl_p99 * 1e3);
            md_num(f, acceptance(c), "%.2f");
            md_num(f, spec_speedup(cells, n, c), "%.2fx");
            md_num(f, r->grammar_us_per_token >= 0 ? r->grammar_us_per_token : NAN, "%.1f");
            md_num(f, remote ? NAN : r->rss_peak_mb, "%.0f");
            md_num(f, remote ? NAN : r->kv_peak_mb, "%.1f");
            fprintf(f, " %s |\n", cell_ok(c) ? "ok" : "**FAILED**");
        }
    }
    if (info->compare_url) { /* side by side: the same load, no speculation, both caches primed */
        fprintf(f, "\n## Side by side: tern and %s (no speculation, prefix caches primed)\n\n", info->compare_url);
        fprintf(f, "| feature | streams | tern tok/s | other tok/s | tern TTFT p50 ms | other TTFT p50 ms | "
                   "tern inter-token p50 ms | other inter-token p50 ms | failed (tern / other) |\n");
        fprintf(f, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for (int i = 0; i < n; i++) {
            const bench_cell *o = &cells[i], *t = NULL;
            if (!o->remote)
                continue;
            for (int k = 0; k < n && !t; k++)
                if (!cells[k].remote && cells[k].feature == o->feature && cells[k].spec == BENCH_SPEC_NONE &&
                    cells[k].concurrency == o->concurrency && cells[k].warm)
                    t = &cells[k];
            fprintf(f, "| %s | %d |", bench_feature_name(o->feature), o->concurrency);
            md_num(f, t && cell_ok(t) ? t->r.tok_s : NAN, "%.1f");
            md_num(f, cell_ok(o) ? o->r.tok_s : NAN, "%.1f");
            md_num(f, t && cell_ok(t) ? t->r.ttft_p50 * 1e3 : NAN, "%.1f");
            md_num(f, cell_ok(o) ? o->r.ttft_p50 * 1e3 : NAN, "%.1f");
            md_num(f, t && cell_ok(t) ? t->r.itl_p50 * 1e3 : NAN, "%.2f");
            md_num(f, cell_ok(o) ? o->r.itl_p50 * 1e3 : NAN, "%.2f");
            fprintf(f, " %d / %d |\n", t ? t->r.n_failed : -1, o->r.n_failed);
        }
    }
    int nf = 0;
    for (int i = 0; i < n; i++)
        nf += !cell_ok(&cells[i]);
    if (nf) {
        fprintf(f, "\n## Failed cells (%d)\n\n", nf);
        for (int i = 0; i < n; i++)
            if (!cell_ok(&cells[i]))
                fprintf(f, "- %s %s, %s spec, %d streams: %d of %d requests failed (%d invalid outputs): %s\n",
                        cells[i].remote ? "compare" : "tern", bench_feature_name(cells[i].feature),
                        bench_spec_name(cells[i].spec), cells[i].concurrency, cells[i].r.n_failed,
                        cells[i].r.n_requests, cells[i].r.n_invalid, cells[i].r.error);
    }
    fprintf(f, "\n## Plots\n\n![throughput](throughput.png)\n\n![latency](latency.png)\n\n"
               "![speculation](speedup.png)\n");
    int rc = ferror(f) ? tern_err_set(err, TERN_EIO, "cannot write %s", path) : 0;
    fclose(f);
    return rc;
}

/* ---- plots ---- */

static const bench_cell *pick(const bench_cell *cells, int n, int remote, bench_feature f, bench_spec s, int conc,
                              int warm)
{
    for (int i = 0; i < n; i++)
        if (cells[i].done && cells[i].remote == remote && cells[i].feature == f && cells[i].spec == s &&
            cells[i].concurrency == conc && cells[i].warm == warm && !strcmp(cells[i].kv_type, "default"))
            return &cells[i];
    return NULL;
}

/* A value for a data file: "?" (gnuplot's missing mark) unless the cell ran clean. */
static void dat_val(FILE *f, const bench_cell *c, double v)
{
    if (c && cell_ok(c) && !isnan(v))
        fprintf(f, " %.4g", v);
    else
        fputs(" ?", f);
}

static int write_plots(const char *dir, const bench_cell *cells, int n, int *concs, int n_conc, tern_err *err)
{
    char path[4096];
    /* throughput.dat: one block per (target, spec): conc, tok/s per feature */
    snprintf(path, sizeof path, "%s/throughput.dat", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return tern_err_set(err, TERN_EIO, "cannot write %s", path);
    /* panels {remote, spec, warm}: each speculation on a cold cache, then
     * no speculation on a warm one, then the compared server (primed) */
    static const int PLAN[5][3] = {{0, BENCH_SPEC_NONE, 0}, {0, BENCH_SPEC_DRAFT, 0}, {0, BENCH_SPEC_NGRAM, 0},
                                   {0, BENCH_SPEC_NONE, 1}, {1, BENCH_SPEC_NONE, 0}};
    int panels[5][3], n_panels = 0;
    for (int p = 0; p < 5; p++) {
        int remote = PLAN[p][0], s = PLAN[p][1], warm = PLAN[p][2], any = 0;
        for (int k = 0; k < n_conc; k++)
            for (int ft = 0; ft < BENCH_N_FEATURES; ft++) { /* a panel needs one clean value */
                const bench_cell *c = pick(cells, n, remote, (bench_feature)ft, (bench_spec)s, concs[k], warm);
                any |= c && cell_ok(c);
            }
        if (!any)
            continue;
        fprintf(f, "# %s spec=%s cache=%s\n", remote ? "compare" : "tern", bench_spec_name((bench_spec)s),
                remote ? "primed" : warm ? "warm" : "cold");
        for (int k = 0; k < n_conc; k++) {
            fprintf(f, "%d", concs[k]);
            for (int ft = 0; ft < BENCH_N_FEATURES; ft++) {
                const bench_cell *c = pick(cells, n, remote, (bench_feature)ft, (bench_spec)s, concs[k], warm);
                dat_val(f, c, c ? c->r.tok_s : NAN);
            }
            fputc('\n', f);
        }
        fputs("\n\n", f);
        memcpy(panels[n_panels++], PLAN[p], sizeof PLAN[p]);
    }
    fclose(f);
    /* latency.dat: spec none, cold: conc, then per feature ttft p50 p99 itl p50 p99 (ms) */
    snprintf(path, sizeof path, "%s/latency.dat", dir);
    if (!(f = fopen(path, "w")))
        return tern_err_set(err, TERN_EIO, "cannot write %s", path);
    int n_lat = 0;
    for (int k = 0; k < n_conc; k++) {
        fprintf(f, "%d", concs[k]);
        for (int ft = 0; ft < BENCH_N_FEATURES; ft++) {
            const bench_cell *c = pick(cells, n, 0, (bench_feature)ft, BENCH_SPEC_NONE, concs[k], 0);
            n_lat += c && cell_ok(c);
            dat_val(f, c, c ? c->r.ttft_p50 * 1e3 : NAN);
            dat_val(f, c, c ? c->r.ttft_p99 * 1e3 : NAN);
            dat_val(f, c, c ? c->r.itl_p50 * 1e3 : NAN);
            dat_val(f, c, c ? c->r.itl_p99 * 1e3 : NAN);
        }
        fputc('\n', f);
    }
    fclose(f);
    /* speedup.dat: one block per speculation: acceptance, speed-up, label */
    snprintf(path, sizeof path, "%s/speedup.dat", dir);
    if (!(f = fopen(path, "w")))
        return tern_err_set(err, TERN_EIO, "cannot write %s", path);
    int n_points = 0, n_by_spec[BENCH_N_SPECS] = {0};
    for (int s = BENCH_SPEC_DRAFT; s < BENCH_N_SPECS; s++) {
        fprintf(f, "# spec=%s\n", bench_spec_name((bench_spec)s));
        for (int i = 0; i < n; i++) {
            const bench_cell *c = &cells[i];
            double a = acceptance(c), sp = spec_speedup(cells, n, c);
            if (c->remote || (int)c->spec != s || isnan(a) || isnan(sp))
                continue;
            fprintf(f, "%.4f %.4f \"%s c%d%s\"\n", a, sp, bench_feature_name(c->feature), c->concurrency,
                    c->warm ? " w" : "");
            n_points++;
            n_by_spec[s]++;
        }
        fputs("\n\n", f);
    }
    fclose(f);

    snprintf(path, sizeof path, "%s/plots.gp", dir);
    if (!(f = fopen(path, "w")))
        return tern_err_set(err, TERN_EIO, "cannot write %s", path);
    fprintf(f, "# Renders the plots from the .dat files beside it: gnuplot plots.gp\n"
               "set datafile missing '?'\nset grid\nset key top left font ',9'\n"
               "set style line 1 lc rgb '#1f77b4' lw 2 pt 7\nset style line 2 lc rgb '#d62728' lw 2 pt 5\n"
               "set style line 3 lc rgb '#2ca02c' lw 2 pt 9\nset style line 4 lc rgb '#9467bd' lw 2 pt 11\n"
               "set logscale x 2\nset xtics (");
    for (int k = 0; k < n_conc; k++)
        fprintf(f, "%s'%d' %d", k ? ", " : "", concs[k], concs[k]);
    fprintf(f, ")\nset xrange [%g:%g]\n", concs[0] / 1.4, concs[n_conc - 1] * 1.4);
    const char *term[2] = {"pngcairo size %d,%d font 'DejaVu Sans,10'", "svg size %d,%d font 'DejaVu Sans,10' dynamic"};
    const char *ext[2] = {"png", "svg"};
    for (int t = 0; t < 2; t++) {
        int w = n_panels > 3 ? 1800 : n_panels > 2 ? 1500 : 1000;
        fprintf(f, "\nset terminal ");
        fprintf(f, term[t], w, 480);
        fprintf(f, "\nset output 'throughput.%s'\nset multiplot layout 1,%d title 'Throughput vs concurrent streams' "
                   "font ',13'\n",
                ext[t], n_panels > 0 ? n_panels : 1);
        if (n_panels == 0)
            fprintf(f, "set title 'no cell ran clean'\nset yrange [0:1]\nplot 1/0 notitle\n");
        for (int p = 0; p < n_panels; p++) {
            if (panels[p][0])
                fprintf(f, "set title 'compared server (cache primed)'\n");
            else
                fprintf(f, "set title 'speculation: %s, %s cache'\n", bench_spec_name((bench_spec)panels[p][1]),
                        panels[p][2] ? "warm" : "cold");
            fprintf(f, "set xlabel 'concurrent streams'\nset ylabel 'tokens/s (all streams)'\nset yrange [0:*]\n");
            fprintf(f, "plot for [i=1:4] 'throughput.dat' index %d using 1:(column(i+1)) with linespoints ls i "
                       "title word('plain json\\_schema regex choice', i)\n",
                    p);
        }
        fprintf(f, "unset multiplot\n");
        if (n_lat > 0)
            fprintf(f, "set output 'latency.%s'\nset multiplot layout 1,2 title 'Latency percentiles over requests "
                   "(no speculation, cold cache); solid p50, dashed p99' font ',13'\n"
                   "set logscale y\nset yrange [*:*]\n"
                   "set title 'time to first token'\nset ylabel 'ms'\n"
                   "plot for [i=1:4] 'latency.dat' using 1:(column(4*i-2)) with linespoints ls i "
                   "title word('plain json\\_schema regex choice', i).' p50', "
                   "for [i=1:4] 'latency.dat' using 1:(column(4*i-1)) with linespoints ls i dt 2 notitle\n"
                   "set title 'inter-token time (per request mean)'\nset ylabel 'ms'\n"
                   "plot for [i=1:4] 'latency.dat' using 1:(column(4*i)) with linespoints ls i "
                   "title word('plain json\\_schema regex choice', i).' p50', "
                   "for [i=1:4] 'latency.dat' using 1:(column(4*i+1)) with linespoints ls i dt 2 notitle\n"
                   "unset multiplot\nunset logscale y\n",
                ext[t]);
        else /* nothing to draw: say so rather than fail */
            fprintf(f, "set output 'latency.%s'\nset title 'no cell without speculation ran clean'\n"
                       "set yrange [0:1]\nplot 1/0 notitle\n",
                    ext[t]);
        fprintf(f, "set output 'speedup.%s'\nunset logscale x\nset xtics auto\nset xrange [0:1]\nset yrange [0:*]\n"
                   "set title 'Speculation: speed-up over no speculation vs acceptance rate' font ',13'\n"
                   "set xlabel 'acceptance (accepted / drafted tokens)'\nset ylabel 'speed-up (tok/s ratio)'\n"
                   "set key top left\n",
                ext[t]);
        if (n_points) {
            fprintf(f, "plot 1 with lines lc rgb '#777777' dt 3 title 'no gain'");
            if (n_by_spec[BENCH_SPEC_DRAFT])
                fprintf(f, ", 'speedup.dat' index 0 using 1:2 with points ls 1 ps 1.5 title 'draft model', "
                           "'' index 0 using 1:2:3 with labels offset 0,0.9 font ',8' noenhanced notitle");
            if (n_by_spec[BENCH_SPEC_NGRAM])
                fprintf(f, ", 'speedup.dat' index 1 using 1:2 with points ls 2 ps 1.5 title 'prompt lookup (ngram)', "
                           "'' index 1 using 1:2:3 with labels offset 0,-0.9 font ',8' noenhanced notitle");
            fputc('\n', f);
        }
        if (!n_points)
            fprintf(f, "set label 1 'no speculation cell ran clean' at 0.5,0.5 center\nset yrange [0:1]\n"
                       "plot 1 with lines lc rgb '#777777' dt 3 title 'no gain'\nunset label 1\n");
        fprintf(f, "set logscale x 2\nset xtics (");
        for (int k = 0; k < n_conc; k++)
            fprintf(f, "%s'%d' %d", k ? ", " : "", concs[k], concs[k]);
        fprintf(f, ")\nset xrange [%g:%g]\nset key top left font ',9'\nunset output\n", concs[0] / 1.4,
                concs[n_conc - 1] * 1.4);
    }
    fclose(f);
    /* gnuplot runs in dir so the script stays relative (it can be rerun there) */
    pid_t pid = fork();
    if (pid < 0)
        return tern_err_set(err, TERN_EIO, "cannot start gnuplot");
    if (pid == 0) {
        if (chdir(dir) == 0) {
            int devnull = open("/dev/null", O_RDONLY);
            int log = open("plots.log", O_WRONLY | O_CREAT | O_TRUNC, 0644); /* gnuplot's warnings */
            if (devnull >= 0)
                dup2(devnull, 0);
            if (log >= 0)
                dup2(log, 2);
            execlp("gnuplot", "gnuplot", "plots.gp", (char *)NULL);
        }
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return tern_err_set(err, TERN_EUNSUPPORTED, "gnuplot is not installed (scripts/install-deps.sh installs it): "
                                                    "the plots' data and script are in %s", dir);
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        return tern_err_set(err, TERN_EIO, "gnuplot failed on %s/plots.gp (its messages: %s/plots.log)", dir, dir);
    return 0;
}

int bench_report_write(const char *dir, const bench_run_info *info, const bench_cell *cells, int n_cells,
                       tern_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/report.json", dir);
    int rc = write_json(path, info, cells, n_cells, err);
    if (rc)
        return rc;
    snprintf(path, sizeof path, "%s/report.md", dir);
    if ((rc = write_md(path, info, cells, n_cells, err)))
        return rc;
    int concs[64], n_conc = 0;
    for (int i = 0; i < n_cells; i++) {
        int c = cells[i].concurrency, k = 0;
        while (k < n_conc && concs[k] != c)
            k++;
        if (k == n_conc && n_conc < 64)
            concs[n_conc++] = c;
    }
    for (int i = 1; i < n_conc; i++) /* ascending */
        for (int j = i; j > 0 && concs[j] < concs[j - 1]; j--) {
            int t = concs[j];
            concs[j] = concs[j - 1];
            concs[j - 1] = t;
        }
    if (n_conc == 0)
        return 0;
    return write_plots(dir, cells, n_cells, concs, n_conc, err);
}
