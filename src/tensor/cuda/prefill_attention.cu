// Tiled attention for prefill chunks: f32 CUDA cores, and TF32 tensor
// cores (the default).
#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kv_typed.cuh"

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

// Elements d4 .. d4 + 3 of kv head kvh's K and V at position kp of a typed
// layer, decoded.
__device__ __forceinline__ void kvt_load4(const tcu_kv &kv, const int32_t *blk, int kp, int kvh, int d4, float4 &k4,
                                          float4 &v4)
{
    int t;
    const size_t o = kvt_off(kv, blk, kp, kvh, &t);
    float x[4];
    kvt_load<4>(kv.lk + o, t, kv.group, d4, x);
    k4 = make_float4(x[0], x[1], x[2], x[3]);
    kvt_load<4>(kv.lv + o, t, kv.group, d4, x);
    v4 = make_float4(x[0], x[1], x[2], x[3]);
}

// A query row's output factor from its running max m and sum l: 1 / l, or
// with the head's sink logit z (tcu_attn_args.sinks) in the denominator,
// once, both rescaled to max(m, z) - the CPU attention's finish.
__device__ __forceinline__ float attn_inv(const tcu_attn_args &a, int h, float m, float l)
{
    if (a.sinks) {
        const float z = a.sinks[h], mm = fmaxf(m, z), x = expf(m - mm);
        return x / (l * x + expf(z - mm));
    }
    return l > 0.0f ? 1.0f / l : 0.0f;
}

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
            if (kp <= kend && a.kv.typed) {
                kvt_load4(a.kv, blk, kp, kvh, d4, kv4, vv4);
            } else if (kp <= kend) {
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
        const float inv = attn_inv(a, h, m[r], l[r]);
#pragma unroll
        for (int d4 = 0; d4 < DV; d4 += 4)
            *reinterpret_cast<float4 *>(out + d4) =
                make_float4(o[r][d4] * inv, o[r][d4 + 1] * inv, o[r][d4 + 2] * inv, o[r][d4 + 3] * inv);
    }
}

template <int HD>
static int attn_tiled_launch(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, cudaStream_t s, bool pdl)
{
    const size_t smem = ((size_t)HD * AQ + (size_t)HD * AK + (size_t)AK * HD + (size_t)AK * AQ) * sizeof(float);
    static bool raised = false;
    if (!raised) {
        cudaFuncSetAttribute(attn_tiled_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        raised = true;
    }
    return launch_pdl(pdl, attn_tiled_kernel<HD>, dim3(a->n_head, n_tiles), dim3(256), smem, s, *a, tiles);
}

// ---- tensor-core tiled attention for prefill chunks (TCU_ATTN_TILED_TF32, the default) ----
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
            if (a.kv.typed) { /* decoded to f32 bits on the way (no cp.async) */
                float4 k4 = make_float4(0, 0, 0, 0), v4 = k4;
                if (kp <= kend)
                    kvt_load4(a.kv, blk, kp, kvh, d4, k4, v4);
                *reinterpret_cast<uint4 *>(ks + kk * LD + d4) =
                    make_uint4(__float_as_uint(k4.x), __float_as_uint(k4.y), __float_as_uint(k4.z), __float_as_uint(k4.w));
                *reinterpret_cast<uint4 *>(vs + kk * LD + d4) =
                    make_uint4(__float_as_uint(v4.x), __float_as_uint(v4.y), __float_as_uint(v4.z), __float_as_uint(v4.w));
                continue;
            }
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
        const float inv = attn_inv(a, h, m[r], l[r]);
        float *out = a.out + ((size_t)(i0 + q) * a.n_head + h) * HD + 2 * t;
#pragma unroll
        for (int j = 0; j < HD / 8; j++)
            *reinterpret_cast<float2 *>(out + 8 * j) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    }
}

template <int HD>
static int attn_tc_launch(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, cudaStream_t s, bool pdl)
{
    const size_t smem = (size_t)(TQ + 2 * TK) * (HD + 4) * sizeof(uint32_t);
    static bool raised = false;
    if (!raised) {
        cudaFuncSetAttribute(attn_tc_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        raised = true;
    }
    return launch_pdl(pdl, attn_tc_kernel<HD>, dim3(a->n_head, n_tiles), dim3(128), smem, s, *a, tiles);
}

extern "C" int tcu_attention_tiled(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, const tcu_opts *opts,
                                   tcu_stream stream)
{
    PROF(TCU_PROF_ATTN, stream);
    const tcu_opts &o = opts_or_default(opts);
    cudaStream_t s = (cudaStream_t)stream;
    const bool pdl = o.pdl != 0;
    if (o.attn_tiled == TCU_ATTN_TILED_OFF)
        return -1;
    if (n_tiles <= 0)
        return 0;
    if (o.attn_tiled == TCU_ATTN_TILED_TF32)
        switch (a->hd) {
        case 64: return attn_tc_launch<64>(a, tiles, n_tiles, s, pdl);
        case 128: return attn_tc_launch<128>(a, tiles, n_tiles, s, pdl);
        case 256: return attn_tc_launch<256>(a, tiles, n_tiles, s, pdl);
        default: return -1;
        }
    switch (a->hd) {
    case 64: return attn_tiled_launch<64>(a, tiles, n_tiles, s, pdl);
    case 128: return attn_tiled_launch<128>(a, tiles, n_tiles, s, pdl);
    case 256: return attn_tiled_launch<256>(a, tiles, n_tiles, s, pdl);
    default: return -1; /* other head dims: the per-token kernel */
    }
}

