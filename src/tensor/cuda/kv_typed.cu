// Typed KV blocks on the device: copy-on-write of a block into one of
// another format (a 16-bit sink block and a quantized regular one), the
// device side of kv_block_copy's re-encoding (src/model/kv.c).
#include "tensor/cuda/kv_typed.cuh"

#define KVT_THREADS 64

// grid (block_size, n_kv_head): position p of the block, kv head h -
// decoded from src's format, encoded in dst's (kvt_off with a one-entry
// block table: the block id, position p in it).
__global__ void __launch_bounds__(KVT_THREADS) kv_convert_kernel(const tcu_kv kv, int hd, int32_t dst, int32_t src)
{
    __shared__ float x[2][TCU_KV_HEAD_MAX];
    const int p = blockIdx.x, h = blockIdx.y;
    int ts, td;
    const size_t os = kvt_off(kv, &src, p, h, &ts), od = kvt_off(kv, &dst, p, h, &td);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        x[0][e] = kvt_elem(kv.lk + os, ts, kv.group, e);
        x[1][e] = kvt_elem(kv.lv + os, ts, kv.group, e);
    }
    __syncthreads();
    kvt_encode(td, kv.group, hd, x[0], kv.lk + od, threadIdx.x, blockDim.x);
    kvt_encode(td, kv.group, hd, x[1], kv.lv + od, threadIdx.x, blockDim.x);
}

// grid (n heads), block KVT_THREADS: one head rotated in place.
__global__ void __launch_bounds__(KVT_THREADS) kv_rotate_kernel(float *x, int hd, int inverse)
{
    pdl_wait();
    pdl_trigger();
    __shared__ float s[TCU_KV_HEAD_MAX];
    float *h = x + (size_t)blockIdx.x * hd;
    for (int e = threadIdx.x; e < hd; e += blockDim.x)
        s[e] = h[e];
    __syncthreads();
    kvt_rotate(s, hd, inverse != 0);
    for (int e = threadIdx.x; e < hd; e += blockDim.x)
        h[e] = s[e];
}

extern "C" int tcu_kv_rotate(float *x, long n, int hd, int inverse, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    if (hd <= 0 || hd > TCU_KV_HEAD_MAX || n < 0 || n > 0x7fffffffL)
        return (int)cudaErrorInvalidValue;
    if (n == 0)
        return 0;
    return launch_pdl(opts_or_default(o).pdl, kv_rotate_kernel, dim3((unsigned)n), dim3(KVT_THREADS), 0,
                      (cudaStream_t)stream, x, hd, inverse);
}

extern "C" int tcu_kv_block_copy(const tcu_kv *kv, int hd, int32_t dst, int32_t src, tcu_stream stream)
{
    cudaStream_t s = (cudaStream_t)stream;
    if (!kv->typed || hd <= 0 || hd > TCU_KV_HEAD_MAX || dst < 0 || src < 0 || dst >= kv->n_blocks ||
        src >= kv->n_blocks)
        return (int)cudaErrorInvalidValue;
    const int sd = dst < kv->n_sink, ss = src < kv->n_sink;
    if (sd == ss || kv->type == kv->sink_type) { /* one format: the bytes */
        const size_t rb = (size_t)kv->block_size * (sd ? kv->sink_row : kv->row);
        auto at = [&](int32_t b) {
            return b < kv->n_sink ? (size_t)b * kv->block_size * kv->sink_row
                                  : (size_t)kv->n_sink * kv->block_size * kv->sink_row +
                                        (size_t)(b - kv->n_sink) * kv->block_size * kv->row;
        };
        cudaError_t rc = cudaMemcpyAsync(kv->lk + at(dst), kv->lk + at(src), rb, cudaMemcpyDeviceToDevice, s);
        if (rc == cudaSuccess)
            rc = cudaMemcpyAsync(kv->lv + at(dst), kv->lv + at(src), rb, cudaMemcpyDeviceToDevice, s);
        return (int)rc;
    }
    kv_convert_kernel<<<dim3(kv->block_size, kv->kv_dim / hd), KVT_THREADS, 0, s>>>(*kv, hd, dst, src);
    return (int)cudaGetLastError();
}
