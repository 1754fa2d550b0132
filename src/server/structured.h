/* Structured output for the server: the request's typed spec
 * (q->structured_spec, read and checked by api_parse through
 * api_structured.c) compiled through the server's compile cache, and a
 * grammar constraint per engine row (with the think-block wrapper for
 * thinking models). See docs/structured-output.md. */
#ifndef TERN_SERVER_STRUCTURED_H
#define TERN_SERVER_STRUCTURED_H

#include <stddef.h>
#include <stdint.h>

#include "base/strbuf.h"
#include "engine/constraint.h"
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "server/api.h"

struct srv_model;
typedef struct srv_structured srv_structured;

/* Bytes of a Warning header value (structured_prepare's fallback). */
#define STRUCTURED_WARNING_MAX 256

/* Compiles q->structured_spec (api_parse checked its fields and picked it
 * by precedence). On success q->structured holds the result (NULL when the
 * request is unconstrained). A spec that cannot be compiled is a 400
 * naming its field;
 * with the server's prompt fallback on, a spec that cannot be compiled is
 * instead written into the prompt (system message / prompt prefix) and
 * warning (STRUCTURED_WARNING_MAX bytes) receives a Warning header value.
 * Returns 0, or -1 with e set. */
int structured_prepare(struct srv_model *mm, api_request *q, char *warning, api_error *e);

/* structured_prepare, then toolcall_prepare (the request's tool grammar),
 * run on the server's compile pool (compile_pool.c) while this thread
 * waits polling client_fd: a client that leaves cancels the compile (-1,
 * e->status 499: nothing to reply), and so does the server stopping (503).
 * t_start: when the request arrived (srv_compile_run). A request with
 * nothing to compile runs here. Returns 0, or -1 with e set. */
int structured_prepare_request(struct srv_model *mm, api_request *q, int client_fd, double t_start, char *warning,
                               api_error *e);

/* Sets p->constraint / p->constraint_ctx for one engine row of q (nothing
 * when q is unconstrained). prompt[0..n) is the row's prompt and boundary
 * where its generation primer starts (0 = unknown): they decide whether
 * the row starts inside a think block. The caller owns the constraint
 * until engine_submit succeeds. Returns 0, or -1 with e set (500). */
int structured_attach(struct srv_model *mm, const api_request *q, const int32_t *prompt, size_t n_prompt,
                      size_t boundary, engine_params *p, api_error *e);

/* q->structured_spec as its normalized cache key
 * ("kind|ws=..|cap=..|strict=..|" + canonical text), without compiling:
 * *key is malloc'd, or NULL when q is unconstrained. For tests and the
 * fuzz entry point. Returns 0, or -1 with e set (500, out of memory). */
int structured_spec_key(const api_request *q, char **key, api_error *e);

/* The model's grammar vocabulary (made on first use, freed by
 * structured_server_free), for constraints without a grammar (the
 * reasoning budget). NULL with e set (500) when it cannot be made. */
const grammar_vocab *structured_vocab(struct srv_model *mm, api_error *e);
/* A harmony model's analysis block (harmony.h; owned by the model's
 * structured state), NULL when the model is no harmony model or (with e
 * set) the state cannot be made. */
const constraint_think *structured_harmony_think(struct srv_model *mm, api_error *e);

/* The EBNF of q->structured_spec and its cache key, without compiling
 * (both malloc'd; both NULL when q is unconstrained). For grammars that
 * include the request's spec (tool calls or the schema'd answer,
 * toolcall.c). Returns 0, or -1 with e set (400 naming the field when the
 * spec has no EBNF, 500 out of memory). */
int structured_spec_ebnf(const api_request *q, char **ebnf, char **key, api_error *e);

/* Compiles ebnf (key[0..key_len): its normalized cache key) through the
 * server's cache and makes it q's grammar, replacing any other. lazy NULL:
 * the grammar starts at the first token (after a think block); else it
 * starts at a trigger (constraint.h; lazy is copied, its triggers must
 * outlive every row). A grammar that does not compile is a 400 naming
 * param. Returns 0, or -1 with e set. */
int structured_set_ebnf(struct srv_model *mm, api_request *q, const char *key, size_t key_len, const char *ebnf,
                        const constraint_lazy *lazy, const char *param, api_error *e);

/* Gives st (q->structured after structured_set_ebnf with lazy) the
 * triggers its lazy grammar was set with: shared by the request's rows,
 * freed with the last of them. 0, or TERN_ENOMEM (t not taken). */
int structured_own_triggers(srv_structured *st, constraint_triggers *t);

/* structural.c: a structural tag (q->structured_spec of kind
 * API_SPEC_STRUCTURAL) -> q->structured, a lazy grammar that starts over
 * after each tag. A malformed tag is a 400 naming the field. 0 or -1. */
int structural_prepare(struct srv_model *mm, api_request *q, api_error *e);

/* EBNF text builders (structural.c; tool calls use them too): s[0..len) as
 * an EBNF string literal; ebnf with every rule name prefixed (names are
 * outside strings, classes and comments; see grammar/ebnf.c), so several
 * front-end grammars live in one text. */
void structured_ebnf_literal(tern_sbuf *b, const char *s, size_t len);
void structured_ebnf_renamed(tern_sbuf *b, const char *ebnf, const char *prefix);

/* 1 if st (may be NULL) was compiled from response_format (the answer's
 * format), 0 for guided_* / structured_outputs (a grammar of the whole
 * output) or none. */
int structured_from_response_format(const srv_structured *st);

/* JSON text of o with object keys sorted, appended to b: equal values
 * give equal text (cache keys). */
void structured_canonical(tern_sbuf *b, json_object *o);

/* The API error code of a grammar front-end / compile error code. */
const char *structured_error_code(int code);

/* Frees a request's spec (NULL is a no-op). */
void structured_free(srv_structured *st);
/* Frees the model's vocabulary and compile cache (when it unloads). */
void structured_server_free(struct srv_model *mm);

#endif
