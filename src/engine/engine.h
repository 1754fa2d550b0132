/* The generation engine: one thread runs every request through one step
 * loop (admit, plan prefill chunks and decode rows, one batched forward,
 * sample, emit, retire). Serial generation is a batch of one. Clients -
 * `tern run`, the HTTP server - submit requests and read events from each
 * request's thread-safe queue. */
#ifndef TERN_ENGINE_H
#define TERN_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "engine/kv_disk.h"
#include "model/embed.h"
#include "model/model.h"
#include "sample/sample.h"
#include "tokenizer/tokenizer.h"

typedef struct tern_engine tern_engine;
typedef struct engine_req engine_req;

#define ENGINE_MAX_DRAFT 16

typedef struct engine_opts {
    size_t kv_budget_bytes; /* KV pool size; 0 = a share of free memory */
    int max_batch;          /* rows in one step (running requests), default 64 */
    int prefill_chunk;      /* prompt tokens per row per step, default 512 */
    int max_queue;          /* waiting requests; beyond it submit fails EFULL; default 1024 */
    int ctx_size;           /* positions per sequence; 0 = the model's maximum */
    int prefix_cache;       /* reuse KV of earlier prompts (default on: 1) */
    /* Speculative decoding: a draft model sharing the tokenizer (borrowed;
     * NULL = none), or prompt lookup (spec_ngram = 1, no draft model). Each
     * speculating row drafts n_draft tokens that the target verifies in the
     * same batched forward as every other row. */
    tern_model *draft;
    int spec_ngram;
    int n_draft;            /* default 4 */
    int grammar_jump;       /* jump-forward over forced grammar text (opt-in) */
    /* KV cache events (kv_events.h; borrowed, NULL = none): the prefix
     * cache's stored and removed blocks, one batch per step, under
     * kv_events_topic (NULL = ""). */
    struct kv_events *kv_events;
    const char *kv_events_topic;
    /* KV storage (model/kv.h): types per layer and the 16-bit start. With
     * kv_type_given 0, kv.type is the backend's default
     * (model_kv_type_default); the draft model uses the same spec. */
    kv_spec kv;
    int kv_type_given;
    /* The prefix cache's disk tier (kv_disk.h): a directory (NULL = none)
     * that blocks evicted from memory are written to and read back from,
     * across restarts, within kv_disk_budget_bytes (0 = 10 GiB); zstd level
     * (0 = raw); kv_disk_model_id: kvdisk_model_id of the model folder,
     * mixed into the files' fingerprint (0 = the config alone identifies
     * the model). A directory that cannot be written is a warning and the
     * engine runs without the tier. CPU (host KV storage) only. */
    const char *kv_disk_dir;
    size_t kv_disk_budget_bytes;
    int kv_disk_zstd;
    uint64_t kv_disk_model_id;
    /* Threads computing a step's grammar masks together (masks.c): 0 = one
     * per physical core up to 8, 1 = inline on the step's thread. */
    int mask_threads;
} engine_opts;

void engine_opts_default(engine_opts *o);

/* A per-row constraint (grammar matcher) plugged into sampling. The engine
 * calls fill_mask before sampling each position of the row, accept with the
 * emitted token, and finishes the row with FINISH_STOP once is_terminated.
 * The engine owns ctx after a successful submit and calls free at the end. */
typedef struct engine_constraint_ops {
    /* Writes the allowed-token bitmask (n_words = ceil(n_vocab / 32)). */
    int (*fill_mask)(void *ctx, uint32_t *mask, int32_t n_words);
    /* Advances over an emitted token; nonzero if it was not allowed. */
    int (*accept)(void *ctx, int32_t token);
    int (*is_terminated)(void *ctx);
    /* Undoes the last n accepted tokens (speculative decoding). */
    int (*rollback)(void *ctx, int n);
    void (*free)(void *ctx);
    /* Optional (may be NULL): writes the unique continuation the grammar
     * forces from here (up to cap bytes) and returns its length, 0 if none.
     * Used for jump-forward when the engine enables it. */
    size_t (*jump_forward)(void *ctx, char *buf, size_t cap);
} engine_constraint_ops;

typedef struct engine_params {
    const int32_t *prompt;   /* [n_prompt], copied */
    size_t n_prompt;
    sample_params sample;    /* bias array copied */
    int max_tokens;          /* generated tokens at most; <= 0 = until the context is full */
    const char *const *stop; /* [n_stop] stop strings, copied; never emitted */
    int n_stop;
    int ignore_eos;
    /* Extra ids that end the row like EOS (their text is not emitted);
     * [n_stop_ids], copied. */
    const int32_t *stop_ids;
    int n_stop_ids;
    /* Until this many tokens are generated, EOS and stop_ids get -inf
     * logits and stop strings are not matched (vLLM's min_tokens). Such a
     * row samples on the host and does not speculate. */
    int min_tokens;
    int include_stop_str;    /* the matched stop string ends the text (vLLM) */
    int skip_special;        /* detokenize without special tokens (default 1) */
    /* Prompt length up to which the KV is worth keeping in the prefix cache
     * (chat: the end of the previous turn); 0 = the whole prompt. */
    size_t cache_boundary;
    const engine_constraint_ops *constraint; /* NULL = unconstrained */
    void *constraint_ctx;
    int no_speculation;      /* opt this request out of the engine's drafter */
    /* An embedding request when not EMBED_POOL_NONE: the prompt runs through
     * the forward in prefill chunks like any other, its final-normed hidden
     * states are pooled so (normalized when embed_normalize), nothing is
     * sampled, and its KV is dropped at the end (never matched against or
     * added to the prefix cache). The FINISH event (ENGINE_FINISH_STOP)
     * carries the vector. The prompt may fill the whole context. Sampling
     * fields, max_tokens and stops are ignored; constraint must be NULL. Needs
     * model_hidden_supported (else TERN_EUNSUPPORTED at submit). */
    embed_pooling embed_pooling;
    int embed_normalize;
    /* A LoRA adapter of the engine's model (model/lora.h) applied to this
     * request's rows; NULL = the base model. Borrowed: the engine takes its
     * own reference at submit and drops it when the request is freed. Such
     * a request speculates like any other (the draft proposes without the
     * adapter, the target verifies with it), and its KV is cached apart
     * from the base's and other adapters'. TERN_EUNSUPPORTED at submit when the
     * model's backend does not run adapters (model_lora_supported). */
    const struct model_lora *lora;
} engine_params;

void engine_params_default(engine_params *p);

typedef enum engine_finish {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP,      /* eos, stop string, or grammar complete */
    ENGINE_FINISH_LENGTH,    /* max_tokens or context length */
    ENGINE_FINISH_CANCELLED,
    ENGINE_FINISH_ERROR,
} engine_finish;

const char *engine_finish_name(engine_finish f); /* "stop", "length", ... */

typedef struct engine_usage {
    int n_prompt;       /* prompt tokens */
    int n_cached;       /* of which reused from the prefix cache */
    int n_generated;    /* tokens sampled */
    double ttft_s;      /* submit to first token */
    double decode_s;    /* first to last token */
    double queue_s;     /* submit to admission into the batch; -1 = never admitted */
    /* speculation telemetry (zero when the row did not speculate) */
    int n_drafted, n_accepted, n_target_forwards;
    int accepted_by_pos[ENGINE_MAX_DRAFT]; /* drafts accepted at burst position i */
    int n_jump;         /* tokens appended by grammar jump-forward */
} engine_usage;

typedef enum engine_event_kind { ENGINE_EV_TOKEN = 1, ENGINE_EV_FINISH } engine_event_kind;

typedef struct engine_event {
    engine_event_kind kind;
    /* TOKEN: the sampled token; text is the newly completed text (UTF-8,
     * may be empty while a possible stop string or partial character is held
     * back). FINISH: text holds any remaining releasable text. */
    int32_t token;
    char *text;          /* owned by the event; engine_event_clear frees */
    size_t text_len;
    int has_logprob;
    sample_result lp;
    engine_finish finish;         /* FINISH */
    char error[TERN_ERR_MSG_MAX]; /* FINISH with ENGINE_FINISH_ERROR */
    engine_usage usage;           /* FINISH */
    float *embedding;             /* FINISH of a completed embedding request: owned [n_embedding] */
    int n_embedding;
} engine_event;

void engine_event_clear(engine_event *ev);

/* Starts the engine thread. Borrows m and tok (they must outlive it). */
tern_engine *engine_new(tern_model *m, const tern_tokenizer *tok, const engine_opts *o, tern_err *err);
/* Cancels every request, stops the thread, frees the engine. */
void engine_free(tern_engine *e);

/* Queues a request. notify (may be NULL) is called from the engine thread
 * whenever events become available, with the request's lock held: it must
 * not block or call back into the request. It is never called after
 * engine_req_release returns.
 * Errors: TERN_EFULL (queue full), TERN_ERANGE (prompt + max_tokens can never
 * fit the context or the KV budget), TERN_EINVAL (bad parameters). */
engine_req *engine_submit(tern_engine *e, const engine_params *p, void (*notify)(void *user), void *user,
                          tern_err *err);
/* Takes the next event. timeout_ms < 0 waits forever, 0 polls. Returns 1
 * with *ev filled, 0 on timeout. After the FINISH event there are no more. */
int engine_req_next(engine_req *r, engine_event *ev, int timeout_ms);
/* Asks the engine to stop the request at its next step (a FINISH event with
 * ENGINE_FINISH_CANCELLED follows unless it already finished). */
void engine_req_cancel(engine_req *r);
/* The client is done with r (cancels it if still running). */
void engine_req_release(engine_req *r);

typedef struct engine_stats {
    int queue_len;
    int running;
    long long requests_total, requests_finished, requests_cancelled, requests_rejected;
    long long tokens_prefilled, tokens_decoded, prefix_hit_tokens;
    long long steps;
    long long spec_drafted, spec_accepted, spec_target_forwards, jump_tokens;
    int kv_blocks_total, kv_blocks_used, kv_blocks_cached;
    size_t kv_bytes_total;
    /* Prefix-cache tiers. Memory: prompt tokens whose KV was shared in
     * place, the bytes the cache holds, seconds in lookups and insertions.
     * Disk (kv_disk_on when configured and open): prompt tokens read back,
     * and the tier's own counters. prefix_hit_tokens is their sum. */
    long long kv_mem_hit_tokens, kv_disk_hit_tokens;
    size_t kv_mem_cached_bytes;
    double kv_mem_lookup_s, kv_mem_insert_s;
    int kv_disk_on;
    kvdisk_stats kv_disk;
    double last_ttft_s, last_decode_tps;
} engine_stats;

void engine_stats_get(tern_engine *e, engine_stats *st);
/* Adds b's prefix-cache tier counters to a - and, with gauges, its tier
 * gauges (bytes and blocks held, budget, disk on) - for sums over engines. */
void engine_stats_tiers_add(engine_stats *a, const engine_stats *b, int gauges);

#endif
