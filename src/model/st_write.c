/* Safetensors writer (see st_write.h; the format is described in
 * safetensors.h). The header is padded with spaces to a multiple of 8 bytes,
 * as the reference implementation does, so data stays aligned. */
#include "st_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"

#define CHUNK_ELEMS ((int64_t)1 << 20)

int st_write_file(const char *path, const st_out_tensor *ts, int n, st_fill_fn fill, void *ctx, tern_err *err)
{
    json_object *h = json_object_new_object();
    if (!h)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        json_object *t = json_object_new_object(), *shape = json_object_new_array(), *o = json_object_new_array();
        int64_t numel = 1;
        for (int d = 0; d < ts[i].n_dims; d++) {
            json_object_array_add(shape, json_object_new_int64(ts[i].shape[d]));
            numel *= ts[i].shape[d];
        }
        uint64_t bytes = (uint64_t)numel * tern_dtype_size(ts[i].dtype);
        json_object_array_add(o, json_object_new_int64((int64_t)off));
        json_object_array_add(o, json_object_new_int64((int64_t)(off + bytes)));
        json_object_object_add(t, "dtype", json_object_new_string(tern_dtype_name(ts[i].dtype)));
        json_object_object_add(t, "shape", shape);
        json_object_object_add(t, "data_offsets", o);
        json_object_object_add(h, ts[i].name, t);
        off += bytes;
    }
    json_object *meta = json_object_new_object();
    json_object_object_add(meta, "format", json_object_new_string("pt"));
    json_object_object_add(h, "__metadata__", meta);
    const char *js = json_object_to_json_string_ext(h, JSON_C_TO_STRING_PLAIN);
    size_t jl = strlen(js), padded = (jl + 7) & ~(size_t)7;
    int rc = 0;
    void *buf = NULL;
    FILE *f = fopen(path, "wb");
    if (!f) {
        rc = tern_err_set(err, TERN_EIO, "cannot create %s: %s", path, strerror(errno));
        goto out;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(js, 1, jl, f);
    for (size_t i = jl; i < padded; i++)
        fputc(' ', f);
    buf = malloc((size_t)CHUNK_ELEMS * 8);
    if (!buf) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n && !rc; i++) {
        int64_t numel = 1;
        for (int d = 0; d < ts[i].n_dims; d++)
            numel *= ts[i].shape[d];
        size_t es = tern_dtype_size(ts[i].dtype);
        for (int64_t first = 0; first < numel && !rc; first += CHUNK_ELEMS) {
            int64_t cnt = numel - first < CHUNK_ELEMS ? numel - first : CHUNK_ELEMS;
            if ((rc = fill(ctx, i, first, cnt, buf)))
                tern_err_set(err, rc, "%s: producing tensor %s failed", path, ts[i].name);
            else if (fwrite(buf, es, (size_t)cnt, f) != (size_t)cnt)
                rc = tern_err_set(err, TERN_EIO, "%s: write failed: %s", path, strerror(errno));
        }
    }
out:
    if (f && fclose(f) != 0 && !rc)
        rc = tern_err_set(err, TERN_EIO, "%s: write failed: %s", path, strerror(errno));
    free(buf);
    json_object_put(h);
    return rc;
}
