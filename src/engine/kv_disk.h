/* The prefix cache's disk tier: full KV blocks evicted from memory are
 * written to a directory by a writer thread (the engine thread only copies
 * the block into a queue), keyed by the prefix cache's chain hash, under a
 * subdirectory named for a fingerprint of the model, the KV layout and the
 * file format. Blocks are read back (checked: header, tokens, parent hash,
 * xxhash of the whole file) instead of being prefilled again. The directory
 * outlives the process: at open its files are scanned into the index, in
 * least-recently-used order by modification time, and the budget enforced.
 * Everything here is best effort: a block that cannot be written is
 * dropped, a block that fails a check is deleted and counted, and a
 * directory that cannot be written turns the tier off with one warning. */
#ifndef TERN_ENGINE_KV_DISK_H
#define TERN_ENGINE_KV_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/kv.h"

typedef struct kvdisk kvdisk;

typedef struct kvdisk_opts {
    const char *dir;       /* created if missing; borrowed for kvdisk_open only */
    size_t budget_bytes;   /* total size of this fingerprint's block files */
    int zstd_level;        /* 0 = store blocks raw, 1..19 = zstd level */
    uint64_t fingerprint;  /* model + KV layout (kvdisk_fingerprint) */
    /* What one block holds: block_size positions of every pool in pools
     * (the target's KV and, with a draft model, the draft's; same block
     * ids), each with host storage. Borrowed until kvdisk_close. */
    kv_pool *pools[2];
    int n_pools;
    size_t queue_bytes;    /* raw bytes waiting for the writer at most; 0 = 64 MiB */
} kvdisk_opts;

typedef struct kvdisk_stats {
    int enabled;                 /* 0 once writes were turned off */
    long long n_blocks;          /* block files indexed */
    long long bytes_used;        /* their total size */
    long long budget_bytes;
    long long block_file_bytes;  /* size of an uncompressed block file */
    long long hits, hit_bytes;   /* blocks read back and checked, their file bytes */
    double read_s;               /* time in reads (open to scattered) */
    long long writes, write_bytes;
    double write_s;              /* writer thread time per written file */
    long long dropped;           /* evicted blocks not written (queue full, tier off) */
    long long corrupt;           /* files that failed a check (deleted, recomputed) */
    long long torn;              /* partial writes found at open (deleted) */
    long long evicted;           /* files deleted for the budget */
} kvdisk_stats;

/* A 64-bit fingerprint of what a block's bytes mean: model_id (a hash of
 * the model's files, kvdisk_model_id; 0 if unknown), the config fields that
 * shape the KV, the KV element type name ("f32") and the pools' shapes. */
uint64_t kvdisk_fingerprint(uint64_t model_id, const void *config_bytes, size_t config_len, const char *kv_type,
                            kv_pool *const *pools, int n_pools);

/* A hash of a model folder: config.json and, for every *.safetensors file,
 * its size, its first MiB (header and the first tensors) and last 64 KiB.
 * 0 with err set when the folder cannot be read. */
int kvdisk_model_id(const char *dir, uint64_t *id, tern_err *err);

/* Opens (creating) dir/<fingerprint>, checks it is writable, scans it and
 * starts the writer thread. NULL with err (the caller warns and runs without
 * the tier) when the directory cannot be created or written. */
kvdisk *kvdisk_open(const kvdisk_opts *o, tern_err *err);
/* Writes everything queued, stops the writer, frees d. NULL is a no-op. */
void kvdisk_close(kvdisk *d);

/* Whether the block of chain hash `hash` is on disk or queued. */
int kvdisk_has(kvdisk *d, uint64_t hash);
/* Queues block blk of the pools for writing, with its chain hash, its
 * parent's (0 for the first block) and its block_size tokens; copies
 * everything now. wait = 0: drops it (counted) if the queue is full; wait =
 * 1: waits for room (shutdown flush). 1 if queued, 0 if not (already on
 * disk or queued, dropped, tier off). */
int kvdisk_put(kvdisk *d, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t blk, int wait);
/* Reads the file of block `hash` and checks it against hash, parent and
 * tokens; *sink gets its format (1: a sink block's, 0: a regular one's).
 * 0 when it passed - then kvdisk_scatter writes it into a pool block of
 * that kind; TERN_ENOTFOUND when not on disk; TERN_EFORMAT when the file
 * failed a check (deleted, counted); TERN_EIO when it could not be read.
 * Engine thread only. */
int kvdisk_read(kvdisk *d, uint64_t hash, uint64_t parent, const int32_t *tokens, int *sink);
/* Writes the block kvdisk_read accepted into block blk (of the kind it
 * said) of every pool. 0, or TERN_EINVAL (no block read, another kind). */
int kvdisk_scatter(kvdisk *d, int32_t blk);

void kvdisk_stats_get(kvdisk *d, kvdisk_stats *st);

#endif
