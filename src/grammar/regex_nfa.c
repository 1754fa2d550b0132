/* Regex intersections, exactly: a regex (JSON Schema `pattern` semantics:
 * searched unless ^ / $ anchor an end) becomes its position automaton
 * (Glushkov: one state per character class occurrence, no epsilon
 * edges); up to two of them run in lockstep with a codepoint counter
 * (lengths), and every live product state becomes one EBNF rule
 * "class next-state | ...": right-linear, so the core's tail calls keep the
 * parser stacks flat. This is what `pattern` with minLength/maxLength in
 * shapes regex.c cannot fold into one repetition, and `pattern` with a
 * `format`, compile to. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fe_int.h"
#include "regex_int.h"

/* Bounds: positions per regex, live product states (= rules). Past them
 * the intersection is TERN_EUNSUPPORTED (named), never approximated. */
#define NFA_MAX_POS 4000
#define NFA_MAX_STATES 20000

typedef struct ivec { int *v; int n, cap; } ivec;

static int iv_push(ivec *a, int x)
{
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 4;
        int *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static int iv_add_all(ivec *a, const ivec *b)
{
    for (int i = 0; i < b->n; i++)
        if (iv_push(a, b->v[i]))
            return -1;
    return 0;
}

/* A position automaton: state 0 is the start, state p + 1 follows
 * position p (having read a codepoint of set[p]). */
typedef struct gauto {
    const gfe_cset **set;
    ivec *follow; /* per state (0 = start) */
    char *final;  /* per state */
    int n_pos, cap;
    int rc;
    tern_err *err;
} gauto;

typedef struct frag { ivec first, last; int nullable; } frag;

static void frag_free(frag *f)
{
    free(f->first.v);
    free(f->last.v);
    memset(f, 0, sizeof *f);
}

static int ga_fail(gauto *g, int code, const char *what)
{
    if (!g->rc)
        g->rc = tern_err_set(g->err, code, "regex: %s", what);
    return g->rc;
}

static int new_pos(gauto *g, const gfe_cset *set)
{
    if (g->n_pos >= NFA_MAX_POS) {
        ga_fail(g, TERN_EUNSUPPORTED, "pattern too large to intersect with lengths or a format");
        return -1;
    }
    if (g->n_pos + 1 >= g->cap) {
        int cap = g->cap ? g->cap * 2 : 64;
        const gfe_cset **s = realloc(g->set, (size_t)cap * sizeof *s);
        ivec *f = s ? realloc(g->follow, (size_t)cap * sizeof *f) : NULL;
        if (s)
            g->set = s;
        if (f)
            g->follow = f;
        if (!s || !f) {
            ga_fail(g, TERN_ENOMEM, "out of memory");
            return -1;
        }
        memset(g->follow + g->cap, 0, (size_t)(cap - g->cap) * sizeof *f);
        g->cap = cap;
    }
    g->set[g->n_pos] = set;
    return g->n_pos++;
}

/* a := a b (b is consumed, also on failure) */
static int frag_cat(gauto *g, frag *a, frag *b)
{
    int bad = 0;
    for (int i = 0; i < a->last.n && !bad; i++)
        bad = iv_add_all(&g->follow[a->last.v[i] + 1], &b->first);
    if (!bad && a->nullable)
        bad = iv_add_all(&a->first, &b->first);
    if (!bad && b->nullable)
        bad = iv_add_all(&b->last, &a->last);
    if (!bad) {
        free(a->last.v);
        a->last = b->last;
        b->last = (ivec){0};
        a->nullable = a->nullable && b->nullable;
    }
    frag_free(b);
    return bad ? ga_fail(g, TERN_ENOMEM, "out of memory") : 0;
}

static int build(gauto *g, const rx *x, frag *out);

/* x{min,max}: min copies, then a star, or max - min optional copies
 * nested (x(x(x)?)?)? so that a skip goes straight to the end (linear
 * follow sets, and one position per count after determinization) */
static int build_rep(gauto *g, const rx *x, frag *out)
{
    *out = (frag){.nullable = 1};
    for (int i = 0; i < x->min && !g->rc; i++) {
        frag f;
        if (build(g, x->kids[0], &f)) {
            frag_free(&f);
            break;
        }
        frag_cat(g, out, &f);
    }
    if (g->rc)
        return g->rc;
    if (x->max < 0) {
        frag f;
        if (build(g, x->kids[0], &f)) {
            frag_free(&f);
            return g->rc;
        }
        for (int k = 0; k < f.last.n; k++) /* the star: its ends lead back to its start */
            if (iv_add_all(&g->follow[f.last.v[k] + 1], &f.first))
                return ga_fail(g, TERN_ENOMEM, "out of memory");
        f.nullable = 1;
        return frag_cat(g, out, &f);
    }
    frag opt = {.nullable = 1};
    for (int i = x->max - x->min; i > 0 && !g->rc; i--) {
        frag f;
        if (build(g, x->kids[0], &f)) {
            frag_free(&f);
            break;
        }
        frag_cat(g, &f, &opt);
        f.nullable = 1;
        opt = f;
    }
    if (g->rc) {
        frag_free(&opt);
        return g->rc;
    }
    return frag_cat(g, out, &opt);
}

static int build(gauto *g, const rx *x, frag *out)
{
    *out = (frag){0};
    switch (x->kind) {
    case RX_SET: {
        int p = new_pos(g, &x->set);
        if (p < 0)
            return g->rc;
        if (iv_push(&out->first, p) || iv_push(&out->last, p))
            return ga_fail(g, TERN_ENOMEM, "out of memory");
        return 0;
    }
    case RX_EMPTY:
        out->nullable = 1;
        return 0;
    case RX_BOL:
    case RX_EOL:
        return ga_fail(g, TERN_EUNSUPPORTED, "anchor ^ or $ inside the regex unsupported");
    case RX_CAT:
        out->nullable = 1;
        for (int i = 0; i < x->n_kids && !g->rc; i++) {
            frag f;
            if (build(g, x->kids[i], &f)) {
                frag_free(&f);
                break;
            }
            frag_cat(g, out, &f);
        }
        return g->rc;
    case RX_ALT:
        for (int i = 0; i < x->n_kids && !g->rc; i++) {
            frag f;
            if (build(g, x->kids[i], &f)) {
                frag_free(&f);
                break;
            }
            if (iv_add_all(&out->first, &f.first) || iv_add_all(&out->last, &f.last))
                ga_fail(g, TERN_ENOMEM, "out of memory");
            out->nullable |= f.nullable;
            frag_free(&f);
        }
        return g->rc;
    case RX_REP:
        if (x->max == 0) {
            out->nullable = 1;
            return 0;
        }
        return build_rep(g, x, out);
    }
    return 0;
}

/* any codepoint, and its star (search semantics), as constant trees */
static const gfe_range k_all = {0, GFE_CP_MAX};
static rx k_any = {.kind = RX_SET, .set = {(gfe_range *)&k_all, 1, 1, 0}};
static rx *const k_any_kids[1] = {&k_any};
static rx k_star_any = {.kind = RX_REP, .kids = (rx **)k_any_kids, .n_kids = 1, .min = 0, .max = -1};

/* The automaton of a parsed pattern (root: RX_ALT of RX_CATs; its
 * top-level anchors are taken off). */
static int gauto_build(gauto *g, rx *root)
{
    frag all = {0};
    if (new_pos(g, &k_any.set) < 0) /* allocates the start's follow slot */
        return g->rc;
    g->n_pos = 0;
    for (int i = 0; i < root->n_kids && !g->rc; i++) {
        rx *cat = root->kids[i];
        int bol = 0, eol = 0;
        while (cat->n_kids > 0 && cat->kids[0]->kind == RX_BOL) {
            gfe_rx_free(cat->kids[0]);
            memmove(cat->kids, cat->kids + 1, (size_t)(cat->n_kids - 1) * sizeof *cat->kids);
            cat->n_kids--;
            bol = 1;
        }
        while (cat->n_kids > 0 && cat->kids[cat->n_kids - 1]->kind == RX_EOL) {
            gfe_rx_free(cat->kids[--cat->n_kids]);
            eol = 1;
        }
        frag f = {.nullable = 1}, part = {0};
        if (!bol && !build(g, &k_star_any, &part))
            frag_cat(g, &f, &part);
        if (!g->rc && !build(g, cat, &part))
            frag_cat(g, &f, &part);
        if (!g->rc && !eol && !build(g, &k_star_any, &part))
            frag_cat(g, &f, &part);
        frag_free(&part);
        if (!g->rc && (iv_add_all(&all.first, &f.first) || iv_add_all(&all.last, &f.last)))
            ga_fail(g, TERN_ENOMEM, "out of memory");
        all.nullable |= f.nullable;
        frag_free(&f);
    }
    if (!g->rc) {
        g->final = calloc((size_t)g->n_pos + 1, 1);
        if (!g->final) {
            frag_free(&all);
            return ga_fail(g, TERN_ENOMEM, "out of memory");
        }
        g->final[0] = (char)all.nullable;
        for (int i = 0; i < all.last.n; i++)
            g->final[all.last.v[i] + 1] = 1;
        ivec *f0 = &g->follow[0];
        f0->n = 0;
        if (iv_add_all(f0, &all.first))
            ga_fail(g, TERN_ENOMEM, "out of memory");
    }
    frag_free(&all);
    return g->rc;
}

static void gauto_free(gauto *g)
{
    for (int i = 0; i < g->cap; i++)
        free(g->follow[i].v);
    free(g->follow);
    free(g->set);
    free(g->final);
}

/* Shortest and longest accepted length of g (*longest -1: unbounded, a
 * cycle is reachable). 0 or TERN_ENOMEM. */
static int gauto_lengths(const gauto *g, long *shortest, long *longest)
{
    int n = g->n_pos + 1;
    long *dist = malloc((size_t)n * sizeof *dist), *lp = malloc((size_t)n * sizeof *lp);
    int *q = malloc((size_t)n * sizeof *q), *indeg = calloc((size_t)n, sizeof *indeg);
    int rc = 0;
    if (!dist || !lp || !q || !indeg) {
        rc = TERN_ENOMEM;
        goto out;
    }
    for (int i = 0; i < n; i++)
        dist[i] = -1, lp[i] = -1;
    /* breadth first: shortest */
    int qh = 0, qt = 0;
    dist[0] = 0;
    q[qt++] = 0;
    *shortest = -1;
    while (qh < qt) {
        int x = q[qh++];
        if (g->final[x] && *shortest < 0)
            *shortest = dist[x];
        for (int i = 0; i < g->follow[x].n; i++) {
            int y = g->follow[x].v[i] + 1;
            if (dist[y] < 0) {
                dist[y] = dist[x] + 1;
                q[qt++] = y;
            }
        }
    }
    /* longest: topological order of the reachable part (Kahn); a cycle
     * leaves states unordered */
    for (int x = 0; x < n; x++)
        if (dist[x] >= 0)
            for (int i = 0; i < g->follow[x].n; i++)
                indeg[g->follow[x].v[i] + 1]++;
    qh = qt = 0;
    q[qt++] = 0;
    lp[0] = 0;
    int reach = 0;
    for (int x = 0; x < n; x++)
        reach += dist[x] >= 0;
    *longest = 0;
    while (qh < qt) {
        int x = q[qh++];
        if (g->final[x] && lp[x] > *longest)
            *longest = lp[x];
        for (int i = 0; i < g->follow[x].n; i++) {
            int y = g->follow[x].v[i] + 1;
            if (lp[x] + 1 > lp[y])
                lp[y] = lp[x] + 1;
            if (--indeg[y] == 0)
                q[qt++] = y;
        }
    }
    if (qt < reach)
        *longest = -1;
out:
    free(dist);
    free(lp);
    free(q);
    free(indeg);
    return rc;
}

/* ---------------------------------------------------------------- product */

typedef struct pstate { int q[2]; long k; } pstate;
typedef struct pedge { int src, dst, p[2]; } pedge;

typedef struct prod {
    pstate *st;
    int n_st, cap_st;
    int64_t *hkey; /* open addressing: key -> state index + 1 */
    int *hval;
    size_t hcap;
    pedge *e;
    size_t n_e, cap_e;
} prod;

static uint64_t pkey(const pstate *s) { return ((uint64_t)s->q[0] * 4099u + (uint64_t)s->q[1]) * 1000003u + (uint64_t)s->k; }

/* index of s, added when new; -1 out of memory or past the bound */
static int prod_state(prod *P, const pstate *s)
{
    if ((size_t)P->n_st * 2 >= P->hcap) {
        size_t cap = P->hcap ? P->hcap * 2 : 1024;
        int64_t *hk = malloc(cap * sizeof *hk);
        int *hv = malloc(cap * sizeof *hv);
        if (!hk || !hv) {
            free(hk);
            free(hv);
            return -1;
        }
        memset(hv, 0, cap * sizeof *hv);
        for (size_t i = 0; i < P->hcap; i++) {
            if (!P->hval[i])
                continue;
            size_t j = (size_t)((uint64_t)P->hkey[i] * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
            while (hv[j])
                j = (j + 1) & (cap - 1);
            hk[j] = P->hkey[i];
            hv[j] = P->hval[i];
        }
        free(P->hkey);
        free(P->hval);
        P->hkey = hk;
        P->hval = hv;
        P->hcap = cap;
    }
    int64_t key = (int64_t)pkey(s);
    size_t j = (size_t)((uint64_t)key * 0x9E3779B97F4A7C15ull >> 20) & (P->hcap - 1);
    while (P->hval[j]) {
        const pstate *o = &P->st[P->hval[j] - 1];
        if (P->hkey[j] == key && o->q[0] == s->q[0] && o->q[1] == s->q[1] && o->k == s->k)
            return P->hval[j] - 1;
        j = (j + 1) & (P->hcap - 1);
    }
    if (P->n_st >= NFA_MAX_STATES)
        return -2;
    if (P->n_st == P->cap_st) {
        int cap = P->cap_st ? P->cap_st * 2 : 256;
        pstate *st = realloc(P->st, (size_t)cap * sizeof *st);
        if (!st)
            return -1;
        P->st = st;
        P->cap_st = cap;
    }
    P->st[P->n_st] = *s;
    P->hkey[j] = key;
    P->hval[j] = P->n_st + 1;
    return P->n_st++;
}

static void cset_inter(gfe_cset *out, const gfe_cset *a, const gfe_cset *b)
{
    size_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        uint32_t lo = a->r[i].lo > b->r[j].lo ? a->r[i].lo : b->r[j].lo;
        uint32_t hi = a->r[i].hi < b->r[j].hi ? a->r[i].hi : b->r[j].hi;
        if (lo <= hi)
            gfe_cset_add(out, lo, hi);
        if (a->r[i].hi < b->r[j].hi)
            i++;
        else
            j++;
    }
}

static int set_meets(const gfe_cset *a, const gfe_cset *b)
{
    size_t i = 0, j = 0;
    while (i < a->n && j < b->n) {
        if (a->r[i].hi < b->r[j].lo)
            i++;
        else if (b->r[j].hi < a->r[i].lo)
            j++;
        else
            return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- subsets */

/* Is product state i accepting? */
static int pfinal(const prod *P, const gauto *g, int n_re, long min_len, int i)
{
    const pstate *s = &P->st[i];
    return g[0].final[s->q[0]] && (n_re < 2 || g[1].final[s->q[1]]) && s->k >= min_len;
}

/* Sets of product states, interned: subset i is pool[off[i] .. off[i+1]). */
typedef struct subsets {
    int *pool;
    size_t n_pool, cap_pool;
    size_t *off;
    int n, cap;
    int *ht; /* index + 1 */
    size_t hcap;
} subsets;

static uint64_t ss_hash(const int *m, int len)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < len; i++)
        h = (h ^ (uint64_t)m[i]) * 1099511628211ull;
    return h;
}

/* index of the set m[0..len) (sorted), added when new; -1 out of memory,
 * -2 past the bound */
static int ss_intern(subsets *S, const int *m, int len)
{
    if ((size_t)S->n * 2 + 2 >= S->hcap) {
        size_t cap = S->hcap ? S->hcap * 2 : 256;
        int *ht = calloc(cap, sizeof *ht);
        if (!ht)
            return -1;
        for (int i = 0; i < S->n; i++) {
            size_t j = ss_hash(S->pool + S->off[i], (int)(S->off[i + 1] - S->off[i])) & (cap - 1);
            while (ht[j])
                j = (j + 1) & (cap - 1);
            ht[j] = i + 1;
        }
        free(S->ht);
        S->ht = ht;
        S->hcap = cap;
    }
    size_t j = ss_hash(m, len) & (S->hcap - 1);
    while (S->ht[j]) {
        int i = S->ht[j] - 1;
        if ((int)(S->off[i + 1] - S->off[i]) == len && !memcmp(S->pool + S->off[i], m, (size_t)len * sizeof *m))
            return i;
        j = (j + 1) & (S->hcap - 1);
    }
    if (S->n >= NFA_MAX_STATES)
        return -2;
    if (S->n + 2 > S->cap) {
        int cap = S->cap ? S->cap * 2 : 64;
        size_t *off = realloc(S->off, ((size_t)cap + 1) * sizeof *off);
        if (!off)
            return -1;
        S->off = off;
        S->cap = cap;
        if (S->n == 0)
            S->off[0] = 0;
    }
    if (S->n_pool + (size_t)len > S->cap_pool) {
        size_t cap = (S->cap_pool + (size_t)len) * 2;
        int *pool = realloc(S->pool, cap * sizeof *pool);
        if (!pool)
            return -1;
        S->pool = pool;
        S->cap_pool = cap;
    }
    memcpy(S->pool + S->n_pool, m, (size_t)len * sizeof *m);
    S->n_pool += (size_t)len;
    S->off[S->n + 1] = S->n_pool;
    S->ht[j] = S->n + 1;
    return S->n++;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return x < y ? -1 : x > y;
}

/* The live product automaton made deterministic (subset construction over
 * disjoint codepoint intervals) and written one rule per subset: a DFA
 * keeps one parser stack however ambiguous the regexes are. */
static int dfa_emit(gfe_rules *r, const prod *P, const gauto *g, int n_re, long min_len, const int *live,
                    char name[GFE_NAME_MAX], tern_err *err)
{
    int rc = 0;
    subsets S = {0};
    size_t *eoff = calloc((size_t)P->n_st + 1, sizeof *eoff);
    gfe_cset *lab = calloc(P->n_e + 1, sizeof *lab);
    char (*names)[GFE_NAME_MAX] = NULL;
    size_t cap_names = 0;
    int *es = NULL, *dst = NULL;
    uint32_t *bd = NULL;
    size_t cap_es = 0, cap_bd = 0;
    struct tgt { int t; gfe_cset cs; } *tg = NULL;
    int n_tg = 0, cap_tg = 0;
    gfe_buf body, cls;
    gfe_buf_init(&body, 0);
    gfe_buf_init(&cls, 0);
    if (!eoff || !lab)
        goto oom;
    for (size_t i = 0; i < P->n_e; i++) {
        eoff[P->e[i].src + 1]++;
        if (n_re > 1)
            cset_inter(&lab[i], g[0].set[P->e[i].p[0]], g[1].set[P->e[i].p[1]]);
        else
            gfe_cset_copy(&lab[i], g[0].set[P->e[i].p[0]]);
        if (lab[i].oom)
            goto oom;
    }
    for (int i = 0; i < P->n_st; i++)
        eoff[i + 1] += eoff[i];
    int start = 0;
    if (ss_intern(&S, &start, 1) < 0)
        goto oom;
    for (int d = 0; d < S.n && !rc; d++) {
        if ((size_t)S.n > cap_names) {
            size_t cap = (size_t)S.n * 2 + 16;
            void *nn = realloc(names, cap * sizeof *names);
            if (!nn)
                goto oom;
            names = nn;
            for (size_t i = cap_names; i < cap; i++)
                names[i][0] = 0;
            cap_names = cap;
        }
        /* the members' live edges and the boundaries of their labels */
        size_t n_es = 0, n_bd = 0;
        int fin = 0;
        for (size_t mi = S.off[d]; mi < S.off[d + 1]; mi++) {
            int m = S.pool[mi];
            fin |= pfinal(P, g, n_re, min_len, m);
            for (size_t e = eoff[m]; e < eoff[m + 1]; e++) {
                if (!live[P->e[e].dst])
                    continue;
                if (n_es == cap_es) {
                    cap_es = cap_es * 2 + 64;
                    void *x = realloc(es, cap_es * sizeof *es), *y = x ? realloc(dst, cap_es * sizeof *dst) : NULL;
                    if (x)
                        es = x;
                    if (y)
                        dst = y;
                    if (!x || !y)
                        goto oom;
                }
                es[n_es++] = (int)e;
                for (size_t k = 0; k < lab[e].n; k++) {
                    if (n_bd + 2 > cap_bd) {
                        cap_bd = cap_bd * 2 + 128;
                        void *x = realloc(bd, cap_bd * sizeof *bd);
                        if (!x)
                            goto oom;
                        bd = x;
                    }
                    bd[n_bd++] = lab[e].r[k].lo;
                    bd[n_bd++] = lab[e].r[k].hi + 1;
                }
            }
        }
        qsort(bd, n_bd, sizeof *bd, cmp_u32);
        n_tg = 0;
        for (size_t b = 0; b + 1 < n_bd; b++) {
            if (bd[b] == bd[b + 1])
                continue;
            int nd = 0;
            for (size_t k = 0; k < n_es; k++)
                if (gfe_cset_has(&lab[es[k]], bd[b]))
                    dst[nd++] = P->e[es[k]].dst;
            if (!nd)
                continue;
            qsort(dst, (size_t)nd, sizeof *dst, cmp_int);
            int u = 1;
            for (int k = 1; k < nd; k++)
                if (dst[k] != dst[u - 1])
                    dst[u++] = dst[k];
            int t = ss_intern(&S, dst, u);
            if (t == -2) {
                rc = tern_err_set(err, TERN_EUNSUPPORTED,
                                  "regex: pattern with lengths or a format needs over %d states", NFA_MAX_STATES);
                goto out;
            }
            if (t < 0)
                goto oom;
            int ti = 0;
            while (ti < n_tg && tg[ti].t != t)
                ti++;
            if (ti == n_tg) {
                if (n_tg == cap_tg) {
                    cap_tg = cap_tg * 2 + 8;
                    void *x = realloc(tg, (size_t)cap_tg * sizeof *tg);
                    if (!x)
                        goto oom;
                    tg = x;
                }
                tg[n_tg++] = (struct tgt){t, {0}};
            }
            gfe_cset_add(&tg[ti].cs, bd[b], bd[b + 1] - 1);
        }
        if (!names[d][0])
            gfe_rule_reserve(r, names[d]);
        body.len = 0;
        int n_alt = 0;
        if (fin) {
            gfe_buf_puts(&body, "\"\"");
            n_alt++;
        }
        for (int ti = 0; ti < n_tg; ti++) {
            if ((size_t)tg[ti].t >= cap_names) {
                size_t cap = (size_t)tg[ti].t * 2 + 16;
                void *nn = realloc(names, cap * sizeof *names);
                if (!nn)
                    goto oom;
                names = nn;
                for (size_t i = cap_names; i < cap; i++)
                    names[i][0] = 0;
                cap_names = cap;
            }
            if (!names[tg[ti].t][0])
                gfe_rule_reserve(r, names[tg[ti].t]);
            cls.len = 0;
            gfe_cset_emit_json(&cls, &tg[ti].cs);
            int bad = tg[ti].cs.oom;
            gfe_cset_free(&tg[ti].cs);
            char cn[GFE_NAME_MAX];
            if (bad || cls.err || !cls.s || gfe_rule_add(r, cls.s, cn))
                goto oom;
            gfe_buf_printf(&body, "%s%s %s", n_alt++ ? " | " : "", cn, names[tg[ti].t]);
        }
        n_tg = 0;
        if (body.err || gfe_rule_define(r, names[d], body.s)) {
            int code = body.err ? body.err : r->out.err ? r->out.err : TERN_ENOMEM;
            rc = tern_err_set(err, code, "regex: %s", code == TERN_EFULL ? "grammar too large" : "out of memory");
        }
    }
    if (!rc)
        memcpy(name, names[0], GFE_NAME_MAX);
    goto out;
oom:
    rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
out:
    for (int ti = 0; ti < n_tg; ti++)
        gfe_cset_free(&tg[ti].cs);
    for (size_t i = 0; lab && i < P->n_e; i++)
        gfe_cset_free(&lab[i]);
    free(lab);
    free(eoff);
    free(names);
    free(es);
    free(dst);
    free(bd);
    free(tg);
    free(S.pool);
    free(S.off);
    free(S.ht);
    gfe_buf_free(&body);
    gfe_buf_free(&cls);
    return rc;
}

int gfe_regex_emit_product(gfe_rules *r, const char *const *res, const size_t *lens, int n_re, long min_len,
                           long max_len, char name[GFE_NAME_MAX], int *never, tern_err *err)
{
    gauto g[2];
    rx *roots[2] = {NULL, NULL};
    prod P = {0};
    memset(g, 0, sizeof g);
    int rc = 0;
    char (*names)[GFE_NAME_MAX] = NULL;
    int *live = NULL, *roff = NULL, *radj = NULL, *queue = NULL;
    gfe_buf body;
    gfe_buf_init(&body, 0);
    *never = 0;
    if (n_re < 1 || n_re > 2)
        return tern_err_set(err, TERN_EINTERNAL, "regex: 1 or 2 patterns");
    for (int i = 0; i < n_re; i++) {
        g[i].err = err;
        roots[i] = gfe_rx_parse(res[i], lens[i], 1, err);
        if (!roots[i]) {
            rc = err->code ? err->code : TERN_EINTERNAL;
            goto cleanup;
        }
        if ((rc = gauto_build(&g[i], roots[i])))
            goto cleanup;
    }
    /* a bound every string of one of the regexes already meets needs no
     * counter */
    for (int i = 0; i < n_re; i++) {
        long lo, hi;
        if (gauto_lengths(&g[i], &lo, &hi)) {
            rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
            goto cleanup;
        }
        if (lo >= min_len)
            min_len = 0;
        if (hi >= 0 && max_len >= 0 && hi <= max_len)
            max_len = -1;
    }
    long cap = max_len >= 0 ? max_len : (min_len > 0 ? min_len : 0);
    pstate s0 = {{0, 0}, 0};
    if (prod_state(&P, &s0) < 0) {
        rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
        goto cleanup;
    }
    /* forward: every reachable state and edge */
    for (int si = 0; si < P.n_st; si++) {
        pstate s = P.st[si];
        if (max_len >= 0 && s.k >= max_len)
            continue;
        const ivec *f0 = &g[0].follow[s.q[0]];
        ivec one = {(int[]){-1}, 1, 1};
        const ivec *f1 = n_re > 1 ? &g[1].follow[s.q[1]] : &one;
        for (int a = 0; a < f0->n; a++)
            for (int b = 0; b < f1->n; b++) {
                int p0 = f0->v[a], p1 = f1->v[b];
                if (!g[0].set[p0]->n || (p1 >= 0 && !set_meets(g[0].set[p0], g[1].set[p1])))
                    continue;
                pstate t = {{p0 + 1, p1 + 1}, s.k + 1 > cap ? cap : s.k + 1};
                int ti = prod_state(&P, &t);
                if (ti == -2) {
                    rc = tern_err_set(err, TERN_EUNSUPPORTED,
                                      "regex: pattern with lengths or a format needs over %d states", NFA_MAX_STATES);
                    goto cleanup;
                }
                if (ti >= 0 && P.n_e == P.cap_e) {
                    size_t ncap = P.cap_e ? P.cap_e * 2 : 1024;
                    pedge *ne = realloc(P.e, ncap * sizeof *ne);
                    if (ne) {
                        P.e = ne;
                        P.cap_e = ncap;
                    } else {
                        ti = -1;
                    }
                }
                if (ti < 0) {
                    rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
                    goto cleanup;
                }
                P.e[P.n_e++] = (pedge){si, ti, {p0, p1}};
            }
    }
    /* backward: live = can reach a final state */
    live = calloc((size_t)P.n_st, sizeof *live);
    roff = calloc((size_t)P.n_st + 1, sizeof *roff);
    radj = malloc((P.n_e + 1) * sizeof *radj);
    queue = malloc(((size_t)P.n_st + 1) * sizeof *queue);
    names = malloc(((size_t)P.n_st + 1) * sizeof *names);
    if (!live || !roff || !radj || !queue || !names) {
        rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
        goto cleanup;
    }
    for (size_t i = 0; i < P.n_e; i++)
        roff[P.e[i].dst + 1]++;
    for (int i = 0; i < P.n_st; i++)
        roff[i + 1] += roff[i];
    {
        int *fill = calloc((size_t)P.n_st, sizeof *fill);
        if (!fill) {
            rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
            goto cleanup;
        }
        for (size_t i = 0; i < P.n_e; i++)
            radj[roff[P.e[i].dst] + fill[P.e[i].dst]++] = (int)i;
        free(fill);
    }
    int qn = 0;
    for (int i = 0; i < P.n_st; i++) {
        const pstate *s = &P.st[i];
        if (g[0].final[s->q[0]] && (n_re < 2 || g[1].final[s->q[1]]) && s->k >= min_len) {
            live[i] = 1;
            queue[qn++] = i;
        }
    }
    for (int qi = 0; qi < qn; qi++)
        for (int j = roff[queue[qi]]; j < roff[queue[qi] + 1]; j++) {
            int src = P.e[radj[j]].src;
            if (!live[src]) {
                live[src] = 1;
                queue[qn++] = src;
            }
        }
    if (!live[0]) {
        *never = 1;
        goto cleanup;
    }
    rc = dfa_emit(r, &P, g, n_re, min_len, live, name, err);
cleanup:
    gfe_buf_free(&body);
    free(names);
    free(live);
    free(roff);
    free(radj);
    free(queue);
    free(P.st);
    free(P.hkey);
    free(P.hval);
    free(P.e);
    for (int i = 0; i < 2; i++) {
        gauto_free(&g[i]);
        gfe_rx_free(roots[i]);
    }
    return rc;
}
