/* Loop classes of a vocabulary (vocab_int.h): for a byte class that a
 * parser set reads back to itself (a string's contents, a free-text loop,
 * a digit run), the split of the token trie into the part read entirely
 * inside the class and the frontier nodes where a path first leaves it.
 * One pass over the trie per class, cached per vocabulary and shared by
 * every grammar: a walk from a looping set then takes the runs' tokens
 * wholesale and walks only the frontier subtrees (compiled.c). */
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
    c = class_build(v, asc, lead, &visited);
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

void gvoc_classes_free(grammar_vocab *v)
{
    for (int k = 0; k < v->n_classes; k++) {
        free(v->classes[k]->items);
        free(v->classes[k]->run_bits);
        free(v->classes[k]);
    }
    v->n_classes = 0;
}
