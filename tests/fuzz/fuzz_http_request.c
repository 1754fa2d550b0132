/* Fuzz entry point of the request-body parser/validator (src/server/api_parse.c)
 * and the response formatting it feeds: any bytes parse as a chat request
 * and as a completions request; success must yield values in range, failure
 * a 4xx error that serializes to JSON. Never a crash. */
#include <assert.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/api.h"

static void check_request(const api_request *r)
{
    /* what the parser promises the engine */
    if (r->n < 1 || r->n > API_MAX_N || r->n_stop < 0 || r->n_stop > API_MAX_STOP || r->n_bias > API_MAX_BIAS)
        abort();
    if (r->max_tokens == 0 || r->max_tokens < -1)
        abort();
    if (!(r->sample.temperature >= 0 && r->sample.temperature <= 2) || !(r->sample.top_p > 0 && r->sample.top_p <= 1))
        abort();
    if (r->top_logprobs < 0 || r->top_logprobs > API_MAX_TOP_LOGPROBS)
        abort();
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias[i].id < 0 || r->bias[i].id >= 8192)
            abort();
    for (size_t i = 0; i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= 8192)
            abort();
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0])
            abort();
    if (r->kind == API_CHAT && (!r->messages || json_object_array_length(r->messages) == 0))
        abort();
    if (r->messages) { /* the normalized messages serialize */
        const char *s = json_object_to_json_string_ext(r->messages, JSON_C_TO_STRING_PLAIN);
        if (!s)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    api_limits lim = {.n_vocab = 8192, .model_name = "tern-demo"};
    for (int k = 0; k < 2; k++) {
        api_request r;
        api_error e;
        if (api_parse(&r, k ? API_COMPLETION : API_CHAT, (const char *)data, size, &lim, &e) == 0) {
            check_request(&r);
            api_request_free(&r);
        } else {
            if (e.status < 400 || e.status >= 500)
                abort();
            char *j = api_error_json(&e);
            if (!j)
                abort();
            json_object *back = json_tokener_parse(j);
            if (!back)
                abort(); /* the error body must be valid JSON */
            json_object_put(back);
            free(j);
        }
    }
    /* the lossy string builder must always give valid UTF-8 JSON */
    json_object *s = api_json_string((const char *)data, size);
    if (!s)
        abort();
    json_object_put(s);
    return 0;
}
