/* A plain double-precision reference of the device sampler's contract
 * (backend.h sample_finish, cuda_sample.h tcu_sample_rows), for tests:
 * the min_tokens stop set, bias, penalties, mask, temperature weights
 * exp((x - max) * (1/T)), a full sort (weight descending, ids ascending),
 * the top-k / top-p / min-p cuts, the inverse of the cumulative
 * distribution at u, and sample_row's logprobs (sref_logprobs). Independent
 * of the kernel's method (no radix selection, no fixed point). Header-only;
 * the caller frees a prepared row with sref_free. */
#ifndef TERN_TESTS_SAMPLE_REF_H
#define TERN_TESTS_SAMPLE_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct sref_params {
    float temperature; /* 0 = argmax */
    float top_p;       /* 1 = off */
    float min_p;       /* 0 = off */
    int top_k;         /* 0 = off */
    const int32_t *bias_ids;
    const float *bias_vals;
    int n_bias;
    /* penalties (sample.c) when pen: per listed id, the repetition penalty,
     * then presence + frequency x count where count > 0 */
    int pen;
    float rep, pres, freq;
    const int32_t *pen_ids, *pen_counts;
    int n_pen;
    /* min_tokens: these ids get -inf before everything else */
    const int32_t *sup_ids;
    int n_sup;
} sref_params;

typedef struct sref_row {
    int greedy;      /* temperature 0: argmax is the answer */
    int32_t argmax;  /* -1 = nothing can be drawn */
    int truncating;  /* top-k, top-p or min-p: sorted order, else id order */
    int32_t n;       /* tokens with weight > 0, in draw order */
    int32_t *ids;    /* [n] */
    double *w;       /* [n] weights (the largest is 1) */
    double *cum;     /* [n] running sums of w */
    int32_t *pos;    /* [V] position of each id in ids, -1 if none */
    int32_t k_nom;   /* kept prefix length */
    int32_t k_lo, k_hi; /* its range when the top-p and min-p cuts move by a relative eps */
    int32_t V;
    float *x;        /* [V] the processed logits (masked ones -inf) */
} sref_row;

static const double *sref_sort_w;
static inline int sref_cmp(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    double wi = sref_sort_w[i], wj = sref_sort_w[j];
    if (wi != wj)
        return wi > wj ? -1 : 1;
    return i < j ? -1 : i > j;
}

static inline void sref_free(sref_row *r)
{
    free(r->ids);
    free(r->w);
    free(r->cum);
    free(r->pos);
    free(r->x);
    memset(r, 0, sizeof *r);
}

/* Shortest kept prefix under the cuts, with the top-p target and the min-p
 * threshold scaled by fp and fm. */
static inline int32_t sref_keep(const sref_row *r, const sref_params *p, double fp, double fm)
{
    int32_t k = p->top_k > 0 && p->top_k < r->n ? p->top_k : r->n;
    if (p->top_p < 1.0f) {
        double target = (double)p->top_p * r->cum[k - 1] * fp;
        for (int32_t m = 1; m <= k; m++)
            if (r->cum[m - 1] >= target) {
                k = m;
                break;
            }
    }
    if (p->min_p > 0.0f) {
        int32_t m = 1;
        while (m < k && r->w[m] >= (double)p->min_p * fm)
            m++;
        k = m;
    }
    return k;
}

/* Prepares one row; 0, or -1 when nothing can be drawn (r->argmax = -1).
 * mask: NULL or packed words (bit t & 31 of word t >> 5 = token t allowed). */
static inline int sref_prepare(sref_row *r, const float *logits, int32_t V, const sref_params *p, const uint32_t *mask,
                        double eps)
{
    memset(r, 0, sizeof *r);
    float *x = (float *)malloc((size_t)V * sizeof *x);
    double *wa = (double *)malloc((size_t)V * sizeof *wa);
    r->ids = (int32_t *)malloc((size_t)V * sizeof *r->ids);
    r->w = (double *)malloc((size_t)V * sizeof *r->w);
    r->cum = (double *)malloc((size_t)V * sizeof *r->cum);
    r->pos = (int32_t *)malloc((size_t)V * sizeof *r->pos);
    if (!x || !wa || !r->ids || !r->w || !r->cum || !r->pos)
        abort();
    memcpy(x, logits, (size_t)V * sizeof *x);
    r->V = V;
    r->x = x;
    for (int b = 0; b < p->n_sup; b++)
        x[p->sup_ids[b]] = -INFINITY;
    for (int b = 0; b < p->n_bias; b++)
        x[p->bias_ids[b]] += p->bias_vals[b];
    const int pen = p->pen;
    for (int b = 0; pen && b < p->n_pen; b++) {
        float *v = &x[p->pen_ids[b]];
        if (p->rep != 1.0f)
            *v = *v > 0 ? *v / p->rep : *v * p->rep;
        if (p->pen_counts[b])
            *v -= p->pres + p->freq * (float)p->pen_counts[b];
    }
    int32_t best = -1;
    for (int32_t t = 0; t < V; t++) {
        if (mask && !(mask[t >> 5] >> (t & 31) & 1))
            x[t] = -INFINITY;
        if ((mask && x[t] == -INFINITY) || isnan(x[t]))
            continue;
        if (best < 0 || x[t] > x[best])
            best = t;
    }
    if (best >= 0 && x[best] == -INFINITY && (mask || p->n_bias > 0 || pen || p->temperature > 0.0f))
        best = -1;
    r->argmax = best;
    r->greedy = p->temperature == 0.0f;
    if (r->greedy || best < 0) {
        free(wa);
        return best < 0 ? -1 : 0;
    }
    float mx = x[best], invt = 1.0f / p->temperature;
    for (int32_t t = 0; t < V; t++) {
        float v = (x[t] - mx) * invt; /* the product in float, as the samplers take it */
        wa[t] = x[t] > -INFINITY && !isnan(v) ? exp((double)v) : 0.0;
        r->pos[t] = -1;
        if (wa[t] > 0)
            r->ids[r->n++] = t;
    }
    r->truncating = p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0.0f;
    if (r->truncating) {
        sref_sort_w = wa;
        qsort(r->ids, (size_t)r->n, sizeof *r->ids, sref_cmp);
    }
    double c = 0;
    for (int32_t j = 0; j < r->n; j++) {
        r->w[j] = wa[r->ids[j]];
        c += r->w[j];
        r->cum[j] = c;
        r->pos[r->ids[j]] = j;
    }
    free(wa);
    if (r->n == 0) {
        r->argmax = -1;
        return -1;
    }
    if (r->truncating) {
        r->k_nom = sref_keep(r, p, 1.0, 1.0);
        int32_t a = sref_keep(r, p, 1.0 - eps, 1.0 + eps), b = sref_keep(r, p, 1.0 + eps, 1.0 - eps);
        r->k_lo = a < b ? a : b;
        r->k_hi = a < b ? b : a;
        if (r->k_nom < r->k_lo)
            r->k_lo = r->k_nom;
        if (r->k_nom > r->k_hi)
            r->k_hi = r->k_nom;
    } else {
        r->k_nom = r->k_lo = r->k_hi = r->n;
    }
    return 0;
}

/* The inverse CDF at u over the first K tokens of the draw order. */
static inline int32_t sref_draw(const sref_row *r, int32_t K, double u)
{
    if (r->greedy || r->n == 0)
        return r->argmax;
    double target = u * r->cum[K - 1];
    for (int32_t j = 0; j < K; j++)
        if (r->cum[j] > target)
            return r->ids[j];
    return r->ids[K - 1];
}

/* Whether id is the inverse CDF at u for some kept length in [k_lo, k_hi],
 * allowing u to lie within eps of its interval's ends. */
static inline int sref_accepts(const sref_row *r, int32_t id, double u, double eps)
{
    if (r->greedy || r->n == 0)
        return id == r->argmax;
    if (id < 0 || r->pos[id] < 0)
        return 0;
    int32_t j = r->pos[id];
    for (int32_t K = r->k_lo; K <= r->k_hi; K++) {
        if (j >= K)
            continue;
        double z = r->cum[K - 1], lo = j ? r->cum[j - 1] / z : 0.0, hi = r->cum[j] / z;
        if (u >= lo - eps && u < hi + eps)
            return 1;
    }
    return 0;
}

/* sample_row's logprobs for a draw of id (>= 0) over the first K tokens of
 * the draw order (sampled rows; K ignored for greedy ones): *lp for id and
 * the n_top (clamped to the tokens that exist; returned) most likely ids
 * with theirs, ties by ascending id. Sampled rows: log(w / the kept mass),
 * the top being the kept set's first tokens by weight; greedy rows: the
 * log-softmax of the processed logits at temperature 1 over the allowed
 * finite ones, the top by logit. */
static inline int sref_logprobs(const sref_row *r, int32_t K, int32_t id, int n_top, double *lp, int32_t *top_ids,
                                double *top_lp)
{
    const int32_t V = r->V;
    if (r->greedy) {
        float mx = r->x[r->argmax];
        double s = 0;
        int32_t cnt = 0;
        for (int32_t t = 0; t < V; t++)
            if (r->x[t] > -INFINITY) { /* NaN fails too */
                s += exp((double)r->x[t] - (double)mx);
                cnt++;
            }
        double lse = (double)mx + log(s);
        *lp = (double)r->x[id] - lse;
        if (n_top > cnt)
            n_top = cnt;
        for (int j = 0; j < n_top; j++) { /* the j-th: the largest below the (j-1)-th in (x desc, id asc) */
            int32_t b = -1;
            for (int32_t t = 0; t < V; t++) {
                if (!(r->x[t] > -INFINITY))
                    continue;
                if (j > 0) {
                    float px = r->x[top_ids[j - 1]];
                    if (r->x[t] > px || (r->x[t] == px && t <= top_ids[j - 1]))
                        continue;
                }
                if (b < 0 || r->x[t] > r->x[b])
                    b = t;
            }
            top_ids[j] = b;
            top_lp[j] = (double)r->x[b] - lse;
        }
        return n_top;
    }
    double z = r->cum[K - 1];
    *lp = r->pos[id] >= 0 ? log(r->w[r->pos[id]] / z) : -INFINITY;
    if (n_top > K)
        n_top = K;
    if (r->truncating) { /* ids[] is the sorted order */
        for (int j = 0; j < n_top; j++) {
            top_ids[j] = r->ids[j];
            top_lp[j] = log(r->w[j] / z);
        }
        return n_top;
    }
    for (int j = 0; j < n_top; j++) { /* ids[] in id order: select by (w desc, id asc) */
        int32_t b = -1;
        for (int32_t q = 0; q < r->n; q++) {
            if (j > 0) {
                int32_t pq = r->pos[top_ids[j - 1]];
                if (r->w[q] > r->w[pq] || (r->w[q] == r->w[pq] && r->ids[q] <= top_ids[j - 1]))
                    continue;
            }
            if (b < 0 || r->w[q] > r->w[b])
                b = q;
        }
        top_ids[j] = r->ids[b];
        top_lp[j] = log(r->w[b] / z);
    }
    return n_top;
}

#endif
