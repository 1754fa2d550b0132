/* The harmony format: detection and the reply splitter (see harmony.h). */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "base/json.h"
#include "server/harmony.h"

#define H_MESSAGE "<|message|>"
#define H_MESSAGE_LEN 11
/* A header longer than this is no header: the model is writing plain text
 * (real headers are a role, a channel, a recipient and a content type). */
#define HARMONY_HEAD_MAX 256

enum { HS_HEAD, HS_BODY };
enum { HK_REASONING, HK_CONTENT, HK_CALL };

/* What ends a message's body. <|start|> (the next message's header: a
 * runtime that drops <|end|> from the text, as some do, leaves only it) ends
 * the body without being consumed. */
static const char *const terms[] = {"<|end|>", "<|return|>", "<|call|>", "<|start|>"};
#define N_TERMS 4
#define TERM_START 3

int harmony_detect(const tern_tokenizer *tok, harmony_tokens *t)
{
    static const char *const names[] = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                        "<|return|>", "<|call|>", "<|constrain|>"};
    int32_t ids[7];
    t->start = t->channel = t->message = t->end = t->ret = t->call = t->constrain = -1;
    if (!tok)
        return 0;
    for (int i = 0; i < 7; i++)
        if ((ids[i] = tokenizer_token_id(tok, names[i])) < 0)
            return 0;
    t->start = ids[0];
    t->channel = ids[1];
    t->message = ids[2];
    t->end = ids[3];
    t->ret = ids[4];
    t->call = ids[5];
    t->constrain = ids[6];
    return 1;
}

grammar_vocab *harmony_grammar_vocab(const tern_tokenizer *tok, const harmony_tokens *t, int32_t mask_width,
                                     const int32_t *stop_ids, size_t n_stop, tern_err *err)
{
    int32_t n = tokenizer_vocab_size(tok);
    const char **bytes = calloc((size_t)(n > 0 ? n : 1), sizeof *bytes);
    size_t *lens = calloc((size_t)(n > 0 ? n : 1), sizeof *lens);
    uint8_t *special = calloc((size_t)(n > 0 ? n : 1), 1);
    int32_t *stops = malloc((n_stop + 2) * sizeof *stops);
    grammar_vocab *v = NULL;
    if (!bytes || !lens || !special || !stops) {
        tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
        goto out;
    }
    static const char codes[4] = {1, 2, 3, 4}; /* HARMONY_G_*, in the order of header[] */
    const int32_t header[4] = {t->start, t->channel, t->message, t->constrain};
    for (int32_t i = 0; i < n; i++) {
        const char *b = NULL;
        size_t len = 0;
        int h = -1;
        for (int k = 0; k < 4; k++)
            if (i == header[k])
                h = k;
        if (h >= 0) {
            bytes[i] = &codes[h];
            lens[i] = 1;
            continue;
        }
        if (tokenizer_token_bytes(tok, i, &b, &len) != 0 || tokenizer_is_special(tok, i)) {
            special[i] = 1;
            continue;
        }
        for (size_t k = 0; k < len; k++)
            if (b[k] >= 1 && b[k] <= 4) /* would spell a header */
                special[i] = 1;
        if (special[i])
            continue;
        bytes[i] = b;
        lens[i] = len;
    }
    if (n_stop)
        memcpy(stops, stop_ids, n_stop * sizeof *stops);
    stops[n_stop] = t->ret;
    stops[n_stop + 1] = t->call;
    v = grammar_vocab_from_bytes(bytes, lens, special, n, mask_width, stops, n_stop + 2, err);
out:
    free(bytes);
    free(lens);
    free(special);
    free(stops);
    return v;
}

int harmony_think(const tern_tokenizer *tok, const harmony_tokens *t, constraint_think *th, tern_err *err)
{
    memset(th, 0, sizeof *th);
    int32_t *ids = NULL;
    size_t n = 0;
    if (tokenizer_encode(tok, "analysis", 8, 0, &ids, &n, err))
        return err ? err->code : TERN_EINVAL;
    if (n == 0 || n + 2 > CONSTRAINT_SEQ_MAX) {
        free(ids);
        return tern_err_set(err, TERN_EUNSUPPORTED, "harmony: \"analysis\" is %zu tokens", n);
    }
    th->mode = CONSTRAINT_THINK_OPEN;
    th->open_seq[th->n_open++] = t->channel;
    for (size_t i = 0; i < n; i++)
        th->open_seq[th->n_open++] = ids[i];
    th->open_seq[th->n_open++] = t->message;
    free(ids);
    th->open_id = t->channel;
    th->close_id = t->end;
    th->deny[th->n_deny++] = t->start;
    th->deny[th->n_deny++] = t->channel;
    th->deny[th->n_deny++] = t->message;
    th->deny[th->n_deny++] = t->constrain;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

void harmony_split_init(harmony_split *h, int calls)
{
    memset(h, 0, sizeof *h);
    h->calls = calls;
    h->state = HS_HEAD;
}

void harmony_split_free(harmony_split *h)
{
    free(h->hold.s);
    free(h->head.s);
    free(h->body.s);
    free(h->ws.s);
    memset(h, 0, sizeof *h);
}

int harmony_split_in_thought(const harmony_split *h) { return h->state == HS_BODY && h->kind == HK_REASONING; }

static void buf_drop(tern_sbuf *b, size_t n)
{
    memmove(b->s, b->s + n, b->n - n);
    b->n -= n;
    if (b->s)
        b->s[b->n] = 0;
}

static void buf_clear(tern_sbuf *b)
{
    b->n = 0;
    if (b->s)
        b->s[0] = 0;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of pat. */
static size_t partial_suffix(const char *s, size_t n, const char *pat, size_t pat_len)
{
    size_t k = n < pat_len - 1 ? n : pat_len - 1;
    for (; k > 0; k--)
        if (!memcmp(s + n - k, pat, k))
            return k;
    return 0;
}

/* The word after `key` in the header (up to whitespace or '<'), or "" */
static size_t head_word(const tern_sbuf *head, const char *key, const char **w)
{
    *w = "";
    if (!head->n)
        return 0;
    size_t kl = strlen(key);
    const char *at = NULL;
    for (const char *p = head->s; (p = memmem(p, head->n - (size_t)(p - head->s), key, kl)); p += kl)
        at = p; /* the last one */
    if (!at)
        return 0;
    const char *s = at + kl, *end = head->s + head->n;
    while (s < end && *s == ' ')
        s++;
    const char *e = s;
    while (e < end && !is_ws(*e) && *e != '<')
        e++;
    *w = s;
    return (size_t)(e - s);
}

/* The recipient: "to=" at the start of the header or after a blank. */
static size_t head_recipient(const tern_sbuf *head, const char **w)
{
    *w = "";
    const char *end = head->s + head->n;
    for (const char *p = head->s; head->n && (p = memmem(p, (size_t)(end - p), "to=", 3)); p += 3) {
        if (p > head->s && !is_ws(p[-1]) && p[-1] != '>')
            continue;
        const char *s = p + 3, *e = s;
        while (e < end && !is_ws(*e) && *e != '<')
            e++;
        *w = s;
        return (size_t)(e - s);
    }
    return 0;
}

static int valid_name(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* The header is complete: what the message is. */
static void begin_body(harmony_split *h)
{
    const char *ch, *to;
    size_t ch_len = head_word(&h->head, "<|channel|>", &ch);
    size_t to_len = head_recipient(&h->head, &to);
    if (to_len == 9 && !memcmp(to, "assistant", 9))
        to_len = 0;
    h->state = HS_BODY;
    h->sep_due = 1;
    h->lead = 0;
    h->bad_recipient = 0;
    h->name[0] = 0;
    buf_clear(&h->body);
    buf_clear(&h->ws);
    if (to_len && h->calls) {
        h->kind = HK_CALL;
        if (to_len > 10 && !memcmp(to, "functions.", 10) && valid_name(to + 10, to_len - 10)) {
            memcpy(h->name, to + 10, to_len - 10);
            h->name[to_len - 10] = 0;
        } else {
            h->bad_recipient = 1;
        }
    } else if (!to_len && ch_len == 8 && !memcmp(ch, "analysis", 8)) {
        h->kind = HK_REASONING;
        h->lead = 1;
    } else {
        h->kind = HK_CONTENT; /* final, a preamble (commentary), a recipient's message without tools */
    }
}

static void put_content(harmony_split *h, const char *s, size_t n, toolcall_out *o)
{
    if (!n)
        return;
    if (h->sep_due && h->n_content)
        tern_sbuf_put(&o->content, "\n\n", 2);
    h->sep_due = 0;
    tern_sbuf_put(&o->content, s, n);
    h->n_content += n;
}

/* The raw text of the current (call) message, back to content. */
static void call_to_content(harmony_split *h, const char *term, toolcall_out *o, toolcall_status why)
{
    tern_sbuf raw = {0};
    tern_sbuf_put(&raw, h->head.s ? h->head.s : "", h->head.n);
    tern_sbuf_put(&raw, H_MESSAGE, H_MESSAGE_LEN);
    tern_sbuf_put(&raw, h->body.s ? h->body.s : "", h->body.n);
    if (term)
        tern_sbuf_str(&raw, term);
    if (raw.oom)
        o->content.oom = 1;
    else
        put_content(h, raw.s, raw.n, o);
    free(raw.s);
    buf_clear(&h->body);
    if (h->status == TOOLCALL_OK)
        h->status = why;
}

/* Body text of the current message. */
static void emit(harmony_split *h, const char *s, size_t n, tern_sbuf *reasoning, toolcall_out *o)
{
    if (!n)
        return;
    if (h->kind == HK_CONTENT) {
        put_content(h, s, n, o);
        return;
    }
    if (h->kind == HK_CALL) {
        tern_sbuf_put(&h->body, s, n);
        if (h->body.n > TOOLCALL_MAX_BYTES) { /* never closed: the rest is content */
            call_to_content(h, NULL, o, TOOLCALL_MALFORMED);
            h->kind = HK_CONTENT;
        }
        return;
    }
    /* reasoning: leading whitespace dropped, trailing whitespace held */
    size_t i = 0;
    if (h->lead) {
        while (i < n && is_ws(s[i]))
            i++;
        if (i == n)
            return;
        h->lead = 0;
    }
    size_t end = n;
    while (end > i && is_ws(s[end - 1]))
        end--;
    if (end > i) {
        if (h->sep_due && h->n_reasoning) {
            tern_sbuf_put(reasoning, "\n\n", 2);
            h->n_reasoning += 2;
        }
        h->sep_due = 0;
        if (h->ws.n) {
            tern_sbuf_put(reasoning, h->ws.s, h->ws.n);
            h->n_reasoning += h->ws.n;
            buf_clear(&h->ws);
        }
        tern_sbuf_put(reasoning, s + i, end - i);
        h->n_reasoning += end - i;
    }
    tern_sbuf_put(&h->ws, s + end, n - end);
}

/* The current message ended (term: its terminator's text, NULL at the end
 * of the output; cut: by max_tokens). */
static int end_message(harmony_split *h, const char *term, int cut, toolcall_out *o)
{
    int rc = 0;
    if (h->kind == HK_CALL) {
        if (cut) {
            call_to_content(h, term, o, TOOLCALL_TRUNCATED);
        } else {
            size_t b = 0, e = h->body.n;
            while (b < e && is_ws(h->body.s[b]))
                b++;
            while (e > b && is_ws(h->body.s[e - 1]))
                e--;
            json_object *args = h->bad_recipient ? NULL : tern_json_parse(h->body.s + b, e - b, NULL);
            if (args && json_object_is_type(args, json_type_object)) {
                rc = toolcall_out_add(o, h->name, h->body.s + b, e - b);
                h->n_calls += rc == 0;
            } else {
                call_to_content(h, term, o, TOOLCALL_MALFORMED);
            }
            json_object_put(args);
        }
    }
    buf_clear(&h->ws); /* reasoning: trailing whitespace dropped */
    buf_clear(&h->head);
    buf_clear(&h->body);
    h->state = HS_HEAD;
    return rc;
}

/* The earliest terminator in s[0..n): its index in terms and position. */
static long find_term(const char *s, size_t n, int *which)
{
    long best = -1;
    for (int i = 0; i < N_TERMS; i++) {
        const char *at = memmem(s, n, terms[i], strlen(terms[i]));
        if (at && (best < 0 || at - s < best)) {
            best = at - s;
            *which = i;
        }
    }
    return best;
}

static int process(harmony_split *h, int final, tern_sbuf *reasoning, toolcall_out *o)
{
    for (;;) {
        const char *s = h->hold.s;
        size_t n = h->hold.n;
        if (n == 0)
            return 0;
        if (h->state == HS_HEAD) {
            const char *at = memmem(s, n, H_MESSAGE, H_MESSAGE_LEN);
            size_t avail = at ? (size_t)(at - s) : n - (final ? 0 : partial_suffix(s, n, H_MESSAGE, H_MESSAGE_LEN));
            if (h->head.n + avail > HARMONY_HEAD_MAX) {
                /* no header: plain text is content. The cut is at byte
                 * HEAD_MAX + 1 of the header text, wherever the pieces
                 * ended, so streamed and whole agree. */
                size_t take = HARMONY_HEAD_MAX + 1 - h->head.n;
                tern_sbuf_put(&h->head, s, take);
                buf_drop(&h->hold, take);
                h->kind = HK_CONTENT;
                h->state = HS_BODY;
                h->sep_due = 1;
                put_content(h, h->head.s, h->head.n, o);
                buf_clear(&h->head);
                continue;
            }
            tern_sbuf_put(&h->head, s, avail);
            buf_drop(&h->hold, avail + (at ? H_MESSAGE_LEN : 0));
            if (at) {
                begin_body(h);
                continue;
            }
            return 0;
        }
        int which = 0;
        long at = find_term(s, n, &which);
        if (at >= 0) {
            emit(h, s, (size_t)at, reasoning, o);
            buf_drop(&h->hold, (size_t)at + (which == TERM_START ? 0 : strlen(terms[which])));
            int rc = end_message(h, which == TERM_START ? NULL : terms[which], 0, o);
            if (rc)
                return rc;
            continue;
        }
        size_t keep = 0;
        for (int i = 0; !final && i < N_TERMS; i++) {
            size_t k = partial_suffix(s, n, terms[i], strlen(terms[i]));
            keep = k > keep ? k : keep;
        }
        emit(h, s, n - keep, reasoning, o);
        buf_drop(&h->hold, n - keep);
        return 0;
    }
}

int harmony_split_push(harmony_split *h, const char *text, size_t len, tern_sbuf *reasoning, toolcall_out *o)
{
    tern_sbuf_put(&h->hold, text, len);
    if (h->hold.oom)
        return TERN_ENOMEM;
    int rc = process(h, 0, reasoning, o);
    if (rc)
        return rc;
    return reasoning->oom || o->content.oom || h->head.oom || h->body.oom ? TERN_ENOMEM : 0;
}

int harmony_split_finish(harmony_split *h, int cut, tern_sbuf *reasoning, toolcall_out *o)
{
    int rc = process(h, 1, reasoning, o);
    if (rc)
        return rc;
    if (h->state == HS_BODY) {
        rc = end_message(h, NULL, cut, o);
    } else if (h->head.n) {
        /* a header the output stopped in: plain text is content, a harmony
         * header that never reached its message says nothing */
        if (!memmem(h->head.s, h->head.n, "<|", 2)) {
            h->sep_due = 1;
            put_content(h, h->head.s, h->head.n, o);
        }
        buf_clear(&h->head);
    }
    if (rc)
        return rc;
    return reasoning->oom || o->content.oom ? TERN_ENOMEM : 0;
}
