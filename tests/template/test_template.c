/* Tests for src/template's API contract: error values with positions, the
 * resource limits on hostile templates, parse-once/render-many, and loading
 * chat templates from folders. Rendering fidelity itself is checked against
 * jinja2 by the oracle script tests (compare.py, compare_snippets.py). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#include "base/json.h"
#include "template/template.h"

static json_object *json(const char *s)
{
    tern_err e;
    json_object *o = tern_json_parse(s, strlen(s), &e);
    assert_non_null(o);
    return o;
}

/* Renders src with ctx (JSON text); returns malloc'd output or NULL + err. */
static char *render(const char *src, const char *ctx, const tern_template_limits *lim, tern_err *e)
{
    tern_template *t = tern_template_parse(src, strlen(src), e);
    if (!t)
        return NULL;
    json_object *c = json(ctx ? ctx : "{}");
    size_t len;
    char *out = tern_template_render(t, c, lim, &len, e);
    if (out)
        assert_int_equal(len, strlen(out));
    json_object_put(c);
    tern_template_free(t);
    return out;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_basic_render(void **state)
{
    (void)state;
    tern_err e = {0};
    char *out = render("{% for m in messages %}[{{ m.role }}:{{ m.content | trim }}]{% endfor %}",
                       "{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}]}", NULL, &e);
    assert_non_null(out);
    assert_string_equal(out, "[user:hi]");
    free(out);
}

static void test_syntax_error_position(void **state)
{
    (void)state;
    tern_err e = {0};
    const char *src = "line one\n{% if x %}\n  {{ 1 + }}\n{% endif %}";
    tern_template *t = tern_template_parse(src, strlen(src), &e);
    assert_null(t);
    assert_int_equal(e.code, TERN_EFORMAT);
    assert_non_null(strstr(e.msg, "line 3"));
    assert_true(e.pos > 0 && e.pos < (long)strlen(src));
    /* unclosed block reports the end */
    assert_null(tern_template_parse("{% for x in y %}", 16, &e));
    assert_non_null(strstr(e.msg, "endfor"));
    assert_null(tern_template_parse("{{ x | nosuch }}", 16, &e));
    assert_non_null(strstr(e.msg, "nosuch"));
}

static void test_raise_exception(void **state)
{
    (void)state;
    tern_err e = {0};
    char *out = render("ok{{ raise_exception('Roles must alternate!') }}", NULL, NULL, &e);
    assert_null(out);
    assert_int_equal(e.code, TERN_EINVAL);
    assert_string_equal(e.msg, "Roles must alternate!");
    assert_true(e.pos == 2 || e.pos == 5);
}

static void test_runtime_error_position(void **state)
{
    (void)state;
    tern_err e = {0};
    char *out = render("a\nb {{ x.y.z }}", "{\"x\": {}}", NULL, &e);
    assert_null(out);
    assert_non_null(strstr(e.msg, "line 2"));
    assert_non_null(strstr(e.msg, "has no attribute 'y'"));
    tern_template *t = tern_template_parse("a\nb {{ x.y.z }}", 15, &e);
    long line, col;
    tern_template_line_col(t, 5, &line, &col);
    assert_int_equal(line, 2);
    assert_int_equal(col, 4);
    tern_template_free(t);
}

/* Each hostile template must fail with TERN_EFULL/ERANGE within a second. */
static void expect_bounded(const char *src, int code)
{
    tern_err e = {0};
    double t0 = now_s();
    char *out = render(src, NULL, NULL, &e);
    double dt = now_s() - t0;
    if (out)
        fprintf(stderr, "unexpectedly rendered %zu bytes: %.60s\n", strlen(out), src);
    assert_null(out);
    assert_int_equal(e.code, code);
    /* release builds take well under a second; sanitizer builds on a busy
     * machine a few seconds */
    assert_true(dt < 20.0);
}

static void test_limits(void **state)
{
    (void)state;
    expect_bounded("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", TERN_EFULL);
    expect_bounded("{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}", TERN_EFULL);
    expect_bounded("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                   TERN_EFULL);
    expect_bounded("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", TERN_EFULL);
    expect_bounded("{{ 'x' * 100000000000 }}", TERN_EFULL);
    expect_bounded("{{ range(1000000000) }}", TERN_EFULL);
    /* deep or self-referencing values must not exhaust the C stack */
    expect_bounded("{% set ns = namespace(l=[]) %}{% for i in range(50000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
                   TERN_ERANGE);
    expect_bounded("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", TERN_ERANGE);
    expect_bounded("{% set ns = namespace(l=[]) %}{% for i in range(50000) %}{% set ns.l = [ns.l] %}{% endfor %}"
                   "{{ ns.l | tojson }}", TERN_ERANGE);
    expect_bounded("{% set ns = namespace(l=[]) %}{% for i in range(50000) %}{% set ns.l = [ns.l] %}{% endfor %}"
                   "{{ [ns.l] < [ns.l] }}", TERN_ERANGE);

    char *deep = malloc(40000);
    strcpy(deep, "{{ ");
    for (int i = 0; i < 10000; i++)
        strcat(deep + 3 + i, "(");
    assert_null(tern_template_parse(deep, strlen(deep), NULL));
    deep[0] = '\0';
    for (int i = 0; i < 2000; i++)
        strcat(deep + strlen(deep), "{% if 1 %}");
    tern_err e = {0};
    assert_null(tern_template_parse(deep, strlen(deep), &e));
    assert_int_equal(e.code, TERN_ERANGE);
    deep[0] = '\0';
    strcat(deep, "{{ ");
    for (int i = 0; i < 3000; i++)
        strcat(deep + strlen(deep), "not ");
    strcat(deep, "1 }}");
    assert_null(tern_template_parse(deep, strlen(deep), &e));
    free(deep);

    /* caller-provided limits are honoured */
    tern_template_limits lim = {.max_output = 10};
    char *out = render("{{ 'x' * 11 }}", NULL, &lim, &e);
    assert_null(out);
    assert_int_equal(e.code, TERN_EFULL);
    out = render("{{ 'x' * 10 }}", NULL, &lim, &e);
    assert_non_null(out);
    free(out);
}

static void test_render_many(void **state)
{
    (void)state;
    tern_err e = {0};
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}";
    tern_template *t = tern_template_parse(src, strlen(src), &e);
    assert_non_null(t);
    for (int i = 0; i < 50; i++) {
        char ctx[4096] = "{\"messages\": [";
        for (int k = 0; k < i; k++)
            strcat(ctx, k ? ",{}" : "{}");
        strcat(ctx, "]}");
        json_object *c = json(ctx);
        char *out = tern_template_render(t, c, NULL, NULL, &e);
        assert_non_null(out);
        assert_int_equal(atoi(out), i);
        free(out);
        json_object_put(c);
    }
    /* bad contexts are error values */
    json_object *arr = json("[1]");
    assert_null(tern_template_render(t, arr, NULL, NULL, &e));
    assert_int_equal(e.code, TERN_EINVAL);
    json_object_put(arr);
    assert_null(tern_template_render(NULL, NULL, NULL, NULL, &e));
    tern_template_free(t);
    tern_template_free(NULL);
}

/* A parsed template is read-only while rendering: several threads may
 * render it at once and must all get the single-threaded result. */
typedef struct thread_job {
    const tern_template *t;
    const char *ctx;
    const char *want;
    int ok;
} thread_job;

static void *render_thread(void *arg)
{
    thread_job *j = arg;
    json_object *c = tern_json_parse(j->ctx, strlen(j->ctx), NULL);
    j->ok = c != NULL;
    for (int i = 0; i < 40 && j->ok; i++) {
        tern_err e;
        char *out = tern_template_render(j->t, c, NULL, NULL, &e);
        j->ok = out && !strcmp(out, j->want);
        free(out);
    }
    json_object_put(c);
    return NULL;
}

static void test_concurrent_renders(void **state)
{
    (void)state;
    const char *src = "{% macro q(x) %}<{{ x | upper }}>{% endmacro %}{% set ns = namespace(s='') %}"
                      "{% for m in messages %}{% set ns.s = ns.s ~ q(m.content) %}{% endfor %}{{ ns.s }}"
                      "{{ messages | map(attribute='content') | join(',') | tojson }}";
    tern_err e = {0};
    tern_template *t = tern_template_parse(src, strlen(src), &e);
    assert_non_null(t);
    const char *ctx = "{\"messages\": [{\"content\": \"a\"}, {\"content\": \"b\"}, {\"content\": \"c\"}]}";
    json_object *c = json(ctx);
    char *want = tern_template_render(t, c, NULL, NULL, &e);
    assert_non_null(want);
    assert_string_equal(want, "<A><B><C>\"a,b,c\"");
    json_object_put(c);
    pthread_t th[4];
    thread_job jobs[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (thread_job){t, ctx, want, 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(jobs[i].ok);
    }
    free(want);
    tern_template_free(t);
}

static void write_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(s, f);
    fclose(f);
}

static void test_chat_load(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_chat_template ct;
    const char *shared = getenv("TERN_SHARED");
    if (shared) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/tokenizers/llama3", shared);
        assert_int_equal(tern_chat_template_load(dir, &ct, &e), 0);
        assert_string_equal(tern_chat_template_token(&ct, "bos_token"), "<|begin_of_text|>");
        assert_null(tern_chat_template_token(&ct, "mask_token"));
        json_object *req = json("{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}");
        char *out = tern_chat_template_apply(&ct, req, NULL, NULL, &e);
        assert_non_null(out);
        /* llama3's template starts with bos_token from tokenizer_config.json */
        assert_true(!strncmp(out, "<|begin_of_text|><|start_header_id|>user", 40));
        free(out);
        json_object_put(req);
        tern_chat_template_free(&ct);
    }
    /* list-form chat_template: default vs tool_use, AddedToken-style eos */
    char dir[] = "/tmp/tern-tpl-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, "{\"eos_token\": {\"content\": \"</s>\", \"lstrip\": false},"
                     " \"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ eos_token }}{{ tools }}\"},"
                     " {\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"}]}");
    assert_int_equal(tern_chat_template_load(dir, &ct, &e), 0);
    json_object *req = json("{\"messages\": []}");
    char *out = tern_chat_template_apply(&ct, req, NULL, NULL, &e);
    assert_string_equal(out, "D</s>None"); /* tools defaults to None, as in transformers */
    free(out);
    json_object_put(req);
    req = json("{\"messages\": [], \"tools\": [{}, {}]}");
    out = tern_chat_template_apply(&ct, req, NULL, NULL, &e);
    assert_string_equal(out, "T2");
    free(out);
    json_object_put(req);
    tern_chat_template_free(&ct);
    /* chat_template.jinja wins over tokenizer_config.json */
    char jpath[1100];
    snprintf(jpath, sizeof jpath, "%s/chat_template.jinja", dir);
    write_file(jpath, "J{{ add_generation_prompt }}\n");
    assert_int_equal(tern_chat_template_load(dir, &ct, &e), 0);
    req = json("{\"messages\": []}");
    out = tern_chat_template_apply(&ct, req, NULL, NULL, &e);
    assert_string_equal(out, "JFalse");
    free(out);
    json_object_put(req);
    tern_chat_template_free(&ct);
    /* broken template and missing template are errors */
    write_file(jpath, "{% if %}");
    assert_int_not_equal(tern_chat_template_load(dir, &ct, &e), 0);
    unlink(jpath);
    write_file(path, "{\"eos_token\": \"x\"}");
    assert_int_equal(tern_chat_template_load(dir, &ct, &e), TERN_ENOTFOUND);
    write_file(path, "{not json");
    assert_int_not_equal(tern_chat_template_load(dir, &ct, &e), 0);
    unlink(path);
    assert_int_not_equal(tern_chat_template_load(dir, &ct, &e), 0);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basic_render),
        cmocka_unit_test(test_syntax_error_position),
        cmocka_unit_test(test_raise_exception),
        cmocka_unit_test(test_runtime_error_position),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_render_many),
        cmocka_unit_test(test_concurrent_renders),
        cmocka_unit_test(test_chat_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
