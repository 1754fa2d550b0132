/* Encoding: the HF pipeline for one sequence. Split around raw added
 * tokens, normalize the rest, split around normalized added tokens,
 * pre-tokenize, run the model on every pre-token (through a shared
 * pre-token -> ids cache), then add the post-processor's special ids. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tok_int.h"

/* ---- cache ------------------------------------------------------------- */
/* Direct-mapped: a colliding word simply replaces the old one. 16k entries
 * of words up to 64 bytes cover the common words of any corpus while
 * keeping memory under ~3 MB; longer words are rare and not cached. The
 * table is anonymous memory of its own: zero pages the kernel provides as
 * they are first touched, so loading a tokenizer does not clear 3 MB
 * (a heap calloc of that size, once glibc's mmap threshold has grown past
 * it, does - a model pool loading and unloading models paid that on every
 * load, and the heap trim on every unload). */
#define CACHE_SLOTS 16384
#define CACHE_MAX_KEY 64
#define CACHE_MAX_IDS 32

typedef struct cache_slot {
    uint32_t hash;
    uint8_t key_len, n_ids; /* key_len 0 = empty */
    char key[CACHE_MAX_KEY];
    int32_t ids[CACHE_MAX_IDS];
} cache_slot;

struct tok_cache {
    pthread_mutex_t mu;
    cache_slot *slots;
};

tok_cache *tok_cache_new(void)
{
    tok_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    void *m = mmap(NULL, CACHE_SLOTS * sizeof *c->slots, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || pthread_mutex_init(&c->mu, NULL)) {
        if (m != MAP_FAILED)
            munmap(m, CACHE_SLOTS * sizeof *c->slots);
        free(c);
        return NULL;
    }
    c->slots = m;
    return c;
}

void tok_cache_free(tok_cache *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->mu);
    munmap(c->slots, CACHE_SLOTS * sizeof *c->slots);
    free(c);
}

static int cache_get(tok_cache *c, const char *s, size_t len, uint32_t h, tok_ids *out)
{
    cache_slot *e = &c->slots[h & (CACHE_SLOTS - 1)];
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    if (e->key_len == len && e->hash == h && !memcmp(e->key, s, len)) {
        hit = 1;
        for (int i = 0; i < e->n_ids; i++)
            if (tok_ids_push(out, e->ids[i])) {
                hit = -1;
                break;
            }
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void cache_put(tok_cache *c, const char *s, size_t len, uint32_t h, const int32_t *ids, size_t n)
{
    if (n > CACHE_MAX_IDS)
        return;
    cache_slot *e = &c->slots[h & (CACHE_SLOTS - 1)];
    pthread_mutex_lock(&c->mu);
    e->hash = h;
    e->key_len = (uint8_t)len;
    e->n_ids = (uint8_t)n;
    memcpy(e->key, s, len);
    if (n)
        memcpy(e->ids, ids, n * sizeof *ids);
    pthread_mutex_unlock(&c->mu);
}

static int model_cached(const tern_tokenizer *t, const char *s, size_t len, tok_ids *out)
{
    if (len == 0 || len > CACHE_MAX_KEY || !t->cache)
        return tok_model_encode(t, s, len, out);
    uint32_t h = tok_hash(s, len);
    int hit = cache_get(t->cache, s, len, h, out);
    if (hit)
        return hit < 0 ? TERN_ENOMEM : 0;
    size_t mark = out->n;
    int rc = tok_model_encode(t, s, len, out);
    if (!rc)
        cache_put(t->cache, s, len, h, out->v ? out->v + mark : NULL, out->n - mark);
    return rc;
}

/* ---- pipeline ---------------------------------------------------------- */
int tokenizer_encode(const tern_tokenizer *tok, const char *text, size_t len, int add_special, int32_t **ids_out,
                     size_t *n_out, tern_err *err)
{
    *ids_out = NULL;
    *n_out = 0;
    if (!tok || (!text && len))
        return tern_err_set(err, TERN_EINVAL, "tokenizer_encode: no tokenizer or text");
    tok_buf clean = {0}, norm = {0};
    tok_pieces raw = {0}, pieces = {0}, scratch = {0};
    tok_ids ids = {0};
    int rc = 0;
    pcre2_match_data *md = pcre2_match_data_create(16, NULL);
    if (!md)
        goto nomem;
    /* Input is bytes; HF takes Rust strings, so repair invalid UTF-8 the
     * way a lossy conversion would instead of failing. */
    if (tok_utf8_lossy(&clean, text ? text : "", len))
        goto nomem;
    if (tok_added_split(tok, &tok->trie_raw, clean.p, clean.len, 1, &raw))
        goto nomem;
    for (size_t i = 0; i < raw.n; i++) {
        tok_piece x = raw.v[i];
        const char *s = raw.text.p + x.off;
        if (x.id >= 0) {
            if (tok_pieces_push(&pieces, s, x.len, x.id, x.first))
                goto nomem;
            continue;
        }
        norm.len = 0;
        if ((rc = tok_normalize(tok->norm, s, x.len, &norm, md, err)))
            goto out;
        if (tok_added_split(tok, &tok->trie_norm, norm.p ? norm.p : "", norm.len, x.first, &pieces))
            goto nomem;
    }
    if ((rc = tok_pretokenize(tok->pre, &pieces, &scratch, md, err)))
        goto out;
    if (add_special)
        for (size_t i = 0; i < tok->post.n_pre; i++)
            if (tok_ids_push(&ids, tok->post.pre_ids[i]))
                goto nomem;
    for (size_t i = 0; i < pieces.n; i++) {
        tok_piece x = pieces.v[i];
        if (x.id >= 0) {
            if (tok_ids_push(&ids, x.id))
                goto nomem;
        } else if ((rc = model_cached(tok, pieces.text.p + x.off, x.len, &ids))) {
            tern_err_set(err, rc, "tokenizer model failed (%s)", tern_err_name(rc));
            goto out;
        }
    }
    if (add_special)
        for (size_t i = 0; i < tok->post.n_post; i++)
            if (tok_ids_push(&ids, tok->post.post_ids[i]))
                goto nomem;
    size_t n = ids.n;
    if (!ids.v && tok_ids_push(&ids, 0)) /* never return NULL on success */
        goto nomem;
    *ids_out = ids.v;
    *n_out = n;
    ids.v = NULL;
    goto out;
nomem:
    rc = tern_err_set(err, TERN_ENOMEM, "out of memory while encoding");
out:
    free(ids.v);
    tok_buf_free(&clean);
    tok_buf_free(&norm);
    tok_pieces_free(&raw);
    tok_pieces_free(&pieces);
    tok_pieces_free(&scratch);
    if (md)
        pcre2_match_data_free(md);
    return rc;
}
