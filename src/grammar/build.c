/* Syntax tree -> byte-level automaton. Each rule becomes a Thompson NFA
 * (epsilon, byte-range and rule-call edges; character classes expanded to
 * UTF-8 byte sequences; {m,n} expanded to copies), then epsilon edges are
 * eliminated, dead and unreachable states dropped, and the rules checked
 * for left recursion (which a stack parser cannot run). Bounds: states and
 * wall clock from grammar_limits. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

enum { E_EPS, E_BYTE, E_RULE };

typedef struct bedge {
    int32_t from, to;
    int32_t rule;   /* E_RULE */
    uint8_t type, lo, hi;
} bedge;

typedef struct builder {
    const grammar *g;
    bedge *e;
    size_t n_e, cap_e;
    int32_t n_s;
    long max_states;
    long max_ms;
    double t0;
    int bad;        /* error code once something failed */
    tern_err *err;
    long tick;
    int32_t *alias; /* [cap_alias] raw state -> equivalent earlier state (itself if none) */
    int32_t cap_alias;
    int32_t horizon; /* copies this many from both ends of a repetition are alike */
    const uint8_t *rnull; /* [n_rules] rule may match "" */
} builder;

static int bfail(builder *b, int code, const char *msg)
{
    if (!b->bad) {
        b->bad = code;
        tern_err_set(b->err, code, "grammar: %s", msg);
    }
    return -1;
}

static int32_t new_state(builder *b)
{
    if (b->bad)
        return -1;
    if (b->n_s >= b->max_states)
        return bfail(b, TERN_EFULL, "too many automaton states (repetition bounds too large?)");
    if ((++b->tick & 1023) == 0) {
        int stop = grammar_thread_stopped();
        if (stop == TERN_ECANCELED)
            return bfail(b, stop, "compile cancelled");
        if (stop || (b->max_ms > 0 && gclock_ms() - b->t0 > (double)b->max_ms))
            return bfail(b, TERN_ETIMEOUT, "compile time limit exceeded");
    }
    if (b->n_s >= b->cap_alias) {
        int32_t cap = b->cap_alias ? b->cap_alias * 2 : 1024;
        int32_t *na = realloc(b->alias, (size_t)cap * sizeof *na);
        if (!na)
            return bfail(b, TERN_ENOMEM, "out of memory");
        b->alias = na;
        b->cap_alias = cap;
    }
    b->alias[b->n_s] = b->n_s;
    return b->n_s++;
}

/* 1 when every match of a reads at least one byte, given which rules may
 * match the empty string (rnull). */
static int ast_reads_byte(const gast *a, const uint8_t *rnull)
{
    switch (a->kind) {
    case GAST_BYTES: return a->n > 0;
    case GAST_CLASS: return a->n > 0;
    case GAST_REF: return !rnull[a->u.ref];
    case GAST_SEQ:
        for (int i = 0; i < a->n; i++)
            if (ast_reads_byte(a->u.kids[i], rnull))
                return 1;
        return 0;
    case GAST_ALT:
        for (int i = 0; i < a->n; i++)
            if (!ast_reads_byte(a->u.kids[i], rnull))
                return 0;
        return 1;
    case GAST_REP: return a->u.rep.min > 0 && ast_reads_byte(a->u.rep.kid, rnull);
    default: return 0;
    }
}

/* rnull[r] = rule r may match the empty string: the least fixpoint,
 * visiting rules in order (front ends define callees first, so it settles
 * in a pass or two). Past a few passes every rule is taken as nullable,
 * which only gives up sharing (ast_reads_byte then answers 0 for refs). */
static void rules_nullable(const grammar *g, uint8_t *rnull)
{
    for (int pass = 0, changed = 1; changed; pass++) {
        if (pass == 8) {
            memset(rnull, 1, (size_t)g->n_rules);
            return;
        }
        changed = 0;
        for (int32_t r = 0; r < g->n_rules; r++)
            if (!rnull[r] && !ast_reads_byte(g->rule_bodies[r], rnull))
                rnull[r] = 1, changed = 1;
    }
}

/* Marks the states of copy [first, first+w) as equivalent to those of the
 * canonical copy [canon, canon+w) (same body built the same way, so the
 * same layout). */
static void alias_copy(builder *b, int32_t first, int32_t canon, int32_t w)
{
    if (b->bad || first == canon)
        return;
    for (int32_t k = 0; k < w; k++)
        b->alias[first + k] = canon + k;
}

static void add_edge(builder *b, int32_t from, int32_t to, int type, uint8_t lo, uint8_t hi, int32_t rule)
{
    if (b->bad || from < 0 || to < 0)
        return;
    if (b->n_e == b->cap_e) {
        size_t cap = b->cap_e ? b->cap_e * 2 : 1024;
        bedge *ne = realloc(b->e, cap * sizeof *ne);
        if (!ne) {
            bfail(b, TERN_ENOMEM, "out of memory");
            return;
        }
        b->e = ne;
        b->cap_e = cap;
    }
    b->e[b->n_e++] = (bedge){.from = from, .to = to, .rule = rule, .type = (uint8_t)type, .lo = lo, .hi = hi};
}

/* UTF-8 byte sequences for the code point range [lo, hi] (no surrogates),
 * each a chain from `from` to `to`. */
static void utf8_seq(builder *b, int32_t from, int32_t to, uint32_t lo, uint32_t hi)
{
    static const uint32_t lim[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (b->bad)
        return;
    if (lo <= 0xDFFF && hi >= 0xD800) { /* surrogates are not UTF-8 */
        if (lo < 0xD800)
            utf8_seq(b, from, to, lo, 0xD7FF);
        if (hi > 0xDFFF)
            utf8_seq(b, from, to, 0xE000, hi);
        return;
    }
    for (int i = 0; i < 3; i++) {
        if (lo <= lim[i] && hi > lim[i]) {
            utf8_seq(b, from, to, lo, lim[i]);
            utf8_seq(b, from, to, lim[i] + 1, hi);
            return;
        }
    }
    if (hi < 0x80) {
        add_edge(b, from, to, E_BYTE, (uint8_t)lo, (uint8_t)hi, 0);
        return;
    }
    int n = hi < 0x800 ? 2 : hi < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_seq(b, from, to, lo, lo | m);
                utf8_seq(b, from, to, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_seq(b, from, to, lo, (hi & ~m) - 1);
                utf8_seq(b, from, to, hi & ~m, hi);
                return;
            }
        }
    }
    uint8_t a[4], z[4];
    for (int i = n - 1; i > 0; i--) {
        a[i] = (uint8_t)(0x80 | (lo & 0x3F));
        z[i] = (uint8_t)(0x80 | (hi & 0x3F));
        lo >>= 6;
        hi >>= 6;
    }
    static const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
    a[0] = (uint8_t)(lead[n] | lo);
    z[0] = (uint8_t)(lead[n] | hi);
    int32_t cur = from;
    for (int i = 0; i < n; i++) {
        int32_t nx = i == n - 1 ? to : new_state(b);
        add_edge(b, cur, nx, E_BYTE, a[i], z[i], 0);
        cur = nx;
    }
}

/* Builds a starting at `from`; returns the end state. */
static int32_t build(builder *b, const gast *a, int32_t from)
{
    if (b->bad || from < 0)
        return -1;
    switch (a->kind) {
    case GAST_EMPTY:
        return from;
    case GAST_BYTES: {
        int32_t cur = from;
        for (int i = 0; i < a->n; i++) {
            int32_t nx = new_state(b);
            add_edge(b, cur, nx, E_BYTE, a->u.bytes[i], a->u.bytes[i], 0);
            cur = nx;
        }
        return cur;
    }
    case GAST_CLASS: {
        int32_t end = new_state(b);
        for (int i = 0; i < a->n; i++)
            utf8_seq(b, from, end, a->u.cls.ranges[2 * i], a->u.cls.ranges[2 * i + 1]);
        return end;
    }
    case GAST_REF: {
        int32_t end = new_state(b);
        add_edge(b, from, end, E_RULE, 0, 0, a->u.ref);
        return end;
    }
    case GAST_SEQ: {
        int32_t cur = from;
        for (int i = 0; i < a->n; i++)
            cur = build(b, a->u.kids[i], cur);
        return cur;
    }
    case GAST_ALT: {
        int32_t end = new_state(b);
        for (int i = 0; i < a->n; i++) {
            /* a fresh start per branch keeps branch loops apart */
            int32_t st = new_state(b);
            add_edge(b, from, st, E_EPS, 0, 0, 0);
            int32_t e = build(b, a->u.kids[i], st);
            add_edge(b, e, end, E_EPS, 0, 0, 0);
        }
        return end;
    }
    case GAST_REP: {
        /* Copy i of x{m,n} (x reads a byte each time) differs from copy 0
         * only in how many copies remain, mandatory (m - i) and in all
         * (n - i); a token of at most h bytes cannot see past h + 1 more
         * copies, so copies with both counts above h + 1 (T below) are
         * alike: their states share token sets (st_alias). */
        int alike = b->horizon > 0 && ast_reads_byte(a->u.rep.kid, b->rnull);
        int32_t T = b->horizon + 2, m = a->u.rep.min, n = a->u.rep.max;
        int32_t cur = from, first0 = -1, w0 = -1;
        for (int32_t i = 0; i < m && !b->bad; i++) {
            int32_t first = b->n_s;
            cur = build(b, a->u.rep.kid, cur);
            if (i == 0)
                first0 = first, w0 = b->n_s - first;
            else if (alike && m - i >= T && (n < 0 || n - i >= T) && b->n_s - first == w0)
                alias_copy(b, first, first0, w0);
        }
        if (a->u.rep.max < 0) {
            int32_t head = new_state(b);
            add_edge(b, cur, head, E_EPS, 0, 0, 0);
            int32_t e = build(b, a->u.rep.kid, head);
            add_edge(b, e, head, E_EPS, 0, 0, 0);
            return head;
        }
        /* optional copies nest: x{0,3} = (x (x (x)?)?)? so every skip
         * jumps straight to the end */
        int32_t n_opt = a->u.rep.max - a->u.rep.min;
        if (n_opt <= 0)
            return cur;
        int32_t end = new_state(b);
        for (int32_t i = 0; i < n_opt && !b->bad; i++) {
            add_edge(b, cur, end, E_EPS, 0, 0, 0);
            int32_t st = new_state(b);
            add_edge(b, cur, st, E_EPS, 0, 0, 0);
            cur = build(b, a->u.rep.kid, st);
            if (i == 0)
                first0 = st, w0 = b->n_s - st;
            else if (alike && n_opt - i >= T && b->n_s - st == w0)
                alias_copy(b, st, first0, w0);
        }
        add_edge(b, cur, end, E_EPS, 0, 0, 0);
        return end;
    }
    }
    bfail(b, TERN_EINTERNAL, "bad syntax tree");
    return -1;
}

/* Live states (can reach their rule's end) and productive rules (whose
 * start is live), where a rule edge is passable once its rule is
 * productive: a worklist over reversed edges, linear in the automaton
 * (a pass-until-stable loop took a pass per link of a chain of rules).
 * 0, or -1 when out of memory. */
static int live_states(const bedge *ne, size_t n_ne, int32_t ns, int32_t nr, const int32_t *start,
                       const uint8_t *fin, uint8_t *live, uint8_t *prod)
{
    int32_t *toff = calloc((size_t)ns + 1, sizeof *toff), *tidx = malloc((n_ne ? n_ne : 1) * sizeof *tidx);
    int32_t *roff = calloc((size_t)nr + 1, sizeof *roff), *ridx = malloc((n_ne ? n_ne : 1) * sizeof *ridx);
    int32_t *st2rule = malloc((size_t)(ns ? ns : 1) * sizeof *st2rule);
    int32_t *q = malloc((size_t)(ns ? ns : 1) * sizeof *q);
    int rc = -1;
    if (!toff || !tidx || !roff || !ridx || !st2rule || !q)
        goto out;
    for (size_t i = 0; i < n_ne; i++) {
        toff[ne[i].to + 1]++;
        if (ne[i].type == E_RULE)
            roff[ne[i].rule + 1]++;
    }
    for (int32_t s = 0; s < ns; s++)
        toff[s + 1] += toff[s];
    for (int32_t r = 0; r < nr; r++)
        roff[r + 1] += roff[r];
    for (size_t i = 0; i < n_ne; i++) {
        tidx[toff[ne[i].to]++] = (int32_t)i;
        if (ne[i].type == E_RULE)
            ridx[roff[ne[i].rule]++] = (int32_t)i;
    }
    for (int32_t s = ns; s > 0; s--) /* the fill moved each offset to its end */
        toff[s] = toff[s - 1];
    toff[0] = 0;
    for (int32_t r = nr; r > 0; r--)
        roff[r] = roff[r - 1];
    roff[0] = 0;
    for (int32_t s = 0; s < ns; s++)
        st2rule[s] = -1;
    for (int32_t r = 0; r < nr; r++)
        if (start[r] >= 0)
            st2rule[start[r]] = r;
    int32_t qn = 0;
    for (int32_t s = 0; s < ns; s++)
        if ((live[s] = fin[s]))
            q[qn++] = s;
    for (int32_t qh = 0; qh < qn; qh++) {
        int32_t x = q[qh], r = st2rule[x];
        if (r >= 0 && !prod[r]) {
            prod[r] = 1; /* rule edges calling r open where their target is live */
            for (int32_t k = roff[r]; k < roff[r + 1]; k++) {
                const bedge *e = &ne[ridx[k]];
                if (live[e->to] && !live[e->from])
                    live[e->from] = 1, q[qn++] = e->from;
            }
        }
        for (int32_t k = toff[x]; k < toff[x + 1]; k++) {
            const bedge *e = &ne[tidx[k]];
            if (!live[e->from] && (e->type == E_BYTE || prod[e->rule]))
                live[e->from] = 1, q[qn++] = e->from;
        }
    }
    rc = 0;
out:
    free(toff);
    free(tidx);
    free(roff);
    free(ridx);
    free(st2rule);
    free(q);
    return rc;
}

/* Left recursion: rule r calls a rule before reading a byte (through
 * nullable calls) and so, transitively, itself. First the nullable rules
 * and each rule's states reachable from its start through nullable calls
 * (a worklist: when a rule turns nullable, the calls to it from reached
 * states open), then a DFS over the rule -> left-called rule graph. Linear
 * in the automaton. 0, TERN_EINVAL naming the rule, or TERN_ENOMEM. */
static int left_recursion_check(const grammar *g, const bedge *ne, size_t n_ne, const int32_t *off, int32_t ns,
                                int32_t nr, const int32_t *start, const uint8_t *fin, tern_err *err)
{
    int32_t *roff = calloc((size_t)nr + 1, sizeof *roff), *ridx = malloc((n_ne ? n_ne : 1) * sizeof *ridx);
    int32_t *q = malloc((size_t)(ns ? ns : 1) * sizeof *q), *srule = malloc((size_t)(ns ? ns : 1) * sizeof *srule);
    int32_t *lc_off = calloc((size_t)nr + 1, sizeof *lc_off), *lc = NULL, *stk = NULL;
    uint8_t *reached = calloc((size_t)(ns ? ns : 1), 1), *nullable = calloc((size_t)(nr ? nr : 1), 1);
    uint8_t *color = calloc((size_t)(nr ? nr : 1), 1);
    int rc = TERN_ENOMEM;
    if (!roff || !ridx || !q || !srule || !lc_off || !reached || !nullable || !color)
        goto out;
    for (size_t i = 0; i < n_ne; i++)
        if (ne[i].type == E_RULE)
            roff[ne[i].rule + 1]++;
    for (int32_t r = 0; r < nr; r++)
        roff[r + 1] += roff[r];
    for (size_t i = 0; i < n_ne; i++)
        if (ne[i].type == E_RULE)
            ridx[roff[ne[i].rule]++] = (int32_t)i;
    for (int32_t r = nr; r > 0; r--)
        roff[r] = roff[r - 1];
    roff[0] = 0;
    for (int32_t r = 0, s = 0; r < nr; r++) /* states are allocated rule by rule */
        for (int32_t lim = r + 1 < nr ? start[r + 1] : ns; s < lim; s++)
            srule[s] = r;
    int32_t qn = 0;
    for (int32_t r = 0; r < nr; r++)
        reached[start[r]] = 1, q[qn++] = start[r];
    for (int32_t qh = 0; qh < qn; qh++) {
        int32_t x = q[qh];
        if (fin[x] && !nullable[srule[x]]) {
            int32_t r = srule[x];
            nullable[r] = 1;
            for (int32_t k = roff[r]; k < roff[r + 1]; k++) {
                const bedge *e = &ne[ridx[k]];
                if (reached[e->from] && !reached[e->to])
                    reached[e->to] = 1, q[qn++] = e->to;
            }
        }
        for (int32_t i = off[x]; i < off[x + 1]; i++)
            if (ne[i].type == E_RULE && nullable[ne[i].rule] && !reached[ne[i].to])
                reached[ne[i].to] = 1, q[qn++] = ne[i].to;
    }
    /* the left-call graph: calls made from reached states */
    size_t n_lc = 0;
    for (int32_t s = 0; s < ns; s++)
        if (reached[s])
            for (int32_t i = off[s]; i < off[s + 1]; i++)
                if (ne[i].type == E_RULE)
                    lc_off[srule[s] + 1]++, n_lc++;
    for (int32_t r = 0; r < nr; r++)
        lc_off[r + 1] += lc_off[r];
    lc = malloc((n_lc ? n_lc : 1) * sizeof *lc);
    stk = malloc(((size_t)nr + 1) * 2 * sizeof *stk);
    if (!lc || !stk)
        goto out;
    memset(q, 0, (size_t)nr * sizeof *q); /* q reused as per-rule fill cursors (ns >= nr) */
    for (int32_t s = 0, *fill = q; s < ns; s++)
        if (reached[s])
            for (int32_t i = off[s]; i < off[s + 1]; i++)
                if (ne[i].type == E_RULE)
                    lc[lc_off[srule[s]] + fill[srule[s]]++] = ne[i].rule;
    rc = 0;
    for (int32_t r0 = 0; r0 < nr && !rc; r0++) {
        if (color[r0])
            continue;
        int sp = 1;
        stk[0] = r0;
        stk[1] = lc_off[r0];
        color[r0] = 1;
        while (sp && !rc) {
            int32_t r = stk[2 * (sp - 1)], k = stk[2 * (sp - 1) + 1]++;
            if (k >= lc_off[r + 1]) {
                color[r] = 2;
                sp--;
                continue;
            }
            int32_t f = lc[k];
            if (color[f] == 1)
                rc = tern_err_set(err, TERN_EINVAL, "grammar: rule '%s' is left-recursive", g->rule_names[f]);
            else if (color[f] == 0) {
                color[f] = 1;
                stk[2 * sp] = f;
                stk[2 * sp + 1] = lc_off[f];
                sp++;
            }
        }
    }
out:
    if (rc == TERN_ENOMEM)
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
    free(roff);
    free(ridx);
    free(q);
    free(srule);
    free(lc_off);
    free(lc);
    free(stk);
    free(reached);
    free(nullable);
    free(color);
    return rc;
}

static int cmp_edge_from(const void *x, const void *y)
{
    const bedge *a = x, *c = y;
    if (a->from != c->from)
        return a->from < c->from ? -1 : 1;
    if (a->type != c->type)
        return a->type < c->type ? -1 : 1;
    if (a->lo != c->lo)
        return a->lo < c->lo ? -1 : 1;
    if (a->rule != c->rule)
        return a->rule < c->rule ? -1 : 1;
    return a->to < c->to ? -1 : a->to > c->to;
}

int gbuild_automaton(grammar *g, const grammar_limits *lim, double t0, tern_err *err)
{
    long horizon = lim->alias_horizon > 0 ? lim->alias_horizon : GRAMMAR_ALIAS_HORIZON;
    if (horizon > 1L << 20)
        horizon = 0; /* no sharing */
    builder B = {.g = g, .max_states = lim->max_states, .max_ms = lim->max_ms, .t0 = t0, .err = err,
                 .horizon = (int32_t)horizon};
    g->alias_horizon = horizon;
    builder *b = &B;
    int32_t nr = g->n_rules;
    int32_t *start = malloc((size_t)nr * sizeof *start), *endst = malloc((size_t)nr * sizeof *endst);
    int rc = 0;
    int32_t *off = NULL, *stk = NULL, *newid = NULL, *srule = NULL;
    uint32_t *mark = NULL;
    uint8_t *fin = NULL, *live = NULL, *prod = NULL;
    bedge *ne = NULL;
    size_t n_ne = 0, cap_ne = 0;
    uint8_t *rnull = calloc((size_t)(nr ? nr : 1), 1);
    b->rnull = rnull;
    if (!start || !endst || !rnull) {
        free(rnull);
        rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        goto out;
    }
    rules_nullable(g, rnull);
    for (int32_t r = 0; r < nr; r++) {
        start[r] = new_state(b);
        endst[r] = build(b, g->rule_bodies[r], start[r]);
    }
    free(rnull);
    b->rnull = NULL;
    if (b->bad) {
        rc = b->bad;
        goto out;
    }
    int32_t ns = b->n_s;
    srule = malloc((size_t)ns * sizeof *srule);
    /* owning rule of each state: states are allocated rule by rule */
    if (!srule) {
        rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        goto out;
    }
    for (int32_t r = 0, s = 0; r < nr; r++) {
        int32_t lim_s = r + 1 < nr ? start[r + 1] : ns;
        for (; s < lim_s; s++)
            srule[s] = r;
    }
    /* CSR of the raw edges */
    if (b->n_e)
        qsort(b->e, b->n_e, sizeof *b->e, cmp_edge_from);
    off = calloc((size_t)ns + 1, sizeof *off);
    mark = calloc((size_t)ns, sizeof *mark);
    stk = malloc(((size_t)ns + b->n_e + 1) * sizeof *stk);
    fin = calloc((size_t)ns, 1);
    if (!off || !mark || !stk || !fin) {
        rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        goto out;
    }
    for (size_t i = 0; i < b->n_e; i++)
        off[b->e[i].from + 1]++;
    for (int32_t s = 0; s < ns; s++)
        off[s + 1] += off[s];
    /* epsilon elimination: s gets every non-epsilon edge of its closure */
    for (int32_t s = 0; s < ns; s++) {
        uint32_t ep = (uint32_t)s + 1;
        int sp = 0;
        stk[sp++] = s;
        mark[s] = ep;
        while (sp) {
            int32_t x = stk[--sp];
            if (x == endst[srule[s]])
                fin[s] = 1;
            for (int32_t i = off[x]; i < off[x + 1]; i++) {
                bedge *e = &b->e[i];
                if (e->type == E_EPS) {
                    if (mark[e->to] != ep) {
                        mark[e->to] = ep;
                        stk[sp++] = e->to;
                    }
                } else {
                    if (n_ne == cap_ne) {
                        size_t cap = cap_ne ? cap_ne * 2 : 1024;
                        bedge *nn = realloc(ne, cap * sizeof *nn);
                        if (!nn) {
                            rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
                            goto out;
                        }
                        ne = nn;
                        cap_ne = cap;
                    }
                    ne[n_ne] = *e;
                    ne[n_ne].from = s;
                    n_ne++;
                }
            }
        }
        if ((s & 255) == 0) {
            int stop = grammar_thread_stopped();
            if (stop || (b->max_ms > 0 && gclock_ms() - t0 > (double)b->max_ms)) {
                rc = stop == TERN_ECANCELED ? tern_err_set(err, stop, "grammar: compile cancelled")
                                            : tern_err_set(err, TERN_ETIMEOUT, "grammar: compile time limit exceeded");
                goto out;
            }
        }
        if ((long)n_ne > 16 * b->max_states) {
            rc = tern_err_set(err, TERN_EFULL, "grammar: too many automaton edges");
            goto out;
        }
    }
    if (n_ne)
        qsort(ne, n_ne, sizeof *ne, cmp_edge_from);
    { /* dedupe */
        size_t k = 0;
        for (size_t i = 0; i < n_ne; i++)
            if (!k || cmp_edge_from(&ne[k - 1], &ne[i]))
                ne[k++] = ne[i];
        n_ne = k;
    }
    memset(off, 0, ((size_t)ns + 1) * sizeof *off);
    for (size_t i = 0; i < n_ne; i++)
        off[ne[i].from + 1]++;
    for (int32_t s = 0; s < ns; s++)
        off[s + 1] += off[s];

    /* productive rules and live states (can reach the rule's end), by
     * fixpoint: a rule edge is passable once its rule is productive */
    live = calloc((size_t)ns, 1);
    prod = calloc((size_t)nr, 1);
    if (!live || !prod) {
        rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        goto out;
    }
    if (live_states(ne, n_ne, ns, nr, start, fin, live, prod)) {
        rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        goto out;
    }
    if (!prod[g->root]) {
        rc = tern_err_set(err, TERN_EINVAL, "grammar: rule '%s' matches nothing", g->rule_names[g->root]);
        goto out;
    }
    if ((rc = left_recursion_check(g, ne, n_ne, off, ns, nr, start, fin, err)))
        goto out;
    /* keep live edges, then the states reachable from the root's start */
    {
        size_t k = 0;
        for (size_t i = 0; i < n_ne; i++)
            if (live[ne[i].to] && (ne[i].type == E_BYTE || prod[ne[i].rule]))
                ne[k++] = ne[i];
        n_ne = k;
        memset(off, 0, ((size_t)ns + 1) * sizeof *off);
        for (size_t i = 0; i < n_ne; i++)
            off[ne[i].from + 1]++;
        for (int32_t s = 0; s < ns; s++)
            off[s + 1] += off[s];
    }
    newid = malloc((size_t)ns * sizeof *newid);
    if (!newid) {
        rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        goto out;
    }
    for (int32_t s = 0; s < ns; s++)
        newid[s] = -1;
    int32_t n_keep = 0;
    {
        int sp = 0;
        stk[sp++] = start[g->root];
        newid[start[g->root]] = -2;
        uint8_t *rule_used = calloc((size_t)nr, 1);
        if (!rule_used) {
            rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
            goto out;
        }
        rule_used[g->root] = 1;
        while (sp) {
            int32_t x = stk[--sp];
            for (int32_t i = off[x]; i < off[x + 1]; i++) {
                if (newid[ne[i].to] == -1) {
                    newid[ne[i].to] = -2;
                    stk[sp++] = ne[i].to;
                }
                if (ne[i].type == E_RULE && !rule_used[ne[i].rule]) {
                    rule_used[ne[i].rule] = 1;
                    if (newid[start[ne[i].rule]] == -1) {
                        newid[start[ne[i].rule]] = -2;
                        stk[sp++] = start[ne[i].rule];
                    }
                }
            }
        }
        free(rule_used);
        for (int32_t s = 0; s < ns; s++)
            if (newid[s] == -2)
                newid[s] = n_keep++;
    }
    g->n_states = n_keep;
    g->rule_start = malloc((size_t)nr * sizeof *g->rule_start);
    g->st_rule = malloc((size_t)(n_keep ? n_keep : 1) * sizeof *g->st_rule);
    g->st_final = calloc((size_t)(n_keep ? n_keep : 1), 1);
    g->be_off = calloc((size_t)n_keep + 1, sizeof *g->be_off);
    g->re_off = calloc((size_t)n_keep + 1, sizeof *g->re_off);
    size_t nb = 0, nre = 0;
    for (size_t i = 0; i < n_ne; i++) {
        if (newid[ne[i].from] < 0)
            continue;
        if (ne[i].type == E_BYTE)
            nb++;
        else
            nre++;
    }
    g->be = malloc((nb ? nb : 1) * sizeof *g->be);
    g->re = malloc((nre ? nre : 1) * sizeof *g->re);
    g->st_alias = malloc((size_t)(n_keep ? n_keep : 1) * sizeof *g->st_alias);
    if (!g->rule_start || !g->st_rule || !g->st_final || !g->be_off || !g->re_off || !g->be || !g->re ||
        !g->st_alias) {
        rc = tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        goto out;
    }
    for (int32_t r = 0; r < nr; r++)
        g->rule_start[r] = newid[start[r]];
    for (int32_t s = 0; s < ns; s++) {
        if (newid[s] < 0)
            continue;
        g->st_rule[newid[s]] = srule[s];
        g->st_final[newid[s]] = fin[s];
    }
    /* aliases point to earlier states: resolve chains (nested repetitions)
     * in order, then renumber; a dropped target leaves the state alone */
    for (int32_t s = 0; s < ns; s++) {
        b->alias[s] = b->alias[b->alias[s]];
        int32_t t = b->alias[s];
        if (newid[s] >= 0)
            g->st_alias[newid[s]] = newid[t] >= 0 && srule[t] == srule[s] ? newid[t] : newid[s];
    }
    /* edges are sorted by old from; old->new order is monotone */
    nb = nre = 0;
    for (size_t i = 0; i < n_ne; i++) {
        int32_t f = newid[ne[i].from];
        if (f < 0)
            continue;
        if (ne[i].type == E_BYTE) {
            g->be[nb++] = (gbyte_edge){.lo = ne[i].lo, .hi = ne[i].hi, .target = newid[ne[i].to]};
            g->be_off[f + 1]++;
        } else {
            g->re[nre++] = (grule_edge){.rule = ne[i].rule, .target = newid[ne[i].to]};
            g->re_off[f + 1]++;
        }
    }
    for (int32_t s = 0; s < n_keep; s++) {
        g->be_off[s + 1] += g->be_off[s];
        g->re_off[s + 1] += g->re_off[s];
    }
out:
    free(b->e);
    free(b->alias);
    free(ne);
    free(start);
    free(endst);
    free(off);
    free(mark);
    free(stk);
    free(fin);
    free(live);
    free(prod);
    free(newid);
    free(srule);
    return rc;
}
