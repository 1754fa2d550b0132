/* Private layout of grammar_vocab (vocab.c), shared with the matcher. */
#ifndef TERN_GRAMMAR_VOCAB_INT_H
#define TERN_GRAMMAR_VOCAB_INT_H

#include <pthread.h>

#include "grammar/grammar.h"

struct gctx_entry;

/* A loop class: the bytes a parser set reads back to itself. ASCII bytes
 * asc (bit b of word b/64), plus every strict UTF-8 character whose lead
 * byte b has bit b - 0xC0 in lead (GVOC_LEAD_ALL: every character).
 * Its split of the trie (vocab_class.c), in preorder:
 * - runs: nodes [first, last] whose whole path from the root stays in
 *   the class (their tokens are read by looping, whatever the set);
 * - frontiers: node f whose byte is the path's first one outside the
 *   class; pend/n_pend are the bytes of the path's unfinished UTF-8
 *   character before f (a set must read them before f's byte).
 * A frontier's subtree belongs to it; runs and frontiers never overlap. */
typedef struct gvoc_item {
    int32_t first, last; /* a frontier has first == last == f */
    uint8_t frontier, n_pend, pend[3];
    uint8_t from_root;   /* frontier: the pending bytes start at the root */
    uint8_t nch;         /* frontier: complete characters before the pending bytes (capped at GVOC_W_MAX) */
} gvoc_item;

typedef struct gvoc_class {
    uint64_t asc[2];
    uint64_t lead;
    gvoc_item *items;
    int32_t n_items;
    uint32_t *run_bits;  /* [n_words] the tokens of all runs */
} gvoc_class;

/* Bounds of the vocabulary's class cache (past them walks go node by
 * node). */
#define GVOC_MAX_CLASSES 256
#define GVOC_MAX_CLASS_BYTES ((size_t)64 << 20)
/* A narrowed class is edited from a cached wider one when the edit's
 * work times this is below the pass's estimate (vocab_class.c). */
#define GVOC_EDIT_RATIO 10

/* The class (asc, lead) of v, computed on first use and kept until v is
 * freed (thread-safe). NULL when the cache is full or on OOM. A build
 * is counted in st's class_builds / class_nodes (st may be NULL; an edit
 * of a cached wider class counts the items and list nodes it reads). */
const gvoc_class *gvoc_class_get(struct grammar_vocab *v, const uint64_t asc[2], uint64_t lead,
                                 grammar_compiled_stats *st);
/* The class (asc, lead) when it is cached already, else NULL (never
 * builds one). */
const gvoc_class *gvoc_class_find(struct grammar_vocab *v, const uint64_t asc[2], uint64_t lead);
/* Whether the path from the root to node i stays in class c. */
int gvoc_class_path_in(const struct grammar_vocab *v, const gvoc_class *c, int32_t i);
/* The split of (asc, lead) by a pass over the trie (base NULL) or as an
 * edit of base (a class holding it; NULL otherwise), not cached (tests
 * compare the two); gvoc_class_free frees it. */
gvoc_class *gvoc_class_compute(const struct grammar_vocab *v, const gvoc_class *base, const uint64_t asc[2],
                               uint64_t lead);
void gvoc_class_free(gvoc_class *c);
/* The first-occurrence lists and the JSON string class, at vocabulary
 * creation. 0 or TERN_ENOMEM. */
int gvoc_classes_init(struct grammar_vocab *v);
void gvoc_classes_free(struct grammar_vocab *v);

/* One slot of the vocabulary-wide cache of token sets, keyed by a
 * structural signature (see grammar_state_sig). */
typedef struct gshare_slot {
    uint64_t key;
    struct gctx_entry *e;
} gshare_slot;

/* Longest token accepted (bytes); real vocabularies stay far below. */
#define GRAMMAR_VOCAB_MAX_TOKEN_LEN 4096

struct grammar_vocab {
    int32_t n_tokens;    /* tokenizer ids [0, n_tokens) */
    int32_t mask_width;  /* logits width >= n_tokens; the rest is padding */
    size_t n_words;      /* (mask_width + 31) / 32 */
    char *blob;          /* all token bytes */
    uint32_t *tok_off, *tok_len; /* [n_tokens] */
    uint8_t *special;    /* [n_tokens] never matches grammar text (stop ids too) */
    int32_t *stop;       /* [n_stop] distinct stop ids */
    int32_t n_stop;
    uint32_t *stop_mask; /* [n_words] */
    uint32_t max_len;
    /* Trie of non-special tokens in preorder (the root is implicit). Node
     * i reads byte nb[i] at depth nd[i] (1 = first byte); its subtree is
     * [i, nend[i]); tokens whose bytes end at i are
     * ntok[ntok_off[i] .. ntok_off[i+1]). */
    int32_t n_nodes;
    int32_t n_trie_tokens;
    uint8_t *nb;
    int32_t *nd, *nend, *ntok_off, *ntok;
    /* Subtree summaries for the walk's loop skip (compiled.c): per node,
     * the ASCII bytes read below it (bit b of word b/64) and GVOC_SK_*
     * flags. */
    uint64_t (*nsk_asc)[2];
    uint8_t *nsk_flags;
    /* Character weights for the counted walk (compiled_chain.c): per
     * node, the strict UTF-8 characters of its path, an unfinished one
     * counting as one (GVOC_W_NONE when the path is not UTF-8); nw_tok
     * the same per trie token position (ntok order). w_max is the largest
     * weight (-1: a path is longer than GVOC_W_MAX characters: no counted
     * walks). pos_asc[k] / pos_lead[k]: the ASCII bytes / UTF-8 lead
     * bytes (bit b - 0xC0) that begin a character at position k or later
     * of some path (k in [0, w_max]). */
    uint8_t *nw, *nw_tok;
    uint8_t *nw_max;     /* [n_nodes] largest weight in the node's subtree (itself included, GVOC_W_NONE ignored) */
    int32_t w_max;
    uint64_t (*pos_asc)[2];
    uint64_t *pos_lead;

    /* Token sets shared by every grammar compiled against this vocabulary
     * (identical rules in different schemas walk the trie once). Owned
     * here; bounded by GSHARE_MAX_* (then grammars keep their own). */
    pthread_mutex_t share_lock;
    gshare_slot *share;
    size_t share_cap, share_n, share_bytes;

    /* loop classes (vocab_class.c), guarded by class_lock; published
     * classes are immutable. first_nodes[first_off[b] .. first_off[b+1]):
     * the nodes reading byte b with no node above them reading b, in
     * preorder (a class without b is edited from a wider one there) */
    pthread_mutex_t class_lock;
    gvoc_class *classes[GVOC_MAX_CLASSES];
    int n_classes;
    size_t class_bytes;
    int32_t *first_off, *first_nodes;

    /* uniqueItems / string lengths (unique.c guq_vocab_build): the
     * candidate bitsets and per-token codepoint counts, one block built
     * with the vocabulary (not in a mask), immutable after */
    uint32_t *uq_cand;
};

/* The strict UTF-8 lead bytes 0xC2..0xF4 as bits b - 0xC0. */
#define GVOC_LEAD_ALL (((1ull << 53) - 1) & ~3ull)

#define GVOC_W_MAX 250
#define GVOC_W_NONE 255

/* The path from the root to the node is valid UTF-8 ending at a character
 * boundary; every path below the node continues it as valid UTF-8 (a
 * token may end inside a character); some byte below is not ASCII. */
#define GVOC_SK_BOUNDARY 1
#define GVOC_SK_DESC_VALID 2
#define GVOC_SK_DESC_NONASCII 4

/* Strict UTF-8 (RFC 3629: no overlongs, surrogates or code points above
 * U+10FFFF) as a byte automaton: state 0 is a character boundary, 1-7
 * expect continuation bytes; returns the next state or -1. */
static inline int gvoc_utf8_next(int u, uint8_t b)
{
    switch (u) {
    case 0:
        if (b < 0x80)
            return 0;
        if (b >= 0xC2 && b <= 0xDF)
            return 1;
        if (b == 0xE0)
            return 4;
        if (b == 0xED)
            return 5;
        if (b >= 0xE1 && b <= 0xEF)
            return 2;
        if (b == 0xF0)
            return 6;
        if (b >= 0xF1 && b <= 0xF3)
            return 3;
        if (b == 0xF4)
            return 7;
        return -1;
    case 1: return b >= 0x80 && b <= 0xBF ? 0 : -1;
    case 2: return b >= 0x80 && b <= 0xBF ? 1 : -1;
    case 3: return b >= 0x80 && b <= 0xBF ? 2 : -1;
    case 4: return b >= 0xA0 && b <= 0xBF ? 1 : -1;
    case 5: return b >= 0x80 && b <= 0x9F ? 1 : -1;
    case 6: return b >= 0x90 && b <= 0xBF ? 2 : -1;
    case 7: return b >= 0x80 && b <= 0x8F ? 2 : -1;
    default: return -1;
    }
}

#define GSHARE_MAX_ENTRIES 65536
#define GSHARE_MAX_BYTES ((size_t)512 << 20)

#endif
