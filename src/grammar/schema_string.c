/* JSON Schema strings -> EBNF: minLength / maxLength (codepoints),
 * pattern (ECMAScript, searched inside the decoded string) and format (a
 * fixed regex per known format). */
#include <stdio.h>
#include <string.h>

#include "schema_int.h"

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
};

/* format: its regex, or NULL with *rc set (not a string, or unknown). */
static const char *string_format_re(sc *c, json_object *fmt, const char *path, int *rc)
{
    *rc = 0;
    if (!json_object_is_type(fmt, json_type_string)) {
        *rc = sc_fail(c, TERN_EINVAL, path, "'format' must be a string");
        return NULL;
    }
    const char *re = NULL;
    for (size_t i = 0; i < sizeof k_formats / sizeof k_formats[0]; i++)
        if (!strcmp(json_object_get_string(fmt), k_formats[i].name))
            re = k_formats[i].re;
    if (!re)
        *rc = sc_fail(c, TERN_EUNSUPPORTED, path, "format '%.100s' unsupported", json_object_get_string(fmt));
    return re;
}

/* The regex (pattern or format) with the length bounds. 0, 1 (no
 * string), or the error. */
static int string_regex(sc *c, const char *re, long mn, long mx, const char *path, gfe_buf *out)
{
    int never = 0;
    tern_err e;
    gfe_buf b;
    gfe_buf_init(&b, 0);
    int rc = gfe_regex_emit_len(&b, re, strlen(re), 1, 1, mn, mx, &never, &e);
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
    if (fmt && !(re = string_format_re(c, fmt, path, &rc)))
        return rc;
    if (pat) {
        if (!json_object_is_type(pat, json_type_string))
            return sc_fail(c, TERN_EINVAL, path, "'pattern' must be a string");
        if (re)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'pattern' together with 'format'");
        re = json_object_get_string(pat);
    }
    if (re)
        return string_regex(c, re, mn, mx, path, out);
    gfe_buf_printf(out, "(\"\\\"\" %s", sc_unit(c));
    sc_rep(out, mn, mx);
    gfe_buf_puts(out, " \"\\\"\")");
    return 0;
}
