/* Jinja filters and tests, with jinja2's defaults (sort/unique/dictsort are
 * case-insensitive, round is Python's banker's rounding, indent follows
 * jinja2's splitlines quirk) and HF's tojson (ensure_ascii off, no HTML
 * escaping, indent/separators/sort_keys options). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpl_int.h"

#define FAIL(r, pos, ...) tpl_fail(&(r)->c, TERN_EINVAL, (pos), __VA_ARGS__)

void tpl_bind_args(tpl_render *r, const char *what, const char *const *params, int n_params,
                   tv *args, int n_args, tstr **kw_names, tv *kw_vals, int n_kw, tv *out, long pos)
{
    if (n_args > n_params)
        FAIL(r, pos, "%s() takes at most %d arguments (%d given)", what, n_params, n_args);
    for (int i = 0; i < n_params; i++)
        out[i] = i < n_args ? args[i] : tv_undef(NULL);
    for (int k = 0; k < n_kw; k++) {
        int i;
        for (i = 0; i < n_params; i++)
            if (!strcmp(params[i], kw_names[k]->s))
                break;
        if (i == n_params)
            FAIL(r, pos, "%s() got an unexpected keyword argument '%s'", what, kw_names[k]->s);
        if (i < n_args)
            FAIL(r, pos, "%s() got multiple values for argument '%s'", what, kw_names[k]->s);
        out[i] = kw_vals[k];
    }
}

static tstr *empty(tpl_render *r) { return tstr_new(&r->c, "", 0); }
static int given(tv v) { return v.t != TV_UNDEF; }

static int64_t want_int(tpl_render *r, tv v, const char *what, long pos)
{
    if (v.t == TV_INT || v.t == TV_BOOL)
        return v.u.i;
    FAIL(r, pos, "%s must be an integer, not %s", what, tv_type_name(v));
}

/* Jinja's make_attrgetter: "a.b.0" walks items/attributes. */
static tv get_path(tpl_render *r, tv item, tv attr, long pos)
{
    if (attr.t == TV_INT)
        return tpl_getitem(r, item, attr, pos);
    tstr *s = tv_to_tstr(&r->c, attr);
    size_t i = 0;
    while (i <= s->len) {
        size_t j = i;
        while (j < s->len && s->s[j] != '.')
            j++;
        int digits = j > i;
        for (size_t k = i; k < j; k++)
            digits &= s->s[k] >= '0' && s->s[k] <= '9';
        tv key;
        if (digits && j - i < 18)
            key = tv_int(strtoll(s->s + i, NULL, 10));
        else
            key = tv_str(tstr_new(&r->c, s->s + i, j - i));
        item = tpl_getitem(r, item, key, pos);
        i = j + 1;
    }
    return item;
}

/* Sort key with case folding for strings (jinja's ignore_case). */
static tv fold(tpl_render *r, tv v, int case_sensitive)
{
    if (!case_sensitive && v.t == TV_STR)
        return tv_str(py_case(&r->c, v.u.s, 'l'));
    return v;
}

/* Stable merge sort of items by keys (both permuted together). */
static void msort(tpl_render *r, tv *keys, tv *items, size_t n, int reverse, long pos, tv *tk, tv *ti)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    msort(r, keys, items, h, reverse, pos, tk, ti);
    msort(r, keys + h, items + h, n - h, reverse, pos, tk, ti);
    size_t a = 0, b = h, o = 0;
    while (a < h && b < n) {
        int c = tv_cmp(&r->c, keys[b], keys[a], pos);
        int take_b = reverse ? c > 0 : c < 0;
        if (take_b) {
            tk[o] = keys[b];
            ti[o++] = items[b++];
        } else {
            tk[o] = keys[a];
            ti[o++] = items[a++];
        }
    }
    while (a < h) {
        tk[o] = keys[a];
        ti[o++] = items[a++];
    }
    while (b < n) {
        tk[o] = keys[b];
        ti[o++] = items[b++];
    }
    memcpy(keys, tk, n * sizeof(tv));
    memcpy(items, ti, n * sizeof(tv));
}

static tlist *sorted(tpl_render *r, tlist *in, tv *keys, int reverse, long pos)
{
    tlist *out = tlist_new(&r->c, in->n);
    if (in->n)
        memcpy(out->items, in->items, in->n * sizeof(tv));
    tv *tk = tpl_alloc(&r->c, (in->n + 1) * sizeof(tv)), *ti = tpl_alloc(&r->c, (in->n + 1) * sizeof(tv));
    msort(r, keys, out->items, in->n, reverse, pos, tk, ti);
    return out;
}

static tv f_tojson(tpl_render *r, tv v, tv *a, long pos)
{
    /* HF: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    tjson_opts o = {NULL, ", ", ": ", 0, 0};
    char ind[64];
    o.ensure_ascii = given(a[0]) && tv_truthy(a[0]);
    if (given(a[1]) && a[1].t != TV_NONE) {
        if (a[1].t == TV_STR) {
            o.indent = a[1].u.s->s;
        } else {
            int64_t k = want_int(r, a[1], "indent", pos);
            if (k < 0)
                k = 0;
            if (k > 60)
                k = 60;
            memset(ind, ' ', (size_t)k);
            ind[k] = '\0';
            o.indent = ind;
        }
        o.item_sep = ",";
    }
    if (given(a[2]) && a[2].t != TV_NONE) {
        if (a[2].t != TV_LIST || a[2].u.l->n != 2 || a[2].u.l->items[0].t != TV_STR ||
            a[2].u.l->items[1].t != TV_STR)
            FAIL(r, pos, "tojson: separators must be a pair of strings");
        o.item_sep = a[2].u.l->items[0].u.s->s;
        o.key_sep = a[2].u.l->items[1].u.s->s;
    }
    o.sort_keys = given(a[3]) && tv_truthy(a[3]);
    tbuf b = {0};
    tv_tojson_to(&r->c, &b, v, &o, pos);
    return tv_str(tbuf_str(&r->c, &b));
}

static tv f_indent(tpl_render *r, tv v, tv width, tv first, tv blank, long pos)
{
    tstr *ind;
    if (width.t == TV_STR) {
        ind = width.u.s;
    } else {
        int64_t w = given(width) ? want_int(r, width, "width", pos) : 4;
        if (w < 0)
            w = 0;
        if (w > 1000)
            w = 1000;
        char sp[1001];
        memset(sp, ' ', (size_t)w);
        ind = tstr_new(&r->c, sp, (size_t)w);
    }
    tstr *s = tv_to_tstr(&r->c, v);
    tbuf t = {0};
    tbuf_put(&r->c, &t, s->s, s->len);
    tbuf_putc(&r->c, &t, '\n');
    tlist *lines = py_splitlines(&r->c, tbuf_str(&r->c, &t));
    tbuf o = {0};
    if (tv_truthy(first))
        tbuf_put(&r->c, &o, ind->s, ind->len);
    for (size_t i = 0; i < lines->n; i++) {
        tstr *ln = lines->items[i].u.s;
        if (i) {
            tbuf_putc(&r->c, &o, '\n');
            if (ln->len || tv_truthy(blank))
                tbuf_put(&r->c, &o, ind->s, ind->len);
        }
        tbuf_put(&r->c, &o, ln->s, ln->len);
    }
    return tv_str(o.len ? tbuf_str(&r->c, &o) : empty(r));
}

static int py_parse_int(const char *s, size_t n, int base, int64_t *out)
{
    size_t i = 0, l;
    while (i < n && py_space_at(s + i, n - i, &l))
        i += l;
    while (n > i && py_space_at(s + n - 1, 1, &l))
        n--;
    int neg = 0;
    if (i < n && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    if (i + 1 < n && s[i] == '0') { /* 0x/0o/0b prefixes match their base */
        char p = (char)(s[i + 1] | 32);
        if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2))
            i += 2;
    }
    if (i >= n)
        return -1;
    int64_t v = 0;
    int nd = 0;
    for (; i < n; i++) {
        char ch = s[i];
        if (ch == '_' && nd && i + 1 < n && s[i + 1] != '_')
            continue;
        int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'z' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'Z' ? ch - 'A' + 10 : 99;
        if (d >= base)
            return -1;
        if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v))
            return -1;
        nd++;
    }
    *out = neg ? -v : v;
    return 0;
}

static int py_parse_float(tstr *s, double *out)
{
    size_t i = 0, n = s->len, l;
    while (i < n && py_space_at(s->s + i, n - i, &l))
        i += l;
    while (n > i && py_space_at(s->s + n - 1, 1, &l))
        n--;
    if (i >= n || n - i > 300)
        return -1;
    char buf[320];
    size_t k = 0;
    for (size_t j = i; j < n; j++)
        if (s->s[j] != '_')
            buf[k++] = s->s[j];
    buf[k] = '\0';
    if (strchr(buf, 'x') || strchr(buf, 'X'))
        return -1; /* strtod accepts hex floats, Python does not */
    char *end;
    *out = strtod(buf, &end);
    return *end ? -1 : 0;
}

static tv do_round(tpl_render *r, tv v, tv prec, tv method, long pos)
{
    int64_t p = given(prec) ? want_int(r, prec, "precision", pos) : 0;
    const char *m = method.t == TV_STR ? method.u.s->s : "common";
    if (!tv_is_number(v))
        FAIL(r, pos, "round: %s is not a number", tv_type_name(v));
    if (strcmp(m, "common") && strcmp(m, "ceil") && strcmp(m, "floor"))
        FAIL(r, pos, "method must be common, ceil or floor");
    if (v.t != TV_FLOAT && !strcmp(m, "common"))
        return tv_int(v.u.i); /* Python round(int, n>=0) stays an int */
    double x = tv_num(v);
    if (p > 300) p = 300;
    if (p < -300) p = -300;
    if (!strcmp(m, "common")) {
        if (p == 0)
            return tv_float(nearbyint(x));
        char buf[400];
        if (p > 0) {
            snprintf(buf, sizeof buf, "%.*f", (int)p, x);
            return tv_float(strtod(buf, NULL));
        }
        double sc = pow(10.0, (double)-p);
        return tv_float(nearbyint(x / sc) * sc);
    }
    double sc = pow(10.0, (double)p);
    return tv_float((!strcmp(m, "ceil") ? ceil(x * sc) : floor(x * sc)) / sc);
}

static tv apply_select(tpl_render *r, tv seq, tv *args, int n_args, int attr_mode, int keep,
                       long pos)
{
    /* jinja2 only iterates a truthy value: falsy non-iterables give nothing */
    tlist *in = tv_truthy(seq) ? tpl_iter(r, seq, pos) : tlist_new(&r->c, 0);
    tlist *out = tlist_new(&r->c, in->n);
    size_t k = 0;
    int ai = 0;
    tv attr = tv_undef(NULL);
    if (attr_mode) {
        if (n_args < 1)
            FAIL(r, pos, "missing parameter for attribute name");
        attr = args[ai++];
    }
    const char *test = NULL;
    if (ai < n_args) {
        if (args[ai].t != TV_STR)
            FAIL(r, pos, "test name must be a string");
        test = args[ai++].u.s->s;
    }
    for (size_t i = 0; i < in->n; i++) {
        tpl_step(r, pos);
        tv item = in->items[i];
        tv x = attr_mode ? get_path(r, item, attr, pos) : item;
        int res = test ? tpl_test(r, test, x, args + ai, n_args - ai, pos) : tv_truthy(x);
        if (res == keep)
            out->items[k++] = item;
    }
    out->n = k;
    return tv_list(out);
}

static tv f_map(tpl_render *r, tv seq, tv *args, int n_args, tstr **kn, tv *kv, int nk, long pos)
{
    tlist *in = tv_truthy(seq) ? tpl_iter(r, seq, pos) : tlist_new(&r->c, 0);
    tlist *out = tlist_new(&r->c, in->n);
    tv attr = tv_undef(NULL), dflt = tv_undef(NULL);
    for (int k = 0; k < nk; k++) {
        if (!strcmp(kn[k]->s, "attribute"))
            attr = kv[k];
        else if (!strcmp(kn[k]->s, "default"))
            dflt = kv[k];
        else
            FAIL(r, pos, "map: unexpected keyword argument '%s'", kn[k]->s);
    }
    if (given(attr)) {
        for (size_t i = 0; i < in->n; i++) {
            tv x = get_path(r, in->items[i], attr, pos);
            out->items[i] = x.t == TV_UNDEF && given(dflt) ? dflt : x;
        }
        return tv_list(out);
    }
    if (n_args < 1 || args[0].t != TV_STR)
        FAIL(r, pos, "map requires a filter name or attribute=");
    for (size_t i = 0; i < in->n; i++) {
        tpl_step(r, pos);
        out->items[i] = tpl_filter(r, args[0].u.s->s, in->items[i], args + 1, n_args - 1, NULL, NULL, 0, pos);
    }
    return tv_list(out);
}

#define P(...) static const char *const params[] = {__VA_ARGS__}; \
    tv a[sizeof params / sizeof params[0]]; \
    tpl_bind_args(r, name, params, (int)(sizeof params / sizeof params[0]), args, n_args, kn, kv, nk, a, pos)
#define IS(w) (!strcmp(name, w))

static const char *const filter_names[] = {
    "trim", "length", "count", "upper", "lower", "title", "capitalize", "replace", "join",
    "default", "d", "first", "last", "list", "map", "select", "reject", "selectattr",
    "rejectattr", "items", "tojson", "string", "int", "float", "abs", "round", "indent", "safe",
    "unique", "reverse", "sort", "dictsort", "min", "max", "sum", "escape", "e", "attr",
    "wordcount", "format", NULL};

int tpl_filter_exists(const char *name)
{
    for (int i = 0; filter_names[i]; i++)
        if (!strcmp(filter_names[i], name))
            return 1;
    return 0;
}

tv tpl_filter(tpl_render *r, const char *name, tv v, tv *args, int n_args, tstr **kn, tv *kv,
              int nk, long pos)
{
    tpl_ctx *c = &r->c;
    if (IS("trim")) {
        P("chars");
        return tv_str(py_strip(c, tv_to_tstr(c, v), a[0].t == TV_STR ? a[0] : tv_none(), 1, 1));
    }
    if (IS("length") || IS("count")) {
        P("_");
        (void)a;
        switch (v.t) {
        case TV_STR: return tv_int((int64_t)utf8_len(v.u.s->s, v.u.s->len));
        case TV_LIST: return tv_int((int64_t)v.u.l->n);
        case TV_DICT: return tv_int((int64_t)v.u.d->n);
        case TV_UNDEF: return tv_int(0);
        default: FAIL(r, pos, "object of type '%s' has no len()", tv_type_name(v));
        }
    }
    if (IS("upper") || IS("lower") || IS("capitalize") || IS("title")) {
        P("_");
        (void)a;
        int mode = IS("upper") ? 'u' : IS("lower") ? 'l' : IS("capitalize") ? 'c' : 'j';
        return tv_str(py_case(c, tv_to_tstr(c, v), mode));
    }
    if (IS("replace")) {
        P("old", "new", "count");
        if (a[0].t != TV_STR || a[1].t != TV_STR)
            FAIL(r, pos, "replace: old and new must be strings");
        int64_t cnt = given(a[2]) && a[2].t != TV_NONE ? want_int(r, a[2], "count", pos) : -1;
        return tv_str(py_replace(c, tv_to_tstr(c, v), a[0].u.s, a[1].u.s, cnt));
    }
    if (IS("join")) {
        P("d", "attribute");
        tlist *l = tpl_iter(r, v, pos);
        tstr *sep = given(a[0]) ? tv_to_tstr(c, a[0]) : empty(r);
        tbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                tbuf_put(c, &b, sep->s, sep->len);
            tv x = given(a[1]) ? get_path(r, l->items[i], a[1], pos) : l->items[i];
            tv_str_to(c, &b, x);
        }
        return tv_str(b.len ? tbuf_str(c, &b) : empty(r));
    }
    if (IS("default") || IS("d")) {
        P("default_value", "boolean");
        tv dv = given(a[0]) ? a[0] : tv_str(empty(r));
        if (v.t == TV_UNDEF || (tv_truthy(a[1]) && !tv_truthy(v)))
            return dv;
        return v;
    }
    if (IS("first") || IS("last")) {
        P("_");
        (void)a;
        tlist *l = tpl_iter(r, v, pos);
        if (!l->n)
            return tv_undef(IS("first") ? "No first item, sequence was empty." : "No last item, sequence was empty.");
        return IS("first") ? l->items[0] : l->items[l->n - 1];
    }
    if (IS("list")) {
        P("_");
        (void)a;
        tlist *l = tpl_iter(r, v, pos);
        tlist *o = tlist_new(c, l->n);
        if (l->n)
            memcpy(o->items, l->items, l->n * sizeof(tv));
        return tv_list(o);
    }
    if (IS("map"))
        return f_map(r, v, args, n_args, kn, kv, nk, pos);
    if (IS("select") || IS("reject") || IS("selectattr") || IS("rejectattr")) {
        if (nk)
            FAIL(r, pos, "%s takes no keyword arguments", name);
        return apply_select(r, v, args, n_args, IS("selectattr") || IS("rejectattr"),
                            IS("select") || IS("selectattr"), pos);
    }
    if (IS("items")) {
        P("_");
        (void)a;
        if (v.t == TV_UNDEF)
            return tv_list(tlist_new(c, 0));
        if (v.t != TV_DICT)
            FAIL(r, pos, "Can only get item pairs from a mapping.");
        tlist *o = tlist_new(c, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) {
            tlist *pair = tlist_new(c, 2);
            pair->tuple = 1;
            pair->items[0] = v.u.d->keys[i];
            pair->items[1] = v.u.d->vals[i];
            o->items[i] = tv_list(pair);
        }
        return tv_list(o);
    }
    if (IS("tojson")) {
        P("ensure_ascii", "indent", "separators", "sort_keys");
        return f_tojson(r, v, a, pos);
    }
    if (IS("string")) {
        P("_");
        (void)a;
        return tv_str(tv_to_tstr(c, v));
    }
    if (IS("int")) {
        P("default", "base");
        if (v.t == TV_UNDEF) /* Undefined.__int__ raises */
            tpl_undefined_fail(r, v, pos);
        tv dflt = given(a[0]) ? a[0] : tv_int(0);
        int64_t base = given(a[1]) ? want_int(r, a[1], "base", pos) : 10;
        if (base < 2 || base > 36)
            FAIL(r, pos, "int() base must be >= 2 and <= 36");
        int64_t out;
        double d;
        switch (v.t) {
        case TV_INT: case TV_BOOL: return tv_int(v.u.i);
        case TV_FLOAT:
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18)
                return dflt;
            return tv_int((int64_t)v.u.f);
        case TV_STR:
            if (!py_parse_int(v.u.s->s, v.u.s->len, (int)base, &out))
                return tv_int(out);
            if (!py_parse_float(v.u.s, &d) && isfinite(d) && fabs(d) < 9.2e18)
                return tv_int((int64_t)d);
            return dflt;
        default: return dflt;
        }
    }
    if (IS("float")) {
        P("default");
        if (v.t == TV_UNDEF)
            tpl_undefined_fail(r, v, pos);
        tv dflt = given(a[0]) ? a[0] : tv_float(0.0);
        double d;
        if (tv_is_number(v))
            return tv_float(tv_num(v));
        if (v.t == TV_STR && !py_parse_float(v.u.s, &d))
            return tv_float(d);
        return dflt;
    }
    if (IS("abs")) {
        P("_");
        (void)a;
        if (v.t == TV_FLOAT)
            return tv_float(fabs(v.u.f));
        if (v.t == TV_INT || v.t == TV_BOOL) {
            if (v.u.i == INT64_MIN)
                FAIL(r, pos, "integer overflow");
            return tv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        FAIL(r, pos, "bad operand type for abs(): '%s'", tv_type_name(v));
    }
    if (IS("round")) {
        P("precision", "method");
        return do_round(r, v, a[0], a[1], pos);
    }
    if (IS("indent")) {
        P("width", "first", "blank");
        if (v.t == TV_UNDEF)
            tpl_undefined_fail(r, v, pos);
        if (v.t != TV_STR) /* jinja2 does `s += "\n"` on the value itself */
            FAIL(r, pos, "unsupported operand type(s) for +=: '%s' and 'str'", tv_type_name(v));
        return f_indent(r, v, a[0], a[1], a[2], pos);
    }
    if (IS("safe")) {
        P("_");
        (void)a;
        return v;
    }
    if (IS("escape") || IS("e")) {
        P("_");
        (void)a;
        tstr *s = tv_to_tstr(c, v);
        tbuf b = {0};
        for (size_t i = 0; i < s->len; i++) {
            switch (s->s[i]) {
            case '&': tbuf_puts(c, &b, "&amp;"); break;
            case '<': tbuf_puts(c, &b, "&lt;"); break;
            case '>': tbuf_puts(c, &b, "&gt;"); break;
            case '"': tbuf_puts(c, &b, "&#34;"); break;
            case '\'': tbuf_puts(c, &b, "&#39;"); break;
            default: tbuf_putc(c, &b, s->s[i]);
            }
        }
        return tv_str(b.len ? tbuf_str(c, &b) : empty(r));
    }
    if (IS("unique")) {
        P("case_sensitive", "attribute");
        tlist *l = tpl_iter(r, v, pos);
        tlist *o = tlist_new(c, l->n);
        tv *seen = tpl_alloc(c, (l->n + 1) * sizeof(tv));
        size_t k = 0;
        for (size_t i = 0; i < l->n; i++) {
            tpl_step(r, pos);
            tv key = given(a[1]) ? get_path(r, l->items[i], a[1], pos) : l->items[i];
            key = fold(r, key, tv_truthy(a[0]));
            if ((key.t == TV_LIST && !key.u.l->tuple) || key.t == TV_DICT || key.t == TV_NS)
                FAIL(r, pos, "unhashable type: '%s'", tv_type_name(key));
            size_t j;
            for (j = 0; j < k; j++)
                if (tv_eq(seen[j], key))
                    break;
            if (j == k) {
                seen[k] = key;
                o->items[k++] = l->items[i];
            }
        }
        o->n = k;
        return tv_list(o);
    }
    if (IS("reverse")) {
        P("_");
        (void)a;
        if (v.t == TV_STR)
            return tv_str(py_slice_str(c, v.u.s, 0, 0, -1, 0, 0));
        tlist *l = tpl_iter(r, v, pos);
        tlist *o = tlist_new(c, l->n);
        for (size_t i = 0; i < l->n; i++)
            o->items[i] = l->items[l->n - 1 - i];
        return tv_list(o);
    }
    if (IS("sort")) {
        P("reverse", "case_sensitive", "attribute");
        tlist *l = tpl_iter(r, v, pos);
        tv *keys = tpl_alloc(c, (l->n + 1) * sizeof(tv));
        for (size_t i = 0; i < l->n; i++)
            keys[i] = fold(r, given(a[2]) ? get_path(r, l->items[i], a[2], pos) : l->items[i],
                           tv_truthy(a[1]));
        return tv_list(sorted(r, l, keys, tv_truthy(a[0]), pos));
    }
    if (IS("dictsort")) {
        P("case_sensitive", "by", "reverse");
        if (v.t != TV_DICT)
            FAIL(r, pos, "You can only sort by either \"key\" or \"value\" of a mapping");
        int by_value = a[1].t == TV_STR && !strcmp(a[1].u.s->s, "value");
        tlist *pairs = tlist_new(c, v.u.d->n);
        tv *keys = tpl_alloc(c, (v.u.d->n + 1) * sizeof(tv));
        for (size_t i = 0; i < v.u.d->n; i++) {
            tlist *pair = tlist_new(c, 2);
            pair->tuple = 1;
            pair->items[0] = v.u.d->keys[i];
            pair->items[1] = v.u.d->vals[i];
            pairs->items[i] = tv_list(pair);
            keys[i] = fold(r, by_value ? v.u.d->vals[i] : v.u.d->keys[i], tv_truthy(a[0]));
        }
        return tv_list(sorted(r, pairs, keys, tv_truthy(a[2]), pos));
    }
    if (IS("min") || IS("max")) {
        P("case_sensitive", "attribute");
        tlist *l = tpl_iter(r, v, pos);
        if (!l->n)
            return tv_undef("No aggregated item, sequence was empty.");
        size_t best = 0;
        tv bk = fold(r, given(a[1]) ? get_path(r, l->items[0], a[1], pos) : l->items[0], tv_truthy(a[0]));
        for (size_t i = 1; i < l->n; i++) {
            tv k = fold(r, given(a[1]) ? get_path(r, l->items[i], a[1], pos) : l->items[i], tv_truthy(a[0]));
            int cmp = tv_cmp(c, k, bk, pos);
            if (IS("min") ? cmp < 0 : cmp > 0) {
                best = i;
                bk = k;
            }
        }
        return l->items[best];
    }
    if (IS("sum")) {
        P("attribute", "start");
        tlist *l = tpl_iter(r, v, pos);
        tv acc = given(a[1]) ? a[1] : tv_int(0);
        for (size_t i = 0; i < l->n; i++) {
            tv x = given(a[0]) ? get_path(r, l->items[i], a[0], pos) : l->items[i];
            if (!tv_is_number(acc) || !tv_is_number(x))
                FAIL(r, pos, "sum: unsupported operand types");
            if (acc.t == TV_FLOAT || x.t == TV_FLOAT)
                acc = tv_float(tv_num(acc) + tv_num(x));
            else if (__builtin_add_overflow(acc.u.i, x.u.i, &acc.u.i))
                FAIL(r, pos, "integer overflow");
            else
                acc.t = TV_INT;
        }
        return acc;
    }
    if (IS("attr")) {
        P("name");
        if (a[0].t != TV_STR)
            FAIL(r, pos, "attr: name must be a string");
        if (v.t == TV_DICT) /* python getattr: methods only, no item fallback */
            return tpl_method(r, v, a[0].u.s->s, a[0].u.s->len);
        return tpl_getattr(r, v, a[0].u.s->s, a[0].u.s->len, pos);
    }
    if (IS("format")) {
        if (nk)
            FAIL(r, pos, "format: keyword arguments are not supported");
        tlist *t = tlist_new(c, (size_t)n_args);
        t->tuple = 1;
        for (int i = 0; i < n_args; i++)
            t->items[i] = args[i];
        return tpl_percent_format(r, tv_to_tstr(c, v), tv_list(t), pos);
    }
    if (IS("wordcount")) {
        P("_");
        (void)a;
        tstr *s = tv_to_tstr(c, v);
        int64_t n = 0, in = 0;
        for (size_t i = 0; i < s->len; i++) {
            unsigned char ch = (unsigned char)s->s[i];
            int w = ch >= 0x80 || ch == '_' || (ch >= '0' && ch <= '9') || ((ch | 32) >= 'a' && (ch | 32) <= 'z');
            if (w && !in)
                n++;
            in = w;
        }
        return tv_int(n);
    }
    FAIL(r, pos, "no filter named '%s'", name);
}

/* ---- tests ------------------------------------------------------------- */

static const char *const test_names[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
    "string", "mapping", "iterable", "sequence", "callable", "sameas", "escaped", "eq", "equalto",
    "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">", "ge", ">=",
    "in", "odd", "even", "divisibleby", "lower", "upper", "filter", "test", NULL};

int tpl_test_exists(const char *name)
{
    for (int i = 0; test_names[i]; i++)
        if (!strcmp(test_names[i], name))
            return 1;
    return 0;
}

static tv arg1(tpl_render *r, const char *name, tv *args, int n_args, long pos)
{
    if (n_args < 1)
        FAIL(r, pos, "test '%s' needs an argument", name);
    return args[0];
}

int tpl_test(tpl_render *r, const char *name, tv v, tv *args, int n_args, long pos)
{
    if (n_args > 1)
        FAIL(r, pos, "test '%s' takes at most one argument", name);
    if (IS("defined")) return v.t != TV_UNDEF;
    if (IS("undefined")) return v.t == TV_UNDEF;
    if (IS("none")) return v.t == TV_NONE;
    if (IS("boolean")) return v.t == TV_BOOL;
    if (IS("false")) return v.t == TV_BOOL && !v.u.i;
    if (IS("true")) return v.t == TV_BOOL && v.u.i;
    if (IS("integer")) return v.t == TV_INT;
    if (IS("float")) return v.t == TV_FLOAT;
    if (IS("number")) return tv_is_number(v);
    if (IS("string")) return v.t == TV_STR;
    if (IS("mapping")) return v.t == TV_DICT;
    if (IS("iterable")) return v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT || v.t == TV_UNDEF;
    if (IS("sequence")) return v.t == TV_STR || v.t == TV_LIST || v.t == TV_DICT || v.t == TV_UNDEF;
    if (IS("callable")) return v.t == TV_FUNC || v.t == TV_MACRO;
    if (IS("escaped")) return 0;
    if (IS("sameas")) {
        tv o = arg1(r, name, args, n_args, pos);
        if (v.t != o.t)
            return 0;
        switch (v.t) {
        case TV_NONE: return 1;
        case TV_UNDEF: return 0; /* distinct Undefined objects */
        case TV_BOOL: case TV_INT: return v.u.i == o.u.i;
        case TV_FLOAT: return v.u.f == o.u.f;
        default: return v.u.s == o.u.s;
        }
    }
    if (IS("eq") || IS("equalto") || IS("==")) return tv_eq(v, arg1(r, name, args, n_args, pos));
    if (IS("ne") || IS("!=")) return !tv_eq(v, arg1(r, name, args, n_args, pos));
    if (IS("lt") || IS("lessthan") || IS("<")) return tv_cmp(&r->c, v, arg1(r, name, args, n_args, pos), pos) < 0;
    if (IS("le") || IS("<=")) return tv_cmp(&r->c, v, arg1(r, name, args, n_args, pos), pos) <= 0;
    if (IS("gt") || IS("greaterthan") || IS(">")) return tv_cmp(&r->c, v, arg1(r, name, args, n_args, pos), pos) > 0;
    if (IS("ge") || IS(">=")) return tv_cmp(&r->c, v, arg1(r, name, args, n_args, pos), pos) >= 0;
    if (IS("in")) {
        tv seq = arg1(r, name, args, n_args, pos);
        tlist *l;
        if (seq.t == TV_STR) {
            if (v.t != TV_STR)
                FAIL(r, pos, "'in <string>' requires string as left operand");
            return memmem(seq.u.s->s, seq.u.s->len, v.u.s->s, v.u.s->len) != NULL || !v.u.s->len;
        }
        if (seq.t == TV_DICT) {
            if ((v.t == TV_LIST && !v.u.l->tuple) || v.t == TV_DICT || v.t == TV_NS)
                FAIL(r, pos, "unhashable type: '%s'", tv_type_name(v));
            return tdict_get(seq.u.d, v) != NULL;
        }
        l = tpl_iter(r, seq, pos);
        for (size_t i = 0; i < l->n; i++)
            if (tv_eq(l->items[i], v))
                return 1;
        return 0;
    }
    if (IS("odd") || IS("even") || IS("divisibleby")) {
        if (v.t == TV_UNDEF)
            tpl_undefined_fail(r, v, pos);
        if (!tv_is_number(v))
            FAIL(r, pos, "test '%s' needs a number", name);
        int64_t d = IS("divisibleby") ? want_int(r, arg1(r, name, args, n_args, pos), "divisor", pos) : 2;
        if (d == 0)
            FAIL(r, pos, "integer division or modulo by zero");
        if (v.t == TV_FLOAT) {
            double m = fmod(v.u.f, (double)d);
            return IS("odd") ? m != 0 : m == 0;
        }
        int64_t m = d == -1 ? 0 : v.u.i % d;
        return IS("odd") ? m != 0 : m == 0;
    }
    if (IS("lower") || IS("upper")) {
        tstr *s = tv_to_tstr(&r->c, v);
        tstr *t = py_case(&r->c, s, IS("lower") ? 'l' : 'u');
        tstr *o = py_case(&r->c, s, IS("lower") ? 'u' : 'l');
        /* cased and unchanged by the mapping */
        return t->len == s->len && !memcmp(t->s, s->s, s->len) &&
               !(o->len == s->len && !memcmp(o->s, s->s, s->len));
    }
    if (IS("filter")) return v.t == TV_STR && tpl_filter_exists(v.u.s->s);
    if (IS("test")) return v.t == TV_STR && tpl_test_exists(v.u.s->s);
    FAIL(r, pos, "no test named '%s'", name);
}
