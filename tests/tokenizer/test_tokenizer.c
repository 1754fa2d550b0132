/* Tests for src/tokenizer: load errors, streaming detokenization against the
 * full decode, token bytes against the input text, accessors. Id-level
 * fidelity against Hugging Face is checked by the oracle script tests. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer/tokenizer.h"

static char g_path[4096];

static const char *shared_path(const char *rel)
{
    const char *s = getenv("TERN_SHARED");
    snprintf(g_path, sizeof g_path, "%s/%s", s ? s : "../shared", rel);
    return g_path;
}

static tern_tokenizer *load_or_skip(const char *dir)
{
    tern_err e = {0};
    tern_tokenizer *t = tokenizer_load(dir, &e);
    if (!t)
        fail_msg("loading %s: %s", dir, e.msg);
    return t;
}

static const char *SAMPLES[] = {
    "Hello world",
    " leading and trailing spaces  ",
    "Once upon a time, a little girl named Lily\nfound a shiny coin.\n\n",
    "Emoji 👨‍👩‍👧‍👦 and flags 🇯🇵 mixed with 你好，世界 and 한국어",
    "combining: e\xCC\x81 a\xCC\x8A\xCC\x81 and \xE2\x80\x8Bzero width",
    "<|im_start|>user\nhi<|im_end|> <s>x</s> <bos>",
    "\xF0\x9F\x98\x80\xF0\x9F\x98\x80\xF0\x9F\x98\x80",
    "",
};

/* 1 if s is a sequence of whole UTF-8 code points (lead byte + the
 * continuation bytes it announces). */
static int whole_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)s[i];
        size_t need = c < 0x80 ? 0 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 99;
        if (need == 99 || i + need >= n + (need ? 0 : 1))
            return 0;
        for (size_t k = 1; k <= need; k++)
            if (((unsigned char)s[i + k] & 0xC0) != 0x80)
                return 0;
        i += need + 1;
    }
    return 1;
}

/* Streams ids (after prefix) one at a time and checks the concatenation
 * equals decode(prefix + rest) minus decode(prefix). */
static void check_stream(tern_tokenizer *t, const int32_t *ids, size_t n, size_t n_prefix, int skip)
{
    tern_err e = {0};
    char *full, *pre;
    size_t full_len, pre_len;
    assert_int_equal(tokenizer_decode(t, ids, n, skip, &full, &full_len, &e), 0);
    assert_int_equal(tokenizer_decode(t, ids, n_prefix, skip, &pre, &pre_len, &e), 0);
    if (pre_len >= 3 && !memcmp(pre + pre_len - 3, "\xEF\xBF\xBD", 3)) {
        /* a prompt ending inside a code point has no exact split */
        free(full);
        free(pre);
        return;
    }
    tern_detok *d = detok_new(t, ids, n_prefix, skip, &e);
    assert_non_null(d);
    size_t cap = full_len + pre_len + 16, len = 0;
    char *acc = malloc(cap);
    assert_non_null(acc);
    memcpy(acc, pre, pre_len);
    len = pre_len;
    for (size_t i = n_prefix; i < n; i++) {
        const char *p;
        size_t pl;
        assert_int_equal(detok_push(d, ids[i], &p, &pl, &e), 0);
        assert_true(whole_utf8(p, pl)); /* only complete UTF-8 comes out */
        assert_true(len + pl < cap);
        memcpy(acc + len, p, pl);
        len += pl;
    }
    const char *p;
    size_t pl;
    assert_int_equal(detok_flush(d, &p, &pl, &e), 0);
    assert_true(len + pl < cap);
    memcpy(acc + len, p, pl);
    len += pl;
    if (len != full_len || memcmp(acc, full, len))
        fail_msg("stream '%.*s' != decode '%s' (prefix %zu, skip %d)", (int)len, acc, full, n_prefix, skip);
    detok_free(d);
    free(acc);
    free(full);
    free(pre);
}

static void stream_all(const char *dir)
{
    tern_tokenizer *t = load_or_skip(dir);
    for (size_t s = 0; s < sizeof SAMPLES / sizeof *SAMPLES; s++) {
        for (int special = 0; special < 2; special++) {
            int32_t *ids;
            size_t n;
            tern_err e = {0};
            assert_int_equal(tokenizer_encode(t, SAMPLES[s], strlen(SAMPLES[s]), special, &ids, &n, &e), 0);
            for (int skip = 0; skip < 2; skip++) {
                check_stream(t, ids, n, 0, skip);
                check_stream(t, ids, n, n / 2, skip);
                if (n > 7)
                    check_stream(t, ids, n, 7, skip);
            }
            free(ids);
        }
    }
    tokenizer_free(t);
}

static void test_stream_stories(void **state) { (void)state; stream_all(shared_path("models/stories260K")); }
static void test_stream_qwen3(void **state) { (void)state; stream_all(shared_path("tokenizers/qwen3")); }
static void test_stream_gemma3(void **state) { (void)state; stream_all(shared_path("tokenizers/gemma3")); }

static void test_stream_demo(void **state)
{
    (void)state;
    const char *root = getenv("TERN_ROOT");
    char p[4096];
    snprintf(p, sizeof p, "%s/models/tern-demo", root ? root : ".");
    stream_all(p);
}

/* A split code point is held back until complete. */
static void test_stream_holds_partial_utf8(void **state)
{
    (void)state;
    tern_tokenizer *t = load_or_skip(shared_path("models/stories260K"));
    /* stories260K has byte fallback: 😀 = F0 9F 98 80 as four <0x..> tokens */
    int32_t ids[4];
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", (unsigned)"\xF0\x9F\x98\x80"[i] & 0xFF);
        ids[i] = tokenizer_token_id(t, name);
        assert_true(ids[i] >= 0);
    }
    tern_err e = {0};
    tern_detok *d = detok_new(t, NULL, 0, 1, &e);
    assert_non_null(d);
    const char *p;
    size_t pl;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(detok_push(d, ids[i], &p, &pl, &e), 0);
        assert_int_equal(pl, 0);
    }
    assert_int_equal(detok_push(d, ids[3], &p, &pl, &e), 0);
    assert_int_equal(pl, 4);
    assert_memory_equal(p, "\xF0\x9F\x98\x80", 4);
    /* an incomplete tail is released by flush as the decoder renders it */
    assert_int_equal(detok_push(d, ids[0], &p, &pl, &e), 0);
    assert_int_equal(pl, 0);
    assert_int_equal(detok_flush(d, &p, &pl, &e), 0);
    assert_int_equal(pl, 3);
    assert_memory_equal(p, "\xEF\xBF\xBD", 3);
    assert_int_equal(detok_flush(d, &p, &pl, &e), 0);
    assert_int_equal(pl, 0);
    detok_free(d);
    tokenizer_free(t);
}

/* Concatenated token bytes reproduce the text for byte-level BPE, and the
 * normalized text (▁ -> space) for SentencePiece style. */
static void test_token_bytes(void **state)
{
    (void)state;
    const char *text = "Hello, 世界! 👍🏽 e\xCC\x81\n\tx";
    const char *dirs[] = {shared_path("tokenizers/qwen3"), NULL};
    char d2[4096];
    snprintf(d2, sizeof d2, "%s", shared_path("tokenizers/gemma3"));
    dirs[1] = d2;
    for (int k = 0; k < 2; k++) {
        tern_tokenizer *t = load_or_skip(dirs[k]);
        int32_t *ids;
        size_t n;
        tern_err e = {0};
        assert_int_equal(tokenizer_encode(t, text, strlen(text), 0, &ids, &n, &e), 0);
        char buf[256];
        size_t len = 0;
        for (size_t i = 0; i < n; i++) {
            const char *b;
            size_t bl;
            assert_int_equal(tokenizer_token_bytes(t, ids[i], &b, &bl), 0);
            assert_true(len + bl < sizeof buf);
            memcpy(buf + len, b, bl);
            len += bl;
        }
        assert_int_equal(len, strlen(text));
        assert_memory_equal(buf, text, len);
        const char *b;
        size_t bl;
        assert_int_equal(tokenizer_token_bytes(t, -1, &b, &bl), TERN_ERANGE);
        assert_int_equal(tokenizer_token_bytes(t, tokenizer_vocab_size(t), &b, &bl), TERN_ERANGE);
        free(ids);
        tokenizer_free(t);
    }
}

static void test_accessors(void **state)
{
    (void)state;
    tern_tokenizer *t = load_or_skip(shared_path("tokenizers/qwen3"));
    assert_int_equal(tokenizer_vocab_size(t), 151669);
    int32_t im = tokenizer_token_id(t, "<|im_end|>");
    assert_int_equal(im, 151645);
    assert_string_equal(tokenizer_token_str(t, im), "<|im_end|>");
    assert_true(tokenizer_is_special(t, im));
    assert_false(tokenizer_is_special(t, 9707));
    assert_int_equal(tokenizer_eos_id(t), im);
    assert_int_equal(tokenizer_bos_id(t), -1);
    assert_null(tokenizer_bos_str(t));
    assert_non_null(tokenizer_chat_template(t));
    assert_null(tokenizer_token_str(t, -5));
    assert_int_equal(tokenizer_token_id(t, "no such token, surely"), -1);
    tokenizer_free(t);

    t = load_or_skip(shared_path("models/stories260K"));
    assert_int_equal(tokenizer_bos_id(t), 1);
    assert_int_equal(tokenizer_eos_id(t), 2);
    assert_string_equal(tokenizer_bos_str(t), "<s>");
    const char *b;
    size_t bl;
    assert_int_equal(tokenizer_token_bytes(t, tokenizer_token_id(t, "<0x41>"), &b, &bl), 0);
    assert_int_equal(bl, 1);
    assert_int_equal(b[0], 'A');
    tokenizer_free(t);
}

/* Bad input: invalid UTF-8 is repaired, never a crash. */
static void test_invalid_utf8(void **state)
{
    (void)state;
    tern_tokenizer *t = load_or_skip(shared_path("tokenizers/qwen3"));
    const char bad[] = "a\xFF\xC3(b\xE2\x82\xF0\x9F\x98";
    int32_t *ids;
    size_t n;
    tern_err e = {0};
    assert_int_equal(tokenizer_encode(t, bad, sizeof bad - 1, 1, &ids, &n, &e), 0);
    char *s;
    size_t sl;
    assert_int_equal(tokenizer_decode(t, ids, n, 0, &s, &sl, &e), 0);
    assert_string_equal(s, "a\xEF\xBF\xBD\xEF\xBF\xBD(b\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    free(ids);
    /* out-of-range ids are skipped like HF does */
    int32_t odd[] = {-1, 9707, 1 << 30};
    assert_int_equal(tokenizer_decode(t, odd, 3, 0, &s, &sl, &e), 0);
    assert_string_equal(s, "Hello");
    free(s);
    tokenizer_free(t);
}

static void write_file(const char *dir, const char *name, const char *text)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_load_error(const char *json, const char *needle)
{
    char dir[] = "/tmp/tern_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(dir, "tokenizer.json", json);
    tern_err e = {0};
    tern_tokenizer *t = tokenizer_load(dir, &e);
    assert_null(t);
    assert_true(e.code < 0);
    if (!strstr(e.msg, needle))
        fail_msg("error '%s' does not mention '%s'", e.msg, needle);
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    rmdir(dir);
}

#define MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_load_errors(void **state)
{
    (void)state;
    tern_err e = {0};
    assert_null(tokenizer_load("/nonexistent/dir", &e));
    assert_true(e.code < 0);
    expect_load_error("{", "JSON");
    expect_load_error("[]", "not an object");
    expect_load_error("{}", "model");
    expect_load_error("{" MODEL ", \"normalizer\": {\"type\": \"Precompiled\"}}", "Precompiled");
    expect_load_error("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Fancy\"}}", "Fancy");
    expect_load_error("{" MODEL ", \"decoder\": {\"type\": \"CTC\"}}", "CTC");
    expect_load_error("{" MODEL ", \"post_processor\": {\"type\": \"Magic\"}}", "Magic");
    expect_load_error("{\"model\": {\"type\": \"Neural\", \"vocab\": {}}}", "Neural");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}", "merges[0]");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -3}, \"merges\": []}}", "vocab");
    expect_load_error("{" MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
                      "\"behavior\": \"Isolated\"}}",
                      "regex");
    expect_load_error("{" MODEL ", \"added_tokens\": [{\"content\": \"x\"}]}", "added_tokens[0]");

    /* a minimal valid one loads and encodes */
    char dir[] = "/tmp/tern_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(dir, "tokenizer.json", "{" MODEL "}");
    tern_tokenizer *t = tokenizer_load(dir, &e);
    assert_non_null(t);
    int32_t *ids;
    size_t n;
    assert_int_equal(tokenizer_encode(t, "abba", 4, 1, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 2);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 0);
    free(ids);
    tokenizer_free(t);
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    rmdir(dir);
}

/* add_bos_token / add_eos_token apply only where the post-processor adds
 * nothing. */
static void test_config_bos_eos(void **state)
{
    (void)state;
    char dir[] = "/tmp/tern_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    write_file(dir, "tokenizer.json",
               "{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true}, "
               "{\"id\": 4, \"content\": \"</s>\", \"special\": true}], " MODEL "}");
    write_file(dir, "tokenizer_config.json",
               "{\"add_bos_token\": true, \"add_eos_token\": true, \"bos_token\": \"<s>\", "
               "\"eos_token\": {\"content\": \"</s>\"}, \"chat_template\": [{\"name\": \"tool_use\", "
               "\"template\": \"x\"}, {\"name\": \"default\", \"template\": \"{{ messages }}\"}]}");
    tern_err e = {0};
    tern_tokenizer *t = tokenizer_load(dir, &e);
    assert_non_null(t);
    assert_int_equal(tokenizer_bos_id(t), 3);
    assert_int_equal(tokenizer_eos_id(t), 4);
    assert_string_equal(tokenizer_chat_template(t), "{{ messages }}");
    int32_t *ids;
    size_t n;
    assert_int_equal(tokenizer_encode(t, "ab", 2, 1, &ids, &n, &e), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], 3);
    assert_int_equal(ids[1], 2);
    assert_int_equal(ids[2], 4);
    free(ids);
    assert_int_equal(tokenizer_encode(t, "ab", 2, 0, &ids, &n, &e), 0);
    assert_int_equal(n, 1);
    free(ids);
    tokenizer_free(t);
    char p[4200];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    unlink(p);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_config_bos_eos),
        cmocka_unit_test(test_accessors),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_token_bytes),
        cmocka_unit_test(test_stream_holds_partial_utf8),
        cmocka_unit_test(test_stream_stories),
        cmocka_unit_test(test_stream_demo),
        cmocka_unit_test(test_stream_qwen3),
        cmocka_unit_test(test_stream_gemma3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
