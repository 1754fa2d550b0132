/* Vocabulary for masks: every token's bytes, special and stop flags, and a
 * byte trie of the non-special tokens in preorder (sorted vocabulary), so
 * tokens sharing a prefix are checked once and a rejected prefix skips its
 * whole subtree. Built once per tokenizer; read-only afterwards. */
#include <stdlib.h>
#include <string.h>

#include "grammar/compiled_int.h"
#include "grammar/unique_int.h"
#include "grammar/vocab_int.h"

static int cmp_tok(const void *x, const void *y, void *ctx)
{
    const grammar_vocab *v = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    uint32_t la = v->tok_len[a], lb = v->tok_len[b];
    int c = memcmp(v->blob + v->tok_off[a], v->blob + v->tok_off[b], la < lb ? la : lb);
    if (c)
        return c;
    if (la != lb)
        return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* The per-node subtree summaries (GVOC_SK_*, vocab_int.h), bottom-up over
 * the preorder: a node's children are i+1, nend[i+1], ... */
static int build_skip(grammar_vocab *v)
{
    int32_t n = v->n_nodes;
    v->nsk_asc = calloc((size_t)(n ? n : 1), sizeof *v->nsk_asc);
    v->nsk_flags = calloc((size_t)(n ? n : 1), 1);
    int8_t *u = malloc((size_t)(n ? n : 1));
    int8_t *ustack = malloc((size_t)v->max_len + 2);
    if (!v->nsk_asc || !v->nsk_flags || !u || !ustack) {
        free(u);
        free(ustack);
        return -1;
    }
    /* u[i]: UTF-8 state after the path to i (-1 invalid) */
    ustack[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int d = v->nd[i];
        int p = ustack[d - 1];
        u[i] = (int8_t)(p < 0 ? -1 : gvoc_utf8_next(p, v->nb[i]));
        ustack[d] = u[i];
        if (u[i] == 0)
            v->nsk_flags[i] |= GVOC_SK_BOUNDARY;
    }
    /* reverse preorder: children are done before their parent */
    for (int32_t i = n - 1; i >= 0; i--) {
        uint64_t a0 = 0, a1 = 0;
        uint8_t valid = GVOC_SK_DESC_VALID, nonascii = 0;
        for (int32_t c = i + 1; c < v->nend[i]; c = v->nend[c]) {
            uint8_t b = v->nb[c];
            if (b < 64)
                a0 |= 1ull << b;
            else if (b < 128)
                a1 |= 1ull << (b - 64);
            else
                nonascii = GVOC_SK_DESC_NONASCII;
            a0 |= v->nsk_asc[c][0];
            a1 |= v->nsk_asc[c][1];
            nonascii |= v->nsk_flags[c] & GVOC_SK_DESC_NONASCII;
            if (u[c] < 0 || !(v->nsk_flags[c] & GVOC_SK_DESC_VALID))
                valid = 0;
        }
        v->nsk_asc[i][0] = a0;
        v->nsk_asc[i][1] = a1;
        v->nsk_flags[i] |= (uint8_t)(valid | nonascii);
    }
    free(u);
    free(ustack);
    return 0;
}

/* The character weights and per-position byte sets (vocab_int.h). */
static int build_weights(grammar_vocab *v)
{
    int32_t n = v->n_nodes;
    v->nw = malloc((size_t)(n ? n : 1));
    v->nw_tok = malloc((size_t)(v->n_trie_tokens ? v->n_trie_tokens : 1));
    v->nw_max = malloc((size_t)(n ? n : 1));
    v->pos_asc = calloc(GVOC_W_MAX + 2, sizeof *v->pos_asc);
    v->pos_lead = calloc(GVOC_W_MAX + 2, sizeof *v->pos_lead);
    int8_t *us = malloc((size_t)v->max_len + 2);
    int32_t *cs = malloc(((size_t)v->max_len + 2) * sizeof *cs);
    if (!v->nw || !v->nw_tok || !v->nw_max || !v->pos_asc || !v->pos_lead || !us || !cs) {
        free(us);
        free(cs);
        return -1;
    }
    /* us[d] / cs[d]: UTF-8 state (-1 invalid) and complete characters
     * after the path's first d bytes */
    us[0] = 0;
    cs[0] = 0;
    int32_t wmax = 0;
    for (int32_t i = 0; i < n; i++) {
        int d = v->nd[i];
        int p = us[d - 1];
        uint8_t b = v->nb[i];
        int u = p < 0 ? -1 : gvoc_utf8_next(p, b);
        us[d] = (int8_t)u;
        cs[d] = cs[d - 1] + (u == 0);
        int32_t w = u < 0 ? -1 : cs[d] + (u != 0);
        if (w > GVOC_W_MAX)
            wmax = -1;
        if (w < 0 || w > GVOC_W_MAX) {
            v->nw[i] = GVOC_W_NONE;
            continue;
        }
        v->nw[i] = (uint8_t)w;
        if (wmax >= 0 && w > wmax)
            wmax = w;
        if (p == 0 && b < 128)
            v->pos_asc[cs[d - 1]][b >> 6] |= 1ull << (b & 63);
        else if (p == 0)
            v->pos_lead[cs[d - 1]] |= 1ull << (b - 0xC0);
    }
    for (int32_t k = GVOC_W_MAX; k >= 0; k--) {
        v->pos_asc[k][0] |= v->pos_asc[k + 1][0];
        v->pos_asc[k][1] |= v->pos_asc[k + 1][1];
        v->pos_lead[k] |= v->pos_lead[k + 1];
    }
    for (int32_t i = 0; i < n; i++)
        for (int32_t q = v->ntok_off[i]; q < v->ntok_off[i + 1]; q++)
            v->nw_tok[q] = v->nw[i];
    /* children before parents: node i's children are i + 1, nend[i + 1], ... */
    for (int32_t i = n - 1; i >= 0; i--) {
        uint8_t m = v->nw[i] == GVOC_W_NONE ? 0 : v->nw[i];
        for (int32_t c = i + 1; c < v->nend[i]; c = v->nend[c])
            if (v->nw_max[c] > m)
                m = v->nw_max[c];
        v->nw_max[i] = m;
    }
    v->w_max = wmax;
    free(us);
    free(cs);
    return 0;
}

static int build_trie(grammar_vocab *v, tern_err *err)
{
    int32_t n = 0;
    size_t total = 0;
    int32_t *ids = malloc((size_t)(v->n_tokens ? v->n_tokens : 1) * sizeof *ids);
    if (!ids)
        return tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
    for (int32_t i = 0; i < v->n_tokens; i++) {
        if (!v->special[i] && v->tok_len[i] > 0) {
            ids[n++] = i;
            total += v->tok_len[i];
        }
    }
    if (n)
        qsort_r(ids, (size_t)n, sizeof *ids, cmp_tok, v);
    /* at most one node per token byte */
    size_t cap = total + 1;
    v->nb = malloc(cap);
    v->nd = malloc(cap * sizeof *v->nd);
    v->nend = malloc(cap * sizeof *v->nend);
    v->ntok_off = calloc(cap + 1, sizeof *v->ntok_off);
    v->ntok = malloc((size_t)(n ? n : 1) * sizeof *v->ntok);
    int32_t *path = malloc((size_t)(v->max_len + 2) * sizeof *path);
    if (!v->nb || !v->nd || !v->nend || !v->ntok_off || !v->ntok || !path) {
        free(ids);
        free(path);
        return tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
    }
    int32_t nn = 0, prev = -1, open_depth = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t id = ids[k];
        const uint8_t *t = (const uint8_t *)v->blob + v->tok_off[id];
        uint32_t len = v->tok_len[id];
        uint32_t lcp = 0;
        if (prev >= 0) {
            const uint8_t *pt = (const uint8_t *)v->blob + v->tok_off[prev];
            uint32_t pl = v->tok_len[prev];
            while (lcp < len && lcp < pl && pt[lcp] == t[lcp])
                lcp++;
        }
        /* close nodes deeper than the shared prefix */
        for (int32_t d = open_depth; d > (int32_t)lcp; d--)
            v->nend[path[d]] = nn;
        for (uint32_t d = lcp + 1; d <= len; d++) {
            v->nb[nn] = t[d - 1];
            v->nd[nn] = (int32_t)d;
            path[d] = nn++;
        }
        open_depth = (int32_t)len;
        v->ntok_off[path[len] + 1]++;
        v->ntok[k] = id;
        prev = id;
    }
    for (int32_t d = open_depth; d >= 1; d--)
        v->nend[path[d]] = nn;
    for (int32_t i = 0; i < nn; i++)
        v->ntok_off[i + 1] += v->ntok_off[i];
    v->n_nodes = nn;
    v->n_trie_tokens = n;
    free(ids);
    free(path);
    if (build_skip(v) || build_weights(v))
        return tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
    return 0;
}

grammar_vocab *grammar_vocab_from_bytes(const char *const *bytes, const size_t *lens, const uint8_t *is_special,
                                        int32_t n_tokens, int32_t mask_width, const int32_t *stop_ids,
                                        size_t n_stop, tern_err *err)
{
    if (n_tokens < 0 || (n_tokens && (!bytes || !lens)) || (n_stop && !stop_ids)) {
        tern_err_set(err, TERN_EINVAL, "vocab: bad arguments");
        return NULL;
    }
    if (mask_width == 0)
        mask_width = n_tokens;
    if (mask_width < n_tokens) {
        tern_err_set(err, TERN_EINVAL, "vocab: mask width %d is below the vocab size %d", mask_width, n_tokens);
        return NULL;
    }
    grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) {
        tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
        return NULL;
    }
    pthread_mutex_init(&v->share_lock, NULL);
    pthread_mutex_init(&v->class_lock, NULL);
    v->n_tokens = n_tokens;
    v->mask_width = mask_width;
    v->n_words = ((size_t)mask_width + 31) / 32;
    size_t total = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        if (lens[i] > GRAMMAR_VOCAB_MAX_TOKEN_LEN || (lens[i] && !bytes[i])) {
            tern_err_set(err, TERN_EINVAL, "vocab: token %d is too long or missing", i);
            goto fail;
        }
        total += lens[i];
    }
    v->blob = malloc(total ? total : 1);
    v->tok_off = malloc((size_t)(n_tokens ? n_tokens : 1) * sizeof *v->tok_off);
    v->tok_len = malloc((size_t)(n_tokens ? n_tokens : 1) * sizeof *v->tok_len);
    v->special = calloc((size_t)(n_tokens ? n_tokens : 1), 1);
    v->stop_mask = calloc(v->n_words ? v->n_words : 1, sizeof *v->stop_mask);
    v->stop = malloc((n_stop ? n_stop : 1) * sizeof *v->stop);
    if (!v->blob || !v->tok_off || !v->tok_len || !v->special || !v->stop_mask || !v->stop) {
        tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
        goto fail;
    }
    size_t off = 0;
    for (int32_t i = 0; i < n_tokens; i++) {
        v->tok_off[i] = (uint32_t)off;
        v->tok_len[i] = (uint32_t)lens[i];
        if (lens[i])
            memcpy(v->blob + off, bytes[i], lens[i]);
        off += lens[i];
        if (lens[i] > v->max_len)
            v->max_len = (uint32_t)lens[i];
        v->special[i] = is_special ? (is_special[i] != 0) : 0;
    }
    for (size_t i = 0; i < n_stop; i++) {
        int32_t s = stop_ids[i];
        if (s < 0 || s >= mask_width) {
            tern_err_set(err, TERN_EINVAL, "vocab: stop id %d out of range", s);
            goto fail;
        }
        if (v->stop_mask[s / 32] & (1u << (s % 32)))
            continue;
        v->stop_mask[s / 32] |= 1u << (s % 32);
        v->stop[v->n_stop++] = s;
    }
    /* a stop token never matches grammar text */
    for (int32_t i = 0; i < v->n_stop; i++)
        if (v->stop[i] < n_tokens)
            v->special[v->stop[i]] = 1;
    if (build_trie(v, err))
        goto fail;
    if (guq_vocab_build(v) || gvoc_classes_init(v)) {
        tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
        goto fail;
    }
    return v;
fail:
    grammar_vocab_free(v);
    return NULL;
}

void grammar_vocab_free(grammar_vocab *v)
{
    if (!v)
        return;
    free(v->blob);
    free(v->tok_off);
    free(v->tok_len);
    free(v->special);
    free(v->stop);
    free(v->stop_mask);
    free(v->nb);
    free(v->nd);
    free(v->nend);
    free(v->ntok_off);
    free(v->ntok);
    free(v->nsk_asc);
    free(v->nsk_flags);
    free(v->nw);
    free(v->nw_max);
    free(v->nw_tok);
    free(v->pos_asc);
    free(v->pos_lead);
    guq_vocab_free(v);
    for (size_t i = 0; i < v->share_cap; i++)
        if (v->share[i].e)
            gctx_entry_free(v->share[i].e);
    free(v->share);
    pthread_mutex_destroy(&v->share_lock);
    gvoc_classes_free(v);
    pthread_mutex_destroy(&v->class_lock);
    free(v);
}

int32_t grammar_vocab_mask_width(const grammar_vocab *v) { return v->mask_width; }
size_t grammar_vocab_mask_words(const grammar_vocab *v) { return v->n_words; }

const char *grammar_vocab_token(const grammar_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || id >= v->n_tokens || v->special[id]) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = v->tok_len[id];
    return v->blob + v->tok_off[id];
}

int grammar_vocab_is_stop(const grammar_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->mask_width)
        return 0;
    return (v->stop_mask[id / 32] >> (id % 32)) & 1;
}
