/* JSON Schema objects -> EBNF: properties in schema order (optional ones
 * optional), required, additionalProperties / unevaluatedProperties,
 * patternProperties, propertyNames, minProperties / maxProperties; unlisted
 * keys are excluded from the additional member by a trie complement. One
 * function per keyword group; sc_object_gen runs them in order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

typedef struct prop {
    const char *name;
    json_object *schema;
    int required;
    char rule[GFE_NAME_MAX];
    int never;
} prop;

/* What an object schema says and what has been compiled of it so far. */
typedef struct obj_ctx {
    long mnp, mxp;                  /* minProperties (0 when absent), maxProperties (-1) */
    json_object *ap;                /* additionalProperties, else unevaluatedProperties */
    json_object *pp;                /* patternProperties (NULL when empty) */
    json_object *pp_schema;         /* the schema every pattern-matched value satisfies */
    json_object *pnames;            /* propertyNames */
    prop *p;                        /* listed properties, then required unlisted ones */
    size_t n;
    gfe_buf key;                    /* the additional member's key grammar */
    char add_val[GFE_NAME_MAX];     /* ... and its value rule */
    int has_add;                    /* an additional member can appear */
    int pp_listed;                  /* a pattern matches a listed name */
    size_t n_live, n_required;
    long add_lo, add_hi;            /* count of additional members (-1: unbounded) */
    int counted;                    /* min/maxProperties need members counted (object_emit_counted) */
} obj_ctx;

/* Keys (JSON string literals) that differ from every name in names[0..n)
 * (all sharing their first d codepoints), decoded. */
static void emit_notin(sc *c, gfe_buf *b, const char **names, size_t n, size_t d, int depth)
{
    gfe_cset next = {0};
    int ends_here = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (d == len) {
            ends_here = 1;
            continue;
        }
        uint32_t cp;
        if (d < len && gfe_utf8_get(names[i] + d, len - d, &cp) > 0)
            gfe_cset_add(&next, cp, cp);
    }
    int n_alt = 0;
    gfe_buf_puts(b, "(");
    if (!ends_here) {
        gfe_buf_puts(b, "\"\\\"\"");
        n_alt++;
    }
    gfe_cset other;
    gfe_cset_copy(&other, &next);
    gfe_cset_negate(&other);
    if (other.n) {
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        gfe_cset_emit_json(b, &other);
        gfe_buf_printf(b, " %s* \"\\\"\"", sc_unit(c));
    }
    gfe_cset_free(&other);
    for (size_t r = 0; r < next.n && depth < 200; r++) {
        for (uint32_t cp = next.r[r].lo; cp <= next.r[r].hi; cp++) {
            const char **sub = malloc(n * sizeof *sub);
            size_t m = 0;
            if (!sub) {
                b->err = TERN_ENOMEM;
                break;
            }
            size_t adv = 0;
            for (size_t i = 0; i < n; i++) {
                size_t len = strlen(names[i]);
                uint32_t x;
                int k;
                if (d < len && (k = gfe_utf8_get(names[i] + d, len - d, &x)) > 0 && x == cp) {
                    sub[m++] = names[i];
                    adv = (size_t)k;
                }
            }
            gfe_cset one = {0};
            gfe_cset_add(&one, cp, cp);
            gfe_buf_puts(b, n_alt++ ? " | " : "");
            gfe_cset_emit_json(b, &one);
            gfe_buf_puts(b, " ");
            gfe_cset_free(&one);
            emit_notin(c, b, sub, m, d + adv, depth + 1);
            free(sub);
        }
    }
    gfe_cset_free(&next);
    gfe_buf_puts(b, ")");
}
/* minProperties / maxProperties; dependent* left here are empty. */
static int object_counts_read(sc *c, json_object *s, const char *path, obj_ctx *o)
{
    if (sc_count_get(c, s, "minProperties", path, &o->mnp) || sc_count_get(c, s, "maxProperties", path, &o->mxp))
        return c->rc;
    if (o->mnp < 0)
        o->mnp = 0;
    static const char *const dep[] = {"dependentRequired", "dependentSchemas", "dependencies"};
    for (int i = 0; i < 3; i++) {
        json_object *d = sc_get(s, dep[i]);
        if (d && !(json_object_is_type(d, json_type_object) && json_object_object_length(d) == 0))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "keyword '%s' unsupported", dep[i]);
    }
    return 0;
}

/* properties and required: the member list (a required name not listed
 * gets the additional schema). 0, 1 (no object), or the error. */
static int object_props_read(sc *c, json_object *s, const char *path, obj_ctx *o)
{
    json_object *props = sc_get(s, "properties"), *req = sc_get(s, "required");
    o->ap = sc_get(s, "additionalProperties");
    o->pp = sc_get(s, "patternProperties");
    o->pnames = sc_get(s, "propertyNames");
    if (!o->ap)
        o->ap = sc_get(s, "unevaluatedProperties");
    if (props && !json_object_is_type(props, json_type_object))
        return sc_fail(c, TERN_EINVAL, path, "'properties' must be an object");
    if (req && !json_object_is_type(req, json_type_array))
        return sc_fail(c, TERN_EINVAL, path, "'required' must be an array");
    if (o->pp && !json_object_is_type(o->pp, json_type_object))
        return sc_fail(c, TERN_EINVAL, path, "'patternProperties' must be an object");
    if (o->pp && json_object_object_length(o->pp) == 0)
        o->pp = NULL;
    size_t n_req = req ? json_object_array_length(req) : 0;
    size_t cap = (props ? (size_t)json_object_object_length(props) : 0) + n_req + 1;
    prop *p = o->p = calloc(cap, sizeof *p);
    if (!p)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    size_t n = 0;
    if (props) {
        json_object_object_foreach(props, k, v) {
            p[n].name = k;
            p[n].schema = v;
            n++;
        }
    }
    for (size_t i = 0; i < n_req; i++) {
        json_object *e = json_object_array_get_idx(req, i);
        if (!json_object_is_type(e, json_type_string)) {
            o->n = n;
            return sc_fail(c, TERN_EINVAL, path, "'required' entries must be strings");
        }
        const char *k = json_object_get_string(e);
        size_t j;
        for (j = 0; j < n && strcmp(p[j].name, k); j++)
            ;
        if (j == n) { /* required but not listed: its schema is the fallback */
            if (o->pp) {
                o->n = n;
                return sc_fail(c, TERN_EUNSUPPORTED, path, "required property '%.100s' with patternProperties", k);
            }
            /* strict mode closes the object to the listed and the required
             * names: a required name takes any value, as JSON Schema says */
            p[n].name = k;
            p[n].schema = o->ap ? o->ap : sc_own(c, json_object_new_boolean(1));
            if (!p[n].schema) {
                o->n = n;
                return c->rc;
            }
            n++;
        }
        p[j].required = 1;
    }
    o->n = n;
    return 0;
}

/* patternProperties: a key matching any pattern must satisfy all their
 * schemas (stricter than needed when a key matches only one: sound, not
 * complete); a listed name a pattern matches gets that pattern's schema
 * too (exact), and the pattern keys then exclude the listed names. */
static int object_patterns_read(sc *c, const char *path, obj_ctx *o)
{
    if (!o->pp)
        return 0;
    json_object *all = json_object_new_array(), *wrap = json_object_new_object();
    if (!all || !wrap) {
        json_object_put(all);
        json_object_put(wrap);
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    }
    json_object_object_foreach(o->pp, k, v) {
        (void)k;
        json_object_array_add(all, json_object_get(v));
    }
    json_object_object_add(wrap, "allOf", all);
    o->pp_schema = json_object_object_length(o->pp) == 1 ? json_object_array_get_idx(all, 0) : wrap;
    sc_own(c, wrap);
    /* unlisted keys that match no pattern would need the complement of the
     * patterns' language: they are left out (additionalProperties other
     * than false, or non-strict mode, then admits fewer objects than JSON
     * Schema does: sound, not complete) */
    json_object_object_foreach(o->pp, re, v2) {
        for (size_t i = 0; i < o->n; i++) {
            int m = sc_regex_search(re, o->p[i].name, strlen(o->p[i].name));
            if (m < 0)
                return sc_fail(c, TERN_EUNSUPPORTED, path, "patternProperties pattern matching a listed property");
            if (m) {
                json_object *both = sc_own(c, sc_all_of2(o->p[i].schema, v2));
                if (!both)
                    return sc_fail(c, TERN_ENOMEM, path, "out of memory");
                o->p[i].schema = both;
                o->pp_listed = 1;
            }
        }
    }
    return 0;
}

/* propertyNames against the listed names (extra keys: see
 * object_additional); a listed name it refuses cannot appear. */
static int object_names_check(sc *c, const char *path, obj_ctx *o)
{
    if (!o->pnames)
        return 0;
    for (size_t i = 0; i < o->n; i++) {
        json_object *nv = json_object_new_string(o->p[i].name);
        int ok = nv ? sc_validate(c, nv, o->pnames, 0) : -1;
        json_object_put(nv);
        if (ok < 0)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "propertyNames too complex for listed properties");
        if (!ok) {
            if (o->p[i].required)
                return 1;
            o->p[i].never = 1;
        }
    }
    return 0;
}

/* A rule per property value; a required one no value satisfies: no
 * object. */
static int object_props_gen(sc *c, const char *path, obj_ctx *o)
{
    for (size_t i = 0; i < o->n; i++) {
        prop *p = &o->p[i];
        char sub[256];
        if (p->never)
            continue;
        snprintf(sub, sizeof sub, "%.150s/properties/%.90s", path, p->name);
        c->nest++;
        int rc = sc_gen(c, p->schema, sub, p->rule, &p->never);
        c->nest--;
        if (rc)
            return rc;
        if (p->never && p->required)
            return 1;
    }
    return 0;
}

/* The additional member under patternProperties: a key matching one of
 * the patterns, the value pp_schema. */
static int additional_patterns(sc *c, const char *path, obj_ctx *o)
{
    int nv = 0;
    c->nest++;
    int rc = sc_gen(c, o->pp_schema, path, o->add_val, &nv);
    c->nest--;
    if (rc || nv)
        return rc;
    tern_err e;
    int n_ok = 0;
    gfe_buf_puts(&o->key, "(\"\\\"\" (");
    /* a pattern matching a listed name: its keys intersected with the
     * complement of the listed names (product automaton) */
    gfe_buf notin;
    gfe_buf_init(&notin, 1u << 20);
    if (o->pp_listed) {
        const char **names = calloc(o->n + 1, sizeof *names);
        if (!names)
            return sc_fail(c, TERN_ENOMEM, path, "out of memory");
        for (size_t i = 0; i < o->n; i++)
            names[i] = o->p[i].name;
        gfe_buf_puts(&notin, "^");
        sc_regex_notin(&notin, names, o->n, 0, 0);
        gfe_buf_puts(&notin, "$");
        free(names);
        if (notin.err) {
            gfe_buf_free(&notin);
            return sc_fail(c, notin.err, path, "listed names too large to exclude from patternProperties");
        }
    }
    json_object_object_foreach(o->pp, re, v3) {
        (void)v3;
        int nv1 = 0;
        gfe_buf one;
        gfe_buf_init(&one, 0);
        if (o->pp_listed) {
            gfe_re_term t[2] = {{re, strlen(re), 0}, {notin.s, notin.len, 0}};
            char nm[GFE_NAME_MAX];
            rc = gfe_regex_emit_terms(&c->r, t, 2, 0, -1, nm, &nv1, &e);
            if (!rc && !nv1)
                gfe_buf_puts(&one, nm);
        } else {
            rc = gfe_regex_emit(&one, re, strlen(re), 1, 1, &nv1, &e);
        }
        if (!rc && !nv1) {
            gfe_buf_puts(&o->key, n_ok++ ? " | " : "");
            gfe_buf_put(&o->key, one.s, one.len);
        }
        gfe_buf_free(&one);
        if (rc) {
            gfe_buf_free(&notin);
            return sc_fail(c, rc, path, "%s", e.msg);
        }
    }
    gfe_buf_free(&notin);
    gfe_buf_puts(&o->key, ")");
    gfe_buf_puts(&o->key, " \"\\\"\")");
    o->has_add = n_ok != 0;
    return 0;
}

/* Keys valid against propertyNames (no listed properties): the key rule
 * compiled from {"allOf": [propertyNames, {"type": "string"}]}. */
static int additional_names(sc *c, const char *path, obj_ctx *o)
{
    if (o->n)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "propertyNames with listed properties and additional ones");
    json_object *ks = json_object_new_object(), *arr = json_object_new_array();
    if (!ks || !arr) {
        json_object_put(ks);
        json_object_put(arr);
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    }
    json_object_array_add(arr, json_object_get(o->pnames));
    json_object_array_add(arr, json_object_new_string("string"));
    json_object_object_add(ks, "allOf", arr);
    sc_own(c, ks);
    json_object *tstr = json_object_new_object();
    json_object_object_add(tstr, "type", json_object_new_string("string"));
    sc_own(c, tstr);
    json_object_array_put_idx(arr, 1, json_object_get(tstr));
    char kn[GFE_NAME_MAX];
    int knv = 0;
    char sub[256];
    snprintf(sub, sizeof sub, "%.200s/propertyNames", path);
    int rc = sc_gen(c, ks, sub, kn, &knv);
    if (rc)
        return rc;
    if (knv)
        o->has_add = 0;
    else
        gfe_buf_puts(&o->key, kn);
    return 0;
}

/* The "additional" member: its key grammar (o->key) and value rule
 * (o->add_val), when one can appear (o->has_add). */
static int object_additional(sc *c, const char *path, obj_ctx *o)
{
    int rc = 0;
    json_object *add_schema = o->ap;
    int allow_any_extra = !o->ap && !c->o.strict && !o->pp;
    if (o->pp) {
        rc = additional_patterns(c, path, o);
    } else if (add_schema || allow_any_extra) {
        int nv = 0;
        if (add_schema) {
            c->nest++;
            rc = sc_gen(c, add_schema, path, o->add_val, &nv);
            c->nest--;
            if (rc)
                return rc;
        } else {
            memcpy(o->add_val, sc_any(c), GFE_NAME_MAX);
        }
        if (!nv) {
            o->has_add = 1;
            json_object *pn = o->pnames;
            if (pn && !(json_object_is_type(pn, json_type_boolean) && json_object_get_boolean(pn))) {
                rc = additional_names(c, path, o);
            } else if (o->n) {
                const char **names = malloc(o->n * sizeof *names);
                if (!names)
                    return sc_fail(c, TERN_ENOMEM, path, "out of memory");
                for (size_t i = 0; i < o->n; i++)
                    names[i] = o->p[i].name;
                gfe_buf_puts(&o->key, "(\"\\\"\" ");
                emit_notin(c, &o->key, names, o->n, 0, 0);
                gfe_buf_puts(&o->key, ")");
                free(names);
            } else {
                gfe_buf_printf(&o->key, "(\"\\\"\" %s* \"\\\"\")", sc_unit(c));
            }
        }
    }
    if (rc)
        return rc;
    if (o->key.err)
        return sc_fail(c, o->key.err, path, "grammar too large");
    return 0;
}

/* Rules a counted object may take: (listed properties + 1) x (counts). */
#define OBJ_COUNTED_MAX_RULES 20000

/* minProperties / maxProperties against what the members allow: counts
 * only on additional members, or implied by the listed ones. */
static int object_counts_check(sc *c, const char *path, obj_ctx *o)
{
    for (size_t i = 0; i < o->n; i++) {
        o->n_live += !o->p[i].never;
        o->n_required += o->p[i].required;
    }
    long mnp = o->mnp, mxp = o->mxp;
    o->add_lo = 0;
    o->add_hi = -1;
    if (mnp > (long)o->n_required || (mxp >= 0 && (o->has_add || mxp < (long)o->n_live))) {
        if (o->n_live == 0 && o->has_add) {
            o->add_lo = mnp;
            o->add_hi = mxp;
        } else if (!(mxp >= 0 && !o->has_add && mxp >= (long)o->n_live && mnp <= (long)o->n_required)) {
            long kmax = mxp >= 0 ? mxp : mnp;
            if ((double)(o->n + 1) * (double)(kmax + 1) > OBJ_COUNTED_MAX_RULES)
                return sc_fail(c, TERN_EUNSUPPORTED, path, "minProperties/maxProperties with listed properties");
            o->counted = 1;
        }
    }
    if (mxp >= 0 && mxp < mnp)
        return 1;
    return 0;
}

/* The additional members' rules: add_nm (one member), tail (those after
 * the listed properties) and, with no listed properties, empty_or_more (a
 * first one and the rest). */
static int object_emit_additional(sc *c, const char *path, obj_ctx *o, gfe_buf *b, char add_nm[GFE_NAME_MAX],
                                  char tail[GFE_NAME_MAX], char empty_or_more[GFE_NAME_MAX])
{
    const char *w = sc_ws(c);
    int rc;
    if (!o->has_add) {
        b->len = 0;
        gfe_buf_puts(b, "\"\"");
        return sc_rule_add(c, b, path, tail);
    }
    gfe_buf mb;
    gfe_buf_init(&mb, 0);
    gfe_buf_printf(&mb, "%s%s\":\"%s%s", o->key.s, w, w, o->add_val);
    rc = sc_rule_add(c, &mb, path, add_nm);
    gfe_buf_free(&mb);
    if (rc)
        return rc;
    b->len = 0;
    gfe_buf_printf(b, "(%s\",\"%s%s)", w, w, add_nm);
    long lo = o->add_lo, hi = o->add_hi;
    sc_rep(b, lo > 0 ? lo - (o->n_live == 0) : 0, hi < 0 ? -1 : hi - (o->n_live == 0));
    /* with no listed properties the first member is written separately */
    if (o->n_live == 0) {
        gfe_buf tb;
        gfe_buf_init(&tb, 0);
        gfe_buf_printf(&tb, "%s %s", add_nm, b->s);
        rc = sc_rule_add(c, &tb, path, empty_or_more);
        gfe_buf_free(&tb);
        if (rc)
            return rc;
        b->len = 0;
        gfe_buf_printf(b, "(%s\",\"%s%s)*", w, w, add_nm);
    }
    return sc_rule_add(c, b, path, tail);
}

/* The object itself: "{" ws members ws "}" when start (the members' rule)
 * is not NULL, "{}" as well when no member is needed; 1 when neither is
 * possible (the schema admits no object). */
static int object_emit_braces(const sc *c, const obj_ctx *o, const char *w, const char *start, gfe_buf *out)
{
    int n_alt = 0;
    gfe_buf_puts(out, "(");
    if (start) {
        gfe_buf_printf(out, "\"{\"%s%s%s\"}\"", w, start, w);
        n_alt++;
    }
    if (o->n_required == 0 && o->mnp == 0)
        gfe_buf_printf(out, "%s\"{\"%s\"}\"", n_alt++ ? " | " : "", c->st.any_whitespace ? " ws " : " ");
    gfe_buf_puts(out, ")");
    return n_alt ? 0 : 1;
}

/* seq[i]: properties i.. each preceded by a comma, then the tail;
 * start[i]: the same with nothing written yet (non-empty). Then the
 * object: "{" start[0] "}" or, when allowed, "{}". */
static int object_emit(sc *c, const char *path, obj_ctx *o, gfe_buf *out)
{
    const char *w = sc_ws(c);
    gfe_buf b;
    gfe_buf_init(&b, 0);
    char add_nm[GFE_NAME_MAX] = "", tail[GFE_NAME_MAX] = "", empty_or_more[GFE_NAME_MAX] = "";
    char next_seq[GFE_NAME_MAX], next_start[GFE_NAME_MAX];
    int rc = object_emit_additional(c, path, o, &b, add_nm, tail, empty_or_more);
    if (rc)
        goto out;
    memcpy(next_seq, tail, GFE_NAME_MAX);
    int start_ok = 0;
    if (o->has_add && o->n_live == 0 && o->add_hi != 0) {
        memcpy(next_start, empty_or_more, GFE_NAME_MAX);
        start_ok = 1;
    } else if (o->has_add && o->n_live > 0) {
        gfe_buf tb;
        gfe_buf_init(&tb, 0);
        gfe_buf_printf(&tb, "%s %s", add_nm, tail);
        rc = sc_rule_add(c, &tb, path, next_start);
        gfe_buf_free(&tb);
        if (rc)
            goto out;
        start_ok = 1;
    }
    for (size_t ii = o->n; ii-- > 0;) {
        prop *p = &o->p[ii];
        if (p->never)
            continue;
        gfe_buf mb;
        gfe_buf_init(&mb, 0);
        sc_emit_string_lit(c, &mb, p->name, strlen(p->name));
        gfe_buf_printf(&mb, "%s\":\"%s%s", w, w, p->rule);
        char member[GFE_NAME_MAX];
        rc = sc_rule_add(c, &mb, path, member);
        gfe_buf_free(&mb);
        if (rc)
            goto out;
        char seq[GFE_NAME_MAX], start[GFE_NAME_MAX];
        b.len = 0;
        if (p->required)
            gfe_buf_printf(&b, "%s\",\"%s%s %s", w, w, member, next_seq);
        else
            gfe_buf_printf(&b, "(%s\",\"%s%s)? %s", w, w, member, next_seq);
        if ((rc = sc_rule_add(c, &b, path, seq)))
            goto out;
        b.len = 0;
        gfe_buf_printf(&b, "%s %s", member, next_seq);
        if (!p->required && start_ok)
            gfe_buf_printf(&b, " | %s", next_start);
        if ((rc = sc_rule_add(c, &b, path, start)))
            goto out;
        memcpy(next_seq, seq, GFE_NAME_MAX);
        memcpy(next_start, start, GFE_NAME_MAX);
        start_ok = 1;
    }
    rc = object_emit_braces(c, o, w, start_ok ? next_start : NULL, out);
out:
    gfe_buf_free(&b);
    return rc;
}

/* The count after one more member, or -1 past maxProperties; past
 * minProperties (with no maximum) every count behaves alike. */
static long counted_next(const obj_ctx *o, long k)
{
    if (o->mxp >= 0)
        return k + 1 > o->mxp ? -1 : k + 1;
    return k + 1 > o->mnp ? o->mnp : k + 1;
}

/* min/maxProperties with listed properties, exactly: seq(i, k) is
 * "properties i.. each after a comma, then additional members, with k
 * members written so far"; start(i) the same with nothing written. A
 * count past maxProperties ends a path; with no maximum, counts past
 * minProperties are one. Names are "" where no object can follow. */
static int object_emit_counted(sc *c, const char *path, obj_ctx *o, gfe_buf *out)
{
    const char *w = sc_ws(c);
    long kmax = o->mxp >= 0 ? o->mxp : o->mnp, nk = kmax + 1;
    size_t n = o->n;
    char(*seq)[GFE_NAME_MAX] = calloc((n + 1) * (size_t)nk, GFE_NAME_MAX);
    char(*mem)[GFE_NAME_MAX] = calloc(n + 1, GFE_NAME_MAX);
    char start[GFE_NAME_MAX] = "", next_start[GFE_NAME_MAX] = "", add_nm[GFE_NAME_MAX] = "";
    gfe_buf b;
    gfe_buf_init(&b, 0);
    int rc = 0;
    if (!seq || !mem) {
        rc = sc_fail(c, TERN_ENOMEM, path, "out of memory");
        goto out;
    }
#define SEQ(i, k) seq[(size_t)(i) * (size_t)nk + (size_t)(k)]
    if (o->has_add) {
        gfe_buf_printf(&b, "%s%s\":\"%s%s", o->key.s, w, w, o->add_val);
        if ((rc = sc_rule_add(c, &b, path, add_nm)))
            goto out;
    }
    /* seq(n, k): the additional members, so that mnp <= k + j <= mxp */
    for (long k = 0; k <= kmax; k++) {
        long lo = o->mnp > k ? o->mnp - k : 0, hi = o->mxp >= 0 ? o->mxp - k : -1;
        b.len = 0;
        if (o->has_add && hi != 0) {
            gfe_buf_printf(&b, "(%s\",\"%s%s)", w, w, add_nm);
            sc_rep(&b, lo, hi);
        } else if (lo == 0) {
            gfe_buf_puts(&b, "\"\"");
        } else {
            continue; /* too few members and none can be added */
        }
        if ((rc = sc_rule_add(c, &b, path, SEQ(n, k))))
            goto out;
    }
    /* start(n): a first additional member, then the rest counted from 1 */
    long k1 = counted_next(o, 0);
    if (o->has_add && k1 >= 0 && SEQ(n, k1)[0]) {
        b.len = 0;
        gfe_buf_printf(&b, "%s %s", add_nm, SEQ(n, k1));
        if ((rc = sc_rule_add(c, &b, path, next_start)))
            goto out;
    }
    for (size_t i = n; i-- > 0;) {
        prop *p = &o->p[i];
        if (p->never) {
            for (long k = 0; k <= kmax; k++)
                memcpy(SEQ(i, k), SEQ(i + 1, k), GFE_NAME_MAX);
            continue;
        }
        b.len = 0;
        sc_emit_string_lit(c, &b, p->name, strlen(p->name));
        gfe_buf_printf(&b, "%s\":\"%s%s", w, w, p->rule);
        if ((rc = sc_rule_add(c, &b, path, mem[i])))
            goto out;
        for (long k = 0; k <= kmax; k++) {
            long kn = counted_next(o, k);
            const char *with = kn >= 0 ? SEQ(i + 1, kn) : "", *without = p->required ? "" : SEQ(i + 1, k);
            b.len = 0;
            if (with[0])
                gfe_buf_printf(&b, "%s\",\"%s%s %s", w, w, mem[i], with);
            if (without[0])
                gfe_buf_printf(&b, "%s%s", with[0] ? " | " : "", without);
            if (b.len && (rc = sc_rule_add(c, &b, path, SEQ(i, k))))
                goto out;
        }
        b.len = 0;
        if (k1 >= 0 && SEQ(i + 1, k1)[0])
            gfe_buf_printf(&b, "%s %s", mem[i], SEQ(i + 1, k1));
        if (!p->required && next_start[0])
            gfe_buf_printf(&b, "%s%s", b.len ? " | " : "", next_start);
        start[0] = 0;
        if (b.len && (rc = sc_rule_add(c, &b, path, start)))
            goto out;
        memcpy(next_start, start, GFE_NAME_MAX);
        if ((i & 255) == 0 && sc_over_time(c)) {
            rc = sc_fail(c, TERN_ETIMEOUT, path, "compile time limit exceeded");
            goto out;
        }
    }
#undef SEQ
    rc = object_emit_braces(c, o, w, next_start[0] ? next_start : NULL, out);
out:
    gfe_buf_free(&b);
    free(seq);
    free(mem);
    return rc;
}

int sc_object_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out)
{
    (void)mask;
    obj_ctx o;
    memset(&o, 0, sizeof o);
    gfe_buf_init(&o.key, 0);
    int rc;
    if ((rc = object_counts_read(c, s, path, &o)) || (rc = object_props_read(c, s, path, &o)) ||
        (rc = object_patterns_read(c, path, &o)) || (rc = object_names_check(c, path, &o)) ||
        (rc = object_props_gen(c, path, &o)) || (rc = object_additional(c, path, &o)) ||
        (rc = object_counts_check(c, path, &o)))
        goto out;
    rc = o.counted ? object_emit_counted(c, path, &o, out) : object_emit(c, path, &o, out);
out:
    gfe_buf_free(&o.key);
    free(o.p);
    return rc;
}
