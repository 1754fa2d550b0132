/* PEFT LoRA adapters (lora.h): the config and tensors read and checked
 * against the base model, and the per-row low-rank products the host
 * forward adds after each adapted product. Rows are grouped by adapter and
 * each group runs two products through the backend's matmul (X A^T, then
 * (.) B^T), whose per-(row, token) results do not depend on the batch
 * (backend.h), so a row's result is the same alone or among any others. */
#include <math.h>
#include <stdatomic.h>
#include <xxhash.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/log.h"
#include "model/lora.h"
#include "model/model_int.h"

static const char *const mod_names[LORA_N_MOD] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};
static const char *const mod_paths[LORA_N_MOD] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                  "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                  "mlp.down_proj"};

const char *model_lora_mod_name(int mod) { return mod >= 0 && mod < LORA_N_MOD ? mod_names[mod] : "?"; }

/* One adapted product: A [r][n_in] and B [n_out][r] as f32 weights. */
typedef struct lora_mod {
    model_weight a, b; /* data owned (float *); a.data NULL = not adapted */
    float scale;
    int r;
} lora_mod;

struct model_lora {
    atomic_int refs;
    uint64_t id;
    int n_layer, max_r;
    size_t bytes;
    lora_mod *mods; /* [n_layer][LORA_N_MOD] */
    void *dev;      /* a device backend's copy (lora_upload), freed by dev_free */
    void (*dev_free)(void *dev);
};


/* ---- adapter_config.json ---- */

#define PAT_MAX 64

typedef struct lora_pattern {
    const char *key; /* borrowed from the parsed config */
    double value;
} lora_pattern;

typedef struct lora_cfg {
    int r, rslora;
    double alpha;
    int targets[LORA_N_MOD];
    lora_pattern ranks[PAT_MAX], alphas[PAT_MAX];
    int n_ranks, n_alphas;
    uint8_t *layers; /* [n_layer]: 1 = adapted (layers_to_transform), all when absent */
} lora_cfg;

static int is_falsy(json_object *v)
{
    if (!v)
        return 1;
    switch (json_object_get_type(v)) {
    case json_type_null:
        return 1;
    case json_type_boolean:
        return !json_object_get_boolean(v);
    case json_type_array:
        return json_object_array_length(v) == 0;
    case json_type_object:
        return json_object_object_length(v) == 0;
    case json_type_string:
        return json_object_get_string_len(v) == 0;
    default:
        return 0;
    }
}

/* Fields that change nothing at inference (training, initialization,
 * provenance, offloading). */
static const char *const ignored_fields[] = {
    "task_type", "base_model_name_or_path", "revision", "inference_mode", "lora_dropout", "init_lora_weights",
    "loftq_config", "eva_config", "corda_config", "auto_mapping", "peft_version", "qalora_group_size",
    "megatron_core", "runtime_config", "ensure_weight_tying", NULL};

/* Fields that change the math when set: allowed only unset (null, false,
 * empty), with what tern would need for them. */
static const char *const refused_fields[] = {
    "use_dora", "fan_in_fan_out", "modules_to_save", "layer_replication", "lora_bias", "trainable_token_indices",
    "target_parameters", "exclude_modules", "use_qalora", "alora_invocation_tokens", "arrow_config",
    "megatron_config", NULL};

static int in_list(const char *const *list, const char *k)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], k))
            return 1;
    return 0;
}

static int mod_index(const char *name)
{
    for (int k = 0; k < LORA_N_MOD; k++)
        if (!strcmp(name, mod_names[k]))
            return k;
    return -1;
}

static int cfg_targets(lora_cfg *c, json_object *v, tern_err *err)
{
    if (json_object_is_type(v, json_type_string)) {
        if (strcmp(json_object_get_string(v), "all-linear"))
            return tern_err_set(err, TERN_EUNSUPPORTED,
                                "adapter_config.json: 'target_modules' as a regular expression ('%s') is not "
                                "supported; list the modules",
                                json_object_get_string(v));
        for (int k = 0; k < LORA_N_MOD; k++)
            c->targets[k] = 1;
        return 0;
    }
    if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) == 0)
        return tern_err_set(err, TERN_EFORMAT, "adapter_config.json: 'target_modules' must be a list of module names");
    for (size_t i = 0; i < json_object_array_length(v); i++) {
        json_object *e = json_object_array_get_idx(v, i);
        int k = json_object_is_type(e, json_type_string) ? mod_index(json_object_get_string(e)) : -1;
        if (k < 0)
            return tern_err_set(err, TERN_EUNSUPPORTED,
                                "adapter_config.json: 'target_modules' entry '%s' is not one of q_proj, k_proj, "
                                "v_proj, o_proj, gate_proj, up_proj, down_proj",
                                json_object_get_string(e));
        c->targets[k] = 1;
    }
    return 0;
}

/* rank_pattern / alpha_pattern: {key: number}. Keys are read as literal
 * module-name suffixes (PEFT matches them as regular expressions at a '.'
 * boundary; a key using other regex syntax is refused). */
static int cfg_patterns(const char *field, json_object *v, lora_pattern *out, int *n, int integer, tern_err *err)
{
    if (is_falsy(v))
        return 0;
    if (!json_object_is_type(v, json_type_object))
        return tern_err_set(err, TERN_EFORMAT, "adapter_config.json: '%s' must be an object", field);
    json_object_object_foreach(v, key, val)
    {
        if (*n >= PAT_MAX)
            return tern_err_set(err, TERN_EUNSUPPORTED, "adapter_config.json: '%s' has more than %d keys", field,
                                PAT_MAX);
        if (strpbrk(key, "*+?[](){}|^$\\"))
            return tern_err_set(err, TERN_EUNSUPPORTED,
                                "adapter_config.json: '%s' key '%s' is a regular expression; only module names "
                                "are supported",
                                field, key);
        if (!json_object_is_type(val, json_type_int) && !(json_object_is_type(val, json_type_double) && !integer))
            return tern_err_set(err, TERN_EFORMAT, "adapter_config.json: '%s' value of '%s' must be a%s number",
                                field, key, integer ? "n integer" : "");
        double d = json_object_get_double(val);
        if (!(d > 0) || (integer && d > 65536))
            return tern_err_set(err, TERN_EFORMAT, "adapter_config.json: '%s' value of '%s' must be positive", field,
                                key);
        out[*n].key = key;
        out[(*n)++].value = d;
    }
    return 0;
}

static int cfg_layers(lora_cfg *c, json_object *v, int n_layer, tern_err *err)
{
    c->layers = malloc((size_t)n_layer);
    if (!c->layers)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    memset(c->layers, is_falsy(v) ? 1 : 0, (size_t)n_layer);
    if (is_falsy(v))
        return 0;
    size_t n = json_object_is_type(v, json_type_array) ? json_object_array_length(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_is_type(v, json_type_array) ? json_object_array_get_idx(v, i) : v;
        int l = json_object_is_type(e, json_type_int) ? json_object_get_int(e) : -1;
        if (l < 0 || l >= n_layer)
            return tern_err_set(err, TERN_EFORMAT,
                                "adapter_config.json: 'layers_to_transform' must list layers 0..%d", n_layer - 1);
        c->layers[l] = 1;
    }
    return 0;
}

static int cfg_read(lora_cfg *c, json_object *o, int n_layer, tern_err *err)
{
    int have_r = 0, have_alpha = 0, have_targets = 0, rc;
    json_object *layers = NULL;
    json_object_object_foreach(o, k, v)
    {
        if (!strcmp(k, "peft_type")) {
            if (!json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "LORA"))
                return tern_err_set(err, TERN_EUNSUPPORTED, "adapter_config.json: 'peft_type' %s is not LORA",
                                    json_object_to_json_string(v));
        } else if (!strcmp(k, "r")) {
            int64_t r;
            if ((rc = tern_json_get_int(o, k, &r, "adapter_config.json", err)))
                return rc;
            if (r < 1 || r > 65536)
                return tern_err_set(err, TERN_EFORMAT, "adapter_config.json: 'r' must be positive");
            c->r = (int)r;
            have_r = 1;
        } else if (!strcmp(k, "lora_alpha")) {
            if ((rc = tern_json_get_num(o, k, &c->alpha, "adapter_config.json", err)))
                return rc;
            have_alpha = 1;
        } else if (!strcmp(k, "use_rslora")) {
            if (!is_falsy(v) && (rc = tern_json_get_bool(o, k, &c->rslora, "adapter_config.json", err)))
                return rc;
        } else if (!strcmp(k, "target_modules")) {
            if ((rc = cfg_targets(c, v, err)))
                return rc;
            have_targets = 1;
        } else if (!strcmp(k, "rank_pattern")) {
            if ((rc = cfg_patterns(k, v, c->ranks, &c->n_ranks, 1, err)))
                return rc;
        } else if (!strcmp(k, "alpha_pattern")) {
            if ((rc = cfg_patterns(k, v, c->alphas, &c->n_alphas, 0, err)))
                return rc;
        } else if (!strcmp(k, "layers_to_transform")) {
            layers = v;
        } else if (!strcmp(k, "layers_pattern")) {
            const char *p = json_object_is_type(v, json_type_array) && json_object_array_length(v) == 1
                                ? json_object_get_string(json_object_array_get_idx(v, 0))
                                : json_object_get_string(v);
            if (!is_falsy(v) && strcmp(p ? p : "", "layers"))
                return tern_err_set(err, TERN_EUNSUPPORTED, "adapter_config.json: 'layers_pattern' %s is not "
                                    "\"layers\"", json_object_to_json_string(v));
        } else if (!strcmp(k, "bias")) {
            if (!is_falsy(v) && strcmp(json_object_get_string(v), "none"))
                return tern_err_set(err, TERN_EUNSUPPORTED,
                                    "adapter_config.json: 'bias' %s is not supported (only \"none\")",
                                    json_object_to_json_string(v));
        } else if (in_list(refused_fields, k)) {
            if (!is_falsy(v))
                return tern_err_set(err, TERN_EUNSUPPORTED, "adapter_config.json: '%s' (%s) is not supported", k,
                                    json_object_to_json_string(v));
        } else if (!in_list(ignored_fields, k) && !is_falsy(v)) {
            return tern_err_set(err, TERN_EUNSUPPORTED, "adapter_config.json: field '%s' is not understood", k);
        }
    }
    if (!have_r || !have_alpha || !have_targets)
        return tern_err_set(err, TERN_EFORMAT, "adapter_config.json: missing '%s'",
                            !have_r ? "r" : !have_alpha ? "lora_alpha" : "target_modules");
    return cfg_layers(c, layers, n_layer, err);
}

/* The first pattern whose key is the module's name or a '.'-bounded suffix
 * of it (PEFT's get_pattern_key), else NULL. */
static const lora_pattern *pattern_find(const lora_pattern *p, int n, const char *name)
{
    size_t nl = strlen(name);
    for (int i = 0; i < n; i++) {
        size_t kl = strlen(p[i].key);
        if (!strcmp(name, p[i].key) || (kl < nl && name[nl - kl - 1] == '.' && !strcmp(name + nl - kl, p[i].key)))
            return &p[i];
    }
    return NULL;
}

/* ---- tensors ---- */

/* The adapter's tensor for (layer, module, "lora_A"/"lora_B"): PEFT saves
 * base_model.model.<HF name>; a base-model checkpoint has no "model." in
 * between. Marks it used. */
static const st_tensor *find_tensor(const st_set *st, uint8_t *used, int l, int mod, const char *ab, char *name,
                                    size_t cap)
{
    static const char *const pfx[] = {"base_model.model.model.layers", "base_model.model.layers"};
    for (int i = 0; i < 2; i++) {
        snprintf(name, cap, "%s.%d.%s.%s.weight", pfx[i], l, mod_paths[mod], ab);
        const st_tensor *t = st_find(st, name);
        if (t) {
            used[t - st->tensors] = 1;
            return t;
        }
    }
    snprintf(name, cap, "base_model.model.model.layers.%d.%s.%s.weight", l, mod_paths[mod], ab);
    return NULL;
}

/* t as an owned f32 weight [n_out][n_in], its shape checked. */
static int tensor_take(const st_tensor *t, const char *name, int n_out, int n_in, const char *what, model_weight *w,
                       size_t *bytes, tern_err *err)
{
    if (t->n_dims != 2 || t->shape[0] != n_out || t->shape[1] != n_in)
        return tern_err_set(err, TERN_EFORMAT,
                            "adapter tensor '%s' has shape [%lld, %lld]; the base model's %s needs [%d, %d]", name,
                            (long long)t->shape[0], (long long)(t->n_dims > 1 ? t->shape[1] : 0), what, n_out, n_in);
    if (t->dtype != TERN_F32 && t->dtype != TERN_BF16 && t->dtype != TERN_F16)
        return tern_err_set(err, TERN_EUNSUPPORTED, "adapter tensor '%s' has dtype %s", name,
                            tern_dtype_name(t->dtype));
    float *d = malloc((size_t)n_out * n_in * sizeof(float));
    if (!d)
        return tern_err_set(err, TERN_ENOMEM, "out of memory for adapter tensor '%s'", name);
    tern_to_f32(t->dtype, t->data, d, (size_t)n_out * n_in);
    memset(w, 0, sizeof *w);
    w->dtype = TERN_F32;
    w->data = d;
    w->n_out = n_out;
    w->n_in = n_in;
    *bytes += (size_t)n_out * n_in * sizeof(float);
    return 0;
}

/* Module mod's product shape in m: [n_out][n_in]. */
static void mod_shape(const tern_model *m, int mod, int *n_out, int *n_in)
{
    const model_config *c = &m->cfg;
    int qd = c->n_head * c->head_dim, kvd = c->n_kv_head * c->head_dim;
    static const int outs[LORA_N_MOD] = {0, 1, 1, 2, 3, 3, 2}, ins[LORA_N_MOD] = {2, 2, 2, 0, 2, 2, 3};
    int dims[4] = {qd, kvd, c->dim, c->n_ff}; /* q, kv, dim, ff */
    *n_out = dims[outs[mod]];
    *n_in = mod == LORA_O ? qd : dims[ins[mod]];
}

static int load_mods(model_lora *a, tern_model *m, const lora_cfg *cfg, const st_set *st, uint8_t *used,
                     tern_err *err)
{
    char name[256], full[128], what[64];
    int rc;
    for (int l = 0; l < a->n_layer; l++)
        for (int k = 0; k < LORA_N_MOD; k++) {
            if (!cfg->targets[k] || !cfg->layers[l])
                continue;
            if (k >= LORA_GATE && m->cfg.n_expert && m->cfg.layer_moe[l])
                return tern_err_set(err, TERN_EUNSUPPORTED,
                                    "'target_modules' lists %s, but layer %d is a mixture of experts (adapters on "
                                    "experts are not supported)",
                                    mod_names[k], l);
            lora_mod *md = &a->mods[(size_t)l * LORA_N_MOD + k];
            snprintf(full, sizeof full, "model.layers.%d.%s", l, mod_paths[k]);
            const lora_pattern *pr = pattern_find(cfg->ranks, cfg->n_ranks, full);
            const lora_pattern *pa = pattern_find(cfg->alphas, cfg->n_alphas, full);
            int r = pr ? (int)pr->value : cfg->r;
            double alpha = pa ? pa->value : cfg->alpha;
            int n_out, n_in;
            mod_shape(m, k, &n_out, &n_in);
            snprintf(what, sizeof what, "%s (rank %d)", mod_names[k], r);
            const st_tensor *ta = find_tensor(st, used, l, k, "lora_A", name, sizeof name);
            if (!ta)
                return tern_err_set(err, TERN_EFORMAT, "missing adapter tensor '%s' (target_modules lists %s)", name,
                                    mod_names[k]);
            if ((rc = tensor_take(ta, name, r, n_in, what, &md->a, &a->bytes, err)))
                return rc;
            const st_tensor *tb = find_tensor(st, used, l, k, "lora_B", name, sizeof name);
            if (!tb)
                return tern_err_set(err, TERN_EFORMAT, "missing adapter tensor '%s' (target_modules lists %s)", name,
                                    mod_names[k]);
            if ((rc = tensor_take(tb, name, n_out, r, what, &md->b, &a->bytes, err)))
                return rc;
            md->r = r;
            /* PEFT: lora_alpha / r, or / sqrt(r) under rsLoRA (Python floats) */
            md->scale = (float)(cfg->rslora ? alpha / sqrt((double)r) : alpha / r);
            if (r > a->max_r)
                a->max_r = r;
        }
    for (int i = 0; i < st->n_tensors; i++)
        if (!used[i])
            return tern_err_set(err, TERN_EFORMAT,
                                "adapter tensor '%s' is not read (not a lora_A/lora_B of a target module; "
                                "DoRA, biases and saved modules are not supported)",
                                st->tensors[i].name);
    return 0;
}

/* The adapter's content hash (every module's rank, scale, A and B): its
 * prefix-cache key, the same for the same adapter in every process and
 * under every name (a disk tier keeps blocks across restarts). Never 0. */
static uint64_t lora_fingerprint(const model_lora *a)
{
    XXH3_state_t *st = XXH3_createState();
    if (!st)
        return 1;
    XXH3_64bits_reset_withSeed(st, 0x4c6f5241);
    for (size_t i = 0; i < (size_t)a->n_layer * LORA_N_MOD; i++) {
        const lora_mod *md = &a->mods[i];
        if (!md->a.data)
            continue;
        uint64_t head[3] = {i, (uint64_t)md->r, 0};
        memcpy(&head[2], &md->scale, sizeof md->scale);
        XXH3_64bits_update(st, head, sizeof head);
        XXH3_64bits_update(st, md->a.data, (size_t)md->a.n_out * md->a.n_in * sizeof(float));
        XXH3_64bits_update(st, md->b.data, (size_t)md->b.n_out * md->b.n_in * sizeof(float));
    }
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h ? h : 1;
}

model_lora *model_lora_load(tern_model *m, const char *dir, tern_err *err)
{
    char path[4096];
    lora_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    st_set st;
    memset(&st, 0, sizeof st);
    uint8_t *used = NULL;
    json_object *o = NULL;
    model_lora *a = calloc(1, sizeof *a);
    if (!a) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    atomic_init(&a->refs, 1);
    a->n_layer = m->cfg.n_layer;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    if (!(o = tern_json_parse_file(path, err)))
        goto fail;
    if (!json_object_is_type(o, json_type_object)) {
        tern_err_set(err, TERN_EFORMAT, "adapter_config.json: not a JSON object");
        goto fail;
    }
    if (cfg_read(&cfg, o, a->n_layer, err))
        goto fail;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    if (st_open_file(&st, path, err))
        goto fail;
    a->mods = calloc((size_t)a->n_layer * LORA_N_MOD, sizeof *a->mods);
    used = calloc((size_t)st.n_tensors + 1, 1);
    if (!a->mods || !used) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    if (load_mods(a, m, &cfg, &st, used, err))
        goto fail;
    a->id = lora_fingerprint(a);
    if (m->be->lora_upload && m->be->lora_upload(m->be, a, err))
        goto fail;
    free(used);
    free(cfg.layers);
    st_close(&st);
    json_object_put(o);
    TERN_INFO("loaded LoRA adapter %s: max rank %d, %.1f MB", dir, a->max_r, a->bytes / 1e6);
    return a;
fail:
    tern_err_wrap(err, "LoRA adapter %s", dir);
    free(used);
    free(cfg.layers);
    st_close(&st);
    json_object_put(o);
    model_lora_release(a);
    return NULL;
}

void model_lora_retain(model_lora *a) { atomic_fetch_add(&a->refs, 1); }

void model_lora_release(model_lora *a)
{
    if (!a || atomic_fetch_sub(&a->refs, 1) != 1)
        return;
    if (a->dev_free)
        a->dev_free(a->dev);
    if (a->mods)
        for (size_t i = 0; i < (size_t)a->n_layer * LORA_N_MOD; i++) {
            free((void *)a->mods[i].a.data);
            free((void *)a->mods[i].b.data);
        }
    free(a->mods);
    free(a);
}

int model_lora_rank(const model_lora *a) { return a->max_r; }
size_t model_lora_bytes(const model_lora *a) { return a->bytes; }
uint64_t model_lora_id(const model_lora *a) { return a->id; }

int model_lora_has(const model_lora *a, int l, int mod)
{
    return l >= 0 && l < a->n_layer && mod >= 0 && mod < LORA_N_MOD && a->mods[(size_t)l * LORA_N_MOD + mod].a.data;
}

int model_lora_supported(const tern_model *m, tern_err *err)
{
    if (m->be->forward && !m->be->lora_rows)
        return tern_err_set(err, TERN_EUNSUPPORTED, "the %s backend does not run LoRA adapters", m->be->name);
    return 0;
}

int model_lora_mod_get(const model_lora *a, int l, int mod, const float **A, const float **B, int *r, int *n_in,
                       int *n_out, float *scale)
{
    if (!model_lora_has(a, l, mod))
        return 0;
    const lora_mod *md = &a->mods[(size_t)l * LORA_N_MOD + mod];
    *A = md->a.data;
    *B = md->b.data;
    *r = md->r;
    *n_in = md->a.n_in;
    *n_out = md->b.n_out;
    *scale = md->scale;
    return 1;
}

void model_lora_dev_set(model_lora *a, void *dev, void (*free_fn)(void *dev))
{
    a->dev = dev;
    a->dev_free = free_fn;
}

void *model_lora_dev(const model_lora *a) { return a->dev; }

void model_lora_merge_row(const model_lora *a, int l, int mod, int r, float *w_row)
{
    if (!model_lora_has(a, l, mod))
        return;
    const lora_mod *md = &a->mods[(size_t)l * LORA_N_MOD + mod];
    const float *A = md->a.data, *B = (const float *)md->b.data + (size_t)r * md->r;
    int n_in = md->a.n_in;
    for (int i = 0; i < n_in; i++) {
        float s = 0.0f;
        for (int k = 0; k < md->r; k++)
            s += B[k] * A[(size_t)k * n_in + i];
        w_row[i] += s * md->scale;
    }
}

/* ---- the per-row products ---- */

struct model_lora_scratch {
    size_t cap_x, cap_u, cap_d;
    float *x, *u, *d; /* gathered inputs [T][n_in], A x [T][r], B A x [T][n_out] */
    int32_t *rows;    /* [cap_rows] the batch rows of one adapter */
    const model_lora **done; /* [cap_rows] adapters already applied this call */
    int cap_rows;
};

void model_lora_scratch_free(model_lora_scratch *s)
{
    if (!s)
        return;
    free(s->x);
    free(s->u);
    free(s->d);
    free(s->rows);
    free(s->done);
    free(s);
}

static int grow_f(float **p, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    float *n = realloc(*p, need * sizeof(float));
    if (!n)
        return TERN_ENOMEM;
    *p = n;
    *cap = need;
    return 0;
}

int model_lora_apply(tern_model *m, const model_lora *const *lora, int T, int l, int mod, const float *X, float *Y,
                     tern_err *err)
{
    if (!lora)
        return 0;
    model_lora_scratch *s = m->lora_scratch;
    if (!s && !(s = m->lora_scratch = calloc(1, sizeof *s)))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    if (T > s->cap_rows) {
        int32_t *nr = realloc(s->rows, (size_t)T * sizeof *nr);
        if (nr)
            s->rows = nr;
        const model_lora **nd = realloc(s->done, (size_t)T * sizeof *nd);
        if (nd)
            s->done = nd;
        if (!nr || !nd)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        s->cap_rows = T;
    }
    int n_done = 0;
    for (int i = 0; i < T; i++) {
        const model_lora *a = lora[i];
        if (!a || !model_lora_has(a, l, mod))
            continue;
        int seen = 0;
        for (int j = 0; j < n_done && !seen; j++)
            seen = s->done[j] == a;
        if (seen) /* applied with its first row */
            continue;
        s->done[n_done++] = a;
        const lora_mod *md = &a->mods[(size_t)l * LORA_N_MOD + mod];
        int n_in = md->a.n_in, n_out = md->b.n_out, n = 0;
        for (int j = i; j < T; j++)
            if (lora[j] == a)
                s->rows[n++] = j;
        const float *xg = X;
        if (n < T) { /* gather the adapter's rows (a whole-batch adapter reads X in place) */
            if (grow_f(&s->x, &s->cap_x, (size_t)n * n_in))
                return tern_err_set(err, TERN_ENOMEM, "out of memory for adapter inputs");
            for (int g = 0; g < n; g++)
                memcpy(s->x + (size_t)g * n_in, X + (size_t)s->rows[g] * n_in, (size_t)n_in * sizeof(float));
            xg = s->x;
        }
        if (grow_f(&s->u, &s->cap_u, (size_t)n * md->r) || grow_f(&s->d, &s->cap_d, (size_t)n * n_out))
            return tern_err_set(err, TERN_ENOMEM, "out of memory for adapter products");
        const model_weight *wa = &md->a, *wb = &md->b;
        int rc = m->be->matmul(m->be, 1, &wa, xg, &s->u, n, err);
        if (rc || (rc = m->be->matmul(m->be, 1, &wb, s->u, &s->d, n, err)))
            return rc;
        for (int g = 0; g < n; g++) { /* PEFT: result + lora_B(lora_A(x)) * scaling */
            float *y = Y + (size_t)s->rows[g] * n_out;
            const float *d = s->d + (size_t)g * n_out;
            for (int o = 0; o < n_out; o++)
                y[o] += d[o] * md->scale;
        }
    }
    return 0;
}
