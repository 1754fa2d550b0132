/* Prefix cache (see prefix_cache.h). The table is small (one entry per
 * cached block) and only touched by the engine thread. */
#include "prefix_cache.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/log.h"

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

static int tick_desc(const void *a, const void *b)
{
    const pcache_entry *x = *(pcache_entry *const *)a, *y = *(pcache_entry *const *)b;
    return x->tick > y->tick ? -1 : x->tick < y->tick;
}

/* Queues the most recently used cached blocks for the disk tier, waiting
 * for queue room, until their bytes reach its budget. */
static void disk_flush(pcache *c)
{
    pcache_entry **v = malloc((size_t)(c->n > 0 ? c->n : 1) * sizeof *v);
    if (!v)
        return;
    int n = 0;
    for (int i = 0; i < c->cap; i++)
        if (c->slots[i].hash)
            v[n++] = &c->slots[i];
    qsort(v, (size_t)n, sizeof *v, tick_desc);
    kvdisk_stats st;
    kvdisk_stats_get(c->disk, &st);
    /* the newest that fit the budget, written oldest first so the disk's
     * LRU order follows the cache's */
    long long fit = st.block_file_bytes > 0 ? st.budget_bytes / st.block_file_bytes : 0;
    int k = fit < n ? (int)fit : n;
    for (int i = k - 1; i >= 0; i--)
        kvdisk_put(c->disk, v[i]->hash, v[i]->parent, v[i]->tokens, v[i]->block, 1);
    free(v);
}

void pcache_free(pcache *c)
{
    if (c->disk && c->slots)
        disk_flush(c);
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

void pcache_disk_set(pcache *c, kvdisk *d)
{
    c->disk = d;
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

/* Grows seq's block table to hold block b; 0 or TERN_ENOMEM. */
static int seq_grow(kv_seq *seq, int b)
{
    if (seq->cap > b)
        return 0;
    int cap = seq->cap ? seq->cap * 2 : 8;
    while (cap <= b)
        cap *= 2;
    int32_t *nb = realloc(seq->blocks, (size_t)cap * sizeof *nb);
    if (!nb)
        return TERN_ENOMEM;
    seq->blocks = nb;
    seq->cap = cap;
    return 0;
}

static int slot_add(pcache *c, uint64_t h, uint64_t parent, int32_t block, const int32_t *tk);

/* Reads block (h, parent, tk) from the disk tier into a free pool block
 * of the file's kind for seq's block b (evicting if none is free). 0 or an
 * error; the block then has seq's reference and, if the table has room,
 * the cache's. */
static int disk_load(pcache *c, kv_seq *seq, int b, uint64_t h, uint64_t parent, const int32_t *tk)
{
    kv_pool *p = c->pool;
    int sink = 0;
    int rc = kvdisk_read(c->disk, h, parent, tk, &sink);
    if (rc)
        return rc;
    int32_t blk = kv_block_alloc(p, sink);
    for (int tries = 0; blk < 0 && tries < 4; tries++) { /* evicting frees blocks of either kind */
        int before = p->n_free;
        if (pcache_evict(c, before + 1) == before)
            break;
        blk = kv_block_alloc(p, sink);
    }
    if (blk < 0)
        return TERN_EFULL;
    if ((rc = kvdisk_scatter(c->disk, blk))) {
        kv_block_unref(p, blk);
        return rc;
    }
    seq->blocks[b] = blk;
    if (slot_add(c, h, parent, blk, tk))
        kv_events_stored(c->events, &h, 1, b > 0, parent, tk);
    return 0;
}

int pcache_match(pcache *c, kv_seq *seq, const int32_t *tokens, int n_tokens, int *n_disk)
{
    int bs = c->pool->block_size, n_full = n_tokens / bs;
    uint64_t h = c->salt;
    int matched = 0, from_disk = 0;
    double t0 = tern_time_s();
    for (int b = 0; b < n_full; b++) {
        const int32_t *tk = tokens + (size_t)b * bs;
        uint64_t parent = h;
        h = chain_hash(h, tk, bs);
        pcache_entry *e = lookup(c, h, tk);
        if ((!e && !c->disk) || seq_grow(seq, b))
            break;
        if (e) {
            seq->blocks[b] = e->block;
            c->pool->ref[e->block]++;
            e->tick = ++c->tick;
            c->mem_hit_blocks++;
        } else {
            if (!from_disk)
                c->mem_lookup_s += tern_time_s() - t0;
            if (disk_load(c, seq, b, h, parent, tk))
                break;
            from_disk++;
            c->disk_hit_blocks++;
        }
        seq->n_blocks = b + 1;
        matched = (b + 1) * bs;
    }
    if (!from_disk)
        c->mem_lookup_s += tern_time_s() - t0;
    seq->n_tokens = matched;
    if (n_disk)
        *n_disk = from_disk * bs;
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

/* Adds block `block` under (h, parent, tk) with a cache reference; 1, or 0
 * (nothing done) when the table is at its load limit or out of memory. */
static int slot_add(pcache *c, uint64_t h, uint64_t parent, int32_t block, const int32_t *tk)
{
    int bs = c->pool->block_size;
    if (c->n * 2 >= c->cap) /* keep the load factor under 1/2 */
        return 0;
    int32_t *copy = malloc((size_t)bs * sizeof *copy);
    if (!copy)
        return 0;
    memcpy(copy, tk, (size_t)bs * sizeof *copy);
    int i = (int)(h & (uint64_t)(c->cap - 1));
    while (c->slots[i].hash)
        i = (i + 1) & (c->cap - 1);
    c->slots[i] = (pcache_entry){h, parent, block, copy, ++c->tick};
    c->pool->ref[block]++;
    c->n++;
    return 1;
}

void pcache_insert(pcache *c, const kv_seq *seq, const int32_t *tokens, int n_tokens)
{
    int bs = c->pool->block_size, n_full = n_tokens / bs;
    if (n_full > seq->n_blocks)
        n_full = seq->n_blocks;
    uint64_t h = c->salt, run_parent = 0, run[64];
    int run_start = -1, n_run = 0;
    double t0 = tern_time_s();
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
        if (!slot_add(c, h, parent, seq->blocks[b], tk))
            break;
        if (n_run == 0) {
            run_start = b;
            run_parent = parent;
        }
        run[n_run++] = h;
    }
    if (n_run)
        kv_events_stored(c->events, run, n_run, run_start > 0, run_parent, tokens + (size_t)run_start * bs);
    c->mem_insert_s += tern_time_s() - t0;
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
        if (c->disk) /* copied now, written by the tier's thread */
            kvdisk_put(c->disk, c->slots[best].hash, c->slots[best].parent, c->slots[best].tokens, blk, 0);
        free(c->slots[best].tokens);
        slot_delete(c, best);
        kv_block_unref(p, blk);
    }
    kv_events_removed(c->events, gone, n_gone);
    return p->n_free;
}
