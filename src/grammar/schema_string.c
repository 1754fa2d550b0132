/* JSON Schema strings -> EBNF: minLength / maxLength (codepoints),
 * pattern (ECMAScript, searched inside the decoded string) and format (a
 * fixed regex per known format). */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "grammar/unique_int.h"
#include "schema_int.h"

/* RFC 3986 / 3987 building blocks. X adds characters to the unreserved
 * set (ucschar for IRIs), Q to the query (iprivate for IRIs). IP-literal
 * hosts ([...]) are left out (a sound subset). */
#define U_PCT "%[0-9A-Fa-f]{2}"
#define U_UNR(X) "A-Za-z0-9._~" X "!$&'()*+,;="
#define U_PCHAR(X) "([" U_UNR(X) ":@-]|" U_PCT ")"
#define U_AUTH(X) "(([" U_UNR(X) ":-]|" U_PCT ")*@)?([" U_UNR(X) "-]|" U_PCT ")*(:[0-9]*)?"
#define U_QF(X, Q) "(\\?([" U_UNR(X) Q ":@/?-]|" U_PCT ")*)?(#([" U_UNR(X) ":@/?-]|" U_PCT ")*)?"
#define U_ABS(X, Q) "[A-Za-z][A-Za-z0-9+.-]*:"                                                          \
    "(//" U_AUTH(X) "(/" U_PCHAR(X) "*)*|(/?" U_PCHAR(X) "+(/" U_PCHAR(X) "*)*)?)" U_QF(X, Q)
/* relative-ref: network-path, absolute path, path without a scheme-like
 * first segment (no ':' before the first '/'), or empty */
#define U_REL(X, Q)                                                                                     \
    "(//" U_AUTH(X) "(/" U_PCHAR(X) "*)*|/(" U_PCHAR(X) "+(/" U_PCHAR(X) "*)*)?|([" U_UNR(X) "@-]|" U_PCT \
    ")+(/" U_PCHAR(X) "*)*|)" U_QF(X, Q)
#define U_UCS                                                                                           \
    "\\u{A0}-\\u{D7FF}\\u{F900}-\\u{FDCF}\\u{FDF0}-\\u{FFEF}\\u{10000}-\\u{1FFFD}\\u{20000}-\\u{2FFFD}"         \
    "\\u{30000}-\\u{3FFFD}\\u{40000}-\\u{4FFFD}\\u{50000}-\\u{5FFFD}\\u{60000}-\\u{6FFFD}\\u{70000}-\\u{7FFFD}"  \
    "\\u{80000}-\\u{8FFFD}\\u{90000}-\\u{9FFFD}\\u{A0000}-\\u{AFFFD}\\u{B0000}-\\u{BFFFD}\\u{C0000}-\\u{CFFFD}"  \
    "\\u{D0000}-\\u{DFFFD}\\u{E1000}-\\u{EFFFD}"
#define U_PRIV "\\u{E000}-\\u{F8FF}\\u{F0000}-\\u{FFFFD}\\u{100000}-\\u{10FFFD}"
/* RFC 3339 appendix A duration (ASCII digits, no fractions) */
#define DUR_TIME "T(\\d+H(\\d+M(\\d+S)?)?|\\d+M(\\d+S)?|\\d+S)"
#define JSON_PTR "(/([^~/]|~[01])*)*"

static const struct { const char *name, *re; } k_formats[] = {
    {"date", "^(\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
             "|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)$"},
    {"time", "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$"},
    {"date-time", "^(\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
                  "|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
                  "[Tt]([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$"},
    {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
              "@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"ipv4", "^(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}$"},
    {"ipv6", "^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:"
             "|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}"
             "|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}"
             "|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}"
             "|:((:[0-9a-fA-F]{1,4}){1,7}|:))$"},
    /* RFC 1123 host names, a sound subset: no "--" anywhere (so no
     * punycode A-labels, which need decoding to validate), labels of at
     * most 61 characters, at most 4 labels (within the 253 limit) */
    {"hostname", "^[A-Za-z0-9](-?[A-Za-z0-9]){0,30}(\\.[A-Za-z0-9](-?[A-Za-z0-9]){0,30}){0,3}$"},
    /* OpenAPI base64 */
    {"byte", "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"},
    /* RFC 3986 URI, conservatively: IP-literal hosts are left out */
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:"
            "(//(([A-Za-z0-9._~!$&'()*+,;=:-]|%[0-9A-Fa-f]{2})*@)?([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*"
            "(:[0-9]*)?(/([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*"
            "|(/?([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})+(/([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*)?)"
            "(\\?([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?(#([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?$"},
    {"uri-reference", "^(" U_ABS("", "") "|" U_REL("", "") ")$"},
    {"iri", "^" U_ABS(U_UCS, U_PRIV) "$"},
    {"iri-reference", "^(" U_ABS(U_UCS, U_PRIV) "|" U_REL(U_UCS, U_PRIV) ")$"},
    /* RFC 6570 level 4; literals as the JSON-Schema-Test-Suite reads them
     * (the apostrophe admitted) */
    {"uri-template", "^([!#$&-;=?-\\[\\]_a-z~" U_UCS U_PRIV "]|" U_PCT "|\\{[+#./;?&=,!@|]?"
                     "([A-Za-z0-9_]|" U_PCT ")(\\.?([A-Za-z0-9_]|" U_PCT "))*(:[1-9]\\d{0,3}|\\*)?"
                     "(,([A-Za-z0-9_]|" U_PCT ")(\\.?([A-Za-z0-9_]|" U_PCT "))*(:[1-9]\\d{0,3}|\\*)?)*\\})*$"},
    {"duration", "^P((\\d+D|\\d+M(\\d+D)?|\\d+Y(\\d+M(\\d+D)?)?)(" DUR_TIME ")?|" DUR_TIME "|\\d+W)$"},
    {"json-pointer", "^" JSON_PTR "$"},
    {"relative-json-pointer", "^(0|[1-9]\\d*)(#|" JSON_PTR ")$"},
};

/* Formats JSON Schema defines (drafts 3 to 2020-12) that tern has no exact
 * grammar for: refused. A name outside every draft (MaskBench has `topic`,
 * `path`, `password`...) asserts nothing by the specification (2020-12
 * 7.2.3: unknown formats are annotations; draft 7 likewise) and is left
 * as one. `url` is read as `uri` (a sound subset of what a client asking
 * for a URL accepts). A case variant of a defined name is refused like a
 * case variant of a keyword. */
static const char *const k_formats_refused[] = {
    "idn-email", "idn-hostname", "regex", "host-name", "ip-address", "color", "utc-millisec", "style", "phone",
};

/* format: *re = its regex, or NULL when the name is an annotation (no
 * constraint). 0, or the error (not a string, or refused). */
int sc_format_re(sc *c, json_object *fmt, const char *path, const char **re)
{
    *re = NULL;
    if (!json_object_is_type(fmt, json_type_string))
        return sc_fail(c, TERN_EINVAL, path, "'format' must be a string");
    const char *name = json_object_get_string(fmt);
    if (!strcmp(name, "url"))
        name = "uri";
    for (size_t i = 0; i < sizeof k_formats / sizeof k_formats[0]; i++) {
        if (!strcmp(name, k_formats[i].name)) {
            *re = k_formats[i].re;
            return 0;
        }
        if (!strcasecmp(name, k_formats[i].name))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "format '%.100s' unsupported (a case variant of '%s')",
                           name, k_formats[i].name);
    }
    for (size_t i = 0; i < sizeof k_formats_refused / sizeof k_formats_refused[0]; i++)
        if (!strcasecmp(name, k_formats_refused[i]))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "format '%.100s' unsupported", name);
    return 0;
}

/* The regex terms without the lengths, in a rule the matcher counts the
 * string's codepoints for (unique_int.h): where the product automaton with
 * the lengths passes its bound (format email with maxLength 1024). 0, 1
 * (no string), or the error (the product's, e0, when the terms fail
 * without lengths too). */
static int string_regex_len(sc *c, const gfe_re_term *t, int n, long mn, long mx, const char *path,
                            const tern_err *e0, gfe_buf *out)
{
    int never = 0, rc;
    tern_err e = {0};
    gfe_buf b;
    gfe_buf_init(&b, 0);
    char nm[GFE_NAME_MAX];
    if (n == 1 && !t[0].neg) {
        rc = gfe_regex_emit_len(&b, t[0].re, t[0].len, 1, 1, 0, -1, &never, &e);
    } else {
        rc = gfe_regex_emit_terms(&c->r, t, n, 0, -1, nm, &never, &e);
        if (!rc && !never)
            gfe_buf_puts(&b, nm);
    }
    if (!rc && !never && !b.err) {
        char name[64];
        unsigned num = c->r.next++;
        snprintf(name, sizeof name, GUQ_LEN_PREFIX "%ld_%ld_%u", mn, mx, num);
        gfe_buf body;
        gfe_buf_init(&body, 0);
        /* the terms again, for the tracker's automaton (unique_int.h
         * GUQ_RE_PREFIX): a rule nothing calls, "+LEN:regex" or
         * "-LEN:regex" per term */
        char rname[64];
        snprintf(rname, sizeof rname, GUQ_RE_PREFIX "%u", num);
        gfe_buf terms;
        gfe_buf_init(&terms, 0);
        for (int i = 0; i < n; i++) {
            gfe_buf_printf(&terms, "%c%zu:", t[i].neg ? '-' : '+', t[i].len);
            gfe_buf_put(&terms, t[i].re, t[i].len);
        }
        gfe_buf_lit(&body, terms.s ? terms.s : "", terms.len);
        rc = terms.err ? terms.err : body.err;
        gfe_buf_free(&terms);
        if (!rc)
            rc = gfe_rule_define(&c->r, rname, body.s);
        body.len = 0;
        gfe_buf_puts(&body, "\"\\\"\" ");
        gfe_buf_put(&body, b.s, b.len);
        gfe_buf_puts(&body, " \"\\\"\"");
        if (!body.err)
            gfe_rule_define(&c->r, name, body.s);
        if (!rc)
            rc = body.err;
        gfe_buf_free(&body);
        gfe_buf_puts(out, name);
    }
    int err = rc ? rc : b.err;
    gfe_buf_free(&b);
    if (err)
        return sc_fail(c, e0->code ? e0->code : err, path, "%s", e0->msg[0] ? e0->msg : "grammar too large");
    return never;
}

/* Would the product automaton of the terms with a codepoint counter have
 * more than bound states (the terms' own automaton times the
 * counter's values)? Then the tracker counts instead: a rule per
 * (state, count) makes every character of the string a new parser set
 * that no mask shares (a counted `pattern` with maxLength 120: 20k rules,
 * masks of 10-50 ms), while the terms alone are a few states whose token
 * sets the masks reuse. */
static int len_product_large(const gfe_re_term *t, int n, long mn, long mx, long bound)
{
    gfe_cpdfa *d = NULL;
    int never = 0;
    tern_err e = {0};
    if (gfe_regex_terms_dfa(t, n, &d, &never, &e) || !d)
        return 0;
    long cap = mx >= 0 ? mx : mn;
    int large = (double)d->n * (double)(cap + 1) > (double)bound;
    gfe_cpdfa_free(d);
    return large;
}

/* The regex terms (a format, patterns, negated patterns) with the length
 * bounds. One positive regex whose lengths fold into one repetition is
 * written inline; other shapes go through the product automaton
 * (regex_nfa.c). 0, 1 (no string), or the error. */
static int string_regex(sc *c, const gfe_re_term *t, int n, long mn, long mx, const char *path, gfe_buf *out)
{
    int never = 0, rc = TERN_EUNSUPPORTED;
    tern_err e = {0};
    gfe_buf b;
    gfe_buf_init(&b, 0);
    if (n == 1 && !t[0].neg)
        rc = gfe_regex_emit_len(&b, t[0].re, t[0].len, 1, 1, mn, mx, &never, &e);
    if (rc == TERN_EUNSUPPORTED && (n > 1 || t[0].neg || mn > 0 || mx >= 0)) {
        char nm[GFE_NAME_MAX];
        never = 0;
        b.len = 0;
        int counted = mx < 0 || mx >= GUQ_LEN_MIN_MAX;
        if (counted && len_product_large(t, n, mn, mx, c->o.len_product_max > 0 ? c->o.len_product_max : GUQ_LEN_PRODUCT)) {
            gfe_buf_free(&b);
            return string_regex_len(c, t, n, mn, mx, path, &e, out);
        }
        rc = gfe_regex_emit_terms(&c->r, t, n, mn, mx, nm, &never, &e);
        if (!rc && !never)
            gfe_buf_puts(&b, nm);
        if (rc == TERN_EUNSUPPORTED && counted) {
            gfe_buf_free(&b);
            return string_regex_len(c, t, n, mn, mx, path, &e, out);
        }
    }
    if (!rc && !never) {
        gfe_buf_puts(out, "(\"\\\"\" ");
        gfe_buf_put(out, b.s, b.len);
        gfe_buf_puts(out, " \"\\\"\")");
    }
    gfe_buf_free(&b);
    if (rc)
        return sc_fail(c, rc, path, "%s", e.msg);
    return never;
}

/* One pattern value into the terms: a string, or the compiler's own list
 * (sc_patterns_internal) of strings and {"not": string} (a negated
 * pattern). */
static int string_terms(sc *c, json_object *pat, gfe_re_term *t, int *n, const char *path)
{
    int internal = sc_patterns_internal(c, pat);
    size_t k = internal ? json_object_array_length(pat) : 1;
    for (size_t i = 0; i < k; i++) {
        json_object *v = internal ? json_object_array_get_idx(pat, i) : pat, *nv;
        int neg = internal && json_object_object_get_ex(v, "not", &nv);
        if (neg)
            v = nv;
        if (!json_object_is_type(v, json_type_string))
            return sc_fail(c, TERN_EINVAL, path, "'pattern' must be a string");
        if (*n == GFE_RE_MAX_TERMS)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "more than %d 'pattern' and 'format' values together",
                           GFE_RE_MAX_TERMS);
        t[(*n)++] = (gfe_re_term){json_object_get_string(v), (size_t)json_object_get_string_len(v), neg};
    }
    return 0;
}

int sc_string_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out)
{
    (void)mask;
    long mn, mx;
    if (sc_count_get(c, s, "minLength", path, &mn) || sc_count_get(c, s, "maxLength", path, &mx))
        return c->rc;
    if (mn < 0)
        mn = 0;
    if (mx >= 0 && mx < mn)
        return 1;
    json_object *pat = sc_get(s, "pattern"), *fmt = sc_get(s, "format");
    const char *re = NULL;
    int rc;
    if (fmt && (rc = sc_format_re(c, fmt, path, &re)))
        return rc;
    gfe_re_term t[GFE_RE_MAX_TERMS];
    int n = 0;
    if (re)
        t[n++] = (gfe_re_term){re, strlen(re), 0};
    if (pat && (rc = string_terms(c, pat, t, &n, path)))
        return rc;
    if (n)
        return string_regex(c, t, n, mn, mx, path, out);
    gfe_buf_printf(out, "(\"\\\"\" %s", sc_unit(c));
    sc_rep(out, mn, mx);
    gfe_buf_puts(out, " \"\\\"\")");
    return 0;
}
