// Small kernels and host state: the options' defaults, the per-launch profile, weight
// and activation conversions for the cuBLAS path, embedding, RMSNorm,
// GLU, soft-capping, and the benchmark's fills and copy-bandwidth probe.
#include <stdio.h>

#include "tensor/cuda/common.cuh"

// ---- options ----

extern "C" void tcu_opts_init(tcu_opts *o)
{
    /* each the measured best on the H200 (docs/cuda.md, the numbers in
     * docs/cuda-log.md) */
    memset(o, 0, sizeof *o);
    /* one sequence: the fastest kernel alone; several: tensor cores, 2-4x
     * at 8-32 sequences. 8-bit has no tensor-core path */
    o->gemv_bf16 = TCU_GEMV_AUTO;
    o->gemv_q4 = TCU_GEMV_AUTO;
    o->gemv_q8 = TCU_GEMV_BY_SHAPE;
    o->pdl = 1;             /* 8B bf16 batch 1 +3%, 4-bit +5-7% */
    o->attn_early = 1;      /* +0.6-3% at batch 1, the same bits */
    o->attn_merge_last = 1; /* a launch less a layer */
    o->attn_gqa = 1;        /* typed KV at 8k positions (docs/kv-cache.md) */
    o->attn_tiled = TCU_ATTN_TILED_TF32; /* ~2x the f32 tiles, in the bf16 class of the prefill products */
    /* decode batches up to 32 keep the GEMVs' f32 accuracy (cuBLAS rounds
     * activations to bf16; it is faster from ~32 tokens: b32 8B bf16 3136
     * against 1799 tok/s then); prefill chunks take cuBLAS */
    o->gemm_min_t = 33;
    /* batches of several sequences stay on the (batch-invariant)
     * tensor-core GEMV up to 128 tokens: 4-bit never dequantizes to
     * scratch, steps replay as graphs, the attention splits by each
     * token's own length */
    o->tc_max_t = 128;
    /* ... but 16-bit weights' batches take cuBLASLt without split-K: as
     * batch-invariant, and 8B bf16 products of a b128 step 5.2 against
     * 16.5 ms (docs/cuda.md) */
    o->lt = 1;
    o->f8_tc = 1;
    /* 4-bit batches on the 4-bit tensor-core GEMM (gemm_q4.cu) */
    o->q4_tc = 1;
    /* a K/V row read once for a kv head's q heads and a softmax update a
     * tile of 32 positions: 8B bf16 b128 attention 8.2 -> 4.0 ms a step (1);
     * 16-bit pools' rows copied ahead (2), their products on tensor cores (3) */
    o->attn_tiles = 3;
    o->graphs = 1;
    o->qkv_fuse = 1;   /* one launch less a layer: 8B bf16 b1 +0.7%, 4-bit +1.7% */
    o->gemv_stage = 1; /* the 8B q/k/v launch at 32 tokens spent most of its 73 us splitting in every block */
    /* down's blocks fill the memory gate/up's ragged end leaves idle
     * (+0.3-0.9%); o and lm_head gained nothing, gate/up lost 3%, q/k/v 1.3% */
    o->early = TCU_PROD_DOWN;
    /* gate/up +4.4% (8B) / +6.5% (1B) at batch 1, the 1B down +3.6% (the 8B
     * down's rows do not fit the ring); o, q/k/v and lm_head lost */
    o->ring = TCU_PROD_GU | TCU_PROD_DOWN;
    o->split_len1 = 16; /* one K/V load a warp, requested before the wait; 8 and 32 were slower */
    /* 128-194-token contexts: 128 against 16 splits, 8B bf16 b8 / b32 +7% /
     * +9%, 1B +12% / +14%, 4-bit +7-14% (64 and 32 slower); 256 against
     * 128 on attention tiles 3, b32 / b128 +2.2% / +4.2% (docs/cuda-log.md) */
    o->split_len = 256;
    o->moe = TCU_MOE_DOWN_EARLY | TCU_MOE_WAVES | TCU_MOE_FUSED | TCU_MOE_TC | TCU_MOE_TC_PF; /* docs/cuda.md, "Mixtures of experts" */
    /* q/k/v and gate/up one cuBLASLt GEMM each (docs/cuda.md "Products") */
    o->lt_cat = TCU_CAT_QKV | TCU_CAT_GU;
    o->lt_splitk = 1; /* docs/cuda.md "Products" */
    /* invariant 0: one sequence alone 0.67-0.72x as fast on the batched kernels (docs/cuda-log.md, issue 27) */
}

static const tcu_opts opts_default = [] {
    tcu_opts o;
    tcu_opts_init(&o);
    return o;
}();

const tcu_opts &opts_or_default(const tcu_opts *o) { return o ? *o : opts_default; }

extern "C" const char *tcu_gemv_name(int gemv)
{
    static const char *const names[TCU_GEMV_N] = {"plain", "staged", "by-shape", "tensor", "auto"};
    return gemv >= 0 && gemv < TCU_GEMV_N ? names[gemv] : "?";
}

extern "C" void tcu_opts_format(const tcu_opts *o, char *buf, size_t n)
{
    static const char *const tiled[3] = {"off", "f32", "tf32"};
    snprintf(buf, n,
             "products %s; gemv bf16 %s, 4-bit %s, 8-bit %s; pdl %d; attention early %d, merge in the last block %d, "
             "grouped by kv head %d, "
             "prefill tiles %s; cuBLAS from %d tokens (batches up to %d: GEMVs); 16-bit batches on cuBLASLt %d; FP8 tensor cores %d; 4-bit GEMM %d (tile %d, split %d); batch attention tiles %d (z %d); graphs %d; q/k/v fused %d; stage %d; "
             "early products %d; ring products %d; one-token split %d; batch split %d; moe %d; one sequence as batched %d; cuBLASLt merged %d, split-K %d",
             o->exact ? "exact" : "throughput", tcu_gemv_name(o->gemv_bf16), tcu_gemv_name(o->gemv_q4),
             tcu_gemv_name(o->gemv_q8), o->pdl, o->attn_early, o->attn_merge_last, o->attn_gqa,
             o->attn_tiled >= 0 && o->attn_tiled <= 2 ? tiled[o->attn_tiled] : "?", o->gemm_min_t,
             o->exact ? 0 : o->tc_max_t, o->lt, o->f8_tc, o->q4_tc, o->q4_tile, o->q4_split, o->attn_tiles, o->attn_z, o->graphs, o->qkv_fuse, o->gemv_stage, o->early, o->ring, o->split_len1,
             o->split_len, o->moe, o->invariant, o->lt_cat, o->lt_splitk);
}

// ---- per-launch profile ----

#define PROF_MAX 16384
static int prof_on, prof_n;
static cudaEvent_t prof_ev[2 * PROF_MAX];
static unsigned char prof_cat[PROF_MAX];

int prof_begin(int cat, cudaStream_t s)
{
    if (!prof_on || prof_n >= PROF_MAX)
        return -1;
    const int i = prof_n++;
    if (!prof_ev[2 * i] && (cudaEventCreate(&prof_ev[2 * i]) || cudaEventCreate(&prof_ev[2 * i + 1])))
        return -1;
    prof_cat[i] = (unsigned char)cat;
    cudaEventRecord(prof_ev[2 * i], s);
    return i;
}

void prof_end(int i, cudaStream_t s) { cudaEventRecord(prof_ev[2 * i + 1], s); }

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

int sm_count(void)
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

// ---- weight/activation conversions for the cuBLAS path ----

__device__ __forceinline__ float weight_at(const tcu_mat &m, int n_in, long r, long i)
{
    switch (m.kind) {
    case TCU_F32: return ((const float *)m.w)[r * n_in + i];
    case TCU_BF16: return bf16f(((const uint16_t *)m.w)[r * n_in + i]);
    case TCU_F16: return f16f(((const uint16_t *)m.w)[r * n_in + i]);
    case TCU_F8: {
        const long g = r * ((n_in + m.group - 1) / m.group) + i / m.group;
        return m.sb[2 * g] * f8e4m3_f(((const uint8_t *)m.w)[r * n_in + i]);
    }
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
        const long e = 8 * k, r = e / n_in, i = e % n_in, g = r * ((n_in + m.group - 1) / m.group) + i / m.group;
        const float sc = m.sb[2 * g], bi = m.sb[2 * g + 1];
        const uint8_t *q = (const uint8_t *)m.w;
        uint32_t v[8];
        if (m.kind == TCU_F8) {
            const uint2 w = *reinterpret_cast<const uint2 *>(q + e);
            uint32_t o[4];
#pragma unroll
            for (int p = 0; p < 4; p++) {
                const uint32_t word = p < 2 ? w.x : w.y, sh = 16 * (p & 1);
                o[p] = (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(sc * f8e4m3_f(word >> sh))) |
                       (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(sc * f8e4m3_f(word >> (sh + 8)))) << 16;
            }
            *reinterpret_cast<uint4 *>(out + e) = make_uint4(o[0], o[1], o[2], o[3]);
            continue;
        }
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

extern "C" int tcu_dequant_bf16(const tcu_mat *m, int n_in, uint16_t *out, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long n = (long)m->n_out * n_in;
    if ((m->kind == TCU_Q4 || m->kind == TCU_Q8 || m->kind == TCU_F8) && n_in % 8 == 0 && m->group % 8 == 0)
        return launch_pdl(opts_or_default(o).pdl, dequant8_kernel, dim3(4096), dim3(256), 0, (cudaStream_t)stream, *m,
                          n_in, out, n / 8);
    return launch_pdl(opts_or_default(o).pdl, dequant_kernel, dim3(4096), dim3(256), 0, (cudaStream_t)stream, *m, n_in,
                      out, n);
}

__global__ void to_half_kernel(const float *x, uint16_t *out, long n, int to_f16)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x)
        out[e] = to_f16 ? __half_as_ushort(__float2half_rn(x[e])) : __bfloat16_as_ushort(__float2bfloat16_rn(x[e]));
}

extern "C" int tcu_f32_to_half(const float *x, uint16_t *out, long n, int to_f16, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long blocks = (n + 255) / 256;
    return launch_pdl(opts_or_default(o).pdl, to_half_kernel, dim3((unsigned)(blocks < 4096 ? blocks : 4096)),
                      dim3(256), 0, (cudaStream_t)stream, x, out, n, to_f16);
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
                         const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_EMBED, stream);
    /* a block a token's 256-value slice (one block a token took ~9 us at batch 1) */
    const unsigned nb = (unsigned)((n_in + 255) / 256);
    return launch_pdl(opts_or_default(o).pdl, embed_kernel, dim3(T, nb < 64 ? nb : 64), dim3(256), 0,
                      (cudaStream_t)stream, *w, n_in, tokens, scale, x);
}

// ---- normalization and elementwise ----

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
                           float eps, int add, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_NORM, stream);
    if (n_rows <= 0)
        return 0;
    return launch_pdl(opts_or_default(o).pdl, rmsnorm_kernel, dim3(n_rows), dim3(256), 0, (cudaStream_t)stream, x, rows,
                      g, out, n, eps, add);
}

// RMSNorm of a row kept in registers (float4 loads, V of them a thread),
// written as f32 (out) and as 16-bit (outh): the input of a cuBLASLt
// product. A block a row.
template <int V>
__global__ void __launch_bounds__(256) rmsnorm_half_kernel(const float *x, const int32_t *rows, const float *g,
                                                           float *out, uint16_t *outh, int n, float eps, int to_f16)
{
    pdl_wait();
    pdl_trigger();
    const int j = blockIdx.x, n4 = n / 4;
    const float4 *xr = (const float4 *)(x + (size_t)(rows ? rows[j] : j) * n);
    float4 v[V];
    double ss = 0.0;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int e = threadIdx.x + k * blockDim.x;
        v[k] = e < n4 ? xr[e] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        ss += (double)v[k].x * v[k].x + (double)v[k].y * v[k].y + (double)v[k].z * v[k].z + (double)v[k].w * v[k].w;
    }
    ss = block_sum_d(ss);
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    const float4 *g4 = (const float4 *)g;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int e = threadIdx.x + k * blockDim.x;
        if (e >= n4)
            break;
        const float4 gg = g4[e];
        const float o[4] = {(v[k].x * r) * gg.x, (v[k].y * r) * gg.y, (v[k].z * r) * gg.z, (v[k].w * r) * gg.w};
        ((float4 *)(out + (size_t)j * n))[e] = make_float4(o[0], o[1], o[2], o[3]);
        uint16_t h[4];
        for (int c = 0; c < 4; c++)
            h[c] = to_f16 ? __half_as_ushort(__float2half_rn(o[c])) : __bfloat16_as_ushort(__float2bfloat16_rn(o[c]));
        ((uint2 *)(outh + (size_t)j * n))[e] =
            make_uint2((unsigned)h[0] | (unsigned)h[1] << 16, (unsigned)h[2] | (unsigned)h[3] << 16);
    }
}

extern "C" int tcu_rmsnorm_half(const float *x, const int32_t *rows, const float *g, float *out, uint16_t *outh,
                                int n_rows, int n, float eps, int to_f16, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_NORM, stream);
    if (n_rows <= 0)
        return 0;
    const cudaStream_t s = (cudaStream_t)stream;
    const int pdl = opts_or_default(o).pdl;
    if (n % 4 == 0 && n <= 4 * 256 * 4)
        return launch_pdl(pdl, rmsnorm_half_kernel<4>, dim3(n_rows), dim3(256), 0, s, x, rows, g, out, outh, n, eps,
                          to_f16);
    if (n % 4 == 0 && n <= 4 * 256 * 16)
        return launch_pdl(pdl, rmsnorm_half_kernel<16>, dim3(n_rows), dim3(256), 0, s, x, rows, g, out, outh, n, eps,
                          to_f16);
    int rc = tcu_rmsnorm(x, rows, g, out, n_rows, n, eps, 0, o, stream);
    return rc ? rc : tcu_f32_to_half(out, outh, (long)n_rows * n, to_f16, o, stream);
}

__global__ void glu_kernel(float *gate, const float *up, long n, int gelu)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x)
        gate[e] = (gelu ? gelu_f(gate[e]) : silu_f(gate[e])) * up[e];
}

extern "C" int tcu_glu(float *gate, const float *up, long n, int gelu, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long blocks = (n + 255) / 256;
    return launch_pdl(opts_or_default(o).pdl, glu_kernel, dim3((unsigned)(blocks < 8192 ? blocks : 8192)), dim3(256), 0,
                      (cudaStream_t)stream, gate, up, n, gelu);
}

static int cat_launches; /* tcu_cat_launches (glu_half here, qkv_post in decode.cu) */

void tcu_cat_count(void) { cat_launches++; }

extern "C" int tcu_cat_launches(void) { return cat_launches; }

// glu_kernel over rows ld apart, also writing the result as 16-bit (the
// next product's input): blockIdx.y strides the rows, x the columns.
__global__ void glu_half_kernel(float *act, const float *gate, const float *up, long ld, uint16_t *outh, int n_rows,
                                int n, int gelu, int to_f16)
{
    pdl_wait();
    pdl_trigger();
    for (int t = blockIdx.y; t < n_rows; t += gridDim.y)
        for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
            const float g = gate[(size_t)t * ld + e], u = up[(size_t)t * ld + e];
            const float v = (gelu ? gelu_f(g) : silu_f(g)) * u;
            if (act)
                act[(size_t)t * n + e] = v;
            outh[(size_t)t * n + e] =
                to_f16 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
        }
}

extern "C" int tcu_glu_half(float *act, const float *gate, const float *up, long ld, uint16_t *outh, int n_rows, int n,
                            int gelu, int to_f16, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    if (n_rows <= 0 || n <= 0)
        return 0;
    if (ld < n)
        return (int)cudaErrorInvalidValue;
    if (ld > n)
        tcu_cat_count();
    const int bx = (n + 255) / 256;
    /* about 8192 blocks at most, as tcu_glu */
    const int by = n_rows < 8192 / bx + 1 ? n_rows : 8192 / bx + 1;
    return launch_pdl(opts_or_default(o).pdl, glu_half_kernel, dim3((unsigned)bx, (unsigned)(by < 65535 ? by : 65535)),
                      dim3(256), 0, (cudaStream_t)stream, act, gate, up, ld, outh, n_rows, n, gelu, to_f16);
}

__global__ void add_bias_kernel(float *x, const float *b, long total, int n)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (long)gridDim.x * blockDim.x)
        x[e] += b[e % n];
}

extern "C" int tcu_add_bias(float *x, const float *b, int n_rows, int n, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    const long total = (long)n_rows * n, blocks = (total + 255) / 256;
    if (total <= 0)
        return 0;
    return launch_pdl(opts_or_default(o).pdl, add_bias_kernel, dim3((unsigned)(blocks < 8192 ? blocks : 8192)),
                      dim3(256), 0, (cudaStream_t)stream, x, b, total, n);
}

__global__ void softcap_kernel(float *x, long n, float c)
{
    pdl_wait();
    pdl_trigger();
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (long)gridDim.x * blockDim.x)
        x[e] = c * tanhf(x[e] / c);
}

extern "C" int tcu_softcap(float *x, long n, float c, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_OTHER, stream);
    long blocks = (n + 255) / 256;
    return launch_pdl(opts_or_default(o).pdl, softcap_kernel, dim3((unsigned)(blocks < 8192 ? blocks : 8192)),
                      dim3(256), 0, (cudaStream_t)stream, x, n, c);
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
    return launch_pdl(false, fill_kernel, dim3(2048), dim3(256), 0, (cudaStream_t)stream, p, n, what, seed, scale);
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

