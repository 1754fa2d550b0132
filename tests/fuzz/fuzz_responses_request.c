/* Fuzz entry point for the /v1/responses request translation
 * (src/server/responses.c): input is a request body. It must become a chat
 * body that is valid JSON with a non-empty messages array, or a 4xx error
 * value with a message - never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/responses.h"
#include "server/server_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tern_server s;
    memset(&s, 0, sizeof s);
    char *chat = NULL;
    resp_state *r = NULL;
    api_error e;
    if (responses_translate(&s, (const char *)data, size, &chat, &r, &e) == 0) {
        json_object *o = tern_json_parse(chat, strlen(chat), NULL), *m = NULL;
        if (!o || !json_object_object_get_ex(o, "messages", &m) || !json_object_is_type(m, json_type_array) ||
            json_object_array_length(m) == 0)
            abort();
        json_object_put(o);
        free(chat);
        responses_state_free(r);
    } else if (e.status < 400 || e.status >= 500 || !e.msg[0] || chat || r) {
        abort();
    }
    responses_server_free(&s);
    return 0;
}
