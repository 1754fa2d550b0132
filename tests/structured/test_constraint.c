/* The engine constraint adapter (src/engine/constraint.c) on a synthetic
 * vocabulary: masks are compared with an independent byte-level reference
 * (grammar_check_prefix / grammar_check_text over the text so far), and
 * the think wrapper's states, cap, rollback and rejections are exercised. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/constraint.h"
#include "grammar/grammar.h"

enum { T_LB, T_RB, T_A, T_B, T_OPEN, T_CLOSE, T_X, T_AB, T_EOS, N_TOK };
static const char *const TOKS[N_TOK] = {"{", "}", "a", "b", "<think>", "</think>", "x", "ab", "<eos>"};
#define N_VOCAB 40 /* wider than the vocabulary: padded ids must stay masked */

typedef struct fx {
    grammar_vocab *v;
    grammar_compiled *cg;
    grammar *ref; /* the same grammar, for the byte-level reference */
} fx;

static void fx_init(fx *f, const char *ebnf)
{
    size_t lens[N_TOK];
    uint8_t special[N_TOK] = {0};
    for (int i = 0; i < N_TOK; i++)
        lens[i] = strlen(TOKS[i]);
    special[T_EOS] = 1;
    int32_t stop = T_EOS;
    tern_err err = {0};
    f->v = grammar_vocab_from_bytes(TOKS, lens, special, N_TOK, N_VOCAB, &stop, 1, &err);
    assert_non_null(f->v);
    f->cg = grammar_compile_ebnf(ebnf, strlen(ebnf), f->v, NULL, &err);
    assert_non_null(f->cg);
    f->ref = grammar_from_ebnf(ebnf, strlen(ebnf), NULL, NULL, &err);
    assert_non_null(f->ref);
}

static void fx_free(fx *f)
{
    grammar_compiled_free(f->cg);
    grammar_free(f->ref);
    grammar_vocab_free(f->v);
}

static int bit(const uint32_t *m, int id) { return (m[id / 32] >> (id % 32)) & 1; }

/* The grammar's allowed set after text, from the byte-level reference. */
static void ref_mask(const fx *f, const char *text, uint32_t *m)
{
    memset(m, 0, ((N_VOCAB + 31) / 32) * sizeof *m);
    char buf[256];
    for (int t = 0; t < N_TOK; t++) {
        int ok;
        if (t == T_EOS) {
            ok = grammar_check_text(f->ref, text, strlen(text)) == 1;
        } else {
            snprintf(buf, sizeof buf, "%s%s", text, TOKS[t]);
            ok = grammar_check_prefix(f->ref, buf, strlen(buf)) == 1;
        }
        if (ok)
            m[t / 32] |= 1u << (t % 32);
    }
}

static void expect_mask(const engine_constraint_ops *ops, void *ctx, const uint32_t *want, const char *what)
{
    uint32_t got[(N_VOCAB + 31) / 32];
    assert_int_equal(ops->fill_mask(ctx, got, (N_VOCAB + 31) / 32), 0);
    for (int i = 0; i < N_VOCAB; i++)
        if (bit(got, i) != bit(want, i))
            fail_msg("%s: token %d: got %d, want %d", what, i, bit(got, i), bit(want, i));
}

static const char *G = "root ::= \"{\" (\"a\" | \"b\")* \"}\"";

static int released;
static void on_release(void *u)
{
    (void)u;
    released++;
}

static void test_off_matches_reference(void **state)
{
    (void)state;
    fx f;
    fx_init(&f, G);
    const engine_constraint_ops *ops;
    void *ctx;
    released = 0;
    assert_int_equal(constraint_grammar_new(f.cg, NULL, N_VOCAB, on_release, NULL, &ops, &ctx, NULL), 0);
    uint32_t want[2];
    char text[64] = "";
    /* walk: { a ab b } then the stop token */
    const int path[] = {T_LB, T_A, T_AB, T_B, T_RB};
    for (size_t k = 0; k < sizeof path / sizeof path[0]; k++) {
        ref_mask(&f, text, want);
        expect_mask(ops, ctx, want, "off");
        assert_false(ops->is_terminated(ctx));
        /* a token the reference rejects is rejected, state unchanged */
        for (int t = 0; t < N_TOK; t++)
            if (!bit(want, t) && t != T_EOS) {
                assert_int_not_equal(ops->accept(ctx, t), 0);
                break;
            }
        assert_int_equal(ops->accept(ctx, path[k]), 0);
        strcat(text, TOKS[path[k]]);
    }
    /* "}" completes the grammar and admits no further byte */
    assert_true(ops->is_terminated(ctx));
    assert_int_not_equal(ops->accept(ctx, N_VOCAB + 3), 0); /* out of range */
    ops->free(ctx);
    assert_int_equal(released, 1);
    fx_free(&f);
}

static void test_think_states_and_rollback(void **state)
{
    (void)state;
    fx f;
    fx_init(&f, G);
    const engine_constraint_ops *ops;
    void *ctx;
    constraint_think th = {.mode = CONSTRAINT_THINK_MAY, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 0, .capped = 0};
    assert_int_equal(constraint_grammar_new(f.cg, &th, N_VOCAB, NULL, NULL, &ops, &ctx, NULL), 0);
    uint32_t pre[2], think[2] = {0}, start[2];
    ref_mask(&f, "", start);
    memcpy(pre, start, sizeof pre);
    pre[T_OPEN / 32] |= 1u << (T_OPEN % 32);
    for (int t = 0; t < N_TOK; t++) /* inside: every real token but the stop token */
        if (t != T_EOS)
            think[t / 32] |= 1u << (t % 32);
    expect_mask(ops, ctx, pre, "pre");
    assert_int_equal(ops->accept(ctx, T_OPEN), 0);
    expect_mask(ops, ctx, think, "think");
    assert_int_not_equal(ops->accept(ctx, T_EOS), 0); /* cannot end inside the block */
    assert_int_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_RB), 0); /* free text, even grammar-invalid */
    assert_false(ops->is_terminated(ctx));
    assert_int_equal(ops->accept(ctx, T_CLOSE), 0);
    expect_mask(ops, ctx, start, "grammar after </think>");
    assert_int_equal(ops->accept(ctx, T_LB), 0);
    uint32_t after_lb[2];
    ref_mask(&f, "{", after_lb);
    expect_mask(ops, ctx, after_lb, "grammar after {");
    /* rollback over the grammar token, the close, the think tokens, the open */
    assert_int_equal(ops->rollback(ctx, 1), 0);
    expect_mask(ops, ctx, start, "rollback to after </think>");
    assert_int_equal(ops->rollback(ctx, 1), 0);
    expect_mask(ops, ctx, think, "rollback into the block");
    assert_int_equal(ops->rollback(ctx, 3), 0);
    expect_mask(ops, ctx, pre, "rollback to the start");
    assert_int_not_equal(ops->rollback(ctx, 1), 0); /* nothing left */
    /* without the open token the grammar starts at once */
    assert_int_equal(ops->accept(ctx, T_LB), 0);
    expect_mask(ops, ctx, after_lb, "grammar from the first token");
    assert_int_equal(ops->accept(ctx, T_RB), 0);
    assert_true(ops->is_terminated(ctx));
    ops->free(ctx);
    fx_free(&f);
}

static void test_think_cap_and_inside(void **state)
{
    (void)state;
    fx f;
    fx_init(&f, G);
    const engine_constraint_ops *ops;
    void *ctx;
    constraint_think th = {.mode = CONSTRAINT_THINK_INSIDE, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 2, .capped = 0};
    assert_int_equal(constraint_grammar_new(f.cg, &th, N_VOCAB, NULL, NULL, &ops, &ctx, NULL), 0);
    assert_int_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_A), 0);
    uint32_t only_close[2] = {0};
    only_close[T_CLOSE / 32] |= 1u << (T_CLOSE % 32);
    expect_mask(ops, ctx, only_close, "capped");
    assert_int_not_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_CLOSE), 0);
    uint32_t start[2];
    ref_mask(&f, "", start);
    expect_mask(ops, ctx, start, "grammar after the forced close");
    /* rolling back everything returns inside the block (the start state) */
    assert_int_equal(ops->rollback(ctx, 3), 0);
    assert_int_equal(ops->accept(ctx, T_X), 0);
    ops->free(ctx);
    fx_free(&f);
}

static void test_jump_forward(void **state)
{
    (void)state;
    fx f;
    fx_init(&f, "root ::= \"{ab\" (\"a\" | \"b\")");
    const engine_constraint_ops *ops;
    void *ctx;
    char buf[32];
    assert_int_equal(constraint_grammar_new(f.cg, NULL, N_VOCAB, NULL, NULL, &ops, &ctx, NULL), 0);
    assert_non_null(ops->jump_forward);
    assert_int_equal(ops->jump_forward(ctx, buf, sizeof buf), 3);
    assert_string_equal(buf, "{ab");
    ops->free(ctx);
    constraint_think th = {.mode = CONSTRAINT_THINK_MAY, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 0, .capped = 0};
    assert_int_equal(constraint_grammar_new(f.cg, &th, N_VOCAB, NULL, NULL, &ops, &ctx, NULL), 0);
    assert_int_equal(ops->jump_forward(ctx, buf, sizeof buf), 0); /* the block is an alternative */
    ops->free(ctx);
    fx_free(&f);
}

/* The think budget alone (no grammar): a cap of 0 forces the close right
 * after the open, the answer is free (every id of the logits, the stop
 * token too), rollback returns into the block, and OFF is refused. */
static void test_think_budget_alone(void **state)
{
    (void)state;
    fx f;
    fx_init(&f, G);
    const engine_constraint_ops *ops;
    void *ctx;
    uint32_t all[2] = {0}, only_close[2] = {0}, m[2];
    for (int i = 0; i < N_VOCAB; i++)
        all[i / 32] |= 1u << (i % 32);
    only_close[T_CLOSE / 32] |= 1u << (T_CLOSE % 32);
    constraint_think th = {.mode = CONSTRAINT_THINK_MAY, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 0, .capped = 1};
    assert_int_equal(constraint_think_new(f.v, &th, N_VOCAB, &ops, &ctx, NULL), 0);
    expect_mask(ops, ctx, all, "before the block: free");
    assert_int_equal(ops->accept(ctx, T_OPEN), 0);
    expect_mask(ops, ctx, only_close, "budget 0: the close at once");
    assert_int_not_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_CLOSE), 0);
    expect_mask(ops, ctx, all, "the answer is free");
    assert_int_equal(ops->accept(ctx, T_EOS), 0);
    assert_int_equal(ops->is_terminated(ctx), 0); /* the engine ends the row on its stop token */
    assert_int_equal(ops->rollback(ctx, 2), 0);
    expect_mask(ops, ctx, only_close, "rolled back into the block");
    ops->free(ctx);
    /* a budget of 2 inside the block; the stop token is not text */
    constraint_think in = {.mode = CONSTRAINT_THINK_INSIDE, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 2, .capped = 1};
    assert_int_equal(constraint_think_new(f.v, &in, N_VOCAB, &ops, &ctx, NULL), 0);
    assert_int_equal(ops->fill_mask(ctx, m, 2), 0);
    assert_true(bit(m, T_X) && bit(m, T_CLOSE) && !bit(m, T_EOS) && !bit(m, N_VOCAB - 1));
    assert_int_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_AB), 0);
    expect_mask(ops, ctx, only_close, "budget 2 spent");
    assert_int_equal(ops->accept(ctx, T_CLOSE), 0);
    char buf[8];
    assert_int_equal(ops->jump_forward(ctx, buf, sizeof buf), 0);
    ops->free(ctx);
    constraint_think off = {.mode = CONSTRAINT_THINK_OFF, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 0, .capped = 1};
    tern_err err = {0};
    assert_int_not_equal(constraint_think_new(f.v, &off, N_VOCAB, &ops, &ctx, &err), 0);
    fx_free(&f);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    fx f;
    fx_init(&f, G);
    const engine_constraint_ops *ops = NULL;
    void *ctx = NULL;
    tern_err err = {0};
    assert_int_not_equal(constraint_grammar_new(f.cg, NULL, 8, NULL, NULL, &ops, &ctx, &err), 0); /* narrower than the vocab mask */
    constraint_think th = {.mode = CONSTRAINT_THINK_MAY, .open_id = -1, .close_id = T_CLOSE, .max_tokens = 0, .capped = 0};
    assert_int_not_equal(constraint_grammar_new(f.cg, &th, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
    assert_null(ctx);
    assert_int_equal(constraint_grammar_new(f.cg, NULL, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
    uint32_t small[1];
    assert_int_not_equal(ops->fill_mask(ctx, small, 1), 0); /* too few words */
    ops->free(ctx);
    fx_free(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off_matches_reference),
        cmocka_unit_test(test_think_states_and_rollback),
        cmocka_unit_test(test_think_cap_and_inside),
        cmocka_unit_test(test_jump_forward),
        cmocka_unit_test(test_think_budget_alone),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
