/* Tool calls enforced by the grammar engine: a chat request's tools and
 * tool_choice become one grammar over the template's tool-call format
 * (toolfmt.h) - the format's opening, a call object whose arguments are
 * constrained by the tool's `parameters` JSON Schema, the closing - used
 * forced (tool_choice "required" or a named function) or lazily from the
 * format's trigger on (tool_choice "auto"). See docs/structured-output.md. */
#ifndef TERN_SERVER_TOOLCALL_H
#define TERN_SERVER_TOOLCALL_H

#include <json-c/json.h>

#include "server/api.h"
#include "server/toolfmt.h"

struct srv_model;

/* For a chat request with tools (q->tools, tool_choice not "none"):
 * checks the template renders tools (else 400 naming `tools`), compiles
 * every tool's parameters schema (a bad one is a 400 naming
 * tools[i].function.parameters) and sets the request's grammar
 * (structured_set_ebnf): required / named: the calls, forced after any
 * think block; auto: free text, the calls from the trigger on; auto with a
 * response_format: either the calls or the schema'd answer. parallel_tool_calls
 * false (or a format that writes one call) allows one call. Call after
 * structured_prepare. Returns 0, or -1 with e set. */
int toolcall_prepare(struct srv_model *mm, api_request *q, api_error *e);

/* The grammar of the calls, pure (tests use it directly): EBNF whose root
 * matches the calls' text in format f - with its first lead_skip bytes
 * left out (the special token that writes them is not grammar text) - for
 * the tools (a validated JSON array, borrowed), only the one named only
 * (NULL = all). parallel: several calls may follow. alt_ebnf (NULL = none):
 * a grammar with rule root accepted instead of the calls (the schema'd
 * answer of tool_choice auto + response_format). *ebnf malloc'd. A tool
 * whose parameters do not compile is a 400 naming
 * tools[i].function.parameters. Returns 0, or -1 with e set. */
int toolcall_grammar(const toolfmt *f, json_object *tools, const char *only, int parallel, size_t lead_skip,
                     const char *alt_ebnf, char **ebnf, api_error *e);

/* The same for a harmony model (harmony.h): root matches, after the
 * analysis' <|end|>, one message to functions.NAME whose body is the
 * arguments (the recipient after or before the channel, an optional
 * content type), for the tools (only the one named only, NULL = all);
 * alt_ebnf (NULL = none): the final answer to that grammar instead. */
int toolcall_harmony_grammar(json_object *tools, const char *only, const char *alt_ebnf, char **ebnf, api_error *e);

/* Frees the server's trigger tables (server_free, after engine_free). */
void toolcall_server_free(struct srv_model *mm);

#endif
