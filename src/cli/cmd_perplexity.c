/* tern perplexity: perplexity of a model over a text file, and the KL
 * divergence of its next-token distributions from a reference run - the
 * measure every precision choice (weights, activations, KV) is judged by.
 *
 * Method (llama.cpp's llama-perplexity, so the numbers compare): the text is
 * tokenized once without special tokens and cut into chunks of --ctx
 * tokens; each chunk is evaluated from an empty cache in one forward, its
 * first token replaced by BOS where the tokenizer has one; the second half
 * of each chunk is scored (positions ctx/2 .. ctx-2 predicting the next
 * token), so every scored token has at least ctx/2 tokens of context.
 *
 * --save-logits F writes the scored rows' log-probabilities (f32) to F:
 *   "TERNLP01", int32 n_vocab, ctx, n_chunks, n_scored (per chunk),
 *   int32 target ids [n_chunks * n_scored], f32 log-probs [n_chunks *
 *   n_scored][n_vocab], little-endian.
 * --kl-base F reads such a file (same text, tokenizer, ctx and chunks -
 * checked through the target ids) and adds, over the scored tokens,
 * KL(base || this) = sum_t p_base(t) * (log p_base(t) - log p(t)): its mean
 * and 99th percentile, and how often both argmaxes agree. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "cli.h"
#include "model/model.h"
#include "tensor/kernels.h"
#include "tokenizer/tokenizer.h"

#define PPL_MAGIC "TERNLP01"

typedef struct ppl_header {
    char magic[8];
    int32_t n_vocab, ctx, n_chunks, n_scored;
} ppl_header;

/* Log-softmax of row[n] into out[n], in double for the sum. */
static void log_softmax(const float *row, int n, float *out)
{
    float mx = row[0];
    for (int i = 1; i < n; i++)
        mx = row[i] > mx ? row[i] : mx;
    double s = 0;
    for (int i = 0; i < n; i++)
        s += exp((double)row[i] - mx);
    double lse = mx + log(s);
    for (int i = 0; i < n; i++)
        out[i] = (float)((double)row[i] - lse);
}

static int argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b])
            b = i;
    return b;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int cmd_perplexity(int argc, char **argv)
{
    const char *dir = NULL, *file = NULL, *save = NULL, *base = NULL, *device = NULL, *v;
    long long ctx = 512, max_chunks = 0, threads = 0;
    int xf;
    kv_spec ks;
    int kv_given = 0, kr; /* f32 unless named */
    kv_spec_init(&ks, KV_F32);
    for (int i = 1; i < argc; i++) {
        if ((kr = cli_kv_flag(argc, argv, &i, &ks, &kv_given))) {
            if (kr < 0)
                return 2;
        } else if ((v = cli_flag_value(argc, argv, &i, "--file")))
            file = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--ctx")) || (v = cli_flag_value(argc, argv, &i, "--ctx-size")) ||
                 (v = cli_flag_value(argc, argv, &i, "-c"))) {
            if (cli_parse_int(v, 4, 1 << 20, &ctx))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--chunks"))) {
            if (cli_parse_int(v, 1, 1 << 30, &max_chunks))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--threads")) || (v = cli_flag_value(argc, argv, &i, "-t"))) {
            if (cli_parse_int(v, 1, 1024, &threads))
                goto bad_value;
        } else if ((v = cli_flag_value(argc, argv, &i, "--save-logits")))
            save = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--kl-base")))
            base = v;
        else if ((v = cli_flag_value(argc, argv, &i, "--device")))
            device = v;
        else if ((xf = cli_experts_flag(argc, argv, &i, "perplexity"))) {
            if (xf < 0)
                return 2;
        } else if (!strcmp(argv[i], "--exact-products")) /* f32 activations for quantized weights */
            tern_kernels_exact_set(1);
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "tern perplexity: unexpected argument '%s'\n", argv[i]);
            return 2;
        }
        continue;
    bad_value:
        fprintf(stderr, "tern perplexity: bad value for %s\n", argv[i - 1]);
        return 2;
    }
    if (!dir || !file || (save && base)) {
        fprintf(stderr, "usage: tern perplexity MODEL_DIR --file TEXT [--ctx N] [--chunks N] "
                        "[--save-logits F | --kl-base F] [--threads N] [--device D] [--exact-products]\n"
                        "       [--kv-type T] [--kv-type-layers SPEC] [--kv-quant-start N]\n");
        return 2;
    }
    tern_err err = {0};
    int rc = 1;
    char *text = NULL, dev_buf[32];
    int32_t *ids = NULL, *bos = NULL, *chunk = NULL, *pos = NULL, *rows = NULL, *targets = NULL, *base_targets = NULL;
    size_t n_ids = 0, n_bos = 0, text_len = 0;
    float *logits = NULL, *lp = NULL, *blp = NULL;
    double *kls = NULL;
    kv_seq **seqs = NULL;
    kv_pool kv = {0};
    kv_seq seq = {0};
    FILE *fs = NULL, *fb = NULL;
    tern_tokenizer *tok = NULL;
    tern_model *m = cli_load_model(dir, device, (int)threads, dev_buf, sizeof dev_buf, &err);
    if (!m)
        goto out;
    if (!(tok = tokenizer_load(dir, &err)) || !(text = tern_file_read(file, &text_len, 0, &err)) ||
        tokenizer_encode(tok, text, text_len, 0, &ids, &n_ids, &err) ||
        tokenizer_encode(tok, "", 0, 1, &bos, &n_bos, &err))
        goto out;
    const model_config *cfg = model_config_get(m);
    if (ctx > cfg->max_pos) {
        tern_err_set(&err, TERN_ERANGE, "--ctx %lld is past the model's %d positions", ctx, cfg->max_pos);
        goto out;
    }
    int C = (int)ctx, V = cfg->n_vocab, first = C / 2, n_scored = C - 1 - first;
    long n_chunks = (long)(n_ids / (size_t)C);
    if (max_chunks && n_chunks > max_chunks)
        n_chunks = (long)max_chunks;
    if (n_chunks < 1) {
        tern_err_set(&err, TERN_ERANGE, "%s has %zu tokens: --ctx %d needs at least %d", file, n_ids, C, C);
        goto out;
    }
    int nb = (C + KV_BLOCK_DEFAULT - 1) / KV_BLOCK_DEFAULT;
    if (cli_kv_pool_init(m, &kv, &ks, nb, &err))
        goto out;
    fprintf(stderr, "KV cache: %s%s, 16-bit start %d\n", kv_type_name(ks.type),
            ks.n_rules ? " with per-layer rules" : "", ks.quant_start);
    size_t n_tok = (size_t)n_chunks * n_scored;
    logits = malloc((size_t)n_scored * V * sizeof *logits);
    lp = malloc((size_t)V * sizeof *lp);
    blp = malloc((size_t)V * sizeof *blp);
    chunk = malloc((size_t)C * sizeof *chunk);
    pos = malloc((size_t)C * sizeof *pos);
    rows = malloc((size_t)C * sizeof *rows);
    seqs = malloc((size_t)C * sizeof *seqs);
    targets = malloc(n_tok * sizeof *targets);
    kls = malloc(n_tok * sizeof *kls);
    if (!logits || !lp || !blp || !chunk || !pos || !rows || !seqs || !targets || !kls) {
        tern_err_set(&err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (long c = 0; c < n_chunks; c++)
        for (int j = 0; j < n_scored; j++)
            targets[c * n_scored + j] = ids[c * C + first + j + 1];
    ppl_header h = {PPL_MAGIC, V, C, (int32_t)n_chunks, n_scored};
    if (base) {
        ppl_header bh;
        if (!(fb = fopen(base, "rb")) || fread(&bh, sizeof bh, 1, fb) != 1 || memcmp(bh.magic, PPL_MAGIC, 8)) {
            tern_err_set(&err, TERN_EINVAL, "--kl-base %s: not a file written by --save-logits", base);
            goto out;
        }
        if (bh.n_vocab != V || bh.ctx != C || bh.n_chunks != (int32_t)n_chunks || bh.n_scored != n_scored) {
            tern_err_set(&err, TERN_EINVAL,
                         "--kl-base %s: saved with vocab %d, ctx %d, %d chunks; this run has vocab %d, ctx %d, %ld chunks",
                         base, bh.n_vocab, bh.ctx, bh.n_chunks, V, C, n_chunks);
            goto out;
        }
        if (!(base_targets = malloc(n_tok * sizeof *base_targets)) ||
            fread(base_targets, sizeof *base_targets, n_tok, fb) != n_tok ||
            memcmp(base_targets, targets, n_tok * sizeof *targets)) {
            tern_err_set(&err, TERN_EINVAL, "--kl-base %s: saved over other tokens (text or tokenizer differs)", base);
            goto out;
        }
    }
    if (save && (!(fs = fopen(save, "wb")) || fwrite(&h, sizeof h, 1, fs) != 1 ||
                 fwrite(targets, sizeof *targets, n_tok, fs) != n_tok)) {
        tern_err_set(&err, TERN_EIO, "--save-logits %s: cannot write", save);
        goto out;
    }
    double nll = 0, base_nll = 0;
    int tty = isatty(2);
    long agree = 0;
    for (long c = 0; c < n_chunks; c++) {
        memcpy(chunk, ids + c * C, (size_t)C * sizeof *chunk);
        if (n_bos == 1)
            chunk[0] = bos[0];
        for (int i = 0; i < C; i++) {
            pos[i] = i;
            seqs[i] = &seq;
            rows[i] = first + i;
        }
        if (kv_seq_reserve(&kv, &seq, C, &err))
            goto out;
        fwd_batch b = {C, chunk, pos, seqs, n_scored, rows};
        if (model_forward(m, &kv, &b, logits, &err))
            goto out;
        kv_seq_free(&kv, &seq);
        for (int j = 0; j < n_scored; j++) {
            size_t k = (size_t)c * n_scored + j;
            log_softmax(logits + (size_t)j * V, V, lp);
            nll -= lp[targets[k]];
            if (fs && fwrite(lp, sizeof *lp, (size_t)V, fs) != (size_t)V) {
                tern_err_set(&err, TERN_EIO, "--save-logits %s: cannot write", save);
                goto out;
            }
            if (fb) {
                if (fread(blp, sizeof *blp, (size_t)V, fb) != (size_t)V) {
                    tern_err_set(&err, TERN_EINVAL, "--kl-base %s: truncated", base);
                    goto out;
                }
                double kl = 0;
                for (int t = 0; t < V; t++)
                    if (blp[t] > -INFINITY)
                        kl += exp((double)blp[t]) * ((double)blp[t] - lp[t]);
                kls[k] = kl;
                base_nll -= blp[targets[k]];
                agree += argmax(blp, V) == argmax(lp, V);
            }
        }
        if (tty)
            fprintf(stderr, "\r\033[Ktern perplexity: chunk %ld/%ld, ppl %.4f", c + 1, n_chunks,
                    exp(nll / ((double)(c + 1) * n_scored)));
    }
    if (tty)
        fprintf(stderr, "\n");
    if (fs && fclose(fs)) {
        fs = NULL;
        tern_err_set(&err, TERN_EIO, "--save-logits %s: cannot write", save);
        goto out;
    }
    fs = NULL;
    printf("{\"ppl\": %.6f, \"n_tokens\": %zu, \"ctx\": %d, \"chunks\": %ld", exp(nll / (double)n_tok), n_tok, C,
           n_chunks);
    if (fb) {
        double sum = 0;
        for (size_t k = 0; k < n_tok; k++)
            sum += kls[k];
        qsort(kls, n_tok, sizeof *kls, cmp_double);
        size_t i99 = (size_t)ceil(0.99 * (double)n_tok) - 1;
        printf(", \"ppl_base\": %.6f, \"kl_mean\": %.6g, \"kl_p99\": %.6g, \"kl_max\": %.6g, \"top1_agree\": %.6f",
               exp(base_nll / (double)n_tok), sum / (double)n_tok, kls[i99], kls[n_tok - 1],
               (double)agree / (double)n_tok);
    }
    printf("}\n");
    rc = 0;
    goto out_quiet;
out:
    fprintf(stderr, "tern perplexity: %s\n", err.msg);
out_quiet:
    if (fs)
        fclose(fs);
    if (fb)
        fclose(fb);
    free(text), free(ids), free(bos), free(chunk), free(pos), free(rows), free(seqs), free(targets);
    free(base_targets), free(logits), free(lp), free(blp), free(kls);
    if (kv.block_size) /* initialized */
        kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
    tokenizer_free(tok);
    model_free(m);
    return rc;
}
