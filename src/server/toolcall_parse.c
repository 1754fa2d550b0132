/* The incremental tool-call parser (see toolcall_parse.h). States:
 *   TEXT  free answer text; a trigger of the format (anywhere, or only at
 *         the start of the answer for the JSON-only formats) starts calls;
 *         a partial trigger at the end is held back;
 *   JSON  the call's JSON value (an object; Mistral: an array of them) is
 *         scanned for its end (depth, strings, escapes), then parsed with
 *         json-c and checked: a name string and an arguments object;
 *   POST  after a call: Hermes' closing tag, Llama's "; " before another
 *         object; anything else returns to TEXT;
 *   FAIL  a malformed call: from its trigger on everything is content.
 * Whitespace between content and a call, between calls and after the last
 * call is dropped; otherwise content passes through byte for byte. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <stdatomic.h>

#include "base/err.h"
#include "base/json.h"
#include "server/toolcall_parse.h"

enum { TP_TEXT, TP_JSON, TP_POST, TP_FAIL };

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

void toolcall_out_reset(toolcall_out *o)
{
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].arguments);
    }
    o->n_calls = 0;
    o->content.n = 0;
    if (o->content.s)
        o->content.s[0] = 0;
}

void toolcall_out_free(toolcall_out *o)
{
    toolcall_out_reset(o);
    free(o->calls);
    free(o->content.s);
    memset(o, 0, sizeof *o);
}

void toolcall_parser_init(toolcall_parser *p, const toolfmt *fmt)
{
    memset(p, 0, sizeof *p);
    p->fmt = fmt && fmt->kind != TOOLFMT_NONE ? fmt : NULL;
    p->state = p->fmt ? TP_TEXT : TP_FAIL;
    p->at_start = 1;
}

void toolcall_parser_free(toolcall_parser *p)
{
    free(p->hold.s);
    free(p->ws.s);
    memset(p, 0, sizeof *p);
}

static void hold_drop(tern_sbuf *b, size_t n)
{
    memmove(b->s, b->s + n, b->n - n);
    b->n -= n;
    if (b->s)
        b->s[b->n] = 0;
}

/* Content: the held whitespace first, then s, whose trailing whitespace is
 * held in turn (it may turn out to precede a call). */
static void put_content(toolcall_parser *p, const char *s, size_t n, toolcall_out *o)
{
    size_t end = n;
    while (end > 0 && is_ws(s[end - 1]))
        end--;
    if (end == 0) {
        tern_sbuf_put(&p->ws, s, n);
        return;
    }
    if (p->ws.n) {
        tern_sbuf_put(&o->content, p->ws.s, p->ws.n);
        p->ws.n = 0;
    }
    tern_sbuf_put(&o->content, s, end);
    tern_sbuf_put(&p->ws, s + end, n - end);
    p->at_start = 0;
}

/* Back to content from the trigger on: the call was not a call. */
static void fail(toolcall_parser *p, toolcall_out *o, toolcall_status why)
{
    if (p->ws.n) {
        tern_sbuf_put(&o->content, p->ws.s, p->ws.n);
        p->ws.n = 0;
    }
    tern_sbuf_put(&o->content, p->hold.s, p->hold.n);
    p->hold.n = 0;
    p->state = TP_FAIL;
    p->status = why;
}

/* ---- spans in JSON text json-c already accepted (so it is valid) ---- */

static size_t skip_ws(const char *s, size_t i, size_t n)
{
    while (i < n && is_ws(s[i]))
        i++;
    return i;
}

/* The index just after the value that starts at s[i]. */
static size_t skip_value(const char *s, size_t i, size_t n)
{
    int depth = 0, in_str = 0, esc = 0;
    for (; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (esc)
                esc = 0;
            else if (c == '\\')
                esc = 1;
            else if (c == '"') {
                in_str = 0;
                if (depth == 0)
                    return i + 1;
            }
            continue;
        }
        if (c == '"')
            in_str = 1;
        else if (c == '{' || c == '[')
            depth++;
        else if (c == '}' || c == ']') {
            if (--depth <= 0)
                return depth < 0 ? i : i + 1;
        } else if (depth == 0 && (c == ',' || is_ws(c)))
            return i;
    }
    return n;
}

/* The span [*vb, *ve) of member key's value in the object at s[i] ('{');
 * 0 if found, -1 if not (keys written with escapes do not match). */
static int member_span(const char *s, size_t i, size_t n, const char *key, size_t *vb, size_t *ve)
{
    size_t kl = strlen(key);
    i = skip_ws(s, i + 1, n);
    while (i < n && s[i] == '"') {
        size_t ke = skip_value(s, i, n);
        int hit = ke - i == kl + 2 && !memcmp(s + i + 1, key, kl);
        i = skip_ws(s, ke, n);
        i = skip_ws(s, i + 1, n); /* the colon */
        size_t e = skip_value(s, i, n);
        if (hit) {
            *vb = i;
            *ve = e;
            return 0;
        }
        i = skip_ws(s, e, n);
        if (i < n && s[i] == ',')
            i = skip_ws(s, i + 1, n);
    }
    return -1;
}

/* The call with its arguments as the model wrote them (raw: numbers and
 * spacing kept exactly), or re-serialized when the raw text is not at hand. */
static int add_call(toolcall_out *o, const char *name, json_object *args, const char *raw, size_t raw_len)
{
    if (o->n_calls == o->cap_calls) {
        int cap = o->cap_calls ? o->cap_calls * 2 : 4;
        toolcall_call *c = realloc(o->calls, (size_t)cap * sizeof *c);
        if (!c)
            return TERN_ENOMEM;
        o->calls = c;
        o->cap_calls = cap;
    }
    toolcall_call *c = &o->calls[o->n_calls];
    c->name = strdup(name);
    if (raw)
        c->arguments = strndup(raw, raw_len);
    else {
        const char *a = json_object_to_json_string_ext(args, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        c->arguments = strdup(a ? a : "{}");
    }
    if (!c->name || !c->arguments) {
        free(c->name);
        free(c->arguments);
        return TERN_ENOMEM;
    }
    o->n_calls++;
    return 0;
}

int toolcall_out_add(toolcall_out *o, const char *name, const char *args, size_t len)
{
    return add_call(o, name, NULL, args, len);
}

/* One call object: {"<name_key>": string, "<args_key>": object}; the other
 * arguments key ("arguments" / "parameters") is taken too, and arguments
 * given as JSON text are parsed. s[0..n) is the object's text. Returns 0,
 * -1 if it is no call, or TERN_ENOMEM. */
static int take_call(const toolfmt *f, json_object *c, const char *s, size_t n, toolcall_out *o)
{
    json_object *name = NULL, *args = NULL;
    if (!json_object_is_type(c, json_type_object) || !json_object_object_get_ex(c, f->name_key, &name) ||
        !json_object_is_type(name, json_type_string) || json_object_get_string_len(name) == 0)
        return -1;
    if (!json_object_object_get_ex(c, f->args_key, &args))
        json_object_object_get_ex(c, strcmp(f->args_key, "arguments") ? "arguments" : "parameters", &args);
    const char *used_key = json_object_object_get_ex(c, f->args_key, NULL) ? f->args_key
                           : strcmp(f->args_key, "arguments")                ? "arguments"
                                                                             : "parameters";
    json_object *parsed = NULL;
    const char *raw = NULL;
    size_t vb = 0, ve = 0;
    if (args && json_object_is_type(args, json_type_string)) {
        raw = json_object_get_string(args); /* the arguments' own text */
        ve = (size_t)json_object_get_string_len(args);
        parsed = tern_json_parse(raw, ve, NULL);
        args = parsed;
    } else if (args && n && member_span(s, 0, n, used_key, &vb, &ve) == 0) {
        raw = s + vb;
        ve -= vb;
    }
    int rc = -1;
    if (!args) { /* a function without parameters */
        json_object *empty = json_object_new_object();
        rc = empty ? add_call(o, json_object_get_string(name), empty, NULL, 0) : TERN_ENOMEM;
        json_object_put(empty);
    } else if (json_object_is_type(args, json_type_object)) {
        rc = add_call(o, json_object_get_string(name), args, raw, ve);
    }
    json_object_put(parsed);
    return rc;
}

/* The calls in one complete JSON value of the format. 0, -1 (not calls) or
 * TERN_ENOMEM. On -1 no call was added. */
static int take_calls(const toolfmt *f, const char *s, size_t n, toolcall_out *o)
{
    json_object *v = tern_json_parse(s, n, NULL);
    if (!v)
        return -1;
    json_object *list = NULL;
    size_t lb = 0, le = n; /* the list's text */
    if (f->kind == TOOLFMT_MISTRAL)
        list = v;
    else if (f->kind == TOOLFMT_JSON && json_object_object_get_ex(v, "tool_calls", &list) &&
             member_span(s, skip_ws(s, 0, n), n, "tool_calls", &lb, &le))
        lb = le = 0; /* written with escapes: no raw text */
    int before = o->n_calls, rc = 0;
    if (list) {
        size_t k = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
        rc = k ? 0 : -1;
        size_t at = le > lb ? skip_ws(s, lb + 1, le) : le; /* the first element */
        for (size_t i = 0; i < k && !rc; i++) {
            size_t end = at < le ? skip_value(s, at, le) : at;
            rc = take_call(f, json_object_array_get_idx(list, i), s + at, end - at, o);
            at = skip_ws(s, end, le);
            if (at < le && s[at] == ',')
                at = skip_ws(s, at + 1, le);
        }
    } else {
        rc = take_call(f, v, s + skip_ws(s, 0, n), n - skip_ws(s, 0, n), o);
    }
    json_object_put(v);
    if (rc == -1) { /* all or nothing */
        while (o->n_calls > before) {
            o->n_calls--;
            free(o->calls[o->n_calls].name);
            free(o->calls[o->n_calls].arguments);
        }
    }
    return rc;
}

/* Where the earliest trigger starts in hold (or SIZE_MAX), and its index.
 * For at-start formats only at the start of the answer. */
static size_t find_trigger(const toolcall_parser *p, int *which)
{
    const char *h = p->hold.s;
    size_t n = p->hold.n, best = (size_t)-1;
    for (int t = 0; p->fmt->triggers[t]; t++) {
        const char *tr = p->fmt->triggers[t];
        size_t tl = strlen(tr);
        if (p->fmt->trigger_at_start) {
            if (!p->at_start)
                continue;
            size_t ws = 0;
            while (ws < n && is_ws(h[ws]))
                ws++;
            if (n - ws >= tl && !memcmp(h + ws, tr, tl) && ws < best) {
                best = ws;
                *which = t;
            }
            continue;
        }
        const char *at = n >= tl ? memmem(h, n, tr, tl) : NULL;
        if (at && (size_t)(at - h) < best) {
            best = (size_t)(at - h);
            *which = t;
        }
    }
    return best;
}

/* Bytes at the end of hold that may still become a trigger. */
static size_t trigger_tail(const toolcall_parser *p)
{
    const char *h = p->hold.s;
    size_t n = p->hold.n, keep = 0;
    for (int t = 0; p->fmt->triggers[t]; t++) {
        const char *tr = p->fmt->triggers[t];
        size_t tl = strlen(tr);
        if (p->fmt->trigger_at_start) {
            size_t ws = 0;
            while (ws < n && is_ws(h[ws]))
                ws++;
            if (p->at_start && n - ws < tl && !memcmp(h + ws, tr, n - ws))
                keep = n; /* the whole answer so far may open a call */
            continue;
        }
        for (size_t k = tl - 1 < n ? tl - 1 : n; k > keep; k--)
            if (!memcmp(h + n - k, tr, k)) {
                keep = k;
                break;
            }
    }
    return keep;
}

static void start_json(toolcall_parser *p, size_t at)
{
    p->state = TP_JSON;
    p->json_at = p->scan = at;
    p->depth = p->in_str = p->esc = p->started = 0;
}

/* Scans the call's JSON; 1 when complete (json ends at p->scan), 0 when
 * more is needed, -1 when it cannot be a call. */
static int scan_json(toolcall_parser *p)
{
    const char *h = p->hold.s;
    for (; p->scan < p->hold.n; p->scan++) {
        char c = h[p->scan];
        if (!p->started) {
            if (is_ws(c)) {
                p->json_at = p->scan + 1;
                continue;
            }
            if (c != (p->fmt->kind == TOOLFMT_MISTRAL ? '[' : '{'))
                return -1;
            p->started = 1;
            p->depth = 1;
            continue;
        }
        if (p->in_str) {
            if (p->esc)
                p->esc = 0;
            else if (c == '\\')
                p->esc = 1;
            else if (c == '"')
                p->in_str = 0;
            continue;
        }
        if (c == '"')
            p->in_str = 1;
        else if (c == '{' || c == '[')
            p->depth++;
        else if ((c == '}' || c == ']') && --p->depth == 0) {
            p->scan++;
            return 1;
        }
    }
    return p->hold.n > TOOLCALL_MAX_BYTES ? -1 : 0;
}

static int process(toolcall_parser *p, toolcall_out *o)
{
    for (;;) {
        if (p->state == TP_FAIL) {
            if (p->hold.n)
                fail(p, o, p->status);
            return 0;
        }
        if (p->hold.n == 0)
            return 0;
        if (p->state == TP_TEXT) {
            int which = 0;
            size_t at = find_trigger(p, &which);
            if (at == (size_t)-1) {
                if (p->fmt->trigger_at_start && !p->at_start) { /* calls only open an answer */
                    put_content(p, p->hold.s, p->hold.n, o);
                    hold_drop(&p->hold, p->hold.n);
                    return 0;
                }
                size_t keep = trigger_tail(p);
                if (p->hold.n > keep) {
                    put_content(p, p->hold.s, p->hold.n - keep, o);
                    hold_drop(&p->hold, p->hold.n - keep);
                }
                if (p->fmt->trigger_at_start && keep == 0)
                    p->at_start = 0;
                return 0;
            }
            put_content(p, p->hold.s, at, o);
            hold_drop(&p->hold, at);
            const char *tr = p->fmt->triggers[which];
            /* a trigger that is the JSON's own start ({"name", {"tool_calls") stays part of it */
            start_json(p, tr[0] == '{' ? 0 : strlen(tr));
            continue;
        }
        if (p->state == TP_JSON) {
            int rc = scan_json(p), n_before = o->n_calls;
            if (rc == 0)
                return 0;
            if (rc > 0) {
                rc = take_calls(p->fmt, p->hold.s + p->json_at, p->scan - p->json_at, o);
                if (rc == TERN_ENOMEM)
                    return rc;
            }
            if (rc < 0) {
                fail(p, o, TOOLCALL_MALFORMED);
                return 0;
            }
            p->n_calls += o->n_calls - n_before;
            p->ws.n = 0; /* the whitespace before a call is no content */
            p->at_start = 0;
            hold_drop(&p->hold, p->scan);
            p->state = TP_POST;
            continue;
        }
        /* TP_POST */
        size_t ws = 0;
        while (ws < p->hold.n && is_ws(p->hold.s[ws]))
            ws++;
        const char *rest = p->hold.s + ws;
        size_t rn = p->hold.n - ws;
        if (rn == 0)
            return 0;
        const char *close = p->fmt->kind == TOOLFMT_HERMES ? "</tool_call>" : NULL;
        if (close) {
            size_t cl = strlen(close);
            if (rn < cl && !memcmp(rest, close, rn))
                return 0;
            if (rn >= cl && !memcmp(rest, close, cl)) {
                hold_drop(&p->hold, ws + cl);
                p->state = TP_TEXT;
                continue;
            }
        }
        if (p->fmt->kind == TOOLFMT_LLAMA3 && rest[0] == ';') {
            hold_drop(&p->hold, ws);
            start_json(p, 1);
            continue;
        }
        hold_drop(&p->hold, ws); /* the whitespace after a call is no content */
        p->state = TP_TEXT;
    }
}

int toolcall_parser_push(toolcall_parser *p, const char *text, size_t len, toolcall_out *o)
{
    if (!p->fmt) {
        tern_sbuf_put(&o->content, text, len);
        return o->content.oom ? TERN_ENOMEM : 0;
    }
    tern_sbuf_put(&p->hold, text, len);
    if (p->hold.oom)
        return TERN_ENOMEM;
    int rc = process(p, o);
    return rc ? rc : o->content.oom || p->ws.oom ? TERN_ENOMEM : 0;
}

int toolcall_parser_finish(toolcall_parser *p, toolcall_out *o)
{
    if (!p->fmt)
        return 0;
    if (p->state == TP_JSON) {
        fail(p, o, TOOLCALL_TRUNCATED);
    } else if (p->state == TP_POST) {
        p->hold.n = 0; /* whitespace or a partial closing tag */
    } else if (p->hold.n) {
        put_content(p, p->hold.s, p->hold.n, o);
        p->hold.n = 0;
    }
    if (p->ws.n && p->n_calls == 0) /* trailing whitespace of a plain answer is content */
        tern_sbuf_put(&o->content, p->ws.s, p->ws.n);
    p->ws.n = 0;
    return o->content.oom ? TERN_ENOMEM : 0;
}

void toolcall_id_new(char *buf, size_t cap)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static atomic_ullong counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
                 (atomic_fetch_add(&counter, 1) + 1) * 0x9E3779B97F4A7C15ull;
    if (cap < 30) {
        if (cap)
            buf[0] = 0;
        return;
    }
    memcpy(buf, "call_", 5);
    for (int i = 0; i < 24; i++) {
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 29;
        buf[5 + i] = digits[x % 62];
    }
    buf[29] = 0;
}
