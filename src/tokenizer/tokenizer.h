/* Hugging Face tokenizer.json (+ tokenizer_config.json) loading, encoding,
 * decoding and streaming detokenization, at HF `tokenizers` fidelity.
 * A tokenizer is immutable after loading and safe to share across threads. */
#ifndef TERN_TOKENIZER_H
#define TERN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct tern_tokenizer tern_tokenizer;

/* Loads DIR/tokenizer.json and, if present, DIR/tokenizer_config.json
 * (add_bos_token/add_eos_token, bos/eos/pad tokens, chat_template).
 * DIR may be a model folder or a tokenizer-only folder. NULL on error. */
tern_tokenizer *tokenizer_load(const char *dir, tern_err *err);
void tokenizer_free(tern_tokenizer *tok);
/* Same from tokenizer.json text in memory (len bytes, copied), with no
 * tokenizer_config.json. For tests and fuzzing. NULL on error. */
tern_tokenizer *tokenizer_load_json(const char *json, size_t len, tern_err *err);

/* Number of ids (max id + 1, added tokens included). */
int32_t tokenizer_vocab_size(const tern_tokenizer *tok);

/* Encodes len bytes of UTF-8 text. add_special = HF add_special_tokens (the
 * post-processor's BOS/EOS etc.). On success *ids_out is malloc'd (caller
 * frees) and *n_out its length. */
int tokenizer_encode(const tern_tokenizer *tok, const char *text, size_t len, int add_special,
                     int32_t **ids_out, size_t *n_out, tern_err *err);

/* Decodes ids as HF `decode` does (decoder chain applied).
 * skip_special drops special added tokens. *text_out malloc'd, NUL-terminated. */
int tokenizer_decode(const tern_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                     char **text_out, size_t *len_out, tern_err *err);

/* The bytes a single token contributes to generated text in isolation, for
 * grammar masks: byte-level tokens mapped back to bytes, <0xAB> byte-fallback
 * tokens to their byte, the metaspace '▁' to ' '. Borrowed, valid while tok
 * lives. Special tokens give their content. Returns 0, or TERN_ERANGE for an
 * id out of range. */
int tokenizer_token_bytes(const tern_tokenizer *tok, int32_t id, const char **bytes, size_t *len);
/* The vocabulary string of a token as in tokenizer.json (NULL if out of range). */
const char *tokenizer_token_str(const tern_tokenizer *tok, int32_t id);
/* Id of a vocabulary or added-token string, or -1. */
int32_t tokenizer_token_id(const tern_tokenizer *tok, const char *str);
int tokenizer_is_special(const tern_tokenizer *tok, int32_t id);

/* Special ids from tokenizer_config.json / the post-processor, -1 if none. */
int32_t tokenizer_bos_id(const tern_tokenizer *tok);
int32_t tokenizer_eos_id(const tern_tokenizer *tok);
/* tokenizer_config.json strings, NULL if absent (borrowed). */
const char *tokenizer_bos_str(const tern_tokenizer *tok);
const char *tokenizer_eos_str(const tern_tokenizer *tok);
/* The default chat template text (chat_template as a string, or the entry
 * named "default" of a list), NULL if none. Borrowed. */
const char *tokenizer_chat_template(const tern_tokenizer *tok);

/* Streaming detokenizer: feed ids one at a time, get only complete UTF-8 text.
 * Decodes "in context" so that decode(prefix) + all emitted pieces ==
 * decode(prefix + fed ids) (leading spaces and Strip decoders handled). */
typedef struct tern_detok tern_detok;
/* prefix: ids already in the sequence (the prompt), copied. */
tern_detok *detok_new(const tern_tokenizer *tok, const int32_t *prefix, size_t n_prefix, int skip_special,
                      tern_err *err);
/* Appends id; *piece (borrowed, valid until the next call) gets the newly
 * completed text (possibly empty). */
int detok_push(tern_detok *d, int32_t id, const char **piece, size_t *piece_len, tern_err *err);
/* Text still held back (an incomplete UTF-8 tail), flushed at the end. */
int detok_flush(tern_detok *d, const char **piece, size_t *piece_len, tern_err *err);
void detok_free(tern_detok *d);

#endif
