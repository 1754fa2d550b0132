/* Private to src/server: the server object, one HTTP request's state, the
 * generation job that ties a request to its engine requests, and metrics. */
#ifndef TERN_SERVER_INT_H
#define TERN_SERVER_INT_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "model/embed.h"
#include "server/api.h"
#include "server/harmony.h"
#include "server/reasoning.h"
#include "server/server.h"
#include "server/toolfmt.h"
#include "template/template.h"

struct resp_state; /* responses.h */

/* Routes, for dispatch and per-route metrics. */
typedef enum srv_route {
    ROUTE_CHAT,
    ROUTE_COMPLETIONS,
    ROUTE_EMBEDDINGS,
    ROUTE_RESPONSES,
    ROUTE_MODELS,
    ROUTE_HEALTH,
    ROUTE_STATS,
    ROUTE_METRICS,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_VERSION,
    ROUTE_PAGE,
    ROUTE_OTHER,
    ROUTE_N
} srv_route;

extern const char *const srv_route_names[ROUTE_N];

typedef struct srv_metrics {
    atomic_llong http[ROUTE_N][6];   /* responses by status class: 1xx..5xx, [0] = no response (dropped) */
    atomic_llong gen_started, gen_finished, gen_disconnected, gen_failed;
    atomic_llong prompt_tokens, completion_tokens, cached_tokens;
    atomic_int streams_active, gens_active;
    atomic_llong conn_evicted, conn_refused, conn_deadline; /* guard.c */
    atomic_llong compiles, compile_us, compile_cancelled, compile_rejected; /* compile_pool.c */
} srv_metrics;

/* An eventfd the engine's notify hook pokes. Wakers are pooled for the
 * server's life and never closed early; the engine notifies under the
 * request's lock and never after its release, so a reused waker gets no
 * poke meant for its previous request (src/server/README.md). */
typedef struct srv_waker {
    int efd;
    struct srv_waker *next_free, *next_all;
} srv_waker;

/* A model's state in the pool (models.c). */
typedef enum srv_model_state {
    MODEL_UNLOADED,  /* not in memory (can be loaded on demand) */
    MODEL_LOADING,   /* queued for, or on, the loader thread */
    MODEL_LOADED,    /* serving */
    MODEL_UNLOADING, /* being freed (evicted or unloaded) */
    MODEL_FAILED,    /* its folder cannot be served: reason says why (a load retries) */
} srv_model_state;

/* Latency histograms of /metrics (metrics.c has their buckets), per model. */
typedef enum srv_hist_kind {
    HIST_TTFT,     /* request arrival to its first token reaching the connection thread */
    HIST_ITL,      /* between two tokens of a choice, as the connection thread sees them */
    HIST_DURATION, /* request arrival to its response's end (generation routes) */
    HIST_QUEUE,    /* engine submit to admission into the batch, per choice */
    HIST_N
} srv_hist_kind;
#define SRV_HIST_BUCKETS 14
typedef struct srv_hist {
    atomic_llong n[SRV_HIST_BUCKETS + 1]; /* per bucket (not cumulative); the last is +Inf */
    atomic_llong count, sum_ns;
} srv_hist;

/* Per-model server counters (the model label of /stats and /metrics). */
typedef struct srv_model_metrics {
    srv_hist hist[HIST_N];
    atomic_llong gen_started, gen_finished, gen_failed;
    atomic_llong prompt_tokens, completion_tokens, cached_tokens;
    atomic_llong loads, load_failures, evictions, unloads, rejected_no_room;
    atomic_llong load_ms_total;  /* milliseconds spent loading it */
} srv_model_metrics;

/* One served model: its identity and pool bookkeeping (under the server's
 * pool_mu), and while LOADED everything a request needs. A request holds a
 * reference (models_acquire .. models_release) for as long as it uses any
 * field below `loaded state`; a model with references is never unloaded. */
typedef struct srv_model {
    struct tern_server *s;
    char *name, *dir;
    int pinned;
    int borrowed;              /* m, tok, eng are the caller's (single-model serve) */
    /* pool bookkeeping, under s->pool_mu */
    srv_model_state state;
    char reason[TERN_ERR_MSG_MAX]; /* FAILED: why; UNLOADED after a refused load: the last refusal */
    int refs;                  /* requests using it */
    int waiters;               /* requests waiting for it to load (it is not evicted under them) */
    int in_loader;             /* the loader thread is bringing it up */
    unsigned long long last_used; /* pool tick of its last acquire or release (LRU) */
    size_t weights_bytes;      /* its safetensors files */
    size_t kv_bytes;           /* KV budget: estimated before a load, the engine's pool after */
    atomic_llong lora_bytes;   /* its LoRA adapters read against the current load (adapters.c), charged with it */
    engine_stats retired;      /* counters of its earlier engines, so totals survive an unload */
    double loaded_at;          /* tern_time_s() when it became LOADED */
    /* loaded state */
    tern_model *m;
    tern_tokenizer *tok;
    tern_engine *eng;
    tern_chat_template chat;   /* .tpl NULL when the model has none */
    toolfmt_probe tools;       /* the template's tool-call format (detected, or --tool-call-format) */
    reasoning_delims think;    /* the vocabulary's thought delimiters, when has_think */
    int has_think;
    harmony_tokens harmony;    /* the harmony format's tokens (gpt-oss), when has_harmony */
    int has_harmony;
    int ctx_size;              /* positions per sequence */
    embed_config embed;        /* the folder's sentence-transformers config; pooling NONE = not an embedding model */
    struct structured_server *structured; /* structured.c: vocabulary + compile cache, made on first use */
    struct toolcall_server *toolcall;     /* toolcall.c: the format's trigger tables, made on first use */
    srv_model_metrics met;
} srv_model;

struct tern_server {
    server_opts o;           /* strings point at the copies below */
    char *host, *api_key, *cors;
    struct MHD_Daemon *d;
    int port;
    long long started;       /* unix time */
    atomic_int stopping;
    pthread_mutex_t wk_mu;
    srv_waker *wk_free, *wk_all;
    srv_metrics met;
    struct resp_store *responses;         /* responses.c: stored responses (previous_response_id), made on first use */
    struct srv_guard *guard;              /* guard.c: connection states, caps and read deadlines */
    struct srv_compile_pool *compile;     /* compile_pool.c: grammar compile workers */
    /* the model pool (models.c) */
    srv_model **models;      /* [n_models], in the order given; models[0] is the default */
    int n_models;
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;  /* a model's state changed, or the loader has work */
    pthread_t loader;
    int loader_started, loader_quit;
    unsigned long long tick; /* LRU clock */
    /* LoRA adapters (adapters.c), under adapters_mu */
    struct srv_adapter **adapters;
    int n_adapters;
    pthread_mutex_t adapters_mu;
};

/* What a generation adds to its request's access line and histograms. */
typedef struct srv_access {
    srv_model *mm;           /* the model that generated (NULL = none) */
    char completion_id[48];  /* chatcmpl-... / cmpl-... ("" = none) */
    int prompt_tokens, completion_tokens;
    double t_first;          /* its first token reached the connection thread (tern_time_s; 0 = none) */
} srv_access;

/* One HTTP request (MHD's per-request context). */
typedef struct srv_conn {
    tern_server *s;
    struct MHD_Connection *mc;
    srv_route route;
    api_buf body;
    int body_too_big;
    int replied;             /* a response was queued */
    char warning[256];       /* a Warning header for the reply ("" = none; structured.c) */
    /* the access log line (http.c) */
    double t_start;          /* its headers arrived (tern_time_s) */
    char id[72];             /* the client's X-Request-Id, or one made here; echoed as X-Request-Id */
    char method[12];
    unsigned status;         /* of the queued response (when replied) */
    srv_access acc;          /* what a generation adds (gen_access) */
    struct gen_job *stream_job; /* a streamed generation, alive until after on_completed (gen_stream) */
} srv_conn;

/* access.c: the access line of a request (begun with its headers, written
 * when MHD reports it complete). */
void access_begin(srv_conn *c, const char *method);
void access_end(srv_conn *c, enum MHD_RequestTerminationCode toe);

/* http.c: replies; each records metrics. Return MHD's result. */
enum MHD_Result http_reply(srv_conn *c, unsigned status, const char *ctype, const void *data, size_t len,
                           enum MHD_ResponseMemoryMode mode);
enum MHD_Result http_reply_json(srv_conn *c, unsigned status, char *json /* takes */);
enum MHD_Result http_reply_error(srv_conn *c, const api_error *e);
enum MHD_Result http_reply_response(srv_conn *c, unsigned status, struct MHD_Response *r);
void http_add_common_headers(const tern_server *s, struct MHD_Response *r);
int http_client_fd(srv_conn *c);
/* Generation may take long: lift the idle timeout while it runs. */
void http_timeout_lift(srv_conn *c);

/* guard.c: slow connections cannot take every slot (src/server/README.md).
 * srv_guard_accept is MHD's accept policy and srv_guard_notify its
 * connection notifier (cls = the server); the marks move a connection
 * through its states from on_request / on_completed. */
typedef struct srv_guard srv_guard;
int srv_guard_start(tern_server *s, tern_err *err);
void srv_guard_stop(tern_server *s); /* before MHD stops: ends the deadline sweep */
void srv_guard_free(tern_server *s); /* after MHD stopped */
enum MHD_Result srv_guard_accept(void *cls, const struct sockaddr *addr, socklen_t len);
void srv_guard_notify(void *cls, struct MHD_Connection *mc, void **socket_ctx,
                      enum MHD_ConnectionNotificationCode toe);
void srv_guard_headers_done(tern_server *s, struct MHD_Connection *mc); /* the body deadline starts */
void srv_guard_request_done(tern_server *s, struct MHD_Connection *mc); /* being served: no deadline */
void srv_guard_reply_done(tern_server *s, struct MHD_Connection *mc);   /* keep-alive: the next headers' deadline */

/* compile_pool.c: grammar compiles off the connection threads. */
typedef struct srv_compile_pool srv_compile_pool;
/* n_threads workers, at most max_queue waiting jobs; time_limit_ms (0 =
 * none) bounds each job's compile phases together. */
int srv_compile_pool_start(tern_server *s, int n_threads, int max_queue, long time_limit_ms, tern_err *err);
/* Cancels every queued and running compile (server_stop, before MHD stops). */
void srv_compile_pool_cancel_all(tern_server *s);
/* Joins the workers (after MHD stopped: no job is left). */
void srv_compile_pool_free(tern_server *s);
void srv_compile_pool_counts(tern_server *s, int *n_queued, int *n_running);
/* Runs fn(arg, e) on a worker and waits, polling client_fd (-1 = none): a
 * client that leaves cancels it (499, nothing to reply), so does the
 * server stopping (503); a full queue is 429. t_start (tern_time_s; 0 =
 * unknown) is when the request arrived: its time until now comes off the
 * compile limit (at most half of it), so the request answers within about
 * the limit. arg must stay valid until this returns (it does not return
 * while a worker uses it). Returns fn's result, or -1 with e set. */
int srv_compile_run(tern_server *s, int client_fd, double t_start, int (*fn)(void *arg, api_error *e), void *arg,
                    api_error *e);

/* waker.c-ish helpers in gen.c */
srv_waker *srv_waker_get(tern_server *s);
void srv_waker_put(tern_server *s, srv_waker *w);
void srv_wakers_free(tern_server *s);
/* The engine's notify hook for a request whose user pointer is a waker. */
void srv_waker_notify(void *user);
/* Whether poll's revents on a client socket mean the peer closed (data it
 * sends, a pipelined next request, is not a hangup). */
int srv_peer_closed(int fd, short revents);

/* routes.c */
enum MHD_Result routes_dispatch(srv_conn *c, const char *method, const char *url);
srv_route routes_classify(const char *url);
/* Whether a route needs the API key besides /v1 (the llama-server endpoints). */
int routes_keyed(srv_route route);

/* gen.c: a generation job = the n engine requests of one HTTP request. */
typedef struct gen_job gen_job;
/* One prompt of a job: its ids (copied by the engine), where its KV is worth
 * caching, and the text echoed before each of its choices (copied, may be
 * NULL). A batch of prompts gives n choices each, prompt-major. */
typedef struct gen_prompt {
    const int32_t *ids;
    size_t n;
    size_t cache_boundary;
    const char *echo;
} gen_prompt;
/* Submits n engine requests per prompt for req on mm (req and the caller's
 * reference on mm taken on success and failure); choice i is prompt i / n's. 0, or -1 with err set (429 when the
 * queue is full). */
int gen_start(srv_model *mm, api_request *req, const gen_prompt *prompts, int n_prompts, int client_fd,
              gen_job **out, api_error *err);
/* Non-streaming: blocks until every choice finished (returns 0 and the
 * response JSON in *json) or the client went away / the server stops (-1). */
int gen_collect(gen_job *j, char **json, api_error *err);
/* Streaming: queues an SSE response for j (which it takes). */
enum MHD_Result gen_stream(srv_conn *c, gen_job *j);
/* Copies what j's request adds to the access line into a (before gen_free;
 * for a stream, from on_completed: the response and j outlive it). */
void gen_access(const gen_job *j, srv_access *a);
/* Makes j a Responses API reply (responses.h), taking r; before any
 * gen_collect / gen_stream. A streamed one starts with its first events. */
void gen_set_responses(gen_job *j, struct resp_state *r);
void gen_free(gen_job *j);

/* embeddings.c: POST /v1/embeddings */
enum MHD_Result embed_route_serve(srv_conn *c);

/* compat.c: llama-server's /tokenize and /detokenize, and /version */
enum MHD_Result compat_tokenize_serve(srv_conn *c);
enum MHD_Result compat_detokenize_serve(srv_conn *c);
enum MHD_Result compat_version_serve(srv_conn *c);

/* models.c: the model pool. */
/* Fills s->models: one borrowed, loaded model (m not NULL: the single-model
 * serve), or the pool of s->o.models with its loader thread (pinned models
 * loaded before it returns). 0, or a negative TERN_E* with err set. */
int models_init(tern_server *s, tern_model *m, const tern_tokenizer *tok, tern_engine *eng, tern_err *err);
/* Stops the loader and frees every model (engines first). After server_stop. */
void models_free(tern_server *s);
/* Wakes requests waiting for a load (they see `stopping`). */
void models_wake(tern_server *s);
/* A request's `model` string -> the model it names. NULL or "" is the
 * default when the server has one model (else 400 naming `model`); an
 * unknown name is a 404 model_not_found. The one place a name is read:
 * adapter names will resolve here to their base model. Loads nothing. */
srv_model *models_resolve(tern_server *s, const char *name, api_error *e);
/* Takes a reference on mm, loading it first if needed (waiting on this
 * thread, evicting idle models least recently used first). Errors: 503
 * model_cannot_fit (with the sizes), 503 model_load_failed (with the
 * reason), 503 when the server stops. */
int models_acquire(tern_server *s, srv_model *mm, api_error *e);
/* Drops a reference (NULL is a no-op). */
void models_release(srv_model *mm);
/* Evicts idle models (least recently used first, never keep) until the
 * loaded models' charges - weights, KV, adapters - fit in --max-memory:
 * 0, or -1 with why (naming `what`, which needs `bytes` more on keep) in
 * reason. Call it with adapters_mu not held (an eviction frees the
 * victim's adapters). */
int models_room(tern_server *s, srv_model *keep, const char *what, size_t bytes, char *reason, size_t cap);
/* models_resolve + models_acquire of a JSON body's "model" field. */
srv_model *models_acquire_body(tern_server *s, const char *body, size_t len, api_error *e);
/* POST /v1/models/load and /unload: a load waits until loaded (a failed
 * model is surveyed again first); an unload of a pinned (409
 * model_pinned) or busy (409 model_busy) model is refused. */
int models_load(tern_server *s, srv_model *mm, api_error *e);
int models_unload(tern_server *s, srv_model *mm, api_error *e);
const char *models_state_name(srv_model_state st);

/* adapters.c: LoRA adapters per request (docs/lora.md). */
typedef struct srv_adapter srv_adapter;
struct model_lora;
void adapters_init(tern_server *s);
/* Drops the adapters read against base's model (its teardown): requests
 * keep their references; the next one reads them again. */
void adapters_base_down(tern_server *s, srv_model *base);
void adapters_free(tern_server *s); /* after models_free */
/* Registers --lora's "[BASE:]NAME=DIR", reading it when BASE is loaded. */
int adapters_add_spec(tern_server *s, const char *spec, tern_err *err);
/* The base model a `model` string names when it is no model's own name
 * ("BASE:NAME" or an adapter's NAME), else NULL. */
srv_model *adapters_resolve(tern_server *s, const char *name);
/* For a request on mm (acquired) whose `model` is name: *lora the adapter it
 * names (a reference for the caller; NULL for the base) and *ad its record
 * (counters). -1 with e set: 404 model_not_found, 400 unsupported_device
 * (a backend without adapters), 400 adapter_load_failed. */
int adapters_acquire(srv_model *mm, const char *name, srv_adapter **ad, struct model_lora **lora, api_error *e);
void adapters_count_start(srv_adapter *a, int n_choices, long long prompt_tokens); /* a NULL: nothing */
void adapters_count_finish(srv_adapter *a, const engine_usage *u, int failed);
/* POST /v1/load_lora_adapter {"lora_name", "lora_path"[, "model"]} and
 * /v1/unload_lora_adapter {"lora_name"[, "model"]} (vLLM's shape). */
enum MHD_Result adapters_route_serve(srv_conn *c, const char *url);
void adapters_models_json(tern_server *s, json_object *data); /* /v1/models entries */
json_object *adapters_stats_json(tern_server *s);
void adapters_prometheus(tern_server *s, api_buf *b);

/* models_api.c: GET /v1/models[/{id}], POST /v1/models/load|unload, and
 * the per-model part of /stats and /metrics. */
enum MHD_Result models_route_serve(srv_conn *c, const char *method, const char *url);
json_object *models_stats_json(tern_server *s, engine_stats *total);
void models_prometheus(tern_server *s, api_buf *b);

/* metrics.c */
char *metrics_stats_json(tern_server *s);
char *metrics_prometheus(tern_server *s, size_t *len);
void metrics_count_response(tern_server *s, srv_route route, unsigned status);
/* Adds one observation (seconds) to mm's histogram k (mm NULL: nothing). */
void metrics_observe(srv_model *mm, srv_hist_kind k, double seconds);

#endif
