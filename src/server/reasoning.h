/* Reasoning ("thinking") output: which delimiters a model's vocabulary uses
 * for its thought, where a row starts relative to that block (the chat
 * primer may already open or close it), the request knobs (effort, budget)
 * and an incremental splitter that sends the text of the block to
 * reasoning_content and the rest to content. The splitter is the only
 * place that decides, so a streamed answer reassembles exactly into the
 * non-streamed one. See docs/agents.md. */
#ifndef TERN_SERVER_REASONING_H
#define TERN_SERVER_REASONING_H

#include <stddef.h>
#include <stdint.h>

#include "base/strbuf.h"
#include "tokenizer/tokenizer.h"

#define REASONING_DELIM_MAX 32

/* A thinking template's delimiters, each one token of the vocabulary. */
typedef struct reasoning_delims {
    char open[REASONING_DELIM_MAX], close[REASONING_DELIM_MAX];
    size_t open_len, close_len;
    int32_t open_id, close_id;
} reasoning_delims;

/* Finds the first known pair (<think>..</think> as Qwen3, QwQ and
 * DeepSeek-R1 write it, then [THINK]..[/THINK] and
 * <|START_THINKING|>..<|END_THINKING|>) whose both halves are single tokens
 * of tok. Returns 1 and fills d, or 0 when the model has none. */
int reasoning_delims_find(const tern_tokenizer *tok, reasoning_delims *d);

/* Where a row's output starts. */
typedef enum reasoning_start {
    REASONING_START_ANSWER = 0, /* no block expected (the primer closed it, or thinking is off) */
    REASONING_START_MAY,        /* the output may open a block first */
    REASONING_START_INSIDE,     /* the primer opened the block: the output starts inside it */
} reasoning_start;

/* The start for a prompt prompt[0..n) whose generation primer begins at
 * boundary (0 = unknown: the whole prompt is searched): the last delimiter
 * token in the primer decides; none means MAY, or ANSWER when the request
 * turned thinking off (thinking_off) and the template did not say so. */
reasoning_start reasoning_start_of(const reasoning_delims *d, const int32_t *prompt, size_t n, size_t boundary,
                                   int thinking_off);

/* reasoning_effort -> (enable_thinking, think-token budget). Returns 0 and
 * sets *enable (0/1) and *budget (-1 = no cap), or -1 for an unknown
 * effort. none turns thinking off with a budget of 0; high is uncapped. */
int reasoning_effort_parse(const char *effort, int *enable, int *budget);

/* The budget a row gets: the request's (-1 = none) bounded by the server's
 * --reasoning-budget (-1 = none). */
int reasoning_budget_combine(int request_budget, int server_budget);

/* The incremental splitter. Inside the block leading and trailing
 * whitespace is trimmed; the answer after a closed block loses its leading
 * whitespace (the template's "\n\n"); an answer without a block is passed
 * through as is. A partial delimiter (or trailing whitespace of the
 * thought) is held back until the next piece decides it. */
typedef struct reasoning_split {
    reasoning_delims d;
    int on;     /* 0: everything is content */
    int state;  /* RS_* in reasoning.c */
    int lead;   /* dropping the segment's leading whitespace */
    tern_sbuf hold;
    size_t n_reasoning; /* bytes sent to reasoning so far */
} reasoning_split;

/* d NULL (or start ANSWER with d NULL) = no split: all text is content. */
void reasoning_split_init(reasoning_split *rs, const reasoning_delims *d, reasoning_start start);
/* Feeds len bytes of output; appends what is decided to *reasoning and
 * *content. Returns 0, or TERN_ENOMEM. */
int reasoning_split_push(reasoning_split *rs, const char *text, size_t len, tern_sbuf *reasoning, tern_sbuf *content);
/* The output ended: flushes what was held back. */
int reasoning_split_finish(reasoning_split *rs, tern_sbuf *reasoning, tern_sbuf *content);
/* Whether the output is (still) inside the thought. */
int reasoning_split_in_thought(const reasoning_split *rs);
void reasoning_split_free(reasoning_split *rs);

#endif
