/* config.json parsing (see config.h). Unknown model types, activations and
 * RoPE scalings are rejected: silently running different math is worse than
 * not running. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"

static int get_req_int(json_object *o, const char *key, int lo, int hi, int *out, tern_err *err)
{
    int64_t v;
    int rc = tern_json_get_int(o, key, &v, "config.json", err);
    if (rc == TERN_ENOTFOUND)
        return tern_err_set(err, TERN_EFORMAT, "config.json: missing required field '%s'", key);
    if (rc)
        return rc;
    if (v < lo || v > hi)
        return tern_err_set(err, TERN_ERANGE, "config.json: '%s' = %lld is out of range [%d, %d]", key,
                            (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

static int get_opt_int(json_object *o, const char *key, int lo, int hi, int *out, tern_err *err)
{
    int64_t v;
    int rc = tern_json_get_int(o, key, &v, "config.json", err);
    if (rc == TERN_ENOTFOUND)
        return 0;
    if (rc)
        return rc;
    if (v < lo || v > hi)
        return tern_err_set(err, TERN_ERANGE, "config.json: '%s' = %lld is out of range [%d, %d]", key,
                            (long long)v, lo, hi);
    *out = (int)v;
    return 0;
}

/* eos_token_id may be an int or a list of ints. */
static int read_eos(json_object *o, const char *doc, model_config *cfg, tern_err *err)
{
    json_object *v;
    if (!json_object_object_get_ex(o, "eos_token_id", &v) || !v)
        return TERN_ENOTFOUND;
    if (json_object_is_type(v, json_type_int)) {
        cfg->n_eos = 1;
        cfg->eos_ids[0] = json_object_get_int(v);
        return 0;
    }
    if (!json_object_is_type(v, json_type_array))
        return tern_err_set(err, TERN_EFORMAT, "%s: eos_token_id must be an integer or a list", doc);
    size_t n = json_object_array_length(v);
    if (n > MODEL_MAX_EOS)
        return tern_err_set(err, TERN_ERANGE, "%s: more than %d eos ids", doc, MODEL_MAX_EOS);
    cfg->n_eos = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(v, i);
        if (!json_object_is_type(e, json_type_int))
            return tern_err_set(err, TERN_EFORMAT, "%s: eos_token_id entries must be integers", doc);
        cfg->eos_ids[cfg->n_eos++] = json_object_get_int(e);
    }
    return 0;
}

/* An optional number of a RoPE object: absent or null keep *out. */
static int rope_num(json_object *p, const char *key, double *out, tern_err *err)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(p, key, &v) || !v)
        return 0;
    return tern_json_get_num(p, key, out, "config.json", err);
}

/* YaRN (transformers' _compute_yarn_parameters): factor (absent: the ratio
 * max_position_embeddings / original_max_position_embeddings),
 * original_max_position_embeddings (absent: max_position_embeddings),
 * beta_fast / beta_slow (32 / 1 when absent, null or 0), truncate (true when
 * absent), and the attention factor that scales cos and sin: attention_factor
 * when given, else mscale(factor, mscale) / mscale(factor, mscale_all_dim)
 * when both are set, else mscale(factor) = 0.1 ln(factor) + 1 (1 for
 * factor <= 1). */
static int read_yarn(json_object *p, const char *what, model_config *cfg, tern_err *err)
{
    double f = 0, orig = cfg->max_pos, bf = 0, bs = 0, af = -1, ms = 0, msa = 0;
    int rc, trunc = 1;
    if ((rc = rope_num(p, "original_max_position_embeddings", &orig, err)) || (rc = rope_num(p, "factor", &f, err)) ||
        (rc = rope_num(p, "beta_fast", &bf, err)) || (rc = rope_num(p, "beta_slow", &bs, err)) ||
        (rc = rope_num(p, "attention_factor", &af, err)) || (rc = rope_num(p, "mscale", &ms, err)) ||
        (rc = rope_num(p, "mscale_all_dim", &msa, err)))
        return rc;
    if ((rc = tern_json_get_bool(p, "truncate", &trunc, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    if (!(orig >= 1 && orig < 1e9))
        return tern_err_set(err, TERN_ERANGE, "config.json: %s: yarn original_max_position_embeddings %g out of range",
                            what, orig);
    if (f == 0)
        f = cfg->max_pos / orig;
    if (!(f >= 1.0 && f < 1e6))
        return tern_err_set(err, TERN_ERANGE, "config.json: %s: factor %g out of range", what, f);
    bf = bf ? bf : 32, bs = bs ? bs : 1;
    if (!(bf > 0 && bs > 0 && bf < 1e6 && bs < 1e6))
        return tern_err_set(err, TERN_ERANGE, "config.json: %s: yarn beta_fast %g / beta_slow %g out of range", what,
                            bf, bs);
    if (af < 0) {
        double m1 = f <= 1 ? 1.0 : 0.1 * (ms ? ms : 1) * log(f) + 1.0, m2 = f <= 1 ? 1.0 : 0.1 * msa * log(f) + 1.0;
        af = ms && msa ? m1 / m2 : (f <= 1 ? 1.0 : 0.1 * log(f) + 1.0);
    }
    if (!(af > 0 && af < 1e3))
        return tern_err_set(err, TERN_ERANGE, "config.json: %s: yarn attention factor %g out of range", what, af);
    cfg->rope_scaling = ROPE_YARN;
    cfg->rope_factor = (float)f;
    cfg->rope_orig_max_pos = (int)orig;
    cfg->rope_beta_fast = (float)bf;
    cfg->rope_beta_slow = (float)bs;
    cfg->rope_truncate = trunc;
    cfg->rope_attn_factor = (float)af;
    return 0;
}

/* One RoPE parameter object: "rope_type"/"type" and its fields. */
static int read_rope_obj(json_object *p, const char *what, double *theta, model_config *cfg, int scaling_ok,
                         tern_err *err)
{
    const char *type = "default";
    int rc = tern_json_get_str(p, "rope_type", &type, "config.json", err);
    if (rc == TERN_ENOTFOUND)
        rc = tern_json_get_str(p, "type", &type, "config.json", err);
    if (rc && rc != TERN_ENOTFOUND)
        return rc;
    double t2;
    if (tern_json_get_num(p, "rope_theta", &t2, "config.json", err) == 0)
        *theta = t2;
    if (!strcmp(type, "default")) {
        if (scaling_ok) /* an explicit default overrides a family's (gpt_oss: yarn) */
            cfg->rope_scaling = ROPE_NONE, cfg->rope_attn_factor = 1.0f;
        return 0;
    }
    if (!scaling_ok)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s: rope type '%s' is not supported here", what,
                            type);
    double f = 0;
    if (!strcmp(type, "yarn"))
        return read_yarn(p, what, cfg, err);
    if ((rc = tern_json_get_num(p, "factor", &f, "config.json", err)))
        return rc == TERN_ENOTFOUND ? tern_err_set(err, TERN_EFORMAT, "config.json: %s: '%s' needs a factor", what, type)
                                    : rc;
    if (!(f >= 1.0 && f < 1e6))
        return tern_err_set(err, TERN_ERANGE, "config.json: %s: factor %g out of range", what, f);
    cfg->rope_factor = (float)f;
    if (!strcmp(type, "linear")) {
        cfg->rope_scaling = ROPE_LINEAR;
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        double lo = 0, hi = 0, orig = 0;
        if ((rc = tern_json_get_num(p, "low_freq_factor", &lo, "config.json", err)) ||
            (rc = tern_json_get_num(p, "high_freq_factor", &hi, "config.json", err)) ||
            (rc = tern_json_get_num(p, "original_max_position_embeddings", &orig, "config.json", err)))
            return rc == TERN_ENOTFOUND
                       ? tern_err_set(err, TERN_EFORMAT,
                                      "config.json: %s: llama3 needs low_freq_factor, high_freq_factor and "
                                      "original_max_position_embeddings", what)
                       : rc;
        if (!(lo > 0 && hi > lo && orig >= 1 && orig < 1e9))
            return tern_err_set(err, TERN_ERANGE, "config.json: %s: bad llama3 parameters", what);
        cfg->rope_scaling = ROPE_LLAMA3;
        cfg->rope_low_freq = (float)lo;
        cfg->rope_high_freq = (float)hi;
        cfg->rope_orig_max_pos = (int)orig;
        return 0;
    }
    /* dynamic, longrope, ...: different math we do not implement. */
    return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s type '%s' is not supported", what, type);
}

static int read_rope(json_object *o, model_config *cfg, tern_err *err)
{
    double theta = cfg->arch == ARCH_GEMMA3 ? 1e6 : cfg->moe == MOE_GPT_OSS ? 150000.0 : 10000.0, local = 10000.0;
    cfg->rope_attn_factor = 1.0f;
    if (cfg->moe == MOE_GPT_OSS) { /* GptOssConfig's default rope_scaling, as published */
        cfg->rope_scaling = ROPE_YARN;
        cfg->rope_factor = 32.0f;
        cfg->rope_orig_max_pos = 4096;
        cfg->rope_beta_fast = 32.0f;
        cfg->rope_beta_slow = 1.0f;
        cfg->rope_truncate = 0;
        cfg->rope_attn_factor = (float)(0.1 * log(32.0) + 1.0);
    }
    int rc = tern_json_get_num(o, "rope_theta", &theta, "config.json", err);
    if (rc && rc != TERN_ENOTFOUND)
        return rc;
    if ((rc = tern_json_get_num(o, "rope_local_base_freq", &local, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    double prf = 1.0;
    if ((rc = tern_json_get_num(o, "partial_rotary_factor", &prf, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    if (prf != 1.0)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: partial_rotary_factor %g is not supported", prf);
    /* transformers 5 keeps RoPE settings in rope_parameters (per layer type
     * for Gemma 3: full_attention / sliding_attention); older configs in
     * rope_scaling, with Gemma 3's local base in rope_local_base_freq. */
    const char *keys[] = {"rope_scaling", "rope_parameters"};
    for (int k = 0; k < 2; k++) {
        json_object *p = NULL;
        if (!json_object_object_get_ex(o, keys[k], &p) || !p)
            continue;
        if (!json_object_is_type(p, json_type_object))
            return tern_err_set(err, TERN_EFORMAT, "config.json: '%s' must be an object", keys[k]);
        json_object *full = NULL, *slide = NULL;
        json_object_object_get_ex(p, "full_attention", &full);
        json_object_object_get_ex(p, "sliding_attention", &slide);
        if (full || slide) {
            if ((full && !json_object_is_type(full, json_type_object)) ||
                (slide && !json_object_is_type(slide, json_type_object)))
                return tern_err_set(err, TERN_EFORMAT, "config.json: '%s' per-layer-type entries must be objects",
                                    keys[k]);
            if (full && (rc = read_rope_obj(full, keys[k], &theta, cfg, 1, err)))
                return rc;
            if (slide && (rc = read_rope_obj(slide, keys[k], &local, cfg, 0, err)))
                return rc;
        } else if ((rc = read_rope_obj(p, keys[k], &theta, cfg, 1, err))) {
            return rc;
        }
    }
    if (!(theta > 0) || !(local > 0))
        return tern_err_set(err, TERN_ERANGE, "config.json: rope_theta must be positive");
    cfg->rope_theta = (float)theta;
    /* Only Gemma 3 has a separate local base; elsewhere sliding layers share it. */
    cfg->rope_local_theta = cfg->arch == ARCH_GEMMA3 ? (float)local : (float)theta;
    return 0;
}

/* Optional number that may be null (null and absent both give def). */
static int get_opt_num_null(json_object *o, const char *key, double def, double *out, tern_err *err)
{
    json_object *v = NULL;
    *out = def;
    if (!json_object_object_get_ex(o, key, &v))
        return 0;
    if (!v) {
        *out = 0;
        return 0;
    }
    return tern_json_get_num(o, key, out, "config.json", err);
}

/* Which layers use the sliding window: layer_types when given, else the
 * family's pattern. */
static int read_layer_types(json_object *o, model_config *cfg, tern_err *err)
{
    json_object *lt = NULL;
    int pattern = 6;
    int rc = get_opt_int(o, "sliding_window_pattern", 1, 1 << 20, &pattern, err);
    if (rc)
        return rc;
    for (int l = 0; l < cfg->n_layer; l++)
        cfg->layer_sliding[l] = cfg->arch == ARCH_GEMMA2 || cfg->moe == MOE_GPT_OSS ? l % 2 == 0
                                : cfg->arch == ARCH_GEMMA3                      ? (l + 1) % pattern != 0
                                                                                : 1;
    if (!json_object_object_get_ex(o, "layer_types", &lt) || !lt)
        return 0;
    if (!json_object_is_type(lt, json_type_array) || (int)json_object_array_length(lt) != cfg->n_layer)
        return tern_err_set(err, TERN_EFORMAT, "config.json: layer_types must list num_hidden_layers entries");
    for (int l = 0; l < cfg->n_layer; l++) {
        const char *t = json_object_get_string(json_object_array_get_idx(lt, l));
        if (t && !strcmp(t, "full_attention"))
            cfg->layer_sliding[l] = 0;
        else if (t && !strcmp(t, "sliding_attention"))
            cfg->layer_sliding[l] = 1;
        else
            return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: layer type '%s' is not supported",
                                t ? t : "?");
    }
    return 0;
}

/* FP8 checkpoints. quant_method "fp8" is transformers' FP8 layout
 * (Qwen3-*-FP8, DeepSeek-V3): {"activation_scheme": "dynamic" | "static",
 * "fmt": "e4m3", "weight_block_size": [128, 128] (absent: a scale per
 * tensor), "modules_to_not_convert" | "ignored_layers": [...]}, scales in
 * NAME.weight_scale_inv. quant_method "compressed-tensors" is
 * llm-compressor's: {"format": "float-quantized", "config_groups": {"g":
 * {"targets": [...], "weights": {"num_bits": 8, "type": "float",
 * "strategy": "tensor" | "channel" | "block", "block_structure": [r, c],
 * "symmetric": true, ...}, "input_activations": {... "dynamic": bool} |
 * null}}, "ignore": [...]}, scales in NAME.weight_scale. The lists of
 * unconverted modules are informational: each tensor's own dtype decides.
 * Anything else that changes the math is an error naming field and value. */

/* key: absent or null (0, nothing set) or [rows, cols], cols a multiple of
 * 32 (the FP8 products' contract, kernels.h). */
static int read_fp8_block(json_object *o, const char *key, const char *where, model_config *cfg, tern_err *err)
{
    json_object *b;
    if (!json_object_object_get_ex(o, key, &b) || !b)
        return 0;
    if (!json_object_is_type(b, json_type_array) || json_object_array_length(b) != 2 ||
        !json_object_is_type(json_object_array_get_idx(b, 0), json_type_int) ||
        !json_object_is_type(json_object_array_get_idx(b, 1), json_type_int))
        return tern_err_set(err, TERN_EFORMAT, "config.json: %s%s must be a list of two integers", where, key);
    json_object *e0 = json_object_array_get_idx(b, 0), *e1 = json_object_array_get_idx(b, 1);
    int64_t r = json_object_get_int64(e0), c = json_object_get_int64(e1);
    if (r < 1 || r > 65536 || c < 32 || c > 65536 || c % 32)
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "config.json: %s%s = [%lld, %lld] is not supported (columns a multiple of 32)", where, key,
                            (long long)r, (long long)c);
    if (cfg->fp8_block_rows && (cfg->fp8_block_rows != r || cfg->fp8_block_cols != c))
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s%s = [%lld, %lld] differs from another group's",
                            where, key, (long long)r, (long long)c);
    cfg->fp8_block_rows = (int)r;
    cfg->fp8_block_cols = (int)c;
    return 0;
}

static int read_quant_fp8(json_object *qc, model_config *cfg, tern_err *err)
{
    const char *act = "dynamic", *fmt = "e4m3";
    int rc;
    if ((rc = tern_json_get_str(qc, "activation_scheme", &act, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    if (strcmp(act, "dynamic") && strcmp(act, "static"))
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "config.json: quantization_config.activation_scheme = '%s' is not supported", act);
    if ((rc = tern_json_get_str(qc, "fmt", &fmt, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    if (strcmp(fmt, "e4m3"))
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: quantization_config.fmt = '%s' is not supported (e4m3)",
                            fmt);
    cfg->fp8 = 1;
    cfg->fp8_static_act = !strcmp(act, "static");
    return read_fp8_block(qc, "weight_block_size", "quantization_config.", cfg, err);
}

/* A compressed-tensors quantization args object (weights or input
 * activations): 8-bit symmetric float. */
static int read_ct_args(json_object *a, const char *where, tern_err *err)
{
    int64_t bits = 0;
    const char *type = NULL;
    int rc, sym = 1;
    if (!json_object_is_type(a, json_type_object))
        return tern_err_set(err, TERN_EFORMAT, "config.json: %s must be an object", where);
    if ((rc = tern_json_get_int(a, "num_bits", &bits, "config.json", err)) ||
        (rc = tern_json_get_str(a, "type", &type, "config.json", err)))
        return rc == TERN_ENOTFOUND ? tern_err_set(err, TERN_EFORMAT, "config.json: %s needs num_bits and type", where)
                                    : rc;
    if (strcmp(type, "float"))
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s.type = '%s' is not supported (float)", where, type);
    if (bits != 8)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s.num_bits = %lld is not supported (8)", where,
                            (long long)bits);
    if ((rc = tern_json_get_bool(a, "symmetric", &sym, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    if (!sym)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s.symmetric = false is not supported", where);
    return 0;
}

static int read_ct_group(json_object *g, const char *name, model_config *cfg, tern_err *err)
{
    char where[160];
    json_object *w = NULL, *a = NULL, *o = NULL;
    const char *strat = NULL;
    int rc;
    if (!json_object_is_type(g, json_type_object))
        return tern_err_set(err, TERN_EFORMAT, "config.json: config_groups.%s must be an object", name);
    snprintf(where, sizeof where, "config_groups.%s.weights", name);
    if (!json_object_object_get_ex(g, "weights", &w) || !w)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s is missing (weight-only formats only)", where);
    if ((rc = read_ct_args(w, where, err)))
        return rc;
    if ((rc = tern_json_get_str(w, "strategy", &strat, "config.json", err)))
        return rc == TERN_ENOTFOUND ? tern_err_set(err, TERN_EFORMAT, "config.json: %s.strategy is missing", where)
                                    : rc;
    if (!strcmp(strat, "block")) {
        if (!json_object_object_get_ex(w, "block_structure", &o) || !o)
            return tern_err_set(err, TERN_EFORMAT, "config.json: %s.strategy 'block' needs block_structure", where);
        char wd[168];
        snprintf(wd, sizeof wd, "%s.", where);
        if ((rc = read_fp8_block(w, "block_structure", wd, cfg, err)))
            return rc;
    } else if (strcmp(strat, "tensor") && strcmp(strat, "channel")) {
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "config.json: %s.strategy = '%s' is not supported (tensor, channel or block)", where, strat);
    }
    /* grouped or reordered weights (GPTQ-style) are other layouts */
    if (json_object_object_get_ex(w, "group_size", &o) && o)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s.group_size = %s is not supported", where,
                            json_object_to_json_string(o));
    if (json_object_object_get_ex(w, "actorder", &o) && o &&
        !(json_object_is_type(o, json_type_boolean) && !json_object_get_boolean(o)))
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s.actorder = %s is not supported", where,
                            json_object_to_json_string(o));
    snprintf(where, sizeof where, "config_groups.%s.input_activations", name);
    if (json_object_object_get_ex(g, "input_activations", &a) && a) {
        int dyn = 0;
        if ((rc = read_ct_args(a, where, err)))
            return rc;
        if ((rc = tern_json_get_bool(a, "dynamic", &dyn, "config.json", err)) && rc != TERN_ENOTFOUND)
            return rc;
        if (!dyn)
            cfg->fp8_static_act = 1;
    }
    if (json_object_object_get_ex(g, "output_activations", &o) && o)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: config_groups.%s.output_activations is not supported",
                            name);
    return 0;
}

static int read_quant_ct(json_object *qc, model_config *cfg, tern_err *err)
{
    const char *fmt = NULL;
    json_object *v, *groups = NULL;
    int rc;
    if ((rc = tern_json_get_str(qc, "format", &fmt, "config.json", err)))
        return rc == TERN_ENOTFOUND
                   ? tern_err_set(err, TERN_EFORMAT, "config.json: compressed-tensors quantization_config.format is missing")
                   : rc;
    if (strcmp(fmt, "float-quantized") && strcmp(fmt, "naive-quantized"))
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "config.json: quantization_config.format = '%s' is not supported (float-quantized)", fmt);
    if (json_object_object_get_ex(qc, "sparsity_config", &v) && v &&
        !(json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0)) {
        const char *sf = NULL;
        if (!json_object_is_type(v, json_type_object) ||
            tern_json_get_str(v, "format", &sf, "config.json", err) || strcmp(sf, "dense"))
            return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: quantization_config.sparsity_config = %s is not supported",
                                json_object_to_json_string(v));
    }
    if (json_object_object_get_ex(qc, "transform_config", &v) && v)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: quantization_config.transform_config is not supported");
    if (!json_object_object_get_ex(qc, "config_groups", &groups) || !groups ||
        !json_object_is_type(groups, json_type_object) || json_object_object_length(groups) == 0)
        return tern_err_set(err, TERN_EFORMAT, "config.json: quantization_config.config_groups must be a non-empty object");
    json_object_object_foreach(groups, name, g) {
        if ((rc = read_ct_group(g, name, cfg, err)))
            return rc;
    }
    cfg->fp8 = 1;
    return 0;
}

/* quantization_config's FP8 methods (above), or MLX affine quantization
 * ("quantization": {"group_size", "bits"}, which mlx-lm also writes as
 * quantization_config without a quant_method); any other scheme is
 * refused. */
static int read_quant(json_object *o, model_config *cfg, tern_err *err)
{
    json_object *q = NULL, *qc = NULL;
    int rc;
    if (json_object_object_get_ex(o, "quantization_config", &qc) && qc) {
        const char *meth = NULL;
        if (!json_object_is_type(qc, json_type_object))
            return tern_err_set(err, TERN_EFORMAT, "config.json: 'quantization_config' must be an object");
        if ((rc = tern_json_get_str(qc, "quant_method", &meth, "config.json", err)) == 0) {
            if (!strcmp(meth, "fp8"))
                return read_quant_fp8(qc, cfg, err);
            if (!strcmp(meth, "compressed-tensors"))
                return read_quant_ct(qc, cfg, err);
            if (!strcmp(meth, "mxfp4")) { /* the experts' NAME_blocks + NAME_scales (model.c); the rest as stored */
                if (cfg->moe != MOE_GPT_OSS)
                    return tern_err_set(err, TERN_EUNSUPPORTED,
                                        "config.json: quantization method 'mxfp4' is supported for gpt_oss experts only");
                cfg->mxfp4 = 1;
                return 0;
            }
            return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: quantization method '%s' is not supported", meth);
        }
    }
    if (!json_object_object_get_ex(o, "quantization", &q) || !q)
        q = qc;
    if (!q)
        return 0;
    if (!json_object_is_type(q, json_type_object))
        return tern_err_set(err, TERN_EFORMAT, "config.json: 'quantization' must be an object");
    const char *mode = "affine";
    if ((rc = tern_json_get_str(q, "mode", &mode, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    /* mlx-lm's mxfp4 mode: gpt_oss's experts as the hub's MXFP4 bytes in
     * its SwitchGLU layout (model.c); other modules by their own shapes */
    int mx = !strcmp(mode, "mxfp4") && cfg->moe == MOE_GPT_OSS;
    if (strcmp(mode, "affine") && !mx)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: quantization mode '%s' is not supported%s", mode,
                            strcmp(mode, "mxfp4") ? "" : " (mxfp4: gpt_oss experts only)");
    cfg->mxfp4 = mx;
    if ((rc = get_req_int(q, "bits", 1, 32, &cfg->quant_bits, err)) ||
        (rc = get_req_int(q, "group_size", 1, 1 << 20, &cfg->quant_group, err)))
        return rc;
    if (mx && (cfg->quant_bits != 4 || cfg->quant_group != 32))
        return tern_err_set(err, TERN_EFORMAT, "config.json: mxfp4 quantization must be 4 bits in groups of 32");
    if (cfg->quant_bits != 4 && cfg->quant_bits != 8)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %d-bit quantization is not supported (4 or 8)",
                            cfg->quant_bits);
    if (cfg->quant_group != 32 && cfg->quant_group != 64 && cfg->quant_group != 128)
        return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: quantization group_size %d is not supported",
                            cfg->quant_group);
    return 0;
}

/* Fields of MoE variants we do not run: present with a value that changes
 * the math, they are a load error naming the field. */
static int moe_reject_variants(json_object *o, tern_err *err)
{
    static const struct {
        const char *key, *what;
        double neutral;
    } unsup[] = {
        {"shared_expert_intermediate_size", "shared experts", 0},
        {"n_shared_experts", "shared experts", 0},
        {"num_shared_experts", "shared experts", 0},
        {"moe_shared_expert_intermediate_size", "shared experts", 0},
        {"n_group", "group-limited routing", 1},
        {"topk_group", "group-limited routing", 1},
        {"routed_scaling_factor", "scaled routing weights", 1},
        {"first_k_dense_replace", "leading dense layers", 0},
        {"moe_layer_freq", "an MoE layer frequency", 1},
    };
    for (size_t i = 0; i < sizeof unsup / sizeof unsup[0]; i++) {
        double v;
        int rc = tern_json_get_num(o, unsup[i].key, &v, "config.json", err);
        if (rc == TERN_ENOTFOUND)
            continue;
        if (rc)
            return rc;
        if (v != unsup[i].neutral)
            return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: '%s' = %g: %s are not supported",
                                unsup[i].key, v, unsup[i].what);
    }
    static const struct {
        const char *key, *ok;
    } modes[] = {{"topk_method", "greedy"}, {"scoring_func", "softmax"}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        const char *v = NULL;
        int rc = tern_json_get_str(o, modes[i].key, &v, "config.json", err);
        if (rc == TERN_ENOTFOUND)
            continue;
        if (rc)
            return rc;
        if (strcmp(v, modes[i].ok))
            return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: '%s' = '%s' is not supported (only '%s')",
                                modes[i].key, v, modes[i].ok);
    }
    return 0;
}

/* The mixture-of-experts fields of qwen3_moe and mixtral (transformers'
 * defaults where a field is absent), and which layers are sparse: Qwen's
 * layer l is when it is not in mlp_only_layers and (l + 1) is a multiple
 * of decoder_sparse_step; every Mixtral layer is. */
/* gpt_oss: num_local_experts, num_experts_per_tok (the published config
 * also writes experts_per_token: either, equal when both), the experts as
 * wide as intermediate_size, swiglu_limit; every layer sparse. */
static int read_moe_gpt_oss(json_object *o, model_config *cfg, tern_err *err)
{
    int rc, k1 = 0, k2 = 0;
    double lim = 7.0;
    cfg->n_expert = 128;
    if ((rc = get_opt_int(o, "num_local_experts", 1, 1 << 16, &cfg->n_expert, err)) ||
        (rc = get_opt_int(o, "num_experts_per_tok", 1, cfg->n_expert, &k1, err)) ||
        (rc = get_opt_int(o, "experts_per_token", 1, cfg->n_expert, &k2, err)) || (rc = moe_reject_variants(o, err)))
        return rc;
    if (k1 && k2 && k1 != k2)
        return tern_err_set(err, TERN_EFORMAT, "config.json: num_experts_per_tok %d and experts_per_token %d differ", k1,
                            k2);
    cfg->n_expert_used = k1 ? k1 : k2 ? k2 : 4;
    if (cfg->n_expert_used > cfg->n_expert)
        return tern_err_set(err, TERN_ERANGE, "config.json: %d experts per token is more than the %d experts",
                            cfg->n_expert_used, cfg->n_expert);
    cfg->n_ff_expert = cfg->n_ff;
    if ((rc = tern_json_get_num(o, "swiglu_limit", &lim, "config.json", err)) && rc != TERN_ENOTFOUND)
        return rc;
    if (!(lim > 0 && lim < 1e30))
        return tern_err_set(err, TERN_ERANGE, "config.json: swiglu_limit %g must be positive", lim);
    cfg->swiglu_limit = (float)lim;
    cfg->swiglu_alpha = 1.702f; /* transformers' GptOssExperts.alpha (not a config field) */
    for (int l = 0; l < cfg->n_layer; l++)
        cfg->layer_moe[l] = 1;
    return 0;
}

static int read_moe(json_object *o, model_config *cfg, tern_err *err)
{
    if (cfg->moe == MOE_GPT_OSS)
        return read_moe_gpt_oss(o, cfg, err);
    int qwen = cfg->moe == MOE_QWEN3, rc;
    int step = 1;
    cfg->n_expert = qwen ? 128 : 8;
    cfg->n_expert_used = qwen ? 8 : 2;
    cfg->n_ff_expert = qwen ? 768 : cfg->n_ff;
    /* num_experts on the hub, num_local_experts from transformers 5 (and Mixtral) */
    if ((rc = get_opt_int(o, "num_experts", 1, 1 << 16, &cfg->n_expert, err)) ||
        (rc = get_opt_int(o, "num_local_experts", 1, 1 << 16, &cfg->n_expert, err)) ||
        (rc = get_opt_int(o, "num_experts_per_tok", 1, cfg->n_expert, &cfg->n_expert_used, err)) ||
        (qwen && (rc = get_opt_int(o, "moe_intermediate_size", 1, 1 << 20, &cfg->n_ff_expert, err))) ||
        (qwen && (rc = get_opt_int(o, "decoder_sparse_step", 1, 1 << 20, &step, err))) ||
        (rc = moe_reject_variants(o, err)))
        return rc;
    if (cfg->n_expert_used > cfg->n_expert)
        return tern_err_set(err, TERN_ERANGE, "config.json: num_experts_per_tok %d is more than the %d experts",
                            cfg->n_expert_used, cfg->n_expert);
    cfg->norm_topk = 1; /* Mixtral renormalizes its top-k */
    if (qwen) {
        cfg->norm_topk = 0;
        if ((rc = tern_json_get_bool(o, "norm_topk_prob", &cfg->norm_topk, "config.json", err)) &&
            rc != TERN_ENOTFOUND)
            return rc;
    }
    for (int l = 0; l < cfg->n_layer; l++)
        cfg->layer_moe[l] = !qwen || (l + 1) % step == 0;
    json_object *mo = NULL;
    if (qwen && json_object_object_get_ex(o, "mlp_only_layers", &mo) && mo) {
        if (!json_object_is_type(mo, json_type_array))
            return tern_err_set(err, TERN_EFORMAT, "config.json: 'mlp_only_layers' must be a list of layer indices");
        for (size_t i = 0; i < json_object_array_length(mo); i++) {
            json_object *e = json_object_array_get_idx(mo, i);
            int v = e && json_object_is_type(e, json_type_int) ? json_object_get_int(e) : -1;
            if (v < 0 || v >= cfg->n_layer)
                return tern_err_set(err, TERN_EFORMAT,
                                    "config.json: 'mlp_only_layers' entry %zu is not a layer index below %d", i,
                                    cfg->n_layer);
            cfg->layer_moe[v] = 0;
        }
    }
    return 0;
}

int model_config_load(model_config *cfg, const char *dir, tern_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    char *path = tern_path_join(dir, "config.json");
    if (!path)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    json_object *o = tern_json_parse_file(path, err);
    free(path);
    if (!o)
        return err ? err->code : TERN_EFORMAT;
    int rc;
    const char *mt = NULL, *act = "silu";
    if ((rc = tern_json_get_str(o, "model_type", &mt, "config.json", err))) {
        if (rc == TERN_ENOTFOUND)
            rc = tern_err_set(err, TERN_EFORMAT, "config.json: missing required field 'model_type'");
        goto out;
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt);
    if (!strcmp(mt, "llama") || !strcmp(mt, "mistral"))
        cfg->arch = ARCH_LLAMA;
    else if (!strcmp(mt, "qwen2"))
        cfg->arch = ARCH_QWEN2;
    else if (!strcmp(mt, "qwen3"))
        cfg->arch = ARCH_QWEN3;
    else if (!strcmp(mt, "qwen3_moe"))
        cfg->arch = ARCH_QWEN3, cfg->moe = MOE_QWEN3;
    else if (!strcmp(mt, "mixtral"))
        cfg->arch = ARCH_LLAMA, cfg->moe = MOE_MIXTRAL;
    else if (!strcmp(mt, "gemma2"))
        cfg->arch = ARCH_GEMMA2;
    else if (!strcmp(mt, "gemma3_text"))
        cfg->arch = ARCH_GEMMA3;
    else if (!strcmp(mt, "gemma3")) {
        rc = tern_err_set(err, TERN_EUNSUPPORTED,
                          "config.json: model_type 'gemma3' is the multimodal model; use a text-only (gemma3_text) checkpoint");
        goto out;
    } else if (!strcmp(mt, "gpt_oss")) {
        cfg->arch = ARCH_LLAMA, cfg->moe = MOE_GPT_OSS;
    } else if (!strcmp(mt, "qwen2_moe")) {
        rc = tern_err_set(err, TERN_EUNSUPPORTED,
                          "config.json: model_type 'qwen2_moe' is not supported: its shared experts "
                          "(shared_expert_intermediate_size) are not implemented");
        goto out;
    } else {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "config.json: model_type '%s' is not supported", mt);
        goto out;
    }
    /* Bounds keep later size arithmetic far from overflow. */
    if ((rc = get_req_int(o, "vocab_size", 1, 1 << 24, &cfg->n_vocab, err)) ||
        (rc = get_req_int(o, "hidden_size", 1, 1 << 16, &cfg->dim, err)) ||
        (rc = get_req_int(o, "intermediate_size", 1, 1 << 20, &cfg->n_ff, err)) ||
        (rc = get_req_int(o, "num_hidden_layers", 1, 1024, &cfg->n_layer, err)) ||
        (rc = get_req_int(o, "num_attention_heads", 1, 1024, &cfg->n_head, err)))
        goto out;
    if (cfg->n_layer > MODEL_MAX_LAYERS) {
        rc = tern_err_set(err, TERN_ERANGE, "config.json: more than %d layers", MODEL_MAX_LAYERS);
        goto out;
    }
    cfg->n_kv_head = cfg->n_head;
    cfg->head_dim = cfg->dim / cfg->n_head;
    cfg->max_pos = 2048;
    if ((rc = get_opt_int(o, "num_key_value_heads", 1, cfg->n_head, &cfg->n_kv_head, err)) ||
        (rc = get_opt_int(o, "head_dim", 1, 4096, &cfg->head_dim, err)) ||
        (rc = get_opt_int(o, "max_position_embeddings", 1, 1 << 24, &cfg->max_pos, err)))
        goto out;
    int gemma = cfg->arch == ARCH_GEMMA2 || cfg->arch == ARCH_GEMMA3, gpt_oss = cfg->moe == MOE_GPT_OSS;
    if (gemma)
        cfg->head_dim = 256; /* transformers' default for both Gemmas */
    if (gpt_oss)
        cfg->head_dim = 64; /* GptOssConfig's default */
    if ((rc = get_opt_int(o, "head_dim", 1, 4096, &cfg->head_dim, err)))
        goto out;
    if (cfg->head_dim < 1) { /* the default, hidden_size / num_attention_heads, rounded to 0 */
        rc = tern_err_set(err, TERN_EFORMAT, "config.json: hidden_size %d over num_attention_heads %d leaves no head_dim",
                          cfg->dim, cfg->n_head);
        goto out;
    }
    if (cfg->n_head % cfg->n_kv_head) {
        rc = tern_err_set(err, TERN_EFORMAT, "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                          cfg->n_head, cfg->n_kv_head);
        goto out;
    }
    double eps = gpt_oss ? 1e-5 : 1e-6;
    if ((rc = tern_json_get_num(o, "rms_norm_eps", &eps, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    /* json-c reads NaN and Infinity; a norm with eps <= 0 divides by zero on a
     * zero row, and one beyond float's range is no norm at all */
    if (!(eps > 0 && eps < 1)) {
        rc = tern_err_set(err, TERN_ERANGE, "config.json: rms_norm_eps %g must be a number in (0, 1)", eps);
        goto out;
    }
    cfg->norm_eps = (float)eps;
    if ((rc = read_rope(o, cfg, err)) || (rc = read_quant(o, cfg, err)) ||
        (cfg->moe != MOE_NONE && (rc = read_moe(o, cfg, err))))
        goto out;
    /* Gemma reads hidden_activation (hidden_act is a legacy alias there). */
    if (gemma) {
        act = "gelu_pytorch_tanh";
        if ((rc = tern_json_get_str(o, "hidden_act", &act, "config.json", err)) && rc != TERN_ENOTFOUND)
            goto out;
        if ((rc = tern_json_get_str(o, "hidden_activation", &act, "config.json", err)) && rc != TERN_ENOTFOUND)
            goto out;
        if (strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_tanh")) {
            rc = tern_err_set(err, TERN_EUNSUPPORTED, "config.json: activation '%s' is not supported for %s", act, mt);
            goto out;
        }
        cfg->gelu = 1;
    } else {
        if ((rc = tern_json_get_str(o, "hidden_act", &act, "config.json", err)) && rc != TERN_ENOTFOUND)
            goto out;
        if (strcmp(act, "silu") != 0) {
            rc = tern_err_set(err, TERN_EUNSUPPORTED, "config.json: hidden_act '%s' is not supported for %s", act, mt);
            goto out;
        }
    }
    cfg->norm_plus_one = cfg->sandwich_norms = gemma;
    cfg->qk_norm = cfg->arch == ARCH_QWEN3 || cfg->arch == ARCH_GEMMA3;
    cfg->embed_scale = gemma ? sqrtf((float)cfg->dim) : 0.0f;
    double qpas = cfg->head_dim, cap_a, cap_f;
    if (gemma) {
        qpas = 256;
        if ((rc = tern_json_get_num(o, "query_pre_attn_scalar", &qpas, "config.json", err)) && rc != TERN_ENOTFOUND)
            goto out;
        if (!(qpas > 0)) {
            rc = tern_err_set(err, TERN_ERANGE, "config.json: query_pre_attn_scalar must be positive");
            goto out;
        }
    }
    cfg->attn_scale = (float)(1.0 / sqrt(qpas));
    /* Gemma 2 soft-caps by default (50 / 30); null turns it off. */
    if ((rc = get_opt_num_null(o, "attn_logit_softcapping", cfg->arch == ARCH_GEMMA2 ? 50.0 : 0.0, &cap_a, err)) ||
        (rc = get_opt_num_null(o, "final_logit_softcapping", cfg->arch == ARCH_GEMMA2 ? 30.0 : 0.0, &cap_f, err)))
        goto out;
    if (cap_a < 0 || cap_f < 0) {
        rc = tern_err_set(err, TERN_ERANGE, "config.json: soft-capping values must be positive");
        goto out;
    }
    cfg->attn_softcap = (float)cap_a;
    cfg->final_softcap = (float)cap_f;
    int tie = gemma, b = 0; /* transformers' default for these families */
    if ((rc = tern_json_get_bool(o, "tie_word_embeddings", &tie, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    cfg->tie_embeddings = tie;
    cfg->qkv_bias = cfg->arch == ARCH_QWEN2;
    if ((rc = tern_json_get_bool(o, "attention_bias", &b, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    /* transformers' attention_bias: q, k, v and o in Llama, Qwen3, Gemma 2/3
     * and Qwen3-MoE; Qwen2 has q/k/v biases always and never an o bias;
     * Mistral and Mixtral read no such field (their projections have none) */
    if (rc == 0 && b && strcmp(mt, "mistral") && strcmp(mt, "mixtral")) {
        cfg->qkv_bias = 1;
        cfg->o_bias = cfg->arch != ARCH_QWEN2;
    }
    if (gpt_oss) /* GptOssConfig sets attention_bias whatever the file says: q, k, v and o have biases */
        cfg->qkv_bias = cfg->o_bias = cfg->attn_sinks = 1;
    b = 0;
    if ((rc = tern_json_get_bool(o, "mlp_bias", &b, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    if (b) {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "config.json: mlp_bias is not supported");
        goto out;
    }
    /* Sliding windows: Mistral's sliding_window applies to every layer;
     * Qwen's only with use_sliding_window, which we do not implement. */
    int sw = gemma ? 4096 : gpt_oss ? 128 : 0, use_sw = 0;
    if ((rc = get_opt_int(o, "sliding_window", 0, 1 << 30, &sw, err)))
        goto out;
    if ((rc = tern_json_get_bool(o, "use_sliding_window", &use_sw, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    if ((rc = read_layer_types(o, cfg, err)))
        goto out;
    if (cfg->arch == ARCH_LLAMA || gemma)
        cfg->sliding_window = sw;
    else if (use_sw && sw > 0 && sw < cfg->max_pos) {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "config.json: use_sliding_window is not supported for %s", mt);
        goto out;
    }
    cfg->bos_id = -1;
    if ((rc = get_opt_int(o, "bos_token_id", 0, cfg->n_vocab - 1, &cfg->bos_id, err)))
        goto out;
    rc = read_eos(o, "config.json", cfg, err);
    if (rc && rc != TERN_ENOTFOUND)
        goto out;
    rc = 0;
    json_object_put(o);
    o = NULL;

    /* generation_config.json overrides the eos list when present. */
    path = tern_path_join(dir, "generation_config.json");
    if (!path)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    if (tern_file_exists(path)) {
        o = tern_json_parse_file(path, err);
        if (!o) {
            free(path);
            return err ? err->code : TERN_EFORMAT;
        }
        rc = read_eos(o, "generation_config.json", cfg, err);
        if (rc == TERN_ENOTFOUND)
            rc = 0;
    }
    free(path);
    for (int i = 0; !rc && i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] < 0 || cfg->eos_ids[i] >= cfg->n_vocab)
            rc = tern_err_set(err, TERN_ERANGE, "eos_token_id %d is outside the vocabulary (vocab_size %d)",
                              cfg->eos_ids[i], cfg->n_vocab);
out:
    json_object_put(o);
    return rc;
}
