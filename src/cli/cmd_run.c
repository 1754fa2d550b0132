/* tern run: one prompt through the engine, streaming only the generated text
 * to stdout (decoded in context: prompt + output == decode(all ids)). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "cli.h"
#include "engine/engine.h"
#include "tensor/kernels.h"

int cmd_run(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *draft_dir = NULL, *spec = NULL, *device = NULL, *v;
    long long n_draft = 4;
    long long max_tokens = 256, seed = -1, top_k = 0, ctx_size = 0, threads = 0;
    double temperature = 0.8, top_p = 1.0;
    int verbose = 0;
    int xf;
    kv_spec ks;
    int kv_given = 0, kr;
    kv_spec_init(&ks, KV_F32);
    for (int i = 1; i < argc; i++) {
        if ((v = cli_flag_value(argc, argv, &i, "--prompt")) || (v = cli_flag_value(argc, argv, &i, "-p")))
            prompt = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--max-tokens")) || (v = cli_flag_value(argc, argv, &i, "-n"))) {
            if (cli_parse_int(v, 1, 1 << 24, &max_tokens))
                goto bad_value;
        } else if ((kr = cli_kv_flag(argc, argv, &i, &ks, &kv_given))) {
            if (kr < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--temperature"))) {
            if (cli_parse_double(v, 0, 100, &temperature))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--top-p"))) {
            if (cli_parse_double(v, 1e-9, 1, &top_p))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--top-k"))) {
            if (cli_parse_int(v, 0, 1 << 24, &top_k))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--ctx-size")) || (v = cli_flag_value(argc, argv, &i, "-c"))) {
            if (cli_parse_int(v, 16, 1 << 24, &ctx_size))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads")) || (v = cli_flag_value(argc, argv, &i, "-t"))) {
            if (cli_parse_int(v, 1, 1024, &threads))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--seed"))) {
            if (cli_parse_int(v, 0, (long long)1 << 62, &seed))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--draft-model"))) {
            draft_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--num-draft-tokens"))) {
            if (cli_parse_int(v, 1, ENGINE_MAX_DRAFT, &n_draft))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--spec"))) {
            if (strcmp(v, "ngram") && strcmp(v, "draft"))
                goto bad_value;
            spec = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--device"))) { /* cpu | cuda[:N] | auto (default) */
            device = v;
        } else if ((xf = cli_experts_flag(argc, argv, &i, "run"))) {
            if (xf < 0)
                return 2;
        } else if (!strcmp(argv[i], "--exact-products")) { /* f32 activations for quantized weights */
            tern_kernels_exact_set(1);
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) { /* ids and timing on stderr */
            verbose = 1;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "tern run: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "tern run: bad value for %s\n", argv[i - 1]);
        return 2;
    }
    if (!dir || !prompt) {
        fprintf(stderr, "usage: tern run MODEL_DIR --prompt TEXT [--max-tokens N] [--temperature T] "
                        "[--top-p P] [--top-k K] [--seed S] [--draft-model DIR] [--num-draft-tokens K] "
                        "[--spec ngram] [-c|--ctx-size N] [-t|--threads N] [--device cpu|cuda|cuda:N|auto] [--exact-products] "
                        "[--kv-type T] [--kv-type-layers SPEC] [--kv-quant-start N] [--verbose]\n");
        return 2;
    }
    if (verbose)
        tern_log_set_level(TERN_LOG_INFO);
    tern_err err = {0};
    int rc = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    tern_engine *eng = NULL;
    engine_req *req = NULL;
    tern_tokenizer *tok = NULL;
    tern_model *draft = NULL;
    char dev_buf[32];
    tern_model *m = cli_load_model(dir, device, (int)threads, dev_buf, sizeof dev_buf, &err);
    model_load_opts lo = {(int)threads, dev_buf}; /* the draft goes on the target's device */
    if (!m)
        goto out;
    if (ctx_size > model_config_get(m)->max_pos) { /* an error, not a silent clamp */
        tern_err_set(&err, TERN_ERANGE, "--ctx-size %lld is above the model's maximum context (%d positions)",
                     ctx_size, model_config_get(m)->max_pos);
        goto out;
    }
    if (!(tok = tokenizer_load(dir, &err)))
        goto out;
    if (draft_dir && !(draft = cli_load_draft(draft_dir, tok, &lo, &err)))
        goto out;
    if (spec && !strcmp(spec, "draft") && !draft) {
        tern_err_set(&err, TERN_EINVAL, "--spec draft needs --draft-model");
        goto out;
    }
    if (tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n, &err))
        goto out;
    engine_opts eo;
    engine_opts_default(&eo);
    eo.max_batch = 1;
    eo.draft = spec && !strcmp(spec, "ngram") ? NULL : draft;
    eo.spec_ngram = spec && !strcmp(spec, "ngram");
    eo.n_draft = (int)n_draft;
    eo.kv_budget_bytes = 0; /* one row: the engine sizes the KV for one full context */
    eo.ctx_size = (int)ctx_size;
    eo.kv = ks;
    eo.kv_type_given = kv_given;
    if (!(eng = engine_new(m, tok, &eo, &err)))
        goto out;
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = n;
    p.max_tokens = (int)max_tokens;
    p.sample.temperature = (float)temperature;
    p.sample.top_p = (float)top_p;
    p.sample.top_k = (int)top_k;
    p.sample.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
    if (!(req = engine_submit(eng, &p, NULL, NULL, &err)))
        goto out;
    engine_event ev;
    int n_gen = 0;
    if (verbose)
        fprintf(stderr, "ids: [");
    for (;;) {
        engine_req_next(req, &ev, -1);
        if (verbose && ev.kind == ENGINE_EV_TOKEN)
            fprintf(stderr, "%s%d", n_gen++ ? ", " : "", ev.token);
        if (ev.text_len)
            fwrite(ev.text, 1, ev.text_len, stdout);
        fflush(stdout);
        if (ev.kind == ENGINE_EV_FINISH) {
            if (verbose)
                fprintf(stderr, "]\n");
            n_gen = ev.usage.n_generated;
            if (ev.finish == ENGINE_FINISH_ERROR)
                tern_err_set(&err, TERN_EINTERNAL, "%s", ev.error);
            else
                rc = 0;
            if (verbose && ev.usage.n_drafted)
                fprintf(stderr, "[speculation: %d drafted, %d accepted, %d target forwards]\n", ev.usage.n_drafted,
                        ev.usage.n_accepted, ev.usage.n_target_forwards);
            if (verbose)
                cli_experts_report(m, stderr);
            if (verbose)
                fprintf(stderr, "[%d prompt tokens, %d generated, finish %s, ttft %.3fs, %.1f tok/s]\n",
                        ev.usage.n_prompt, n_gen, engine_finish_name(ev.finish), ev.usage.ttft_s,
                        ev.usage.decode_s > 0 ? (n_gen - 1) / ev.usage.decode_s : 0.0);
            engine_event_clear(&ev);
            break;
        }
        engine_event_clear(&ev);
    }
    putchar('\n');
    if (rc == 0)
        goto out_quiet;
out:
    fprintf(stderr, "tern run: %s\n", err.msg);
out_quiet:
    engine_req_release(req);
    engine_free(eng);
    free(ids);
    tokenizer_free(tok);
    model_free(draft);
    model_free(m);
    return rc;
}
