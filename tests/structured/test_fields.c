/* Request fields -> spec (src/server/api_structured.c, then
 * structured_spec_key in structured.c): precedence, both structured_outputs forms, key
 * normalization (object key order does not matter, options do), and the
 * 400s for fields of the wrong shape. No model needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/json.h"
#include "server/structured.h"

/* The key for body, or NULL; *status gets the error status (0 = ok). */
static char *key_of(const char *body, int *status)
{
    tern_err je;
    json_object *root = tern_json_parse(body, strlen(body), &je);
    assert_non_null(root);
    api_request q;
    memset(&q, 0, sizeof q);
    q.kind = API_CHAT;
    q.root = root;
    api_error e;
    memset(&e, 0, sizeof e);
    char *k = NULL;
    *status = api_structured_parse(&q, &e) || structured_spec_key(&q, &k, &e) ? e.status : 0;
    if (*status)
        assert_true(e.msg[0] && e.param[0]);
    api_structured_free(&q.structured_spec);
    json_object_put(root);
    return k;
}

static void expect_kind(const char *body, const char *kind_prefix)
{
    int st;
    char *k = key_of(body, &st);
    assert_int_equal(st, 0);
    assert_non_null(k);
    if (strncmp(k, kind_prefix, strlen(kind_prefix)) != 0)
        fail_msg("%s: key '%s' does not start with '%s'", body, k, kind_prefix);
    free(k);
}

static void test_precedence(void **state)
{
    (void)state;
    const char *all = "{\"guided_choice\":[\"c\"],\"guided_regex\":\"r\",\"structured_outputs\":{\"regex\":\"o\"},"
                      "\"response_format\":{\"type\":\"json_object\"},\"guided_json\":{\"type\":\"integer\"},"
                      "\"guided_grammar\":\"root ::= \\\"g\\\"\"}";
    expect_kind(all, "grammar|");
    expect_kind("{\"guided_choice\":[\"c\"],\"guided_regex\":\"r\",\"structured_outputs\":{\"regex\":\"o\"},"
                "\"response_format\":{\"type\":\"json_object\"},\"guided_json\":{\"type\":\"integer\"}}",
                "json_schema|");
    expect_kind("{\"guided_choice\":[\"c\"],\"guided_regex\":\"r\",\"structured_outputs\":{\"regex\":\"o\"},"
                "\"response_format\":{\"type\":\"json_object\"}}",
                "json_object|");
    expect_kind("{\"guided_choice\":[\"c\"],\"guided_regex\":\"r\",\"structured_outputs\":{\"regex\":\"o\"}}",
                "regex|ws=1|cap=20|strict=1|o");
    expect_kind("{\"guided_choice\":[\"c\"],\"guided_regex\":\"r\"}", "regex|ws=1|cap=20|strict=1|r");
    expect_kind("{\"guided_choice\":[\"c\"]}", "choice|");
    /* response_format's json_schema wins over guided_json, in any order */
    expect_kind("{\"guided_json\":{\"type\":\"integer\"},\"response_format\":{\"type\":\"json_schema\","
                "\"json_schema\":{\"name\":\"n\",\"schema\":{\"const\":1}}}}",
                "json_schema|ws=1|cap=20|strict=1|{\"const\":1}");
    expect_kind("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"schema\":"
                "{\"const\":1}}},\"guided_json\":{\"type\":\"integer\"}}",
                "json_schema|ws=1|cap=20|strict=1|{\"const\":1}");
    int st;
    assert_null(key_of("{\"response_format\":{\"type\":\"text\"}}", &st));
    assert_int_equal(st, 0);
    assert_null(key_of("{\"max_tokens\":3}", &st));
    assert_int_equal(st, 0);
}

static void test_structured_outputs_forms(void **state)
{
    (void)state;
    expect_kind("{\"structured_outputs\":{\"type\":\"object\"}}", "json_schema|ws=1|cap=20|strict=1|{\"type\":\"object\"}");
    expect_kind("{\"structured_outputs\":{\"json\":\"{\\\"type\\\":\\\"array\\\"}\",\"disable_any_whitespace\":true}}",
                "json_schema|ws=0|cap=20|strict=1|{\"type\":\"array\"}");
    expect_kind("{\"structured_outputs\":{\"choice\":[\"a\"],\"grammar\":\"root ::= \\\"x\\\"\"}}", "grammar|");
    expect_kind("{\"structured_outputs\":{\"json_object\":true,\"regex\":\"a\"}}", "json_object|");
    expect_kind("{\"structured_outputs\":{\"choice\":[\"a\",\"b\"]}}", "choice|ws=1|cap=20|strict=1|[\"a\",\"b\"]");
}

static void test_key_normalization(void **state)
{
    (void)state;
    int st;
    char *a = key_of("{\"guided_json\":{\"type\":\"object\",\"properties\":{\"y\":{},\"x\":{\"type\":\"string\"}}}}", &st);
    char *b = key_of("{\"guided_json\":{\"properties\":{\"x\":{\"type\":\"string\"},\"y\":{}},\"type\":\"object\"}}", &st);
    char *c = key_of("{\"guided_json\":\"{\\\"properties\\\":{\\\"x\\\":{\\\"type\\\":\\\"string\\\"},\\\"y\\\":{}},"
                     "\\\"type\\\":\\\"object\\\"}\"}",
                     &st);
    assert_non_null(a);
    assert_string_equal(a, b); /* key order */
    assert_string_equal(a, c); /* object or JSON text */
    char *d = key_of("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"any_whitespace\":"
                     "false,\"schema\":{\"type\":\"object\",\"properties\":{\"y\":{},\"x\":{\"type\":\"string\"}}}}}}",
                     &st);
    char *e = key_of("{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\",\"strict\":false,"
                     "\"max_whitespace\":2,\"schema\":{\"type\":\"object\",\"properties\":{\"y\":{},\"x\":{\"type\":"
                     "\"string\"}}}}}}",
                     &st);
    assert_non_null(d);
    assert_non_null(e);
    assert_string_not_equal(a, d); /* whitespace option */
    assert_string_not_equal(a, e);
    assert_non_null(strstr(e, "cap=2|strict=0|"));
    free(a), free(b), free(c), free(d), free(e);
}

static void test_bad_shapes(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "{\"response_format\":{\"type\":\"yaml\"}}",
        "{\"response_format\":{\"type\":\"json_schema\"}}",
        "{\"response_format\":{\"type\":\"json_object\",\"json_schema\":{}}}",
        "{\"response_format\":5}",
        "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"strict\":\"yes\"}}}",
        "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"max_whitespace\":-1}}}",
        "{\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"color\":1}}}",
        "{\"guided_json\":5}",
        "{\"guided_json\":\"{not json\"}",
        "{\"guided_grammar\":\"\"}",
        "{\"guided_grammar\":[1]}",
        "{\"guided_regex\":7}",
        "{\"guided_choice\":[]}",
        "{\"guided_choice\":[\"a\",1]}",
        "{\"guided_choice\":\"a\"}",
        "{\"structured_outputs\":5}",
        "{\"structured_outputs\":{\"regex\":\"a\",\"whitespace_pattern\":\" \"}}",
        "{\"structured_outputs\":{\"json_object\":1}}",
        /* a lower-precedence field of the wrong shape is still an error */
        "{\"guided_grammar\":\"root ::= \\\"a\\\"\",\"guided_choice\":[]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st;
        char *k = key_of(bad[i], &st);
        if (st != 400)
            fail_msg("%s: status %d, want 400", bad[i], st);
        assert_null(k);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_structured_outputs_forms),
        cmocka_unit_test(test_key_normalization),
        cmocka_unit_test(test_bad_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
