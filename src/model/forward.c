/* The batched forward pass for the Llama family (Llama, Mistral, Qwen2,
 * Qwen3): every caller's tokens - prefill chunks, decode rows, speculative
 * verification - go through model_forward as one batch.
 *
 * Activations are f32; weights stay in their stored dtype and are converted
 * inside the matmul kernels. Per-call scratch is kept on the model and only
 * grows, so steady-state decoding does not allocate. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

struct model_scratch {
    int cap_t, cap_out, cap_ctx, n_workers;
    float *x, *xn;           /* [cap_t][dim] */
    float *q, *att;          /* [cap_t][n_head*head_dim] */
    float *k, *v;            /* [cap_t][kv_dim] */
    float *gate, *up;        /* [cap_t][n_ff] */
    float *tmp;              /* [cap_t][dim] */
    float *xo;               /* [cap_out][dim] */
    float *scores;           /* [n_workers][cap_ctx] */
};

void model_scratch_free(model_scratch *s);
void model_scratch_free(model_scratch *s)
{
    if (!s)
        return;
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->att);
    free(s->k);
    free(s->v);
    free(s->gate);
    free(s->up);
    free(s->tmp);
    free(s->xo);
    free(s->scores);
    free(s);
}

static int scratch_ensure(tern_model *m, int T, int n_out, int ctx, tern_err *err)
{
    model_scratch *s = m->scratch;
    if (s && s->cap_t >= T && s->cap_out >= n_out && s->cap_ctx >= ctx)
        return 0;
    const model_config *c = &m->cfg;
    int ct = T, co = n_out, cc = ctx;
    if (s) { /* grow geometrically so a slowly growing context reallocates rarely */
        ct = T > s->cap_t ? (T > 2 * s->cap_t ? T : 2 * s->cap_t) : s->cap_t;
        co = n_out > s->cap_out ? (n_out > 2 * s->cap_out ? n_out : 2 * s->cap_out) : s->cap_out;
        cc = ctx > s->cap_ctx ? (ctx > 2 * s->cap_ctx ? ctx : 2 * s->cap_ctx) : s->cap_ctx;
    }
    if (co < 1)
        co = 1;
    model_scratch_free(s);
    m->scratch = s = calloc(1, sizeof *s);
    if (!s)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_kv_head * c->head_dim;
    s->cap_t = ct;
    s->cap_out = co;
    s->cap_ctx = cc;
    s->n_workers = tern_pool_size(m->pool);
    s->x = malloc((size_t)ct * c->dim * sizeof(float));
    s->xn = malloc((size_t)ct * c->dim * sizeof(float));
    s->tmp = malloc((size_t)ct * c->dim * sizeof(float));
    s->q = malloc((size_t)ct * qd * sizeof(float));
    s->att = malloc((size_t)ct * qd * sizeof(float));
    s->k = malloc((size_t)ct * kvd * sizeof(float));
    s->v = malloc((size_t)ct * kvd * sizeof(float));
    s->gate = malloc((size_t)ct * c->n_ff * sizeof(float));
    s->up = malloc((size_t)ct * c->n_ff * sizeof(float));
    s->xo = malloc((size_t)co * c->dim * sizeof(float));
    s->scores = malloc((size_t)s->n_workers * cc * sizeof(float));
    if (!s->x || !s->xn || !s->tmp || !s->q || !s->att || !s->k || !s->v || !s->gate || !s->up || !s->xo ||
        !s->scores) {
        model_scratch_free(s);
        m->scratch = NULL;
        return tern_err_set(err, TERN_ENOMEM, "out of memory for forward scratch (%d tokens)", T);
    }
    return 0;
}

/* ---- matmul over the thread pool ---- */

typedef struct mm_job {
    tern_matmul_fn fn;
    const void *W;
    const float *X;
    float *Y;
    long T, n_in, ldy;
} mm_job;

static void mm_run(void *ctx, long b, long e, int w)
{
    (void)w;
    mm_job *j = ctx;
    j->fn(j->W, j->X, j->Y, j->T, j->n_in, j->ldy, b, e);
}

/* Y[T][w->n_out] = X[T][w->n_in] @ W^T */
static void matmul(tern_model *m, const model_weight *w, const float *X, float *Y, int T)
{
    const tern_kernels *k = m->kern;
    mm_job j = {w->dtype == TERN_F32 ? k->matmul_f32 : w->dtype == TERN_BF16 ? k->matmul_bf16 : k->matmul_f16,
                w->data, X, Y, T, w->n_in, w->n_out};
    /* Enough work per part that waking a thread pays off (~64k MACs). */
    long grain = 65536 / ((long)w->n_in * T) + 1;
    tern_pool_for(m->pool, w->n_out, grain, mm_run, &j);
}

/* ---- elementwise pieces ---- */

static void rmsnorm(float *out, const float *x, const float *w, int n, float eps)
{
    double ss = 0.0; /* double: the mean of squares of a long row stays exact enough */
    for (int i = 0; i < n; i++)
        ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++)
        out[i] = (x[i] * r) * w[i];
}

/* HF rotate_half convention: pairs (i, i + d/2) rotate by pos * inv_freq[i]. */
static void rope(float *v, int d, int pos, const float *inv_freq)
{
    int h = d / 2;
    for (int i = 0; i < h; i++) {
        float a = (float)pos * inv_freq[i];
        float c = cosf(a), s = sinf(a);
        float x0 = v[i], x1 = v[i + h];
        v[i] = x0 * c - x1 * s;
        v[i + h] = x1 * c + x0 * s;
    }
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---- attention over the paged cache ---- */

typedef struct att_job {
    tern_model *m;
    const kv_pool *kv;
    const fwd_batch *b;
    int layer;
} att_job;

static void att_run(void *ctx, long begin, long end, int worker)
{
    att_job *j = ctx;
    const model_config *c = &j->m->cfg;
    model_scratch *s = j->m->scratch;
    int hd = c->head_dim, group = c->n_head / c->n_kv_head;
    int qd = c->n_head * hd;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = s->scores + (size_t)worker * s->cap_ctx;
    const tern_kernels *k = j->m->kern;
    for (long it = begin; it < end; it++) {
        int i = (int)(it / c->n_head), h = (int)(it % c->n_head), kvh = h / group;
        const kv_seq *seq = j->b->seqs[i];
        int p = j->b->pos[i];
        int start = c->sliding_window > 0 && p - c->sliding_window + 1 > 0 ? p - c->sliding_window + 1 : 0;
        const float *q = s->q + (size_t)i * qd + (size_t)h * hd;
        float mx = -INFINITY;
        for (int t = start; t <= p; t++) {
            float v = k->dot(q, kv_k_at(j->kv, seq, j->layer, t) + (size_t)kvh * hd, hd) * scale;
            sc[t] = v;
            if (v > mx)
                mx = v;
        }
        float sum = 0.0f;
        for (int t = start; t <= p; t++) {
            sc[t] = expf(sc[t] - mx);
            sum += sc[t];
        }
        float inv = 1.0f / sum;
        float *out = s->att + (size_t)i * qd + (size_t)h * hd;
        memset(out, 0, (size_t)hd * sizeof(float));
        for (int t = start; t <= p; t++)
            k->axpy(sc[t] * inv, kv_v_at(j->kv, seq, j->layer, t) + (size_t)kvh * hd, out, hd);
    }
}

int model_forward(tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits, tern_err *err)
{
    const model_config *c = &m->cfg;
    int T = b->n;
    if (T <= 0)
        return 0;
    int max_pos = 0;
    for (int i = 0; i < T; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->n_vocab)
            return tern_err_set(err, TERN_ERANGE, "token id %d is outside the vocabulary (%d)", b->tokens[i],
                                c->n_vocab);
        if (b->pos[i] < 0 || b->pos[i] >= b->seqs[i]->n_blocks * kv->block_size)
            return tern_err_set(err, TERN_EINVAL, "position %d is not reserved in the KV cache", b->pos[i]);
        if (b->pos[i] > max_pos)
            max_pos = b->pos[i];
    }
    for (int j = 0; j < b->n_out; j++)
        if (b->out_rows[j] < 0 || b->out_rows[j] >= T)
            return tern_err_set(err, TERN_EINVAL, "output row %d is outside the batch", b->out_rows[j]);
    int rc = scratch_ensure(m, T, b->n_out, max_pos + 1, err);
    if (rc)
        return rc;
    model_scratch *s = m->scratch;
    int dim = c->dim, hd = c->head_dim;
    int qd = c->n_head * hd, kvd = c->n_kv_head * hd;
    size_t es = tern_dtype_size(m->embed.dtype);

    for (int i = 0; i < T; i++)
        tern_to_f32(m->embed.dtype, (const char *)m->embed.data + (size_t)b->tokens[i] * dim * es,
                    s->x + (size_t)i * dim, (size_t)dim);

    for (int l = 0; l < c->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        for (int i = 0; i < T; i++)
            rmsnorm(s->xn + (size_t)i * dim, s->x + (size_t)i * dim, L->attn_norm, dim, c->norm_eps);
        matmul(m, &L->wq, s->xn, s->q, T);
        matmul(m, &L->wk, s->xn, s->k, T);
        matmul(m, &L->wv, s->xn, s->v, T);
        for (int i = 0; i < T; i++) {
            float *q = s->q + (size_t)i * qd, *k = s->k + (size_t)i * kvd, *v = s->v + (size_t)i * kvd;
            if (L->bq) {
                for (int e = 0; e < qd; e++)
                    q[e] += L->bq[e];
                for (int e = 0; e < kvd; e++) {
                    k[e] += L->bk[e];
                    v[e] += L->bv[e];
                }
            }
            for (int h = 0; h < c->n_head; h++) {
                if (L->q_norm)
                    rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, c->norm_eps);
                rope(q + h * hd, hd, b->pos[i], m->rope_inv_freq);
            }
            for (int h = 0; h < c->n_kv_head; h++) {
                if (L->k_norm)
                    rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, c->norm_eps);
                rope(k + h * hd, hd, b->pos[i], m->rope_inv_freq);
            }
            memcpy(kv_k_at(kv, b->seqs[i], l, b->pos[i]), k, (size_t)kvd * sizeof(float));
            memcpy(kv_v_at(kv, b->seqs[i], l, b->pos[i]), v, (size_t)kvd * sizeof(float));
        }
        att_job aj = {m, kv, b, l};
        tern_pool_for(m->pool, (long)T * c->n_head, 1, att_run, &aj);
        matmul(m, &L->wo, s->att, s->tmp, T);
        for (size_t e = 0; e < (size_t)T * dim; e++)
            s->x[e] += s->tmp[e];

        for (int i = 0; i < T; i++)
            rmsnorm(s->xn + (size_t)i * dim, s->x + (size_t)i * dim, L->ffn_norm, dim, c->norm_eps);
        matmul(m, &L->w_gate, s->xn, s->gate, T);
        matmul(m, &L->w_up, s->xn, s->up, T);
        for (size_t e = 0; e < (size_t)T * c->n_ff; e++)
            s->gate[e] = silu(s->gate[e]) * s->up[e];
        matmul(m, &L->w_down, s->gate, s->tmp, T);
        for (size_t e = 0; e < (size_t)T * dim; e++)
            s->x[e] += s->tmp[e];
    }

    for (int j = 0; j < b->n_out; j++)
        rmsnorm(s->xo + (size_t)j * dim, s->x + (size_t)b->out_rows[j] * dim, m->final_norm, dim, c->norm_eps);
    if (b->n_out > 0)
        matmul(m, &m->lm_head, s->xo, logits, b->n_out);
    for (int i = 0; i < T; i++)
        if (b->seqs[i]->n_tokens < b->pos[i] + 1)
            b->seqs[i]->n_tokens = b->pos[i] + 1;
    return 0;
}
