/* Endpoints other servers' clients expect, outside the OpenAI API:
 * llama-server's POST /tokenize and POST /detokenize (same request and
 * response shapes), and GET /version. They take the same API key as /v1
 * (routes_keyed). Bad bodies are OpenAI-shaped 400s naming the field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/server_int.h"

#ifndef TERN_VERSION
#define TERN_VERSION "0.0.0"
#endif
#ifndef TERN_GIT_COMMIT
#define TERN_GIT_COMMIT ""
#endif

/* Parses the body as a JSON object; NULL with e set otherwise. */
static json_object *body_object(srv_conn *c, api_error *e)
{
    const char *body = c->body.data ? c->body.data : "";
    size_t len = c->body.len;
    size_t valid = api_utf8_valid_len(body, len);
    if (valid != len) {
        api_bad(e, "invalid_encoding", NULL, "request body is not valid UTF-8 (at byte %zu)", valid);
        return NULL;
    }
    tern_err je;
    json_object *root = tern_json_parse(body, len, &je);
    if (!root) {
        api_bad(e, "invalid_json", NULL, "request body is not valid JSON: %s", je.msg);
        return NULL;
    }
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        api_bad(e, "invalid_type", NULL, "request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* A "model" field, when given, must be a string naming a served model. */
static int check_model(tern_server *s, json_object *v, srv_model **mm, api_error *e)
{
    if (!json_object_is_type(v, json_type_string))
        return api_bad(e, "invalid_type", "model", "'model' must be a string");
    return (*mm = models_resolve(s, json_object_get_string(v), e)) ? 0 : -1;
}

/* The model named (or the default) with a reference taken; NULL with e set. */
static srv_model *use_model(tern_server *s, srv_model *mm, api_error *e)
{
    if (!mm && !(mm = models_resolve(s, NULL, e)))
        return NULL;
    return models_acquire(s, mm, e) ? NULL : mm;
}

/* A token's piece as llama-server writes it: its bytes as a string when they
 * are valid UTF-8, else the list of byte values. */
static json_object *piece_json(const tern_tokenizer *tok, int32_t id)
{
    const char *b = "";
    size_t n = 0;
    if (tokenizer_token_bytes(tok, id, &b, &n))
        n = 0;
    if (api_utf8_valid_len(b, n) == n)
        return json_object_new_string_len(b, (int)n);
    json_object *a = json_object_new_array();
    for (size_t i = 0; i < n; i++)
        json_object_array_add(a, json_object_new_int((unsigned char)b[i]));
    return a;
}

/* POST /tokenize {content, add_special?, parse_special?, with_pieces?, model?}
 * -> {tokens: [id...]} or, with pieces, {tokens: [{id, piece}...]}. */
enum MHD_Result compat_tokenize_serve(srv_conn *c)
{
    tern_server *s = c->s;
    srv_model *mm = NULL, *held = NULL;
    api_error e;
    json_object *root = body_object(c, &e), *content = NULL, *out = NULL;
    int add_special = 0, with_pieces = 0, rc = -1;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!root)
        return http_reply_error(c, &e);
    json_object_object_foreach(root, k, v) {
        if (!v)
            continue;
        if (!strcmp(k, "content")) {
            if (!json_object_is_type(v, json_type_string)) {
                api_bad(&e, "invalid_type", k, "'content' must be a string");
                goto cleanup;
            }
            content = v;
        } else if (!strcmp(k, "add_special") || !strcmp(k, "with_pieces") || !strcmp(k, "parse_special")) {
            if (!json_object_is_type(v, json_type_boolean)) {
                api_bad(&e, "invalid_type", k, "'%s' must be a boolean", k);
                goto cleanup;
            }
            int b = json_object_get_boolean(v);
            if (k[0] == 'a')
                add_special = b;
            else if (k[0] == 'w')
                with_pieces = b;
            else if (!b) {
                /* the tokenizer always matches special tokens' text */
                api_bad(&e, "unsupported_value", k, "'parse_special': false is not supported");
                goto cleanup;
            }
        } else if (!strcmp(k, "model")) {
            if (check_model(s, v, &mm, &e))
                goto cleanup;
        } else {
            api_bad(&e, "unsupported_parameter", k, "Unsupported parameter: '%.60s' is not supported by /tokenize",
                    k);
            goto cleanup;
        }
    }
    if (!content) {
        api_bad(&e, "missing_required_parameter", "content", "'content' is required");
        goto cleanup;
    }
    if (!(held = mm = use_model(s, mm, &e)))
        goto cleanup;
    tern_err te;
    if (tokenizer_encode(mm->tok, json_object_get_string(content), (size_t)json_object_get_string_len(content),
                         add_special, &ids, &n, &te)) {
        api_bad(&e, "invalid_value", "content", "cannot tokenize 'content': %s", te.msg);
        goto cleanup;
    }
    out = json_object_new_object();
    json_object *arr = json_object_new_array_ext((int)n);
    json_object_object_add(out, "tokens", arr);
    for (size_t i = 0; i < n; i++) {
        if (!with_pieces) {
            json_object_array_add(arr, json_object_new_int(ids[i]));
            continue;
        }
        json_object *t = json_object_new_object();
        json_object_object_add(t, "id", json_object_new_int(ids[i]));
        json_object_object_add(t, "piece", piece_json(mm->tok, ids[i]));
        json_object_array_add(arr, t);
    }
    rc = 0;
cleanup:
    models_release(held);
    free(ids);
    json_object_put(root);
    if (rc)
        return http_reply_error(c, &e);
    return http_reply_json(c, 200, api_json_take(out));
}

/* POST /detokenize {tokens: [id...], model?} -> {content} (special tokens
 * kept, as llama-server does). */
enum MHD_Result compat_detokenize_serve(srv_conn *c)
{
    tern_server *s = c->s;
    srv_model *mm = NULL, *held = NULL;
    api_error e;
    json_object *root = body_object(c, &e), *tokens = NULL;
    int32_t *ids = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = -1;
    if (!root)
        return http_reply_error(c, &e);
    json_object_object_foreach(root, k, v) {
        if (!v)
            continue;
        if (!strcmp(k, "tokens")) {
            if (!json_object_is_type(v, json_type_array)) {
                api_bad(&e, "invalid_type", k, "'tokens' must be an array of token ids");
                goto cleanup;
            }
            tokens = v;
        } else if (!strcmp(k, "model")) {
            if (check_model(s, v, &mm, &e))
                goto cleanup;
        } else {
            api_bad(&e, "unsupported_parameter", k,
                    "Unsupported parameter: '%.60s' is not supported by /detokenize", k);
            goto cleanup;
        }
    }
    if (!tokens) {
        api_bad(&e, "missing_required_parameter", "tokens", "'tokens' is required");
        goto cleanup;
    }
    if (!(held = mm = use_model(s, mm, &e)))
        goto cleanup;
    size_t n = json_object_array_length(tokens);
    int32_t n_vocab = tokenizer_vocab_size(mm->tok);
    ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) {
        api_error_set(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tokens, i);
        int64_t id = json_object_is_type(t, json_type_int) ? json_object_get_int64(t) : -1;
        if (id < 0 || id >= n_vocab) {
            api_bad(&e, "invalid_value", "tokens", "'tokens[%zu]' must be an integer token id in [0, %d)", i,
                    (int)n_vocab);
            goto cleanup;
        }
        ids[i] = (int32_t)id;
    }
    tern_err te;
    if (tokenizer_decode(mm->tok, ids, n, 0, &text, &len, &te)) {
        api_bad(&e, "invalid_value", "tokens", "cannot decode 'tokens': %s", te.msg);
        goto cleanup;
    }
    rc = 0;
cleanup:
    models_release(held);
    free(ids);
    json_object_put(root);
    if (rc)
        return http_reply_error(c, &e);
    json_object *out = json_object_new_object();
    json_object_object_add(out, "content", api_json_string(text, len));
    free(text);
    return http_reply_json(c, 200, api_json_take(out));
}

/* GET /version -> {version, commit?}: what the build was configured with. */
enum MHD_Result compat_version_serve(srv_conn *c)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "version", json_object_new_string(TERN_VERSION));
    if (TERN_GIT_COMMIT[0])
        json_object_object_add(o, "commit", json_object_new_string(TERN_GIT_COMMIT));
    return http_reply_json(c, 200, api_json_take(o));
}
