/* UTF-8 helpers and the Python str operations templates use (strip, split,
 * replace, case changes, slicing). Python indexes strings by code point, so
 * these work on code points; ASCII-only strings take the byte fast paths. */
#include <string.h>
#include <utf8proc.h>

#include "tpl_int.h"

int32_t utf8_decode(const char *s, size_t n, size_t *clen)
{
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &cp);
    if (k <= 0) {
        *clen = 1;
        return -1;
    }
    *clen = (size_t)k;
    return cp;
}

void utf8_put(tpl_ctx *c, tbuf *b, int32_t cp)
{
    utf8proc_uint8_t t[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, t);
    tbuf_put(c, b, (const char *)t, (size_t)k);
}

size_t utf8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t utf8_offset(const char *s, size_t n, size_t cp)
{
    size_t i = 0, k = 0;
    while (i < n && k < cp) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
        k++;
    }
    return i;
}

/* Python's str.isspace() set: ASCII \t\n\v\f\r, \x1c-\x1f, space, and the
 * Unicode Zs/Zl/Zp/bidi-whitespace code points. */
static int py_isspace_cp(int32_t cp)
{
    if (cp < 0x80)
        return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f);
    switch (cp) {
    case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f:
    case 0x3000:
        return 1;
    }
    return cp >= 0x2000 && cp <= 0x200a;
}

int py_space_at(const char *s, size_t n, size_t *clen)
{
    unsigned char ch = (unsigned char)s[0];
    if (ch < 0x80) {
        *clen = 1;
        return py_isspace_cp(ch);
    }
    int32_t cp = utf8_decode(s, n, clen);
    return cp >= 0 && py_isspace_cp(cp);
}

int py_isprintable(int32_t cp)
{
    if (cp == ' ')
        return 1;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

/* Is the code point at s one of chars (a set of code points)? */
static int in_chars(const char *s, size_t n, const tstr *chars, size_t *clen)
{
    int32_t cp = utf8_decode(s, n, clen);
    for (size_t i = 0; i < chars->len;) {
        size_t l;
        int32_t d = utf8_decode(chars->s + i, chars->len - i, &l);
        if (d == cp && (cp >= 0 || !memcmp(chars->s + i, s, 1)))
            return 1;
        i += l;
    }
    return 0;
}

static int strip_match(const char *s, size_t n, tv chars, size_t *clen)
{
    if (chars.t == TV_STR)
        return in_chars(s, n, chars.u.s, clen);
    return py_space_at(s, n, clen);
}

/* Start offset of the code point ending at byte end. */
static size_t prev_cp(const char *s, size_t end)
{
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

tstr *py_strip(tpl_ctx *c, tstr *s, tv chars, int left, int right)
{
    size_t a = 0, b = s->len, l;
    if (left)
        while (a < b && strip_match(s->s + a, b - a, chars, &l))
            a += l;
    if (right)
        while (b > a) {
            size_t p = prev_cp(s->s, b);
            if (p < a || !strip_match(s->s + p, b - p, chars, &l) || p + l != b)
                break;
            b = p;
        }
    if (a == 0 && b == s->len)
        return s;
    return tstr_new(c, s->s + a, b - a);
}

tstr *py_replace(tpl_ctx *c, tstr *s, tstr *old, tstr *new_, int64_t count)
{
    tbuf b = {0};
    if (count < 0)
        count = INT64_MAX;
    if (old->len == 0) {
        /* inserts new before every code point and at the end */
        size_t i = 0;
        int64_t k = 0;
        while (i <= s->len) {
            if (k < count) {
                tbuf_put(c, &b, new_->s, new_->len);
                k++;
            }
            if (i == s->len)
                break;
            size_t l = 1;
            while (i + l < s->len && ((unsigned char)s->s[i + l] & 0xC0) == 0x80)
                l++;
            tbuf_put(c, &b, s->s + i, l);
            i += l;
        }
        return tbuf_str(c, &b);
    }
    size_t i = 0;
    int64_t k = 0;
    while (i < s->len) {
        const char *hit = k < count ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
        if (!hit)
            break;
        size_t at = (size_t)(hit - s->s);
        tbuf_put(c, &b, s->s + i, at - i);
        tbuf_put(c, &b, new_->s, new_->len);
        i = at + old->len;
        k++;
    }
    if (k == 0)
        return s;
    tbuf_put(c, &b, s->s + i, s->len - i);
    return tbuf_str(c, &b);
}

static int is_cased(int32_t cp)
{
    return utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp ||
           utf8proc_category(cp) == UTF8PROC_CATEGORY_LT;
}

/* Jinja's title filter splits words at runs of '-', whitespace, '(', '{',
 * '[', '<' and capitalizes each piece. */
static int jinja_word_sep(int32_t cp)
{
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace_cp(cp);
}

/* Python's full case mappings that expand to several code points
 * (SpecialCasing.txt, unconditional entries seen in ordinary text);
 * utf8proc only has the one-to-one mappings. */
static const struct {
    int32_t cp;
    const char *upper, *title, *lower; /* NULL: the simple mapping */
} special_case[] = {
    {0x00DF, "SS", "Ss", NULL},             /* ß */
    {0x0130, NULL, NULL, "i\xCC\x87"},      /* İ -> i + U+0307 */
    {0x0149, "\xCA\xBCN", "\xCA\xBCN", NULL}, /* ŉ */
    {0x01F0, "J\xCC\x8C", "J\xCC\x8C", NULL}, /* ǰ */
    {0xFB00, "FF", "Ff", NULL}, {0xFB01, "FI", "Fi", NULL}, {0xFB02, "FL", "Fl", NULL},
    {0xFB03, "FFI", "Ffi", NULL}, {0xFB04, "FFL", "Ffl", NULL}, {0xFB05, "ST", "St", NULL},
    {0xFB06, "ST", "St", NULL},
};

/* Appends the upper ('u'), title ('t') or lower ('l') mapping of cp. */
static void put_cased(tpl_ctx *c, tbuf *b, int32_t cp, int kind)
{
    if (cp == 0xDF || cp == 0x130 || cp == 0x149 || cp == 0x1F0 || (cp >= 0xFB00 && cp <= 0xFB06))
        for (size_t k = 0; k < sizeof special_case / sizeof special_case[0]; k++)
            if (special_case[k].cp == cp) {
                const char *m = kind == 'u' ? special_case[k].upper : kind == 't' ? special_case[k].title
                                                                                  : special_case[k].lower;
                if (m) {
                    tbuf_puts(c, b, m);
                    return;
                }
            }
    utf8_put(c, b, kind == 'u' ? utf8proc_toupper(cp) : kind == 't' ? utf8proc_totitle(cp) : utf8proc_tolower(cp));
}

tstr *py_case(tpl_ctx *c, tstr *s, int mode)
{
    tbuf b = {0};
    int prev_cased = 0, first = 1, prev_sep = 1;
    for (size_t i = 0; i < s->len;) {
        size_t l;
        int32_t cp = utf8_decode(s->s + i, s->len - i, &l);
        if (cp < 0) {
            tbuf_put(c, &b, s->s + i, 1);
            i++;
            continue;
        }
        int kind = 'l';
        switch (mode) {
        case 'u': kind = 'u'; break;
        case 'l': kind = 'l'; break;
        case 'c': kind = first ? 't' : 'l'; break; /* str.capitalize: title-case first */
        case 't':
            kind = prev_cased ? 'l' : 't';
            prev_cased = is_cased(cp);
            break;
        case 'j': { /* jinja's title filter: piece[0].upper() + piece[1:].lower() */
            int sep = jinja_word_sep(cp);
            kind = sep != prev_sep || first ? 'u' : 'l';
            prev_sep = sep;
            break;
        }
        }
        first = 0;
        put_cased(c, &b, cp, kind);
        i += l;
    }
    return tbuf_str(c, &b);
}

tlist *py_split(tpl_ctx *c, tstr *s, tv sep, int64_t maxsplit, int from_right, long pos)
{
    tv *items = NULL;
    size_t n = 0, cap = 0;
#define PUSH(p, len)                                                          \
    do {                                                                      \
        if (n == cap) {                                                       \
            size_t nc = cap ? cap * 2 : 8;                                    \
            tv *ni = tpl_alloc(c, nc * sizeof(tv));                           \
            if (n)                                                            \
                memcpy(ni, items, n * sizeof(tv));                            \
            items = ni;                                                       \
            cap = nc;                                                         \
        }                                                                     \
        items[n++] = tv_str(tstr_new(c, (p), (len)));                         \
    } while (0)
    if (maxsplit < 0)
        maxsplit = INT64_MAX;
    if (sep.t == TV_STR) {
        tstr *t = sep.u.s;
        if (!t->len)
            tpl_fail(c, TERN_EINVAL, pos, "empty separator");
        if (!from_right) {
            size_t i = 0;
            int64_t k = 0;
            for (;;) {
                const char *hit = k < maxsplit ? memmem(s->s + i, s->len - i, t->s, t->len) : NULL;
                if (!hit)
                    break;
                PUSH(s->s + i, (size_t)(hit - s->s) - i);
                i = (size_t)(hit - s->s) + t->len;
                k++;
            }
            PUSH(s->s + i, s->len - i);
        } else {
            size_t end = s->len;
            int64_t k = 0;
            while (k < maxsplit && end >= t->len) {
                size_t j = end - t->len;
                int found = 0;
                for (;; j--) {
                    if (!memcmp(s->s + j, t->s, t->len)) {
                        found = 1;
                        break;
                    }
                    if (j == 0)
                        break;
                }
                if (!found)
                    break;
                PUSH(s->s + j + t->len, end - j - t->len);
                end = j;
                k++;
            }
            PUSH(s->s, end);
            for (size_t a = 0, b = n - 1; a < b; a++, b--) {
                tv x = items[a];
                items[a] = items[b];
                items[b] = x;
            }
        }
    } else if (!from_right) {
        size_t i = 0, l;
        int64_t k = 0;
        for (;;) {
            while (i < s->len && py_space_at(s->s + i, s->len - i, &l))
                i += l;
            if (i >= s->len)
                break;
            if (k >= maxsplit) {
                /* rest, with trailing whitespace kept as Python does */
                PUSH(s->s + i, s->len - i);
                break;
            }
            size_t j = i;
            while (j < s->len && !py_space_at(s->s + j, s->len - j, &l))
                j += l;
            PUSH(s->s + i, j - i);
            k++;
            i = j;
        }
    } else {
        size_t end = s->len, l;
        int64_t k = 0;
        for (;;) {
            while (end > 0) {
                size_t p = prev_cp(s->s, end);
                if (!py_space_at(s->s + p, end - p, &l))
                    break;
                end = p;
            }
            if (end == 0)
                break;
            if (k >= maxsplit) {
                PUSH(s->s, end);
                break;
            }
            size_t j = end;
            while (j > 0) {
                size_t p = prev_cp(s->s, j);
                if (py_space_at(s->s + p, j - p, &l))
                    break;
                j = p;
            }
            PUSH(s->s + j, end - j);
            k++;
            end = j;
        }
        for (size_t a = 0, b = n ? n - 1 : 0; a < b; a++, b--) {
            tv x = items[a];
            items[a] = items[b];
            items[b] = x;
        }
    }
#undef PUSH
    tlist *r = tpl_alloc(c, sizeof *r);
    r->n = n;
    r->tuple = 0;
    r->items = items;
    return r;
}

/* str.splitlines(): breaks at \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85,
 * U+2028, U+2029; drops the break characters. */
tlist *py_splitlines(tpl_ctx *c, tstr *s)
{
    size_t n = 0;
    tstr **parts = tpl_alloc(c, (s->len + 1) * sizeof *parts);
    size_t start = 0, i = 0;
    while (i < s->len) {
        size_t l;
        int32_t cp = utf8_decode(s->s + i, s->len - i, &l);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || (cp >= 0x1c && cp <= 0x1e) ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (brk) {
            parts[n++] = tstr_new(c, s->s + start, i - start);
            if (cp == '\r' && i + 1 < s->len && s->s[i + 1] == '\n')
                l = 2;
            start = i + l;
        }
        i += l;
    }
    if (start < s->len)
        parts[n++] = tstr_new(c, s->s + start, s->len - start);
    tlist *r = tlist_new(c, n);
    for (size_t k = 0; k < n; k++)
        r->items[k] = tv_str(parts[k]);
    return r;
}

tstr *py_slice_str(tpl_ctx *c, tstr *s, int64_t start, int64_t stop, int64_t step, int has_start,
                   int has_stop)
{
    int ascii = 1;
    for (size_t i = 0; i < s->len && ascii; i++)
        ascii = (unsigned char)s->s[i] < 0x80;
    int64_t n = ascii ? (int64_t)s->len : (int64_t)utf8_len(s->s, s->len);
    /* Python slice.indices() */
    int64_t lo, hi;
    if (step > 0) {
        lo = has_start ? start : 0;
        hi = has_stop ? stop : n;
        if (lo < 0) lo = lo + n < 0 ? 0 : lo + n;
        if (lo > n) lo = n;
        if (hi < 0) hi = hi + n < 0 ? 0 : hi + n;
        if (hi > n) hi = n;
    } else {
        lo = has_start ? start : n - 1;
        hi = has_stop ? stop : -1 - n; /* sentinel: before index 0 */
        if (lo < 0) lo = lo + n < 0 ? -1 : lo + n;
        if (lo >= n) lo = n - 1;
        if (has_stop) {
            if (hi < 0) hi = hi + n < 0 ? -1 : hi + n;
            if (hi >= n) hi = n - 1;
        } else {
            hi = -1;
        }
    }
    if (ascii && step == 1)
        return tstr_new(c, s->s + lo, hi > lo ? (size_t)(hi - lo) : 0);
    /* general case: collect code point offsets */
    size_t *off = tpl_alloc(c, ((size_t)n + 1) * sizeof *off);
    size_t i = 0;
    for (int64_t k = 0; k < n; k++) {
        off[k] = i;
        i++;
        while (!ascii && i < s->len && ((unsigned char)s->s[i] & 0xC0) == 0x80)
            i++;
    }
    off[n] = s->len;
    tbuf b = {0};
    size_t cnt = slice_count(lo, hi, step);
    for (size_t j = 0; j < cnt; j++) {
        int64_t k = lo + (int64_t)j * step; /* stays within [0, n) */
        tbuf_put(c, &b, s->s + off[k], off[k + 1] - off[k]);
    }
    return b.len ? tbuf_str(c, &b) : tstr_new(c, "", 0);
}
