/* Structured output on a harmony (gpt-oss) model, at the constraint: a
 * synthetic vocabulary with the harmony tokens (headers as text, as the
 * server's harmony vocabulary holds them; <|end|> special; <|return|> and
 * <|call|> stop tokens), the think block in OPEN mode (the analysis header
 * forced token by token), and the server's grammars (the final header +
 * a JSON Schema; a call to functions.NAME). Masks are checked state by
 * state: the opening forced, the analysis free (text only, no header
 * token, no stop), the budget forcing <|end|>, after it exactly what a
 * byte-level reference of the grammar allows; random walks over the
 * allowed tokens (fresh seed, printed) end in schema-valid JSON and roll
 * back to the same masks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "engine/constraint.h"
#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "server/harmony.h"
#include "server/structured.h"
#include "server/toolcall.h"

enum {
    T_START, T_CHANNEL, T_MESSAGE, T_CONSTRAIN, T_END, T_RETURN, T_CALL, T_EOS,
    T_ANALYSIS, T_FINAL, T_ASSISTANT, T_JSON, T_SP, T_LB, T_RB, T_Q, T_COLON, T_ONE, T_TWO, T_HELLO,
    T_COMMENTARY, T_TO, T_TO2, T_DOT, T_FUNCTIONS, T_B, T_COMMA, T_LTBAR, T_STARTBAR,
    N_TOK
};
/* The header tokens' grammar text is a control byte each (harmony.h:
 * HARMONY_G_*); "<|", "start|>" and the plain byte 0x01 could spell a
 * header in plain pieces, which the grammar must refuse. */
static const char *const TOKS[N_TOK] = {
    "\x01", "\x02", "\x03", "\x04", "<|end|>", "<|return|>", "<|call|>", "<eos>",
    "analysis", "final", "assistant", "json", " ", "{", "}", "\"", ":", "1", "2", "hello",
    "commentary", " to=", "to=", ".", "functions", "b", ",", "<|", "start|>"};
/* Every grammar prefix a token can reach can be completed by the others
 * (no "a" that starts "assistant" and leads nowhere): the walks never
 * strand, as a real vocabulary's pieces do not. */
#define N_VOCAB 40 /* wider than the vocabulary: padded ids stay masked */
#define N_WORDS ((N_VOCAB + 31) / 32)

static int is_special(int t) { return t == T_END || t == T_RETURN || t == T_CALL || t == T_EOS; }
static int is_stop(int t) { return t == T_RETURN || t == T_CALL || t == T_EOS; }
static int is_header(int t) { return t == T_START || t == T_CHANNEL || t == T_MESSAGE || t == T_CONSTRAIN; }

typedef struct fx {
    grammar_vocab *v;
    grammar_compiled *cg;
    grammar *ref;
    constraint_think th;
} fx;

static void fx_init(fx *f, const char *ebnf, int budget)
{
    size_t lens[N_TOK];
    uint8_t special[N_TOK] = {0};
    for (int i = 0; i < N_TOK; i++) {
        lens[i] = strlen(TOKS[i]);
        special[i] = (uint8_t)is_special(i);
    }
    const int32_t stops[] = {T_EOS, T_RETURN, T_CALL};
    tern_err err = {0};
    f->v = grammar_vocab_from_bytes(TOKS, lens, special, N_TOK, N_VOCAB, stops, 3, &err);
    assert_non_null(f->v);
    f->cg = grammar_compile_ebnf(ebnf, strlen(ebnf), f->v, NULL, &err);
    if (!f->cg)
        fail_msg("compile: %s\n%s", err.msg, ebnf);
    f->ref = grammar_from_ebnf(ebnf, strlen(ebnf), NULL, NULL, &err);
    assert_non_null(f->ref);
    /* as harmony_think builds it for a real vocabulary */
    memset(&f->th, 0, sizeof f->th);
    f->th.mode = CONSTRAINT_THINK_OPEN;
    f->th.open_seq[0] = T_CHANNEL;
    f->th.open_seq[1] = T_ANALYSIS;
    f->th.open_seq[2] = T_MESSAGE;
    f->th.n_open = 3;
    f->th.close_id = T_END;
    const int32_t deny[] = {T_START, T_CHANNEL, T_MESSAGE, T_CONSTRAIN};
    memcpy(f->th.deny, deny, sizeof deny);
    f->th.n_deny = 4;
    f->th.max_tokens = budget;
    f->th.capped = budget >= 0;
    if (budget < 0)
        f->th.max_tokens = 0;
}

static void fx_free(fx *f)
{
    grammar_compiled_free(f->cg);
    grammar_free(f->ref);
    grammar_vocab_free(f->v);
}

static int bit(const uint32_t *m, int id) { return (m[id / 32] >> (id % 32)) & 1; }
static void set(uint32_t *m, int id) { m[id / 32] |= 1u << (id % 32); }

/* The grammar's allowed set after text, from the byte-level reference. */
static void ref_mask(const fx *f, const char *text, uint32_t *m)
{
    memset(m, 0, N_WORDS * sizeof *m);
    char buf[512];
    for (int t = 0; t < N_TOK; t++) {
        int ok;
        if (is_stop(t))
            ok = grammar_check_text(f->ref, text, strlen(text)) == 1;
        else if (is_special(t))
            ok = 0;
        else {
            snprintf(buf, sizeof buf, "%s%s", text, TOKS[t]);
            ok = grammar_check_prefix(f->ref, buf, strlen(buf)) == 1;
        }
        if (ok)
            set(m, t);
    }
}

/* Inside the analysis: every text token but the headers, and the close. */
static void think_mask(uint32_t *m, int capped)
{
    memset(m, 0, N_WORDS * sizeof *m);
    set(m, T_END);
    for (int t = 0; !capped && t < N_TOK; t++)
        if (!is_special(t) && !is_header(t))
            set(m, t);
}

static void get_mask(const engine_constraint_ops *ops, void *ctx, uint32_t *m)
{
    assert_int_equal(ops->fill_mask(ctx, m, N_WORDS), 0);
}

static void expect(const uint32_t *got, const uint32_t *want, const char *what, int step)
{
    for (int i = 0; i < N_VOCAB; i++)
        if (bit(got, i) != bit(want, i))
            fail_msg("%s (step %d): token %d (%s): got %d, want %d", what, step, i, i < N_TOK ? TOKS[i] : "pad",
                     bit(got, i), bit(want, i));
}

/* The engine's text of a grammar text: the header bytes as their tokens' text. */
static void real_text(const char *g, char *out, size_t cap)
{
    static const char *const names[] = {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"};
    size_t n = 0;
    for (const char *p = g; *p; p++) {
        const char *piece = *p >= 1 && *p <= 4 ? names[*p - 1] : NULL;
        size_t len = piece ? strlen(piece) : 1;
        assert_true(n + len < cap);
        memcpy(out + n, piece ? piece : p, len);
        n += len;
    }
    out[n] = 0;
}

/* The server's wrap of a response_format schema (structured.c). */
static char *schema_ebnf(const char *schema)
{
    json_object *s = json_tokener_parse(schema);
    assert_non_null(s);
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.max_whitespace = 0;
    char *inner = NULL;
    tern_err err = {0};
    assert_int_equal(grammar_schema_to_ebnf(s, &o, &inner, &err), 0);
    json_object_put(s);
    tern_sbuf b = {0};
    tern_sbuf_str(&b, "root ::= " HARMONY_FINAL_EBNF " h_root\n");
    structured_ebnf_renamed(&b, inner, "h_");
    free(inner);
    assert_false(b.oom);
    return b.s;
}

static const char *SCHEMA = "{\"type\": \"object\", \"properties\": {\"hello\": {\"type\": \"integer\"}}, \"required\": [\"hello\"],"
                            " \"additionalProperties\": false}";

/* Walks a row: the opening, n_think random analysis tokens, then random
 * grammar tokens until a stop is allowed and drawn; checks every mask
 * against its model and records them, then rolls back in random steps and
 * checks the recorded masks again. Returns the grammar text. */
static void walk(fx *f, int n_think, unsigned seed, char *gtext, size_t cap)
{
    const engine_constraint_ops *ops;
    void *ctx;
    assert_int_equal(constraint_grammar_new(f->cg, &f->th, N_VOCAB, NULL, NULL, &ops, &ctx, NULL), 0);
    srand(seed);
    uint32_t masks[256][N_WORDS], want[N_WORDS];
    int step = 0;
    gtext[0] = 0;
    int budget = f->th.capped ? f->th.max_tokens : -1;
    /* the opening, forced */
    for (int k = 0; k < 3; k++, step++) {
        get_mask(ops, ctx, masks[step]);
        memset(want, 0, sizeof want);
        set(want, f->th.open_seq[k]);
        expect(masks[step], want, "opening", step);
        assert_int_not_equal(ops->accept(ctx, T_HELLO), 0); /* anything else is refused */
        char jf[64];
        assert_int_equal(ops->jump_forward(ctx, jf, sizeof jf), 0); /* one forced token per step, no text */
        assert_int_equal(ops->accept(ctx, f->th.open_seq[k]), 0);
    }
    /* the analysis: free text, no header token, no stop; the budget forces <|end|> */
    for (int k = 0;; k++, step++) {
        int capped = budget >= 0 && k >= budget;
        get_mask(ops, ctx, masks[step]);
        think_mask(want, capped);
        expect(masks[step], want, "analysis", step);
        assert_int_not_equal(ops->accept(ctx, T_START), 0);
        assert_int_not_equal(ops->accept(ctx, T_RETURN), 0);
        if (capped || k >= n_think) {
            assert_int_equal(ops->accept(ctx, T_END), 0);
            step++;
            /* the next header starts with the special <|start|>, never with plain "<|" */
            uint32_t after[N_WORDS];
            get_mask(ops, ctx, after);
            memset(want, 0, sizeof want);
            set(want, T_START);
            expect(after, want, "after <|end|>", step);
            break;
        }
        int t;
        do
            t = rand() % N_TOK;
        while (!bit(want, t) || t == T_END);
        assert_int_equal(ops->accept(ctx, t), 0);
    }
    /* the grammar: exactly the reference's set, until a stop token */
    for (;; step++) {
        assert_true(step < 256);
        get_mask(ops, ctx, masks[step]);
        ref_mask(f, gtext, want);
        expect(masks[step], want, "grammar", step);
        int n_ok = 0, pick[N_TOK];
        for (int t = 0; t < N_TOK; t++)
            if (bit(want, t))
                pick[n_ok++] = t;
        if (n_ok == 0)
            fail_msg("nothing allowed after [%s]", gtext);
        int t = pick[rand() % n_ok];
        /* prefer finishing once the grammar allows it, so walks end */
        if (bit(want, T_RETURN) && rand() % 2)
            t = T_RETURN;
        assert_int_equal(ops->accept(ctx, t), 0);
        if (is_stop(t))
            break;
        assert_true(strlen(gtext) + strlen(TOKS[t]) < cap);
        strcat(gtext, TOKS[t]);
    }
    int n_steps = step + 1;
    /* roll back in random chunks: each point's mask as it was */
    for (int at = n_steps; at > 0;) {
        int back = 1 + rand() % 4;
        if (back > at)
            back = at;
        assert_int_equal(ops->rollback(ctx, back), 0);
        at -= back;
        uint32_t now[N_WORDS];
        get_mask(ops, ctx, now);
        expect(now, masks[at], "after rollback", at);
    }
    ops->free(ctx);
}

static unsigned fresh_seed(void)
{
    unsigned s = (unsigned)time(NULL) ^ (unsigned)clock();
    printf("seed %u\n", s);
    return s;
}

static void test_final_schema(void **state)
{
    (void)state;
    char *ebnf = schema_ebnf(SCHEMA);
    unsigned seed = fresh_seed();
    for (int budget = -1; budget <= 3; budget += 2) {
        fx f;
        fx_init(&f, ebnf, budget);
        for (int trial = 0; trial < 40; trial++) {
            char gb[512], g[1024];
            walk(&f, trial % 7, seed + (unsigned)trial, gb, sizeof gb);
            real_text(gb, g, sizeof g);
            /* the final header, then JSON of the schema, nothing else */
            const char *hdr = "<|start|>assistant<|channel|>final";
            if (strncmp(g, hdr, strlen(hdr)))
                fail_msg("no final header: [%s]", g);
            const char *body = strstr(g, "<|message|>");
            assert_non_null(body);
            body += strlen("<|message|>");
            json_object *o = json_tokener_parse(body);
            if (!o || !json_object_is_type(o, json_type_object) || json_object_object_length(o) != 1 ||
                !json_object_is_type(json_object_object_get(o, "hello"), json_type_int))
                fail_msg("final message is not the schema's JSON: [%s]", body);
            json_object_put(o);
        }
        fx_free(&f);
    }
    free(ebnf);
}

static void test_forced_call(void **state)
{
    (void)state;
    json_object *tools = json_tokener_parse(
        "[{\"type\": \"function\", \"function\": {\"name\": \"b\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"b\": {\"type\": \"integer\"}}, \"required\": [\"b\"], \"additionalProperties\": false}}}]");
    assert_non_null(tools);
    char *ebnf = NULL;
    api_error e;
    assert_int_equal(toolcall_harmony_grammar(tools, NULL, NULL, &ebnf, &e), 0);
    unsigned seed = fresh_seed();
    fx f;
    fx_init(&f, ebnf, -1);
    for (int trial = 0; trial < 40; trial++) {
        char gb[512], g[1024];
        walk(&f, trial % 5, seed + (unsigned)trial, gb, sizeof gb);
        real_text(gb, g, sizeof g);
        /* the call as the splitter reads it */
        harmony_split h;
        harmony_split_init(&h, 1);
        tern_sbuf r = {0};
        toolcall_out o = {0};
        assert_int_equal(harmony_split_push(&h, g, strlen(g), &r, &o), 0);
        assert_int_equal(harmony_split_finish(&h, 0, &r, &o), 0);
        if (o.n_calls != 1 || strcmp(o.calls[0].name, "b") || h.status != TOOLCALL_OK)
            fail_msg("not one call to b: [%s] (%d calls)", g, o.n_calls);
        json_object *a = json_tokener_parse(o.calls[0].arguments);
        assert_non_null(a);
        assert_true(json_object_is_type(json_object_object_get(a, "b"), json_type_int));
        json_object_put(a);
        harmony_split_free(&h);
        toolcall_out_free(&o);
        free(r.s);
    }
    fx_free(&f);
    free(ebnf);
    /* tool_choice auto + response_format: a call or the final answer to the schema, nothing else */
    json_object *sch = json_tokener_parse(SCHEMA);
    grammar_schema_opts so;
    grammar_schema_opts_init(&so);
    so.max_whitespace = 0;
    char *alt = NULL;
    tern_err te = {0};
    assert_int_equal(grammar_schema_to_ebnf(sch, &so, &alt, &te), 0);
    json_object_put(sch);
    assert_int_equal(toolcall_harmony_grammar(tools, NULL, alt, &ebnf, &e), 0);
    free(alt);
    fx_init(&f, ebnf, 2);
    int n_calls = 0, n_finals = 0;
    for (int trial = 0; trial < 40; trial++) {
        char gb[512], g[1024];
        walk(&f, trial % 4, seed + 1000 + (unsigned)trial, gb, sizeof gb);
        real_text(gb, g, sizeof g);
        harmony_split h;
        harmony_split_init(&h, 1);
        tern_sbuf r = {0};
        toolcall_out o = {0};
        assert_int_equal(harmony_split_push(&h, g, strlen(g), &r, &o), 0);
        assert_int_equal(harmony_split_finish(&h, 0, &r, &o), 0);
        json_object *ans = o.content.n ? json_tokener_parse(o.content.s) : NULL;
        if (o.n_calls == 1 && !o.content.n)
            n_calls++;
        else if (o.n_calls == 0 && ans && json_object_is_type(json_object_object_get(ans, "hello"), json_type_int))
            n_finals++;
        else
            fail_msg("neither one call nor the schema's answer: [%s]", g);
        json_object_put(ans);
        harmony_split_free(&h);
        toolcall_out_free(&o);
        free(r.s);
    }
    printf("auto + response_format: %d calls, %d answers\n", n_calls, n_finals);
    fx_free(&f);
    free(ebnf);
    /* a name the tools do not have */
    assert_int_not_equal(toolcall_harmony_grammar(tools, "nope", NULL, &ebnf, &e), 0);
    json_object_put(tools);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_final_schema),
        cmocka_unit_test(test_forced_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
