/* Engine internals shared by engine.c (step loop) and request.c (the
 * client-facing request object and its event queue). */
#ifndef TERN_ENGINE_INT_H
#define TERN_ENGINE_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/prefix_cache.h"

typedef struct ev_node {
    engine_event ev;
    struct ev_node *next;
} ev_node;

struct engine_req {
    tern_engine *e;
    /* immutable after submit */
    sample_params sp;
    sample_bias *bias;      /* owned copy of sp.bias */
    int max_tokens;
    char **stop;            /* [n_stop] owned copies */
    int n_stop;
    int ignore_eos, skip_special;
    int cache_boundary;
    const engine_constraint_ops *cops;
    void *cctx;
    void (*notify)(void *user);
    void *user;
    double t_submit;

    /* engine thread only */
    int32_t *tokens;        /* [cap_tokens] prompt then generated */
    int n_tokens, cap_tokens, n_prompt;
    int n_past;             /* positions whose KV is computed */
    int n_cached;
    int n_generated;
    kv_seq seq;
    int blocks_committed;   /* KV blocks reserved at admission, not yet allocated */
    sample_state ss;
    tern_detok *detok;
    char *hold;             /* text held back (possible stop-string start) */
    size_t hold_len, hold_cap;
    double t_first, t_last;
    int started;
    int done;               /* finished; dropped from running[] at the end of the step */

    /* shared with the client, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ev_node *head, *tail;
    int finished;           /* FINISH event queued */
    atomic_int cancel;
    atomic_int refs;        /* client + engine */
};

/* Queues an event (takes ownership of ev's text) and wakes the client. */
void req_push_event(engine_req *r, engine_event *ev);
/* Drops one reference; frees r when none is left. */
void req_unref(engine_req *r);

#endif
