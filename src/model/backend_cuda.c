/* The CUDA backend (backend.h; design note docs/cuda.md). Weights live on
 * the GPU in their stored form (bf16/f16/f32, or MLX 4/8-bit with f32
 * {scale, bias} pairs). Two ways in:
 *  - the table (matmul, attention) on host arrays, for tests and as the
 *    generic path: inputs go up, results come down, KV blocks are mirrored
 *    up per call;
 *  - forward: the whole layer stack on the device, activations and a device
 *    mirror of the paged KV pool resident there; only token ids, positions
 *    and block tables go up and only the requested logits come down. Decode
 *    steps (T < gemm_min_t) are captured once per (T, n_out) as CUDA graphs.
 * Products: our GEMV kernels (batch-invariant) for T < gemm_min_t (default
 * 33) and for steps of several sequences up to tc_max_t (128) tokens in
 * the throughput mode, cuBLAS (bf16 inputs, f32 accumulation) above;
 * --exact-products (tcu_opts.exact) keeps f32-exact activations and no
 * cuBLAS.
 * Every choice among kernels is a field of the backend's tcu_opts, filled
 * once when it is made (backend_cuda.h). Without TERN_CUDA this file only
 * provides the "not built" error. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/backend_cuda.h"
#include "model/backend_cuda_moe.h"
#include "model/model_int.h"
#include "tensor/kernels.h"

#ifndef TERN_CUDA

model_backend *model_backend_cuda_new(tern_model *m, int device, tern_err *err)
{
    (void)m;
    (void)device;
    tern_err_set(err, TERN_EUNSUPPORTED, "this tern was built without CUDA (build with make CUDA=1)");
    return NULL;
}

model_backend *model_backend_cuda_new_opts(tern_model *m, int device, const tcu_opts *o, tern_err *err)
{
    (void)o;
    return model_backend_cuda_new(m, device, err);
}

int model_cuda_opts_from_env(tcu_opts *o, tern_err *err)
{
    memset(o, 0, sizeof *o);
    return tern_err_set(err, TERN_EUNSUPPORTED, "this tern was built without CUDA (build with make CUDA=1)");
}

int model_cuda_device_count(void) { return 0; }

#else

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "base/log.h"
#include "model/backend_cuda_kv.h"
#include "model/backend_cuda_lt.h"
#include "model/backend_cuda_lora.h"
#include "model/lora.h"
#include "sample/sample.h"
#include "tensor/cuda/cuda_kernels.h"
#include "tensor/cuda/cuda_sample.h"

/* Captured decode graphs kept (one per T, n_out, wide, fused; all dropped
 * when full): room for every batch size up to tc_max_t, so that a server
 * whose batch changes size every few steps does not capture again and
 * again. */
#define CU_MAX_GRAPHS 160
#define CU_GRAPH_SPLIT 16 /* attention splits inside captured decode graphs */
/* Steps of up to this many tokens, each of another sequence, fuse the q/k/v
 * post-processing into the attention (one launch less a layer: 8B bf16 b1
 * +0.7%, 8B 4-bit +1.7%, 1B +1-2%; at b8 / b32 no gain - docs/cuda.md). */
#define CU_QKV_FUSE_MAX_T 2
/* The other GEMV choices and exact products: every token's splits from its
 * own length (never the batch's longest context, which the eager steps'
 * n_split follows), so a sequence's attention sums are the same alone and
 * in any batch, captured or eager (LoRA steps run eager). */
#define CU_SPLIT_LEN_ONE_RULE 64
/* What mm_dev / mm_dev_norm pass to a product's GEMV launch, from the
 * product's bits in tcu_opts.early and .ring (why down is early and gate/up
 * and down take the ring by default: docs/cuda.md). */
#define CU_OPT_EARLY 1
#define CU_OPT_RING 2

/* Device copies are found by the host weight's identity (addresses, shape,
 * kind): a caller of the table must not reuse a weight's memory for other
 * contents while this backend lives (a model's weights live as long as it). */
typedef struct cu_weight {
    const void *key; /* host data pointer */
    const float *sb_key;
    int n_out, n_in, qbits, group;
    tern_dtype dtype;
    tcu_mat m; /* device copy; m.y unset */
} cu_weight;

typedef struct cu_layer {
    const tcu_mat *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    float *attn_norm, *ffn_norm, *post_attn_norm, *post_ffn_norm, *q_norm, *k_norm, *bq, *bk, *bv, *rope;
    float *sinks; /* [n_head] attention sink logits (gpt_oss), else NULL */
    float *bo;    /* [dim] o_proj bias (gpt_oss), else NULL */
    float rope_af; /* RoPE's cos/sin factor (model_layer.rope_af) */
    /* wq, wk, wv's rows (wg, wu's) one after the other in one allocation
     * (weight_group_get; tcu_opts.lt_cat): one cuBLASLt GEMM for the group */
    int qkv_cat, gu_cat;
} cu_layer;

typedef struct cu_graph {
    int T, n_out, wide, fused;
    cudaGraphExec_t exec;
} cu_graph;

typedef struct cu_backend {
    model_backend base;
    int device;
    cudaStream_t stream;
    cublasHandle_t blas;
    cu_lt *lt; /* cuBLASLt products (tcu_opts.lt) */
    cu_weight *w;
    int n_w, cap_w;
    void **allocs; /* every other device allocation of the model, freed at the end */
    int n_allocs, cap_allocs;
    tern_model *m;
    cu_layer *layers;
    cu_moe *moe; /* the sparse layers' routers and experts (backend_cuda_moe.c), NULL when dense */
    const tcu_mat *embed, *lm_head;
    float *final_norm;
    cu_kvm kvm; /* device KV mirror of the pool of the last forward (backend_cuda_kv.h) */
    cu_kvm_park parked; /* the mirrors of other live pools (kv_ensure) */
    /* forward scratch */
    int cap_t, cap_out;
    float *x, *xn, *q, *k, *v, *att, *gate, *up, *tmp, *xo, *logits, *part;
    /* the merged products' outputs: [T][q + k + v] and [T][2 n_ff] rows (k,
     * v and up lie inside them for the products a matrix at a time) */
    float *qkv, *gu;
    uint16_t *xh, *wdq; /* xh: the cuBLAS path's 16-bit inputs, and the GEMVs' stage (tcu_gemv_args) */
    const float *xh_of; /* xh holds these xh_of_n values rounded (a cuBLASLt GLU's output), for the next product */
    long xh_of_n;
    size_t cap_wdq, cap_xh;
    int32_t *d_in, *h_in; /* device / pinned host: tokens, pos, bt_off, out_rows, blocks */
    size_t cap_in;
    int max_in; /* widest n_in of any weight */
    /* table-path scratch */
    float *tx, *ty;
    uint16_t *txh;
    size_t cap_tx, cap_ty, cap_txh;
    tcu_opts opts; /* filled when the backend is made, read-only after */
    int wide; /* the forward carries two or more sequences (tcu_gemv_args.wide) */
    int fused; /* the forward's attention is tcu_qkv_attention (cu_enqueue) */
    int split_len; /* tcu_attn_args.split_len of the forward (cu_enqueue) */
    int split_tiles; /* split_len is the batch rule's (tcu_opts.split_len): the batch attention tiles apply */
    int tile_off, n_tiles; /* prefill attention tiles in d_in (pack_batch) */
    cu_graph graphs[CU_MAX_GRAPHS];
    int n_graphs;
    /* greedy sampling: device / pinned host [n_out] flags, [n_out][n_words]
     * masks, [n_out] ids; n_out of the forward started, -1 = none */
    int32_t *d_sel, *h_sel;
    size_t cap_sel;
    int pending_out;
    cu_lora *lora; /* the rows' LoRA adapters of the next forward (backend_cuda_lora.c) */
} cu_backend;

static int cu_fail(tern_err *err, int rc, const char *what)
{
    return tern_err_set(err, TERN_EIO, "cuda: %s: %s", what, cudaGetErrorString((cudaError_t)rc));
}

#define CU(call, what)                                                                                             \
    do {                                                                                                           \
        int rc_ = (int)(call);                                                                                     \
        if (rc_)                                                                                                   \
            return cu_fail(err, rc_, what);                                                                        \
    } while (0)

static int cu_alloc(cu_backend *be, void **p, size_t bytes, tern_err *err)
{
    *p = NULL;
    if (be->n_allocs == be->cap_allocs) {
        int cap = be->cap_allocs ? 2 * be->cap_allocs : 64;
        void **na = realloc(be->allocs, (size_t)cap * sizeof *na);
        if (!na)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        be->allocs = na;
        be->cap_allocs = cap;
    }
    if (cudaMalloc(p, bytes ? bytes : 1) != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        return tern_err_set(err, TERN_ENOMEM, "GPU %d is out of memory: %zu MB wanted, %zu MB free of %zu MB",
                            be->device, bytes >> 20, fr >> 20, tot >> 20);
    }
    be->allocs[be->n_allocs++] = *p;
    return 0;
}

static void cu_free_one(cu_backend *be, void *p)
{
    if (!p)
        return;
    for (int i = 0; i < be->n_allocs; i++)
        if (be->allocs[i] == p) {
            be->allocs[i] = be->allocs[--be->n_allocs];
            break;
        }
    cudaFree(p);
}

static int up_vec(cu_backend *be, const float *h, size_t n, float **out, tern_err *err)
{
    *out = NULL;
    if (!h)
        return 0;
    int rc = cu_alloc(be, (void **)out, n * sizeof(float), err);
    if (rc)
        return rc;
    /* on the backend's stream: cudaMemcpy from pageable memory may return
     * before its DMA lands, and the non-blocking stream would not wait */
    CU(cudaMemcpyAsync(*out, h, n * sizeof(float), cudaMemcpyHostToDevice, be->stream), "upload");
    return 0;
}

static size_t host_wbytes(const model_weight *w)
{
    return w->qbits ? (size_t)w->n_out * w->n_in * w->qbits / 8 : (size_t)w->n_out * w->n_in * tern_dtype_size(w->dtype);
}

/* The device copy of w already made, or NULL. */
static const tcu_mat *weight_find(const cu_backend *be, const model_weight *w)
{
    for (int i = 0; i < be->n_w; i++)
        if (be->w[i].key == w->data && be->w[i].sb_key == (w->dtype == TERN_F8E4M3 ? w->fs : w->sb) &&
            be->w[i].n_out == w->n_out &&
            be->w[i].n_in == w->n_in && be->w[i].qbits == w->qbits && be->w[i].group == w->group &&
            be->w[i].dtype == w->dtype)
            return &be->w[i].m;
    return NULL;
}

/* The next entry of the weight table (be->n_w, counted by the caller once
 * the upload is done) for w's device copy at d; the scales are the
 * caller's. */
static cu_weight *weight_entry(cu_backend *be, const model_weight *w, void *d)
{
    cu_weight *cw = &be->w[be->n_w];
    memset(cw, 0, sizeof *cw);
    cw->key = w->data;
    cw->sb_key = w->dtype == TERN_F8E4M3 ? w->fs : w->sb;
    cw->group = w->group;
    cw->dtype = w->dtype;
    cw->n_out = w->n_out;
    cw->n_in = w->n_in;
    cw->qbits = w->qbits;
    cw->m.n_out = w->n_out;
    cw->m.group = w->group;
    cw->m.kind = w->qbits == 4   ? TCU_Q4
                 : w->qbits == 8 ? TCU_Q8
                 : w->dtype == TERN_F8E4M3 ? TCU_F8
                 : w->dtype == TERN_BF16 ? TCU_BF16
                 : w->dtype == TERN_F16  ? TCU_F16
                                         : TCU_F32;
    cw->m.w = d;
    if (w->n_in > be->max_in)
        be->max_in = w->n_in;
    return cw;
}

/* The device copies of n 16-bit weights of one dtype and input size, their
 * rows one after the other in ONE allocation (w[0]'s rows, then w[1]'s,
 * ...), so that one GEMM of sum n_out rows computes all n products
 * (tcu_opts.lt_cat); each out[i] points at its own rows and reads as an
 * upload of its own would. Returns 1 when done, 0 when the group does not
 * qualify (another kind, other shapes, a weight already on the device or
 * twice in the group: the caller uploads them one by one), negative on
 * failure. */
static int weight_group_get(cu_backend *be, const model_weight *const *w, int n, const tcu_mat **out, tern_err *err)
{
    size_t bytes = 0;
    for (int i = 0; i < n; i++) {
        if (w[i]->qbits || (w[i]->dtype != TERN_BF16 && w[i]->dtype != TERN_F16) || w[i]->dtype != w[0]->dtype ||
            w[i]->n_in != w[0]->n_in || w[i]->n_in % 32 || weight_find(be, w[i]))
            return 0;
        for (int j = 0; j < i; j++)
            if (w[j]->data == w[i]->data)
                return 0;
        bytes += host_wbytes(w[i]);
    }
    if (be->n_w + n > be->cap_w)
        return tern_err_set(err, TERN_EINTERNAL, "cuda: weight table full (%d)", be->cap_w);
    char *d = NULL;
    int rc = cu_alloc(be, (void **)&d, bytes, err);
    if (rc)
        return rc;
    for (int i = 0; i < n; i++) {
        CU(cudaMemcpyAsync(d, w[i]->data, host_wbytes(w[i]), cudaMemcpyHostToDevice, be->stream), "weight upload");
        out[i] = &weight_entry(be, w[i], d)->m;
        be->n_w++;
        d += host_wbytes(w[i]);
    }
    return 1;
}

/* The device copy of w, uploaded on first use. */
static int weight_get(cu_backend *be, const model_weight *w, const tcu_mat **out, tern_err *err)
{
    if ((*out = weight_find(be, w)))
        return 0;
    if (w->n_in % 32)
        return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: weight with %d inputs (a multiple of 32 is needed)", w->n_in);
    if (w->dtype == TERN_F8E4M3 && (!w->fs || (w->fs_cols != w->n_in && w->fs_cols % 16)))
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "cuda: FP8 weight scales in blocks of %d inputs (the whole row or a multiple of 16 is needed)",
                            w->fs_cols);
    if (be->n_w == be->cap_w) {
        /* Pointers into be->w are handed out (layers): grow only before any are. */
        return tern_err_set(err, TERN_EINTERNAL, "cuda: weight table full (%d)", be->cap_w);
    }
    void *d = NULL;
    int rc;
    size_t bytes = host_wbytes(w);
    if ((rc = cu_alloc(be, &d, bytes, err)))
        return rc;
    CU(cudaMemcpyAsync(d, w->data, bytes, cudaMemcpyHostToDevice, be->stream), "weight upload"); /* see up_vec */
    cu_weight *cw = weight_entry(be, w, d);
    if (w->qbits) {
        float *sb;
        if ((rc = up_vec(be, w->sb, (size_t)w->n_out * (w->n_in / w->group) * 2, &sb, err)))
            return rc;
        cw->m.sb = sb;
    } else if (w->dtype == TERN_F8E4M3) {
        /* each row's scales, one a column block, as {scale, 0} pairs (the
         * quantized kinds' layout: the GEMV reads a pair a chunk) */
        const long ncol = (w->n_in + w->fs_cols - 1) / w->fs_cols;
        float *h = malloc((size_t)w->n_out * ncol * 2 * sizeof(float)), *sb;
        if (!h)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        for (long r = 0; r < w->n_out; r++)
            for (long c = 0; c < ncol; c++) {
                h[(r * ncol + c) * 2] = w->fs[(r / w->fs_rows) * ncol + c];
                h[(r * ncol + c) * 2 + 1] = 0.0f;
            }
        rc = up_vec(be, h, (size_t)w->n_out * ncol * 2, &sb, err);
        cudaStreamSynchronize(be->stream);
        free(h);
        if (rc)
            return rc;
        cw->m.sb = sb;
        cw->m.group = w->fs_cols;
    }
    be->n_w++;
    *out = &cw->m;
    return 0;
}

/* ---- products on device arrays ---- */

/* Weights the cuBLAS path dequantizes into bf16 scratch first. */
static int cu_kind_dequant(int kind) { return kind == TCU_Q4 || kind == TCU_Q8 || kind == TCU_F8; }

/* The launch options of product p (TCU_PROD_*): CU_OPT_* */
static int cu_opts(const cu_backend *be, int p)
{
    return (be->opts.early & p ? CU_OPT_EARLY : 0) | (be->opts.ring & p ? CU_OPT_RING : 0);
}

/* The GEMV kernel of the options for weights of kind (TCU_GEMV_*). */
static int cu_gemv_choice(const tcu_opts *o, int kind)
{
    return kind == TCU_Q4 ? o->gemv_q4 : kind == TCU_Q8 || kind == TCU_F8 ? o->gemv_q8 : o->gemv_bf16;
}

/* Whether the n matrices of a step of T tokens take the FP8 tensor cores
 * (tcu_opts.f8_tc): all FP8 with 128-input scale blocks or whole rows, the
 * throughput mode, up to tc_max_t tokens - one kernel for every batch of
 * them (so a row's bits never depend on the batch), and for a step of one
 * token too with f8_tc 2 (1: that step keeps the exact one-token GEMV). */
static int cu_use_f8(const cu_backend *be, int n, const tcu_mat *mats, int n_in, int T)
{
    if (!be->opts.f8_tc || be->opts.exact || T > be->opts.tc_max_t || n_in % 128 ||
        (be->opts.f8_tc == 1 && T == 1 && !be->wide))
        return 0;
    for (int i = 0; i < n; i++)
        if (mats[i].kind != TCU_F8 || (mats[i].group != n_in && mats[i].group % 128))
            return 0;
    return 1;
}

/* Whether the n matrices of a step of T tokens take the 4-bit tensor-core
 * GEMM (tcu_opts.q4_tc): all 4-bit of one group size it takes, the
 * throughput mode with the 4-bit GEMV choice auto, and a step of several
 * sequences (or one the invariant mode treats alike: be->wide) up to
 * tc_max_t tokens - one kernel for every such batch, so a row's bits never
 * depend on it - or, with q4_tc 2, a prefill-sized step too. */
static int cu_use_q4(const cu_backend *be, int n, const tcu_mat *mats, int n_in, int T)
{
    if (!be->opts.q4_tc || be->opts.exact || cu_gemv_choice(&be->opts, TCU_Q4) != TCU_GEMV_AUTO)
        return 0;
    if (!(be->wide && T <= be->opts.tc_max_t) && !(be->opts.q4_tc == 2 && T >= be->opts.gemm_min_t))
        return 0;
    for (int i = 0; i < n; i++)
        if (mats[i].kind != TCU_Q4 || mats[i].group != mats[0].group)
            return 0;
    return tcu_q4_mm_ok(n_in, mats[0].group);
}

/* Whether a step of T tokens (or n_out logits rows) takes the GEMVs: below
 * gemm_min_t, or - throughput mode, several sequences (be->wide), weights
 * the tensor-core GEMV takes - up to tc_max_t, so that a decode batch keeps
 * one batch-invariant kernel and its graph (FP8: see below). */
static int cu_step_gemv(const cu_backend *be, int T)
{
    /* FP8, throughput mode: the tensor cores up to tc_max_t tokens; without
     * them (tcu_opts.f8_tc 0) steps of several sequences dequantize to bf16
     * for cuBLASLt (the GEMV's 8-token tiles would reread the weights), one
     * path for every batch so that a row's bits do not depend on it */
    if (be->m && be->layers[0].wq->kind == TCU_F8 && !be->opts.exact) {
        if (be->opts.f8_tc && T <= be->opts.tc_max_t)
            return 1; /* the FP8 tensor cores (cu_use_f8), or the one-token GEMV */
        if (be->wide && be->opts.lt && T > 1)
            return 0;
    }
    if (T < be->opts.gemm_min_t)
        return 1;
    if (!be->wide || be->opts.exact || T > be->opts.tc_max_t || !be->m)
        return 0;
    const int k = be->layers[0].wq->kind, g = cu_gemv_choice(&be->opts, k);
    return (k == TCU_BF16 || k == TCU_Q4) && (g == TCU_GEMV_AUTO || g == TCU_GEMV_TENSOR);
}

/* y_k = x @ W_k^T (or += when accumulate); glu: m[0].y = act(gate) * up
 * with m[1].y as the up buffer. */
/* Whether the n matrices go to one GEMV launch (a decode-sized batch, all of
 * one kind); if so, fills a's common fields. */
static int gemv_one_launch(const cu_backend *be, tcu_gemv_args *a, int n, const tcu_mat *mats, const float *x,
                           int n_in, int T, int glu, int opts)
{
    int same = 1;
    for (int i = 1; i < n; i++)
        same &= mats[i].kind == mats[0].kind;
    if (!cu_step_gemv(be, T) || !same)
        return 0;
    memset(a, 0, sizeof *a);
    a->n = n;
    for (int i = 0; i < n; i++)
        a->m[i] = mats[i];
    a->x = x;
    a->n_in = n_in;
    a->T = T;
    a->glu = glu;
    a->wide = be->wide;
    a->stage = be->opts.gemv_stage ? be->xh : NULL;
    a->stage_bytes = be->opts.gemv_stage ? be->cap_xh : 0;
    a->early = (opts & CU_OPT_EARLY) != 0;
    /* the ring has the one-sequence kernel's bits; FP8 takes it for every
     * product unless the option is off (8B: 256 against 252 tok/s on the
     * register kernel - both bound by the codes' decode, not by memory) */
    a->ring = ((opts & CU_OPT_RING) != 0 || (mats[0].kind == TCU_F8 && be->opts.ring)) && !be->wide;
    return 1;
}

/* Whether the n matrices of a step of T tokens go to cuBLASLt
 * (tcu_opts.lt): all of one 16-bit kind, the throughput mode, and a step
 * of prefill size or of several sequences (or one the invariant mode
 * treats alike: be->wide). Their algorithms run without split-K, so a
 * row's sums have one order whatever the step (backend_cuda_lt.h). */
static int cu_use_lt(const cu_backend *be, int n, const tcu_mat *mats, int T)
{
    if (!be->opts.lt || be->opts.exact || (mats[0].kind != TCU_BF16 && mats[0].kind != TCU_F16))
        return 0;
    for (int i = 1; i < n; i++)
        if (mats[i].kind != mats[0].kind)
            return 0;
    /* a batch takes cuBLASLt where it would take the GEMVs' batch kernel:
     * the bf16 choice auto (a forced kernel keeps every step on it) */
    return !cu_step_gemv(be, T) || (be->wide && cu_gemv_choice(&be->opts, mats[0].kind) == TCU_GEMV_AUTO);
}

/* cuBLASLt products of n matrices of one 16-bit kind from xh (the step's
 * inputs rounded to it): y (+= when accumulate) = x @ W^T; glu: m[0].y =
 * act(gate) * up, written rounded into be->xh too for the next product
 * (be->xh_of). */
static int mm_lt(cu_backend *be, int n, const tcu_mat *mats, const uint16_t *xh, int n_in, int T, int accumulate,
                 int glu, tern_err *err)
{
    const int f16 = mats[0].kind == TCU_F16;
    int rc;
    for (int i = 0; i < n; i++)
        if ((rc = cu_lt_matmul(be->lt, mats[i].w, f16, xh, mats[i].y, mats[i].n_out, n_in, T, accumulate && !glu,
                               err)))
            return rc;
    if (glu) {
        const int nf = mats[0].n_out;
        CU(tcu_glu_half(mats[0].y, mats[0].y, mats[1].y, nf, be->xh, T, nf, glu == 2, f16, &be->opts,
                        (tcu_stream)be->stream),
           "glu");
        be->xh_of = mats[0].y;
        be->xh_of_n = (long)T * nf;
    }
    return 0;
}

/* FP8 products on the tensor cores (cu_use_f8): the step's inputs -
 * RMSNormed first when g is given (rows, xn as tcu_rmsnorm) - as E4M3 codes
 * and scales in the 16-bit scratch xh (T * n_in bytes, then T * n_in / 128
 * floats: within its 2 T n_in bytes), then a launch a matrix. */
static int mm_f8(cu_backend *be, int n, tcu_mat *mats, const float *x, const int32_t *rows, const float *g, float *xn,
                 uint16_t *xh, int n_in, int T, int accumulate, int glu, tern_err *err)
{
    uint8_t *x8 = (uint8_t *)xh;
    float *xs = (float *)(x8 + ((size_t)T * n_in + 15) / 16 * 16);
    be->xh_of = NULL;
    CU(tcu_quant_f8(x, rows, g, xn, g ? be->m->cfg.norm_eps : 0.0f, T, n_in, x8, xs, &be->opts,
                    (tcu_stream)be->stream),
       "quantize");
    for (int i = 0; i < n; i++)
        CU(tcu_f8_mm(&mats[i], n_in, x8, xs, T, accumulate && !glu, &be->opts, (tcu_stream)be->stream),
           "fp8 product");
    if (glu)
        CU(tcu_glu(mats[0].y, mats[1].y, (long)T * mats[0].n_out, glu == 2, &be->opts, (tcu_stream)be->stream), "glu");
    return 0;
}

/* 4-bit products on the tensor cores (cu_use_q4): the step's inputs -
 * RMSNormed first when g is given (rows, xn as tcu_rmsnorm) - rounded to
 * bf16 with their group sums into the 16-bit scratch xh (T * n_in bf16,
 * then T * n_in / group floats: within its 2 T n_in bytes), then one launch
 * for the n matrices (gate/up: the activation in its epilogue). */
static int mm_q4(cu_backend *be, int n, tcu_mat *mats, const float *x, const int32_t *rows, const float *g, float *xn,
                 uint16_t *xh, int n_in, int T, int accumulate, int glu, tern_err *err)
{
    float *xs = (float *)(xh + (size_t)T * n_in); /* n_in a multiple of 128: 16-byte aligned */
    be->xh_of = NULL;
    CU(tcu_q4_prep(x, rows, g, xn, g ? be->m->cfg.norm_eps : 0.0f, T, n_in, mats[0].group, xh, xs, &be->opts,
                   (tcu_stream)be->stream),
       "4-bit inputs");
    CU(tcu_q4_mm(n, mats, n_in, xh, xs, T, accumulate && !glu, glu, &be->opts, (tcu_stream)be->stream),
       "4-bit product");
    return 0;
}

/* opts: CU_OPT_* of the GEMV launches (cu_opts) */
static int mm_dev(cu_backend *be, int n, tcu_mat *mats, const float *x, uint16_t *xh, int n_in, int T, int accumulate,
                  int glu, int opts, tern_err *err)
{
    tcu_gemv_args a;
    if (cu_use_f8(be, n, mats, n_in, T))
        return mm_f8(be, n, mats, x, NULL, NULL, NULL, xh, n_in, T, accumulate, glu, err);
    if (cu_use_q4(be, n, mats, n_in, T))
        return mm_q4(be, n, mats, x, NULL, NULL, NULL, xh, n_in, T, accumulate, glu, err);
    const int lt = cu_use_lt(be, n, mats, T);
    const int have_xh = be->xh_of == x && be->xh_of_n == (long)T * n_in && xh == be->xh;
    be->xh_of = NULL; /* xh is this product's from here */
    if (lt) {
        if (!have_xh)
            CU(tcu_f32_to_half(x, xh, (long)T * n_in, mats[0].kind == TCU_F16, &be->opts, (tcu_stream)be->stream),
               "convert");
        return mm_lt(be, n, mats, xh, n_in, T, accumulate, glu, err);
    }
    if (gemv_one_launch(be, &a, n, mats, x, n_in, T, glu, opts)) {
        a.accumulate = accumulate;
        CU(tcu_gemv(&a, &be->opts, (tcu_stream)be->stream), "gemv");
        return 0;
    }
    if (cu_step_gemv(be, T)) { /* mixed kinds: one launch each */
        for (int i = 0; i < n; i++) {
            gemv_one_launch(be, &a, 1, &mats[i], x, n_in, T, 0, opts);
            a.accumulate = accumulate;
            CU(tcu_gemv(&a, &be->opts, (tcu_stream)be->stream), "gemv");
        }
    } else {
        /* cuBLAS (cuBLASLt without split-K when tcu_opts.lt): inputs rounded
         * to the weight's 16-bit type (bf16 for quantized weights,
         * dequantized into scratch first). */
        int have_h = -1;
        float one = 1.0f, beta = accumulate && !glu ? 1.0f : 0.0f;
        for (int i = 0; i < n; i++) {
            const tcu_mat *mm = &mats[i];
            if (mm->kind == TCU_F32) {
                CU(cublasSgemm(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, mm->n_out, T, n_in, &one, mm->w, n_in, x, n_in,
                               &beta, mm->y, mm->n_out),
                   "cublasSgemm");
                continue;
            }
            int f16 = mm->kind == TCU_F16;
            if (have_h != f16) {
                CU(tcu_f32_to_half(x, xh, (long)T * n_in, f16, &be->opts, (tcu_stream)be->stream), "convert");
                have_h = f16;
            }
            const void *A = mm->w;
            if (cu_kind_dequant(mm->kind)) {
                CU(tcu_dequant_bf16(mm, n_in, be->wdq, &be->opts, (tcu_stream)be->stream), "dequant");
                A = be->wdq;
            }
            int rc;
            if (be->opts.lt) {
                if ((rc = cu_lt_matmul(be->lt, A, f16, xh, mm->y, mm->n_out, n_in, T, beta != 0.0f, err)))
                    return rc;
                continue;
            }
            cudaDataType_t dt = f16 ? CUDA_R_16F : CUDA_R_16BF;
            CU(cublasGemmEx(be->blas, CUBLAS_OP_T, CUBLAS_OP_N, mm->n_out, T, n_in, &one, A, dt, n_in, xh, dt,
                            n_in, &beta, mm->y, CUDA_R_32F, mm->n_out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
        }
    }
    if (glu)
        CU(tcu_glu(mats[0].y, mats[1].y, (long)T * mats[0].n_out, glu == 2, &be->opts, (tcu_stream)be->stream), "glu");
    return 0;
}

/* RMSNorm of x (gain g; token t is x row rows[t] when rows != NULL) into
 * xn, then mm_dev of xn; the GEMV path hands the norm to tcu_gemv, which
 * fuses it where the kernel can. */
static int mm_dev_norm(cu_backend *be, int n, tcu_mat *mats, const float *x, const float *g, float *xn,
                       const int32_t *rows, int n_in, int T, int glu, int opts, tern_err *err)
{
    tcu_gemv_args a;
    be->xh_of = NULL;
    if (cu_use_lt(be, n, mats, T)) {
        CU(tcu_rmsnorm_half(x, rows, g, xn, be->xh, T, n_in, be->m->cfg.norm_eps, mats[0].kind == TCU_F16, &be->opts,
                            (tcu_stream)be->stream),
           "rmsnorm");
        return mm_lt(be, n, mats, be->xh, n_in, T, 0, glu, err);
    }
    if (cu_use_f8(be, n, mats, n_in, T))
        return mm_f8(be, n, mats, x, rows, g, xn, be->xh, n_in, T, 0, glu, err);
    if (cu_use_q4(be, n, mats, n_in, T))
        return mm_q4(be, n, mats, x, rows, g, xn, be->xh, n_in, T, 0, glu, err);
    if (gemv_one_launch(be, &a, n, mats, x, n_in, T, glu, opts)) {
        a.norm_g = g;
        a.norm_out = xn;
        a.norm_eps = be->m->cfg.norm_eps;
        a.norm_rows = rows;
        CU(tcu_gemv(&a, &be->opts, (tcu_stream)be->stream), "gemv");
        return 0;
    }
    CU(tcu_rmsnorm(x, rows, g, xn, T, n_in, be->m->cfg.norm_eps, 0, &be->opts, (tcu_stream)be->stream), "rmsnorm");
    return mm_dev(be, n, mats, xn, be->xh, n_in, T, 0, glu, opts, err);
}

/* ---- scratch ---- */

static void graphs_clear(cu_backend *be)
{
    for (int i = 0; i < be->n_graphs; i++)
        cudaGraphExecDestroy(be->graphs[i].exec);
    be->n_graphs = 0;
}

static int scratch_ensure(cu_backend *be, int T, int n_out, tern_err *err)
{
    if (T <= be->cap_t && n_out <= be->cap_out && be->x)
        return 0;
    const model_config *c = &be->m->cfg;
    int ct = T > be->cap_t ? (T > 2 * be->cap_t ? T : 2 * be->cap_t) : be->cap_t;
    int co = n_out > be->cap_out ? (n_out > 2 * be->cap_out ? n_out : 2 * be->cap_out) : be->cap_out;
    if (co < 1)
        co = 1;
    graphs_clear(be);
    float **bufs[] = {&be->x, &be->xn, &be->q, &be->qkv, &be->att, &be->gate, &be->gu, &be->tmp, &be->xo,
                      &be->logits, &be->part};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
        cu_free_one(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    cu_free_one(be, be->xh);
    be->xh = NULL;
    size_t qd = (size_t)c->n_head * c->head_dim, kvd = (size_t)c->n_kv_head * c->head_dim;
    size_t sizes[] = {(size_t)ct * c->dim, (size_t)ct * c->dim, ct * qd, ct * (qd + 2 * kvd), ct * qd,
                      (size_t)ct * c->n_ff, (size_t)ct * 2 * c->n_ff, (size_t)ct * c->dim, (size_t)co * c->dim,
                      (size_t)co * c->n_vocab, (size_t)ct * c->n_head * CU_GRAPH_SPLIT * (c->head_dim + 2)};
    be->k = be->v = be->up = NULL;
    int rc;
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if ((rc = cu_alloc(be, (void **)bufs[i], sizes[i] * sizeof(float), err)))
            return rc;
    /* k, v and up of the products a matrix at a time inside the merged
     * products' buffers (never both in one step's product) */
    be->k = be->qkv;
    be->v = be->qkv + ct * kvd;
    be->up = be->gu;
    /* at least the GEMVs' stage at 32 tokens (exact: 96 bf16 an input, 4-bit
     * + 96 floats a group), or at the steps' columns rounded up to 32
     * (throughput: a bf16 an input and token, + a float a group and token) */
    size_t cols = (size_t)(ct > co ? ct : co);
    cols = (cols + 31) / 32 * 32;
    size_t xhn = (cols * 17 / 16 > 104 ? cols * 17 / 16 : 104) * be->max_in;
    be->cap_xh = 0;
    if ((rc = cu_alloc(be, (void **)&be->xh, xhn * sizeof(uint16_t), err)))
        return rc;
    be->cap_xh = xhn * sizeof(uint16_t);
    int grown;
    if ((rc = cu_moe_scratch_ensure(be->moe, ct, &grown, err)))
        return rc;
    be->cap_t = ct;
    be->cap_out = co;
    return 0;
}

/* A device buffer and its pinned host twin, each of at least n int32 (grown to
 * twice the old capacity); *cap is 0 while they are being replaced. */
static int pinned_pair_ensure(cu_backend *be, int32_t **d, int32_t **h, size_t *cap_io, size_t n, tern_err *err)
{
    if (n <= *cap_io)
        return 0;
    size_t cap = n > 2 * *cap_io ? n : 2 * *cap_io;
    cu_free_one(be, *d);
    *d = NULL;
    cudaFreeHost(*h);
    *h = NULL;
    *cap_io = 0;
    int rc = cu_alloc(be, (void **)d, cap * sizeof(int32_t), err);
    if (rc)
        return rc;
    CU(cudaMallocHost((void **)h, cap * sizeof(int32_t)), "pinned alloc");
    *cap_io = cap;
    return 0;
}

static int in_ensure(cu_backend *be, size_t n, tern_err *err)
{
    if (n > be->cap_in)
        graphs_clear(be); /* captured graphs read the old input buffer */
    return pinned_pair_ensure(be, &be->d_in, &be->h_in, &be->cap_in, n, err);
}

/* Frees mirror m's storage and table; unhook: its pool's hooks too. */
static void kvm_free(cu_backend *be, cu_kvm *m, int unhook)
{
    kv_pool *p = (kv_pool *)m->host;
    if (unhook && p && p->dev_ctx == be) {
        p->dev_copy = NULL;
        p->dev_release = NULL;
        p->dev_ctx = NULL;
    }
    cu_free_one(be, m->k);
    cu_free_one(be, m->v);
    cu_kvm_clear(m);
}

/* kv_pool's dev_release hook (kv_pool_free): the pool's mirror goes. */
static void cu_kv_release(void *ctx, const kv_pool *p)
{
    cu_backend *be = ctx;
    cu_kvm m;
    cudaSetDevice(be->device);
    cudaStreamSynchronize(be->stream); /* nothing queued reads it any more */
    if (be->kvm.host == p) {
        graphs_clear(be); /* captured graphs read its storage */
        kvm_free(be, &be->kvm, 0);
    } else if (cu_kvm_park_take(&be->parked, p, &m)) {
        kvm_free(be, &m, 0);
    }
    cudaGetLastError();
}

/* Makes be->kvm kv's mirror: the current one, a parked one (a device-KV
 * pool's K/V live only there: a forward of another pool in between - a
 * test's reference pool, a second engine - must not lose them), or a new
 * one. The pool's dev_release then frees it (kv_pool_free). */
static int kv_ensure(cu_backend *be, const kv_pool *kv, tern_err *err)
{
    if (cu_kvm_matches(&be->kvm, kv))
        return 0;
    graphs_clear(be); /* captured graphs read the current mirror */
    cu_kvm dropped;
    if (be->kvm.k && be->kvm.host != kv && cu_kvm_park_put(&be->parked, &be->kvm, &dropped)) {
        TERN_WARN("cuda: more than %d KV pools on one model: the oldest one's device KV is dropped", CU_KVM_PARKED);
        kvm_free(be, &dropped, 0);
    }
    kvm_free(be, &be->kvm, 0); /* (a pool's old shape at the same address) */
    cu_kvm m;
    if (cu_kvm_park_take(&be->parked, kv, &m)) {
        if (cu_kvm_matches(&m, kv)) {
            be->kvm = m;
            return 0;
        }
        kvm_free(be, &m, 0);
    }
    size_t bytes = cu_kvm_bytes(kv);
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    if (2 * bytes + (64u << 20) > fr)
        return tern_err_set(err, TERN_ENOMEM,
                            "cuda: the KV cache (%zu MB) does not fit in GPU %d's free memory (%zu MB); "
                            "lower the KV budget or context",
                            (2 * bytes) >> 20, be->device, fr >> 20);
    void *k = NULL, *v = NULL;
    int rc;
    if ((rc = cu_alloc(be, &k, bytes, err)) || (rc = cu_alloc(be, &v, bytes, err)) ||
        (rc = cu_kvm_set(&be->kvm, kv, k, v, err))) {
        cu_free_one(be, k);
        cu_free_one(be, v);
        return rc;
    }
    ((kv_pool *)kv)->dev_release = cu_kv_release;
    ((kv_pool *)kv)->dev_ctx = be;
    return 0;
}

/* kv_pool's dev_copy hook: block src -> dst in every layer of the mirror,
 * queued on the stream (so before the next forward). */
static int cu_kv_copy(void *ctx, const kv_pool *p, int32_t dst, int32_t src)
{
    cu_backend *be = ctx;
    const cu_kvm *m = p == be->kvm.host ? &be->kvm : cu_kvm_park_find(&be->parked, p);
    if (!m || !m->k)
        return (int)cudaErrorInvalidValue; /* this pool's mirror is gone */
    cudaError_t rc = cudaSetDevice(be->device);
    return rc != cudaSuccess ? (int)rc : cu_kvm_block_copy(m, dst, src, (tcu_stream)be->stream);
}

static int cu_kv_bind(model_backend *base, kv_pool *kv, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    if (!be->m)
        return tern_err_set(err, TERN_EINVAL, "cuda: no model on this backend");
    if (kv->n_layer != be->m->cfg.n_layer || kv->kv_dim != be->m->cfg.n_kv_head * be->m->cfg.head_dim)
        return tern_err_set(err, TERN_EINVAL, "cuda: KV pool shape does not match the model");
    CU(cudaSetDevice(be->device), "set device");
    int rc = kv_ensure(be, kv, err);
    if (rc)
        return rc;
    kv->dev_copy = cu_kv_copy;
    kv->dev_ctx = be;
    return 0;
}

/* Packs tokens (may be NULL), pos, per-token block-table offsets, out rows
 * and block tables into h_in and sends them up. Offsets into d_in: tokens
 * 0, pos T, bt_off 2T, out_rows 3T, blocks 3T + n_out. */
static int pack_batch(cu_backend *be, const kv_pool *kv, const fwd_batch *b, tern_err *err)
{
    int T = b->n, n_out = b->n_out;
    size_t nb = 0;
    for (int i = 0; i < T; i++) {
        int first = 1;
        for (int j = 0; j < i && first; j++)
            first = b->seqs[j] != b->seqs[i];
        if (first)
            nb += (size_t)b->seqs[i]->n_blocks;
    }
    int rc = in_ensure(be, (size_t)5 * T + n_out + nb, err);
    if (rc)
        return rc;
    int32_t *h = be->h_in, *blk = h + 3 * T + n_out;
    size_t used = 0;
    for (int i = 0; i < T; i++) {
        h[i] = b->tokens ? b->tokens[i] : 0;
        h[T + i] = b->pos[i];
        int j = 0;
        while (j < i && b->seqs[j] != b->seqs[i])
            j++;
        if (j < i) {
            h[2 * T + i] = h[2 * T + j];
        } else {
            h[2 * T + i] = (int32_t)used;
            memcpy(blk + used, b->seqs[i]->blocks, (size_t)b->seqs[i]->n_blocks * sizeof(int32_t));
            used += (size_t)b->seqs[i]->n_blocks;
        }
    }
    for (int j = 0; j < n_out; j++)
        h[3 * T + j] = b->out_rows[j];
    /* prefill attention tiles: runs of one sequence's consecutive positions */
    int32_t *tl = blk + used;
    be->tile_off = 3 * T + n_out + (int)used;
    be->n_tiles = 0;
    for (int i = 0; i < T;) {
        int n = 1;
        while (i + n < T && n < TCU_ATTN_TILE_Q && b->seqs[i + n] == b->seqs[i] && b->pos[i + n] == b->pos[i] + n)
            n++;
        tl[2 * be->n_tiles] = i;
        tl[2 * be->n_tiles + 1] = n;
        be->n_tiles++;
        i += n;
    }
    used += 2 * (size_t)be->n_tiles;
    (void)kv;
    CU(cudaMemcpyAsync(be->d_in, h, ((size_t)3 * T + n_out + used) * sizeof(int32_t), cudaMemcpyHostToDevice,
                       be->stream),
       "input upload");
    return 0;
}

/* ---- the table path (host arrays) ---- */

static int tbuf(cu_backend *be, float **p, size_t *cap, size_t n, tern_err *err)
{
    if (n <= *cap)
        return 0;
    cu_free_one(be, *p);
    *p = NULL;
    *cap = 0;
    int rc = cu_alloc(be, (void **)p, n * 2 * sizeof(float), err);
    if (!rc)
        *cap = n * 2;
    return rc;
}

static int cu_matmul(model_backend *base, int n, const model_weight *const *w, const float *X, float *const *Y,
                     int T, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    if (n < 1 || n > TCU_MM_MAX)
        return tern_err_set(err, TERN_EINVAL, "matmul: %d matrices in one job", n);
    CU(cudaSetDevice(be->device), "set device");
    cudaGetLastError(); /* a failure of another caller's launch is not ours */
    be->wide = 0; /* rows without sequences: the one-sequence products */
    tcu_mat mats[TCU_MM_MAX];
    size_t tot = 0;
    int rc;
    for (int i = 0; i < n; i++) {
        const tcu_mat *dm;
        if ((rc = weight_get(be, w[i], &dm, err)))
            return rc;
        mats[i] = *dm;
        tot += (size_t)T * w[i]->n_out;
    }
    int n_in = w[0]->n_in;
    if ((rc = tbuf(be, &be->tx, &be->cap_tx, (size_t)T * n_in, err)) || (rc = tbuf(be, &be->ty, &be->cap_ty, tot, err)))
        return rc;
    if ((size_t)T * n_in > be->cap_txh) {
        cu_free_one(be, be->txh);
        be->txh = NULL;
        be->cap_txh = 0;
        if ((rc = cu_alloc(be, (void **)&be->txh, (size_t)T * n_in * 2 * sizeof(uint16_t), err)))
            return rc;
        be->cap_txh = (size_t)T * n_in * 2;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        mats[i].y = be->ty + off;
        off += (size_t)T * w[i]->n_out;
        if (cu_kind_dequant(mats[i].kind) && T >= be->opts.gemm_min_t) {
            size_t need = (size_t)w[i]->n_out * n_in;
            if (need > be->cap_wdq) {
                cu_free_one(be, be->wdq);
                be->wdq = NULL;
                be->cap_wdq = 0;
                if ((rc = cu_alloc(be, (void **)&be->wdq, need * sizeof(uint16_t), err)))
                    return rc;
                be->cap_wdq = need;
            }
        }
    }
    CU(cudaMemcpyAsync(be->tx, X, (size_t)T * n_in * sizeof(float), cudaMemcpyHostToDevice, be->stream), "upload");
    if ((rc = mm_dev(be, n, mats, be->tx, be->txh, n_in, T, 0, 0, 0, err)))
        return rc;
    for (int i = 0; i < n; i++)
        CU(cudaMemcpyAsync(Y[i], mats[i].y, (size_t)T * w[i]->n_out * sizeof(float), cudaMemcpyDeviceToHost,
                           be->stream),
           "download");
    CU(cudaStreamSynchronize(be->stream), "matmul");
    return 0;
}

/* Prefill-sized steps (T >= gemm_min_t: the cuBLAS path, not
 * batch-invariant anyway) take the tiled kernel over pack_batch's tiles;
 * the rest, head dims it does not cover and tcu_opts.attn_tiled off (-1),
 * the per-token kernel. */
static int attention_launch(cu_backend *be, const tcu_attn_args *a, int T, tcu_stream s)
{
    int rc = !cu_step_gemv(be, T) ? tcu_attention_tiled(a, be->d_in + be->tile_off, be->n_tiles, &be->opts, s) : -1;
    return rc == -1 ? tcu_attention(a, &be->opts, s) : rc;
}

static int cu_attention(model_backend *base, const model_attn *a, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    const fwd_batch *b = a->b;
    int T = b->n, hd = a->head_dim, rc;
    if ((rc = model_head_dim_check(base, hd, err)))
        return rc;
    if (!a->kv->mem_k || !a->kv->mem_v)
        return tern_err_set(err, TERN_EINVAL, "cuda attention: the KV pool has no host storage");
    CU(cudaSetDevice(be->device), "set device");
    cudaGetLastError(); /* a failure of another caller's launch is not ours */
    if ((rc = kv_ensure(be, a->kv, err)))
        return rc;
    fwd_batch pb = *b;
    pb.tokens = NULL;
    pb.n_out = 0;
    if ((rc = pack_batch(be, a->kv, &pb, err)))
        return rc;
    /* Mirror the layer's blocks that the batch reads. */
    const kv_pool *kv = a->kv;
    for (int i = 0; i < T; i++) {
        int j = 0;
        while (j < i && b->seqs[j] != b->seqs[i])
            j++;
        if (j < i)
            continue;
        int maxp = 0;
        for (int k = i; k < T; k++)
            if (b->seqs[k] == b->seqs[i] && b->pos[k] > maxp)
                maxp = b->pos[k];
        for (int blk = 0; blk <= maxp / kv->block_size; blk++)
            CU(cu_kvm_block_upload(&be->kvm, kv, a->layer, b->seqs[i]->blocks[blk], (tcu_stream)be->stream), "kv");
    }
    size_t qn = (size_t)T * a->n_head * hd;
    size_t pn = (size_t)T * a->n_head * CU_GRAPH_SPLIT * (hd + 2);
    if ((rc = tbuf(be, &be->tx, &be->cap_tx, qn + pn + a->n_head, err)) ||
        (rc = tbuf(be, &be->ty, &be->cap_ty, qn, err)))
        return rc;
    CU(cudaMemcpyAsync(be->tx, a->q, qn * sizeof(float), cudaMemcpyHostToDevice, be->stream), "upload");
    float *sinks = a->sinks ? be->tx + qn + pn : NULL; /* the heads' sink logits, after the split parts */
    if (sinks)
        CU(cudaMemcpyAsync(sinks, a->sinks, (size_t)a->n_head * sizeof(float), cudaMemcpyHostToDevice, be->stream),
           "upload");
    int ctx = 0;
    for (int i = 0; i < T; i++)
        ctx = b->pos[i] + 1 > ctx ? b->pos[i] + 1 : ctx;
    tcu_attn_args at = {be->tx, be->ty, be->tx + qn, be->d_in + T, be->d_in + 2 * T, be->d_in + 3 * T,
                        cu_kvm_layer(&be->kvm, a->layer), a->layer, T, a->n_head, a->n_kv_head, hd, a->window, 0, a->scale, a->softcap,
                        CU_SPLIT_LEN_ONE_RULE, 0, sinks, NULL, 0};
    at.n_split = ctx / 64 + 1 < CU_GRAPH_SPLIT ? ctx / 64 + 1 : CU_GRAPH_SPLIT;
    /* several sequences in throughput mode: the device forward's batch rule
     * and kernels (the table path is how the tests reach them) */
    int multi = 0;
    for (int i = 1; i < T; i++)
        multi |= b->seqs[i] != b->seqs[0];
    if (multi && !be->opts.exact && be->opts.attn_tiles) {
        at.split_len = be->opts.split_len;
        at.tiles = be->opts.attn_tiles;
    }
    if (at.kv.rot)
        CU(tcu_kv_rotate(be->tx, (long)T * a->n_head, hd, 0, &be->opts, (tcu_stream)be->stream), "rotate");
    CU(attention_launch(be, &at, T, (tcu_stream)be->stream), "attention");
    if (at.kv.rot)
        CU(tcu_kv_rotate(be->ty, (long)T * a->n_head, hd, 1, &be->opts, (tcu_stream)be->stream), "rotate");
    CU(cudaMemcpyAsync(a->out, be->ty, qn * sizeof(float), cudaMemcpyDeviceToHost, be->stream), "download");
    CU(cudaStreamSynchronize(be->stream), "attention");
    return 0;
}

/* ---- the device-resident forward ---- */

static int layers_run(cu_backend *be, int T, int n_out, int n_split, tern_err *err)
{
    const model_config *c = &be->m->cfg;
    tcu_stream s = (tcu_stream)be->stream;
    int dim = c->dim, rc;
    const int32_t *tokens = be->d_in, *pos = be->d_in + T, *bt_off = be->d_in + 2 * T, *rows = be->d_in + 3 * T,
                  *blk = be->d_in + 3 * T + n_out;
    const tcu_opts *opt = &be->opts;
    CU(tcu_embed(be->embed, dim, tokens, T, c->embed_scale, be->x, opt, s), "embed");
    for (int l = 0; l < c->n_layer; l++) {
        const cu_layer *L = &be->layers[l];
        tcu_mat qkv[3] = {*L->wq, *L->wk, *L->wv};
        qkv[0].y = be->q;
        qkv[1].y = be->k;
        qkv[2].y = be->v;
        /* LoRA rows read the normed inputs, which a fused-norm GEMV keeps to itself */
        int lora_qkv = cu_lora_has(be->lora, l, LORA_Q) || cu_lora_has(be->lora, l, LORA_K) ||
                       cu_lora_has(be->lora, l, LORA_V);
        if (lora_qkv)
            CU(tcu_rmsnorm(be->x, NULL, L->attn_norm, be->xn, T, dim, c->norm_eps, 0, opt, s), "rmsnorm");
        const int qd = c->n_head * c->head_dim, kvd = c->n_kv_head * c->head_dim;
        /* cuBLASLt steps: q, k and v as one GEMM over the rows stored side
         * by side, outputs [T][qd + 2 kvd] (LoRA rows: a product each) */
        const int cat_qkv = L->qkv_cat && !lora_qkv && cu_use_lt(be, 3, qkv, T);
        if (cat_qkv) {
            tcu_mat m = *L->wq;
            m.n_out = qd + 2 * kvd;
            m.y = be->qkv;
            if ((rc = mm_dev_norm(be, 1, &m, be->x, L->attn_norm, be->xn, NULL, dim, T, 0, 0, err)))
                return rc;
        } else if ((rc = mm_dev_norm(be, 3, qkv, be->x, L->attn_norm, be->xn, NULL, dim, T, 0,
                                     cu_opts(be, TCU_PROD_QKV), err))) {
            return rc;
        }
        for (int k = 0; lora_qkv && k < 3; k++)
            CU(cu_lora_add(be->lora, l, LORA_Q + k, be->xn, qkv[k].y, dim, qkv[k].n_out, T, opt, s), "lora");
        const tcu_kv kvl = cu_kvm_layer(&be->kvm, l);
        tcu_qkv_args qa = {be->q, be->k, be->v, L->bq, L->bk, L->bv, L->q_norm, L->k_norm, L->rope, pos, bt_off,
                           blk, kvl, l, T, c->n_head, c->n_kv_head, c->head_dim, c->norm_eps, L->rope_af, 0, NULL};
        if (cat_qkv) { /* the rows of the merged outputs; q rotated into be->q */
            qa.q = be->qkv;
            qa.k = be->qkv + qd;
            qa.v = be->qkv + qd + kvd;
            qa.ld = qd + 2 * kvd;
            qa.q_out = be->q;
        }
        tcu_attn_args aa = {be->q, be->att, be->part, pos, bt_off, blk, kvl, l, T, c->n_head, c->n_kv_head,
                            c->head_dim, be->m->layers[l].window, n_split, c->attn_scale, c->attn_softcap,
                            be->split_len, be->split_tiles ? be->opts.attn_tiles : 0, L->sinks, NULL, 0};
        /* o's cuBLASLt inputs written by the decode attention's merge (no
         * conversion launch; not the prefill tiles, which write f32 only) */
        const int o_h = !kvl.rot && cu_step_gemv(be, T) && cu_use_lt(be, 1, L->wo, T);
        if (o_h) {
            aa.out_h = be->xh;
            aa.out_h_f16 = L->wo->kind == TCU_F16;
        }
        /* (the fused kernel reads q/k/v of their own: not after a merged product) */
        if (be->fused && !kvl.rot && !cat_qkv) {
            CU(tcu_qkv_attention(&qa, &aa, opt, s), "attention");
        } else { /* a rotated KV layer (r4): q into its basis, the output back (tcu_kv.rot) */
            CU(tcu_qkv_post(&qa, opt, s), "qkv");
            if (kvl.rot)
                CU(tcu_kv_rotate(be->q, (long)T * c->n_head, c->head_dim, 0, opt, s), "rotate");
            CU(attention_launch(be, &aa, T, s), "attention");
            if (kvl.rot)
                CU(tcu_kv_rotate(be->att, (long)T * c->n_head, c->head_dim, 1, opt, s), "rotate");
        }
        tcu_mat o = *L->wo;
        if (o_h) {
            be->xh_of = be->att;
            be->xh_of_n = (long)T * qd;
        }
        const int o_opts = cu_opts(be, TCU_PROD_O);
        if (L->post_attn_norm) {
            o.y = be->tmp;
            if ((rc = mm_dev(be, 1, &o, be->att, be->xh, qd, T, 0, 0, o_opts, err)))
                return rc;
            CU(cu_lora_add(be->lora, l, LORA_O, be->att, be->tmp, qd, dim, T, opt, s), "lora");
            if (L->bo) /* o_proj's bias after the product (and its LoRA rows), as the CPU adds it */
                CU(tcu_add_bias(be->tmp, L->bo, T, dim, opt, s), "bias");
            CU(tcu_rmsnorm(be->tmp, NULL, L->post_attn_norm, be->x, T, dim, c->norm_eps, 1, opt, s), "rmsnorm");
        } else {
            o.y = be->x;
            if ((rc = mm_dev(be, 1, &o, be->att, be->xh, qd, T, 1, 0, o_opts, err)))
                return rc;
            CU(cu_lora_add(be->lora, l, LORA_O, be->att, be->x, qd, dim, T, opt, s), "lora");
            if (L->bo) /* o_proj's bias (gpt_oss): x += o(att) + bo, the product accumulated first */
                CU(tcu_add_bias(be->x, L->bo, T, dim, opt, s), "bias");
        }
        if (cu_moe_layer_sparse(be->moe, l)) { /* x += the experts' sum (backend_cuda_moe.c) */
            CU(cu_moe_run(be->moe, l, be->x, L->ffn_norm, c->norm_eps, be->xn, T, opt, s), "experts");
            continue;
        }
        tcu_mat gu[2] = {*L->wg, *L->wu};
        gu[0].y = be->gate;
        gu[1].y = be->up;
        /* LoRA rows: the updates go on gate and up before the activation */
        int lora_gu = cu_lora_has(be->lora, l, LORA_GATE) || cu_lora_has(be->lora, l, LORA_UP);
        if (lora_gu)
            CU(tcu_rmsnorm(be->x, NULL, L->ffn_norm, be->xn, T, dim, c->norm_eps, 0, opt, s), "rmsnorm");
        /* cuBLASLt steps: gate and up as one GEMM over the rows stored side
         * by side, outputs [T][2 n_ff], the activation (f32 into be->gate, as
         * the products a matrix at a time leave it, and 16-bit into xh for
         * down) from those rows (LoRA rows: a product each) */
        if (L->gu_cat && !lora_gu && cu_use_lt(be, 2, gu, T)) {
            tcu_mat m = *L->wg, dn = *L->wd;
            m.n_out = 2 * c->n_ff;
            m.y = be->gu;
            if ((rc = mm_dev_norm(be, 1, &m, be->x, L->ffn_norm, be->xn, NULL, dim, T, 0, 0, err)))
                return rc;
            /* the f32 activation only for a reader of it: down on cuBLASLt
             * of the same kind reads the 16-bit copy alone (xh_of), LoRA
             * rows on down the f32 values */
            float *act = cu_use_lt(be, 1, &dn, T) && dn.kind == m.kind && !cu_lora_has(be->lora, l, LORA_DOWN)
                             ? NULL
                             : be->gate;
            CU(tcu_glu_half(act, be->gu, be->gu + c->n_ff, 2 * (long)c->n_ff, be->xh, T, c->n_ff, c->gelu != 0,
                            m.kind == TCU_F16, opt, s),
               "glu");
            be->xh_of = be->gate;
            be->xh_of_n = (long)T * c->n_ff;
        } else if ((rc = mm_dev_norm(be, 2, gu, be->x, L->ffn_norm, be->xn, NULL, dim, T,
                                     lora_gu ? 0 : c->gelu ? 2 : 1, cu_opts(be, TCU_PROD_GU), err))) {
            return rc;
        }
        if (lora_gu) {
            for (int k = 0; k < 2; k++)
                CU(cu_lora_add(be->lora, l, LORA_GATE + k, be->xn, gu[k].y, dim, c->n_ff, T, opt, s), "lora");
            CU(tcu_glu(be->gate, be->up, (long)T * c->n_ff, c->gelu != 0, opt, s), "glu");
        }
        const int d_opts = cu_opts(be, TCU_PROD_DOWN);
        tcu_mat d = *L->wd;
        if (L->post_ffn_norm) {
            d.y = be->tmp;
            if ((rc = mm_dev(be, 1, &d, be->gate, be->xh, c->n_ff, T, 0, 0, d_opts, err)))
                return rc;
            CU(cu_lora_add(be->lora, l, LORA_DOWN, be->gate, be->tmp, c->n_ff, dim, T, opt, s), "lora");
            CU(tcu_rmsnorm(be->tmp, NULL, L->post_ffn_norm, be->x, T, dim, c->norm_eps, 1, opt, s), "rmsnorm");
        } else {
            d.y = be->x;
            if ((rc = mm_dev(be, 1, &d, be->gate, be->xh, c->n_ff, T, 1, 0, d_opts, err)))
                return rc;
            CU(cu_lora_add(be->lora, l, LORA_DOWN, be->gate, be->x, c->n_ff, dim, T, opt, s), "lora");
        }
    }
    if (n_out > 0) {
        tcu_mat lm = *be->lm_head;
        lm.y = be->logits;
        if ((rc = mm_dev_norm(be, 1, &lm, be->x, be->final_norm, be->xo, rows, dim, n_out, 0, cu_opts(be, TCU_PROD_LM),
                              err)))
            return rc;
        if (c->final_softcap > 0)
            CU(tcu_softcap(be->logits, (long)n_out * c->n_vocab, c->final_softcap, opt, s), "softcap");
    }
    return 0;
}

/* The dequantization scratch of the cuBLAS path (quantized weights only). */
static int wdq_ensure(cu_backend *be, tern_err *err)
{
    const model_config *c = &be->m->cfg;
    int rc;
    {
        size_t need = 0;
        for (int l = 0; l < c->n_layer; l++) {
            const tcu_mat *ws[7] = {be->layers[l].wq, be->layers[l].wk, be->layers[l].wv, be->layers[l].wo,
                                    be->layers[l].wg, be->layers[l].wu, be->layers[l].wd};
            for (int i = 0; i < 7; i++)
                if (ws[i] && cu_kind_dequant(ws[i]->kind)) {
                    size_t n = (size_t)ws[i]->n_out * (i == 3 ? c->n_head * c->head_dim : i == 6 ? c->n_ff : c->dim);
                    need = n > need ? n : need;
                }
        }
        if (cu_kind_dequant(be->lm_head->kind))
            need = (size_t)c->n_vocab * c->dim > need ? (size_t)c->n_vocab * c->dim : need;
        if (need > be->cap_wdq) {
            cu_free_one(be, be->wdq);
            be->wdq = NULL;
            be->cap_wdq = 0;
            if ((rc = cu_alloc(be, (void **)&be->wdq, need * sizeof(uint16_t), err)))
                return rc;
            be->cap_wdq = need;
        }
    }
    return 0;
}

/* Queues the forward of b; the n_out logits rows stay in be->logits. */
static int cu_enqueue(cu_backend *be, tern_model *m, kv_pool *kv, const fwd_batch *b, tern_err *err)
{
    const model_config *c = &m->cfg;
    int T = b->n, rc;
    be->pending_out = -1;
    if (!be->m || m != be->m)
        return tern_err_set(err, TERN_EINVAL, "cuda: backend used with another model");
    if (kv->n_layer != c->n_layer || kv->kv_dim != c->n_kv_head * c->head_dim)
        return tern_err_set(err, TERN_EINVAL, "cuda: KV pool shape does not match the model");
    CU(cudaSetDevice(be->device), "set device");
    cudaGetLastError(); /* a failure of another caller's launch is not ours */
    if ((rc = kv_ensure(be, kv, err)) || (rc = scratch_ensure(be, T, b->n_out, err)))
        return rc;
    /* copy-on-write of this pool's blocks must reach the mirror (backend.h kv_bind) */
    kv->dev_copy = cu_kv_copy;
    kv->dev_ctx = be;
    /* tcu_opts.invariant: every step's products (TCU_INV_PRODUCTS: the
     * tensor-core GEMV, no ring, graphs keyed alike) and attention splits
     * (TCU_INV_ATTN) as a step of several sequences */
    const int inv = be->opts.exact ? 0 : be->opts.invariant;
    int multi = 0;
    for (int i = 1; i < T; i++)
        multi |= b->seqs[i] != b->seqs[0];
    be->wide = multi || (inv & TCU_INV_PRODUCTS);
    int big = !cu_step_gemv(be, T) || !cu_step_gemv(be, b->n_out);
    if (big && (rc = wdq_ensure(be, err)))
        return rc;
    if ((rc = pack_batch(be, kv, b, err)) || (rc = cu_moe_step_begin(be->moe, err)))
        return rc;
    /* Steps of several sequences where the GEMVs take their batch kernel
     * (TCU_GEMV_AUTO's wide choice) split each token's attention by its own
     * length (tcu_opts.split_len); a step of one token takes short splits
     * (tcu_opts.split_len1), faster alone - knife-edge differences between
     * alone and batched, as the GEMVs have. The other GEMV choices, and
     * exact products, keep every step on one rule. */
    be->split_len = CU_SPLIT_LEN_ONE_RULE;
    be->split_tiles = 0;
    if ((cu_gemv_choice(&be->opts, be->layers[0].wq->kind) == TCU_GEMV_AUTO || be->layers[0].wq->kind == TCU_F8) &&
        !be->opts.exact) {
        be->split_tiles = multi || (inv & TCU_INV_ATTN);
        be->split_len = be->split_tiles ? be->opts.split_len : T == 1 ? be->opts.split_len1 : 0;
    }
    /* small steps whose tokens are each of another sequence: no token
     * reads K/V that another writes */
    be->fused = be->opts.qkv_fuse && !big && T <= CU_QKV_FUSE_MAX_T;
    for (int i = 1; i < T && be->fused; i++)
        for (int j = 0; j < i; j++)
            be->fused &= b->seqs[i] != b->seqs[j];
    /* steps with LoRA rows run uncaptured: which products get updates
     * depends on the step's adapters */
    int lora_on = cu_lora_has_any(be->lora);
    if (!big && be->opts.graphs && !lora_on) {
        cu_graph *g = NULL;
        for (int i = 0; i < be->n_graphs; i++)
            if (be->graphs[i].T == T && be->graphs[i].n_out == b->n_out && be->graphs[i].wide == be->wide &&
                be->graphs[i].fused == be->fused)
                g = &be->graphs[i];
        if (!g) {
            if (be->n_graphs == CU_MAX_GRAPHS)
                graphs_clear(be);
            cudaGraph_t graph;
            CU(cudaStreamBeginCapture(be->stream, cudaStreamCaptureModeThreadLocal), "graph capture");
            rc = layers_run(be, T, b->n_out, CU_GRAPH_SPLIT, err);
            cudaError_t ce = cudaStreamEndCapture(be->stream, &graph);
            if (rc)
                return rc;
            CU(ce, "graph capture");
            g = &be->graphs[be->n_graphs];
            ce = cudaGraphInstantiate(&g->exec, graph, 0);
            cudaGraphDestroy(graph);
            CU(ce, "graph instantiate");
            g->T = T;
            g->n_out = b->n_out;
            g->wide = be->wide;
            g->fused = be->fused;
            be->n_graphs++;
        }
        CU(cudaGraphLaunch(g->exec, be->stream), "graph launch");
    } else {
        int ctx = 0;
        for (int i = 0; i < T; i++)
            ctx = b->pos[i] + 1 > ctx ? b->pos[i] + 1 : ctx;
        int ns = ctx / 64 + 1 < CU_GRAPH_SPLIT ? ctx / 64 + 1 : CU_GRAPH_SPLIT;
        rc = layers_run(be, T, b->n_out, ns, err);
        cu_lora_done(be->lora);
        if (rc)
            return rc;
    }
    if ((rc = cu_moe_step_end(be->moe, err)))
        return rc;
    be->pending_out = b->n_out;
    return 0;
}

static int cu_forward(model_backend *base, tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits,
                      tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    const model_config *c = &m->cfg;
    int rc = cu_enqueue(be, m, kv, b, err);
    be->pending_out = -1;
    if (rc) {
        cudaStreamSynchronize(be->stream); /* leave nothing running on failure */
        cudaGetLastError();
        return rc;
    }
    if (b->n_out > 0)
        CU(cudaMemcpyAsync(logits, be->logits, (size_t)b->n_out * c->n_vocab * sizeof(float), cudaMemcpyDeviceToHost,
                           be->stream),
           "logits download");
    CU(cudaStreamSynchronize(be->stream), "forward");
    return 0;
}

/* ---- greedy sampling on the device (backend.h forward_start / argmax_finish) ---- */

static int sel_ensure(cu_backend *be, size_t n, tern_err *err)
{
    return pinned_pair_ensure(be, &be->d_sel, &be->h_sel, &be->cap_sel, n, err);
}

static int cu_forward_start(model_backend *base, tern_model *m, kv_pool *kv, const fwd_batch *b, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    int rc = cu_enqueue(be, m, kv, b, err);
    if (rc) {
        be->pending_out = -1;
        cudaStreamSynchronize(be->stream);
        cudaGetLastError();
    }
    return rc;
}

/* Waits for the stream, whatever happened before (so a failed finish leaves
 * nothing running), and reports the first failure. */
static int sel_sync(cu_backend *be, int rc, tern_err *err)
{
    cudaError_t ce = cudaStreamSynchronize(be->stream);
    if (rc)
        return rc;
    if (ce != cudaSuccess)
        return cu_fail(err, (int)ce, "greedy sampling");
    return 0;
}

static int cu_argmax_finish(model_backend *base, const uint32_t *masks, int32_t n_words, const uint8_t *mask_on,
                            int32_t *ids, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    int n_out = be->pending_out, V = be->m->cfg.n_vocab, rc = 0;
    be->pending_out = -1;
    if (n_out < 0)
        return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: argmax_finish without forward_start"), err);
    if (n_out == 0)
        return sel_sync(be, 0, err);
    int any = 0;
    for (int j = 0; masks && mask_on && j < n_out; j++)
        any |= mask_on[j] != 0;
    if (any && (size_t)n_words * 32 < (size_t)V)
        return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: %d mask words for %d tokens", n_words, V), err);
    size_t nw = any ? (size_t)n_words : 0;
    /* pinned layout: [n_out] flags, [n_out][nw] masks, [n_out] ids */
    if ((rc = sel_ensure(be, (size_t)n_out * (nw + 2), err)))
        return sel_sync(be, rc, err);
    int32_t *h = be->h_sel, *d = be->d_sel;
    for (int j = 0; j < n_out; j++) {
        int on = any && mask_on[j];
        h[j] = on;
        if (on)
            memcpy(h + n_out + (size_t)j * nw, masks + (size_t)j * n_words, nw * sizeof(uint32_t));
    }
    size_t up = (size_t)n_out * (1 + nw);
    int32_t *d_ids = d + up, *h_ids = h + up;
    cudaError_t ce = cudaMemcpyAsync(d, h, up * sizeof(int32_t), cudaMemcpyHostToDevice, be->stream);
    if (ce == cudaSuccess)
        ce = (cudaError_t)tcu_argmax_rows(be->logits, n_out, V, any ? (const uint32_t *)(d + n_out) : NULL,
                                          (int)nw, d, d_ids, (tcu_stream)be->stream);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(h_ids, d_ids, (size_t)n_out * sizeof(int32_t), cudaMemcpyDeviceToHost, be->stream);
    if (ce != cudaSuccess)
        return sel_sync(be, cu_fail(err, (int)ce, "greedy sampling"), err);
    if ((rc = sel_sync(be, 0, err)))
        return rc;
    memcpy(ids, h_ids, (size_t)n_out * sizeof(int32_t));
    return 0;
}

/* Sampling on the device (backend.h sample_finish): flags, masks, the rows'
 * parameters, bias, penalty and min_tokens lists go up in one copy,
 * tcu_sample_rows draws over the logits where the forward left them, and
 * only the ids and the logprobs rows ask for come back (one copy). */
_Static_assert(TCU_SAMPLE_MAX_TOP == SAMPLE_MAX_LOGPROBS, "the device reports as many alternatives as the API allows");
static int cu_sample_finish(model_backend *base, const dev_sample_row *rows, const uint32_t *masks, int32_t n_words,
                            const uint8_t *mask_on, int32_t *ids, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    int n_out = be->pending_out, V = be->m->cfg.n_vocab, rc = 0;
    be->pending_out = -1;
    if (n_out < 0)
        return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: sample_finish without forward_start"), err);
    if (n_out == 0)
        return sel_sync(be, 0, err);
    if (V > TCU_SAMPLE_MAX_VOCAB)
        return sel_sync(be, tern_err_set(err, TERN_EUNSUPPORTED, "cuda: sampling over %d tokens (at most %d)", V,
                                         TCU_SAMPLE_MAX_VOCAB), err);
    int any = 0;
    size_t nb = 0, np = 0, ns = 0, nl = 0;
    for (int j = 0; j < n_out; j++) {
        const dev_sample_row *r = &rows[j];
        any |= masks && mask_on && mask_on[j];
        if (!(r->temperature >= 0.0f) || r->n_bias < 0 || (r->n_bias > 0 && !r->bias) || !(r->u >= 0.0 && r->u < 1.0) ||
            r->n_pen < 0 || (r->n_pen > 0 && (!r->pen_ids || !r->count)) || r->n_stop < 0 ||
            (r->n_stop > 0 && !r->stop) || (r->lp && (r->n_top < 0 || r->n_top > SAMPLE_MAX_LOGPROBS)))
            return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: bad sampling parameters for row %d", j), err);
        for (int32_t k = 0; k < r->n_stop; k++)
            if (r->stop[k] < 0 || r->stop[k] >= V)
                return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: stop id %d outside the vocabulary",
                                                 r->stop[k]), err);
        ns += (size_t)r->n_stop;
        nl += r->lp != NULL;
        for (int32_t k = 0; k < r->n_bias; k++)
            if (r->bias[k].id < 0 || r->bias[k].id >= V)
                return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: logit_bias id %d outside the vocabulary",
                                                 r->bias[k].id), err);
        for (int32_t k = 0; k < r->n_pen; k++)
            if (r->pen_ids[k] < 0 || r->pen_ids[k] >= V)
                return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: penalty id %d outside the vocabulary",
                                                 r->pen_ids[k]), err);
        nb += (size_t)r->n_bias;
        np += (size_t)r->n_pen;
    }
    if (any && (size_t)n_words * 32 < (size_t)V)
        return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: %d mask words for %d tokens", n_words, V), err);
    size_t nw = any ? (size_t)n_words : 0, pw = sizeof(tcu_sample_param) / sizeof(int32_t),
           lw = sizeof(tcu_sample_lp) / sizeof(int32_t);
    /* pinned layout (32-bit words): [n_out] flags, [n_out][nw] masks, [n_out]
     * params (8-byte aligned), [nb] bias ids, [nb] bias values, [np] penalty
     * ids, [np] their output counts, [ns] stop ids; then what comes back:
     * [n_out] ids, [nl] logprobs */
    size_t o_par = ((size_t)n_out * (1 + nw) + 1) & ~(size_t)1, o_bid = o_par + (size_t)n_out * pw,
           o_bval = o_bid + nb, o_pid = o_bval + nb, o_pcn = o_pid + np, o_sup = o_pcn + np, o_ids = o_sup + ns,
           o_lp = o_ids + (size_t)n_out;
    if ((rc = sel_ensure(be, o_lp + nl * lw, err)))
        return sel_sync(be, rc, err);
    int32_t *h = be->h_sel, *d = be->d_sel;
    for (int j = 0, bo = 0, po = 0, so = 0, lo = 0; j < n_out; j++) {
        const dev_sample_row *r = &rows[j];
        int on = any && mask_on[j];
        h[j] = on;
        if (on)
            memcpy(h + n_out + (size_t)j * nw, masks + (size_t)j * n_words, nw * sizeof(uint32_t));
        int pen = r->rep != 1.0f || r->pres != 0.0f || r->freq != 0.0f;
        tcu_sample_param p = {r->u, r->temperature, r->top_p, r->min_p, r->top_k, bo, r->n_bias,
                              r->rep, r->pres, r->freq, po, pen ? r->n_pen : 0, pen,
                              so, r->n_stop, r->lp != NULL, r->n_top, r->lp ? lo++ : 0};
        memcpy(h + o_par + (size_t)j * pw, &p, sizeof p);
        for (int32_t k = 0; k < r->n_stop; k++, so++)
            h[o_sup + (size_t)so] = r->stop[k];
        for (int32_t k = 0; k < r->n_bias; k++, bo++) {
            h[o_bid + (size_t)bo] = r->bias[k].id;
            memcpy(h + o_bval + (size_t)bo, &r->bias[k].bias, sizeof(float));
        }
        for (int32_t k = 0; pen && k < r->n_pen; k++, po++) {
            h[o_pid + (size_t)po] = r->pen_ids[k];
            h[o_pcn + (size_t)po] = (int32_t)r->count[r->pen_ids[k]];
        }
    }
    cudaError_t ce = cudaMemcpyAsync(d, h, o_ids * sizeof(int32_t), cudaMemcpyHostToDevice, be->stream);
    if (ce == cudaSuccess)
        ce = (cudaError_t)tcu_sample_rows(be->logits, n_out, V, (const tcu_sample_param *)(const void *)(d + o_par),
                                          d + o_bid, (const float *)(const void *)(d + o_bval), d + o_pid, d + o_pcn,
                                          d + o_sup, any ? (const uint32_t *)(d + n_out) : NULL, (int)nw, d,
                                          d + o_ids, nl ? (tcu_sample_lp *)(void *)(d + o_lp) : NULL,
                                          (tcu_stream)be->stream);
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(h + o_ids, d + o_ids, ((size_t)n_out + nl * lw) * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, be->stream);
    if (ce != cudaSuccess)
        return sel_sync(be, cu_fail(err, (int)ce, "sampling"), err);
    if ((rc = sel_sync(be, 0, err)))
        return rc;
    memcpy(ids, h + o_ids, (size_t)n_out * sizeof(int32_t));
    for (int j = 0, lo = 0; j < n_out; j++) {
        sample_result *res = rows[j].lp;
        if (!res)
            continue;
        tcu_sample_lp l;
        memcpy(&l, h + o_lp + (size_t)lo++ * lw, sizeof l);
        res->id = ids[j];
        res->logprob = l.logprob;
        res->n_top = ids[j] >= 0 ? l.n_top : 0;
        for (int k = 0; k < res->n_top; k++) {
            res->top[k].id = l.top_id[k];
            res->top[k].logprob = l.top_lp[k];
        }
    }
    return 0;
}

static int cu_logits_finish(model_backend *base, float *logits, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    int n_out = be->pending_out;
    be->pending_out = -1;
    if (n_out < 0)
        return sel_sync(be, tern_err_set(err, TERN_EINVAL, "cuda: logits_finish without forward_start"), err);
    cudaError_t ce = cudaSuccess;
    if (n_out > 0)
        ce = cudaMemcpyAsync(logits, be->logits, (size_t)n_out * be->m->cfg.n_vocab * sizeof(float),
                             cudaMemcpyDeviceToHost, be->stream);
    return sel_sync(be, ce != cudaSuccess ? cu_fail(err, (int)ce, "logits download") : 0, err);
}

static int cu_mem_reserve(model_backend *base, int max_t, int max_out, size_t *free_bytes, size_t *total_bytes,
                          tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    if (!be->m)
        return tern_err_set(err, TERN_EINVAL, "cuda: no model on this backend");
    CU(cudaSetDevice(be->device), "set device");
    int rc;
    if (max_t < 1)
        max_t = 1;
    if ((rc = scratch_ensure(be, max_t, max_out, err)) ||
        ((max_t >= be->opts.gemm_min_t || max_out >= be->opts.gemm_min_t) && (rc = wdq_ensure(be, err))) ||
        (rc = sel_ensure(be, (size_t)(max_out > 0 ? max_out : 1) * ((be->m->cfg.n_vocab + 31) / 32 + 2), err)))
        return rc;
    size_t fr = 0, tot = 0;
    CU(cudaMemGetInfo(&fr, &tot), "memory info");
    *free_bytes = fr;
    *total_bytes = tot;
    return 0;
}

/* ---- LoRA adapters (backend_cuda_lora.c) ---- */

static int cu_lora_upload_be(model_backend *base, struct model_lora *a, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    if (!be->m)
        return tern_err_set(err, TERN_EINVAL, "cuda: LoRA adapters need the device forward");
    return cu_lora_upload(be->device, be->m->cfg.n_layer, a, err);
}

static int cu_lora_rows_be(model_backend *base, const struct model_lora *const *lora, int T, tern_err *err)
{
    cu_backend *be = (cu_backend *)base;
    if (!be->m)
        return lora ? tern_err_set(err, TERN_EINVAL, "cuda: LoRA adapters need the device forward") : 0;
    CU(cudaSetDevice(be->device), "set device");
    return cu_lora_rows_set(&be->lora, be->m->cfg.n_layer, lora, T, (tcu_stream)be->stream, err);
}

static int cu_n_threads(const model_backend *base)
{
    (void)base;
    return 1;
}

static void cu_free(model_backend *base)
{
    cu_backend *be = (cu_backend *)base;
    if (!be)
        return;
    if (be->stream)
        cudaSetDevice(be->device);
    graphs_clear(be);
    /* the pools still mirrored outlive their mirrors: no hooks into a freed backend */
    for (int i = 0; i < be->parked.n; i++)
        kvm_free(be, &be->parked.m[i], 1);
    be->parked.n = 0;
    kvm_free(be, &be->kvm, 1);
    cu_moe_free(be->moe);
    for (int i = 0; i < be->n_allocs; i++)
        cudaFree(be->allocs[i]);
    cudaFreeHost(be->h_in);
    cudaFreeHost(be->h_sel);
    if (be->blas)
        cublasDestroy(be->blas);
    cu_lt_free(be->lt);
    if (be->stream) {
        cudaStreamSynchronize(be->stream);
        tcu_stream_forget((tcu_stream)be->stream);
        cudaStreamDestroy(be->stream);
    }
    cu_lora_free(be->lora);
    free(be->allocs);
    free(be->w);
    free(be->layers);
    cu_kvm_clear(&be->kvm);
    free(be);
    cudaGetLastError(); /* leave no error behind for the next caller */
}

int model_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static size_t model_device_bytes(const tern_model *m)
{
    size_t n = host_wbytes(&m->embed) + (m->lm_head.data != m->embed.data ? host_wbytes(&m->lm_head) : 0);
    const model_weight *ws[2] = {&m->embed, &m->lm_head};
    for (int i = 0; i < 2; i++)
        if (ws[i]->qbits)
            n += (size_t)ws[i]->n_out * (ws[i]->n_in / ws[i]->group) * 8;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        const model_weight *lw[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            n += host_wbytes(lw[i]) + (lw[i]->qbits ? (size_t)lw[i]->n_out * (lw[i]->n_in / lw[i]->group) * 8 : 0);
    }
    return n;
}

static int cu_setup(cu_backend *be, tern_model *m, tern_err *err)
{
    int n;
    if ((n = model_cuda_device_count()) <= 0)
        return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: no GPU found");
    if (be->device < 0 || be->device >= n)
        return tern_err_set(err, TERN_EINVAL, "cuda: device %d does not exist (%d GPUs)", be->device, n);
    CU(cudaSetDevice(be->device), "set device");
    cudaGetLastError(); /* a failure of another caller's launch is not ours */
    CU(cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking), "stream");
    if (cublasCreate(&be->blas) != CUBLAS_STATUS_SUCCESS)
        return tern_err_set(err, TERN_EIO, "cuda: cuBLAS did not start");
    cublasSetStream(be->blas, be->stream);
    int lrc = cu_lt_new(&be->lt, be->stream, be->opts.lt_splitk, err);
    if (lrc)
        return lrc;
    if (!m) { /* table path only (kernel tests): weights upload on first use */
        be->cap_w = 256;
        if (!(be->w = calloc((size_t)be->cap_w, sizeof *be->w)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        return 0;
    }
    const model_config *c = &m->cfg;
    be->cap_w = 7 * c->n_layer + 2 + 64; /* + room for table-path weights of tests */
    if (!(be->w = calloc((size_t)be->cap_w, sizeof *be->w)) || !(be->layers = calloc((size_t)c->n_layer, sizeof *be->layers)))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    int rc = model_head_dim_check(&be->base, c->head_dim, err);
    if (rc)
        return rc;
    size_t need = model_device_bytes(m) + cu_moe_bytes(m), fr = 0, tot = 0;
    CU(cudaMemGetInfo(&fr, &tot), "memory info");
    if (need + (256u << 20) > fr)
        return tern_err_set(err, TERN_ENOMEM,
                            "cuda: the model needs %.2f GB of GPU memory for its weights, GPU %d has %.2f GB free "
                            "of %.2f GB (try a 4-bit conversion: tern convert)",
                            need / 1e9, be->device, fr / 1e9, tot / 1e9);
    if ((rc = weight_get(be, &m->embed, &be->embed, err)) || (rc = weight_get(be, &m->lm_head, &be->lm_head, err)) ||
        (rc = up_vec(be, m->final_norm, (size_t)c->dim, &be->final_norm, err)))
        return rc;
    float *rope_g = NULL, *rope_l = NULL;
    int hd = c->head_dim;
    if ((rc = up_vec(be, m->rope_inv_freq, (size_t)hd / 2, &rope_g, err)) ||
        (rc = up_vec(be, m->rope_inv_freq_local, (size_t)hd / 2, &rope_l, err)))
        return rc;
    for (int l = 0; l < c->n_layer; l++) {
        const model_layer *H = &m->layers[l];
        cu_layer *L = &be->layers[l];
        /* q/k/v (gate/up) rows side by side for the merged cuBLASLt GEMMs
         * (tcu_opts.lt_cat), else one allocation each */
        const model_weight *qkv_w[3] = {&H->wq, &H->wk, &H->wv}, *gu_w[2] = {&H->w_gate, &H->w_up};
        const tcu_mat *qkv_m[3], *gu_m[2];
        if ((be->opts.lt_cat & TCU_CAT_QKV) && (rc = weight_group_get(be, qkv_w, 3, qkv_m, err)) < 0)
            return rc;
        if ((L->qkv_cat = (be->opts.lt_cat & TCU_CAT_QKV) && rc == 1)) {
            L->wq = qkv_m[0];
            L->wk = qkv_m[1];
            L->wv = qkv_m[2];
        }
        rc = 0;
        if (!H->experts && (be->opts.lt_cat & TCU_CAT_GU) && (rc = weight_group_get(be, gu_w, 2, gu_m, err)) < 0)
            return rc;
        if ((L->gu_cat = !H->experts && (be->opts.lt_cat & TCU_CAT_GU) && rc == 1)) {
            L->wg = gu_m[0];
            L->wu = gu_m[1];
        }
        if ((!L->qkv_cat && ((rc = weight_get(be, &H->wq, &L->wq, err)) || (rc = weight_get(be, &H->wk, &L->wk, err)) ||
                             (rc = weight_get(be, &H->wv, &L->wv, err)))) ||
            (rc = weight_get(be, &H->wo, &L->wo, err)) ||
            (!H->experts && ((!L->gu_cat && ((rc = weight_get(be, &H->w_gate, &L->wg, err)) ||
                                             (rc = weight_get(be, &H->w_up, &L->wu, err)))) ||
                             (rc = weight_get(be, &H->w_down, &L->wd, err)))))
            return rc;
        size_t qd = (size_t)c->n_head * hd, kvd = (size_t)c->n_kv_head * hd;
        if ((rc = up_vec(be, H->attn_norm, (size_t)c->dim, &L->attn_norm, err)) ||
            (rc = up_vec(be, H->ffn_norm, (size_t)c->dim, &L->ffn_norm, err)) ||
            (rc = up_vec(be, H->post_attn_norm, (size_t)c->dim, &L->post_attn_norm, err)) ||
            (rc = up_vec(be, H->post_ffn_norm, (size_t)c->dim, &L->post_ffn_norm, err)) ||
            (rc = up_vec(be, H->q_norm, (size_t)hd, &L->q_norm, err)) ||
            (rc = up_vec(be, H->k_norm, (size_t)hd, &L->k_norm, err)) || (rc = up_vec(be, H->bq, qd, &L->bq, err)) ||
            (rc = up_vec(be, H->bk, kvd, &L->bk, err)) || (rc = up_vec(be, H->bv, kvd, &L->bv, err)) ||
            (rc = up_vec(be, H->sinks, (size_t)c->n_head, &L->sinks, err)) ||
            (rc = up_vec(be, H->bo, (size_t)c->dim, &L->bo, err)))
            return rc;
        L->rope = H->rope_inv_freq == m->rope_inv_freq_local ? rope_l : rope_g;
        L->rope_af = H->rope_af;
    }
    if ((rc = cu_moe_new(m, (tcu_stream)be->stream, &be->moe, err)))
        return rc;
    CU(cudaDeviceSynchronize(), "upload");
    return 0;
}

/* The environment's overrides (backend_cuda.h): developer experiments
 * only - A/B measurements and tests; every default is the measured best.
 * Integers within [lo, hi]; TERN_CUDA_GEMV by name below. */
static const struct cu_env_opt {
    const char *name;
    size_t off; /* of the int in tcu_opts */
    int lo, hi;
} cu_env_opts[] = {
    {"TERN_CUDA_PDL", offsetof(tcu_opts, pdl), 0, 1},
    {"TERN_CUDA_ATTN_EARLY", offsetof(tcu_opts, attn_early), 0, 1},
    {"TERN_CUDA_ATTN_FUSE", offsetof(tcu_opts, attn_merge_last), 0, 1},
    {"TERN_CUDA_ATTN_GQA", offsetof(tcu_opts, attn_gqa), 0, 1},
    {"TERN_CUDA_ATTN_TILED", offsetof(tcu_opts, attn_tiled), TCU_ATTN_TILED_OFF, TCU_ATTN_TILED_TF32},
    {"TERN_CUDA_GEMM_MIN_T", offsetof(tcu_opts, gemm_min_t), 1, INT_MAX},
    {"TERN_CUDA_TC_MAX_T", offsetof(tcu_opts, tc_max_t), 0, 128},
    {"TERN_CUDA_LT", offsetof(tcu_opts, lt), 0, 1},
    {"TERN_CUDA_F8_TC", offsetof(tcu_opts, f8_tc), 0, 2},
    {"TERN_CUDA_Q4_TC", offsetof(tcu_opts, q4_tc), 0, 2},
    {"TERN_CUDA_Q4_TILE", offsetof(tcu_opts, q4_tile), 0, 24},
    {"TERN_CUDA_Q4_SPLIT", offsetof(tcu_opts, q4_split), 0, 8},
    {"TERN_CUDA_ATTN_TILES", offsetof(tcu_opts, attn_tiles), 0, 3},
    {"TERN_CUDA_ATTN_Z", offsetof(tcu_opts, attn_z), 0, 64},
    {"TERN_CUDA_GRAPHS", offsetof(tcu_opts, graphs), 0, 1},
    {"TERN_CUDA_QKV_FUSE", offsetof(tcu_opts, qkv_fuse), 0, 1},
    {"TERN_CUDA_GEMV_STAGE", offsetof(tcu_opts, gemv_stage), 0, 1},
    {"TERN_CUDA_EARLY", offsetof(tcu_opts, early), 0, 31},
    {"TERN_CUDA_RING", offsetof(tcu_opts, ring), 0, 31},
    {"TERN_CUDA_SPLIT_LEN1", offsetof(tcu_opts, split_len1), 0, INT_MAX},
    {"TERN_CUDA_SPLIT_LEN", offsetof(tcu_opts, split_len), 1, INT_MAX},
    {"TERN_CUDA_MOE", offsetof(tcu_opts, moe), 0, 127},
    {"TERN_CUDA_INVARIANT", offsetof(tcu_opts, invariant), 0, TCU_INV_PRODUCTS | TCU_INV_ATTN},
    {"TERN_CUDA_LT_CAT", offsetof(tcu_opts, lt_cat), 0, TCU_CAT_QKV | TCU_CAT_GU},
    {"TERN_CUDA_LT_SPLITK", offsetof(tcu_opts, lt_splitk), 0, 1},
};

/* TERN_CUDA_GEMV: one kernel name for every weight kind, or three (bf16,
 * 4-bit, 8-bit) separated by commas. */
static int cu_gemv_parse(const char *e, tcu_opts *o, tern_err *err)
{
    int v[3], n = 0;
    for (const char *p = e;;) {
        const size_t len = strcspn(p, ",");
        int k = 0;
        while (k < TCU_GEMV_N && !(strlen(tcu_gemv_name(k)) == len && !strncmp(p, tcu_gemv_name(k), len)))
            k++;
        if (k == TCU_GEMV_N || n == 3) {
            n = 0;
            break;
        }
        v[n++] = k;
        if (!p[len])
            break;
        p += len + 1;
    }
    if (n != 1 && n != 3)
        return tern_err_set(err, TERN_EINVAL,
                            "TERN_CUDA_GEMV=%s: one or three (bf16,4-bit,8-bit) of plain, staged, by-shape, tensor, "
                            "auto",
                            e);
    o->gemv_bf16 = v[0];
    o->gemv_q4 = v[n == 3 ? 1 : 0];
    o->gemv_q8 = v[n == 3 ? 2 : 0];
    return 0;
}

int model_cuda_opts_from_env(tcu_opts *o, tern_err *err)
{
    tcu_opts_init(o);
    /* --exact-products (the process-wide switch of the CPU kernels too):
     * f32-exact activations, no cuBLAS unless the environment says so */
    if (tern_kernels_exact_get()) {
        o->exact = 1;
        o->gemm_min_t = INT_MAX;
    }
    for (size_t i = 0; i < sizeof cu_env_opts / sizeof *cu_env_opts; i++) {
        const struct cu_env_opt *d = &cu_env_opts[i];
        const char *e = getenv(d->name);
        if (!e)
            continue;
        char *end;
        long v = strtol(e, &end, 10);
        if (end == e || *end || v < d->lo || v > d->hi)
            return tern_err_set(err, TERN_EINVAL, "%s=%s: an integer from %d to %d is needed", d->name, e, d->lo,
                                d->hi);
        *(int *)(void *)((char *)o + d->off) = (int)v;
    }
    const char *g = getenv("TERN_CUDA_GEMV");
    return g ? cu_gemv_parse(g, o, err) : 0;
}

/* Every field of o within what it may be (the ranges of cu_env_opts). */
static int cu_opts_check(const tcu_opts *o, tern_err *err)
{
    for (size_t i = 0; i < sizeof cu_env_opts / sizeof *cu_env_opts; i++) {
        const struct cu_env_opt *d = &cu_env_opts[i];
        const int v = *(const int *)(const void *)((const char *)o + d->off);
        if (v < d->lo || v > d->hi)
            return tern_err_set(err, TERN_EINVAL, "cuda: option %s is %d (from %d to %d)", d->name + 10, v, d->lo,
                                d->hi);
    }
    if (o->exact != 0 && o->exact != 1)
        return tern_err_set(err, TERN_EINVAL, "cuda: option exact is %d (0 or 1)", o->exact);
    const int g[3] = {o->gemv_bf16, o->gemv_q4, o->gemv_q8};
    for (int i = 0; i < 3; i++)
        if (g[i] < 0 || g[i] >= TCU_GEMV_N)
            return tern_err_set(err, TERN_EINVAL, "cuda: GEMV kernel %d (0 to %d)", g[i], TCU_GEMV_N - 1);
    return 0;
}

model_backend *model_backend_cuda_new(tern_model *m, int device, tern_err *err)
{
    tcu_opts o;
    if (model_cuda_opts_from_env(&o, err))
        return NULL;
    return model_backend_cuda_new_opts(m, device, &o, err);
}

model_backend *model_backend_cuda_new_opts(tern_model *m, int device, const tcu_opts *o, tern_err *err)
{
    if (cu_opts_check(o, err))
        return NULL;
    cu_backend *be = calloc(1, sizeof *be);
    if (!be) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    be->base.name = "cuda";
    /* the attention kernels keep a head in registers, 32 lanes x up to 8 */
    be->base.head_dim_align = 32;
    be->base.head_dim_max = 256;
    be->base.matmul = cu_matmul;
    be->base.attention = cu_attention;
    be->base.forward = cu_forward;
    be->base.mem_reserve = cu_mem_reserve;
    be->base.kv_bind = cu_kv_bind;
    be->base.kv_types = cu_kvm_types(); /* every type (docs/kv-cache.md) */
    be->base.kv_default = KV_BF16; /* half of f32's bytes, faster decode at long contexts (docs/kv-cache.md) */
    be->base.forward_start = cu_forward_start;
    be->base.argmax_finish = cu_argmax_finish;
    be->base.logits_finish = cu_logits_finish;
    be->base.sample_finish = cu_sample_finish;
    be->base.lora_upload = cu_lora_upload_be;
    be->base.lora_rows = cu_lora_rows_be;
    be->pending_out = -1;
    be->base.n_threads = cu_n_threads;
    be->base.free = cu_free;
    be->device = device;
    be->m = m;
    be->opts = *o;
    if (cu_setup(be, m, err)) {
        cu_free(&be->base);
        return NULL;
    }
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    if (m) {
        char desc[1024];
        tcu_opts_format(&be->opts, desc, sizeof desc);
        TERN_INFO("cuda: %d weights on GPU %d, %.2f GB free of %.2f GB; %s", be->n_w, device, fr / 1e9, tot / 1e9,
                  desc);
    }
    return &be->base;
}

#endif
