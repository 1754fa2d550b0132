/* The access log: one line per HTTP request, written when MHD reports it
 * complete (after the last byte of a stream): time (the log's timestamp),
 * id, method, route, model, status, prompt and completion tokens, time to
 * first token, duration, and whether the response went out whole. Text
 * ("tern: TIME info: access id=... route=... status=200 ...") or one JSON
 * object (--log-format json). A generation request also feeds the
 * time-to-first-token and duration histograms of its model here. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/log.h"
#include "server/server_int.h"

/* A request id the client sent is kept when it is short printable ASCII
 * without quotes (it goes into headers and JSON as is). */
static int id_ok(const char *v)
{
    size_t n = strlen(v);
    if (!n || n > 64)
        return 0;
    for (const char *p = v; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f || *p == '"' || *p == '\\')
            return 0;
    return 1;
}

void access_begin(srv_conn *c, const char *method)
{
    static atomic_ullong counter;
    c->t_start = tern_time_s();
    size_t n = 0; /* an HTTP token; anything else is not copied */
    for (const char *p = method; *p && n + 1 < sizeof c->method; p++)
        if ((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || *p == '-' || *p == '_')
            c->method[n++] = *p;
    c->method[n] = 0;
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "X-Request-Id");
    if (h && id_ok(h)) {
        snprintf(c->id, sizeof c->id, "%s", h);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long x = ((unsigned long long)ts.tv_sec << 20) ^ (unsigned long long)ts.tv_nsec ^
                           (atomic_fetch_add(&counter, 1) * 0x9E3779B97F4A7C15ull);
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    snprintf(c->id, sizeof c->id, "req-%016llx", x);
}

void access_end(srv_conn *c, enum MHD_RequestTerminationCode toe)
{
    if (c->stream_job)
        gen_access(c->stream_job, &c->acc);
    double now = tern_time_s();
    const srv_access *a = &c->acc;
    double dur = now - c->t_start;
    double ttft = a->t_first > 0 ? a->t_first - c->t_start : -1;
    if (a->mm) {
        metrics_observe(a->mm, HIST_DURATION, dur);
        if (ttft >= 0)
            metrics_observe(a->mm, HIST_TTFT, ttft);
    }
    if (tern_log_get_level() > TERN_LOG_INFO)
        return;
    const char *model = a->mm ? a->mm->name : NULL;
    int whole = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK;
    char st[16] = "-", tt[24] = "-", text[640], json[768], mj[160] = "null";
    if (c->replied)
        snprintf(st, sizeof st, "%u", c->status);
    if (ttft >= 0)
        snprintf(tt, sizeof tt, "%.1f", ttft * 1e3);
    if (model) { /* a model name is a folder's name: keep it JSON-safe */
        size_t o = 0;
        mj[o++] = '"';
        for (const char *p = model; *p && o + 3 < sizeof mj; p++)
            if (*p != '"' && *p != '\\' && (unsigned char)*p >= 0x20)
                mj[o++] = *p;
        mj[o++] = '"';
        mj[o] = 0;
    }
    snprintf(text, sizeof text,
             "id=%s method=%s route=%s model=%s status=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%s "
             "duration_ms=%.1f end=%s%s%s",
             c->id, c->method, srv_route_names[c->route], model ? model : "-", st, a->prompt_tokens,
             a->completion_tokens, tt, dur * 1e3, whole ? "complete" : "aborted",
             a->completion_id[0] ? " completion_id=" : "", a->completion_id);
    snprintf(json, sizeof json,
             "\"id\":\"%s\",\"method\":\"%s\",\"route\":\"%s\",\"model\":%s,\"status\":%s,\"prompt_tokens\":%d,"
             "\"completion_tokens\":%d,\"ttft_ms\":%s,\"duration_ms\":%.1f,\"end\":\"%s\"%s%s%s",
             c->id, c->method, srv_route_names[c->route], mj, c->replied ? st : "null", a->prompt_tokens,
             a->completion_tokens, ttft >= 0 ? tt : "null", dur * 1e3, whole ? "complete" : "aborted",
             a->completion_id[0] ? ",\"completion_id\":\"" : "", a->completion_id, a->completion_id[0] ? "\"" : "");
    tern_log_record(TERN_LOG_INFO, "access", text, json);
}
