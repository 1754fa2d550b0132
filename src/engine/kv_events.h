/* KV cache events for prefix-aware routers (llm-d, the SGLang router,
 * vLLM's production stack, Dynamo): every block the prefix cache stores or
 * drops is published on a ZeroMQ PUB socket in vLLM's wire format, so a
 * router that reads vLLM's events routes to tern unchanged.
 *
 * Wire format (vLLM's ZmqEventPublisher): each step's events are one batch,
 * sent as three frames - the topic, an 8-byte big-endian sequence number
 * (0, 1, 2, ... per publisher) and the msgpack batch. Batch and events are
 * msgpack arrays (msgspec's array_like encoding, the default) or maps
 * (KV_EVENTS_MAP, the encoding of vLLM releases whose structs are maps):
 *   batch:  [ts, [event...], data_parallel_rank]
 *   stored: ["BlockStored", [hash...], parent_hash|nil, [token_id...], block_size, lora_id|nil, medium]
 *   removed: ["BlockRemoved", [hash...], medium]
 *   cleared: ["AllBlocksCleared"]
 * The hashes are the prefix cache's chain hashes (prefix_cache.h): a block's
 * hash covers its tokens and every block before it; parent_hash is the hash
 * of the block before the first one of the event (nil at the start of a
 * sequence). With a replay endpoint, a ROUTER socket answers a request frame
 * holding an 8-byte big-endian start sequence with every buffered batch
 * from there ([seq, payload] each) and then [-1, empty]. */
#ifndef TERN_ENGINE_KV_EVENTS_H
#define TERN_ENGINE_KV_EVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct kv_events kv_events;
/* One engine's events (a server with several models has several). */
typedef struct kv_events_src kv_events_src;

enum kv_events_format { KV_EVENTS_ARRAY = 0, KV_EVENTS_MAP };

typedef struct kv_events_opts {
    /* PUB endpoint: bound when it holds "*" or "::" or is ipc:// or
     * inproc:// (vLLM's rule), else connected. */
    const char *endpoint;
    const char *replay_endpoint; /* ROUTER, bound; NULL = no replay */
    enum kv_events_format format;
    int buffer_batches;          /* kept for replay (0 = 10,000) */
} kv_events_opts;

/* Opens the sockets and starts the publisher thread. NULL with err set (a
 * bad endpoint, an address in use). */
kv_events *kv_events_new(const kv_events_opts *o, tern_err *err);
/* Publishes what is queued, stops the thread, closes the sockets. Every
 * source must be freed first. */
void kv_events_free(kv_events *ev);

/* A source publishing under topic (NULL = ""), with block_size tokens per
 * block on medium ("GPU", "CPU"). NULL when out of memory. */
kv_events_src *kv_events_src_new(kv_events *ev, const char *topic, int block_size, const char *medium);
/* Flushes and frees (NULL is a no-op). */
void kv_events_src_free(kv_events_src *s);

/* Collecting the current step's events (one thread per source: its
 * engine's). n consecutive blocks of one sequence were stored: their
 * hashes, the hash of the block before them (has_parent 0: they start the
 * sequence) and their tokens (n * block_size). A NULL source ignores all. */
void kv_events_stored(kv_events_src *s, const uint64_t *hashes, int n, int has_parent, uint64_t parent,
                      const int32_t *tokens);
void kv_events_removed(kv_events_src *s, const uint64_t *hashes, int n);
void kv_events_cleared(kv_events_src *s);
/* Ends the step: its events (if any) go to the publisher as one batch. */
void kv_events_flush(kv_events_src *s);

#endif
