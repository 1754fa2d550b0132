/* LoRA adapters on the CUDA device forward (backend_cuda_lora.h,
 * docs/lora.md). An adapter's device copy is one allocation holding every
 * adapted module's A and B (f32, as the host keeps them) and a table of
 * tcu_lora_mod [n_layer][LORA_N_MOD] pointing into it. A step's rows are a
 * device array of table pointers, one a row (NULL for a base row), so one
 * launch a product serves the rows of every adapter in the batch. */
#ifdef TERN_CUDA

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/log.h"
#include "model/backend_cuda_lora.h"
#include "model/lora.h"
#include "tensor/cuda/cuda_lora.h"

/* One adapter on the device. */
typedef struct cu_lora_dev {
    int device, n_layer, max_r;
    void *mem;          /* A and B of every module, then the table */
    tcu_lora_mod *tab;  /* device [n_layer * LORA_N_MOD], inside mem */
    uint8_t *has;       /* host [n_layer * LORA_N_MOD] */
} cu_lora_dev;

struct cu_lora {
    int on, max_r, n_layer, cap;
    const tcu_lora_mod **h_tabs; /* pinned host [cap]: each row's table, NULL = base */
    const tcu_lora_mod **d_tabs; /* device [cap] */
    uint8_t *any;                /* [n_layer * LORA_N_MOD]: some row of the step adapts it */
};

static int cuda_fail(tern_err *err, cudaError_t ce, const char *what)
{
    cudaGetLastError();
    return tern_err_set(err, ce == cudaErrorMemoryAllocation ? TERN_ENOMEM : TERN_EIO, "cuda: LoRA %s: %s", what,
                        cudaGetErrorString(ce));
}

static void dev_free(void *p)
{
    cu_lora_dev *d = p;
    if (!d)
        return;
    if (d->mem) {
        cudaStream_t s;
        cudaSetDevice(d->device);
        if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
            cudaFreeAsync(d->mem, s);
            cudaStreamSynchronize(s);
            cudaStreamDestroy(s);
        }
        cudaGetLastError();
    }
    free(d->has);
    free(d);
}

int cu_lora_upload(int device, int n_layer, model_lora *a, tern_err *err)
{
    size_t n_mod = (size_t)n_layer * LORA_N_MOD, floats = 0;
    cu_lora_dev *d = calloc(1, sizeof *d);
    tcu_lora_mod *tab = calloc(n_mod, sizeof *tab);
    cudaStream_t s = NULL;
    cudaError_t ce;
    int rc = 0;
    if (!d || !tab || !(d->has = calloc(n_mod, 1))) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    d->device = device;
    d->n_layer = n_layer;
    for (int l = 0; l < n_layer; l++)
        for (int k = 0; k < LORA_N_MOD; k++) {
            const float *A, *B;
            int r, n_in, n_out;
            float scale;
            if (!model_lora_mod_get(a, l, k, &A, &B, &r, &n_in, &n_out, &scale))
                continue;
            if (r > TCU_LORA_MAX_R) {
                rc = tern_err_set(err, TERN_EUNSUPPORTED, "cuda: LoRA rank %d of layer %d %s is over %d", r, l,
                                  model_lora_mod_name(k), TCU_LORA_MAX_R);
                goto fail;
            }
            floats += (size_t)r * ((size_t)n_in + n_out);
        }
    size_t tab_off = (floats * sizeof(float) + 255) & ~(size_t)255;
    if ((ce = cudaSetDevice(device)) || (ce = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) ||
        (ce = cudaMallocAsync(&d->mem, tab_off + n_mod * sizeof *tab, s))) {
        rc = cuda_fail(err, ce, "adapter upload");
        goto fail;
    }
    float *at = d->mem;
    for (int l = 0; l < n_layer; l++)
        for (int k = 0; k < LORA_N_MOD; k++) {
            const float *A, *B;
            int r, n_in, n_out;
            float scale;
            size_t i = (size_t)l * LORA_N_MOD + k;
            if (!model_lora_mod_get(a, l, k, &A, &B, &r, &n_in, &n_out, &scale))
                continue;
            size_t na = (size_t)r * n_in, nb = (size_t)n_out * r;
            if ((ce = cudaMemcpyAsync(at, A, na * sizeof(float), cudaMemcpyHostToDevice, s)) ||
                (ce = cudaMemcpyAsync(at + na, B, nb * sizeof(float), cudaMemcpyHostToDevice, s))) {
                rc = cuda_fail(err, ce, "adapter upload");
                goto fail;
            }
            tab[i].a = at;
            tab[i].b = at + na;
            tab[i].r = r;
            tab[i].scale = scale;
            d->has[i] = 1;
            d->max_r = r > d->max_r ? r : d->max_r;
            at += na + nb;
        }
    d->tab = (tcu_lora_mod *)((char *)d->mem + tab_off);
    if ((ce = cudaMemcpyAsync(d->tab, tab, n_mod * sizeof *tab, cudaMemcpyHostToDevice, s)) ||
        (ce = cudaStreamSynchronize(s))) {
        rc = cuda_fail(err, ce, "adapter upload");
        goto fail;
    }
    cudaStreamDestroy(s);
    free(tab);
    model_lora_dev_set(a, d, dev_free);
    TERN_INFO("cuda: LoRA adapter on GPU %d, %.1f MB", device, floats * sizeof(float) / 1e6);
    return 0;
fail:
    if (s) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
    }
    free(tab);
    dev_free(d);
    return rc;
}

int cu_lora_rows_set(cu_lora **stp, int n_layer, const model_lora *const *lora, int T, tcu_stream stream,
                     tern_err *err)
{
    cu_lora *st = *stp;
    size_t n_mod = (size_t)n_layer * LORA_N_MOD;
    if (!lora) {
        if (st)
            st->on = 0;
        return 0;
    }
    if (!st) {
        if (!(st = *stp = calloc(1, sizeof *st)) || !(st->any = calloc(n_mod, 1)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        st->n_layer = n_layer;
    }
    cudaError_t ce;
    if (T > st->cap) {
        int cap = T > 2 * st->cap ? T : 2 * st->cap;
        cudaStreamSynchronize((cudaStream_t)stream); /* nothing reads the old ones any more */
        cudaFreeHost(st->h_tabs);
        cudaFree(st->d_tabs);
        st->h_tabs = NULL;
        st->d_tabs = NULL;
        st->cap = 0;
        if ((ce = cudaMallocHost((void **)&st->h_tabs, (size_t)cap * sizeof *st->h_tabs)) ||
            (ce = cudaMalloc((void **)&st->d_tabs, (size_t)cap * sizeof *st->d_tabs)))
            return cuda_fail(err, ce, "row table");
        st->cap = cap;
    }
    memset(st->any, 0, n_mod);
    st->max_r = 0;
    st->on = 0;
    for (int i = 0; i < T; i++) {
        const cu_lora_dev *d = lora[i] ? model_lora_dev(lora[i]) : NULL;
        if (lora[i] && (!d || d->n_layer != n_layer))
            return tern_err_set(err, TERN_EINVAL, "cuda: a LoRA adapter of row %d was not loaded for this model", i);
        st->h_tabs[i] = d ? d->tab : NULL;
        if (!d)
            continue;
        for (size_t k = 0; k < n_mod; k++)
            st->any[k] |= d->has[k];
        st->max_r = d->max_r > st->max_r ? d->max_r : st->max_r;
    }
    if ((ce = cudaMemcpyAsync(st->d_tabs, st->h_tabs, (size_t)T * sizeof *st->h_tabs, cudaMemcpyHostToDevice,
                              (cudaStream_t)stream)))
        return cuda_fail(err, ce, "row table");
    st->on = st->max_r > 0;
    return 0;
}

int cu_lora_has_any(const cu_lora *st) { return st && st->on; }

int cu_lora_has(const cu_lora *st, int l, int mod)
{
    return st && st->on && st->any[(size_t)l * LORA_N_MOD + mod];
}

int cu_lora_add(const cu_lora *st, int l, int mod, const float *x, float *y, int n_in, int n_out, int T,
                const tcu_opts *o, tcu_stream stream)
{
    if (!cu_lora_has(st, l, mod))
        return 0;
    return tcu_lora_add(st->d_tabs, l * LORA_N_MOD + mod, x, y, n_in, n_out, T, st->max_r, o, stream);
}

void cu_lora_done(cu_lora *st)
{
    if (st)
        st->on = 0;
}

void cu_lora_free(cu_lora *st)
{
    if (!st)
        return;
    cudaFreeHost(st->h_tabs);
    cudaFree(st->d_tabs);
    free(st->any);
    free(st);
}

#else
typedef int backend_cuda_lora_unused; /* the file is empty without CUDA */
#endif
