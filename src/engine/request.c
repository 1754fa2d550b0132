/* Requests as the client sees them: a queue of events filled by the engine
 * thread, drained by the client, with reference counting so either side may
 * finish first. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine_int.h"

void engine_event_clear(engine_event *ev)
{
    if (!ev)
        return;
    free(ev->text);
    free(ev->embedding);
    memset(ev, 0, sizeof *ev);
}

const char *engine_finish_name(engine_finish f)
{
    switch (f) {
    case ENGINE_FINISH_STOP: return "stop";
    case ENGINE_FINISH_LENGTH: return "length";
    case ENGINE_FINISH_CANCELLED: return "cancelled";
    case ENGINE_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void req_push_event(engine_req *r, engine_event *ev)
{
    ev_node *n = malloc(sizeof *n);
    pthread_mutex_lock(&r->mu);
    if (n) {
        n->ev = *ev;
        n->next = NULL;
        if (r->tail)
            r->tail->next = n;
        else
            r->head = n;
        r->tail = n;
    } else {
        free(ev->text); /* out of memory: the text is lost, the finish is not */
        free(ev->embedding);
    }
    if (ev->kind == ENGINE_EV_FINISH)
        r->finished = 1;
    pthread_cond_broadcast(&r->cv);
    /* under the lock, so that once engine_req_release has cleared notify
     * no call can still be on its way */
    if (r->notify)
        r->notify(r->user);
    pthread_mutex_unlock(&r->mu);
    memset(ev, 0, sizeof *ev);
}

int engine_req_next(engine_req *r, engine_event *ev, int timeout_ms)
{
    pthread_mutex_lock(&r->mu);
    if (!r->head && timeout_ms != 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (timeout_ms > 0) {
            ts.tv_sec += timeout_ms / 1000;
            ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
        }
        while (!r->head) {
            if (timeout_ms < 0)
                pthread_cond_wait(&r->cv, &r->mu);
            else if (pthread_cond_timedwait(&r->cv, &r->mu, &ts) != 0)
                break;
        }
    }
    ev_node *n = r->head;
    if (n) {
        r->head = n->next;
        if (!r->head)
            r->tail = NULL;
    }
    pthread_mutex_unlock(&r->mu);
    if (!n)
        return 0;
    *ev = n->ev;
    free(n);
    return 1;
}

void req_unref(engine_req *r)
{
    if (atomic_fetch_sub(&r->refs, 1) != 1)
        return;
    for (ev_node *n = r->head, *next; n; n = next) {
        next = n->next;
        free(n->ev.text);
        free(n);
    }
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->min_ids);
    free(r->bias);
    free(r->tokens);
    free(r->hold);
    model_lora_release(r->lora);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

void engine_req_release(engine_req *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->notify = NULL;
    pthread_mutex_unlock(&r->mu);
    engine_req_cancel(r);
    req_unref(r);
}
