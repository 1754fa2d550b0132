/* The structured-output fields of a request body -> one typed spec
 * (api_structured_spec, api.h): every field checked for shape here, with
 * the 400s naming it, and the winner kept by precedence (grammar >
 * json_schema > json_object > structured_outputs > regex > choice).
 * structured.c only normalizes, cache-keys and compiles the result.
 *
 * Field shapes accepted:
 *   response_format {type: text | json_object | json_schema,
 *                    json_schema: {name, schema, strict, description,
 *                                  any_whitespace, max_whitespace}}
 *                   or {type: structural_tag, ...} (structural.c's shapes)
 *   guided_json (schema object or JSON text), guided_grammar (EBNF text),
 *   guided_regex (text), guided_choice ([strings]),
 *   structured_outputs: a bare schema, or vLLM's object form
 *                       {json | regex | choice | grammar | json_object,
 *                        structural_tag (an object or JSON text),
 *                        disable_any_whitespace}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "server/api.h"

static int bad_type(api_error *e, const char *param, const char *what)
{
    return api_bad(e, "invalid_type", param, "'%s' must be %s", param, what);
}

static int get_string_field(json_object *v, const char *param, const char **s, size_t *len, api_error *e)
{
    if (!json_object_is_type(v, json_type_string))
        return bad_type(e, param, "a string");
    *s = json_object_get_string(v);
    *len = (size_t)json_object_get_string_len(v);
    if (*len == 0)
        return api_bad(e, "invalid_value", param, "'%s' must not be empty", param);
    return 0;
}

/* A schema given as an object, or as JSON text (vLLM accepts both). */
static int take_schema(api_structured_spec *sp, json_object *v, const char *param, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        tern_err je;
        json_object *o = tern_json_parse(json_object_get_string(v), (size_t)json_object_get_string_len(v), &je);
        if (!o)
            return api_bad(e, "invalid_value", param, "'%s' is not valid JSON: %s", param, je.msg);
        sp->owned = o;
        v = o;
    }
    if (!json_object_is_type(v, json_type_object) && !json_object_is_type(v, json_type_boolean))
        return bad_type(e, param, "a JSON Schema (an object)");
    sp->kind = API_SPEC_SCHEMA;
    sp->json = v;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

static int take_choice(api_structured_spec *sp, json_object *v, const char *param, api_error *e)
{
    if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
        return bad_type(e, param, "a non-empty array of strings");
    for (size_t i = 0; i < json_object_array_length(v); i++)
        if (!json_object_is_type(json_object_array_get_idx(v, i), json_type_string))
            return bad_type(e, param, "a non-empty array of strings");
    sp->kind = API_SPEC_CHOICE;
    sp->json = v;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

static int take_text(api_structured_spec *sp, api_spec_kind kind, json_object *v, const char *param, api_error *e)
{
    if (get_string_field(v, param, &sp->text, &sp->text_len, e))
        return -1;
    sp->kind = kind;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

/* A structural tag, as an object or as JSON text (vLLM's
 * structured_outputs.structural_tag); its body is checked by structural.c.
 * A "type" in it must say structural_tag. */
static int take_structural(api_structured_spec *sp, json_object *v, const char *param, api_error *e)
{
    if (json_object_is_type(v, json_type_string)) {
        tern_err je;
        json_object *o = tern_json_parse(json_object_get_string(v), (size_t)json_object_get_string_len(v), &je);
        if (!o)
            return api_bad(e, "invalid_value", param, "'%s' is not valid JSON: %s", param, je.msg);
        json_object_put(sp->owned);
        sp->owned = o;
        v = o;
    }
    json_object *t = NULL;
    if (!json_object_is_type(v, json_type_object))
        return bad_type(e, param, "a structural tag object");
    if (json_object_object_get_ex(v, "type", &t) &&
        (!json_object_is_type(t, json_type_string) || strcmp(json_object_get_string(t), "structural_tag")))
        return api_bad(e, "invalid_value", param, "'%s.type' must be \"structural_tag\"", param);
    sp->kind = API_SPEC_STRUCTURAL;
    sp->json = v;
    snprintf(sp->param, sizeof sp->param, "%s", param);
    return 0;
}

static int get_bool_field(json_object *v, const char *param, int *out, api_error *e)
{
    if (!json_object_is_type(v, json_type_boolean))
        return bad_type(e, param, "a boolean");
    *out = json_object_get_boolean(v);
    return 0;
}

static int parse_json_schema_obj(api_structured_spec *sp, json_object *js, api_error *e)
{
    const char *P = "response_format.json_schema";
    if (!json_object_is_type(js, json_type_object))
        return bad_type(e, P, "an object {name, schema, strict}");
    json_object *schema = NULL;
    json_object_object_foreach(js, k, v) {
        char param[96];
        snprintf(param, sizeof param, "%s.%.40s", P, k);
        if (!v)
            continue;
        if (!strcmp(k, "schema")) {
            schema = v;
        } else if (!strcmp(k, "name") || !strcmp(k, "description")) {
            if (!json_object_is_type(v, json_type_string))
                return bad_type(e, param, "a string");
        } else if (!strcmp(k, "strict")) {
            if (get_bool_field(v, param, &sp->strict, e))
                return -1;
        } else if (!strcmp(k, "any_whitespace")) {
            if (get_bool_field(v, param, &sp->any_ws, e))
                return -1;
        } else if (!strcmp(k, "max_whitespace")) {
            if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 ||
                json_object_get_int64(v) > 256)
                return api_bad(e, "invalid_value", param, "'%s' must be an integer from 0 to 256", param);
            sp->max_ws = (int)json_object_get_int64(v);
        } else {
            return api_bad(e, "unsupported_parameter", param, "unsupported field '%s'", param);
        }
    }
    if (!schema) /* OpenAI: a json_schema without a schema admits any object */
        return sp->kind = API_SPEC_JSON_OBJECT, snprintf(sp->param, sizeof sp->param, "%s", P), 0;
    return take_schema(sp, schema, "response_format.json_schema.schema", e);
}

static int parse_response_format(json_object *rf, api_structured_spec *schema_sp, api_structured_spec *object_sp,
                                 api_error *e)
{
    json_object *t = NULL;
    if (!json_object_is_type(rf, json_type_object) || !json_object_object_get_ex(rf, "type", &t) ||
        !json_object_is_type(t, json_type_string))
        return api_bad(e, "invalid_type", "response_format", "'response_format' must be an object with a 'type'");
    const char *type = json_object_get_string(t);
    if (!strcmp(type, "structural_tag"))
        return take_structural(schema_sp, rf, "response_format", e);
    json_object_object_foreach(rf, k, v) {
        if (!strcmp(k, "type") || (!strcmp(type, "json_schema") && !strcmp(k, "json_schema")))
            continue;
        (void)v;
        char param[96];
        snprintf(param, sizeof param, "response_format.%.40s", k);
        return api_bad(e, "unsupported_parameter", param, "unsupported field '%s' for type '%.40s'", param, type);
    }
    if (!strcmp(type, "text"))
        return 0;
    if (!strcmp(type, "json_object")) {
        object_sp->kind = API_SPEC_JSON_OBJECT;
        snprintf(object_sp->param, sizeof object_sp->param, "response_format");
        return 0;
    }
    if (!strcmp(type, "json_schema")) {
        json_object *js = NULL;
        if (!json_object_object_get_ex(rf, "json_schema", &js) || !js)
            return api_bad(e, "missing_required_parameter", "response_format.json_schema",
                           "response_format type 'json_schema' needs 'json_schema'");
        return parse_json_schema_obj(schema_sp, js, e);
    }
    return api_bad(e, "invalid_value", "response_format.type",
                   "response_format type must be 'text', 'json_object', 'json_schema' or 'structural_tag', not "
                   "'%.40s'", type);
}

/* structured_outputs: vLLM's object form, or a bare schema. */
static int parse_structured_outputs(json_object *v, api_structured_spec *sp, api_error *e)
{
    static const char *const form_keys[] = {"json", "regex", "choice", "grammar", "json_object", "structural_tag"};
    int is_form = 0;
    if (json_object_is_type(v, json_type_object))
        for (size_t i = 0; i < sizeof form_keys / sizeof form_keys[0]; i++)
            is_form |= json_object_object_get_ex(v, form_keys[i], NULL);
    if (!is_form)
        return take_schema(sp, v, "structured_outputs", e);
    /* precedence inside the form follows the top level's */
    api_structured_spec g = {0}, js = {0}, jo = {0}, re = {0}, ch = {0}, st = {0};
    g.any_ws = js.any_ws = jo.any_ws = re.any_ws = ch.any_ws = st.any_ws = sp->any_ws;
    g.max_ws = js.max_ws = jo.max_ws = re.max_ws = ch.max_ws = st.max_ws = sp->max_ws;
    g.strict = js.strict = jo.strict = re.strict = ch.strict = st.strict = sp->strict;
    int any_ws = sp->any_ws;
    json_object_object_foreach(v, k, f) {
        char param[96];
        snprintf(param, sizeof param, "structured_outputs.%.40s", k);
        if (!f)
            continue;
        int rc = 0;
        if (!strcmp(k, "json"))
            rc = take_schema(&js, f, param, e);
        else if (!strcmp(k, "grammar"))
            rc = take_text(&g, API_SPEC_GRAMMAR, f, param, e);
        else if (!strcmp(k, "regex"))
            rc = take_text(&re, API_SPEC_REGEX, f, param, e);
        else if (!strcmp(k, "choice"))
            rc = take_choice(&ch, f, param, e);
        else if (!strcmp(k, "structural_tag"))
            rc = take_structural(&st, f, param, e);
        else if (!strcmp(k, "json_object")) {
            int on = 0;
            rc = get_bool_field(f, param, &on, e);
            if (on) {
                jo.kind = API_SPEC_JSON_OBJECT;
                snprintf(jo.param, sizeof jo.param, "%s", param);
            }
        } else if (!strcmp(k, "disable_any_whitespace")) {
            int off = 0;
            rc = get_bool_field(f, param, &off, e);
            any_ws = !off;
        } else if (!strcmp(k, "disable_additional_properties")) {
            int off = 0;
            rc = get_bool_field(f, param, &off, e);
            if (off)
                sp->strict = 1;
        } else {
            rc = api_bad(e, "unsupported_parameter", param, "unsupported field '%s'", param);
        }
        if (rc) {
            json_object_put(js.owned);
            json_object_put(st.owned);
            return -1;
        }
    }
    api_structured_spec *pick = g.kind    ? &g
                                : st.kind ? &st
                                : js.kind ? &js
                                : jo.kind ? &jo
                                : re.kind ? &re
                                : ch.kind ? &ch
                                          : NULL;
    if (pick) {
        int strict = sp->strict;
        *sp = *pick;
        sp->any_ws = any_ws;
        sp->strict = strict;
        if (pick != &js)
            json_object_put(js.owned);
        if (pick != &st)
            json_object_put(st.owned);
    }
    return 0;
}

static void spec_free(api_structured_spec *sp) { json_object_put(sp->owned); }

void api_structured_free(api_structured_spec *sp)
{
    if (!sp)
        return;
    json_object_put(sp->owned);
    memset(sp, 0, sizeof *sp);
}

int api_structured_parse(api_request *q, api_error *e)
{
    api_structured_spec *out = &q->structured_spec;
    api_structured_spec s[6]; /* by precedence: grammar, json_schema, json_object, structured_outputs, regex, choice */
    memset(s, 0, sizeof s);
    for (int i = 0; i < 6; i++) {
        s[i].any_ws = 1;
        s[i].max_ws = API_STRUCTURED_DEFAULT_MAX_WS;
        s[i].strict = 1;
    }
    int rc = 0;
    json_object_object_foreach(q->root, k, v) {
        if (!v || rc)
            continue;
        if (!strcmp(k, "response_format")) {
            spec_free(&s[1]); /* wins over a guided_json seen earlier */
            s[1].owned = NULL;
            s[1].kind = API_SPEC_NONE;
            rc = parse_response_format(v, &s[1], &s[2], e);
        }
        else if (!strcmp(k, "guided_grammar"))
            rc = take_text(&s[0], API_SPEC_GRAMMAR, v, k, e);
        else if (!strcmp(k, "guided_json") && !s[1].kind) /* response_format's json_schema wins */
            rc = take_schema(&s[1], v, k, e);
        else if (!strcmp(k, "structured_outputs"))
            rc = parse_structured_outputs(v, &s[3], e);
        else if (!strcmp(k, "guided_regex"))
            rc = take_text(&s[4], API_SPEC_REGEX, v, k, e);
        else if (!strcmp(k, "guided_choice"))
            rc = take_choice(&s[5], v, k, e);
    }
    api_structured_free(out);
    for (int i = 0; i < 6; i++) {
        if (!rc && s[i].kind && !out->kind)
            *out = s[i];
        else
            spec_free(&s[i]);
    }
    return rc ? -1 : 0;
}
