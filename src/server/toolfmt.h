/* The tool-call format of a chat template, as data: how a model writes
 * the calls it makes (opening and closing text, the keys of the name and
 * the arguments, separators between several calls) and what text starts
 * them. Both sides of tool calling read it: the grammar that enforces
 * tool_choice (toolcall.c) and the parser that turns output into
 * tool_calls. Detected once per server from the template, or named with
 * `tern serve --tool-call-format NAME`. */
#ifndef TERN_SERVER_TOOLFMT_H
#define TERN_SERVER_TOOLFMT_H

#include "base/err.h"
#include "template/template.h"
#include "tokenizer/tokenizer.h"

typedef enum toolfmt_kind {
    TOOLFMT_NONE = 0, /* the template writes no tool calls */
    TOOLFMT_HERMES,   /* Hermes 2/3, Qwen 2.5/3: <tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>, repeated */
    TOOLFMT_LLAMA3,   /* Llama 3.1-3.3 JSON: {"name": .., "parameters": {..}}, possibly after <|python_tag|> */
    TOOLFMT_MISTRAL,  /* Mistral: [TOOL_CALLS] [{"name": .., "arguments": {..}}, ...] */
    TOOLFMT_JSON,     /* generic fallback: {"tool_calls": [{"name": .., "arguments": {..}}, ...]} */
    TOOLFMT_N
} toolfmt_kind;

#define TOOLFMT_MAX_TRIGGERS 2

/* The text of k calls is
 *     begin  call_open C1 call_close  sep  call_open C2 call_close ... end
 * where each Ci is a JSON object {"<name_key>": "<function>",
 * "<args_key>": {..arguments..}} (name first, as every template writes
 * it). Whitespace inside Ci is free JSON whitespace; the literal strings
 * are written as the template renders them. All strings are static. */
typedef struct toolfmt {
    toolfmt_kind kind;
    const char *name;      /* "hermes", "llama3_json", "mistral", "json", "none" */
    const char *begin;     /* before the first call ("" = nothing) */
    const char *call_open; /* before each call */
    const char *call_close;
    const char *sep;       /* between two calls */
    const char *end;       /* after the last call */
    const char *name_key;  /* "name" */
    const char *args_key;  /* "arguments" (llama3: "parameters") */
    int parallel;          /* 1: several calls may follow each other in one answer */
    /* What starts calls in free text (tool_choice auto): the calls begin
     * where one of these appears (NULL-terminated). A trigger that is a
     * single special token of the vocabulary is seen by id and is not part
     * of the grammar's text (Mistral's [TOOL_CALLS], Llama's
     * <|python_tag|>); otherwise the trigger is the first text the calls'
     * grammar matches (Hermes' <tool_call>). */
    const char *triggers[TOOLFMT_MAX_TRIGGERS + 1];
    /* 1: a trigger counts only at the start of the answer (after
     * whitespace): the formats whose calls are plain JSON, which an answer
     * may also contain elsewhere. */
    int trigger_at_start;
} toolfmt;

/* The built-in format of a kind (never NULL for kind < TOOLFMT_N). */
const toolfmt *toolfmt_get(toolfmt_kind kind);

/* A format by name, as --tool-call-format takes it: hermes (alias qwen),
 * llama3_json (alias llama3), mistral, json, none. NULL if unknown. */
const toolfmt *toolfmt_by_name(const char *name);

/* The names toolfmt_by_name accepts, for usage and error messages. */
const char *toolfmt_names(void);

/* What detection found about a chat template. */
typedef struct toolfmt_probe {
    const toolfmt *fmt;    /* the format (toolfmt_get(TOOLFMT_NONE) when none) */
    int renders_tools;     /* 1: tools given to the template change the prompt */
    int renders_calls;     /* 1: an assistant message's tool_calls appear in the prompt */
    const char *why;       /* static: what decided (for the log) */
} toolfmt_probe;

/* Detects the tool-call format of ct by rendering a probe conversation
 * (a user turn with one probe tool, then an assistant turn calling it):
 * the text the template writes for the call names the format. When the
 * template renders tools but no recognisable call, the vocabulary of tok
 * (may be NULL) decides (a <tool_call>, [TOOL_CALLS] or <|python_tag|>
 * token), else the generic JSON format. A template that raises on the
 * probe counts as not rendering. ct borrowed. Returns 0 (out filled), or
 * TERN_ENOMEM. */
int toolfmt_detect(const tern_chat_template *ct, const tern_tokenizer *tok, toolfmt_probe *out, tern_err *err);

/* The id of a trigger when it is one special token of tok, else -1. */
int32_t toolfmt_trigger_token(const tern_tokenizer *tok, const char *trigger);

#endif
