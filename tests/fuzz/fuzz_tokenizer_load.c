/* Fuzz entry point: tokenizer.json text -> tokenizer_load_json; when it
 * loads, a few encodes, decodes and a streaming decode must not crash and
 * must agree with each other. Corpus: tests/fuzz/corpus/tokenizer_load/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

static const char *TEXTS[] = {"Hello world", " a  b\n\tc ", "<s>x</s><|im_start|>", "日本語 😀 e\xCC\x81", ""};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tern_err e = {0};
    tern_tokenizer *t = tokenizer_load_json((const char *)data, size, &e);
    if (!t) {
        if (e.code >= 0)
            abort(); /* a failed load must say why */
        return 0;
    }
    for (size_t i = 0; i < sizeof TEXTS / sizeof *TEXTS; i++) {
        int32_t *ids;
        size_t n;
        if (tokenizer_encode(t, TEXTS[i], strlen(TEXTS[i]), (int)(i & 1), &ids, &n, &e))
            continue;
        for (size_t k = 0; k < n; k++)
            if (ids[k] < 0 || ids[k] >= tokenizer_vocab_size(t))
                abort();
        char *s;
        size_t sl;
        if (tokenizer_decode(t, ids, n, 1, &s, &sl, &e) == 0)
            free(s);
        tern_detok *d = detok_new(t, NULL, 0, 0, &e);
        for (size_t k = 0; d && k < n; k++) {
            const char *p;
            size_t pl;
            detok_push(d, ids[k], &p, &pl, &e);
        }
        const char *p;
        size_t pl;
        if (d)
            detok_flush(d, &p, &pl, &e);
        detok_free(d);
        for (size_t k = 0; k < n; k++) {
            const char *b;
            size_t bl;
            tokenizer_token_bytes(t, ids[k], &b, &bl);
        }
        free(ids);
    }
    tokenizer_free(t);
    return 0;
}
