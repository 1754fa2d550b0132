/* Counted class walks: the token sets of sets that read a byte class
 * into one another instead of back to themselves. A bounded repetition
 * (`"\"" char{0,25} "\""`, `[0-9a-f]{8} "-"`) is expanded to copies, so
 * after k characters the parser set is X[k], a new set each time, and
 * the loop classes of compiled.c never apply: every copy's state walked
 * the whole trie (~260k nodes, 2-5 ms per first mask). But the copies
 * read the class alike: X[k] reads any class character into X[k+1].
 * So one split of the trie by the class (vocab_class.c) serves all of
 * them: a token whose bytes stay in the class is accepted iff its
 * character count is at most the chain's length (always when the chain
 * loops or outlasts the vocabulary's longest path), and only the
 * frontier subtrees are walked, each from X[c] for the c characters
 * before it. The chain is verified level by level on the characters the
 * vocabulary has at that position or later (vocab.c's pos_asc /
 * pos_lead), so the result is the node-by-node walk's, exactly
 * (test_matcher's test_loop_classes and test_counted_walks compare). */
#include <stdlib.h>
#include <string.h>

#include "grammar/bitset.h"
#include "grammar/compiled_int.h"

/* Chains shorter than this into a loop with a wider class are left to
 * the plain walk (see chain_build). */
#define GCHAIN_NARROW_MIN 3
/* A class narrower than this is not worth its trie split. */
#define GCHAIN_MIN_BYTES 8

static const char chain_probe[] = "etaoinsrhldcumfpgwybvkxjqzETAOINS0123456789";

static int chain_push(grammar_compiled *cg, int32_t sid)
{
    if (cg->n_chain_sets == cg->cap_chain_sets) {
        size_t cap = cg->cap_chain_sets ? cg->cap_chain_sets * 2 : 1024;
        int32_t *ns = realloc(cg->chain_sets, cap * sizeof *ns);
        if (!ns)
            return -1;
        cg->chain_sets = ns;
        cg->cap_chain_sets = cap;
    }
    cg->chain_sets[cg->n_chain_sets++] = sid;
    return 0;
}

static inline int asc_has(const uint64_t c[2], int b) { return (int)((c[b >> 6] >> (b & 63)) & 1); }

/* The successor of X on the class c: the set the first class byte that
 * does not pop leads to (probe letters first); -1 none, -2 OOM. */
static int32_t chain_next(grammar_compiled *cg, int32_t X, const uint64_t c[2])
{
    for (const char *p = chain_probe; *p; p++) {
        if (!asc_has(c, (uint8_t)*p))
            continue;
        int32_t t = gcomp_set_trans(cg, X, (uint8_t)*p);
        if (t < 0)
            return -2;
        if (!(t & 1))
            return t >> 1;
    }
    for (int b = 0; b < 128; b++) {
        if (!asc_has(c, b))
            continue;
        int32_t t = gcomp_set_trans(cg, X, (uint8_t)b);
        if (t < 0)
            return -2;
        if (!(t & 1))
            return t >> 1;
    }
    return -1;
}

/* The ASCII bytes of c found at position k or later that lead X to ny
 * (the level check of chain_build, ASCII part); -1 on OOM. */
static int chain_level_asc(grammar_compiled *cg, int32_t X, int32_t ny, int32_t k, uint64_t c[2])
{
    const grammar_vocab *v = cg->v;
    uint64_t a[2] = {c[0] & v->pos_asc[k][0], c[1] & v->pos_asc[k][1]};
    for (int w = 0; w < 2; w++) {
        for (uint64_t m = a[w]; m; m &= m - 1) {
            int b = w * 64 + __builtin_ctzll(m);
            int32_t t = gcomp_set_trans(cg, X, (uint8_t)b);
            if (t < 0)
                return -1;
            if (t != ny * 2)
                c[w] &= ~(1ull << (b & 63));
        }
    }
    return 0;
}

/* The ASCII loop class of X (the bytes it reads back to itself); -1 on
 * OOM. */
static int chain_loop_asc(grammar_compiled *cg, int32_t X, uint64_t lc[2])
{
    lc[0] = lc[1] = 0;
    for (int b = 0; b < 128; b++) {
        int32_t t = gcomp_set_trans(cg, X, (uint8_t)b);
        if (t < 0)
            return -1;
        if (t == X * 2)
            lc[b >> 6] |= 1ull << (b & 63);
    }
    return 0;
}

/* Whether the chain from x, on its ASCII bytes alone, already ends in a
 * short loop whose own class is wider (chain_build then finds no chain
 * whatever the UTF-8 characters do, unless they break the loop, where a
 * chain would be exact too): 1 yes, 0 no, -1 OOM. Asked before the
 * UTF-8 checks, the costly part of a level (sets of a name trie each
 * read a letter or two apart and fall into the string loop after one
 * character). */
static int chain_short_loop(grammar_compiled *cg, int32_t X, uint64_t c0, uint64_t c1)
{
    uint64_t c[2] = {c0, c1};
    for (int32_t k = 0; k < GCHAIN_NARROW_MIN && k < cg->v->w_max; k++) {
        int32_t ny = chain_next(cg, X, c);
        if (ny < -1)
            return -1;
        if (ny <= 0)
            return 0;
        if (chain_level_asc(cg, X, ny, k, c))
            return -1;
        if (ny != X) {
            X = ny;
            continue;
        }
        uint64_t lc[2];
        if (chain_loop_asc(cg, X, lc))
            return -1;
        if ((c[0] & ~lc[0]) || (c[1] & ~lc[1]))
            return 0; /* not a loop on the class */
        return lc[0] != c[0] || lc[1] != c[1];
    }
    return 0;
}

/* Appends a chain record; -1 on OOM. */
static int chain_add(grammar_compiled *cg, const uint64_t c[2], size_t off, int32_t len, uint64_t lead, int kind)
{
    if (cg->n_chains == cg->cap_chains) {
        int32_t cap = cg->cap_chains ? cg->cap_chains * 2 : 64;
        gchain *nc = realloc(cg->chains, (size_t)cap * sizeof *nc);
        if (!nc)
            return -1;
        cg->chains = nc;
        cg->cap_chains = cap;
    }
    gchain *ch = &cg->chains[cg->n_chains++];
    ch->asc[0] = c[0];
    ch->asc[1] = c[1];
    ch->off = (int32_t)off;
    ch->len = len;
    ch->lead = lead;
    ch->kind = (uint8_t)kind;
    ch->cls = NULL;
    return 0;
}

/* Verifies chain idx (GCHAIN_OPEN) level by level from its length on,
 * until it has `need` levels, ends (FULL, LOOP, DEAD) or cannot go on
 * (GCHAIN_STOP: the verified levels stay usable). A level that reads
 * some class bytes (or the characters of a lead byte) differently drops
 * them from the class (they become frontier bytes everywhere, so the
 * levels already checked stay valid). The chain's sets move to the end
 * of chain_sets first when other chains follow them. 0 or -1 (OOM). */
static int chain_extend(grammar_compiled *cg, int32_t idx, int32_t need)
{
    const grammar_vocab *v = cg->v;
    gchain ch = cg->chains[idx];
    size_t off = (size_t)ch.off;
    if (off + (size_t)ch.len + 1 != cg->n_chain_sets) {
        size_t noff = cg->n_chain_sets;
        for (int32_t k = 0; k <= ch.len; k++)
            if (chain_push(cg, cg->chain_sets[off + (size_t)k]))
                return -1;
        off = noff;
    }
    uint64_t c[2] = {ch.asc[0], ch.asc[1]};
    uint64_t lead_ok = ch.lead;
    int kind = GCHAIN_OPEN;
    int32_t k = ch.len;
    for (;; k++) {
        int32_t X = cg->chain_sets[off + (size_t)k];
        if (k >= v->w_max) {
            kind = GCHAIN_FULL;
            break;
        }
        if (k >= need)
            break;
        /* the candidate successor: the first class byte that does not pop */
        int32_t ny = chain_next(cg, X, c);
        if (ny < -1)
            return -1;
        if (ny < 0)
            goto stop;
        /* the class bytes found at this position or later must agree */
        uint64_t c0 = c[0], c1 = c[1];
        if (chain_level_asc(cg, X, ny, k, c))
            return -1;
        if (__builtin_popcountll(c[0]) + __builtin_popcountll(c[1]) < GCHAIN_MIN_BYTES) {
            c[0] = c0, c[1] = c1; /* the levels before were checked with these */
            goto stop;
        }
        /* the characters of each lead byte found here: a lead byte whose
         * characters disagree leaves the class */
        uint64_t lm = v->pos_lead[k] & lead_ok;
        if (lm) {
            const int32_t *tab = gcomp_utf8_table(cg, X);
            if (!tab)
                return -1;
            int32_t want = ny ? ny : GU8_DEAD;
            for (uint64_t m = lm & GVOC_LEAD_ALL; m; m &= m - 1)
                if (tab[__builtin_ctzll(m)] != want)
                    lead_ok &= ~(m & -m);
        }
        if (ny == 0) {
            kind = GCHAIN_DEAD;
            break;
        }
        if (ny == X) {
            /* a loop: every class byte and character, not only those found here */
            int loop = 1;
            for (int b = 0; b < 128 && loop; b++) {
                if (!asc_has(c, b))
                    continue;
                int32_t t = gcomp_set_trans(cg, X, (uint8_t)b);
                if (t < 0)
                    return -1;
                loop = t == X * 2;
            }
            if (loop && lead_ok) {
                int r = gcomp_utf8_reaches(cg, X, X, lead_ok);
                if (r < 0)
                    return -1;
                loop = r;
            }
            if (loop) {
                /* a short chain into a loop whose own class is wider than
                 * the chain's: the plain walk reaches X at a few top nodes
                 * and takes the loop's class (already built) below them,
                 * cheaper than a narrowed class's trie split */
                uint64_t lc[2];
                if (chain_loop_asc(cg, X, lc))
                    return -1;
                int narrow = lc[0] != c[0] || lc[1] != c[1];
                if (!narrow && lead_ok != GVOC_LEAD_ALL) {
                    int r = gcomp_utf8_reaches(cg, X, X, GVOC_LEAD_ALL & ~lead_ok);
                    if (r < 0)
                        return -1;
                    narrow = r;
                }
                if (narrow && k < GCHAIN_NARROW_MIN)
                    goto stop;
                kind = GCHAIN_LOOP;
                break;
            }
        }
        if (chain_push(cg, ny))
            return -1;
    }
    if (0) {
stop:
        kind = GCHAIN_STOP;
    }
    gchain *cp = &cg->chains[idx];
    if (cp->asc[0] != c[0] || cp->asc[1] != c[1] || cp->lead != lead_ok)
        cp->cls = NULL; /* the cached class split was of the wider class */
    cp->asc[0] = c[0];
    cp->asc[1] = c[1];
    cp->off = (int32_t)off;
    cp->len = k;
    cp->lead = lead_ok;
    cp->kind = (uint8_t)kind;
    return 0;
}

/* Starts x's chain in chains[n_chains] (GCHAIN_OPEN, no level verified
 * yet): 1 started, 0 none, -1 OOM. The class starts as the ASCII bytes
 * that take x where the probe letters do, and every UTF-8 lead byte. */
static int chain_start(grammar_compiled *cg, int32_t x)
{
    int32_t y = -1;
    for (const char *p = chain_probe; *p && y < 0; p++) {
        int32_t t = gcomp_set_trans(cg, x, (uint8_t)*p);
        if (t < 0)
            return -1;
        if (!(t & 1) && (t >> 1))
            y = t >> 1;
    }
    if (y <= 0)
        return 0;
    uint64_t c[2] = {0, 0};
    for (int b = 0; b < 128; b++) {
        int32_t t = gcomp_set_trans(cg, x, (uint8_t)b);
        if (t < 0)
            return -1;
        if (t == y * 2)
            c[b >> 6] |= 1ull << (b & 63);
    }
    int sl = chain_short_loop(cg, x, c[0], c[1]);
    if (sl)
        return sl < 0 ? -1 : 0;
    size_t off = cg->n_chain_sets;
    if (chain_push(cg, x))
        return -1;
    if (chain_add(cg, c, off, 0, GVOC_LEAD_ALL, GCHAIN_OPEN)) {
        cg->n_chain_sets = off;
        return -1;
    }
    return 1;
}

/* x's chain index, verified for at least `need` levels where the
 * vocabulary has them (computed and extended on demand): 1 found, 0
 * none (or too short: GCHAIN_STOP before need), -1 OOM. A subtree walk
 * needs the levels of the subtree's longest path only: the chain below
 * a quote in a maxLength string is checked for the dozen characters the
 * vocabulary has there, not for its longest token's 128. */
static int chain_get(grammar_compiled *cg, int32_t x, int32_t need, int32_t *idx)
{
    int32_t k = cg->chain_of[x];
    if (k == -2)
        return 0;
    if (k < 0) {
        int r = chain_start(cg, x);
        if (r < 0)
            return -1;
        k = r ? cg->n_chains - 1 : -2;
        cg->chain_of[x] = k; /* indexed after the build: sets may have moved */
        if (!r)
            return 0;
    }
    if (cg->chains[k].kind == GCHAIN_OPEN && cg->chains[k].len < need) {
        cg->chain_extends += cg->chains[k].len > 0;
        if (chain_extend(cg, k, need))
            return -1;
    }
    const gchain *ch = &cg->chains[k];
    if (ch->kind == GCHAIN_OPEN ? ch->len < need && ch->len < cg->v->w_max : ch->kind == GCHAIN_STOP && ch->len < need)
        return 0;
    *idx = k;
    return 1;
}

/* Next UTF-8 state after byte b from state u inside the class (asc,
 * lead), or -1 when b leaves it (vocab_class.c's rule). */
static inline int sub_next(const uint64_t asc[2], uint64_t lead, int u, uint8_t b)
{
    if (u == 0 && b < 128)
        return asc_has(asc, b) ? 0 : -1;
    if (u == 0 && (b < 0xC0 || !((lead >> (b - 0xC0)) & 1)))
        return -1;
    return gvoc_utf8_next(u, b);
}

/* The counted walk of the subtree [lo, hi) of node j = lo - 1 (a
 * character boundary at depth base), splitting it by the chain's class
 * on the fly (the class split of vocab_class.c starts at the root, and
 * j's path need not stay in the class): a node whose whole subtree stays
 * in the class takes its tokens at once, a node leaving the class is a
 * frontier walked from X[c] after the pending bytes of its unfinished
 * character. 0 or -1 (OOM / bound). */
static int count_walk_sub(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, const gchain *ch)
{
    const grammar_vocab *v = cg->v;
    int dead = ch->kind == GCHAIN_DEAD;
    int32_t c0 = v->nw[lo - 1];
    int32_t lim = dead ? c0 + ch->len : GVOC_W_MAX; /* largest weight accepted */
    int32_t *CH = cg->sub_ch, *LB = cg->sub_lb;
    int8_t *U = cg->sub_u;
    uint8_t *B = cg->sub_b;
    uint32_t *bits = cg->scratch_bits;
    uint64_t *sum = cg->scratch_sum;
    const int32_t *ntok = v->ntok, *ntok_off = v->ntok_off;
    const uint8_t *nw_tok = v->nw_tok;
    CH[base] = 0;
    U[base] = 0;
    LB[base] = base;
    for (int32_t i = lo; i < hi;) {
        int32_t d = v->nd[i];
        uint8_t b = v->nb[i];
        cg->stats.walk_nodes++;
        int nu = sub_next(ch->asc, ch->lead, U[d - 1], b);
        if (nu < 0) {
            int32_t cc = CH[d - 1]; /* characters before the pending bytes */
            if (!dead || cc <= ch->len) {
                int32_t y = cg->chain_sets[ch->off + (cc < ch->len ? cc : ch->len)];
                for (int32_t p = LB[d - 1] + 1; p < d && y > 0; p++) {
                    int32_t t = gcomp_set_trans(cg, y, B[p]);
                    if (t < 0)
                        return -1;
                    y = t >> 1; /* inside the class: never a pop */
                }
                if (y > 0 && gcomp_walk_from(cg, i, v->nend[i], d - 1, y, 0))
                    return -1;
            }
            i = v->nend[i];
            continue;
        }
        U[d] = (int8_t)nu;
        B[d] = b;
        CH[d] = CH[d - 1] + (nu == 0);
        LB[d] = nu == 0 ? d : LB[d - 1];
        int32_t w = c0 + CH[d] + (nu != 0);
        if (w > lim) {
            i = v->nend[i]; /* every token below is longer, every frontier dead */
            continue;
        }
        int32_t end = i + 1;
        if (nu == 0 && v->nend[i] > i + 1 && (v->nsk_flags[i] & GVOC_SK_DESC_VALID) &&
            !(v->nsk_asc[i][0] & ~ch->asc[0]) && !(v->nsk_asc[i][1] & ~ch->asc[1]) &&
            (ch->lead == GVOC_LEAD_ALL || !(v->nsk_flags[i] & GVOC_SK_DESC_NONASCII)))
            end = v->nend[i]; /* the whole subtree stays in the class */
        int32_t q1 = ntok_off[end];
        for (int32_t q = ntok_off[i]; q < q1; q++)
            if (nw_tok[q] <= lim)
                gscratch_set(bits, sum, ntok[q]);
        i = end;
    }
    return 0;
}

/* Before building x's chain, a cheap look at bytes the plain walk reads
 * anyway (the first children of [lo, hi) below depth base; at the root
 * the probe letters, already read by the loop class's test): they must
 * all lead x to one non-empty set without a pop. 1 worth a chain, 0 not,
 * -1 OOM. */
static int chain_worth(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t x)
{
    const grammar_vocab *v = cg->v;
    int32_t t0 = -1;
    for (int k = 0; k < 3; k++) {
        uint8_t b;
        if (base == 0) {
            b = (uint8_t)chain_probe[k];
        } else {
            int32_t n = lo;
            for (int s = 0; s < k && n < hi; s++)
                n = v->nend[n];
            if (n >= hi)
                break;
            b = v->nb[n];
        }
        int32_t t = gcomp_set_trans(cg, x, b);
        if (t < 0)
            return -1;
        if ((t & 1) || !(t >> 1) || (t0 >= 0 && t != t0))
            return 0;
        t0 = t;
    }
    return 1;
}

int gcomp_chain_warm(grammar_compiled *cg, int32_t x)
{
    if (!x || cg->v->w_max < 1 || cg->chain_of[x] != -1)
        return 0;
    int r = chain_worth(cg, 0, cg->v->n_nodes, 0, x);
    if (r <= 0)
        return r;
    int32_t idx;
    return chain_get(cg, x, cg->v->w_max, &idx);
}

int gcomp_count_walk(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t x)
{
    grammar_vocab *v = (grammar_vocab *)cg->v;
    if (!x || hi - lo < (base ? GCOMP_COUNT_MIN_NODES : GCOMP_CLASS_MIN_NODES) || v->w_max < 1)
        return 0;
    int32_t j = lo - 1, c0 = 0;
    if (base == 0) {
        if (lo != 0 || hi != v->n_nodes)
            return 0;
    } else {
        if (j < 0 || v->nd[j] != base || v->nend[j] != hi || !(v->nsk_flags[j] & GVOC_SK_BOUNDARY) ||
            v->nw[j] == GVOC_W_NONE)
            return 0;
        c0 = v->nw[j];
    }
    if (cg->chain_of[x] == -1) {
        int r = chain_worth(cg, lo, hi, base, x);
        if (r <= 0)
            return r;
    }
    int32_t idx;
    int r = chain_get(cg, x, base ? v->nw_max[j] - c0 : v->w_max, &idx);
    if (r <= 0)
        return r;
    /* the cached split of the whole trie: all lead bytes or none (a
     * subset of the verified class is exact), so partial lead masks do
     * not multiply the class splits, each a pass over the trie */
    uint64_t lead = cg->chains[idx].lead == GVOC_LEAD_ALL ? GVOC_LEAD_ALL : 0;
    const gvoc_class *c = cg->chains[idx].cls;
    if (!c)
        c = base ? gvoc_class_find(v, cg->chains[idx].asc, lead)
                 : gvoc_class_get(v, cg->chains[idx].asc, lead, &cg->stats);
    cg->chains[idx].cls = c;
    /* copied: walks below may add chains and move the arrays */
    gchain ch = cg->chains[idx];
    if (!c && !base)
        return 0;
    cg->stats.count_walks++;
    int32_t a = 0, b = c ? c->n_items : 0;
    if (base) {
        /* a subtree: the split of a class already cached serves it when
         * j's path stays in the class, i.e. j lies in a run (the items
         * inside [lo, hi) are then the on-the-fly split's, a run of
         * siblings one item instead of a node each: a string's first
         * character pops at every node of the first level, and the child
         * walks of a maxLength string's copies read those subtrees at
         * every character); else the subtree is split on the fly */
        while (a < b) {
            int32_t mid = a + (b - a) / 2;
            if (c->items[mid].last < j)
                a = mid + 1;
            else
                b = mid;
        }
        if (!c || a == c->n_items || c->items[a].frontier || c->items[a].first > j)
            return count_walk_sub(cg, lo, hi, base, &ch) ? -1 : 1;
        cg->stats.count_split_hits++;
    }
    ch.lead = lead;
    uint32_t *bits = cg->scratch_bits;
    uint64_t *sum = cg->scratch_sum;
    int dead = ch.kind == GCHAIN_DEAD;
    int32_t lim = dead ? c0 + ch.len : GVOC_W_MAX; /* largest weight accepted in the runs */
    if (base == 0 && !dead) {
        gbits_or(bits, c->run_bits, v->n_words);
        cg->scratch_full = 1;
    }
    const int32_t *ntok = v->ntok, *ntok_off = v->ntok_off;
    const uint8_t *nw_tok = v->nw_tok;
    for (int32_t k = a; k < c->n_items && c->items[k].first < hi; k++) {
        const gvoc_item *it = &c->items[k];
        if (!it->frontier) {
            if (base == 0 && !dead)
                continue;
            int32_t f0 = it->first > lo ? it->first : lo, f1 = it->last + 1 < hi ? it->last + 1 : hi;
            int32_t q1 = ntok_off[f1];
            for (int32_t q = ntok_off[f0]; q < q1; q++)
                if (nw_tok[q] <= lim)
                    gscratch_set(bits, sum, ntok[q]);
            continue;
        }
        int32_t cc = (int32_t)it->nch - c0; /* characters read before the pending bytes */
        if (cc < 0)
            cc = 0; /* not reached: j is a boundary on the item's path */
        if (dead && cc > ch.len)
            continue;
        int32_t y = cg->chain_sets[ch.off + (cc < ch.len ? cc : ch.len)];
        for (int p = 0; p < it->n_pend && y > 0; p++) {
            int32_t t = gcomp_set_trans(cg, y, it->pend[p]);
            if (t < 0)
                return -1;
            y = t >> 1; /* inside the class: never a pop */
        }
        if (y > 0 && gcomp_walk_from(cg, it->first, v->nend[it->first], v->nd[it->first] - 1, y, 0))
            return -1;
    }
    return 1;
}
