/* Lazy constraints (src/engine/constraint.c, constraint_trigger.c) on a
 * synthetic vocabulary: free text until a trigger, then the grammar. The
 * grammar part is compared with the byte-level reference
 * (grammar_check_prefix over the text from the trigger on); the free part
 * with what it must be: every id, except a token that would complete the
 * trigger with bytes the grammar refuses. A random walk with rollbacks
 * checks that a token the mask allows is always accepted (the engine fails
 * the row otherwise) and that rollback restores masks exactly. */
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

enum { T_LT, T_TOOLGT, T_TRIG, T_X, T_A, T_LB, T_RB, T_SP, T_LTT, T_OOLGT, T_TRIGX, T_NL_TRIG_LB, T_OPEN, T_CLOSE,
       T_SPECIAL, T_EOS, T_TOOLGTX, T_OOLGTX, T_RB_X, N_TOK };
static const char *const TOKS[N_TOK] = {"<",       "tool>",    "<tool>",  "x",   "a",     "{",
                                        "}",       " ",        "<t",      "ool>", "<tool>x", "\n<tool>{",
                                        "<think>", "</think>", "[T]",     "<eos>", "tool>x", "ool>x",
                                        "}x"};
#define N_VOCAB 40
#define NW ((N_VOCAB + 31) / 32)

static grammar_vocab *vocab(void)
{
    size_t lens[N_TOK];
    uint8_t special[N_TOK] = {0};
    for (int i = 0; i < N_TOK; i++)
        lens[i] = strlen(TOKS[i]);
    special[T_EOS] = special[T_SPECIAL] = 1;
    int32_t stop = T_EOS;
    grammar_vocab *v = grammar_vocab_from_bytes(TOKS, lens, special, N_TOK, N_VOCAB, &stop, 1, NULL);
    assert_non_null(v);
    return v;
}

static int bit(const uint32_t *m, int id) { return (m[id / 32] >> (id % 32)) & 1; }

static void mask_of(const engine_constraint_ops *ops, void *ctx, uint32_t *m)
{
    assert_int_equal(ops->fill_mask(ctx, m, NW), 0);
}

static const char *G = "root ::= \"<tool>\" \"{\" \"a\"* \"}\"";

static void test_free_then_grammar(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    tern_err err = {0};
    grammar_compiled *cg = grammar_compile_ebnf(G, strlen(G), v, NULL, &err);
    assert_non_null(cg);
    const char *texts[] = {"<tool>"};
    constraint_triggers *t = constraint_triggers_new(v, texts, 1, NULL, 0, 0, &err);
    assert_non_null(t);
    constraint_lazy lz = {.triggers = t};
    const engine_constraint_ops *ops;
    void *ctx;
    assert_int_equal(constraint_grammar_new_lazy(cg, NULL, &lz, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
    uint32_t m[NW];
    mask_of(ops, ctx, m);
    /* free: everything but "<tool>x" (the trigger, then a byte the grammar refuses) */
    for (int i = 0; i < N_VOCAB; i++)
        if (bit(m, i) != (i != T_TRIGX))
            fail_msg("free mask: token %d is %d", i, bit(m, i));
    assert_int_not_equal(ops->accept(ctx, T_TRIGX), 0);
    assert_int_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_LT), 0);
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_TOOLGT)); /* completes "<tool>" */
    assert_false(bit(m, T_TRIGX));
    assert_false(bit(m, T_TOOLGTX)); /* completes "<tool>" across tokens, then "x" */
    assert_true(bit(m, T_OOLGTX));   /* "<ool>x" is no trigger */
    assert_false(ops->is_terminated(ctx));
    assert_int_equal(ops->accept(ctx, T_TOOLGT), 0); /* triggered across two tokens */
    mask_of(ops, ctx, m);
    for (int i = 0; i < N_VOCAB; i++) /* the grammar after "<tool>": only "{" */
        if (bit(m, i) != (i == T_LB))
            fail_msg("grammar mask: token %d is %d", i, bit(m, i));
    assert_int_equal(ops->accept(ctx, T_LB), 0);
    assert_int_equal(ops->accept(ctx, T_A), 0);
    assert_int_equal(ops->accept(ctx, T_RB), 0);
    assert_true(ops->is_terminated(ctx));
    /* back to the free text "x<" */
    assert_int_equal(ops->rollback(ctx, 4), 0);
    assert_false(ops->is_terminated(ctx));
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_TOOLGT) && bit(m, T_EOS) && bit(m, T_X) && !bit(m, T_TRIGX));
    assert_int_equal(ops->rollback(ctx, 1), 0);
    /* "tool>" after "x" is free text, no trigger */
    assert_int_equal(ops->accept(ctx, T_TOOLGT), 0);
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_X));
    /* a trigger inside one token with text before it, and the grammar's first byte after */
    assert_int_equal(ops->accept(ctx, T_NL_TRIG_LB), 0);
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_A) && bit(m, T_RB) && !bit(m, T_X));
    ops->free(ctx);
    constraint_triggers_free(t);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
}

static void test_at_start_and_tokens(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    tern_err err = {0};
    grammar_compiled *cg = grammar_compile_ebnf(G, strlen(G), v, NULL, &err);
    assert_non_null(cg);
    const char *texts[] = {"<tool>"};
    int32_t ids[] = {T_SPECIAL};
    constraint_triggers *t = constraint_triggers_new(v, texts, 1, ids, 1, 1, &err);
    assert_non_null(t);
    constraint_lazy lz = {.triggers = t};
    const engine_constraint_ops *ops;
    void *ctx;
    uint32_t m[NW];
    assert_int_equal(constraint_grammar_new_lazy(cg, NULL, &lz, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
    /* blanks keep the start open; "<t" "ool>" triggers there */
    assert_int_equal(ops->accept(ctx, T_SP), 0);
    assert_int_equal(ops->accept(ctx, T_LTT), 0);
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_OOLGT));
    assert_false(bit(m, T_OOLGTX)); /* " <tool>x": the trigger at the start, then a refused byte */
    assert_int_equal(ops->accept(ctx, T_OOLGT), 0);
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_LB) && !bit(m, T_X));
    assert_int_equal(ops->rollback(ctx, 2), 0);
    /* text first: no trigger can start any more (everything allowed, "<tool>x" too) */
    assert_int_equal(ops->accept(ctx, T_X), 0);
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_TRIGX));
    assert_int_equal(ops->accept(ctx, T_TRIG), 0);
    assert_int_equal(ops->accept(ctx, T_SPECIAL), 0); /* a token trigger is dead too */
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_X));
    ops->free(ctx);

    /* a token trigger at the start: the grammar follows it (fed nothing) */
    const char *G2 = "root ::= \"{\" \"a\"* \"}\"";
    grammar_compiled *cg2 = grammar_compile_ebnf(G2, strlen(G2), v, NULL, &err);
    assert_non_null(cg2);
    assert_int_equal(constraint_grammar_new_lazy(cg2, NULL, &lz, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
    assert_int_equal(ops->accept(ctx, T_SPECIAL), 0);
    mask_of(ops, ctx, m);
    for (int i = 0; i < N_VOCAB; i++)
        if (bit(m, i) != (i == T_LB))
            fail_msg("after the token trigger: token %d is %d", i, bit(m, i));
    ops->free(ctx);

    /* forced: only the token trigger (and the think open on the first token), then the grammar */
    constraint_lazy forced = {.triggers = t, .forced = 1};
    constraint_think th = {.mode = CONSTRAINT_THINK_MAY, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 0, .capped = 0};
    assert_int_equal(constraint_grammar_new_lazy(cg2, &th, &forced, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
    mask_of(ops, ctx, m);
    for (int i = 0; i < N_VOCAB; i++)
        if (bit(m, i) != (i == T_SPECIAL || i == T_OPEN))
            fail_msg("forced pre mask: token %d is %d", i, bit(m, i));
    assert_int_not_equal(ops->accept(ctx, T_LB), 0);
    assert_int_equal(ops->accept(ctx, T_OPEN), 0);
    assert_int_equal(ops->accept(ctx, T_TRIG), 0); /* inside the block: just text */
    assert_int_equal(ops->accept(ctx, T_CLOSE), 0);
    mask_of(ops, ctx, m);
    for (int i = 0; i < N_VOCAB; i++)
        if (bit(m, i) != (i == T_SPECIAL))
            fail_msg("forced mask: token %d is %d", i, bit(m, i));
    assert_int_equal(ops->accept(ctx, T_SPECIAL), 0);
    assert_int_equal(ops->accept(ctx, T_LB), 0);
    assert_int_equal(ops->accept(ctx, T_RB), 0);
    assert_true(ops->is_terminated(ctx));
    assert_int_equal(ops->rollback(ctx, 4), 0); /* back into the think block */
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_X) && bit(m, T_CLOSE));
    ops->free(ctx);
    constraint_triggers_free(t);
    grammar_compiled_free(cg2);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
}

/* Structural tags: a rearming grammar (one segment) starts over when a
 * segment is complete, and the row is in free text again; at_least_one
 * keeps the stop ids masked until a segment is complete; rollback across a
 * segment's end restores the grammar. */
static const char *GR = "root ::= \"<tool>\" \"{\" \"a\"* \"}\"";

static void test_rearm(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    tern_err err = {0};
    grammar_compiled *cg = grammar_compile_ebnf(GR, strlen(GR), v, NULL, &err);
    assert_non_null(cg);
    const char *texts[] = {"<tool>"};
    constraint_triggers *t = constraint_triggers_new(v, texts, 1, NULL, 0, 0, &err);
    assert_non_null(t);
    constraint_lazy lz = {.triggers = t, .rearm = 1, .at_least_one = 1};
    const engine_constraint_ops *ops;
    void *ctx;
    uint32_t m[NW], before[NW];
    assert_int_equal(constraint_grammar_new_lazy(cg, NULL, &lz, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
    mask_of(ops, ctx, m);
    assert_false(bit(m, T_EOS)); /* at_least_one: no end before a segment */
    assert_true(bit(m, T_X) && bit(m, T_TRIG) && !bit(m, T_TRIGX));
    assert_int_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_TRIG), 0);
    assert_int_equal(ops->accept(ctx, T_LB), 0);
    assert_int_equal(ops->accept(ctx, T_A), 0);
    mask_of(ops, ctx, m);
    for (int i = 0; i < N_VOCAB; i++) /* inside: "a" or "}", never "}x" */
        if (bit(m, i) != (i == T_A || i == T_RB))
            fail_msg("segment mask: token %d is %d", i, bit(m, i));
    assert_int_not_equal(ops->accept(ctx, T_RB_X), 0);
    assert_int_equal(ops->accept(ctx, T_RB), 0); /* the segment ends: free text again */
    assert_false(ops->is_terminated(ctx));
    mask_of(ops, ctx, before);
    assert_true(bit(before, T_EOS) && bit(before, T_X) && bit(before, T_TRIG) && !bit(before, T_TRIGX));
    assert_int_equal(ops->accept(ctx, T_X), 0);
    assert_int_equal(ops->accept(ctx, T_LTT), 0); /* "<t" "ool>": a second segment across two tokens */
    assert_int_equal(ops->accept(ctx, T_OOLGT), 0);
    mask_of(ops, ctx, m);
    for (int i = 0; i < N_VOCAB; i++)
        if (bit(m, i) != (i == T_LB))
            fail_msg("second segment mask: token %d is %d", i, bit(m, i));
    assert_int_equal(ops->rollback(ctx, 3), 0); /* back to just after the first segment */
    mask_of(ops, ctx, m);
    assert_memory_equal(m, before, sizeof m);
    assert_int_equal(ops->rollback(ctx, 1), 0); /* into the first segment */
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_A) && bit(m, T_RB) && !bit(m, T_X) && !bit(m, T_EOS));
    assert_int_equal(ops->rollback(ctx, 4), 0); /* to the start */
    mask_of(ops, ctx, m);
    assert_false(bit(m, T_EOS));
    /* one token: trigger, whole segment */
    assert_int_equal(ops->accept(ctx, T_NL_TRIG_LB), 0);
    assert_int_equal(ops->accept(ctx, T_RB), 0);
    mask_of(ops, ctx, m);
    assert_true(bit(m, T_EOS) && bit(m, T_X));
    ops->free(ctx);
    constraint_triggers_free(t);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
}

/* Random walks: every allowed token is accepted; after a rollback the mask
 * is the one seen at that point before. */
static void test_random_walk(void **state)
{
    grammar_vocab *v = vocab();
    tern_err err = {0};
    const char *G3 = "root ::= \"<tool>\" (\"{\" \"a\"* \"}\")+";
    int rearm = *(int *)*state;
    const char *src = rearm ? GR : G3;
    grammar_compiled *cg = grammar_compile_ebnf(src, strlen(src), v, NULL, &err);
    assert_non_null(cg);
    const char *texts[] = {"<tool>"};
    constraint_triggers *t = constraint_triggers_new(v, texts, 1, NULL, 0, 0, &err);
    constraint_lazy lz = {.triggers = t, .rearm = rearm};
    constraint_think th = {.mode = CONSTRAINT_THINK_MAY, .open_id = T_OPEN, .close_id = T_CLOSE, .max_tokens = 3, .capped = 1};
    uint32_t seed = 12345;
    for (int walk = 0; walk < 200; walk++) {
        const engine_constraint_ops *ops;
        void *ctx;
        assert_int_equal(constraint_grammar_new_lazy(cg, &th, &lz, N_VOCAB, NULL, NULL, &ops, &ctx, &err), 0);
        uint32_t masks[64][NW];
        int n = 0;
        while (n < 60 && !ops->is_terminated(ctx)) {
            mask_of(ops, ctx, masks[n]);
            int allowed[N_TOK], k = 0;
            for (int i = 0; i < N_TOK; i++)
                if (bit(masks[n], i) && i != T_EOS)
                    allowed[k++] = i;
            if (k == 0)
                break;
            seed = seed * 1103515245u + 12345u;
            int tok = allowed[(seed >> 8) % (uint32_t)k];
            if (ops->accept(ctx, tok))
                fail_msg("walk %d step %d: allowed token %d (%s) rejected", walk, n, tok, TOKS[tok]);
            n++;
            seed = seed * 1103515245u + 12345u;
            if (n > 2 && (seed >> 8) % 8 == 0) {
                int back = 1 + (int)((seed >> 12) % 3u);
                if (back > n)
                    back = n;
                assert_int_equal(ops->rollback(ctx, back), 0);
                n -= back;
                uint32_t again[NW];
                mask_of(ops, ctx, again);
                assert_memory_equal(again, masks[n], sizeof again);
            }
        }
        ops->free(ctx);
    }
    constraint_triggers_free(t);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
}

int main(void)
{
    static int plain = 0, rearm = 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_free_then_grammar),
        cmocka_unit_test(test_at_start_and_tokens),
        cmocka_unit_test_prestate(test_random_walk, &plain),
        cmocka_unit_test(test_rearm),
        cmocka_unit_test_prestate(test_random_walk, &rearm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
