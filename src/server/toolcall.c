/* Tool calls enforced by the grammar engine (see toolcall.h). The grammar
 * of the calls, in the format's own text:
 *
 *   root     ::= tc_calls                       (| rf_root: auto + response_format)
 *   tc_calls ::= LEAD tc_any CLOSE (SEP OPEN tc_any CLOSE)* END
 *   tc_any   ::= tc0_call | tc1_call | ...
 *   tcI_call ::= "{" ws "\"name\"" ws ":" ws "\"NAME\"" ws "," ws "\"arguments\"" ws ":" ws tcI_root ws "}"
 *
 * where LEAD = begin + call_open (minus what a special token writes),
 * tcI_root is tool I's parameters schema compiled by the JSON-Schema front
 * end (its rules renamed with the prefix tcI_), and the repetition exists
 * only when several calls are allowed. The grammar text is the cache key:
 * equal tools give equal grammars, compiled once. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/strbuf.h"
#include "engine/constraint.h"
#include "grammar/schema.h"
#include "server/server_int.h"
#include "server/structured.h"
#include "server/toolcall.h"

/* Whitespace characters between two JSON tokens of a call: templates
 * render calls as one-line JSON (", " and ": "), so one is all a model
 * needs, and a call cannot run away on blanks (a sampled call always
 * closes within its arguments' length plus a few tokens). */
#define TOOLCALL_MAX_WS 1

typedef struct toolcall_server {
    size_t lead_skip;               /* bytes of LEAD a special token writes (0 = none) */
    int can_parallel;               /* further calls can be written as text */
    constraint_triggers *lazy_trig; /* auto: the format's triggers */
    constraint_triggers *lead_trig; /* forced with lead_skip: the lead token */
} toolcall_server;

static pthread_mutex_t tc_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- EBNF text ---- */

static void put_lit(tern_sbuf *b, const char *s) { structured_ebnf_literal(b, s, strlen(s)); }

/* Tool i's parameters schema as rules prefixed tc<i>_ (root: tc<i>_root). */
static int put_schema(tern_sbuf *b, json_object *tool, size_t i, api_error *e)
{
    json_object *fn = NULL, *params = NULL, *dflt = NULL;
    json_object_object_get_ex(tool, "function", &fn);
    if (!json_object_object_get_ex(fn, "parameters", &params) || !params) {
        /* OpenAI: no parameters = a function without arguments */
        dflt = json_tokener_parse("{\"type\": \"object\", \"properties\": {}}");
        params = dflt;
    }
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.max_whitespace = TOOLCALL_MAX_WS;
    char *sch = NULL;
    tern_err te = {0};
    int rc = grammar_schema_to_ebnf(params, &o, &sch, &te);
    json_object_put(dflt);
    if (rc) {
        char param[96];
        snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
        return api_bad(e, structured_error_code(te.code), param, "%s: cannot compile the JSON Schema: %s", param,
                       te.msg);
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "tc%zu_", i);
    structured_ebnf_renamed(b, sch, prefix);
    free(sch);
    return 0;
}

static int put_tool(tern_sbuf *b, const toolfmt *f, json_object *tool, size_t i, api_error *e)
{
    if (put_schema(b, tool, i, e))
        return -1;
    char line[128];
    snprintf(line, sizeof line, "tc%zu_call ::= \"{\" tc_ws ", i);
    tern_sbuf_str(b, line);
    char key[96];
    snprintf(key, sizeof key, "\"%s\"", f->name_key);
    put_lit(b, key);
    tern_sbuf_str(b, " tc_ws \":\" tc_ws ");
    snprintf(key, sizeof key, "\"%s\"", api_tool_name(tool));
    put_lit(b, key);
    tern_sbuf_str(b, " tc_ws \",\" tc_ws ");
    snprintf(key, sizeof key, "\"%s\"", f->args_key);
    put_lit(b, key);
    snprintf(line, sizeof line, " tc_ws \":\" tc_ws tc%zu_root tc_ws \"}\"\n", i);
    tern_sbuf_str(b, line);
    return 0;
}

/* The alternatives of a rule: one nonterminal (rule_fmt with the tool's
 * index) per tool, or only the tool named only, then the line's end. None:
 * a 400 (b freed). */
static int put_alts(tern_sbuf *b, json_object *tools, const char *only, const char *rule_fmt, api_error *e)
{
    size_t n = json_object_array_length(tools), n_any = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = api_tool_name(json_object_array_get_idx(tools, i));
        if (only && strcmp(name, only) != 0)
            continue;
        char alt[48];
        if (n_any++)
            tern_sbuf_str(b, " | ");
        snprintf(alt, sizeof alt, rule_fmt, i);
        tern_sbuf_str(b, alt);
    }
    tern_sbuf_str(b, "\n");
    if (n_any == 0) {
        free(b->s);
        return api_bad(e, "invalid_value", "tool_choice", "no tool to call");
    }
    return 0;
}

int toolcall_grammar(const toolfmt *f, json_object *tools, const char *only, int parallel, size_t lead_skip,
                     const char *alt_ebnf, char **ebnf, api_error *e)
{
    tern_sbuf b = {0};
    char lead[128];
    *ebnf = NULL;
    snprintf(lead, sizeof lead, "%s%s", f->begin, f->call_open);
    if (lead_skip > strlen(lead))
        lead_skip = strlen(lead);
    tern_sbuf_str(&b, alt_ebnf ? "root ::= tc_calls | rf_root\n" : "root ::= tc_calls\n");
    char ws[64];
    snprintf(ws, sizeof ws, "tc_ws ::= [\\t\\n\\r ]{0,%d}\ntc_calls ::= ", TOOLCALL_MAX_WS);
    tern_sbuf_str(&b, ws);
    put_lit(&b, lead + lead_skip);
    tern_sbuf_str(&b, " tc_any ");
    put_lit(&b, f->call_close);
    if (parallel) {
        tern_sbuf_str(&b, " (");
        put_lit(&b, f->sep);
        tern_sbuf_str(&b, " ");
        put_lit(&b, f->call_open);
        tern_sbuf_str(&b, " tc_any ");
        put_lit(&b, f->call_close);
        tern_sbuf_str(&b, ")*");
    }
    tern_sbuf_str(&b, " ");
    put_lit(&b, f->end);
    tern_sbuf_str(&b, "\ntc_any ::= ");
    size_t n = json_object_array_length(tools);
    if (put_alts(&b, tools, only, "tc%zu_call", e))
        return -1;
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tools, i);
        if (only && strcmp(api_tool_name(t), only) != 0)
            continue;
        if (put_tool(&b, f, t, i, e)) {
            free(b.s);
            return -1;
        }
    }
    if (alt_ebnf)
        structured_ebnf_renamed(&b, alt_ebnf, "rf_");
    if (b.oom) {
        free(b.s);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    *ebnf = b.s;
    return 0;
}

/* ---- harmony (gpt-oss): a call is a message to functions.NAME ---- */

int toolcall_harmony_grammar(json_object *tools, const char *only, const char *alt_ebnf, char **ebnf, api_error *e)
{
    tern_sbuf b = {0};
    *ebnf = NULL;
    tern_sbuf_str(&b, alt_ebnf ? "root ::= hc_calls | hc_final\nhc_final ::= " HARMONY_FINAL_EBNF " rf_root\n"
                               : "root ::= hc_calls\n");
    tern_sbuf_str(&b, "hc_calls ::= ");
    size_t n = json_object_array_length(tools);
    if (put_alts(&b, tools, only, "hc%zu", e))
        return -1;
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tools, i);
        const char *name = api_tool_name(t);
        if (only && strcmp(name, only) != 0)
            continue;
        if (put_schema(&b, t, i, e)) {
            free(b.s);
            return -1;
        }
        /* the recipient after the channel (as gpt-oss writes it) or before (as its template renders past calls);
         * names are [A-Za-z0-9_-] (api_parse.c), nothing to escape */
        char line[512];
        snprintf(line, sizeof line,
                 "hc%zu ::= \"" HARMONY_G_START "assistant\" (\" to=functions.%s" HARMONY_G_CHANNEL
                 "commentary\" | \"" HARMONY_G_CHANNEL "commentary to=functions.%s\") (\" json\" | \" "
                 HARMONY_G_CONSTRAIN "json\")? \"" HARMONY_G_MESSAGE "\" tc%zu_root\n",
                 i, name, name, i);
        tern_sbuf_str(&b, line);
    }
    if (alt_ebnf)
        structured_ebnf_renamed(&b, alt_ebnf, "rf_");
    if (b.oom) {
        free(b.s);
        return api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    *ebnf = b.s;
    return 0;
}

/* The request's constraint: the tools' grammar ebnf (taken: freed here),
 * cached under "tools|" + ebnf, with lz's lazy triggers when given. */
static int tools_set(srv_model *mm, api_request *q, char *ebnf, constraint_lazy *lz, api_error *e)
{
    tern_sbuf key = {0};
    tern_sbuf_str(&key, "tools|");
    tern_sbuf_str(&key, ebnf);
    int rc = key.oom ? api_error_set(e, 500, "server_error", NULL, NULL, "out of memory")
                     : structured_set_ebnf(mm, q, key.s, key.n, ebnf, lz, "tools", e);
    free(ebnf);
    free(key.s);
    return rc;
}

/* auto: the calls are parsed, not enforced (no grammar: the analysis and
 * the answer run free); required / named: after the analysis the grammar
 * is one call; auto + response_format: a call or the final answer to the
 * schema. */
static int harmony_prepare(srv_model *mm, api_request *q, api_error *e)
{
    int forced = q->tool_choice == API_TOOL_REQUIRED || q->tool_choice == API_TOOL_NAMED;
    if (q->structured && !structured_from_response_format(q->structured)) {
        if (forced)
            return api_bad(e, "unsupported_value", "tool_choice",
                           "tool_choice \"%s\" cannot be combined with guided_* / structured_outputs (their grammar "
                           "is the whole answer); use tool_choice \"auto\" or drop the grammar",
                           q->tool_choice == API_TOOL_REQUIRED ? "required" : "function");
        return 0;
    }
    if (!forced && !q->structured)
        return 0;
    char *alt = NULL, *alt_key = NULL, *ebnf = NULL;
    if (!forced && structured_spec_ebnf(q, &alt, &alt_key, e))
        return -1;
    int rc = toolcall_harmony_grammar(q->tools, q->tool_choice == API_TOOL_NAMED ? q->tool_name : NULL, alt, &ebnf, e);
    free(alt);
    free(alt_key);
    if (rc)
        return -1;
    return tools_set(mm, q, ebnf, NULL, e);
}

/* ---- server state: the format's triggers over the vocabulary ---- */

static toolcall_server *server_state(srv_model *mm, api_error *e)
{
    pthread_mutex_lock(&tc_mu);
    toolcall_server *ts = mm->toolcall;
    if (ts)
        goto out_unlock;
    const grammar_vocab *v = structured_vocab(mm, e);
    if (!v)
        goto out_unlock;
    const toolfmt *f = mm->tools.fmt;
    ts = calloc(1, sizeof *ts);
    if (!ts)
        goto out_oom;
    const char *texts[TOOLFMT_MAX_TRIGGERS];
    int32_t ids[TOOLFMT_MAX_TRIGGERS], lead_id = -1;
    size_t n_texts = 0, n_ids = 0;
    char lead[128];
    snprintf(lead, sizeof lead, "%s%s", f->begin, f->call_open);
    for (int i = 0; i < TOOLFMT_MAX_TRIGGERS && f->triggers[i]; i++) {
        int32_t id = toolfmt_trigger_token(mm->tok, f->triggers[i]);
        if (id < 0) {
            texts[n_texts++] = f->triggers[i];
            continue;
        }
        ids[n_ids++] = id;
        if (!strncmp(lead, f->triggers[i], strlen(f->triggers[i]))) {
            ts->lead_skip = strlen(f->triggers[i]);
            lead_id = id;
        }
    }
    /* after a special lead, a further call would need that token again */
    char more[128];
    snprintf(more, sizeof more, "%s%s", f->sep, f->call_open);
    ts->can_parallel = !ts->lead_skip || !strstr(more, f->triggers[0]);
    tern_err te = {0};
    /* text triggers match the grammar's first text only when no token writes it */
    ts->lazy_trig = constraint_triggers_new(v, texts, ts->lead_skip ? 0 : n_texts, ids, n_ids, f->trigger_at_start, &te);
    if (ts->lazy_trig && lead_id >= 0)
        ts->lead_trig = constraint_triggers_new(v, NULL, 0, &lead_id, 1, 0, &te);
    if (!ts->lazy_trig || (lead_id >= 0 && !ts->lead_trig)) {
        constraint_triggers_free(ts->lazy_trig);
        free(ts);
        ts = NULL;
        api_error_set(e, 500, "server_error", NULL, NULL, "tool calls: %s", te.msg);
        goto out_unlock;
    }
    TERN_DEBUG("toolcall: format %s, %zu text and %zu token triggers, lead skip %zu", f->name, n_texts, n_ids,
               ts->lead_skip);
    mm->toolcall = ts;
    goto out_unlock;
out_oom:
    api_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
out_unlock:
    pthread_mutex_unlock(&tc_mu);
    return ts;
}

void toolcall_server_free(srv_model *mm)
{
    toolcall_server *ts = mm->toolcall;
    if (!ts)
        return;
    constraint_triggers_free(ts->lazy_trig);
    constraint_triggers_free(ts->lead_trig);
    free(ts);
    mm->toolcall = NULL;
}

/* ---- per request ---- */

int toolcall_prepare(srv_model *mm, api_request *q, api_error *e)
{
    if (q->kind != API_CHAT || !q->tools)
        return 0;
    const toolfmt *f = mm->tools.fmt;
    if (!mm->tools.renders_tools)
        return api_bad(e, "tools_not_supported", "tools",
                       "this model's chat template does not render tools (%s); send no tools or tool_choice "
                       "\"none\", or serve a model whose template does",
                       mm->tools.why ? mm->tools.why : "no template");
    if (q->structured_spec.kind == API_SPEC_STRUCTURAL)
        return api_bad(e, "unsupported_value", q->structured_spec.param,
                       "a structural tag cannot be combined with tools; describe the calls as tags, or send "
                       "tool_choice \"none\"");
    if (mm->has_harmony)
        return harmony_prepare(mm, q, e);
    int forced = q->tool_choice == API_TOOL_REQUIRED || q->tool_choice == API_TOOL_NAMED;
    if (f->kind == TOOLFMT_NONE) {
        if (forced)
            return api_bad(e, "unsupported_value", "tool_choice",
                           "tool_choice \"%s\" needs a tool-call format; this server runs with none "
                           "(see tern serve --tool-call-format)",
                           q->tool_choice == API_TOOL_REQUIRED ? "required" : "function");
        return 0;
    }
    toolcall_server *ts = server_state(mm, e);
    if (!ts)
        return -1;
    char *alt = NULL, *alt_key = NULL;
    if (q->structured && !structured_from_response_format(q->structured)) {
        /* guided_* / structured_outputs: the caller's grammar is the whole output */
        if (forced)
            return api_bad(e, "unsupported_value", "tool_choice",
                           "tool_choice \"%s\" cannot be combined with guided_* / structured_outputs (their grammar "
                           "is the whole answer); use tool_choice \"auto\" or drop the grammar",
                           q->tool_choice == API_TOOL_REQUIRED ? "required" : "function");
        return 0;
    }
    if (!forced && q->structured) {
        if (ts->lead_skip)
            return api_bad(e, "unsupported_value", "response_format",
                           "response_format together with tools is not supported for the %s tool-call format "
                           "(its calls start with a special token); use tool_choice \"none\" or \"required\"",
                           f->name);
        if (structured_spec_ebnf(q, &alt, &alt_key, e))
            return -1;
    }
    int parallel = q->parallel_tool_calls && f->parallel && ts->can_parallel;
    char *ebnf = NULL;
    int rc = toolcall_grammar(f, q->tools, q->tool_choice == API_TOOL_NAMED ? q->tool_name : NULL, parallel,
                              ts->lead_skip, alt, &ebnf, e);
    free(alt);
    free(alt_key);
    if (rc)
        return -1;
    constraint_lazy lz = {0}, *lzp = NULL;
    if (forced && ts->lead_skip) {
        lz.triggers = ts->lead_trig;
        lz.forced = 1;
        lzp = &lz;
    } else if (!forced && !q->structured) {
        lz.triggers = ts->lazy_trig;
        lzp = &lz;
    }
    /* forced calls leave no answer for a response_format: the calls' grammar replaces it */
    return tools_set(mm, q, ebnf, lzp, e);
}
