/* Paged KV pool (see kv.h): the types and the per-layer spec, the pool's
 * storage and its two free stacks (sink and regular ids), block tables. */
#include "kv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[KV_TYPE_COUNT] = {"f32", "bf16", "f16", "q8", "q4", "r4", "r3", "f8"};

const char *kv_type_name(kv_type t) { return t >= 0 && t < KV_TYPE_COUNT ? type_names[t] : "?"; }

int kv_type_parse(const char *s, kv_type *t, tern_err *err)
{
    for (int i = 0; i < KV_TYPE_COUNT; i++)
        if (s && !strcmp(s, type_names[i])) {
            *t = (kv_type)i;
            return 0;
        }
    if (s && (!strcmp(s, "fp8") || !strcmp(s, "fp8_e4m3"))) { /* other servers' names for f8 */
        *t = KV_F8;
        return 0;
    }
    return tern_err_set(err, TERN_EINVAL, "unknown KV type '%s' (f32, bf16, f16, q8, q4, r4, r3, f8)", s ? s : "");
}

int kv_type_is_quant(kv_type t) { return t >= KV_Q8 && t < KV_TYPE_COUNT; }
int kv_type_is_rotated(kv_type t) { return t == KV_R4 || t == KV_R3; }
kv_type kv_type_sink(kv_type t) { return kv_type_is_quant(t) ? KV_BF16 : t; }

int kv_type_check(kv_type t, int head_dim, tern_err *err)
{
    if (t < 0 || t >= KV_TYPE_COUNT)
        return tern_err_set(err, TERN_EINVAL, "bad KV type %d", (int)t);
    if (!kv_type_group(t, head_dim))
        return tern_err_set(err, TERN_EUNSUPPORTED,
                            "KV type %s cannot store heads of %d (head_dim must be a multiple of 32, or at most 32 "
                            "and a multiple of %d)", kv_type_name(t), head_dim, t == KV_R3 ? 8 : 2);
    return 0;
}

void kv_spec_init(kv_spec *s, kv_type t)
{
    memset(s, 0, sizeof *s);
    s->type = t;
}

/* One LAYERS part: N, A-B, firstN, lastN. */
static int parse_range(const char *p, const char *end, kv_rule *r)
{
    char buf[32];
    size_t n = (size_t)(end - p);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, p, n);
    buf[n] = 0;
    char *e;
    if (!strncmp(buf, "first", 5) || !strncmp(buf, "last", 4)) {
        int last = buf[0] == 'l';
        long v = strtol(buf + (last ? 4 : 5), &e, 10);
        if (*e || v <= 0 || v > 100000 || e == buf + (last ? 4 : 5))
            return -1;
        r->first = last ? (int)v - 1 : 0;
        r->last = last ? 0 : (int)v - 1;
        r->from_end = last;
        return 0;
    }
    long a = strtol(buf, &e, 10), b = a;
    if (e == buf || a < 0)
        return -1;
    if (*e == '-') {
        char *f = e + 1;
        b = strtol(f, &e, 10);
        if (e == f)
            return -1;
    }
    if (*e || b < a || b > 100000)
        return -1;
    r->first = (int)a;
    r->last = (int)b;
    r->from_end = 0;
    return 0;
}

int kv_spec_parse_layers(kv_spec *s, const char *text, tern_err *err)
{
    const char *p = text ? text : "";
    if (!*p)
        return tern_err_set(err, TERN_EINVAL, "--kv-type-layers: empty (want e.g. first2=bf16,last2=bf16)");
    while (*p) {
        const char *comma = strchr(p, ','), *end = comma ? comma : p + strlen(p);
        const char *eq = memchr(p, '=', (size_t)(end - p));
        kv_rule r;
        char tname[16];
        size_t tl = eq ? (size_t)(end - eq - 1) : 0;
        if (!eq || tl == 0 || tl >= sizeof tname || parse_range(p, eq, &r))
            return tern_err_set(err, TERN_EINVAL,
                                "--kv-type-layers: bad item '%.*s' (want LAYERS=TYPE with LAYERS N, A-B, firstN or "
                                "lastN)", (int)(end - p), p);
        memcpy(tname, eq + 1, tl);
        tname[tl] = 0;
        int rc = kv_type_parse(tname, &r.type, err);
        if (rc)
            return rc;
        if (s->n_rules >= KV_RULES_MAX)
            return tern_err_set(err, TERN_EINVAL, "--kv-type-layers: more than %d items", KV_RULES_MAX);
        s->rules[s->n_rules++] = r;
        if (comma && !comma[1])
            return tern_err_set(err, TERN_EINVAL, "--kv-type-layers: empty item after the last comma");
        p = comma ? comma + 1 : end;
    }
    return 0;
}

kv_type kv_spec_layer_type(const kv_spec *s, int l, int n_layer)
{
    kv_type t = s->type;
    for (int i = 0; i < s->n_rules; i++) {
        const kv_rule *r = &s->rules[i];
        int a = r->from_end ? n_layer - 1 - r->first : r->first, b = r->from_end ? n_layer - 1 - r->last : r->last;
        if (l >= a && l <= b)
            t = r->type;
    }
    return t;
}

int kv_spec_check(const kv_spec *s, int n_layer, int head_dim, tern_err *err)
{
    if (s->quant_start < 0)
        return tern_err_set(err, TERN_EINVAL, "--kv-quant-start must be >= 0");
    for (int l = 0; l < n_layer; l++) {
        int rc = kv_type_check(kv_spec_layer_type(s, l, n_layer), head_dim, err);
        if (rc)
            return rc;
    }
    return 0;
}

size_t kv_spec_block_bytes(const kv_spec *s, int n_layer, int n_kv_head, int head_dim, int block_size, int sink)
{
    size_t total = 0;
    for (int l = 0; l < n_layer; l++) {
        kv_type t = s ? kv_spec_layer_type(s, l, n_layer) : KV_F32;
        if (sink)
            t = kv_type_sink(t);
        total += 2 * (size_t)block_size * n_kv_head * kv_head_bytes(t, head_dim);
    }
    return total;
}

int kv_spec_describe(const kv_spec *s, int n_layer, char *buf, size_t cap)
{
    size_t n = 0;
    int total = 0;
    for (int l = 0; l < n_layer; l++) {
        int w = snprintf(buf ? buf + n : NULL, buf && n < cap ? cap - n : 0, "%s%s", l ? "," : "",
                         kv_type_name(kv_spec_layer_type(s, l, n_layer)));
        total += w;
        n = n + (size_t)w < cap ? n + (size_t)w : cap;
    }
    total += snprintf(buf ? buf + n : NULL, buf && n < cap ? cap - n : 0, ";qs=%d", s->quant_start);
    return total;
}

size_t kv_bytes_per_token(int n_layer, int kv_dim) { return (size_t)2 * n_layer * kv_dim * sizeof(float); }

int kv_pool_init(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, tern_err *err)
{
    return kv_pool_init_ex(p, n_layer, kv_dim, block_size, n_blocks, 1, err);
}

int kv_pool_init_ex(kv_pool *p, int n_layer, int kv_dim, int block_size, int n_blocks, int host_storage,
                    tern_err *err)
{
    return kv_pool_init_spec(p, NULL, n_layer, kv_dim, kv_dim, block_size, n_blocks, 0, host_storage, err);
}

/* The layer table and storage of p (shape fields set) under spec. */
static int storage_init(kv_pool *p, const kv_spec *spec, int host_storage, tern_err *err)
{
    int hd = p->head_dim, plain = 1;
    p->layers = calloc((size_t)p->n_layer, sizeof *p->layers);
    if (!p->layers)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    size_t total = 0;
    for (int l = 0; l < p->n_layer; l++) {
        kv_layer *L = &p->layers[l];
        L->type = spec ? kv_spec_layer_type(spec, l, p->n_layer) : KV_F32;
        L->sink_type = p->n_sink ? kv_type_sink(L->type) : L->type;
        L->row = (size_t)p->n_kv_head * kv_head_bytes(L->type, hd);
        L->sink_row = (size_t)p->n_kv_head * kv_head_bytes(L->sink_type, hd);
        if (L->type != KV_F32 || L->sink_type != KV_F32)
            plain = 0;
        total += ((size_t)p->n_sink * L->sink_row + (size_t)(p->n_blocks - p->n_sink) * L->row) * p->block_size;
    }
    if (!host_storage)
        return 0;
    p->mem_k = malloc(total ? total : 1);
    p->mem_v = malloc(total ? total : 1);
    if (!p->mem_k || !p->mem_v)
        return tern_err_set(err, TERN_ENOMEM, "kv pool: cannot allocate %zu MB", (2 * total) >> 20);
    size_t off = 0;
    for (int l = 0; l < p->n_layer; l++) {
        kv_layer *L = &p->layers[l];
        L->k = p->mem_k + off;
        L->v = p->mem_v + off;
        off += ((size_t)p->n_sink * L->sink_row + (size_t)(p->n_blocks - p->n_sink) * L->row) * p->block_size;
    }
    if (plain) {
        p->k = (float *)(void *)p->mem_k;
        p->v = (float *)(void *)p->mem_v;
    }
    return 0;
}

static int shape_set(kv_pool *p, const kv_spec *spec, int n_layer, int kv_dim, int head_dim, tern_err *err)
{
    if (n_layer <= 0 || kv_dim <= 0 || head_dim <= 0 || kv_dim % head_dim)
        return tern_err_set(err, TERN_EINVAL, "kv pool: bad shape");
    if (spec && head_dim > KV_HEAD_DIM_MAX)
        return tern_err_set(err, TERN_EUNSUPPORTED, "KV types: head_dim %d above %d", head_dim, KV_HEAD_DIM_MAX);
    p->n_layer = n_layer;
    p->kv_dim = kv_dim;
    p->head_dim = head_dim;
    p->n_kv_head = kv_dim / head_dim;
    return spec ? kv_spec_check(spec, n_layer, head_dim, err) : 0;
}

int kv_pool_init_spec(kv_pool *p, const kv_spec *spec, int n_layer, int kv_dim, int head_dim, int block_size,
                      int n_blocks, int n_sink, int host_storage, tern_err *err)
{
    memset(p, 0, sizeof *p);
    int rc = shape_set(p, spec, n_layer, kv_dim, head_dim, err);
    if (rc)
        return rc;
    if (block_size <= 0 || n_blocks <= 0 || n_sink < 0 || n_sink > n_blocks)
        return tern_err_set(err, TERN_EINVAL, "kv pool: bad shape");
    p->block_size = block_size;
    p->n_blocks = n_blocks;
    p->quant_start = spec ? spec->quant_start : 0;
    p->n_sink = p->quant_start > 0 ? n_sink : 0;
    if ((rc = storage_init(p, spec, host_storage, err)))
        goto fail;
    p->ref = calloc((size_t)n_blocks, sizeof *p->ref);
    p->free = malloc((size_t)n_blocks * sizeof *p->free);
    if (!p->ref || !p->free) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    /* Hand out low ids first (pop from the top of each stack). */
    p->n_free_sink = p->n_sink;
    for (int i = 0; i < p->n_sink; i++)
        p->free[i] = p->n_sink - 1 - i;
    p->n_free_reg = n_blocks - p->n_sink;
    for (int i = 0; i < p->n_free_reg; i++) /* stack top at n_blocks - n_free_reg */
        p->free[n_blocks - p->n_free_reg + i] = p->n_sink + i;
    p->n_free = n_blocks;
    return 0;
fail:
    kv_pool_free(p);
    return rc;
}

int kv_pool_view_init(kv_pool *view, const kv_pool *base, const kv_spec *spec, int n_layer, int kv_dim,
                      int head_dim, int host_storage, tern_err *err)
{
    *view = *base;
    view->layers = NULL;
    view->k = view->v = NULL;
    view->mem_k = view->mem_v = NULL;
    view->dev_copy = NULL;
    view->dev_release = NULL;
    view->dev_ctx = NULL;
    view->is_view = 1;
    kv_spec s;
    if (spec) {
        s = *spec;
        s.quant_start = base->quant_start;
    }
    int rc = shape_set(view, spec ? &s : NULL, n_layer, kv_dim, head_dim, err);
    if (rc || (rc = storage_init(view, spec ? &s : NULL, host_storage, err))) {
        kv_pool_free(view);
        return rc;
    }
    return 0;
}

void kv_pool_free(kv_pool *p)
{
    if (p->dev_release)
        p->dev_release(p->dev_ctx, p);
    free(p->mem_k);
    free(p->mem_v);
    free(p->layers);
    if (!p->is_view) {
        free(p->ref);
        free(p->free);
    }
    memset(p, 0, sizeof *p);
}

size_t kv_pool_bytes(const kv_pool *p)
{
    size_t total = 0;
    for (int l = 0; p->layers && l < p->n_layer; l++)
        total += 2 * ((size_t)p->n_sink * p->layers[l].sink_row + (size_t)(p->n_blocks - p->n_sink) * p->layers[l].row) *
                 p->block_size;
    return total;
}

/* Takes a free block, from the sink stack when sink (else the regular
 * one), falling back to the other stack. The caller checked n_free. */
static int32_t block_take(kv_pool *p, int sink)
{
    int32_t b;
    if ((sink && p->n_free_sink) || !p->n_free_reg)
        b = p->free[--p->n_free_sink];
    else
        b = p->free[p->n_blocks - p->n_free_reg--];
    p->n_free--;
    p->ref[b] = 1;
    return b;
}

int32_t kv_block_alloc(kv_pool *p, int sink)
{
    if (sink ? p->n_free_sink == 0 : p->n_free_reg == 0)
        return -1;
    return block_take(p, sink);
}

void kv_block_unref(kv_pool *p, int32_t b)
{
    if (--p->ref[b] != 0)
        return;
    if (b < p->n_sink)
        p->free[p->n_free_sink++] = b;
    else
        p->free[p->n_blocks - ++p->n_free_reg] = b;
    p->n_free++;
}

/* Layer L's bytes of block b (K or V) and its row size and type. */
static uint8_t *block_base(const kv_pool *p, const kv_layer *L, int32_t b, int is_v, size_t *row, kv_type *t)
{
    uint8_t *base = is_v ? L->v : L->k;
    if (b < p->n_sink) {
        *row = L->sink_row;
        *t = L->sink_type;
        return base + (size_t)b * p->block_size * L->sink_row;
    }
    *row = L->row;
    *t = L->type;
    return base + ((size_t)p->n_sink * L->sink_row + (size_t)(b - p->n_sink) * L->row) * p->block_size;
}

int kv_block_copy(kv_pool *p, int32_t dst, int32_t src)
{
    for (int l = 0; p->mem_k && l < p->n_layer; l++)
        for (int is_v = 0; is_v < 2; is_v++) {
            const kv_layer *L = &p->layers[l];
            size_t rd, rs;
            kv_type td, ts;
            uint8_t *d = block_base(p, L, dst, is_v, &rd, &td), *s = block_base(p, L, src, is_v, &rs, &ts);
            if (td == ts) {
                memcpy(d, s, rd * p->block_size);
                continue;
            }
            /* sink <-> regular: re-encode head by head (both in the layer's basis) */
            float tmp[KV_HEAD_DIM_MAX];
            size_t hbs = kv_head_bytes(ts, p->head_dim), hbd = kv_head_bytes(td, p->head_dim);
            for (int i = 0; i < p->block_size * p->n_kv_head && p->head_dim <= KV_HEAD_DIM_MAX; i++) {
                kv_head_decode(ts, p->head_dim, s + (size_t)i * hbs, tmp);
                kv_head_encode(td, p->head_dim, tmp, d + (size_t)i * hbd);
            }
        }
    return p->dev_copy ? p->dev_copy(p->dev_ctx, p, dst, src) : 0;
}

size_t kv_block_bytes(const kv_pool *p, int32_t blk)
{
    size_t n = 0;
    for (int l = 0; l < p->n_layer; l++)
        n += 2 * (size_t)p->block_size * (blk < p->n_sink ? p->layers[l].sink_row : p->layers[l].row);
    return n;
}

int kv_block_save(const kv_pool *p, int32_t blk, void *dst)
{
    if (!p->mem_k || blk < 0 || blk >= p->n_blocks)
        return TERN_EINVAL;
    uint8_t *o = dst;
    for (int l = 0; l < p->n_layer; l++)
        for (int is_v = 0; is_v < 2; is_v++) {
            size_t row;
            kv_type t;
            const uint8_t *s = block_base(p, &p->layers[l], blk, is_v, &row, &t);
            memcpy(o, s, row * p->block_size);
            o += row * p->block_size;
        }
    return 0;
}

int kv_block_load(kv_pool *p, int32_t blk, const void *src, size_t len)
{
    if (!p->mem_k || blk < 0 || blk >= p->n_blocks || len != kv_block_bytes(p, blk))
        return TERN_EINVAL;
    const uint8_t *in = src;
    for (int l = 0; l < p->n_layer; l++)
        for (int is_v = 0; is_v < 2; is_v++) {
            size_t row;
            kv_type t;
            uint8_t *d = block_base(p, &p->layers[l], blk, is_v, &row, &t);
            memcpy(d, in, row * p->block_size);
            in += row * p->block_size;
        }
    return 0;
}

void kv_row_store(kv_pool *p, const kv_seq *s, int l, int pos, const float *k, const float *v, float *rot)
{
    const kv_layer *L = &p->layers[l];
    int hd = p->head_dim;
    for (int is_v = 0; is_v < 2; is_v++) {
        kv_type t;
        uint8_t *d = (uint8_t *)kv_row_at(p, s, l, pos, is_v, &t);
        const float *x = is_v ? v : k;
        if (t == KV_F32) {
            memcpy(d, x, (size_t)p->kv_dim * sizeof(float));
            continue;
        }
        if (kv_type_is_rotated(L->type)) { /* the whole layer (its sinks too) is stored rotated */
            memcpy(rot, x, (size_t)p->kv_dim * sizeof(float));
            for (int h = 0; h < p->n_kv_head; h++)
                kv_rotate(rot + (size_t)h * hd, hd);
            x = rot;
        }
        size_t hb = kv_head_bytes(t, hd);
        for (int h = 0; h < p->n_kv_head; h++)
            kv_head_encode(t, hd, x + (size_t)h * hd, d + (size_t)h * hb);
    }
}

int kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int n_tokens)
{
    int want = (n_tokens + p->block_size - 1) / p->block_size;
    int need = want > s->n_blocks ? want - s->n_blocks : 0;
    /* Shared blocks that will be written need a private copy. */
    for (int b = s->n_tokens / p->block_size; b < s->n_blocks && b < want; b++)
        if (p->ref[s->blocks[b]] > 1)
            need++;
    return need;
}

/* Whether table index b of a sequence holds positions below quant_start. */
static int wants_sink(const kv_pool *p, int b) { return p->n_sink && b * p->block_size < p->quant_start; }

int kv_seq_reserve(kv_pool *p, kv_seq *s, int n_tokens, tern_err *err)
{
    int want = (n_tokens + p->block_size - 1) / p->block_size;
    int need = kv_seq_blocks_needed(p, s, n_tokens);
    if (need > p->n_free)
        return tern_err_set(err, TERN_EFULL, "kv cache full: need %d blocks, %d free", need, p->n_free);
    if (want > s->cap) {
        int cap = s->cap ? s->cap : 8;
        while (cap < want)
            cap *= 2;
        int32_t *nb = realloc(s->blocks, (size_t)cap * sizeof *nb);
        if (!nb)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        s->blocks = nb;
        s->cap = cap;
    }
    int copy_rc = 0;
    for (int b = s->n_tokens / p->block_size; b < s->n_blocks && b < want; b++) {
        int32_t old = s->blocks[b];
        if (p->ref[old] > 1) {
            int32_t nb = block_take(p, wants_sink(p, b));
            int rc = kv_block_copy(p, nb, old);
            if (rc && !copy_rc)
                copy_rc = rc;
            kv_block_unref(p, old);
            s->blocks[b] = nb;
        }
    }
    while (s->n_blocks < want) {
        s->blocks[s->n_blocks] = block_take(p, wants_sink(p, s->n_blocks));
        s->n_blocks++;
    }
    if (copy_rc)
        return tern_err_set(err, TERN_EIO, "kv cache: device copy of a shared block failed (%d)", copy_rc);
    return 0;
}

void kv_seq_truncate(kv_pool *p, kv_seq *s, int n_tokens)
{
    if (n_tokens < 0)
        n_tokens = 0;
    /* a pool that was never initialised (block_size 0) holds no blocks */
    int keep = p->block_size > 0 ? (n_tokens + p->block_size - 1) / p->block_size : 0;
    while (s->n_blocks > keep)
        kv_block_unref(p, s->blocks[--s->n_blocks]);
    if (s->n_tokens > n_tokens)
        s->n_tokens = n_tokens;
}

int kv_seq_fork(kv_pool *p, const kv_seq *src, kv_seq *dst, int n_tokens, tern_err *err)
{
    if (n_tokens > src->n_tokens)
        n_tokens = src->n_tokens;
    int nb = (n_tokens + p->block_size - 1) / p->block_size;
    memset(dst, 0, sizeof *dst);
    if (nb == 0)
        return 0;
    dst->blocks = malloc((size_t)nb * sizeof *dst->blocks);
    if (!dst->blocks)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    dst->cap = nb;
    for (int b = 0; b < nb; b++) {
        dst->blocks[b] = src->blocks[b];
        p->ref[src->blocks[b]]++;
    }
    dst->n_blocks = nb;
    dst->n_tokens = n_tokens;
    return 0;
}

void kv_seq_free(kv_pool *p, kv_seq *s)
{
    kv_seq_truncate(p, s, 0);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}
