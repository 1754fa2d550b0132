/* The KV cache flags shared by serve, run, perplexity and logits:
 * --kv-type, --kv-type-layers, --kv-quant-start (model/kv.h). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

int cli_kv_flag(int argc, char **argv, int *i, kv_spec *s, int *given)
{
    const char *v;
    tern_err err = {0};
    long long x;
    if ((v = cli_flag_value(argc, argv, i, "--kv-type"))) {
        if (kv_type_parse(v, &s->type, &err))
            goto bad;
        *given = 1;
        return 1;
    }
    if ((v = cli_flag_value(argc, argv, i, "--kv-type-layers"))) {
        if (kv_spec_parse_layers(s, v, &err))
            goto bad;
        return 1;
    }
    if ((v = cli_flag_value(argc, argv, i, "--kv-quant-start"))) {
        if (cli_parse_int(v, 0, 1 << 24, &x)) {
            tern_err_set(&err, TERN_EINVAL, "--kv-quant-start: want a number of positions, got '%s'", v);
            goto bad;
        }
        s->quant_start = (int)x;
        return 1;
    }
    return 0;
bad:
    fprintf(stderr, "tern %s: %s\n", argv[0], err.msg);
    return -1;
}

int cli_kv_pool_init(const tern_model *m, kv_pool *kv, const kv_spec *s, int n_blocks, tern_err *err)
{
    /* one sequence: every block that holds a position below the start is a sink */
    int n_sink = (s->quant_start + KV_BLOCK_DEFAULT - 1) / KV_BLOCK_DEFAULT;
    return model_kv_pool_init(m, kv, s, KV_BLOCK_DEFAULT, n_blocks, n_sink < n_blocks ? n_sink : n_blocks, 1, err);
}
