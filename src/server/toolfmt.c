/* Tool-call formats (see toolfmt.h): the built-in table and detection by
 * rendering a probe conversation through the chat template. The literal
 * strings are the ones the published templates render (Qwen3 / Hermes 3
 * tool_use, Llama 3.1, Mistral v0.3); the generic JSON form is tern's own
 * for templates that render tools but write calls in no known way. */
#include <stdlib.h>
#include <string.h>

#include "server/toolfmt.h"

static const toolfmt formats[TOOLFMT_N] = {
    [TOOLFMT_NONE] = {.kind = TOOLFMT_NONE, .name = "none", .begin = "", .call_open = "", .call_close = "",
                      .sep = "", .end = "", .name_key = "name", .args_key = "arguments"},
    [TOOLFMT_HERMES] = {.kind = TOOLFMT_HERMES,
                        .name = "hermes",
                        .begin = "",
                        .call_open = "<tool_call>\n",
                        .call_close = "\n</tool_call>",
                        .sep = "\n",
                        .end = "",
                        .name_key = "name",
                        .args_key = "arguments",
                        .parallel = 1,
                        .triggers = {"<tool_call>"}},
    /* Llama 3.1's template raises on more than one call per message, so
     * one call; sep is what vLLM's llama3_json parser splits on. */
    [TOOLFMT_LLAMA3] = {.kind = TOOLFMT_LLAMA3,
                        .name = "llama3_json",
                        .begin = "",
                        .call_open = "",
                        .call_close = "",
                        .sep = "; ",
                        .end = "",
                        .name_key = "name",
                        .args_key = "parameters",
                        .parallel = 0,
                        .triggers = {"<|python_tag|>", "{\"name\""},
                        .trigger_at_start = 1},
    [TOOLFMT_MISTRAL] = {.kind = TOOLFMT_MISTRAL,
                         .name = "mistral",
                         .begin = "[TOOL_CALLS] [",
                         .call_open = "",
                         .call_close = "",
                         .sep = ", ",
                         .end = "]",
                         .name_key = "name",
                         .args_key = "arguments",
                         .parallel = 1,
                         .triggers = {"[TOOL_CALLS]"}},
    [TOOLFMT_JSON] = {.kind = TOOLFMT_JSON,
                      .name = "json",
                      .begin = "{\"tool_calls\": [",
                      .call_open = "",
                      .call_close = "",
                      .sep = ", ",
                      .end = "]}",
                      .name_key = "name",
                      .args_key = "arguments",
                      .parallel = 1,
                      .triggers = {"{\"tool_calls\""},
                      .trigger_at_start = 1},
};

const toolfmt *toolfmt_get(toolfmt_kind kind)
{
    return (unsigned)kind < TOOLFMT_N ? &formats[kind] : &formats[TOOLFMT_NONE];
}

const toolfmt *toolfmt_by_name(const char *name)
{
    static const struct {
        const char *alias;
        toolfmt_kind kind;
    } aliases[] = {{"qwen", TOOLFMT_HERMES}, {"llama3", TOOLFMT_LLAMA3}};
    if (!name)
        return NULL;
    for (int k = 0; k < TOOLFMT_N; k++)
        if (!strcmp(name, formats[k].name))
            return &formats[k];
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].alias))
            return &formats[aliases[i].kind];
    return NULL;
}

const char *toolfmt_names(void) { return "hermes (qwen), llama3_json (llama3), mistral, json, none"; }

int32_t toolfmt_trigger_token(const tern_tokenizer *tok, const char *trigger)
{
    if (!tok || !trigger)
        return -1;
    int32_t id = tokenizer_token_id(tok, trigger);
    return id >= 0 && tokenizer_is_special(tok, id) ? id : -1;
}

/* ---- detection ---- */

/* Names no real conversation uses, so finding them in the output means the
 * template wrote the probe. The call id has 9 alphanumerics: Mistral's
 * template insists. */
#define PROBE_FN "tern_probe_fn"
#define PROBE_ARG "tern_probe_arg"
#define PROBE_USER "tern probe question"

static json_object *probe_tools(void)
{
    json_object *arg = json_object_new_object(), *props = json_object_new_object(), *params = json_object_new_object();
    json_object *fn = json_object_new_object(), *tool = json_object_new_object(), *tools = json_object_new_array();
    json_object *req = json_object_new_array();
    json_object_object_add(arg, "type", json_object_new_string("string"));
    json_object_object_add(arg, "description", json_object_new_string("probe argument"));
    json_object_object_add(props, PROBE_ARG, arg);
    json_object_object_add(params, "type", json_object_new_string("object"));
    json_object_object_add(params, "properties", props);
    json_object_array_add(req, json_object_new_string(PROBE_ARG));
    json_object_object_add(params, "required", req);
    json_object_object_add(fn, "name", json_object_new_string(PROBE_FN));
    json_object_object_add(fn, "description", json_object_new_string("probe function"));
    json_object_object_add(fn, "parameters", params);
    json_object_object_add(tool, "type", json_object_new_string("function"));
    json_object_object_add(tool, "function", fn);
    json_object_array_add(tools, tool);
    return tools;
}

static json_object *probe_message(const char *role, const char *content)
{
    json_object *m = json_object_new_object();
    json_object_object_add(m, "role", json_object_new_string(role));
    json_object_object_add(m, "content", json_object_new_string(content));
    return m;
}

static json_object *probe_call_message(void)
{
    json_object *m = probe_message("assistant", "");
    json_object *args = json_object_new_object(), *fn = json_object_new_object(), *call = json_object_new_object();
    json_object *calls = json_object_new_array();
    json_object_object_add(args, PROBE_ARG, json_object_new_string("v"));
    json_object_object_add(fn, "name", json_object_new_string(PROBE_FN));
    json_object_object_add(fn, "arguments", args);
    json_object_object_add(call, "id", json_object_new_string("abcdefghi"));
    json_object_object_add(call, "type", json_object_new_string("function"));
    json_object_object_add(call, "function", fn);
    json_object_array_add(calls, call);
    json_object_object_add(m, "tool_calls", calls);
    return m;
}

/* Renders messages (taken) with or without tools; NULL when the template
 * raises or on OOM. */
static char *probe_render(const tern_chat_template *ct, json_object *messages, int with_tools)
{
    json_object *rq = json_object_new_object();
    if (!rq) {
        json_object_put(messages);
        return NULL;
    }
    json_object_object_add(rq, "messages", messages);
    if (with_tools)
        json_object_object_add(rq, "tools", probe_tools());
    json_object_object_add(rq, "add_generation_prompt", json_object_new_boolean(0));
    size_t len;
    tern_err te;
    char *text = tern_chat_template_apply(ct, rq, NULL, &len, &te);
    json_object_put(rq);
    return text;
}

static const toolfmt *from_vocab(const tern_tokenizer *tok)
{
    if (tok && tokenizer_token_id(tok, "<tool_call>") >= 0)
        return &formats[TOOLFMT_HERMES];
    if (tok && tokenizer_token_id(tok, "[TOOL_CALLS]") >= 0)
        return &formats[TOOLFMT_MISTRAL];
    if (tok && tokenizer_token_id(tok, "<|python_tag|>") >= 0)
        return &formats[TOOLFMT_LLAMA3];
    return &formats[TOOLFMT_JSON];
}

int toolfmt_detect(const tern_chat_template *ct, const tern_tokenizer *tok, toolfmt_probe *out, tern_err *err)
{
    memset(out, 0, sizeof *out);
    out->fmt = &formats[TOOLFMT_NONE];
    out->why = "no chat template";
    if (!ct || !ct->tpl)
        return 0;
    json_object *m1 = json_object_new_array(), *m2 = json_object_new_array(), *m3 = json_object_new_array();
    if (!m1 || !m2 || !m3) {
        json_object_put(m1);
        json_object_put(m2);
        json_object_put(m3);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    json_object_array_add(m1, probe_message("user", PROBE_USER));
    json_object_array_add(m2, probe_message("user", PROBE_USER));
    json_object_array_add(m3, probe_message("user", PROBE_USER));
    json_object_array_add(m3, probe_call_message());
    char *plain = probe_render(ct, m1, 0);
    char *with_tools = probe_render(ct, m2, 1);
    char *with_call = probe_render(ct, m3, 1);
    out->renders_tools = with_tools && (!plain || strcmp(plain, with_tools) != 0) && strstr(with_tools, PROBE_FN);
    /* the call's text: what the assistant turn added after the shared prefix */
    const char *call = NULL;
    if (with_call && with_tools) {
        size_t i = 0;
        while (with_call[i] && with_call[i] == with_tools[i])
            i++;
        call = strstr(with_call + i, PROBE_FN) ? with_call + i : NULL;
    }
    out->renders_calls = call != NULL;
    if (!out->renders_tools && !call) {
        out->why = with_tools ? "the template ignores tools" : "the template fails on tools";
    } else if (call && strstr(call, "<tool_call>")) {
        out->fmt = &formats[TOOLFMT_HERMES];
        out->why = "the template writes <tool_call> blocks";
    } else if (call && strstr(call, "[TOOL_CALLS]")) {
        out->fmt = &formats[TOOLFMT_MISTRAL];
        out->why = "the template writes [TOOL_CALLS] lists";
    } else if (call && strstr(call, "\"parameters\"")) {
        out->fmt = &formats[TOOLFMT_LLAMA3];
        out->why = "the template writes {\"name\", \"parameters\"} objects";
    } else {
        out->fmt = from_vocab(tok);
        out->why = out->fmt->kind == TOOLFMT_JSON ? "tools are rendered, calls in no known form: generic JSON"
                                                  : "tools are rendered; the vocabulary names the format";
    }
    free(plain);
    free(with_tools);
    free(with_call);
    return 0;
}
