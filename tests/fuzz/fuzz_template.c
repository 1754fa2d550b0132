/* Fuzz entry point for chat templates: parse + render with tight limits.
 * Input: template source, optionally followed by a NUL byte and a JSON
 * object used as the render context (otherwise a small chat with tools).
 * Any input must end in text or an error value, quickly and without leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "template/template.h"

static const char default_ctx[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi \\u00e9\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>r</think>ok\",\"tool_calls\":[{\"id\":\"abcdefghi\","
    "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1.5}}}]},{\"role\":\"tool\",\"content\":\"42\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    size_t src_len = size;
    const char *nul = memchr(data, 0, size);
    json_object *ctx = NULL;
    tern_err err = {0};
    if (nul) {
        src_len = (size_t)(nul - src);
        ctx = tern_json_parse(nul + 1, size - src_len - 1, &err);
    }
    if (!ctx)
        ctx = tern_json_parse(default_ctx, sizeof default_ctx - 1, &err);
    tern_template *t = tern_template_parse(src, src_len, &err);
    if (t) {
        /* small budgets keep each input fast under sanitizers */
        tern_template_limits lim = {.max_output = 1 << 16, .max_memory = 8u << 20,
                                    .max_steps = 20000, .max_depth = 20};
        size_t len;
        char *out = tern_template_render(t, ctx, &lim, &len, &err);
        free(out);
        tern_template_free(t);
    }
    json_object_put(ctx);
    return 0;
}
