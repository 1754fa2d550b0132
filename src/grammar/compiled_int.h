/* Private layout of grammar_compiled: the per-state token sets computed
 * lazily by compiled.c and read by the matcher's mask fill. */
#ifndef TERN_GRAMMAR_COMPILED_INT_H
#define TERN_GRAMMAR_COMPILED_INT_H

#include <pthread.h>

#include "grammar/grammar_int.h"
#include "grammar/vocab_int.h"

/* What a scannable automaton state s implies for every token, whatever is
 * below s on the stack ("context-independent"):
 * - accepted: the token's bytes are read entirely inside s's rule (or the
 *   rule ends exactly at the token's end);
 * - uncertain: the rule can end after the first k bytes of the token and
 *   the remaining suffix depends on the caller. Those (token, suffix) pairs
 *   sit in a small suffix trie checked at run time against the real stack;
 * - everything else is rejected. */
typedef struct gstate_entry {
    uint32_t *accepted;  /* [n_words] bitset, NULL if no token is accepted */
    int32_t n_accepted;
    int32_t n_unc;       /* (token, suffix) pairs */
    /* suffix trie in preorder, layout as in grammar_vocab */
    int32_t n_snodes;
    uint8_t *sb;
    int32_t *sd, *send, *stok_off, *stok;
} gstate_entry;

struct grammar_compiled {
    grammar *g;                /* owned */
    const grammar_vocab *v;    /* borrowed */
    pthread_mutex_t lock;      /* guards the precompute context and entries */
    gstate_entry **entries;    /* [n_states], filled lazily, published atomically */

    /* precompute context: stacks with unknown bottoms, interned sets of
     * them and a memo of set x byte -> set (a lazily built DFA) */
    gstk_pool pool;
    int32_t n_sets, cap_sets;
    int32_t *set_off;          /* [n_sets+1] into set_ids */
    int32_t *set_ids;
    size_t n_set_ids, cap_set_ids;
    int32_t *set_heads;        /* hash chains over sets */
    int32_t *set_next;
    uint32_t set_hmask;
    int32_t *trans;            /* [n_sets*256]: -1 unknown, else next*2 + popped */
    gstk_set tmp_in, tmp_out;
};

/* The entry of state s, computing it on first use. NULL on OOM. */
const gstate_entry *gcompiled_entry(grammar_compiled *cg, int32_t s);

#endif
