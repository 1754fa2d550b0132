/* The harmony splitter (src/server/harmony.c): expected reasoning /
 * content / tool calls for gpt-oss-style replies (analysis then final, a
 * call with the recipient after or before the channel, a preamble, several
 * analysis messages, malformed and cut-off calls, plain text without
 * headers), and for every case the streamed split - byte by byte and in
 * random pieces - equals the one-shot split. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/json.h"
#include "grammar/grammar.h"
#include "server/harmony.h"

typedef struct split_out {
    tern_sbuf r;
    toolcall_out o;
    tern_sbuf calls; /* "name(args);" per call */
    toolcall_status status;
} split_out;

static void take_calls(split_out *s, toolcall_out *o)
{
    for (int i = 0; i < o->n_calls; i++) {
        tern_sbuf_str(&s->calls, o->calls[i].name);
        tern_sbuf_str(&s->calls, "(");
        tern_sbuf_str(&s->calls, o->calls[i].arguments);
        tern_sbuf_str(&s->calls, ");");
    }
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    o->n_calls = 0;
}

/* Splits text fed in pieces of the given sizes (0-terminated list cycled;
 * NULL = one piece). */
static void split_pieces(int calls, int cut, const char *text, const size_t *sizes, split_out *s)
{
    memset(s, 0, sizeof *s);
    harmony_split h;
    harmony_split_init(&h, calls);
    size_t n = strlen(text), at = 0, k = 0;
    while (at < n) {
        size_t step = sizes ? sizes[k++] : n;
        if (sizes && sizes[k] == 0)
            k = 0;
        if (step > n - at)
            step = n - at;
        assert_int_equal(harmony_split_push(&h, text + at, step, &s->r, &s->o), 0);
        take_calls(s, &s->o);
        at += step;
    }
    assert_int_equal(harmony_split_finish(&h, cut, &s->r, &s->o), 0);
    take_calls(s, &s->o);
    s->status = h.status;
    harmony_split_free(&h);
}

static const char *str(const tern_sbuf *b) { return b->s ? b->s : ""; }

static void out_free(split_out *s)
{
    free(s->r.s);
    free(s->calls.s);
    toolcall_out_free(&s->o);
}

static void check_full(int calls, int cut, const char *text, const char *want_r, const char *want_c,
                       const char *want_calls, toolcall_status want_status)
{
    split_out one;
    split_pieces(calls, cut, text, NULL, &one);
    if (strcmp(str(&one.r), want_r) || strcmp(str(&one.o.content), want_c) || strcmp(str(&one.calls), want_calls) ||
        one.status != want_status)
        fail_msg("split of [%s]: reasoning [%s] content [%s] calls [%s] status %d, want [%s] [%s] [%s] %d", text,
                 str(&one.r), str(&one.o.content), str(&one.calls), one.status, want_r, want_c, want_calls,
                 want_status);
    static const size_t bytes[] = {1, 0};
    split_out b;
    split_pieces(calls, cut, text, bytes, &b);
    assert_string_equal(str(&b.r), want_r);
    assert_string_equal(str(&b.o.content), want_c);
    assert_string_equal(str(&b.calls), want_calls);
    assert_int_equal(b.status, want_status);
    out_free(&b);
    srand(4321);
    for (int trial = 0; trial < 300; trial++) {
        size_t sizes[16];
        for (int i = 0; i < 15; i++)
            sizes[i] = 1 + (size_t)(rand() % 13);
        sizes[15] = 0;
        split_out p;
        split_pieces(calls, cut, text, sizes, &p);
        assert_string_equal(str(&p.r), want_r);
        assert_string_equal(str(&p.o.content), want_c);
        assert_string_equal(str(&p.calls), want_calls);
        assert_int_equal(p.status, want_status);
        out_free(&p);
    }
    out_free(&one);
}

static void check_case(const char *text, const char *want_r, const char *want_c)
{
    check_full(1, 0, text, want_r, want_c, "", TOOLCALL_OK);
}

static void test_analysis_final(void **state)
{
    (void)state;
    /* what gpt-oss writes after the primer <|start|>assistant (the closing <|return|> is a stop token: no text) */
    check_case("<|channel|>analysis<|message|>User greets. Reply politely.<|end|>"
               "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
               "User greets. Reply politely.", "Hello! How can I help?");
    /* the stop token's text kept (a client asking for special tokens): the same split */
    check_case("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>42<|return|>",
               "think", "42");
    /* the thought is trimmed; the answer is as written */
    check_case("<|channel|>analysis<|message|>\n  a b \n\n<|end|><|start|>assistant<|channel|>final<|message|> x \n",
               "a b", " x \n");
    /* final only */
    check_case("<|channel|>final<|message|>just the answer", "", "just the answer");
    /* two analysis messages: joined by a blank line */
    check_case("<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|> two "
               "<|end|><|start|>assistant<|channel|>final<|message|>done",
               "one\n\ntwo", "done");
    /* an empty analysis (a budget of 0 closes it at once) */
    check_case("<|channel|>analysis<|message|><|end|><|start|>assistant<|channel|>final<|message|>ok", "", "ok");
    /* the output cut inside the thought */
    check_full(1, 1, "<|channel|>analysis<|message|>still thinking  ", "still thinking", "", "", TOOLCALL_OK);
    /* a partial terminator inside the thought is held, then shown to be text */
    check_case("<|channel|>analysis<|message|>a <|en b<|end|><|start|>assistant<|channel|>final<|message|>c",
               "a <|en b", "c");
    /* <|end|> missing from the text (some runtimes drop it): the next <|start|> ends the message */
    check_case("<|channel|>analysis<|message|>User greets. <|start|>assistant<|channel|>final<|message|>Hi!",
               "User greets.", "Hi!");
    /* a message with a content type in the header */
    check_case("<|channel|>final <|constrain|>json<|message|>{\"a\": 1}", "", "{\"a\": 1}");
}

static void test_preamble(void **state)
{
    (void)state;
    /* commentary without a recipient is a preamble: content, joined to the final answer by a blank line */
    check_case("<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>commentary<|message|>Let me "
               "check.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
               "plan", "Let me check.\n\nDone.");
}

static void test_calls(void **state)
{
    (void)state;
    /* recipient after the channel, with <|constrain|> (the <|call|> stop token leaves no text) */
    check_full(1, 0,
               "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
               "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Tokyo\"}",
               "Need weather.", "", "get_weather({\"city\":\"Tokyo\"});", TOOLCALL_OK);
    /* recipient before the channel, as the template renders past calls; <|call|> kept as text */
    check_full(1, 0,
               "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.add<|channel|>commentary "
               "json<|message|> {\"a\": 1, \"b\": [2, 3]} <|call|>",
               "x", "", "add({\"a\": 1, \"b\": [2, 3]});", TOOLCALL_OK);
    /* a preamble, then the call */
    check_full(1, 0,
               "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>commentary "
               "to=functions.f<|message|>{}<|call|>",
               "", "Checking.", "f({});", TOOLCALL_OK);
    /* arguments that are not a JSON object: the raw message back to content */
    check_full(1, 0, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": <|call|>", "",
               "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": <|call|>", "",
               TOOLCALL_MALFORMED);
    check_full(1, 0, "<|channel|>commentary to=functions.f<|message|>[1, 2]", "",
               "<|channel|>commentary to=functions.f<|message|>[1, 2]", "", TOOLCALL_MALFORMED);
    /* a recipient that is no function (a built-in tool the server does not run) */
    check_full(1, 0, "<|channel|>commentary to=python<|message|>{}", "", "<|channel|>commentary to=python<|message|>{}",
               "", TOOLCALL_MALFORMED);
    /* cut by max_tokens inside the call */
    check_full(1, 1, "<|channel|>commentary to=functions.f<|message|>{\"a\": 1", "",
               "<|channel|>commentary to=functions.f<|message|>{\"a\": 1", "", TOOLCALL_TRUNCATED);
    /* without tools in the request a recipient's message is plain content */
    check_full(0, 0, "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}", "", "{\"a\": 1}", "",
               TOOLCALL_OK);
}

static void test_plain_text(void **state)
{
    (void)state;
    /* a model that writes no harmony: all content */
    check_case("Hello there, no headers at all.", "", "Hello there, no headers at all.");
    char longtext[700];
    memset(longtext, 'x', sizeof longtext - 1);
    longtext[sizeof longtext - 1] = 0;
    check_case(longtext, "", longtext);
    /* text longer than any header, then what looks like a message: content from byte 257 on, as streamed */
    char late[400];
    memset(late, 'y', 300);
    strcpy(late + 300, "<|message|>z<|end|>w");
    char late_want[400];
    memcpy(late_want, late, 312); /* all of it up to <|end|> is content (no header that long) */
    strcpy(late_want + 312, "\n\nw"); /* <|end|> ends that message; w is plain text after it */
    check_case(late, "", late_want);
    /* a header the output stopped in says nothing */
    check_case("<|channel|>analysis<|message|>t<|end|><|start|>assistant<|channel|>fi", "t", "");
}

/* ---- a real vocabulary: the demo model's, with the harmony tokens in place
 * of its seven highest merges (as tests/server/harmony.mjs makes it) ---- */

static tern_tokenizer *harmony_demo_tokenizer(void)
{
    static const char *const names[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                        "<|return|>", "<|call|>", "<|constrain|>"};
    tern_err err = {0};
    json_object *tj = tern_json_parse_file("models/tern-demo/tokenizer.json", &err);
    if (!tj)
        fail_msg("tokenizer.json: %s", err.msg);
    json_object *model = json_object_object_get(tj, "model"), *vocab = json_object_object_get(model, "vocab");
    json_object *merges = json_object_object_get(model, "merges"), *added = json_object_object_get(tj, "added_tokens");
    int64_t max_id = -1;
    json_object_object_foreach(vocab, k0, v0) {
        (void)k0;
        if (json_object_get_int64(v0) > max_id)
            max_id = json_object_get_int64(v0);
    }
    char freed[7][64] = {{0}};
    for (int i = 0; i < 7; i++) {
        int64_t id = max_id - 6 + i;
        json_object_object_foreach(vocab, k, v) if (json_object_get_int64(v) == id) snprintf(freed[i], sizeof freed[i], "%s", k);
        json_object_object_del(vocab, freed[i]);
        json_object *t = json_object_new_object();
        json_object_object_add(t, "id", json_object_new_int64(id));
        json_object_object_add(t, "content", json_object_new_string(names[i]));
        json_object_object_add(t, "single_word", json_object_new_boolean(0));
        json_object_object_add(t, "lstrip", json_object_new_boolean(0));
        json_object_object_add(t, "rstrip", json_object_new_boolean(0));
        json_object_object_add(t, "normalized", json_object_new_boolean(0));
        json_object_object_add(t, "special", json_object_new_boolean(1));
        json_object_array_add(added, t);
    }
    json_object *kept = json_object_new_array();
    for (size_t i = 0; i < json_object_array_length(merges); i++) {
        json_object *m = json_object_array_get_idx(merges, i);
        char joined[160];
        if (json_object_is_type(m, json_type_array))
            snprintf(joined, sizeof joined, "%s%s", json_object_get_string(json_object_array_get_idx(m, 0)),
                     json_object_get_string(json_object_array_get_idx(m, 1)));
        else {
            snprintf(joined, sizeof joined, "%s", json_object_get_string(m));
            char *sp = strchr(joined, ' ');
            if (sp)
                memmove(sp, sp + 1, strlen(sp));
        }
        int drop = 0;
        for (int k = 0; k < 7; k++)
            drop |= !strcmp(joined, freed[k]);
        if (!drop)
            json_object_array_add(kept, json_object_get(m));
    }
    json_object_object_add(model, "merges", kept);
    const char *txt = json_object_to_json_string_ext(tj, JSON_C_TO_STRING_PLAIN);
    tern_tokenizer *tok = tokenizer_load_json(txt, strlen(txt), &err);
    json_object_put(tj);
    if (!tok)
        fail_msg("tokenizer: %s", err.msg);
    return tok;
}

static void test_real_vocabulary(void **state)
{
    (void)state;
    tern_tokenizer *tok = harmony_demo_tokenizer();
    harmony_tokens t;
    assert_int_equal(harmony_detect(tok, &t), 1);
    assert_true(t.start >= 0 && t.channel >= 0 && t.message >= 0 && t.end >= 0 && t.ret >= 0 && t.call >= 0 &&
                t.constrain >= 0);
    /* the opening: <|channel|> analysis <|message|>, which decodes to its text */
    constraint_think th;
    tern_err err = {0};
    assert_int_equal(harmony_think(tok, &t, &th, &err), 0);
    assert_int_equal(th.mode, CONSTRAINT_THINK_OPEN);
    assert_int_equal(th.open_seq[0], t.channel);
    assert_int_equal(th.open_seq[th.n_open - 1], t.message);
    assert_int_equal(th.close_id, t.end);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(tokenizer_decode(tok, th.open_seq, (size_t)th.n_open, 0, &text, &len, &err), 0);
    assert_string_equal(text, "<|channel|>analysis<|message|>");
    free(text);
    /* the grammar vocabulary: headers as 0x01..0x04, the plain byte 0x01 left out, <|end|> special */
    int32_t eos = 0, n_vocab = tokenizer_vocab_size(tok);
    grammar_vocab *v = harmony_grammar_vocab(tok, &t, n_vocab, &eos, 1, &err);
    assert_non_null(v);
    const int32_t hdr[4] = {t.start, t.channel, t.message, t.constrain};
    for (int k = 0; k < 4; k++) {
        const char *b = grammar_vocab_token(v, hdr[k], &len);
        assert_true(b && len == 1 && b[0] == k + 1);
    }
    assert_null(grammar_vocab_token(v, t.end, &len));
    assert_true(grammar_vocab_is_stop(v, t.ret) && grammar_vocab_is_stop(v, t.call) && grammar_vocab_is_stop(v, 0));
    int32_t *ids = NULL;
    size_t n_ids = 0;
    assert_int_equal(tokenizer_encode(tok, "\x01", 1, 0, &ids, &n_ids, &err), 0);
    assert_int_equal(n_ids, 1);
    assert_null(grammar_vocab_token(v, ids[0], &len)); /* it would spell <|start|> */
    free(ids);
    /* the final header compiles over it and takes exactly the special tokens */
    const char *ebnf = "root ::= " HARMONY_FINAL_EBNF " \"{}\"";
    grammar_compiled *cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &err);
    if (!cg)
        fail_msg("compile: %s", err.msg);
    grammar_matcher *m = grammar_matcher_new(cg, &err);
    assert_non_null(m);
    assert_int_equal(tokenizer_encode(tok, "<|start|>assistant<|channel|>final<|message|>{}", 47, 0, &ids, &n_ids, &err), 0);
    assert_int_equal(ids[0], t.start);
    for (size_t i = 0; i < n_ids; i++)
        if (grammar_matcher_accept_token(m, ids[i]) != 1)
            fail_msg("the final header's token %zu (id %d) refused", i, ids[i]);
    assert_int_equal(grammar_matcher_accept_token(m, t.ret), 1);
    assert_true(grammar_matcher_is_terminated(m));
    free(ids);
    grammar_matcher_free(m);
    m = grammar_matcher_new(cg, &err);
    /* the same header spelt in plain pieces is refused at its first token */
    assert_int_equal(tokenizer_encode(tok, "<", 1, 0, &ids, &n_ids, &err), 0);
    assert_int_not_equal(grammar_matcher_accept_token(m, ids[0]), 1);
    free(ids);
    grammar_matcher_free(m);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_analysis_final),
        cmocka_unit_test(test_preamble),
        cmocka_unit_test(test_calls),
        cmocka_unit_test(test_plain_text),
        cmocka_unit_test(test_real_vocabulary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
