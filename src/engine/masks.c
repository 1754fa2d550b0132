/* The batch matcher: the grammar masks of every constrained output row of
 * a step computed together, the rows spread over the engine's mask threads
 * (a pool of its own, made on the first step with two constrained rows).
 * On a device this runs while the forward does; on the host it runs after
 * the forward, before the rows sample, instead of one row after another.
 * Rows are independent (each has its own matcher); rows sharing a compiled
 * grammar share its token-set caches, which are locked (compiled.c). Only
 * the engine thread calls these. */
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/pool.h"
#include "engine/engine_int.h"

/* Rows per mask thread below which a step's masks are computed inline. */
#define ENGINE_MASK_MIN_ROWS 2
/* Mask threads at most (engine_opts.mask_threads; 1 = inline). */
#define ENGINE_MASK_MAX_THREADS 8

/* The grammar masks of r's output positions j .. j + n_spec: position i's
 * is the matcher's after the drafts before it (accepted ahead here, rolled
 * back at the end), as the verification walk will see it if it gets there.
 * A mask that cannot be computed is marked bad (an error only if that
 * position is reached); a draft the grammar refuses ends the walk there. */
static void masks_ahead(tern_engine *e, engine_req *r, int j)
{
    int32_t nw = (e->n_vocab + 31) / 32;
    int adv = 0;
    for (int i = 0; i <= r->n_spec; i++) {
        if (r->cops->fill_mask(r->cctx, e->masks + (size_t)(j + i) * nw, nw)) {
            e->mask_bad[j + i] = 1;
            break;
        }
        e->mask_on[j + i] = 1;
        if (i == r->n_spec || r->cops->accept(r->cctx, r->draft[i]))
            break;
        adv++;
    }
    if (adv > 0 && r->cops->rollback(r->cctx, adv)) { /* the matcher is lost: fail the row */
        e->mask_bad[j] = 1;
        e->mask_on[j] = 0;
    }
}

static void masks_run(void *ctx, long begin, long end, int worker)
{
    (void)worker;
    tern_engine *e = ctx;
    for (long k = begin; k < end; k++) {
        int j = e->mask_rows[k];
        masks_ahead(e, e->out_req[j], j);
    }
}

static int mask_threads(const tern_engine *e)
{
    int n = e->o.mask_threads > 0 ? e->o.mask_threads : tern_cpu_physical_count();
    if (n > ENGINE_MASK_MAX_THREADS)
        n = ENGINE_MASK_MAX_THREADS;
    return n < 1 ? 1 : n;
}

int engine_masks_reserve(tern_engine *e)
{
    if (e->masks && e->mask_rows)
        return 0;
    int rows = e->o.max_batch * (e->n_draft + 1);
    if (!e->masks) {
        e->masks = malloc((size_t)rows * ((e->n_vocab + 31) / 32) * sizeof *e->masks);
        e->mask_on = malloc((size_t)rows);
        e->mask_bad = malloc((size_t)rows);
    }
    e->mask_rows = malloc((size_t)rows * sizeof *e->mask_rows);
    if (!e->masks || !e->mask_on || !e->mask_bad || !e->mask_rows)
        return TERN_ENOMEM;
    return 0;
}

int engine_masks_count(const tern_engine *e, int n_out)
{
    int n = 0;
    for (int j = 0; j < n_out; j++)
        n += e->out_req[j] && e->out_req[j]->cops;
    return n;
}

void engine_masks_ahead(tern_engine *e, int n_out)
{
    memset(e->mask_on, 0, (size_t)n_out);
    memset(e->mask_bad, 0, (size_t)n_out);
    int n = 0;
    for (int j = 0; j < n_out; j++)
        if (e->out_req[j] && e->out_req[j]->cops)
            e->mask_rows[n++] = j;
    if (n >= ENGINE_MASK_MIN_ROWS && !e->mask_pool && !e->mask_pool_failed) {
        int t = mask_threads(e);
        if (t > 1)
            e->mask_pool = tern_pool_new(t);
        e->mask_pool_failed = !e->mask_pool;
    }
    if (n >= ENGINE_MASK_MIN_ROWS && e->mask_pool)
        tern_pool_for(e->mask_pool, n, 1, masks_run, e);
    else
        masks_run(e, 0, n, 0);
}

void engine_masks_free(tern_engine *e)
{
    tern_pool_free(e->mask_pool);
    e->mask_pool = NULL;
    free(e->mask_rows);
    e->mask_rows = NULL;
}
