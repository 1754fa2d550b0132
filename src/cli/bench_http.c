/* tern bench --compare URL: the same load against another OpenAI-compatible
 * server (llama-server, vLLM, another tern) over plain HTTP/1.1. Each of
 * `concurrency` client threads posts streamed chat completions one after
 * another; a content chunk is a delivery (stamped on arrival), the final
 * usage chunk gives the token count. The constraints go as the servers
 * spell them: response_format json_schema, vLLM's guided_regex and
 * guided_choice, and the schema as vLLM's structured_outputs with
 * disable_any_whitespace (compact JSON, as the engine cells compile it:
 * response_format would let a weak model spend its tokens on blanks). A
 * server that ignores a field produces outputs that fail the checks: a
 * failed cell, as it should be. */
#include <json-c/json.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/json.h"
#include "base/log.h"
#include "base/strbuf.h"
#include "bench.h"

/* Slowest tolerated silence from the server; past it the request fails. */
#define HTTP_TIMEOUT_S 120

int bench_http_open(bench_http *h, const char *url, tern_err *err);

static int http_connect(const bench_http *h, tern_err *err)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(h->host, h->port, &hints, &ai);
    if (rc)
        return tern_err_set(err, TERN_EIO, "cannot resolve %s: %s", h->host, gai_strerror(rc));
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0)
            continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return tern_err_set(err, TERN_EIO, "cannot connect to %s:%s", h->host, h->port);
    struct timeval tv = {HTTP_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* ---- a buffered reader over the socket ---- */

typedef struct reader {
    int fd;
    char buf[16384];
    size_t pos, len;
} reader;

static int rd_fill(reader *r)
{
    if (r->pos < r->len)
        return 1;
    ssize_t n = recv(r->fd, r->buf, sizeof r->buf, 0);
    if (n <= 0)
        return 0;
    r->pos = 0;
    r->len = (size_t)n;
    return 1;
}

/* A line without its CRLF into out (truncated to cap - 1); 0 at EOF. */
static int rd_line(reader *r, char *out, size_t cap)
{
    size_t k = 0;
    for (;;) {
        if (!rd_fill(r))
            return 0;
        char c = r->buf[r->pos++];
        if (c == '\n')
            break;
        if (c != '\r' && k + 1 < cap)
            out[k++] = c;
    }
    out[k] = 0;
    return 1;
}

/* The body, de-chunked when needed, handed to sink piece by piece as it
 * arrives. Returns the HTTP status (0 if none could be read). */
typedef void (*body_sink)(void *user, const char *p, size_t n);

static int http_exchange(const bench_http *h, const char *method, const char *path, const char *body,
                         body_sink sink, void *user, tern_err *err)
{
    int fd = http_connect(h, err);
    if (fd < 0)
        return 0;
    tern_sbuf rq = {0};
    char head[1024];
    size_t blen = body ? strlen(body) : 0;
    snprintf(head, sizeof head,
             "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\nAccept: text/event-stream, application/json\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             method, h->base, path, h->host, h->port, blen);
    tern_sbuf_str(&rq, head);
    if (body)
        tern_sbuf_put(&rq, body, blen);
    int status = 0;
    if (rq.oom) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t off = 0; off < rq.n;) {
        ssize_t n = send(fd, rq.s + off, rq.n - off, MSG_NOSIGNAL);
        if (n <= 0) {
            tern_err_set(err, TERN_EIO, "cannot send the request");
            goto out;
        }
        off += (size_t)n;
    }
    reader *r = malloc(sizeof *r);
    if (!r)
        goto out;
    r->fd = fd;
    r->pos = r->len = 0;
    char line[1024];
    if (!rd_line(r, line, sizeof line) || sscanf(line, "HTTP/%*s %d", &status) != 1) {
        tern_err_set(err, TERN_EIO, "no HTTP response");
        status = 0;
        goto out_r;
    }
    int chunked = 0;
    long long clen = -1;
    while (rd_line(r, line, sizeof line) && line[0]) {
        if (!strncasecmp(line, "transfer-encoding:", 18) && strcasestr(line, "chunked"))
            chunked = 1;
        else if (!strncasecmp(line, "content-length:", 15))
            clen = atoll(line + 15);
    }
    for (;;) {
        long long want = -1; /* bytes of this piece; -1 = to EOF */
        if (chunked) {
            if (!rd_line(r, line, sizeof line))
                break;
            want = strtoll(line, NULL, 16);
            if (want <= 0)
                break;
        } else if (clen >= 0) {
            want = clen;
        }
        while (want != 0 && rd_fill(r)) {
            size_t n = r->len - r->pos;
            if (want > 0 && (long long)n > want)
                n = (size_t)want;
            sink(user, r->buf + r->pos, n);
            r->pos += n;
            if (want > 0)
                want -= (long long)n;
        }
        if (!chunked)
            break;
        rd_line(r, line, sizeof line); /* the CRLF after the chunk */
    }
out_r:
    free(r);
out:
    free(rq.s);
    close(fd);
    return status;
}

/* ---- GET /v1/models ---- */

static void sink_buf(void *user, const char *p, size_t n)
{
    tern_sbuf_put(user, p, n);
}

int bench_http_open(bench_http *h, const char *url, tern_err *err)
{
    memset(h, 0, sizeof *h);
    if (strncmp(url, "http://", 7))
        return tern_err_set(err, TERN_EINVAL, "--compare needs an http:// URL (got '%s')", url);
    const char *p = url + 7, *slash = strchr(p, '/');
    size_t hl = slash ? (size_t)(slash - p) : strlen(p);
    char hp[256];
    if (hl == 0 || hl >= sizeof hp)
        return tern_err_set(err, TERN_EINVAL, "--compare: no host in '%s'", url);
    memcpy(hp, p, hl);
    hp[hl] = 0;
    char *colon = hp[0] == '[' ? strstr(hp, "]:") : strrchr(hp, ':');
    if (colon) {
        int v6 = hp[0] == '[';
        snprintf(h->port, sizeof h->port, "%s", colon + (v6 ? 2 : 1));
        *(colon + (v6 ? 1 : 0)) = 0;
    } else {
        snprintf(h->port, sizeof h->port, "80");
    }
    if (hp[0] == '[') { /* [::1] */
        size_t l = strlen(hp);
        if (hp[l - 1] == ']')
            hp[l - 1] = 0;
        snprintf(h->host, sizeof h->host, "%.254s", hp + 1);
    } else {
        snprintf(h->host, sizeof h->host, "%.255s", hp);
    }
    snprintf(h->base, sizeof h->base, "%s", slash ? slash : "");
    size_t bl = strlen(h->base);
    while (bl && h->base[bl - 1] == '/')
        h->base[--bl] = 0;
    if (bl >= 3 && !strcmp(h->base + bl - 3, "/v1"))
        h->base[bl - 3] = 0;
    tern_sbuf body = {0};
    int status = http_exchange(h, "GET", "/v1/models", NULL, sink_buf, &body, err);
    int rc = 0;
    json_object *o = status == 200 && body.n ? tern_json_parse(body.s, body.n, err) : NULL, *data, *id;
    if (status == 0) {
        rc = err->code ? err->code : TERN_EIO;
    } else if (!o || !json_object_object_get_ex(o, "data", &data) || json_object_array_length(data) < 1 ||
               !json_object_object_get_ex(json_object_array_get_idx(data, 0), "id", &id)) {
        rc = tern_err_set(err, TERN_EFORMAT, "%s: GET /v1/models answered %d without a model", url, status);
    } else {
        snprintf(h->model, sizeof h->model, "%s", json_object_get_string(id));
    }
    json_object_put(o);
    free(body.s);
    return rc;
}

/* ---- streamed chat completions ---- */

typedef struct sse_req {
    tern_sbuf line, text;
    double t_first, t_last;
    int n_deliveries;
    long long completion_tokens; /* from the usage chunk; -1 if none came */
    char error[256];
} sse_req;

static void sse_data(sse_req *q, const char *p, size_t n)
{
    if (n == 6 && !memcmp(p, "[DONE]", 6))
        return;
    json_object *o = json_tokener_parse(p), *v, *ch, *delta, *content, *u, *ct;
    (void)n;
    if (!o)
        return;
    if (json_object_object_get_ex(o, "error", &v) && !q->error[0])
        snprintf(q->error, sizeof q->error, "server error: %.200s", json_object_to_json_string(v));
    if (json_object_object_get_ex(o, "choices", &ch) && json_object_array_length(ch) > 0 &&
        json_object_object_get_ex(json_object_array_get_idx(ch, 0), "delta", &delta)) {
        /* a thinking model's reasoning streams as tokens too; only content is checked */
        int text = json_object_object_get_ex(delta, "content", &content) &&
                   json_object_is_type(content, json_type_string) && json_object_get_string_len(content) > 0;
        int reasoning = (json_object_object_get_ex(delta, "reasoning_content", &v) ||
                         json_object_object_get_ex(delta, "reasoning", &v)) &&
                        json_object_is_type(v, json_type_string) && json_object_get_string_len(v) > 0;
        if (text || reasoning) {
            double t = tern_time_s();
            if (!q->n_deliveries++)
                q->t_first = t;
            q->t_last = t;
        }
        if (text)
            tern_sbuf_put(&q->text, json_object_get_string(content), (size_t)json_object_get_string_len(content));
    }
    if (json_object_object_get_ex(o, "usage", &u) && json_object_is_type(u, json_type_object) &&
        json_object_object_get_ex(u, "completion_tokens", &ct))
        q->completion_tokens = json_object_get_int64(ct);
    json_object_put(o);
}

static void sink_sse(void *user, const char *p, size_t n)
{
    sse_req *q = user;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            tern_sbuf_put(&q->line, p + i, 1);
            continue;
        }
        if (q->line.n && q->line.s[q->line.n - 1] == '\r')
            q->line.s[--q->line.n] = 0;
        if (q->line.n > 5 && !strncmp(q->line.s, "data:", 5)) {
            const char *d = q->line.s + 5;
            while (*d == ' ')
                d++;
            sse_data(q, d, strlen(d));
        } else if (q->line.n && q->line.s[0] == '{') { /* a non-streamed error body */
            sse_data(q, q->line.s, q->line.n);
        }
        q->line.n = 0;
        if (q->line.s)
            q->line.s[0] = 0;
    }
}

static char *request_body(const bench_http *h, bench_feature f, int idx, int max_tokens)
{
    json_object *o = json_object_new_object(), *msgs = json_object_new_array();
    json_object *sys = json_object_new_object(), *usr = json_object_new_object(), *so = json_object_new_object();
    json_object_object_add(o, "model", json_object_new_string(h->model));
    json_object_object_add(sys, "role", json_object_new_string("system"));
    json_object_object_add(sys, "content", json_object_new_string(bench_system_prompt()));
    json_object_object_add(usr, "role", json_object_new_string("user"));
    json_object_object_add(usr, "content", json_object_new_string(bench_message(idx)));
    json_object_array_add(msgs, sys);
    json_object_array_add(msgs, usr);
    json_object_object_add(o, "messages", msgs);
    json_object_object_add(o, "max_tokens", json_object_new_int(max_tokens));
    json_object_object_add(o, "temperature", json_object_new_double(0));
    json_object_object_add(o, "stream", json_object_new_boolean(1));
    json_object_object_add(so, "include_usage", json_object_new_boolean(1));
    json_object_object_add(o, "stream_options", so);
    const char *spec = bench_feature_spec(f);
    if (f == BENCH_PLAIN) {
        json_object_object_add(o, "ignore_eos", json_object_new_boolean(1));
    } else if (f == BENCH_JSON) { /* compact, as the engine cells compile it */
        json_object *so2 = json_object_new_object();
        json_object_object_add(so2, "json", json_tokener_parse(spec));
        json_object_object_add(so2, "disable_any_whitespace", json_object_new_boolean(1));
        json_object_object_add(o, "structured_outputs", so2);
    } else if (f == BENCH_REGEX) {
        json_object_object_add(o, "guided_regex", json_object_new_string(spec));
    } else {
        json_object_object_add(o, "guided_choice", json_tokener_parse(spec));
    }
    char *s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return s;
}

typedef struct http_run {
    bench_http *h;
    bench_cell *cell;
    int n_requests, max_tokens, next;
    pthread_mutex_t mu;
    double *ttft, *itl, t_end;
    int n_ttft, n_itl;
} http_run;

static void run_fail(http_run *hr, const char *why)
{
    hr->cell->r.n_failed++;
    if (!hr->cell->r.error[0])
        snprintf(hr->cell->r.error, sizeof hr->cell->r.error, "%.200s", why);
}

static void *client_main(void *arg)
{
    http_run *hr = arg;
    for (;;) {
        pthread_mutex_lock(&hr->mu);
        int idx = hr->next < hr->n_requests ? hr->next++ : -1;
        if (idx >= 0)
            hr->cell->r.n_requests++;
        pthread_mutex_unlock(&hr->mu);
        if (idx < 0)
            return NULL;
        sse_req q = {0};
        q.completion_tokens = -1;
        tern_err err = {0};
        char *body = request_body(hr->h, hr->cell->feature, idx, hr->max_tokens);
        double t0 = tern_time_s();
        int status = body ? http_exchange(hr->h, "POST", "/v1/chat/completions", body, sink_sse, &q, &err) : 0;
        double t1 = tern_time_s();
        free(body);
        char why[300];
        pthread_mutex_lock(&hr->mu);
        if (t1 > hr->t_end)
            hr->t_end = t1;
        if (status != 200) {
            snprintf(why, sizeof why, "HTTP %d %.200s", status, q.error[0] ? q.error : err.msg);
            run_fail(hr, why);
        } else if (q.error[0]) {
            run_fail(hr, q.error);
        } else if (q.n_deliveries == 0) {
            run_fail(hr, "no content streamed");
        } else if (bench_output_check(hr->cell->feature, q.text.s, q.text.n, why, sizeof why)) {
            hr->cell->r.n_invalid++;
            run_fail(hr, why);
        } else {
            long long ntok = q.completion_tokens >= 0 ? q.completion_tokens : q.n_deliveries;
            hr->cell->r.n_tokens += ntok;
            hr->ttft[hr->n_ttft++] = q.t_first - t0;
            if (ntok > 1)
                hr->itl[hr->n_itl++] = (q.t_last - q.t_first) / (double)(ntok - 1);
        }
        pthread_mutex_unlock(&hr->mu);
        free(q.line.s);
        free(q.text.s);
    }
}

int bench_http_run(bench_http *h, bench_cell *cell, const bench_load *load, tern_err *err)
{
    bench_result *r = &cell->r;
    memset(r, 0, sizeof *r);
    r->grammar_us_per_token = -1;
    http_run hr = {.h = h, .cell = cell, .n_requests = load->n_requests};
    hr.max_tokens = cell->feature != BENCH_PLAIN && load->max_tokens < 64 ? 64 : load->max_tokens;
    pthread_mutex_init(&hr.mu, NULL);
    hr.ttft = calloc((size_t)load->n_requests, sizeof *hr.ttft);
    hr.itl = calloc((size_t)load->n_requests, sizeof *hr.itl);
    pthread_t *th = calloc((size_t)cell->concurrency, sizeof *th);
    int n_th = 0, rc = 0;
    if (!hr.ttft || !hr.itl || !th) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    { /* prime the server's prefix cache with the shared prompt, as the engine's warm cells are */
        sse_req q = {0};
        tern_err pe = {0};
        char *body = request_body(h, BENCH_PLAIN, 0, 1);
        if (body)
            http_exchange(h, "POST", "/v1/chat/completions", body, sink_sse, &q, &pe);
        free(body);
        free(q.line.s);
        free(q.text.s);
    }
    double t0 = tern_time_s();
    hr.t_end = t0;
    for (; n_th < cell->concurrency; n_th++)
        if (pthread_create(&th[n_th], NULL, client_main, &hr))
            break;
    for (int i = 0; i < n_th; i++)
        pthread_join(th[i], NULL);
    if (n_th == 0) {
        rc = tern_err_set(err, TERN_ENOMEM, "cannot start a client thread");
        goto out;
    }
    r->wall_s = hr.t_end - t0;
    r->tok_s = r->wall_s > 0 ? r->n_tokens / r->wall_s : 0;
    r->ttft_p50 = bench_quantile(hr.ttft, hr.n_ttft, 0.5);
    r->ttft_p99 = bench_quantile(hr.ttft, hr.n_ttft, 0.99);
    r->itl_p50 = bench_quantile(hr.itl, hr.n_itl, 0.5);
    r->itl_p99 = bench_quantile(hr.itl, hr.n_itl, 0.99);
out:
    if (rc) {
        snprintf(r->error, sizeof r->error, "%.200s", err->msg);
        r->n_requests = r->n_failed = load->n_requests;
    }
    free(th);
    free(hr.ttft);
    free(hr.itl);
    pthread_mutex_destroy(&hr.mu);
    cell->done = 1;
    return rc;
}
