/* Integer products for MLX affine weights with AVX-512 VNNI (kernels.h,
 * tern_iqmatmul_fn): vpdpbusd multiplies unsigned weight bytes (4-bit
 * 0..15 or 8-bit 0..255, both as stored) by signed activation bytes and adds
 * each 4 products into int32 without saturation, so 8-bit weights need no
 * sign trick. 64 weights per instruction; a group of 32 uses the 256-bit
 * form. The reduction and f32 combination are intdot_simd.h's, shared with
 * AVX2, so the bits are the scalar reference's. */
#include <immintrin.h>
#include <stdlib.h>

#include "tensor/cpu/intdot_simd.h"
#include "tensor/cpu/intdot.h"
#include "tensor/kernels.h"

#define LD(p) _mm256_loadu_si256((const __m256i *)(p))
#define LDZ(p) _mm512_loadu_si512((const void *)(p))

static inline __m256i fold(__m512i z)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
}

static inline __attribute__((always_inline)) void q8_grp(const uint8_t *w, const int8_t *a0, const int8_t *a1,
                                                         int group, int two, __m256i *s0, __m256i *s1)
{
    if (group == 32) {
        __m256i v = LD(w), z = _mm256_setzero_si256();
        *s0 = _mm256_dpbusd_epi32(z, v, LD(a0));
        *s1 = two ? _mm256_dpbusd_epi32(z, v, LD(a1)) : z;
        return;
    }
    __m512i r0 = _mm512_setzero_si512(), r1 = r0;
    for (int i = 0; i < group; i += 64) {
        __m512i v = LDZ(w + i);
        r0 = _mm512_dpbusd_epi32(r0, v, LDZ(a0 + i));
        if (two)
            r1 = _mm512_dpbusd_epi32(r1, v, LDZ(a1 + i));
    }
    *s0 = fold(r0);
    *s1 = fold(r1);
}

/* 4-bit: byte j holds values 2j (low nibble) and 2j+1; each 16 bytes go to
 * two 128-bit lanes, the second shifted by 4, which gives the low then the
 * high nibbles of 32 values - the activations' nibble order (kernels.h). */
static inline __attribute__((always_inline)) void q4_grp(const uint8_t *w, const int8_t *a0, const int8_t *a1,
                                                         int group, int two, __m256i *s0, __m256i *s1)
{
    if (group == 32) {
        __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w)), z = _mm256_setzero_si256();
        __m256i v = _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
        *s0 = _mm256_dpbusd_epi32(z, v, LD(a0));
        *s1 = two ? _mm256_dpbusd_epi32(z, v, LD(a1)) : z;
        return;
    }
    const __m512i m = _mm512_set1_epi8(15), sh = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    __m512i r0 = _mm512_setzero_si512(), r1 = r0;
    for (int i = 0; i < group; i += 64) {
        __m512i z = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(w + i / 2)));
        z = _mm512_mask_broadcast_i32x4(z, 0xFF00, _mm_loadu_si128((const __m128i *)(w + i / 2 + 16)));
        __m512i v = _mm512_and_si512(_mm512_srlv_epi64(z, sh), m);
        r0 = _mm512_dpbusd_epi32(r0, v, LDZ(a0 + i));
        if (two)
            r1 = _mm512_dpbusd_epi32(r1, v, LDZ(a1 + i));
    }
    *s0 = fold(r0);
    *s1 = fold(r1);
}

/* Two 256-bit halves as one 512-bit vector. */
static inline __m512 cat_ps(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1));
}
static inline __m256 hi_ps(__m512 v) { return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)); }
static inline __m512 dup_ps(const float *p)
{
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

/* ---- Few tokens (decode), 4-bit groups of 64 or 128 and 8-bit blocks of
 * 32 (any group): two weight rows at a time.
 * The row kernels above fold each group's 16 int32 lanes with hadd trees
 * (about 4.5 instructions a group, more than its vpdpbusd); here the
 * group vectors of a chunk of two rows (8 groups each) reduce together in
 * 512-bit unpack/shuffle steps (2.8 a group) to one vector holding both
 * rows' exact I_g, and the f32 combination of the contract runs for both
 * rows in one 512-bit FMA chain (row r in the low half, r + 1 in the high
 * one, each half the 256-bit combination exactly: same bits as the row
 * kernels). Each activation load serves both rows. */

/* Exact int32 sums, any order: a pair of group vectors to one whose 32-bit
 * lanes alternate the two groups' partial sums (per 128-bit lane). */
static inline __m512i pair32(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
static inline __m512i pair64(__m512i a, __m512i b)
{
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}
/* From pair32 outputs p[0..3] (row A's groups 01, 23, 45, 67) and q[0..3]
 * (row B's): lanes 0-7 = A's 8 group sums in order, 8-15 = B's. */
static inline __m512i sum16(const __m512i *p, const __m512i *q)
{
    __m512i a0 = pair64(p[0], p[1]), a1 = pair64(p[2], p[3]); /* 128-bit lanes: groups 0-3 / 4-7 partials */
    __m512i b0 = pair64(q[0], q[1]), b1 = pair64(q[2], q[3]);
    __m512i sa = _mm512_add_epi32(_mm512_shuffle_i32x4(a0, a1, 0x88), _mm512_shuffle_i32x4(a0, a1, 0xDD));
    __m512i sb = _mm512_add_epi32(_mm512_shuffle_i32x4(b0, b1, 0x88), _mm512_shuffle_i32x4(b0, b1, 0xDD));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(sa, sb, 0x88), _mm512_shuffle_i32x4(sa, sb, 0xDD));
}

/* The {scale, bias} pairs of row r's groups c .. c+7: f32 pairs, or with
 * h bf16 ones (tern_iqmatmul16_fn). */
static inline __attribute__((always_inline)) void sb_row(const void *sb, int h, long r, long ng, long c, __m256 *sw,
                                                         __m256 *bw)
{
    if (h)
        iq_sb16_chunk((const uint16_t *)sb + r * ng * 2, c, ng, sw, bw);
    else
        iq_sb_chunk((const float *)sb + r * ng * 2, c, ng, sw, bw);
}

/* From 4 vectors a[k] of row A whose lanes 0-7 hold partial sums of
 * group (or block) 2k of a chunk and lanes 8-15 of 2k + 1, and the same
 * b[k] of row B: lanes 0-7 = A's 8 sums in order, 8-15 = B's. */
static inline __m512i sum_halves(const __m512i *a4, const __m512i *b4)
{
    const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    /* 128-bit lanes 0-1: groups 0 2 4 6 (partials), 2-3: 1 3 5 7 */
    __m512i a = pair64(pair32(a4[0], a4[1]), pair32(a4[2], a4[3]));
    __m512i b = pair64(pair32(b4[0], b4[1]), pair32(b4[2], b4[3]));
    __m512i sab = _mm512_add_epi32(_mm512_shuffle_i32x4(a, b, 0x88), _mm512_shuffle_i32x4(a, b, 0xDD));
    return _mm512_permutexvar_epi32(order, sab);
}

/* Decode reads each weight row once, so the next row pair's bytes are
 * fetched while this pair's are used: without it the one-token kernels
 * wait on memory well below its bandwidth. The pair's two rows lie one
 * after the other, so they are fetched as one sequential stream, twice a
 * chunk's bytes a chunk (two streams, one a row, measured slower on Zen 4). */
static inline __attribute__((always_inline)) void prefetch_chunk(const uint8_t *p, long off, long len)
{
#pragma GCC unroll 16
    for (long o = 0; o < 2 * len; o += 64)
        _mm_prefetch((const char *)p + 2 * off + o, _MM_HINT_T0);
}

/* 8-bit rows, blocks of 32 (kernels.h): vector k of a chunk is 64 bytes,
 * blocks c + 2k (lanes 0-7) and c + 2k + 1 (8-15), weights as stored
 * (vpdpbusd takes 0..255 directly); each input load serves both rows. The
 * block sums reduce as the 4-bit groups of 64 do (sum_halves), the
 * {scale, bias} pairs of a chunk's blocks come from their weight groups
 * (iq_sb_rep: rep = group / 32). */
static inline __attribute__((always_inline)) void rows2_q8(const uint8_t *Wq, const void *sb, int h, int group,
                                                           const int8_t *Q, const float *qs, float *Y, long n_in,
                                                           long ldy, long ra, long rb, long t0, long t1, int NT,
                                                           const uint8_t *pf)
{
    long ng = n_in / group, nb = n_in / 32, nbp = tern_iq_ngp(nb), rep = group / 32;
    const uint8_t *wa = Wq + ra * n_in, *wb = Wq + rb * n_in;
    const int8_t *x[2] = {Q + t0 * n_in, Q + t1 * n_in};
    const float *q[2] = {qs + t0 * 2 * nbp, qs + t1 * 2 * nbp};
    __m512 F[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (long c = 0; c < nbp; c += 8) {
        __m512i va[2][4], vb[2][4];
        if (pf)
            prefetch_chunk(pf, c * 32, 256);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            long b = c + 2 * k;
#pragma GCC unroll 2
            for (int tk = 0; tk < NT; tk++)
                va[tk][k] = vb[tk][k] = _mm512_setzero_si512();
            if (b >= nb)
                continue;
            __mmask64 m = b + 1 < nb ? ~0ull : 0xFFFFFFFFull; /* the chunk's last block alone */
            __m512i wva = _mm512_maskz_loadu_epi8(m, wa + b * 32), wvb = _mm512_maskz_loadu_epi8(m, wb + b * 32);
#pragma GCC unroll 2
            for (int tk = 0; tk < NT; tk++) {
                __m512i xv = _mm512_maskz_loadu_epi8(m, x[tk] + b * 32);
                va[tk][k] = _mm512_dpbusd_epi32(va[tk][k], wva, xv);
                vb[tk][k] = _mm512_dpbusd_epi32(vb[tk][k], wvb, xv);
            }
        }
        __m256 swa, bwa, swb, bwb;
        if (h) {
            iq_sb16_rep((const uint16_t *)sb + ra * ng * 2, c, nb, rep, &swa, &bwa);
            iq_sb16_rep((const uint16_t *)sb + rb * ng * 2, c, nb, rep, &swb, &bwb);
        } else {
            iq_sb_rep((const float *)sb + ra * ng * 2, c, nb, rep, &swa, &bwa);
            iq_sb_rep((const float *)sb + rb * ng * 2, c, nb, rep, &swb, &bwb);
        }
        __m512 sw = cat_ps(swa, swb), bw = cat_ps(bwa, bwb);
#pragma GCC unroll 2
        for (int tk = 0; tk < NT; tk++) {
            __m512i I = sum_halves(va[tk], vb[tk]);
            __m512 d = dup_ps(q[tk] + c), A = dup_ps(q[tk] + nbp + c);
            F[tk] = _mm512_fmadd_ps(_mm512_fmadd_ps(sw, _mm512_cvtepi32_ps(I), _mm512_mul_ps(bw, A)), d, F[tk]);
        }
    }
#pragma GCC unroll 2
    for (int tk = 0; tk < NT; tk++) {
        long t = tk ? t1 : t0;
        Y[t * ldy + ra] = iq_hsum(_mm512_castps512_ps256(F[tk]));
        if (rb != ra)
            Y[t * ldy + rb] = iq_hsum(hi_ps(F[tk]));
    }
}

/* 4-bit rows: 64 packed bytes are 128 values,
 * their low nibbles the even values of four 32-value blocks and the high
 * nibbles the odd ones, so one load, an and, a shift and an and give two
 * vpdpbusd operands - against the activations' evens and odds of the same
 * four blocks (two 128-bit lane shuffles of the nibble-ordered inputs,
 * kernels.h, made once per token and shared by both rows). A group of 128
 * is one such vector; with groups of 64 it holds two groups (lanes 0-7 the
 * first, 8-15 the second), reduced by pair32/pair64, one lane shuffle-add
 * and a final permutation into group order. Exact integer sums, then the
 * contract's combination: the row kernels' bits. */
static inline __attribute__((always_inline)) void q4_pair(const uint8_t *w, __m512i *lo, __m512i *hi, int full)
{
    const __m512i m = _mm512_set1_epi8(15);
    __m512i v = full ? LDZ(w) : _mm512_maskz_loadu_epi8(0xFFFFFFFFull, w);
    *lo = _mm512_and_si512(v, m);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
}
static inline __attribute__((always_inline)) void q4_acts(const int8_t *x, __m512i *e, __m512i *o, int full)
{
    __m512i x0 = LDZ(x), x1 = full ? LDZ(x + 64) : _mm512_setzero_si512();
    *e = _mm512_shuffle_i32x4(x0, x1, 0x88);
    *o = _mm512_shuffle_i32x4(x0, x1, 0xDD);
}

static inline __attribute__((always_inline)) void rows2_q4(const uint8_t *Wq, const void *sb, int h, int group,
                                                           const int8_t *Q, const float *qs, float *Y, long n_in,
                                                           long ldy, long ra, long rb, long t0, long t1, int NT,
                                                           const uint8_t *pf)
{
    long ng = n_in / group, ngp = tern_iq_ngp(ng), rowb = n_in / 2;
    const uint8_t *wa = Wq + ra * rowb, *wb = Wq + rb * rowb;
    const int8_t *x[2] = {Q + t0 * n_in, Q + t1 * n_in};
    const float *q[2] = {qs + t0 * 2 * ngp, qs + t1 * 2 * ngp};
    __m512 F[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (long c = 0; c < ngp; c += 8) {
        __m512i I[2];
        if (pf)
            prefetch_chunk(pf, c * group / 2, 4 * group);
        if (group == 128) {
            __m512i pa[2][4], pb[2][4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m512i va[2][2], vb[2][2];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    long g = c + 2 * k + h;
#pragma GCC unroll 2
                    for (int tk = 0; tk < NT; tk++)
                        va[tk][h] = vb[tk][h] = _mm512_setzero_si512();
                    if (g >= ng)
                        continue;
                    __m512i la, ha, lb, hb;
                    q4_pair(wa + g * 64, &la, &ha, 1);
                    q4_pair(wb + g * 64, &lb, &hb, 1);
#pragma GCC unroll 2
                    for (int tk = 0; tk < NT; tk++) {
                        __m512i e, o;
                        q4_acts(x[tk] + g * 128, &e, &o, 1);
                        va[tk][h] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(va[tk][h], la, e), ha, o);
                        vb[tk][h] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(vb[tk][h], lb, e), hb, o);
                    }
                }
#pragma GCC unroll 2
                for (int tk = 0; tk < NT; tk++) {
                    pa[tk][k] = pair32(va[tk][0], va[tk][1]);
                    pb[tk][k] = pair32(vb[tk][0], vb[tk][1]);
                }
            }
#pragma GCC unroll 2
            for (int tk = 0; tk < NT; tk++)
                I[tk] = sum16(pa[tk], pb[tk]);
        } else { /* 64: vector k of the chunk holds groups c + 2k (lanes 0-7) and c + 2k + 1 (8-15) */
            __m512i va[2][4], vb[2][4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                long g = c + 2 * k;
#pragma GCC unroll 2
                for (int tk = 0; tk < NT; tk++)
                    va[tk][k] = vb[tk][k] = _mm512_setzero_si512();
                if (g >= ng)
                    continue;
                int full = g + 1 < ng;
                __m512i la, ha, lb, hb;
                q4_pair(wa + g * 32, &la, &ha, full);
                q4_pair(wb + g * 32, &lb, &hb, full);
#pragma GCC unroll 2
                for (int tk = 0; tk < NT; tk++) {
                    __m512i e, o;
                    q4_acts(x[tk] + g * 64, &e, &o, full);
                    va[tk][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(va[tk][k], la, e), ha, o);
                    vb[tk][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(vb[tk][k], lb, e), hb, o);
                }
            }
#pragma GCC unroll 2
            for (int tk = 0; tk < NT; tk++)
                I[tk] = sum_halves(va[tk], vb[tk]);
        }
        __m256 swa, bwa, swb, bwb;
        sb_row(sb, h, ra, ng, c, &swa, &bwa);
        sb_row(sb, h, rb, ng, c, &swb, &bwb);
        __m512 sw = cat_ps(swa, swb), bw = cat_ps(bwa, bwb);
#pragma GCC unroll 2
        for (int tk = 0; tk < NT; tk++) {
            __m512 d = dup_ps(q[tk] + c), A = dup_ps(q[tk] + ngp + c);
            F[tk] = _mm512_fmadd_ps(_mm512_fmadd_ps(sw, _mm512_cvtepi32_ps(I[tk]), _mm512_mul_ps(bw, A)), d, F[tk]);
        }
    }
#pragma GCC unroll 2
    for (int tk = 0; tk < NT; tk++) {
        long t = tk ? t1 : t0;
        Y[t * ldy + ra] = iq_hsum(_mm512_castps512_ps256(F[tk]));
        if (rb != ra)
            Y[t * ldy + rb] = iq_hsum(hi_ps(F[tk]));
    }
}

static inline __attribute__((always_inline)) void few_tokens(const uint8_t *Wq, const void *sb, int h, int group, int bits,
                                                             const int8_t *Q, const float *qs, float *Y, long T,
                                                             long n_in, long ldy, long r0, long r1)
{
    long rowb = n_in * bits / 8;
    for (long r = r0; r < r1; r += 2) {
        long rb = r + 1 < r1 ? r + 1 : r;
        /* the next pair, fetched during the first token pair's pass */
        const uint8_t *pf = r + 2 < r1 ? Wq + (r + 2) * rowb : NULL;
        long t = 0;
        for (; t + 1 < T; t += 2) {
            if (bits == 4)
                rows2_q4(Wq, sb, h, group, Q, qs, Y, n_in, ldy, r, rb, t, t + 1, 2, pf);
            else
                rows2_q8(Wq, sb, h, group, Q, qs, Y, n_in, ldy, r, rb, t, t + 1, 2, pf);
            pf = NULL;
        }
        if (t < T) {
            if (bits == 4)
                rows2_q4(Wq, sb, h, group, Q, qs, Y, n_in, ldy, r, rb, t, t, 1, pf);
            else
                rows2_q8(Wq, sb, h, group, Q, qs, Y, n_in, ldy, r, rb, t, t, 1, pf);
        }
    }
}

static void vnni_q4_rows(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                         long T, long n_in, long ldy, long r0, long r1);
static void vnni_q8_rows(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                         long T, long n_in, long ldy, long r0, long r1);
IQ_KERNEL(vnni_q4_rows, 4, q4_grp, iq_nofix)
IQ_KERNEL(vnni_q8_rows, 8, q8_grp, iq_nofix)

/* ---- Panels for several tokens (prefill, batches): the per-group
 * horizontal sums cost more than vpdpbusd itself, so for T >= IQ_PANEL_MIN_T
 * each weight row and the inputs are rearranged once per call so that
 * 32-bit lane j of every 256-bit vector holds 4 bytes of group 8c + j:
 * vpdpbusd then accumulates each group's exact sum in its own lane, and the
 * 8 lanes are the I_g of the contract with no reduction at all. The bits are
 * the same as the row kernels' (exact integer sums, same combination), so
 * batch invariance holds. A chunk c of 8 groups is group/4 vectors; vector v
 * takes word `off(v)` of each group's bytes: 8-bit weights and inputs word v;
 * 4-bit weights packed word v/2, low nibbles for even v and high for odd,
 * and the inputs (nibble order, kernels.h) the matching word. */

/* The micro-kernel: 4 weight rows x 4 tokens. Two rows share a 512-bit
 * vector (row 2p in the low half, 2p + 1 in the high one: panel_row with
 * stride 64) and each token's 32 input bytes are broadcast to both halves,
 * so one vpdpbusd is 2 rows x 1 token and a chunk step is 2 weight loads, 4
 * input loads and 8 vpdpbusd. Each half computes exactly the 256-bit
 * combination of the contract (iq_combine's two FMAs, iq_hsum), so every
 * (row, token) result has the row kernels' bits. */
static void panel_product(const uint8_t *Wq, const float *sb, int wgroup, int bits, const int8_t *Q, const float *qs,
                          float *Y, long T, long n_in, long ldy, long r0, long r1, int8_t *A, uint8_t *Wp)
{
    /* group, ng: the activation blocks (kernels.h's B), the panels' unit */
    int group = tern_iq_ablock(wgroup, bits);
    long ng = n_in / group, ngp = tern_iq_ngp(ng), nv = group / 4, span = ngp * group;
    long nw = n_in / wgroup, rep = wgroup / group;
    for (long t = 0; t < T; t++)
        panel_acts(Q + t * n_in, group, bits, ng, ngp, A + t * span);
    uint8_t *W0 = Wp, *W1 = Wp + 2 * span;
    __m512 *SB = (__m512 *)(Wp + 4 * span); /* IQ_PANEL_SB */
    for (long r = r0; r < r1; r += 4) {
        long rr[4];
        for (int i = 0; i < 4; i++)
            rr[i] = r + i < r1 ? r + i : r1 - 1; /* a short last quad repeats its last row */
        for (int i = 0; i < 4; i++)
            panel_row(Wq + rr[i] * n_in * bits / 8, group, bits, ng, ngp, Wp + (i >> 1) * 2 * span + (i & 1) * 32,
                      64);
        const float *s[4] = {sb + rr[0] * nw * 2, sb + rr[1] * nw * 2, sb + rr[2] * nw * 2, sb + rr[3] * nw * 2};
        for (long c = 0; c < ngp / 8; c++) { /* the quad's {scale, bias} vectors, once for all its tokens */
            __m256 sw[4], bw[4];
            for (int i = 0; i < 4; i++)
                iq_sb_rep(s[i], 8 * c, ng, rep, &sw[i], &bw[i]);
            SB[4 * c] = cat_ps(sw[0], sw[1]);
            SB[4 * c + 1] = cat_ps(bw[0], bw[1]);
            SB[4 * c + 2] = cat_ps(sw[2], sw[3]);
            SB[4 * c + 3] = cat_ps(bw[2], bw[3]);
        }
        for (long t0 = 0; t0 < T; t0 += 4) {
            long t[4];
            for (int i = 0; i < 4; i++)
                t[i] = t0 + i < T ? t0 + i : T - 1; /* a short last quad repeats its last token */
            const int8_t *a0 = A + t[0] * span, *a1 = A + t[1] * span, *a2 = A + t[2] * span, *a3 = A + t[3] * span;
            __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0, g0 = f0, g1 = f0, g2 = f0, g3 = f0;
            for (long c = 0; c < ngp / 8; c++) {
                __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, u0 = s0, u1 = s0, u2 = s0, u3 = s0;
                for (long v = c * nv; v < (c + 1) * nv; v++) {
                    __m512i w0 = LDZ(W0 + v * 64), w1 = LDZ(W1 + v * 64);
                    __m512i x0 = _mm512_broadcast_i64x4(LD(a0 + v * 32)), x1 = _mm512_broadcast_i64x4(LD(a1 + v * 32));
                    __m512i x2 = _mm512_broadcast_i64x4(LD(a2 + v * 32)), x3 = _mm512_broadcast_i64x4(LD(a3 + v * 32));
                    s0 = _mm512_dpbusd_epi32(s0, w0, x0);
                    s1 = _mm512_dpbusd_epi32(s1, w0, x1);
                    s2 = _mm512_dpbusd_epi32(s2, w0, x2);
                    s3 = _mm512_dpbusd_epi32(s3, w0, x3);
                    u0 = _mm512_dpbusd_epi32(u0, w1, x0);
                    u1 = _mm512_dpbusd_epi32(u1, w1, x1);
                    u2 = _mm512_dpbusd_epi32(u2, w1, x2);
                    u3 = _mm512_dpbusd_epi32(u3, w1, x3);
                }
                __m512 swa = SB[4 * c], bwa = SB[4 * c + 1], swb = SB[4 * c + 2], bwb = SB[4 * c + 3];
#define COMBINE(F, G, S, U, ti)                                                                                \
    do {                                                                                                      \
        const float *q = qs + t[ti] * 2 * ngp + 8 * c;                                                        \
        __m512 d = dup_ps(q), a = dup_ps(q + ngp);                                                            \
        F = _mm512_fmadd_ps(_mm512_fmadd_ps(swa, _mm512_cvtepi32_ps(S), _mm512_mul_ps(bwa, a)), d, F);         \
        G = _mm512_fmadd_ps(_mm512_fmadd_ps(swb, _mm512_cvtepi32_ps(U), _mm512_mul_ps(bwb, a)), d, G);         \
    } while (0)
                COMBINE(f0, g0, s0, u0, 0);
                COMBINE(f1, g1, s1, u1, 1);
                COMBINE(f2, g2, s2, u2, 2);
                COMBINE(f3, g3, s3, u3, 3);
#undef COMBINE
            }
            __m512 F[4] = {f0, f1, f2, f3}, G[4] = {g0, g1, g2, g3};
            for (int i = 0; i < 4 && t0 + i < T; i++) {
                float *y = Y + (t0 + i) * ldy;
                float v[4] = {iq_hsum(_mm512_castps512_ps256(F[i])), iq_hsum(hi_ps(F[i])),
                              iq_hsum(_mm512_castps512_ps256(G[i])), iq_hsum(hi_ps(G[i]))};
                for (int k = 0; k < 4 && r + k < r1; k++)
                    y[r + k] = v[k];
            }
        }
    }
}

/* ---- Panels made at load (kernels.h, tern_iq_panels_make): the
 * micro-kernel above on the stored layout - a quad of rows, chunk after
 * chunk of one sequential stream (fetched PW_AHEAD bytes ahead), each
 * chunk for every 4-token tile of a token block (intdot_simd.h) - with the
 * quad's {scale, bias} pairs read from the chunk's bf16 words. One token
 * takes a 1-token tile (no token computed twice); every (row, token)
 * result is the 256-bit combination of the contract either way. */
#define PW_AHEAD 2048
typedef struct pw_shape {
    long nc, nw, nv, cb, ngp, span; /* chunks, row vectors a chunk, input vectors a chunk, chunk bytes, qs
                                       blocks, a token's panel inputs */
    __m512i ia;       /* a quad pair's {scale, bias} words to the 16 lanes */
    __mmask16 m;      /* the words of a quad pair */
    long pb;          /* the bytes of a quad pair's words */
} pw_shape;

static inline __attribute__((always_inline)) void pw_pairs(const uint8_t *s, const pw_shape *sh, __m512 *swa,
                                                           __m512 *bwa, __m512 *swb, __m512 *bwb)
{
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512i a = _mm512_permutexvar_epi32(sh->ia, _mm512_maskz_loadu_epi32(sh->m, s));
    __m512i b = _mm512_permutexvar_epi32(sh->ia, _mm512_maskz_loadu_epi32(sh->m, s + sh->pb));
    *swa = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    *bwa = _mm512_castsi512_ps(_mm512_and_si512(a, hi));
    *swb = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
    *bwb = _mm512_castsi512_ps(_mm512_and_si512(b, hi));
}

/* Chunk c (its bytes at W) of a quad for NT tokens (a: their panel inputs,
 * q: their qs), added into the tile's F (pair 0) and G (pair 1). */
static inline __attribute__((always_inline)) void pw_chunk(int bits, int NT, const uint8_t *W, long c,
                                                           const pw_shape *sh, const int8_t *const *a,
                                                           const float *const *q, __m512 *F, __m512 *G)
{
    const __m512i nib = _mm512_set1_epi8(15);
    long nw = sh->nw, nv = sh->nv;
    __m512i S[4], U[4];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++)
        S[t] = U[t] = _mm512_setzero_si512();
    for (long k = 0; k < nw; k++) {
        __m512i w0 = LDZ(W + k * 128), w1 = LDZ(W + k * 128 + 64);
        if (bits == 8) {
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512i x = _mm512_broadcast_i64x4(LD(a[t] + (c * nv + k) * 32));
                S[t] = _mm512_dpbusd_epi32(S[t], w0, x);
                U[t] = _mm512_dpbusd_epi32(U[t], w1, x);
            }
        } else {
            __m512i l0 = _mm512_and_si512(w0, nib), h0 = _mm512_and_si512(_mm512_srli_epi16(w0, 4), nib);
            __m512i l1 = _mm512_and_si512(w1, nib), h1 = _mm512_and_si512(_mm512_srli_epi16(w1, 4), nib);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                __m512i e = _mm512_broadcast_i64x4(LD(a[t] + (c * nv + 2 * k) * 32));
                __m512i o = _mm512_broadcast_i64x4(LD(a[t] + (c * nv + 2 * k + 1) * 32));
                S[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(S[t], l0, e), h0, o);
                U[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(U[t], l1, e), h1, o);
            }
        }
    }
    __m512 swa, bwa, swb, bwb;
    pw_pairs(W + 2 * nw * 64, sh, &swa, &bwa, &swb, &bwb);
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        __m512 d = dup_ps(q[t] + 8 * c), A = dup_ps(q[t] + sh->ngp + 8 * c);
        F[t] = _mm512_fmadd_ps(_mm512_fmadd_ps(swa, _mm512_cvtepi32_ps(S[t]), _mm512_mul_ps(bwa, A)), d, F[t]);
        G[t] = _mm512_fmadd_ps(_mm512_fmadd_ps(swb, _mm512_cvtepi32_ps(U[t]), _mm512_mul_ps(bwb, A)), d, G[t]);
    }
}

/* Quad rows inside [r0, r1) of tokens t[0 .. nt) from the tile's F, G. */
static inline void pw_store(const __m512 *F, const __m512 *G, const long *t, int nt, float *Y, long ldy, long r,
                            long r0, long r1)
{
    for (int i = 0; i < nt; i++) {
        float v[4] = {iq_hsum(_mm512_castps512_ps256(F[i])), iq_hsum(hi_ps(F[i])),
                      iq_hsum(_mm512_castps512_ps256(G[i])), iq_hsum(hi_ps(G[i]))};
        for (int k = 0; k < 4; k++)
            if (r + k >= r0 && r + k < r1)
                Y[t[i] * ldy + r + k] = v[k];
    }
}

static inline __attribute__((always_inline)) void pw_product(int bits, const uint8_t *P, int group, const int8_t *A,
                                                             const float *qs, float *Y, long T, long n_in, long ldy,
                                                             long r0, long r1)
{
    int B = tern_iq_ablock(group, bits), rep = group / B, per = 8 / rep;
    pw_shape sh;
    sh.nv = B / 4;
    sh.nw = tern_iq_panel_nw(group, bits);
    sh.ngp = tern_iq_nbp(n_in, group, bits);
    sh.nc = sh.ngp / 8;
    sh.cb = tern_iq_panel_cb(group, bits);
    sh.span = tern_iq_panel_span(n_in, group, bits);
    /* lane j < 8: the pair's first row, its group j / rep; lane 8 + j: the second row's */
    int ia[16];
    for (int j = 0; j < 16; j++)
        ia[j] = (j / 8) * per + (j % 8) / rep;
    sh.ia = _mm512_loadu_si512(ia);
    sh.m = (__mmask16)((1u << (2 * per)) - 1);
    sh.pb = 2 * per * 4;
    long tb = iq_pw_block(sh.span);
    __m512 F[IQ_PW_TOKENS], G[IQ_PW_TOKENS]; /* a token block's sums of one quad */
    for (long b0 = 0; b0 < T; b0 += tb) {
        long n = b0 + tb < T ? tb : T - b0, t[IQ_PW_TOKENS];
        const int8_t *a[IQ_PW_TOKENS];
        const float *q[IQ_PW_TOKENS];
        iq_pw_tokens(b0, n, A, sh.span, qs, sh.ngp, t, a, q);
        for (long q0 = r0 / 4; q0 * 4 < r1; q0++) {
            const uint8_t *Pq = P + q0 * sh.nc * sh.cb;
            if (n <= 4) { /* one tile: its sums in registers */
                __m512 f[4], g[4];
                for (int i = 0; i < 4; i++)
                    f[i] = g[i] = _mm512_setzero_ps();
                for (long c = 0; c < sh.nc; c++) {
                    const uint8_t *W = Pq + c * sh.cb;
                    for (long o = 0; o < sh.cb; o += 64)
                        _mm_prefetch((const char *)W + PW_AHEAD + o, _MM_HINT_T0);
                    if (n == 1)
                        pw_chunk(bits, 1, W, c, &sh, a, q, f, g);
                    else
                        pw_chunk(bits, 4, W, c, &sh, a, q, f, g);
                }
                pw_store(f, g, t, (int)n, Y, ldy, 4 * q0, r0, r1);
                continue;
            }
            for (long i = 0; i < (n + 3) / 4 * 4; i++)
                F[i] = G[i] = _mm512_setzero_ps();
            /* chunk by chunk, every tile of the block: each chunk read from
             * memory once and used by all the block's tokens at once */
            for (long c = 0; c < sh.nc; c++) {
                const uint8_t *W = Pq + c * sh.cb;
                for (long o = 0; o < sh.cb; o += 64)
                    _mm_prefetch((const char *)W + PW_AHEAD + o, _MM_HINT_T0);
                for (long i = 0; i < n; i += 4)
                    pw_chunk(bits, 4, W, c, &sh, a + i, q + i, F + i, G + i);
            }
            for (long i = 0; i < n; i += 4)
                pw_store(F + i, G + i, t + i, n - i < 4 ? (int)(n - i) : 4, Y, ldy, 4 * q0, r0, r1);
        }
    }
}

void tern_iq_panels_q4(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T, long n_in,
                       long ldy, long r0, long r1)
{
    pw_product(4, P, group, A, qs, Y, T, n_in, ldy, r0, r1);
}

void tern_iq_panels_q8(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T, long n_in,
                       long ldy, long r0, long r1)
{
    pw_product(8, P, group, A, qs, Y, T, n_in, ldy, r0, r1);
}

void tern_iq_vnni_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    if (group == 64 && T < IQ_PANEL_MIN_T)
        few_tokens(Wq, sb, 0, 64, 4, Q, qs, Y, T, n_in, ldy, r0, r1);
    else if (group == 128 && T < IQ_PANEL_MIN_T)
        few_tokens(Wq, sb, 0, 128, 4, Q, qs, Y, T, n_in, ldy, r0, r1);
    else
        iq_product(panel_product, vnni_q4_rows, Wq, sb, group, 4, Q, qs, Y, T, n_in, ldy, r0, r1);
}

void tern_iq_vnni_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1)
{
    if (group == 64 && T < IQ_PANEL_MIN_T) /* 8-bit: blocks of 32 whatever the group */
        few_tokens(Wq, sb, 0, 64, 8, Q, qs, Y, T, n_in, ldy, r0, r1);
    else if (group == 128 && T < IQ_PANEL_MIN_T)
        few_tokens(Wq, sb, 0, 128, 8, Q, qs, Y, T, n_in, ldy, r0, r1);
    else if (group == 32 && T < IQ_PANEL_MIN_T)
        few_tokens(Wq, sb, 0, 32, 8, Q, qs, Y, T, n_in, ldy, r0, r1);
    else
        iq_product(panel_product, vnni_q8_rows, Wq, sb, group, 8, Q, qs, Y, T, n_in, ldy, r0, r1);
}

/* tern_iqmatmul16_fn (kernels.h): the few-token kernels for one token, the
 * pairs read as bf16. */
void tern_iq16_vnni_q4(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    if (group == 64)
        few_tokens(Wq, sb16, 1, 64, 4, Q, qs, Y, 1, n_in, 0, r0, r1);
    else
        few_tokens(Wq, sb16, 1, 128, 4, Q, qs, Y, 1, n_in, 0, r0, r1);
}

void tern_iq16_vnni_q8(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    if (group == 64)
        few_tokens(Wq, sb16, 1, 64, 8, Q, qs, Y, 1, n_in, 0, r0, r1);
    else
        few_tokens(Wq, sb16, 1, 128, 8, Q, qs, Y, 1, n_in, 0, r0, r1);
}

/* One token, bf16 pairs (tern_iqmatmul16_fn), a row at a time with 256-bit
 * vpdpbusd, for CPUs whose AVX-512 runs as two 256-bit halves (kernels.c):
 * one read stream a thread, the next row fetched as it goes. 8-bit: one
 * vpdpbusd per 32 weights (AVX2's sign trick takes five and a fix after);
 * 4-bit (groups of 64 or 128, their own blocks): the inputs rearranged once
 * as AVX2's one-token kernel does (each 64: the evens' 32 bytes, then the
 * odds'), then per 64 weights a load, two nibble masks and two vpdpbusd. A
 * chunk of 8 blocks is reduced by hadd and iq_sum8 and combined as the
 * contract says: the same bits as every kernel. */
static inline __attribute__((always_inline)) void v256_one(int bits, const uint8_t *Wq, const uint16_t *sb16,
                                                           int group, const int8_t *Q, const float *q, float *Y,
                                                           long n_in, long r0, long r1)
{
    _Alignas(32) int8_t xr[TERN_IQ16_MAX_IN]; /* 4-bit inputs rearranged */
    const int8_t *x = Q;
    if (bits == 4) {
        iq_q4_one_acts(Q, n_in, xr);
        x = xr;
    }
    const __m256i m = _mm256_set1_epi8(15);
    int B = bits == 8 ? 32 : group; /* the activation block */
    long ng = n_in / group, nb = n_in / B, nbp = tern_iq_ngp(nb), rep = group / B, rowb = n_in * bits / 8;
    for (long r = r0; r < r1; r++) {
        const uint8_t *w = Wq + r * rowb, *pf = r + 1 < r1 ? w + rowb : NULL;
        const uint16_t *s = sb16 + r * ng * 2;
        __m256 f = _mm256_setzero_ps();
        for (long c = 0; c < nbp; c += 8) {
            if (pf)
#pragma GCC unroll 8
                for (int o = 0; o < B * bits; o += 64)
                    _mm_prefetch((const char *)pf + c * B * bits / 8 + o, _MM_HINT_T0);
            __m256i hv[4];
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i v[2];
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    long g = c + 2 * k + h;
                    v[h] = _mm256_setzero_si256();
                    if (g >= nb)
                        continue;
                    if (bits == 8) {
                        v[h] = _mm256_dpbusd_epi32(v[h], LD(w + g * 32), LD(x + g * 32));
                        continue;
                    }
#pragma GCC unroll 2
                    for (int i = 0; i < B; i += 64) {
                        __m256i b = LD(w + (g * B + i) / 2);
                        v[h] = _mm256_dpbusd_epi32(v[h], _mm256_and_si256(b, m), LD(x + g * B + i));
                        v[h] = _mm256_dpbusd_epi32(v[h], _mm256_and_si256(_mm256_srli_epi16(b, 4), m),
                                                   LD(x + g * B + i + 32));
                    }
                }
                hv[k] = _mm256_hadd_epi32(v[0], v[1]);
            }
            __m256 sw, bw;
            iq_sb16_rep(s, c, nb, rep, &sw, &bw);
            f = iq_combine(f, iq_sum8(hv[0], hv[1], hv[2], hv[3]), sw, bw, q + c, q + nbp + c);
        }
        Y[r] = iq_hsum(f);
    }
}

/* the group a constant (64 or 128) in each instance */
static inline __attribute__((always_inline)) void v256(int bits, const uint8_t *Wq, const uint16_t *sb16, int group,
                                                       const int8_t *Q, const float *qs, float *Y, long n_in,
                                                       long r0, long r1)
{
    if (group == 64)
        v256_one(bits, Wq, sb16, 64, Q, qs, Y, n_in, r0, r1);
    else
        v256_one(bits, Wq, sb16, 128, Q, qs, Y, n_in, r0, r1);
}

void tern_iq16_v256_q4(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    v256(4, Wq, sb16, group, Q, qs, Y, n_in, r0, r1);
}

void tern_iq16_v256_q8(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1)
{
    v256(8, Wq, sb16, group, Q, qs, Y, n_in, r0, r1);
}
