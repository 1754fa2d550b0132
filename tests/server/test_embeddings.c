/* /v1/embeddings without sockets: the body's input forms, every validation
 * error naming its field, and the response body (floats that read back
 * exactly, base64 of little-endian float32 checked against an independent
 * decoder, usage). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/embeddings.h"

static const api_limits LIM = {.n_vocab = 100, .model_name = "m"};
#define DIM 8

static int parse(embed_request *r, const char *body, api_error *e)
{
    return embed_request_parse(r, body, strlen(body), &LIM, DIM, e);
}

static void expect_bad(const char *body, const char *param)
{
    embed_request r;
    api_error e;
    memset(&e, 0, sizeof e);
    if (parse(&r, body, &e) == 0)
        fail_msg("accepted: %s", body);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    if (strcmp(e.param, param) != 0)
        fail_msg("param '%s' != '%s' for %s (%s)", e.param, param, body, e.msg);
    assert_true(strlen(e.msg) > 0);
    assert_null(r.in);
    assert_null(r.root);
}

static void test_input_forms(void **state)
{
    (void)state;
    embed_request r;
    api_error e;
    assert_int_equal(parse(&r, "{\"input\":\"hello\",\"model\":\"m\",\"user\":\"u\"}", &e), 0);
    assert_int_equal(r.n_in, 1);
    assert_int_equal(r.in[0].text_len, 5);
    assert_memory_equal(r.in[0].text, "hello", 5);
    assert_null(r.in[0].ids);
    assert_int_equal(r.dimensions, 0);
    assert_int_equal(r.base64, 0);
    embed_request_free(&r);

    assert_int_equal(parse(&r, "{\"input\":[\"a\",\"bc\"],\"encoding_format\":\"base64\",\"dimensions\":3}", &e), 0);
    assert_int_equal(r.n_in, 2);
    assert_int_equal(r.in[1].text_len, 2);
    assert_int_equal(r.base64, 1);
    assert_int_equal(r.dimensions, 3);
    embed_request_free(&r);

    assert_int_equal(parse(&r, "{\"input\":[5,6,7.0]}", &e), 0); /* one input as token ids */
    assert_int_equal(r.n_in, 1);
    assert_int_equal(r.in[0].n_ids, 3);
    assert_int_equal(r.in[0].ids[2], 7);
    embed_request_free(&r);

    assert_int_equal(parse(&r, "{\"input\":[[1],[2,3]],\"dimensions\":null,\"encoding_format\":\"float\"}", &e), 0);
    assert_int_equal(r.n_in, 2);
    assert_int_equal(r.in[1].n_ids, 2);
    assert_int_equal(r.in[1].ids[1], 3);
    embed_request_free(&r);
}

static void test_errors(void **state)
{
    (void)state;
    expect_bad("{}", "input");
    expect_bad("{\"input\":\"\"}", "input");
    expect_bad("{\"input\":[]}", "input");
    expect_bad("{\"input\":[\"a\",\"\"]}", "input");
    expect_bad("{\"input\":[[1],[]]}", "input");
    expect_bad("{\"input\":[1,100]}", "input");
    expect_bad("{\"input\":[1,-1]}", "input");
    expect_bad("{\"input\":[1,1.5]}", "input");
    expect_bad("{\"input\":[\"a\",[1]]}", "input");
    expect_bad("{\"input\":[[1],\"a\"]}", "input");
    expect_bad("{\"input\":[true]}", "input");
    expect_bad("{\"input\":{\"a\":1}}", "input");
    expect_bad("{\"input\":\"a\",\"dimensions\":0}", "dimensions");
    expect_bad("{\"input\":\"a\",\"dimensions\":9}", "dimensions");
    expect_bad("{\"input\":\"a\",\"dimensions\":-1}", "dimensions");
    expect_bad("{\"input\":\"a\",\"dimensions\":2.5}", "dimensions");
    expect_bad("{\"input\":\"a\",\"dimensions\":\"4\"}", "dimensions");
    expect_bad("{\"input\":\"a\",\"encoding_format\":\"hex\"}", "encoding_format");
    expect_bad("{\"input\":\"a\",\"encoding_format\":1}", "encoding_format");
    expect_bad("{\"input\":\"a\",\"model\":\"other\"}", "model");
    expect_bad("{\"input\":\"a\",\"model\":5}", "model");
    expect_bad("{\"input\":\"a\",\"user\":5}", "user");
    expect_bad("{\"input\":\"a\",\"temperature\":1}", "temperature");
    expect_bad("[1]", "");
    expect_bad("{\"input\":", "");
    /* 2049 strings: over OpenAI's limit */
    size_t cap = 16 + 2049 * 4;
    char *big = malloc(cap), *p = big;
    p += sprintf(p, "{\"input\":[");
    for (int i = 0; i < 2049; i++)
        p += sprintf(p, "%s\"a\"", i ? "," : "");
    sprintf(p, "]}");
    expect_bad(big, "input");
    free(big);
}

/* An independent base64 decoder (RFC 4648 alphabet). */
static size_t b64_decode(const char *s, unsigned char *out)
{
    size_t n = 0;
    unsigned v = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        const char *al = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const char *q = strchr(al, *s);
        assert_non_null(q);
        v = v << 6 | (unsigned)(q - al);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(v >> bits);
        }
    }
    return n;
}

static void test_response(void **state)
{
    (void)state;
    float a[3] = {0.1f, -2.5f, 3.14159274f}, b[3] = {1e-30f, 0.0f, -1.0f / 3.0f};
    const float *v[2] = {a, b};
    for (int b64 = 0; b64 <= 1; b64++) {
        char *js = embed_response_json("m", v, 2, 3, b64, 17);
        assert_non_null(js);
        json_object *o = json_tokener_parse(js);
        assert_non_null(o);
        json_object *x;
        assert_true(json_object_object_get_ex(o, "object", &x));
        assert_string_equal(json_object_get_string(x), "list");
        assert_true(json_object_object_get_ex(o, "model", &x));
        assert_string_equal(json_object_get_string(x), "m");
        json_object *u, *t;
        assert_true(json_object_object_get_ex(o, "usage", &u));
        assert_true(json_object_object_get_ex(u, "prompt_tokens", &t));
        assert_int_equal(json_object_get_int(t), 17);
        assert_true(json_object_object_get_ex(u, "total_tokens", &t));
        assert_int_equal(json_object_get_int(t), 17);
        json_object *data;
        assert_true(json_object_object_get_ex(o, "data", &data));
        assert_int_equal(json_object_array_length(data), 2);
        for (int i = 0; i < 2; i++) {
            json_object *d = json_object_array_get_idx(data, i), *idx, *obj, *emb;
            assert_true(json_object_object_get_ex(d, "index", &idx));
            assert_int_equal(json_object_get_int(idx), i);
            assert_true(json_object_object_get_ex(d, "object", &obj));
            assert_string_equal(json_object_get_string(obj), "embedding");
            assert_true(json_object_object_get_ex(d, "embedding", &emb));
            float got[3];
            if (b64) {
                unsigned char bytes[64];
                assert_int_equal(b64_decode(json_object_get_string(emb), bytes), 12);
                for (int k = 0; k < 3; k++) { /* little-endian float32 */
                    uint32_t w = (uint32_t)bytes[4 * k] | (uint32_t)bytes[4 * k + 1] << 8 |
                                 (uint32_t)bytes[4 * k + 2] << 16 | (uint32_t)bytes[4 * k + 3] << 24;
                    memcpy(&got[k], &w, 4);
                }
            } else {
                assert_int_equal(json_object_array_length(emb), 3);
                for (int k = 0; k < 3; k++) /* the text reads back as the same float32 */
                    got[k] = (float)strtod(json_object_get_string(json_object_array_get_idx(emb, k)), NULL);
            }
            for (int k = 0; k < 3; k++)
                assert_memory_equal(&got[k], &v[i][k], 4);
        }
        json_object_put(o);
        free(js);
    }
}

static void test_truncate(void **state)
{
    (void)state;
    float v[4] = {3, 4, 12, 0};
    embed_truncate(v, 2);
    assert_float_equal(v[0], 0.6f, 1e-7);
    assert_float_equal(v[1], 0.8f, 1e-7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_input_forms),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_response),
        cmocka_unit_test(test_truncate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
