/* Prefix cache: full KV blocks kept after their sequence ends, keyed by a
 * hash chain over token content (vLLM's automatic prefix caching). A new
 * request walks its prompt block by block and shares every block already
 * cached; blocks only the cache still holds are evicted least recently used
 * when the pool runs short. */
#ifndef TERN_ENGINE_PREFIX_CACHE_H
#define TERN_ENGINE_PREFIX_CACHE_H

#include <stdint.h>

#include "base/err.h"
#include "engine/kv_events.h"
#include "engine/kv_disk.h"
#include "model/kv.h"

typedef struct pcache_entry {
    uint64_t hash;     /* chain hash: H(parent hash, block tokens); 0 = empty slot */
    uint64_t parent;   /* the previous block's chain hash, 0 for the first */
    int32_t block;     /* pool block id (the cache holds one reference) */
    int32_t *tokens;   /* [block_size], to rule out hash collisions */
    uint64_t tick;     /* last use, for LRU */
} pcache_entry;

typedef struct pcache {
    kv_pool *pool;
    pcache_entry *slots; /* open addressing, cap a power of two */
    int cap, n;
    uint64_t tick;
    /* The root of the hash chains of the next pcache_match / pcache_insert:
     * 0 for the base model, a LoRA adapter's id (model_lora_id) for its
     * requests, so KV computed under one adapter is never matched by
     * another's (or the base's) prompt. */
    uint64_t salt;
    kv_events_src *events; /* borrowed, NULL = none: every block stored or evicted is published */
    kvdisk *disk;      /* the disk tier (borrowed; NULL = none) */
    /* Tier counters (engine thread): blocks shared from memory, blocks read
     * back from disk, seconds in memory lookups and insertions. */
    long long mem_hit_blocks, disk_hit_blocks;
    double mem_lookup_s, mem_insert_s;
} pcache;

int pcache_init(pcache *c, kv_pool *pool, tern_err *err);
/* Releases every block it holds; with a disk tier, first queues the most
 * recently used blocks not on disk yet (up to the disk budget) for writing,
 * so a restart finds them (kvdisk_close then waits for the writes). */
void pcache_free(pcache *c);
/* Attaches the disk tier d (borrowed, NULL = none): evicted blocks are
 * offered to it, and pcache_match continues a prefix from it. */
void pcache_disk_set(pcache *c, kvdisk *d);

/* Shares into seq (empty) the longest cached prefix of tokens, in whole
 * blocks; returns the number of positions reused. Past the blocks in
 * memory, blocks on disk are read into free pool blocks (evicting if
 * needed) and added to the cache (a BlockStored event each); *n_disk (may
 * be NULL) gets the positions of those. */
int pcache_match(pcache *c, kv_seq *seq, const int32_t *tokens, int n_tokens, int *n_disk);
/* Offers the full blocks of seq covering tokens[0, n_tokens) to the cache
 * (each run of newly stored blocks is one BlockStored event). */
void pcache_insert(pcache *c, const kv_seq *seq, const int32_t *tokens, int n_tokens);
/* Evicts LRU blocks held only by the cache until the pool has n_free free
 * blocks or nothing is evictable (offering each to the disk tier; one
 * BlockRemoved event for them). Returns the pool's free block count. */
int pcache_evict(pcache *c, int n_free);
/* Blocks that eviction could free now. */
int pcache_evictable(const pcache *c);

#endif
