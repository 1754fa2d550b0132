/* Embedding models: what a sentence-transformers folder says to do with the
 * final hidden states (pooling, normalisation, a default prompt), and the
 * pooling itself. The hidden states come from the one batched forward
 * (model_forward with fwd_batch.n_hid > 0): no second model implementation.
 *
 * The folder format (sentence-transformers):
 *   modules.json        [{idx, name, path, type}], in order; type's last
 *                       dotted part names the module: Transformer (the model
 *                       in the folder itself, path ""), Pooling (path holds
 *                       config.json), Normalize. Any other module (Dense,
 *                       LayerNorm, ...) is a load error naming it.
 *   <pooling>/config.json  word_embedding_dimension and one true of
 *                       pooling_mode_cls_token | _mean_tokens | _lasttoken;
 *                       _max_tokens, _mean_sqrt_len_tokens,
 *                       _weightedmean_tokens or several modes at once are
 *                       load errors naming the mode; include_prompt.
 *   sentence_bert_config.json  max_seq_length (inputs longer are refused,
 *                       not truncated), do_lower_case (true: load error).
 *   config_sentence_transformers.json  prompts + default_prompt_name: the
 *                       default prompt is prepended to text inputs, as
 *                       SentenceTransformer.encode does without prompt_name. */
#ifndef TERN_MODEL_EMBED_H
#define TERN_MODEL_EMBED_H

#include <stdint.h>

#include "base/err.h"
#include "model/model.h"

typedef enum embed_pooling {
    EMBED_POOL_NONE = 0, /* not an embedding request / folder */
    EMBED_POOL_LAST,     /* the last token's hidden state (Qwen3-Embedding) */
    EMBED_POOL_MEAN,     /* the mean over every token */
    EMBED_POOL_CLS,      /* the first token's */
} embed_pooling;

/* "lasttoken", "mean", "cls" (or "none"). */
const char *embed_pooling_name(embed_pooling p);

typedef struct embed_config {
    embed_pooling pooling;
    int normalize;      /* a Normalize module follows the pooling: unit L2 norm */
    int dim;            /* the embedding size (= the model's hidden size) */
    int max_seq_length; /* tokens an input may have; 0 = the model's context */
    char *prompt;       /* owned; the default prompt, NULL = none */
    int include_prompt; /* Pooling's include_prompt (0 is refused when there is a prompt) */
} embed_config;

/* Reads DIR's sentence-transformers files for a model of hidden size
 * `hidden`. TERN_ENOTFOUND (c zeroed) when DIR has no modules.json: a plain
 * model, not an embedding folder. Any other error names the file and field.
 * On success c owns its prompt (embed_config_free). */
int embed_config_load(const char *dir, int hidden, embed_config *c, tern_err *err);
void embed_config_free(embed_config *c);

/* The hidden-state rows a forward hands back. */
typedef struct fwd_hidden {
    int n;
    const int32_t *rows; /* [n] indices into the batch */
    float *out;          /* [n][dim]: the final-normed hidden states */
} fwd_hidden;

/* model_forward that also writes the final-normed hidden states - the last
 * layer's output after the final norm, what lm_head reads - of the batch
 * rows hid->rows into hid->out (hid NULL or hid->n 0: model_forward). The
 * same forward, the same batch: logits rows and hidden rows may mix.
 * TERN_EUNSUPPORTED unless model_hidden_supported. */
int model_forward_hidden(tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits, const fwd_hidden *hid,
                         tern_err *err);

/* Whether m's backend can hand back hidden states: the host forward can;
 * a device-resident forward (CUDA) does not (the embedding route then
 * answers 400). */
int model_hidden_supported(const tern_model *m);
/* The hidden size (length of one hidden-state row). */
int model_hidden_dim(const tern_model *m);

/* Pooling state of one input, fed the final-normed hidden rows of its
 * positions in order (a row is `dim` floats). */
typedef struct embed_pool {
    embed_pooling mode;
    int dim, n;         /* n: positions fed so far */
    double *acc;        /* owned [dim]: the running sum (mean) or the kept row */
} embed_pool;

int embed_pool_init(embed_pool *p, embed_pooling mode, int dim);
/* Feeds the hidden row h[dim] of the next position the pooling wants
 * (embed_pool_wants), in increasing position order, across any number of
 * forward chunks. */
void embed_pool_add(embed_pool *p, const float *h);
/* Writes the pooled vector into out[dim], L2-normalised when normalize. */
void embed_pool_finish(const embed_pool *p, int normalize, float *out);
void embed_pool_free(embed_pool *p);

/* Whether the pooling needs the hidden row of position pos of an input of
 * n positions (mean: all; CLS: 0; last-token: n - 1). */
int embed_pool_wants(embed_pooling mode, int pos, int n);

/* Scales v[n] to unit L2 norm (in double; a zero vector stays zero). */
void embed_l2_normalize(float *v, int n);

#endif
