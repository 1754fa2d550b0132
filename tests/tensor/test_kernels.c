/* Every optimized kernel against the scalar reference on fresh random inputs
 * (new seed each run, printed so a failure can be replayed with TERN_SEED),
 * including sizes that are not multiples of the vector width. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/cpu.h"
#include "base/rng.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"

const tern_kernels *tern_kernels_avx512_table(void);

static tern_rng rng;

static float rnd(void) { return tern_rng_f32(&rng) * 2.0f - 1.0f; }

/* The bf16-activation product (kernels.h, tern_bmatmul_fn) against the
 * scalar reference: the activations' bf16 bits equal the scalar
 * conversion's, the sums agree within f32 reordering, row ranges and every
 * token alone give the same bits. */
static void check_bf16b(const tern_kernels *k, const uint16_t *wb, const float *x, long T, long n_in, long n_out,
                        float *y0, float *y1)
{
    uint16_t *xb = malloc((size_t)(T * n_in) * 2);
    k->bf16_act(x, T * n_in, xb);
    for (long i = 0; i < T * n_in; i++)
        if (xb[i] != tern_f32_to_bf16(x[i]))
            fail_msg("%s bf16_act: input %ld %a gives %04x, not %04x", k->isa, i, x[i], xb[i], tern_f32_to_bf16(x[i]));
    tern_matmul_bf16b_ref(wb, xb, y0, T, n_in, n_out, 0, n_out);
    k->matmul_bf16b(wb, xb, y1, T, n_in, n_out, 0, n_out);
    for (long i = 0; i < T * n_out; i++)
        if (fabs(y0[i] - y1[i]) > 1e-6 * (double)n_in + 1e-6)
            fail_msg("%s matmul_bf16b n_out %ld n_in %ld T %ld: %g vs %g", k->isa, n_out, n_in, T, y1[i], y0[i]);
    if (n_out > 1) {
        k->matmul_bf16b(wb, xb, y0, T, n_in, n_out, 0, n_out / 2);
        k->matmul_bf16b(wb, xb, y0, T, n_in, n_out, n_out / 2, n_out);
        for (long i = 0; i < T * n_out; i++)
            assert_true(y0[i] == y1[i]);
    }
    for (long t = 0; t < T; t++) {
        k->matmul_bf16b(wb, xb + t * n_in, y0, 1, n_in, n_out, 0, n_out);
        for (long r = 0; r < n_out; r++)
            if (y0[r] != y1[t * n_out + r])
                fail_msg("%s matmul_bf16b: token %ld of %ld differs from alone", k->isa, t, T);
    }
    free(xb);
}

/* bf16_act on the values where a vector conversion could differ from the
 * scalar one: ties, denormals, NaNs, infinities, the largest finite. */
static void check_bf16_act_special(const tern_kernels *k)
{
    static const uint32_t bits[] = {0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00400000, 0x00800000,
                                    0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7fffff, 0xff7fffff, 0x7f800000,
                                    0xff800000, 0x7fc00000, 0x7f800001, 0xffbfffff, 0x3f800001, 0x477fe000};
    enum { N = 37 };
    float x[N];
    uint16_t xb[N];
    for (int i = 0; i < N; i++) {
        uint32_t u = bits[(i * 7) % (sizeof bits / sizeof bits[0])];
        memcpy(&x[i], &u, 4);
    }
    k->bf16_act(x, N, xb);
    for (int i = 0; i < N; i++)
        if (xb[i] != tern_f32_to_bf16(x[i]))
            fail_msg("%s bf16_act: %a gives %04x, not %04x", k->isa, x[i], xb[i], tern_f32_to_bf16(x[i]));
}

static void check_table(const tern_kernels *k)
{
    if (k->matmul_bf16b)
        check_bf16_act_special(k);
    const tern_kernels *ref = tern_kernels_scalar();
    static const long sizes[][2] = {{1, 1}, {3, 7}, {5, 8}, {9, 31}, {4, 32}, {17, 33}, {8, 64},
                                    {13, 172}, {6, 384}, {3, 1000}, {2, 4096},
                                    {53, 603}, {26, 520}}; /* past one row block and one slab of the AVX2 tiles */
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        long n_out = sizes[si][0], n_in = sizes[si][1];
        /* 1-6 tokens, 9 and 11 (several 4-token tiles plus a short one), 37
         * (AVX2: the slabs widened once for all quads, from 32 tokens) and
         * 70 (AVX2: past one 64-token pass) */
        for (long T = 1; T <= 70; T += T < 6 ? 1 : T == 6 ? 3 : T < 11 ? 2 : T < 37 ? 26 : 33) {
            float *wf = malloc((size_t)(n_out * n_in) * 4), *x = malloc((size_t)(T * n_in) * 4);
            uint16_t *wb = malloc((size_t)(n_out * n_in) * 2), *wh = malloc((size_t)(n_out * n_in) * 2);
            float *y0 = malloc((size_t)(T * n_out) * 4), *y1 = malloc((size_t)(T * n_out) * 4);
            for (long i = 0; i < n_out * n_in; i++) {
                wf[i] = rnd();
                wb[i] = tern_f32_to_bf16(wf[i]);
                wh[i] = tern_f32_to_f16(wf[i]);
            }
            for (long i = 0; i < T * n_in; i++)
                x[i] = rnd();
            const void *ws[3] = {wf, wb, wh};
            tern_matmul_fn fr[3] = {ref->matmul_f32, ref->matmul_bf16, ref->matmul_f16};
            tern_matmul_fn fk[3] = {k->matmul_f32, k->matmul_bf16, k->matmul_f16};
            for (int d = 0; d < 3; d++) {
                fr[d](ws[d], x, y0, T, n_in, n_out, 0, n_out);
                fk[d](ws[d], x, y1, T, n_in, n_out, 0, n_out);
                for (long i = 0; i < T * n_out; i++) {
                    /* f32 sums of n_in terms of magnitude <= 1 reordered:
                     * error bound ~ n_in * eps * sum|terms| */
                    double tol = 1e-6 * (double)n_in + 1e-6;
                    if (fabs(y0[i] - y1[i]) > tol)
                        fail_msg("%s matmul dtype %d n_out %ld n_in %ld T %ld: %g vs %g", k->isa, d, n_out, n_in,
                                 T, y1[i], y0[i]);
                }
                /* rows computed in two parts give the same values (row ranges) */
                if (n_out > 1) {
                    fk[d](ws[d], x, y0, T, n_in, n_out, 0, n_out / 2);
                    fk[d](ws[d], x, y0, T, n_in, n_out, n_out / 2, n_out);
                    for (long i = 0; i < T * n_out; i++)
                        assert_true(y0[i] == y1[i]);
                }
                /* batch invariance: each token alone gives the same bits */
                for (long t = 0; t < T; t++) {
                    fk[d](ws[d], x + t * n_in, y0, 1, n_in, n_out, 0, n_out);
                    for (long r = 0; r < n_out; r++)
                        if (y0[r] != y1[t * n_out + r])
                            fail_msg("%s dtype %d: token %ld of %ld differs from alone", k->isa, d, t, T);
                }
            }
            if (k->matmul_bf16b)
                check_bf16b(k, wb, x, T, n_in, n_out, y0, y1);
            float a = rnd();
            float d0 = ref->dot(x, wf, n_in), d1 = k->dot(x, wf, n_in);
            assert_true(fabs(d0 - d1) <= 1e-6 * n_in + 1e-6);
            float *z0 = malloc((size_t)n_in * 4), *z1 = malloc((size_t)n_in * 4);
            for (long i = 0; i < n_in; i++)
                z0[i] = z1[i] = x[i];
            ref->axpy(a, wf, z0, n_in);
            k->axpy(a, wf, z1, n_in);
            for (long i = 0; i < n_in; i++)
                assert_true(fabs(z0[i] - z1[i]) <= 1e-6);
            free(z0), free(z1);
            free(wf), free(x), free(wb), free(wh), free(y0), free(y1);
        }
    }
}

/* MLX affine layout written independently of the kernels: value i of a row
 * goes to 32-bit word i / (32 / bits) at bit (i % (32 / bits)) * bits. */
static void pack_row(const int *q, long n, int bits, uint32_t *words)
{
    int per = 32 / bits;
    memset(words, 0, (size_t)(n / per) * 4);
    for (long i = 0; i < n; i++)
        words[i / per] |= (uint32_t)q[i] << ((i % per) * bits);
}

/* Quantized products of every table against a double-precision product of
 * the dequantized weights, and against the scalar table; row ranges and
 * batch invariance as for the dense kernels. */
static void check_quant(const tern_kernels *k)
{
    const tern_kernels *ref = tern_kernels_scalar();
    static const long shapes[][3] = {{1, 32, 32}, {3, 64, 32}, {5, 128, 64}, {4, 256, 128}, {7, 384, 64},
                                     {2, 896, 128}, {3, 96, 32}};
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            long n_out = shapes[si][0], n_in = shapes[si][1], G = shapes[si][2], ng = n_in / G;
            long T = 1 + (long)(tern_rng_u32(&rng) % 5);
            int *q = malloc((size_t)(n_out * n_in) * sizeof(int));
            uint32_t *wq = malloc((size_t)(n_out * n_in * bits / 32) * 4);
            float *sb = malloc((size_t)(n_out * ng * 2) * 4), *x = malloc((size_t)(T * n_in) * 4);
            float *xs = malloc((size_t)(T * ng) * 4), *y0 = malloc((size_t)(T * n_out) * 4);
            float *y1 = malloc((size_t)(T * n_out) * 4);
            for (long i = 0; i < n_out * n_in; i++)
                q[i] = (int)(tern_rng_u32(&rng) % (1u << bits));
            for (long r = 0; r < n_out; r++)
                pack_row(q + r * n_in, n_in, bits, wq + r * n_in * bits / 32);
            for (long i = 0; i < n_out * ng; i++) {
                sb[2 * i] = 0.01f * (1.0f + rnd());
                sb[2 * i + 1] = 0.1f * rnd();
            }
            for (long i = 0; i < T * n_in; i++)
                x[i] = rnd();
            for (long t = 0; t < T; t++)
                for (long g = 0; g < ng; g++) {
                    float sum = 0;
                    for (long i = g * G; i < (g + 1) * G; i++)
                        sum += x[t * n_in + i];
                    xs[t * ng + g] = sum;
                }
            tern_qmatmul_fn fk = bits == 4 ? k->matmul_q4 : k->matmul_q8;
            tern_qmatmul_fn fr = bits == 4 ? ref->matmul_q4 : ref->matmul_q8;
            fk((const uint8_t *)wq, sb, (int)G, x, xs, y1, T, n_in, n_out, 0, n_out);
            fr((const uint8_t *)wq, sb, (int)G, x, xs, y0, T, n_in, n_out, 0, n_out);
            for (long t = 0; t < T; t++)
                for (long r = 0; r < n_out; r++) {
                    double want = 0, mag = 0;
                    for (long i = 0; i < n_in; i++) {
                        long g = i / G;
                        double w = (double)sb[(r * ng + g) * 2] * q[r * n_in + i] + sb[(r * ng + g) * 2 + 1];
                        want += w * x[t * n_in + i];
                        mag += fabs(w * x[t * n_in + i]);
                    }
                    double tol = 1e-6 * mag * 8 + 1e-6;
                    float got = y1[t * n_out + r], sc = y0[t * n_out + r];
                    if (fabs(got - want) > tol || fabs(got - sc) > tol)
                        fail_msg("%s q%d n_in %ld group %ld T %ld: %g, scalar %g, exact %g", k->isa, bits, n_in, G,
                                 T, got, sc, want);
                }
            if (n_out > 1) {
                fk((const uint8_t *)wq, sb, (int)G, x, xs, y0, T, n_in, n_out, 0, n_out / 2);
                fk((const uint8_t *)wq, sb, (int)G, x, xs, y0, T, n_in, n_out, n_out / 2, n_out);
                for (long i = 0; i < T * n_out; i++)
                    assert_true(y0[i] == y1[i]);
            }
            for (long t = 0; t < T; t++) {
                fk((const uint8_t *)wq, sb, (int)G, x + t * n_in, xs + t * ng, y0, 1, n_in, n_out, 0, n_out);
                for (long r = 0; r < n_out; r++)
                    if (y0[r] != y1[t * n_out + r])
                        fail_msg("%s q%d: token %ld of %ld differs from alone", k->isa, bits, t, T);
            }
            free(q), free(wq), free(sb), free(x), free(xs), free(y0), free(y1);
        }
}

/* The integer products: the table's activation quantization and products
 * must equal the scalar reference bit for bit (kernels.h: the integer sums
 * are exact and the f32 combination order is fixed), on fresh random inputs
 * with tails of groups (n_groups not a multiple of 8), zero blocks, every
 * group size; row ranges and tokens alone give the same bits. The scalar
 * reference itself is checked against a double-precision product of the
 * dequantized weights and dequantized activations, and the quantized
 * activations against the f32 inputs. */
/* Where input i's activation sits in Q (kernels.h): 4-bit products read
 * each 32 inputs as 16 even then 16 odd ones. */
static long qidx(long i, int bits) { return bits == 4 ? (i & ~31L) + ((i & 31) >> 1) + (i & 1) * 16 : i; }

/* The panel products (kernels.h, tern_iqpanel_fn), where k has them: the
 * weight rearranged by tern_iq_panels_make (into a buffer of stray bytes,
 * in two quad ranges), then the product whole and in row ranges that cut
 * quads must give the scalar reference's bits on the bf16-rounded pairs
 * (sb is rounded in place, so the caller's later checks see those values).
 * Returns whether it ran. */
static int g_panels_checked;
static int check_panels(const tern_kernels *k, int bits, const uint8_t *wq, float *sb, long n_out, long n_in, long G,
                        const int8_t *Q, const float *qs, long T, const char *what)
{
    tern_iqpanel_fn fw = bits == 4 ? k->imatmul_q4w : k->imatmul_q8w;
    if (!fw || !tern_iq_panels_ok(k, (int)G, bits, n_in))
        return 0;
    const tern_kernels *ref = tern_kernels_scalar();
    long ng = n_in / G, nq = (n_out + 3) / 4;
    size_t len = tern_iq_panels_len(n_out, n_in, (int)G, bits);
    uint16_t *s16 = malloc((size_t)(n_out * ng * 2) * 2);
    uint8_t *P = malloc(len);
    float *y0 = malloc((size_t)(T * n_out) * 4), *y1 = malloc((size_t)(T * n_out) * 4);
    for (long i = 0; i < n_out * ng * 2; i++) {
        s16[i] = tern_f32_to_bf16(sb[i]);
        sb[i] = tern_bf16_to_f32(s16[i]);
    }
    long span = tern_iq_panel_span(n_in, (int)G, bits);
    int8_t *A = malloc((size_t)(T * span));
    memset(A, 0x5A, (size_t)(T * span));
    k->iq_panel_acts(Q, T, n_in, (int)G, bits, A);
    memset(P, 0xA5, len);
    tern_iq_panels_make(wq, s16, n_out, n_in, (int)G, bits, P, nq / 2, nq);
    tern_iq_panels_make(wq, s16, n_out, n_in, (int)G, bits, P, 0, nq / 2);
    (bits == 4 ? ref->imatmul_q4 : ref->imatmul_q8)(wq, sb, (int)G, Q, qs, y0, T, n_in, n_out, 0, n_out);
    memset(y1, 0x7F, (size_t)(T * n_out) * 4);
    fw(P, (int)G, A, qs, y1, T, n_in, n_out, 0, n_out);
    if (memcmp(y0, y1, (size_t)(T * n_out) * 4))
        fail_msg("%s panels iq%d n_in %ld group %ld T %ld%s: not the scalar reference's bits", k->isa, bits, n_in, G,
                 T, what);
    long cut = n_out > 2 ? n_out / 2 | 1 : n_out; /* odd: inside a quad */
    memset(y1, 0x7F, (size_t)(T * n_out) * 4);
    fw(P, (int)G, A, qs, y1, T, n_in, n_out, 0, cut);
    fw(P, (int)G, A, qs, y1, T, n_in, n_out, cut, n_out);
    assert_memory_equal(y0, y1, (size_t)(T * n_out) * 4);
    free(s16), free(P), free(A), free(y0), free(y1);
    g_panels_checked++;
    return 1;
}

static void check_iq(const tern_kernels *k)
{
    const tern_kernels *ref = tern_kernels_scalar();
    static const long shapes[][3] = {{1, 32, 32}, {3, 64, 32}, {5, 128, 64}, {4, 256, 128}, {7, 384, 64},
                                     {2, 896, 128}, {3, 96, 32}, {5, 576, 32}, {3, 1088, 64}, {2, 2048, 64},
                                     {4, 2176, 128}, {37, 320, 64}, {70, 256, 128}, {35, 640, 32},
                                     {3, 16384, 64}}; /* the last: panels in several token blocks */
    for (int bits = 4; bits <= 8; bits += 4)
        for (size_t si = 0; si < 3 * sizeof shapes / sizeof shapes[0]; si++) {
            long n_out = shapes[si / 3][0], n_in = shapes[si / 3][1], G = shapes[si / 3][2], ng = n_in / G;
            /* activation blocks (kernels.h): 32 inputs for 8 bits, the group for 4 */
            long B = tern_iq_ablock((int)G, bits), nb = n_in / B, ngp = tern_iq_nbp(n_in, (int)G, bits);
            /* one token (decode), a few (the few-token kernels) and many
             * (the panels from 8 tokens) for each shape and bits */
            long T = si % 3 == 0 ? 1 : si % 3 == 1 ? 2 + (long)(tern_rng_u32(&rng) % 6) : 16 + (long)(tern_rng_u32(&rng) % 9);
            int *q = malloc((size_t)(n_out * n_in) * sizeof(int));
            uint32_t *wq = malloc((size_t)(n_out * n_in * bits / 32) * 4);
            float *sb = malloc((size_t)(n_out * ng * 2) * 4), *x = malloc((size_t)(T * n_in) * 4);
            int8_t *Q0 = malloc((size_t)(T * n_in)), *Q1 = malloc((size_t)(T * n_in));
            float *qs0 = malloc((size_t)(T * 2 * ngp) * 4), *qs1 = malloc((size_t)(T * 2 * ngp) * 4);
            float *y0 = malloc((size_t)(T * n_out) * 4), *y1 = malloc((size_t)(T * n_out) * 4);
            for (long i = 0; i < n_out * n_in; i++)
                q[i] = (int)(tern_rng_u32(&rng) % (1u << bits));
            for (long r = 0; r < n_out; r++)
                pack_row(q + r * n_in, n_in, bits, wq + r * n_in * bits / 32);
            for (long i = 0; i < n_out * ng; i++) {
                sb[2 * i] = 0.01f * (1.0f + rnd());
                sb[2 * i + 1] = 0.1f * rnd();
            }
            /* inputs of varied magnitude per token and per 32 inputs (so that
             * a block read with another block's scale is far off); one
             * all-zero block */
            for (long t = 0; t < T; t++) {
                float mag = 1e-3f + 10.0f * tern_rng_f32(&rng);
                for (long i = 0; i < n_in; i++) {
                    if (i % 32 == 0)
                        mag = (1e-3f + 10.0f * tern_rng_f32(&rng)) * (tern_rng_u32(&rng) % 4 ? 1.0f : 1e-2f);
                    x[t * n_in + i] = mag * rnd();
                }
            }
            if (T > 1)
                memset(x + n_in, 0, (size_t)G * 4);
            memset(qs0, 0x55, (size_t)(T * 2 * ngp) * 4);
            memset(qs1, 0x66, (size_t)(T * 2 * ngp) * 4);
            ref->quant_act(x, T, n_in, (int)G, bits, Q0, qs0);
            k->quant_act(x, T, n_in, (int)G, bits, Q1, qs1);
            if (memcmp(Q0, Q1, (size_t)(T * n_in)) || memcmp(qs0, qs1, (size_t)(T * 2 * ngp) * 4))
                fail_msg("%s quant_act n_in %ld group %ld T %ld differs from the scalar reference", k->isa, n_in, G, T);
            for (long t = 0; t < T; t++)
                for (long g = 0; g < ngp; g++) {
                    float d = qs0[t * 2 * ngp + g], A = qs0[t * 2 * ngp + ngp + g], amax = 0.0f;
                    long sum = 0;
                    for (long i = g * B; g < nb && i < (g + 1) * B; i++) {
                        sum += Q0[t * n_in + i];
                        amax = fabsf(x[t * n_in + i]) > amax ? fabsf(x[t * n_in + i]) : amax;
                        /* |x - d q| <= d / 2 (rounding to the nearest step), plus
                         * the f32 rounding of x * 127 / max and of d */
                        assert_true(fabs(x[t * n_in + i] - d * Q0[t * n_in + qidx(i, bits)]) <= 0.5 * d + 1e-4 * d + 1e-30);
                    }
                    assert_true(A == (float)sum);
                    if (g >= nb)
                        assert_true(d == 0 && A == 0);
                    else if (amax >= 1e-30f && d != amax / 127.0f) /* the block's own max, B inputs wide */
                        fail_msg("quant_act bits %d group %ld: block %ld's d %g is not its max %g / 127", bits, G, g,
                                 d, amax);
                }
            tern_iqmatmul_fn fk = bits == 4 ? k->imatmul_q4 : k->imatmul_q8;
            tern_iqmatmul_fn fr = bits == 4 ? ref->imatmul_q4 : ref->imatmul_q8;
            fr((const uint8_t *)wq, sb, (int)G, Q0, qs0, y0, T, n_in, n_out, 0, n_out);
            fk((const uint8_t *)wq, sb, (int)G, Q0, qs0, y1, T, n_in, n_out, 0, n_out);
            for (long t = 0; t < T; t++)
                for (long r = 0; r < n_out; r++) {
                    double want = 0, mag = 0;
                    for (long i = 0; i < n_in; i++) {
                        long g = i / G;
                        double w = (double)sb[(r * ng + g) * 2] * q[r * n_in + i] + sb[(r * ng + g) * 2 + 1];
                        double a = (double)qs0[t * 2 * ngp + i / B] * Q0[t * n_in + qidx(i, bits)];
                        want += w * a;
                        mag += fabs(w * a);
                    }
                    float got = y1[t * n_out + r], sc = y0[t * n_out + r];
                    if (memcmp(&got, &sc, 4))
                        fail_msg("%s iq%d n_in %ld group %ld T %ld row %ld token %ld: %.9g, scalar %.9g", k->isa, bits,
                                 n_in, G, T, r, t, got, sc);
                    if (fabs(sc - want) > 1e-6 * mag * 8 + 1e-6)
                        fail_msg("scalar iq%d n_in %ld group %ld: %g, exact %g", bits, n_in, G, sc, want);
                }
            if (n_out > 1) {
                fk((const uint8_t *)wq, sb, (int)G, Q0, qs0, y0, T, n_in, n_out, 0, n_out / 2);
                fk((const uint8_t *)wq, sb, (int)G, Q0, qs0, y0, T, n_in, n_out, n_out / 2, n_out);
                assert_memory_equal(y0, y1, (size_t)(T * n_out) * 4);
            }
            if (check_panels(k, bits, (const uint8_t *)wq, sb, n_out, n_in, G, Q0, qs0, T, "")) /* sb now bf16 values */
                fk((const uint8_t *)wq, sb, (int)G, Q0, qs0, y1, T, n_in, n_out, 0, n_out);
            tern_iqmatmul16_fn fh = bits == 4 ? k->imatmul_q4h : k->imatmul_q8h;
            if (T == 1 && (G == 64 || G == 128) && fh) {
                /* bf16 pairs (tern_iqmatmul16_fn): the f32 product's bits on
                 * the same values, whole and in two row ranges */
                uint16_t *s16 = malloc((size_t)(n_out * ng * 2) * 2);
                for (long i = 0; i < n_out * ng * 2; i++) {
                    s16[i] = tern_f32_to_bf16(sb[i]);
                    sb[i] = tern_bf16_to_f32(s16[i]);
                }
                fr((const uint8_t *)wq, sb, (int)G, Q0, qs0, y0, 1, n_in, n_out, 0, n_out);
                fh((const uint8_t *)wq, s16, (int)G, Q0, qs0, y1, n_in, 0, n_out);
                if (memcmp(y0, y1, (size_t)n_out * 4))
                    fail_msg("%s iq%d bf16 pairs n_in %ld group %ld: not the f32 pairs' bits", k->isa, bits, n_in, G);
                fh((const uint8_t *)wq, s16, (int)G, Q0, qs0, y1, n_in, 0, n_out / 2);
                fh((const uint8_t *)wq, s16, (int)G, Q0, qs0, y1, n_in, n_out / 2, n_out);
                assert_memory_equal(y0, y1, (size_t)n_out * 4);
                fk((const uint8_t *)wq, sb, (int)G, Q0, qs0, y1, 1, n_in, n_out, 0, n_out); /* for the checks below */
                free(s16);
            }
            for (long t = 0; t < T; t++) {
                k->quant_act(x + t * n_in, 1, n_in, (int)G, bits, Q1, qs1);
                fk((const uint8_t *)wq, sb, (int)G, Q1, qs1, y0, 1, n_in, n_out, 0, n_out);
                for (long r = 0; r < n_out; r++)
                    if (memcmp(&y0[r], &y1[t * n_out + r], 4))
                        fail_msg("%s iq%d: token %ld of %ld differs from alone", k->isa, bits, t, T);
            }
            free(q), free(wq), free(sb), free(x), free(Q0), free(Q1), free(qs0), free(qs1), free(y0), free(y1);
        }
}

/* E4M3 code c by the format's formula (bias 7, 3 mantissa bits, S.1111.111 NaN). */
static double e4m3_formula(int c)
{
    int e = (c >> 3) & 15, m = c & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return c & 0x80 ? -v : v;
}

/* The FP8 product (kernels.h, tern_f8matmul_fn) of table k: the scalar
 * reference against the formula in double (the layout of the block
 * scales), every other table against the reference within f32
 * reordering; row ranges and every token alone give the same bits. Block
 * layouts: one scale per row (1 x n_in), per tensor, 128 x 128 (n_in not a
 * multiple: a partial last block) and 2 x 32 (many small blocks). Random
 * codes skip the NaN codes (not weights, kernels.h). */
static void check_f8(const tern_kernels *k)
{
    const tern_kernels *ref = tern_kernels_scalar();
    static const long sizes[][2] = {{1, 1}, {3, 7}, {5, 32}, {9, 44}, {4, 96}, {6, 128}, {7, 172},
                                    {5, 256}, {131, 300}, {3, 1000}, {29, 600}};
    static const long Ts[] = {1, 2, 3, 4, 5, 7, 9, 37};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (int lay = 0; lay < 8; lay++) {
            long n_out = sizes[si][0], n_in = sizes[si][1];
            /* layouts 0-3, each with a few tokens and with 37 (the AVX2 widened quads: up to 12 rows and
             * 32 tokens a pass, then the rest) */
            int fr = lay % 4 == 0 ? 1 : lay % 4 == 1 ? (int)n_out : lay % 4 == 2 ? 128 : 2;
            int fc = lay % 4 < 2 ? (int)n_in : lay % 4 == 2 ? 128 : 32;
            if (lay % 4 >= 2 && n_in < 32)
                continue;
            long ncol = (n_in + fc - 1) / fc, nfs = (n_out + fr - 1) / fr * ncol, ldy = n_out + 3;
            long T = lay >= 4 ? 37 : Ts[(si + (size_t)lay) % (sizeof Ts / sizeof Ts[0])];
            uint8_t *w = malloc((size_t)(n_out * n_in));
            float *fs = malloc((size_t)nfs * 4), *x = malloc((size_t)(T * n_in) * 4);
            float *y0 = malloc((size_t)(T * ldy) * 4), *y1 = malloc((size_t)(T * ldy) * 4);
            for (long i = 0; i < n_out * n_in; i++) {
                w[i] = (uint8_t)(tern_rng_f32(&rng) * 256.0f);
                if ((w[i] & 0x7f) == 0x7f)
                    w[i] ^= 1;
            }
            for (long i = 0; i < nfs; i++)
                fs[i] = 0.001f + 0.01f * tern_rng_f32(&rng);
            for (long i = 0; i < T * n_in; i++)
                x[i] = rnd();
            for (long i = 0; i < T * ldy; i++)
                y0[i] = y1[i] = -7.0f; /* the padding columns must stay */
            ref->matmul_f8(w, fs, fr, fc, x, y0, T, n_in, ldy, 0, n_out);
            k->matmul_f8(w, fs, fr, fc, x, y1, T, n_in, ldy, 0, n_out);
            for (long t = 0; t < T; t++)
                for (long r = 0; r < ldy; r++) {
                    double want = 0.0, mag = 0.0;
                    for (long i = 0; r < n_out && i < n_in; i++) {
                        double v = e4m3_formula(w[r * n_in + i]) * fs[r / fr * ncol + i / fc] * x[t * n_in + i];
                        want += v;
                        mag += fabs(v);
                    }
                    float a = y0[t * ldy + r], b = y1[t * ldy + r];
                    if (r >= n_out) {
                        assert_true(a == -7.0f && b == -7.0f);
                        continue;
                    }
                    /* f32 sums of n_in terms, reordered: ~n_in * eps * sum |terms| */
                    double tol = 1.2e-7 * (double)(n_in + 8) * mag + 1e-30;
                    if (fabs(a - want) > tol)
                        fail_msg("scalar matmul_f8 %ldx%ld blocks %dx%d T %ld: %g, want %g", n_out, n_in, fr, fc, T,
                                 a, want);
                    if (fabs(b - a) > tol)
                        fail_msg("%s matmul_f8 %ldx%ld blocks %dx%d T %ld row %ld token %ld: %g vs %g", k->isa, n_out,
                                 n_in, fr, fc, T, r, t, b, a);
                }
            if (n_out > 1) { /* rows in two parts, split off the tiles' multiples */
                k->matmul_f8(w, fs, fr, fc, x, y0, T, n_in, ldy, 0, n_out / 2 + 1);
                k->matmul_f8(w, fs, fr, fc, x, y0, T, n_in, ldy, n_out / 2 + 1, n_out);
                assert_memory_equal(y0, y1, (size_t)(T * ldy) * 4);
            }
            for (long t = 0; t < T; t++) {
                k->matmul_f8(w, fs, fr, fc, x + t * n_in, y0, 1, n_in, ldy, 0, n_out);
                if (memcmp(y0, y1 + t * ldy, (size_t)n_out * 4))
                    fail_msg("%s matmul_f8 %ldx%ld blocks %dx%d: token %ld of %ld differs from alone", k->isa, n_out,
                             n_in, fr, fc, t, T);
            }
            free(w), free(fs), free(x), free(y0), free(y1);
        }
}

/* The MXFP4 product (kernels.h, tern_mxmatmul_fn) of table k: the scalar
 * reference against the OCP formula in double (code table e2m1, ldexp of
 * the E8M0 scale minus 127, nibble order: input 2i low, 2i + 1 high), every
 * other table against the reference within f32 reordering; row ranges and
 * every token alone give the same bits. Random codes (all 16) and scales
 * over a wide range (E 100..150, and the extremes 0, 1 and 254 somewhere),
 * sizes around the 4-row and 8-token tiles. */
static void check_mx(const tern_kernels *k)
{
    static const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
    const tern_kernels *ref = tern_kernels_scalar();
    static const long sizes[][2] = {{1, 32}, {3, 32}, {4, 64}, {5, 96}, {9, 128}, {13, 320}, {64, 1440}};
    static const long Ts[] = {1, 2, 3, 8, 9, 17};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            long n_out = sizes[si][0], n_in = sizes[si][1], T = Ts[ti], nb = n_in / 32, ldy = n_out + 3;
            uint8_t *w = malloc((size_t)(n_out * n_in / 2)), *e = malloc((size_t)(n_out * nb));
            float *x = malloc((size_t)(T * n_in) * 4);
            float *y0 = malloc((size_t)(T * ldy) * 4), *y1 = malloc((size_t)(T * ldy) * 4);
            for (long i = 0; i < n_out * n_in / 2; i++)
                w[i] = (uint8_t)(tern_rng_u32(&rng) >> 24);
            for (long i = 0; i < n_out * nb; i++)
                e[i] = (uint8_t)(100 + tern_rng_u32(&rng) % 51);
            if (n_out * nb >= 3) /* the scale table's low end (subnormal 2^-128, 2^-127) and a large one */
                e[0] = 0, e[1] = 1, e[2] = 200;
            for (long i = 0; i < T * n_in; i++)
                x[i] = rnd();
            for (long i = 0; i < T * ldy; i++)
                y0[i] = y1[i] = -7.0f; /* the padding columns must stay */
            ref->matmul_mxfp4(w, e, x, y0, T, n_in, ldy, 0, n_out);
            k->matmul_mxfp4(w, e, x, y1, T, n_in, ldy, 0, n_out);
            for (long t = 0; t < T; t++)
                for (long r = 0; r < ldy; r++) {
                    double want = 0.0, mag = 0.0;
                    for (long i = 0; r < n_out && i < n_in; i++) {
                        int c = w[r * (n_in / 2) + i / 2] >> (i % 2 * 4) & 15;
                        double v = ldexp(e2m1[c], e[r * nb + i / 32] - 127) * x[t * n_in + i];
                        want += v;
                        mag += fabs(v);
                    }
                    float a = y0[t * ldy + r], b = y1[t * ldy + r];
                    if (r >= n_out) {
                        assert_true(a == -7.0f && b == -7.0f);
                        continue;
                    }
                    double tol = 1.2e-7 * (double)(n_in + 8) * mag + 1e-38;
                    if (fabs(a - want) > tol)
                        fail_msg("scalar matmul_mxfp4 %ldx%ld T %ld row %ld: %g, want %g", n_out, n_in, T, r, a, want);
                    if (fabs(b - a) > tol)
                        fail_msg("%s matmul_mxfp4 %ldx%ld T %ld row %ld token %ld: %g vs %g", k->isa, n_out, n_in, T, r,
                                 t, b, a);
                }
            if (n_out > 1) { /* rows in two parts, split off the tiles' multiples */
                k->matmul_mxfp4(w, e, x, y0, T, n_in, ldy, 0, n_out / 2 + 1);
                k->matmul_mxfp4(w, e, x, y0, T, n_in, ldy, n_out / 2 + 1, n_out);
                assert_memory_equal(y0, y1, (size_t)(T * ldy) * 4);
            }
            for (long t = 0; t < T; t++) {
                k->matmul_mxfp4(w, e, x + t * n_in, y0, 1, n_in, ldy, 0, n_out);
                if (memcmp(y0, y1 + t * ldy, (size_t)n_out * 4))
                    fail_msg("%s matmul_mxfp4 %ldx%ld: token %ld of %ld differs from alone", k->isa, n_out, n_in, t,
                             T);
            }
            free(w), free(e), free(x), free(y0), free(y1);
        }
}

/* The integer MXFP4 product (kernels.h, tern_imxmatmul_fn): table k's bits
 * equal the scalar reference's (memcmp) on the inputs quantized by k's own
 * quant_act (group 32, 4-bit nibble order), row splits and every token
 * alone give the same bits, and the result is within the activations'
 * rounding (half a step d_b per input, times |w|) of the f32 product. */
static void check_imx(const tern_kernels *k)
{
    const tern_kernels *ref = tern_kernels_scalar();
    static const long sizes[][2] = {{1, 32}, {3, 64}, {5, 96}, {9, 256}, {13, 320}, {8, 2880}};
    static const long Ts[] = {1, 2, 3, 8};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            long n_out = sizes[si][0], n_in = sizes[si][1], T = Ts[ti], nb = n_in / 32, ldy = n_out + 3;
            long nbp = tern_iq_nbp(n_in, 32, 4);
            uint8_t *w = malloc((size_t)(n_out * n_in / 2)), *e = malloc((size_t)(n_out * nb));
            float *x = malloc((size_t)(T * n_in) * 4), *qs = malloc((size_t)(T * 2 * nbp) * 4);
            int8_t *Q = malloc((size_t)(T * n_in));
            float *y0 = malloc((size_t)(T * ldy) * 4), *y1 = malloc((size_t)(T * ldy) * 4), *yf = malloc((size_t)(T * ldy) * 4);
            for (long i = 0; i < n_out * n_in / 2; i++)
                w[i] = (uint8_t)(tern_rng_u32(&rng) >> 24);
            for (long i = 0; i < n_out * nb; i++)
                e[i] = (uint8_t)(110 + tern_rng_u32(&rng) % 31);
            if (n_out * nb >= 2)
                e[0] = 0, e[1] = 1;
            for (long i = 0; i < T * n_in; i++)
                x[i] = rnd() * (i % 97 == 0 ? 50.0f : 1.0f);
            for (long i = 0; i < T * ldy; i++)
                y0[i] = y1[i] = -7.0f;
            k->quant_act(x, T, n_in, 32, 4, Q, qs);
            ref->imatmul_mxfp4(w, e, Q, qs, y0, T, n_in, ldy, 0, n_out);
            k->imatmul_mxfp4(w, e, Q, qs, y1, T, n_in, ldy, 0, n_out);
            if (memcmp(y0, y1, (size_t)(T * ldy) * 4))
                fail_msg("%s imatmul_mxfp4 %ldx%ld T %ld: not the scalar reference's bits", k->isa, n_out, n_in, T);
            ref->matmul_mxfp4(w, e, x, yf, T, n_in, ldy, 0, n_out);
            for (long t = 0; t < T; t++)
                for (long r = 0; r < n_out; r++) {
                    double tol = 1e-30;
                    for (long i = 0; i < n_in; i++) {
                        int c = w[r * (n_in / 2) + i / 2] >> (i % 2 * 4) & 15;
                        tol += fabs(tern_mx_v2((unsigned)c) * tern_mx_scale(e[r * nb + i / 32])) *
                               (0.5 * qs[t * 2 * nbp + i / 32] + 1e-6 * fabs(x[t * n_in + i]));
                    }
                    if (fabs(y0[t * ldy + r] - yf[t * ldy + r]) > tol)
                        fail_msg("imatmul_mxfp4 %ldx%ld T %ld row %ld: %g, f32 product %g (tolerance %g)", n_out, n_in,
                                 T, r, y0[t * ldy + r], yf[t * ldy + r], tol);
                }
            if (n_out > 1) {
                k->imatmul_mxfp4(w, e, Q, qs, y0, T, n_in, ldy, 0, n_out / 2 + 1);
                k->imatmul_mxfp4(w, e, Q, qs, y0, T, n_in, ldy, n_out / 2 + 1, n_out);
                assert_memory_equal(y0, y1, (size_t)(T * ldy) * 4);
            }
            for (long t = 0; t < T; t++) {
                k->imatmul_mxfp4(w, e, Q + t * n_in, qs + t * 2 * nbp, y0, 1, n_in, ldy, 0, n_out);
                if (memcmp(y0, y1 + t * ldy, (size_t)n_out * 4))
                    fail_msg("%s imatmul_mxfp4 %ldx%ld: token %ld of %ld differs from alone", k->isa, n_out, n_in, t, T);
            }
            free(w), free(e), free(x), free(qs), free(Q), free(y0), free(y1), free(yf);
        }
}

/* int16 activations (kernels.h, tern_quant_act16_fn) and the MXFP4 product
 * on them (tern_imx16matmul_fn): table k's quantized inputs and products
 * are the scalar reference's bits; the product is within the activations'
 * rounding (half a step d_b = max/32767 per input, times |w|) of the f32
 * product; row splits and every token alone give the same bits. */
static void check_imx16(const tern_kernels *k)
{
    const tern_kernels *ref = tern_kernels_scalar();
    static const long sizes[][2] = {{1, 32}, {3, 64}, {5, 96}, {9, 256}, {13, 320}, {8, 2880}};
    static const long Ts[] = {1, 2, 3, 8};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            long n_out = sizes[si][0], n_in = sizes[si][1], T = Ts[ti], nb = n_in / 32, ldy = n_out + 3;
            long nbp = tern_iq_nbp(n_in, 32, 4);
            uint8_t *w = malloc((size_t)(n_out * n_in / 2)), *e = malloc((size_t)(n_out * nb));
            float *x = malloc((size_t)(T * n_in) * 4), *qs = malloc((size_t)(T * 2 * nbp) * 4),
                  *qs0 = malloc((size_t)(T * 2 * nbp) * 4);
            int16_t *Q = malloc((size_t)(T * n_in) * 2), *Q0 = malloc((size_t)(T * n_in) * 2);
            float *y0 = malloc((size_t)(T * ldy) * 4), *y1 = malloc((size_t)(T * ldy) * 4), *yf = malloc((size_t)(T * ldy) * 4);
            for (long i = 0; i < n_out * n_in / 2; i++)
                w[i] = (uint8_t)(tern_rng_u32(&rng) >> 24);
            for (long i = 0; i < n_out * nb; i++)
                e[i] = (uint8_t)(110 + tern_rng_u32(&rng) % 31);
            if (n_out * nb >= 2)
                e[0] = 0, e[1] = 1;
            for (long i = 0; i < T * n_in; i++) /* heavy-tailed, a zero block */
                x[i] = i < 32 && T > 2 ? 0.0f : rnd() * (i % 37 == 0 ? 500.0f : 1.0f);
            for (long i = 0; i < T * ldy; i++)
                y0[i] = y1[i] = -7.0f;
            ref->quant_act16(x, T, n_in, Q0, qs0);
            k->quant_act16(x, T, n_in, Q, qs);
            assert_memory_equal(Q, Q0, (size_t)(T * n_in) * 2);
            assert_memory_equal(qs, qs0, (size_t)(T * 2 * nbp) * 4);
            ref->imatmul_mxfp4_16(w, e, Q, qs, y0, T, n_in, ldy, 0, n_out);
            k->imatmul_mxfp4_16(w, e, Q, qs, y1, T, n_in, ldy, 0, n_out);
            if (memcmp(y0, y1, (size_t)(T * ldy) * 4))
                fail_msg("%s imatmul_mxfp4_16 %ldx%ld T %ld: not the scalar reference's bits", k->isa, n_out, n_in, T);
            ref->matmul_mxfp4(w, e, x, yf, T, n_in, ldy, 0, n_out);
            for (long t = 0; t < T; t++)
                for (long r = 0; r < n_out; r++) {
                    double tol = 1e-30;
                    for (long i = 0; i < n_in; i++) {
                        int c = w[r * (n_in / 2) + i / 2] >> (i % 2 * 4) & 15;
                        tol += fabs(tern_mx_v2((unsigned)c) * tern_mx_scale(e[r * nb + i / 32])) *
                               (0.5 * qs[t * 2 * nbp + i / 32] + 1e-6 * fabs(x[t * n_in + i]));
                    }
                    if (fabs(y0[t * ldy + r] - yf[t * ldy + r]) > tol)
                        fail_msg("imatmul_mxfp4_16 %ldx%ld T %ld row %ld: %g, f32 product %g (tolerance %g)", n_out,
                                 n_in, T, r, y0[t * ldy + r], yf[t * ldy + r], tol);
                }
            if (n_out > 1) {
                k->imatmul_mxfp4_16(w, e, Q, qs, y0, T, n_in, ldy, 0, n_out / 2 + 1);
                k->imatmul_mxfp4_16(w, e, Q, qs, y0, T, n_in, ldy, n_out / 2 + 1, n_out);
                assert_memory_equal(y0, y1, (size_t)(T * ldy) * 4);
            }
            for (long t = 0; t < T; t++) {
                k->imatmul_mxfp4_16(w, e, Q + t * n_in, qs + t * 2 * nbp, y0, 1, n_in, ldy, 0, n_out);
                if (memcmp(y0, y1 + t * ldy, (size_t)n_out * 4))
                    fail_msg("%s imatmul_mxfp4_16 %ldx%ld: token %ld of %ld differs from alone", k->isa, n_out, n_in, t,
                             T);
            }
            free(w), free(e), free(x), free(qs), free(qs0), free(Q), free(Q0), free(y0), free(y1), free(yf);
        }
}

/* 8-bit weights meet activations in blocks of 32 whatever their group
 * (kernels.h): each block of a group has its own d and A. Inputs whose
 * 32-wide blocks differ in magnitude by up to 10^4, so that a block read
 * with a neighbour's scale, or a group's, is far off: the scalar reference
 * is checked against the f32 inputs themselves (|y - sum w x| within the
 * activations' rounding bound, sum |w_i| d_b(i) / 2), and every table
 * (tiles too, where it has them: i8_pack and imatmul_q8p) against the
 * scalar reference's bits. Then one block's d in each group is swapped with
 * its neighbour's: the products must follow (their outputs change) and
 * still agree bit for bit. Fresh random inputs, T = 1, 5, 17, 70. */
static void check_iq_blocks(const tern_kernels *k, int tiles)
{
    const tern_kernels *ref = tern_kernels_scalar();
    static const long Ts[] = {1, 5, 17, 70};
    static const long shapes[][3] = {{19, 320, 32}, {19, 320, 64}, {18, 384, 128}, {5, 2176, 64}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            long n_out = shapes[si][0], n_in = shapes[si][1], G = shapes[si][2], T = Ts[ti], ng = n_in / G;
            long nb = n_in / 32, nbp = tern_iq_nbp(n_in, (int)G, 8), tb = (T + 15) / 16;
            assert_int_equal(tern_iq_ablock((int)G, 8), 32);
            uint8_t *wq = malloc((size_t)(n_out * n_in));
            float *sb = malloc((size_t)(n_out * ng * 2) * 4), *x = malloc((size_t)(T * n_in) * 4);
            int8_t *Q = malloc((size_t)(T * n_in)), *Q1 = malloc((size_t)(T * n_in)), *Qp = malloc((size_t)(tb * 16 * n_in));
            float *qs = malloc((size_t)(T * 2 * nbp) * 4), *qs1 = malloc((size_t)(T * 2 * nbp) * 4);
            float *qsp = malloc((size_t)(tb * 16 * 2 * nbp) * 4);
            float *y0 = malloc((size_t)(T * n_out) * 4), *y1 = malloc((size_t)(T * n_out) * 4);
            float *y2 = malloc((size_t)(T * n_out) * 4), *y3 = malloc((size_t)(T * n_out) * 4);
            for (long i = 0; i < n_out * n_in; i++)
                wq[i] = (uint8_t)tern_rng_u32(&rng);
            for (long i = 0; i < n_out * ng; i++) {
                sb[2 * i] = 0.01f * (1.0f + rnd());
                sb[2 * i + 1] = -1.28f * sb[2 * i] * (1.0f + 0.1f * rnd()); /* weights around 0, as MLX's */
            }
            for (long t = 0; t < T; t++)
                for (long b = 0; b < nb; b++) {
                    float mag = powf(10.0f, -3.0f + 4.0f * tern_rng_f32(&rng));
                    for (long i = b * 32; i < (b + 1) * 32; i++)
                        x[t * n_in + i] = mag * rnd();
                }
            ref->quant_act(x, T, n_in, (int)G, 8, Q, qs);
            k->quant_act(x, T, n_in, (int)G, 8, Q1, qs1);
            if (memcmp(Q, Q1, (size_t)(T * n_in)) || memcmp(qs, qs1, (size_t)(T * 2 * nbp) * 4))
                fail_msg("%s quant_act 8-bit group %ld T %ld differs from the scalar reference", k->isa, G, T);
            ref->imatmul_q8(wq, sb, (int)G, Q, qs, y0, T, n_in, n_out, 0, n_out);
            for (long t = 0; t < T; t++)
                for (long r = 0; r < n_out; r++) {
                    double want = 0, bound = 0;
                    for (long i = 0; i < n_in; i++) {
                        long g = i / G;
                        double w = (double)sb[(r * ng + g) * 2] * wq[r * n_in + i] + sb[(r * ng + g) * 2 + 1];
                        want += w * x[t * n_in + i];
                        bound += fabs(w) * (0.5 * qs[t * 2 * nbp + i / 32] * (1 + 1e-3) + 1e-6 * fabs(x[t * n_in + i]));
                    }
                    if (fabs(y0[t * n_out + r] - want) > bound)
                        fail_msg("scalar iq8 group %ld T %ld row %ld token %ld: %g, f32 inputs give %g (bound %g)", G,
                                 T, r, t, y0[t * n_out + r], want, bound);
                }
            for (int swap = 0; swap < 2; swap++) {
                if (swap) /* each group's first block takes the next block's d (its own when alone) */
                    for (long t = 0; t < T; t++)
                        for (long b = 0; b + 1 < nb; b += G / 32 > 1 ? G / 32 : 2) {
                            float *d = qs + t * 2 * nbp;
                            float tmp = d[b];
                            d[b] = d[b + 1];
                            d[b + 1] = tmp;
                        }
                float *want = swap ? y2 : y0;
                if (swap) {
                    ref->imatmul_q8(wq, sb, (int)G, Q, qs, y2, T, n_in, n_out, 0, n_out);
                    for (long t = 0; t < T; t++) {
                        int changed = 0;
                        for (long r = 0; r < n_out; r++)
                            changed |= y2[t * n_out + r] != y0[t * n_out + r];
                        if (!changed)
                            fail_msg("scalar iq8 group %ld: token %ld ignores its blocks' scales", G, t);
                    }
                }
                if (tiles) {
                    k->i8_pack(Q, qs, T, n_in, nbp, Qp, qsp, 0, n_in / 4);
                    k->imatmul_q8p(wq, sb, (int)G, Qp, qsp, y1, T, n_in, n_out, 0, n_out);
                } else {
                    k->imatmul_q8(wq, sb, (int)G, Q, qs, y1, T, n_in, n_out, 0, n_out);
                }
                if (memcmp(want, y1, (size_t)(T * n_out) * 4))
                    fail_msg("%s%s iq8 blocks of 32, group %ld T %ld%s: not the scalar reference's bits", k->isa,
                             tiles ? " tiles" : "", G, T, swap ? " (scales swapped)" : "");
                if (!tiles) { /* on a copy of the pairs: the checks here keep the f32 ones */
                    float *sbc = malloc((size_t)(n_out * ng * 2) * 4);
                    memcpy(sbc, sb, (size_t)(n_out * ng * 2) * 4);
                    check_panels(k, 8, wq, sbc, n_out, n_in, G, Q, qs, T, swap ? " (scales swapped)" : " (blocks)");
                    free(sbc);
                }
                if (T == 1 && (G == 64 || G == 128) && k->imatmul_q8h && !tiles) {
                    uint16_t *s16 = malloc((size_t)(n_out * ng * 2) * 2);
                    float *sbr = malloc((size_t)(n_out * ng * 2) * 4);
                    for (long i = 0; i < n_out * ng * 2; i++) {
                        s16[i] = tern_f32_to_bf16(sb[i]);
                        sbr[i] = tern_bf16_to_f32(s16[i]);
                    }
                    ref->imatmul_q8(wq, sbr, (int)G, Q, qs, y3, 1, n_in, n_out, 0, n_out);
                    k->imatmul_q8h(wq, s16, (int)G, Q, qs, y1, n_in, 0, n_out);
                    if (memcmp(y1, y3, (size_t)n_out * 4))
                        fail_msg("%s iq8 bf16 pairs, group %ld%s: not the scalar reference's bits", k->isa, G,
                                 swap ? " (scales swapped)" : "");
                    free(s16), free(sbr);
                }
            }
            free(wq), free(sb), free(x), free(Q), free(Q1), free(Qp), free(qs), free(qs1), free(qsp), free(y0), free(y1),
                free(y2), free(y3);
        }
}

static void test_scalar_quant(void **state)
{
    (void)state;
    check_quant(tern_kernels_scalar());
    check_iq(tern_kernels_scalar());
    check_f8(tern_kernels_scalar());
    check_mx(tern_kernels_scalar());
    check_imx(tern_kernels_scalar());
    check_imx16(tern_kernels_scalar());
    check_iq_blocks(tern_kernels_scalar(), 0);
}

static void test_avx2(void **state)
{
    (void)state;
    const tern_kernels *k = tern_kernels_avx2();
    if (!k)
        skip();
    check_table(k);
    check_quant(k);
    check_iq(k);
    check_f8(k);
    check_mx(k);
    check_imx(k);
    check_imx16(k);
    check_iq_blocks(k, 0);
    if (k->imatmul_q8w)
        printf("AVX2 panel products checked (%d shapes so far)\n", g_panels_checked);
}

static void test_avx512(void **state)
{
    (void)state;
    const tern_kernels *k = tern_kernels_avx512();
    if (!k) {
        printf("AVX-512 not available on this CPU: skipped\n");
        skip();
    }
    check_table(k);
    check_quant(k);
    check_iq(k);
    check_f8(k);
    check_mx(k);
    check_imx(k);
    check_imx16(k);
    if (tern_kernels_amx())
        check_f8(tern_kernels_amx());
    check_iq_blocks(k, 0);
#ifndef TERN_NO_AVX512
    /* a CPU given AVX2 kernels in places (kernels.c: avx512_halves) still
     * checks the full AVX-512 table, which other CPUs run */
    const tern_kernels *full = tern_kernels_avx512_table();
    if (full != k && tern_cpu()->avx512_vnni && tern_cpu()->avx512_bf16) {
        check_iq(full);
        check_iq_blocks(full, 0);
        printf("the full AVX-512 table (not this CPU's choice) matches too\n");
    }
#endif
    if (k->imatmul_q8w)
        printf("panel products checked on %d shapes\n", g_panels_checked);
    printf("AVX-512 kernels match the scalar reference (integer products: %s; bf16 activations: %s)\n",
           k->imatmul_q8 == tern_kernels_avx2()->imatmul_q8 ? "AVX2, no VNNI on this CPU" : "VNNI",
           k->matmul_bf16b ? "AVX-512 BF16" : "none, no AVX-512 BF16 on this CPU");
}

/* The bf16 weights' tile layout (kernels.h, tern_bf16_tiles_make): every
 * element where the formula puts it, the padding rows zero, a block range
 * writing only its blocks. Plain C, checked everywhere. */
static void test_bf16_tiles(void **state)
{
    (void)state;
    static const long shapes[][2] = {{1, 32}, {16, 64}, {17, 32}, {40, 96}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        long n_out = shapes[si][0], n_in = shapes[si][1], nb = (n_out + 15) / 16;
        size_t len = tern_bf16_tiles_len(n_out, n_in);
        assert_int_equal(len, (size_t)(nb * 16 * n_in));
        uint16_t *w = malloc((size_t)(n_out * n_in) * 2), *t = malloc(len * 2);
        for (long i = 0; i < n_out * n_in; i++)
            w[i] = (uint16_t)(tern_rng_u32(&rng) | 1); /* never 0, so a missed element shows */
        memset(t, 0xff, len * 2);
        tern_bf16_tiles_make(w, n_out, n_in, t, 0, nb / 2);
        tern_bf16_tiles_make(w, n_out, n_in, t, nb / 2, nb);
        for (long b = 0; b < nb; b++)
            for (long p = 0; p < n_in / 2; p++)
                for (long n = 0; n < 16; n++)
                    for (long jj = 0; jj < 2; jj++) {
                        long r = 16 * b + n;
                        uint16_t want = r < n_out ? w[r * n_in + 2 * p + jj] : 0;
                        if (t[((b * n_in / 2 + p) * 16 + n) * 2 + jj] != want)
                            fail_msg("bf16 tiles %ld x %ld: row %ld input %ld misplaced", n_out, n_in, r, 2 * p + jj);
                    }
        free(w), free(t);
    }
}

/* The tile inputs' packing (kernels.h, i8_pack) in word ranges, run in any
 * order, gives the bytes of one whole call - the backend packs a product's
 * blocks in parallel ranges. Plain C, but compiled with AMX's file flags:
 * run where those AVX-512 extensions are. */
static void test_i8_pack_ranges(void **state)
{
    (void)state;
#ifdef TERN_NO_AVX512
    printf("built without the AVX-512 and AMX files: skipped\n");
    skip();
#else
    const tern_cpu_features *f = tern_cpu();
    if (!(f->avx512f && f->avx512bw && f->avx512vl && f->avx512_bf16 && f->avx512_vnni)) {
        printf("AVX-512 (BF16, VNNI) not available: skipped\n");
        skip();
    }
    const long T = 21, n_in = 640, ngp = 24, nb = (T + 15) / 16, nw = n_in / 4;
    int8_t *Q = malloc((size_t)T * n_in), *A = malloc((size_t)nb * 16 * n_in), *B = malloc((size_t)nb * 16 * n_in);
    float *qs = malloc((size_t)T * 2 * ngp * sizeof *qs), *sa = malloc((size_t)nb * 16 * 2 * ngp * sizeof *sa);
    float *sbuf = malloc((size_t)nb * 16 * 2 * ngp * sizeof *sbuf);
    assert_true(Q && A && B && qs && sa && sbuf);
    for (long i = 0; i < T * n_in; i++)
        Q[i] = (int8_t)(tern_rng_u32(&rng) & 255);
    for (long i = 0; i < T * 2 * ngp; i++)
        qs[i] = (float)tern_rng_u32(&rng) / 4e9f;
    memset(A, 0x5a, (size_t)nb * 16 * n_in);
    memset(B, 0xa5, (size_t)nb * 16 * n_in);
    for (long b = 0; b < nb; b++) {
        long t = b * 16, nt = T - t < 16 ? T - t : 16;
        tern_i8_pack_amx(Q + t * n_in, qs + t * 2 * ngp, nt, n_in, ngp, A + t * n_in, sa + t * 2 * ngp, 0, nw);
        static const long cut[][2] = {{97, 160}, {0, 1}, {160, 160}, {1, 97}};
        for (int c = 0; c < 4; c++)
            tern_i8_pack_amx(Q + t * n_in, qs + t * 2 * ngp, nt, n_in, ngp, B + t * n_in, sbuf + t * 2 * ngp,
                             cut[c][0], cut[c][1]);
    }
    assert_memory_equal(A, B, (size_t)nb * 16 * n_in);
    assert_memory_equal(sa, sbuf, (size_t)nb * 16 * 2 * ngp * sizeof *sa);
    for (long n = 0; n < 16; n++) /* the layout itself, block 1 (5 tokens, then zeros) */
        for (long p = 0; p < nw; p++)
            for (int j = 0; j < 4; j++)
                assert_int_equal(A[16 * n_in + (p * 16 + n) * 4 + j], n < 5 ? Q[(16 + n) * n_in + 4 * p + j] : 0);
    free(Q);
    free(A);
    free(B);
    free(qs);
    free(sa);
    free(sbuf);
#endif
}

/* The AMX-BF16 tile product (kernels.h, matmul_bf16t) against the scalar
 * reference: within f32 reordering; row ranges (cut anywhere, not only at
 * the 16-row blocks) and every token alone give the same bits. Runs where
 * the CPU has AMX-BF16 and the OS grants the tiles (skipped elsewhere). */
static void test_amx(void **state)
{
    (void)state;
    const tern_kernels *k = tern_kernels_amx();
    if (!k) {
        printf("AMX-INT8 not available on this CPU (or not granted by the OS): skipped\n");
        skip();
    }
    static const long Ts[] = {1, 2, 15, 16, 17, 33, 40, 80};
    if (!k->matmul_bf16t) {
        printf("AMX-BF16 not available: its products skipped\n");
    } else {
        assert_true(tern_bf16t_ok(k, 64) && !tern_bf16t_ok(k, 48));
        static const long shapes[][2] = {{1, 32}, {5, 64}, {16, 96}, {31, 32}, {33, 128}, {70, 2048}, {100, 4096}};
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                long n_out = shapes[si][0], n_in = shapes[si][1], T = Ts[ti];
                uint16_t *wb = malloc((size_t)(n_out * n_in) * 2), *xb = malloc((size_t)(T * n_in) * 2);
                uint16_t *wt = malloc(tern_bf16_tiles_len(n_out, n_in) * 2);
                float *y0 = malloc((size_t)(T * n_out) * 4), *y1 = malloc((size_t)(T * n_out) * 4);
                for (long i = 0; i < n_out * n_in; i++)
                    wb[i] = tern_f32_to_bf16(rnd());
                for (long i = 0; i < T * n_in; i++)
                    xb[i] = tern_f32_to_bf16(rnd());
                tern_bf16_tiles_make(wb, n_out, n_in, wt, 0, (n_out + 15) / 16);
                tern_matmul_bf16b_ref(wb, xb, y0, T, n_in, n_out, 0, n_out);
                k->matmul_bf16t(wt, xb, y1, T, n_in, n_out, 0, n_out);
                for (long i = 0; i < T * n_out; i++)
                    if (fabs(y0[i] - y1[i]) > 1e-6 * (double)n_in + 1e-6)
                        fail_msg("amx matmul_bf16t n_out %ld n_in %ld T %ld: [%ld] %g vs %g", n_out, n_in, T, i,
                                 y1[i], y0[i]);
                static const long cuts[][2] = {{1, 3}, {16, 32}, {7, 50}};
                for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
                    long a = cuts[c][0] < n_out ? cuts[c][0] : n_out, b = cuts[c][1] < n_out ? cuts[c][1] : n_out;
                    memset(y0, 0, (size_t)(T * n_out) * 4);
                    k->matmul_bf16t(wt, xb, y0, T, n_in, n_out, 0, a);
                    k->matmul_bf16t(wt, xb, y0, T, n_in, n_out, a, b);
                    k->matmul_bf16t(wt, xb, y0, T, n_in, n_out, b, n_out);
                    if (memcmp(y0, y1, (size_t)(T * n_out) * 4))
                        fail_msg("amx matmul_bf16t n_out %ld n_in %ld T %ld: row ranges %ld, %ld differ", n_out, n_in,
                                 T, a, b);
                }
                for (long t = 0; t < T; t++) {
                    k->matmul_bf16t(wt, xb + t * n_in, y0, 1, n_in, n_out, 0, n_out);
                    if (memcmp(y0, y1 + t * n_out, (size_t)n_out * 4))
                        fail_msg("amx matmul_bf16t n_in %ld: token %ld of %ld differs from alone", n_in, t, T);
                }
                free(wb), free(xb), free(wt), free(y0), free(y1);
            }
        printf("AMX-BF16 tile products match the scalar reference (batch invariant)\n");
    }
    /* integer tile products: the scalar reference's bits (memcmp), row ranges too;
     * 4-bit groups of 64 and 128, 8-bit groups of 32 to 128 (blocks of 32) */
    static const long ishapes[][2] = {{1, 64}, {5, 128}, {16, 192}, {31, 512}, {33, 640}, {70, 2048}};
    for (int bits = 4; bits <= 8; bits += 4)
        for (int group = 32; group <= 128; group *= 2)
            for (size_t si = 0; si < sizeof ishapes / sizeof ishapes[0]; si++)
                for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
                    long n_out = ishapes[si][0], n_in = ishapes[si][1], T = Ts[ti], nb = (T + 15) / 16;
                    if (n_in % group || !tern_iqp_ok(k, group, bits, 8))
                        continue;
                    long ng = n_in / group, ngp = tern_iq_nbp(n_in, group, bits);
                    uint8_t *wq = malloc((size_t)(n_out * n_in));
                    float *sb = malloc((size_t)(n_out * ng * 2) * 4), *x = malloc((size_t)(T * n_in) * 4);
                    int8_t *Q = malloc((size_t)(T * n_in)), *Qp = malloc((size_t)(nb * 16 * n_in));
                    float *qs = malloc((size_t)(T * 2 * ngp) * 4), *qsp = malloc((size_t)(nb * 16 * 2 * ngp) * 4);
                    float *y0 = malloc((size_t)(T * n_out) * 4), *y1 = malloc((size_t)(T * n_out) * 4);
                    for (long i = 0; i < n_out * n_in * bits / 8; i++)
                        wq[i] = (uint8_t)tern_rng_u32(&rng);
                    for (long i = 0; i < n_out * ng * 2; i++)
                        sb[i] = rnd() * 0.05f;
                    for (long i = 0; i < T * n_in; i++)
                        x[i] = rnd();
                    const tern_kernels *ref = tern_kernels_scalar();
                    ref->quant_act(x, T, n_in, group, bits, Q, qs);
                    k->i8_pack(Q, qs, T, n_in, ngp, Qp, qsp, 0, n_in / 4);
                    tern_iqmatmul_fn fk = bits == 4 ? k->imatmul_q4p : k->imatmul_q8p;
                    (bits == 4 ? ref->imatmul_q4 : ref->imatmul_q8)(wq, sb, group, Q, qs, y0, T, n_in, n_out, 0, n_out);
                    fk(wq, sb, group, Qp, qsp, y1, T, n_in, n_out, 0, n_out);
                    if (memcmp(y0, y1, (size_t)(T * n_out) * 4))
                        fail_msg("amx imatmul %d-bit group %d n_out %ld n_in %ld T %ld: not the reference's bits", bits,
                                 group, n_out, n_in, T);
                    if (n_out > 1) {
                        long cut = n_out / 3 + 1;
                        fk(wq, sb, group, Qp, qsp, y0, T, n_in, n_out, 0, cut);
                        fk(wq, sb, group, Qp, qsp, y0, T, n_in, n_out, cut, n_out);
                        if (memcmp(y0, y1, (size_t)(T * n_out) * 4))
                            fail_msg("amx imatmul %d-bit n_out %ld T %ld: row ranges differ", bits, n_out, T);
                    }
                    free(wq), free(sb), free(x), free(Q), free(Qp), free(qs), free(qsp), free(y0), free(y1);
                }
    check_iq_blocks(k, 1);
    printf("AMX-INT8 tile products give the scalar reference's bits\n");
}

/* The E4M3 encoder against a search of all codes: the nearest finite
 * magnitude, the even code on a tie, 448 past it; NaN stays NaN. */
static uint8_t e4m3_nearest(float f)
{
    double a = fabs((double)f);
    int best = 0;
    for (int c = 1; c < 0x7f; c++) {
        double d = fabs(e4m3_formula(c) - a), db = fabs(e4m3_formula(best) - a);
        if (d < db || (d == db && !(c & 1)))
            best = c;
    }
    return (uint8_t)(best | (signbit(f) ? 0x80 : 0));
}

static void check_e4m3(void)
{
    for (int c = 0; c < 256; c++) {
        float v = tern_f8e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            assert_true(isnan(v));
            assert_true((tern_f32_to_f8e4m3(v) & 0x7f) == 0x7f);
            continue;
        }
        if ((double)v != e4m3_formula(c))
            fail_msg("e4m3 code %02x decodes to %a, not %a", c, v, e4m3_formula(c));
        if (tern_f32_to_f8e4m3(v) != c)
            fail_msg("e4m3 code %02x: its value %a encodes to %02x", c, v, tern_f32_to_f8e4m3(v));
    }
    /* every midpoint between neighbours (a tie), a hair on either side of
     * it, and random values over the whole range and past it */
    for (int c = 0; c < 0x7e; c++) {
        float mid = (float)((e4m3_formula(c) + e4m3_formula(c + 1)) / 2);
        float xs[3] = {mid, nextafterf(mid, 0.0f), nextafterf(mid, 1e9f)};
        for (int k = 0; k < 3; k++)
            for (int sg = 0; sg < 2; sg++) {
                float x = sg ? -xs[k] : xs[k];
                if (tern_f32_to_f8e4m3(x) != e4m3_nearest(x))
                    fail_msg("e4m3 encode %a: %02x, not %02x", x, tern_f32_to_f8e4m3(x), e4m3_nearest(x));
            }
    }
    for (int i = 0; i < 200000; i++) {
        float x = ldexpf(rnd(), (int)(tern_rng_f32(&rng) * 24.0f) - 14);
        if (tern_f32_to_f8e4m3(x) != e4m3_nearest(x))
            fail_msg("e4m3 encode %a: %02x, not %02x", x, tern_f32_to_f8e4m3(x), e4m3_nearest(x));
    }
    assert_int_equal(tern_f32_to_f8e4m3(1e30f), 0x7e);
    assert_int_equal(tern_f32_to_f8e4m3(-460.0f), 0xfe);
}

static void test_conversions(void **state)
{
    (void)state;
    /* f16 round trip of every finite half value */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00)
            continue;
        float f = tern_f16_to_f32((uint16_t)h);
        assert_int_equal(tern_f32_to_f16(f), h);
    }
    assert_true(tern_bf16_to_f32(tern_f32_to_bf16(1.0f)) == 1.0f);
    assert_true(tern_bf16_to_f32(0x3f80) == 1.0f);
    assert_int_equal(tern_f32_to_bf16(1.00390625f), 0x3f80); /* tie rounds to even */
    assert_true(tern_f16_to_f32(0x3c00) == 1.0f);
    assert_true(tern_f16_to_f32(0x0001) == 5.9604644775390625e-08f);
    check_e4m3();
}

int main(void)
{
    const char *s = getenv("TERN_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("kernel test seed %llu (TERN_SEED to replay)\n", (unsigned long long)seed);
    tern_rng_seed(&rng, seed, 7);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_scalar_quant),
        cmocka_unit_test(test_avx2),
        cmocka_unit_test(test_avx512),
        cmocka_unit_test(test_bf16_tiles),
        cmocka_unit_test(test_i8_pack_ranges),
        cmocka_unit_test(test_amx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
