/* config.json parsing (see config.h). Unknown model types, activations and
 * RoPE scalings are rejected: silently running different math is worse than
 * not running. */
#include "config.h"

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

static int read_rope(json_object *o, model_config *cfg, tern_err *err)
{
    double theta = 10000.0;
    int rc = tern_json_get_num(o, "rope_theta", &theta, "config.json", err);
    if (rc && rc != TERN_ENOTFOUND)
        return rc;
    /* transformers 5 keeps RoPE settings in rope_parameters; older configs
     * in rope_scaling. Either may name a scaling type we must implement. */
    const char *keys[] = {"rope_parameters", "rope_scaling"};
    for (int k = 0; k < 2; k++) {
        json_object *p = NULL;
        if (!json_object_object_get_ex(o, keys[k], &p) || !p)
            continue;
        if (!json_object_is_type(p, json_type_object))
            return tern_err_set(err, TERN_EFORMAT, "config.json: '%s' must be an object", keys[k]);
        const char *type = "default";
        rc = tern_json_get_str(p, "rope_type", &type, "config.json", err);
        if (rc == TERN_ENOTFOUND)
            rc = tern_json_get_str(p, "type", &type, "config.json", err);
        if (rc && rc != TERN_ENOTFOUND)
            return rc;
        if (strcmp(type, "default") != 0)
            return tern_err_set(err, TERN_EUNSUPPORTED, "config.json: %s type '%s' is not supported", keys[k],
                                type);
        double t2;
        if (tern_json_get_num(p, "rope_theta", &t2, "config.json", err) == 0)
            theta = t2;
    }
    if (!(theta > 0))
        return tern_err_set(err, TERN_ERANGE, "config.json: rope_theta must be positive");
    cfg->rope_theta = (float)theta;
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
    else {
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
    cfg->n_kv_head = cfg->n_head;
    cfg->head_dim = cfg->dim / cfg->n_head;
    cfg->max_pos = 2048;
    if ((rc = get_opt_int(o, "num_key_value_heads", 1, cfg->n_head, &cfg->n_kv_head, err)) ||
        (rc = get_opt_int(o, "head_dim", 1, 4096, &cfg->head_dim, err)) ||
        (rc = get_opt_int(o, "max_position_embeddings", 1, 1 << 24, &cfg->max_pos, err)))
        goto out;
    if (cfg->n_head % cfg->n_kv_head) {
        rc = tern_err_set(err, TERN_EFORMAT, "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                          cfg->n_head, cfg->n_kv_head);
        goto out;
    }
    if (cfg->head_dim % 2) {
        rc = tern_err_set(err, TERN_EFORMAT, "config.json: head_dim %d must be even for RoPE", cfg->head_dim);
        goto out;
    }
    double eps = 1e-6;
    if ((rc = tern_json_get_num(o, "rms_norm_eps", &eps, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    cfg->norm_eps = (float)eps;
    if ((rc = read_rope(o, cfg, err)))
        goto out;
    if ((rc = tern_json_get_str(o, "hidden_act", &act, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    if (strcmp(act, "silu") != 0) {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "config.json: hidden_act '%s' is not supported for %s", act, mt);
        goto out;
    }
    int tie = 0, b = 0; /* transformers' default for these families */
    if ((rc = tern_json_get_bool(o, "tie_word_embeddings", &tie, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    cfg->tie_embeddings = tie;
    cfg->qkv_bias = cfg->arch == ARCH_QWEN2;
    if ((rc = tern_json_get_bool(o, "attention_bias", &b, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    if (rc == 0 && b)
        cfg->qkv_bias = 1;
    b = 0;
    if ((rc = tern_json_get_bool(o, "mlp_bias", &b, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    if (b) {
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "config.json: mlp_bias is not supported");
        goto out;
    }
    /* Sliding windows: Mistral's sliding_window applies to every layer;
     * Qwen's only with use_sliding_window, which we do not implement. */
    int sw = 0, use_sw = 0;
    if ((rc = get_opt_int(o, "sliding_window", 0, 1 << 30, &sw, err)))
        goto out;
    if ((rc = tern_json_get_bool(o, "use_sliding_window", &use_sw, "config.json", err)) && rc != TERN_ENOTFOUND)
        goto out;
    if (cfg->arch == ARCH_LLAMA)
        cfg->sliding_window = sw < cfg->max_pos ? sw : 0;
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
            rc = tern_err_set(err, TERN_ERANGE, "eos id %d is outside the vocabulary", cfg->eos_ids[i]);
out:
    json_object_put(o);
    return rc;
}
