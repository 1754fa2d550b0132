/* Tests for the vocabulary, the compiled grammar and the matcher: token
 * masks against independent references (PCRE2 partial matching for regular
 * grammars; per-token accept+rollback for recursive ones), random walks,
 * rollback, jump-forward, stop tokens, termination, padded and special ids,
 * bad arguments, and a real tokenizer (Llama-3) when ../shared has it. */
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

#include "base/rng.h"
#include "grammar/compiled_int.h"
#include "grammar/grammar.h"
#include "grammar/schema.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

/* A synthetic vocabulary: pieces of JSON, words, multi-byte characters cut
 * inside a code point, one special token, one stop token; mask width padded
 * past the vocabulary. */
static const char *const TOKS[] = {
    "{", "}", "\"", "\"a", "a", "ab", "b\":", "\":", ":", " ", ", ", "1", "12", "2.5", "e3", "[", "]", "]}",
    "true", "null", "\",", "\"}", "\\u", "00", "\xc3\xa9", "\xc3", "\xa9", "x\"y", "}]", "{\"", ",\"a\":1}",
    "-", "0", ".", "e", "+", "xyz", "abc", "c", "z", "yz", "\n", "  ", "\xe2\x82", "\xac", "<s>", "</s>",
};
#define N_TOKS ((int32_t)(sizeof TOKS / sizeof TOKS[0]))
#define SPECIAL_ID (N_TOKS - 2)
#define STOP_ID (N_TOKS - 1)
#define MASK_W (N_TOKS + 37)

static grammar_vocab *synth_vocab(void)
{
    size_t lens[N_TOKS];
    uint8_t sp[N_TOKS] = {0};
    for (int32_t i = 0; i < N_TOKS; i++)
        lens[i] = strlen(TOKS[i]);
    sp[SPECIAL_ID] = 1;
    int32_t stop = STOP_ID;
    tern_err e = {0};
    grammar_vocab *v = grammar_vocab_from_bytes(TOKS, lens, sp, N_TOKS, MASK_W, &stop, 1, &e);
    assert_non_null(v);
    return v;
}

static int bit(const uint32_t *m, int32_t i) { return (m[i / 32] >> (i % 32)) & 1; }

/* Reference for token i at a text prefix: does text+token stay a prefix? */
typedef int (*prefix_fn)(void *ctx, const char *s, size_t len, int full);

static void random_walks(grammar_compiled *cg, prefix_fn ref, void *ctx, uint64_t seed, int n_walks)
{
    const grammar_vocab *v = grammar_compiled_vocab(cg);
    tern_err e = {0};
    grammar_matcher *m = grammar_matcher_new(cg, &e);
    assert_non_null(m);
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *mask = calloc(nw, sizeof *mask);
    tern_rng r;
    tern_rng_seed(&r, seed, 11);
    for (int w = 0; w < n_walks; w++) {
        grammar_matcher_reset(m);
        char text[512];
        size_t tl = 0;
        for (int step = 0; step < 30; step++) {
            int cnt = grammar_matcher_fill_next_token_bitmask(m, mask, nw);
            assert_true(cnt >= 0);
            int want_cnt = 0;
            for (int32_t t = 0; t < MASK_W; t++) {
                int want;
                if (t >= N_TOKS || t == SPECIAL_ID)
                    want = 0;
                else if (t == STOP_ID)
                    want = ref(ctx, text, tl, 1);
                else {
                    memcpy(text + tl, TOKS[t], strlen(TOKS[t]));
                    want = ref(ctx, text, tl + strlen(TOKS[t]), 0);
                }
                if (want != bit(mask, t))
                    fail_msg("walk %d step %d text '%.*s' token %d '%s': mask %d, reference %d", w, step, (int)tl,
                             text, t, TOKS[t < N_TOKS ? t : 0], bit(mask, t), want);
                want_cnt += want;
            }
            assert_int_equal(cnt, want_cnt);
            if (!cnt)
                break; /* a dead end of this small vocabulary */
            int32_t pick;
            do
                pick = (int32_t)(tern_rng_u32(&r) % MASK_W);
            while (!bit(mask, pick));
            /* a rejected token leaves the state unchanged */
            for (int32_t t = 0; t < N_TOKS; t++) {
                if (!bit(mask, t)) {
                    assert_int_equal(grammar_matcher_accept_token(m, t), 0);
                    break;
                }
            }
            assert_int_equal(grammar_matcher_accept_token(m, pick), 1);
            if (pick == STOP_ID) {
                assert_true(grammar_matcher_is_terminated(m));
                assert_int_equal(grammar_matcher_fill_next_token_bitmask(m, mask, nw), 0);
                /* rollback undoes the stop */
                assert_int_equal(grammar_matcher_rollback(m, 1), 0);
                assert_false(grammar_matcher_is_terminated(m) && !grammar_matcher_can_end(m));
                break;
            }
            memcpy(text + tl, TOKS[pick], strlen(TOKS[pick]));
            tl += strlen(TOKS[pick]);
            if (tl > 400)
                break;
        }
    }
    free(mask);
    grammar_matcher_free(m);
}

typedef struct pcre_ctx {
    pcre2_code *re;
    pcre2_match_data *md;
} pcre_ctx;

static int pcre_ref(void *c, const char *s, size_t len, int full)
{
    pcre_ctx *p = c;
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, len, 0, full ? 0 : PCRE2_PARTIAL_HARD, p->md, NULL);
    if (full)
        return rc >= 0;
    return rc >= 0 || rc == PCRE2_ERROR_PARTIAL || len == 0;
}

static void test_masks_vs_pcre2(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"root ::= \"{\" (\"\\\"a\" [b-z]* \"\\\":\" \" \"? [0-9.e]+)? \"}\"", "\\{(?:\"a[b-z]*\": ?[0-9.e]+)?\\}"},
        {"root ::= ([a-c] | \"xyz\" | [0-9]{1,2})+", "(?:[a-c]|xyz|[0-9]{1,2})+"},
        {"root ::= [^\\x00-\\x7f]* \"z\"?", "[^\\x00-\\x7f]*z?"},
        {"root ::= (\"true\" | \"null\") (\", \" (\"true\" | \"null\"))*", "(?:true|null)(?:, (?:true|null))*"},
        /* counted repetitions longer than the longest token (7 bytes):
         * middle copies share token sets (st_alias), the ends do not */
        {"root ::= \"\\\"\" r{0,40} \"\\\"\"\nr ::= [a-z] | \"\\\\u\" [0-9]{2}",
         "\"(?:[a-z]|\\\\u[0-9]{2}){0,40}\""},
        {"root ::= ([a-c] | \"xyz\"){12,30} \"}\"", "(?:[a-c]|xyz){12,30}\\}"},
        {"root ::= (\"a\" [b-c]{0,12}){2,20} \"1\"?", "(?:a[b-c]{0,12}){2,20}1?"},
        {"root ::= [a-z]{25} (\", \" [a-z]{0,20})*", "[a-z]{25}(?:, [a-z]{0,20})*"},
    };
    grammar_vocab *v = synth_vocab();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        tern_err e = {0};
        grammar_compiled *cg = grammar_compile_ebnf(cases[c][0], strlen(cases[c][0]), v, NULL, &e);
        if (!cg)
            fail_msg("%s", e.msg);
        char pat[256];
        snprintf(pat, sizeof pat, "^(?:%s)\\z", cases[c][1]);
        int ec;
        PCRE2_SIZE eo;
        /* byte mode: the synthetic tokens cut code points */
        pcre_ctx p = {.re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL)};
        assert_non_null(p.re);
        p.md = pcre2_match_data_create_from_pattern(p.re, NULL);
        if (c == 2) {
            /* [^\x00-\x7f] in PCRE2 byte mode is one byte; the grammar's is
             * one UTF-8 character: use the byte reference for this one */
            pcre2_match_data_free(p.md);
            pcre2_code_free(p.re);
            snprintf(pat, sizeof pat, "^(?:(?:[\\xc2-\\xdf][\\x80-\\xbf]|\\xe0[\\xa0-\\xbf][\\x80-\\xbf]|[\\xe1-"
                                      "\\xec\\xee\\xef][\\x80-\\xbf]{2}|\\xed[\\x80-\\x9f][\\x80-\\xbf]|\\xf0[\\x90-"
                                      "\\xbf][\\x80-\\xbf]{2}|[\\xf1-\\xf3][\\x80-\\xbf]{3}|\\xf4[\\x80-\\x8f][\\x80-"
                                      "\\xbf]{2})*z?)\\z");
            p.re = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
            assert_non_null(p.re);
            p.md = pcre2_match_data_create_from_pattern(p.re, NULL);
        }
        random_walks(cg, pcre_ref, &p, 100 + c, 40);
        pcre2_match_data_free(p.md);
        pcre2_code_free(p.re);
        grammar_compiled_free(cg);
    }
    grammar_vocab_free(v);
}

static int check_ref(void *c, const char *s, size_t len, int full)
{
    const grammar *g = c;
    return full ? grammar_check_text(g, s, len) == 1 : grammar_check_prefix(g, s, len) == 1;
}

static const char JSON_EBNF[] =
    "root ::= value\n"
    "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* )? ws \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws ::= [ \\t\\n\\r]*\n";

static void test_masks_recursive(void **state)
{
    (void)state;
    grammar_vocab *v = synth_vocab();
    static const char *const grammars[] = {
        JSON_EBNF,
        "root ::= \"(\" root \")\" root | \"\"",
        "root ::= list\nlist ::= item (\", \" list)?\nitem ::= \"a\" | \"[\" list? \"]\" | \"12\"",
        "root ::= e\ne ::= t (\"+\" t)*\nt ::= f (\"e\" f)?\nf ::= [0-9]+ | \"(\" e \")\" | \"-\" f",
    };
    for (size_t c = 0; c < sizeof grammars / sizeof grammars[0]; c++) {
        tern_err e = {0};
        grammar_compiled *cg = grammar_compile_ebnf(grammars[c], strlen(grammars[c]), v, NULL, &e);
        if (!cg)
            fail_msg("grammar %zu: %s", c, e.msg);
        random_walks(cg, check_ref, (void *)grammar_compiled_grammar(cg), 7 + c, 60);
        grammar_compiled_free(cg);
    }
    grammar_vocab_free(v);
}

static void test_matcher_api(void **state)
{
    (void)state;
    grammar_vocab *v = synth_vocab();
    tern_err e = {0};
    const char *src = "root ::= \"{\\\"key\\\": \" (\"true\" | \"12\") \"}\"";
    grammar_compiled *cg = grammar_compile_ebnf(src, strlen(src), v, NULL, &e);
    assert_non_null(cg);
    grammar_matcher *m = grammar_matcher_new(cg, &e);
    assert_non_null(m);
    size_t nw = grammar_vocab_mask_words(v);
    assert_int_equal(nw, (MASK_W + 31) / 32);
    uint32_t *mask = calloc(nw, sizeof *mask);
    char jf[64];

    assert_int_equal(grammar_matcher_find_jump_forward_string(m, jf, sizeof jf), 8);
    assert_string_equal(jf, "{\"key\": ");
    assert_int_equal(grammar_matcher_find_jump_forward_string(m, jf, 4), 3); /* capped */
    assert_int_equal(grammar_matcher_accept_string(m, "{\"ke", 4), 1);
    assert_int_equal(grammar_matcher_find_jump_forward_string(m, jf, sizeof jf), 4);
    assert_string_equal(jf, "y\": ");
    assert_int_equal(grammar_matcher_accept_string(m, "y\": ", 4), 1);
    assert_int_equal(grammar_matcher_find_jump_forward_string(m, jf, sizeof jf), 0);
    assert_int_equal(grammar_matcher_accept_string(m, "x", 1), 0);
    assert_int_equal(grammar_matcher_n_steps(m), 2);

    /* padded, special and out-of-range ids are never allowed or accepted */
    assert_true(grammar_matcher_fill_next_token_bitmask(m, mask, nw) > 0);
    for (int32_t t = N_TOKS; t < MASK_W; t++)
        assert_int_equal(bit(mask, t), 0);
    assert_int_equal(bit(mask, SPECIAL_ID), 0);
    assert_int_equal(bit(mask, STOP_ID), 0);
    assert_int_equal(grammar_matcher_accept_token(m, SPECIAL_ID), 0);
    assert_int_equal(grammar_matcher_accept_token(m, MASK_W - 1), 0);
    assert_int_equal(grammar_matcher_accept_token(m, -1), 0);
    assert_int_equal(grammar_matcher_accept_token(m, STOP_ID), 0); /* cannot end yet */
    assert_int_equal(grammar_matcher_fill_next_token_bitmask(m, mask, nw - 1), TERN_ERANGE);

    /* "1" "2" "}" then stop */
    assert_int_equal(grammar_matcher_accept_token(m, 11), 1);
    assert_int_equal(grammar_matcher_accept_token(m, 32 /* "0" */), 0);
    assert_int_equal(grammar_matcher_find_jump_forward_string(m, jf, sizeof jf), 2);
    assert_string_equal(jf, "2}");
    assert_int_equal(grammar_matcher_accept_string(m, "2", 1), 1);
    assert_int_equal(grammar_matcher_accept_token(m, 1), 1);
    assert_true(grammar_matcher_can_end(m));
    assert_true(grammar_matcher_is_terminated(m)); /* nothing but the end is left */
    assert_int_equal(grammar_matcher_fill_next_token_bitmask(m, mask, nw), 1);
    assert_int_equal(bit(mask, STOP_ID), 1);
    assert_int_equal(grammar_matcher_accept_token(m, STOP_ID), 1);
    assert_int_equal(grammar_matcher_fill_next_token_bitmask(m, mask, nw), 0);
    assert_int_equal(grammar_matcher_accept_string(m, "", 0), 0);

    /* rollback: undo stop, "}", "2", "1" */
    assert_int_equal(grammar_matcher_n_steps(m), 6);
    assert_int_equal(grammar_matcher_rollback(m, 7), TERN_ERANGE);
    assert_int_equal(grammar_matcher_rollback(m, 4), 0);
    assert_int_equal(grammar_matcher_n_steps(m), 2);
    assert_false(grammar_matcher_can_end(m));
    assert_int_equal(grammar_matcher_accept_token(m, 18 /* true */), 1);
    assert_int_equal(grammar_matcher_accept_token(m, 1), 1);
    assert_true(grammar_matcher_can_end(m));
    grammar_matcher_reset(m);
    assert_int_equal(grammar_matcher_n_steps(m), 0);
    assert_int_equal(grammar_matcher_accept_token(m, 0), 1);

    /* bad arguments */
    assert_int_equal(grammar_matcher_rollback(m, -1), TERN_EINVAL);
    assert_int_equal(grammar_matcher_fill_next_token_bitmask(NULL, mask, nw), TERN_EINVAL);
    assert_int_equal(grammar_matcher_accept_string(m, NULL, 3), TERN_EINVAL);
    assert_null(grammar_matcher_new(NULL, &e));
    assert_null(grammar_compile(NULL, v, &e));
    grammar_matcher_free(NULL);
    grammar_compiled_free(NULL);
    grammar_vocab_free(NULL);

    free(mask);
    grammar_matcher_free(m);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
}

static void test_vocab_errors(void **state)
{
    (void)state;
    tern_err e = {0};
    const char *t[] = {"a", "b"};
    size_t l[] = {1, 1};
    int32_t stop = 5;
    assert_null(grammar_vocab_from_bytes(t, l, NULL, 2, 1, NULL, 0, &e)); /* width < vocab */
    assert_int_equal(e.code, TERN_EINVAL);
    assert_null(grammar_vocab_from_bytes(t, l, NULL, 2, 4, &stop, 1, &e)); /* stop out of range */
    stop = 3; /* a stop id in the padding is fine */
    grammar_vocab *v = grammar_vocab_from_bytes(t, l, NULL, 2, 4, &stop, 1, &e);
    assert_non_null(v);
    assert_int_equal(grammar_vocab_mask_width(v), 4);
    assert_true(grammar_vocab_is_stop(v, 3));
    size_t len;
    assert_non_null(grammar_vocab_token(v, 1, &len));
    assert_int_equal(len, 1);
    assert_null(grammar_vocab_token(v, 3, &len));
    grammar_vocab_free(v);
}

/* The Llama-3 tokenizer of ../shared; the test is skipped without it. */
static tern_tokenizer *llama3_or_skip(void)
{
    tern_err e = {0};
    tern_tokenizer *tok = tokenizer_load(shared_path("tokenizers/llama3"), &e);
    if (!tok) {
        print_message("skipping: %s\n", e.msg);
        skip();
    }
    return tok;
}

/* The Llama-3 vocabulary: masks at each step of a JSON document equal the
 * per-token reference (accept then roll back, for every id). */
static void test_real_tokenizer(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, tokenizer_vocab_size(tok) + 100, NULL, 0, &e);
    assert_non_null(v);
    grammar_compiled *cg = grammar_compile_ebnf(JSON_EBNF, strlen(JSON_EBNF), v, NULL, &e);
    assert_non_null(cg);
    grammar_matcher *m = grammar_matcher_new(cg, &e), *ref = grammar_matcher_new(cg, &e);
    const char *doc = "{\"name\": \"caf\xc3\xa9 \\u00e9\", \"n\": [1, -2.5e3, true], \"o\": {}}";
    int32_t *ids;
    size_t n_ids;
    assert_int_equal(tokenizer_encode(tok, doc, strlen(doc), 0, &ids, &n_ids, &e), 0);
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *mask = calloc(nw, sizeof *mask);
    int32_t width = grammar_vocab_mask_width(v);
    for (size_t i = 0; i <= n_ids; i++) {
        int cnt = grammar_matcher_fill_next_token_bitmask(m, mask, nw);
        int want_cnt = 0;
        /* sample the ids: every 7th plus every allowed one keeps it fast */
        for (int32_t t = 0; t < width; t++) {
            if (t % 7 && !bit(mask, t))
                continue;
            int ok = grammar_matcher_accept_token(ref, t);
            if (ok == 1)
                grammar_matcher_rollback(ref, 1);
            if ((ok == 1) != bit(mask, t))
                fail_msg("step %zu token %d: mask %d reference %d", i, t, bit(mask, t), ok);
            want_cnt += ok == 1;
        }
        assert_int_equal(cnt, want_cnt);
        if (i < n_ids) {
            assert_int_equal(bit(mask, ids[i]), 1);
            assert_int_equal(grammar_matcher_accept_token(m, ids[i]), 1);
            assert_int_equal(grammar_matcher_accept_token(ref, ids[i]), 1);
        }
    }
    assert_true(grammar_matcher_can_end(m));
    assert_int_equal(bit(mask, tokenizer_eos_id(tok)), 1);
    free(ids);
    free(mask);
    grammar_matcher_free(m);
    grammar_matcher_free(ref);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

/* Both grammars give the same mask at every step of each document (and
 * accept it to its end). */
static void masks_equal_along(grammar_compiled *cg, grammar_compiled *ref, tern_tokenizer *tok,
                              const char *const *docs, size_t n_docs)
{
    tern_err e = {0};
    size_t nw = grammar_vocab_mask_words(grammar_compiled_vocab(cg));
    uint32_t *m1 = calloc(nw, sizeof *m1), *m2 = calloc(nw, sizeof *m2);
    for (size_t d = 0; d < n_docs; d++) {
        grammar_matcher *a = grammar_matcher_new(cg, &e), *b = grammar_matcher_new(ref, &e);
        assert_non_null(a);
        assert_non_null(b);
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(tokenizer_encode(tok, docs[d], strlen(docs[d]), 0, &ids, &n_ids, &e), 0);
        for (size_t i = 0; i <= n_ids; i++) {
            int c1 = grammar_matcher_fill_next_token_bitmask(a, m1, nw);
            int c2 = grammar_matcher_fill_next_token_bitmask(b, m2, nw);
            assert_true(c1 > 0);
            assert_int_equal(c1, c2);
            if (memcmp(m1, m2, nw * sizeof *m1))
                fail_msg("doc %zu step %zu: masks differ", d, i);
            if (i < n_ids) {
                assert_int_equal(grammar_matcher_accept_token(a, ids[i]), 1);
                assert_int_equal(grammar_matcher_accept_token(b, ids[i]), 1);
            }
        }
        assert_true(grammar_matcher_can_end(a));
        free(ids);
        grammar_matcher_free(a);
        grammar_matcher_free(b);
    }
    free(m1);
    free(m2);
}

/* Repetition copies that share token sets (st_alias) give the masks the
 * grammar without sharing gives, at every step of a long string, on the
 * Llama-3 vocabulary (tokens up to 128 bytes: copies near both ends of
 * c{0,300} stay apart, the middle ones share). */
static void test_repetition_alias(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, 0, NULL, 0, &e);
    assert_non_null(v);
    static const char ebnf[] = "root ::= \"\\\"\" c{0,300} \"\\\"\" | [0-9]{140,330}\n"
                               "c ::= [^\"\\\\] | \"\\\\\" [\"\\\\/bfnrt]\n";
    grammar_limits nolim;
    grammar_limits_init(&nolim);
    nolim.alias_horizon = 1L << 21; /* past any sharing */
    grammar_compiled *cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &e);
    assert_non_null(cg);
    grammar_compiled *ref = grammar_compile_ebnf(ebnf, strlen(ebnf), v, &nolim, &e);
    assert_non_null(ref);
    const char *docs[2] = {NULL, NULL};
    char str[400], num[400];
    size_t k = 0;
    str[k++] = '"';
    while (k < 296)
        k += (size_t)snprintf(str + k, sizeof str - k, "%s", k % 5 ? "word " : "\\n x");
    str[k++] = '"';
    str[k] = 0;
    for (k = 0; k < 329; k++)
        num[k] = (char)('0' + k % 10);
    num[k] = 0;
    docs[0] = str;
    docs[1] = num;
    masks_equal_along(cg, ref, tok, docs, 2);
    grammar_compiled_free(cg);
    grammar_compiled_free(ref);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

/* Loop classes edited from a wider cached one (vocab_class.c) equal the
 * pass over the trie, item by item and token by token, on the Llama-3
 * vocabulary: the JSON string class less letters, less its UTF-8
 * characters, less nearly everything (digits), a URI-like class, and an
 * edit of an edit. */
static int class_equal(const grammar_vocab *v, const gvoc_class *a, const gvoc_class *b, const char *what)
{
    if (a->n_items != b->n_items) {
        print_message("%s: %d items vs %d\n", what, a->n_items, b->n_items);
        return 0;
    }
    for (int32_t k = 0; k < a->n_items; k++) {
        const gvoc_item *x = &a->items[k], *y = &b->items[k];
        if (x->first != y->first || x->last != y->last || x->frontier != y->frontier || x->n_pend != y->n_pend ||
            x->from_root != y->from_root || x->nch != y->nch || memcmp(x->pend, y->pend, x->n_pend)) {
            print_message("%s: item %d: [%d, %d] f%d p%d r%d c%d vs [%d, %d] f%d p%d r%d c%d\n", what, k, x->first,
                          x->last, x->frontier, x->n_pend, x->from_root, x->nch, y->first, y->last, y->frontier,
                          y->n_pend, y->from_root, y->nch);
            return 0;
        }
    }
    if (memcmp(a->run_bits, b->run_bits, v->n_words * sizeof *a->run_bits)) {
        print_message("%s: run tokens differ\n", what);
        return 0;
    }
    return 1;
}

static void test_class_edit(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, 0, NULL, 0, &e);
    assert_non_null(v);
    /* the JSON string class, built with the vocabulary */
    const uint64_t js[2] = {~0ull << 32 & ~(1ull << '"'), ~(1ull << ('\\' - 64))};
    grammar_compiled_stats st = {0};
    const gvoc_class *base = gvoc_class_get(v, js, GVOC_LEAD_ALL, &st);
    assert_non_null(base);
    assert_int_equal(st.class_builds, 0);
    static const struct {
        const char *name;
        uint64_t asc0, asc1, lead;
    } cases[] = {
        {"less s", 0, 1ull << ('s' - 64), 0},
        {"less t, r, e", 0, 1ull << ('t' - 64) | 1ull << ('r' - 64) | 1ull << ('e' - 64), 0},
        {"less space and /", 1ull << ' ' | 1ull << '/', 0, 0},
        {"less UTF-8", 0, 0, GVOC_LEAD_ALL},
        {"less some lead bytes", 0, 0, 0xFull << (0xE0 - 0xC0) | 1ull << (0xC3 - 0xC0)},
        {"less s and UTF-8", 0, 1ull << ('s' - 64), GVOC_LEAD_ALL},
        {"digits", ~0x03ff000000000000ull & (~0ull << 32 & ~(1ull << '"')), ~(1ull << ('\\' - 64)), GVOC_LEAD_ALL},
        {"URI-like", ~0xa3ffacfa00000000ull & (~0ull << 32 & ~(1ull << '"')),
         ~0x7fffffffc7fffffeull & ~(1ull << ('\\' - 64)), GVOC_LEAD_ALL},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const uint64_t asc[2] = {js[0] & ~cases[k].asc0, js[1] & ~cases[k].asc1};
        uint64_t lead = GVOC_LEAD_ALL & ~cases[k].lead;
        gvoc_class *full = gvoc_class_compute(v, NULL, asc, lead);
        gvoc_class *ed = gvoc_class_compute(v, base, asc, lead);
        assert_non_null(full);
        assert_non_null(ed);
        if (!class_equal(v, full, ed, cases[k].name))
            fail_msg("%s: the edit differs from the pass", cases[k].name);
        /* an edit of this edit: less 'a' and '0' too */
        const uint64_t asc2[2] = {asc[0] & ~(1ull << '0'), asc[1] & ~(1ull << ('a' - 64))};
        gvoc_class *full2 = gvoc_class_compute(v, NULL, asc2, lead);
        gvoc_class *ed2 = gvoc_class_compute(v, ed, asc2, lead);
        assert_non_null(full2);
        assert_non_null(ed2);
        if (!class_equal(v, full2, ed2, cases[k].name))
            fail_msg("%s, less a and 0: the edit of the edit differs from the pass", cases[k].name);
        gvoc_class_free(full);
        gvoc_class_free(ed);
        gvoc_class_free(full2);
        gvoc_class_free(ed2);
    }
    /* a base that does not hold the class */
    const uint64_t wider[2] = {js[0] | 1ull << '"', js[1]};
    assert_null(gvoc_class_compute(v, base, wider, GVOC_LEAD_ALL));
    /* through the cache: a wide narrowing is edited (few nodes read), and
     * equals the pass */
    const uint64_t less_s[2] = {js[0], js[1] & ~(1ull << ('s' - 64))};
    const gvoc_class *c = gvoc_class_get(v, less_s, GVOC_LEAD_ALL, &st);
    assert_non_null(c);
    assert_int_equal(st.class_builds, 1);
    gvoc_class *full = gvoc_class_compute(v, NULL, less_s, GVOC_LEAD_ALL);
    long long pass_nodes = 0;
    {
        grammar_vocab *v2 = grammar_vocab_new(tok, 0, NULL, 0, &e);
        grammar_compiled_stats st2 = {0};
        assert_non_null(v2);
        gvoc_classes_free(v2); /* no base to edit from */
        assert_non_null(gvoc_class_get(v2, less_s, GVOC_LEAD_ALL, &st2));
        pass_nodes = st2.class_nodes;
        grammar_vocab_free(v2);
    }
    print_message("less s: edit read %lld, pass %lld nodes\n", st.class_nodes, pass_nodes);
    assert_true(st.class_nodes * 2 < pass_nodes);
    assert_true(class_equal(v, full, (gvoc_class *)c, "less s (cached)"));
    gvoc_class_free(full);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

/* The walk's shortcuts (loop skip, loop classes with their runs and
 * frontiers, root loops entered after a first byte) give the masks of the
 * node-by-node walk, at every step of real documents on the Llama-3
 * vocabulary: string contents with escapes and non-ASCII text, an
 * unanchored pattern, a class without every character (no UTF-8 loop), a
 * digit run, free text up to a marker, a string made of a called
 * character rule (child walks), bounded repetitions; plus sampled tokens
 * against accept + rollback. */
static void test_loop_classes(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, 0, NULL, 0, &e);
    assert_non_null(v);
    /* the reference's own vocabulary: no token set shared with v's */
    grammar_vocab *vref = grammar_vocab_new(tok, 0, NULL, 0, &e);
    assert_non_null(vref);
    static const struct {
        const char *ebnf, *doc;
    } cases[] = {
        {"root ::= \"\\\"\" ([^\"\\\\] | \"\\\\\" [\"\\\\/bfnrt])* \"\\\"\"\n",
         "\"caf\xc3\xa9 cr\xc3\xa8me \\\"br\xc3\xbbl\xc3\xa9" "e\\\" \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 tab\\t end\""},
        {"root ::= \"\\\"\" [^\"\\\\]* \"wifi\" [^\"\\\\]* \"\\\"\"\n", "\"my home wifi network, the wide one\""},
        {"root ::= [a-z \\u00c0-\\u00ff]* \".\"\n", "une phrase tr\xc3\xa8s \xc3\xa0 la fran\xc3\xa7" "aise."},
        {"root ::= [0-9]+ (\".\" [0-9]+)? \" units\"\n", "12345678901234567890.5 units"},
        {"root ::= [^<]* \"<end>\" [a-z]*\n", "free text\n\twith tags? no> lines\n\n<end>tail"},
        {"root ::= \"{\\\"a\\\": \" str \", \\\"b\\\": \" str \"}\"\nstr ::= \"\\\"\" chr* \"\\\"\"\n"
         "chr ::= [^\"\\\\] | \"\\\\\" [\"\\\\/bfnrt]\n",
         "{\"a\": \"first value, long enough to span tokens\", \"b\": \"\\\"quoted\\\" \xc3\xa9\"}"},
        {"root ::= \"\\\"\" chr{0,25} \"\\\"\" \" \" \"\\\"\" chr{3,} \"\\\"\"\nchr ::= [^\"\\\\]\n",
         "\"short one\" \"a longer second string that goes on\""},
        /* counted walks: bounded strings made of a called character rule
         * (escapes, multi-byte characters, a token crossing the end) */
        {"root ::= \"{\\\"a\\\": \" s5 \", \\\"b\\\": \" s40 \", \\\"c\\\": \" s200 \"}\"\n"
         "s5 ::= \"\\\"\" chr{0,5} \"\\\"\"\ns40 ::= \"\\\"\" chr{2,40} \"\\\"\"\ns200 ::= \"\\\"\" chr{0,200} \"\\\"\"\n"
         "chr ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] | \"\\\\u\" [0-9a-fA-F]{4}\n",
         "{\"a\": \"abcde\", \"b\": \"caf\xc3\xa9 \\\"x\\\" \xe6\x97\xa5\xe6\x9c\xac sixteen chars..\", \"c\": "
         "\"a long value: \\u00e9t\xc3\xa9, -------- and ======== and spaces          end\"}"},
        /* counted walks: inline classes with counts (a UUID) */
        {"root ::= \"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
         "[0-9a-fA-F]{12} \"\\\"\" [a-z ]{3,30} \".\"\n",
         "\"123e4567-e89b-12d3-a456-426614174000\"some words here."},
        /* counted walks below nodes whose path leaves the class: a count
         * searched inside free text (an unanchored pattern) */
        {"root ::= \"\\\"\" [^\"\\\\]* [a-zA-Z0-9_-]{40} [^\"\\\\]* \"\\\"\"\n",
         "\"id: the key is abc-DEF_0123456789-0123456789-abcdefghijklmnop, done\""},
        /* counted walks whose class drops some UTF-8 lead bytes (a character
         * class without the line separators) */
        {"root ::= \"\\\"\" [^\"\\\\]* [^\"\\\\\\u2028\\u2029]+ [^\"\\\\]* \"\\\"\" \"!\"\n",
         "\"caf\xc3\xa9 cr\xc3\xa8me, \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xe2\x80\x94 a line\xe2\x80\xa8next \xd0\xbf\xd1\x80\xd0\xb8\"!"},
        /* frame steps: after ' ', 'a' ends a's frame only, 't' ends it and
         * moves inside b's: the two bytes step to different sets */
        {"root ::= \" \" (a | b) (\", \" (a | b))* \".\"\na ::= [at]\nb ::= \"t\" \"he\"\n", " a, the, t, a."},
        /* merged children: a nullable right recursion (a pattern's rule
         * per state) pops at nearly every trie node, so its pops are
         * continued in the caller's caller at once */
        {"root ::= \"{\\\"\" k \"\\\": \" k2 \"}\"\nk ::= \"\" | c k | \"\\\\u00\" [0-9a-f] [0-9a-f] k\n"
         "k2 ::= \"\\\"\" (\"\" | c k3) \"\\\"\"\nk3 ::= \"\" | c k3 | \"\\n\" k3\nc ::= [^\"\\\\\\n]\n",
         "{\"a key with words, \\u00e9 and caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\": \"a value\nover two lines, \xd0\xbf\xd1\x80\xd0\xb8\"}"},
        /* counted walks verified only as deep as the subtree needs (the
         * strings below a quote token), then further for deeper ones: the
         * same chain reached below "\"" and " \"" and from the root */
        {"root ::= [a-z ]* \"\\\"\" chr{0,50} \"\\\"\" \" [\" s (\", \" s)* \"]\"\ns ::= \"\\\"\" chr{1,60} \"\\\"\"\n"
         "chr ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt]\n",
         "some words \"a bounded string, caf\xc3\xa9 \\\"q\\\"\" [\"x\", \"another one, longer\", \"\xe6\x97\xa5\", \"z\"]"},
        /* frame steps: called string rules whose characters stay in their
         * frame (inline classes) or end a called character rule, below a
         * caller (the child walks after whitespace) */
        {"root ::= \"{\" ws \"\\\"k\\\":\" ws s ws \",\" ws t ws \",\" ws u ws \"}\"\nws ::= [ \\t\\n]*\n"
         "s ::= \"\\\"\" [^\"\\\\\\x00-\\x1f]* \"\\\"\"\nt ::= \"\\\"\" [^\"\\\\\\x00-\\x1f]{0,30} \"\\\"\"\n"
         "u ::= \"\\\"\" chr{1,20} \"\\\"\"\nchr ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt]\n",
         "{\"k\": \"caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\", \"na\xc3\xafve d\xc3\xa9j\xc3\xa0 vu\", \"\xd0\xbf\xd1\x80\xd0\xb8 \xc3\xa9t\xc3\xa9\"}"},
    };
    const size_t merged_case = sizeof cases / sizeof cases[0] - 3;
    const size_t counted_case = 7; /* bounded strings: their copies' child walks */
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *m1 = calloc(nw, sizeof *m1), *m2 = calloc(nw, sizeof *m2);
    int32_t width = grammar_vocab_mask_width(v);
    int32_t max_sets = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        grammar_compiled *cg = grammar_compile_ebnf(cases[c].ebnf, strlen(cases[c].ebnf), v, NULL, &e);
        if (!cg)
            fail_msg("case %zu: %s", c, e.msg);
        grammar_compiled_stats pre;
        grammar_compiled_stats_get(cg, &pre);
        if (c == 0)
            assert_true(pre.entries + pre.shared_hits > 0); /* the string state, before any mask */
        /* the reference walks node by node from its first mask on: no
         * precompute (it would fill entries with the class walks) */
        grammar_limits rl;
        grammar_limits_init(&rl);
        rl.precompute = -1;
        grammar_compiled *ref = grammar_compile_ebnf(cases[c].ebnf, strlen(cases[c].ebnf), vref, &rl, &e);
        assert_non_null(ref);
        ref->plain_walk = 1;
        /* the same grammar again: its precompute finds the first copies'
         * children shared, and builds the chain they walk from anyway
         * (pre_chain); its masks are compared too */
        grammar_compiled *cg2 = NULL;
        grammar_matcher *a2 = NULL;
        if (c == counted_case) {
            cg2 = grammar_compile_ebnf(cases[c].ebnf, strlen(cases[c].ebnf), v, NULL, &e);
            assert_non_null(cg2);
            grammar_compiled_stats s2;
            grammar_compiled_stats_get(cg2, &s2);
            assert_true(s2.shared_hits > 0);
            assert_true(cg2->n_chains > 0);
            a2 = grammar_matcher_new(cg2, &e);
            assert_non_null(a2);
        }
        grammar_matcher *a = grammar_matcher_new(cg, &e), *b = grammar_matcher_new(ref, &e);
        grammar_matcher *probe = grammar_matcher_new(cg, &e);
        assert_non_null(a);
        assert_non_null(b);
        assert_non_null(probe);
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(tokenizer_encode(tok, cases[c].doc, strlen(cases[c].doc), 0, &ids, &n_ids, &e), 0);
        for (size_t i = 0; i <= n_ids; i++) {
            int c1 = grammar_matcher_fill_next_token_bitmask(a, m1, nw);
            int c2 = grammar_matcher_fill_next_token_bitmask(b, m2, nw);
            assert_true(c1 > 0);
            if (c1 != c2 || memcmp(m1, m2, nw * sizeof *m1))
                fail_msg("case %zu step %zu: masks differ (%d vs %d allowed)", c, i, c1, c2);
            if (a2) {
                int c3 = grammar_matcher_fill_next_token_bitmask(a2, m1, nw);
                if (c3 != c2 || memcmp(m1, m2, nw * sizeof *m1))
                    fail_msg("case %zu step %zu: second grammar's mask differs (%d vs %d allowed)", c, i, c3, c2);
                assert_int_equal(i < n_ids ? grammar_matcher_accept_token(a2, ids[i]) : 1, 1);
            }
            /* every 97th id against accept + rollback */
            for (int32_t t = (int32_t)(i % 97); t < width; t += 97) {
                int ok = grammar_matcher_accept_token(probe, t);
                if (ok == 1)
                    grammar_matcher_rollback(probe, 1);
                if ((ok == 1) != bit(m1, t))
                    fail_msg("case %zu step %zu token %d: mask %d, accept %d", c, i, t, bit(m1, t), ok);
            }
            if (i < n_ids) {
                if (grammar_matcher_accept_token(a, ids[i]) != 1)
                    fail_msg("case %zu step %zu: document token %d rejected", c, i, ids[i]);
                assert_int_equal(grammar_matcher_accept_token(b, ids[i]), 1);
                assert_int_equal(grammar_matcher_accept_token(probe, ids[i]), 1);
            }
        }
        assert_true(grammar_matcher_can_end(a));
        grammar_compiled_stats st;
        grammar_compiled_stats_get(cg, &st);
        grammar_compiled_stats rs;
        grammar_compiled_stats_get(ref, &rs);
        assert_int_equal(rs.class_walks + rs.count_walks + rs.merged, 0);
        if (c == merged_case)
            assert_true(st.merged > 0);
        if (c == counted_case)
            assert_true(st.count_split_hits > 0);
        if (c == merged_case + 1)
            assert_true(cg->chain_extends > 0);
        if (c > merged_case)
            assert_true(st.frame_steps > 0);
        assert_int_equal(rs.frame_steps, 0);
        print_message("case %zu: %zu tokens, %lld walks (%lld merged), %lld class walks, %lld counted walks "
                      "(%lld of subtrees by a cached split), %lld nodes (node by node: %lld), sets %d / %d\n",
                      c, n_ids, st.entries + st.children, st.merged, st.class_walks, st.count_walks,
                      st.count_split_hits, st.walk_nodes, rs.walk_nodes, cg->n_sets, ref->n_sets);
        if (cg->n_sets > max_sets)
            max_sets = cg->n_sets;
        free(ids);
        grammar_matcher_free(a);
        grammar_matcher_free(b);
        grammar_matcher_free(probe);
        grammar_matcher_free(a2);
        grammar_compiled_free(cg2);
        grammar_compiled_free(cg);
        grammar_compiled_free(ref);
    }
    /* the masks compared read transition rows from several pages
     * (compiled_int.h) */
    assert_true(max_sets > 2 << GCOMP_TRANS_SHIFT);
    free(m1);
    free(m2);
    grammar_vocab_free(v);
    grammar_vocab_free(vref);
    tokenizer_free(tok);
}

/* The precompute of wide sets (compiled.c's pre_choices): an object of
 * 40 optional properties, as the schema front end writes it. After a
 * value, the whitespace before the next property waits in 39 callers at
 * once, and after the ',' again: both masks find every child computed
 * at compile time. Masks equal the node-by-node walk's throughout. */
static void test_precompute_wide(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, 0, NULL, 0, &e);
    grammar_vocab *vref = grammar_vocab_new(tok, 0, NULL, 0, &e);
    assert_non_null(v);
    assert_non_null(vref);
    enum { N = 40 };
    char *g = malloc(16384);
    assert_non_null(g);
    size_t n = (size_t)snprintf(g, 16384,
                                "root ::= \"{\" ws n%d o%d ws \"}\"\nws ::= [ \\t\\n]{0,4}\n"
                                "str ::= \"\\\"\" [^\"\\\\\\x00-\\x1f]* \"\\\"\"\no0 ::= \"\"\n",
                                N, N - 1);
    for (int k = 1; k <= N; k++) {
        n += (size_t)snprintf(g + n, 16384 - n, "n%d ::= \"\\\"key_%c%c\\\"\" ws \":\" ws str\n", k, 'a' + k % 26,
                              'a' + k / 26);
        if (k < N)
            n += (size_t)snprintf(g + n, 16384 - n, "o%d ::= (ws \",\" ws n%d)? o%d\n", k, k, k - 1);
    }
    grammar_compiled *cg = grammar_compile_ebnf(g, n, v, NULL, &e);
    if (!cg)
        fail_msg("%s", e.msg);
    grammar_limits rl;
    grammar_limits_init(&rl);
    rl.precompute = -1;
    grammar_compiled *ref = grammar_compile_ebnf(g, n, vref, &rl, &e);
    assert_non_null(ref);
    ref->plain_walk = 1;
    grammar_matcher *a = grammar_matcher_new(cg, &e), *b = grammar_matcher_new(ref, &e);
    assert_non_null(a);
    assert_non_null(b);
    /* key_ob is property 40, key_db property 29, key_ma property 12 */
    static const char *const chunks[] = {"{", "\"key_ob\"", ": ", "\"a\"", ",", " ", "\"key_db\": \"b\"", ",",
                                         "\n\"key_ma\":\"c\"", " ", "}"};
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *m1 = calloc(nw, sizeof *m1), *m2 = calloc(nw, sizeof *m2);
    for (size_t i = 0; i <= sizeof chunks / sizeof chunks[0]; i++) {
        grammar_compiled_stats s0, s1;
        grammar_compiled_stats_get(cg, &s0);
        int c1 = grammar_matcher_fill_next_token_bitmask(a, m1, nw);
        grammar_compiled_stats_get(cg, &s1);
        int c2 = grammar_matcher_fill_next_token_bitmask(b, m2, nw);
        assert_true(c1 > 0);
        if (c1 != c2 || memcmp(m1, m2, nw * sizeof *m1))
            fail_msg("chunk %zu: masks differ (%d vs %d allowed)", i, c1, c2);
        /* after a value and after the ',' that follows it: nothing new */
        if (i == 4 || i == 5 || i == 7 || i == 8)
            if (s1.entries + s1.children != s0.entries + s0.children)
                fail_msg("chunk %zu: %lld walks in the mask", i,
                         s1.entries + s1.children - s0.entries - s0.children);
        if (i == sizeof chunks / sizeof chunks[0])
            break;
        assert_int_equal(grammar_matcher_accept_string(a, chunks[i], strlen(chunks[i])), 1);
        assert_int_equal(grammar_matcher_accept_string(b, chunks[i], strlen(chunks[i])), 1);
    }
    assert_true(grammar_matcher_can_end(a));
    free(m1);
    free(m2);
    free(g);
    grammar_matcher_free(a);
    grammar_matcher_free(b);
    grammar_compiled_free(cg);
    grammar_compiled_free(ref);
    grammar_vocab_free(v);
    grammar_vocab_free(vref);
    tokenizer_free(tok);
}

/* uniqueItems at run time (unique_int.h): arrays made by a rule named
 * __unique_items_* refuse an item equal (JSON Schema equality) to an
 * earlier one of the same array; the plain array does not. Member values
 * and items of any array are unique arrays, the top-level array is not. */
static const char UNIQ_EBNF[] =
    "root ::= array\n"
    "value ::= object | __unique_items_0 | string | number | \"true\" | \"false\" | \"null\"\n"
    "object ::= \"{\" ws ( member ( ws \",\" ws member )* )? ws \"}\"\n"
    "member ::= string ws \":\" ws value\n"
    "array ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "__unique_items_0 ::= \"[\" ws ( value ( ws \",\" ws value )* )? ws \"]\"\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws ::= [ \\t\\n\\r]*\n";

static const struct {
    const char *doc;
    int ok;
} UNIQ_DOCS[] = {
    {"[[1, 2], [1, 2]]", 1},               /* the top-level array is plain */
    {"[[1, 1]]", 0},
    {"[[1, 12, 2]]", 1},
    {"[[1e1, 10]]", 0},                    /* numbers by value */
    {"[[0.5, 5e-1]]", 0},
    {"[[0, -0.0]]", 0},
    {"[[100, 1e2, 3]]", 0},
    {"[[1.5, 15]]", 1},
    {"[[\"\\u00e9\", \"\xc3\xa9\"]]", 0}, /* strings decoded */
    {"[[\"a\\\"\", \"a\\\"\"]]", 0},
    {"[[\"a\\\\\", \"a\"]]", 1},
    {"[[\"\\ud83d\\ude00\", \"\xf0\x9f\x98\x80\"]]", 0},
    {"[[true, false, null]]", 1},
    {"[[null, null]]", 0},
    {"[[{\"a\": 1, \"b\": 2}, {\"b\": 2, \"a\": 1.0}]]", 0}, /* members in any order */
    {"[[{\"a\": 1, \"b\": 2}, {\"b\": 2, \"a\": 3}]]", 1},
    {"[[{}, []]]", 1},
    {"[[{}, {}]]", 0},
    {"[[[1, 2], [2, 1]]]", 1},
    {"[[[1, 2], [1, 2.0]]]", 0},
    {"[[[1, 1]]]", 0},                     /* nested unique arrays */
    {"[{\"k\": [\"a\", \"b\"]}, {\"k\": [\"b\", \"a\"]}]", 1},
    {"[{\"k\": [\"a\", \"a\"]}]", 0},
    {"[[\"a\", [\"a\"], {\"a\": \"a\"}]]", 1},
    {"[[{\"x\": [1, 2]}, {\"x\": [1, 2]}]]", 0},
    {"[[{\"x\": [1, 2]}, {\"x\": [2, 1]}]]", 1},
};

static void test_unique_items(void **state)
{
    (void)state;
    grammar_vocab *v = synth_vocab();
    tern_err e = {0};
    grammar_compiled *cg = grammar_compile_ebnf(UNIQ_EBNF, strlen(UNIQ_EBNF), v, NULL, &e);
    if (!cg)
        fail_msg("%s", e.msg);
    const grammar *g = grammar_compiled_grammar(cg);
    grammar_matcher *m = grammar_matcher_new(cg, &e);
    assert_non_null(m);
    for (size_t d = 0; d < sizeof UNIQ_DOCS / sizeof UNIQ_DOCS[0]; d++) {
        const char *doc = UNIQ_DOCS[d].doc;
        size_t n = strlen(doc);
        if (grammar_check_text(g, doc, n) != UNIQ_DOCS[d].ok)
            fail_msg("check_text '%s': want %d", doc, UNIQ_DOCS[d].ok);
        /* byte by byte through the matcher: the first refused byte is the
         * one that completes the duplicate (the check_prefix reference
         * agrees at every byte); rollback past it and on again */
        grammar_matcher_reset(m);
        size_t i = 0;
        for (; i < n; i++) {
            int a = grammar_matcher_accept_string(m, doc + i, 1);
            assert_int_equal(a, grammar_check_prefix(g, doc, i + 1));
            if (a != 1)
                break;
        }
        assert_int_equal(i == n, UNIQ_DOCS[d].ok);
        if (i < n) {
            /* a duplicate ends at a quote, a bracket, or the byte after a
             * number / literal */
            assert_non_null(strchr("\"]}, ", doc[i]));
            assert_int_equal(grammar_matcher_rollback(m, 1), 0);
            assert_int_equal(grammar_matcher_accept_string(m, doc + i - 1, 1), 1);
            assert_int_equal(grammar_matcher_accept_string(m, doc + i, 1), 0);
        } else {
            assert_true(grammar_matcher_can_end(m));
        }
        /* the whole document as one step is refused the same way */
        grammar_matcher_reset(m);
        assert_int_equal(grammar_matcher_accept_string(m, doc, n), UNIQ_DOCS[d].ok);
        assert_int_equal(grammar_matcher_n_steps(m), 0 + UNIQ_DOCS[d].ok);
    }
    /* masks against the byte-level reference along random walks (the
     * synthetic vocabulary writes 1, 12, "a, true, null, [ ] {" ... so
     * duplicates come up often), and against accept + rollback */
    random_walks(cg, check_ref, (void *)g, 91, 300);
    grammar_matcher_free(m);
    grammar_compiled_free(cg);
    /* a unique array at the root with few distinct short items: walks
     * meet duplicates within a few steps */
    static const char small[] = "root ::= __unique_items_1\n"
                                "__unique_items_1 ::= \"[\" ws ( v ( ws \",\" ws v )* )? ws \"]\"\n"
                                "v ::= \"1\" | \"12\" | \"2.5\" | \"true\" | \"null\" | \"\\\"a\\\"\" | \"\\\"ab\\\"\" | \"{\\\"a\\\":1}\"\n"
                                "ws ::= [ ]*\n";
    cg = grammar_compile_ebnf(small, strlen(small), v, NULL, &e);
    if (!cg)
        fail_msg("%s", e.msg);
    random_walks(cg, check_ref, (void *)grammar_compiled_grammar(cg), 92, 300);
    grammar_compiled_free(cg);
    /* jump-forward stops before the byte that would complete a duplicate */
    static const char forced[] = "root ::= __unique_items_2\n"
                                 "__unique_items_2 ::= \"[\" v (\",\" v)* \"]\"\n"
                                 "v ::= \"\\\"ab\\\"\" | \"\\\"x\\\"\"\n";
    cg = grammar_compile_ebnf(forced, strlen(forced), v, NULL, &e);
    assert_non_null(cg);
    m = grammar_matcher_new(cg, &e);
    char jf[16];
    assert_int_equal(grammar_matcher_accept_string(m, "[\"a", 3), 1);
    assert_int_equal(grammar_matcher_find_jump_forward_string(m, jf, sizeof jf), 2);
    assert_string_equal(jf, "b\"");
    assert_int_equal(grammar_matcher_accept_string(m, "b\",\"a", 5), 1);
    assert_int_equal(grammar_matcher_find_jump_forward_string(m, jf, sizeof jf), 1);
    assert_string_equal(jf, "b");
    grammar_matcher_free(m);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
}

/* uniqueItems on the Llama-3 vocabulary through the schema front end:
 * masks equal per-token accept + rollback at every step; a document with
 * a duplicate is refused exactly at the token that completes it, and that
 * token is not in the mask. */
static void test_unique_items_real(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, tokenizer_vocab_size(tok) + 100, NULL, 0, &e);
    assert_non_null(v);
    const char *schema_text =
        "{\"type\": \"object\", \"properties\": {"
        "\"tags\": {\"type\": \"array\", \"uniqueItems\": true, \"items\": {\"type\": \"string\"}},"
        "\"nums\": {\"type\": \"array\", \"uniqueItems\": true, \"items\": {\"type\": \"number\"}},"
        "\"objs\": {\"type\": \"array\", \"uniqueItems\": true, \"items\": {\"type\": \"object\","
        "  \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"string\"}}}}}}";
    json_object *schema = json_tokener_parse(schema_text);
    assert_non_null(schema);
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    char *ebnf = NULL;
    if (grammar_schema_to_ebnf(schema, &o, &ebnf, &e))
        fail_msg("schema: %s", e.msg);
    json_object_put(schema);
    assert_non_null(strstr(ebnf, "__unique_items_"));
    grammar_compiled *cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &e);
    free(ebnf);
    assert_non_null(cg);
    static const struct {
        const char *doc;
        int ok;
    } docs[] = {
        {"{\"tags\": [\"alpha\", \"beta\", \"alphabet\"], \"nums\": [1, 2.5, -3], \"objs\": [{\"a\": 1}, {\"a\": 2}]}", 1},
        {"{\"tags\": [\"alpha\", \"beta\", \"alpha\"]}", 0},
        {"{\"tags\": [\"x\", \"\\u0078\"]}", 0},
        {"{\"nums\": [10, 20, 1e1]}", 0},
        {"{\"nums\": [7,7]}", 0},
        {"{\"objs\": [{\"a\": 1, \"b\": \"q\"}, {\"a\": 1, \"b\": \"q\"}]}", 0},
        {"{\"objs\": [{\"a\": 1, \"b\": \"q\"}, {\"a\": 1, \"b\": \"r\"}]}", 1},
    };
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *mask = calloc(nw, sizeof *mask);
    int32_t width = grammar_vocab_mask_width(v);
    grammar_matcher *m = grammar_matcher_new(cg, &e), *ref = grammar_matcher_new(cg, &e);
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(tokenizer_encode(tok, docs[d].doc, strlen(docs[d].doc), 0, &ids, &n_ids, &e), 0);
        grammar_matcher_reset(m);
        grammar_matcher_reset(ref);
        size_t i = 0, off = 0;
        for (; i <= n_ids; i++) {
            int cnt = grammar_matcher_fill_next_token_bitmask(m, mask, nw);
            int want_cnt = 0;
            for (int32_t t = 0; t < width; t++) {
                size_t tl;
                const char *tb = grammar_vocab_token(v, t, &tl);
                /* every allowed token, every 11th, and every one holding a quote or a separator */
                int sep = 0;
                for (size_t k = 0; tb && k < tl && !sep; k++)
                    sep = strchr("\",]} ", tb[k]) && tb[k];
                if (!bit(mask, t) && t % 11 && !sep)
                    continue;
                int ok = grammar_matcher_accept_token(ref, t);
                if (ok == 1)
                    grammar_matcher_rollback(ref, 1);
                if ((ok == 1) != bit(mask, t))
                    fail_msg("doc %zu step %zu token %d: mask %d reference %d", d, i, t, bit(mask, t), ok);
                want_cnt += ok == 1;
            }
            assert_true(cnt >= want_cnt);
            if (i == n_ids)
                break;
            size_t tl;
            grammar_vocab_token(v, ids[i], &tl);
            if (!bit(mask, ids[i])) {
                /* the refused token is the one completing the duplicate */
                assert_int_equal(docs[d].ok, 0);
                assert_int_equal(grammar_matcher_accept_token(m, ids[i]), 0);
                assert_int_equal(grammar_check_prefix(grammar_compiled_grammar(cg), docs[d].doc, off), 1);
                assert_int_equal(grammar_check_prefix(grammar_compiled_grammar(cg), docs[d].doc, off + tl), 0);
                break;
            }
            assert_int_equal(grammar_matcher_accept_token(m, ids[i]), 1);
            assert_int_equal(grammar_matcher_accept_token(ref, ids[i]), 1);
            off += tl;
        }
        if (docs[d].ok) {
            assert_int_equal(i, n_ids);
            assert_true(grammar_matcher_can_end(m));
        } else {
            assert_true(i < n_ids);
        }
        free(ids);
    }
    free(mask);
    grammar_matcher_free(m);
    grammar_matcher_free(ref);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

/* String lengths at run time (unique_int.h): a rule named
 * __str_len_MIN_MAX_N holds a string whose codepoints the matcher counts
 * (escapes count one, a surrogate pair one, a multi-byte character one).
 * Masks against the byte-level reference along random walks of the
 * synthetic vocabulary (pieces of escapes, characters cut inside a code
 * point, quotes followed by more), and refused bytes on documents. */
static void test_string_lengths_run_time(void **state)
{
    (void)state;
    grammar_vocab *v = synth_vocab();
    tern_err e = {0};
    static const char src[] =
        "root ::= \"[\" ws ( v ( ws \",\" ws v )* )? ws \"]\"\n"
        "v ::= __str_len_2_5_0 | \"{\" ws __str_len_0_3_1 ws \"}\" | \"1\"\n"
        "__str_len_2_5_0 ::= \"\\\"\" ( [a-z\\u00e9\\u20ac] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\"\n"
        "__str_len_0_3_1 ::= \"\\\"\" [xyz]* \"\\\"\"\n"
        "ws ::= [ \\n]*\n";
    grammar_compiled *cg = grammar_compile_ebnf(src, strlen(src), v, NULL, &e);
    if (!cg)
        fail_msg("%s", e.msg);
    const grammar *g = grammar_compiled_grammar(cg);
    static const struct {
        const char *doc;
        int ok;
    } docs[] = {
        {"[\"ab\"]", 1},          {"[\"a\"]", 0},       {"[\"abcde\"]", 1},    {"[\"abcdef\"]", 0},
        {"[\"\\u0061\"]", 0},     {"[\"\\u0061b\"]", 1}, {"[\"\xc3\xa9\xc3\xa9\"]", 1},
        {"[\"\xe2\x82\xac\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"]", 1}, {"[\"\xe2\x82\xac\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"]", 0},
        {"[\"\\ud83d\\ude00a\"]", 1}, /* a surrogate pair counts one */
        {"[{\"xyz\"}, {\"\"}]", 1}, {"[{\"xyzx\"}]", 0}, {"[{\"\"}]", 1}, /* the [xyz] strings: 0..3 */
        {"[\"abcd\\n\"]", 1},     {"[\"abcd\\n\\t\"]", 0},
    };
    grammar_matcher *m = grammar_matcher_new(cg, &e);
    for (size_t d = 0; d < sizeof docs / sizeof docs[0]; d++) {
        size_t n = strlen(docs[d].doc);
        if (grammar_check_text(g, docs[d].doc, n) != docs[d].ok)
            fail_msg("check_text '%s': want %d", docs[d].doc, docs[d].ok);
        grammar_matcher_reset(m);
        size_t i = 0;
        for (; i < n; i++) {
            int a = grammar_matcher_accept_string(m, docs[d].doc + i, 1);
            assert_int_equal(a, grammar_check_prefix(g, docs[d].doc, i + 1));
            if (a != 1)
                break;
        }
        assert_int_equal(i == n, docs[d].ok);
    }
    grammar_matcher_free(m);
    random_walks(cg, check_ref, (void *)g, 93, 400);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
}

/* The schema front end takes that path where the product automaton
 * would pass its bound (format email with lengths in the hundreds); on
 * Llama 3 every step's mask equals per-token accept + rollback (every
 * allowed token, every 7th, every one with a quote), near both bounds. */
static void test_string_lengths_real(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, tokenizer_vocab_size(tok) + 100, NULL, 0, &e);
    json_object *schema = json_tokener_parse(
        "{\"type\": \"array\", \"items\": {\"type\": \"string\", \"format\": \"email\", \"minLength\": 270, \"maxLength\": 300}}");
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    char *ebnf = NULL;
    if (grammar_schema_to_ebnf(schema, &o, &ebnf, &e))
        fail_msg("schema: %s", e.msg);
    json_object_put(schema);
    assert_non_null(strstr(ebnf, "__str_len_270_300_"));
    grammar_compiled *cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &e);
    free(ebnf);
    assert_non_null(cg);
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *mask = calloc(nw, sizeof *mask);
    int32_t width = grammar_vocab_mask_width(v);
    grammar_matcher *m = grammar_matcher_new(cg, &e), *ref = grammar_matcher_new(cg, &e);
    for (int len = 262; len <= 306; len += 11) {
        /* local part of len - 12 characters, "\u0061" escapes among them */
        char doc[1024];
        size_t n = 0;
        n += (size_t)snprintf(doc + n, sizeof doc - n, "[\"");
        for (int k = 0; k < len - 12; k++)
            n += (size_t)snprintf(doc + n, sizeof doc - n, k % 37 == 5 ? "\\u0061" : k % 5 == 4 ? "q" : k % 2 ? "b" : "ab");
        n += (size_t)snprintf(doc + n, sizeof doc - n, "@example.com\"]");
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(tokenizer_encode(tok, doc, n, 0, &ids, &n_ids, &e), 0);
        grammar_matcher_reset(m);
        grammar_matcher_reset(ref);
        size_t i = 0;
        for (; i <= n_ids; i++) {
            int cnt = grammar_matcher_fill_next_token_bitmask(m, mask, nw);
            int want = 0;
            for (int32_t t = 0; t < width; t++) {
                size_t tl;
                const char *tb = grammar_vocab_token(v, t, &tl);
                int q = tb && memchr(tb, '"', tl) != NULL;
                if (!bit(mask, t) && t % 7 && !q)
                    continue;
                int ok = grammar_matcher_accept_token(ref, t);
                if (ok == 1)
                    grammar_matcher_rollback(ref, 1);
                if ((ok == 1) != bit(mask, t))
                    fail_msg("len %d step %zu token %d: mask %d reference %d", len, i, t, bit(mask, t), ok);
                want += ok == 1;
            }
            assert_true(cnt >= want);
            if (i == n_ids || !bit(mask, ids[i]))
                break;
            assert_int_equal(grammar_matcher_accept_token(m, ids[i]), 1);
            assert_int_equal(grammar_matcher_accept_token(ref, ids[i]), 1);
        }
        int okdoc = grammar_check_text(grammar_compiled_grammar(cg), doc, n);
        assert_int_equal(i == n_ids, okdoc == 1);
        free(ids);
    }
    free(mask);
    grammar_matcher_free(m);
    grammar_matcher_free(ref);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

/* Counted strings past the product bound (docs/grammar.md): the same
 * schema compiled with the lengths counted at run time and, as the
 * reference, with the product automaton (len_product_max raised) give
 * the same mask at every step on Llama 3 - the tracker's automaton
 * refuses what leaves no way to end in bounds: a space at maxLength
 * (a word still owed), "a" one short of a whole "abc", letters that
 * cannot reach minLength (at most three "ab"). */
static char *len_ebnf(const char *schema_text, long product_max)
{
    tern_err e = {0};
    json_object *schema = json_tokener_parse(schema_text);
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    if (product_max)
        o.len_product_max = product_max;
    char *ebnf = NULL;
    if (grammar_schema_to_ebnf(schema, &o, &ebnf, &e))
        fail_msg("schema: %s", e.msg);
    json_object_put(schema);
    return ebnf;
}

static void test_string_lengths_dead_ends(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, tokenizer_vocab_size(tok) + 100, NULL, 0, &e);
    static const struct {
        const char *schema;
        const char *unit[3]; /* the document: units repeated, then the tail */
        int reps[3];
    } cases[] = {
        {"{\"type\": \"string\", \"pattern\": \"^(?:\\\\S+\\\\s+){0,9}\\\\S+$\", \"maxLength\": 250}",
         {"word ", "x", " "}, {9, 204, 1}},
        {"{\"type\": \"string\", \"pattern\": \"^(?:\\\\S+\\\\s+){0,9}\\\\S+$\", \"maxLength\": 250}",
         {"abcdefghijklmnopqrstuvw ", "e", "  "}, {9, 33, 1}},
        {"{\"type\": \"string\", \"pattern\": \"^(abc)+$\", \"maxLength\": 1100}", {"abc", "a", ""}, {366, 1, 0}},
        {"{\"type\": \"string\", \"pattern\": \"^(ab){0,3}$|^[0-9]+$\", \"minLength\": 8, \"maxLength\": 1000}",
         {"12", "34", "5"}, {5, 1, 1}},
    };
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *mask = calloc(nw, sizeof *mask), *want = calloc(nw, sizeof *want), *esc = calloc(nw, sizeof *esc);
    /* tokens with a backslash are left out: the product writes every
     * character's escaped forms too, the plain regex its literals only
     * (both exact for what they accept) */
    for (int32_t t = 0; t < grammar_vocab_mask_width(v); t++) {
        size_t tl;
        const char *tb = grammar_vocab_token(v, t, &tl);
        if (tb && memchr(tb, '\\', tl))
            esc[t / 32] |= 1u << (t % 32);
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char *ea = len_ebnf(cases[k].schema, 0), *eb = len_ebnf(cases[k].schema, 1L << 30);
        assert_non_null(strstr(ea, "__str_len_"));
        assert_null(strstr(eb, "__str_len_"));
        grammar_compiled *ca = grammar_compile_ebnf(ea, strlen(ea), v, NULL, &e);
        grammar_compiled *cb = grammar_compile_ebnf(eb, strlen(eb), v, NULL, &e);
        assert_non_null(ca);
        assert_non_null(cb);
        free(ea);
        free(eb);
        char doc[4096];
        size_t n = 0;
        doc[n++] = '"';
        for (int u = 0; u < 3; u++)
            for (int r = 0; r < cases[k].reps[u]; r++)
                n += (size_t)snprintf(doc + n, sizeof doc - n, "%s", cases[k].unit[u]);
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(tokenizer_encode(tok, doc, n, 0, &ids, &n_ids, &e), 0);
        grammar_matcher *ma = grammar_matcher_new(ca, &e), *mb = grammar_matcher_new(cb, &e);
        size_t i = 0;
        for (; i <= n_ids; i++) {
            grammar_matcher_fill_next_token_bitmask(ma, mask, nw);
            grammar_matcher_fill_next_token_bitmask(mb, want, nw);
            for (size_t w = 0; w < nw; w++)
                if ((mask[w] ^ want[w]) & ~esc[w])
                    fail_msg("case %zu step %zu: word %zu counted %08x product %08x", k, i, w, mask[w], want[w]);
            if (i == n_ids || !bit(want, ids[i]))
                break;
            assert_int_equal(grammar_matcher_accept_token(ma, ids[i]), 1);
            assert_int_equal(grammar_matcher_accept_token(mb, ids[i]), 1);
        }
        free(ids);
        grammar_matcher_free(ma);
        grammar_matcher_free(mb);
        grammar_compiled_free(ca);
        grammar_compiled_free(cb);
    }
    free(mask);
    free(want);
    free(esc);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

/* The same comparison along random walks of the synthetic vocabulary
 * (characters cut inside a code point, multi-byte characters, spaces),
 * over patterns whose dead ends come from counted groups, parity, a
 * required character, a minimum only: every step's mask of the counted
 * grammar equals the product's (tokens with a backslash aside). */
static void test_string_lengths_dead_ends_walks(void **state)
{
    (void)state;
    grammar_vocab *v = synth_vocab();
    tern_err e = {0};
    static const char *const schemas[] = {
        "{\"type\": \"string\", \"pattern\": \"^(abc|z)+$\", \"maxLength\": 64}",
        "{\"type\": \"string\", \"pattern\": \"^(?:\\\\S+\\\\s+){0,3}\\\\S+$\", \"maxLength\": 64}",
        "{\"type\": \"string\", \"pattern\": \"^[a-z]{2}(-[a-z]+)*$\", \"minLength\": 10, \"maxLength\": 70}",
        "{\"type\": \"string\", \"pattern\": \"^(aa)*b?$\", \"minLength\": 5, \"maxLength\": 81}",
        "{\"type\": \"string\", \"pattern\": \"^[^a]*a[^a]*$\", \"maxLength\": 64}",
        "{\"type\": \"string\", \"pattern\": \"^\\u00e9+(x|yz)*\\u00e9?$\", \"maxLength\": 66}",
        "{\"type\": \"string\", \"pattern\": \"^(12|0)+$\", \"minLength\": 65}",
        ("{\"type\": \"array\", \"items\": {\"type\": \"string\", \"pattern\": \"^(abc|z)+$\", \"minLength\": 4, "
         "\"maxLength\": 64}}"),
    };
    size_t nw = grammar_vocab_mask_words(v);
    uint32_t *ma_bits = calloc(nw, sizeof *ma_bits), *mb_bits = calloc(nw, sizeof *mb_bits);
    tern_rng r;
    tern_rng_seed(&r, 2026, 12);
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        char *ea = len_ebnf(schemas[k], 1), *eb = len_ebnf(schemas[k], 1L << 30);
        if (!strstr(ea, "__str_len_") || strstr(eb, "__str_len_"))
            fail_msg("schema %zu: not compiled both ways", k);
        grammar_compiled *ca = grammar_compile_ebnf(ea, strlen(ea), v, NULL, &e);
        grammar_compiled *cb = grammar_compile_ebnf(eb, strlen(eb), v, NULL, &e);
        assert_non_null(ca);
        assert_non_null(cb);
        free(ea);
        free(eb);
        grammar_matcher *ma = grammar_matcher_new(ca, &e), *mb = grammar_matcher_new(cb, &e);
        for (int w = 0; w < 40; w++) {
            grammar_matcher_reset(ma);
            grammar_matcher_reset(mb);
            for (int step = 0; step < 150; step++) {
                grammar_matcher_fill_next_token_bitmask(ma, ma_bits, nw);
                grammar_matcher_fill_next_token_bitmask(mb, mb_bits, nw);
                int32_t pick[MASK_W], n_pick = 0, n_long = 0; /* tokens without a quote first */
                for (int32_t t = 0; t < N_TOKS; t++) {
                    if (strchr(TOKS[t], '\\'))
                        continue;
                    if (bit(ma_bits, t) != bit(mb_bits, t))
                        fail_msg("schema %zu walk %d step %d token %d '%s': counted %d product %d", k, w, step, t,
                                 TOKS[t], bit(ma_bits, t), bit(mb_bits, t));
                    if (bit(mb_bits, t) && t != STOP_ID) {
                        if (!strchr(TOKS[t], '"')) {
                            pick[n_pick++] = pick[n_long];
                            pick[n_long++] = t;
                        } else {
                            pick[n_pick++] = t;
                        }
                    }
                }
                /* strings grow to their bounds (a quote one time in 64),
                 * never into a token the vocabulary cannot continue */
                int32_t t = -1;
                while (n_pick && t < 0) {
                    uint32_t x = tern_rng_u32(&r);
                    int32_t i = (int32_t)(n_long && x % 64 ? (x >> 6) % (uint32_t)n_long : (x >> 6) % (uint32_t)n_pick);
                    t = pick[i];
                    assert_int_equal(grammar_matcher_accept_token(mb, t), 1);
                    grammar_matcher_fill_next_token_bitmask(mb, mb_bits, nw);
                    int goes_on = grammar_matcher_can_end(mb);
                    for (int32_t u = 0; u < N_TOKS && !goes_on; u++)
                        goes_on = bit(mb_bits, u) && u != STOP_ID && !strchr(TOKS[u], '\\');
                    if (!goes_on) {
                        grammar_matcher_rollback(mb, 1);
                        if (i < n_long)
                            pick[i] = pick[--n_long], i = n_long;
                        pick[i] = pick[--n_pick];
                        t = -1;
                    }
                }
                if (t < 0)
                    break;
                assert_int_equal(grammar_matcher_accept_token(ma, t), 1);
            }
        }
        grammar_matcher_free(ma);
        grammar_matcher_free(mb);
        grammar_compiled_free(ca);
        grammar_compiled_free(cb);
    }
    free(ma_bits);
    free(mb_bits);
    grammar_vocab_free(v);
}

/* States with the same future share token sets (st_equiv: a class read as
 * UTF-8 ends in one state per sequence length): masks equal those of the
 * same grammar with no sharing at all, compiled against a separate copy
 * of the Llama-3 vocabulary (no token set shared between the two), at
 * every step of documents through strings of wide classes, a counted
 * pattern and numbers. */
static void test_state_equiv(void **state)
{
    (void)state;
    tern_err e = {0};
    tern_tokenizer *tok = llama3_or_skip();
    grammar_vocab *v = grammar_vocab_new(tok, 0, NULL, 0, &e), *vr = grammar_vocab_new(tok, 0, NULL, 0, &e);
    assert_non_null(v);
    assert_non_null(vr);
    char *ebnf = len_ebnf("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\", \"pattern\": "
                          "\"^(?:\\\\S+\\\\s+){0,9}\\\\S+$\", \"maxLength\": 120}, \"b\": {\"type\": \"string\", "
                          "\"maxLength\": 30}, \"c\": {\"type\": \"array\", \"items\": {\"type\": \"number\"}}, "
                          "\"d\": {\"type\": \"string\", \"pattern\": \"^[\\\\w\\u00e9-]+$\"}}}",
                          0);
    grammar_compiled *cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &e);
    grammar_limits nolim;
    grammar_limits_init(&nolim);
    nolim.alias_horizon = 1L << 21; /* no repetition copies shared */
    grammar_compiled *ref = grammar_compile_ebnf(ebnf, strlen(ebnf), vr, &nolim, &e);
    free(ebnf);
    assert_non_null(cg);
    assert_non_null(ref);
    const grammar *g = grammar_compiled_grammar(cg);
    int32_t shared = 0;
    for (int32_t s = 0; s < g->n_states; s++)
        shared += g->st_equiv[s] != s;
    assert_true(shared > 0);
    ref->alias = NULL; /* and no equivalent states */
    static const char *const docs[] = {
        "{\"a\": \"Benefit one  two\\tthree\", \"b\": \"caf\xc3\xa9 \xe2\x82\xac 12\", \"c\": [1.5, -2e3, 0], "
        "\"d\": \"\xc3\xa9t\xc3\xa9-x_1\"}",
        "{\"a\": \"\\u00e9\\u00e9 \xe4\xb8\xad\xe6\x96\x87 \\\"q\\\"\", \"b\": \"\", \"d\": \"a\"}",
    };
    masks_equal_along(cg, ref, tok, docs, sizeof docs / sizeof docs[0]);
    grammar_compiled_free(cg);
    grammar_compiled_free(ref);
    grammar_vocab_free(v);
    grammar_vocab_free(vr);
    tokenizer_free(tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masks_vs_pcre2), cmocka_unit_test(test_masks_recursive),
        cmocka_unit_test(test_matcher_api),    cmocka_unit_test(test_vocab_errors),
        cmocka_unit_test(test_real_tokenizer), cmocka_unit_test(test_repetition_alias),
        cmocka_unit_test(test_loop_classes),   cmocka_unit_test(test_class_edit),
        cmocka_unit_test(test_unique_items),
        cmocka_unit_test(test_unique_items_real), cmocka_unit_test(test_string_lengths_run_time),
        cmocka_unit_test(test_string_lengths_real), cmocka_unit_test(test_precompute_wide),
        cmocka_unit_test(test_string_lengths_dead_ends), cmocka_unit_test(test_string_lengths_dead_ends_walks),
        cmocka_unit_test(test_state_equiv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
