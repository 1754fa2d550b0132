/* `tern convert` and quantized models: the packed words, scales and biases
 * it writes (each code the nearest on its group's stored grid, each group's
 * squared error at most the min/max grid's, recomputed here); loading and dequantizing them; the logits of the 4-
 * and 8-bit conversions of tern-demo-16m against the full-precision model
 * within the envelope documented in docs/model.md; batched == one-by-one
 * decoding for a quantized model; bad quantized files as errors. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "model/model_int.h" /* internals: the weights as loaded */
#include "tensor/kernels.h"
#include "test_util.h"

static char g_dirs[4][64];
static int g_n_dirs;

static const char *tmpdir(void)
{
    char *d = g_dirs[g_n_dirs++];
    snprintf(d, 64, "/tmp/tern-quant-XXXXXX");
    assert_non_null(mkdtemp(d));
    return d;
}

static void sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

static const char *bin(void) { return getenv("TERN_BIN") ? getenv("TERN_BIN") : "build/tern"; }

static float to_f32(tern_dtype d, const void *p, size_t i)
{
    float f;
    tern_to_f32(d, (const char *)p + i * tern_dtype_size(d), &f, 1);
    return f;
}

static float round_to(tern_dtype d, float v)
{
    return d == TERN_BF16 ? tern_bf16_to_f32(tern_f32_to_bf16(v)) : d == TERN_F16 ? tern_f16_to_f32(tern_f32_to_f16(v)) : v;
}

/* Every quantized tensor of qdir against its source in src, requantized here. */
static void check_packing(const char *src, const char *qdir, int bits, int group)
{
    tern_err err = {0};
    st_set a = {0}, q = {0};
    assert_int_equal(st_open_dir(&a, src, &err), 0);
    assert_int_equal(st_open_dir(&q, qdir, &err), 0);
    int n_quant = 0, qmax = (1 << bits) - 1;
    for (int i = 0; i < a.n_tensors; i++) {
        const st_tensor *t = &a.tensors[i];
        char name[300];
        size_t len = strlen(t->name);
        if (t->n_dims != 2 || t->shape[1] % group) {
            const st_tensor *c = st_find(&q, t->name);
            assert_non_null(c); /* copied unchanged */
            assert_int_equal(c->n_bytes, t->n_bytes);
            assert_memory_equal(c->data, t->data, t->n_bytes);
            continue;
        }
        snprintf(name, sizeof name, "%.*s.scales", (int)(len - 7), t->name);
        const st_tensor *ts = st_find(&q, name);
        snprintf(name, sizeof name, "%.*s.biases", (int)(len - 7), t->name);
        const st_tensor *tb = st_find(&q, name);
        const st_tensor *tw = st_find(&q, t->name);
        assert_non_null(ts);
        assert_non_null(tb);
        assert_non_null(tw);
        assert_int_equal(tw->dtype, TERN_U32);
        int64_t rows = t->shape[0], n = t->shape[1], ng = n / group;
        assert_true(tw->shape[0] == rows && tw->shape[1] == n * bits / 32);
        assert_true(ts->shape[0] == rows && ts->shape[1] == ng && ts->dtype == t->dtype);
        const uint32_t *words = tw->data;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < ng; g++) {
                float lo = INFINITY, hi = -INFINITY;
                for (int64_t k = 0; k < group; k++) {
                    float v = to_f32(t->dtype, t->data, (size_t)(r * n + g * group + k));
                    lo = fminf(lo, v);
                    hi = fmaxf(hi, v);
                }
                /* the min/max grid's squared error bounds the stored fit's
                 * (least-squares refits only replace it when they lower it) */
                float s0 = round_to(t->dtype, (hi - lo) / qmax), b0 = round_to(t->dtype, lo);
                float scale = to_f32(ts->dtype, ts->data, (size_t)(r * ng + g));
                float bias = to_f32(tb->dtype, tb->data, (size_t)(r * ng + g));
                assert_true(scale >= 0 && round_to(t->dtype, scale) == scale && round_to(t->dtype, bias) == bias);
                double e0 = 0, e1 = 0;
                for (int64_t k = 0; k < group; k++) {
                    int64_t idx = g * group + k; /* value idx of the row */
                    float v = to_f32(t->dtype, t->data, (size_t)(r * n + idx));
                    long want = scale > 0 ? lrintf((v - bias) / scale) : 0;
                    want = want < 0 ? 0 : want > qmax ? qmax : want;
                    uint32_t word = words[r * (n * bits / 32) + idx / (32 / bits)];
                    long got = (long)((word >> ((idx % (32 / bits)) * bits)) & (uint32_t)qmax);
                    if (got != want) /* each code the nearest on the stored grid */
                        fail_msg("%s row %lld value %lld: packed %ld, expected %ld", t->name, (long long)r,
                                 (long long)idx, got, want);
                    long c0 = s0 > 0 ? lrintf((v - b0) / s0) : 0;
                    c0 = c0 < 0 ? 0 : c0 > qmax ? qmax : c0;
                    double d0 = (double)v - ((double)s0 * c0 + b0), d1 = (double)v - ((double)scale * got + bias);
                    e0 += d0 * d0;
                    e1 += d1 * d1;
                }
                if (!(e1 <= e0))
                    fail_msg("%s row %lld group %lld: squared error %g above the min/max grid's %g", t->name,
                             (long long)r, (long long)g, e1, e0);
            }
        n_quant++;
    }
    assert_true(n_quant > 0);
    st_close(&a);
    st_close(&q);
}

static void test_packing(void **state)
{
    (void)state;
    const char *src = tmpdir(), *q4 = tmpdir(), *q8 = tmpdir();
    const char *build = getenv("TERN_BUILD") ? getenv("TERN_BUILD") : "build";
    sh("%s/tools/make_fixture --family qwen2 --dim 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 --vocab 512 "
       "--dtype bf16 --out %s --tokenizer %s",
       build, src, shared_path("models/stories260K"));
    sh("%s convert %s %s --bits 4 --group-size 32 2>/dev/null", bin(), src, q4);
    sh("%s convert %s %s --bits 8 --group-size 64 2>/dev/null", bin(), src, q8);
    /* bad requests are refused with a message, not a crash */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s convert %s %s/again --bits 4 2>/dev/null", bin(), q4, q4);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1); /* already quantized */
    snprintf(cmd, sizeof cmd, "%s convert %s %s/x --bits 3 2>/dev/null", bin(), src, q4);
    assert_int_equal(WEXITSTATUS(system(cmd)), 2);
    snprintf(cmd, sizeof cmd, "%s convert %s/nonexistent %s/x --bits 4 2>/dev/null", bin(), src, q4);
    assert_int_equal(WEXITSTATUS(system(cmd)), 1);
    check_packing(src, q4, 4, 32);
    check_packing(src, q8, 8, 64);
    /* loads, and its rows dequantize as w = scale * q + bias */
    tern_err err = {0};
    tern_model *m = model_load(q4, 1, &err);
    if (!m)
        fail_msg("%s", err.msg);
    assert_int_equal(m->embed.qbits, 4);
    assert_int_equal(m->layers[0].wq.group, 32);
    assert_int_equal(model_config_get(m)->quant_bits, 4);
    model_free(m);
    /* a mismatched scales tensor is a load error, not a crash */
    sh("cd %s && python3 -c \"import json,struct;d=open('model.safetensors','rb').read();n=struct.unpack('<Q',d[:8])[0];"
       "h=json.loads(d[8:8+n]);h['model.norm.weight']['dtype']='BOGUS';"
       "j=json.dumps(h).encode();j+=b' '*(-len(j)%%8);open('bad.safetensors','wb').write(struct.pack('<Q',len(j))+j+d[8+n:])\" "
       "&& mv bad.safetensors model.safetensors",
       q8);
    assert_null(model_load(q8, 1, &err));
    sh("sed -i 's/\"bits\":4/\"bits\":3/' %s/config.json", q4);
    assert_null(model_load(q4, 1, &err));
    assert_int_equal(err.code, TERN_EUNSUPPORTED);
}

static float *forward_all(tern_model *m, const int32_t *ids, int n, int one_by_one)
{
    tern_err err = {0};
    kv_pool kv;
    kv_seq seq = {0};
    int V = model_config_get(m)->n_vocab;
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 8, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &seq, n, &err), 0);
    float *logits = malloc((size_t)n * V * sizeof(float));
    int32_t pos[64], rows[64];
    kv_seq *seqs[64];
    for (int i = 0; i < n; i++) {
        pos[i] = rows[i] = i;
        seqs[i] = &seq;
    }
    if (one_by_one) {
        for (int i = 0; i < n; i++) {
            int32_t r0 = 0;
            fwd_batch b = {1, ids + i, pos + i, seqs, 1, &r0};
            assert_int_equal(model_forward(m, &kv, &b, logits + (size_t)i * V, &err), 0);
        }
    } else {
        fwd_batch b = {n, ids, pos, seqs, n, rows};
        assert_int_equal(model_forward(m, &kv, &b, logits, &err), 0);
    }
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
    return logits;
}

/* Envelopes of tern-demo-16m's conversions vs its bf16 weights, measured
 * over these 24 positions (docs/model.md has the numbers): max |delta logit|
 * and the share of positions whose argmax is unchanged. */
#define Q8_MAX_DELTA 0.35
#define Q4_MAX_DELTA 4.5
#define Q8_TOP1_AGREE 0.95
#define Q4_TOP1_AGREE 0.6

static void test_envelope(void **state)
{
    (void)state;
    const char *q4 = tmpdir(), *q8 = tmpdir(), *model = shared_path("models/tern-demo-16m");
    sh("%s convert %s %s --bits 4 2>/dev/null", bin(), model, q4);
    sh("%s convert %s %s --bits 8 2>/dev/null", bin(), model, q8);
    const int32_t ids[24] = {1, 412, 3021, 77, 5120, 64, 900, 18, 265, 303, 1564, 2021, 467, 11, 16, 294,
                             7000, 15, 2600, 431, 8000, 33, 99, 100};
    const int n = 24;
    tern_err err = {0};
    tern_model *full = model_load(model, 2, &err);
    assert_non_null(full);
    int V = model_config_get(full)->n_vocab;
    float *ref = forward_all(full, ids, n, 0);
    model_free(full);
    const char *dirs[2] = {q8, q4};
    const double max_d[2] = {Q8_MAX_DELTA, Q4_MAX_DELTA}, agree[2] = {Q8_TOP1_AGREE, Q4_TOP1_AGREE};
    /* integer products (the default), then the f32-activation ones */
    for (int e = 0; e < 4; e++) {
        int k = e & 1, exact = e >> 1;
        tern_kernels_exact_set(exact);
        tern_model *m = model_load(dirs[k], 2, &err);
        tern_kernels_exact_set(0);
        if (!m)
            fail_msg("%s", err.msg);
        float *lg = forward_all(m, ids, n, 0);
        double worst = 0, rms = 0;
        int same = 0;
        for (int p = 0; p < n; p++) {
            int a = 0, b = 0;
            for (int t = 0; t < V; t++) {
                double d = fabs(lg[(size_t)p * V + t] - ref[(size_t)p * V + t]);
                worst = fmax(worst, d);
                rms += d * d;
                if (lg[(size_t)p * V + t] > lg[(size_t)p * V + a])
                    a = t;
                if (ref[(size_t)p * V + t] > ref[(size_t)p * V + b])
                    b = t;
            }
            same += a == b;
        }
        printf("q%d (%s) vs bf16: max |d logit| %.3f, rms %.4f, argmax agrees at %d/%d positions\n", k ? 4 : 8,
               exact ? "exact products" : "integer products", worst, sqrt(rms / ((double)n * V)), same, n);
        assert_true(worst <= max_d[k]);
        assert_true(same >= agree[k] * n);
        { /* batched == one token per forward, bit for bit */
            float *one = forward_all(m, ids, 12, 1);
            for (size_t e = 0; e < (size_t)12 * V; e++)
                assert_true(one[e] == lg[e]);
            free(one);
        }
        free(lg);
        model_free(m);
    }
    free(ref);
}

static int cleanup(void **state)
{
    (void)state;
    for (int i = 0; i < g_n_dirs; i++)
        sh("rm -rf %s", g_dirs[i]);
    g_n_dirs = 0;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_packing, cleanup),
        cmocka_unit_test_teardown(test_envelope, cleanup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
