/* A generation job: the n engine requests behind one HTTP request, the wait
 * for their events (an eventfd poked by the engine's notify hook, polled
 * together with the client's socket so a disconnect cancels at once), and
 * the two ways out: one JSON body, or an SSE stream of OpenAI chunks. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "model/lora.h"
#include "engine/constraint.h"
#include "server/server_int.h"
#include "server/responses.h"
#include "server/structured.h"
#include "server/harmony.h"
#include "server/toolcall_parse.h"

#define GEN_POLL_MS 250 /* how often a wait re-checks for server shutdown */

typedef struct gen_choice {
    engine_req *r;
    int done;
    engine_finish finish;
    engine_usage usage;
    char error[TERN_ERR_MSG_MAX];
    api_buf text;       /* non-streaming: the whole text (chat: the answer) */
    api_buf reasoning;  /* non-streaming chat: the thought */
    reasoning_split rs; /* chat: thought / answer */
    toolcall_parser tp; /* chat with tools: calls out of the answer */
    harmony_split hs;   /* a harmony model's chat: the whole split (instead of rs + tp) */
    int harmony;
    json_object *calls; /* non-streaming: the tool_calls array (NULL = none) */
    int n_calls;        /* calls released so far (their stream indexes) */
    int n_thought;      /* tokens sampled inside the thought (Responses usage) */
    double t_last_tok;  /* its last token reached this thread (tern_time_s; 0 = none yet) */
    json_object *lp;    /* logprobs: chat content array, or completions object */
    size_t text_off;    /* completions: bytes of text so far (text_offset) */
    int started;        /* streaming: the role chunk / echo went out */
    char *echo;         /* completions: the prompt text echoed before the choice */
} gen_choice;

struct gen_job {
    tern_server *s;
    srv_model *mm;      /* the model it runs on: a reference, dropped by gen_free */
    api_request req;
    char id[48];
    long long created;
    int n_prompt;       /* prompt tokens, summed over a batch's prompts */
    int n;
    gen_choice ch[API_MAX_N];
    srv_waker *wk;
    int client_fd;
    int client_gone;
    resp_state *resp; /* owned: a Responses API reply (NULL = chat / completions) */
    srv_adapter *adapter; /* the LoRA adapter the request names (counters), NULL = base */
    double t_first;   /* the first token of any choice reached this thread (0 = none yet) */
    int n_tokens;     /* tokens received, over the choices (the access line's completion tokens) */
    int32_t *stop_ids; /* owned: a harmony chat's stop ids (the request's + <|return|>, <|call|>) */
    /* streaming */
    api_buf out;
    size_t out_pos;
    int tail_sent; /* usage + [DONE] queued */
};

/* The `model` a response names: what the request asked for when that is
 * an adapter (its NAME or BASE:NAME, vLLM's convention), else the model's. */
static const char *gen_model_name(const struct gen_job *j)
{
    return j->adapter && j->req.model ? j->req.model : j->mm->name;
}

/* ---- wakers ---- */

srv_waker *srv_waker_get(tern_server *s)
{
    pthread_mutex_lock(&s->wk_mu);
    srv_waker *w = s->wk_free;
    if (w)
        s->wk_free = w->next_free;
    pthread_mutex_unlock(&s->wk_mu);
    if (w)
        return w;
    w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->efd < 0) {
        free(w);
        return NULL;
    }
    pthread_mutex_lock(&s->wk_mu);
    w->next_all = s->wk_all;
    s->wk_all = w;
    pthread_mutex_unlock(&s->wk_mu);
    return w;
}

void srv_waker_put(tern_server *s, srv_waker *w)
{
    if (!w)
        return;
    pthread_mutex_lock(&s->wk_mu);
    w->next_free = s->wk_free;
    s->wk_free = w;
    pthread_mutex_unlock(&s->wk_mu);
}

void srv_wakers_free(tern_server *s)
{
    for (srv_waker *w = s->wk_all, *next; w; w = next) {
        next = w->next_all;
        close(w->efd);
        free(w);
    }
    s->wk_all = s->wk_free = NULL;
}

/* Engine thread: must not block. A full counter (EAGAIN) is still a wakeup. */
void srv_waker_notify(void *user)
{
    srv_waker *w = user;
    uint64_t one = 1;
    ssize_t rc = write(w->efd, &one, sizeof one);
    (void)rc;
}

/* ---- job lifetime ---- */

void gen_free(gen_job *j)
{
    if (!j)
        return;
    int active = 0;
    for (int i = 0; i < j->n; i++) {
        gen_choice *c = &j->ch[i];
        if (c->r) {
            if (!c->done)
                active = 1;
            engine_req_release(c->r); /* cancels it if still running */
        }
        api_buf_free(&c->text);
        api_buf_free(&c->reasoning);
        reasoning_split_free(&c->rs);
        toolcall_parser_free(&c->tp);
        harmony_split_free(&c->hs);
        json_object_put(c->calls);
        json_object_put(c->lp);
        free(c->echo);
    }
    if (active)
        atomic_fetch_add(&j->s->met.gen_disconnected, 1);
    atomic_fetch_sub(&j->s->met.gens_active, 1);
    srv_waker_put(j->s, j->wk);
    api_buf_free(&j->out);
    free(j->stop_ids);
    responses_state_free(j->resp);
    api_request_free(&j->req); /* its grammar lives in the model's cache: before the release */
    models_release(j->mm);
    free(j);
}

static uint64_t random_seed(void)
{
    static atomic_ullong counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* The tool-call format the answer is parsed with: the template's, when the
 * request passes tools to it (not with tool_choice none); NULL = none. */
static const toolfmt *gen_tool_format(const srv_model *mm, const api_request *q)
{
    if (q->kind != API_CHAT || !q->tools || !mm->tools.fmt || mm->tools.fmt->kind == TOOLFMT_NONE)
        return NULL;
    return mm->tools.fmt;
}

/* The reasoning budget of a row without a grammar (a grammar's constraint
 * caps the block itself, structured_attach): the same constraint, think
 * block only. Nothing when the row has no budget or cannot think. */
static int budget_attach(srv_model *mm, const api_request *q, const int32_t *prompt, size_t n, size_t boundary,
                         engine_params *p, api_error *err)
{
    if (p->constraint || q->kind != API_CHAT || q->reasoning_budget < 0 || (!mm->has_think && !mm->has_harmony))
        return 0;
    constraint_think th = {0};
    tern_err te = {0};
    if (mm->has_harmony) { /* the analysis message, opened first (harmony.h) */
        const grammar_vocab *v = structured_vocab(mm, err);
        const constraint_think *hth = v ? structured_harmony_think(mm, err) : NULL;
        if (!hth)
            return -1;
        th = *hth;
        th.max_tokens = q->reasoning_budget;
        th.capped = 1;
        if (constraint_think_new(v, &th, model_config_get(mm->m)->n_vocab, &p->constraint, &p->constraint_ctx, &te))
            return api_error_set(err, 500, "server_error", NULL, NULL, "reasoning budget: %s", te.msg);
        return 0;
    }
    reasoning_start st = reasoning_start_of(&mm->think, prompt, n, boundary, api_thinking_off(q));
    if (st == REASONING_START_ANSWER)
        return 0;
    const grammar_vocab *v = structured_vocab(mm, err);
    if (!v)
        return -1;
    th.mode = st == REASONING_START_INSIDE ? CONSTRAINT_THINK_INSIDE : CONSTRAINT_THINK_MAY;
    th.open_id = mm->think.open_id;
    th.close_id = mm->think.close_id;
    th.max_tokens = q->reasoning_budget;
    th.capped = 1;
    if (constraint_think_new(v, &th, model_config_get(mm->m)->n_vocab, &p->constraint, &p->constraint_ctx, &te))
        return api_error_set(err, 500, "server_error", NULL, NULL, "reasoning budget: %s", te.msg);
    return 0;
}

int gen_start(srv_model *mm, api_request *req, const gen_prompt *prompts, int n_prompts, int client_fd,
              gen_job **out, api_error *err)
{
    tern_server *s = mm->s;
    struct model_lora *lora = NULL; /* the request's adapter; the engine takes its own references */
    gen_job *j = calloc(1, sizeof *j);
    if (!j) {
        api_request_free(req);
        models_release(mm);
        return api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    }
    j->s = s;
    j->mm = mm;
    j->req = *req;
    memset(req, 0, sizeof *req);
    int per = j->req.n;
    j->n = per * n_prompts;
    for (int b = 0; b < n_prompts; b++)
        j->n_prompt += (int)prompts[b].n;
    j->client_fd = client_fd;
    j->created = (long long)time(NULL);
    snprintf(j->id, sizeof j->id, "%s-%016llx", j->req.kind == API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)random_seed());
    atomic_fetch_add(&s->met.gens_active, 1);
    if (!(j->wk = srv_waker_get(s)))
        goto nomem;
    if (adapters_acquire(mm, j->req.model, &j->adapter, &lora, err)) {
        gen_free(j);
        return -1;
    }
    int harmony = j->req.kind == API_CHAT && mm->has_harmony;
    if (harmony) { /* <|return|> and <|call|> end the turn */
        if (!(j->stop_ids = malloc(((size_t)j->req.n_stop_ids + 2) * sizeof *j->stop_ids)))
            goto nomem;
        if (j->req.n_stop_ids)
            memcpy(j->stop_ids, j->req.stop_ids, (size_t)j->req.n_stop_ids * sizeof *j->stop_ids);
        j->stop_ids[j->req.n_stop_ids] = mm->harmony.ret;
        j->stop_ids[j->req.n_stop_ids + 1] = mm->harmony.call;
    }
    uint64_t seed = j->req.has_seed ? j->req.sample.seed : random_seed();
    for (int i = 0; i < j->n; i++) {
        const gen_prompt *pr = &prompts[i / per];
        const int32_t *prompt = pr->ids;
        size_t n_prompt = pr->n, cache_boundary = pr->cache_boundary;
        if (pr->echo && !(j->ch[i].echo = strdup(pr->echo)))
            goto nomem;
        engine_params p;
        engine_params_default(&p);
        p.prompt = prompt;
        p.n_prompt = n_prompt;
        p.sample = j->req.sample;
        /* choice 0 of each prompt keeps the request's seed; the others get distinct streams */
        p.sample.seed = seed + (uint64_t)(i % per) * 0x9E3779B97F4A7C15ull;
        p.max_tokens = j->req.max_tokens;
        p.stop = j->req.stop;
        p.n_stop = j->req.n_stop;
        p.ignore_eos = j->req.ignore_eos;
        p.stop_ids = harmony ? j->stop_ids : j->req.stop_ids;
        p.n_stop_ids = j->req.n_stop_ids + (harmony ? 2 : 0);
        p.min_tokens = j->req.min_tokens;
        p.include_stop_str = j->req.include_stop_str;
        p.skip_special = j->req.skip_special;
        /* a trigger that is a special token ([TOOL_CALLS], <|python_tag|>) must reach the parser as text */
        const toolfmt *tf = gen_tool_format(mm, &j->req);
        for (int t = 0; tf && tf->triggers[t]; t++)
            if (toolfmt_trigger_token(mm->tok, tf->triggers[t]) >= 0)
                p.skip_special = 0;
        /* so must thought delimiters that are special tokens (the splitter reads text) */
        if (j->req.kind == API_CHAT && mm->has_think &&
            (tokenizer_is_special(mm->tok, mm->think.open_id) || tokenizer_is_special(mm->tok, mm->think.close_id)))
            p.skip_special = 0;
        if (harmony) /* the splitter reads the headers' special tokens as text */
            p.skip_special = 0;
        p.cache_boundary = cache_boundary;
        p.lora = lora;
        tern_err te;
        if (structured_attach(mm, &j->req, prompt, n_prompt, cache_boundary, &p, err) ||
            budget_attach(mm, &j->req, prompt, n_prompt, cache_boundary, &p, err)) {
            model_lora_release(lora);
            gen_free(j);
            return -1;
        }
        reasoning_start start = REASONING_START_ANSWER;
        if (j->req.kind == API_CHAT && mm->has_think)
            start = reasoning_start_of(&mm->think, prompt, n_prompt, cache_boundary, api_thinking_off(&j->req));
        reasoning_split_init(&j->ch[i].rs, j->req.kind == API_CHAT && mm->has_think ? &mm->think : NULL, start);
        toolcall_parser_init(&j->ch[i].tp, harmony ? NULL : gen_tool_format(mm, &j->req));
        j->ch[i].harmony = harmony;
        harmony_split_init(&j->ch[i].hs, harmony && j->req.tools && mm->tools.renders_tools);
        j->ch[i].r = engine_submit(mm->eng, &p, srv_waker_notify, j->wk, &te);
        if (!j->ch[i].r) {
            if (p.constraint)
                p.constraint->free(p.constraint_ctx);
            if (te.code == TERN_EFULL)
                api_error_set(err, 429, "server_busy", "queue_full", NULL, "server busy: %s; retry later", te.msg);
            else if (te.code == TERN_ERANGE)
                api_bad(err, "context_length_exceeded", j->req.kind == API_CHAT ? "messages" : "prompt", "%s",
                        te.msg);
            else if (te.code == TERN_EINVAL)
                api_bad(err, "invalid_value", NULL, "%s", te.msg);
            else if (te.code == TERN_EUNSUPPORTED)
                api_bad(err, "unsupported_device", "model", "%s", te.msg);
            else
                api_error_set(err, 500, "server_error", NULL, NULL, "%s", te.msg);
            model_lora_release(lora);
            gen_free(j);
            return -1;
        }
        atomic_fetch_add(&s->met.gen_started, 1);
        atomic_fetch_add(&mm->met.gen_started, 1);
    }
    atomic_fetch_add(&s->met.prompt_tokens, (long long)j->n_prompt);
    atomic_fetch_add(&mm->met.prompt_tokens, (long long)j->n_prompt);
    adapters_count_start(j->adapter, j->n, (long long)j->n_prompt);
    model_lora_release(lora);
    *out = j;
    return 0;
nomem:
    model_lora_release(lora);
    gen_free(j);
    return api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
}

/* ---- event handling ---- */

static api_token_text token_text(void *ctx, int32_t id)
{
    api_token_text t = {"", 0};
    tokenizer_token_bytes((const tern_tokenizer *)ctx, id, &t.bytes, &t.len);
    return t;
}

static int all_done(const gen_job *j)
{
    for (int i = 0; i < j->n; i++)
        if (!j->ch[i].done)
            return 0;
    return 1;
}

static const char *finish_reason(engine_finish f)
{
    return f == ENGINE_FINISH_LENGTH ? "length" : "stop";
}

/* A chat choice's finish_reason: "tool_calls" when it made calls,
 * "malformed_tool_call" when a call it started was no valid call (or the
 * model stopped inside one) and went back to content (docs/agents.md). */
static const char *chat_finish_reason(const gen_choice *c)
{
    if (c->finish == ENGINE_FINISH_LENGTH)
        return "length";
    if (c->tp.status != TOOLCALL_OK || (c->harmony && c->hs.status != TOOLCALL_OK))
        return "malformed_tool_call";
    return c->n_calls > 0 ? "tool_calls" : "stop";
}

/* One tool call as a chat message carries it. */
static json_object *call_json(const toolcall_call *tc, const char *id)
{
    json_object *o = json_object_new_object(), *fn = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(id));
    json_object_object_add(o, "type", json_object_new_string("function"));
    json_object_object_add(fn, "name", json_object_new_string(tc->name));
    json_object_object_add(fn, "arguments", json_object_new_string(tc->arguments));
    json_object_object_add(o, "function", fn);
    return o;
}

/* A streaming chunk envelope holding one choice object (returned borrowed in *choice). */
static json_object *chunk_new(gen_job *j, int idx, json_object **choice)
{
    json_object *choices;
    json_object *o = api_envelope(j->id, j->req.kind == API_CHAT ? "chat.completion.chunk" : "text_completion",
                                  j->created, gen_model_name(j), &choices);
    if (j->req.include_usage)
        json_object_object_add(o, "usage", NULL);
    *choice = json_object_new_object();
    json_object_object_add(*choice, "index", json_object_new_int(idx));
    json_object_array_add(choices, *choice);
    return o;
}

/* One chunk (thought and/or answer text and/or a logprob entry) for choice idx. */
static void stream_piece(gen_job *j, int idx, const char *rtext, size_t rlen, const char *text, size_t len,
                         const sample_result *lp)
{
    gen_choice *c = &j->ch[idx];
    json_object *choice, *o = chunk_new(j, idx, &choice);
    json_object *lpo = NULL;
    if (lp && j->req.kind == API_CHAT) {
        lpo = json_object_new_object();
        json_object *arr = json_object_new_array();
        json_object_array_add(arr, api_chat_logprob(lp, j->req.top_logprobs, token_text, (void *)j->mm->tok));
        json_object_object_add(lpo, "content", arr);
    } else if (lp) {
        api_completion_logprob_add(&lpo, lp, j->req.top_logprobs, c->text_off, token_text, (void *)j->mm->tok);
    }
    if (j->req.kind == API_CHAT) {
        json_object *delta = json_object_new_object();
        if (rlen) { /* reasoning is the alias newer clients read */
            json_object_object_add(delta, "reasoning_content", api_json_string(rtext, rlen));
            json_object_object_add(delta, "reasoning", api_json_string(rtext, rlen));
        }
        if (len || !rlen)
            json_object_object_add(delta, "content", api_json_string(text, len));
        json_object_object_add(choice, "delta", delta);
    } else {
        json_object_object_add(choice, "text", api_json_string(text, len));
    }
    json_object_object_add(choice, "logprobs", lpo);
    json_object_object_add(choice, "finish_reason", NULL);
    c->text_off += len;
    api_buf_sse(&j->out, o);
}

static void stream_start(gen_job *j, int idx)
{
    gen_choice *c = &j->ch[idx];
    if (c->started)
        return;
    c->started = 1;
    if (j->req.kind == API_CHAT) {
        json_object *choice, *o = chunk_new(j, idx, &choice);
        json_object *delta = json_object_new_object();
        json_object_object_add(delta, "role", json_object_new_string("assistant"));
        json_object_object_add(delta, "content", json_object_new_string(""));
        json_object_object_add(choice, "delta", delta);
        json_object_object_add(choice, "logprobs", NULL);
        json_object_object_add(choice, "finish_reason", NULL);
        api_buf_sse(&j->out, o);
    } else if (j->ch[idx].echo) {
        stream_piece(j, idx, NULL, 0, j->ch[idx].echo, strlen(j->ch[idx].echo), NULL);
    }
}

static void stream_finish(gen_job *j, int idx)
{
    gen_choice *c = &j->ch[idx];
    if (c->finish == ENGINE_FINISH_ERROR) {
        api_error e;
        api_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", c->error);
        char *ej = api_error_json(&e);
        if (ej) {
            api_buf_append(&j->out, "data: ", 6);
            api_buf_append(&j->out, ej, strlen(ej));
            api_buf_append(&j->out, "\n\n", 2);
            free(ej);
        }
        return;
    }
    json_object *choice, *o = chunk_new(j, idx, &choice);
    if (j->req.kind == API_CHAT)
        json_object_object_add(choice, "delta", json_object_new_object());
    else
        json_object_object_add(choice, "text", json_object_new_string(""));
    json_object_object_add(choice, "logprobs", NULL);
    json_object_object_add(choice, "finish_reason", json_object_new_string(
                                                      j->req.kind == API_CHAT ? chat_finish_reason(c) : finish_reason(c->finish)));
    api_buf_sse(&j->out, o);
}

/* Bytes of one streamed arguments piece: OpenAI streams a call's
 * arguments in small pieces; ours are cut at UTF-8 boundaries. */
#define GEN_ARGS_PIECE 24

/* Streams released calls: per call a chunk with index, id, type and name
 * (arguments ""), then its arguments in pieces. */
static void stream_calls(gen_job *j, int idx, const toolcall_out *to)
{
    gen_choice *c = &j->ch[idx];
    for (int k = 0; k < to->n_calls; k++) {
        const toolcall_call *tc = &to->calls[k];
        char id[32];
        toolcall_id_new(id, sizeof id);
        size_t len = strlen(tc->arguments), at = 0;
        int first = 1;
        while (first || at < len) {
            json_object *choice, *o = chunk_new(j, idx, &choice);
            json_object *delta = json_object_new_object(), *arr = json_object_new_array(), *d = json_object_new_object();
            json_object *fn = json_object_new_object();
            json_object_object_add(d, "index", json_object_new_int(c->n_calls));
            size_t n = 0;
            if (first) {
                json_object_object_add(d, "id", json_object_new_string(id));
                json_object_object_add(d, "type", json_object_new_string("function"));
                json_object_object_add(fn, "name", json_object_new_string(tc->name));
            } else {
                n = len - at < GEN_ARGS_PIECE ? len - at : GEN_ARGS_PIECE;
                while (at + n < len && ((unsigned char)tc->arguments[at + n] & 0xC0) == 0x80)
                    n++; /* never split a character */
            }
            json_object_object_add(fn, "arguments", json_object_new_string_len(tc->arguments + at, (int)n));
            json_object_object_add(d, "function", fn);
            json_object_array_add(arr, d);
            json_object_object_add(delta, "tool_calls", arr);
            json_object_object_add(choice, "delta", delta);
            json_object_object_add(choice, "logprobs", NULL);
            json_object_object_add(choice, "finish_reason", NULL);
            api_buf_sse(&j->out, o);
            at += n;
            first = 0;
        }
        c->n_calls++;
    }
}

static void usage_totals(const gen_job *j, int *n_completion, int *n_cached)
{
    *n_completion = 0;
    *n_cached = j->ch[0].usage.n_cached;
    for (int i = 0; i < j->n; i++)
        *n_completion += j->ch[i].usage.n_generated;
}

/* The usage object, with usage.speculation when any choice speculated:
 * {drafted, accepted, target_forwards, acceptance_by_position}. */
static json_object *usage_json(const gen_job *j)
{
    int n_completion, n_cached;
    usage_totals(j, &n_completion, &n_cached);
    json_object *u = api_usage(j->n_prompt, n_completion, n_cached);
    engine_usage t = {0};
    for (int i = 0; i < j->n; i++) {
        const engine_usage *c = &j->ch[i].usage;
        t.n_drafted += c->n_drafted;
        t.n_accepted += c->n_accepted;
        t.n_target_forwards += c->n_target_forwards;
        for (int k = 0; k < ENGINE_MAX_DRAFT; k++)
            t.accepted_by_pos[k] += c->accepted_by_pos[k];
    }
    if (t.n_drafted > 0) {
        json_object *sp = json_object_new_object(), *by = json_object_new_array();
        json_object_object_add(sp, "drafted", json_object_new_int(t.n_drafted));
        json_object_object_add(sp, "accepted", json_object_new_int(t.n_accepted));
        json_object_object_add(sp, "target_forwards", json_object_new_int(t.n_target_forwards));
        int last = 0;
        for (int k = 0; k < ENGINE_MAX_DRAFT; k++)
            if (t.accepted_by_pos[k])
                last = k + 1;
        for (int k = 0; k < last; k++)
            json_object_array_add(by, json_object_new_int(t.accepted_by_pos[k]));
        json_object_object_add(sp, "acceptance_by_position", by);
        json_object_object_add(u, "speculation", sp);
    }
    return u;
}

/* The latency histograms of a token (inter-token) or a finish (queue time). */
static void observe(gen_job *j, gen_choice *c, const engine_event *ev)
{
    if (ev->kind == ENGINE_EV_TOKEN) {
        double now = tern_time_s();
        if (!j->t_first)
            j->t_first = now;
        if (c->t_last_tok)
            metrics_observe(j->mm, HIST_ITL, now - c->t_last_tok);
        c->t_last_tok = now;
        j->n_tokens++;
    } else if (ev->kind == ENGINE_EV_FINISH && ev->usage.queue_s >= 0) {
        metrics_observe(j->mm, HIST_QUEUE, ev->usage.queue_s);
    }
}

void gen_access(const gen_job *j, srv_access *a)
{
    a->mm = j->mm;
    snprintf(a->completion_id, sizeof a->completion_id, "%s", j->id);
    a->prompt_tokens = j->n_prompt;
    a->completion_tokens = j->n_tokens;
    a->t_first = j->t_first;
}

static void on_event(gen_job *j, int idx, engine_event *ev, int streaming)
{
    gen_choice *c = &j->ch[idx];
    observe(j, c, ev);
    const sample_result *lp = ev->kind == ENGINE_EV_TOKEN && ev->has_logprob && j->req.logprobs ? &ev->lp : NULL;
    if (j->req.kind == API_CHAT) {
        /* thought and answer apart; what the splitter holds back comes later */
        tern_sbuf rb = {0}, ab = {0};
        toolcall_out to = {0};
        if (c->harmony) { /* one splitter: analysis, final, calls (harmony.h) */
            if (ev->kind == ENGINE_EV_TOKEN && harmony_split_in_thought(&c->hs))
                c->n_thought++;
            if (ev->text_len)
                harmony_split_push(&c->hs, ev->text, ev->text_len, &rb, &to);
            if (ev->kind == ENGINE_EV_FINISH)
                harmony_split_finish(&c->hs, ev->finish != ENGINE_FINISH_STOP, &rb, &to);
        } else {
            if (ev->kind == ENGINE_EV_TOKEN && reasoning_split_in_thought(&c->rs))
                c->n_thought++;
            if (ev->text_len)
                reasoning_split_push(&c->rs, ev->text, ev->text_len, &rb, &ab);
            if (ev->kind == ENGINE_EV_FINISH)
                reasoning_split_finish(&c->rs, &rb, &ab);
            /* calls are parsed in the answer only, after the thought */
            if (ab.n)
                toolcall_parser_push(&c->tp, ab.s, ab.n, &to);
            if (ev->kind == ENGINE_EV_FINISH)
                toolcall_parser_finish(&c->tp, &to);
        }
        free(ab.s);
        tern_sbuf cb = to.content;
        if (!j->req.include_reasoning)
            rb.n = 0;
        if (j->resp) {
            responses_piece(j->resp, &j->out, streaming, rb.s, rb.n, cb.s, cb.n, &to);
            c->n_calls += to.n_calls;
        } else if (streaming) {
            stream_start(j, idx);
            if (rb.n || cb.n || lp)
                stream_piece(j, idx, rb.s, rb.n, cb.n ? cb.s : "", cb.n, lp);
            stream_calls(j, idx, &to);
        } else {
            for (int k = 0; k < to.n_calls; k++) {
                char id[32];
                toolcall_id_new(id, sizeof id);
                if (!c->calls)
                    c->calls = json_object_new_array();
                json_object_array_add(c->calls, call_json(&to.calls[k], id));
                c->n_calls++;
            }
            if (lp) {
                if (!c->lp)
                    c->lp = json_object_new_array();
                json_object_array_add(c->lp, api_chat_logprob(lp, j->req.top_logprobs, token_text, (void *)j->mm->tok));
            }
            if (rb.n)
                api_buf_append(&c->reasoning, rb.s, rb.n);
            if (cb.n)
                api_buf_append(&c->text, cb.s, cb.n);
        }
        free(rb.s);
        toolcall_out_free(&to);
    } else if (streaming) {
        stream_start(j, idx);
        if (ev->text_len || lp)
            stream_piece(j, idx, NULL, 0, ev->text ? ev->text : "", ev->text_len, lp);
    } else {
        if (lp)
            api_completion_logprob_add(&c->lp, lp, j->req.top_logprobs, c->text_off, token_text,
                                       (void *)j->mm->tok);
        if (ev->text_len)
            api_buf_append(&c->text, ev->text, ev->text_len);
        c->text_off += ev->text_len;
    }
    if (ev->kind == ENGINE_EV_FINISH) {
        c->done = 1;
        c->finish = ev->finish;
        c->usage = ev->usage;
        snprintf(c->error, sizeof c->error, "%s", ev->error);
        atomic_fetch_add(&j->s->met.gen_finished, 1);
        atomic_fetch_add(&j->s->met.completion_tokens, ev->usage.n_generated);
        atomic_fetch_add(&j->s->met.cached_tokens, ev->usage.n_cached);
        atomic_fetch_add(&j->mm->met.gen_finished, 1);
        atomic_fetch_add(&j->mm->met.completion_tokens, ev->usage.n_generated);
        atomic_fetch_add(&j->mm->met.cached_tokens, ev->usage.n_cached);
        adapters_count_finish(j->adapter, &ev->usage, ev->finish == ENGINE_FINISH_ERROR);
        if (ev->finish == ENGINE_FINISH_ERROR) {
            atomic_fetch_add(&j->s->met.gen_failed, 1);
            atomic_fetch_add(&j->mm->met.gen_failed, 1);
            TERN_ERROR("server: generation failed: %s", ev->error);
        }
        if (j->resp)
            responses_finish(j->resp, &j->out, streaming, ev->finish, ev->error, j->n_prompt, &ev->usage, c->n_thought);
        else if (streaming)
            stream_finish(j, idx);
    }
}

void gen_set_responses(gen_job *j, resp_state *r)
{
    j->resp = r;
    responses_set_model(r, gen_model_name(j));
    if (j->req.stream)
        responses_start(r, &j->out);
}

/* Drains every available event. Returns the number handled. */
static int drain(gen_job *j, int streaming)
{
    uint64_t cnt;
    ssize_t rc = read(j->wk->efd, &cnt, sizeof cnt); /* reset before reading the queues */
    (void)rc;
    int n = 0;
    for (int i = 0; i < j->n; i++) {
        engine_event ev;
        while (!j->ch[i].done && engine_req_next(j->ch[i].r, &ev, 0)) {
            on_event(j, i, &ev, streaming);
            engine_event_clear(&ev);
            n++;
        }
    }
    return n;
}

/* Did the peer close (or reset) its side? Data it sends (a pipelined next
 * request) is not a hangup. */
int srv_peer_closed(int fd, short revents)
{
    if (revents & (POLLHUP | POLLERR | POLLNVAL))
        return 1;
    if (revents & (POLLRDHUP | POLLIN)) {
        char b;
        ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    return 0;
}

/* Waits until some event arrived (1), the client left or the server stops (-1). */
static int wait_events(gen_job *j, int streaming)
{
    for (;;) {
        if (drain(j, streaming) || all_done(j))
            return 1;
        if (atomic_load(&j->s->stopping))
            return -1;
        struct pollfd p[2] = {{.fd = j->wk->efd, .events = POLLIN}, {.fd = j->client_fd, .events = POLLRDHUP}};
        int np = j->client_fd >= 0 ? 2 : 1;
        int rc = poll(p, (nfds_t)np, GEN_POLL_MS);
        if (rc < 0 && errno != EINTR)
            return -1;
        if (np == 2 && rc > 0 && srv_peer_closed(j->client_fd, p[1].revents)) {
            j->client_gone = 1;
            return -1;
        }
    }
}

static void cancel_all(gen_job *j)
{
    for (int i = 0; i < j->n; i++)
        if (!j->ch[i].done)
            engine_req_cancel(j->ch[i].r);
}

/* ---- non-streaming ---- */

int gen_collect(gen_job *j, char **json, api_error *err)
{
    while (!all_done(j)) {
        if (wait_events(j, 0) < 0) {
            cancel_all(j);
            /* 499: the client is gone, nothing to reply (the route closes the connection) */
            return api_error_set(err, j->client_gone ? 499 : 503, "server_error", NULL, NULL,
                                 "request abandoned (server shutting down)");
        }
    }
    if (j->resp) {
        if (j->ch[0].finish == ENGINE_FINISH_ERROR)
            return api_error_set(err, 500, "server_error", NULL, NULL, "generation failed: %s", j->ch[0].error);
        if (j->ch[0].finish == ENGINE_FINISH_CANCELLED)
            return api_error_set(err, 503, "server_error", NULL, NULL, "request cancelled (server shutting down)");
        *json = responses_body(j->resp);
        return *json ? 0 : api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    }
    json_object *choices;
    json_object *o = api_envelope(j->id, j->req.kind == API_CHAT ? "chat.completion" : "text_completion",
                                  j->created, gen_model_name(j), &choices);
    for (int i = 0; i < j->n; i++) {
        gen_choice *c = &j->ch[i];
        if (c->finish == ENGINE_FINISH_ERROR) {
            json_object_put(o);
            return api_error_set(err, 500, "server_error", NULL, NULL, "generation failed: %s", c->error);
        }
        if (c->finish == ENGINE_FINISH_CANCELLED) {
            json_object_put(o);
            return api_error_set(err, 503, "server_error", NULL, NULL, "request cancelled (server shutting down)");
        }
        json_object *ch = json_object_new_object();
        json_object_object_add(ch, "index", json_object_new_int(i));
        if (j->req.kind == API_CHAT) {
            json_object *msg = json_object_new_object();
            json_object_object_add(msg, "role", json_object_new_string("assistant"));
            /* a reply that is only calls has no content (OpenAI: null) */
            json_object_object_add(msg, "content", c->calls && !c->text.len
                                                       ? NULL
                                                       : api_json_string(c->text.data ? c->text.data : "", c->text.len));
            if (c->reasoning.len) { /* reasoning: the alias newer clients read */
                json_object_object_add(msg, "reasoning_content", api_json_string(c->reasoning.data, c->reasoning.len));
                json_object_object_add(msg, "reasoning", api_json_string(c->reasoning.data, c->reasoning.len));
            }
            json_object_object_add(msg, "refusal", NULL);
            if (c->calls)
                json_object_object_add(msg, "tool_calls", json_object_get(c->calls));
            json_object_object_add(ch, "message", msg);
            json_object *lpo = NULL;
            if (j->req.logprobs) {
                lpo = json_object_new_object();
                json_object_object_add(lpo, "content", c->lp ? json_object_get(c->lp) : json_object_new_array());
            }
            json_object_object_add(ch, "logprobs", lpo);
        } else {
            api_buf t = {0};
            if (c->echo)
                api_buf_append(&t, c->echo, strlen(c->echo));
            if (c->text.len)
                api_buf_append(&t, c->text.data, c->text.len);
            json_object_object_add(ch, "text", api_json_string(t.data ? t.data : "", t.len));
            api_buf_free(&t);
            json_object *lpo = NULL;
            if (j->req.logprobs)
                lpo = c->lp ? json_object_get(c->lp) : json_object_new_object();
            json_object_object_add(ch, "logprobs", lpo);
        }
        json_object_object_add(ch, "finish_reason", json_object_new_string(
                                                    j->req.kind == API_CHAT ? chat_finish_reason(c) : finish_reason(c->finish)));
        json_object_array_add(choices, ch);
    }
    json_object_object_add(o, "usage", usage_json(j));
    *json = api_json_take(o);
    return *json ? 0 : api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
}

/* ---- streaming ---- */

static void stream_tail(gen_job *j)
{
    if (j->resp) { /* the Responses stream ends with its final event, no [DONE] */
        j->tail_sent = 1;
        return;
    }
    if (j->req.include_usage) {
        json_object *choices;
        json_object *o = api_envelope(j->id, j->req.kind == API_CHAT ? "chat.completion.chunk" : "text_completion",
                                      j->created, gen_model_name(j), &choices);
        json_object_object_add(o, "usage", usage_json(j));
        api_buf_sse(&j->out, o);
    }
    api_buf_append(&j->out, "data: [DONE]\n\n", 14);
    j->tail_sent = 1;
}

/* MHD content reader: runs on this connection's own thread, so it may wait. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    gen_job *j = cls;
    (void)pos;
    while (j->out_pos >= j->out.len) {
        j->out.len = j->out_pos = 0;
        if (j->tail_sent)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (all_done(j)) {
            stream_tail(j);
            continue;
        }
        if (wait_events(j, 1) < 0) {
            cancel_all(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = j->out.len - j->out_pos;
    if (n > max)
        n = max;
    memcpy(buf, j->out.data + j->out_pos, n);
    j->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    gen_job *j = cls;
    atomic_fetch_sub(&j->s->met.streams_active, 1);
    gen_free(j);
}

enum MHD_Result gen_stream(srv_conn *c, gen_job *j)
{
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, j,
                                                               stream_free);
    if (!r) {
        gen_free(j);
        return MHD_NO;
    }
    atomic_fetch_add(&c->s->met.streams_active, 1);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    c->stream_job = j; /* the access line reads it in on_completed, before the response (and j) is freed */
    enum MHD_Result rc = http_reply_response(c, 200, r);
    if (rc != MHD_YES)
        c->stream_job = NULL; /* freed with the response */
    return rc;
}
