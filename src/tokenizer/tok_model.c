/* Models: one pre-token string -> ids. BPE (byte-level and SentencePiece
 * style with byte_fallback) merges with a binary heap over a linked list of
 * symbols, lowest rank first and leftmost on ties, revalidating stale heap
 * entries as HF's Word::merge_all does; WordPiece is greedy longest match. */
#include <stdlib.h>
#include <string.h>

#include "tok_int.h"

int tok_ids_push(tok_ids *x, int32_t id)
{
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        int32_t *v = realloc(x->v, cap * sizeof *v);
        if (!v)
            return TERN_ENOMEM;
        x->v = v;
        x->cap = cap;
    }
    x->v[x->n++] = id;
    return 0;
}

typedef struct sym {
    int32_t id;
    int32_t prev, next;
    uint32_t len; /* bytes covered; 0 once merged away */
} sym;

typedef struct hnode {
    uint32_t rank;
    uint32_t pos;
    int32_t id;
} hnode;

static inline int hless(hnode a, hnode b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(hnode *h, size_t *n, hnode x)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(x, h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static hnode heap_pop(hnode *h, size_t *n)
{
    hnode top = h[0], x = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && hless(h[c + 1], h[c]))
            c++;
        if (!hless(h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = x;
    return top;
}

typedef struct symv {
    sym *v;
    size_t n, cap;
} symv;

static int sym_add(symv *w, int32_t id, uint32_t len)
{
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        sym *v = realloc(w->v, cap * sizeof *v);
        if (!v)
            return TERN_ENOMEM;
        w->v = v;
        w->cap = cap;
    }
    int32_t i = (int32_t)w->n;
    w->v[w->n++] = (sym){id, i - 1, i + 1, len};
    return 0;
}

/* Id of one character with the continuing prefix / end-of-word suffix as
 * the position requires. */
static int32_t char_id(const tern_tokenizer *t, const char *c, size_t cl, int is_first, int is_last, char *tmp)
{
    if ((is_first || !t->cont_prefix) && (!is_last || !t->eow_suffix))
        return tok_map_get(&t->vocab, c, cl);
    size_t k = 0;
    if (!is_first && t->cont_prefix) {
        memcpy(tmp, t->cont_prefix, t->cont_prefix_len);
        k = t->cont_prefix_len;
    }
    memcpy(tmp + k, c, cl);
    k += cl;
    if (is_last && t->eow_suffix) {
        memcpy(tmp + k, t->eow_suffix, t->eow_suffix_len);
        k += t->eow_suffix_len;
    }
    return tok_map_get(&t->vocab, tmp, k);
}

static int bpe_encode(const tern_tokenizer *t, const char *s, size_t len, tok_ids *out)
{
    if (t->ignore_merges) {
        int32_t id = tok_map_get(&t->vocab, s, len);
        if (id >= 0)
            return tok_ids_push(out, id);
    }
    symv w = {0};
    hnode *heap = NULL;
    int rc = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    char *tmp = malloc(t->cont_prefix_len + t->eow_suffix_len + 8);
    if (!tmp)
        return TERN_ENOMEM;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t cl = (size_t)tok_utf8_dec(s + i, len - i, &cp);
        int is_first = i == 0, is_last = i + cl >= len;
        int32_t id = char_id(t, s + i, cl, is_first, is_last, tmp);
        if (id >= 0) {
            if (unk >= 0) {
                if ((rc = sym_add(&w, unk, unk_len)))
                    goto out;
                unk = -1;
            }
            if ((rc = sym_add(&w, id, (uint32_t)cl)))
                goto out;
            i += cl;
            continue;
        }
        if (t->byte_fallback) {
            /* HF converts the bytes of the (prefixed) string; the prefix
             * and suffix are ASCII in practice, so the char's bytes do. */
            int ok = 1;
            for (size_t k = 0; k < cl; k++)
                if (t->byte_ids[(unsigned char)s[i + k]] < 0)
                    ok = 0;
            if (ok) {
                if (unk >= 0) {
                    if ((rc = sym_add(&w, unk, unk_len)))
                        goto out;
                    unk = -1;
                }
                for (size_t k = 0; k < cl; k++)
                    if ((rc = sym_add(&w, t->byte_ids[(unsigned char)s[i + k]], 1)))
                        goto out;
                i += cl;
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && t->fuse_unk) {
                unk_len += (uint32_t)cl;
            } else {
                if (unk >= 0 && (rc = sym_add(&w, unk, unk_len)))
                    goto out;
                unk = t->unk_id;
                unk_len = (uint32_t)cl;
            }
        }
        i += cl;
    }
    if (unk >= 0 && (rc = sym_add(&w, unk, unk_len)))
        goto out;
    if (w.n == 0)
        goto out;
    w.v[w.n - 1].next = -1;

    size_t hn = 0;
    heap = malloc(sizeof *heap * (w.n * 2 + 1));
    if (!heap) {
        rc = TERN_ENOMEM;
        goto out;
    }
    size_t hcap = w.n * 2 + 1;
    for (size_t i = 0; i + 1 < w.n; i++) {
        uint32_t rank;
        int32_t nid;
        if (tok_merges_get(&t->merges, w.v[i].id, w.v[i + 1].id, &rank, &nid))
            heap_push(heap, &hn, (hnode){rank, (uint32_t)i, nid});
    }
    while (hn) {
        hnode top = heap_pop(heap, &hn);
        sym *cur = &w.v[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        sym *right = &w.v[cur->next];
        uint32_t rank;
        int32_t nid;
        if (!tok_merges_get(&t->merges, cur->id, right->id, &rank, &nid) || nid != top.id)
            continue;
        cur->id = top.id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (cur->next >= 0)
            w.v[cur->next].prev = (int32_t)top.pos;
        if (hn + 2 > hcap) {
            hnode *nh = realloc(heap, sizeof *heap * hcap * 2);
            if (!nh) {
                rc = TERN_ENOMEM;
                goto out;
            }
            heap = nh;
            hcap *= 2;
        }
        if (cur->prev >= 0 && tok_merges_get(&t->merges, w.v[cur->prev].id, cur->id, &rank, &nid))
            heap_push(heap, &hn, (hnode){rank, (uint32_t)cur->prev, nid});
        if (cur->next >= 0 && tok_merges_get(&t->merges, cur->id, w.v[cur->next].id, &rank, &nid))
            heap_push(heap, &hn, (hnode){rank, top.pos, nid});
    }
    for (int32_t i = 0; i >= 0; i = w.v[i].next)
        if ((rc = tok_ids_push(out, w.v[i].id)))
            goto out;
out:
    free(tmp);
    free(heap);
    free(w.v);
    return rc;
}

static int wordpiece_encode(const tern_tokenizer *t, const char *s, size_t len, tok_ids *out)
{
    size_t n_chars = 0;
    for (size_t i = 0; i < len; i++)
        n_chars += ((unsigned char)s[i] & 0xC0) != 0x80;
    if ((int64_t)n_chars > t->max_input_chars)
        return t->unk_id >= 0 ? tok_ids_push(out, t->unk_id) : 0;
    size_t mark = out->n;
    tok_buf b = {0};
    size_t start = 0;
    while (start < len) {
        size_t end = len;
        int32_t found = -1;
        while (start < end) {
            b.len = 0;
            if ((start > 0 && t->cont_prefix && tok_buf_add(&b, t->cont_prefix, t->cont_prefix_len)) ||
                tok_buf_add(&b, s + start, end - start)) {
                tok_buf_free(&b);
                return TERN_ENOMEM;
            }
            found = tok_map_get(&t->vocab, b.p, b.len);
            if (found >= 0)
                break;
            end--;
            while (end > start && ((unsigned char)s[end] & 0xC0) == 0x80)
                end--;
        }
        if (found < 0) {
            out->n = mark;
            tok_buf_free(&b);
            return t->unk_id >= 0 ? tok_ids_push(out, t->unk_id) : 0;
        }
        if (tok_ids_push(out, found)) {
            tok_buf_free(&b);
            return TERN_ENOMEM;
        }
        start = end;
    }
    tok_buf_free(&b);
    return 0;
}

int tok_unigram_encode(const tern_tokenizer *t, const char *s, size_t len, tok_ids *out);

int tok_model_encode(const tern_tokenizer *t, const char *s, size_t len, tok_ids *out)
{
    if (len == 0)
        return 0;
    switch (t->model_type) {
    case MODEL_BPE:
        return bpe_encode(t, s, len, out);
    case MODEL_WORDPIECE:
        return wordpiece_encode(t, s, len, out);
    case MODEL_UNIGRAM:
        return tok_unigram_encode(t, s, len, out);
    }
    return TERN_EINTERNAL;
}

/* Unigram: Viterbi over the pieces in the vocabulary (SentencePiece's
 * lattice); unknown characters cost min_score - 10 as in HF, consecutive
 * unknowns fuse, and with byte_fallback become <0xAB> tokens. */
int tok_unigram_encode(const tern_tokenizer *t, const char *s, size_t len, tok_ids *out)
{
    double *best = malloc((len + 1) * sizeof *best);
    int32_t *from_id = malloc((len + 1) * sizeof *from_id);
    size_t *from_pos = malloc((len + 1) * sizeof *from_pos);
    int rc = 0;
    if (!best || !from_id || !from_pos) {
        rc = TERN_ENOMEM;
        goto out;
    }
    const double unk_score = t->min_score - 10.0;
    for (size_t i = 0; i <= len; i++)
        best[i] = -1e300;
    best[0] = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t cl = (size_t)tok_utf8_dec(s + i, len - i, &cp);
        if (best[i] > -1e299) {
            int single_found = 0;
            for (size_t e = i + 1; e <= len && e - i <= t->max_piece_len; e++) {
                if (e < len && ((unsigned char)s[e] & 0xC0) == 0x80)
                    continue;
                int32_t id = tok_map_get(&t->vocab, s + i, e - i);
                if (id < 0 || id == t->unk_id)
                    continue;
                if (e - i == cl)
                    single_found = 1;
                double sc = best[i] + t->scores[id];
                if (sc > best[e]) {
                    best[e] = sc;
                    from_id[e] = id;
                    from_pos[e] = i;
                }
            }
            if (!single_found) {
                double sc = best[i] + unk_score;
                if (sc > best[i + cl]) {
                    best[i + cl] = sc;
                    from_id[i + cl] = -1; /* unknown */
                    from_pos[i + cl] = i;
                }
            }
        }
        i += cl;
    }
    /* backtrack into a reversed list of (id, start, end) */
    size_t n = 0;
    for (size_t e = len; e > 0; e = from_pos[e])
        n++;
    size_t *st = malloc(n * sizeof *st), *en = malloc(n * sizeof *en);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!st || !en || !ids) {
        free(st);
        free(en);
        free(ids);
        rc = TERN_ENOMEM;
        goto out;
    }
    size_t k = n;
    for (size_t e = len; e > 0; e = from_pos[e]) {
        k--;
        ids[k] = from_id[e];
        st[k] = from_pos[e];
        en[k] = e;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        if (ids[i] >= 0) {
            rc = tok_ids_push(out, ids[i]);
            continue;
        }
        size_t j = i;
        while (j + 1 < n && ids[j + 1] < 0)
            j++;
        int fell_back = 0;
        if (t->byte_fallback) {
            fell_back = 1;
            for (size_t b = st[i]; b < en[j]; b++)
                if (t->byte_ids[(unsigned char)s[b]] < 0)
                    fell_back = 0;
            for (size_t b = st[i]; fell_back && b < en[j] && !rc; b++)
                rc = tok_ids_push(out, t->byte_ids[(unsigned char)s[b]]);
        }
        if (!fell_back && t->unk_id >= 0)
            rc = tok_ids_push(out, t->unk_id);
        i = j;
    }
    free(st);
    free(en);
    free(ids);
out:
    free(best);
    free(from_id);
    free(from_pos);
    return rc;
}
