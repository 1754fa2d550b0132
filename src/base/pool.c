/* Spinning thread pool (see pool.h). A job is published by bumping
 * `gen`; workers spinning on it start at once, sleeping ones are woken
 * through the condition variable (only when some sleep, so the hot path
 * makes no system call). */
#include "pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/cpu.h"

/* ~10-20 us of pause instructions: longer than the gap between the jobs
 * of one decode step, shorter than a scheduler tick, so idle workers give
 * their core back soon on a shared machine. */
#define SPIN_ROUNDS_DEFAULT 1000
static int spin_rounds = SPIN_ROUNDS_DEFAULT; /* TERN_SPIN overrides, for measurements */

struct tern_pool {
    int n;
    pthread_t *threads; /* [n - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_ulong gen;
    atomic_int pending; /* workers (not the caller) still on the job */
    atomic_int sleepers;
    atomic_int stop;
    tern_pool_fn fn;
    void *ctx;
    long n_items;
    int n_parts;
    long chunk;        /* > 0: items claimed `chunk` at a time from next (tern_pool_for_chunks) */
    atomic_long next;
};

static void run_part(tern_pool *p, int w)
{
    if (p->chunk > 0) {
        for (;;) {
            long b = atomic_fetch_add(&p->next, p->chunk);
            if (b >= p->n_items)
                return;
            p->fn(p->ctx, b, b + p->chunk < p->n_items ? b + p->chunk : p->n_items, w);
        }
    }
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
    worker_arg a = *(worker_arg *)arg;
    free(arg);
    tern_pool *p = a.p;
    unsigned long seen = 0;
    for (;;) {
        unsigned long g;
        int k = 0;
        while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop) && k++ < spin_rounds)
            _mm_pause();
        if (g == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = g;
        run_part(p, a.w);
        atomic_fetch_sub(&p->pending, 1);
    }
}

tern_pool *tern_pool_new(int n_threads)
{
    if (n_threads <= 0)
        n_threads = tern_cpu_physical_count();
    const char *env = getenv("TERN_SPIN");
    if (env)
        spin_rounds = atoi(env);
    tern_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) {
        tern_pool_free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a)
            break;
        a->p = p;
        a->w = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, a) != 0) {
            free(a);
            break;
        }
        p->n = i + 1;
    }
    if (p->n != n_threads) {
        tern_pool_free(p);
        return NULL;
    }
    return p;
}

void tern_pool_free(tern_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++)
        pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p);
}

int tern_pool_size(const tern_pool *p) { return p ? p->n : 1; }

static void pool_run(tern_pool *p, long n, long grain, long chunk, tern_pool_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    if (grain < 1)
        grain = 1;
    long parts = (n + grain - 1) / grain;
    if (!p || p->n == 1 || parts == 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->n_parts = parts < p->n ? (int)parts : p->n;
    p->chunk = chunk;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->gen, 1); /* publishes the fields above (seq_cst) */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_part(p, 0);
    for (long k = 0; atomic_load(&p->pending) > 0; k++) {
        if (k < spin_rounds)
            _mm_pause();
        else
            sched_yield();
    }
}

void tern_pool_for(tern_pool *p, long n, long grain, tern_pool_fn fn, void *ctx) { pool_run(p, n, grain, 0, fn, ctx); }

void tern_pool_for_chunks(tern_pool *p, long n, long chunk, tern_pool_fn fn, void *ctx)
{
    if (chunk < 1)
        chunk = 1;
    pool_run(p, n, chunk, chunk, fn, ctx);
}
