/* grammar_vocab from a loaded tokenizer (kept apart from vocab.c so code
 * that builds synthetic vocabularies does not pull the tokenizer in). */
#include <stdlib.h>

#include "grammar/vocab_int.h"
#include "tokenizer/tokenizer.h"

grammar_vocab *grammar_vocab_new(const struct tern_tokenizer *tok, int32_t mask_width, const int32_t *stop_ids,
                                 size_t n_stop, tern_err *err)
{
    if (!tok) {
        tern_err_set(err, TERN_EINVAL, "vocab: no tokenizer");
        return NULL;
    }
    int32_t n = tokenizer_vocab_size(tok);
    const char **bytes = calloc((size_t)(n > 0 ? n : 1), sizeof *bytes);
    size_t *lens = calloc((size_t)(n > 0 ? n : 1), sizeof *lens);
    uint8_t *special = calloc((size_t)(n > 0 ? n : 1), 1);
    grammar_vocab *v = NULL;
    if (!bytes || !lens || !special) {
        tern_err_set(err, TERN_ENOMEM, "vocab: out of memory");
        goto out;
    }
    for (int32_t i = 0; i < n; i++) {
        const char *b = NULL;
        size_t len = 0;
        /* ids with no token (holes in the vocabulary) count as special */
        if (tokenizer_token_bytes(tok, i, &b, &len) != 0 || tokenizer_is_special(tok, i)) {
            special[i] = 1;
            continue;
        }
        bytes[i] = b;
        lens[i] = len;
    }
    int32_t eos = tokenizer_eos_id(tok);
    if (!n_stop && eos >= 0) {
        stop_ids = &eos;
        n_stop = 1;
    }
    v = grammar_vocab_from_bytes(bytes, lens, special, n, mask_width, stop_ids, n_stop, err);
out:
    free(bytes);
    free(lens);
    free(special);
    return v;
}
