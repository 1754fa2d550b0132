/* Reasoning output: delimiters, start state, effort/budget and the
 * incremental thought/answer splitter (see reasoning.h). */
#include <stdlib.h>
#include <string.h>

#include "base/err.h"
#include "server/reasoning.h"

/* Known thought delimiters, in the order they are tried. gpt-oss's
 * channels (<|channel|>analysis ...) are no single-token pair: harmony.c
 * splits them (docs/agents.md). */
static const char *const known_delims[][2] = {
    {"<think>", "</think>"},
    {"[THINK]", "[/THINK]"},
    {"<|START_THINKING|>", "<|END_THINKING|>"},
};

int reasoning_delims_find(const tern_tokenizer *tok, reasoning_delims *d)
{
    memset(d, 0, sizeof *d);
    d->open_id = d->close_id = -1;
    if (!tok)
        return 0;
    for (size_t i = 0; i < sizeof known_delims / sizeof known_delims[0]; i++) {
        int32_t o = tokenizer_token_id(tok, known_delims[i][0]);
        int32_t c = tokenizer_token_id(tok, known_delims[i][1]);
        if (o < 0 || c < 0)
            continue;
        d->open_len = strlen(known_delims[i][0]);
        d->close_len = strlen(known_delims[i][1]);
        memcpy(d->open, known_delims[i][0], d->open_len + 1);
        memcpy(d->close, known_delims[i][1], d->close_len + 1);
        d->open_id = o;
        d->close_id = c;
        return 1;
    }
    return 0;
}

reasoning_start reasoning_start_of(const reasoning_delims *d, const int32_t *prompt, size_t n, size_t boundary,
                                   int thinking_off)
{
    if (!d || d->open_id < 0)
        return REASONING_START_ANSWER;
    for (size_t i = n; i-- > boundary;) {
        if (prompt[i] == d->close_id)
            return REASONING_START_ANSWER;
        if (prompt[i] == d->open_id)
            return REASONING_START_INSIDE;
    }
    return thinking_off ? REASONING_START_ANSWER : REASONING_START_MAY;
}

/* Think-token budgets per effort: a few sentences, a paragraph, a page;
 * "high" leaves only the server's cap. */
int reasoning_effort_parse(const char *effort, int *enable, int *budget)
{
    static const struct {
        const char *name;
        int enable, budget;
    } efforts[] = {
        {"none", 0, 0}, {"minimal", 1, 64}, {"low", 1, 256}, {"medium", 1, 1024}, {"high", 1, -1},
    };
    for (size_t i = 0; i < sizeof efforts / sizeof efforts[0]; i++)
        if (!strcmp(effort, efforts[i].name)) {
            *enable = efforts[i].enable;
            *budget = efforts[i].budget;
            return 0;
        }
    return -1;
}

int reasoning_budget_combine(int request_budget, int server_budget)
{
    if (request_budget < 0)
        return server_budget;
    if (server_budget < 0)
        return request_budget;
    return request_budget < server_budget ? request_budget : server_budget;
}

/* ---- the splitter ---- */

enum { RS_MAY, RS_THINK, RS_ANSWER };

static int is_ws(char ch) { return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t'; }

void reasoning_split_init(reasoning_split *rs, const reasoning_delims *d, reasoning_start start)
{
    memset(rs, 0, sizeof *rs);
    if (!d || d->open_len == 0 || start == REASONING_START_ANSWER) {
        rs->state = RS_ANSWER;
        return;
    }
    rs->d = *d;
    rs->on = 1;
    rs->state = start == REASONING_START_INSIDE ? RS_THINK : RS_MAY;
    rs->lead = rs->state == RS_THINK;
}

void reasoning_split_free(reasoning_split *rs)
{
    free(rs->hold.s);
    memset(&rs->hold, 0, sizeof rs->hold);
}

int reasoning_split_in_thought(const reasoning_split *rs) { return rs->state == RS_THINK; }

/* Drops the first n held bytes. */
static void hold_drop(reasoning_split *rs, size_t n)
{
    memmove(rs->hold.s, rs->hold.s + n, rs->hold.n - n);
    rs->hold.n -= n;
    if (rs->hold.s)
        rs->hold.s[rs->hold.n] = 0;
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

static void emit_reasoning(reasoning_split *rs, const char *s, size_t n, tern_sbuf *out)
{
    if (n) {
        tern_sbuf_put(out, s, n);
        rs->n_reasoning += n;
    }
}

/* Decides as much of the held text as it can; final: nothing more comes. */
static void process(reasoning_split *rs, int final, tern_sbuf *reasoning, tern_sbuf *content)
{
    for (;;) {
        const char *h = rs->hold.s;
        size_t n = rs->hold.n;
        if (n == 0)
            return;
        if (rs->state == RS_MAY) {
            size_t ws = 0;
            while (ws < n && is_ws(h[ws]))
                ws++;
            size_t rest = n - ws;
            if (rest == 0 && !final)
                return;
            if (rest >= rs->d.open_len && !memcmp(h + ws, rs->d.open, rs->d.open_len)) {
                hold_drop(rs, ws + rs->d.open_len);
                rs->state = RS_THINK;
                rs->lead = 1;
                continue;
            }
            if (!final && rest > 0 && rest < rs->d.open_len && !memcmp(h + ws, rs->d.open, rest))
                return; /* may still become the opening */
            rs->state = RS_ANSWER;
            rs->lead = 0;
            continue;
        }
        if (rs->lead) {
            size_t ws = 0;
            while (ws < n && is_ws(h[ws]))
                ws++;
            hold_drop(rs, ws);
            if (rs->hold.n == 0)
                return;
            rs->lead = 0;
            continue;
        }
        if (rs->state == RS_ANSWER) {
            tern_sbuf_put(content, h, n);
            hold_drop(rs, n);
            return;
        }
        /* RS_THINK */
        const char *at = memmem(h, n, rs->d.close, rs->d.close_len);
        if (at) {
            size_t end = (size_t)(at - h);
            while (end > 0 && is_ws(h[end - 1]))
                end--;
            emit_reasoning(rs, h, end, reasoning);
            hold_drop(rs, (size_t)(at - h) + rs->d.close_len);
            rs->state = RS_ANSWER;
            rs->lead = 1;
            continue;
        }
        size_t keep = final ? 0 : partial_suffix(h, n, rs->d.close, rs->d.close_len);
        size_t end = n - keep;
        while (end > 0 && is_ws(h[end - 1])) /* trailing whitespace waits for what follows */
            end--;
        emit_reasoning(rs, h, end, reasoning);
        hold_drop(rs, final ? n : end);
        return;
    }
}

int reasoning_split_push(reasoning_split *rs, const char *text, size_t len, tern_sbuf *reasoning, tern_sbuf *content)
{
    if (!rs->on) {
        tern_sbuf_put(content, text, len);
        return content->oom ? TERN_ENOMEM : 0;
    }
    tern_sbuf_put(&rs->hold, text, len);
    if (rs->hold.oom)
        return TERN_ENOMEM;
    process(rs, 0, reasoning, content);
    return reasoning->oom || content->oom ? TERN_ENOMEM : 0;
}

int reasoning_split_finish(reasoning_split *rs, tern_sbuf *reasoning, tern_sbuf *content)
{
    if (rs->on)
        process(rs, 1, reasoning, content);
    return reasoning->oom || content->oom ? TERN_ENOMEM : 0;
}
