/* Normalizers of tokenizer.json ("normalizer"): parsing and application.
 * Only the normalized text matters to us (ids, not offsets), so each
 * normalizer is a string -> string function; Sequence chains them.
 * Unicode forms come from utf8proc. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>
#include <utf8proc.h>

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

void tok_norm_free(tok_norm *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n_subs; i++)
        tok_norm_free(n->subs[i]);
    free(n->subs);
    free(n->str);
    tok_pattern_free(&n->pat);
    free(n);
}

static char *dup_str(json_object *v, size_t *len)
{
    if (!v || !json_object_is_type(v, json_type_string))
        return NULL;
    size_t n = (size_t)json_object_get_string_len(v);
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, json_object_get_string(v), n);
        s[n] = 0;
        *len = n;
    }
    return s;
}

int tok_norm_parse(tok_norm **out, json_object *o, tern_err *err)
{
    *out = NULL;
    if (!o)
        return 0;
    json_object *tv = jget(o, "type");
    if (!json_object_is_type(o, json_type_object) || !tv || !json_object_is_type(tv, json_type_string))
        return tern_err_set(err, TERN_EFORMAT, "normalizer without a type");
    const char *t = json_object_get_string(tv);
    tok_norm *n = calloc(1, sizeof *n);
    if (!n)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    int rc = 0;
    if (!strcmp(t, "Sequence")) {
        n->type = NORM_SEQUENCE;
        json_object *arr = jget(o, "normalizers");
        if (!arr || !json_object_is_type(arr, json_type_array)) {
            rc = tern_err_set(err, TERN_EFORMAT, "normalizer Sequence needs 'normalizers'");
            goto out;
        }
        size_t k = json_object_array_length(arr);
        n->subs = calloc(k ? k : 1, sizeof *n->subs);
        if (!n->subs) {
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < k; i++) {
            rc = tok_norm_parse(&n->subs[n->n_subs], json_object_array_get_idx(arr, i), err);
            if (rc)
                goto out;
            if (n->subs[n->n_subs])
                n->n_subs++;
        }
    } else if (!strcmp(t, "NFC")) {
        n->type = NORM_NFC;
    } else if (!strcmp(t, "NFD")) {
        n->type = NORM_NFD;
    } else if (!strcmp(t, "NFKC")) {
        n->type = NORM_NFKC;
    } else if (!strcmp(t, "NFKD")) {
        n->type = NORM_NFKD;
    } else if (!strcmp(t, "Lowercase")) {
        n->type = NORM_LOWERCASE;
    } else if (!strcmp(t, "StripAccents")) {
        n->type = NORM_STRIP_ACCENTS;
    } else if (!strcmp(t, "Prepend")) {
        n->type = NORM_PREPEND;
        n->str = dup_str(jget(o, "prepend"), &n->str_len);
        if (!n->str)
            rc = tern_err_set(err, TERN_EFORMAT, "normalizer Prepend needs a 'prepend' string");
    } else if (!strcmp(t, "Replace")) {
        n->type = NORM_REPLACE;
        rc = tok_pattern_parse(&n->pat, jget(o, "pattern"), "normalizer Replace", err);
        if (!rc) {
            n->str = dup_str(jget(o, "content"), &n->str_len);
            if (!n->str)
                rc = tern_err_set(err, TERN_EFORMAT, "normalizer Replace needs a 'content' string");
        }
    } else if (!strcmp(t, "Strip")) {
        n->type = NORM_STRIP;
        n->left = jbool(o, "strip_left", 1);
        n->right = jbool(o, "strip_right", 1);
    } else if (!strcmp(t, "BertNormalizer")) {
        n->type = NORM_BERT;
        n->clean_text = jbool(o, "clean_text", 1);
        n->chinese = jbool(o, "handle_chinese_chars", 1);
        n->lowercase = jbool(o, "lowercase", 1);
        n->strip_accents = jbool(o, "strip_accents", n->lowercase);
    } else {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "unsupported normalizer type '%s'", t);
    }
out:
    if (rc) {
        tok_norm_free(n);
        return rc;
    }
    *out = n;
    return 0;
}

/* ---- application ------------------------------------------------------- */
/* Code points that NFC leaves alone whatever surrounds them, as long as
 * every other code point of the text is in this set too: they neither
 * decompose nor compose with one another (combining marks, conjoining
 * jamo, the kana voicing marks U+3099/309A and singletons such as U+2000
 * are all outside it). */
static int nfc_inert(uint32_t cp)
{
    return cp < 0x300 || (cp >= 0x3040 && cp <= 0x3098) || (cp >= 0x30A0 && cp <= 0x30FF) ||
           (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x1F300 && cp <= 0x1FAFF);
}

static int unicode_form(const char *s, size_t len, tok_buf *out, utf8proc_option_t opt)
{
    size_t i = 0;
    while (i < len && (unsigned char)s[i] < 0x80)
        i++;
    if (i == len) /* ASCII is invariant under every normalization form */
        return tok_buf_add(out, s, len);
    if (opt == UTF8PROC_COMPOSE) {
        while (i < len) {
            uint32_t cp;
            int l = tok_utf8_dec(s + i, len - i, &cp);
            if (!nfc_inert(cp))
                break;
            i += (size_t)l;
        }
        if (i == len)
            return tok_buf_add(out, s, len);
    }
    utf8proc_uint8_t *r = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &r, opt | UTF8PROC_STABLE);
    if (n < 0)
        return n == UTF8PROC_ERROR_NOMEM ? TERN_ENOMEM : TERN_EFORMAT;
    int rc = tok_buf_add(out, r, (size_t)n);
    free(r);
    return rc;
}

static int lowercase(const char *s, size_t len, tok_buf *out)
{
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = tok_utf8_dec(s + i, len - i, &cp);
        i += (size_t)l;
        char e[4];
        if (cp == 0x130) { /* the one code point whose lowercase is two */
            if (tok_buf_add(out, "i\xCC\x87", 3))
                return TERN_ENOMEM;
            continue;
        }
        uint32_t lc = cp < 0x80 ? (cp >= 'A' && cp <= 'Z' ? cp + 32 : cp) : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
        if (tok_buf_add(out, e, (size_t)tok_utf8_enc(lc, e)))
            return TERN_ENOMEM;
    }
    return 0;
}

/* StripAccents drops every mark (Mn, Mc, Me: "is_combining_mark");
 * BertNormalizer only the non-spacing ones (Mn). */
static int strip_accents(const char *s, size_t len, tok_buf *out, int mn_only)
{
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = tok_utf8_dec(s + i, len - i, &cp);
        int c = utf8proc_category((utf8proc_int32_t)cp);
        int mark = c == UTF8PROC_CATEGORY_MN || (!mn_only && (c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME));
        if (!mark && tok_buf_add(out, s + i, (size_t)l))
            return TERN_ENOMEM;
        i += (size_t)l;
    }
    return 0;
}

static int replace(const tok_norm *n, const char *s, size_t len, tok_buf *out, pcre2_match_data *md)
{
    size_t pos = 0, from = 0, ms, me;
    for (;;) {
        int r = tok_pattern_find(&n->pat, s, len, from, &ms, &me, md);
        if (r < 0)
            return r;
        if (!r)
            break;
        if (me == ms) { /* an empty match replaces nothing; step one char */
            if (ms >= len)
                break;
            from = ms + (size_t)tok_utf8_dec(s + ms, len - ms, &(uint32_t){0});
            continue;
        }
        if (tok_buf_add(out, s + pos, ms - pos) || tok_buf_add(out, n->str, n->str_len))
            return TERN_ENOMEM;
        pos = from = me;
    }
    return tok_buf_add(out, s + pos, len - pos);
}

static int bert(const tok_norm *n, const char *s, size_t len, tok_buf *out)
{
    tok_buf a = {0};
    int rc = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int l = tok_utf8_dec(s + i, len - i, &cp);
        i += (size_t)l;
        if (n->clean_text) {
            int cat = utf8proc_category((utf8proc_int32_t)cp);
            /* HF's "other" is Cc, Cf, Cs, Co: unassigned code points stay */
            int other = cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF || cat == UTF8PROC_CATEGORY_CS ||
                        cat == UTF8PROC_CATEGORY_CO;
            if (cp == 0 || cp == 0xFFFD || (other && cp != '\t' && cp != '\n' && cp != '\r'))
                continue;
            if (tok_is_whitespace(cp))
                cp = ' ';
        }
        char e[4];
        int el = tok_utf8_enc(cp, e);
        if (n->chinese && tok_is_cjk(cp)) {
            if (tok_buf_addc(&a, ' ') || tok_buf_add(&a, e, (size_t)el) || tok_buf_addc(&a, ' '))
                goto nomem;
        } else if (tok_buf_add(&a, e, (size_t)el)) {
            goto nomem;
        }
    }
    if (n->strip_accents) {
        tok_buf b = {0};
        rc = unicode_form(a.p ? a.p : "", a.len, &b, UTF8PROC_DECOMPOSE);
        a.len = 0;
        if (!rc)
            rc = strip_accents(b.p ? b.p : "", b.len, &a, 1);
        tok_buf_free(&b);
        if (rc)
            goto out;
    }
    if (n->lowercase)
        rc = lowercase(a.p ? a.p : "", a.len, out);
    else
        rc = tok_buf_add(out, a.p, a.len);
out:
    tok_buf_free(&a);
    return rc;
nomem:
    tok_buf_free(&a);
    return TERN_ENOMEM;
}

static int norm_one(const tok_norm *n, const char *s, size_t len, tok_buf *out, pcre2_match_data *md)
{
    switch (n->type) {
    case NORM_NFC:
        return unicode_form(s, len, out, UTF8PROC_COMPOSE);
    case NORM_NFD:
        return unicode_form(s, len, out, UTF8PROC_DECOMPOSE);
    case NORM_NFKC:
        return unicode_form(s, len, out, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case NORM_NFKD:
        return unicode_form(s, len, out, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    case NORM_LOWERCASE:
        return lowercase(s, len, out);
    case NORM_STRIP_ACCENTS:
        return strip_accents(s, len, out, 0);
    case NORM_PREPEND:
        if (len && tok_buf_add(out, n->str, n->str_len))
            return TERN_ENOMEM;
        return tok_buf_add(out, s, len);
    case NORM_REPLACE:
        return replace(n, s, len, out, md);
    case NORM_STRIP: {
        size_t a = 0, b = len;
        uint32_t cp;
        while (n->left && a < b) {
            int l = tok_utf8_dec(s + a, b - a, &cp);
            if (!tok_is_whitespace(cp))
                break;
            a += (size_t)l;
        }
        while (n->right && b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80)
                k--;
            tok_utf8_dec(s + k, b - k, &cp);
            if (!tok_is_whitespace(cp))
                break;
            b = k;
        }
        return tok_buf_add(out, s + a, b - a);
    }
    case NORM_BERT:
        return bert(n, s, len, out);
    case NORM_SEQUENCE: {
        tok_buf cur = {0}, nxt = {0};
        int rc = tok_buf_add(&cur, s, len);
        for (size_t i = 0; !rc && i < n->n_subs; i++) {
            nxt.len = 0;
            rc = norm_one(n->subs[i], cur.p, cur.len, &nxt, md);
            tok_buf t = cur;
            cur = nxt;
            nxt = t;
        }
        if (!rc)
            rc = tok_buf_add(out, cur.p, cur.len);
        tok_buf_free(&cur);
        tok_buf_free(&nxt);
        return rc;
    }
    }
    return TERN_EINTERNAL;
}

int tok_normalize(const tok_norm *n, const char *s, size_t len, tok_buf *out, pcre2_match_data *md, tern_err *err)
{
    int rc = n ? norm_one(n, s, len, out, md) : tok_buf_add(out, s, len);
    if (rc)
        return tern_err_set(err, rc, "normalizer failed (%s)", tern_err_name(rc));
    return 0;
}
