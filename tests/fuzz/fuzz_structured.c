/* Fuzz entry point for the structured-output field reader: input is a
 * request body (JSON); every structured field in it (response_format,
 * guided_*, structured_outputs) must give a spec key, no spec, or a 4xx
 * error value - never a crash, and the key of a body must be stable. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/structured.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tern_err je;
    json_object *root = tern_json_parse((const char *)data, size, &je);
    if (!root)
        return 0;
    if (json_object_is_type(root, json_type_object)) {
        api_request q;
        memset(&q, 0, sizeof q);
        q.kind = API_CHAT;
        q.root = root;
        api_error e;
        char *k1 = NULL, *k2 = NULL;
        int rc = api_structured_parse(&q, &e) || structured_spec_key(&q, &k1, &e) ? -1 : 0;
        if (rc && (e.status < 400 || e.status >= 600 || !e.msg[0]))
            abort();
        if (rc == 0 && (structured_spec_key(&q, &k2, &e) || (!k1) != (!k2) || (k1 && strcmp(k1, k2))))
            abort(); /* the key is a function of the body */
        free(k1);
        free(k2);
        api_structured_free(&q.structured_spec);
    }
    json_object_put(root);
    return 0;
}
