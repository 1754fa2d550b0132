/* Fuzz entry point of the /v1/embeddings body parser and response formatter
 * (src/server/embeddings.c): any bytes either parse into inputs the engine
 * can take (non-empty, ids in the vocabulary, dimensions in range) whose
 * response serializes, or fail with a 400 that serializes to JSON. */
#include <json-c/json.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/embeddings.h"

#define DIM 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    api_limits lim = {.n_vocab = 8192, .model_name = "tern-demo"};
    embed_request r;
    api_error e;
    if (embed_request_parse(&r, (const char *)data, size, &lim, DIM, &e) == 0) {
        if (r.n_in < 1 || r.n_in > EMBED_MAX_INPUTS || r.dimensions < 0 || r.dimensions > DIM)
            abort();
        float v[DIM] = {1, -2, 3.5f, 0, 1e-30f, -0.0f, 7, 8};
        const float **vecs = malloc(r.n_in * sizeof *vecs);
        if (!vecs)
            abort();
        for (size_t i = 0; i < r.n_in; i++) {
            const embed_input *in = &r.in[i];
            if (in->ids ? in->n_ids == 0 : !in->text || in->text_len == 0)
                abort();
            for (size_t k = 0; k < in->n_ids; k++)
                if (in->ids[k] < 0 || in->ids[k] >= lim.n_vocab)
                    abort();
            vecs[i] = v;
        }
        char *js = embed_response_json("tern-demo", vecs, r.n_in, r.dimensions ? r.dimensions : DIM, r.base64, 1);
        json_object *back = js ? json_tokener_parse(js) : NULL;
        if (!back)
            abort();
        json_object_put(back);
        free(js);
        free(vecs);
        embed_request_free(&r);
    } else {
        if (e.status != 400 || r.in || r.root)
            abort();
        char *j = api_error_json(&e);
        json_object *back = j ? json_tokener_parse(j) : NULL;
        if (!back)
            abort();
        json_object_put(back);
        free(j);
    }
    return 0;
}
