/* Model loading: maps tensors to layer weights by their Hugging Face names and
 * checks every shape against config.json before anything runs. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

void model_scratch_free(model_scratch *s);

static int get_weight(tern_model *m, const char *name, int n_out, int n_in, model_weight *w, tern_err *err)
{
    const st_tensor *t = st_find(&m->st, name);
    if (!t)
        return tern_err_set(err, TERN_EFORMAT, "missing tensor '%s'", name);
    if (t->n_dims != 2 || t->shape[0] != n_out || t->shape[1] != n_in)
        return tern_err_set(err, TERN_EFORMAT, "tensor '%s' has shape [%lld, %lld], expected [%d, %d]", name,
                            (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0), n_out, n_in);
    if (t->dtype != TERN_F32 && t->dtype != TERN_BF16 && t->dtype != TERN_F16)
        return tern_err_set(err, TERN_EUNSUPPORTED, "tensor '%s' has dtype %s", name, tern_dtype_name(t->dtype));
    w->dtype = t->dtype;
    w->data = t->data;
    w->n_out = n_out;
    w->n_in = n_in;
    return 0;
}

/* 1-D weights are small: keep f32 copies so kernels need one type. */
static int get_vector(tern_model *m, const char *name, int n, float **out, tern_err *err)
{
    const st_tensor *t = st_find(&m->st, name);
    if (!t)
        return tern_err_set(err, TERN_EFORMAT, "missing tensor '%s'", name);
    if (t->n_dims != 1 || t->shape[0] != n)
        return tern_err_set(err, TERN_EFORMAT, "tensor '%s' has the wrong shape, expected [%d]", name, n);
    if (t->dtype != TERN_F32 && t->dtype != TERN_BF16 && t->dtype != TERN_F16)
        return tern_err_set(err, TERN_EUNSUPPORTED, "tensor '%s' has dtype %s", name, tern_dtype_name(t->dtype));
    *out = malloc((size_t)n * sizeof(float));
    if (!*out)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    tern_to_f32(t->dtype, t->data, *out, (size_t)n);
    return 0;
}

static int load_layer(tern_model *m, int l, tern_err *err)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    int qd = c->n_head * c->head_dim, kvd = c->n_kv_head * c->head_dim;
    char n[256];
    int rc;
#define W(field, suffix, o, i)                                                    \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                      \
    if ((rc = get_weight(m, n, o, i, &L->field, err)))                           \
        return rc;
#define V(field, suffix, len)                                                     \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                      \
    if ((rc = get_vector(m, n, len, &L->field, err)))                            \
        return rc;
    W(wq, "self_attn.q_proj.weight", qd, c->dim)
    W(wk, "self_attn.k_proj.weight", kvd, c->dim)
    W(wv, "self_attn.v_proj.weight", kvd, c->dim)
    W(wo, "self_attn.o_proj.weight", c->dim, qd)
    W(w_gate, "mlp.gate_proj.weight", c->n_ff, c->dim)
    W(w_up, "mlp.up_proj.weight", c->n_ff, c->dim)
    W(w_down, "mlp.down_proj.weight", c->dim, c->n_ff)
    V(attn_norm, "input_layernorm.weight", c->dim)
    V(ffn_norm, "post_attention_layernorm.weight", c->dim)
    if (c->arch == ARCH_QWEN3) {
        V(q_norm, "self_attn.q_norm.weight", c->head_dim)
        V(k_norm, "self_attn.k_norm.weight", c->head_dim)
    }
    if (c->qkv_bias) {
        V(bq, "self_attn.q_proj.bias", qd)
        V(bk, "self_attn.k_proj.bias", kvd)
        V(bv, "self_attn.v_proj.bias", kvd)
    }
#undef W
#undef V
    return 0;
}

tern_model *model_load(const char *dir, int n_threads, tern_err *err)
{
    tern_model *m = calloc(1, sizeof *m);
    if (!m) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    int rc;
    if ((rc = model_config_load(&m->cfg, dir, err)))
        goto fail;
    if ((rc = st_open_dir(&m->st, dir, err)))
        goto fail;
    const model_config *c = &m->cfg;
    if ((rc = get_weight(m, "model.embed_tokens.weight", c->n_vocab, c->dim, &m->embed, err)))
        goto fail;
    if (st_find(&m->st, "lm_head.weight")) {
        if ((rc = get_weight(m, "lm_head.weight", c->n_vocab, c->dim, &m->lm_head, err)))
            goto fail;
    } else if (c->tie_embeddings) {
        m->lm_head = m->embed;
    } else {
        rc = tern_err_set(err, TERN_EFORMAT, "missing tensor 'lm_head.weight' (and tie_word_embeddings is false)");
        goto fail;
    }
    if ((rc = get_vector(m, "model.norm.weight", c->dim, &m->final_norm, err)))
        goto fail;
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        if ((rc = load_layer(m, l, err)))
            goto fail;
    /* HF computes inv_freq in float32: 1 / theta^(2i/d). */
    m->rope_inv_freq = malloc((size_t)(c->head_dim / 2) * sizeof(float));
    if (!m->rope_inv_freq) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < c->head_dim / 2; i++)
        m->rope_inv_freq[i] = (float)(1.0 / pow((double)c->rope_theta, (double)(2 * i) / c->head_dim));
    m->kern = tern_kernels_best();
    m->pool = tern_pool_new(n_threads);
    if (!m->pool) {
        rc = tern_err_set(err, TERN_ENOMEM, "cannot start threads");
        goto fail;
    }
    TERN_INFO("loaded %s: %s, %d layers, dim %d, %s kernels, %d threads", dir, c->model_type, c->n_layer, c->dim,
              m->kern->isa, tern_pool_size(m->pool));
    return m;
fail:
    tern_err_wrap(err, "loading %s", dir);
    model_free(m);
    return NULL;
}

void model_free(tern_model *m)
{
    if (!m)
        return;
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layer; l++) {
            model_layer *L = &m->layers[l];
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->q_norm);
            free(L->k_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
        }
    free(m->layers);
    free(m->final_norm);
    free(m->rope_inv_freq);
    model_scratch_free(m->scratch);
    tern_pool_free(m->pool);
    st_close(&m->st);
    free(m);
}

static size_t wbytes(const model_weight *w) { return (size_t)w->n_out * w->n_in * tern_dtype_size(w->dtype); }

size_t model_weight_bytes(const tern_model *m)
{
    size_t n = wbytes(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        n += wbytes(&L->wq) + wbytes(&L->wk) + wbytes(&L->wv) + wbytes(&L->wo) + wbytes(&L->w_gate) +
             wbytes(&L->w_up) + wbytes(&L->w_down);
    }
    return n;
}
