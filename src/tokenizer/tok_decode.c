/* Decoders of tokenizer.json ("decoder"): parsing, the decode chain over a
 * list of token strings (HF's Decoder::decode_chain), tokenizer_decode and
 * the per-token byte strings behind tokenizer_token_bytes. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "tok_int.h"

static json_object *jget(json_object *o, const char *k)
{
    json_object *v = NULL;
    return json_object_object_get_ex(o, k, &v) ? v : NULL;
}

static int jbool(json_object *o, const char *k, int dflt)
{
    json_object *v = jget(o, k);
    return v && json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : dflt;
}

static int jint(json_object *o, const char *k, int dflt)
{
    json_object *v = jget(o, k);
    if (!v || !json_object_is_type(v, json_type_int))
        return dflt;
    int64_t x = json_object_get_int64(v);
    return x < 0 ? 0 : x > 1000000 ? 1000000 : (int)x;
}

static char *dup_json_str(json_object *v, const char *dflt, size_t *len)
{
    const char *s = v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : dflt;
    size_t n = v && json_object_is_type(v, json_type_string) ? (size_t)json_object_get_string_len(v) : strlen(dflt);
    char *r = malloc(n + 1);
    if (r) {
        memcpy(r, s, n);
        r[n] = 0;
        *len = n;
    }
    return r;
}

void tok_dec_free(tok_dec *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n_subs; i++)
        tok_dec_free(d->subs[i]);
    free(d->subs);
    free(d->str);
    tok_pattern_free(&d->pat);
    free(d);
}

int tok_dec_parse(tok_dec **out, json_object *o, tern_err *err)
{
    *out = NULL;
    if (!o)
        return 0;
    json_object *tv = jget(o, "type");
    if (!json_object_is_type(o, json_type_object) || !tv || !json_object_is_type(tv, json_type_string))
        return tern_err_set(err, TERN_EFORMAT, "decoder without a type");
    const char *t = json_object_get_string(tv);
    tok_dec *d = calloc(1, sizeof *d);
    if (!d)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    int rc = 0;
    if (!strcmp(t, "Sequence")) {
        d->type = DEC_SEQUENCE;
        json_object *arr = jget(o, "decoders");
        if (!arr || !json_object_is_type(arr, json_type_array)) {
            rc = tern_err_set(err, TERN_EFORMAT, "decoder Sequence needs 'decoders'");
            goto out;
        }
        size_t k = json_object_array_length(arr);
        d->subs = calloc(k ? k : 1, sizeof *d->subs);
        if (!d->subs) {
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < k; i++) {
            rc = tok_dec_parse(&d->subs[d->n_subs], json_object_array_get_idx(arr, i), err);
            if (rc)
                goto out;
            if (d->subs[d->n_subs])
                d->n_subs++;
        }
    } else if (!strcmp(t, "ByteLevel")) {
        d->type = DEC_BYTELEVEL;
    } else if (!strcmp(t, "ByteFallback")) {
        d->type = DEC_BYTEFALLBACK;
    } else if (!strcmp(t, "Fuse")) {
        d->type = DEC_FUSE;
    } else if (!strcmp(t, "Metaspace")) {
        d->type = DEC_METASPACE;
        rc = tok_parse_char(o, "replacement", "\xE2\x96\x81", d->repl, &d->repl_len, err);
        json_object *ps = jget(o, "prepend_scheme");
        if (ps && json_object_is_type(ps, json_type_string))
            d->prepend_scheme = !strcmp(json_object_get_string(ps), "never") ? PREPEND_NEVER
                                : !strcmp(json_object_get_string(ps), "first") ? PREPEND_FIRST
                                                                               : PREPEND_ALWAYS;
        else
            d->prepend_scheme = jbool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
    } else if (!strcmp(t, "Strip")) {
        d->type = DEC_STRIP;
        rc = tok_parse_char(o, "content", " ", d->repl, &d->repl_len, err);
        d->start = jint(o, "start", 0);
        d->stop = jint(o, "stop", 0);
    } else if (!strcmp(t, "Replace")) {
        d->type = DEC_REPLACE;
        rc = tok_pattern_parse(&d->pat, jget(o, "pattern"), "decoder Replace", err);
        if (!rc && !(d->str = dup_json_str(jget(o, "content"), "", &d->str_len)))
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    } else if (!strcmp(t, "WordPiece")) {
        d->type = DEC_WORDPIECE;
        d->cleanup = jbool(o, "cleanup", 1);
        if (!(d->str = dup_json_str(jget(o, "prefix"), "##", &d->str_len)))
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    } else if (!strcmp(t, "BPEDecoder")) {
        d->type = DEC_BPE;
        if (!(d->str = dup_json_str(jget(o, "suffix"), "</w>", &d->str_len)))
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    } else {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "unsupported decoder type '%s'", t);
    }
out:
    if (rc) {
        tok_dec_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

/* ---- chain ------------------------------------------------------------- */
#define P(tk, i) ((tk)->text.p + (tk)->v[i].off)

/* Replaces every occurrence of a literal (or regex) in s by rep. */
static int replace_all(const tok_pattern *pat, const char *s, size_t n, const char *rep, size_t rep_len, tok_buf *o,
                       pcre2_match_data *md)
{
    size_t pos = 0, from = 0, ms, me;
    for (;;) {
        int r = tok_pattern_find(pat, s, n, from, &ms, &me, md);
        if (r < 0)
            return r;
        if (!r)
            break;
        if (me == ms) {
            if (ms >= n)
                break;
            uint32_t cp;
            from = ms + (size_t)tok_utf8_dec(s + ms, n - ms, &cp);
            continue;
        }
        if (tok_buf_add(o, s + pos, ms - pos) || tok_buf_add(o, rep, rep_len))
            return TERN_ENOMEM;
        pos = from = me;
    }
    return tok_buf_add(o, s + pos, n - pos);
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

int tok_byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int a = hexval(s[3]), b = hexval(s[4]);
    return a < 0 || b < 0 ? -1 : a * 16 + b;
}

static int flush_bytes(tok_pieces *out, tok_buf *bytes)
{
    if (!bytes->len)
        return 0;
    int rc = 0;
    int valid = 1;
    for (size_t i = 0; i < bytes->len;) {
        int l = tok_utf8_valid_len(bytes->p + i, bytes->len - i);
        if (!l) {
            valid = 0;
            break;
        }
        i += (size_t)l;
    }
    if (valid)
        rc = tok_pieces_push(out, bytes->p, bytes->len, -1, 0);
    else
        for (size_t i = 0; i < bytes->len && !rc; i++)
            rc = tok_pieces_push(out, "\xEF\xBF\xBD", 3, -1, 0);
    bytes->len = 0;
    return rc;
}

static int wp_cleanup(tok_buf *b)
{
    static const char *from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " do not", " 's", " 've", " 're"};
    static const char *to[] = {".", "?", "!", ",", "'", "n't", "'m", " don't", "'s", "'ve", "'re"};
    for (size_t k = 0; k < sizeof from / sizeof *from; k++) {
        tok_pattern lit = {.lit = (char *)from[k], .lit_len = strlen(from[k])};
        tok_buf o = {0};
        if (replace_all(&lit, b->p ? b->p : "", b->len, to[k], strlen(to[k]), &o, NULL)) {
            tok_buf_free(&o);
            return TERN_ENOMEM;
        }
        tok_buf_free(b);
        *b = o;
    }
    return 0;
}

static int dec_one(const tok_dec *d, tok_pieces *in, tok_pieces *out, pcre2_match_data *md)
{
    int rc = 0;
    tok_buf b = {0};
    out->n = 0;
    out->text.len = 0;
    switch (d->type) {
    case DEC_SEQUENCE:
        return TERN_EINTERNAL;
    case DEC_BYTELEVEL:
        for (size_t i = 0; i < in->n && !rc; i++) {
            const char *s = P(in, i);
            size_t n = in->v[i].len, mark = b.len;
            for (size_t k = 0; k < n && !rc;) {
                uint32_t cp;
                k += (size_t)tok_utf8_dec(s + k, n - k, &cp);
                int by = tok_cp_to_byte(cp);
                if (by < 0) { /* not a byte char: the token's own UTF-8 */
                    b.len = mark;
                    rc = tok_buf_add(&b, s, n);
                    break;
                }
                rc = tok_buf_addc(&b, (char)by);
            }
        }
        if (!rc) {
            tok_buf l = {0};
            rc = tok_utf8_lossy(&l, b.p ? b.p : "", b.len);
            if (!rc)
                rc = tok_pieces_push(out, l.p ? l.p : "", l.len, -1, 0);
            tok_buf_free(&l);
        }
        break;
    case DEC_BYTEFALLBACK:
        for (size_t i = 0; i < in->n && !rc; i++) {
            int by = tok_byte_token(P(in, i), in->v[i].len);
            if (by >= 0) {
                rc = tok_buf_addc(&b, (char)by);
                continue;
            }
            rc = flush_bytes(out, &b);
            if (!rc)
                rc = tok_pieces_push(out, P(in, i), in->v[i].len, -1, 0);
        }
        if (!rc)
            rc = flush_bytes(out, &b);
        break;
    case DEC_FUSE:
        for (size_t i = 0; i < in->n && !rc; i++)
            rc = tok_buf_add(&b, P(in, i), in->v[i].len);
        if (!rc)
            rc = tok_pieces_push(out, b.p ? b.p : "", b.len, -1, 0);
        break;
    case DEC_STRIP:
        for (size_t i = 0; i < in->n && !rc; i++) {
            const char *s = P(in, i);
            size_t n = in->v[i].len, a = 0, e = n;
            for (int k = 0; k < d->start && a + d->repl_len <= e && !memcmp(s + a, d->repl, d->repl_len); k++)
                a += d->repl_len;
            for (int k = 0; k < d->stop && e >= a + d->repl_len && !memcmp(s + e - d->repl_len, d->repl, d->repl_len);
                 k++)
                e -= d->repl_len;
            rc = tok_pieces_push(out, s + a, e - a, -1, 0);
        }
        break;
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            b.len = 0;
            rc = replace_all(&d->pat, P(in, i), in->v[i].len, d->str, d->str_len, &b, md);
            if (!rc)
                rc = tok_pieces_push(out, b.p ? b.p : "", b.len, -1, 0);
        }
        break;
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            b.len = 0;
            const char *s = P(in, i);
            size_t n = in->v[i].len;
            for (size_t k = 0; k < n && !rc;) {
                if (k + d->repl_len <= n && !memcmp(s + k, d->repl, d->repl_len)) {
                    if (!(i == 0 && d->prepend_scheme != PREPEND_NEVER))
                        rc = tok_buf_addc(&b, ' ');
                    k += d->repl_len;
                } else {
                    rc = tok_buf_addc(&b, s[k++]);
                }
            }
            if (!rc)
                rc = tok_pieces_push(out, b.p ? b.p : "", b.len, -1, 0);
        }
        break;
    case DEC_WORDPIECE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            b.len = 0;
            const char *s = P(in, i);
            size_t n = in->v[i].len;
            if (i != 0) {
                if (n >= d->str_len && !memcmp(s, d->str, d->str_len)) {
                    s += d->str_len;
                    n -= d->str_len;
                } else {
                    rc = tok_buf_addc(&b, ' ');
                }
            }
            if (!rc)
                rc = tok_buf_add(&b, s, n);
            if (!rc && d->cleanup)
                rc = wp_cleanup(&b);
            if (!rc)
                rc = tok_pieces_push(out, b.p ? b.p : "", b.len, -1, 0);
        }
        break;
    case DEC_BPE:
        for (size_t i = 0; i < in->n && !rc; i++) {
            b.len = 0;
            tok_pattern lit = {.lit = d->str, .lit_len = d->str_len};
            rc = replace_all(&lit, P(in, i), in->v[i].len, i + 1 == in->n ? "" : " ", i + 1 == in->n ? 0 : 1, &b, md);
            if (!rc)
                rc = tok_pieces_push(out, b.p ? b.p : "", b.len, -1, 0);
        }
        break;
    }
    tok_buf_free(&b);
    if (!rc) {
        tok_pieces t = *in;
        *in = *out;
        *out = t;
    }
    return rc;
}

int tok_decode_chain(const tok_dec *d, tok_pieces *toks, tok_pieces *scratch, pcre2_match_data *md)
{
    if (d->type != DEC_SEQUENCE)
        return dec_one(d, toks, scratch, md);
    for (size_t i = 0; i < d->n_subs; i++) {
        int rc = tok_decode_chain(d->subs[i], toks, scratch, md);
        if (rc)
            return rc;
    }
    return 0;
}

int tokenizer_decode(const tern_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text_out,
                     size_t *len_out, tern_err *err)
{
    *text_out = NULL;
    if (len_out)
        *len_out = 0;
    if (!tok || (!ids && n))
        return tern_err_set(err, TERN_EINVAL, "tokenizer_decode: no tokenizer or ids");
    tok_pieces toks = {0}, scratch = {0};
    tok_buf out = {0};
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    int rc = md ? 0 : TERN_ENOMEM;
    for (size_t i = 0; i < n && !rc; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_ids || !tok->id_str[id])
            continue; /* HF skips ids it cannot name */
        if (skip_special && (tok->id_flags[id] & 1))
            continue;
        rc = tok_pieces_push(&toks, tok->id_str[id], tok->id_len[id], -1, 0);
    }
    if (!rc && tok->dec)
        rc = tok_decode_chain(tok->dec, &toks, &scratch, md);
    for (size_t i = 0; i < toks.n && !rc; i++) {
        if (!tok->dec && i > 0)
            rc = tok_buf_addc(&out, ' ');
        if (!rc)
            rc = tok_buf_add(&out, toks.text.p + toks.v[i].off, toks.v[i].len);
    }
    if (!rc && !out.p)
        rc = tok_buf_add(&out, "", 0);
    if (md)
        pcre2_match_data_free(md);
    tok_pieces_free(&toks);
    tok_pieces_free(&scratch);
    if (rc) {
        tok_buf_free(&out);
        return tern_err_set(err, rc, "decoding failed (%s)", tern_err_name(rc));
    }
    *text_out = out.p;
    if (len_out)
        *len_out = out.len;
    return 0;
}

/* ---- token bytes ------------------------------------------------------- */
static int dec_has(const tok_dec *d, int type)
{
    if (!d)
        return 0;
    if (d->type == type)
        return 1;
    for (size_t i = 0; i < d->n_subs; i++)
        if (dec_has(d->subs[i], type))
            return 1;
    return 0;
}

/* Applies the string-rewriting decoders (Replace, Metaspace) of the chain
 * to one token in isolation. */
static int isolate_rewrite(const tok_dec *d, tok_buf *b, pcre2_match_data *md)
{
    if (d->type == DEC_SEQUENCE) {
        for (size_t i = 0; i < d->n_subs; i++)
            if (isolate_rewrite(d->subs[i], b, md))
                return TERN_ENOMEM;
        return 0;
    }
    tok_buf o = {0};
    int rc = 0;
    if (d->type == DEC_REPLACE)
        rc = replace_all(&d->pat, b->p ? b->p : "", b->len, d->str, d->str_len, &o, md);
    else if (d->type == DEC_METASPACE) {
        tok_pattern lit = {.lit = (char *)d->repl, .lit_len = d->repl_len};
        rc = replace_all(&lit, b->p ? b->p : "", b->len, " ", 1, &o, md);
    } else
        return 0;
    if (rc) {
        tok_buf_free(&o);
        return rc;
    }
    tok_buf_free(b);
    *b = o;
    return 0;
}

int tok_token_bytes_build(tern_tokenizer *t, tok_buf *arena, size_t *offs)
{
    int bytelevel = dec_has(t->dec, DEC_BYTELEVEL), fallback = dec_has(t->dec, DEC_BYTEFALLBACK) || t->byte_fallback;
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    tok_buf b = {0};
    int rc = md ? 0 : TERN_ENOMEM;
    for (int32_t id = 0; id < t->n_ids && !rc; id++) {
        offs[id] = arena->len;
        t->tb_len[id] = 0;
        const char *s = t->id_str[id];
        size_t n = t->id_len[id];
        if (!s)
            continue;
        int by;
        if ((t->id_flags[id] & 1) || !t->dec) {
            rc = tok_buf_add(arena, s, n);
        } else if (fallback && (by = tok_byte_token(s, n)) >= 0) {
            rc = tok_buf_addc(arena, (char)by);
        } else if (bytelevel) {
            size_t mark = arena->len;
            for (size_t k = 0; k < n && !rc;) {
                uint32_t cp;
                k += (size_t)tok_utf8_dec(s + k, n - k, &cp);
                int x = tok_cp_to_byte(cp);
                if (x < 0) {
                    arena->len = mark;
                    rc = tok_buf_add(arena, s, n);
                    break;
                }
                rc = tok_buf_addc(arena, (char)x);
            }
        } else {
            b.len = 0;
            rc = tok_buf_add(&b, s, n);
            if (!rc)
                rc = isolate_rewrite(t->dec, &b, md);
            if (!rc)
                rc = tok_buf_add(arena, b.p, b.len);
        }
        t->tb_len[id] = (uint32_t)(arena->len - offs[id]);
    }
    tok_buf_free(&b);
    if (md)
        pcre2_match_data_free(md);
    return rc;
}

int tokenizer_token_bytes(const tern_tokenizer *tok, int32_t id, const char **bytes, size_t *len)
{
    if (!tok || id < 0 || id >= tok->n_ids || !tok->tb_str || !tok->tb_str[id]) {
        if (bytes)
            *bytes = "";
        if (len)
            *len = 0;
        return TERN_ERANGE;
    }
    *bytes = tok->tb_str[id];
    *len = tok->tb_len[id];
    return 0;
}
