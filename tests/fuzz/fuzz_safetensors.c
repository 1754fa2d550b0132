/* Fuzz entry point for the safetensors parser: the input is a whole file.
 * Every tensor the parser accepts must lie inside the mapping. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/tern-fuzz-st-%d.safetensors", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    st_set s = {0};
    tern_err err = {0};
    if (st_open_file(&s, path, &err) == 0) {
        volatile uint8_t sink = 0;
        for (int i = 0; i < s.n_tensors; i++) /* touch first and last byte */
            if (s.tensors[i].n_bytes)
                sink ^= ((const uint8_t *)s.tensors[i].data)[0] ^
                        ((const uint8_t *)s.tensors[i].data)[s.tensors[i].n_bytes - 1];
        (void)sink;
    }
    st_close(&s);
    unlink(path);
    return 0;
}
