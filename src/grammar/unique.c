/* uniqueItems at run time (unique_int.h): a JSON lexer over the accepted
 * bytes, the open containers as an append-only node pool (a node is
 * never changed once made, so a checkpoint is a small struct of counts
 * and rollback truncates), the canonical value of every item of a
 * unique array in an append-only pool with its hash. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/bitset.h"
#include "grammar/unique_int.h"
#include "grammar/vocab_int.h"

enum { M_OUT, M_STR, M_SCALAR };

typedef struct guq_node {
    int32_t parent;      /* -1: top level */
    uint32_t start;      /* log offset of its '[' / '{' */
    int32_t first_item;  /* items before it belong to earlier arrays */
    uint8_t uniq;        /* 0 no, 1 a unique array, 2 unknown (guq_try only) */
} guq_node;

typedef struct guq_item {
    int32_t arr;         /* node of its array */
    uint32_t off, len;   /* canonical bytes in canon */
    uint64_t h;
} guq_item;

/* Everything a checkpoint restores. */
typedef struct guq_live {
    int32_t top, n_nodes, n_items, n_uniq; /* n_uniq: open arrays with uniq != 0 */
    uint32_t log_len, canon_len;
    int32_t scal;        /* log offset of the string / scalar item being read, -1 none */
    uint8_t mode, esc, dead;
    /* the string being read has its length checked here (1; 2: unknown,
     * inside guq_try), its codepoints so far (counted at the lead byte or
     * the backslash; a low surrogate escape after a high one counts none) */
    uint8_t slen, hi;
    uint32_t uval;       /* \u escape value so far */
    long smin, smax, scnt;
    /* the string's rule has an automaton (grammar len_re; -1 none): its
     * state (-1: lost, no checks), a UTF-8 character being read (value so
     * far, continuation bytes owed), a high surrogate escape waiting for
     * its low half */
    int32_t lrule, dq;
    uint32_t ucp, hpend;
    uint8_t uneed;
} guq_live;

struct guq {
    const grammar *g;
    uint8_t *rule_uniq;  /* [n_rules]: 1 uniqueItems, 2 string lengths */
    long *rule_min, *rule_max; /* [n_rules] the lengths of GUQ_LEN_PREFIX rules */
    int has_len;
    long open_min, open_max;   /* guq_opens of a '"': the bounds */
    int32_t open_rule;         /* ... and the one rule reading it (-1: several) */
    long first_min, first_max; /* guq_try's first byte */
    int32_t first_rule;
    guq_live L;
    guq_node *node;
    int32_t cap_node;
    guq_item *item;
    int32_t cap_item;
    uint8_t *log, *canon;
    uint32_t cap_log, cap_canon;
    guq_live *cp;        /* checkpoints */
    int32_t n_cp, cap_cp;
    uint8_t *tmp;        /* canonicalization scratch */
    size_t n_tmp, cap_tmp;
    int oom;
    uint32_t *buf;       /* candidate bitset scratch */
};

/* GUQ_LEN_PREFIX "MIN_MAX_N": 1 and the bounds, or 0. */
static int len_rule(const char *name, long *mn, long *mx)
{
    unsigned long num;
    return guq_len_rule_name(name, mn, mx, &num);
}

guq *guq_new(const grammar *g, int *rc)
{
    *rc = 0;
    size_t plen = strlen(GUQ_RULE_PREFIX);
    int any = 0;
    long mn, mx;
    for (int32_t r = 0; r < g->n_rules && !any; r++)
        any = !strncmp(g->rule_names[r], GUQ_RULE_PREFIX, plen) || len_rule(g->rule_names[r], &mn, &mx);
    if (!any)
        return NULL;
    guq *u = calloc(1, sizeof *u);
    if (!u || !(u->rule_uniq = calloc((size_t)g->n_rules, 1)) ||
        !(u->rule_min = calloc((size_t)g->n_rules, sizeof *u->rule_min)) ||
        !(u->rule_max = calloc((size_t)g->n_rules, sizeof *u->rule_max))) {
        guq_free(u);
        *rc = TERN_ENOMEM;
        return NULL;
    }
    u->g = g;
    for (int32_t r = 0; r < g->n_rules; r++) {
        if (g->rule_start[r] < 0)
            continue;
        if (!strncmp(g->rule_names[r], GUQ_RULE_PREFIX, plen)) {
            u->rule_uniq[r] = 1;
        } else if (len_rule(g->rule_names[r], &u->rule_min[r], &u->rule_max[r])) {
            u->rule_uniq[r] = 2;
            u->has_len = 1;
        }
    }
    guq_reset(u);
    return u;
}

void guq_free(guq *u)
{
    if (!u)
        return;
    free(u->rule_uniq);
    free(u->rule_min);
    free(u->rule_max);
    free(u->node);
    free(u->item);
    free(u->log);
    free(u->canon);
    free(u->cp);
    free(u->tmp);
    free(u->buf);
    free(u);
}

void guq_reset(guq *u)
{
    memset(&u->L, 0, sizeof u->L);
    u->L.top = -1;
    u->L.scal = -1;
    u->n_cp = 0;
    u->oom = 0;
}

void guq_restart(guq *u)
{
    u->L.top = -1;
    u->L.scal = -1;
    u->L.n_uniq = 0;
    u->L.mode = M_OUT;
    u->L.esc = 0;
    u->L.dead = 0;
    u->L.slen = 0;
}

int guq_opens(guq *u, const gstk_pool *p, const gstk_set *s, uint8_t b)
{
    const grammar *g = u->g;
    int kind = b == '[' ? 1 : b == '"' ? 2 : 0, found = 0;
    if (!kind)
        return 0;
    for (int32_t k = 0; k < s->n; k++) {
        int32_t st = p->state[s->ids[k]], r = g->st_rule[st];
        if (u->rule_uniq[r] != kind || g->rule_start[r] != st)
            continue;
        if (kind == 1)
            return 1;
        /* several readings of this quote: all their bounds hold */
        long mn = u->rule_min[r], mx = u->rule_max[r];
        if (!found) {
            u->open_min = mn;
            u->open_max = mx;
            u->open_rule = r;
        } else {
            u->open_rule = -1;
            if (mn > u->open_min)
                u->open_min = mn;
            if (mx >= 0 && (u->open_max < 0 || mx < u->open_max))
                u->open_max = mx;
        }
        found = 1;
    }
    return found;
}

int guq_first(guq *u, const gstk_pool *p, const gstk_set *s)
{
    int f = guq_opens(u, p, s, '[');
    if (u->has_len && guq_opens(u, p, s, '"')) {
        f |= 2;
        u->first_min = u->open_min;
        u->first_max = u->open_max;
        u->first_rule = u->open_rule;
    }
    return f;
}

static int grow(void **p, size_t need, size_t *cap, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q;
    *cap = c;
    return 0;
}

#define GROW(ptr, need, capfield)                                                                                 \
    do {                                                                                                          \
        size_t c_ = (size_t)(capfield);                                                                           \
        if (grow((void **)&(ptr), (size_t)(need), &c_, sizeof *(ptr)))                                            \
            return TERN_ENOMEM;                                                                                   \
        (capfield) = c_;                                                                                          \
    } while (0)

int32_t guq_save(guq *u, int32_t k)
{
    if (k < 0 || k > u->n_cp)
        k = u->n_cp;
    if ((size_t)k + 1 > (size_t)u->cap_cp) {
        size_t c = (size_t)u->cap_cp;
        if (grow((void **)&u->cp, (size_t)k + 1, &c, sizeof *u->cp))
            return TERN_ENOMEM;
        u->cap_cp = (int32_t)c;
    }
    u->cp[k] = u->L;
    u->n_cp = k + 1;
    return k;
}

void guq_load(guq *u, int32_t k)
{
    if (k < 0 || k >= u->n_cp)
        return;
    u->L = u->cp[k];
    u->n_cp = k + 1;
}

/* ---- canonical values ---------------------------------------------------- */

/* Canonical encodings are self-delimiting: 's' len bytes (decoded
 * string), 'n' len text (number: sign, significant digits, 'e', the
 * power of ten), 't' 'f' 'z', '[' values ']', '{' (key value)* '}' with
 * the members sorted by key. Equal JSON values (JSON Schema equality)
 * have equal encodings. */

static int tput(guq *u, const void *s, size_t n)
{
    if (grow((void **)&u->tmp, u->n_tmp + n, &u->cap_tmp, 1)) {
        u->oom = 1;
        return -1;
    }
    memcpy(u->tmp + u->n_tmp, s, n);
    u->n_tmp += n;
    return 0;
}

static void tput_len(guq *u, size_t n)
{
    uint8_t b[4] = {(uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
    tput(u, b, 4);
}

static void skip_ws(const uint8_t *s, size_t n, size_t *i)
{
    while (*i < n && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' || s[*i] == '\r'))
        (*i)++;
}

static int hexv(uint8_t c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void put_utf8(guq *u, uint32_t cp)
{
    uint8_t b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (uint8_t)(0xC0 | cp >> 6);
        b[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (uint8_t)(0xE0 | cp >> 12);
        b[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (uint8_t)(0xF0 | cp >> 18);
        b[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
        b[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        b[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    tput(u, b, n);
}

static uint32_t hex4(const uint8_t *s, size_t n, size_t i)
{
    uint32_t v = 0;
    for (size_t k = 0; k < 4; k++) {
        int h = i + k < n ? hexv(s[i + k]) : -1;
        if (h < 0)
            return 0xFFFFFFFF;
        v = v << 4 | (uint32_t)h;
    }
    return v;
}

/* The string at s[*i] == '"' decoded; *i past its closing quote. */
static void canon_string(guq *u, const uint8_t *s, size_t n, size_t *i)
{
    tput(u, "s", 1);
    size_t at = u->n_tmp;
    tput_len(u, 0);
    size_t i0 = u->n_tmp;
    (*i)++;
    while (*i < n && s[*i] != '"') {
        if (s[*i] != '\\') {
            tput(u, s + *i, 1);
            (*i)++;
            continue;
        }
        uint8_t e = *i + 1 < n ? s[*i + 1] : 0;
        *i += 2;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *p = e ? strchr(from, e) : NULL;
        if (p) {
            tput(u, to + (p - from), 1);
            continue;
        }
        if (e != 'u')
            continue;
        uint32_t cp = hex4(s, n, *i);
        if (cp == 0xFFFFFFFF)
            continue;
        *i += 4;
        if (cp >= 0xD800 && cp < 0xDC00 && *i + 1 < n && s[*i] == '\\' && s[*i + 1] == 'u') {
            uint32_t lo = hex4(s, n, *i + 2);
            if (lo >= 0xDC00 && lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                *i += 6;
            }
        }
        put_utf8(u, cp);
    }
    if (*i < n)
        (*i)++;
    if (!u->oom) {
        size_t len = u->n_tmp - i0;
        u->tmp[at] = (uint8_t)(len >> 24);
        u->tmp[at + 1] = (uint8_t)(len >> 16);
        u->tmp[at + 2] = (uint8_t)(len >> 8);
        u->tmp[at + 3] = (uint8_t)len;
    }
}

/* A JSON number by value: significant digits without leading or trailing
 * zeros and the power of ten of the last one (exponents saturate at
 * +-10^9: two such numbers count as equal, which only refuses more). */
static void canon_number(guq *u, const uint8_t *s, size_t n, size_t *i)
{
    int neg = 0;
    if (*i < n && s[*i] == '-') {
        neg = 1;
        (*i)++;
    }
    char dig[64];
    size_t nd = 0, extra = 0; /* digits past 64 kept as a count (only trailing zeros matter there) */
    long long exp = 0;
    int seen_nz = 0, frac = 0;
    for (; *i < n; (*i)++) {
        uint8_t c = s[*i];
        if (c == '.') {
            frac = 1;
            continue;
        }
        if (c < '0' || c > '9')
            break;
        if (frac)
            exp--;
        if (c == '0' && !seen_nz)
            continue;
        seen_nz = 1;
        if (nd < sizeof dig)
            dig[nd++] = (char)c;
        else
            extra++, exp++;
    }
    if (*i < n && (s[*i] == 'e' || s[*i] == 'E')) {
        (*i)++;
        int eneg = 0;
        if (*i < n && (s[*i] == '+' || s[*i] == '-'))
            eneg = s[(*i)++] == '-';
        long long e = 0;
        for (; *i < n && s[*i] >= '0' && s[*i] <= '9'; (*i)++)
            if (e < 1000000000LL)
                e = e * 10 + (s[*i] - '0');
        exp += eneg ? -e : e;
    }
    (void)extra;
    while (nd && dig[nd - 1] == '0') {
        nd--;
        exp++;
    }
    char buf[128];
    size_t bl = 0;
    if (!nd) {
        buf[bl++] = '0';
    } else {
        if (neg)
            buf[bl++] = '-';
        memcpy(buf + bl, dig, nd);
        bl += nd;
        if (exp > 1000000000LL)
            exp = 1000000000LL;
        if (exp < -1000000000LL)
            exp = -1000000000LL;
        bl += (size_t)snprintf(buf + bl, sizeof buf - bl, "e%lld", exp);
    }
    tput(u, "n", 1);
    tput_len(u, bl);
    tput(u, buf, bl);
}

typedef struct mspan { size_t key_off, key_len, off, len; } mspan;

static int cmp_span_key(const void *a, const void *b, void *base)
{
    const mspan *x = a, *y = b;
    const uint8_t *t = base;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(t + x->key_off, t + y->key_off, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* insertion sort (objects of a uniqueItems array are small; no qsort_r in C17) */
static void sort_spans(mspan *m, size_t n, const uint8_t *base)
{
    for (size_t i = 1; i < n; i++) {
        mspan x = m[i];
        size_t j = i;
        while (j && cmp_span_key(&m[j - 1], &x, (void *)base) > 0) {
            m[j] = m[j - 1];
            j--;
        }
        m[j] = x;
    }
}

static void canon_value(guq *u, const uint8_t *s, size_t n, size_t *i, int depth);

static void canon_object(guq *u, const uint8_t *s, size_t n, size_t *i, int depth)
{
    (*i)++;
    size_t base = u->n_tmp;
    mspan *m = NULL;
    size_t nm = 0, cm = 0;
    for (;;) {
        skip_ws(s, n, i);
        if (*i >= n || s[*i] == '}') {
            (*i)++;
            break;
        }
        if (s[*i] == ',') {
            (*i)++;
            continue;
        }
        if (s[*i] != '"') { /* not JSON: stop (the grammar never lets this through) */
            *i = n;
            break;
        }
        if (grow((void **)&m, nm + 1, &cm, sizeof *m)) {
            u->oom = 1;
            break;
        }
        mspan *sp = &m[nm++];
        sp->key_off = sp->off = u->n_tmp;
        canon_string(u, s, n, i);
        sp->key_len = u->n_tmp - sp->key_off;
        skip_ws(s, n, i);
        if (*i < n && s[*i] == ':')
            (*i)++;
        canon_value(u, s, n, i, depth + 1);
        sp->len = u->n_tmp - sp->off;
    }
    if (!u->oom && nm > 1) {
        sort_spans(m, nm, u->tmp);
        size_t tot = u->n_tmp - base;
        uint8_t *cp = malloc(tot ? tot : 1);
        if (!cp) {
            u->oom = 1;
        } else {
            memcpy(cp, u->tmp + base, tot);
            size_t w = base;
            for (size_t k = 0; k < nm; k++) {
                memcpy(u->tmp + w, cp + (m[k].off - base), m[k].len);
                w += m[k].len;
            }
            free(cp);
        }
    }
    free(m);
    /* after the members (postfix, like arrays): '{' count */
    uint8_t hdr[5] = {'{', (uint8_t)(nm >> 24), (uint8_t)(nm >> 16), (uint8_t)(nm >> 8), (uint8_t)nm};
    tput(u, hdr, 5);
}

static void canon_array(guq *u, const uint8_t *s, size_t n, size_t *i, int depth)
{
    (*i)++;
    size_t count = 0;
    for (;;) {
        skip_ws(s, n, i);
        if (*i >= n || s[*i] == ']') {
            (*i)++;
            break;
        }
        if (s[*i] == ',') {
            (*i)++;
            continue;
        }
        canon_value(u, s, n, i, depth + 1);
        count++;
    }
    uint8_t hdr[5] = {']', (uint8_t)(count >> 24), (uint8_t)(count >> 16), (uint8_t)(count >> 8), (uint8_t)count};
    tput(u, hdr, 5);
}

static void canon_value(guq *u, const uint8_t *s, size_t n, size_t *i, int depth)
{
    skip_ws(s, n, i);
    if (*i >= n || u->oom)
        return;
    if (depth > GSTK_MAX_DEPTH) { /* deeper than any parser stack: not reached */
        *i = n;
        return;
    }
    uint8_t c = s[*i];
    if (c == '"') {
        canon_string(u, s, n, i);
    } else if (c == '{') {
        canon_object(u, s, n, i, depth);
    } else if (c == '[') {
        canon_array(u, s, n, i, depth);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        canon_number(u, s, n, i);
    } else {
        tput(u, c == 't' ? "t" : c == 'f' ? "f" : "z", 1);
        while (*i < n && s[*i] >= 'a' && s[*i] <= 'z')
            (*i)++;
    }
}

static uint64_t hash_bytes(const uint8_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* An item of array node arr ends: log[off..end). 1 new (recorded), 0 a
 * duplicate, 2 undecided (arr's flag unknown and a duplicate). */
static int item_end(guq *u, int32_t arr, uint32_t off, uint32_t end)
{
    u->n_tmp = 0;
    size_t i = 0;
    canon_value(u, u->log + off, end - off, &i, 0);
    if (u->oom)
        return TERN_ENOMEM;
    uint64_t h = hash_bytes(u->tmp, u->n_tmp);
    for (int32_t k = u->L.n_items - 1; k >= u->node[arr].first_item; k--) {
        const guq_item *it = &u->item[k];
        if (it->arr == arr && it->h == h && it->len == u->n_tmp && !memcmp(u->canon + it->off, u->tmp, u->n_tmp))
            return u->node[arr].uniq == 1 ? 0 : 2;
    }
    GROW(u->item, u->L.n_items + 1, u->cap_item);
    GROW(u->canon, u->L.canon_len + u->n_tmp, u->cap_canon);
    memcpy(u->canon + u->L.canon_len, u->tmp, u->n_tmp);
    u->item[u->L.n_items++] = (guq_item){.arr = arr, .off = u->L.canon_len, .len = (uint32_t)u->n_tmp, .h = h};
    u->L.canon_len += (uint32_t)u->n_tmp;
    return 1;
}

static int in_uniq_array(const guq *u) { return u->L.top >= 0 && u->node[u->L.top].uniq; }

/* A codepoint of a string whose rule has an automaton: a high surrogate
 * escape waits for its low half; the state after it must still be able
 * to end the string within the bounds (1), else the byte is refused (0).
 * A codepoint the automaton has no move for is the grammar's to refuse:
 * the state is dropped (no more checks). */
static int lre_feed(guq *u, uint32_t cp)
{
    guq_live *L = &u->L;
    const guq_lre *x = u->g->len_re[L->lrule];
    if (L->hpend) {
        uint32_t h = L->hpend;
        L->hpend = 0;
        if (cp >= 0xDC00 && cp < 0xE000) {
            cp = 0x10000 + ((h - 0xD800) << 10) + (cp - 0xDC00);
        } else if ((L->dq = guq_lre_step(x, L->dq, h)) < 0) {
            return 1;
        }
    }
    if (cp >= 0xD800 && cp < 0xDC00 && !L->hpend) {
        L->hpend = cp;
        return 1;
    }
    if ((L->dq = guq_lre_step(x, L->dq, cp)) < 0)
        return 1;
    return guq_lre_viable(x, L->dq, L->scnt);
}

/* After a token that ends inside a length-checked string with an
 * automaton: 1 if some way on still ends it within the bounds (inside a
 * character or an escape: some codepoint it can still become). */
static int lre_end_ok(const guq *u)
{
    const guq_live *L = &u->L;
    if (L->dead || L->mode != M_STR || L->slen != 1 || L->lrule < 0 || L->dq < 0)
        return 1;
    const guq_lre *x = u->g->len_re[L->lrule];
    if (L->uneed) {
        uint32_t sh = 6u * L->uneed;
        return guq_lre_partial(x, L->dq, L->ucp << sh, (L->ucp << sh) | ((1u << sh) - 1), L->scnt);
    }
    if (L->esc || L->hpend)
        return guq_lre_partial(x, L->dq, 0, 0x10FFFFu, L->scnt);
    return 1;
}

/* Same as guq_byte, opens 0/1, or 2 = unknown (inside guq_try); returns
 * 1 ok, 0 duplicate, 2 undecided, <0 error. */
static int byte_in(guq *u, uint8_t b, int opens)
{
    guq_live *L = &u->L;
    if (L->dead)
        return 1;
    GROW(u->log, L->log_len + 1, u->cap_log);
    uint32_t pos = L->log_len;
    u->log[L->log_len++] = b;
    if (L->mode == M_STR) {
        int count = 0, have = 0; /* have: codepoint cp ends at this byte */
        uint32_t cp = 0;
        if (L->esc == 1) {
            L->esc = b == 'u' ? 2 : 0;
            L->uval = 0;
            if (!L->esc) {
                L->hi = 0;
                have = 1;
                cp = b == 'b' ? 8 : b == 'f' ? 12 : b == 'n' ? 10 : b == 'r' ? 13 : b == 't' ? 9 : b;
            }
        } else if (L->esc >= 2) {
            L->uval = L->uval << 4 | (uint32_t)(hexv(b) & 15);
            if (L->esc == 5) {
                L->esc = 0;
                L->hi = L->hi ? 0 : L->uval >= 0xD800 && L->uval < 0xDC00;
                have = 1;
                cp = L->uval;
            } else {
                L->esc++;
            }
        } else if (b == '\\') {
            L->esc = 1;
            count = !L->hi;
        } else if (b != '"') {
            count = (b & 0xC0) != 0x80;
            if (!count) {
                if (L->uneed) {
                    L->ucp = L->ucp << 6 | (b & 0x3F);
                    have = !--L->uneed;
                    cp = L->ucp;
                }
            } else if (b < 0x80) {
                have = 1;
                cp = b;
            } else {
                L->uneed = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
                L->ucp = b & (0x3Fu >> L->uneed);
            }
        } else {
            L->mode = M_OUT;
            if (L->slen == 2)
                return 2; /* closed a string whose bounds only the parser knows */
            if (L->slen && L->scnt < L->smin)
                return 0;
            L->slen = 0;
            if (L->scal >= 0) {
                uint32_t off = (uint32_t)L->scal;
                L->scal = -1;
                int r = item_end(u, L->top, off, pos + 1);
                return r == 1 ? 1 : r;
            }
        }
        if (count && L->slen) {
            L->scnt++;
            if (L->slen == 2 && L->scnt > GUQ_LEN_MIN_MAX)
                return 2;
            if (L->slen == 1 && L->smax >= 0 && L->scnt > L->smax)
                return 0;
        }
        if (have && L->slen == 1 && L->lrule >= 0 && L->dq >= 0)
            return lre_feed(u, cp);
        return 1;
    }
    if (L->mode == M_SCALAR) {
        if ((b >= '0' && b <= '9') || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '+' || b == '-' ||
            b == '.')
            return 1;
        L->mode = M_OUT;
        if (L->scal >= 0) {
            uint32_t off = (uint32_t)L->scal;
            L->scal = -1;
            int r = item_end(u, L->top, off, pos);
            if (r != 1)
                return r;
        }
    }
    switch (b) {
    case ' ':
    case '\t':
    case '\n':
    case '\r':
    case ',':
    case ':':
        return 1;
    case '"':
        L->mode = M_STR;
        L->esc = 0;
        L->hi = 0;
        L->scal = in_uniq_array(u) ? (int32_t)pos : -1;
        L->slen = opens == 1 ? 1 : opens == 2 && u->has_len ? 2 : 0;
        L->scnt = 0;
        L->smin = u->open_min;
        L->smax = u->open_max;
        L->lrule = opens == 1 && u->open_rule >= 0 && u->g->len_re && u->g->len_re[u->open_rule] ? u->open_rule : -1;
        L->dq = 0;
        L->ucp = L->hpend = 0;
        L->uneed = 0;
        return 1;
    case '[':
    case '{': {
        GROW(u->node, L->n_nodes + 1, u->cap_node);
        uint8_t uq = b == '[' ? (uint8_t)opens : 0;
        u->node[L->n_nodes] = (guq_node){.parent = L->top, .start = pos, .first_item = L->n_items, .uniq = uq};
        L->top = L->n_nodes++;
        if (uq)
            L->n_uniq++;
        return 1;
    }
    case ']':
    case '}': {
        if (L->top < 0) {
            L->dead = 1; /* not JSON: nothing to track */
            return 1;
        }
        const guq_node *nd = &u->node[L->top];
        if (nd->uniq)
            L->n_uniq--;
        uint32_t start = nd->start;
        L->top = nd->parent;
        if (in_uniq_array(u)) {
            int r = item_end(u, L->top, start, pos + 1);
            return r == 1 ? 1 : r;
        }
        return 1;
    }
    default:
        L->mode = M_SCALAR;
        L->scal = in_uniq_array(u) ? (int32_t)pos : -1;
        return 1;
    }
}

int guq_byte(guq *u, uint8_t b, int opens)
{
    int r = byte_in(u, b, opens ? 1 : 0);
    return r == 2 ? 0 : r;
}

int guq_try(guq *u, const uint8_t *s, size_t len, int first)
{
    guq_live keep = u->L;
    long om = u->open_min, oM = u->open_max;
    int32_t orl = u->open_rule;
    int r = 1;
    for (size_t i = 0; i < len && r == 1; i++) {
        int op = 2;
        if (i == 0) {
            op = s[0] == '[' ? (first & 1) : s[0] == '"' ? (first >> 1 & 1) : 0;
            u->open_min = u->first_min;
            u->open_max = u->first_max;
            u->open_rule = u->first_rule;
        }
        r = byte_in(u, s[i], op);
    }
    if (r == 1 && !lre_end_ok(u))
        r = 0;
    u->open_min = om;
    u->open_max = oM;
    u->open_rule = orl;
    u->L = keep;
    if (r < 0) /* out of memory: let the real step decide */
        return 2;
    return r == 1 ? 0 : r == 0 ? 1 : 2;
}

enum { C_BRACKET, C_QUOTE, C_SEP, C_QQ, N_CLS };

/* What the vocabulary keeps for the run-time checks (vocab_int.h
 * uq_cand, one block): the candidate classes, and per token the
 * codepoints before its first unescaped quote (counted as the tracker
 * counts them, from a clean string state). */
typedef struct guq_vcache {
    uint32_t *cls;  /* [N_CLS][n_words] */
    uint16_t *cpq;  /* [n_tokens] */
    long max_cpq;
    /* the tokens without a quote by codepoint count: by_cpq[koff[k] ..
     * koff[k + 1]) hold cpq k */
    int32_t *by_cpq;
    uint32_t *koff; /* [max_cpq + 2] */
    /* the classes C_BRACKET, C_QQ, C_QUOTE as id lists: lists + loff[k] .. loff[k + 1] */
    int32_t *lists;
    uint32_t loff[4];
} guq_vcache;

/* The codepoints token t adds to a string before its first unescaped
 * quote, from a clean state (no escape open, no high surrogate before). */
static unsigned token_cpq(const uint8_t *t, uint32_t n)
{
    unsigned c = 0;
    int esc = 0, hi = 0;
    uint32_t uv = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint8_t b = t[i];
        if (esc == 1) {
            esc = b == 'u' ? 2 : 0;
            uv = 0;
            if (!esc)
                hi = 0;
        } else if (esc >= 2) {
            uv = uv << 4 | (uint32_t)(hexv(b) & 15);
            if (esc == 5) {
                esc = 0;
                hi = hi ? 0 : uv >= 0xD800 && uv < 0xDC00;
            } else {
                esc++;
            }
        } else if (b == '\\') {
            esc = 1;
            c += !hi;
        } else if (b == '"') {
            break;
        } else {
            c += (b & 0xC0) != 0x80;
        }
    }
    return c > 65535 ? 65535 : c;
}

/* Built with the vocabulary (grammar_vocab_from_bytes): one pass over
 * the token bytes, so no mask pays for it. */
int guq_vocab_build(grammar_vocab *v)
{
    size_t nw = v->n_words, nt = (size_t)v->n_tokens;
    uint32_t *blk = calloc(1, sizeof(guq_vcache) + N_CLS * nw * sizeof(uint32_t) + nt * sizeof(uint16_t) + 8);
    if (!blk)
        return TERN_ENOMEM;
    guq_vcache *vc = (guq_vcache *)blk;
    vc->cls = (uint32_t *)(vc + 1);
    vc->cpq = (uint16_t *)(vc->cls + N_CLS * nw);
    uint32_t *c = vc->cls;
    uint8_t cls[256] = {0};
    cls['"'] = 1 << C_QUOTE | 1 << C_SEP;
    cls[','] = cls[']'] = cls['}'] = cls[' '] = cls['\t'] = cls['\n'] = cls['\r'] = 1 << C_SEP;
    for (int32_t id = 0; id < v->n_tokens; id++) {
        if (v->special[id])
            continue;
        const uint8_t *t = (const uint8_t *)v->blob + v->tok_off[id];
        unsigned f = 0;
        int ends_after_bracket = -1, quotes = 0; /* item-ending bytes after the first '[' */
        for (uint32_t i = 0; i < v->tok_len[id]; i++) {
            f |= cls[t[i]];
            quotes += t[i] == '"';
            if (ends_after_bracket >= 0 && cls[t[i]] & 1 << C_SEP)
                ends_after_bracket++;
            if (t[i] == '[' && ends_after_bracket < 0)
                ends_after_bracket = 0;
        }
        /* an array opened inside the token can hold a duplicate only once
         * two of its items ended there, each at a '"', ',', ']', '}' or
         * whitespace byte */
        if (ends_after_bracket >= 2)
            f |= 1 << C_BRACKET;
        /* a string opened inside the token breaks its bounds there only by
         * closing (a second quote) or by outgrowing GUQ_LEN_MIN_MAX */
        if (quotes >= 2 || (quotes && v->tok_len[id] >= GUQ_LEN_MIN_MAX))
            f |= 1 << C_QQ;
        for (int k = 0; k < N_CLS; k++)
            if (f >> k & 1)
                c[(size_t)k * nw + (size_t)id / 32] |= 1u << (id % 32);
        vc->cpq[id] = (uint16_t)token_cpq(t, v->tok_len[id]);
        if (vc->cpq[id] > vc->max_cpq)
            vc->max_cpq = vc->cpq[id];
    }
    vc->by_cpq = malloc(nt * sizeof *vc->by_cpq + 1);
    vc->koff = calloc((size_t)vc->max_cpq + 3, sizeof *vc->koff);
    if (!vc->by_cpq || !vc->koff) {
        free(vc->by_cpq);
        free(vc->koff);
        free(blk);
        return TERN_ENOMEM;
    }
    const uint32_t *qc = c + (size_t)C_QUOTE * nw;
    for (int32_t id = 0; id < v->n_tokens; id++)
        if (!v->special[id] && !(qc[id / 32] >> (id % 32) & 1))
            vc->koff[vc->cpq[id] + 2]++;
    for (long k = 0; k <= vc->max_cpq; k++)
        vc->koff[k + 2] += vc->koff[k + 1];
    for (int32_t id = 0; id < v->n_tokens; id++)
        if (!v->special[id] && !(qc[id / 32] >> (id % 32) & 1))
            vc->by_cpq[vc->koff[vc->cpq[id] + 1]++] = id;
    static const int lk[3] = {C_BRACKET, C_QQ, C_QUOTE};
    size_t tot = 0;
    for (int l = 0; l < 3; l++)
        tot += gbits_count(c + (size_t)lk[l] * nw, nw);
    if (!(vc->lists = malloc((tot + 1) * sizeof *vc->lists))) {
        free(vc->by_cpq);
        free(vc->koff);
        free(blk);
        return TERN_ENOMEM;
    }
    tot = 0;
    for (int l = 0; l < 3; l++) {
        vc->loff[l] = (uint32_t)tot;
        for (int32_t id = 0; id < v->n_tokens; id++)
            if (c[(size_t)lk[l] * nw + (size_t)id / 32] >> (id % 32) & 1)
                vc->lists[tot++] = id;
    }
    vc->loff[3] = (uint32_t)tot;
    guq_vocab_free(v);
    v->uq_cand = blk;
    return 0;
}

void guq_vocab_free(grammar_vocab *v)
{
    guq_vcache *vc = (guq_vcache *)v->uq_cand;
    if (vc) {
        free(vc->by_cpq);
        free(vc->koff);
        free(vc->lists);
    }
    free(v->uq_cand);
    v->uq_cand = NULL;
}

static const guq_vcache *vcache(const grammar_vocab *v) { return (const guq_vcache *)v->uq_cand; }

/* Dead ends of a string whose rule has an automaton: the tokens that end
 * inside the string (no quote) in a state that cannot end it within the
 * bounds. Only counts where some state is such a dead end need a look
 * (guq_lre_bad): near maxLength, or below minLength where the regex can
 * stop growing; those tokens are run through the tracker. */
static int len_dead_ends(guq *u, const grammar_vocab *v, const guq_vcache *vc, uint32_t *mask)
{
    const guq_live *L = &u->L;
    int removed = 0;
    if (L->lrule < 0 || L->dq < 0)
        return 0;
    const guq_lre *x = u->g->len_re[L->lrule];
    if (L->uneed || L->hpend) { /* inside a character: few tokens go on, try each */
        for (size_t w = 0; w < v->n_words; w++)
            for (uint32_t bits = mask[w]; bits; bits &= bits - 1) {
                size_t id = w * 32 + (size_t)__builtin_ctz(bits);
                if (id < (size_t)v->n_tokens &&
                    guq_try(u, (const uint8_t *)v->blob + v->tok_off[id], v->tok_len[id], 0) == 1) {
                    mask[w] &= ~(1u << (id % 32));
                    removed++;
                }
            }
        return removed;
    }
    if (!guq_lre_bad(x, L->scnt, L->scnt + vc->max_cpq))
        return 0;
    for (long k = 0; k <= vc->max_cpq; k++) {
        if (!guq_lre_bad(x, L->scnt + k, L->scnt + k))
            continue;
        for (uint32_t i = vc->koff[k]; i < vc->koff[k + 1]; i++) {
            int32_t id = vc->by_cpq[i];
            if (!(mask[id / 32] >> (id % 32) & 1))
                continue;
            if (guq_try(u, (const uint8_t *)v->blob + v->tok_off[id], v->tok_len[id], 0) == 1) {
                mask[id / 32] &= ~(1u << (id % 32));
                removed++;
            }
        }
    }
    return removed;
}

int guq_len_filter(guq *u, const grammar_vocab *v, uint32_t *mask)
{
    const guq_live *L = &u->L;
    if (L->dead || L->mode != M_STR || L->slen != 1 || L->esc || L->hi)
        return 0;
    const guq_vcache *vc = vcache(v);
    if (!vc)
        return TERN_ENOMEM;
    int removed = len_dead_ends(u, v, vc, mask);
    if (!(L->scnt < L->smin || (L->smax >= 0 && L->smax - L->scnt < vc->max_cpq)))
        return removed;
    const uint32_t *q = vc->cls + (size_t)C_QUOTE * v->n_words;
    for (size_t w = 0; w < v->n_words; w++) {
        uint32_t bits = mask[w];
        while (bits) {
            int b = __builtin_ctz(bits);
            bits &= bits - 1;
            size_t id = w * 32 + (size_t)b;
            if (id >= (size_t)v->n_tokens)
                break;
            long n = L->scnt + vc->cpq[id];
            if ((L->smax >= 0 && n > L->smax) || (q[w] >> b & 1 && n < L->smin)) {
                mask[w] &= ~(1u << b);
                removed++;
            }
        }
    }
    return removed;
}

/* Does a quote at the current set open a string whose automaton has dead
 * ends within a token's reach (then every token with a quote is tried)? */
static int open_dead_ends(const guq *u, const guq_vcache *vc, int first)
{
    return first & 2 && u->L.mode != M_STR && u->first_rule >= 0 && u->g->len_re && u->g->len_re[u->first_rule] &&
           guq_lre_bad(u->g->len_re[u->first_rule], 0, vc->max_cpq);
}

int guq_candidate_lists(guq *u, const grammar_vocab *v, int first, const int32_t *ids[2], size_t n[2])
{
    n[0] = n[1] = 0;
    const guq_live *L = &u->L;
    if (L->dead)
        return 1;
    const guq_vcache *vc = vcache(v);
    if (!vc)
        return TERN_ENOMEM;
    if (L->n_uniq || (L->mode == M_STR && L->slen && (L->esc || L->hi)))
        return 0;
    ids[0] = vc->lists + vc->loff[0];
    n[0] = vc->loff[1] - vc->loff[0];
    if (u->has_len) {
        int l = open_dead_ends(u, vc, first) ? 2 : 1;
        ids[1] = vc->lists + vc->loff[l];
        n[1] = vc->loff[l + 1] - vc->loff[l];
    }
    return 1;
}

const uint32_t *guq_candidates(guq *u, const grammar_vocab *v, int first, int *rc)
{
    *rc = 0;
    if (u->L.dead)
        return NULL;
    const guq_vcache *vc = vcache(v);
    if (!vc) {
        *rc = TERN_ENOMEM;
        return NULL;
    }
    size_t nw = v->n_words;
    int k = !u->L.n_uniq ? C_BRACKET : u->L.mode == M_STR ? C_QUOTE : C_SEP;
    const uint32_t *c = vc->cls + (size_t)k * nw;
    if (!u->has_len)
        return c;
    if (!u->buf && !(u->buf = malloc(nw * sizeof *u->buf))) {
        *rc = TERN_ENOMEM;
        return NULL;
    }
    const guq_live *L = &u->L;
    if (L->mode == M_STR && L->slen && (L->esc || L->hi)) { /* inside an escape: try them all */
        memset(u->buf, 0xFF, nw * sizeof *u->buf);
        return u->buf;
    }
    const uint32_t *qq = vc->cls + (size_t)C_QQ * nw;
    /* a quote here opens a string whose automaton has dead ends within a
     * token's reach: every token with a quote is tried */
    if (open_dead_ends(u, vc, first))
        qq = vc->cls + (size_t)C_QUOTE * nw;
    for (size_t w = 0; w < nw; w++)
        u->buf[w] = c[w] | qq[w];
    return u->buf;
}
