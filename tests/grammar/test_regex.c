/* Regex -> EBNF front end against PCRE2 as the independent reference: for
 * each regex, every string over a small alphabet up to a length bound is
 * checked (grammar_check_text on the generated grammar versus a PCRE2 full
 * match), both for guided_regex (raw text) and for JSON Schema `pattern`
 * (searched, inside a JSON string literal). Unsupported constructs must be
 * errors, never a silently different language. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

static const struct { const char *re, *alphabet; int max_len; } k_cases[] = {
    {"abc", "abcx", 4},
    {"a|b|", "abx", 3},
    {"a*b+c?", "abc", 5},
    {"(ab)*", "abx", 6},
    {"(?:a|bc){2,3}", "abc", 7},
    {"a{2}", "ab", 4},
    {"a{2,}", "ab", 5},
    {"a{0,2}b", "ab", 4},
    {"a+?b*?", "ab", 4},
    {"[a-c]x", "abcdx", 3},
    {"[^a-c]+", "abcd-", 4},
    {"[a\\-]+", "a-b", 4},
    {"\\d+", "09a", 4},
    {"\\D\\w\\W", "a_0 -", 3},
    {"\\s\\S", " \t\na", 3},
    {".", "a\nb", 2}, /* ECMAScript . also excludes \r, PCRE2 does not */
    {"^ab$", "abx", 3},
    {"(a|b)c(d|)", "abcd", 4},
    {"\\.\\*\\(\\)", ".*()a", 4},
    {"x\\u00e9?y", "xy\xc3\xa9", 3},
    {"[\\u00e0-\\u00ff]a", "a\xc3\xa0\xc3\xbf", 3},
    {"[^\\d\\s]", "1 a\xc3\xa9", 2},
    {"(a(b(c)?)?)?", "abc", 4},
    {"[\\]a]", "]a", 2},
    {"a.c", "abc\xf0\x9f\x98\x80", 3},
};

static int pcre_match(const char *re, const char *s, size_t n, int search)
{
    char full[512];
    snprintf(full, sizeof full, search ? "%s" : "^(?:%s)$", re);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)full, PCRE2_ZERO_TERMINATED,
                                     PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | PCRE2_ALT_BSUX, &ec, &eo, NULL);
    assert_non_null(code);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
    int rc = pcre2_match(code, (PCRE2_SPTR)s, n, 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(code);
    return rc >= 0;
}

/* Splits a UTF-8 alphabet into its characters. */
static int split_utf8(const char *a, const char **ch, int *len)
{
    int n = 0;
    for (const unsigned char *p = (const unsigned char *)a; *p;) {
        int l = *p < 0x80 ? 1 : *p < 0xE0 ? 2 : *p < 0xF0 ? 3 : 4;
        ch[n] = (const char *)p;
        len[n++] = l;
        p += l;
    }
    return n;
}

/* JSON string literal of s, as json.dumps writes it (ASCII escapes). */
static size_t json_quote(const char *s, size_t n, char *out)
{
    size_t o = 0;
    out[o++] = '"';
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x80) {
            uint32_t cp;
            int l = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
            cp = c & (l == 2 ? 0x1F : l == 3 ? 0x0F : 0x07);
            for (int k = 1; k < l; k++)
                cp = (cp << 6) | ((unsigned char)s[i + k] & 0x3F);
            i += (size_t)l;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                o += (size_t)sprintf(out + o, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                o += (size_t)sprintf(out + o, "\\u%04x", cp);
            }
            continue;
        }
        i++;
        if (c == '"' || c == '\\')
            o += (size_t)sprintf(out + o, "\\%c", c);
        else if (c == '\n')
            o += (size_t)sprintf(out + o, "\\n");
        else if (c == '\r')
            o += (size_t)sprintf(out + o, "\\r");
        else if (c == '\t')
            o += (size_t)sprintf(out + o, "\\t");
        else if (c < 0x20)
            o += (size_t)sprintf(out + o, "\\u%04x", c);
        else
            out[o++] = (char)c;
    }
    out[o++] = '"';
    out[o] = 0;
    return o;
}

static grammar *regex_grammar(const char *re)
{
    char *ebnf = NULL;
    tern_err err;
    int rc = grammar_regex_to_ebnf(re, strlen(re), &ebnf, &err);
    if (rc)
        fail_msg("regex %s: %s", re, err.msg);
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
    if (!g)
        fail_msg("core rejected grammar of %s: %s\n%s", re, err.msg, ebnf);
    free(ebnf);
    return g;
}

static grammar *pattern_grammar(const char *re)
{
    json_object *s = json_object_new_object();
    json_object_object_add(s, "type", json_object_new_string("string"));
    json_object_object_add(s, "pattern", json_object_new_string(re));
    char *ebnf = NULL;
    tern_err err;
    int rc = grammar_schema_to_ebnf(s, NULL, &ebnf, &err);
    json_object_put(s);
    if (rc)
        fail_msg("pattern %s: %s", re, err.msg);
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
    if (!g)
        fail_msg("core rejected grammar of pattern %s: %s", re, err.msg);
    free(ebnf);
    return g;
}

static void test_regex_vs_pcre2(void **state)
{
    (void)state;
    long checked = 0, matched = 0;
    for (size_t ci = 0; ci < sizeof k_cases / sizeof k_cases[0]; ci++) {
        const char *re = k_cases[ci].re;
        grammar *raw = regex_grammar(re);
        grammar *pat = pattern_grammar(re);
        const char *ch[16];
        int len[16];
        int na = split_utf8(k_cases[ci].alphabet, ch, len);
        for (int L = 0; L <= k_cases[ci].max_len; L++) {
            long total = 1;
            for (int i = 0; i < L; i++)
                total *= na;
            for (long idx = 0; idx < total; idx++) {
                char s[64], js[512];
                size_t n = 0;
                long x = idx;
                for (int i = 0; i < L; i++) {
                    int k = (int)(x % na);
                    x /= na;
                    memcpy(s + n, ch[k], (size_t)len[k]);
                    n += (size_t)len[k];
                }
                s[n] = 0;
                int want = pcre_match(re, s, n, 0);
                int got = grammar_check_text(raw, s, n);
                if (want != got)
                    fail_msg("regex /%s/ on \"%s\": pcre2 %d, grammar %d", re, s, want, got);
                size_t jn = json_quote(s, n, js);
                want = pcre_match(re, s, n, 1);
                got = grammar_check_text(pat, js, jn);
                if (want != got)
                    fail_msg("pattern /%s/ on %s: pcre2 %d, grammar %d", re, js, want, got);
                checked++;
                matched += want;
            }
        }
        grammar_free(raw);
        grammar_free(pat);
    }
    printf("checked %ld strings, %ld matched\n", checked, matched);
    assert_true(matched > 1000);
}

/* pattern + minLength/maxLength: PCRE2 match and a codepoint count */
static void test_pattern_with_length(void **state)
{
    (void)state;
    static const struct { const char *re; int mn, mx; const char *alphabet; } cases[] = {
        {"^[a-c]+x$", 2, 4, "abx"}, {"^a[b\u00e9]*$", 0, 3, "ab\xc3\xa9"}, {"^\\\\d{2}-\\\\d*$", 4, 5, "1-"},
        {"^(ab|cd)e?$", 3, 3, "abcde"}, {"c$", 0, 3, "abc"}, {"^ab", 3, -1, "abc"},
        /* shapes one repetition cannot absorb: the product automaton */
        {"^a+b+$", 0, 3, "abc"}, {"(a|ab)(c|bcd)", 2, 4, "abcd"}, {"b+c", 2, 4, "abc"},
        {"^(x|y)*z(x|y)*$", 1, 4, "xyz"}, {"^(a{1,2}b){0,2}$", 3, 5, "ab"}, {"a.*b", 3, -1, "ab\xc3\xa9"},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char sch[256];
        int n = snprintf(sch, sizeof sch, "{\"type\":\"string\",\"pattern\":\"%s\",\"minLength\":%d",
                         cases[ci].re, cases[ci].mn);
        if (cases[ci].mx >= 0)
            n += snprintf(sch + n, sizeof sch - n, ",\"maxLength\":%d", cases[ci].mx);
        snprintf(sch + n, sizeof sch - n, "}");
        json_object *s = json_tokener_parse(sch);
        assert_non_null(s);
        const char *re = json_object_get_string(json_object_object_get(s, "pattern"));
        char *ebnf = NULL;
        tern_err err;
        if (grammar_schema_to_ebnf(s, NULL, &ebnf, &err))
            fail_msg("%s: %s", sch, err.msg);
        grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
        assert_non_null(g);
        free(ebnf);
        const char *ch[16];
        int len[16];
        int na = split_utf8(cases[ci].alphabet, ch, len);
        for (int L = 0; L <= 6; L++) {
            long total = 1;
            for (int i = 0; i < L; i++)
                total *= na;
            for (long idx = 0; idx < total; idx++) {
                char str[64], js[512];
                size_t sn = 0;
                long x = idx;
                for (int i = 0; i < L; i++) {
                    int k = (int)(x % na);
                    x /= na;
                    memcpy(str + sn, ch[k], (size_t)len[k]);
                    sn += (size_t)len[k];
                }
                str[sn] = 0;
                int want = pcre_match(re, str, sn, 1) && L >= cases[ci].mn && (cases[ci].mx < 0 || L <= cases[ci].mx);
                size_t jn = json_quote(str, sn, js);
                if (grammar_check_text(g, js, jn) != want)
                    fail_msg("%s on %s: want %d", sch, js, want);
            }
        }
        grammar_free(g);
        json_object_put(s);
    }
    /* pattern and format together: exactly the strings both grammars
     * accept on their own (each checked against its reference above and in
     * test_schema) */
    static const char *const texts[] = {"\"P1D\"", "\"P12D\"", "\"P1DT2H\"", "\"P1Y\"", "\"PT1S\"", "\"P1M1D\"",
                                        "\"1D\"", "\"P\"", "\"P11Y2M\""};
    grammar *both = NULL, *fmt = NULL, *pat = NULL;
    const char *sch[3] = {"{\"type\":\"string\",\"format\":\"duration\",\"pattern\":\"^P\\\\d+\",\"maxLength\":5}",
                          "{\"type\":\"string\",\"format\":\"duration\"}", "{\"type\":\"string\",\"pattern\":\"^P\\\\d+\"}"};
    grammar **gs[3] = {&both, &fmt, &pat};
    for (int i = 0; i < 3; i++) {
        json_object *s = json_tokener_parse(sch[i]);
        assert_non_null(s);
        char *ebnf = NULL;
        tern_err err;
        if (grammar_schema_to_ebnf(s, NULL, &ebnf, &err))
            fail_msg("%s: %s", sch[i], err.msg);
        *gs[i] = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
        assert_non_null(*gs[i]);
        free(ebnf);
        json_object_put(s);
    }
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t n = strlen(texts[i]);
        int want = grammar_check_text(fmt, texts[i], n) && grammar_check_text(pat, texts[i], n) && n - 2 <= 5;
        if (grammar_check_text(both, texts[i], n) != want)
            fail_msg("duration + pattern on %s: want %d", texts[i], want);
    }
    grammar_free(both);
    grammar_free(fmt);
    grammar_free(pat);
}

/* ------------------------------------------------ negation, intersection */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static unsigned rnd(unsigned n)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (unsigned)(g_rng % n);
}

/* A random regex over a, b, c (depth-bounded), written into out. */
static void rand_re(char *out, size_t cap, int depth)
{
    static const char *const atoms[] = {"a", "b", "c", "[ab]", "[^a]", ".", "\\w"};
    size_t n = strlen(out);
    unsigned k = depth > 2 ? 0 : rnd(6);
    if (k < 2) {
        snprintf(out + n, cap - n, "%s", atoms[rnd(sizeof atoms / sizeof atoms[0])]);
    } else if (k == 2 || k == 3) { /* concatenation */
        rand_re(out, cap, depth + 1);
        rand_re(out, cap, depth + 1);
    } else if (k == 4) {
        snprintf(out + n, cap - n, "(?:");
        rand_re(out, cap, depth + 1);
        snprintf(out + strlen(out), cap - strlen(out), "|");
        rand_re(out, cap, depth + 1);
        snprintf(out + strlen(out), cap - strlen(out), ")");
    } else {
        static const char *const q[] = {"*", "+", "?", "{1,2}", "{2}"};
        snprintf(out + n, cap - n, "(?:");
        rand_re(out, cap, depth + 1);
        snprintf(out + strlen(out), cap - strlen(out), ")%s", q[rnd(5)]);
    }
}

static void rand_pattern(char *out, size_t cap)
{
    out[0] = 0;
    unsigned a = rnd(4);
    if (a & 1)
        snprintf(out, cap, "^");
    rand_re(out, cap, 0);
    if (a & 2)
        snprintf(out + strlen(out), cap - strlen(out), "$");
}

/* The grammar of a schema; NULL when no value satisfies it (may_be_empty). */
static grammar *schema_grammar(const char *text, int may_be_empty)
{
    json_object *s = json_tokener_parse(text);
    assert_non_null(s);
    char *ebnf = NULL;
    tern_err err;
    if (grammar_schema_to_ebnf(s, NULL, &ebnf, &err)) {
        if (may_be_empty && strstr(err.msg, "no JSON value satisfies")) {
            json_object_put(s);
            return NULL;
        }
        fail_msg("%s: %s", text, err.msg);
    }
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
    if (!g)
        fail_msg("core rejected grammar of %s: %s", text, err.msg);
    free(ebnf);
    json_object_put(s);
    return g;
}

/* JSON text of a regex as a JSON string body (backslashes doubled). */
static void json_re(const char *re, char *out)
{
    for (; *re; re++) {
        if (*re == '\\' || *re == '"')
            *out++ = '\\';
        *out++ = *re;
    }
    *out = 0;
}

/* not: {pattern}, pattern AND NOT pattern, and three patterns with a
 * length bound, on random regexes: every string over {a, b, c, d} up to
 * 5 long against PCRE2 (a complement accepts exactly what the regex
 * rejects). */
static void test_pattern_negation(void **state)
{
    (void)state;
    long checked = 0, accepted = 0;
    for (int round = 0; round < 120; round++) {
        char r[3][128], j[3][260], sch[1024];
        for (int i = 0; i < 3; i++) {
            rand_pattern(r[i], sizeof r[i]);
            json_re(r[i], j[i]);
        }
        int form = round % 3, mx = 2 + (int)rnd(4);
        if (form == 0)
            snprintf(sch, sizeof sch, "{\"type\":\"string\",\"not\":{\"pattern\":\"%s\"}}", j[0]);
        else if (form == 1)
            snprintf(sch, sizeof sch, "{\"type\":\"string\",\"pattern\":\"%s\",\"not\":{\"pattern\":\"%s\"}}", j[0], j[1]);
        else
            snprintf(sch, sizeof sch,
                     "{\"type\":\"string\",\"maxLength\":%d,\"allOf\":[{\"pattern\":\"%s\"},{\"pattern\":\"%s\"},"
                     "{\"not\":{\"pattern\":\"%s\"}}]}",
                     mx, j[0], j[1], j[2]);
        grammar *g = schema_grammar(sch, 1);
        static const char alpha[] = "abcd";
        for (int L = 0; L <= 5; L++) {
            long total = 1;
            for (int i = 0; i < L; i++)
                total *= 4;
            for (long idx = 0; idx < total; idx++) {
                char str[8], js[32];
                long x = idx;
                for (int i = 0; i < L; i++, x /= 4)
                    str[i] = alpha[x % 4];
                str[L] = 0;
                int m0 = pcre_match(r[0], str, (size_t)L, 1), m1 = pcre_match(r[1], str, (size_t)L, 1);
                int want = form == 0 ? !m0
                         : form == 1 ? m0 && !m1
                                     : m0 && m1 && !pcre_match(r[2], str, (size_t)L, 1) && L <= mx;
                size_t jn = json_quote(str, (size_t)L, js);
                if ((g && grammar_check_text(g, js, jn)) != want)
                    fail_msg("%s on %s: want %d", sch, js, want);
                checked++;
                accepted += want;
            }
        }
        if (g)
            grammar_free(g);
    }
    printf("negation: checked %ld strings, %ld accepted\n", checked, accepted);
    assert_true(accepted > 5000 && accepted < checked - 5000);
    /* not: {format}: exactly the strings the format refuses, and a
     * non-string (not of format holds for no value format skips) */
    grammar *fmt = schema_grammar("{\"type\":\"string\",\"format\":\"ipv4\"}", 0);
    grammar *neg = schema_grammar("{\"type\":\"string\",\"not\":{\"format\":\"ipv4\"}}", 0);
    static const char *const ips[] = {"\"1.2.3.4\"", "\"1.2.3\"", "\"256.1.1.1\"", "\"\"", "\"a\"", "\"0.0.0.0\"",
                                      "\"1.2.3.4 \"", "\"01.2.3.4\""};
    for (size_t i = 0; i < sizeof ips / sizeof ips[0]; i++) {
        size_t n = strlen(ips[i]);
        if (grammar_check_text(neg, ips[i], n) == grammar_check_text(fmt, ips[i], n))
            fail_msg("not format ipv4 on %s: same as format", ips[i]);
    }
    grammar_free(fmt);
    grammar_free(neg);
}

static void test_regex_errors(void **state)
{
    (void)state;
    static const struct { const char *re; int code; } bad[] = {
        {"(a)\\1", TERN_EUNSUPPORTED}, {"a(?=b)", TERN_EUNSUPPORTED}, {"a(?!b)", TERN_EUNSUPPORTED},
        {"(?<=a)b", TERN_EUNSUPPORTED}, {"\\bword", TERN_EUNSUPPORTED}, {"(?i)abc", TERN_EUNSUPPORTED},
        {"a^b", TERN_EUNSUPPORTED}, {"\\p{L}", TERN_EUNSUPPORTED}, {"a++", TERN_EUNSUPPORTED},
        {"(ab", TERN_EFORMAT}, {"ab)", TERN_EFORMAT}, {"[z-a]", TERN_EFORMAT}, {"*a", TERN_EFORMAT},
        {"[abc", TERN_EFORMAT}, {"a{3,2}", TERN_EFORMAT}, {"\\", TERN_EFORMAT},
        {"a{99999}", TERN_EUNSUPPORTED}, {"[^\\s\\S]", TERN_EINVAL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *ebnf = (char *)1;
        tern_err err;
        int rc = grammar_regex_to_ebnf(bad[i].re, strlen(bad[i].re), &ebnf, &err);
        if (rc != bad[i].code)
            fail_msg("regex %s: got %d (%s), want %d", bad[i].re, rc, rc ? err.msg : "", bad[i].code);
        assert_null(ebnf);
        assert_true(err.msg[0] != 0);
    }
    /* nesting bound: deep groups are an error, not a stack overflow */
    char deep[4096];
    size_t n = 0;
    for (int i = 0; i < 1000; i++)
        deep[n++] = '(';
    deep[n++] = 'a';
    for (int i = 0; i < 1000; i++)
        deep[n++] = ')';
    char *ebnf = NULL;
    tern_err err;
    assert_int_equal(grammar_regex_to_ebnf(deep, n, &ebnf, &err), TERN_EUNSUPPORTED);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex_vs_pcre2),
        cmocka_unit_test(test_pattern_with_length),
        cmocka_unit_test(test_pattern_negation),
        cmocka_unit_test(test_regex_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
