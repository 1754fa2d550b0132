/* Trigger tables of lazy constraints (constraint.h): which text or special
 * token starts the grammar in free text, and which vocabulary tokens can
 * complete a text trigger, so a free-text mask checks only those few
 * against the grammar. Built once per trigger set and vocabulary; rows
 * share them read-only. */
#include <stdlib.h>
#include <string.h>

#include "engine/constraint_int.h"

void constraint_triggers_free(constraint_triggers *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n_texts; i++) {
        trig_text *x = &t->texts[i];
        free(x->s);
        free(x->cand);
    }
    free(t->texts);
    free(t->ids);
    free(t);
}

static int is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* 1 if token bytes b[0..n) belong to group k of s (see trig_text): s
 * inside them (k = 0), or starting with s[k..len). */
static int in_group(const char *s, size_t len, size_t k, const char *b, size_t n)
{
    if (k == 0)
        return n >= len && memmem(b, n, s, len);
    return n >= len - k && !memcmp(b, s + k, len - k);
}

constraint_triggers *constraint_triggers_new(const grammar_vocab *v, const char *const *texts, size_t n_texts,
                                             const int32_t *ids, size_t n_ids, int at_start, tern_err *err)
{
    constraint_triggers *t = calloc(1, sizeof *t);
    if (!t)
        goto out_oom;
    t->at_start = at_start;
    t->n_vocab = grammar_vocab_mask_width(v);
    if (n_ids) {
        if (!(t->ids = malloc(n_ids * sizeof *t->ids)))
            goto out_oom;
        memcpy(t->ids, ids, n_ids * sizeof *ids);
        t->n_ids = n_ids;
    }
    if (n_texts && !(t->texts = calloc(n_texts, sizeof *t->texts)))
        goto out_oom;
    for (size_t i = 0; i < n_texts; i++) {
        trig_text *x = &t->texts[i];
        x->len = strlen(texts[i]);
        if (x->len == 0 || x->len > CONSTRAINT_TRIGGER_MAX) {
            constraint_triggers_free(t);
            tern_err_set(err, TERN_EINVAL, "constraint: trigger length %zu outside 1..%d", x->len,
                         CONSTRAINT_TRIGGER_MAX);
            return NULL;
        }
        if (!(x->s = strdup(texts[i])))
            goto out_oom;
        t->n_texts = i + 1;
        if (x->len > t->max_len)
            t->max_len = x->len;
        size_t cap = 0;
        for (size_t k = 0; k < x->len; k++) {
            x->grp[k] = x->n_cand;
            for (int32_t id = 0; id < t->n_vocab; id++) {
                size_t n = 0;
                const char *b = grammar_vocab_token(v, id, &n);
                if (!b || n == 0 || !in_group(x->s, x->len, k, b, n))
                    continue;
                if (x->n_cand == cap) {
                    cap = cap ? cap * 2 : 64;
                    int32_t *c = realloc(x->cand, cap * sizeof *c);
                    if (!c)
                        goto out_oom;
                    x->cand = c;
                }
                x->cand[x->n_cand++] = id;
            }
        }
        x->grp[x->len] = x->n_cand;
    }
    return t;
out_oom:
    constraint_triggers_free(t);
    tern_err_set(err, TERN_ENOMEM, "out of memory");
    return NULL;
}

int constraint_trigger_is_id(const constraint_triggers *t, int32_t id)
{
    for (size_t i = 0; i < t->n_ids; i++)
        if (t->ids[i] == id)
            return 1;
    return 0;
}

size_t constraint_trigger_first_text(const char *text, size_t n)
{
    size_t f = 0;
    while (f < n && is_ws(text[f]))
        f++;
    return f;
}

long constraint_trigger_find(const constraint_triggers *t, const char *text, size_t n_old, size_t n_new)
{
    long best = -1;
    if (t->at_start) {
        size_t f = constraint_trigger_first_text(text, n_new);
        for (size_t i = 0; i < t->n_texts; i++) {
            const trig_text *x = &t->texts[i];
            if (n_new - f >= x->len && f + x->len > n_old && !memcmp(text + f, x->s, x->len))
                return (long)f;
        }
        return -1;
    }
    for (size_t i = 0; i < t->n_texts; i++) {
        const trig_text *x = &t->texts[i];
        size_t from = n_old >= x->len - 1 ? n_old - (x->len - 1) : 0;
        if (n_new - from < x->len)
            continue;
        const char *p = memmem(text + from, n_new - from, x->s, x->len);
        if (p && (best < 0 || p - text < best))
            best = p - text;
    }
    return best;
}

int constraint_trigger_dead(const constraint_triggers *t, const char *text, size_t n)
{
    if (!t->at_start)
        return 0;
    size_t f = constraint_trigger_first_text(text, n);
    if (f == n)
        return 0;
    for (size_t i = 0; i < t->n_texts; i++) {
        const trig_text *x = &t->texts[i];
        size_t k = n - f < x->len ? n - f : x->len;
        if (!memcmp(text + f, x->s, k))
            return 0;
    }
    return 1;
}
