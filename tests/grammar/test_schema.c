/* Unit tests of the JSON Schema, choice and built-in JSON front ends,
 * checked through the grammar core's byte-level acceptance against
 * independent references: arithmetic for numeric bounds and multipleOf,
 * codepoint counts for string lengths, strcmp for choices, RFC 8259 for
 * the built-in JSON grammar. Error paths: unsupported keywords name
 * the keyword, malformed schemas, time and size bounds. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "base/strbuf.h"
#include "grammar/frontend.h"
#include "grammar/grammar.h"
#include "grammar/schema.h"

static grammar *from_ebnf(const char *ebnf)
{
    tern_err err;
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
    if (!g)
        fail_msg("core rejected: %s\n%s", err.msg, ebnf);
    return g;
}

static grammar *schema_grammar(const char *schema_text, const grammar_schema_opts *o)
{
    json_object *s = json_tokener_parse(schema_text);
    assert_non_null(s);
    char *ebnf = NULL;
    tern_err err;
    int rc = grammar_schema_to_ebnf(s, o, &ebnf, &err);
    json_object_put(s);
    if (rc)
        fail_msg("schema %s: %s", schema_text, err.msg);
    grammar *g = from_ebnf(ebnf);
    free(ebnf);
    return g;
}

static int accepts(const grammar *g, const char *text)
{
    int r = grammar_check_text(g, text, strlen(text));
    assert_true(r >= 0);
    return r;
}

static int schema_error(const char *schema_text, const grammar_schema_opts *o, char *msg, size_t cap)
{
    json_object *s = json_tokener_parse(schema_text);
    assert_non_null(s);
    char *ebnf = (char *)1;
    tern_err err = {0};
    int rc = grammar_schema_to_ebnf(s, o, &ebnf, &err);
    json_object_put(s);
    if (rc == 0) {
        free(ebnf);
        return 0;
    }
    assert_null(ebnf);
    if (msg)
        snprintf(msg, cap, "%s", err.msg);
    return rc;
}

static void test_integer_ranges(void **state)
{
    (void)state;
    tern_rng rng;
    tern_rng_seed(&rng, 7, 1);
    for (int it = 0; it < 60; it++) {
        long lo = (long)(tern_rng_u32(&rng) % 4001) - 2000;
        long hi = lo + (long)(tern_rng_u32(&rng) % 3000);
        int ex_lo = (int)(tern_rng_u32(&rng) & 1), ex_hi = (int)(tern_rng_u32(&rng) & 1);
        int has_lo = it % 5 != 0, has_hi = it % 7 != 0;
        int integer = it % 2 == 0;
        char sch[256];
        int n = snprintf(sch, sizeof sch, "{\"type\":\"%s\"", integer ? "integer" : "number");
        if (has_lo)
            n += snprintf(sch + n, sizeof sch - n, ",\"%s\":%ld", ex_lo ? "exclusiveMinimum" : "minimum", lo);
        if (has_hi)
            n += snprintf(sch + n, sizeof sch - n, ",\"%s\":%ld", ex_hi ? "exclusiveMaximum" : "maximum", hi);
        snprintf(sch + n, sizeof sch - n, "}");
        if (has_lo && has_hi && (hi < lo || (hi == lo && (ex_lo || ex_hi))))
            continue;
        grammar *g = schema_grammar(sch, NULL);
        for (int k = 0; k < 200; k++) {
            double x = (double)((long)(tern_rng_u32(&rng) % 8001) - 4000);
            if (k < 8) /* the bounds themselves and their neighbours */
                x = (double)((k & 1 ? hi : lo) + (k >> 1) - 2);
            char txt[64];
            if (!integer && (k % 3 == 1))
                x += 0.5, snprintf(txt, sizeof txt, "%.1f", x);
            else if (!integer && k % 3 == 2)
                snprintf(txt, sizeof txt, "%.0f.0", x);
            else
                snprintf(txt, sizeof txt, "%.0f", x);
            int want = (!has_lo || (ex_lo ? x > lo : x >= lo)) && (!has_hi || (ex_hi ? x < hi : x <= hi));
            if (accepts(g, txt) != want)
                fail_msg("%s on %s: want %d", sch, txt, want);
        }
        grammar_free(g);
    }
}

/* decimal bounds on number: values and bounds are multiples of 1/1000,
 * compared exactly as integers */
static void test_decimal_bounds(void **state)
{
    (void)state;
    tern_rng rng;
    tern_rng_seed(&rng, 5, 1);
    for (int it = 0; it < 60; it++) {
        long lo = (long)(tern_rng_u32(&rng) % 8001) - 4000; /* thousandths */
        long hi = lo + (long)(tern_rng_u32(&rng) % 5000);
        if (it % 3 == 0)
            lo = (lo / 100) * 100, hi = (hi / 10) * 10;
        int ex_lo = (int)(tern_rng_u32(&rng) & 1), ex_hi = (int)(tern_rng_u32(&rng) & 1);
        int has_lo = it % 5 != 1, has_hi = it % 7 != 1;
        char sch[256];
        int n = snprintf(sch, sizeof sch, "{\"type\":\"number\"");
        if (has_lo)
            n += snprintf(sch + n, sizeof sch - n, ",\"%s\":%s%ld.%03ld", ex_lo ? "exclusiveMinimum" : "minimum",
                          lo < 0 ? "-" : "", labs(lo) / 1000, labs(lo) % 1000);
        if (has_hi)
            n += snprintf(sch + n, sizeof sch - n, ",\"%s\":%s%ld.%03ld", ex_hi ? "exclusiveMaximum" : "maximum",
                          hi < 0 ? "-" : "", labs(hi) / 1000, labs(hi) % 1000);
        snprintf(sch + n, sizeof sch - n, "}");
        if (has_lo && has_hi && (hi < lo || (hi == lo && (ex_lo || ex_hi))))
            continue;
        grammar *g = schema_grammar(sch, NULL);
        for (int k = 0; k < 300; k++) {
            long x = (long)(tern_rng_u32(&rng) % 12001) - 6000;
            if (k < 12)
                x = (k & 1 ? hi : lo) + (k >> 1) - 3;
            char txt[64];
            int digits = k % 4; /* 0..3 fraction digits written */
            long ax = labs(x);
            if (digits == 0 && ax % 1000)
                digits = 3;
            if (digits == 0)
                snprintf(txt, sizeof txt, "%s%ld", x < 0 ? "-" : "", ax / 1000);
            else if (digits == 3 || ax % 10 || (digits == 1 && ax % 100))
                snprintf(txt, sizeof txt, "%s%ld.%03ld", x < 0 ? "-" : "", ax / 1000, ax % 1000);
            else if (digits == 2)
                snprintf(txt, sizeof txt, "%s%ld.%02ld", x < 0 ? "-" : "", ax / 1000, (ax % 1000) / 10);
            else
                snprintf(txt, sizeof txt, "%s%ld.%01ld0", x < 0 ? "-" : "", ax / 1000, (ax % 1000) / 100);
            int want = (!has_lo || (ex_lo ? x > lo : x >= lo)) && (!has_hi || (ex_hi ? x < hi : x <= hi));
            if (accepts(g, txt) != want)
                fail_msg("%s on %s: want %d", sch, txt, want);
        }
        grammar_free(g);
    }
}

static void test_multiple_of(void **state)
{
    (void)state;
    static const struct { const char *m; long p; int q; } ms[] = {
        {"7", 7, 0}, {"0.25", 25, 2}, {"1.5", 15, 1}, {"0.01", 1, 2}, {"12", 12, 0},
    };
    tern_rng rng;
    tern_rng_seed(&rng, 11, 1);
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        for (int integer = 0; integer < 2; integer++) {
            char sch[128];
            snprintf(sch, sizeof sch, "{\"type\":\"%s\",\"multipleOf\":%s}", integer ? "integer" : "number", ms[i].m);
            grammar *g = schema_grammar(sch, NULL);
            for (int k = 0; k < 300; k++) {
                /* value = v / 1000 exactly */
                long v = (long)(tern_rng_u32(&rng) % 200001) - 100000;
                if (k < 100)
                    v = (v / 250) * 250;
                char txt[64];
                int frac = (int)(labs(v) % 1000);
                snprintf(txt, sizeof txt, "%s%ld.%03d", v < 0 ? "-" : "", labs(v) / 1000, frac);
                if (integer && frac == 0)
                    snprintf(txt, sizeof txt, "%ld", v / 1000);
                /* exact: v/1000 multiple of p/10^q  <=>  v*10^q divisible by p*1000 */
                long long num = (long long)v;
                for (int z = 0; z < ms[i].q; z++)
                    num *= 10;
                int want = num % ((long long)ms[i].p * 1000) == 0 && (!integer || frac == 0);
                if (accepts(g, txt) != want)
                    fail_msg("%s on %s: want %d", sch, txt, want);
            }
            grammar_free(g);
        }
    }
}

static void test_string_lengths(void **state)
{
    (void)state;
    /* codepoints: ASCII, escapes, a 2-byte char written raw and escaped,
     * an astral char as a surrogate pair (one codepoint) */
    static const struct { const char *text; int n; } s[] = {
        {"\"\"", 0}, {"\"a\"", 1}, {"\"ab\"", 2}, {"\"\\n\"", 1}, {"\"\\u00e9\"", 1},
        {"\"\xc3\xa9\"", 1}, {"\"\\ud83d\\ude00\"", 1}, {"\"\xf0\x9f\x98\x80x\"", 2},
        {"\"a\\\"b\"", 3}, {"\"abc\"", 3}, {"\"\\u0041\\u0042\\u0043\\u0044\"", 4},
    };
    for (int mn = 0; mn <= 3; mn++) {
        for (int mx = mn; mx <= 4; mx++) {
            char sch[128];
            snprintf(sch, sizeof sch, "{\"type\":\"string\",\"minLength\":%d,\"maxLength\":%d}", mn, mx);
            grammar *g = schema_grammar(sch, NULL);
            for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
                if (accepts(g, s[i].text) != (s[i].n >= mn && s[i].n <= mx))
                    fail_msg("%s on %s", sch, s[i].text);
            grammar_free(g);
        }
    }
    grammar *g = schema_grammar("{\"type\":\"string\"}", NULL);
    assert_false(accepts(g, "\"a\nb\"")); /* raw control characters */
    assert_false(accepts(g, "\"\\x41\""));
    assert_false(accepts(g, "\"\\ud83d\"")); /* lone surrogate */
    assert_false(accepts(g, "\"abc"));
    assert_true(accepts(g, "\"\\/\\b\\f\\r\\t\""));
    grammar_free(g);
}

/* Arrays in strict mode: a prefix closes the array (draft 2020-12
 * prefixItems, draft 7 items arrays), unless items / additionalItems say
 * otherwise. (The draft-7 form once leaked its "false" schema: ASan.) */
static void test_strict_prefix_arrays(void **state)
{
    (void)state;
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.any_whitespace = 0;
    static const struct { int draft; const char *schema; int more; } cases[] = {
        {2020, "{\"prefixItems\":[{\"type\":\"integer\"}]}", 0},
        {7, "{\"items\":[{\"type\":\"integer\"}]}", 0},
        {7, "{\"items\":[{\"type\":\"integer\"}],\"additionalItems\":{\"type\":\"string\"}}", 1},
        {2020, "{\"prefixItems\":[{\"type\":\"integer\"}],\"items\":{\"type\":\"string\"}}", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        o.draft = cases[i].draft;
        grammar *g = schema_grammar(cases[i].schema, &o);
        assert_true(accepts(g, "[]"));
        assert_true(accepts(g, "[1]"));
        assert_false(accepts(g, "[\"a\"]"));
        if (accepts(g, "[1,\"a\"]") != cases[i].more)
            fail_msg("%s (draft %d): [1,\"a\"]", cases[i].schema, cases[i].draft);
        assert_false(accepts(g, "[1,2]"));
        grammar_free(g);
    }
}

static void test_objects_and_whitespace(void **state)
{
    (void)state;
    const char *sch = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},"
                      "\"b\":{\"type\":\"string\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"b\"]}";
    grammar *g = schema_grammar(sch, NULL); /* strict by default */
    assert_true(accepts(g, "{\"b\": \"x\"}"));
    assert_true(accepts(g, "{\"a\": 1, \"b\": \"x\", \"c\": true}"));
    assert_true(accepts(g, "{ \"a\" :1,\"b\":\"x\" }"));
    assert_false(accepts(g, "{}"));                             /* b required */
    assert_false(accepts(g, "{\"b\": \"x\", \"d\": 1}"));       /* strict */
    assert_false(accepts(g, "{\"b\": \"x\", \"b\": \"y\"}"));
    assert_false(accepts(g, "{\"a\": \"1\", \"b\": \"x\"}"));
    char txt[128];
    snprintf(txt, sizeof txt, "{\"b\":%*s\"x\"}", 20, "");
    assert_true(accepts(g, txt));
    snprintf(txt, sizeof txt, "{\"b\":%*s\"x\"}", 21, ""); /* cap: 20 */
    assert_false(accepts(g, txt));
    grammar_free(g);
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.strict = 0;
    g = schema_grammar(sch, &o);
    assert_true(accepts(g, "{\"b\": \"x\", \"d\": [1, {}]}"));
    assert_false(accepts(g, "{\"b\": \"x\", \"a\": \"no\"}")); /* listed names keep their schema */
    assert_false(accepts(g, "{\"b\": \"x\", \"\\u0061\": \"no\"}"));
    grammar_free(g);
    grammar_schema_opts_init(&o);
    o.any_whitespace = 0;
    g = schema_grammar(sch, &o);
    assert_true(accepts(g, "{\"a\":1,\"b\":\"x\"}"));
    assert_false(accepts(g, "{\"a\": 1,\"b\":\"x\"}"));
    grammar_free(g);
    /* recursion through $ref */
    g = schema_grammar("{\"$defs\":{\"t\":{\"type\":\"object\",\"properties\":{\"kids\":{\"type\":\"array\","
                       "\"items\":{\"$ref\":\"#/$defs/t\"}}}}},\"$ref\":\"#/$defs/t\"}", NULL);
    assert_true(accepts(g, "{\"kids\": [{}, {\"kids\": [{\"kids\": []}]}]}"));
    assert_false(accepts(g, "{\"kids\": [1]}"));
    grammar_free(g);
}

static void test_choice_and_builtin(void **state)
{
    (void)state;
    json_object *arr = json_tokener_parse("[\"yes\", \"no\", \"a\\\"b\\nc\", \"\", \"\\u00e9\\u0001\"]");
    char *ebnf = NULL;
    tern_err err;
    assert_int_equal(grammar_choice_to_ebnf(arr, &ebnf, &err), 0);
    grammar *g = from_ebnf(ebnf);
    free(ebnf);
    static const char *probe[] = {"yes", "no", "a\"b\nc", "", "\xc3\xa9\x01", "ye", "yess", "a\"b", "No"};
    for (size_t i = 0; i < sizeof probe / sizeof probe[0]; i++) {
        int want = 0;
        for (size_t k = 0; k < json_object_array_length(arr); k++)
            want |= !strcmp(probe[i], json_object_get_string(json_object_array_get_idx(arr, k)));
        assert_int_equal(accepts(g, probe[i]), want);
    }
    grammar_free(g);
    json_object_put(arr);
    arr = json_tokener_parse("[\"x\", 3]");
    assert_int_equal(grammar_choice_to_ebnf(arr, &ebnf, &err), TERN_EINVAL);
    json_object_put(arr);
    arr = json_tokener_parse("[]");
    assert_int_equal(grammar_choice_to_ebnf(arr, &ebnf, &err), TERN_EINVAL);
    json_object_put(arr);

    /* built-in JSON: validity per RFC 8259 (json-c's parser is too lax
     * on numbers to serve as the reference here) */
    static const struct { const char *t; int valid, object; } texts[] = {
        {"{}", 1, 1}, {"[]", 1, 0}, {"0", 1, 0}, {"-0.5e+3", 1, 0}, {"\"s\\u00e9\"", 1, 0},
        {"null", 1, 0}, {"true", 1, 0}, {"{\"a\": [1, 2, {\"b\": null}]}", 1, 1},
        {"[1,]", 0, 0}, {"{\"a\" 1}", 0, 0}, {"01", 0, 0}, {"1.", 0, 0}, {".5", 0, 0},
        {"\"\\x\"", 0, 0}, {"{\"a\":1,}", 0, 0}, {"tru", 0, 0}, {"[", 0, 0}, {"\"a\nb\"", 0, 0},
        {"-", 0, 0}, {"[1e5, -0, 2E-3]", 1, 0}, {"{\"\": \"\"}", 1, 1}, {"{ \"k\" : { } }", 1, 1},
    };
    char *any = grammar_json_builtin_ebnf(GRAMMAR_JSON_ANY_VALUE, 1, 20);
    char *obj = grammar_json_builtin_ebnf(GRAMMAR_JSON_OBJECT, 1, 20);
    assert_non_null(any);
    assert_non_null(obj);
    grammar *ga = from_ebnf(any), *go = from_ebnf(obj);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        if (accepts(ga, texts[i].t) != texts[i].valid)
            fail_msg("builtin JSON on %s: want %d", texts[i].t, texts[i].valid);
        assert_int_equal(accepts(go, texts[i].t), texts[i].valid && texts[i].object);
    }
    grammar_free(ga);
    grammar_free(go);
    free(any);
    free(obj);
    assert_null(grammar_json_builtin_ebnf((enum grammar_json_kind)9, 1, 20));
}

static void test_errors_and_bounds(void **state)
{
    (void)state;
    char msg[TERN_ERR_MSG_MAX];
    /* unknown keywords are annotations (JSON Schema's rule), but a case
     * variant of an assertion keyword is a typo and an error */
    assert_int_equal(schema_error("{\"type\":\"string\",\"frobnicate\":1}", NULL, msg, sizeof msg), 0);
    assert_int_equal(schema_error("{\"type\":\"string\",\"maxlength\":1}", NULL, msg, sizeof msg),
                     TERN_EUNSUPPORTED);
    assert_non_null(strstr(msg, "maxlength"));
    assert_int_equal(schema_error("{\"$dynamicRef\":\"#x\"}", NULL, msg, sizeof msg), TERN_EUNSUPPORTED);
    assert_non_null(strstr(msg, "$dynamicRef"));
    assert_int_equal(schema_error("{\"type\":\"string\",\"format\":\"idn-hostname\"}", NULL, msg, sizeof msg),
                     TERN_EUNSUPPORTED);
    assert_non_null(strstr(msg, "idn-hostname"));
    /* uniqueItems over any value: the matcher checks it at run time */
    assert_int_equal(schema_error("{\"uniqueItems\":true}", NULL, msg, sizeof msg), 0);
    assert_int_equal(schema_error("{\"uniqueItems\":1}", NULL, msg, sizeof msg), TERN_EINVAL);
    assert_int_equal(schema_error("{\"oneOf\":[{\"multipleOf\":2},{\"minimum\":2}]}", NULL, msg, sizeof msg),
                     TERN_EUNSUPPORTED); /* NOT multipleOf 2 */
    assert_non_null(strstr(msg, "multipleOf"));
    assert_int_equal(schema_error("{\"$ref\":\"http://example.com/x.json\"}", NULL, NULL, 0), TERN_EUNSUPPORTED);
    assert_int_equal(schema_error("{\"$ref\":\"#/$defs/missing\"}", NULL, NULL, 0), TERN_EINVAL);
    assert_int_equal(schema_error("{\"type\":\"strin\"}", NULL, NULL, 0), TERN_EINVAL);
    assert_int_equal(schema_error("3", NULL, NULL, 0), TERN_EINVAL);
    assert_int_equal(schema_error("false", NULL, msg, sizeof msg), TERN_EINVAL);
    assert_int_equal(schema_error("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", NULL, NULL, 0),
                     TERN_EUNSUPPORTED); /* a cycle that consumes nothing */
    assert_int_equal(schema_error("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", NULL, NULL, 0),
                     TERN_EUNSUPPORTED);
    /* size bound */
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.max_bytes = 256;
    assert_int_equal(schema_error("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"},"
                                  "\"b\":{\"type\":\"integer\",\"minimum\":17,\"maximum\":99999}}}", &o, NULL, 0),
                     TERN_EFULL);
    /* a schema whose expansion explodes ends in a bound, quickly */
    char big[8192];
    size_t n = 0;
    n += (size_t)snprintf(big + n, sizeof big - n, "{\"allOf\":[");
    for (int i = 0; i < 12; i++)
        n += (size_t)snprintf(big + n, sizeof big - n, "%s{\"anyOf\":[{\"minimum\":%d},{\"maximum\":%d},"
                              "{\"type\":\"string\",\"minLength\":%d}]}", i ? "," : "", i, i, i);
    snprintf(big + n, sizeof big - n, "]}");
    grammar_schema_opts_init(&o);
    o.max_ms = 300;
    int rc = schema_error(big, &o, msg, sizeof msg);
    assert_true(rc == TERN_EUNSUPPORTED || rc == TERN_ETIMEOUT || rc == TERN_EFULL);
}

/* minProperties / maxProperties with listed properties: every object
 * made of listed properties (in order, any subset) and up to two extra
 * keys, checked against counting them. */
static void test_property_counts(void **state)
{
    (void)state;
    static const char *const names[] = {"a", "b", "c", "d"};
    tern_rng r;
    tern_rng_seed(&r, 5, 3);
    for (int t = 0; t < 40; t++) {
        int n = 1 + (int)(tern_rng_u32(&r) % 4), add = (int)(tern_rng_u32(&r) % 2);
        int req = (int)(tern_rng_u32(&r) % (1u << n)) & (int)(tern_rng_u32(&r) % (1u << n));
        long mnp = (long)(tern_rng_u32(&r) % 4), mxp = (long)(tern_rng_u32(&r) % 6) - 1;
        char schema[512], text[256];
        size_t k = (size_t)snprintf(schema, sizeof schema, "{\"type\":\"object\",\"properties\":{");
        for (int i = 0; i < n; i++)
            k += (size_t)snprintf(schema + k, sizeof schema - k, "%s\"%s\":{\"type\":\"integer\"}", i ? "," : "",
                                  names[i]);
        k += (size_t)snprintf(schema + k, sizeof schema - k, "},\"required\":[");
        for (int i = 0, f = 1; i < n; i++)
            if (req >> i & 1)
                k += (size_t)snprintf(schema + k, sizeof schema - k, "%s\"%s\"", f ? "" : ",", names[i]), f = 0;
        k += (size_t)snprintf(schema + k, sizeof schema - k, "],\"additionalProperties\":%s,\"minProperties\":%ld",
                              add ? "{\"type\":\"integer\"}" : "false", mnp);
        if (mxp >= 0)
            k += (size_t)snprintf(schema + k, sizeof schema - k, ",\"maxProperties\":%ld", mxp);
        snprintf(schema + k, sizeof schema - k, "}");
        int satisfiable = !(mxp >= 0 && mxp < mnp);
        grammar *g = NULL;
        if (satisfiable) {
            json_object *js = json_tokener_parse(schema);
            char *ebnf = NULL;
            tern_err err = {0};
            int rc = grammar_schema_to_ebnf(js, NULL, &ebnf, &err);
            json_object_put(js);
            if (rc == TERN_EINVAL)
                satisfiable = 0; /* e.g. more required than maxProperties: checked below */
            else if (rc)
                fail_msg("%s: %s", schema, err.msg);
            else
                g = from_ebnf(ebnf);
            free(ebnf);
        }
        int any_ok = 0;
        for (int sub = 0; sub < (1 << n); sub++) {
            for (int extra = 0; extra <= 2; extra++) {
                size_t m = (size_t)snprintf(text, sizeof text, "{");
                int cnt = 0;
                for (int i = 0; i < n; i++)
                    if (sub >> i & 1)
                        m += (size_t)snprintf(text + m, sizeof text - m, "%s\"%s\": %d", cnt++ ? ", " : "", names[i], i);
                for (int x = 0; x < extra; x++)
                    m += (size_t)snprintf(text + m, sizeof text - m, "%s\"x%d\": 7", cnt++ ? ", " : "", x);
                snprintf(text + m, sizeof text - m, "}");
                int want = (sub & req) == req && (add || !extra) && cnt >= mnp && (mxp < 0 || cnt <= mxp);
                any_ok |= want;
                if (!g)
                    continue;
                if (accepts(g, text) != want)
                    fail_msg("%s on %s: accepted %d, want %d", schema, text, !want, want);
            }
        }
        if (!g && any_ok)
            fail_msg("%s refused as unsatisfiable, yet has values", schema);
        grammar_free(g);
    }
}

/* CPU time: the bound is on the work, which a loaded machine's wall
 * clock would blur. */
static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* Big inputs compile within the compile limit (2 s) plus a second, in
 * every phase: a 30,000-value enum (once quadratic in value checks, and
 * past the parser's stack bound as a flat alternation), 5,000 properties
 * (quadratic rule lookup and liveness), a chain of 20,000 EBNF rules, a
 * huge minItems (a bound error, quickly). Membership is checked against
 * the value list itself. */
static void test_large_inputs(void **state)
{
    (void)state;
    enum { N_ENUM = 30000 };
    tern_rng r;
    tern_rng_seed(&r, 42, 7);
    tern_sbuf sb = {0};
    char **vals = calloc(N_ENUM, sizeof *vals);
    assert_non_null(vals);
    tern_sbuf_str(&sb, "{\"enum\":[");
    for (int i = 0; i < N_ENUM; i++) {
        char v[24];
        int n = 1 + (int)(tern_rng_u32(&r) % 12);
        for (int k = 0; k < n; k++)
            v[k] = (char)('a' + tern_rng_u32(&r) % 6);
        v[n] = 0;
        if (i % 1000 == 7)
            snprintf(v, sizeof v, "q\\\"%d", i); /* a quote: not a plain string */
        vals[i] = strdup(v);
        tern_sbuf_str(&sb, i ? ",\"" : "\"");
        tern_sbuf_str(&sb, v);
        tern_sbuf_str(&sb, "\"");
    }
    tern_sbuf_str(&sb, ",17,null]}");
    double t0 = now_ms();
    grammar *g = schema_grammar(sb.s, NULL);
    double dt = now_ms() - t0;
    print_message("enum of %d values: %.0f ms\n", N_ENUM, dt);
    assert_true(dt < 3000);
    char text[64];
    for (int i = 0; i < N_ENUM; i += 97) {
        /* vals[i] holds the JSON body (escapes included) */
        snprintf(text, sizeof text, "\"%s\"", vals[i]);
        if (accepts(g, text) != 1)
            fail_msg("member %s rejected", text);
    }
    assert_int_equal(accepts(g, "17"), 1);
    assert_int_equal(accepts(g, "null"), 1);
    assert_int_equal(accepts(g, "\"ag\""), 0);
    assert_int_equal(accepts(g, "18"), 0);
    for (int t = 0; t < 300; t++) {
        int n = 1 + (int)(tern_rng_u32(&r) % 13);
        char v[24];
        for (int k = 0; k < n; k++)
            v[k] = (char)('a' + tern_rng_u32(&r) % 6);
        v[n] = 0;
        int member = 0;
        for (int i = 0; i < N_ENUM && !member; i++)
            member = !strcmp(vals[i], v);
        snprintf(text, sizeof text, "\"%s\"", v);
        if (accepts(g, text) != member)
            fail_msg("%s: accepted %d, member %d", text, !member, member);
    }
    grammar_free(g);
    for (int i = 0; i < N_ENUM; i++)
        free(vals[i]);
    free(vals);

    /* 5,000 properties */
    sb.n = 0;
    tern_sbuf_str(&sb, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 5000; i++) {
        snprintf(text, sizeof text, "%s\"p%d\":{\"type\":\"integer\"}", i ? "," : "", i);
        tern_sbuf_str(&sb, text);
    }
    tern_sbuf_str(&sb, "}}");
    t0 = now_ms();
    g = schema_grammar(sb.s, NULL);
    dt = now_ms() - t0;
    print_message("5,000 properties: %.0f ms\n", dt);
    assert_true(dt < 3000);
    assert_int_equal(accepts(g, "{\"p3\": 1, \"p4999\": 2}"), 1);
    assert_int_equal(accepts(g, "{\"p3\": \"x\"}"), 0);
    grammar_free(g);

    /* a chain of 20,000 rules */
    sb.n = 0;
    tern_sbuf_str(&sb, "root ::= r0\n");
    for (int i = 0; i < 20000; i++) {
        snprintf(text, sizeof text, "r%d ::= \"a\" r%d | \"b\"\n", i, i + 1);
        tern_sbuf_str(&sb, text);
    }
    tern_sbuf_str(&sb, "r20000 ::= \"c\"\n");
    t0 = now_ms();
    g = from_ebnf(sb.s);
    dt = now_ms() - t0;
    print_message("20,000 rules: %.0f ms\n", dt);
    assert_true(dt < 3000);
    assert_int_equal(accepts(g, "aaab"), 1);
    assert_int_equal(accepts(g, "aaa"), 0);
    grammar_free(g);

    /* 20,000 nullable calls before the first byte (left-recursion check),
     * and a chain of 20,000 rules nullable only through the last one */
    for (int shape = 0; shape < 2; shape++) {
        sb.n = 0;
        tern_sbuf_str(&sb, shape ? "root ::= a0 \"x\"\n" : "root ::=");
        for (int i = 0; i < 20000 && !shape; i++) {
            snprintf(text, sizeof text, " a%d", i);
            tern_sbuf_str(&sb, text);
        }
        if (!shape)
            tern_sbuf_str(&sb, " \"x\"\n");
        for (int i = 0; i < 20000; i++) {
            if (shape)
                snprintf(text, sizeof text, "a%d ::= a%d | \"y\"\n", i, i + 1);
            else
                snprintf(text, sizeof text, "a%d ::= \"\" | \"y\"\n", i);
            tern_sbuf_str(&sb, text);
        }
        if (shape)
            tern_sbuf_str(&sb, "a20000 ::= \"\"\n");
        t0 = now_ms();
        g = from_ebnf(sb.s);
        dt = now_ms() - t0;
        print_message("20,000 nullable rules (%s): %.0f ms\n", shape ? "chain" : "prefix", dt);
        assert_true(dt < 3000);
        /* ("x" alone needs all 20,000 calls open at once: past the parser's
         * stack-set bound, refused as before) */
        if (shape) {
            assert_int_equal(accepts(g, "yx"), 1);
            assert_int_equal(accepts(g, "yyx"), 0);
        }
        grammar_free(g);
    }
    free(sb.s);

    /* a huge minItems: compiled or a bound error, quickly */
    static const char mi[] = "{\"type\":\"array\",\"minItems\":100000,\"items\":{\"type\":\"object\","
                             "\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":30},\"b\":{\"enum\":[1,2]}}}}";
    t0 = now_ms();
    json_object *js = json_tokener_parse(mi);
    char *ebnf = NULL;
    tern_err err = {0};
    assert_int_equal(grammar_schema_to_ebnf(js, NULL, &ebnf, &err), 0);
    json_object_put(js);
    g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
    free(ebnf);
    int rc = g ? 0 : err.code;
    grammar_free(g);
    dt = now_ms() - t0;
    print_message("minItems 100,000: %.0f ms (%s)\n", dt, rc ? tern_err_name(rc) : "compiled");
    assert_true(rc == 0 || rc == TERN_EFULL || rc == TERN_ETIMEOUT);
    assert_true(dt < 3000);
}

/* Formats with an RFC grammar (uri-reference, iri, uri-template, duration,
 * JSON pointers): texts whose validity the RFCs' ABNF decides (the wide
 * check against ajv and the JSON-Schema-Test-Suite is
 * tests/grammar/schema_ajv.mjs); names outside every draft are
 * annotations; oneOf with overlapping branches made exclusive. */
static void test_formats_and_one_of(void **state)
{
    (void)state;
    static const struct { const char *fmt, *text; int valid; } k[] = {
        {"duration", "\"P1Y2M3DT4H5M6S\"", 1}, {"duration", "\"P2W\"", 1}, {"duration", "\"PT36H\"", 1},
        {"duration", "\"P1Y2D\"", 0},          {"duration", "\"PT\"", 0},   {"duration", "\"P1WT1H\"", 0},
        {"duration", "\"PT0.5S\"", 0},
        {"json-pointer", "\"\"", 1},            {"json-pointer", "\"/a~1b/~0\"", 1},
        {"json-pointer", "\"/a\\\\b\"", 1},     {"json-pointer", "\"/a~2\"", 0}, {"json-pointer", "\"a/b\"", 0},
        {"relative-json-pointer", "\"0#\"", 1}, {"relative-json-pointer", "\"12/a\"", 1},
        {"relative-json-pointer", "\"01/a\"", 0}, {"relative-json-pointer", "\"0##\"", 0},
        {"uri-reference", "\"../a/b?c#d\"", 1}, {"uri-reference", "\"//host:8/p\"", 1},
        {"uri-reference", "\"\"", 1},           {"uri-reference", "\"a b\"", 0},
        {"uri-reference", "\"\\\\\\\\x\"", 0},
        {"iri", "\"http://\u00e9x.com/\u00fc?q\"", 1}, {"iri", "\"http://x.com/\\uFFFF\"", 0},
        {"iri", "\"relative/path\"", 0},
        {"iri-reference", "\"\u00e9t\u00e9\"", 1},
        {"uri-template", "\"http://x/{term:1}/{+a,b*}\"", 1}, {"uri-template", "\"{a.b}\"", 1},
        {"uri-template", "\"{}\"", 0},          {"uri-template", "\"{a..b}\"", 0},
        {"uri-template", "\"{v:10000}\"", 0},   {"uri-template", "\"a}b\"", 0},
        {"topic", "\"anything at all\"", 1},    {"url", "\"https://x.org/\"", 1},
        {"url", "\"x.org\"", 0},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\":\"string\",\"format\":\"%s\"}", k[i].fmt);
        grammar *g = schema_grammar(schema, NULL);
        if (accepts(g, k[i].text) != k[i].valid)
            fail_msg("format %s on %s: want %d", k[i].fmt, k[i].text, k[i].valid);
        grammar_free(g);
    }
    char msg[TERN_ERR_MSG_MAX];
    assert_int_equal(schema_error("{\"type\":\"string\",\"format\":\"Date-Time\"}", NULL, msg, sizeof msg),
                     TERN_EUNSUPPORTED);
    assert_non_null(strstr(msg, "Date-Time"));
    assert_int_equal(schema_error("{\"type\":\"string\",\"format\":\"regex\"}", NULL, msg, sizeof msg),
                     TERN_EUNSUPPORTED);
    /* oneOf of overlapping required lists: exactly one branch holds */
    grammar *g = schema_grammar("{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},"
                                "\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}", NULL);
    assert_int_equal(accepts(g, "{\"a\":1}"), 1);
    assert_int_equal(accepts(g, "{\"b\":1}"), 1);
    assert_int_equal(accepts(g, "{\"a\":1,\"b\":2}"), 0);
    assert_int_equal(accepts(g, "{}"), 0);
    grammar_free(g);
    /* oneOf of lengths: a string of 3 to 5 codepoints satisfies both */
    g = schema_grammar("{\"type\":\"string\",\"oneOf\":[{\"minLength\":3},{\"maxLength\":5}]}", NULL);
    for (int len = 0; len < 9; len++) {
        char text[16] = "\"";
        memset(text + 1, 'x', (size_t)len);
        text[len + 1] = '"';
        text[len + 2] = 0;
        assert_int_equal(accepts(g, text), (len >= 3) != (len <= 5));
    }
    grammar_free(g);
}

/* A reference under anyOf with nothing beside it stays a rule call: a
 * recursive one no longer unrolls until "nested too deeply". Documents
 * nested far past the front end's depth bound (96) are accepted, and the
 * recursion's constraints hold at every level. */
static void test_recursive_any_of(void **state)
{
    (void)state;
    grammar *g = schema_grammar("{\"$defs\":{\"n\":{\"type\":\"object\",\"required\":[\"c\"],\"properties\":{\"c\":"
                                "{\"type\":\"array\",\"items\":{\"anyOf\":[{\"$ref\":\"#/$defs/n\"},{\"type\":\"integer\"}]}}}}},"
                                "\"$ref\":\"#/$defs/n\"}",
                                NULL);
    assert_non_null(g);
    char text[4096];
    for (int bad = 0; bad < 3; bad++) {
        size_t n = 0;
        for (int d = 0; d < 200; d++)
            n += (size_t)snprintf(text + n, sizeof text - n, "{\"c\":[");
        n += (size_t)snprintf(text + n, sizeof text - n, bad == 1 ? "1.5" : bad == 2 ? "{}" : "7");
        for (int d = 0; d < 200; d++)
            n += (size_t)snprintf(text + n, sizeof text - n, "]}");
        assert_int_equal(accepts(g, text), bad == 0);
    }
    grammar_free(g);
}

/* Negations that need a member: not additionalProperties (a member
 * outside the listed names with a value the schema rejects), not
 * patternProperties, not propertyNames, and the oneOf they make exclusive;
 * an object open to unlisted names is refused, never approximated. */
static void test_member_negations(void **state)
{
    (void)state;
    static const struct { const char *schema, *text; int valid; } k[] = {
        /* two closed objects both admit {} and {"a":1}: exactly one holds */
        {"{\"oneOf\":[{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{\"a\":{},\"b\":{}}},"
         "{\"type\":\"object\",\"additionalProperties\":false,\"properties\":{\"a\":{},\"c\":{}}}]}", "{}", 0},
        {NULL, "{\"a\":1}", 0}, {NULL, "{\"b\":1}", 1}, {NULL, "{\"c\":1}", 1}, {NULL, "{\"a\":1,\"b\":2}", 1},
        {NULL, "{\"b\":1,\"c\":2}", 0},
        /* not additionalProperties with a value schema */
        {"{\"type\":\"object\",\"properties\":{\"x\":{},\"y\":{}},\"additionalProperties\":false,"
         "\"not\":{\"properties\":{\"x\":{}},\"additionalProperties\":{\"type\":\"string\"}}}", "{\"y\":1}", 1},
        {NULL, "{\"y\":\"s\"}", 0}, {NULL, "{\"x\":1}", 0}, {NULL, "{}", 0}, {NULL, "{\"x\":1,\"y\":[]}", 1},
        /* not patternProperties */
        {"{\"type\":\"object\",\"properties\":{\"n1\":{},\"s\":{}},\"additionalProperties\":false,"
         "\"not\":{\"patternProperties\":{\"^n\\\\d\":{\"type\":\"integer\"}}}}", "{\"n1\":\"x\"}", 1},
        {NULL, "{\"n1\":2}", 0}, {NULL, "{\"s\":\"x\"}", 0},
        /* not propertyNames */
        {"{\"type\":\"object\",\"properties\":{\"ab\":{},\"abc\":{}},\"additionalProperties\":false,"
         "\"not\":{\"propertyNames\":{\"maxLength\":2}}}", "{\"abc\":1}", 1},
        {NULL, "{\"ab\":1}", 0}, {NULL, "{\"ab\":1,\"abc\":2}", 1},
        /* enum values holding such a member */
        {"{\"enum\":[{\"a\":1},{\"a\":1,\"q\":true},{\"q\":\"s\"}],"
         "\"not\":{\"properties\":{\"a\":{}},\"additionalProperties\":{\"type\":\"boolean\"}}}", "{\"q\":\"s\"}", 1},
        {NULL, "{\"a\":1}", 0}, {NULL, "{\"a\":1,\"q\":true}", 0},
        /* not contains: every item rejected */
        {"{\"type\":\"array\",\"not\":{\"contains\":{\"type\":\"integer\"}}}", "[1]", 0},
        {NULL, "[\"a\"]", 1}, {NULL, "[]", 1}, {NULL, "[\"a\",2]", 0},
        /* not of a dependency, list and schema forms */
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"additionalProperties\":false,"
         "\"not\":{\"dependentRequired\":{\"a\":[\"b\"]}}}", "{\"a\":1}", 1},
        {NULL, "{\"a\":1,\"b\":2}", 0}, {NULL, "{\"b\":1}", 0}, {NULL, "{}", 0},
        {"{\"type\":\"object\",\"properties\":{\"a\":{},\"b\":{}},\"additionalProperties\":false,"
         "\"not\":{\"dependencies\":{\"a\":{\"required\":[\"b\"]}}}}", "{\"a\":1}", 1},
        {NULL, "{\"a\":1,\"b\":2}", 0}, {NULL, "{\"b\":1}", 0}, {NULL, "{}", 0},
        /* not beside enum: the listed values it rejects, non-scalars too */
        {"{\"enum\":[[2],[3],{\"a\":1}],\"not\":{\"enum\":[[3],{\"a\":1}]}}", "[2]", 1},
        {NULL, "[3]", 0}, {NULL, "{\"a\":1}", 0},
        {"{\"enum\":[{\"aaaa\":18},{\"aaaa\":21},{\"b\":\"x\"}],"
         "\"not\":{\"patternProperties\":{\"a+\":{\"maximum\":20}}}}", "{\"aaaa\":21}", 1},
        {NULL, "{\"aaaa\":18}", 0}, {NULL, "{\"b\":\"x\"}", 0},
        {"{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"enum\":[[1,2],[1,\"x\"]],"
         "\"not\":{\"items\":[{}],\"additionalItems\":{\"type\":\"integer\"}}}", "[1,\"x\"]", 1},
        {NULL, "[1,2]", 0},
    };
    grammar *g = NULL;
    const char *schema = NULL;
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        if (k[i].schema) {
            if (g)
                grammar_free(g);
            schema = k[i].schema;
            g = schema_grammar(schema, NULL);
        }
        if (accepts(g, k[i].text) != k[i].valid)
            fail_msg("%s on %s: want %d", schema, k[i].text, k[i].valid);
    }
    grammar_free(g);
    char msg[TERN_ERR_MSG_MAX];
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.strict = 0;
    assert_int_equal(schema_error("{\"type\":\"object\",\"properties\":{\"a\":{}},"
                                  "\"not\":{\"additionalProperties\":false}}", &o, msg, sizeof msg),
                     TERN_EUNSUPPORTED);
    assert_non_null(strstr(msg, "open to unlisted names"));
    /* the compiler's own keyword written by a client: refused */
    assert_int_equal(schema_error("{\"$ternMember\":[{\"value\":true}]}", NULL, msg, sizeof msg), TERN_EUNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_integer_ranges),      cmocka_unit_test(test_decimal_bounds),
        cmocka_unit_test(test_multiple_of),
        cmocka_unit_test(test_string_lengths),      cmocka_unit_test(test_objects_and_whitespace),
        cmocka_unit_test(test_strict_prefix_arrays),
        cmocka_unit_test(test_choice_and_builtin),  cmocka_unit_test(test_errors_and_bounds),
        cmocka_unit_test(test_large_inputs),        cmocka_unit_test(test_property_counts),
        cmocka_unit_test(test_formats_and_one_of),  cmocka_unit_test(test_recursive_any_of),
        cmocka_unit_test(test_member_negations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
