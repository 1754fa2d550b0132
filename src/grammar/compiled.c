/* Compiled grammar = grammar x vocabulary, and the lazily filled per-state
 * token sets (gstate_entry, see compiled_int.h). An entry is computed by
 * one walk of the vocabulary trie from the stack [s | unknown], where
 * byte steps go through a memo of interned stack sets (a DFA built on the
 * fly), so a trie node usually costs one table lookup. */
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled_int.h"

/* Precompute bounds: interned sets (each holds a 1 KiB transition row). */
#define GCOMP_MAX_SETS 200000

static uint32_t set_hash(const int32_t *ids, int32_t n)
{
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)ids[i]) * 16777619u;
    return h ^ (h >> 13);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static int sets_grow(grammar_compiled *cg)
{
    int32_t cap = cg->cap_sets ? cg->cap_sets * 2 : 256;
    int32_t *off = realloc(cg->set_off, ((size_t)cap + 1) * sizeof *off);
    if (!off)
        return -1;
    cg->set_off = off;
    int32_t *nx = realloc(cg->set_next, (size_t)cap * sizeof *nx);
    if (!nx)
        return -1;
    cg->set_next = nx;
    int32_t *tr = realloc(cg->trans, (size_t)cap * 256 * sizeof *tr);
    if (!tr)
        return -1;
    cg->trans = tr;
    int32_t *h = malloc((size_t)cap * 2 * sizeof *h);
    if (!h)
        return -1;
    free(cg->set_heads);
    cg->set_heads = h;
    cg->set_hmask = (uint32_t)cap * 2 - 1;
    memset(h, 0xFF, (size_t)cap * 2 * sizeof *h);
    for (int32_t i = 0; i < cg->n_sets; i++) {
        uint32_t b = set_hash(cg->set_ids + cg->set_off[i], cg->set_off[i + 1] - cg->set_off[i]) & cg->set_hmask;
        cg->set_next[i] = h[b];
        h[b] = i;
    }
    cg->cap_sets = cap;
    return 0;
}

/* Interns the sorted node list ids[0..n); returns the set id or -1. */
static int32_t set_intern(grammar_compiled *cg, const int32_t *ids, int32_t n)
{
    uint32_t hv = set_hash(ids, n);
    if (cg->cap_sets) {
        for (int32_t i = cg->set_heads[hv & cg->set_hmask]; i >= 0; i = cg->set_next[i]) {
            int32_t m = cg->set_off[i + 1] - cg->set_off[i];
            if (m == n && (!n || !memcmp(cg->set_ids + cg->set_off[i], ids, (size_t)n * sizeof *ids)))
                return i;
        }
    }
    if (cg->n_sets >= GCOMP_MAX_SETS)
        return -1;
    if (cg->n_sets == cg->cap_sets && sets_grow(cg))
        return -1;
    if (cg->n_set_ids + (size_t)n > cg->cap_set_ids) {
        size_t cap = cg->cap_set_ids ? cg->cap_set_ids * 2 : 1024;
        while (cap < cg->n_set_ids + (size_t)n)
            cap *= 2;
        int32_t *si = realloc(cg->set_ids, cap * sizeof *si);
        if (!si)
            return -1;
        cg->set_ids = si;
        cg->cap_set_ids = cap;
    }
    int32_t id = cg->n_sets++;
    cg->set_off[id] = (int32_t)cg->n_set_ids;
    if (n)
        memcpy(cg->set_ids + cg->n_set_ids, ids, (size_t)n * sizeof *ids);
    cg->n_set_ids += (size_t)n;
    cg->set_off[id + 1] = (int32_t)cg->n_set_ids;
    memset(cg->trans + (size_t)id * 256, 0xFF, 256 * sizeof *cg->trans);
    uint32_t b = hv & cg->set_hmask;
    cg->set_next[id] = cg->set_heads[b];
    cg->set_heads[b] = id;
    return id;
}

/* set x byte -> next*2 + popped, or -1 on OOM */
static int32_t set_trans(grammar_compiled *cg, int32_t sid, uint8_t byte)
{
    int32_t t = cg->trans[(size_t)sid * 256 + byte];
    if (t >= 0)
        return t;
    gstk_set *in = &cg->tmp_in, *out = &cg->tmp_out;
    int32_t n = cg->set_off[sid + 1] - cg->set_off[sid];
    if (in->cap < n) {
        int32_t *ids = realloc(in->ids, (size_t)n * sizeof *ids);
        if (!ids)
            return -1;
        in->ids = ids;
        in->cap = n;
    }
    if (n)
        memcpy(in->ids, cg->set_ids + cg->set_off[sid], (size_t)n * sizeof *in->ids);
    in->n = n;
    gstk_step(cg->g, &cg->pool, in, byte, out);
    if (out->oom)
        return -1;
    if (out->n > 1)
        qsort(out->ids, (size_t)out->n, sizeof *out->ids, cmp_i32);
    int32_t nid = set_intern(cg, out->ids, out->n);
    if (nid < 0)
        return -1;
    t = nid * 2 + (out->hit_unknown ? 1 : 0);
    cg->trans[(size_t)sid * 256 + byte] = t;
    return t;
}

grammar_compiled *grammar_compile(grammar *g, const grammar_vocab *vocab, tern_err *err)
{
    if (!g || !vocab) {
        grammar_free(g);
        tern_err_set(err, TERN_EINVAL, "grammar_compile: no grammar or vocabulary");
        return NULL;
    }
    grammar_compiled *cg = calloc(1, sizeof *cg);
    if (!cg) {
        grammar_free(g);
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    cg->g = g;
    cg->v = vocab;
    pthread_mutex_init(&cg->lock, NULL);
    cg->entries = calloc((size_t)(g->n_states ? g->n_states : 1), sizeof *cg->entries);
    if (!cg->entries || gstk_pool_init(&cg->pool)) {
        grammar_compiled_free(cg);
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    /* set 0 is the empty set */
    if (set_intern(cg, NULL, 0) != 0) {
        grammar_compiled_free(cg);
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    return cg;
}

grammar_compiled *grammar_compile_ebnf(const char *text, size_t len, const grammar_vocab *vocab,
                                       const grammar_limits *limits, tern_err *err)
{
    grammar *g = grammar_from_ebnf(text, len, NULL, limits, err);
    if (!g)
        return NULL;
    return grammar_compile(g, vocab, err);
}

static void entry_free(gstate_entry *e)
{
    if (!e)
        return;
    free(e->accepted);
    free(e->sb);
    free(e->sd);
    free(e->send);
    free(e->stok_off);
    free(e->stok);
    free(e);
}

void grammar_compiled_free(grammar_compiled *cg)
{
    if (!cg)
        return;
    if (cg->entries && cg->g)
        for (int32_t s = 0; s < cg->g->n_states; s++)
            entry_free(cg->entries[s]);
    free(cg->entries);
    gstk_pool_free(&cg->pool);
    free(cg->set_off);
    free(cg->set_ids);
    free(cg->set_heads);
    free(cg->set_next);
    free(cg->trans);
    gstk_set_free(&cg->tmp_in);
    gstk_set_free(&cg->tmp_out);
    pthread_mutex_destroy(&cg->lock);
    grammar_free(cg->g);
    free(cg);
}

const grammar *grammar_compiled_grammar(const grammar_compiled *cg) { return cg->g; }
const grammar_vocab *grammar_compiled_vocab(const grammar_compiled *cg) { return cg->v; }

/* ---- entry computation ---------------------------------------------------- */

typedef struct unc_pair {
    int32_t tok;
    int32_t k;  /* bytes consumed inside the rule; the suffix is tok[k..] */
} unc_pair;

typedef struct unc_list {
    unc_pair *p;
    size_t n, cap;
    int oom;
} unc_list;

static void unc_add(unc_list *u, int32_t tok, int32_t k)
{
    if (u->n == u->cap) {
        size_t cap = u->cap ? u->cap * 2 : 256;
        unc_pair *np = realloc(u->p, cap * sizeof *np);
        if (!np) {
            u->oom = 1;
            return;
        }
        u->p = np;
        u->cap = cap;
    }
    u->p[u->n++] = (unc_pair){tok, k};
}

static const grammar_vocab *sort_v;

static int cmp_suffix(const void *x, const void *y)
{
    const unc_pair *a = x, *b = y;
    const grammar_vocab *v = sort_v;
    uint32_t la = v->tok_len[a->tok] - (uint32_t)a->k, lb = v->tok_len[b->tok] - (uint32_t)b->k;
    int c = memcmp(v->blob + v->tok_off[a->tok] + a->k, v->blob + v->tok_off[b->tok] + b->k, la < lb ? la : lb);
    if (c)
        return c;
    if (la != lb)
        return la < lb ? -1 : 1;
    return a->tok < b->tok ? -1 : a->tok > b->tok;
}

/* Suffix trie of the uncertain pairs (same layout as the vocab trie). */
static int build_suffix_trie(gstate_entry *e, const grammar_vocab *v, unc_list *u)
{
    static pthread_mutex_t sort_lock = PTHREAD_MUTEX_INITIALIZER;
    size_t total = 0;
    uint32_t maxl = 0;
    for (size_t i = 0; i < u->n; i++) {
        uint32_t l = v->tok_len[u->p[i].tok] - (uint32_t)u->p[i].k;
        total += l;
        if (l > maxl)
            maxl = l;
    }
    pthread_mutex_lock(&sort_lock);
    sort_v = v;
    qsort(u->p, u->n, sizeof *u->p, cmp_suffix);
    pthread_mutex_unlock(&sort_lock);
    e->sb = malloc(total + 1);
    e->sd = malloc((total + 1) * sizeof *e->sd);
    e->send = malloc((total + 1) * sizeof *e->send);
    e->stok_off = calloc(total + 2, sizeof *e->stok_off);
    e->stok = malloc((u->n + 1) * sizeof *e->stok);
    int32_t *path = malloc(((size_t)maxl + 2) * sizeof *path);
    if (!e->sb || !e->sd || !e->send || !e->stok_off || !e->stok || !path) {
        free(path);
        return -1;
    }
    int32_t nn = 0, open = 0;
    const uint8_t *prev = NULL;
    uint32_t prevl = 0;
    for (size_t i = 0; i < u->n; i++) {
        const uint8_t *t = (const uint8_t *)v->blob + v->tok_off[u->p[i].tok] + u->p[i].k;
        uint32_t len = v->tok_len[u->p[i].tok] - (uint32_t)u->p[i].k, lcp = 0;
        while (prev && lcp < len && lcp < prevl && prev[lcp] == t[lcp])
            lcp++;
        for (int32_t d = open; d > (int32_t)lcp; d--)
            e->send[path[d]] = nn;
        for (uint32_t d = lcp + 1; d <= len; d++) {
            e->sb[nn] = t[d - 1];
            e->sd[nn] = (int32_t)d;
            path[d] = nn++;
        }
        open = (int32_t)len;
        e->stok_off[path[len] + 1]++;
        e->stok[i] = u->p[i].tok;
        prev = t;
        prevl = len;
    }
    for (int32_t d = open; d >= 1; d--)
        e->send[path[d]] = nn;
    for (int32_t i = 0; i < nn; i++)
        e->stok_off[i + 1] += e->stok_off[i];
    e->n_snodes = nn;
    e->n_unc = (int32_t)u->n;
    free(path);
    return 0;
}

static gstate_entry *compute_entry(grammar_compiled *cg, int32_t s)
{
    const grammar_vocab *v = cg->v;
    gstate_entry *e = calloc(1, sizeof *e);
    int32_t maxd = (int32_t)v->max_len + 1;
    int32_t *S = malloc((size_t)(maxd + 1) * sizeof *S);
    uint8_t *pop = calloc((size_t)maxd + 1, 1), *anypop = calloc((size_t)maxd + 1, 1);
    unc_list u = {0};
    int bad = 0;
    if (!e || !S || !pop || !anypop)
        goto fail;
    e->accepted = calloc(v->n_words ? v->n_words : 1, sizeof *e->accepted);
    if (!e->accepted)
        goto fail;
    int32_t x = gstk_intern(&cg->pool, s, GSTK_UNKNOWN);
    if (x < 0)
        goto fail;
    S[0] = set_intern(cg, &x, 1);
    if (S[0] < 0)
        goto fail;
    for (int32_t i = 0; i < v->n_nodes && !bad;) {
        int32_t d = v->nd[i];
        int32_t t = set_trans(cg, S[d - 1], v->nb[i]);
        if (t < 0) {
            bad = 1;
            break;
        }
        int32_t cur = t >> 1;
        S[d] = cur;
        pop[d] = (uint8_t)(t & 1);
        anypop[d] = (uint8_t)(anypop[d - 1] | pop[d]);
        for (int32_t k = v->ntok_off[i]; k < v->ntok_off[i + 1]; k++) {
            int32_t tok = v->ntok[k];
            if (cur || pop[d]) {
                e->accepted[tok / 32] |= 1u << (tok % 32);
                e->n_accepted++;
            } else if (anypop[d - 1]) {
                for (int32_t j = 1; j < d; j++)
                    if (pop[j])
                        unc_add(&u, tok, j);
            }
        }
        if (!cur) {
            if (anypop[d]) {
                for (int32_t j = i + 1; j < v->nend[i]; j++)
                    for (int32_t k = v->ntok_off[j]; k < v->ntok_off[j + 1]; k++)
                        for (int32_t q = 1; q <= d; q++)
                            if (pop[q])
                                unc_add(&u, v->ntok[k], q);
            }
            i = v->nend[i];
        } else {
            i++;
        }
    }
    if (bad || u.oom)
        goto fail;
    if (!e->n_accepted) {
        free(e->accepted);
        e->accepted = NULL;
    }
    if (u.n && build_suffix_trie(e, v, &u))
        goto fail;
    free(u.p);
    free(S);
    free(pop);
    free(anypop);
    return e;
fail:
    free(u.p);
    free(S);
    free(pop);
    free(anypop);
    entry_free(e);
    return NULL;
}

const gstate_entry *gcompiled_entry(grammar_compiled *cg, int32_t s)
{
    gstate_entry *e = __atomic_load_n(&cg->entries[s], __ATOMIC_ACQUIRE);
    if (e)
        return e;
    pthread_mutex_lock(&cg->lock);
    e = cg->entries[s];
    if (!e) {
        e = compute_entry(cg, s);
        if (e)
            __atomic_store_n(&cg->entries[s], e, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cg->lock);
    return e;
}
