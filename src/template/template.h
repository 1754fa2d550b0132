/* Chat templates: a Jinja interpreter that renders Hugging Face chat
 * templates byte-for-byte as transformers does (jinja2 sandbox with
 * trim_blocks, lstrip_blocks, loopcontrols, HF's tojson, raise_exception and
 * strftime_now). Parse once, render many: a parsed template is read-only and
 * may be rendered from several threads at once. */
#ifndef TERN_TEMPLATE_TEMPLATE_H
#define TERN_TEMPLATE_TEMPLATE_H

#include <json-c/json.h>
#include <stddef.h>

#include "base/err.h"

typedef struct tern_template tern_template;

/* Bounds on one render, so a hostile or buggy template ends with an error
 * (TERN_EFULL) instead of eating the machine. Zero fields take the defaults
 * in brackets, sized far above what real chat templates need. */
typedef struct tern_template_limits {
    size_t max_output; /* bytes of rendered text [16 MiB] */
    size_t max_memory; /* bytes of working memory [256 MiB] */
    long max_steps;    /* loop iterations + calls + filter uses [10,000,000] */
    int max_depth;     /* nested macro calls [100] */
} tern_template_limits;

/* Parses template source (len bytes, UTF-8). Syntax errors return NULL with
 * err->msg "line L, column C: ..." and err->pos the byte offset. */
tern_template *tern_template_parse(const char *src, size_t len, tern_err *err);
void tern_template_free(tern_template *t); /* NULL is a no-op */

/* Renders with the keys of ctx (a JSON object, borrowed) as variables. lim
 * may be NULL (defaults). Returns a malloc'd NUL-terminated string (caller
 * frees) and its length in *len_out, or NULL with err set: raise_exception()
 * gives TERN_EINVAL with the template's message verbatim; other runtime
 * errors give "line L, column C: ..." messages. */
char *tern_template_render(const tern_template *t, json_object *ctx, const tern_template_limits *lim,
                           size_t *len_out, tern_err *err);

/* Line and column (1-based, columns in code points) of a byte offset
 * reported in err->pos. */
void tern_template_line_col(const tern_template *t, long pos, long *line, long *col);

/* ---- chat layer -------------------------------------------------------- */

/* A model's chat template with the special tokens transformers passes to it. */
typedef struct tern_chat_template {
    tern_template *tpl;      /* "default" (or the only) template */
    tern_template *tool_use; /* the "tool_use" named template, or NULL */
    json_object *special;    /* {"bos_token": "...", ...}: only tokens that are set */
} tern_chat_template;

/* Loads DIR/tokenizer_config.json (and DIR/chat_template.jinja, which wins
 * when present, as in transformers). chat_template may be a string or a list
 * of {name, template}. DIR may be a model folder or a tokenizer-only one.
 * Fills *out (free with tern_chat_template_free). TERN_ENOTFOUND if there is
 * no template. */
int tern_chat_template_load(const char *dir, tern_chat_template *out, tern_err *err);
/* Same, from strings: the template source and an optional tokenizer_config
 * object (borrowed) for the special tokens. */
int tern_chat_template_from_source(const char *src, size_t len, json_object *config,
                                   tern_chat_template *out, tern_err *err);
void tern_chat_template_free(tern_chat_template *ct);

/* A special token string ("bos_token", "eos_token", ...) from the config, or
 * NULL if unset. Borrowed, valid until tern_chat_template_free. */
const char *tern_chat_template_token(const tern_chat_template *ct, const char *name);

/* Renders a request as transformers' apply_chat_template(messages,
 * tools=..., add_generation_prompt=..., **kwargs) does: the variables are
 * the special tokens, then every key of request (messages, tools,
 * add_generation_prompt, enable_thinking, anything else), with tools and
 * documents defaulting to None and add_generation_prompt to false. The
 * tool_use template is chosen when tools are given and one exists.
 * request is borrowed. Returns as tern_template_render. */
char *tern_chat_template_apply(const tern_chat_template *ct, json_object *request,
                               const tern_template_limits *lim, size_t *len_out, tern_err *err);

#endif
