/* Loading DIR/tokenizer.json (+ DIR/tokenizer_config.json) into a
 * tern_tokenizer, and the small accessors of tokenizer.h.
 *
 * tokenizer.json (HF `tokenizers` serialization) fields used:
 *   model          {type: BPE|WordPiece|Unigram, vocab, merges, unk_token,
 *                   byte_fallback, fuse_unk, ignore_merges,
 *                   continuing_subword_prefix, end_of_word_suffix, ...}
 *   added_tokens   [{id, content, special, lstrip, rstrip, single_word,
 *                    normalized}]
 *   normalizer, pre_tokenizer, post_processor, decoder: tagged objects
 *                  ({"type": ...}); an unknown type is a load error.
 * tokenizer_config.json: add_bos_token, add_eos_token, bos_token,
 *   eos_token (string or {content}), chat_template (string or list). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "base/file.h"
#include "base/json.h"
#include "tok_fast.h"

/* Ids beyond this are rejected: no real vocabulary comes close, and it
 * bounds the id-indexed arrays a malformed file could make us allocate. */
#define TOK_MAX_ID (1 << 24)

static json_object *jget(json_object *o, const char *k)
{
    json_object *v = NULL;
    return o && json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, k, &v) ? v : NULL;
}

static int jbool(json_object *o, const char *k, int dflt)
{
    json_object *v = jget(o, k);
    return v && json_object_is_type(v, json_type_boolean) ? json_object_get_boolean(v) : dflt;
}

static const char *jstr(json_object *o, const char *k)
{
    json_object *v = jget(o, k);
    return v && json_object_is_type(v, json_type_string) ? json_object_get_string(v) : NULL;
}

static char *xstrdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *r = malloc(n + 1);
    if (r)
        memcpy(r, s, n + 1);
    return r;
}

void tokenizer_free(tern_tokenizer *t)
{
    if (!t)
        return;
    free(t->id_str);
    free(t->id_len);
    free(t->id_flags);
    free(t->strings);
    tok_map_free(&t->vocab);
    tok_map_free(&t->added_map);
    tok_merges_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    free(t->scores);
    tok_norm_free(t->norm);
    tok_pre_free(t->pre);
    tok_dec_free(t->dec);
    free(t->post.pre_ids);
    free(t->post.post_ids);
    for (size_t i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    free(t->bos_str);
    free(t->eos_str);
    free(t->chat_template);
    if (t->tb_str)
        free(t->tb_str[0] ? t->tb_str[0] : NULL);
    free(t->tb_str);
    free(t->tb_len);
    tok_cache_free(t->cache);
    free(t);
}

/* ---- model ------------------------------------------------------------- */
static int parse_id(json_object *v, int32_t *id)
{
    if (!v || !json_object_is_type(v, json_type_int))
        return -1;
    int64_t x = json_object_get_int64(v);
    if (x < 0 || x >= TOK_MAX_ID)
        return -1;
    *id = (int32_t)x;
    return 0;
}

/* Object vocabulary (BPE, WordPiece) as a flat list, when the fast
 * scanner did not already produce it. */
static int vocab_from_json(json_object *vocab, tok_vlist *out, tern_err *err)
{
    json_object_object_foreach(vocab, key, val)
    {
        int32_t id;
        if (parse_id(val, &id))
            return tern_err_set(err, TERN_EFORMAT, "model.vocab['%.60s'] must be an id in [0, %d)", key, TOK_MAX_ID);
        size_t n = strlen(key), off = out->text.len;
        if (tok_buf_add(&out->text, key, n + 1))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        if (out->n == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 1024;
            tok_vent *v = realloc(out->v, cap * sizeof *v);
            if (!v)
                return tern_err_set(err, TERN_ENOMEM, "out of memory");
            out->v = v;
            out->cap = cap;
        }
        out->v[out->n++] = (tok_vent){off, (uint32_t)n, id};
    }
    return 0;
}

/* Fills id_str/id_len/vocab from the model vocabulary (vl, or the Unigram
 * array in model.vocab) and the added tokens. */
static int load_vocab(tern_tokenizer *t, json_object *model, json_object *added, tok_vlist *vl, tern_err *err)
{
    json_object *vocab = jget(model, "vocab");
    int unigram = t->model_type == MODEL_UNIGRAM;
    size_t total = 0, n_vocab = 0;
    int32_t max_id = -1;
    int rc;
    if (unigram) {
        if (!vocab || !json_object_is_type(vocab, json_type_array))
            return tern_err_set(err, TERN_EFORMAT, "model.vocab must be an array");
        n_vocab = json_object_array_length(vocab);
        if (n_vocab >= TOK_MAX_ID)
            return tern_err_set(err, TERN_EFORMAT, "model.vocab is too large");
        for (size_t i = 0; i < n_vocab; i++) {
            json_object *e = json_object_array_get_idx(vocab, i);
            json_object *p = e && json_object_is_type(e, json_type_array) ? json_object_array_get_idx(e, 0) : NULL;
            json_object *sc = e && json_object_is_type(e, json_type_array) ? json_object_array_get_idx(e, 1) : NULL;
            if (!p || !json_object_is_type(p, json_type_string) || !sc ||
                !(json_object_is_type(sc, json_type_double) || json_object_is_type(sc, json_type_int)))
                return tern_err_set(err, TERN_EFORMAT, "model.vocab[%zu] must be [piece, score]", i);
            total += (size_t)json_object_get_string_len(p) + 1;
        }
        max_id = (int32_t)n_vocab - 1;
    } else {
        if (!vl->v && vocab && !json_object_is_type(vocab, json_type_object))
            return tern_err_set(err, TERN_EFORMAT, "model.vocab must be an object");
        if (!vl->v && vocab && (rc = vocab_from_json(vocab, vl, err)))
            return rc;
        for (size_t i = 0; i < vl->n; i++)
            if (vl->v[i].id > max_id)
                max_id = vl->v[i].id;
        n_vocab = vl->n;
    }
    size_t n_added = added ? json_object_array_length(added) : 0;
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i);
        int32_t id;
        json_object *c = jget(a, "content");
        if (parse_id(jget(a, "id"), &id) || !c || !json_object_is_type(c, json_type_string))
            return tern_err_set(err, TERN_EFORMAT, "added_tokens[%zu] needs an id and a content string", i);
        if (id > max_id)
            max_id = id;
    }
    t->n_ids = max_id + 1;
    size_t nn = t->n_ids > 0 ? (size_t)t->n_ids : 1;
    t->id_str = calloc(nn, sizeof *t->id_str);
    t->id_len = calloc(nn, sizeof *t->id_len);
    t->id_flags = calloc(nn, 1);
    t->added = calloc(n_added ? n_added : 1, sizeof *t->added);
    if (unigram) {
        t->scores = calloc(nn, sizeof *t->scores);
        t->strings = malloc(total + 1);
    } else { /* the list's text becomes the string arena */
        if (tok_buf_add(&vl->text, "", 0)) /* never NULL */
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        t->strings = vl->text.p;
        vl->text.p = NULL;
        vl->text.len = vl->text.cap = 0;
    }
    if (!t->id_str || !t->id_len || !t->id_flags || !t->strings || !t->added || (unigram && !t->scores) ||
        tok_map_init(&t->vocab, n_vocab) || tok_map_init(&t->added_map, n_added))
        return tern_err_set(err, TERN_ENOMEM, "out of memory loading the vocabulary");
    if (unigram) {
        char *w = t->strings;
        t->min_score = 1e300;
        for (size_t i = 0; i < n_vocab; i++) {
            json_object *e = json_object_array_get_idx(vocab, i);
            json_object *p = json_object_array_get_idx(e, 0);
            size_t n = (size_t)json_object_get_string_len(p);
            memcpy(w, json_object_get_string(p), n + 1);
            t->id_str[i] = w;
            t->id_len[i] = (uint32_t)n;
            t->scores[i] = json_object_get_double(json_object_array_get_idx(e, 1));
            if (t->scores[i] < t->min_score)
                t->min_score = t->scores[i];
            if (n > t->max_piece_len)
                t->max_piece_len = n;
            if (tok_map_get(&t->vocab, w, n) < 0 && tok_map_put(&t->vocab, w, n, (int32_t)i))
                return tern_err_set(err, TERN_ENOMEM, "out of memory");
            w += n + 1;
        }
    } else {
        for (size_t i = 0; i < vl->n; i++) {
            tok_vent e = vl->v[i];
            char *w = t->strings + e.off;
            if (t->id_str[e.id]) /* two pieces for one id: decoding could not tell them apart */
                return tern_err_set(err, TERN_EFORMAT, "model.vocab: '%.60s' and '%.60s' both have id %d",
                                    t->id_str[e.id], w, e.id);
            t->id_str[e.id] = w;
            t->id_len[e.id] = e.len;
            if (tok_map_put(&t->vocab, w, e.len, e.id))
                return tern_err_set(err, TERN_ENOMEM, "out of memory");
        }
    }
    for (size_t i = 0; i < n_added; i++) {
        json_object *a = json_object_array_get_idx(added, i);
        json_object *c = jget(a, "content");
        size_t n = (size_t)json_object_get_string_len(c);
        int32_t id = (int32_t)json_object_get_int64(jget(a, "id"));
        tok_added *x = &t->added[t->n_added++];
        x->content = malloc(n + 1);
        if (!x->content)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        memcpy(x->content, json_object_get_string(c), n + 1);
        /* HF gives an added token the model's id when the model knows it */
        int32_t mid = tok_map_get(&t->vocab, x->content, n);
        if (mid >= 0)
            id = mid;
        int32_t aid = (int32_t)tok_map_get(&t->added_map, x->content, n);
        if (aid < 0 && (t->id_flags[id] & 2)) /* another added token already holds this id */
            return tern_err_set(err, TERN_EFORMAT, "added_tokens[%zu]: '%.60s' and '%.60s' both have id %d", i,
                                t->id_str[id], x->content, id);
        x->id = id;
        x->len = n;
        x->special = (uint8_t)jbool(a, "special", 0);
        x->lstrip = (uint8_t)jbool(a, "lstrip", 0);
        x->rstrip = (uint8_t)jbool(a, "rstrip", 0);
        x->single_word = (uint8_t)jbool(a, "single_word", 0);
        x->normalized = (uint8_t)jbool(a, "normalized", !x->special);
        t->id_str[id] = x->content;
        t->id_len[id] = (uint32_t)n;
        t->id_flags[id] = (uint8_t)(2 | (x->special ? 1 : 0));
        if (tok_map_put(&t->added_map, x->content, n, id))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    return 0;
}

static int opt_affix(json_object *model, const char *key, char **out, size_t *len)
{
    const char *s = jstr(model, key);
    if (!s || !*s)
        return 0;
    *out = xstrdup(s);
    *len = strlen(s);
    return *out ? 0 : TERN_ENOMEM;
}

/* Merges as a flat list, when the fast scanner did not produce them. */
static int merges_from_json(json_object *m, tok_mlist *out, tern_err *err)
{
    size_t n = json_object_array_length(m);
    out->v = malloc((n ? n : 1) * sizeof *out->v);
    if (!out->v)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    out->cap = n ? n : 1;
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(m, i);
        const char *a = NULL, *c = NULL;
        size_t al = 0, cl = 0;
        if (e && json_object_is_type(e, json_type_string)) {
            a = json_object_get_string(e);
            const char *sp = strchr(a, ' ');
            if (sp) {
                al = (size_t)(sp - a);
                c = sp + 1;
                cl = strlen(c);
            }
        } else if (e && json_object_is_type(e, json_type_array) && json_object_array_length(e) == 2) {
            json_object *x = json_object_array_get_idx(e, 0), *y = json_object_array_get_idx(e, 1);
            if (json_object_is_type(x, json_type_string) && json_object_is_type(y, json_type_string)) {
                a = json_object_get_string(x);
                al = (size_t)json_object_get_string_len(x);
                c = json_object_get_string(y);
                cl = (size_t)json_object_get_string_len(y);
            }
        }
        if (!a || !c)
            return tern_err_set(err, TERN_EFORMAT, "model.merges[%zu] must be \"a b\" or [a, b]", i);
        size_t ao = out->text.len;
        if (tok_buf_add(&out->text, a, al) || tok_buf_addc(&out->text, 0))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        size_t co = out->text.len;
        if (tok_buf_add(&out->text, c, cl) || tok_buf_addc(&out->text, 0))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        out->v[out->n++] = (tok_ment){ao, (uint32_t)al, co, (uint32_t)cl};
    }
    return 0;
}

static int load_merges(tern_tokenizer *t, json_object *model, tok_mlist *ml, tern_err *err)
{
    json_object *m = jget(model, "merges");
    int rc;
    if (!ml->v && m && json_object_is_type(m, json_type_array) && (rc = merges_from_json(m, ml, err)))
        return rc;
    if (tok_merges_init(&t->merges, ml->n))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    tok_buf b = {0};
    size_t skip = t->cont_prefix_len;
    for (size_t i = 0; i < ml->n; i++) {
        const char *a = ml->text.p + ml->v[i].a, *c = ml->text.p + ml->v[i].b;
        size_t al = ml->v[i].al, cl = ml->v[i].bl;
        int32_t ia, ic, inew = -1;
        b.len = 0;
        ia = tok_map_get(&t->vocab, a, al);
        ic = tok_map_get(&t->vocab, c, cl);
        if (ia >= 0 && ic >= 0 && cl >= skip) {
            if (tok_buf_add(&b, a, al) || tok_buf_add(&b, c + skip, cl - skip)) {
                tok_buf_free(&b);
                return tern_err_set(err, TERN_ENOMEM, "out of memory");
            }
            inew = tok_map_get(&t->vocab, b.p, b.len);
        }
        if (inew < 0) {
            tok_buf_free(&b);
            return tern_err_set(err, TERN_EFORMAT, "model.merges[%zu]: '%.*s' + '%.*s' is not in the vocabulary", i,
                                (int)(al > 40 ? 40 : al), a, (int)(cl > 40 ? 40 : cl), c);
        }
        if (tok_merges_put(&t->merges, ia, ic, (uint32_t)i, inew)) {
            tok_buf_free(&b);
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        }
    }
    tok_buf_free(&b);
    return 0;
}

static int load_model(tern_tokenizer *t, json_object *root, tok_vlist *vl, tok_mlist *ml, tern_err *err)
{
    json_object *model = jget(root, "model");
    if (!model)
        return tern_err_set(err, TERN_EFORMAT, "tokenizer.json has no 'model'");
    const char *type = jstr(model, "type");
    if (!type) /* old files omit the tag; HF infers it from the fields */
        type = jget(model, "merges") ? "BPE" : jget(model, "max_input_chars_per_word") ? "WordPiece" : "Unigram";
    if (!strcmp(type, "BPE"))
        t->model_type = MODEL_BPE;
    else if (!strcmp(type, "WordPiece"))
        t->model_type = MODEL_WORDPIECE;
    else if (!strcmp(type, "Unigram"))
        t->model_type = MODEL_UNIGRAM;
    else
        return tern_err_set(err, TERN_EUNSUPPORTED, "unsupported model type '%s'", type);
    json_object *added = jget(root, "added_tokens");
    if (added && !json_object_is_type(added, json_type_array))
        return tern_err_set(err, TERN_EFORMAT, "added_tokens must be an array");
    int rc = load_vocab(t, model, added, vl, err);
    if (rc)
        return rc;
    t->unk_id = -1;
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = t->byte_fallback ? tok_map_get(&t->vocab, name, 6) : -1;
    }
    if (t->model_type == MODEL_UNIGRAM) {
        json_object *u = jget(model, "unk_id");
        int32_t id;
        if (u && !parse_id(u, &id) && id < t->n_ids)
            t->unk_id = id;
        return 0;
    }
    const char *unk = jstr(model, "unk_token");
    if (unk)
        t->unk_id = tok_map_get(&t->vocab, unk, strlen(unk));
    if (opt_affix(model, "continuing_subword_prefix", &t->cont_prefix, &t->cont_prefix_len) ||
        opt_affix(model, "end_of_word_suffix", &t->eow_suffix, &t->eow_suffix_len))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    if (t->model_type == MODEL_WORDPIECE) {
        json_object *m = jget(model, "max_input_chars_per_word");
        t->max_input_chars = m && json_object_is_type(m, json_type_int) ? (int)json_object_get_int(m) : 100;
        if (!t->cont_prefix && !(t->cont_prefix = xstrdup("##")))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        t->cont_prefix_len = strlen(t->cont_prefix);
        return 0;
    }
    t->fuse_unk = jbool(model, "fuse_unk", 0);
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    return load_merges(t, model, ml, err);
}

/* ---- post-processor ---------------------------------------------------- */
static int ids_append(int32_t **v, size_t *n, int32_t id)
{
    int32_t *p = realloc(*v, (*n + 1) * sizeof *p);
    if (!p)
        return TERN_ENOMEM;
    p[(*n)++] = id;
    *v = p;
    return 0;
}

static int load_post(tern_tokenizer *t, json_object *o, tern_err *err)
{
    if (!o)
        return 0;
    const char *type = jstr(o, "type");
    if (!type)
        return tern_err_set(err, TERN_EFORMAT, "post_processor without a type");
    if (!strcmp(type, "ByteLevel"))
        return 0;
    if (!strcmp(type, "Sequence")) {
        json_object *arr = jget(o, "processors");
        if (!arr || !json_object_is_type(arr, json_type_array))
            return tern_err_set(err, TERN_EFORMAT, "post_processor Sequence needs 'processors'");
        for (size_t i = 0; i < json_object_array_length(arr); i++) {
            int rc = load_post(t, json_object_array_get_idx(arr, i), err);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_object *cls = jget(o, "cls"), *sep = jget(o, "sep");
        int32_t ci, si;
        if (!cls || !sep || !json_object_is_type(cls, json_type_array) || !json_object_is_type(sep, json_type_array) ||
            parse_id(json_object_array_get_idx(cls, 1), &ci) || parse_id(json_object_array_get_idx(sep, 1), &si))
            return tern_err_set(err, TERN_EFORMAT, "post_processor %s needs cls and sep [token, id]", type);
        t->post.present = 1;
        if (ids_append(&t->post.pre_ids, &t->post.n_pre, ci) || ids_append(&t->post.post_ids, &t->post.n_post, si))
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        return 0;
    }
    if (!strcmp(type, "TemplateProcessing")) {
        json_object *single = jget(o, "single"), *special = jget(o, "special_tokens");
        if (!single || !json_object_is_type(single, json_type_array))
            return tern_err_set(err, TERN_EFORMAT, "post_processor TemplateProcessing needs 'single'");
        t->post.present = 1;
        int seen_seq = 0;
        for (size_t i = 0; i < json_object_array_length(single); i++) {
            json_object *it = json_object_array_get_idx(single, i);
            if (jget(it, "Sequence")) {
                seen_seq = 1;
                continue;
            }
            const char *name = jstr(jget(it, "SpecialToken"), "id");
            json_object *ids = jget(jget(special, name ? name : ""), "ids");
            if (!name || !ids || !json_object_is_type(ids, json_type_array))
                return tern_err_set(err, TERN_EFORMAT, "post_processor template item %zu: unknown special token '%s'", i,
                                    name ? name : "?");
            for (size_t k = 0; k < json_object_array_length(ids); k++) {
                int32_t id;
                if (parse_id(json_object_array_get_idx(ids, k), &id))
                    return tern_err_set(err, TERN_EFORMAT, "post_processor special token '%s': bad id", name);
                if (seen_seq ? ids_append(&t->post.post_ids, &t->post.n_post, id)
                             : ids_append(&t->post.pre_ids, &t->post.n_pre, id))
                    return tern_err_set(err, TERN_ENOMEM, "out of memory");
            }
        }
        return 0;
    }
    return tern_err_set(err, TERN_EUNSUPPORTED, "unsupported post_processor type '%s'", type);
}

/* ---- tokenizer_config.json --------------------------------------------- */
static const char *token_field(json_object *cfg, const char *key)
{
    json_object *v = jget(cfg, key);
    if (v && json_object_is_type(v, json_type_string))
        return json_object_get_string(v);
    return jstr(v, "content");
}

static int load_config(tern_tokenizer *t, const char *dir, tern_err *err)
{
    char *path = tern_path_join(dir, "tokenizer_config.json");
    if (!path)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    json_object *cfg = NULL;
    if (tern_file_exists(path)) {
        cfg = tern_json_parse_file(path, err);
        if (!cfg) {
            free(path);
            return err ? err->code : TERN_EFORMAT;
        }
    }
    free(path);
    int rc = 0;
    const char *bos = token_field(cfg, "bos_token"), *eos = token_field(cfg, "eos_token");
    if ((bos && !(t->bos_str = xstrdup(bos))) || (eos && !(t->eos_str = xstrdup(eos))))
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    t->bos_id = bos ? tokenizer_token_id(t, bos) : -1;
    t->eos_id = eos ? tokenizer_token_id(t, eos) : -1;
    if (t->bos_id < 0 && t->post.n_pre > 0)
        t->bos_id = t->post.pre_ids[0];
    if (t->eos_id < 0 && t->post.n_post > 0)
        t->eos_id = t->post.post_ids[t->post.n_post - 1];
    /* add_bos_token/add_eos_token apply only where the post-processor
     * does not already decide the special tokens. */
    if (!rc && !t->post.present) {
        if (jbool(cfg, "add_bos_token", 0) && t->bos_id >= 0 && ids_append(&t->post.pre_ids, &t->post.n_pre, t->bos_id))
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        if (jbool(cfg, "add_eos_token", 0) && t->eos_id >= 0 &&
            ids_append(&t->post.post_ids, &t->post.n_post, t->eos_id))
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    json_object *ct = jget(cfg, "chat_template");
    const char *tmpl = NULL;
    if (ct && json_object_is_type(ct, json_type_string))
        tmpl = json_object_get_string(ct);
    else if (ct && json_object_is_type(ct, json_type_array))
        for (size_t i = 0; i < json_object_array_length(ct); i++) {
            json_object *e = json_object_array_get_idx(ct, i);
            const char *name = jstr(e, "name");
            if (name && !strcmp(name, "default"))
                tmpl = jstr(e, "template");
        }
    if (!rc && tmpl && !(t->chat_template = xstrdup(tmpl)))
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
    if (!rc && !t->chat_template) { /* newer exports keep it in its own file */
        char *p = tern_path_join(dir, "chat_template.jinja");
        if (p && tern_file_exists(p)) {
            size_t n;
            t->chat_template = tern_file_read(p, &n, 1 << 24, NULL);
        }
        free(p);
    }
    json_object_put(cfg);
    return rc;
}

/* ---- entry ------------------------------------------------------------- */
/* Builds a tokenizer from tokenizer.json text (buf, NUL-terminated, taken
 * and freed) and, when dir is not NULL, dir/tokenizer_config.json. */
static tern_tokenizer *load_buf(char *buf, size_t len, const char *dir, tern_err *err)
{
    tern_tokenizer *t = NULL;
    json_object *root = NULL;
    tok_vlist vl = {0};
    tok_mlist ml = {0};
    int rc = 0;
    tok_fast_scan(buf, &len, &vl, &ml);
    root = tern_json_parse(buf, len, err);
    free(buf);
    if (!root)
        goto out;
    t = calloc(1, sizeof *t);
    if (!t) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    t->bos_id = t->eos_id = -1;
    if (!json_object_is_type(root, json_type_object)) {
        rc = tern_err_set(err, TERN_EFORMAT, "top level is not an object");
        goto out;
    }
    if ((rc = load_model(t, root, &vl, &ml, err)) || (rc = tok_norm_parse(&t->norm, jget(root, "normalizer"), err)) ||
        (rc = tok_pre_parse(&t->pre, jget(root, "pre_tokenizer"), err)) ||
        (rc = tok_dec_parse(&t->dec, jget(root, "decoder"), err)) ||
        (rc = load_post(t, jget(root, "post_processor"), err)))
        goto out;
    for (size_t i = 0; i < t->post.n_pre + t->post.n_post; i++) {
        int32_t id = i < t->post.n_pre ? t->post.pre_ids[i] : t->post.post_ids[i - t->post.n_pre];
        if (id >= t->n_ids) { /* HF would emit it; the model could not embed it */
            rc = tern_err_set(err, TERN_EFORMAT, "post_processor special token id %d is outside the vocabulary (%d ids)",
                              id, t->n_ids);
            goto out;
        }
    }
    if ((rc = tok_trie_build(&t->trie_raw, t, 0, NULL, err)) ||
        (rc = tok_trie_build(&t->trie_norm, t, 1, t->norm, err)))
        goto out;
    json_object_put(root);
    root = NULL;
    if (dir && (rc = load_config(t, dir, err)))
        goto out;
    {
        size_t nn = t->n_ids > 0 ? (size_t)t->n_ids : 1;
        size_t *offs = malloc(nn * sizeof *offs);
        tok_buf arena = {0};
        t->tb_str = calloc(nn, sizeof *t->tb_str);
        t->tb_len = calloc(nn, sizeof *t->tb_len);
        if (!offs || !t->tb_str || !t->tb_len || tok_token_bytes_build(t, &arena, offs) ||
            tok_buf_add(&arena, "", 0)) {
            free(offs);
            tok_buf_free(&arena);
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto out;
        }
        /* tb_str[0] always points at the arena start so free() finds it */
        for (int32_t i = 0; i < t->n_ids; i++)
            t->tb_str[i] = t->id_str[i] || i == 0 ? arena.p + offs[i] : NULL;
        if (t->n_ids == 0)
            t->tb_str[0] = arena.p;
        free(offs);
    }
    t->cache = tok_cache_new();
    if (!t->cache)
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
out:
    json_object_put(root);
    tok_vlist_free(&vl);
    tok_mlist_free(&ml);
    if (rc && t) {
        tokenizer_free(t);
        t = NULL;
    }
    return t;
}

tern_tokenizer *tokenizer_load(const char *dir, tern_err *err)
{
    if (!dir)
        return tern_err_set(err, TERN_EINVAL, "tokenizer_load: no directory"), NULL;
    char *path = tern_path_join(dir, "tokenizer.json");
    if (!path)
        return tern_err_set(err, TERN_ENOMEM, "out of memory"), NULL;
    size_t len;
    char *buf = tern_file_read(path, &len, 0, err);
    tern_tokenizer *t = buf ? load_buf(buf, len, dir, err) : NULL;
    if (!t && buf)
        tern_err_wrap(err, "%s", path);
    free(path);
    return t;
}

tern_tokenizer *tokenizer_load_json(const char *json, size_t len, tern_err *err)
{
    if (!json)
        return tern_err_set(err, TERN_EINVAL, "tokenizer_load_json: no text"), NULL;
    char *buf = malloc(len + 1);
    if (!buf)
        return tern_err_set(err, TERN_ENOMEM, "out of memory"), NULL;
    memcpy(buf, json, len);
    buf[len] = 0;
    return load_buf(buf, len, NULL, err);
}

/* ---- accessors --------------------------------------------------------- */
int32_t tokenizer_vocab_size(const tern_tokenizer *tok) { return tok ? tok->n_ids : 0; }

const char *tokenizer_token_str(const tern_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->n_ids ? tok->id_str[id] : NULL;
}

int32_t tokenizer_token_id(const tern_tokenizer *tok, const char *str)
{
    if (!tok || !str)
        return -1;
    size_t n = strlen(str);
    int32_t id = tok_map_get(&tok->added_map, str, n);
    return id >= 0 ? id : tok_map_get(&tok->vocab, str, n);
}

int tokenizer_is_special(const tern_tokenizer *tok, int32_t id)
{
    return tok && id >= 0 && id < tok->n_ids && (tok->id_flags[id] & 1);
}

int32_t tokenizer_bos_id(const tern_tokenizer *tok) { return tok ? tok->bos_id : -1; }
int32_t tokenizer_eos_id(const tern_tokenizer *tok) { return tok ? tok->eos_id : -1; }
const char *tokenizer_bos_str(const tern_tokenizer *tok) { return tok ? tok->bos_str : NULL; }
const char *tokenizer_eos_str(const tern_tokenizer *tok) { return tok ? tok->eos_str : NULL; }
const char *tokenizer_chat_template(const tern_tokenizer *tok) { return tok ? tok->chat_template : NULL; }
