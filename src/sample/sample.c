/* Logits processors and the sampler (see sample.h). Order per row, as in
 * vLLM: logit_bias, penalties, the allowed-token mask, then temperature and
 * the truncations (top-k, top-p, min-p), then a seeded draw. Logprobs come
 * from the final distribution the token was drawn from; for greedy rows
 * (temperature 0) from the processed logits at temperature 1. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void sample_params_default(sample_params *p)
{
    memset(p, 0, sizeof *p);
    p->temperature = 1.0f;
    p->top_p = 1.0f;
    p->repetition_penalty = 1.0f;
    p->n_logprobs = -1;
}

int sample_params_check(const sample_params *p, int32_t n_vocab, tern_err *err)
{
    if (!(p->temperature >= 0.0f && p->temperature <= 100.0f))
        return tern_err_set(err, TERN_ERANGE, "temperature must be in [0, 100]");
    if (p->top_k < 0)
        return tern_err_set(err, TERN_ERANGE, "top_k must be >= 0");
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return tern_err_set(err, TERN_ERANGE, "top_p must be in (0, 1]");
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return tern_err_set(err, TERN_ERANGE, "min_p must be in [0, 1]");
    if (!(p->repetition_penalty > 0.0f && p->repetition_penalty <= 10.0f))
        return tern_err_set(err, TERN_ERANGE, "repetition_penalty must be in (0, 10]");
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return tern_err_set(err, TERN_ERANGE, "presence_penalty must be in [-2, 2]");
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return tern_err_set(err, TERN_ERANGE, "frequency_penalty must be in [-2, 2]");
    if (p->n_logprobs < -1 || p->n_logprobs > SAMPLE_MAX_LOGPROBS)
        return tern_err_set(err, TERN_ERANGE, "top_logprobs must be in [0, %d]", SAMPLE_MAX_LOGPROBS);
    for (int i = 0; i < p->n_bias; i++) {
        if (p->bias[i].id < 0 || p->bias[i].id >= n_vocab)
            return tern_err_set(err, TERN_ERANGE, "logit_bias: token id %d is outside the vocabulary",
                                p->bias[i].id);
        if (!(p->bias[i].bias >= -100.0f && p->bias[i].bias <= 100.0f))
            return tern_err_set(err, TERN_ERANGE, "logit_bias values must be in [-100, 100]");
    }
    return 0;
}

static int has_penalties(const sample_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

int sample_params_is_greedy_plain(const sample_params *p)
{
    return p->temperature == 0.0f && !has_penalties(p) && p->n_bias == 0 && p->n_logprobs < 0;
}

int sample_state_init(sample_state *s, const sample_params *p, int32_t n_vocab, const int32_t *prompt,
                      size_t n_prompt, tern_err *err)
{
    memset(s, 0, sizeof *s);
    s->n_vocab = n_vocab;
    tern_rng_seed(&s->rng, p->seed, 0x7465726eULL /* "tern" */);
    s->probs = malloc((size_t)n_vocab * sizeof *s->probs);
    s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
    if (!s->probs || !s->idx)
        goto nomem;
    if (has_penalties(p)) {
        s->out_count = calloc((size_t)n_vocab, sizeof *s->out_count);
        s->seen = calloc((size_t)n_vocab, 1);
        s->seen_ids = malloc((size_t)n_vocab * sizeof *s->seen_ids);
        if (!s->out_count || !s->seen || !s->seen_ids)
            goto nomem;
        for (size_t i = 0; i < n_prompt; i++)
            if (prompt[i] >= 0 && prompt[i] < n_vocab && !s->seen[prompt[i]]) {
                s->seen[prompt[i]] = 1;
                s->seen_ids[s->n_seen++] = prompt[i];
            }
    }
    return 0;
nomem:
    sample_state_free(s);
    return tern_err_set(err, TERN_ENOMEM, "out of memory");
}

void sample_state_free(sample_state *s)
{
    free(s->out_count);
    free(s->seen);
    free(s->seen_ids);
    free(s->probs);
    free(s->idx);
    memset(s, 0, sizeof *s);
}

void sample_state_accept(sample_state *s, int32_t id)
{
    if (!s->out_count || id < 0 || id >= s->n_vocab)
        return;
    s->out_count[id]++;
    if (!s->seen[id]) {
        s->seen[id] = 1;
        s->seen_ids[s->n_seen++] = id;
    }
}

int32_t sample_argmax(const float *logits, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best])
            best = i;
    return best;
}

static void apply_processors(sample_state *s, const sample_params *p, float *x, const uint32_t *mask)
{
    int32_t V = s->n_vocab;
    for (int i = 0; i < p->n_bias; i++)
        x[p->bias[i].id] += p->bias[i].bias;
    if (s->out_count) {
        for (int32_t i = 0; i < V; i++) {
            if (s->seen[i] && p->repetition_penalty != 1.0f)
                x[i] = x[i] > 0 ? x[i] / p->repetition_penalty : x[i] * p->repetition_penalty;
            if (s->out_count[i])
                x[i] -= p->presence_penalty + p->frequency_penalty * (float)s->out_count[i];
        }
    }
    if (mask)
        for (int32_t i = 0; i < V; i++)
            if (!(mask[i >> 5] >> (i & 31) & 1))
                x[i] = -INFINITY;
}

/* Applies the processors and finds the largest logit; TERN_EINVAL when
 * nothing can be drawn (every id masked or -inf). */
static int process(sample_state *s, const sample_params *p, float *x, const uint32_t *mask, float *mx_out)
{
    apply_processors(s, p, x, mask);
    float mx = -INFINITY;
    for (int32_t i = 0; i < s->n_vocab; i++)
        if (x[i] > mx)
            mx = x[i];
    *mx_out = mx;
    return mx == -INFINITY || isnan(mx) ? TERN_EINVAL : 0;
}

/* Descending by probability, ties by id, for qsort over candidate ids. */
static const float *g_sort_p;
static int cmp_desc(const void *a, const void *b)
{
    float pa = g_sort_p[*(const int32_t *)a], pb = g_sort_p[*(const int32_t *)b];
    if (pa != pb)
        return pa > pb ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* Fills out->top with the n largest values of v, skipping values <= floor
 * (-inf for log-probabilities, 0 for probabilities). */
static void top_n(const float *lp, int32_t V, int n, float floor, sample_result *out)
{
    out->n_top = 0;
    for (int32_t i = 0; i < V && n > 0; i++) {
        if (lp[i] <= floor)
            continue;
        int j = out->n_top < n ? out->n_top++ : n;
        if (j == n && !(lp[i] > out->top[n - 1].logprob))
            continue;
        if (j == n)
            j = n - 1;
        while (j > 0 && lp[i] > out->top[j - 1].logprob) {
            out->top[j] = out->top[j - 1];
            j--;
        }
        out->top[j].id = i;
        out->top[j].logprob = lp[i];
    }
}

/* Temperature softmax and truncations over processed logits x (max mx):
 * leaves probabilities in s->probs and, when truncating, the kept ids in
 * s->idx[0, *n_kept) most likely first (renormalized; other entries of
 * s->probs are then stale). */
static void dist_core(sample_state *s, const sample_params *p, const float *x, float mx, int32_t *n_kept,
                      int *truncating_out)
{
    int32_t V = s->n_vocab;
    /* softmax at temperature */
    float invt = 1.0f / p->temperature;
    double sum = 0;
    for (int32_t i = 0; i < V; i++) {
        float e = x[i] == -INFINITY ? 0.0f : expf((x[i] - mx) * invt);
        s->probs[i] = e;
        sum += e;
    }
    float inv = (float)(1.0 / sum);
    for (int32_t i = 0; i < V; i++)
        s->probs[i] *= inv;

    /* Candidates: ids with nonzero mass, sorted only as far as needed. */
    int32_t n = 0;
    int truncating = p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0.0f;
    if (truncating) {
        float pmax = 0;
        for (int32_t i = 0; i < V; i++)
            if (s->probs[i] > pmax)
                pmax = s->probs[i];
        /* Shrink the sort to ids above a threshold when that set already
         * holds the nucleus (its mass >= top_p and >= top_k members, or
         * min-p cuts below it); otherwise lower the threshold. */
        for (float thr = pmax * 1e-3f;; thr *= 1e-3f) {
            double mass = 0;
            n = 0;
            for (int32_t i = 0; i < V; i++)
                if (s->probs[i] > 0 && s->probs[i] >= thr) {
                    s->idx[n++] = i;
                    mass += s->probs[i];
                }
            /* top-p under top-k renormalizes over the true top-k set, so
             * then only holding all k candidates is enough */
            int enough = (p->top_p < 1.0f && p->top_k == 0 && mass >= p->top_p) ||
                         (p->top_k > 0 && n >= p->top_k) ||
                         (p->min_p > 0.0f && thr <= p->min_p * pmax);
            if (enough || thr < 1e-30f || n == V)
                break;
        }
        g_sort_p = s->probs; /* engine thread only */
        qsort(s->idx, (size_t)n, sizeof *s->idx, cmp_desc);
        int32_t keep = n;
        if (p->top_k > 0 && p->top_k < keep)
            keep = p->top_k;
        if (p->top_p < 1.0f) { /* over the top-k set renormalized, as HF and vLLM do */
            double mk = 0, c = 0;
            if (p->top_k > 0 && p->top_k < n)
                for (int32_t j = 0; j < keep; j++)
                    mk += s->probs[s->idx[j]];
            else /* the top-k set is every token, not only the candidates sorted here */
                for (int32_t i = 0; i < V; i++)
                    mk += s->probs[i];
            for (int32_t j = 0; j < keep; j++) {
                c += s->probs[s->idx[j]];
                if (c >= p->top_p * mk) {
                    keep = j + 1;
                    break;
                }
            }
        }
        if (p->min_p > 0.0f) {
            float cut = p->min_p * s->probs[s->idx[0]];
            int32_t j = 1;
            while (j < keep && s->probs[s->idx[j]] >= cut)
                j++;
            keep = j;
        }
        /* renormalize over the kept set and zero the rest */
        double ks = 0;
        for (int32_t j = 0; j < keep; j++)
            ks += s->probs[s->idx[j]];
        float kinv = (float)(1.0 / ks);
        for (int32_t j = 0; j < keep; j++)
            s->probs[s->idx[j]] *= kinv;
        n = keep; /* idx[0, n) is the kept set, most likely first */
    }

    *n_kept = n;
    *truncating_out = truncating;
}

int sample_row(sample_state *s, const sample_params *p, float *x, const uint32_t *mask, sample_result *out)
{
    int32_t V = s->n_vocab;
    float mx;
    if (process(s, p, x, mask, &mx))
        return TERN_EINVAL;
    out->n_top = 0;
    int want_lp = p->n_logprobs >= 0;

    if (p->temperature == 0.0f) {
        out->id = sample_argmax(x, V);
        if (want_lp) { /* log-softmax at temperature 1 */
            double sum = 0;
            for (int32_t i = 0; i < V; i++)
                sum += exp((double)(x[i] - mx));
            float lse = mx + (float)log(sum);
            for (int32_t i = 0; i < V; i++)
                s->probs[i] = x[i] - lse;
            out->logprob = s->probs[out->id];
            top_n(s->probs, V, p->n_logprobs, -INFINITY, out);
        }
        return 0;
    }

    int32_t n;
    int truncating;
    dist_core(s, p, x, mx, &n, &truncating);
    double u = tern_rng_f64(&s->rng);
    int32_t id = -1;
    if (truncating) {
        double c = 0;
        for (int32_t j = 0; j < n; j++) {
            c += s->probs[s->idx[j]];
            if (u < c) {
                id = s->idx[j];
                break;
            }
        }
        if (id < 0)
            id = s->idx[n - 1];
    } else {
        double c = 0;
        int32_t last = -1;
        for (int32_t i = 0; i < V; i++) {
            if (s->probs[i] <= 0)
                continue;
            last = i;
            c += s->probs[i];
            if (u < c) {
                id = i;
                break;
            }
        }
        if (id < 0)
            id = last;
    }
    out->id = id;
    if (want_lp) {
        /* Log-probabilities of the distribution the draw used: truncated
         * rows report over the kept set (already sorted), others over all. */
        out->logprob = logf(s->probs[id]);
        if (truncating) {
            int k = p->n_logprobs < n ? p->n_logprobs : n;
            for (int j = 0; j < k; j++) {
                out->top[j].id = s->idx[j];
                out->top[j].logprob = logf(s->probs[s->idx[j]]);
            }
            out->n_top = k;
        } else {
            top_n(s->probs, V, p->n_logprobs, 0.0f, out);
            for (int j = 0; j < out->n_top; j++)
                out->top[j].logprob = logf(out->top[j].logprob);
        }
    }
    return 0;
}

/* ---- pieces for speculative verification ---- */

int sample_dist(sample_state *s, const sample_params *p, float *x, const uint32_t *mask, float *probs)
{
    int32_t V = s->n_vocab;
    float mx;
    if (process(s, p, x, mask, &mx))
        return TERN_EINVAL;
    if (p->temperature == 0.0f) {
        memset(probs, 0, (size_t)V * sizeof *probs);
        probs[sample_argmax(x, V)] = 1.0f;
        return 0;
    }
    int32_t n;
    int truncating;
    dist_core(s, p, x, mx, &n, &truncating);
    if (truncating) {
        memset(probs, 0, (size_t)V * sizeof *probs);
        for (int32_t j = 0; j < n; j++)
            probs[s->idx[j]] = s->probs[s->idx[j]];
    } else {
        memcpy(probs, s->probs, (size_t)V * sizeof *probs);
    }
    return 0;
}

double sample_uniform(sample_state *s) { return tern_rng_f64(&s->rng); }

int32_t sample_draw(sample_state *s, const float *probs, int32_t n)
{
    double total = 0;
    for (int32_t i = 0; i < n; i++)
        total += probs[i];
    double u = tern_rng_f64(&s->rng) * total, c = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        if (probs[i] <= 0)
            continue;
        last = i;
        c += probs[i];
        if (u < c)
            return i;
    }
    return last;
}

void sample_logprobs_from(const float *probs, int32_t n, int32_t id, int n_top, sample_result *out)
{
    out->logprob = logf(probs[id]);
    top_n(probs, n, n_top, 0.0f, out);
    for (int j = 0; j < out->n_top; j++)
        out->top[j].logprob = logf(out->top[j].logprob);
}

int32_t sample_spec_step(sample_state *s, float *p, const float *q, int32_t d, int32_t n, int *accepted)
{
    double qd = q ? q[d] : 1.0;
    *accepted = qd > 0 && tern_rng_f64(&s->rng) * qd < p[d];
    if (*accepted)
        return d;
    if (q)
        for (int32_t x = 0; x < n; x++)
            p[x] = p[x] > q[x] ? p[x] - q[x] : 0.0f;
    else
        p[d] = 0.0f;
    int32_t t = sample_draw(s, p, n);
    return t >= 0 ? t : d; /* all-zero residual means p == q, where d is always accepted */
}
