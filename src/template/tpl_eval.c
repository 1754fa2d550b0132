/* Tree-walking evaluator: statements write to the render output, expressions
 * produce values. Scoping follows Jinja: a for loop body gets a fresh frame
 * per iteration (assignments do not escape it), macros and with blocks get
 * their own frame, if blocks share the enclosing one; namespace() objects
 * are the way state crosses scopes. Every loop iteration and call counts
 * against the step budget and macro calls against the depth budget, so a
 * hostile template stops with an error. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tpl_int.h"

#define FAIL(r, pos, ...) tpl_fail(&(r)->c, TERN_EINVAL, (pos), __VA_ARGS__)

void tpl_step(tpl_render *r, long pos)
{
    if (++r->steps > r->max_steps)
        tpl_fail(&r->c, TERN_EFULL, pos, "template step limit exceeded (%ld)", r->max_steps);
}

_Noreturn void tpl_undefined_fail(tpl_render *r, tv v, long pos)
{
    tpl_fail(&r->c, TERN_EINVAL, pos, "%s", v.t == TV_UNDEF && v.u.hint ? v.u.hint : "value is undefined");
}

static const char *hintf(tpl_render *r, const char *fmt, const char *a, const char *b, size_t blen)
{
    char buf[256];
    snprintf(buf, sizeof buf, fmt, a, (int)(blen > 120 ? 120 : blen), b);
    return tstr_cstr(&r->c, buf)->s;
}

/* Jinja's object_type_repr: "dict object", "None", ... */
static const char *type_repr(tv v)
{
    switch (v.t) {
    case TV_NONE: return "None";
    case TV_STR: return "str object";
    case TV_INT: return "int object";
    case TV_FLOAT: return "float object";
    case TV_BOOL: return "bool object";
    case TV_LIST: return v.u.l->tuple ? "tuple object" : "list object";
    case TV_DICT: return "dict object";
    case TV_NS: return "jinja2.utils.Namespace object";
    default: return "object";
    }
}

static tv no_attr(tpl_render *r, tv obj, const char *name, size_t len)
{
    return tv_undef(hintf(r, "'%s' has no attribute '%.*s'", type_repr(obj), name, len));
}

/* ---- frames ------------------------------------------------------------- */

static tframe *frame_new(tpl_render *r, tframe *parent)
{
    tframe *f = tpl_alloc(&r->c, sizeof *f);
    f->parent = parent;
    f->vars = NULL;
    return f;
}

static void frame_set(tpl_render *r, tframe *f, tstr *name, tv v)
{
    if (!f->vars)
        f->vars = tdict_new(&r->c, 4);
    tdict_set(&r->c, f->vars, tv_str(name), v);
}

static tv lookup(tpl_render *r, tframe *f, const tstr *name)
{
    for (; f; f = f->parent) {
        if (!f->vars)
            continue;
        tv *v = tdict_get_str(f->vars, name->s, name->len);
        if (v)
            return *v;
    }
    return tv_undef(hintf(r, "%s'%.*s' is undefined", "", name->s, name->len));
}

/* ---- attribute and item access ------------------------------------------- */

static tv loop_attr(tpl_render *r, tloop *lp, const char *name, size_t len, long pos);

tv tpl_getattr(tpl_render *r, tv obj, const char *name, size_t len, long pos)
{
    switch (obj.t) {
    case TV_UNDEF:
        tpl_undefined_fail(r, obj, pos);
    case TV_DICT: {
        tv m = tpl_method(r, obj, name, len);
        if (m.t != TV_UNDEF)
            return m;
        tv *v = tdict_get_str(obj.u.d, name, len);
        return v ? *v : no_attr(r, obj, name, len);
    }
    case TV_NS: {
        tv *v = tdict_get_str(obj.u.d, name, len);
        return v ? *v : no_attr(r, obj, name, len);
    }
    case TV_LOOP:
        return loop_attr(r, obj.u.lp, name, len, pos);
    case TV_STR: case TV_LIST: {
        tv m = tpl_method(r, obj, name, len);
        return m.t != TV_UNDEF ? m : no_attr(r, obj, name, len);
    }
    default:
        return no_attr(r, obj, name, len);
    }
}

static int as_index(tv k, int64_t *out)
{
    if (k.t == TV_INT || k.t == TV_BOOL) {
        *out = k.u.i;
        return 1;
    }
    return 0;
}

tv tpl_getitem(tpl_render *r, tv obj, tv key, long pos)
{
    int64_t i;
    switch (obj.t) {
    case TV_UNDEF:
        tpl_undefined_fail(r, obj, pos);
    case TV_DICT: {
        tv *v = tdict_get(obj.u.d, key);
        if (v)
            return *v;
        break;
    }
    case TV_LIST:
        if (as_index(key, &i)) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0)
                i += n;
            if (i < 0 || i >= n)
                return tv_undef(hintf(r, "%s index %.*s out of range", type_repr(obj), "", 0));
            return obj.u.l->items[i];
        }
        break;
    case TV_STR:
        if (as_index(key, &i)) {
            tstr *s = obj.u.s;
            int64_t n = (int64_t)utf8_len(s->s, s->len);
            if (i < 0)
                i += n;
            if (i < 0 || i >= n)
                return tv_undef("string index out of range");
            size_t a = utf8_offset(s->s, s->len, (size_t)i);
            size_t b = utf8_offset(s->s, s->len, (size_t)i + 1);
            return tv_str(tstr_new(&r->c, s->s + a, b - a));
        }
        break;
    default:
        break;
    }
    if (key.t == TV_STR)
        return tpl_getattr(r, obj, key.u.s->s, key.u.s->len, pos);
    if (obj.t == TV_DICT)
        return tv_undef("key not found");
    return no_attr(r, obj, "?", 1);
}

static int64_t slice_arg(tpl_render *r, tv v, long pos, int *has)
{
    int64_t i;
    *has = 0;
    if (v.t == TV_NONE || v.t == TV_UNDEF)
        return 0;
    if (!as_index(v, &i))
        FAIL(r, pos, "slice indices must be integers or None");
    *has = 1;
    return i;
}

static tv do_slice(tpl_render *r, tv obj, tv a, tv b, tv c, long pos)
{
    /* index ranges are clamped to the sequence, so lo/hi are small and only
     * the step can be extreme */
    int ha, hb, hc;
    int64_t start = slice_arg(r, a, pos, &ha), stop = slice_arg(r, b, pos, &hb),
            step = slice_arg(r, c, pos, &hc);
    if (!hc)
        step = 1;
    if (step == 0)
        FAIL(r, pos, "slice step cannot be zero");
    if (obj.t == TV_UNDEF)
        tpl_undefined_fail(r, obj, pos);
    if (obj.t == TV_STR)
        return tv_str(py_slice_str(&r->c, obj.u.s, start, stop, step, ha, hb));
    if (obj.t != TV_LIST)
        return tv_undef("object is not sliceable");
    int64_t n = (int64_t)obj.u.l->n, lo, hi;
    if (step > 0) {
        lo = ha ? start : 0;
        hi = hb ? stop : n;
        if (lo < 0) lo = lo + n < 0 ? 0 : lo + n;
        if (lo > n) lo = n;
        if (hi < 0) hi = hi + n < 0 ? 0 : hi + n;
        if (hi > n) hi = n;
    } else {
        lo = ha ? start : n - 1;
        if (lo < 0) lo = lo + n < 0 ? -1 : lo + n;
        if (lo >= n) lo = n - 1;
        if (hb) {
            hi = stop;
            if (hi < 0) hi = hi + n < 0 ? -1 : hi + n;
            if (hi >= n) hi = n - 1;
        } else {
            hi = -1;
        }
    }
    size_t cnt = slice_count(lo, hi, step);
    tlist *l = tlist_new(&r->c, cnt);
    l->tuple = obj.u.l->tuple;
    for (size_t k = 0; k < cnt; k++)
        l->items[k] = obj.u.l->items[lo + (int64_t)k * step];
    return tv_list(l);
}

tlist *tpl_iter(tpl_render *r, tv v, long pos)
{
    switch (v.t) {
    case TV_LIST:
        return v.u.l;
    case TV_UNDEF:
        return tlist_new(&r->c, 0);
    case TV_DICT: {
        tlist *l = tlist_new(&r->c, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++)
            l->items[i] = v.u.d->keys[i];
        return l;
    }
    case TV_STR: {
        tstr *s = v.u.s;
        size_t n = utf8_len(s->s, s->len), off = 0;
        tlist *l = tlist_new(&r->c, n);
        for (size_t i = 0; i < n; i++) {
            size_t e = off + 1;
            while (e < s->len && ((unsigned char)s->s[e] & 0xC0) == 0x80)
                e++;
            l->items[i] = tv_str(tstr_new(&r->c, s->s + off, e - off));
            off = e;
        }
        return l;
    }
    default:
        FAIL(r, pos, "'%s' object is not iterable", tv_type_name(v));
    }
}

/* ---- loop object ----------------------------------------------------------- */

static tv loop_cycle(tpl_render *r, tfunc *self, tv *args, int n_args, tstr **kn, tv *kv, int nk,
                     long pos)
{
    (void)kn; (void)kv;
    if (nk || n_args == 0)
        FAIL(r, pos, "no items for cycling given");
    return args[self->self.u.lp->index0 % (size_t)n_args];
}

static tv loop_attr(tpl_render *r, tloop *lp, const char *name, size_t len, long pos)
{
    (void)pos;
    size_t n = lp->items->n, i = lp->index0;
#define IS(w) (len == sizeof(w) - 1 && !memcmp(name, w, len))
    if (IS("index")) return tv_int((int64_t)i + 1);
    if (IS("index0")) return tv_int((int64_t)i);
    if (IS("revindex")) return tv_int((int64_t)(n - i));
    if (IS("revindex0")) return tv_int((int64_t)(n - i - 1));
    if (IS("first")) return tv_bool(i == 0);
    if (IS("last")) return tv_bool(i + 1 == n);
    if (IS("length")) return tv_int((int64_t)n);
    if (IS("depth")) return tv_int(lp->depth0 + 1);
    if (IS("depth0")) return tv_int(lp->depth0);
    if (IS("previtem")) return i > 0 ? lp->items->items[i - 1] : tv_undef("there is no previous item");
    if (IS("nextitem")) return i + 1 < n ? lp->items->items[i + 1] : tv_undef("there is no next item");
    if (IS("cycle")) {
        tfunc *fn = tpl_alloc(&r->c, sizeof *fn);
        fn->name = "cycle";
        fn->fn = loop_cycle;
        fn->self.t = TV_LOOP;
        fn->self.u.lp = lp;
        tv v;
        v.t = TV_FUNC;
        v.u.fn = fn;
        return v;
    }
#undef IS
    return tv_undef(hintf(r, "'%s' has no attribute '%.*s'", "LoopContext object", name, len));
}

/* ---- arithmetic -------------------------------------------------------------- */

_Noreturn static void bad_operands(tpl_render *r, const char *op, tv a, tv b, long pos)
{
    if (a.t == TV_UNDEF || b.t == TV_UNDEF)
        tpl_undefined_fail(r, a.t == TV_UNDEF ? a : b, pos);
    if (a.t == TV_STR && !strcmp(op, "+"))
        FAIL(r, pos, "can only concatenate str (not \"%s\") to str", tv_type_name(b));
    FAIL(r, pos, "unsupported operand type(s) for %s: '%s' and '%s'", op, tv_type_name(a),
         tv_type_name(b));
}

static tv concat_lists(tpl_render *r, tlist *a, tlist *b)
{
    tlist *l = tlist_new(&r->c, a->n + b->n);
    l->tuple = a->tuple;
    if (a->n)
        memcpy(l->items, a->items, a->n * sizeof(tv));
    if (b->n)
        memcpy(l->items + a->n, b->items, b->n * sizeof(tv));
    return tv_list(l);
}

static tv repeat(tpl_render *r, tv seq, int64_t k, long pos)
{
    if (k < 0)
        k = 0;
    if (seq.t == TV_STR) {
        size_t n = seq.u.s->len;
        if (n && (uint64_t)k > (r->c.arena->limit ? r->c.arena->limit : ((size_t)1 << 40)) / n)
            tpl_fail(&r->c, TERN_EFULL, pos, "string repetition too large");
        size_t total = n * (size_t)k;
        tstr *t = tpl_alloc(&r->c, sizeof *t + total + 1);
        t->len = total;
        if (total) { /* fill by doubling copies */
            memcpy(t->s, seq.u.s->s, n);
            for (size_t done = n; done < total;) {
                size_t m = done < total - done ? done : total - done;
                memcpy(t->s + done, t->s, m);
                done += m;
            }
        }
        t->s[total] = '\0';
        return tv_str(t);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)k > ((size_t)1 << 28) / n)
        tpl_fail(&r->c, TERN_EFULL, pos, "list repetition too large");
    tlist *l = tlist_new(&r->c, n * (size_t)k);
    l->tuple = seq.u.l->tuple;
    for (int64_t i = 0; i < k; i++)
        if (n)
            memcpy(l->items + (size_t)i * n, seq.u.l->items, n * sizeof(tv));
    return tv_list(l);
}

static tv arith(tpl_render *r, int op, tv a, tv b, long pos)
{
    static const char *names[OP_TILDE + 1] = {[OP_TILDE] = "~", [OP_ADD] = "+", [OP_SUB] = "-", [OP_MUL] = "*", [OP_DIV] = "/",
                                  [OP_FLOORDIV] = "//", [OP_MOD] = "%", [OP_POW] = "**"};
    const char *on = names[op];
    if (op == OP_TILDE) {
        tbuf buf = {0};
        tv_str_to(&r->c, &buf, a);
        tv_str_to(&r->c, &buf, b);
        return tv_str(buf.len ? tbuf_str(&r->c, &buf) : tstr_new(&r->c, "", 0));
    }
    if (tv_is_number(a) && tv_is_number(b)) {
        int fl = a.t == TV_FLOAT || b.t == TV_FLOAT;
        int64_t x = a.u.i, y = b.u.i, z;
        double fx = tv_num(a), fy = tv_num(b);
        switch (op) {
        case OP_ADD:
            if (fl) return tv_float(fx + fy);
            if (__builtin_add_overflow(x, y, &z)) break;
            return tv_int(z);
        case OP_SUB:
            if (fl) return tv_float(fx - fy);
            if (__builtin_sub_overflow(x, y, &z)) break;
            return tv_int(z);
        case OP_MUL:
            if (fl) return tv_float(fx * fy);
            if (__builtin_mul_overflow(x, y, &z)) break;
            return tv_int(z);
        case OP_DIV:
            if (fy == 0)
                FAIL(r, pos, "division by zero");
            return tv_float(fx / fy);
        case OP_FLOORDIV:
        case OP_MOD:
            if (fl) {
                if (fy == 0)
                    FAIL(r, pos, "float division by zero");
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0)))
                    m += fy;
                if (op == OP_MOD)
                    return tv_float(m == 0 ? copysign(0.0, fy) : m);
                return tv_float(floor(fx / fy));
            }
            if (y == 0)
                FAIL(r, pos, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1)
                break;
            {
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) {
                    q--;
                    m += y;
                }
                return tv_int(op == OP_MOD ? m : q);
            }
        case OP_POW:
            if (!fl && y >= 0) {
                int64_t acc = 1, base = x;
                int64_t e = y;
                int ovf = 0;
                while (e > 0 && !ovf) {
                    if (e & 1)
                        ovf |= __builtin_mul_overflow(acc, base, &acc);
                    e >>= 1;
                    if (e)
                        ovf |= __builtin_mul_overflow(base, base, &base);
                }
                if (ovf)
                    break;
                return tv_int(acc);
            }
            if (fx == 0 && fy < 0)
                FAIL(r, pos, "0.0 cannot be raised to a negative power");
            if (fx < 0 && fy != floor(fy))
                FAIL(r, pos, "negative number cannot be raised to a fractional power");
            return tv_float(pow(fx, fy));
        }
        FAIL(r, pos, "integer overflow in '%s'", on);
    }
    if (op == OP_ADD) {
        if (a.t == TV_STR && b.t == TV_STR) {
            tstr *s = tpl_alloc(&r->c, sizeof *s + a.u.s->len + b.u.s->len + 1);
            s->len = a.u.s->len + b.u.s->len;
            memcpy(s->s, a.u.s->s, a.u.s->len);
            memcpy(s->s + a.u.s->len, b.u.s->s, b.u.s->len);
            s->s[s->len] = '\0';
            return tv_str(s);
        }
        if (a.t == TV_LIST && b.t == TV_LIST && a.u.l->tuple == b.u.l->tuple)
            return concat_lists(r, a.u.l, b.u.l);
    }
    if (op == OP_MOD && a.t == TV_STR)
        return tpl_percent_format(r, a.u.s, b, pos);
    if (op == OP_MUL) {
        if ((a.t == TV_STR || a.t == TV_LIST) && (b.t == TV_INT || b.t == TV_BOOL))
            return repeat(r, a, b.u.i, pos);
        if ((b.t == TV_STR || b.t == TV_LIST) && (a.t == TV_INT || a.t == TV_BOOL))
            return repeat(r, b, a.u.i, pos);
    }
    bad_operands(r, on, a, b, pos);
}

static int contains(tpl_render *r, tv container, tv item, long pos)
{
    switch (container.t) {
    case TV_STR:
        if (item.t == TV_UNDEF)
            tpl_undefined_fail(r, item, pos);
        if (item.t != TV_STR)
            FAIL(r, pos, "'in <string>' requires string as left operand, not %s", tv_type_name(item));
        return item.u.s->len == 0 ||
               memmem(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
    case TV_LIST:
        for (size_t i = 0; i < container.u.l->n; i++)
            if (tv_eq(container.u.l->items[i], item))
                return 1;
        return 0;
    case TV_DICT:
        if ((item.t == TV_LIST && !item.u.l->tuple) || item.t == TV_DICT || item.t == TV_NS)
            FAIL(r, pos, "unhashable type: '%s'", tv_type_name(item));
        return tdict_get(container.u.d, item) != NULL;
    case TV_UNDEF:
        return 0;
    default:
        FAIL(r, pos, "argument of type '%s' is not iterable", tv_type_name(container));
    }
}

static int compare_op(tpl_render *r, int op, tv a, tv b, long pos)
{
    switch (op) {
    case OP_EQ: return tv_eq(a, b);
    case OP_NE: return !tv_eq(a, b);
    case OP_LT: return tv_cmp(&r->c, a, b, pos) < 0;
    case OP_LE: return tv_cmp(&r->c, a, b, pos) <= 0;
    case OP_GT: return tv_cmp(&r->c, a, b, pos) > 0;
    case OP_GE: return tv_cmp(&r->c, a, b, pos) >= 0;
    case OP_IN: return contains(r, b, a, pos);
    case OP_NOTIN: return !contains(r, b, a, pos);
    }
    return 0;
}

/* ---- calls ----------------------------------------------------------------- */

static void capture_begin(tpl_render *r, tbuf *save_to, tbuf **saved)
{
    memset(save_to, 0, sizeof *save_to);
    save_to->limit = r->max_output;
    *saved = r->out;
    r->out = save_to;
}

static tv invoke_macro(tpl_render *r, tmacro *m, tv *args, int n_args, tstr **kn, tv *kv, int nk,
                       tv caller, long pos)
{
    const tnode *def = m->def;
    if (++r->depth > r->max_depth)
        tpl_fail(&r->c, TERN_EFULL, pos, "macro recursion limit exceeded (%d)", r->max_depth);
    tframe *f = frame_new(r, m->closure);
    int np = def->n_names;
    tv *vals = tpl_alloc(&r->c, (size_t)(np + 1) * sizeof(tv));
    char *set = tpl_zalloc(&r->c, (size_t)np + 1);
    int extra_pos = n_args > np ? n_args - np : 0;
    for (int i = 0; i < n_args && i < np; i++) {
        vals[i] = args[i];
        set[i] = 1;
    }
    tdict *kwargs = tdict_new(&r->c, 4);
    for (int k = 0; k < nk; k++) {
        int found = 0;
        for (int i = 0; i < np; i++)
            if (def->names[i]->len == kn[k]->len && !memcmp(def->names[i]->s, kn[k]->s, kn[k]->len)) {
                if (set[i])
                    FAIL(r, pos, "macro got multiple values for argument '%s'", kn[k]->s);
                vals[i] = kv[k];
                set[i] = 1;
                found = 1;
            }
        if (!found)
            tdict_set(&r->c, kwargs, tv_str(kn[k]), kv[k]);
    }
    for (int i = 0; i < np; i++) {
        if (!set[i]) {
            if (def->list2 && def->list2[i])
                vals[i] = tpl_eval(r, def->list2[i], f);
            else
                vals[i] = tv_undef(hintf(r, "%smissing macro argument '%.*s'", "", def->names[i]->s,
                                         def->names[i]->len));
        }
        frame_set(r, f, def->names[i], vals[i]);
    }
    tlist *varargs = tlist_new(&r->c, (size_t)extra_pos);
    for (int i = 0; i < extra_pos; i++)
        varargs->items[i] = args[np + i];
    varargs->tuple = 1;
    frame_set(r, f, tstr_cstr(&r->c, "varargs"), tv_list(varargs));
    frame_set(r, f, tstr_cstr(&r->c, "kwargs"), tv_dict(kwargs));
    if (caller.t != TV_UNDEF)
        frame_set(r, f, tstr_cstr(&r->c, "caller"), caller);
    else if (m->caller.t != TV_UNDEF)
        frame_set(r, f, tstr_cstr(&r->c, "caller"), m->caller);
    tbuf buf, *saved;
    capture_begin(r, &buf, &saved);
    tpl_exec_body(r, def->list, def->n, f);
    r->out = saved;
    r->loop_ctl = 0;
    r->depth--;
    return tv_str(buf.len ? tbuf_str(&r->c, &buf) : tstr_new(&r->c, "", 0));
}

tv tpl_call(tpl_render *r, tv callee, tv *args, int n_args, tstr **kn, tv *kv, int nk, tv caller,
            long pos)
{
    tpl_step(r, pos);
    if (callee.t == TV_FUNC)
        return callee.u.fn->fn(r, callee.u.fn, args, n_args, kn, kv, nk, pos);
    if (callee.t == TV_MACRO)
        return invoke_macro(r, callee.u.m, args, n_args, kn, kv, nk, caller, pos);
    if (callee.t == TV_UNDEF)
        tpl_undefined_fail(r, callee, pos);
    FAIL(r, pos, "'%s' object is not callable", tv_type_name(callee));
}

/* Evaluates positional and keyword argument nodes of a call/filter/test. */
static void eval_args(tpl_render *r, const tnode *n, tframe *f, tv **args, tv **kv)
{
    *args = n->n ? tpl_alloc(&r->c, (size_t)n->n * sizeof(tv)) : NULL;
    *kv = n->n2 ? tpl_alloc(&r->c, (size_t)n->n2 * sizeof(tv)) : NULL;
    for (int i = 0; i < n->n; i++)
        (*args)[i] = tpl_eval(r, n->list[i], f);
    for (int i = 0; i < n->n2; i++)
        (*kv)[i] = tpl_eval(r, n->list2[i], f);
}

/* A filter node; base is the operand when the chain starts with no operand
 * ({% filter %} blocks and {% set x | f %}). */
static tv eval_filter(tpl_render *r, const tnode *n, tframe *f, tv base)
{
    tv operand;
    if (!n->a)
        operand = base;
    else if (n->a->kind == N_FILTER)
        operand = eval_filter(r, n->a, f, base);
    else
        operand = tpl_eval(r, n->a, f);
    tv *args, *kv;
    eval_args(r, n, f, &args, &kv);
    tpl_step(r, n->pos);
    return tpl_filter(r, n->name->s, operand, args, n->n, n->names, kv, n->n2, n->pos);
}

/* ---- expressions --------------------------------------------------------- */

static tv eval_node(tpl_render *r, const tnode *e, tframe *f);

/* Bounds the evaluator's C recursion whatever mix of nested expressions and
 * macro calls produces it. */
#define TPL_MAX_EVAL_DEPTH 3000

tv tpl_eval(tpl_render *r, const tnode *e, tframe *f)
{
    if (++r->eval_depth > TPL_MAX_EVAL_DEPTH)
        tpl_fail(&r->c, TERN_ERANGE, e->pos, "template evaluation nested too deeply");
    tv v = eval_node(r, e, f);
    r->eval_depth--;
    return v;
}

static tv eval_node(tpl_render *r, const tnode *e, tframe *f)
{
    switch (e->kind) {
    case N_CONST:
        return e->val;
    case N_NAME:
        return lookup(r, f, e->name);
    case N_LIST: case N_TUPLE: {
        tlist *l = tlist_new(&r->c, (size_t)e->n);
        l->tuple = e->kind == N_TUPLE;
        for (int i = 0; i < e->n; i++)
            l->items[i] = tpl_eval(r, e->list[i], f);
        return tv_list(l);
    }
    case N_DICT: {
        tdict *d = tdict_new(&r->c, (size_t)e->n + 1);
        for (int i = 0; i < e->n; i++) {
            tv k = tpl_eval(r, e->list[i], f);
            if (k.t == TV_LIST && !k.u.l->tuple)
                FAIL(r, e->list[i]->pos, "unhashable type: 'list'");
            if (k.t == TV_DICT || k.t == TV_NS)
                FAIL(r, e->list[i]->pos, "unhashable type: 'dict'");
            tdict_set(&r->c, d, k, tpl_eval(r, e->list2[i], f));
        }
        return tv_dict(d);
    }
    case N_ATTR:
        return tpl_getattr(r, tpl_eval(r, e->a, f), e->name->s, e->name->len, e->pos);
    case N_ITEM:
        return tpl_getitem(r, tpl_eval(r, e->a, f), tpl_eval(r, e->b, f), e->pos);
    case N_SLICE: {
        tv obj = tpl_eval(r, e->a, f);
        tv parts[3];
        for (int i = 0; i < 3; i++)
            parts[i] = e->list[i] ? tpl_eval(r, e->list[i], f) : tv_none();
        return do_slice(r, obj, parts[0], parts[1], parts[2], e->pos);
    }
    case N_CALL: {
        tv callee = tpl_eval(r, e->a, f);
        tv *args, *kv;
        eval_args(r, e, f, &args, &kv);
        return tpl_call(r, callee, args, e->n, e->names, kv, e->n2, tv_undef(NULL), e->pos);
    }
    case N_FILTER:
        return eval_filter(r, e, f, tv_undef(NULL));
    case N_TEST: {
        tv v = tpl_eval(r, e->a, f);
        tv *args, *kv;
        eval_args(r, e, f, &args, &kv);
        if (e->n2)
            FAIL(r, e->pos, "tests take no keyword arguments");
        int res = tpl_test(r, e->name->s, v, args, e->n, e->pos);
        return tv_bool(e->op ? !res : res);
    }
    case N_UNARY: {
        tv v = tpl_eval(r, e->a, f);
        if (e->op == OP_NOT)
            return tv_bool(!tv_truthy(v));
        if (v.t == TV_UNDEF)
            tpl_undefined_fail(r, v, e->pos);
        if (!tv_is_number(v))
            FAIL(r, e->pos, "bad operand type for unary %s: '%s'", e->op == OP_NEG ? "-" : "+",
                 tv_type_name(v));
        if (e->op == OP_POS)
            return v.t == TV_BOOL ? tv_int(v.u.i) : v;
        if (v.t == TV_FLOAT)
            return tv_float(-v.u.f);
        if (v.u.i == INT64_MIN)
            FAIL(r, e->pos, "integer overflow");
        return tv_int(-v.u.i);
    }
    case N_BINOP: {
        tv a = tpl_eval(r, e->a, f);
        if (e->op == OP_AND)
            return tv_truthy(a) ? tpl_eval(r, e->b, f) : a;
        if (e->op == OP_OR)
            return tv_truthy(a) ? a : tpl_eval(r, e->b, f);
        return arith(r, e->op, a, tpl_eval(r, e->b, f), e->pos);
    }
    case N_COMPARE: {
        tv a = tpl_eval(r, e->a, f);
        for (int i = 0; i < e->n; i++) {
            tv b = tpl_eval(r, e->list[i], f);
            if (!compare_op(r, e->ops[i], a, b, e->list[i]->pos))
                return tv_bool(0);
            a = b;
        }
        return tv_bool(1);
    }
    case N_COND:
        if (tv_truthy(tpl_eval(r, e->a, f)))
            return tpl_eval(r, e->b, f);
        return e->c ? tpl_eval(r, e->c, f) : tv_undef("the inline if-expression evaluated to false and no else section was defined");
    }
    FAIL(r, e->pos, "not an expression");
}

/* ---- statements ---------------------------------------------------------- */

static void assign_targets(tpl_render *r, tframe *f, tstr **names, int n, tv v, long pos)
{
    if (n == 1) {
        frame_set(r, f, names[0], v);
        return;
    }
    tlist *l = tpl_iter(r, v, pos);
    if ((int)l->n != n)
        FAIL(r, pos, "%s values to unpack (expected %d, got %zu)",
             (int)l->n > n ? "too many" : "not enough", n, l->n);
    for (int i = 0; i < n; i++)
        frame_set(r, f, names[i], l->items[i]);
}

static void exec_for(tpl_render *r, const tnode *s, tframe *f)
{
    tlist *items = tpl_iter(r, tpl_eval(r, s->b, f), s->b->pos);
    if (s->a) { /* {% for x in xs if cond %}: filter first, loop.length counts kept items */
        tlist *kept = tlist_new(&r->c, items->n);
        size_t k = 0;
        for (size_t i = 0; i < items->n; i++) {
            tpl_step(r, s->pos);
            tframe *ff = frame_new(r, f);
            assign_targets(r, ff, s->names, s->n_names, items->items[i], s->pos);
            if (tv_truthy(tpl_eval(r, s->a, ff)))
                kept->items[k++] = items->items[i];
        }
        kept->n = k;
        items = kept;
    }
    if (items->n == 0) {
        if (s->n2)
            tpl_exec_body(r, s->list2, s->n2, frame_new(r, f));
        return;
    }
    tloop *lp = tpl_alloc(&r->c, sizeof *lp);
    lp->items = items;
    lp->depth0 = 0;
    tv loopv;
    loopv.t = TV_LOOP;
    loopv.u.lp = lp;
    tstr *loop_name = tstr_cstr(&r->c, "loop");
    for (size_t i = 0; i < items->n; i++) {
        tpl_step(r, s->pos);
        lp->index0 = i;
        tframe *it = frame_new(r, f);
        assign_targets(r, it, s->names, s->n_names, items->items[i], s->pos);
        frame_set(r, it, loop_name, loopv);
        tpl_exec_body(r, s->list, s->n, it);
        if (r->loop_ctl == CTL_BREAK) {
            r->loop_ctl = 0;
            break;
        }
        r->loop_ctl = 0;
    }
}

static void exec_stmt(tpl_render *r, const tnode *s, tframe *f)
{
    switch (s->kind) {
    case S_TEXT:
        tbuf_put(&r->c, r->out, s->val.u.s->s, s->val.u.s->len);
        return;
    case S_OUTPUT: {
        tv v = tpl_eval(r, s->a, f);
        if (v.t == TV_STR)
            tbuf_put(&r->c, r->out, v.u.s->s, v.u.s->len);
        else
            tv_str_to(&r->c, r->out, v);
        return;
    }
    case S_IF:
        if (tv_truthy(tpl_eval(r, s->a, f)))
            tpl_exec_body(r, s->list, s->n, f);
        else
            tpl_exec_body(r, s->list2, s->n2, f);
        return;
    case S_FOR:
        exec_for(r, s, f);
        return;
    case S_SET: {
        tv v = tpl_eval(r, s->b, f);
        if (s->name) {
            tv ns = lookup(r, f, s->names[0]);
            if (ns.t != TV_NS)
                FAIL(r, s->pos, "cannot assign attribute on non-namespace object");
            tdict_set(&r->c, ns.u.d, tv_str(s->name), v);
        } else {
            assign_targets(r, f, s->names, s->n_names, v, s->pos);
        }
        return;
    }
    case S_SET_BLOCK: {
        tbuf buf, *saved;
        capture_begin(r, &buf, &saved);
        tpl_exec_body(r, s->list, s->n, f);
        r->out = saved;
        tv v = tv_str(buf.len ? tbuf_str(&r->c, &buf) : tstr_new(&r->c, "", 0));
        if (s->a)
            v = eval_filter(r, s->a, f, v);
        if (s->name) {
            tv ns = lookup(r, f, s->names[0]);
            if (ns.t != TV_NS)
                FAIL(r, s->pos, "cannot assign attribute on non-namespace object");
            tdict_set(&r->c, ns.u.d, tv_str(s->name), v);
        } else {
            frame_set(r, f, s->names[0], v);
        }
        return;
    }
    case S_MACRO: {
        tmacro *m = tpl_alloc(&r->c, sizeof *m);
        m->def = s;
        m->closure = f;
        m->caller = tv_undef(NULL);
        tv v;
        v.t = TV_MACRO;
        v.u.m = m;
        frame_set(r, f, s->name, v);
        return;
    }
    case S_CALL_BLOCK: {
        tmacro *m = tpl_alloc(&r->c, sizeof *m);
        m->def = s;
        m->closure = f;
        m->caller = tv_undef(NULL);
        tv caller;
        caller.t = TV_MACRO;
        caller.u.m = m;
        const tnode *call = s->a;
        tv callee = tpl_eval(r, call->a, f);
        tv *args, *kv;
        eval_args(r, call, f, &args, &kv);
        tv v = tpl_call(r, callee, args, call->n, call->names, kv, call->n2, caller, call->pos);
        tv_str_to(&r->c, r->out, v);
        return;
    }
    case S_FILTER_BLOCK: {
        tbuf buf, *saved;
        capture_begin(r, &buf, &saved);
        tpl_exec_body(r, s->list, s->n, f);
        r->out = saved;
        tv v = tv_str(buf.len ? tbuf_str(&r->c, &buf) : tstr_new(&r->c, "", 0));
        tv_str_to(&r->c, r->out, eval_filter(r, s->a, f, v));
        return;
    }
    case S_WITH: {
        tframe *w = frame_new(r, f);
        for (int i = 0; i < s->n_names; i++)
            frame_set(r, w, s->names[i], tpl_eval(r, s->list2[i], f));
        tpl_exec_body(r, s->list, s->n, w);
        return;
    }
    case S_BREAK:
        r->loop_ctl = CTL_BREAK;
        return;
    case S_CONTINUE:
        r->loop_ctl = CTL_CONTINUE;
        return;
    }
    FAIL(r, s->pos, "not a statement");
}

void tpl_exec_body(tpl_render *r, tnode **stmts, int n, tframe *f)
{
    for (int i = 0; i < n && !r->loop_ctl; i++)
        exec_stmt(r, stmts[i], f);
}
