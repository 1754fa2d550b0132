/* Model loading: maps tensors to layer weights by their Hugging Face names and
 * checks every shape against config.json before anything runs. */
#include "model/model_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* An MLX-quantized weight: t is NAME.weight, uint32 words
 * [n_out][n_in * bits / 32]; ts and tb are NAME.scales and NAME.biases,
 * [n_out][n_in / group] in the model dtype. Bits and group follow from the
 * shapes; the pairs become interleaved {scale, bias} later
 * (model_weight_pairs). */
static int get_weight_quant(const char *name, const st_tensor *t, const st_tensor *ts, const st_tensor *tb,
                            int n_out, int n_in, model_weight *w, tern_err *err)
{
    if (!ts || !tb)
        return tern_err_set(err, TERN_EFORMAT, "'%s' has scales without biases or the reverse", name);
    if (t->dtype != TERN_U32 || t->n_dims != 2 || t->shape[0] != n_out)
        return tern_err_set(err, TERN_EFORMAT, "quantized tensor '%s' must be uint32 [%d, packed]", name, n_out);
    int64_t words = t->shape[1];
    int bits = words * 32 % n_in == 0 ? (int)(words * 32 / n_in) : 0;
    if (bits != 4 && bits != 8)
        return tern_err_set(err, TERN_EUNSUPPORTED, "'%s': %lld words per row for %d inputs is not 4 or 8 bits", name,
                            (long long)words, n_in);
    if (ts->n_dims != 2 || tb->n_dims != 2 || ts->shape[0] != n_out || tb->shape[0] != n_out ||
        ts->shape[1] != tb->shape[1] || ts->shape[1] < 1 || n_in % ts->shape[1])
        return tern_err_set(err, TERN_EFORMAT, "'%s': scales/biases shapes do not match the weight", name);
    int group = (int)(n_in / ts->shape[1]);
    if (group != 32 && group != 64 && group != 128)
        return tern_err_set(err, TERN_EUNSUPPORTED, "'%s': group size %d is not 32, 64 or 128", name, group);
    if ((ts->dtype != TERN_F32 && ts->dtype != TERN_BF16 && ts->dtype != TERN_F16) || tb->dtype != ts->dtype)
        return tern_err_set(err, TERN_EUNSUPPORTED, "'%s': scales must be f32, bf16 or f16", name);
    /* the pairs are made after load, as the backend needs them (model_pairs_rest) */
    w->f_scales = ts->data;
    w->f_biases = tb->data;
    w->dtype = ts->dtype;
    w->data = t->data;
    w->n_out = n_out;
    w->n_in = n_in;
    w->qbits = bits;
    w->group = group;
    return 0;
}

int model_weight_pairs(model_weight *w, int f32, int bf16, tern_err *err)
{
    if (!w->qbits || !w->f_scales)
        return 0;
    size_t ng = (size_t)w->n_out * (size_t)(w->n_in / w->group);
    if (f32 && !w->sb) {
        if (!(w->sb = malloc(ng * 2 * sizeof(float))))
            return tern_err_set(err, TERN_ENOMEM, "out of memory for a weight's scales");
        size_t es = tern_dtype_size(w->dtype);
        float s[256], b[256];
        for (size_t i0 = 0; i0 < ng; i0 += 256) { /* interleave: one cache line feeds a row's groups */
            size_t n = ng - i0 < 256 ? ng - i0 : 256;
            tern_to_f32(w->dtype, (const char *)w->f_scales + i0 * es, s, n);
            tern_to_f32(w->dtype, (const char *)w->f_biases + i0 * es, b, n);
            for (size_t i = 0; i < n; i++) {
                w->sb[2 * (i0 + i)] = s[i];
                w->sb[2 * (i0 + i) + 1] = b[i];
            }
        }
    }
    if (bf16 && !w->sb16 && w->dtype == TERN_BF16) { /* else the f32 pairs serve */
        if (!(w->sb16 = malloc(ng * 2 * sizeof(uint16_t))))
            return tern_err_set(err, TERN_ENOMEM, "out of memory for a weight's scales");
        const uint16_t *s = w->f_scales, *b = w->f_biases;
        for (size_t i = 0; i < ng; i++) {
            w->sb16[2 * i] = s[i];
            w->sb16[2 * i + 1] = b[i];
        }
    }
    return 0;
}

/* w's scales and biases in the file give their pages back (read into
 * its pairs, or into its panels). */
static void model_scales_release(const model_weight *w)
{
    if (!w->qbits || !w->f_scales)
        return;
    size_t n = (size_t)w->n_out * (size_t)(w->n_in / w->group) * tern_dtype_size(w->dtype);
    model_bytes_release(w->f_scales, n);
    model_bytes_release(w->f_biases, n);
}

/* make: w's pairs in both forms unless it is on panels (which hold
 * them); then its scales and biases in the file give their pages back. */
static int pairs_settle(model_weight *w, int make, tern_err *err)
{
    int rc = make && !w->panels ? model_weight_pairs(w, 1, 1, err) : 0;
    model_scales_release(w);
    return rc;
}

/* Every MLX affine weight not on panels gets both pair forms (the row
 * kernels', the device backends'), a tied head the embedding's - experts
 * streamed from disk when they are read; then the file's scales and biases,
 * read once, give their pages back. */
static int model_pairs_rest(tern_model *m, tern_err *err)
{
    const model_config *c = &m->cfg;
    int tied = m->lm_head.data == m->embed.data, rc;
    model_experts_stats st; /* from disk, an expert's pairs are made when a miss reads it (experts.c) */
    int disk = !model_experts_stats_get(m, &st) && st.where == MODEL_EXPERTS_DISK;
    if ((rc = pairs_settle(&m->embed, 1, err)))
        return rc;
    if (tied && !m->lm_head.panels) {
        m->lm_head.sb = m->embed.sb;
        m->lm_head.sb16 = m->embed.sb16;
    } else if (!tied && (rc = pairs_settle(&m->lm_head, 1, err))) {
        return rc;
    }
    for (int l = 0; l < c->n_layer; l++) {
        model_layer *L = &m->layers[l];
        model_weight *ws[8] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->router};
        for (int i = 0; i < 8; i++)
            if ((rc = pairs_settle(ws[i], 1, err)))
                return rc;
        for (int e = 0; L->experts && e < 3 * c->n_expert; e++)
            if ((rc = pairs_settle(&L->experts[e], !disk, err)))
                return rc;
    }
    return 0;
}

/* An FP8 E4M3 weight: t is NAME [n_out][n_in] F8_E4M3 (2-D, possibly an
 * expert's slice), ts its scale NAME_scale_inv or NAME_scale (f32, bf16 or
 * f16; the dequantized weight is e4m3 * scale), whose shape picks the
 * layout: blocks [ceil(n_out / br)][ceil(n_in / bc)] (br x bc from
 * config.json, 128 x 128 when it names none), a scale per output channel
 * ([n_out] or [n_out, 1]), or one for the tensor ([], [1] or [1, 1]). The
 * scales become an owned f32 copy (model_weight.fs). */
static int get_weight_fp8(const model_config *c, const char *name, const st_tensor *t, const st_tensor *ts, int n_out,
                          int n_in, model_weight *w, tern_err *err)
{
    if (t->n_dims != 2 || t->shape[0] != n_out || t->shape[1] != n_in)
        return tern_err_set(err, TERN_EFORMAT, "tensor '%s' has shape [%lld, %lld], expected [%d, %d]", name,
                            (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0), n_out, n_in);
    if (!ts)
        return tern_err_set(err, TERN_EFORMAT, "FP8 tensor '%s' has no scale ('%s_scale_inv' or '%s_scale')", name,
                            name, name);
    if (ts->dtype != TERN_F32 && ts->dtype != TERN_BF16 && ts->dtype != TERN_F16)
        return tern_err_set(err, TERN_EUNSUPPORTED, "the scale of FP8 tensor '%s' has dtype %s (f32, bf16 or f16)",
                            name, tern_dtype_name(ts->dtype));
    int br = c->fp8_block_rows ? c->fp8_block_rows : 128, bc = c->fp8_block_cols ? c->fp8_block_cols : 128;
    int64_t nr = (n_out + br - 1) / br, nc = (n_in + bc - 1) / bc, numel = st_numel(ts);
    if (ts->n_dims == 2 && ts->shape[0] == nr && ts->shape[1] == nc) {
        w->fs_rows = br;
        w->fs_cols = bc;
    } else if (numel == 1 && ts->n_dims <= 2) {
        w->fs_rows = n_out;
        w->fs_cols = n_in;
    } else if (ts->shape[0] == n_out && (ts->n_dims == 1 || (ts->n_dims == 2 && ts->shape[1] == 1))) {
        w->fs_rows = 1;
        w->fs_cols = n_in;
    } else {
        char shape[96] = "[";
        for (int d = 0; d < ts->n_dims; d++)
            snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "%s%lld", d ? ", " : "",
                     (long long)ts->shape[d]);
        snprintf(shape + strlen(shape), sizeof shape - strlen(shape), "]");
        return tern_err_set(err, TERN_EFORMAT,
                            "the scale of FP8 tensor '%s' has shape %s, expected [%lld, %lld] (blocks of %d x %d), "
                            "[%d, 1] or [1]",
                            name, shape, (long long)nr, (long long)nc, br, bc, n_out);
    }
    w->fs = malloc((size_t)numel * sizeof(float));
    if (!w->fs)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    tern_to_f32(ts->dtype, ts->data, w->fs, (size_t)numel);
    w->dtype = TERN_F8E4M3;
    w->data = t->data;
    w->n_out = n_out;
    w->n_in = n_in;
    return 0;
}

/* The scale tensor beside FP8 weight NAME (NAME_scale_inv, else NAME_scale), or NULL. */
static const st_tensor *fp8_scale(const st_set *st, const char *name)
{
    char sn[300];
    snprintf(sn, sizeof sn, "%s_scale_inv", name);
    const st_tensor *ts = st_find(st, sn);
    if (!ts) {
        snprintf(sn, sizeof sn, "%s_scale", name);
        ts = st_find(st, sn);
    }
    return ts;
}

/* NAME as a weight [n_out][n_in]: quantized when NAME's stem has .scales or
 * .biases beside it (get_weight_quant), else the dense tensor itself. */
static int get_weight(tern_model *m, const char *name, int n_out, int n_in, model_weight *w, tern_err *err)
{
    const st_tensor *t = st_find(&m->st, name);
    if (!t)
        return tern_err_set(err, TERN_EFORMAT, "missing tensor '%s'", name);
    memset(w, 0, sizeof *w);
    if (t->dtype == TERN_F8E4M3)
        return get_weight_fp8(&m->cfg, name, t, fp8_scale(&m->st, name), n_out, n_in, w, err);
    char stem[256], sn[272], bn[272];
    size_t len = strlen(name);
    if (len > 7 && !strcmp(name + len - 7, ".weight") && len - 7 < sizeof stem) {
        memcpy(stem, name, len - 7);
        stem[len - 7] = 0;
        snprintf(sn, sizeof sn, "%s.scales", stem);
        snprintf(bn, sizeof bn, "%s.biases", stem);
        const st_tensor *ts = st_find(&m->st, sn), *tb = st_find(&m->st, bn);
        if (ts || tb)
            return get_weight_quant(name, t, ts, tb, n_out, n_in, w, err);
    }
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
    /* Gemma stores RMSNorm gains as w and applies 1 + w (in f32, as HF). */
    if (m->cfg.norm_plus_one && strstr(name, "norm"))
        for (int i = 0; i < n; i++)
            (*out)[i] = 1.0f + (*out)[i];
    return 0;
}

/* The prefix of the decoder's tensor names: "model." in a causal-LM
 * checkpoint; none in one saved from the base model (transformers'
 * AutoModel - how sentence-transformers exports an embedding model:
 * embed_tokens.weight, layers.N..., norm.weight, no lm_head). */
static const char *name_prefix(const tern_model *m)
{
    if (!st_find(&m->st, "model.embed_tokens.weight") && st_find(&m->st, "embed_tokens.weight"))
        return "";
    return "model.";
}

/* Slice e of a 3-D tensor [n][d1][d2] as a 2-D one [d1][d2] (borrowing
 * the mapping); NULL stays NULL. */
static const st_tensor *slice3(const st_tensor *t, int n, int e, st_tensor *out)
{
    if (!t)
        return NULL;
    if (t->n_dims != 3 || t->shape[0] != n)
        return t; /* the caller's shape check names it */
    *out = *t;
    out->n_dims = 2;
    out->shape[0] = t->shape[1];
    out->shape[1] = t->shape[2];
    out->n_bytes = t->n_bytes / (size_t)n;
    out->data = (const char *)t->data + out->n_bytes * (size_t)e;
    return out;
}

/* An MXFP4 weight in MLX's mxfp4 mode (mlx-lm's gpt_oss sanitize views the
 * hub's NAME_blocks as NAME.weight uint32 [n_out][n_in / 8] - the same
 * bytes - and renames NAME_scales NAME.scales, uint8 [n_out][n_in / 32]):
 * borrowed, read as model_int.h's MXFP4 (group 32: int8 inputs; the
 * caller may change it). */
static int get_weight_mx(const char *name, const st_tensor *t, const st_tensor *ts, int n_out, int n_in,
                         model_weight *w, tern_err *err)
{
    if (n_in % 32 || t->n_dims != 2 || t->shape[0] != n_out || t->shape[1] * 8 != n_in || ts->n_dims != 2 ||
        ts->shape[0] != n_out || ts->shape[1] * 32 != n_in)
        return tern_err_set(err, TERN_EFORMAT, "MXFP4 tensor '%s' must be uint32 [%d, %d] with uint8 scales [%d, %d]",
                            name, n_out, n_in / 8, n_out, n_in / 32);
    w->dtype = TERN_U8;
    w->data = t->data;
    w->mx = ts->data;
    w->n_out = n_out;
    w->n_in = n_in;
    w->group = 32;
    return 0;
}

/* Expert e of MLX's stacked layout (mlx-lm's SwitchGLU: NAME
 * [n_expert][n_out][n_in], or uint32 [n_expert][n_out][packed] with
 * .scales / .biases [n_expert][n_out][groups]) as get_weight reads a 2-D
 * one. */
static int get_weight_stacked(tern_model *m, const char *name, int e, int n_out, int n_in, model_weight *w,
                              tern_err *err)
{
    const int E = m->cfg.n_expert;
    const st_tensor *t = st_find(&m->st, name);
    if (!t)
        return tern_err_set(err, TERN_EFORMAT, "missing tensor '%s'", name);
    if (t->n_dims != 3 || t->shape[0] != E || t->shape[1] != n_out)
        return tern_err_set(err, TERN_EFORMAT, "stacked expert tensor '%s' must be [%d, %d, ...]", name, E, n_out);
    memset(w, 0, sizeof *w);
    st_tensor t2, s2, b2;
    if (t->dtype == TERN_F8E4M3) /* the scales stacked the same way: [n_expert][...] */
        return get_weight_fp8(&m->cfg, name, slice3(t, E, e, &t2), slice3(fp8_scale(&m->st, name), E, e, &s2), n_out,
                              n_in, w, err);
    char stem[256], sn[272], bn[272];
    size_t len = strlen(name);
    if (len > 7 && len - 7 < sizeof stem) {
        memcpy(stem, name, len - 7);
        stem[len - 7] = 0;
        snprintf(sn, sizeof sn, "%s.scales", stem);
        snprintf(bn, sizeof bn, "%s.biases", stem);
        const st_tensor *ts = st_find(&m->st, sn), *tb = st_find(&m->st, bn);
        if (ts && !tb && ts->dtype == TERN_U8 && t->dtype == TERN_U32)
            return get_weight_mx(name, slice3(t, E, e, &t2), slice3(ts, E, e, &s2), n_out, n_in, w, err);
        if (ts || tb)
            return get_weight_quant(name, slice3(t, E, e, &t2), slice3(ts, E, e, &s2), slice3(tb, E, e, &b2), n_out,
                                    n_in, w, err);
    }
    if (t->shape[2] != n_in)
        return tern_err_set(err, TERN_EFORMAT, "stacked expert tensor '%s' has %lld inputs, expected %d", name,
                            (long long)t->shape[2], n_in);
    if (t->dtype != TERN_F32 && t->dtype != TERN_BF16 && t->dtype != TERN_F16)
        return tern_err_set(err, TERN_EUNSUPPORTED, "tensor '%s' has dtype %s", name, tern_dtype_name(t->dtype));
    w->dtype = t->dtype;
    w->data = slice3(t, E, e, &t2)->data;
    w->n_out = n_out;
    w->n_in = n_in;
    return 0;
}

/* A sparse layer's router and experts, by the family's names (Qwen's
 * mlp.gate / mlp.experts.N.{gate,up,down}_proj, Mixtral's
 * block_sparse_moe.gate / block_sparse_moe.experts.N.{w1,w3,w2}), or
 * stacked as MLX writes them (BLOCK.switch_mlp.{gate,up,down}_proj, expert
 * first); a missing or misshapen one is an error naming the tensor
 * (get_weight). */
static int load_experts(tern_model *m, const char *pfx, int l, tern_err *err)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    int mix = c->moe == MOE_MIXTRAL, rc;
    const char *blk = mix ? "block_sparse_moe" : "mlp";
    static const char *const qn[3] = {"gate_proj", "up_proj", "down_proj"}, *const xn[3] = {"w1", "w3", "w2"};
    char n[256];
    L->experts = calloc((size_t)c->n_expert * 3, sizeof *L->experts);
    if (!L->experts)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    snprintf(n, sizeof n, "%slayers.%d.%s.switch_mlp.gate_proj.weight", pfx, l, blk);
    const int stacked = st_find(&m->st, n) != NULL;
    for (int e = 0; e < c->n_expert && stacked; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(n, sizeof n, "%slayers.%d.%s.switch_mlp.%s.weight", pfx, l, blk, qn[k]);
            int o = k < 2 ? c->n_ff_expert : c->dim, i = k < 2 ? c->dim : c->n_ff_expert;
            if ((rc = get_weight_stacked(m, n, e, o, i, &L->experts[3 * e + k], err)))
                return rc;
        }
    for (int e = 0; e < c->n_expert && !stacked; e++)
        for (int k = 0; k < 3; k++) {
            snprintf(n, sizeof n, "%slayers.%d.%s.experts.%d.%s.weight", pfx, l, blk, e, mix ? xn[k] : qn[k]);
            int o = k < 2 ? c->n_ff_expert : c->dim, i = k < 2 ? c->dim : c->n_ff_expert;
            if ((rc = get_weight(m, n, o, i, &L->experts[3 * e + k], err)))
                return rc;
        }
    /* the router last: a count of experts the folder lacks names the first missing one */
    snprintf(n, sizeof n, "%slayers.%d.%s.gate.weight", pfx, l, blk);
    return get_weight(m, n, c->n_expert, c->dim, &L->router, err);
}

/* A small 2-D tensor [d0][d1] (gpt_oss's stacked expert biases) as an owned
 * f32 copy. */
static int get_matrix_f32(tern_model *m, const char *name, int d0, int d1, float **out, tern_err *err)
{
    const st_tensor *t = st_find(&m->st, name);
    if (!t)
        return tern_err_set(err, TERN_EFORMAT, "missing tensor '%s'", name);
    if (t->n_dims != 2 || t->shape[0] != d0 || t->shape[1] != d1)
        return tern_err_set(err, TERN_EFORMAT, "tensor '%s' has the wrong shape, expected [%d, %d]", name, d0, d1);
    if (t->dtype != TERN_F32 && t->dtype != TERN_BF16 && t->dtype != TERN_F16)
        return tern_err_set(err, TERN_EUNSUPPORTED, "tensor '%s' has dtype %s", name, tern_dtype_name(t->dtype));
    *out = malloc((size_t)d0 * d1 * sizeof(float));
    if (!*out)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    tern_to_f32(t->dtype, t->data, *out, (size_t)d0 * d1);
    return 0;
}

/* A gpt_oss stacked expert matrix NAME, E experts of n_out outputs and n_in
 * inputs each, into ws[3 * e + k]: as published, MXFP4 NAME_blocks uint8
 * [E][n_out][n_in / 32][16] + NAME_scales uint8 [E][n_out][n_in / 32]
 * (output-major: borrowed from the mapping), or plain NAME [E][n_in][n_out]
 * (input-major, transposed vs nn.Linear: each expert transposed once into an
 * owned copy of the same dtype, no f32 widening). */
static int get_experts_gpt_oss(tern_model *m, const char *name, int n_out, int n_in, int k, model_weight *ws,
                               tern_err *err)
{
    const int E = m->cfg.n_expert;
    char bn[300], sn[300];
    snprintf(bn, sizeof bn, "%s_blocks", name);
    snprintf(sn, sizeof sn, "%s_scales", name);
    const st_tensor *t = st_find(&m->st, name), *tb = st_find(&m->st, bn), *ts = st_find(&m->st, sn);
    if (!t && (tb || ts)) {
        if (!tb || !ts)
            return tern_err_set(err, TERN_EFORMAT, "missing tensor '%s' (MXFP4 experts need both %s and %s)",
                                tb ? sn : bn, bn, sn);
        if (n_in % 32)
            return tern_err_set(err, TERN_EFORMAT, "MXFP4 tensor '%s': %d inputs is not a multiple of 32", bn, n_in);
        if (tb->dtype != TERN_U8 || tb->n_dims != 4 || tb->shape[0] != E || tb->shape[1] != n_out ||
            tb->shape[2] != n_in / 32 || tb->shape[3] != 16)
            return tern_err_set(err, TERN_EFORMAT, "MXFP4 tensor '%s' must be uint8 [%d, %d, %d, 16]", bn, E, n_out,
                                n_in / 32);
        if (ts->dtype != TERN_U8 || ts->n_dims != 3 || ts->shape[0] != E || ts->shape[1] != n_out ||
            ts->shape[2] != n_in / 32)
            return tern_err_set(err, TERN_EFORMAT, "MXFP4 tensor '%s' must be uint8 [%d, %d, %d]", sn, E, n_out,
                                n_in / 32);
        for (int e = 0; e < E; e++) {
            model_weight *w = &ws[3 * e + k];
            memset(w, 0, sizeof *w);
            w->dtype = TERN_U8;
            w->data = (const uint8_t *)tb->data + (size_t)e * n_out * (n_in / 2);
            w->mx = (const uint8_t *)ts->data + (size_t)e * n_out * (n_in / 32);
            w->n_out = n_out;
            w->n_in = n_in;
            w->group = k == 0 ? 32 : 16; /* int8 gate_up inputs, int16 down inputs (model_int.h) */
        }
        return 0;
    }
    if (!t)
        return tern_err_set(err, TERN_EFORMAT, "missing tensor '%s' (or its MXFP4 %s + %s)", name, bn, sn);
    if (t->n_dims != 3 || t->shape[0] != E || t->shape[1] != n_in || t->shape[2] != n_out)
        return tern_err_set(err, TERN_EFORMAT, "stacked expert tensor '%s' must be [%d, %d, %d] (experts, inputs, outputs)",
                            name, E, n_in, n_out);
    if (t->dtype != TERN_F32 && t->dtype != TERN_BF16 && t->dtype != TERN_F16)
        return tern_err_set(err, TERN_EUNSUPPORTED, "tensor '%s' has dtype %s", name, tern_dtype_name(t->dtype));
    size_t es = tern_dtype_size(t->dtype), n = (size_t)n_out * n_in;
    for (int e = 0; e < E; e++) {
        model_weight *w = &ws[3 * e + k];
        memset(w, 0, sizeof *w);
        if (!(w->own = malloc(n * es)))
            return tern_err_set(err, TERN_ENOMEM, "out of memory for the transposed experts of '%s'", name);
        const char *src = (const char *)t->data + (size_t)e * n * es;
        char *dst = w->own;
        for (int i = 0; i < n_in; i++) /* src [n_in][n_out] -> dst [n_out][n_in] */
            for (int o = 0; o < n_out; o++)
                memcpy(dst + ((size_t)o * n_in + i) * es, src + ((size_t)i * n_out + o) * es, es);
        w->dtype = t->dtype;
        w->data = w->own;
        w->n_out = n_out;
        w->n_in = n_in;
    }
    return 0;
}

/* gpt_oss's experts in mlx-lm's layout (its gpt_oss sanitize: SwitchGLU
 * matrices, gate_up split): mlp.experts.{gate,up}_proj.weight [E][I][dim]
 * and down_proj.weight [E][dim][I], output-major - MLX-quantized (uint32
 * words + .scales / .biases, get_weight_stacked: borrowed from the mapping)
 * or in mlx-lm's mxfp4 mode (uint32 words + uint8 .scales: the hub's
 * MXFP4 bytes, get_weight_mx) or dense - with their biases
 * mlp.experts.{gate,up}_proj.bias [E][I]
 * (interleaved here into exp_b_gu, gate at 2i and up at 2i + 1, the hub's
 * order the activation reads) and down_proj.bias [E][dim]. experts[1] is
 * the up matrix (n_out set: the forward's split products). */
static int load_experts_gpt_oss_mlx(tern_model *m, const char *pfx, int l, tern_err *err)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    int E = c->n_expert, I = c->n_ff_expert, rc = 0;
    static const char *const pn[3] = {"gate_proj", "up_proj", "down_proj"};
    char n[256];
    for (int k = 0; k < 3; k++) {
        snprintf(n, sizeof n, "%slayers.%d.mlp.experts.%s.weight", pfx, l, pn[k]);
        for (int e = 0; e < E; e++)
            if ((rc = get_weight_stacked(m, n, e, k < 2 ? I : c->dim, k < 2 ? c->dim : I, &L->experts[3 * e + k], err)))
                return rc;
            else if (k == 2 && L->experts[3 * e + k].mx) /* int16 inputs for down (model_int.h) */
                L->experts[3 * e + k].group = 16;
    }
    float *half[2] = {NULL, NULL};
    for (int k = 0; k < 2 && !rc; k++) {
        snprintf(n, sizeof n, "%slayers.%d.mlp.experts.%s.bias", pfx, l, pn[k]);
        rc = get_matrix_f32(m, n, E, I, &half[k], err);
    }
    if (!rc && !(L->exp_b_gu = malloc((size_t)E * 2 * I * sizeof(float))))
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    for (size_t i = 0; !rc && i < (size_t)E * I; i++) {
        L->exp_b_gu[2 * i] = half[0][i];
        L->exp_b_gu[2 * i + 1] = half[1][i];
    }
    free(half[0]);
    free(half[1]);
    if (rc)
        return rc;
    snprintf(n, sizeof n, "%slayers.%d.mlp.experts.down_proj.bias", pfx, l);
    return get_matrix_f32(m, n, E, c->dim, &L->exp_b_down, err);
}

/* A gpt_oss sparse layer: mlp.router.{weight,bias}, the experts' gate_up
 * (2 * n_ff_expert rows, gate and up interleaved, as stored) and down
 * products (get_experts_gpt_oss), and their biases
 * mlp.experts.gate_up_proj_bias [E, 2 * n_ff_expert] and down_proj_bias
 * [E, dim]; or the experts as mlx-lm stores them (load_experts_gpt_oss_mlx:
 * what tern convert --bits writes). */
static int load_experts_gpt_oss(tern_model *m, const char *pfx, int l, tern_err *err)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    int E = c->n_expert, I = c->n_ff_expert, rc;
    char n[256];
    L->experts = calloc((size_t)E * 3, sizeof *L->experts);
    if (!L->experts)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    snprintf(n, sizeof n, "%slayers.%d.mlp.experts.gate_proj.weight", pfx, l);
    if (st_find(&m->st, n)) {
        if ((rc = load_experts_gpt_oss_mlx(m, pfx, l, err)))
            return rc;
    } else {
        snprintf(n, sizeof n, "%slayers.%d.mlp.experts.gate_up_proj", pfx, l);
        if ((rc = get_experts_gpt_oss(m, n, 2 * I, c->dim, 0, L->experts, err)))
            return rc;
        snprintf(n, sizeof n, "%slayers.%d.mlp.experts.down_proj", pfx, l);
        if ((rc = get_experts_gpt_oss(m, n, c->dim, I, 2, L->experts, err)))
            return rc;
        snprintf(n, sizeof n, "%slayers.%d.mlp.experts.gate_up_proj_bias", pfx, l);
        if ((rc = get_matrix_f32(m, n, E, 2 * I, &L->exp_b_gu, err)))
            return rc;
        snprintf(n, sizeof n, "%slayers.%d.mlp.experts.down_proj_bias", pfx, l);
        if ((rc = get_matrix_f32(m, n, E, c->dim, &L->exp_b_down, err)))
            return rc;
    }
    snprintf(n, sizeof n, "%slayers.%d.mlp.router.bias", pfx, l);
    if ((rc = get_vector(m, n, E, &L->router_b, err)))
        return rc;
    snprintf(n, sizeof n, "%slayers.%d.mlp.router.weight", pfx, l);
    return get_weight(m, n, E, c->dim, &L->router, err);
}

static int load_layer(tern_model *m, const char *pfx, int l, tern_err *err)
{
    const model_config *c = &m->cfg;
    model_layer *L = &m->layers[l];
    int qd = c->n_head * c->head_dim, kvd = c->n_kv_head * c->head_dim;
    char n[256];
    int rc;
#define W(field, suffix, o, i)                                                    \
    snprintf(n, sizeof n, "%slayers.%d.%s", pfx, l, suffix);                     \
    if ((rc = get_weight(m, n, o, i, &L->field, err)))                           \
        return rc;
#define V(field, suffix, len)                                                     \
    snprintf(n, sizeof n, "%slayers.%d.%s", pfx, l, suffix);                     \
    if ((rc = get_vector(m, n, len, &L->field, err)))                            \
        return rc;
    W(wq, "self_attn.q_proj.weight", qd, c->dim)
    W(wk, "self_attn.k_proj.weight", kvd, c->dim)
    W(wv, "self_attn.v_proj.weight", kvd, c->dim)
    W(wo, "self_attn.o_proj.weight", c->dim, qd)
    if (c->layer_moe[l]) {
        if ((rc = c->moe == MOE_GPT_OSS ? load_experts_gpt_oss(m, pfx, l, err) : load_experts(m, pfx, l, err)))
            return rc;
    } else {
        W(w_gate, "mlp.gate_proj.weight", c->n_ff, c->dim)
        W(w_up, "mlp.up_proj.weight", c->n_ff, c->dim)
        W(w_down, "mlp.down_proj.weight", c->dim, c->n_ff)
    }
    V(attn_norm, "input_layernorm.weight", c->dim)
    if (c->sandwich_norms) {
        V(post_attn_norm, "post_attention_layernorm.weight", c->dim)
        V(ffn_norm, "pre_feedforward_layernorm.weight", c->dim)
        V(post_ffn_norm, "post_feedforward_layernorm.weight", c->dim)
    } else {
        V(ffn_norm, "post_attention_layernorm.weight", c->dim)
    }
    if (c->qk_norm) {
        V(q_norm, "self_attn.q_norm.weight", c->head_dim)
        V(k_norm, "self_attn.k_norm.weight", c->head_dim)
    }
    if (c->qkv_bias) {
        V(bq, "self_attn.q_proj.bias", qd)
        V(bk, "self_attn.k_proj.bias", kvd)
        V(bv, "self_attn.v_proj.bias", kvd)
    }
    if (c->o_bias) {
        V(bo, "self_attn.o_proj.bias", c->dim)
    }
    if (c->attn_sinks) {
        V(sinks, "self_attn.sinks", c->n_head)
    }
#undef W
#undef V
    L->window = c->layer_sliding[l] ? c->sliding_window : 0;
    L->rope_inv_freq = c->layer_sliding[l] && m->rope_inv_freq_local ? m->rope_inv_freq_local : m->rope_inv_freq;
    L->rope_af = L->rope_inv_freq == m->rope_inv_freq ? c->rope_attn_factor : 1.0f;
    return 0;
}

void model_rope_freqs(const model_config *c, double theta, int scaled, float *out)
{
    int d = c->head_dim;
    for (int i = 0; i < d / 2; i++) {
        /* HF computes inv_freq in float32: 1 / theta^(2i/d). */
        double f = 1.0 / pow(theta, (double)(2 * i) / d);
        if (scaled && c->rope_scaling == ROPE_LINEAR) {
            f /= c->rope_factor;
        } else if (scaled && c->rope_scaling == ROPE_LLAMA3) {
            /* Long wavelengths slow down by factor, short ones stay, and the
             * band between blends linearly in 1/wavelength. */
            double wavelen = 2 * M_PI / f, orig = c->rope_orig_max_pos;
            double lo_wl = orig / c->rope_low_freq, hi_wl = orig / c->rope_high_freq;
            if (wavelen > lo_wl) {
                f /= c->rope_factor;
            } else if (wavelen >= hi_wl) {
                double s = (orig / wavelen - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                f = (1 - s) * f / c->rope_factor + s * f;
            }
        }
        out[i] = (float)f;
    }
    if (scaled && c->rope_scaling == ROPE_YARN) {
        /* YaRN (transformers' _compute_yarn_parameters): dims below the ramp
         * keep their frequency (they turn many times within the original
         * context), dims above it are interpolated (/ factor), linearly
         * between; the ramp's ends are the dims that turn beta_fast and
         * beta_slow times in original_max_position_embeddings. */
        double lb = 2 * log(theta), orig = c->rope_orig_max_pos;
        double lo = d * log(orig / (c->rope_beta_fast * 2 * M_PI)) / lb;
        double hi = d * log(orig / (c->rope_beta_slow * 2 * M_PI)) / lb;
        if (c->rope_truncate)
            lo = floor(lo), hi = ceil(hi);
        lo = lo > 0 ? lo : 0;
        hi = hi < d - 1 ? hi : d - 1;
        if (lo == hi)
            hi += 0.001; /* as transformers: no zero-width ramp */
        for (int i = 0; i < d / 2; i++) {
            double extra = 1.0 / pow(theta, (double)(2 * i) / d), inter = extra / c->rope_factor;
            double ramp = (i - lo) / (hi - lo), keep = 1 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
            out[i] = (float)(inter * (1 - keep) + extra * keep);
        }
    }
}

tern_model *model_load(const char *dir, int n_threads, tern_err *err)
{
    model_load_opts o = {n_threads, NULL};
    return model_load_ex(dir, &o, err);
}

tern_model *model_load_ex(const char *dir, const model_load_opts *o, tern_err *err)
{
    int n_threads = o ? o->n_threads : 0, cuda_dev = -1;
    const char *dev = o && o->device ? o->device : "cpu";
    if (!strcmp(dev, "auto"))
        cuda_dev = model_cuda_device_count() > 0 ? 0 : -1;
    else if (!strcmp(dev, "cuda"))
        cuda_dev = 0;
    else if (!strncmp(dev, "cuda:", 5) && dev[5] >= '0' && dev[5] <= '9')
        cuda_dev = atoi(dev + 5);
    else if (strcmp(dev, "cpu")) {
        tern_err_set(err, TERN_EINVAL, "unknown device '%s' (cpu, cuda, cuda:N, auto)", dev);
        return NULL;
    }
    tern_model *m = calloc(1, sizeof *m);
    if (!m) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    int rc;
    if ((rc = model_config_load(&m->cfg, dir, err)))
        goto fail;
    const model_config *c = &m->cfg;
    if (c->fp8_static_act) /* once a load, never silent: the checkpoint's activation scales go unread */
        TERN_WARN("%s: the checkpoint's static FP8 activation scales (input_scale) are not used: activations stay f32 "
                  "on the CPU and are scaled per token on the GPU",
                  dir);
    /* The CPU backend first: it checks the shape before any weight is read
     * (a device backend replaces it below, checking again for itself). */
    m->be = model_backend_cpu_new(n_threads, err);
    if (!m->be) {
        rc = err ? err->code : TERN_ENOMEM;
        goto fail;
    }
    if ((rc = model_head_dim_check(m->be, c->head_dim, err)) || (rc = st_open_dir(&m->st, dir, err)))
        goto fail;
    const char *pfx = name_prefix(m);
    char name[64];
    snprintf(name, sizeof name, "%sembed_tokens.weight", pfx);
    if ((rc = get_weight(m, name, c->n_vocab, c->dim, &m->embed, err)))
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
    snprintf(name, sizeof name, "%snorm.weight", pfx);
    if ((rc = get_vector(m, name, c->dim, &m->final_norm, err)))
        goto fail;
    /* RoPE tables first: layers point at them. */
    m->rope_inv_freq = malloc((size_t)(c->head_dim / 2) * sizeof(float));
    if (!m->rope_inv_freq) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    model_rope_freqs(c, c->rope_theta, 1, m->rope_inv_freq);
    if (c->arch == ARCH_GEMMA3) {
        m->rope_inv_freq_local = malloc((size_t)(c->head_dim / 2) * sizeof(float));
        if (!m->rope_inv_freq_local) {
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto fail;
        }
        model_rope_freqs(c, c->rope_local_theta, 0, m->rope_inv_freq_local);
    }
    m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
    if (!m->layers) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < c->n_layer; l++)
        if ((rc = load_layer(m, pfx, l, err)))
            goto fail;
    if ((rc = model_experts_init(m, err)))
        goto fail;
    if (cuda_dev < 0)
        model_backend_cpu_tiles(m->be, m);
    if ((rc = model_pairs_rest(m, err)))
        goto fail;
    if (cuda_dev >= 0) {
        model_backend *cu = model_backend_cuda_new(m, cuda_dev, err);
        if (!cu) {
            rc = err ? err->code : TERN_EUNSUPPORTED;
            goto fail;
        }
        m->be->free(m->be);
        m->be = cu;
    }
    TERN_INFO("loaded %s: %s, %d layers, dim %d, %s%s kernels, %d threads", dir, c->model_type, c->n_layer, c->dim,
              m->lm_head.qbits == 4 ? "q4 " : m->lm_head.qbits == 8 ? "q8 " : "", tern_kernels_best()->isa,
              m->be->n_threads(m->be));
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
    model_experts_free(m); /* first: it unlocks the experts' pages */
    if (m->layers)
        for (int l = 0; l < m->cfg.n_layer; l++) {
            model_layer *L = &m->layers[l];
            model_weight *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int i = 0; i < 7; i++) {
                free(ws[i]->tiles);
                free(ws[i]->panels);
                free(ws[i]->own);
                free(ws[i]->sb);
                free(ws[i]->sb16);
                free(ws[i]->fs);
            }
            free(L->router.tiles);
            free(L->router.panels);
            free(L->router.own);
            free(L->router.sb);
            free(L->router.sb16);
            free(L->router.fs);
            if (L->experts)
                for (int e = 0; e < 3 * m->cfg.n_expert; e++) {
                    free(L->experts[e].sb);
                    free(L->experts[e].sb16);
                    free(L->experts[e].fs);
                    free(L->experts[e].own);
                }
            free(L->exp_layout);
            free(L->router_b);
            free(L->exp_b_gu);
            free(L->exp_b_down);
            free(L->sinks);
            free(L->bo);
            free(L->experts);
            free(L->post_attn_norm);
            free(L->post_ffn_norm);
            free(L->attn_norm);
            free(L->ffn_norm);
            free(L->q_norm);
            free(L->k_norm);
            free(L->bq);
            free(L->bk);
            free(L->bv);
        }
    free(m->lm_head.tiles); /* its own even when tied (the embedding has none) */
    free(m->lm_head.panels);
    free(m->lm_head.own); /* a copy the embedding shares when tied */
    if (m->lm_head.data != m->embed.data) { /* else tied: the same weight */
        free(m->lm_head.sb);
        free(m->lm_head.sb16);
        free(m->lm_head.fs);
    }
    free(m->embed.sb);
    free(m->embed.sb16);
    free(m->embed.fs);
    free(m->layers);
    free(m->final_norm);
    free(m->rope_inv_freq);
    free(m->rope_inv_freq_local);
    model_scratch_free(m->scratch);
    model_lora_scratch_free(m->lora_scratch);
    if (m->be)
        m->be->free(m->be);
    st_close(&m->st);
    free(m);
}

/* ---- accessors (model.h, backend.h) ---- */

const model_config *model_config_get(const tern_model *m) { return &m->cfg; }

int model_kv_dim(const tern_model *m) { return m->cfg.n_kv_head * m->cfg.head_dim; }

kv_type model_kv_type_default(const tern_model *m) { return m->be->kv_types ? m->be->kv_default : KV_F32; }

int model_kv_spec_check(const tern_model *m, const kv_spec *s, tern_err *err)
{
    int rc = kv_spec_check(s, m->cfg.n_layer, m->cfg.head_dim, err);
    unsigned mask = m->be->kv_types ? m->be->kv_types : 1u << KV_F32;
    for (int l = 0; !rc && l < m->cfg.n_layer; l++) {
        kv_type t = kv_spec_layer_type(s, l, m->cfg.n_layer);
        kv_type ts = s->quant_start > 0 ? kv_type_sink(t) : t;
        if (!(mask & (1u << t)) || !(mask & (1u << ts)))
            rc = tern_err_set(err, TERN_EUNSUPPORTED, "the %s backend has no %s KV cache", m->be->name,
                              kv_type_name(mask & (1u << t) ? ts : t));
    }
    return rc;
}

int model_kv_pool_init(const tern_model *m, kv_pool *p, const kv_spec *s, int block_size, int n_blocks, int n_sink,
                       int host_storage, tern_err *err)
{
    int rc = s ? model_kv_spec_check(m, s, err) : 0;
    if (rc) {
        memset(p, 0, sizeof *p);
        return rc;
    }
    return kv_pool_init_spec(p, s, m->cfg.n_layer, model_kv_dim(m), m->cfg.head_dim, block_size, n_blocks, n_sink,
                             host_storage, err);
}

int model_n_threads(const tern_model *m) { return m->be->n_threads(m->be); }

const char *model_backend_name(const tern_model *m) { return m->be->name; }

model_backend *model_backend_get(const tern_model *m) { return m->be; }

model_backend *model_backend_swap(tern_model *m, model_backend *be)
{
    model_backend *old = m->be;
    m->be = be;
    return old;
}

int model_head_dim_check(const model_backend *be, int head_dim, tern_err *err)
{
    if (head_dim % 2)
        return tern_err_set(err, TERN_EFORMAT, "config.json: head_dim %d must be even for RoPE", head_dim);
    int align = be->head_dim_align > 1 ? be->head_dim_align : 1;
    if (head_dim % align || (be->head_dim_max > 0 && head_dim > be->head_dim_max))
        return tern_err_set(err, TERN_EUNSUPPORTED, "%s: head_dim %d is not a multiple of %d up to %d", be->name,
                            head_dim, align, be->head_dim_max);
    return 0;
}

/* pairs16: count the bf16 scale pairs where the weight has them (sb16, or
 * its panels, which hold them) */
static size_t wbytes_as(const model_weight *w, int pairs16)
{
    if (w->qbits)
        return (size_t)w->n_out * w->n_in * w->qbits / 8 +
               (size_t)w->n_out * (w->n_in / w->group) * 2 * (pairs16 && (w->sb16 || w->panels) ? sizeof(uint16_t) : sizeof(float));
    if (w->mx) /* half a byte a weight and a scale byte per 32 */
        return (size_t)w->n_out * (w->n_in / 2 + w->n_in / 32);
    if (w->fs) /* a byte a weight and an f32 scale a block */
        return (size_t)w->n_out * w->n_in + (size_t)((w->n_out + w->fs_rows - 1) / w->fs_rows) *
                                                (size_t)((w->n_in + w->fs_cols - 1) / w->fs_cols) * sizeof(float);
    return (size_t)w->n_out * w->n_in * tern_dtype_size(w->dtype);
}


void model_weight_row(const model_weight *w, int r, float *out)
{
    if (w->mx) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (w->n_in / 2), *e = w->mx + (size_t)r * (w->n_in / 32);
        for (int i = 0; i < w->n_in; i++)
            out[i] = (float)tern_mx_v2(q[i / 2] >> (i % 2 * 4)) * tern_mx_scale(e[i / 32]);
        return;
    }
    if (w->dtype == TERN_F8E4M3) {
        const uint8_t *q = (const uint8_t *)w->data + (size_t)r * w->n_in;
        const float *s = w->fs + (size_t)(r / w->fs_rows) * (size_t)((w->n_in + w->fs_cols - 1) / w->fs_cols);
        for (int i = 0; i < w->n_in; i++)
            out[i] = tern_f8e4m3_to_f32(q[i]) * s[i / w->fs_cols];
        return;
    }
    if (!w->qbits) {
        size_t es = tern_dtype_size(w->dtype);
        tern_to_f32(w->dtype, (const char *)w->data + (size_t)r * w->n_in * es, out, (size_t)w->n_in);
        return;
    }
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * w->n_in * w->qbits / 8;
    int ng = w->n_in / w->group;
    const float *sb = w->sb + (size_t)r * ng * 2;
    for (int i = 0; i < w->n_in; i++) {
        int v = w->qbits == 8 ? q[i] : (q[i >> 1] >> ((i & 1) * 4)) & 15;
        int g = i / w->group;
        out[i] = sb[2 * g] * (float)v + sb[2 * g + 1];
    }
}

static size_t weight_bytes(const tern_model *m, int p16)
{
    size_t n = wbytes_as(&m->lm_head, p16);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const model_layer *L = &m->layers[l];
        n += wbytes_as(&L->wq, p16) + wbytes_as(&L->wk, p16) + wbytes_as(&L->wv, p16) + wbytes_as(&L->wo, p16);
        if (L->experts) { /* the router and the experts a token runs (all are one size) */
            n += wbytes_as(&L->router, p16) + (size_t)m->cfg.n_expert_used * (wbytes_as(&L->experts[0], p16) +
                                                                              wbytes_as(&L->experts[1], p16) +
                                                                              wbytes_as(&L->experts[2], p16));
        } else {
            n += wbytes_as(&L->w_gate, p16) + wbytes_as(&L->w_up, p16) + wbytes_as(&L->w_down, p16);
        }
    }
    return n;
}

size_t model_weight_bytes(const tern_model *m) { return weight_bytes(m, 0); }
size_t model_weight_bytes_cpu(const tern_model *m) { return weight_bytes(m, 1); }
