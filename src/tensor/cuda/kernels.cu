// CUDA kernels of the CUDA backend (see cuda_kernels.h). Written for
// clarity first: the GEMV is the part that must run at memory speed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

#include <cooperative_groups.h>

#include "tensor/cuda/cuda_kernels.h"

#define WARP 32
#define GEMV_WARPS 8 /* rows per block */
#define GEMV_TT 8    /* tokens per register tile */
#define GEMV_U 4     /* 16-byte loads in flight per lane */

static int last_err(void) { return (int)cudaGetLastError(); }

// ---- programmatic dependent launch (Hopper) ----
//
// Every kernel here calls pdl_wait() (griddepcontrol.wait: returns once
// the grids it depends on have completed and their writes are visible)
// before it touches memory an earlier kernel writes, then pdl_trigger()
// lets the next launch be scheduled. Launched with the programmatic-
// serialization attribute (TERN_CUDA_PDL, default TCU_PDL_DEFAULT), the
// next kernel's launch and prologue (what no kernel writes: 4/8-bit GEMVs'
// first weight chunks, norm weights, the fused attention's positions, block
// table and K/V rows) overlap this one's tail; without it both are no-ops.

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

static int pdl_on = -1;

extern "C" void tcu_pdl_set(int mode) { pdl_on = mode >= 0 && mode <= 4 ? mode : TCU_PDL_DEFAULT; }

extern "C" int tcu_pdl(void)
{
    if (pdl_on < 0) {
        const char *e = getenv("TERN_CUDA_PDL");
        int v = e && *e ? atoi(e) : TCU_PDL_DEFAULT;
        pdl_on = v >= 0 && v <= 4 ? v : TCU_PDL_DEFAULT;
    }
    return pdl_on;
}

static bool pdl_enabled(void) { return tcu_pdl() == 1 || tcu_pdl() >= 3; }

static bool kind_quantized(int kind) { return kind != TCU_BF16 && kind != TCU_F16 && kind != TCU_F32; }

/* GEMV launches of 4/8-bit weights use PDL in modes 1-4 */
static bool pdl_enabled_gemv(int kind) { return tcu_pdl() == 1 || (tcu_pdl() >= 2 && kind_quantized(kind)); }

/* The shared-memory GEMV (gemv_v_launch): PDL, and whether its blocks
 * request their first weight chunks before waiting for the previous kernel
 * (mode 3 has the 16-bit ones wait first: the earlier requests delayed
 * their activations' copies by more than they gained - docs/cuda.md). */
static bool pdl_gemv_v(int kind) { return pdl_enabled_gemv(kind) || (tcu_pdl() == 3 && !kind_quantized(kind)); }
static bool gemv_v_hoist(int kind) { return tcu_pdl() == 1 || kind_quantized(kind); }

static int sm_count(void);

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

template <typename... KArgs, typename... Args>
static int launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args &&...args)
{
    return launch_pdl(pdl_enabled(), kernel, grid, block, smem, s, std::forward<Args>(args)...);
}

// ---- per-launch profile (tcu_prof_start / tcu_prof_stop) ----

#define PROF_MAX 16384
static int prof_on, prof_n;
static cudaEvent_t prof_ev[2 * PROF_MAX];
static unsigned char prof_cat[PROF_MAX];

struct prof_scope {
    int i;
    cudaStream_t s;
    prof_scope(int cat, cudaStream_t st) : i(-1), s(st)
    {
        if (!prof_on || prof_n >= PROF_MAX)
            return;
        i = prof_n++;
        if (!prof_ev[2 * i] && (cudaEventCreate(&prof_ev[2 * i]) || cudaEventCreate(&prof_ev[2 * i + 1]))) {
            i = -1;
            return;
        }
        prof_cat[i] = (unsigned char)cat;
        cudaEventRecord(prof_ev[2 * i], s);
    }
    ~prof_scope()
    {
        if (i >= 0)
            cudaEventRecord(prof_ev[2 * i + 1], s);
    }
};
#define PROF(cat, stream) prof_scope prof_scope_((cat), (cudaStream_t)(stream))

extern "C" void tcu_prof_start(void)
{
    prof_n = 0;
    prof_on = 1;
}

extern "C" int tcu_prof_stop(double ms[TCU_PROF_N], int count[TCU_PROF_N])
{
    prof_on = 0;
    for (int c = 0; c < TCU_PROF_N; c++) {
        ms[c] = 0;
        count[c] = 0;
    }
    int rc = (int)cudaDeviceSynchronize();
    for (int i = 0; i < prof_n && !rc; i++) {
        float t = 0.0f;
        rc = (int)cudaEventElapsedTime(&t, prof_ev[2 * i], prof_ev[2 * i + 1]);
        ms[prof_cat[i]] += t;
        count[prof_cat[i]]++;
    }
    return rc;
}

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

__device__ __forceinline__ float bf16f(uint32_t bits16) { return __uint_as_float(bits16 << 16); }
__device__ __forceinline__ float f16f(uint32_t bits16)
{
    return __half2float(__ushort_as_half((unsigned short)bits16));
}

// One 16-byte chunk of a weight row, by kind: values per chunk and the
// dot of those values with NV consecutive inputs x (with the quantized
// scale/bias applied per chunk: a chunk never straddles a group).
template <int KIND> struct chunk_traits;
template <> struct chunk_traits<TCU_F32> { static constexpr int NV = 4; };
template <> struct chunk_traits<TCU_BF16> { static constexpr int NV = 8; };
template <> struct chunk_traits<TCU_F16> { static constexpr int NV = 8; };
template <> struct chunk_traits<TCU_Q4> { static constexpr int NV = 32; };
template <> struct chunk_traits<TCU_Q8> { static constexpr int NV = 16; };
/* internal kind: 4-bit codes converted as 1 + q/16 (see chunk_dot_v) */
#define TCU_Q4F 100
template <> struct chunk_traits<TCU_Q4F> { static constexpr int NV = 32; };

template <int KIND>
__device__ __forceinline__ float chunk_dot(const uint4 &raw, const float *__restrict__ x, float scale, float bias)
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (KIND == TCU_F32) {
        float4 a = __ldg(reinterpret_cast<const float4 *>(x));
        /* explicit fmas: the same rounding in every instantiation */
        float s = __uint_as_float(w[0]) * a.x;
        s = fmaf(__uint_as_float(w[1]), a.y, s);
        s = fmaf(__uint_as_float(w[2]), a.z, s);
        return fmaf(__uint_as_float(w[3]), a.w, s);
    } else if constexpr (KIND == TCU_BF16 || KIND == TCU_F16) {
        float4 a = __ldg(reinterpret_cast<const float4 *>(x)), b = __ldg(reinterpret_cast<const float4 *>(x) + 1);
        float xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t h = (w[j >> 1] >> ((j & 1) * 16)) & 0xffffu;
            s = fmaf(KIND == TCU_BF16 ? bf16f(h) : f16f(h), xs[j], s);
        }
        return s;
    } else {
        constexpr int BITS = KIND == TCU_Q4 ? 4 : 8, PER = 32 / BITS, NV = chunk_traits<KIND>::NV;
        float sq = 0.0f, sx = 0.0f;
#pragma unroll
        for (int v4 = 0; v4 < NV / 4; v4++) {
            float4 a = __ldg(reinterpret_cast<const float4 *>(x) + v4);
            float xs[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int e = v4 * 4 + j;
                float q = (float)((w[e / PER] >> ((e % PER) * BITS)) & ((1u << BITS) - 1));
                sq = fmaf(q, xs[j], sq);
                sx += xs[j];
            }
        }
        return fmaf(scale, sq, bias * sx);
    }
}

// acc[tt] = dot(row, x[t0 + tt]) for tt < nt (reduced over the warp).
template <int KIND, int TT>
__device__ __forceinline__ void row_dot(const uint4 *__restrict__ row, const float *__restrict__ sbrow, int group,
                                        int nch, const float *__restrict__ x, int n_in, int t0, int nt, float acc[TT],
                                        int lane)
{
    constexpr int NV = chunk_traits<KIND>::NV;
    constexpr bool Q = KIND == TCU_Q4 || KIND == TCU_Q8;
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        acc[tt] = 0.0f;
    constexpr int U = TT == 1 ? 2 * GEMV_U : GEMV_U; /* loads in flight per lane */
    for (int c0 = lane; c0 < nch; c0 += WARP * U) {
        uint4 raw[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * WARP;
            raw[u] = c < nch ? (TT == 1 ? __ldcs(row + c) : __ldg(row + c)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int c = c0 + u * WARP;
            if (c >= nch)
                break;
            float scale = 0.0f, bias = 0.0f;
            if constexpr (Q) {
                int g = c * NV / group;
                float2 p = __ldg(reinterpret_cast<const float2 *>(sbrow) + g);
                scale = p.x;
                bias = p.y;
            }
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                if (tt < nt)
                    acc[tt] += chunk_dot<KIND>(raw[u], x + (size_t)(t0 + tt) * n_in + (size_t)c * NV, scale, bias);
        }
    }
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        acc[tt] = warp_sum(acc[tt]);
}

template <int KIND> __device__ __forceinline__ size_t row_bytes(int n_in)
{
    if constexpr (KIND == TCU_Q4 || KIND == TCU_Q4F)
        return (size_t)n_in / 2;
    else if constexpr (KIND == TCU_Q8)
        return (size_t)n_in;
    else if constexpr (KIND == TCU_F32)
        return (size_t)n_in * 4;
    else
        return (size_t)n_in * 2;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_f(float x)
{
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// The matrix of a fused launch's output row gr (a row past the last
// matrix's is taken as the last's); *off = the rows of the matrices before.
__device__ __forceinline__ int gv_mat_of(const tcu_gemv_args &a, long gr, long *off)
{
    int k = 0;
    *off = 0;
    while (k < a.n - 1 && gr >= *off + a.m[k].n_out) {
        *off += a.m[k].n_out;
        k++;
    }
    return k;
}

// (x * r) * g per element, the fused RMSNorm's rounding (as tcu_rmsnorm).
__device__ __forceinline__ float4 norm4(float4 x, float r, float4 g)
{
    return make_float4(__fmul_rn(__fmul_rn(x.x, r), g.x), __fmul_rn(__fmul_rn(x.y, r), g.y),
                       __fmul_rn(__fmul_rn(x.z, r), g.z), __fmul_rn(__fmul_rn(x.w, r), g.w));
}

template <int KIND, int TT> __global__ void __launch_bounds__(GEMV_WARPS *WARP) gemv_kernel(const tcu_gemv_args a)
{
    pdl_wait();
    pdl_trigger();
    constexpr int NV = chunk_traits<KIND>::NV;
    int lane = threadIdx.x & 31;
    long gr = (long)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int nch = a.n_in / NV;
    if (a.glu) {
        if (gr >= a.m[0].n_out)
            return;
        int r = (int)gr, ng = a.n_in / (a.m[0].group ? a.m[0].group : 1);
        const uint4 *rg = reinterpret_cast<const uint4 *>((const char *)a.m[0].w + (size_t)r * row_bytes<KIND>(a.n_in));
        const uint4 *ru = reinterpret_cast<const uint4 *>((const char *)a.m[1].w + (size_t)r * row_bytes<KIND>(a.n_in));
        const float *sg = a.m[0].sb ? a.m[0].sb + (size_t)r * ng * 2 : nullptr;
        const float *su = a.m[1].sb ? a.m[1].sb + (size_t)r * ng * 2 : nullptr;
        for (int t0 = 0; t0 < a.T; t0 += TT) {
            int nt = a.T - t0 < TT ? a.T - t0 : TT;
            float ag[TT], au[TT];
            row_dot<KIND, TT>(rg, sg, a.m[0].group, nch, a.x, a.n_in, t0, nt, ag, lane);
            row_dot<KIND, TT>(ru, su, a.m[1].group, nch, a.x, a.n_in, t0, nt, au, lane);
            if (lane < nt) {
                float g = 0.0f, u = 0.0f;
#pragma unroll
                for (int tt = 0; tt < TT; tt++)
                    if (tt == lane) {
                        g = ag[tt];
                        u = au[tt];
                    }
                a.m[0].y[(size_t)(t0 + lane) * a.m[0].n_out + r] = (a.glu == 2 ? gelu_f(g) : silu_f(g)) * u;
            }
        }
        return;
    }
    int k = 0;
    long off = 0;
    while (k < a.n && gr >= off + a.m[k].n_out) {
        off += a.m[k].n_out;
        k++;
    }
    if (k >= a.n)
        return;
    const tcu_mat &m = a.m[k];
    int r = (int)(gr - off), ng = a.n_in / (m.group ? m.group : 1);
    const uint4 *row = reinterpret_cast<const uint4 *>((const char *)m.w + (size_t)r * row_bytes<KIND>(a.n_in));
    const float *sb = m.sb ? m.sb + (size_t)r * ng * 2 : nullptr;
    for (int t0 = 0; t0 < a.T; t0 += TT) {
        int nt = a.T - t0 < TT ? a.T - t0 : TT;
        float acc[TT];
        row_dot<KIND, TT>(row, sb, m.group, nch, a.x, a.n_in, t0, nt, acc, lane);
        if (lane < nt) {
            float v = 0.0f;
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                if (tt == lane)
                    v = acc[tt];
            float *y = m.y + (size_t)(t0 + lane) * m.n_out + r;
            *y = a.accumulate ? *y + v : v;
        }
    }
}

/* Output rows of one GEMV launch (gate/up of a glu launch count once). */
static long gemv_rows(const tcu_gemv_args *a)
{
    long rows = 0;
    if (a->glu)
        return a->m[0].n_out;
    for (int k = 0; k < a->n; k++)
        rows += a->m[k].n_out;
    return rows;
}

static int gemv_legacy(const tcu_gemv_args *a, tcu_stream stream)
{
    long rows = gemv_rows(a);
    if (rows == 0 || a->T == 0)
        return 0;
    dim3 grid((unsigned)((rows + GEMV_WARPS - 1) / GEMV_WARPS)), block(GEMV_WARPS * WARP);
    cudaStream_t s = (cudaStream_t)stream;
    int rc = 0;
    /* T = 1 (decode) gets a one-token tile: fewer registers, more rows in
     * flight. Either tile computes each (row, token) in the same order. */
#define GEMV_CASE(K)                                                                                               \
    case K:                                                                                                        \
        if (a->T == 1)                                                                                             \
            rc = launch_pdl(pdl_enabled_gemv(K), gemv_kernel<K, 1>, grid, block, 0, s, *a);                         \
        else                                                                                                       \
            rc = launch_pdl(pdl_enabled_gemv(K), gemv_kernel<K, GEMV_TT>, grid, block, 0, s, *a);                   \
        break;
    switch (a->m[0].kind) {
        GEMV_CASE(TCU_F32)
        GEMV_CASE(TCU_BF16)
        GEMV_CASE(TCU_F16)
        GEMV_CASE(TCU_Q4)
        GEMV_CASE(TCU_Q8)
    default: return (int)cudaErrorInvalidValue;
    }
#undef GEMV_CASE
    return rc;
}

// ---- GEMV variants (TERN_CUDA_GEMV, tcu_gemv_set_variant) ----
//
// One templated kernel covers the variants after the legacy one (0):
//   R  output rows per warp (the activation chunk is loaded once and used
//      for all R rows; GLU launches stream gate and up rows, 2R streams);
//   S  warps per row (split-K: lane L = warp_in_group * 32 + lane of the S
//      warps owns chunks c = L, L + 32S, ...; warp sums meet in shared
//      memory and are added in warp order);
//   XS the block stages the activations in shared memory (panels of at
//      most GV_SMEM bytes), XOR-swizzled per 16-byte piece so that the
//      lanes of a quarter-warp hit distinct banks.
// When one panel holds the tile's activations (T = 1 always, up to a few
// tokens), they arrive by cp.async - issued first, ahead of everything -
// and each warp's first weight chunks are loaded into registers before the
// block waits for them: the norm and the staging no longer hold the weight
// stream back (a prologue that waited for x twice, for the norm's sums and
// again for the staging, cost 4-13 us of a 12-70 us launch on the 8B
// shapes). The norm is then taken from shared memory with the same sums
// and products as the panel path, so both give the same bits.
// Each (row, token) is summed in one order fixed by (variant, n_in): per
// lane the chunks it owns in increasing order, each chunk's values in
// order, then the butterfly over the warp and the S warps in order. Tiles,
// panels and the unroll depth only change when loads are issued, so a row
// never depends on T. Quantized chunks convert codes with the 2^23
// magic-number trick (exact for 0..255, no int-to-float instruction) and
// share the chunk's activation sum between the R rows.

#define GV_WARPS 8
#define GV_SMEM (96 * 1024)
#define GV_SMEM_G (64 * 1024) /* the norm weights of the one-panel path */

__device__ double block_sum_d(double v);

// The RMSNorm factor of tokens t0 .. t0 + nt - 1 of a GEMV's input, into
// rnorm[] (shared), reduced as rmsnorm_kernel does (the same 256 threads,
// double sums), so a fused norm gives the norm kernel's bits. Whole block.
__device__ void gv_norm_factors(const tcu_gemv_args &a, int t0, int nt, float *rnorm)
{
    for (int tt = 0; tt < nt; tt++) {
        const float *xr = a.x + (size_t)(a.norm_rows ? a.norm_rows[t0 + tt] : t0 + tt) * a.n_in;
        double ss = 0.0;
        for (int e = threadIdx.x; e < a.n_in; e += blockDim.x)
            ss += (double)xr[e] * xr[e];
        ss = block_sum_d(ss);
        if (threadIdx.x == 0)
            rnorm[tt] = (float)(1.0 / sqrt(ss / a.n_in + a.norm_eps));
    }
    __syncthreads();
}

__device__ __forceinline__ float q_byte(uint32_t w, int k_sel)
{
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (uint32_t)k_sel)) - 8388608.0f;
}

// dot of a 16-byte chunk with activations xv[NV] (in registers); sx is the
// sum of xv (quantized kinds only).
template <int KIND>
__device__ __forceinline__ float chunk_dot_v(const uint4 &raw, const float *xv, float sx, float scale, float bias)
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
    if constexpr (KIND == TCU_BF16) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t h = (j & 1) ? (w[j >> 1] & 0xffff0000u) : (w[j >> 1] << 16);
            s = fmaf(__uint_as_float(h), xv[j], s);
        }
        return s;
    } else if constexpr (KIND == TCU_Q8) {
        float sq = 0.0f;
#pragma unroll
        for (int e = 0; e < 16; e++)
            sq = fmaf(q_byte(w[e >> 2], e & 3), xv[e], sq);
        return fmaf(scale, sq, __fmul_rn(bias, sx));
    } else if constexpr (KIND == TCU_Q4F) {
        /* each code q moved to bits 19-22 of a byte pattern 0x80 | q << 3,
         * one byte_perm makes the float 1 + q/16 (exact); sum (1 + q/16) x
         * - sum x = sum q x / 16: two instructions per code instead of
         * three, at a few ulps more rounding */
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = ((w[k] << 3) & 0x78787878u) | 0x80808080u, hi = ((w[k] >> 1) & 0x78787878u) | 0x80808080u;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                s = fmaf(__uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7044u | (uint32_t)(b << 8))), xv[k * 8 + 2 * b], s);
                s = fmaf(__uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7044u | (uint32_t)(b << 8))), xv[k * 8 + 2 * b + 1],
                         s);
            }
        }
        return fmaf(scale * 16.0f, __fsub_rn(s, sx), __fmul_rn(bias, sx));
    } else { /* TCU_Q4: element e = nibble e % 8 of word e / 8, low nibble first */
        float sq = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = w[k] & 0x0f0f0f0fu, hi = (w[k] >> 4) & 0x0f0f0f0fu;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                sq = fmaf(q_byte(lo, b), xv[k * 8 + 2 * b], sq);
                sq = fmaf(q_byte(hi, b), xv[k * 8 + 2 * b + 1], sq);
            }
        }
        return fmaf(scale, sq, __fmul_rn(bias, sx));
    }
}

// Swizzle of a chunk's 16-byte pieces in shared memory (P pieces a chunk).
template <int NV> __device__ __forceinline__ int gv_swz(int cc)
{
    constexpr int P = NV / 4;
    return P >= 8 ? (cc & 7) % P : (cc / (8 / P)) % P;
}

// Where input e of a staged row lives in shared memory.
template <int NV> __device__ __forceinline__ int gv_pos(int e)
{
    const int cc = e / NV, p = (e % NV) / 4;
    return cc * NV + ((p ^ gv_swz<NV>(cc)) * 4) + (e & 3);
}

/* blocks per SM the registers must allow at T = 1: three for 16-bit
 * weights (a q/k/v launch of the 8B shape is then one wave), two for
 * quantized ones */
template <int KIND, int TT> constexpr int gv_min_blocks()
{
    return TT > 1 ? 1 : KIND == TCU_BF16 || KIND == TCU_F16 ? 3 : 2;
}

// ONE: 0 = activations staged panel by panel (the norm factor read from
// global memory first); 1 = the one-panel path, x's copies issued first,
// then the first weight chunks; 2 = the same with the weights issued before
// waiting for the previous kernel (launched with PDL). A compile-time
// choice: as a runtime flag it cost 10-20% on the 8B shapes (the first
// loop iteration could not be peeled around the preloaded chunks).
template <int KIND, int TT, int R, int S, bool XS, bool GLU, int UM, int ONE>
__global__ void __launch_bounds__(GV_WARPS *WARP, gv_min_blocks<KIND, TT>())
    gemv_v_kernel(const tcu_gemv_args a, int pvals)
{
    constexpr bool one = ONE != 0;
    constexpr int NV = chunk_traits<KIND>::NV;
    constexpr bool Q = KIND == TCU_Q4 || KIND == TCU_Q8 || KIND == TCU_Q4F;
    constexpr int NS = GLU ? 2 * R : R;                        /* weight rows streamed per warp */
    constexpr int UT = (TT == 1 ? 8 * UM : 4) / NS, U = UT < 1 ? 1 : UT; /* chunks in flight per stream */
    constexpr int LS = WARP * S;
    extern __shared__ float4 xs4[];
    float *xs = reinterpret_cast<float *>(xs4);
    __shared__ float red[GV_WARPS][NS][TT];
    __shared__ float rnorm[TT];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = warp / S, ws = warp % S;
    const int L = ws * WARP + lane, nch = a.n_in / NV;
    long rows = 0;
    if (GLU)
        rows = a.m[0].n_out;
    else
        for (int k = 0; k < a.n; k++)
            rows += a.m[k].n_out;
    const long base = ((long)blockIdx.x * (GV_WARPS / S) + grp) * R;

    const uint4 *rp[NS];
    const float2 *sbp[NS];
    int gsz[NS];
    float *yp[R];
    int ystride[R];
    bool valid[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        long gr = base + i;
        valid[i] = gr < rows;
        if (!valid[i])
            gr = rows - 1; /* clamped: computed, never stored */
        long off = 0;
        const int k = GLU ? 0 : gv_mat_of(a, gr, &off);
        const tcu_mat &m = a.m[k];
        int r = (int)(gr - off);
        yp[i] = m.y + r;
        ystride[i] = m.n_out;
#pragma unroll
        for (int h = 0; h < (GLU ? 2 : 1); h++) {
            const tcu_mat &mh = a.m[GLU ? h : k];
            const int g = mh.group ? mh.group : NV;
            rp[h * R + i] = reinterpret_cast<const uint4 *>((const char *)mh.w + (size_t)r * row_bytes<KIND>(a.n_in));
            sbp[h * R + i] = mh.sb ? reinterpret_cast<const float2 *>(mh.sb) + (size_t)r * (a.n_in / g) : nullptr;
            gsz[h * R + i] = g;
        }
    }

    /* one panel (XS only): tile t0's rows to shared memory, no registers */
    float *gs = xs + (size_t)(a.T < TT ? a.T : TT) * pvals; /* norm weights */
    auto stage_async = [&](int t0, int nt) {
        const int nv4 = a.n_in / 4;
        for (int idx = threadIdx.x; idx < nt * nv4; idx += blockDim.x) {
            int tt = idx / nv4, v = (idx - tt * nv4) * 4, cc = v / NV, p = (v % NV) / 4;
            const size_t xrow = a.norm_g && a.norm_rows ? (size_t)a.norm_rows[t0 + tt] : (size_t)(t0 + tt);
            cp_async16(xs + tt * pvals + cc * NV + ((p ^ gv_swz<NV>(cc)) * 4), a.x + xrow * a.n_in + v, 16);
        }
    };
    /* the chunks in flight and their scale/bias pairs (quantized kinds);
     * the one-panel path loads the first ones ahead of the loop */
    uint4 raw[U][NS];
    float2 sbr[U][NS];
    if constexpr (!one) {
        /* weights never depend on an earlier kernel: start pulling this
         * lane's first chunks into L2 before waiting for the inputs */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < NS; s++)
                if (L + u * LS < nch)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(rp[s] + L + u * LS));
    }
    auto hoist = [&]() {
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < NS; s++) {
                const int c = L + u * LS;
                raw[u][s] = c < nch ? (TT == 1 ? __ldcs(rp[s] + c) : __ldg(rp[s] + c)) : make_uint4(0, 0, 0, 0);
                if constexpr (Q)
                    sbr[u][s] = c < nch ? __ldg(sbp[s] + c * NV / gsz[s]) : make_float2(0.0f, 0.0f);
            }
    };
    if constexpr (ONE == 2)
        hoist();
    /* the norm weights (no kernel writes them) are copied before the wait,
     * in the same group as the activations */
    if (ONE == 1 && a.norm_g)
        for (int v = threadIdx.x * 4; v < a.n_in; v += blockDim.x * 4)
            cp_async16(gs + v, a.norm_g + v, 16);
    pdl_wait();
    pdl_trigger();
    if constexpr (one) {
        stage_async(0, a.T < TT ? a.T : TT);
        if (ONE == 2 && a.norm_g)
            for (int v = threadIdx.x * 4; v < a.n_in; v += blockDim.x * 4)
                cp_async16(gs + v, a.norm_g + v, 16);
        asm volatile("cp.async.commit_group;" ::: "memory");
        if constexpr (ONE == 1)
            hoist();
    }
    bool pre = one;

    for (int t0 = 0; t0 < a.T; t0 += TT) {
        const int nt = a.T - t0 < TT ? a.T - t0 : TT;
        float acc[NS][TT];
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                acc[s][tt] = 0.0f;
        if constexpr (one) {
            if (t0 > 0) {
                __syncthreads(); /* every warp is done with the previous tile */
                stage_async(t0, nt);
                asm volatile("cp.async.commit_group;" ::: "memory");
            }
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncthreads();
            if (a.norm_g) {
                /* the norm kernel's sums (the same 256 threads, double) and
                 * the panel path's products, in place */
                for (int tt = 0; tt < nt; tt++) {
                    float *xr = xs + tt * pvals;
                    double ss = 0.0;
                    for (int e = threadIdx.x; e < a.n_in; e += blockDim.x) {
                        const float v = xr[gv_pos<NV>(e)];
                        ss += (double)v * v;
                    }
                    ss = block_sum_d(ss);
                    const float r = (float)(1.0 / sqrt(ss / a.n_in + a.norm_eps));
                    for (int e = threadIdx.x; e < a.n_in; e += blockDim.x) {
                        const int q = gv_pos<NV>(e);
                        xr[q] = __fmul_rn(__fmul_rn(xr[q], r), gs[e]);
                    }
                }
                __syncthreads();
            }
        } else if (XS && a.norm_g) {
            gv_norm_factors(a, t0, nt, rnorm);
        }
        const int pch = XS ? pvals / NV : nch;
        for (int p0 = 0; p0 < nch; p0 += pch) {
            const int pend = p0 + pch < nch ? p0 + pch : nch;
            if constexpr (XS && !one) {
                __syncthreads();
                const int nv4 = (pend - p0) * NV / 4;
                for (int idx = threadIdx.x; idx < nt * nv4; idx += blockDim.x) {
                    int tt = idx / nv4, v = (idx - tt * nv4) * 4, cc = v / NV, p = (v % NV) / 4;
                    const size_t xrow = a.norm_g && a.norm_rows ? (size_t)a.norm_rows[t0 + tt] : (size_t)(t0 + tt);
                    float4 val = __ldg(reinterpret_cast<const float4 *>(a.x + xrow * a.n_in + (size_t)p0 * NV + v));
                    if (a.norm_g) {
                        const float r = rnorm[tt];
                        const float4 g = __ldg(reinterpret_cast<const float4 *>(a.norm_g + (size_t)p0 * NV + v));
                        val = norm4(val, r, g);
                    }
                    xs4[(tt * pvals + cc * NV + ((p ^ gv_swz<NV>(cc)) * 4)) / 4] = val;
                }
                __syncthreads();
            }
            /* the first chunk >= p0 that lane L owns: ownership c % LS == L
             * does not depend on the panel bounds */
            for (int c0 = p0 + ((L - p0 % LS) + LS) % LS; c0 < pend; c0 += LS * U) {
                /* the chunks and their scale/bias pairs load together: a
                 * pair fetched after its chunk arrived was a second memory
                 * round trip per step */
                if (!pre)
#pragma unroll
                    for (int u = 0; u < U; u++) {
                        int c = c0 + u * LS;
#pragma unroll
                        for (int s = 0; s < NS; s++) {
                            raw[u][s] = c < pend ? (TT == 1 ? __ldcs(rp[s] + c) : __ldg(rp[s] + c))
                                                 : make_uint4(0, 0, 0, 0);
                            if constexpr (Q)
                                sbr[u][s] = c < pend ? __ldg(sbp[s] + c * NV / gsz[s]) : make_float2(0.0f, 0.0f);
                        }
                    }
                pre = false;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    const int c = c0 + u * LS;
                    if (c >= pend)
                        break;
                    float scale[NS], bias[NS];
#pragma unroll
                    for (int s = 0; s < NS; s++) {
                        scale[s] = bias[s] = 0.0f;
                        if constexpr (Q) {
                            scale[s] = sbr[u][s].x;
                            bias[s] = sbr[u][s].y;
                        }
                    }
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        if (tt >= nt)
                            break;
                        float xv[NV];
                        if constexpr (XS) {
                            const int cc = c - p0, sw = gv_swz<NV>(cc);
                            const float *xr = xs + tt * pvals + cc * NV;
#pragma unroll
                            for (int p = 0; p < NV / 4; p++) {
                                float4 v = *reinterpret_cast<const float4 *>(xr + ((p ^ sw) * 4));
                                xv[4 * p] = v.x;
                                xv[4 * p + 1] = v.y;
                                xv[4 * p + 2] = v.z;
                                xv[4 * p + 3] = v.w;
                            }
                        } else {
                            const float4 *xr =
                                reinterpret_cast<const float4 *>(a.x + (size_t)(t0 + tt) * a.n_in + (size_t)c * NV);
#pragma unroll
                            for (int p = 0; p < NV / 4; p++) {
                                float4 v = __ldg(xr + p);
                                xv[4 * p] = v.x;
                                xv[4 * p + 1] = v.y;
                                xv[4 * p + 2] = v.z;
                                xv[4 * p + 3] = v.w;
                            }
                        }
                        float sx = 0.0f;
                        if constexpr (Q) {
#pragma unroll
                            for (int j = 0; j < NV; j++)
                                sx = __fadd_rn(sx, xv[j]);
                        }
#pragma unroll
                        for (int s = 0; s < NS; s++)
                            acc[s][tt] = __fadd_rn(acc[s][tt], chunk_dot_v<KIND>(raw[u][s], xv, sx, scale[s], bias[s]));
                    }
                }
            }
        }
#pragma unroll
        for (int s = 0; s < NS; s++)
#pragma unroll
            for (int tt = 0; tt < TT; tt++)
                acc[s][tt] = warp_sum(acc[s][tt]);
        if constexpr (S > 1) {
            if (lane == 0)
#pragma unroll
                for (int s = 0; s < NS; s++)
#pragma unroll
                    for (int tt = 0; tt < TT; tt++)
                        red[warp][s][tt] = acc[s][tt];
            __syncthreads();
            if (ws == 0)
#pragma unroll
                for (int s = 0; s < NS; s++)
#pragma unroll
                    for (int tt = 0; tt < TT; tt++) {
                        float v = red[grp * S][s][tt];
#pragma unroll
                        for (int w = 1; w < S; w++)
                            v = __fadd_rn(v, red[grp * S + w][s][tt]);
                        acc[s][tt] = v;
                    }
            __syncthreads();
        }
        if (ws == 0 && lane < nt) {
#pragma unroll
            for (int i = 0; i < R; i++) {
                float v = 0.0f, u = 0.0f;
#pragma unroll
                for (int tt = 0; tt < TT; tt++)
                    if (tt == lane) {
                        v = acc[i][tt];
                        if (GLU)
                            u = acc[R + i][tt];
                    }
                if (!valid[i])
                    continue;
                float *y = yp[i] + (size_t)(t0 + lane) * ystride[i];
                if (GLU)
                    *y = (a.glu == 2 ? gelu_f(v) : silu_f(v)) * u;
                else
                    *y = a.accumulate ? *y + v : v;
            }
        }
    }
}

template <int KIND, int TT, int R, int S, bool XS, bool GLU, int UM = 1>
static int gemv_v_launch(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    constexpr int NV = chunk_traits<KIND>::NV;
    int pvals = 0, one = 0;
    size_t smem = 0;
    if constexpr (XS) {
        static bool raised = false;
        if (!raised) {
            for (auto k : {gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 0>, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 1>,
                           gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 2>})
                cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, GV_SMEM + GV_SMEM_G);
            raised = true;
        }
        int tt = a->T < TT ? a->T : TT;
        pvals = GV_SMEM / 4 / tt / NV * NV;
        if (pvals > a->n_in)
            pvals = a->n_in;
        smem = (size_t)tt * pvals * sizeof(float);
        /* one panel: the cp.async path (with room for the norm weights) */
        one = pvals == a->n_in && (!a->norm_g || (size_t)a->n_in * sizeof(float) <= GV_SMEM_G);
        if (one && a->norm_g)
            smem += (size_t)a->n_in * sizeof(float);
    }
    const bool pdl = pdl_gemv_v(KIND);
    if (one && pdl && gemv_v_hoist(KIND))
        one = 2;
    long rpb = (long)(GV_WARPS / S) * R;
    const dim3 grid((unsigned)((rows + rpb - 1) / rpb)), block(GV_WARPS * WARP);
    if (XS && pdl && TT == 1 && !kind_quantized(KIND)) {
        /* a launch of under three blocks a SM that starts while the one
         * before ends would fill the SMs that free first (up to 3 blocks
         * each: the 8B down 31 -> 38 us): shared memory so large that at
         * most ceil(blocks / SMs) fit on one */
        static int sm_smem = 0;
        if (!sm_smem) {
            int dev = 0;
            cudaGetDevice(&dev);
            if (cudaDeviceGetAttribute(&sm_smem, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) || sm_smem <= 0)
                sm_smem = 228 * 1024;
        }
        const long k = ((long)grid.x + sm_count() - 1) / sm_count();
        if (k < 3) {
            const size_t want = (size_t)sm_smem / (size_t)(k + 1) + 1024;
            if (smem < want && want <= GV_SMEM + GV_SMEM_G)
                smem = want;
        }
    }
    if constexpr (!XS) {
        return launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 0>, grid, block, smem, s, *a, pvals);
    } else {
        if (!one)
            return launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 0>, grid, block, smem, s, *a, pvals);
        return one == 2
                   ? launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 2>, grid, block, smem, s, *a, pvals)
                   : launch_pdl(pdl, gemv_v_kernel<KIND, TT, R, S, XS, GLU, UM, 1>, grid, block, smem, s, *a, pvals);
    }
}

/* UM: loads in flight at T = 1 times UM (the order of the sums stays) */
template <int KIND, int R, int S, bool XS, int UM = 1>
static int gemv_v(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    if (a->T == 1) {
        /* 16-bit gate/up: one row pair a warp instead of two (same sums in
         * the same order; the 8B launch is 4.5 waves of short blocks
         * instead of 2.3 of long ones: +0.9% at batch 1) */
        if constexpr (R == 2 && KIND != TCU_Q4 && KIND != TCU_Q4F && KIND != TCU_Q8)
            if (a->glu)
                return gemv_v_launch<KIND, 1, 1, S, XS, true, UM>(a, rows, s);
        return a->glu ? gemv_v_launch<KIND, 1, R, S, XS, true, UM>(a, rows, s)
                      : gemv_v_launch<KIND, 1, R, S, XS, false, UM>(a, rows, s);
    }
    return a->glu ? gemv_v_launch<KIND, GEMV_TT, R, S, XS, true>(a, rows, s)
                  : gemv_v_launch<KIND, GEMV_TT, R, S, XS, false>(a, rows, s);
}

template <int R, int S, bool XS, bool Q4F = false, int UM = 1>
static int gemv_v_kind(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    switch (a->m[0].kind) {
    case TCU_BF16: return gemv_v<TCU_BF16, R, S, XS, UM>(a, rows, s);
    case TCU_Q4: return gemv_v<Q4F ? TCU_Q4F : TCU_Q4, R, S, XS, UM>(a, rows, s);
    case TCU_Q8: return gemv_v<TCU_Q8, R, S, XS, UM>(a, rows, s);
    default: return -1; /* f32 / f16: the legacy kernel */
    }
}

// ---- tensor-core products for small T (bf16 weights; variant 14) ----
//
// mma.sync m16n8k16 (bf16 inputs, f32 accumulation): a warp owns a tile of
// 16 output rows and a contiguous slice of the inputs; its 8 token columns
// per n-tile are tokens 8j .. 8j + 7. Each f32 activation is split exactly
// into three bf16 (hi + mid + lo = x: 8 + 8 + 8 significant bits), and the
// three products accumulate into the same f32 accumulator, so the result is
// that of f32 activations up to the tensor core's accumulation rounding.
// The k order inside a 16-wide tile is permuted (lane t holds inputs
// 8t .. 8t + 7 of each 32-input step: one 16-byte load per row) - the same
// permutation for weights and activations, so the sum is the same one.
// Batch invariance: a column of the mma never depends on another column,
// the k order is fixed per shape, and the split-K partial sums (KS warps per
// tile, chosen from the shape alone) are added in warp order.
#define MMA_U 4 /* 32-input steps in flight per warp */

__device__ __forceinline__ void mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// x = hi + mid + lo exactly, each a bf16 (the upper half of a float).
__device__ __forceinline__ void split3(float x, uint32_t &hi, uint32_t &mid, uint32_t &lo)
{
    hi = __float_as_uint(x) & 0xffff0000u;
    float r = __fsub_rn(x, __uint_as_float(hi));
    mid = __float_as_uint(r) & 0xffff0000u;
    lo = __float_as_uint(__fsub_rn(r, __uint_as_float(mid))) & 0xffff0000u;
}

// Packs the bf16 parts of (x0, x1) as a bf16x2 register (x0 in the low half).
__device__ __forceinline__ void pack3(float x0, float x1, uint32_t p[3])
{
    uint32_t h0, m0, l0, h1, m1, l1;
    split3(x0, h0, m0, l0);
    split3(x1, h1, m1, l1);
    p[0] = (h0 >> 16) | h1;
    p[1] = (m0 >> 16) | m1;
    p[2] = (l0 >> 16) | l1;
}

// One 32-input step of one A tile (rows g, g + 8: wa, wb) against the
// activations' bf16 parts xb[4][3] (pairs 0..3 of inputs 8t .. 8t + 7).
__device__ __forceinline__ void mma_step(float c[4], const uint4 &wa, const uint4 &wb, const uint32_t xb[4][3])
{
#pragma unroll
    for (int p = 0; p < 3; p++)
        mma_bf16(c, wa.x, wb.x, wa.y, wb.y, xb[0][p], xb[1][p]);
#pragma unroll
    for (int p = 0; p < 3; p++)
        mma_bf16(c, wa.z, wb.z, wa.w, wb.w, xb[2][p], xb[3][p]);
}

#define MMA_WARPS 8

// grid: ceil(tiles / (MMA_WARPS / KS)), block MMA_WARPS warps; NT n-tiles
// of 8 tokens (tokens t0 .. t0 + 8 NT - 1 per pass).
template <int NT, bool GLU>
__global__ void __launch_bounds__(MMA_WARPS *WARP) gemv_mma_kernel(const tcu_gemv_args a, int KS)
{
    constexpr int NA = GLU ? 2 : 1; /* A tiles per warp (gate, up) */
    __shared__ float red[MMA_WARPS][NA * NT * 4][WARP];
    __shared__ float rnorm[8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x * (MMA_WARPS / KS) + warp / KS, ks = warp % KS;
    long rows = 0;
    if (GLU)
        rows = a.m[0].n_out;
    else
        for (int k = 0; k < a.n; k++)
            rows += a.m[k].n_out;
    const int slice = a.n_in / KS, kb = ks * slice;
    /* the lane's two rows (g, g + 8) of the tile: matrix and local row */
    const uint4 *rp[NA][2];
    float *yp[2];
    int ystr[2];
    bool valid[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        long gr = (long)tile * 16 + g + 8 * h;
        valid[h] = gr < rows;
        if (!valid[h])
            gr = rows - 1;
        long off = 0;
        const int k = GLU ? 0 : gv_mat_of(a, gr, &off);
        const int r = (int)(gr - off);
        yp[h] = a.m[k].y + r;
        ystr[h] = a.m[k].n_out;
#pragma unroll
        for (int s = 0; s < NA; s++)
            rp[s][h] = reinterpret_cast<const uint4 *>((const uint16_t *)a.m[GLU ? s : k].w + (size_t)r * a.n_in + kb) +
                       t;
    }
    /* weights never depend on an earlier kernel: start pulling them into L2 */
#pragma unroll
    for (int s = 0; s < NA; s++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int u = 0; u < MMA_U; u++)
                if (u * 32 < slice)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(rp[s][h] + u * 4));
    pdl_wait();
    pdl_trigger();
    for (int t0 = 0; t0 < a.T; t0 += 8 * NT) {
        float c[NA][NT][4];
#pragma unroll
        for (int s = 0; s < NA; s++)
#pragma unroll
            for (int j = 0; j < NT; j++)
                c[s][j][0] = c[s][j][1] = c[s][j][2] = c[s][j][3] = 0.0f;
        /* the fused RMSNorm (NT = 1 only): each token's factor per block,
         * reduced as rmsnorm_kernel does (the same 256 threads, double
         * sums), then x * r * g as it is loaded - the values the norm
         * kernel would write */
        const bool nrm = NT == 1 && a.norm_g;
        if (nrm)
            gv_norm_factors(a, t0, a.T - t0 < 8 ? a.T - t0 : 8, rnorm);
        const float *xr[NT];
        bool xon[NT];
        float rn = 0.0f;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int tok = t0 + 8 * j + g;
            xon[j] = tok < a.T;
            const int xrow = !xon[j] ? 0 : nrm && a.norm_rows ? a.norm_rows[tok] : tok;
            xr[j] = a.x + (size_t)xrow * a.n_in + kb + 8 * t;
            if (nrm && xon[j])
                rn = rnorm[g];
        }
        const float *gp = nrm ? a.norm_g + kb + 8 * t : nullptr;
        for (int k0 = 0; k0 < slice; k0 += 32 * MMA_U) {
            uint4 w[MMA_U][NA][2];
#pragma unroll
            for (int u = 0; u < MMA_U; u++)
#pragma unroll
                for (int s = 0; s < NA; s++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        w[u][s][h] = k0 + 32 * u < slice ? __ldcs(rp[s][h] + (k0 + 32 * u) / 8)
                                                         : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < MMA_U; u++) {
                if (k0 + 32 * u >= slice)
                    break;
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    uint32_t xb[4][3];
                    float4 v0 = make_float4(0, 0, 0, 0), v1 = v0;
                    if (xon[j]) {
                        v0 = __ldg(reinterpret_cast<const float4 *>(xr[j] + k0 + 32 * u));
                        v1 = __ldg(reinterpret_cast<const float4 *>(xr[j] + k0 + 32 * u) + 1);
                        if (nrm) {
                            const float4 g0 = __ldg(reinterpret_cast<const float4 *>(gp + k0 + 32 * u)),
                                         g1 = __ldg(reinterpret_cast<const float4 *>(gp + k0 + 32 * u) + 1);
                            v0 = norm4(v0, rn, g0);
                            v1 = norm4(v1, rn, g1);
                        }
                    }
                    pack3(v0.x, v0.y, xb[0]);
                    pack3(v0.z, v0.w, xb[1]);
                    pack3(v1.x, v1.y, xb[2]);
                    pack3(v1.z, v1.w, xb[3]);
                    /* a fresh accumulator per step, added with IEEE rounding:
                     * the tensor core's own accumulation rounding then covers
                     * 32 inputs, not the whole row */
#pragma unroll
                    for (int s = 0; s < NA; s++) {
                        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mma_step(d, w[u][s][0], w[u][s][1], xb);
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            c[s][j][e] = __fadd_rn(c[s][j][e], d[e]);
                    }
                }
            }
        }
        /* split-K: the KS warps of a tile add their sums in warp order */
        if (KS > 1) {
            if (ks > 0)
#pragma unroll
                for (int s = 0; s < NA; s++)
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            red[warp][(s * NT + j) * 4 + e][lane] = c[s][j][e];
            __syncthreads();
            if (ks == 0)
                for (int w2 = 1; w2 < KS; w2++)
#pragma unroll
                    for (int s = 0; s < NA; s++)
#pragma unroll
                        for (int j = 0; j < NT; j++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                c[s][j][e] = __fadd_rn(c[s][j][e], red[warp + w2][(s * NT + j) * 4 + e][lane]);
            __syncthreads();
        }
        if (ks == 0)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int h = e >> 1, tok = t0 + 8 * j + 2 * t + (e & 1);
                    if (!valid[h] || tok >= a.T)
                        continue;
                    float *y = yp[h] + (size_t)tok * ystr[h];
                    const float v = c[0][j][e];
                    if (GLU)
                        *y = (a.glu == 2 ? gelu_f(v) : silu_f(v)) * c[NA - 1][j][e];
                    else
                        *y = a.accumulate ? *y + v : v;
                }
    }
}

// Split-K factor from the shape alone: slices of at most 512 inputs (a
// warp then streams <= 16 KB of bf16 weights: short tails), up to one warp
// per slice of the block.
static int mma_ks(int n_in)
{
    int ks = 1;
    while (ks < MMA_WARPS && n_in / ks > 512 && n_in % (64 * ks) == 0)
        ks *= 2;
    return ks;
}

template <int NT, bool GLU> static int gemv_mma_launch(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    const long tiles = (rows + 15) / 16;
    const int ks = mma_ks(a->n_in), tpb = MMA_WARPS / ks;
    return launch_pdl(pdl_enabled_gemv(TCU_BF16), gemv_mma_kernel<NT, GLU>, dim3((unsigned)((tiles + tpb - 1) / tpb)),
                      dim3(MMA_WARPS * WARP), 0, s, *a, ks);
}

// bf16 only (n_in a multiple of 32); -1 for other kinds.
static int gemv_mma(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    if (a->m[0].kind != TCU_BF16 || a->n_in % 32)
        return -1;
    if (a->T <= 8)
        return a->glu ? gemv_mma_launch<1, true>(a, rows, s) : gemv_mma_launch<1, false>(a, rows, s);
    if (a->T <= 16)
        return a->glu ? gemv_mma_launch<2, true>(a, rows, s) : gemv_mma_launch<2, false>(a, rows, s);
    return a->glu ? gemv_mma_launch<4, true>(a, rows, s) : gemv_mma_launch<4, false>(a, rows, s);
}

// ---- variant 16: tensor cores, activations split once per block ----
//
// The same exact products as variant 14 (bf16 weights x f32 activations
// split into three bf16, f32 accumulation with a fresh accumulator per
// 32-input step), laid out for speed at every T:
// - the three parts of a token are three columns of the mma (token j:
//   columns 3j, 3j + 1, 3j + 2), so one mma pair per 32-input step covers
//   two tokens (variant 14: three pairs for one to eight tokens); NT
//   n-tiles hold TP = 8 NT / 3 tokens, up to 32 in one pass;
// - each block splits its activations once into shared memory, already in
//   fragment order (one 16-byte load per lane and n-tile a step), with the
//   RMSNorm applied as they are staged;
// - a warp owns one 16-row tile (gate/up: warps 0-3 gate, 4-7 the same
//   rows of up), a block 128 weight rows; split-K over the KS blocks of a
//   thread-block cluster (KS from the shape alone): each block takes a
//   slice of the inputs, and after the pass the blocks' sums meet in
//   distributed shared memory, each block reducing 1 / KS of the rows in
//   slice order.
// Per (row, token) the order of sums is fixed by the shape: the 32-input
// steps of a slice in order, each step's parts added (hi + mid) + lo, then
// the slices in order; the norm factor likewise (a thread's elements, the
// warp's butterfly, the warps in order). A column of an mma never depends
// on another column, so a token's result does not depend on the batch.
#define TC_WARPS 8
#define TC_ROWS (TC_WARPS * 16)
#define TC_SMEM_X (96 * 1024) /* activation panel (bytes) at most */
#define TC_TP(NT) ((8 * (NT)) / 3) /* tokens a pass */

// A weight load: 16 bytes, streamed (evict first), the L2 fetching the
// whole 256-byte block around it on a miss (the row's next steps; measured
// 1-5% faster at T = 8-32 than plain streaming loads).
__device__ __forceinline__ uint4 tc_ld(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.cs.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t tc_ld32(const uint32_t *p)
{
    uint32_t v;
    asm volatile("ld.global.cs.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// A thread's part of a token's sum of squares for the fused RMSNorm: the
// four squares of v in order, in double (explicit roundings: the same
// bits wherever it is inlined).
__device__ __forceinline__ double tc_sq4(float4 v)
{
    double t = __dmul_rn((double)v.x, (double)v.x);
    t = __fma_rn((double)v.y, (double)v.y, t);
    t = __fma_rn((double)v.z, (double)v.z, t);
    return __fma_rn((double)v.w, (double)v.w, t);
}

// 8 activations' sum, in order (4-bit: the bias term's group sums).
__device__ __forceinline__ float tc_sum8(float4 v0, float4 v1)
{
    float s = __fadd_rn(__fadd_rn(__fadd_rn(v0.x, v0.y), v0.z), v0.w);
    return __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(s, v1.x), v1.y), v1.z), v1.w);
}

// Steps of more than TC_TP(1) tokens: the activations split once per launch
// (tcu_gemv_args.stage) instead of by every block. grid (JS token slots,
// blocks along the inputs of `nbs` 32-input steps each: whole groups),
// TC_WARPS warps. Block (j, b): token j's norm factor over its whole row
// (the arithmetic of gemv_tc_kernel's own: a thread's elements, the
// warp's butterfly, the warps in order), then its three columns of steps
// b * nbs .. in the panel layout [step][C][4] uint4, and, 4-bit, each
// group's activation sum [group][C] (hi columns; 0 elsewhere) after the
// steps. Slots past the tokens write zeros. Every value is the one
// gemv_tc_kernel stages itself, so both give the same bits.
template <int NT, bool Q>
__global__ void __launch_bounds__(TC_WARPS *WARP) tc_stage_kernel(const tcu_gemv_args a, int nbs)
{
    constexpr int C = 8 * NT, NTH = TC_WARPS * WARP;
    extern __shared__ float st8[]; /* [nbs * 4] 8-value sums */
    __shared__ double nsum[TC_WARPS];
    __shared__ float rn;
    pdl_wait();
    pdl_trigger();
    const int j = blockIdx.x, sa = blockIdx.y * nbs, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int np = a.T < TC_TP(NT) ? a.T : TC_TP(NT), G = Q ? a.m[0].group : 32;
    const bool tok = j < np;
    const size_t xrow = tok && a.norm_g && a.norm_rows ? (size_t)a.norm_rows[j] : (size_t)j;
    const float *xr = a.x + xrow * a.n_in;
    uint4 *xsp = reinterpret_cast<uint4 *>(a.stage);
    float *xsum = reinterpret_cast<float *>(xsp + (size_t)(a.n_in / 32) * C * 4);
    float r = 1.0f;
    if (tok && a.norm_g) {
        double ss = 0.0;
        for (int e = threadIdx.x * 4; e < a.n_in; e += NTH * 4)
            ss = __dadd_rn(ss, tc_sq4(__ldg(reinterpret_cast<const float4 *>(xr + e))));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0)
            nsum[warp] = ss;
        __syncthreads();
        if (threadIdx.x == 0) {
            double s = 0.0;
            for (int k = 0; k < TC_WARPS; k++)
                s += nsum[k];
            rn = (float)(1.0 / sqrt(s / a.n_in + a.norm_eps));
        }
        __syncthreads();
        r = rn;
    }
    for (int i = threadIdx.x; i < nbs * 4; i += NTH) {
        const int st = sa + i / 4, tq = i % 4;
        uint4 hi = make_uint4(0, 0, 0, 0), mid = hi, lo = hi;
        float s8 = 0.0f;
        if (tok) {
            const int e = st * 32 + 8 * tq;
            const float4 *xp = reinterpret_cast<const float4 *>(xr + e);
            float4 v0 = __ldg(xp), v1 = __ldg(xp + 1);
            if (a.norm_g) {
                v0 = norm4(v0, r, __ldg(reinterpret_cast<const float4 *>(a.norm_g + e)));
                v1 = norm4(v1, r, __ldg(reinterpret_cast<const float4 *>(a.norm_g + e) + 1));
            }
            uint32_t p[4][3];
            if (Q) { /* pairs (8t + i, 8t + 4 + i): the codes' order */
                s8 = tc_sum8(v0, v1);
                pack3(v0.x, v1.x, p[0]);
                pack3(v0.y, v1.y, p[1]);
                pack3(v0.z, v1.z, p[2]);
                pack3(v0.w, v1.w, p[3]);
            } else {
                pack3(v0.x, v0.y, p[0]);
                pack3(v0.z, v0.w, p[1]);
                pack3(v1.x, v1.y, p[2]);
                pack3(v1.z, v1.w, p[3]);
            }
            hi = make_uint4(p[0][0], p[1][0], p[2][0], p[3][0]);
            mid = make_uint4(p[0][1], p[1][1], p[2][1], p[3][1]);
            lo = make_uint4(p[0][2], p[1][2], p[2][2], p[3][2]);
        }
        if (Q)
            st8[i] = s8;
        uint4 *d = xsp + ((size_t)st * C + 3 * j) * 4 + tq;
        d[0] = hi;
        if (3 * j + 1 < C)
            d[4] = mid;
        if (3 * j + 2 < C)
            d[8] = lo;
    }
    if (Q) { /* each group's sum: its 8-value sums in order */
        __syncthreads();
        for (int gi = threadIdx.x; gi < nbs * 32 / G; gi += NTH) {
            float sum = 0.0f;
            if (tok)
                for (int k = 0; k < G / 8; k++)
                    sum = __fadd_rn(sum, st8[gi * (G / 8) + k]);
            float *o = xsum + (size_t)(sa * 32 / G + gi) * C + 3 * j;
            o[0] = sum;
            if (3 * j + 1 < C)
                o[1] = 0.0f;
            if (3 * j + 2 < C)
                o[2] = 0.0f;
        }
    }
}

template <int NT, int U, bool Q>
__global__ void __launch_bounds__(TC_WARPS *WARP, NT == 1 && U <= 4 ? 3 : 2)
    gemv_tc_kernel(const tcu_gemv_args a, int KS, int psteps, int staged)
{
    namespace cg = cooperative_groups;
    constexpr int C = 8 * NT, TP = TC_TP(NT), JS = (C + 2) / 3, NTH = TC_WARPS * WARP;
    constexpr bool EARLY = !Q && NT > 1;
    extern __shared__ __align__(16) unsigned char tc_smem[];
    uint4 *xs = reinterpret_cast<uint4 *>(tc_smem); /* [psteps][C][4]: 8 bf16 of one column */
    float *red = reinterpret_cast<float *>(tc_smem); /* after the pass: [TC_ROWS][C] */
    /* 4-bit: each group's activation sum per column (hi parts; 0 elsewhere),
     * from the sums of 8 staged values [8-blocks of the panel][token slots] */
    float *xsum = reinterpret_cast<float *>(tc_smem + (size_t)psteps * C * 64); /* [groups][C] */
    float *xs8 = xsum + (size_t)psteps * C;
    constexpr int SBY = Q ? 16 : 64; /* weight bytes a row and 32-input step */
    const int G = Q ? a.m[0].group : 32;
    __shared__ float rn[TP];
    __shared__ double nsum[TC_WARPS][4];
    cg::cluster_group cl = cg::this_cluster();
    const int ks = (int)cl.block_rank();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bool glu = a.glu != 0;
    long rows = a.m[0].n_out; /* output rows */
    if (!glu)
        for (int k = 1; k < a.n; k++)
            rows += a.m[k].n_out;
    const int orows = glu ? TC_ROWS / 2 : TC_ROWS;
    const long o0 = (long)blockIdx.y * orows;
    const int nsteps = a.n_in / 32 / KS, s0 = ks * nsteps;
    /* the lane's two weight rows (g, g + 8 of the warp's tile) */
    const char *rp[2];
    const float *sbp[2] = {nullptr, nullptr};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        long gr = o0 + (glu ? warp & 3 : warp) * 16 + g + 8 * h;
        if (gr >= rows)
            gr = rows - 1;
        long off = 0;
        const int k = glu ? warp >> 2 : gv_mat_of(a, gr, &off);
        if (Q) {
            rp[h] = (const char *)a.m[k].w + (size_t)(gr - off) * (a.n_in / 2) + (size_t)s0 * 16 + 4 * t;
            sbp[h] = a.m[k].sb + (size_t)(gr - off) * (a.n_in / G) * 2;
        } else {
            rp[h] = (const char *)a.m[k].w + ((size_t)(gr - off) * a.n_in + (size_t)s0 * 32) * 2 + 16 * t;
        }
    }
    const int nb = (nsteps + U - 1) / U, np = a.T < TP ? a.T : TP;
    /* weights never depend on an earlier kernel: the first steps into L2
     * (not registers: the norm and the staging need them) */
#pragma unroll
    for (int u = 0; u < 2 * U; u++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (u < nsteps)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(rp[h] + SBY * u));
    pdl_wait();
    pdl_trigger();
    if (a.norm_g && !staged) /* per token: a thread's elements, the warp's butterfly, the warps in order */
        for (int j0 = 0; j0 < np; j0 += 4) {
            double ss[4];
            const float *xr[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                ss[j] = 0.0;
                xr[j] = a.x + (size_t)(j0 + j < np ? (a.norm_rows ? a.norm_rows[j0 + j] : j0 + j) : 0) * a.n_in;
            }
            for (int e = threadIdx.x * 4; e < a.n_in; e += NTH * 4) {
                float4 v[4];
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j0 + j < np)
                        v[j] = __ldg(reinterpret_cast<const float4 *>(xr[j] + e));
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (j0 + j < np)
                        ss[j] = __dadd_rn(ss[j], tc_sq4(v[j]));
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    ss[j] += __shfl_xor_sync(0xffffffffu, ss[j], o);
                if (lane == 0)
                    nsum[warp][j] = ss[j];
            }
            __syncthreads();
            if (threadIdx.x < 4 && j0 + (int)threadIdx.x < np) {
                double s = 0.0;
                for (int k = 0; k < TC_WARPS; k++)
                    s += nsum[k][threadIdx.x];
                rn[j0 + threadIdx.x] = (float)(1.0 / sqrt(s / a.n_in + a.norm_eps));
            }
            __syncthreads();
        }
    /* bf16: 8 weights a row and step; 4-bit: 8 codes, and the step's
     * group's 16 scale and bias - 16 scale (w = 16 s (1 + q / 16) + b - 16 s) */
    uint4 w[Q ? 1 : U][2];
    uint32_t wq[Q ? U : 1][2];
    float2 sv[Q ? U : 1][2];
    auto load = [&](int j0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = j0 + u;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (Q) {
                    wq[u][h] = j < nsteps ? tc_ld32(reinterpret_cast<const uint32_t *>(rp[h] + SBY * j)) : 0u;
                    const float2 p = j < nsteps ? __ldg(reinterpret_cast<const float2 *>(sbp[h]) + (s0 + j) * 32 / G)
                                                : make_float2(0.0f, 0.0f);
                    sv[u][h] = make_float2(16.0f * p.x, __fsub_rn(p.y, 16.0f * p.x));
                } else {
                    w[u][h] = j < nsteps ? tc_ld(reinterpret_cast<const uint4 *>(rp[h] + SBY * j))
                                         : make_uint4(0, 0, 0, 0);
                }
            }
        }
    };
    load(0);
    float c[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
        c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
    for (int b = 0; b < nb; b++) {
        const int st0 = b * U, pst = st0 % psteps; /* step of the slice, of the panel */
        if (pst == 0 && staged) { /* the panel as tc_stage_kernel split it: a copy */
            __syncthreads();
            const int pn = nsteps - st0 < psteps ? nsteps - st0 : psteps;
            const uint4 *src = reinterpret_cast<const uint4 *>(a.stage) + (size_t)(s0 + st0) * C * 4;
            for (int i = threadIdx.x; i < pn * C * 4; i += NTH)
                cp_async16(xs + i, src + i, 16);
            asm volatile("cp.async.commit_group;" ::: "memory");
            if (Q) {
                const float *gs = reinterpret_cast<const float *>(reinterpret_cast<const uint4 *>(a.stage) +
                                                                  (size_t)(a.n_in / 32) * C * 4) +
                                  (size_t)((s0 + st0) * 32 / G) * C;
                for (int i = threadIdx.x; i < pn * 32 / G * C; i += NTH)
                    xsum[i] = __ldg(gs + i);
            }
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncthreads();
        } else if (pst == 0) { /* stage the panel: steps st0 .. st0 + psteps - 1, SB items a thread at once */
            constexpr int SB = NT == 1 ? 1 : 2;
            __syncthreads();
            const int pn = nsteps - st0 < psteps ? nsteps - st0 : psteps, items = pn * JS * 4;
            for (int i0 = threadIdx.x; i0 < items; i0 += SB * NTH) {
                float4 v[SB][2];
#pragma unroll
                for (int q = 0; q < SB; q++) {
                    const int i = i0 + q * NTH, st = i / (JS * 4), j = (i / 4) % JS, tq = i % 4;
                    if (i < items && j < np) {
                        const size_t xrow = a.norm_g && a.norm_rows ? (size_t)a.norm_rows[j] : (size_t)j;
                        const float4 *xp =
                            reinterpret_cast<const float4 *>(a.x + xrow * a.n_in + (s0 + st0 + st) * 32 + 8 * tq);
                        v[q][0] = __ldg(xp);
                        v[q][1] = __ldg(xp + 1);
                    }
                }
#pragma unroll
                for (int q = 0; q < SB; q++) {
                    const int i = i0 + q * NTH, st = i / (JS * 4), j = (i / 4) % JS, tq = i % 4;
                    if (i >= items)
                        break;
                    uint4 hi = make_uint4(0, 0, 0, 0), mid = hi, lo = hi;
                    if (j < np) {
                        float4 v0 = v[q][0], v1 = v[q][1];
                        if (a.norm_g) {
                            const int e = (s0 + st0 + st) * 32 + 8 * tq;
                            const float r = rn[j];
                            const float4 g0 = __ldg(reinterpret_cast<const float4 *>(a.norm_g + e)),
                                         g1 = __ldg(reinterpret_cast<const float4 *>(a.norm_g + e) + 1);
                            v0 = norm4(v0, r, g0);
                            v1 = norm4(v1, r, g1);
                        }
                        if (Q) /* the 8 values' sum, in order */
                            xs8[(st * 4 + tq) * JS + j] = tc_sum8(v0, v1);
                        uint32_t p[4][3];
                        if (Q) { /* pairs (8t + i, 8t + 4 + i): the codes' order */
                            pack3(v0.x, v1.x, p[0]);
                            pack3(v0.y, v1.y, p[1]);
                            pack3(v0.z, v1.z, p[2]);
                            pack3(v0.w, v1.w, p[3]);
                        } else {
                            pack3(v0.x, v0.y, p[0]);
                            pack3(v0.z, v0.w, p[1]);
                            pack3(v1.x, v1.y, p[2]);
                            pack3(v1.z, v1.w, p[3]);
                        }
                        hi = make_uint4(p[0][0], p[1][0], p[2][0], p[3][0]);
                        mid = make_uint4(p[0][1], p[1][1], p[2][1], p[3][1]);
                        lo = make_uint4(p[0][2], p[1][2], p[2][2], p[3][2]);
                    }
                    uint4 *d = xs + ((size_t)st * C + 3 * j) * 4 + tq;
                    d[0] = hi; /* columns past the tokens: zeros */
                    if (3 * j + 1 < C)
                        d[4] = mid;
                    if (3 * j + 2 < C)
                        d[8] = lo;
                }
            }
            if (Q) { /* each group's activation sum: its 8-value sums in order (hi columns) */
                __syncthreads();
                for (int i = threadIdx.x; i < pn * 32 / G * C; i += NTH) {
                    const int gl = i / C, col = i % C, j = col / 3;
                    float sum = 0.0f;
                    if (col % 3 == 0 && j < np)
                        for (int k = 0; k < G / 8; k++)
                            sum = __fadd_rn(sum, xs8[(gl * (G / 8) + k) * JS + j]);
                    xsum[i] = sum;
                }
            }
            __syncthreads();
        }
        /* bf16 above TC_TP(1) tokens (registers to spare): this pass's
         * weights leave the load registers and the next pass's loads go out
         * before its products (T = 32: 8B gate/up 139 -> 127 us, down 126
         * -> 109; where registers are short - T <= 2 with 8 steps in
         * flight, 4-bit - the copies spill) */
        uint4 wc[Q ? 1 : U][2]; /* unused (optimized out) unless EARLY */
        if constexpr (EARLY) {
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    wc[u][h] = w[u][h];
            if (b + 1 < nb)
                load((b + 1) * U);
        }
        const uint4(&wr)[Q ? 1 : U][2] = EARLY ? wc : w;
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (st0 + u >= nsteps)
                break;
            const uint4 *xp = xs + ((size_t)(pst + u) * C + g) * 4 + t;
            if constexpr (Q) {
                /* codes as bf16 1 + q / 16 (exact): pairs (i, i + 4) of the 8 */
                uint32_t A[2][4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint32_t q = wq[u][h], M = 0x00780078u, O = 0x3F803F80u;
                    A[h][0] = ((q << 3) & M) | O;
                    A[h][1] = ((q >> 1) & M) | O;
                    A[h][2] = ((q >> 5) & M) | O;
                    A[h][3] = ((q >> 9) & M) | O;
                }
                const bool gend = (s0 + st0 + u + 1) * 32 % G == 0;
                const float *xg = xsum + (size_t)((pst + u) * 32 / G) * C + 2 * t;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint4 xv = xp[32 * n];
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_bf16(d, A[0][0], A[1][0], A[0][1], A[1][1], xv.x, xv.y);
                    mma_bf16(d, A[0][2], A[1][2], A[0][3], A[1][3], xv.z, xv.w);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        c[n][e] = fmaf(sv[u][e >> 1].x, d[e], c[n][e]);
                    if (gend) /* the group's bias term, once (hi columns) */
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            c[n][e] = fmaf(sv[u][e >> 1].y, xg[8 * n + (e & 1)], c[n][e]);
                }
            } else {
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint4 xv = xp[32 * n];
                    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    mma_bf16(d, wr[u][0].x, wr[u][1].x, wr[u][0].y, wr[u][1].y, xv.x, xv.y);
                    mma_bf16(d, wr[u][0].z, wr[u][1].z, wr[u][0].w, wr[u][1].w, xv.z, xv.w);
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        c[n][e] = __fadd_rn(c[n][e], d[e]);
                }
            }
        }
        if (!EARLY && b + 1 < nb)
            load((b + 1) * U);
    }
    /* the block's sums by row and column, then the cluster's reduction */
    __syncthreads();
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            red[(size_t)(warp * 16 + g + 8 * (e >> 1)) * C + 8 * n + 2 * t + (e & 1)] = c[n][e];
    cl.sync();
    const int per = orows / KS;
    for (int i = threadIdx.x; i < per * np; i += NTH) {
        const int r = ks * per + i / np, j = i % np;
        const long gr = o0 + r;
        if (gr >= rows)
            continue;
        float v[2];
#pragma unroll
        for (int s = 0; s < 2; s++) {
            if (s && !glu)
                break;
            for (int k = 0; k < KS; k++) {
                const float *q = cl.map_shared_rank(red, k) + (size_t)(r + s * orows) * C + 3 * j;
                const float part = __fadd_rn(__fadd_rn(q[0], q[1]), q[2]);
                v[s] = k ? __fadd_rn(v[s], part) : part;
            }
        }
        if (glu) {
            a.m[0].y[(size_t)j * a.m[0].n_out + gr] = (a.glu == 2 ? gelu_f(v[0]) : silu_f(v[0])) * v[1];
        } else {
            long off;
            const int k = gv_mat_of(a, gr, &off);
            float *y = a.m[k].y + (size_t)j * a.m[k].n_out + (gr - off);
            *y = a.accumulate ? *y + v[0] : v[0];
        }
    }
    cl.sync(); /* the others have read this block's sums */
}

// Cluster size (split-K) from the shape alone: slices of >= 256 inputs,
// up to 8 blocks, until about 8 warps per SM (16 measured slower on the
// 8B q/k/v: 26 against 20 us at T = 1 - more blocks, each with its staging
// and its share of the reduction), and only while every cluster of the
// launch can be resident at once in the largest configuration (32
// tokens: two blocks a SM) - else a second wave of a few clusters doubles
// the time (8B o at 8 tokens 27 -> 20 us with 4 blocks a cluster instead
// of 8: the 32 clusters of 8 did not fit).
template <bool Q> static int tc_max_clusters(int ks)
{
    static int n_max[9];
    if (!n_max[ks]) {
        const size_t smem = TC_SMEM_X + (Q ? (size_t)(TC_SMEM_X / (96 * 64)) * (96 + 4 * 32) * sizeof(float) : 0);
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at;
        at.id = cudaLaunchAttributeClusterDimension;
        at.val.clusterDim.x = (unsigned)ks;
        at.val.clusterDim.y = at.val.clusterDim.z = 1;
        cfg.gridDim = dim3((unsigned)ks, 1024);
        cfg.blockDim = dim3(TC_WARPS * WARP);
        cfg.dynamicSmemBytes = smem;
        cfg.attrs = &at;
        cfg.numAttrs = 1;
        int n = 0;
        if (cudaFuncSetAttribute(gemv_tc_kernel<12, 2, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) ||
            cudaOccupancyMaxActiveClusters(&n, gemv_tc_kernel<12, 2, Q>, &cfg) || n <= 0) {
            (void)cudaGetLastError();
            n = 1 << 30; /* unknown: no limit */
        }
        n_max[ks] = n;
    }
    return n_max[ks];
}

template <bool Q> static int tc_ks(int n_in, long blocks, int group)
{
    int ks = 1;
    while (ks < 8 && blocks * TC_WARPS * ks < 8L * sm_count() && n_in % (64 * ks) == 0 && n_in / (2 * ks) >= 256 &&
           n_in / (2 * ks) % group == 0 && blocks <= tc_max_clusters<Q>(2 * ks))
        ks *= 2;
    return ks;
}

// Bytes of tcu_gemv_args.stage that tc_stage_kernel writes for C columns.
static size_t tc_stage_bytes(const tcu_gemv_args *a, int C, bool q)
{
    return (size_t)(a->n_in / 32) * C * 64 + (q ? (size_t)(a->n_in / a->m[0].group) * C * sizeof(float) : 0);
}

template <int NT, int U, bool Q> static int gemv_tc_launch(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    constexpr int C = 8 * NT;
    /* more than TC_TP(1) tokens and room in the stage: split once - with a
     * fused norm (each block would read every token's whole row for its
     * factor) or above 8 tokens; without a norm at 3-8 tokens each block's
     * own split of its slice costs less than the extra launch (1B 4-bit o
     * and down) */
    const int staged = NT > 1 && a->stage && a->stage_bytes >= tc_stage_bytes(a, C, Q) && (a->norm_g || NT > 3);
    if (staged) {
        const int G = Q ? a->m[0].group : 32, nst = a->n_in / 32, js = (C + 2) / 3;
        int nb = 1; /* blocks along the inputs: about two a SM, whole groups each */
        while (nb < 16 && (long)js * nb < 2L * sm_count() && nst % (2 * nb) == 0 && nst / (2 * nb) * 32 % G == 0)
            nb *= 2;
        const int rc = launch(tc_stage_kernel<NT, Q>, dim3((unsigned)js, (unsigned)nb), dim3(TC_WARPS * WARP),
                              (size_t)(nst / nb) * 4 * sizeof(float), s, *a, nst / nb);
        if (rc)
            return rc;
    }
    const int G = Q ? a->m[0].group : 32, gm = U > G / 32 ? U : G / 32; /* panels: whole groups, whole batches */
    const long blocks = (rows + (a->glu ? TC_ROWS / 2 : TC_ROWS) - 1) / (a->glu ? TC_ROWS / 2 : TC_ROWS);
    const int ks = tc_ks<Q>(a->n_in, blocks, G), nsteps = a->n_in / 32 / ks;
    int psteps = TC_SMEM_X / (C * 64);
    psteps = nsteps <= psteps ? nsteps : psteps / gm * gm;
    size_t smem = (size_t)psteps * C * 64 + (Q ? (size_t)psteps * (C + 4 * ((C + 2) / 3)) * sizeof(float) : 0);
    if (smem < (size_t)TC_ROWS * C * sizeof(float))
        smem = (size_t)TC_ROWS * C * sizeof(float);
    static size_t smem_set = 0;
    if (smem > smem_set) {
        int rc = (int)cudaFuncSetAttribute(gemv_tc_kernel<NT, U, Q>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)smem);
        if (rc)
            return rc;
        smem_set = smem;
    }
    return launch_cl(pdl_enabled_gemv(Q ? TCU_Q4 : TCU_BF16), (unsigned)ks, gemv_tc_kernel<NT, U, Q>,
                     dim3((unsigned)ks, (unsigned)blocks), dim3(TC_WARPS * WARP), smem, s, *a, ks, psteps, staged);
}

// bf16, or 4-bit with groups of a multiple of 32 inputs (the same for
// every matrix); -1 for other kinds. Above 32 tokens: launches of 32.
static int gemv_tc(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    const bool q = a->m[0].kind == TCU_Q4;
    if ((a->m[0].kind != TCU_BF16 && !q) || a->n_in % 32 || (q && (a->m[0].group % 32 || a->n_in % a->m[0].group)))
        return -1;
    for (int k = 1; q && k < a->n; k++)
        if (a->m[k].group != a->m[0].group)
            return -1;
    if (a->T > TC_TP(12)) { /* launches of 32 tokens (a token's bits do not change) */
        for (int t0 = 0; t0 < a->T; t0 += TC_TP(12)) {
            tcu_gemv_args b = *a;
            b.T = a->T - t0 < TC_TP(12) ? a->T - t0 : TC_TP(12);
            if (a->norm_g && a->norm_rows)
                b.norm_rows = a->norm_rows + t0;
            else
                b.x = a->x + (size_t)t0 * a->n_in;
            for (int k = 0; k < a->n; k++)
                b.m[k].y = a->m[k].y + (size_t)t0 * a->m[k].n_out;
            const int rc = gemv_tc(&b, rows, s);
            if (rc)
                return rc;
        }
        return 0;
    }
    /* U (loads in flight) never changes the order of sums: by shape and T.
     * 8 steps on the launches of many blocks (lm_head: 3 blocks a SM do
     * not hide the latency), else 4 (3 blocks a SM) */
    if (q) { /* a step is 256 bytes a warp: more of them in flight */
        if (a->T <= TC_TP(1))
            return gemv_tc_launch<1, 8, true>(a, rows, s);
        if (a->T <= TC_TP(3))
            return gemv_tc_launch<3, 8, true>(a, rows, s);
        if (a->T <= TC_TP(6))
            return gemv_tc_launch<6, 4, true>(a, rows, s);
        return gemv_tc_launch<12, 2, true>(a, rows, s);
    }
    if (a->T <= TC_TP(1))
        return rows >= 200L * sm_count() ? gemv_tc_launch<1, 8, false>(a, rows, s)
                                         : gemv_tc_launch<1, 4, false>(a, rows, s);
    if (a->T <= TC_TP(3))
        return gemv_tc_launch<3, 4, false>(a, rows, s);
    if (a->T <= TC_TP(6))
        return gemv_tc_launch<6, 2, false>(a, rows, s);
    return gemv_tc_launch<12, 2, false>(a, rows, s);
}

// The variants: {R, S, XS}. 0 is the legacy kernel above.
static const struct {
    const char *name;
} gv_names[TCU_GEMV_N_VARIANTS] = {
    {"legacy: 1 row/warp, x via L1, I2F"},
    {"R1 S1 x-global, magic unpack"},
    {"R2 S1 x-global"},
    {"R4 S1 x-global"},
    {"R2 S1 x-smem"},
    {"R4 S1 x-smem"},
    {"R1 S4 x-smem (split-K)"},
    {"R2 S2 x-smem"},
    {"R4 S1 x-smem, 4-bit as 1+q/16 (else = 5)"},
    {"R4 S1 x-global, 4-bit as 1+q/16 (else = 3)"},
    {"by shape: 4 (rows >= 96 * SMs), 7 (>= 48 * SMs), else 6"},
    {"R2 S1 x-smem, 4-bit as 1+q/16 (else = 4)"},
    {"= 4 with twice the loads in flight at T = 1"},
    {"= 11 with twice the loads in flight at T = 1"},
    {"bf16: tensor cores (mma.sync, x split in 3 bf16), split-K by shape; else = 4"},
    {"by shape: rows a warp 2, 3, 4 or 6 (gemv_by_shape; bf16 = 4)"},
    {"bf16 / 4-bit: tensor cores, 3 bf16 parts as mma columns, split-K over a cluster; else = 15"},
    {"one sequence in the step: bf16 4, else 15; two or more (wide): 16"},
};

/* per weight kind: [0] bf16 (and the rest), [1] 4-bit, [2] 8-bit; -1 = not read yet */
static int gv_variant[3] = {-1, -1, -1};

static int gv_slot(int kind) { return kind == TCU_Q4 ? 1 : kind == TCU_Q8 ? 2 : 0; }

/* "k" (every kind) or "kb,k4,k8" (bf16, 4-bit, 8-bit); out-of-range or
 * missing entries keep what is there. */
static void gv_parse(const char *e, int v[3])
{
    char *end;
    for (int i = 0; i < 3 && e && *e; i++) {
        long k = strtol(e, &end, 10);
        if (end == e)
            break;
        if (k >= 0 && k < TCU_GEMV_N_VARIANTS)
            for (int j = i; j < 3; j++)
                v[j] = (int)k; /* a single number applies to all */
        e = *end == ',' ? end + 1 : NULL;
    }
}

extern "C" int tcu_gemv_variant(int kind)
{
    if (gv_variant[0] < 0) {
        int v[3] = {0, 0, 0};
        gv_parse(TCU_GEMV_DEFAULT, v);
        gv_parse(getenv("TERN_CUDA_GEMV"), v);
        for (int i = 0; i < 3; i++)
            gv_variant[i] = v[i];
    }
    return gv_variant[gv_slot(kind)];
}

extern "C" int tcu_gemv_set_variant(int kind, int v)
{
    if (v < 0 || v >= TCU_GEMV_N_VARIANTS)
        return -1;
    tcu_gemv_variant(kind); /* reads the defaults first */
    if (kind < 0)
        gv_variant[0] = gv_variant[1] = gv_variant[2] = v;
    else
        gv_variant[gv_slot(kind)] = v;
    return 0;
}

extern "C" void tcu_gemv_variant_reset(void) { gv_variant[0] = -1; }

extern "C" const char *tcu_gemv_variant_name(int v)
{
    return v >= 0 && v < TCU_GEMV_N_VARIANTS ? gv_names[v].name : "?";
}

/* the variants that stage activations in shared memory (and fuse a norm) */
static bool gv_xs(int v, int kind, int T)
{
    if (v == 14) /* bf16 fuses the norm up to 8 tokens (the rest = 4) */
        return kind == TCU_Q4 || kind == TCU_Q8 || (kind == TCU_BF16 && T <= 8);
    return (kind == TCU_BF16 || kind == TCU_Q4 || kind == TCU_Q8) && ((v >= 4 && v <= 8) || v >= 10);
}

static int gemv_dispatch(const tcu_gemv_args *a, tcu_stream stream);

extern "C" int tcu_gemv(const tcu_gemv_args *a, tcu_stream stream)
{
    if (a->norm_g && a->T > 0 && !gv_xs(tcu_gemv_variant(a->m[0].kind), a->m[0].kind, a->T)) {
        int rc = tcu_rmsnorm(a->x, a->norm_rows, a->norm_g, a->norm_out, a->T, a->n_in, a->norm_eps, 0, stream);
        if (rc)
            return rc;
        tcu_gemv_args b = *a;
        b.x = a->norm_out;
        b.norm_g = NULL;
        b.norm_rows = NULL;
        return gemv_dispatch(&b, stream);
    }
    return gemv_dispatch(a, stream);
}

/* multiprocessors of the current device (132 if the query fails) */
static int sm_count(void)
{
    static int n_sm = 0;
    if (!n_sm) {
        int dev = 0;
        cudaGetDevice(&dev);
        if (cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) || n_sm <= 0)
            n_sm = 132;
    }
    return n_sm;
}

// Variant 15, rows a warp by shape. A row's order of sums does not depend
// on R, so every choice gives the same bits and R may even follow T.
// Larger blocks stage the activations - and a fused norm - once for more
// rows and share each chunk's activation sum, but need rows enough to
// fill the SMs. Measured per launch on the H200 (8B / 1B shapes, 4-bit
// g64, T = 1): o and down (no norm) 2; gate/up 4; q/k/v 3 (8B 11.2 us
// against 12.7 with 4 and 14.5 with 2); lm_head 6 (187 us against 206 with
// 4). Above T = 1 (8-token tiles) and for 8-bit: 4 on the launches with
// >= 40 rows per SM, else 2. bf16: 2.
static int gemv_by_shape(const tcu_gemv_args *a, long rows, cudaStream_t s)
{
    const int kind = a->m[0].kind;
    const long n_sm = sm_count();
    if (kind == TCU_Q4 && a->norm_g && !a->glu && a->T == 1) {
        if (rows >= 200 * n_sm)
            return gemv_v_launch<TCU_Q4F, 1, 6, 1, true, false>(a, rows, s);
        if (rows >= 16 * n_sm)
            return gemv_v_launch<TCU_Q4F, 1, 3, 1, true, false>(a, rows, s);
    }
    if (kind == TCU_BF16 || rows < 40 * n_sm)
        return gemv_v_kind<2, 1, true, true>(a, rows, s);
    return gemv_v_kind<4, 1, true, true>(a, rows, s);
}

static int gemv_dispatch(const tcu_gemv_args *a, tcu_stream stream)
{
    PROF(TCU_PROF_GEMV, stream);
    long rows = gemv_rows(a);
    if (rows == 0 || a->T == 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    int rc = -1;
    switch (tcu_gemv_variant(a->m[0].kind)) {
    case 1: rc = gemv_v_kind<1, 1, false>(a, rows, s); break;
    case 2: rc = gemv_v_kind<2, 1, false>(a, rows, s); break;
    case 3: rc = gemv_v_kind<4, 1, false>(a, rows, s); break;
    case 4: rc = gemv_v_kind<2, 1, true>(a, rows, s); break;
    case 5: rc = gemv_v_kind<4, 1, true>(a, rows, s); break;
    case 6: rc = gemv_v_kind<1, 4, true>(a, rows, s); break;
    case 7: rc = gemv_v_kind<2, 2, true>(a, rows, s); break;
    case 8: rc = gemv_v_kind<4, 1, true, true>(a, rows, s); break;
    case 9: rc = gemv_v_kind<4, 1, false, true>(a, rows, s); break;
    case 11: rc = gemv_v_kind<2, 1, true, true>(a, rows, s); break;
    case 12: rc = gemv_v_kind<2, 1, true, false, 2>(a, rows, s); break;
    case 13: rc = gemv_v_kind<2, 1, true, true, 2>(a, rows, s); break;
    case 14:
        rc = a->m[0].kind == TCU_BF16 ? gemv_mma(a, rows, s) : gemv_v_kind<2, 1, true>(a, rows, s);
        break;
    case 15:
        rc = gemv_by_shape(a, rows, s);
        break;
    case 16:
        if ((rc = gemv_tc(a, rows, s)) < 0)
            rc = gemv_by_shape(a, rows, s);
        break;
    case 17: /* one sequence: bf16 4, quantized 15; two or more: 16 */
        if (!a->wide || (rc = gemv_tc(a, rows, s)) < 0)
            rc = a->m[0].kind == TCU_BF16 ? gemv_v_kind<2, 1, true>(a, rows, s) : gemv_by_shape(a, rows, s);
        break;
    case 10: { /* by shape (never by T): enough warps for two waves */
        const long target = 2L * sm_count() * 24;
        if (rows / 2 >= target)
            rc = gemv_v_kind<2, 1, true>(a, rows, s);
        else if (rows >= target)
            rc = gemv_v_kind<2, 2, true>(a, rows, s);
        else
            rc = gemv_v_kind<1, 4, true>(a, rows, s);
        break;
    }
    default: break;
    }
    return rc >= 0 ? rc : gemv_legacy(a, stream);
}

// ---- weight/activation conversions for the cuBLAS path ----

__device__ __forceinline__ float weight_at(const tcu_mat &m, int n_in, long r, long i)
{
    switch (m.kind) {
    case TCU_F32: return ((const float *)m.w)[r * n_in + i];
    case TCU_BF16: return bf16f(((const uint16_t *)m.w)[r * n_in + i]);
    case TCU_F16: return f16f(((const uint16_t *)m.w)[r * n_in + i]);
    default: {
        const uint8_t *q = (const uint8_t *)m.w;
        int v = m.kind == TCU_Q8 ? q[r * n_in + i] : (q[(r * n_in + i) >> 1] >> ((i & 1) * 4)) & 15;
        long g = r * (n_in / m.group) + i / m.group;
        return m.sb[2 * g] * (float)v + m.sb[2 * g + 1];
    }
    }
}

__global__ void dequant_kernel(const tcu_mat m, int n_in, uint16_t *out, long n)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x) {
        long r = e / n_in, i = e % n_in;
        if (m.kind == TCU_F16)
            out[e] = ((const uint16_t *)m.w)[e];
        else
            out[e] = __bfloat16_as_ushort(__float2bfloat16_rn(weight_at(m, n_in, r, i)));
    }
}

// Quantized weights, 8 consecutive values per step (one 4- or 8-byte load,
// one 16-byte store); the same value per element as weight_at.
__global__ void dequant8_kernel(const tcu_mat m, int n_in, uint16_t *out, long n8)
{
    pdl_wait();
    pdl_trigger();
    for (long k = (long)blockIdx.x * blockDim.x + threadIdx.x; k < n8; k += (long)gridDim.x * blockDim.x) {
        const long e = 8 * k, r = e / n_in, i = e % n_in, g = r * (n_in / m.group) + i / m.group;
        const float sc = m.sb[2 * g], bi = m.sb[2 * g + 1];
        const uint8_t *q = (const uint8_t *)m.w;
        uint32_t v[8];
        if (m.kind == TCU_Q8) {
            const uint2 w = *reinterpret_cast<const uint2 *>(q + e);
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = ((j < 4 ? w.x : w.y) >> (8 * (j & 3))) & 255u;
        } else {
            const uint32_t w = *reinterpret_cast<const uint32_t *>(q + e / 2);
#pragma unroll
            for (int j = 0; j < 8; j++)
                v[j] = (w >> (4 * j)) & 15u;
        }
        uint32_t o[4];
#pragma unroll
        for (int p = 0; p < 4; p++)
            o[p] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(sc * (float)v[2 * p] + bi)) |
                   (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(sc * (float)v[2 * p + 1] + bi)) << 16;
        *reinterpret_cast<uint4 *>(out + e) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}

extern "C" int tcu_dequant_bf16(const tcu_mat *m, int n_in, uint16_t *out, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long n = (long)m->n_out * n_in;
    if ((m->kind == TCU_Q4 || m->kind == TCU_Q8) && n_in % 8 == 0 && m->group % 8 == 0)
        return launch(dequant8_kernel, dim3(4096), dim3(256), 0, (cudaStream_t)stream, *m, n_in, out, n / 8);
    return launch(dequant_kernel, dim3(4096), dim3(256), 0, (cudaStream_t)stream, *m, n_in, out, n);
}

__global__ void to_half_kernel(const float *x, uint16_t *out, long n, int to_f16)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x)
        out[e] = to_f16 ? __half_as_ushort(__float2half_rn(x[e])) : __bfloat16_as_ushort(__float2bfloat16_rn(x[e]));
}

extern "C" int tcu_f32_to_half(const float *x, uint16_t *out, long n, int to_f16, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long blocks = (n + 255) / 256;
    return launch(to_half_kernel, dim3((unsigned)(blocks < 4096 ? blocks : 4096)), dim3(256), 0, (cudaStream_t)stream, x,
                  out, n, to_f16);
}

__global__ void embed_kernel(const tcu_mat w, int n_in, const int32_t *tokens, float scale, float *x)
{
    pdl_wait();
    pdl_trigger();
    int i = blockIdx.x;
    long r = tokens[i];
    for (int e = blockIdx.y * blockDim.x + threadIdx.x; e < n_in; e += gridDim.y * blockDim.x) {
        float v = weight_at(w, n_in, r, e);
        x[(size_t)i * n_in + e] = scale > 0 ? v * scale : v;
    }
}

extern "C" int tcu_embed(const tcu_mat *w, int n_in, const int32_t *tokens, int T, float scale, float *x,
                         tcu_stream stream)
{
    PROF(TCU_PROF_EMBED, stream);
    /* a block a token's 256-value slice (one block a token took ~9 us at batch 1) */
    const unsigned nb = (unsigned)((n_in + 255) / 256);
    return launch(embed_kernel, dim3(T, nb < 64 ? nb : 64), dim3(256), 0, (cudaStream_t)stream, *w, n_in, tokens, scale,
                  x);
}

// ---- normalization and elementwise ----

// The threads that work as one block: a whole block (the kernels) or one
// 128-thread group of the step kernel (named barrier 1 + id).
struct blk_grp {
    __device__ int tid() const { return threadIdx.x; }
    __device__ int size() const { return blockDim.x; }
    __device__ void sync() const { __syncthreads(); }
};
struct sub_grp {
    int id;
    __device__ int tid() const { return threadIdx.x - id * 128; }
    __device__ int size() const { return 128; }
    __device__ void sync() const { asm volatile("bar.sync %0, 128;" ::"r"(id + 1) : "memory"); }
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

__device__ double block_sum_d(double v)
{
    __shared__ double sh[32];
    return grp_sum_d(blk_grp{}, v, sh);
}

__global__ void rmsnorm_kernel(const float *x, const int32_t *rows, const float *g, float *out, int n, float eps,
                               int add)
{
    pdl_wait();
    pdl_trigger();
    int j = blockIdx.x;
    const float *xr = x + (size_t)(rows ? rows[j] : j) * n;
    double ss = 0.0;
    for (int e = threadIdx.x; e < n; e += blockDim.x)
        ss += (double)xr[e] * xr[e];
    ss = block_sum_d(ss);
    float r = (float)(1.0 / sqrt(ss / n + eps));
    float *o = out + (size_t)j * n;
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        float v = (xr[e] * r) * g[e];
        o[e] = add ? o[e] + v : v;
    }
}

extern "C" int tcu_rmsnorm(const float *x, const int32_t *rows, const float *g, float *out, int n_rows, int n,
                           float eps, int add, tcu_stream stream)
{
    PROF(TCU_PROF_NORM, stream);
    if (n_rows <= 0)
        return 0;
    return launch(rmsnorm_kernel, dim3(n_rows), dim3(256), 0, (cudaStream_t)stream, x, rows, g, out, n, eps, add);
}

__global__ void glu_kernel(float *gate, const float *up, long n, int gelu)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x)
        gate[e] = (gelu ? gelu_f(gate[e]) : silu_f(gate[e])) * up[e];
}

extern "C" int tcu_glu(float *gate, const float *up, long n, int gelu, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long blocks = (n + 255) / 256;
    return launch(glu_kernel, dim3((unsigned)(blocks < 8192 ? blocks : 8192)), dim3(256), 0, (cudaStream_t)stream, gate,
                  up, n, gelu);
}

__global__ void softcap_kernel(float *x, long n, float c)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x)
        x[e] = c * tanhf(x[e] / c);
}

extern "C" int tcu_softcap(float *x, long n, float c, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long blocks = (n + 255) / 256;
    return launch(softcap_kernel, dim3((unsigned)(blocks < 8192 ? blocks : 8192)), dim3(256), 0, (cudaStream_t)stream, x,
                  n, c);
}

// ---- q/k/v post-processing and the KV write ----

__device__ __forceinline__ size_t kv_off(const tcu_kv &kv, int layer, const int32_t *blk, int pos)
{
    size_t b = (size_t)blk[pos / kv.block_size];
    return (((size_t)layer * kv.n_blocks + b) * kv.block_size + (size_t)(pos % kv.block_size)) * kv.kv_dim;
}

#define QKV_THREADS 128

// Token i's head h (q heads, then k heads) of the q/k/v post-processing by a
// group of QKV_THREADS threads: dst = src + bias, normed, rotated at p (dst
// may be src; src read through L2: the step kernel writes it in the same
// launch). The same arithmetic in the same order wherever it runs.
template <class G>
__device__ __forceinline__ void qkv_head(const G &g, const tcu_qkv_args &a, int h, const float *src, float *dst, int p,
                                         double *sh, bool pre = false, float pc = 0.0f, float ps = 0.0f)
{
    const int hd = a.hd, half = hd / 2;
    const bool is_q = h < a.n_head;
    const int kh = is_q ? h : h - a.n_head;
    const float *bias = is_q ? a.bq : a.bk;
    const float *nrm = is_q ? a.qn : a.kn;
    for (int e = g.tid(); e < hd; e += g.size())
        dst[e] = bias ? __ldcg(src + e) + bias[(size_t)kh * hd + e] : __ldcg(src + e);
    g.sync();
    if (nrm) {
        double ss = 0.0;
        for (int e = g.tid(); e < hd; e += g.size())
            ss += (double)dst[e] * dst[e];
        ss = grp_sum_d(g, ss, sh);
        float r = (float)(1.0 / sqrt(ss / hd + a.eps));
        g.sync();
        for (int e = g.tid(); e < hd; e += g.size())
            dst[e] = (dst[e] * r) * nrm[e];
        g.sync();
    }
    for (int e = g.tid(); e < half; e += g.size()) {
        float c = pc, s = ps; /* pre: this thread's (e = tid) cosine and sine, computed by the caller */
        if (!pre) {
            const float ang = (float)p * a.inv_freq[e];
            c = cosf(ang);
            s = sinf(ang);
        }
        float x0 = dst[e], x1 = dst[e + half];
        dst[e] = x0 * c - x1 * s;
        dst[e + half] = x1 * c + x0 * s;
    }
    g.sync();
}

// Token i's V row of kv head kh with its bias.
__device__ __forceinline__ float qkv_v(const tcu_qkv_args &a, int i, int kh, int e)
{
    const size_t o = (size_t)kh * a.hd + e;
    return __ldcg(a.v + (size_t)i * a.n_kv_head * a.hd + o) + (a.bv ? a.bv[o] : 0.0f);
}

// grid (T, n_head + n_kv_head), block QKV_THREADS: one head of one token.
__global__ void __launch_bounds__(QKV_THREADS) qkv_post_kernel(const tcu_qkv_args a)
{
    pdl_wait();
    pdl_trigger();
    int i = blockIdx.x, h = blockIdx.y, hd = a.hd;
    int is_q = h < a.n_head, kh = is_q ? h : h - a.n_head;
    int qd = a.n_head * hd, kvd = a.n_kv_head * hd;
    float *vec = is_q ? a.q + (size_t)i * qd + (size_t)kh * hd : a.k + (size_t)i * kvd + (size_t)kh * hd;
    /* the position and the K/V cache slot first: their loads (block table
     * included) overlap the work below instead of following it */
    const int p = a.pos[i];
    size_t o = 0;
    if (!is_q)
        o = kv_off(a.kv, a.layer, a.blk + a.bt_off[i], p) + (size_t)kh * hd;
    __shared__ double sh[32];
    qkv_head(blk_grp{}, a, h, vec, vec, p, sh);
    if (is_q)
        return;
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        a.kv.k[o + e] = vec[e];
        a.kv.v[o + e] = qkv_v(a, i, kh, e);
    }
}

extern "C" int tcu_qkv_post(const tcu_qkv_args *a, tcu_stream stream)
{
    PROF(TCU_PROF_QKV, stream);
    dim3 grid(a->T, a->n_head + a->n_kv_head);
    return launch(qkv_post_kernel, grid, dim3(QKV_THREADS), 0, (cudaStream_t)stream, *a);
}

// ---- paged attention ----

#define ATT_WARPS 4
#define ATT_U 4 /* positions in flight per warp */

// Arrival counters of the fused merge, one slot of ATT_CNT ints per
// (device, stream) so that streams never share one; zero at load and
// reset by the merging block.
#define ATT_CNT 8192
#define ATT_SLOTS 8
__device__ int att_count[ATT_SLOTS][ATT_CNT];

__device__ __forceinline__ void attn_merge_one(const tcu_attn_args &a, int h, int i, int e);

// Positions token i attends to (its window), and its number of splits
// (tcu_attn_args.split_len).
__device__ __forceinline__ int attn_len(const tcu_attn_args &a, int p)
{
    return a.window > 0 && p + 1 > a.window ? a.window : p + 1;
}
__device__ __forceinline__ int attn_splits(const tcu_attn_args &a, int len)
{
    return a.split_len > 0 && len / a.split_len + 1 < a.n_split ? len / a.split_len + 1 : a.n_split;
}

static_assert(ATT_WARPS * WARP == QKV_THREADS, "the fused q/k/v post-processing sums as qkv_post_kernel does");

// Shared memory of one (token, head, split) of the attention.
template <bool POST> struct attn_smem {
    float pq[POST ? 256 : 1], pk[POST ? 256 : 1], pv[POST ? 256 : 1];
    float sm[ATT_WARPS], sl[ATT_WARPS], sacc[ATT_WARPS][256];
    double sh[32];
    int last;
};

// Split sp of token i's head h, by a group of ATT_WARPS warps (the kernels
// below: a block of grid (n_head, T, n_split)). D = hd / 32 dims per lane
// (lane owns dims lane*D .. lane*D + D - 1). POST: the q/k/v post-
// processing (`post`) fused: each block rotates its head's q into shared
// memory; the block whose split holds the token's own position computes
// that position's K and V there (no other block reads them: every token of
// the step is of another sequence) and, for the first q head of its kv
// head, writes them to the cache - the values qkv_post_kernel writes.
template <int D, bool POST, class G>
__device__ __forceinline__ void attn_part(const G &g, const tcu_attn_args &a, int slot, const tcu_qkv_args &post,
                                          int h, int i, int sp, attn_smem<POST> &S, bool early = false)
{
    /* early (POST only): the positions, the block table and the first K/V
     * rows load before the wait for the previous kernel - none of them is
     * written by it (the cache below the token's own position was written
     * by earlier steps; the own position's row is this kernel's) */
    early = POST && early;
    if (!early) {
        pdl_wait();
        pdl_trigger();
    }
    int lane = g.tid() & 31, w = g.tid() >> 5;
    int hd = a.hd, grp = a.n_head / a.n_kv_head, kvh = h / grp;
    int p = a.pos[i];
    int len = attn_len(a, p), start = p + 1 - len, ns = attn_splits(a, len);
    if (sp >= ns)
        return;
    int chunk = (len + ns - 1) / ns;
    int s0 = start + sp * chunk, s1 = s0 + chunk < p + 1 ? s0 + chunk : p + 1;
    const int32_t *blk = a.blk + a.bt_off[i];
    /* a warp's positions t = s0 + w, + ATT_WARPS, ...: the K and V rows of
     * ATT_U of them are loaded before the first is used (one memory round
     * trip per ATT_U positions); the softmax sees them in the same order */
    float kr[ATT_U][D], vr[ATT_U][D];
    auto load = [&](int t0) {
#pragma unroll
        for (int j = 0; j < ATT_U; j++) {
            const int t = t0 + j * ATT_WARPS;
            if (t < s1 && !(POST && t == p)) {
                size_t o = kv_off(a.kv, a.layer, blk, t) + (size_t)kvh * hd + lane * D;
#pragma unroll
                for (int d = 0; d < D; d++) {
                    kr[j][d] = a.kv.k[o + d];
                    vr[j][d] = a.kv.v[o + d];
                }
            } else {
#pragma unroll
                for (int d = 0; d < D; d++)
                    kr[j][d] = vr[j][d] = 0.0f;
            }
        }
    };
    /* and RoPE's cosines and sines at p (one element a thread) */
    const bool pre = early && hd / 2 <= g.size();
    float pc = 0.0f, ps = 0.0f;
    if (pre && g.tid() < hd / 2) {
        const float ang = (float)p * post.inv_freq[g.tid()];
        pc = cosf(ang);
        ps = sinf(ang);
    }
    if (early) {
        load(s0 + w);
        pdl_wait();
        pdl_trigger();
    }
    const float *q = a.q + ((size_t)i * a.n_head + h) * hd + lane * D;
    if constexpr (POST) {
        qkv_head(g, post, h, post.q + ((size_t)i * a.n_head + h) * hd, S.pq, p, S.sh, pre, pc, ps);
        if (s0 <= p && p < s1) {
            const int kd = a.n_kv_head * hd;
            qkv_head(g, post, a.n_head + kvh, post.k + (size_t)i * kd + (size_t)kvh * hd, S.pk, p, S.sh, pre, pc, ps);
            for (int e = g.tid(); e < hd; e += g.size())
                S.pv[e] = qkv_v(post, i, kvh, e);
            g.sync();
            if (h % grp == 0) {
                const size_t o = kv_off(a.kv, a.layer, a.blk + a.bt_off[i], p) + (size_t)kvh * hd;
                for (int e = g.tid(); e < hd; e += g.size()) {
                    a.kv.k[o + e] = S.pk[e];
                    a.kv.v[o + e] = S.pv[e];
                }
            }
        }
        q = S.pq + lane * D;
    }
    float qr[D], acc[D];
#pragma unroll
    for (int d = 0; d < D; d++) {
        qr[d] = q[d];
        acc[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t0 = s0 + w; t0 < s1; t0 += ATT_U * ATT_WARPS) {
        if (!early || t0 != s0 + w)
            load(t0);
        if constexpr (POST) {
#pragma unroll
            for (int j = 0; j < ATT_U; j++) {
                if (t0 + j * ATT_WARPS != p)
                    continue;
#pragma unroll
                for (int d = 0; d < D; d++) {
                    kr[j][d] = S.pk[lane * D + d];
                    vr[j][d] = S.pv[lane * D + d];
                }
            }
        }
#pragma unroll
        for (int j = 0; j < ATT_U; j++) {
            if (t0 + j * ATT_WARPS >= s1)
                break;
            float s = 0.0f;
#pragma unroll
            for (int d = 0; d < D; d++)
                s = fmaf(qr[d], kr[j][d], s);
            s = warp_sum(s) * a.scale;
            if (a.softcap > 0)
                s = a.softcap * tanhf(s / a.softcap);
            float mn = fmaxf(m, s), corr = expf(m - mn), e = expf(s - mn);
            l = l * corr + e;
#pragma unroll
            for (int d = 0; d < D; d++)
                acc[d] = acc[d] * corr + e * vr[j][d];
            m = mn;
        }
    }
    // Merge the warps' partial softmaxes.
    if (lane == 0) {
        S.sm[w] = m;
        S.sl[w] = l;
    }
#pragma unroll
    for (int d = 0; d < D; d++)
        S.sacc[w][lane * D + d] = acc[d];
    g.sync();
    float M = -INFINITY;
    for (int k = 0; k < ATT_WARPS; k++)
        M = fmaxf(M, S.sm[k]);
    float *part = a.part + (((size_t)i * a.n_head + h) * a.n_split + sp) * (hd + 2);
    for (int e = g.tid(); e < hd; e += g.size()) {
        float v = 0.0f;
        for (int k = 0; k < ATT_WARPS; k++)
            if (S.sm[k] > -INFINITY)
                v += expf(S.sm[k] - M) * S.sacc[k][e];
        part[2 + e] = v;
    }
    if (g.tid() == 0) {
        float L = 0.0f;
        for (int k = 0; k < ATT_WARPS; k++)
            if (S.sm[k] > -INFINITY)
                L += expf(S.sm[k] - M) * S.sl[k];
        part[0] = M;
        part[1] = L;
    }
    if (slot < 0)
        return;
    /* the last of the ns blocks of (i, h) to get here merges (the
     * order of the merge is fixed, whichever block it is) */
    __threadfence();
    g.sync();
    if (g.tid() == 0) {
        int *c = &att_count[slot][(size_t)i * a.n_head + h];
        S.last = atomicAdd(c, 1) == ns - 1;
        if (S.last)
            *c = 0; /* every block has arrived: ready for the next launch */
    }
    g.sync();
    if (!S.last)
        return;
    __threadfence();
    for (int e = g.tid(); e < hd; e += g.size())
        attn_merge_one(a, h, i, e);
}

template <int D, bool POST>
__global__ void __launch_bounds__(ATT_WARPS *WARP) attn_part_kernel(const tcu_attn_args a, int slot,
                                                                    const tcu_qkv_args post, int early)
{
    __shared__ attn_smem<POST> S;
    attn_part<D, POST>(blk_grp{}, a, slot, post, blockIdx.x, blockIdx.y, blockIdx.z, S, early != 0);
}

// The same for unfused steps with head_dim <= 128 with registers for 8
// blocks a SM (64; the default takes 128 and leaves 4): many tokens are
// latency-bound on their K/V loads (8B, 32 sequences: 76 -> 56 us a
// layer). Not for the fused kernel of one or two tokens: a register cap
// there cost batch 1 2-3% (8B).
template <int D>
__global__ void __launch_bounds__(ATT_WARPS *WARP, 8) attn_part_occ_kernel(const tcu_attn_args a, int slot,
                                                                           const tcu_qkv_args post)
{
    __shared__ attn_smem<false> S;
    attn_part<D, false>(blk_grp{}, a, slot, post, blockIdx.x, blockIdx.y, blockIdx.z, S);
}

// out[i][h][e] from the parts of (token i, head h), in split order.
// Reads through L2 (the parts may come from other blocks of this grid).
#define ATT_MERGE_MAX 16 /* splits merged from registers (one memory round trip) */

__device__ __forceinline__ void attn_merge_one(const tcu_attn_args &a, int h, int i, int e)
{
    const int hd = a.hd, n = attn_splits(a, attn_len(a, a.pos[i]));
    const float *part = a.part + ((size_t)i * a.n_head + h) * a.n_split * (hd + 2);
    float L = 0.0f, v = 0.0f;
    if (n <= ATT_MERGE_MAX) {
        /* every split's (max, sum, value) requested at once; the same
         * arithmetic in the same order as the loop below */
        float ms[ATT_MERGE_MAX], ls[ATT_MERGE_MAX], vs[ATT_MERGE_MAX];
#pragma unroll
        for (int s = 0; s < ATT_MERGE_MAX; s++)
            if (s < n) {
                const float *ps = part + (size_t)s * (hd + 2);
                ms[s] = __ldcg(ps);
                ls[s] = __ldcg(ps + 1);
                vs[s] = __ldcg(ps + 2 + e);
            }
        float M = -INFINITY;
#pragma unroll
        for (int s = 0; s < ATT_MERGE_MAX; s++)
            if (s < n)
                M = fmaxf(M, ms[s]);
#pragma unroll
        for (int s = 0; s < ATT_MERGE_MAX; s++)
            if (s < n && ms[s] > -INFINITY) {
                float f = expf(ms[s] - M);
                L += f * ls[s];
                v += f * vs[s];
            }
        a.out[((size_t)i * a.n_head + h) * hd + e] = v / L;
        return;
    }
    float M = -INFINITY;
    for (int s = 0; s < n; s++)
        M = fmaxf(M, __ldcg(part + (size_t)s * (hd + 2)));
    for (int s = 0; s < n; s++) {
        const float *ps = part + (size_t)s * (hd + 2);
        float m = __ldcg(ps);
        if (m > -INFINITY) {
            float f = expf(m - M);
            L += f * __ldcg(ps + 1);
            v += f * __ldcg(ps + 2 + e);
        }
    }
    a.out[((size_t)i * a.n_head + h) * hd + e] = v / L;
}

// grid (n_head, T), block hd threads.
__global__ void attn_merge_kernel(const tcu_attn_args a)
{
    pdl_wait();
    pdl_trigger();
    attn_merge_one(a, blockIdx.x, blockIdx.y, threadIdx.x);
}

// The counter slot of (current device, stream), or -1 when all are taken.
#define ATT_MAX_STREAMS 64
static struct {
    int dev, slot;
    cudaStream_t s;
} att_slot[ATT_MAX_STREAMS];
static int att_nslot;

static int att_slot_of(cudaStream_t s)
{
    int dev = 0;
    if (cudaGetDevice(&dev))
        return -1;
    unsigned used = 0; /* slots held on this device */
    for (int k = 0; k < att_nslot; k++) {
        if (att_slot[k].dev == dev && att_slot[k].s == s)
            return att_slot[k].slot;
        if (att_slot[k].dev == dev)
            used |= 1u << att_slot[k].slot;
    }
    int free_slot = 0;
    while (free_slot < ATT_SLOTS && (used >> free_slot & 1))
        free_slot++;
    if (att_nslot == ATT_MAX_STREAMS || free_slot == ATT_SLOTS)
        return -1;
    att_slot[att_nslot].dev = dev;
    att_slot[att_nslot].s = s;
    att_slot[att_nslot].slot = free_slot;
    return att_slot[att_nslot++].slot;
}

extern "C" void tcu_stream_forget(tcu_stream stream)
{
    for (int k = 0; k < att_nslot; k++)
        if (att_slot[k].s == (cudaStream_t)stream) {
            att_slot[k] = att_slot[--att_nslot];
            k--;
        }
}

// The kernel of (D, POST): unfused head dims up to 128 take the copy for
// 8 blocks a SM.
template <int D, bool POST>
static int attn_part_one(dim3 grid, dim3 block, cudaStream_t s, const tcu_attn_args *a, int slot,
                         const tcu_qkv_args *post)
{
    if constexpr (!POST && D <= 4) {
        return launch(attn_part_occ_kernel<D>, grid, block, 0, s, *a, slot, *post);
    } else {
        static int early = -1; /* TERN_CUDA_ATTN_EARLY=0: every load after the wait */
        if (early < 0) {
            const char *e = getenv("TERN_CUDA_ATTN_EARLY");
            early = !(e && !strcmp(e, "0"));
        }
        return launch(attn_part_kernel<D, POST>, grid, block, 0, s, *a, slot, *post, early);
    }
}

template <bool POST>
static int attn_part_launch(const tcu_attn_args *a, const tcu_qkv_args *post, cudaStream_t s)
{
    static int fuse = -1; /* TERN_CUDA_ATTN_FUSE=0: the separate merge kernel */
    if (fuse < 0) {
        const char *e = getenv("TERN_CUDA_ATTN_FUSE");
        fuse = !(e && !strcmp(e, "0"));
    }
    const int slot = fuse && (long)a->T * a->n_head <= ATT_CNT ? att_slot_of(s) : -1;
    dim3 grid(a->n_head, a->T, a->n_split), block(ATT_WARPS * WARP);
    int rc = 0;
    switch (a->hd / 32) {
    case 1: rc = attn_part_one<1, POST>(grid, block, s, a, slot, post); break;
    case 2: rc = attn_part_one<2, POST>(grid, block, s, a, slot, post); break;
    case 3: rc = attn_part_one<3, POST>(grid, block, s, a, slot, post); break;
    case 4: rc = attn_part_one<4, POST>(grid, block, s, a, slot, post); break;
    case 5: rc = attn_part_one<5, POST>(grid, block, s, a, slot, post); break;
    case 6: rc = attn_part_one<6, POST>(grid, block, s, a, slot, post); break;
    case 7: rc = attn_part_one<7, POST>(grid, block, s, a, slot, post); break;
    case 8: rc = attn_part_one<8, POST>(grid, block, s, a, slot, post); break;
    default: return (int)cudaErrorInvalidValue;
    }
    if (rc || slot >= 0)
        return rc;
    return launch(attn_merge_kernel, dim3(a->n_head, a->T), dim3(a->hd), 0, s, *a);
}

extern "C" int tcu_attention(const tcu_attn_args *a, tcu_stream stream)
{
    PROF(TCU_PROF_ATTN, stream);
    const tcu_qkv_args none = {};
    return attn_part_launch<false>(a, &none, (cudaStream_t)stream);
}

extern "C" int tcu_qkv_attention(const tcu_qkv_args *post, const tcu_attn_args *a, tcu_stream stream)
{
    PROF(TCU_PROF_ATTN, stream);
    if (post->T != a->T || post->hd != a->hd || post->n_head != a->n_head || post->n_kv_head != a->n_kv_head)
        return (int)cudaErrorInvalidValue;
    return attn_part_launch<true>(a, post, (cudaStream_t)stream);
}

// ---- the decode step of one token in one launch (bf16 weights) ----
//
// tcu_step: one block of SK_WARPS warps a multiprocessor, all resident (a
// cooperative launch), walking the layers' five steps - q/k/v, attention,
// o, gate/up, down - with a grid barrier between them. Every product is
// variant 4's arithmetic at T = 1 (lane L sums its chunks L, L + 32, ... of
// a row in order, the warp's butterfly, the fused norm's 256-thread double
// sums), so the values are those of the separate launches. What the launch
// boundaries cost there (each product's first memory round trip, its
// ramp-up and tail, the attention's latency with the memory idle) is
// hidden here: a warp's weights are one stream of 16-byte loads, U (8 or 16) in
// flight, that runs across the barriers - before arriving, each warp
// requests the first chunks of its rows of the next product - and during
// the attention the o weights are brought into L2.
#define SK_WARPS 16

__device__ unsigned long long sk_trace[1 + 5 * 256]; /* tcu_step_trace */

__device__ unsigned sk_bar[ATT_SLOTS][2]; /* arrivals, generation */

__device__ __forceinline__ unsigned ld_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long globaltimer()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void l2_prefetch(const void *p, unsigned bytes)
{
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Every block of the grid arrives before any leaves; the last to arrive
// resets the count and moves the generation on.
__device__ __forceinline__ void sk_sync(unsigned *bar, unsigned &gen)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            while (ld_acquire(bar + 1) == gen)
                ;
        }
        gen++;
        __threadfence();
    }
    __syncthreads();
}

// Where input e of a product lives in shared memory: 32 chunks of 8 inputs
// a step, lane L's chunk as two float4 128 floats apart (conflict-free).
__device__ __forceinline__ int sk_pos(int e)
{
    const int c = e >> 3, j = e & 7;
    return (c >> 5) * 256 + (j >> 2) * 128 + (c & 31) * 4 + (j & 3);
}

// One product of the step: up to three matrices stacked by rows (q, k, v)
// or a gate/up pair (w[0], w[1]; mode 2 SiLU, 3 GELU-tanh: y[0] = act(gate)
// * up); mode 0 y = v, 1 y += v.
struct sk_phase {
    const uint16_t *w[3];
    float *y[3];
    long rows[3];
    int nm, n_in, mode;
    long total;
};

// The matrix of stacked row r, r made its row there.
__device__ __forceinline__ int sk_mat(const sk_phase &P, long &r)
{
    if (P.nm == 1 || r < P.rows[0])
        return 0;
    r -= P.rows[0];
    if (P.nm == 2 || r < P.rows[1])
        return 1;
    r -= P.rows[1];
    return 2;
}

// A warp's next load: row r, step cs (lane L: chunk cs * 32 + L).
struct sk_cur {
    long r;
    int cs;
    const uint4 *p0, *p1;
};

__device__ __forceinline__ void sk_row(const sk_phase &P, sk_cur &c)
{
    long r = c.r;
    const int k = sk_mat(P, r);
    const size_t off = (size_t)r * P.n_in;
    c.p0 = reinterpret_cast<const uint4 *>((k == 0 ? P.w[0] : k == 1 ? P.w[1] : P.w[2]) + off);
    c.p1 = reinterpret_cast<const uint4 *>(P.w[1] + off); /* gate/up only */
}

template <bool GLU>
__device__ __forceinline__ void sk_ld(const sk_phase &P, sk_cur &c, int lane, int nch, int spr, uint4 &d0, uint4 &d1)
{
    const int ch = c.cs * 32 + lane;
    if (ch < nch) {
        d0 = __ldcs(c.p0 + ch);
        if constexpr (GLU)
            d1 = __ldcs(c.p1 + ch);
    }
    if (++c.cs == spr) {
        c.cs = 0;
        c.r++;
        sk_row(P, c);
    }
}

// The warp's first loads of rows r0 .. r1 - 1 of P (before the barrier
// that P's inputs wait for), and lane 0's L2 prefetch of up to pf bytes of
// those rows.
template <bool GLU, int U>
__device__ __forceinline__ void sk_hoist(const sk_phase &P, long r0, long r1, sk_cur &c, uint4 (&ring)[U], int lane,
                                         long pf)
{
    constexpr int DEPTH = GLU ? U / 2 : U;
    const int nch = P.n_in >> 3, spr = (nch + 31) >> 5;
    const long S = (r1 - r0) * spr;
    c.r = r0;
    c.cs = 0;
    if (r0 < r1)
        sk_row(P, c);
#pragma unroll
    for (int u = 0; u < DEPTH; u++)
        if (u < S)
            sk_ld<GLU>(P, c, lane, nch, spr, ring[GLU ? 2 * u : u], ring[GLU ? 2 * u + 1 : u]);
    if (lane == 0)
        for (long r = r0; r < r1 && pf > 0; r++) {
            long rr = r;
            const int k = sk_mat(P, rr);
            const unsigned b = (unsigned)(pf < (long)P.n_in * 2 ? pf : (long)P.n_in * 2) & ~15u;
            const size_t off = (size_t)rr * P.n_in;
            if (b)
                l2_prefetch((k == 0 ? P.w[0] : k == 1 ? P.w[1] : P.w[2]) + off, b);
            if (GLU && b)
                l2_prefetch(P.w[1] + off, b);
            pf -= GLU ? 2 * (long)b : b;
        }
}

__device__ __forceinline__ void sk_out(const sk_phase &P, long r, float v, float u)
{
    const int k = sk_mat(P, r);
    float *y = (k == 0 ? P.y[0] : k == 1 ? P.y[1] : P.y[2]) + r;
    if (P.mode == 0)
        *y = v;
    else if (P.mode == 1)
        *y = *y + v;
    else
        *y = (P.mode == 3 ? gelu_f(v) : silu_f(v)) * u;
}

// Rows r0 .. r1 - 1 of P against the staged inputs xs, the loads U
// (gate/up: U / 2 pairs) steps ahead of the products; the first ones are
// in ring already (sk_hoist).
template <bool GLU, int U>
__device__ __forceinline__ void sk_gemv(const sk_phase &P, const float *xs, uint4 (&ring)[U], sk_cur &c, long r0,
                                        long r1, int lane)
{
    constexpr int DEPTH = GLU ? U / 2 : U;
    const int nch = P.n_in >> 3, spr = (nch + 31) >> 5;
    const long S = (r1 - r0) * spr;
    float acc = 0.0f, accu = 0.0f;
    long r = r0;
    int cs = 0;
    for (long s0 = 0; s0 < S; s0 += DEPTH) {
#pragma unroll
        for (int u = 0; u < DEPTH; u++) {
            if (s0 + u >= S)
                break;
            const uint4 w0 = ring[GLU ? 2 * u : u], w1 = ring[GLU ? 2 * u + 1 : u];
            if (s0 + u + DEPTH < S)
                sk_ld<GLU>(P, c, lane, nch, spr, ring[GLU ? 2 * u : u], ring[GLU ? 2 * u + 1 : u]);
            if (cs * 32 + lane < nch) {
                const float4 a0 = *reinterpret_cast<const float4 *>(xs + cs * 256 + lane * 4);
                const float4 a1 = *reinterpret_cast<const float4 *>(xs + cs * 256 + 128 + lane * 4);
                const float xv[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                acc = __fadd_rn(acc, chunk_dot_v<TCU_BF16>(w0, xv, 0.0f, 0.0f, 0.0f));
                if constexpr (GLU)
                    accu = __fadd_rn(accu, chunk_dot_v<TCU_BF16>(w1, xv, 0.0f, 0.0f, 0.0f));
            }
            if (++cs == spr) {
                cs = 0;
                const float v = warp_sum(acc), uv = GLU ? warp_sum(accu) : 0.0f;
                if (lane == 0)
                    sk_out(P, r, v, uv);
                acc = accu = 0.0f;
                r++;
            }
        }
    }
}

// x[n] (global, written by this launch: through L2) into xs at sk_pos;
// with g, variant 4's fused RMSNorm in place (threads 0-255 sum as its 256
// threads do; the other warps add zeros after them).
__device__ void sk_stage(const float *x, int n, const float *g, float eps, float *xs, double *sh)
{
    for (int v = threadIdx.x * 4; v < n; v += blockDim.x * 4)
        cp_async16(xs + sk_pos(v), x + v, 16);
    asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    if (!g)
        return;
    double ss = 0.0;
    if (threadIdx.x < 256)
        for (int e = threadIdx.x; e < n; e += 256) {
            const float f = xs[sk_pos(e)];
            ss += (double)f * f;
        }
    ss = grp_sum_d(blk_grp{}, ss, sh);
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int e = threadIdx.x; e < n; e += blockDim.x) {
        const int q = sk_pos(e);
        xs[q] = __fmul_rn(__fmul_rn(xs[q], r), g[e]);
    }
    __syncthreads();
}

// Product k (0 q/k/v, 1 o, 2 gate/up, 3 down) of layer l.
__device__ sk_phase sk_make(const tcu_step_args &a, int l, int k)
{
    const tcu_step_layer &L = a.layers[l];
    const int qd = a.attn.n_head * a.attn.hd, kvd = a.attn.n_kv_head * a.attn.hd;
    switch (k) {
    case 0: return sk_phase{{L.wq, L.wk, L.wv}, {a.post.q, a.post.k, a.post.v}, {qd, kvd, kvd}, 3, a.dim, 0, qd + 2L * kvd};
    case 1: return sk_phase{{L.wo}, {a.x}, {a.dim}, 1, qd, 1, a.dim};
    case 2: return sk_phase{{L.wg, L.wu}, {a.gate}, {a.n_ff}, 1, a.dim, a.glu == 2 ? 3 : 2, a.n_ff};
    default: return sk_phase{{L.wd}, {a.x}, {a.dim}, 1, a.n_ff, 1, a.dim};
    }
}

// D: head_dim / 32; U: 16-byte weight loads in flight per lane.
template <int D, int U>
__global__ void __launch_bounds__(SK_WARPS *WARP, 1) step_kernel(const tcu_step_args a, int slot, int xs_len)
{
    extern __shared__ float4 sk_smem[];
    float *xs = reinterpret_cast<float *>(sk_smem);
    attn_smem<true> *as = reinterpret_cast<attn_smem<true> *>(xs + xs_len);
    sk_phase *tab = reinterpret_cast<sk_phase *>(as + 4); /* [n_layer][4] */
    __shared__ double sh[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const long gw = (long)blockIdx.x * SK_WARPS + warp, W = (long)gridDim.x * SK_WARPS;
    unsigned *bar = sk_bar[slot];
    unsigned gen = 0;
    const bool tr = a.trace && blockIdx.x == 0 && threadIdx.x == 0;
    int nt = 0;
    auto sync = [&]() {
        sk_sync(bar, gen);
        if (tr)
            sk_trace[++nt] = globaltimer();
    };
    if (threadIdx.x == 0)
        gen = ld_acquire(bar + 1);
    if (tr)
        sk_trace[0] = globaltimer();
    for (int t = threadIdx.x; t < 4 * a.n_layer; t += blockDim.x)
        tab[t] = sk_make(a, t / 4, t % 4);
    __syncthreads();
    const int qd = a.attn.n_head * a.attn.hd;
    const long pf = (long)a.pf_kb * 1024;
    auto lo = [&](const sk_phase &P) { return P.total * gw / W; };
    auto hi = [&](const sk_phase &P) { return P.total * (gw + 1) / W; };
    uint4 ring[U];
    sk_cur c;
    sk_hoist<false, U>(tab[0], lo(tab[0]), hi(tab[0]), c, ring, lane, 0);
    for (int l = 0; l < a.n_layer; l++) {
        const tcu_step_layer &L = a.layers[l];
        const sk_phase *P = tab + 4 * l;
        /* 1. norm, q/k/v */
        sk_stage(a.x, a.dim, L.attn_norm, a.eps, xs, sh);
        sk_gemv<false, U>(P[0], xs, ring, c, lo(P[0]), hi(P[0]), lane);
        sync();
        /* 2. attention; meanwhile the block's o rows into L2 */
        if (threadIdx.x == 0 && a.pf_o > 0) {
            const long b0 = P[1].total * ((long)blockIdx.x * SK_WARPS) / W,
                       b1 = P[1].total * ((long)blockIdx.x + 1) * SK_WARPS / W;
            const long bytes = (b1 - b0) * (long)qd * 2 * a.pf_o / 100;
            const char *w = reinterpret_cast<const char *>(L.wo + (size_t)b0 * qd);
            for (long o = 0; o < bytes; o += 65536)
                l2_prefetch(w + o, (unsigned)(bytes - o < 65536 ? bytes - o : 65536) & ~15u);
        }
        {
            const int g = warp >> 2;
            tcu_attn_args at = a.attn;
            tcu_qkv_args po = a.post;
            at.layer = po.layer = l;
            at.window = L.window;
            po.bq = L.bq;
            po.bk = L.bk;
            po.bv = L.bv;
            po.qn = L.qn;
            po.kn = L.kn;
            po.inv_freq = L.rope;
            const int nu = at.n_head * at.n_split;
            for (int u = g * (int)gridDim.x + (int)blockIdx.x; u < nu; u += 4 * (int)gridDim.x)
                attn_part<D, true>(sub_grp{g}, at, slot, po, u / at.n_split, 0, u % at.n_split, as[g]);
        }
        sk_hoist<false, U>(P[1], lo(P[1]), hi(P[1]), c, ring, lane, 0);
        sync();
        /* 3. x += o(att) */
        sk_stage(a.attn.out, qd, nullptr, 0.0f, xs, sh);
        sk_gemv<false, U>(P[1], xs, ring, c, lo(P[1]), hi(P[1]), lane);
        sk_hoist<true, U>(P[2], lo(P[2]), hi(P[2]), c, ring, lane, pf);
        sync();
        /* 4. norm, gate = act(gate) * up */
        sk_stage(a.x, a.dim, L.ffn_norm, a.eps, xs, sh);
        sk_gemv<true, U>(P[2], xs, ring, c, lo(P[2]), hi(P[2]), lane);
        sk_hoist<false, U>(P[3], lo(P[3]), hi(P[3]), c, ring, lane, pf);
        sync();
        /* 5. x += down(gate) */
        sk_stage(a.gate, a.n_ff, nullptr, 0.0f, xs, sh);
        sk_gemv<false, U>(P[3], xs, ring, c, lo(P[3]), hi(P[3]), lane);
        if (l + 1 < a.n_layer)
            sk_hoist<false, U>(P[4], lo(P[4]), hi(P[4]), c, ring, lane, pf);
        sync();
    }
}

static int step_count;

extern "C" int tcu_step_count(void) { return step_count; }

template <int D, int U> static int step_launch(const tcu_step_args *a, int slot, cudaStream_t s)
{
    const int qd = a->attn.n_head * a->attn.hd;
    int n = a->dim > qd ? a->dim : qd;
    n = a->n_ff > n ? a->n_ff : n;
    const int xs_len = (n + 255) / 256 * 256;
    const size_t smem =
        (size_t)xs_len * sizeof(float) + 4 * sizeof(attn_smem<true>) + 4 * (size_t)a->n_layer * sizeof(sk_phase);
    int occ = 0;
    if (cudaFuncSetAttribute(step_kernel<D, U>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, step_kernel<D, U>, SK_WARPS * WARP, smem) || occ < 1) {
        cudaGetLastError();
        return -1;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cfg.gridDim = dim3((unsigned)sm_count());
    cfg.blockDim = dim3(SK_WARPS * WARP);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int rc = (int)cudaLaunchKernelEx(&cfg, step_kernel<D, U>, *a, slot, xs_len);
    if (!rc)
        step_count++;
    return rc ? rc : last_err();
}

extern "C" int tcu_step(const tcu_step_args *a, tcu_stream stream)
{
    const int qd = a->attn.n_head * a->attn.hd;
    if (a->attn.T != 1 || a->post.T != 1 || a->n_layer < 1 || a->n_layer > 256 || a->dim % 8 || a->n_ff % 8 || qd % 8)
        return -1;
    cudaStream_t s = (cudaStream_t)stream;
    const int slot = att_slot_of(s);
    if (slot < 0)
        return -1;
    PROF(TCU_PROF_OTHER, stream);
    const bool u16 = a->u == 16;
    switch (a->attn.hd) {
    case 32: return u16 ? step_launch<1, 16>(a, slot, s) : step_launch<1, 8>(a, slot, s);
    case 64: return u16 ? step_launch<2, 16>(a, slot, s) : step_launch<2, 8>(a, slot, s);
    case 128: return u16 ? step_launch<4, 16>(a, slot, s) : step_launch<4, 8>(a, slot, s);
    default: return -1;
    }
}

extern "C" int tcu_step_trace(int n_layer, double us[6])
{
    unsigned long long t[1 + 5 * 256];
    if (n_layer < 1 || n_layer > 256 || cudaMemcpyFromSymbol(t, sk_trace, sizeof(unsigned long long) * (1 + 5 * n_layer)))
        return -1;
    for (int k = 0; k < 6; k++)
        us[k] = 0;
    for (int l = 0; l < n_layer; l++)
        for (int k = 0; k < 5; k++)
            us[k] += (double)(t[1 + 5 * l + k] - t[5 * l + k]) / 1e3 / n_layer;
    us[5] = (double)(t[5 * n_layer] - t[0]) / 1e3;
    return 0;
}

// ---- tiled attention for prefill chunks ----
//
// One block per (head, tile of up to AQ consecutive tokens of one sequence
// at consecutive positions): the tile's queries stay in shared memory and
// the keys stream through it AK at a time - each K/V row is read once per
// tile instead of once per token. Per key tile: scores of AQ x AK pairs
// (each thread a 4 x 2 block), online softmax per query row (the 16
// threads of a row reduce with shuffles), then P V into per-thread
// accumulators (4 queries x hd/16 dims). f32 throughout.
#define AQ TCU_ATTN_TILE_Q
#define AK 32

template <int HD>
__global__ void __launch_bounds__(256) attn_tiled_kernel(const tcu_attn_args a, const int32_t *tiles)
{
    pdl_wait();
    pdl_trigger();
    constexpr int DV = HD / 16; /* output dims per thread */
    extern __shared__ float4 sm4[];
    float *qt = reinterpret_cast<float *>(sm4); /* [HD][AQ] queries, transposed */
    float *kt = qt + HD * AQ;                   /* [HD][AK] keys, transposed */
    float *vs = kt + HD * AK;                   /* [AK][HD] values */
    float *pt = vs + AK * HD;                   /* [AK][AQ] probabilities, transposed */
    const int h = blockIdx.x, i0 = tiles[2 * blockIdx.y], n = tiles[2 * blockIdx.y + 1];
    const int kvh = h / (a.n_head / a.n_kv_head), tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int p0 = a.pos[i0];
    const int32_t *blk = a.blk + a.bt_off[i0];
    for (int e = tid; e < AQ * HD; e += 256) {
        const int q = e / HD, d = e - q * HD;
        qt[d * AQ + q] = q < n ? a.q[((size_t)(i0 + q) * a.n_head + h) * HD + d] : 0.0f;
    }
    float m[4], l[4], o[4][DV];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int d = 0; d < DV; d++)
            o[r][d] = 0.0f;
    }
    const int kstart = a.window > 0 && p0 - a.window + 1 > 0 ? p0 - a.window + 1 : 0, kend = p0 + n - 1;
    for (int k0 = kstart; k0 <= kend; k0 += AK) {
        __syncthreads(); /* the previous tile's kt / vs / pt are consumed */
        for (int e = tid; e < AK * HD / 4; e += 256) {
            const int kk = e / (HD / 4), d4 = (e - kk * (HD / 4)) * 4, kp = k0 + kk;
            float4 kv4 = make_float4(0, 0, 0, 0), vv4 = kv4;
            if (kp <= kend) {
                const size_t off = kv_off(a.kv, a.layer, blk, kp) + (size_t)kvh * HD + d4;
                kv4 = *reinterpret_cast<const float4 *>(a.kv.k + off);
                vv4 = *reinterpret_cast<const float4 *>(a.kv.v + off);
            }
            kt[(d4 + 0) * AK + kk] = kv4.x;
            kt[(d4 + 1) * AK + kk] = kv4.y;
            kt[(d4 + 2) * AK + kk] = kv4.z;
            kt[(d4 + 3) * AK + kk] = kv4.w;
            *reinterpret_cast<float4 *>(vs + kk * HD + d4) = vv4;
        }
        __syncthreads();
        /* scores: queries 4 ty .. 4 ty + 3, keys 2 tx, 2 tx + 1 */
        float s[4][2];
#pragma unroll
        for (int r = 0; r < 4; r++)
            s[r][0] = s[r][1] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < HD; d++) {
            const float4 qv = *reinterpret_cast<const float4 *>(qt + d * AQ + 4 * ty);
            const float2 kv2 = *reinterpret_cast<const float2 *>(kt + d * AK + 2 * tx);
            const float qa[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
            for (int r = 0; r < 4; r++) {
                s[r][0] = fmaf(qa[r], kv2.x, s[r][0]);
                s[r][1] = fmaf(qa[r], kv2.y, s[r][1]);
            }
        }
        /* online softmax per query row (16 threads share a row) */
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int qp = p0 + 4 * ty + r;
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int kp = k0 + 2 * tx + c;
                const bool ok = 4 * ty + r < n && kp <= qp && (a.window <= 0 || kp > qp - a.window);
                float v = s[r][c] * a.scale;
                if (a.softcap > 0)
                    v = a.softcap * tanhf(v / a.softcap);
                s[r][c] = ok ? v : -INFINITY;
                mx = fmaxf(mx, s[r][c]);
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1)
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float mn = fmaxf(m[r], mx);
            float corr = 1.0f, ps = 0.0f;
            if (mn > -INFINITY) {
                corr = expf(m[r] - mn);
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    s[r][c] = s[r][c] > -INFINITY ? expf(s[r][c] - mn) : 0.0f;
                    ps += s[r][c];
                }
            } else {
                s[r][0] = s[r][1] = 0.0f;
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1)
                ps += __shfl_xor_sync(0xffffffffu, ps, off);
            m[r] = mn;
            l[r] = l[r] * corr + ps;
#pragma unroll
            for (int d = 0; d < DV; d++)
                o[r][d] *= corr;
            pt[(2 * tx) * AQ + 4 * ty + r] = s[r][0];
            pt[(2 * tx + 1) * AQ + 4 * ty + r] = s[r][1];
        }
        __syncthreads();
        /* o += P V: queries 4 ty .. + 3, dims tx * DV .. + DV - 1 */
#pragma unroll 4
        for (int kk = 0; kk < AK; kk++) {
            const float4 pv = *reinterpret_cast<const float4 *>(pt + kk * AQ + 4 * ty);
            const float pa[4] = {pv.x, pv.y, pv.z, pv.w};
            float vv[DV];
#pragma unroll
            for (int d4 = 0; d4 < DV; d4 += 4) {
                const float4 t4 = *reinterpret_cast<const float4 *>(vs + kk * HD + tx * DV + d4);
                vv[d4] = t4.x;
                vv[d4 + 1] = t4.y;
                vv[d4 + 2] = t4.z;
                vv[d4 + 3] = t4.w;
            }
#pragma unroll
            for (int r = 0; r < 4; r++)
#pragma unroll
                for (int d = 0; d < DV; d++)
                    o[r][d] = fmaf(pa[r], vv[d], o[r][d]);
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int q = 4 * ty + r;
        if (q >= n)
            continue;
        float *out = a.out + ((size_t)(i0 + q) * a.n_head + h) * HD + tx * DV;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
#pragma unroll
        for (int d4 = 0; d4 < DV; d4 += 4)
            *reinterpret_cast<float4 *>(out + d4) =
                make_float4(o[r][d4] * inv, o[r][d4 + 1] * inv, o[r][d4 + 2] * inv, o[r][d4 + 3] * inv);
    }
}

template <int HD> static int attn_tiled_launch(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, cudaStream_t s)
{
    const size_t smem = ((size_t)HD * AQ + (size_t)HD * AK + (size_t)AK * HD + (size_t)AK * AQ) * sizeof(float);
    static bool raised = false;
    if (!raised) {
        cudaFuncSetAttribute(attn_tiled_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        raised = true;
    }
    return launch(attn_tiled_kernel<HD>, dim3(a->n_head, n_tiles), dim3(256), smem, s, *a, tiles);
}

// ---- tensor-core tiled attention for prefill chunks (TERN_CUDA_ATTN_TILED=2, the default) ----
//
// The same tiles as attn_tiled_kernel; 4 warps, each owning 16 of the
// tile's 64 queries. Per key tile of 64: S = Q K^T and O += P V with
// mma.sync m16n8k8 TF32 (inputs rounded to TF32, f32 accumulation - the
// precision class of the cuBLAS products around it, not of the f32
// per-token kernel), the online softmax on the S fragments in registers
// (a row's 4 lanes reduce with shuffles), and P used as the A operand of
// P V straight from those registers: a lane holds P[q][2t], P[q][2t + 1]
// of each 8-key group, so the key order inside the group is permuted (2t
// -> slot t, 2t + 1 -> slot t + 4) the same way for V's rows.
#define TQ TCU_ATTN_TILE_Q
#define TK 64

__device__ __forceinline__ uint32_t to_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_tf32(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t tf32_of(uint32_t f32_bits) { return to_tf32(__uint_as_float(f32_bits)); }

template <int HD>
__global__ void __launch_bounds__(128) attn_tc_kernel(const tcu_attn_args a, const int32_t *tiles)
{
    pdl_wait();
    pdl_trigger();
    constexpr int LD = HD + 4; /* padded rows: conflict-free fragment loads */
    extern __shared__ float4 sm4[];
    uint32_t *qs = reinterpret_cast<uint32_t *>(sm4); /* [TQ][LD] tf32 */
    uint32_t *ks = qs + TQ * LD;                      /* [TK][LD] f32 bits (rounded to TF32 when read) */
    uint32_t *vs = ks + TK * LD;                      /* [TK][LD] f32 bits */
    const int h = blockIdx.x, i0 = tiles[2 * blockIdx.y], n = tiles[2 * blockIdx.y + 1];
    const int kvh = h / (a.n_head / a.n_kv_head), tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int p0 = a.pos[i0];
    const int32_t *blk = a.blk + a.bt_off[i0];
    for (int e = tid; e < TQ * HD / 4; e += 128) {
        const int q = e / (HD / 4), d4 = (e - q * (HD / 4)) * 4;
        float4 v = make_float4(0, 0, 0, 0);
        if (q < n)
            v = *reinterpret_cast<const float4 *>(a.q + ((size_t)(i0 + q) * a.n_head + h) * HD + d4);
        *reinterpret_cast<uint4 *>(qs + q * LD + d4) = make_uint4(to_tf32(v.x), to_tf32(v.y), to_tf32(v.z), to_tf32(v.w));
    }
    float o[HD / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < HD / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    const int qr0 = 16 * w + g; /* this lane's query rows: qr0, qr0 + 8 */
    const int kstart = a.window > 0 && p0 - a.window + 1 > 0 ? p0 - a.window + 1 : 0, kend = p0 + n - 1;
    for (int k0 = kstart; k0 <= kend; k0 += TK) {
        __syncthreads();
        /* the key tile's K and V rows straight into shared memory, every
         * copy in flight at once (keys past kend: zeros) */
        for (int e = tid; e < TK * HD / 4; e += 128) {
            const int kk = e / (HD / 4), d4 = (e - kk * (HD / 4)) * 4, kp = k0 + kk;
            const size_t off = kv_off(a.kv, a.layer, blk, kp <= kend ? kp : kend) + (size_t)kvh * HD + d4;
            cp_async16(ks + kk * LD + d4, a.kv.k + off, kp <= kend ? 16 : 0);
            cp_async16(vs + kk * LD + d4, a.kv.v + off, kp <= kend ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
        __syncthreads();
        /* S = Q K^T: 16 queries x 64 keys (8 n-tiles) */
        float s[TK / 8][4];
#pragma unroll
        for (int j = 0; j < TK / 8; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll 4
        for (int d0 = 0; d0 < HD; d0 += 8) {
            const uint32_t *qa = qs + (16 * w + g) * LD + d0 + t;
            const uint32_t a0 = qa[0], a1 = qa[8 * LD], a2 = qa[4], a3 = qa[8 * LD + 4];
#pragma unroll
            for (int j = 0; j < TK / 8; j++) {
                const uint32_t *kb = ks + (8 * j + g) * LD + d0 + t;
                mma_tf32(s[j], a0, a1, a2, a3, tf32_of(kb[0]), tf32_of(kb[4]));
            }
        }
        /* mask, scale, soft-cap; online softmax of rows qr0 (c0, c1) and qr0 + 8 (c2, c3) */
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < TK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, q = qr0 + 8 * r, qp = p0 + q, kp = k0 + 8 * j + 2 * t + (e & 1);
                const bool ok = q < n && kp <= qp && (a.window <= 0 || kp > qp - a.window);
                float v = s[j][e] * a.scale;
                if (a.softcap > 0)
                    v = a.softcap * tanhf(v / a.softcap);
                s[j][e] = ok ? v : -INFINITY;
                mx[r] = fmaxf(mx[r], s[j][e]);
            }
        float corr[2], ps[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            corr[r] = mn > -INFINITY ? expf(m[r] - mn) : 1.0f;
            m[r] = mn;
        }
#pragma unroll
        for (int j = 0; j < TK / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                s[j][e] = s[j][e] > -INFINITY ? expf(s[j][e] - m[r]) : 0.0f;
                ps[r] += s[j][e];
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 1);
            ps[r] += __shfl_xor_sync(0xffffffffu, ps[r], 2);
            l[r] = l[r] * corr[r] + ps[r];
        }
#pragma unroll
        for (int j = 0; j < HD / 8; j++) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        /* O += P V: k-steps of 8 keys (slot t <- key 2t, slot t + 4 <- key 2t + 1) */
#pragma unroll
        for (int kk = 0; kk < TK / 8; kk++) {
            const uint32_t a0 = to_tf32(s[kk][0]), a1 = to_tf32(s[kk][2]), a2 = to_tf32(s[kk][1]),
                           a3 = to_tf32(s[kk][3]);
            const uint32_t *vb = vs + (8 * kk + 2 * t) * LD + g;
#pragma unroll
            for (int j = 0; j < HD / 8; j++)
                mma_tf32(o[j], a0, a1, a2, a3, tf32_of(vb[8 * j]), tf32_of(vb[LD + 8 * j]));
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int q = qr0 + 8 * r;
        if (q >= n)
            continue;
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        float *out = a.out + ((size_t)(i0 + q) * a.n_head + h) * HD + 2 * t;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *reinterpret_cast<float2 *>(out + 8 * j) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    }
}

template <int HD> static int attn_tc_launch(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, cudaStream_t s)
{
    const size_t smem = (size_t)(TQ + 2 * TK) * (HD + 4) * sizeof(uint32_t);
    static bool raised = false;
    if (!raised) {
        cudaFuncSetAttribute(attn_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        raised = true;
    }
    return launch(attn_tc_kernel<HD>, dim3(a->n_head, n_tiles), dim3(128), smem, s, *a, tiles);
}

/* 1: attn_tiled_kernel (f32), 2: attn_tc_kernel (TF32 tensor cores); -1 = not read yet */
static int att_tiled_mode = -1;

extern "C" void tcu_attention_tiled_set(int mode) { att_tiled_mode = mode == 1 ? 1 : 2; }

extern "C" int tcu_attention_tiled(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, tcu_stream stream)
{
    PROF(TCU_PROF_ATTN, stream);
    cudaStream_t s = (cudaStream_t)stream;
    if (n_tiles <= 0)
        return 0;
    if (att_tiled_mode < 0) {
        const char *e = getenv("TERN_CUDA_ATTN_TILED");
        att_tiled_mode = e && !strcmp(e, "1") ? 1 : 2;
    }
    if (att_tiled_mode == 2)
        switch (a->hd) {
        case 64: return attn_tc_launch<64>(a, tiles, n_tiles, s);
        case 128: return attn_tc_launch<128>(a, tiles, n_tiles, s);
        case 256: return attn_tc_launch<256>(a, tiles, n_tiles, s);
        default: return -1;
        }
    switch (a->hd) {
    case 64: return attn_tiled_launch<64>(a, tiles, n_tiles, s);
    case 128: return attn_tiled_launch<128>(a, tiles, n_tiles, s);
    case 256: return attn_tiled_launch<256>(a, tiles, n_tiles, s);
    default: return -1; /* other head dims: the per-token kernel */
    }
}

// ---- benchmark helpers ----

__device__ __forceinline__ uint32_t hash_u32(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

__global__ void fill_kernel(void *p, size_t n, int what, uint64_t seed, float scale)
{
    pdl_wait();
    pdl_trigger();
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = hash_u32(seed * 0x9e3779b97f4a7c15ull + e);
        float u = scale * ((float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
        if (what == TCU_BF16)
            ((uint16_t *)p)[e] = __bfloat16_as_ushort(__float2bfloat16_rn(u));
        else if (what == TCU_F32)
            ((float *)p)[e] = u;
        else
            ((uint8_t *)p)[e] = (uint8_t)h;
    }
}

extern "C" int tcu_fill_random(void *p, size_t n, int what, uint64_t seed, float scale, tcu_stream stream)
{
    return launch(fill_kernel, dim3(2048), dim3(256), 0, (cudaStream_t)stream, p, n, what, seed, scale);
}

extern "C" double tcu_copy_bandwidth(size_t bytes, int reps)
{
    void *a = nullptr, *b = nullptr;
    double best = 0.0;
    cudaEvent_t e0, e1;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return 0.0;
    }
    cudaMemset(a, 1, bytes);
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    for (int r = 0; r < reps + 1; r++) {
        cudaEventRecord(e0);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, e0, e1);
        double bw = 2.0 * (double)bytes / (ms * 1e-3);
        if (r > 0 && bw > best) /* first copy is a warm-up */
            best = bw;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    return best;
}
