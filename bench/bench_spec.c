/* bench_spec: speculative decoding against plain decoding, in one run.
 *
 *   bench_spec TARGET_DIR DRAFT_DIR [--tokens N]
 *
 * Greedy chat prompts at batch 1 and 8: decode tokens/s without speculation,
 * with the draft model at K = 2, 4, 6, and with prompt lookup on a
 * repetitive (copy / JSON edit) workload. Acceptance = accepted / drafted;
 * tokens per target forward = generated / target forwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/engine.h"

static const char *chat[] = {
    "<|im_start|>user\nHello! Who are you?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nContinue this text: The old ship left the harbour at dawn.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nAnswer in JSON with keys title, words, first_word: The quick brown fox jumps over the lazy dog.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nRepeat this text exactly: Small models are useful for testing.<|im_end|>\n<|im_start|>assistant\n",
};
static const char *edit[] = {
    "<|im_start|>user\nRepeat this text exactly: {\"name\": \"lighthouse\", \"height\": 42, \"lamps\": [1, 2, 3], \"keeper\": {\"name\": \"Ann\", \"years\": 12}}<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nRepeat this text exactly: The river ran quietly past the mill, and the mill wheel turned slowly in the evening light.<|im_end|>\n<|im_start|>assistant\n",
};

typedef struct cell { double tps; long drafted, accepted, forwards, generated; } cell;

static cell run(tern_model *m, tern_model *draft, int ngram, int k, tern_tokenizer *tok, const char **ps, int n_ps,
                int batch, int n_tokens)
{
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = batch;
    o.draft = draft;
    o.spec_ngram = ngram;
    o.n_draft = k;
    o.prefix_cache = 0;
    tern_err err;
    cell c = {0};
    tern_engine *e = engine_new(m, tok, &o, &err);
    if (!e) {
        fprintf(stderr, "bench_spec: %s\n", err.msg);
        exit(1);
    }
    engine_req *rs[64];
    double t0 = tern_time_s();
    for (int i = 0; i < batch; i++) {
        int32_t *ids;
        size_t n;
        const char *p = ps[i % n_ps];
        tokenizer_encode(tok, p, strlen(p), 1, &ids, &n, &err);
        engine_params pr;
        engine_params_default(&pr);
        pr.prompt = ids;
        pr.n_prompt = n;
        pr.max_tokens = n_tokens;
        pr.sample.temperature = 0;
        rs[i] = engine_submit(e, &pr, NULL, NULL, &err);
        free(ids);
    }
    double decode = 0;
    for (int i = 0; i < batch; i++) {
        engine_event ev;
        while (engine_req_next(rs[i], &ev, -1)) {
            int fin = ev.kind == ENGINE_EV_FINISH;
            if (fin) {
                c.drafted += ev.usage.n_drafted;
                c.accepted += ev.usage.n_accepted;
                c.forwards += ev.usage.n_target_forwards;
                c.generated += ev.usage.n_generated;
                if (ev.usage.decode_s > decode)
                    decode = ev.usage.decode_s;
            }
            engine_event_clear(&ev);
            if (fin)
                break;
        }
        engine_req_release(rs[i]);
    }
    c.tps = c.generated / (tern_time_s() - t0);
    engine_free(e);
    return c;
}

static void print(const char *name, int batch, int k, cell c, double base)
{
    printf("%-22s %5d %3d %10.1f %8.2fx %10.2f %12.2f\n", name, batch, k, c.tps, base > 0 ? c.tps / base : 1.0,
           c.drafted ? (double)c.accepted / c.drafted : 0.0, c.forwards ? (double)c.generated / c.forwards : 0.0);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_spec TARGET_DIR DRAFT_DIR [--tokens N]\n");
        return 2;
    }
    int n_tokens = argc > 4 && !strcmp(argv[3], "--tokens") ? atoi(argv[4]) : 64;
    tern_err err;
    tern_model *m = model_load(argv[1], 0, &err), *d = m ? model_load(argv[2], 0, &err) : NULL;
    tern_tokenizer *tok = d ? tokenizer_load(argv[1], &err) : NULL;
    if (!tok) {
        fprintf(stderr, "bench_spec: %s\n", err.msg);
        return 1;
    }
    printf("%-22s %5s %3s %10s %9s %10s %12s\n", "mode", "batch", "K", "tok/s", "speed-up", "accept", "tok/forward");
    const int batches[2] = {1, 8};
    for (int b = 0; b < 2; b++) {
        cell base = run(m, NULL, 0, 0, tok, chat, 4, batches[b], n_tokens);
        print("plain (chat)", batches[b], 0, base, 0);
        for (int k = 2; k <= 6; k += 2)
            print("draft model (chat)", batches[b], k, run(m, d, 0, k, tok, chat, 4, batches[b], n_tokens), base.tps);
        cell eb = run(m, NULL, 0, 0, tok, edit, 2, batches[b], n_tokens);
        print("plain (edit)", batches[b], 0, eb, 0);
        print("prompt lookup (edit)", batches[b], 4, run(m, NULL, 1, 4, tok, edit, 2, batches[b], n_tokens), eb.tps);
        print("draft model (edit)", batches[b], 4, run(m, d, 0, 4, tok, edit, 2, batches[b], n_tokens), eb.tps);
    }
    tokenizer_free(tok);
    model_free(d);
    model_free(m);
    return 0;
}
