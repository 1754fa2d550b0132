/* The harmony chat format (gpt-oss): a reply is a sequence of messages,
 *     <|channel|>analysis<|message|>THOUGHT<|end|>
 *     <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>
 * and a tool call is a message with a recipient,
 *     <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>
 * (the recipient may also stand before the channel:
 * <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>).
 * <|return|> and <|call|> end the turn. This module detects a harmony
 * vocabulary and splits a reply, piece by piece, into reasoning (analysis),
 * content (final, and commentary without a recipient: a preamble the user
 * may see) and tool calls (a recipient functions.NAME; the message is the
 * arguments JSON). The one splitter serves the JSON body and the stream, so
 * both carry the same bytes. See docs/agents.md. */
#ifndef TERN_SERVER_HARMONY_H
#define TERN_SERVER_HARMONY_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/strbuf.h"
#include "engine/constraint.h"
#include "grammar/grammar.h"
#include "server/toolcall_parse.h"
#include "tokenizer/tokenizer.h"

/* The harmony special tokens of a vocabulary. */
typedef struct harmony_tokens {
    int32_t start, channel, message, end, ret, call, constrain;
} harmony_tokens;

/* Whether tok has all seven harmony tokens (<|start|> <|channel|>
 * <|message|> <|end|> <|return|> <|call|> <|constrain|>), each one token.
 * Returns 1 and fills t, or 0 (t's ids -1). tok may be NULL. */
int harmony_detect(const tern_tokenizer *tok, harmony_tokens *t);

/* ---- structured output on a harmony model ----
 * The analysis message is the think block: its header
 * <|channel|>analysis<|message|> is forced first (gpt-oss always reasons; a
 * budget of 0 closes it at once), it is free text until <|end|> (forced at
 * the budget), and the grammar then matches the rest: the next message's
 * header and its body. For that the grammar's vocabulary gives the header
 * tokens <|start|> <|channel|> <|message|> <|constrain|> one control byte
 * each (HARMONY_G_*) as their grammar text, and every other token whose
 * bytes hold one of those is left out: a header in a grammar can only be
 * written with its special token - never spelt in plain pieces, never
 * inside a JSON string (which holds no raw control byte). <|return|> and
 * <|call|> are stop tokens. The engine's text is untouched: the splitter
 * still reads "<|start|>". */
#define HARMONY_G_START "\\x01"     /* EBNF escapes: the grammar text of the header tokens */
#define HARMONY_G_CHANNEL "\\x02"
#define HARMONY_G_MESSAGE "\\x03"
#define HARMONY_G_CONSTRAIN "\\x04"

/* The grammar vocabulary of a harmony model: tok's, with the header tokens
 * as the bytes 0x01-0x04 (<|start|> <|channel|> <|message|> <|constrain|>)
 * and the tokens holding those bytes left out; stop ids:
 * stop_ids[0..n_stop) plus <|return|> and <|call|>. NULL with err set on
 * error. */
grammar_vocab *harmony_grammar_vocab(const tern_tokenizer *tok, const harmony_tokens *t, int32_t mask_width,
                                     const int32_t *stop_ids, size_t n_stop, tern_err *err);

/* The think block of a harmony row (mode OPEN, the analysis header as the
 * opening, <|end|> as the close, the header tokens denied inside); the
 * budget fields are left 0. Returns 0, or an error when "analysis" needs
 * more tokens than a sequence holds. */
int harmony_think(const tern_tokenizer *tok, const harmony_tokens *t, constraint_think *th, tern_err *err);

/* The grammar text before a final answer (after the analysis' <|end|>):
 * <|start|>assistant<|channel|>final<|message|> (an optional
 * " <|constrain|>json" before <|message|>), as an EBNF expression. */
#define HARMONY_FINAL_EBNF                                                                                     \
    "\"" HARMONY_G_START "assistant" HARMONY_G_CHANNEL "final\" (\" " HARMONY_G_CONSTRAIN "json\")? \"" \
    HARMONY_G_MESSAGE "\""

/* Longest recipient kept (functions.NAME; names are at most 64 bytes). */
#define HARMONY_RECIPIENT_MAX 96

/* The incremental splitter. A message's body ends at <|end|>, <|return|>
 * or <|call|> (or, when a runtime dropped <|end|> from the text, at the
 * next <|start|>). Reasoning: each analysis message trimmed of
 * leading and trailing whitespace, two messages joined by "\n\n". Content:
 * final and preamble messages as written, two non-empty ones joined by
 * "\n\n". Calls (only when `calls` is set: the request passed tools): the
 * message held until it ends, then released when it is a JSON object, else
 * returned to content as the raw message (status MALFORMED); a recipient
 * other than functions.NAME is malformed too. Without `calls` a recipient's
 * message is content. Text outside any message (no header) is content. */
typedef struct harmony_split {
    int calls;
    int state;                 /* HS_* in harmony.c */
    int kind;                  /* HK_*: what the current message is */
    tern_sbuf hold;            /* undecided bytes */
    tern_sbuf head;            /* the current message's header, raw */
    tern_sbuf body;            /* a call's message, held until it ends */
    tern_sbuf ws;              /* reasoning: trailing whitespace held back */
    int lead;                  /* reasoning: dropping the message's leading whitespace */
    int sep_due;               /* the separator goes out before this message's first byte */
    char name[HARMONY_RECIPIENT_MAX + 1];
    int bad_recipient;
    size_t n_reasoning, n_content;
    int n_calls;
    toolcall_status status;
} harmony_split;

void harmony_split_init(harmony_split *h, int calls);
void harmony_split_free(harmony_split *h);
/* Feeds len bytes of output (special tokens as their text); appends what
 * is decided to *reasoning, o->content and o->calls. 0 or TERN_ENOMEM. */
int harmony_split_push(harmony_split *h, const char *text, size_t len, tern_sbuf *reasoning, toolcall_out *o);
/* The output ended (cut: by max_tokens, a call still open is returned as
 * content with status TRUNCATED; else an open call is complete: the stop
 * token <|call|> is not part of the text). */
int harmony_split_finish(harmony_split *h, int cut, tern_sbuf *reasoning, toolcall_out *o);
/* Whether the output is inside an analysis message. */
int harmony_split_in_thought(const harmony_split *h);

#endif
