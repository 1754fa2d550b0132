/* LoRA adapters on the CUDA device forward (src/model/backend_cuda_lora.c,
 * src/tensor/cuda/lora.cu) against PEFT and against the CPU:
 *  - the PEFT goldens of tests/golden/lora (transformers + peft, f32) for
 *    every case whose base the GPU runs (head_dim a multiple of 32): top-5
 *    logits within 1e-4 along the prompt, 16 greedy ids through the cached
 *    decode path (the adapter on every step) equal unless PEFT's own gap is
 *    a tie;
 *  - the device halves (model_forward_start_lora, then logits) give the
 *    bits of the one-call forward;
 *  - a batch mixing base rows and rows of two adapters at mixed positions,
 *    prompt chunks then decode steps of all rows together: each row gets
 *    the tokens it gets alone and logits within 1e-5;
 *  - a bf16 base with an adapter, exact products: the GPU's logits against
 *    the CPU's within 2e-3 relative (the adapter's update is there: they
 *    are far from the base's).
 * Fixtures: the random bases of tests/golden/manifest.json and adapters
 * from build/tools/make_lora (TERN_LORA_FIXTURES: a folder already holding
 * them). Skipped without a GPU. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/json.h"
#include "model/backend_cuda.h"
#include "model/lora.h"
#include "tensor/kernels.h"
#include "test_util.h"

#define F32_TOL 1e-4
#define TIE_GAP 1e-4

static char g_root[256];
static int g_own_root;
static json_object *g_man, *g_lman, *g_gold;

static void sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

static const char *path_of(const char *name)
{
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%.255s/%.500s", g_root, name);
    return buf[k];
}

static void args_cat(char *out, size_t cap, json_object *args)
{
    size_t n = strlen(out);
    for (size_t i = 0; i < json_object_array_length(args) && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, " '%s'", json_object_get_string(json_object_array_get_idx(args, i)));
}

/* Base fixture b (from manifest.json) and adapter `out` made with the
 * make_lora arguments args, unless they are there already. */
static void make_case(const char *b, const char *out, json_object *args)
{
    const char *bin = getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build";
    json_object *fixtures, *fargs;
    json_object_object_get_ex(g_man, "fixtures", &fixtures);
    if (access(path_of(b), F_OK) != 0) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s/tools/make_fixture --out %s --tokenizer %s >/dev/null", bin, path_of(b),
                 shared_path("models/stories260K"));
        assert_true(json_object_object_get_ex(fixtures, b, &fargs));
        args_cat(cmd, sizeof cmd, fargs);
        sh("%s", cmd);
    }
    if (access(path_of(out), F_OK) != 0) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s/tools/make_lora --base %s --out %s", bin, path_of(b), path_of(out));
        args_cat(cmd, sizeof cmd, args);
        sh("%s", cmd);
    }
}

/* The extra adapters of these tests (beyond the golden cases). */
static const char *const extra_cases[][3] = {
    {"qwen3", "lora-qwen3-all-r8", "--r 8 --alpha 16 --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                                   "down_proj --seed 31"},
    {"gemma3_bf16", "lora-gemma3-bf16-all-r8", "--r 8 --alpha 16 --targets q_proj,k_proj,v_proj,o_proj,"
                                               "gate_proj,up_proj,down_proj --seed 32"},
};

static int setup(void **state)
{
    (void)state;
    tern_err err = {0};
    g_man = tern_json_parse_file(repo_path("tests/golden/manifest.json"), &err);
    g_lman = tern_json_parse_file(repo_path("tests/golden/lora/manifest.json"), &err);
    g_gold = tern_json_parse_file(repo_path("tests/golden/lora/peft.json"), &err);
    if (!g_man || !g_lman || !g_gold)
        return -1;
    if (model_cuda_device_count() <= 0)
        return 0; /* every test skips */
    const char *fx = getenv("TERN_LORA_FIXTURES");
    if (fx && *fx) {
        snprintf(g_root, sizeof g_root, "%s", fx);
    } else {
        snprintf(g_root, sizeof g_root, "/tmp/tern-cuda-lora-XXXXXX");
        if (!mkdtemp(g_root))
            return -1;
        g_own_root = 1;
    }
    json_object *cases;
    json_object_object_get_ex(g_lman, "cases", &cases);
    json_object_object_foreach(cases, name, c)
    {
        json_object *base, *args;
        json_object_object_get_ex(c, "base", &base);
        json_object_object_get_ex(c, "make_lora_args", &args);
        char out[300];
        snprintf(out, sizeof out, "lora-%s", name);
        make_case(json_object_get_string(base), out, args);
    }
    for (size_t i = 0; i < sizeof extra_cases / sizeof *extra_cases; i++) {
        json_object *args = json_object_new_array();
        char buf[512], *save = NULL;
        snprintf(buf, sizeof buf, "%s", extra_cases[i][2]);
        for (char *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save))
            json_object_array_add(args, json_object_new_string(t));
        make_case(extra_cases[i][0], extra_cases[i][1], args);
        json_object_put(args);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (g_own_root)
        sh("rm -rf '%s'", g_root);
    json_object_put(g_man);
    json_object_put(g_lman);
    json_object_put(g_gold);
    return 0;
}

/* Base b on device dev ("cuda" or "cpu"); NULL when the device cannot run
 * it (the CUDA attention's head_dim rule), with why in err. */
static tern_model *load_base(const char *b, const char *dev, tern_err *err)
{
    model_load_opts lo = {2, dev};
    return model_load_ex(path_of(b), &lo, err);
}

static model_lora *load_adapter(tern_model *m, const char *dir)
{
    tern_err err = {0};
    model_lora *a = model_lora_load(m, path_of(dir), &err);
    if (!a)
        fail_msg("%s: %s", dir, err.msg);
    return a;
}

/* n tokens of one sequence from position p0 in one forward, adapter a on
 * every row (halves: through model_forward_start_lora + logits); logits [n][V]. */
static void run_prompt(tern_model *m, kv_pool *kv, kv_seq *seq, const model_lora *a, const int32_t *ids, int n,
                       int p0, float *logits, int halves)
{
    int32_t pos[128], rows[128];
    kv_seq *seqs[128];
    const model_lora *rl[128];
    tern_err err = {0};
    assert_true(n <= 128);
    assert_int_equal(kv_seq_reserve(kv, seq, p0 + n, &err), 0);
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        rows[i] = i;
        seqs[i] = seq;
        rl[i] = a;
    }
    fwd_batch b = {n, ids, pos, seqs, n, rows};
    int rc = halves ? model_forward_start_lora(m, kv, &b, rl, &err) : model_forward_lora(m, kv, &b, rl, logits, NULL, &err);
    if (!rc && halves)
        rc = model_forward_logits(m, logits, &err);
    if (rc)
        fail_msg("forward: %s", err.msg);
}

static int argmax(const float *row, int V)
{
    int best = 0;
    for (int t = 1; t < V; t++)
        if (row[t] > row[best])
            best = t;
    return best;
}

static void test_peft_goldens(void **state)
{
    (void)state;
    if (model_cuda_device_count() <= 0)
        skip();
    json_object *cases;
    assert_true(json_object_object_get_ex(g_gold, "cases", &cases));
    int n_cases = 0;
    json_object_object_foreach(cases, name, g)
    {
        json_object *base, *prompts;
        assert_true(json_object_object_get_ex(g, "base", &base));
        assert_true(json_object_object_get_ex(g, "prompts", &prompts));
        tern_err err = {0};
        tern_model *m = load_base(json_object_get_string(base), "cuda", &err);
        if (!m) {
            printf("%-28s not on the GPU: %s\n", name, err.msg);
            continue;
        }
        char dir[300];
        snprintf(dir, sizeof dir, "lora-%s", name);
        model_lora *a = load_adapter(m, dir);
        const model_config *c = model_config_get(m);
        int V = c->n_vocab;
        kv_pool kv;
        assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 16, 16, &err), 0);
        float *logits = malloc((size_t)64 * V * sizeof(float)), *again = malloc((size_t)64 * V * sizeof(float));
        double worst = 0;
        int greedy_ok = 0, ties = 0;
        for (size_t p = 0; p < json_object_array_length(prompts); p++) {
            json_object *pr = json_object_array_get_idx(prompts, p), *ids_j, *top, *greedy, *gap;
            assert_true(json_object_object_get_ex(pr, "ids", &ids_j));
            assert_true(json_object_object_get_ex(pr, "top5", &top));
            assert_true(json_object_object_get_ex(pr, "greedy", &greedy));
            assert_true(json_object_object_get_ex(pr, "gap", &gap));
            int32_t ids[64];
            int n = (int)json_object_array_length(ids_j);
            assert_true(n <= 64);
            for (int i = 0; i < n; i++)
                ids[i] = json_object_get_int(json_object_array_get_idx(ids_j, i));
            kv_seq seq = {0}, seq2 = {0};
            run_prompt(m, &kv, &seq, a, ids, n, 0, logits, 0);
            /* the device halves: the same forward, the same bits */
            run_prompt(m, &kv, &seq2, a, ids, n, 0, again, 1);
            assert_memory_equal(logits, again, (size_t)n * V * sizeof(float));
            kv_seq_free(&kv, &seq2);
            for (int i = 0; i < n; i++) {
                json_object *t5 = json_object_array_get_idx(top, i);
                for (int k = 0; k < 5; k++) {
                    json_object *pair = json_object_array_get_idx(t5, k);
                    int id = json_object_get_int(json_object_array_get_idx(pair, 0));
                    double d =
                        fabs(logits[(size_t)i * V + id] - json_object_get_double(json_object_array_get_idx(pair, 1)));
                    if (d > F32_TOL)
                        fail_msg("%s prompt %zu pos %d id %d: |d| %g over %g", name, p, i, id, d, F32_TOL);
                    worst = fmax(worst, d);
                }
            }
            int last = argmax(logits + (size_t)(n - 1) * V, V), tie = 0;
            for (size_t k = 0; k < json_object_array_length(greedy); k++) {
                int want = json_object_get_int(json_object_array_get_idx(greedy, k));
                if (last != want) {
                    double hf_gap = json_object_get_double(json_object_array_get_idx(gap, k));
                    if (hf_gap >= TIE_GAP)
                        fail_msg("%s prompt %zu: greedy step %zu gives %d, PEFT %d (gap %g)", name, p, k, last, want,
                                 hf_gap);
                    tie = 1;
                    break;
                }
                int32_t tok = last;
                run_prompt(m, &kv, &seq, a, &tok, 1, n + (int)k, logits, (int)(k & 1));
                last = argmax(logits, V);
            }
            greedy_ok += !tie;
            ties += tie;
            kv_seq_free(&kv, &seq);
        }
        printf("%-28s GPU top-5 max |d| vs PEFT f32 %.2g; greedy 16: %d equal, %d stopped at a tie\n", name, worst,
               greedy_ok, ties);
        free(logits);
        free(again);
        kv_pool_free(&kv);
        model_lora_release(a);
        model_free(m);
        n_cases++;
    }
    assert_true(n_cases >= 3); /* qwen3, gemma2, gemma3 (head_dim 32) */
}

/* Base, A, B and A again (another prompt) in one batch: prompt chunks of
 * different lengths over two steps, then decode steps of all four rows
 * together, against each alone. */
static void test_mixed_batch(void **state)
{
    (void)state;
    if (model_cuda_device_count() <= 0)
        skip();
    tern_err err = {0};
    tern_model *m = load_base("qwen3", "cuda", &err);
    if (!m)
        fail_msg("%s", err.msg);
    model_lora *A = load_adapter(m, "lora-qwen3-attn-r2"), *B = load_adapter(m, "lora-qwen3-all-r8");
    const model_config *c = model_config_get(m);
    int V = c->n_vocab;
    kv_pool kv;
    assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 16, 64, &err), 0);
    enum { NS = 4, L = 9, D = 8 };
    static const int32_t prompts[NS][L] = {{1, 403, 407, 261, 378, 432, 383, 286, 9},
                                           {1, 5, 77, 300, 12, 44, 45, 46, 47},
                                           {1, 450, 2, 33, 99, 100, 101, 7, 8},
                                           {1, 5, 77, 300, 12, 44, 45, 46, 48}};
    const model_lora *who[NS] = {NULL, A, B, A};
    float *alone = malloc((size_t)NS * (L + D) * V * sizeof(float)), *lg = malloc((size_t)NS * L * V * sizeof(float));
    int32_t ids_alone[NS][D + 1];
    for (int s = 0; s < NS; s++) {
        kv_seq seq = {0};
        float *o = alone + (size_t)s * (L + D) * V;
        run_prompt(m, &kv, &seq, who[s], prompts[s], L, 0, o, 0);
        ids_alone[s][0] = argmax(o + (size_t)(L - 1) * V, V);
        for (int k = 0; k < D; k++) {
            run_prompt(m, &kv, &seq, who[s], &ids_alone[s][k], 1, L + k, o + (size_t)(L + k) * V, 0);
            ids_alone[s][k + 1] = argmax(o + (size_t)(L + k) * V, V);
        }
        kv_seq_free(&kv, &seq);
    }
    /* the adapters change the answer: A's row against the base on its prompt */
    {
        kv_seq seq = {0};
        run_prompt(m, &kv, &seq, NULL, prompts[1], L, 0, lg, 0);
        assert_true(memcmp(lg, alone + (size_t)1 * (L + D) * V, (size_t)L * V * sizeof(float)) != 0);
        kv_seq_free(&kv, &seq);
    }
    double worst = 0;
    for (int order = 0; order < 2; order++) {
        kv_seq sq_s[NS];
        memset(sq_s, 0, sizeof sq_s);
        int cut[NS] = {3, 5, 1, 7};
        int32_t cur[NS];
        for (int step = 0; step < 2 + D; step++) {
            int32_t tok[NS * L], pos[NS * L], rows[NS * L];
            kv_seq *sq[NS * L];
            const model_lora *rl[NS * L];
            int n = 0, src[NS * L];
            for (int k = 0; k < NS; k++) {
                int s = order ? NS - 1 - k : k;
                int lo = step == 0 ? 0 : step == 1 ? cut[s] : L + step - 2, hi = step == 0 ? cut[s] : step == 1 ? L : lo + 1;
                assert_int_equal(kv_seq_reserve(&kv, &sq_s[s], hi, &err), 0);
                for (int p = lo; p < hi; p++) {
                    tok[n] = p < L ? prompts[s][p] : cur[s];
                    pos[n] = p;
                    sq[n] = &sq_s[s];
                    rl[n] = who[s];
                    rows[n] = n;
                    src[n++] = s * (L + D) + p;
                }
            }
            fwd_batch b = {n, tok, pos, sq, n, rows};
            int rc = step & 1 ? model_forward_lora(m, &kv, &b, rl, lg, NULL, &err)
                              : model_forward_start_lora(m, &kv, &b, rl, &err);
            if (!rc && !(step & 1))
                rc = model_forward_logits(m, lg, &err);
            if (rc)
                fail_msg("forward: %s", err.msg);
            for (int i = 0; i < n; i++) {
                const float *want = alone + (size_t)src[i] * V, *got = lg + (size_t)i * V;
                for (int t = 0; t < V; t++)
                    worst = fmax(worst, fabs((double)want[t] - got[t]));
                int s = src[i] / (L + D), p = src[i] % (L + D);
                if (p >= L - 1) {
                    int id = argmax(got, V);
                    if (id != ids_alone[s][p - (L - 1)])
                        fail_msg("order %d: row %d position %d gives %d in the batch, %d alone", order, s, p, id,
                                 ids_alone[s][p - (L - 1)]);
                    cur[s] = id;
                }
            }
        }
        for (int s = 0; s < NS; s++)
            kv_seq_free(&kv, &sq_s[s]);
    }
    printf("mixed base/A/B batch: greedy ids as alone; logits max |d| vs alone %.2g\n", worst);
    assert_true(worst <= 1e-5);
    free(alone);
    free(lg);
    kv_pool_free(&kv);
    model_lora_release(A);
    model_lora_release(B);
    model_free(m);
}

/* A bf16 base: the adapter's logits on the GPU against the CPU's. */
static void test_bf16_vs_cpu(void **state)
{
    (void)state;
    if (model_cuda_device_count() <= 0)
        skip();
    tern_err err = {0};
    tern_model *mg = load_base("gemma3_bf16", "cuda", &err), *mc = mg ? load_base("gemma3_bf16", "cpu", &err) : NULL;
    if (!mg || !mc)
        fail_msg("%s", err.msg);
    model_lora *ag = load_adapter(mg, "lora-gemma3-bf16-all-r8"), *ac = load_adapter(mc, "lora-gemma3-bf16-all-r8");
    const model_config *c = model_config_get(mg);
    int V = c->n_vocab;
    static const int32_t ids[] = {1, 403, 407, 261, 378, 432, 383, 286, 9, 77, 300, 12};
    enum { N = sizeof ids / sizeof *ids };
    float *g = malloc((size_t)N * V * sizeof(float)), *cpu = malloc((size_t)N * V * sizeof(float)),
          *base = malloc((size_t)N * V * sizeof(float));
    kv_pool kg, kc;
    assert_int_equal(kv_pool_init(&kg, c->n_layer, model_kv_dim(mg), 16, 8, &err), 0);
    assert_int_equal(kv_pool_init(&kc, c->n_layer, model_kv_dim(mc), 16, 8, &err), 0);
    kv_seq s1 = {0}, s2 = {0}, s3 = {0};
    run_prompt(mg, &kg, &s1, ag, ids, N, 0, g, 0);
    run_prompt(mc, &kc, &s2, ac, ids, N, 0, cpu, 0);
    run_prompt(mg, &kg, &s3, NULL, ids, N, 0, base, 0);
    double e2 = 0, n2 = 0, b2 = 0;
    for (size_t i = 0; i < (size_t)N * V; i++) {
        e2 += ((double)g[i] - cpu[i]) * ((double)g[i] - cpu[i]);
        b2 += ((double)base[i] - cpu[i]) * ((double)base[i] - cpu[i]);
        n2 += (double)cpu[i] * cpu[i];
    }
    double rel = sqrt(e2 / n2), rel_base = sqrt(b2 / n2);
    printf("bf16 gemma3 + adapter: GPU vs CPU relative L2 %.2g (the base's distance %.2g)\n", rel, rel_base);
    assert_true(rel < 2e-3);
    assert_true(rel_base > 20 * rel);
    kv_seq_free(&kg, &s1);
    kv_seq_free(&kc, &s2);
    kv_seq_free(&kg, &s3);
    kv_pool_free(&kg);
    kv_pool_free(&kc);
    free(g);
    free(cpu);
    free(base);
    model_lora_release(ag);
    model_lora_release(ac);
    model_free(mg);
    model_free(mc);
}

int main(void)
{
    /* exact products on both sides (--exact-products): the bf16 comparison
     * is then of f32-activation products (the default GPU throughput mode
     * rounds activations to bf16: 7.7e-3 measured against the CPU) */
    tern_kernels_exact_set(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peft_goldens),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_bf16_vs_cpu),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
