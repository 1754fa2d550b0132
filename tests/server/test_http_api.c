/* The server's request parser/validator and response formatting, without
 * sockets: field mapping to engine parameters, OpenAI defaults, the error
 * shape and the offending param, lossy UTF-8 strings and SSE framing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static const api_limits LIM = {.n_vocab = 100, .model_name = "m"};

static int parse(api_request *r, api_kind k, const char *body, api_error *e)
{
    return api_parse(r, k, body, strlen(body), &LIM, e);
}

static void expect_bad(api_kind k, const char *body, int status, const char *param)
{
    api_request r;
    api_error e;
    memset(&e, 0, sizeof e);
    int rc = parse(&r, k, body, &e);
    if (rc == 0)
        fail_msg("accepted: %s", body);
    assert_int_equal(e.status, status);
    if (param && strcmp(e.param, param) != 0)
        fail_msg("param '%s' != '%s' for %s (%s)", e.param, param, body, e.msg);
    assert_true(strlen(e.msg) > 0);
}

static void test_chat_defaults(void **state)
{
    (void)state;
    api_request r;
    api_error e;
    assert_int_equal(parse(&r, API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &e), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.max_tokens, -1);
    assert_true(fabsf(r.sample.temperature - 1.0f) < 1e-6f); /* OpenAI's default */
    assert_int_equal(r.sample.n_logprobs, -1);
    assert_int_equal(r.stream, 0);
    assert_int_equal(r.add_generation_prompt, 1);
    assert_int_equal((int)json_object_array_length(r.messages), 1);
    api_request_free(&r);
}

static void test_chat_fields(void **state)
{
    (void)state;
    api_request r;
    api_error e;
    const char *body =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"user\",\"content\":\"q\"}],"
        "\"max_tokens\":50,\"max_completion_tokens\":7,\"temperature\":0,\"top_p\":0.5,\"top_k\":3,\"min_p\":0.1,"
        "\"repetition_penalty\":1.2,\"presence_penalty\":1,\"frequency_penalty\":-1,\"logit_bias\":{\"5\":-100},"
        "\"seed\":-1,\"stop\":\"END\",\"n\":3,\"logprobs\":true,\"top_logprobs\":4,\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"user\":\"x\",\"tool_choice\":\"none\","
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"temperature\":0.25}";
    assert_int_equal(parse(&r, API_CHAT, body, &e), 0);
    assert_int_equal(r.max_tokens, 7); /* max_completion_tokens wins */
    assert_true(fabsf(r.sample.temperature - 0.25f) < 1e-6f); /* last duplicate wins, as json-c keeps it */
    assert_int_equal(r.sample.top_k, 3);
    assert_int_equal(r.n_bias, 1);
    assert_int_equal(r.bias[0].id, 5);
    assert_true(r.sample.bias == r.bias);
    assert_int_equal(r.has_seed, 1);
    assert_true(r.sample.seed == UINT64_MAX);
    assert_int_equal(r.n_stop, 1);
    assert_string_equal(r.stop[0], "END");
    assert_int_equal(r.n, 3);
    assert_int_equal(r.sample.n_logprobs, 4);
    assert_int_equal(r.include_usage, 1);
    assert_null(r.tools); /* tool_choice none hides them */
    json_object *m0 = json_object_array_get_idx(r.messages, 0), *v;
    json_object_object_get_ex(m0, "role", &v);
    assert_string_equal(json_object_get_string(v), "system");
    json_object_object_get_ex(m0, "content", &v);
    assert_string_equal(json_object_get_string(v), "a\nb");
    api_request_free(&r);
}

/* tool_choice and parallel_tool_calls are read into typed fields */
static void test_tool_fields(void **state)
{
    (void)state;
    api_request r;
    api_error e;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"parallel_tool_calls\":false,"
                       "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g-2\"}},\"tools\":["
                       "{\"type\":\"function\",\"function\":{\"name\":\"f\",\"strict\":true,\"parameters\":{}}},"
                       "{\"type\":\"function\",\"function\":{\"name\":\"g-2\",\"description\":\"d\"}}]}";
    assert_int_equal(parse(&r, API_CHAT, body, &e), 0);
    assert_int_equal(r.tool_choice, API_TOOL_NAMED);
    assert_string_equal(r.tool_name, "g-2");
    assert_int_equal(r.parallel_tool_calls, 0);
    assert_non_null(r.tools);
    assert_string_equal(api_tool_name(json_object_array_get_idx(r.tools, 1)), "g-2");
    api_request_free(&r);
    body = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tool_choice\":\"required\","
           "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}";
    assert_int_equal(parse(&r, API_CHAT, body, &e), 0);
    assert_int_equal(r.tool_choice, API_TOOL_REQUIRED);
    assert_int_equal(r.parallel_tool_calls, 1);
    api_request_free(&r);
    /* an empty tools list is no tools */
    body = "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[]}";
    assert_int_equal(parse(&r, API_CHAT, body, &e), 0);
    assert_null(r.tools);
    api_request_free(&r);
}

static void test_completion_prompts(void **state)
{
    (void)state;
    api_request r;
    api_error e;
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":\"abc\",\"logprobs\":2}", &e), 0);
    assert_string_equal(r.prompt, "abc");
    assert_int_equal(r.logprobs, 1);
    assert_int_equal(r.sample.n_logprobs, 2);
    api_request_free(&r);
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":\"abc\",\"echo\":true}", &e), 0);
    assert_int_equal(r.echo, 1);
    assert_int_equal(r.sample.n_logprobs, -1);
    api_request_free(&r);
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":[[7,8,9]]}", &e), 0);
    assert_int_equal((int)r.n_prompt_ids, 3);
    assert_int_equal(r.prompt_ids[2], 9);
    api_request_free(&r);
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":[\"x\"],\"logprobs\":0}", &e), 0);
    assert_int_equal(r.sample.n_logprobs, 0); /* the sampled token's logprob, no alternatives */
    api_request_free(&r);
}

static void test_errors(void **state)
{
    (void)state;
    const char *msg = "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
    char b[512];
#define BAD(fmt, status, param)                  \
    do {                                         \
        snprintf(b, sizeof b, fmt, msg);         \
        expect_bad(API_CHAT, b, status, param);  \
    } while (0)
    BAD("{%s,\"temperature\":\"x\"}", 400, "temperature");
    BAD("{%s,\"temperature\":2.5}", 400, "temperature");
    BAD("{%s,\"top_p\":0}", 400, "top_p");
    BAD("{%s,\"max_tokens\":0}", 400, "max_tokens");
    BAD("{%s,\"max_tokens\":1e400}", 400, "max_tokens");
    BAD("{%s,\"n\":17}", 400, "n");
    BAD("{%s,\"seed\":1.5}", 400, "seed");
    BAD("{%s,\"logit_bias\":{\"100\":1}}", 400, "logit_bias");
    BAD("{%s,\"stop\":[\"\"]}", 400, "stop");
    BAD("{%s,\"top_logprobs\":2}", 400, "top_logprobs");
    BAD("{%s,\"model\":\"other\"}", 400, "model");
    BAD("{%s,\"temprature\":1}", 400, "temprature"); /* a misspelling: did you mean */
    BAD("{%s,\"max_token\":1}", 400, "max_token");
    BAD("{%s,\"prompt\":\"a\"}", 400, "prompt"); /* the other endpoint's field */
    BAD("{%s,\"stream_options\":{\"include_usage\":true}}", 400, "stream_options");
    BAD("{%s,\"tool_choice\":\"required\"}", 400, "tool_choice");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", 400,
        "tool_choice.function.name");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":{\"type\":\"function\"}}", 400, "tool_choice.function.name");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"always\"}", 400, "tool_choice");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"parallel_tool_calls\":1}", 400, "parallel_tool_calls");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}", 400, "tools[1].function.name");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}", 400,
        "tools[0].function.name");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]}", 400,
        "tools[0].function.parameters");
    BAD("{%s,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"extra\":1}}]}", 400,
        "tools[0].function.extra");
    BAD("{%s,\"tools\":[],\"tool_choice\":\"none\"}", 400, "tool_choice");
    BAD("{%s,\"messages\":[]}", 400, "messages");
#undef BAD
    expect_bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
               "messages[0].content[0]");
    expect_bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"audio\":1}]}", 400,
               "messages[0].audio");
    expect_bad(API_CHAT, "{\"messages\":", 400, NULL);
    expect_bad(API_CHAT, "[1]", 400, NULL);
    expect_bad(API_COMPLETION, "{\"prompt\":\"\xc0\xaf\"}", 400, NULL); /* overlong: json-c lets it through */
    expect_bad(API_COMPLETION, "{\"prompt\":\"\xed\xa0\x80\"}", 400, NULL); /* a UTF-8 surrogate */
    expect_bad(API_COMPLETION, "{\"prompt\":[1,100]}", 400, "prompt");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":true}", 400, "logprobs");
    expect_bad(API_COMPLETION, "{\"prompt\":[\"a\",5]}", 400, "prompt"); /* a batch of one kind only */
    expect_bad(API_COMPLETION, "{\"max_tokens\":3}", 400, "prompt");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"messages\":[]}", 400, "messages");
    /* the body is not NUL-terminated: parse must respect len */
    api_request r;
    api_error e;
    const char body[] = "{\"prompt\":\"a\"}garbage";
    assert_int_equal(api_parse(&r, API_COMPLETION, body, 14, &LIM, &e), 0);
    api_request_free(&r);
}

/* An assistant message as the server returned it, appended to the history
 * by a client (the openai client's runTools adds `parsed`): accepted, the
 * `reasoning` alias kept as reasoning_content, the derived fields dropped;
 * the same fields elsewhere are still errors. */
/* llama-server's and vLLM's fields: mapped onto the OpenAI ones, or a 400
 * naming them. */
static void test_compat_fields(void **state)
{
    (void)state;
    api_request r;
    api_error e;
    json_object *v = NULL;
    const char *body = "{\"prompt\":\"a\",\"n_predict\":7,\"repeat_penalty\":1.3,\"cache_prompt\":true,"
                       "\"min_tokens\":3,\"stop_token_ids\":[5,9],\"include_stop_str_in_output\":true,"
                       "\"grammar\":\"root ::= \\\"x\\\"\"}";
    assert_int_equal(parse(&r, API_COMPLETION, body, &e), 0);
    assert_int_equal(r.max_tokens, 7);
    assert_true(fabsf(r.sample.repetition_penalty - 1.3f) < 1e-6f);
    assert_int_equal(r.min_tokens, 3);
    assert_int_equal(r.n_stop_ids, 2);
    assert_int_equal(r.stop_ids[0], 5);
    assert_int_equal(r.stop_ids[1], 9);
    assert_int_equal(r.include_stop_str, 1);
    assert_true(json_object_object_get_ex(r.root, "guided_grammar", &v));
    assert_string_equal(json_object_get_string(v), "root ::= \"x\"");
    api_request_free(&r);
    /* the OpenAI name wins over n_predict; -1 = no limit */
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":\"a\",\"n_predict\":7,\"max_tokens\":4}", &e), 0);
    assert_int_equal(r.max_tokens, 4);
    api_request_free(&r);
    assert_int_equal(parse(&r, API_COMPLETION, "{\"max_tokens\":4,\"prompt\":\"a\",\"n_predict\":7}", &e), 0);
    assert_int_equal(r.max_tokens, 4);
    api_request_free(&r);
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":\"a\",\"n_predict\":-1}", &e), 0);
    assert_int_equal(r.max_tokens, -1);
    api_request_free(&r);
    /* json_schema -> guided_json */
    assert_int_equal(parse(&r, API_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"json_schema\":{\"type\":\"object\"}}",
                           &e),
                     0);
    assert_true(json_object_object_get_ex(r.root, "guided_json", &v) && json_object_is_type(v, json_type_object));
    api_request_free(&r);
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"n_predict\":0}", 400, "n_predict");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"n_predict\":\"5\"}", 400, "n_predict");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"cache_prompt\":1}", 400, "cache_prompt");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"repeat_penalty\":0}", 400, "repeat_penalty");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"repeat_penalty\":1.1,\"repetition_penalty\":1.2}", 400,
               "repeat_penalty");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"grammar\":5}", 400, "grammar");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"grammar\":\"x\",\"guided_grammar\":\"y\"}", 400, "grammar");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"json_schema\":\"x\"}", 400, "json_schema");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"json_schema\":{},\"response_format\":{\"type\":\"text\"}}", 400,
               "json_schema");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"min_tokens\":-1}", 400, "min_tokens");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"min_tokens\":9,\"max_tokens\":4}", 400, "min_tokens");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"stop_token_ids\":[100]}", 400, "stop_token_ids");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"stop_token_ids\":5}", 400, "stop_token_ids");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"stop_token_ids\":[\"5\"]}", 400, "stop_token_ids");
    expect_bad(API_COMPLETION, "{\"prompt\":\"a\",\"include_stop_str_in_output\":1}", 400,
               "include_stop_str_in_output");
    /* unknown fields far from every known one: ignored and listed */
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":\"a\",\"frobnicate\":1,\"x_trace_id\":\"q\"}", &e), 0);
    assert_string_equal(r.ignored, "frobnicate, x_trace_id");
    api_request_free(&r);
    /* batched prompts: strings or id lists, one kind, at most API_MAX_N choices in all */
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":[\"a\",\"bc\",\"\"],\"n\":2}", &e), 0);
    assert_int_equal(r.n_batch, 3);
    assert_null(r.prompt);
    assert_int_equal((int)r.batch[1].len, 2);
    assert_memory_equal(r.batch[1].text, "bc", 2);
    api_request_free(&r);
    assert_int_equal(parse(&r, API_COMPLETION, "{\"prompt\":[[1,2],[3]]}", &e), 0);
    assert_int_equal(r.n_batch, 2);
    assert_null(r.prompt_ids);
    assert_int_equal((int)r.batch[0].n_ids, 2);
    assert_int_equal(r.batch[1].ids[0], 3);
    api_request_free(&r);
    expect_bad(API_COMPLETION, "{\"prompt\":[\"a\",[1]]}", 400, "prompt");
    expect_bad(API_COMPLETION, "{\"prompt\":[[1],\"a\"]}", 400, "prompt");
    expect_bad(API_COMPLETION, "{\"prompt\":[[1],[]]}", 400, "prompt");
    expect_bad(API_COMPLETION, "{\"prompt\":[[1],[100]]}", 400, "prompt");
    expect_bad(API_COMPLETION, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"n\":4}", 400, "prompt");
}

static void test_echoed_message(void **state)
{
    (void)state;
    api_request r;
    api_error e;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\","
                       "\"content\":null,\"reasoning_content\":null,\"reasoning\":\"think\",\"refusal\":null,"
                       "\"parsed\":null,\"annotations\":[],\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                       "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
                       "\"tool_call_id\":\"call_1\",\"content\":\"1\"}]}";
    assert_int_equal(parse(&r, API_CHAT, body, &e), 0);
    json_object *m = json_object_array_get_idx(r.messages, 1), *v = NULL;
    assert_true(json_object_object_get_ex(m, "reasoning_content", &v));
    assert_string_equal(json_object_get_string(v), "think");
    assert_false(json_object_object_get_ex(m, "parsed", NULL));
    assert_false(json_object_object_get_ex(m, "annotations", NULL));
    assert_false(json_object_object_get_ex(m, "reasoning", NULL));
    api_request_free(&r);
    expect_bad(API_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"parsed\":null}]}", 400,
               "messages[0].parsed");
    expect_bad(API_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\","
               "\"reasoning\":5}]}",
               400, "messages[1].reasoning");
}

static void test_error_json(void **state)
{
    (void)state;
    api_error e;
    api_bad(&e, "invalid_type", "temperature", "'%s' must be a number", "temperature");
    char *j = api_error_json(&e);
    json_object *o = json_tokener_parse(j), *err, *v;
    assert_non_null(o);
    assert_true(json_object_object_get_ex(o, "error", &err));
    assert_true(json_object_object_get_ex(err, "message", &v));
    assert_string_equal(json_object_get_string(v), "'temperature' must be a number");
    assert_true(json_object_object_get_ex(err, "param", &v));
    assert_string_equal(json_object_get_string(v), "temperature");
    assert_true(json_object_object_get_ex(err, "code", &v));
    assert_string_equal(json_object_get_string(v), "invalid_type");
    assert_true(json_object_object_get_ex(err, "type", &v));
    assert_string_equal(json_object_get_string(v), "invalid_request_error");
    json_object_put(o);
    free(j);
}

static void test_json_string_utf8(void **state)
{
    (void)state;
    json_object *s = api_json_string("a\xff" "b\xe2\x82\xac" "\xc0\xaf", 8);
    assert_string_equal(json_object_get_string(s), "a\xef\xbf\xbd" "b\xe2\x82\xac\xef\xbf\xbd\xef\xbf\xbd");
    json_object_put(s);
    s = api_json_string("\xe2\x82", 2); /* truncated sequence */
    assert_string_equal(json_object_get_string(s), "\xef\xbf\xbd\xef\xbf\xbd");
    json_object_put(s);
}

static void test_sse_and_usage(void **state)
{
    (void)state;
    api_buf b = {0};
    json_object *choices;
    json_object *o = api_envelope("id1", "chat.completion.chunk", 5, "m", &choices);
    json_object_object_add(o, "usage", api_usage(3, 4, 1));
    assert_int_equal(api_buf_sse(&b, o), 0);
    assert_int_equal(strncmp(b.data, "data: {", 7), 0);
    assert_int_equal(strcmp(b.data + b.len - 2, "\n\n"), 0);
    assert_null(strchr(b.data, '\n') == b.data + b.len - 2 ? NULL : strchr(b.data, '\n')); /* one line */
    json_object *back = json_tokener_parse(b.data + 6), *u, *v;
    assert_true(json_object_object_get_ex(back, "usage", &u));
    assert_true(json_object_object_get_ex(u, "total_tokens", &v));
    assert_int_equal(json_object_get_int(v), 7);
    json_object_put(back);
    api_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_defaults),   cmocka_unit_test(test_chat_fields),
        cmocka_unit_test(test_tool_fields), cmocka_unit_test(test_completion_prompts), cmocka_unit_test(test_errors), cmocka_unit_test(test_echoed_message),
        cmocka_unit_test(test_compat_fields),
        cmocka_unit_test(test_error_json),      cmocka_unit_test(test_json_string_utf8),
        cmocka_unit_test(test_sse_and_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
