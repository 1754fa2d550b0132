/* sentence-transformers folders and pooling (see embed.h for the format).
 * What tern cannot reproduce exactly is a load error naming it, never a
 * module quietly skipped. */
#include "model/embed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "model/model_int.h"

const char *embed_pooling_name(embed_pooling p)
{
    switch (p) {
    case EMBED_POOL_LAST: return "lasttoken";
    case EMBED_POOL_MEAN: return "mean";
    case EMBED_POOL_CLS: return "cls";
    default: return "none";
    }
}

void embed_config_free(embed_config *c)
{
    if (!c)
        return;
    free(c->prompt);
    memset(c, 0, sizeof *c);
}

/* Parses DIR/NAME; *out NULL (and 0) when the file is absent and optional. */
static int read_json(const char *dir, const char *name, int required, json_object **out, tern_err *err)
{
    *out = NULL;
    char *path = tern_path_join(dir, name);
    if (!path)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    int rc = 0;
    if (!tern_file_exists(path)) {
        if (required)
            rc = tern_err_set(err, TERN_EFORMAT, "%s is missing", name);
    } else if (!(*out = tern_json_parse_file(path, err))) {
        rc = err && err->code ? err->code : TERN_EFORMAT;
    }
    free(path);
    return rc;
}

/* The Pooling module's config.json (under path). */
static int read_pooling(const char *dir, const char *path, int hidden, embed_config *c, tern_err *err)
{
    char name[512];
    snprintf(name, sizeof name, "%s/config.json", path);
    json_object *o;
    int rc = read_json(dir, name, 1, &o, err);
    if (rc)
        return rc;
    int64_t wdim;
    rc = tern_json_get_int(o, "word_embedding_dimension", &wdim, name, err);
    if (rc == 0 && wdim != hidden)
        rc = tern_err_set(err, TERN_EFORMAT, "%s: word_embedding_dimension %lld differs from the model's hidden size %d",
                          name, (long long)wdim, hidden);
    if (rc && rc != TERN_ENOTFOUND)
        goto out;
    static const struct {
        const char *key;
        embed_pooling mode; /* NONE: a mode tern does not implement */
    } modes[] = {
        {"pooling_mode_cls_token", EMBED_POOL_CLS},
        {"pooling_mode_mean_tokens", EMBED_POOL_MEAN},
        {"pooling_mode_lasttoken", EMBED_POOL_LAST},
        {"pooling_mode_max_tokens", EMBED_POOL_NONE},
        {"pooling_mode_mean_sqrt_len_tokens", EMBED_POOL_NONE},
        {"pooling_mode_weightedmean_tokens", EMBED_POOL_NONE},
    };
    const char *chosen = NULL;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        int on = 0;
        rc = tern_json_get_bool(o, modes[i].key, &on, name, err);
        if (rc == TERN_ENOTFOUND)
            continue;
        if (rc)
            goto out;
        if (!on)
            continue;
        if (modes[i].mode == EMBED_POOL_NONE) {
            rc = tern_err_set(err, TERN_EUNSUPPORTED,
                              "%s: %s is not supported (tern pools with cls_token, mean_tokens or lasttoken)", name,
                              modes[i].key);
            goto out;
        }
        if (chosen) {
            rc = tern_err_set(err, TERN_EUNSUPPORTED,
                              "%s: %s and %s are both set (concatenated poolings are not supported)", name, chosen,
                              modes[i].key);
            goto out;
        }
        chosen = modes[i].key;
        c->pooling = modes[i].mode;
    }
    rc = tern_json_get_bool(o, "include_prompt", &c->include_prompt, name, err);
    if (rc && rc != TERN_ENOTFOUND)
        goto out;
    rc = 0;
    if (!chosen) {
        const char *s;
        if (tern_json_get_str(o, "pooling_mode", &s, name, NULL) == 0)
            rc = tern_err_set(err, TERN_EUNSUPPORTED, "%s: pooling_mode '%s' is not supported", name, s);
        else
            rc = tern_err_set(err, TERN_EFORMAT, "%s: no pooling mode is set", name);
    }
out:
    json_object_put(o);
    return rc;
}

static int read_modules(const char *dir, int hidden, embed_config *c, tern_err *err)
{
    json_object *mods;
    int rc = read_json(dir, "modules.json", 0, &mods, err);
    if (rc)
        return rc;
    if (!mods)
        return TERN_ENOTFOUND;
    if (!json_object_is_type(mods, json_type_array)) {
        rc = tern_err_set(err, TERN_EFORMAT, "modules.json must be a list");
        goto out;
    }
    int have_tf = 0, have_pool = 0;
    for (size_t i = 0; i < json_object_array_length(mods); i++) {
        json_object *m = json_object_array_get_idx(mods, i);
        const char *type = NULL, *path = "";
        if (tern_json_get_str(m, "type", &type, "modules.json", err)) {
            rc = tern_err_set(err, TERN_EFORMAT, "modules.json: module %zu has no type", i);
            goto out;
        }
        if (tern_json_get_str(m, "path", &path, "modules.json", NULL))
            path = "";
        const char *kind = strrchr(type, '.') ? strrchr(type, '.') + 1 : type;
        if (!strcmp(kind, "Transformer") && i == 0 && !path[0]) {
            have_tf = 1;
        } else if (!strcmp(kind, "Pooling") && have_tf && !have_pool && path[0] && !strstr(path, "..")) {
            if ((rc = read_pooling(dir, path, hidden, c, err)))
                goto out;
            have_pool = 1;
        } else if (!strcmp(kind, "Normalize") && have_pool && !c->normalize) {
            c->normalize = 1;
        } else {
            rc = tern_err_set(err, TERN_EUNSUPPORTED,
                              "modules.json: module %zu (%s, path '%s') is not supported here; tern runs a "
                              "Transformer (path \"\"), one Pooling, then an optional Normalize",
                              i, type, path);
            goto out;
        }
    }
    if (!have_pool)
        rc = tern_err_set(err, TERN_EUNSUPPORTED, "modules.json has no Pooling module");
out:
    json_object_put(mods);
    return rc;
}

int embed_config_load(const char *dir, int hidden, embed_config *c, tern_err *err)
{
    memset(c, 0, sizeof *c);
    c->dim = hidden;
    c->include_prompt = 1;
    int rc = read_modules(dir, hidden, c, err);
    if (rc)
        goto fail;
    json_object *o;
    if ((rc = read_json(dir, "sentence_bert_config.json", 0, &o, err)))
        goto fail;
    if (o) {
        int64_t len;
        int lower = 0;
        rc = tern_json_get_int(o, "max_seq_length", &len, "sentence_bert_config.json", err);
        if (rc == 0 && len > 0)
            c->max_seq_length = len > (1 << 30) ? 1 << 30 : (int)len;
        if (rc == 0 || rc == TERN_ENOTFOUND)
            rc = tern_json_get_bool(o, "do_lower_case", &lower, "sentence_bert_config.json", err);
        if (rc == 0 && lower)
            rc = tern_err_set(err, TERN_EUNSUPPORTED, "sentence_bert_config.json: do_lower_case is not supported");
        json_object_put(o);
        if (rc && rc != TERN_ENOTFOUND)
            goto fail;
    }
    if ((rc = read_json(dir, "config_sentence_transformers.json", 0, &o, err)))
        goto fail;
    if (o) {
        const char *name = NULL, *text = NULL;
        json_object *prompts = NULL;
        rc = tern_json_get_str(o, "default_prompt_name", &name, "config_sentence_transformers.json", err);
        if (rc == 0) {
            if (!json_object_object_get_ex(o, "prompts", &prompts) || !prompts ||
                tern_json_get_str(prompts, name, &text, "config_sentence_transformers.json", NULL))
                rc = tern_err_set(err, TERN_EFORMAT,
                                  "config_sentence_transformers.json: default_prompt_name '%s' is not in prompts",
                                  name);
            else if (text[0] && !(c->prompt = strdup(text)))
                rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        }
        json_object_put(o);
        if (rc && rc != TERN_ENOTFOUND)
            goto fail;
    }
    if (c->prompt && !c->include_prompt) { /* pooling without the prompt's tokens: not implemented */
        rc = tern_err_set(err, TERN_EUNSUPPORTED,
                          "include_prompt false with a default prompt is not supported (the prompt's tokens "
                          "would be left out of the pooling)");
        goto fail;
    }
    return 0;
fail:
    embed_config_free(c);
    return rc;
}

int model_hidden_supported(const tern_model *m)
{
    return m && m->be && !m->be->forward;
}

int model_hidden_dim(const tern_model *m)
{
    return m->cfg.dim;
}

int embed_pool_init(embed_pool *p, embed_pooling mode, int dim)
{
    memset(p, 0, sizeof *p);
    p->mode = mode;
    p->dim = dim;
    p->acc = calloc((size_t)dim, sizeof *p->acc);
    return p->acc ? 0 : TERN_ENOMEM;
}

int embed_pool_wants(embed_pooling mode, int pos, int n)
{
    switch (mode) {
    case EMBED_POOL_MEAN: return 1;
    case EMBED_POOL_CLS: return pos == 0;
    case EMBED_POOL_LAST: return pos == n - 1;
    default: return 0;
    }
}

void embed_pool_add(embed_pool *p, const float *h)
{
    if (p->mode == EMBED_POOL_MEAN)
        for (int i = 0; i < p->dim; i++)
            p->acc[i] += h[i];
    else
        for (int i = 0; i < p->dim; i++)
            p->acc[i] = h[i];
    p->n++;
}

void embed_l2_normalize(float *v, int n)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += (double)v[i] * v[i];
    if (ss <= 0)
        return;
    double r = 1.0 / sqrt(ss);
    for (int i = 0; i < n; i++)
        v[i] = (float)(v[i] * r);
}

void embed_pool_finish(const embed_pool *p, int normalize, float *out)
{
    double div = p->mode == EMBED_POOL_MEAN && p->n > 0 ? (double)p->n : 1.0;
    for (int i = 0; i < p->dim; i++)
        out[i] = (float)(p->acc[i] / div);
    if (normalize)
        embed_l2_normalize(out, p->dim);
}

void embed_pool_free(embed_pool *p)
{
    if (!p)
        return;
    free(p->acc);
    memset(p, 0, sizeof *p);
}
