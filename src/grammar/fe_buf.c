/* Helpers shared by the grammar front ends: bounded string builder, rule
 * table with de-duplication, codepoint sets and their EBNF forms, and
 * digit-range grammars (used for integer bounds and \uXXXX escapes). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fe_int.h"

/* ---------------------------------------------------------------- buffer */

void gfe_buf_init(gfe_buf *b, size_t max)
{
    memset(b, 0, sizeof *b);
    b->max = max;
}

void gfe_buf_free(gfe_buf *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

static int buf_reserve(gfe_buf *b, size_t extra)
{
    if (b->err)
        return -1;
    if (b->max && b->len + extra > b->max) {
        b->err = TERN_EFULL;
        return -1;
    }
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->err = TERN_ENOMEM;
        return -1;
    }
    b->s = s;
    b->cap = cap;
    return 0;
}

void gfe_buf_put(gfe_buf *b, const char *s, size_t n)
{
    if (buf_reserve(b, n))
        return;
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = 0;
}

void gfe_buf_puts(gfe_buf *b, const char *s)
{
    gfe_buf_put(b, s, strlen(s));
}

void gfe_buf_printf(gfe_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        gfe_buf_put(b, tmp, (size_t)n);
        return;
    }
    if (buf_reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *gfe_buf_take(gfe_buf *b)
{
    if (b->err)
        return NULL;
    char *s = b->s;
    if (!s) {
        s = malloc(1);
        if (s)
            s[0] = 0;
    }
    b->s = NULL;
    b->len = b->cap = 0;
    return s;
}

void gfe_buf_lit(gfe_buf *b, const char *s, size_t n)
{
    gfe_buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"')
            gfe_buf_put(b, "\\\"", 2);
        else if (c == '\\')
            gfe_buf_put(b, "\\\\", 2);
        else if (c == '\n')
            gfe_buf_put(b, "\\n", 2);
        else if (c == '\t')
            gfe_buf_put(b, "\\t", 2);
        else if (c == '\r')
            gfe_buf_put(b, "\\r", 2);
        else if (c < 0x20 || c == 0x7f)
            gfe_buf_printf(b, "\\u%04X", c);
        else
            gfe_buf_put(b, (const char *)&s[i], 1);
    }
    gfe_buf_put(b, "\"", 1);
}

/* ---------------------------------------------------------------- rules */

void gfe_rules_init(gfe_rules *r, size_t max_bytes)
{
    memset(r, 0, sizeof *r);
    gfe_buf_init(&r->out, max_bytes);
}

void gfe_rules_free(gfe_rules *r)
{
    for (size_t i = 0; i < r->tab_cap; i++)
        free(r->tab[i].body);
    free(r->tab);
    gfe_buf_free(&r->out);
    memset(r, 0, sizeof *r);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h | 1; /* 0 marks an empty slot */
}

static int tab_grow(gfe_rules *r)
{
    size_t cap = r->tab_cap ? r->tab_cap * 2 : 256;
    struct gfe_rule_slot *t = calloc(cap, sizeof *t);
    if (!t)
        return -1;
    for (size_t i = 0; i < r->tab_cap; i++) {
        if (!r->tab[i].h)
            continue;
        size_t j = r->tab[i].h & (cap - 1);
        while (t[j].h)
            j = (j + 1) & (cap - 1);
        t[j] = r->tab[i];
    }
    free(r->tab);
    r->tab = t;
    r->tab_cap = cap;
    return 0;
}

void gfe_rule_reserve(gfe_rules *r, char name_out[GFE_NAME_MAX])
{
    snprintf(name_out, GFE_NAME_MAX, "r%u", r->next++);
}

int gfe_rule_define(gfe_rules *r, const char *name, const char *body)
{
    gfe_buf_puts(&r->out, name);
    gfe_buf_puts(&r->out, " ::= ");
    gfe_buf_puts(&r->out, body);
    gfe_buf_puts(&r->out, "\n");
    return r->out.err;
}

int gfe_rule_add(gfe_rules *r, const char *body, char name_out[GFE_NAME_MAX])
{
    if (r->out.err)
        return r->out.err;
    if ((r->tab_n + 1) * 2 > r->tab_cap && tab_grow(r)) {
        r->out.err = TERN_ENOMEM;
        return r->out.err;
    }
    uint64_t h = fnv1a(body);
    size_t j = h & (r->tab_cap - 1);
    while (r->tab[j].h) {
        if (r->tab[j].h == h && strcmp(r->tab[j].body, body) == 0) {
            memcpy(name_out, r->tab[j].name, GFE_NAME_MAX);
            return 0;
        }
        j = (j + 1) & (r->tab_cap - 1);
    }
    char *copy = strdup(body);
    if (!copy) {
        r->out.err = TERN_ENOMEM;
        return r->out.err;
    }
    gfe_rule_reserve(r, name_out);
    r->tab[j].h = h;
    r->tab[j].body = copy;
    memcpy(r->tab[j].name, name_out, GFE_NAME_MAX);
    r->tab_n++;
    return gfe_rule_define(r, name_out, body);
}

/* ---------------------------------------------------------------- csets */

void gfe_cset_free(gfe_cset *c)
{
    free(c->r);
    memset(c, 0, sizeof *c);
}

static int cset_reserve(gfe_cset *c, size_t n)
{
    if (c->oom)
        return -1;
    if (n <= c->cap)
        return 0;
    size_t cap = c->cap ? c->cap * 2 : 8;
    while (cap < n)
        cap *= 2;
    gfe_range *r = realloc(c->r, cap * sizeof *r);
    if (!r) {
        c->oom = 1;
        return -1;
    }
    c->r = r;
    c->cap = cap;
    return 0;
}

void gfe_cset_add(gfe_cset *c, uint32_t lo, uint32_t hi)
{
    if (lo > hi || lo > GFE_CP_MAX)
        return;
    if (hi > GFE_CP_MAX)
        hi = GFE_CP_MAX;
    if (cset_reserve(c, c->n + 1))
        return;
    /* find first range that ends at or after lo-1 */
    size_t i = 0;
    while (i < c->n && c->r[i].hi + 1 < lo)
        i++;
    size_t j = i;
    while (j < c->n && c->r[j].lo <= (hi == GFE_CP_MAX ? hi : hi + 1)) {
        if (c->r[j].lo < lo)
            lo = c->r[j].lo;
        if (c->r[j].hi > hi)
            hi = c->r[j].hi;
        j++;
    }
    /* replace [i, j) by one range */
    if (j == i) {
        memmove(c->r + i + 1, c->r + i, (c->n - i) * sizeof *c->r);
        c->n++;
    } else if (j > i + 1) {
        memmove(c->r + i + 1, c->r + j, (c->n - j) * sizeof *c->r);
        c->n -= j - i - 1;
    }
    c->r[i].lo = lo;
    c->r[i].hi = hi;
}

void gfe_cset_add_set(gfe_cset *c, const gfe_cset *o)
{
    for (size_t i = 0; i < o->n; i++)
        gfe_cset_add(c, o->r[i].lo, o->r[i].hi);
    if (o->oom)
        c->oom = 1;
}

void gfe_cset_negate(gfe_cset *c)
{
    gfe_cset out = {0};
    uint32_t next = 0;
    for (size_t i = 0; i < c->n; i++) {
        if (c->r[i].lo > next)
            gfe_cset_add(&out, next, c->r[i].lo - 1);
        next = c->r[i].hi + 1;
    }
    if (next <= GFE_CP_MAX)
        gfe_cset_add(&out, next, GFE_CP_MAX);
    if (c->oom)
        out.oom = 1;
    free(c->r);
    *c = out;
}

void gfe_cset_sub(gfe_cset *c, uint32_t lo, uint32_t hi)
{
    gfe_cset_negate(c);
    gfe_cset_add(c, lo, hi);
    gfe_cset_negate(c);
}

int gfe_cset_has(const gfe_cset *c, uint32_t cp)
{
    for (size_t i = 0; i < c->n; i++)
        if (cp >= c->r[i].lo && cp <= c->r[i].hi)
            return 1;
    return 0;
}

int gfe_cset_copy(gfe_cset *dst, const gfe_cset *src)
{
    memset(dst, 0, sizeof *dst);
    if (cset_reserve(dst, src->n ? src->n : 1))
        return -1;
    if (src->n)
        memcpy(dst->r, src->r, src->n * sizeof *src->r);
    dst->n = src->n;
    dst->oom = src->oom;
    return 0;
}

void gfe_cset_fold_ascii(gfe_cset *c)
{
    gfe_cset add = {0};
    for (uint32_t ch = 'a'; ch <= 'z'; ch++) {
        if (gfe_cset_has(c, ch))
            gfe_cset_add(&add, ch - 32, ch - 32);
        if (gfe_cset_has(c, ch - 32))
            gfe_cset_add(&add, ch, ch);
    }
    gfe_cset_add_set(c, &add);
    gfe_cset_free(&add);
}

static void class_cp(gfe_buf *b, uint32_t cp)
{
    if (cp >= 0x20 && cp < 0x7f) {
        if (cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^' || cp == '"')
            gfe_buf_put(b, "\\", 1);
        char ch = (char)cp;
        gfe_buf_put(b, &ch, 1);
    } else if (cp <= 0xFFFF) {
        gfe_buf_printf(b, "\\u%04X", (unsigned)cp);
    } else {
        gfe_buf_printf(b, "\\U%08X", (unsigned)cp);
    }
}

static void class_emit(gfe_buf *b, const gfe_range *r, size_t n, int negate)
{
    gfe_buf_puts(b, negate ? "[^" : "[");
    for (size_t i = 0; i < n; i++) {
        class_cp(b, r[i].lo);
        if (r[i].hi > r[i].lo) {
            if (r[i].hi > r[i].lo + 1)
                gfe_buf_put(b, "-", 1);
            class_cp(b, r[i].hi);
        }
    }
    gfe_buf_puts(b, "]");
}

void gfe_cset_emit_raw(gfe_buf *b, const gfe_cset *c)
{
    if (c->n == 1 && c->r[0].lo == c->r[0].hi) {
        char u[4];
        int k = gfe_utf8_put(u, c->r[0].lo);
        gfe_buf_lit(b, u, (size_t)k);
        return;
    }
    gfe_cset neg;
    if (gfe_cset_copy(&neg, c)) {
        b->err = TERN_ENOMEM;
        return;
    }
    gfe_cset_negate(&neg);
    gfe_cset_sub(&neg, 0xD800, 0xDFFF); /* never valid text anyway */
    /* negated form only when it is shorter and all-ASCII: some engines
     * treat non-ASCII members of negated classes specially */
    if (neg.n && neg.n < c->n && neg.r[neg.n - 1].hi < 0x80)
        class_emit(b, neg.r, neg.n, 1);
    else
        class_emit(b, c->r, c->n, 0);
    if (neg.oom)
        b->err = TERN_ENOMEM;
    gfe_cset_free(&neg);
}

void gfe_cset_emit_json(gfe_buf *b, const gfe_cset *c)
{
    static const struct { uint32_t cp; const char *esc; } shorts[] = {
        {'"', "\"\\\\\\\"\""}, {'\\', "\"\\\\\\\\\""}, {'/', "\"\\\\/\""},
        {8, "\"\\\\b\""},     {12, "\"\\\\f\""},      {10, "\"\\\\n\""},
        {13, "\"\\\\r\""},    {9, "\"\\\\t\""},
    };
    int n_alt = 0;
    gfe_buf_puts(b, "(");
    gfe_cset raw;
    if (gfe_cset_copy(&raw, c)) {
        b->err = TERN_ENOMEM;
        return;
    }
    gfe_cset_sub(&raw, 0, 0x1F);
    gfe_cset_sub(&raw, '"', '"');
    gfe_cset_sub(&raw, '\\', '\\');
    gfe_cset_sub(&raw, 0xD800, 0xDFFF);
    if (raw.n) {
        gfe_cset_emit_raw(b, &raw);
        n_alt++;
    }
    if (raw.oom)
        b->err = TERN_ENOMEM;
    gfe_cset_free(&raw);
    for (size_t i = 0; i < sizeof shorts / sizeof shorts[0]; i++) {
        if (!gfe_cset_has(c, shorts[i].cp))
            continue;
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        gfe_buf_puts(b, shorts[i].esc);
    }
    for (size_t i = 0; i < c->n; i++) {
        uint32_t lo = c->r[i].lo, hi = c->r[i].hi;
        /* BMP part, surrogates excluded */
        for (int part = 0; part < 2; part++) {
            uint32_t plo = part ? 0xE000 : 0, phi = part ? 0xFFFF : 0xD7FF;
            uint32_t a = lo > plo ? lo : plo, z = hi < phi ? hi : phi;
            if (a > z)
                continue;
            gfe_buf_puts(b, n_alt++ ? " | " : "");
            gfe_buf_puts(b, "\"\\\\u\" ");
            gfe_emit_hex_range(b, a, z, 4);
        }
        /* astral part as surrogate pairs, split by high surrogate */
        uint32_t a = lo > 0x10000 ? lo : 0x10000;
        while (a <= hi && a >= 0x10000) {
            uint32_t h = 0xD800 + ((a - 0x10000) >> 10);
            uint32_t block_end = 0x10000 + (((a - 0x10000) >> 10) << 10) + 0x3FF;
            uint32_t z = hi < block_end ? hi : block_end;
            /* merge whole blocks with the same low range */
            uint32_t h_end = h;
            if ((a & 0x3FF) == 0 && z == block_end) {
                while (z < hi && hi - z >= 0x400) {
                    z += 0x400;
                    h_end++;
                }
            }
            uint32_t llo = 0xDC00 + ((a - 0x10000) & 0x3FF);
            uint32_t lhi = 0xDC00 + ((z - 0x10000) & 0x3FF);
            gfe_buf_puts(b, n_alt++ ? " | " : "");
            gfe_buf_puts(b, "\"\\\\u\" ");
            gfe_emit_hex_range(b, h, h_end, 4);
            gfe_buf_puts(b, " \"\\\\u\" ");
            gfe_emit_hex_range(b, llo, lhi, 4);
            if (z == GFE_CP_MAX)
                break;
            a = z + 1;
        }
    }
    if (!n_alt)
        b->err = b->err ? b->err : TERN_EINTERNAL;
    gfe_buf_puts(b, ")");
}

/* ---------------------------------------------------------------- digits */

static void digit_class(gfe_buf *b, int a, int z, int base)
{
    if (a == z && (base == 10 || a < 10)) {
        gfe_buf_printf(b, "\"%c\"", '0' + a);
        return;
    }
    gfe_buf_puts(b, "[");
    if (a <= 9) {
        int e = z < 9 ? z : 9;
        gfe_buf_printf(b, e > a ? "%c-%c" : "%c", '0' + a, '0' + e);
    }
    if (base == 16 && z >= 10) {
        int s = a > 10 ? a : 10;
        for (int up = 0; up < 2; up++) {
            char c0 = (char)((up ? 'A' : 'a') + s - 10), c1 = (char)((up ? 'A' : 'a') + z - 10);
            if (c1 > c0)
                gfe_buf_printf(b, "%c-%c", c0, c1);
            else
                gfe_buf_printf(b, "%c", c0);
        }
    }
    gfe_buf_puts(b, "]");
}

static void any_digits(gfe_buf *b, int k, int base)
{
    if (k <= 0)
        return;
    gfe_buf_puts(b, base == 16 ? "[0-9a-fA-F]" : "[0-9]");
    if (k > 1)
        gfe_buf_printf(b, "{%d}", k);
}

static int all_is(const int *d, int w, int v)
{
    for (int i = 0; i < w; i++)
        if (d[i] != v)
            return 0;
    return 1;
}

/* lo[0..w) <= hi[0..w), both digit arrays of the same width */
static void fixed_range(gfe_buf *b, const int *lo, const int *hi, int w, int base)
{
    if (w == 0) {
        gfe_buf_puts(b, "\"\"");
        return;
    }
    if (lo[0] == hi[0]) {
        digit_class(b, lo[0], lo[0], base);
        if (w > 1) {
            gfe_buf_puts(b, " ");
            fixed_range(b, lo + 1, hi + 1, w - 1, base);
        }
        return;
    }
    int maxd = base - 1, n_alt = 0;
    int mins[20] = {0}, maxs[20];
    for (int i = 0; i < 20; i++)
        maxs[i] = maxd;
    int start = lo[0], end = hi[0];
    gfe_buf_puts(b, "(");
    if (!all_is(lo + 1, w - 1, 0)) {
        digit_class(b, lo[0], lo[0], base);
        gfe_buf_puts(b, " ");
        fixed_range(b, lo + 1, maxs, w - 1, base);
        n_alt++;
        start++;
    }
    int hi_special = !all_is(hi + 1, w - 1, maxd);
    if (hi_special)
        end--;
    if (start <= end) {
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        digit_class(b, start, end, base);
        if (w > 1) {
            gfe_buf_puts(b, " ");
            any_digits(b, w - 1, base);
        }
    }
    if (hi_special) {
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        digit_class(b, hi[0], hi[0], base);
        gfe_buf_puts(b, " ");
        fixed_range(b, mins, hi + 1, w - 1, base);
    }
    gfe_buf_puts(b, ")");
}

static int to_digits(uint64_t v, int w, int base, int *d)
{
    for (int i = w - 1; i >= 0; i--) {
        d[i] = (int)(v % (unsigned)base);
        v /= (unsigned)base;
    }
    return 0;
}

static int n_digits(uint64_t v)
{
    int n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

void gfe_emit_hex_range(gfe_buf *b, uint32_t lo, uint32_t hi, int width)
{
    int dl[8], dh[8];
    to_digits(lo, width, 16, dl);
    to_digits(hi, width, 16, dh);
    fixed_range(b, dl, dh, width, 16);
}

void gfe_emit_uint_range(gfe_buf *b, int64_t lo, int64_t hi)
{
    if (lo < 0)
        lo = 0;
    int l0 = n_digits((uint64_t)lo), l1 = hi < 0 ? l0 : n_digits((uint64_t)hi);
    int n_alt = 0;
    gfe_buf_puts(b, "(");
    for (int L = l0; L <= l1 && L <= 18; L++) {
        uint64_t p = 1;
        for (int i = 1; i < L; i++)
            p *= 10;
        uint64_t a = L == 1 ? 0 : p, z = p * 10 - 1;
        if ((uint64_t)lo > a)
            a = (uint64_t)lo;
        if (hi >= 0 && (uint64_t)hi < z)
            z = (uint64_t)hi;
        if (a > z)
            continue;
        int da[20], dz[20];
        to_digits(a, L, 10, da);
        to_digits(z, L, 10, dz);
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        fixed_range(b, da, dz, L, 10);
    }
    if (hi < 0) {
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        gfe_buf_printf(b, "[1-9] [0-9]{%d,}", l0);
    }
    gfe_buf_puts(b, ")");
}

/* ---------------------------------------------------------------- utf8 */

int gfe_utf8_put(char *out, uint32_t cp)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int gfe_utf8_get(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0)
        return -1;
    if (u[0] < 0x80) {
        *cp = u[0];
        return 1;
    }
    int len;
    uint32_t c, min;
    if ((u[0] & 0xE0) == 0xC0) {
        len = 2, c = u[0] & 0x1F, min = 0x80;
    } else if ((u[0] & 0xF0) == 0xE0) {
        len = 3, c = u[0] & 0x0F, min = 0x800;
    } else if ((u[0] & 0xF8) == 0xF0) {
        len = 4, c = u[0] & 0x07, min = 0x10000;
    } else {
        return -1;
    }
    if ((size_t)len > n)
        return -1;
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return -1;
        c = (c << 6) | (u[i] & 0x3F);
    }
    if (c < min || c > GFE_CP_MAX || (c >= 0xD800 && c <= 0xDFFF))
        return -1;
    *cp = c;
    return len;
}
