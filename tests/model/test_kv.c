/* KV cache types (kv.h, kv_codec.c): quantize -> dequantize error bounds,
 * the fused reads against decode-then-compute, the CPU attention over every
 * type against f32 attention and against a double-precision reference over
 * the decoded cache, bytes per block, the per-layer spec, sink blocks,
 * copy-on-write across formats, block save/load, and the forward on real
 * models with typed pools (batching, fork, rollback). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "model/backend.h"
#include "model/kv_int.h"
#include "tensor/dtype.h"
#include "test_util.h"

static uint64_t g_seed = 0x1234567u;

static float frand(void)
{
    g_seed = g_seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((g_seed >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* Roughly Gaussian values with an occasional outlier (as real K has). */
static void fill(float *x, int n, float scale)
{
    for (int i = 0; i < n; i++) {
        float g = (frand() + frand() + frand()) * scale;
        x[i] = (i % 37 == 5) ? g * 8.0f : g;
    }
}

static const kv_type all_types[] = {KV_F32, KV_BF16, KV_F16, KV_Q8, KV_Q4, KV_R4, KV_R3, KV_F8};
#define N_TYPES 8

/* ---- codecs ---- */

/* The squared error of the plain grid over one group of q4 (min/max), r4
 * or r3 (max |x|) - the encoder's starting point: f16 minimum and scale,
 * codes rounded and clamped - in double: the bound its least-squares
 * refits may only lower. */
static double grid_sse(kv_type t, const float *x, int g)
{
    if (t != KV_Q4) {
        float am = 0, top = t == KV_R4 ? 15.0f : 7.0f, half = top / 2;
        for (int e = 0; e < g; e++)
            am = fmaxf(am, fabsf(x[e]));
        float s = tern_f16_to_f32(tern_f32_to_f16(am / half));
        double sse = 0;
        for (int e = 0; e < g; e++) {
            float f = s > 0 ? rintf(x[e] * (1.0f / s) + half) : half;
            f = f < 0 ? 0 : f > top ? top : f;
            double d = (double)x[e] - (double)s * (f - half);
            sse += d * d;
        }
        return sse;
    }
    float mn = x[0], mx = x[0];
    for (int e = 1; e < g; e++) {
        mn = fminf(mn, x[e]);
        mx = fmaxf(mx, x[e]);
    }
    float m = tern_f16_to_f32(tern_f32_to_f16(mn)), s = tern_f16_to_f32(tern_f32_to_f16((mx - m) / 15.0f));
    double sse = 0;
    for (int e = 0; e < g; e++) {
        float f = s > 0 ? rintf((x[e] - m) / s) : 0.0f;
        f = f < 0 ? 0 : f > 15 ? 15 : f;
        double d = (double)x[e] - ((double)s * f + m);
        sse += d * d;
    }
    return sse;
}

static void test_round_trip(void **state)
{
    (void)state;
    static const int hds[] = {8, 16, 32, 64, 96, 128, 256};
    double fit_sse[KV_TYPE_COUNT] = {0}, fit_ref[KV_TYPE_COUNT] = {0};
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++)
        for (int ti = 0; ti < N_TYPES; ti++) {
            kv_type t = all_types[ti];
            int hd = hds[hi], g = kv_type_group(t, hd);
            if (!g)
                continue;
            for (int rep = 0; rep < 50; rep++) {
                float x[256], y[256], r[256];
                uint8_t buf[2048];
                fill(x, hd, rep % 3 == 0 ? 0.01f : rep % 3 == 1 ? 1.0f : 40.0f);
                memcpy(y, x, sizeof x);
                if (kv_type_is_rotated(t))
                    kv_rotate(y, hd);
                kv_head_encode(t, hd, y, buf);
                kv_head_decode(t, hd, buf, r);
                for (int o = 0; o < hd; o += g) {
                    float mn = y[o], mx = y[o], am = 0;
                    for (int e = o; e < o + g; e++) {
                        mn = fminf(mn, y[e]);
                        mx = fmaxf(mx, y[e]);
                        am = fmaxf(am, fabsf(y[e]));
                    }
                    if (t == KV_Q4 || t == KV_R4 || t == KV_R3) { /* least-squares fits: the group's error */
                        double sse = 0, ref = grid_sse(t, y + o, g);
                        for (int e = o; e < o + g; e++)
                            sse += ((double)r[e] - y[e]) * ((double)r[e] - y[e]);
                        fit_sse[t] += sse;
                        fit_ref[t] += ref;
                        if (sse > ref * (1 + 1e-5) + 1e-12)
                            fail_msg("%s hd %d group %d: squared error %g > the plain grid's %g", kv_type_name(t), hd,
                                     o / g, sse, ref);
                    }
                    for (int e = o; e < o + g; e++) {
                        double err = fabs((double)r[e] - y[e]), bound;
                        switch (t) {
                        case KV_F32: bound = 0; break;
                        case KV_BF16: bound = fabs(y[e]) / 256.0; break;              /* 2^-9 rounding, 2x */
                        case KV_F16: bound = fabs(y[e]) / 1024.0 + 1e-7; break;       /* 2^-11, 2x, subnormals */
                        /* half a step, plus the f16 rounding of the stored scale
                         * (levels * 2^-11 of a step at the clamped top) and min */
                        case KV_Q8: bound = 0.63 * (mx - mn) / 255 + am / 1024.0; break;
                        case KV_Q4: bound = 2.0 * (mx - mn) / 15 + am / 1024.0; break; /* a fit may clip an extreme */
                        case KV_R4: bound = 2.0 * am / 7.5 + am / 1024.0; break;
                        /* half an E4M3 step (2^-4 relative) of the element over
                         * a scale within 2^-11 of am / 448; below E4M3's
                         * normals half its step 2^-10 scale; a scale that
                         * rounds to 0 (am < 2^-25 * 448) stores 0 */
                        case KV_F8: bound = fabs(y[e]) / 16.0 * (1 + 1.0 / 1024) + am / 448.0 / 1024.0 + 1e-30; break;
                        default: bound = 2.0 * am / 3.5 + am / 1024.0; break;
                        }
                        if (err > bound)
                            fail_msg("%s hd %d: element %d: %g -> %g, error %g > %g", kv_type_name(t), hd, e, y[e],
                                     r[e], err, bound);
                    }
                }
                assert_true(kv_head_bytes(t, hd) <= sizeof buf);
            }
        }
    /* the refits pay: the squared error over every group against the plain grid's */
    printf("squared error of the plain grid's: q4 %.4g, r4 %.4g, r3 %.4g\n", fit_sse[KV_Q4] / fit_ref[KV_Q4],
           fit_sse[KV_R4] / fit_ref[KV_R4], fit_sse[KV_R3] / fit_ref[KV_R3]);
    for (int t = KV_Q4; t <= KV_R3; t++)
        assert_true(fit_sse[t] < 0.95 * fit_ref[t]);
}

static void test_rotation(void **state)
{
    (void)state;
    static const int hds[] = {8, 64, 80, 96, 128};
    for (size_t hi = 0; hi < sizeof hds / sizeof *hds; hi++) {
        int hd = hds[hi];
        float x[128], y[128], q[128], k[128];
        fill(x, hd, 1.0f);
        memcpy(y, x, sizeof x);
        kv_rotate(y, hd);
        double nx = 0, ny = 0;
        for (int e = 0; e < hd; e++) {
            nx += (double)x[e] * x[e];
            ny += (double)y[e] * y[e];
        }
        assert_true(fabs(nx - ny) <= 1e-5 * nx); /* orthogonal */
        kv_unrotate(y, hd);
        for (int e = 0; e < hd; e++)
            assert_true(fabsf(y[e] - x[e]) <= 1e-5f);
        /* dot products survive: what folding the rotation into q relies on */
        fill(q, hd, 1.0f);
        fill(k, hd, 1.0f);
        double d0 = 0, d1 = 0;
        for (int e = 0; e < hd; e++)
            d0 += (double)q[e] * k[e];
        kv_rotate(q, hd);
        kv_rotate(k, hd);
        for (int e = 0; e < hd; e++)
            d1 += (double)q[e] * k[e];
        assert_true(fabs(d0 - d1) <= 1e-5 * (1 + fabs(d0)));
    }
}

/* The fused dot and axpy equal decoding first. */
static void test_fused_reads(void **state)
{
    (void)state;
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int hd = 8; hd <= 128; hd *= 2) {
            kv_type t = all_types[ti];
            if (!kv_type_group(t, hd))
                continue;
            float x[128], q[128], dec[128], out[128], ref[128];
            uint8_t buf[1024];
            fill(x, hd, 2.0f);
            fill(q, hd, 1.0f);
            kv_head_encode(t, hd, x, buf);
            kv_head_decode(t, hd, buf, dec);
            double want = 0, mag = 0;
            for (int e = 0; e < hd; e++) {
                want += (double)q[e] * dec[e];
                mag += fabs((double)q[e] * dec[e]);
            }
            float got = kv_head_dot(t, hd, q, buf);
            if (fabs(got - want) > 1e-5 * mag + 1e-6)
                fail_msg("%s hd %d: fused dot %g, decoded %g", kv_type_name(t), hd, got, want);
            for (int e = 0; e < hd; e++)
                out[e] = ref[e] = q[e];
            kv_head_axpy(t, hd, 0.37f, buf, out);
            for (int e = 0; e < hd; e++)
                ref[e] += 0.37f * dec[e];
            for (int e = 0; e < hd; e++)
                assert_true(fabsf(out[e] - ref[e]) <= 1e-5f * (1 + fabsf(ref[e])));
            /* this CPU's fast reader against the scalar reference */
            const kv_reader *rd = kv_reader_best();
            float fast = rd->dot(t, hd, q, buf);
            if (fabs(fast - got) > 1e-5 * mag + 1e-6)
                fail_msg("%s hd %d: %s dot %g, scalar %g", kv_type_name(t), hd, rd->name, fast, got);
            for (int e = 0; e < hd; e++)
                ref[e] = q[e];
            rd->axpy(t, hd, 0.37f, buf, ref);
            for (int e = 0; e < hd; e++)
                assert_true(fabsf(out[e] - ref[e]) <= 1e-5f * (1 + fabsf(out[e])));
        }
}

/* ---- sizes, spec ---- */

static void test_bytes(void **state)
{
    (void)state;
    /* the demo model's shape: 8 layers, 2 KV heads of 64 */
    kv_spec s;
    double f32 = 0;
    printf("bytes per token per layer (K+V, 2 heads of 64):");
    for (int ti = 0; ti < N_TYPES; ti++) {
        kv_spec_init(&s, all_types[ti]);
        double b = (double)kv_spec_block_bytes(&s, 8, 2, 64, 16, 0) / 16 / 8;
        if (ti == 0)
            f32 = b;
        printf(" %s %.0f (f32/%.2f)", kv_type_name(all_types[ti]), b, f32 / b);
        switch (all_types[ti]) {
        case KV_BF16:
        case KV_F16: assert_true(b * 2 == f32); break;
        case KV_Q8:
        case KV_F8: assert_true(b <= f32 / 3.5); break;
        case KV_Q4:
        case KV_R4:
        case KV_R3: assert_true(b <= f32 / 6.5); break;
        default: break;
        }
    }
    printf("\n");
    /* a pool's own count agrees with the spec's */
    tern_err err;
    kv_spec_init(&s, KV_Q4);
    assert_int_equal(kv_spec_parse_layers(&s, "first1=bf16,last1=q8", &err), 0);
    s.quant_start = 16;
    kv_pool p;
    assert_int_equal(kv_pool_init_spec(&p, &s, 4, 128, 64, 16, 10, 3, 1, &err), 0);
    assert_int_equal(kv_pool_bytes(&p), 3 * kv_spec_block_bytes(&s, 4, 2, 64, 16, 1) +
                                            7 * kv_spec_block_bytes(&s, 4, 2, 64, 16, 0));
    assert_int_equal(kv_block_bytes(&p, 0), kv_spec_block_bytes(&s, 4, 2, 64, 16, 1));
    assert_int_equal(kv_block_bytes(&p, 5), kv_spec_block_bytes(&s, 4, 2, 64, 16, 0));
    assert_null(p.k); /* not plain f32 */
    kv_pool_free(&p);
}

static void test_spec_parse(void **state)
{
    (void)state;
    tern_err err;
    kv_spec s;
    kv_spec_init(&s, KV_Q4);
    assert_int_equal(kv_spec_parse_layers(&s, "first2=bf16,last1=f32,4-5=q8,7=r3", &err), 0);
    static const kv_type want[10] = {KV_BF16, KV_BF16, KV_Q4, KV_Q4, KV_Q8, KV_Q8, KV_Q4, KV_R3, KV_Q4, KV_F32};
    for (int l = 0; l < 10; l++)
        assert_int_equal(kv_spec_layer_type(&s, l, 10), want[l]);
    char buf[256];
    kv_spec_describe(&s, 10, buf, sizeof buf);
    assert_string_equal(buf, "bf16,bf16,q4,q4,q8,q8,q4,r3,q4,f32;qs=0");
    static const char *bad[] = {"", "first2", "x=bf16", "first0=bf16", "3-1=q8", "2=q5", "last=bf16", "1-=q8",
                                "first2=bf16,", "-1=q8"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kv_spec_init(&s, KV_Q8);
        if (kv_spec_parse_layers(&s, bad[i], &err) != TERN_EINVAL)
            fail_msg("'%s' accepted", bad[i]);
    }
    kv_type t;
    assert_int_equal(kv_type_parse("r4", &t, &err), 0);
    assert_int_equal(t, KV_R4);
    assert_int_equal(kv_type_parse("fp8", &t, &err), 0); /* other servers' name */
    assert_int_equal(t, KV_F8);
    assert_int_equal(kv_type_parse("f8", &t, &err), 0);
    assert_int_equal(t, KV_F8);
    assert_int_equal(kv_type_parse("q5", &t, &err), TERN_EINVAL);
    assert_int_equal(kv_type_check(KV_Q8, 48, &err), TERN_EUNSUPPORTED);
    assert_int_equal(kv_type_check(KV_R3, 12, &err), TERN_EUNSUPPORTED);
    assert_int_equal(kv_type_check(KV_BF16, 12, &err), 0);
    /* f16 saturates instead of storing an infinity */
    float big[8] = {1e6f, -1e6f, 1, 2, 3, 4, 5, 6}, back[8];
    uint8_t hb[16];
    kv_head_encode(KV_F16, 8, big, hb);
    kv_head_decode(KV_F16, 8, hb, back);
    assert_true(back[0] == 65504.0f && back[1] == -65504.0f && back[7] == 6.0f);
}

/* The device hooks: kv_pool_free tells the device first (dev_release, so a
 * backend frees that pool's mirror and no other), a view starts without the
 * base's hooks, and copy-on-write reaches dev_copy. */
static int g_released, g_copied;
static const kv_pool *g_released_pool;
static void hook_release(void *ctx, const kv_pool *p)
{
    assert_ptr_equal(ctx, &g_released);
    assert_non_null(p->layers); /* called before anything is freed */
    g_released++;
    g_released_pool = p;
}
static int hook_copy(void *ctx, const kv_pool *p, int32_t dst, int32_t src)
{
    (void)ctx;
    (void)p;
    assert_int_not_equal(dst, src);
    g_copied++;
    return 0;
}

static void test_dev_hooks(void **state)
{
    (void)state;
    tern_err err;
    kv_pool p, view;
    assert_int_equal(kv_pool_init_ex(&p, 2, 64, 16, 8, 0, &err), 0);
    p.dev_copy = hook_copy;
    p.dev_release = hook_release;
    p.dev_ctx = &g_released;
    assert_int_equal(kv_pool_view_init(&view, &p, NULL, 1, 32, 32, 0, &err), 0);
    assert_null(view.dev_release);
    assert_null(view.dev_copy);
    assert_int_equal(kv_block_copy(&p, 1, 0), 0);
    assert_int_equal(g_copied, 1);
    kv_pool_free(&view);
    assert_int_equal(g_released, 0);
    kv_pool_free(&p);
    assert_int_equal(g_released, 1);
    assert_ptr_equal(g_released_pool, &p);
    assert_null(p.dev_release); /* zeroed: a second free calls nothing */
    kv_pool_free(&p);
    assert_int_equal(g_released, 1);
}

/* Sink blocks for the start of a sequence, copy-on-write across formats,
 * save/load. */
static void test_pool_sinks(void **state)
{
    (void)state;
    tern_err err;
    kv_spec s;
    kv_spec_init(&s, KV_Q8);
    s.quant_start = 20; /* two blocks of 16 */
    kv_pool p;
    assert_int_equal(kv_pool_init_spec(&p, &s, 2, 64, 32, 16, 8, 3, 1, &err), 0);
    assert_int_equal(p.layers[0].sink_type, KV_BF16);
    kv_seq a = {0}, b = {0};
    assert_int_equal(kv_seq_reserve(&p, &a, 40, &err), 0);
    assert_true(a.blocks[0] < 3 && a.blocks[1] < 3 && a.blocks[2] >= 3);
    assert_int_equal(p.n_free, 5);
    /* b wants two sinks, one is left: its second start block is quantized */
    assert_int_equal(kv_seq_reserve(&p, &b, 20, &err), 0);
    assert_true(b.blocks[0] < 3 && b.blocks[1] >= 3);
    float k[64], v[64], rot[64], back[64];
    for (int pos = 0; pos < 40; pos++) {
        fill(k, 64, 1.0f);
        fill(v, 64, 1.0f);
        kv_row_store(&p, &a, 1, pos, k, v, rot);
    }
    a.n_tokens = 40;
    /* save / load round trip of a sink block into the other sink */
    size_t n = kv_block_bytes(&p, a.blocks[0]);
    uint8_t *buf = malloc(n);
    assert_int_equal(kv_block_save(&p, a.blocks[0], buf), 0);
    assert_int_equal(kv_block_load(&p, b.blocks[0], buf, n), 0);
    assert_int_equal(kv_block_load(&p, b.blocks[1], buf, n), TERN_EINVAL); /* other format */
    kv_type t0, t1;
    const uint8_t *r0 = kv_row_at(&p, &a, 1, 3, 0, &t0), *r1 = kv_row_at(&p, &b, 1, 3, 0, &t1);
    assert_int_equal(t0, t1);
    assert_memory_equal(r0, r1, p.layers[1].sink_row);
    free(buf);
    kv_seq_free(&p, &b);
    /* fork, then write into the shared sink block: copy-on-write while no
     * sink is free re-encodes into a q8 block */
    kv_seq c = {0}, d = {0};
    assert_int_equal(kv_seq_reserve(&p, &d, 16, &err), 0); /* takes the last free sink */
    assert_int_equal(p.n_free_sink, 0);
    assert_int_equal(kv_seq_fork(&p, &a, &c, 10, &err), 0);
    kv_head_decode(KV_BF16, 32, kv_row_at(&p, &c, 1, 4, 1, &t0), rot);
    assert_int_equal(kv_seq_reserve(&p, &c, 12, &err), 0);
    assert_true(c.blocks[0] >= 3 && c.blocks[0] != a.blocks[0]);
    kv_head_decode(KV_Q8, 32, kv_row_at(&p, &c, 1, 4, 1, &t1), back);
    assert_int_equal(t1, KV_Q8);
    for (int e = 0; e < 32; e++)
        assert_true(fabsf(back[e] - rot[e]) <= 0.02f);
    kv_seq_free(&p, &c);
    kv_seq_free(&p, &d);
    kv_seq_free(&p, &a);
    assert_int_equal(p.n_free, 8);
    assert_int_equal(p.n_free_sink, 3);
    kv_pool_free(&p);
}

/* ---- attention ---- */

/* Fills positions [0, n) of seq in pools a (f32) and b with the same K/V. */
static void fill_kv(kv_pool *a, kv_pool *b, kv_seq *sa, kv_seq *sb, int n, int n_layer, int kvd)
{
    float k[1024], v[1024], rot[1024];
    for (int l = 0; l < n_layer; l++)
        for (int pos = 0; pos < n; pos++) {
            fill(k, kvd, 1.0f);
            fill(v, kvd, 1.0f);
            kv_row_store(a, sa, l, pos, k, v, rot);
            kv_row_store(b, sb, l, pos, k, v, rot);
        }
}

/* Double-precision attention over the decoded cache of pool p (the scalar
 * reference for the fused kernels). */
static void ref_attention(const kv_pool *p, const kv_seq *s, int l, int n_head, int hd, int start, int pos,
                          const float *q, float scale, const float *sinks, float *out)
{
    int group = n_head / p->n_kv_head;
    int rot = kv_type_is_rotated(p->layers[l].type);
    double *sc = malloc((size_t)(pos + 1) * sizeof *sc);
    for (int h = 0; h < n_head; h++) {
        int kvh = h / group;
        float qh[256], kd[256];
        memcpy(qh, q + h * hd, (size_t)hd * sizeof(float));
        if (rot)
            kv_rotate(qh, hd);
        double mx = -1e300, sum = 0, acc[256] = {0};
        for (int t = start; t <= pos; t++) {
            kv_type tt;
            const uint8_t *r = kv_row_at(p, s, l, t, 0, &tt);
            kv_head_decode(tt, hd, r + (size_t)kvh * kv_head_bytes(tt, hd), kd);
            double d = 0;
            for (int e = 0; e < hd; e++)
                d += (double)qh[e] * kd[e];
            sc[t] = d * scale;
            mx = fmax(mx, sc[t]);
        }
        if (sinks) /* the sink's logit: in the max and the denominator, no value */
            mx = fmax(mx, sinks[h]);
        for (int t = start; t <= pos; t++)
            sum += sc[t] = exp(sc[t] - mx);
        if (sinks)
            sum += exp(sinks[h] - mx);
        for (int t = start; t <= pos; t++) {
            kv_type tt;
            const uint8_t *r = kv_row_at(p, s, l, t, 1, &tt);
            kv_head_decode(tt, hd, r + (size_t)kvh * kv_head_bytes(tt, hd), kd);
            for (int e = 0; e < hd; e++)
                acc[e] += sc[t] / sum * kd[e];
        }
        for (int e = 0; e < hd; e++)
            qh[e] = (float)acc[e];
        if (rot)
            kv_unrotate(qh, hd);
        memcpy(out + h * hd, qh, (size_t)hd * sizeof(float));
    }
    free(sc);
}

/* Relative RMS error of the attention output vs f32, per type (measured
 * over these random inputs: the bound is ~2-3x the worst seen). */
static double att_tolerance(kv_type t)
{
    switch (t) {
    case KV_F32: return 0;
    case KV_BF16: return 0.006;
    case KV_F16: return 0.001;
    case KV_Q8: return 0.015;
    case KV_Q4: return 0.35;
    case KV_R4: return 0.25;
    default: return 0.5;
    }
}

static void test_attention_types(void **state)
{
    (void)state;
    tern_err err;
    model_backend *be = model_backend_cpu_new(2, &err);
    assert_non_null(be);
    enum { N_HEAD = 4, N_KV = 2, HD = 64, N = 200, NL = 2 };
    int kvd = N_KV * HD;
    printf("attention vs f32 (relative RMS, %d positions, heads of %d):", N, HD);
    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int qs = 0; qs <= 32; qs += 32) {
            kv_type t = all_types[ti];
            kv_spec s, sf;
            kv_spec_init(&s, t);
            kv_spec_init(&sf, KV_F32);
            s.quant_start = qs;
            kv_pool pf, pt;
            assert_int_equal(kv_pool_init_spec(&pf, &sf, NL, kvd, HD, 16, 16, 0, 1, &err), 0);
            assert_int_equal(kv_pool_init_spec(&pt, &s, NL, kvd, HD, 16, 16, 4, 1, &err), 0);
            kv_seq sa = {0}, sb = {0};
            assert_int_equal(kv_seq_reserve(&pf, &sa, N, &err), 0);
            assert_int_equal(kv_seq_reserve(&pt, &sb, N, &err), 0);
            g_seed = 99;
            fill_kv(&pf, &pt, &sa, &sb, N, NL, kvd);
            /* three query rows at different positions */
            int32_t pos[3] = {5, 100, N - 1}, toks[3] = {0, 0, 0}, rows[1] = {0};
            kv_seq *sa3[3] = {&sa, &sa, &sa}, *sb3[3] = {&sb, &sb, &sb};
            float q[3 * N_HEAD * HD], of[3 * N_HEAD * HD], ot[3 * N_HEAD * HD], oref[N_HEAD * HD];
            fill(q, 3 * N_HEAD * HD, 0.5f);
            fwd_batch bf = {3, toks, pos, sa3, 0, rows}, bt = {3, toks, pos, sb3, 0, rows};
            model_attn af = {&pf, &bf, 1, N_HEAD, N_KV, HD, 0, 0.125f, 0, q, of, NULL};
            model_attn at = {&pt, &bt, 1, N_HEAD, N_KV, HD, 0, 0.125f, 0, q, ot, NULL};
            assert_int_equal(be->attention(be, &af, &err), 0);
            assert_int_equal(be->attention(be, &at, &err), 0);
            double num = 0, den = 0, ref_worst = 0;
            for (int i = 0; i < 3 * N_HEAD * HD; i++) {
                num += ((double)ot[i] - of[i]) * ((double)ot[i] - of[i]);
                den += (double)of[i] * of[i];
            }
            /* the fused kernel equals the reference over the decoded cache */
            for (int i = 0; i < 3; i++) {
                ref_attention(&pt, &sb, 1, N_HEAD, HD, 0, pos[i], q + i * N_HEAD * HD, 0.125f, NULL, oref);
                for (int e = 0; e < N_HEAD * HD; e++)
                    ref_worst = fmax(ref_worst, fabs(oref[e] - ot[i * N_HEAD * HD + e]));
            }
            double rel = sqrt(num / den);
            printf(" %s%s %.2g", kv_type_name(t), qs ? "+qs32" : "", rel);
            if (rel > att_tolerance(t))
                fail_msg("%s: attention relative error %g > %g", kv_type_name(t), rel, att_tolerance(t));
            if (ref_worst > 1e-5)
                fail_msg("%s: fused attention differs from the decoded reference by %g", kv_type_name(t), ref_worst);
            kv_seq_free(&pf, &sa);
            kv_seq_free(&pt, &sb);
            kv_pool_free(&pf);
            kv_pool_free(&pt);
        }
    }
    printf("\n");
    be->free(be);
}

/* The CPU attention's bits depend on a row's own positions only (backend_cpu.c:
 * chunks at fixed positions, folded in order): every row of a batch equals
 * the row alone, at 1, 2, 3 and 7 threads (a lone token's chunks are the
 * items from 2 threads on, a batch's pairs), over many chunks and a context
 * long enough for longer chunks, GQA groups of 4 and 3, with and without a
 * window, with and without attention-sink logits (gpt_oss), f16 and q8 with
 * 16-bit sink blocks; and within 1e-5 of the
 * double-precision reference over the decoded cache. */
static void test_attention_invariance(void **state)
{
    (void)state;
    tern_err err;
    enum { HD = 64, N_KV = 2, N = 4300, T = 7, NT = 4 };
    const int threads[NT] = {1, 2, 3, 7}, n_heads[2] = {8, 6}, windows[2] = {0, 150};
    const kv_type types[2] = {KV_F16, KV_Q8};
    int32_t pos[T] = {4299, 0, 17, 63, 64, 200, 700}, toks[T] = {0}, row0 = 0;
    model_backend *be[NT];
    for (int b = 0; b < NT; b++)
        assert_non_null(be[b] = model_backend_cpu_new(threads[b], &err));
    int kvd = N_KV * HD;
    float *k = malloc((size_t)kvd * sizeof(float)), *v = malloc((size_t)kvd * sizeof(float)),
          *rot = malloc((size_t)kvd * sizeof(float));
    float *q = malloc((size_t)T * 8 * HD * sizeof(float)), *ob = malloc((size_t)T * 8 * HD * sizeof(float)),
          *o1 = malloc((size_t)T * 8 * HD * sizeof(float)), *one = malloc((size_t)8 * HD * sizeof(float));
    double worst = 0;
    for (int ti = 0; ti < 2; ti++)
        for (int si = 0; si < 2; si++) {
            int nh = n_heads[si], qd = nh * HD;
            kv_spec s;
            kv_spec_init(&s, types[ti]);
            s.quant_start = types[ti] == KV_Q8 ? 32 : 0;
            kv_pool p;
            assert_int_equal(kv_pool_init_spec(&p, &s, 1, kvd, HD, 16, N / 16 + 8, 4, 1, &err), 0);
            kv_seq sq = {0};
            assert_int_equal(kv_seq_reserve(&p, &sq, N, &err), 0);
            g_seed = 7 + ti;
            for (int t = 0; t < N; t++) {
                fill(k, kvd, 1.0f);
                fill(v, kvd, 1.0f);
                kv_row_store(&p, &sq, 0, t, k, v, rot);
            }
            fill(q, T * qd, 1.0f);
            kv_seq *seqs[T];
            for (int i = 0; i < T; i++)
                seqs[i] = &sq;
            /* windows 0 and 150, then both again with per-head sink logits (gpt_oss): moderate ones and
             * one that outweighs every position */
            float sinks[8];
            for (int h = 0; h < 8; h++)
                sinks[h] = h == 1 ? 9.0f : 3.0f * (float)((h * 5) % 7 - 3) / 3.0f;
            for (int wc = 0; wc < 4; wc++) {
                int wi = wc % 2;
                const float *sk = wc >= 2 ? sinks : NULL;
                fwd_batch bb = {T, toks, pos, seqs, 0, &row0};
                for (int i = 0; i < T; i++) { /* each row alone, one thread: the reference bits */
                    fwd_batch b1 = {1, toks, &pos[i], seqs, 0, &row0};
                    model_attn a1 = {&p, &b1, 0, nh, N_KV, HD, windows[wi], 0.125f, 0, q + (size_t)i * qd,
                                     o1 + (size_t)i * qd, sk};
                    assert_int_equal(be[0]->attention(be[0], &a1, &err), 0);
                    int start = windows[wi] && pos[i] - windows[wi] + 1 > 0 ? pos[i] - windows[wi] + 1 : 0;
                    float ref[8 * HD];
                    ref_attention(&p, &sq, 0, nh, HD, start, pos[i], q + (size_t)i * qd, 0.125f, sk, ref);
                    for (int e = 0; e < qd; e++)
                        worst = fmax(worst, fabs(ref[e] - o1[(size_t)i * qd + e]));
                }
                for (int b = 0; b < NT; b++) {
                    model_attn ab = {&p, &bb, 0, nh, N_KV, HD, windows[wi], 0.125f, 0, q, ob, sk};
                    assert_int_equal(be[b]->attention(be[b], &ab, &err), 0);
                    assert_memory_equal(ob, o1, (size_t)T * qd * sizeof(float));
                    for (int i = 0; i < T; i++) {
                        fwd_batch b1 = {1, toks, &pos[i], seqs, 0, &row0};
                        model_attn a1 = {&p, &b1, 0, nh, N_KV, HD, windows[wi], 0.125f, 0, q + (size_t)i * qd, one, sk};
                        assert_int_equal(be[b]->attention(be[b], &a1, &err), 0);
                        assert_memory_equal(one, o1 + (size_t)i * qd, (size_t)qd * sizeof(float));
                    }
                }
            }
            kv_seq_free(&p, &sq);
            kv_pool_free(&p);
        }
    printf("attention: batch == alone at 1/2/3/7 threads; worst |out - double reference| %.3g\n", worst);
    assert_true(worst < 1e-5);
    for (int b = 0; b < NT; b++)
        be[b]->free(be[b]);
    free(k), free(v), free(rot), free(q), free(ob), free(o1), free(one);
}

/* ---- the forward with typed pools ---- */

static tern_model *g_demo;

/* Logits of the last of n ids, fed in chunks of step tokens. */
static void run_seq(tern_model *m, kv_pool *kv, kv_seq *s, const int32_t *ids, int from, int n, float *logits)
{
    tern_err err;
    assert_int_equal(kv_seq_reserve(kv, s, n, &err), 0);
    int32_t pos[64], row = n - 1 - from;
    kv_seq *seqs[64];
    for (int i = from; i < n; i++) {
        pos[i - from] = i;
        seqs[i - from] = s;
    }
    fwd_batch b = {n - from, ids + from, pos, seqs, 1, &row};
    assert_int_equal(model_forward(m, kv, &b, logits, &err), 0);
}

static void test_forward_types(void **state)
{
    (void)state;
    tern_err err;
    if (!g_demo)
        g_demo = model_load(repo_path("models/tern-demo"), 2, &err);
    assert_non_null(g_demo);
    tern_model *m = g_demo;
    int V = model_config_get(m)->n_vocab;
    int32_t ids[48];
    for (int i = 0; i < 48; i++)
        ids[i] = 10 + (i * 37) % 500;
    float *l0 = malloc((size_t)V * 4), *l1 = malloc((size_t)V * 4), *lf = malloc((size_t)V * 4);
    for (int ti = 0; ti < N_TYPES; ti++) {
        kv_spec s;
        kv_spec_init(&s, all_types[ti]);
        s.quant_start = ti % 2 ? 16 : 0;
        assert_int_equal(kv_spec_parse_layers(&s, "last1=bf16", &err), 0);
        kv_pool kv;
        assert_int_equal(model_kv_pool_init(m, &kv, &s, 16, 32, 4, 1, &err), 0);
        /* one batch == chunks */
        kv_seq a = {0}, b = {0}, c = {0};
        run_seq(m, &kv, &a, ids, 0, 48, l0);
        run_seq(m, &kv, &b, ids, 0, 20, l1);
        run_seq(m, &kv, &b, ids, 20, 48, l1);
        assert_memory_equal(l0, l1, (size_t)V * 4);
        /* fork at 40 then extend (copy-on-write of the shared block) */
        assert_int_equal(kv_seq_fork(&kv, &a, &c, 40, &err), 0);
        run_seq(m, &kv, &c, ids, 40, 48, l1);
        assert_memory_equal(l0, l1, (size_t)V * 4);
        /* rollback: truncate to 30 and redo */
        kv_seq_truncate(&kv, &b, 30);
        run_seq(m, &kv, &b, ids, 30, 48, l1);
        assert_memory_equal(l0, l1, (size_t)V * 4);
        if (ti == 0)
            memcpy(lf, l0, (size_t)V * 4);
        double mx = 0;
        for (int t = 0; t < V; t++)
            mx = fmax(mx, fabs(l0[t] - lf[t]));
        printf("%s%s: max |logit - f32 KV| %.3g\n", kv_type_name(all_types[ti]), s.quant_start ? " (quant start 16)" : "",
               mx);
        kv_seq_free(&kv, &a);
        kv_seq_free(&kv, &b);
        kv_seq_free(&kv, &c);
        assert_int_equal(kv.n_free, kv.n_blocks);
        kv_pool_free(&kv);
    }
    free(l0);
    free(l1);
    free(lf);
    /* a head_dim a type cannot store is refused, naming it */
    kv_spec s;
    kv_spec_init(&s, KV_Q8);
    tern_model *st = model_load(shared_path("models/stories260K"), 1, &err); /* heads of 8 */
    assert_non_null(st);
    kv_pool kv;
    assert_int_equal(model_kv_pool_init(st, &kv, &s, 16, 8, 0, 1, &err), 0);
    kv_pool_free(&kv);
    model_free(st);
}

static int teardown(void **state)
{
    (void)state;
    model_free(g_demo);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_rotation),   cmocka_unit_test(test_fused_reads),
        cmocka_unit_test(test_bytes),        cmocka_unit_test(test_spec_parse), cmocka_unit_test(test_pool_sinks),
        cmocka_unit_test(test_attention_types), cmocka_unit_test(test_attention_invariance),
        cmocka_unit_test(test_forward_types),
        cmocka_unit_test(test_dev_hooks),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
