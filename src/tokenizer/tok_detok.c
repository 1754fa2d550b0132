/* Streaming detokenizer: decodes a window of recent ids "in context", as
 * vLLM's prefix/read offsets do. The text of ids[prefix_off, read_off) is
 * what was already emitted from that window; decoding ids[prefix_off, n)
 * and cutting that prefix off gives the new text. Text ending in U+FFFD (an
 * incomplete UTF-8 sequence from byte-level or byte-fallback pieces) is held
 * back until a later id completes it or detok_flush releases it. The window
 * always starts at a token the decode keeps, so Strip decoders and a
 * leading '▁' act on the same token as in a full decode. */
#include <stdlib.h>
#include <string.h>

#include "tok_int.h"

/* Tokens of context kept before the unread ones (vLLM uses 5): enough for
 * any decoder that looks at neighbours, small enough to keep decoding
 * each step O(1). */
#define DETOK_CONTEXT 5

struct tern_detok {
    const tern_tokenizer *tok;
    int skip_special;
    int32_t *ids;
    size_t n, cap;
    size_t prefix_off, read_off;
    char *prefix_text; /* decode(ids[prefix_off, read_off)) */
    size_t prefix_len;
    char *piece; /* last returned piece */
};

static int kept(const tern_detok *d, int32_t id)
{
    const tern_tokenizer *t = d->tok;
    if (id < 0 || id >= t->n_ids || !t->id_str[id])
        return 0;
    return !(d->skip_special && (t->id_flags[id] & 1));
}

/* Moves prefix_off back until the window starts at a kept token. */
static void fix_window(tern_detok *d)
{
    while (d->prefix_off > 0 && d->prefix_off < d->read_off && !kept(d, d->ids[d->prefix_off]))
        d->prefix_off--;
}

static int refresh_prefix(tern_detok *d, tern_err *err)
{
    free(d->prefix_text);
    d->prefix_text = NULL;
    d->prefix_len = 0;
    return tokenizer_decode(d->tok, d->ids + d->prefix_off, d->read_off - d->prefix_off, d->skip_special,
                            &d->prefix_text, &d->prefix_len, err);
}

tern_detok *detok_new(const tern_tokenizer *tok, const int32_t *prefix, size_t n_prefix, int skip_special,
                      tern_err *err)
{
    if (!tok || (!prefix && n_prefix))
        return tern_err_set(err, TERN_EINVAL, "detok_new: no tokenizer or prefix"), NULL;
    tern_detok *d = calloc(1, sizeof *d);
    if (!d)
        return tern_err_set(err, TERN_ENOMEM, "out of memory"), NULL;
    d->tok = tok;
    d->skip_special = skip_special;
    d->cap = n_prefix + 64;
    d->ids = malloc(d->cap * sizeof *d->ids);
    if (!d->ids) {
        free(d);
        return tern_err_set(err, TERN_ENOMEM, "out of memory"), NULL;
    }
    if (n_prefix)
        memcpy(d->ids, prefix, n_prefix * sizeof *prefix);
    d->n = d->read_off = n_prefix;
    d->prefix_off = n_prefix > DETOK_CONTEXT ? n_prefix - DETOK_CONTEXT : 0;
    fix_window(d);
    if (refresh_prefix(d, err)) {
        detok_free(d);
        return NULL;
    }
    return d;
}

static int ends_incomplete(const char *s, size_t n)
{
    return n >= 3 && !memcmp(s + n - 3, "\xEF\xBF\xBD", 3);
}

static int step(tern_detok *d, int force, const char **piece, size_t *piece_len, tern_err *err)
{
    *piece = "";
    *piece_len = 0;
    free(d->piece);
    d->piece = NULL;
    if (d->read_off == d->n)
        return 0;
    char *text = NULL;
    size_t len = 0;
    int rc = tokenizer_decode(d->tok, d->ids + d->prefix_off, d->n - d->prefix_off, d->skip_special, &text, &len, err);
    if (rc)
        return rc;
    if (len <= d->prefix_len || (!force && ends_incomplete(text, len))) {
        free(text);
        if (force) { /* nothing more will come: forget the held ids */
            d->prefix_off = d->read_off = d->n;
            return refresh_prefix(d, err);
        }
        return 0;
    }
    if (memcmp(text, d->prefix_text, d->prefix_len)) {
        /* The decoder rewrote text already emitted (ByteFallback turns a
         * whole byte run into U+FFFDs when its end is invalid). What was
         * sent cannot be taken back: emit the new ids decoded alone, which
         * keeps the stream valid UTF-8. */
        free(text);
        text = NULL;
        if ((rc = tokenizer_decode(d->tok, d->ids + d->read_off, d->n - d->read_off, d->skip_special, &text, &len,
                                   err)))
            return rc;
        d->piece = text;
        *piece = text;
        *piece_len = len;
    } else {
        /* the new text starts after what this window already produced */
        memmove(text, text + d->prefix_len, len - d->prefix_len + 1);
        d->piece = text;
        *piece = text;
        *piece_len = len - d->prefix_len;
    }
    d->prefix_off = d->read_off;
    d->read_off = d->n;
    fix_window(d);
    return refresh_prefix(d, err);
}

int detok_push(tern_detok *d, int32_t id, const char **piece, size_t *piece_len, tern_err *err)
{
    *piece = "";
    *piece_len = 0;
    if (!d)
        return tern_err_set(err, TERN_EINVAL, "detok_push: no detokenizer");
    if (d->n == d->cap) {
        int32_t *v = realloc(d->ids, d->cap * 2 * sizeof *v);
        if (!v)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        d->ids = v;
        d->cap *= 2;
    }
    d->ids[d->n++] = id;
    return step(d, 0, piece, piece_len, err);
}

int detok_flush(tern_detok *d, const char **piece, size_t *piece_len, tern_err *err)
{
    *piece = "";
    *piece_len = 0;
    if (!d)
        return tern_err_set(err, TERN_EINVAL, "detok_flush: no detokenizer");
    return step(d, 1, piece, piece_len, err);
}

void detok_free(tern_detok *d)
{
    if (!d)
        return;
    free(d->ids);
    free(d->prefix_text);
    free(d->piece);
    free(d);
}
