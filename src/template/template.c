/* Public entry points: parse (lex + parse into an arena the template owns),
 * render (a fresh arena per call, freed on return), and the chat layer that
 * loads tokenizer_config.json and builds transformers' render context. */
#include "template.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/file.h"
#include "base/json.h"
#include "tpl_int.h"

struct tern_template {
    tpl_arena arena; /* owns src, tokens and AST */
    char *src;       /* normalized source */
    size_t src_len;
    tpl_body body;
};

/* jinja2 reads templates with universal newlines and, with
 * keep_trailing_newline off, drops one trailing newline. */
static char *normalize(const char *src, size_t len, size_t *out_len)
{
    char *s = malloc(len + 1);
    if (!s)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n')
        n--;
    s[n] = '\0';
    *out_len = n;
    return s;
}

/* The setjmp lives in its own frame so no local of the caller is live
 * across the longjmp. */
static int parse_guarded(tpl_ctx *c, tern_template *t)
{
    if (setjmp(c->jb))
        return -1;
    tok_array toks = {0};
    tpl_lex(c, t->src, t->src_len, &toks);
    tpl_parse(c, &toks, &t->body);
    return 0;
}

tern_template *tern_template_parse(const char *src, size_t len, tern_err *err)
{
    tern_template *t = calloc(1, sizeof *t);
    if (!t) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    t->src = normalize(src ? src : "", src ? len : 0, &t->src_len);
    tpl_ctx *c = malloc(sizeof *c);
    if (!t->src || !c) {
        free(c);
        free(t->src);
        free(t);
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    t->arena.limit = 64 * t->src_len + (16u << 20); /* AST is a small multiple of the source */
    c->err = err;
    c->arena = &t->arena;
    c->src = t->src;
    c->src_len = t->src_len;
    int rc = parse_guarded(c, t);
    free(c);
    if (rc) {
        tern_template_free(t);
        return NULL;
    }
    return t;
}

void tern_template_free(tern_template *t)
{
    if (!t)
        return;
    tpl_arena_free(&t->arena);
    free(t->src);
    free(t);
}

void tern_template_line_col(const tern_template *t, long pos, long *line, long *col)
{
    *line = 1;
    *col = 1;
    for (long i = 0; t && i < pos && (size_t)i < t->src_len; i++) {
        if (t->src[i] == '\n') {
            (*line)++;
            *col = 1;
        } else if (((unsigned char)t->src[i] & 0xC0) != 0x80) {
            (*col)++;
        }
    }
}

static int render_guarded(tpl_render *r, const tern_template *t, json_object *ctx)
{
    if (setjmp(r->c.jb))
        return -1;
    tframe *g = tpl_alloc(&r->c, sizeof *g);
    g->parent = NULL;
    g->vars = tdict_new(&r->c, 8);
    tpl_add_globals(r, g->vars);
    r->globals = g;
    tframe *root = tpl_alloc(&r->c, sizeof *root);
    root->parent = g;
    root->vars = tdict_new(&r->c, 16);
    if (ctx) {
        json_object_object_foreach(ctx, k, v) {
            tdict_set(&r->c, root->vars, tv_str(tstr_cstr(&r->c, k)), tv_from_json(&r->c, v));
        }
    }
    tpl_exec_body(r, t->body.stmts, t->body.n, root);
    return 0;
}

char *tern_template_render(const tern_template *t, json_object *ctx, const tern_template_limits *lim,
                           size_t *len_out, tern_err *err)
{
    if (!t) {
        tern_err_set(err, TERN_EINVAL, "no template");
        return NULL;
    }
    if (ctx && !json_object_is_type(ctx, json_type_object)) {
        tern_err_set(err, TERN_EINVAL, "template context must be a JSON object");
        return NULL;
    }
    tern_template_limits l = lim ? *lim : (tern_template_limits){0};
    if (!l.max_output) l.max_output = 16u << 20;
    if (!l.max_memory) l.max_memory = 256u << 20;
    if (!l.max_steps) l.max_steps = 10000000;
    if (!l.max_depth) l.max_depth = 100;

    /* heap-allocated: the jmp_buf and state must outlive nothing but this call,
     * and keeping them off the stack keeps the render's frame small */
    tpl_render *r = calloc(1, sizeof *r);
    tpl_arena *arena = calloc(1, sizeof *arena);
    tbuf *out = calloc(1, sizeof *out);
    if (!r || !arena || !out) {
        free(r);
        free(arena);
        free(out);
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    arena->limit = l.max_memory;
    r->c.err = err;
    r->c.arena = arena;
    r->c.src = t->src;
    r->c.src_len = t->src_len;
    r->max_steps = l.max_steps;
    r->max_depth = l.max_depth;
    r->max_output = l.max_output;
    r->now = (long)time(NULL);
    out->limit = l.max_output;
    r->out = out;
    char *result = NULL;
    if (render_guarded(r, t, ctx))
        goto out_free;
    result = malloc(out->len + 1);
    if (!result) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out_free;
    }
    if (out->len)
        memcpy(result, out->p, out->len);
    result[out->len] = '\0';
    if (len_out)
        *len_out = out->len;
out_free:
    tpl_arena_free(arena);
    free(arena);
    free(out);
    free(r);
    return result;
}

/* ---- chat layer ---------------------------------------------------------- */

static const char *const special_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                            "pad_token", "cls_token", "mask_token", NULL};

/* A special token is a string or an AddedToken dict {"content": ...}. */
static const char *token_str(json_object *v)
{
    if (json_object_is_type(v, json_type_string))
        return json_object_get_string(v);
    json_object *c;
    if (json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "content", &c) &&
        json_object_is_type(c, json_type_string))
        return json_object_get_string(c);
    return NULL;
}

static json_object *special_tokens(json_object *config)
{
    json_object *sp = json_object_new_object();
    if (!sp || !config)
        return sp;
    for (int i = 0; special_names[i]; i++) {
        json_object *v;
        const char *s;
        if (json_object_object_get_ex(config, special_names[i], &v) && (s = token_str(v)))
            json_object_object_add(sp, special_names[i], json_object_new_string(s));
    }
    json_object *extra;
    if (json_object_object_get_ex(config, "additional_special_tokens", &extra) &&
        json_object_is_type(extra, json_type_array)) {
        json_object *arr = json_object_new_array();
        for (size_t i = 0; i < json_object_array_length(extra); i++) {
            const char *s = token_str(json_object_array_get_idx(extra, i));
            if (s)
                json_object_array_add(arr, json_object_new_string(s));
        }
        json_object_object_add(sp, "additional_special_tokens", arr);
    }
    return sp;
}

static int parse_into(tern_template **dst, const char *src, size_t len, const char *what, tern_err *err)
{
    *dst = tern_template_parse(src, len, err);
    if (!*dst) {
        tern_err_wrap(err, "%s", what);
        return err ? err->code : TERN_EFORMAT;
    }
    return 0;
}

int tern_chat_template_from_source(const char *src, size_t len, json_object *config,
                                   tern_chat_template *out, tern_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = parse_into(&out->tpl, src, len, "chat template", err);
    if (rc)
        return rc;
    out->special = special_tokens(config);
    return 0;
}

int tern_chat_template_load(const char *dir, tern_chat_template *out, tern_err *err)
{
    memset(out, 0, sizeof *out);
    char *cfg_path = tern_path_join(dir, "tokenizer_config.json");
    char *jinja_path = tern_path_join(dir, "chat_template.jinja");
    json_object *cfg = NULL;
    int rc = 0;
    if (!cfg_path || !jinja_path) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out_free_paths;
    }
    if (tern_file_exists(cfg_path)) {
        cfg = tern_json_parse_file(cfg_path, err);
        if (!cfg) {
            rc = err ? err->code : TERN_EFORMAT;
            goto out_free_paths;
        }
    }
    if (tern_file_exists(jinja_path)) {
        size_t len;
        char *src = tern_file_read(jinja_path, &len, 16u << 20, err);
        if (!src) {
            rc = err ? err->code : TERN_EIO;
            goto out_free_cfg;
        }
        rc = parse_into(&out->tpl, src, len, jinja_path, err);
        free(src);
        if (rc)
            goto out_free_cfg;
    } else if (cfg) {
        json_object *ct;
        if (!json_object_object_get_ex(cfg, "chat_template", &ct) || !ct) {
            rc = tern_err_set(err, TERN_ENOTFOUND, "%s: no chat_template", cfg_path);
            goto out_free_cfg;
        }
        if (json_object_is_type(ct, json_type_string)) {
            rc = parse_into(&out->tpl, json_object_get_string(ct), (size_t)json_object_get_string_len(ct),
                            "chat_template", err);
        } else if (json_object_is_type(ct, json_type_array)) {
            for (size_t i = 0; i < json_object_array_length(ct) && !rc; i++) {
                json_object *e = json_object_array_get_idx(ct, i), *nm, *tx;
                if (!json_object_object_get_ex(e, "name", &nm) || !json_object_object_get_ex(e, "template", &tx) ||
                    !json_object_is_type(tx, json_type_string) || !json_object_is_type(nm, json_type_string))
                    continue;
                const char *name = json_object_get_string(nm);
                tern_template **dst = !strcmp(name, "default") ? &out->tpl
                                      : !strcmp(name, "tool_use") ? &out->tool_use : NULL;
                if (dst && !*dst)
                    rc = parse_into(dst, json_object_get_string(tx), (size_t)json_object_get_string_len(tx),
                                    name, err);
            }
            if (!rc && !out->tpl)
                rc = tern_err_set(err, TERN_ENOTFOUND, "%s: no \"default\" chat template", cfg_path);
        } else {
            rc = tern_err_set(err, TERN_EFORMAT, "%s: chat_template must be a string or a list", cfg_path);
        }
        if (rc)
            goto out_free_cfg;
    } else {
        rc = tern_err_set(err, TERN_ENOTFOUND, "%s: no tokenizer_config.json or chat_template.jinja", dir);
        goto out_free_paths;
    }
    out->special = special_tokens(cfg);
    if (!out->special)
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
out_free_cfg:
    json_object_put(cfg);
out_free_paths:
    free(cfg_path);
    free(jinja_path);
    if (rc)
        tern_chat_template_free(out);
    return rc;
}

void tern_chat_template_free(tern_chat_template *ct)
{
    if (!ct)
        return;
    tern_template_free(ct->tpl);
    tern_template_free(ct->tool_use);
    json_object_put(ct->special);
    memset(ct, 0, sizeof *ct);
}

const char *tern_chat_template_token(const tern_chat_template *ct, const char *name)
{
    json_object *v;
    if (!ct || !ct->special || !json_object_object_get_ex(ct->special, name, &v) ||
        !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* Python str.strip() bounds of s[0, n). */
static void py_strip_bounds(const char *s, size_t n, size_t *a, size_t *b)
{
    size_t l;
    *a = 0;
    *b = n;
    while (*a < *b && py_space_at(s + *a, *b - *a, &l))
        *a += l;
    while (*b > *a) {
        size_t p = *b - 1;
        while (p > *a && ((unsigned char)s[p] & 0xC0) == 0x80)
            p--;
        if (!py_space_at(s + p, *b - p, &l))
            break;
        *b = p;
    }
}

/* transformers' continue_final_message: cut the prompt right after the
 * final message's text so generation continues it (the template's
 * end-of-turn markup is dropped). */
static int continue_final(char *out, size_t *len_out, json_object *request, tern_err *err)
{
    json_object *msgs, *last, *content = NULL;
    if (!json_object_object_get_ex(request, "messages", &msgs) || !json_object_is_type(msgs, json_type_array) ||
        !json_object_array_length(msgs))
        return tern_err_set(err, TERN_EINVAL, "continue_final_message is set but there are no messages");
    last = json_object_array_get_idx(msgs, json_object_array_length(msgs) - 1);
    json_object_object_get_ex(last, "content", &content);
    if (json_object_is_type(content, json_type_array)) {
        json_object *text = NULL;
        for (size_t i = json_object_array_length(content); i-- > 0 && !text;)
            json_object_object_get_ex(json_object_array_get_idx(content, i), "text", &text);
        content = text;
    }
    if (!json_object_is_type(content, json_type_string))
        return tern_err_set(err, TERN_EINVAL, "continue_final_message is set but the final message has no text");
    const char *m = json_object_get_string(content);
    size_t mlen = (size_t)json_object_get_string_len(content), a, b, n = strlen(out);
    py_strip_bounds(m, mlen, &a, &b);
    /* rindex of the stripped message */
    size_t slen = b - a;
    long loc = -1;
    if (slen <= n)
        for (size_t i = n - slen + 1; i-- > 0;)
            if (!memcmp(out + i, m + a, slen)) {
                loc = (long)i;
                break;
            }
    if (loc < 0)
        return tern_err_set(err, TERN_EINVAL, "continue_final_message is set but the final message does not "
                                              "appear in the chat after applying the chat template");
    size_t lstripped = mlen - a, cut;
    if ((size_t)loc + lstripped <= n && lstripped == mlen && !memcmp(out + loc, m, mlen))
        cut = (size_t)loc + lstripped;
    else
        cut = (size_t)loc + slen;
    out[cut] = '\0';
    if (len_out)
        *len_out = cut;
    return 0;
}

/* A private copy, for one render, of a special-token value (a string, or an
 * array of them as special_tokens() builds). The template's own objects are
 * shared by every thread that renders it and json-c's reference counts are
 * plain integers: json_object_get/put on them from two threads at once lose
 * updates, which freed a token the template still held (a use-after-free in
 * later renders and a double free in tern_chat_template_free, i.e. the
 * server crashing at shutdown after concurrent chat requests). Reading them
 * is safe; taking references is not. */
static json_object *special_copy(json_object *v)
{
    if (json_object_is_type(v, json_type_array)) {
        json_object *a = json_object_new_array();
        for (size_t i = 0; a && i < json_object_array_length(v); i++)
            json_object_array_add(a, special_copy(json_object_array_get_idx(v, i)));
        return a;
    }
    if (json_object_is_type(v, json_type_string))
        return json_object_new_string_len(json_object_get_string(v), json_object_get_string_len(v));
    return NULL;
}

char *tern_chat_template_apply(const tern_chat_template *ct, json_object *request,
                               const tern_template_limits *lim, size_t *len_out, tern_err *err)
{
    if (!ct || !ct->tpl) {
        tern_err_set(err, TERN_EINVAL, "no chat template");
        return NULL;
    }
    if (!request || !json_object_is_type(request, json_type_object)) {
        tern_err_set(err, TERN_EINVAL, "request must be a JSON object");
        return NULL;
    }
    json_object *ctx = json_object_new_object();
    if (!ctx) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    if (ct->special) {
        json_object_object_foreach(ct->special, k, v) {
            json_object_object_add(ctx, k, special_copy(v)); /* never json_object_get: see special_copy */
        }
    }
    /* transformers: render(messages=, tools=, documents=, add_generation_prompt=, **kwargs) */
    json_object_object_add(ctx, "tools", NULL);
    json_object_object_add(ctx, "documents", NULL);
    json_object_object_add(ctx, "add_generation_prompt", json_object_new_boolean(0));
    json_object *cfm;
    int cont = json_object_object_get_ex(request, "continue_final_message", &cfm) && json_object_get_boolean(cfm);
    json_object_object_foreach(request, k, v) {
        if (strcmp(k, "continue_final_message")) /* an apply option, not a variable */
            json_object_object_add(ctx, k, json_object_get(v));
    }
    json_object *agp;
    if (cont && json_object_object_get_ex(request, "add_generation_prompt", &agp) && json_object_get_boolean(agp)) {
        json_object_put(ctx);
        tern_err_set(err, TERN_EINVAL, "continue_final_message and add_generation_prompt are not compatible");
        return NULL;
    }
    json_object *tools;
    int has_tools = json_object_object_get_ex(request, "tools", &tools) && tools;
    const tern_template *t = has_tools && ct->tool_use ? ct->tool_use : ct->tpl;
    char *s = tern_template_render(t, ctx, lim, len_out, err);
    if (s && cont && continue_final(s, len_out, request, err)) {
        free(s);
        s = NULL;
    }
    json_object_put(ctx);
    return s;
}
