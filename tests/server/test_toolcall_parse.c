/* The incremental tool-call parser (src/server/toolcall_parse.c).
 * Oracle: the real chat templates (Qwen3, Hermes 3, Llama 3.1, Mistral
 * v0.3) render an assistant turn with tool calls; the text they write for
 * the calls, fed to the parser, must give back exactly those calls (name,
 * arguments JSON-equal). Plus hand-written outputs: text around calls,
 * parallel calls, malformed and truncated calls (back to content, byte for
 * byte), and for every case the parse fed byte by byte and in random pieces
 * equals the one-shot parse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/toolcall_parse.h"
#include "test_util.h"

typedef struct result {
    tern_sbuf content;
    char *names[8], *args[8];
    int n;
    toolcall_status status;
} result;

static void result_free(result *r)
{
    free(r->content.s);
    for (int i = 0; i < r->n; i++) {
        free(r->names[i]);
        free(r->args[i]);
    }
    memset(r, 0, sizeof *r);
}

static void take(result *r, toolcall_out *o)
{
    if (o->content.n)
        tern_sbuf_put(&r->content, o->content.s, o->content.n);
    for (int i = 0; i < o->n_calls; i++) {
        assert_true(r->n < 8);
        r->names[r->n] = strdup(o->calls[i].name);
        r->args[r->n] = strdup(o->calls[i].arguments);
        r->n++;
    }
    toolcall_out_reset(o);
}

/* sizes: piece lengths cycled (0-terminated), NULL = one piece. */
static void parse(const toolfmt *f, const char *text, const size_t *sizes, result *r)
{
    memset(r, 0, sizeof *r);
    toolcall_parser p;
    toolcall_out o = {0};
    toolcall_parser_init(&p, f);
    size_t n = strlen(text), at = 0, k = 0;
    while (at < n) {
        size_t step = sizes ? sizes[k++] : n;
        if (sizes && sizes[k] == 0)
            k = 0;
        if (step > n - at)
            step = n - at;
        assert_int_equal(toolcall_parser_push(&p, text + at, step, &o), 0);
        take(r, &o);
        at += step;
    }
    assert_int_equal(toolcall_parser_finish(&p, &o), 0);
    take(r, &o);
    r->status = p.status;
    toolcall_out_free(&o);
    toolcall_parser_free(&p);
}

static const char *str(const tern_sbuf *b) { return b->s ? b->s : ""; }

static void same(const result *a, const result *b, const char *what, const char *text)
{
    if (strcmp(str(&a->content), str(&b->content)) || a->n != b->n || a->status != b->status)
        fail_msg("%s of [%s]: content [%s] vs [%s], %d vs %d calls, status %d vs %d", what, text, str(&a->content),
                 str(&b->content), a->n, b->n, a->status, b->status);
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->names[i], b->names[i]) || strcmp(a->args[i], b->args[i]))
            fail_msg("%s of [%s]: call %d differs", what, text, i);
}

/* Parses text one-shot, byte by byte and in random pieces; all must agree.
 * Returns the one-shot result. */
static void parse_all_ways(const toolfmt *f, const char *text, result *one)
{
    parse(f, text, NULL, one);
    static const size_t bytes[] = {1, 0};
    result b;
    parse(f, text, bytes, &b);
    same(one, &b, "byte by byte", text);
    result_free(&b);
    srand(77);
    for (int trial = 0; trial < 100; trial++) {
        size_t sizes[12];
        for (int i = 0; i < 11; i++)
            sizes[i] = 1 + (size_t)(rand() % 13);
        sizes[11] = 0;
        result p;
        parse(f, text, sizes, &p);
        same(one, &p, "random pieces", text);
        result_free(&p);
    }
}

static void json_same(const char *got, const char *want)
{
    json_object *a = json_tokener_parse(got), *b = json_tokener_parse(want);
    if (!a || !b || !json_object_equal(a, b))
        fail_msg("arguments %s, want %s", got, want);
    json_object_put(a);
    json_object_put(b);
}

/* ---- real templates ---- */

static const char *const ARGS1 = "{\"location\": \"Paris, France\", \"unit\": \"celsius\", \"days\": 3}";
static const char *const ARGS2 = "{\"query\": \"a } tricky \\\" {string\", \"nested\": {\"list\": [1, 2.5, true, null]}, "
                                 "\"emoji\": \"caf\\u00e9 \\u2192\"}";

/* The assistant turn's call text as the template renders it: the render
 * with the calls, after what it shares with the render that stops at the
 * generation primer, up to the end of the turn. */
static char *template_call_text(const char *dir, int n_calls, const char *eot)
{
    tern_chat_template ct;
    tern_err err;
    if (tern_chat_template_load(dir, &ct, &err))
        fail_msg("%s: %s", dir, err.msg);
    char body[4096];
    const char *tools = "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"w\", "
                        "\"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\"}}}}},"
                        "{\"type\": \"function\", \"function\": {\"name\": \"search\", \"description\": \"s\", "
                        "\"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"}}}}}]";
    char calls[2048];
    snprintf(calls, sizeof calls,
             "[{\"id\": \"abcdefghi\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": %s}}%s%s%s]",
             ARGS1, n_calls > 1 ? ", {\"id\": \"bcdefghij\", \"type\": \"function\", \"function\": {\"name\": \"search\", \"arguments\": " : "",
             n_calls > 1 ? ARGS2 : "", n_calls > 1 ? "}}" : "");
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"What is the weather?\"}, {\"role\": \"assistant\", "
             "\"content\": \"\", \"tool_calls\": %s}], \"tools\": %s}",
             calls, tools);
    json_object *rq = json_tokener_parse(body);
    assert_non_null(rq);
    size_t len;
    char *with = tern_chat_template_apply(&ct, rq, NULL, &len, &err);
    if (!with)
        fail_msg("%s: %s", dir, err.msg);
    json_object_put(rq);
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"What is the weather?\"}], \"tools\": %s, "
             "\"add_generation_prompt\": true}",
             tools);
    rq = json_tokener_parse(body);
    char *primer = tern_chat_template_apply(&ct, rq, NULL, &len, &err);
    if (!primer)
        fail_msg("%s: %s", dir, err.msg);
    json_object_put(rq);
    size_t i = 0;
    while (with[i] && with[i] == primer[i])
        i++;
    const char *start = with + i;
    /* Qwen3 writes an empty think block before a call: the reasoning split takes it */
    const char *think = strstr(start, "</think>");
    if (think && think < strstr(start, "get_weather"))
        start = think + 8;
    while (*start == '\n')
        start++;
    const char *end = strstr(start, eot);
    assert_non_null(end);
    char *out = strndup(start, (size_t)(end - start));
    free(with);
    free(primer);
    tern_chat_template_free(&ct);
    return out;
}

static void check_template(const char *dir, toolfmt_kind kind, int n_calls, const char *eot)
{
    char *text = template_call_text(dir, n_calls, eot);
    result r;
    parse_all_ways(toolfmt_get(kind), text, &r);
    if (r.n != n_calls || r.status != TOOLCALL_OK)
        fail_msg("%s: %d calls (status %d) from:\n%s", dir, r.n, r.status, text);
    assert_string_equal(r.names[0], "get_weather");
    json_same(r.args[0], ARGS1);
    if (n_calls > 1) {
        assert_string_equal(r.names[1], "search");
        json_same(r.args[1], ARGS2);
    }
    if (r.content.n)
        fail_msg("%s: content [%s] beside the calls of:\n%s", dir, str(&r.content), text);
    result_free(&r);
    free(text);
}

static void test_real_templates(void **state)
{
    (void)state;
    check_template(shared_path("tokenizers/qwen3"), TOOLFMT_HERMES, 2, "<|im_end|>");
    check_template(repo_path("tests/template/templates/hermes3"), TOOLFMT_HERMES, 2, "<|im_end|>");
    check_template(repo_path("tests/template/templates/llama31"), TOOLFMT_LLAMA3, 1, "<|eot_id|>");
    check_template(repo_path("tests/template/templates/mistral"), TOOLFMT_MISTRAL, 2, "</s>");
}

/* ---- hand-written outputs ---- */

static void expect(toolfmt_kind kind, const char *text, const char *content, int n, const char *name0,
                   const char *args0, toolcall_status st)
{
    result r;
    parse_all_ways(toolfmt_get(kind), text, &r);
    if (strcmp(str(&r.content), content) || r.n != n || r.status != st)
        fail_msg("[%s]: content [%s] (want [%s]), %d calls (want %d), status %d (want %d)", text, str(&r.content),
                 content, r.n, n, r.status, st);
    if (n) {
        assert_string_equal(r.names[0], name0);
        json_same(r.args[0], args0);
    }
    result_free(&r);
}

static void test_hermes(void **state)
{
    (void)state;
    const toolfmt_kind H = TOOLFMT_HERMES;
    expect(H, "Let me check.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", "Let me check.", 1,
           "f", "{\"a\": 1}", TOOLCALL_OK);
    /* Hermes 3 writes the arguments first */
    expect(H, "<tool_call>\n{\"arguments\": {\"x\": \"}\"}, \"name\": \"g\"}\n</tool_call>\n<tool_call>\n{\"name\": \"h\", \"arguments\": {}}\n</tool_call>",
           "", 2, "g", "{\"x\": \"}\"}", TOOLCALL_OK);
    /* arguments given as JSON text; a call without arguments */
    expect(H, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 2}\"}</tool_call>", "", 1, "f", "{\"a\": 2}", TOOLCALL_OK);
    expect(H, "<tool_call>\n{\"name\": \"now\"}\n</tool_call>", "", 1, "now", "{}", TOOLCALL_OK);
    /* the arguments exactly as written: big integers, number forms and spacing survive */
    result raw;
    parse_all_ways(toolfmt_get(H), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"id\": 12345678901234567890123, \"x\": 1.10e0 ,\"s\":\"\\u00e9}\"}}\n</tool_call>", &raw);
    assert_int_equal(raw.n, 1);
    assert_string_equal(raw.args[0], "{\"id\": 12345678901234567890123, \"x\": 1.10e0 ,\"s\":\"\\u00e9}\"}");
    result_free(&raw);
    parse_all_ways(toolfmt_get(TOOLFMT_MISTRAL), "[TOOL_CALLS] [ {\"arguments\" : {\"a\":[1, {\"b\":\"]\"}]}, \"name\": \"f\"} , {\"name\":\"g\",\"arguments\":{ }}]", &raw);
    assert_int_equal(raw.n, 2);
    assert_string_equal(raw.args[0], "{\"a\":[1, {\"b\":\"]\"}]}");
    assert_string_equal(raw.args[1], "{ }");
    result_free(&raw);
    parse_all_ways(toolfmt_get(TOOLFMT_JSON), "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"n\": 10000000000000000000001}}]}", &raw);
    assert_int_equal(raw.n, 1);
    assert_string_equal(raw.args[0], "{\"n\": 10000000000000000000001}");
    result_free(&raw);
    /* the closing tag missing at the end: the JSON is complete, the call stands */
    expect(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}", "", 1, "f", "{\"a\": 1}", TOOLCALL_OK);
    /* plain answers pass through untouched */
    expect(H, "No tools needed: {\"a\": 1} and <tool_ is just text.\n", "No tools needed: {\"a\": 1} and <tool_ is just text.\n", 0,
           NULL, NULL, TOOLCALL_OK);
    expect(H, "  indented answer  ", "  indented answer  ", 0, NULL, NULL, TOOLCALL_OK);
    /* malformed: back to content byte for byte, the text before kept */
    expect(H, "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>",
           "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }}\n</tool_call>", 0, NULL, NULL, TOOLCALL_MALFORMED);
    expect(H, "<tool_call>\nnot json</tool_call> more", "<tool_call>\nnot json</tool_call> more", 0, NULL, NULL,
           TOOLCALL_MALFORMED);
    expect(H, "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", 0, NULL, NULL,
           TOOLCALL_MALFORMED);
    expect(H, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
           0, NULL, NULL, TOOLCALL_MALFORMED);
    /* truncated (max_tokens inside the call) */
    expect(H, "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu", "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu", 0, NULL, NULL,
           TOOLCALL_TRUNCATED);
    expect(H, "<tool_ca", "<tool_ca", 0, NULL, NULL, TOOLCALL_OK);
    /* a good call, then a malformed one: the first stands, the second is content */
    expect(H, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": 5}</tool_call>",
           "\n<tool_call>{\"name\": 5}</tool_call>", 1, "f", "{}", TOOLCALL_MALFORMED);
}

static void test_llama3(void **state)
{
    (void)state;
    const toolfmt_kind L = TOOLFMT_LLAMA3;
    expect(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", "", 1, "get_weather",
           "{\"city\": \"Oslo\"}", TOOLCALL_OK);
    expect(L, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", "", 1, "f", "{}", TOOLCALL_OK);
    expect(L, "{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {\"b\": [2]}}", "", 2, "f",
           "{\"a\": 1}", TOOLCALL_OK);
    /* calls open the answer only: JSON later in a sentence is content */
    expect(L, "The call is {\"name\": \"f\", \"parameters\": {}}", "The call is {\"name\": \"f\", \"parameters\": {}}", 0,
           NULL, NULL, TOOLCALL_OK);
    expect(L, "{\"type\": 1}", "{\"type\": 1}", 0, NULL, NULL, TOOLCALL_OK);
    expect(L, "{\"name\": \"f\", \"parameters\": {\"a\": tru", "{\"name\": \"f\", \"parameters\": {\"a\": tru", 0, NULL,
           NULL, TOOLCALL_TRUNCATED);
    expect(L, "{\"name\": \"f\", \"parameters\": {\"a\": tru}}", "{\"name\": \"f\", \"parameters\": {\"a\": tru}}", 0,
           NULL, NULL, TOOLCALL_MALFORMED);
}

static void test_mistral_and_json(void **state)
{
    (void)state;
    const toolfmt_kind M = TOOLFMT_MISTRAL, J = TOOLFMT_JSON;
    expect(M, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcdefghi\"}, {\"name\": \"g\", \"arguments\": {}}]",
           "", 2, "f", "{\"a\": 1}", TOOLCALL_OK);
    expect(M, "[TOOL_CALLS] []", "[TOOL_CALLS] []", 0, NULL, NULL, TOOLCALL_MALFORMED);
    expect(M, "[TOOL_CALLS] {\"name\": \"f\"}", "[TOOL_CALLS] {\"name\": \"f\"}", 0, NULL, NULL, TOOLCALL_MALFORMED);
    expect(M, "Plain [answer].", "Plain [answer].", 0, NULL, NULL, TOOLCALL_OK);
    expect(J, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]}", "", 1, "f", "{\"q\": \"x\"}", TOOLCALL_OK);
    expect(J, "{\"answer\": 42}", "{\"answer\": 42}", 0, NULL, NULL, TOOLCALL_OK);
    expect(J, "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {", "{\"tool_calls\": [{\"name\": \"f\", \"arguments\": {",
           0, NULL, NULL, TOOLCALL_TRUNCATED);
    /* no format: everything is content */
    expect(TOOLFMT_NONE, "<tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call>{\"name\": \"f\"}</tool_call>", 0, NULL,
           NULL, TOOLCALL_OK);
}

static void test_ids(void **state)
{
    (void)state;
    char a[32], b[32];
    toolcall_id_new(a, sizeof a);
    toolcall_id_new(b, sizeof b);
    assert_int_equal(strlen(a), 29);
    assert_memory_equal(a, "call_", 5);
    assert_string_not_equal(a, b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_real_templates),
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_mistral_and_json),
        cmocka_unit_test(test_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
