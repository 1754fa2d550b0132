/* Compile cache (see cache.h). One mutex guards the entry list; compiles
 * run outside it. An entry is PENDING while its first requester compiles
 * (others wait on the cache's condition variable), then READY or FAILED.
 * Entries live on one list in recency order (head = most recent) and are
 * reference counted: eviction unlinks them, the last release frees. The
 * number of distinct specs a server sees is small (hundreds), so lookup is
 * a scan comparing a 64-bit hash first. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/cache.h"
#include "grammar/compiled_int.h"

enum { ENT_PENDING, ENT_READY, ENT_FAILED };

struct grammar_cache_ref {
    grammar_cache_ref *prev, *next; /* recency list, while linked */
    int linked;
    int state;
    int refs;              /* holders; the list's link counts as one */
    uint64_t hash;
    char *key;
    size_t key_len;
    grammar_compiled *cg;  /* READY */
    tern_err err;          /* FAILED */
    size_t bytes;          /* estimate, refreshed on release */
};

struct grammar_cache {
    const grammar_vocab *v;
    grammar_limits lim;
    size_t max_bytes, bytes;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    grammar_cache_ref *head, *tail;
    size_t n;
    grammar_cache_stats st;
};

/* 256 MiB: the JSON-schema grammars of a busy server are a few MiB each
 * once their token sets are filled; this keeps dozens without crowding
 * out the KV cache. */
#define GRAMMAR_CACHE_DEFAULT_BYTES ((size_t)256 << 20)

/* How often a thread waiting for another's compile checks its own cancel
 * flag and deadline (grammar_thread_control_set). */
#define CACHE_WAIT_SLICE_MS 20

static uint64_t key_hash(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)k[i];
        h *= 1099511628211ull;
    }
    return h;
}

grammar_cache *grammar_cache_new(const grammar_vocab *vocab, size_t max_bytes, const grammar_limits *limits,
                                 tern_err *err)
{
    grammar_cache *c = calloc(1, sizeof *c);
    if (!c) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    c->v = vocab;
    c->max_bytes = max_bytes ? max_bytes : GRAMMAR_CACHE_DEFAULT_BYTES;
    if (limits)
        c->lim = *limits;
    else
        grammar_limits_init(&c->lim);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    return c;
}

static void ent_free(grammar_cache_ref *r)
{
    grammar_compiled_free(r->cg);
    free(r->key);
    free(r);
}

static void unlink_ent(grammar_cache *c, grammar_cache_ref *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else
        c->head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        c->tail = r->prev;
    r->prev = r->next = NULL;
    r->linked = 0;
    c->n--;
    c->bytes -= r->bytes;
}

static void push_front(grammar_cache *c, grammar_cache_ref *r)
{
    r->prev = NULL;
    r->next = c->head;
    if (c->head)
        c->head->prev = r;
    c->head = r;
    if (!c->tail)
        c->tail = r;
    r->linked = 1;
    c->n++;
    c->bytes += r->bytes;
}

/* Drops one reference with c->mu held; frees on the last. */
static void unref_locked(grammar_cache_ref *r)
{
    if (--r->refs == 0)
        ent_free(r);
}

/* Evicts least-recent finished entries until the budget holds. */
static void trim_locked(grammar_cache *c)
{
    grammar_cache_ref *r = c->tail;
    while (c->bytes > c->max_bytes && r) {
        grammar_cache_ref *prev = r->prev;
        if (r->state != ENT_PENDING) {
            unlink_ent(c, r);
            c->st.evictions++;
            unref_locked(r);
        }
        r = prev;
    }
}

void grammar_cache_free(grammar_cache *c)
{
    if (!c)
        return;
    for (grammar_cache_ref *r = c->head, *next; r; r = next) {
        next = r->next;
        ent_free(r);
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c);
}

grammar_compiled *grammar_cache_ref_compiled(grammar_cache_ref *r) { return r ? r->cg : NULL; }

static grammar_cache_ref *find_locked(grammar_cache *c, uint64_t h, const char *key, size_t n)
{
    for (grammar_cache_ref *r = c->head; r; r = r->next)
        if (r->hash == h && r->key_len == n && !memcmp(r->key, key, n))
            return r;
    return NULL;
}

/* Computes the token set of every byte-reading state now, in the caller's
 * thread, so the engine thread never stalls on a first mask. Bounded by
 * the compile's time limit (counted from t0). */
static int warm(grammar_compiled *cg, double t0, long max_ms, tern_err *err)
{
    const grammar *g = cg->g;
    for (int32_t s = 0; s < g->n_states; s++) {
        if (g->be_off[s + 1] == g->be_off[s])
            continue;
        if (!gcompiled_entry(cg, s))
            return tern_err_set(err, TERN_ENOMEM, "grammar: out of memory computing token sets");
        int stop = (s & 15) == 0 ? grammar_thread_stopped() : 0;
        if (stop == TERN_ECANCELED)
            return tern_err_set(err, stop, "grammar: compile cancelled");
        if ((s & 15) == 0 && (stop || (max_ms > 0 && gclock_ms() - t0 > (double)max_ms)))
            return tern_err_set(err, TERN_ETIMEOUT,
                                "grammar too large: its token sets were not computed within %ld ms (%d states)",
                                max_ms, (int)g->n_states);
    }
    return 0;
}

grammar_cache_ref *grammar_cache_get(grammar_cache *c, const char *key, size_t key_len, grammar_cache_build_fn build,
                                     void *user, int *hit, double *compile_ms, tern_err *err)
{
    double t0 = gclock_ms();
    uint64_t h = key_hash(key, key_len);
    *hit = 0;
    pthread_mutex_lock(&c->mu);
    grammar_cache_ref *r;
    while ((r = find_locked(c, h, key, key_len))) {
        r->refs++;
        int stop = 0;
        if (r->state == ENT_PENDING) {
            c->st.waits++;
            while (r->state == ENT_PENDING && !(stop = grammar_thread_stopped())) {
                /* wake now and then: this thread's own cancel or deadline ends the wait */
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_nsec += CACHE_WAIT_SLICE_MS * 1000000L;
                ts.tv_sec += ts.tv_nsec / 1000000000L;
                ts.tv_nsec %= 1000000000L;
                pthread_cond_timedwait(&c->cv, &c->mu, &ts);
            }
        } else {
            c->st.hits++;
        }
        if (stop) {
            unref_locked(r);
            pthread_mutex_unlock(&c->mu);
            tern_err_set(err, stop, "grammar: %s while waiting for the same grammar's compile",
                         stop == TERN_ECANCELED ? "cancelled" : "compile time limit exceeded");
            *compile_ms = gclock_ms() - t0;
            return NULL;
        }
        if (r->state == ENT_FAILED && !r->linked) {
            /* the compiling thread was cut short (cancelled): compile it here */
            unref_locked(r);
            continue;
        }
        if (r->linked) { /* most recent first */
            unlink_ent(c, r);
            push_front(c, r);
        }
        *hit = 1;
        if (r->state == ENT_FAILED) {
            if (err)
                *err = r->err;
            unref_locked(r);
            r = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        *compile_ms = gclock_ms() - t0;
        return r;
    }
    /* miss: publish a pending entry, compile outside the lock */
    r = calloc(1, sizeof *r);
    char *k = r ? malloc(key_len + 1) : NULL;
    if (!k) {
        free(r);
        pthread_mutex_unlock(&c->mu);
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    memcpy(k, key, key_len);
    k[key_len] = '\0';
    r->key = k;
    r->key_len = key_len;
    r->hash = h;
    r->state = ENT_PENDING;
    r->refs = 2; /* the list and this caller */
    r->bytes = sizeof *r + key_len;
    push_front(c, r);
    c->st.misses++;
    pthread_mutex_unlock(&c->mu);

    tern_err e = {0};
    char *ebnf = NULL;
    grammar_compiled *cg = NULL;
    if (build(user, &ebnf, &e) == 0) {
        cg = grammar_compile_ebnf(ebnf, strlen(ebnf), c->v, &c->lim, &e);
        free(ebnf);
        if (cg && warm(cg, t0, c->lim.max_ms, &e)) {
            grammar_compiled_free(cg);
            cg = NULL;
        }
    }
    size_t bytes = cg ? grammar_compiled_mem_bytes(cg) : 0;

    pthread_mutex_lock(&c->mu);
    if (r->linked)
        c->bytes -= r->bytes;
    r->bytes += bytes;
    if (r->linked)
        c->bytes += r->bytes;
    if (cg) {
        r->cg = cg;
        r->state = ENT_READY;
    } else {
        if (!e.code)
            tern_err_set(&e, TERN_EINTERNAL, "grammar compile failed");
        r->err = e;
        r->state = ENT_FAILED;
        c->st.failures++;
        /* cut short by this thread's control (cancelled, or its deadline came
         * before the compile had half its own limit, e.g. after a request's
         * other compiles): not the grammar's fault, not cached. A compile
         * that ran longer is taken as too large and cached like any failure,
         * so a pathological schema costs its time once. */
        if ((e.code == TERN_ECANCELED ||
             (e.code == TERN_ETIMEOUT && gclock_ms() - t0 < (double)c->lim.max_ms / 2)) &&
            r->linked) {
            unlink_ent(c, r);
            unref_locked(r); /* the list's reference; waiters hold their own */
        }
    }
    pthread_cond_broadcast(&c->cv);
    trim_locked(c);
    if (!cg) {
        if (err)
            *err = e;
        unref_locked(r);
        r = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    *compile_ms = gclock_ms() - t0;
    return r;
}

void grammar_cache_ref_retain(grammar_cache *c, grammar_cache_ref *r)
{
    pthread_mutex_lock(&c->mu);
    r->refs++;
    pthread_mutex_unlock(&c->mu);
}

void grammar_cache_release(grammar_cache *c, grammar_cache_ref *r)
{
    if (!r)
        return;
    /* refresh the estimate outside the cache lock (it takes cg's lock) */
    size_t bytes = r->cg ? sizeof *r + r->key_len + grammar_compiled_mem_bytes(r->cg) : r->bytes;
    pthread_mutex_lock(&c->mu);
    if (r->linked) {
        c->bytes -= r->bytes;
        r->bytes = bytes;
        c->bytes += r->bytes;
    } else {
        r->bytes = bytes;
    }
    unref_locked(r);
    trim_locked(c);
    pthread_mutex_unlock(&c->mu);
}

void grammar_cache_stats_get(grammar_cache *c, grammar_cache_stats *st)
{
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    st->n_entries = c->n;
    st->bytes = c->bytes;
    pthread_mutex_unlock(&c->mu);
}

/* ---- memory estimate ---- */

/* A coarse estimate that leans only on the automaton and the entry table
 * (token sets may be shared through the vocabulary, so a grammar's own
 * share is not well defined): the automaton's arrays plus, per computed
 * entry, half a bitset (accepted sets are stored as a bitset or an id
 * list, whichever is smaller) and bookkeeping. Good enough to rank
 * grammars for eviction. */
size_t grammar_compiled_mem_bytes(grammar_compiled *cg)
{
    const grammar *g = cg->g;
    size_t n = (size_t)g->n_states;
    size_t b = 4096; /* structs, parser pool and set tables at their initial sizes */
    b += n * (sizeof(int32_t) * 3 + 1 + sizeof(void *));
    b += (size_t)g->be_off[n] * sizeof(gbyte_edge) + (size_t)g->re_off[n] * sizeof(grule_edge);
    b += (size_t)g->n_rules * 64; /* names and trees, roughly */
    size_t per_entry = grammar_vocab_mask_words(cg->v) * 2 + 64;
    size_t n_entries = 0;
    for (size_t s = 0; s < n; s++)
        n_entries += __atomic_load_n(&cg->entries[s], __ATOMIC_ACQUIRE) != NULL;
    return b + n_entries * per_entry;
}
