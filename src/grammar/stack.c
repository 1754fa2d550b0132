/* Persistent parser stacks: hash-consed (state, parent) nodes, and the two
 * operations the whole engine is built on, closure (push rule calls, pop
 * finished rules) and step (read one byte). Used by grammar_check_text,
 * the matcher and the per-state token-set precompute. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar_int.h"

double gclock_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static inline uint32_t node_hash(int32_t state, int32_t parent)
{
    uint32_t h = (uint32_t)state * 0x9E3779B1u ^ ((uint32_t)parent + 0x7F4A7C15u) * 0x85EBCA77u;
    return h ^ (h >> 15);
}

int gstk_pool_init(gstk_pool *p)
{
    memset(p, 0, sizeof *p);
    p->cap = 1024;
    p->hmask = 2047;
    p->state = malloc((size_t)p->cap * sizeof *p->state);
    p->parent = malloc((size_t)p->cap * sizeof *p->parent);
    p->next = malloc((size_t)p->cap * sizeof *p->next);
    p->depth = malloc((size_t)p->cap * sizeof *p->depth);
    p->stamp = calloc((size_t)p->cap, sizeof *p->stamp);
    p->heads = malloc(((size_t)p->hmask + 1) * sizeof *p->heads);
    p->work_cap = 256;
    p->work = malloc((size_t)p->work_cap * sizeof *p->work);
    p->epoch = 1;
    p->max_nodes = GSTK_MAX_NODES;
    if (!p->state || !p->parent || !p->next || !p->depth || !p->stamp || !p->heads || !p->work) {
        gstk_pool_free(p);
        return TERN_ENOMEM;
    }
    memset(p->heads, 0xFF, ((size_t)p->hmask + 1) * sizeof *p->heads);
    return 0;
}

void gstk_pool_free(gstk_pool *p)
{
    free(p->state);
    free(p->parent);
    free(p->next);
    free(p->depth);
    free(p->stamp);
    free(p->heads);
    free(p->work);
    memset(p, 0, sizeof *p);
}

static int pool_grow(gstk_pool *p)
{
    if (p->cap >= p->max_nodes)
        return -1;
    int32_t cap = p->cap * 2;
    int32_t *a = realloc(p->state, (size_t)cap * sizeof *a);
    if (!a)
        return -1;
    p->state = a;
    a = realloc(p->parent, (size_t)cap * sizeof *a);
    if (!a)
        return -1;
    p->parent = a;
    a = realloc(p->next, (size_t)cap * sizeof *a);
    if (!a)
        return -1;
    p->next = a;
    a = realloc(p->depth, (size_t)cap * sizeof *a);
    if (!a)
        return -1;
    p->depth = a;
    uint32_t *st = realloc(p->stamp, (size_t)cap * sizeof *st);
    if (!st)
        return -1;
    p->stamp = st;
    int32_t *h = malloc((size_t)cap * 2 * sizeof *h);
    if (!h)
        return -1;
    free(p->heads);
    p->heads = h;
    p->hmask = (uint32_t)cap * 2 - 1;
    memset(p->heads, 0xFF, ((size_t)p->hmask + 1) * sizeof *p->heads);
    for (int32_t i = 0; i < p->n; i++) {
        uint32_t b = node_hash(p->state[i], p->parent[i]) & p->hmask;
        p->next[i] = p->heads[b];
        p->heads[b] = i;
    }
    p->cap = cap;
    return 0;
}

int32_t gstk_intern(gstk_pool *p, int32_t state, int32_t parent)
{
    uint32_t b = node_hash(state, parent) & p->hmask;
    for (int32_t i = p->heads[b]; i >= 0; i = p->next[i])
        if (p->state[i] == state && p->parent[i] == parent)
            return i;
    if (p->n == p->cap) {
        if (pool_grow(p))
            return -1;
        b = node_hash(state, parent) & p->hmask;
    }
    int32_t n = p->n++;
    p->state[n] = state;
    p->parent[n] = parent;
    p->depth[n] = (parent >= 0 ? p->depth[parent] : 0) + 1;
    p->stamp[n] = 0;
    p->next[n] = p->heads[b];
    p->heads[b] = n;
    return n;
}

void gstk_truncate(gstk_pool *p, int32_t mark)
{
    for (int32_t i = p->n - 1; i >= mark; i--) {
        uint32_t b = node_hash(p->state[i], p->parent[i]) & p->hmask;
        p->heads[b] = p->next[i]; /* LIFO: i is the head of its chain */
    }
    if (mark < p->n)
        p->n = mark;
}

void gstk_set_free(gstk_set *s)
{
    free(s->ids);
    memset(s, 0, sizeof *s);
}

void gstk_set_clear(gstk_set *s)
{
    s->n = 0;
    s->can_end = s->hit_unknown = s->overflow = s->oom = 0;
}

int gstk_set_copy(gstk_set *dst, const gstk_set *src)
{
    if (dst->cap < src->n) {
        int32_t *ids = realloc(dst->ids, (size_t)src->n * sizeof *ids);
        if (!ids)
            return TERN_ENOMEM;
        dst->ids = ids;
        dst->cap = src->n;
    }
    if (src->n)
        memcpy(dst->ids, src->ids, (size_t)src->n * sizeof *dst->ids);
    dst->n = src->n;
    dst->can_end = src->can_end;
    dst->hit_unknown = src->hit_unknown;
    dst->overflow = src->overflow;
    dst->oom = src->oom;
    return 0;
}

static void set_add(gstk_set *s, int32_t x)
{
    if (s->n >= GSTK_MAX_SET) {
        s->overflow = 1;
        return;
    }
    if (s->n == s->cap) {
        int32_t cap = s->cap ? s->cap * 2 : 16;
        int32_t *ids = realloc(s->ids, (size_t)cap * sizeof *ids);
        if (!ids) {
            s->oom = 1;
            return;
        }
        s->ids = ids;
        s->cap = cap;
    }
    s->ids[s->n++] = x;
}

void gstk_begin(gstk_pool *p)
{
    if (++p->epoch == 0) {
        memset(p->stamp, 0, (size_t)p->cap * sizeof *p->stamp);
        p->epoch = 1;
    }
}

static int work_push(gstk_pool *p, int *sp, int32_t x)
{
    if (*sp == p->work_cap) {
        int32_t cap = p->work_cap * 2;
        int32_t *w = realloc(p->work, (size_t)cap * sizeof *w);
        if (!w)
            return -1;
        p->work = w;
        p->work_cap = cap;
    }
    p->work[(*sp)++] = x;
    return 0;
}

void gstk_closure(const grammar *g, gstk_pool *p, int32_t x0, gstk_set *out)
{
    int sp = 0;
    if (x0 < 0) {
        out->oom = 1;
        return;
    }
    if (p->stamp[x0] == p->epoch)
        return;
    p->stamp[x0] = p->epoch;
    if (work_push(p, &sp, x0)) {
        out->oom = 1;
        return;
    }
    while (sp) {
        int32_t x = p->work[--sp];
        int32_t s = p->state[x], par = p->parent[x];
        if (g->be_off[s] != g->be_off[s + 1])
            set_add(out, x);
        for (int32_t i = g->re_off[s]; i < g->re_off[s + 1]; i++) {
            int32_t t = g->re[i].target;
            int32_t ret;
            /* tail call: returning to a final state with no edges would pop
             * at once, so do not push it (keeps x ::= a x? stacks flat) */
            if (g->st_final[t] && g->be_off[t] == g->be_off[t + 1] && g->re_off[t] == g->re_off[t + 1]) {
                ret = par;
            } else if ((ret = gstk_intern(p, t, par)) < 0) {
                out->oom = 1;
                continue;
            }
            if ((ret >= 0 ? p->depth[ret] : 0) >= GSTK_MAX_DEPTH) {
                out->overflow = 1;
                continue;
            }
            int32_t y = gstk_intern(p, g->rule_start[g->re[i].rule], ret);
            if (y < 0) {
                out->oom = 1;
                continue;
            }
            if (p->stamp[y] != p->epoch) {
                p->stamp[y] = p->epoch;
                if (work_push(p, &sp, y))
                    out->oom = 1;
            }
        }
        if (g->st_final[s]) {
            if (par == GSTK_ROOT) {
                out->can_end = 1;
            } else if (par == GSTK_UNKNOWN) {
                out->hit_unknown = 1;
            } else if (p->stamp[par] != p->epoch) {
                p->stamp[par] = p->epoch;
                if (work_push(p, &sp, par))
                    out->oom = 1;
            }
        }
    }
}

void gstk_step(const grammar *g, gstk_pool *p, const gstk_set *in, uint8_t b, gstk_set *out)
{
    gstk_set_clear(out);
    gstk_begin(p);
    for (int32_t k = 0; k < in->n; k++) {
        int32_t x = in->ids[k];
        int32_t s = p->state[x];
        for (int32_t i = g->be_off[s]; i < g->be_off[s + 1]; i++) {
            const gbyte_edge *e = &g->be[i];
            if (b < e->lo || b > e->hi)
                continue;
            int32_t y = gstk_intern(p, e->target, p->parent[x]);
            gstk_closure(g, p, y, out);
        }
    }
}

void gstk_start(const grammar *g, gstk_pool *p, gstk_set *out)
{
    gstk_set_clear(out);
    gstk_begin(p);
    gstk_closure(g, p, gstk_intern(p, g->rule_start[g->root], GSTK_ROOT), out);
}
