/* Fuzz entry point for the harmony splitter (src/server/harmony.c).
 * Input: byte 0 bit 0 = the request has tools (calls parsed), bit 1 = the
 * output was cut (max_tokens); byte 1 the piece size; the rest is model
 * output. The output fed in pieces must equal the one-shot result, every
 * released call's arguments must be a JSON object and no message end may
 * reach the reasoning - never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/harmony.h"

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
            abort(); /* arguments that are not a JSON object never become a call */
        json_object_put(a);
        tern_sbuf_put(&r->calls, o->calls[i].name, strlen(o->calls[i].name) + 1);
        tern_sbuf_put(&r->calls, o->calls[i].arguments, strlen(o->calls[i].arguments) + 1);
        r->n_calls++;
    }
    toolcall_out_reset(o);
}

static void once(int calls, int cut, const char *s, size_t n, size_t piece, run *r)
{
    memset(r, 0, sizeof *r);
    harmony_split h;
    harmony_split_init(&h, calls);
    toolcall_out o = {0};
    for (size_t at = 0; at < n; at += piece) {
        size_t k = at + piece > n ? n - at : piece;
        harmony_split_push(&h, s + at, k, &r->reasoning, &o);
        drain(r, &o);
    }
    harmony_split_finish(&h, cut, &r->reasoning, &o);
    drain(r, &o);
    r->status = h.status;
    toolcall_out_free(&o);
    harmony_split_free(&h);
}

static int same_buf(const tern_sbuf *a, const tern_sbuf *b)
{
    return a->n == b->n && (a->n == 0 || !memcmp(a->s, b->s, a->n));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int calls = data[0] & 1, cut = (data[0] >> 1) & 1;
    size_t piece = 1 + data[1] % 16;
    const char *s = (const char *)data + 2;
    size_t n = size - 2;
    run a, b;
    once(calls, cut, s, n, n ? n : 1, &a);
    once(calls, cut, s, n, piece, &b);
    if (!same_buf(&a.reasoning, &b.reasoning) || !same_buf(&a.content, &b.content) || !same_buf(&a.calls, &b.calls) ||
        a.n_calls != b.n_calls || a.status != b.status)
        abort(); /* streamed and non-streamed must agree */
    if (a.reasoning.n && (memmem(a.reasoning.s, a.reasoning.n, "<|end|>", 7) ||
                          memmem(a.reasoning.s, a.reasoning.n, "<|return|>", 10) ||
                          memmem(a.reasoning.s, a.reasoning.n, "<|call|>", 8)))
        abort(); /* what ends a message never reaches the thought */
    free(a.reasoning.s);
    free(a.content.s);
    free(a.calls.s);
    free(b.reasoning.s);
    free(b.content.s);
    free(b.calls.s);
    return 0;
}
