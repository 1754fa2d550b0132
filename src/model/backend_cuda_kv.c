/* The CUDA backend's device KV mirror (backend_cuda_kv.h): its layout, the
 * per-layer launch descriptions, block copies and uploads. */
#include "model/backend_cuda_kv.h"

#ifdef TERN_CUDA

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

_Static_assert((int)TCU_KV_F32 == (int)KV_F32 && (int)TCU_KV_BF16 == (int)KV_BF16 &&
                   (int)TCU_KV_F16 == (int)KV_F16 && (int)TCU_KV_Q8 == (int)KV_Q8 && (int)TCU_KV_Q4 == (int)KV_Q4 &&
                   (int)TCU_KV_R4 == (int)KV_R4 && (int)TCU_KV_R3 == (int)KV_R3 && (int)TCU_KV_F8 == (int)KV_F8,
               "the device KV type codes are kv.h's");

unsigned cu_kvm_types(void)
{
    return 1u << KV_F32 | 1u << KV_BF16 | 1u << KV_F16 | 1u << KV_Q8 | 1u << KV_Q4 | 1u << KV_R4 | 1u << KV_R3 | 1u << KV_F8;
}

/* Bytes of layer L's K (or V) over the pool's blocks. */
static size_t layer_bytes(const kv_pool *kv, const kv_layer *L)
{
    return ((size_t)kv->n_sink * L->sink_row + (size_t)(kv->n_blocks - kv->n_sink) * L->row) * kv->block_size;
}

size_t cu_kvm_bytes(const kv_pool *kv)
{
    size_t n = 0;
    for (int l = 0; l < kv->n_layer; l++)
        n += layer_bytes(kv, &kv->layers[l]);
    return n;
}

int cu_kvm_matches(const cu_kvm *m, const kv_pool *kv)
{
    if (!(m->host == kv && m->k && m->fmt && m->n_layer == kv->n_layer && m->n_blocks == kv->n_blocks &&
          m->block_size == kv->block_size && m->kv_dim == kv->kv_dim && m->head_dim == kv->head_dim &&
          m->n_sink == kv->n_sink && m->bytes == cu_kvm_bytes(kv)))
        return 0;
    for (int l = 0; l < kv->n_layer; l++)
        if (m->fmt[2 * l] != (uint8_t)kv->layers[l].type || m->fmt[2 * l + 1] != (uint8_t)kv->layers[l].sink_type)
            return 0;
    return 1;
}

void cu_kvm_clear(cu_kvm *m)
{
    free(m->off);
    free(m->layers);
    free(m->fmt);
    memset(m, 0, sizeof *m);
}

int cu_kvm_set(cu_kvm *m, const kv_pool *kv, void *k, void *v, tern_err *err)
{
    cu_kvm_clear(m);
    int typed = kv->n_sink > 0;
    for (int l = 0; l < kv->n_layer; l++) {
        const kv_layer *L = &kv->layers[l];
        if (!(cu_kvm_types() & (1u << L->type)) || !(cu_kvm_types() & (1u << L->sink_type)))
            return tern_err_set(err, TERN_EUNSUPPORTED, "the cuda backend has no %s KV cache",
                                kv_type_name(cu_kvm_types() & (1u << L->type) ? L->sink_type : L->type));
        typed |= L->type != KV_F32 || L->sink_type != KV_F32;
    }
    if (typed && kv->head_dim > TCU_KV_HEAD_MAX)
        return tern_err_set(err, TERN_EUNSUPPORTED, "cuda: KV types need heads of at most %d (not %d)",
                            TCU_KV_HEAD_MAX, kv->head_dim);
    m->off = calloc((size_t)kv->n_layer, sizeof *m->off);
    m->layers = calloc((size_t)kv->n_layer, sizeof *m->layers);
    m->fmt = calloc((size_t)kv->n_layer * 2, 1);
    if (!m->off || !m->layers || !m->fmt) {
        cu_kvm_clear(m);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    m->host = kv;
    m->n_layer = kv->n_layer;
    m->n_blocks = kv->n_blocks;
    m->block_size = kv->block_size;
    m->kv_dim = kv->kv_dim;
    m->head_dim = kv->head_dim;
    m->n_sink = kv->n_sink;
    m->typed = typed;
    m->k = k;
    m->v = v;
    m->bytes = cu_kvm_bytes(kv);
    size_t off = 0;
    for (int l = 0; l < kv->n_layer; l++) {
        const kv_layer *L = &kv->layers[l];
        tcu_kv *d = &m->layers[l];
        m->off[l] = off;
        m->fmt[2 * l] = (uint8_t)L->type;
        m->fmt[2 * l + 1] = (uint8_t)L->sink_type;
        d->k = k;
        d->v = v;
        d->n_blocks = kv->n_blocks;
        d->block_size = kv->block_size;
        d->kv_dim = kv->kv_dim;
        if (typed) {
            d->typed = 1;
            d->lk = m->k + off;
            d->lv = m->v + off;
            d->type = (int)L->type;
            d->sink_type = (int)L->sink_type;
            d->n_sink = kv->n_sink;
            d->row = (int)L->row;
            d->sink_row = (int)L->sink_row;
            d->hb = (int)kv_head_bytes(L->type, kv->head_dim);
            d->sink_hb = (int)kv_head_bytes(L->sink_type, kv->head_dim);
            d->group = kv_type_group(L->type, kv->head_dim);
            d->rot = kv_type_is_rotated(L->type);
        }
        off += layer_bytes(kv, L);
    }
    return 0;
}

tcu_kv cu_kvm_layer(const cu_kvm *m, int l)
{
    if (!m->layers || l < 0 || l >= m->n_layer) {
        tcu_kv none;
        memset(&none, 0, sizeof none);
        return none;
    }
    return m->layers[l];
}

/* Byte offset of block b in a layer (as kv.c's block_base) and its size. */
static size_t block_at(const kv_pool *kv, const kv_layer *L, int32_t b, size_t *len)
{
    if (b < kv->n_sink) {
        *len = (size_t)kv->block_size * L->sink_row;
        return (size_t)b * *len;
    }
    *len = (size_t)kv->block_size * L->row;
    return (size_t)kv->n_sink * kv->block_size * L->sink_row + (size_t)(b - kv->n_sink) * *len;
}

int cu_kvm_block_copy(const cu_kvm *m, int32_t dst, int32_t src, tcu_stream stream)
{
    if (!m->k || dst < 0 || src < 0 || dst >= m->n_blocks || src >= m->n_blocks)
        return (int)cudaErrorInvalidValue;
    cudaError_t rc = cudaSuccess;
    for (int l = 0; l < m->n_layer && rc == cudaSuccess; l++) {
        if (m->typed) {
            rc = (cudaError_t)tcu_kv_block_copy(&m->layers[l], m->head_dim, dst, src, stream);
            continue;
        }
        size_t len = 0, od = block_at(m->host, &m->host->layers[l], dst, &len),
               os = block_at(m->host, &m->host->layers[l], src, &len);
        cudaStream_t s = (cudaStream_t)stream;
        rc = cudaMemcpyAsync(m->k + m->off[l] + od, m->k + m->off[l] + os, len, cudaMemcpyDeviceToDevice, s);
        if (rc == cudaSuccess)
            rc = cudaMemcpyAsync(m->v + m->off[l] + od, m->v + m->off[l] + os, len, cudaMemcpyDeviceToDevice, s);
    }
    return (int)rc;
}

int cu_kvm_block_upload(const cu_kvm *m, const kv_pool *host, int l, int32_t blk, tcu_stream stream)
{
    const kv_layer *L = &host->layers[l];
    if (!m->k || !L->k || l < 0 || l >= m->n_layer || blk < 0 || blk >= m->n_blocks)
        return (int)cudaErrorInvalidValue;
    size_t len = 0, o = block_at(host, L, blk, &len);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t rc = cudaMemcpyAsync(m->k + m->off[l] + o, L->k + o, len, cudaMemcpyHostToDevice, s);
    if (rc == cudaSuccess)
        rc = cudaMemcpyAsync(m->v + m->off[l] + o, L->v + o, len, cudaMemcpyHostToDevice, s);
    return (int)rc;
}

int cu_kvm_park_put(cu_kvm_park *pk, cu_kvm *cur, cu_kvm *dropped)
{
    int full = pk->n == CU_KVM_PARKED;
    if (full) {
        *dropped = pk->m[0];
        memmove(pk->m, pk->m + 1, (size_t)(CU_KVM_PARKED - 1) * sizeof *pk->m);
        pk->n--;
    }
    pk->m[pk->n++] = *cur;
    memset(cur, 0, sizeof *cur);
    return full;
}

int cu_kvm_park_take(cu_kvm_park *pk, const kv_pool *kv, cu_kvm *out)
{
    for (int i = 0; i < pk->n; i++)
        if (pk->m[i].host == kv) {
            *out = pk->m[i];
            memmove(pk->m + i, pk->m + i + 1, (size_t)(pk->n - i - 1) * sizeof *pk->m);
            pk->n--;
            memset(&pk->m[pk->n], 0, sizeof pk->m[pk->n]);
            return 1;
        }
    return 0;
}

const cu_kvm *cu_kvm_park_find(const cu_kvm_park *pk, const kv_pool *kv)
{
    for (int i = 0; i < pk->n; i++)
        if (pk->m[i].host == kv)
            return &pk->m[i];
    return NULL;
}

#else
typedef int tern_backend_cuda_kv_unused; /* ISO C: a translation unit declares something */
#endif
