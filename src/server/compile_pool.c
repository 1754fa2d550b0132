/* The grammar compile pool: a fixed number of worker threads and a bounded
 * queue. A request's structured-output and tool grammars are compiled here,
 * not on its connection thread, so that
 *   - at most --compile-threads compiles run at once, whatever the number
 *     of connections (beyond --compile-queue waiting ones, 429);
 *   - the connection thread waits polling its client's socket: a client that
 *     disconnects cancels its compile (a queued one never starts);
 *   - server_stop cancels every compile, so SIGTERM is never held up by one;
 *   - one deadline (the compile time limit, counted from the job's start)
 *     bounds all of a job's phases together (grammar_thread_control_set).
 * A job lives on its waiter's stack: the waiter leaves only when no worker
 * touches the job any more (done, or taken off the queue). */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "grammar/grammar.h"
#include "server/server_int.h"

/* How often a waiting connection thread re-checks for server shutdown when
 * nothing wakes it (the stop path pokes waiters anyway). */
#define COMPILE_POLL_MS 250

typedef struct srv_compile_job {
    int (*fn)(void *arg, api_error *e);
    void *arg;
    int rc;
    api_error err;
    int cancel;                   /* read by the grammar code through grammar_thread_control_set */
    double spent_ms;              /* the request's time before it was queued (parsing): taken off its limit */
    int running, done;            /* under the pool's mutex */
    srv_waker *wk;                /* poked when done (or cancelled by the server) */
    struct srv_compile_job *next; /* queue, or the running list */
} srv_compile_job;

struct srv_compile_pool {
    tern_server *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t *threads;
    int n_threads, n_started, max_queue;
    srv_compile_job *head, *tail; /* queued, oldest first */
    srv_compile_job *running;     /* being compiled */
    int n_queued, n_running, stop;
    long time_limit_ms;
};

static void poke(srv_waker *w)
{
    if (w)
        srv_waker_notify(w);
}

static void *worker(void *arg)
{
    srv_compile_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && !p->head)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        srv_compile_job *j = p->head;
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        p->n_queued--;
        j->running = 1;
        j->next = p->running;
        p->running = j;
        p->n_running++;
        pthread_mutex_unlock(&p->mu);

        double t0 = grammar_clock_ms();
        /* the request's own time before the queue counts (at most half the
         * limit), its wait in the queue does not */
        double lim = (double)p->time_limit_ms, spent = j->spent_ms < lim / 2 ? j->spent_ms : lim / 2;
        grammar_thread_control_set(&j->cancel, lim > 0 ? t0 + lim - (spent > 0 ? spent : 0) : 0);
        int rc = j->fn(j->arg, &j->err);
        grammar_thread_control_set(NULL, 0);
        double ms = grammar_clock_ms() - t0;

        pthread_mutex_lock(&p->mu);
        for (srv_compile_job **pp = &p->running; *pp; pp = &(*pp)->next)
            if (*pp == j) {
                *pp = j->next;
                break;
            }
        p->n_running--;
        j->rc = rc;
        j->done = 1;
        atomic_fetch_add(&p->s->met.compiles, 1);
        atomic_fetch_add(&p->s->met.compile_us, (long long)(ms * 1e3));
        if (__atomic_load_n(&j->cancel, __ATOMIC_RELAXED))
            atomic_fetch_add(&p->s->met.compile_cancelled, 1);
        poke(j->wk); /* under the lock: the waiter cannot leave before it */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int srv_compile_pool_start(tern_server *s, int n_threads, int max_queue, long time_limit_ms, tern_err *err)
{
    srv_compile_pool *p = calloc(1, sizeof *p);
    if (!p)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    p->s = s;
    p->n_threads = n_threads > 0 ? n_threads : 1;
    p->max_queue = max_queue > 0 ? max_queue : 1;
    p->time_limit_ms = time_limit_ms;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    s->compile = p;
    if (!(p->threads = calloc((size_t)p->n_threads, sizeof *p->threads)))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    for (int i = 0; i < p->n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0)
            return tern_err_set(err, TERN_EIO, "cannot start grammar compile threads");
        p->n_started++;
    }
    return 0;
}

void srv_compile_pool_cancel_all(tern_server *s)
{
    srv_compile_pool *p = s->compile;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    for (srv_compile_job *j = p->head; j; j = j->next) {
        __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
        poke(j->wk);
    }
    for (srv_compile_job *j = p->running; j; j = j->next) {
        __atomic_store_n(&j->cancel, 1, __ATOMIC_RELAXED);
        poke(j->wk);
    }
    pthread_mutex_unlock(&p->mu);
}

void srv_compile_pool_free(tern_server *s)
{
    srv_compile_pool *p = s->compile;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1; /* MHD has stopped: no waiter is left, the queue is empty */
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
    s->compile = NULL;
}

void srv_compile_pool_counts(tern_server *s, int *n_queued, int *n_running)
{
    srv_compile_pool *p = s->compile;
    *n_queued = *n_running = 0;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    *n_queued = p->n_queued;
    *n_running = p->n_running;
    pthread_mutex_unlock(&p->mu);
}

/* Takes j off the queue if no worker took it yet (mu held); 1 if it did. */
static int dequeue_locked(srv_compile_pool *p, srv_compile_job *j)
{
    if (j->running || j->done)
        return 0;
    srv_compile_job *prev = NULL;
    for (srv_compile_job *q = p->head; q; prev = q, q = q->next)
        if (q == j) {
            if (prev)
                prev->next = j->next;
            else
                p->head = j->next;
            if (p->tail == j)
                p->tail = prev;
            p->n_queued--;
            return 1;
        }
    return 0;
}

int srv_compile_run(tern_server *s, int client_fd, double t_start, int (*fn)(void *arg, api_error *e), void *arg,
                    api_error *e)
{
    srv_compile_pool *p = s->compile;
    if (!p)
        return fn(arg, e);
    srv_compile_job j = {.fn = fn, .arg = arg};
    if (t_start > 0)
        j.spent_ms = (tern_time_s() - t_start) * 1e3;
    if (!(j.wk = srv_waker_get(s)))
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc = 0;
    pthread_mutex_lock(&p->mu);
    if (atomic_load(&s->stopping)) {
        pthread_mutex_unlock(&p->mu);
        rc = api_error_set(e, 503, "server_error", NULL, NULL, "server shutting down");
        goto out;
    }
    if (p->n_queued >= p->max_queue) {
        pthread_mutex_unlock(&p->mu);
        atomic_fetch_add(&s->met.compile_rejected, 1);
        rc = api_error_set(e, 429, "server_busy", "compile_queue_full", NULL,
                           "server busy: %d grammar compiles are waiting; retry later", p->n_queued);
        goto out;
    }
    if (p->tail)
        p->tail->next = &j;
    else
        p->head = &j;
    p->tail = &j;
    p->n_queued++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);

    int gone = 0; /* 1: the client left, 2: the server stops */
    for (;;) {
        pthread_mutex_lock(&p->mu);
        int done = j.done;
        if (!done && gone && dequeue_locked(p, &j))
            done = 1; /* never started */
        pthread_mutex_unlock(&p->mu);
        if (done)
            break;
        if (!gone && atomic_load(&s->stopping))
            gone = 2;
        if (gone) {
            __atomic_store_n(&j.cancel, 1, __ATOMIC_RELAXED);
            /* the worker notices within milliseconds and pokes */
        }
        struct pollfd pf[2] = {{.fd = j.wk->efd, .events = POLLIN}, {.fd = client_fd, .events = POLLRDHUP}};
        nfds_t np = !gone && client_fd >= 0 ? 2 : 1;
        int n = poll(pf, np, COMPILE_POLL_MS);
        if (n < 0 && errno != EINTR)
            gone = gone ? gone : 2;
        if (np == 2 && n > 0 && srv_peer_closed(client_fd, pf[1].revents))
            gone = 1;
        if (n > 0 && (pf[0].revents & POLLIN)) {
            uint64_t cnt;
            ssize_t r = read(j.wk->efd, &cnt, sizeof cnt);
            (void)r;
        }
    }
    if (gone == 1) {
        TERN_DEBUG("server: client left during a grammar compile; cancelled");
        rc = api_error_set(e, 499, "server_error", NULL, NULL, "client closed the connection");
    } else if (gone == 2) {
        rc = api_error_set(e, 503, "server_error", NULL, NULL, "request abandoned (server shutting down)");
    } else {
        rc = j.rc;
        if (rc)
            *e = j.err;
    }
out:
    /* drain a late poke so the pooled waker starts clean */
    {
        uint64_t cnt;
        ssize_t r = read(j.wk->efd, &cnt, sizeof cnt);
        (void)r;
    }
    srv_waker_put(s, j.wk);
    return rc;
}
