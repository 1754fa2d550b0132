/* Pre-tokenizers of tokenizer.json ("pre_tokenizer"): parsing and
 * application. A pre-tokenizer maps a list of pieces to a finer list; pieces
 * that are already added tokens pass through untouched. Splitting follows
 * HF's NormalizedString::split: find (range, is_match) segments, optionally
 * invert, fold them by the delimiter behavior, drop removed/empty ones. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "tok_int.h"

/* GPT-2's pre-tokenization regex, used by ByteLevel with use_regex. */
static const char GPT2_RE[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
/* \w+|[^\w\s]+; tok_pattern_parse gives \w Oniguruma's Unicode meaning. */
static const char WHITESPACE_RE[] = "\\w+|[^\\w\\s]+";

int tok_pieces_push(tok_pieces *p, const char *s, size_t len, int32_t id, int first)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 16;
        tok_piece *v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return TERN_ENOMEM;
        p->v = v;
        p->cap = cap;
    }
    size_t off = p->text.len;
    if (tok_buf_add(&p->text, s, len))
        return TERN_ENOMEM;
    p->v[p->n++] = (tok_piece){off, len, id, (uint8_t)first};
    return 0;
}

void tok_pieces_free(tok_pieces *p)
{
    free(p->v);
    tok_buf_free(&p->text);
    memset(p, 0, sizeof *p);
}

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

void tok_pre_free(tok_pre *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n_subs; i++)
        tok_pre_free(p->subs[i]);
    free(p->subs);
    tok_pattern_free(&p->pat);
    free(p);
}

static int compile_re(tok_pattern *pat, const char *re, tern_err *err)
{
    json_object *o = json_object_new_object();
    if (!o)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    json_object_object_add(o, "Regex", json_object_new_string(re));
    int rc = tok_pattern_parse(pat, o, "pre-tokenizer", err);
    json_object_put(o);
    return rc;
}

static int parse_behavior(json_object *v, int *out, tern_err *err)
{
    const char *s = v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : "";
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    return tern_err_set(err, TERN_EFORMAT, "unknown split behavior '%s'", s);
}

static int parse_scheme(json_object *o, int *out, tern_err *err)
{
    json_object *v = jget(o, "prepend_scheme");
    if (!v) { /* legacy add_prefix_space */
        *out = jbool(o, "add_prefix_space", 1) ? PREPEND_ALWAYS : PREPEND_NEVER;
        return 0;
    }
    const char *s = json_object_get_string(v);
    if (!strcmp(s, "always"))
        *out = PREPEND_ALWAYS;
    else if (!strcmp(s, "first"))
        *out = PREPEND_FIRST;
    else if (!strcmp(s, "never"))
        *out = PREPEND_NEVER;
    else
        return tern_err_set(err, TERN_EFORMAT, "unknown prepend_scheme '%s'", s);
    return 0;
}

int tok_parse_char(json_object *o, const char *key, const char *dflt, char out[8], size_t *len, tern_err *err)
{
    json_object *v = jget(o, key);
    const char *s = v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : dflt;
    size_t n = strlen(s);
    if (n == 0 || n > 4 || (size_t)tok_utf8_valid_len(s, n) != n)
        return tern_err_set(err, TERN_EFORMAT, "'%s' must be a single character", key);
    memcpy(out, s, n);
    out[n] = 0;
    *len = n;
    return 0;
}

int tok_pre_parse(tok_pre **out, json_object *o, tern_err *err)
{
    *out = NULL;
    if (!o)
        return 0;
    json_object *tv = jget(o, "type");
    if (!json_object_is_type(o, json_type_object) || !tv || !json_object_is_type(tv, json_type_string))
        return tern_err_set(err, TERN_EFORMAT, "pre_tokenizer without a type");
    const char *t = json_object_get_string(tv);
    tok_pre *p = calloc(1, sizeof *p);
    if (!p)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    int rc = 0;
    if (!strcmp(t, "Sequence")) {
        p->type = PRE_SEQUENCE;
        json_object *arr = jget(o, "pretokenizers");
        if (!arr || !json_object_is_type(arr, json_type_array)) {
            rc = tern_err_set(err, TERN_EFORMAT, "pre_tokenizer Sequence needs 'pretokenizers'");
            goto out;
        }
        size_t k = json_object_array_length(arr);
        p->subs = calloc(k ? k : 1, sizeof *p->subs);
        if (!p->subs) {
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < k; i++) {
            rc = tok_pre_parse(&p->subs[p->n_subs], json_object_array_get_idx(arr, i), err);
            if (rc)
                goto out;
            if (p->subs[p->n_subs])
                p->n_subs++;
        }
    } else if (!strcmp(t, "ByteLevel")) {
        p->type = PRE_BYTELEVEL;
        p->add_prefix_space = jbool(o, "add_prefix_space", 1);
        p->use_regex = jbool(o, "use_regex", 1);
        if (p->use_regex)
            rc = compile_re(&p->pat, GPT2_RE, err);
    } else if (!strcmp(t, "Split")) {
        p->type = PRE_SPLIT;
        rc = tok_pattern_parse(&p->pat, jget(o, "pattern"), "pre_tokenizer Split", err);
        if (!rc)
            rc = parse_behavior(jget(o, "behavior"), &p->behavior, err);
        p->invert = jbool(o, "invert", 0);
    } else if (!strcmp(t, "Metaspace")) {
        p->type = PRE_METASPACE;
        rc = tok_parse_char(o, "replacement", "\xE2\x96\x81", p->repl, &p->repl_len, err);
        if (!rc)
            rc = parse_scheme(o, &p->prepend_scheme, err);
        p->split = jbool(o, "split", 1);
    } else if (!strcmp(t, "Digits")) {
        p->type = PRE_DIGITS;
        p->individual_digits = jbool(o, "individual_digits", 0);
    } else if (!strcmp(t, "Punctuation")) {
        p->type = PRE_PUNCTUATION;
        p->behavior = SPLIT_ISOLATED;
        if (jget(o, "behavior"))
            rc = parse_behavior(jget(o, "behavior"), &p->behavior, err);
    } else if (!strcmp(t, "Whitespace")) {
        p->type = PRE_WHITESPACE;
        rc = compile_re(&p->pat, WHITESPACE_RE, err);
    } else if (!strcmp(t, "WhitespaceSplit")) {
        p->type = PRE_WHITESPACE_SPLIT;
    } else if (!strcmp(t, "BertPreTokenizer")) {
        p->type = PRE_BERT;
    } else if (!strcmp(t, "CharDelimiterSplit")) {
        p->type = PRE_CHAR_DELIMITER;
        char c[8];
        size_t n;
        rc = tok_parse_char(o, "delimiter", "", c, &n, err);
        if (!rc)
            tok_utf8_dec(c, n, &p->delim);
    } else {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "unsupported pre_tokenizer type '%s'", t);
    }
out:
    if (rc) {
        tok_pre_free(p);
        return rc;
    }
    *out = p;
    return 0;
}

/* ---- splitting --------------------------------------------------------- */
typedef struct seg {
    size_t a, b;
    int flag; /* is_match before folding, "remove" after */
} seg;

typedef struct segs {
    seg *v;
    size_t n, cap;
} segs;

static int segs_push(segs *s, size_t a, size_t b, int flag)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 32;
        seg *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return TERN_ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = (seg){a, b, flag};
    return 0;
}

enum { CHAR_NUMERIC, CHAR_PUNCT, CHAR_WHITESPACE, CHAR_EQ };

static int char_pred(int kind, uint32_t cp, uint32_t delim)
{
    switch (kind) {
    case CHAR_NUMERIC:
        return tok_is_numeric(cp);
    case CHAR_PUNCT:
        return tok_is_punct(cp);
    case CHAR_WHITESPACE:
        return tok_is_whitespace(cp);
    default:
        return cp == delim;
    }
}

/* (range, is_match) segments of s for a character predicate. */
static int find_chars(const char *s, size_t n, int kind, uint32_t delim, segs *out)
{
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tok_utf8_dec(s + i, n - i, &cp);
        if (char_pred(kind, cp, delim)) {
            if (last < i && segs_push(out, last, i, 0))
                return TERN_ENOMEM;
            if (segs_push(out, i, i + (size_t)l, 1))
                return TERN_ENOMEM;
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (last < n && segs_push(out, last, n, 0))
        return TERN_ENOMEM;
    return 0;
}

static int find_pattern(const tok_pattern *pat, const char *s, size_t n, segs *out, pcre2_match_data *md)
{
    size_t prev = 0, from = 0, ms, me;
    if (!pat->re && pat->lit_len == 0)
        return segs_push(out, 0, n, 0);
    while (from <= n) {
        int r = tok_pattern_find(pat, s, n, from, &ms, &me, md);
        if (r < 0)
            return r;
        if (!r)
            break;
        if (prev != ms && segs_push(out, prev, ms, 0))
            return TERN_ENOMEM;
        if (segs_push(out, ms, me, 1))
            return TERN_ENOMEM;
        prev = me;
        if (me == ms) {
            if (me >= n)
                break;
            uint32_t cp;
            from = me + (size_t)tok_utf8_dec(s + me, n - me, &cp);
        } else {
            from = me;
        }
    }
    if (prev != n && segs_push(out, prev, n, 0))
        return TERN_ENOMEM;
    return 0;
}

/* Folds segments by behavior into (range, remove) in place. */
static void fold(segs *g, int behavior)
{
    size_t k = 0;
    int prev_match = 0;
    switch (behavior) {
    case SPLIT_REMOVED:
        return;
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < g->n; i++)
            g->v[i].flag = 0;
        return;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < g->n; i++) {
            seg x = g->v[i];
            if (x.flag && !prev_match && k > 0)
                g->v[k - 1].b = x.b;
            else
                g->v[k++] = (seg){x.a, x.b, 0};
            prev_match = x.flag;
        }
        g->n = k;
        return;
    case SPLIT_MERGED_NEXT: {
        /* right to left, then the kept ones are in reverse order */
        size_t w = g->n;
        for (size_t i = g->n; i-- > 0;) {
            seg x = g->v[i];
            if (x.flag && !prev_match && w < g->n)
                g->v[w].a = x.a;
            else
                g->v[--w] = (seg){x.a, x.b, 0};
            prev_match = x.flag;
        }
        memmove(g->v, g->v + w, (g->n - w) * sizeof *g->v);
        g->n -= w;
        return;
    }
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < g->n; i++) {
            seg x = g->v[i];
            if (x.flag == prev_match && k > 0)
                g->v[k - 1].b = x.b;
            else
                g->v[k++] = (seg){x.a, x.b, 0};
            prev_match = x.flag;
        }
        g->n = k;
        return;
    }
}

/* Emits the kept segments of s as pieces of out. */
static int emit(tok_pieces *out, const char *s, segs *g, int first)
{
    for (size_t i = 0; i < g->n; i++) {
        seg x = g->v[i];
        if (x.flag || x.b <= x.a)
            continue;
        if (tok_pieces_push(out, s + x.a, x.b - x.a, -1, first && x.a == 0))
            return TERN_ENOMEM;
    }
    return 0;
}

static int byte_level_map(tok_pieces *out, const char *s, size_t n, int first)
{
    if (n == 0)
        return 0;
    /* build the mapped text in place at the end of out's buffer */
    size_t off = out->text.len;
    if (tok_buf_reserve(&out->text, n * 2) || tok_pieces_push(out, "", 0, -1, first))
        return TERN_ENOMEM;
    char *buf = out->text.p + off;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t cp = tok_byte_to_cp[(unsigned char)s[i]];
        if (cp < 0x80) {
            buf[k++] = (char)cp;
        } else {
            buf[k++] = (char)(0xC0 | (cp >> 6));
            buf[k++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out->text.len = off + k;
    out->text.p[out->text.len] = 0;
    out->v[out->n - 1].len = k;
    return 0;
}

/* Applies a non-sequence pre-tokenizer to one piece. */
static int pre_one(const tok_pre *p, const char *s, size_t n, int first, tok_pieces *out, segs *g,
                   tok_buf *tmp, pcre2_match_data *md)
{
    int rc = 0;
    g->n = 0;
    switch (p->type) {
    case PRE_BYTELEVEL: {
        tmp->len = 0;
        if (p->add_prefix_space && (n == 0 || s[0] != ' ') && tok_buf_addc(tmp, ' '))
            return TERN_ENOMEM;
        if (tok_buf_add(tmp, s, n))
            return TERN_ENOMEM;
        if (!p->use_regex)
            return byte_level_map(out, tmp->p, tmp->len, first);
        if ((rc = find_pattern(&p->pat, tmp->p, tmp->len, g, md)))
            return rc;
        for (size_t i = 0; i < g->n; i++)
            if (g->v[i].b > g->v[i].a &&
                (rc = byte_level_map(out, tmp->p + g->v[i].a, g->v[i].b - g->v[i].a, first && g->v[i].a == 0)))
                return rc;
        return 0;
    }
    case PRE_SPLIT:
        if ((rc = find_pattern(&p->pat, s, n, g, md)))
            return rc;
        if (p->invert)
            for (size_t i = 0; i < g->n; i++)
                g->v[i].flag = !g->v[i].flag;
        fold(g, p->behavior);
        return emit(out, s, g, first);
    case PRE_METASPACE: {
        tmp->len = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] == ' ' ? tok_buf_add(tmp, p->repl, p->repl_len) : tok_buf_addc(tmp, s[i]))
                return TERN_ENOMEM;
        }
        int starts = tmp->len >= p->repl_len && !memcmp(tmp->p, p->repl, p->repl_len);
        if (!starts && (p->prepend_scheme == PREPEND_ALWAYS || (p->prepend_scheme == PREPEND_FIRST && first))) {
            tok_buf t2 = {0};
            if (tok_buf_add(&t2, p->repl, p->repl_len) || tok_buf_add(&t2, tmp->p, tmp->len)) {
                tok_buf_free(&t2);
                return TERN_ENOMEM;
            }
            tok_buf_free(tmp);
            *tmp = t2;
        }
        if (!p->split)
            return tmp->len ? tok_pieces_push(out, tmp->p, tmp->len, -1, first) : 0;
        tok_pattern lit = {.lit = (char *)p->repl, .lit_len = p->repl_len};
        if ((rc = find_pattern(&lit, tmp->p, tmp->len, g, md)))
            return rc;
        fold(g, SPLIT_MERGED_NEXT);
        return emit(out, tmp->p, g, first);
    }
    case PRE_DIGITS:
        if ((rc = find_chars(s, n, CHAR_NUMERIC, 0, g)))
            return rc;
        fold(g, p->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS);
        return emit(out, s, g, first);
    case PRE_PUNCTUATION:
        if ((rc = find_chars(s, n, CHAR_PUNCT, 0, g)))
            return rc;
        fold(g, p->behavior);
        return emit(out, s, g, first);
    case PRE_WHITESPACE:
        if ((rc = find_pattern(&p->pat, s, n, g, md)))
            return rc;
        for (size_t i = 0; i < g->n; i++)
            g->v[i].flag = !g->v[i].flag; /* keep the matches */
        return emit(out, s, g, first);
    case PRE_WHITESPACE_SPLIT:
        if ((rc = find_chars(s, n, CHAR_WHITESPACE, 0, g)))
            return rc;
        return emit(out, s, g, first);
    case PRE_CHAR_DELIMITER:
        if ((rc = find_chars(s, n, CHAR_EQ, p->delim, g)))
            return rc;
        return emit(out, s, g, first);
    case PRE_BERT: {
        if ((rc = find_chars(s, n, CHAR_WHITESPACE, 0, g)))
            return rc;
        segs g2 = {0};
        for (size_t i = 0; i < g->n && !rc; i++) {
            seg x = g->v[i];
            if (x.flag || x.b <= x.a)
                continue;
            g2.n = 0;
            rc = find_chars(s + x.a, x.b - x.a, CHAR_PUNCT, 0, &g2);
            if (!rc) {
                fold(&g2, SPLIT_ISOLATED);
                rc = emit(out, s + x.a, &g2, first && x.a == 0);
            }
        }
        free(g2.v);
        return rc;
    }
    }
    return TERN_EINTERNAL;
}

static int pre_apply(const tok_pre *p, tok_pieces *in, tok_pieces *out, segs *g, tok_buf *tmp,
                     pcre2_match_data *md)
{
    if (p->type == PRE_SEQUENCE) {
        for (size_t i = 0; i < p->n_subs; i++) {
            int rc = pre_apply(p->subs[i], in, out, g, tmp, md);
            if (rc)
                return rc;
        }
        return 0;
    }
    out->n = 0;
    out->text.len = 0;
    for (size_t i = 0; i < in->n; i++) {
        tok_piece x = in->v[i];
        int rc;
        if (x.id >= 0)
            rc = tok_pieces_push(out, in->text.p + x.off, x.len, x.id, x.first);
        else
            rc = pre_one(p, in->text.p + x.off, x.len, x.first, out, g, tmp, md);
        if (rc)
            return rc;
    }
    tok_pieces t = *in;
    *in = *out;
    *out = t;
    return 0;
}

int tok_pretokenize(const tok_pre *pre, tok_pieces *in, tok_pieces *scratch, pcre2_match_data *md, tern_err *err)
{
    if (!pre)
        return 0;
    segs g = {0};
    tok_buf tmp = {0};
    int rc = pre_apply(pre, in, scratch, &g, &tmp, md);
    free(g.v);
    tok_buf_free(&tmp);
    if (rc)
        return tern_err_set(err, rc, "pre-tokenizer failed (%s)", tern_err_name(rc));
    return 0;
}
