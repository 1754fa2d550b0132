/* Loading a draft model for speculative decoding (tern run and tern serve):
 * it must share the target's tokenizer, id for id, or drafts would mean
 * different text to the two models. */
#include <string.h>

#include "cli.h"

tern_model *cli_load_draft(const char *dir, const tern_tokenizer *target_tok, const model_load_opts *lo,
                          tern_err *err)
{
    tern_tokenizer *dt = tokenizer_load(dir, err);
    if (!dt) {
        tern_err_wrap(err, "draft model");
        return NULL;
    }
    int32_t n = tokenizer_vocab_size(target_tok);
    int same = tokenizer_vocab_size(dt) == n;
    for (int32_t i = 0; same && i < n; i++) {
        const char *a = tokenizer_token_str(target_tok, i), *b = tokenizer_token_str(dt, i);
        same = (!a && !b) || (a && b && !strcmp(a, b));
    }
    tokenizer_free(dt);
    if (!same) {
        tern_err_set(err, TERN_EINVAL, "the draft model %s does not share the target's tokenizer", dir);
        return NULL;
    }
    tern_model *d = model_load_ex(dir, lo, err);
    if (!d)
        tern_err_wrap(err, "draft model");
    return d;
}
