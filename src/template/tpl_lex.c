/* Jinja lexer with Hugging Face's settings (trim_blocks and lstrip_blocks on,
 * default delimiters). It follows jinja2's lexer rule for rule, because the
 * whitespace a chat template emits depends on these details:
 *  - `{%-`/`{{-`/`{#-` strip all whitespace before the tag; `-%}`/`-}}`/`-#}`
 *    strip all whitespace after it;
 *  - trim_blocks: a block or comment end (`%}`, `#}`) eats one newline;
 *  - lstrip_blocks: spaces/tabs between a line start and a block or comment
 *    tag are dropped (not before `{{`; `{%+` disables it);
 *  - `{% raw %}...{% endraw %}` is text.
 * The source was normalized first: newlines are "\n" and one trailing newline
 * is gone (keep_trailing_newline=False). */
#include <stdlib.h>
#include <string.h>

#include "tpl_int.h"

static void push(tpl_ctx *c, tok_array *a, tok t)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 256;
        tok *v = tpl_alloc(c, cap * sizeof *v);
        if (a->n)
            memcpy(v, a->v, a->n * sizeof *v);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = t;
}

static void push_simple(tpl_ctx *c, tok_array *a, int type, long pos)
{
    tok t = {0};
    t.type = (uint8_t)type;
    t.pos = pos;
    push(c, a, t);
}

/* Python's \s at i; returns its byte length or 0. */
static size_t ws_at(const char *s, size_t n, size_t i)
{
    size_t l;
    return i < n && py_space_at(s + i, n - i, &l) ? l : 0;
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    size_t l;
    while ((l = ws_at(s, n, i)))
        i += l;
    return i;
}

/* Emits text [a, b) with the strip rules for the tag that follows it.
 * sign: '-', '+' or 0; lstrip_ok: the tag is a block or comment. */
static void emit_text(tpl_ctx *c, tok_array *out, const char *s, size_t a, size_t b, char sign,
                      int lstrip_ok, int line_starting)
{
    if (sign == '-') {
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80)
                p--;
            size_t l;
            if (!py_space_at(s + p, b - p, &l))
                break;
            b = p;
        }
    } else if (sign != '+' && lstrip_ok) {
        size_t l_pos = a;
        for (size_t i = b; i > a; i--)
            if (s[i - 1] == '\n') {
                l_pos = i;
                break;
            }
        if (l_pos > a || line_starting) {
            size_t i = l_pos, l;
            while (i < b && (l = ws_at(s, b, i)))
                i += l;
            if (i == b)
                b = l_pos;
        }
    }
    if (b > a) {
        tok t = {0};
        t.type = TK_TEXT;
        t.pos = (long)a;
        t.s = tstr_new(c, s + a, b - a);
        push(c, out, t);
    }
}

/* Python unicode-escape decoding of a string literal body. */
static tstr *unescape(tpl_ctx *c, const char *s, size_t n, long pos)
{
    tbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            tbuf_putc(c, &b, s[i]);
            continue;
        }
        char e = s[++i];
        switch (e) {
        case '\\': tbuf_putc(c, &b, '\\'); break;
        case '\'': tbuf_putc(c, &b, '\''); break;
        case '"': tbuf_putc(c, &b, '"'); break;
        case 'a': tbuf_putc(c, &b, '\a'); break;
        case 'b': tbuf_putc(c, &b, '\b'); break;
        case 'f': tbuf_putc(c, &b, '\f'); break;
        case 'n': tbuf_putc(c, &b, '\n'); break;
        case 'r': tbuf_putc(c, &b, '\r'); break;
        case 't': tbuf_putc(c, &b, '\t'); break;
        case 'v': tbuf_putc(c, &b, '\v'); break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            int64_t cp = 0; /* 8 hex digits overflow int32 */
            for (int k = 0; k < nd; k++) {
                char h = i + 1 + k < n ? s[i + 1 + k] : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0)
                    tpl_fail(c, TERN_EFORMAT, pos, "truncated \\%c escape in string literal", e);
                cp = cp * 16 + d;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                tpl_fail(c, TERN_EFORMAT, pos, "invalid \\%c escape in string literal", e);
            i += (size_t)nd;
            utf8_put(c, &b, (int32_t)cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                int32_t cp = e - '0';
                for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++)
                    cp = cp * 8 + (s[++i] - '0');
                utf8_put(c, &b, cp);
            } else {
                tbuf_putc(c, &b, '\\');
                tbuf_putc(c, &b, e);
            }
        }
    }
    return b.len ? tbuf_str(c, &b) : tstr_new(c, "", 0);
}

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }
static int is_name0(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }

/* Digits with single underscores between them ("1_000"); returns end. */
static size_t digits_end(const char *s, size_t n, size_t i)
{
    while (i < n && (is_digit(s[i]) || (s[i] == '_' && i + 1 < n && is_digit(s[i + 1]) && i > 0 &&
                                        is_digit(s[i - 1]))))
        i++;
    return i;
}

static void number(tpl_ctx *c, tok_array *out, const char *s, size_t n, size_t *ip)
{
    size_t i = *ip, start = i;
    char buf[128];
    size_t k = 0;
    int is_float = 0;
    int after_dot = start > 0 && s[start - 1] == '.';
    size_t e = digits_end(s, n, i);
    if (!after_dot) {
        size_t j = e;
        if (j + 1 < n && s[j] == '.' && is_digit(s[j + 1])) {
            j = digits_end(s, n, j + 1);
            is_float = 1;
        }
        if (j < n && (s[j] == 'e' || s[j] == 'E')) {
            size_t m = j + 1;
            if (m < n && (s[m] == '+' || s[m] == '-'))
                m++;
            if (m < n && is_digit(s[m])) {
                j = digits_end(s, n, m);
                is_float = 1;
            }
        }
        if (is_float)
            e = j;
    }
    for (size_t p = start; p < e && k + 1 < sizeof buf; p++)
        if (s[p] != '_')
            buf[k++] = s[p];
    buf[k] = '\0';
    tok t = {0};
    t.pos = (long)start;
    if (is_float) {
        t.type = TK_FLOAT;
        t.f = strtod(buf, NULL);
    } else {
        t.type = TK_INT;
        int64_t v = 0;
        for (size_t p = 0; p < k; p++) {
            if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, buf[p] - '0', &v))
                tpl_fail(c, TERN_ERANGE, (long)start, "integer literal too large");
        }
        t.i = v;
    }
    push(c, out, t);
    *ip = e;
}

static const struct {
    const char *s;
    uint8_t op;
} ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {">=", OP_GE},
    {"<=", OP_LE}, {"+", OP_ADD}, {"-", OP_SUB}, {"/", OP_DIV}, {"*", OP_MUL}, {"%", OP_MOD},
    {"~", OP_TILDE}, {"[", OP_LBRACKET}, {"]", OP_RBRACKET}, {"(", OP_LPAREN},
    {")", OP_RPAREN}, {"{", OP_LBRACE}, {"}", OP_RBRACE}, {">", OP_GT}, {"<", OP_LT},
    {"=", OP_ASSIGN}, {".", OP_DOT}, {":", OP_COLON}, {"|", OP_PIPE}, {",", OP_COMMA},
    {";", OP_SEMICOLON},
};

/* Lexes the inside of {% %} or {{ }} starting at *ip; returns with *ip past
 * the end delimiter (and what trim rules ate). */
static void lex_tag(tpl_ctx *c, tok_array *out, const char *s, size_t n, size_t *ip, int block,
                    int *line_starting, long tag_pos)
{
    size_t i = *ip;
    char stack[256];
    int depth = 0;
    for (;;) {
        i = skip_ws(s, n, i);
        if (i >= n)
            tpl_fail(c, TERN_EFORMAT, tag_pos, "unexpected end of template, expected '%s'",
                     block ? "%}" : "}}");
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            size_t m = 0;
            if (s[i] == '-' && i + 3 <= n && !strncmp(s + i + 1, end, 2)) {
                size_t j = i + 3;
                j = skip_ws(s, n, j);
                m = j - i;
            } else if (block && s[i] == '+' && i + 3 <= n && !strncmp(s + i + 1, end, 2)) {
                m = 3;
            } else if (i + 2 <= n && !strncmp(s + i, end, 2)) {
                m = 2;
                if (block && i + 2 < n && s[i + 2] == '\n')
                    m = 3; /* trim_blocks */
            }
            if (m) {
                push_simple(c, out, block ? TK_BLOCK_END : TK_VAR_END, (long)i);
                *ip = i + m;
                *line_starting = s[i + m - 1] == '\n';
                return;
            }
        }
        char ch = s[i];
        if (is_digit(ch)) {
            number(c, out, s, n, &i);
            continue;
        }
        if (is_name0(ch)) {
            size_t j = i + 1;
            while (j < n && (is_name0(s[j]) || is_digit(s[j])))
                j++;
            tok t = {0};
            t.type = TK_NAME;
            t.pos = (long)i;
            t.s = tstr_new(c, s + i, j - i);
            push(c, out, t);
            i = j;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != ch) {
                if (s[j] == '\\')
                    j++;
                j++;
            }
            if (j >= n)
                tpl_fail(c, TERN_EFORMAT, (long)i, "unterminated string literal");
            tok t = {0};
            t.type = TK_STRING;
            t.pos = (long)i;
            t.s = unescape(c, s + i + 1, j - i - 1, (long)i);
            push(c, out, t);
            i = j + 1;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            size_t l = strlen(ops[k].s);
            if (i + l <= n && !strncmp(s + i, ops[k].s, l))
                break;
        }
        if (k == sizeof ops / sizeof ops[0])
            tpl_fail(c, TERN_EFORMAT, (long)i, "unexpected character '%c'", ch);
        uint8_t op = ops[k].op;
        if (op == OP_LBRACE || op == OP_LPAREN || op == OP_LBRACKET) {
            if (depth >= (int)sizeof stack)
                tpl_fail(c, TERN_ERANGE, (long)i, "brackets nested too deeply");
            stack[depth++] = op == OP_LBRACE ? '}' : op == OP_LPAREN ? ')' : ']';
        } else if (op == OP_RBRACE || op == OP_RPAREN || op == OP_RBRACKET) {
            if (!depth)
                tpl_fail(c, TERN_EFORMAT, (long)i, "unexpected '%c'", ch);
            if (stack[--depth] != ch)
                tpl_fail(c, TERN_EFORMAT, (long)i, "unexpected '%c', expected '%c'", ch, stack[depth]);
        }
        tok t = {0};
        t.type = TK_OP;
        t.op = op;
        t.pos = (long)i;
        push(c, out, t);
        i += strlen(ops[k].s);
    }
}

/* Matches `{%[-+]? raw %}`-like tags ("raw"/"endraw") at i; returns the end
 * offset or 0. *sign gets the opening sign, *end_kind the closing form
 * ('-': strip after, '+', or 0). */
static size_t match_raw_tag(const char *s, size_t n, size_t i, const char *word, char *sign,
                            char *end_kind)
{
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%')
        return 0;
    size_t j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+'))
        *sign = s[j++];
    j = skip_ws(s, n, j);
    size_t wl = strlen(word);
    if (j + wl > n || strncmp(s + j, word, wl))
        return 0;
    j += wl;
    j = skip_ws(s, n, j);
    if (j + 3 <= n && s[j] == '-' && s[j + 1] == '%' && s[j + 2] == '}') {
        *end_kind = '-';
        return skip_ws(s, n, j + 3);
    }
    if (j + 3 <= n && s[j] == '+' && s[j + 1] == '%' && s[j + 2] == '}') {
        *end_kind = '+';
        return j + 3;
    }
    if (j + 2 <= n && s[j] == '%' && s[j + 1] == '}') {
        *end_kind = 0;
        return j + 2;
    }
    return 0;
}

void tpl_lex(tpl_ctx *c, const char *s, size_t n, tok_array *out)
{
    size_t pos = 0;
    int line_starting = 1;
    while (pos < n) {
        /* next tag opener */
        size_t i = pos;
        const char *hit = NULL;
        while (i + 1 < n) {
            hit = memchr(s + i, '{', n - i - 1);
            if (!hit)
                break;
            i = (size_t)(hit - s);
            if (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')
                break;
            i++;
            hit = NULL;
        }
        if (!hit) {
            emit_text(c, out, s, pos, n, 0, 0, line_starting);
            break;
        }
        char kind = s[i + 1];
        char sign = 0;
        if (i + 2 < n && (s[i + 2] == '-' || s[i + 2] == '+'))
            sign = s[i + 2];
        size_t after = i + 2 + (sign ? 1 : 0);
        char rsign, rend;
        size_t raw_end = kind == '%' ? match_raw_tag(s, n, i, "raw", &rsign, &rend) : 0;
        /* raw_begin's end never takes a newline (no trim_blocks suffix) */
        if (raw_end && rend == '+')
            raw_end = 0; /* "+%}" is not part of jinja's raw_begin rule */
        emit_text(c, out, s, pos, i, sign, kind != '{', line_starting);
        if (raw_end) {
            line_starting = s[raw_end - 1] == '\n';
            /* find {% endraw %} */
            size_t j = raw_end, e = 0;
            char esign = 0, ekind = 0;
            for (; j + 1 < n; j++) {
                if (s[j] == '{' && s[j + 1] == '%' && (e = match_raw_tag(s, n, j, "endraw", &esign, &ekind)))
                    break;
            }
            if (!e)
                tpl_fail(c, TERN_EFORMAT, (long)i, "missing end of raw directive");
            emit_text(c, out, s, raw_end, j, esign, 1, line_starting);
            if (ekind == 0 && e < n && s[e] == '\n')
                e++; /* trim_blocks */
            line_starting = s[e - 1] == '\n';
            pos = e;
            continue;
        }
        if (kind == '#') {
            size_t j = after;
            size_t e = 0;
            for (; j + 1 < n; j++) {
                if ((s[j] == '-' || s[j] == '+') && j + 2 < n && s[j + 1] == '#' && s[j + 2] == '}') {
                    e = s[j] == '-' ? skip_ws(s, n, j + 3) : j + 3;
                    break;
                }
                if (s[j] == '#' && s[j + 1] == '}') {
                    e = j + 2;
                    if (e < n && s[e] == '\n')
                        e++;
                    break;
                }
            }
            if (!e)
                tpl_fail(c, TERN_EFORMAT, (long)i, "missing end of comment tag");
            line_starting = s[e - 1] == '\n';
            pos = e;
            continue;
        }
        int block = kind == '%';
        push_simple(c, out, block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, (long)i);
        pos = after;
        lex_tag(c, out, s, n, &pos, block, &line_starting, (long)i);
    }
    push_simple(c, out, TK_EOF, (long)n);
}
