/* The grammar of forced tool calls (src/server/toolcall.c) checked against
 * the templates themselves: the text a real chat template renders for an
 * assistant turn with tool calls (Qwen3, Hermes 3, Llama 3.1, Mistral) must
 * be a sentence of the grammar built for that template's format, alone and
 * as parallel calls; wrong names, arguments that break the schema, extra
 * text and a second call where one is allowed are not. Bad schemas are
 * 400s naming tools[i].function.parameters. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "grammar/grammar.h"
#include "server/toolcall.h"
#include "server/toolfmt.h"
#include "test_util.h"

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"d\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"c\"}, \"unit\": "
    "{\"enum\": [\"c\", \"f\"], \"description\": \"u\"}}, \"required\": [\"city\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"d\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"description\": \"a\"}, \"b\": "
    "{\"type\": \"integer\", \"description\": \"b\"}}, \"required\": [\"a\", \"b\"]}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"now\", \"description\": \"d\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {}}}}]";

/* calls: a JSON array of {name, arguments} */
static char *render_calls(const char *dir, const char *calls_json)
{
    tern_chat_template ct;
    tern_err err;
    assert_int_equal(tern_chat_template_load(dir, &ct, &err), 0);
    json_object *calls = json_tokener_parse(calls_json), *tc = json_object_new_array();
    assert_non_null(calls);
    for (size_t i = 0; i < json_object_array_length(calls); i++) {
        json_object *c = json_object_new_object();
        json_object_object_add(c, "id", json_object_new_string("abcdefghi"));
        json_object_object_add(c, "type", json_object_new_string("function"));
        json_object_object_add(c, "function", json_object_get(json_object_array_get_idx(calls, i)));
        json_object_array_add(tc, c);
    }
    json_object *rq = json_object_new_object(), *msgs = json_object_new_array(), *u = json_object_new_object(),
                *a = json_object_new_object();
    json_object_object_add(u, "role", json_object_new_string("user"));
    json_object_object_add(u, "content", json_object_new_string("hi"));
    json_object_object_add(a, "role", json_object_new_string("assistant"));
    json_object_object_add(a, "content", json_object_new_string(""));
    json_object_object_add(a, "tool_calls", tc);
    json_object_array_add(msgs, u);
    json_object_array_add(msgs, a);
    json_object_object_add(rq, "messages", msgs);
    json_object_object_add(rq, "tools", json_tokener_parse(TOOLS));
    size_t len;
    char *text = tern_chat_template_apply(&ct, rq, NULL, &len, &err);
    if (!text)
        fail_msg("%s: %s", dir, err.msg);
    json_object_put(rq);
    json_object_put(calls);
    tern_chat_template_free(&ct);
    return text;
}

/* The calls' text inside a rendered turn: after the last `after` (the
 * assistant turn's header), from the format's lead to just before
 * end_marker (the template's end of turn). */
static const char *after_marker;
static char *cut(const char *text, const char *from, const char *end_marker)
{
    const char *t = text, *p;
    while ((p = strstr(t, after_marker)))
        t = p + strlen(after_marker);
    const char *a = strstr(t, from);
    assert_non_null(a);
    const char *b = strstr(a, end_marker);
    assert_non_null(b);
    return strndup(a, (size_t)(b - a));
}

/* removes every occurrence of s from t in place */
static void drop(char *t, const char *s)
{
    char *p;
    size_t n = strlen(s);
    while ((p = strstr(t, s)))
        memmove(p, p + n, strlen(p + n) + 1);
}

static grammar *build(const toolfmt *f, const char *only, int parallel)
{
    json_object *tools = json_tokener_parse(TOOLS);
    char *ebnf = NULL;
    api_error e;
    if (toolcall_grammar(f, tools, only, parallel, 0, NULL, &ebnf, &e))
        fail_msg("toolcall_grammar: %s", e.msg);
    tern_err err;
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), NULL, NULL, &err);
    if (!g)
        fail_msg("%s\n%s", err.msg, ebnf);
    free(ebnf);
    json_object_put(tools);
    return g;
}

static void expect(grammar *g, const char *text, int want)
{
    int got = grammar_check_text(g, text, strlen(text));
    if (got != want)
        fail_msg("%s: got %d, want %d", text, got, want);
}

static const char *ONE = "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}]";
static const char *TWO = "[{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": -3}}, "
                         "{\"name\": \"now\", \"arguments\": {}}]";

static void check_template(const char *dir, toolfmt_kind kind, const char *after, const char *from,
                           const char *end_marker, const char *strip)
{
    after_marker = after;
    toolfmt_probe p;
    tern_chat_template ct;
    tern_err err;
    assert_int_equal(tern_chat_template_load(dir, &ct, &err), 0);
    assert_int_equal(toolfmt_detect(&ct, NULL, &p, &err), 0);
    tern_chat_template_free(&ct);
    assert_int_equal(p.fmt->kind, kind);
    grammar *par = build(p.fmt, NULL, 1), *single = build(p.fmt, NULL, 0), *named = build(p.fmt, "add", 0);
    char *r1 = render_calls(dir, ONE), *c1 = cut(r1, from, end_marker);
    if (strip)
        drop(c1, strip);
    expect(par, c1, 1);
    expect(single, c1, 1);
    expect(named, c1, 0); /* get_weather is not "add" */
    if (p.fmt->parallel) {
        char *r2 = render_calls(dir, TWO), *c2 = cut(r2, from, end_marker);
        if (strip)
            drop(c2, strip);
        expect(par, c2, 1);
        expect(single, c2, 0);
        free(r2);
        free(c2);
    }
    /* broken arguments, names and text around the calls */
    char bad[512];
    snprintf(bad, sizeof bad, "%s%s{\"name\": \"add\", \"%s\": {\"a\": \"2\", \"b\": 3}}%s%s", p.fmt->begin,
             p.fmt->call_open, p.fmt->args_key, p.fmt->call_close, p.fmt->end);
    expect(par, bad, 0);
    snprintf(bad, sizeof bad, "%s%s{\"name\": \"add\", \"%s\": {\"a\": 2, \"b\": 3}}%s%s", p.fmt->begin,
             p.fmt->call_open, p.fmt->args_key, p.fmt->call_close, p.fmt->end);
    expect(named, bad, 1);
    expect(par, bad, 1);
    snprintf(bad, sizeof bad, "%s%s{\"name\": \"add\", \"%s\": {\"a\": 2}}%s%s", p.fmt->begin, p.fmt->call_open,
             p.fmt->args_key, p.fmt->call_close, p.fmt->end);
    expect(par, bad, 0); /* b is required */
    snprintf(bad, sizeof bad, "%s%s{\"name\": \"sub\", \"%s\": {\"a\": 2, \"b\": 3}}%s%s", p.fmt->begin,
             p.fmt->call_open, p.fmt->args_key, p.fmt->call_close, p.fmt->end);
    expect(par, bad, 0);
    snprintf(bad, sizeof bad, "Sure! %s", c1);
    expect(par, bad, 0);
    free(r1);
    free(c1);
    grammar_free(par);
    grammar_free(single);
    grammar_free(named);
}

static void test_qwen3(void **s)
{
    (void)s;
    check_template(shared_path("tokenizers/qwen3"), TOOLFMT_HERMES, "<|im_start|>assistant", "<tool_call>", "<|im_end|>",
                   NULL);
}

static void test_hermes3(void **s)
{
    (void)s;
    check_template(repo_path("tests/template/templates/hermes3"), TOOLFMT_HERMES, "<|im_start|>assistant",
                   "<tool_call>", "<|im_end|>", NULL);
}

static void test_llama31(void **s)
{
    (void)s;
    check_template(repo_path("tests/template/templates/llama31"), TOOLFMT_LLAMA3,
                   "<|start_header_id|>assistant<|end_header_id|>", "{\"name\"", "<|eot_id|>", NULL);
}

static void test_mistral(void **s)
{
    (void)s;
    /* the template writes the call ids of the history; a model's calls carry none */
    check_template(repo_path("tests/template/templates/mistral"), TOOLFMT_MISTRAL, "[/INST]", "[TOOL_CALLS]", "</s>",
                   ", \"id\": \"abcdefghi\"");
}

static void test_json_and_lead_skip(void **s)
{
    (void)s;
    const toolfmt *f = toolfmt_get(TOOLFMT_JSON);
    grammar *g = build(f, NULL, 1);
    expect(g, "{\"tool_calls\": [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"add\", \"arguments\": "
              "{\"a\": 1, \"b\": 2}}]}", 1);
    expect(g, "{\"tool_calls\": []}", 0);
    grammar_free(g);
    /* a function without parameters takes exactly {} */
    json_object *bare = json_tokener_parse("[{\"type\": \"function\", \"function\": {\"name\": \"ping\"}}]");
    char *bare_ebnf;
    api_error be;
    assert_int_equal(toolcall_grammar(f, bare, NULL, 0, 0, NULL, &bare_ebnf, &be), 0);
    tern_err berr;
    g = grammar_from_ebnf(bare_ebnf, strlen(bare_ebnf), NULL, NULL, &berr);
    assert_non_null(g);
    expect(g, "{\"tool_calls\": [{\"name\": \"ping\", \"arguments\": {}}]}", 1);
    expect(g, "{\"tool_calls\": [{\"name\": \"ping\", \"arguments\": {\"x\": 1}}]}", 0);
    grammar_free(g);
    free(bare_ebnf);
    json_object_put(bare);
    /* Mistral with [TOOL_CALLS] written by a special token: the grammar starts after it */
    json_object *tools = json_tokener_parse(TOOLS);
    char *ebnf;
    api_error e;
    assert_int_equal(toolcall_grammar(toolfmt_get(TOOLFMT_MISTRAL), tools, NULL, 1, strlen("[TOOL_CALLS]"), NULL,
                                      &ebnf, &e), 0);
    tern_err err;
    g = grammar_from_ebnf(ebnf, strlen(ebnf), NULL, NULL, &err);
    assert_non_null(g);
    expect(g, " [{\"name\": \"now\", \"arguments\": {}}]", 1);
    expect(g, "[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}]", 0);
    grammar_free(g);
    free(ebnf);
    /* either a call or the schema'd answer */
    const char *alt = "root ::= \"{\" ws \"\\\"ok\\\"\" ws \":\" ws (\"true\" | \"false\") ws \"}\"\nws ::= \" \"?";
    assert_int_equal(toolcall_grammar(toolfmt_get(TOOLFMT_HERMES), tools, NULL, 0, 0, alt, &ebnf, &e), 0);
    g = grammar_from_ebnf(ebnf, strlen(ebnf), NULL, NULL, &err);
    if (!g)
        fail_msg("%s\n%s", err.msg, ebnf);
    expect(g, "{\"ok\": true}", 1);
    expect(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", 1);
    expect(g, "{\"ok\": 1}", 0);
    grammar_free(g);
    free(ebnf);
    json_object_put(tools);
}

static void test_bad_schema(void **s)
{
    (void)s;
    static const char *const bad[] = {
        "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"nonsense\"}}}",
        "{\"$ref\": \"#/$defs/missing\"}",
        "{\"type\": \"object\", \"properties\": {\"a\": {\"minimum\": \"x\"}}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char js[512];
        snprintf(js, sizeof js,
                 "[{\"type\": \"function\", \"function\": {\"name\": \"ok\"}}, {\"type\": \"function\", \"function\": "
                 "{\"name\": \"f\", \"parameters\": %s}}]",
                 bad[i]);
        json_object *tools = json_tokener_parse(js);
        assert_non_null(tools);
        char *ebnf = NULL;
        api_error e = {0};
        assert_int_equal(toolcall_grammar(toolfmt_get(TOOLFMT_HERMES), tools, NULL, 1, 0, NULL, &ebnf, &e), -1);
        assert_null(ebnf);
        assert_int_equal(e.status, 400);
        assert_string_equal(e.param, "tools[1].function.parameters");
        /* the named tool alone compiles: only the tools in the grammar count */
        assert_int_equal(toolcall_grammar(toolfmt_get(TOOLFMT_HERMES), tools, "ok", 1, 0, NULL, &ebnf, &e), 0);
        free(ebnf);
        json_object_put(tools);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),   cmocka_unit_test(test_hermes3),           cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_mistral), cmocka_unit_test(test_json_and_lead_skip), cmocka_unit_test(test_bad_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
