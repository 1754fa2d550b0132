/* The reasoning splitter (src/server/reasoning.c): expected thought/answer
 * pairs for real thinking-model outputs (Qwen3-style blocks, a block the
 * primer opened, cut-off thoughts, partial delimiters), and for every case
 * the streamed split - byte by byte and in random pieces - equals the
 * one-shot split. Also the delimiters of real vocabularies, the start
 * state from the prompt, and effort/budget mapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server/reasoning.h"

static reasoning_delims think_delims(void)
{
    reasoning_delims d;
    memset(&d, 0, sizeof d);
    strcpy(d.open, "<think>");
    strcpy(d.close, "</think>");
    d.open_len = 7;
    d.close_len = 8;
    d.open_id = 3;
    d.close_id = 4;
    return d;
}

typedef struct split_out {
    tern_sbuf r, c;
} split_out;

/* Splits text fed in pieces of the given sizes (0-terminated list cycled;
 * NULL = one piece). */
static void split_pieces(const reasoning_delims *d, reasoning_start st, const char *text, const size_t *sizes,
                         split_out *o)
{
    memset(o, 0, sizeof *o);
    reasoning_split rs;
    reasoning_split_init(&rs, d, st);
    size_t n = strlen(text), at = 0, k = 0;
    while (at < n) {
        size_t step = sizes ? sizes[k++] : n;
        if (sizes && sizes[k] == 0)
            k = 0;
        if (step > n - at)
            step = n - at;
        assert_int_equal(reasoning_split_push(&rs, text + at, step, &o->r, &o->c), 0);
        at += step;
    }
    assert_int_equal(reasoning_split_finish(&rs, &o->r, &o->c), 0);
    reasoning_split_free(&rs);
}

static const char *str(const tern_sbuf *b) { return b->s ? b->s : ""; }

static void check_case(reasoning_start st, const char *text, const char *want_r, const char *want_c)
{
    reasoning_delims d = think_delims();
    split_out one;
    split_pieces(&d, st, text, NULL, &one);
    if (strcmp(str(&one.r), want_r) || strcmp(str(&one.c), want_c))
        fail_msg("split of [%s]: reasoning [%s] content [%s], want [%s] [%s]", text, str(&one.r), str(&one.c),
                 want_r, want_c);
    static const size_t bytes[] = {1, 0};
    split_out b;
    split_pieces(&d, st, text, bytes, &b);
    assert_string_equal(str(&b.r), want_r);
    assert_string_equal(str(&b.c), want_c);
    free(b.r.s);
    free(b.c.s);
    srand(1234);
    for (int trial = 0; trial < 200; trial++) {
        size_t sizes[16];
        for (int i = 0; i < 15; i++)
            sizes[i] = 1 + (size_t)(rand() % 9);
        sizes[15] = 0;
        split_out p;
        split_pieces(&d, st, text, sizes, &p);
        if (strcmp(str(&p.r), want_r) || strcmp(str(&p.c), want_c))
            fail_msg("pieces (trial %d) of [%s]: [%s] [%s]", trial, text, str(&p.r), str(&p.c));
        free(p.r.s);
        free(p.c.s);
    }
    free(one.r.s);
    free(one.c.s);
}

static void test_split_cases(void **state)
{
    (void)state;
    /* Qwen3 with thinking on: the model opens the block itself */
    check_case(REASONING_START_MAY, "<think>\nThe user greets me.\n</think>\n\nHello!", "The user greets me.",
               "Hello!");
    /* a thought with inner blank lines and a partial-looking "</thi" inside */
    check_case(REASONING_START_MAY, "<think>\na </thi b\n\n c  \n</think>\n\n{\"x\": 1}\n",
               "a </thi b\n\n c", "{\"x\": 1}\n");
    /* no block: the answer passes through untouched, whitespace included */
    check_case(REASONING_START_MAY, "  Hello <think> world", "", "  Hello <think> world");
    check_case(REASONING_START_MAY, "\n\n<thin", "", "\n\n<thin");
    /* the primer opened the block (DeepSeek-R1 style): output starts inside */
    check_case(REASONING_START_INSIDE, "step one\nstep two</think>The answer is 4.", "step one\nstep two",
               "The answer is 4.");
    /* cut off inside the thought (max_tokens): all reasoning, no content */
    check_case(REASONING_START_INSIDE, "thinking hard </thi", "thinking hard </thi", "");
    check_case(REASONING_START_MAY, "<think>\nonly thought  \n", "only thought", "");
    /* the primer closed the block (enable_thinking false) */
    check_case(REASONING_START_ANSWER, "<think>x</think>y", "", "<think>x</think>y");
    /* an empty block */
    check_case(REASONING_START_MAY, "<think>\n\n</think>\n\nJust this.", "", "Just this.");
    /* a second close inside the answer stays in the answer */
    check_case(REASONING_START_MAY, "<think>a</think>b</think>c", "a", "b</think>c");
    /* UTF-8 in both parts */
    check_case(REASONING_START_MAY, "<think>héllo → wörld</think>\n日本語", "héllo → wörld", "日本語");
}

static void test_no_delims(void **state)
{
    (void)state;
    split_out o;
    split_pieces(NULL, REASONING_START_MAY, "<think>a</think>b", NULL, &o);
    assert_string_equal(str(&o.c), "<think>a</think>b");
    assert_null(o.r.s);
    free(o.c.s);
}

static void test_start_state(void **state)
{
    (void)state;
    reasoning_delims d = think_delims();
    /* ... <|im_start|>assistant\n  | primer from index 3 */
    int32_t plain[] = {10, 11, 12, 1, 20, 21};
    int32_t opened[] = {10, 4, 12, 1, 20, 3, 30};
    int32_t closed[] = {10, 11, 12, 1, 20, 3, 30, 4, 30};
    assert_int_equal(reasoning_start_of(&d, plain, 6, 3, 0), REASONING_START_MAY);
    assert_int_equal(reasoning_start_of(&d, plain, 6, 3, 1), REASONING_START_ANSWER);
    /* a close in the history (before the boundary) does not count */
    assert_int_equal(reasoning_start_of(&d, opened, 7, 3, 0), REASONING_START_INSIDE);
    assert_int_equal(reasoning_start_of(&d, closed, 9, 3, 0), REASONING_START_ANSWER);
    assert_int_equal(reasoning_start_of(NULL, plain, 6, 3, 0), REASONING_START_ANSWER);
}

static void test_effort_budget(void **state)
{
    (void)state;
    int en = -1, b = -2;
    assert_int_equal(reasoning_effort_parse("none", &en, &b), 0);
    assert_int_equal(en, 0);
    assert_int_equal(b, 0);
    assert_int_equal(reasoning_effort_parse("low", &en, &b), 0);
    assert_int_equal(en, 1);
    assert_true(b > 0);
    int low = b;
    assert_int_equal(reasoning_effort_parse("medium", &en, &b), 0);
    assert_true(b > low);
    assert_int_equal(reasoning_effort_parse("high", &en, &b), 0);
    assert_int_equal(b, -1);
    assert_int_equal(reasoning_effort_parse("max", &en, &b), -1);
    assert_int_equal(reasoning_budget_combine(-1, -1), -1);
    assert_int_equal(reasoning_budget_combine(100, -1), 100);
    assert_int_equal(reasoning_budget_combine(-1, 50), 50);
    assert_int_equal(reasoning_budget_combine(100, 50), 50);
    assert_int_equal(reasoning_budget_combine(0, 50), 0);
}

/* Real vocabularies: the demo model and Qwen3 have <think> as single
 * tokens; Llama 3 has none. */
static void test_real_vocabularies(void **state)
{
    (void)state;
    const char *root = getenv("TERN_ROOT"), *shared = getenv("TERN_SHARED");
    char dir[4096];
    tern_err err = {0};
    snprintf(dir, sizeof dir, "%s/models/tern-demo", root ? root : ".");
    tern_tokenizer *tok = tokenizer_load(dir, &err);
    assert_non_null(tok);
    reasoning_delims d;
    assert_int_equal(reasoning_delims_find(tok, &d), 1);
    assert_string_equal(d.open, "<think>");
    assert_string_equal(d.close, "</think>");
    assert_int_equal(d.open_id, 3);
    assert_int_equal(d.close_id, 4);
    tokenizer_free(tok);
    if (!shared)
        return;
    snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", shared);
    if ((tok = tokenizer_load(dir, &err))) {
        assert_int_equal(reasoning_delims_find(tok, &d), 1);
        assert_int_equal(d.open_id, tokenizer_token_id(tok, "<think>"));
        tokenizer_free(tok);
    }
    snprintf(dir, sizeof dir, "%s/tokenizers/llama3", shared);
    if ((tok = tokenizer_load(dir, &err))) {
        assert_int_equal(reasoning_delims_find(tok, &d), 0);
        tokenizer_free(tok);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_split_cases),
        cmocka_unit_test(test_no_delims),
        cmocka_unit_test(test_start_state),
        cmocka_unit_test(test_effort_budget),
        cmocka_unit_test(test_real_vocabularies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
