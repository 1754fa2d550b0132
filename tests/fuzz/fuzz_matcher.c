/* Fuzz entry point for the matcher: a random token walk must never crash
 * and never leave the grammar. Input: EBNF text, a NUL byte, then one
 * byte per step choosing among the allowed tokens (or, for bytes >= 0xF0,
 * trying an arbitrary token or rolling back). Every accepted text must be
 * a prefix of the grammar (grammar_check_prefix), a stop token may be
 * accepted only on a complete sentence (grammar_check_text), and
 * accept_token must agree with the mask. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

static const char *const TOKS[] = {
    "{", "}", "\"", "\"a", "a", "ab", "b\":", "\":", ":", " ", ", ", "1", "12", "2.5", "e3", "[", "]", "]}", "true",
    "null", "\",", "\\u", "00", "\xc3\xa9", "\xc3", "\xa9", "x\"y", "(", ")", "-", "0", "+", "xyz", "\n", "  ", "<s>",
    "</s>",
};
#define N_TOKS ((int32_t)(sizeof TOKS / sizeof TOKS[0]))
#define MASK_W (N_TOKS + 5)

static grammar_vocab *vocab(void)
{
    static grammar_vocab *v;
    if (!v) {
        size_t lens[N_TOKS];
        uint8_t sp[N_TOKS] = {0};
        for (int32_t i = 0; i < N_TOKS; i++)
            lens[i] = strlen(TOKS[i]);
        sp[N_TOKS - 2] = 1;
        int32_t stop = N_TOKS - 1;
        v = grammar_vocab_from_bytes(TOKS, lens, sp, N_TOKS, MASK_W, &stop, 1, NULL);
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t glen = nul ? (size_t)(nul - data) : size;
    const uint8_t *steps = nul ? nul + 1 : data + size;
    size_t n_steps = nul ? size - glen - 1 : 0;
    grammar_limits lim;
    grammar_limits_init(&lim);
    lim.max_states = 20000;
    lim.max_ms = 500;
    grammar_vocab *v = vocab();
    if (!v)
        abort();
    grammar_compiled *cg = grammar_compile_ebnf((const char *)data, glen, v, &lim, NULL);
    if (!cg)
        return 0;
    const grammar *g = grammar_compiled_grammar(cg);
    grammar_matcher *m = grammar_matcher_new(cg, NULL);
    uint32_t mask[(MASK_W + 31) / 32];
    char text[4096];
    size_t len_at[256], tl = 0;
    int depth = 0, stopped = 0;
    if (!m)
        abort();
    for (size_t i = 0; i < n_steps && i < 200; i++) {
        int cnt = grammar_matcher_fill_next_token_bitmask(m, mask, sizeof mask / sizeof mask[0]);
        if (cnt < 0)
            break;
        uint8_t c = steps[i];
        if (c >= 0xF8 && depth > 0) { /* roll back 1..2 steps */
            int n = 1 + (c & 1) > depth ? depth : 1 + (c & 1);
            if (grammar_matcher_rollback(m, n))
                abort();
            depth -= n;
            tl = len_at[depth];
            stopped = 0;
            continue;
        }
        int32_t pick = -1;
        if (c >= 0xF0) {
            pick = (int32_t)(c - 0xF0) * 5 % MASK_W; /* arbitrary, maybe disallowed */
        } else if (cnt > 0) {
            int k = c % cnt;
            for (int32_t t = 0; t < MASK_W && pick < 0; t++)
                if ((mask[t / 32] >> (t % 32)) & 1 && k-- == 0)
                    pick = t;
        }
        if (pick < 0)
            break;
        int allowed = (mask[pick / 32] >> (pick % 32)) & 1;
        int r = grammar_matcher_accept_token(m, pick);
        if (r < 0)
            break;
        if (r != allowed)
            abort(); /* mask and accept disagree */
        if (!r)
            continue;
        if (depth < 255)
            len_at[depth] = tl;
        if (pick == N_TOKS - 1) {
            if (stopped || grammar_check_text(g, text, tl) != 1)
                abort(); /* stopped outside the grammar */
            stopped = 1;
        } else {
            size_t l = strlen(TOKS[pick]);
            if (pick >= N_TOKS || tl + l > sizeof text)
                abort();
            memcpy(text + tl, TOKS[pick], l);
            tl += l;
            if (grammar_check_prefix(g, text, tl) != 1)
                abort(); /* accepted text outside the grammar */
        }
        if (++depth >= 255)
            break;
    }
    grammar_matcher_free(m);
    grammar_compiled_free(cg);
    return 0;
}
