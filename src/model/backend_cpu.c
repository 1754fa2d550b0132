/* The CPU backend (see backend.h): kernel table + spinning thread pool.
 * Fused products split the concatenated output rows of all their matrices
 * across the workers, so q/k/v (or gate/up) cost one synchronization.
 * Quantized weights use the integer products (kernels.h): the input rows are
 * quantized to int8 once per product (per group size), in parallel, before
 * the rows are split; bf16 weights, where the CPU has a bf16 dot product
 * (AVX-512 BF16), meet the input rows rounded to bf16 once per product the
 * same way; --exact-products keeps the f32-activation kernels for both.
 * FP8 weights always meet the f32 inputs (matmul_f8: one FP8 path); MXFP4
 * ones the int8 inputs of the 4-bit layout (or f32 under --exact-products). */
#include <math.h>
#include <stdio.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "model/kv_int.h"
#include "model/model_int.h"
#include "tensor/kernels.h"
#include "base/log.h"
#include "base/pool.h"

#define MM_MAX 4 /* matrices in one fused product */
#define TILES_MAX 8 /* weights laid out as tiles in one pool round */

typedef struct cpu_backend {
    model_backend base;
    const tern_kernels *k;
    tern_pool *pool;
    float *scores; /* attention scratch, att_job.ws floats a worker */
    size_t cap_scores;
    long *att_first; /* the attention's chunk items (att_run_chunks) */
    size_t cap_att_first;
    atomic_int *att_left;
    size_t cap_att_left;
    float *att_part;
    size_t cap_att_part;
    float *xsum;   /* per-group input sums for quantized products */
    size_t cap_xsum;
    int exact;     /* f32-activation products for quantized weights */
    int8_t *qx;    /* quantized inputs: [distinct groups][T][n_in] */
    size_t cap_qx;
    float *qs;     /* their block scales and sums: [distinct groups][T][2 * ngp] */
    size_t cap_qs;
    uint16_t *xb;  /* bf16 inputs for bf16 weights: [distinct inputs][T][n_in] */
    size_t cap_xb;
    int8_t *qxp;   /* qx and qs packed for integer tile products (kernels.h, i8_pack) */
    size_t cap_qxp;
    int8_t *qxa;   /* qx as the panel products' inputs (kernels.h, iq_panel_acts): [groups with panels][T][span] */
    size_t cap_qxa;
    float *qsp;
    size_t cap_qsp;
    void *mg;      /* a grouped product's per-matrix tables (cpu_matmul_grouped), bytes */
    size_t cap_mg;
    long mm_piece; /* few-token products: pieces of ~this many weight bytes, claimed by the workers */
} cpu_backend;

typedef struct mm_job {
    cpu_backend *be;
    int n;
    const model_weight *const *w;
    const float *X;
    float *const *Y;
    long T;
    long offs[MM_MAX + 1]; /* first global row of each matrix */
    const float *xsum[MM_MAX];
    const int8_t *Q[MM_MAX]; /* integer path: the quantized inputs of each matrix, else NULL */
    const float *qs[MM_MAX];
    int qpacked[MM_MAX];     /* Q and qs are packed for the integer tile products */
    const int8_t *Qa[MM_MAX]; /* the panel products' inputs (kernels.h, iq_panel_acts) where the matrix has panels */
    const uint16_t *Xb; /* bf16 inputs (bf16 weights, unless exact), else NULL */
    long unit;          /* rows a pool item: 16 where a matrix has tiles (their blocks), 4 panels (quads), else 1 */
} mm_job;

/* The quantized inputs a weight's integer product takes, shared by the
 * product's matrices (kernels.h): an MLX affine weight's bits and group; an
 * MXFP4 weight with group 32 the 4-bit layout in blocks of 32
 * (tern_imxmatmul_fn); 0 for dense ones and the other MXFP4 ones (group 16:
 * int16 inputs quantized in mm_one; 0: f32 inputs; model_int.h). */
static int mm_abits(const model_weight *w) { return w->mx ? (w->group == 32 ? 4 : 0) : w->qbits; }
static int mm_agroup(const model_weight *w) { return w->group; }

/* Xb packed: Xb holds the tile product's packed inputs (kernels.h). */
#define MX16_STACK 16384 /* int16 inputs quantized on the stack a call: tokens of up to this many inputs */

/* An MXFP4 product with int16 inputs (w->group 16, model_int.h): the part's
 * tokens quantized here, a few at a time on the stack - a token's int16
 * inputs are the same bits whichever part or tile quantizes them. */
static void mm_mx16(const tern_kernels *k, const model_weight *w, const float *X, float *Y, long T, long r0, long r1)
{
    int16_t q[MX16_STACK];
    float qs[MX16_STACK / 16 + 16];
    long n_in = w->n_in, nbp = tern_iq_nbp(n_in, 32, 4), tc = MX16_STACK / n_in, tq = (MX16_STACK / 16 + 16) / (2 * nbp);
    tc = tc < tq ? tc : tq; /* both fit: n_in <= MX16_STACK gives tc, tq >= 1 */
    for (long t = 0; t < T; t += tc) {
        long n = T - t < tc ? T - t : tc;
        k->quant_act16(X + t * n_in, n, n_in, q, qs);
        k->imatmul_mxfp4_16(w->data, w->mx, q, qs, Y + t * w->n_out, n, n_in, w->n_out, r0, r1);
    }
}

static void mm_one(const tern_kernels *k, const model_weight *w, const float *X, const float *xsum,
                   const int8_t *Q, const float *qs, const uint16_t *Xb, int packed, float *Y, long T, long r0,
                   long r1, int exact)
{
    if (w->mx) { /* int8 or int16 inputs (the default, by w->group) or f32 (--exact-products); never packed */
        if (Q)
            k->imatmul_mxfp4(w->data, w->mx, Q, qs, Y, T, w->n_in, w->n_out, r0, r1);
        else if (w->group == 16 && !exact && w->n_in <= MX16_STACK)
            mm_mx16(k, w, X, Y, T, r0, r1);
        else
            k->matmul_mxfp4(w->data, w->mx, X, Y, T, w->n_in, w->n_out, r0, r1);
        return;
    }
    if (packed && Q)
        (w->qbits == 4 ? k->imatmul_q4p : k->imatmul_q8p)(w->data, w->sb, w->group, Q, qs, Y, T, w->n_in, w->n_out,
                                                          r0, r1);
    else if (packed)
        k->matmul_bf16t(w->tiles, Xb, Y, T, w->n_in, w->n_out, r0, r1);
    else if (Xb)
        k->matmul_bf16b(w->data, Xb, Y, T, w->n_in, w->n_out, r0, r1);
    else if (w->mx) /* f32 inputs, exact or not: the CPU's one MXFP4 product */
        k->matmul_mxfp4(w->data, w->mx, X, Y, T, w->n_in, w->n_out, r0, r1);
    else if (w->dtype == TERN_F8E4M3) /* f32 inputs, exact or not: the CPU's one FP8 product */
        k->matmul_f8(w->data, w->fs, w->fs_rows, w->fs_cols, X, Y, T, w->n_in, w->n_out, r0, r1);
    else if (w->qbits && Q && T == 1 && w->sb16 && (w->qbits == 4 ? k->imatmul_q4h : k->imatmul_q8h) &&
             w->group % 64 == 0 && w->n_in <= TERN_IQ16_MAX_IN) /* decode: the bf16 pairs, fewer bytes */
        (w->qbits == 4 ? k->imatmul_q4h : k->imatmul_q8h)(w->data, w->sb16, w->group, Q, qs, Y, w->n_in, r0, r1);
    else if (w->qbits && Q)
        (w->qbits == 4 ? k->imatmul_q4 : k->imatmul_q8)(w->data, w->sb, w->group, Q, qs, Y, T, w->n_in, w->n_out,
                                                        r0, r1);
    else if (w->qbits)
        (w->qbits == 4 ? k->matmul_q4 : k->matmul_q8)(w->data, w->sb, w->group, X, xsum, Y, T, w->n_in, w->n_out,
                                                      r0, r1);
    else
        (w->dtype == TERN_F32 ? k->matmul_f32 : w->dtype == TERN_BF16 ? k->matmul_bf16 : k->matmul_f16)(
            w->data, X, Y, T, w->n_in, w->n_out, r0, r1);
}

/* Rows [r0, r1) of w for all T tokens, in cache-sized tiles when T is
 * large: a block of weight rows (~64 KB) stays in L1/L2 while a block of
 * tokens (~256 KB of inputs) streams past it. Tiling changes no arithmetic:
 * every (row, token) result is computed by the same kernel code, so the
 * results are bit-identical to the untiled product. */
static void mm_tiled(const tern_kernels *k, const model_weight *w, const float *X, const float *xsum,
                     const int8_t *Q, const float *qs, const uint16_t *Xb, int packed, float *Y, long T, long r0,
                     long r1, int exact)
{
    long n_in = w->n_in;
    long row_bytes = w->qbits ? n_in * w->qbits / 8 : w->mx ? n_in / 2 : n_in * (long)tern_dtype_size(w->dtype);
    /* integer path: all the part's rows per tile, so that a kernel's one-off
     * rearranging of its token tile (the panels, intdot_simd.h) is shared
     * by every row; ~512 KB of int8 inputs per token tile stay in L2 while
     * the rows stream past them */
    long rb = Q ? r1 - r0 : 65536 / row_bytes, tb = (Q ? 524288 / n_in : 262144 / (n_in * (Xb ? 2 : 4))) & ~1L;
    if (!Q && !Xb && !w->qbits && !w->mx && k->dense_blocked) { /* f32 inputs, dense or FP8 weights, kernels that block for L1 */
        rb = 96;
        tb = 64;
    }
    if (packed) { /* the tile product blocks its part itself */
        mm_one(k, w, X, xsum, Q, qs, Xb, 1, Y, T, r0, r1, exact);
        return;
    }
    if (rb < 1)
        rb = 1;
    if (tb < 2)
        tb = 2;
    if (T <= tb) {
        mm_one(k, w, X, xsum, Q, qs, Xb, 0, Y, T, r0, r1, exact);
        return;
    }
    long ng = w->qbits ? n_in / w->group : 0;
    for (long r = r0; r < r1; r += rb)
        for (long t = 0; t < T; t += tb)
            mm_one(k, w, X + t * n_in, xsum ? xsum + t * ng : NULL, Q ? Q + t * n_in : NULL,
                   qs ? qs + t * 2 * tern_iq_nbp(n_in, mm_agroup(w), mm_abits(w)) : NULL, Xb ? Xb + t * n_in : NULL, 0,
                   Y + t * w->n_out,
                   T - t < tb ? T - t : tb, r, r + rb < r1 ? r + rb : r1, exact);
}

/* A row's weight bytes with its scales (the decode's piece sizes). */
static long mm_row_bytes(const model_weight *w)
{
    if (w->qbits)
        return w->n_in * w->qbits / 8 + w->n_in / w->group * 4;
    if (w->fs) /* a byte a weight, an f32 scale a block (shared by fs_rows rows) */
        return w->n_in + (w->n_in + w->fs_cols - 1) / w->fs_cols * 4 / w->fs_rows;
    if (w->mx) /* half a byte a weight, a scale byte per 32 */
        return w->n_in / 2 + w->n_in / 32;
    return w->n_in * (long)tern_dtype_size(w->dtype);
}

/* Whether w meets bf16 inputs (kernels.h, tern_bmatmul_fn). */
static int mm_uses_bf16b(const cpu_backend *be, const model_weight *w)
{
    return !be->exact && be->k->matmul_bf16b && !w->qbits && w->dtype == TERN_BF16;
}

/* Whether w's product runs on its tiles (model_backend_cpu_tiles). */
static int mm_uses_tiles(const cpu_backend *be, const model_weight *w)
{
    return w->tiles && mm_uses_bf16b(be, w) && tern_bf16t_ok(be->k, w->n_in);
}

/* Whether w's product runs on its panels (model_backend_cpu_tiles). */
static int mm_uses_panels(const cpu_backend *be, const model_weight *w)
{
    return w->panels && !be->exact && w->qbits && tern_iq_panels_ok(be->k, w->group, w->qbits, w->n_in);
}

/* Rows [r0, r1) of w on its panels for T tokens (A: the inputs as
 * iq_panel_acts lays them out). */
static void mm_panels(const tern_kernels *k, const model_weight *w, const int8_t *A, const float *qs, float *Y,
                      long T, long r0, long r1)
{
    (w->qbits == 4 ? k->imatmul_q4w : k->imatmul_q8w)(w->panels, w->group, A, qs, Y, T, w->n_in, w->n_out, r0, r1);
}

static void mm_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    mm_job *j = ctx;
    b *= j->unit;
    e = e * j->unit < j->offs[j->n] ? e * j->unit : j->offs[j->n];
    for (int i = 0; i < j->n; i++) {
        long lo = b > j->offs[i] ? b : j->offs[i], hi = e < j->offs[i + 1] ? e : j->offs[i + 1];
        if (lo < hi && j->Qa[i]) { /* the panels: one call, the kernel blocks its tokens itself */
            mm_panels(j->be->k, j->w[i], j->Qa[i], j->qs[i], j->Y[i], j->T, lo - j->offs[i], hi - j->offs[i]);
        } else if (lo < hi) {
            int tiles = mm_uses_tiles(j->be, j->w[i]);
            mm_tiled(j->be->k, j->w[i], j->X, j->xsum[i], j->Q[i], j->qs[i],
                     mm_uses_bf16b(j->be, j->w[i]) ? j->Xb : NULL, tiles || j->qpacked[i], j->Y[i], j->T,
                     lo - j->offs[i], hi - j->offs[i], j->be->exact);
        }
    }
}

typedef struct quant_job {
    const tern_kernels *k;
    const float *X;
    long n_in;
    int group, bits;
    int8_t *Q;
    float *qs;
} quant_job;

static void quant_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    quant_job *j = ctx;
    long nbp = tern_iq_nbp(j->n_in, j->group, j->bits);
    j->k->quant_act(j->X + b * j->n_in, e - b, j->n_in, j->group, j->bits, j->Q + b * j->n_in,
                    j->qs + b * 2 * nbp);
}

typedef struct bf16_job {
    const tern_kernels *k;
    const float *X;
    uint16_t *Xb;
    long n_in;
} bf16_job;

static void bf16_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    bf16_job *j = ctx;
    j->k->bf16_act(j->X + b * j->n_in, (e - b) * j->n_in, j->Xb + b * j->n_in);
}

typedef struct pacts_job {
    const tern_kernels *k;
    const int8_t *Q;
    int8_t *A;
    long n_in;
    int group, bits;
    long span;
} pacts_job;

static void pacts_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    pacts_job *j = ctx;
    j->k->iq_panel_acts(j->Q + b * j->n_in, e - b, j->n_in, j->group, j->bits, j->A + b * j->span);
}

/* Packs items [b, e) of the quantized inputs (kernels.h, i8_pack): item i
 * is token block i / nc (16 tokens, the last may be short: T) and its
 * 4-byte words in range i % nc of nc - so a 16-token step's packing runs
 * on as many threads as its ranges (one block on one thread was ~8% of a
 * 16-stream step on the Xeon's 16 threads; ten alternating runs there,
 * 16 streams 8-bit 433 against 411 t/s, 4-bit 531 against 496, medians). */
typedef struct ipack_job {
    const tern_kernels *k;
    const int8_t *Q;
    const float *qs;
    int8_t *Qp;
    float *qsp;
    long T, n_in, ngp, nc;
} ipack_job;

static void ipack_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    ipack_job *j = ctx;
    long nw = j->n_in / 4;
    for (long i = b; i < e; i++) {
        long blk = i / j->nc, c = i % j->nc, t = blk * 16;
        j->k->i8_pack(j->Q + t * j->n_in, j->qs + t * 2 * j->ngp, j->T - t < 16 ? j->T - t : 16, j->n_in, j->ngp,
                      j->Qp + t * j->n_in, j->qsp + t * 2 * j->ngp, nw * c / j->nc, nw * (c + 1) / j->nc);
    }
}

/* Grows *buf to hold need elements of size sz (doubling). */
static int grow(void **buf, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    void *nb = realloc(*buf, need * 2 * sz);
    if (!nb)
        return TERN_ENOMEM;
    *buf = nb;
    *cap = need * 2;
    return 0;
}

/* Whether weights a and b take the same quantized inputs (kernels.h: the
 * same bits and activation block - 8-bit weights of any group share). */
static int mm_same_quant(const model_weight *a, const model_weight *b)
{
    return mm_abits(a) == mm_abits(b) &&
           tern_iq_ablock(mm_agroup(a), mm_abits(a)) == tern_iq_ablock(mm_agroup(b), mm_abits(b));
}

/* The integer path's inputs: X quantized once per distinct (activation
 * block, bits) among the quantized matrices of the job (usually one),
 * shared by them. */
static int mm_quantize(cpu_backend *be, mm_job *j, int n, const model_weight *const *w, const float *X, long T,
                       tern_err *err)
{
    const model_weight *first[MM_MAX]; /* the first matrix of each distinct quantization */
    int n_groups = 0;
    size_t need_q = 0, need_s = 0;
    for (int i = 0; i < n; i++) {
        if (!mm_abits(w[i]))
            continue;
        int seen = 0;
        for (int k = 0; k < n_groups; k++)
            seen |= mm_same_quant(first[k], w[i]);
        if (seen)
            continue;
        first[n_groups++] = w[i];
        need_q += (size_t)T * w[i]->n_in;
        need_s += (size_t)T * 2 * tern_iq_nbp(w[i]->n_in, mm_agroup(w[i]), mm_abits(w[i]));
    }
    if (!n_groups)
        return 0;
    int panels[MM_MAX] = {0}; /* quantization k's inputs go to some matrix's panels too */
    size_t need_a = 0;
    for (int k = 0; k < n_groups; k++) {
        for (int i = 0; i < n; i++)
            panels[k] |= mm_abits(w[i]) && mm_same_quant(first[k], w[i]) && mm_uses_panels(be, w[i]);
        if (panels[k])
            need_a += (size_t)T * tern_iq_panel_span(first[k]->n_in, mm_agroup(first[k]), mm_abits(first[k]));
    }
    if (grow((void **)&be->qx, &be->cap_qx, need_q, 1) || grow((void **)&be->qs, &be->cap_qs, need_s, sizeof(float)) ||
        grow((void **)&be->qxa, &be->cap_qxa, need_a, 1))
        return tern_err_set(err, TERN_ENOMEM, "out of memory for quantized inputs");
    int8_t *q = be->qx, *qa = be->qxa;
    float *qs = be->qs;
    long n_in = w[0]->n_in;
    for (int k = 0; k < n_groups; k++) {
        int group = mm_agroup(first[k]), bits = mm_abits(first[k]);
        long nbp = tern_iq_nbp(n_in, group, bits);
        quant_job qj = {be->k, X, n_in, group, bits, q, qs};
        /* ~2k inputs per part: cheap next to the product, but at 16 tokens
         * ~16k a part left 14 of 16 threads waiting on 2 */
        tern_pool_for(be->pool, T, 2048 / n_in + 1, quant_run, &qj);
        const int8_t *uq = q;
        const float *us = qs;
        /* one packed buffer; every matrix sharing it must take the tiles (panels take the plain inputs) */
        int packed = k == 0;
        for (int i = 0; i < n; i++)
            if (mm_abits(w[i]) && mm_same_quant(first[k], w[i]))
                packed &= !w[i]->mx && !mm_uses_panels(be, w[i]) && tern_iqp_ok(be->k, w[i]->group, w[i]->qbits, T);
        if (packed) { /* packed copies for the tile products, a 16-token block per part */
            long nb = (T + 15) / 16;
            if (grow((void **)&be->qxp, &be->cap_qxp, (size_t)nb * 16 * n_in, 1) ||
                grow((void **)&be->qsp, &be->cap_qsp, (size_t)nb * 16 * 2 * nbp, sizeof(float)))
                return tern_err_set(err, TERN_ENOMEM, "out of memory for packed quantized inputs");
            /* ranges of >= 128 words (8 KB of a block) */
            long nc = n_in / 4 / 128 > 0 ? n_in / 4 / 128 : 1;
            ipack_job pj = {be->k, q, qs, be->qxp, be->qsp, T, n_in, nbp, nc};
            tern_pool_for(be->pool, nb * nc, 1, ipack_run, &pj);
            uq = be->qxp;
            us = be->qsp;
        }
        if (panels[k]) { /* once for every part of every matrix that takes them */
            pacts_job aj = {be->k, q, qa, n_in, group, bits, tern_iq_panel_span(n_in, group, bits)};
            tern_pool_for(be->pool, T, 2048 / n_in + 1, pacts_run, &aj);
        }
        for (int i = 0; i < n; i++)
            if (mm_abits(w[i]) && mm_same_quant(first[k], w[i])) {
                j->Q[i] = uq;
                j->qs[i] = us;
                j->qpacked[i] = packed;
                j->Qa[i] = mm_uses_panels(be, w[i]) ? qa : NULL;
            }
        if (panels[k])
            qa += (size_t)T * tern_iq_panel_span(n_in, group, bits);
        q += (size_t)T * n_in;
        qs += (size_t)T * 2 * nbp;
    }
    return 0;
}

static int cpu_matmul(model_backend *base, int n, const model_weight *const *w, const float *X, float *const *Y,
                      int T, tern_err *err)
{
    cpu_backend *be = (cpu_backend *)base;
    if (n < 1 || n > MM_MAX)
        return tern_err_set(err, TERN_EINVAL, "matmul: %d matrices in one job", n);
    mm_job j = {be, n, w, X, Y, T, {0}, {0}, {0}, {0}, {0}, {0}, NULL, 1};
    if (!be->exact) {
        int rc = mm_quantize(be, &j, n, w, X, T, err);
        if (rc)
            return rc;
    }
    for (int i = 0; i < n && !j.Xb; i++)
        if (mm_uses_bf16b(be, w[i])) {
            if (grow((void **)&be->xb, &be->cap_xb, (size_t)T * w[i]->n_in, sizeof(uint16_t)))
                return tern_err_set(err, TERN_ENOMEM, "out of memory for bf16 inputs");
            bf16_job bj = {be->k, X, be->xb, w[i]->n_in};
            tern_pool_for(be->pool, T, 2048 / w[i]->n_in + 1, bf16_run, &bj); /* as quant_run's */
            j.Xb = be->xb;
        }
    for (int i = 0; i < n; i++)
        if (mm_uses_tiles(be, w[i]))
            j.unit = 16;
        else if (mm_uses_panels(be, w[i]) && j.unit < 4)
            j.unit = 4; /* their quads */
    size_t need = 0;
    for (int i = 0; i < n; i++) {
        j.offs[i + 1] = j.offs[i] + w[i]->n_out;
        if (w[i]->qbits && !j.Q[i])
            need += (size_t)T * (w[i]->n_in / w[i]->group);
    }
    if (need > be->cap_xsum) {
        float *nx = realloc(be->xsum, need * 2 * sizeof(float));
        if (!nx)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        be->xsum = nx;
        be->cap_xsum = need * 2;
    }
    /* Input sums per quantization group (shared by matrices of one group size). */
    float *xs = be->xsum;
    int last_group = 0;
    for (int i = 0; i < n; i++) {
        if (!w[i]->qbits || j.Q[i])
            continue;
        int g = w[i]->group;
        if (g != last_group) {
            long ng = w[i]->n_in / g;
            for (long t = 0; t < T; t++)
                for (long q = 0; q < ng; q++) {
                    const float *x = X + t * w[i]->n_in + q * g;
                    float s = 0.0f;
                    for (int e = 0; e < g; e++)
                        s += x[e];
                    xs[t * ng + q] = s;
                }
            j.xsum[i] = xs;
            xs += (size_t)T * ng;
            last_group = g;
        } else {
            j.xsum[i] = xs - (size_t)T * (w[i]->n_in / g);
        }
    }
    /* Enough work per part that waking a thread pays off (~64k MACs). */
    long grain = 65536 / ((long)w[0]->n_in * T) + 1;
    if (T < 8) {
        /* decode: the rows in pieces the workers claim as they go (a worker
         * that starts late or runs slow takes fewer; the Xeon's 16-thread
         * decode, docs/benchmarks.md: 4-bit 92 -> 118 t/s), even counts for
         * the two-row kernels; the bits do not depend on the split */
        long row_bytes = mm_row_bytes(w[0]);
        long rows = (be->mm_piece / (row_bytes * T)) & ~1L;
        rows = rows > grain ? rows : grain;
        tern_pool_for_chunks(be->pool, (j.offs[n] + j.unit - 1) / j.unit, (rows + j.unit - 1) / j.unit, mm_run, &j);
    } else {
        tern_pool_for(be->pool, (j.offs[n] + j.unit - 1) / j.unit, (grain + j.unit - 1) / j.unit, mm_run, &j);
    }
    return 0;
}

/* ---- grouped products (a mixture's experts) ---- */

typedef struct mg_job {
    cpu_backend *be;
    int n;
    const model_weight *const *w;
    const float *const *X;
    float *const *Y;
    const int *T;
    long *offs;           /* [n + 1] first global row of each matrix */
    const int8_t **Q;     /* [n] quantized inputs (integer path), else NULL */
    const float **qs;     /* [n] */
    const float **xsum;   /* [n] group sums (f32-activation quantized path), else NULL */
    const uint16_t **Xb;  /* [n] bf16 inputs (bf16 weights, unless exact), else NULL */
    const int8_t **Qa;    /* [n] Q as the panel products' inputs where the matrix has panels, else NULL */
    int *qi;              /* the matrices whose inputs mgq_run converts (not sharing their predecessor's) */
    long unit;            /* rows a pool item: 4 where a matrix has panels (their quads), else 1 */
} mg_job;

static void mg_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    mg_job *j = ctx;
    b *= j->unit;
    e *= j->unit;
    /* the first matrix holding row b (offs ascending, each matrix's rows
     * padded to whole units), then on while rows remain */
    int lo_i = 0, hi_i = j->n;
    while (lo_i + 1 < hi_i) {
        int mid = (lo_i + hi_i) / 2;
        if (j->offs[mid] <= b)
            lo_i = mid;
        else
            hi_i = mid;
    }
    for (int i = lo_i; i < j->n && j->offs[i] < e; i++) {
        long end = j->offs[i] + j->w[i]->n_out;
        long lo = b > j->offs[i] ? b : j->offs[i], hi = e < end ? e : end;
        if (lo < hi && j->Qa[i]) {
            mm_panels(j->be->k, j->w[i], j->Qa[i], j->qs[i], j->Y[i], j->T[i], lo - j->offs[i], hi - j->offs[i]);
        } else if (lo < hi) {
            mm_tiled(j->be->k, j->w[i], j->X[i], j->xsum[i], j->Q[i], j->qs[i], j->Xb[i], 0, j->Y[i], j->T[i],
                     lo - j->offs[i], hi - j->offs[i], j->be->exact);
        }
    }
}

/* Quantizes the inputs of matrices qi[b, e) (those not sharing their
 * predecessor's). */
static void mgq_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    mg_job *j = ctx;
    for (long n = b; n < e; n++) {
        int i = j->qi[n];
        const model_weight *w = j->w[i];
        if (j->Xb[i] && !(i > 0 && j->Xb[i] == j->Xb[i - 1]))
            j->be->k->bf16_act(j->X[i], j->T[i] * w->n_in, (uint16_t *)j->Xb[i]);
        if (!j->Q[i] || (i > 0 && j->Q[i] == j->Q[i - 1]))
            continue;
        j->be->k->quant_act(j->X[i], j->T[i], w->n_in, mm_agroup(w), mm_abits(w), (int8_t *)j->Q[i],
                            (float *)j->qs[i]);
        if (j->Qa[i])
            j->be->k->iq_panel_acts(j->Q[i], j->T[i], w->n_in, mm_agroup(w), mm_abits(w), (int8_t *)j->Qa[i]);
    }
}

/* Whether matrix i of a grouped product takes matrix i - 1's quantized
 * inputs (or, exact, its group sums): the same rows, bits and activation
 * block, and panels on both or neither (their inputs are converted with
 * the quantized ones, by the same item). */
static int mg_same(const cpu_backend *be, const model_weight *const *w, const float *const *X, const int *T, int i)
{
    return i > 0 && X[i] == X[i - 1] && T[i] == T[i - 1] && mm_abits(w[i]) == mm_abits(w[i - 1]) &&
           w[i]->mx == w[i - 1]->mx && mm_uses_panels(be, w[i]) == mm_uses_panels(be, w[i - 1]) &&
           (be->exact ? w[i]->group == w[i - 1]->group : mm_same_quant(w[i], w[i - 1]));
}

static int cpu_matmul_grouped(model_backend *base, int n, const model_weight *const *w, const float *const *X,
                              float *const *Y, const int *T, tern_err *err)
{
    cpu_backend *be = (cpu_backend *)base;
    if (n < 1)
        return 0;
    /* the per-matrix tables, carved from one buffer kept by the backend (no allocation a step):
     * offs, then the five pointer tables (NULL unless set below), then qi */
    size_t tabs = (size_t)(n + 1) * sizeof(long) + 5 * (size_t)n * sizeof(void *) + (size_t)n * sizeof(int);
    if (grow(&be->mg, &be->cap_mg, tabs, 1))
        return tern_err_set(err, TERN_ENOMEM, "out of memory for a grouped product");
    long *offs = be->mg;
    void **ptrs = (void **)(offs + n + 1);
    memset(ptrs, 0, 5 * (size_t)n * sizeof(void *));
    const int8_t **Q = (const int8_t **)ptrs, **Qa = (const int8_t **)(ptrs + n);
    const float **qs = (const float **)(ptrs + 2 * n), **xsum = (const float **)(ptrs + 3 * n);
    const uint16_t **Xb = (const uint16_t **)(ptrs + 4 * n);
    int *qi = (int *)(ptrs + 5 * n);
    /* the inputs' quantized copies (integer path) or group sums: one per
     * distinct (X, T, group, bits), a matrix reusing its predecessor's */
    size_t need_q = 0, need_s = 0, need_x = 0, need_b = 0, need_a = 0;
    long max_t = 1, unit = 1;
    for (int i = 0; i < n; i++)
        if (mm_uses_panels(be, w[i]))
            unit = 4; /* their quads */
    offs[0] = 0;
    for (int i = 0; i < n; i++) {
        offs[i + 1] = offs[i] + (w[i]->n_out + unit - 1) / unit * unit;
        max_t = T[i] > max_t ? T[i] : max_t;
        if (mm_uses_bf16b(be, w[i]) &&
            !(i > 0 && X[i] == X[i - 1] && T[i] == T[i - 1] && mm_uses_bf16b(be, w[i - 1])))
            need_b += (size_t)T[i] * w[i]->n_in;
        /* the exact path's sums are per weight group; the integer path's
         * inputs per activation block (8-bit weights of any group share) */
        int same = mg_same(be, w, X, T, i);
        if (!mm_abits(w[i]) || same)
            continue;
        if (!be->exact) {
            need_q += (size_t)T[i] * w[i]->n_in;
            need_s += (size_t)T[i] * 2 * tern_iq_nbp(w[i]->n_in, mm_agroup(w[i]), mm_abits(w[i]));
            if (mm_uses_panels(be, w[i]))
                need_a += (size_t)T[i] * tern_iq_panel_span(w[i]->n_in, mm_agroup(w[i]), mm_abits(w[i]));
        } else if (w[i]->qbits) { /* MXFP4's exact product needs no sums */
            need_x += (size_t)T[i] * (w[i]->n_in / w[i]->group);
        }
    }
    if (grow((void **)&be->qx, &be->cap_qx, need_q, 1) || grow((void **)&be->qs, &be->cap_qs, need_s, sizeof(float)) ||
        grow((void **)&be->xsum, &be->cap_xsum, need_x, sizeof(float)) ||
        grow((void **)&be->xb, &be->cap_xb, need_b, sizeof(uint16_t)) || grow((void **)&be->qxa, &be->cap_qxa, need_a, 1))
        return tern_err_set(err, TERN_ENOMEM, "out of memory for a grouped product");
    size_t oq = 0, os = 0, ox = 0, ob = 0, oa = 0;
    for (int i = 0; i < n; i++) {
        if (mm_uses_bf16b(be, w[i])) {
            if (i > 0 && X[i] == X[i - 1] && T[i] == T[i - 1] && mm_uses_bf16b(be, w[i - 1])) {
                Xb[i] = Xb[i - 1];
            } else {
                Xb[i] = be->xb + ob;
                ob += (size_t)T[i] * w[i]->n_in;
            }
        }
        if (!mm_abits(w[i]) || (be->exact && !w[i]->qbits))
            continue;
        int same = mg_same(be, w, X, T, i);
        long ng = w[i]->qbits ? w[i]->n_in / w[i]->group : 0;
        if (!be->exact) {
            if (same) {
                Q[i] = Q[i - 1];
                qs[i] = qs[i - 1];
                Qa[i] = Qa[i - 1];
                continue;
            }
            Q[i] = be->qx + oq;
            qs[i] = be->qs + os;
            oq += (size_t)T[i] * w[i]->n_in;
            os += (size_t)T[i] * 2 * tern_iq_nbp(w[i]->n_in, mm_agroup(w[i]), mm_abits(w[i]));
            if (mm_uses_panels(be, w[i])) {
                Qa[i] = be->qxa + oa;
                oa += (size_t)T[i] * tern_iq_panel_span(w[i]->n_in, mm_agroup(w[i]), mm_abits(w[i]));
            }
        } else {
            if (same) {
                xsum[i] = xsum[i - 1];
                continue;
            }
            float *xs = be->xsum + ox;
            for (long t = 0; t < T[i]; t++)
                for (long q = 0; q < ng; q++) {
                    const float *x = X[i] + t * w[i]->n_in + q * w[i]->group;
                    float s = 0.0f;
                    for (int e = 0; e < w[i]->group; e++)
                        s += x[e];
                    xs[t * ng + q] = s;
                }
            xsum[i] = xs;
            ox += (size_t)T[i] * ng;
        }
    }
    /* the inputs to convert: one pool round for all, unless they are few
     * (a decode step's experts: one token's row, or a handful of rows) */
    long n_qi = 0, q_elems = 0;
    for (int i = 0; i < n; i++)
        if ((Xb[i] && !(i > 0 && Xb[i] == Xb[i - 1])) || (Q[i] && !(i > 0 && Q[i] == Q[i - 1]))) {
            qi[n_qi++] = i;
            q_elems += (long)T[i] * w[i]->n_in;
        }
    mg_job j = {be, n, w, X, Y, T, offs, Q, qs, xsum, Xb, Qa, qi, unit};
    if (n_qi)
        tern_pool_for(be->pool, n_qi, q_elems <= 16384 ? n_qi : 1, mgq_run, &j);
    long grain = 65536 / ((long)w[0]->n_in * max_t) + 1;
    if (max_t < 8) {
        /* few tokens (decode): the rows in pieces the workers claim, as
         * cpu_matmul's (every matrix of one call has w[0]'s shape: a
         * layer's gate/up, or its down) */
        long row_bytes = mm_row_bytes(w[0]);
        long rows = (be->mm_piece / (row_bytes * max_t)) & ~1L;
        rows = rows > grain ? rows : grain;
        tern_pool_for_chunks(be->pool, offs[n] / unit, (rows + unit - 1) / unit, mg_run, &j);
    } else {
        tern_pool_for(be->pool, offs[n] / unit, (grain + unit - 1) / unit, mg_run, &j);
    }
    return 0;
}

/* ---- attention ----
 * A (token, KV head) pair's query heads (the GQA group) are done together:
 * each stored K/V row is read once for the group (kv_reader scores / wsum).
 * The positions a token sees are cut into chunks at fixed multiples of
 * att_chunk_len (a function of the token's position only); a chunk gives
 * each head a partial softmax (its max, its sum of exp, its unnormalized
 * output), and the partials are folded in chunk order (att_fold). So a
 * row's sums depend on nothing but its own positions: not on the batch,
 * the threads, or which worker did which chunk. Few pairs (decode) run
 * their chunks as separate items, the last to finish a pair folding it;
 * many pairs (prefill, batches) run one pair per item. */

#define ATT_CHUNK 64       /* positions a chunk, at least */
#define ATT_MAX_CHUNKS 64  /* chunks a token, at most (longer contexts get longer chunks) */
#define ATT_ROWS 64        /* rows gathered for one scores / wsum call */

static int att_chunk_len(int p)
{
    int c = ATT_CHUNK;
    while ((long)c * ATT_MAX_CHUNKS < (long)p + 1)
        c *= 2;
    return c;
}

typedef struct att_job {
    cpu_backend *be;
    const model_attn *a;
    const kv_reader *rd;
    int g, rot, split;
    long T, ws;       /* tokens; floats of scratch a worker */
    size_t hb[2];     /* a stored head's bytes: the layer's type, its sinks' */
    long *first;      /* split: [pairs + 1] the first item of each pair */
    float *part;      /* split: a partial (att_fold) per item */
    atomic_int *left; /* split: the chunks of each pair not yet done */
} att_job;

/* One (token, KV head) pair: its positions [start, p], chunk length c, its
 * chunks, and the group's queries (rotated into qr for a rotated layer). */
typedef struct att_pair {
    int i, kvh, start, p, c, n_chunks;
    const float *q;
} att_pair;

static void att_pair_get(const att_job *j, int i, int kvh, float *qr, att_pair *pp)
{
    const model_attn *a = j->a;
    int hd = a->head_dim, p = a->b->pos[i];
    pp->i = i;
    pp->kvh = kvh;
    pp->p = p;
    pp->start = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0;
    pp->c = att_chunk_len(p);
    pp->n_chunks = p / pp->c - pp->start / pp->c + 1;
    pp->q = a->q + (size_t)i * a->n_head * hd + (size_t)kvh * j->g * hd;
    if (j->rot) {
        memcpy(qr, pp->q, (size_t)j->g * hd * sizeof(float));
        for (int h = 0; h < j->g; h++)
            kv_rotate(qr + (size_t)h * hd, hd);
        pp->q = qr;
    }
}

/* Runs rows [lo, hi] of K (is_v 0: scores into sc) or V (1: weights sc, sums
 * into o) through the reader, in calls over runs of one stored type; a
 * block's rows are found once per block. */
static void att_rows(const att_job *j, const att_pair *pp, int lo, int hi, int is_v, float *sc, float *o)
{
    const model_attn *a = j->a;
    const kv_pool *kv = a->kv;
    const kv_seq *seq = a->b->seqs[pp->i];
    const uint8_t *rows[ATT_ROWS];
    int bs = kv->block_size;
    for (int t0 = lo; t0 <= hi;) {
        kv_type tt = KV_F32;
        int n = 0;
        for (int t = t0; t <= hi && n < ATT_ROWS;) { /* block by block */
            int in = bs - t % bs, left = hi - t + 1;
            in = in < left ? in : left;
            in = in < ATT_ROWS - n ? in : ATT_ROWS - n;
            kv_type ty;
            const uint8_t *r;
            size_t stride;
            if (kv->k) {
                ty = KV_F32;
                r = (const uint8_t *)((is_v ? kv_v_at(kv, seq, a->layer, t) : kv_k_at(kv, seq, a->layer, t)) +
                                      (size_t)pp->kvh * a->head_dim);
                stride = (size_t)kv->kv_dim * sizeof(float);
            } else {
                r = kv_row_at(kv, seq, a->layer, t, is_v, &ty);
                int sink = ty != kv->layers[a->layer].type;
                r += (size_t)pp->kvh * j->hb[sink];
                stride = sink ? kv->layers[a->layer].sink_row : kv->layers[a->layer].row;
            }
            if (n && ty != tt)
                break;
            tt = ty;
            for (int u = 0; u < in; u++)
                rows[n++] = r + u * stride;
            t += in;
        }
        if (is_v)
            j->rd->wsum(tt, a->head_dim, j->g, n, sc + (t0 - lo), pp->c, rows, o);
        else
            j->rd->scores(tt, a->head_dim, j->g, n, pp->q, rows, sc + (t0 - lo), pp->c);
        t0 += n;
    }
}

/* Chunk k of a pair: part = [max g][sum g][output g x head_dim] of its
 * positions, exp taken against the chunk's own max. sc: g x c scratch. */
static void att_chunk(const att_job *j, const att_pair *pp, int k, float *sc, float *part)
{
    const model_attn *a = j->a;
    int g = j->g, hd = a->head_dim, c = pp->c;
    int lo = (pp->start / c + k) * c, hi = lo + c - 1;
    lo = lo > pp->start ? lo : pp->start;
    hi = hi < pp->p ? hi : pp->p;
    int n = hi - lo + 1;
    att_rows(j, pp, lo, hi, 0, sc, NULL);
    for (int h = 0; h < g; h++)
        part[g + h] = j->rd->softmax(sc + (size_t)h * c, n, a->scale, a->softcap, &part[h]);
    memset(part + 2 * g, 0, (size_t)g * hd * sizeof(float));
    att_rows(j, pp, lo, hi, 1, sc, part + 2 * g);
}

/* acc = part (first) or acc folded with the next chunk's part: both
 * rescaled to their common max. One function for every caller, so the
 * same bits wherever it runs. */
static __attribute__((noinline)) void att_fold(int g, int hd, int first, float *acc, const float *part)
{
    if (first) {
        memcpy(acc, part, (size_t)g * (hd + 2) * sizeof(float));
        return;
    }
    for (int h = 0; h < g; h++) {
        float m = acc[h] > part[h] ? acc[h] : part[h], x = expf(acc[h] - m), y = expf(part[h] - m);
        acc[h] = m;
        acc[g + h] = acc[g + h] * x + part[g + h] * y;
        float *O = acc + 2 * g + (size_t)h * hd;
        const float *o = part + 2 * g + (size_t)h * hd;
        for (int e = 0; e < hd; e++)
            O[e] = O[e] * x + o[e] * y;
    }
}

/* The folded partials to the output; a head's sink logit (gpt_oss) joins
 * the denominator here, once, after every chunk: both rescaled to their
 * common max, as one more partial with a sum and no values. */
static void att_finish(const att_job *j, const att_pair *pp, const float *acc)
{
    const model_attn *a = j->a;
    int g = j->g, hd = a->head_dim;
    for (int h = 0; h < g; h++) {
        float *out = a->out + ((size_t)pp->i * a->n_head + (size_t)pp->kvh * g + h) * hd, inv = 1.0f / acc[g + h];
        if (a->sinks) {
            float z = a->sinks[pp->kvh * g + h], m = acc[h] > z ? acc[h] : z, x = expf(acc[h] - m);
            inv = x / (acc[g + h] * x + expf(z - m));
        }
        const float *O = acc + 2 * g + (size_t)h * hd;
        for (int e = 0; e < hd; e++)
            out[e] = O[e] * inv;
        if (j->rot)
            kv_unrotate(out, hd);
    }
}

/* A worker's scratch: queries, scores, a chunk's partial, the fold. */
static void att_scratch(const att_job *j, int worker, float **qr, float **sc, float **part, float **acc)
{
    int g = j->g, hd = j->a->head_dim;
    *qr = j->be->scores + (size_t)worker * j->ws;
    *part = *qr + (size_t)g * hd;
    *acc = *part + (size_t)g * (hd + 2);
    *sc = *acc + (size_t)g * (hd + 2);
}

/* Items are pairs, the tokens from the last (the longest in a prefill:
 * claimed in order, the big ones go first). */
static void att_run_pairs(void *ctx, long begin, long end, int worker)
{
    att_job *j = ctx;
    int nkv = j->a->n_kv_head, g = j->g, hd = j->a->head_dim;
    float *qr, *sc, *part, *acc;
    att_scratch(j, worker, &qr, &sc, &part, &acc);
    for (long it = begin; it < end; it++) {
        att_pair pp;
        att_pair_get(j, (int)(j->T - 1 - it / nkv), (int)(it % nkv), qr, &pp);
        for (int k = 0; k < pp.n_chunks; k++) {
            att_chunk(j, &pp, k, sc, part);
            att_fold(g, hd, k == 0, acc, part);
        }
        att_finish(j, &pp, acc);
    }
}

/* Items are chunks (pair-major); the worker that finishes a pair's last
 * chunk folds the pair's partials in chunk order. */
static void att_run_chunks(void *ctx, long begin, long end, int worker)
{
    att_job *j = ctx;
    int nkv = j->a->n_kv_head, g = j->g, hd = j->a->head_dim;
    long n_pairs = j->T * nkv, ps = (long)g * (hd + 2);
    float *qr, *sc, *part, *acc;
    att_scratch(j, worker, &qr, &sc, &part, &acc);
    for (long it = begin; it < end; it++) {
        long lo = 0, hi = n_pairs; /* the pair: first[lo] <= it < first[lo + 1] */
        while (lo + 1 < hi) {
            long mid = (lo + hi) / 2;
            if (j->first[mid] <= it)
                lo = mid;
            else
                hi = mid;
        }
        att_pair pp;
        att_pair_get(j, (int)(lo / nkv), (int)(lo % nkv), qr, &pp);
        att_chunk(j, &pp, (int)(it - j->first[lo]), sc, j->part + it * ps);
        if (atomic_fetch_sub_explicit(&j->left[lo], 1, memory_order_acq_rel) == 1) {
            for (int k = 0; k < pp.n_chunks; k++)
                att_fold(g, hd, k == 0, acc, j->part + (j->first[lo] + k) * ps);
            att_finish(j, &pp, acc);
        }
    }
}

static int cpu_attention(model_backend *base, const model_attn *a, tern_err *err)
{
    cpu_backend *be = (cpu_backend *)base;
    if (!a->kv->k && !a->kv->mem_k)
        return tern_err_set(err, TERN_EINVAL, "attention: the KV pool has no host storage");
    if (a->n_kv_head < 1 || a->n_head % a->n_kv_head)
        return tern_err_set(err, TERN_EINVAL, "attention: %d heads over %d KV heads", a->n_head, a->n_kv_head);
    long T = a->b->n, n_pairs = T * a->n_kv_head, nw = tern_pool_size(be->pool);
    int g = a->n_head / a->n_kv_head, hd = a->head_dim, cmax = ATT_CHUNK;
    for (long i = 0; i < T; i++) {
        int c = att_chunk_len(a->b->pos[i]);
        cmax = c > cmax ? c : cmax;
    }
    att_job j = {be, a, kv_reader_best(), g, !a->kv->k && kv_type_is_rotated(a->kv->layers[a->layer].type), 0, T,
                 (long)g * hd + 2L * g * (hd + 2) + (long)g * cmax, {0, 0}, NULL, NULL, NULL};
    if (!a->kv->k) {
        j.hb[0] = kv_head_bytes(a->kv->layers[a->layer].type, hd);
        j.hb[1] = kv_head_bytes(a->kv->layers[a->layer].sink_type, hd);
    }
    j.ws = (j.ws + 15) & ~15L; /* each worker's scratch on its own cache lines */
    if (grow((void **)&be->scores, &be->cap_scores, (size_t)nw * j.ws, sizeof(float)))
        return tern_err_set(err, TERN_ENOMEM, "out of memory for attention scratch");
    /* few pairs with several chunks (decode): the chunks are the items */
    long items = 0;
    if (n_pairs < 2 * nw) {
        if (grow((void **)&be->att_first, &be->cap_att_first, (size_t)n_pairs + 1, sizeof(long)) ||
            grow((void **)&be->att_left, &be->cap_att_left, (size_t)n_pairs, sizeof(atomic_int)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory for attention scratch");
        for (long pi = 0; pi < n_pairs; pi++) {
            int p = a->b->pos[pi / a->n_kv_head], c = att_chunk_len(p);
            int start = a->window > 0 && p - a->window + 1 > 0 ? p - a->window + 1 : 0, nc = p / c - start / c + 1;
            be->att_first[pi] = items;
            atomic_init(&be->att_left[pi], nc);
            items += nc;
        }
        be->att_first[n_pairs] = items;
        j.split = items > n_pairs;
    }
    if (j.split) {
        if (grow((void **)&be->att_part, &be->cap_att_part, (size_t)items * g * (hd + 2), sizeof(float)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory for attention partials");
        j.first = be->att_first;
        j.left = be->att_left;
        j.part = be->att_part;
        tern_pool_for_chunks(be->pool, items, 1, att_run_chunks, &j);
    } else {
        tern_pool_for_chunks(be->pool, n_pairs, 1, att_run_pairs, &j);
    }
    return 0;
}

static void cpu_par_for(model_backend *base, long n, long grain, void (*fn)(void *ctx, long b, long e, int worker),
                        void *ctx)
{
    tern_pool_for(((cpu_backend *)base)->pool, n, grain, fn, ctx);
}

static int cpu_n_threads(const model_backend *base) { return tern_pool_size(((const cpu_backend *)base)->pool); }

static void cpu_free(model_backend *base)
{
    cpu_backend *be = (cpu_backend *)base;
    if (!be)
        return;
    tern_pool_free(be->pool);
    free(be->scores);
    free(be->att_first);
    free(be->att_left);
    free(be->att_part);
    free(be->xsum);
    free(be->qx);
    free(be->qs);
    free(be->xb);
    free(be->qxp);
    free(be->qxa);
    free(be->qsp);
    free(be->mg);
    free(be);
}

/* What a weight is laid out as at load (model_backend_cpu_tiles). */
enum { LAY_NONE, LAY_TILES, LAY_PANELS, LAY_COPY };

typedef struct tiles_job {
    model_weight **w;
    char **dst;  /* [n] the layout's memory */
    int *kind;   /* [n] LAY_* */
    long *first; /* [n + 1] first unit of each weight in the job's numbering: 16-row blocks or quads */
    int n;
} tiles_job;

static void tiles_run(void *ctx, long b, long e, int worker)
{
    (void)worker;
    tiles_job *j = ctx;
    int i = 0; /* the first weight holding unit b, then on */
    while (j->first[i + 1] <= b)
        i++;
    for (; i < j->n && j->first[i] < e; i++) {
        long lo = b > j->first[i] ? b : j->first[i], hi = e < j->first[i + 1] ? e : j->first[i + 1];
        model_weight *w = j->w[i];
        if (lo >= hi)
            continue;
        lo -= j->first[i];
        hi -= j->first[i];
        if (j->kind[i] == LAY_TILES) {
            tern_bf16_tiles_make(w->data, w->n_out, w->n_in, (uint16_t *)j->dst[i], lo, hi);
        } else if (j->kind[i] == LAY_PANELS) {
            tern_iq_panels_make(w->data, w->sb16, w->n_out, w->n_in, w->group, w->qbits, (uint8_t *)j->dst[i], lo,
                                hi);
        } else { /* rows [16 lo, 16 hi) as they are */
            size_t row = (size_t)w->n_in * tern_dtype_size(w->dtype), r1 = (size_t)(hi * 16 < w->n_out ? hi * 16 : w->n_out);
            memcpy(j->dst[i] + (size_t)lo * 16 * row, (const char *)w->data + (size_t)lo * 16 * row,
                   (r1 - (size_t)lo * 16) * row);
        }
    }
}

/* Bytes of w's layout for the CPU's kernels, 0 when it takes none; *kind
 * says which: bf16 tiles where the kernels have a tile product, MLX affine
 * weights with bf16 pairs as panels where they have a panel product, and
 * other dense weights copied as they are (dense: the row kernels read
 * them from 2 MB pages, not the mapping's 4 KB ones - Zen 4, Llama-1B
 * bf16: decode +3-7%, prefill +11-13%). no_tiles: panels and copies
 * alone (a mixture's experts: the grouped product has no tile path). */
static size_t layout_len(const cpu_backend *be, const model_weight *w, int no_tiles, int *kind)
{
    *kind = LAY_NONE;
    if (!w->data || w->tiles || w->panels || w->own || w->mx || !w->n_out)
        return 0;
    if (!no_tiles && mm_uses_bf16b(be, w) && tern_bf16t_ok(be->k, w->n_in)) {
        *kind = LAY_TILES;
        return tern_bf16_tiles_len(w->n_out, w->n_in) * sizeof(uint16_t);
    }
    if (w->qbits && w->f_scales && w->dtype == TERN_BF16 && tern_iq_panels_ok(be->k, w->group, w->qbits, w->n_in)) {
        *kind = LAY_PANELS;
        return tern_iq_panels_len(w->n_out, w->n_in, w->group, w->qbits);
    }
    if (!w->qbits && (w->dtype == TERN_BF16 || w->dtype == TERN_F16 || w->dtype == TERN_F32)) {
        *kind = LAY_COPY;
        return (size_t)w->n_out * w->n_in * tern_dtype_size(w->dtype);
    }
    return 0;
}

/* Memory on 2 MB pages where the kernel grants them (a fault a 2 MB page,
 * not a 4 KB one) when large, else 64-byte aligned; NULL when none. */
static void *layout_alloc(size_t len)
{
    size_t al = len >= (8u << 20) ? 2u << 20 : 64;
    void *p = aligned_alloc(al, (len + al - 1) / al * al);
    if (p && al > 64)
        madvise(p, (len + al - 1) / al * al, MADV_HUGEPAGE);
    return p;
}

/* Gives the n weights ws their layouts (layout_len) in one pool round,
 * then drops their mapping's pages (a tied embedding's too: the few rows
 * lookups read come back a page at a time). block: one allocation for all
 * of them, into *block (owned by the caller; the weights point into it),
 * else one each, owned by the weight (tiles, panels, or own for a copy,
 * which becomes its data). Returns the bytes laid out. */
static size_t tiles_make(cpu_backend *be, model_weight *const *ws, int n, int no_tiles, void **block)
{
    size_t bytes = 0, off = 0;
    long *first = malloc((size_t)(n + 1) * sizeof *first);
    model_weight **jw = malloc((size_t)n * sizeof *jw);
    char **dst = malloc((size_t)n * sizeof *dst);
    int *kind = malloc((size_t)n * sizeof *kind);
    char *base = NULL;
    if (!first || !jw || !dst || !kind)
        goto out;
    if (block) {
        for (int i = 0; i < n; i++)
            bytes += (layout_len(be, ws[i], no_tiles, &kind[0]) + 63) / 64 * 64;
        if (!bytes || !(base = layout_alloc(bytes))) {
            if (bytes)
                TERN_WARN("no memory for the layout of a layer's experts (%.1f MB): they keep the mapping",
                          (double)bytes / 1e6);
            bytes = 0;
            goto out;
        }
        *block = base;
        bytes = 0;
    }
    tiles_job j = {jw, dst, kind, first, 0};
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        model_weight *w = ws[i];
        int k;
        size_t len = layout_len(be, w, no_tiles, &k);
        if (!len)
            continue;
        /* panels are made from the bf16 pairs, made for the while */
        int pairs_ok = k != LAY_PANELS || !model_weight_pairs(w, 0, 1, NULL);
        char *p = !pairs_ok ? NULL : base ? base + off : layout_alloc(len);
        if (!p) {
            TERN_WARN("no memory for the layout of a %d x %d weight: it keeps the mapping", w->n_out, w->n_in);
            continue;
        }
        off += (len + 63) / 64 * 64;
        bytes += len;
        j.w[j.n] = w;
        j.dst[j.n] = p;
        j.kind[j.n] = k;
        j.first[j.n + 1] = j.first[j.n] + (k == LAY_PANELS ? (w->n_out + 3) / 4 : (w->n_out + 15) / 16);
        j.n++;
    }
    for (int i = 0; i < j.n; i++)
        model_weight_populate(j.w[i]);
    if (j.n)
        tern_pool_for(be->pool, j.first[j.n], 1, tiles_run, &j);
    for (int i = 0; i < j.n; i++) { /* a tied embedding's too: a lookup faults its row's page back in */
        model_weight *w = j.w[i];
        model_weight_release(w);
        if (j.kind[i] == LAY_TILES) {
            w->tiles = (uint16_t *)j.dst[i];
        } else if (j.kind[i] == LAY_PANELS) { /* the panels hold the pairs: load's peak keeps only a few */
            w->panels = (uint8_t *)j.dst[i];
            free(w->sb16);
            w->sb16 = NULL;
        } else {
            w->data = j.dst[i];
            if (!block) /* else the caller's block */
                w->own = j.dst[i];
        }
    }
out:
    free(first);
    free(jw);
    free(dst);
    free(kind);
    return bytes;
}

/* The memory the kernel could give now (/proc/meminfo's MemAvailable),
 * 0 when unknown. */
static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (size_t)kb * 1024;
}

void model_backend_cpu_tiles(model_backend *base, tern_model *m)
{
    cpu_backend *be = (cpu_backend *)base;
    if (be->exact || (!be->k->matmul_bf16t && !be->k->imatmul_q4w && !be->k->imatmul_q8w))
        return;
    double t0 = tern_time_s();
    model_weight *head = &m->lm_head;
    const void *head_data = head->data;
    size_t bytes = tiles_make(be, &head, 1, 0, NULL);
    if (m->embed.data == head_data) /* tied and copied: the lookups read the copy too (the head owns it) */
        m->embed.data = head->data;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        model_layer *L = &m->layers[l];
        model_weight *ws[TILES_MAX] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->router};
        bytes += tiles_make(be, ws, TILES_MAX, 0, NULL);
    }
    /* A mixture's experts get their layouts too (panels, or dense ones
     * copied), in one block a layer, when they stay in memory anyway: not
     * streamed from disk, and only when they fit in the memory available -
     * the layouts are the process's own memory, which a model larger than
     * memory could not page out. */
    model_experts_stats st;
    if (m->cfg.n_expert && !model_experts_stats_get(m, &st) && st.where != MODEL_EXPERTS_DISK) {
        int E3 = 3 * m->cfg.n_expert;
        size_t need = 0;
        for (int l = 0; l < m->cfg.n_layer; l++)
            for (int e = 0; m->layers[l].experts && e < E3; e++) {
                int kind;
                need += layout_len(be, &m->layers[l].experts[e], 1, &kind);
            }
        size_t avail = mem_available();
        if (need && need > avail / 4 * 3) {
            TERN_INFO("the experts stay in the mapping: their layouts (%.2f GiB) would not fit in the memory "
                      "available (%.2f GiB)", (double)need / (1 << 30), (double)avail / (1 << 30));
        } else if (need) {
            model_weight **ws = malloc((size_t)E3 * sizeof *ws);
            for (int l = 0; ws && l < m->cfg.n_layer; l++) {
                model_layer *L = &m->layers[l];
                if (!L->experts)
                    continue;
                for (int e = 0; e < E3; e++)
                    ws[e] = &L->experts[e];
                bytes += tiles_make(be, ws, E3, 1, &L->exp_layout);
            }
            free(ws);
        }
    }
#ifdef __GLIBC__
    malloc_trim(0); /* the freed pairs back to the system: the heap keeps them otherwise */
#endif
    if (bytes)
        TERN_INFO("weights laid out for the CPU's kernels: %.2f GiB in %.2f s", (double)bytes / (1 << 30),
                  tern_time_s() - t0);
}

model_backend *model_backend_cpu_new(int n_threads, tern_err *err)
{
    cpu_backend *be = calloc(1, sizeof *be);
    if (!be) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    be->base.name = "cpu";
    be->base.head_dim_align = 1; /* any head_dim: attention loops over it */
    be->base.kv_types = (1u << KV_TYPE_COUNT) - 1; /* every type, read in place (kv_codec.c) */
    be->base.kv_default = KV_F16; /* docs/kv-cache.md: the KL of bf16 at the same bytes, 1/70 (measured) */
    be->base.matmul = cpu_matmul;
    be->base.matmul_grouped = cpu_matmul_grouped;
    be->base.attention = cpu_attention;
    be->base.n_threads = cpu_n_threads;
    be->base.par_for = cpu_par_for;
    be->base.free = cpu_free;
    be->k = tern_kernels_best();
    be->exact = tern_kernels_exact_get();
    be->mm_piece = 128 << 10; /* measured on the Xeon: 128 KB pieces beat 32 KB (4-bit 118 vs 111 t/s) */
    be->pool = tern_pool_new(n_threads);
    if (!be->pool) {
        free(be);
        tern_err_set(err, TERN_ENOMEM, "cannot start threads");
        return NULL;
    }
    return &be->base;
}
