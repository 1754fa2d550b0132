/* Allocation-failure injection, SQLite's way: run an operation once to count
 * its allocations, then again for every N failing the Nth one (and every
 * later one, as a real out-of-memory does). Each run must end either in
 * success or in a clean error (a negative TERN_E* code and a message), and
 * must leave no allocation behind. Covered: the request parser
 * (api_parse, chat and completions), the chat template (load and render),
 * config.json loading, tokenizer.json loading and encoding, and safetensors
 * opening.
 *
 * Live blocks are tracked in a pointer set, so a leak shows here in every
 * build, not only under ASan. */
#include <link.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <json-c/json.h>

#include "model/config.h"
#include "model/safetensors.h"
#include "base/json.h"
#include "server/api.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

/* Two ways in. A normal build defines malloc and friends here, over glibc's
 * __libc_* entry points (glibc supports replacing its allocator), so the
 * allocations of the libraries tern calls (json-c parsing a body, stdio
 * opening a file) are tracked for leaks too. Under a sanitizer, whose runtime
 * owns malloc, the linker's --wrap sends only tern's own calls here
 * (TERN_ALLOC_WRAP, tests/alloc/tests.cmake). strdup and strndup are
 * wrapped in both: glibc's allocate from inside libc. */
#ifdef TERN_ALLOC_WRAP
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
#define REAL_MALLOC __real_malloc
#define REAL_CALLOC __real_calloc
#define REAL_REALLOC __real_realloc
#define REAL_FREE __real_free
#define REAL_MEMALIGN __real_aligned_alloc
#define HOOK(name) __wrap_##name
#else
void *__libc_malloc(size_t n);
void *__libc_calloc(size_t n, size_t m);
void *__libc_realloc(void *p, size_t n);
void __libc_free(void *p);
void *__libc_memalign(size_t a, size_t n);
#define REAL_MALLOC __libc_malloc
#define REAL_CALLOC __libc_calloc
#define REAL_REALLOC __libc_realloc
#define REAL_FREE __libc_free
#define REAL_MEMALIGN __libc_memalign
#define HOOK(name) name
#endif

/* ---- the allocation counter and live-block set ---- */

#define LIVE_BITS 20
#define LIVE_CAP ((size_t)1 << LIVE_BITS)
#define TOMB ((void *)1)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static void **live;           /* open addressing, NULL empty, TOMB deleted */
static size_t n_live;
static long long n_calls;     /* allocations since the counter was armed */
static long long fail_from;   /* 0 = never fail; else fail call fail_from and later */
static int tracking, n_failed;

static size_t slot_of(void *p)
{
    return (size_t)(((uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ULL >> (64 - LIVE_BITS));
}

static void live_add(void *p)
{
    if (!p || !tracking)
        return;
    for (size_t i = slot_of(p);; i = (i + 1) & (LIVE_CAP - 1))
        if (live[i] == NULL || live[i] == TOMB) {
            live[i] = p;
            n_live++;
            return;
        }
}

static void live_del(void *p)
{
    if (!p || !live)
        return;
    for (size_t i = slot_of(p);; i = (i + 1) & (LIVE_CAP - 1)) {
        if (live[i] == NULL)
            return; /* allocated before tracking began, or by a library */
        if (live[i] == p) {
            live[i] = TOMB;
            n_live--;
            return;
        }
    }
}

/* The program's own code (tern's library is linked in statically) and
 * json-c's code: allocations made from either can fail. */
extern char __executable_start, etext;
static uintptr_t jsonc_lo, jsonc_hi;
static __thread int in_tokener; /* inside json-c's parser: nothing fails */

static int find_jsonc(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    if (!strstr(info->dlpi_name, "libjson-c"))
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            jsonc_lo = info->dlpi_addr + ph->p_vaddr;
            jsonc_hi = jsonc_lo + ph->p_memsz;
        }
    }
    return 1;
}

/* tern's calls into json-c's parser run with nothing failing inside it:
 * json-c's tokener does not recover from its own out-of-memory cleanly (it
 * leaks the half-built tree), and that is not tern's to fix. */
struct json_tokener;
json_object *__real_json_tokener_parse_ex(struct json_tokener *tok, const char *str, int len);
json_object *__wrap_json_tokener_parse_ex(struct json_tokener *tok, const char *str, int len);
json_object *__wrap_json_tokener_parse_ex(struct json_tokener *tok, const char *str, int len)
{
    in_tokener++;
    json_object *o = __real_json_tokener_parse_ex(tok, str, len);
    in_tokener--;
    return o;
}

/* Whether this allocation, made from caller, is one to fail; counts it.
 * Calls from tern and from json-c's object functions count; others (libc's
 * stdio, PCRE2) are tracked for leaks but never failed. */
static int should_fail_from(const void *caller)
{
    uintptr_t c = (uintptr_t)caller;
    int ours = c >= (uintptr_t)&__executable_start && c < (uintptr_t)&etext;
    if (!tracking || in_tokener || !(ours || (c >= jsonc_lo && c < jsonc_hi)))
        return 0;
    n_calls++;
    if (fail_from && n_calls >= fail_from) {
        n_failed++;
        return 1;
    }
    return 0;
}

void *HOOK(malloc)(size_t n);
void *HOOK(malloc)(size_t n)
{
    pthread_mutex_lock(&mu);
    void *p = should_fail_from(__builtin_return_address(0)) ? NULL : REAL_MALLOC(n);
    live_add(p);
    pthread_mutex_unlock(&mu);
    return p;
}

void *HOOK(calloc)(size_t n, size_t m);
void *HOOK(calloc)(size_t n, size_t m)
{
    pthread_mutex_lock(&mu);
    void *p = should_fail_from(__builtin_return_address(0)) ? NULL : REAL_CALLOC(n, m);
    live_add(p);
    pthread_mutex_unlock(&mu);
    return p;
}

void *HOOK(realloc)(void *q, size_t n);
void *HOOK(realloc)(void *q, size_t n)
{
    pthread_mutex_lock(&mu);
    void *p = should_fail_from(__builtin_return_address(0)) ? NULL : REAL_REALLOC(q, n);
    if (p) {
        live_del(q);
        live_add(p);
    }
    pthread_mutex_unlock(&mu);
    return p;
}

void HOOK(free)(void *p);
void HOOK(free)(void *p)
{
    pthread_mutex_lock(&mu);
    live_del(p);
    REAL_FREE(p);
    pthread_mutex_unlock(&mu);
}

void *HOOK(aligned_alloc)(size_t a, size_t n);
void *HOOK(aligned_alloc)(size_t a, size_t n)
{
    pthread_mutex_lock(&mu);
    void *p = should_fail_from(__builtin_return_address(0)) ? NULL : REAL_MEMALIGN(a, n);
    live_add(p);
    pthread_mutex_unlock(&mu);
    return p;
}

int HOOK(posix_memalign)(void **out, size_t a, size_t n);
int HOOK(posix_memalign)(void **out, size_t a, size_t n)
{
    pthread_mutex_lock(&mu);
    void *p = should_fail_from(__builtin_return_address(0)) ? NULL : REAL_MEMALIGN(a, n);
    live_add(p);
    pthread_mutex_unlock(&mu);
    if (!p)
        return 12; /* ENOMEM */
    *out = p;
    return 0;
}

char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strdup(const char *s)
{
    pthread_mutex_lock(&mu);
    int fail = should_fail_from(__builtin_return_address(0));
    pthread_mutex_unlock(&mu);
    if (fail)
        return NULL;
    char *p = __real_strdup(s); /* glibc's mallocs through the hook above when it is ours */
#ifdef TERN_ALLOC_WRAP
    pthread_mutex_lock(&mu);
    live_add(p);
    pthread_mutex_unlock(&mu);
#endif
    return p;
}

char *__wrap_strndup(const char *s, size_t n);
char *__wrap_strndup(const char *s, size_t n)
{
    pthread_mutex_lock(&mu);
    int fail = should_fail_from(__builtin_return_address(0));
    pthread_mutex_unlock(&mu);
    if (fail)
        return NULL;
    char *p = __real_strndup(s, n); /* glibc's mallocs through the hook above when it is ours */
#ifdef TERN_ALLOC_WRAP
    pthread_mutex_lock(&mu);
    live_add(p);
    pthread_mutex_unlock(&mu);
#endif
    return p;
}

#ifndef TERN_ALLOC_WRAP
void *memalign(size_t a, size_t n);
void *memalign(size_t a, size_t n)
{
    pthread_mutex_lock(&mu);
    void *p = REAL_MEMALIGN(a, n);
    live_add(p);
    pthread_mutex_unlock(&mu);
    return p;
}
#endif

static void arm(long long from)
{
    pthread_mutex_lock(&mu);
    if (!live) {
        live = REAL_CALLOC(LIVE_CAP, sizeof *live);
        dl_iterate_phdr(find_jsonc, NULL);
    }
    memset(live, 0, LIVE_CAP * sizeof *live);
    n_live = 0;
    n_calls = 0;
    n_failed = 0;
    fail_from = from;
    tracking = 1;
    pthread_mutex_unlock(&mu);
}

static void disarm(void)
{
    pthread_mutex_lock(&mu);
    tracking = 0;
    fail_from = 0;
    pthread_mutex_unlock(&mu);
}

/* ---- the driver ---- */

/* One operation: does its work, frees what it made, returns 0 or a
 * negative TERN_E* code with msg set. */
typedef int (*op_fn)(const void *arg, char *msg, size_t msg_len);

/* Runs op once clean, then failing from every N in 1..count; every run
 * must be a success or a clean error and leave nothing live. Returns the
 * number of allocation points exercised. */
static long long inject_all(const char *name, op_fn op, const void *arg, int need_errors)
{
    char msg[512];
    /* a first run warms what is made once per process (kernel tables, ...) */
    if (op(arg, msg, sizeof msg))
        fail_msg("%s: %s", name, msg);
    arm(0);
    int rc = op(arg, msg, sizeof msg);
    long long total = n_calls;
    size_t left = n_live;
    disarm();
    if (rc)
        fail_msg("%s: the clean run failed: %s", name, msg);
    if (left)
        fail_msg("%s: the clean run leaves %zu blocks", name, left);
    assert_true(total > 0);
    int n_errors = 0;
    for (long long n = 1; n <= total; n++) {
        msg[0] = 0;
        arm(n);
        rc = op(arg, msg, sizeof msg);
        left = n_live;
        int failed = n_failed;
        disarm();
        if (rc > 0)
            fail_msg("%s: failing allocation %lld gives a positive code %d", name, n, rc);
        if (rc < 0 && !msg[0])
            fail_msg("%s: failing allocation %lld gives code %d with no message", name, n, rc);
        if (left)
            fail_msg("%s: failing allocation %lld (%s) leaks %zu blocks", name, n, rc ? msg : "success", left);
        assert_true(failed > 0);
        n_errors += rc < 0;
    }
    /* failures must actually surface: an operation that swallowed every
     * out-of-memory would pass the loop above while hiding them */
    if (need_errors && n_errors == 0)
        fail_msg("%s: no injected failure surfaced as an error", name);
    printf("%s: %lld allocation points, %d clean errors\n", name, total, n_errors);
    return total;
}

/* "shared/X" is X under TERN_SHARED (default ../shared), anything else is
 * under TERN_ROOT (default .). */
static char *path_of(const char *rel)
{
    const char *root = getenv("TERN_ROOT"), *shared = getenv("TERN_SHARED");
    static char buf[4][4096];
    static int k;
    char *b = buf[k++ & 3];
    if (!strncmp(rel, "shared/", 7))
        snprintf(b, sizeof buf[0], "%s/%s", shared ? shared : "../shared", rel + 7);
    else
        snprintf(b, sizeof buf[0], "%s/%s", root ? root : ".", rel);
    return b;
}

/* ---- the operations ---- */

static const char CHAT_BODY[] =
    "{\"model\": \"tern-demo\", \"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are terse.\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi\"}, {\"type\": \"text\", \"text\": \"!\"}]},"
    "{\"role\": \"assistant\", \"content\": \"Hello.\"},"
    "{\"role\": \"user\", \"content\": \"Count to three.\"}],"
    "\"max_tokens\": 16, \"temperature\": 0.5, \"top_p\": 0.9, \"seed\": 7, \"n\": 2,"
    "\"stop\": [\"four\", \"\\n\\n\"], \"logit_bias\": {\"5\": -100, \"17\": 2.5},"
    "\"logprobs\": true, \"top_logprobs\": 3, \"stream\": true, \"stream_options\": {\"include_usage\": true}}";

static const char COMPLETION_BODY[] =
    "{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8, 9], \"max_tokens\": 4, \"echo\": false, \"stop\": \"x\","
    " \"logprobs\": 2, \"temperature\": 0}";

static const char BAD_BODY[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"temperature\": \"hot\"}";

typedef struct parse_arg {
    api_kind kind;
    const char *body;
    int want_ok;
} parse_arg;

static int op_parse(const void *arg, char *msg, size_t msg_len)
{
    const parse_arg *a = arg;
    api_limits lim = {.n_vocab = 8192, .model_name = "tern-demo"};
    api_request r;
    api_error e;
    memset(&e, 0, sizeof e);
    int rc = api_parse(&r, a->kind, a->body, strlen(a->body), &lim, &e);
    if (rc == 0) {
        api_request_free(&r);
        if (!a->want_ok) {
            snprintf(msg, msg_len, "a bad body parsed");
            return TERN_EINTERNAL;
        }
        return 0;
    }
    /* out of memory or the body's own fault: either way a 4xx/5xx with a
     * message that serializes */
    char *j = api_error_json(&e);
    snprintf(msg, msg_len, "%d %s", e.status, e.msg);
    if (!e.msg[0] || e.status < 400 || e.status > 599)
        msg[0] = 0; /* reported as no message */
    if (!j) /* the error body itself could not be made: the server sends a fixed one */
        snprintf(msg, msg_len, "%d (fixed body)", e.status);
    free(j);
    if (!a->want_ok && e.status == 400 && strstr(e.msg, "temperature"))
        return 0; /* the expected rejection */
    return rc < 0 ? rc : TERN_EINTERNAL;
}

static int op_config(const void *arg, char *msg, size_t msg_len)
{
    model_config cfg;
    tern_err err = {0};
    int rc = model_config_load(&cfg, path_of(arg), &err);
    if (rc)
        snprintf(msg, msg_len, "%s", err.msg);
    return rc;
}

static int op_tokenizer(const void *arg, char *msg, size_t msg_len)
{
    tern_err err = {0};
    tern_tokenizer *t = tokenizer_load(path_of(arg), &err);
    if (!t) {
        snprintf(msg, msg_len, "%s", err.msg);
        return err.code < 0 ? err.code : TERN_EINTERNAL;
    }
    static const char text[] = "Once upon a time, <s> a little cat sat... 12345 \xe6\x97\xa5\xe6\x9c\xac!";
    int32_t *ids = NULL;
    size_t n = 0;
    char *back = NULL;
    size_t bl = 0;
    int rc = tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n, &err);
    if (!rc)
        rc = tokenizer_decode(t, ids, n, 0, &back, &bl, &err);
    if (rc)
        snprintf(msg, msg_len, "%s", err.msg);
    free(ids);
    free(back);
    tokenizer_free(t);
    return rc;
}

static int op_safetensors(const void *arg, char *msg, size_t msg_len)
{
    st_set s;
    tern_err err = {0};
    int rc = st_open_dir(&s, path_of(arg), &err);
    if (rc) {
        snprintf(msg, msg_len, "%s", err.msg);
        return rc;
    }
    st_close(&s);
    return 0;
}

/* The chat template step of a request: load tern-demo's template, render a
 * conversation with a tool. */
static int op_template(const void *arg, char *msg, size_t msg_len)
{
    static const char req[] =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
        "{\"role\": \"user\", \"content\": \"Weather in Oslo?\"}],"
        "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"weather\","
        "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
        "\"add_generation_prompt\": true}";
    tern_chat_template ct;
    tern_err err = {0};
    int rc = tern_chat_template_load(path_of(arg), &ct, &err);
    if (rc) {
        snprintf(msg, msg_len, "%s", err.msg);
        return rc;
    }
    json_object *r = tern_json_parse(req, sizeof req - 1, &err);
    size_t len = 0;
    char *out = r ? tern_chat_template_apply(&ct, r, NULL, &len, &err) : NULL;
    if (!out) {
        snprintf(msg, msg_len, "%s", err.msg);
        rc = err.code < 0 ? err.code : TERN_EINTERNAL;
    }
    free(out);
    json_object_put(r);
    tern_chat_template_free(&ct);
    return rc;
}

static void test_parse_chat(void **state)
{
    (void)state;
    parse_arg a = {API_CHAT, CHAT_BODY, 1};
    inject_all("api_parse chat", op_parse, &a, 1);
}

static void test_parse_completion(void **state)
{
    (void)state;
    parse_arg a = {API_COMPLETION, COMPLETION_BODY, 1};
    inject_all("api_parse completion", op_parse, &a, 1);
}

static void test_parse_bad(void **state)
{
    (void)state;
    parse_arg a = {API_CHAT, BAD_BODY, 0};
    op_parse(&a, (char[64]){0}, 64);
    inject_all("api_parse bad body", op_parse, &a, 0);
}

static void test_config(void **state)
{
    (void)state;
    inject_all("config tern-demo", op_config, "models/tern-demo", 1);
}

static void test_tokenizer(void **state)
{
    (void)state;
    inject_all("tokenizer stories260K", op_tokenizer, "shared/models/stories260K", 1);
}

static void test_template(void **state)
{
    (void)state;
    inject_all("chat template tern-demo", op_template, "models/tern-demo", 1);
}

static void test_safetensors(void **state)
{
    (void)state;
    inject_all("safetensors tern-demo (sharded)", op_safetensors, "models/tern-demo", 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_chat),  cmocka_unit_test(test_parse_completion),
        cmocka_unit_test(test_parse_bad),   cmocka_unit_test(test_config),
        cmocka_unit_test(test_tokenizer),   cmocka_unit_test(test_safetensors),
        cmocka_unit_test(test_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
