/* Regex -> EBNF. A recursive-descent parser (ECMAScript-flavoured syntax, as
 * JSON Schema's `pattern` uses) builds a small AST; an emitter writes it as
 * an EBNF expression over raw text or over JSON-string character units.
 * Constructs a grammar cannot express (backreferences, lookaround, word
 * boundaries, inline flags) are TERN_EUNSUPPORTED with their offset. */
#include <stdlib.h>
#include <string.h>

#include "fe_int.h"
#include "regex.h"
#include "regex_int.h"

/* Nesting deeper than this is refused: keeps recursion bounded on hostile
 * input (no real pattern nests 100 groups). */
#define RX_MAX_DEPTH 100
/* Largest repetition count accepted in {m,n}: bigger bounds are almost
 * certainly mistakes and would make huge grammars downstream. */
#define RX_MAX_REPEAT 10000
#define RX_MAX_NODES 100000

typedef struct rx_parser {
    const char *s;
    size_t n, i;
    int depth, n_nodes;
    int json_mode;
    tern_err *err;
    int rc;
} rx_parser;

static void rx_free(rx *x)
{
    if (!x)
        return;
    for (int i = 0; i < x->n_kids; i++)
        rx_free(x->kids[i]);
    free(x->kids);
    gfe_cset_free(&x->set);
    free(x);
}

static int fail(rx_parser *p, int code, const char *what)
{
    if (!p->rc)
        p->rc = tern_err_set_pos(p->err, code, (long)p->i, "regex: %s at offset %zu", what, p->i);
    return p->rc;
}

static rx *node(rx_parser *p, enum rx_kind k)
{
    if (++p->n_nodes > RX_MAX_NODES) {
        fail(p, TERN_EFULL, "too many regex nodes");
        return NULL;
    }
    rx *x = calloc(1, sizeof *x);
    if (!x) {
        fail(p, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    x->kind = k;
    return x;
}

static int add_kid(rx_parser *p, rx *x, rx *k)
{
    if (x->n_kids == x->cap_kids) {
        int cap = x->cap_kids ? x->cap_kids * 2 : 4;
        rx **kk = realloc(x->kids, (size_t)cap * sizeof *kk);
        if (!kk) {
            rx_free(k);
            return fail(p, TERN_ENOMEM, "out of memory");
        }
        x->kids = kk;
        x->cap_kids = cap;
    }
    x->kids[x->n_kids++] = k;
    return 0;
}

static void add_class_d(gfe_cset *c) { gfe_cset_add(c, '0', '9'); }
static void add_class_w(gfe_cset *c)
{
    gfe_cset_add(c, '0', '9');
    gfe_cset_add(c, 'A', 'Z');
    gfe_cset_add(c, 'a', 'z');
    gfe_cset_add(c, '_', '_');
}
static void add_class_s(gfe_cset *c)
{
    /* ECMAScript WhiteSpace + LineTerminator */
    gfe_cset_add(c, 9, 13);
    gfe_cset_add(c, ' ', ' ');
    gfe_cset_add(c, 0xA0, 0xA0);
    gfe_cset_add(c, 0x1680, 0x1680);
    gfe_cset_add(c, 0x2000, 0x200A);
    gfe_cset_add(c, 0x2028, 0x2029);
    gfe_cset_add(c, 0x202F, 0x202F);
    gfe_cset_add(c, 0x205F, 0x205F);
    gfe_cset_add(c, 0x3000, 0x3000);
    gfe_cset_add(c, 0xFEFF, 0xFEFF);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int read_hex(rx_parser *p, int ndig, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < ndig; k++) {
        if (p->i >= p->n || hexval(p->s[p->i]) < 0)
            return fail(p, TERN_EFORMAT, "bad hex escape");
        v = v * 16 + (uint32_t)hexval(p->s[p->i++]);
    }
    *out = v;
    return 0;
}

/* Parses the escape after a backslash (p->i at the char after '\').
 * Either fills *cp (single codepoint, returns 0) or adds a class to set and
 * sets *is_set. in_class: inside [...] (\b is backspace there). */
static int parse_escape(rx_parser *p, int in_class, gfe_cset *set, int *is_set, uint32_t *cp)
{
    *is_set = 0;
    if (p->i >= p->n)
        return fail(p, TERN_EFORMAT, "trailing backslash");
    char c = p->s[p->i++];
    switch (c) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S': {
        gfe_cset tmp = {0};
        char l = (char)(c | 0x20);
        if (l == 'd')
            add_class_d(&tmp);
        else if (l == 'w')
            add_class_w(&tmp);
        else
            add_class_s(&tmp);
        if (c != l)
            gfe_cset_negate(&tmp);
        gfe_cset_add_set(set, &tmp);
        gfe_cset_free(&tmp);
        *is_set = 1;
        return 0;
    }
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0':
        if (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
            return fail(p, TERN_EUNSUPPORTED, "octal escape unsupported");
        *cp = 0;
        return 0;
    case 'x': return read_hex(p, 2, cp);
    case 'u':
        if (p->i < p->n && p->s[p->i] == '{') {
            p->i++;
            uint32_t v = 0;
            int nd = 0;
            while (p->i < p->n && hexval(p->s[p->i]) >= 0 && nd < 7) {
                v = v * 16 + (uint32_t)hexval(p->s[p->i++]);
                nd++;
            }
            if (!nd || p->i >= p->n || p->s[p->i] != '}' || v > GFE_CP_MAX)
                return fail(p, TERN_EFORMAT, "bad \\u{...} escape");
            p->i++;
            *cp = v;
            return 0;
        }
        if (read_hex(p, 4, cp))
            return p->rc;
        if (*cp >= 0xD800 && *cp <= 0xDBFF && p->i + 6 <= p->n && p->s[p->i] == '\\' &&
            p->s[p->i + 1] == 'u') {
            size_t save = p->i;
            uint32_t lo;
            p->i += 2;
            if (read_hex(p, 4, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
                return 0;
            }
            p->rc = 0;
            tern_err_clear(p->err);
            p->i = save;
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return fail(p, TERN_EUNSUPPORTED, "lone surrogate escape unsupported");
        return 0;
    case 'b':
        if (in_class) {
            *cp = 8;
            return 0;
        }
        p->i--;
        return fail(p, TERN_EUNSUPPORTED, "word boundary \\b unsupported");
    case 'B':
        p->i--;
        return fail(p, TERN_EUNSUPPORTED, "\\B unsupported");
    default:
        break;
    }
    if (c >= '1' && c <= '9') {
        p->i--;
        return fail(p, TERN_EUNSUPPORTED, "backreference unsupported");
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        p->i--;
        return fail(p, TERN_EUNSUPPORTED, "escape sequence unsupported");
    }
    if ((unsigned char)c >= 0x80) {
        p->i--;
        int k = gfe_utf8_get(p->s + p->i, p->n - p->i, cp);
        if (k < 0)
            return fail(p, TERN_EFORMAT, "invalid UTF-8");
        p->i += (size_t)k;
        return 0;
    }
    *cp = (unsigned char)c; /* escaped punctuation is itself */
    return 0;
}

static int next_cp(rx_parser *p, uint32_t *cp)
{
    int k = gfe_utf8_get(p->s + p->i, p->n - p->i, cp);
    if (k < 0)
        return fail(p, TERN_EFORMAT, "invalid UTF-8");
    p->i += (size_t)k;
    return 0;
}

static rx *parse_class(rx_parser *p)
{
    rx *x = node(p, RX_SET);
    if (!x)
        return NULL;
    int neg = 0;
    if (p->i < p->n && p->s[p->i] == '^') {
        neg = 1;
        p->i++;
    }
    int first = 1;
    for (;;) {
        if (p->i >= p->n) {
            fail(p, TERN_EFORMAT, "unterminated character class");
            goto out_fail;
        }
        if (p->s[p->i] == ']' && !first)
            break;
        if (p->s[p->i] == ']' && first) {
            /* ECMAScript: [] matches nothing, [^] matches anything */
            break;
        }
        first = 0;
        uint32_t lo;
        int is_set = 0;
        if (p->s[p->i] == '[' && p->i + 1 < p->n && p->s[p->i + 1] == ':') {
            fail(p, TERN_EUNSUPPORTED, "POSIX class unsupported");
            goto out_fail;
        }
        if (p->s[p->i] == '\\') {
            p->i++;
            if (parse_escape(p, 1, &x->set, &is_set, &lo))
                goto out_fail;
        } else if (next_cp(p, &lo)) {
            goto out_fail;
        }
        if (is_set)
            continue;
        uint32_t hi = lo;
        if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
            p->i++;
            if (p->s[p->i] == '\\') {
                p->i++;
                if (parse_escape(p, 1, &x->set, &is_set, &hi))
                    goto out_fail;
                if (is_set) {
                    fail(p, TERN_EFORMAT, "class escape as range end");
                    goto out_fail;
                }
            } else if (next_cp(p, &hi)) {
                goto out_fail;
            }
            if (hi < lo) {
                fail(p, TERN_EFORMAT, "range out of order in character class");
                goto out_fail;
            }
        }
        gfe_cset_add(&x->set, lo, hi);
    }
    p->i++; /* ']' */
    if (neg)
        gfe_cset_negate(&x->set);
    if (x->set.oom) {
        fail(p, TERN_ENOMEM, "out of memory");
        goto out_fail;
    }
    return x;
out_fail:
    rx_free(x);
    return NULL;
}

static rx *parse_alt(rx_parser *p);

static int parse_int(rx_parser *p, int *out)
{
    size_t start = p->i;
    long v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (p->s[p->i++] - '0');
        if (v > 1000000000)
            v = 1000000000;
    }
    *out = (int)v;
    return p->i > start;
}

/* At '{': a valid {m}, {m,}, {m,n} sets min/max and returns 1; otherwise
 * leaves p->i and returns 0 (the brace is then a literal). */
static int parse_braces(rx_parser *p, int *mn, int *mx)
{
    size_t save = p->i;
    p->i++;
    if (!parse_int(p, mn))
        goto literal;
    *mx = *mn;
    if (p->i < p->n && p->s[p->i] == ',') {
        p->i++;
        if (!parse_int(p, mx))
            *mx = -1;
    }
    if (p->i >= p->n || p->s[p->i] != '}')
        goto literal;
    p->i++;
    return 1;
literal:
    p->i = save;
    return 0;
}

static rx *parse_atom(rx_parser *p)
{
    char c = p->s[p->i];
    rx *x;
    if (c == '(') {
        p->i++;
        if (p->i < p->n && p->s[p->i] == '?') {
            if (p->i + 1 < p->n && p->s[p->i + 1] == ':') {
                p->i += 2;
            } else if (p->i + 1 < p->n && (p->s[p->i + 1] == '<' || p->s[p->i + 1] == 'P') &&
                       p->i + 2 < p->n && p->s[p->i + 2] != '=' && p->s[p->i + 2] != '!') {
                /* named group (?<name>...) or (?P<name>...) */
                while (p->i < p->n && p->s[p->i] != '>')
                    p->i++;
                if (p->i >= p->n) {
                    fail(p, TERN_EFORMAT, "unterminated group name");
                    return NULL;
                }
                p->i++;
            } else if (p->i + 1 < p->n && (p->s[p->i + 1] == '=' || p->s[p->i + 1] == '!' ||
                                           p->s[p->i + 1] == '<')) {
                fail(p, TERN_EUNSUPPORTED, "lookaround unsupported");
                return NULL;
            } else {
                fail(p, TERN_EUNSUPPORTED, "inline group flags unsupported");
                return NULL;
            }
        }
        if (++p->depth > RX_MAX_DEPTH) {
            fail(p, TERN_EUNSUPPORTED, "groups nested too deeply");
            return NULL;
        }
        x = parse_alt(p);
        p->depth--;
        if (!x)
            return NULL;
        if (p->i >= p->n || p->s[p->i] != ')') {
            rx_free(x);
            fail(p, TERN_EFORMAT, "missing )");
            return NULL;
        }
        p->i++;
        return x;
    }
    if (c == '[') {
        p->i++;
        return parse_class(p);
    }
    if (c == '^' || c == '$') {
        p->i++;
        return node(p, c == '^' ? RX_BOL : RX_EOL);
    }
    if (c == '*' || c == '+' || c == '?') {
        fail(p, TERN_EFORMAT, "nothing to repeat");
        return NULL;
    }
    if (c == ')') {
        fail(p, TERN_EFORMAT, "unmatched )");
        return NULL;
    }
    x = node(p, RX_SET);
    if (!x)
        return NULL;
    uint32_t cp;
    if (c == '.') {
        p->i++;
        gfe_cset_add(&x->set, '\n', '\n');
        if (p->json_mode) { /* ECMAScript line terminators */
            gfe_cset_add(&x->set, '\r', '\r');
            gfe_cset_add(&x->set, 0x2028, 0x2029);
        }
        gfe_cset_negate(&x->set);
    } else if (c == '\\') {
        p->i++;
        int is_set;
        if (parse_escape(p, 0, &x->set, &is_set, &cp)) {
            rx_free(x);
            return NULL;
        }
        if (!is_set)
            gfe_cset_add(&x->set, cp, cp);
    } else {
        if (next_cp(p, &cp)) {
            rx_free(x);
            return NULL;
        }
        gfe_cset_add(&x->set, cp, cp);
    }
    if (x->set.oom) {
        rx_free(x);
        fail(p, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    return x;
}

static rx *parse_cat(rx_parser *p)
{
    rx *cat = node(p, RX_CAT);
    if (!cat)
        return NULL;
    while (p->i < p->n && p->s[p->i] != '|' && p->s[p->i] != ')') {
        rx *a;
        int mn, mx;
        if (p->s[p->i] == '{' && parse_braces(p, &mn, &mx)) {
            fail(p, TERN_EFORMAT, "nothing to repeat");
            goto out_fail;
        }
        if (p->s[p->i] == '{') { /* literal brace */
            a = node(p, RX_SET);
            if (!a)
                goto out_fail;
            gfe_cset_add(&a->set, '{', '{');
            p->i++;
        } else {
            a = parse_atom(p);
            if (!a)
                goto out_fail;
        }
        while (p->i < p->n) {
            char q = p->s[p->i];
            if (q == '*') {
                mn = 0, mx = -1, p->i++;
            } else if (q == '+') {
                mn = 1, mx = -1, p->i++;
            } else if (q == '?') {
                mn = 0, mx = 1, p->i++;
            } else if (q == '{' && parse_braces(p, &mn, &mx)) {
                if ((mx >= 0 && mx < mn) || mn > RX_MAX_REPEAT || mx > RX_MAX_REPEAT) {
                    rx_free(a);
                    fail(p, mx >= 0 && mx < mn ? TERN_EFORMAT : TERN_EUNSUPPORTED,
                         mx >= 0 && mx < mn ? "bad repetition bounds"
                                            : "repetition count too large");
                    goto out_fail;
                }
            } else {
                break;
            }
            if (a->kind == RX_BOL || a->kind == RX_EOL) {
                rx_free(a);
                fail(p, TERN_EFORMAT, "nothing to repeat");
                goto out_fail;
            }
            if (p->i < p->n && p->s[p->i] == '?') {
                p->i++; /* lazy: same language */
            } else if (p->i < p->n && p->s[p->i] == '+') {
                rx_free(a);
                fail(p, TERN_EUNSUPPORTED, "possessive quantifier unsupported");
                goto out_fail;
            }
            rx *r = node(p, RX_REP);
            if (!r || add_kid(p, r, a)) {
                if (r)
                    rx_free(r);
                else
                    rx_free(a);
                goto out_fail;
            }
            r->min = mn;
            r->max = mx;
            a = r;
        }
        if (add_kid(p, cat, a))
            goto out_fail;
    }
    return cat;
out_fail:
    rx_free(cat);
    return NULL;
}

static rx *parse_alt(rx_parser *p)
{
    rx *alt = node(p, RX_ALT);
    if (!alt)
        return NULL;
    for (;;) {
        rx *c = parse_cat(p);
        if (!c || add_kid(p, alt, c)) {
            rx_free(alt);
            return NULL;
        }
        if (p->i < p->n && p->s[p->i] == '|') {
            p->i++;
            continue;
        }
        return alt;
    }
}

/* ---------------------------------------------------------------- emit */

typedef struct rx_emit {
    gfe_buf *b;
    int json;
    rx_parser *p;
} rx_emit;

static int is_plain_cp(const rx *x, int json)
{
    if (x->kind != RX_SET || x->set.n != 1 || x->set.r[0].lo != x->set.r[0].hi)
        return 0;
    uint32_t c = x->set.r[0].lo;
    if (!json)
        return 1;
    return c >= 0x20 && c < 0x7f && c != '"' && c != '\\';
}

/* Returns 1 if x matches nothing (nothing written), 0 otherwise, <0 error. */
static int never(const rx *x)
{
    switch (x->kind) {
    case RX_SET: return x->set.n == 0;
    case RX_CAT:
        for (int i = 0; i < x->n_kids; i++)
            if (never(x->kids[i]))
                return 1;
        return 0;
    case RX_ALT:
        for (int i = 0; i < x->n_kids; i++)
            if (!never(x->kids[i]))
                return 0;
        return 1;
    case RX_REP: return x->min > 0 && never(x->kids[0]);
    default: return 0;
    }
}

static int emit(rx_emit *e, const rx *x)
{
    gfe_buf *b = e->b;
    switch (x->kind) {
    case RX_EMPTY:
        gfe_buf_puts(b, "\"\"");
        return 0;
    case RX_BOL:
    case RX_EOL:
        return fail(e->p, TERN_EUNSUPPORTED, "anchor ^ or $ inside the regex unsupported");
    case RX_SET:
        if (e->json)
            gfe_cset_emit_json(b, &x->set);
        else
            gfe_cset_emit_raw(b, &x->set);
        return 0;
    case RX_REP:
        if (never(x->kids[0]) || x->max == 0) {
            gfe_buf_puts(b, "\"\"");
            return 0;
        }
        gfe_buf_puts(b, "(");
        if (emit(e, x->kids[0]))
            return e->p->rc;
        gfe_buf_puts(b, ")");
        if (x->min == 0 && x->max < 0)
            gfe_buf_puts(b, "*");
        else if (x->min == 1 && x->max < 0)
            gfe_buf_puts(b, "+");
        else if (x->min == 0 && x->max == 1)
            gfe_buf_puts(b, "?");
        else if (x->max < 0)
            gfe_buf_printf(b, "{%d,}", x->min);
        else if (x->min == x->max)
            gfe_buf_printf(b, "{%d}", x->min);
        else
            gfe_buf_printf(b, "{%d,%d}", x->min, x->max);
        return 0;
    case RX_CAT: {
        if (x->n_kids == 0) {
            gfe_buf_puts(b, "\"\"");
            return 0;
        }
        gfe_buf_puts(b, "(");
        for (int i = 0; i < x->n_kids;) {
            if (i)
                gfe_buf_puts(b, " ");
            if (is_plain_cp(x->kids[i], e->json)) {
                /* run of single codepoints -> one literal */
                char tmp[256];
                size_t n = 0;
                while (i < x->n_kids && is_plain_cp(x->kids[i], e->json) && n + 4 < sizeof tmp)
                    n += (size_t)gfe_utf8_put(tmp + n, x->kids[i++]->set.r[0].lo);
                gfe_buf_lit(b, tmp, n);
                continue;
            }
            if (emit(e, x->kids[i++]))
                return e->p->rc;
        }
        gfe_buf_puts(b, ")");
        return 0;
    }
    case RX_ALT: {
        int n = 0;
        gfe_buf_puts(b, "(");
        for (int i = 0; i < x->n_kids; i++) {
            if (never(x->kids[i]))
                continue;
            if (n++)
                gfe_buf_puts(b, " | ");
            if (emit(e, x->kids[i]))
                return e->p->rc;
        }
        gfe_buf_puts(b, ")");
        return 0;
    }
    }
    return 0;
}

/* Length in codepoints every match of x has, or -1 if it varies. */
static long fixed_len(const rx *x)
{
    long t = 0, l;
    switch (x->kind) {
    case RX_SET: return 1;
    case RX_EMPTY: case RX_BOL: case RX_EOL: return 0;
    case RX_CAT:
        for (int i = 0; i < x->n_kids; i++) {
            if ((l = fixed_len(x->kids[i])) < 0)
                return -1;
            t += l;
        }
        return t;
    case RX_ALT:
        t = -2;
        for (int i = 0; i < x->n_kids; i++) {
            if (never(x->kids[i]))
                continue;
            l = fixed_len(x->kids[i]);
            if (l < 0 || (t != -2 && l != t))
                return -1;
            t = l;
        }
        return t < 0 ? -1 : t;
    case RX_REP:
        if (x->max != x->min || (l = fixed_len(x->kids[0])) < 0)
            return -1;
        return l * x->min;
    }
    return -1;
}

static void quant(gfe_buf *b, long lo, long hi)
{
    if (lo == 0 && hi < 0)
        gfe_buf_puts(b, "*");
    else if (lo == 1 && hi < 0)
        gfe_buf_puts(b, "+");
    else if (lo == 0 && hi == 1)
        gfe_buf_puts(b, "?");
    else if (hi < 0)
        gfe_buf_printf(b, "{%ld,}", lo);
    else if (lo == hi)
        gfe_buf_printf(b, "{%ld}", lo);
    else
        gfe_buf_printf(b, "{%ld,%ld}", lo, hi);
}

static void emit_any(gfe_buf *out, int json_mode, long lo, long hi)
{
    gfe_cset all = {0};
    gfe_cset_add(&all, 0, GFE_CP_MAX);
    gfe_buf_puts(out, "(");
    if (json_mode)
        gfe_cset_emit_json(out, &all);
    else
        gfe_cset_emit_raw(out, &all);
    gfe_buf_puts(out, ")");
    quant(out, lo, hi);
    gfe_cset_free(&all);
}

int gfe_regex_emit_len(gfe_buf *out, const char *re, size_t len, int json_mode, int search,
                       long min_len, long max_len, int *is_never, tern_err *err)
{
    rx_parser p = {.s = re, .n = len, .json_mode = json_mode, .err = err};
    int limited = min_len > 0 || max_len >= 0;
    *is_never = 0;
    rx *root = parse_alt(&p);
    if (!root)
        return p.rc ? p.rc : tern_err_set(err, TERN_EINTERNAL, "regex: parse failed");
    if (p.i < p.n) {
        rx_free(root);
        return fail(&p, TERN_EFORMAT, "unmatched )");
    }
    int n_alt = 0;
    rx_emit e = {.b = out, .json = json_mode, .p = &p};
    gfe_buf_puts(out, "(");
    for (int i = 0; i < root->n_kids; i++) {
        rx *cat = root->kids[i];
        int bol = 0, eol = 0;
        /* strip anchors at the ends of each top-level alternative */
        while (cat->n_kids > 0 && cat->kids[0]->kind == RX_BOL) {
            rx_free(cat->kids[0]);
            memmove(cat->kids, cat->kids + 1, (size_t)(cat->n_kids - 1) * sizeof *cat->kids);
            cat->n_kids--;
            bol = 1;
        }
        while (cat->n_kids > 0 && cat->kids[cat->n_kids - 1]->kind == RX_EOL) {
            rx_free(cat->kids[--cat->n_kids]);
            eol = 1;
        }
        if (never(cat))
            continue;
        int pre = search && !bol, suf = search && !eol;
        long pre_lo = 0, pre_hi = -1, suf_lo = 0, suf_hi = -1;
        if (limited) {
            /* a length bound intersects exactly when one part is a
             * repetition of single characters and the rest has a fixed
             * length: that repetition's bounds absorb the constraint */
            long fixed = 0;
            int n_var = pre + suf;
            rx *var = NULL;
            for (int k = 0; k < cat->n_kids; k++) {
                long l = fixed_len(cat->kids[k]);
                if (l >= 0) {
                    fixed += l;
                } else if (cat->kids[k]->kind == RX_REP && cat->kids[k]->kids[0]->kind == RX_SET) {
                    var = cat->kids[k];
                    n_var++;
                } else {
                    n_var += 2;
                }
            }
            if (n_var > 1) {
                fail(&p, TERN_EUNSUPPORTED, "pattern too complex to combine with minLength/maxLength");
                break;
            }
            long lo = min_len - fixed > 0 ? min_len - fixed : 0;
            long hi = max_len < 0 ? -1 : max_len - fixed;
            if (hi != -1 && hi < 0)
                continue; /* fixed part already too long */
            if (n_var == 0) {
                if (fixed < min_len || (max_len >= 0 && fixed > max_len))
                    continue;
            } else if (var) {
                long nlo = var->min > lo ? var->min : lo;
                long nhi = var->max < 0 ? hi : (hi < 0 || var->max < hi ? var->max : hi);
                if (nhi >= 0 && nhi < nlo)
                    continue;
                if (nlo > RX_MAX_REPEAT || nhi > RX_MAX_REPEAT) {
                    fail(&p, TERN_EUNSUPPORTED, "repetition count too large");
                    break;
                }
                var->min = (int)nlo;
                var->max = (int)nhi;
            } else if (pre) {
                pre_lo = lo, pre_hi = hi;
            } else {
                suf_lo = lo, suf_hi = hi;
            }
        }
        if (n_alt++)
            gfe_buf_puts(out, " | ");
        if (pre) {
            emit_any(out, json_mode, pre_lo, pre_hi);
            gfe_buf_puts(out, " ");
        }
        if (emit(&e, cat))
            break;
        if (suf) {
            gfe_buf_puts(out, " ");
            emit_any(out, json_mode, suf_lo, suf_hi);
        }
    }
    gfe_buf_puts(out, ")");
    rx_free(root);
    if (p.rc)
        return p.rc;
    if (!n_alt)
        *is_never = 1;
    if (out->err)
        return tern_err_set(err, out->err, "regex: %s", out->err == TERN_EFULL ? "grammar too large" : "out of memory");
    return 0;
}

int gfe_regex_emit(gfe_buf *out, const char *re, size_t len, int json_mode, int search,
                   int *is_never, tern_err *err)
{
    return gfe_regex_emit_len(out, re, len, json_mode, search, 0, -1, is_never, err);
}

int grammar_regex_to_ebnf(const char *re, size_t len, char **ebnf_out, tern_err *err)
{
    *ebnf_out = NULL;
    gfe_buf b;
    gfe_buf_init(&b, 16u << 20);
    gfe_buf_puts(&b, "root ::= ");
    int is_never = 0;
    int rc = gfe_regex_emit(&b, re ? re : "", re ? len : 0, 0, 0, &is_never, err);
    if (rc) {
        gfe_buf_free(&b);
        return rc;
    }
    if (is_never) {
        gfe_buf_free(&b);
        return tern_err_set(err, TERN_EINVAL, "regex: matches no string");
    }
    gfe_buf_puts(&b, "\n");
    char *s = gfe_buf_take(&b);
    gfe_buf_free(&b);
    if (!s)
        return tern_err_set(err, TERN_ENOMEM, "regex: out of memory");
    *ebnf_out = s;
    return 0;
}

rx *gfe_rx_parse(const char *re, size_t len, int json_mode, tern_err *err)
{
    rx_parser p = {.s = re, .n = len, .json_mode = json_mode, .err = err};
    rx *root = parse_alt(&p);
    if (!root) {
        if (!p.rc)
            tern_err_set(err, TERN_EINTERNAL, "regex: parse failed");
        return NULL;
    }
    if (p.i < p.n) {
        rx_free(root);
        fail(&p, TERN_EFORMAT, "unmatched )");
        return NULL;
    }
    return root;
}

void gfe_rx_free(rx *x) { rx_free(x); }
