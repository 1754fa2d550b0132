/* Per-type grammars of the JSON Schema front end: enum/const literals,
 * numbers (exact digit-range grammars for bounds), strings (length,
 * pattern, format), arrays (prefixItems/items, counts, contains) and
 * objects (properties in schema order, optional ones optional, unlisted
 * keys excluded by a trie complement). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

/* Item counts above this are refused rather than written as huge bounded
 * repetitions (no generator needs them; the engine would pay for them). */
#define SC_MAX_COUNT 100000
/* Integer bounds are exact up to this magnitude; beyond it the grammar
 * stops at 17 digits (rejecting a few valid huge numbers, never accepting
 * an invalid one). */
#define SC_INT_LIMIT 99999999999999999LL

static json_object *get(json_object *s, const char *k)
{
    json_object *v = NULL;
    if (json_object_is_type(s, json_type_object))
        json_object_object_get_ex(s, k, &v);
    return v;
}

static int is_num(json_object *v)
{
    return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double);
}

static double numv(json_object *v)
{
    return json_object_is_type(v, json_type_int) ? (double)json_object_get_int64(v)
                                                 : json_object_get_double(v);
}

/* Non-negative integer keyword (minLength...): 0 ok (fills *out, -1 if
 * absent), else error. */
static int get_count(sc *c, json_object *s, const char *k, const char *path, long *out)
{
    json_object *v = get(s, k);
    *out = -1;
    if (!v)
        return 0;
    if (!is_num(v) || numv(v) < 0 || numv(v) != floor(numv(v)))
        return sc_fail(c, TERN_EINVAL, path, "'%s' must be a non-negative integer", k);
    if (numv(v) > SC_MAX_COUNT) {
        if (k[1] == 'a') /* maxX beyond the cap: no bound in practice */
            return 0;
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'%s' too large", k);
    }
    *out = (long)numv(v);
    return 0;
}

static int add_rule(sc *c, gfe_buf *b, const char *path, char name[GFE_NAME_MAX])
{
    if (b->err)
        return sc_fail(c, b->err, path, "grammar too large");
    gfe_rule_add(&c->r, b->s ? b->s : "\"\"", name);
    if (c->r.out.err)
        return sc_fail(c, c->r.out.err, path, "grammar larger than the output limit");
    return 0;
}

static void rep(gfe_buf *b, long lo, long hi)
{
    if (hi < 0) {
        if (lo == 0)
            gfe_buf_puts(b, "*");
        else if (lo == 1)
            gfe_buf_puts(b, "+");
        else
            gfe_buf_printf(b, "{%ld,}", lo);
    } else if (lo == hi) {
        if (lo != 1)
            gfe_buf_printf(b, "{%ld}", lo);
    } else if (lo == 0 && hi == 1) {
        gfe_buf_puts(b, "?");
    } else {
        gfe_buf_printf(b, "{%ld,%ld}", lo, hi);
    }
}

/* ------------------------------------------------------------ literals */

void sc_emit_string_lit(sc *c, gfe_buf *b, const char *s, size_t len)
{
    char run[256];
    size_t n = 0;
    gfe_buf_puts(b, "(\"\\\"\"");
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = gfe_utf8_get(s + i, len - i, &cp);
        if (k < 0) { /* not UTF-8: cannot be produced as text */
            cp = 0xFFFD;
            k = 1;
        }
        i += (size_t)k;
        if (cp >= 0x20 && cp < 0x7f && cp != '"' && cp != '\\') {
            run[n++] = (char)cp;
            if (n < sizeof run)
                continue;
        }
        if (n) {
            gfe_buf_puts(b, " ");
            gfe_buf_lit(b, run, n);
            n = 0;
        }
        if (cp >= 0x20 && cp < 0x7f && cp != '"' && cp != '\\')
            continue;
        gfe_cset one = {0};
        gfe_cset_add(&one, cp, cp);
        gfe_buf_puts(b, " ");
        gfe_cset_emit_json(b, &one);
        gfe_cset_free(&one);
    }
    if (n) {
        gfe_buf_puts(b, " ");
        gfe_buf_lit(b, run, n);
    }
    gfe_buf_puts(b, " \"\\\"\")");
}

/* A number literal; an integral value also matches its ".0" forms (JSON
 * Schema compares numbers by value: 1.0 equals 1). */
static void emit_number_text(gfe_buf *b, json_object *v)
{
    char t[64];
    int integral = 1;
    if (json_object_is_type(v, json_type_int)) {
        snprintf(t, sizeof t, "%lld", (long long)json_object_get_int64(v));
    } else {
        double d = json_object_get_double(v);
        if (d == floor(d) && fabs(d) < 1e17) {
            snprintf(t, sizeof t, "%.0f", d);
            if (!strcmp(t, "-0"))
                strcpy(t, "0");
        } else {
            integral = 0;
            for (int p = 1; p <= 17; p++) {
                snprintf(t, sizeof t, "%.*g", p, d);
                if (strtod(t, NULL) == d)
                    break;
            }
        }
    }
    gfe_buf_puts(b, "(");
    gfe_buf_lit(b, t, strlen(t));
    if (integral && !strcmp(t, "0"))
        gfe_buf_puts(b, " (\".\" \"0\"+)? | \"-0\" (\".\" \"0\"+)?");
    else if (integral)
        gfe_buf_puts(b, " (\".\" \"0\"+)?");
    gfe_buf_puts(b, ")");
}

/* Objects with a few members match in any member order (JSON Schema
 * equality ignores order); larger ones in the order given. */
#define SC_PERMUTE_MAX 4

static void emit_object_perm(sc *c, gfe_buf *b, json_object *v, const char **keys, int n, int *idx)
{
    const char *w = sc_ws(c);
    gfe_buf_printf(b, "(\"{\"%s", w);
    for (int i = 0; i < n; i++) {
        if (i)
            gfe_buf_printf(b, "%s\",\"%s", w, w);
        sc_emit_string_lit(c, b, keys[idx[i]], strlen(keys[idx[i]]));
        gfe_buf_printf(b, "%s\":\"%s", w, w);
        sc_emit_value(c, b, json_object_object_get(v, keys[idx[i]]));
    }
    gfe_buf_printf(b, "%s\"}\")", n ? w : " ");
}

static void permute(sc *c, gfe_buf *b, json_object *v, const char **keys, int n, int *idx, int k, int *first)
{
    if (k == n) {
        if (!*first)
            gfe_buf_puts(b, " | ");
        *first = 0;
        emit_object_perm(c, b, v, keys, n, idx);
        return;
    }
    for (int i = k; i < n; i++) {
        int t = idx[k];
        idx[k] = idx[i];
        idx[i] = t;
        permute(c, b, v, keys, n, idx, k + 1, first);
        t = idx[k];
        idx[k] = idx[i];
        idx[i] = t;
    }
}

void sc_emit_value(sc *c, gfe_buf *b, json_object *v)
{
    const char *w = sc_ws(c);
    switch (json_object_get_type(v)) {
    case json_type_null: gfe_buf_puts(b, "\"null\""); return;
    case json_type_boolean: gfe_buf_puts(b, json_object_get_boolean(v) ? "\"true\"" : "\"false\""); return;
    case json_type_int:
    case json_type_double: emit_number_text(b, v); return;
    case json_type_string:
        sc_emit_string_lit(c, b, json_object_get_string(v), (size_t)json_object_get_string_len(v));
        return;
    case json_type_array: {
        size_t n = json_object_array_length(v);
        gfe_buf_printf(b, "(\"[\"%s", w);
        for (size_t i = 0; i < n; i++) {
            if (i)
                gfe_buf_printf(b, "%s\",\"%s", w, w);
            sc_emit_value(c, b, json_object_array_get_idx(v, i));
        }
        gfe_buf_printf(b, "%s\"]\")", n ? w : " ");
        return;
    }
    case json_type_object: {
        const char *keys[SC_PERMUTE_MAX];
        int idx[SC_PERMUTE_MAX], n = 0, first = 1;
        int total = json_object_object_length(v);
        if (total > SC_PERMUTE_MAX) {
            int i = 0;
            gfe_buf_printf(b, "(\"{\"%s", w);
            json_object_object_foreach(v, k, e) {
                if (i++)
                    gfe_buf_printf(b, "%s\",\"%s", w, w);
                sc_emit_string_lit(c, b, k, strlen(k));
                gfe_buf_printf(b, "%s\":\"%s", w, w);
                sc_emit_value(c, b, e);
            }
            gfe_buf_printf(b, "%s\"}\")", w);
            return;
        }
        json_object_object_foreach(v, k, e) {
            (void)e;
            idx[n] = n;
            keys[n++] = k;
        }
        gfe_buf_puts(b, "(");
        permute(c, b, v, keys, n, idx, 0, &first);
        gfe_buf_puts(b, ")");
        return;
    }
    }
}

/* ------------------------------------------------------------ numbers */

typedef struct bound { int has; double v; int incl; } bound;

static const char *FRAC_ANY = "(\".\" [0-9]+)?";
static const char *FRAC_ZERO = "(\".\" \"0\"+)?";
static const char *FRAC_NONZERO = "(\".\" [0-9]* [1-9] [0-9]*)";

/* Magnitudes m >= 0 written I(.F)? with integral bounds lo/hi (>= 0).
 * Returns the number of alternatives written (0: empty). */
static int emit_mag(gfe_buf *b, bound lo, bound hi, int integer)
{
    int n = 0;
    const char *any = integer ? "" : FRAC_ANY;
    long long L = lo.has ? (long long)lo.v : 0;
    long long ilo = lo.has ? (lo.incl ? L : L + 1) : 0;
    long long ihi = hi.has ? (long long)hi.v - (integer && hi.incl ? 0 : 1) : -1;
    if (!hi.has || ihi >= ilo) {
        if (hi.has && ihi < ilo)
            ;
        else {
            gfe_buf_puts(b, n++ ? " | " : "");
            gfe_emit_uint_range(b, ilo, hi.has ? ihi : -1);
            if (*any) {
                gfe_buf_puts(b, " ");
                gfe_buf_puts(b, any);
            }
        }
    }
    if (integer)
        return n;
    /* exclusive lower bound: I == lo with a non-zero fraction */
    if (lo.has && !lo.incl && (!hi.has || hi.v > lo.v)) {
        gfe_buf_puts(b, n++ ? " | " : "");
        gfe_emit_uint_range(b, L, L);
        gfe_buf_printf(b, " %s", FRAC_NONZERO);
    }
    /* inclusive upper bound: I == hi with a zero fraction */
    if (hi.has && hi.incl && (!lo.has || hi.v > lo.v || (hi.v == lo.v && lo.incl))) {
        gfe_buf_puts(b, n++ ? " | " : "");
        gfe_emit_uint_range(b, (long long)hi.v, (long long)hi.v);
        gfe_buf_printf(b, " %s", FRAC_ZERO);
    }
    return n;
}

/* multipleOf: divisors above this are refused (the grammar has one rule
 * per remainder). */
#define SC_MULTIPLE_MAX 2000
/* ...and so are automata past this many rules (remainders x fraction
 * positions): grammars that size cost the engine more than they are worth. */
#define SC_MULTIPLE_RULES 600

static long gcd(long a, long b)
{
    while (b) {
        long t = a % b;
        a = b;
        b = t;
    }
    return a;
}

int sc_decimal(json_object *v, long *p, int *q)
{
    char t[64];
    if (json_object_is_type(v, json_type_int)) {
        if (json_object_get_int64(v) <= 0 || json_object_get_int64(v) > 1000000000)
            return -1;
        *p = (long)json_object_get_int64(v);
        *q = 0;
        return 0;
    }
    double d = json_object_get_double(v);
    if (!(d > 0) || d > 1e9)
        return -1;
    for (int pr = 1; pr <= 17; pr++) {
        snprintf(t, sizeof t, "%.*e", pr - 1, d);
        if (strtod(t, NULL) == d)
            break;
    }
    /* t = "D.DDDe[+-]XX": mantissa digits and exponent */
    long mant = 0;
    int nd = 0, exp10;
    char *e = strchr(t, 'e');
    if (!e)
        return -1;
    exp10 = atoi(e + 1);
    for (char *x = t; x < e; x++) {
        if (*x >= '0' && *x <= '9') {
            if (nd >= 10)
                return -1;
            mant = mant * 10 + (*x - '0');
            nd++;
        }
    }
    /* value = mant * 10^(exp10 - (nd-1)) */
    int sh = exp10 - (nd - 1);
    while (sh > 0) {
        if (mant > 100000000)
            return -1;
        mant *= 10;
        sh--;
    }
    while (sh < 0 && mant % 10 == 0) {
        mant /= 10;
        sh++;
    }
    if (-sh > 9)
        return -1;
    *p = mant;
    *q = -sh;
    return 0;
}

/* Decimal texts (no exponent) of multiples of p / 10^q: a DFA over the
 * remainder of the digits read so far (integer digits, then the first q
 * fraction digits; later fraction digits must be zeros). */
static int emit_multiple(sc *c, gfe_buf *out, long p, int q, int integer, const char *path)
{
    long pow10[12] = {1};
    for (int i = 1; i < 12; i++)
        pow10[i] = pow10[i - 1] * 10 % p;
    /* names: I[r] integer part continues; F[j][r] after '.', j digits read */
    size_t n_rules = (size_t)p * (size_t)(q + 3);
    char (*nm)[GFE_NAME_MAX] = calloc(n_rules, sizeof *nm);
    if (!nm)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
#define RI(r) nm[(r)]
#define RF(j, r) nm[(size_t)p * (size_t)(1 + (j)) + (size_t)(r)]
    for (size_t i = 0; i < n_rules; i++)
        gfe_rule_reserve(&c->r, nm[i]);
    gfe_buf b;
    gfe_buf_init(&b, 0);
    for (long r = 0; r < p && !b.err; r++) {
        /* integer part: another digit, or the end of it */
        b.len = 0;
        for (int d = 0; d <= 9; d++)
            gfe_buf_printf(&b, "%s\"%d\" %s", d ? " | " : "", d, RI((r * 10 + d) % p));
        int ends = (r * pow10[q]) % p == 0;
        if (ends)
            gfe_buf_puts(&b, " | \"\"");
        if (!integer)
            gfe_buf_printf(&b, " | \".\" %s", RF(0, r));
        gfe_rule_define(&c->r, RI(r), b.s);
        if (integer)
            continue;
        /* j = fraction digits read; q+1 = more than q (zeros only) */
        for (int j = 0; j <= q + 1; j++) {
            b.len = 0;
            if (j < q) {
                for (int d = 0; d <= 9; d++)
                    gfe_buf_printf(&b, "%s\"%d\" %s", d ? " | " : "", d, RF(j + 1, (r * 10 + d) % p));
            } else {
                gfe_buf_printf(&b, "\"0\" %s", RF(q + 1, r));
            }
            int jj = j < q ? j : q;
            if (j > 0 && (r * pow10[q - jj]) % p == 0)
                gfe_buf_puts(&b, " | \"\"");
            gfe_rule_define(&c->r, RF(j, r), b.s);
        }
    }
    int err = b.err;
    gfe_buf_free(&b);
    /* "0" starts a number whose integer part is just 0 */
    gfe_buf_puts(out, "(\"-\"? (\"0\"");
    if (!integer)
        gfe_buf_printf(out, " (\".\" %s)?", RF(0, 0));
    for (int d = 1; d <= 9; d++)
        gfe_buf_printf(out, " | \"%d\" %s", d, RI(d % p));
    gfe_buf_puts(out, "))");
#undef RI
#undef RF
    free(nm);
    if (err)
        return sc_fail(c, err, path, "grammar too large");
    return 0;
}

/* ---- decimal bounds: m = I.F compared digit by digit with a bound's
 * fraction string. A state is (offset into the lower bound's fraction or
 * -1 once exceeded, the same for the upper bound); rules per live state. */

#define DEC_FRAC_MAX 24

/* Splits v >= 0 into its integer part and fraction digits (shortest
 * round-trip decimal, no trailing zeros). -1 when too large or too fine. */
static int dec_split(double v, long long *ip, char frac[DEC_FRAC_MAX])
{
    char t[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, v);
        if (strtod(t, NULL) == v)
            break;
    }
    char dig[24];
    int nd = 0;
    char *e = strchr(t, 'e');
    if (!e)
        return -1;
    for (char *x = t; x < e; x++)
        if (*x >= '0' && *x <= '9')
            dig[nd++] = *x;
    int ex = atoi(e + 1); /* value = d0.d1d2... * 10^ex */
    if (ex > 17) /* the 17-digit cap makes larger bounds unnecessary */
        return -1;
    long long ipart = 0;
    int fo = 0;
    for (int i = 0; i < nd; i++) {
        int pos = i - ex; /* digit i has weight 10^(ex - i) */
        if (pos <= 0) {
            ipart = ipart * 10 + (dig[i] - '0');
        } else {
            while (fo < pos - 1 && fo < DEC_FRAC_MAX - 1)
                frac[fo++] = '0';
            if (fo >= DEC_FRAC_MAX - 1)
                return -1;
            frac[fo++] = dig[i];
        }
    }
    for (int i = nd; i <= ex; i++) /* trailing integer zeros */
        ipart *= 10;
    while (fo > 0 && frac[fo - 1] == '0')
        fo--;
    frac[fo] = 0;
    *ip = ipart;
    return 0;
}

typedef struct frac_ctx {
    const char *a, *b; /* NULL: that side does not constrain */
    int ai, bi;        /* inclusive */
    int la, lb;
    char (*names)[GFE_NAME_MAX];
    unsigned char *live;
} frac_ctx;

/* state index: (ao + 1) * (lb + 2) + (bo + 1) */
static int fidx(const frac_ctx *f, int ao, int bo) { return (ao + 1) * (f->lb + 2) + (bo + 1); }

/* Normalizes a state; returns 0 if dead. */
static int fnorm(const frac_ctx *f, int *ao, int *bo)
{
    if (*ao >= 0 && f->a[*ao] == 0 && f->ai)
        *ao = -1; /* remaining lower bound 0, inclusive: always holds */
    if (*bo >= 0 && f->b[*bo] == 0 && !f->bi)
        return 0; /* strictly below 0: impossible */
    return 1;
}

static int fend_ok(const frac_ctx *f, int ao, int bo)
{
    int lo = ao < 0 || (f->a[ao] == 0 && f->ai);
    int hi = bo < 0 || f->bi || f->b[bo] != 0;
    return lo && hi;
}

/* Next state after digit d; 0 if dead. */
static int fstep(const frac_ctx *f, int ao, int bo, int d, int *nao, int *nbo)
{
    *nao = ao;
    *nbo = bo;
    if (ao >= 0) {
        int a0 = f->a[ao] ? f->a[ao] - '0' : 0;
        if (d > a0)
            *nao = -1;
        else if (d < a0)
            return 0;
        else if (f->a[ao])
            *nao = ao + 1;
    }
    if (bo >= 0) {
        int b0 = f->b[bo] ? f->b[bo] - '0' : 0;
        if (d < b0)
            *nbo = -1;
        else if (d > b0)
            return 0;
        else if (f->b[bo])
            *nbo = bo + 1;
    }
    return fnorm(f, nao, nbo);
}

/* Writes the digit transitions of state (ao, bo) to live states. */
static int ftrans(const frac_ctx *f, gfe_buf *b, int ao, int bo, int n_alt)
{
    int d = 0;
    while (d <= 9) {
        int na, nb;
        if (!fstep(f, ao, bo, d, &na, &nb) || !f->live[fidx(f, na, nb)]) {
            d++;
            continue;
        }
        int e = d;
        int na2, nb2;
        while (e + 1 <= 9 && fstep(f, ao, bo, e + 1, &na2, &nb2) && na2 == na && nb2 == nb)
            e++;
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        if (e > d)
            gfe_buf_printf(b, "[%d-%d] %s", d, e, f->names[fidx(f, na, nb)]);
        else
            gfe_buf_printf(b, "\"%d\" %s", d, f->names[fidx(f, na, nb)]);
        d = e + 1;
    }
    return n_alt;
}

/* Appends the fraction part ("" or "." digits) for the constraints; 0 if
 * no fraction satisfies them. */
static int emit_frac(sc *c, gfe_buf *out, const char *a, int ai, const char *b, int bi)
{
    frac_ctx f = {.a = a, .b = b, .ai = ai, .bi = bi};
    f.la = a ? (int)strlen(a) : 0;
    f.lb = b ? (int)strlen(b) : 0;
    int n = (f.la + 2) * (f.lb + 2);
    f.names = calloc((size_t)n, sizeof *f.names);
    f.live = calloc((size_t)n, 1);
    if (!f.names || !f.live) {
        free(f.names);
        free(f.live);
        return -1;
    }
    int a0 = a ? 0 : -1, b0 = b ? 0 : -1;
    int ok = 0;
    if (fnorm(&f, &a0, &b0)) {
        /* liveness: fixed point over the small state space */
        for (int changed = 1; changed;) {
            changed = 0;
            for (int ao = -1; ao <= (a ? f.la : -1); ao++)
                for (int bo = -1; bo <= (b ? f.lb : -1); bo++) {
                    int i = fidx(&f, ao, bo);
                    if (f.live[i])
                        continue;
                    int l = fend_ok(&f, ao, bo);
                    for (int d = 0; d <= 9 && !l; d++) {
                        int na, nb;
                        l = fstep(&f, ao, bo, d, &na, &nb) && f.live[fidx(&f, na, nb)];
                    }
                    if (l)
                        f.live[i] = 1, changed = 1;
                }
        }
        for (int i = 0; i < n; i++)
            if (f.live[i])
                gfe_rule_reserve(&c->r, f.names[i]);
        gfe_buf body;
        gfe_buf_init(&body, 0);
        for (int ao = -1; ao <= (a ? f.la : -1); ao++)
            for (int bo = -1; bo <= (b ? f.lb : -1); bo++) {
                if (!f.live[fidx(&f, ao, bo)])
                    continue;
                body.len = 0;
                int k = 0;
                if (fend_ok(&f, ao, bo)) {
                    gfe_buf_puts(&body, "\"\"");
                    k++;
                }
                ftrans(&f, &body, ao, bo, k);
                gfe_rule_define(&c->r, f.names[fidx(&f, ao, bo)], body.s);
            }
        gfe_buf_free(&body);
        /* at the top: no fraction, or "." and at least one digit */
        int k = 0;
        gfe_buf_puts(out, "(");
        if (fend_ok(&f, a0, b0)) {
            gfe_buf_puts(out, "\"\"");
            k++;
        }
        gfe_buf top;
        gfe_buf_init(&top, 0);
        if (ftrans(&f, &top, a0, b0, 0)) {
            gfe_buf_printf(out, "%s\".\" (%s)", k++ ? " | " : "", top.s);
        }
        gfe_buf_free(&top);
        gfe_buf_puts(out, ")");
        ok = k > 0;
    }
    free(f.names);
    free(f.live);
    return ok;
}

/* Magnitudes m >= 0 with decimal bounds lo/hi (lo.v >= 0). */
static int emit_mag_dec(sc *c, gfe_buf *b, bound lo, bound hi)
{
    long long li, hi_i;
    char lf[DEC_FRAC_MAX], hf[DEC_FRAC_MAX];
    if (dec_split(lo.v, &li, lf) || dec_split(hi.v, &hi_i, hf))
        return -1;
    int n = 0;
    if (li + 1 <= hi_i - 1) {
        gfe_buf_puts(b, n++ ? " | " : "");
        gfe_emit_uint_range(b, li + 1, hi_i - 1);
        gfe_buf_printf(b, " %s", FRAC_ANY);
    }
    gfe_buf t;
    gfe_buf_init(&t, 0);
    for (int side = 0; side < (li == hi_i ? 1 : 2); side++) {
        long long iv = side ? hi_i : li;
        t.len = 0;
        gfe_emit_uint_range(&t, iv, iv);
        gfe_buf_puts(&t, " ");
        int r = li == hi_i ? emit_frac(c, &t, lf, lo.incl, hf, hi.incl)
                           : side == 0 ? emit_frac(c, &t, lf, lo.incl, NULL, 1)
                                       : emit_frac(c, &t, NULL, 1, hf, hi.incl);
        if (r < 0) {
            gfe_buf_free(&t);
            return -1;
        }
        if (r) {
            gfe_buf_puts(b, n++ ? " | " : "");
            gfe_buf_put(b, t.s, t.len);
        }
    }
    gfe_buf_free(&t);
    return n;
}

static int gen_number(sc *c, json_object *s, int integer, const char *path, gfe_buf *out)
{
    bound lo = {0}, hi = {0};
    static const char *const ks[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        json_object *v = get(s, ks[i]);
        if (!v)
            continue;
        if (!is_num(v))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'%s' must be a number", ks[i]);
        double d = numv(v);
        int incl = i == 0 || i == 2;
        if (!isfinite(d))
            return sc_fail(c, TERN_EINVAL, path, "'%s' must be finite", ks[i]);
        bound *t = i < 2 ? &lo : &hi;
        /* the tighter of minimum / exclusiveMinimum wins */
        if (!t->has || (i < 2 ? (d > t->v || (d == t->v && !incl)) : (d < t->v || (d == t->v && !incl)))) {
            t->has = 1;
            t->v = d;
            t->incl = incl;
        }
    }
    json_object *mo = get(s, "multipleOf");
    if (mo) {
        long mp;
        int mq;
        if (!is_num(mo) || numv(mo) <= 0)
            return sc_fail(c, TERN_EINVAL, path, "'multipleOf' must be a positive number");
        if (sc_decimal(mo, &mp, &mq) || mp > SC_MULTIPLE_MAX)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'multipleOf' value too fine or too large");
        if (integer) { /* an integer x is a multiple of p/10^q iff p/gcd(p,10^q) divides x */
            long t = 1;
            for (int i = 0; i < mq; i++)
                t *= 10;
            mp /= gcd(mp, t);
            mq = 0;
        }
        if ((long)(mp * (mq + 3)) > SC_MULTIPLE_RULES)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'multipleOf' needs too many grammar states");
        if (mp > 1 || mq > 0) {
            if (lo.has || hi.has)
                return sc_fail(c, TERN_EUNSUPPORTED, path, "'multipleOf' together with numeric bounds");
            return emit_multiple(c, out, mp, mq, integer, path);
        }
        if (mq == 0)
            integer = 1;
    }
    if (!lo.has && !hi.has) {
        gfe_buf_puts(out, integer ? "(\"-\"? (\"0\" | [1-9] [0-9]*))"
                                  : "(\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\-]? [0-9]+)?)");
        return 0;
    }
    if (integer) { /* integral bounds, inclusive */
        if (lo.has) {
            lo.v = lo.incl ? ceil(lo.v) : floor(lo.v) + 1;
            lo.incl = 1;
        }
        if (hi.has) {
            hi.v = hi.incl ? floor(hi.v) : ceil(hi.v) - 1;
            hi.incl = 1;
        }
    }
    int decimal = !integer && ((lo.has && lo.v != floor(lo.v)) || (hi.has && hi.v != floor(hi.v)));
    double lim = (double)SC_INT_LIMIT;
    if (lo.has && lo.v > lim) /* nothing representable in 17 digits */
        return 1;
    if (hi.has && hi.v < -lim)
        return 1;
    if (lo.has && lo.v < -lim)
        lo.v = -lim, lo.incl = 1;
    if (hi.has && hi.v > lim)
        hi.v = lim, hi.incl = 1;
    if (!lo.has)
        lo.v = -lim, lo.incl = 1, lo.has = 1;
    if (!hi.has)
        hi.v = lim, hi.incl = 1, hi.has = 1;
    if (lo.v > hi.v || (lo.v == hi.v && !(lo.incl && hi.incl)))
        return 1;
    gfe_buf b;
    gfe_buf_init(&b, 0);
    int n = 0;
    /* non-negative values */
    if (hi.v > 0 || (hi.v == 0 && hi.incl)) {
        bound plo = lo, phi = hi;
        if (lo.v < 0)
            plo.v = 0, plo.incl = 1;
        gfe_buf_puts(&b, "(");
        int r = decimal ? emit_mag_dec(c, &b, plo, phi) : emit_mag(&b, plo, phi, integer);
        if (r < 0) {
            gfe_buf_free(&b);
            return sc_fail(c, TERN_EUNSUPPORTED, path, "numeric bound with too many digits");
        }
        if (r) {
            gfe_buf_puts(&b, ")");
            gfe_buf_puts(out, n++ ? " | " : "(");
            gfe_buf_put(out, b.s, b.len);
        }
        b.len = 0;
    }
    /* negative values: "-" m with -hi <= m <= -lo (m > 0 for integers) */
    if (lo.v < 0) {
        bound mlo = {1, hi.v > 0 ? 0 : -hi.v, hi.v > 0 ? 1 : hi.incl};
        bound mhi = {1, -lo.v, lo.incl};
        if (integer && mlo.v == 0)
            mlo.v = 1, mlo.incl = 1; /* "-0" is not written for integers */
        gfe_buf_puts(&b, "(\"-\" (");
        int r = decimal ? emit_mag_dec(c, &b, mlo, mhi) : emit_mag(&b, mlo, mhi, integer);
        if (r < 0) {
            gfe_buf_free(&b);
            return sc_fail(c, TERN_EUNSUPPORTED, path, "numeric bound with too many digits");
        }
        if (r) {
            gfe_buf_puts(&b, "))");
            gfe_buf_puts(out, n++ ? " | " : "(");
            gfe_buf_put(out, b.s, b.len);
        }
    }
    gfe_buf_free(&b);
    if (!n)
        return 1;
    gfe_buf_puts(out, ")");
    return 0;
}

/* ------------------------------------------------------------ strings */

static const struct { const char *name, *re; } k_formats[] = {
    {"date", "^(\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
             "|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)$"},
    {"time", "^([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$"},
    {"date-time", "^(\\d{4}-((0[13578]|1[02])-(0[1-9]|[12]\\d|3[01])|(0[469]|11)-(0[1-9]|[12]\\d|30)|02-(0[1-9]|1\\d|2[0-8]))"
                  "|(\\d\\d(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
                  "[Tt]([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?([zZ]|[+-]([01]\\d|2[0-3]):[0-5]\\d)$"},
    {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
              "@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"ipv4", "^(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)(\\.(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)){3}$"},
    {"ipv6", "^(([0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,7}:"
             "|([0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}|([0-9a-fA-F]{1,4}:){1,5}(:[0-9a-fA-F]{1,4}){1,2}"
             "|([0-9a-fA-F]{1,4}:){1,4}(:[0-9a-fA-F]{1,4}){1,3}|([0-9a-fA-F]{1,4}:){1,3}(:[0-9a-fA-F]{1,4}){1,4}"
             "|([0-9a-fA-F]{1,4}:){1,2}(:[0-9a-fA-F]{1,4}){1,5}|[0-9a-fA-F]{1,4}:(:[0-9a-fA-F]{1,4}){1,6}"
             "|:((:[0-9a-fA-F]{1,4}){1,7}|:))$"},
    /* RFC 1123 host names, a sound subset: no "--" anywhere (so no
     * punycode A-labels, which need decoding to validate), labels of at
     * most 61 characters, at most 4 labels (within the 253 limit) */
    {"hostname", "^[A-Za-z0-9](-?[A-Za-z0-9]){0,30}(\\.[A-Za-z0-9](-?[A-Za-z0-9]){0,30}){0,3}$"},
    /* OpenAPI base64 */
    {"byte", "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"},
    /* RFC 3986 URI, conservatively: IP-literal hosts are left out */
    {"uri", "^[A-Za-z][A-Za-z0-9+.-]*:"
            "(//(([A-Za-z0-9._~!$&'()*+,;=:-]|%[0-9A-Fa-f]{2})*@)?([A-Za-z0-9._~!$&'()*+,;=-]|%[0-9A-Fa-f]{2})*"
            "(:[0-9]*)?(/([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*"
            "|(/?([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})+(/([A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})*)*)?)"
            "(\\?([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?(#([A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})*)?$"},
};

static int gen_string(sc *c, json_object *s, const char *path, gfe_buf *out)
{
    long mn, mx;
    if (get_count(c, s, "minLength", path, &mn) || get_count(c, s, "maxLength", path, &mx))
        return c->rc;
    if (mn < 0)
        mn = 0;
    if (mx >= 0 && mx < mn)
        return 1;
    json_object *pat = get(s, "pattern"), *fmt = get(s, "format");
    const char *re = NULL;
    if (fmt) {
        if (!json_object_is_type(fmt, json_type_string))
            return sc_fail(c, TERN_EINVAL, path, "'format' must be a string");
        for (size_t i = 0; i < sizeof k_formats / sizeof k_formats[0]; i++)
            if (!strcmp(json_object_get_string(fmt), k_formats[i].name))
                re = k_formats[i].re;
        if (!re)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "format '%.100s' unsupported",
                           json_object_get_string(fmt));
    }
    if (pat) {
        if (!json_object_is_type(pat, json_type_string))
            return sc_fail(c, TERN_EINVAL, path, "'pattern' must be a string");
        if (re)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'pattern' together with 'format'");
        re = json_object_get_string(pat);
    }
    if (re) {
        int never = 0;
        tern_err e;
        gfe_buf b;
        gfe_buf_init(&b, 0);
        int rc = gfe_regex_emit_len(&b, re, strlen(re), 1, 1, mn, mx, &never, &e);
        if (!rc && !never) {
            gfe_buf_puts(out, "(\"\\\"\" ");
            gfe_buf_put(out, b.s, b.len);
            gfe_buf_puts(out, " \"\\\"\")");
        }
        gfe_buf_free(&b);
        if (rc)
            return sc_fail(c, rc, path, "%s", e.msg);
        return never;
    }
    gfe_buf_printf(out, "(\"\\\"\" %s", sc_unit(c));
    rep(out, mn, mx);
    gfe_buf_puts(out, " \"\\\"\")");
    return 0;
}

/* ------------------------------------------------------------ arrays */

static json_object *all_of_own(sc *c, json_object *x, json_object *y)
{
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    if (!o || !a) {
        json_object_put(o);
        json_object_put(a);
        return sc_own(c, NULL);
    }
    json_object_array_add(a, json_object_get(x));
    json_object_array_add(a, json_object_get(y));
    json_object_object_add(o, "allOf", a);
    return sc_own(c, o);
}

static int gen_array(sc *c, json_object *s, const char *path, gfe_buf *out)
{
    long mn, mx;
    if (get_count(c, s, "minItems", path, &mn) || get_count(c, s, "maxItems", path, &mx))
        return c->rc;
    if (mn < 0)
        mn = 0;
    if (mx >= 0 && mx < mn)
        return 1;
    json_object *pre = NULL, *rest = NULL;
    json_object *items = get(s, "items");
    if (c->draft == 7 && json_object_is_type(items, json_type_array)) {
        pre = items;
        rest = get(s, "additionalItems");
    } else {
        if (json_object_is_type(items, json_type_array))
            return sc_fail(c, TERN_EINVAL, path, "'items' must be a schema (use prefixItems)");
        pre = get(s, "prefixItems");
        rest = items;
        if (get(s, "additionalItems") && c->draft != 7)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "keyword 'additionalItems' without items array");
    }
    if (pre && !json_object_is_type(pre, json_type_array))
        return sc_fail(c, TERN_EINVAL, path, "prefixItems must be an array");
    if (!rest && get(s, "unevaluatedItems"))
        rest = get(s, "unevaluatedItems");
    if (!rest) /* strict mode: no items past prefixItems unless allowed */
        rest = c->o.strict && pre ? json_object_new_boolean(0) : NULL;
    json_object *owned_rest = rest && !get(s, "items") && !get(s, "additionalItems") && !get(s, "unevaluatedItems") ? rest : NULL;
    if (owned_rest)
        sc_own(c, owned_rest);
    json_object *uq = get(s, "uniqueItems");
    if (uq && !json_object_is_type(uq, json_type_boolean))
        return sc_fail(c, TERN_EINVAL, path, "'uniqueItems' must be a boolean");
    if (uq && json_object_get_boolean(uq) && !(mx >= 0 && mx <= 1))
        return sc_fail(c, TERN_EUNSUPPORTED, path, "keyword 'uniqueItems' unsupported");
    json_object *contains = get(s, "contains");
    long min_c = 1, max_c;
    if (get(s, "minContains") || get(s, "maxContains")) {
        long t;
        if (get_count(c, s, "minContains", path, &t))
            return c->rc;
        if (t >= 0)
            min_c = t;
        if (get_count(c, s, "maxContains", path, &max_c))
            return c->rc;
        if (!contains) {
            min_c = 1;
            max_c = -1;
        }
    } else {
        max_c = -1;
    }
    if (max_c >= 0 && max_c < min_c)
        return 1;
    const char *w = sc_ws(c);
    char sub[256];
    char rest_name[GFE_NAME_MAX];
    int rest_never = 0;
    if (rest) {
        snprintf(sub, sizeof sub, "%.200s/items", path);
        if (sc_gen(c, rest, sub, rest_name, &rest_never))
            return c->rc;
    } else {
        memcpy(rest_name, sc_any(c), GFE_NAME_MAX);
    }
    if (contains) {
        if (min_c == 0 && max_c < 0)
            goto no_contains;
        if (pre || mn > 0 || mx >= 0)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'contains' together with prefixItems/minItems/maxItems");
        /* at least min_c elements match contains (and items) */
        json_object *both = json_object_new_object(), *arr = json_object_new_array();
        if (!both || !arr) {
            json_object_put(both);
            json_object_put(arr);
            return sc_fail(c, TERN_ENOMEM, path, "out of memory");
        }
        json_object_array_add(arr, json_object_get(contains));
        if (rest)
            json_object_array_add(arr, json_object_get(rest));
        json_object_object_add(both, "allOf", arr);
        sc_own(c, both);
        char cn[GFE_NAME_MAX];
        int cnever = 0;
        snprintf(sub, sizeof sub, "%.200s/contains", path);
        if (sc_gen(c, both, sub, cn, &cnever))
            return c->rc;
        if (cnever)
            return 1;
        if (rest_never) { /* only contains elements... but items forbids all */
            return 1;
        }
        if (max_c >= 0) {
            /* counted: the other elements must NOT match contains */
            json_object *nc = sc_negate(c, contains, 1, path);
            json_object *y = nc ? (rest ? all_of_own(c, rest, nc) : nc) : NULL;
            if (!y)
                return c->rc;
            char yn[GFE_NAME_MAX];
            int ynever = 0;
            if (sc_gen(c, y, sub, yn, &ynever))
                return c->rc;
            int n_alt = 0;
            gfe_buf_puts(out, "(");
            if (min_c == 0) {
                gfe_buf_printf(out, "\"[\"%s\"]\"", c->st.any_whitespace ? " ws " : " ");
                n_alt++;
                if (!ynever)
                    gfe_buf_printf(out, " | \"[\"%s%s (%s\",\"%s%s)*%s\"]\"", w, yn, w, w, yn, w);
            }
            if (max_c >= 1) {
                long lo = min_c > 1 ? min_c - 1 : 0, hi = max_c - 1;
                gfe_buf_puts(out, n_alt++ ? " | " : "");
                if (ynever) {
                    gfe_buf_printf(out, "\"[\"%s%s (%s\",\"%s%s)", w, cn, w, w, cn);
                } else {
                    gfe_buf_printf(out, "\"[\"%s(%s%s\",\"%s)* %s ((%s\",\"%s%s)*%s\",\"%s%s)", w, yn, w, w,
                                   cn, w, w, yn, w, w, cn);
                }
                rep(out, lo, hi);
                if (!ynever)
                    gfe_buf_printf(out, " (%s\",\"%s%s)*", w, w, yn);
                gfe_buf_printf(out, "%s\"]\"", w);
            }
            gfe_buf_puts(out, ")");
            return n_alt ? 0 : 1;
        }
        /* "[" (X ",")* C (("," X)* "," C){min_c-1} ("," X)* "]" */
        gfe_buf_printf(out, "(\"[\"%s(%s%s\",\"%s)* %s ((%s\",\"%s%s)*%s\",\"%s%s)", w, rest_name, w, w, cn,
                       w, w, rest_name, w, w, cn);
        rep(out, min_c - 1, min_c - 1);
        gfe_buf_printf(out, " (%s\",\"%s%s)*%s\"]\")", w, w, rest_name, w);
        return 0;
    }
no_contains:;
    size_t k = pre ? json_object_array_length(pre) : 0;
    /* element rules for the prefix; a never element truncates the array */
    gfe_buf b;
    gfe_buf_init(&b, 0);
    size_t k_ok = k;
    char (*pn)[GFE_NAME_MAX] = k ? calloc(k, sizeof *pn) : NULL;
    if (k && !pn)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    for (size_t i = 0; i < k; i++) {
        int nv = 0;
        snprintf(sub, sizeof sub, "%.200s/prefixItems/%zu", path, i);
        if (sc_gen(c, json_object_array_get_idx(pre, i), sub, pn[i], &nv)) {
            free(pn);
            gfe_buf_free(&b);
            return c->rc;
        }
        if (nv) {
            k_ok = i;
            break;
        }
    }
    long max_len = mx;
    if ((long)k_ok < (long)k || rest_never) {
        long cap = (long)k_ok;
        if (max_len < 0 || max_len > cap)
            max_len = cap;
    }
    if (mn > max_len && max_len >= 0) {
        free(pn);
        gfe_buf_free(&b);
        return 1;
    }
    /* elements after the first: each ", elem"; nested optional groups */
    int n_open = 0;
    long first_opt = mn; /* positions >= mn are optional */
    for (long i = 1; i < (long)k_ok && (max_len < 0 || i < max_len); i++) {
        if (i >= first_opt) {
            gfe_buf_puts(&b, "(");
            n_open++;
        }
        gfe_buf_printf(&b, "%s\",\"%s%s ", w, w, pn[i]);
    }
    long done = (long)k_ok > 0 ? (long)k_ok : 1;
    if (max_len < 0 || done < max_len) {
        if (!rest_never && (long)k_ok == (long)k) {
            long lo = mn > done ? mn - done : 0;
            long hi = max_len < 0 ? -1 : max_len - done;
            if (k_ok == 0) { /* first element comes from items too */
                lo = mn > 1 ? mn - 1 : 0;
                hi = max_len < 0 ? -1 : max_len - 1;
            }
            gfe_buf_printf(&b, "(%s\",\"%s%s)", w, w, rest_name);
            rep(&b, lo, hi);
        }
    }
    for (int i = 0; i < n_open; i++)
        gfe_buf_puts(&b, ")?");
    const char *first = k_ok ? pn[0] : (rest_never ? NULL : rest_name);
    int n_alt = 0;
    gfe_buf_puts(out, "(");
    if (first && (max_len < 0 || max_len >= 1)) {
        gfe_buf_printf(out, "\"[\"%s%s %s%s\"]\"", w, first, b.s ? b.s : "", w);
        n_alt++;
    }
    if (mn == 0) {
        gfe_buf_printf(out, "%s\"[\"%s\"]\"", n_alt++ ? " | " : "", c->st.any_whitespace ? " ws " : " ");
    }
    gfe_buf_puts(out, ")");
    free(pn);
    int err = b.err;
    gfe_buf_free(&b);
    if (err)
        return sc_fail(c, err, path, "grammar too large");
    return n_alt ? 0 : 1;
}

/* ------------------------------------------------------------ objects */

typedef struct prop {
    const char *name;
    json_object *schema;
    int required;
    char rule[GFE_NAME_MAX];
    int never;
} prop;

/* Keys (JSON string literals) that differ from every name in names[0..n)
 * (all sharing their first d codepoints), decoded. */
static void emit_notin(sc *c, gfe_buf *b, const char **names, size_t n, size_t d, int depth)
{
    gfe_cset next = {0};
    int ends_here = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (d == len) {
            ends_here = 1;
            continue;
        }
        uint32_t cp;
        if (d < len && gfe_utf8_get(names[i] + d, len - d, &cp) > 0)
            gfe_cset_add(&next, cp, cp);
    }
    int n_alt = 0;
    gfe_buf_puts(b, "(");
    if (!ends_here) {
        gfe_buf_puts(b, "\"\\\"\"");
        n_alt++;
    }
    gfe_cset other;
    gfe_cset_copy(&other, &next);
    gfe_cset_negate(&other);
    if (other.n) {
        gfe_buf_puts(b, n_alt++ ? " | " : "");
        gfe_cset_emit_json(b, &other);
        gfe_buf_printf(b, " %s* \"\\\"\"", sc_unit(c));
    }
    gfe_cset_free(&other);
    for (size_t r = 0; r < next.n && depth < 200; r++) {
        for (uint32_t cp = next.r[r].lo; cp <= next.r[r].hi; cp++) {
            const char **sub = malloc(n * sizeof *sub);
            size_t m = 0;
            if (!sub) {
                b->err = TERN_ENOMEM;
                break;
            }
            size_t adv = 0;
            for (size_t i = 0; i < n; i++) {
                size_t len = strlen(names[i]);
                uint32_t x;
                int k;
                if (d < len && (k = gfe_utf8_get(names[i] + d, len - d, &x)) > 0 && x == cp) {
                    sub[m++] = names[i];
                    adv = (size_t)k;
                }
            }
            gfe_cset one = {0};
            gfe_cset_add(&one, cp, cp);
            gfe_buf_puts(b, n_alt++ ? " | " : "");
            gfe_cset_emit_json(b, &one);
            gfe_buf_puts(b, " ");
            gfe_cset_free(&one);
            emit_notin(c, b, sub, m, d + adv, depth + 1);
            free(sub);
        }
    }
    gfe_cset_free(&next);
    gfe_buf_puts(b, ")");
}

static int gen_object(sc *c, json_object *s, const char *path, gfe_buf *out)
{
    const char *w = sc_ws(c);
    long mnp, mxp;
    if (get_count(c, s, "minProperties", path, &mnp) || get_count(c, s, "maxProperties", path, &mxp))
        return c->rc;
    if (mnp < 0)
        mnp = 0;
    static const char *const dep[] = {"dependentRequired", "dependentSchemas", "dependencies"};
    for (int i = 0; i < 3; i++) {
        json_object *d = get(s, dep[i]);
        if (d && !(json_object_is_type(d, json_type_object) && json_object_object_length(d) == 0))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "keyword '%s' unsupported", dep[i]);
    }
    json_object *props = get(s, "properties"), *req = get(s, "required");
    json_object *ap = get(s, "additionalProperties"), *pp = get(s, "patternProperties");
    json_object *pnames = get(s, "propertyNames");
    if (!ap)
        ap = get(s, "unevaluatedProperties");
    if (props && !json_object_is_type(props, json_type_object))
        return sc_fail(c, TERN_EINVAL, path, "'properties' must be an object");
    if (req && !json_object_is_type(req, json_type_array))
        return sc_fail(c, TERN_EINVAL, path, "'required' must be an array");
    if (pp && !json_object_is_type(pp, json_type_object))
        return sc_fail(c, TERN_EINVAL, path, "'patternProperties' must be an object");
    if (pp && json_object_object_length(pp) == 0)
        pp = NULL;
    size_t n_req = req ? json_object_array_length(req) : 0;
    size_t cap = (props ? (size_t)json_object_object_length(props) : 0) + n_req + 1;
    prop *p = calloc(cap, sizeof *p);
    if (!p)
        return sc_fail(c, TERN_ENOMEM, path, "out of memory");
    size_t n = 0;
    int rc = 0, result = 0;
    gfe_buf b;
    gfe_buf_init(&b, 0);
    if (props) {
        json_object_object_foreach(props, k, v) {
            p[n].name = k;
            p[n].schema = v;
            n++;
        }
    }
    for (size_t i = 0; i < n_req; i++) {
        json_object *e = json_object_array_get_idx(req, i);
        if (!json_object_is_type(e, json_type_string)) {
            rc = sc_fail(c, TERN_EINVAL, path, "'required' entries must be strings");
            goto out;
        }
        const char *k = json_object_get_string(e);
        size_t j;
        for (j = 0; j < n && strcmp(p[j].name, k); j++)
            ;
        if (j == n) { /* required but not listed: its schema is the fallback */
            if (pp) {
                rc = sc_fail(c, TERN_EUNSUPPORTED, path, "required property '%.100s' with patternProperties", k);
                goto out;
            }
            p[n].name = k;
            p[n].schema = ap ? ap : (c->o.strict ? NULL : json_object_new_boolean(1));
            if (!ap && !c->o.strict)
                sc_own(c, p[n].schema);
            if (!p[n].schema) {
                result = 1; /* strict: an unlisted name cannot appear */
                goto out;
            }
            n++;
        }
        p[j].required = 1;
    }
    /* patternProperties: one pattern, unlisted names only, nothing else extra */
    json_object *pp_schema = NULL;
    if (pp) {
        /* several patterns: a key matching any of them must satisfy all
         * their schemas (stricter than needed when a key matches only one:
         * sound, not complete) */
        json_object *all = json_object_new_array(), *wrap = json_object_new_object();
        if (!all || !wrap) {
            json_object_put(all);
            json_object_put(wrap);
            rc = sc_fail(c, TERN_ENOMEM, path, "out of memory");
            goto out;
        }
        json_object_object_foreach(pp, k, v) {
            (void)k;
            json_object_array_add(all, json_object_get(v));
        }
        json_object_object_add(wrap, "allOf", all);
        pp_schema = json_object_object_length(pp) == 1 ? json_object_array_get_idx(all, 0) : wrap;
        sc_own(c, wrap);
        /* unlisted keys that match no pattern would need the complement
         * of the patterns' language: they are left out (additionalProperties
         * other than false, or non-strict mode, then admits fewer objects
         * than JSON Schema does: sound, not complete) */
        json_object_object_foreach(pp, re, v2) {
            (void)v2;
            for (size_t i = 0; i < n; i++) {
                int m = sc_regex_search(re, p[i].name, strlen(p[i].name));
                if (m != 0) {
                    rc = sc_fail(c, TERN_EUNSUPPORTED, path,
                                 "patternProperties pattern matching a listed property");
                    goto out;
                }
            }
        }
    }
    /* propertyNames: listed names are checked here, extra keys below */
    if (pnames) {
        for (size_t i = 0; i < n; i++) {
            json_object *nv = json_object_new_string(p[i].name);
            int ok = nv ? sc_validate(c, nv, pnames, 0) : -1;
            json_object_put(nv);
            if (ok < 0) {
                rc = sc_fail(c, TERN_EUNSUPPORTED, path, "propertyNames too complex for listed properties");
                goto out;
            }
            if (!ok) {
                if (p[i].required) {
                    result = 1;
                    goto out;
                }
                p[i].never = 1;
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        char sub[256];
        if (p[i].never)
            continue;
        snprintf(sub, sizeof sub, "%.150s/properties/%.90s", path, p[i].name);
        c->nest++;
        rc = sc_gen(c, p[i].schema, sub, p[i].rule, &p[i].never);
        c->nest--;
        if (rc)
            goto out;
        if (p[i].never && p[i].required) {
            result = 1;
            goto out;
        }
    }
    /* the "additional" member: key grammar and value rule */
    char add_val[GFE_NAME_MAX];
    int has_add = 0;
    gfe_buf key;
    gfe_buf_init(&key, 0);
    json_object *add_schema = ap ? ap : (c->o.strict ? NULL : NULL);
    int allow_any_extra = !ap && !c->o.strict && !pp;
    if (pp) {
        int nv = 0;
        c->nest++;
        rc = sc_gen(c, pp_schema, path, add_val, &nv);
        c->nest--;
        if (rc)
            goto out_key;
        if (!nv) {
            tern_err e;
            int never = 0;
            int n_ok = 0;
            gfe_buf_puts(&key, "(\"\\\"\" (");
            json_object_object_foreach(pp, re, v3) {
                (void)v3;
                int nv1 = 0;
                gfe_buf one;
                gfe_buf_init(&one, 0);
                rc = gfe_regex_emit(&one, re, strlen(re), 1, 1, &nv1, &e);
                if (!rc && !nv1) {
                    gfe_buf_puts(&key, n_ok++ ? " | " : "");
                    gfe_buf_put(&key, one.s, one.len);
                }
                gfe_buf_free(&one);
                if (rc) {
                    rc = sc_fail(c, rc, path, "%s", e.msg);
                    goto out_key;
                }
            }
            never = n_ok == 0;
            gfe_buf_puts(&key, ")");
            gfe_buf_puts(&key, " \"\\\"\")");
            has_add = !never;
        }
    } else if (add_schema || allow_any_extra) {
        int nv = 0;
        if (add_schema) {
            c->nest++;
            rc = sc_gen(c, add_schema, path, add_val, &nv);
            c->nest--;
            if (rc)
                goto out_key;
        } else {
            memcpy(add_val, sc_any(c), GFE_NAME_MAX);
        }
        if (!nv) {
            has_add = 1;
            json_object *pn = pnames;
            if (pn && !(json_object_is_type(pn, json_type_boolean) && json_object_get_boolean(pn))) {
                if (n) {
                    rc = sc_fail(c, TERN_EUNSUPPORTED, path, "propertyNames with listed properties and additional ones");
                    goto out_key;
                }
                /* keys: strings valid against propertyNames */
                json_object *ks = json_object_new_object(), *arr = json_object_new_array();
                if (!ks || !arr) {
                    json_object_put(ks);
                    json_object_put(arr);
                    rc = sc_fail(c, TERN_ENOMEM, path, "out of memory");
                    goto out_key;
                }
                json_object_array_add(arr, json_object_get(pn));
                json_object_array_add(arr, json_object_new_string("string"));
                json_object_object_add(ks, "allOf", arr);
                sc_own(c, ks);
                json_object *tstr = json_object_new_object();
                json_object_object_add(tstr, "type", json_object_new_string("string"));
                sc_own(c, tstr);
                json_object_array_put_idx(arr, 1, json_object_get(tstr));
                char kn[GFE_NAME_MAX];
                int knv = 0;
                char sub[256];
                snprintf(sub, sizeof sub, "%.200s/propertyNames", path);
                rc = sc_gen(c, ks, sub, kn, &knv);
                if (rc)
                    goto out_key;
                if (knv)
                    has_add = 0;
                else
                    gfe_buf_puts(&key, kn);
            } else if (n) {
                const char **names = malloc(n * sizeof *names);
                if (!names) {
                    rc = sc_fail(c, TERN_ENOMEM, path, "out of memory");
                    goto out_key;
                }
                for (size_t i = 0; i < n; i++)
                    names[i] = p[i].name;
                gfe_buf_puts(&key, "(\"\\\"\" ");
                emit_notin(c, &key, names, n, 0, 0);
                gfe_buf_puts(&key, ")");
                free(names);
            } else {
                gfe_buf_printf(&key, "(\"\\\"\" %s* \"\\\"\")", sc_unit(c));
            }
        }
    }
    if (key.err) {
        rc = sc_fail(c, key.err, path, "grammar too large");
        goto out_key;
    }
    /* counts */
    size_t n_live = 0, n_required = 0;
    for (size_t i = 0; i < n; i++) {
        n_live += !p[i].never;
        n_required += p[i].required;
    }
    long add_lo = 0, add_hi = -1;
    if (mnp > (long)n_required || (mxp >= 0 && (has_add || mxp < (long)n_live))) {
        if (n_live == 0 && has_add) {
            add_lo = mnp;
            add_hi = mxp;
        } else if (!(mxp >= 0 && !has_add && mxp >= (long)n_live && mnp <= (long)n_required)) {
            rc = sc_fail(c, TERN_EUNSUPPORTED, path, "minProperties/maxProperties with listed properties");
            goto out_key;
        }
    }
    if (mxp >= 0 && mxp < mnp) {
        result = 1;
        goto out_key;
    }
    /* member texts */
    char add_nm[GFE_NAME_MAX] = "";
    if (has_add) {
        gfe_buf mb;
        gfe_buf_init(&mb, 0);
        gfe_buf_printf(&mb, "%s%s\":\"%s%s", key.s, w, w, add_val);
        rc = add_rule(c, &mb, path, add_nm);
        gfe_buf_free(&mb);
        if (rc)
            goto out_key;
            }
    /* tail after the listed properties, following something already written */
    char tail[GFE_NAME_MAX] = "";
    char empty_or_more[GFE_NAME_MAX] = ""; /* additional members only, non-empty */
    if (has_add) {
        b.len = 0;
        gfe_buf_printf(&b, "(%s\",\"%s%s)", w, w, add_nm);
        long lo = add_lo, hi = add_hi;
        rep(&b, lo > 0 ? lo - (n_live == 0) : 0, hi < 0 ? -1 : hi - (n_live == 0));
        /* with no listed properties the first member is written separately */
        if (n_live == 0) {
            gfe_buf tb;
            gfe_buf_init(&tb, 0);
            gfe_buf_printf(&tb, "%s %s", add_nm, b.s);
            rc = add_rule(c, &tb, path, empty_or_more);
            gfe_buf_free(&tb);
            if (rc)
                goto out_key;
            b.len = 0;
            gfe_buf_printf(&b, "(%s\",\"%s%s)*", w, w, add_nm);
        }
        rc = add_rule(c, &b, path, tail);
        if (rc)
            goto out_key;
    } else {
        b.len = 0;
        gfe_buf_puts(&b, "\"\"");
        rc = add_rule(c, &b, path, tail);
        if (rc)
            goto out_key;
    }
    /* seq[i]: properties i.. each preceded by a comma, then the tail;
     * start[i]: the same with nothing written yet (non-empty) */
    char next_seq[GFE_NAME_MAX], next_start[GFE_NAME_MAX];
    memcpy(next_seq, tail, GFE_NAME_MAX);
    int start_ok = 0;
    if (has_add && n_live == 0 && add_hi != 0) {
        memcpy(next_start, empty_or_more, GFE_NAME_MAX);
        start_ok = 1;
    } else if (has_add && n_live > 0) {
        gfe_buf tb;
        gfe_buf_init(&tb, 0);
        gfe_buf_printf(&tb, "%s %s", add_nm, tail);
        rc = add_rule(c, &tb, path, next_start);
        gfe_buf_free(&tb);
        if (rc)
            goto out_key;
        start_ok = 1;
    }
    for (size_t ii = n; ii-- > 0;) {
        if (p[ii].never)
            continue;
        gfe_buf mb;
        gfe_buf_init(&mb, 0);
        sc_emit_string_lit(c, &mb, p[ii].name, strlen(p[ii].name));
        gfe_buf_printf(&mb, "%s\":\"%s%s", w, w, p[ii].rule);
        char member[GFE_NAME_MAX];
        rc = add_rule(c, &mb, path, member);
        gfe_buf_free(&mb);
        if (rc)
            goto out_key;
        char seq[GFE_NAME_MAX], start[GFE_NAME_MAX];
        b.len = 0;
        if (p[ii].required)
            gfe_buf_printf(&b, "%s\",\"%s%s %s", w, w, member, next_seq);
        else
            gfe_buf_printf(&b, "(%s\",\"%s%s)? %s", w, w, member, next_seq);
        if ((rc = add_rule(c, &b, path, seq)))
            goto out_key;
        b.len = 0;
        gfe_buf_printf(&b, "%s %s", member, next_seq);
        if (!p[ii].required && start_ok)
            gfe_buf_printf(&b, " | %s", next_start);
        if ((rc = add_rule(c, &b, path, start)))
            goto out_key;
        memcpy(next_seq, seq, GFE_NAME_MAX);
        memcpy(next_start, start, GFE_NAME_MAX);
        start_ok = 1;
    }
    int n_alt = 0;
    gfe_buf_puts(out, "(");
    if (start_ok) {
        gfe_buf_printf(out, "\"{\"%s%s%s\"}\"", w, next_start, w);
        n_alt++;
    }
    if (n_required == 0 && mnp == 0)
        gfe_buf_printf(out, "%s\"{\"%s\"}\"", n_alt++ ? " | " : "", c->st.any_whitespace ? " ws " : " ");
    gfe_buf_puts(out, ")");
    result = n_alt ? 0 : 1;
out_key:
    gfe_buf_free(&key);
out:
    gfe_buf_free(&b);
    free(p);
    return rc ? rc : result;
}

/* ------------------------------------------------------------ leaf */

int sc_leaf(sc *c, json_object *s, const char *path, char name[GFE_NAME_MAX], int *never)
{
    int mask = sc_type_mask(s);
    if (mask < 0)
        return sc_fail(c, TERN_EINVAL, path, "bad 'type'");
    json_object *nl = get(s, "nullable");
    if (nl && json_object_is_type(nl, json_type_boolean) && json_object_get_boolean(nl))
        mask |= ST_NULL;
    gfe_buf b;
    gfe_buf_init(&b, 0);
    int n_alt = 0, rc = 0;
    json_object *e = get(s, "enum");
    if (e && !json_object_is_type(e, json_type_array))
        return sc_fail(c, TERN_EINVAL, path, "'enum' must be an array");
    if (e || json_object_object_get_ex(s, "const", NULL)) {
        json_object *vals = e, *tmp = NULL;
        if (json_object_object_get_ex(s, "const", NULL)) {
            tmp = json_object_new_array();
            if (!tmp)
                return sc_fail(c, TERN_ENOMEM, path, "out of memory");
            json_object_array_add(tmp, json_object_get(get(s, "const")));
            vals = tmp;
        }
        for (size_t i = 0; i < json_object_array_length(vals); i++) {
            json_object *v = json_object_array_get_idx(vals, i);
            int ok = sc_validate(c, v, s, 0);
            if (ok < 0 && nl) /* nullable: re-check without it */
                ok = (mask & sc_value_type(v)) ? 1 : 0;
            if (ok < 0) {
                json_object_put(tmp);
                gfe_buf_free(&b);
                return sc_fail(c, TERN_EUNSUPPORTED, path,
                               "enum/const together with keywords tern cannot check against it");
            }
            if (!ok)
                continue;
            gfe_buf_puts(&b, n_alt++ ? " | " : "");
            sc_emit_value(c, &b, v);
        }
        json_object_put(tmp);
    } else {
        if (mask & ST_NULL) {
            gfe_buf_puts(&b, "\"null\"");
            n_alt++;
        }
        if (mask & ST_BOOL) {
            gfe_buf_puts(&b, n_alt++ ? " | \"true\" | \"false\"" : "\"true\" | \"false\"");
        }
        struct { int bit; int (*fn)(sc *, json_object *, const char *, gfe_buf *); } kinds[] = {
            {ST_STRING, gen_string}, {ST_ARRAY, gen_array}, {ST_OBJECT, gen_object},
        };
        if (mask & (ST_NUMBER | ST_INTEGER)) {
            gfe_buf t;
            gfe_buf_init(&t, 0);
            rc = gen_number(c, s, !(mask & ST_NUMBER), path, &t);
            if (rc == 0) {
                gfe_buf_puts(&b, n_alt++ ? " | " : "");
                gfe_buf_put(&b, t.s, t.len);
            }
            gfe_buf_free(&t);
            if (rc < 0)
                goto out;
        }
        for (size_t i = 0; i < 3; i++) {
            if (!(mask & kinds[i].bit))
                continue;
            gfe_buf t;
            gfe_buf_init(&t, 0);
            rc = kinds[i].fn(c, s, path, &t);
            if (rc == 0) {
                gfe_buf_puts(&b, n_alt++ ? " | " : "");
                gfe_buf_put(&b, t.s, t.len);
            }
            gfe_buf_free(&t);
            if (rc < 0)
                goto out;
        }
        rc = 0;
    }
    if (!n_alt)
        *never = 1;
    else
        rc = add_rule(c, &b, path, name);
out:
    gfe_buf_free(&b);
    return rc < 0 ? rc : c->rc;
}
