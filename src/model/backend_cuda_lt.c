/* cuBLASLt products of the CUDA backend (backend_cuda_lt.h). */
#ifdef TERN_CUDA

#include "model/backend_cuda_lt.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#define LT_WS_BYTES ((size_t)32 << 20)
#define LT_CACHE 4096 /* (shape, T) entries, a power of two; cleared when full */
#define LT_REF_T0 8    /* a shape's split-K: the lesser of the heuristic's choices at these many tokens, */
#define LT_REF_T1 128  /* for every T */
#define LT_SHAPES 64   /* shapes with their split-K; cleared when full */

typedef struct lt_shape {
    int n_out, n_in, f16; /* n_out 0: empty */
    int splitk;
    cublasLtMatmulAlgo_t algo; /* the reference algorithm, a fallback at any T */
} lt_shape;

typedef struct lt_entry {
    int n_out, n_in, T, f16; /* n_out 0: empty (handles may still be half made) */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} lt_entry;

struct cu_lt {
    cublasLtHandle_t h;
    cudaStream_t stream;
    void *ws;
    lt_entry *e;
    int n;
    int splitk; /* tcu_opts.lt_splitk */
    lt_shape sh[LT_SHAPES];
    int n_sh;
};

static int lt_fail(tern_err *err, cublasStatus_t s, const char *what)
{
    return tern_err_set(err, TERN_EIO, "cuda: cuBLASLt %s: %s", what, cublasLtGetStatusString(s));
}

/* Frees what of e exists (also a half-made entry) and empties it. */
static void entry_free(lt_entry *e)
{
    if (e->op)
        cublasLtMatmulDescDestroy(e->op);
    if (e->a)
        cublasLtMatrixLayoutDestroy(e->a);
    if (e->b)
        cublasLtMatrixLayoutDestroy(e->b);
    if (e->c)
        cublasLtMatrixLayoutDestroy(e->c);
    memset(e, 0, sizeof *e);
}

int cu_lt_new(cu_lt **out, void *stream, int splitk, tern_err *err)
{
    cu_lt *lt = calloc(1, sizeof *lt);
    if (!lt || !(lt->e = calloc(LT_CACHE, sizeof *lt->e))) {
        free(lt);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    lt->stream = (cudaStream_t)stream;
    lt->splitk = splitk;
    cublasStatus_t s = cublasLtCreate(&lt->h);
    if (s != CUBLAS_STATUS_SUCCESS) {
        free(lt->e);
        free(lt);
        return lt_fail(err, s, "start");
    }
    cudaError_t ce = cudaMalloc(&lt->ws, LT_WS_BYTES);
    if (ce != cudaSuccess) {
        cublasLtDestroy(lt->h);
        free(lt->e);
        free(lt);
        return tern_err_set(err, TERN_ENOMEM, "cuda: cuBLASLt workspace: %s", cudaGetErrorString(ce));
    }
    *out = lt;
    return 0;
}

void cu_lt_free(cu_lt *lt)
{
    if (!lt)
        return;
    for (int i = 0; i < LT_CACHE; i++)
        entry_free(&lt->e[i]);
    cudaFree(lt->ws);
    cublasLtDestroy(lt->h);
    free(lt->e);
    free(lt);
}

/* The descriptors of (n_out, n_in, T); none made on failure. */
static cublasStatus_t entry_desc(lt_entry *e, int n_out, int n_in, int T, int f16)
{
    const cudaDataType_t dt = f16 ? CUDA_R_16F : CUDA_R_16BF;
    const cublasOperation_t tr = CUBLAS_OP_T, nt = CUBLAS_OP_N;
    cublasStatus_t s;
    memset(e, 0, sizeof *e);
    if ((s = cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) ||
        (s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &tr, sizeof tr)) ||
        (s = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt)) ||
        (s = cublasLtMatrixLayoutCreate(&e->a, dt, (uint64_t)n_in, (uint64_t)n_out, n_in)) ||
        (s = cublasLtMatrixLayoutCreate(&e->b, dt, (uint64_t)n_in, (uint64_t)T, n_in)) ||
        (s = cublasLtMatrixLayoutCreate(&e->c, CUDA_R_32F, (uint64_t)n_out, (uint64_t)T, n_out)))
        entry_free(e);
    return s;
}

/* Up to 8 heuristic algorithms of e's problem. */
static int entry_heuristic(cu_lt *lt, const lt_entry *e, cublasLtMatmulHeuristicResult_t r[8])
{
    cublasLtMatmulPreference_t pref;
    if (cublasLtMatmulPreferenceCreate(&pref))
        return 0;
    size_t ws = LT_WS_BYTES;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    int got = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt->h, e->op, e->a, e->b, e->c, e->c, pref, 8, r, &got))
        got = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    return got;
}

/* al with split-K k, if it runs e's problem. The parts are added in the
 * output in order (the in-place scheme: its workspace is counters only,
 * so any T fits; deterministic). */
static int algo_with(cu_lt *lt, const lt_entry *e, cublasLtMatmulAlgo_t *al, int k)
{
    const uint32_t red = k > 1 ? CUBLASLT_REDUCTION_SCHEME_INPLACE : CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulHeuristicResult_t chk;
    return !cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k) &&
           !cublasLtMatmulAlgoConfigSetAttribute(al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red) &&
           cublasLtMatmulAlgoCheck(lt->h, e->op, e->a, e->b, e->c, e->c, al, &chk) == CUBLAS_STATUS_SUCCESS &&
           chk.workspaceSize <= LT_WS_BYTES;
}

/* The split-K of the heuristic's first algorithm for (n_out, n_in, T)
 * (1: none or unknown), that algorithm in *al. */
static int ref_splitk(cu_lt *lt, int n_out, int n_in, int T, int f16, cublasLtMatmulAlgo_t *al)
{
    lt_entry e;
    if (entry_desc(&e, n_out, n_in, T, f16))
        return 1;
    cublasLtMatmulHeuristicResult_t r[8];
    int k = 1;
    size_t n;
    if (entry_heuristic(lt, &e, r) > 0) {
        *al = r[0].algo;
        if (cublasLtMatmulAlgoConfigGetAttribute(al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k, &n) || k < 1)
            k = 1;
    }
    entry_free(&e);
    return k;
}

/* The split-K of (n_out, n_in): 1 without lt->splitk, else the lesser of
 * the heuristic's first algorithms' at LT_REF_T0 and LT_REF_T1 tokens -
 * the same for every T, so a row's sums keep one order whatever T (narrow
 * products with long rows split: 8B down; o splits at 8 tokens only,
 * slower for it past that). */
static lt_shape *shape_get(cu_lt *lt, int n_out, int n_in, int f16)
{
    for (int i = 0; i < lt->n_sh; i++)
        if (lt->sh[i].n_out == n_out && lt->sh[i].n_in == n_in && lt->sh[i].f16 == f16)
            return &lt->sh[i];
    if (lt->n_sh == LT_SHAPES)
        lt->n_sh = 0;
    lt_shape *sh = &lt->sh[lt->n_sh++];
    memset(sh, 0, sizeof *sh);
    sh->n_out = n_out;
    sh->n_in = n_in;
    sh->f16 = f16;
    sh->splitk = 1;
    if (lt->splitk) {
        cublasLtMatmulAlgo_t a1;
        const int k0 = ref_splitk(lt, n_out, n_in, LT_REF_T0, f16, &sh->algo),
                  k1 = ref_splitk(lt, n_out, n_in, LT_REF_T1, f16, &a1);
        sh->splitk = k0 < k1 ? k0 : k1;
    }
    return sh;
}

/* The descriptors of (n_out, n_in, T) and the first heuristic algorithm
 * that runs with the shape's split-K (1: off; one pass over K per output
 * element) - else the shape's reference algorithm. */
static int entry_make(cu_lt *lt, lt_entry *e, int n_out, int n_in, int T, int f16, tern_err *err)
{
    const lt_shape *sh = shape_get(lt, n_out, n_in, f16);
    cublasStatus_t s = entry_desc(e, n_out, n_in, T, f16);
    if (s)
        return lt_fail(err, s, "layout");
    cublasLtMatmulHeuristicResult_t r[8];
    const int got = entry_heuristic(lt, e, r);
    const int n = got + (sh->splitk > 1); /* the reference algorithm last (a split shape has one) */
    for (int i = 0; i < n; i++) {
        cublasLtMatmulAlgo_t al = i < got ? r[i].algo : sh->algo;
        if (!algo_with(lt, e, &al, sh->splitk))
            continue;
        e->algo = al;
        e->n_out = n_out;
        e->T = T;
        e->n_in = n_in;
        e->f16 = f16;
        return 0;
    }
    entry_free(e);
    return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: cuBLASLt has no algorithm with split-K %d for %d x %d x %d",
                        sh->splitk, n_out, n_in, T);
}

static int entry_get(cu_lt *lt, int n_out, int n_in, int T, int f16, lt_entry **out, tern_err *err)
{
    unsigned h = ((unsigned)n_out * 2654435761u) ^ ((unsigned)n_in * 40503u) ^ ((unsigned)T * 97u) ^ (unsigned)f16;
    for (int probe = 0; probe < LT_CACHE; probe++) {
        lt_entry *e = &lt->e[(h + (unsigned)probe) & (LT_CACHE - 1)];
        if (e->n_out == n_out && e->n_in == n_in && e->T == T && e->f16 == f16) {
            *out = e;
            return 0;
        }
        if (!e->n_out) {
            if (lt->n >= LT_CACHE / 2) { /* full enough: start over */
                for (int i = 0; i < LT_CACHE; i++)
                    entry_free(&lt->e[i]);
                lt->n = 0;
                e = &lt->e[h & (LT_CACHE - 1)];
            }
            int rc = entry_make(lt, e, n_out, n_in, T, f16, err);
            if (rc)
                return rc;
            lt->n++;
            *out = e;
            return 0;
        }
    }
    return tern_err_set(err, TERN_EIO, "cuda: cuBLASLt cache full"); /* not reached: cleared at half */
}

int cu_lt_splitk(cu_lt *lt, int n_out, int n_in, int f16) { return shape_get(lt, n_out, n_in, f16)->splitk; }

int cu_lt_matmul(cu_lt *lt, const void *w, int f16, const uint16_t *x, float *y, int n_out, int n_in, int T,
                 int accumulate, tern_err *err)
{
    lt_entry *e = NULL;
    int rc = entry_get(lt, n_out, n_in, T, f16, &e, err);
    if (rc)
        return rc;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasStatus_t s = cublasLtMatmul(lt->h, e->op, &one, w, e->a, x, e->b, &beta, y, e->c, y, e->c, &e->algo, lt->ws,
                                      LT_WS_BYTES, lt->stream);
    return s ? lt_fail(err, s, "matmul") : 0;
}

#endif
