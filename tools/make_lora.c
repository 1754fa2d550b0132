/* make_lora: writes a random PEFT LoRA adapter folder (adapter_config.json +
 * adapter_model.safetensors) for a base model folder, deterministic from a
 * seed - the adapters of the LoRA goldens (tests/golden/lora/peft.json lists the
 * arguments; the tests regenerate them).
 *
 *   make_lora --base DIR --out DIR [--r N] [--alpha X] [--targets q_proj,v_proj,...]
 *             [--rslora] [--rank KEY=N]... [--alpha-of KEY=X]... [--layers 0,2]
 *             [--dtype f32|bf16] [--seed S]
 *
 * A is uniform in [-1/sqrt(n_in), 1/sqrt(n_in)] (about PEFT's Kaiming
 * init), B uniform in [-0.05, 0.05] (PEFT starts B at zero, which would make
 * the adapter a no-op), so the update is of the order of the base product's
 * output for the fixtures' weights. --rank / --alpha-of write rank_pattern /
 * alpha_pattern entries (KEY a module name such as "q_proj" or
 * "model.layers.1.mlp.down_proj"); --layers writes layers_to_transform. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/json.h"
#include "base/rng.h"
#include "model/config.h"
#include "model/st_write.h"
#include "tensor/dtype.h"

#define MAX_T 4096
#define MAX_PAT 16

static const char *const mods[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
static const char *const paths[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                     "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};

typedef struct pat {
    char key[128];
    double v;
} pat;

typedef struct gen {
    st_out_tensor *ts;
    uint64_t seed;
} gen;

static int fill(void *vctx, int i, int64_t first, int64_t n, void *buf)
{
    gen *g = vctx;
    const st_out_tensor *t = &g->ts[i];
    tern_rng rng;
    tern_rng_seed(&rng, g->seed, (uint64_t)i + 1);
    tern_rng_advance(&rng, (uint64_t)first);
    int is_a = strstr(t->name, "lora_A") != NULL;
    float a = is_a ? (float)(1.0 / sqrt((double)t->shape[1])) : 0.05f;
    for (int64_t k = 0; k < n; k++) {
        float v = a * (tern_rng_f32(&rng) * 2.0f - 1.0f);
        if (t->dtype == TERN_F32)
            ((float *)buf)[k] = v;
        else
            ((uint16_t *)buf)[k] = tern_f32_to_bf16(v);
    }
    return 0;
}

static const pat *pat_find(const pat *p, int n, const char *full)
{
    size_t fl = strlen(full);
    for (int i = 0; i < n; i++) {
        size_t kl = strlen(p[i].key);
        if (!strcmp(full, p[i].key) || (kl < fl && full[fl - kl - 1] == '.' && !strcmp(full + fl - kl, p[i].key)))
            return &p[i];
    }
    return NULL;
}

static int parse_pat(const char *s, pat *p)
{
    const char *eq = strchr(s, '=');
    if (!eq || eq == s || (size_t)(eq - s) >= sizeof p->key)
        return -1;
    memcpy(p->key, s, (size_t)(eq - s));
    p->key[eq - s] = 0;
    p->v = atof(eq + 1);
    return p->v > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    const char *base = NULL, *out = NULL, *targets = "q_proj,v_proj", *layers_s = NULL;
    int r = 8, rslora = 0;
    double alpha = 16;
    uint64_t seed = 1;
    tern_dtype dt = TERN_F32;
    pat ranks[MAX_PAT], alphas[MAX_PAT];
    int n_ranks = 0, n_alphas = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--rslora")) {
            rslora = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "make_lora: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--base"))
            base = v;
        else if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--r"))
            r = atoi(v);
        else if (!strcmp(a, "--alpha"))
            alpha = atof(v);
        else if (!strcmp(a, "--targets"))
            targets = v;
        else if (!strcmp(a, "--layers"))
            layers_s = v;
        else if (!strcmp(a, "--seed"))
            seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--dtype") && (!strcmp(v, "f32") || !strcmp(v, "bf16")))
            dt = !strcmp(v, "f32") ? TERN_F32 : TERN_BF16;
        else if (!strcmp(a, "--rank") && n_ranks < MAX_PAT && !parse_pat(v, &ranks[n_ranks]))
            n_ranks++;
        else if (!strcmp(a, "--alpha-of") && n_alphas < MAX_PAT && !parse_pat(v, &alphas[n_alphas]))
            n_alphas++;
        else {
            fprintf(stderr, "make_lora: bad argument %s %s\n", a, v);
            return 2;
        }
    }
    if (!base || !out || r < 1) {
        fprintf(stderr, "usage: make_lora --base DIR --out DIR [--r N] [--alpha X] [--targets LIST] [--rslora] "
                        "[--rank KEY=N] [--alpha-of KEY=X] [--layers LIST] [--dtype f32|bf16] [--seed S]\n");
        return 2;
    }
    tern_err err = {0};
    model_config c;
    if (model_config_load(&c, base, &err)) {
        fprintf(stderr, "make_lora: %s\n", err.msg);
        return 1;
    }
    int on[7] = {0}, lay[1024];
    for (int l = 0; l < c.n_layer && l < 1024; l++)
        lay[l] = layers_s == NULL;
    if (layers_s)
        for (const char *p = layers_s; *p;) {
            int l = atoi(p);
            if (l >= 0 && l < c.n_layer && l < 1024)
                lay[l] = 1;
            p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
        }
    json_object *tm = json_object_new_array();
    for (int k = 0; k < 7; k++) {
        char pat_s[32];
        snprintf(pat_s, sizeof pat_s, ",%s,", mods[k]);
        char list[512];
        snprintf(list, sizeof list, ",%s,", targets);
        if (strstr(list, pat_s)) {
            on[k] = 1;
            json_object_array_add(tm, json_object_new_string(mods[k]));
        }
    }
    int qd = c.n_head * c.head_dim, kvd = c.n_kv_head * c.head_dim;
    int outs[7] = {qd, kvd, kvd, c.dim, c.n_ff, c.n_ff, c.dim}, ins[7] = {c.dim, c.dim, c.dim, qd, c.dim, c.dim, c.n_ff};
    static st_out_tensor ts[MAX_T];
    int n = 0;
    for (int l = 0; l < c.n_layer; l++)
        for (int k = 0; k < 7; k++) {
            if (!on[k] || !lay[l] || n + 2 > MAX_T)
                continue;
            char full[128];
            snprintf(full, sizeof full, "model.layers.%d.%s", l, paths[k]);
            const pat *pr = pat_find(ranks, n_ranks, full);
            int rk = pr ? (int)pr->v : r;
            for (int ab = 0; ab < 2; ab++) {
                st_out_tensor *t = &ts[n++];
                memset(t, 0, sizeof *t);
                snprintf(t->name, sizeof t->name, "base_model.model.%s.lora_%c.weight", full, ab ? 'B' : 'A');
                t->dtype = dt;
                t->n_dims = 2;
                t->shape[0] = ab ? outs[k] : rk;
                t->shape[1] = ab ? rk : ins[k];
            }
        }
    mkdir(out, 0755);
    char path[4096];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
    gen g = {ts, seed};
    if (st_write_file(path, ts, n, fill, &g, &err)) {
        fprintf(stderr, "make_lora: %s\n", err.msg);
        return 1;
    }
    json_object *o = json_object_new_object(), *rp = json_object_new_object(), *ap = json_object_new_object();
    for (int i = 0; i < n_ranks; i++)
        json_object_object_add(rp, ranks[i].key, json_object_new_int((int)ranks[i].v));
    for (int i = 0; i < n_alphas; i++)
        json_object_object_add(ap, alphas[i].key, json_object_new_double(alphas[i].v));
    json_object_object_add(o, "peft_type", json_object_new_string("LORA"));
    json_object_object_add(o, "task_type", json_object_new_string("CAUSAL_LM"));
    json_object_object_add(o, "base_model_name_or_path", NULL);
    json_object_object_add(o, "r", json_object_new_int(r));
    json_object_object_add(o, "lora_alpha", json_object_new_double(alpha));
    json_object_object_add(o, "lora_dropout", json_object_new_double(0.0));
    json_object_object_add(o, "target_modules", tm);
    json_object_object_add(o, "use_rslora", json_object_new_boolean(rslora));
    json_object_object_add(o, "rank_pattern", rp);
    json_object_object_add(o, "alpha_pattern", ap);
    json_object_object_add(o, "bias", json_object_new_string("none"));
    json_object_object_add(o, "fan_in_fan_out", json_object_new_boolean(0));
    json_object_object_add(o, "use_dora", json_object_new_boolean(0));
    json_object_object_add(o, "modules_to_save", NULL);
    json_object_object_add(o, "inference_mode", json_object_new_boolean(1));
    if (layers_s) {
        json_object *la = json_object_new_array();
        for (int l = 0; l < c.n_layer && l < 1024; l++)
            if (lay[l])
                json_object_array_add(la, json_object_new_int(l));
        json_object_object_add(o, "layers_to_transform", la);
    }
    snprintf(path, sizeof path, "%s/adapter_config.json", out);
    int rc = json_object_to_file_ext(path, o, JSON_C_TO_STRING_PRETTY) ? 1 : 0;
    if (rc)
        fprintf(stderr, "make_lora: cannot write %s\n", path);
    json_object_put(o);
    return rc;
}
