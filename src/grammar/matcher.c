/* The matcher: the parser state (a set of persistent stacks) per accepted
 * step, kept as a history for rollback, and the per-step token bitmask:
 * the OR of the cached accepted sets of every stack's context chain (top
 * state, then its callers while tokens can leave the frame; see
 * compiled_int.h). No allocation per step once the scratch buffers and
 * caches have grown. */
#include <stdlib.h>
#include <string.h>

#include "grammar/bitset.h"
#include "grammar/compiled_int.h"
#include "grammar/unique_int.h"

typedef struct mstep {
    size_t ids_off;     /* into hist */
    int32_t n;
    int32_t pool_end;   /* pool size once this step was made */
    int32_t uq;         /* uniqueItems tracker checkpoint (unique_int.h) */
    uint8_t can_end, terminated;
} mstep;

struct grammar_matcher {
    grammar_compiled *cg;
    gstk_pool pool;
    int32_t *hist;      /* stack ids of every step's set, concatenated */
    size_t n_hist, cap_hist;
    mstep *steps;       /* steps[0] = start; steps[n_steps] = current */
    int32_t n_steps, cap_steps;
    gstk_set a, b;      /* byte-step ping-pong */
    int64_t *grp;       /* (state << 32 | id) of the current set, sorted */
    int32_t cap_grp;
    guq *uq;            /* uniqueItems tracker; NULL when the grammar has none */
};

static int push_step(grammar_matcher *m, const gstk_set *s, int terminated)
{
    if (m->n_steps + 2 > m->cap_steps) {
        int32_t cap = m->cap_steps ? m->cap_steps * 2 : 64;
        mstep *ns = realloc(m->steps, (size_t)cap * sizeof *ns);
        if (!ns)
            return TERN_ENOMEM;
        m->steps = ns;
        m->cap_steps = cap;
    }
    size_t off = m->n_hist;
    if (off + (size_t)s->n > m->cap_hist) {
        size_t cap = m->cap_hist ? m->cap_hist * 2 : 1024;
        while (cap < off + (size_t)s->n)
            cap *= 2;
        int32_t *h = realloc(m->hist, cap * sizeof *h);
        if (!h)
            return TERN_ENOMEM;
        m->hist = h;
        m->cap_hist = cap;
    }
    if (s->n)
        memcpy(m->hist + off, s->ids, (size_t)s->n * sizeof *s->ids);
    m->n_hist = off + (size_t)s->n;
    mstep *st = &m->steps[m->n_steps + 1];
    st->ids_off = off;
    st->n = s->n;
    st->pool_end = m->pool.n;
    st->can_end = s->can_end;
    st->terminated = (uint8_t)terminated;
    st->uq = -1;
    if (m->uq && (st->uq = guq_save(m->uq, m->n_steps + 1)) < 0)
        return TERN_ENOMEM;
    m->n_steps++;
    return 0;
}

static int start(grammar_matcher *m)
{
    gstk_truncate(&m->pool, 0);
    m->n_hist = 0;
    m->n_steps = -1;
    if (m->uq)
        guq_reset(m->uq);
    gstk_start(m->cg->g, &m->pool, &m->a);
    if (m->a.oom)
        return TERN_ENOMEM;
    return push_step(m, &m->a, 0);
}

grammar_matcher *grammar_matcher_new(grammar_compiled *cg, tern_err *err)
{
    if (!cg) {
        tern_err_set(err, TERN_EINVAL, "matcher: no compiled grammar");
        return NULL;
    }
    grammar_matcher *m = calloc(1, sizeof *m);
    if (!m || gstk_pool_init(&m->pool)) {
        free(m);
        tern_err_set(err, TERN_ENOMEM, "matcher: out of memory");
        return NULL;
    }
    m->cg = cg;
    int urc = 0;
    m->uq = guq_new(cg->g, &urc);
    if (urc || start(m)) {
        grammar_matcher_free(m);
        tern_err_set(err, TERN_ENOMEM, "matcher: out of memory");
        return NULL;
    }
    return m;
}

void grammar_matcher_free(grammar_matcher *m)
{
    if (!m)
        return;
    gstk_pool_free(&m->pool);
    guq_free(m->uq);
    free(m->hist);
    free(m->steps);
    gstk_set_free(&m->a);
    gstk_set_free(&m->b);
    free(m->grp);
    free(m);
}

void grammar_matcher_reset(grammar_matcher *m)
{
    if (m)
        start(m);
}

static inline const mstep *cur_step(const grammar_matcher *m) { return &m->steps[m->n_steps]; }

/* Loads the current set into m->a. */
static int load_current(grammar_matcher *m)
{
    const mstep *st = cur_step(m);
    gstk_set tmp = {.ids = m->hist ? m->hist + st->ids_off : NULL, .n = st->n, .can_end = st->can_end};
    return gstk_set_copy(&m->a, &tmp);
}

/* Reads bytes from the current set; on success the result is in m->a.
 * 1 ok, 0 rejected, <0 error. */
static int run_bytes(grammar_matcher *m, const uint8_t *s, size_t len)
{
    if (load_current(m))
        return TERN_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        if (!m->a.n)
            return 0;
        int opens = m->uq && guq_opens(m->uq, &m->pool, &m->a, s[i]);
        gstk_step(m->cg->g, &m->pool, &m->a, s[i], &m->b);
        gstk_set t = m->a;
        m->a = m->b;
        m->b = t;
        if (m->a.oom)
            return TERN_ENOMEM;
        if (m->uq && (m->a.n || m->a.can_end)) {
            int r = guq_byte(m->uq, s[i], opens);
            if (r != 1)
                return r;
        }
    }
    return m->a.n > 0 || m->a.can_end;
}

int grammar_matcher_accept_string(grammar_matcher *m, const char *s, size_t len)
{
    if (!m || (!s && len))
        return TERN_EINVAL;
    if (cur_step(m)->terminated)
        return 0;
    int32_t mark = m->pool.n;
    int rc = run_bytes(m, (const uint8_t *)s, len);
    if (rc == 1)
        rc = push_step(m, &m->a, 0) ? TERN_ENOMEM : 1;
    if (rc != 1) {
        gstk_truncate(&m->pool, mark);
        if (m->uq)
            guq_load(m->uq, cur_step(m)->uq);
    }
    return rc;
}

int grammar_matcher_accept_token(grammar_matcher *m, int32_t id)
{
    if (!m)
        return TERN_EINVAL;
    const grammar_vocab *v = m->cg->v;
    const mstep *st = cur_step(m);
    if (st->terminated || id < 0 || id >= v->mask_width)
        return 0;
    if (grammar_vocab_is_stop(v, id)) {
        if (!st->can_end)
            return 0;
        gstk_set empty = {.can_end = 1};
        return push_step(m, &empty, 1) ? TERN_ENOMEM : 1;
    }
    if (id >= v->n_tokens || v->special[id] || v->tok_len[id] == 0)
        return 0;
    return grammar_matcher_accept_string(m, v->blob + v->tok_off[id], v->tok_len[id]);
}

int grammar_matcher_restart(grammar_matcher *m)
{
    if (!m)
        return TERN_EINVAL;
    int32_t mark = m->pool.n;
    gstk_start(m->cg->g, &m->pool, &m->a);
    if (m->uq)
        guq_restart(m->uq);
    if (m->a.oom || push_step(m, &m->a, 0)) {
        gstk_truncate(&m->pool, mark);
        if (m->uq)
            guq_load(m->uq, cur_step(m)->uq);
        return TERN_ENOMEM;
    }
    return 0;
}

int grammar_matcher_rollback(grammar_matcher *m, int n)
{
    if (!m || n < 0)
        return TERN_EINVAL;
    if (n > m->n_steps)
        return TERN_ERANGE;
    m->n_steps -= n;
    const mstep *st = cur_step(m);
    m->n_hist = st->ids_off + (size_t)st->n;
    gstk_truncate(&m->pool, st->pool_end);
    if (m->uq)
        guq_load(m->uq, st->uq);
    return 0;
}

int grammar_matcher_n_steps(const grammar_matcher *m) { return m ? m->n_steps : 0; }

int grammar_matcher_can_end(const grammar_matcher *m)
{
    const mstep *st = cur_step(m);
    return !st->terminated && st->can_end;
}

int grammar_matcher_is_terminated(const grammar_matcher *m)
{
    const mstep *st = cur_step(m);
    return st->terminated || (st->n == 0 && st->can_end);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static inline void or_entry(uint32_t *mask, const gctx_entry *e, size_t nw)
{
    if (e->acc_bits) {
        gbits_or(mask, e->acc_bits, nw);
    } else {
        for (int32_t k = 0; k < e->n_acc; k++)
            mask[e->acc_ids[k] / 32] |= 1u << (e->acc_ids[k] % 32);
    }
}

/* One allowed token through the tracker: 1 drop it, 0 keep it, <0 an
 * error; an undecided one is tried for real. */
static int unique_try(grammar_matcher *m, int32_t id, int first_opens)
{
    const grammar_vocab *v = m->cg->v;
    if (id >= v->n_tokens || v->special[id] || !v->tok_len[id])
        return 0;
    const char *t = v->blob + v->tok_off[id];
    size_t len = v->tok_len[id];
    int r = guq_try(m->uq, (const uint8_t *)t, len, first_opens);
    if (r == 2) {
        int a = grammar_matcher_accept_string(m, t, len);
        if (a < 0)
            return a;
        if (a == 1)
            grammar_matcher_rollback(m, 1);
        r = a != 1;
    }
    return r;
}

/* uniqueItems and string lengths: the allowed tokens that can complete
 * an item or break a length are run through the tracker (unique_int.h)
 * and dropped when they do. cnt: the mask's count; the new count. Few
 * candidates (no unique array open, the usual case of a grammar with
 * length rules) go by their id lists, not by a pass over the mask. */
static int unique_filter(grammar_matcher *m, uint32_t *mask, int cnt)
{
    const grammar_vocab *v = m->cg->v;
    size_t nw = v->n_words;
    int crc = guq_len_filter(m->uq, v, mask);
    if (crc < 0)
        return crc;
    cnt -= crc;
    const mstep *st = cur_step(m);
    gstk_set cur = {.ids = m->hist ? m->hist + st->ids_off : NULL, .n = st->n};
    int first_opens = guq_first(m->uq, &m->pool, &cur);
    const int32_t *ids[2];
    size_t n_ids[2];
    int sp = guq_candidate_lists(m->uq, v, first_opens, ids, n_ids);
    if (sp < 0)
        return sp;
    if (sp) {
        for (int l = 0; l < 2; l++)
            for (size_t i = 0; i < n_ids[l]; i++) {
                int32_t id = ids[l][i];
                if (!(mask[id / 32] >> (id % 32) & 1))
                    continue;
                int r = unique_try(m, id, first_opens);
                if (r < 0)
                    return r;
                if (r) {
                    mask[id / 32] &= ~(1u << (id % 32));
                    cnt--;
                }
            }
        return cnt;
    }
    const uint32_t *cand = guq_candidates(m->uq, v, first_opens, &crc);
    if (!cand)
        return crc ? crc : cnt;
    for (size_t w = 0; w < nw; w++) {
        uint32_t bits = mask[w] & cand[w];
        while (bits) {
            int b = __builtin_ctz(bits);
            bits &= bits - 1;
            int r = unique_try(m, (int32_t)(w * 32 + (size_t)b), first_opens);
            if (r < 0)
                return r;
            if (r) {
                mask[w] &= ~(1u << b);
                cnt--;
            }
        }
    }
    return cnt;
}

int grammar_matcher_fill_next_token_bitmask(grammar_matcher *m, uint32_t *mask, size_t n_words)
{
    if (!m || !mask)
        return TERN_EINVAL;
    grammar_compiled *cg = m->cg;
    const grammar_vocab *v = cg->v;
    if (n_words < v->n_words)
        return TERN_ERANGE;
    memset(mask, 0, n_words * sizeof *mask);
    const mstep *st = cur_step(m);
    if (st->terminated)
        return 0;
    int rc = 0;
    int32_t mark = m->pool.n;
    /* group the current stacks by top state */
    if (st->n > m->cap_grp) {
        int64_t *gp = realloc(m->grp, (size_t)st->n * sizeof *gp);
        if (!gp)
            return TERN_ENOMEM;
        m->grp = gp;
        m->cap_grp = st->n;
    }
    const int32_t *ids = m->hist ? m->hist + st->ids_off : NULL; /* no stacks yet: no history */
    for (int32_t i = 0; i < st->n; i++)
        m->grp[i] = ((int64_t)m->pool.state[ids[i]] << 32) | (uint32_t)ids[i];
    if (st->n > 1)
        qsort(m->grp, (size_t)st->n, sizeof *m->grp, cmp_i64);
    size_t nw = v->n_words;
    for (int32_t i = 0; i < st->n;) {
        int32_t s = (int32_t)(m->grp[i] >> 32), j = i;
        while (j < st->n && (int32_t)(m->grp[j] >> 32) == s)
            j++;
        const gctx_entry *e = gcompiled_entry(cg, s);
        if (!e) {
            rc = TERN_ENOMEM;
            goto out;
        }
        or_entry(mask, e, nw);
        if (e->n_pops) {
            /* tokens that leave s's frame: follow each stack's callers */
            for (int32_t k = i; k < j; k++) {
                const gctx_entry *c = e;
                int32_t node = m->pool.parent[(int32_t)(uint32_t)m->grp[k]];
                while (c->n_pops && node >= 0) {
                    int32_t up = m->pool.parent[node];
                    int used2 = 0;
                    c = gcompiled_child(cg, c, m->pool.state[node], up >= 0 ? m->pool.state[up] : -1, &used2);
                    if (!c) {
                        rc = TERN_ENOMEM;
                        goto out;
                    }
                    or_entry(mask, c, nw);
                    node = used2 ? m->pool.parent[up] : up;
                }
            }
        }
        i = j;
    }
    if (st->can_end)
        for (int32_t k = 0; k < v->n_stop; k++)
            mask[v->stop[k] / 32] |= 1u << (v->stop[k] % 32);
    rc = (int)gbits_count(mask, nw);
out:
    gstk_truncate(&m->pool, mark);
    if (rc > 0 && m->uq)
        rc = unique_filter(m, mask, rc);
    return rc;
}

size_t grammar_matcher_find_jump_forward_string(grammar_matcher *m, char *out, size_t cap)
{
    size_t n = 0;
    if (!m || !out || !cap)
        return 0;
    out[0] = 0;
    const grammar *g = m->cg->g;
    if (cur_step(m)->terminated || load_current(m))
        return 0;
    int32_t mark = m->pool.n;
    int first = m->uq ? guq_first(m->uq, &m->pool, &m->a) : 0;
    while (n + 1 < cap && m->a.n && !m->a.can_end) {
        int byte = -1, many = 0;
        for (int32_t k = 0; k < m->a.n && !many; k++) {
            int32_t s = m->pool.state[m->a.ids[k]];
            for (int32_t i = g->be_off[s]; i < g->be_off[s + 1]; i++) {
                const gbyte_edge *e = &g->be[i];
                if (e->lo != e->hi || (byte >= 0 && byte != e->lo)) {
                    many = 1;
                    break;
                }
                byte = e->lo;
            }
        }
        if (many || byte < 0)
            break;
        out[n] = (char)byte; /* uniqueItems / lengths: forced bytes stop before a refused one */
        if (m->uq && guq_try(m->uq, (const uint8_t *)out, n + 1, first) != 0)
            break;
        gstk_step(g, &m->pool, &m->a, (uint8_t)byte, &m->b);
        gstk_set t = m->a;
        m->a = m->b;
        m->b = t;
        if (m->a.oom)
            break;
        out[n++] = (char)byte;
    }
    out[n] = 0;
    gstk_truncate(&m->pool, mark);
    return n;
}
