/* LoRA adapters (src/model/lora.c) against PEFT: random adapters written by
 * build/tools/make_lora for the random fixtures of tests/golden/manifest.json
 * (cases in tests/golden/lora/manifest.json), logits compared with
 * tests/golden/lora/peft.json (transformers + peft, float32; written by
 * tools/lora_goldens.py). Also: a batch mixing base rows and rows of two
 * adapters gives every row the bits it gets alone; config fields that change
 * the math and tensors that do not fit the base are load errors naming
 * them; a backend without adapter support refuses adapter rows; `tern
 * convert --merge-lora` gives the adapter's logits. */
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
#include "model/lora.h"
#include "model/model_int.h" /* internals: swapping in a backend with a device forward */
#include "test_util.h"

#define F32_TOL 1e-4
#define TIE_GAP 1e-4

static char g_root[256];
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

/* Every base fixture and every case's adapter, regenerated into g_root. */
static int setup(void **state)
{
    (void)state;
    tern_err err = {0};
    g_man = tern_json_parse_file(repo_path("tests/golden/manifest.json"), &err);
    g_lman = tern_json_parse_file(repo_path("tests/golden/lora/manifest.json"), &err);
    g_gold = tern_json_parse_file(repo_path("tests/golden/lora/peft.json"), &err);
    if (!g_man || !g_lman || !g_gold)
        return -1;
    snprintf(g_root, sizeof g_root, "/tmp/tern-lora-XXXXXX");
    if (!mkdtemp(g_root))
        return -1;
    const char *bin = getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build";
    json_object *fixtures, *cases;
    json_object_object_get_ex(g_man, "fixtures", &fixtures);
    json_object_object_get_ex(g_lman, "cases", &cases);
    json_object_object_foreach(cases, name, c)
    {
        json_object *base, *args, *fargs;
        json_object_object_get_ex(c, "base", &base);
        json_object_object_get_ex(c, "make_lora_args", &args);
        const char *b = json_object_get_string(base);
        if (access(path_of(b), F_OK) != 0) {
            char cmd[4096];
            snprintf(cmd, sizeof cmd, "%s/tools/make_fixture --out %s --tokenizer %s >/dev/null", bin, path_of(b),
                     shared_path("models/stories260K"));
            json_object_object_get_ex(fixtures, b, &fargs);
            args_cat(cmd, sizeof cmd, fargs);
            sh("%s", cmd);
        }
        char cmd[4096], out[300];
        snprintf(out, sizeof out, "lora-%s", name);
        snprintf(cmd, sizeof cmd, "%s/tools/make_lora --base %s --out %s", bin, path_of(b), path_of(out));
        args_cat(cmd, sizeof cmd, args);
        sh("%s", cmd);
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    if (g_root[0])
        sh("rm -rf '%s'", g_root);
    json_object_put(g_man);
    json_object_put(g_lman);
    json_object_put(g_gold);
    return 0;
}

static tern_model *load_base(const char *base)
{
    tern_err err = {0};
    model_load_opts lo = {2, "cpu"};
    tern_model *m = model_load_ex(path_of(base), &lo, &err);
    if (!m)
        fail_msg("%s: %s", base, err.msg);
    return m;
}

static model_lora *load_case(tern_model *m, const char *name)
{
    char d[300];
    snprintf(d, sizeof d, "lora-%s", name);
    tern_err err = {0};
    model_lora *a = model_lora_load(m, path_of(d), &err);
    if (!a)
        fail_msg("%s: %s", name, err.msg);
    return a;
}

/* One sequence's prompt through one forward with adapter a on every row;
 * logits [n][V]. */
static void run_prompt(tern_model *m, kv_pool *kv, kv_seq *seq, const model_lora *a, const int32_t *ids, int n,
                       int p0, float *logits)
{
    int32_t pos[128], rows[128];
    kv_seq *seqs[128];
    const model_lora *rl[128];
    tern_err err = {0};
    assert_int_equal(kv_seq_reserve(kv, seq, p0 + n, &err), 0);
    for (int i = 0; i < n; i++) {
        pos[i] = p0 + i;
        rows[i] = i;
        seqs[i] = seq;
        rl[i] = a;
    }
    fwd_batch b = {n, ids, pos, seqs, n, rows};
    if (model_forward_lora(m, kv, &b, rl, logits, NULL, &err))
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
    json_object *cases;
    assert_true(json_object_object_get_ex(g_gold, "cases", &cases));
    int n_cases = 0;
    json_object_object_foreach(cases, name, g)
    {
        json_object *base, *prompts;
        assert_true(json_object_object_get_ex(g, "base", &base));
        assert_true(json_object_object_get_ex(g, "prompts", &prompts));
        tern_model *m = load_base(json_object_get_string(base));
        model_lora *a = load_case(m, name);
        const model_config *c = model_config_get(m);
        int V = c->n_vocab;
        kv_pool kv;
        tern_err err = {0};
        assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 16, 16, &err), 0);
        float *logits = malloc((size_t)64 * V * sizeof(float));
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
            kv_seq seq = {0};
            run_prompt(m, &kv, &seq, a, ids, n, 0, logits);
            for (int i = 0; i < n; i++) {
                json_object *t5 = json_object_array_get_idx(top, i);
                for (int k = 0; k < 5; k++) {
                    json_object *pair = json_object_array_get_idx(t5, k);
                    int id = json_object_get_int(json_object_array_get_idx(pair, 0));
                    double d = fabs(logits[(size_t)i * V + id] - json_object_get_double(json_object_array_get_idx(pair, 1)));
                    if (d > F32_TOL)
                        fail_msg("%s prompt %zu pos %d id %d: |d| %g over %g", name, p, i, id, d, F32_TOL);
                    worst = fmax(worst, d);
                }
            }
            /* greedy through the cached decode path, the adapter on every step */
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
                run_prompt(m, &kv, &seq, a, &tok, 1, n + (int)k, logits);
                last = argmax(logits, V);
            }
            greedy_ok += !tie;
            ties += tie;
            kv_seq_free(&kv, &seq);
        }
        printf("%-28s top-5 max |d| vs PEFT f32 %.2g; greedy 16: %d equal, %d stopped at a tie\n", name, worst,
               greedy_ok, ties);
        free(logits);
        kv_pool_free(&kv);
        model_lora_release(a);
        model_free(m);
        n_cases++;
    }
    assert_true(n_cases >= 6);
}

/* Base, adapter A and adapter B rows (and A again, apart) in one batch, at
 * mixed positions, in two orders: each row's logits are the bits it gets
 * alone. */
static void test_mixed_batch(void **state)
{
    (void)state;
    tern_model *m = load_base("llama3");
    model_lora *A = load_case(m, "llama3-qv-r4"), *B = load_case(m, "llama3-all-r8-patterns");
    const model_config *c = model_config_get(m);
    int V = c->n_vocab;
    tern_err err = {0};
    kv_pool kv;
    assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 16, 32, &err), 0);
    enum { NS = 4, L = 9 };
    static const int32_t prompts[NS][L] = {{1, 403, 407, 261, 378, 432, 383, 286, 9},
                                           {1, 5, 77, 300, 12, 44, 45, 46, 47},
                                           {1, 450, 2, 33, 99, 100, 101, 7, 8},
                                           {1, 5, 77, 300, 12, 44, 45, 46, 47}};
    const model_lora *who[NS] = {NULL, A, B, A};
    float *alone = malloc((size_t)NS * L * V * sizeof(float)), *mixed = malloc((size_t)NS * L * V * sizeof(float));
    for (int s = 0; s < NS; s++) {
        kv_seq seq = {0};
        run_prompt(m, &kv, &seq, who[s], prompts[s], L, 0, alone + (size_t)s * L * V);
        kv_seq_free(&kv, &seq);
    }
    /* the base row alone equals model_forward: the adapter path leaves it alone */
    {
        kv_seq seq = {0};
        int32_t pos[L], rows[L];
        kv_seq *seqs[L];
        assert_int_equal(kv_seq_reserve(&kv, &seq, L, &err), 0);
        for (int i = 0; i < L; i++) {
            pos[i] = rows[i] = i;
            seqs[i] = &seq;
        }
        fwd_batch b = {L, prompts[0], pos, seqs, L, rows};
        assert_int_equal(model_forward(m, &kv, &b, mixed, &err), 0);
        assert_memory_equal(mixed, alone, (size_t)L * V * sizeof(float));
        kv_seq_free(&kv, &seq);
        /* the same prompt under A twice (rows 1 and 3) agrees; under the
         * base it does not: the adapter changes the answer */
        assert_memory_equal(alone + (size_t)1 * L * V, alone + (size_t)3 * L * V, (size_t)L * V * sizeof(float));
        kv_seq s1 = {0};
        run_prompt(m, &kv, &s1, NULL, prompts[1], L, 0, mixed);
        assert_true(memcmp(mixed, alone + (size_t)1 * L * V, (size_t)L * V * sizeof(float)) != 0);
        kv_seq_free(&kv, &s1);
    }
    for (int order = 0; order < 2; order++) {
        kv_seq seqs_s[NS];
        memset(seqs_s, 0, sizeof seqs_s);
        /* step 1: prompt chunks of different lengths; step 2: the rest */
        int cut[NS] = {3, 5, 1, 7};
        for (int step = 0; step < 2; step++) {
            int32_t tok[NS * L], pos[NS * L], rows[NS * L];
            kv_seq *sq[NS * L];
            const model_lora *rl[NS * L];
            int n = 0, src[NS * L];
            for (int k = 0; k < NS; k++) {
                int s = order ? NS - 1 - k : k;
                int lo = step ? cut[s] : 0, hi = step ? L : cut[s];
                assert_int_equal(kv_seq_reserve(&kv, &seqs_s[s], hi, &err), 0);
                for (int p = lo; p < hi; p++) {
                    tok[n] = prompts[s][p];
                    pos[n] = p;
                    sq[n] = &seqs_s[s];
                    rl[n] = who[s];
                    rows[n] = n;
                    src[n++] = s * L + p;
                }
            }
            float *lg = malloc((size_t)n * V * sizeof(float));
            fwd_batch b = {n, tok, pos, sq, n, rows};
            assert_int_equal(model_forward_lora(m, &kv, &b, rl, lg, NULL, &err), 0);
            for (int i = 0; i < n; i++)
                memcpy(mixed + (size_t)src[i] * V, lg + (size_t)i * V, (size_t)V * sizeof(float));
            free(lg);
        }
        for (int s = 0; s < NS; s++) {
            if (memcmp(mixed + (size_t)s * L * V, alone + (size_t)s * L * V, (size_t)L * V * sizeof(float)))
                fail_msg("order %d: sequence %d's logits in the mixed batch differ from alone", order, s);
            kv_seq_free(&kv, &seqs_s[s]);
        }
    }
    free(alone);
    free(mixed);
    kv_pool_free(&kv);
    model_lora_release(A);
    model_lora_release(B);
    model_free(m);
}

/* Copies case `from`'s adapter to a scratch folder with field key of its
 * config replaced by the JSON text val (NULL: removed); returns the folder. */
static const char *edited(const char *from, const char *key, const char *val)
{
    const char *d = path_of("edited");
    sh("rm -rf '%s' && cp -r '%s/lora-%s' '%s'", d, g_root, from, d);
    char cfg[600];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", d);
    tern_err err = {0};
    json_object *o = tern_json_parse_file(cfg, &err);
    assert_non_null(o);
    json_object_object_del(o, key);
    if (val)
        json_object_object_add(o, key, json_tokener_parse(val));
    assert_int_equal(json_object_to_file(cfg, o), 0);
    json_object_put(o);
    return d;
}

static void expect_error(tern_model *m, const char *dir, int code, const char *needle)
{
    tern_err err = {0};
    model_lora *a = model_lora_load(m, dir, &err);
    if (a)
        fail_msg("loaded, expected an error naming '%s'", needle);
    assert_int_equal(err.code, code);
    if (!strstr(err.msg, needle))
        fail_msg("error '%s' does not name '%s'", err.msg, needle);
}

static void test_load_errors(void **state)
{
    (void)state;
    tern_model *m = load_base("llama3");
    /* an adapter of another shape (qwen3's heads are 32 wide) */
    expect_error(m, path_of("lora-qwen3-attn-r2"), TERN_EFORMAT,
                 "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
    /* fields that change the math */
    expect_error(m, edited("llama3-qv-r4", "use_dora", "true"), TERN_EUNSUPPORTED, "use_dora");
    expect_error(m, edited("llama3-qv-r4", "bias", "\"lora_only\""), TERN_EUNSUPPORTED, "bias");
    expect_error(m, edited("llama3-qv-r4", "modules_to_save", "[\"lm_head\"]"), TERN_EUNSUPPORTED, "modules_to_save");
    expect_error(m, edited("llama3-qv-r4", "fan_in_fan_out", "true"), TERN_EUNSUPPORTED, "fan_in_fan_out");
    expect_error(m, edited("llama3-qv-r4", "layer_replication", "[[0, 2]]"), TERN_EUNSUPPORTED, "layer_replication");
    expect_error(m, edited("llama3-qv-r4", "some_new_knob", "3"), TERN_EUNSUPPORTED, "some_new_knob");
    expect_error(m, edited("llama3-qv-r4", "peft_type", "\"IA3\""), TERN_EUNSUPPORTED, "peft_type");
    expect_error(m, edited("llama3-qv-r4", "target_modules", "\".*q_proj\""), TERN_EUNSUPPORTED, "target_modules");
    expect_error(m, edited("llama3-qv-r4", "target_modules", "[\"q_proj\", \"lm_head\"]"), TERN_EUNSUPPORTED,
                 "lm_head");
    expect_error(m, edited("llama3-qv-r4", "rank_pattern", "{\"layers\\\\.0\\\\..*\": 2}"), TERN_EUNSUPPORTED,
                 "rank_pattern");
    expect_error(m, edited("llama3-qv-r4", "r", NULL), TERN_EFORMAT, "'r'");
    /* tensors the config does not explain, or misses */
    expect_error(m, edited("llama3-qv-r4", "target_modules", "[\"q_proj\"]"), TERN_EFORMAT,
                 "layers.0.self_attn.v_proj.lora_A.weight");
    expect_error(m, edited("llama3-qv-r4", "target_modules", "[\"q_proj\", \"v_proj\", \"k_proj\"]"), TERN_EFORMAT,
                 "layers.0.self_attn.k_proj.lora_A.weight");
    /* a rank_pattern the tensors do not have */
    expect_error(m, edited("llama3-qv-r4", "rank_pattern", "{\"v_proj\": 2}"), TERN_EFORMAT,
                 "layers.0.self_attn.v_proj.lora_A.weight");
    /* harmless fields set: fine */
    tern_err err = {0};
    model_lora *a = model_lora_load(m, edited("llama3-qv-r4", "lora_dropout", "0.1"), &err);
    assert_non_null(a);
    model_lora_release(a);
    a = model_lora_load(m, path_of("nowhere"), &err);
    assert_null(a);
    assert_non_null(strstr(err.msg, "adapter_config.json"));
    model_free(m);
}

/* tern convert --merge-lora: the merged model's logits are the adapter's
 * (within f32 rounding of W + s B A against W x + s B (A x)), for two
 * adapters (one with rank_pattern / alpha_pattern, one bf16 rsLoRA). */
static void test_merged_convert(void **state)
{
    (void)state;
    static const char *cases[2][2] = {{"llama3", "llama3-all-r8-patterns"}, {"qwen2", "qwen2-all-rslora-r16-bf16"}};
    const char *bin = getenv("TERN_BIN") ? getenv("TERN_BIN") : "build/tern";
    for (int k = 0; k < 2; k++) {
        char lora_dir[300];
        snprintf(lora_dir, sizeof lora_dir, "lora-%s", cases[k][1]);
        sh("%s convert '%s' '%s' --merge-lora '%s' 2>/dev/null", bin, path_of(cases[k][0]), path_of("merged"),
           path_of(lora_dir));
        tern_model *m = load_base(cases[k][0]), *mm = load_base("merged");
        model_lora *a = load_case(m, cases[k][1]);
        const model_config *c = model_config_get(m);
        int V = c->n_vocab;
        tern_err err = {0};
        kv_pool kv;
        assert_int_equal(kv_pool_init(&kv, c->n_layer, model_kv_dim(m), 16, 8, &err), 0);
        static const int32_t ids[12] = {1, 450, 2, 33, 99, 100, 101, 7, 8, 9, 250, 251};
        float *la = malloc((size_t)12 * V * sizeof(float)), *lm = malloc((size_t)12 * V * sizeof(float));
        kv_seq s1 = {0}, s2 = {0};
        run_prompt(m, &kv, &s1, a, ids, 12, 0, la);
        run_prompt(mm, &kv, &s2, NULL, ids, 12, 0, lm);
        double worst = 0;
        for (size_t i = 0; i < (size_t)12 * V; i++)
            worst = fmax(worst, fabs(la[i] - lm[i]));
        printf("merged %-28s max |d| vs the adapter %.2g\n", cases[k][1], worst);
        assert_true(worst <= F32_TOL);
        kv_seq_free(&kv, &s1);
        run_prompt(m, &kv, &s1, NULL, ids, 12, 0, la); /* and the base is another model */
        kv_seq_free(&kv, &s1);
        kv_seq_free(&kv, &s2);
        assert_true(memcmp(la, lm, (size_t)V * sizeof(float)) != 0);
        free(la);
        free(lm);
        kv_pool_free(&kv);
        model_lora_release(a);
        model_free(mm);
        model_free(m);
        sh("rm -rf '%s'", path_of("merged"));
    }
}

static int fake_forward(model_backend *be, tern_model *m, kv_pool *kv, const fwd_batch *b, float *logits,
                        tern_err *err)
{
    (void)be, (void)m, (void)kv, (void)b, (void)logits, (void)err;
    return 0;
}

/* A backend with a device forward (CUDA's shape) refuses adapter rows
 * rather than answering them with the base. */
static void test_device_refuses(void **state)
{
    (void)state;
    tern_model *m = load_base("llama3");
    model_lora *A = load_case(m, "llama3-qv-r4");
    model_backend fake = *model_backend_get(m);
    fake.name = "fake-device";
    fake.forward = fake_forward;
    model_backend *own = model_backend_swap(m, &fake);
    tern_err err = {0};
    assert_int_equal(model_lora_supported(m, &err), TERN_EUNSUPPORTED);
    assert_non_null(strstr(err.msg, "fake-device"));
    kv_pool kv;
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 4, &err), 0);
    kv_seq seq = {0};
    assert_int_equal(kv_seq_reserve(&kv, &seq, 2, &err), 0);
    int32_t ids[2] = {1, 5}, pos[2] = {0, 1}, rows[1] = {1};
    kv_seq *sq[2] = {&seq, &seq};
    const model_lora *rl[2] = {NULL, A}, *none[2] = {NULL, NULL};
    float *lg = malloc((size_t)model_config_get(m)->n_vocab * sizeof(float));
    fwd_batch b = {2, ids, pos, sq, 1, rows};
    assert_int_equal(model_forward_lora(m, &kv, &b, rl, lg, NULL, &err), TERN_EUNSUPPORTED);
    assert_int_equal(model_forward_lora(m, &kv, &b, none, lg, NULL, &err), 0);
    free(lg);
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
    model_backend_swap(m, own);
    model_lora_release(A);
    model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peft_goldens),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_merged_convert),
        cmocka_unit_test(test_device_refuses),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
