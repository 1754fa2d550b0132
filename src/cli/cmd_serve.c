/* tern serve: load a model, start the engine and the OpenAI-compatible HTTP
 * server, and run until SIGINT/SIGTERM. Progress goes to stderr. */
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "cli.h"
#include "engine/engine.h"
#include "server/server.h"
#include "server/toolfmt.h"
#include "tensor/kernels.h"

#define SERVE_USAGE                                                                                  \
    "usage: tern serve MODEL_DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--metrics-key KEY]\n" \
    "                  [--model-name NAME] [--ctx-size N] [--kv-budget GB] [--max-batch N] [--max-queue N] [--cors ORIGIN]\n" \
    "                  [--timeout S] [--max-connections N] [--max-client-connections N]\n" \
    "                  [--header-deadline S] [--body-deadline S] [--threads N] [--grammar-fallback prompt] [--verbose]\n" \
    "                  [--tool-call-format hermes|llama3_json|mistral|json|none]\n" \
    "                  [--prefill-chunk N] [--draft-model DIR] [--num-draft-tokens K] [--spec ngram]\n" \
    "                  [--grammar-jump] [--reasoning-budget N] [--device cpu|cuda|cuda:N|auto] [--exact-products]\n"

static void progress(int step, int n_steps, const char *what, double t0)
{
    const int width = 24;
    int fill = step * width / n_steps;
    int tty = isatty(2);
    fprintf(stderr, "%s[", tty ? "\r\033[K" : "");
    for (int i = 0; i < width; i++)
        fputc(i < fill ? '=' : (i == fill ? '>' : ' '), stderr);
    fprintf(stderr, "] %d/%d %s (%.1fs)%s", step, n_steps, what, tern_time_s() - t0, tty ? "" : "\n");
    fflush(stderr);
}

int cmd_serve(int argc, char **argv)
{
    const char *dir = NULL, *v;
    server_opts so;
    server_opts_default(&so);
    engine_opts eo;
    engine_opts_default(&eo);
    long long x;
    double gb = 0;
    long long threads = 0;
    int verbose = 0;
    const char *draft_dir = NULL, *device = NULL;
    for (int i = 1; i < argc; i++) {
        if ((v = cli_flag_value(argc, argv, &i, "--host")))
            so.host = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--port"))) {
            if (cli_parse_int(v, 0, 65535, &x))
                goto bad_value;
            so.port = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--api-key")))
            so.api_key = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--metrics-key")))
            so.metrics_key = v; /* /stats and /metrics need it */
        else if ((v = cli_flag_value(argc, argv, &i, "--model-name")))
            so.model_name = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--cors")))
            so.cors_origin = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--grammar-fallback"))) {
            if (strcmp(v, "prompt") != 0 && strcmp(v, "none") != 0)
                goto bad_value;
            so.grammar_fallback = !strcmp(v, "prompt");
        } else if ((v = cli_flag_value(argc, argv, &i, "--tool-call-format"))) {
            if (!toolfmt_by_name(v))
                goto bad_value;
            so.tool_call_format = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--ctx-size")) || (v = cli_flag_value(argc, argv, &i, "-c"))) {
            if (cli_parse_int(v, 16, 1 << 24, &x))
                goto bad_value;
            eo.ctx_size = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-budget"))) {
            if (cli_parse_double(v, 0.001, 4096, &gb))
                goto bad_value;
            eo.kv_budget_bytes = (size_t)(gb * 1024.0 * 1024.0 * 1024.0);
        } else if ((v = cli_flag_value(argc, argv, &i, "--max-batch")) ||
                   (v = cli_flag_value(argc, argv, &i, "--batch"))) {
            if (cli_parse_int(v, 1, 4096, &x))
                goto bad_value;
            eo.max_batch = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--max-queue"))) {
            if (cli_parse_int(v, 1, 1 << 20, &x))
                goto bad_value;
            eo.max_queue = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--timeout"))) {
            if (cli_parse_int(v, 1, 3600, &x))
                goto bad_value;
            so.header_timeout_s = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--max-connections"))) { /* one thread each */
            if (cli_parse_int(v, 2, 65536, &x))
                goto bad_value;
            so.max_connections = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--max-client-connections"))) { /* 0 = no cap */
            if (cli_parse_int(v, 0, 65536, &x))
                goto bad_value;
            so.max_client_connections = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--header-deadline"))) { /* 0 = none */
            if (cli_parse_int(v, 0, 3600, &x))
                goto bad_value;
            so.header_deadline_s = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--body-deadline"))) {
            if (cli_parse_int(v, 0, 3600, &x))
                goto bad_value;
            so.body_deadline_s = (int)x;
        } else if (!strcmp(argv[i], "--exact-products")) { /* f32 activations for quantized weights */
            tern_kernels_exact_set(1);
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads")) || (v = cli_flag_value(argc, argv, &i, "-t"))) {
            if (cli_parse_int(v, 1, 1024, &threads))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--prefill-chunk"))) {
            if (cli_parse_int(v, 1, 1 << 20, &x))
                goto bad_value;
            eo.prefill_chunk = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--draft-model"))) {
            draft_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--num-draft-tokens"))) {
            if (cli_parse_int(v, 1, ENGINE_MAX_DRAFT, &x))
                goto bad_value;
            eo.n_draft = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--spec"))) {
            if (strcmp(v, "ngram") && strcmp(v, "draft"))
                goto bad_value;
            eo.spec_ngram = !strcmp(v, "ngram");
        } else if ((v = cli_flag_value(argc, argv, &i, "--device"))) { /* cpu | cuda[:N] | auto (default) */
            device = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--reasoning-budget"))) {
            if (cli_parse_int(v, -1, 1 << 24, &x))
                goto bad_value;
            so.reasoning_budget = (int)x;
        } else if (!strcmp(argv[i], "--grammar-jump")) {
            eo.grammar_jump = 1;
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = 1;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "tern serve: unexpected argument '%s'\n%s", argv[i], SERVE_USAGE);
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "tern serve: bad value for %s\n", argv[i - 1]);
        return 2;
    }
    if (!dir) {
        fputs(SERVE_USAGE, stderr);
        return 2;
    }
    tern_log_set_level(verbose ? TERN_LOG_DEBUG : TERN_LOG_INFO);
    /* the model name defaults to the folder's name */
    char name_buf[PATH_MAX];
    if (!so.model_name || !strcmp(so.model_name, "tern")) {
        snprintf(name_buf, sizeof name_buf, "%s", dir);
        size_t l = strlen(name_buf);
        while (l > 1 && name_buf[l - 1] == '/')
            name_buf[--l] = 0;
        so.model_name = basename(name_buf);
    }
    so.model_dir = dir;

    /* every thread started from here on inherits the blocked signals; the
     * main thread collects them with sigwait */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    tern_err err = {0};
    int rc = 1;
    tern_tokenizer *tok = NULL;
    tern_engine *eng = NULL;
    tern_server *srv = NULL;
    tern_model *draft = NULL;
    double t0 = tern_time_s();
    char dev_buf[32];
    progress(0, 3, "loading model weights", t0);
    tern_model *m = cli_load_model(dir, device, (int)threads, dev_buf, sizeof dev_buf, &err);
    /* the draft model goes on the target's device (its KV shares the pool) */
    model_load_opts lo = {(int)threads, dev_buf};
    if (!m)
        goto out;
    progress(1, 3, "loading tokenizer", t0);
    if (!(tok = tokenizer_load(dir, &err)))
        goto out;
    if (draft_dir && !eo.spec_ngram) {
        progress(2, 3, "loading draft model", t0);
        if (!(draft = cli_load_draft(draft_dir, tok, &lo, &err)))
            goto out;
        eo.draft = draft;
    }
    if (eo.ctx_size > model_config_get(m)->max_pos) { /* an error, not a silent clamp */
        tern_err_set(&err, TERN_ERANGE, "--ctx-size %d is above the model's maximum context (%d positions)",
                     eo.ctx_size, model_config_get(m)->max_pos);
        goto out;
    }
    progress(2, 3, "starting engine", t0);
    if (!(eng = engine_new(m, tok, &eo, &err)))
        goto out;
    int max_pos = model_config_get(m)->max_pos;
    so.ctx_size = eo.ctx_size > 0 ? eo.ctx_size : max_pos;
    if (!(srv = server_start(&so, m, tok, eng, &err)))
        goto out;
    progress(3, 3, "ready", t0);
    if (isatty(2))
        fputc('\n', stderr);
    int port = server_port(srv);
    const char *h = so.host;
    int v6 = strchr(h, ':') != NULL;
    fprintf(stderr, "tern: serving %s on http://%s%s%s:%d (chat page at /, API at /v1)%s\n", so.model_name,
            v6 ? "[" : "", h, v6 ? "]" : "", port, so.api_key ? " [API key required]" : "");
    fflush(stderr);
    int sig;
    sigwait(&sigs, &sig);
    fprintf(stderr, "tern: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
    rc = 0;
    goto out_quiet;
out:
    if (isatty(2))
        fputc('\n', stderr);
    fprintf(stderr, "tern serve: %s\n", err.msg);
out_quiet:
    server_stop(srv);
    engine_free(eng);
    server_free(srv); /* after the engine: see server_free */
    tokenizer_free(tok);
    model_free(draft);
    model_free(m);
    return rc;
}
