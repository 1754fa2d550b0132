/* Paged KV pool (see kv.h). */
#include "kv.h"

#include <stdlib.h>
#include <string.h>

size_t kv_bytes_per_token(int n_layer, int kv_dim) { return (size_t)2 * n_layer * kv_dim * sizeof(float); }

int kv_pool_init(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, tern_err *err)
{
    return kv_pool_init_ex(p, n_layer, kv_dim, block_size, n_blocks, 1, err);
}

int kv_pool_init_ex(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, int host_storage,
                    tern_err *err)
{
    memset(p, 0, sizeof *p);
    if (n_layer <= 0 || kv_dim <= 0 || block_size <= 0 || n_blocks <= 0)
        return tern_err_set(err, TERN_EINVAL, "kv pool: bad shape");
    size_t per = (size_t)n_layer * (size_t)n_blocks * (size_t)block_size * (size_t)kv_dim;
    p->n_layer = n_layer;
    p->kv_dim = kv_dim;
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    if (host_storage) {
        p->k = malloc(per * sizeof(float));
        p->v = malloc(per * sizeof(float));
    }
    p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
    p->free = malloc((size_t)n_blocks * sizeof *p->free);
    if ((host_storage && (!p->k || !p->v)) || !p->ref || !p->free) {
        kv_pool_free(p);
        return tern_err_set(err, TERN_ENOMEM, "kv pool: cannot allocate %zu MB",
                            (per * 2 * sizeof(float)) >> 20);
    }
    /* Hand out low block ids first (pop from the end of the stack). */
    for (int i = 0; i < n_blocks; i++)
        p->free[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return 0;
}

void kv_pool_free(kv_pool *p)
{
    free(p->k);
    free(p->v);
    free(p->ref);
    free(p->free);
    memset(p, 0, sizeof *p);
}

static int32_t block_take(kv_pool *p)
{
    int32_t b = p->free[--p->n_free];
    p->ref[b] = 1;
    return b;
}

static void block_release(kv_pool *p, int32_t b)
{
    if (--p->ref[b] == 0)
        p->free[p->n_free++] = b;
}

int kv_block_copy(kv_pool *p, int32_t dst, int32_t src)
{
    size_t n = (size_t)p->block_size * p->kv_dim;
    for (int l = 0; p->k && p->v && l < p->n_layer; l++) {
        size_t od = ((size_t)l * p->n_blocks + (size_t)dst) * n, os = ((size_t)l * p->n_blocks + (size_t)src) * n;
        memcpy(p->k + od, p->k + os, n * sizeof(float));
        memcpy(p->v + od, p->v + os, n * sizeof(float));
    }
    return p->dev_copy ? p->dev_copy(p->dev_ctx, p, dst, src) : 0;
}

int kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int n_tokens)
{
    int want = (n_tokens + p->block_size - 1) / p->block_size;
    int need = want > s->n_blocks ? want - s->n_blocks : 0;
    /* Shared blocks that will be written need a private copy. */
    for (int b = s->n_tokens / p->block_size; b < s->n_blocks && b < want; b++)
        if (p->ref[s->blocks[b]] > 1)
            need++;
    return need;
}

int kv_seq_reserve(kv_pool *p, kv_seq *s, int n_tokens, tern_err *err)
{
    int want = (n_tokens + p->block_size - 1) / p->block_size;
    int need = kv_seq_blocks_needed(p, s, n_tokens);
    if (need > p->n_free)
        return tern_err_set(err, TERN_EFULL, "kv cache full: need %d blocks, %d free", need, p->n_free);
    if (want > s->cap) {
        int cap = s->cap ? s->cap : 8;
        while (cap < want)
            cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        s->blocks = nb;
        s->cap = cap;
    }
    int copy_rc = 0;
    for (int b = s->n_tokens / p->block_size; b < s->n_blocks && b < want; b++) {
        int32_t old = s->blocks[b];
        if (p->ref[old] > 1) {
            int32_t nb = block_take(p);
            int rc = kv_block_copy(p, nb, old);
            if (rc && !copy_rc)
                copy_rc = rc;
            block_release(p, old);
            s->blocks[b] = nb;
        }
    }
    while (s->n_blocks < want)
        s->blocks[s->n_blocks++] = block_take(p);
    if (copy_rc)
        return tern_err_set(err, TERN_EIO, "kv cache: device copy of a shared block failed (%d)", copy_rc);
    return 0;
}

void kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens)
{
    if (n_tokens < 0)
        n_tokens = 0;
    /* a pool that was never initialised (block_size 0) holds no blocks */
    int keep = p->block_size > 0 ? (n_tokens + p->block_size - 1) / p->block_size : 0;
    while (s->n_blocks > keep)
        block_release(p, s->blocks[--s->n_blocks]);
    if (s->n_tokens > n_tokens)
        s->n_tokens = n_tokens;
}

int kv_seq_fork(kv_pool *p, const kv_seq *src, kv_seq *dst, int n_tokens, tern_err *err)
{
    if (n_tokens > src->n_tokens)
        n_tokens = src->n_tokens;
    int nb = (n_tokens + p->block_size - 1) / p->block_size;
    memset(dst, 0, sizeof *dst);
    if (nb == 0)
        return 0;
    dst->blocks = malloc((size_t)nb * sizeof *dst->blocks);
    if (!dst->blocks)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    dst->cap = nb;
    for (int b = 0; b < nb; b++) {
        dst->blocks[b] = src->blocks[b];
        p->ref[src->blocks[b]]++;
    }
    dst->n_blocks = nb;
    dst->n_tokens = n_tokens;
    return 0;
}

void kv_seq_free(kv_pool *p, kv_seq *s)
{
    kv_seq_truncate(p, s, 0);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
