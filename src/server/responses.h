/* POST /v1/responses (OpenAI's Responses API) on the chat engine path: a
 * Responses body is translated into a chat-completions body (input items
 * -> messages, text.format -> response_format, function tools, reasoning
 * effort, max_output_tokens), which then runs exactly as a chat request;
 * the chat reply pipeline's pieces (thought, answer text, released tool
 * calls) become output items - a reasoning item, a message, function_call
 * items - and, streamed, the documented event sequence. Finished responses
 * are kept in memory (bounded LRU) for previous_response_id. See
 * docs/agents.md. */
#ifndef TERN_SERVER_RESPONSES_H
#define TERN_SERVER_RESPONSES_H

#include <stddef.h>

#include "engine/engine.h"
#include "server/api.h"
#include "server/toolcall_parse.h"

struct tern_server;
typedef struct resp_state resp_state;

/* Responses kept for previous_response_id (oldest dropped first), and the
 * bytes of conversation they may hold together. */
#define RESPONSES_STORE_MAX 512
#define RESPONSES_STORE_BYTES ((size_t)64 << 20)

/* Translates a Responses body (len bytes) into a chat-completions body
 * (*chat, malloc'd JSON text) and the state that shapes the reply (*out).
 * Unknown fields, unsupported item or tool types and bad shapes are 400s
 * naming the field; an unknown previous_response_id is a 404. Returns 0, or
 * -1 with e set. */
int responses_translate(struct tern_server *s, const char *body, size_t len, char **chat, resp_state **out,
                        api_error *e);
void responses_state_free(resp_state *r);
/* The model the response names (borrowed: it must outlive r). */
void responses_set_model(resp_state *r, const char *model);

/* The reply, driven by gen.c with what the chat pipeline decided. With
 * streaming, events are appended to out as SSE ("event: T\ndata: {..}").
 * start: response.created + response.in_progress (streaming only). */
void responses_start(resp_state *r, api_buf *out);
/* A piece of thought and/or answer text and any calls released with it. */
void responses_piece(resp_state *r, api_buf *out, int streaming, const char *thought, size_t thought_len,
                     const char *text, size_t text_len, const toolcall_out *calls);
/* The generation ended (f; error text for ENGINE_FINISH_ERROR): items are
 * closed, usage recorded, the final event sent when streaming, and the
 * conversation stored under the response id when store is on. */
void responses_finish(resp_state *r, api_buf *out, int streaming, engine_finish f, const char *error, int n_prompt,
                      const engine_usage *u, int n_thought_tokens);
/* The response object as JSON text (malloc'd), after responses_finish. */
char *responses_body(resp_state *r);

/* Frees the server's response store (server_free). */
void responses_server_free(struct tern_server *s);

#endif
