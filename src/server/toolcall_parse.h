/* Tool calls out of a model's answer: an incremental parser over the
 * answer text (after the reasoning split) for the formats toolfmt.h names.
 * Free text passes through as content; from a trigger on, the text is held
 * until the call's JSON is complete and valid, then released as a call
 * (name + arguments as compact JSON text). A call that turns out malformed
 * or is cut off goes back to content, whole, so arguments that are not JSON
 * never reach a client as a call. One parser serves the JSON body and the
 * stream, so both carry the same calls. See docs/agents.md. */
#ifndef TERN_SERVER_TOOLCALL_PARSE_H
#define TERN_SERVER_TOOLCALL_PARSE_H

#include <stddef.h>

#include "base/strbuf.h"
#include "server/toolfmt.h"

/* Bytes of one call's text before it counts as malformed (a model that
 * never closes its call must not grow the hold without bound). */
#define TOOLCALL_MAX_BYTES (1u << 20)

typedef struct toolcall_call {
    char *name;      /* owned, NUL-terminated */
    char *arguments; /* owned: the arguments object as compact JSON text */
} toolcall_call;

/* What one push decided: content text and complete calls. */
typedef struct toolcall_out {
    tern_sbuf content;
    toolcall_call *calls;
    int n_calls, cap_calls;
} toolcall_out;

/* Empties o for the next push (frees its calls, keeps its buffers). */
void toolcall_out_reset(toolcall_out *o);
void toolcall_out_free(toolcall_out *o);

typedef enum toolcall_status {
    TOOLCALL_OK = 0,        /* nothing went wrong (calls or not) */
    TOOLCALL_MALFORMED,     /* a call's text was not a valid call: returned as content */
    TOOLCALL_TRUNCATED,     /* the output ended inside a call: returned as content */
} toolcall_status;

typedef struct toolcall_parser {
    const toolfmt *fmt;  /* NULL or TOOLFMT_NONE: everything is content */
    int state;           /* TP_* in toolcall_parse.c */
    int at_start;        /* nothing but whitespace of the answer seen yet */
    tern_sbuf hold;      /* undecided text (a partial trigger, a call in progress) */
    tern_sbuf ws;        /* content whitespace held back (dropped before a call) */
    size_t scan;         /* JSON scanner: bytes of hold already scanned */
    int depth, in_str, esc, started;
    size_t json_at;      /* where the call's JSON starts in hold */
    int n_calls;         /* calls released so far */
    toolcall_status status;
} toolcall_parser;

/* fmt borrowed (static formats). */
void toolcall_parser_init(toolcall_parser *p, const toolfmt *fmt);
void toolcall_parser_free(toolcall_parser *p);
/* Feeds len bytes of answer text; appends what is decided to *o. Returns
 * 0 or TERN_ENOMEM. */
int toolcall_parser_push(toolcall_parser *p, const char *text, size_t len, toolcall_out *o);
/* The answer ended: a call still open is truncated (back to content). */
int toolcall_parser_finish(toolcall_parser *p, toolcall_out *o);

/* Appends a call: name and its arguments' JSON text args[0..len) (both
 * copied). 0 or TERN_ENOMEM. */
int toolcall_out_add(toolcall_out *o, const char *name, const char *args, size_t len);

/* "call_" + 24 random alphanumerics into buf (>= 30 bytes). */
void toolcall_id_new(char *buf, size_t cap);

#endif
