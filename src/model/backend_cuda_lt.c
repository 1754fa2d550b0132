/* cuBLASLt products of the CUDA backend (backend_cuda_lt.h). */
#ifdef TERN_CUDA

#include "model/backend_cuda_lt.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#define LT_WS_BYTES ((size_t)32 << 20)
#define LT_CACHE 4096 /* (shape, T) entries, a power of two; cleared when full */

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

int cu_lt_new(cu_lt **out, void *stream, tern_err *err)
{
    cu_lt *lt = calloc(1, sizeof *lt);
    if (!lt || !(lt->e = calloc(LT_CACHE, sizeof *lt->e))) {
        free(lt);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    lt->stream = (cudaStream_t)stream;
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

/* The descriptors of (n_out, n_in, T) and the first heuristic algorithm
 * that runs with split-K off (one pass over K per output element). */
static int entry_make(cu_lt *lt, lt_entry *e, int n_out, int n_in, int T, int f16, tern_err *err)
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
        (s = cublasLtMatrixLayoutCreate(&e->c, CUDA_R_32F, (uint64_t)n_out, (uint64_t)T, n_out))) {
        entry_free(e);
        return lt_fail(err, s, "layout");
    }
    cublasLtMatmulPreference_t pref;
    if ((s = cublasLtMatmulPreferenceCreate(&pref))) {
        entry_free(e);
        return lt_fail(err, s, "preference");
    }
    size_t ws = LT_WS_BYTES;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t r[8];
    int got = 0;
    s = cublasLtMatmulAlgoGetHeuristic(lt->h, e->op, e->a, e->b, e->c, e->c, pref, 8, r, &got);
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; s == CUBLAS_STATUS_SUCCESS && i < got; i++) {
        cublasLtMatmulAlgo_t al = r[i].algo;
        const int one = 1;
        const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
        cublasLtMatmulHeuristicResult_t chk;
        if (cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) ||
            cublasLtMatmulAlgoConfigSetAttribute(&al, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) ||
            cublasLtMatmulAlgoCheck(lt->h, e->op, e->a, e->b, e->c, e->c, &al, &chk) != CUBLAS_STATUS_SUCCESS)
            continue;
        e->algo = al;
        e->n_out = n_out;
        e->T = T;
        e->n_in = n_in;
        e->f16 = f16;
        return 0;
    }
    entry_free(e);
    return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: cuBLASLt has no algorithm without split-K for %d x %d x %d",
                        n_out, n_in, T);
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
