/* The token-bitmask kernels: the AVX2 versions (when the CPU has AVX2)
 * equal the scalar references on random inputs of every tail length. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/rng.h"
#include "grammar/bitset.h"

static void test_or_and_count(void **state)
{
    (void)state;
    tern_rng r;
    tern_rng_seed(&r, 3, 5);
    int have_avx2 = tern_cpu()->avx2;
    for (size_t n = 0; n < 70; n++) {
        uint32_t a[80] = {0}, b[80] = {0}, ref[80], fast[80];
        for (size_t i = 0; i < n; i++) {
            a[i] = tern_rng_u32(&r) & tern_rng_u32(&r);
            b[i] = tern_rng_u32(&r);
        }
        memcpy(ref, a, sizeof a);
        memcpy(fast, a, sizeof a);
        gbits_or_scalar(ref, b, n);
        gbits_or(fast, b, n);
        assert_memory_equal(ref, fast, n * sizeof *ref);
        size_t c = 0;
        for (size_t i = 0; i < n * 32; i++)
            c += (ref[i / 32] >> (i % 32)) & 1;
        assert_int_equal(gbits_count_scalar(ref, n), c);
        assert_int_equal(gbits_count(ref, n), c);
        if (have_avx2) {
            memcpy(fast, a, sizeof a);
            gbits_or_avx2(fast, b, n);
            assert_memory_equal(ref, fast, n * sizeof *ref);
            assert_int_equal(gbits_count_avx2(ref, n), c);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_or_and_count)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
