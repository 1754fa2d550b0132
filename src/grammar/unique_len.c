/* The length tracker's automata (unique_int.h GUQ_RE_PREFIX): per length
 * rule, the deterministic automaton of its terms over codepoints and, per
 * state, which remaining lengths can still end the string there, so the
 * tracker refuses a token after which the string cannot end within
 * [minLength, maxLength] (the exactness the product automaton had). Built
 * once per grammar (grammar_from_ebnf). */
#include <stdlib.h>
#include <string.h>

#include "grammar/fe_int.h"
#include "grammar/unique_int.h"

/* reach bitsets past this many bits x moves are not built: then only the
 * shortest way to the end (mind) is checked, the upper bound exactly and
 * the lower bound not at all (documented in docs/grammar.md) */
#define LRE_MAX_WORK (1L << 23)

struct guq_lre {
    gfe_cpdfa *d;
    long mn, mx;
    int32_t *mind;    /* [n] fewest codepoints to an accepting state */
    int32_t max_mind; /* the largest of them */
    long nbits;       /* reach bits per state: lengths 0 .. nbits - 1; 0 = none */
    size_t nw;        /* words per state */
    uint64_t *reach;  /* [n][nw]: bit L set when an accepting state is L codepoints away */
    uint64_t *bad;    /* [words of mx + 1, or mn + 1]: bit c set when some state is a dead end at count c */
    long nbad;
};

void guq_lre_free(guq_lre *x)
{
    if (!x)
        return;
    gfe_cpdfa_free(x->d);
    free(x->mind);
    free(x->reach);
    free(x->bad);
    free(x);
}

/* "+LEN:regex" / "-LEN:regex" terms from the GUQ_RE_PREFIX literal. */
static int parse_terms(const uint8_t *s, size_t n, gfe_re_term *t, int *nt)
{
    size_t i = 0;
    *nt = 0;
    while (i < n) {
        if (*nt == GFE_RE_MAX_TERMS || (s[i] != '+' && s[i] != '-'))
            return -1;
        int neg = s[i++] == '-';
        size_t len = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            len = len * 10 + (size_t)(s[i++] - '0');
        if (i >= n || s[i] != ':' || len > n - i - 1)
            return -1;
        i++;
        t[(*nt)++] = (gfe_re_term){(const char *)s + i, len, neg};
        i += len;
    }
    return *nt ? 0 : -1;
}

static int any_bit(const uint64_t *w, long lo, long hi)
{
    for (long b = lo; b <= hi;) {
        uint64_t x = w[b >> 6] >> (b & 63);
        if ((b & 63) == 0 && b + 63 <= hi) {
            if (w[b >> 6])
                return 1;
            b += 64;
            continue;
        }
        if (x & 1)
            return 1;
        b++;
    }
    return 0;
}

int guq_lre_viable(const guq_lre *x, int32_t q, long c)
{
    long lo = x->mn > c ? x->mn - c : 0, hi;
    if (x->mx >= 0) {
        hi = x->mx - c;
        if (hi < lo)
            return 0;
    } else {
        hi = -1; /* none */
    }
    if (!x->nbits)
        return hi < 0 || x->mind[q] <= hi;
    long top = x->nbits - 1;
    if (hi < 0 || hi > top)
        hi = top;
    if (lo > hi)
        return 0;
    return any_bit(x->reach + (size_t)q * x->nw, lo, hi);
}

int guq_lre_bad(const guq_lre *x, long c0, long c1)
{
    if (x->bad) {
        if (c0 >= x->nbad)
            return 0;
        if (c1 >= x->nbad)
            c1 = x->nbad - 1;
        return any_bit(x->bad, c0, c1);
    }
    return x->mx >= 0 && c1 > x->mx - x->max_mind;
}

int guq_lre_partial(const guq_lre *x, int32_t q, uint32_t lo, uint32_t hi, long c)
{
    const gfe_cpdfa *d = x->d;
    for (uint32_t e = d->off[q]; e < d->off[q + 1]; e++)
        if (d->mv[e].hi >= lo && d->mv[e].lo <= hi && guq_lre_viable(x, d->mv[e].to, c))
            return 1;
    return 0;
}

int32_t guq_lre_step(const guq_lre *x, int32_t q, uint32_t cp) { return gfe_cpdfa_step(x->d, q, cp); }

static guq_lre *lre_build(const uint8_t *lit, size_t n_lit, long mn, long mx)
{
    gfe_re_term t[GFE_RE_MAX_TERMS];
    int nt, never = 0;
    tern_err e = {0};
    gfe_cpdfa *d = NULL;
    if (parse_terms(lit, n_lit, t, &nt) || gfe_regex_terms_dfa(t, nt, &d, &never, &e) || !d)
        return NULL;
    guq_lre *x = calloc(1, sizeof *x);
    int32_t n = d->n, *q = malloc(((size_t)n + 1) * sizeof *q);
    uint32_t *roff = calloc((size_t)n + 2, sizeof *roff), *radj = malloc(((size_t)d->off[n] + 1) * sizeof *radj);
    if (!x || !q || !roff || !radj || !(x->mind = malloc(((size_t)n + 1) * sizeof *x->mind)))
        goto fail;
    x->d = d;
    x->mn = mn;
    x->mx = mx;
    /* fewest codepoints to the end: breadth first over reversed moves */
    for (int32_t s = 0; s < n; s++)
        for (uint32_t m = d->off[s]; m < d->off[s + 1]; m++)
            roff[d->mv[m].to + 1]++;
    for (int32_t s = 0; s < n; s++)
        roff[s + 1] += roff[s];
    {
        uint32_t *fill = calloc((size_t)n + 1, sizeof *fill);
        if (!fill)
            goto fail;
        for (int32_t s = 0; s < n; s++)
            for (uint32_t m = d->off[s]; m < d->off[s + 1]; m++)
                radj[roff[d->mv[m].to] + fill[d->mv[m].to]++] = (uint32_t)s;
        free(fill);
    }
    int32_t qn = 0;
    for (int32_t s = 0; s < n; s++) {
        x->mind[s] = d->acc[s] ? 0 : -1;
        if (d->acc[s])
            q[qn++] = s;
    }
    for (int32_t i = 0; i < qn; i++)
        for (uint32_t j = roff[q[i]]; j < roff[q[i] + 1]; j++)
            if (x->mind[radj[j]] < 0) {
                x->mind[radj[j]] = x->mind[q[i]] + 1;
                q[qn++] = (int32_t)radj[j];
            }
    for (int32_t s = 0; s < n; s++) {
        if (x->mind[s] < 0) /* the export keeps live states only */
            x->mind[s] = 1 << 30;
        if (x->mind[s] > x->max_mind)
            x->max_mind = x->mind[s];
    }
    /* exact lengths: bit L of reach[s] = an accepting state exactly L
     * codepoints away. With a maximum the window never passes mx; with
     * only a minimum, n more bits tell whether longer ways exist (a way
     * longer than mn + n + 1 holds a cycle of at most n moves: cutting
     * cycles lands in (mn, mn + n + 1]). */
    long nbits = mx >= 0 ? mx + 1 : mn + (long)n + 2;
    if (mx < 0 && mn == 0)
        nbits = 0; /* no bound: every live state is viable */
    if (nbits && nbits * (long)(d->off[n] + (uint32_t)n) <= LRE_MAX_WORK) {
        size_t nw = (size_t)(nbits + 63) / 64;
        x->reach = calloc((size_t)n * nw + 1, sizeof *x->reach);
        if (!x->reach)
            goto fail;
        x->nbits = nbits;
        x->nw = nw;
        for (int32_t s = 0; s < n; s++)
            if (d->acc[s])
                x->reach[(size_t)s * nw] |= 1;
        for (long L = 1; L < nbits; L++)
            for (int32_t s = 0; s < n; s++)
                for (uint32_t m = d->off[s]; m < d->off[s + 1]; m++) {
                    const uint64_t *r = x->reach + (size_t)d->mv[m].to * nw;
                    if (r[(L - 1) >> 6] >> ((L - 1) & 63) & 1) {
                        x->reach[(size_t)s * nw + (size_t)(L >> 6)] |= 1ull << (L & 63);
                        break;
                    }
                }
        /* counts at which some state has no way to end in bounds */
        long nb = mx >= 0 ? mx + 1 : mn + 1;
        x->bad = calloc((size_t)(nb + 63) / 64 + 1, sizeof *x->bad);
        if (!x->bad)
            goto fail;
        x->nbad = nb;
        for (long c = 0; c < nb; c++)
            for (int32_t s = 0; s < n; s++)
                if (!guq_lre_viable(x, s, c)) {
                    x->bad[c >> 6] |= 1ull << (c & 63);
                    break;
                }
    }
    free(q);
    free(roff);
    free(radj);
    return x;
fail:
    free(q);
    free(roff);
    free(radj);
    if (x)
        x->d = d;
    else
        gfe_cpdfa_free(d);
    guq_lre_free(x);
    return NULL;
}

/* GUQ_LEN_PREFIX "MIN_MAX_N": 1, the bounds and N, or 0. */
int guq_len_rule_name(const char *name, long *mn, long *mx, unsigned long *num)
{
    size_t plen = strlen(GUQ_LEN_PREFIX);
    if (strncmp(name, GUQ_LEN_PREFIX, plen))
        return 0;
    char *e;
    *mn = strtol(name + plen, &e, 10);
    if (*e != '_')
        return 0;
    *mx = strtol(e + 1, &e, 10);
    if (*e != '_' || *mn < 0 || *mx < -1)
        return 0;
    *num = strtoul(e + 1, &e, 10);
    return 1;
}

typedef struct re_rule { unsigned long num; int32_t rule; } re_rule;

static int cmp_re_rule(const void *a, const void *b)
{
    unsigned long x = ((const re_rule *)a)->num, y = ((const re_rule *)b)->num;
    return (x > y) - (x < y);
}

int guq_grammar_prepare(grammar *g)
{
    /* the GUQ_RE_PREFIX rules by number, found once */
    size_t rp = strlen(GUQ_RE_PREFIX), n_re = 0;
    re_rule *re = NULL;
    for (int32_t k = 0; k < g->n_rules; k++) {
        const char *nm = g->rule_names[k];
        char *e;
        if (strncmp(nm, GUQ_RE_PREFIX, rp))
            continue;
        unsigned long num = strtoul(nm + rp, &e, 10);
        if (*e)
            continue;
        if (!re && !(re = malloc((size_t)g->n_rules * sizeof *re)))
            return TERN_ENOMEM;
        re[n_re++] = (re_rule){num, k};
    }
    if (!n_re)
        return 0;
    qsort(re, n_re, sizeof *re, cmp_re_rule);
    int rc = 0;
    for (int32_t r = 0; r < g->n_rules && !rc; r++) {
        long mn, mx;
        re_rule key;
        if (g->rule_start[r] < 0 || !guq_len_rule_name(g->rule_names[r], &mn, &mx, &key.num))
            continue;
        const re_rule *f = bsearch(&key, re, n_re, sizeof *re, cmp_re_rule);
        const gast *a = f ? g->rule_bodies[f->rule] : NULL;
        if (!a || a->kind != GAST_BYTES)
            continue;
        guq_lre *x = lre_build(a->u.bytes, (size_t)a->n, mn, mx);
        if (!x)
            continue; /* no automaton: the counts alone (the bounds still hold) */
        if (!g->len_re && !(g->len_re = calloc((size_t)g->n_rules, sizeof *g->len_re))) {
            guq_lre_free(x);
            rc = TERN_ENOMEM;
            break;
        }
        g->len_re[r] = x;
    }
    free(re);
    return rc;
}
