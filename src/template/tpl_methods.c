/* Python methods reachable from templates (str, dict and list methods that
 * do not mutate: ImmutableSandboxedEnvironment forbids the others) and the
 * globals HF provides: range, dict, namespace, raise_exception, strftime_now
 * (plus jinja2's joiner and cycler-free basics). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpl_int.h"

#define FAIL(r, pos, ...) tpl_fail(&(r)->c, TERN_EINVAL, (pos), __VA_ARGS__)
#define M(name) static tv name(tpl_render *r, tfunc *self, tv *args, int n_args, tstr **kn, \
                               tv *kv, int nk, long pos)
#define BIND(what, ...)                                                                        \
    static const char *const params[] = {__VA_ARGS__};                                         \
    tv a[sizeof params / sizeof params[0]];                                                    \
    tpl_bind_args(r, what, params, (int)(sizeof params / sizeof params[0]), args, n_args, kn, kv, \
                  nk, a, pos)

static tv mkfunc(tpl_render *r, const char *name, tfunc_impl fn, tv self)
{
    tfunc *f = tpl_alloc(&r->c, sizeof *f);
    f->name = name;
    f->fn = fn;
    f->self = self;
    tv v;
    v.t = TV_FUNC;
    v.u.fn = f;
    return v;
}

static tstr *S(tfunc *self) { return self->self.u.s; }
static int given(tv v) { return v.t != TV_UNDEF && v.t != TV_NONE; }

static tstr *want_str(tpl_render *r, tv v, const char *what, long pos)
{
    if (v.t != TV_STR)
        FAIL(r, pos, "%s must be str, not %s", what, tv_type_name(v));
    return v.u.s;
}

static int64_t want_int(tpl_render *r, tv v, const char *what, long pos)
{
    if (v.t == TV_INT || v.t == TV_BOOL)
        return v.u.i;
    FAIL(r, pos, "%s must be an integer, not %s", what, tv_type_name(v));
}

/* ---- str --------------------------------------------------------------- */

M(m_strip_any)
{
    BIND(self->name, "chars");
    tv chars = a[0].t == TV_STR ? a[0] : tv_none();
    if (given(a[0]) && a[0].t != TV_STR)
        FAIL(r, pos, "strip arg must be None or str");
    int left = self->name[0] != 'r', right = self->name[0] != 'l';
    return tv_str(py_strip(&r->c, S(self), chars, left, right));
}

M(m_split_any)
{
    BIND(self->name, "sep", "maxsplit");
    int64_t maxsplit = a[1].t == TV_UNDEF ? -1 : want_int(r, a[1], "maxsplit", pos);
    tv sep = given(a[0]) ? tv_str(want_str(r, a[0], "sep", pos)) : tv_none();
    return tv_list(py_split(&r->c, S(self), sep, maxsplit, self->name[0] == 'r', pos));
}

static int affix_match(tstr *s, tstr *x, int end)
{
    if (x->len > s->len)
        return 0;
    return !memcmp(end ? s->s + s->len - x->len : s->s, x->s, x->len);
}

M(m_affix)
{
    BIND(self->name, "prefix", "start", "end");
    if (given(a[1]) || given(a[2]))
        FAIL(r, pos, "%s: start/end arguments are not supported", self->name);
    int end = self->name[0] == 'e';
    if (a[0].t == TV_LIST && a[0].u.l->tuple) {
        for (size_t i = 0; i < a[0].u.l->n; i++)
            if (affix_match(S(self), want_str(r, a[0].u.l->items[i], "prefix", pos), end))
                return tv_bool(1);
        return tv_bool(0);
    }
    return tv_bool(affix_match(S(self), want_str(r, a[0], "prefix", pos), end));
}

M(m_replace)
{
    BIND("replace", "old", "new", "count");
    int64_t cnt = given(a[2]) ? want_int(r, a[2], "count", pos) : -1;
    return tv_str(py_replace(&r->c, S(self), want_str(r, a[0], "old", pos), want_str(r, a[1], "new", pos), cnt));
}

M(m_case)
{
    BIND(self->name, "_");
    (void)a;
    if (n_args)
        FAIL(r, pos, "%s() takes no arguments", self->name);
    int mode = !strcmp(self->name, "upper") ? 'u' : !strcmp(self->name, "lower") ? 'l'
               : !strcmp(self->name, "title") ? 't' : 'c';
    return tv_str(py_case(&r->c, S(self), mode));
}

/* find/rfind/index/rindex/count: code point positions, as Python. */
M(m_find)
{
    BIND(self->name, "sub", "start", "end");
    if (given(a[1]) || given(a[2]))
        FAIL(r, pos, "%s: start/end arguments are not supported", self->name);
    tstr *s = S(self), *sub = want_str(r, a[0], "sub", pos);
    const char *nm = self->name;
    if (!strcmp(nm, "count")) {
        if (!sub->len)
            return tv_int((int64_t)utf8_len(s->s, s->len) + 1);
        int64_t k = 0;
        size_t i = 0;
        const char *h;
        while (i <= s->len && (h = memmem(s->s + i, s->len - i, sub->s, sub->len))) {
            k++;
            i = (size_t)(h - s->s) + sub->len;
        }
        return tv_int(k);
    }
    long at = -1;
    if (nm[0] == 'r') {
        if (sub->len <= s->len)
            for (size_t j = s->len - sub->len + 1; j-- > 0;)
                if (!memcmp(s->s + j, sub->s, sub->len)) {
                    at = (long)j;
                    break;
                }
    } else {
        const char *h = memmem(s->s, s->len, sub->s, sub->len);
        if (h || !sub->len)
            at = h ? (long)(h - s->s) : 0;
    }
    if (at < 0) {
        if (strstr(nm, "index"))
            FAIL(r, pos, "substring not found");
        return tv_int(-1);
    }
    return tv_int((int64_t)utf8_len(s->s, (size_t)at));
}

M(m_join)
{
    BIND("join", "iterable");
    tlist *l = tpl_iter(r, a[0], pos);
    tbuf b = {0};
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            tbuf_put(&r->c, &b, S(self)->s, S(self)->len);
        tstr *x = want_str(r, l->items[i], "sequence item", pos);
        tbuf_put(&r->c, &b, x->s, x->len);
    }
    return tv_str(b.len ? tbuf_str(&r->c, &b) : tstr_new(&r->c, "", 0));
}

M(m_splitlines)
{
    BIND("splitlines", "keepends");
    if (tv_truthy(a[0]))
        FAIL(r, pos, "splitlines(keepends=True) is not supported");
    return tv_list(py_splitlines(&r->c, S(self)));
}

M(m_is)
{
    BIND(self->name, "_");
    (void)a;
    tstr *s = S(self);
    const char *nm = self->name;
    if (!s->len)
        return tv_bool(0);
    if (!strcmp(nm, "isspace")) {
        size_t i = 0, l;
        while (i < s->len) {
            if (!py_space_at(s->s + i, s->len - i, &l))
                return tv_bool(0);
            i += l;
        }
        return tv_bool(1);
    }
    if (!strcmp(nm, "islower") || !strcmp(nm, "isupper")) {
        int lower = nm[2] == 'l';
        tstr *t = py_case(&r->c, s, lower ? 'l' : 'u'), *o = py_case(&r->c, s, lower ? 'u' : 'l');
        return tv_bool(t->len == s->len && !memcmp(t->s, s->s, s->len) &&
                       !(o->len == s->len && !memcmp(o->s, s->s, s->len)));
    }
    for (size_t i = 0; i < s->len; i++) {
        unsigned char ch = (unsigned char)s->s[i];
        int digit = ch >= '0' && ch <= '9', alpha = ((ch | 32) >= 'a' && (ch | 32) <= 'z') || ch >= 0x80;
        int ok = !strcmp(nm, "isdigit") || !strcmp(nm, "isnumeric") || !strcmp(nm, "isdecimal") ? digit
                 : !strcmp(nm, "isalpha") ? alpha : digit || alpha;
        if (!ok)
            return tv_bool(0);
    }
    return tv_bool(1);
}

/* str.format with {} / {0} / {name} fields (no format specs). */
M(m_format)
{
    tstr *s = S(self);
    tbuf b = {0};
    int auto_idx = 0;
    for (size_t i = 0; i < s->len; i++) {
        char ch = s->s[i];
        if ((ch == '{' || ch == '}') && i + 1 < s->len && s->s[i + 1] == ch) {
            tbuf_putc(&r->c, &b, ch);
            i++;
            continue;
        }
        if (ch == '}')
            FAIL(r, pos, "single '}' encountered in format string");
        if (ch != '{') {
            tbuf_putc(&r->c, &b, ch);
            continue;
        }
        size_t j = i + 1;
        while (j < s->len && s->s[j] != '}')
            j++;
        if (j >= s->len)
            FAIL(r, pos, "single '{' encountered in format string");
        const char *f = s->s + i + 1;
        size_t fl = j - i - 1;
        if (memchr(f, ':', fl) || memchr(f, '!', fl) || memchr(f, '.', fl) || memchr(f, '[', fl))
            FAIL(r, pos, "format specs are not supported in str.format");
        tv v;
        if (fl == 0) {
            if (auto_idx >= n_args)
                FAIL(r, pos, "Replacement index %d out of range", auto_idx);
            v = args[auto_idx++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            long idx = 0;
            for (size_t q = 0; q < fl && f[q] >= '0' && f[q] <= '9' && idx < 1000000; q++)
                idx = idx * 10 + (f[q] - '0');
            if (idx >= n_args)
                FAIL(r, pos, "Replacement index %ld out of range", idx);
            v = args[idx];
        } else {
            int k;
            for (k = 0; k < nk; k++)
                if (kn[k]->len == fl && !memcmp(kn[k]->s, f, fl))
                    break;
            if (k == nk)
                FAIL(r, pos, "KeyError: '%.*s'", (int)fl, f);
            v = kv[k];
        }
        tv_str_to(&r->c, &b, v);
        i = j;
    }
    return tv_str(b.len ? tbuf_str(&r->c, &b) : tstr_new(&r->c, "", 0));
}

/* Python printf-style formatting (str % args, the format filter):
 * %[flags][width][.precision]type with flags "-0+ #" and types s r d i o x X
 * e E f F g G c %; args is a tuple or one value. Numbers go through C's
 * printf, whose output for these conversions matches Python's. */
static void pad_to(tpl_render *r, tbuf *b, const char *s, size_t n, int width, int left)
{
    size_t cps = utf8_len(s, n);
    if (!left)
        for (size_t k = cps; (long)k < width; k++)
            tbuf_putc(&r->c, b, ' ');
    tbuf_put(&r->c, b, s, n);
    if (left)
        for (size_t k = cps; (long)k < width; k++)
            tbuf_putc(&r->c, b, ' ');
}

tv tpl_percent_format(tpl_render *r, tstr *fmt, tv args, long pos)
{
    tv one[1] = {args};
    tv *items = one;
    size_t n = 1, k = 0;
    if (args.t == TV_LIST && args.u.l->tuple) {
        items = args.u.l->items;
        n = args.u.l->n;
    }
    tbuf b = {0};
    for (size_t i = 0; i < fmt->len; i++) {
        char ch = fmt->s[i];
        if (ch != '%') {
            tbuf_putc(&r->c, &b, ch);
            continue;
        }
        char flags[8];
        int nf = 0, width = 0, prec = -1;
        while (++i < fmt->len && strchr("-0+ #", fmt->s[i]) && nf < 5)
            flags[nf++] = fmt->s[i];
        flags[nf] = '\0';
        while (i < fmt->len && fmt->s[i] >= '0' && fmt->s[i] <= '9') {
            if (width < 1000)
                width = width * 10 + (fmt->s[i] - '0');
            i++;
        }
        if (i < fmt->len && fmt->s[i] == '.') {
            prec = 0;
            while (++i < fmt->len && fmt->s[i] >= '0' && fmt->s[i] <= '9')
                if (prec < 100)
                    prec = prec * 10 + (fmt->s[i] - '0');
        }
        if (i >= fmt->len)
            FAIL(r, pos, "incomplete format");
        if (width > 1000)
            width = 1000;
        char conv = fmt->s[i];
        if (conv == '%') {
            tbuf_putc(&r->c, &b, '%');
            continue;
        }
        if (k >= n)
            FAIL(r, pos, "not enough arguments for format string");
        tv v = items[k++];
        int left = strchr(flags, '-') != NULL;
        if (conv == 's' || conv == 'r' || conv == 'a' || conv == 'c') {
            tbuf t = {0};
            if (conv == 'c') {
                if (v.t == TV_INT && v.u.i >= 0 && v.u.i <= 0x10FFFF)
                    utf8_put(&r->c, &t, (int32_t)v.u.i);
                else if (v.t == TV_STR && utf8_len(v.u.s->s, v.u.s->len) == 1)
                    tbuf_put(&r->c, &t, v.u.s->s, v.u.s->len);
                else
                    FAIL(r, pos, "%%c requires an int or a unicode character");
            } else if (conv == 's') {
                tv_str_to(&r->c, &t, v);
            } else {
                tv_repr_to(&r->c, &t, v);
            }
            size_t len = t.len;
            if (prec >= 0 && conv != 'c')
                len = utf8_offset(t.p ? t.p : "", t.len, (size_t)prec);
            pad_to(r, &b, t.p ? t.p : "", len, width, left);
            continue;
        }
        if (!strchr("diouxXeEfFgG", conv))
            FAIL(r, pos, "unsupported format character '%c'", conv);
        if (v.t == TV_UNDEF)
            tpl_undefined_fail(r, v, pos);
        if (!tv_is_number(v))
            FAIL(r, pos, "%%%c format: a real number is required, not %s", conv, tv_type_name(v));
        char spec[32], out[1200];
        int integer = strchr("diouxX", conv) != NULL;
        if (integer && v.t == TV_FLOAT && conv != 'd' && conv != 'i' && conv != 'u')
            FAIL(r, pos, "%%%c format: an integer is required, not float", conv);
        if (integer) {
            if (v.t == TV_FLOAT && !(v.u.f > -9.2e18 && v.u.f < 9.2e18))
                FAIL(r, pos, "%%%c format: number out of range", conv);
            long long x = v.t == TV_FLOAT ? (long long)v.u.f : (long long)v.u.i;
            char c2 = conv == 'i' || conv == 'u' ? 'd' : conv;
            if (c2 != 'd' && x < 0) { /* Python prints -0x1f, C would wrap */
                snprintf(spec, sizeof spec, "%%%s*.*ll%c", flags, c2);
                char tmp[1100];
                snprintf(tmp, sizeof tmp, spec, 0, prec < 0 ? 1 : prec, (unsigned long long)(-(x + 1)) + 1);
                snprintf(out, sizeof out, "-%s", tmp);
                pad_to(r, &b, out, strlen(out), width, left);
                continue;
            }
            snprintf(spec, sizeof spec, "%%%s*.*ll%c", flags, c2);
            if (prec < 0)
                snprintf(spec, sizeof spec, "%%%s*ll%c", flags, c2);
            if (prec < 0)
                snprintf(out, sizeof out, spec, width, x);
            else
                snprintf(out, sizeof out, spec, width, prec, x);
            if (conv == 'o' && strchr(flags, '#')) { /* Python's alternate octal is 0o */
                char *z = strchr(out, '0');
                if (z) {
                    memmove(z + 1, z, strlen(z) + 1);
                    z[1] = 'o';
                }
            }
        } else {
            snprintf(spec, sizeof spec, "%%%s*.*%c", flags, conv);
            snprintf(out, sizeof out, spec, width, prec < 0 ? 6 : prec, tv_num(v));
        }
        tbuf_puts(&r->c, &b, out);
    }
    /* Python: a tuple must be used up; a list, dict or Undefined (anything
     * with __getitem__) counts as a mapping argument and may go unused; any
     * other single value must be used */
    int tuple = args.t == TV_LIST && args.u.l->tuple;
    if ((tuple && k < n) || (!tuple && k == 0 && args.t != TV_LIST && args.t != TV_DICT && args.t != TV_UNDEF))
        FAIL(r, pos, "not all arguments converted during string formatting");
    return tv_str(b.len ? tbuf_str(&r->c, &b) : tstr_new(&r->c, "", 0));
}

/* ---- dict and list ----------------------------------------------------- */

M(m_items)
{
    BIND(self->name, "_");
    (void)a;
    if (n_args)
        FAIL(r, pos, "%s() takes no arguments", self->name);
    tdict *d = self->self.u.d;
    tlist *l = tlist_new(&r->c, d->n);
    for (size_t i = 0; i < d->n; i++) {
        if (self->name[0] == 'k') {
            l->items[i] = d->keys[i];
        } else if (self->name[0] == 'v') {
            l->items[i] = d->vals[i];
        } else {
            tlist *p = tlist_new(&r->c, 2);
            p->tuple = 1;
            p->items[0] = d->keys[i];
            p->items[1] = d->vals[i];
            l->items[i] = tv_list(p);
        }
    }
    return tv_list(l);
}

M(m_get)
{
    BIND("get", "key", "default");
    tv *v = tdict_get(self->self.u.d, a[0]);
    if (v)
        return *v;
    return a[1].t == TV_UNDEF ? tv_none() : a[1];
}

M(m_copy)
{
    BIND("copy", "_");
    (void)a;
    return self->self;
}

M(m_list_index)
{
    BIND(self->name, "value");
    tlist *l = self->self.u.l;
    int64_t k = 0;
    for (size_t i = 0; i < l->n; i++)
        if (tv_eq(l->items[i], a[0])) {
            if (self->name[0] == 'i')
                return tv_int((int64_t)i);
            k++;
        }
    if (self->name[0] == 'i')
        FAIL(r, pos, "value is not in list");
    return tv_int(k);
}

static const struct method {
    uint8_t type;
    const char *name;
    tfunc_impl fn;
} methods[] = {
    {TV_STR, "strip", m_strip_any}, {TV_STR, "lstrip", m_strip_any}, {TV_STR, "rstrip", m_strip_any},
    {TV_STR, "split", m_split_any}, {TV_STR, "rsplit", m_split_any},
    {TV_STR, "startswith", m_affix}, {TV_STR, "endswith", m_affix},
    {TV_STR, "replace", m_replace}, {TV_STR, "upper", m_case}, {TV_STR, "lower", m_case},
    {TV_STR, "title", m_case}, {TV_STR, "capitalize", m_case}, {TV_STR, "find", m_find},
    {TV_STR, "rfind", m_find}, {TV_STR, "index", m_find}, {TV_STR, "rindex", m_find},
    {TV_STR, "count", m_find}, {TV_STR, "join", m_join}, {TV_STR, "splitlines", m_splitlines},
    {TV_STR, "isdigit", m_is}, {TV_STR, "isnumeric", m_is}, {TV_STR, "isdecimal", m_is},
    {TV_STR, "isalpha", m_is}, {TV_STR, "isalnum", m_is}, {TV_STR, "isspace", m_is},
    {TV_STR, "islower", m_is}, {TV_STR, "isupper", m_is}, {TV_STR, "format", m_format},
    {TV_DICT, "items", m_items}, {TV_DICT, "keys", m_items}, {TV_DICT, "values", m_items},
    {TV_DICT, "get", m_get}, {TV_DICT, "copy", m_copy},
    {TV_LIST, "index", m_list_index}, {TV_LIST, "count", m_list_index}, {TV_LIST, "copy", m_copy},
};

/* Mutating methods: the immutable sandbox makes them unusable. */
static const char *const unsafe[] = {"append", "extend", "insert", "pop", "remove", "sort",
                                     "reverse", "clear", "update", "setdefault", "popitem", NULL};

tv tpl_method(tpl_render *r, tv obj, const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].type == obj.t && methods[i].name[0] == name[0] && strlen(methods[i].name) == len &&
            !memcmp(methods[i].name, name, len))
            return mkfunc(r, methods[i].name, methods[i].fn, obj);
    if (obj.t == TV_LIST || obj.t == TV_DICT)
        for (int i = 0; unsafe[i]; i++)
            if (unsafe[i][0] == name[0] && strlen(unsafe[i]) == len && !memcmp(unsafe[i], name, len)) {
                char buf[128];
                snprintf(buf, sizeof buf, "access to attribute '%s' of '%s' object is unsafe.", unsafe[i],
                         tv_type_name(obj));
                return tv_undef(tstr_cstr(&r->c, buf)->s);
            }
    return tv_undef(NULL);
}

/* ---- globals ------------------------------------------------------------- */

M(g_range)
{
    (void)self;
    if (nk || n_args < 1 || n_args > 3)
        FAIL(r, pos, "range expected 1 to 3 integer arguments");
    int64_t start = 0, stop, step = 1;
    if (n_args == 1) {
        stop = want_int(r, args[0], "range argument", pos);
    } else {
        start = want_int(r, args[0], "range argument", pos);
        stop = want_int(r, args[1], "range argument", pos);
        if (n_args == 3)
            step = want_int(r, args[2], "range argument", pos);
    }
    if (step == 0)
        FAIL(r, pos, "range() arg 3 must not be zero");
    uint64_t n = 0;
    if (step > 0 && stop > start) {
        uint64_t diff = (uint64_t)stop - (uint64_t)start, us = (uint64_t)step;
        n = diff / us + (diff % us != 0);
    } else if (step < 0 && start > stop) {
        uint64_t diff = (uint64_t)start - (uint64_t)stop, us = (uint64_t)(-(step + 1)) + 1;
        n = diff / us + (diff % us != 0);
    }
    /* jinja2's sandbox caps range() at 100000 items (MAX_RANGE) */
    if (n > 100000)
        tpl_fail(&r->c, TERN_EFULL, pos, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    tlist *l = tlist_new(&r->c, (size_t)n);
    for (uint64_t i = 0; i < n; i++)
        l->items[i] = tv_int((int64_t)((uint64_t)start + i * (uint64_t)step)); /* modular: no UB */
    return tv_list(l);
}

static void kw_into(tpl_render *r, tdict *d, tv *args, int n_args, tstr **kn, tv *kv, int nk, long pos)
{
    if (n_args > 1)
        FAIL(r, pos, "expected at most 1 positional argument");
    if (n_args == 1) {
        if (args[0].t != TV_DICT)
            FAIL(r, pos, "positional argument must be a mapping");
        for (size_t i = 0; i < args[0].u.d->n; i++)
            tdict_set(&r->c, d, args[0].u.d->keys[i], args[0].u.d->vals[i]);
    }
    for (int k = 0; k < nk; k++)
        tdict_set(&r->c, d, tv_str(kn[k]), kv[k]);
}

M(g_dict)
{
    (void)self;
    tdict *d = tdict_new(&r->c, (size_t)nk + 1);
    kw_into(r, d, args, n_args, kn, kv, nk, pos);
    return tv_dict(d);
}

M(g_namespace)
{
    (void)self;
    tdict *d = tdict_new(&r->c, (size_t)nk + 1);
    kw_into(r, d, args, n_args, kn, kv, nk, pos);
    tv v;
    v.t = TV_NS;
    v.u.d = d;
    return v;
}

M(g_raise)
{
    (void)self; (void)kn; (void)kv; (void)nk;
    tstr *msg = n_args ? tv_to_tstr(&r->c, args[0]) : tstr_cstr(&r->c, "");
    tpl_fail_raw(&r->c, TERN_EINVAL, pos, msg->s);
}

M(g_strftime)
{
    (void)self;
    BIND("strftime_now", "format");
    tstr *fmt = want_str(r, a[0], "format", pos);
    time_t t = (time_t)r->now;
    struct tm tm;
    localtime_r(&t, &tm);
    char buf[512];
    if (fmt->len > 200)
        FAIL(r, pos, "strftime_now: format too long");
    size_t n = fmt->len ? strftime(buf, sizeof buf, fmt->s, &tm) : 0;
    return tv_str(tstr_new(&r->c, buf, n));
}

M(g_joiner_call)
{
    (void)args; (void)n_args; (void)kn; (void)kv; (void)nk; (void)pos;
    tdict *state = self->self.u.d;
    tv *used = tdict_get_str(state, "used", 4), *sep = tdict_get_str(state, "sep", 3);
    if (!tv_truthy(*used)) {
        *used = tv_bool(1);
        return tv_str(tstr_new(&r->c, "", 0));
    }
    return *sep;
}

M(g_joiner)
{
    (void)self;
    BIND("joiner", "sep");
    tdict *state = tdict_new(&r->c, 2);
    tdict_set(&r->c, state, tv_str(tstr_cstr(&r->c, "sep")), a[0].t == TV_UNDEF ? tv_str(tstr_cstr(&r->c, ", ")) : a[0]);
    tdict_set(&r->c, state, tv_str(tstr_cstr(&r->c, "used")), tv_bool(0));
    return mkfunc(r, "joiner", g_joiner_call, tv_dict(state));
}

void tpl_add_globals(tpl_render *r, tdict *g)
{
    static const struct {
        const char *name;
        tfunc_impl fn;
    } gl[] = {{"range", g_range}, {"dict", g_dict}, {"namespace", g_namespace},
              {"raise_exception", g_raise}, {"strftime_now", g_strftime}, {"joiner", g_joiner}};
    for (size_t i = 0; i < sizeof gl / sizeof gl[0]; i++)
        tdict_set(&r->c, g, tv_str(tstr_cstr(&r->c, gl[i].name)), mkfunc(r, gl[i].name, gl[i].fn, tv_undef(NULL)));
}
