/* Private to the Responses API files (responses.c: request side and
 * store; responses_out.c: items and events): one response's state. */
#ifndef TERN_SERVER_RESPONSES_INT_H
#define TERN_SERVER_RESPONSES_INT_H

#include <json-c/json.h>

#include "server/api.h"
#include "server/responses.h"

#define RESP_ID_MAX 48

struct resp_state {
    struct tern_server *s;
    const char *model;     /* borrowed: the served model's id (responses_set_model) */
    char id[RESP_ID_MAX];  /* resp_... */
    long long created;
    json_object *echo;     /* owned: request fields the response object repeats */
    char *history;         /* owned: this turn's conversation (chat messages, JSON text) for the store */
    int store;             /* keep the conversation for previous_response_id (default 1) */
    int summary;           /* reasoning.summary asked: the thought also as the item's summary */
    int streaming;
    int seq;               /* sequence_number of the next event */
    json_object *output;   /* owned: the output items so far */
    int reason_idx, msg_idx; /* output index of the open reasoning / message item, -1 = none */
    tern_sbuf thought, text; /* their text so far */
    json_object *calls;    /* owned: the calls as chat tool_calls (for the stored history) */
    tern_sbuf all_text;    /* every answer text (for the stored history) */
    int finished;
    json_object *final;    /* owned: the response object once finished */
};

/* A fresh state (id, created, defaults). NULL when out of memory. */
resp_state *resp_state_new(struct tern_server *s);
/* Keeps history (JSON text, taken) under id, dropping the oldest. */
void responses_store_put(struct tern_server *s, const char *id, char *history);

#endif
