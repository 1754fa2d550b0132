// The decode path's attention: q/k/v post-processing with the KV write,
// and paged flash-decoding attention (split positions, merged by the last
// block of a token's head) with the q/k/v post-processing optionally fused
// in.
#include "tensor/cuda/gemv.cuh"
#include "tensor/cuda/kv_typed.cuh"

// ---- q/k/v post-processing and the KV write ----

#define QKV_THREADS 128

// RoPE's factor on cos and sin (tcu_qkv_args.rope_af: 0 reads as 1).
__device__ __forceinline__ float qkv_af(const tcu_qkv_args &a) { return a.rope_af != 0.0f ? a.rope_af : 1.0f; }

// Token i's head h (q heads, then k heads) of the q/k/v post-processing by a
// group of QKV_THREADS threads: dst = src + bias, normed, rotated at p (dst
// may be src; src read through L2, a habit of the one-launch decode step
// that once ran it too). The same arithmetic in the same order wherever it
// runs.
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
            const float ang = (float)p * a.inv_freq[e], af = qkv_af(a);
            c = cosf(ang) * af;
            s = sinf(ang) * af;
        }
        float x0 = dst[e], x1 = dst[e + half];
        dst[e] = x0 * c - x1 * s;
        dst[e + half] = x1 * c + x0 * s;
    }
    g.sync();
}

// Token i's V row of kv head kh with its bias (rows a.ld apart, 0: n_kv*hd).
__device__ __forceinline__ float qkv_v(const tcu_qkv_args &a, int i, int kh, int e)
{
    const size_t o = (size_t)kh * a.hd + e, ld = a.ld > 0 ? (size_t)a.ld : (size_t)a.n_kv_head * a.hd;
    return __ldcg(a.v + (size_t)i * ld + o) + (a.bv ? a.bv[o] : 0.0f);
}

// grid (T, n_head + n_kv_head), block QKV_THREADS: one head of one token.
__global__ void __launch_bounds__(QKV_THREADS) qkv_post_kernel(const tcu_qkv_args a)
{
    pdl_wait();
    pdl_trigger();
    int i = blockIdx.x, h = blockIdx.y, hd = a.hd;
    int is_q = h < a.n_head, kh = is_q ? h : h - a.n_head;
    int qd = a.n_head * hd, kvd = a.n_kv_head * hd;
    /* the head's row in the product's outputs (rows ld apart when given),
     * and where it goes: q to q_out when ld is given, k in place */
    const size_t ldq = a.ld > 0 ? (size_t)a.ld : (size_t)qd, ldk = a.ld > 0 ? (size_t)a.ld : (size_t)kvd;
    const float *src = is_q ? a.q + (size_t)i * ldq + (size_t)kh * hd : a.k + (size_t)i * ldk + (size_t)kh * hd;
    float *vec = is_q ? (a.ld > 0 ? a.q_out : a.q) + (size_t)i * qd + (size_t)kh * hd : (float *)src;
    /* the position and the K/V cache slot first: their loads (block table
     * included) overlap the work below instead of following it */
    const int p = a.pos[i];
    size_t o = 0;
    int t = TCU_KV_F32;
    if (!is_q)
        o = a.kv.typed ? kvt_off(a.kv, a.blk + a.bt_off[i], p, kh, &t)
                       : kv_off(a.kv, a.layer, a.blk + a.bt_off[i], p) + (size_t)kh * hd;
    __shared__ double sh[32];
    qkv_head(blk_grp{}, a, h, src, vec, p, sh);
    if (is_q)
        return;
    if (a.kv.typed) { /* encoded from shared copies: a group's thread reads the whole group */
        __shared__ float skv[2][TCU_KV_HEAD_MAX];
        for (int e = threadIdx.x; e < hd; e += blockDim.x) {
            skv[0][e] = __ldcg(vec + e);
            skv[1][e] = qkv_v(a, i, kh, e);
        }
        __syncthreads();
        if (a.kv.rot) {
            kvt_rotate(skv[0], hd, false);
            kvt_rotate(skv[1], hd, false);
        }
        kvt_encode(t, a.kv.group, hd, skv[0], a.kv.lk + o, threadIdx.x, blockDim.x);
        kvt_encode(t, a.kv.group, hd, skv[1], a.kv.lv + o, threadIdx.x, blockDim.x);
        return;
    }
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        a.kv.k[o + e] = vec[e];
        a.kv.v[o + e] = qkv_v(a, i, kh, e);
    }
}

extern "C" int tcu_qkv_post(const tcu_qkv_args *a, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_QKV, stream);
    if (a->ld > 0 && (!a->q_out || a->ld < (a->n_head + 2 * a->n_kv_head) * a->hd))
        return (int)cudaErrorInvalidValue;
    if (a->ld > 0)
        tcu_cat_count();
    dim3 grid(a->T, a->n_head + a->n_kv_head);
    return launch_pdl(opts_or_default(o).pdl, qkv_post_kernel, grid, dim3(QKV_THREADS), 0, (cudaStream_t)stream, *a);
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

// A whole block's arrival at (token i, heads h0 ..): true in the last of
// the ns blocks to arrive (block-uniform), which then merges the parts (in
// a fixed order, whichever block it is); the counter is reset for the next
// launch. The block's parts are written before the call.
__device__ __forceinline__ bool attn_arrive(int slot, size_t at, int ns)
{
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *c = &att_count[slot][at];
        last = atomicAdd(c, 1) == ns - 1;
        if (last)
            *c = 0;
    }
    __syncthreads();
    const bool r = last;
    if (r)
        __threadfence();
    return r;
}

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
            if (t < s1 && !(POST && t == p) && a.kv.typed) {
                int ty;
                const size_t o = kvt_off(a.kv, blk, t, kvh, &ty);
                kvt_load<D>(a.kv.lk + o, ty, a.kv.group, lane * D, kr[j]);
                kvt_load<D>(a.kv.lv + o, ty, a.kv.group, lane * D, vr[j]);
            } else if (t < s1 && !(POST && t == p)) {
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
        const float ang = (float)p * post.inv_freq[g.tid()], af = qkv_af(post);
        pc = cosf(ang) * af;
        ps = sinf(ang) * af;
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

// out[i][h][e] from the parts of (token i, head h), in split order, with the
// head's sink logit in the denominator where there is one.
// Reads through L2 (the parts may come from other blocks of this grid).
#define ATT_MERGE_MAX 16 /* splits merged from registers (one memory round trip) */

// An output element, and its 16-bit copy for the next product
// (tcu_attn_args.out_h).
__device__ __forceinline__ void attn_store(const tcu_attn_args &a, size_t x, float r)
{
    a.out[x] = r;
    if (a.out_h)
        a.out_h[x] = a.out_h_f16 ? __half_as_ushort(__float2half_rn(r)) : __bfloat16_as_ushort(__float2bfloat16_rn(r));
}

__device__ __forceinline__ void attn_merge_one(const tcu_attn_args &a, int h, int i, int e)
{
    const int hd = a.hd, n = attn_splits(a, attn_len(a, a.pos[i]));
    const float *part = a.part + ((size_t)i * a.n_head + h) * a.n_split * (hd + 2);
    /* the head's sink (tcu_attn_args.sinks) joins the maximum and, once,
     * the denominator - after every split, so whatever the number of
     * splits; -inf (none) leaves both as they were */
    const float sink = a.sinks ? a.sinks[h] : -INFINITY;
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
        float M = sink;
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
        if (a.sinks)
            L += expf(sink - M);
        attn_store(a, ((size_t)i * a.n_head + h) * hd + e, v / L);
        return;
    }
    float M = sink;
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
    if (a.sinks)
        L += expf(sink - M);
    attn_store(a, ((size_t)i * a.n_head + h) * hd + e, v / L);
}

// grid (n_head, T), block hd threads.
__global__ void attn_merge_kernel(const tcu_attn_args a)
{
    pdl_wait();
    pdl_trigger();
    attn_merge_one(a, blockIdx.x, blockIdx.y, threadIdx.x);
}

// ---- typed KV, grouped by kv head ----
//
// A typed pool's decode attention: one block per (kv head, token, split)
// does every q head of the kv head (GQ of them, GQ <= GQM): each K/V row is
// loaded and decoded once for the group, not once per q head, and GQ scores
// share its registers. ATT_GQA_WARPS warps a block walk the split's
// positions as attn_part's warps do (ATT_U in flight a warp); the next
// batch's row offsets (block table reads) are computed while the current
// batch's rows load. The partials and the merge are attn_part's (same
// layout, same counters: the last block of a (token, kv head) merges its
// GQ heads).
#define ATT_GQA_WARPS 16
#define ATT_GQA_ROUND 8 /* warps whose accumulators meet in shared memory at once */

template <int D, int GQM>
__global__ void __launch_bounds__(ATT_GQA_WARPS *WARP) attn_gqa_kernel(const tcu_attn_args a, int slot)
{
    __shared__ float sacc[ATT_GQA_ROUND][GQM * D * WARP];
    __shared__ float sm[ATT_GQA_WARPS][GQM], sl[ATT_GQA_WARPS][GQM];
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int hd = a.hd, gq = a.n_head / a.n_kv_head, kvh = blockIdx.x, i = blockIdx.y, sp = blockIdx.z;
    const int p = a.pos[i];
    const int len = attn_len(a, p), start = p + 1 - len, ns = attn_splits(a, len);
    if (sp >= ns)
        return;
    const int chunk = (len + ns - 1) / ns;
    const int s0 = start + sp * chunk, s1 = s0 + chunk < p + 1 ? s0 + chunk : p + 1;
    const int32_t *blk = a.blk + a.bt_off[i];
    float qr[GQM][D], acc[GQM][D], m[GQM], l[GQM];
#pragma unroll
    for (int g = 0; g < GQM; g++) {
        const float *q = a.q + ((size_t)i * a.n_head + kvh * gq + (g < gq ? g : 0)) * hd + lane * D;
#pragma unroll
        for (int d = 0; d < D; d++) {
            qr[g][d] = q[d];
            acc[g][d] = 0.0f;
        }
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    size_t off[ATT_U];
    int ty[ATT_U];
    auto offsets = [&](int t0) {
#pragma unroll
        for (int j = 0; j < ATT_U; j++) {
            const int t = t0 + j * ATT_GQA_WARPS;
            off[j] = t < s1 ? kvt_off(a.kv, blk, t, kvh, &ty[j]) : 0;
        }
    };
    float kr[ATT_U][D], vr[ATT_U][D];
    offsets(s0 + w);
    for (int t0 = s0 + w; t0 < s1; t0 += ATT_U * ATT_GQA_WARPS) {
#pragma unroll
        for (int j = 0; j < ATT_U; j++)
            if (t0 + j * ATT_GQA_WARPS < s1) {
                kvt_load<D>(a.kv.lk + off[j], ty[j], a.kv.group, lane * D, kr[j]);
                kvt_load<D>(a.kv.lv + off[j], ty[j], a.kv.group, lane * D, vr[j]);
            }
        offsets(t0 + ATT_U * ATT_GQA_WARPS);
#pragma unroll
        for (int j = 0; j < ATT_U; j++) {
            if (t0 + j * ATT_GQA_WARPS >= s1)
                break;
#pragma unroll
            for (int g = 0; g < GQM; g++) {
                if (g >= gq)
                    break;
                float s = 0.0f;
#pragma unroll
                for (int d = 0; d < D; d++)
                    s = fmaf(qr[g][d], kr[j][d], s);
                s = warp_sum(s) * a.scale;
                if (a.softcap > 0)
                    s = a.softcap * tanhf(s / a.softcap);
                const float mn = fmaxf(m[g], s), corr = expf(m[g] - mn), e = expf(s - mn);
                l[g] = l[g] * corr + e;
#pragma unroll
                for (int d = 0; d < D; d++)
                    acc[g][d] = acc[g][d] * corr + e * vr[j][d];
                m[g] = mn;
            }
        }
    }
    // Merge the warps' partial softmaxes, head by head: the maxima and sums
    // first, then the accumulators ATT_GQA_ROUND warps at a time through
    // shared memory (every element summed over the warps in warp order).
    if (lane == 0)
#pragma unroll
        for (int g = 0; g < GQM; g++) {
            sm[w][g] = m[g];
            sl[w][g] = l[g];
        }
    constexpr int XPT = (GQM * D + ATT_GQA_WARPS - 1) / ATT_GQA_WARPS; /* elements a thread merges */
    const int nx = gq * hd;
    float v[XPT];
#pragma unroll
    for (int k = 0; k < XPT; k++)
        v[k] = 0.0f;
    for (int r = 0; r < ATT_GQA_WARPS / ATT_GQA_ROUND; r++) {
        if (w / ATT_GQA_ROUND == r)
#pragma unroll
            for (int g = 0; g < GQM; g++) {
                if (g >= gq)
                    break;
#pragma unroll
                for (int d = 0; d < D; d++)
                    sacc[w % ATT_GQA_ROUND][g * hd + lane * D + d] = acc[g][d];
            }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < XPT; k++) {
            const int x = threadIdx.x + k * ATT_GQA_WARPS * WARP;
            if (x >= nx)
                break;
            const int g = x / hd;
            float M = -INFINITY;
            for (int u = 0; u < ATT_GQA_WARPS; u++)
                M = fmaxf(M, sm[u][g]);
            for (int u = 0; u < ATT_GQA_ROUND; u++)
                if (sm[r * ATT_GQA_ROUND + u][g] > -INFINITY)
                    v[k] += expf(sm[r * ATT_GQA_ROUND + u][g] - M) * sacc[u][x];
        }
        __syncthreads();
    }
#pragma unroll
    for (int k = 0; k < XPT; k++) {
        const int x = threadIdx.x + k * ATT_GQA_WARPS * WARP;
        if (x >= nx)
            break;
        const int g = x / hd, e = x % hd;
        float *part = a.part + (((size_t)i * a.n_head + kvh * gq + g) * a.n_split + sp) * (hd + 2);
        part[2 + e] = v[k];
        if (e == 0) {
            float M = -INFINITY, L = 0.0f;
            for (int u = 0; u < ATT_GQA_WARPS; u++)
                M = fmaxf(M, sm[u][g]);
            for (int u = 0; u < ATT_GQA_WARPS; u++)
                if (sm[u][g] > -INFINITY)
                    L += expf(sm[u][g] - M) * sl[u][g];
            part[0] = M;
            part[1] = L;
        }
    }
    if (slot < 0 || !attn_arrive(slot, (size_t)i * a.n_head + kvh * gq, ns))
        return;
    for (int x = threadIdx.x; x < gq * hd; x += blockDim.x)
        attn_merge_one(a, kvh * gq + x / hd, i, x % hd);
}

template <int D, int GQM>
static int attn_gqa_one(const tcu_attn_args *a, int slot, const tcu_opts &o, cudaStream_t s)
{
    return launch_pdl(o.pdl, attn_gqa_kernel<D, GQM>, dim3(a->n_kv_head, a->T, a->n_split),
                      dim3(ATT_GQA_WARPS * WARP), 0, s, *a, slot);
}

// The grouped kernel for a typed pool, -1 where none fits (groups of 2 to
// 8 q heads, head_dim 64, 128 or 256, GQ * D <= 32 registers).
static int attn_gqa_launch(const tcu_attn_args *a, int slot, const tcu_opts &o, cudaStream_t s)
{
    const int gq = a->n_head / a->n_kv_head, D = a->hd / 32;
    if (a->n_head % a->n_kv_head || gq > 8 || a->hd % 32)
        return -1;
    if (gq < 2 || D < 2 || D > 8 || D & (D - 1)) /* no group: the kernel of a q head does the same reads */
        return -1;
    const int gqm = gq <= 2 ? 2 : gq <= 4 ? 4 : 8;
    if (gqm * D > 32)
        return -1;
    switch (D * 16 + gqm) {
    case 2 * 16 + 2: return attn_gqa_one<2, 2>(a, slot, o, s);
    case 2 * 16 + 4: return attn_gqa_one<2, 4>(a, slot, o, s);
    case 2 * 16 + 8: return attn_gqa_one<2, 8>(a, slot, o, s);
    case 4 * 16 + 2: return attn_gqa_one<4, 2>(a, slot, o, s);
    case 4 * 16 + 4: return attn_gqa_one<4, 4>(a, slot, o, s);
    case 4 * 16 + 8: return attn_gqa_one<4, 8>(a, slot, o, s);
    case 8 * 16 + 2: return attn_gqa_one<8, 2>(a, slot, o, s);
    case 8 * 16 + 4: return attn_gqa_one<8, 4>(a, slot, o, s);
    default: return -1;
    }
}

// Steps of several sequences (tcu_attn_args.tiles): one block per (kv
// head, token, split) does every q head of the kv head over tiles of
// ATT_TP positions. The block loads a tile's K and V rows once (decoded to
// f32 in shared memory: a row read once for the group, whatever the pool's
// type), then each warp takes its q heads: lane j scores position j, the
// tile's softmax update is one max and one sum over the warp, and each lane
// adds the tile's p_j V_j to its D dims in position order. One token's sums
// depend on its own positions and splits only. Partials and merge as
// attn_part's.
#define ATT_T_WARPS 4
#define ATT_TP 32

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <int D, int HPW>
__global__ void __launch_bounds__(ATT_T_WARPS *WARP) attn_tile_kernel(const tcu_attn_args a, int slot)
{
    constexpr int HD = D * WARP, KS = HD + 4; /* K rows padded: lane j's float4 reads of row j hit distinct banks */
    __shared__ __align__(16) float Ks[ATT_TP][KS];
    __shared__ __align__(16) float Vs[ATT_TP][HD];
    __shared__ __align__(16) float Qs[ATT_T_WARPS * HPW][HD];
    __shared__ float Ps[ATT_T_WARPS][ATT_TP];
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int gq = a.n_head / a.n_kv_head, kvh = blockIdx.x, i = blockIdx.y, sp = blockIdx.z;
    const int p = a.pos[i];
    const int len = attn_len(a, p), start = p + 1 - len, ns = attn_splits(a, len);
    if (sp >= ns)
        return;
    const int chunk = (len + ns - 1) / ns;
    const int s0 = start + sp * chunk, s1 = s0 + chunk < p + 1 ? s0 + chunk : p + 1;
    const int32_t *blk = a.blk + a.bt_off[i];
    for (int x = threadIdx.x; x < gq * HD; x += blockDim.x)
        Qs[x / HD][x % HD] = a.q[((size_t)i * a.n_head + kvh * gq + x / HD) * HD + x % HD];
    float acc[HPW][D], m[HPW], l[HPW];
#pragma unroll
    for (int h = 0; h < HPW; h++) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int d = 0; d < D; d++)
            acc[h][d] = 0.0f;
    }
    for (int t0 = s0; t0 < s1; t0 += ATT_TP) {
        const int nt = s1 - t0 < ATT_TP ? s1 - t0 : ATT_TP;
        __syncthreads(); /* the previous tile is used */
        /* a row at a time: loading 4 or 8 of a warp's rows together
         * measured slower (docs/cuda-log.md) */
        for (int r = w; r < ATT_TP; r += ATT_T_WARPS) {
            float kr[D], vr[D];
            if (r < nt && a.kv.typed) {
                int ty;
                const size_t o = kvt_off(a.kv, blk, t0 + r, kvh, &ty);
                kvt_load<D>(a.kv.lk + o, ty, a.kv.group, lane * D, kr);
                kvt_load<D>(a.kv.lv + o, ty, a.kv.group, lane * D, vr);
            } else if (r < nt) {
                const size_t o = kv_off(a.kv, a.layer, blk, t0 + r) + (size_t)kvh * HD + lane * D;
#pragma unroll
                for (int d = 0; d < D; d++) {
                    kr[d] = a.kv.k[o + d];
                    vr[d] = a.kv.v[o + d];
                }
            } else {
#pragma unroll
                for (int d = 0; d < D; d++)
                    kr[d] = vr[d] = 0.0f;
            }
#pragma unroll
            for (int d = 0; d < D; d++) {
                Ks[r][lane * D + d] = kr[d];
                Vs[r][lane * D + d] = vr[d];
            }
        }
        __syncthreads();
#pragma unroll
        for (int h = 0; h < HPW; h++) {
            const int g = w * HPW + h;
            if (g >= gq)
                break;
            const float4 *k4 = reinterpret_cast<const float4 *>(&Ks[lane][0]);
            const float4 *q4 = reinterpret_cast<const float4 *>(&Qs[g][0]);
            float sc = 0.0f;
#pragma unroll 8
            for (int d4 = 0; d4 < HD / 4; d4++) {
                const float4 k = k4[d4], q = q4[d4];
                sc = fmaf(q.x, k.x, sc);
                sc = fmaf(q.y, k.y, sc);
                sc = fmaf(q.z, k.z, sc);
                sc = fmaf(q.w, k.w, sc);
            }
            sc *= a.scale;
            if (a.softcap > 0)
                sc = a.softcap * tanhf(sc / a.softcap);
            if (lane >= nt)
                sc = -INFINITY;
            const float mn = fmaxf(m[h], warp_max(sc)), corr = expf(m[h] - mn);
            const float e = lane < nt ? expf(sc - mn) : 0.0f;
            l[h] = l[h] * corr + warp_sum(e);
            m[h] = mn;
            Ps[w][lane] = e;
            __syncwarp();
#pragma unroll
            for (int d = 0; d < D; d++)
                acc[h][d] *= corr;
            for (int j = 0; j < nt; j++) {
                const float pj = Ps[w][j];
#pragma unroll
                for (int d = 0; d < D; d++)
                    acc[h][d] = fmaf(pj, Vs[j][lane * D + d], acc[h][d]);
            }
            __syncwarp();
        }
    }
#pragma unroll
    for (int h = 0; h < HPW; h++) {
        const int g = w * HPW + h;
        if (g >= gq)
            break;
        float *part = a.part + (((size_t)i * a.n_head + kvh * gq + g) * a.n_split + sp) * (HD + 2);
#pragma unroll
        for (int d = 0; d < D; d++)
            part[2 + lane * D + d] = acc[h][d];
        if (lane == 0) {
            part[0] = m[h];
            part[1] = l[h];
        }
    }
    if (slot < 0 || !attn_arrive(slot, (size_t)i * a.n_head + kvh * gq, ns))
        return;
    for (int x = threadIdx.x; x < gq * HD; x += blockDim.x)
        attn_merge_one(a, kvh * gq + x / HD, i, x % HD);
}

// Steps of several sequences over a 16-bit pool (tcu_attn_args.tiles 2):
// one block per (kv head, token, split), ATB_WARPS warps each taking 32 of
// the split's positions a pass (positions w * 32 + k * 128 from the split's
// start). A warp copies its rows' K and V bytes as stored into its own
// shared slots with cp.async - every row of the pass in flight at once, no
// registers held, V still arriving while the scores are summed - then lane j
// scores position j for every q head of the kv head (the K row read once
// for the group), one max and one sum over the warp a head, and each lane
// adds p_j V_j to its D dims in position order. The warps' (max, sum,
// values) are merged in warp order into the split's part, whose merge is
// attn_part's. A token's sums depend on its own positions and splits only
// (batch-invariant). Blocks walk splits blockIdx.z, + gridDim.z, ... (a grid
// of the splits a step needs, not of n_split).
#define ATB_WARPS 4
#define ATB_TP 32

// Dynamic shared memory of attn_b16_kernel<D, GQ>, in 32-bit words: a
// warp's K rows (padded by 16 bytes: lane j's 16-byte reads of row j hit
// distinct banks) and V rows, then the q heads (f32), then each warp's
// probabilities.
__host__ __device__ constexpr int atb_krw(int hd) { return hd / 2 + 4; }
__host__ __device__ constexpr int atb_warp_words(int hd) { return ATB_TP * (atb_krw(hd) + hd / 2); }
__host__ __device__ constexpr size_t atb_smem(int hd, int gq)
{
    return ((size_t)ATB_WARPS * atb_warp_words(hd) + (size_t)gq * hd + (size_t)ATB_WARPS * gq * ATB_TP) * 4;
}

// Elements 2k and 2k + 1 of a 16-bit pair word.
__device__ __forceinline__ float b16_lo(uint32_t u, bool f16)
{
    return f16 ? __half2float(__ushort_as_half((unsigned short)(u & 0xffffu))) : __uint_as_float(u << 16);
}
__device__ __forceinline__ float b16_hi(uint32_t u, bool f16)
{
    return f16 ? __half2float(__ushort_as_half((unsigned short)(u >> 16))) : __uint_as_float(u & 0xffff0000u);
}

// A warp's copies of one pass: rows t0 .. t0 + nt - 1 (the rest of its
// ATB_TP slots zero) of K into Kw, then of V into Vw, as stored - two
// commit groups, so that the scores can start while V arrives.
template <int HD, int VRW = HD / 2>
__device__ __forceinline__ void atb_copy(const tcu_attn_args &a, const int32_t *blk, int kvh, int t0, int nt,
                                         int lane, uint32_t *Kw, uint32_t *Vw)
{
    constexpr int CPR = HD / 8, RPP = WARP / CPR;
    unsigned long long off = 0; /* lane j: row j's byte offset */
    if (lane < nt) {
        int ty;
        off = kvt_off(a.kv, blk, t0 + lane, kvh, &ty);
    }
    /* lane copies 16-byte piece lane % CPR of rows lane / CPR + k RPP */
#pragma unroll
    for (int kv = 0; kv < 2; kv++) {
#pragma unroll
        for (int k = 0; k < ATB_TP / RPP; k++) {
            const int r = k * RPP + lane / CPR, c = lane % CPR;
            const unsigned long long o = __shfl_sync(0xffffffffu, off, r);
            uint32_t *dst = kv ? Vw + r * VRW + c * 4 : Kw + r * atb_krw(HD) + c * 4;
            cp_async16(dst, (kv ? a.kv.lv : a.kv.lk) + (r < nt ? o + c * 16 : 0), r < nt ? 16 : 0);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
}

// A split's part from its warps' states (Mg: state (warp u, head h) at
// (u gq + h)(HD + 2) floats: max, sum, HD values; written before the
// call), merged in warp order; the last of the ns blocks of (token, kv
// head) to arrive merges the parts (a single split's block without the
// counter).
template <int HD>
__device__ __forceinline__ void atb_part(const tcu_attn_args &a, const float *Mg, int gq, int i, int kvh, int sp,
                                         int ns, int slot)
{
    __syncthreads();
    for (int x = threadIdx.x; x < gq * HD; x += blockDim.x) {
        const int h = x / HD, e = x % HD;
        float M = -INFINITY, L = 0.0f, v = 0.0f;
#pragma unroll
        for (int u = 0; u < ATB_WARPS; u++)
            M = fmaxf(M, Mg[(size_t)(u * gq + h) * (HD + 2)]);
#pragma unroll
        for (int u = 0; u < ATB_WARPS; u++) {
            const float *g = Mg + (size_t)(u * gq + h) * (HD + 2);
            if (g[0] > -INFINITY) {
                const float f = expf(g[0] - M);
                L += f * g[1];
                v += f * g[2 + e];
            }
        }
        float *part = a.part + (((size_t)i * a.n_head + kvh * gq + h) * a.n_split + sp) * (HD + 2);
        part[2 + e] = v;
        if (e == 0) {
            part[0] = M;
            part[1] = L;
        }
    }
    if (slot < 0)
        return;
    if (ns == 1) /* the only part: this block's writes, visible to it past the barrier */
        __syncthreads();
    if (ns == 1 || attn_arrive(slot, (size_t)i * a.n_head + kvh * gq, ns))
        for (int x = threadIdx.x; x < gq * HD; x += blockDim.x)
            attn_merge_one(a, kvh * gq + x / HD, i, x % HD);
}

// Token i's positions for the batch tiles: its own position p, the first
// attended start, its ns splits of chunk positions, its block table.
struct atb_span {
    int p, start, ns, chunk;
    const int32_t *blk;
};
__device__ __forceinline__ atb_span atb_span_of(const tcu_attn_args &a, int i)
{
    atb_span r;
    r.p = a.pos[i];
    const int len = attn_len(a, r.p);
    r.start = r.p + 1 - len;
    r.ns = attn_splits(a, len);
    r.chunk = (len + r.ns - 1) / r.ns;
    r.blk = a.blk + a.bt_off[i];
    return r;
}

template <int D, int GQ>
__global__ void __launch_bounds__(ATB_WARPS *WARP) attn_b16_kernel(const tcu_attn_args a, int slot)
{
    constexpr int HD = D * WARP, KRW = atb_krw(HD), VRW = HD / 2, CPR = HD / 8;
    extern __shared__ __align__(16) uint32_t atb_sm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int gq = a.n_head / a.n_kv_head, kvh = blockIdx.x, i = blockIdx.y;
    uint32_t *const Kw = atb_sm + (size_t)w * atb_warp_words(HD), *const Vw = Kw + ATB_TP * KRW;
    float *const Qs = reinterpret_cast<float *>(atb_sm + ATB_WARPS * atb_warp_words(HD));
    float *const Pw = Qs + GQ * HD + w * GQ * ATB_TP;
    float *const Mg = reinterpret_cast<float *>(atb_sm); /* the warps' states, over the rows once used */
    const bool f16 = a.kv.type == TCU_KV_F16;
    pdl_wait();
    pdl_trigger();
    const atb_span sp_ = atb_span_of(a, i);
    if ((int)blockIdx.z >= sp_.ns)
        return;
    const int p = sp_.p, start = sp_.start, ns = sp_.ns, chunk = sp_.chunk;
    const int32_t *blk = sp_.blk;
    for (int x = threadIdx.x; x < gq * HD; x += blockDim.x)
        Qs[x] = a.q[((size_t)i * a.n_head + kvh * gq) * HD + x];
    __syncthreads();
    const float4 *Q4 = reinterpret_cast<const float4 *>(Qs);
    for (int sp = blockIdx.z; sp < ns; sp += gridDim.z) {
        const int s0 = start + sp * chunk, s1 = s0 + chunk < p + 1 ? s0 + chunk : p + 1;
        float m[GQ], l[GQ], acc[GQ][D];
#pragma unroll
        for (int h = 0; h < GQ; h++) {
            m[h] = -INFINITY;
            l[h] = 0.0f;
#pragma unroll
            for (int d = 0; d < D; d++)
                acc[h][d] = 0.0f;
        }
        for (int t0 = s0 + w * ATB_TP; t0 < s1; t0 += ATB_WARPS * ATB_TP) {
            const int nt = s1 - t0 < ATB_TP ? s1 - t0 : ATB_TP;
            atb_copy<HD>(a, blk, kvh, t0, nt, lane, Kw, Vw);
            asm volatile("cp.async.wait_group 1;" ::: "memory"); /* K; V may still arrive */
            __syncwarp();
            float sc[GQ];
#pragma unroll
            for (int h = 0; h < GQ; h++)
                sc[h] = 0.0f;
            const uint4 *kr = reinterpret_cast<const uint4 *>(Kw + lane * KRW);
#pragma unroll 4
            for (int c = 0; c < CPR; c++) {
                const uint4 u = kr[c];
                const float kf[8] = {b16_lo(u.x, f16), b16_hi(u.x, f16), b16_lo(u.y, f16), b16_hi(u.y, f16),
                                     b16_lo(u.z, f16), b16_hi(u.z, f16), b16_lo(u.w, f16), b16_hi(u.w, f16)};
#pragma unroll
                for (int h = 0; h < GQ; h++) {
                    if (h < gq) {
                        const float4 q0 = Q4[h * (HD / 4) + 2 * c], q1 = Q4[h * (HD / 4) + 2 * c + 1];
                        sc[h] = fmaf(q0.x, kf[0], sc[h]);
                        sc[h] = fmaf(q0.y, kf[1], sc[h]);
                        sc[h] = fmaf(q0.z, kf[2], sc[h]);
                        sc[h] = fmaf(q0.w, kf[3], sc[h]);
                        sc[h] = fmaf(q1.x, kf[4], sc[h]);
                        sc[h] = fmaf(q1.y, kf[5], sc[h]);
                        sc[h] = fmaf(q1.z, kf[6], sc[h]);
                        sc[h] = fmaf(q1.w, kf[7], sc[h]);
                    }
                }
            }
            float corr[GQ];
#pragma unroll
            for (int h = 0; h < GQ; h++) {
                corr[h] = 1.0f;
                if (h < gq) {
                    float x = sc[h] * a.scale;
                    if (a.softcap > 0)
                        x = a.softcap * tanhf(x / a.softcap);
                    if (lane >= nt)
                        x = -INFINITY;
                    const float mn = fmaxf(m[h], warp_max(x));
                    corr[h] = expf(m[h] - mn);
                    const float e = lane < nt ? expf(x - mn) : 0.0f;
                    l[h] = l[h] * corr[h] + warp_sum(e);
                    m[h] = mn;
                    Pw[h * ATB_TP + lane] = e;
                }
            }
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncwarp();
#pragma unroll
            for (int h = 0; h < GQ; h++)
#pragma unroll
                for (int d = 0; d < D; d++)
                    acc[h][d] *= corr[h];
            for (int j = 0; j < nt; j++) {
                float vf[D];
                const uint32_t *vr = Vw + j * VRW + lane * (D / 2);
#pragma unroll
                for (int d = 0; d < D; d += 2) {
                    const uint32_t u = vr[d / 2];
                    vf[d] = b16_lo(u, f16);
                    vf[d + 1] = b16_hi(u, f16);
                }
#pragma unroll
                for (int h = 0; h < GQ; h++) {
                    if (h < gq) {
                        const float pj = Pw[h * ATB_TP + j];
#pragma unroll
                        for (int d = 0; d < D; d++)
                            acc[h][d] = fmaf(pj, vf[d], acc[h][d]);
                    }
                }
            }
            __syncwarp(); /* the slots are refilled by the next pass */
        }
        /* the split's part: the warps' states merged in warp order */
        __syncthreads();
#pragma unroll
        for (int h = 0; h < GQ; h++) {
            if (h < gq) {
                float *g = Mg + (size_t)(w * gq + h) * (HD + 2);
#pragma unroll
                for (int d = 0; d < D; d++)
                    g[2 + lane * D + d] = acc[h][d];
                if (lane == 0) {
                    g[0] = m[h];
                    g[1] = l[h];
                }
            }
        }
        atb_part<HD>(a, Mg, gq, i, kvh, sp, ns, slot);
        __syncthreads(); /* Mg is the next split's rows */
    }
}

// Attention tiles 3: attn_b16_kernel's copies, splits and merges, with the
// two products on tensor cores (mma m16n8k16 of the pool's 16-bit type,
// f32 sums). Per warp pass of 32 positions: scores S = Q K^T with Q's
// rows g < 8 the q heads of the kv head rounded to 16 bits and rows g + 8
// their remainders (so S of head g is C rows g + g + 8: ~16-bit-exact q,
// K as stored), K's rows read by ldmatrix; then P V with P's rows split
// the same way (the score registers are P's A fragments) and V's rows
// through ldmatrix.trans. A lane holds head g's scores of positions 8j +
// 2t, + 1 (the max and sums over the 4 lanes of g) and its values of dims
// 8n + 2t, + 1. Rows are padded by 16 bytes (ldmatrix without bank
// conflicts). Sums of a position's terms run in the tensor core's fixed
// order, so a token's result still depends only on its own positions.
template <bool F16> __device__ __forceinline__ uint32_t h16x2(float lo, float hi)
{
    if (F16) {
        const __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&h);
    }
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&b);
}
template <bool F16> __device__ __forceinline__ float2 h16x2_f(uint32_t u)
{
    if (F16)
        return __half22float2(*reinterpret_cast<const __half2 *>(&u));
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
// (x, y) as 16-bit pairs: the rounded values and the remainders
template <bool F16> __device__ __forceinline__ void h16x2_split(float x, float y, uint32_t &hi, uint32_t &lo)
{
    hi = h16x2<F16>(x, y);
    const float2 r = h16x2_f<F16>(hi);
    lo = h16x2<F16>(x - r.x, y - r.y);
}

__host__ __device__ constexpr size_t atm_smem(int hd) { return (size_t)ATB_WARPS * 2 * ATB_TP * atb_krw(hd) * 4; }

template <int HD, bool F16>
__global__ void __launch_bounds__(ATB_WARPS *WARP, 3) attn_mma_kernel(const tcu_attn_args a, int slot)
{
    constexpr int KS = HD / 16, NT = HD / 8, RW = atb_krw(HD);
    extern __shared__ __align__(16) uint32_t atb_sm[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int gq = a.n_head / a.n_kv_head, kvh = blockIdx.x, i = blockIdx.y;
    uint32_t *const Kw = atb_sm + (size_t)w * 2 * ATB_TP * RW, *const Vw = Kw + ATB_TP * RW;
    float *const Mg = reinterpret_cast<float *>(atb_sm); /* the warps' states, over the rows once used */
    pdl_wait();
    pdl_trigger();
    const atb_span sp_ = atb_span_of(a, i);
    if ((int)blockIdx.z >= sp_.ns)
        return;
    const int p = sp_.p, start = sp_.start, ns = sp_.ns, chunk = sp_.chunk;
    const int32_t *blk = sp_.blk;
    uint32_t qa[KS][4]; /* Q's A fragments: head g rounded (rows g), its remainder (rows g + 8) */
    {
        const float *q = a.q + ((size_t)i * a.n_head + kvh * gq + (g < gq ? g : 0)) * HD + 2 * t;
#pragma unroll
        for (int k = 0; k < KS; k++) {
            const float2 x0 = g < gq ? *reinterpret_cast<const float2 *>(q + 16 * k) : make_float2(0.0f, 0.0f);
            const float2 x1 = g < gq ? *reinterpret_cast<const float2 *>(q + 16 * k + 8) : make_float2(0.0f, 0.0f);
            h16x2_split<F16>(x0.x, x0.y, qa[k][0], qa[k][1]);
            h16x2_split<F16>(x1.x, x1.y, qa[k][2], qa[k][3]);
        }
    }
    for (int sp = blockIdx.z; sp < ns; sp += gridDim.z) {
        const int s0 = start + sp * chunk, s1 = s0 + chunk < p + 1 ? s0 + chunk : p + 1;
        float m = -INFINITY, l = 0.0f, acc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
            acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        for (int t0 = s0 + w * ATB_TP; t0 < s1; t0 += ATB_WARPS * ATB_TP) {
            const int nt = s1 - t0 < ATB_TP ? s1 - t0 : ATB_TP;
            atb_copy<HD, RW>(a, blk, kvh, t0, nt, lane, Kw, Vw);
            asm volatile("cp.async.wait_group 1;" ::: "memory"); /* K; V may still arrive */
            __syncwarp();
            float sc[4][4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
                for (int k = 0; k < KS / 2; k++) {
                    uint32_t b[4];
                    ldsm_x4<false>(b, Kw + (8 * j + (lane & 7)) * RW + 16 * k + 4 * (lane >> 3));
                    tc_mma<F16>(sc[j], qa[2 * k], b[0], b[1]);
                    tc_mma<F16>(sc[j], qa[2 * k + 1], b[2], b[3]);
                }
            }
            float x[4][2], mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float v = (sc[j][e] + sc[j][e + 2]) * a.scale;
                    if (a.softcap > 0)
                        v = a.softcap * tanhf(v / a.softcap);
                    x[j][e] = 8 * j + 2 * t + e < nt ? v : -INFINITY;
                    mx = fmaxf(mx, x[j][e]);
                }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m, mx), corr = expf(m - mn);
            m = mn;
            l *= corr;
            uint32_t pa[2][4]; /* P's A fragments, positions 16 s .. 16 s + 15 */
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float p0 = expf(x[j][0] - mn), p1 = expf(x[j][1] - mn);
                l += p0 + p1;
                h16x2_split<F16>(p0, p1, pa[j / 2][2 * (j % 2)], pa[j / 2][2 * (j % 2) + 1]);
            }
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    acc[n][e] *= corr;
            asm volatile("cp.async.wait_group 0;" ::: "memory");
            __syncwarp();
#pragma unroll
            for (int s2 = 0; s2 < 2; s2++)
#pragma unroll
                for (int n = 0; n < NT / 2; n++) {
                    uint32_t b[4];
                    ldsm_x4<true>(b, Vw + (16 * s2 + (lane & 7) + 8 * ((lane >> 3) & 1)) * RW + 8 * n +
                                         4 * (lane >> 4));
                    tc_mma<F16>(acc[2 * n], pa[s2], b[0], b[1]);
                    tc_mma<F16>(acc[2 * n + 1], pa[s2], b[2], b[3]);
                }
            __syncwarp(); /* the slots are refilled by the next pass */
        }
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        __syncthreads();
        if (g < gq) {
            float *st = Mg + (size_t)(w * gq + g) * (HD + 2);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                st[2 + 8 * n + 2 * t] = acc[n][0] + acc[n][2];
                st[2 + 8 * n + 2 * t + 1] = acc[n][1] + acc[n][3];
            }
            if (t == 0) {
                st[0] = m;
                st[1] = l;
            }
        }
        atb_part<HD>(a, Mg, gq, i, kvh, sp, ns, slot);
        __syncthreads(); /* Mg is the next split's rows */
    }
}

// Blocks a (kv head, token) of the batch kernels: as many as the step
// needs to fill the GPU (each block then takes splits z, z + Z, ...).
static int atb_z(const tcu_attn_args *a, const tcu_opts &o)
{
    const long pairs = (long)a->n_kv_head * a->T, want = o.attn_z > 0 ? o.attn_z : (6L * sm_count() + pairs - 1) / pairs;
    return want < 2 && o.attn_z <= 0 ? 2 : want > a->n_split ? a->n_split : (int)want;
}

// A batch-tile kernel's launch over (kv heads, tokens, atb_z) blocks with
// smem bytes of dynamic shared memory (the limit raised once a kernel).
template <void (*K)(const tcu_attn_args, int)>
static int atb_launch(const tcu_attn_args *a, int slot, const tcu_opts &o, cudaStream_t s, size_t smem)
{
    static bool attr_set = false;
    if (!attr_set) {
        const int rc = (int)cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (rc)
            return rc;
        attr_set = true;
    }
    return launch_pdl(o.pdl, K, dim3(a->n_kv_head, a->T, atb_z(a, o)), dim3(ATB_WARPS * WARP), smem, s, *a, slot);
}

// The batch tiles 2 / 3 for a 16-bit pool (sink rows of its type), head
// dims 64 and 128, up to 8 q heads a kv head; -1 where they do not apply.
// The grid walks no more splits than a step of T tokens needs to fill the
// GPU (each block then takes splits z, z + Z, ...).
static int attn_b16_launch(const tcu_attn_args *a, int slot, const tcu_opts &o, cudaStream_t s)
{
    const int gq = a->n_head / a->n_kv_head;
    const tcu_kv &kv = a->kv;
    if (a->tiles < 2 || !kv.typed || (kv.type != TCU_KV_BF16 && kv.type != TCU_KV_F16) ||
        (kv.n_sink > 0 && kv.sink_type != kv.type) || kv.hb != 2 * a->hd || (kv.n_sink > 0 && kv.sink_hb != kv.hb) ||
        a->n_head % a->n_kv_head || gq > 8 || (a->hd != 64 && a->hd != 128))
        return -1;
    if (a->tiles == 3) {
        const bool f16 = kv.type == TCU_KV_F16;
        if (a->hd == 64)
            return f16 ? atb_launch<attn_mma_kernel<64, true>>(a, slot, o, s, atm_smem(64))
                       : atb_launch<attn_mma_kernel<64, false>>(a, slot, o, s, atm_smem(64));
        return f16 ? atb_launch<attn_mma_kernel<128, true>>(a, slot, o, s, atm_smem(128))
                   : atb_launch<attn_mma_kernel<128, false>>(a, slot, o, s, atm_smem(128));
    }
    const int gqm = gq <= 1 ? 1 : gq <= 2 ? 2 : gq <= 4 ? 4 : 8;
    switch ((a->hd / 32) * 16 + gqm) {
    case 2 * 16 + 1: return atb_launch<attn_b16_kernel<2, 1>>(a, slot, o, s, atb_smem(64, 1));
    case 2 * 16 + 2: return atb_launch<attn_b16_kernel<2, 2>>(a, slot, o, s, atb_smem(64, 2));
    case 2 * 16 + 4: return atb_launch<attn_b16_kernel<2, 4>>(a, slot, o, s, atb_smem(64, 4));
    case 2 * 16 + 8: return atb_launch<attn_b16_kernel<2, 8>>(a, slot, o, s, atb_smem(64, 8));
    case 4 * 16 + 1: return atb_launch<attn_b16_kernel<4, 1>>(a, slot, o, s, atb_smem(128, 1));
    case 4 * 16 + 2: return atb_launch<attn_b16_kernel<4, 2>>(a, slot, o, s, atb_smem(128, 2));
    case 4 * 16 + 4: return atb_launch<attn_b16_kernel<4, 4>>(a, slot, o, s, atb_smem(128, 4));
    default: return atb_launch<attn_b16_kernel<4, 8>>(a, slot, o, s, atb_smem(128, 8));
    }
}

// The tiled kernel for steps of several sequences, -1 where it does not
// apply (head dims 64 and 128, up to 16 q heads a kv head).
static int attn_tile_launch(const tcu_attn_args *a, int slot, const tcu_opts &o, cudaStream_t s)
{
    const int gq = a->n_head / a->n_kv_head;
    if (!a->tiles || a->n_head % a->n_kv_head || gq > 4 * ATT_T_WARPS || (a->hd != 64 && a->hd != 128))
        return -1;
    const int rc = attn_b16_launch(a, slot, o, s);
    if (rc != -1)
        return rc;
    const dim3 grid(a->n_kv_head, a->T, a->n_split), block(ATT_T_WARPS * WARP);
    const int hpw = (gq + ATT_T_WARPS - 1) / ATT_T_WARPS;
    if (a->hd == 64)
        return hpw == 1   ? launch_pdl(o.pdl, attn_tile_kernel<2, 1>, grid, block, 0, s, *a, slot)
               : hpw == 2 ? launch_pdl(o.pdl, attn_tile_kernel<2, 2>, grid, block, 0, s, *a, slot)
                          : launch_pdl(o.pdl, attn_tile_kernel<2, 4>, grid, block, 0, s, *a, slot);
    return hpw == 1   ? launch_pdl(o.pdl, attn_tile_kernel<4, 1>, grid, block, 0, s, *a, slot)
           : hpw == 2 ? launch_pdl(o.pdl, attn_tile_kernel<4, 2>, grid, block, 0, s, *a, slot)
                      : launch_pdl(o.pdl, attn_tile_kernel<4, 4>, grid, block, 0, s, *a, slot);
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
                         const tcu_qkv_args *post, const tcu_opts &o)
{
    if constexpr (!POST && D <= 4) {
        return launch_pdl(o.pdl, attn_part_occ_kernel<D>, grid, block, 0, s, *a, slot, *post);
    } else {
        return launch_pdl(o.pdl, attn_part_kernel<D, POST>, grid, block, 0, s, *a, slot, *post, o.attn_early ? 1 : 0);
    }
}

template <bool POST>
static int attn_part_launch(const tcu_attn_args *a, const tcu_qkv_args *post, const tcu_opts &o, cudaStream_t s)
{
    const int slot = o.attn_merge_last && (long)a->T * a->n_head <= ATT_CNT ? att_slot_of(s) : -1;
    dim3 grid(a->n_head, a->T, a->n_split), block(ATT_WARPS * WARP);
    int rc = -1;
    if (!POST)
        rc = attn_tile_launch(a, slot, o, s);
    if (rc == -1 && !POST && a->kv.typed && o.attn_gqa)
        rc = attn_gqa_launch(a, slot, o, s);
    if (rc >= 0) {
        if (rc || slot >= 0)
            return rc;
        return launch_pdl(o.pdl, attn_merge_kernel, dim3(a->n_head, a->T), dim3(a->hd), 0, s, *a);
    }
    rc = 0;
    switch (a->hd / 32) {
    case 1: rc = attn_part_one<1, POST>(grid, block, s, a, slot, post, o); break;
    case 2: rc = attn_part_one<2, POST>(grid, block, s, a, slot, post, o); break;
    case 3: rc = attn_part_one<3, POST>(grid, block, s, a, slot, post, o); break;
    case 4: rc = attn_part_one<4, POST>(grid, block, s, a, slot, post, o); break;
    case 5: rc = attn_part_one<5, POST>(grid, block, s, a, slot, post, o); break;
    case 6: rc = attn_part_one<6, POST>(grid, block, s, a, slot, post, o); break;
    case 7: rc = attn_part_one<7, POST>(grid, block, s, a, slot, post, o); break;
    case 8: rc = attn_part_one<8, POST>(grid, block, s, a, slot, post, o); break;
    default: return (int)cudaErrorInvalidValue;
    }
    if (rc || slot >= 0)
        return rc;
    return launch_pdl(o.pdl, attn_merge_kernel, dim3(a->n_head, a->T), dim3(a->hd), 0, s, *a);
}

extern "C" int tcu_attention(const tcu_attn_args *a, const tcu_opts *o, tcu_stream stream)
{
    PROF(TCU_PROF_ATTN, stream);
    const tcu_qkv_args none = {};
    return attn_part_launch<false>(a, &none, opts_or_default(o), (cudaStream_t)stream);
}

extern "C" int tcu_qkv_attention(const tcu_qkv_args *post, const tcu_attn_args *a, const tcu_opts *o,
                                 tcu_stream stream)
{
    PROF(TCU_PROF_ATTN, stream);
    if (post->T != a->T || post->hd != a->hd || post->n_head != a->n_head || post->n_kv_head != a->n_kv_head)
        return (int)cudaErrorInvalidValue;
    if (a->kv.typed || a->tiles) { /* typed KV or the tiled kernel: the two launches (the own position read
                                    * back as stored) */
        if (a->q != post->q)
            return (int)cudaErrorInvalidValue;
        const int rc = tcu_qkv_post(post, o, stream);
        return rc ? rc : attn_part_launch<false>(a, post, opts_or_default(o), (cudaStream_t)stream);
    }
    return attn_part_launch<true>(a, post, opts_or_default(o), (cudaStream_t)stream);
}
