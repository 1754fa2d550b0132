/* uniqueItems at run time: a JSON tracker beside the parser stacks.
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
 * through the tracker on a copy of its state. Design: docs/grammar.md. */
#ifndef TERN_GRAMMAR_UNIQUE_INT_H
#define TERN_GRAMMAR_UNIQUE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar_int.h"

#define GUQ_RULE_PREFIX "__unique_items_"

typedef struct guq guq;

/* The tracker for g, or NULL with *rc = 0 when g has no uniqueItems rule
 * (nothing to track), or NULL with *rc = TERN_ENOMEM. g is borrowed. */
guq *guq_new(const grammar *g, int *rc);
void guq_free(guq *u);

/* Start of a document (clears everything) / of a new sentence after a
 * restart (keeps the history for rollback). */
void guq_reset(guq *u);
void guq_restart(guq *u);

/* 1 if a stack of set s (of pool p) has its top at the start state of a
 * uniqueItems rule: a '[' read now opens a unique array. */
int guq_opens(const guq *u, const gstk_pool *p, const gstk_set *s);

/* Reads byte b (already accepted by the grammar; opens: guq_opens of the
 * set that read it, for a '['). 1 ok, 0 the byte completes a duplicate
 * item, TERN_ENOMEM. */
int guq_byte(guq *u, uint8_t b, int opens);

/* Checkpoints: guq_save returns the id of a copy of the current state
 * (ids are 0, 1, ... per document; saving id k drops ids >= k), <0 on
 * OOM; guq_load(k) returns to the state saved as k and drops ids > k. */
int32_t guq_save(guq *u, int32_t k);
void guq_load(guq *u, int32_t k);

/* Per token of a candidate set: 0 allowed, 1 completes a duplicate item,
 * 2 undecided (it opens an array inside the token and completes two of
 * its items: only the parser can say whether that array is unique; the
 * caller tries the token for real). first_opens: guq_opens of the
 * current set. Leaves the state as it was. */
int guq_try(guq *u, const uint8_t *s, size_t len, int first_opens);

/* Which tokens guq_try must see in the current state: a bitset over the
 * vocabulary (words of 32 bits; the vocabulary builds its three sets on
 * first use): the tokens holding a '[' followed by two bytes that can end
 * an item ('"', ',', ']', '}', whitespace) while no unique array is open,
 * a '"' inside a string, else a '"', ',', ']', '}' or whitespace. NULL
 * when nothing is tracked (*rc = 0) or on OOM (*rc = TERN_ENOMEM). */
const uint32_t *guq_candidates(guq *u, const grammar_vocab *v, int *rc);

#endif
