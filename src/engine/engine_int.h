/* Engine internals shared by engine.c (step loop) and request.c (the
 * client-facing request object and its event queue). */
#ifndef TERN_ENGINE_INT_H
#define TERN_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/prefix_cache.h"
#include "model/lora.h"
#include "model/model.h"

struct tern_engine {
    tern_model *m;
    const tern_tokenizer *tok;
    engine_opts o;
    int32_t n_vocab;
    kv_pool kv;
    pcache pc;
    kv_events_src *kv_ev;   /* the prefix cache's events (o.kv_events), NULL = none */
    kvdisk *disk;            /* the prefix cache's disk tier; NULL = none */
    size_t block_bytes;      /* bytes of one pool block (both models) */
    int kv_committed;        /* blocks promised to running rows, not yet taken */

    pthread_t th;
    pthread_mutex_t mu;      /* guards waiting[], stop, stats */
    pthread_cond_t cv;
    engine_req **waiting;    /* FIFO [max_queue] */
    int n_waiting;
    int stop;
    engine_stats st;

    engine_req **running;    /* [max_batch], engine thread only */
    int n_running;

    /* per-step scratch, sized once */
    int32_t *b_tok, *b_pos, *b_out;
    kv_seq **b_seq;
    const struct model_lora **b_lora; /* [cap_tok] each row's adapter (NULL = base) */
    engine_req **out_req;    /* request of each output row */
    float *logits;           /* [max_batch * (n_draft + 1)][n_vocab] */
    uint32_t *mask;          /* [ceil(n_vocab/32)] */
    /* sampling on the device (model_forward_start, then model_forward_argmax
     * for a step whose every output row is plain greedy, model_forward_sample
     * when every row is device-sampleable, else model_forward_logits); NULL
     * when the model's backend lacks it or TERN_GPU_SAMPLING=0 */
    uint32_t *masks;         /* [rows][ceil(n_vocab/32)] */
    uint8_t *mask_on, *mask_bad; /* [rows]: mask set / mask could not be computed */
    int32_t *ids;            /* [rows] chosen ids */
    /* the batch matcher (masks.c): masks/mask_on/mask_bad also serve the
     * host's steps with several constrained rows */
    int *mask_rows;          /* [rows] the constrained output rows of a step */
    struct tern_pool *mask_pool; /* NULL until needed (or one thread) */
    int mask_pool_failed;
    dev_sample_row *srows;   /* [rows] the device sampler's rows; NULL without sample_finish */
    sample_result *sres;     /* [rows] their logprobs (rows that ask), with srows */

    /* speculation (spec.c): the draft's KV lives in the same blocks as the
     * target's - one block table per sequence, one allocator, one budget -
     * in storage of its own shape, addressed through a view of the pool */
    int n_draft;             /* K; 0 = no speculation */
    kv_pool dkv;             /* view: draft layers, same block ids */
    float *d_logits;         /* [max_batch][n_vocab] */
    float *probs;            /* [n_vocab] verification scratch */
    uint32_t *d_masks;       /* [max_batch][ceil(n_vocab / 32)] grammar rows' masks of a draft step */
    uint8_t *d_mask_on;      /* [max_batch] which rows of a draft step have one */

    /* embedding rows: the hidden states a step asks for (NULL when the
     * model cannot return them) */
    int32_t *b_hid;          /* [cap_tok] batch rows */
    engine_req **hid_req;    /* [cap_tok] the request of each */
    float *hidden;           /* [cap_tok][dim] */
};

typedef struct ev_node {
    engine_event ev;
    struct ev_node *next;
} ev_node;

struct engine_req {
    tern_engine *e;
    /* immutable after submit */
    sample_params sp;
    sample_bias *bias;      /* owned copy of sp.bias */
    int max_tokens;
    char **stop;            /* [n_stop] owned copies */
    int n_stop;
    int ignore_eos, skip_special;
    int32_t *stop_ids;      /* [n_stop_ids] owned copies */
    int n_stop_ids;
    int min_tokens, include_stop_str;
    int32_t *min_ids;       /* [n_min_ids] what min_tokens masks: EOS (unless ignore_eos), then stop_ids; owned */
    int n_min_ids;
    int cache_boundary;
    struct model_lora *lora; /* the request's adapter (a reference held), NULL = base */
    const engine_constraint_ops *cops;
    void *cctx;
    void (*notify)(void *user);
    void *user;
    double t_submit;
    double t_admit;         /* when it left the queue for a batch row (0 = still queued) */

    /* engine thread only */
    int32_t *tokens;        /* [cap_tokens] prompt then generated */
    int n_tokens, cap_tokens, n_prompt;
    int n_past;             /* positions whose KV is computed */
    int n_cached;
    int n_generated;
    kv_seq seq;
    int blocks_committed;   /* KV blocks reserved at admission, not yet allocated */
    sample_state ss;
    tern_detok *detok;
    char *hold;             /* text held back (possible stop-string start) */
    size_t hold_len, hold_cap;
    double t_first, t_last;
    int started;
    /* speculation, engine thread only */
    int d_past;             /* positions whose draft KV is computed */
    int n_spec;             /* drafts proposed this step (0 = plain decode) */
    int32_t draft[ENGINE_MAX_DRAFT];
    float *q;               /* [n_draft][n_vocab] draft distributions (sampled rows) */
    int no_spec;
    int n_drafted, n_accepted, n_target_forwards, n_jump;
    int accepted_by_pos[ENGINE_MAX_DRAFT];
    int done;               /* finished; dropped from running[] at the end of the step */
    embed_pool pool;        /* embedding request: pool.mode set, its running pooling */
    int embed_normalize;

    /* shared with the client, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_node *head, *tail;
    int finished;           /* FINISH event queued */
    atomic_int cancel;
    atomic_int refs;        /* client + engine */
};

/* engine.c, for spec.c */
void engine_row_finish(tern_engine *e, engine_req *r, engine_finish why, const char *msg);
/* Records an emitted token (constraint, penalties, text, stops); the row may
 * finish inside. res may be NULL when no logprobs were computed. */
void engine_row_emit(tern_engine *e, engine_req *r, int32_t id, const sample_result *res);
int engine_reserve(tern_engine *e, engine_req *r, int n);

/* spec.c */
int spec_init(tern_engine *e, tern_err *err);
void spec_free(tern_engine *e);
/* Extra bytes of KV storage per block for the draft. */
size_t spec_block_bytes(const tern_engine *e, int sink);
/* Copies the draft's part of block src to dst (copy-on-write), on the host
 * and/or the draft backend's device mirror; 0 or an error code. */
int spec_block_copy(tern_engine *e, int32_t dst, int32_t src);
/* Chooses the rows that speculate this step and drafts their tokens. */
void spec_draft(tern_engine *e);
/* Grammar masks computed ahead for a row's output positions (while the
 * device ran the forward): position i's mask is masks + i * n_words when
 * on[i]; bad[i]: it could not be computed; neither: compute it then. */
typedef struct engine_premask {
    const uint32_t *masks;
    const uint8_t *on, *bad;
} engine_premask;
/* The row's mask for position i into *mask (NULL = unconstrained): the
 * precomputed one when pm has it, else the matcher's now. Nonzero (and the
 * row finished with an error) when it cannot be computed. */
int engine_row_mask(tern_engine *e, engine_req *r, const engine_premask *pm, int i, const uint32_t **mask);
/* Walks the target's logits over a row's K+1 verified positions (pm may be
 * NULL). */
void spec_verify(tern_engine *e, engine_req *r, float *logits, const engine_premask *pm);
/* The same walk for a greedy row from the target's chosen ids (masked
 * argmax on the device) of its K+1 positions; bad[i]: position i's grammar
 * mask could not be computed; res: NULL, or each position's logprobs (the
 * device sampler's, for a row that asks). */
void spec_verify_ids(tern_engine *e, engine_req *r, const int32_t *ids, const uint8_t *bad, const sample_result *res);

/* device.c: sampling on the device. How a step picks its tokens: the
 * host's sampler over the logits (downloaded from a device, or the CPU's),
 * the device's masked argmax, or the device's sampler (ids only in both). */
enum { ENGINE_DEV_HOST, ENGINE_DEV_ARGMAX, ENGINE_DEV_SAMPLE };
/* Allocates the device-sampling scratch for `rows` output rows when the
 * model's backend can sample (model_caps_get) and TERN_GPU_SAMPLING is not
 * 0; else leaves e->ids NULL (the host samples). 0 or TERN_ENOMEM. */
int engine_device_init(tern_engine *e, int rows, tern_err *err);
void engine_device_free(tern_engine *e);
/* The mode of a planned step of n_out output rows (out_req[]). */
int engine_device_mode(const tern_engine *e, int n_out);
/* One forward on the device (row i with adapter lora[i], lora NULL: all
 * base), the rows' grammar masks computed while it runs (masks, mask_on,
 * mask_bad). ENGINE_DEV_ARGMAX / _SAMPLE: the device
 * picks each output row's token and only ids come back (ids);
 * ENGINE_DEV_HOST: the logits come down into e->logits. */
int engine_device_forward(tern_engine *e, const fwd_batch *b, const struct model_lora *const *lora, int mode,
                          tern_err *err);
/* The batch matcher (masks.c). reserve: the mask buffers for max_batch
 * rows (0 or TERN_ENOMEM); count: output rows with a grammar; ahead: every
 * constrained output row's masks (each row's positions through its drafts)
 * into masks / mask_on / mask_bad, the rows spread over the mask threads;
 * free: the threads and the row list (engine_device_free frees the rest). */
int engine_masks_reserve(tern_engine *e);
int engine_masks_count(const tern_engine *e, int n_out);
void engine_masks_ahead(tern_engine *e, int n_out);
void engine_masks_free(tern_engine *e);
/* Emits the device's choice for output row j (a row without drafts). */
void engine_device_emit(tern_engine *e, engine_req *r, int j);

/* Queues an event (takes ownership of ev's text) and wakes the client. */
void req_push_event(engine_req *r, engine_event *ev);
/* Drops one reference; frees r when none is left. */
void req_unref(engine_req *r);

#endif
