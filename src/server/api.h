/* The OpenAI request/response layer of the server, free of I/O: parsing and
 * validating a request body into engine-ready parameters (api_parse.c), and
 * building response bodies, SSE chunks and error objects (api_format.c).
 * Everything here is pure so it can be unit-tested and fuzzed directly. */
#ifndef TERN_SERVER_API_H
#define TERN_SERVER_API_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "sample/sample.h"

/* Bounds of what a request may ask for (each with its reason). */
#define API_MAX_N 16          /* choices per request: each is an engine request */
#define API_MAX_STOP 16       /* OpenAI allows 4; we are lenient but bounded */
#define API_MAX_STOP_LEN 256  /* bytes per stop string (held back while matching) */
#define API_MAX_BIAS 1024     /* logit_bias entries (OpenAI: 300) */
#define API_MAX_TOP_LOGPROBS SAMPLE_MAX_LOGPROBS

typedef enum api_kind { API_CHAT = 0, API_COMPLETION } api_kind;

/* tool_choice: auto (the model decides; a call that starts is enforced),
 * none (tools hidden), required (at least one call), named (exactly that
 * function). */
typedef enum api_tool_choice { API_TOOL_AUTO = 0, API_TOOL_NONE, API_TOOL_REQUIRED, API_TOOL_NAMED } api_tool_choice;

/* A function name as OpenAI allows it: [A-Za-z0-9_-], 1 to 64 characters. */
#define API_MAX_TOOL_NAME 64

/* An error as OpenAI shapes it: {"error": {message, type, param, code}}. */
typedef struct api_error {
    int status;       /* HTTP status */
    const char *type; /* "invalid_request_error", "authentication_error", ... (static) */
    const char *code; /* NULL or a static code ("unsupported_parameter") */
    char param[96];   /* the offending field ("" = none) */
    char msg[TERN_ERR_MSG_MAX];
} api_error;

/* Fills e and returns -1. param may be NULL. */
int api_error_set(api_error *e, int status, const char *type, const char *code, const char *param,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Shortcut for a 400 invalid_request_error. */
int api_bad(api_error *e, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* What the server can honour, for validation. */
typedef struct api_limits {
    int32_t n_vocab;        /* token ids must be below this (logit_bias, token prompts) */
    const char *model_name; /* the one served model; "model" must match when given */
} api_limits;

/* One prompt of a batched /v1/completions request. */
typedef struct api_prompt {
    const char *text;           /* borrowed, or NULL when ids */
    size_t len;
    int32_t *ids;               /* owned, or NULL */
    size_t n_ids;
} api_prompt;

/* Whitespace run cap between JSON tokens when the request says nothing:
 * enough for any pretty-printing, and a weak model cannot spin on blanks. */
#define API_STRUCTURED_DEFAULT_MAX_WS 20

/* What a structured-output spec constrains to (the order is structured.c's
 * kind names). */
typedef enum api_spec_kind {
    API_SPEC_NONE = 0,
    API_SPEC_GRAMMAR,
    API_SPEC_SCHEMA,
    API_SPEC_JSON_OBJECT,
    API_SPEC_REGEX,
    API_SPEC_CHOICE,
    API_SPEC_STRUCTURAL, /* a structural tag (structural.c); json holds it */
} api_spec_kind;

/* The one structured-output spec a request asks for (api_structured.c),
 * picked by precedence from response_format, guided_* and
 * structured_outputs; kind API_SPEC_NONE when unconstrained. */
typedef struct api_structured_spec {
    api_spec_kind kind;
    char param[96];      /* the request field it came from (errors name it) */
    json_object *json;   /* SCHEMA / CHOICE / STRUCTURAL: borrowed from the request or owned below */
    json_object *owned;  /* a schema parsed from JSON text */
    const char *text;    /* GRAMMAR / REGEX: borrowed */
    size_t text_len;
    int any_ws, max_ws, strict;
} api_structured_spec;

typedef struct api_request {
    api_kind kind;
    json_object *root;          /* owned: the parsed body; borrowed pointers below point into it */
    const char *model;          /* NULL if absent */
    /* chat */
    json_object *messages;      /* owned: normalized [{role, content: string|null, ...}] */
    json_object *tools;         /* borrowed, NULL if absent, empty or tool_choice "none" */
    api_tool_choice tool_choice;
    const char *tool_name;      /* borrowed: the function API_TOOL_NAMED forces */
    int parallel_tool_calls;    /* default 1; 0 = at most one call */
    json_object *template_kwargs; /* borrowed chat_template_kwargs object, or NULL */
    int add_generation_prompt;  /* default 1 */
    /* completions */
    const char *prompt;         /* text prompt (borrowed), or NULL when prompt_ids */
    size_t prompt_len;
    int32_t *prompt_ids;        /* owned token-array prompt, or NULL */
    size_t n_prompt_ids;
    int echo;
    api_prompt *batch;          /* owned [n_batch] when prompt is a list of several prompts (prompt /
                                 * prompt_ids then NULL); each gives n choices */
    int n_batch;
    /* common */
    int max_tokens;             /* -1 = until the context is full */
    sample_params sample;       /* sample.bias points at bias */
    sample_bias *bias;          /* owned [n_bias] */
    int n_bias;
    int has_seed;
    const char **stop;          /* owned array of borrowed strings [n_stop] */
    int n_stop;
    int n;                      /* choices */
    int logprobs;               /* report logprobs */
    int top_logprobs;           /* alternatives per token (0..20) */
    int stream, include_usage;
    int ignore_eos, skip_special;
    /* vLLM's fields: EOS / stop_token_ids / stop strings held off until
     * min_tokens are generated; stop_token_ids end a choice like EOS; the
     * matched stop string kept at the end of the text. */
    int min_tokens;
    int32_t *stop_ids;          /* owned [n_stop_ids] */
    int n_stop_ids;
    int include_stop_str;
    char ignored[160];          /* unknown top-level fields ignored, ", "-joined ("" = none) */
    /* reasoning (reasoning.h) */
    int include_reasoning;      /* default 1: report the thought as reasoning_content */
    int enable_thinking;        /* -1 = the template's default; 0/1 from reasoning_effort */
    int reasoning_budget;       /* think tokens before the close is forced, -1 = none (before the server's cap) */
    const char *reasoning_effort; /* borrowed from root: as sent (the template gets it), NULL = none */
    api_structured_spec structured_spec; /* owned: the structured-output fields, checked */
    struct srv_structured *structured; /* owned (structured.c): the grammar, NULL = unconstrained */
} api_request;

/* Parses and validates a body of len bytes (need not be NUL-terminated).
 * On success r owns what it holds (api_request_free); on failure r is left
 * empty and err says why (always a 4xx). */
int api_parse(api_request *r, api_kind kind, const char *body, size_t len, const api_limits *lim,
              api_error *err);
void api_request_free(api_request *r);
/* Reads the structured-output fields of r->root (response_format,
 * guided_*, structured_outputs) into r->structured_spec, the winner by
 * precedence (grammar > json_schema > json_object > structured_outputs >
 * regex > choice); api_parse calls it last. A field of the wrong shape is
 * a 400 naming it, and leaves the spec empty. Returns 0, or -1 with e set. */
int api_structured_parse(api_request *r, api_error *e);
/* Frees what sp owns and empties it (NULL is a no-op). */
void api_structured_free(api_structured_spec *sp);
/* Whether the request turned thinking off (chat_template_kwargs.enable_thinking
 * false, or reasoning_effort "none"). */
int api_thinking_off(const api_request *r);
/* The function name of a validated tool (borrowed), or NULL. */
const char *api_tool_name(json_object *tool);

/* --- formatting (api_format.c); every returned string is malloc'd --- */

/* {"error": {...}} */
char *api_error_json(const api_error *e);

/* The bytes a token contributes and its text as valid UTF-8 (invalid bytes
 * become U+FFFD), for logprob entries. */
typedef struct api_token_text {
    const char *bytes; /* borrowed */
    size_t len;
} api_token_text;

/* Looks up token text for logprobs; implemented by the caller (the server
 * passes the tokenizer). */
typedef api_token_text (*api_token_fn)(void *ctx, int32_t id);

/* Chat logprob content entry: {token, logprob, bytes, top_logprobs}. */
json_object *api_chat_logprob(const sample_result *lp, int n_top, api_token_fn fn, void *ctx);
/* Appends one token to a completions logprobs object {tokens, token_logprobs,
 * top_logprobs, text_offset} (created when *lp_obj is NULL). */
void api_completion_logprob_add(json_object **lp_obj, const sample_result *lp, int n_top, size_t text_offset,
                                api_token_fn fn, void *ctx);

/* Length of the longest valid UTF-8 prefix of s (strict: no overlongs,
 * surrogates or code points past U+10FFFF). */
size_t api_utf8_valid_len(const char *s, size_t len);

/* A new json string from bytes that may hold invalid UTF-8 (replaced by U+FFFD). */
json_object *api_json_string(const char *s, size_t len);

/* usage {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details{cached_tokens}} */
json_object *api_usage(int n_prompt, int n_completion, int n_cached);

/* The envelope of a response or chunk: {id, object, created, model, [system_fingerprint], choices: []}.
 * Returns the object; *choices receives the (borrowed) choices array. */
json_object *api_envelope(const char *id, const char *object, long long created, const char *model,
                          json_object **choices);

/* Serializes o (taking it) as "data: <json>\n\n" appended to a growing buffer. */
typedef struct api_buf {
    char *data;
    size_t len, cap;
} api_buf;
int api_buf_append(api_buf *b, const char *s, size_t n);
int api_buf_sse(api_buf *b, json_object *o); /* takes o */
void api_buf_free(api_buf *b);

/* Plain JSON text of o (taking o), malloc'd. */
char *api_json_take(json_object *o);

#endif
