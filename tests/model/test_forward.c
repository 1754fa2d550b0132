/* Forward pass against Hugging Face transformers' logits for stories260K
 * (golden/hf_logits_top5.json), and batching equivalences on the paged KV
 * cache: one batch == token-by-token decoding == several sequences at once. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "model/model_int.h" /* internals: weights and kernels for the tiling test */
#include "test_util.h"

static tern_model *load_stories(void)
{
    tern_err err = {0};
    tern_model *m = model_load(shared_path("models/stories260K"), 2, &err);
    if (!m)
        fail_msg("%s", err.msg);
    return m;
}

/* Runs ids through one batch of a fresh sequence; logits for every row. */
static float *forward_all(tern_model *m, const int32_t *ids, int n)
{
    tern_err err = {0};
    kv_pool kv;
    kv_seq seq = {0};
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 4, 64, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &seq, n, &err), 0);
    float *logits = malloc((size_t)n * model_config_get(m)->n_vocab * sizeof(float));
    int32_t pos[64], rows[64];
    kv_seq *seqs[64];
    for (int i = 0; i < n; i++) {
        pos[i] = rows[i] = i;
        seqs[i] = &seq;
    }
    fwd_batch b = {n, ids, pos, seqs, n, rows};
    assert_int_equal(model_forward(m, &kv, &b, logits, &err), 0);
    assert_int_equal(seq.n_tokens, n);
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
    return logits;
}

static void test_hf_golden_logits(void **state)
{
    (void)state;
    tern_err err = {0};
    json_object *g = tern_json_parse_file(shared_path("models/stories260K/golden/hf_logits_top5.json"), &err);
    assert_non_null(g);
    json_object *ids_j, *pos_j;
    assert_true(json_object_object_get_ex(g, "input_ids", &ids_j));
    assert_true(json_object_object_get_ex(g, "positions", &pos_j));
    int n = (int)json_object_array_length(ids_j);
    int32_t ids[64];
    for (int i = 0; i < n; i++)
        ids[i] = json_object_get_int(json_object_array_get_idx(ids_j, i));
    tern_model *m = load_stories();
    float *logits = forward_all(m, ids, n);
    double worst = 0;
    for (int p = 0; p < n; p++) {
        json_object *e = json_object_array_get_idx(pos_j, p), *top;
        assert_true(json_object_object_get_ex(e, "top5", &top));
        const float *row = logits + (size_t)p * model_config_get(m)->n_vocab;
        for (int k = 0; k < 5; k++) {
            json_object *pair = json_object_array_get_idx(top, k);
            int id = json_object_get_int(json_object_array_get_idx(pair, 0));
            double want = json_object_get_double(json_object_array_get_idx(pair, 1));
            double d = fabs(row[id] - want);
            if (d > worst)
                worst = d;
            /* rank: exactly k entries are larger than this one */
            int larger = 0;
            for (int t = 0; t < model_config_get(m)->n_vocab; t++)
                larger += row[t] > row[id];
            assert_int_equal(larger, k);
        }
    }
    printf("max |logit - HF| over top-5 of %d positions: %.3g\n", n, worst);
    assert_true(worst <= 1e-4);
    free(logits);
    model_free(m);
    json_object_put(g);
}

/* Prefill as one batch vs one token per forward: bit-identical logits. Then two
 * sequences interleaved in one batch at different positions. */
static void test_batch_equivalence(void **state)
{
    (void)state;
    tern_model *m = load_stories();
    tern_err err = {0};
    const int32_t ids[12] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
    const int n = 12, V = model_config_get(m)->n_vocab;
    float *ref = forward_all(m, ids, n);
    kv_pool kv;
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 4, 64, &err), 0);
    kv_seq a = {0}, c = {0};
    float *lg = malloc((size_t)2 * V * sizeof(float));
    double worst = 0;
    for (int i = 0; i < n; i++) { /* a: token by token */
        assert_int_equal(kv_seq_reserve(&kv, &a, i + 1, &err), 0);
        int32_t pos = i, row = 0;
        kv_seq *sp = &a;
        fwd_batch b = {1, &ids[i], &pos, &sp, 1, &row};
        assert_int_equal(model_forward(m, &kv, &b, lg, &err), 0);
        for (int t = 0; t < V; t++)
            worst = fmax(worst, fabs(lg[t] - ref[(size_t)i * V + t]));
    }
    printf("token-by-token vs one batch: max diff %.3g\n", worst);
    assert_true(worst == 0.0); /* same kernels, same reduction order */
    /* c: first 5 tokens prefilled, then a batch mixing c's tokens 5..7 with a
     * truncated-and-regrown a at position 9. */
    assert_int_equal(kv_seq_reserve(&kv, &c, 5, &err), 0);
    {
        int32_t pos[5] = {0, 1, 2, 3, 4};
        kv_seq *sp[5] = {&c, &c, &c, &c, &c};
        fwd_batch b = {5, ids, pos, sp, 0, NULL};
        assert_int_equal(model_forward(m, &kv, &b, NULL, &err), 0);
    }
    kv_seq_truncate(&kv, &a, 9);
    assert_int_equal(a.n_tokens, 9);
    assert_int_equal(kv_seq_reserve(&kv, &a, 10, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &c, 8, &err), 0);
    int32_t toks[4] = {ids[5], ids[9], ids[6], ids[7]}, pos[4] = {5, 9, 6, 7}, rows[2] = {1, 3};
    kv_seq *sp[4] = {&c, &a, &c, &c};
    fwd_batch b = {4, toks, pos, sp, 2, rows};
    float *lg2 = malloc((size_t)2 * V * sizeof(float));
    assert_int_equal(model_forward(m, &kv, &b, lg2, &err), 0);
    worst = 0;
    for (int t = 0; t < V; t++) {
        worst = fmax(worst, fabs(lg2[t] - ref[(size_t)9 * V + t]));
        worst = fmax(worst, fabs(lg2[V + t] - ref[(size_t)7 * V + t]));
    }
    printf("mixed batch vs reference: max diff %.3g\n", worst);
    assert_true(worst == 0.0); /* same kernels, same reduction order */
    /* fork shares blocks; the fork's continuation matches too */
    kv_seq f;
    assert_int_equal(kv_seq_fork(&kv, &c, &f, 6, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &f, 7, &err), 0);
    {
        int32_t p6 = 6, r0 = 0;
        kv_seq *fp = &f;
        fwd_batch b1 = {1, &ids[6], &p6, &fp, 1, &r0};
        assert_int_equal(model_forward(m, &kv, &b1, lg, &err), 0);
        for (int t = 0; t < V; t++)
            assert_true(lg[t] == ref[(size_t)6 * V + t]);
    }
    /* a bad token id is an error, not a crash */
    int32_t bad = V + 5, p0 = 0, r0 = 0;
    kv_seq *fp = &f;
    fwd_batch bb = {1, &bad, &p0, &fp, 1, &r0};
    assert_int_equal(model_forward(m, &kv, &bb, lg, &err), TERN_ERANGE);
    kv_seq_free(&kv, &f);
    kv_seq_free(&kv, &a);
    kv_seq_free(&kv, &c);
    assert_int_equal(kv.n_free, kv.n_blocks);
    kv_pool_free(&kv);
    free(lg);
    free(lg2);
    free(ref);
    model_free(m);
}

/* The CPU backend's fused, tiled products (large T and n_in force token and
 * row tiles) give each (row, token) exactly the single-token kernel's bits,
 * for dense and quantized weights, with the integer and bf16-activation
 * products (the default) and with the f32-activation ones (exact products). */
static void check_backend_tiling(int exact)
{
    tern_err err = {0};
    tern_kernels_exact_set(exact);
    model_backend *be = model_backend_cpu_new(2, &err);
    tern_kernels_exact_set(0);
    assert_non_null(be);
    const tern_kernels *k = tern_kernels_best();
    const int n_in = 4096, T = 37, n_out[2] = {23, 9};
    float *X = malloc((size_t)T * n_in * sizeof(float));
    uint16_t *wb = malloc((size_t)32 * n_in * sizeof(uint16_t));
    uint8_t *wq = malloc((size_t)32 * n_in);
    float *sb = malloc((size_t)32 * (n_in / 64) * 2 * sizeof(float)), *xs = malloc((size_t)(n_in / 64) * sizeof(float));
    int8_t *xq = malloc((size_t)n_in);
    float *qs = malloc((size_t)tern_iq_ngp(n_in / 64) * 2 * sizeof(float));
    for (int i = 0; i < T * n_in; i++)
        X[i] = (float)(((long)i * 7919) % 1000) / 500.0f - 1.0f;
    for (int i = 0; i < 32 * n_in; i++) {
        wb[i] = tern_f32_to_bf16((float)(((long)i * 104729) % 997) / 498.0f - 1.0f);
        wq[i] = (uint8_t)(i * 31);
    }
    /* bf16 values with their bf16 copy, as a model whose file stores bf16
     * scales has (model_weight.sb16: a lone token's products read those) */
    uint16_t *sb16 = malloc((size_t)32 * (n_in / 64) * 2 * sizeof(uint16_t));
    for (int i = 0; i < 32 * (n_in / 64) * 2; i++) {
        sb16[i] = tern_f32_to_bf16(0.01f * (float)(i % 7) - 0.02f);
        sb[i] = tern_bf16_to_f32(sb16[i]);
    }
    model_weight w[2] = {{TERN_BF16, wb, n_out[0], n_in, 0, 0, NULL, NULL, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL},
                         {TERN_BF16, wq, n_out[1], n_in, 4, 64, sb, sb16, NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL}};
    float *Y[2] = {malloc((size_t)T * n_out[0] * sizeof(float)), malloc((size_t)T * n_out[1] * sizeof(float))};
    const model_weight *wp[2] = {&w[0], &w[1]};
    assert_int_equal(be->matmul(be, 2, wp, X, Y, T, &err), 0);
    for (int t = 0; t < T; t++) { /* each token alone through the backend: the batch's bits */
        float *Y1[2] = {malloc((size_t)n_out[0] * sizeof(float)), malloc((size_t)n_out[1] * sizeof(float))};
        assert_int_equal(be->matmul(be, 2, wp, X + (size_t)t * n_in, Y1, 1, &err), 0);
        assert_memory_equal(Y1[0], Y[0] + (size_t)t * n_out[0], (size_t)n_out[0] * sizeof(float));
        assert_memory_equal(Y1[1], Y[1] + (size_t)t * n_out[1], (size_t)n_out[1] * sizeof(float));
        free(Y1[0]), free(Y1[1]);
    }
    float one[32];
    uint16_t xb[4096];
    for (int t = 0; t < T; t++) {
        if (!exact && k->matmul_bf16b) { /* bf16 activations (AVX-512 BF16; this weight has no tiles) */
            k->bf16_act(X + (size_t)t * n_in, n_in, xb);
            k->matmul_bf16b(wb, xb, one, 1, n_in, n_out[0], 0, n_out[0]);
        } else {
            k->matmul_bf16(wb, X + (size_t)t * n_in, one, 1, n_in, n_out[0], 0, n_out[0]);
        }
        for (int r = 0; r < n_out[0]; r++)
            assert_true(one[r] == Y[0][(size_t)t * n_out[0] + r]);
        for (int g = 0; g < n_in / 64; g++) {
            float s = 0;
            for (int e = 0; e < 64; e++)
                s += X[(size_t)t * n_in + g * 64 + e];
            xs[g] = s;
        }
        if (exact) {
            k->matmul_q4(wq, sb, 64, X + (size_t)t * n_in, xs, one, 1, n_in, n_out[1], 0, n_out[1]);
        } else {
            k->quant_act(X + (size_t)t * n_in, 1, n_in, 64, 4, xq, qs);
            k->imatmul_q4(wq, sb, 64, xq, qs, one, 1, n_in, n_out[1], 0, n_out[1]);
        }
        for (int r = 0; r < n_out[1]; r++)
            assert_true(one[r] == Y[1][(size_t)t * n_out[1] + r]);
    }
    if (!exact && k->matmul_bf16t) { /* the bf16 weight with its tiles (AMX-BF16), as a loaded model's */
        uint16_t *wt = malloc(tern_bf16_tiles_len(n_out[0], n_in) * sizeof(uint16_t));
        tern_bf16_tiles_make(wb, n_out[0], n_in, wt, 0, (n_out[0] + 15) / 16);
        w[0].tiles = wt;
        assert_int_equal(be->matmul(be, 2, wp, X, Y, T, &err), 0);
        for (int t = 0; t < T; t++) {
            float *Y1[2] = {malloc((size_t)n_out[0] * sizeof(float)), malloc((size_t)n_out[1] * sizeof(float))};
            assert_int_equal(be->matmul(be, 2, wp, X + (size_t)t * n_in, Y1, 1, &err), 0);
            assert_memory_equal(Y1[0], Y[0] + (size_t)t * n_out[0], (size_t)n_out[0] * sizeof(float));
            k->bf16_act(X + (size_t)t * n_in, n_in, xb);
            k->matmul_bf16t(wt, xb, one, 1, n_in, n_out[0], 0, n_out[0]);
            assert_memory_equal(one, Y1[0], (size_t)n_out[0] * sizeof(float));
            free(Y1[0]), free(Y1[1]);
        }
        free(wt);
    }
    free(X), free(wb), free(wq), free(sb), free(sb16), free(xs), free(xq), free(qs), free(Y[0]), free(Y[1]);
    be->free(be);
}

static void test_backend_tiling(void **state)
{
    (void)state;
    check_backend_tiling(0);
    check_backend_tiling(1);
}

/* 8-bit weights of groups 32, 64 and 128 in one fused product share one
 * quantized input (activations in blocks of 32 whatever the group,
 * kernels.h): each matrix gets exactly the table's own product on its own
 * quantization - a batch wide enough for token tiles (T = 37 past the
 * 32-token tiles of 16384 inputs), and every token alone (decode, the bf16
 * pairs where the file has them) - and the grouped product (a mixture's
 * experts) the same bits. */
static void test_backend_q8_groups(void **state)
{
    (void)state;
    tern_err err = {0};
    model_backend *be = model_backend_cpu_new(2, &err);
    assert_non_null(be);
    const tern_kernels *k = tern_kernels_best();
    const int n_in = 16384, T = 37, n_out[3] = {9, 7, 5}, groups[3] = {32, 64, 128};
    long nbp = tern_iq_nbp(n_in, 32, 8);
    assert_true(nbp == tern_iq_nbp(n_in, 64, 8) && nbp == tern_iq_nbp(n_in, 128, 8));
    float *X = malloc((size_t)T * n_in * sizeof(float)), *qs = malloc((size_t)2 * nbp * sizeof(float));
    int8_t *xq = malloc((size_t)n_in);
    uint8_t *wq[3];
    float *sb[3], *Y[3], *Yg[3], one[16];
    uint16_t *sb16[3];
    model_weight w[3];
    for (int i = 0; i < T * n_in; i++) /* blocks of 32 of different magnitudes */
        X[i] = (float)(((long)i * 7919) % 1000) / 500.0f - 1.0f * (float)(1 + (i / 32) % 5);
    for (int m = 0; m < 3; m++) {
        long ng = n_in / groups[m];
        wq[m] = malloc((size_t)n_out[m] * n_in);
        sb[m] = malloc((size_t)n_out[m] * ng * 2 * sizeof(float));
        sb16[m] = malloc((size_t)n_out[m] * ng * 2 * sizeof(uint16_t));
        Y[m] = malloc((size_t)T * n_out[m] * sizeof(float));
        Yg[m] = malloc((size_t)T * n_out[m] * sizeof(float));
        for (long i = 0; i < (long)n_out[m] * n_in; i++)
            wq[m][i] = (uint8_t)(i * 31 + m * 7);
        for (long i = 0; i < (long)n_out[m] * ng * 2; i++) {
            sb16[m][i] = tern_f32_to_bf16(0.01f * (float)((i + m) % 7) - 0.02f);
            sb[m][i] = tern_bf16_to_f32(sb16[m][i]);
        }
        w[m] = (model_weight){TERN_BF16, wq[m], n_out[m], n_in, 8, groups[m], sb[m], sb16[m], NULL, 0, 0, NULL, NULL, NULL, NULL, NULL, NULL};
    }
    const model_weight *wp[3] = {&w[0], &w[1], &w[2]};
    assert_int_equal(be->matmul(be, 3, wp, X, Y, T, &err), 0);
    const float *Xs[3] = {X, X, X};
    int Ts[3] = {T, T, T};
    assert_int_equal(be->matmul_grouped(be, 3, wp, Xs, Yg, Ts, &err), 0);
    for (int t = 0; t < T; t++) {
        float *Y1[3] = {malloc((size_t)n_out[0] * sizeof(float)), malloc((size_t)n_out[1] * sizeof(float)),
                        malloc((size_t)n_out[2] * sizeof(float))};
        assert_int_equal(be->matmul(be, 3, wp, X + (size_t)t * n_in, Y1, 1, &err), 0);
        for (int m = 0; m < 3; m++) {
            k->quant_act(X + (size_t)t * n_in, 1, n_in, groups[m], 8, xq, qs);
            k->imatmul_q8(wq[m], sb[m], groups[m], xq, qs, one, 1, n_in, n_out[m], 0, n_out[m]);
            for (int r = 0; r < n_out[m]; r++)
                if (one[r] != Y[m][(size_t)t * n_out[m] + r] || one[r] != Y1[m][r] ||
                    one[r] != Yg[m][(size_t)t * n_out[m] + r])
                    fail_msg("q8 group %d token %d row %d: batch %g, alone %g, grouped %g, kernel %g", groups[m], t, r,
                             Y[m][(size_t)t * n_out[m] + r], Y1[m][r], Yg[m][(size_t)t * n_out[m] + r], one[r]);
        }
        free(Y1[0]), free(Y1[1]), free(Y1[2]);
    }
    /* the weights as panels (made at load where the table has them): the
     * same bits, batched and alone, with quads cut by the job's row parts
     * (9 + 7 + 5 rows in 4-row items) */
    if (tern_iq_panels_ok(k, 64, 8, n_in)) {
        for (int m = 0; m < 3; m++) {
            assert_true(tern_iq_panels_ok(k, groups[m], 8, n_in));
            w[m].panels = malloc(tern_iq_panels_len(n_out[m], n_in, groups[m], 8));
            tern_iq_panels_make(wq[m], sb16[m], n_out[m], n_in, groups[m], 8, w[m].panels, 0, (n_out[m] + 3) / 4);
            memset(Yg[m], 0, (size_t)T * n_out[m] * sizeof(float));
        }
        assert_int_equal(be->matmul(be, 3, wp, X, Yg, T, &err), 0);
        for (int m = 0; m < 3; m++)
            if (memcmp(Y[m], Yg[m], (size_t)T * n_out[m] * sizeof(float)))
                fail_msg("q8 group %d as panels: not the rows' bits", groups[m]);
        for (int t = 0; t < T; t += 9) {
            float *Y1[3] = {Yg[0], Yg[1], Yg[2]};
            assert_int_equal(be->matmul(be, 3, wp, X + (size_t)t * n_in, Y1, 1, &err), 0);
            for (int m = 0; m < 3; m++)
                if (memcmp(Y[m] + (size_t)t * n_out[m], Yg[m], (size_t)n_out[m] * sizeof(float)))
                    fail_msg("q8 group %d as panels, token %d alone: not the batch's bits", groups[m], t);
        }
        for (int m = 0; m < 3; m++)
            free(w[m].panels);
        printf("the panel products (%s) give the same bits\n", k->isa);
    }
    for (int m = 0; m < 3; m++)
        free(wq[m]), free(sb[m]), free(sb16[m]), free(Y[m]), free(Yg[m]);
    free(X), free(qs), free(xq);
    be->free(be);
}

/* The one head_dim rule (model_head_dim_check): even for RoPE, then what
 * the backend declares; applied at load before any weight is read. */
static void test_head_dim_rule(void **state)
{
    (void)state;
    tern_err err = {0};
    model_backend *cpu = model_backend_cpu_new(1, &err);
    assert_non_null(cpu);
    assert_int_equal(model_head_dim_check(cpu, 8, &err), 0);
    assert_int_equal(model_head_dim_check(cpu, 6, &err), 0);
    assert_int_equal(model_head_dim_check(cpu, 7, &err), TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "head_dim 7 must be even"));
    cpu->free(cpu);
    model_backend dev = {.name = "dev", .head_dim_align = 32, .head_dim_max = 256};
    assert_int_equal(model_head_dim_check(&dev, 64, &err), 0);
    assert_int_equal(model_head_dim_check(&dev, 256, &err), 0);
    assert_int_equal(model_head_dim_check(&dev, 8, &err), TERN_EUNSUPPORTED);
    assert_string_equal(err.msg, "dev: head_dim 8 is not a multiple of 32 up to 256");
    assert_int_equal(model_head_dim_check(&dev, 288, &err), TERN_EUNSUPPORTED);
    assert_int_equal(model_head_dim_check(&dev, 33, &err), TERN_EFORMAT);

    /* a config alone: the shape is refused before the weights are opened */
    char dir[64], path[96];
    snprintf(dir, sizeof dir, "/tmp/tern-test-hd-%d", (int)getpid());
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 64, \"intermediate_size\": 172, "
          "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"head_dim\": 7}",
          f);
    fclose(f);
    tern_model *m = model_load(dir, 1, &err);
    assert_null(m);
    assert_int_equal(err.code, TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "config.json: head_dim 7 must be even for RoPE"));
    /* no head_dim key and fewer hidden units than heads: the default is 0 */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 4, \"intermediate_size\": 8, "
          "\"num_hidden_layers\": 1, \"num_attention_heads\": 8}",
          f);
    fclose(f);
    m = model_load(dir, 1, &err);
    unlink(path);
    rmdir(dir);
    assert_null(m);
    assert_int_equal(err.code, TERN_EFORMAT);
    assert_non_null(strstr(err.msg, "leaves no head_dim"));
}

/* The forward's own checks, and the device halves on a backend without
 * them: errors, the sequence untouched. */
static void test_forward_checks(void **state)
{
    (void)state;
    tern_err err = {0};
    tern_model *m = load_stories();
    const model_config *c = model_config_get(m);
    model_caps caps;
    model_caps_get(m, &caps);
    assert_int_equal(caps.device_kv + caps.device_argmax + caps.device_sample, 0);
    kv_pool kv;
    kv_seq seq = {0};
    assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 4, 8, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &seq, 4, &err), 0);
    int32_t tok[2] = {1, c->n_vocab}, pos[2] = {0, 1}, row = 1, far = 4;
    kv_seq *seqs[2] = {&seq, &seq};
    float *logits = malloc((size_t)c->n_vocab * sizeof(float));
    fwd_batch b = {2, tok, pos, seqs, 1, &row};
    assert_int_equal(model_forward(m, &kv, &b, logits, &err), TERN_ERANGE);
    tok[1] = 2;
    pos[1] = 4; /* not reserved */
    assert_int_equal(model_forward(m, &kv, &b, logits, &err), TERN_EINVAL);
    pos[1] = 1;
    b.out_rows = &far;
    assert_int_equal(model_forward(m, &kv, &b, logits, &err), TERN_EINVAL);
    assert_int_equal(seq.n_tokens, 0);
    b.out_rows = &row;
    assert_int_equal(model_forward_start(m, &kv, &b, &err), TERN_EUNSUPPORTED);
    assert_int_equal(model_forward_argmax(m, NULL, 0, NULL, tok, &err), TERN_EUNSUPPORTED);
    assert_int_equal(model_forward_logits(m, logits, &err), TERN_EUNSUPPORTED);
    assert_int_equal(model_kv_bind(m, &kv, &err), TERN_EUNSUPPORTED);
    assert_int_equal(seq.n_tokens, 0);
    assert_int_equal(model_forward(m, &kv, &b, logits, &err), 0);
    assert_int_equal(seq.n_tokens, 2);
    free(logits);
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_tiling),
        cmocka_unit_test(test_backend_q8_groups),
        cmocka_unit_test(test_hf_golden_logits),
        cmocka_unit_test(test_batch_equivalence),
        cmocka_unit_test(test_head_dim_rule),
        cmocka_unit_test(test_forward_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
