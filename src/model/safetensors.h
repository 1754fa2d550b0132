/* Safetensors files, memory-mapped and validated, one file or sharded with
 * model.safetensors.index.json.
 *
 * Format: an 8-byte little-endian header length N, then N bytes of JSON
 *   {"__metadata__": {...}, "NAME": {"dtype": "F32", "shape": [d0, d1, ...],
 *    "data_offsets": [begin, end]}, ...}
 * then the data region; offsets are relative to its start. We check that N
 * fits the file, every dtype is known, end - begin == product(shape) * size,
 * and every range lies inside the data region. */
#ifndef TERN_MODEL_SAFETENSORS_H
#define TERN_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "base/file.h"
#include "tensor/dtype.h"

#define ST_MAX_DIMS 4

typedef struct st_tensor {
    char *name;            /* owned */
    tern_dtype dtype;
    int n_dims;
    int64_t shape[ST_MAX_DIMS];
    const void *data;      /* into the mapping; valid while the set lives */
    size_t n_bytes;
} st_tensor;

typedef struct st_set {
    tern_mmap *maps;       /* [n_maps] */
    int n_maps;
    st_tensor *tensors;    /* [n_tensors] */
    int n_tensors;
    /* name -> index + 1 (0: empty), open addressing over a power of two
     * (more than twice n_tensors): a mixture of experts has tens of
     * thousands of tensors, so lookups must not scan. Owned. */
    int *slots;
    size_t n_slots;
} st_set;

/* Opens DIR/model.safetensors, or every shard named by
 * DIR/model.safetensors.index.json. */
int st_open_dir(st_set *s, const char *dir, tern_err *err);
/* Opens one file (adds its tensors to s; s must be zeroed first time). */
int st_open_file(st_set *s, const char *path, tern_err *err);
void st_close(st_set *s);
/* Borrowed; NULL if absent. O(1) expected (a hash of the names). */
const st_tensor *st_find(const st_set *s, const char *name);
int64_t st_numel(const st_tensor *t);

#endif
