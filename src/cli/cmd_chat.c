/* tern chat: an interactive chat in the terminal. Each turn renders the whole
 * conversation with the model's chat template (as the server does for
 * /v1/chat/completions), so the prefix cache reuses the previous turns' KV;
 * the answer streams as it is sampled, a thought block shown dimmed (or
 * between [thinking] lines when the output is not a terminal). Commands:
 * /reset, /undo, /system TEXT, /think on|off, /help, /exit. Ctrl-C stops an
 * answer; at the prompt it (or end of input) leaves. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "base/log.h"
#include "base/strbuf.h"
#include "cli.h"
#include "engine/engine.h"
#include "server/reasoning.h"
#include "template/template.h"
#include "tensor/kernels.h"

#define DIM "\033[2m"
#define BOLD "\033[1m"
#define RESET "\033[0m"

static volatile sig_atomic_t chat_interrupted;

static void chat_on_sigint(int sig)
{
    (void)sig;
    chat_interrupted = 1;
}

typedef struct chat_session {
    tern_engine *eng;
    const tern_tokenizer *tok;
    tern_chat_template ct;
    json_object *messages; /* the conversation, system message first when set */
    char *system;          /* NULL: none */
    int think;             /* -1: the template's default, 0 off, 1 on */
    int has_think;
    reasoning_delims delims;
    engine_params base;    /* sampling and limits of every turn */
    int color, show_thinking, verbose;
    int ctx; /* positions per sequence */
} chat_session;

/* Restarts the conversation: only the system message (if any) is kept. */
static int chat_reset(chat_session *c)
{
    json_object_put(c->messages);
    if (!(c->messages = json_object_new_array()))
        return TERN_ENOMEM;
    if (c->system) {
        json_object *m = json_object_new_object();
        json_object_object_add(m, "role", json_object_new_string("system"));
        json_object_object_add(m, "content", json_object_new_string(c->system));
        json_object_array_add(c->messages, m);
    }
    return 0;
}

static int chat_push(chat_session *c, const char *role, const char *content, size_t len)
{
    json_object *m = json_object_new_object();
    if (!m)
        return TERN_ENOMEM;
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", json_object_new_string_len(content, (int)len));
    return json_object_array_add(c->messages, m) ? TERN_ENOMEM : 0;
}

/* Index of the first message that is not the system message. */
static size_t chat_first_turn(const chat_session *c)
{
    return c->system ? 1 : 0;
}

/* Drops the last user message and everything after it; 0 if there was none. */
static int chat_undo(chat_session *c)
{
    size_t n = json_object_array_length(c->messages);
    for (size_t i = n; i > chat_first_turn(c); i--) {
        json_object *role;
        json_object_object_get_ex(json_object_array_get_idx(c->messages, i - 1), "role", &role);
        if (!strcmp(json_object_get_string(role), "user")) {
            json_object_array_del_idx(c->messages, i - 1, n - (i - 1));
            return 1;
        }
    }
    return 0;
}

/* Renders the conversation and encodes it. *boundary is where the prompt
 * without the generation primer ends (the part the next turn shares). */
static int chat_prompt(chat_session *c, int32_t **ids, size_t *n, size_t *boundary, tern_err *err)
{
    int rc = TERN_ENOMEM;
    char *text = NULL;
    int32_t *pre = NULL;
    size_t len, n_pre = 0;
    *ids = NULL;
    *n = *boundary = 0;
    json_object *rq = json_object_new_object();
    if (!rq)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    json_object_object_add(rq, "messages", json_object_get(c->messages));
    if (c->think >= 0)
        json_object_object_add(rq, "enable_thinking", json_object_new_boolean(c->think));
    for (int add_gen = 0; add_gen <= 1; add_gen++) {
        json_object_object_add(rq, "add_generation_prompt", json_object_new_boolean(add_gen));
        free(text);
        if (!(text = tern_chat_template_apply(&c->ct, rq, NULL, &len, err))) {
            rc = err->code;
            goto out;
        }
        if ((rc = tokenizer_encode(c->tok, text, len, 0, add_gen ? ids : &pre, add_gen ? n : &n_pre, err)))
            goto out;
    }
    if (n_pre <= *n && !memcmp(pre, *ids, n_pre * sizeof *pre))
        *boundary = n_pre;
    rc = 0;
out:
    json_object_put(rq);
    free(text);
    free(pre);
    return rc;
}

/* Prints newly split text: the thought dimmed (or between [thinking] lines),
 * the answer plain. *in_thought tracks what is open on the screen. */
static void chat_show(chat_session *c, tern_sbuf *thought, tern_sbuf *answer, int *in_thought)
{
    if (thought->n && c->show_thinking) {
        if (!*in_thought)
            fputs(c->color ? DIM : "[thinking]\n", stdout);
        *in_thought = 1;
        fwrite(thought->s, 1, thought->n, stdout);
    }
    if (answer->n) {
        if (*in_thought)
            fputs(c->color ? RESET "\n\n" : "\n[/thinking]\n", stdout);
        *in_thought = 0;
        fwrite(answer->s, 1, answer->n, stdout);
    }
    fflush(stdout);
    thought->n = answer->n = 0;
}

/* One exchange: the user's text in, the answer streamed out and kept in the
 * conversation. Oldest turns are dropped while the prompt cannot fit. */
static int chat_turn(chat_session *c, const char *text, size_t len, tern_err *err)
{
    int rc;
    int32_t *ids = NULL;
    size_t n, boundary;
    engine_req *req = NULL;
    tern_sbuf thought = {0}, answer = {0}, kept = {0};
    reasoning_split rs;
    int dropped = 0, in_thought = 0;
    if ((rc = chat_push(c, "user", text, len)))
        return tern_err_set(err, rc, "out of memory");
    engine_params p = c->base;
    for (;;) {
        free(ids);
        if ((rc = chat_prompt(c, &ids, &n, &boundary, err)))
            goto fail;
        size_t first = chat_first_turn(c), total = json_object_array_length(c->messages);
        long room = (long)c->ctx - (long)n, want = c->base.max_tokens > 0 ? c->base.max_tokens : c->ctx;
        if (room >= (want < c->ctx / 4 ? want : c->ctx / 4) || (total - first <= 1 && room > 0)) {
            p.max_tokens = (int)(room < want ? room : want);
            break;
        }
        if (total - first <= 1) {
            rc = tern_err_set(err, TERN_ERANGE, "the message (%zu tokens with the template) does not fit the "
                              "context of %d positions", n, c->ctx);
            goto fail;
        }
        size_t k = first + 1; /* forget the oldest exchange: up to the next user message */
        while (k < total - 1) {
            json_object *role;
            json_object_object_get_ex(json_object_array_get_idx(c->messages, k), "role", &role);
            if (!strcmp(json_object_get_string(role), "user"))
                break;
            k++;
        }
        json_object_array_del_idx(c->messages, first, k - first);
        dropped++;
    }
    p.prompt = ids;
    p.n_prompt = n;
    p.cache_boundary = boundary;
    p.sample.seed++; /* a fresh draw each turn, reproducible from --seed */
    if (!(req = engine_submit(c->eng, &p, NULL, NULL, err))) {
        rc = err->code;
        goto fail;
    }
    c->base.sample.seed = p.sample.seed;
    if (dropped)
        fprintf(stderr, "%s[the conversation no longer fits the context: %d old exchange%s dropped]%s\n",
                c->color ? DIM : "", dropped, dropped > 1 ? "s" : "", c->color ? RESET : "");
    reasoning_start st = c->has_think ? reasoning_start_of(&c->delims, ids, n, boundary, c->think == 0)
                                      : REASONING_START_ANSWER;
    reasoning_split_init(&rs, c->has_think ? &c->delims : NULL, st);
    engine_event ev;
    engine_usage usage = {0};
    engine_finish fin = ENGINE_FINISH_NONE;
    char error[TERN_ERR_MSG_MAX] = "";
    chat_interrupted = 0;
    for (;;) {
        if (chat_interrupted) {
            chat_interrupted = 0;
            engine_req_cancel(req);
        }
        if (!engine_req_next(req, &ev, 50))
            continue;
        if (ev.text_len)
            reasoning_split_push(&rs, ev.text, ev.text_len, &thought, &answer);
        if (ev.kind == ENGINE_EV_FINISH) {
            reasoning_split_finish(&rs, &thought, &answer);
            fin = ev.finish;
            usage = ev.usage;
            snprintf(error, sizeof error, "%s", ev.error);
        }
        if (answer.n)
            tern_sbuf_put(&kept, answer.s, answer.n);
        chat_show(c, &thought, &answer, &in_thought);
        engine_event_clear(&ev);
        if (fin != ENGINE_FINISH_NONE)
            break;
    }
    if (in_thought)
        fputs(c->color ? RESET : "\n[/thinking]", stdout);
    fputs(fin == ENGINE_FINISH_CANCELLED ? (c->color ? DIM " [stopped]" RESET "\n" : " [stopped]\n") : "\n",
          stdout);
    fflush(stdout);
    if (c->verbose)
        fprintf(stderr, "[%d prompt tokens (%d cached), %d generated, finish %s, ttft %.3fs, %.1f tok/s]\n",
                usage.n_prompt, usage.n_cached, usage.n_generated, engine_finish_name(fin), usage.ttft_s,
                usage.decode_s > 0 ? (usage.n_generated - 1) / usage.decode_s : 0.0);
    if (fin == ENGINE_FINISH_ERROR) {
        rc = tern_err_set(err, TERN_EINTERNAL, "%s", error);
        goto fail;
    }
    if (kept.oom || thought.oom || answer.oom || (rc = chat_push(c, "assistant", kept.s ? kept.s : "", kept.n))) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    goto out;
fail:
    chat_undo(c);
out:
    if (req)
        reasoning_split_free(&rs);
    engine_req_release(req);
    free(ids);
    free(thought.s);
    free(answer.s);
    free(kept.s);
    return rc;
}

static void chat_help(FILE *f)
{
    fputs("  /reset           forget the conversation (the system prompt stays)\n"
          "  /undo            take back the last exchange\n"
          "  /system TEXT     set the system prompt (and start over); /system alone removes it\n"
          "  /think on|off    ask the template to think or not (thinking models)\n"
          "  /help            this list\n"
          "  /exit, /quit     leave (or Ctrl-D); Ctrl-C stops an answer\n"
          "  end a line with \\ to go on on the next line\n",
          f);
}

/* A /command. Returns 1 to leave, 0 to go on. */
static int chat_command(chat_session *c, char *line)
{
    char *arg = line + strcspn(line, " \t");
    if (*arg)
        *arg++ = '\0';
    arg += strspn(arg, " \t");
    if (!strcmp(line, "/exit") || !strcmp(line, "/quit") || !strcmp(line, "/bye"))
        return 1;
    if (!strcmp(line, "/reset") || !strcmp(line, "/clear")) {
        if (chat_reset(c))
            fprintf(stderr, "out of memory\n");
        printf("[conversation cleared]\n");
    } else if (!strcmp(line, "/undo")) {
        printf(chat_undo(c) ? "[last exchange taken back]\n" : "[nothing to take back]\n");
    } else if (!strcmp(line, "/system")) {
        free(c->system);
        c->system = *arg ? strdup(arg) : NULL;
        if (chat_reset(c))
            fprintf(stderr, "out of memory\n");
        printf(c->system ? "[system prompt set; conversation cleared]\n" : "[system prompt removed]\n");
    } else if (!strcmp(line, "/think") && (!strcmp(arg, "on") || !strcmp(arg, "off"))) {
        c->think = !strcmp(arg, "on");
        printf("[thinking %s]\n", arg);
    } else if (!strcmp(line, "/help")) {
        chat_help(stdout);
    } else {
        printf("unknown command %s; /help lists them\n", line);
    }
    fflush(stdout);
    return 0;
}

/* Reads one message: lines ending with a backslash go on. NULL at the end
 * of input (or Ctrl-C at the prompt). */
static char *chat_read(int tty, int color)
{
    tern_sbuf msg = {0};
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty) {
            fputs(msg.n ? (color ? BOLD "... " RESET : "... ") : (color ? BOLD "> " RESET : "> "), stdout);
            fflush(stdout);
        }
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) {
            if (tty)
                putchar('\n');
            free(line);
            free(msg.s);
            return NULL;
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            got--;
        int more = got > 0 && line[got - 1] == '\\';
        if (more)
            got--;
        tern_sbuf_put(&msg, line, (size_t)got);
        if (more)
            tern_sbuf_put(&msg, "\n", 1);
        if (!more)
            break;
    }
    free(line);
    tern_sbuf_put(&msg, "", 0);
    if (msg.oom) {
        free(msg.s);
        return NULL;
    }
    return msg.s;
}

int cmd_chat(int argc, char **argv)
{
    const char *dir = NULL, *device = NULL, *system = NULL, *draft_dir = NULL, *v;
    long long max_tokens = 1024, seed = -1, top_k = 0, ctx_size = 0, threads = 0;
    double temperature = 0.7, top_p = 1.0;
    int verbose = 0, color = -1, show_thinking = 1, think = -1;
    for (int i = 1; i < argc; i++) {
        if ((v = cli_flag_value(argc, argv, &i, "--max-tokens")) || (v = cli_flag_value(argc, argv, &i, "-n"))) {
            if (cli_parse_int(v, 0, 1 << 24, &max_tokens))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--temperature"))) {
            if (cli_parse_double(v, 0, 100, &temperature))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--top-p"))) {
            if (cli_parse_double(v, 1e-9, 1, &top_p))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--top-k"))) {
            if (cli_parse_int(v, 0, 1 << 24, &top_k))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--seed"))) {
            if (cli_parse_int(v, 0, (long long)1 << 62, &seed))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--ctx-size")) || (v = cli_flag_value(argc, argv, &i, "-c"))) {
            if (cli_parse_int(v, 16, 1 << 24, &ctx_size))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads")) || (v = cli_flag_value(argc, argv, &i, "-t"))) {
            if (cli_parse_int(v, 1, 1024, &threads))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--system")) || (v = cli_flag_value(argc, argv, &i, "-s"))) {
            system = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--think"))) {
            if (strcmp(v, "on") && strcmp(v, "off"))
                goto bad_value;
            think = !strcmp(v, "on");
        } else if ((v = cli_flag_value(argc, argv, &i, "--draft-model"))) {
            draft_dir = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--device"))) {
            device = v;
        } else if (!strcmp(argv[i], "--exact-products")) {
            tern_kernels_exact_set(1);
        } else if (!strcmp(argv[i], "--hide-thinking")) {
            show_thinking = 0;
        } else if (!strcmp(argv[i], "--color")) {
            color = 1;
        } else if (!strcmp(argv[i], "--no-color")) {
            color = 0;
        } else if (!strcmp(argv[i], "--verbose") || !strcmp(argv[i], "-v")) {
            verbose = 1;
        } else if (argv[i][0] != '-' && !dir) {
            dir = argv[i];
        } else {
            fprintf(stderr, "tern chat: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "tern chat: bad value for %s\n", argv[i - 1]);
        return 2;
    }
    if (!dir) {
        fprintf(stderr, "usage: tern chat MODEL_DIR [-s|--system TEXT] [-n|--max-tokens N] [--temperature T] "
                        "[--top-p P] [--top-k K] [--seed S] [--think on|off] [--hide-thinking] [--draft-model DIR] "
                        "[-c|--ctx-size N] [-t|--threads N] [--device cpu|cuda|cuda:N|auto] [--exact-products] "
                        "[--color|--no-color] [--verbose]\n");
        return 2;
    }
    if (verbose)
        tern_log_set_level(TERN_LOG_INFO);
    int tty = isatty(STDIN_FILENO);
    if (color < 0)
        color = isatty(STDOUT_FILENO) && !getenv("NO_COLOR");
    tern_err err = {0};
    int rc = 1;
    chat_session c = {0};
    c.think = think;
    c.color = color;
    c.show_thinking = show_thinking;
    c.verbose = verbose;
    tern_tokenizer *tok = NULL;
    tern_model *draft = NULL;
    char dev_buf[32];
    tern_model *m = cli_load_model(dir, device, (int)threads, dev_buf, sizeof dev_buf, &err);
    model_load_opts lo = {(int)threads, dev_buf};
    if (!m)
        goto out;
    if (ctx_size > model_config_get(m)->max_pos) {
        tern_err_set(&err, TERN_ERANGE, "--ctx-size %lld is above the model's maximum context (%d positions)",
                     ctx_size, model_config_get(m)->max_pos);
        goto out;
    }
    if (!(tok = tokenizer_load(dir, &err)))
        goto out;
    if (tern_chat_template_load(dir, &c.ct, &err)) {
        if (err.code == TERN_ENOTFOUND)
            tern_err_set(&err, TERN_ENOTFOUND, "%s has no chat template (tern run completes plain text)", dir);
        goto out;
    }
    if (draft_dir && !(draft = cli_load_draft(draft_dir, tok, &lo, &err)))
        goto out;
    c.tok = tok;
    c.has_think = reasoning_delims_find(tok, &c.delims);
    if (system && !(c.system = strdup(system))) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    if (chat_reset(&c)) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    engine_opts eo;
    engine_opts_default(&eo);
    eo.max_batch = 1;
    eo.draft = draft;
    eo.kv_budget_bytes = 0; /* one row: the engine sizes the KV for one full context */
    eo.ctx_size = (int)ctx_size;
    c.ctx = ctx_size ? (int)ctx_size : model_config_get(m)->max_pos;
    if (!(c.eng = engine_new(m, tok, &eo, &err)))
        goto out;
    engine_params_default(&c.base);
    c.base.max_tokens = (int)max_tokens;
    c.base.sample.temperature = (float)temperature;
    c.base.sample.top_p = (float)top_p;
    c.base.sample.top_k = (int)top_k;
    c.base.sample.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);

    struct sigaction sa = {0}, old_sa;
    sa.sa_handler = chat_on_sigint; /* no SA_RESTART: Ctrl-C at the prompt ends getline */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_sa);
    if (tty)
        printf("%stern chat - %s. /help lists the commands, Ctrl-D leaves.%s\n", color ? DIM : "", dir,
               color ? RESET : "");
    rc = 0;
    for (;;) {
        chat_interrupted = 0;
        char *line = chat_read(tty, color);
        if (!line)
            break;
        if (line[0] == '/' && line[1] != '/') {
            int leave = chat_command(&c, line);
            free(line);
            if (leave)
                break;
            continue;
        }
        const char *text = line[0] == '/' ? line + 1 : line; /* "//..." sends a message starting with "/" */
        if (!*text) {
            free(line);
            continue;
        }
        tern_err te = {0};
        if (chat_turn(&c, text, strlen(text), &te)) {
            fprintf(stderr, "tern chat: %s\n", te.msg);
            if (te.code == TERN_ENOMEM)
                rc = 1;
        }
        free(line);
        if (rc)
            break;
    }
    sigaction(SIGINT, &old_sa, NULL);
    goto out_quiet;
out:
    fprintf(stderr, "tern chat: %s\n", err.msg);
out_quiet:
    engine_free(c.eng);
    json_object_put(c.messages);
    free(c.system);
    tern_chat_template_free(&c.ct);
    tokenizer_free(tok);
    model_free(draft);
    model_free(m);
    return rc;
}
