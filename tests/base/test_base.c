/* Tests for src/base: errors, JSON glue, thread pool, rng. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <limits.h>
#include <string.h>

#include "base/err.h"
#include "base/json.h"
#include "base/pool.h"
#include "base/rng.h"

static void test_err_messages(void **state)
{
    (void)state;
    tern_err e;
    assert_int_equal(tern_err_set(&e, TERN_EFORMAT, "bad %d", 7), TERN_EFORMAT);
    assert_string_equal(e.msg, "bad 7");
    tern_err_wrap(&e, "loading %s", "x");
    assert_string_equal(e.msg, "loading x: bad 7");
    assert_string_equal(tern_err_name(TERN_ENOMEM), "ENOMEM");
    assert_int_equal(tern_err_set(NULL, TERN_EIO, "ignored"), TERN_EIO);
}

/* The code table of tern.h: the values are the ABI (an embedder compares
 * against them), so they are spelled out here rather than read back from
 * TERN_ERRNO_MAP; names and messages come from that one table. */
static void test_err_table(void **state)
{
    (void)state;
    static const struct { int code, value; const char *name, *msg; } want[] = {
        {TERN_OK, 0, "OK", "ok"},
        {TERN_EINVAL, -1, "EINVAL", "invalid argument"},
        {TERN_ENOMEM, -2, "ENOMEM", "out of memory"},
        {TERN_EIO, -3, "EIO", "input/output error"},
        {TERN_EFORMAT, -4, "EFORMAT", "malformed input"},
        {TERN_EUNSUPPORTED, -5, "EUNSUPPORTED", "unsupported"},
        {TERN_ERANGE, -6, "ERANGE", "value out of range"},
        {TERN_ETIMEOUT, -7, "ETIMEOUT", "time limit exceeded"},
        {TERN_ECANCELED, -8, "ECANCELED", "canceled"},
        {TERN_EFULL, -9, "EFULL", "capacity exhausted"},
        {TERN_ENOTFOUND, -10, "ENOTFOUND", "not found"},
        {TERN_EINTERNAL, -11, "EINTERNAL", "internal error"},
    };
    size_t n = sizeof want / sizeof want[0];
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(want[i].code, want[i].value);
        assert_string_equal(tern_err_name(want[i].code), want[i].name);
        assert_string_equal(tern_strerror(want[i].code), want[i].msg);
        assert_string_equal(tern_err_str(want[i].code), want[i].msg);
    }
    /* every row of the table is checked above, and only those */
    size_t n_map = 0;
#define COUNT(name, value, msg) n_map++;
    TERN_ERRNO_MAP(COUNT)
#undef COUNT
    assert_int_equal(n_map, n);
    const int unknown[] = {1, -12, 100, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_string_equal(tern_strerror(unknown[i]), "unknown error");
        assert_string_equal(tern_err_name(unknown[i]), "EUNKNOWN");
    }
    /* no format: the message is the table's */
    tern_err e;
    assert_int_equal(tern_err_set(&e, TERN_EFULL, NULL), TERN_EFULL);
    assert_string_equal(e.msg, "capacity exhausted");
}

static void test_json_fields(void **state)
{
    (void)state;
    tern_err e;
    const char *doc = "{\"a\": 3, \"b\": 2.5, \"c\": \"s\", \"d\": true, \"n\": null}";
    json_object *o = tern_json_parse(doc, strlen(doc), &e);
    assert_non_null(o);
    int64_t i = 0;
    double d = 0;
    const char *s = NULL;
    int b = 0;
    assert_int_equal(tern_json_get_int(o, "a", &i, "t", &e), 0);
    assert_int_equal(i, 3);
    assert_int_equal(tern_json_get_int(o, "b", &i, "t", &e), TERN_EFORMAT);
    assert_non_null(strstr(e.msg, "'b'"));
    assert_int_equal(tern_json_get_num(o, "b", &d, "t", &e), 0);
    assert_true(d == 2.5);
    assert_int_equal(tern_json_get_str(o, "c", &s, "t", &e), 0);
    assert_string_equal(s, "s");
    assert_int_equal(tern_json_get_bool(o, "d", &b, "t", &e), 0);
    assert_int_equal(b, 1);
    assert_int_equal(tern_json_get_int(o, "n", &i, "t", &e), TERN_ENOTFOUND);
    assert_int_equal(tern_json_get_int(o, "zz", &i, "t", &e), TERN_ENOTFOUND);
    json_object_put(o);
    assert_null(tern_json_parse("{\"a\": ", 6, &e));
    assert_int_equal(e.code, TERN_EFORMAT);
    assert_null(tern_json_parse("{} x", 4, &e));
    char buf[64];
    tern_json_escape(buf, sizeof buf, "a\"\n\x01", 4);
    assert_string_equal(buf, "\"a\\\"\\n\\u0001\"");
}

typedef struct { long *hits; } pool_ctx;
static void mark(void *ctx, long b, long e, int w)
{
    (void)w;
    pool_ctx *c = ctx;
    for (long i = b; i < e; i++)
        c->hits[i]++;
}

static void test_pool_covers_range_once(void **state)
{
    (void)state;
    tern_pool *p = tern_pool_new(3);
    assert_non_null(p);
    long hits[1001];
    for (int rep = 0; rep < 50; rep++) {
        long n = 1 + rep * 20;
        memset(hits, 0, sizeof hits);
        pool_ctx c = {hits};
        tern_pool_for(p, n, 1, mark, &c);
        for (long i = 0; i < n; i++)
            assert_int_equal(hits[i], 1);
        assert_int_equal(hits[n], 0);
        /* claimed pieces: every item once, whatever the piece size, and
         * the static split still right after them (the pool's mode resets) */
        memset(hits, 0, sizeof hits);
        tern_pool_for_chunks(p, n, 1 + rep % 7, mark, &c);
        for (long i = 0; i < n; i++)
            assert_int_equal(hits[i], 1);
        assert_int_equal(hits[n], 0);
    }
    tern_pool_free(p);
    tern_pool_free(NULL);
}

static void test_rng_deterministic(void **state)
{
    (void)state;
    tern_rng a, b;
    tern_rng_seed(&a, 42, 1);
    tern_rng_seed(&b, 42, 1);
    for (int i = 0; i < 100; i++)
        assert_int_equal(tern_rng_u32(&a), tern_rng_u32(&b));
    tern_rng_seed(&b, 43, 1);
    int same = 0;
    for (int i = 0; i < 100; i++)
        same += tern_rng_u32(&a) == tern_rng_u32(&b);
    assert_true(same < 5);
    double sum = 0;
    for (int i = 0; i < 10000; i++) {
        float f = tern_rng_f32(&a);
        assert_true(f >= 0.0f && f < 1.0f);
        sum += f;
    }
    assert_true(sum / 10000 > 0.48 && sum / 10000 < 0.52);
}

/* Jumping ahead by k equals k sequential draws, for k around powers of two. */
static void test_rng_advance(void **state)
{
    (void)state;
    const uint64_t ks[] = {0, 1, 2, 3, 7, 8, 100, 1023, 1024, 65537};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        tern_rng a, b;
        tern_rng_seed(&a, 9, 5);
        b = a;
        for (uint64_t k = 0; k < ks[i]; k++)
            tern_rng_u32(&a);
        tern_rng_advance(&b, ks[i]);
        assert_int_equal(a.state, b.state);
        assert_int_equal(tern_rng_u32(&a), tern_rng_u32(&b));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_messages),
        cmocka_unit_test(test_err_table),
        cmocka_unit_test(test_json_fields),
        cmocka_unit_test(test_pool_covers_range_once),
        cmocka_unit_test(test_rng_deterministic),
        cmocka_unit_test(test_rng_advance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
