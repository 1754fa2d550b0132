/* Private layout of grammar_vocab (vocab.c), shared with the matcher. */
#ifndef TERN_GRAMMAR_VOCAB_INT_H
#define TERN_GRAMMAR_VOCAB_INT_H

#include <pthread.h>

#include "grammar/grammar.h"

struct gctx_entry;

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

    /* Token sets shared by every grammar compiled against this vocabulary
     * (identical rules in different schemas walk the trie once). Owned
     * here; bounded by GSHARE_MAX_* (then grammars keep their own). */
    pthread_mutex_t share_lock;
    gshare_slot *share;
    size_t share_cap, share_n, share_bytes;
};

#define GSHARE_MAX_ENTRIES 65536
#define GSHARE_MAX_BYTES ((size_t)512 << 20)

#endif
