/* Sampling kernels of the CUDA backend (sample.cu), behind a plain C
 * launcher like cuda_kernels.h: device pointers, work queued on `stream`,
 * the launch's cudaError_t returned as an int (0 = ok). */
#ifndef TERN_TENSOR_CUDA_SAMPLE_H
#define TERN_TENSOR_CUDA_SAMPLE_H

#include <stdint.h>

#include "tensor/cuda/cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Greedy choice per row: ids[j] = the lowest id among the largest values of
 * logits[j][0 .. n_vocab), the same rule as the CPU's sample_argmax (a NaN
 * never wins). When masks and mask_on are set and mask_on[j] != 0, only
 * tokens t with bit (t & 31) of masks[j * n_words + (t >> 5)] set compete,
 * and the row gets -1 if none does or all of them are -inf (the CPU
 * sampler's "no token is allowed"). One block per row; n_rows may be 0. */
int tcu_argmax_rows(const float *logits, int n_rows, int n_vocab, const uint32_t *masks, int n_words,
                    const int32_t *mask_on, int32_t *ids, tcu_stream stream);

/* Per row of tcu_sample_rows: the host sampler's parameters (sample.h),
 * u = a uniform in [0, 1) drawn on the host from the row's own stream, the
 * row's logit_bias entries bias_ids/bias_vals[bias_off, + n_bias), and,
 * when pen is set, its penalties: the ids seen in its prompt and output
 * pen_ids[pen_off, + n_pen) (distinct), their output counts pen_counts[...]
 * (0 = prompt only), rep / pres / freq as sample_params'. */
typedef struct tcu_sample_param {
    double u;          /* unused at temperature 0 */
    float temperature; /* 0 = argmax */
    float top_p;       /* >= 1 = off */
    float min_p;       /* <= 0 = off */
    int32_t top_k;     /* <= 0 = off */
    int32_t bias_off, n_bias;
    float rep, pres, freq;
    int32_t pen_off, n_pen, pen; /* pen 0 = no penalties */
    int32_t sup_off, n_sup;     /* min_tokens: sup_ids[sup_off, + n_sup) become -inf first */
    int32_t lp, n_top, lp_slot; /* lp 1: logprobs with n_top alternatives into lp[lp_slot] */
} tcu_sample_param;

#define TCU_SAMPLE_MAX_VOCAB (1 << 19) /* fixed-point masses: n_vocab * 2^44 < 2^64 */
#define TCU_SAMPLE_MAX_TOP 20          /* the API's top_logprobs bound (sample.h SAMPLE_MAX_LOGPROBS) */

/* A row's logprobs (tcu_sample_param.lp): the drawn id's log-probability
 * and the n_top most likely ids, most likely first, ties by ascending id. */
typedef struct tcu_sample_lp {
    float logprob;
    int32_t n_top;
    int32_t top_id[TCU_SAMPLE_MAX_TOP];
    float top_lp[TCU_SAMPLE_MAX_TOP];
} tcu_sample_lp;

/* Sampling per row, the host's sample_row (src/sample/sample.c): first the
 * row's min_tokens ids sup_ids[...] become -inf (the engine's stop set,
 * applied before the processors as on the host), then its biases are added
 * to its logits (in place: the rows are modified), then its penalties in
 * sample.c's arithmetic (x / rep or x * rep by sign, then minus pres +
 * freq * count, each one rounding); masked tokens (masks/mask_on as in
 * tcu_argmax_rows) and -inf/NaN logits can never be drawn. Temperature 0:
 * the masked argmax of tcu_argmax_rows. Else weights e = expf((x - max) *
 * (1/T)) over the allowed tokens; the kept set is the first K tokens in the
 * order (weight descending, ties by ascending id - the host's sort),
 * K = min(top_k, the shortest prefix of the top-k set holding top_p of its
 * mass, the tokens with weight >= min_p * the largest); ties at a top-k or
 * top-p cut keep the lower ids, exactly K tokens, as the host does. ids[j]
 * = the first token of that order whose running mass exceeds u * the kept
 * mass (rows without top-k/top-p/min-p: id order over every token, as
 * sample_row). Masses are summed exactly in 64-bit fixed point (2^-44 of
 * the largest weight), so a row's id depends only on its logits, params, u
 * and mask - not on the other rows or the launch - and differs from the
 * host's float/double arithmetic only where u falls within ~1e-6 of a
 * boundary of the cumulative distribution (tokens below 2^-45 of the
 * largest weight have no mass here). -1 when nothing can be drawn (every
 * token masked or -inf: sample_row's error).
 *
 * Logprobs (param lp = 1; lp[lp_slot] written, lp may be NULL when no row
 * asks): sample_row's definition - sampled rows report the distribution
 * the draw used (weights over the kept set, renormalized: log e - log of
 * the kept mass, the mass in the fixed point above), the top n_top being
 * the first tokens of the kept order; greedy rows the log-softmax of the
 * processed logits at temperature 1 (x - max - log of the fixed-point sum
 * of expf(x - max) over the allowed tokens), the top n_top by logit. Ties
 * by ascending id; the order is the exact one (the host's float rounding
 * of log-probabilities can tie two nearly equal values and then order them
 * by id). Values within ~1e-6 of a double-precision reference. n_top is
 * clamped to [0, TCU_SAMPLE_MAX_TOP] and to the tokens that exist.
 * n_vocab <= TCU_SAMPLE_MAX_VOCAB. One block per row; n_rows may be 0. */
int tcu_sample_rows(float *logits, int n_rows, int n_vocab, const tcu_sample_param *params, const int32_t *bias_ids,
                    const float *bias_vals, const int32_t *pen_ids, const int32_t *pen_counts, const int32_t *sup_ids,
                    const uint32_t *masks, int n_words, const int32_t *mask_on, int32_t *ids, tcu_sample_lp *lp,
                    tcu_stream stream);

#ifdef __cplusplus
}
#endif

#endif
