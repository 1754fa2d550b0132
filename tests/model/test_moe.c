/* Mixtures of experts (qwen3_moe, mixtral, gpt_oss) beyond the HF goldens
 * (gpt_oss's MLX-quantized experts: test_gpt_oss_mlx.c): a
 * batch of many sequences gives bit-identical logits to each sequence alone
 * (f32, bf16, 4-bit and MXFP4 experts, integer and exact products), an
 * MXFP4 folder equals its decoded twin, `tern convert`
 * quantizes experts and keeps the router, a folder whose config or experts
 * are wrong is a load error naming the field or the tensor, experts
 * read from disk through a small cache give the same logits, and MLX's
 * stacked experts (switch_mlp) load to the same logits and convert to the
 * same 4-bit weights. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "model/model_int.h" /* internals: the layers' experts */
#include "model/safetensors.h"
#include "model/st_write.h"
#include "test_util.h"
#include "model/moe_util.h"

static void test_batch_equivalence(void **state)
{
    (void)state;
    const char *q = fixture("--family qwen3_moe --dim 64 --layers 3 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 "
                            "--experts 8 --top-k 3 --moe-ff 64 --sparse-step 1 --mlp-only 1 --seed 31");
    const char *mx = fixture("--family mixtral --dim 64 --layers 2 --heads 4 --kv-heads 1 --ff 64 --experts 4 "
                             "--top-k 2 --dtype bf16 --seed 32");
    const char *q4 = tmpdir();
    sh("%s convert %s %s/q4 --bits 4 --group-size 32 2>/dev/null", bin(), q, q4);
    char q4d[128];
    snprintf(q4d, sizeof q4d, "%s/q4", q4);
    check_batch(q, 0);
    check_batch(mx, 0);
    check_batch(q4d, 0); /* integer products */
    check_batch(q4d, 1); /* f32-activation products */
    /* the conversion: experts quantized, the router kept (f32 here) */
    tern_err err = {0};
    tern_model *m = model_load(q4d, 1, &err);
    assert_non_null(m);
    const model_layer *L = &m->layers[0];
    assert_non_null(L->experts);
    assert_null(m->layers[1].experts); /* mlp_only_layers */
    assert_int_equal(L->router.qbits, 0);
    assert_int_equal(L->router.dtype, TERN_F32);
    for (int e = 0; e < 3 * model_config_get(m)->n_expert; e++)
        assert_int_equal(L->experts[e].qbits, 4);
    model_free(m);
}

/* Logits of IDS in one batch (n rows) then 4 greedy decode steps, into
 * out[(n + 4) * V]. */
static void run_ids(tern_model *m, float *out)
{
    tern_err err = {0};
    const model_config *c = model_config_get(m);
    const int n = 12, V = c->n_vocab;
    kv_pool kv;
    kv_seq a = {0};
    assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 4, 64, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &a, n + 4, &err), 0);
    int32_t pos[12], rows[12];
    kv_seq *seqs[12];
    for (int i = 0; i < n; i++) {
        pos[i] = rows[i] = i;
        seqs[i] = &a;
    }
    fwd_batch b = {n, IDS, pos, seqs, n, rows};
    assert_int_equal(model_forward(m, &kv, &b, out, &err), 0);
    for (int k = 0; k < 4; k++) {
        const float *last = out + (size_t)(n + k - 1) * V;
        int32_t tok = 0, p = n + k, r = 0;
        for (int t = 1; t < V; t++)
            tok = last[t] > last[tok] ? t : tok;
        kv_seq *sp = &a;
        fwd_batch one = {1, &tok, &p, &sp, 1, &r};
        assert_int_equal(model_forward(m, &kv, &one, out + (size_t)(n + k) * V, &err), 0);
    }
    kv_seq_free(&kv, &a);
    kv_pool_free(&kv);
}

/* --experts-in / --expert-cache: the same logits whatever the residency;
 * host reads every expert at load and then only hits; disk with a cache of
 * 12 of the 16 experts hits; with 3, misses, evicts and stays within it;
 * with 0, misses on every pick. */
static void test_expert_residency(void **state)
{
    (void)state;
    const char *d = fixture("--family qwen3_moe --dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 "
                            "--experts 8 --top-k 2 --moe-ff 64 --seed 35");
    tern_err err = {0};
    tern_model *m = model_load(d, 2, &err);
    assert_non_null(m);
    const int V = model_config_get(m)->n_vocab, rows = 16;
    float *ref = malloc((size_t)rows * V * sizeof(float)), *got = malloc((size_t)rows * V * sizeof(float));
    run_ids(m, ref);
    model_experts_stats st;
    assert_int_equal(model_experts_stats_get(m, &st), 0);
    assert_int_equal(st.where, MODEL_EXPERTS_MAPPED);
    model_free(m);
    const size_t one = 3 * 64 * 64 * sizeof(float), total = 2 * 8 * one;
    struct {
        int where;
        size_t cache;
    } modes[4] = {{MODEL_EXPERTS_HOST, 0}, {MODEL_EXPERTS_DISK, 12 * one}, {MODEL_EXPERTS_DISK, 3 * one},
                  {MODEL_EXPERTS_DISK, 0}};
    for (int k = 0; k < 4; k++) {
        model_experts_opts_set(modes[k].where, modes[k].cache);
        m = model_load(d, 2, &err);
        model_experts_opts_set(MODEL_EXPERTS_MAPPED, 0);
        assert_non_null(m);
        run_ids(m, got);
        assert_memory_equal(ref, got, (size_t)rows * V * sizeof(float));
        assert_int_equal(model_experts_stats_get(m, &st), 0);
        uint64_t picks = st.hits + st.misses;
        printf("mode %d cache %zu: %llu picks, %llu hits, %.0f bytes read, %zu held\n", modes[k].where,
               modes[k].cache, (unsigned long long)picks, (unsigned long long)st.hits, st.streamed_bytes,
               st.resident_bytes);
        assert_int_equal(st.total_bytes, total);
        assert_true(picks >= 2 * 5 * 2); /* 5 forwards, 2 sparse layers, >= 2 experts each */
        if (modes[k].where == MODEL_EXPERTS_HOST) {
            assert_int_equal(st.misses, 0);
            assert_int_equal(st.resident_bytes, total);
            assert_true(st.streamed_bytes == (double)total);
        } else {
            assert_true(st.resident_bytes <= modes[k].cache);
            assert_true(st.streamed_bytes == (double)st.misses * (double)one);
            if (modes[k].cache == 0)
                assert_int_equal(st.hits, 0);
            else if (modes[k].cache == 3 * one) /* full, evicting */
                assert_true(st.misses > 3 && st.resident_bytes == 3 * one);
            else /* the hot experts stay */
                assert_true(st.hits > 0 && st.resident_bytes == 12 * one);
        }
        model_free(m);
    }
    free(ref);
    free(got);
}

/* Quantized experts laid out as panels at load (the default, and host)
 * give the bits of the row kernels they replace (disk: the experts stay in
 * the mapping, their pairs made on a miss), 4- and 8-bit, with inputs that
 * end in a part-filled chunk (12 blocks of 32); the panels' batch equals
 * its sequences alone. */
static void test_expert_panels(void **state)
{
    (void)state;
    const char *d = fixture("--family qwen3_moe --dim 256 --layers 2 --heads 4 --kv-heads 2 --head-dim 64 --ff 96 "
                            "--experts 8 --top-k 3 --moe-ff 384 --dtype bf16 --seed 36");
    const tern_kernels *k = tern_kernels_best();
    for (int bits = 4; bits <= 8; bits += 4) {
        const char *q = tmpdir();
        sh("%s convert %s %s/q --bits %d --group-size %d 2>/dev/null", bin(), d, q, bits, bits == 4 ? 32 : 64);
        char qd[128];
        snprintf(qd, sizeof qd, "%s/q", q);
        tern_err err = {0};
        tern_model *m = model_load(qd, 2, &err);
        assert_non_null(m);
        const model_layer *L = &m->layers[1];
        int gate_panels = L->experts[0].panels != NULL;
        assert_int_equal(L->experts[0].dtype, TERN_BF16); /* bf16 scales: what the panels take */
        assert_int_equal(gate_panels, tern_iq_panels_ok(k, L->experts[0].group, bits, L->experts[0].n_in));
        const int V = model_config_get(m)->n_vocab, rows = 16;
        float *ref = malloc((size_t)rows * V * sizeof(float)), *got = malloc((size_t)rows * V * sizeof(float));
        run_ids(m, got);
        model_free(m);
        /* from disk: the row kernels, the pairs made on a miss and freed a
         * layer after the expert leaves - every expert cached, 3 of the 16,
         * none */
        size_t one = 0;
        for (int k = 0; k < 3; k++) {
            model_experts_opts_set(MODEL_EXPERTS_DISK, k == 0 ? (size_t)1 << 30 : k == 1 ? 3 * one : 0);
            m = model_load(qd, 2, &err);
            model_experts_opts_set(MODEL_EXPERTS_MAPPED, 0);
            assert_non_null(m);
            assert_null(m->layers[1].experts[0].panels);
            assert_null(m->layers[1].experts[0].sb); /* not made before a pick reads the expert */
            run_ids(m, ref);
            model_experts_stats st;
            assert_int_equal(model_experts_stats_get(m, &st), 0);
            one = st.total_bytes / 16; /* 2 sparse layers of 8 experts */
            if (k > 0)
                assert_true(st.misses > 3);
            model_free(m);
            assert_memory_equal(ref, got, (size_t)rows * V * sizeof(float));
        }
        printf("%d-bit experts: panels %s\n", bits, gate_panels ? "at load" : "not taken by these kernels");
        free(ref);
        free(got);
        check_batch(qd, 0);
    }
}

/* ---- MLX's stacked experts (switch_mlp) ---- */

typedef struct restack {
    const st_set *src;
    int n;
    const st_tensor *one[4096]; /* tensors copied as they are; NULL for a stacked one */
    const st_tensor *parts[4096][16]; /* a stacked tensor's experts in order */
    int n_parts[4096];
} restack;

static int restack_fill(void *ctx, int i, int64_t first, int64_t n, void *buf)
{
    const restack *r = ctx;
    if (r->one[i]) {
        size_t es = r->one[i]->n_bytes / (size_t)st_numel(r->one[i]);
        memcpy(buf, (const char *)r->one[i]->data + (size_t)first * es, (size_t)n * es);
        return 0;
    }
    const st_tensor *p0 = r->parts[i][0];
    int64_t per = st_numel(p0);
    size_t es = p0->n_bytes / (size_t)per;
    for (int64_t k = 0; k < n; k++) {
        int64_t g = first + k;
        memcpy((char *)buf + (size_t)k * es, (const char *)r->parts[i][g / per]->data + (size_t)(g % per) * es, es);
    }
    return 0;
}

/* dir's folder with every sparse layer's experts stacked as MLX writes
 * them (mlp.switch_mlp.X.{weight,scales,biases} [n_expert][...]), into out. */
static void write_stacked(const char *dir, const char *out, int n_expert)
{
    static restack r;
    static st_out_tensor ts[4096];
    st_set src = {0};
    tern_err err = {0};
    char path[512];
    assert_int_equal(st_open_dir(&src, dir, &err), 0);
    memset(&r, 0, sizeof r);
    int n = 0;
    for (int i = 0; i < src.n_tensors; i++) {
        const st_tensor *t = &src.tensors[i];
        int l, e;
        char proj[64], suf[16];
        if (sscanf(t->name, "model.layers.%d.mlp.experts.%d.%63[a-z_].%15s", &l, &e, proj, suf) == 4) {
            if (e != 0)
                continue; /* gathered with expert 0 */
            st_out_tensor *o = &ts[n];
            snprintf(o->name, sizeof o->name, "model.layers.%d.mlp.switch_mlp.%s.%s", l, proj, suf);
            o->dtype = t->dtype;
            o->n_dims = 3;
            o->shape[0] = n_expert;
            o->shape[1] = t->shape[0];
            o->shape[2] = t->shape[1];
            for (int x = 0; x < n_expert; x++) {
                char nm[256];
                snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.%s.%s", l, x, proj, suf);
                r.parts[n][x] = st_find(&src, nm);
                assert_non_null(r.parts[n][x]);
            }
            n++;
            continue;
        }
        st_out_tensor *o = &ts[n];
        snprintf(o->name, sizeof o->name, "%s", t->name);
        o->dtype = t->dtype;
        o->n_dims = t->n_dims;
        for (int d = 0; d < t->n_dims; d++)
            o->shape[d] = t->shape[d];
        r.one[n++] = t;
    }
    sh("mkdir -p %s && cd %s && for f in *; do [ \"$f\" = model.safetensors ] || cp \"$f\" %s/; done", out, dir, out);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (st_write_file(path, ts, n, restack_fill, &r, &err))
        fail_msg("%s", err.msg);
    st_close(&src);
}

/* A folder with MLX's stacked experts (switch_mlp) loads and gives the
 * per-expert folder's logits bit for bit, bf16 and 4-bit; a stacked tensor
 * of the wrong expert count is an error naming it. */
static void test_stacked_experts(void **state)
{
    (void)state;
    const char *d = fixture("--family qwen3_moe --dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 "
                            "--experts 8 --top-k 2 --moe-ff 64 --seed 37 --dtype bf16");
    const char *q4 = tmpdir(), *sd = tmpdir(), *sq = tmpdir();
    sh("%s convert %s %s/q --bits 4 --group-size 32 2>/dev/null", bin(), d, q4);
    char qd[96], sdd[96], sqd[96];
    snprintf(qd, sizeof qd, "%s/q", q4);
    snprintf(sdd, sizeof sdd, "%s/s", sd);
    snprintf(sqd, sizeof sqd, "%s/s", sq);
    write_stacked(d, sdd, 8);
    write_stacked(qd, sqd, 8);
    const char *pairs[2][2] = {{d, sdd}, {qd, sqd}};
    for (int p = 0; p < 2; p++) {
        float *a = logits_of(pairs[p][0]), *b = logits_of(pairs[p][1]);
        tern_err err = {0};
        tern_model *m = model_load(pairs[p][0], 2, &err);
        assert_non_null(m);
        const int nv = model_config_get(m)->n_vocab;
        model_free(m);
        assert_memory_equal(a, b, (size_t)12 * nv * sizeof(float));
        free(a);
        free(b);
    }
    /* tern convert quantizes stacked experts row by row: the per-expert
     * folder's conversion, bit for bit */
    const char *sc = tmpdir();
    char scd[96];
    snprintf(scd, sizeof scd, "%s/q", sc);
    sh("%s convert %s %s --bits 4 --group-size 32 2>/dev/null", bin(), sdd, scd);
    {
        float *a = logits_of(qd), *b = logits_of(scd);
        tern_err err = {0};
        tern_model *m = model_load(scd, 1, &err);
        assert_non_null(m);
        const int nv = model_config_get(m)->n_vocab;
        assert_int_equal(m->layers[1].experts[3 * 5 + 2].qbits, 4);
        model_free(m);
        assert_memory_equal(a, b, (size_t)12 * nv * sizeof(float));
        free(a);
        free(b);
    }
    /* 7 experts in config.json for 8 stacked: the tensor is named */
    config_set(sdd, "num_experts", "7");
    tern_err err = {0};
    tern_model *m = model_load(sdd, 2, &err);
    assert_null(m);
    assert_non_null(strstr(err.msg, "switch_mlp.gate_proj.weight"));
}

static void test_load_errors(void **state)
{
    (void)state;
    const char *d = fixture("--family qwen3_moe --dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 "
                            "--ff 96 --experts 4 --top-k 2 --moe-ff 32 --seed 33");
    /* experts the folder does not hold */
    config_set(d, "num_experts", "5");
    load_fails(d, TERN_EFORMAT, "model.layers.0.mlp.experts.4.gate_proj.weight");
    config_set(d, "num_experts", "4");
    /* misshapen experts */
    config_set(d, "moe_intermediate_size", "48");
    load_fails(d, TERN_EFORMAT, "model.layers.0.mlp.experts.0.gate_proj.weight");
    config_set(d, "moe_intermediate_size", "32");
    /* a dense layer where the folder has experts */
    config_set(d, "mlp_only_layers", "[1]");
    load_fails(d, TERN_EFORMAT, "model.layers.1.mlp.gate_proj.weight");
    config_set(d, "mlp_only_layers", "[2]");
    load_fails(d, TERN_EFORMAT, "mlp_only_layers");
    config_set(d, "mlp_only_layers", "[]");
    /* transformers 5's spelling of the expert count */
    config_set(d, "num_experts", NULL);
    config_set(d, "num_local_experts", "4");
    tern_err err = {0};
    tern_model *m = model_load(d, 1, &err);
    if (!m)
        fail_msg("%s", err.msg);
    assert_int_equal(model_config_get(m)->n_expert, 4);
    model_free(m);
    /* variants we do not run, each named */
    config_set(d, "num_experts_per_tok", "5");
    load_fails(d, TERN_ERANGE, "num_experts_per_tok");
    config_set(d, "num_experts_per_tok", "2");
    config_set(d, "shared_expert_intermediate_size", "64");
    load_fails(d, TERN_EUNSUPPORTED, "shared_expert_intermediate_size");
    config_set(d, "shared_expert_intermediate_size", "0");
    config_set(d, "n_group", "4");
    load_fails(d, TERN_EUNSUPPORTED, "n_group");
    config_set(d, "n_group", NULL);
    config_set(d, "scoring_func", "\"sigmoid\"");
    load_fails(d, TERN_EUNSUPPORTED, "scoring_func");
    config_set(d, "scoring_func", NULL);
    config_set(d, "decoder_sparse_step", "0");
    load_fails(d, TERN_ERANGE, "decoder_sparse_step");
    config_set(d, "decoder_sparse_step", "1");
    config_set(d, "model_type", "\"gpt_oss\""); /* loads as gpt_oss: its stacked experts are missing */
    load_fails(d, TERN_EFORMAT, "model.layers.0.mlp.experts.gate_up_proj");
    config_set(d, "model_type", "\"qwen2_moe\"");
    load_fails(d, TERN_EUNSUPPORTED, "shared experts");
    /* on the CUDA backend: loaded where there is a GPU (its forward is
     * tests/cuda/test_cuda_moe.c's), else a clear error, never a crash */
    config_set(d, "model_type", "\"qwen3_moe\"");
    model_load_opts lo = {1, "cuda"};
    m = model_load_ex(d, &lo, &err);
    if (m)
        model_free(m);
    else
        assert_int_equal(err.code, TERN_EUNSUPPORTED);
    /* a Mixtral folder with a missing expert matrix */
    const char *x = fixture("--family mixtral --dim 64 --layers 1 --heads 4 --kv-heads 1 --ff 64 --experts 2 "
                            "--top-k 2 --seed 34");
    config_set(x, "model_type", "\"qwen3_moe\"");
    config_set(x, "moe_intermediate_size", "64");
    load_fails(x, TERN_EFORMAT, "model.layers.0.mlp.experts.0.gate_proj.weight");
}

/* ---- gpt_oss ---- */


/* The batch contract on gpt_oss (sinks, sliding/full layers with a window
 * of 4 crossed by the 12 tokens, biased clamped experts): f32, bf16 and
 * MXFP4 experts. */
static void test_gpt_oss_batch(void **state)
{
    (void)state;
    check_batch(fixture(GPT_OSS), 0);
    check_batch(fixture(GPT_OSS " --dtype bf16"), 0);
    check_batch(fixture(GPT_OSS " --dtype bf16 --mxfp4 1"), 0);
    check_batch(fixture(GPT_OSS " --mxfp4 1"), 1);
}

/* An MXFP4 folder and its decoded twin (the same weights as plain f32
 * experts, make_fixture --mxfp4-decoded) give the same logits within f32
 * reordering under --exact-products: the MXFP4 products read the codes and
 * scales as the OCP format (and transformers) define them, and the plain
 * experts' transposed layout is read the same way. By default the gate_up
 * products take int8 inputs (the down products keep f32: their inputs, the
 * clamped SwiGLU's, are heavy-tailed): within 1e-3 (measured 1.9e-4). The
 * MXFP4 experts stay in the mapping. */
static void test_gpt_oss_mxfp4(void **state)
{
    (void)state;
    const char *mx = fixture(GPT_OSS " --mxfp4 1"), *dec = fixture(GPT_OSS " --mxfp4-decoded 1");
    float *b = logits_of(dec), *a = logits_of(mx);
    tern_kernels_exact_set(1);
    float *ax = logits_of(mx);
    tern_kernels_exact_set(0);
    tern_err err = {0};
    tern_model *m = model_load(mx, 1, &err);
    assert_non_null(m);
    const model_config *c = model_config_get(m);
    int V = c->n_vocab;
    assert_int_equal(c->moe, MOE_GPT_OSS);
    assert_true(c->mxfp4);
    const model_layer *L = &m->layers[1];
    assert_non_null(L->experts[0].mx);
    assert_null(L->experts[0].own);
    assert_int_equal(L->experts[0].n_out, 2 * c->n_ff_expert);
    assert_int_equal(L->experts[2].n_in, c->n_ff_expert);
    model_free(m);
    double worst = 0, worst_x = 0, mag = 0;
    for (size_t i = 0; i < (size_t)12 * V; i++) {
        worst = fmax(worst, fabs(a[i] - b[i]));
        worst_x = fmax(worst_x, fabs(ax[i] - b[i]));
        mag = fmax(mag, fabs(b[i]));
    }
    printf("gpt_oss MXFP4 vs its decoded twin: max |delta logit| %.3g exact products, %.3g int8 gate_up inputs "
           "(logits up to %.3g)\n",
           worst_x, worst, mag);
    assert_true(worst_x <= 1e-5 * (mag + 1));
    assert_true(worst <= 1e-3);
    /* MXFP4 experts stay in the mapping: the disk residency with a cache of a
     * few experts gives the same bits */
    model_experts_opts_set(MODEL_EXPERTS_DISK, 3 * (size_t)(2 * 32 * 64 + 64 * 32) / 2);
    float *cd = logits_of(mx);
    model_experts_opts_set(MODEL_EXPERTS_MAPPED, 0);
    assert_memory_equal(a, cd, (size_t)12 * V * sizeof(float));
    free(cd);
    free(a);
    free(ax);
    free(b);
}

/* gpt_oss folders whose tensors are missing or misshapen name the tensor;
 * config variants name the field. */
static void test_gpt_oss_load_errors(void **state)
{
    (void)state;
    const char *d = fixture(GPT_OSS " --mxfp4 1");
    /* more experts than the blocks hold */
    config_set(d, "num_local_experts", "9");
    load_fails(d, TERN_EFORMAT, "model.layers.0.mlp.experts.gate_up_proj_blocks");
    config_set(d, "num_local_experts", "8");
    /* other widths: the blocks of the wrong shape */
    config_set(d, "intermediate_size", "64");
    load_fails(d, TERN_EFORMAT, "model.layers.0.mlp.experts.gate_up_proj_blocks");
    config_set(d, "intermediate_size", "32");
    /* the aliases of the experts per token must agree */
    config_set(d, "experts_per_token", "3");
    load_fails(d, TERN_EFORMAT, "experts_per_token");
    config_set(d, "experts_per_token", NULL);
    config_set(d, "num_experts_per_tok", NULL);
    config_set(d, "experts_per_token", "2");
    tern_err err = {0};
    tern_model *m = model_load(d, 1, &err);
    if (!m)
        fail_msg("%s", err.msg);
    assert_int_equal(model_config_get(m)->n_expert_used, 2);
    model_free(m);
    config_set(d, "experts_per_token", "4");
    config_set(d, "num_experts_per_tok", "4");
    config_set(d, "rope_scaling", "{\"rope_type\": \"longrope\", \"factor\": 2.0}");
    load_fails(d, TERN_EUNSUPPORTED, "longrope");
    config_set(d, "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 32.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0, "
                                  "\"truncate\": false, \"original_max_position_embeddings\": 4096}");
    /* the safetensors file without one layer's sinks, and with a scale tensor renamed */
    const char *x = tmpdir();
    sh("cp %s/* %s/", d, x);
    char st[160];
    snprintf(st, sizeof st, "%s/model.safetensors", x);
    rename_tensor(st, "model.layers.2.self_attn.sinks", "model.layers.2.self_attn.sinkz");
    load_fails(x, TERN_EFORMAT, "model.layers.2.self_attn.sinks");
    rename_tensor(st, "model.layers.2.self_attn.sinkz", "model.layers.2.self_attn.sinks");
    rename_tensor(st, "model.layers.3.mlp.experts.down_proj_scales", "model.layers.3.mlp.experts.down_proj_scalez");
    load_fails(x, TERN_EFORMAT, "model.layers.3.mlp.experts.down_proj_scales");
    rename_tensor(st, "model.layers.3.mlp.experts.down_proj_scalez", "model.layers.3.mlp.experts.down_proj_scales");
    rename_tensor(st, "model.layers.0.mlp.router.bias", "model.layers.0.mlp.router.biaz");
    load_fails(x, TERN_EFORMAT, "model.layers.0.mlp.router.bias");
    /* sinks of the wrong length: 3 heads in config.json for 4 in the file (q_proj names itself first) */
    config_set(d, "num_attention_heads", "2");
    config_set(d, "num_key_value_heads", "2");
    load_fails(d, TERN_EFORMAT, "model.layers.0.self_attn.q_proj");
    config_set(d, "num_attention_heads", "4");
    /* MXFP4 is gpt_oss's only */
    const char *q = fixture("--family qwen3_moe --dim 64 --layers 1 --heads 4 --kv-heads 2 --head-dim 32 --ff 96 "
                            "--experts 4 --top-k 2 --moe-ff 32 --seed 42");
    config_set(q, "quantization_config", "{\"quant_method\": \"mxfp4\"}");
    load_fails(q, TERN_EUNSUPPORTED, "mxfp4");
    /* plain (input-major) experts are transposed copies: not for the disk/host residency */
    const char *p = fixture(GPT_OSS " --dtype bf16");
    model_experts_opts_set(MODEL_EXPERTS_DISK, 1 << 20);
    m = model_load(p, 1, &err);
    model_experts_opts_set(MODEL_EXPERTS_MAPPED, 0);
    assert_null(m);
    assert_int_equal(err.code, TERN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "gate_up_proj"));
    /* the CUDA backend refuses gpt_oss (a build without CUDA refuses every model) */
    model_load_opts lo = {1, "cuda"};
    assert_null(m = model_load_ex(d, &lo, &err));
    assert_int_equal(err.code, TERN_EUNSUPPORTED);
}


int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batch_equivalence),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_expert_residency),
        cmocka_unit_test(test_expert_panels),
        cmocka_unit_test(test_stacked_experts),
        cmocka_unit_test(test_gpt_oss_batch),
        cmocka_unit_test(test_gpt_oss_mxfp4),
        cmocka_unit_test(test_gpt_oss_load_errors),
    };
    return cmocka_run_group_tests(tests, NULL, cleanup);
}
