/* Where a mixture's expert weights live on the CPU (model.h,
 * model_experts_opts_set). The weights are always the safetensors mapping
 * (read-only, private): nothing is copied. What this file decides is which
 * experts' pages are kept in memory:
 *
 * - MAPPED (default): nothing; the kernel pages the mapping as it likes.
 * - HOST: every expert's pages are advised (MADV_WILLNEED) and read once at
 *   load, so the first tokens do not wait on the disk.
 * - DISK: an LRU of experts up to the cache budget is resident. A pick of
 *   an expert in it is a hit (it moves to the front). A pick outside it is
 *   a miss: the expert's pages are advised and read (one byte per page,
 *   timed: the GB/s reported), and it joins the front, pinned with mlock
 *   while RLIMIT_MEMLOCK allows (after a refusal, the rest are only
 *   advised); the least recently used experts leave to make room - unlocked
 *   and released with MADV_DONTNEED, so the kernel may drop their pages. An
 *   expert larger than the whole budget is read and never kept.
 *
 * Only forward.c calls model_experts_touch, from the thread running the
 * forward (a model's forwards never overlap), so the LRU has no lock; the
 * counters are atomics, read by model_experts_stats_get from any thread
 * (the server's /stats and /metrics). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "model/model_int.h"

struct model_expert_cache {
    int where;              /* MODEL_EXPERTS_* */
    int n_expert;           /* ids are layer * n_expert + expert */
    size_t budget, total;
    _Atomic size_t resident;
    size_t *bytes;          /* [n_layer * n_expert] an expert's weight bytes, 0 in dense layers */
    int *prev, *next;       /* the LRU list of held experts (-1 ends), head most recent */
    unsigned char *held, *locked;
    int head, tail;
    int lock_refused;       /* mlock failed once: only advise from then on */
    int *gone;              /* experts that left (evicted, or read once) whose pair copies wait for */
    int n_gone;             /* model_experts_settle: the step may still read them */
    unsigned char *listed;  /* [id] in gone */
    _Atomic uint64_t hits, misses;
    _Atomic uint64_t streamed, ns; /* bytes read in on misses (and at load), and the nanoseconds it took */
};

static int g_where = MODEL_EXPERTS_MAPPED;
static size_t g_cache_bytes;

void model_experts_opts_set(int where, size_t cache_bytes)
{
    g_where = where;
    g_cache_bytes = cache_bytes;
}

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static size_t data_bytes(const model_weight *w)
{
    if (w->mx) /* the blocks (the scales, 1/16 of them, stay with the kernel's paging) */
        return (size_t)w->n_out * w->n_in / 2;
    return w->qbits ? (size_t)w->n_out * w->n_in * w->qbits / 8 : (size_t)w->n_out * w->n_in * tern_dtype_size(w->dtype);
}

/* The pages of w's data: [*lo, *lo + *len), every page it touches (outer)
 * or only those wholly its own (inner: releasing them cannot drop a
 * neighbour's bytes). */
static void span(const model_weight *w, int inner, char **lo, size_t *len)
{
    size_t pg = page_size();
    uintptr_t a = (uintptr_t)w->data, b = a + data_bytes(w);
    if (inner) {
        a = (a + pg - 1) & ~(uintptr_t)(pg - 1);
        b &= ~(uintptr_t)(pg - 1);
        if (b < a)
            b = a;
    } else {
        a &= ~(uintptr_t)(pg - 1);
        b = (b + pg - 1) & ~(uintptr_t)(pg - 1);
    }
    *lo = (char *)a;
    *len = b - a;
}

void model_weight_release(const model_weight *w)
{
    char *lo;
    size_t len;
    span(w, 1, &lo, &len);
    if (len)
        madvise(lo, len, MADV_DONTNEED);
}

void model_bytes_release(const void *p, size_t n)
{
    size_t pg = page_size();
    uintptr_t a = ((uintptr_t)p + pg - 1) & ~(uintptr_t)(pg - 1), b = ((uintptr_t)p + n) & ~(uintptr_t)(pg - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

void model_weight_populate(const model_weight *w)
{
    char *lo;
    size_t len;
    span(w, 1, &lo, &len);
#ifdef MADV_POPULATE_READ
    if (len && madvise(lo, len, MADV_POPULATE_READ) == 0)
        return;
#endif
    if (len) /* an older kernel: read-ahead at least */
        madvise(lo, len, MADV_WILLNEED);
}

enum { OP_READ, OP_ADVISE, OP_LOCK, OP_UNLOCK, OP_RELEASE };

/* Applies op to the three matrices of expert id; OP_LOCK returns -1 when
 * mlock refused (the matrices locked before the refusal are unlocked). The
 * router is always resident; an expert's {scale, bias} pair copies while
 * it is held (model_experts_touch, model_experts_settle). */
static int expert_op(tern_model *m, int id, int op)
{
    const model_expert_cache *xc = m->xc;
    const model_weight *ws = m->layers[id / xc->n_expert].experts + 3 * (id % xc->n_expert);
    size_t pg = page_size();
    for (int k = 0; k < 3; k++) {
        char *lo;
        size_t len;
        span(&ws[k], op == OP_RELEASE, &lo, &len);
        if (!len)
            continue;
        switch (op) {
        case OP_READ: {
            volatile const char *p = lo;
            unsigned sum = 0;
            for (size_t o = 0; o < len; o += pg)
                sum += (unsigned char)p[o];
            (void)sum;
            break;
        }
        case OP_ADVISE:
            madvise(lo, len, MADV_WILLNEED);
            break;
        case OP_LOCK:
            if (mlock(lo, len)) {
                for (int j = 0; j < k; j++) {
                    span(&ws[j], 0, &lo, &len);
                    munlock(lo, len);
                }
                return -1;
            }
            break;
        case OP_UNLOCK:
            munlock(lo, len);
            break;
        default:
            madvise(lo, len, MADV_DONTNEED);
            break;
        }
    }
    return 0;
}

static void lru_unlink(model_expert_cache *xc, int id)
{
    int p = xc->prev[id], n = xc->next[id];
    if (p >= 0)
        xc->next[p] = n;
    else
        xc->head = n;
    if (n >= 0)
        xc->prev[n] = p;
    else
        xc->tail = p;
}

static void lru_push_front(model_expert_cache *xc, int id)
{
    xc->prev[id] = -1;
    xc->next[id] = xc->head;
    if (xc->head >= 0)
        xc->prev[xc->head] = id;
    xc->head = id;
    if (xc->tail < 0)
        xc->tail = id;
}

/* Expert id's pair copies are to go at the next model_experts_settle. */
static void pairs_leave(model_expert_cache *xc, int id)
{
    if (!xc->listed[id]) {
        xc->listed[id] = 1;
        xc->gone[xc->n_gone++] = id;
    }
}

void model_experts_settle(tern_model *m)
{
    model_expert_cache *xc = m->xc;
    if (!xc || xc->where != MODEL_EXPERTS_DISK)
        return;
    for (int i = 0; i < xc->n_gone; i++) {
        int id = xc->gone[i];
        xc->listed[id] = 0;
        if (xc->held[id]) /* back in the cache since */
            continue;
        model_weight *ws = m->layers[id / xc->n_expert].experts + 3 * (id % xc->n_expert);
        for (int k = 0; k < 3; k++) {
            free(ws[k].sb);
            free(ws[k].sb16);
            ws[k].sb = NULL;
            ws[k].sb16 = NULL;
        }
    }
    xc->n_gone = 0;
}

static void evict(tern_model *m, int id)
{
    model_expert_cache *xc = m->xc;
    pairs_leave(xc, id);
    lru_unlink(xc, id);
    xc->held[id] = 0;
    xc->resident -= xc->bytes[id];
    if (xc->locked[id])
        expert_op(m, id, OP_UNLOCK);
    xc->locked[id] = 0;
    expert_op(m, id, OP_RELEASE);
}

int model_experts_touch(tern_model *m, int layer, int expert, tern_err *err)
{
    model_expert_cache *xc = m->xc;
    if (!xc)
        return 0;
    int id = layer * xc->n_expert + expert;
    if (xc->where != MODEL_EXPERTS_DISK || xc->held[id]) {
        atomic_fetch_add_explicit(&xc->hits, 1, memory_order_relaxed);
        if (xc->held[id] && xc->head != id) {
            lru_unlink(xc, id);
            lru_push_front(xc, id);
        }
        return 0;
    }
    /* the pair copies first: made from the file's scales on a miss, kept while the expert is held */
    model_weight *ws = m->layers[layer].experts + 3 * expert;
    for (int k = 0; k < 3; k++) {
        int rc = model_weight_pairs(&ws[k], 1, 1, err);
        if (rc)
            return rc;
    }
    atomic_fetch_add_explicit(&xc->misses, 1, memory_order_relaxed);
    size_t b = xc->bytes[id];
    while (xc->tail >= 0 && xc->resident + b > xc->budget)
        evict(m, xc->tail);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expert_op(m, id, OP_ADVISE);
    expert_op(m, id, OP_READ);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    atomic_fetch_add_explicit(&xc->ns, (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec)),
                              memory_order_relaxed);
    atomic_fetch_add_explicit(&xc->streamed, (uint64_t)b, memory_order_relaxed);
    if (b > xc->budget) { /* larger than the whole cache: used once, not kept */
        pairs_leave(xc, id);
        return 0;
    }
    if (!xc->lock_refused) {
        if (expert_op(m, id, OP_LOCK) == 0) {
            xc->locked[id] = 1;
        } else {
            xc->lock_refused = 1;
            TERN_WARN("expert cache: mlock refused (RLIMIT_MEMLOCK, see ulimit -l): cached experts are kept by "
                      "advice only, the kernel may still drop their pages");
        }
    }
    xc->held[id] = 1;
    xc->resident += b;
    lru_push_front(xc, id);
    return 0;
}

void model_experts_add(tern_model *m, uint64_t hits, uint64_t misses, double copied_bytes, double seconds,
                       size_t resident)
{
    model_expert_cache *xc = m->xc;
    if (!xc)
        return;
    atomic_fetch_add_explicit(&xc->hits, hits, memory_order_relaxed);
    atomic_fetch_add_explicit(&xc->misses, misses, memory_order_relaxed);
    atomic_fetch_add_explicit(&xc->streamed, (uint64_t)copied_bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&xc->ns, (uint64_t)(seconds * 1e9), memory_order_relaxed);
    atomic_store_explicit(&xc->resident, resident, memory_order_relaxed);
}

int model_experts_init(tern_model *m, tern_err *err)
{
    const model_config *c = &m->cfg;
    if (!c->n_expert || g_where == MODEL_EXPERTS_MAPPED)
        return 0;
    for (int l = 0; l < c->n_layer; l++) /* advice and MADV_DONTNEED are for the mapping's pages only */
        if (m->layers[l].experts && (m->layers[l].experts[0].own || m->layers[l].experts[2].own))
            return tern_err_set(err, TERN_EUNSUPPORTED,
                                "--experts-in host|disk: this checkpoint's experts are input-major (gpt_oss "
                                "gate_up_proj / down_proj in %s) and were transposed into memory at load; "
                                "only MXFP4 or converted experts stay in the mapping",
                                tern_dtype_name(m->layers[l].experts[0].dtype));
    size_t n = (size_t)c->n_layer * c->n_expert;
    model_expert_cache *xc = calloc(1, sizeof *xc);
    if (!xc)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    m->xc = xc;
    xc->where = g_where;
    xc->n_expert = c->n_expert;
    xc->budget = g_cache_bytes;
    xc->head = xc->tail = -1;
    xc->bytes = calloc(n, sizeof *xc->bytes);
    xc->prev = malloc(n * sizeof *xc->prev);
    xc->next = malloc(n * sizeof *xc->next);
    xc->held = calloc(n, 1);
    xc->locked = calloc(n, 1);
    xc->listed = calloc(n, 1);
    xc->gone = malloc(n * sizeof *xc->gone);
    if (!xc->bytes || !xc->prev || !xc->next || !xc->held || !xc->locked || !xc->listed || !xc->gone)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    for (int l = 0; l < c->n_layer; l++) {
        const model_weight *ex = m->layers[l].experts;
        for (int e = 0; ex && e < c->n_expert; e++) {
            size_t id = (size_t)l * c->n_expert + e;
            xc->bytes[id] = data_bytes(&ex[3 * e]) + data_bytes(&ex[3 * e + 1]) + data_bytes(&ex[3 * e + 2]);
            xc->total += xc->bytes[id];
            if (xc->where == MODEL_EXPERTS_HOST)
                expert_op(m, (int)id, OP_ADVISE);
        }
    }
    if (xc->where == MODEL_EXPERTS_HOST) { /* then read: the advice lets the reads overlap */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (size_t id = 0; id < n; id++)
            if (xc->bytes[id])
                expert_op(m, (int)id, OP_READ);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        atomic_store(&xc->ns, (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec)));
        atomic_store(&xc->streamed, (uint64_t)xc->total);
        atomic_store(&xc->resident, xc->total);
    }
    return 0;
}

int model_experts_stats_get(const tern_model *m, model_experts_stats *st)
{
    memset(st, 0, sizeof *st);
    if (!m->cfg.n_expert)
        return TERN_ENOTFOUND;
    const model_expert_cache *xc = m->xc;
    if (!xc)
        return 0; /* MAPPED: no counters */
    st->where = xc->where;
    st->total_bytes = xc->total;
    st->cache_bytes = xc->budget;
    st->resident_bytes = atomic_load_explicit(&xc->resident, memory_order_relaxed);
    st->locked = xc->where == MODEL_EXPERTS_DISK && !xc->lock_refused;
    st->hits = atomic_load_explicit(&xc->hits, memory_order_relaxed);
    st->misses = atomic_load_explicit(&xc->misses, memory_order_relaxed);
    st->streamed_bytes = (double)atomic_load_explicit(&xc->streamed, memory_order_relaxed);
    st->stream_seconds = 1e-9 * (double)atomic_load_explicit(&xc->ns, memory_order_relaxed);
    return 0;
}

void model_experts_free(tern_model *m)
{
    model_expert_cache *xc = m->xc;
    if (!xc)
        return;
    if (xc->bytes) {
        model_experts_stats st;
        model_experts_stats_get(m, &st);
        uint64_t picks = st.hits + st.misses;
        TERN_INFO("experts (%s): %llu picks, hit rate %.1f%%, %.2f GB read in %.2f s (%.2f GB/s), %.2f of %.2f GB "
                  "held",
                  st.where == MODEL_EXPERTS_DISK ? "disk" : "host", (unsigned long long)picks,
                  picks ? 100.0 * (double)st.hits / (double)picks : 0.0, st.streamed_bytes / 1e9,
                  st.stream_seconds, st.stream_seconds > 0 ? st.streamed_bytes / 1e9 / st.stream_seconds : 0.0,
                  st.resident_bytes / 1e9, st.total_bytes / 1e9);
        for (int id = xc->head; id >= 0; id = xc->next[id])
            if (xc->locked[id])
                expert_op(m, id, OP_UNLOCK);
    }
    free(xc->bytes);
    free(xc->prev);
    free(xc->next);
    free(xc->held);
    free(xc->locked);
    free(xc->listed);
    free(xc->gone);
    free(xc);
    m->xc = NULL;
}
