/* KV cache events on ZeroMQ (see kv_events.h): the engine thread encodes
 * each event into the step's msgpack buffer; kv_events_flush wraps them as
 * one batch and queues it; the publisher thread sends the queue in order
 * (topic, sequence, payload), keeps the last batches for replay and answers
 * replay requests. A step never waits for the network: PUB drops what no
 * subscriber reads, and the queue only grows while the thread is behind. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zmq.h>

#include "base/log.h"
#include "base/strbuf.h"
#include "engine/kv_events.h"

typedef struct kv_batch {
    struct kv_batch *next;
    uint64_t seq; /* set when published */
    char *topic;  /* owned */
    char *data;
    size_t len;
} kv_batch;

struct kv_events_src {
    kv_events *ev;
    char *topic, *medium;
    int block_size;
    tern_sbuf cur; /* the step's encoded events */
    int n_cur;
};

struct kv_events {
    kv_events_opts o;
    void *ctx, *pub, *replay;
    /* queue to the publisher thread */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kv_batch *head, *tail;
    int stop;
    pthread_t thread;
    /* publisher thread: sequence and replay ring */
    uint64_t seq;
    kv_batch **ring; /* [buffer_batches], ring[seq % n] */
};

/* ---- msgpack (big-endian, the smallest form of each value) ---- */

static void mp_byte(tern_sbuf *b, unsigned c)
{
    char x = (char)c;
    tern_sbuf_put(b, &x, 1);
}

static void mp_be(tern_sbuf *b, uint64_t v, int bytes)
{
    char x[8];
    for (int i = 0; i < bytes; i++)
        x[i] = (char)(v >> (8 * (bytes - 1 - i)));
    tern_sbuf_put(b, x, (size_t)bytes);
}

static void mp_uint(tern_sbuf *b, uint64_t v)
{
    if (v < 128)
        mp_byte(b, (unsigned)v);
    else if (v <= 0xff)
        mp_byte(b, 0xcc), mp_be(b, v, 1);
    else if (v <= 0xffff)
        mp_byte(b, 0xcd), mp_be(b, v, 2);
    else if (v <= 0xffffffffu)
        mp_byte(b, 0xce), mp_be(b, v, 4);
    else
        mp_byte(b, 0xcf), mp_be(b, v, 8);
}

static void mp_int(tern_sbuf *b, int64_t v)
{
    if (v >= 0) {
        mp_uint(b, (uint64_t)v);
    } else if (v >= -32) {
        mp_byte(b, (unsigned)(v & 0xff));
    } else if (v >= INT32_MIN) {
        mp_byte(b, 0xd2);
        mp_be(b, (uint64_t)(uint32_t)(int32_t)v, 4);
    } else {
        mp_byte(b, 0xd3);
        mp_be(b, (uint64_t)v, 8);
    }
}

static void mp_len(tern_sbuf *b, size_t n, unsigned fix, unsigned fix_max, unsigned b16)
{
    if (n <= fix_max)
        mp_byte(b, fix | (unsigned)n);
    else if (n <= 0xffff)
        mp_byte(b, b16), mp_be(b, n, 2);
    else
        mp_byte(b, b16 + 1), mp_be(b, n, 4);
}

static void mp_array(tern_sbuf *b, size_t n) { mp_len(b, n, 0x90, 15, 0xdc); }
static void mp_map(tern_sbuf *b, size_t n) { mp_len(b, n, 0x80, 15, 0xde); }
static void mp_nil(tern_sbuf *b) { mp_byte(b, 0xc0); }

static void mp_str(tern_sbuf *b, const char *s)
{
    size_t n = strlen(s);
    if (n <= 31)
        mp_byte(b, 0xa0 | (unsigned)n);
    else if (n <= 0xff)
        mp_byte(b, 0xd9), mp_be(b, n, 1);
    else
        mp_byte(b, 0xda), mp_be(b, n, 2);
    tern_sbuf_put(b, s, n);
}

static void mp_f64(tern_sbuf *b, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    mp_byte(b, 0xcb);
    mp_be(b, u, 8);
}

/* A struct's head: the array of n fields, or the map of n fields whose
 * first key is the tag ("type"). Keys go before each field in a map. */
static int is_map(const kv_events_src *s) { return s->ev->o.format == KV_EVENTS_MAP; }

static void ev_head(kv_events_src *s, const char *tag, size_t n_fields)
{
    if (is_map(s)) {
        mp_map(&s->cur, n_fields + 1);
        mp_str(&s->cur, "type");
    } else {
        mp_array(&s->cur, n_fields + 1);
    }
    mp_str(&s->cur, tag);
}

static void ev_key(kv_events_src *s, const char *key)
{
    if (is_map(s))
        mp_str(&s->cur, key);
}

static void ev_hashes(kv_events_src *s, const uint64_t *hashes, int n)
{
    ev_key(s, "block_hashes");
    mp_array(&s->cur, (size_t)n);
    for (int i = 0; i < n; i++)
        mp_uint(&s->cur, hashes[i]);
}

void kv_events_stored(kv_events_src *s, const uint64_t *hashes, int n, int has_parent, uint64_t parent,
                      const int32_t *tokens)
{
    if (!s || n <= 0)
        return;
    ev_head(s, "BlockStored", is_map(s) ? 7 : 6);
    ev_hashes(s, hashes, n);
    ev_key(s, "parent_block_hash");
    if (has_parent)
        mp_uint(&s->cur, parent);
    else
        mp_nil(&s->cur);
    ev_key(s, "token_ids");
    size_t n_tok = (size_t)n * (size_t)s->block_size;
    mp_array(&s->cur, n_tok);
    for (size_t i = 0; i < n_tok; i++)
        mp_int(&s->cur, tokens[i]);
    ev_key(s, "block_size");
    mp_uint(&s->cur, (uint64_t)s->block_size);
    ev_key(s, "lora_id");
    mp_nil(&s->cur);
    ev_key(s, "medium");
    mp_str(&s->cur, s->medium);
    if (is_map(s)) {
        mp_str(&s->cur, "lora_name");
        mp_nil(&s->cur);
    }
    s->n_cur++;
}

void kv_events_removed(kv_events_src *s, const uint64_t *hashes, int n)
{
    if (!s || n <= 0)
        return;
    ev_head(s, "BlockRemoved", 2);
    ev_hashes(s, hashes, n);
    ev_key(s, "medium");
    mp_str(&s->cur, s->medium);
    s->n_cur++;
}

void kv_events_cleared(kv_events_src *s)
{
    if (!s)
        return;
    ev_head(s, "AllBlocksCleared", 0);
    s->n_cur++;
}

void kv_events_flush(kv_events_src *s)
{
    if (!s || s->n_cur == 0)
        return;
    kv_events *ev = s->ev;
    tern_sbuf b = {0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int map = is_map(s);
    if (map) {
        mp_map(&b, 3);
        mp_str(&b, "ts");
    } else {
        mp_array(&b, 3);
    }
    mp_f64(&b, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
    if (map)
        mp_str(&b, "events");
    mp_array(&b, (size_t)s->n_cur);
    tern_sbuf_put(&b, s->cur.s, s->cur.n);
    if (map)
        mp_str(&b, "data_parallel_rank");
    mp_uint(&b, 0);
    kv_batch *k = b.oom || s->cur.oom ? NULL : malloc(sizeof *k);
    char *topic = k ? strdup(s->topic) : NULL;
    s->cur.n = 0;
    s->cur.oom = 0;
    s->n_cur = 0;
    pthread_mutex_lock(&ev->mu);
    if (!k || !topic) {
        free(b.s);
        free(k);
        free(topic);
        TERN_WARN("kv events: out of memory, a batch of events is lost");
    } else {
        k->next = NULL;
        k->topic = topic;
        k->data = b.s;
        k->len = b.n;
        if (ev->tail)
            ev->tail->next = k;
        else
            ev->head = k;
        ev->tail = k;
        pthread_cond_signal(&ev->cv);
    }
    pthread_mutex_unlock(&ev->mu);
}

kv_events_src *kv_events_src_new(kv_events *ev, const char *topic, int block_size, const char *medium)
{
    kv_events_src *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ev = ev;
    s->block_size = block_size;
    s->topic = strdup(topic ? topic : "");
    s->medium = strdup(medium ? medium : "CPU");
    if (!s->topic || !s->medium) {
        kv_events_src_free(s);
        return NULL;
    }
    return s;
}

void kv_events_src_free(kv_events_src *s)
{
    if (!s)
        return;
    if (s->topic && s->medium)
        kv_events_flush(s);
    free(s->cur.s);
    free(s->topic);
    free(s->medium);
    free(s);
}

static void batch_free(kv_batch *k)
{
    if (!k)
        return;
    free(k->topic);
    free(k->data);
    free(k);
}

/* ---- publisher thread ---- */

static void be64(unsigned char *out, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)(v >> (56 - 8 * i));
}

static void publish(kv_events *ev, kv_batch *k)
{
    unsigned char seq[8];
    be64(seq, ev->seq);
    if (zmq_send(ev->pub, k->topic, strlen(k->topic), ZMQ_SNDMORE) < 0 ||
        zmq_send(ev->pub, seq, 8, ZMQ_SNDMORE) < 0 || zmq_send(ev->pub, k->data, k->len, 0) < 0)
        TERN_WARN("kv events: send failed: %s", zmq_strerror(zmq_errno()));
    size_t slot = (size_t)(ev->seq % (uint64_t)ev->o.buffer_batches);
    batch_free(ev->ring[slot]);
    k->seq = ev->seq;
    ev->ring[slot] = k;
    ev->seq++;
}

/* One replay request: [identity, "", start (8 bytes)] -> the batches from
 * start on, then the end marker. */
static void serve_replay(kv_events *ev)
{
    unsigned char frames[3][64];
    int lens[3], n = 0, more = 1;
    while (more) {
        int got = zmq_recv(ev->replay, n < 3 ? frames[n] : frames[2], sizeof frames[0], ZMQ_DONTWAIT);
        if (got < 0)
            return;
        if (n < 3)
            lens[n] = got;
        n++;
        size_t sz = sizeof more;
        if (zmq_getsockopt(ev->replay, ZMQ_RCVMORE, &more, &sz))
            more = 0;
    }
    if (n != 3 || lens[2] != 8 || lens[0] > 64) {
        TERN_WARN("kv events: a malformed replay request (%d frames)", n);
        return;
    }
    uint64_t start = 0;
    for (int i = 0; i < 8; i++)
        start = start << 8 | frames[2][i];
    uint64_t first = ev->seq > (uint64_t)ev->o.buffer_batches ? ev->seq - (uint64_t)ev->o.buffer_batches : 0;
    unsigned char seq[8];
    for (uint64_t s = start > first ? start : first; s < ev->seq; s++) {
        size_t slot = (size_t)(s % (uint64_t)ev->o.buffer_batches);
        kv_batch *k = ev->ring[slot];
        if (!k || k->seq != s)
            continue;
        be64(seq, s);
        zmq_send(ev->replay, frames[0], (size_t)lens[0], ZMQ_SNDMORE);
        zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
        zmq_send(ev->replay, seq, 8, ZMQ_SNDMORE);
        zmq_send(ev->replay, k->data, k->len, 0);
    }
    be64(seq, UINT64_MAX); /* -1 */
    zmq_send(ev->replay, frames[0], (size_t)lens[0], ZMQ_SNDMORE);
    zmq_send(ev->replay, "", 0, ZMQ_SNDMORE);
    zmq_send(ev->replay, seq, 8, ZMQ_SNDMORE);
    zmq_send(ev->replay, "", 0, 0);
}

static void *publisher_main(void *arg)
{
    kv_events *ev = arg;
    pthread_mutex_lock(&ev->mu);
    for (;;) {
        while (ev->head) {
            kv_batch *k = ev->head;
            ev->head = k->next;
            if (!ev->head)
                ev->tail = NULL;
            pthread_mutex_unlock(&ev->mu);
            publish(ev, k);
            pthread_mutex_lock(&ev->mu);
        }
        if (ev->stop)
            break;
        if (ev->replay) {
            pthread_mutex_unlock(&ev->mu);
            zmq_pollitem_t it = {ev->replay, 0, ZMQ_POLLIN, 0};
            if (zmq_poll(&it, 1, 20) > 0)
                serve_replay(ev);
            pthread_mutex_lock(&ev->mu);
        } else {
            pthread_cond_wait(&ev->cv, &ev->mu);
        }
    }
    pthread_mutex_unlock(&ev->mu);
    return NULL;
}

static int binds(const char *endpoint)
{
    return strchr(endpoint, '*') || strstr(endpoint, "::") || !strncmp(endpoint, "ipc://", 6) ||
           !strncmp(endpoint, "inproc://", 9);
}

kv_events *kv_events_new(const kv_events_opts *o, tern_err *err)
{
    if (!o || !o->endpoint || !*o->endpoint) {
        tern_err_set(err, TERN_EINVAL, "kv events: no endpoint");
        return NULL;
    }
    kv_events *ev = calloc(1, sizeof *ev);
    if (!ev) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    ev->o = *o;
    if (ev->o.buffer_batches <= 0)
        ev->o.buffer_batches = 10000;
    ev->ring = calloc((size_t)ev->o.buffer_batches, sizeof *ev->ring);
    pthread_mutex_init(&ev->mu, NULL);
    pthread_cond_init(&ev->cv, NULL);
    if (!ev->ring || !(ev->ctx = zmq_ctx_new())) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    int hwm = 100000, linger = 1000;
    ev->pub = zmq_socket(ev->ctx, ZMQ_PUB);
    if (!ev->pub)
        goto fail_zmq;
    zmq_setsockopt(ev->pub, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(ev->pub, ZMQ_LINGER, &linger, sizeof linger);
    if ((binds(o->endpoint) ? zmq_bind(ev->pub, o->endpoint) : zmq_connect(ev->pub, o->endpoint)) != 0) {
        tern_err_set(err, TERN_EINVAL, "kv events: cannot %s %s: %s", binds(o->endpoint) ? "bind" : "connect",
                     o->endpoint, zmq_strerror(zmq_errno()));
        goto fail;
    }
    if (o->replay_endpoint) {
        if (!(ev->replay = zmq_socket(ev->ctx, ZMQ_ROUTER)))
            goto fail_zmq;
        zmq_setsockopt(ev->replay, ZMQ_LINGER, &linger, sizeof linger);
        if (zmq_bind(ev->replay, o->replay_endpoint) != 0) {
            tern_err_set(err, TERN_EINVAL, "kv events: cannot bind the replay endpoint %s: %s", o->replay_endpoint,
                         zmq_strerror(zmq_errno()));
            goto fail;
        }
    }
    if (pthread_create(&ev->thread, NULL, publisher_main, ev)) {
        tern_err_set(err, TERN_ENOMEM, "kv events: cannot start the publisher thread");
        goto fail;
    }
    TERN_INFO("kv events: publishing on %s%s%s", o->endpoint, o->replay_endpoint ? ", replay on " : "",
              o->replay_endpoint ? o->replay_endpoint : "");
    return ev;
fail_zmq:
    tern_err_set(err, TERN_EINTERNAL, "kv events: %s", zmq_strerror(zmq_errno()));
fail:
    if (ev->pub)
        zmq_close(ev->pub);
    if (ev->replay)
        zmq_close(ev->replay);
    if (ev->ctx)
        zmq_ctx_term(ev->ctx);
    free(ev->ring);
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
    free(ev);
    return NULL;
}

void kv_events_free(kv_events *ev)
{
    if (!ev)
        return;
    pthread_mutex_lock(&ev->mu);
    ev->stop = 1;
    pthread_cond_signal(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
    pthread_join(ev->thread, NULL);
    zmq_close(ev->pub);
    if (ev->replay)
        zmq_close(ev->replay);
    zmq_ctx_term(ev->ctx);
    for (int i = 0; i < ev->o.buffer_batches; i++)
        batch_free(ev->ring[i]);
    free(ev->ring);
    pthread_mutex_destroy(&ev->mu);
    pthread_cond_destroy(&ev->cv);
    free(ev);
}
