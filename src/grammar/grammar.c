/* grammar objects: construction from EBNF text, printing back as EBNF, and
 * the byte-level reference checker (grammar_check_text). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/strbuf.h"
#include "grammar/grammar_int.h"
#include "grammar/unique_int.h"

static _Thread_local const int *g_cancel;
static _Thread_local double g_deadline_ms;

void grammar_thread_control_set(const int *cancel, double deadline_ms)
{
    g_cancel = cancel;
    g_deadline_ms = deadline_ms;
}

int grammar_thread_stopped(void)
{
    if (g_cancel && __atomic_load_n(g_cancel, __ATOMIC_RELAXED))
        return TERN_ECANCELED;
    if (g_deadline_ms > 0 && gclock_ms() > g_deadline_ms)
        return TERN_ETIMEOUT;
    return 0;
}

double grammar_clock_ms(void) { return gclock_ms(); }

void grammar_limits_init(grammar_limits *l)
{
    l->max_states = 1000000; /* ~100 MB of automaton at worst */
    l->max_ms = 2000;        /* a schema that takes longer is pathological */
    l->alias_horizon = 0;
    l->precompute = 0;
}

grammar *grammar_from_ebnf(const char *text, size_t len, const char *root, const grammar_limits *limits,
                           tern_err *err)
{
    grammar_limits def;
    if (!limits) {
        grammar_limits_init(&def);
        limits = &def;
    }
    double t0 = gclock_ms();
    grammar *g = calloc(1, sizeof *g);
    if (!g) {
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    if (gebnf_parse(g, text, len, root, err) || gbuild_automaton(g, limits, t0, err)) {
        grammar_free(g);
        return NULL;
    }
    if (grammar_compute_sigs(g) || grammar_compute_equiv(g) || guq_grammar_prepare(g)) {
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        grammar_free(g);
        return NULL;
    }
    return g;
}

void grammar_free(grammar *g)
{
    if (!g)
        return;
    garena_free(&g->arena);
    free(g->rule_start);
    free(g->st_rule);
    free(g->st_final);
    free(g->be_off);
    free(g->be);
    free(g->re_off);
    free(g->re);
    free(g->rule_sig);
    free(g->rule_first);
    free(g->st_alias);
    free(g->st_equiv);
    if (g->len_re)
        for (int32_t r = 0; r < g->n_rules; r++)
            guq_lre_free(g->len_re[r]);
    free(g->len_re);
    free(g);
}

/* ---- structural signatures ------------------------------------------------ */

static inline uint64_t h64(uint64_t h, uint64_t x)
{
    h ^= x + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
    return h * 0xFF51AFD7ED558CCDULL;
}

/* A node's kind and size, and its contents when it is a leaf (bytes or a
 * class): the part of a tree hash that does not depend on rules. */
static uint64_t node_hash(const gast *a, uint64_t h)
{
    h = h64(h, (uint64_t)a->kind * 131 + (uint64_t)a->n);
    if (a->kind == GAST_BYTES)
        for (int i = 0; i < a->n; i++)
            h = h64(h, a->u.bytes[i]);
    else if (a->kind == GAST_CLASS)
        for (int i = 0; i < 2 * a->n; i++)
            h = h64(h, a->u.cls.ranges[i]);
    return h;
}

/* Hash of a tree; *ok cleared when it calls a rule without a signature. */
static uint64_t ast_hash(const grammar *g, const gast *a, uint64_t h, int *ok)
{
    h = node_hash(a, h);
    switch (a->kind) {
    case GAST_REF:
        if (!g->rule_sig[a->u.ref])
            *ok = 0;
        h = h64(h, g->rule_sig[a->u.ref]);
        break;
    case GAST_SEQ:
    case GAST_ALT:
        for (int i = 0; i < a->n; i++)
            h = ast_hash(g, a->u.kids[i], h, ok);
        break;
    case GAST_REP:
        h = h64(h64(h, (uint64_t)(uint32_t)a->u.rep.min), (uint64_t)(uint32_t)a->u.rep.max);
        h = ast_hash(g, a->u.rep.kid, h, ok);
        break;
    default:
        break;
    }
    return h;
}

/* Rules on recursion cycles: a canonical hash of the rule graph reachable
 * from the rule, callees numbered in first-reference order (exact: equal
 * hashes mean isomorphic rule graphs, up to 64-bit collisions). Graphs
 * larger than SIG_MAX_GRAPH rules, or work past SIG_MAX_WORK tree nodes for
 * the whole grammar, get no signature. */
#define SIG_MAX_GRAPH 64
#define SIG_MAX_WORK 2000000L

typedef struct gwalk {
    const uint64_t *sig1; /* acyclic signatures (first pass) */
    int32_t *index;       /* [n_rules] local number in this graph, -1 */
    int32_t order[SIG_MAX_GRAPH];
    int n_order;
    int ok;
    long work;
} gwalk;

static uint64_t graph_ast(const gast *a, uint64_t h, gwalk *w)
{
    w->work++;
    h = node_hash(a, h);
    switch (a->kind) {
    case GAST_REF: {
        int32_t c = a->u.ref;
        if (w->sig1[c]) {
            h = h64(h, w->sig1[c]);
        } else {
            if (w->index[c] < 0) {
                if (w->n_order == SIG_MAX_GRAPH) {
                    w->ok = 0;
                    break;
                }
                w->index[c] = w->n_order;
                w->order[w->n_order++] = c;
            }
            h = h64(h, 0xC1C1E000ULL + (uint64_t)w->index[c]);
        }
        break;
    }
    case GAST_SEQ:
    case GAST_ALT:
        for (int i = 0; i < a->n; i++)
            h = graph_ast(a->u.kids[i], h, w);
        break;
    case GAST_REP:
        h = h64(h64(h, (uint64_t)(uint32_t)a->u.rep.min), (uint64_t)(uint32_t)a->u.rep.max);
        h = graph_ast(a->u.rep.kid, h, w);
        break;
    default:
        break;
    }
    return h;
}

static int cyclic_sigs(grammar *g)
{
    int32_t n = g->n_rules;
    uint64_t *sig1 = malloc((size_t)(n ? n : 1) * sizeof *sig1);
    gwalk *w = calloc(1, sizeof *w);
    int32_t *index = malloc((size_t)(n ? n : 1) * sizeof *index);
    if (!sig1 || !w || !index) {
        free(sig1);
        free(w);
        free(index);
        return TERN_ENOMEM;
    }
    memcpy(sig1, g->rule_sig, (size_t)n * sizeof *sig1);
    for (int32_t r = 0; r < n; r++)
        index[r] = -1;
    w->sig1 = sig1;
    w->index = index;
    for (int32_t r = 0; r < n && w->work < SIG_MAX_WORK; r++) {
        if (sig1[r])
            continue;
        w->n_order = 1;
        w->order[0] = r;
        index[r] = 0;
        w->ok = 1;
        uint64_t h = 0xCC1E5EEDULL;
        for (int i = 0; i < w->n_order && w->ok && w->work < SIG_MAX_WORK; i++)
            h = graph_ast(g->rule_bodies[w->order[i]], h64(h, (uint64_t)i), w);
        for (int i = 0; i < w->n_order; i++)
            index[w->order[i]] = -1;
        if (w->ok && w->work < SIG_MAX_WORK)
            g->rule_sig[r] = h ? h : 1;
    }
    free(sig1);
    free(w);
    free(index);
    return 0;
}

/* Reference chains deeper than this get no signature (bounded recursion). */
#define SIG_MAX_DEPTH 1000

static void sig_visit(grammar *g, int32_t r, uint8_t *color, int depth);

static void sig_refs(grammar *g, const gast *a, uint8_t *color, int depth)
{
    if (a->kind == GAST_REF)
        sig_visit(g, a->u.ref, color, depth + 1);
    else if (a->kind == GAST_SEQ || a->kind == GAST_ALT)
        for (int i = 0; i < a->n; i++)
            sig_refs(g, a->u.kids[i], color, depth);
    else if (a->kind == GAST_REP)
        sig_refs(g, a->u.rep.kid, color, depth);
}

/* color: 0 new, 1 in progress (a cycle through it leaves sig 0), 2 done */
static void sig_visit(grammar *g, int32_t r, uint8_t *color, int depth)
{
    if (color[r] || depth > SIG_MAX_DEPTH)
        return;
    color[r] = 1;
    sig_refs(g, g->rule_bodies[r], color, depth);
    int ok = 1;
    uint64_t h = ast_hash(g, g->rule_bodies[r], 0x5A17C0DEULL, &ok);
    /* a rule on a cycle: some callee was still in progress */
    g->rule_sig[r] = ok ? (h ? h : 1) : 0;
    color[r] = 2;
}

int grammar_compute_sigs(grammar *g)
{
    g->rule_sig = calloc((size_t)(g->n_rules ? g->n_rules : 1), sizeof *g->rule_sig);
    g->rule_first = malloc((size_t)(g->n_rules ? g->n_rules : 1) * sizeof *g->rule_first);
    uint8_t *color = calloc((size_t)(g->n_rules ? g->n_rules : 1), 1);
    if (!g->rule_sig || !g->rule_first || !color) {
        free(color);
        return TERN_ENOMEM;
    }
    /* deep call chains are bounded by the parser's nesting limit times the
     * number of rules; recursion here follows rule references only */
    for (int32_t r = 0; r < g->n_rules; r++)
        sig_visit(g, r, color, 0);
    /* rules on or above a cycle got 0: hash their rule graphs instead */
    if (cyclic_sigs(g)) {
        free(color);
        return TERN_ENOMEM;
    }
    for (int32_t r = 0; r < g->n_rules; r++)
        g->rule_first[r] = -1;
    for (int32_t s = g->n_states - 1; s >= 0; s--)
        g->rule_first[g->st_rule[s]] = s;
    free(color);
    return 0;
}

uint64_t grammar_state_sig(const grammar *g, int32_t s)
{
    int32_t r = g->st_rule[s];
    if (!g->rule_sig[r] || g->rule_first[r] < 0)
        return 0;
    return h64(g->rule_sig[r], (uint64_t)(s - g->rule_first[r]) + 1);
}

/* ---- printing ------------------------------------------------------------ */

/* A code point inside a literal or class, escaped where needed. */
static void put_cp(tern_sbuf *b, uint32_t c, int in_class)
{
    char tmp[16];
    if (c == '\n')
        tern_sbuf_str(b, "\\n");
    else if (c == '\r')
        tern_sbuf_str(b, "\\r");
    else if (c == '\t')
        tern_sbuf_str(b, "\\t");
    else if (c == '\\')
        tern_sbuf_str(b, "\\\\");
    else if (!in_class && c == '"')
        tern_sbuf_str(b, "\\\"");
    else if (in_class && (c == ']' || c == '-' || c == '^' || c == '['))
        snprintf(tmp, sizeof tmp, "\\%c", (char)c), tern_sbuf_str(b, tmp);
    else if (c < 0x20 || c == 0x7F)
        snprintf(tmp, sizeof tmp, "\\x%02x", c), tern_sbuf_str(b, tmp);
    else if (c < 0x80)
        tmp[0] = (char)c, tern_sbuf_put(b, tmp, 1);
    else if (c < 0x10000)
        snprintf(tmp, sizeof tmp, "\\u%04x", c), tern_sbuf_str(b, tmp);
    else
        snprintf(tmp, sizeof tmp, "\\U%08x", c), tern_sbuf_str(b, tmp);
}

static void print_ast(tern_sbuf *b, const grammar *g, const gast *a, int paren)
{
    switch (a->kind) {
    case GAST_EMPTY:
        tern_sbuf_str(b, "\"\"");
        break;
    case GAST_BYTES: {
        tern_sbuf_str(b, "\"");
        for (int i = 0; i < a->n;) {
            uint8_t c = a->u.bytes[i];
            uint32_t cp = c;
            int n = 1;
            if (c >= 0xF0)
                cp = c & 7, n = 4;
            else if (c >= 0xE0)
                cp = c & 15, n = 3;
            else if (c >= 0xC0)
                cp = c & 31, n = 2;
            for (int k = 1; k < n && i + k < a->n; k++)
                cp = (cp << 6) | (a->u.bytes[i + k] & 0x3F);
            put_cp(b, cp, 0);
            i += n;
        }
        tern_sbuf_str(b, "\"");
        break;
    }
    case GAST_CLASS:
        tern_sbuf_str(b, "[");
        for (int i = 0; i < a->n; i++) {
            uint32_t lo = a->u.cls.ranges[2 * i], hi = a->u.cls.ranges[2 * i + 1];
            put_cp(b, lo, 1);
            if (hi != lo) {
                if (hi > lo + 1)
                    tern_sbuf_str(b, "-");
                put_cp(b, hi, 1);
            }
        }
        tern_sbuf_str(b, "]");
        break;
    case GAST_REF:
        tern_sbuf_str(b, g->rule_names[a->u.ref]);
        break;
    case GAST_SEQ:
    case GAST_ALT:
        if (paren)
            tern_sbuf_str(b, "(");
        for (int i = 0; i < a->n; i++) {
            if (i)
                tern_sbuf_str(b, a->kind == GAST_ALT ? " | " : " ");
            print_ast(b, g, a->u.kids[i], a->kind == GAST_SEQ || a->u.kids[i]->kind == GAST_ALT);
        }
        if (paren)
            tern_sbuf_str(b, ")");
        break;
    case GAST_REP: {
        print_ast(b, g, a->u.rep.kid, 1);
        int32_t lo = a->u.rep.min, hi = a->u.rep.max;
        char tmp[48];
        if (lo == 0 && hi < 0)
            tern_sbuf_str(b, "*");
        else if (lo == 1 && hi < 0)
            tern_sbuf_str(b, "+");
        else if (lo == 0 && hi == 1)
            tern_sbuf_str(b, "?");
        else if (hi < 0)
            snprintf(tmp, sizeof tmp, "{%d,}", lo), tern_sbuf_str(b, tmp);
        else if (hi == lo)
            snprintf(tmp, sizeof tmp, "{%d}", lo), tern_sbuf_str(b, tmp);
        else
            snprintf(tmp, sizeof tmp, "{%d,%d}", lo, hi), tern_sbuf_str(b, tmp);
        break;
    }
    }
}

char *grammar_to_ebnf(const grammar *g)
{
    tern_sbuf b = {0};
    /* root first, then the rest in definition order */
    for (int32_t k = -1; k < g->n_rules; k++) {
        int32_t r = k < 0 ? g->root : k;
        if (k >= 0 && r == g->root)
            continue;
        tern_sbuf_str(&b, g->rule_names[r]);
        tern_sbuf_str(&b, " ::= ");
        print_ast(&b, g, g->rule_bodies[r], 0);
        tern_sbuf_str(&b, "\n");
    }
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    if (!b.s)
        b.s = calloc(1, 1);
    return b.s;
}

/* ---- byte-level checking ---------------------------------------------- */

static int check(const grammar *g, const char *text, size_t len, int prefix)
{
    gstk_pool p;
    gstk_set a = {0}, b = {0};
    int rc;
    int urc = 0;
    guq *u = guq_new(g, &urc); /* uniqueItems: duplicates are refused at the byte completing them */
    if (urc)
        return urc;
    if (gstk_pool_init(&p)) {
        guq_free(u);
        return TERN_ENOMEM;
    }
    gstk_start(g, &p, &a);
    size_t i = 0;
    int uok = 1;
    for (; i < len && a.n && !a.oom; i++) {
        int opens = u && guq_opens(u, &p, &a, (uint8_t)text[i]);
        gstk_step(g, &p, &a, (uint8_t)text[i], &b);
        gstk_set t = a;
        a = b;
        b = t;
        if (u && (a.n || a.can_end) && (uok = guq_byte(u, (uint8_t)text[i], opens)) != 1) {
            i++;
            break;
        }
    }
    guq_free(u);
    if (a.oom || uok < 0)
        rc = TERN_ENOMEM;
    else if (!uok)
        rc = 0;
    else if (i < len)
        rc = 0;
    else if (prefix)
        rc = a.n > 0 || a.can_end;
    else
        rc = a.can_end;
    gstk_set_free(&a);
    gstk_set_free(&b);
    gstk_pool_free(&p);
    return rc;
}

int grammar_check_text(const grammar *g, const char *text, size_t len)
{
    if (!g || (!text && len))
        return TERN_EINVAL;
    return check(g, text, len, 0);
}

int grammar_check_prefix(const grammar *g, const char *text, size_t len)
{
    if (!g || (!text && len))
        return TERN_EINVAL;
    return check(g, text, len, 1);
}

/* Same rule, finality and edges, targets mapped through eq. */
static int equiv_same(const grammar *g, const int32_t *eq, int32_t a, int32_t b)
{
    if (g->st_rule[a] != g->st_rule[b] || g->st_final[a] != g->st_final[b] ||
        g->be_off[a + 1] - g->be_off[a] != g->be_off[b + 1] - g->be_off[b] ||
        g->re_off[a + 1] - g->re_off[a] != g->re_off[b + 1] - g->re_off[b])
        return 0;
    for (int32_t i = g->be_off[a], j = g->be_off[b]; i < g->be_off[a + 1]; i++, j++)
        if (g->be[i].lo != g->be[j].lo || g->be[i].hi != g->be[j].hi || eq[g->be[i].target] != eq[g->be[j].target])
            return 0;
    for (int32_t i = g->re_off[a], j = g->re_off[b]; i < g->re_off[a + 1]; i++, j++)
        if (g->re[i].rule != g->re[j].rule || eq[g->re[i].target] != eq[g->re[j].target])
            return 0;
    return 1;
}

static uint64_t equiv_hash(const grammar *g, const int32_t *eq, int32_t s)
{
    uint64_t h = (uint64_t)(uint32_t)g->st_rule[s] * 0x9E3779B97F4A7C15ull ^ g->st_final[s];
    for (int32_t i = g->be_off[s]; i < g->be_off[s + 1]; i++)
        h = (h ^ ((uint64_t)g->be[i].lo << 40 | (uint64_t)g->be[i].hi << 32 | (uint32_t)eq[g->be[i].target])) *
            0x100000001B3ull;
    for (int32_t i = g->re_off[s]; i < g->re_off[s + 1]; i++)
        h = (h ^ ((uint64_t)(uint32_t)g->re[i].rule << 32 | (uint32_t)eq[g->re[i].target])) * 0x100000001B3ull;
    return h ^ (h >> 31);
}

/* Rounds of merging states whose edges agree once their targets are
 * mapped: each round can merge the states that lead into states merged
 * by the last one (a few rounds reach the UTF-8 sequences' ends). */
int grammar_compute_equiv(grammar *g)
{
    int32_t n = g->n_states;
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap *= 2;
    int32_t *eq = malloc(((size_t)n + 1) * sizeof *eq), *nx = malloc(((size_t)n + 1) * sizeof *nx);
    int32_t *tab = malloc(cap * sizeof *tab);
    if (!eq || !nx || !tab) {
        free(eq);
        free(nx);
        free(tab);
        return TERN_ENOMEM;
    }
    for (int32_t s = 0; s < n; s++)
        eq[s] = s;
    for (int round = 0; round < 8; round++) {
        memset(tab, 0xFF, cap * sizeof *tab);
        int changed = 0;
        for (int32_t s = 0; s < n; s++) {
            size_t j = (size_t)equiv_hash(g, eq, s) & (cap - 1);
            nx[s] = s;
            for (; tab[j] >= 0; j = (j + 1) & (cap - 1))
                if (equiv_same(g, eq, tab[j], s)) {
                    nx[s] = tab[j];
                    break;
                }
            if (tab[j] < 0)
                tab[j] = s;
            changed |= nx[s] != eq[s];
        }
        memcpy(eq, nx, (size_t)n * sizeof *eq);
        if (!changed)
            break;
    }
    free(nx);
    free(tab);
    g->st_equiv = eq;
    return 0;
}
