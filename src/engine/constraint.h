/* Grammar constraints for the engine: an adapter from a compiled grammar
 * and its matcher to engine_constraint_ops, wrapped in a small state
 * machine for thinking models (free text inside <think> ... </think>, the
 * grammar after it). One constraint per row; the engine owns it after a
 * successful submit. */
#ifndef TERN_ENGINE_CONSTRAINT_H
#define TERN_ENGINE_CONSTRAINT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "grammar/grammar.h"

typedef enum constraint_think_mode {
    CONSTRAINT_THINK_OFF = 0, /* the grammar starts at the first token */
    CONSTRAINT_THINK_MAY,     /* the first token may open a think block, else the grammar starts */
    CONSTRAINT_THINK_INSIDE,  /* the prompt opened the block: free until the close token */
    CONSTRAINT_THINK_OPEN,    /* the row must open the block: open_seq is forced, then free until the close */
} constraint_think_mode;

/* Longest opening sequence / deny list (harmony's opening is
 * <|channel|> analysis <|message|>: three tokens in its own vocabulary). */
#define CONSTRAINT_SEQ_MAX 8

typedef struct constraint_think {
    constraint_think_mode mode;
    int32_t open_id, close_id; /* the vocabulary's think delimiters (from the tokenizer) */
    /* Tokens allowed inside the block before the close token is forced
     * (0 = no cap unless capped); the row's max_tokens still applies on top. */
    int max_tokens;
    int capped; /* 1: max_tokens is a cap even when 0 (a budget of 0 closes at once) */
    /* OPEN mode: the opening as a token sequence (harmony's analysis header),
     * each token forced in turn; open_id is unused then. */
    int32_t open_seq[CONSTRAINT_SEQ_MAX];
    int n_open;
    /* Text tokens never allowed inside the block: format markers the
     * grammar's vocabulary holds as text (harmony's headers), which would
     * end the thought without its close token. */
    int32_t deny[CONSTRAINT_SEQ_MAX];
    int n_deny;
} constraint_think;

/* Builds a row constraint over cg (borrowed until on_release(release_user)
 * runs, from the constraint's free; on_release may be NULL). think may be
 * NULL (= off). n_vocab: the logits width the engine masks. On success
 * *ops and *ctx are set (the caller hands them to engine_params and, if
 * engine_submit fails, frees them with (*ops)->free(*ctx)). On error
 * on_release is not called. Inside the think block every text token is
 * allowed (not the stop tokens: a row cannot end before its grammar starts;
 * nor special or padded ids). */
int constraint_grammar_new(grammar_compiled *cg, const constraint_think *think, int32_t n_vocab,
                           void (*on_release)(void *user), void *release_user, const engine_constraint_ops **ops,
                           void **ctx, tern_err *err);

/* A think budget alone, for a row without a grammar (the reasoning budget):
 * the think block as above, capped by think->max_tokens, and every token
 * allowed once it is closed (or when the row does not open it). v is the
 * vocabulary (borrowed; must outlive the constraint); think->mode must
 * not be OFF. Ownership as for constraint_grammar_new. */
int constraint_think_new(const grammar_vocab *v, const constraint_think *think, int32_t n_vocab,
                         const engine_constraint_ops **ops, void **ctx, tern_err *err);

/* ---- lazy grammars: free text until a trigger, then the grammar ----
 * Tool calls in tool_choice "auto": the model writes what it likes until a
 * trigger appears (a text such as "<tool_call>", or a special token such
 * as [TOOL_CALLS]); from there the grammar decides, so a call that starts
 * always completes well-formed. */

/* Longest text trigger in bytes (real ones are short tags). */
#define CONSTRAINT_TRIGGER_MAX 64

typedef struct constraint_triggers constraint_triggers;

/* Trigger tables over v (borrowed for the call only): texts[0..n_texts)
 * (copied; each 1..CONSTRAINT_TRIGGER_MAX bytes) and special-token ids
 * ids[0..n_ids) (copied). at_start: a text trigger counts only at the first
 * non-whitespace byte of the free text. Scans the vocabulary once for the
 * tokens that can complete a text trigger; build it once per trigger set
 * and share it. NULL with err set on error. */
constraint_triggers *constraint_triggers_new(const grammar_vocab *v, const char *const *texts, size_t n_texts,
                                             const int32_t *ids, size_t n_ids, int at_start, tern_err *err);
void constraint_triggers_free(constraint_triggers *t); /* NULL is a no-op */

typedef struct constraint_lazy {
    const constraint_triggers *triggers; /* borrowed: must outlive every row built with it */
    /* 0: free text (after any think block) until a trigger: a text trigger
     *    is the first text the grammar matches (it is fed from the
     *    trigger's first byte), a token trigger is followed by the grammar.
     *    Tokens that would complete a text trigger with bytes the grammar
     *    rejects are masked, so a started grammar never fails.
     * 1: forced: the answer must start with one of the token triggers
     *    (a special token the grammar's text cannot hold), then the grammar. */
    int forced;
    /* Structural tags: the grammar describes one segment (a tag: begin,
     * content, end); when a segment is complete (the grammar admits no
     * further byte) the matcher starts over and the row is back in free
     * text, where a trigger starts the next one. 0: the row ends with the
     * grammar (tool calls). */
    int rearm;
    /* With rearm: the row cannot end (stop ids masked) before one segment
     * is complete. */
    int at_least_one;
} constraint_lazy;

/* As constraint_grammar_new, with the grammar preceded by free text and a
 * trigger (lazy, borrowed for the call; its triggers for the row's life).
 * The think block, when the row has one, comes first as usual. */
int constraint_grammar_new_lazy(grammar_compiled *cg, const constraint_think *think, const constraint_lazy *lazy,
                                int32_t n_vocab, void (*on_release)(void *user), void *release_user,
                                const engine_constraint_ops **ops, void **ctx, tern_err *err);

#endif
