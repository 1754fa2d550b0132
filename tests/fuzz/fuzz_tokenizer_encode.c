/* Fuzz entry point: arbitrary bytes -> tokenizer_encode on the shipped
 * tokenizers (first byte picks one and the options), then decode and a
 * streaming decode whose concatenation must equal the decode whenever the
 * decoded text ends on a whole code point. Corpus:
 * tests/fuzz/corpus/tokenizer_encode/. Tokenizers: the repository's
 * tern-demo (always; the build bakes in where the source is), and
 * stories260K and qwen3 from the shared folder when present (tern-demo
 * stands in for a missing one). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

#define N_TOK 3
static tern_tokenizer *toks[N_TOK];
static int loaded;

/* The source tree, baked in by the build (tests/tests.cmake) so a fuzzer
 * started from anywhere, with no environment, loads real tokenizers;
 * TERN_ROOT / TERN_SHARED still override. */
#ifndef TERN_SOURCE_DIR
#define TERN_SOURCE_DIR "."
#endif

static void load_all(void)
{
    const char *sh = getenv("TERN_SHARED"), *root = getenv("TERN_ROOT");
    char p[3][4096];
    snprintf(p[0], sizeof p[0], "%s/models/tern-demo", root ? root : TERN_SOURCE_DIR);
    snprintf(p[1], sizeof p[1], "%s/models/stories260K", sh ? sh : TERN_SOURCE_DIR "/../shared");
    snprintf(p[2], sizeof p[2], "%s/tokenizers/qwen3", sh ? sh : TERN_SOURCE_DIR "/../shared");
    for (int i = 0; i < N_TOK; i++)
        toks[i] = tokenizer_load(p[i], NULL);
    if (!toks[0]) { /* the repository's own tokenizer always exists: fuzzing nothing is a failure */
        fprintf(stderr, "fuzz_tokenizer_encode: cannot load %s\n", p[0]);
        abort();
    }
    for (int i = 1; i < N_TOK; i++)
        if (!toks[i])
            toks[i] = toks[0]; /* the shared ones are optional */
    loaded = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!loaded)
        load_all();
    if (size < 1)
        return 0;
    tern_tokenizer *t = toks[data[0] % N_TOK];
    int add_special = (data[0] >> 2) & 1, skip = (data[0] >> 3) & 1;
    if (!t)
        return 0;
    tern_err e = {0};
    int32_t *ids;
    size_t n;
    if (tokenizer_encode(t, (const char *)data + 1, size - 1, add_special, &ids, &n, &e))
        abort(); /* any bytes must encode */
    char *s;
    size_t sl;
    if (tokenizer_decode(t, ids, n, skip, &s, &sl, &e))
        abort();
    tern_detok *d = detok_new(t, NULL, 0, skip, &e);
    if (!d)
        abort();
    char *acc = malloc(sl * 2 + 64);
    size_t al = 0, cap = sl * 2 + 64;
    int overflow = 0;
    for (size_t k = 0; k <= n; k++) {
        const char *p;
        size_t pl;
        if (k < n ? detok_push(d, ids[k], &p, &pl, &e) : detok_flush(d, &p, &pl, &e))
            abort();
        if (al + pl > cap)
            overflow = 1;
        else
            memcpy(acc + al, p, pl), al += pl;
    }
    int whole_end = !(sl >= 3 && !memcmp(s + sl - 3, "\xEF\xBF\xBD", 3));
    if (whole_end && (overflow || al != sl || memcmp(acc, s, sl)))
        abort();
    free(acc);
    detok_free(d);
    free(s);
    free(ids);
    return 0;
}
