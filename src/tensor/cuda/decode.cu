// The decode path's attention: q/k/v post-processing with the KV write,
// paged flash-decoding attention (split positions, merged by the last block
// of a token's head) with the q/k/v post-processing optionally fused in,
// and the one-launch decode step of one token (opt-in) built on the same
// attention code.
#include "tensor/cuda/gemv.cuh"

// ---- q/k/v post-processing and the KV write ----

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

