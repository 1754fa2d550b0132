/* The grammar compile cache (src/grammar/cache.c): hits and misses, cached
 * failures, one compile for many concurrent identical requests, cancelled
 * or deadline-cut compiles not cached (grammar_thread_control_set), LRU
 * eviction by memory with grammars in use kept alive. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "grammar/cache.h"

static const char *const TOKS[] = {"a", "b", "ab", "{", "}", "<eos>"};
#define N_TOK 6

static grammar_vocab *vocab(void)
{
    size_t lens[N_TOK];
    uint8_t special[N_TOK] = {0, 0, 0, 0, 0, 1};
    for (int i = 0; i < N_TOK; i++)
        lens[i] = strlen(TOKS[i]);
    int32_t stop = 5;
    grammar_vocab *v = grammar_vocab_from_bytes(TOKS, lens, special, N_TOK, N_TOK, &stop, 1, NULL);
    assert_non_null(v);
    return v;
}

typedef struct build_ctx {
    const char *ebnf;
    int sleep_ms;
    int calls; /* atomically incremented */
} build_ctx;

static int build(void *user, char **out, tern_err *err)
{
    build_ctx *b = user;
    __atomic_add_fetch(&b->calls, 1, __ATOMIC_SEQ_CST);
    if (b->sleep_ms) {
        struct timespec ts = {0, (long)b->sleep_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!b->ebnf)
        return tern_err_set(err, TERN_EUNSUPPORTED, "keyword 'frobnicate' unsupported");
    *out = strdup(b->ebnf);
    return *out ? 0 : tern_err_set(err, TERN_ENOMEM, "oom");
}

/* The compiled grammar behaves as its EBNF says (a matcher accepts a
 * sentence), so a wrong entry could not pass. */
static void check_accepts(grammar_compiled *cg, const char *s)
{
    grammar_matcher *m = grammar_matcher_new(cg, NULL);
    assert_non_null(m);
    assert_int_equal(grammar_matcher_accept_string(m, s, strlen(s)), 1);
    assert_true(grammar_matcher_can_end(m));
    grammar_matcher_free(m);
}

static void test_hit_miss(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    grammar_cache *c = grammar_cache_new(v, 0, NULL, NULL);
    build_ctx b1 = {"root ::= \"a\"+", 0, 0}, b2 = {"root ::= \"{\" \"b\"* \"}\"", 0, 0};
    int hit = -1;
    double ms;
    grammar_cache_ref *r1 = grammar_cache_get(c, "k1", 2, build, &b1, &hit, &ms, NULL);
    assert_non_null(r1);
    assert_int_equal(hit, 0);
    grammar_cache_ref *r1b = grammar_cache_get(c, "k1", 2, build, &b1, &hit, &ms, NULL);
    assert_int_equal(hit, 1);
    assert_ptr_equal(grammar_cache_ref_compiled(r1), grammar_cache_ref_compiled(r1b));
    assert_int_equal(b1.calls, 1);
    /* a key that is a prefix of another is a different key */
    grammar_cache_ref *r2 = grammar_cache_get(c, "k", 1, build, &b2, &hit, &ms, NULL);
    assert_int_equal(hit, 0);
    assert_ptr_not_equal(grammar_cache_ref_compiled(r1), grammar_cache_ref_compiled(r2));
    check_accepts(grammar_cache_ref_compiled(r1), "aaa");
    check_accepts(grammar_cache_ref_compiled(r2), "{bb}");
    grammar_cache_stats st;
    grammar_cache_stats_get(c, &st);
    assert_int_equal(st.hits, 1);
    assert_int_equal(st.misses, 2);
    assert_int_equal(st.n_entries, 2);
    assert_true(st.bytes > 0);
    grammar_cache_release(c, r1);
    grammar_cache_release(c, r1b);
    grammar_cache_release(c, r2);
    grammar_cache_release(c, NULL);
    grammar_cache_free(c);
    grammar_vocab_free(v);
}

static void test_failures_cached(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    grammar_cache *c = grammar_cache_new(v, 0, NULL, NULL);
    build_ctx bad = {NULL, 0, 0}, syntax = {"root ::= (\"a\"", 0, 0};
    int hit;
    double ms;
    tern_err err = {0};
    assert_null(grammar_cache_get(c, "bad", 3, build, &bad, &hit, &ms, &err));
    assert_int_equal(err.code, TERN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "frobnicate"));
    memset(&err, 0, sizeof err);
    assert_null(grammar_cache_get(c, "bad", 3, build, &bad, &hit, &ms, &err));
    assert_int_equal(hit, 1);
    assert_int_equal(bad.calls, 1); /* not rebuilt */
    assert_non_null(strstr(err.msg, "frobnicate"));
    assert_null(grammar_cache_get(c, "syn", 3, build, &syntax, &hit, &ms, &err));
    assert_int_equal(err.code, TERN_EFORMAT);
    grammar_cache_stats st;
    grammar_cache_stats_get(c, &st);
    assert_int_equal(st.failures, 2);
    grammar_cache_free(c);
    grammar_vocab_free(v);
}

typedef struct th_arg {
    grammar_cache *c;
    build_ctx *b;
    grammar_cache_ref *r;
    int hit;
} th_arg;

static void *th_get(void *p)
{
    th_arg *a = p;
    double ms;
    a->r = grammar_cache_get(a->c, "same", 4, build, a->b, &a->hit, &ms, NULL);
    return NULL;
}

static void test_concurrent_single_compile(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    grammar_cache *c = grammar_cache_new(v, 0, NULL, NULL);
    build_ctx b = {"root ::= \"ab\" | \"b\"", 150, 0};
    enum { N = 8 };
    pthread_t th[N];
    th_arg a[N];
    for (int i = 0; i < N; i++) {
        a[i] = (th_arg){c, &b, NULL, -1};
        assert_int_equal(pthread_create(&th[i], NULL, th_get, &a[i]), 0);
    }
    int misses = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        assert_non_null(a[i].r);
        assert_ptr_equal(grammar_cache_ref_compiled(a[i].r), grammar_cache_ref_compiled(a[0].r));
        misses += a[i].hit == 0;
    }
    assert_int_equal(b.calls, 1);
    assert_int_equal(misses, 1);
    check_accepts(grammar_cache_ref_compiled(a[0].r), "ab");
    for (int i = 0; i < N; i++)
        grammar_cache_release(c, a[i].r);
    grammar_cache_free(c);
    grammar_vocab_free(v);
}

/* A build that, like the schema front end, gives up when the thread's
 * compile control says so (grammar_thread_control_set). */
static int build_checked(void *user, char **out, tern_err *err)
{
    build_ctx *b = user;
    __atomic_add_fetch(&b->calls, 1, __ATOMIC_SEQ_CST);
    struct timespec ts = {0, (long)b->sleep_ms * 1000000L};
    nanosleep(&ts, NULL);
    int stop = grammar_thread_stopped();
    if (stop)
        return tern_err_set(err, stop, "stopped");
    *out = strdup(b->ebnf);
    return *out ? 0 : tern_err_set(err, TERN_ENOMEM, "oom");
}

typedef struct ctl_arg {
    grammar_cache *c;
    build_ctx *b;
    const int *cancel;
    double deadline_ms;
    grammar_cache_ref *r;
    tern_err err;
} ctl_arg;

static void *th_get_ctl(void *p)
{
    ctl_arg *a = p;
    int hit;
    double ms;
    grammar_thread_control_set(a->cancel, a->deadline_ms);
    a->r = grammar_cache_get(a->c, "k", 1, build_checked, a->b, &hit, &ms, &a->err);
    grammar_thread_control_set(NULL, 0);
    return NULL;
}

/* A cancelled compile is not cached: a thread waiting for it compiles the
 * grammar itself, and later requests hit that. */
static void test_cancel_not_cached(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    grammar_cache *c = grammar_cache_new(v, 0, NULL, NULL);
    build_ctx b = {"root ::= \"a\" \"b\"*", 200, 0};
    int cancel = 0;
    ctl_arg a = {c, &b, &cancel, 0, NULL, {0}}, w = {c, &b, NULL, 0, NULL, {0}};
    pthread_t ta, tw;
    assert_int_equal(pthread_create(&ta, NULL, th_get_ctl, &a), 0);
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    assert_int_equal(pthread_create(&tw, NULL, th_get_ctl, &w), 0); /* waits for a's compile */
    nanosleep(&ts, NULL);
    __atomic_store_n(&cancel, 1, __ATOMIC_RELAXED);
    pthread_join(ta, NULL);
    pthread_join(tw, NULL);
    assert_null(a.r);
    assert_int_equal(a.err.code, TERN_ECANCELED);
    assert_non_null(w.r);
    assert_int_equal(b.calls, 2);
    check_accepts(grammar_cache_ref_compiled(w.r), "abb");
    int hit;
    double ms;
    grammar_cache_ref *r3 = grammar_cache_get(c, "k", 1, build_checked, &b, &hit, &ms, NULL);
    assert_non_null(r3);
    assert_int_equal(hit, 1);
    assert_int_equal(b.calls, 2);
    grammar_cache_release(c, r3);
    grammar_cache_release(c, w.r);
    grammar_cache_free(c);
    grammar_vocab_free(v);
}

/* A thread whose own deadline passes gives up (waiting, or compiling) with
 * TERN_ETIMEOUT, and a failure cut short by it before the compile's own
 * limit is not cached. */
static void test_thread_deadline(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    grammar_cache *c = grammar_cache_new(v, 0, NULL, NULL);
    build_ctx b = {"root ::= \"b\"+", 150, 0};
    ctl_arg a = {c, &b, NULL, grammar_clock_ms() + 50, NULL, {0}};
    th_get_ctl(&a);
    assert_null(a.r);
    assert_int_equal(a.err.code, TERN_ETIMEOUT);
    ctl_arg w = {c, &b, NULL, 0, NULL, {0}};
    th_get_ctl(&w);
    assert_non_null(w.r); /* compiled again: the timeout was not cached */
    assert_int_equal(b.calls, 2);
    /* a waiter whose deadline passes leaves the wait */
    build_ctx slow = {"root ::= \"a\"+", 400, 0};
    grammar_cache *c2 = grammar_cache_new(v, 0, NULL, NULL);
    ctl_arg first = {c2, &slow, NULL, 0, NULL, {0}};
    pthread_t t1;
    assert_int_equal(pthread_create(&t1, NULL, th_get_ctl, &first), 0);
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
    double t0 = grammar_clock_ms();
    ctl_arg late = {c2, &slow, NULL, t0 + 60, NULL, {0}};
    th_get_ctl(&late);
    assert_null(late.r);
    assert_int_equal(late.err.code, TERN_ETIMEOUT);
    assert_true(grammar_clock_ms() - t0 < 250);
    pthread_join(t1, NULL);
    assert_non_null(first.r);
    grammar_cache_release(c2, first.r);
    grammar_cache_release(c, w.r);
    grammar_cache_free(c2);
    grammar_cache_free(c);
    grammar_vocab_free(v);
}

static void test_eviction(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    /* a budget below one grammar: only grammars in use survive */
    grammar_cache *c = grammar_cache_new(v, 1, NULL, NULL);
    build_ctx b1 = {"root ::= \"a\"+", 0, 0}, b2 = {"root ::= \"b\"+", 0, 0};
    int hit;
    double ms;
    grammar_cache_ref *r1 = grammar_cache_get(c, "one", 3, build, &b1, &hit, &ms, NULL);
    assert_non_null(r1);
    grammar_cache_ref *r2 = grammar_cache_get(c, "two", 3, build, &b2, &hit, &ms, NULL);
    assert_non_null(r2);
    /* r1 was evicted from the list but is still usable by its holder */
    check_accepts(grammar_cache_ref_compiled(r1), "aa");
    grammar_cache_stats st;
    grammar_cache_stats_get(c, &st);
    assert_true(st.evictions >= 1);
    grammar_cache_release(c, r1);
    grammar_cache_release(c, r2);
    grammar_cache_stats_get(c, &st);
    assert_int_equal(st.n_entries, 0);
    assert_int_equal(st.bytes, 0);
    /* evicted: asking again compiles again */
    grammar_cache_ref *r1c = grammar_cache_get(c, "one", 3, build, &b1, &hit, &ms, NULL);
    assert_int_equal(hit, 0);
    assert_int_equal(b1.calls, 2);
    grammar_cache_release(c, r1c);
    grammar_cache_free(c);
    grammar_vocab_free(v);
}

static void test_mem_estimate_grows(void **state)
{
    (void)state;
    grammar_vocab *v = vocab();
    const char *small = "root ::= \"a\"", *big = "root ::= (\"a\" | \"b\" | \"{\" [a-z]* \"}\"){1,40}";
    grammar_compiled *cs = grammar_compile_ebnf(small, strlen(small), v, NULL, NULL);
    grammar_compiled *cb = grammar_compile_ebnf(big, strlen(big), v, NULL, NULL);
    assert_non_null(cs);
    assert_non_null(cb);
    assert_true(grammar_compiled_mem_bytes(cb) > grammar_compiled_mem_bytes(cs));
    grammar_compiled_free(cs);
    grammar_compiled_free(cb);
    grammar_vocab_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hit_miss),
        cmocka_unit_test(test_failures_cached),
        cmocka_unit_test(test_concurrent_single_compile),
        cmocka_unit_test(test_cancel_not_cached),
        cmocka_unit_test(test_thread_deadline),
        cmocka_unit_test(test_eviction),
        cmocka_unit_test(test_mem_estimate_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
