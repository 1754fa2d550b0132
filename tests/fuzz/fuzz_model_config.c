/* Fuzz entry point for config.json validation (families, RoPE dialects,
 * quantization blocks): the input is the file's text. Must return an error
 * or a config whose shape fields are in range, never crash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char dir[64], path[96];
    snprintf(dir, sizeof dir, "/tmp/tern-fuzz-cfg-%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    model_config c;
    tern_err err = {0};
    if (model_config_load(&c, dir, &err) == 0) {
        if (c.n_layer < 1 || c.n_layer > MODEL_MAX_LAYERS || c.head_dim < 1 || c.n_head % c.n_kv_head)
            abort();
    }
    unlink(path);
    rmdir(dir);
    return 0;
}
