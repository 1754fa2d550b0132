/* tern logits: one forward pass over a prompt, printing the top-K logits at
 * every position as JSON lines - the tool for comparing against oracles. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "model/lora.h"
#include "model/model.h"
#include "tensor/kernels.h"
#include "tokenizer/tokenizer.h"

static int parse_ids(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16;
    *n = 0;
    *ids = malloc(cap * sizeof **ids);
    if (!*ids)
        return -1;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff)
            return -1;
        if (*n == cap) {
            int32_t *nb = realloc(*ids, (cap *= 2) * sizeof **ids);
            if (!nb)
                return -1;
            *ids = nb;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
        while (*s == ',' || *s == ' ')
            s++;
    }
    return *n ? 0 : -1;
}

int cmd_logits(int argc, char **argv)
{
    const char *dir = NULL, *prompt = NULL, *ids_s = NULL, *device = NULL, *lora_dir = NULL, *v;
    long long top = 5, threads = 0;
    int xf;
    kv_spec ks;
    int kv_given = 0, kr; /* f32 unless named */
    kv_spec_init(&ks, KV_F32);
    for (int i = 1; i < argc; i++) {
        if ((kr = cli_kv_flag(argc, argv, &i, &ks, &kv_given))) {
            if (kr < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--prompt")))
            prompt = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--ids")))
            ids_s = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--top"))) {
            if (cli_parse_int(v, 1, 1 << 20, &top)) {
                fprintf(stderr, "tern logits: --top must be a positive integer\n");
                return 2;
            }
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads")) || (v = cli_flag_value(argc, argv, &i, "-t"))) {
            if (cli_parse_int(v, 1, 1024, &threads)) {
                fprintf(stderr, "tern logits: --threads must be a positive integer\n");
                return 2;
            }
        } else if ((xf = cli_experts_flag(argc, argv, &i, "logits"))) {
            if (xf < 0)
                return 2;
        } else if (!strcmp(argv[i], "--exact-products")) /* f32 activations for quantized weights */
            tern_kernels_exact_set(1);
        else if ((v = cli_flag_value(argc, argv, &i, "--lora")))
            lora_dir = v; /* a PEFT adapter folder applied to every row */
        else if ((v = cli_flag_value(argc, argv, &i, "--device")))
            device = v; /* cpu | cuda[:N] | auto (default) */
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "tern logits: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
    }
    if (!dir || (!prompt == !ids_s)) {
        fprintf(stderr, "usage: tern logits MODEL_DIR (--prompt TEXT | --ids 1,2,3) [--top K] "
                        "[-t|--threads N] [--device cpu|cuda|cuda:N|auto] [--exact-products] [--lora DIR]\n"
                        "       [--kv-type T] [--kv-type-layers SPEC] [--kv-quant-start N]\n");
        return 2;
    }
    tern_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 1;
    float *logits = NULL;
    int32_t *pos = NULL, *rows = NULL;
    kv_seq **seqs = NULL;
    kv_pool kv = {0};
    kv_seq seq = {0};
    char dev_buf[32];
    model_lora *lora = NULL;
    const model_lora **row_lora = NULL;
    tern_model *m = cli_load_model(dir, device, (int)threads, dev_buf, sizeof dev_buf, &err);
    if (!m)
        goto out;
    if (lora_dir && (model_lora_supported(m, &err) || !(lora = model_lora_load(m, lora_dir, &err))))
        goto out;
    if (ids_s) {
        if (parse_ids(ids_s, &ids, &n)) {
            fprintf(stderr, "tern logits: --ids must be a comma-separated list of token ids\n");
            goto out_quiet;
        }
    } else {
        tern_tokenizer *tok = tokenizer_load(dir, &err);
        if (!tok)
            goto out;
        int e = tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n, &err);
        tokenizer_free(tok);
        if (e)
            goto out;
    }
    if (n == 0 || n > (size_t)model_config_get(m)->max_pos) {
        tern_err_set(&err, TERN_ERANGE, "%zu tokens: need 1 to %d", n, model_config_get(m)->max_pos);
        goto out;
    }
    int nb = ((int)n + KV_BLOCK_DEFAULT - 1) / KV_BLOCK_DEFAULT;
    if (cli_kv_pool_init(m, &kv, &ks, nb, &err) ||
        kv_seq_reserve(&kv, &seq, (int)n, &err))
        goto out;
    logits = malloc(n * (size_t)model_config_get(m)->n_vocab * sizeof *logits);
    pos = malloc(n * sizeof *pos);
    rows = malloc(n * sizeof *rows);
    seqs = malloc(n * sizeof *seqs);
    row_lora = malloc(n * sizeof *row_lora);
    if (!logits || !pos || !rows || !seqs || !row_lora) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        pos[i] = rows[i] = (int32_t)i;
        seqs[i] = &seq;
        row_lora[i] = lora;
    }
    fwd_batch b = {(int)n, ids, pos, seqs, (int)n, rows};
    if (model_forward_lora(m, &kv, &b, row_lora, logits, NULL, &err))
        goto out;
    int V = model_config_get(m)->n_vocab, K = top < V ? (int)top : V;
    int32_t *best = malloc((size_t)K * sizeof *best);
    if (!best) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const float *row = logits + i * (size_t)V;
        /* Partial selection sort: K is small. Ties go to the lower id. */
        int nbest = 0;
        for (int t = 0; t < V; t++) {
            int j = nbest < K ? nbest++ : K;
            if (j == K && !(row[t] > row[best[K - 1]]))
                continue;
            if (j == K)
                j = K - 1;
            while (j > 0 && row[t] > row[best[j - 1]]) {
                best[j] = best[j - 1];
                j--;
            }
            best[j] = t;
        }
        printf("{\"pos\": %zu, \"top\": [", i);
        for (int j = 0; j < K; j++)
            printf("%s[%d, %.9g]", j ? ", " : "", best[j], row[best[j]]);
        printf("]}\n");
    }
    free(best);
    rc = 0;
    goto out_quiet;
out:
    fprintf(stderr, "tern logits: %s\n", err.msg);
out_quiet:
    free(logits);
    free(pos);
    free(rows);
    free(seqs);
    free(row_lora);
    free(ids);
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
    model_lora_release(lora);
    model_free(m);
    return rc;
}
