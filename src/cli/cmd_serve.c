/* tern serve: load a model, start the engine and the OpenAI-compatible HTTP
 * server, and run until SIGINT/SIGTERM. Progress goes to stderr. */
#include <dirent.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "cli.h"
#include "engine/engine.h"
#include "engine/kv_events.h"
#include "server/server.h"
#include "server/toolfmt.h"
#include "tensor/kernels.h"

#define SERVE_USAGE                                                                                  \
    "usage: tern serve MODEL_DIR [--host 127.0.0.1] [--port 8080] [--api-key KEY] [--metrics-key KEY]\n" \
    "       tern serve (--models DIR | --model NAME=DIR ...) [--max-memory GB] [--pin NAME ...] [options]\n" \
    "                  [--model-name NAME] [--ctx-size N] [--kv-budget GB] [--max-batch N] [--max-queue N] [--cors ORIGIN]\n" \
    "                  [--kv-type T] [--kv-type-layers SPEC] [--kv-quant-start N]\n" \
    "                  [--timeout S] [--max-connections N] [--max-client-connections N]\n" \
    "                  [--header-deadline S] [--body-deadline S] [--compile-threads N] [--log-format text|json]\n" \
    "                  [--threads N] [--grammar-fallback prompt] [--verbose]\n" \
    "                  [--tool-call-format hermes|llama3_json|mistral|json|none]\n" \
    "                  [--prefill-chunk N] [--draft-model DIR] [--num-draft-tokens K] [--spec ngram]\n" \
    "                  [--grammar-jump] [--reasoning-budget N] [--device cpu|cuda|cuda:N|auto] [--exact-products]\n" \
    "                  [--kv-events ENDPOINT] [--kv-events-replay ENDPOINT] [--kv-events-topic T]\n" \
    "                  [--kv-events-format array|map]\n" \
    "                  [--kv-disk DIR] [--kv-disk-budget SIZE] [--kv-disk-zstd LEVEL]\n"

/* Most models one pool serves (a bound for the argument arrays). */
#define SERVE_MAX_MODELS 256

/* How the pool loads a folder: the same device choice and threads as a
 * single model (the loader thread calls this). */
typedef struct serve_loader {
    const char *device;
    int n_threads;
} serve_loader;

/* The nice value a pool's load parses its tokenizer at (most of a load's
 * CPU time: docs/model-pool.md). */
#define SERVE_TOKENIZER_NICE 10

typedef struct tok_job {
    const char *dir;
    tern_tokenizer *tok;
    tern_err err;
} tok_job;

/* A thread of its own parses the tokenizer at a lower CPU priority, so on a
 * busy machine the other models' streams keep the CPU while a model loads.
 * Only this thread is lowered (Linux: the nice value is per thread), and it
 * starts no threads: nothing the loaded model runs inherits it. */
static void *tok_job_run(void *arg)
{
    tok_job *j = arg;
    (void)setpriority(PRIO_PROCESS, (id_t)gettid(), SERVE_TOKENIZER_NICE); /* best effort */
    j->tok = tokenizer_load(j->dir, &j->err);
    return NULL;
}

static tern_tokenizer *tokenizer_load_low(const char *dir, tern_err *err)
{
    tok_job j = {dir, NULL, {0}};
    pthread_t th;
    if (pthread_create(&th, NULL, tok_job_run, &j) != 0)
        return tokenizer_load(dir, err);
    pthread_join(th, NULL);
    if (!j.tok)
        *err = j.err;
    return j.tok;
}

static int serve_load(void *ctx, const char *dir, tern_model **m, tern_tokenizer **tok, tern_err *err)
{
    const serve_loader *l = ctx;
    char dev[32];
    *tok = NULL;
    if (!(*m = cli_load_model(dir, l->device, l->n_threads, dev, sizeof dev, err)))
        return err->code ? err->code : TERN_EIO;
    if (!(*tok = tokenizer_load_low(dir, err))) {
        model_free(*m);
        *m = NULL;
        return err->code ? err->code : TERN_EIO;
    }
    return 0;
}

/* Adds a model to the pool's list; names must be unique. */
static int spec_add(server_model_spec *specs, int *n, const char *name, const char *dir)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(specs[i].name, name)) {
            fprintf(stderr, "tern serve: two models are named '%s'\n", name);
            return -1;
        }
    if (*n >= SERVE_MAX_MODELS) {
        fprintf(stderr, "tern serve: more than %d models\n", SERVE_MAX_MODELS);
        return -1;
    }
    specs[*n].name = name;
    specs[*n].dir = dir;
    specs[*n].pinned = 0;
    (*n)++;
    return 0;
}

/* --models DIR: every folder in DIR (sorted by name; hidden ones skipped),
 * named by its folder name. A folder that is no model is still listed: the
 * server reports it as failed with the reason. Strings are malloc'd for the
 * process's life. */
static int specs_scan(const char *root, server_model_spec *specs, int *n)
{
    struct dirent **ents = NULL;
    int k = scandir(root, &ents, NULL, alphasort);
    if (k < 0) {
        fprintf(stderr, "tern serve: --models %s: cannot read the folder\n", root);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < k; i++) {
        char path[PATH_MAX];
        struct stat st;
        const char *nm = ents[i]->d_name;
        snprintf(path, sizeof path, "%s/%s", root, nm);
        if (!rc && nm[0] != '.' && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            char *name = strdup(nm), *dir = strdup(path);
            if (!name || !dir || spec_add(specs, n, name, dir))
                rc = -1;
        }
        free(ents[i]);
    }
    free(ents);
    if (!rc && *n == 0) {
        fprintf(stderr, "tern serve: --models %s holds no model folder\n", root);
        rc = -1;
    }
    return rc;
}

/* The load's progress bar: rewritten in place on a terminal, log lines of
 * other threads go above it (base/log.h); a line per step otherwise. */
static void progress(int step, int n_steps, const char *what, double t0)
{
    if (tern_log_get_format() == TERN_LOG_JSON) {
        char f[96];
        snprintf(f, sizeof f, "\"step\":%d,\"steps\":%d,\"elapsed_s\":%.2f", step, n_steps, tern_time_s() - t0);
        tern_log_record(TERN_LOG_INFO, what, NULL, f);
        return;
    }
    const int width = 24;
    int fill = step * width / n_steps;
    char bar[160];
    size_t o = 0;
    bar[o++] = '[';
    for (int i = 0; i < width; i++)
        bar[o++] = i < fill ? '=' : (i == fill ? '>' : ' ');
    snprintf(bar + o, sizeof bar - o, "] %d/%d %s (%.1fs)", step, n_steps, what, tern_time_s() - t0);
    tern_log_progress(bar);
    if (step == n_steps)
        tern_log_progress_end();
}

/* Blocks SIGINT/SIGTERM for every thread started after (the main thread
 * collects them with sigwait). */
static void signals_block(sigset_t *sigs)
{
    sigemptyset(sigs);
    sigaddset(sigs, SIGINT);
    sigaddset(sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void print_serving(const server_opts *so, int port, const char *what)
{
    const char *h = so->host;
    int v6 = strchr(h, ':') != NULL;
    char line[1024];
    snprintf(line, sizeof line, "tern: serving %s on http://%s%s%s:%d (chat page at /, API at /v1)%s", what,
             v6 ? "[" : "", h, v6 ? "]" : "", port, so->api_key ? " [API key required]" : "");
    tern_log_line(line);
}

/* --models DIR / --model NAME=DIR: the pool (src/server/models.c). */
static int serve_pool(server_opts *so, const engine_opts *eo, server_model_spec *specs, int n_specs,
                      const char *const *pins, int n_pins, double max_mem_gb, const char *draft_dir,
                      const char *device, int threads)
{
    if (draft_dir) {
        fprintf(stderr, "tern serve: --draft-model serves one model (use --spec ngram with a pool)\n");
        return 2;
    }
    if (so->model_name && strcmp(so->model_name, "tern") != 0) {
        fprintf(stderr, "tern serve: --model-name names a single model; a pool's are NAME in --model NAME=DIR\n");
        return 2;
    }
    for (int p = 0; p < n_pins; p++) {
        int found = 0;
        for (int i = 0; i < n_specs; i++)
            if (!strcmp(specs[i].name, pins[p]))
                found = specs[i].pinned = 1;
        if (!found) {
            fprintf(stderr, "tern serve: --pin %s names no served model\n", pins[p]);
            return 2;
        }
    }
    serve_loader ld = {device, threads};
    so->models = specs;
    so->n_models = n_specs;
    so->max_memory = (size_t)(max_mem_gb * 1024.0 * 1024.0 * 1024.0);
    so->engine = *eo;
    so->load = serve_load;
    so->load_ctx = &ld;
    so->ctx_size = 0;
    sigset_t sigs;
    signals_block(&sigs);
    tern_err err = {0};
    char head[160];
    snprintf(head, sizeof head, "tern: %d models, %s memory limit%s", n_specs, so->max_memory ? "a" : "no",
             n_pins ? "; loading the pinned ones" : "");
    tern_log_line(head);
    tern_server *srv = server_start(so, NULL, NULL, NULL, &err);
    if (!srv) {
        fprintf(stderr, "tern serve: %s\n", err.msg);
        return 1;
    }
    char names[512];
    size_t off = 0;
    names[0] = 0;
    for (int i = 0; i < n_specs && off < sizeof names - 1; i++) {
        int n = snprintf(names + off, sizeof names - off, "%s%s", i ? "," : "", specs[i].name);
        off += n > 0 ? (size_t)n : 0;
    }
    print_serving(so, server_port(srv), names);
    int sig;
    sigwait(&sigs, &sig);
    tern_log_line(sig == SIGINT ? "tern: interrupted, shutting down" : "tern: terminated, shutting down");
    server_stop(srv);
    server_free(srv); /* the pool's engines, then the rest */
    return 0;
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
    int verbose = 0, kr, json_log = 0;
    const char *draft_dir = NULL, *device = NULL;
    static server_model_spec specs[SERVE_MAX_MODELS];
    const char *pins[SERVE_MAX_MODELS];
    static const char *loras[SERVE_MAX_MODELS * 4];
    int n_specs = 0, n_pins = 0, pool = 0, n_loras = 0;
    double max_mem_gb = 0;
    kv_events_opts ko = {0};
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
        else if ((v = cli_flag_value(argc, argv, &i, "--models"))) {
            pool = 1;
            if (specs_scan(v, specs, &n_specs))
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--model"))) { /* NAME=DIR (or DIR: named by its folder) */
            pool = 1;
            const char *eq = strchr(v, '=');
            char *name = eq ? strndup(v, (size_t)(eq - v)) : NULL;
            if (!name) {
                char buf[PATH_MAX];
                snprintf(buf, sizeof buf, "%s", v);
                for (size_t l = strlen(buf); l > 1 && buf[l - 1] == '/';)
                    buf[--l] = 0;
                name = strdup(basename(buf));
            }
            if (!name || !name[0] || !(eq ? eq[1] : v[0]))
                goto bad_value;
            if (spec_add(specs, &n_specs, name, eq ? eq + 1 : v))
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--lora"))) { /* [BASE:]NAME=DIR, repeatable */
            if (n_loras >= (int)(sizeof loras / sizeof loras[0]) || !strchr(v, '='))
                goto bad_value;
            loras[n_loras++] = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--pin"))) {
            if (n_pins >= SERVE_MAX_MODELS)
                goto bad_value;
            pins[n_pins++] = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--max-memory"))) {
            if (cli_parse_double(v, 0.001, 1 << 20, &max_mem_gb))
                goto bad_value;
        }
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
        } else if ((kr = cli_kv_flag(argc, argv, &i, &eo.kv, &eo.kv_type_given))) {
            if (kr < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-disk"))) {
            eo.kv_disk_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-disk-budget"))) {
            if (cli_parse_size(v, &eo.kv_disk_budget_bytes))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-disk-zstd"))) {
            if (cli_parse_int(v, 0, 19, &x))
                goto bad_value;
            eo.kv_disk_zstd = (int)x;
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
        } else if ((v = cli_flag_value(argc, argv, &i, "--log-format"))) {
            if (strcmp(v, "text") && strcmp(v, "json"))
                goto bad_value;
            json_log = !strcmp(v, "json");
        } else if ((v = cli_flag_value(argc, argv, &i, "--compile-threads"))) {
            if (cli_parse_int(v, 1, 256, &x))
                goto bad_value;
            so.compile_threads = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--header-deadline"))) { /* 0 = none */
            if (cli_parse_int(v, 0, 3600, &x))
                goto bad_value;
            so.header_deadline_s = (int)x;
        } else if ((v = cli_flag_value(argc, argv, &i, "--body-deadline"))) {
            if (cli_parse_int(v, 0, 3600, &x))
                goto bad_value;
            so.body_deadline_s = (int)x;
        } else if ((x = cli_experts_flag(argc, argv, &i, "serve"))) {
            if (x < 0)
                return 2;
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
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-events"))) {
            ko.endpoint = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-events-replay"))) {
            ko.replay_endpoint = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-events-topic"))) {
            eo.kv_events_topic = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--kv-events-format"))) {
            if (strcmp(v, "array") && strcmp(v, "map"))
                goto bad_value;
            ko.format = !strcmp(v, "map") ? KV_EVENTS_MAP : KV_EVENTS_ARRAY;
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
    if (pool && dir) {
        fprintf(stderr, "tern serve: a MODEL_DIR and --models / --model are exclusive (name it --model NAME=%s)\n",
                dir);
        return 2;
    }
    if (!pool && (n_pins || max_mem_gb > 0)) {
        fprintf(stderr, "tern serve: --pin and --max-memory go with --models / --model\n");
        return 2;
    }
    if (!dir && !pool) {
        fputs(SERVE_USAGE, stderr);
        return 2;
    }
    so.loras = loras;
    so.n_loras = n_loras;
    tern_log_set_level(verbose ? TERN_LOG_DEBUG : TERN_LOG_INFO);
    tern_log_set_timestamps(1); /* a server's log is read against the clock */
    tern_log_set_format(json_log ? TERN_LOG_JSON : TERN_LOG_TEXT);
    if ((ko.replay_endpoint || eo.kv_events_topic) && !ko.endpoint) {
        fprintf(stderr, "tern serve: --kv-events-replay and --kv-events-topic go with --kv-events\n");
        return 2;
    }
    kv_events *kev = NULL;
    if (ko.endpoint) {
        tern_err kerr = {0};
        if (!(kev = kv_events_new(&ko, &kerr))) {
            fprintf(stderr, "tern serve: %s\n", kerr.msg);
            return 1;
        }
        eo.kv_events = kev;
    }
    if (pool) {
        int prc = serve_pool(&so, &eo, specs, n_specs, pins, n_pins, max_mem_gb, draft_dir, device, (int)threads);
        kv_events_free(kev);
        return prc;
    }
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
    signals_block(&sigs);

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
    if (eo.kv_disk_dir && kvdisk_model_id(dir, &eo.kv_disk_model_id, &err))
        goto out;
    progress(2, 3, "starting engine", t0);
    if (!(eng = engine_new(m, tok, &eo, &err)))
        goto out;
    int max_pos = model_config_get(m)->max_pos;
    so.ctx_size = eo.ctx_size > 0 ? eo.ctx_size : max_pos;
    if (!(srv = server_start(&so, m, tok, eng, &err)))
        goto out;
    progress(3, 3, "ready", t0);
    print_serving(&so, server_port(srv), so.model_name);
    int sig;
    sigwait(&sigs, &sig);
    tern_log_line(sig == SIGINT ? "tern: interrupted, shutting down" : "tern: terminated, shutting down");
    rc = 0;
    goto out_quiet;
out:
    tern_log_progress_end();
    fprintf(stderr, "tern serve: %s\n", err.msg);
out_quiet:
    server_stop(srv);
    engine_free(eng);
    server_free(srv); /* after the engine: see server_free */
    kv_events_free(kev); /* after the engine: its last batch */
    tokenizer_free(tok);
    model_free(draft);
    model_free(m);
    return rc;
}
