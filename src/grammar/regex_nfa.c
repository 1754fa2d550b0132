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

/* ---------------------------------------------------------------- subsets */

/* Int arrays (NFA state sets, product tuples), interned: array i is
 * pool[off[i] .. off[i+1]). */
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

/* index of the array m[0..len), added when new; -1 out of memory, -2 past
 * the bound */
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

static void ss_free(subsets *S)
{
    free(S->pool);
    free(S->off);
    free(S->ht);
    memset(S, 0, sizeof *S);
}

/* Growable arrays of plain elements: *p holds *cap elements of size sz;
 * makes room for need. 0 or -1 (out of memory). */
static int grow(void *p, size_t *cap, size_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*(void **)p, c * sz);
    if (!q)
        return -1;
    *(void **)p = q;
    *cap = c;
    return 0;
}

/* ---------------------------------------------------------------- DFAs */

/* A term made deterministic (subset construction over its position
 * automaton): state 0 is the start; the moves of state s are
 * mv[off[s] .. off[s+1]), disjoint codepoint intervals sorted by lo; a
 * codepoint without a move leads to the empty set (-1: the term's regex
 * cannot match any more). ok[s]: the term can still come out true from s
 * (a positive term: a final state is reachable; a negated one: a
 * non-final state or the empty set is). */
typedef struct dmove { uint32_t lo, hi; int to; } dmove;

typedef struct dfa {
    int n, neg;
    size_t *off;
    dmove *mv;
    size_t n_mv, cap_mv;
    char *final, *ok;
} dfa;

static void dfa_free(dfa *d)
{
    free(d->off);
    free(d->mv);
    free(d->final);
    free(d->ok);
    memset(d, 0, sizeof *d);
}

static int too_many(tern_err *err)
{
    return tern_err_set(err, TERN_EUNSUPPORTED, "regex: pattern with lengths, a format or a negation needs over %d states",
                        NFA_MAX_STATES);
}

static int dfa_build(const gauto *g, dfa *d, tern_err *err)
{
    subsets S = {0};
    int rc = 0, *es = NULL, *tg = NULL;
    uint32_t *bd = NULL;
    size_t cap_es = 0, cap_tg = 0, cap_bd = 0, cap_st = 0;
    int start = 0;
    if (ss_intern(&S, &start, 1) < 0)
        goto oom;
    for (int s = 0; s < S.n; s++) {
        if ((size_t)s + 2 > cap_st) {
            size_t c1 = cap_st, c2 = cap_st;
            if (grow(&d->off, &c1, (size_t)s + 2, sizeof *d->off) || grow(&d->final, &c2, (size_t)s + 2, 1))
                goto oom;
            cap_st = c1 < c2 ? c1 : c2;
        }
        d->off[s] = d->n_mv;
        size_t n_es = 0, n_bd = 0;
        int fin = 0;
        for (size_t mi = S.off[s]; mi < S.off[s + 1]; mi++) {
            int m = S.pool[mi];
            fin |= g->final[m];
            for (int i = 0; i < g->follow[m].n; i++) {
                int p = g->follow[m].v[i];
                const gfe_cset *cs = g->set[p];
                if (grow(&es, &cap_es, n_es + 1, sizeof *es) || grow(&bd, &cap_bd, n_bd + 2 * cs->n, sizeof *bd))
                    goto oom;
                es[n_es++] = p;
                for (size_t k = 0; k < cs->n; k++) {
                    bd[n_bd++] = cs->r[k].lo;
                    bd[n_bd++] = cs->r[k].hi + 1;
                }
            }
        }
        d->final[s] = (char)fin;
        if (grow(&tg, &cap_tg, n_es + 1, sizeof *tg))
            goto oom;
        qsort(bd, n_bd, sizeof *bd, cmp_u32);
        for (size_t b = 0; b + 1 < n_bd; b++) {
            if (bd[b] == bd[b + 1])
                continue;
            int nt = 0;
            for (size_t k = 0; k < n_es; k++)
                if (gfe_cset_has(g->set[es[k]], bd[b]))
                    tg[nt++] = es[k] + 1;
            if (!nt)
                continue;
            qsort(tg, (size_t)nt, sizeof *tg, cmp_int);
            int u = 1;
            for (int k = 1; k < nt; k++)
                if (tg[k] != tg[u - 1])
                    tg[u++] = tg[k];
            int t = ss_intern(&S, tg, u);
            if (t == -2) {
                rc = too_many(err);
                goto out;
            }
            if (t < 0)
                goto oom;
            dmove *last = d->n_mv > d->off[s] ? &d->mv[d->n_mv - 1] : NULL;
            if (last && last->to == t && last->hi + 1 == bd[b]) {
                last->hi = bd[b + 1] - 1;
                continue;
            }
            if (grow(&d->mv, &d->cap_mv, d->n_mv + 1, sizeof *d->mv))
                goto oom;
            d->mv[d->n_mv++] = (dmove){bd[b], bd[b + 1] - 1, t};
        }
    }
    d->n = S.n;
    d->off[S.n] = d->n_mv;
    goto out;
oom:
    rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
out:
    ss_free(&S);
    free(es);
    free(tg);
    free(bd);
    return rc;
}

/* d->ok: backward reachability from the states where the term holds. */
static int dfa_mark_ok(dfa *d)
{
    int n = d->n;
    size_t *roff = calloc((size_t)n + 1, sizeof *roff);
    int *radj = malloc((d->n_mv + 1) * sizeof *radj), *q = malloc(((size_t)n + 1) * sizeof *q);
    d->ok = calloc((size_t)n + 1, 1);
    if (!roff || !radj || !q || !d->ok) {
        free(roff);
        free(radj);
        free(q);
        return -1;
    }
    for (size_t e = 0; e < d->n_mv; e++)
        roff[d->mv[e].to + 1]++;
    for (int s = 0; s < n; s++)
        roff[s + 1] += roff[s];
    size_t *fill = calloc((size_t)n + 1, sizeof *fill);
    if (!fill) {
        free(roff);
        free(radj);
        free(q);
        return -1;
    }
    for (int s = 0; s < n; s++)
        for (size_t e = d->off[s]; e < d->off[s + 1]; e++)
            radj[roff[d->mv[e].to] + fill[d->mv[e].to]++] = s;
    free(fill);
    int qn = 0;
    for (int s = 0; s < n; s++) {
        int holds = d->final[s];
        if (d->neg) { /* not final, or a codepoint leads to the empty set */
            uint32_t next = 0;
            holds = !d->final[s];
            for (size_t e = d->off[s]; e < d->off[s + 1] && !holds; e++) {
                holds = d->mv[e].lo != next;
                next = d->mv[e].hi + 1;
            }
            holds |= next != GFE_CP_MAX + 1;
        }
        if (holds) {
            d->ok[s] = 1;
            q[qn++] = s;
        }
    }
    for (int i = 0; i < qn; i++)
        for (size_t j = roff[q[i]]; j < roff[q[i] + 1]; j++)
            if (!d->ok[radj[j]]) {
                d->ok[radj[j]] = 1;
                q[qn++] = radj[j];
            }
    free(roff);
    free(radj);
    free(q);
    return 0;
}

/* ---------------------------------------------------------------- product */

/* A product move: from state src, the codepoints lo..hi lead to dst. */
typedef struct pmove { uint32_t lo, hi; int dst; } pmove;

/* Does the product state (terms' states d[0..n), counter k) accept? */
static int p_accepts(const dfa *D, int n, const int *st, long min_len)
{
    for (int i = 0; i < n; i++) {
        int fin = st[i] >= 0 && D[i].final[st[i]];
        if (fin == D[i].neg)
            return 0;
    }
    return st[n] >= min_len;
}

/* The live states of the product, one rule each: "" when accepting, then
 * "class next" per successor. */
static int p_emit(gfe_rules *r, const subsets *P, const size_t *eoff, const pmove *mv, const char *live,
                  const char *acc, char name[GFE_NAME_MAX], tern_err *err)
{
    int rc = 0, n = P->n;
    char (*names)[GFE_NAME_MAX] = calloc((size_t)n, GFE_NAME_MAX);
    struct tgt { int t; gfe_cset cs; } *tg = NULL;
    size_t n_tg = 0, cap_tg = 0;
    gfe_buf body, cls;
    gfe_buf_init(&body, 0);
    gfe_buf_init(&cls, 0);
    if (!names)
        goto oom;
    for (int s = 0; s < n && !rc; s++) {
        if (!live[s])
            continue;
        if (!names[s][0])
            gfe_rule_reserve(r, names[s]);
        n_tg = 0;
        for (size_t e = eoff[s]; e < eoff[s + 1]; e++) {
            if (!live[mv[e].dst])
                continue;
            size_t ti = 0;
            while (ti < n_tg && tg[ti].t != mv[e].dst)
                ti++;
            if (ti == n_tg) {
                if (grow(&tg, &cap_tg, n_tg + 1, sizeof *tg))
                    goto oom;
                tg[n_tg++] = (struct tgt){mv[e].dst, {0}};
            }
            gfe_cset_add(&tg[ti].cs, mv[e].lo, mv[e].hi);
        }
        body.len = 0;
        int n_alt = 0;
        if (acc[s]) {
            gfe_buf_puts(&body, "\"\"");
            n_alt++;
        }
        for (size_t ti = 0; ti < n_tg; ti++) {
            if (!names[tg[ti].t][0])
                gfe_rule_reserve(r, names[tg[ti].t]);
            cls.len = 0;
            gfe_cset_emit_json(&cls, &tg[ti].cs);
            int bad = tg[ti].cs.oom;
            gfe_cset_free(&tg[ti].cs);
            char cn[GFE_NAME_MAX];
            if (bad || cls.err || !cls.s || gfe_rule_add(r, cls.s, cn)) {
                for (size_t k = ti + 1; k < n_tg; k++)
                    gfe_cset_free(&tg[k].cs);
                n_tg = 0;
                goto oom;
            }
            gfe_buf_printf(&body, "%s%s %s", n_alt++ ? " | " : "", cn, names[tg[ti].t]);
        }
        n_tg = 0;
        if (body.err || gfe_rule_define(r, names[s], body.s)) {
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
    for (size_t ti = 0; ti < n_tg; ti++)
        gfe_cset_free(&tg[ti].cs);
    free(tg);
    free(names);
    gfe_buf_free(&body);
    gfe_buf_free(&cls);
    return rc;
}

/* The live part of the product as a gfe_cpdfa (counter 0: no lengths). */
static int p_export(const subsets *P, const size_t *eoff, const pmove *mv, const char *live, const char *acc,
                    gfe_cpdfa **out)
{
    int n = P->n, *id = malloc(((size_t)n + 1) * sizeof *id), k = 0;
    size_t n_mv = 0;
    if (!id)
        return -1;
    for (int s = 0; s < n; s++) {
        id[s] = live[s] ? k++ : -1;
        if (live[s])
            for (size_t e = eoff[s]; e < eoff[s + 1]; e++)
                n_mv += live[mv[e].dst] != 0;
    }
    gfe_cpdfa *d = calloc(1, sizeof *d);
    if (d) {
        d->n = k;
        d->off = malloc(((size_t)k + 1) * sizeof *d->off);
        d->mv = malloc((n_mv + 1) * sizeof *d->mv);
        d->acc = malloc((size_t)k + 1);
    }
    if (!d || !d->off || !d->mv || !d->acc) {
        gfe_cpdfa_free(d);
        free(id);
        return -1;
    }
    n_mv = 0;
    for (int s = 0; s < n; s++) {
        if (!live[s])
            continue;
        d->off[id[s]] = (uint32_t)n_mv;
        d->acc[id[s]] = (uint8_t)(acc[s] != 0);
        for (size_t e = eoff[s]; e < eoff[s + 1]; e++)
            if (live[mv[e].dst])
                d->mv[n_mv++] = (gfe_cpmove){mv[e].lo, mv[e].hi, id[mv[e].dst]};
    }
    d->off[k] = (uint32_t)n_mv;
    free(id);
    *out = d;
    return 0;
}

void gfe_cpdfa_free(gfe_cpdfa *d)
{
    if (!d)
        return;
    free(d->off);
    free(d->mv);
    free(d->acc);
    free(d);
}

int gfe_cpdfa_step(const gfe_cpdfa *d, int q, uint32_t cp)
{
    uint32_t a = d->off[q], b = d->off[q + 1];
    while (a < b) {
        uint32_t m = a + (b - a) / 2;
        if (d->mv[m].hi < cp)
            a = m + 1;
        else if (d->mv[m].lo > cp)
            b = m;
        else
            return d->mv[m].to;
    }
    return -1;
}

static int regex_terms(gfe_rules *r, const gfe_re_term *t, int n, long min_len, long max_len,
                       char name[GFE_NAME_MAX], int *never, gfe_cpdfa **dout, tern_err *err);

int gfe_regex_emit_terms(gfe_rules *r, const gfe_re_term *t, int n, long min_len, long max_len,
                         char name[GFE_NAME_MAX], int *never, tern_err *err)
{
    return regex_terms(r, t, n, min_len, max_len, name, never, NULL, err);
}

int gfe_regex_terms_dfa(const gfe_re_term *t, int n, gfe_cpdfa **out, int *never, tern_err *err)
{
    char nm[GFE_NAME_MAX];
    *out = NULL;
    return regex_terms(NULL, t, n, 0, -1, nm, never, out, err);
}

static int regex_terms(gfe_rules *r, const gfe_re_term *t, int n, long min_len, long max_len,
                       char name[GFE_NAME_MAX], int *never, gfe_cpdfa **dout, tern_err *err)
{
    gauto g[GFE_RE_MAX_TERMS];
    rx *roots[GFE_RE_MAX_TERMS];
    dfa D[GFE_RE_MAX_TERMS];
    subsets P = {0};
    pmove *mv = NULL;
    size_t n_mv = 0, cap_mv = 0, *eoff = NULL, cap_eoff = 0, cap_bd = 0;
    uint32_t *bd = NULL;
    char *live = NULL, *acc = NULL;
    size_t *roff = NULL, *ptr = NULL;
    int *radj = NULL, *q = NULL, st[GFE_RE_MAX_TERMS + 1], nx[GFE_RE_MAX_TERMS + 1];
    int rc = 0;
    memset(g, 0, sizeof g);
    memset(roots, 0, sizeof roots);
    memset(D, 0, sizeof D);
    *never = 0;
    if (n < 1 || n > GFE_RE_MAX_TERMS)
        return tern_err_set(err, TERN_EINTERNAL, "regex: 1 to %d terms", GFE_RE_MAX_TERMS);
    for (int i = 0; i < n; i++) {
        g[i].err = err;
        roots[i] = gfe_rx_parse(t[i].re, t[i].len, 1, err);
        if (!roots[i]) {
            rc = err->code ? err->code : TERN_EINTERNAL;
            goto cleanup;
        }
        D[i].neg = t[i].neg;
        if ((rc = gauto_build(&g[i], roots[i])) || (rc = dfa_build(&g[i], &D[i], err)))
            goto cleanup;
        if (dfa_mark_ok(&D[i]))
            goto oom;
        /* a bound every string of a positive term already meets needs no
         * counter */
        long lo, hi;
        if (t[i].neg)
            continue;
        if (gauto_lengths(&g[i], &lo, &hi))
            goto oom;
        if (lo >= min_len)
            min_len = 0;
        if (hi >= 0 && max_len >= 0 && hi <= max_len)
            max_len = -1;
    }
    long cap = max_len >= 0 ? max_len : (min_len > 0 ? min_len : 0);
    if (cap >= NFA_MAX_STATES) { /* a count per state at least */
        rc = too_many(err);
        goto cleanup;
    }
    for (int i = 0; i <= n; i++)
        st[i] = 0;
    for (int i = 0; i < n; i++)
        if (!D[i].ok[0]) {
            *never = 1;
            goto cleanup;
        }
    if (ss_intern(&P, st, n + 1) < 0)
        goto oom;
    /* forward: every reachable state whose terms can all still hold */
    for (int s = 0; s < P.n; s++) {
        if (grow(&eoff, &cap_eoff, (size_t)s + 2, sizeof *eoff))
            goto oom;
        eoff[s] = n_mv;
        memcpy(st, P.pool + P.off[s], (size_t)(n + 1) * sizeof *st);
        if (max_len >= 0 && st[n] >= max_len)
            continue;
        size_t n_bd = 0;
        if (grow(&bd, &cap_bd, 2, sizeof *bd))
            goto oom;
        bd[n_bd++] = 0;
        bd[n_bd++] = GFE_CP_MAX + 1;
        for (int i = 0; i < n; i++) {
            if (st[i] < 0)
                continue;
            size_t a = D[i].off[st[i]], b = D[i].off[st[i] + 1];
            if (grow(&bd, &cap_bd, n_bd + 2 * (b - a), sizeof *bd))
                goto oom;
            for (size_t e = a; e < b; e++) {
                bd[n_bd++] = D[i].mv[e].lo;
                bd[n_bd++] = D[i].mv[e].hi + 1;
            }
        }
        qsort(bd, n_bd, sizeof *bd, cmp_u32);
        size_t pos[GFE_RE_MAX_TERMS];
        for (int i = 0; i < n; i++)
            pos[i] = st[i] >= 0 ? D[i].off[st[i]] : 0;
        nx[n] = st[n] + 1 > cap ? (int)cap : st[n] + 1;
        for (size_t b = 0; b + 1 < n_bd; b++) {
            uint32_t lo = bd[b], hi = bd[b + 1] - 1;
            if (bd[b] == bd[b + 1])
                continue;
            int dead = 0;
            for (int i = 0; i < n && !dead; i++) {
                nx[i] = -1;
                if (st[i] >= 0) {
                    size_t end = D[i].off[st[i] + 1];
                    while (pos[i] < end && D[i].mv[pos[i]].hi < lo)
                        pos[i]++;
                    if (pos[i] < end && D[i].mv[pos[i]].lo <= lo)
                        nx[i] = D[i].mv[pos[i]].to;
                }
                dead = nx[i] < 0 ? !D[i].neg : !D[i].ok[nx[i]];
            }
            if (dead)
                continue;
            int to = ss_intern(&P, nx, n + 1);
            if (to == -2) {
                rc = too_many(err);
                goto cleanup;
            }
            if (to < 0)
                goto oom;
            if (n_mv > eoff[s] && mv[n_mv - 1].dst == to && mv[n_mv - 1].hi + 1 == lo) {
                mv[n_mv - 1].hi = hi;
                continue;
            }
            if (grow(&mv, &cap_mv, n_mv + 1, sizeof *mv))
                goto oom;
            mv[n_mv++] = (pmove){lo, hi, to};
        }
    }
    eoff[P.n] = n_mv;
    /* backward: live = can reach an accepting state */
    live = calloc((size_t)P.n, 1);
    acc = calloc((size_t)P.n, 1);
    roff = calloc((size_t)P.n + 1, sizeof *roff);
    ptr = calloc((size_t)P.n + 1, sizeof *ptr);
    radj = malloc((n_mv + 1) * sizeof *radj);
    q = malloc(((size_t)P.n + 1) * sizeof *q);
    if (!live || !acc || !roff || !ptr || !radj || !q)
        goto oom;
    for (size_t e = 0; e < n_mv; e++)
        roff[mv[e].dst + 1]++;
    for (int s = 0; s < P.n; s++)
        roff[s + 1] += roff[s];
    for (int s = 0; s < P.n; s++)
        for (size_t e = eoff[s]; e < eoff[s + 1]; e++)
            radj[roff[mv[e].dst] + ptr[mv[e].dst]++] = s;
    int qn = 0;
    for (int s = 0; s < P.n; s++)
        if (p_accepts(D, n, P.pool + P.off[s], min_len)) {
            acc[s] = live[s] = 1;
            q[qn++] = s;
        }
    for (int i = 0; i < qn; i++)
        for (size_t j = roff[q[i]]; j < roff[q[i] + 1]; j++)
            if (!live[radj[j]]) {
                live[radj[j]] = 1;
                q[qn++] = radj[j];
            }
    if (!live[0]) {
        *never = 1;
        goto cleanup;
    }
    if (r)
        rc = p_emit(r, &P, eoff, mv, live, acc, name, err);
    else if (dout && p_export(&P, eoff, mv, live, acc, dout))
        goto oom;
    goto cleanup;
oom:
    rc = tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
cleanup:
    ss_free(&P);
    free(mv);
    free(eoff);
    free(bd);
    free(live);
    free(acc);
    free(roff);
    free(ptr);
    free(radj);
    free(q);
    for (int i = 0; i < n; i++) {
        dfa_free(&D[i]);
        gauto_free(&g[i]);
        gfe_rx_free(roots[i]);
    }
    return rc;
}
