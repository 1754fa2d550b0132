/* Sampler tests: processors applied exactly, and the drawn distribution
 * checked statistically against the distribution computed independently
 * here (total-variation bound over many draws). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample/sample.h"

#define V 12
static const float base_logits[V] = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, 3.0f, -2.0f, 0.25f, 1.25f, -3.0f};

/* Independent reference: softmax at temperature, then the truncations in
 * HF's order (top-k, top-p over the renormalized top-k, min-p). */
static void reference_dist(const sample_params *p, double *q)
{
    double mx = -1e30, sum = 0;
    for (int i = 0; i < V; i++)
        mx = fmax(mx, base_logits[i]);
    for (int i = 0; i < V; i++)
        sum += q[i] = exp((base_logits[i] - mx) / p->temperature);
    for (int i = 0; i < V; i++)
        q[i] /= sum;
    int order[V];
    for (int i = 0; i < V; i++)
        order[i] = i;
    for (int i = 0; i < V; i++) /* selection sort, descending */
        for (int j = i + 1; j < V; j++)
            if (q[order[j]] > q[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int keep = V;
    if (p->top_k > 0 && p->top_k < keep)
        keep = p->top_k;
    double mk = 0;
    for (int j = 0; j < keep; j++)
        mk += q[order[j]];
    if (p->top_p < 1) {
        double c = 0;
        for (int j = 0; j < keep; j++) {
            c += q[order[j]] / mk;
            if (c >= p->top_p - 1e-9) {
                keep = j + 1;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        int j = 1;
        while (j < keep && q[order[j]] >= p->min_p * q[order[0]])
            j++;
        keep = j;
    }
    double ks = 0;
    for (int j = 0; j < keep; j++)
        ks += q[order[j]];
    double out[V] = {0};
    for (int j = 0; j < keep; j++)
        out[order[j]] = q[order[j]] / ks;
    memcpy(q, out, sizeof out);
}

static double draw_tv(const sample_params *p, int n_draws)
{
    sample_state s;
    assert_int_equal(sample_state_init(&s, p, V, NULL, 0, NULL), 0);
    double cnt[V] = {0}, q[V];
    float x[V];
    for (int k = 0; k < n_draws; k++) {
        memcpy(x, base_logits, sizeof x);
        sample_result r;
        assert_int_equal(sample_row(&s, p, x, NULL, &r), 0);
        assert_true(r.id >= 0 && r.id < V);
        cnt[r.id]++;
    }
    reference_dist(p, q);
    double tv = 0;
    for (int i = 0; i < V; i++) {
        if (q[i] == 0)
            assert_true(cnt[i] == 0); /* truncated ids are never drawn */
        tv += fabs(cnt[i] / n_draws - q[i]);
    }
    sample_state_free(&s);
    return tv / 2;
}

static void test_distributions(void **state)
{
    (void)state;
    struct { float t; int k; float p, minp; } cases[] = {
        {1.0f, 0, 1.0f, 0}, {0.5f, 0, 1.0f, 0}, {2.0f, 0, 1.0f, 0}, {1.0f, 3, 1.0f, 0},
        {1.0f, 0, 0.8f, 0}, {0.7f, 5, 0.9f, 0}, {1.0f, 0, 1.0f, 0.2f}, {1.3f, 6, 0.95f, 0.05f},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sample_params p;
        sample_params_default(&p);
        p.temperature = cases[c].t;
        p.top_k = cases[c].k;
        p.top_p = cases[c].p;
        p.min_p = cases[c].minp;
        p.seed = 1234 + c;
        /* 60k draws: the TV of a 12-bin empirical distribution is ~0.01 */
        double tv = draw_tv(&p, 60000);
        printf("case %zu: total variation %.4f\n", c, tv);
        assert_true(tv < 0.02);
    }
}

static void test_greedy_mask_bias_penalties(void **state)
{
    (void)state;
    sample_params p;
    sample_params_default(&p);
    p.temperature = 0;
    p.n_logprobs = 3;
    sample_state s;
    assert_int_equal(sample_state_init(&s, &p, V, NULL, 0, NULL), 0);
    float x[V];
    sample_result r;
    memcpy(x, base_logits, sizeof x);
    assert_int_equal(sample_row(&s, &p, x, NULL, &r), 0);
    assert_int_equal(r.id, 7);
    assert_int_equal(r.n_top, 3);
    assert_int_equal(r.top[0].id, 7);
    assert_int_equal(r.top[1].id, 0);
    assert_int_equal(r.top[2].id, 1);
    double lse = 0;
    for (int i = 0; i < V; i++)
        lse += exp(base_logits[i]);
    assert_true(fabs(r.logprob - (3.0 - log(lse))) < 1e-5);
    /* mask: only ids 4 and 9 allowed -> 9 (0.25 > 0.0) */
    uint32_t mask = (1u << 4) | (1u << 9);
    memcpy(x, base_logits, sizeof x);
    assert_int_equal(sample_row(&s, &p, x, &mask, &r), 0);
    assert_int_equal(r.id, 9);
    assert_int_equal(r.n_top, 2); /* only allowed ids are reported */
    mask = 0;
    memcpy(x, base_logits, sizeof x);
    assert_int_equal(sample_row(&s, &p, x, &mask, &r), TERN_EINVAL);
    sample_state_free(&s);
    /* logit_bias */
    sample_bias b = {11, 10.0f};
    p.bias = &b;
    p.n_bias = 1;
    assert_int_equal(sample_state_init(&s, &p, V, NULL, 0, NULL), 0);
    memcpy(x, base_logits, sizeof x);
    assert_int_equal(sample_row(&s, &p, x, NULL, &r), 0);
    assert_int_equal(r.id, 11);
    sample_state_free(&s);
    /* presence + frequency: id 7 generated twice drops by 0.5 + 2 * 0.4 = 1.3 */
    p.n_bias = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.4f;
    assert_int_equal(sample_state_init(&s, &p, V, NULL, 0, NULL), 0);
    sample_state_accept(&s, 7);
    sample_state_accept(&s, 7);
    memcpy(x, base_logits, sizeof x);
    assert_int_equal(sample_row(&s, &p, x, NULL, &r), 0);
    assert_true(fabs(x[7] - 1.7f) < 1e-6);
    assert_int_equal(r.id, 0);
    sample_state_free(&s);
    /* repetition penalty over the prompt: positive logits divided, negative multiplied */
    sample_params_default(&p);
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    int32_t prompt[2] = {7, 8};
    assert_int_equal(sample_state_init(&s, &p, V, prompt, 2, NULL), 0);
    memcpy(x, base_logits, sizeof x);
    assert_int_equal(sample_row(&s, &p, x, NULL, &r), 0);
    assert_true(x[7] == 1.5f && x[8] == -4.0f);
    assert_int_equal(r.id, 0);
    sample_state_free(&s);
}

static void test_seed_reproducible(void **state)
{
    (void)state;
    sample_params p;
    sample_params_default(&p);
    p.temperature = 1.0f;
    p.seed = 99;
    sample_state a, b;
    assert_int_equal(sample_state_init(&a, &p, V, NULL, 0, NULL), 0);
    assert_int_equal(sample_state_init(&b, &p, V, NULL, 0, NULL), 0);
    int differ = 0;
    for (int k = 0; k < 200; k++) {
        float x[V], y[V];
        memcpy(x, base_logits, sizeof x);
        memcpy(y, base_logits, sizeof y);
        sample_result ra, rb;
        sample_row(&a, &p, x, NULL, &ra);
        sample_row(&b, &p, y, NULL, &rb);
        differ += ra.id != rb.id;
    }
    assert_int_equal(differ, 0);
    sample_state_free(&a);
    sample_state_free(&b);
}

static void test_param_checks(void **state)
{
    (void)state;
    sample_params p;
    tern_err e;
    sample_params_default(&p);
    assert_int_equal(sample_params_check(&p, V, &e), 0);
    p.top_p = 0;
    assert_int_equal(sample_params_check(&p, V, &e), TERN_ERANGE);
    sample_params_default(&p);
    p.temperature = -1;
    assert_int_equal(sample_params_check(&p, V, &e), TERN_ERANGE);
    sample_params_default(&p);
    sample_bias b = {V, 1};
    p.bias = &b;
    p.n_bias = 1;
    assert_int_equal(sample_params_check(&p, V, &e), TERN_ERANGE);
}

/* Speculative sampling: draft d ~ q, then accept/reject against p. The
 * emitted token must be distributed as p, for a q unlike p and for the
 * one-hot q of prompt lookup. */
static void test_spec_step_distribution(void **state)
{
    (void)state;
    const float p0[6] = {0.05f, 0.4f, 0.1f, 0.25f, 0.2f, 0.0f};
    const float q[6] = {0.3f, 0.1f, 0.3f, 0.1f, 0.1f, 0.1f};
    sample_params sp;
    sample_params_default(&sp);
    sp.seed = 77;
    sample_state s;
    assert_int_equal(sample_state_init(&s, &sp, 6, NULL, 0, NULL), 0);
    for (int mode = 0; mode < 2; mode++) {
        double cnt[6] = {0};
        int acc = 0;
        const int N = 100000;
        for (int k = 0; k < N; k++) {
            float p[6];
            memcpy(p, p0, sizeof p);
            int32_t d = mode == 0 ? sample_draw(&s, q, 6) : 3; /* lookup always proposes 3 */
            int a;
            int32_t t = sample_spec_step(&s, p, mode == 0 ? q : NULL, d, 6, &a);
            acc += a;
            cnt[t]++;
        }
        double tv = 0;
        for (int i = 0; i < 6; i++)
            tv += fabs(cnt[i] / N - p0[i]);
        printf("spec step mode %d: TV %.4f, acceptance %.3f\n", mode, tv / 2, (double)acc / N);
        assert_true(tv / 2 < 0.01);
        assert_true(cnt[5] == 0);
        /* acceptance rate is sum(min(p, q)) for a model draft, p(d) for lookup */
        double want = mode == 0 ? 0.05 + 0.1 + 0.1 + 0.1 + 0.1 : 0.25;
        assert_true(fabs((double)acc / N - want) < 0.01);
    }
    sample_state_free(&s);
}

/* top-p without top-k over a vocabulary whose head (the candidates the
 * sampler sorts) does not hold all the mass: the nucleus is top_p of the
 * whole distribution. 10 tokens at logit 0 hold 60%, 20000 at -8 the rest:
 * top_p 0.55 keeps all 10 (9 hold 54%), not 6 (top_p of the head's 60%). */
static void test_top_p_large_vocab(void **state)
{
    (void)state;
    enum { VB = 20010 };
    float *x = malloc(VB * sizeof *x), *pr = malloc(VB * sizeof *pr);
    sample_params p;
    sample_params_default(&p);
    p.top_p = 0.55f;
    sample_state s;
    assert_int_equal(sample_state_init(&s, &p, VB, NULL, 0, NULL), 0);
    for (int i = 0; i < VB; i++)
        x[i] = i < 10 ? 0.0f : -8.0f;
    assert_int_equal(sample_dist(&s, &p, x, NULL, pr), 0);
    int kept = 0;
    for (int i = 0; i < VB; i++)
        kept += pr[i] > 0;
    assert_int_equal(kept, 10);
    sample_state_free(&s);
    free(x);
    free(pr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_greedy_mask_bias_penalties),
        cmocka_unit_test(test_seed_reproducible),
        cmocka_unit_test(test_param_checks),
        cmocka_unit_test(test_spec_step_distribution),
        cmocka_unit_test(test_top_p_large_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
