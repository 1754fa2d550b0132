/* tern convert: a Hugging Face model folder to an MLX-style affine-quantized
 * one (the layout mlx-community publishes; see model/quant.h), and/or with a
 * PEFT LoRA adapter merged into its weights (--merge-lora: each adapted
 * projection's rows become W + scale * B A in f32, PEFT's merge, stored in
 * the weight's own dtype or quantized). Every 2-D
 * ".weight" whose input size is a multiple of the group size - projections,
 * embeddings, heads, every expert of a mixture - becomes NAME.weight (uint32
 * words), NAME.scales and NAME.biases (in the tensor's own dtype); norms,
 * mixture-of-experts routers and other tensors are
 * copied. config.json gains a "quantization" block; tokenizer files and
 * generation_config.json are copied. Output streams to one safetensors
 * file, so models larger than memory convert.
 * Stacked experts are quantized too: 3-D [E][out][in] ".weight"s of MLX's
 * layouts (mlp.switch_mlp, mlp.experts) row by row, and gpt_oss's hub
 * experts - mlp.experts.gate_up_proj [E][in][2 * I] and down_proj [E][I][in]
 * (input-major, f32/bf16/f16) or their MXFP4 _blocks + _scales (decoded
 * exactly first) - written in mlx-lm's gpt_oss layout: gate_up split into
 * mlp.experts.gate_proj / up_proj (columns 2i / 2i + 1) and down_proj,
 * each NAME.weight [E][out][in * bits / 32] + .scales / .biases
 * [E][out][in / group], with the biases gate_proj.bias / up_proj.bias [E][I]
 * and down_proj.bias [E][dim] (model.c reads this layout back).
 * --fp8 instead writes every decoder projection (attention, MLP, experts;
 * not the embedding, norms, routers or lm_head) as the hub's quant_method
 * "fp8" layout: NAME.weight F8_E4M3 (round to nearest even of w / scale)
 * and NAME.weight_scale_inv f32 [ceil(out / 128)][ceil(in / 128)], scale =
 * amax(block) / 448 (1 for an all-zero block) - what transformers and vLLM
 * load. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "base/json.h"
#include "base/pool.h"
#include "cli.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/quant.h"
#include "model/safetensors.h"
#include "model/st_write.h"
#include "tensor/kernels.h"

enum { PART_COPY, PART_WORDS, PART_SCALES, PART_BIASES, PART_MERGE, PART_F8, PART_F8_SCALES, PART_COLS };

/* Where the rows of a quantized output (PART_WORDS and its scales and
 * biases) come from, the output seen as 2-D [n_rows][n_in] with n_rows =
 * E * rows (E experts of `rows` rows; E = 1 for a 2-D weight). Row i of
 * expert e is, by kind:
 * - SRC_ROWS: row e * rows + i of t ([E][rows][n_in] or 2-D, output-major);
 * - SRC_COLS: column step * i + off of expert e of t [E][n_in][ld]
 *   (gpt_oss's input-major experts; gathered a whole expert at a time into
 *   conv_ctx.xc, once per expert and output);
 * - SRC_MX: row step * i + off of expert e of MXFP4 blocks t
 *   [E][ld][n_in / 32][16] with scales mx [E][ld][n_in / 32], decoded
 *   exactly (e2m1 * 2^(scale - 127)).
 * PART_COLS copies a 2-D t [E][ld] as [E][rows] the same way (element
 * step * i + off of row e: gpt_oss's gate_up biases split). */
enum { SRC_ROWS, SRC_COLS, SRC_MX };

typedef struct conv_src {
    const st_tensor *t, *mx;
    int kind;
    int64_t n_rows, n_in, rows, ld;
    int step, off;
    tern_dtype sdtype; /* of the scales and biases written */
} conv_src;

/* --fp8: the hub's block (quant_method "fp8", weight_block_size) - the
 * layout Qwen3-*-FP8 and DeepSeek-V3 ship, which transformers and vLLM read. */
#define F8_BLOCK 128

typedef struct conv_ctx {
    const st_tensor **src; /* [n_out] source of each output tensor */
    int *part;             /* [n_out] PART_* */
    conv_src *rs;          /* [n_out] the rows of a quantized output (PART_WORDS..PART_BIASES, PART_COLS) */
    const conv_src *s;     /* the one being written */
    float *xc;             /* SRC_COLS: expert xc_e of xc_src gathered, [rows][n_in] f32 */
    size_t cap_xc;
    const conv_src *xc_src;
    int64_t xc_e;
    const model_lora *lora; /* --merge-lora: the adapter, else NULL */
    int *l_layer, *l_mod;  /* [n_out] the adapted (layer, module) of the source, l_mod -1 = none */
    int bits, group;
    int fp8;          /* --fp8: E4M3 weights with F8_BLOCK-square f32 block scales */
    tern_pool *pool;
    int64_t max_in;
    float *row_f;     /* [workers][max_in] one source row as f32 */
    uint32_t *row_w;  /* [workers][max_in] its words */
    /* scales and biases of every row of `cached` (FP8) or of the words
     * output cached_q, filled while its words are written (the three
     * outputs of a tensor come in order) */
    const st_tensor *cached;
    int cached_q;
    float *all_s, *all_b;
    size_t cap_sb;
    /* the job of one chunk of words */
    void *buf;
    int64_t first, n;
    const st_tensor *t;
    int64_t r0;
    int i; /* the output tensor being filled */
} conv_ctx;

/* Row r of c->s (conv_src) as f32 into f[n_in]: SRC_COLS rows from the
 * gathered expert in c->xc. */
static void src_row(const conv_ctx *c, int64_t r, float *f)
{
    const conv_src *s = c->s;
    int64_t e = r / s->rows, j = s->step * (r % s->rows) + s->off, n_in = s->n_in;
    if (s->kind == SRC_ROWS) {
        tern_to_f32(s->t->dtype, (const char *)s->t->data + (size_t)(r * n_in) * tern_dtype_size(s->t->dtype), f,
                    (size_t)n_in);
    } else if (s->kind == SRC_COLS) {
        memcpy(f, c->xc + (size_t)(r % s->rows) * n_in, (size_t)n_in * sizeof(float));
    } else {
        const uint8_t *q = (const uint8_t *)s->t->data + (size_t)(e * s->ld + j) * (size_t)(n_in / 2);
        const uint8_t *x = (const uint8_t *)s->mx->data + (size_t)(e * s->ld + j) * (size_t)(n_in / 32);
        for (int64_t k = 0; k < n_in; k++) /* 2 * e2m1 times 2^(scale - 128): exact */
            f[k] = (float)tern_mx_v2(q[k / 2] >> (k % 2 * 4)) * tern_mx_scale(x[k / 32]);
    }
}

/* SRC_COLS: rows [b * 16, b * 16 + 16) of expert c->xc_e gathered into
 * c->xc (16 rows of step 2 are 32 neighbouring columns: a cache line of
 * bf16 per input). */
static void gather_cols(void *vctx, long b0, long b1, int worker)
{
    (void)worker;
    conv_ctx *c = vctx;
    const conv_src *s = c->xc_src;
    size_t es = tern_dtype_size(s->t->dtype);
    const char *base = (const char *)s->t->data + (size_t)(c->xc_e * s->n_in * s->ld) * es;
    for (long b = b0; b < b1; b++) {
        int64_t i0 = (int64_t)b * 16, i1 = i0 + 16 < s->rows ? i0 + 16 : s->rows;
        for (int64_t k = 0; k < s->n_in; k++) {
            const char *row = base + (size_t)(k * s->ld) * es;
            for (int64_t i = i0; i < i1; i++) {
                const char *v = row + (size_t)(s->step * i + s->off) * es;
                float *o = c->xc + (size_t)(i * s->n_in + k);
                uint16_t h;
                if (s->t->dtype == TERN_F32) {
                    memcpy(o, v, sizeof(float));
                } else {
                    memcpy(&h, v, sizeof h);
                    *o = s->t->dtype == TERN_BF16 ? tern_bf16_to_f32(h) : tern_f16_to_f32(h);
                }
            }
        }
    }
}

/* Quantizes rows [r0, r1) of c->s: their scales and biases into the cache,
 * the words that fall inside the chunk [first, first + n) into buf. */
static void quant_rows(void *vctx, long r0, long r1, int worker)
{
    conv_ctx *c = vctx;
    const conv_src *s = c->s;
    int n_in = (int)s->n_in, ng = n_in / c->group;
    int64_t per_row = (int64_t)n_in * c->bits / 32;
    float *f = c->row_f + (size_t)worker * c->max_in;
    uint32_t *w = c->row_w + (size_t)worker * c->max_in;
    for (long r = r0; r < r1; r++) {
        src_row(c, r, f);
        if (c->lora && c->l_mod[c->i] >= 0)
            model_lora_merge_row(c->lora, c->l_layer[c->i], c->l_mod[c->i], (int)r, f);
        model_quant_row(f, n_in, c->bits, c->group, s->sdtype, w, c->all_s + (size_t)r * ng,
                        c->all_b + (size_t)r * ng);
        int64_t lo = r * per_row, hi = lo + per_row;
        if (lo < c->first)
            lo = c->first;
        if (hi > c->first + c->n)
            hi = c->first + c->n;
        if (hi > lo)
            memcpy((uint32_t *)c->buf + (lo - c->first), w + (lo - r * per_row), (size_t)(hi - lo) * sizeof(uint32_t));
    }
}

static void quant_rows_from(void *vctx, long b, long e, int worker)
{
    conv_ctx *c = vctx;
    quant_rows(vctx, (long)c->r0 + b, (long)c->r0 + e, worker);
}

/* Row r of c->t as f32 (the adapter's update added where --merge-lora adapts it). */
static void f8_row(conv_ctx *c, long r, float *f)
{
    const st_tensor *t = c->t;
    int64_t n_in = t->shape[1];
    tern_to_f32(t->dtype, (const char *)t->data + (size_t)(r * n_in) * tern_dtype_size(t->dtype), f, (size_t)n_in);
    if (c->lora && c->l_mod[c->i] >= 0)
        model_lora_merge_row(c->lora, c->l_layer[c->i], c->l_mod[c->i], (int)r, f);
}

/* The scales of block rows [b0, b1) of c->t: amax(block) / 448 (E4M3's
 * largest finite), 1 for an all-zero block, into c->all_s. */
static void f8_scale_rows(void *vctx, long b0, long b1, int worker)
{
    conv_ctx *c = vctx;
    int64_t n_in = c->t->shape[1], rows = c->t->shape[0], nc = (n_in + F8_BLOCK - 1) / F8_BLOCK;
    float *f = c->row_f + (size_t)worker * c->max_in;
    for (long b = b0; b < b1; b++) {
        float *s = c->all_s + b * nc;
        for (int64_t k = 0; k < nc; k++)
            s[k] = 0.0f;
        for (long r = b * F8_BLOCK; r < rows && r < (b + 1) * F8_BLOCK; r++) {
            f8_row(c, r, f);
            for (int64_t i = 0; i < n_in; i++)
                if (fabsf(f[i]) > s[i / F8_BLOCK])
                    s[i / F8_BLOCK] = fabsf(f[i]);
        }
        for (int64_t k = 0; k < nc; k++)
            s[k] = s[k] > 0.0f ? s[k] / 448.0f : 1.0f;
    }
}

/* Rows [c->r0 + b, c->r0 + e) of c->t as E4M3 codes of w / scale, the
 * bytes inside the chunk [first, first + n) into buf. */
static void f8_code_rows(void *vctx, long b, long e, int worker)
{
    conv_ctx *c = vctx;
    int64_t n_in = c->t->shape[1], nc = (n_in + F8_BLOCK - 1) / F8_BLOCK;
    float *f = c->row_f + (size_t)worker * c->max_in;
    for (long r = (long)c->r0 + b; r < (long)c->r0 + e; r++) {
        f8_row(c, r, f);
        const float *s = c->all_s + (r / F8_BLOCK) * nc;
        int64_t lo = r * n_in > c->first ? r * n_in : c->first;
        int64_t hi = (r + 1) * n_in < c->first + c->n ? (r + 1) * n_in : c->first + c->n;
        for (int64_t k = lo; k < hi; k++)
            ((uint8_t *)c->buf)[k - c->first] = tern_f32_to_f8e4m3(f[k - r * n_in] / s[(k - r * n_in) / F8_BLOCK]);
    }
}

/* Elements [first, first + n) of an FP8 weight (codes) or of its scales;
 * the scales of the whole tensor are computed when its codes begin (the
 * codes come first). */
static int f8_fill(conv_ctx *c, const st_tensor *t, int i, int64_t first, int64_t n, void *buf)
{
    int64_t n_in = t->shape[1], rows = t->shape[0];
    size_t nb = (size_t)((rows + F8_BLOCK - 1) / F8_BLOCK), nc = (size_t)((n_in + F8_BLOCK - 1) / F8_BLOCK);
    c->t = t;
    if (c->part[i] == PART_F8_SCALES) {
        if (c->cached != t)
            return TERN_EINVAL;
        memcpy(buf, c->all_s + first, (size_t)n * sizeof(float));
        return 0;
    }
    if (c->cached != t) {
        if (nb * nc > c->cap_sb) {
            free(c->all_s);
            c->all_s = malloc(nb * nc * sizeof(float));
            c->cap_sb = c->all_s ? nb * nc : 0;
            if (!c->all_s)
                return TERN_ENOMEM;
        }
        tern_pool_for(c->pool, (long)nb, 1, f8_scale_rows, c);
        c->cached = t;
        c->cached_q = -1;
    }
    c->buf = buf;
    c->first = first;
    c->n = n;
    c->r0 = first / n_in;
    tern_pool_for(c->pool, (long)((first + n + n_in - 1) / n_in - c->r0), 1, f8_code_rows, c);
    return 0;
}

/* Elements [first, first + n) of a merged dense weight: its rows as f32,
 * the adapter's update added, back in the weight's dtype. */
static int merge_fill(conv_ctx *c, const st_tensor *t, int i, int64_t first, int64_t n, void *buf)
{
    int64_t n_in = t->shape[1];
    size_t es = tern_dtype_size(t->dtype);
    float *f = c->row_f;
    for (int64_t r = first / n_in; r * n_in < first + n; r++) {
        tern_to_f32(t->dtype, (const char *)t->data + (size_t)(r * n_in) * es, f, (size_t)n_in);
        model_lora_merge_row(c->lora, c->l_layer[i], c->l_mod[i], (int)r, f);
        int64_t lo = r * n_in > first ? r * n_in : first, hi = (r + 1) * n_in < first + n ? (r + 1) * n_in : first + n;
        for (int64_t k = lo; k < hi; k++) {
            float v = f[k - r * n_in];
            if (t->dtype == TERN_F32)
                ((float *)buf)[k - first] = v;
            else if (t->dtype == TERN_BF16)
                ((uint16_t *)buf)[k - first] = tern_f32_to_bf16(v);
            else
                ((uint16_t *)buf)[k - first] = tern_f32_to_f16(v);
        }
    }
    return 0;
}

static int fill(void *vctx, int i, int64_t first, int64_t n, void *buf)
{
    conv_ctx *c = vctx;
    const st_tensor *t = c->src[i];
    c->i = i;
    if (c->part[i] == PART_MERGE)
        return merge_fill(c, t, i, first, n, buf);
    if (c->part[i] == PART_F8 || c->part[i] == PART_F8_SCALES)
        return f8_fill(c, t, i, first, n, buf);
    if (c->part[i] == PART_COPY) {
        size_t es = tern_dtype_size(t->dtype);
        memcpy(buf, (const char *)t->data + (size_t)first * es, (size_t)n * es);
        return 0;
    }
    if (c->part[i] == PART_COLS) {
        const conv_src *s = &c->rs[i];
        size_t es = tern_dtype_size(t->dtype);
        for (int64_t x = 0; x < n; x++) {
            int64_t e = (first + x) / s->rows, j = s->step * ((first + x) % s->rows) + s->off;
            memcpy((char *)buf + (size_t)x * es, (const char *)t->data + (size_t)(e * s->ld + j) * es, es);
        }
        return 0;
    }
    const conv_src *s = &c->rs[i];
    int64_t n_in = s->n_in, rows = s->n_rows, ng = n_in / c->group;
    if (c->part[i] == PART_WORDS) {
        if (c->cached_q != i) {
            size_t need = (size_t)rows * (size_t)ng;
            if (need > c->cap_sb || !c->all_b) {
                free(c->all_s);
                free(c->all_b);
                c->all_s = malloc(need * sizeof(float));
                c->all_b = malloc(need * sizeof(float));
                c->cap_sb = c->all_s && c->all_b ? need : 0;
                if (!c->cap_sb)
                    return TERN_ENOMEM;
            }
            c->cached = NULL;
            c->cached_q = i;
        }
        int64_t per_row = n_in * c->bits / 32;
        c->s = s;
        c->buf = buf;
        c->first = first;
        c->n = n;
        int64_t r0 = first / per_row, r1 = (first + n + per_row - 1) / per_row;
        while (r0 < r1) { /* by expert: SRC_COLS gathers each expert once */
            int64_t e = r0 / s->rows, end = (e + 1) * s->rows < r1 ? (e + 1) * s->rows : r1;
            if (s->kind == SRC_COLS && (c->xc_src != s || c->xc_e != e)) {
                size_t need = (size_t)(s->rows * n_in);
                if (need > c->cap_xc) {
                    free(c->xc);
                    c->xc = malloc(need * sizeof(float));
                    c->cap_xc = c->xc ? need : 0;
                    if (!c->xc)
                        return TERN_ENOMEM;
                }
                c->xc_src = s;
                c->xc_e = e;
                tern_pool_for(c->pool, (long)((s->rows + 15) / 16), 1, gather_cols, c);
            }
            c->r0 = r0;
            tern_pool_for(c->pool, (long)(end - r0), 1, quant_rows_from, c);
            r0 = end;
        }
        return 0;
    }
    if (c->cached_q != i - (c->part[i] - PART_WORDS)) /* the words of t come first, so this never happens */
        return TERN_EINVAL;
    const float *v = (c->part[i] == PART_SCALES ? c->all_s : c->all_b) + first;
    for (int64_t j = 0; j < n; j++) {
        if (s->sdtype == TERN_F32)
            ((float *)buf)[j] = v[j];
        else if (s->sdtype == TERN_BF16)
            ((uint16_t *)buf)[j] = tern_f32_to_bf16(v[j]);
        else
            ((uint16_t *)buf)[j] = tern_f32_to_f16(v[j]);
    }
    return 0;
}

/* Whether NAME ends in suffix. */
static int ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && !strcmp(name + n - k, suffix);
}

/* A mixture of experts' router: Qwen's mlp.gate, Mixtral's
 * block_sparse_moe.gate, gpt_oss's mlp.router. */
static int is_router(const char *name)
{
    return ends_with(name, ".mlp.gate.weight") || ends_with(name, ".block_sparse_moe.gate.weight") ||
           ends_with(name, ".mlp.router.weight");
}

/* Every 2-D weight but a mixture of experts' router, which stays in its
 * dtype: its few rows cost nothing and decide which experts run (mlx-lm
 * makes routers 8-bit; tern loads either). Nothing when bits is 0
 * (--merge-lora alone). Stacked 3-D experts: stacked_quantizable and
 * gpt_oss_expert_outputs. */
static int quantizable(const st_tensor *t, int bits, int group)
{
    size_t len = strlen(t->name);
    if (is_router(t->name))
        return 0;
    return bits && t->n_dims == 2 && len > 7 && !strcmp(t->name + len - 7, ".weight") && t->shape[1] % group == 0 &&
           (t->dtype == TERN_F32 || t->dtype == TERN_BF16 || t->dtype == TERN_F16);
}

/* --fp8: a decoder layer's 2-D projection (attention, MLP, every expert),
 * not the embedding, the norms, a router or lm_head - what transformers'
 * FP8 layout quantizes (its Linear modules bar lm_head; routers listed in
 * modules_to_not_convert). */
static int f8_convertible(const st_tensor *t)
{
    const char *l = strstr(t->name, "layers.");
    if (!l || (l != t->name && l[-1] != '.'))
        return 0;
    if (is_router(t->name))
        return 0;
    return t->n_dims == 2 && ends_with(t->name, ".weight") &&
           (t->dtype == TERN_F32 || t->dtype == TERN_BF16 || t->dtype == TERN_F16);
}

/* A float tensor (what the quantizer reads). */
static int is_float(const st_tensor *t)
{
    return t->dtype == TERN_F32 || t->dtype == TERN_BF16 || t->dtype == TERN_F16;
}

/* MLX's stacked experts, [E][out][in] ".weight" (mlp.switch_mlp, or
 * mlp.experts in mlx-lm's gpt_oss layout): quantized row by row like a 2-D
 * weight, when in is a multiple of the group. */
static int stacked_quantizable(const st_tensor *t, int bits, int group)
{
    return bits && t->n_dims == 3 && ends_with(t->name, ".weight") && is_float(t) && t->shape[2] % group == 0 &&
           (strstr(t->name, ".switch_mlp.") || strstr(t->name, ".mlp.experts."));
}

/* Appends STEM.weight, STEM.scales and STEM.biases, the rows of src
 * quantized, shaped [E][rows][...] (stacked) or [n_rows][...]. */
static void push_quant(conv_ctx *c, st_out_tensor *ts, int *n, const char *stem, const conv_src *src, int stacked,
                       int layer, int mod)
{
    static const char *const suffix[3] = {"weight", "scales", "biases"};
    for (int k = 0; k < 3; k++) {
        st_out_tensor *o = &ts[*n];
        int64_t cols = k ? src->n_in / c->group : src->n_in * c->bits / 32;
        snprintf(o->name, sizeof o->name, "%.*s.%s", (int)sizeof o->name - 8, stem, suffix[k]);
        o->dtype = k ? src->sdtype : TERN_U32;
        o->n_dims = stacked ? 3 : 2;
        o->shape[0] = stacked ? src->n_rows / src->rows : src->n_rows;
        o->shape[1] = stacked ? src->rows : cols;
        o->shape[2] = stacked ? cols : 0;
        c->src[*n] = src->t;
        c->rs[*n] = *src;
        c->l_layer[*n] = layer;
        c->l_mod[*n] = mod;
        c->part[(*n)++] = PART_WORDS + k;
    }
}

/* An output copying t (dtype, shape) under another name. */
static void push_copy(conv_ctx *c, st_out_tensor *ts, int *n, const char *name, const st_tensor *t, int part)
{
    st_out_tensor *o = &ts[*n];
    snprintf(o->name, sizeof o->name, "%.*s", (int)sizeof o->name - 1, name);
    o->dtype = t->dtype;
    o->n_dims = t->n_dims;
    memcpy(o->shape, t->shape, sizeof o->shape);
    c->src[*n] = t;
    c->l_layer[*n] = -1;
    c->l_mod[*n] = -1;
    c->part[(*n)++] = part;
}

/* gpt_oss's hub experts under --bits, in mlx-lm's layout (the top of this
 * file): t is one of a layer's mlp.experts.{gate_up_proj, down_proj} (plain
 * [E][in][out]), their MXFP4 _blocks (the _scales read with them, nothing
 * of their own) or their _bias. Returns 1 with t's outputs appended, 0 when
 * t is none of these, or a TERN_E* code (err set). */
static int gpt_oss_expert_outputs(conv_ctx *c, const st_set *st, const st_tensor *t, st_out_tensor *ts, int *n,
                                  tern_err *err)
{
    const char *at = strstr(t->name, ".mlp.experts.");
    if (!at)
        return 0;
    char pre[160], stem[200];
    const char *what = at + strlen(".mlp.experts.");
    snprintf(pre, sizeof pre, "%.*s", (int)(what - t->name), t->name);
    int gu = !strncmp(what, "gate_up_proj", 12), dn = !strncmp(what, "down_proj", 9);
    const char *rest = what + (gu ? 12 : dn ? 9 : 0);
    if (!gu && !dn)
        return 0;
    if (!strcmp(rest, "_bias")) {
        if (t->n_dims != 2 || !is_float(t) || (gu && t->shape[1] % 2))
            return tern_err_set(err, TERN_EFORMAT, "'%s' must be a float [experts, %s]", t->name,
                                gu ? "2 * intermediate" : "hidden");
        for (int k = 0; k < (gu ? 2 : 1); k++) {
            snprintf(stem, sizeof stem, "%s%s.bias", pre, !gu ? "down_proj" : k ? "up_proj" : "gate_proj");
            push_copy(c, ts, n, stem, t, gu ? PART_COLS : PART_COPY);
            if (gu) {
                st_out_tensor *o = &ts[*n - 1];
                o->shape[1] = t->shape[1] / 2;
                c->rs[*n - 1] = (conv_src){.t = t, .rows = o->shape[1], .ld = t->shape[1], .step = 2, .off = k};
            }
        }
        return 1;
    }
    if (!strcmp(rest, "_scales")) { /* read with the blocks */
        char bn[200];
        snprintf(bn, sizeof bn, "%.*s_blocks", (int)(rest - t->name), t->name);
        return st_find(st, bn) ? 1 : tern_err_set(err, TERN_EFORMAT, "MXFP4 scales '%s' without their '%s'", t->name, bn);
    }
    conv_src src = {.t = t, .step = gu ? 2 : 1};
    if (!strcmp(rest, "_blocks")) {
        char sn[200];
        snprintf(sn, sizeof sn, "%.*s_scales", (int)(rest - t->name), t->name);
        const st_tensor *x = st_find(st, sn);
        if (t->dtype != TERN_U8 || t->n_dims != 4 || t->shape[3] != 16)
            return tern_err_set(err, TERN_EFORMAT, "MXFP4 tensor '%s' must be uint8 [experts, out, in / 32, 16]",
                                t->name);
        if (!x || x->dtype != TERN_U8 || x->n_dims != 3 || x->shape[0] != t->shape[0] || x->shape[1] != t->shape[1] ||
            x->shape[2] != t->shape[2])
            return tern_err_set(err, TERN_EFORMAT, "MXFP4 tensor '%s' needs '%s' uint8 [%lld, %lld, %lld]", t->name, sn,
                                (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2]);
        src.kind = SRC_MX;
        src.mx = x;
        src.n_in = t->shape[2] * 32;
        src.ld = t->shape[1];
        src.sdtype = TERN_BF16; /* the dtype of the hub's other tensors */
    } else if (!*rest) {
        if (t->n_dims != 3 || !is_float(t))
            return tern_err_set(err, TERN_EFORMAT, "'%s' must be a float [experts, in, out]", t->name);
        src.kind = SRC_COLS;
        src.n_in = t->shape[1];
        src.ld = t->shape[2];
        src.sdtype = t->dtype;
    } else {
        return 0;
    }
    if (gu && src.ld % 2)
        return tern_err_set(err, TERN_EFORMAT, "'%s': %lld gate_up outputs is odd", t->name, (long long)src.ld);
    if (src.n_in % c->group)
        return tern_err_set(err, TERN_EINVAL, "'%s': %lld inputs is not a multiple of the group size %d (--group-size)",
                            t->name, (long long)src.n_in, c->group);
    src.rows = gu ? src.ld / 2 : src.ld;
    src.n_rows = t->shape[0] * src.rows;
    for (int k = 0; k < (gu ? 2 : 1); k++) {
        src.off = k;
        snprintf(stem, sizeof stem, "%s%s", pre, !gu ? "down_proj" : k ? "up_proj" : "gate_proj");
        push_quant(c, ts, n, stem, &src, 1, -1, -1);
    }
    return 1;
}

static int copy_if_present(const char *in, const char *out, const char *name, tern_err *err)
{
    char *s = tern_path_join(in, name), *d = tern_path_join(out, name);
    int rc = 0;
    if (!s || !d) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    } else if (tern_file_exists(s)) {
        size_t len;
        char *buf = tern_file_read(s, &len, 0, err);
        FILE *f = buf ? fopen(d, "wb") : NULL;
        if (!buf)
            rc = err->code;
        else if (!f || fwrite(buf, 1, len, f) != len)
            rc = tern_err_set(err, TERN_EIO, "cannot write %s", d);
        if (f && fclose(f) && !rc)
            rc = tern_err_set(err, TERN_EIO, "cannot write %s", d);
        free(buf);
    }
    free(s);
    free(d);
    return rc;
}

/* The adapted (layer, module) a base tensor name is, or -1: the HF names
 * model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.mlp.
 * {gate,up,down}_proj.weight (or without "model."). */
static int lora_target(const model_lora *a, const char *name, int *layer)
{
    const char *p = !strncmp(name, "model.", 6) ? name + 6 : name;
    int l, off = 0;
    if (sscanf(p, "layers.%d.%n", &l, &off) != 1 || off == 0)
        return -1;
    p += off;
    for (int k = 0; k < LORA_N_MOD; k++) {
        char want[64];
        snprintf(want, sizeof want, "%s%s.weight", k < LORA_GATE ? "self_attn." : "mlp.", model_lora_mod_name(k));
        if (!strcmp(p, want) && model_lora_has(a, l, k)) {
            *layer = l;
            return k;
        }
    }
    return -1;
}

/* The hub's quantization_config for --fp8 (transformers' "fp8" method):
 * dynamic activation scales, 128 x 128 weight blocks, lm_head and the
 * routers left alone (named in full: transformers matches these names as
 * substrings of module names, and "model.layers.N.mlp.gate" is one of no
 * expert's or projection's name in a sparse layer). */
static json_object *f8_quant_config(const st_set *st)
{
    json_object *q = json_object_new_object(), *blk = json_object_new_array(), *skip = json_object_new_array();
    json_object_object_add(q, "quant_method", json_object_new_string("fp8"));
    json_object_object_add(q, "activation_scheme", json_object_new_string("dynamic"));
    json_object_array_add(blk, json_object_new_int(F8_BLOCK));
    json_object_array_add(blk, json_object_new_int(F8_BLOCK));
    json_object_object_add(q, "weight_block_size", blk);
    json_object_array_add(skip, json_object_new_string("lm_head"));
    for (int i = 0; i < st->n_tensors; i++) {
        const char *nm = st->tensors[i].name;
        if (is_router(nm))
            json_object_array_add(skip, json_object_new_string_len(nm, (int)strlen(nm) - 7));
    }
    json_object_object_add(q, "modules_to_not_convert", skip);
    return q;
}

static int write_config(const char *in, const char *out, int bits, int group, const st_set *fp8, tern_err *err)
{
    char *s = tern_path_join(in, "config.json"), *d = tern_path_join(out, "config.json");
    json_object *o = s ? tern_json_parse_file(s, err) : NULL;
    int rc = 0;
    if (!o) {
        rc = s ? err->code : tern_err_set(err, TERN_ENOMEM, "out of memory");
    } else {
        for (int k = 0; bits && k < 2; k++) { /* mlx-lm writes both keys */
            json_object *q = json_object_new_object();
            json_object_object_add(q, "group_size", json_object_new_int(group));
            json_object_object_add(q, "bits", json_object_new_int(bits));
            json_object_object_add(o, k ? "quantization_config" : "quantization", q);
        }
        if (fp8)
            json_object_object_add(o, "quantization_config", f8_quant_config(fp8));
        if (json_object_to_file_ext(d, o, JSON_C_TO_STRING_PRETTY))
            rc = tern_err_set(err, TERN_EIO, "cannot write %s", d);
    }
    json_object_put(o);
    free(s);
    free(d);
    return rc;
}

int cmd_convert(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *lora_dir = NULL, *v;
    long long bits = 0, group = 64;
    int fp8 = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fp8")) {
            fp8 = 1;
            continue;
        }
        if ((v = cli_flag_value(argc, argv, &i, "--bits"))) {
            if (cli_parse_int(v, 4, 8, &bits) || (bits != 4 && bits != 8)) {
                fprintf(stderr, "tern convert: --bits must be 4 or 8\n");
                return 2;
            }
        } else if ((v = cli_flag_value(argc, argv, &i, "--group-size"))) {
            if (cli_parse_int(v, 32, 128, &group) || (group != 32 && group != 64 && group != 128)) {
                fprintf(stderr, "tern convert: --group-size must be 32, 64 or 128\n");
                return 2;
            }
        } else if ((v = cli_flag_value(argc, argv, &i, "--merge-lora"))) {
            lora_dir = v;
        } else if (argv[i][0] != '-' && !in) {
            in = argv[i];
        } else if (argv[i][0] != '-' && !out) {
            out = argv[i];
        } else {
            fprintf(stderr, "tern convert: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!in || !out || (!bits && !fp8 && !lora_dir)) {
        fprintf(stderr, "usage: tern convert IN_DIR OUT_DIR (--bits 4|8 [--group-size 32|64|128] | --fp8 | "
                        "--merge-lora DIR)...\n");
        return 2;
    }
    if (fp8 && bits) {
        fprintf(stderr, "tern convert: --fp8 and --bits are exclusive (one weight format)\n");
        return 2;
    }
    tern_err err = {0};
    model_config cfg;
    st_set st = {0};
    conv_ctx c = {0};
    st_out_tensor *ts = NULL;
    int rc = 1, n = 0, n_quant = 0, n_merged = 0;
    tern_model *base = NULL;
    model_lora *lora = NULL;
    char *path = NULL;
    /* Validating the config refuses families we could not run anyway. */
    if (model_config_load(&cfg, in, &err) || st_open_dir(&st, in, &err))
        goto out;
    if (cfg.quant_bits) {
        tern_err_set(&err, TERN_EINVAL, "%s is already quantized (%d bits)", in, cfg.quant_bits);
        goto out;
    }
    for (int i = 0; i < st.n_tensors; i++)
        if (cfg.fp8 || st.tensors[i].dtype == TERN_F8E4M3) {
            tern_err_set(&err, TERN_EINVAL, "%s is already quantized (FP8)", in);
            goto out;
        }
    if (lora_dir) { /* the adapter is read against the base, whose weights stay mapped */
        /* never run: loaded under exact products, so no CPU tile layout is built for it */
        int exact = tern_kernels_exact_get();
        tern_kernels_exact_set(1);
        base = model_load(in, 1, &err);
        tern_kernels_exact_set(exact);
        if (!base || !(lora = model_lora_load(base, lora_dir, &err)))
            goto out;
        c.lora = lora;
    }
    /* up to 6 outputs a tensor: gpt_oss's gate_up as gate and up, 3 each */
    ts = calloc((size_t)st.n_tensors * 6, sizeof *ts);
    c.src = calloc((size_t)st.n_tensors * 6, sizeof *c.src);
    c.part = calloc((size_t)st.n_tensors * 6, sizeof *c.part);
    c.rs = calloc((size_t)st.n_tensors * 6, sizeof *c.rs);
    c.l_layer = calloc((size_t)st.n_tensors * 6, sizeof *c.l_layer);
    c.l_mod = calloc((size_t)st.n_tensors * 6, sizeof *c.l_mod);
    c.cached_q = -1;
    int64_t max_in = 1; /* the longest row read: a 2-D weight's, a stacked expert's (either of its inner sizes) */
    for (int i = 0; i < st.n_tensors; i++)
        for (int d = 1; d < st.tensors[i].n_dims && d < 3; d++)
            if (st.tensors[i].shape[d] > max_in)
                max_in = st.tensors[i].shape[d];
    if (cfg.dim > max_in)
        max_in = cfg.dim;
    if (cfg.n_ff_expert > max_in)
        max_in = cfg.n_ff_expert;
    c.bits = (int)bits;
    c.group = (int)group;
    c.fp8 = fp8;
    c.max_in = max_in;
    c.pool = tern_pool_new(0);
    int nw = tern_pool_size(c.pool);
    c.row_f = malloc((size_t)nw * max_in * sizeof(float));
    c.row_w = malloc((size_t)nw * max_in * sizeof(uint32_t));
    if (!ts || !c.src || !c.part || !c.rs || !c.l_layer || !c.l_mod || !c.pool || !c.row_f || !c.row_w) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < st.n_tensors; i++) {
        const st_tensor *t = &st.tensors[i];
        if (strlen(t->name) + 8 > sizeof ts[0].name) {
            tern_err_set(&err, TERN_EFORMAT, "tensor name '%s' is too long", t->name);
            goto out;
        }
        int layer = -1, mod = lora ? lora_target(lora, t->name, &layer) : -1;
        n_merged += mod >= 0;
        if (fp8 && f8_convertible(t)) {
            for (int k = 0; k < 2; k++) {
                st_out_tensor *o = &ts[n];
                snprintf(o->name, sizeof o->name, "%s%s", t->name, k ? "_scale_inv" : "");
                o->dtype = k ? TERN_F32 : TERN_F8E4M3;
                o->n_dims = 2;
                o->shape[0] = k ? (t->shape[0] + F8_BLOCK - 1) / F8_BLOCK : t->shape[0];
                o->shape[1] = k ? (t->shape[1] + F8_BLOCK - 1) / F8_BLOCK : t->shape[1];
                c.src[n] = t;
                c.l_layer[n] = layer;
                c.l_mod[n] = mod;
                c.part[n++] = k ? PART_F8_SCALES : PART_F8;
            }
            n_quant++;
            continue;
        }
        if (bits && cfg.moe == MOE_GPT_OSS) {
            int before = n, got = gpt_oss_expert_outputs(&c, &st, t, ts, &n, &err);
            if (got < 0)
                goto out;
            if (got) {
                n_quant += n > before && c.part[before] == PART_WORDS;
                continue;
            }
        }
        if (stacked_quantizable(t, (int)bits, (int)group)) {
            conv_src src = {t, NULL, SRC_ROWS, t->shape[0] * t->shape[1], t->shape[2], t->shape[1], 0, 1, 0, t->dtype};
            char stem[160];
            snprintf(stem, sizeof stem, "%.*s", (int)strlen(t->name) - 7, t->name);
            push_quant(&c, ts, &n, stem, &src, 1, -1, -1);
            n_quant++;
            continue;
        }
        if (!quantizable(t, (int)bits, (int)group)) {
            st_out_tensor *o = &ts[n];
            snprintf(o->name, sizeof o->name, "%s", t->name);
            o->dtype = t->dtype;
            o->n_dims = t->n_dims;
            memcpy(o->shape, t->shape, sizeof o->shape);
            c.src[n] = t;
            c.l_layer[n] = layer;
            c.l_mod[n] = mod;
            c.part[n++] = mod >= 0 ? PART_MERGE : PART_COPY;
            continue;
        }
        conv_src src = {t, NULL, SRC_ROWS, t->shape[0], t->shape[1], t->shape[0], 0, 1, 0, t->dtype};
        char stem[160];
        snprintf(stem, sizeof stem, "%.*s", (int)strlen(t->name) - 7, t->name);
        push_quant(&c, ts, &n, stem, &src, 0, layer, mod);
        n_quant++;
    }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) {
        tern_err_set(&err, TERN_EIO, "cannot create %s: %s", out, strerror(errno));
        goto out;
    }
    path = tern_path_join(out, "model.safetensors");
    if (!path) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    const char *copies[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                            "special_tokens_map.json", "chat_template.jinja", "tokenizer.model"};
    if (st_write_file(path, ts, n, fill, &c, &err) || write_config(in, out, (int)bits, (int)group, fp8 ? &st : NULL, &err))
        goto out;
    if (lora)
        fprintf(stderr, "tern convert: merged %s into %d weights\n", lora_dir, n_merged);
    for (size_t k = 0; k < sizeof copies / sizeof copies[0]; k++)
        if (copy_if_present(in, out, copies[k], &err))
            goto out;
    if (bits)
        fprintf(stderr, "tern convert: %d of %d tensors quantized to %lld bits (group %lld) into %s\n", n_quant,
                st.n_tensors, bits, group, out);
    if (fp8)
        fprintf(stderr, "tern convert: %d of %d tensors to FP8 E4M3 (%d x %d block scales) into %s\n", n_quant,
                st.n_tensors, F8_BLOCK, F8_BLOCK, out);
    rc = 0;
out:
    if (rc)
        fprintf(stderr, "tern convert: %s\n", err.msg);
    free(path);
    free(ts);
    free(c.src);
    free(c.part);
    free(c.rs);
    free(c.xc);
    free(c.l_layer);
    free(c.l_mod);
    free(c.row_f);
    free(c.row_w);
    free(c.all_s);
    free(c.all_b);
    tern_pool_free(c.pool);
    st_close(&st);
    model_lora_release(lora);
    model_free(base);
    return rc;
}
