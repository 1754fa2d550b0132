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
} srv_metrics;

/* An eventfd the engine's notify hook pokes. Wakers are pooled for the
 * server's life and never closed early; the engine notifies under the
 * request's lock and never after its release, so a reused waker gets no
 * poke meant for its previous request (src/server/README.md). */
typedef struct srv_waker {
    int efd;
    struct srv_waker *next_free, *next_all;
} srv_waker;

struct tern_server {
    server_opts o;           /* strings point at the copies below */
    char *host, *api_key, *model_name, *cors;
    tern_model *m;
    const tern_tokenizer *tok;
    tern_engine *eng;
    tern_chat_template chat; /* .tpl NULL when the model has none */
    toolfmt_probe tools;     /* the template's tool-call format (detected, or --tool-call-format) */
    reasoning_delims think;  /* the vocabulary's thought delimiters, when has_think */
    int has_think;
    struct MHD_Daemon *d;
    int port;
    int ctx_size;
    long long started;       /* unix time */
    atomic_int stopping;
    pthread_mutex_t wk_mu;
    srv_waker *wk_free, *wk_all;
    srv_metrics met;
    struct structured_server *structured; /* structured.c: vocabulary + compile cache, made on first use */
    embed_config embed;      /* the folder's sentence-transformers config; pooling NONE = not an embedding model */
    struct resp_store *responses;         /* responses.c: stored responses (previous_response_id), made on first use */
    struct toolcall_server *toolcall;     /* toolcall.c: the format's trigger tables, made on first use */
    struct srv_guard *guard;              /* guard.c: connection states, caps and read deadlines */
};

/* One HTTP request (MHD's per-request context). */
typedef struct srv_conn {
    tern_server *s;
    struct MHD_Connection *mc;
    srv_route route;
    api_buf body;
    int body_too_big;
    int replied;             /* a response was queued */
    char warning[256];       /* a Warning header for the reply ("" = none; structured.c) */
} srv_conn;

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
/* Submits n engine requests per prompt for req (taken on success and
 * failure); choice i is prompt i / n's. 0, or -1 with err set (429 when the
 * queue is full). */
int gen_start(tern_server *s, api_request *req, const gen_prompt *prompts, int n_prompts, int client_fd,
              gen_job **out, api_error *err);
/* Non-streaming: blocks until every choice finished (returns 0 and the
 * response JSON in *json) or the client went away / the server stops (-1). */
int gen_collect(gen_job *j, char **json, api_error *err);
/* Streaming: queues an SSE response for j (which it takes). */
enum MHD_Result gen_stream(srv_conn *c, gen_job *j);
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

/* metrics.c */
char *metrics_stats_json(tern_server *s);
char *metrics_prometheus(tern_server *s, size_t *len);
void metrics_count_response(tern_server *s, srv_route route, unsigned status);

#endif
