/* The row constraint behind structured output, tool calls and the
 * reasoning budget (see constraint.h). States:
 *   PRE     the first token: the grammar's set (lazy: the free set) plus
 *           the think-open token;
 *   OPEN    the opening sequence (think mode OPEN: harmony's analysis
 *           header), one forced token after the other;
 *   THINK   free text (special, stop and padded ids excluded) until the
 *           think-close token,
 *           forced once the think cap is reached;
 *   FREE    (lazy only) free text until a trigger starts the grammar;
 *   OFF     (lazy only) free text where no trigger can start any more;
 *           a rearming lazy grammar (structural tags) returns to FREE
 *           when a segment is complete (constraint.h);
 *   GRAMMAR the matcher decides (without a grammar - a think budget
 *           alone - every token is allowed: the answer is free).
 * Every accepted token is recorded with the transition it made (and the
 * free-text bytes it added), so rollback (speculative decoding) can undo
 * any suffix exactly: grammar steps roll the matcher back, the others
 * restore the state. */
#include <stdlib.h>
#include <string.h>

#include "engine/constraint_int.h"

enum { S_PRE, S_THINK, S_GRAMMAR, S_FREE, S_OFF, S_OPEN };
/* K_TRIG_TEXT: the token that completed a text trigger (one matcher step,
 * the bytes from the trigger on); K_TRIG_ID: a token trigger (no step).
 * K_GRAMMAR_END / K_TRIG_TEXT_END: the same tokens when they also completed
 * a segment of a rearming grammar (one more matcher step: the restart; one
 * more free-text byte: a NUL barrier, so no trigger spans a segment). */
enum { K_OPEN, K_THINK, K_CLOSE, K_GRAMMAR, K_FREE, K_TRIG_TEXT, K_TRIG_ID, K_GRAMMAR_END, K_TRIG_TEXT_END };

typedef struct gconstraint {
    grammar_matcher *m;       /* NULL: a think budget without a grammar */
    const grammar_vocab *v;
    int32_t n_vocab;
    size_t n_words;
    constraint_think think;
    int state, start_state;
    int n_think;              /* tokens inside the block so far */
    int n_opened;             /* tokens of the opening sequence accepted (OPEN mode) */
    uint8_t *hist;            /* [n_hist] K_* per accepted token */
    uint32_t *hist_len;       /* [n_hist] free-text bytes the token added (lazy) */
    int n_hist, cap_hist;
    uint32_t *free_mask;      /* THINK mask, built on first use */
    int lazy;
    constraint_lazy lz;
    char *text;               /* lazy: the free text since the think block [n_text] */
    size_t n_text, cap_text;
    char *scratch;            /* lazy: text tail + one token, for the trigger check */
    size_t cap_scratch;
    int n_segs;               /* segments completed (rearm) */
    void (*on_release)(void *);
    void *release_user;
} gconstraint;

static void set_bit(uint32_t *mask, int32_t id) { mask[id >> 5] |= 1u << (id & 31); }
static void clear_bit(uint32_t *mask, int32_t id) { mask[id >> 5] &= ~(1u << (id & 31)); }

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
        for (int i = 0; i < c->think.n_deny; i++)
            if (c->think.deny[i] >= 0 && c->think.deny[i] < c->n_vocab)
                clear_bit(c->free_mask, c->think.deny[i]);
        set_bit(c->free_mask, c->think.close_id);
    }
    memcpy(mask, c->free_mask, c->n_words * sizeof *mask);
    return 0;
}

/* Clears the tokens of group k of x (constraint_int.h) that would complete
 * the trigger after the free text's window [from, from + n_win) with bytes
 * the grammar refuses (checked on the matcher, which has not started yet,
 * and undone). */
static int check_group(gconstraint *c, const trig_text *x, size_t k, uint32_t *mask, size_t from, size_t n_win)
{
    const constraint_triggers *t = c->lz.triggers;
    for (size_t j = x->grp[k]; j < x->grp[k + 1]; j++) {
        size_t len = 0;
        const char *b = grammar_vocab_token(c->v, x->cand[j], &len);
        if (n_win + len > c->cap_scratch) {
            size_t cap = (n_win + len) * 2;
            char *p = realloc(c->scratch, cap);
            if (!p)
                return TERN_ENOMEM;
            c->scratch = p;
            c->cap_scratch = cap;
        }
        if (n_win)
            memcpy(c->scratch, c->text + from, n_win);
        memcpy(c->scratch + n_win, b, len);
        long at = constraint_trigger_find(t, c->scratch, n_win, n_win + len);
        if (at < 0)
            continue;
        int rc = grammar_matcher_accept_string(c->m, c->scratch + at, n_win + len - (size_t)at);
        if (rc < 0)
            return rc;
        if (rc == 1)
            grammar_matcher_rollback(c->m, 1);
        else
            clear_bit(mask, x->cand[j]);
    }
    return 0;
}

/* Free text: every id, except a token that would complete a text trigger
 * with bytes the grammar refuses (checked on the matcher, which has not
 * started yet, and undone). Forced: only the token triggers. */
static int fill_free(gconstraint *c, uint32_t *mask, int32_t n_words)
{
    const constraint_triggers *t = c->lz.triggers;
    memset(mask, 0, (size_t)n_words * sizeof *mask);
    if (c->lz.forced) {
        for (size_t i = 0; i < t->n_ids; i++)
            if (t->ids[i] >= 0 && t->ids[i] < c->n_vocab)
                set_bit(mask, t->ids[i]);
        return 0;
    }
    fill_all(c, mask, n_words);
    if (c->lz.at_least_one && c->n_segs == 0)
        for (int32_t i = 0; i < c->n_vocab; i++)
            if (grammar_vocab_is_stop(c->v, i))
                clear_bit(mask, i);
    if (c->state == S_OFF)
        return 0;
    /* the text a trigger can still start in: from the first non-blank
     * byte (at_start: none after it may start one) or the last bytes */
    size_t from = 0;
    if (t->at_start)
        from = constraint_trigger_first_text(c->text, c->n_text);
    else if (c->n_text > t->max_len)
        from = c->n_text - t->max_len;
    size_t n_win = c->n_text - from;
    for (size_t i = 0; i < t->n_texts; i++) {
        const trig_text *x = &t->texts[i];
        /* group 0 always; group k only after text ending in s[0..k) (at_start:
         * that is all the text after the blanks) */
        for (size_t k = 0; k < x->len; k++) {
            if (k > 0 && (t->at_start ? n_win != k || memcmp(c->text + from, x->s, k)
                                      : c->n_text < k || memcmp(c->text + c->n_text - k, x->s, k)))
                continue;
            int rc = check_group(c, x, k, mask, from, n_win);
            if (rc)
                return rc;
        }
    }
    return 0;
}

static int op_fill_mask(void *ctx, uint32_t *mask, int32_t n_words)
{
    gconstraint *c = ctx;
    if ((size_t)n_words < c->n_words)
        return TERN_ERANGE;
    if (c->state == S_THINK)
        return fill_think(c, mask, n_words);
    if (c->state == S_OPEN) {
        memset(mask, 0, (size_t)n_words * sizeof *mask);
        set_bit(mask, c->think.open_seq[c->n_opened]);
        return 0;
    }
    if (c->state == S_FREE || c->state == S_OFF || (c->state == S_PRE && c->lazy)) {
        int rc = fill_free(c, mask, n_words);
        if (rc < 0)
            return rc;
    } else if (!c->m) {
        fill_all(c, mask, n_words);
        return 0;
    } else {
        int rc = grammar_matcher_fill_next_token_bitmask(c->m, mask, (size_t)n_words);
        if (rc < 0)
            return rc;
    }
    if (c->state == S_PRE)
        set_bit(mask, c->think.open_id);
    return 0;
}

static int hist_push_len(gconstraint *c, uint8_t k, uint32_t len)
{
    if (c->n_hist == c->cap_hist) {
        int cap = c->cap_hist ? c->cap_hist * 2 : 256;
        uint8_t *h = realloc(c->hist, (size_t)cap);
        if (!h)
            return TERN_ENOMEM;
        c->hist = h;
        uint32_t *l = realloc(c->hist_len, (size_t)cap * sizeof *l);
        if (!l)
            return TERN_ENOMEM;
        c->hist_len = l;
        c->cap_hist = cap;
    }
    c->hist_len[c->n_hist] = len;
    c->hist[c->n_hist++] = k;
    return 0;
}

static int hist_push(gconstraint *c, uint8_t k) { return hist_push_len(c, k, 0); }

/* The state once the think block is over (or when there is none). */
static int after_think(const gconstraint *c) { return c->lazy ? S_FREE : S_GRAMMAR; }

static int free_state(const gconstraint *c)
{
    return constraint_trigger_dead(c->lz.triggers, c->text, c->n_text) ? S_OFF : S_FREE;
}

/* After a grammar token of a rearming grammar: when the segment is
 * complete (the grammar admits no further byte), the matcher starts over
 * (one more step) and the row is back in free text; the token's history
 * entry becomes its _END kind. */
static int segment_end(gconstraint *c, int32_t token)
{
    if (!c->lz.rearm || !c->m || grammar_vocab_is_stop(c->v, token) || !grammar_matcher_is_terminated(c->m))
        return 0;
    if (c->n_text + 1 > c->cap_text) {
        size_t cap = c->n_text * 2 + 64;
        char *p = realloc(c->text, cap);
        if (!p)
            return TERN_ENOMEM;
        c->text = p;
        c->cap_text = cap;
    }
    if (grammar_matcher_restart(c->m))
        return TERN_ENOMEM;
    c->text[c->n_text++] = '\0';
    uint8_t *k = &c->hist[c->n_hist - 1];
    *k = *k == K_TRIG_TEXT ? K_TRIG_TEXT_END : K_GRAMMAR_END;
    c->n_segs++;
    c->state = free_state(c);
    return 0;
}

/* A token in free text: a token trigger, a text trigger completed (the
 * grammar takes the bytes from the trigger on), or more free text. */
static int accept_free(gconstraint *c, int32_t token)
{
    const constraint_triggers *t = c->lz.triggers;
    if (c->state != S_OFF && constraint_trigger_is_id(t, token)) {
        if (hist_push(c, K_TRIG_ID))
            return TERN_ENOMEM;
        c->state = S_GRAMMAR;
        return 0;
    }
    if (c->lz.forced)
        return TERN_EINVAL;
    size_t len = 0;
    const char *b = grammar_vocab_token(c->v, token, &len);
    if (c->n_text + len > c->cap_text) {
        size_t cap = (c->n_text + len) * 2 + 64;
        char *p = realloc(c->text, cap);
        if (!p)
            return TERN_ENOMEM;
        c->text = p;
        c->cap_text = cap;
    }
    if (len)
        memcpy(c->text + c->n_text, b, len);
    long at = c->state == S_OFF ? -1 : constraint_trigger_find(t, c->text, c->n_text, c->n_text + len);
    if (at >= 0) {
        int rc = grammar_matcher_accept_string(c->m, c->text + at, c->n_text + len - (size_t)at);
        if (rc != 1)
            return rc < 0 ? rc : TERN_EINVAL;
        if (hist_push_len(c, K_TRIG_TEXT, (uint32_t)len)) {
            grammar_matcher_rollback(c->m, 1);
            return TERN_ENOMEM;
        }
        c->n_text += len;
        c->state = S_GRAMMAR;
        return segment_end(c, token);
    }
    if (hist_push_len(c, K_FREE, (uint32_t)len))
        return TERN_ENOMEM;
    c->n_text += len;
    if (c->state != S_OFF)
        c->state = free_state(c);
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
    if (c->state == S_OPEN) {
        if (token != c->think.open_seq[c->n_opened])
            return TERN_EINVAL;
        if (hist_push(c, K_OPEN))
            return TERN_ENOMEM;
        if (++c->n_opened == c->think.n_open)
            c->state = S_THINK;
        return 0;
    }
    if (c->state == S_THINK) {
        int capped = think_capped(c);
        if (token == c->think.close_id) {
            if (hist_push(c, K_CLOSE))
                return TERN_ENOMEM;
            c->state = after_think(c);
            return 0;
        }
        size_t len = 0;
        if (capped || !grammar_vocab_token(c->v, token, &len) || len == 0)
            return TERN_EINVAL;
        for (int i = 0; i < c->think.n_deny; i++)
            if (token == c->think.deny[i])
                return TERN_EINVAL;
        if (hist_push(c, K_THINK))
            return TERN_ENOMEM;
        c->n_think++;
        return 0;
    }
    if (c->state == S_FREE || c->state == S_OFF || (c->state == S_PRE && c->lazy))
        return accept_free(c, token);
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
    return c->lazy ? segment_end(c, token) : 0;
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
    for (int i = c->n_hist - n; i < c->n_hist; i++) {
        uint8_t k = c->hist[i];
        n_grammar += k == K_GRAMMAR || k == K_TRIG_TEXT ? 1 : k == K_GRAMMAR_END || k == K_TRIG_TEXT_END ? 2 : 0;
    }
    if (n_grammar && c->m) {
        int rc = grammar_matcher_rollback(c->m, n_grammar);
        if (rc)
            return rc;
    }
    for (int i = c->n_hist - n; i < c->n_hist; i++) {
        c->n_think -= c->hist[i] == K_THINK;
        c->n_opened -= c->hist[i] == K_OPEN && c->think.mode == CONSTRAINT_THINK_OPEN;
        if (c->hist[i] == K_FREE || c->hist[i] == K_TRIG_TEXT || c->hist[i] == K_TRIG_TEXT_END)
            c->n_text -= c->hist_len[i];
        if (c->hist[i] == K_GRAMMAR_END || c->hist[i] == K_TRIG_TEXT_END) {
            c->n_text--; /* the barrier */
            c->n_segs--;
        }
    }
    c->n_hist -= n;
    /* the state after the last remaining token */
    int last = c->n_hist ? c->hist[c->n_hist - 1] : -1;
    if (last < 0)
        c->state = c->start_state;
    else if (last == K_OPEN && c->think.mode == CONSTRAINT_THINK_OPEN && c->n_opened < c->think.n_open)
        c->state = S_OPEN;
    else if (last == K_OPEN || last == K_THINK)
        c->state = S_THINK;
    else if (last == K_CLOSE)
        c->state = after_think(c);
    else if (last == K_FREE || last == K_GRAMMAR_END || last == K_TRIG_TEXT_END)
        c->state = free_state(c);
    else
        c->state = S_GRAMMAR;
    return 0;
}

/* Forced text only once the grammar runs: before, the think block is an
 * alternative to whatever the grammar forces. (A forced opening is one
 * allowed token per step, not text: harmony's header tokens have no text
 * the engine could re-encode into them, harmony.h.) */
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
    free(c->hist_len);
    free(c->free_mask);
    free(c->text);
    free(c->scratch);
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
                          const constraint_lazy *lazy, int32_t n_vocab, void (*on_release)(void *user),
                          void *release_user, const engine_constraint_ops **ops, void **ctx, tern_err *err)
{
    if (n_vocab <= 0 || (size_t)(n_vocab + 31) / 32 < grammar_vocab_mask_words(v))
        return tern_err_set(err, TERN_EINVAL, "constraint: the grammar's vocabulary is wider than the logits (%d)",
                            n_vocab);
    constraint_think th = {0};
    if (think)
        th = *think;
    if (th.mode == CONSTRAINT_THINK_OPEN) {
        if (th.n_open <= 0 || th.n_open > CONSTRAINT_SEQ_MAX || th.n_deny < 0 || th.n_deny > CONSTRAINT_SEQ_MAX)
            return tern_err_set(err, TERN_EINVAL, "constraint: a forced opening needs 1..%d tokens", CONSTRAINT_SEQ_MAX);
        for (int i = 0; i < th.n_open; i++)
            if (th.open_seq[i] < 0 || th.open_seq[i] >= n_vocab)
                return tern_err_set(err, TERN_EINVAL, "constraint: think delimiters outside the vocabulary");
        th.open_id = th.open_seq[0];
    }
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
    if (lazy) {
        c->lazy = 1;
        c->lz = *lazy;
    }
    c->start_state = th.mode == CONSTRAINT_THINK_MAY      ? S_PRE
                     : th.mode == CONSTRAINT_THINK_INSIDE ? S_THINK
                     : th.mode == CONSTRAINT_THINK_OPEN   ? S_OPEN
                                                          : after_think(c);
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
    return constraint_new(cg, grammar_compiled_vocab(cg), think, NULL, n_vocab, on_release, release_user, ops, ctx,
                          err);
}

int constraint_think_new(const grammar_vocab *v, const constraint_think *think, int32_t n_vocab,
                         const engine_constraint_ops **ops, void **ctx, tern_err *err)
{
    if (!think || think->mode == CONSTRAINT_THINK_OFF)
        return tern_err_set(err, TERN_EINVAL, "constraint: a think budget needs a think block");
    return constraint_new(NULL, v, think, NULL, n_vocab, NULL, NULL, ops, ctx, err);
}

int constraint_grammar_new_lazy(grammar_compiled *cg, const constraint_think *think, const constraint_lazy *lazy,
                                int32_t n_vocab, void (*on_release)(void *user), void *release_user,
                                const engine_constraint_ops **ops, void **ctx, tern_err *err)
{
    if (!lazy || !lazy->triggers)
        return tern_err_set(err, TERN_EINVAL, "constraint: a lazy grammar needs triggers");
    return constraint_new(cg, grammar_compiled_vocab(cg), think, lazy, n_vocab, on_release, release_user, ops, ctx,
                          err);
}
