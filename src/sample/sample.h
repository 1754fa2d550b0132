/* Per-row logits processing and sampling: logit_bias, repetition / presence /
 * frequency penalties, an optional allowed-token mask (grammar), temperature,
 * top-k, top-p, min-p, seeded draws, and logprobs from the distribution that
 * was actually sampled. */
#ifndef TERN_SAMPLE_H
#define TERN_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/rng.h"

#define SAMPLE_MAX_LOGPROBS 20

typedef struct sample_bias {
    int32_t id;
    float bias; /* added to the logit; OpenAI's range is [-100, 100] */
} sample_bias;

typedef struct sample_params {
    float temperature;        /* 0 = greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* 1 = off */
    float min_p;              /* 0 = off */
    float repetition_penalty; /* 1 = off; over prompt and output (HF/vLLM) */
    float presence_penalty;   /* 0 = off; over output tokens (OpenAI) */
    float frequency_penalty;  /* 0 = off; over output tokens (OpenAI) */
    const sample_bias *bias;  /* [n_bias], borrowed for the request's life */
    int n_bias;
    uint64_t seed;
    int n_logprobs;           /* top alternatives to report, 0..SAMPLE_MAX_LOGPROBS; -1 = none at all */
} sample_params;

/* Defaults: temperature 1, everything else off, n_logprobs -1. */
void sample_params_default(sample_params *p);
/* Checks ranges; TERN_ERANGE naming the field. vocab bounds logit_bias ids. */
int sample_params_check(const sample_params *p, int32_t n_vocab, tern_err *err);
/* True when the row needs no processing beyond argmax. */
int sample_params_is_greedy_plain(const sample_params *p);

/* Per-row state: the random stream and token counts for penalties. */
typedef struct sample_state {
    tern_rng rng;
    int32_t n_vocab;
    uint32_t *out_count;   /* [n_vocab] times each id was generated (NULL if no penalties) */
    uint8_t *seen;         /* [n_vocab] id occurs in prompt or output (repetition penalty) */
    int32_t *seen_ids;     /* [n_seen] the ids with seen set, in the order first seen (a device sampler's list) */
    int32_t n_seen;
    /* scratch planned once per row */
    float *probs;          /* [n_vocab] */
    int32_t *idx;          /* [n_vocab] */
} sample_state;

int sample_state_init(sample_state *s, const sample_params *p, int32_t n_vocab, const int32_t *prompt,
                      size_t n_prompt, tern_err *err);
void sample_state_free(sample_state *s);
/* Records an emitted token (penalty counts). */
void sample_state_accept(sample_state *s, int32_t id);

typedef struct sample_logprob {
    int32_t id;
    float logprob;
} sample_logprob;

typedef struct sample_result {
    int32_t id;
    float logprob;  /* of id under the sampled distribution */
    int n_top;
    sample_logprob top[SAMPLE_MAX_LOGPROBS];
} sample_result;

/* Processes logits[n_vocab] in place and draws one token. mask: NULL or a
 * packed bitmask (bit i of word i/32 set = id allowed) of ceil(n_vocab/32)
 * words, applied after the processors; masked ids can never be drawn.
 * TERN_EINVAL if every id is masked or -inf (caller must not sample then). */
int sample_row(sample_state *s, const sample_params *p, float *logits, const uint32_t *mask, sample_result *out);

/* The distribution a draw would use, dense in probs[n_vocab] (zero outside
 * the kept set; one-hot at the argmax for greedy rows), after processing
 * logits in place like sample_row. For speculative verification, where the
 * target's probability of a drafted token decides its acceptance. */
int sample_dist(sample_state *s, const sample_params *p, float *logits, const uint32_t *mask, float *probs);
/* Draws from a dense, possibly unnormalized, non-negative weight vector
 * with the row's stream; -1 if all weights are zero. */
int32_t sample_draw(sample_state *s, const float *probs, int32_t n);
/* Uniform in [0, 1) from the row's stream. */
double sample_uniform(sample_state *s);
/* logprob of id and the n_top most likely ids of a dense distribution. */
void sample_logprobs_from(const float *probs, int32_t n, int32_t id, int n_top, sample_result *out);

/* One position of speculative sampling (Leviathan et al., Chen et al.):
 * the draft proposed d from q (NULL: with certainty, as prompt lookup does);
 * accept it with probability min(1, p(d)/q(d)), else draw from the
 * normalized max(0, p - q), overwriting p with that residual. The returned
 * token is distributed exactly as p. *accepted tells which happened. */
int32_t sample_spec_step(sample_state *s, float *p, const float *q, int32_t d, int32_t n, int *accepted);

/* Argmax with ties to the lowest id (the all-greedy fast path). */
int32_t sample_argmax(const float *logits, int32_t n);

#endif
