/* Shared by the CUDA tests: a greedy run of a model through model_forward
 * on an f32 KV pool. Included after the test's own includes (cmocka,
 * model.h, kv.h). */
#ifndef TERN_TEST_CUDA_RUN_MODEL_H
#define TERN_TEST_CUDA_RUN_MODEL_H

/* Prefill of n_prompt tokens as one batch, then n_dec greedy steps; logits of
 * every step into out[(1 + n_dec)][V], the chosen ids into ids. */
static void run_model(tern_model *m, const int32_t *prompt, int n_prompt, int n_dec, float *out, int32_t *ids)
{
    tern_err err = {0};
    kv_pool kv;
    kv_seq seq = {0};
    int V = model_config_get(m)->n_vocab;
    assert_int_equal(kv_pool_init(&kv, model_config_get(m)->n_layer, model_kv_dim(m), 16, 16, &err), 0);
    assert_int_equal(kv_seq_reserve(&kv, &seq, n_prompt + n_dec, &err), 0);
    int32_t pos[256];
    kv_seq *seqs[256];
    for (int i = 0; i < n_prompt; i++) {
        pos[i] = i;
        seqs[i] = &seq;
    }
    int32_t last = n_prompt - 1;
    fwd_batch b = {n_prompt, prompt, pos, seqs, 1, &last};
    if (model_forward(m, &kv, &b, out, &err))
        fail_msg("%s", err.msg);
    for (int s = 0; s < n_dec; s++) {
        const float *lg = out + (size_t)s * V;
        int32_t best = 0;
        for (int v = 1; v < V; v++)
            if (lg[v] > lg[best])
                best = v;
        ids[s] = best;
        int32_t p = n_prompt + s, zero = 0;
        kv_seq *sq = &seq;
        fwd_batch d = {1, &ids[s], &p, &sq, 1, &zero};
        if (model_forward(m, &kv, &d, out + (size_t)(s + 1) * V, &err))
            fail_msg("%s", err.msg);
    }
    kv_seq_free(&kv, &seq);
    kv_pool_free(&kv);
}

#endif
