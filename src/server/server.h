/* tern's OpenAI-compatible HTTP server: /v1/chat/completions,
 * /v1/completions, /v1/models, /health, /stats, /metrics and the chat page
 * at /, over libmicrohttpd with one thread per connection. The server
 * borrows a running engine; it never blocks the engine thread. */
#ifndef TERN_SERVER_H
#define TERN_SERVER_H

#include <stddef.h>

#include "base/err.h"
#include "engine/engine.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

typedef struct server_opts {
    const char *model_dir;   /* where the chat template is read from */
    const char *host;        /* bind address, default "127.0.0.1" (loopback) */
    int port;                /* default 8080; 0 = any free port (see server_port) */
    const char *api_key;     /* NULL = no auth; else /v1 needs "Authorization: Bearer KEY" or "x-api-key: KEY" */
    const char *metrics_key; /* NULL = /stats and /metrics open; else they need this key (either header) */
    const char *model_name;  /* the id /v1/models reports and requests must name */
    const char *cors_origin; /* NULL = no CORS headers */
    int ctx_size;            /* the engine's context (positions per sequence) */
    size_t max_body_bytes;   /* request bodies beyond it get 413 (default 8 MiB) */
    size_t max_header_bytes; /* per-connection header memory (default 64 KiB) */
    int header_timeout_s;    /* idle / slow-request timeout (default 30 s) */
    int max_connections;     /* concurrent connections (default 512): one thread each */
    int max_client_connections; /* of one client address (default max_connections / 2); 0 = no cap */
    int reserve_connections; /* slots connections still reading a request may not take (default max / 8) */
    int header_deadline_s;   /* a request's headers complete within it (default 15 s; 0 = none) */
    int body_deadline_s;     /* its body within it after the headers (default 120 s; 0 = none) */
    int compile_threads;     /* grammar compile workers (default 2) */
    int compile_queue;       /* compiles waiting for a worker before 429 (default max_connections) */
    long compile_time_limit_ms; /* one request's grammar compiles together (default 2000 ms) */
    int grammar_fallback;    /* 1: a grammar that cannot compile goes into the prompt (+ Warning) instead of a 400 */
    const char *tool_call_format; /* NULL = detected from the chat template; else a toolfmt name (toolfmt.h) */
    int reasoning_budget;    /* think tokens before the engine closes the block; -1 (default) = no cap */
    /* The model pool (server_start with m NULL): the models requests may
     * name, each loaded on demand by `load` on the pool's loader thread and
     * run by its own engine (made with `engine`'s options; a KV budget of 0
     * there means the pool's default, see docs/model-pool.md), within
     * max_memory bytes of weights + KV (0 = no limit), the least recently
     * used idle model evicted to make room. */
    const struct server_model_spec *models; /* [n_models], copied */
    int n_models;
    /* LoRA adapters, "[BASE:]NAME=DIR" each (--lora; BASE defaults to the
     * first model): registered at start, read then when the base is loaded
     * (an adapter that fails fails the start); borrowed for the call. */
    const char *const *loras;
    int n_loras;
    size_t max_memory;
    engine_opts engine;
    /* Loads DIR's model and tokenizer (called on the loader thread; both
     * owned by the server on success). 0 or a negative TERN_E* with err set. */
    int (*load)(void *ctx, const char *dir, tern_model **m, tern_tokenizer **tok, tern_err *err);
    void *load_ctx;
} server_opts;

/* One model of the pool: the id requests name, its folder, and whether it
 * stays resident (loaded at start, never evicted). */
typedef struct server_model_spec {
    const char *name;
    const char *dir;
    int pinned;
} server_model_spec;

void server_opts_default(server_opts *o);

typedef struct tern_server tern_server;

/* Starts listening. With m: serves that one model (named o->model_name,
 * its template read from o->model_dir), borrowing m, tok and e: they must
 * outlive the server, and the engine must be freed only after server_stop
 * (see server_free). With m NULL (tok and e NULL too): serves o->models as
 * a pool; pinned models are loaded before it returns (one that fails is
 * listed as failed, the server still starts). */
tern_server *server_start(const server_opts *o, tern_model *m, const tern_tokenizer *tok, tern_engine *e,
                          tern_err *err);
/* The bound TCP port (useful with port 0). */
int server_port(const tern_server *s);
/* Stops accepting, ends every connection (their engine requests are
 * cancelled) and joins the connection threads. */
void server_stop(tern_server *s);
/* Frees the server. Call after engine_free: the engine may still call a
 * request's notify hook until it is gone, and those hooks live here. */
void server_free(tern_server *s);

#endif
