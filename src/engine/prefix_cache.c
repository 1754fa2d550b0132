/* Prefix cache (see prefix_cache.h). The table is small (one entry per
 * cached block) and only touched by the engine thread. */
#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

int pcache_init(pcache *c, kv_pool *pool, tern_err *err)
{
    memset(c, 0, sizeof *c);
    c->pool = pool;
    c->cap = 64;
    while (c->cap < pool->n_blocks * 2)
        c->cap *= 2;
    c->slots = calloc((size_t)c->cap, sizeof *c->slots);
    if (!c->slots)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    return 0;
}

void pcache_free(pcache *c)
{
    if (c->n)
        kv_events_cleared(c->events);
    for (int i = 0; c->slots && i < c->cap; i++)
        if (c->slots[i].hash) {
            kv_block_unref(c->pool, c->slots[i].block);
            free(c->slots[i].tokens);
        }
    free(c->slots);
    memset(c, 0, sizeof *c);
}

static uint64_t chain_hash(uint64_t parent, const int32_t *toks, int n)
{
    uint64_t h = XXH3_64bits_withSeed(toks, (size_t)n * sizeof *toks, parent);
    return h ? h : 1; /* 0 marks an empty slot */
}

static pcache_entry *lookup(pcache *c, uint64_t h, const int32_t *toks)
{
    int bs = c->pool->block_size;
    for (int i = (int)(h & (uint64_t)(c->cap - 1));; i = (i + 1) & (c->cap - 1)) {
        pcache_entry *e = &c->slots[i];
        if (!e->hash)
            return NULL;
        if (e->hash == h && e->tokens && !memcmp(e->tokens, toks, (size_t)bs * sizeof *toks))
            return e;
    }
}

int pcache_match(pcache *c, kv_seq *seq, const int32_t *tokens, int n_tokens)
{
    int bs = c->pool->block_size, n_full = n_tokens / bs;
    uint64_t h = c->salt;
    int matched = 0;
    for (int b = 0; b < n_full; b++) {
        h = chain_hash(h, tokens + (size_t)b * bs, bs);
        pcache_entry *e = lookup(c, h, tokens + (size_t)b * bs);
        if (!e)
            break;
        if (seq->cap <= b) {
            int cap = seq->cap ? seq->cap * 2 : 8;
            while (cap <= b)
                cap *= 2;
            int32_t *nb = realloc(seq->blocks, (size_t)cap * sizeof *nb);
            if (!nb)
                break;
            seq->blocks = nb;
            seq->cap = cap;
        }
        seq->blocks[b] = e->block;
        c->pool->ref[e->block]++;
        seq->n_blocks = b + 1;
        e->tick = ++c->tick;
        matched = (b + 1) * bs;
    }
    seq->n_tokens = matched;
    return matched;
}

/* Deletes slot i and re-places the run after it (linear probing). */
static void slot_delete(pcache *c, int i)
{
    c->slots[i].hash = 0;
    c->n--;
    for (int j = (i + 1) & (c->cap - 1); c->slots[j].hash; j = (j + 1) & (c->cap - 1)) {
        pcache_entry e = c->slots[j];
        c->slots[j].hash = 0;
        int k = (int)(e.hash & (uint64_t)(c->cap - 1));
        while (c->slots[k].hash)
            k = (k + 1) & (c->cap - 1);
        c->slots[k] = e;
    }
}

void pcache_insert(pcache *c, const kv_seq *seq, const int32_t *tokens, int n_tokens)
{
    int bs = c->pool->block_size, n_full = n_tokens / bs;
    if (n_full > seq->n_blocks)
        n_full = seq->n_blocks;
    uint64_t h = c->salt, run_parent = 0, run[64];
    int run_start = -1, n_run = 0;
    for (int b = 0; b < n_full; b++) {
        const int32_t *tk = tokens + (size_t)b * bs;
        uint64_t parent = h;
        h = chain_hash(h, tk, bs);
        pcache_entry *e = lookup(c, h, tk);
        if (e || n_run == (int)(sizeof run / sizeof run[0])) { /* a run of stored blocks ends */
            if (n_run)
                kv_events_stored(c->events, run, n_run, run_start > 0, run_parent, tokens + (size_t)run_start * bs);
            n_run = 0;
        }
        if (e) {
            e->tick = ++c->tick;
            continue;
        }
        if (c->n * 2 >= c->cap) /* keep the load factor under 1/2 */
            break;
        int32_t *copy = malloc((size_t)bs * sizeof *copy);
        if (!copy)
            break;
        if (n_run == 0) {
            run_start = b;
            run_parent = parent;
        }
        run[n_run++] = h;
        memcpy(copy, tk, (size_t)bs * sizeof *copy);
        int i = (int)(h & (uint64_t)(c->cap - 1));
        while (c->slots[i].hash)
            i = (i + 1) & (c->cap - 1);
        c->slots[i] = (pcache_entry){h, seq->blocks[b], copy, ++c->tick};
        c->pool->ref[seq->blocks[b]]++;
        c->n++;
    }
    if (n_run)
        kv_events_stored(c->events, run, n_run, run_start > 0, run_parent, tokens + (size_t)run_start * bs);
}

int pcache_evictable(const pcache *c)
{
    int n = 0;
    for (int i = 0; i < c->cap; i++)
        if (c->slots[i].hash && c->pool->ref[c->slots[i].block] == 1)
            n++;
    return n;
}

int pcache_evict(pcache *c, int n_free)
{
    kv_pool *p = c->pool;
    uint64_t gone[64];
    int n_gone = 0;
    while (p->n_free < n_free) {
        int best = -1;
        for (int i = 0; i < c->cap; i++)
            if (c->slots[i].hash && p->ref[c->slots[i].block] == 1 &&
                (best < 0 || c->slots[i].tick < c->slots[best].tick))
                best = i;
        if (best < 0)
            break;
        int32_t blk = c->slots[best].block;
        if (n_gone == (int)(sizeof gone / sizeof gone[0])) {
            kv_events_removed(c->events, gone, n_gone);
            n_gone = 0;
        }
        gone[n_gone++] = c->slots[best].hash;
        free(c->slots[best].tokens);
        slot_delete(c, best);
        kv_block_unref(p, blk);
    }
    kv_events_removed(c->events, gone, n_gone);
    return p->n_free;
}
