// Sampling on the device (see cuda_sample.h), so that only the chosen ids
// leave the GPU: a masked argmax per logits row (greedy steps), and the
// host sampler's processing and draw per row (tcu_sample_rows), with the
// min_tokens stop set and the rows' logprobs (a few values a row).
#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>

#include "tensor/cuda/cuda_sample.h"

// (v, i) beats (bv, bi): a larger value, or an equal one at a lower id. A
// NaN compares false either way, so it never replaces anything.
__device__ __forceinline__ bool am_better(float v, int i, float bv, int bi)
{
    return v > bv || (v == bv && i < bi);
}

// The best allowed (value, id) of x[i], i = first, first + step, ... < n:
// mk NULL or a packed mask (bit i set = allowed).
__device__ __forceinline__ void am_scan(const float *x, const uint32_t *mk, int first, int step, int n, float &bv,
                                        int &bi)
{
    bv = -INFINITY;
    bi = INT_MAX;
    for (int i = first; i < n; i += step) {
        if (mk && !((mk[i >> 5] >> (i & 31)) & 1u))
            continue;
        float v = x[i];
        if (am_better(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
}

// am_scan over 4-value pieces j = first, first + step, ... < n / 4 (n a
// multiple of 4, x 16-byte aligned): vector loads, eight in flight per
// thread - a 128k-token row in one block was latency-bound scalar by scalar
// (52 us on an H200). The winner does not depend on the visiting order.
__device__ __forceinline__ void am_scan4(const float *x, const uint32_t *mk, int first, int step, int n, float &bv,
                                         int &bi)
{
    bv = -INFINITY;
    bi = INT_MAX;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
#pragma unroll 8
    for (int j = first; j < n / 4; j += step) {
        const float4 v = x4[j];
        const uint32_t m = mk ? mk[j >> 3] >> ((j & 7) * 4) : 0xfu;
        const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; k++)
            if (((m >> k) & 1u) && am_better(e[k], 4 * j + k, bv, bi)) {
                bv = e[k];
                bi = 4 * j + k;
            }
    }
}

__device__ __forceinline__ void am_warp(float &bv, int &bi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (am_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

// One block per row; blockDim.x a multiple of 32, at most 1024. "Nothing
// yet" is (-inf, INT_MAX): the first -inf candidate still beats it on id.
__global__ void argmax_rows_kernel(const float *logits, int n_vocab, const uint32_t *masks, int n_words,
                                   const int32_t *mask_on, int32_t *ids)
{
    const int row = blockIdx.x;
    const float *x = logits + (size_t)row * n_vocab;
    const uint32_t *mk = masks && mask_on && mask_on[row] ? masks + (size_t)row * n_words : nullptr;
    float bv;
    int bi;
    if (n_vocab % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
        am_scan4(x, mk, threadIdx.x, blockDim.x, n_vocab, bv, bi);
    else
        am_scan(x, mk, threadIdx.x, blockDim.x, n_vocab, bv, bi);
    am_warp(bv, bi);
    __shared__ float sv[32];
    __shared__ int si[32];
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (lane == 0) {
        sv[w] = bv;
        si[w] = bi;
    }
    __syncthreads();
    if (w == 0) {
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : INT_MAX;
        am_warp(bv, bi);
        if (lane == 0) {
            int id = bi == INT_MAX ? -1 : bi;
            if (mk && bv == -INFINITY)
                id = -1;
            ids[row] = id;
        }
    }
}


// ---- sampling rows (tcu_sample_rows) ----
//
// One block per row, blockDim a power of two (<= 1024). Host order (src/
// sample/sample.c): bias, mask, then with temperature T > 0 the weights
// e_i = expf((x_i - max) * (1/T)) (the largest is exactly 1), the kept set
// = the first K tokens in the order (weight descending, id ascending),
// K = min(top-k count, top-p count within the top-k set, min-p count), and
// the draw = the first token of that order whose running mass exceeds
// u * (kept mass). Rows without truncation draw in id order over every
// token, as sample_row does. Masses are fixed point (e * 2^44 rounded, in
// 64-bit integers): every sum is exact, so the result does not depend on
// the reduction order or the block size. Positions in the order are found
// without a sort, by radix selection on the weights' bit patterns (positive
// floats order as their bits): 4 passes of 256-bin histograms of count and
// mass; a tie group (equal weights) is ranked by id with a block scan.
// Logprobs reuse the kept count and mass; their top tokens come from the
// same radix selection by count over a key per token (sr_topn).

typedef unsigned long long sr_u64;

#define SR_BINS 256
#define SR_MAX_THREADS 1024
#define SR_QSCALE 17592186044416.0 // 2^44: n_vocab < 2^19 keeps sums below 2^63

struct sr_smem {
    unsigned int cnt[SR_BINS];
    sr_u64 mass[SR_BINS];
    sr_u64 buf[SR_MAX_THREADS];
    float rv[SR_MAX_THREADS];
    int ri[SR_MAX_THREADS];
    // radix selection state, written by thread 0
    unsigned int prefix;
    sr_u64 a_cnt, a_mass, g_cnt, g_mass;
    int res;
    // logprobs: the top tokens and their keys (sr_topn)
    int cand[TCU_SAMPLE_MAX_TOP];
    unsigned int cand_key[TCU_SAMPLE_MAX_TOP];
    unsigned int n_cand;
};

// Where a selection landed: the tie group of weight bits key, after a_cnt
// tokens of mass a_mass (the larger weights); the group has g_cnt tokens of
// fixed-point mass q each.
struct sr_pos {
    unsigned int key;
    sr_u64 a_cnt, a_mass, g_cnt, q;
};

// Token i's weight, 0 when it cannot be drawn (masked, -inf, NaN, or an
// infinite maximum).
__device__ __forceinline__ float sr_weight(const float *x, const uint32_t *mk, int i, float mx, float invt)
{
    if (mk && !((mk[i >> 5] >> (i & 31)) & 1u))
        return 0.0f;
    float v = x[i];
    if (!(v > -INFINITY))
        return 0.0f;
    float e = expf((v - mx) * invt);
    return e > 0.0f ? e : 0.0f;
}

__device__ __forceinline__ sr_u64 sr_fix(float e) { return __double2ull_rn((double)e * SR_QSCALE); }

// Sum over the block (every thread gets it).
__device__ __forceinline__ sr_u64 sr_sum(sr_u64 v, sr_smem &S)
{
    const int t = threadIdx.x;
    S.buf[t] = v;
    __syncthreads();
    for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
        if (t < s)
            S.buf[t] += S.buf[t + s];
        __syncthreads();
    }
    sr_u64 r = S.buf[0];
    __syncthreads();
    return r;
}

// Inclusive prefix sum over the threads in order.
__device__ __forceinline__ sr_u64 sr_scan(sr_u64 v, sr_smem &S)
{
    const int t = threadIdx.x;
    S.buf[t] = v;
    __syncthreads();
    for (int o = 1; o < (int)blockDim.x; o <<= 1) {
        sr_u64 a = t >= o ? S.buf[t - o] : 0;
        __syncthreads();
        S.buf[t] += a;
        __syncthreads();
    }
    sr_u64 r = S.buf[t];
    __syncthreads();
    return r;
}

// The position in the order (weight descending, id ascending) where the
// running count (by_mass 0) or running fixed-point mass (1) of the tokens
// first reaches target (1 <= target <= the row's total).
__device__ __forceinline__ sr_pos sr_select(const float *x, const uint32_t *mk, int V, float mx, float invt,
                                            int by_mass, sr_u64 target, sr_smem &S)
{
    const int t = threadIdx.x, n = blockDim.x;
    unsigned int prefix = 0, pmask = 0;
    if (t == 0) {
        S.a_cnt = 0;
        S.a_mass = 0;
    }
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < SR_BINS; b += n) {
            S.cnt[b] = 0;
            S.mass[b] = 0;
        }
        __syncthreads();
        for (int i = t; i < V; i += n) {
            float e = sr_weight(x, mk, i, mx, invt);
            unsigned int key = __float_as_uint(e);
            if (!(e > 0.0f) || (key & pmask) != prefix)
                continue;
            unsigned int b = (key >> shift) & (SR_BINS - 1);
            atomicAdd(&S.cnt[b], 1u);
            atomicAdd(&S.mass[b], sr_fix(e));
        }
        __syncthreads();
        if (t == 0) { // the bins from the largest weights down
            sr_u64 ac = S.a_cnt, am = S.a_mass;
            int pick = -1, last = -1;
            for (int b = SR_BINS - 1; b >= 0; b--) {
                if (!S.cnt[b])
                    continue;
                last = b;
                if ((by_mass ? am + S.mass[b] : ac + S.cnt[b]) >= target) {
                    pick = b;
                    break;
                }
                ac += S.cnt[b];
                am += S.mass[b];
            }
            if (pick < 0 && last >= 0) { // target past the total (not for valid calls): the last group
                pick = last;
                ac -= S.cnt[last];
                am -= S.mass[last];
            }
            if (pick < 0)
                pick = 0;
            S.a_cnt = ac;
            S.a_mass = am;
            S.g_cnt = S.cnt[pick];
            S.g_mass = S.mass[pick];
            S.prefix = prefix | ((unsigned int)pick << shift);
        }
        __syncthreads();
        prefix = S.prefix;
        pmask |= (unsigned int)(SR_BINS - 1) << shift;
    }
    sr_pos p;
    p.key = prefix;
    p.a_cnt = S.a_cnt;
    p.a_mass = S.a_mass;
    p.g_cnt = S.g_cnt;
    p.q = S.g_cnt ? S.g_mass / S.g_cnt : 0; // equal weights, equal masses: exact
    __syncthreads();
    return p;
}

// The first id (in id order) at which the running sum of w(i) exceeds thr
// (thr < the row's total): w = the fixed-point mass when key == 0, else 1
// for the tokens whose weight has the bits key. Each thread sums one
// contiguous chunk of ids; a block scan finds the chunk, its thread walks
// it. -1 if none (not for valid calls).
__device__ __forceinline__ int sr_walk(const float *x, const uint32_t *mk, int V, float mx, float invt,
                                      unsigned int key, sr_u64 thr, sr_smem &S)
{
    const int chunk = (V + (int)blockDim.x - 1) / (int)blockDim.x;
    const int lo = (int)threadIdx.x * chunk, hi = lo + chunk < V ? lo + chunk : V;
    sr_u64 s = 0;
    for (int i = lo; i < hi; i++) {
        float e = sr_weight(x, mk, i, mx, invt);
        s += key ? (sr_u64)(e > 0.0f && __float_as_uint(e) == key) : sr_fix(e);
    }
    sr_u64 p = sr_scan(s, S);
    if (threadIdx.x == 0)
        S.res = -1;
    __syncthreads();
    if (p - s <= thr && thr < p) {
        sr_u64 c = p - s;
        for (int i = lo; i < hi; i++) {
            float e = sr_weight(x, mk, i, mx, invt);
            c += key ? (sr_u64)(e > 0.0f && __float_as_uint(e) == key) : sr_fix(e);
            if (c > thr) {
                S.res = i;
                break;
            }
        }
    }
    __syncthreads();
    int r = S.res;
    __syncthreads();
    return r;
}

// floor(u * total), within [0, total - 1].
__device__ __forceinline__ sr_u64 sr_target(double u, sr_u64 total)
{
    double d = u * (double)total;
    sr_u64 t = d > 0.0 ? (sr_u64)d : 0;
    return t < total ? t : total - 1;
}

// The draw of a row with temperature > 0 whose largest weight-able logit is
// mx; *kn and *km get the kept set's size and fixed-point mass (logprobs).
__device__ __forceinline__ int sr_draw(const float *x, const uint32_t *mk, int V, float mx,
                                      const tcu_sample_param &P, sr_smem &S, sr_u64 *kn, sr_u64 *km)
{
    const float invt = 1.0f / P.temperature;
    const int use_minp = P.min_p > 0.0f;
    sr_u64 npos = 0, z = 0, nmin = 0, zmin = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = sr_weight(x, mk, i, mx, invt);
        if (!(e > 0.0f))
            continue;
        sr_u64 q = sr_fix(e);
        npos++;
        z += q;
        if (use_minp && e >= P.min_p) {
            nmin++;
            zmin += q;
        }
    }
    npos = sr_sum(npos, S);
    z = sr_sum(z, S);
    if (use_minp) {
        nmin = sr_sum(nmin, S);
        zmin = sr_sum(zmin, S);
    }
    if (npos == 0 || z == 0)
        return -1;
    *kn = npos;
    *km = z;
    if (!(P.top_k > 0 || P.top_p < 1.0f || use_minp)) // no truncation: id order, as sample_row
        return sr_walk(x, mk, V, mx, invt, 0, sr_target(P.u, z), S);
    sr_u64 K = npos, ck = z; // the kept prefix and its mass
    if (P.top_k > 0 && (sr_u64)P.top_k < npos) {
        sr_pos p = sr_select(x, mk, V, mx, invt, 0, (sr_u64)P.top_k, S);
        K = (sr_u64)P.top_k;
        ck = p.a_mass + (K - p.a_cnt) * p.q;
    }
    if (P.top_p < 1.0f) { // the shortest prefix holding top_p of the top-k set's mass
        double d = ceil((double)P.top_p * (double)ck);
        sr_u64 tp = d < 1.0 ? 1 : (sr_u64)d;
        if (tp > ck)
            tp = ck;
        sr_pos p = sr_select(x, mk, V, mx, invt, 1, tp, S);
        if (p.q > 0) {
            sr_u64 r = (tp - p.a_mass + p.q - 1) / p.q;
            if (p.a_cnt + r < K) {
                K = p.a_cnt + r;
                ck = p.a_mass + r * p.q;
            }
        }
    }
    if (use_minp && nmin < K) { // weights >= min_p * the largest (1): a prefix
        K = nmin;
        ck = zmin;
    }
    if (ck == 0)
        return -1;
    *kn = K;
    *km = ck;
    sr_u64 thr = sr_target(P.u, ck);
    sr_pos p = sr_select(x, mk, V, mx, invt, 1, thr + 1, S);
    if (p.q == 0)
        return -1;
    sr_u64 r = (thr + 1 - p.a_mass + p.q - 1) / p.q; // 1-based rank in the tie group, by id
    return sr_walk(x, mk, V, mx, invt, p.key, r - 1, S);
}

// ---- logprobs (tcu_sample_param.lp) ----
//
// The reported tokens' order, as a key per token (larger first, ties by
// ascending id, 0 = not reportable): sampled rows the weight's bits (the
// draw's order), greedy rows the logit's (sign-flipped so that unsigned
// order is float order; -0 counts as +0, equal to it).

__device__ __forceinline__ unsigned int sr_okey(float v)
{
    if (v == 0.0f)
        v = 0.0f;
    unsigned int b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ unsigned int sr_lkey(const float *x, const uint32_t *mk, int i, float mx, float invt,
                                                int greedy)
{
    if (greedy) {
        if (mk && !((mk[i >> 5] >> (i & 31)) & 1u))
            return 0u;
        float v = x[i];
        return v > -INFINITY ? sr_okey(v) : 0u; // a finite key is never 0: -FLT_MAX gives 0x00800000
    }
    float e = sr_weight(x, mk, i, mx, invt);
    return e > 0.0f ? __float_as_uint(e) : 0u;
}

// The n largest keys (1 <= n <= the row's reportable tokens, n <=
// TCU_SAMPLE_MAX_TOP), ties by ascending id, into S.cand[0, n) in that
// order: sr_select's radix passes by count find the n-th token's key; the
// tokens above it (fewer than n) are gathered by atomics, the key's own tie
// group - when it has more tokens than are missing - by rank in id order
// (contiguous chunks and a block scan, as sr_walk); thread 0 sorts the n.
__device__ void sr_topn(const float *x, const uint32_t *mk, int V, float mx, float invt, int greedy, int n,
                        sr_smem &S)
{
    const int t = threadIdx.x, nt = blockDim.x;
    unsigned int prefix = 0, pmask = 0;
    if (t == 0)
        S.a_cnt = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = t; b < SR_BINS; b += nt)
            S.cnt[b] = 0;
        __syncthreads();
        for (int i = t; i < V; i += nt) {
            unsigned int key = sr_lkey(x, mk, i, mx, invt, greedy);
            if (key && (key & pmask) == prefix)
                atomicAdd(&S.cnt[(key >> shift) & (SR_BINS - 1)], 1u);
        }
        __syncthreads();
        if (t == 0) { // the bins from the largest keys down
            sr_u64 ac = S.a_cnt;
            int pick = -1, last = -1;
            for (int b = SR_BINS - 1; b >= 0; b--) {
                if (!S.cnt[b])
                    continue;
                last = b;
                if (ac + S.cnt[b] >= (sr_u64)n) {
                    pick = b;
                    break;
                }
                ac += S.cnt[b];
            }
            if (pick < 0 && last >= 0) { // n past the total (not for valid calls): the last group
                pick = last;
                ac -= S.cnt[last];
            }
            if (pick < 0)
                pick = 0;
            S.a_cnt = ac;
            S.g_cnt = S.cnt[pick];
            S.prefix = prefix | ((unsigned int)pick << shift);
        }
        __syncthreads();
        prefix = S.prefix;
        pmask |= (unsigned int)(SR_BINS - 1) << shift;
    }
    const sr_u64 above = S.a_cnt, need = (sr_u64)n - above, group = S.g_cnt;
    __syncthreads();
    if (t == 0)
        S.n_cand = 0;
    __syncthreads();
    if (group <= need) { // the whole tie group is in: every token with a key >= prefix
        for (int i = t; i < V; i += nt) {
            unsigned int key = sr_lkey(x, mk, i, mx, invt, greedy);
            if (key && key >= prefix) {
                unsigned int s = atomicAdd(&S.n_cand, 1u);
                if (s < TCU_SAMPLE_MAX_TOP) {
                    S.cand[s] = i;
                    S.cand_key[s] = key;
                }
            }
        }
    } else { // the tokens above at [0, above), the group's first need ids at [above, n)
        const int chunk = (V + nt - 1) / nt;
        const int lo = t * chunk, hi = lo + chunk < V ? lo + chunk : V;
        sr_u64 c = 0;
        for (int i = lo; i < hi; i++) {
            unsigned int key = sr_lkey(x, mk, i, mx, invt, greedy);
            if (key && key > prefix) {
                unsigned int s = atomicAdd(&S.n_cand, 1u);
                if (s < TCU_SAMPLE_MAX_TOP) {
                    S.cand[s] = i;
                    S.cand_key[s] = key;
                }
            } else if (key && key == prefix) {
                c++;
            }
        }
        sr_u64 r = sr_scan(c, S) - c; // this chunk's first rank in the group
        for (int i = lo; i < hi && r < need; i++)
            if (sr_lkey(x, mk, i, mx, invt, greedy) == prefix) {
                S.cand[above + r] = i;
                S.cand_key[above + r] = prefix;
                r++;
            }
    }
    __syncthreads();
    if (t == 0) // insertion sort of the n: key descending, id ascending
        for (int a = 1; a < n; a++) {
            int id = S.cand[a];
            unsigned int key = S.cand_key[a];
            int b = a;
            for (; b > 0 && (S.cand_key[b - 1] < key || (S.cand_key[b - 1] == key && S.cand[b - 1] > id)); b--) {
                S.cand[b] = S.cand[b - 1];
                S.cand_key[b] = S.cand_key[b - 1];
            }
            S.cand[b] = id;
            S.cand_key[b] = key;
        }
    __syncthreads();
}

// Token i's log-probability given lz, the log of the normalizer.
__device__ __forceinline__ float sr_lp(const float *x, const uint32_t *mk, int i, float mx, float invt, int greedy,
                                       double lz)
{
    if (greedy)
        return (float)((double)x[i] - (double)mx - lz);
    return (float)(log((double)sr_weight(x, mk, i, mx, invt)) - lz);
}

// *out for a row whose draw is id >= 0 (sample_row's logprobs, see
// cuda_sample.h): sampled rows over their kept set (kn tokens of
// fixed-point mass km, from sr_draw), greedy rows the log-softmax at
// temperature 1 over every allowed token (its sum here, fixed point).
__device__ void sr_logprobs(const float *x, const uint32_t *mk, int V, float mx, const tcu_sample_param &P, int id,
                            sr_u64 kn, sr_u64 km, sr_smem &S, tcu_sample_lp *out)
{
    const int greedy = !(P.temperature > 0.0f);
    const float invt = greedy ? 1.0f : 1.0f / P.temperature;
    if (greedy) {
        sr_u64 cnt = 0, z = 0;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            if (sr_lkey(x, mk, i, mx, 1.0f, 1)) {
                cnt++;
                z += sr_fix(sr_weight(x, mk, i, mx, 1.0f));
            }
        kn = sr_sum(cnt, S);
        km = sr_sum(z, S); // >= 2^44: the largest weight is 1
    }
    const double lz = log((double)km / SR_QSCALE);
    int n = P.n_top < 0 ? 0 : P.n_top > TCU_SAMPLE_MAX_TOP ? TCU_SAMPLE_MAX_TOP : P.n_top;
    if ((sr_u64)n > kn)
        n = (int)kn;
    if (n > 0)
        sr_topn(x, mk, V, mx, invt, greedy, n, S);
    if (threadIdx.x == 0) {
        out->logprob = sr_lp(x, mk, id, mx, invt, greedy, lz);
        out->n_top = n;
        for (int j = 0; j < TCU_SAMPLE_MAX_TOP; j++) {
            out->top_id[j] = j < n ? S.cand[j] : -1;
            out->top_lp[j] = j < n ? sr_lp(x, mk, S.cand[j], mx, invt, greedy, lz) : 0.0f;
        }
    }
}

__global__ void __launch_bounds__(SR_MAX_THREADS, 1)
    sample_rows_kernel(float *logits, int V, const tcu_sample_param *params, const int32_t *bias_ids,
                       const float *bias_vals, const int32_t *pen_ids, const int32_t *pen_counts,
                       const int32_t *sup_ids, const uint32_t *masks, int n_words, const int32_t *mask_on,
                       int32_t *ids, tcu_sample_lp *lp)
{
    __shared__ sr_smem S;
    const int row = blockIdx.x, t = threadIdx.x;
    const tcu_sample_param P = params[row];
    float *x = logits + (size_t)row * V;
    const uint32_t *mk = masks && mask_on && mask_on[row] ? masks + (size_t)row * n_words : nullptr;
    if (P.n_sup > 0) { // min_tokens: before the processors, as the host's step does (-inf stays -inf)
        for (int b = t; b < P.n_sup; b += blockDim.x) {
            const int id = sup_ids[P.sup_off + b];
            if (id >= 0 && id < V)
                x[id] = -INFINITY;
        }
        __syncthreads();
    }
    if (P.n_bias > 0) { // in list order, one thread: repeated ids add up as on the host
        if (t == 0)
            for (int b = 0; b < P.n_bias; b++) {
                int id = bias_ids[P.bias_off + b];
                if (id >= 0 && id < V)
                    x[id] += bias_vals[P.bias_off + b];
            }
        __syncthreads();
    }
    if (P.pen && P.n_pen > 0) { // sample.c's arithmetic, one rounding each; the ids are distinct
        for (int b = t; b < P.n_pen; b += blockDim.x) {
            const int id = pen_ids[P.pen_off + b], cnt = pen_counts[P.pen_off + b];
            if (id < 0 || id >= V)
                continue;
            float v = x[id];
            if (P.rep != 1.0f)
                v = v > 0.0f ? __fdiv_rn(v, P.rep) : __fmul_rn(v, P.rep);
            if (cnt)
                v = __fsub_rn(v, __fadd_rn(P.pres, __fmul_rn(P.freq, (float)cnt)));
            x[id] = v;
        }
        __syncthreads();
    }
    // the largest allowed logit, the lowest id on ties (NaN never wins)
    float bv;
    int bi;
    am_scan(x, mk, t, blockDim.x, V, bv, bi);
    S.rv[t] = bv;
    S.ri[t] = bi;
    __syncthreads();
    for (int s = blockDim.x >> 1; s > 0; s >>= 1) {
        if (t < s && am_better(S.rv[t + s], S.ri[t + s], S.rv[t], S.ri[t])) {
            S.rv[t] = S.rv[t + s];
            S.ri[t] = S.ri[t + s];
        }
        __syncthreads();
    }
    bv = S.rv[0];
    bi = S.ri[0];
    __syncthreads();
    int id;
    sr_u64 kn = 0, km = 0;
    if (bi == INT_MAX || (bv == -INFINITY && (mk || P.n_bias > 0 || P.pen || P.lp || P.temperature > 0.0f)))
        id = -1; // nothing can be drawn (sample_row's TERN_EINVAL)
    else if (!(P.temperature > 0.0f))
        id = bi; // greedy: tcu_argmax_rows' rule
    else
        id = sr_draw(x, mk, V, bv, P, S, &kn, &km);
    if (t == 0)
        ids[row] = id;
    if (P.lp && lp) { // id is the same in every thread (shared results)
        if (id >= 0) {
            sr_logprobs(x, mk, V, bv, P, id, kn, km, S, lp + P.lp_slot);
        } else if (t == 0) {
            lp[P.lp_slot].logprob = -INFINITY;
            lp[P.lp_slot].n_top = 0;
        }
    }
}

// ---- launchers ----

extern "C" int tcu_argmax_rows(const float *logits, int n_rows, int n_vocab, const uint32_t *masks, int n_words,
                               const int32_t *mask_on, int32_t *ids, tcu_stream stream)
{
    if (n_rows <= 0)
        return 0;
    if (masks && (long)n_words * 32 < n_vocab)
        return (int)cudaErrorInvalidValue;
    int threads = n_vocab >= 32768 ? 1024 : 256;
    argmax_rows_kernel<<<n_rows, threads, 0, (cudaStream_t)stream>>>(logits, n_vocab, masks, n_words, mask_on, ids);
    return (int)cudaGetLastError();
}

extern "C" int tcu_sample_rows(float *logits, int n_rows, int n_vocab, const tcu_sample_param *params,
                               const int32_t *bias_ids, const float *bias_vals, const int32_t *pen_ids,
                               const int32_t *pen_counts, const int32_t *sup_ids, const uint32_t *masks, int n_words,
                               const int32_t *mask_on, int32_t *ids, tcu_sample_lp *lp, tcu_stream stream)
{
    if (n_rows <= 0)
        return 0;
    if (n_vocab <= 0 || n_vocab > TCU_SAMPLE_MAX_VOCAB || (masks && (long)n_words * 32 < n_vocab))
        return (int)cudaErrorInvalidValue;
    int threads = n_vocab >= 32768 ? SR_MAX_THREADS : 256;
    sample_rows_kernel<<<n_rows, threads, 0, (cudaStream_t)stream>>>(logits, n_vocab, params, bias_ids, bias_vals,
                                                                      pen_ids, pen_counts, sup_ids, masks, n_words,
                                                                      mask_on, ids, lp);
    return (int)cudaGetLastError();
}
