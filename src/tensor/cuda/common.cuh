// Shared by the CUDA kernel files: launch helpers (programmatic dependent
// launch, clusters), the per-launch profile, and small device helpers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

#include "tensor/cuda/cuda_kernels.h"

#define WARP 32

static inline int last_err(void) { return (int)cudaGetLastError(); }

// ---- programmatic dependent launch (Hopper) ----
//
// Every kernel here calls pdl_wait() (griddepcontrol.wait: returns once
// the grids it depends on have completed and their writes are visible)
// before it touches memory an earlier kernel writes, then pdl_trigger()
// lets the next launch be scheduled. Launched with the programmatic-
// serialization attribute (tcu_opts.pdl), the next kernel's launch and
// prologue (what no kernel writes: 4/8-bit GEMVs' and `early` launches'
// first weight chunks, norm weights, the fused attention's positions,
// block table and K/V rows) overlap this one's tail; without it both are
// no-ops.

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/* An FP8 E4M3 byte (low 8 bits of b) as f32, exactly: sign to bit 31, the
 * 7 other bits to 26..20 make an f32 of 2^-120 the value (subnormals
 * included), restored by the power-of-two product. Like the f32 kernels,
 * nothing here flushes subnormals. NaN codes (0x7f, 0xff) decode to 480. */
__device__ __forceinline__ float f8e4m3_f(uint32_t b)
{
    return __uint_as_float(((b & 0x7fu) << 20) | ((b & 0x80u) << 24)) * 0x1p120f;
}

static inline bool kind_quantized(int kind) { return kind != TCU_BF16 && kind != TCU_F16 && kind != TCU_F32; }

/* the options a launcher was given, or the defaults for NULL */
const tcu_opts &opts_or_default(const tcu_opts *o);
// One more launch on the merged products' outputs (tcu_cat_launches).
void tcu_cat_count(void);

/* multiprocessors of the current device (132 if the query fails) */
int sm_count(void);

// cluster > 0: thread-block clusters of `cluster` blocks along x.
template <typename... KArgs, typename... Args>
static int launch_cl(bool pdl, unsigned cluster, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                     cudaStream_t s, Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = 1;
    }
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = n;
    int rc = (int)cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    return rc ? rc : last_err();
}

template <typename... KArgs, typename... Args>
static int launch_pdl(bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                      Args &&...args)
{
    return launch_cl(pdl, 0, kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

// ---- per-launch profile (tcu_prof_start / tcu_prof_stop) ----

int prof_begin(int cat, cudaStream_t s); /* the event pair's index, -1 when not profiling */
void prof_end(int i, cudaStream_t s);

struct prof_scope {
    int i;
    cudaStream_t s;
    prof_scope(int cat, cudaStream_t st) : i(prof_begin(cat, st)), s(st) {}
    ~prof_scope()
    {
        if (i >= 0)
            prof_end(i, s);
    }
};
#define PROF(cat, stream) prof_scope prof_scope_((cat), (cudaStream_t)(stream))

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// 16 bytes global -> shared without registers (zeros when src_bytes = 0).
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(gmem), "r"(src_bytes) : "memory");
}

// mma.sync m16n8k16 with f32 accumulation, bf16 (F16 false) or f16
// inputs (PTX ISA, "Matrix fragments for mma.m16n8k16"; g = lane / 4,
// t = lane % 4): A (16 x 16, row-major) a0 = (row g, k 2t, 2t+1), a1 =
// (row g+8, k 2t, 2t+1), a2 = (row g, k 2t+8, 2t+9), a3 = (row g+8, k
// 2t+8, 2t+9), lower k in the low half; B (16 x 8, column-major) b0 =
// (k 2t, 2t+1, column g), b1 = (k 2t+8, 2t+9, column g); C (16 x 8) c0,
// c1 = (row g, columns 2t, 2t+1), c2, c3 = (row g+8, the same columns).
template <bool F16 = false>
__device__ __forceinline__ void tc_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix x4 from shared memory: lane l gives the address of row l % 8 of
// matrix l / 8 (16 bytes); r[m] is matrix m's fragment (lane: row g,
// elements 2t, 2t+1), or with TRANS its transpose (elements 2t, 2t+1 of
// column g).
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *row)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
}

__device__ __forceinline__ float bf16f(uint32_t bits16) { return __uint_as_float(bits16 << 16); }
__device__ __forceinline__ float f16f(uint32_t bits16)
{
    return __half2float(__ushort_as_half((unsigned short)bits16));
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_f(float x)
{
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// The threads that work as one block (the group the sums below reduce
// over; gemv_ring.cu has a group of its own).
struct blk_grp {
    __device__ int tid() const { return threadIdx.x; }
    __device__ int size() const { return blockDim.x; }
    __device__ void sync() const { __syncthreads(); }
};

// Sum over the group (sh: 32 doubles of shared scratch): the warps'
// butterflies, then the warps in order.
template <class G> __device__ double grp_sum_d(const G &g, double v, double *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = g.tid() >> 5, l = g.tid() & 31, nw = (g.size() + 31) >> 5;
    g.sync();
    if (l == 0)
        sh[w] = v;
    g.sync();
    double s = 0.0;
    for (int k = 0; k < nw; k++)
        s += sh[k];
    return s;
}

static __device__ double block_sum_d(double v)
{
    __shared__ double sh[32];
    return grp_sum_d(blk_grp{}, v, sh);
}

// The offset of position pos of a sequence (block table blk) in layer
// `layer` of the paged KV pool.
__device__ __forceinline__ size_t kv_off(const tcu_kv &kv, int layer, const int32_t *blk, int pos)
{
    size_t b = (size_t)blk[pos / kv.block_size];
    return (((size_t)layer * kv.n_blocks + b) * kv.block_size + (size_t)(pos % kv.block_size)) * kv.kv_dim;
}
