/* Reading whole files and memory-mapping read-only ones. */
#ifndef TERN_BASE_FILE_H
#define TERN_BASE_FILE_H

#include <stddef.h>
#include "err.h"

/* Reads the whole file into a NUL-terminated malloc'd buffer (caller frees).
 * *len_out gets the byte length without the NUL. max_len bounds the size
 * (0 = 1 GiB) so a wrong path cannot eat memory. */
char *tern_file_read(const char *path, size_t *len_out, size_t max_len, tern_err *err);

/* A read-only private mapping of a whole file. */
typedef struct tern_mmap {
    void *data;  /* NULL for an empty file */
    size_t len;  /* bytes */
} tern_mmap;

int tern_mmap_open(tern_mmap *m, const char *path, tern_err *err);
void tern_mmap_close(tern_mmap *m); /* no-op on a zeroed struct */

/* Joins dir and name into a malloc'd path (caller frees); NULL on OOM. */
char *tern_path_join(const char *dir, const char *name);
int tern_file_exists(const char *path);

#endif
