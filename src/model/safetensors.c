/* Safetensors reader (format described in safetensors.h). All checks are
 * done before a tensor is handed out, so later code can trust shapes and
 * never reads outside a mapping. */
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "base/json.h"

/* A header larger than this is not a model we can serve (real headers are
 * well under 10 MB even for thousands of tensors). */
#define ST_MAX_HEADER ((uint64_t)100 << 20)

int64_t st_numel(const st_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++)
        n *= t->shape[i];
    return n;
}

static int parse_tensor(st_tensor *t, const char *name, json_object *v, const uint8_t *data, uint64_t data_len,
                        const char *path, tern_err *err)
{
    json_object *dt, *sh, *off;
    if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "dtype", &dt) ||
        !json_object_object_get_ex(v, "shape", &sh) || !json_object_object_get_ex(v, "data_offsets", &off) ||
        !json_object_is_type(dt, json_type_string) || !json_object_is_type(sh, json_type_array) ||
        !json_object_is_type(off, json_type_array) || json_object_array_length(off) != 2)
        return tern_err_set(err, TERN_EFORMAT, "%s: tensor '%s' has a malformed header entry", path, name);
    int d = tern_dtype_from_safetensors(json_object_get_string(dt));
    if (d < 0)
        return tern_err_set(err, TERN_EUNSUPPORTED, "%s: tensor '%s' has unsupported dtype %s", path, name,
                            json_object_get_string(dt));
    t->dtype = (tern_dtype)d;
    size_t nd = json_object_array_length(sh);
    if (nd > ST_MAX_DIMS)
        return tern_err_set(err, TERN_EUNSUPPORTED, "%s: tensor '%s' has %zu dimensions", path, name, nd);
    t->n_dims = (int)nd;
    uint64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        json_object *e = json_object_array_get_idx(sh, i);
        if (!json_object_is_type(e, json_type_int) || json_object_get_int64(e) < 0 ||
            json_object_get_int64(e) > ((int64_t)1 << 40))
            return tern_err_set(err, TERN_EFORMAT, "%s: tensor '%s' has a bad shape", path, name);
        t->shape[i] = json_object_get_int64(e);
        numel *= (uint64_t)t->shape[i];
        if (numel > ((uint64_t)1 << 40))
            return tern_err_set(err, TERN_EFORMAT, "%s: tensor '%s' is impossibly large", path, name);
    }
    json_object *b = json_object_array_get_idx(off, 0), *e = json_object_array_get_idx(off, 1);
    if (!json_object_is_type(b, json_type_int) || !json_object_is_type(e, json_type_int))
        return tern_err_set(err, TERN_EFORMAT, "%s: tensor '%s' has bad data_offsets", path, name);
    int64_t ob = json_object_get_int64(b), oe = json_object_get_int64(e);
    if (ob < 0 || oe < ob || (uint64_t)oe > data_len)
        return tern_err_set(err, TERN_EFORMAT,
                            "%s: tensor '%s' lies outside the file (offsets %lld..%lld, data is %llu bytes; truncated?)",
                            path, name, (long long)ob, (long long)oe, (unsigned long long)data_len);
    if ((uint64_t)(oe - ob) != numel * tern_dtype_size(t->dtype))
        return tern_err_set(err, TERN_EFORMAT, "%s: tensor '%s' has %lld bytes but its shape needs %llu", path, name,
                            (long long)(oe - ob), (unsigned long long)(numel * tern_dtype_size(t->dtype)));
    t->data = data + ob;
    t->n_bytes = (size_t)(oe - ob);
    t->name = strdup(name);
    return t->name ? 0 : tern_err_set(err, TERN_ENOMEM, "out of memory");
}

static int cmp_data(const void *a, const void *b)
{
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* No two tensors of one file share a byte (a file whose tensors overlap lies
 * about at least one of them). Empty tensors take no bytes. */
static int check_overlap(st_tensor *ts, int n, const char *path, tern_err *err)
{
    if (n < 2)
        return 0;
    st_tensor **by = malloc((size_t)n * sizeof *by);
    if (!by)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ts[i].n_bytes)
            by[m++] = &ts[i];
    qsort(by, (size_t)m, sizeof *by, cmp_data);
    int rc = 0;
    for (int i = 1; i < m && !rc; i++)
        if (by[i - 1]->data + by[i - 1]->n_bytes > by[i]->data)
            rc = tern_err_set(err, TERN_EFORMAT, "%s: tensors '%s' and '%s' overlap (data_offsets)", path,
                              by[i - 1]->name, by[i]->name);
    free(by);
    return rc;
}

static size_t name_hash(const char *name)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (size_t)h;
}

static void name_slot_put(int *slots, size_t n_slots, const char *name, int i)
{
    size_t k = name_hash(name) & (n_slots - 1);
    while (slots[k])
        k = (k + 1) & (n_slots - 1);
    slots[k] = i + 1;
}

/* Indexes tensor i (already counted in n_tensors), growing the table. */
static int name_index_add(st_set *s, int i, tern_err *err)
{
    if ((size_t)s->n_tensors * 2 >= s->n_slots) {
        size_t n = s->n_slots ? s->n_slots * 2 : 64;
        while (n <= (size_t)s->n_tensors * 2)
            n *= 2;
        int *slots = calloc(n, sizeof *slots);
        if (!slots)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        for (int j = 0; j < i; j++)
            name_slot_put(slots, n, s->tensors[j].name, j);
        free(s->slots);
        s->slots = slots;
        s->n_slots = n;
    }
    name_slot_put(s->slots, s->n_slots, s->tensors[i].name, i);
    return 0;
}

int st_open_file(st_set *s, const char *path, tern_err *err)
{
    tern_mmap *maps = realloc(s->maps, (size_t)(s->n_maps + 1) * sizeof *maps);
    if (!maps)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    s->maps = maps;
    tern_mmap *m = &s->maps[s->n_maps];
    int rc = tern_mmap_open(m, path, err);
    if (rc)
        return rc;
    s->n_maps++;
    const uint8_t *p = m->data;
    if (m->len < 8)
        return tern_err_set(err, TERN_EFORMAT, "%s: file is too short to be safetensors (%zu bytes)", path, m->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | p[i];
    if (hlen > ST_MAX_HEADER || hlen > m->len - 8)
        return tern_err_set(err, TERN_EFORMAT, "%s: header length %llu does not fit the file (%zu bytes; truncated?)",
                            path, (unsigned long long)hlen, m->len);
    json_object *h = tern_json_parse((const char *)p + 8, (size_t)hlen, err);
    if (!h)
        return tern_err_wrap(err, "%s: bad header", path);
    if (!json_object_is_type(h, json_type_object)) {
        json_object_put(h);
        return tern_err_set(err, TERN_EFORMAT, "%s: header is not a JSON object", path);
    }
    const uint8_t *data = p + 8 + hlen;
    uint64_t data_len = m->len - 8 - hlen;
    size_t n = (size_t)json_object_object_length(h);
    st_tensor *ts = realloc(s->tensors, (size_t)(s->n_tensors + (int)n) * sizeof *ts);
    if (!ts) {
        json_object_put(h);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    s->tensors = ts;
    rc = 0;
    int first = s->n_tensors;
    json_object_object_foreach(h, key, val)
    {
        if (!strcmp(key, "__metadata__"))
            continue;
        if (st_find(s, key)) {
            rc = tern_err_set(err, TERN_EFORMAT, "%s: tensor '%s' appears twice", path, key);
            break;
        }
        st_tensor *t = &s->tensors[s->n_tensors];
        memset(t, 0, sizeof *t);
        if ((rc = parse_tensor(t, key, val, data, data_len, path, err)))
            break;
        s->n_tensors++;
        if ((rc = name_index_add(s, s->n_tensors - 1, err)))
            break;
    }
    json_object_put(h);
    if (!rc)
        rc = check_overlap(s->tensors + first, s->n_tensors - first, path, err);
    return rc;
}

int st_open_dir(st_set *s, const char *dir, tern_err *err)
{
    memset(s, 0, sizeof *s);
    char *single = tern_path_join(dir, "model.safetensors");
    char *index = tern_path_join(dir, "model.safetensors.index.json");
    int rc = 0;
    if (!single || !index) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    if (tern_file_exists(index)) {
        json_object *o = tern_json_parse_file(index, err), *wm;
        if (!o) {
            rc = err ? err->code : TERN_EFORMAT;
            goto out;
        }
        if (!json_object_object_get_ex(o, "weight_map", &wm) || !json_object_is_type(wm, json_type_object)) {
            json_object_put(o);
            rc = tern_err_set(err, TERN_EFORMAT, "%s: missing 'weight_map'", index);
            goto out;
        }
        /* Open each distinct shard once, then check every mapped name exists.
         * A shard already open that lacks a mapped name is the index lying,
         * not a reason to open the shard again. */
        json_object *opened = json_object_new_object();
        if (!opened) {
            json_object_put(o);
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto out;
        }
        json_object_object_foreach(wm, name, file)
        {
            if (!json_object_is_type(file, json_type_string) || strchr(json_object_get_string(file), '/')) {
                rc = tern_err_set(err, TERN_EFORMAT, "%s: bad shard name for '%s'", index, name);
                break;
            }
            if (st_find(s, name))
                continue;
            if (json_object_object_get_ex(opened, json_object_get_string(file), NULL)) {
                rc = tern_err_set(err, TERN_EFORMAT, "%s names tensor '%s' in %s, which does not hold it", index, name,
                                  json_object_get_string(file));
                break;
            }
            if (json_object_object_add(opened, json_object_get_string(file), NULL)) {
                rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
                break;
            }
            char *shard = tern_path_join(dir, json_object_get_string(file));
            if (!shard) {
                rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
                break;
            }
            rc = st_open_file(s, shard, err);
            free(shard);
            if (rc)
                break;
            if (!st_find(s, name)) {
                rc = tern_err_set(err, TERN_EFORMAT, "%s names tensor '%s' in %s, which does not hold it", index, name,
                                  json_object_get_string(file));
                break;
            }
        }
        json_object_put(opened);
        json_object_put(o);
    } else if (tern_file_exists(single)) {
        rc = st_open_file(s, single, err);
    } else {
        rc = tern_err_set(err, TERN_ENOTFOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
out:
    free(single);
    free(index);
    if (rc)
        st_close(s);
    return rc;
}

void st_close(st_set *s)
{
    for (int i = 0; i < s->n_tensors; i++)
        free(s->tensors[i].name);
    for (int i = 0; i < s->n_maps; i++)
        tern_mmap_close(&s->maps[i]);
    free(s->tensors);
    free(s->maps);
    free(s->slots);
    memset(s, 0, sizeof *s);
}

const st_tensor *st_find(const st_set *s, const char *name)
{
    if (!s->n_slots)
        return NULL;
    for (size_t k = name_hash(name) & (s->n_slots - 1); s->slots[k]; k = (k + 1) & (s->n_slots - 1))
        if (!strcmp(s->tensors[s->slots[k] - 1].name, name))
            return &s->tensors[s->slots[k] - 1];
    return NULL;
}
