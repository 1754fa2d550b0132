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

/* Error codes: X(name, value, message), the one table of tern's codes, their
 * names and default messages (the library itself uses it too). Every
 * fallible function returns 0 or one of these negative values. New codes are
 * appended; a value is never reused. */
#define TERN_ERRNO_MAP(X)                                            \
    X(OK, 0, "ok")                                                   \
    X(EINVAL, -1, "invalid argument")                                \
    X(ENOMEM, -2, "out of memory")                                   \
    X(EIO, -3, "input/output error")                                 \
    X(EFORMAT, -4, "malformed input")                                \
    X(EUNSUPPORTED, -5, "unsupported")                               \
    X(ERANGE, -6, "value out of range")                              \
    X(ETIMEOUT, -7, "time limit exceeded")                           \
    X(ECANCELED, -8, "canceled")                                     \
    X(EFULL, -9, "capacity exhausted")                               \
    X(ENOTFOUND, -10, "not found")                                   \
    X(EINTERNAL, -11, "internal error")

typedef enum tern_errno {
#define TERN_ERRNO_ENUM_(name, value, msg) TERN_##name = value,
    TERN_ERRNO_MAP(TERN_ERRNO_ENUM_)
#undef TERN_ERRNO_ENUM_
} tern_errno;

/* Default message of a code ("out of memory"); "unknown error" for a value
 * not in the table. Never NULL; static storage. */
const char *tern_strerror(int code);
/* Name of a code without the prefix ("ENOMEM"); "EUNKNOWN" for a value not
 * in the table. Never NULL; static storage. */
const char *tern_err_name(int code);

/* Error out-parameter: code 0 on success, a negative code and a one-line
 * message (more specific than tern_strerror's) otherwise. Every err argument
 * below may be NULL. (Same layout as the internal tern_err.) */
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

/* Loads the model, tokenizer and engine of a Hugging Face folder and starts
 * the engine thread. opts may be NULL (the defaults above). Returns a handle
 * the caller frees with tern_close, or NULL with *err: TERN_EINVAL (NULL
 * model_dir), TERN_ENOTFOUND / TERN_EIO (a file missing or unreadable),
 * TERN_EFORMAT (a malformed config, weights or tokenizer file),
 * TERN_EUNSUPPORTED (an architecture or field tern does not support),
 * TERN_ERANGE (a KV budget too small), TERN_ENOMEM. */
tern_ctx *tern_open(const char *model_dir, const tern_open_opts *opts, tern_error *err);
/* Stops the engine (waiting for generations in flight to end) and frees
 * everything t owns. tern_close(NULL) is a no-op. */
void tern_close(tern_ctx *t);

/* Token ids of the NUL-terminated text (add_special: BOS/EOS as the
 * tokenizer's post-processor says). On success *ids is malloc'd (the caller
 * frees it) and 0 is returned; otherwise TERN_EINVAL (a NULL argument),
 * TERN_ENOMEM. */
int tern_tokenize(tern_ctx *t, const char *text, int add_special, int32_t **ids, size_t *n_ids, tern_error *err);
/* Text of ids (special tokens and ids outside the vocabulary skipped, as
 * Hugging Face does); *text is malloc'd and NUL-terminated, the caller frees
 * it. Returns 0, TERN_EINVAL (a NULL argument), TERN_ENOMEM. */
int tern_detokenize(tern_ctx *t, const int32_t *ids, size_t n_ids, char **text, tern_error *err);

typedef struct tern_gen_opts {
    int max_tokens;       /* default 256 */
    float temperature;    /* default 0.8; 0 = greedy */
    float top_p;          /* default 1 */
    int top_k;            /* default 0 (off) */
    uint64_t seed;        /* default 0 */
    const char *const *stop; /* stop strings, NULL-terminated list or NULL */
} tern_gen_opts;

/* Fills *o with the defaults above. */
void tern_gen_opts_init(tern_gen_opts *o);

/* Called once per generated token with the newly completed text (possibly
 * empty while a multi-byte character or a possible stop string is pending).
 * A last call with token -1 delivers text held back until the end. Return
 * nonzero to stop generating: no further calls follow. */
typedef int (*tern_token_cb)(void *user, int32_t token, const char *text, size_t text_len);

/* Generates a continuation of prompt (encoded with special tokens); o may
 * be NULL (the defaults), cb may be NULL. Safe to call from several threads
 * on one t: their generations are batched. Blocks until done; returns 0, or
 * with *err: TERN_EINVAL (a NULL t or prompt, an empty prompt or stop
 * string), TERN_ERANGE (the prompt does not fit the context or the KV
 * budget), TERN_EFULL (the engine's queue is full), TERN_ENOMEM,
 * TERN_EINTERNAL (the engine failed mid-generation). *n_generated (may be
 * NULL) receives the number of tokens delivered to cb. */
int tern_generate(tern_ctx *t, const char *prompt, const tern_gen_opts *o, tern_token_cb cb, void *user,
                  int *n_generated, tern_error *err);

/* Embedding models (a sentence-transformers folder: modules.json, its
 * Pooling config, Normalize; see docs/embeddings.md): writes the embedding
 * of text (the folder's default prompt prepended, the tokenizer's special
 * tokens added) into out[0 .. size), size = the model's hidden size, which
 * *dim (may be NULL) receives. Safe to call from several threads on one t:
 * the inputs are batched with everything else. Blocks until done; returns
 * 0, or with *err: TERN_EINVAL (a NULL argument, an empty text),
 * TERN_EUNSUPPORTED (the folder is no embedding model, holds a setting tern
 * does not support, or the model runs on a device backend), TERN_ERANGE
 * (cap below the size, or the text longer than the context or the
 * folder's max_seq_length), TERN_EFULL, TERN_ENOMEM, TERN_EINTERNAL. */
int tern_embed(tern_ctx *t, const char *text, float *out, int cap, int *dim, tern_error *err);

#ifdef __cplusplus
}
#endif

#endif
