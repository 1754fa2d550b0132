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
#include <time.h>

#include "base/rng.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"

static tern_rng rng;

static float rnd(void) { return tern_rng_f32(&rng) * 2.0f - 1.0f; }

static void check_table(const tern_kernels *k)
{
    const tern_kernels *ref = tern_kernels_scalar();
    static const long sizes[][2] = {{1, 1}, {3, 7}, {5, 8}, {9, 31}, {4, 32}, {17, 33}, {8, 64},
                                    {13, 172}, {6, 384}, {3, 1000}, {2, 4096}};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        long n_out = sizes[si][0], n_in = sizes[si][1];
        for (long T = 1; T <= 6; T++) {
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

static void test_avx2(void **state)
{
    (void)state;
    const tern_kernels *k = tern_kernels_avx2();
    if (!k)
        skip();
    check_table(k);
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
}

int main(void)
{
    const char *s = getenv("TERN_SEED");
    uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("kernel test seed %llu (TERN_SEED to replay)\n", (unsigned long long)seed);
    tern_rng_seed(&rng, seed, 7);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_avx2),
        cmocka_unit_test(test_avx512),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
