/* Paged KV cache: one pool of fixed-size blocks shared by all sequences, and
 * per-sequence block tables (vLLM's PagedAttention layout). Sequences of any
 * length share the pool without copies; fork shares blocks by reference
 * count (copy-on-write when a shared block is written); truncate (the
 * rollback of speculative decoding) is a block-table edit. */
#ifndef TERN_MODEL_KV_H
#define TERN_MODEL_KV_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* 16 positions per block: small enough that a partly filled last block
 * wastes little, large enough that block-table walks are cheap. */
#define KV_BLOCK_DEFAULT 16

typedef struct kv_pool {
    int n_layer;
    int kv_dim;      /* n_kv_head * head_dim */
    int block_size;  /* positions per block */
    int n_blocks;
    float *k;        /* [n_layer][n_blocks][block_size][kv_dim] */
    float *v;        /* same layout */
    int32_t *ref;    /* [n_blocks] reference counts, 0 = free */
    int32_t *free;   /* [n_blocks] stack of free block ids */
    int n_free;
    /* Device mirror (backend.h kv_bind): a backend whose forward keeps this
     * pool's K/V on a device installs dev_copy, which copies block src to
     * dst there (queued on its stream; 0 or an error code). Copy-on-write
     * calls it besides the host copy. k and v are NULL when the pool has no
     * host storage (the device holds the only copy). */
    int (*dev_copy)(void *ctx, const struct kv_pool *p, int32_t dst, int32_t src);
    void *dev_ctx;
} kv_pool;

typedef struct kv_seq {
    int32_t *blocks; /* [cap] block ids, owned */
    int n_blocks;    /* blocks in use */
    int cap;
    int n_tokens;    /* positions [0, n_tokens) hold valid KV */
} kv_seq;

/* Bytes of KV per position for a model shape (both K and V, all layers). */
size_t kv_bytes_per_token(int n_layer, int kv_dim);

int kv_pool_init(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, tern_err *err);
/* kv_pool_init with host_storage = 0: block bookkeeping only, k and v NULL
 * (for a pool whose K/V live in a device mirror). */
int kv_pool_init_ex(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, int host_storage,
                    tern_err *err);
void kv_pool_free(kv_pool *p);
/* Copies block src's K/V to block dst: the host storage if any, and the
 * device mirror through dev_copy if set. 0 or the hook's error. */
int kv_block_copy(kv_pool *p, int32_t dst, int32_t src);

/* Makes positions [0, n_tokens) writable for s: allocates missing blocks and
 * privately copies any shared block that a position >= s->n_tokens falls in
 * (kv_block_copy). Does not change s->n_tokens (the forward pass sets it).
 * TERN_EFULL when the pool has too few free blocks; then s is unchanged.
 * TERN_EIO when the device copy fails (the table is updated regardless). */
int kv_seq_reserve(kv_pool *p, kv_seq *s, int n_tokens, tern_err *err);
/* Blocks a reserve to n_tokens would newly take (for admission control). */
int kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int n_tokens);
/* Drops positions >= n_tokens and releases blocks no longer needed. */
void kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens);
/* dst (empty) shares src's first n_tokens positions. */
int kv_seq_fork(kv_pool *p, const kv_seq *src, kv_seq *dst, int n_tokens, tern_err *err);
/* Releases all blocks and the table. A zeroed seq on a zeroed pool is a no-op
 * (cleanup paths run it before the pool was ever initialised). */
void kv_seq_free(kv_pool *p, kv_seq *s);

/* Address of position pos of layer l (pos must be reserved). */
static inline float *kv_k_at(const kv_pool *p, const kv_seq *s, int l, int pos)
{
    size_t blk = (size_t)s->blocks[pos / p->block_size];
    return p->k + (((size_t)l * p->n_blocks + blk) * p->block_size + (size_t)(pos % p->block_size)) * p->kv_dim;
}
static inline float *kv_v_at(const kv_pool *p, const kv_seq *s, int l, int pos)
{
    size_t blk = (size_t)s->blocks[pos / p->block_size];
    return p->v + (((size_t)l * p->n_blocks + blk) * p->block_size + (size_t)(pos % p->block_size)) * p->kv_dim;
}

#endif
