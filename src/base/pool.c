/* Thread pool (see pool.h). Workers sleep on a condition variable between
 * jobs; a job is split into one contiguous range per worker, which keeps
 * each worker streaming through its own rows of a weight matrix. */
#include "pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "cpu.h"

struct tern_pool {
    int n;                 /* workers including the caller */
    pthread_t *threads;    /* [n-1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    unsigned long gen;     /* job generation, bumped per job */
    int pending;           /* workers still running the current job */
    int stop;
    /* current job */
    tern_pool_fn fn;
    void *ctx;
    long n_items;
    int n_parts;
};

static void run_part(tern_pool *p, int w)
{
    if (w >= p->n_parts)
        return;
    long per = p->n_items / p->n_parts, rem = p->n_items % p->n_parts;
    long b = w * per + (w < rem ? w : rem);
    long e = b + per + (w < rem ? 1 : 0);
    if (e > b)
        p->fn(p->ctx, b, e, w);
}

typedef struct { tern_pool *p; int w; } worker_arg;

static void *worker_main(void *arg)
{
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    tern_pool *p = wa.p;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->cv_work, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        pthread_mutex_unlock(&p->mu);
        run_part(p, wa.w);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

tern_pool *tern_pool_new(int n_threads)
{
    if (n_threads <= 0)
        n_threads = tern_cpu_count();
    tern_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_work, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads)
        goto out_free;
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa)
            goto out_stop;
        wa->p = p;
        wa->w = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            goto out_stop;
        }
    }
    return p;
out_stop:
    /* Shrink to the threads that started, then free. */
    for (int i = 1; i < n_threads; i++)
        if (!p->threads[i - 1]) {
            p->n = i;
            break;
        }
    tern_pool_free(p);
    return NULL;
out_free:
    free(p);
    return NULL;
}

void tern_pool_free(tern_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_work);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p);
}

int tern_pool_size(const tern_pool *p) { return p ? p->n : 1; }

void tern_pool_for(tern_pool *p, long n, long grain, tern_pool_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    int parts = p ? p->n : 1;
    if ((long)parts > (n + grain - 1) / grain)
        parts = (int)((n + grain - 1) / grain);
    if (parts <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->n_parts = parts;
    p->pending = p->n - 1;
    p->gen++;
    pthread_cond_broadcast(&p->cv_work);
    pthread_mutex_unlock(&p->mu);
    run_part(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
