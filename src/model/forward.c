/* The batched forward pass for the Llama family (Llama, Mistral, Qwen2,
 * Qwen3) and Gemma 2/3: every caller's tokens - prefill chunks, decode
 * rows, speculative verification - go through model_forward as one batch.
 * Per layer: norm, fused q/k/v product, biases, q/k norms, RoPE, KV write,
 * attention (backend), o product, [post-attention norm], residual; norm,
 * fused gate/up product, SiLU or GELU-tanh gate, down product,
 * [post-feed-forward norm], residual. Products and attention go through
 * the backend (backend.h); the rest is cheap per-token glue here.
 *
 * Every way in - model_forward, and model_forward_start with its finishes
 * for a backend that keeps the outputs on the device - checks the batch
 * and updates the sequences' n_tokens here, once; a backend's own forward
 * (backend.h) gets a checked batch and does neither.
 *
 * Activations are f32; weights stay in their stored dtype and are converted
 * inside the matmul kernels. Per-call scratch is kept on the model and only
 * grows, so steady-state decoding does not allocate. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "model/embed.h"
#include "model/lora.h"
#include "model/model_int.h"

struct model_scratch {
    int cap_t, cap_out;
    float *x, *xn;           /* [cap_t][dim] */
    float *q, *att;          /* [cap_t][n_head*head_dim] */
    float *k, *v;            /* [cap_t][kv_dim] */
    float *gate, *up;        /* [cap_t][n_ff] */
    float *tmp;              /* [cap_t][dim] */
    float *xo;               /* [cap_out][dim] */
    /* sparse layers (n_expert > 0), else NULL */
    float *rl;               /* [cap_t][n_expert] router logits, then probabilities */
    float *wt;               /* [cap_t][n_expert_used] routing weights, by expert id */
    int *sel;                /* [cap_t][n_expert_used] chosen experts, ascending */
    int *row;                /* [cap_t][n_expert_used] each choice's row in the grouped buffers */
    int *cnt;                /* [n_expert + 1] tokens per expert, then first rows */
    float *xg;               /* [cap_t * n_expert_used][dim] inputs grouped by expert */
    float *eg, *eu;          /* [cap_t * n_expert_used][n_ff_expert] (gpt_oss: eg twice as wide, gate_up) */
    int *rexp;               /* [cap_t * n_expert_used] each grouped row's expert (gpt_oss) */
    float *ed;               /* [cap_t * n_expert_used][dim] expert outputs */
    const model_weight **gw; /* [2 * n_expert] a grouped product's matrices, */
    const float **gx;        /* inputs, */
    float **gy;              /* outputs */
    int *gt;                 /* and token counts */
};

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
    free(s->rl);
    free(s->wt);
    free(s->sel);
    free(s->row);
    free(s->cnt);
    free(s->xg);
    free(s->eg);
    free(s->eu);
    free(s->ed);
    free(s->rexp);
    free(s->gw);
    free(s->gx);
    free(s->gy);
    free(s->gt);
    free(s);
}

static int scratch_ensure(tern_model *m, int T, int n_out, tern_err *err)
{
    model_scratch *s = m->scratch;
    if (s && s->cap_t >= T && s->cap_out >= n_out)
        return 0;
    const model_config *c = &m->cfg;
    int ct = T, co = n_out;
    if (s) { /* grow geometrically so slowly growing batches reallocate rarely */
        ct = T > s->cap_t ? (T > 2 * s->cap_t ? T : 2 * s->cap_t) : s->cap_t;
        co = n_out > s->cap_out ? (n_out > 2 * s->cap_out ? n_out : 2 * s->cap_out) : s->cap_out;
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
    int moe_bad = 0;
    if (c->n_expert) {
        size_t E = (size_t)c->n_expert, K = (size_t)c->n_expert_used, rows = (size_t)ct * K;
        s->rl = malloc((size_t)ct * E * sizeof(float));
        s->wt = malloc(rows * sizeof(float));
        s->sel = malloc(rows * sizeof(int));
        s->row = malloc(rows * sizeof(int));
        s->cnt = malloc((E + 1) * sizeof(int));
        s->xg = malloc(rows * c->dim * sizeof(float));
        s->eg = malloc(rows * c->n_ff_expert * (c->moe == MOE_GPT_OSS ? 2 : 1) * sizeof(float));
        s->rexp = malloc(rows * sizeof(int));
        s->eu = malloc(rows * c->n_ff_expert * sizeof(float));
        s->ed = malloc(rows * c->dim * sizeof(float));
        s->gw = malloc(2 * E * sizeof *s->gw);
        s->gx = malloc(2 * E * sizeof *s->gx);
        s->gy = malloc(2 * E * sizeof *s->gy);
        s->gt = malloc(2 * E * sizeof *s->gt);
        moe_bad = !s->rl || !s->wt || !s->sel || !s->row || !s->cnt || !s->xg || !s->eg || !s->eu || !s->ed || !s->rexp ||
                  !s->gw || !s->gx || !s->gy || !s->gt;
    }
    if (moe_bad || !s->x || !s->xn || !s->tmp || !s->q || !s->att || !s->k || !s->v || !s->gate || !s->up ||
        !s->xo) {
        model_scratch_free(s);
        m->scratch = NULL;
        return tern_err_set(err, TERN_ENOMEM, "out of memory for forward scratch (%d tokens)", T);
    }
    return 0;
}

/* ---- products through the backend ---- */

static int matmul(tern_model *m, const model_weight *w, const float *X, float *Y, int T, tern_err *err)
{
    return m->be->matmul(m->be, 1, &w, X, &Y, T, err);
}

/* ---- elementwise pieces ---- */

/* fn over [0, n) on the backend's threads (parts of >= grain items), or
 * inline. Every item is computed by the same code either way, so the
 * split never changes a bit. */
static void fwd_par(tern_model *m, long n, long grain, void (*fn)(void *ctx, long b, long e, int worker), void *ctx)
{
    if (n <= 0)
        return;
    if (m->be->par_for && n > grain)
        m->be->par_for(m->be, n, grain, fn, ctx);
    else
        fn(ctx, 0, n, 0);
}

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
/* The rotation's cos/sin for one position (d / 2 pairs), computed once per
 * token and shared by all its q and k heads (the same values as computing
 * them per head: the same cosf/sinf of the same argument). */
/* af scales both (YaRN's attention factor; 1 elsewhere, an exact no-op). */
static void rope_table(float *cs, float *sn, int d, int pos, const float *inv_freq, float af)
{
    for (int i = 0; i < d / 2; i++) {
        float a = (float)pos * inv_freq[i];
        cs[i] = cosf(a) * af;
        sn[i] = sinf(a) * af;
    }
}

static void rope(float *v, int d, const float *cs, const float *sn, int pos, const float *inv_freq, float af)
{
    int h = d / 2;
    for (int i = 0; i < h; i++) {
        float a = (float)pos * inv_freq[i];
        float c = cs ? cs[i] : cosf(a) * af, s = sn ? sn[i] : sinf(a) * af; /* no table: head_dim past its size */
        float x0 = v[i], x1 = v[i + h];
        v[i] = x0 * c - x1 * s;
        v[i + h] = x1 * c + x0 * s;
    }
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* GELU, tanh approximation (HF's gelu_pytorch_tanh). */
static inline float gelu_tanh(float x)
{
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

/* The gate: g[e] = act(g[e]) * u[e] for e in [b, e). */
typedef struct gate_job {
    float *g;
    const float *u;
    int gelu;
    int vec; /* SiLU through model_silu_mul_avx2 */
} gate_job;

/* SiLU with a vector e^x where the CPU has AVX2 + FMA (the scalar
 * expf took ~7% of a 1B decode step on 16 threads), expf under
 * --exact-products; gelu: never. */
static int gate_vec(int gelu)
{
    int vec = 0;
#ifdef __x86_64__
    vec = !gelu && !tern_kernels_exact_get() && tern_cpu()->avx2 && tern_cpu()->fma;
#else
    (void)gelu;
#endif
    return vec;
}

#define GATE_GRAIN 512L   /* elements a part: ~3 us of expf (a 1B decode token's 8192 in 16 parts, not 4) */
#define ROWS_GRAIN 16384L /* elements a part for the norms and residual adds */

static void gate_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    gate_job *j = ctx;
#ifdef __x86_64__
    if (j->vec) {
        model_silu_mul_avx2(j->g + b, j->u + b, e - b);
        return;
    }
#endif
    if (j->gelu)
        for (long i = b; i < e; i++)
            j->g[i] = gelu_tanh(j->g[i]) * j->u[i];
    else
        for (long i = b; i < e; i++)
            j->g[i] = silu(j->g[i]) * j->u[i];
}

/* Rows [b, e) of y (n wide) += bias. */
typedef struct bias_job {
    float *y;
    const float *bias;
    int n;
} bias_job;

static void bias_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    bias_job *j = ctx;
    for (long i = b; i < e; i++)
        for (int k = 0; k < j->n; k++)
            j->y[(size_t)i * j->n + k] += j->bias[k];
}

/* out[i] = rmsnorm(x[i]) * w for rows [b, e); then, when add, x[i] += a[i]
 * first (the residual add, the norm reading its result). */
typedef struct norm_job {
    float *out, *x;
    const float *a, *w;
    int n;
    float eps;
} norm_job;

static void norm_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    norm_job *j = ctx;
    for (long i = b; i < e; i++) {
        float *x = j->x + (size_t)i * j->n;
        if (j->a) {
            const float *a = j->a + (size_t)i * j->n;
            for (int k = 0; k < j->n; k++)
                x[k] += a[k];
        }
        if (j->out)
            rmsnorm(j->out + (size_t)i * j->n, x, j->w, j->n, j->eps);
    }
}

/* Rows [0, T) of x (n wide): x += a (a NULL: none), then out = rmsnorm(x) * w
 * (out NULL: none), a token per item. */
static void norm_rows(tern_model *m, float *out, float *x, const float *a, const float *w, int n, int T)
{
    norm_job j = {out, x, a, w, n, m->cfg.norm_eps};
    fwd_par(m, T, ROWS_GRAIN / n + 1, norm_run, &j);
}

/* A dense layer's MLP: s->xn[T][dim] in, s->tmp[T][dim] out; the rows'
 * LoRA deltas (lora NULL: none) right after each base product. */
static int dense_mlp(tern_model *m, int l, const model_lora *const *lora, int T, tern_err *err)
{
    const model_config *c = &m->cfg;
    const model_layer *L = &m->layers[l];
    model_scratch *s = m->scratch;
    const model_weight *w[2] = {&L->w_gate, &L->w_up};
    float *y[2] = {s->gate, s->up};
    int rc = m->be->matmul(m->be, 2, w, s->xn, y, T, err);
    if (rc)
        return rc;
    for (int k = 0; lora && k < 2; k++)
        if ((rc = model_lora_apply(m, lora, T, l, LORA_GATE + k, s->xn, y[k], err)))
            return rc;
    gate_job gj = {s->gate, s->up, c->gelu, gate_vec(c->gelu)};
    fwd_par(m, (long)T * c->n_ff, GATE_GRAIN, gate_run, &gj);
    if ((rc = matmul(m, &L->w_down, s->gate, s->tmp, T, err)))
        return rc;
    return model_lora_apply(m, lora, T, l, LORA_DOWN, s->gate, s->tmp, err);
}

/* Token i's q/k/v after the product: biases, q/k norms, RoPE, and its K
 * and V rows written to the cache (a token per item). */
typedef struct qkv_job {
    const model_config *c;
    const model_layer *L;
    kv_pool *kv;
    const fwd_batch *b;
    model_scratch *s;
    int l;
} qkv_job;

static void qkv_run(void *ctx, long b0, long e0, int worker)
{
    (void)worker;
    qkv_job *j = ctx;
    const model_config *c = j->c;
    const model_layer *L = j->L;
    model_scratch *s = j->s;
    int hd = c->head_dim, qd = c->n_head * hd, kvd = c->n_kv_head * hd;
    for (long i = b0; i < e0; i++) {
        float *q = s->q + (size_t)i * qd, *k = s->k + (size_t)i * kvd, *v = s->v + (size_t)i * kvd;
        int pos = j->b->pos[i];
        if (L->bq) {
            for (int e = 0; e < qd; e++)
                q[e] += L->bq[e];
            for (int e = 0; e < kvd; e++) {
                k[e] += L->bk[e];
                v[e] += L->bv[e];
            }
        }
        float rc_[KV_HEAD_DIM_MAX / 2], rs_[KV_HEAD_DIM_MAX / 2];
        int tab = hd <= KV_HEAD_DIM_MAX;
        if (tab)
            rope_table(rc_, rs_, hd, pos, L->rope_inv_freq, L->rope_af);
        for (int h = 0; h < c->n_head; h++) {
            if (L->q_norm)
                rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, c->norm_eps);
            rope(q + h * hd, hd, tab ? rc_ : NULL, tab ? rs_ : NULL, pos, L->rope_inv_freq, L->rope_af);
        }
        for (int h = 0; h < c->n_kv_head; h++) {
            if (L->k_norm)
                rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, c->norm_eps);
            rope(k + h * hd, hd, tab ? rc_ : NULL, tab ? rs_ : NULL, pos, L->rope_inv_freq, L->rope_af);
        }
        if (j->kv->k) {
            memcpy(kv_k_at(j->kv, j->b->seqs[i], j->l, pos), k, (size_t)kvd * sizeof(float));
            memcpy(kv_v_at(j->kv, j->b->seqs[i], j->l, pos), v, (size_t)kvd * sizeof(float));
        } else { /* a typed pool: encode (token i's row of s->att is free until the attention) */
            kv_row_store(j->kv, j->b->seqs[i], j->l, pos, k, v, s->att + (size_t)i * qd);
        }
    }
}

/* ---- mixture of experts ---- */

/* Token t's routing: softmax over the router's logits p[n_expert] (in
 * place; the picks' entries are -1 after), the k most probable experts (the lower id on a tie), their
 * probabilities renormalized to sum 1 when norm_topk (as HF), and then the
 * choices sorted by expert id - the order their outputs are summed in, as
 * HF's loop over experts does. */
static void moe_route(const model_config *c, float *p, int *sel, float *wt)
{
    int E = c->n_expert, K = c->n_expert_used;
    float mx = p[0], sum = 0.0f;
    for (int e = 1; e < E; e++)
        mx = p[e] > mx ? p[e] : mx;
    for (int e = 0; e < E; e++) {
        p[e] = expf(p[e] - mx);
        sum += p[e];
    }
    for (int e = 0; e < E; e++)
        p[e] /= sum;
    float tsum = 0.0f;
    for (int k = 0; k < K; k++) { /* a pick's p becomes -1: no probability, so never picked again */
        int best = -1;
        for (int e = 0; e < E; e++)
            if (!(p[e] == -1.0f) && (best < 0 || p[e] > p[best]))
                best = e;
        sel[k] = best;
        wt[k] = p[best];
        tsum += p[best];
        p[best] = -1.0f;
    }
    if (c->norm_topk)
        for (int k = 0; k < K; k++)
            wt[k] /= tsum;
    for (int k = 1; k < K; k++) /* insertion sort by expert id */
        for (int j = k; j > 0 && sel[j - 1] > sel[j]; j--) {
            int ts = sel[j];
            float tw = wt[j];
            sel[j] = sel[j - 1], wt[j] = wt[j - 1];
            sel[j - 1] = ts, wt[j - 1] = tw;
        }
}

/* gpt_oss's routing (transformers' GptOssTopKRouter): the k largest of the
 * router's (biased) logits p[n_expert] (the lower id on a tie; the picks'
 * entries are NaN after), their softmax as the weights, then sorted by
 * expert id like moe_route. */
static void moe_route_topk_softmax(const model_config *c, float *p, int *sel, float *wt)
{
    int E = c->n_expert, K = c->n_expert_used;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (p[e] == p[e] && (best < 0 || p[e] > p[best]))
                best = e;
        for (int e = 0; best < 0 && e < E; e++) { /* NaN logits (a broken input): the lowest id not chosen */
            int taken = 0;
            for (int j = 0; j < k; j++)
                taken |= sel[j] == e;
            best = taken ? -1 : e;
        }
        sel[k] = best;
        wt[k] = p[best];
        p[best] = NAN;
    }
    float mx = wt[0], sum = 0.0f; /* the first pick is the largest */
    for (int k = 0; k < K; k++) {
        wt[k] = expf(wt[k] - mx);
        sum += wt[k];
    }
    for (int k = 0; k < K; k++)
        wt[k] /= sum;
    for (int k = 1; k < K; k++) /* insertion sort by expert id */
        for (int j = k; j > 0 && sel[j - 1] > sel[j]; j--) {
            int ts = sel[j];
            float tw = wt[j];
            sel[j] = sel[j - 1], wt[j] = wt[j - 1];
            sel[j - 1] = ts, wt[j - 1] = tw;
        }
}

/* Expert rows r0.. of the grouped inputs: s->xg, or for a batch of one
 * token (every chosen expert's one row is that token) s->xn itself, so the
 * backend sees one input for all (one conversion of it, not K). */
static const float *moe_in(const model_scratch *s, int T, int r0, int dim)
{
    return T == 1 ? s->xn : s->xg + (size_t)r0 * dim;
}

/* The chosen experts of layer l over their grouped rows (s->cnt, s->xg),
 * one expert at a time: s->ed gets each row's expert output. */
static int moe_each(tern_model *m, int l, int T, tern_err *err)
{
    const model_config *c = &m->cfg;
    model_scratch *s = m->scratch;
    const model_weight *ex0 = m->layers[l].experts;
    int dim = c->dim, ff = c->n_ff_expert, rc;
    for (int e = 0; e < c->n_expert; e++) {
        int r0 = e ? s->cnt[e - 1] : 0, n = s->cnt[e] - r0;
        if (n == 0)
            continue;
        const model_weight *ex = ex0 + 3 * e;
        const model_weight *w[2] = {&ex[0], &ex[1]};
        float *y[2] = {s->eg + (size_t)r0 * ff, s->eu + (size_t)r0 * ff};
        if ((rc = model_experts_touch(m, l, e, err)) ||
            (rc = m->be->matmul(m->be, 2, w, moe_in(s, T, r0, dim), y, n, err)))
            return rc;
        gate_job gj = {y[0], y[1], 0, gate_vec(0)}; /* moe_grouped's gate, the same bits */
        gate_run(&gj, 0, (long)n * ff, 0);
        if ((rc = matmul(m, &ex[2], y[0], s->ed + (size_t)r0 * dim, n, err)))
            return rc;
    }
    return 0;
}

/* moe_each's result with two jobs for the whole layer (the backend's
 * matmul_grouped): every chosen expert's gate and up products, then every
 * down product - the same bits, two pool rounds instead of two per expert. */
static int moe_grouped(tern_model *m, int l, int T, tern_err *err)
{
    const model_config *c = &m->cfg;
    model_scratch *s = m->scratch;
    const model_weight *ex0 = m->layers[l].experts;
    int dim = c->dim, ff = c->n_ff_expert, n = 0, rc;
    for (int e = 0; e < c->n_expert; e++) {
        int r0 = e ? s->cnt[e - 1] : 0, t = s->cnt[e] - r0;
        if (t == 0)
            continue;
        if ((rc = model_experts_touch(m, l, e, err)))
            return rc;
        for (int k = 0; k < 2; k++, n++) {
            s->gw[n] = &ex0[3 * e + k];
            s->gx[n] = moe_in(s, T, r0, dim);
            s->gy[n] = (k ? s->eu : s->eg) + (size_t)r0 * ff;
            s->gt[n] = t;
        }
    }
    if ((rc = m->be->matmul_grouped(m->be, n, s->gw, s->gx, s->gy, s->gt, err)))
        return rc;
    gate_job gj = {s->eg, s->eu, 0, gate_vec(0)};
    fwd_par(m, (long)s->cnt[c->n_expert - 1] * ff, GATE_GRAIN, gate_run, &gj);
    int g = 0;
    for (int e = 0; e < c->n_expert; e++) {
        int r0 = e ? s->cnt[e - 1] : 0, t = s->cnt[e] - r0;
        if (t == 0)
            continue;
        s->gw[g] = &ex0[3 * e + 2];
        s->gx[g] = s->eg + (size_t)r0 * ff;
        s->gy[g] = s->ed + (size_t)r0 * dim;
        s->gt[g++] = t;
    }
    return m->be->matmul_grouped(m->be, g, s->gw, s->gx, s->gy, s->gt, err);
}

/* The per-token parts of a sparse layer around its products, a token per
 * item (on the backend's threads for prefill chunks): the routing, the
 * copies of its inputs into the grouped rows, and the weighted sum of its
 * experts' outputs. */
typedef struct moe_job {
    const model_config *c;
    model_scratch *s;
    const model_layer *L;
} moe_job;

static void moe_route_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    moe_job *j = ctx;
    int E = j->c->n_expert, K = j->c->n_expert_used;
    for (long t = b; t < e; t++) {
        float *p = j->s->rl + (size_t)t * E;
        if (j->L->router_b) /* the router's bias, added to its product as nn.Linear does */
            for (int x = 0; x < E; x++)
                p[x] += j->L->router_b[x];
        if (j->c->moe == MOE_GPT_OSS)
            moe_route_topk_softmax(j->c, p, j->s->sel + (size_t)t * K, j->s->wt + (size_t)t * K);
        else
            moe_route(j->c, p, j->s->sel + (size_t)t * K, j->s->wt + (size_t)t * K);
    }
}

/* gpt_oss's expert activation for grouped elements [b, e) (row-major over
 * rows x n_ff_expert): the row's gate and up products plus its expert's
 * biases - gate g = column 2i and up u = column 2i + 1 of one gate_up
 * product (interleaved, as the hub stores them), or g and u from the
 * separate gate and up products (split: MLX's layout) - then
 * g = min(g, limit), u = clamp(u, -limit, limit) and
 * (u + 1) * g * sigmoid(alpha * g) - transformers' GptOssExperts, in its
 * order of operations. Into s->eu (in place where split: each element reads
 * only its own). */
typedef struct swiglu_job {
    const model_config *c;
    const model_layer *L;
    const model_scratch *s;
    int split;
} swiglu_job;

static void swiglu_clamp_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    const swiglu_job *j = ctx;
    const model_scratch *s = j->s;
    long ff = j->c->n_ff_expert;
    float lim = j->c->swiglu_limit, alpha = j->c->swiglu_alpha;
    for (long i = b; i < e; i++) {
        long r = i / ff, c = i % ff;
        const float *bias = j->L->exp_b_gu + (size_t)s->rexp[r] * 2 * ff;
        float g, u;
        if (j->split) {
            g = s->eg[i] + bias[2 * c];
            u = s->eu[i] + bias[2 * c + 1];
        } else {
            const float *y = s->eg + (size_t)r * 2 * ff;
            g = y[2 * c] + bias[2 * c];
            u = y[2 * c + 1] + bias[2 * c + 1];
        }
        g = g > lim ? lim : g;
        u = u > lim ? lim : u < -lim ? -lim : u;
        float glu = g * (1.0f / (1.0f + expf(-(g * alpha))));
        s->eu[i] = (u + 1.0f) * glu;
    }
}

/* The chosen experts' products of a gpt_oss layer over their grouped rows:
 * every gate_up (one product, 2 * n_ff_expert rows; split: a gate product
 * into s->eg and an up product into s->eu, n_ff_expert rows each), the
 * clamped SwiGLU into s->eu, every down into s->ed (its bias joins in
 * moe_combine_run). */
static int moe_gpt_oss(tern_model *m, int l, int T, tern_err *err)
{
    const model_config *c = &m->cfg;
    const model_layer *L = &m->layers[l];
    model_scratch *s = m->scratch;
    const model_weight *ex0 = L->experts;
    int dim = c->dim, ff = c->n_ff_expert, rc, split = ex0[1].n_out != 0;
    for (int pass = 0; pass < 2; pass++) {
        int n = 0;
        for (int e = 0; e < c->n_expert; e++) {
            int r0 = e ? s->cnt[e - 1] : 0, t = s->cnt[e] - r0;
            if (t == 0)
                continue;
            if (pass == 0 && (rc = model_experts_touch(m, l, e, err)))
                return rc;
            s->gw[n] = &ex0[3 * e + 2 * pass];
            s->gx[n] = pass ? s->eu + (size_t)r0 * ff : moe_in(s, T, r0, dim);
            s->gy[n] = pass ? s->ed + (size_t)r0 * dim : s->eg + (size_t)r0 * (split ? 1 : 2) * ff;
            s->gt[n++] = t;
            if (pass == 0 && split) { /* up beside gate: one grouped job for both */
                s->gw[n] = &ex0[3 * e + 1];
                s->gx[n] = s->gx[n - 1];
                s->gy[n] = s->eu + (size_t)r0 * ff;
                s->gt[n++] = t;
            }
        }
        rc = 0;
        if (m->be->matmul_grouped)
            rc = m->be->matmul_grouped(m->be, n, s->gw, s->gx, s->gy, s->gt, err);
        else
            for (int k = 0; k < n && !rc; k++)
                rc = m->be->matmul(m->be, 1, &s->gw[k], s->gx[k], &s->gy[k], s->gt[k], err);
        if (rc)
            return rc;
        if (pass == 0) {
            swiglu_job sj = {c, L, s, split};
            fwd_par(m, (long)s->cnt[c->n_expert - 1] * ff, GATE_GRAIN, swiglu_clamp_run, &sj);
        }
    }
    return 0;
}

static void moe_gather_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    moe_job *j = ctx;
    int K = j->c->n_expert_used, dim = j->c->dim;
    for (long t = b; t < e; t++)
        for (int k = 0; k < K; k++)
            memcpy(j->s->xg + (size_t)j->s->row[t * K + k] * dim, j->s->xn + (size_t)t * dim,
                   (size_t)dim * sizeof(float));
}

static void moe_combine_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    moe_job *j = ctx;
    const model_scratch *s = j->s;
    int K = j->c->n_expert_used, dim = j->c->dim;
    for (long t = b; t < e; t++) {
        float *o = s->tmp + (size_t)t * dim;
        memset(o, 0, (size_t)dim * sizeof(float));
        for (int k = 0; k < K; k++) {
            const float *y = s->ed + (size_t)s->row[t * K + k] * dim;
            float wk = s->wt[t * K + k];
            if (j->L->exp_b_down) { /* gpt_oss: the down product's bias, then the weight */
                const float *bd = j->L->exp_b_down + (size_t)s->sel[t * K + k] * dim;
                for (int d = 0; d < dim; d++)
                    o[d] += (y[d] + bd[d]) * wk;
                continue;
            }
            for (int d = 0; d < dim; d++)
                o[d] += y[d] * wk;
        }
    }
}

/* A sparse layer's MLP: s->xn[T][dim] in, s->tmp[T][dim] out. Tokens are
 * grouped by expert (in token order within an expert), so each chosen
 * expert's weights are read once for all its tokens; every (token, expert)
 * product is the backend's batch-independent one, and each token sums its
 * experts in id order, so a token's output does not depend on the batch. */
static int moe_mlp(tern_model *m, int l, int T, tern_err *err)
{
    const model_config *c = &m->cfg;
    const model_layer *L = &m->layers[l];
    model_scratch *s = m->scratch;
    int E = c->n_expert, K = c->n_expert_used, dim = c->dim;
    model_experts_settle(m); /* the last layer's products are done */
    int rc = matmul(m, &L->router, s->xn, s->rl, T, err);
    if (rc)
        return rc;
    moe_job j = {c, s, L};
    fwd_par(m, T, ROWS_GRAIN / (4L * E) + 1, moe_route_run, &j);
    memset(s->cnt, 0, (size_t)(E + 1) * sizeof(int));
    for (int t = 0; t < T * K; t++)
        s->cnt[s->sel[t] + 1]++;
    for (int e = 0; e < E; e++) /* cnt[e]: first row of expert e */
        s->cnt[e + 1] += s->cnt[e];
    for (int t = 0; t < T * K; t++)
        s->row[t] = s->cnt[s->sel[t]]++;
    if (c->moe == MOE_GPT_OSS) /* each row's expert, for its biases */
        for (int t = 0; t < T * K; t++)
            s->rexp[s->row[t]] = s->sel[t];
    /* now cnt[e] is one past expert e's last row: expert e holds [cnt[e-1], cnt[e]) */
    if (T > 1) /* one token: moe_in */
        fwd_par(m, T, ROWS_GRAIN / ((long)K * dim) + 1, moe_gather_run, &j);
    if ((rc = c->moe == MOE_GPT_OSS      ? moe_gpt_oss(m, l, T, err)
              : m->be->matmul_grouped ? moe_grouped(m, l, T, err)
                                      : moe_each(m, l, T, err)))
        return rc;
    fwd_par(m, T, ROWS_GRAIN / ((long)K * dim) + 1, moe_combine_run, &j);
    return 0;
}

/* ---- the checks and bookkeeping every way in shares ---- */

/* The batch's contract (model.h): ids in the vocabulary, positions
 * reserved, output rows in the batch. */
static int batch_check(const tern_model *m, const kv_pool *kv, const fwd_batch *b, tern_err *err)
{
    const model_config *c = &m->cfg;
    if (!kv->k && kv->layers) { /* a typed pool: types this backend reads, heads of this model */
        unsigned mask = m->be->kv_types ? m->be->kv_types : 1u << KV_F32;
        for (int l = 0; l < kv->n_layer && l < c->n_layer; l++) {
            kv_type t = kv->layers[l].type, ts = kv->layers[l].sink_type;
            if (!(mask & (1u << t)) || !(mask & (1u << ts)))
                return tern_err_set(err, TERN_EUNSUPPORTED, "the %s backend has no %s KV cache", m->be->name,
                                    kv_type_name(mask & (1u << t) ? ts : t));
            if ((t != KV_F32 || ts != KV_F32) && (kv->head_dim != c->head_dim || kv->n_layer != c->n_layer))
                return tern_err_set(err, TERN_EINVAL, "the KV pool's shape does not match the model");
        }
    }
    for (int i = 0; i < b->n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->n_vocab)
            return tern_err_set(err, TERN_ERANGE, "token id %d is outside the vocabulary (%d)", b->tokens[i],
                                c->n_vocab);
        if (b->pos[i] < 0 || b->pos[i] >= b->seqs[i]->n_blocks * kv->block_size)
            return tern_err_set(err, TERN_EINVAL, "position %d is not reserved in the KV cache", b->pos[i]);
    }
    for (int j = 0; j < b->n_out; j++)
        if (b->out_rows[j] < 0 || b->out_rows[j] >= b->n)
            return tern_err_set(err, TERN_EINVAL, "output row %d is outside the batch", b->out_rows[j]);
    return 0;
}

/* Each sequence now holds KV through its largest position in the batch. */
static void batch_commit(const fwd_batch *b)
{
    for (int i = 0; i < b->n; i++)
        if (b->seqs[i]->n_tokens < b->pos[i] + 1)
            b->seqs[i]->n_tokens = b->pos[i] + 1;
}

static int forward_host(tern_model *m, kv_pool *kv, const fwd_batch *b, const model_lora *const *lora,
                        float *logits, const fwd_hidden *hid, tern_err *err);

int model_forward(tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits, tern_err *err)
{
    return model_forward_hidden(m, kv, b, logits, NULL, err);
}

int model_forward_hidden(tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits, const fwd_hidden *hid,
                         tern_err *err)
{
    return model_forward_lora(m, kv, b, NULL, logits, hid, err);
}

int model_forward_lora(tern_model *m, kv_pool *kv, const fwd_batch *b, const model_lora *const *lora, float *logits,
                       const fwd_hidden *hid, tern_err *err)
{
    int n_hid = hid ? hid->n : 0;
    if (b->n <= 0)
        return 0;
    int rc = batch_check(m, kv, b, err);
    if (rc)
        return rc;
    for (int j = 0; j < n_hid; j++)
        if (hid->rows[j] < 0 || hid->rows[j] >= b->n)
            return tern_err_set(err, TERN_EINVAL, "hidden-state row %d is outside the batch", hid->rows[j]);
    if (n_hid > 0 && m->be->forward)
        return tern_err_set(err, TERN_EUNSUPPORTED, "the %s backend does not return hidden states", m->be->name);
    int any_lora = 0;
    for (int i = 0; lora && i < b->n && !any_lora; i++)
        any_lora = lora[i] != NULL;
    if (!any_lora)
        lora = NULL;
    else if ((rc = model_lora_supported(m, err)))
        return rc;
    if (m->be->forward && m->be->lora_rows && (rc = m->be->lora_rows(m->be, lora, b->n, err)))
        return rc;
    /* a device-resident forward (backend.h), else the layers here */
    rc = m->be->forward ? m->be->forward(m->be, m, kv, b, logits, err)
                        : forward_host(m, kv, b, lora, logits, hid, err);
    if (rc)
        return rc;
    batch_commit(b);
    return 0;
}

/* ---- the forward in two halves (model.h) ---- */

void model_caps_get(const tern_model *m, model_caps *caps)
{
    const model_backend *be = m->be;
    caps->device_kv = be->forward && be->mem_reserve && be->kv_bind;
    caps->device_argmax = be->forward_start && be->argmax_finish && be->logits_finish;
    caps->device_sample = caps->device_argmax && be->sample_finish;
}

static int lacks(const tern_model *m, const char *what, tern_err *err)
{
    return tern_err_set(err, TERN_EUNSUPPORTED, "the %s backend has no %s", m->be->name, what);
}

int model_forward_start(tern_model *m, kv_pool *kv, const fwd_batch *b, tern_err *err)
{
    return model_forward_start_lora(m, kv, b, NULL, err);
}

int model_forward_start_lora(tern_model *m, kv_pool *kv, const fwd_batch *b, const model_lora *const *lora,
                             tern_err *err)
{
    if (!m->be->forward_start)
        return lacks(m, "device forward", err);
    int rc = batch_check(m, kv, b, err);
    if (rc)
        return rc;
    int any_lora = 0;
    for (int i = 0; lora && i < b->n && !any_lora; i++)
        any_lora = lora[i] != NULL;
    if (!any_lora)
        lora = NULL;
    else if ((rc = model_lora_supported(m, err)))
        return rc;
    if (m->be->lora_rows && (rc = m->be->lora_rows(m->be, lora, b->n, err)))
        return rc;
    if ((rc = m->be->forward_start(m->be, m, kv, b, err)))
        return rc;
    batch_commit(b);
    return 0;
}

int model_forward_argmax(tern_model *m, const uint32_t *masks, int32_t n_words, const uint8_t *mask_on, int32_t *ids,
                         tern_err *err)
{
    if (!m->be->argmax_finish)
        return lacks(m, "device argmax", err);
    return m->be->argmax_finish(m->be, masks, n_words, mask_on, ids, err);
}

int model_forward_sample(tern_model *m, const dev_sample_row *rows, const uint32_t *masks, int32_t n_words,
                         const uint8_t *mask_on, int32_t *ids, tern_err *err)
{
    if (!m->be->sample_finish)
        return lacks(m, "device sampler", err);
    return m->be->sample_finish(m->be, rows, masks, n_words, mask_on, ids, err);
}

int model_forward_logits(tern_model *m, float *logits, tern_err *err)
{
    if (!m->be->logits_finish)
        return lacks(m, "device forward", err);
    return m->be->logits_finish(m->be, logits, err);
}

int model_mem_reserve(tern_model *m, int max_t, int max_out, size_t *free_bytes, size_t *total_bytes,
                      tern_err *err)
{
    if (!m->be->mem_reserve)
        return lacks(m, "device memory", err);
    return m->be->mem_reserve(m->be, max_t, max_out, free_bytes, total_bytes, err);
}

int model_kv_bind(tern_model *m, kv_pool *kv, tern_err *err)
{
    if (!m->be->kv_bind)
        return lacks(m, "device KV", err);
    return m->be->kv_bind(m->be, kv, err);
}

/* ---- the layers on the host, products and attention through the backend ---- */

/* The forward of a checked batch of T >= 1 tokens (model_forward_lora's
 * contract, n_tokens left to the caller); lora NULL when no row has an
 * adapter, else each adapted product gets its rows' low-rank updates right
 * after it (lora.c), before biases and norms, as PEFT adds them to the base
 * layer's output. */
static int forward_host(tern_model *m, kv_pool *kv, const fwd_batch *b, const model_lora *const *lora,
                        float *logits, const fwd_hidden *hid, tern_err *err)
{
    int n_hid = hid ? hid->n : 0;
    const model_config *c = &m->cfg;
    int T = b->n;
    int rc = scratch_ensure(m, T, b->n_out, err);
    if (rc)
        return rc;
    model_scratch *s = m->scratch;
    int dim = c->dim, hd = c->head_dim;

    for (int i = 0; i < T; i++) {
        float *x = s->x + (size_t)i * dim;
        model_weight_row(&m->embed, b->tokens[i], x);
        if (c->embed_scale > 0)
            for (int e = 0; e < dim; e++)
                x[e] *= c->embed_scale;
    }

    norm_rows(m, s->xn, s->x, NULL, m->layers[0].attn_norm, dim, T);
    for (int l = 0; l < c->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        {
            const model_weight *w[3] = {&L->wq, &L->wk, &L->wv};
            float *y[3] = {s->q, s->k, s->v};
            if ((rc = m->be->matmul(m->be, 3, w, s->xn, y, T, err)))
                return rc;
            for (int k = 0; lora && k < 3; k++)
                if ((rc = model_lora_apply(m, lora, T, l, LORA_Q + k, s->xn, y[k], err)))
                    return rc;
        }
        qkv_job qj = {c, L, kv, b, s, l};
        fwd_par(m, T, 1, qkv_run, &qj);
        model_attn at = {kv, b, l, c->n_head, c->n_kv_head, hd, L->window, c->attn_scale, c->attn_softcap,
                         s->q, s->att, L->sinks};
        if ((rc = m->be->attention(m->be, &at, err)) || (rc = matmul(m, &L->wo, s->att, s->tmp, T, err)) ||
            (rc = model_lora_apply(m, lora, T, l, LORA_O, s->att, s->tmp, err)))
            return rc;
        if (L->bo) { /* o_proj's bias (gpt_oss), with the product as nn.Linear adds it */
            bias_job bj = {s->tmp, L->bo, dim};
            fwd_par(m, T, ROWS_GRAIN / dim + 1, bias_run, &bj);
        }
        if (L->post_attn_norm)
            norm_rows(m, s->tmp, s->tmp, NULL, L->post_attn_norm, dim, T);
        norm_rows(m, s->xn, s->x, s->tmp, L->ffn_norm, dim, T); /* x += attention; xn = norm(x) */
        if ((rc = L->experts ? moe_mlp(m, l, T, err) : dense_mlp(m, l, lora, T, err)))
            return rc;
        if (L->post_ffn_norm)
            norm_rows(m, s->tmp, s->tmp, NULL, L->post_ffn_norm, dim, T);
        /* x += MLP, and the next layer's input norm */
        norm_rows(m, l + 1 < c->n_layer ? s->xn : NULL, s->x, s->tmp,
                  l + 1 < c->n_layer ? m->layers[l + 1].attn_norm : NULL, dim, T);
    }

    for (int j = 0; j < n_hid; j++) /* embeddings: the final-normed states, no head */
        rmsnorm(hid->out + (size_t)j * dim, s->x + (size_t)hid->rows[j] * dim, m->final_norm, dim, c->norm_eps);
    for (int j = 0; j < b->n_out; j++)
        rmsnorm(s->xo + (size_t)j * dim, s->x + (size_t)b->out_rows[j] * dim, m->final_norm, dim, c->norm_eps);
    if (b->n_out > 0) {
        if ((rc = matmul(m, &m->lm_head, s->xo, logits, b->n_out, err)))
            return rc;
        if (c->final_softcap > 0)
            for (size_t e = 0; e < (size_t)b->n_out * c->n_vocab; e++)
                logits[e] = c->final_softcap * tanhf(logits[e] / c->final_softcap);
    }
    return 0;
}
