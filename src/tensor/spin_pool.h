/* A thread pool for the many short parallel jobs of a forward pass (a few
 * per layer, tens of microseconds each at decode). Between jobs, workers spin
 * briefly on a generation counter before sleeping, so the next job of the
 * same step starts without a futex wake-up; the caller spins for the job's
 * end. Same splitting contract as tern_pool_for (base/pool.h). */
#ifndef TERN_TENSOR_SPIN_POOL_H
#define TERN_TENSOR_SPIN_POOL_H

#include "base/pool.h"

typedef struct tern_spool tern_spool;

/* n_threads <= 0: one per core. NULL on failure. */
tern_spool *tern_spool_new(int n_threads);
void tern_spool_free(tern_spool *p);
int tern_spool_size(const tern_spool *p);
/* Runs fn over [0, n) in contiguous chunks of at least grain items, one per
 * worker at most, the caller as worker 0; returns when all are done. One
 * caller at a time. */
void tern_spool_for(tern_spool *p, long n, long grain, tern_pool_fn fn, void *ctx);

#endif
