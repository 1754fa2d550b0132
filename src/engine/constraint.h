/* Grammar constraints for the engine: an adapter from a compiled grammar
 * and its matcher to engine_constraint_ops, wrapped in a small state
 * machine for thinking models (free text inside <think> ... </think>, the
 * grammar after it). One constraint per row; the engine owns it after a
 * successful submit. */
#ifndef TERN_ENGINE_CONSTRAINT_H
#define TERN_ENGINE_CONSTRAINT_H

#include <stdint.h>

#include "base/err.h"
#include "engine/engine.h"
#include "grammar/grammar.h"

typedef enum constraint_think_mode {
    CONSTRAINT_THINK_OFF = 0, /* the grammar starts at the first token */
    CONSTRAINT_THINK_MAY,     /* the first token may open a think block, else the grammar starts */
    CONSTRAINT_THINK_INSIDE,  /* the prompt opened the block: free until the close token */
} constraint_think_mode;

typedef struct constraint_think {
    constraint_think_mode mode;
    int32_t open_id, close_id; /* the vocabulary's think delimiters (from the tokenizer) */
    /* Tokens allowed inside the block before the close token is forced
     * (0 = no cap unless capped); the row's max_tokens still applies on top. */
    int max_tokens;
    int capped; /* 1: max_tokens is a cap even when 0 (a budget of 0 closes at once) */
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

#endif
