/* The CUDA backend's mixture-of-experts layers (backend_cuda_moe.h; the
 * kernels: src/tensor/cuda/moe.cu). The kernels find expert e's matrices
 * through a device table of pointers per layer ([n_expert][6]: gate, up,
 * down, then their {scale, bias} pairs), so where an expert lives can
 * change between steps without a new launch or graph:
 *
 * - default: every layer's experts go up stacked per matrix (gate
 *   [n_expert][ff][dim], up alike, down [n_expert][dim][ff], pairs alike),
 *   the table pointing into them;
 * - --experts-in host: every expert is copied once into pinned host memory
 *   (one block an expert: its three matrices and their pairs), which the
 *   GPU reads in place (mapped, over the host link), and a cache of
 *   --expert-cache bytes in device memory holds the most recently used
 *   ones. After each step the host reads which experts the step picked
 *   (flags the kernels set) and how many picks were read from the cache:
 *   picked experts move to the front of an LRU, and - when the previous
 *   batch of copies is done - the step's missed experts are copied into
 *   cache slots on a copy stream, evicting from the back, while the next
 *   step computes. An evicted expert's table entry points back to host
 *   memory before the step that follows (on the compute stream, ahead of
 *   it), and a copied one's entry is switched to its slot after its bytes
 *   land (on the copy stream), so every read sees whole weights. The
 *   counters go to the model's (model_experts_add: /stats, /metrics, the
 *   exit log).
 *
 * Built only with TERN_CUDA. */
#ifdef TERN_CUDA

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/log.h"
#include "model/backend_cuda_moe.h"
#include "model/model_int.h"
#include "tensor/cuda/cuda_moe.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"

#define ALIGN(n) (((n) + 255) & ~(size_t)255)

struct cu_moe {
    const tern_model *m;
    int n_layer;
    tcu_experts *layers; /* [n_layer]; n_expert 0 in dense layers */
    void **allocs;
    int n_allocs, cap_allocs;
    tcu_moe_scratch s;
    int cap_t;
    int E, K, dim, ff;
    cudaStream_t stream;
    /* --experts-in host */
    int host;
    size_t off[6], block;      /* a block's matrices and pairs (offsets), its bytes */
    unsigned char *pinned;     /* [n_layer * E] blocks (sparse layers' ids only) */
    const void **tab_pin;      /* pinned mirror of the device tables: [n_layer * E][6] */
    const void **tab_dev;      /* the device tables, one allocation */
    unsigned char *cache;      /* device slots [n_slots][block] */
    int n_slots, n_free, *free_slots;
    int *slot_of, *prev, *next, head, tail; /* per id (layer * E + e): slot or -1, the LRU (-1 ends) */
    unsigned char *used_dev, *used_host; /* [n_layer * E] */
    unsigned long long *count_dev, *count_host; /* [2] picks from the cache / from host memory */
    int pending;               /* a step's flags and counts are on their way to the host */
    cudaStream_t copy;
    cudaEvent_t tab_done, copy_start, copy_done;
    int copying;               /* copy_start / copy_done bracket a batch not yet accounted */
    size_t copy_bytes;
};

/* An expert matrix's bytes in device memory as stored: its codes / values,
 * and its scales - MLX's f32 {scale, bias} pairs, or MXFP4's E8M0 bytes. */
static size_t wbytes(const model_weight *w)
{
    return w->mx      ? (size_t)w->n_out * w->n_in / 2
           : w->qbits ? (size_t)w->n_out * w->n_in * w->qbits / 8
                      : (size_t)w->n_out * w->n_in * tern_dtype_size(w->dtype);
}

static size_t sb_bytes(const model_weight *w)
{
    return w->mx ? (size_t)w->n_out * (w->n_in / 32)
                 : w->qbits ? (size_t)w->n_out * (w->n_in / w->group) * 2 * sizeof(float) : 0;
}

static const void *sb_of(const model_weight *w) { return w->mx ? (const void *)w->mx : (const void *)w->sb; }

static int kind_of(const model_weight *w)
{
    return w->mx ? TCU_MX4 : w->qbits == 4 ? TCU_Q4 : w->qbits == 8 ? TCU_Q8 : w->dtype == TERN_BF16 ? TCU_BF16 : w->dtype == TERN_F16 ? TCU_F16 : TCU_F32;
}

/* A block of one expert: gate, up, down, then their pairs, each 256-aligned. */
static size_t block_layout(const model_weight *ex, size_t off[6])
{
    size_t o = 0;
    for (int k = 0; k < 6; k++) {
        off[k] = o;
        o += ALIGN(k < 3 ? wbytes(&ex[k]) : sb_bytes(&ex[k - 3]));
    }
    return o;
}

static int experts_host(const tern_model *m, size_t *cache_bytes)
{
    model_experts_stats st;
    if (model_experts_stats_get(m, &st) || st.where != MODEL_EXPERTS_HOST)
        return 0;
    *cache_bytes = st.cache_bytes;
    return 1;
}

/* gpt_oss: the device kind of a layer's experts - their dtype, or TCU_MX4
 * for MXFP4 (the blocks' codes and scale bytes as stored) - and the bytes
 * of a row of n elements (codes; scale_bytes: MXFP4's scales). */

/* gpt_oss experts in mlx-lm's layout (separate gate / up / down, dense or
 * MLX-quantized): they go up as the other families' experts do. */
static int gpt_oss_split(const tern_model *m)
{
    for (int l = 0; l < m->cfg.n_layer; l++)
        if (m->layers[l].experts)
            return m->layers[l].experts[1].n_out != 0;
    return 0;
}
static size_t row_size(int kind, size_t n) { return kind == TCU_F32 ? 4 * n : kind == TCU_MX4 ? n / 2 : 2 * n; }
static size_t scale_bytes(int kind, size_t n) { return kind == TCU_MX4 ? n / 32 : 0; }

/* A gpt_oss expert's block, as the device reads it: gate [ff][dim], up
 * [ff][dim] (gate_up's interleaved rows split), down [dim][ff], then their
 * scale bytes (MXFP4), each 256-aligned; off as block_layout's. */
static size_t gpt_oss_block(const tern_model *m, int kind, size_t off[6])
{
    const size_t dim = (size_t)m->cfg.dim, ff = (size_t)m->cfg.n_ff_expert;
    const size_t sz[6] = {ff * row_size(kind, dim),    ff * row_size(kind, dim),    dim * row_size(kind, ff),
                          ff * scale_bytes(kind, dim), ff * scale_bytes(kind, dim), dim * scale_bytes(kind, ff)};
    size_t o = 0;
    for (int k = 0; k < 6; k++) {
        off[k] = o;
        o += ALIGN(sz[k]);
    }
    return o;
}

/* The biases of a gpt_oss layer on the device: gate [E][ff], up [E][ff],
 * down [E][dim], router [E]. */
static size_t gpt_oss_bias_bytes(const tern_model *m)
{
    const size_t E = (size_t)m->cfg.n_expert;
    return (E * (2 * (size_t)m->cfg.n_ff_expert + m->cfg.dim) + E) * sizeof(float);
}

size_t cu_moe_bytes(const tern_model *m)
{
    size_t n = 0, cache = 0;
    const int host = experts_host(m, &cache);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        if (!L->experts)
            continue;
        n += wbytes(&L->router) + sb_bytes(&L->router);
        if (m->cfg.moe == MOE_GPT_OSS)
            n += gpt_oss_bias_bytes(m);
        if (m->cfg.moe == MOE_GPT_OSS && !gpt_oss_split(m)) {
            size_t off[6];
            n += host ? 0 : (size_t)m->cfg.n_expert * gpt_oss_block(m, kind_of(&L->experts[0]), off);
            continue;
        }
        for (int i = 0; !host && i < 3 * m->cfg.n_expert; i++)
            n += wbytes(&L->experts[i]) + sb_bytes(&L->experts[i]);
    }
    return n + (host ? cache : 0);
}

static int moe_alloc(cu_moe *x, void **p, size_t bytes, tern_err *err)
{
    *p = NULL;
    if (x->n_allocs == x->cap_allocs) {
        int cap = x->cap_allocs ? 2 * x->cap_allocs : 64;
        void **na = realloc(x->allocs, (size_t)cap * sizeof *na);
        if (!na)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        x->allocs = na;
        x->cap_allocs = cap;
    }
    if (cudaMalloc(p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return tern_err_set(err, TERN_ENOMEM, "cuda: out of memory for experts: %zu MB wanted, %zu MB free of %zu MB",
                            bytes >> 20, fr >> 20, tot >> 20);
    }
    x->allocs[x->n_allocs++] = *p;
    return 0;
}

static void moe_free_one(cu_moe *x, void *p)
{
    if (!p)
        return;
    for (int i = 0; i < x->n_allocs; i++)
        if (x->allocs[i] == p) {
            x->allocs[i] = x->allocs[--x->n_allocs];
            break;
        }
    cudaFree(p);
}

#define CUX(call, what)                                                                                            \
    do {                                                                                                           \
        cudaError_t ce_ = (call);                                                                                  \
        if (ce_ != cudaSuccess)                                                                                    \
            return tern_err_set(err, TERN_EIO, "cuda: %s: %s", what, cudaGetErrorString(ce_));                    \
    } while (0)

/* One matrix up (its bytes, then its pairs) into dst / sb_dst. */
static int up_one(const model_weight *w, uint8_t *dst, void *sb_dst, cudaStream_t s, tern_err *err)
{
    /* the mapping is pageable memory: the copy is on the stream (cudaMemcpy
     * may return before its DMA lands, and the stream would not wait) */
    CUX(cudaMemcpyAsync(dst, w->data, wbytes(w), cudaMemcpyHostToDevice, s), "expert upload");
    if (sb_bytes(w))
        CUX(cudaMemcpyAsync(sb_dst, sb_of(w), sb_bytes(w), cudaMemcpyHostToDevice, s), "expert upload");
    return 0;
}

/* Row r of expert weight w into dst (and MXFP4's scale bytes into sdst):
 * the stored row's bytes. */
static void gpt_oss_row(const model_weight *w, int r, uint8_t *dst, uint8_t *sdst)
{
    if (!w->mx) {
        const size_t es = tern_dtype_size(w->dtype);
        memcpy(dst, (const char *)w->data + (size_t)r * w->n_in * es, (size_t)w->n_in * es);
        return;
    }
    memcpy(dst, (const uint8_t *)w->data + (size_t)r * (w->n_in / 2), (size_t)w->n_in / 2);
    memcpy(sdst, w->mx + (size_t)r * (w->n_in / 32), (size_t)w->n_in / 32);
}

/* Expert ex of layer L into its block b (gpt_oss_block's layout). */
static void gpt_oss_fill(const tern_model *m, const model_layer *L, int ex, int kind, const size_t off[6], uint8_t *b)
{
    const int dim = m->cfg.dim, ff = m->cfg.n_ff_expert;
    const size_t rs_gu = row_size(kind, dim), ss_gu = scale_bytes(kind, dim);
    const size_t rs_dn = row_size(kind, ff), ss_dn = scale_bytes(kind, ff);
    const model_weight *gu = &L->experts[3 * ex], *dn = &L->experts[3 * ex + 2];
    for (int r = 0; r < ff; r++) {
        gpt_oss_row(gu, 2 * r, b + off[0] + r * rs_gu, b + off[3] + r * ss_gu);
        gpt_oss_row(gu, 2 * r + 1, b + off[1] + r * rs_gu, b + off[4] + r * ss_gu);
    }
    for (int r = 0; r < dim; r++)
        gpt_oss_row(dn, r, b + off[2] + r * rs_dn, b + off[5] + r * ss_dn);
}

/* gpt_oss's routing and activation fields of layer l's tcu_experts, and
 * its biases on the device: gate [E][ff] and up [E][ff] (exp_b_gu's
 * interleaved pairs split), down [E][dim], router [E]. */
static int gpt_oss_extras(cu_moe *x, const tern_model *m, int l, tern_err *err)
{
    const model_config *c = &m->cfg;
    const model_layer *L = &m->layers[l];
    tcu_experts *e = &x->layers[l];
    const int E = c->n_expert, ff = c->n_ff_expert, dim = c->dim;
    if (!L->exp_b_gu || !L->exp_b_down || !L->router_b)
        return tern_err_set(err, TERN_EINVAL, "cuda: gpt_oss layer %d without its expert or router biases", l);
    e->norm_topk = 0;
    e->topk_softmax = 1;
    e->swiglu_clamp = 1;
    e->swiglu_limit = c->swiglu_limit;
    e->swiglu_alpha = c->swiglu_alpha;
    int rc;
    float *bias, *hb = malloc(gpt_oss_bias_bytes(m));
    if (!hb)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    if ((rc = moe_alloc(x, (void **)&bias, gpt_oss_bias_bytes(m), err))) {
        free(hb);
        return rc;
    }
    float *bg = hb, *bu = hb + (size_t)E * ff, *bd = hb + (size_t)2 * E * ff, *br = bd + (size_t)E * dim;
    for (size_t i = 0; i < (size_t)E * ff; i++) {
        bg[i] = L->exp_b_gu[2 * i];
        bu[i] = L->exp_b_gu[2 * i + 1];
    }
    memcpy(bd, L->exp_b_down, (size_t)E * dim * sizeof(float));
    memcpy(br, L->router_b, (size_t)E * sizeof(float));
    if (cudaMemcpyAsync(bias, hb, gpt_oss_bias_bytes(m), cudaMemcpyHostToDevice, x->stream) != cudaSuccess ||
        cudaStreamSynchronize(x->stream) != cudaSuccess)
        rc = tern_err_set(err, TERN_EIO, "cuda: expert bias upload");
    free(hb);
    if (rc)
        return rc;
    e->b_gate = bias;
    e->b_up = bias + (size_t)E * ff;
    e->b_down = bias + (size_t)2 * E * ff;
    e->router_b = e->b_down + (size_t)E * dim;
    return 0;
}

/* Layer l's gpt_oss experts: each expert's block (gpt_oss_block: gate_up's
 * interleaved rows - gate 2i, up 2i + 1, as the hub stores them and the CPU
 * reads them - split into separate gate and up matrices of the same rows,
 * so the same dot products; down as it is; MXFP4 stays MXFP4, TCU_MX4)
 * built in pinned memory: with experts in host memory that is the expert's
 * pinned block, else a staging block copied to the layer's device memory,
 * the stream synchronized before the next. The biases go to the device:
 * gate_up's split likewise, down's and the router's as they are. */
static int layer_up_gpt_oss(cu_moe *x, const tern_model *m, int l, tern_err *err)
{
    const model_config *c = &m->cfg;
    const model_layer *L = &m->layers[l];
    tcu_experts *e = &x->layers[l];
    const int E = c->n_expert, ff = c->n_ff_expert, dim = c->dim;
    const int kind = kind_of(&L->experts[0]);
    for (int ex = 0; ex < E; ex++)
        for (int k = 0; k < 3; k += 2) {
            const model_weight *w = &L->experts[3 * ex + k];
            if (kind_of(w) != kind || (!w->mx && w->qbits) || w->dtype == TERN_F8E4M3)
                return tern_err_set(err, TERN_EUNSUPPORTED,
                                    "cuda: layer %d's experts are stored in more than one form (expert %d)", l, ex);
        }
    size_t off[6];
    const size_t block = gpt_oss_block(m, kind, off);
    if (x->host && block != x->block)
        return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: layer %d's experts are stored in another form", l);
    e->kind = kind;
    e->group = kind == TCU_MX4 ? 32 : 0;
    e->n_expert = E;
    e->n_used = c->n_expert_used;
    e->dim = dim;
    e->ff = ff;
    e->tab = x->tab_dev + (size_t)l * E * 6;
    const void **tab = x->tab_pin + (size_t)l * E * 6;
    int rc = 0;
    uint8_t *d = NULL, *stage = NULL;
    if (x->host) {
        e->used = x->used_dev + (size_t)l * E;
        e->count = x->count_dev;
        e->cache_lo = x->cache;
        e->cache_hi = x->cache + (size_t)x->n_slots * x->block;
    } else {
        if ((rc = moe_alloc(x, (void **)&d, block * E, err)))
            return rc;
        if (cudaMallocHost((void **)&stage, block) != cudaSuccess) {
            cudaGetLastError();
            return tern_err_set(err, TERN_ENOMEM, "cuda: pinned memory to stage the experts");
        }
    }
    for (int ex = 0; ex < E && !rc; ex++) {
        uint8_t *b = x->host ? x->pinned + ((size_t)l * E + ex) * x->block : stage;
        gpt_oss_fill(m, L, ex, kind, off, b);
        uint8_t *at = x->host ? b : d + block * ex;
        for (int k = 0; k < 6; k++)
            tab[6 * ex + k] = k < 3 || kind == TCU_MX4 ? at + off[k] : NULL;
        if (!x->host && (cudaMemcpyAsync(at, stage, block, cudaMemcpyHostToDevice, x->stream) != cudaSuccess ||
                         cudaStreamSynchronize(x->stream) != cudaSuccess))
            rc = tern_err_set(err, TERN_EIO, "cuda: expert upload");
    }
    if (stage)
        cudaFreeHost(stage);
    if (rc)
        return rc;
    return gpt_oss_extras(x, m, l, err);
}

/* Layer l's router up (the rest of layer_up). */
static int router_up(cu_moe *x, const model_layer *L, tcu_experts *e, tern_err *err)
{
    const model_weight *r = &L->router;
    void *d, *sb = NULL;
    int rc;
    if ((rc = moe_alloc(x, &d, wbytes(r), err)) ||
        (r->qbits && (rc = moe_alloc(x, &sb, sb_bytes(r), err))) ||
        (rc = up_one(r, d, sb, x->stream, err)))
        return rc;
    e->router.w = d;
    e->router.sb = sb;
    e->router.n_out = r->n_out;
    e->router.kind = kind_of(r);
    e->router.group = r->qbits ? r->group : 0;
    return 0;
}

/* Layer l's router up, and its experts: stacked in device memory, or (host)
 * copied into their pinned blocks; the layer's table entries in tab_pin. */
static int layer_up(cu_moe *x, const tern_model *m, int l, tern_err *err)
{
    if (m->cfg.moe == MOE_GPT_OSS && !gpt_oss_split(m)) {
        int rc = layer_up_gpt_oss(x, m, l, err);
        return rc ? rc : router_up(x, &m->layers[l], &x->layers[l], err);
    }
    const model_config *c = &m->cfg;
    const model_layer *L = &m->layers[l];
    tcu_experts *e = &x->layers[l];
    const model_weight *e0 = &L->experts[0];
    int kind = kind_of(e0), rc;
    for (int i = 0; i < 3 * c->n_expert; i++) {
        const model_weight *w = &L->experts[i];
        if (kind_of(w) != kind || (w->qbits && w->group != e0->group))
            return tern_err_set(err, TERN_EUNSUPPORTED,
                                "cuda: layer %d's experts are stored in more than one form (expert %d)", l, i / 3);
    }
    e->kind = kind;
    e->group = e0->qbits ? e0->group : e0->mx ? 32 : 0;
    e->n_expert = c->n_expert;
    e->n_used = c->n_expert_used;
    e->dim = c->dim;
    e->ff = c->n_ff_expert;
    e->norm_topk = c->norm_topk;
    if (c->moe == MOE_GPT_OSS && (rc = gpt_oss_extras(x, m, l, err))) /* mlx-lm's layout: gate, up, down as stored */
        return rc;
    e->tab = x->tab_dev + (size_t)l * c->n_expert * 6;
    const void **tab = x->tab_pin + (size_t)l * c->n_expert * 6;
    if (x->host) {
        for (int ex = 0; ex < c->n_expert; ex++) {
            unsigned char *b = x->pinned + ((size_t)l * c->n_expert + ex) * x->block;
            for (int k = 0; k < 3; k++) {
                const model_weight *w = &L->experts[3 * ex + k];
                memcpy(b + x->off[k], w->data, wbytes(w));
                if (sb_bytes(w))
                    memcpy(b + x->off[3 + k], sb_of(w), sb_bytes(w));
                tab[6 * ex + k] = b + x->off[k];
                tab[6 * ex + 3 + k] = sb_bytes(w) ? b + x->off[3 + k] : NULL;
            }
        }
        e->used = x->used_dev + (size_t)l * c->n_expert;
        e->count = x->count_dev;
        e->cache_lo = x->cache;
        e->cache_hi = x->cache + (size_t)x->n_slots * x->block;
    } else {
        for (int k = 0; k < 3; k++) {
            const model_weight *w = &L->experts[k];
            size_t one = wbytes(w), sbn = sb_bytes(w);
            void *d, *sb = NULL;
            if ((rc = moe_alloc(x, &d, one * c->n_expert, err)) ||
                (sbn && (rc = moe_alloc(x, &sb, sbn * c->n_expert, err))))
                return rc;
            for (int ex = 0; ex < c->n_expert; ex++) {
                uint8_t *sbe = sb ? (uint8_t *)sb + sbn * ex : NULL;
                if ((rc = up_one(&L->experts[3 * ex + k], (uint8_t *)d + one * ex, sbe, x->stream, err)))
                    return rc;
                tab[6 * ex + k] = (uint8_t *)d + one * ex;
                tab[6 * ex + 3 + k] = sbe;
            }
        }
    }
    return router_up(x, L, e, err);
}

/* The host mode's buffers: pinned blocks, the cache's slots, the LRU. */
static int host_setup(cu_moe *x, const tern_model *m, size_t cache_bytes, tern_err *err)
{
    const model_config *c = &m->cfg;
    const model_weight *ex = NULL;
    for (int l = 0; l < c->n_layer && !ex; l++)
        ex = m->layers[l].experts;
    x->block = c->moe == MOE_GPT_OSS && !gpt_oss_split(m) ? gpt_oss_block(m, kind_of(ex), x->off)
                                                          : block_layout(ex, x->off);
    size_t ids = (size_t)c->n_layer * c->n_expert, n_sparse = 0;
    for (int l = 0; l < c->n_layer; l++)
        n_sparse += m->layers[l].experts ? (size_t)c->n_expert : 0;
    size_t slots = cache_bytes / x->block;
    x->n_slots = (int)(slots < n_sparse ? slots : n_sparse);
    int rc;
    CUX(cudaMallocHost((void **)&x->pinned, ids * x->block), "pinned expert memory");
    CUX(cudaMallocHost((void **)&x->used_host, ids), "pinned expert memory");
    CUX(cudaMallocHost((void **)&x->count_host, 2 * sizeof(unsigned long long)), "pinned expert memory");
    if ((rc = moe_alloc(x, (void **)&x->cache, (size_t)x->n_slots * x->block, err)) ||
        (rc = moe_alloc(x, (void **)&x->used_dev, ids, err)) ||
        (rc = moe_alloc(x, (void **)&x->count_dev, 2 * sizeof(unsigned long long), err)))
        return rc;
    CUX(cudaMemsetAsync(x->used_dev, 0, ids, x->stream), "expert flags");
    CUX(cudaMemsetAsync(x->count_dev, 0, 2 * sizeof(unsigned long long), x->stream), "expert flags");
    x->slot_of = malloc(ids * sizeof(int));
    x->prev = malloc(ids * sizeof(int));
    x->next = malloc(ids * sizeof(int));
    x->free_slots = malloc(((size_t)x->n_slots + 1) * sizeof(int));
    if (!x->slot_of || !x->prev || !x->next || !x->free_slots)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    for (size_t i = 0; i < ids; i++)
        x->slot_of[i] = -1;
    for (int i = 0; i < x->n_slots; i++)
        x->free_slots[i] = x->n_slots - 1 - i;
    x->n_free = x->n_slots;
    x->head = x->tail = -1;
    CUX(cudaStreamCreateWithFlags(&x->copy, cudaStreamNonBlocking), "copy stream");
    CUX(cudaEventCreateWithFlags(&x->tab_done, cudaEventDisableTiming), "event");
    CUX(cudaEventCreate(&x->copy_start), "event");
    CUX(cudaEventCreate(&x->copy_done), "event");
    TERN_INFO("cuda: experts in pinned host memory (%.2f GB), a cache of %d of %zu in GPU memory (%.2f GB)",
              (double)(n_sparse * x->block) / 1e9, x->n_slots, n_sparse, (double)x->n_slots * x->block / 1e9);
    return 0;
}

int cu_moe_new(const tern_model *m, tcu_stream stream, cu_moe **out, tern_err *err)
{
    const model_config *c = &m->cfg;
    *out = NULL;
    if (!c->n_expert)
        return 0;
    if (c->n_expert > TCU_MOE_MAX_EXPERTS || c->n_expert_used > TCU_MOE_MAX_USED)
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "cuda: %d experts, %d a token (the device routing takes at most %d and %d)", c->n_expert,
                            c->n_expert_used, TCU_MOE_MAX_EXPERTS, TCU_MOE_MAX_USED);
    model_experts_stats st;
    if (model_experts_stats_get(m, &st) == 0 && st.where == MODEL_EXPERTS_DISK)
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "cuda: --experts-in disk is not supported on the CUDA backend (use --experts-in host "
                            "with --expert-cache, or leave the option out)");
    if (c->dim % 8 || c->n_ff_expert % 8)
        return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: expert widths %d x %d (multiples of 8 are needed)", c->dim,
                            c->n_ff_expert);
    for (int l = 0; l < c->n_layer; l++) {
        const model_layer *L = &m->layers[l];
        if (L->experts && L->post_ffn_norm)
            return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: a sparse layer with a post-feed-forward norm");
        for (int i = 0; L->experts && i < 3 * c->n_expert; i++)
            if (L->experts[i].dtype == TERN_F8E4M3 || L->router.dtype == TERN_F8E4M3)
                return tern_err_set(err, TERN_EUNSUPPORTED,
                                    "cuda: FP8 experts are not supported on the GPU yet (the CPU runs them)");
            else if (L->experts[i].qbits && L->experts[i].group % 8)
                return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: expert quantization groups of %d",
                                    L->experts[i].group);
        if (L->experts && L->router.qbits && L->router.group % 8)
            return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: router quantization groups of %d", L->router.group);
    }
    cu_moe *x = calloc(1, sizeof *x);
    if (!x || !(x->layers = calloc((size_t)c->n_layer, sizeof *x->layers))) {
        free(x);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    x->m = m;
    x->n_layer = c->n_layer;
    x->E = c->n_expert;
    x->K = c->n_expert_used;
    x->dim = c->dim;
    x->ff = c->n_ff_expert;
    x->stream = (cudaStream_t)stream;
    size_t ids = (size_t)c->n_layer * c->n_expert, cache = 0;
    x->host = experts_host(m, &cache);
    int rc = 0;
    if (cudaMallocHost((void **)&x->tab_pin, ids * 6 * sizeof(void *)) != cudaSuccess) {
        cudaGetLastError();
        rc = tern_err_set(err, TERN_ENOMEM, "cuda: pinned memory for the expert tables");
    }
    if (!rc)
        memset(x->tab_pin, 0, ids * 6 * sizeof(void *));
    if (!rc)
        rc = moe_alloc(x, (void **)&x->tab_dev, ids * 6 * sizeof(void *), err);
    if (!rc && x->host)
        rc = host_setup(x, m, cache, err);
    for (int l = 0; l < c->n_layer && !rc; l++)
        if (m->layers[l].experts)
            rc = layer_up(x, m, l, err);
    if (!rc && cudaMemcpyAsync(x->tab_dev, x->tab_pin, ids * 6 * sizeof(void *), cudaMemcpyHostToDevice,
                               x->stream) != cudaSuccess)
        rc = tern_err_set(err, TERN_EIO, "cuda: expert tables upload");
    if (rc) {
        cudaStreamSynchronize((cudaStream_t)stream);
        cu_moe_free(x);
        return rc;
    }
    *out = x;
    return 0;
}

int cu_moe_scratch_ensure(cu_moe *x, int T, int *grown, tern_err *err)
{
    *grown = 0;
    if (!x || T <= x->cap_t)
        return 0;
    int ct = T > 2 * x->cap_t ? T : 2 * x->cap_t;
    tcu_moe_scratch *s = &x->s;
    void **bufs[] = {(void **)&s->rl, (void **)&s->wt, (void **)&s->h, (void **)&s->y, (void **)&s->sel,
                     (void **)&s->meta, (void **)&s->cnt};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        moe_free_one(x, *bufs[i]);
        *bufs[i] = NULL;
    }
    x->cap_t = 0;
    *grown = 1;
    size_t tk = (size_t)ct * x->K, tiles = tcu_moe_cnt_len(x->dim, x->E);
    size_t sizes[] = {(size_t)ct * x->E * sizeof(float), tk * sizeof(float), tk * x->ff * sizeof(float),
                      tk * x->dim * sizeof(float), tk * sizeof(int32_t),
                      tcu_moe_meta_len(x->E, x->K, ct) * sizeof(int32_t), tiles * sizeof(int32_t)};
    int rc;
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if ((rc = moe_alloc(x, bufs[i], sizes[i], err)))
            return rc;
    CUX(cudaMemsetAsync(s->cnt, 0, tiles * sizeof(int32_t), x->stream), "expert scratch");
    x->cap_t = ct;
    return 0;
}

int cu_moe_layer_sparse(const cu_moe *x, int l) { return x && l < x->n_layer && x->layers[l].n_expert > 0; }

int cu_moe_run(cu_moe *x, int l, float *xres, const float *norm_g, float eps, float *xn, int T, const tcu_opts *o,
               tcu_stream stream)
{
    if (!cu_moe_layer_sparse(x, l) || T > x->cap_t)
        return (int)cudaErrorInvalidValue;
    return tcu_moe(&x->layers[l], &x->s, xres, norm_g, eps, xn, T, o, stream);
}

/* ---- the host mode's cache, between steps ---- */

static void lru_unlink(cu_moe *x, int id)
{
    int p = x->prev[id], n = x->next[id];
    if (p >= 0)
        x->next[p] = n;
    else
        x->head = n;
    if (n >= 0)
        x->prev[n] = p;
    else
        x->tail = p;
}

static void lru_front(cu_moe *x, int id)
{
    x->prev[id] = -1;
    x->next[id] = x->head;
    if (x->head >= 0)
        x->prev[x->head] = id;
    x->head = id;
    if (x->tail < 0)
        x->tail = id;
}

/* id's table entries at its pinned block (slot < 0) or at slot. */
static void tab_point(cu_moe *x, int id, int slot)
{
    unsigned char *b = slot < 0 ? x->pinned + (size_t)id * x->block : x->cache + (size_t)slot * x->block;
    const void **t = x->tab_pin + (size_t)id * 6;
    for (int k = 0; k < 6; k++)
        t[k] = k < 3 || t[k] ? b + x->off[k] : NULL;
}

int cu_moe_step_begin(cu_moe *x, tern_err *err)
{
    if (!x || !x->host || !x->pending)
        return 0;
    /* the previous step is done (its finish synchronized the stream): its flags and counts are here */
    x->pending = 0;
    const size_t ids = (size_t)x->n_layer * x->E;
    uint64_t hits = x->count_host[0], misses = x->count_host[1];
    double secs = 0, copied = 0;
    int idle = cudaEventQuery(x->copy_done) == cudaSuccess;
    if (!idle)
        cudaGetLastError(); /* cudaErrorNotReady is no failure */
    if (idle && x->copying) {
        float ms = 0;
        if (cudaEventElapsedTime(&ms, x->copy_start, x->copy_done) == cudaSuccess)
            secs = ms / 1e3;
        cudaGetLastError();
        copied = (double)x->copy_bytes;
        x->copying = 0;
    }
    int n_copy = 0;
    int *copy_ids = NULL;
    for (size_t id = 0; id < ids; id++) /* hits first: to the front */
        if (x->used_host[id] && x->slot_of[id] >= 0) {
            lru_unlink(x, (int)id);
            lru_front(x, (int)id);
        }
    for (size_t id = 0; id < ids && idle && x->n_slots > 0; id++) {
        if (!x->used_host[id] || x->slot_of[id] >= 0)
            continue;
        if (x->n_free == 0 && (x->tail < 0 || x->used_host[x->tail]))
            break; /* every cached expert was picked by this step: no room without churn */
        if (!copy_ids && !(copy_ids = malloc(ids * sizeof *copy_ids)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        int slot;
        if (x->n_free > 0) {
            slot = x->free_slots[--x->n_free];
        } else { /* evict the least recently used: its entries back to host memory ahead of the next step */
            int v = x->tail;
            lru_unlink(x, v);
            slot = x->slot_of[v];
            x->slot_of[v] = -1;
            tab_point(x, v, -1);
            CUX(cudaMemcpyAsync((void *)(x->tab_dev + (size_t)v * 6), x->tab_pin + (size_t)v * 6, 6 * sizeof(void *),
                                cudaMemcpyHostToDevice, x->stream),
                "expert table");
        }
        x->slot_of[id] = slot;
        lru_front(x, (int)id);
        copy_ids[n_copy++] = (int)id;
    }
    if (n_copy) { /* on the copy stream, after the evictions' entries: bytes, then the entries */
        CUX(cudaEventRecord(x->tab_done, x->stream), "expert copies");
        CUX(cudaStreamWaitEvent(x->copy, x->tab_done, 0), "expert copies");
        CUX(cudaEventRecord(x->copy_start, x->copy), "expert copies");
        for (int i = 0; i < n_copy; i++) {
            const int id = copy_ids[i], slot = x->slot_of[id];
            CUX(cudaMemcpyAsync(x->cache + (size_t)slot * x->block, x->pinned + (size_t)id * x->block, x->block,
                                cudaMemcpyHostToDevice, x->copy),
                "expert copy");
            tab_point(x, id, slot);
            CUX(cudaMemcpyAsync((void *)(x->tab_dev + (size_t)id * 6), x->tab_pin + (size_t)id * 6,
                                6 * sizeof(void *), cudaMemcpyHostToDevice, x->copy),
                "expert table");
        }
        CUX(cudaEventRecord(x->copy_done, x->copy), "expert copies");
        x->copying = 1;
        x->copy_bytes = (size_t)n_copy * x->block;
    }
    free(copy_ids);
    size_t resident = (size_t)(x->n_slots - x->n_free) * x->block;
    model_experts_add((tern_model *)x->m, hits, misses, copied, secs, resident);
    return 0;
}

int cu_moe_step_end(cu_moe *x, tern_err *err)
{
    if (!x || !x->host)
        return 0;
    const size_t ids = (size_t)x->n_layer * x->E;
    CUX(cudaMemcpyAsync(x->used_host, x->used_dev, ids, cudaMemcpyDeviceToHost, x->stream), "expert flags");
    CUX(cudaMemcpyAsync(x->count_host, x->count_dev, 2 * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                        x->stream),
        "expert flags");
    CUX(cudaMemsetAsync(x->used_dev, 0, ids, x->stream), "expert flags");
    CUX(cudaMemsetAsync(x->count_dev, 0, 2 * sizeof(unsigned long long), x->stream), "expert flags");
    x->pending = 1;
    return 0;
}

void cu_moe_free(cu_moe *x)
{
    if (!x)
        return;
    if (x->copy) {
        cudaStreamSynchronize(x->copy);
        cudaStreamDestroy(x->copy);
    }
    if (x->tab_done)
        cudaEventDestroy(x->tab_done);
    if (x->copy_start)
        cudaEventDestroy(x->copy_start);
    if (x->copy_done)
        cudaEventDestroy(x->copy_done);
    for (int i = 0; i < x->n_allocs; i++)
        cudaFree(x->allocs[i]);
    cudaFreeHost(x->pinned);
    cudaFreeHost(x->used_host);
    cudaFreeHost(x->count_host);
    cudaFreeHost(x->tab_pin);
    free(x->slot_of);
    free(x->prev);
    free(x->next);
    free(x->free_slots);
    free(x->allocs);
    free(x->layers);
    free(x);
    cudaGetLastError();
}

#else

/* ISO C wants a declaration in every translation unit. */
typedef int backend_cuda_moe_unused;

#endif
