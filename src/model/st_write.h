/* Writing safetensors files (fixtures, `tern convert`). Tensor data is
 * produced in chunks by a callback, so multi-gigabyte files stream out
 * without being held in memory. */
#ifndef TERN_MODEL_ST_WRITE_H
#define TERN_MODEL_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "tensor/dtype.h"

typedef struct st_out_tensor {
    char name[160];
    tern_dtype dtype;
    int n_dims;
    int64_t shape[4];
} st_out_tensor;

/* fill(ctx, i, first, n, buf): write elements [first, first + n) of tensor i
 * (in its dtype) into buf. Returns 0 or a TERN_E* code. */
typedef int (*st_fill_fn)(void *ctx, int i, int64_t first, int64_t n, void *buf);

int st_write_file(const char *path, const st_out_tensor *ts, int n, st_fill_fn fill, void *ctx, tern_err *err);

#endif
