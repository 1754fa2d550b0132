/* A fixed thread pool for the many short data-parallel jobs of a forward
 * pass (a few per layer, tens of microseconds each at decode). Between jobs,
 * workers spin briefly on a generation counter before sleeping, so the next
 * job of the same step starts without a futex wake-up (TERN_SPIN=0 turns
 * spinning off). The calling thread takes part as worker 0. */
#ifndef TERN_BASE_POOL_H
#define TERN_BASE_POOL_H

typedef struct tern_pool tern_pool;

/* fn(ctx, begin, end, worker) handles items [begin, end). */
typedef void (*tern_pool_fn)(void *ctx, long begin, long end, int worker);

/* n_threads <= 0 means one per physical core (tern_cpu_physical_count).
 * Returns NULL on failure. */
tern_pool *tern_pool_new(int n_threads);
void tern_pool_free(tern_pool *p);
int tern_pool_size(const tern_pool *p);

/* Splits [0, n) into contiguous chunks, at least `grain` items each, runs them
 * on all workers and returns when all are done. Not reentrant: one caller at
 * a time per pool. p may be NULL (runs inline). */
void tern_pool_for(tern_pool *p, long n, long grain, tern_pool_fn fn, void *ctx);

/* The same with [0, n) cut into pieces of `chunk` items (the last may be
 * shorter) that the workers claim one at a time as they finish the last
 * (a shared counter): a worker that starts late or runs slow takes fewer
 * pieces instead of holding everyone at the end. fn may be called several
 * times per worker; `worker` still names the calling worker. */
void tern_pool_for_chunks(tern_pool *p, long n, long chunk, tern_pool_fn fn, void *ctx);

#endif
