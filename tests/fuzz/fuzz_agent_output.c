/* Fuzz entry point for the answer pipeline of a chat reply: the reasoning
 * splitter, then the tool-call parser (src/server/reasoning.c,
 * toolcall_parse.c). Input: byte 0 picks the tool-call format, byte 1 the
 * piece size, the rest is model output. The output fed in pieces must equal
 * the one-shot result, and every released call's arguments must be a JSON
 * object - never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/reasoning.h"
#include "server/toolcall_parse.h"

typedef struct run {
    tern_sbuf reasoning, content, calls; /* calls: name NUL arguments NUL ... */
    int n_calls, status;
} run;

static void drain(run *r, toolcall_out *o)
{
    tern_sbuf_put(&r->content, o->content.s ? o->content.s : "", o->content.n);
    for (int i = 0; i < o->n_calls; i++) {
        json_object *a = tern_json_parse(o->calls[i].arguments, strlen(o->calls[i].arguments), NULL);
        if (!a || !json_object_is_type(a, json_type_object))
            abort(); /* arguments that are not a JSON object never leave the parser */
        json_object_put(a);
        tern_sbuf_put(&r->calls, o->calls[i].name, strlen(o->calls[i].name) + 1);
        tern_sbuf_put(&r->calls, o->calls[i].arguments, strlen(o->calls[i].arguments) + 1);
        r->n_calls++;
    }
    toolcall_out_reset(o);
}

static void once(const toolfmt *f, const char *s, size_t n, size_t piece, run *r)
{
    memset(r, 0, sizeof *r);
    reasoning_delims d;
    memset(&d, 0, sizeof d);
    strcpy(d.open, "<think>");
    strcpy(d.close, "</think>");
    d.open_len = 7;
    d.close_len = 8;
    reasoning_split rs;
    reasoning_split_init(&rs, &d, REASONING_START_MAY);
    toolcall_parser p;
    toolcall_parser_init(&p, f);
    toolcall_out o = {0};
    for (size_t at = 0; at <= n; at += piece) {
        tern_sbuf ans = {0};
        size_t k = at + piece > n ? n - at : piece;
        if (k)
            reasoning_split_push(&rs, s + at, k, &r->reasoning, &ans);
        if (at + piece > n)
            reasoning_split_finish(&rs, &r->reasoning, &ans);
        if (ans.n)
            toolcall_parser_push(&p, ans.s, ans.n, &o);
        free(ans.s);
        drain(r, &o);
    }
    toolcall_parser_finish(&p, &o);
    drain(r, &o);
    r->status = p.status;
    toolcall_out_free(&o);
    toolcall_parser_free(&p);
    reasoning_split_free(&rs);
}

static int same_buf(const tern_sbuf *a, const tern_sbuf *b)
{
    return a->n == b->n && (a->n == 0 || !memcmp(a->s, b->s, a->n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    const toolfmt *f = toolfmt_get((toolfmt_kind)(data[0] % TOOLFMT_N));
    size_t piece = 1 + data[1] % 16;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    run a, b;
    once(f, s, n, n ? n : 1, &a);
    once(f, s, n, piece, &b);
    if (!same_buf(&a.reasoning, &b.reasoning) || !same_buf(&a.content, &b.content) || !same_buf(&a.calls, &b.calls) ||
        a.n_calls != b.n_calls || a.status != b.status)
        abort(); /* streamed and non-streamed must agree */
    free(a.reasoning.s);
    free(a.content.s);
    free(a.calls.s);
    free(b.reasoning.s);
    free(b.content.s);
    free(b.calls.s);
    return 0;
}
