/* guided_choice -> EBNF and the built-in JSON grammar (response_format
 * json_object), plus the JSON value rules the schema front end reuses for
 * `true` schemas and unlisted properties. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fe_int.h"
#include "frontend.h"

const char *gfe_json_ws(const gfe_json_style *st)
{
    return st->any_whitespace ? " ws " : " ";
}

int gfe_json_define(gfe_rules *r, const gfe_json_style *st, char value[GFE_NAME_MAX],
                    char string[GFE_NAME_MAX], char number[GFE_NAME_MAX])
{
    char v[GFE_NAME_MAX], s[GFE_NAME_MAX], n[GFE_NAME_MAX], obj[GFE_NAME_MAX], arr[GFE_NAME_MAX];
    const char *w = gfe_json_ws(st);
    gfe_buf b;
    gfe_buf_init(&b, 0);
    if (st->any_whitespace && !r->has_ws) {
        if (st->max_whitespace < 0)
            gfe_rule_define(r, "ws", "[ \\n\\t\\r]*");
        else {
            gfe_buf_printf(&b, "[ \\n\\t\\r]{0,%d}", st->max_whitespace);
            gfe_rule_define(r, "ws", b.s ? b.s : "\"\"");
            b.len = 0;
        }
        r->has_ws = 1;
    }
    /* string: raw characters except quote, backslash and controls, or an
     * escape; surrogate pairs need no special case here (no length count) */
    gfe_rule_add(r, "\"\\\"\" ([^\"\\\\\\u0000-\\u001F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
                    "[0-9a-fA-F]{4}))* \"\\\"\"", s);
    gfe_rule_add(r, "\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\-]? [0-9]+)?", n);
    gfe_rule_reserve(r, v);
    gfe_buf_printf(&b, "\"{\"%s(%s%s\":\"%s%s (%s\",\"%s%s%s\":\"%s%s)*%s)? \"}\"", w, s, w, w, v,
                   w, w, s, w, w, v, w);
    gfe_rule_add(r, b.s, obj);
    b.len = 0;
    gfe_buf_printf(&b, "\"[\"%s(%s (%s\",\"%s%s)*%s)? \"]\"", w, v, w, w, v, w);
    gfe_rule_add(r, b.s, arr);
    b.len = 0;
    gfe_buf_printf(&b, "%s | %s | %s | %s | \"true\" | \"false\" | \"null\"", obj, arr, s, n);
    gfe_rule_define(r, v, b.s);
    int rc = b.err ? b.err : r->out.err;
    gfe_buf_free(&b);
    if (value)
        memcpy(value, v, GFE_NAME_MAX);
    if (string)
        memcpy(string, s, GFE_NAME_MAX);
    if (number)
        memcpy(number, n, GFE_NAME_MAX);
    return rc;
}

char *grammar_json_builtin_ebnf(enum grammar_json_kind kind, int any_whitespace,
                                int max_whitespace)
{
    if (kind != GRAMMAR_JSON_ANY_VALUE && kind != GRAMMAR_JSON_OBJECT)
        return NULL;
    gfe_json_style st = {.any_whitespace = any_whitespace != 0,
                         .max_whitespace = max_whitespace < 0 ? -1 : max_whitespace};
    gfe_rules r;
    gfe_rules_init(&r, 0);
    char v[GFE_NAME_MAX];
    char *out = NULL;
    if (gfe_json_define(&r, &st, v, NULL, NULL) == 0) {
        if (kind == GRAMMAR_JSON_ANY_VALUE) {
            gfe_rule_define(&r, "root", v);
        } else {
            /* the object rule is the first alternative of the value rule */
            const char *w = gfe_json_ws(&st);
            gfe_buf b;
            gfe_buf_init(&b, 0);
            char s[GFE_NAME_MAX];
            gfe_json_define(&r, &st, NULL, s, NULL);
            gfe_buf_printf(&b, "\"{\"%s(%s%s\":\"%s%s (%s\",\"%s%s%s\":\"%s%s)*%s)? \"}\"", w, s,
                           w, w, v, w, w, s, w, w, v, w);
            if (!b.err)
                gfe_rule_define(&r, "root", b.s);
            gfe_buf_free(&b);
        }
        out = gfe_buf_take(&r.out);
    }
    gfe_rules_free(&r);
    return out;
}

int grammar_choice_to_ebnf(json_object *arr, char **ebnf_out, tern_err *err)
{
    *ebnf_out = NULL;
    if (!arr || !json_object_is_type(arr, json_type_array) || json_object_array_length(arr) == 0)
        return tern_err_set(err, TERN_EINVAL, "guided_choice must be a non-empty array of strings");
    gfe_buf b;
    gfe_buf_init(&b, 16u << 20);
    gfe_buf_puts(&b, "root ::= ");
    size_t n = json_object_array_length(arr);
    for (size_t i = 0; i < n; i++) {
        json_object *s = json_object_array_get_idx(arr, i);
        if (!json_object_is_type(s, json_type_string)) {
            gfe_buf_free(&b);
            return tern_err_set(err, TERN_EINVAL, "guided_choice[%zu] is not a string", i);
        }
        if (i)
            gfe_buf_puts(&b, " | ");
        gfe_buf_lit(&b, json_object_get_string(s), (size_t)json_object_get_string_len(s));
    }
    gfe_buf_puts(&b, "\n");
    if (b.err) {
        int code = b.err;
        gfe_buf_free(&b);
        return tern_err_set(err, code, "guided_choice: %s", tern_err_str(code));
    }
    *ebnf_out = gfe_buf_take(&b);
    gfe_buf_free(&b);
    return *ebnf_out ? 0 : tern_err_set(err, TERN_ENOMEM, "guided_choice: out of memory");
}
