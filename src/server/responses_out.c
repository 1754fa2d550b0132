/* /v1/responses, reply side: output items built from the chat pipeline's
 * pieces, the streamed events, the final response object and what the
 * store keeps (see responses.h). One item list is the truth for both
 * ways out: streamed events announce its changes as they happen, and the
 * final object (body, or response.completed) is the list itself.
 *
 * Stream: response.created, response.in_progress; per item
 * response.output_item.added ... response.output_item.done with, inside,
 * reasoning_text.delta/.done (reasoning item), content_part.added,
 * output_text.delta/.done, content_part.done (message), or
 * function_call_arguments.delta/.done (function_call); then
 * response.completed (response.incomplete at max_output_tokens,
 * response.failed on an error). Every event has sequence_number. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/json.h"
#include "server/responses_int.h"
#include "server/server_int.h"

/* Bytes of one streamed arguments piece (cut at UTF-8 boundaries). */
#define RESP_ARGS_PIECE 24

resp_state *resp_state_new(tern_server *s)
{
    resp_state *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->s = s;
    r->created = (long long)time(NULL);
    char rid[32];
    toolcall_id_new(rid, sizeof rid); /* call_ + 24 alphanumerics */
    snprintf(r->id, sizeof r->id, "resp_%s", rid + 5);
    r->store = 1;
    r->reason_idx = r->msg_idx = -1;
    r->echo = json_object_new_object();
    r->output = json_object_new_array();
    r->calls = json_object_new_array();
    if (!r->echo || !r->output || !r->calls) {
        responses_state_free(r);
        return NULL;
    }
    return r;
}

void responses_state_free(resp_state *r)
{
    if (!r)
        return;
    json_object_put(r->echo);
    json_object_put(r->output);
    json_object_put(r->calls);
    json_object_put(r->final);
    free(r->history);
    free(r->thought.s);
    free(r->text.s);
    free(r->all_text.s);
    free(r);
}

static void item_id(char *buf, size_t cap, const char *prefix)
{
    char rid[32];
    toolcall_id_new(rid, sizeof rid);
    snprintf(buf, cap, "%s_%s", prefix, rid + 5);
}

/* ---- events ---- */

static json_object *ev_new(resp_state *r, const char *type)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string(type));
    json_object_object_add(o, "sequence_number", json_object_new_int(r->seq++));
    return o;
}

/* "event: T\ndata: {..}\n\n"; takes ev. */
static void ev_send(api_buf *out, json_object *ev)
{
    json_object *t = NULL;
    json_object_object_get_ex(ev, "type", &t);
    api_buf_append(out, "event: ", 7);
    api_buf_append(out, json_object_get_string(t), (size_t)json_object_get_string_len(t));
    api_buf_append(out, "\n", 1);
    api_buf_sse(out, ev); /* "data: <json>\n\n" */
}

static void ev_item(resp_state *r, api_buf *out, const char *type, int idx)
{
    json_object *ev = ev_new(r, type);
    json_object_object_add(ev, "output_index", json_object_new_int(idx));
    json_object_object_add(ev, "item", json_object_get(json_object_array_get_idx(r->output, (size_t)idx)));
    ev_send(out, ev);
}

static const char *item_id_of(resp_state *r, int idx)
{
    json_object *id = NULL;
    json_object_object_get_ex(json_object_array_get_idx(r->output, (size_t)idx), "id", &id);
    return json_object_get_string(id);
}

/* An event about part content_index of item idx (text events). */
static json_object *ev_part(resp_state *r, const char *type, int idx)
{
    json_object *ev = ev_new(r, type);
    json_object_object_add(ev, "item_id", json_object_new_string(item_id_of(r, idx)));
    json_object_object_add(ev, "output_index", json_object_new_int(idx));
    json_object_object_add(ev, "content_index", json_object_new_int(0));
    return ev;
}

static json_object *text_part(const char *text, size_t len)
{
    json_object *p = json_object_new_object();
    json_object_object_add(p, "type", json_object_new_string("output_text"));
    json_object_object_add(p, "text", api_json_string(text, len));
    json_object_object_add(p, "annotations", json_object_new_array());
    json_object_object_add(p, "logprobs", json_object_new_array());
    return p;
}

/* ---- items ---- */

static int item_add(resp_state *r, json_object *item)
{
    json_object_array_add(r->output, item);
    return (int)json_object_array_length(r->output) - 1;
}

static void reasoning_open(resp_state *r, api_buf *out, int streaming)
{
    char id[RESP_ID_MAX];
    item_id(id, sizeof id, "rs");
    json_object *it = json_object_new_object();
    json_object_object_add(it, "id", json_object_new_string(id));
    json_object_object_add(it, "type", json_object_new_string("reasoning"));
    json_object_object_add(it, "summary", json_object_new_array());
    json_object_object_add(it, "content", json_object_new_array());
    json_object_object_add(it, "status", json_object_new_string("in_progress"));
    r->reason_idx = item_add(r, it);
    r->thought.n = 0;
    if (streaming)
        ev_item(r, out, "response.output_item.added", r->reason_idx);
}

static void reasoning_close(resp_state *r, api_buf *out, int streaming)
{
    int idx = r->reason_idx;
    if (idx < 0)
        return;
    json_object *it = json_object_array_get_idx(r->output, (size_t)idx);
    const char *t = r->thought.s ? r->thought.s : "";
    json_object *part = json_object_new_object(), *content = json_object_new_array();
    json_object_object_add(part, "type", json_object_new_string("reasoning_text"));
    json_object_object_add(part, "text", api_json_string(t, r->thought.n));
    json_object_array_add(content, part);
    json_object_object_add(it, "content", content);
    if (r->summary) { /* no summarizer: the thought is its own summary */
        json_object *sum = json_object_new_array(), *sp = json_object_new_object();
        json_object_object_add(sp, "type", json_object_new_string("summary_text"));
        json_object_object_add(sp, "text", api_json_string(t, r->thought.n));
        json_object_array_add(sum, sp);
        json_object_object_add(it, "summary", sum);
    }
    json_object_object_add(it, "status", json_object_new_string("completed"));
    if (streaming) {
        json_object *ev = ev_part(r, "response.reasoning_text.done", idx);
        json_object_object_add(ev, "text", api_json_string(t, r->thought.n));
        ev_send(out, ev);
        ev_item(r, out, "response.output_item.done", idx);
    }
    r->reason_idx = -1;
}

static void message_open(resp_state *r, api_buf *out, int streaming)
{
    char id[RESP_ID_MAX];
    item_id(id, sizeof id, "msg");
    json_object *it = json_object_new_object();
    json_object_object_add(it, "id", json_object_new_string(id));
    json_object_object_add(it, "type", json_object_new_string("message"));
    json_object_object_add(it, "role", json_object_new_string("assistant"));
    json_object_object_add(it, "status", json_object_new_string("in_progress"));
    json_object_object_add(it, "content", json_object_new_array());
    r->msg_idx = item_add(r, it);
    r->text.n = 0;
    if (streaming) {
        ev_item(r, out, "response.output_item.added", r->msg_idx);
        json_object *ev = ev_part(r, "response.content_part.added", r->msg_idx);
        json_object_object_add(ev, "part", text_part("", 0));
        ev_send(out, ev);
    }
}

static void message_close(resp_state *r, api_buf *out, int streaming, int incomplete)
{
    int idx = r->msg_idx;
    if (idx < 0)
        return;
    json_object *it = json_object_array_get_idx(r->output, (size_t)idx);
    const char *t = r->text.s ? r->text.s : "";
    json_object *content = json_object_new_array();
    json_object_array_add(content, text_part(t, r->text.n));
    json_object_object_add(it, "content", content);
    json_object_object_add(it, "status", json_object_new_string(incomplete ? "incomplete" : "completed"));
    if (streaming) {
        json_object *ev = ev_part(r, "response.output_text.done", idx);
        json_object_object_add(ev, "text", api_json_string(t, r->text.n));
        json_object_object_add(ev, "logprobs", json_object_new_array());
        ev_send(out, ev);
        ev = ev_part(r, "response.content_part.done", idx);
        json_object_object_add(ev, "part", text_part(t, r->text.n));
        ev_send(out, ev);
        ev_item(r, out, "response.output_item.done", idx);
    }
    r->msg_idx = -1;
}

static void function_call(resp_state *r, api_buf *out, int streaming, const toolcall_call *tc)
{
    char id[RESP_ID_MAX], cid[32];
    item_id(id, sizeof id, "fc");
    toolcall_id_new(cid, sizeof cid);
    json_object *it = json_object_new_object();
    json_object_object_add(it, "id", json_object_new_string(id));
    json_object_object_add(it, "type", json_object_new_string("function_call"));
    json_object_object_add(it, "status", json_object_new_string(streaming ? "in_progress" : "completed"));
    json_object_object_add(it, "arguments", json_object_new_string(streaming ? "" : tc->arguments));
    json_object_object_add(it, "call_id", json_object_new_string(cid));
    json_object_object_add(it, "name", json_object_new_string(tc->name));
    int idx = item_add(r, it);
    if (streaming) {
        ev_item(r, out, "response.output_item.added", idx);
        size_t len = strlen(tc->arguments);
        for (size_t at = 0; at < len;) {
            size_t n = len - at < RESP_ARGS_PIECE ? len - at : RESP_ARGS_PIECE;
            while (at + n < len && ((unsigned char)tc->arguments[at + n] & 0xC0) == 0x80)
                n++;
            json_object *ev = ev_new(r, "response.function_call_arguments.delta");
            json_object_object_add(ev, "item_id", json_object_new_string(id));
            json_object_object_add(ev, "output_index", json_object_new_int(idx));
            json_object_object_add(ev, "delta", json_object_new_string_len(tc->arguments + at, (int)n));
            ev_send(out, ev);
            at += n;
        }
        json_object_object_add(it, "arguments", json_object_new_string(tc->arguments));
        json_object_object_add(it, "status", json_object_new_string("completed"));
        json_object *ev = ev_new(r, "response.function_call_arguments.done");
        json_object_object_add(ev, "item_id", json_object_new_string(id));
        json_object_object_add(ev, "output_index", json_object_new_int(idx));
        json_object_object_add(ev, "arguments", json_object_new_string(tc->arguments));
        ev_send(out, ev);
        ev_item(r, out, "response.output_item.done", idx);
    }
    /* for the stored history: the call as a chat tool_call */
    json_object *call = json_object_new_object(), *fn = json_object_new_object();
    json_object_object_add(call, "id", json_object_new_string(cid));
    json_object_object_add(call, "type", json_object_new_string("function"));
    json_object_object_add(fn, "name", json_object_new_string(tc->name));
    json_object_object_add(fn, "arguments", json_object_new_string(tc->arguments));
    json_object_object_add(call, "function", fn);
    json_object_array_add(r->calls, call);
}

/* ---- the response object ---- */

static json_object *response_object(resp_state *r, const char *status)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(r->id));
    json_object_object_add(o, "object", json_object_new_string("response"));
    json_object_object_add(o, "created_at", json_object_new_int64(r->created));
    json_object_object_add(o, "status", json_object_new_string(status));
    json_object_object_add(o, "error", NULL);
    json_object_object_add(o, "incomplete_details", NULL);
    const char *model = r->model ? r->model : "";
    json_object_object_add(o, "model", api_json_string(model, strlen(model)));
    json_object_object_add(o, "output", json_object_get(r->output));
    static const char *const echoed[] = {"instructions", "max_output_tokens", "temperature", "top_p",
                                         "previous_response_id", "reasoning", "text", "tools", "tool_choice",
                                         "parallel_tool_calls", "metadata", "user"};
    for (size_t i = 0; i < sizeof echoed / sizeof echoed[0]; i++) {
        json_object *v = NULL;
        json_object_object_get_ex(r->echo, echoed[i], &v);
        json_object_object_add(o, echoed[i], json_object_get(v));
    }
    if (!json_object_object_get_ex(r->echo, "tools", NULL))
        json_object_object_add(o, "tools", json_object_new_array());
    if (!json_object_object_get_ex(r->echo, "text", NULL)) {
        json_object *t = json_object_new_object(), *f = json_object_new_object();
        json_object_object_add(f, "type", json_object_new_string("text"));
        json_object_object_add(t, "format", f);
        json_object_object_add(o, "text", t);
    }
    if (!json_object_object_get_ex(r->echo, "tool_choice", NULL))
        json_object_object_add(o, "tool_choice", json_object_new_string("auto"));
    if (!json_object_object_get_ex(r->echo, "parallel_tool_calls", NULL))
        json_object_object_add(o, "parallel_tool_calls", json_object_new_boolean(1));
    json_object_object_add(o, "store", json_object_new_boolean(r->store));
    json_object_object_add(o, "truncation", json_object_new_string("disabled"));
    return o;
}

void responses_set_model(resp_state *r, const char *model) { r->model = model; }

void responses_start(resp_state *r, api_buf *out)
{
    json_object *ev = ev_new(r, "response.created");
    json_object_object_add(ev, "response", response_object(r, "in_progress"));
    ev_send(out, ev);
    ev = ev_new(r, "response.in_progress");
    json_object_object_add(ev, "response", response_object(r, "in_progress"));
    ev_send(out, ev);
}

void responses_piece(resp_state *r, api_buf *out, int streaming, const char *thought, size_t thought_len,
                     const char *text, size_t text_len, const toolcall_out *calls)
{
    if (thought_len) {
        if (r->msg_idx >= 0)
            message_close(r, out, streaming, 0);
        if (r->reason_idx < 0)
            reasoning_open(r, out, streaming);
        tern_sbuf_put(&r->thought, thought, thought_len);
        if (streaming) {
            json_object *ev = ev_part(r, "response.reasoning_text.delta", r->reason_idx);
            json_object_object_add(ev, "delta", api_json_string(thought, thought_len));
            ev_send(out, ev);
        }
    }
    if (text_len) {
        reasoning_close(r, out, streaming);
        if (r->msg_idx < 0)
            message_open(r, out, streaming);
        tern_sbuf_put(&r->text, text, text_len);
        tern_sbuf_put(&r->all_text, text, text_len);
        if (streaming) {
            json_object *ev = ev_part(r, "response.output_text.delta", r->msg_idx);
            json_object_object_add(ev, "delta", api_json_string(text, text_len));
            json_object_object_add(ev, "logprobs", json_object_new_array());
            ev_send(out, ev);
        }
    }
    for (int i = 0; calls && i < calls->n_calls; i++) {
        reasoning_close(r, out, streaming);
        message_close(r, out, streaming, 0);
        function_call(r, out, streaming, &calls->calls[i]);
    }
}

/* The conversation the store keeps: this turn's input and its answer. */
static void store_turn(resp_state *r)
{
    json_object *h = r->history ? tern_json_parse(r->history, strlen(r->history), NULL) : NULL;
    if (!h)
        return;
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string("assistant"));
    json_object_object_add(m, "content", api_json_string(r->all_text.s ? r->all_text.s : "", r->all_text.n));
    if (json_object_array_length(r->calls))
        json_object_object_add(m, "tool_calls", json_object_get(r->calls));
    json_object_array_add(h, m);
    const char *t = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN);
    char *copy = t ? strdup(t) : NULL;
    json_object_put(h);
    if (copy)
        responses_store_put(r->s, r->id, copy);
}

void responses_finish(resp_state *r, api_buf *out, int streaming, engine_finish f, const char *error, int n_prompt,
                      const engine_usage *u, int n_thought_tokens)
{
    if (r->finished)
        return;
    r->finished = 1;
    int incomplete = f == ENGINE_FINISH_LENGTH, failed = f == ENGINE_FINISH_ERROR || f == ENGINE_FINISH_CANCELLED;
    reasoning_close(r, out, streaming);
    /* an answer with no text and no calls is still one (empty) message */
    if (r->msg_idx < 0 && json_object_array_length(r->calls) == 0 && !failed) {
        int has_msg = 0;
        for (size_t i = 0; i < json_object_array_length(r->output); i++) {
            json_object *t = NULL;
            json_object_object_get_ex(json_object_array_get_idx(r->output, i), "type", &t);
            has_msg |= !strcmp(json_object_get_string(t), "message");
        }
        if (!has_msg)
            message_open(r, out, streaming);
    }
    message_close(r, out, streaming, incomplete);
    const char *status = failed ? "failed" : incomplete ? "incomplete" : "completed";
    json_object *o = response_object(r, status);
    if (incomplete) {
        json_object *d = json_object_new_object();
        json_object_object_add(d, "reason", json_object_new_string("max_output_tokens"));
        json_object_object_add(o, "incomplete_details", d);
    }
    if (failed) {
        json_object *er = json_object_new_object();
        json_object_object_add(er, "code", json_object_new_string("server_error"));
        json_object_object_add(er, "message", json_object_new_string(error && *error ? error : "generation failed"));
        json_object_object_add(o, "error", er);
    }
    json_object *us = json_object_new_object(), *in_d = json_object_new_object(), *out_d = json_object_new_object();
    int n_out = u ? u->n_generated : 0;
    json_object_object_add(us, "input_tokens", json_object_new_int(n_prompt));
    json_object_object_add(in_d, "cached_tokens", json_object_new_int(u ? u->n_cached : 0));
    json_object_object_add(us, "input_tokens_details", in_d);
    json_object_object_add(us, "output_tokens", json_object_new_int(n_out));
    json_object_object_add(out_d, "reasoning_tokens", json_object_new_int(n_thought_tokens));
    json_object_object_add(us, "output_tokens_details", out_d);
    json_object_object_add(us, "total_tokens", json_object_new_int(n_prompt + n_out));
    json_object_object_add(o, "usage", us);
    r->final = o;
    if (streaming) {
        json_object *ev = ev_new(r, failed ? "response.failed" : incomplete ? "response.incomplete" : "response.completed");
        json_object_object_add(ev, "response", json_object_get(o));
        ev_send(out, ev);
    }
    if (r->store && !failed)
        store_turn(r);
}

char *responses_body(resp_state *r)
{
    return r->final ? strdup(json_object_to_json_string_ext(r->final, JSON_C_TO_STRING_PLAIN)) : NULL;
}
