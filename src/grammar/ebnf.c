/* EBNF parser for the xgrammar / GBNF dialect into the syntax tree of
 * grammar_int.h. Accepted syntax:
 *   grammar  := rule*              rule := NAME "::=" alt [lookahead]
 *   alt      := seq ("|" seq)*     seq  := item*
 *   item     := primary quant*     quant := "*" | "+" | "?" | "{m}" | "{m,}" | "{m,n}"
 *   primary  := STRING | CLASS | NAME | "(" alt ")" | "."
 * STRING is "..." or '...' with escapes \n \r \t \v \f \b \a \0 \\ \" \' \xHH
 * \uXXXX \UXXXXXXXX; CLASS is [...] / [^...] with ranges and the same
 * escapes; NAME is [A-Za-z_][A-Za-z0-9_.-]*; "#" starts a comment to the
 * end of the line; a rule ends where the next "NAME ::=" starts. A trailing
 * lookahead "(= ...)" is parsed and ignored (it only restates what follows).
 * "." is any Unicode scalar value. All positions in errors are byte offsets. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

/* Tree depth bound: a grammar nested deeper is an error (no stack blow-up
 * in this recursive-descent parser or the recursive builder). */
#define EBNF_MAX_NEST 200

typedef struct eparser {
    const char *s;
    size_t len, pos;
    grammar *g;
    tern_err *err;
    int nest;
    /* rule table while parsing */
    char **names;
    gast **bodies;
    size_t *name_pos; /* position of first reference/definition */
    uint8_t *defined;
    uint32_t *name_len;
    int32_t n, cap;
    int32_t *hash;    /* [hmask+1] open addressing over names: rule index or -1 */
    uint32_t hmask;
} eparser;

struct garena_blk {
    garena_blk *next;
    size_t used, cap;
    max_align_t data[];
};

void *garena_alloc(garena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    garena_blk *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = (char *)b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void garena_free(garena *a)
{
    garena_blk *b = a->head;
    while (b) {
        garena_blk *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

static int perr(eparser *p, int code, const char *msg)
{
    if (p->err && p->err->code)
        return p->err->code; /* keep the first error */
    return tern_err_set_pos(p->err, code, (long)p->pos, "EBNF: %s at byte %zu", msg, p->pos);
}

static void skip_ws(eparser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n')
                p->pos++;
        } else {
            break;
        }
    }
}

static int is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.'; }

static size_t name_len_at(const eparser *p, size_t pos)
{
    size_t i = pos;
    if (i >= p->len || !is_name_start(p->s[i]))
        return 0;
    while (i < p->len && is_name_char(p->s[i]))
        i++;
    /* a trailing '.' or '-' belongs to the next token only in odd inputs;
     * names like "a.b" and "ws-1" are common, so keep them. */
    return i - pos;
}

/* Is there "NAME ::=" at pos (after whitespace)? */
static int at_rule_start(eparser *p)
{
    size_t save = p->pos;
    skip_ws(p);
    size_t n = name_len_at(p, p->pos);
    int yes = 0;
    if (n) {
        size_t q = p->pos + n;
        while (q < p->len && (p->s[q] == ' ' || p->s[q] == '\t' || p->s[q] == '\n' || p->s[q] == '\r'))
            q++;
        yes = q + 3 <= p->len && !memcmp(p->s + q, "::=", 3);
    }
    p->pos = save;
    return yes;
}

static uint32_t name_hash(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h ^ (h >> 15);
}

/* Grows the name hash to twice the rule capacity (load <= 1/2). */
static int hash_grow(eparser *p)
{
    uint32_t cap = p->hmask ? (p->hmask + 1) * 2 : 64;
    int32_t *h = malloc(cap * sizeof *h);
    if (!h)
        return -1;
    memset(h, 0xFF, cap * sizeof *h);
    for (int32_t i = 0; i < p->n; i++) {
        uint32_t j = name_hash(p->names[i], p->name_len[i]) & (cap - 1);
        while (h[j] >= 0)
            j = (j + 1) & (cap - 1);
        h[j] = i;
    }
    free(p->hash);
    p->hash = h;
    p->hmask = cap - 1;
    return 0;
}

/* Index of the rule named name[0..n); creates it when asked (-2 on OOM),
 * else -1 when absent. Hashed: a grammar of 20k rules parses in linear
 * time. */
static int32_t rule_lookup(eparser *p, const char *name, size_t n, int create)
{
    if ((uint32_t)(p->n + 1) * 2 > p->hmask + 1 && hash_grow(p))
        return -2;
    uint32_t j = name_hash(name, n) & p->hmask;
    for (; p->hash[j] >= 0; j = (j + 1) & p->hmask) {
        int32_t i = p->hash[j];
        if (p->name_len[i] == n && !memcmp(p->names[i], name, n))
            return i;
    }
    if (!create)
        return -1;
    if (p->n == p->cap) {
        int32_t cap = p->cap ? p->cap * 2 : 32;
        char **nn = realloc(p->names, (size_t)cap * sizeof *nn);
        if (nn)
            p->names = nn;
        gast **nb = realloc(p->bodies, (size_t)cap * sizeof *nb);
        if (nb)
            p->bodies = nb;
        size_t *np = realloc(p->name_pos, (size_t)cap * sizeof *np);
        if (np)
            p->name_pos = np;
        uint8_t *nd = realloc(p->defined, (size_t)cap);
        if (nd)
            p->defined = nd;
        uint32_t *nl = realloc(p->name_len, (size_t)cap * sizeof *nl);
        if (nl)
            p->name_len = nl;
        if (!nn || !nb || !np || !nd || !nl)
            return -2;
        p->cap = cap;
    }
    char *s = garena_alloc(&p->g->arena, n + 1);
    if (!s)
        return -2;
    memcpy(s, name, n);
    s[n] = 0;
    p->names[p->n] = s;
    p->name_len[p->n] = (uint32_t)n;
    p->hash[j] = p->n;
    p->bodies[p->n] = NULL;
    p->name_pos[p->n] = p->pos;
    p->defined[p->n] = 0;
    return p->n++;
}

static gast *node_new(eparser *p, int kind)
{
    gast *a = garena_alloc(&p->g->arena, sizeof *a);
    if (!a) {
        perr(p, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    a->kind = kind;
    return a;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes one UTF-8 scalar at p->pos; -1 on malformed input. */
static int32_t utf8_next(eparser *p)
{
    const uint8_t *s = (const uint8_t *)p->s;
    size_t i = p->pos;
    uint32_t c = s[i];
    int n;
    if (c < 0x80) {
        p->pos++;
        return (int32_t)c;
    } else if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
        c &= 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        c &= 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        c &= 0x07;
    } else {
        return -1;
    }
    if (i + (size_t)n >= p->len)
        return -1;
    for (int k = 1; k <= n; k++) {
        if ((s[i + k] & 0xC0) != 0x80)
            return -1;
        c = (c << 6) | (s[i + k] & 0x3F);
    }
    if ((n == 2 && c < 0x800) || (n == 3 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF))
        return -1;
    p->pos = i + (size_t)n + 1;
    return (int32_t)c;
}

/* One character of a literal or class (escape or UTF-8); -1 on error. */
static int32_t lit_char(eparser *p)
{
    if (p->pos >= p->len)
        return perr(p, TERN_EFORMAT, "unterminated literal"), -1;
    if (p->s[p->pos] != '\\') {
        int32_t c = utf8_next(p);
        if (c < 0)
            perr(p, TERN_EFORMAT, "invalid UTF-8");
        return c;
    }
    p->pos++;
    if (p->pos >= p->len)
        return perr(p, TERN_EFORMAT, "unterminated escape"), -1;
    char e = p->s[p->pos++];
    int nhex = 0;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'v': return '\v';
    case 'f': return '\f';
    case 'b': return '\b';
    case 'a': return '\a';
    case 'e': return 0x1B;
    case '0': return 0;
    case 'x': nhex = 2; break;
    case 'u': nhex = 4; break;
    case 'U': nhex = 8; break;
    default:
        if ((unsigned char)e < 0x80 && !((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9')))
            return (unsigned char)e; /* \\ \" \' \[ \] \- \^ \/ \. ... */
        p->pos--;
        return perr(p, TERN_EFORMAT, "unknown escape"), -1;
    }
    uint32_t v = 0;
    for (int k = 0; k < nhex; k++) {
        int h = p->pos < p->len ? hexval(p->s[p->pos]) : -1;
        if (h < 0)
            return perr(p, TERN_EFORMAT, "bad hex escape"), -1;
        v = v * 16 + (uint32_t)h;
        p->pos++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return perr(p, TERN_EFORMAT, "escape is not a Unicode scalar value"), -1;
    return (int32_t)v;
}

static int utf8_encode(uint32_t c, uint8_t *o)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    } else if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    } else if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

static gast *parse_string(eparser *p)
{
    char q = p->s[p->pos++];
    size_t cap = 64, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf)
        return perr(p, TERN_ENOMEM, "out of memory"), NULL;
    for (;;) {
        if (p->pos >= p->len) {
            free(buf);
            return perr(p, TERN_EFORMAT, "unterminated string"), NULL;
        }
        if (p->s[p->pos] == q) {
            p->pos++;
            break;
        }
        if (p->s[p->pos] == '\n') {
            free(buf);
            return perr(p, TERN_EFORMAT, "newline in string"), NULL;
        }
        int32_t c = lit_char(p);
        if (c < 0) {
            free(buf);
            return NULL;
        }
        if (n + 4 > cap) {
            cap *= 2;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return perr(p, TERN_ENOMEM, "out of memory"), NULL;
            }
            buf = nb;
        }
        n += (size_t)utf8_encode((uint32_t)c, buf + n);
    }
    gast *a = node_new(p, n ? GAST_BYTES : GAST_EMPTY);
    if (a && n) {
        a->u.bytes = garena_alloc(&p->g->arena, n);
        if (!a->u.bytes) {
            free(buf);
            return perr(p, TERN_ENOMEM, "out of memory"), NULL;
        }
        memcpy(a->u.bytes, buf, n);
        a->n = (int)n;
    }
    free(buf);
    return a;
}

static int cmp_range(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorts and merges ranges in place; returns the new count. */
static int ranges_normalize(uint32_t *r, int n)
{
    qsort(r, (size_t)n, 2 * sizeof(uint32_t), cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[2 * i] <= r[2 * (m - 1) + 1] + 1) {
            if (r[2 * i + 1] > r[2 * (m - 1) + 1])
                r[2 * (m - 1) + 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i];
            r[2 * m + 1] = r[2 * i + 1];
            m++;
        }
    }
    return m;
}

/* Complement over the Unicode scalar values. r must be normalized and have
 * room for one more range (the surrogates, added here so they stay out). */
static int ranges_complement(uint32_t *r, int n, uint32_t *out)
{
    r[2 * n] = 0xD800;
    r[2 * n + 1] = 0xDFFF;
    n = ranges_normalize(r, n + 1);
    int m = 0;
    uint32_t lo = 0;
    for (int i = 0; i <= n; i++) {
        uint32_t hi = i < n ? r[2 * i] : 0x110000;
        if (hi > lo) {
            out[2 * m] = lo;
            out[2 * m + 1] = hi - 1;
            m++;
        }
        if (i < n)
            lo = r[2 * i + 1] + 1;
    }
    return m;
}

static gast *parse_class(eparser *p)
{
    size_t start = p->pos;
    p->pos++; /* [ */
    int neg = 0;
    if (p->pos < p->len && p->s[p->pos] == '^') {
        neg = 1;
        p->pos++;
    }
    int cap = 16, n = 0;
    uint32_t *r = malloc((size_t)cap * 2 * sizeof *r);
    if (!r)
        return perr(p, TERN_ENOMEM, "out of memory"), NULL;
    for (;;) {
        if (p->pos >= p->len) {
            free(r);
            p->pos = start;
            return perr(p, TERN_EFORMAT, "unterminated character class"), NULL;
        }
        if (p->s[p->pos] == ']')
            break;
        int32_t lo = lit_char(p);
        if (lo < 0) {
            free(r);
            return NULL;
        }
        int32_t hi = lo;
        if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            p->pos++;
            hi = lit_char(p);
            if (hi < 0) {
                free(r);
                return NULL;
            }
            if (hi < lo) {
                free(r);
                return perr(p, TERN_EFORMAT, "character range is reversed"), NULL;
            }
        }
        if (n + 3 > cap) {
            cap *= 2;
            uint32_t *nr = realloc(r, (size_t)cap * 2 * sizeof *r);
            if (!nr) {
                free(r);
                return perr(p, TERN_ENOMEM, "out of memory"), NULL;
            }
            r = nr;
        }
        r[2 * n] = (uint32_t)lo;
        r[2 * n + 1] = (uint32_t)hi;
        n++;
    }
    p->pos++; /* ] */
    n = ranges_normalize(r, n);
    gast *a = node_new(p, GAST_CLASS);
    if (!a) {
        free(r);
        return NULL;
    }
    uint32_t *out = garena_alloc(&p->g->arena, (size_t)(n + 3) * 2 * sizeof *out);
    if (!out) {
        free(r);
        return perr(p, TERN_ENOMEM, "out of memory"), NULL;
    }
    if (neg) {
        n = ranges_complement(r, n, out);
    } else {
        memcpy(out, r, (size_t)n * 2 * sizeof *r);
    }
    free(r);
    a->u.cls.ranges = out;
    a->u.cls.negated = neg;
    a->n = n;
    if (n == 0)
        return perr(p, TERN_EINVAL, "character class matches nothing"), NULL;
    return a;
}

static gast *parse_alt(eparser *p);

static int parse_int(eparser *p, int32_t *out)
{
    skip_ws(p);
    long v = 0;
    size_t st = p->pos;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        v = v * 10 + (p->s[p->pos] - '0');
        if (v > 1000000)
            return perr(p, TERN_ERANGE, "repetition count too large");
        p->pos++;
    }
    if (p->pos == st)
        return perr(p, TERN_EFORMAT, "expected a number");
    *out = (int32_t)v;
    skip_ws(p);
    return 0;
}

static gast *parse_primary(eparser *p)
{
    skip_ws(p);
    if (p->pos >= p->len)
        return perr(p, TERN_EFORMAT, "expected an expression"), NULL;
    char c = p->s[p->pos];
    if (c == '"' || c == '\'')
        return parse_string(p);
    if (c == '[')
        return parse_class(p);
    if (c == '.') {
        p->pos++;
        gast *a = node_new(p, GAST_CLASS);
        if (!a)
            return NULL;
        a->u.cls.ranges = garena_alloc(&p->g->arena, 4 * sizeof(uint32_t));
        if (!a->u.cls.ranges)
            return perr(p, TERN_ENOMEM, "out of memory"), NULL;
        a->u.cls.ranges[0] = 0;
        a->u.cls.ranges[1] = 0xD7FF;
        a->u.cls.ranges[2] = 0xE000;
        a->u.cls.ranges[3] = 0x10FFFF;
        a->n = 2;
        return a;
    }
    if (c == '(') {
        p->pos++;
        if (++p->nest > EBNF_MAX_NEST)
            return perr(p, TERN_EFULL, "grammar nested too deeply"), NULL;
        gast *a = parse_alt(p);
        p->nest--;
        if (!a)
            return NULL;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ')')
            return perr(p, TERN_EFORMAT, "expected ')'"), NULL;
        p->pos++;
        return a;
    }
    size_t n = name_len_at(p, p->pos);
    if (n) {
        int32_t r = rule_lookup(p, p->s + p->pos, n, 1);
        if (r < 0)
            return perr(p, TERN_ENOMEM, "out of memory"), NULL;
        p->pos += n;
        gast *a = node_new(p, GAST_REF);
        if (a)
            a->u.ref = r;
        return a;
    }
    return perr(p, TERN_EFORMAT, "unexpected character"), NULL;
}

static gast *parse_item(eparser *p)
{
    gast *a = parse_primary(p);
    while (a) {
        skip_ws(p);
        if (p->pos >= p->len)
            break;
        char c = p->s[p->pos];
        int32_t lo, hi;
        if (c == '*') {
            lo = 0, hi = -1;
            p->pos++;
        } else if (c == '+') {
            lo = 1, hi = -1;
            p->pos++;
        } else if (c == '?') {
            lo = 0, hi = 1;
            p->pos++;
        } else if (c == '{') {
            p->pos++;
            if (parse_int(p, &lo))
                return NULL;
            hi = lo;
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                skip_ws(p);
                if (p->pos < p->len && p->s[p->pos] == '}')
                    hi = -1;
                else if (parse_int(p, &hi))
                    return NULL;
            }
            if (p->pos >= p->len || p->s[p->pos] != '}')
                return perr(p, TERN_EFORMAT, "expected '}'"), NULL;
            p->pos++;
            if (hi >= 0 && hi < lo)
                return perr(p, TERN_EFORMAT, "repetition {m,n} with n < m"), NULL;
        } else {
            break;
        }
        gast *r = node_new(p, GAST_REP);
        if (!r)
            return NULL;
        r->u.rep.kid = a;
        r->u.rep.min = lo;
        r->u.rep.max = hi;
        a = r;
    }
    return a;
}

/* Builds a SEQ/ALT node from a temporary list. */
static gast *list_node(eparser *p, int kind, gast **items, int n)
{
    if (n == 1)
        return items[0];
    gast *a = node_new(p, n ? kind : GAST_EMPTY);
    if (!a || !n)
        return a;
    a->u.kids = garena_alloc(&p->g->arena, (size_t)n * sizeof *a->u.kids);
    if (!a->u.kids)
        return perr(p, TERN_ENOMEM, "out of memory"), NULL;
    memcpy(a->u.kids, items, (size_t)n * sizeof *items);
    a->n = n;
    return a;
}

static int at_seq_end(eparser *p)
{
    skip_ws(p);
    if (p->pos >= p->len)
        return 1;
    char c = p->s[p->pos];
    if (c == '|' || c == ')')
        return 1;
    if (c == '(' && p->pos + 1 < p->len && p->s[p->pos + 1] == '=')
        return 1; /* lookahead */
    return at_rule_start(p);
}

static gast *parse_seq(eparser *p)
{
    gast *stackbuf[16], **items = stackbuf;
    int n = 0, cap = 16;
    gast *res = NULL;
    while (!at_seq_end(p)) {
        gast *a = parse_item(p);
        if (!a)
            goto out;
        if (n == cap) {
            gast **ni = malloc((size_t)cap * 2 * sizeof *ni);
            if (!ni) {
                perr(p, TERN_ENOMEM, "out of memory");
                goto out;
            }
            memcpy(ni, items, (size_t)n * sizeof *ni);
            if (items != stackbuf)
                free(items);
            items = ni;
            cap *= 2;
        }
        items[n++] = a;
    }
    res = list_node(p, GAST_SEQ, items, n);
out:
    if (items != stackbuf)
        free(items);
    return res;
}

static gast *parse_alt(eparser *p)
{
    gast *stackbuf[16], **items = stackbuf;
    int n = 0, cap = 16;
    gast *res = NULL;
    for (;;) {
        gast *a = parse_seq(p);
        if (!a)
            goto out;
        if (n == cap) {
            gast **ni = malloc((size_t)cap * 2 * sizeof *ni);
            if (!ni) {
                perr(p, TERN_ENOMEM, "out of memory");
                goto out;
            }
            memcpy(ni, items, (size_t)n * sizeof *ni);
            if (items != stackbuf)
                free(items);
            items = ni;
            cap *= 2;
        }
        items[n++] = a;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == '|') {
            p->pos++;
            continue;
        }
        break;
    }
    res = list_node(p, GAST_ALT, items, n);
out:
    if (items != stackbuf)
        free(items);
    return res;
}

int gebnf_parse(grammar *g, const char *text, size_t len, const char *root, tern_err *err)
{
    eparser P = {.s = text, .len = len, .g = g, .err = err};
    eparser *p = &P;
    int rc = 0;
    if (!text && len)
        return tern_err_set(err, TERN_EINVAL, "EBNF: no text");
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len)
            break;
        size_t n = name_len_at(p, p->pos);
        if (!n) {
            rc = perr(p, TERN_EFORMAT, "expected a rule name");
            goto out;
        }
        size_t name_at = p->pos;
        int32_t r = rule_lookup(p, p->s + p->pos, n, 1);
        if (r < 0) {
            rc = perr(p, TERN_ENOMEM, "out of memory");
            goto out;
        }
        if (p->defined[r]) {
            p->pos = name_at;
            rc = perr(p, TERN_EINVAL, "rule defined twice");
            goto out;
        }
        p->defined[r] = 1;
        p->name_pos[r] = name_at;
        p->pos += n;
        skip_ws(p);
        if (p->pos + 3 > p->len || memcmp(p->s + p->pos, "::=", 3)) {
            rc = perr(p, TERN_EFORMAT, "expected '::='");
            goto out;
        }
        p->pos += 3;
        gast *body = parse_alt(p);
        if (!body) {
            rc = err && err->code ? err->code : TERN_EFORMAT;
            goto out;
        }
        p->bodies[r] = body;
        skip_ws(p);
        if (p->pos + 1 < p->len && p->s[p->pos] == '(' && p->s[p->pos + 1] == '=') {
            /* lookahead assertion: parse for syntax, then drop it */
            p->pos += 2;
            gast *la = parse_alt(p);
            if (!la) {
                rc = err && err->code ? err->code : TERN_EFORMAT;
                goto out;
            }
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ')') {
                rc = perr(p, TERN_EFORMAT, "expected ')' after lookahead");
                goto out;
            }
            p->pos++;
        }
        skip_ws(p);
        if (p->pos < p->len && !at_rule_start(p)) {
            rc = perr(p, TERN_EFORMAT, "unexpected text after rule");
            goto out;
        }
    }
    for (int32_t i = 0; i < p->n; i++) {
        if (!p->defined[i]) {
            p->pos = p->name_pos[i];
            rc = tern_err_set_pos(err, TERN_EINVAL, (long)p->pos, "EBNF: rule '%s' is used but not defined",
                                  p->names[i]);
            goto out;
        }
    }
    const char *rootname = root ? root : "root";
    int32_t ri = rule_lookup(p, rootname, strlen(rootname), 0);
    if (ri < 0) {
        rc = tern_err_set(err, TERN_EINVAL, "EBNF: no rule named '%s'", rootname);
        goto out;
    }
    g->n_rules = p->n;
    g->root = ri;
    g->rule_names = garena_alloc(&g->arena, (size_t)(p->n ? p->n : 1) * sizeof *g->rule_names);
    g->rule_bodies = garena_alloc(&g->arena, (size_t)(p->n ? p->n : 1) * sizeof *g->rule_bodies);
    if (!g->rule_names || !g->rule_bodies) {
        rc = tern_err_set(err, TERN_ENOMEM, "EBNF: out of memory");
        goto out;
    }
    memcpy(g->rule_names, p->names, (size_t)p->n * sizeof *p->names);
    memcpy(g->rule_bodies, p->bodies, (size_t)p->n * sizeof *p->bodies);
out:
    free(p->names);
    free(p->bodies);
    free(p->name_pos);
    free(p->defined);
    free(p->name_len);
    free(p->hash);
    return rc;
}
