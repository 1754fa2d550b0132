/* POST /v1/embeddings (embeddings.c): the request body -> inputs, the
 * response body (pure, unit-tested in tests/server/test_embeddings.c); the
 * route itself (embed_route_serve) is declared in server_int.h. */
#ifndef TERN_SERVER_EMBEDDINGS_H
#define TERN_SERVER_EMBEDDINGS_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "server/api.h"

#define EMBED_MAX_INPUTS 2048  /* inputs per request, OpenAI's limit */
#define EMBED_MAX_INFLIGHT 16  /* engine requests one HTTP request keeps queued at once: a quarter of the default batch (64 rows), so one request never fills it; the rest wait their turn */

/* One input: text (borrowed from the body, prompt not yet applied) or
 * token ids (owned; sent to the model as they are). */
typedef struct embed_input {
    const char *text;
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
} embed_input;

typedef struct embed_request {
    json_object *root;   /* owned: the parsed body */
    const char *model;   /* borrowed, NULL if absent */
    embed_input *in;     /* owned [n_in] */
    size_t n_in;
    int dimensions;      /* 0 = the model's size; else truncate to it and renormalise */
    int base64;          /* encoding_format "base64": little-endian float32, base64 */
} embed_request;

/* Parses and validates a body of len bytes for a model of embedding size
 * dim and lim->n_vocab token ids. Every field is understood ("input",
 * "model", "dimensions", "encoding_format"), the no-op hint "user", or a
 * 400 naming it; empty strings, empty token lists and an empty input list
 * are 400s, as OpenAI answers them. On failure r is left empty. */
int embed_request_parse(embed_request *r, const char *body, size_t len, const api_limits *lim, int dim,
                        api_error *e);
void embed_request_free(embed_request *r);

/* The response body {"object":"list","data":[{"object":"embedding","index":i,
 * "embedding":[floats] | "base64"}],"model","usage":{prompt_tokens,total_tokens}}
 * for n vectors of dim floats each (vecs[i], borrowed). malloc'd JSON text,
 * NULL when out of memory. */
char *embed_response_json(const char *model, const float *const *vecs, size_t n, int dim, int base64,
                          long long n_tokens);

/* Matryoshka `dimensions`: L2-normalises the first d values of v in place
 * (the response then carries only those d). */
void embed_truncate(float *v, int d);

#endif
