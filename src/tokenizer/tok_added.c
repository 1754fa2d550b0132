/* Added tokens ("added_tokens"): a byte trie over their contents and the
 * split of input text around them, as HF's AddedVocabulary does: leftmost-
 * longest, non-overlapping matches; single_word rejects a match touching a
 * word character; lstrip/rstrip swallow neighbouring whitespace. Tokens with
 * normalized=true live in a second trie matched on normalized text. */
#include <stdlib.h>
#include <string.h>

#include "tok_int.h"

void tok_trie_free(tok_trie *tr)
{
    free(tr->term);
    tok_merges_free(&tr->edges);
    memset(tr, 0, sizeof *tr);
}

static int trie_insert(tok_trie *tr, size_t *cap, const char *s, size_t n, int32_t idx)
{
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t rank;
        int32_t child;
        unsigned char c = (unsigned char)s[i];
        if (tok_merges_get(&tr->edges, (int32_t)node, c, &rank, &child)) {
            node = (uint32_t)child;
            continue;
        }
        if (tr->n_nodes == *cap) {
            size_t nc = *cap * 2;
            int32_t *t = realloc(tr->term, nc * sizeof *t);
            if (!t)
                return TERN_ENOMEM;
            for (size_t k = *cap; k < nc; k++)
                t[k] = -1;
            tr->term = t;
            *cap = nc;
        }
        child = (int32_t)tr->n_nodes++;
        if (tok_merges_put(&tr->edges, (int32_t)node, c, 0, child))
            return TERN_ENOMEM;
        node = (uint32_t)child;
    }
    if (tr->term[node] < 0) /* first token with this content wins */
        tr->term[node] = idx;
    return 0;
}

int tok_trie_build(tok_trie *tr, const tern_tokenizer *t, int normalized, const tok_norm *norm, tern_err *err)
{
    memset(tr, 0, sizeof *tr);
    size_t cap = 64;
    tr->term = malloc(cap * sizeof *tr->term);
    if (!tr->term || tok_merges_init(&tr->edges, 256))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    for (size_t k = 0; k < cap; k++)
        tr->term[k] = -1;
    tr->n_nodes = 1;
    tr->empty = 1;
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    tok_buf b = {0};
    int rc = md ? 0 : TERN_ENOMEM;
    for (size_t i = 0; i < t->n_added && !rc; i++) {
        const tok_added *a = &t->added[i];
        if (!!a->normalized != !!normalized || a->len == 0)
            continue;
        const char *s = a->content;
        size_t n = a->len;
        if (normalized && norm) {
            b.len = 0;
            if ((rc = tok_normalize(norm, s, n, &b, md, err)))
                break;
            s = b.p;
            n = b.len;
        }
        if (n == 0)
            continue;
        tr->first[(unsigned char)s[0]] = 1;
        tr->empty = 0;
        rc = trie_insert(tr, &cap, s, n, (int32_t)i);
    }
    tok_buf_free(&b);
    if (md)
        pcre2_match_data_free(md);
    if (rc)
        return tern_err_set(err, rc, "building the added-token matcher: %s", tern_err_str(rc));
    return 0;
}

/* Longest token starting at s[i]: its end, or 0 if none. */
static size_t trie_longest(const tok_trie *tr, const char *s, size_t n, size_t i, int32_t *idx)
{
    uint32_t node = 0;
    size_t best = 0;
    for (size_t k = i; k < n; k++) {
        uint32_t rank;
        int32_t child;
        if (!tok_merges_get(&tr->edges, (int32_t)node, (unsigned char)s[k], &rank, &child))
            break;
        node = (uint32_t)child;
        if (tr->term[node] >= 0) {
            best = k + 1;
            *idx = tr->term[node];
        }
    }
    return best;
}

static int last_char(const char *s, size_t n, uint32_t *cp)
{
    if (n == 0)
        return 0;
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
        k--;
    tok_utf8_dec(s + k, n - k, cp);
    return 1;
}

int tok_added_split(const tern_tokenizer *t, const tok_trie *tr, const char *s, size_t len, int first,
                    tok_pieces *out)
{
    size_t start_offset = 0, i = 0;
    while (!tr->empty && i < len) {
        if (!tr->first[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        int32_t idx = -1;
        size_t e = trie_longest(tr, s, len, i, &idx);
        if (!e) {
            i++;
            continue;
        }
        size_t start = i, stop = e;
        i = e;
        const tok_added *a = &t->added[idx];
        if (a->single_word) {
            uint32_t cp;
            int start_ok = start == 0 || !last_char(s, start, &cp) || !tok_is_word(cp);
            int stop_ok = stop == len;
            if (!stop_ok) {
                tok_utf8_dec(s + stop, len - stop, &cp);
                stop_ok = !tok_is_word(cp);
            }
            if (!start_ok || !stop_ok)
                continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            uint32_t cp;
            while (ns > 0 && last_char(s, ns, &cp) && tok_is_whitespace(cp)) {
                char e4[4];
                ns -= (size_t)tok_utf8_enc(cp, e4);
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                uint32_t cp;
                int l = tok_utf8_dec(s + stop, len - stop, &cp);
                if (!tok_is_whitespace(cp))
                    break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start && tok_pieces_push(out, s + start_offset, start - start_offset, -1,
                                                    first && start_offset == 0))
            return TERN_ENOMEM;
        if (tok_pieces_push(out, s + start, stop > start ? stop - start : 0, a->id, first && start == 0))
            return TERN_ENOMEM;
        start_offset = stop;
    }
    if (start_offset < len && tok_pieces_push(out, s + start_offset, len - start_offset, -1, first && start_offset == 0))
        return TERN_ENOMEM;
    return 0;
}
