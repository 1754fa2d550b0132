/* JSON Schema numbers -> EBNF: exact digit-range grammars for the bounds
 * (minimum, exclusiveMinimum, maximum, exclusiveMaximum; integral bounds
 * by ranges, decimal ones through a digit-by-digit automaton over the
 * fraction) and multipleOf (a remainder automaton over the decimal
 * digits). One function per keyword group; sc_number_gen combines them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "schema_int.h"

/* Integer bounds are exact up to this magnitude; beyond it the grammar
 * stops at 17 digits (rejecting a few valid huge numbers, never accepting
 * an invalid one). */
#define SC_INT_LIMIT 99999999999999999LL

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

/* Signs emit_multiple admits. */
enum { MUL_NEG = 1, MUL_ZERO = 2, MUL_POS = 4 };

/* Decimal texts (no exponent) of multiples of p / 10^q: a DFA over the
 * remainder of the digits read so far (integer digits, then the first q
 * fraction digits; later fraction digits must be zeros). */
static int emit_multiple(sc *c, gfe_buf *out, long p, int q, int integer, int sign, const char *path)
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
    /* "0" starts a number whose integer part is just 0 (zero, or with a
     * fraction a magnitude below 1); "1".."9" a non-zero one */
    gfe_buf zero, nonzero;
    gfe_buf_init(&zero, 0);
    gfe_buf_init(&nonzero, 0);
    gfe_buf_puts(&zero, "\"0\"");
    if (!integer)
        gfe_buf_printf(&zero, " (\".\" %s)?", RF(0, 0));
    for (int d = 1; d <= 9; d++)
        gfe_buf_printf(&nonzero, "%s\"%d\" %s", d > 1 ? " | " : "", d, RI(d % p));
    if (sign == (MUL_NEG | MUL_ZERO | MUL_POS)) {
        gfe_buf_printf(out, "(\"-\"? (%s | %s))", zero.s, nonzero.s);
    } else {
        /* signs: the non-negative side, then "-" and the magnitudes; "0"
         * alone for zero when that side is excluded ("-0": never) */
        int n = 0;
        gfe_buf_puts(out, "(");
        if (sign & MUL_POS) {
            if (sign & MUL_ZERO)
                gfe_buf_printf(out, "%s | %s", zero.s, nonzero.s);
            else
                gfe_buf_puts(out, nonzero.s); /* q = 0: "0" ... is zero */
            n++;
        } else if (sign & MUL_ZERO) {
            gfe_buf_puts(out, "\"0\"");
            n++;
        }
        if (sign & MUL_NEG) {
            gfe_buf_printf(out, "%s\"-\" (%s%s%s)", n++ ? " | " : "", (sign & MUL_ZERO) && !integer && q ? zero.s : "",
                           (sign & MUL_ZERO) && !integer && q ? " | " : "", nonzero.s);
        }
        gfe_buf_puts(out, ")");
    }
    gfe_buf_free(&zero);
    gfe_buf_free(&nonzero);
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

/* minimum / exclusiveMinimum / maximum / exclusiveMaximum: the tighter of
 * each pair wins. 0, or the error. */
static int number_bounds_read(sc *c, json_object *s, const char *path, bound *lo, bound *hi)
{
    static const char *const ks[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int i = 0; i < 4; i++) {
        json_object *v = sc_get(s, ks[i]);
        if (!v)
            continue;
        if (!sc_is_num(v))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'%s' must be a number", ks[i]);
        double d = sc_numv(v);
        int incl = i == 0 || i == 2;
        if (!isfinite(d))
            return sc_fail(c, TERN_EINVAL, path, "'%s' must be finite", ks[i]);
        bound *t = i < 2 ? lo : hi;
        if (!t->has || (i < 2 ? (d > t->v || (d == t->v && !incl)) : (d < t->v || (d == t->v && !incl)))) {
            t->has = 1;
            t->v = d;
            t->incl = incl;
        }
    }
    return 0;
}

/* multipleOf: the remainder automaton (*done = 1), or a multiple of 1
 * turning a number into an integer (*integer = 1). 0, or the error. */
static int number_multiple(sc *c, json_object *s, int *integer, bound lo, bound hi, const char *path,
                           gfe_buf *out, int *done)
{
    json_object *mo = sc_get(s, "multipleOf");
    *done = 0;
    if (!mo)
        return 0;
    long mp;
    int mq;
    if (!sc_is_num(mo) || sc_numv(mo) <= 0)
        return sc_fail(c, TERN_EINVAL, path, "'multipleOf' must be a positive number");
    if (sc_decimal(mo, &mp, &mq) || mp > SC_MULTIPLE_MAX)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'multipleOf' value too fine or too large");
    if (*integer) { /* an integer x is a multiple of p/10^q iff p/gcd(p,10^q) divides x */
        long t = 1;
        for (int i = 0; i < mq; i++)
            t *= 10;
        mp /= gcd(mp, t);
        mq = 0;
    }
    if ((long)(mp * (mq + 3)) > SC_MULTIPLE_RULES)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'multipleOf' needs too many grammar states");
    if (mp > 1 || mq > 0) {
        /* bounds at 0 choose signs; others are refused */
        int sign = MUL_NEG | MUL_ZERO | MUL_POS;
        if ((lo.has && lo.v != 0) || (hi.has && hi.v != 0))
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'multipleOf' together with numeric bounds other than 0");
        if (lo.has)
            sign &= lo.incl ? ~MUL_NEG : ~(MUL_NEG | MUL_ZERO);
        if (hi.has)
            sign &= hi.incl ? ~MUL_POS : ~(MUL_POS | MUL_ZERO);
        /* without zero, a "0" integer part must not start a fraction
         * (0.5 is not zero): only integral multiples split so */
        if (!(sign & MUL_ZERO) && mq > 0 && !*integer)
            return sc_fail(c, TERN_EUNSUPPORTED, path, "'multipleOf' below 1 with an exclusive bound at 0");
        if (!sign)
            return 1;
        *done = 1;
        return emit_multiple(c, out, mp, mq, *integer, sign, path);
    }
    if (mq == 0)
        *integer = 1;
    return 0;
}

/* One sign's magnitudes lo..hi, between pre and post, as an alternative of
 * out (nothing when no magnitude fits). 0, or the error. */
static int number_side(sc *c, gfe_buf *out, gfe_buf *b, int *n, bound lo, bound hi, int integer, int decimal,
                       const char *pre, const char *post, const char *path)
{
    b->len = 0;
    gfe_buf_puts(b, pre);
    int r = decimal ? emit_mag_dec(c, b, lo, hi) : emit_mag(b, lo, hi, integer);
    if (r < 0)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "numeric bound with too many digits");
    if (r) {
        gfe_buf_puts(b, post);
        gfe_buf_puts(out, (*n)++ ? " | " : "(");
        gfe_buf_put(out, b->s, b->len);
    }
    return 0;
}

/* Bounded numbers: the non-negative magnitudes, then "-" and the negated
 * range. 0, 1 (no value), or the error. */
static int number_ranges(sc *c, bound lo, bound hi, int integer, const char *path, gfe_buf *out)
{
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
    int n = 0, rc = 0;
    /* non-negative values */
    if (hi.v > 0 || (hi.v == 0 && hi.incl)) {
        bound plo = lo, phi = hi;
        if (lo.v < 0)
            plo.v = 0, plo.incl = 1;
        rc = number_side(c, out, &b, &n, plo, phi, integer, decimal, "(", ")", path);
    }
    /* negative values: "-" m with -hi <= m <= -lo (m > 0 for integers) */
    if (!rc && lo.v < 0) {
        bound mlo = {1, hi.v > 0 ? 0 : -hi.v, hi.v > 0 ? 1 : hi.incl};
        bound mhi = {1, -lo.v, lo.incl};
        if (integer && mlo.v == 0)
            mlo.v = 1, mlo.incl = 1; /* "-0" is not written for integers */
        rc = number_side(c, out, &b, &n, mlo, mhi, integer, decimal, "(\"-\" (", "))", path);
    }
    gfe_buf_free(&b);
    if (rc)
        return rc;
    if (!n)
        return 1;
    gfe_buf_puts(out, ")");
    return 0;
}

/* Non-integral numbers ("not": {"multipleOf": 1}, the negation of
 * integer): I "." F with a non-zero digit in F, no exponent (1.5e1 is
 * 15, an integer; 1e-1 is refused: a sound subset). With integral bounds
 * lo <= x <= hi: I in [lo, hi - 1] for x > 0, I in [-hi, -lo - 1] for the
 * magnitude of x < 0. 0, 1 (no value), or the error. */
static int number_fraction(sc *c, json_object *s, bound lo, bound hi, const char *path, gfe_buf *out)
{
    json_object *mo = sc_get(s, "multipleOf");
    if (mo && sc_is_num(mo) && sc_numv(mo) == 1.0)
        return 1; /* an integer that is not one */
    if (mo)
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'not' of type integer together with 'multipleOf'");
    if ((lo.has && lo.v != floor(lo.v)) || (hi.has && hi.v != floor(hi.v)))
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'not' of type integer with fractional bounds");
    double lim = (double)SC_INT_LIMIT;
    if ((lo.has && fabs(lo.v) > lim) || (hi.has && fabs(hi.v) > lim))
        return sc_fail(c, TERN_EUNSUPPORTED, path, "'not' of type integer with bounds past 17 digits");
    int n = 0;
    /* positive side: I from max(lo, 0) to hi - 1 (unbounded: -1) */
    long long plo = lo.has && lo.v > 0 ? (long long)lo.v : 0, phi = hi.has ? (long long)hi.v - 1 : -1;
    if (!hi.has || phi >= plo) {
        gfe_buf_puts(out, n++ ? " | " : "(");
        gfe_buf_puts(out, "(");
        gfe_emit_uint_range(out, plo, phi);
        gfe_buf_printf(out, " %s)", FRAC_NONZERO);
    }
    /* negative side: magnitude I from max(-hi, 0) to -lo - 1 */
    long long nlo = hi.has && hi.v < 0 ? (long long)-hi.v : 0, nhi = lo.has ? (long long)-lo.v - 1 : -1;
    if (!lo.has || nhi >= nlo) {
        gfe_buf_puts(out, n++ ? " | " : "(");
        gfe_buf_puts(out, "(\"-\" ");
        gfe_emit_uint_range(out, nlo, nhi);
        gfe_buf_printf(out, " %s)", FRAC_NONZERO);
    }
    if (!n)
        return 1;
    gfe_buf_puts(out, ")");
    return 0;
}

int sc_number_gen(sc *c, json_object *s, int mask, const char *path, gfe_buf *out)
{
    int integer = !(mask & ST_NUMBER);
    bound lo = {0}, hi = {0};
    if (number_bounds_read(c, s, path, &lo, &hi))
        return c->rc;
    if (sc_not_fraction(s))
        return integer ? 1 : number_fraction(c, s, lo, hi, path, out);
    int done = 0;
    int rc = number_multiple(c, s, &integer, lo, hi, path, out, &done);
    if (rc || done)
        return rc;
    if (!lo.has && !hi.has) {
        gfe_buf_puts(out, integer ? "(\"-\"? (\"0\" | [1-9] [0-9]*))"
                                  : "(\"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [+\\-]? [0-9]+)?)");
        return 0;
    }
    return number_ranges(c, lo, hi, integer, path, out);
}
