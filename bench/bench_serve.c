/* bench_serve: served throughput of any OpenAI-compatible server (tern
 * serve, llama-server, vLLM) under chat traffic - the load generator of
 * docs/benchmarks.md "Served throughput". For each client count, that many
 * clients post streamed chat completions back to back for a fixed time;
 * the lengths come from a seeded log-normal distribution (ShareGPT-like),
 * each request decodes exactly its max_tokens (ignore_eos). Writes
 * serve.json, serve.md and gnuplot plots; --compare lays several runs'
 * serve.json side by side.
 *
 *   bench_serve --url http://HOST:PORT [--clients 1,8,32,64,128] [--duration 15] [--out DIR] ...
 *   bench_serve --compare A/serve.json B/serve.json ... --out DIR
 *
 * Counting. A content chunk is a delivery stamped on arrival; the usage
 * chunk gives a finished request's prompt and completion tokens. At the
 * deadline the clients close their connections (the server cancels those
 * requests): their tokens are the chunks they received, exact when a chunk
 * is a token (bench/serve_fixture.py makes it so for random-weight models;
 * chunks_per_token over the finished requests says how close a run came).
 * --drain instead lets every request in flight finish, so the server's own
 * counters must equal ours to the token (tests/server/serve_bench.py). */
#include <json-c/json.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/rng.h"
#include "base/strbuf.h"

/* ---- the workload ---- */

typedef struct serve_dist {
    double median, sigma; /* log-normal: exp(N(ln median, sigma)) */
    int min, max;         /* clipped to [min, max] */
} serve_dist;

typedef struct serve_opts {
    char host[256], port[16], model[256], label[128];
    int chat;             /* 1: /v1/chat/completions, 0: /v1/completions */
    int clients[32], n_levels;
    double duration_s, temperature;
    int drain;            /* let requests in flight at the deadline finish */
    int ignore_eos;
    uint64_t seed;
    serve_dist in, out;   /* prompt and output tokens */
    const char *out_dir;
} serve_opts;

/* Prompt words: common English, so a word is about one token on a real
 * vocabulary; the calibration measures what it is on the server's. */
static const char *const WORDS[] = {
    "the", "quick", "answer", "would", "help", "people", "write", "better", "code", "today", "when", "their",
    "river", "city", "night", "water", "light", "story", "small", "world", "under", "house", "music", "paper",
    "green", "table", "family", "garden", "morning", "letter", "simple", "question", "market", "window", "travel",
    "friend", "country", "summer", "system", "number", "school", "mountain", "history", "energy", "science",
    "health", "money", "power", "change", "problem", "learn", "travel", "plan", "explain", "how", "why", "what",
    "make", "build", "keep", "find", "think", "about", "over", "after", "before", "because", "every", "great"};
#define N_WORDS ((int)(sizeof WORDS / sizeof WORDS[0]))

static const char *SYSTEM_PROMPT = "You are a helpful assistant. Answer the user's question clearly, in full "
                                   "sentences, with examples where they help.";

/* A standard normal draw (Box-Muller) from the stream. */
static double rng_normal(tern_rng *r)
{
    double u1 = (tern_rng_u32(r) + 1.0) / 4294967297.0, u2 = tern_rng_u32(r) / 4294967296.0;
    return sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
}

static int dist_draw(const serve_dist *d, tern_rng *r)
{
    double v = exp(log(d->median) + d->sigma * rng_normal(r));
    int n = (int)lround(v);
    return n < d->min ? d->min : n > d->max ? d->max : n;
}

/* Request k of a level: its target prompt and output tokens and its word
 * stream, the same for every server (seed, k). */
typedef struct serve_job {
    int k, in_tokens, max_tokens;
    tern_rng words;
} serve_job;

static serve_job job_make(const serve_opts *o, int k)
{
    serve_job j = {.k = k};
    tern_rng r;
    tern_rng_seed(&r, o->seed, (uint64_t)k + 1);
    j.in_tokens = dist_draw(&o->in, &r);
    j.max_tokens = dist_draw(&o->out, &r);
    j.words = r;
    return j;
}

/* ---- HTTP ---- */

typedef struct serve_req {
    tern_sbuf line;
    double t_start, t_first, t_last, t_end;
    int n_chunks, status, http_status;  /* status: 0 running, 1 done, 2 aborted, 3 failed */
    long long prompt_tokens, completion_tokens; /* from usage; -1 if none came */
    double *gaps;                       /* inter-chunk gaps, seconds (owned) */
    int n_gaps, cap_gaps;
    char error[200];
} serve_req;

enum { REQ_RUNNING = 0, REQ_DONE, REQ_ABORTED, REQ_FAILED };

static int http_connect(const serve_opts *o)
{
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(o->host, o->port, &hints, &ai))
        return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    return fd;
}

static void req_gap(serve_req *q, double g)
{
    if (q->n_gaps == q->cap_gaps) {
        int cap = q->cap_gaps ? 2 * q->cap_gaps : 256;
        double *p = realloc(q->gaps, (size_t)cap * sizeof *p);
        if (!p)
            return;
        q->gaps = p;
        q->cap_gaps = cap;
    }
    q->gaps[q->n_gaps++] = g;
}

/* One SSE data payload of a streamed completion. */
static void req_data(serve_req *q, const char *p, double t)
{
    if (!strcmp(p, "[DONE]"))
        return;
    json_object *o = json_tokener_parse(p), *v, *ch, *c0, *u;
    if (!o) {
        snprintf(q->error, sizeof q->error, "unparsable chunk: %.120s", p);
        return;
    }
    if (json_object_object_get_ex(o, "error", &v) && !q->error[0])
        snprintf(q->error, sizeof q->error, "server error: %.160s", json_object_to_json_string(v));
    if (json_object_object_get_ex(o, "choices", &ch) && json_object_array_length(ch) > 0) {
        c0 = json_object_array_get_idx(ch, 0);
        json_object *delta, *text = NULL;
        if (json_object_object_get_ex(c0, "delta", &delta)) { /* chat: content, or a thinking model's reasoning */
            if (!json_object_object_get_ex(delta, "content", &text) || !json_object_get_string_len(text))
                if (!json_object_object_get_ex(delta, "reasoning_content", &text))
                    json_object_object_get_ex(delta, "reasoning", &text);
        } else {
            json_object_object_get_ex(c0, "text", &text);
        }
        if (text && json_object_is_type(text, json_type_string) && json_object_get_string_len(text) > 0) {
            if (q->n_chunks++ == 0)
                q->t_first = t;
            else
                req_gap(q, t - q->t_last);
            q->t_last = t;
        }
    }
    if (json_object_object_get_ex(o, "usage", &u) && json_object_is_type(u, json_type_object)) {
        if (json_object_object_get_ex(u, "completion_tokens", &v))
            q->completion_tokens = json_object_get_int64(v);
        if (json_object_object_get_ex(u, "prompt_tokens", &v))
            q->prompt_tokens = json_object_get_int64(v);
    }
    json_object_put(o);
}

/* Body bytes (already de-chunked) split into SSE lines. */
static void req_body(serve_req *q, const char *p, size_t n, double t)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '\n') {
            tern_sbuf_put(&q->line, p + i, 1);
            continue;
        }
        if (q->line.n && q->line.s[q->line.n - 1] == '\r')
            q->line.s[--q->line.n] = 0;
        if (q->line.n > 5 && !strncmp(q->line.s, "data:", 5))
            req_data(q, q->line.s + 5 + (q->line.s[5] == ' '), t);
        else if (q->line.n && q->line.s[0] == '{') /* an error answered as plain JSON */
            req_data(q, q->line.s, t);
        q->line.n = 0;
        if (q->line.s)
            q->line.s[0] = 0;
    }
}

/* Posts body to path and reads the streamed answer into q until the server
 * closes, or until deadline (seconds, tern_time_s clock; <= 0 none), when
 * the connection is closed and q is aborted. */
static void http_post(const serve_opts *o, const char *path, const char *body, double deadline, serve_req *q)
{
    q->prompt_tokens = q->completion_tokens = -1;
    q->t_start = tern_time_s();
    int fd = http_connect(o);
    if (fd < 0) {
        q->status = REQ_FAILED;
        snprintf(q->error, sizeof q->error, "cannot connect to %.150s:%s", o->host, o->port);
        return;
    }
    tern_sbuf rq = {0};
    char head[768];
    size_t blen = strlen(body);
    snprintf(head, sizeof head,
             "POST %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\nAccept: text/event-stream\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
             path, o->host, o->port, blen);
    tern_sbuf_str(&rq, head);
    tern_sbuf_put(&rq, body, blen);
    for (size_t off = 0; !rq.oom && off < rq.n;) {
        ssize_t n = send(fd, rq.s + off, rq.n - off, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        off += (size_t)n;
    }
    free(rq.s);
    /* the response: status line and headers, then the body, de-chunked when chunked */
    static const size_t CAP = 65536;
    char *buf = malloc(CAP);
    size_t have = 0, pos = 0;
    int in_head = 1, chunked = 0;
    long long chunk_left = -1; /* bytes left of the current chunk; -1 = at a size line */
    tern_sbuf hline = {0};
    for (;;) {
        if (!buf)
            break;
        if (pos == have) {
            double left = deadline > 0 ? deadline - tern_time_s() : 600;
            if (left <= 0 && q->status == REQ_RUNNING) {
                q->status = REQ_ABORTED;
                break;
            }
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            int pr = poll(&pf, 1, (int)(left * 1000) + 1);
            if (pr == 0)
                continue;
            ssize_t n = pr > 0 ? recv(fd, buf, CAP, 0) : -1;
            if (n <= 0)
                break;
            have = (size_t)n;
            pos = 0;
        }
        double t = tern_time_s();
        if (in_head) { /* header lines, one byte at a time (small) */
            char c = buf[pos++];
            if (c == '\r')
                continue;
            if (c != '\n') {
                tern_sbuf_put(&hline, &c, 1);
                continue;
            }
            if (!hline.n) {
                in_head = 0;
            } else if (!q->http_status) {
                sscanf(hline.s, "HTTP/%*s %d", &q->http_status);
            } else if (!strncasecmp(hline.s, "transfer-encoding:", 18) && strcasestr(hline.s, "chunked")) {
                chunked = 1;
            }
            hline.n = 0;
            if (hline.s)
                hline.s[0] = 0;
            continue;
        }
        if (!chunked) {
            req_body(q, buf + pos, have - pos, t);
            pos = have;
            continue;
        }
        if (chunk_left < 0) { /* a size line (or the CRLF closing a chunk) */
            char c = buf[pos++];
            if (c == '\r')
                continue;
            if (c != '\n') {
                tern_sbuf_put(&hline, &c, 1);
                continue;
            }
            if (hline.n) {
                chunk_left = strtoll(hline.s, NULL, 16);
                if (chunk_left == 0)
                    break; /* the last chunk */
            }
            hline.n = 0;
            if (hline.s)
                hline.s[0] = 0;
            continue;
        }
        size_t n = have - pos;
        if ((long long)n > chunk_left)
            n = (size_t)chunk_left;
        req_body(q, buf + pos, n, t);
        pos += n;
        chunk_left -= (long long)n;
        if (chunk_left == 0)
            chunk_left = -1;
    }
    free(buf);
    free(hline.s);
    close(fd);
    q->t_end = tern_time_s();
    if (q->line.n && q->status != REQ_ABORTED)
        req_body(q, "\n", 1, q->t_end); /* a body that does not end in a newline (a JSON error) */
    if (q->status == REQ_ABORTED)
        return;
    if (q->http_status != 200 && !q->error[0])
        snprintf(q->error, sizeof q->error, "HTTP %d", q->http_status);
    q->status = q->error[0] || q->completion_tokens < 0 ? REQ_FAILED : REQ_DONE;
    if (q->status == REQ_FAILED && !q->error[0])
        snprintf(q->error, sizeof q->error, "no usage chunk (does the server take stream_options.include_usage?)");
}

/* The request body of a job; words: how many prompt words (the calibration's estimate). */
static char *job_body(const serve_opts *o, serve_job *j, int words, int max_tokens)
{
    tern_sbuf text = {0};
    for (int w = 0; w < words; w++) {
        tern_sbuf_str(&text, w ? " " : "");
        tern_sbuf_str(&text, WORDS[tern_rng_u32(&j->words) % N_WORDS]);
    }
    json_object *b = json_object_new_object(), *so = json_object_new_object();
    if (o->model[0])
        json_object_object_add(b, "model", json_object_new_string(o->model));
    if (o->chat) {
        json_object *msgs = json_object_new_array(), *sys = json_object_new_object(), *usr = json_object_new_object();
        json_object_object_add(sys, "role", json_object_new_string("system"));
        json_object_object_add(sys, "content", json_object_new_string(SYSTEM_PROMPT));
        json_object_object_add(usr, "role", json_object_new_string("user"));
        json_object_object_add(usr, "content", json_object_new_string(text.s ? text.s : ""));
        json_object_array_add(msgs, sys);
        json_object_array_add(msgs, usr);
        json_object_object_add(b, "messages", msgs);
    } else {
        tern_sbuf p = {0};
        tern_sbuf_str(&p, SYSTEM_PROMPT);
        tern_sbuf_str(&p, "\n\n");
        tern_sbuf_str(&p, text.s ? text.s : "");
        json_object_object_add(b, "prompt", json_object_new_string(p.s));
        free(p.s);
    }
    json_object_object_add(b, "max_tokens", json_object_new_int(max_tokens));
    json_object_object_add(b, "temperature", json_object_new_double(o->temperature));
    if (o->ignore_eos)
        json_object_object_add(b, "ignore_eos", json_object_new_boolean(1));
    json_object_object_add(b, "stream", json_object_new_boolean(1));
    json_object_object_add(so, "include_usage", json_object_new_boolean(1));
    json_object_object_add(b, "stream_options", so);
    char *s = strdup(json_object_to_json_string_ext(b, JSON_C_TO_STRING_PLAIN));
    json_object_put(b);
    free(text.s);
    return s;
}

/* ---- a level: n clients for a duration ---- */

typedef struct serve_level {
    int clients;
    double t0, window_s;                /* from the first request to the deadline (drain: to the last end) */
    serve_req *reqs;                    /* [n_reqs], in start order */
    int *max_tokens, *in_target;        /* per request */
    int n_reqs, cap_reqs;
} serve_level;

typedef struct serve_run {
    const serve_opts *o;
    serve_level *lv;
    double deadline, tok_per_word, overhead; /* the calibration */
    long long sent_requests, sent_prompt, sent_completion; /* every request of the run, calibration included */
    pthread_mutex_t mu;
} serve_run;

static int words_for(const serve_run *r, int tokens)
{
    int w = (int)lround((tokens - r->overhead) / r->tok_per_word);
    return w < 1 ? 1 : w;
}

static void run_account(serve_run *r, const serve_req *q)
{
    r->sent_requests++;
    if (q->prompt_tokens > 0)
        r->sent_prompt += q->prompt_tokens;
    if (q->completion_tokens > 0)
        r->sent_completion += q->completion_tokens;
}

static void *client_main(void *arg)
{
    serve_run *r = arg;
    const char *path = r->o->chat ? "/v1/chat/completions" : "/v1/completions";
    for (;;) {
        pthread_mutex_lock(&r->mu);
        serve_level *lv = r->lv;
        int k = -1;
        if (tern_time_s() < r->deadline && lv->n_reqs < lv->cap_reqs)
            k = lv->n_reqs++;
        pthread_mutex_unlock(&r->mu);
        if (k < 0)
            return NULL;
        serve_job j = job_make(r->o, k);
        char *body = job_body(r->o, &j, words_for(r, j.in_tokens), j.max_tokens);
        serve_req q = {0};
        http_post(r->o, path, body, r->o->drain ? 0 : r->deadline, &q);
        free(body);
        free(q.line.s);
        q.line = (tern_sbuf){0};
        pthread_mutex_lock(&r->mu);
        lv->reqs[k] = q;
        lv->max_tokens[k] = j.max_tokens;
        lv->in_target[k] = j.in_tokens;
        run_account(r, &q);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Prompt tokens of a one-token request with `words` words (calibration). */
static long long probe(serve_run *r, int words, char *why, size_t cap)
{
    serve_job j = job_make(r->o, 1 << 30);
    char *body = job_body(r->o, &j, words, 1);
    serve_req q = {0};
    http_post(r->o, r->o->chat ? "/v1/chat/completions" : "/v1/completions", body, 0, &q);
    free(body);
    run_account(r, &q);
    if (q.status != REQ_DONE || q.prompt_tokens <= 0)
        snprintf(why, cap, "%s", q.error[0] ? q.error : "no prompt_tokens in the usage chunk");
    free(q.line.s);
    free(q.gaps);
    return q.status == REQ_DONE ? q.prompt_tokens : -1;
}

static int level_run(serve_run *r, serve_level *lv)
{
    /* at most one request per client per 20 ms of the window, plenty (a request takes >= 1 step) */
    lv->cap_reqs = lv->clients * (int)(r->o->duration_s * 50 + 2);
    lv->reqs = calloc((size_t)lv->cap_reqs, sizeof *lv->reqs);
    lv->max_tokens = calloc((size_t)lv->cap_reqs, sizeof *lv->max_tokens);
    lv->in_target = calloc((size_t)lv->cap_reqs, sizeof *lv->in_target);
    pthread_t *th = calloc((size_t)lv->clients, sizeof *th);
    if (!lv->reqs || !lv->max_tokens || !lv->in_target || !th) {
        free(th);
        return -1;
    }
    r->lv = lv;
    lv->t0 = tern_time_s();
    r->deadline = lv->t0 + r->o->duration_s;
    int n = 0;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 << 10);
    for (; n < lv->clients; n++)
        if (pthread_create(&th[n], &at, client_main, r))
            break;
    pthread_attr_destroy(&at);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    free(th);
    double end = r->deadline;
    for (int i = 0; r->o->drain && i < lv->n_reqs; i++)
        if (lv->reqs[i].t_end > end)
            end = lv->reqs[i].t_end;
    lv->window_s = end - lv->t0;
    return n == lv->clients ? 0 : -1;
}

/* ---- numbers ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Nearest-rank quantile of v[0..n) (sorts v); 0 when empty. */
static double quantile(double *v, int n, double q)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)ceil(q * n) - 1;
    return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static json_object *pct_json(double *v, int n)
{
    json_object *o = json_object_new_object();
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += v[i];
    json_object_object_add(o, "n", json_object_new_int(n));
    json_object_object_add(o, "mean", json_object_new_double(n ? 1e3 * sum / n : 0));
    json_object_object_add(o, "p50", json_object_new_double(1e3 * quantile(v, n, 0.50)));
    json_object_object_add(o, "p90", json_object_new_double(1e3 * quantile(v, n, 0.90)));
    json_object_object_add(o, "p99", json_object_new_double(1e3 * quantile(v, n, 0.99)));
    return o;
}

/* A level's numbers as serve.json holds them (milliseconds for times). */
static json_object *level_json(const serve_level *lv, int with_requests)
{
    int n_done = 0, n_abort = 0, n_fail = 0, n_ttft = 0, n_tpot = 0, n_gaps = 0;
    long long out_tok = 0, prompt_tok = 0, done_chunks = 0, done_tokens = 0, prompt_target = 0;
    const char *first_error = "";
    for (int i = 0; i < lv->n_reqs; i++)
        n_gaps += lv->reqs[i].n_gaps;
    double *ttft = calloc((size_t)lv->n_reqs + 1, sizeof *ttft), *tpot = calloc((size_t)lv->n_reqs + 1, sizeof *tpot);
    double *gaps = calloc((size_t)n_gaps + 1, sizeof *gaps);
    json_object *rq = json_object_new_array();
    n_gaps = 0;
    for (int i = 0; i < lv->n_reqs; i++) {
        const serve_req *q = &lv->reqs[i];
        if (q->status == REQ_DONE) {
            n_done++;
            out_tok += q->completion_tokens;
            prompt_tok += q->prompt_tokens;
            prompt_target += lv->in_target[i];
            done_chunks += q->n_chunks;
            done_tokens += q->completion_tokens;
        } else if (q->status == REQ_ABORTED) {
            n_abort++;
            out_tok += q->n_chunks;
        } else {
            n_fail++;
            if (!first_error[0])
                first_error = q->error;
        }
        if (q->status != REQ_FAILED && q->n_chunks > 0 && ttft && tpot && gaps) {
            ttft[n_ttft++] = q->t_first - q->t_start;
            if (q->n_chunks > 1)
                tpot[n_tpot++] = (q->t_last - q->t_first) / (q->n_chunks - 1);
            for (int g = 0; g < q->n_gaps; g++)
                gaps[n_gaps++] = q->gaps[g];
        }
        if (with_requests) {
            json_object *e = json_object_new_object();
            static const char *const ST[] = {"running", "done", "aborted", "failed"};
            json_object_object_add(e, "status", json_object_new_string(ST[q->status]));
            json_object_object_add(e, "max_tokens", json_object_new_int(lv->max_tokens[i]));
            json_object_object_add(e, "prompt_target", json_object_new_int(lv->in_target[i]));
            json_object_object_add(e, "prompt_tokens", json_object_new_int64(q->prompt_tokens));
            json_object_object_add(e, "completion_tokens", json_object_new_int64(q->completion_tokens));
            json_object_object_add(e, "chunks", json_object_new_int(q->n_chunks));
            json_object_object_add(e, "ttft_ms", json_object_new_double(q->n_chunks ? 1e3 * (q->t_first - q->t_start) : -1));
            json_object_object_add(e, "start_ms", json_object_new_double(1e3 * (q->t_start - lv->t0)));
            json_object_object_add(e, "end_ms", json_object_new_double(1e3 * (q->t_end - lv->t0)));
            if (q->error[0])
                json_object_object_add(e, "error", json_object_new_string(q->error));
            json_object_array_add(rq, e);
        }
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "clients", json_object_new_int(lv->clients));
    json_object_object_add(o, "window_s", json_object_new_double(lv->window_s));
    json_object_object_add(o, "requests_started", json_object_new_int(lv->n_reqs));
    json_object_object_add(o, "requests_done", json_object_new_int(n_done));
    json_object_object_add(o, "requests_aborted", json_object_new_int(n_abort));
    json_object_object_add(o, "requests_failed", json_object_new_int(n_fail));
    json_object_object_add(o, "output_tokens", json_object_new_int64(out_tok));
    json_object_object_add(o, "prompt_tokens_done", json_object_new_int64(prompt_tok));
    json_object_object_add(o, "prompt_tokens_mean", json_object_new_double(n_done ? (double)prompt_tok / n_done : 0));
    json_object_object_add(o, "prompt_target_mean", json_object_new_double(n_done ? (double)prompt_target / n_done : 0));
    json_object_object_add(o, "output_tok_s", json_object_new_double(lv->window_s > 0 ? out_tok / lv->window_s : 0));
    json_object_object_add(o, "requests_s", json_object_new_double(lv->window_s > 0 ? n_done / lv->window_s : 0));
    json_object_object_add(o, "chunks_per_token",
                           json_object_new_double(done_tokens ? (double)done_chunks / done_tokens : 0));
    json_object_object_add(o, "ttft_ms", pct_json(ttft, n_ttft));
    json_object_object_add(o, "itl_ms", pct_json(gaps, n_gaps));
    json_object_object_add(o, "tpot_ms", pct_json(tpot, n_tpot));
    json_object_object_add(o, "first_error", json_object_new_string(first_error));
    if (with_requests)
        json_object_object_add(o, "requests", rq);
    else
        json_object_put(rq);
    free(ttft);
    free(tpot);
    free(gaps);
    return o;
}

static double jnum(json_object *o, const char *a, const char *b)
{
    json_object *v;
    if (!json_object_object_get_ex(o, a, &v))
        return NAN;
    if (b && !json_object_object_get_ex(v, b, &v))
        return NAN;
    return json_object_get_double(v);
}

/* ---- reports ---- */

/* The label of run i (its --label, else its model). */
static const char *run_label(json_object *run)
{
    json_object *v;
    if (json_object_object_get_ex(run, "label", &v) && json_object_get_string_len(v))
        return json_object_get_string(v);
    return json_object_object_get_ex(run, "model", &v) ? json_object_get_string(v) : "?";
}

/* The level of run with `clients` clients, or NULL. */
static json_object *run_level(json_object *run, int clients)
{
    json_object *lv;
    if (!json_object_object_get_ex(run, "levels", &lv))
        return NULL;
    for (size_t i = 0; i < json_object_array_length(lv); i++) {
        json_object *l = json_object_array_get_idx(lv, i);
        if ((int)jnum(l, "clients", NULL) == clients)
            return l;
    }
    return NULL;
}

/* Every client count of the runs, ascending, into c[cap]; returns how many. */
static int report_clients(json_object **runs, int n_runs, int *c, int cap)
{
    int n = 0;
    for (int r = 0; r < n_runs; r++) {
        json_object *lv;
        if (!json_object_object_get_ex(runs[r], "levels", &lv))
            continue;
        for (size_t i = 0; i < json_object_array_length(lv); i++) {
            int k = (int)jnum(json_object_array_get_idx(lv, i), "clients", NULL), j = 0;
            while (j < n && c[j] != k)
                j++;
            if (j == n && n < cap)
                c[n++] = k;
        }
    }
    for (int i = 1; i < n; i++) /* insertion sort */
        for (int j = i; j > 0 && c[j - 1] > c[j]; j--) {
            int t = c[j];
            c[j] = c[j - 1];
            c[j - 1] = t;
        }
    return n;
}

static void md_run(FILE *f, json_object *run)
{
    json_object *v, *lv;
    fprintf(f, "### %s\n\n", run_label(run));
    fprintf(f, "Server %s, model `%s`, %s, %g s per client count (%s), temperature %g, ignore_eos %s, seed %g.\n",
            json_object_object_get_ex(run, "url", &v) ? json_object_get_string(v) : "?",
            json_object_object_get_ex(run, "model", &v) ? json_object_get_string(v) : "?",
            json_object_object_get_ex(run, "endpoint", &v) ? json_object_get_string(v) : "?",
            jnum(run, "duration_s", NULL), jnum(run, "drain", NULL) > 0 ? "requests in flight then finish" :
                                                                      "requests in flight at the end are closed",
            jnum(run, "temperature", NULL), jnum(run, "ignore_eos", NULL) > 0 ? "on" : "off", jnum(run, "seed", NULL));
    json_object *w = json_object_object_get_ex(run, "workload", &w) ? w : NULL;
    if (w)
        fprintf(f, "Prompt tokens log-normal (median %g, sigma %g, clipped %g-%g); output tokens (max_tokens) "
                   "log-normal (median %g, sigma %g, clipped %g-%g); %.2f prompt tokens per word.\n",
                jnum(w, "input", "median"), jnum(w, "input", "sigma"), jnum(w, "input", "min"), jnum(w, "input", "max"),
                jnum(w, "output", "median"), jnum(w, "output", "sigma"), jnum(w, "output", "min"),
                jnum(w, "output", "max"), jnum(run, "calibration", "tokens_per_word"));
    fprintf(f, "\n| clients | done / closed / failed | output tok/s | req/s | TTFT p50 / p90 / p99 ms | "
               "ITL p50 / p90 / p99 ms | TPOT p50 / p99 ms | prompt tokens (mean) | chunks/token |\n"
               "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    if (json_object_object_get_ex(run, "levels", &lv))
        for (size_t i = 0; i < json_object_array_length(lv); i++) {
            json_object *l = json_object_array_get_idx(lv, i);
            fprintf(f, "| %g | %g / %g / %g | %.1f | %.2f | %.1f / %.1f / %.1f | %.2f / %.2f / %.2f | %.2f / %.2f | "
                       "%.0f | %.3f |\n",
                    jnum(l, "clients", NULL), jnum(l, "requests_done", NULL), jnum(l, "requests_aborted", NULL),
                    jnum(l, "requests_failed", NULL), jnum(l, "output_tok_s", NULL), jnum(l, "requests_s", NULL),
                    jnum(l, "ttft_ms", "p50"), jnum(l, "ttft_ms", "p90"), jnum(l, "ttft_ms", "p99"),
                    jnum(l, "itl_ms", "p50"), jnum(l, "itl_ms", "p90"), jnum(l, "itl_ms", "p99"),
                    jnum(l, "tpot_ms", "p50"), jnum(l, "tpot_ms", "p99"), jnum(l, "prompt_tokens_mean", NULL),
                    jnum(l, "chunks_per_token", NULL));
            if (json_object_object_get_ex(l, "first_error", &v) && json_object_get_string_len(v))
                fprintf(f, "|  | first failure: %s |  |  |  |  |  |  |  |\n", json_object_get_string(v));
        }
    fprintf(f, "\n");
}

/* The side-by-side table: every run's output tok/s and ITL p99 per client
 * count, and the first run's ratio to each other. */
static void md_compare(FILE *f, json_object **runs, int n_runs, const int *c, int n_c)
{
    fprintf(f, "| clients |");
    for (int r = 0; r < n_runs; r++)
        fprintf(f, " %s tok/s |", run_label(runs[r]));
    for (int r = 1; r < n_runs; r++)
        fprintf(f, " %s / %s |", run_label(runs[0]), run_label(runs[r]));
    for (int r = 0; r < n_runs; r++)
        fprintf(f, " %s ITL p50 / p99 ms | %s TTFT p50 / p99 ms |", run_label(runs[r]), run_label(runs[r]));
    fprintf(f, "\n| ---: |");
    for (int r = 0; r < 3 * n_runs - 1 + n_runs; r++)
        fprintf(f, " ---: |");
    fprintf(f, "\n");
    for (int k = 0; k < n_c; k++) {
        fprintf(f, "| %d |", c[k]);
        for (int r = 0; r < n_runs; r++) {
            json_object *l = run_level(runs[r], c[k]);
            fprintf(f, l ? " %.1f |" : " - |", l ? jnum(l, "output_tok_s", NULL) : 0);
        }
        json_object *l0 = run_level(runs[0], c[k]);
        for (int r = 1; r < n_runs; r++) {
            json_object *l = run_level(runs[r], c[k]);
            double a = l0 ? jnum(l0, "output_tok_s", NULL) : 0, b = l ? jnum(l, "output_tok_s", NULL) : 0;
            fprintf(f, a > 0 && b > 0 ? " %.2fx |" : " - |", a > 0 && b > 0 ? a / b : 0);
        }
        for (int r = 0; r < n_runs; r++) {
            json_object *l = run_level(runs[r], c[k]);
            if (l)
                fprintf(f, " %.2f / %.2f | %.1f / %.1f |", jnum(l, "itl_ms", "p50"), jnum(l, "itl_ms", "p99"),
                        jnum(l, "ttft_ms", "p50"), jnum(l, "ttft_ms", "p99"));
            else
                fprintf(f, " - | - |");
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\n");
}

/* Writes DIR/NAME.md, the plots' data (throughput.dat, latency.dat), their
 * script plots.gp and runs gnuplot for throughput/latency .png and .svg.
 * Returns 0, 1 when gnuplot is missing or fails (the rest is written). */
static int report_write(const char *dir, const char *name, json_object **runs, int n_runs)
{
    int c[64], n_c = report_clients(runs, n_runs, c, 64);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.md", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_serve: cannot write %s\n", path);
        return -1;
    }
    fprintf(f, "# Served throughput%s\n\n", n_runs > 1 ? ", side by side" : "");
    if (n_runs > 1)
        md_compare(f, runs, n_runs, c, n_c);
    for (int r = 0; r < n_runs; r++)
        md_run(f, runs[r]);
    fprintf(f, "TTFT: request sent to first text chunk. ITL: gaps between text chunks, over all requests. TPOT: "
               "each request's mean gap. Plots: throughput.png, latency.png.\n");
    fclose(f);
    snprintf(path, sizeof path, "%s/throughput.dat", dir);
    FILE *t = fopen(path, "w");
    snprintf(path, sizeof path, "%s/latency.dat", dir);
    FILE *l = fopen(path, "w");
    if (!t || !l) {
        if (t)
            fclose(t);
        if (l)
            fclose(l);
        return -1;
    }
    fprintf(t, "# clients, then per run: output tok/s ('?' = not run)\n");
    fprintf(l, "# clients, then per run: TTFT p50 p99, ITL p50 p99 (ms)\n");
    for (int k = 0; k < n_c; k++) {
        fprintf(t, "%d", c[k]);
        fprintf(l, "%d", c[k]);
        for (int r = 0; r < n_runs; r++) {
            json_object *lv = run_level(runs[r], c[k]);
            if (lv && jnum(lv, "requests_done", NULL) + jnum(lv, "requests_aborted", NULL) > 0) {
                fprintf(t, " %g", jnum(lv, "output_tok_s", NULL));
                fprintf(l, " %g %g %g %g", jnum(lv, "ttft_ms", "p50"), jnum(lv, "ttft_ms", "p99"),
                        jnum(lv, "itl_ms", "p50"), jnum(lv, "itl_ms", "p99"));
            } else {
                fprintf(t, " ?");
                fprintf(l, " ? ? ? ?");
            }
        }
        fprintf(t, "\n");
        fprintf(l, "\n");
    }
    fclose(t);
    fclose(l);
    snprintf(path, sizeof path, "%s/plots.gp", dir);
    if (!(f = fopen(path, "w")))
        return -1;
    /* the style of tern bench's plots (src/cli/bench_report.c) */
    fprintf(f, "# Renders the plots from the .dat files beside it: gnuplot plots.gp\n"
               "set datafile missing '?'\nset grid\nset key top left font ',9'\n"
               "set style line 1 lc rgb '#1f77b4' lw 2 pt 7\nset style line 2 lc rgb '#d62728' lw 2 pt 5\n"
               "set style line 3 lc rgb '#2ca02c' lw 2 pt 9\nset style line 4 lc rgb '#9467bd' lw 2 pt 11\n"
               "set logscale x 2\nset xtics (");
    for (int k = 0; k < n_c; k++)
        fprintf(f, "%s'%d' %d", k ? ", " : "", c[k], c[k]);
    fprintf(f, ")\nset xrange [%g:%g]\nset xlabel 'concurrent clients'\n", n_c ? c[0] / 1.4 : 0.5,
            n_c ? c[n_c - 1] * 1.4 : 2);
    const char *term[2] = {"pngcairo size %d,480 font 'DejaVu Sans,10'", "svg size %d,480 font 'DejaVu Sans,10' dynamic"};
    const char *ext[2] = {"png", "svg"};
    for (int e = 0; e < 2; e++) {
        fprintf(f, "\nset terminal ");
        fprintf(f, term[e], 800);
        fprintf(f, "\nset output 'throughput.%s'\nset title 'Served output throughput vs concurrent clients' "
                   "font ',13'\nset ylabel 'output tokens/s (all clients)'\nset yrange [0:*]\nplot ",
                ext[e]);
        for (int r = 0; r < n_runs; r++)
            fprintf(f, "%s'throughput.dat' using 1:%d with linespoints ls %d title '%s' noenhanced", r ? ", " : "",
                    r + 2, r % 4 + 1, run_label(runs[r]));
        fprintf(f, "\nset terminal ");
        fprintf(f, term[e], 1400);
        fprintf(f, "\nset output 'latency.%s'\nset multiplot layout 1,2 title 'Latency percentiles' font ',13'\n"
                   "set logscale y\nset yrange [*:*]\nset ylabel 'ms'\nset title 'time to first token (p50 solid, "
                   "p99 dashed)'\nplot ",
                ext[e]);
        for (int r = 0; r < n_runs; r++)
            fprintf(f, "%s'latency.dat' using 1:%d with linespoints ls %d title '%s p50' noenhanced, "
                       "'' using 1:%d with linespoints ls %d dt 2 title '%s p99' noenhanced",
                    r ? ", " : "", 4 * r + 2, r % 4 + 1, run_label(runs[r]), 4 * r + 3, r % 4 + 1, run_label(runs[r]));
        fprintf(f, "\nset title 'inter-token latency (p50 solid, p99 dashed)'\nplot ");
        for (int r = 0; r < n_runs; r++)
            fprintf(f, "%s'latency.dat' using 1:%d with linespoints ls %d title '%s p50' noenhanced, "
                       "'' using 1:%d with linespoints ls %d dt 2 title '%s p99' noenhanced",
                    r ? ", " : "", 4 * r + 4, r % 4 + 1, run_label(runs[r]), 4 * r + 5, r % 4 + 1, run_label(runs[r]));
        fprintf(f, "\nunset multiplot\nunset logscale y\nunset output\n");
    }
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        if (chdir(dir) == 0) {
            if (!freopen("/dev/null", "r", stdin) || !freopen("plots.log", "w", stderr))
                _exit(126);
            execlp("gnuplot", "gnuplot", "plots.gp", (char *)NULL);
        }
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "bench_serve: gnuplot %s (%s/plots.gp, %s/plots.log); the reports are written\n",
                WIFEXITED(st) && WEXITSTATUS(st) == 127 ? "is not installed" : "failed", dir, dir);
        return 1;
    }
    return 0;
}

/* ---- the command ---- */

static void usage(void)
{
    fprintf(stderr,
            "usage: bench_serve --url http://HOST:PORT [options]\n"
            "       bench_serve --compare A/serve.json B/serve.json ... --out DIR\n"
            "  --clients LIST        concurrent clients per level, 1-256 (default 1,8,32,64,128)\n"
            "  --duration S          seconds per level (default 15)\n"
            "  --wait S              wait up to S s for the server to load its model (default 0)\n"
            "  --drain               let requests in flight at the end finish (default: close them)\n"
            "  --model NAME          the model field (default: the server's first, GET /v1/models)\n"
            "  --label NAME          the run's name in reports (default: the model)\n"
            "  --endpoint chat|completions  (default chat)\n"
            "  --input MEDIAN,SIGMA,MIN,MAX   prompt tokens, log-normal (default 200,0.8,16,1024)\n"
            "  --output MEDIAN,SIGMA,MIN,MAX  max_tokens, log-normal (default 150,0.7,16,512)\n"
            "  --temperature X       (default 0: greedy)\n"
            "  --no-ignore-eos       do not send ignore_eos (default: send it)\n"
            "  --seed N              the workload's seed (default 1)\n"
            "  --out DIR             serve.json, serve.md, plots (default .)\n");
}

static int parse_dist(const char *s, serve_dist *d)
{
    return sscanf(s, "%lf,%lf,%d,%d", &d->median, &d->sigma, &d->min, &d->max) == 4 && d->median > 0 &&
                   d->sigma >= 0 && d->min >= 1 && d->max >= d->min
               ? 0
               : -1;
}

/* GET /v1/models: the HTTP status (0: no answer); the first model's id
 * into o->model unless one was given. */
static int server_model(serve_opts *o, int named)
{
    int fd = http_connect(o);
    if (fd < 0)
        return 0;
    char rq[512], buf[8192];
    int n = snprintf(rq, sizeof rq, "GET /v1/models HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n", o->host,
                     o->port);
    size_t have = 0;
    if (send(fd, rq, (size_t)n, MSG_NOSIGNAL) == n)
        for (ssize_t k; have + 1 < sizeof buf && (k = recv(fd, buf + have, sizeof buf - 1 - have, 0)) > 0;)
            have += (size_t)k;
    close(fd);
    buf[have] = 0;
    int status = 0;
    if (sscanf(buf, "HTTP/%*s %d", &status) != 1 || status != 200 || named)
        return status;
    char *id = strstr(buf, "\"id\"");
    char *q1 = id ? strchr(id + 4, '"') : NULL, *q2 = q1 ? strchr(q1 + 1, '"') : NULL;
    if (q2 && q2 - q1 - 1 < (long)sizeof o->model)
        snprintf(o->model, sizeof o->model, "%.*s", (int)(q2 - q1 - 1), q1 + 1);
    return status;
}

static int compare_main(const char *out, char **files, int n_files)
{
    json_object *runs[16];
    int n = 0, rc = 0;
    for (int i = 0; i < n_files && n < 16; i++) {
        json_object *o = json_object_from_file(files[i]);
        if (!o) {
            fprintf(stderr, "bench_serve: cannot read %s\n", files[i]);
            rc = 1;
            goto out;
        }
        runs[n++] = o;
    }
    mkdir(out, 0755);
    rc = report_write(out, "compare", runs, n) < 0;
    char path[1024];
    snprintf(path, sizeof path, "%s/compare.md", out);
    FILE *f = fopen(path, "r");
    for (int ch; f && (ch = fgetc(f)) != EOF;)
        putchar(ch);
    if (f)
        fclose(f);
out:
    for (int i = 0; i < n; i++)
        json_object_put(runs[i]);
    return rc;
}

/* Writes serve.json (the totals so far) and its reports into o->out_dir:
 * after every level, so a run cut short keeps what it measured. */
static int run_save(json_object *run, const serve_run *r, const serve_opts *o)
{
    json_object *tot = json_object_new_object();
    json_object_object_add(tot, "requests", json_object_new_int64(r->sent_requests));
    json_object_object_add(tot, "prompt_tokens", json_object_new_int64(r->sent_prompt));
    json_object_object_add(tot, "completion_tokens", json_object_new_int64(r->sent_completion));
    json_object_object_add(run, "totals", tot);
    mkdir(o->out_dir, 0755);
    char path[1024];
    snprintf(path, sizeof path, "%s/serve.json", o->out_dir);
    int rc = 0;
    if (json_object_to_file_ext(path, run, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED)) {
        fprintf(stderr, "bench_serve: cannot write %s\n", path);
        rc = 1;
    }
    if (report_write(o->out_dir, "serve", &run, 1) < 0)
        rc = 1;
    return rc;
}

int main(int argc, char **argv)
{
    serve_opts o = {.chat = 1, .duration_s = 15, .ignore_eos = 1, .seed = 1, .out_dir = "."};
    o.in = (serve_dist){200, 0.8, 16, 1024};
    o.out = (serve_dist){150, 0.7, 16, 512};
    const char *url = NULL, *clients = "1,8,32,64,128";
    double wait_s = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--compare")) {
            const char *out = ".";
            int first = i + 1, last = argc;
            for (int k = first; k < argc; k++)
                if (!strcmp(argv[k], "--out") && k + 1 < argc) {
                    out = argv[k + 1];
                    last = k;
                    break;
                }
            if (last - first < 1) {
                usage();
                return 2;
            }
            return compare_main(out, argv + first, last - first);
        }
        int flag = !strcmp(a, "--drain") || !strcmp(a, "--no-ignore-eos") || !strcmp(a, "-h") || !strcmp(a, "--help");
        if (!flag && !v) {
            fprintf(stderr, "bench_serve: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--url")) url = v;
        else if (!strcmp(a, "--clients")) clients = v;
        else if (!strcmp(a, "--duration")) o.duration_s = atof(v);
        else if (!strcmp(a, "--wait")) wait_s = atof(v);
        else if (!strcmp(a, "--model")) snprintf(o.model, sizeof o.model, "%s", v);
        else if (!strcmp(a, "--label")) snprintf(o.label, sizeof o.label, "%s", v);
        else if (!strcmp(a, "--endpoint")) o.chat = !strcmp(v, "chat") ? 1 : !strcmp(v, "completions") ? 0 : -1;
        else if (!strcmp(a, "--input")) o.in.median = parse_dist(v, &o.in) ? -1 : o.in.median;
        else if (!strcmp(a, "--output")) o.out.median = parse_dist(v, &o.out) ? -1 : o.out.median;
        else if (!strcmp(a, "--temperature")) o.temperature = atof(v);
        else if (!strcmp(a, "--seed")) o.seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--out")) o.out_dir = v;
        else if (!strcmp(a, "--drain")) o.drain = 1;
        else if (!strcmp(a, "--no-ignore-eos")) o.ignore_eos = 0;
        else {
            usage();
            return strcmp(a, "-h") && strcmp(a, "--help") ? 2 : 0;
        }
        if (!flag)
            i++;
    }
    for (const char *p = clients; *p && o.n_levels < 32;) {
        char *end;
        long c = strtol(p, &end, 10);
        if (end == p || c < 1 || c > 256) {
            fprintf(stderr, "bench_serve: --clients wants counts 1-256 separated by commas (got '%s')\n", clients);
            return 2;
        }
        o.clients[o.n_levels++] = (int)c;
        p = *end == ',' ? end + 1 : end;
    }
    if (!url || strncmp(url, "http://", 7) || o.chat < 0 || o.in.median < 0 || o.out.median < 0 ||
        o.duration_s <= 0) {
        fprintf(stderr, "bench_serve: needs --url http://HOST:PORT, --endpoint chat|completions, "
                        "--input/--output MEDIAN,SIGMA,MIN,MAX and a positive --duration\n");
        return 2;
    }
    const char *hp = url + 7, *colon = strchr(hp, ':'), *slash = strchr(hp, '/');
    size_t hl = colon && (!slash || colon < slash) ? (size_t)(colon - hp) : slash ? (size_t)(slash - hp) : strlen(hp);
    snprintf(o.host, sizeof o.host, "%.*s", (int)(hl < 255 ? hl : 255), hp);
    snprintf(o.port, sizeof o.port, "%.*s", colon && (!slash || colon < slash) ? (int)strcspn(colon + 1, "/") : 2,
             colon && (!slash || colon < slash) ? colon + 1 : "80");
    /* --wait: a server still loading its model refuses connections or answers 503 */
    int named = o.model[0] != 0, status = server_model(&o, named);
    double t_wait = tern_time_s() + wait_s;
    for (; status != 200 && tern_time_s() < t_wait; status = server_model(&o, named))
        usleep(250000);
    if (status != 200) {
        fprintf(stderr, "bench_serve: %s: GET /v1/models answered %d%s\n", url, status,
                wait_s > 0 ? " at the end of --wait" : "");
        return 1;
    }
    serve_run r = {.o = &o};
    pthread_mutex_init(&r.mu, NULL);
    /* calibration: prompt tokens of 1 and 51 words give the tokens per word and the template's overhead */
    char why[256] = "";
    long long p1 = probe(&r, 1, why, sizeof why);
    /* some servers (llama-server) list their model while it still loads and answer 503 until it is in */
    while (p1 <= 0 && strstr(why, "503") && tern_time_s() < t_wait) {
        usleep(250000);
        p1 = probe(&r, 1, why, sizeof why);
    }
    long long p2 = p1 > 0 ? probe(&r, 51, why, sizeof why) : -1;
    if (p1 <= 0 || p2 <= p1) {
        fprintf(stderr, "bench_serve: %s: the calibration request failed: %s\n", url, why);
        return 1;
    }
    r.tok_per_word = (double)(p2 - p1) / 50;
    r.overhead = (double)p1 - r.tok_per_word;
    json_object *run = json_object_new_object(), *levels = json_object_new_array(), *w = json_object_new_object();
    json_object_object_add(run, "tool", json_object_new_string("bench_serve"));
    json_object_object_add(run, "url", json_object_new_string(url));
    json_object_object_add(run, "model", json_object_new_string(o.model));
    json_object_object_add(run, "label", json_object_new_string(o.label[0] ? o.label : o.model));
    json_object_object_add(run, "endpoint", json_object_new_string(o.chat ? "chat" : "completions"));
    json_object_object_add(run, "seed", json_object_new_int64((int64_t)o.seed));
    json_object_object_add(run, "duration_s", json_object_new_double(o.duration_s));
    json_object_object_add(run, "drain", json_object_new_int(o.drain));
    json_object_object_add(run, "temperature", json_object_new_double(o.temperature));
    json_object_object_add(run, "ignore_eos", json_object_new_int(o.ignore_eos));
    for (int d = 0; d < 2; d++) {
        const serve_dist *s = d ? &o.out : &o.in;
        json_object *x = json_object_new_object();
        json_object_object_add(x, "distribution", json_object_new_string("log-normal"));
        json_object_object_add(x, "median", json_object_new_double(s->median));
        json_object_object_add(x, "sigma", json_object_new_double(s->sigma));
        json_object_object_add(x, "min", json_object_new_int(s->min));
        json_object_object_add(x, "max", json_object_new_int(s->max));
        json_object_object_add(w, d ? "output" : "input", x);
    }
    json_object_object_add(run, "workload", w);
    json_object *cal = json_object_new_object();
    json_object_object_add(cal, "tokens_per_word", json_object_new_double(r.tok_per_word));
    json_object_object_add(cal, "overhead_tokens", json_object_new_double(r.overhead));
    json_object_object_add(run, "calibration", cal);
    json_object_object_add(run, "levels", levels);
    printf("%-8s %8s %10s %8s %22s %22s %6s\n", "clients", "done", "out tok/s", "req/s", "TTFT p50/p99 ms",
           "ITL p50/p99 ms", "fail");
    int rc = 0;
    for (int i = 0; i < o.n_levels; i++) {
        serve_level lv = {.clients = o.clients[i]};
        if (level_run(&r, &lv)) {
            fprintf(stderr, "bench_serve: cannot start %d clients\n", lv.clients);
            rc = 1;
        }
        json_object *l = level_json(&lv, 1);
        json_object_array_add(levels, l);
        printf("%-8d %8g %10.1f %8.2f %10.1f / %9.1f %10.2f / %9.2f %6g\n", lv.clients, jnum(l, "requests_done", NULL),
               jnum(l, "output_tok_s", NULL), jnum(l, "requests_s", NULL), jnum(l, "ttft_ms", "p50"),
               jnum(l, "ttft_ms", "p99"), jnum(l, "itl_ms", "p50"), jnum(l, "itl_ms", "p99"),
               jnum(l, "requests_failed", NULL));
        fflush(stdout);
        if (jnum(l, "requests_failed", NULL) > 0)
            rc = 1;
        for (int k = 0; k < lv.n_reqs; k++) {
            free(lv.reqs[k].gaps);
            free(lv.reqs[k].line.s);
        }
        free(lv.reqs);
        free(lv.max_tokens);
        free(lv.in_target);
        if (run_save(run, &r, &o))
            rc = 1;
        if (!o.drain && i + 1 < o.n_levels)
            usleep(500000); /* the server cancels what the clients closed */
    }
    json_object_put(run);
    pthread_mutex_destroy(&r.mu);
    return rc;
}
