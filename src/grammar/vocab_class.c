/* Loop classes of a vocabulary (vocab_int.h): for a byte class that a
 * parser set reads back to itself (a string's contents, a free-text loop,
 * a digit run), the split of the token trie into the part read entirely
 * inside the class and the frontier nodes where a path first leaves it.
 * One pass over the trie per class, cached per vocabulary and shared by
 * every grammar: a walk from a looping set then takes the runs' tokens
 * wholesale and walks only the frontier subtrees (compiled.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/vocab_int.h"

/* Next UTF-8 state after byte b from state u inside class c, or -1 when
 * b leaves the class. */
static inline int class_next(const gvoc_class *c, int u, uint8_t b)
{
    if (u == 0 && b < 128)
        return (c->asc[b >> 6] >> (b & 63)) & 1 ? 0 : -1;
    if (u == 0 && (b < 0xC0 || !((c->lead >> (b - 0xC0)) & 1)))
        return -1;
    return gvoc_utf8_next(u, b);
}

static int items_push(gvoc_item **items, int32_t *n, int32_t *cap, gvoc_item it)
{
    if (*n == *cap) {
        int32_t nc = *cap ? *cap * 2 : 1024;
        gvoc_item *ni = realloc(*items, (size_t)nc * sizeof *ni);
        if (!ni)
            return -1;
        *items = ni;
        *cap = nc;
    }
    (*items)[(*n)++] = it;
    return 0;
}

static gvoc_class *class_build(const grammar_vocab *v, const uint64_t asc[2], uint64_t lead, long long *visited)
{
    gvoc_class *c = calloc(1, sizeof *c);
    int8_t *u = malloc((size_t)v->max_len + 2);
    int32_t *lastb = malloc(((size_t)v->max_len + 2) * sizeof *lastb);
    int32_t *chd = malloc(((size_t)v->max_len + 2) * sizeof *chd);
    uint8_t *pathb = malloc((size_t)v->max_len + 2);
    int32_t cap = 0;
    if (!c || !u || !lastb || !pathb || !chd)
        goto fail;
    c->asc[0] = asc[0];
    c->asc[1] = asc[1];
    c->lead = lead;
    c->run_bits = calloc(v->n_words ? v->n_words : 1, sizeof *c->run_bits);
    if (!c->run_bits)
        goto fail;
    u[0] = 0;
    lastb[0] = 0;
    chd[0] = 0; /* complete characters on the path's first d bytes */
    for (int32_t i = 0; i < v->n_nodes;) {
        int32_t d = v->nd[i];
        uint8_t b = v->nb[i];
        (*visited)++;
        pathb[d] = b;
        int nu = class_next(c, u[d - 1], b);
        if (nu < 0) {
            gvoc_item it = {.first = i, .last = i, .frontier = 1};
            int32_t from = lastb[d - 1];
            it.n_pend = (uint8_t)(d - 1 - from);
            it.from_root = from == 0;
            it.nch = (uint8_t)(chd[from] < GVOC_W_MAX ? chd[from] : GVOC_W_MAX);
            for (int k = 0; k < it.n_pend && k < 3; k++)
                it.pend[k] = pathb[from + 1 + k];
            if (items_push(&c->items, &c->n_items, &cap, it))
                goto fail;
            i = v->nend[i];
            continue;
        }
        u[d] = (int8_t)nu;
        chd[d] = chd[d - 1] + (nu == 0);
        lastb[d] = nu == 0 ? d : lastb[d - 1];
        /* a subtree read entirely inside the class joins the run whole */
        int32_t end = i + 1;
        if (nu == 0 && v->nend[i] > i + 1 && (v->nsk_flags[i] & GVOC_SK_DESC_VALID) &&
            !(v->nsk_asc[i][0] & ~asc[0]) && !(v->nsk_asc[i][1] & ~asc[1]) &&
            (lead == GVOC_LEAD_ALL || !(v->nsk_flags[i] & GVOC_SK_DESC_NONASCII)))
            end = v->nend[i];
        gvoc_item *last = c->n_items ? &c->items[c->n_items - 1] : NULL;
        if (last && !last->frontier && last->last == i - 1) {
            last->last = end - 1;
        } else {
            gvoc_item it = {.first = i, .last = end - 1};
            if (items_push(&c->items, &c->n_items, &cap, it))
                goto fail;
        }
        i = end;
    }
    for (int32_t k = 0; k < c->n_items; k++) {
        const gvoc_item *it = &c->items[k];
        if (it->frontier)
            continue;
        for (int32_t q = v->ntok_off[it->first]; q < v->ntok_off[it->last + 1]; q++)
            c->run_bits[v->ntok[q] / 32] |= 1u << (v->ntok[q] % 32);
    }
    free(u);
    free(lastb);
    free(pathb);
    free(chd);
    return c;
fail:
    if (c) {
        free(c->items);
        free(c->run_bits);
    }
    free(c);
    free(u);
    free(lastb);
    free(pathb);
    free(chd);
    return NULL;
}

/* The bytes of class x outside (asc, lead): ASCII b, or a lead byte b
 * (0xC2..0xF4) as bit b - 0xC0 of lead. */
static int removed_bytes(const gvoc_class *x, const uint64_t asc[2], uint64_t lead, uint8_t out[256])
{
    int n = 0;
    for (int b = 0; b < 128; b++)
        if ((x->asc[b >> 6] & ~asc[b >> 6]) >> (b & 63) & 1)
            out[n++] = (uint8_t)b;
    for (int b = 0xC2; b <= 0xF4; b++)
        if ((x->lead & ~lead) >> (b - 0xC0) & 1)
            out[n++] = (uint8_t)b;
    return n;
}

/* A min-heap of the first-occurrence lists' heads (preorder indices). */
typedef struct {
    int32_t node, pos, end;
} fhead;

static void heap_down(fhead *h, int n, int k)
{
    for (;;) {
        int l = 2 * k + 1, m = k;
        if (l < n && h[l].node < h[m].node)
            m = l;
        if (l + 1 < n && h[l + 1].node < h[m].node)
            m = l + 1;
        if (m == k)
            return;
        fhead t = h[k];
        h[k] = h[m];
        h[m] = t;
        k = m;
    }
}

/* Moves every list past the nodes before target (a galloping search
 * from its head: a cut subtree or a frontier's costs a few probes per
 * list, not one per node). */
static void heap_skip(const grammar_vocab *v, fhead *h, int *n, int32_t target, long long *visited)
{
    const int32_t *fn = v->first_nodes;
    while (*n && h[0].node < target) {
        int32_t lo = h[0].pos, step = 1; /* fn[lo] < target */
        while (lo + step < h[0].end && fn[lo + step] < target) {
            lo += step;
            step *= 2;
            (*visited)++;
        }
        int32_t hi = lo + step < h[0].end ? lo + step : h[0].end; /* fn[hi] >= target or hi == end */
        while (hi - lo > 1) {
            int32_t mid = lo + (hi - lo) / 2;
            if (fn[mid] < target)
                lo = mid;
            else
                hi = mid;
            (*visited)++;
        }
        (*visited)++;
        if (hi < h[0].end) {
            h[0].pos = hi;
            h[0].node = fn[hi];
        } else {
            h[0] = h[--*n];
        }
        heap_down(h, *n, 0);
    }
}

static void out_push(gvoc_item *out, int32_t *n, gvoc_item it)
{
    gvoc_item *last = *n ? &out[*n - 1] : NULL;
    if (!it.frontier && last && !last->frontier && last->last == it.first - 1) {
        last->last = it.last;
        return;
    }
    out[(*n)++] = it;
}

/* The class (asc, lead) as an edit of a cached class w that holds it:
 * removing bytes R from w only cuts w's runs at the nodes whose byte is
 * in R with no R byte above them (the vocabulary's first-occurrence
 * lists, merged in preorder): each such node in a run becomes a frontier
 * (its path before it stays in the class and ends at a character
 * boundary: an ASCII or lead byte after an unfinished character already
 * left w), its subtree leaves the run (with w's frontiers inside it);
 * everything else is w's split as it was. The same items as class_build,
 * in O(w's items + the list nodes) instead of a pass over the trie. */
static gvoc_class *class_edit(const grammar_vocab *v, const gvoc_class *w, const uint64_t asc[2], uint64_t lead,
                              long long *visited)
{
    uint8_t rb[256];
    int nr = removed_bytes(w, asc, lead, rb);
    fhead h[256];
    int nh = 0;
    int64_t nf = 0;
    for (int k = 0; k < nr; k++) {
        int32_t a = v->first_off[rb[k]], b = v->first_off[rb[k] + 1];
        if (a < b)
            h[nh++] = (fhead){.node = v->first_nodes[a], .pos = a, .end = b};
        nf += b - a;
    }
    for (int k = nh / 2 - 1; k >= 0; k--)
        heap_down(h, nh, k);
    gvoc_class *c = calloc(1, sizeof *c);
    size_t cap = (size_t)w->n_items + 2 * (size_t)nf + 1;
    if (!c || !(c->items = malloc(cap * sizeof *c->items)) ||
        !(c->run_bits = malloc((v->n_words ? v->n_words : 1) * sizeof *c->run_bits))) {
        if (c)
            free(c->items);
        free(c);
        return NULL;
    }
    c->asc[0] = asc[0];
    c->asc[1] = asc[1];
    c->lead = lead;
    memcpy(c->run_bits, w->run_bits, v->n_words * sizeof *c->run_bits);
    int32_t cut_end = 0, n = 0;
    for (int32_t k = 0; k < w->n_items; k++) {
        gvoc_item it = w->items[k];
        (*visited)++;
        if (it.frontier) {
            int32_t f = it.first;
            heap_skip(v, h, &nh, v->nend[f], visited);
            if (f >= cut_end)
                out_push(c->items, &n, it);
            continue;
        }
        int32_t a = it.first > cut_end ? it.first : cut_end, b = it.last, g;
        heap_skip(v, h, &nh, a, visited);
        while (a <= b && nh && (g = h[0].node) <= b) {
            if (a < g)
                out_push(c->items, &n, (gvoc_item){.first = a, .last = g - 1});
            uint8_t w8 = v->nw[g];
            gvoc_item fr = {.first = g, .last = g, .frontier = 1, .from_root = v->nd[g] == 1,
                            .nch = (uint8_t)(w8 == GVOC_W_NONE ? GVOC_W_MAX : w8 - 1)};
            out_push(c->items, &n, fr);
            for (int32_t q = v->ntok_off[g]; q < v->ntok_off[v->nend[g]]; q++)
                c->run_bits[v->ntok[q] / 32] &= ~(1u << (v->ntok[q] % 32));
            a = cut_end = v->nend[g];
            heap_skip(v, h, &nh, cut_end, visited);
        }
        if (a <= b)
            out_push(c->items, &n, (gvoc_item){.first = a, .last = b});
    }
    c->n_items = n;
    gvoc_item *shrunk = realloc(c->items, (size_t)(n ? n : 1) * sizeof *c->items);
    if (shrunk)
        c->items = shrunk;
    return c;
}

/* The cached class to edit (asc, lead) from, or NULL for a pass over
 * the trie. The edit's work: the base's items plus the first-occurrence
 * nodes of the removed bytes (the cached class holding (asc, lead) with
 * the least). The pass's: about the nodes below the root bytes in the
 * class that it must descend - narrow classes (digits, a few letters)
 * stop at the first level, wide ones (the JSON string class less a
 * letter: 40-90k nodes, 2-6 ms) go deep; on Llama 3 the pass costs
 * about a tenth of those subtrees' nodes (vs. the edit's work) where
 * the two cross. Both give the same split. */
static const gvoc_class *edit_base(const grammar_vocab *v, const uint64_t asc[2], uint64_t lead)
{
    const gvoc_class *best = NULL;
    long long cost = 0;
    for (int k = 0; k < v->n_classes; k++) {
        const gvoc_class *x = v->classes[k];
        if ((asc[0] & ~x->asc[0]) || (asc[1] & ~x->asc[1]) || (lead & ~x->lead))
            continue;
        uint8_t rb[256];
        int nr = removed_bytes(x, asc, lead, rb);
        long long w = x->n_items;
        for (int i = 0; i < nr; i++)
            w += v->first_off[rb[i] + 1] - v->first_off[rb[i]];
        if (!best || w < cost)
            best = x, cost = w;
    }
    if (!best)
        return NULL;
    long long deep = 0;
    for (int32_t i = 0; i < v->n_nodes; i = v->nend[i]) {
        uint8_t b = v->nb[i];
        if (b < 128 ? (asc[b >> 6] >> (b & 63)) & 1 : b >= 0xC2 && b <= 0xF4 && (lead >> (b - 0xC0)) & 1)
            deep += v->nend[i] - i;
    }
    return cost * GVOC_EDIT_RATIO < deep ? best : NULL;
}

gvoc_class *gvoc_class_compute(const grammar_vocab *v, const gvoc_class *base, const uint64_t asc[2], uint64_t lead)
{
    long long visited = 0;
    if (base && ((asc[0] & ~base->asc[0]) || (asc[1] & ~base->asc[1]) || (lead & ~base->lead)))
        return NULL;
    return base ? class_edit(v, base, asc, lead, &visited) : class_build(v, asc, lead, &visited);
}

void gvoc_class_free(gvoc_class *c)
{
    if (!c)
        return;
    free(c->items);
    free(c->run_bits);
    free(c);
}

const gvoc_class *gvoc_class_get(grammar_vocab *v, const uint64_t asc[2], uint64_t lead, grammar_compiled_stats *st)
{
    gvoc_class *c = NULL;
    pthread_mutex_lock(&v->class_lock);
    for (int k = 0; k < v->n_classes; k++) {
        gvoc_class *x = v->classes[k];
        if (x->asc[0] == asc[0] && x->asc[1] == asc[1] && x->lead == lead) {
            c = x;
            goto out;
        }
    }
    if (v->n_classes == GVOC_MAX_CLASSES || v->class_bytes >= GVOC_MAX_CLASS_BYTES)
        goto out;
    long long visited = 0;
    const gvoc_class *w = edit_base(v, asc, lead);
    c = w ? class_edit(v, w, asc, lead, &visited) : class_build(v, asc, lead, &visited);
    if (st) {
        st->class_builds++;
        st->class_nodes += visited;
    }
    if (c) {
        v->classes[v->n_classes++] = c;
        v->class_bytes += sizeof *c + (size_t)c->n_items * sizeof *c->items + v->n_words * 4;
    }
out:
    pthread_mutex_unlock(&v->class_lock);
    return c;
}

const gvoc_class *gvoc_class_find(grammar_vocab *v, const uint64_t asc[2], uint64_t lead)
{
    const gvoc_class *c = NULL;
    pthread_mutex_lock(&v->class_lock);
    for (int k = 0; k < v->n_classes && !c; k++) {
        const gvoc_class *x = v->classes[k];
        if (x->asc[0] == asc[0] && x->asc[1] == asc[1] && x->lead == lead)
            c = x;
    }
    pthread_mutex_unlock(&v->class_lock);
    return c;
}

int gvoc_class_path_in(const grammar_vocab *v, const gvoc_class *c, int32_t i)
{
    /* the path's bytes are a prefix of any token below i */
    int32_t k = v->ntok_off[i];
    if (k >= v->ntok_off[v->nend[i]])
        return 0;
    const uint8_t *t = (const uint8_t *)v->blob + v->tok_off[v->ntok[k]];
    int u = 0;
    for (int32_t j = 0; j < v->nd[i]; j++)
        if ((u = class_next(c, u, t[j])) < 0)
            return 0;
    return 1;
}

int gvoc_classes_init(grammar_vocab *v)
{
    int32_t n = v->n_nodes;
    uint8_t *first = malloc((size_t)(n ? n : 1));
    uint8_t *pathb = malloc((size_t)v->max_len + 2);
    v->first_off = calloc(257, sizeof *v->first_off);
    v->first_nodes = NULL;
    if (!first || !pathb || !v->first_off) {
        free(first);
        free(pathb);
        return TERN_ENOMEM;
    }
    /* first[i]: no node above i reads i's byte (seen: the path's counts) */
    int32_t seen[256] = {0}, top = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t d = v->nd[i];
        while (top >= d)
            seen[pathb[top--]]--;
        uint8_t b = v->nb[i];
        first[i] = !seen[b];
        v->first_off[b + 1] += first[i];
        pathb[++top] = b;
        seen[b]++;
    }
    for (int b = 0; b < 256; b++)
        v->first_off[b + 1] += v->first_off[b];
    v->first_nodes = malloc((size_t)(v->first_off[256] ? v->first_off[256] : 1) * sizeof *v->first_nodes);
    if (!v->first_nodes) {
        free(first);
        free(pathb);
        return TERN_ENOMEM;
    }
    int32_t at[256];
    memcpy(at, v->first_off, sizeof at);
    for (int32_t i = 0; i < n; i++)
        if (first[i])
            v->first_nodes[at[v->nb[i]]++] = i;
    free(first);
    free(pathb);
    /* the JSON string class (every JSON grammar's string contents), the
     * base its narrowings are edited from */
    const uint64_t json_str[2] = {~0ull << 32 & ~(1ull << '"'), ~0ull & ~(1ull << ('\\' - 64))};
    if (!gvoc_class_get(v, json_str, GVOC_LEAD_ALL, NULL))
        return TERN_ENOMEM;
    return 0;
}

void gvoc_classes_free(grammar_vocab *v)
{
    free(v->first_off);
    free(v->first_nodes);
    v->first_off = v->first_nodes = NULL;
    for (int k = 0; k < v->n_classes; k++)
        gvoc_class_free(v->classes[k]);
    v->n_classes = 0;
}
