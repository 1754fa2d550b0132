/* Compiled grammar = grammar x vocabulary, and the lazily filled per-state
 * token sets (gstate_entry, see compiled_int.h). An entry is computed by
 * one walk of the vocabulary trie from the stack [s | unknown], where
 * byte steps go through a memo of interned stack sets (a DFA built on the
 * fly), so a trie node usually costs one table lookup. */
#include <stdlib.h>
#include <string.h>

#include "grammar/bitset.h"
#include "grammar/compiled_int.h"

/* Sets with more stacks than this take no frame steps (frame_pops). */
#define GCOMP_FRAME_MAX_STACKS 64

static uint32_t set_hash(const int32_t *ids, int32_t n)
{
    uint32_t h = 2166136261u;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)ids[i]) * 16777619u;
    return h ^ (h >> 13);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static int sets_grow(grammar_compiled *cg)
{
    int32_t cap = cg->cap_sets ? cg->cap_sets * 2 : 256;
    int32_t *off = realloc(cg->set_off, ((size_t)cap + 1) * sizeof *off);
    if (!off)
        return -1;
    cg->set_off = off;
    int32_t *nx = realloc(cg->set_next, (size_t)cap * sizeof *nx);
    if (!nx)
        return -1;
    cg->set_next = nx;
    if (cap <= 1 << GCOMP_TRANS_SHIFT) {
        int32_t *tr = realloc(cg->trans_pg[0], (size_t)cap * 256 * sizeof *tr);
        if (!tr)
            return -1;
        cg->trans_pg[0] = tr;
    } else {
        /* new pages only: the rows already filled stay where they are */
        int32_t p_end = cap >> GCOMP_TRANS_SHIFT, p_max = GCOMP_MAX_SETS >> GCOMP_TRANS_SHIFT;
        for (int32_t p = cg->cap_sets >> GCOMP_TRANS_SHIFT; p < p_end && p <= p_max; p++)
            if (!cg->trans_pg[p] && !(cg->trans_pg[p] = malloc(((size_t)256 << GCOMP_TRANS_SHIFT) * sizeof(int32_t))))
                return -1;
    }
    uint64_t(*la)[4] = realloc(cg->loop_asc, (size_t)cap * sizeof *la);
    if (!la)
        return -1;
    cg->loop_asc = la;
    uint8_t *lf = realloc(cg->loop_flags, (size_t)cap);
    if (!lf)
        return -1;
    cg->loop_flags = lf;
    int32_t *co = realloc(cg->chain_of, (size_t)cap * sizeof *co);
    if (!co)
        return -1;
    cg->chain_of = co;
    int32_t *uo = realloc(cg->u8_of, (size_t)cap * sizeof *uo);
    if (!uo)
        return -1;
    cg->u8_of = uo;
    uo = realloc(cg->fpop_t, (size_t)cap * sizeof *uo);
    if (!uo)
        return -1;
    cg->fpop_t = uo;
    uint64_t *fm = realloc(cg->fpop_mask, (size_t)cap * sizeof *fm);
    if (!fm)
        return -1;
    cg->fpop_mask = fm;
    int32_t *h = malloc((size_t)cap * 2 * sizeof *h);
    if (!h)
        return -1;
    free(cg->set_heads);
    cg->set_heads = h;
    cg->set_hmask = (uint32_t)cap * 2 - 1;
    memset(h, 0xFF, (size_t)cap * 2 * sizeof *h);
    for (int32_t i = 0; i < cg->n_sets; i++) {
        uint32_t b = set_hash(cg->set_ids + cg->set_off[i], cg->set_off[i + 1] - cg->set_off[i]) & cg->set_hmask;
        cg->set_next[i] = h[b];
        h[b] = i;
    }
    cg->cap_sets = cap;
    return 0;
}

/* Interns the sorted node list ids[0..n); returns the set id or -1. */
static int32_t set_intern(grammar_compiled *cg, const int32_t *ids, int32_t n)
{
    uint32_t hv = set_hash(ids, n);
    if (cg->cap_sets) {
        for (int32_t i = cg->set_heads[hv & cg->set_hmask]; i >= 0; i = cg->set_next[i]) {
            int32_t m = cg->set_off[i + 1] - cg->set_off[i];
            if (m == n && (!n || !memcmp(cg->set_ids + cg->set_off[i], ids, (size_t)n * sizeof *ids)))
                return i;
        }
    }
    if (cg->n_sets >= GCOMP_MAX_SETS)
        return -1;
    if (cg->n_sets == cg->cap_sets && sets_grow(cg))
        return -1;
    if (cg->n_set_ids + (size_t)n > cg->cap_set_ids) {
        size_t cap = cg->cap_set_ids ? cg->cap_set_ids * 2 : 1024;
        while (cap < cg->n_set_ids + (size_t)n)
            cap *= 2;
        int32_t *si = realloc(cg->set_ids, cap * sizeof *si);
        if (!si)
            return -1;
        cg->set_ids = si;
        cg->cap_set_ids = cap;
    }
    int32_t id = cg->n_sets++;
    cg->set_off[id] = (int32_t)cg->n_set_ids;
    if (n)
        memcpy(cg->set_ids + cg->n_set_ids, ids, (size_t)n * sizeof *ids);
    cg->n_set_ids += (size_t)n;
    cg->set_off[id + 1] = (int32_t)cg->n_set_ids;
    memset(gcomp_trans_row(cg, id), 0xFF, 256 * sizeof(int32_t));
    cg->loop_flags[id] = 0;
    cg->chain_of[id] = -1;
    cg->u8_of[id] = -1;
    cg->fpop_t[id] = -1;
    memset(cg->loop_asc[id], 0, sizeof cg->loop_asc[id]);
    uint32_t b = hv & cg->set_hmask;
    cg->set_next[id] = cg->set_heads[b];
    cg->set_heads[b] = id;
    return id;
}

static int reads_byte(const grammar *g, int32_t s, int b);
static void fill_cell(grammar_compiled *cg, int32_t sid, uint8_t byte, int32_t t);

/* The frame pops of byte b in set sid: bit k when stack k, [s | p] with
 * a caller p and s's rule calling none, reads b and [s | unknown] reads
 * it into the empty set with a pop (the frame's rule ends at b: p's
 * closure follows, whatever s was). 0 when no stack is so, -1 when a
 * stack reads b otherwise (or sid has too many stacks), -2 on OOM. Two
 * bytes with the same pops step sid to the same set. */
static int64_t frame_pops(grammar_compiled *cg, int32_t sid, uint8_t b)
{
    const grammar *g = cg->g;
    int32_t n = cg->set_off[sid + 1] - cg->set_off[sid];
    if (n > GCOMP_FRAME_MAX_STACKS)
        return -1;
    uint64_t m = 0;
    for (int32_t k = 0; k < n; k++) {
        int32_t x = cg->set_ids[cg->set_off[sid] + k];
        int32_t s = cg->pool.state[x], p = cg->pool.parent[x];
        if (!reads_byte(g, s, b))
            continue;
        if (p < 0 || cg->rule_calls[g->st_rule[s]])
            return -1;
        int32_t fn = gstk_intern(&cg->pool, s, GSTK_UNKNOWN);
        int32_t f = fn < 0 ? -1 : set_intern(cg, &fn, 1);
        int32_t t = f < 0 ? -1 : gcomp_set_trans(cg, f, b); /* f's stack has no caller: a plain step */
        if (t < 0)
            return -2;
        if (t != 1)
            return -1;
        m |= 1ull << k;
    }
    return (int64_t)(m & INT64_MAX) == (int64_t)m ? (int64_t)m : -1;
}

/* set x byte -> next*2 + popped, or -1 on OOM; a miss fills the byte's
 * whole cell (the bytes no edge of the set's top states tells apart).
 * A byte whose frame pops (frame_pops) equal those of the last byte
 * stepped with frame pops takes that byte's result without a step: the
 * cells of a chain level ([ !], [#-[], []-\x7f]) step once. */
int32_t gcomp_set_trans(grammar_compiled *cg, int32_t sid, uint8_t byte)
{
    int32_t t = gcomp_trans_row(cg, sid)[byte];
    if (t >= 0)
        return t;
    int64_t fp = cg->plain_walk ? 0 : frame_pops(cg, sid, byte);
    if (fp == -2)
        return -1;
    if (fp > 0 && cg->fpop_t[sid] >= 0 && cg->fpop_mask[sid] == (uint64_t)fp) {
        t = cg->fpop_t[sid];
        fill_cell(cg, sid, byte, t);
        cg->stats.frame_steps++;
        return t;
    }
    if (cg->step_cap && cg->stats.steps >= cg->step_cap) {
        cg->step_over = 1; /* a merged child given up (gcompiled_child) */
        return -1;
    }
    gstk_set *in = &cg->tmp_in, *out = &cg->tmp_out;
    int32_t n = cg->set_off[sid + 1] - cg->set_off[sid];
    if (in->cap < n) {
        int32_t *ids = realloc(in->ids, (size_t)n * sizeof *ids);
        if (!ids)
            return -1;
        in->ids = ids;
        in->cap = n;
    }
    if (n)
        memcpy(in->ids, cg->set_ids + cg->set_off[sid], (size_t)n * sizeof *in->ids);
    in->n = n;
    cg->stats.steps++;
    gstk_step(cg->g, &cg->pool, in, byte, out);
    if (out->oom)
        return -1;
    if (out->n > 1)
        qsort(out->ids, (size_t)out->n, sizeof *out->ids, cmp_i32);
    int32_t nid = set_intern(cg, out->ids, out->n);
    if (nid < 0)
        return -1;
    t = nid * 2 + (out->hit_unknown ? 1 : 0);
    if (fp > 0) {
        cg->fpop_t[sid] = t;
        cg->fpop_mask[sid] = (uint64_t)fp;
    }
    fill_cell(cg, sid, byte, t);
    return t;
}

/* Sets t for every byte of the cell around `byte` in sid's row: no edge
 * of the set's top states starts or ends inside it, so every byte of it
 * matches the same edges and steps to the same set. */
static void fill_cell(grammar_compiled *cg, int32_t sid, uint8_t byte, int32_t t)
{
    int32_t n = cg->set_off[sid + 1] - cg->set_off[sid];
    int lo = 0, hi = 255;
    const grammar *g = cg->g;
    const int32_t *ids = cg->set_ids + cg->set_off[sid];
    for (int32_t k = 0; k < n && lo < hi; k++) {
        int32_t st = cg->pool.state[ids[k]];
        for (int32_t i = g->be_off[st]; i < g->be_off[st + 1]; i++) {
            const gbyte_edge *e = &g->be[i];
            if (byte < e->lo) {
                if (e->lo - 1 < hi)
                    hi = e->lo - 1;
            } else if (byte > e->hi) {
                if (e->hi + 1 > lo)
                    lo = e->hi + 1;
            } else {
                if (e->lo > lo)
                    lo = e->lo;
                if (e->hi < hi)
                    hi = e->hi;
            }
        }
    }
    int32_t *row = gcomp_trans_row(cg, sid);
    for (int b = lo; b <= hi; b++)
        row[b] = t;
}

grammar_compiled *grammar_compile(grammar *g, const grammar_vocab *vocab, tern_err *err)
{
    if (!g || !vocab) {
        grammar_free(g);
        tern_err_set(err, TERN_EINVAL, "grammar_compile: no grammar or vocabulary");
        return NULL;
    }
    grammar_compiled *cg = calloc(1, sizeof *cg);
    if (!cg) {
        grammar_free(g);
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    cg->g = g;
    cg->v = vocab;
    /* token sets are shared by repetition copies the vocabulary's
     * tokens cannot tell apart and by states with the same future */
    int rep = g->st_alias && g->alias_horizon >= (long)vocab->max_len;
    if (g->st_equiv && (cg->alias_own = malloc((size_t)(g->n_states ? g->n_states : 1) * sizeof *cg->alias_own))) {
        for (int32_t s = 0; s < g->n_states; s++)
            cg->alias_own[s] = g->st_equiv[rep ? g->st_alias[s] : s];
        cg->alias = cg->alias_own;
    } else if (rep) {
        cg->alias = g->st_alias;
    }
    pthread_mutex_init(&cg->lock, NULL);
    cg->entries = calloc((size_t)(g->n_states ? g->n_states : 1), sizeof *cg->entries);
    cg->scratch_bits = calloc(vocab->n_words ? vocab->n_words : 1, sizeof *cg->scratch_bits);
    cg->scratch_sum = calloc(vocab->n_words / 64 + 1, sizeof *cg->scratch_sum);
    cg->scratch_S = malloc(((size_t)vocab->max_len + 2) * sizeof *cg->scratch_S);
    cg->scratch_pop = calloc((size_t)vocab->max_len + 2, 1);
    cg->sub_ch = malloc(((size_t)vocab->max_len + 2) * sizeof *cg->sub_ch);
    cg->sub_u = malloc((size_t)vocab->max_len + 2);
    cg->sub_lb = malloc(((size_t)vocab->max_len + 2) * sizeof *cg->sub_lb);
    cg->sub_b = malloc((size_t)vocab->max_len + 2);
    cg->rule_calls = calloc((size_t)(g->n_rules ? g->n_rules : 1), 1);
    if (cg->rule_calls)
        for (int32_t st = 0; st < g->n_states; st++)
            if (g->re_off[st] != g->re_off[st + 1])
                cg->rule_calls[g->st_rule[st]] = 1;
    if (!cg->entries || !cg->scratch_bits || !cg->scratch_sum || !cg->scratch_S || !cg->scratch_pop || !cg->sub_ch || !cg->sub_u ||
        !cg->sub_lb || !cg->sub_b || !cg->rule_calls || gstk_pool_init(&cg->pool)) {
        grammar_compiled_free(cg);
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    /* set 0 is the empty set */
    if (set_intern(cg, NULL, 0) != 0) {
        grammar_compiled_free(cg);
        tern_err_set(err, TERN_ENOMEM, "grammar: out of memory");
        return NULL;
    }
    return cg;
}

grammar_compiled *grammar_compile_ebnf(const char *text, size_t len, const grammar_vocab *vocab,
                                       const grammar_limits *limits, tern_err *err)
{
    grammar_limits lim;
    if (limits)
        lim = *limits;
    else
        grammar_limits_init(&lim);
    if (vocab && lim.alias_horizon <= 0)
        lim.alias_horizon = vocab->max_len ? (long)vocab->max_len : 1;
    grammar *g = grammar_from_ebnf(text, len, NULL, &lim, err);
    if (!g)
        return NULL;
    grammar_compiled *cg = grammar_compile(g, vocab, err);
    if (cg && lim.precompute >= 0)
        gcompiled_precompute(cg, lim.precompute ? lim.precompute : GRAMMAR_PRECOMPUTE);
    return cg;
}

static const gctx_entry *child_try(grammar_compiled *cg, const gctx_entry *e, int32_t t);

static inline long long pre_work(const grammar_compiled *cg)
{
    return cg->stats.walk_nodes + cg->stats.class_nodes + GRAMMAR_PRECOMPUTE_STEP * cg->stats.steps;
}

/* Whether state s reads at least GCOMP_PRE_MIN_BYTES byte values. */
static int pre_wide(const grammar *g, int32_t s)
{
    int nb = 0;
    for (int32_t i = g->be_off[s]; i < g->be_off[s + 1] && nb < GCOMP_PRE_MIN_BYTES; i++)
        nb += g->be[i].hi - g->be[i].lo + 1;
    return nb >= GCOMP_PRE_MIN_BYTES;
}

/* The closure of stack x into cl: -1 on OOM. */
static int pre_close(grammar_compiled *cg, int32_t x, gstk_set *cl)
{
    if (x < 0)
        return -1;
    gstk_set_clear(cl);
    gstk_begin(&cg->pool);
    gstk_closure(cg->g, &cg->pool, x, cl);
    return cl->oom ? -1 : 0;
}

/* What a mask of the set cl needs: every stack's top entry and its
 * chain of children (the matcher's), up to the unknown caller; above it
 * the child is only tried (a mask that knows the caller's caller merges
 * a heavy one, see gcompiled_child). */
static void pre_masks(grammar_compiled *cg, const gstk_set *cl)
{
    for (int32_t k = 0; k < cl->n; k++) {
        int32_t id = cl->ids[k];
        const gctx_entry *c = gcompiled_entry(cg, cg->pool.state[id]);
        int32_t node = c ? cg->pool.parent[id] : -1;
        while (c && c->n_pops && node >= 0) {
            int32_t up = cg->pool.parent[node];
            if (up < 0) {
                (void)child_try(cg, c, cg->pool.state[node]);
                break;
            }
            int used2 = 0;
            c = gcompiled_child(cg, c, cg->pool.state[node], cg->pool.state[up], &used2);
            node = used2 ? cg->pool.parent[up] : up;
        }
    }
}

/* The return state of stack x's caller, -1 for none (the unknown
 * bottom). */
static inline int32_t pre_caller(const grammar_compiled *cg, int32_t x)
{
    int32_t p = cg->pool.parent[x];
    return p >= 0 ? cg->pool.state[p] : -1;
}

/* Whether the set holds at least GCOMP_PRE_MIN_TOPS distinct (top,
 * caller) pairs - a top state per name, or the whitespace before the
 * next optional property in a hundred callers at once - counted
 * cheaply. */
static int pre_wide_set(const grammar_compiled *cg, const gstk_set *cl)
{
    int32_t tops = 0;
    for (int32_t k = 0; k < cl->n && tops < GCOMP_PRE_MIN_TOPS; k++) {
        int32_t s = cg->pool.state[cl->ids[k]], u = pre_caller(cg, cl->ids[k]), seen = 0;
        for (int32_t q = 0; q < k && !seen; q++)
            seen = cg->pool.state[cl->ids[q]] == s && pre_caller(cg, cl->ids[q]) == u;
        tops += !seen;
    }
    return tops >= GCOMP_PRE_MIN_TOPS;
}

/* Hashes of the wide sets one byte after a wide closure already done
 * (open addressing, 0 = empty; a collision only skips a cache fill). */
typedef struct pre_seen {
    uint64_t *h;
    size_t n, cap;
} pre_seen;

/* 1 when the sorted set was seen (else it is recorded), -1 on OOM. */
static int pre_seen_put(pre_seen *ps, const int32_t *ids, int32_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int32_t i = 0; i < n; i++)
        h = (h ^ (uint32_t)ids[i]) * 0x100000001B3ull;
    h |= 1;
    if ((ps->n + 1) * 2 > ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 256;
        uint64_t *nh = calloc(cap, sizeof *nh);
        if (!nh)
            return -1;
        for (size_t i = 0; i < ps->cap; i++) {
            if (!ps->h[i])
                continue;
            size_t j = ps->h[i] & (cap - 1);
            while (nh[j])
                j = (j + 1) & (cap - 1);
            nh[j] = ps->h[i];
        }
        free(ps->h);
        ps->h = nh;
        ps->cap = cap;
    }
    size_t j = h & (ps->cap - 1);
    for (; ps->h[j]; j = (j + 1) & (ps->cap - 1))
        if (ps->h[j] == h)
            return 1;
    ps->h[j] = h;
    ps->n++;
    return 0;
}

/* The masks one byte after the wide set cl: for each byte cell its top
 * states read (bytes no edge tells apart step alike), the stepped set
 * when it is wide too - the separator read before the next name (after
 * ',' the whitespace in front of every remaining optional property,
 * after '"' the names' second states). Returns the closure work. */
static long long pre_next(grammar_compiled *cg, const gstk_set *cl, gstk_set *nx, pre_seen *ps)
{
    const grammar *g = cg->g;
    long long cw = 0;
    uint64_t rd[4] = {0, 0, 0, 0}; /* bytes some top state reads */
    for (int32_t k = 0; k < cl->n; k++) {
        int32_t st = cg->pool.state[cl->ids[k]];
        for (int32_t i = g->be_off[st]; i < g->be_off[st + 1]; i++)
            for (int b = g->be[i].lo; b <= g->be[i].hi; b++)
                rd[b >> 6] |= 1ull << (b & 63);
    }
    for (int b = 0; b < 256; b++) {
        if (!((rd[b >> 6] >> (b & 63)) & 1))
            continue;
        int hi = 255;
        for (int32_t k = 0; k < cl->n; k++) {
            int32_t st = cg->pool.state[cl->ids[k]];
            for (int32_t i = g->be_off[st]; i < g->be_off[st + 1]; i++) {
                const gbyte_edge *e = &g->be[i];
                if (b < e->lo && e->lo - 1 < hi)
                    hi = e->lo - 1;
                else if (b >= e->lo && b <= e->hi && e->hi < hi)
                    hi = e->hi;
            }
        }
        gstk_step(g, &cg->pool, cl, (uint8_t)b, nx);
        cw += cl->n + nx->n;
        b = hi; /* the rest of the cell steps alike */
        if (nx->oom || nx->overflow || !pre_wide_set(cg, nx))
            continue;
        if (nx->n > 1)
            qsort(nx->ids, (size_t)nx->n, sizeof *nx->ids, cmp_i32);
        int r = pre_seen_put(ps, nx->ids, nx->n);
        if (r < 0)
            break;
        if (!r)
            pre_masks(cg, nx);
    }
    return cw;
}

/* The masks of wide choices: for every state p that calls a rule, the
 * closure of [p | unknown]; when it holds at least GCOMP_PRE_MIN_TOPS
 * (top, caller) pairs (an object's property names), what a mask of it
 * needs, and of the wide sets one byte further. 0 done, 1 budget
 * spent. */
static int pre_choices(grammar_compiled *cg, long budget, long long w0)
{
    const grammar *g = cg->g;
    gstk_set cl = {0}, nx = {0};
    pre_seen ps = {0};
    int rc = 0;
    long long cw = 0; /* closure work */
    for (int32_t p = 0; p < g->n_states && !rc; p++) {
        if (g->re_off[p] == g->re_off[p + 1])
            continue;
        if (pre_work(cg) - w0 + cw >= budget || ((p & 15) == 0 && grammar_thread_stopped())) {
            rc = 1;
            break;
        }
        if (pre_close(cg, gstk_intern(&cg->pool, p, GSTK_UNKNOWN), &cl))
            break;
        cw += cl.n;
        if (!pre_wide_set(cg, &cl))
            continue;
        pre_masks(cg, &cl);
        cw += pre_next(cg, &cl, &nx, &ps);
    }
    gstk_set_free(&cl);
    gstk_set_free(&nx);
    free(ps.h);
    return rc;
}

/* The chain (compiled_chain.c) of the set [t | unknown] closes to, which
 * the children continuing a character rule's pops in t walk from. The
 * children of the first copies may all be shared hits (another grammar
 * computed them), leaving this grammar without the chain's sets: the
 * first copy's child computed in a mask then verified it level by level
 * (~3,000 parser steps for a string's 250 levels); the later copies' sets
 * are its levels, so their chains cost few steps. -1 on OOM. */
static int pre_chain(grammar_compiled *cg, int32_t x, gstk_set *cl)
{
    int r = -1;
    pthread_mutex_lock(&cg->lock);
    if (!pre_close(cg, x, cl)) {
        if (cl->n > 1)
            qsort(cl->ids, (size_t)cl->n, sizeof *cl->ids, cmp_i32);
        int32_t sid = set_intern(cg, cl->ids, cl->n);
        r = sid < 0 || gcomp_chain_warm(cg, sid) < 0 ? -1 : 0;
    }
    pthread_mutex_unlock(&cg->lock);
    return r;
}

/* The first character of a called character rule (a maxLength string's
 * copies, a pattern's rule per state): for a call of rule R returning to
 * a state t whose own closure reads a wide class, what a mask of [R's
 * start | t | unknown] needs - the children continuing the character's
 * pops in t (the first GCOMP_PRE_CALLS such calls of each calling rule:
 * the first copies of a repetition). 1 when the budget is spent. */
static int pre_calls(grammar_compiled *cg, long budget, long long w0)
{
    const grammar *g = cg->g;
    gstk_set cl = {0};
    int rc = 0;
    long long cw = 0;
    int32_t rule = -1, done = 0, n = 0;
    for (int32_t p = 0; p < g->n_states && !rc; p++) {
        if (g->st_rule[p] != rule)
            rule = g->st_rule[p], done = 0;
        for (int32_t i = g->re_off[p]; i < g->re_off[p + 1] && done < GCOMP_PRE_CALLS; i++) {
            int32_t t = g->re[i].target;
            if (g->st_final[t] && g->be_off[t] == g->be_off[t + 1] && g->re_off[t] == g->re_off[t + 1])
                continue; /* a tail call: t is not on the stack */
            if (cg->alias && cg->alias[t] != t)
                continue;
            if (pre_work(cg) - w0 + cw >= budget || ((++n & 15) == 0 && grammar_thread_stopped())) {
                rc = 1;
                break;
            }
            if (pre_close(cg, gstk_intern(&cg->pool, t, GSTK_UNKNOWN), &cl))
                goto out;
            cw += cl.n;
            int wide = 0;
            for (int32_t k = 0; k < cl.n && !wide; k++)
                wide = pre_wide(g, cg->pool.state[cl.ids[k]]);
            if (!wide)
                continue;
            done++;
            int32_t below = gstk_intern(&cg->pool, t, GSTK_UNKNOWN);
            if (below < 0 || pre_close(cg, gstk_intern(&cg->pool, g->rule_start[g->re[i].rule], below), &cl))
                goto out;
            cw += cl.n;
            pre_masks(cg, &cl);
            if (pre_chain(cg, below, &cl))
                goto out;
        }
    }
out:
    gstk_set_free(&cl);
    return rc;
}

/* The states whose walks visit most of the trie read many bytes: a
 * string's contents, free text, an unanchored pattern's search, a wide
 * class. Their entries are computed now, while the work (trie nodes
 * walked and split, parser steps) stays within budget; the rest stay
 * lazy. The rules take turns, one state each, so the copies of one long
 * repetition do not spend the budget of the others. Shared entries
 * (structural keys) cost a lookup. Only a cache is filled: masks are the
 * same either way. */
void gcompiled_precompute(grammar_compiled *cg, long budget)
{
    const grammar *g = cg->g;
    int32_t nr = g->n_rules, n = 0;
    int32_t *cnt = calloc((size_t)nr + 1, sizeof *cnt), *pos = malloc((size_t)nr * sizeof *pos);
    int32_t *st = malloc((size_t)(g->n_states ? g->n_states : 1) * sizeof *st);
    if (!cnt || !pos || !st)
        goto out;
    for (int32_t s = 0; s < g->n_states; s++) {
        if ((!cg->alias || cg->alias[s] == s) && pre_wide(g, s))
            cnt[g->st_rule[s] + 1]++;
    }
    for (int32_t r = 0; r < nr; r++)
        cnt[r + 1] += cnt[r];
    memcpy(pos, cnt, (size_t)nr * sizeof *pos);
    for (int32_t s = 0; s < g->n_states; s++) {
        if ((!cg->alias || cg->alias[s] == s) && pre_wide(g, s))
            st[pos[g->st_rule[s]]++] = s;
    }
    n = cnt[nr];
    long long w0 = pre_work(cg);
    /* first the masks of wide choices (an object's property names: the
     * closure of its start holds a top state per name, and a mask there
     * walked them all, with their children, at once) */
    if (pre_choices(cg, budget, w0))
        goto out;
    /* then the first characters of called character rules, within a
     * quarter of the budget: the rounds below can spend all of it on one
     * long repetition's states */
    (void)pre_calls(cg, budget / 4, pre_work(cg));
    /* round k takes the k-th state of every rule that has one */
    for (int32_t k = 0, left = n; left > 0; k++) {
        for (int32_t r = 0; r < nr; r++) {
            if (cnt[r] + k >= cnt[r + 1])
                continue;
            left--;
            if (pre_work(cg) - w0 >= budget || ((left & 15) == 0 && grammar_thread_stopped()))
                goto out;
            if (!gcompiled_entry(cg, st[cnt[r] + k]))
                goto out; /* OOM: the masks will say so */
        }
    }
    (void)pre_calls(cg, budget, w0);
out:
    free(cnt);
    free(pos);
    free(st);
}

void gctx_entry_free(gctx_entry *e)
{
    if (!e)
        return;
    free(e->acc_bits);
    free(e->acc_ids);
    free(e->pops);
    free(e);
}

void grammar_compiled_free(grammar_compiled *cg)
{
    if (!cg)
        return;
    for (size_t i = 0; i < cg->n_owned; i++)
        gctx_entry_free(cg->owned[i]);
    free(cg->owned);
    free(cg->alias_own);
    free(cg->lkeys);
    free(cg->children);
    free(cg->entries);
    gstk_pool_free(&cg->pool);
    free(cg->set_off);
    free(cg->set_ids);
    free(cg->set_heads);
    free(cg->set_next);
    for (size_t p = 0; p < sizeof cg->trans_pg / sizeof *cg->trans_pg; p++)
        free(cg->trans_pg[p]);
    free(cg->loop_asc);
    free(cg->loop_flags);
    free(cg->chain_of);
    free(cg->u8_of);
    free(cg->fpop_t);
    free(cg->fpop_mask);
    free(cg->rule_calls);
    free(cg->u8_tab);
    free(cg->chains);
    free(cg->chain_sets);
    gstk_set_free(&cg->tmp_in);
    gstk_set_free(&cg->tmp_out);
    free(cg->scratch_bits);
    free(cg->scratch_sum);
    free(cg->scratch_S);
    free(cg->scratch_pop);
    free(cg->sub_ch);
    free(cg->sub_u);
    free(cg->sub_lb);
    free(cg->sub_b);
    free(cg->scratch_pops);
    pthread_mutex_destroy(&cg->lock);
    grammar_free(cg->g);
    free(cg);
}

const grammar *grammar_compiled_grammar(const grammar_compiled *cg) { return cg->g; }
const grammar_vocab *grammar_compiled_vocab(const grammar_compiled *cg) { return cg->v; }

void grammar_compiled_stats_get(const grammar_compiled *cg, grammar_compiled_stats *out)
{
    *out = cg->stats;
}

/* ---- entry computation ---------------------------------------------------- */

static int add_pop(grammar_compiled *cg, int32_t node)
{
    if (cg->pop_cap && cg->n_scratch_pops >= cg->pop_cap) {
        cg->pop_over = 1; /* a child walk given up (gcompiled_child) */
        return -1;
    }
    if (cg->n_scratch_pops == cg->cap_scratch_pops) {
        int32_t cap = cg->cap_scratch_pops ? cg->cap_scratch_pops * 2 : 256;
        int32_t *np = realloc(cg->scratch_pops, (size_t)cap * sizeof *np);
        if (!np)
            return -1;
        cg->scratch_pops = np;
        cg->cap_scratch_pops = cap;
    }
    cg->scratch_pops[cg->n_scratch_pops++] = node;
    return 0;
}

/* ---- loop skip -------------------------------------------------------------
 * String contents and free-text loops read almost every token, so a plain
 * walk visits the whole trie (~270k nodes for Llama 3, 2-3 ms) for each
 * such state. But when the set X at a node reached at a character
 * boundary reads every ASCII byte found below the node back to X itself
 * without popping, and (if non-ASCII bytes occur below) every strict UTF-8
 * character back to X through non-empty sets without popping, then every
 * token below is accepted and none pops: the walk takes them all at once
 * from the preorder token list and skips the subtree. Exact: it is the
 * result the node-by-node walk would reach. */

/* Subtrees smaller than this are walked node by node. */
#define GCOMP_SKIP_MIN_NODES 1
/* Bound on (set, UTF-8 state) pairs one set's character table explores;
 * past it the remaining lead bytes count as mixed (never wrong: a lead
 * byte left out of a class only makes its characters frontier bytes). */
#define GCOMP_UTF8_MAX_PAIRS 256

typedef struct u8_pair {
    int32_t set, res;
    int8_t u;
} u8_pair;

typedef struct u8_memo {
    u8_pair p[GCOMP_UTF8_MAX_PAIRS];
    int n;
} u8_memo;

#define GU8_OOM (-3)
/* not decided yet (u8_fill) */
#define GU8_UNDECIDED (-5)

/* Where the characters continuing from set y in UTF-8 state u (1-7) all
 * lead: z > 0 when every one reaches z through non-empty sets without a
 * pop, else GU8_MIXED (GU8_OOM on OOM). Depth first, at most three
 * levels, memoized per (set, state) for one table. */
static int32_t u8_cont(grammar_compiled *cg, u8_memo *mm, int32_t y, int u)
{
    for (int k = 0; k < mm->n; k++)
        if (mm->p[k].set == y && mm->p[k].u == u)
            return mm->p[k].res;
    if (mm->n == GCOMP_UTF8_MAX_PAIRS)
        return GU8_MIXED;
    /* the continuation bytes state u accepts, and the state after them */
    static const uint8_t lo[8] = {0, 0x80, 0x80, 0x80, 0xA0, 0x80, 0x90, 0x80};
    static const uint8_t hi[8] = {0, 0xBF, 0xBF, 0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
    static const int8_t nx[8] = {0, 0, 1, 2, 1, 1, 2, 2};
    int32_t z = 0, prev = -1;
    int nu = nx[u];
    for (int b = lo[u]; b <= hi[u] && z != GU8_MIXED; b++) {
        int32_t t = gcomp_trans_row(cg, y)[b];
        if (t < 0 && (t = gcomp_set_trans(cg, y, (uint8_t)b)) < 0)
            return GU8_OOM;
        if (t == prev)
            continue; /* the byte cells: runs of bytes step alike */
        prev = t;
        int32_t r;
        if ((t & 1) || !(t >> 1))
            r = GU8_MIXED;
        else if (nu == 0)
            r = t >> 1;
        else if ((r = u8_cont(cg, mm, t >> 1, nu)) == GU8_OOM)
            return GU8_OOM;
        z = r < 0 || (z && z != r) ? GU8_MIXED : r;
    }
    if (mm->n < GCOMP_UTF8_MAX_PAIRS)
        mm->p[mm->n++] = (u8_pair){.set = y, .res = z, .u = (int8_t)u};
    return z;
}

/* Fills the entries of res[GU8_LEADS] still GU8_UNDECIDED for set x:
 * per strict lead byte, GU8_DEAD when it steps x to the empty set
 * without a pop, else where its characters lead (u8_cont). -1 on OOM. */
static int u8_fill(grammar_compiled *cg, int32_t x, int32_t res[GU8_LEADS])
{
    u8_memo memo, *mm = &memo;
    mm->n = 0;
    for (int b = 0xC0; b < 0xC0 + GU8_LEADS; b++) {
        if (res[b - 0xC0] != GU8_UNDECIDED)
            continue;
        int u = gvoc_utf8_next(0, (uint8_t)b);
        if (u <= 0) {
            res[b - 0xC0] = GU8_MIXED; /* never a strict lead byte */
            continue;
        }
        int32_t t = gcomp_set_trans(cg, x, (uint8_t)b);
        if (t < 0)
            return -1;
        if (t == 0)
            res[b - 0xC0] = GU8_DEAD;
        else if ((t & 1) || !(t >> 1))
            res[b - 0xC0] = GU8_MIXED;
        else if ((res[b - 0xC0] = u8_cont(cg, mm, t >> 1, u)) == GU8_OOM)
            return -1;
    }
    return 0;
}

/* Appends a table to u8_tab; its offset, or -1 on OOM. */
static int32_t u8_store(grammar_compiled *cg, const int32_t res[GU8_LEADS])
{
    if (cg->n_u8_tab + GU8_LEADS > cg->cap_u8_tab) {
        size_t cap = cg->cap_u8_tab ? cg->cap_u8_tab * 2 : (size_t)GU8_LEADS * 64;
        int32_t *nt = realloc(cg->u8_tab, cap * sizeof *nt);
        if (!nt)
            return -1;
        cg->u8_tab = nt;
        cg->cap_u8_tab = cap;
    }
    int32_t off = (int32_t)cg->n_u8_tab;
    memcpy(cg->u8_tab + off, res, GU8_LEADS * sizeof *res);
    cg->n_u8_tab += GU8_LEADS;
    return off;
}

/* Whether state s has a byte edge reading b. */
static int reads_byte(const grammar *g, int32_t s, int b)
{
    for (int32_t i = g->be_off[s]; i < g->be_off[s + 1]; i++)
        if (b >= g->be[i].lo && b <= g->be[i].hi)
            return 1;
    return 0;
}

/* x's character table (computed on first use): per strict UTF-8 lead
 * byte b, at [b - 0xC0], the set z > 0 every character it begins leads
 * x to through non-empty sets without a pop, GU8_DEAD when b itself
 * steps x to the empty set without a pop, else GU8_MIXED. One
 * exploration per set replaces a check per (set, target, lead bytes):
 * loops, classes and every level of every chain ask it. NULL on OOM. */
const int32_t *gcomp_utf8_table(grammar_compiled *cg, int32_t x)
{
    if (cg->u8_of[x] >= 0)
        return cg->u8_tab + cg->u8_of[x];
    int32_t res[GU8_LEADS];
    for (int i = 0; i < GU8_LEADS; i++)
        res[i] = GU8_UNDECIDED;
    if (u8_fill(cg, x, res))
        return NULL;
    int32_t off = u8_store(cg, res);
    if (off < 0)
        return NULL;
    cg->u8_of[x] = off; /* indexed after the steps: the sets may have moved */
    return cg->u8_tab + off;
}

/* Every strict UTF-8 character whose lead byte b has bit b - 0xC0 in
 * lead leads x to l through non-empty sets without a pop: 1 yes, 0 no,
 * -1 OOM. */
int gcomp_utf8_reaches(grammar_compiled *cg, int32_t x, int32_t l, uint64_t lead)
{
    const int32_t *tab = gcomp_utf8_table(cg, x);
    if (!tab)
        return -1;
    for (uint64_t m = lead & GVOC_LEAD_ALL; m; m &= m - 1)
        if (tab[__builtin_ctzll(m)] != l)
            return 0;
    return 1;
}

/* Whether the subtree below trie node i is read entirely by looping on
 * set x (see above): 1 yes, 0 no, -1 OOM. */
static int loop_covers(grammar_compiled *cg, int32_t x, int32_t i)
{
    const grammar_vocab *v = cg->v;
    /* cg->loop_asc moves when set_trans interns a set: index it afresh */
    const uint64_t *need = v->nsk_asc[i];
    if ((need[0] & cg->loop_asc[x][2]) || (need[1] & cg->loop_asc[x][3]))
        return 0; /* a byte below is known to leave x */
    for (int w = 0; w < 2; w++) {
        for (uint64_t m = need[w] & ~cg->loop_asc[x][w]; m; m &= m - 1) {
            int b = w * 64 + __builtin_ctzll(m);
            int32_t t = gcomp_set_trans(cg, x, (uint8_t)b);
            if (t < 0)
                return -1;
            if (t != x * 2) {
                cg->loop_asc[x][2 + w] |= 1ull << (b & 63);
                return 0;
            }
            cg->loop_asc[x][w] |= 1ull << (b & 63);
        }
    }
    if (!(v->nsk_flags[i] & GVOC_SK_DESC_NONASCII))
        return 1;
    return gcomp_utf8_reaches(cg, x, x, GVOC_LEAD_ALL);
}

/* Fills every ASCII bit of x's loop mask (its UTF-8 characters are asked
 * only where a class needs them); -1 on OOM. */
static int loop_fill(grammar_compiled *cg, int32_t x)
{
    for (int b = 0; b < 128; b++) {
        uint64_t bit = 1ull << (b & 63);
        if ((cg->loop_asc[x][b >> 6] | cg->loop_asc[x][2 + (b >> 6)]) & bit)
            continue;
        int32_t t = gcomp_set_trans(cg, x, (uint8_t)b);
        if (t < 0)
            return -1;
        cg->loop_asc[x][(t == x * 2 ? 0 : 2) + (b >> 6)] |= bit; /* indexed after set_trans: it may move */
    }
    cg->loop_flags[x] |= GLOOP_ASC_FULL;
    return 0;
}

/* Root bytes of the loop's class that x reads elsewhere, beyond which
 * the root walk narrows the class instead (see root_loop). */
#define GCOMP_ROOT_EX_MAX 24
/* Sets between x and the loop at the root (see root_loop). */
#define GCOMP_ROOT_HOPS 3

static const char root_probe[] = "etaoinsrhldcumfpgwybvkxjqzETAOINS0123456789";

/* The set the probe letters lead x to first without a pop: > 0, 0 none,
 * -1 OOM. */
static int32_t probe_next(grammar_compiled *cg, int32_t x)
{
    for (const char *p = root_probe; *p; p++) {
        int32_t t = gcomp_set_trans(cg, x, (uint8_t)*p);
        if (t < 0)
            return -1;
        if (!(t & 1) && (t >> 1))
            return t >> 1;
    }
    return 0;
}

/* The looping set the walk from x enters at the root, and the class to
 * use: x itself when it loops on some ASCII byte (n_hop 0); else the sets
 * hop[1..n_hop] the probe letters lead x through, one character each, to
 * one that loops (a string's first character after its quote, a second
 * state after the first repetition). Then the class is the loop's own
 * (cached for every grammar whose strings read the same bytes): every
 * set between x and the loop must read all of it into the next, and the
 * first bytes of it that x reads elsewhere are returned in ex (ASCII
 * ex[0..1], lead bytes ex[2], bit b - 0xC0): the walk takes those root
 * subtrees from x node by node. When they are many and the loop is one
 * character away, the class is narrowed to the bytes that lead x to it
 * instead (and to no non-ASCII character unless every one leads x there
 * and the loop reads them all), ex empty. 1 found, 0 none, -1 OOM. */
static int root_loop(grammar_compiled *cg, int32_t x, int32_t hop[GCOMP_ROOT_HOPS + 1], int *n_hop, uint64_t cls[2],
                     int *utf8, uint64_t ex[3])
{
    ex[0] = ex[1] = ex[2] = 0;
    hop[0] = x;
    *n_hop = 0;
    if (!(cg->loop_flags[x] & GLOOP_ASC_FULL) && loop_fill(cg, x))
        return -1;
    if (cg->loop_asc[x][0] || cg->loop_asc[x][1]) {
        cls[0] = cg->loop_asc[x][0], cls[1] = cg->loop_asc[x][1];
        *utf8 = gcomp_utf8_reaches(cg, x, x, GVOC_LEAD_ALL);
        return *utf8 < 0 ? -1 : 1;
    }
    /* the successors of the printable letters and digits decide */
    int n = 0;
    int32_t l = x;
    for (;;) {
        if (n == GCOMP_ROOT_HOPS)
            return 0;
        int32_t y = probe_next(cg, l);
        if (y <= 0)
            return y < 0 ? -1 : 0;
        hop[++n] = l = y;
        if (!(cg->loop_flags[l] & GLOOP_ASC_FULL) && loop_fill(cg, l))
            return -1;
        if (cg->loop_asc[l][0] || cg->loop_asc[l][1])
            break;
    }
    int ul = gcomp_utf8_reaches(cg, l, l, GVOC_LEAD_ALL);
    if (ul < 0)
        return -1;
    uint64_t la[2] = {cg->loop_asc[l][0], cg->loop_asc[l][1]};
    /* the sets between read the whole class into the next */
    for (int i = 1; i < n; i++) {
        for (int w = 0; w < 2; w++) {
            for (uint64_t m = la[w]; m; m &= m - 1) {
                int32_t t = gcomp_set_trans(cg, hop[i], (uint8_t)(w * 64 + __builtin_ctzll(m)));
                if (t < 0)
                    return -1;
                if (t != hop[i + 1] * 2)
                    return 0;
            }
        }
        int r = ul ? gcomp_utf8_reaches(cg, hop[i], hop[i + 1], GVOC_LEAD_ALL) : 1;
        if (r <= 0)
            return r;
    }
    uint64_t c[2] = {0, 0};
    for (int w = 0; w < 2; w++) {
        for (uint64_t m = la[w]; m; m &= m - 1) {
            int b = w * 64 + __builtin_ctzll(m);
            int32_t t = gcomp_set_trans(cg, x, (uint8_t)b);
            if (t < 0)
                return -1;
            if (t == hop[1] * 2)
                c[w] |= 1ull << (b & 63);
        }
    }
    if (!c[0] && !c[1])
        return 0;
    uint64_t e0 = la[0] & ~c[0], e1 = la[1] & ~c[1];
    *n_hop = n;
    if (__builtin_popcountll(e0) + __builtin_popcountll(e1) <= GCOMP_ROOT_EX_MAX) {
        cls[0] = la[0], cls[1] = la[1];
        ex[0] = e0, ex[1] = e1;
        *utf8 = ul;
        if (ul) {
            const int32_t *tab = gcomp_utf8_table(cg, x);
            if (!tab)
                return -1;
            for (uint64_t m = GVOC_LEAD_ALL; m; m &= m - 1)
                if (tab[__builtin_ctzll(m)] != hop[1])
                    ex[2] |= m & -m;
        }
        return 1;
    }
    if (n > 1)
        return 0;
    /* every character must lead x to l, and l back to itself */
    int u = ul ? gcomp_utf8_reaches(cg, x, l, GVOC_LEAD_ALL) : 0;
    if (u < 0)
        return -1;
    cls[0] = c[0], cls[1] = c[1];
    *utf8 = u;
    return 1;
}

/* The walk of [lo, hi) from set x through a loop class (vocab_class.c):
 * when the range is the whole trie and x reads the class's characters
 * into a set l that reads them back to itself (l may be x), or the range
 * is the subtree of a node whose path stays in x's own loop class, the
 * runs' tokens are accepted as they are (they never pop nor empty the
 * set) and only the frontier subtrees are walked, from x or l after the
 * pending bytes of an unfinished character. 1 done, 0 not applicable,
 * -1 OOM / bound. */
static int class_walk(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t x)
{
    grammar_vocab *v = (grammar_vocab *)cg->v;
    if (!x || hi - lo < GCOMP_CLASS_MIN_NODES)
        return 0;
    int32_t hop[GCOMP_ROOT_HOPS + 1] = {x};
    int n_hop = 0;
    uint64_t cls[2] = {0, 0}, ex[3] = {0, 0, 0};
    int utf8 = 0;
    const gvoc_class *c;
    int32_t j = lo - 1;
    if (base == 0) {
        if (lo != 0 || hi != v->n_nodes)
            return 0;
        int r = root_loop(cg, x, hop, &n_hop, cls, &utf8, ex);
        if (r <= 0)
            return r;
        if (!(c = gvoc_class_get(v, cls, utf8 ? GVOC_LEAD_ALL : 0, &cg->stats)))
            return 0;
    } else {
        if (j < 0 || v->nd[j] != base || v->nend[j] != hi || !(v->nsk_flags[j] & GVOC_SK_BOUNDARY))
            return 0;
        if (!(cg->loop_flags[x] & GLOOP_ASC_FULL) && loop_fill(cg, x))
            return -1;
        cls[0] = cg->loop_asc[x][0], cls[1] = cg->loop_asc[x][1];
        if (!cls[0] && !cls[1])
            return 0;
        if ((utf8 = gcomp_utf8_reaches(cg, x, x, GVOC_LEAD_ALL)) < 0)
            return -1;
        if (!(c = gvoc_class_get(v, cls, utf8 ? GVOC_LEAD_ALL : 0, &cg->stats)) || !gvoc_class_path_in(v, c, j))
            return 0;
    }
    cg->stats.class_walks++;
    uint32_t *bits = cg->scratch_bits;
    uint64_t *sum = cg->scratch_sum;
    int32_t a = 0, b = c->n_items;
    const int32_t *ntok = v->ntok, *ntok_off = v->ntok_off;
    /* root subtrees of bytes x reads elsewhere: [exr[2k], exr[2k+1]) */
    int32_t exr[2 * 256];
    int n_ex = 0;
    if (base == 0) {
        gbits_or(bits, c->run_bits, v->n_words);
        cg->scratch_full = 1;
        for (int32_t i = 0; (ex[0] | ex[1] | ex[2]) && i < v->n_nodes; i = v->nend[i]) {
            uint8_t by = v->nb[i];
            if (by < 128 ? !((ex[by >> 6] >> (by & 63)) & 1) : by < 0xC0 || !((ex[2] >> (by - 0xC0)) & 1))
                continue;
            for (int32_t q = ntok_off[i]; q < ntok_off[v->nend[i]]; q++)
                bits[ntok[q] >> 5] &= ~(1u << (ntok[q] & 31)); /* the scratch held nothing else */
            exr[2 * n_ex] = i, exr[2 * n_ex + 1] = v->nend[i], n_ex++;
        }
    } else {
        /* the first item that ends at or after lo */
        while (a < b) {
            int32_t mid = a + (b - a) / 2;
            if (c->items[mid].last < lo)
                a = mid + 1;
            else
                b = mid;
        }
    }
    int e = 0;
    for (int32_t k = a; k < c->n_items && c->items[k].first < hi; k++) {
        const gvoc_item *it = &c->items[k];
        if (!it->frontier) {
            if (base == 0)
                continue;
            int32_t f0 = it->first > lo ? it->first : lo, f1 = it->last + 1 < hi ? it->last + 1 : hi;
            int32_t q1 = ntok_off[f1];
            for (int32_t q = ntok_off[f0]; q < q1; q++)
                gscratch_set(bits, sum, ntok[q]);
            continue;
        }
        while (e < n_ex && exr[2 * e + 1] <= it->first)
            e++;
        if (e < n_ex && exr[2 * e] <= it->first)
            continue; /* walked from x below */
        int32_t y = hop[it->nch < n_hop ? it->nch : n_hop];
        for (int p = 0; p < it->n_pend && y; p++) {
            int32_t t = gcomp_set_trans(cg, y, it->pend[p]);
            if (t < 0)
                return -1;
            y = t >> 1; /* inside the class: never a pop */
        }
        if (y && gcomp_walk_from(cg, it->first, v->nend[it->first], v->nd[it->first] - 1, y, 0))
            return -1;
    }
    for (int k = 0; k < n_ex; k++)
        if (gcomp_walk_from(cg, exr[2 * k], exr[2 * k + 1], 0, x, 0))
            return -1;
    return 1;
}

/* Walks vocab trie nodes [lo, hi) (a preorder range whose nodes sit
 * below depth `base`) from interned set sid0 (at depth base). Accepted
 * tokens go to scratch_bits; nodes where the frame pops with descendants
 * left go to scratch_pops. 0 or -1 (OOM / bound). */
int gcomp_walk(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t sid0)
{
    return gcomp_walk_from(cg, lo, hi, base, sid0, 1);
}

int gcomp_walk_from(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t sid0, int whole)
{
    const grammar_vocab *v = cg->v;
    int32_t *S = cg->scratch_S;
    uint8_t *pop = cg->scratch_pop;
    uint32_t *bits = cg->scratch_bits;
    uint64_t *sum = cg->scratch_sum;
    int r = cg->plain_walk || !whole ? 0 : class_walk(cg, lo, hi, base, sid0);
    if (!r && !cg->plain_walk && whole)
        r = gcomp_count_walk(cg, lo, hi, base, sid0);
    if (r)
        return r < 0 ? -1 : 0;
    S[base] = sid0;
    for (int32_t i = lo; i < hi;) {
        int32_t d = v->nd[i];
        cg->stats.walk_nodes++;
        int32_t t = gcomp_set_trans(cg, S[d - 1], v->nb[i]);
        if (t < 0)
            return -1;
        int32_t cur = t >> 1;
        S[d] = cur;
        pop[d] = (uint8_t)(t & 1);
        if (cur || pop[d])
            for (int32_t k = v->ntok_off[i]; k < v->ntok_off[i + 1]; k++)
                gscratch_set(bits, sum, v->ntok[k]);
        if (pop[d] && v->nend[i] > i + 1 && add_pop(cg, i))
            return -1;
        if (cg->plain_walk) {
            i = cur ? i + 1 : v->nend[i];
            continue;
        }
        if (cur && v->nend[i] - i > GCOMP_SKIP_MIN_NODES &&
            (v->nsk_flags[i] & (GVOC_SK_BOUNDARY | GVOC_SK_DESC_VALID)) == (GVOC_SK_BOUNDARY | GVOC_SK_DESC_VALID)) {
            int r = loop_covers(cg, cur, i);
            if (r < 0)
                return -1;
            if (r) {
                for (int32_t k = v->ntok_off[i + 1]; k < v->ntok_off[v->nend[i]]; k++)
                    gscratch_set(bits, sum, v->ntok[k]);
                i = v->nend[i];
                continue;
            }
        }
        if (cur && v->nend[i] - i > GCOMP_COUNT_MIN_NODES) {
            int r = v->nend[i] - i > GCOMP_CLASS_MIN_NODES ? class_walk(cg, i + 1, v->nend[i], d, cur) : 0;
            if (!r)
                r = gcomp_count_walk(cg, i + 1, v->nend[i], d, cur);
            if (r < 0)
                return -1;
            if (r) {
                i = v->nend[i];
                continue;
            }
        }
        i = cur ? i + 1 : v->nend[i];
    }
    return 0;
}

/* Clears the scratch bitset: the words its summary marks, or all of it
 * after a whole bitset was ORed in. */
static void scratch_clear(grammar_compiled *cg)
{
    size_t nw = cg->v->n_words, ns = nw / 64 + 1;
    if (cg->scratch_full) {
        memset(cg->scratch_bits, 0, nw * sizeof *cg->scratch_bits);
    } else {
        for (size_t i = 0; i < ns; i++)
            for (uint64_t m = cg->scratch_sum[i]; m; m &= m - 1)
                cg->scratch_bits[i * 64 + (size_t)__builtin_ctzll(m)] = 0;
    }
    memset(cg->scratch_sum, 0, ns * sizeof *cg->scratch_sum);
    cg->scratch_full = 0;
    cg->n_scratch_pops = 0;
}

/* Packs the scratch results into a new entry and clears the scratch. A
 * walk that accepted few tokens touched few words: those are read
 * through the summary instead of the whole bitset (a property name's
 * walk, hundreds of them in one mask). */
static gctx_entry *pack_entry(grammar_compiled *cg)
{
    const grammar_vocab *v = cg->v;
    gctx_entry *e = calloc(1, sizeof *e);
    if (!e) {
        scratch_clear(cg);
        return NULL;
    }
    uint32_t *bits = cg->scratch_bits;
    const uint64_t *sum = cg->scratch_sum;
    size_t ns = v->n_words / 64 + 1;
    int32_t n = 0;
    if (cg->scratch_full) {
        n = (int32_t)gbits_count(bits, v->n_words);
    } else {
        for (size_t i = 0; i < ns; i++)
            for (uint64_t m = sum[i]; m; m &= m - 1)
                n += __builtin_popcount(bits[i * 64 + (size_t)__builtin_ctzll(m)]);
    }
    e->n_acc = n;
    /* a list is smaller than the bitset below one id per 32 tokens */
    if (n && (size_t)n < v->n_words) {
        e->acc_ids = malloc((size_t)n * sizeof *e->acc_ids);
        if (!e->acc_ids)
            goto fail;
        int32_t k = 0;
        if (cg->scratch_full) {
            for (size_t w = 0; w < v->n_words; w++)
                for (uint32_t b = bits[w]; b; b &= b - 1)
                    e->acc_ids[k++] = (int32_t)(w * 32 + (size_t)__builtin_ctz(b));
        } else {
            for (size_t i = 0; i < ns; i++) {
                for (uint64_t m = sum[i]; m; m &= m - 1) {
                    size_t w = i * 64 + (size_t)__builtin_ctzll(m);
                    for (uint32_t b = bits[w]; b; b &= b - 1)
                        e->acc_ids[k++] = (int32_t)(w * 32 + (size_t)__builtin_ctz(b));
                }
            }
        }
    } else if (n) {
        e->acc_bits = malloc(v->n_words * sizeof *e->acc_bits);
        if (!e->acc_bits)
            goto fail;
        memcpy(e->acc_bits, bits, v->n_words * sizeof *bits);
    }
    if (cg->n_scratch_pops) {
        e->pops = malloc((size_t)cg->n_scratch_pops * sizeof *e->pops);
        if (!e->pops)
            goto fail;
        memcpy(e->pops, cg->scratch_pops, (size_t)cg->n_scratch_pops * sizeof *e->pops);
        e->n_pops = cg->n_scratch_pops;
    }
    scratch_clear(cg);
    return e;
fail:
    scratch_clear(cg);
    gctx_entry_free(e);
    return NULL;
}

static gctx_entry *compute_entry(grammar_compiled *cg, int32_t s)
{
    int32_t x = gstk_intern(&cg->pool, s, GSTK_UNKNOWN);
    int32_t sid = x < 0 ? -1 : set_intern(cg, &x, 1);
    if (sid < 0 || gcomp_walk(cg, 0, cg->v->n_nodes, 0, sid)) {
        scratch_clear(cg);
        return NULL;
    }
    return pack_entry(cg);
}

/* Continues e's pops in the caller stack x (the caller's return state,
 * above its own caller or the unknown bottom). */
static gctx_entry *compute_child(grammar_compiled *cg, const gctx_entry *e, int32_t x)
{
    const grammar_vocab *v = cg->v;
    if (x < 0)
        return NULL;
    gstk_set *out = &cg->tmp_out;
    gstk_set_clear(out);
    gstk_begin(&cg->pool);
    gstk_closure(cg->g, &cg->pool, x, out);
    if (out->oom)
        return NULL;
    int through = out->hit_unknown; /* the caller's rule can end at once */
    if (out->n > 1)
        qsort(out->ids, (size_t)out->n, sizeof *out->ids, cmp_i32);
    int32_t sid = set_intern(cg, out->ids, out->n);
    int bad = sid < 0;
    for (int32_t k = 0; k < e->n_pops && !bad; k++) {
        int32_t j = e->pops[k];
        if (through && add_pop(cg, j))
            bad = 1;
        if (!bad && sid && gcomp_walk(cg, j + 1, v->nend[j], v->nd[j], sid))
            bad = 1;
    }
    if (bad) {
        scratch_clear(cg);
        return NULL;
    }
    return pack_entry(cg);
}

/* ---- sharing and ownership --------------------------------------------------- */

static size_t entry_bytes(const grammar_vocab *v, const gctx_entry *e)
{
    return sizeof *e + (e->acc_bits ? v->n_words * 4 : (size_t)e->n_acc * 4) + (size_t)e->n_pops * 4;
}

static inline uint64_t key_mix(uint64_t a, uint64_t b)
{
    uint64_t h = (a ^ (b + 0x9E3779B97F4A7C15ULL + (a << 6) + (a >> 2))) * 0xD6E8FEB86659FD93ULL;
    return (h ^ (h >> 32)) | 1; /* never 0 */
}

/* Open-addressing maps of key -> entry (keys are never 0, an empty slot
 * has no entry): the vocabulary's shared cache and a grammar's own. */
static gctx_entry *slots_find(const gshare_slot *t, size_t cap, uint64_t key)
{
    if (!cap)
        return NULL;
    for (size_t i = key & (cap - 1);; i = (i + 1) & (cap - 1)) {
        if (!t[i].e)
            return NULL;
        if (t[i].key == key)
            return t[i].e;
    }
}

/* Adds key -> e, doubling the table (from cap0) past half full. */
static int slots_put(gshare_slot **t, size_t *cap, size_t *n, size_t cap0, uint64_t key, gctx_entry *e)
{
    if ((*n + 1) * 2 > *cap) {
        size_t nc = *cap ? *cap * 2 : cap0;
        gshare_slot *ns = calloc(nc, sizeof *ns);
        if (!ns)
            return -1;
        for (size_t i = 0; i < *cap; i++) {
            if (!(*t)[i].e)
                continue;
            size_t j = (*t)[i].key & (nc - 1);
            while (ns[j].e)
                j = (j + 1) & (nc - 1);
            ns[j] = (*t)[i];
        }
        free(*t);
        *t = ns;
        *cap = nc;
    }
    size_t j = key & (*cap - 1);
    while ((*t)[j].e)
        j = (j + 1) & (*cap - 1);
    (*t)[j].key = key;
    (*t)[j].e = e;
    (*n)++;
    return 0;
}

static gctx_entry *share_find(grammar_vocab *v, uint64_t key)
{
    return slots_find(v->share, v->share_cap, key);
}

static int share_put(grammar_vocab *v, uint64_t key, gctx_entry *e)
{
    if (v->share_n >= GSHARE_MAX_ENTRIES || v->share_bytes + entry_bytes(v, e) > GSHARE_MAX_BYTES)
        return -1;
    if (slots_put(&v->share, &v->share_cap, &v->share_n, 256, key, e))
        return -1;
    v->share_bytes += entry_bytes(v, e);
    return 0;
}

static int own(grammar_compiled *cg, gctx_entry *e)
{
    if (cg->n_owned == cg->cap_owned) {
        size_t cap = cg->cap_owned ? cg->cap_owned * 2 : 64;
        gctx_entry **no = realloc(cg->owned, cap * sizeof *no);
        if (!no)
            return -1;
        cg->owned = no;
        cg->cap_owned = cap;
    }
    cg->owned[cg->n_owned++] = e;
    return 0;
}

/* This grammar's keyed entries the shared cache had no room for. */
static gctx_entry *local_find(const grammar_compiled *cg, uint64_t key)
{
    return slots_find(cg->lkeys, cg->cap_lkeys, key);
}

static int local_put(grammar_compiled *cg, uint64_t key, gctx_entry *e)
{
    return slots_put(&cg->lkeys, &cg->cap_lkeys, &cg->n_lkeys, 64, key, e);
}

/* Publishes a freshly computed entry: into the vocabulary's shared cache
 * when it has a key (another grammar may have won the race: then its copy
 * is used), else owned by cg. Returns the entry to use, NULL on OOM. */
static gctx_entry *publish(grammar_compiled *cg, gctx_entry *e, uint64_t key)
{
    if (!e)
        return NULL;
    if (key) {
        grammar_vocab *v = (grammar_vocab *)cg->v;
        pthread_mutex_lock(&v->share_lock);
        gctx_entry *old = share_find(v, key);
        int stored = 0;
        if (!old) {
            e->key = key;
            stored = share_put(v, key, e) == 0;
        }
        pthread_mutex_unlock(&v->share_lock);
        if (old) {
            gctx_entry_free(e);
            return old;
        }
        if (stored)
            return e;
        /* the shared cache is full: private, but still one entry per key
         * in this grammar (equal rules share their children) */
        e->key = key;
        if (own(cg, e)) {
            gctx_entry_free(e);
            return NULL;
        }
        if (local_put(cg, key, e))
            e->key = 0; /* OOM: found again by nobody, recomputed */
        return e;
    }
    if (own(cg, e)) {
        gctx_entry_free(e);
        return NULL;
    }
    return e;
}

static gctx_entry *shared_lookup(grammar_compiled *cg, uint64_t key)
{
    if (!key)
        return NULL;
    grammar_vocab *v = (grammar_vocab *)cg->v;
    pthread_mutex_lock(&v->share_lock);
    gctx_entry *e = share_find(v, key);
    pthread_mutex_unlock(&v->share_lock);
    if (!e)
        e = local_find(cg, key);
    return e;
}

const gctx_entry *gcompiled_entry(grammar_compiled *cg, int32_t s)
{
    gctx_entry *e = __atomic_load_n(&cg->entries[s], __ATOMIC_ACQUIRE);
    if (e)
        return e;
    int32_t a = cg->alias ? cg->alias[s] : s;
    if (a != s) {
        /* an equivalent repetition copy: its entry is this state's */
        e = (gctx_entry *)gcompiled_entry(cg, a);
        if (e)
            __atomic_store_n(&cg->entries[s], e, __ATOMIC_RELEASE);
        return e;
    }
    pthread_mutex_lock(&cg->lock);
    e = cg->entries[s];
    if (!e) {
        uint64_t sig = grammar_state_sig(cg->g, s);
        uint64_t key = sig ? key_mix(sig, 0x70B) : 0;
        e = shared_lookup(cg, key);
        if (e) {
            cg->stats.shared_hits++;
        } else {
            cg->stats.entries++;
            e = publish(cg, compute_entry(cg, s), key);
        }
        if (e)
            __atomic_store_n(&cg->entries[s], e, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cg->lock);
    return e;
}

static inline size_t child_hash(const gctx_entry *p, int32_t t, int32_t t2)
{
    uint64_t h = ((uint64_t)(uintptr_t)p >> 4) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uint32_t)t * 0xC2B2AE3D27D4EB4FULL ^
                 (uint64_t)(uint32_t)t2 * 0x165667B19E3779F9ULL;
    return (size_t)(h ^ (h >> 29));
}

static int child_put(grammar_compiled *cg, const gctx_entry *p, int32_t t, int32_t t2, gctx_entry *c)
{
    if ((cg->n_children + 1) * 2 > cg->cap_children) {
        size_t cap = cg->cap_children ? cg->cap_children * 2 : 64;
        gchild_slot *ns = calloc(cap, sizeof *ns);
        if (!ns)
            return -1;
        for (size_t i = 0; i < cg->cap_children; i++) {
            if (!cg->children[i].child)
                continue;
            size_t j = child_hash(cg->children[i].parent, cg->children[i].t, cg->children[i].t2) & (cap - 1);
            while (ns[j].child)
                j = (j + 1) & (cap - 1);
            ns[j] = cg->children[i];
        }
        free(cg->children);
        cg->children = ns;
        cg->cap_children = cap;
    }
    size_t j = child_hash(p, t, t2) & (cg->cap_children - 1);
    while (cg->children[j].child)
        j = (j + 1) & (cg->cap_children - 1);
    cg->children[j] = (gchild_slot){p, t, t2, c};
    cg->n_children++;
    return 0;
}

/* The slot of (e, t, t2), NULL when absent (caller holds the lock). */
static gchild_slot *child_find(grammar_compiled *cg, const gctx_entry *e, int32_t t, int32_t t2)
{
    if (!cg->cap_children)
        return NULL;
    for (size_t j = child_hash(e, t, t2) & (cg->cap_children - 1); cg->children[j].child;
         j = (j + 1) & (cg->cap_children - 1))
        if (cg->children[j].parent == e && cg->children[j].t == t && cg->children[j].t2 == t2)
            return &cg->children[j];
    return NULL;
}

/* Marks (e, t) whose child walk was given up for its pops (see
 * gcompiled_child). */
static gctx_entry heavy_mark;

/* Records c as the child of (e, t, t2), replacing a mark; -1 on OOM. */
static int child_set(grammar_compiled *cg, const gctx_entry *e, int32_t t, int32_t t2, gctx_entry *c)
{
    gchild_slot *sl = child_find(cg, e, t, t2);
    if (sl) {
        sl->child = c;
        return 0;
    }
    return child_put(cg, e, t, t2, c);
}

/* Computes, publishes and records the child of e for the caller stack
 * [t | t2 | unknown] (t2 < 0: [t | unknown]). With cap, a child with
 * more pops than that is given up (*heavy = 1, (e, t) marked); a merged
 * one (t2 >= 0) past GCOMP_MERGE_MAX_STEPS parser steps too (*heavy =
 * 2): its sets did not loop. NULL then, or on OOM. */
static gctx_entry *child_make(grammar_compiled *cg, const gctx_entry *e, int32_t t, int32_t t2, int32_t cap, int *heavy)
{
    uint64_t sig = e->key ? grammar_state_sig(cg->g, t) : 0;
    uint64_t sig2 = t2 >= 0 && sig ? grammar_state_sig(cg->g, t2) : 0;
    uint64_t key = !sig ? 0 : t2 < 0 ? key_mix(e->key, sig) : sig2 ? key_mix(key_mix(e->key, sig), sig2 ^ 0x2C2) : 0;
    gctx_entry *c = shared_lookup(cg, key);
    if (c) {
        cg->stats.shared_hits++;
    } else {
        cg->stats.children++;
        int32_t below = t2 < 0 ? GSTK_UNKNOWN : gstk_intern(&cg->pool, t2, GSTK_UNKNOWN);
        int32_t x = below == -1 ? -1 : gstk_intern(&cg->pool, t, below);
        cg->pop_cap = cap;
        cg->pop_over = 0;
        cg->step_cap = t2 >= 0 ? cg->stats.steps + GCOMP_MERGE_MAX_STEPS : 0;
        cg->step_over = 0;
        c = compute_child(cg, e, x);
        cg->pop_cap = 0;
        cg->step_cap = 0;
        cg->stats.merged += t2 >= 0;
        if (!c && (cg->pop_over || cg->step_over)) {
            *heavy = cg->pop_over ? 1 : 2;
            if (cg->pop_over)
                (void)child_set(cg, e, t, -1, &heavy_mark); /* OOM: found heavy again next time */
            return NULL;
        }
        c = publish(cg, c, key);
    }
    if (c && child_set(cg, e, t, t2, c))
        c = NULL; /* OOM: the entry stays owned or shared, freed later */
    return c;
}

const gctx_entry *gcompiled_child(grammar_compiled *cg, const gctx_entry *e, int32_t t, int32_t t2, int *used2)
{
    gctx_entry *c = NULL;
    *used2 = 0;
    if (cg->alias) {
        t = cg->alias[t]; /* equivalent return states continue alike */
        t2 = t2 >= 0 ? cg->alias[t2] : t2;
    }
    pthread_mutex_lock(&cg->lock);
    gchild_slot *sl = child_find(cg, e, t, -1);
    int heavy = 0;
    if (sl && sl->child != &heavy_mark) {
        c = sl->child;
    } else if (!sl) {
        c = child_make(cg, e, t, -1, t2 < 0 || cg->plain_walk ? 0 : GCOMP_HEAVY_POPS, &heavy);
        sl = heavy ? child_find(cg, e, t, -1) : NULL;
    }
    if (sl && sl->child == &heavy_mark) {
        /* merged with t2 when there is one and its sets loop, else the
         * child in full (it replaces the mark) */
        gchild_slot *m = t2 >= 0 ? child_find(cg, e, t, t2) : NULL;
        heavy = 0;
        c = m ? m->child : t2 >= 0 ? child_make(cg, e, t, t2, 0, &heavy) : NULL;
        if (c) {
            *used2 = 1;
        } else if (t2 < 0 || heavy) {
            heavy = 0;
            c = child_make(cg, e, t, -1, 0, &heavy);
        }
    }
    pthread_mutex_unlock(&cg->lock);
    return c;
}

/* The child of e for t as a mask with a caller below t would start it:
 * a walk past GCOMP_HEAVY_POPS pops is given up and (e, t) marked, so
 * the mask that knows t2 merges (the precompute of wide choices, whose
 * stacks end in the unknown caller). NULL when given up or on OOM. */
static const gctx_entry *child_try(grammar_compiled *cg, const gctx_entry *e, int32_t t)
{
    gctx_entry *c = NULL;
    if (cg->alias)
        t = cg->alias[t];
    pthread_mutex_lock(&cg->lock);
    gchild_slot *sl = child_find(cg, e, t, -1);
    if (sl) {
        c = sl->child != &heavy_mark ? sl->child : NULL;
    } else {
        int heavy = 0;
        c = child_make(cg, e, t, -1, cg->plain_walk ? 0 : GCOMP_HEAVY_POPS, &heavy);
    }
    pthread_mutex_unlock(&cg->lock);
    return c;
}
