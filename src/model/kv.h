/* Paged KV cache: one pool of fixed-size blocks shared by all sequences, and
 * per-sequence block tables (vLLM's PagedAttention layout). Sequences of any
 * length share the pool without copies; fork shares blocks by reference
 * count (copy-on-write when a shared block is written); truncate (the
 * rollback of speculative decoding) is a block-table edit.
 *
 * Storage types (kv_type, chosen per layer by a kv_spec): f32, bf16, f16,
 * q8/q4 (affine: per head and group along head_dim, an f16 scale and an
 * f16 minimum), r4/r3 (a fixed randomized Hadamard rotation of each head,
 * then symmetric 4/3-bit codes with an f16 scale per group; the rotation is
 * folded into q and the attention output, so q.k and p.v are exact in the
 * rotated basis). The attention reads the codes in place (kv_head_dot,
 * kv_head_axpy); no full-precision copy of the cache exists.
 *
 * "Sink" blocks: with kv_spec.quant_start > 0 the pool's first n_sink block
 * ids store 16 bits (bf16, or the layer's own type when that is a float
 * type) in the quantized layers; a sequence's blocks that hold positions
 * below quant_start are taken from them while any is free (else from the
 * rest, quantized). A block's format is a property of its id, so sharing,
 * copy-on-write and truncation need nothing more. */
#ifndef TERN_MODEL_KV_H
#define TERN_MODEL_KV_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* 16 positions per block: small enough that a partly filled last block
 * wastes little, large enough that block-table walks are cheap. */
#define KV_BLOCK_DEFAULT 16
/* The largest head a typed pool stores (scratch for a head lives on the stack). */
#define KV_HEAD_DIM_MAX 1024

typedef enum kv_type {
    KV_F32,
    KV_BF16,
    KV_F16,
    KV_Q8, /* affine 8-bit, groups of 32 along head_dim */
    KV_Q4, /* affine 4-bit, groups of 64 (32 when head_dim is not a multiple of 64) */
    KV_R4, /* rotated, symmetric 4-bit, groups of 32 */
    KV_R3, /* rotated, symmetric 3-bit, groups of 32 */
    KV_F8, /* FP8 E4M3 codes, an f16 scale per group of 32 (amax / 448) */
    KV_TYPE_COUNT
} kv_type;

const char *kv_type_name(kv_type t);
/* "f32", "bf16", ... -> *t. TERN_EINVAL (message lists the names). */
int kv_type_parse(const char *s, kv_type *t, tern_err *err);
/* Elements per scale group along a head of head_dim (float types: head_dim);
 * 0 when the type cannot store such a head (see kv_type_check). */
int kv_type_group(kv_type t, int head_dim);
/* Bytes of one head of head_dim elements (K or V of one position). */
size_t kv_head_bytes(kv_type t, int head_dim);
int kv_type_is_quant(kv_type t);
int kv_type_is_rotated(kv_type t);
/* TERN_EUNSUPPORTED when t cannot store heads of head_dim (groups need
 * head_dim a multiple of 32, or a head of at most 32 for the 8- and 4-bit
 * types, a multiple of 8 for r3). */
int kv_type_check(kv_type t, int head_dim, tern_err *err);

/* The per-layer choice. Rules apply in order, a later one overriding an
 * earlier one for the layers both name. */
#define KV_RULES_MAX 16
typedef struct kv_rule {
    int first, last;   /* layer range, inclusive */
    int from_end;      /* 1: first/last count back from the last layer (0 = last) */
    kv_type type;
} kv_rule;

typedef struct kv_spec {
    kv_type type;      /* every layer no rule names */
    int n_rules;
    kv_rule rules[KV_RULES_MAX];
    int quant_start;   /* positions [0, quant_start) of a sequence stay 16-bit in quantized layers */
} kv_spec;

/* All layers t, no rules, no quant start. */
void kv_spec_init(kv_spec *s, kv_type t);
/* Parses --kv-type-layers: a comma-separated list of LAYERS=TYPE, LAYERS
 * one of N, A-B (0-based, inclusive), firstN, lastN; e.g.
 * "first2=bf16,last2=bf16". Appends to s->rules. TERN_EINVAL naming the
 * bad item. */
int kv_spec_parse_layers(kv_spec *s, const char *text, tern_err *err);
/* The type of layer l of n_layer. */
kv_type kv_spec_layer_type(const kv_spec *s, int l, int n_layer);
/* The 16-bit type a quantized layer's sink blocks use (the layer's own
 * type when that is not quantized). */
kv_type kv_type_sink(kv_type t);
/* Every layer's type can store heads of head_dim (kv_type_check). */
int kv_spec_check(const kv_spec *s, int n_layer, int head_dim, tern_err *err);
/* Bytes of one block (K and V, every layer, block_size positions) under s:
 * a regular block (sink 0) or a sink block (sink 1). The one size rule for
 * the budget, the engine's statistics and anything that stores blocks. */
size_t kv_spec_block_bytes(const kv_spec *s, int n_layer, int n_kv_head, int head_dim, int block_size, int sink);
/* Writes "l0:bf16,l1:q8,...;qs=N" style text that identifies the storage
 * format (for fingerprints and logs); returns the length snprintf would. */
int kv_spec_describe(const kv_spec *s, int n_layer, char *buf, size_t cap);

typedef struct kv_layer {
    kv_type type, sink_type;
    size_t row, sink_row;  /* bytes per position (K or V of every head) in regular / sink blocks */
    uint8_t *k, *v;        /* [n_sink][block_size][sink_row] then [n_blocks - n_sink][block_size][row] */
} kv_layer;

typedef struct kv_pool {
    int n_layer;
    int kv_dim;      /* n_kv_head * head_dim */
    int head_dim, n_kv_head;
    int block_size;  /* positions per block */
    int n_blocks;
    int n_sink;      /* block ids [0, n_sink) are sink blocks */
    int quant_start;
    kv_layer *layers; /* [n_layer] */
    /* Every layer f32 (no sinks): the storage as plain floats,
     * [n_layer][n_blocks][block_size][kv_dim], else NULL. */
    float *k;
    float *v;
    uint8_t *mem_k, *mem_v; /* owned storage (NULL without host storage) */
    int32_t *ref;    /* [n_blocks] reference counts, 0 = free */
    int32_t *free;   /* [n_blocks] two stacks of free ids: sink ids in [0, n_free_sink),
                        the others in [n_blocks - n_free_reg, n_blocks) */
    int n_free;      /* n_free_sink + n_free_reg */
    int n_free_sink, n_free_reg;
    int is_view;     /* shares ref/free with another pool (kv_pool_view_init) */
    /* Device mirror (backend.h kv_bind): a backend whose forward keeps this
     * pool's K/V on a device installs dev_copy, which copies block src to
     * dst there (queued on its stream; 0 or an error code). Copy-on-write
     * calls it besides the host copy. k and v are NULL when the pool has no
     * host storage (the device holds the only copy). dev_release, when
     * set, is called first thing by kv_pool_free: the device frees the
     * pool's mirror (a backend serving several pools keeps each one's
     * until then). */
    int (*dev_copy)(void *ctx, const struct kv_pool *p, int32_t dst, int32_t src);
    void (*dev_release)(void *ctx, const struct kv_pool *p);
    void *dev_ctx;
} kv_pool;

typedef struct kv_seq {
    int32_t *blocks; /* [cap] block ids, owned */
    int n_blocks;    /* blocks in use */
    int cap;
    int n_tokens;    /* positions [0, n_tokens) hold valid KV */
} kv_seq;

/* Bytes of f32 KV per position for a model shape (both K and V, all layers). */
size_t kv_bytes_per_token(int n_layer, int kv_dim);

/* An f32 pool (kv_pool_init_spec with every layer f32). */
int kv_pool_init(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, tern_err *err);
/* kv_pool_init with host_storage = 0: block bookkeeping only, k and v NULL
 * (for a pool whose K/V live in a device mirror). */
int kv_pool_init_ex(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, int host_storage,
                    tern_err *err);
/* A pool under spec (NULL: f32) for heads of head_dim (kv_dim a multiple of
 * it), n_sink sink blocks (0 when spec has no quant_start or no quantized
 * layer). TERN_EINVAL / TERN_EUNSUPPORTED (kv_spec_check) / TERN_ENOMEM. */
int kv_pool_init_spec(kv_pool *p, const kv_spec *spec, int n_layer, int kv_dim, int head_dim, int block_size,
                      int n_blocks, int n_sink, int host_storage, tern_err *err);
/* A view of base for another model (a draft): base's block ids, reference
 * counts and free lists (borrowed: allocate through base only), its own
 * storage of n_layer layers under spec. Free with kv_pool_free. */
int kv_pool_view_init(kv_pool *view, const kv_pool *base, const kv_spec *spec, int n_layer, int kv_dim,
                      int head_dim, int host_storage, tern_err *err);
void kv_pool_free(kv_pool *p);
/* Bytes of host storage the pool holds (K and V, every layer and block). */
size_t kv_pool_bytes(const kv_pool *p);
/* Copies block src's K/V to block dst (re-encoding when their formats
 * differ): the host storage if any, and the device mirror through dev_copy
 * if set. 0 or the hook's error. */
int kv_block_copy(kv_pool *p, int32_t dst, int32_t src);
/* Bytes of block blk's K and V over every layer (its format's size). */
size_t kv_block_bytes(const kv_pool *p, int32_t blk);
/* Serializes block blk (host storage) to dst (kv_block_bytes bytes):
 * per layer, K rows then V rows, each as stored. kv_block_load writes such
 * bytes back into block blk, which must have the same format (same id
 * range) - else TERN_EINVAL. */
int kv_block_save(const kv_pool *p, int32_t blk, void *dst);
int kv_block_load(kv_pool *p, int32_t blk, const void *src, size_t len);
/* Drops one reference to blk (freeing it at zero). */
void kv_block_unref(kv_pool *p, int32_t blk);
/* Takes a free block of exactly one kind (sink 1: a sink block, 0: a
 * regular one) with one reference - for bytes kv_block_load will write
 * (a block's format is a property of its id). -1 when none is free. */
int32_t kv_block_alloc(kv_pool *p, int sink);

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

/* Where position pos of layer l lives (pos must be reserved): its bytes
 * (K or V of every head, as stored) and their type. */
static inline const uint8_t *kv_row_at(const kv_pool *p, const kv_seq *s, int l, int pos, int is_v, kv_type *t)
{
    const kv_layer *L = &p->layers[l];
    size_t blk = (size_t)s->blocks[pos / p->block_size], off = (size_t)(pos % p->block_size);
    const uint8_t *base = is_v ? L->v : L->k;
    if (blk < (size_t)p->n_sink) {
        *t = L->sink_type;
        return base + (blk * p->block_size + off) * L->sink_row;
    }
    *t = L->type;
    return base + (size_t)p->n_sink * p->block_size * L->sink_row +
           ((blk - (size_t)p->n_sink) * p->block_size + off) * L->row;
}

/* Stores the K and V rows (kv_dim floats each, not yet rotated) of position
 * pos of layer l in its block's format. rot: kv_dim floats of scratch. */
void kv_row_store(kv_pool *p, const kv_seq *s, int l, int pos, const float *k, const float *v, float *rot);

/* Address of position pos of layer l of an f32 pool (p->k set). */
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

/* ---- the codecs (kv_codec.c): one head of head_dim elements ---- */

/* Encodes x (already rotated for r types) into dst (kv_head_bytes). */
void kv_head_encode(kv_type t, int head_dim, const float *x, uint8_t *dst);
void kv_head_decode(kv_type t, int head_dim, const uint8_t *src, float *x);
/* q . decode(src), the dequantization fused in. */
float kv_head_dot(kv_type t, int head_dim, const float *q, const uint8_t *src);
/* out += a * decode(src). */
void kv_head_axpy(kv_type t, int head_dim, float a, const uint8_t *src, float *out);
/* The fixed rotation of the r types (orthogonal, its own inverse up to the
 * sign diagonal): kv_rotate maps a head into the stored basis, kv_unrotate
 * back. In place, head_dim elements. */
void kv_rotate(float *x, int head_dim);
void kv_unrotate(float *x, int head_dim);

#endif
