/* tern: embeddable C API. Load a Hugging Face model folder, tokenize, and
 * generate with a callback per token. Everything runs through the same
 * engine as `tern serve`, so several threads may generate at once and are
 * batched together.
 *
 *   tern_ctx *t = tern_open("models/tern-demo", NULL, &err);
 *   tern_gen_opts o; tern_gen_opts_init(&o); o.temperature = 0;
 *   tern_generate(t, "The old lighthouse", &o, on_token, user, &err);
 *   tern_close(t);
 */
#ifndef TERN_H
#define TERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tern_ctx tern_ctx;

/* Error out-parameter: code 0 on success, a negative code and a one-line
 * message otherwise. (Same layout as the internal tern_err.) */
typedef struct tern_error {
    int code;
    long pos;
    char msg[512];
} tern_error;

typedef struct tern_open_opts {
    int n_threads;        /* 0 = every core */
    int max_batch;        /* concurrent generations, 0 = 16 */
    double kv_budget_gb;  /* 0 = automatic */
} tern_open_opts;

/* opts may be NULL. NULL with *err filled on failure. */
tern_ctx *tern_open(const char *model_dir, const tern_open_opts *opts, tern_error *err);
void tern_close(tern_ctx *t);

/* Token ids of text (add_special: BOS/EOS as the tokenizer's post-processor
 * says). *ids is malloc'd; the caller frees it. */
int tern_tokenize(tern_ctx *t, const char *text, int add_special, int32_t **ids, size_t *n_ids, tern_error *err);
/* Text of ids; *text is malloc'd and NUL-terminated; the caller frees it. */
int tern_detokenize(tern_ctx *t, const int32_t *ids, size_t n_ids, char **text, tern_error *err);

typedef struct tern_gen_opts {
    int max_tokens;       /* default 256 */
    float temperature;    /* default 0.8; 0 = greedy */
    float top_p;          /* default 1 */
    int top_k;            /* default 0 (off) */
    uint64_t seed;        /* default 0 */
    const char *const *stop; /* stop strings, NULL-terminated list or NULL */
} tern_gen_opts;

void tern_gen_opts_init(tern_gen_opts *o);

/* Called once per generated token with the newly completed text (possibly
 * empty while a multi-byte character or a possible stop string is pending).
 * A last call with token -1 delivers text held back until the end. Return
 * nonzero to stop generating: no further calls follow. */
typedef int (*tern_token_cb)(void *user, int32_t token, const char *text, size_t text_len);

/* Generates a continuation of prompt (encoded with special tokens). Blocks
 * until done; returns 0, or a negative code with *err. *n_generated (may be
 * NULL) receives the number of tokens delivered to cb. */
int tern_generate(tern_ctx *t, const char *prompt, const tern_gen_opts *o, tern_token_cb cb, void *user,
                  int *n_generated, tern_error *err);

#ifdef __cplusplus
}
#endif

#endif
