/* The row constraint behind structured output and the reasoning budget
 * (see constraint.h). States:
 *   PRE     the first token: the grammar's set plus the think-open token;
 *   THINK   free text (special, stop and padded ids excluded) until the
 *           think-close token,
 *           forced once the think cap is reached;
 *   GRAMMAR the matcher decides (without a grammar - a think budget
 *           alone - every token is allowed: the answer is free).
 * Every accepted token is recorded with the transition it made, so
 * rollback (speculative decoding) can undo any suffix exactly: grammar
 * steps roll the matcher back, the others restore the state. */
#include <stdlib.h>
#include <string.h>

#include "engine/constraint.h"

enum { S_PRE, S_THINK, S_GRAMMAR };
enum { K_OPEN, K_THINK, K_CLOSE, K_GRAMMAR };

typedef struct gconstraint {
    grammar_matcher *m;       /* NULL: a think budget without a grammar */
    const grammar_vocab *v;
    int32_t n_vocab;
    size_t n_words;
    constraint_think think;
    int state, start_state;
    int n_think;              /* tokens inside the block so far */
    uint8_t *hist;            /* [n_hist] K_* per accepted token */
    int n_hist, cap_hist;
    uint32_t *free_mask;      /* THINK mask, built on first use */
    void (*on_release)(void *);
    void *release_user;
} gconstraint;

static void set_bit(uint32_t *mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }

static int think_capped(const gconstraint *c)
{
    return (c->think.max_tokens > 0 || c->think.capped) && c->n_think >= c->think.max_tokens;
}

/* Every id the logits have: the answer of a row without a grammar. */
static void fill_all(const gconstraint *c, uint32_t *mask, int32_t n_words)
{
    memset(mask, 0, (size_t)n_words * sizeof *mask);
    memset(mask, 0xff, (size_t)(c->n_vocab / 32) * sizeof *mask);
    for (int32_t i = c->n_vocab & ~31; i < c->n_vocab; i++)
        set_bit(mask, i);
}

static int fill_think(gconstraint *c, uint32_t *mask, int32_t n_words)
{
    memset(mask, 0, (size_t)n_words * sizeof *mask);
    if (think_capped(c)) {
        set_bit(mask, c->think.close_id);
        return 0;
    }
    if (!c->free_mask) {
        c->free_mask = calloc(c->n_words, sizeof *c->free_mask);
        if (!c->free_mask)
            return TERN_ENOMEM;
        /* text tokens (no special, stop or padded ids) and the close */
        for (int32_t i = 0; i < c->n_vocab; i++) {
            size_t len = 0;
            if (grammar_vocab_token(c->v, i, &len) && len > 0)
                set_bit(c->free_mask, i);
        }
        set_bit(c->free_mask, c->think.close_id);
    }
    memcpy(mask, c->free_mask, c->n_words * sizeof *mask);
    return 0;
}

static int op_fill_mask(void *ctx, uint32_t *mask, int32_t n_words)
{
    gconstraint *c = ctx;
    if ((size_t)n_words < c->n_words)
        return TERN_ERANGE;
    if (c->state == S_THINK)
        return fill_think(c, mask, n_words);
    if (!c->m) {
        fill_all(c, mask, n_words);
        return 0;
    }
    int rc = grammar_matcher_fill_next_token_bitmask(c->m, mask, (size_t)n_words);
    if (rc < 0)
        return rc;
    if (c->state == S_PRE)
        set_bit(mask, c->think.open_id);
    return 0;
}

static int hist_push(gconstraint *c, uint8_t k)
{
    if (c->n_hist == c->cap_hist) {
        int cap = c->cap_hist ? c->cap_hist * 2 : 256;
        uint8_t *h = realloc(c->hist, (size_t)cap);
        if (!h)
            return TERN_ENOMEM;
        c->hist = h;
        c->cap_hist = cap;
    }
    c->hist[c->n_hist++] = k;
    return 0;
}

static int op_accept(void *ctx, int32_t token)
{
    gconstraint *c = ctx;
    if (token < 0 || token >= c->n_vocab)
        return TERN_ERANGE;
    if (c->state == S_PRE && token == c->think.open_id) {
        if (hist_push(c, K_OPEN))
            return TERN_ENOMEM;
        c->state = S_THINK;
        return 0;
    }
    if (c->state == S_THINK) {
        int capped = think_capped(c);
        if (token == c->think.close_id) {
            if (hist_push(c, K_CLOSE))
                return TERN_ENOMEM;
            c->state = S_GRAMMAR;
            return 0;
        }
        size_t len = 0;
        if (capped || !grammar_vocab_token(c->v, token, &len) || len == 0)
            return TERN_EINVAL;
        if (hist_push(c, K_THINK))
            return TERN_ENOMEM;
        c->n_think++;
        return 0;
    }
    /* PRE (any other token) or GRAMMAR: the matcher decides */
    if (hist_push(c, K_GRAMMAR))
        return TERN_ENOMEM;
    if (!c->m) {
        c->state = S_GRAMMAR;
        return 0;
    }
    int rc = grammar_matcher_accept_token(c->m, token);
    if (rc != 1) {
        c->n_hist--;
        return rc < 0 ? rc : TERN_EINVAL;
    }
    c->state = S_GRAMMAR;
    return 0;
}

static int op_is_terminated(void *ctx)
{
    gconstraint *c = ctx;
    return c->state == S_GRAMMAR && c->m && grammar_matcher_is_terminated(c->m);
}

static int op_rollback(void *ctx, int n)
{
    gconstraint *c = ctx;
    if (n < 0 || n > c->n_hist)
        return TERN_ERANGE;
    int n_grammar = 0;
    for (int i = c->n_hist - n; i < c->n_hist; i++)
        n_grammar += c->hist[i] == K_GRAMMAR;
    if (n_grammar && c->m) {
        int rc = grammar_matcher_rollback(c->m, n_grammar);
        if (rc)
            return rc;
    }
    for (int i = c->n_hist - n; i < c->n_hist; i++)
        c->n_think -= c->hist[i] == K_THINK;
    c->n_hist -= n;
    /* the state after the last remaining token */
    if (c->n_hist == 0)
        c->state = c->start_state;
    else if (c->hist[c->n_hist - 1] == K_OPEN || c->hist[c->n_hist - 1] == K_THINK)
        c->state = S_THINK;
    else
        c->state = S_GRAMMAR;
    return 0;
}

/* Forced text only once the grammar runs: before, the think block is an
 * alternative to whatever the grammar forces. */
static size_t op_jump_forward(void *ctx, char *buf, size_t cap)
{
    gconstraint *c = ctx;
    if (c->state != S_GRAMMAR || cap == 0 || !c->m)
        return 0;
    return grammar_matcher_find_jump_forward_string(c->m, buf, cap);
}

static void op_free(void *ctx)
{
    gconstraint *c = ctx;
    if (!c)
        return;
    grammar_matcher_free(c->m);
    if (c->on_release)
        c->on_release(c->release_user);
    free(c->hist);
    free(c->free_mask);
    free(c);
}

static const engine_constraint_ops grammar_ops = {
    .fill_mask = op_fill_mask,
    .accept = op_accept,
    .is_terminated = op_is_terminated,
    .rollback = op_rollback,
    .free = op_free,
    .jump_forward = op_jump_forward,
};

/* The common constructor: cg NULL = a think budget alone over v. */
static int constraint_new(grammar_compiled *cg, const grammar_vocab *v, const constraint_think *think,
                          int32_t n_vocab, void (*on_release)(void *user), void *release_user,
                          const engine_constraint_ops **ops, void **ctx, tern_err *err)
{
    if (n_vocab <= 0 || (size_t)(n_vocab + 31) / 32 < grammar_vocab_mask_words(v))
        return tern_err_set(err, TERN_EINVAL, "constraint: the grammar's vocabulary is wider than the logits (%d)",
                            n_vocab);
    constraint_think th = {0};
    if (think)
        th = *think;
    if (th.mode != CONSTRAINT_THINK_OFF &&
        (th.open_id < 0 || th.open_id >= n_vocab || th.close_id < 0 || th.close_id >= n_vocab))
        return tern_err_set(err, TERN_EINVAL, "constraint: think delimiters outside the vocabulary");
    gconstraint *c = calloc(1, sizeof *c);
    if (!c)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    if (cg && !(c->m = grammar_matcher_new(cg, err))) {
        free(c);
        return err ? err->code : TERN_ENOMEM;
    }
    c->v = v;
    c->n_vocab = n_vocab;
    c->n_words = (size_t)(n_vocab + 31) / 32;
    c->think = th;
    c->start_state = th.mode == CONSTRAINT_THINK_MAY ? S_PRE : th.mode == CONSTRAINT_THINK_INSIDE ? S_THINK : S_GRAMMAR;
    c->state = c->start_state;
    c->on_release = on_release;
    c->release_user = release_user;
    *ops = &grammar_ops;
    *ctx = c;
    return 0;
}

int constraint_grammar_new(grammar_compiled *cg, const constraint_think *think, int32_t n_vocab,
                           void (*on_release)(void *user), void *release_user, const engine_constraint_ops **ops,
                           void **ctx, tern_err *err)
{
    return constraint_new(cg, grammar_compiled_vocab(cg), think, n_vocab, on_release, release_user, ops, ctx, err);
}

int constraint_think_new(const grammar_vocab *v, const constraint_think *think, int32_t n_vocab,
                         const engine_constraint_ops **ops, void **ctx, tern_err *err)
{
    if (!think || think->mode == CONSTRAINT_THINK_OFF)
        return tern_err_set(err, TERN_EINVAL, "constraint: a think budget needs a think block");
    return constraint_new(NULL, v, think, n_vocab, NULL, NULL, ops, ctx, err);
}
