/* HTTP plumbing over libmicrohttpd: the daemon (one thread per connection,
 * so a slow client or a blocked wait stalls only its own thread), bounded
 * request bodies and headers, strict framing (one Content-Length; JSON
 * bodies only), API-key and metrics-key auth, CORS, and reply helpers.
 * Routing and everything OpenAI-specific live in routes.c / gen.c. */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "base/log.h"
#include "server/responses.h"
#include "server/server_int.h"
#include "server/structured.h"
#include "server/toolcall.h"

void server_opts_default(server_opts *o)
{
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->model_name = "tern";
    o->max_body_bytes = (size_t)8 << 20;  /* a long chat history is well under this */
    o->max_header_bytes = (size_t)64 << 10; /* MHD's per-connection pool: headers + bookkeeping */
    o->header_timeout_s = 30;
    o->max_connections = 512;
    o->max_client_connections = -1; /* -1: max_connections / 2, resolved at start */
    o->reserve_connections = -1;    /* -1: max_connections / 8 */
    o->header_deadline_s = 15;      /* a real client sends its headers in one packet */
    o->body_deadline_s = 120;       /* 8 MiB at 70 KB/s */
    o->compile_threads = 2;         /* compiles are bounded (2 s): two keep one slow schema from stalling the rest */
    o->compile_queue = -1;          /* -1: max_connections (each connection waits for one compile at most) */
    o->compile_time_limit_ms = 2000; /* the grammar engine's own per-compile limit */
    o->reasoning_budget = -1;
}

void http_add_common_headers(const tern_server *s, struct MHD_Response *r)
{
    if (s->cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", s->cors);
        MHD_add_response_header(r, "Vary", "Origin");
    }
}

enum MHD_Result http_reply_response(srv_conn *c, unsigned status, struct MHD_Response *r)
{
    http_add_common_headers(c->s, r);
    if (c->warning[0])
        MHD_add_response_header(r, "Warning", c->warning);
    if (c->id[0])
        MHD_add_response_header(r, "X-Request-Id", c->id);
    enum MHD_Result ret = MHD_queue_response(c->mc, status, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES) {
        c->replied = 1;
        c->status = status;
        metrics_count_response(c->s, c->route, status);
    }
    return ret;
}

enum MHD_Result http_reply(srv_conn *c, unsigned status, const char *ctype, const void *data, size_t len,
                           enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)data, mode);
    if (!r)
        return MHD_NO;
    if (ctype)
        MHD_add_response_header(r, "Content-Type", ctype);
    return http_reply_response(c, status, r);
}

enum MHD_Result http_reply_json(srv_conn *c, unsigned status, char *json)
{
    if (!json)
        return MHD_NO;
    return http_reply(c, status, "application/json", json, strlen(json), MHD_RESPMEM_MUST_FREE);
}

enum MHD_Result http_reply_error(srv_conn *c, const api_error *e)
{
    if (e->status >= 500)
        TERN_WARN("server: %d %s", e->status, e->msg);
    else
        TERN_DEBUG("server: %d %s", e->status, e->msg);
    struct MHD_Response *r;
    char *json = api_error_json(e);
    if (!json)
        return MHD_NO;
    r = MHD_create_response_from_buffer(strlen(json), json, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(json);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (e->status == 401)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    return http_reply_response(c, (unsigned)e->status, r);
}

int http_client_fd(srv_conn *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

void http_timeout_lift(srv_conn *c)
{
    MHD_set_connection_option(c->mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)0);
}

/* Constant-time comparison, so the key cannot be found byte by byte. */
static int key_equal(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < la; i++)
        d |= (unsigned char)(a[i] ^ b[i % (lb ? lb : 1)]);
    return d == 0;
}

/* Whether the request carries key: as "Authorization: Bearer KEY" or, as
 * Anthropic-style clients send it, "x-api-key: KEY". A bearer token that is
 * present decides alone (a wrong one is not rescued by the other header). */
static int key_presented(srv_conn *c, const char *key)
{
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (h) {
        if (strncasecmp(h, "Bearer ", 7) != 0)
            return 0;
        h += 7;
        while (*h == ' ')
            h++;
        return key_equal(h, key);
    }
    h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "x-api-key");
    return h && key_equal(h, key);
}

static int authorized(srv_conn *c)
{
    return !c->s->api_key || key_presented(c, c->s->api_key);
}

/* Counts the request's Content-Length headers. */
static enum MHD_Result count_cl(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    (void)value;
    if (!strcasecmp(key, "Content-Length"))
        (*(int *)cls)++;
    return MHD_YES;
}

/* The framing and media type of a request body, checked before it is read.
 * One Content-Length, never beside a Transfer-Encoding: two framings are how
 * requests are smuggled past a proxy that reads the other one. A body that
 * says it is another format is 415 (none said, or text/plain, is taken as
 * JSON). Returns 0, or
 * fills e. */
static int body_headers_check(srv_conn *c, const char *method, api_error *e)
{
    int n_cl = 0;
    MHD_get_connection_values(c->mc, MHD_HEADER_KIND, count_cl, &n_cl);
    const char *te = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Transfer-Encoding");
    if (n_cl > 1)
        return api_error_set(e, 400, "invalid_request_error", "invalid_request", NULL,
                             "the request has %d Content-Length headers; send one", n_cl);
    if (n_cl && te)
        return api_error_set(e, 400, "invalid_request_error", "invalid_request", NULL,
                             "the request has both Content-Length and Transfer-Encoding; send one");
    if (strcmp(method, "POST") != 0)
        return 0;
    const char *ct = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Content-Type");
    if (!ct)
        return 0;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strcspn(ct, "; \t");
    /* application/json, any application/...+json, or text/plain: what
     * fetch() and many HTTP libraries label a string body they were not told
     * the type of (it is parsed as JSON like any other) */
    int json = (n == 16 && !strncasecmp(ct, "application/json", 16)) ||
               (n > 17 && !strncasecmp(ct, "application/", 12) && !strncasecmp(ct + n - 5, "+json", 5)) ||
               (n == 10 && !strncasecmp(ct, "text/plain", 10));
    if (!json)
        return api_error_set(e, 415, "invalid_request_error", "unsupported_media_type", NULL,
                             "Content-Type '%.*s' is not supported: send the body as JSON with "
                             "'Content-Type: application/json'",
                             (int)(n < 80 ? n : 80), ct);
    return 0;
}

/* A body that is JSON but not an object, told apart before the route's
 * parser sees it (for `null`, json-c has no object to report). Returns 0
 * when the body starts like an object (or is not JSON: the route says so). */
static int body_object_check(const api_buf *b, api_error *e)
{
    size_t i = 0, n = b->len;
    const char *p = b->data;
    while (i < n && strchr(" \t\r\n", p[i]))
        i++;
    while (n > i && strchr(" \t\r\n", p[n - 1]))
        n--;
    if (i == n || p[i] == '{')
        return 0;
    const char *what = NULL;
    if (n - i == 4 && !memcmp(p + i, "null", 4))
        what = "null";
    else if ((n - i == 4 && !memcmp(p + i, "true", 4)) || (n - i == 5 && !memcmp(p + i, "false", 5)))
        what = "a boolean";
    else if (p[i] == '[')
        what = "an array";
    else if (p[i] == '"')
        what = "a string";
    else if (p[i] == '-' || (p[i] >= '0' && p[i] <= '9'))
        what = "a number";
    if (!what)
        return 0;
    return api_error_set(e, 400, "invalid_request_error", "invalid_type", NULL,
                         "the request body must be a JSON object, not %s", what);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **ctx)
{
    tern_server *s = cls;
    srv_conn *c = *ctx;
    (void)version;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c)
            return MHD_NO;
        c->s = s;
        c->mc = mc;
        c->route = routes_classify(url);
        *ctx = c;
        access_begin(c, method);
        srv_guard_headers_done(s, mc);
        /* reject a badly framed or non-JSON body, or an announced oversized
         * one, before reading it */
        api_error e0;
        if (body_headers_check(c, method, &e0))
            return http_reply_error(c, &e0);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes)
            c->body_too_big = 1;
        if (!c->body_too_big)
            return MHD_YES;
    }
    if (c->replied) {
        *upload_size = 0; /* discard the rest of the upload */
        return MHD_YES;
    }
    if (*upload_size) {
        if (!c->body_too_big && c->body.len + *upload_size <= s->o.max_body_bytes) {
            if (api_buf_append(&c->body, upload_data, *upload_size))
                return MHD_NO;
        } else {
            c->body_too_big = 1;
            api_buf_free(&c->body);
        }
        *upload_size = 0;
        return MHD_YES;
    }
    api_error e;
    srv_guard_request_done(s, mc);
    if (c->body_too_big) {
        api_error_set(&e, 413, "invalid_request_error", "request_too_large", NULL,
                      "request body exceeds %zu bytes", s->o.max_body_bytes);
        return http_reply_error(c, &e);
    }
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
        MHD_add_response_header(r, "Allow", "GET, POST, OPTIONS");
        if (s->cors) {
            MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
            MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
            MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        }
        return http_reply_response(c, 204, r);
    }
    if ((!strncmp(url, "/v1/", 4) || routes_keyed(c->route)) && !authorized(c)) {
        api_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                      "Incorrect or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'");
        return http_reply_error(c, &e);
    }
    if ((c->route == ROUTE_STATS || c->route == ROUTE_METRICS) && s->o.metrics_key &&
        !key_presented(c, s->o.metrics_key)) {
        api_error_set(&e, 401, "invalid_request_error", "invalid_api_key", NULL,
                      "%s needs the metrics key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'", url);
        return http_reply_error(c, &e);
    }
    if (!strcmp(method, "POST") && body_object_check(&c->body, &e))
        return http_reply_error(c, &e);
    return routes_dispatch(c, method, url);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **ctx, enum MHD_RequestTerminationCode toe)
{
    tern_server *s = cls;
    srv_conn *c = *ctx;
    if (!c)
        return;
    if (!c->replied)
        metrics_count_response(s, c->route, 0);
    access_end(c, toe);
    /* the next request on this keep-alive connection gets the idle timeout and read deadlines back */
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)s->o.header_timeout_s);
    srv_guard_reply_done(s, mc);
    api_buf_free(&c->body);
    free(c);
    *ctx = NULL;
}

/* MHD's own messages are about clients (resets, timeouts, bad requests):
 * debug-level noise, never server errors. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (tern_log_get_level() > TERN_LOG_DEBUG)
        return;
    char buf[512];
    vsnprintf(buf, sizeof buf, fmt, ap);
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = 0;
    TERN_DEBUG("http: %s", buf);
}

/* Whether the bound address is reachable only from this machine. */
static int loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) ||
               (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

static int resolve(const char *host, int port, struct sockaddr_storage *ss, socklen_t *len, tern_err *err)
{
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &res);
    if (rc || !res)
        return tern_err_set(err, TERN_EINVAL, "cannot resolve host '%s': %s", host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

tern_server *server_start(const server_opts *o, tern_model *m, const tern_tokenizer *tok, tern_engine *e,
                          tern_err *err)
{
    tern_server *s = calloc(1, sizeof *s);
    if (!s) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    s->o = *o;
    s->host = strdup(o->host ? o->host : "127.0.0.1");
    s->api_key = o->api_key && o->api_key[0] ? strdup(o->api_key) : NULL;
    s->cors = o->cors_origin && o->cors_origin[0] ? strdup(o->cors_origin) : NULL;
    s->o.metrics_key = o->metrics_key && o->metrics_key[0] ? strdup(o->metrics_key) : NULL; /* freed in server_free */
    s->o.host = s->host;
    s->o.api_key = s->api_key;
    s->o.cors_origin = s->cors;
    s->started = (long long)time(NULL);
    pthread_mutex_init(&s->wk_mu, NULL);
    adapters_init(s);
    if (s->o.max_connections < 2)
        s->o.max_connections = 2;
    if (s->o.max_client_connections < 0)
        s->o.max_client_connections = s->o.max_connections / 2;
    if (s->o.reserve_connections < 0)
        s->o.reserve_connections = s->o.max_connections / 8 > 1 ? s->o.max_connections / 8 : 1;
    if (s->o.compile_queue < 0)
        s->o.compile_queue = s->o.max_connections;
    if (s->o.reserve_connections >= s->o.max_connections)
        s->o.reserve_connections = s->o.max_connections - 1;
    if (!s->host || (o->api_key && o->api_key[0] && !s->api_key) ||
        (o->metrics_key && o->metrics_key[0] && !s->o.metrics_key)) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    if (o->tool_call_format) { /* kept as the format's own (static) name: the loader reads it later */
        const toolfmt *f = toolfmt_by_name(o->tool_call_format);
        if (!f) {
            tern_err_set(err, TERN_EINVAL, "unknown tool-call format '%s' (one of %s)", o->tool_call_format,
                         toolfmt_names());
            goto fail;
        }
        s->o.tool_call_format = f->name;
    }
    s->o.model_name = o->model_name;
    s->o.model_dir = o->model_dir;
    s->o.models = o->models;
    int rc = models_init(s, m, tok, e, err); /* reads the caller's strings; keeps copies */
    s->o.model_name = s->o.model_dir = NULL;
    s->o.models = NULL;
    if (rc)
        goto fail;
    for (int i = 0; i < o->n_loras; i++)
        if (adapters_add_spec(s, o->loras[i], err))
            goto fail;
    s->o.loras = NULL;
    struct sockaddr_storage ss;
    socklen_t sl;
    if (resolve(s->host, o->port, &ss, &sl, err))
        goto fail;
    if (srv_guard_start(s, err) ||
        srv_compile_pool_start(s, s->o.compile_threads, s->o.compile_queue, s->o.compile_time_limit_ms, err))
        goto fail;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                     MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, (uint16_t)o->port, srv_guard_accept, s, on_request, s,
                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                            MHD_OPTION_NOTIFY_CONNECTION, srv_guard_notify, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)o->header_timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_connections,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, o->max_header_bytes,
                            MHD_OPTION_END);
    if (!s->d) {
        tern_err_set(err, TERN_EIO, "cannot listen on %s:%d (address in use or not allowed?)", s->host, o->port);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    if (!s->api_key && !loopback(&ss))
        TERN_WARN("server: listening on %s with no --api-key: anyone who can reach this address can use the model",
                  s->host);
    return s;
fail:
    server_free(s);
    return NULL;
}

int server_port(const tern_server *s) { return s ? s->port : 0; }

void server_stop(tern_server *s)
{
    if (!s || !s->d)
        return;
    atomic_store(&s->stopping, 1);
    srv_compile_pool_cancel_all(s); /* a compile never holds up the stop */
    srv_guard_stop(s);
    models_wake(s); /* requests waiting for a load give up */
    MHD_stop_daemon(s->d); /* joins every connection thread; their waits see `stopping` */
    s->d = NULL;
    srv_compile_pool_free(s);
}

void server_free(tern_server *s)
{
    if (!s)
        return;
    server_stop(s);
    models_free(s); /* the pool's engines first: they may still poke wakers */
    adapters_free(s);
    srv_compile_pool_free(s); /* when MHD never started */
    srv_guard_free(s);
    srv_wakers_free(s);
    responses_server_free(s);
    pthread_mutex_destroy(&s->wk_mu);
    free(s->host);
    free(s->api_key);
    free(s->cors);
    free((char *)s->o.metrics_key);
    free(s);
}
