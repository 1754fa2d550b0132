/* uniqueItems and long string lengths at run time: a JSON tracker beside
 * the parser stacks.
 *
 * No context-free grammar says "all items differ" over an unbounded
 * domain, so the schema front end wraps such an array in a rule whose
 * name starts with GUQ_RULE_PREFIX and the matcher runs this tracker on
 * the bytes it accepts: a JSON lexer with a stack of open containers
 * that records, per array opened by such a rule (its start state read
 * the '['), the canonical value of every item (strings decoded, numbers
 * by value: 1 = 1.0 = 10e-1, objects with their members sorted by key)
 * and refuses the byte that completes an item equal to an earlier item
 * of the same array. Masks: the grammar's mask, then every allowed token
 * that can complete an item (selected by the bytes it holds) is run
 * through the tracker on a copy of its state.
 *
 * String lengths the same way: a `pattern` or `format` whose product
 * automaton with minLength / maxLength would pass its state bound is
 * written without the lengths, in a rule named GUQ_LEN_PREFIX
 * "MIN_MAX_N" ('"' regex '"'); the tracker counts the string's
 * codepoints and refuses the byte past maxLength, or the closing quote
 * before minLength. Design: docs/grammar.md. */
#ifndef TERN_GRAMMAR_UNIQUE_INT_H
#define TERN_GRAMMAR_UNIQUE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar_int.h"

#define GUQ_RULE_PREFIX "__unique_items_"
#define GUQ_LEN_PREFIX "__str_len_"
/* Beside each length rule GUQ_LEN_PREFIX "MIN_MAX_N", a rule nothing
 * calls, GUQ_RE_PREFIX "N", holds its terms as one literal ("+LEN:regex"
 * or "-LEN:regex" each): the tracker follows their automaton over the
 * string's codepoints and refuses a token after which no continuation
 * can end the string within its bounds (a `\S` still owed at maxLength). */
#define GUQ_RE_PREFIX "__str_re_"
/* Length rules are written only for maxLength >= this (or none): a token
 * that opens a string and reaches it inside itself is rare (it is tried
 * for real: guq_candidates). */
#define GUQ_LEN_MIN_MAX 64
/* ... and only where the product automaton with the lengths would have
 * more states than this (terms' states x counter values) or passes its
 * bound. */
#define GUQ_LEN_PRODUCT 4096

typedef struct guq guq;

/* unique_len.c: per length rule with its GUQ_RE_PREFIX terms, their
 * automaton over codepoints and which (state, count) pairs can still end
 * the string within the bounds. */
typedef struct guq_lre guq_lre;
/* Fills g->len_re (once, at compile). 0 or TERN_ENOMEM. */
int guq_grammar_prepare(grammar *g);
void guq_lre_free(guq_lre *x);
/* GUQ_LEN_PREFIX "MIN_MAX_N": 1 with the bounds and N, or 0. */
int guq_len_rule_name(const char *name, long *mn, long *mx, unsigned long *num);
/* The state after codepoint cp, or -1. */
int32_t guq_lre_step(const guq_lre *x, int32_t q, uint32_t cp);
/* 1 if the string can still end within its bounds from state q after c
 * codepoints. */
int guq_lre_viable(const guq_lre *x, int32_t q, long c);
/* 1 if some state is a dead end at some count in [c0, c1]. */
int guq_lre_bad(const guq_lre *x, long c0, long c1);
/* 1 if some codepoint in [lo, hi] leads from q to a state viable at c
 * (a token that ends inside a character or an escape). */
int guq_lre_partial(const guq_lre *x, int32_t q, uint32_t lo, uint32_t hi, long c);

/* The tracker for g, or NULL with *rc = 0 when g has no uniqueItems rule
 * (nothing to track), or NULL with *rc = TERN_ENOMEM. g is borrowed. */
guq *guq_new(const grammar *g, int *rc);
void guq_free(guq *u);

/* Start of a document (clears everything) / of a new sentence after a
 * restart (keeps the history for rollback). */
void guq_reset(guq *u);
void guq_restart(guq *u);

/* 1 if a stack of set s (of pool p) has its top at the start state of a
 * uniqueItems rule (b = '['): a '[' read now opens a unique array; or of
 * a length rule (b = '"'; the bounds of every such reading are kept for
 * the guq_byte that reads it). 0 for other bytes. */
int guq_opens(guq *u, const gstk_pool *p, const gstk_set *s, uint8_t b);
/* guq_opens of the current set for both bytes (bit 0 '[', bit 1 '"'),
 * for guq_try. */
int guq_first(guq *u, const gstk_pool *p, const gstk_set *s);

/* Reads byte b (already accepted by the grammar; opens: guq_opens of the
 * set that read it). 1 ok, 0 the byte completes a duplicate item or
 * breaks a string's length, TERN_ENOMEM. */
int guq_byte(guq *u, uint8_t b, int opens);

/* Checkpoints: guq_save returns the id of a copy of the current state
 * (ids are 0, 1, ... per document; saving id k drops ids >= k), <0 on
 * OOM; guq_load(k) returns to the state saved as k and drops ids > k. */
int32_t guq_save(guq *u, int32_t k);
void guq_load(guq *u, int32_t k);

/* Per token of a candidate set: 0 allowed, 1 refused (a duplicate item,
 * a length broken), 2 undecided (it opens an array or a string inside
 * the token and the check of what it opened needs to know which rule
 * opened it: the caller tries the token for real). first: guq_first of
 * the current set. Leaves the state as it was. */
int guq_try(guq *u, const uint8_t *s, size_t len, int first);

/* Inside a length-checked string: clears from mask the tokens whose
 * codepoints before their first quote pass maxLength, or that close the
 * string short of minLength (per-token counts kept by the vocabulary),
 * and those that end in a dead end of the rule's automaton. The number
 * cleared, or TERN_ENOMEM. */
int guq_len_filter(guq *u, const grammar_vocab *v, uint32_t *mask);

/* The vocabulary's part of the checks (vocab_int.h uq_cand): the
 * candidate sets below and per-token codepoint counts, one pass over the
 * token bytes; grammar_vocab_from_bytes calls it once. 0 or
 * TERN_ENOMEM. */
int guq_vocab_build(grammar_vocab *v);
void guq_vocab_free(grammar_vocab *v);

/* Which tokens guq_try must see in the current state: a bitset over the
 * vocabulary (words of 32 bits; the vocabulary's sets, built with it by
 * guq_vocab_build): the tokens holding a '[' followed by two bytes that can end
 * an item ('"', ',', ']', '}', whitespace) while no unique array is open,
 * a '"' inside a string, else a '"', ',', ']', '}' or whitespace; with
 * length rules also the tokens holding two quotes (or one and
 * GUQ_LEN_MIN_MAX bytes), and every token inside an escape of a
 * length-checked string, and every token with a quote where one opens
 * a string whose automaton has dead ends in a token's reach (first:
 * guq_first of the current set). NULL when nothing is tracked (*rc = 0)
 * or on OOM (*rc = TERN_ENOMEM). */
const uint32_t *guq_candidates(guq *u, const grammar_vocab *v, int first, int *rc);
/* The same as at most two id lists where they are few (no unique array
 * open, not inside an escape): 1 with ids / n set, 0 (use
 * guq_candidates), or TERN_ENOMEM. */
int guq_candidate_lists(guq *u, const grammar_vocab *v, int first, const int32_t *ids[2], size_t n[2]);

#endif
