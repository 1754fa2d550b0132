/* Tool-call format detection on real chat templates: Qwen3 (../shared),
 * Hermes 3 tool_use, Llama 3.1 and Mistral v0.3 (tests/template/templates),
 * the demo model (Hermes/Qwen3 layout, trained on it), and templates without
 * tools (Gemma 3, the Llama 3 base template). The expected formats are the ones those models' documentation
 * gives; the literal strings are checked against what the templates render
 * for a call, so a wrong table entry fails here too. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "server/toolfmt.h"
#include "test_util.h"

static void detect_dir(const char *dir, toolfmt_probe *p, const tern_tokenizer *tok)
{
    tern_chat_template ct;
    tern_err err;
    int rc = tern_chat_template_load(dir, &ct, &err);
    if (rc)
        fail_msg("%s: %s", dir, err.msg);
    assert_int_equal(toolfmt_detect(&ct, tok, p, &err), 0);
    tern_chat_template_free(&ct);
}

/* The text a template renders for one call of f with arguments {"a": 1},
 * built from the format: begin call_open {"name": "f", "<args>": {"a": 1}} call_close end. */
static void render_one(const tern_chat_template *ct, char **out)
{
    const char *rq_json =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"\", "
        "\"tool_calls\": [{\"id\": \"abcdefghi\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"arguments\": {\"a\": 1}}}]}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", "
        "\"description\": \"d\", \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": "
        "\"integer\", \"description\": \"x\"}}}}}]}";
    json_object *rq = json_tokener_parse(rq_json);
    assert_non_null(rq);
    size_t len;
    tern_err err;
    *out = tern_chat_template_apply(ct, rq, NULL, &len, &err);
    if (!*out)
        fail_msg("render: %s", err.msg);
    json_object_put(rq);
}

static void check_literal(const char *dir, const toolfmt *f)
{
    tern_chat_template ct;
    tern_err err;
    assert_int_equal(tern_chat_template_load(dir, &ct, &err), 0);
    char *text;
    render_one(&ct, &text);
    char want[256];
    snprintf(want, sizeof want, "%s%s{\"name\": \"f\", \"%s\": {\"a\": 1}", f->begin, f->call_open, f->args_key);
    if (!strstr(text, want))
        fail_msg("%s: '%s' not in the rendered call:\n%s", dir, want, text);
    /* what follows the arguments' object: "}" then close and end */
    snprintf(want, sizeof want, "{\"a\": 1}}%s%s", f->call_close, f->end);
    if (f->kind != TOOLFMT_MISTRAL && !strstr(text, want)) /* Mistral writes the id inside the object */
        fail_msg("%s: '%s' not in the rendered call:\n%s", dir, want, text);
    free(text);
    tern_chat_template_free(&ct);
}

static void test_qwen3(void **state)
{
    (void)state;
    tern_err err;
    tern_tokenizer *tok = tokenizer_load(shared_path("tokenizers/qwen3"), &err);
    assert_non_null(tok);
    toolfmt_probe p;
    detect_dir(shared_path("tokenizers/qwen3"), &p, tok);
    assert_int_equal(p.fmt->kind, TOOLFMT_HERMES);
    assert_true(p.renders_tools);
    assert_true(p.renders_calls);
    check_literal(shared_path("tokenizers/qwen3"), p.fmt);
    /* <tool_call> is an ordinary (non-special) added token in Qwen3: a text trigger */
    assert_true(tokenizer_token_id(tok, "<tool_call>") >= 0);
    assert_int_equal(toolfmt_trigger_token(tok, "<tool_call>"), -1);
    tokenizer_free(tok);
}

static void test_hermes3(void **state)
{
    (void)state;
    toolfmt_probe p;
    detect_dir(repo_path("tests/template/templates/hermes3"), &p, NULL);
    assert_int_equal(p.fmt->kind, TOOLFMT_HERMES);
    assert_true(p.renders_tools);
    check_literal(repo_path("tests/template/templates/hermes3"), p.fmt);
}

/* models/tern-demo writes calls in the Hermes/Qwen3 layout; its vocabulary
 * has no <tool_call> token, so the trigger is text. */
static void test_demo(void **state)
{
    (void)state;
    tern_err err;
    tern_tokenizer *tok = tokenizer_load(repo_path("models/tern-demo"), &err);
    assert_non_null(tok);
    toolfmt_probe p;
    detect_dir(repo_path("models/tern-demo"), &p, tok);
    assert_int_equal(p.fmt->kind, TOOLFMT_HERMES);
    assert_true(p.renders_tools);
    assert_true(p.renders_calls);
    check_literal(repo_path("models/tern-demo"), p.fmt);
    assert_int_equal(toolfmt_trigger_token(tok, "<tool_call>"), -1);
    tokenizer_free(tok);
}

static void test_llama31(void **state)
{
    (void)state;
    tern_err err;
    tern_tokenizer *tok = tokenizer_load(shared_path("tokenizers/llama3"), &err);
    assert_non_null(tok);
    toolfmt_probe p;
    detect_dir(repo_path("tests/template/templates/llama31"), &p, tok);
    assert_int_equal(p.fmt->kind, TOOLFMT_LLAMA3);
    assert_true(p.renders_tools);
    assert_string_equal(p.fmt->args_key, "parameters");
    assert_false(p.fmt->parallel);
    check_literal(repo_path("tests/template/templates/llama31"), p.fmt);
    /* a special token is matched by id; the shared vocabulary is Llama 3.0's,
     * which has no <|python_tag|> yet (3.1 made it of a reserved id) */
    assert_int_equal(toolfmt_trigger_token(tok, "<|eot_id|>"), 128009);
    assert_int_equal(toolfmt_trigger_token(tok, "<|python_tag|>"), -1);
    assert_int_equal(toolfmt_trigger_token(tok, "{\"name\""), -1);
    tokenizer_free(tok);
}

static void test_mistral(void **state)
{
    (void)state;
    toolfmt_probe p;
    detect_dir(repo_path("tests/template/templates/mistral"), &p, NULL);
    assert_int_equal(p.fmt->kind, TOOLFMT_MISTRAL);
    assert_true(p.renders_tools);
    assert_true(p.fmt->parallel);
    check_literal(repo_path("tests/template/templates/mistral"), p.fmt);
}

static void test_no_tools(void **state)
{
    (void)state;
    const char *dirs[] = {shared_path("tokenizers/gemma3"), shared_path("tokenizers/llama3")};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        toolfmt_probe p;
        detect_dir(dirs[i], &p, NULL);
        if (p.fmt->kind != TOOLFMT_NONE || p.renders_tools)
            fail_msg("%s: detected %s (renders_tools %d)", dirs[i], p.fmt->name, p.renders_tools);
    }
}

/* A template that lists tools but writes calls in no known way: generic
 * JSON, unless the vocabulary has a format's token. */
static void test_generic(void **state)
{
    (void)state;
    const char *src = "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}"
                      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
    tern_chat_template ct;
    tern_err err;
    assert_int_equal(tern_chat_template_from_source(src, strlen(src), NULL, &ct, &err), 0);
    toolfmt_probe p;
    assert_int_equal(toolfmt_detect(&ct, NULL, &p, &err), 0);
    assert_true(p.renders_tools);
    assert_false(p.renders_calls);
    assert_int_equal(p.fmt->kind, TOOLFMT_JSON);
    tern_tokenizer *tok = tokenizer_load(shared_path("tokenizers/qwen3"), &err);
    assert_non_null(tok);
    assert_int_equal(toolfmt_detect(&ct, tok, &p, &err), 0);
    assert_int_equal(p.fmt->kind, TOOLFMT_HERMES);
    tokenizer_free(tok);
    tern_chat_template_free(&ct);
}

static void test_names(void **state)
{
    (void)state;
    assert_int_equal(toolfmt_by_name("hermes")->kind, TOOLFMT_HERMES);
    assert_int_equal(toolfmt_by_name("qwen")->kind, TOOLFMT_HERMES);
    assert_int_equal(toolfmt_by_name("llama3_json")->kind, TOOLFMT_LLAMA3);
    assert_int_equal(toolfmt_by_name("llama3")->kind, TOOLFMT_LLAMA3);
    assert_int_equal(toolfmt_by_name("mistral")->kind, TOOLFMT_MISTRAL);
    assert_int_equal(toolfmt_by_name("json")->kind, TOOLFMT_JSON);
    assert_int_equal(toolfmt_by_name("none")->kind, TOOLFMT_NONE);
    assert_null(toolfmt_by_name("pythonic"));
    assert_null(toolfmt_by_name(NULL));
    for (int k = 0; k < TOOLFMT_N; k++) {
        const toolfmt *f = toolfmt_get((toolfmt_kind)k);
        assert_int_equal(f->kind, k);
        assert_ptr_equal(toolfmt_by_name(f->name), f);
        if (k != TOOLFMT_NONE)
            assert_non_null(f->triggers[0]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),   cmocka_unit_test(test_hermes3), cmocka_unit_test(test_demo), cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_mistral), cmocka_unit_test(test_no_tools), cmocka_unit_test(test_generic),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
