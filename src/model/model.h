/* A loaded model: an opaque handle (the body is in model_int.h, for
 * src/model only), its config, and the batched forward pass that every
 * caller (run, server, speculation) goes through - on whatever backend the
 * model was loaded on. Nothing outside src/model reaches into the model or
 * drives its backend: the forward, its device halves (start, then one
 * finish) and the device memory calls below, with embed.h's
 * model_forward_hidden (the same forward, handing back hidden states), are
 * the whole surface. */
#ifndef TERN_MODEL_H
#define TERN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/config.h"
#include "model/kv.h"

typedef struct tern_model tern_model;

/* Loads DIR (config.json, safetensors, generation_config.json). n_threads
 * <= 0 uses every core. NULL with err set on failure. */
tern_model *model_load(const char *dir, int n_threads, tern_err *err);
/* model_load with a choice of device: NULL or "cpu" (the default), "cuda"
 * or "cuda:N" (GPU N), "auto" (cuda when built with it and a GPU is
 * present, else cpu). A shape the chosen backend cannot run (its head_dim,
 * model_head_dim_check) is TERN_EUNSUPPORTED. */
typedef struct model_load_opts {
    int n_threads;
    const char *device;
} model_load_opts;
tern_model *model_load_ex(const char *dir, const model_load_opts *o, tern_err *err);
/* Frees m, its weights mapping and its backend; NULL is a no-op. */
void model_free(tern_model *m);

/* ---- what the model is ---- */

/* The model's config (borrowed, valid until model_free). */
const model_config *model_config_get(const tern_model *m);
/* Floats of K (and of V) per position and layer: n_kv_head * head_dim -
 * the kv_dim of a pool this model's forward writes (with the config's
 * n_layer). */
int model_kv_dim(const tern_model *m);
/* The KV type (kv.h) m's backend uses when none is asked for. */
kv_type model_kv_type_default(const tern_model *m);
/* Whether a pool under s works with m: every layer's type (and the 16-bit
 * type of its sink blocks) is one m's backend reads, and stores heads of
 * m's head_dim. TERN_EUNSUPPORTED naming the type and the backend. */
int model_kv_spec_check(const tern_model *m, const kv_spec *s, tern_err *err);
/* kv_pool_init_spec for m's shape (n_layer, kv_dim, head_dim). */
int model_kv_pool_init(const tern_model *m, kv_pool *p, const kv_spec *s, int block_size, int n_blocks, int n_sink,
                       int host_storage, tern_err *err);
/* Bytes of weights one decode step reads (for bandwidth floors): every
 * matrix but the embedding, with quantized scales and biases as the f32
 * pairs the kernels read; of a mixture of experts, the router and the
 * num_experts_per_tok experts one token runs (its active weights). */
size_t model_weight_bytes(const tern_model *m);
/* The same as the CPU backend's one-token products read them: the bf16
 * {scale, bias} pairs where the file stores bf16 scales (model_weight.sb16),
 * 4 bytes a group instead of 8 (bench_decode's floor). */
size_t model_weight_bytes_cpu(const tern_model *m);
/* Worker threads of the backend (1 for a device backend's host side). */
int model_n_threads(const tern_model *m);
/* The backend's name ("cpu", "cuda", ...; static). */
const char *model_backend_name(const tern_model *m);
/* GPUs visible to the CUDA backend (0 when built without it). */
int model_cuda_device_count(void);

/* ---- where a mixture's experts live (CPU) ---- */

/* --experts-in and --expert-cache, for the models loaded after the call
 * (process-wide, as tern_kernels_exact_set). MODEL_EXPERTS_MAPPED (the
 * default): expert weights are mapped like every other weight and the
 * kernel pages them as it likes. HOST: every expert is read into memory at
 * load. DISK: an expert stays on disk until a token picks it; the most
 * recently used experts, up to cache_bytes, are kept resident (locked with
 * mlock where RLIMIT_MEMLOCK allows, else only advised), and one evicted is
 * released (its pages may be dropped), so a model larger than memory runs.
 * A pick outside the cache is a miss: its pages are read in, timed. */
enum { MODEL_EXPERTS_MAPPED, MODEL_EXPERTS_HOST, MODEL_EXPERTS_DISK };
void model_experts_opts_set(int where, size_t cache_bytes);

typedef struct model_experts_stats {
    int where;              /* MODEL_EXPERTS_* of this model */
    size_t total_bytes;     /* every expert's weights */
    size_t cache_bytes;     /* the budget (DISK) */
    size_t resident_bytes;  /* experts held now */
    int locked;             /* 1: held experts are mlocked */
    uint64_t hits, misses;  /* picks of an expert (per forward, per layer) */
    double streamed_bytes;  /* read in on misses */
    double stream_seconds;  /* spent reading them */
} model_experts_stats;
/* m's expert residency and counters; TERN_ENOTFOUND when m has no experts. */
int model_experts_stats_get(const tern_model *m, model_experts_stats *st);

/* ---- the forward ---- */

/* One batch. Token i of the batch is tokens[i] at position pos[i] of
 * sequence seqs[i]; every sequence's KV must be reserved through its
 * largest position (kv_seq_reserve). Tokens of one sequence must come in
 * increasing position order, and positions below a token's must already be
 * cached or earlier in the batch. Logits are computed only for the batch rows
 * listed in out_rows. */
typedef struct fwd_batch {
    int n;
    const int32_t *tokens; /* [n] */
    const int32_t *pos;    /* [n] */
    kv_seq *const *seqs;   /* [n] */
    int n_out;
    const int32_t *out_rows; /* [n_out] indices into the batch */
} fwd_batch;

/* One batched forward into logits[n_out][n_vocab] (may be NULL when
 * n_out is 0). Checks the batch (ids in the vocabulary, positions
 * reserved, output rows in the batch: TERN_ERANGE / TERN_EINVAL) and
 * updates each sequence's n_tokens to its largest position + 1. */
int model_forward(tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits, tern_err *err);

/* ---- the forward in two halves, outputs kept on the device ----
 * On a backend that offers it (model_caps), model_forward_start checks and
 * queues a batch as model_forward would (and updates n_tokens the same
 * way) and returns without waiting, its n_out logits rows kept on the
 * device, so the host can work meanwhile (e.g. compute grammar masks).
 * Exactly one finish must follow:
 *  - model_forward_argmax: ids[j] = the lowest id among the largest logits
 *    of row j, over the tokens allowed by row j's mask when mask_on[j]
 *    (masks: [n_out][n_words] packed 32-bit words, bit t & 31 of word
 *    t >> 5 set = token t allowed; masks and mask_on may be NULL = no
 *    masks), -1 when a masked row allows nothing (or only -inf logits);
 *  - model_forward_sample: ids[j] = output row j's draw under rows[j]
 *    (masks as above): sample_row's processing, draw and logprobs, with
 *    the row's min_tokens stop set masked first; temperature 0 rows get
 *    argmax's choice after their bias and penalties; -1 when nothing can
 *    be drawn;
 *  - model_forward_logits: downloads the rows into logits[n_out][n_vocab].
 * Each waits for the device. A half the backend lacks is
 * TERN_EUNSUPPORTED. */
typedef struct model_caps {
    int device_kv;     /* the KV pool lives in device memory: model_mem_reserve, model_kv_bind */
    int device_argmax; /* model_forward_start, model_forward_argmax and model_forward_logits */
    int device_sample; /* model_forward_sample too */
} model_caps;
void model_caps_get(const tern_model *m, model_caps *caps);

struct sample_bias;
struct sample_result;

/* One output row of model_forward_sample: the row's sampling parameters
 * (as in sample_params: temperature 0 = argmax; top_k 0, top_p 1, min_p 0
 * = off), its logit_bias entries (borrowed for the call), and u, a uniform
 * in [0, 1) drawn on the host from the row's own stream (unused at
 * temperature 0). */
typedef struct dev_sample_row {
    float temperature, top_p, min_p;
    int32_t top_k;
    const struct sample_bias *bias;
    int32_t n_bias;
    double u;
    /* penalties (sample.c's order: after the biases, per listed id the
     * repetition penalty, then presence + frequency x count where count >
     * 0): pen_ids[n_pen] the ids seen in prompt or output, count[id] their
     * output counts ([n_vocab]); rep 1, pres and freq 0 = off */
    float rep, pres, freq;
    const int32_t *pen_ids;
    int32_t n_pen;
    const uint32_t *count;
    /* min_tokens: stop[n_stop] (the row's EOS and stop ids, borrowed) get
     * -inf before everything else, as the host's step masks them */
    const int32_t *stop;
    int32_t n_stop;
    /* logprobs: when lp is set, OUT: the drawn id and its log-probability
     * and the n_top (0..SAMPLE_MAX_LOGPROBS) most likely ids with theirs,
     * sample_row's definition (cuda_sample.h says how exactly) */
    struct sample_result *lp;
    int32_t n_top;
} dev_sample_row;

int model_forward_start(tern_model *m, kv_pool *kv, const fwd_batch *b, tern_err *err);
int model_forward_argmax(tern_model *m, const uint32_t *masks, int32_t n_words, const uint8_t *mask_on, int32_t *ids,
                         tern_err *err);
int model_forward_sample(tern_model *m, const dev_sample_row *rows, const uint32_t *masks, int32_t n_words,
                         const uint8_t *mask_on, int32_t *ids, tern_err *err);
int model_forward_logits(tern_model *m, float *logits, tern_err *err);

/* ---- device memory (caps.device_kv) ---- */

/* Allocates the forward's device scratch for batches of up to max_t tokens
 * with up to max_out logits rows (later batches within those bounds
 * allocate nothing more), then reports the device memory still free, and
 * its total. */
int model_mem_reserve(tern_model *m, int max_t, int max_out, size_t *free_bytes, size_t *total_bytes,
                      tern_err *err);
/* Allocates kv's device mirror now (TERN_ENOMEM with the sizes when it does
 * not fit) and installs kv's dev_copy hook, so copy-on-write reaches the
 * device. The pool's host storage is then unused (it may have none). The
 * pool must not be used after the model is freed. */
int model_kv_bind(tern_model *m, kv_pool *kv, tern_err *err);

#endif
