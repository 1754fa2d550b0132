/* The leaf of the JSON Schema front end: a schema without applicators
 * (no $ref / allOf / anyOf / oneOf / not / if) becomes its enum / const
 * literals, or one alternative per allowed type from the type table below
 * (schema_number.c, schema_string.c, schema_array.c, schema_object.c).
 * Also the emitters those files share: literals, counts, repetitions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

int sc_count_get(sc *c, json_object *s, const char *k, const char *path, long *out)
{
    json_object *v = sc_get(s, k);
    *out = -1;
    if (!v)
        return 0;
    if (!sc_is_num(v) || sc_numv(v) < 0 || sc_numv(v) != floor(sc_numv(v)))
        return sc_fail(c, TERN_EINVAL, path, "'%s' must be a non-negative integer", k);
    if (sc_numv(v) > SC_MAX_COUNT) {
        if (k[1] == 'a') /* maxX beyond the cap: no bound in practice */
            return 0;
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'%s' too large", k);
    }
    *out = (long)sc_numv(v);
    return 0;
}

int sc_rule_add(sc *c, gfe_buf *b, const char *path, char name[GFE_NAME_MAX])
{
    if (b->err)
        return sc_fail(c, b->err, path, "grammar too large");
    gfe_rule_add(&c->r, b->s ? b->s : "\"\"", name);
    if (c->r.out.err)
        return sc_fail(c, c->r.out.err, path, "grammar larger than the output limit");
    return 0;
}

void sc_rep(gfe_buf *b, long lo, long hi)
{
    if (hi < 0) {
        if (lo == 0)
            gfe_buf_puts(b, "*");
        else if (lo == 1)
            gfe_buf_puts(b, "+");
        else
            gfe_buf_printf(b, "{%ld,}", lo);
    } else if (lo == hi) {
        if (lo != 1)
            gfe_buf_printf(b, "{%ld}", lo);
    } else if (lo == 0 && hi == 1) {
        gfe_buf_puts(b, "?");
    } else {
        gfe_buf_printf(b, "{%ld,%ld}", lo, hi);
    }
}

/* ------------------------------------------------------------ literals */

void sc_emit_string_lit(sc *c, gfe_buf *b, const char *s, size_t len)
{
    char run[256];
    size_t n = 0;
    gfe_buf_puts(b, "(\"\\\"\"");
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = gfe_utf8_get(s + i, len - i, &cp);
        if (k < 0) { /* not UTF-8: cannot be produced as text */
            cp = 0xFFFD;
            k = 1;
        }
        i += (size_t)k;
        if (cp >= 0x20 && cp < 0x7f && cp != '"' && cp != '\\') {
            run[n++] = (char)cp;
            if (n < sizeof run)
                continue;
        }
        if (n) {
            gfe_buf_puts(b, " ");
            gfe_buf_lit(b, run, n);
            n = 0;
        }
        if (cp >= 0x20 && cp < 0x7f && cp != '"' && cp != '\\')
            continue;
        gfe_cset one = {0};
        gfe_cset_add(&one, cp, cp);
        gfe_buf_puts(b, " ");
        gfe_cset_emit_json(b, &one);
        gfe_cset_free(&one);
    }
    if (n) {
        gfe_buf_puts(b, " ");
        gfe_buf_lit(b, run, n);
    }
    gfe_buf_puts(b, " \"\\\"\")");
}

/* A number literal; an integral value also matches its ".0" forms (JSON
 * Schema compares numbers by value: 1.0 equals 1). */
static void emit_number_text(gfe_buf *b, json_object *v)
{
    char t[64];
    int integral = 1;
    if (json_object_is_type(v, json_type_int)) {
        snprintf(t, sizeof t, "%lld", (long long)json_object_get_int64(v));
    } else {
        double d = json_object_get_double(v);
        if (d == floor(d) && fabs(d) < 1e17) {
            snprintf(t, sizeof t, "%.0f", d);
            if (!strcmp(t, "-0"))
                strcpy(t, "0");
        } else {
            integral = 0;
            for (int p = 1; p <= 17; p++) {
                snprintf(t, sizeof t, "%.*g", p, d);
                if (strtod(t, NULL) == d)
                    break;
            }
        }
    }
    gfe_buf_puts(b, "(");
    gfe_buf_lit(b, t, strlen(t));
    if (integral && !strcmp(t, "0"))
        gfe_buf_puts(b, " (\".\" \"0\"+)? | \"-0\" (\".\" \"0\"+)?");
    else if (integral)
        gfe_buf_puts(b, " (\".\" \"0\"+)?");
    gfe_buf_puts(b, ")");
}

/* Objects with a few members match in any member order (JSON Schema
 * equality ignores order); larger ones in the order given. */
#define SC_PERMUTE_MAX 4

static void emit_object_perm(sc *c, gfe_buf *b, json_object *v, const char **keys, int n, int *idx)
{
    const char *w = sc_ws(c);
    gfe_buf_printf(b, "(\"{\"%s", w);
    for (int i = 0; i < n; i++) {
        if (i)
            gfe_buf_printf(b, "%s\",\"%s", w, w);
        sc_emit_string_lit(c, b, keys[idx[i]], strlen(keys[idx[i]]));
        gfe_buf_printf(b, "%s\":\"%s", w, w);
        sc_emit_value(c, b, json_object_object_get(v, keys[idx[i]]));
    }
    gfe_buf_printf(b, "%s\"}\")", n ? w : " ");
}

static void permute(sc *c, gfe_buf *b, json_object *v, const char **keys, int n, int *idx, int k, int *first)
{
    if (k == n) {
        if (!*first)
            gfe_buf_puts(b, " | ");
        *first = 0;
        emit_object_perm(c, b, v, keys, n, idx);
        return;
    }
    for (int i = k; i < n; i++) {
        int t = idx[k];
        idx[k] = idx[i];
        idx[i] = t;
        permute(c, b, v, keys, n, idx, k + 1, first);
        t = idx[k];
        idx[k] = idx[i];
        idx[i] = t;
    }
}

void sc_emit_value(sc *c, gfe_buf *b, json_object *v)
{
    const char *w = sc_ws(c);
    switch (json_object_get_type(v)) {
    case json_type_null: gfe_buf_puts(b, "\"null\""); return;
    case json_type_boolean: gfe_buf_puts(b, json_object_get_boolean(v) ? "\"true\"" : "\"false\""); return;
    case json_type_int:
    case json_type_double: emit_number_text(b, v); return;
    case json_type_string:
        sc_emit_string_lit(c, b, json_object_get_string(v), (size_t)json_object_get_string_len(v));
        return;
    case json_type_array: {
        size_t n = json_object_array_length(v);
        gfe_buf_printf(b, "(\"[\"%s", w);
        for (size_t i = 0; i < n; i++) {
            if (i)
                gfe_buf_printf(b, "%s\",\"%s", w, w);
            sc_emit_value(c, b, json_object_array_get_idx(v, i));
        }
        gfe_buf_printf(b, "%s\"]\")", n ? w : " ");
        return;
    }
    case json_type_object: {
        const char *keys[SC_PERMUTE_MAX];
        int idx[SC_PERMUTE_MAX], n = 0, first = 1;
        int total = json_object_object_length(v);
        if (total > SC_PERMUTE_MAX) {
            int i = 0;
            gfe_buf_printf(b, "(\"{\"%s", w);
            json_object_object_foreach(v, k, e) {
                if (i++)
                    gfe_buf_printf(b, "%s\",\"%s", w, w);
                sc_emit_string_lit(c, b, k, strlen(k));
                gfe_buf_printf(b, "%s\":\"%s", w, w);
                sc_emit_value(c, b, e);
            }
            gfe_buf_printf(b, "%s\"}\")", w);
            return;
        }
        json_object_object_foreach(v, k, e) {
            (void)e;
            idx[n] = n;
            keys[n++] = k;
        }
        gfe_buf_puts(b, "(");
        permute(c, b, v, keys, n, idx, 0, &first);
        gfe_buf_puts(b, ")");
        return;
    }
    }
}

/* ------------------------------------------------------------ leaf */

/* ---- large enums: plain strings as a trie -------------------------------- */

typedef struct plain_str {
    const char *s;
    size_t n;
} plain_str;

static int cmp_plain(const void *x, const void *y)
{
    const plain_str *a = x, *b = y;
    size_t n = a->n < b->n ? a->n : b->n;
    int r = memcmp(a->s, b->s, n);
    return r ? r : (a->n > b->n) - (a->n < b->n);
}

/* A string every character of which is printable ASCII other than '"'
 * and '\\': its only JSON text is itself between quotes. */
static int is_plain_str(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] < 0x20 || (uint8_t)s[i] >= 0x7f || s[i] == '"' || s[i] == '\\')
            return 0;
    return 1;
}

/* Nesting kept by the trie (the EBNF parser allows 200 levels): deeper
 * groups are listed flat, still correct, only less factored. */
#define ENUM_TRIE_DEPTH 64

/* Emits v[lo, hi) (sorted, distinct, all sharing their first `at` bytes)
 * as an alternation factored on common prefixes; a value that ends at
 * `at` is the empty alternative. A sorted list keeps the grammar
 * deterministic: one parser stack per step, however many values. */
static void emit_trie(gfe_buf *b, const plain_str *v, size_t lo, size_t hi, size_t at, int depth)
{
    int first = 1;
    gfe_buf_puts(b, "(");
    for (size_t i = lo; i < hi;) {
        gfe_buf_puts(b, first ? "" : " | ");
        first = 0;
        if (v[i].n == at) { /* sorted first: the value ends here */
            gfe_buf_puts(b, "\"\"");
            i++;
            continue;
        }
        size_t j = i + 1;
        while (j < hi && v[j].s[at] == v[i].s[at])
            j++;
        if (j == i + 1 || depth >= ENUM_TRIE_DEPTH) {
            for (size_t k = i; k < j; k++) {
                gfe_buf_puts(b, k > i ? " | " : "");
                if (v[k].n > at)
                    gfe_buf_lit(b, v[k].s + at, v[k].n - at);
                else
                    gfe_buf_puts(b, "\"\"");
            }
            i = j;
            continue;
        }
        /* the common prefix of the group, beyond `at` */
        size_t p = at + 1;
        while (p < v[i].n && p < v[j - 1].n && v[i].s[p] == v[j - 1].s[p])
            p++;
        gfe_buf_lit(b, v[i].s + at, p - at);
        gfe_buf_puts(b, " ");
        emit_trie(b, v, i, j, p, depth + 1);
        i = j;
    }
    gfe_buf_puts(b, ")");
}

/* enum / const: the listed values that satisfy the sibling keywords.
 * O(n log n) in the number of values: enum members are checked against
 * the other keywords only (a member is in the enum), and plain strings
 * are sorted into a trie. */
static int leaf_values(sc *c, json_object *s, json_object *e, int mask, const char *path, gfe_buf *b,
                       int *n_alt)
{
    json_object *nl = sc_get(s, "nullable");
    json_object *vals = e, *tmp = NULL;
    if (json_object_object_get_ex(s, "const", NULL)) {
        tmp = json_object_new_array();
        if (!tmp)
            return sc_fail(c, TERN_ENOMEM, path, "out of memory");
        json_object_array_add(tmp, json_object_get(sc_get(s, "const")));
        vals = tmp;
    }
    json_object *chk = s;
    if (vals == e) {
        static const char *const k_enum[] = {"enum"};
        chk = sc_without(c, s, k_enum, 1);
        if (!chk)
            return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    }
    size_t n_vals = json_object_array_length(vals), n_plain = 0;
    plain_str *plain = n_vals > 1 ? malloc(n_vals * sizeof *plain) : NULL;
    int rc = 0;
    for (size_t i = 0; i < n_vals; i++) {
        if ((i & 1023) == 1023 && sc_over_time(c)) {
            rc = sc_fail(c, TERN_ETIMEOUT, path, "compile time limit exceeded");
            goto out;
        }
        json_object *v = json_object_array_get_idx(vals, i);
        int ok = sc_validate(c, v, chk, 0);
        if (ok < 0 && nl) /* nullable: re-check without it */
            ok = (mask & sc_value_type(v)) ? 1 : 0;
        if (ok < 0) {
            rc = sc_fail(c, TERN_EUNSUPPORTED, path, "enum/const together with keywords tern cannot check against it");
            goto out;
        }
        if (!ok)
            continue;
        if (plain && json_object_is_type(v, json_type_string)) {
            const char *t = json_object_get_string(v);
            size_t n = (size_t)json_object_get_string_len(v);
            if (is_plain_str(t, n)) {
                plain[n_plain++] = (plain_str){t, n};
                continue;
            }
        }
        gfe_buf_puts(b, (*n_alt)++ ? " | " : "");
        sc_emit_value(c, b, v);
    }
    if (n_plain) {
        qsort(plain, n_plain, sizeof *plain, cmp_plain);
        size_t k = 0;
        for (size_t i = 0; i < n_plain; i++)
            if (!k || cmp_plain(&plain[k - 1], &plain[i]))
                plain[k++] = plain[i];
        gfe_buf_puts(b, (*n_alt)++ ? " | " : "");
        gfe_buf_puts(b, "(\"\\\"\" ");
        emit_trie(b, plain, 0, k, 0, 0);
        gfe_buf_puts(b, " \"\\\"\")");
    }
out:
    free(plain);
    json_object_put(tmp);
    return rc;
}

static int leaf_null(sc *c, json_object *s, int mask, const char *path, gfe_buf *out)
{
    gfe_buf_puts(out, "\"null\"");
    return 0;
}

static int leaf_bool(sc *c, json_object *s, int mask, const char *path, gfe_buf *out)
{
    gfe_buf_puts(out, "\"true\" | \"false\"");
    return 0;
}

/* The type table: for each type the schema allows (in this order), one
 * alternative. */
static const struct {
    int bits;
    sc_type_fn fn;
} k_types[] = {
    {ST_NULL, leaf_null},
    {ST_BOOL, leaf_bool},
    {ST_NUMBER | ST_INTEGER, sc_number_gen},
    {ST_STRING, sc_string_gen},
    {ST_ARRAY, sc_array_gen},
    {ST_OBJECT, sc_object_gen},
};

int sc_leaf(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    int mask = sc_type_mask(s);
    if (mask < 0)
        return sc_fail(c, TERN_EINVAL, path, "bad 'type'");
    json_object *nl = sc_get(s, "nullable");
    if (nl && json_object_is_type(nl, json_type_boolean) && json_object_get_boolean(nl))
        mask |= ST_NULL;
    if (sc_not_fraction(s)) /* non-integral numbers only */
        mask = mask & ST_NUMBER ? ST_NUMBER : 0;
    json_object *e = sc_get(s, "enum");
    if (e && !json_object_is_type(e, json_type_array))
        return sc_fail(c, TERN_EINVAL, path, "'enum' must be an array");
    gfe_buf b;
    gfe_buf_init(&b, 0);
    int n_alt = 0, rc = 0;
    if (e || json_object_object_get_ex(s, "const", NULL)) {
        rc = leaf_values(c, s, e, mask, path, &b, &n_alt);
    } else {
        for (size_t i = 0; i < sizeof k_types / sizeof k_types[0] && rc >= 0; i++) {
            if (!(mask & k_types[i].bits))
                continue;
            gfe_buf t;
            gfe_buf_init(&t, 0);
            rc = k_types[i].fn(c, s, mask, path, &t);
            if (rc == 0) {
                gfe_buf_puts(&b, n_alt++ ? " | " : "");
                gfe_buf_put(&b, t.s, t.len);
            }
            gfe_buf_free(&t);
        }
    }
    if (rc >= 0) {
        rc = 0;
        if (!n_alt)
            *never = 1;
        else
            rc = sc_rule_add(c, &b, path, name);
    }
    gfe_buf_free(&b);
    return rc < 0 ? rc : c->rc;
}
