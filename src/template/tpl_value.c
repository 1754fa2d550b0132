/* Values of the Jinja interpreter: arena, strings, lists, dicts, Python-style
 * equality/ordering, str()/repr() and json.dumps as HF's tojson does it. */
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpl_int.h"

/* ---- arena ------------------------------------------------------------- */

/* 64 KiB blocks: a typical chat render needs a few hundred KiB, and larger
 * requests get a block of their own size. */
#define TPL_BLOCK_MIN (64 * 1024)

void tpl_arena_free(tpl_arena *a)
{
    tpl_block *b = a->head;
    while (b) {
        tpl_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
    a->total = 0;
}

void *tpl_alloc(tpl_ctx *c, size_t n)
{
    tpl_arena *a = c->arena;
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    tpl_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > TPL_BLOCK_MIN ? n : TPL_BLOCK_MIN;
        if (a->limit && (a->total + cap > a->limit || cap > a->limit))
            tpl_fail(c, TERN_EFULL, -1, "template memory limit exceeded (%zu bytes)", a->limit);
        b = malloc(sizeof *b + cap);
        if (!b)
            tpl_fail(c, TERN_ENOMEM, -1, "out of memory");
        b->cap = cap;
        b->used = 0;
        a->total += cap;
        /* big one-off blocks go behind the head so the head keeps filling */
        if (a->head && cap > TPL_BLOCK_MIN) {
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    return p;
}

void *tpl_zalloc(tpl_ctx *c, size_t n)
{
    void *p = tpl_alloc(c, n);
    memset(p, 0, n);
    return p;
}

static void line_col(const char *src, size_t len, long pos, long *line, long *col)
{
    *line = 1;
    *col = 1;
    if (!src || pos < 0)
        return;
    for (long i = 0; i < pos && (size_t)i < len; i++) {
        if (src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)src[i] & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

_Noreturn void tpl_fail_raw(tpl_ctx *c, int code, long pos, const char *msg)
{
    tern_err_set_pos(c->err, code, pos, "%s", msg);
    longjmp(c->jb, 1);
}

_Noreturn void tpl_fail(tpl_ctx *c, int code, long pos, const char *fmt, ...)
{
    char msg[TERN_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (pos >= 0 && c->src) {
        long line, col;
        line_col(c->src, c->src_len, pos, &line, &col);
        tern_err_set_pos(c->err, code, pos, "line %ld, column %ld: %s", line, col, msg);
    } else {
        tern_err_set_pos(c->err, code, pos, "%s", msg);
    }
    longjmp(c->jb, 1);
}

/* ---- buffers and containers --------------------------------------------- */

void tbuf_put(tpl_ctx *c, tbuf *b, const char *s, size_t n)
{
    if (b->limit && b->len + n > b->limit)
        tpl_fail(c, TERN_EFULL, -1, "template output limit exceeded (%zu bytes)", b->limit);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = tpl_alloc(c, cap);
        if (b->len)
            memcpy(p, b->p, b->len);
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void tbuf_puts(tpl_ctx *c, tbuf *b, const char *s) { tbuf_put(c, b, s, strlen(s)); }
void tbuf_putc(tpl_ctx *c, tbuf *b, char ch) { tbuf_put(c, b, &ch, 1); }

tstr *tstr_new(tpl_ctx *c, const char *s, size_t n)
{
    if (n > ((size_t)1 << 40))
        tpl_fail(c, TERN_EFULL, -1, "string too long");
    tstr *t = tpl_alloc(c, sizeof *t + n + 1);
    t->len = n;
    if (n)
        memcpy(t->s, s, n);
    t->s[n] = '\0';
    return t;
}

tstr *tstr_cstr(tpl_ctx *c, const char *s) { return tstr_new(c, s, strlen(s)); }
tstr *tbuf_str(tpl_ctx *c, tbuf *b) { return tstr_new(c, b->p, b->len); }

tlist *tlist_new(tpl_ctx *c, size_t n)
{
    if (n > ((size_t)1 << 32))
        tpl_fail(c, TERN_EFULL, -1, "list too long");
    tlist *l = tpl_alloc(c, sizeof *l);
    l->n = n;
    l->tuple = 0;
    l->items = n ? tpl_alloc(c, n * sizeof(tv)) : NULL;
    for (size_t i = 0; i < n; i++)
        l->items[i] = tv_none();
    return l;
}

tdict *tdict_new(tpl_ctx *c, size_t cap)
{
    tdict *d = tpl_alloc(c, sizeof *d);
    d->n = 0;
    d->cap = cap ? cap : 4;
    d->keys = tpl_alloc(c, d->cap * sizeof(tv));
    d->vals = tpl_alloc(c, d->cap * sizeof(tv));
    return d;
}

tv *tdict_get_str(tdict *d, const char *key, size_t len)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->keys[i].t == TV_STR && d->keys[i].u.s->len == len && !memcmp(d->keys[i].u.s->s, key, len))
            return &d->vals[i];
    return NULL;
}

tv *tdict_get(tdict *d, tv key)
{
    if (key.t == TV_STR)
        return tdict_get_str(d, key.u.s->s, key.u.s->len);
    for (size_t i = 0; i < d->n; i++)
        if (tv_eq(d->keys[i], key))
            return &d->vals[i];
    return NULL;
}

void tdict_set(tpl_ctx *c, tdict *d, tv key, tv val)
{
    tv *old = tdict_get(d, key);
    if (old) {
        *old = val;
        return;
    }
    tdict_append(c, d, key, val);
}

void tdict_append(tpl_ctx *c, tdict *d, tv key, tv val)
{
    if (d->n == d->cap) {
        size_t cap = d->cap * 2;
        tv *k = tpl_alloc(c, cap * sizeof(tv)), *v = tpl_alloc(c, cap * sizeof(tv));
        memcpy(k, d->keys, d->n * sizeof(tv));
        memcpy(v, d->vals, d->n * sizeof(tv));
        d->keys = k;
        d->vals = v;
        d->cap = cap;
    }
    d->keys[d->n] = key;
    d->vals[d->n] = val;
    d->n++;
}

/* ---- Python semantics ----------------------------------------------------- */

int tv_truthy(tv v)
{
    switch (v.t) {
    case TV_UNDEF: case TV_NONE: return 0;
    case TV_BOOL: case TV_INT: return v.u.i != 0;
    case TV_FLOAT: return v.u.f != 0.0;
    case TV_STR: return v.u.s->len != 0;
    case TV_LIST: return v.u.l->n != 0;
    case TV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

int tv_is_number(tv v) { return v.t == TV_INT || v.t == TV_FLOAT || v.t == TV_BOOL; }
double tv_num(tv v) { return v.t == TV_FLOAT ? v.u.f : (double)v.u.i; }

/* Values nest at most this deep in comparisons and printing: Python stops
 * at its recursion limit too, and the C stack must stay bounded (lists and
 * namespaces built in a loop can nest arbitrarily, and a namespace can
 * contain itself). */
#define TV_MAX_NEST 200

static int eq_rec(tv a, tv b, int depth)
{
    if (tv_is_number(a) && tv_is_number(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT)
            return a.u.i == b.u.i;
        return tv_num(a) == tv_num(b);
    }
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case TV_UNDEF: case TV_NONE: return 1;
    case TV_STR: return a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len);
    case TV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple)
            return 0;
        if (depth > TV_MAX_NEST)
            return 0; /* too deep to compare: treated as different */
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_rec(a.u.l->items[i], b.u.l->items[i], depth + 1))
                return 0;
        return 1;
    case TV_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        if (depth > TV_MAX_NEST)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            tv *o = tdict_get(b.u.d, a.u.d->keys[i]);
            if (!o || !eq_rec(a.u.d->vals[i], *o, depth + 1))
                return 0;
        }
        return 1;
    case TV_NS: return a.u.d == b.u.d;
    case TV_FUNC: return a.u.fn == b.u.fn;
    case TV_MACRO: return a.u.m == b.u.m;
    case TV_LOOP: return a.u.lp == b.u.lp;
    }
    return 0;
}

int tv_eq(tv a, tv b) { return eq_rec(a, b, 0); }

const char *tv_type_name(tv v)
{
    switch (v.t) {
    case TV_UNDEF: return "Undefined";
    case TV_NONE: return "NoneType";
    case TV_BOOL: return "bool";
    case TV_INT: return "int";
    case TV_FLOAT: return "float";
    case TV_STR: return "str";
    case TV_LIST: return v.u.l->tuple ? "tuple" : "list";
    case TV_DICT: return "dict";
    case TV_NS: return "Namespace";
    case TV_FUNC: return "builtin_function_or_method";
    case TV_MACRO: return "Macro";
    case TV_LOOP: return "LoopContext";
    }
    return "object";
}

static int cmp_rec(tpl_ctx *c, tv a, tv b, long pos, int depth)
{
    if (tv_is_number(a) && tv_is_number(b)) {
        if (a.t != TV_FLOAT && b.t != TV_FLOAT)
            return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        double x = tv_num(a), y = tv_num(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == TV_STR && b.t == TV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->s, b.u.s->s, n); /* UTF-8 byte order = code point order */
        if (r)
            return r < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (a.t == TV_LIST && b.t == TV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (tv_eq(a.u.l->items[i], b.u.l->items[i]))
                continue;
            if (depth > TV_MAX_NEST)
                tpl_fail(c, TERN_ERANGE, pos, "values nested too deeply to compare");
            return cmp_rec(c, a.u.l->items[i], b.u.l->items[i], pos, depth + 1);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    if (a.t == TV_UNDEF || b.t == TV_UNDEF)
        tpl_undefined_fail((tpl_render *)c, a.t == TV_UNDEF ? a : b, pos);
    tpl_fail(c, TERN_EINVAL, pos, "'<' not supported between instances of '%s' and '%s'",
             tv_type_name(a), tv_type_name(b));
}

int tv_cmp(tpl_ctx *c, tv a, tv b, long pos) { return cmp_rec(c, a, b, pos, 0); }

/* ---- float repr ------------------------------------------------------------ */

void tpl_float_repr(double f, char out[32])
{
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f < 0 ? "-inf" : "inf");
        return;
    }
    if (f == 0) {
        strcpy(out, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    /* shortest round-tripping digits, as Python's repr */
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    /* e = [-]d.ddddde[+-]XX */
    char digits[24];
    int nd = 0, neg = 0;
    const char *p = e;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    char *o = out;
    if (neg)
        *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -exp10 - 1; i++)
                *o++ = '0';
            for (int i = 0; i < nd; i++)
                *o++ = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++)
                *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > exp10 + 1)
                for (int i = exp10 + 1; i < nd; i++)
                    *o++ = digits[i];
            else
                *o++ = '0';
        }
        *o = '\0';
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++)
                *o++ = digits[i];
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

/* ---- str / repr ------------------------------------------------------------ */

static void repr_str(tpl_ctx *c, tbuf *b, const tstr *s)
{
    int has_sq = memchr(s->s, '\'', s->len) != NULL, has_dq = memchr(s->s, '"', s->len) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    tbuf_putc(c, b, q);
    size_t i = 0;
    while (i < s->len) {
        unsigned char ch = (unsigned char)s->s[i];
        if (ch == (unsigned char)q || ch == '\\') {
            tbuf_putc(c, b, '\\');
            tbuf_putc(c, b, (char)ch);
            i++;
        } else if (ch == '\n') {
            tbuf_puts(c, b, "\\n");
            i++;
        } else if (ch == '\r') {
            tbuf_puts(c, b, "\\r");
            i++;
        } else if (ch == '\t') {
            tbuf_puts(c, b, "\\t");
            i++;
        } else if (ch < 0x20 || ch == 0x7f) {
            char t[8];
            snprintf(t, sizeof t, "\\x%02x", ch);
            tbuf_puts(c, b, t);
            i++;
        } else if (ch < 0x80) {
            tbuf_putc(c, b, (char)ch);
            i++;
        } else {
            size_t cl;
            int32_t cp = utf8_decode(s->s + i, s->len - i, &cl);
            if (cp < 0) {
                tbuf_put(c, b, s->s + i, 1);
                i++;
                continue;
            }
            if (py_isprintable(cp)) {
                tbuf_put(c, b, s->s + i, cl);
            } else {
                char t[16];
                if (cp < 0x100)
                    snprintf(t, sizeof t, "\\x%02x", (unsigned)cp);
                else if (cp < 0x10000)
                    snprintf(t, sizeof t, "\\u%04x", (unsigned)cp);
                else
                    snprintf(t, sizeof t, "\\U%08x", (unsigned)cp);
                tbuf_puts(c, b, t);
            }
            i += cl;
        }
    }
    tbuf_putc(c, b, q);
}

static void str_rec(tpl_ctx *c, tbuf *b, tv v, int depth);

static void repr_rec(tpl_ctx *c, tbuf *b, tv v, int depth)
{
    if (depth > TV_MAX_NEST)
        tpl_fail(c, TERN_ERANGE, -1, "value nested too deeply to print");
    switch (v.t) {
    case TV_STR:
        repr_str(c, b, v.u.s);
        return;
    case TV_UNDEF:
        tbuf_puts(c, b, "Undefined"); /* jinja2's Undefined.__repr__ */
        return;
    case TV_LIST: {
        tlist *l = v.u.l;
        tbuf_putc(c, b, l->tuple ? '(' : '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                tbuf_puts(c, b, ", ");
            repr_rec(c, b, l->items[i], depth + 1);
        }
        if (l->tuple && l->n == 1)
            tbuf_putc(c, b, ',');
        tbuf_putc(c, b, l->tuple ? ')' : ']');
        return;
    }
    case TV_DICT: {
        tdict *d = v.u.d;
        tbuf_putc(c, b, '{');
        for (size_t i = 0; i < d->n; i++) {
            if (i)
                tbuf_puts(c, b, ", ");
            repr_rec(c, b, d->keys[i], depth + 1);
            tbuf_puts(c, b, ": ");
            repr_rec(c, b, d->vals[i], depth + 1);
        }
        tbuf_putc(c, b, '}');
        return;
    }
    default:
        str_rec(c, b, v, depth);
    }
}

void tv_repr_to(tpl_ctx *c, tbuf *b, tv v) { repr_rec(c, b, v, 0); }

static void str_rec(tpl_ctx *c, tbuf *b, tv v, int depth)
{
    char t[40];
    switch (v.t) {
    case TV_UNDEF: return;
    case TV_NONE: tbuf_puts(c, b, "None"); return;
    case TV_BOOL: tbuf_puts(c, b, v.u.i ? "True" : "False"); return;
    case TV_INT:
        snprintf(t, sizeof t, "%lld", (long long)v.u.i);
        tbuf_puts(c, b, t);
        return;
    case TV_FLOAT:
        tpl_float_repr(v.u.f, t);
        tbuf_puts(c, b, t);
        return;
    case TV_STR: tbuf_put(c, b, v.u.s->s, v.u.s->len); return;
    case TV_LIST: case TV_DICT: repr_rec(c, b, v, depth); return;
    case TV_NS:
        tbuf_puts(c, b, "<Namespace ");
        repr_rec(c, b, tv_dict(v.u.d), depth + 1);
        tbuf_puts(c, b, ">");
        return;
    case TV_FUNC:
        tbuf_puts(c, b, "<built-in method ");
        tbuf_puts(c, b, v.u.fn->name);
        tbuf_puts(c, b, ">");
        return;
    case TV_MACRO: tbuf_puts(c, b, "<Macro>"); return;
    case TV_LOOP: /* jinja2: <LoopContext index/length> */
        snprintf(t, sizeof t, "<LoopContext %zu/%zu>", v.u.lp->index0 + 1, v.u.lp->items->n);
        tbuf_puts(c, b, t);
        return;
    }
}

void tv_str_to(tpl_ctx *c, tbuf *b, tv v) { str_rec(c, b, v, 0); }

tstr *tv_to_tstr(tpl_ctx *c, tv v)
{
    if (v.t == TV_STR)
        return v.u.s;
    tbuf b = {0};
    tv_str_to(c, &b, v);
    return b.len ? tbuf_str(c, &b) : tstr_new(c, "", 0);
}

/* ---- tojson ------------------------------------------------------------- */

static void json_str(tpl_ctx *c, tbuf *b, const char *s, size_t n, int ascii)
{
    tbuf_putc(c, b, '"');
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *esc = NULL;
        char t[16];
        if (ascii && ch >= 0x80) { /* ensure_ascii: \uXXXX, surrogate pairs above the BMP */
            size_t cl;
            int32_t cp = utf8_decode(s + i, n - i, &cl);
            if (cp < 0)
                cp = 0xFFFD;
            if (cp >= 0x10000)
                snprintf(t, sizeof t, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
            else
                snprintf(t, sizeof t, "\\u%04x", (unsigned)cp);
            tbuf_put(c, b, s + start, i - start);
            tbuf_puts(c, b, t);
            i += cl - 1;
            start = i + 1;
            continue;
        }
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (ch < 0x20) {
                snprintf(t, sizeof t, "\\u%04x", ch);
                esc = t;
            }
        }
        if (esc) {
            tbuf_put(c, b, s + start, i - start);
            tbuf_puts(c, b, esc);
            start = i + 1;
        }
    }
    tbuf_put(c, b, s + start, n - start);
    tbuf_putc(c, b, '"');
}

static void json_newline(tpl_ctx *c, tbuf *b, const tjson_opts *o, int level)
{
    tbuf_putc(c, b, '\n');
    for (int i = 0; i < level; i++)
        tbuf_puts(c, b, o->indent);
}

static void json_key(tpl_ctx *c, tbuf *b, tv k, long pos, int ascii)
{
    char t[40];
    switch (k.t) {
    case TV_STR: json_str(c, b, k.u.s->s, k.u.s->len, ascii); return;
    case TV_INT: snprintf(t, sizeof t, "\"%lld\"", (long long)k.u.i); break;
    case TV_BOOL: snprintf(t, sizeof t, "\"%s\"", k.u.i ? "true" : "false"); break;
    case TV_NONE: snprintf(t, sizeof t, "\"null\""); break;
    case TV_FLOAT: {
        char f[32];
        tpl_float_repr(k.u.f, f);
        snprintf(t, sizeof t, "\"%s\"", f);
        break;
    }
    default:
        tpl_fail(c, TERN_EINVAL, pos, "keys must be str, int, float, bool or None, not %s",
                 tv_type_name(k));
    }
    tbuf_puts(c, b, t);
}

static int str_key_cmp(const void *x, const void *y)
{
    const tv *a = *(const tv *const *)x, *b = *(const tv *const *)y;
    size_t n = a->u.s->len < b->u.s->len ? a->u.s->len : b->u.s->len;
    int r = memcmp(a->u.s->s, b->u.s->s, n);
    if (r)
        return r;
    return a->u.s->len < b->u.s->len ? -1 : a->u.s->len > b->u.s->len;
}

static void tojson_rec(tpl_ctx *c, tbuf *b, tv v, const tjson_opts *o, int level, long pos)
{
    char t[40];
    if (level > TV_MAX_NEST)
        tpl_fail(c, TERN_ERANGE, pos, "tojson: nesting too deep");
    switch (v.t) {
    case TV_NONE: tbuf_puts(c, b, "null"); return;
    case TV_BOOL: tbuf_puts(c, b, v.u.i ? "true" : "false"); return;
    case TV_INT:
        snprintf(t, sizeof t, "%lld", (long long)v.u.i);
        tbuf_puts(c, b, t);
        return;
    case TV_FLOAT:
        if (isnan(v.u.f))
            tbuf_puts(c, b, "NaN");
        else if (isinf(v.u.f))
            tbuf_puts(c, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            tpl_float_repr(v.u.f, t);
            tbuf_puts(c, b, t);
        }
        return;
    case TV_STR: json_str(c, b, v.u.s->s, v.u.s->len, o->ensure_ascii); return;
    case TV_LIST: {
        tlist *l = v.u.l;
        if (!l->n) {
            tbuf_puts(c, b, "[]");
            return;
        }
        tbuf_putc(c, b, '[');
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                tbuf_puts(c, b, o->item_sep);
            if (o->indent)
                json_newline(c, b, o, level + 1);
            tojson_rec(c, b, l->items[i], o, level + 1, pos);
        }
        if (o->indent)
            json_newline(c, b, o, level);
        tbuf_putc(c, b, ']');
        return;
    }
    case TV_DICT: {
        tdict *d = v.u.d;
        if (!d->n) {
            tbuf_puts(c, b, "{}");
            return;
        }
        size_t *order = tpl_alloc(c, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
        if (o->sort_keys) {
            const tv **ks = tpl_alloc(c, d->n * sizeof *ks);
            for (size_t i = 0; i < d->n; i++) {
                if (d->keys[i].t != TV_STR)
                    tpl_fail(c, TERN_EINVAL, pos, "tojson: sort_keys needs string keys");
                ks[i] = &d->keys[i];
            }
            qsort(ks, d->n, sizeof *ks, str_key_cmp);
            for (size_t i = 0; i < d->n; i++)
                order[i] = (size_t)(ks[i] - d->keys);
        }
        tbuf_putc(c, b, '{');
        for (size_t j = 0; j < d->n; j++) {
            size_t i = order[j];
            if (j)
                tbuf_puts(c, b, o->item_sep);
            if (o->indent)
                json_newline(c, b, o, level + 1);
            json_key(c, b, d->keys[i], pos, o->ensure_ascii);
            tbuf_puts(c, b, o->key_sep);
            tojson_rec(c, b, d->vals[i], o, level + 1, pos);
        }
        if (o->indent)
            json_newline(c, b, o, level);
        tbuf_putc(c, b, '}');
        return;
    }
    default:
        tpl_fail(c, TERN_EINVAL, pos, "Object of type %s is not JSON serializable",
                 tv_type_name(v));
    }
}

void tv_tojson_to(tpl_ctx *c, tbuf *b, tv v, const tjson_opts *o, long pos)
{
    tojson_rec(c, b, v, o, 0, pos);
}

/* ---- json-c input ---------------------------------------------------------- */

static tv from_json_rec(tpl_ctx *c, json_object *o, int depth)
{
    if (depth > 1000)
        tpl_fail(c, TERN_ERANGE, -1, "context JSON nested too deeply");
    switch (json_object_get_type(o)) {
    case json_type_null: return tv_none();
    case json_type_boolean: return tv_bool(json_object_get_boolean(o));
    case json_type_int: return tv_int(json_object_get_int64(o));
    case json_type_double: return tv_float(json_object_get_double(o));
    case json_type_string:
        return tv_str(tstr_new(c, json_object_get_string(o), (size_t)json_object_get_string_len(o)));
    case json_type_array: {
        size_t n = json_object_array_length(o);
        tlist *l = tlist_new(c, n);
        for (size_t i = 0; i < n; i++)
            l->items[i] = from_json_rec(c, json_object_array_get_idx(o, i), depth + 1);
        return tv_list(l);
    }
    case json_type_object: {
        tdict *d = tdict_new(c, (size_t)json_object_object_length(o) + 1);
        json_object_object_foreach(o, k, val) {
            tdict_append(c, d, tv_str(tstr_cstr(c, k)), from_json_rec(c, val, depth + 1));
        }
        return tv_dict(d);
    }
    }
    return tv_none();
}

tv tv_from_json(tpl_ctx *c, json_object *o) { return o ? from_json_rec(c, o, 0) : tv_none(); }
