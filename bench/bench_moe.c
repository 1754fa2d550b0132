/* bench_moe: a mixture of experts' decode speed on the GPU next to its
 * active-weights roofline, with the experts in device memory (default) or
 * in pinned host memory behind a device cache (--experts-in host).
 *
 *   bench_moe [--experts-in host] [--expert-cache SIZE] [--prompt N]
 *             [--tokens N] [--batch B,B,...] [--kv-type T] MODEL_DIR
 *
 * Per batch size B: B sequences, each prefilled with an N-token prompt
 * alone, then --tokens decode steps of all B together, the greedy ids
 * picked on the device (as the engine's greedy steps); tokens/s summed over
 * the batch, timed after two warm-up steps. The roofline is the device's
 * copy bandwidth (bytes read + written a second) over model_weight_bytes -
 * for a mixture, the router and the experts one token runs. With experts
 * in host memory, the expert counters over the decode steps: picks read
 * from the cache and from host memory (the hit rate), bytes copied into
 * the cache and their rate. SIZE as 8G, 512M, 1.5G. --kv-type: a device
 * KV cache of that type (kv.h names), as the engine makes it (without it:
 * f32 with host storage; the engine's default on CUDA is bf16).
 *
 *   bench_moe --kernels [--depth N] [--batch B,...]   (default 1,2,4,8,32,128)
 *
 * The sparse layer alone (no model, no attention): random Qwen3-30B-A3B
 * shaped layers (dim 2048, 128 experts of width 768, top 8; a bf16 router),
 * bf16 and 4-bit (group 64) experts, 8 distinct layers cycled through
 * --depth (default 48) calls of tcu_moe, per batch size: one eager pass
 * counting the bytes a layer reads (router + every expert the step picks,
 * from the routing) and one with every launch timed (tcu_prof_start: norm
 * + router + routing, gate/up, down); then per tcu_opts.moe variant one
 * CUDA graph of the depth layers, replayed and timed - microseconds a
 * layer and the bytes' rate against the copy bandwidth - and its result
 * after one replay compared with the first variant's (bit for bit; a
 * difference fails the run - but for the tensor-core GEMM's variants, moe
 * bit 16 from TCU_MOE_TC_MIN_T_* tokens and 16 + 32 at every T, whose bf16
 * activations give a relative difference, printed, failing past 2e-2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "model/model.h"
#ifdef TERN_CUDA
#include <cuda_runtime_api.h>

#include "tensor/cuda/cuda_kernels.h"
#include "tensor/cuda/cuda_moe.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die(const tern_err *e)
{
    fprintf(stderr, "bench_moe: %s\n", e->msg);
    return 1;
}

static int parse_size(const char *v, size_t *out)
{
    char *end;
    double x = strtod(v, &end), mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024, end++;
    if (end == v || *end || !(x >= 0))
        return -1;
    *out = (size_t)(x * mul);
    return 0;
}

/* B sequences prefilled alone, then steps decode steps of all B; seconds of
 * the steps after the first two, -1 on failure. Sequence s's prompt and
 * tokens are moved by 7919 s (mod the vocabulary): B copies of one sequence
 * would route every row to the same experts, which no real batch does. */
static double decode_run(tern_model *m, kv_pool *kv, int B, int n_prompt, int steps, const int32_t *prompt,
                         model_experts_stats *x0, tern_err *err)
{
    kv_seq *seq = calloc((size_t)B, sizeof *seq);
    const int n = n_prompt > B ? n_prompt : B;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *tok = malloc(sizeof(int32_t) * (size_t)B),
            *rows = malloc(sizeof(int32_t) * (size_t)B);
    kv_seq **sp = malloc(sizeof(kv_seq *) * (size_t)n);
    int32_t *ps = malloc(sizeof(int32_t) * (size_t)n_prompt);
    double t0 = 0, dt = -1;
    const long V = model_config_get(m)->n_vocab;
    if (!ps) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    for (int s = 0; s < B; s++) {
        if (kv_seq_reserve(kv, &seq[s], n_prompt + steps, err))
            goto out;
        for (int i = 0; i < n_prompt; i++) {
            pos[i] = i;
            sp[i] = &seq[s];
            ps[i] = (int32_t)((prompt[i] + 7919l * s) % V);
        }
        int32_t last = n_prompt - 1;
        fwd_batch b = {n_prompt, ps, pos, sp, 1, &last};
        if (model_forward_start(m, kv, &b, err) || model_forward_argmax(m, NULL, 0, NULL, &tok[s], err))
            goto out;
    }
    for (int st = 0; st < steps; st++) {
        if (st == 2) {
            t0 = now_s();
            model_experts_stats_get(m, x0);
        }
        for (int s = 0; s < B; s++) {
            pos[s] = n_prompt + st;
            sp[s] = &seq[s];
            rows[s] = s;
        }
        fwd_batch b = {B, tok, pos, sp, B, rows};
        if (model_forward_start(m, kv, &b, err) || model_forward_argmax(m, NULL, 0, NULL, tok, err))
            goto out;
        for (int s = 0; s < B; s++)
            tok[s] = (int32_t)((tok[s] + 7919l * s) % V);
    }
    dt = now_s() - t0;
out:
    for (int s = 0; s < B; s++)
        kv_seq_free(kv, &seq[s]);
    free(ps);
    free(seq);
    free(pos);
    free(tok);
    free(rows);
    free(sp);
    return dt;
}

/* ---- --kernels: the sparse layer alone ---- */

#define KB_LAYERS 8
#define KB_DIM 2048
#define KB_FF 768
#define KB_E 128
#define KB_K 8
#define KB_GROUP 64

#define KCU(call)                                                                                                  \
    do {                                                                                                           \
        cudaError_t ce_ = (call);                                                                                  \
        if (ce_ != cudaSuccess) {                                                                                  \
            fprintf(stderr, "bench_moe: %s: %s\n", #call, cudaGetErrorString(ce_));                               \
            goto out;                                                                                              \
        }                                                                                                          \
    } while (0)

/* Bytes of one expert (gate, up, down and their pairs) of `kind`. */
static size_t kb_expert_bytes(int kind)
{
    const size_t n = (size_t)KB_FF * KB_DIM;
    return kind == TCU_Q4 ? 3 * (n / 2 + n / KB_GROUP * 2 * sizeof(float)) : 3 * n * 2;
}

/* One kind's layers: allocation, the table, then per batch size the graph
 * of `depth` layers timed and one eager profiled pass. 0 or 1 (failure). */
static int kb_run(int kind, int depth, const int *Ts, int n_T, double bw)
{
    const size_t n = (size_t)KB_FF * KB_DIM, wb = kind == TCU_Q4 ? n / 2 : n * 2;
    const size_t sbf = kind == TCU_Q4 ? n / KB_GROUP * 2 : 0; /* floats of pairs a matrix */
    int maxT = 1, rc = 1;
    for (int i = 0; i < n_T; i++)
        maxT = Ts[i] > maxT ? Ts[i] : maxT;
    void *w[KB_LAYERS][3] = {{0}}, *sb[KB_LAYERS][3] = {{0}}, *router[KB_LAYERS] = {0};
    const void **tab = calloc((size_t)KB_LAYERS * KB_E * 6, sizeof *tab);
    void *tab_dev = NULL, *x = NULL, *x0 = NULL, *xn = NULL, *ng = NULL;
    tcu_moe_scratch s = {0};
    tcu_experts ex[KB_LAYERS];
    cudaStream_t st = NULL;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    tcu_opts op;
    tcu_opts_init(&op);
    const int moe0 = op.moe;
    int fails = 0;
    float *xh = malloc((size_t)maxT * KB_DIM * sizeof(float)), *xh0 = malloc((size_t)maxT * KB_DIM * sizeof(float));
    if (!tab || !xh || !xh0)
        goto out;
    KCU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    KCU(cudaEventCreate(&e0));
    KCU(cudaEventCreate(&e1));
    for (int l = 0; l < KB_LAYERS; l++) {
        for (int k = 0; k < 3; k++) {
            KCU(cudaMalloc(&w[l][k], wb * KB_E));
            KCU((cudaError_t)tcu_fill_random(w[l][k], kind == TCU_Q4 ? wb * KB_E : n * KB_E,
                                             kind == TCU_Q4 ? TCU_Q4 : TCU_BF16, 100 + 3 * l + k, 0.02f, st));
            if (sbf) {
                KCU(cudaMalloc(&sb[l][k], sbf * sizeof(float) * KB_E));
                KCU((cudaError_t)tcu_fill_random(sb[l][k], sbf * KB_E, TCU_F32, 200 + 3 * l + k, 0.003f, st));
            }
            for (int e = 0; e < KB_E; e++) {
                tab[((size_t)l * KB_E + e) * 6 + k] = (const uint8_t *)w[l][k] + wb * e;
                tab[((size_t)l * KB_E + e) * 6 + 3 + k] = sbf ? (const float *)sb[l][k] + sbf * e : NULL;
            }
        }
        KCU(cudaMalloc(&router[l], (size_t)KB_E * KB_DIM * 2));
        KCU((cudaError_t)tcu_fill_random(router[l], (size_t)KB_E * KB_DIM, TCU_BF16, 300 + l, 0.05f, st));
    }
    KCU(cudaMalloc(&tab_dev, (size_t)KB_LAYERS * KB_E * 6 * sizeof(void *)));
    KCU(cudaMemcpy(tab_dev, tab, (size_t)KB_LAYERS * KB_E * 6 * sizeof(void *), cudaMemcpyHostToDevice));
    for (int l = 0; l < KB_LAYERS; l++) {
        tcu_experts *e = &ex[l];
        memset(e, 0, sizeof *e);
        e->router.w = router[l];
        e->router.n_out = KB_E;
        e->router.kind = TCU_BF16;
        e->tab = (const void *const *)tab_dev + (size_t)l * KB_E * 6;
        e->kind = kind;
        e->group = kind == TCU_Q4 ? KB_GROUP : 0;
        e->n_expert = KB_E;
        e->n_used = KB_K;
        e->dim = KB_DIM;
        e->ff = KB_FF;
        e->norm_topk = 1;
    }
    const size_t tk = (size_t)maxT * KB_K, tiles = tcu_moe_cnt_len(KB_DIM, KB_E);
    KCU(cudaMalloc((void **)&s.rl, (size_t)maxT * KB_E * sizeof(float)));
    KCU(cudaMalloc((void **)&s.wt, tk * sizeof(float)));
    KCU(cudaMalloc((void **)&s.h, tk * KB_FF * sizeof(float)));
    KCU(cudaMalloc((void **)&s.y, tk * KB_DIM * sizeof(float)));
    KCU(cudaMalloc((void **)&s.sel, tk * sizeof(int32_t)));
    KCU(cudaMalloc((void **)&s.meta, tcu_moe_meta_len(KB_E, KB_K, maxT) * sizeof(int32_t)));
    KCU(cudaMalloc((void **)&s.cnt, tiles * sizeof(int32_t)));
    KCU(cudaMemset(s.cnt, 0, tiles * sizeof(int32_t)));
    KCU(cudaMalloc(&x, (size_t)maxT * KB_DIM * sizeof(float)));
    KCU(cudaMalloc(&x0, (size_t)maxT * KB_DIM * sizeof(float)));
    KCU(cudaMalloc(&xn, (size_t)maxT * KB_DIM * sizeof(float)));
    KCU(cudaMalloc(&ng, KB_DIM * sizeof(float)));
    KCU((cudaError_t)tcu_fill_random(x0, (size_t)maxT * KB_DIM, TCU_F32, 7, 1.0f, st));
    KCU((cudaError_t)tcu_fill_random(ng, KB_DIM, TCU_F32, 8, 1.0f, st));
    KCU(cudaStreamSynchronize(st));
    for (int ti = 0; ti < n_T; ti++) {
        const int T = Ts[ti];
        /* eager: the groups each layer reads (bytes), then the profile */
        KCU(cudaMemcpyAsync(x, x0, (size_t)T * KB_DIM * sizeof(float), cudaMemcpyDeviceToDevice, st));
        double groups = 0;
        for (int l = 0; l < depth; l++) {
            KCU((cudaError_t)tcu_moe(&ex[l % KB_LAYERS], &s, x, ng, 1e-6f, xn, T, &op, st));
            int32_t g = 0;
            KCU(cudaMemcpyAsync(&g, s.meta, sizeof g, cudaMemcpyDeviceToHost, st));
            KCU(cudaStreamSynchronize(st));
            groups += g;
        }
        groups /= depth;
        const double bytes = (double)KB_E * KB_DIM * 2 + groups * (double)kb_expert_bytes(kind);
        /* the warp kernels, then the tensor-core GEMM (every T) */
        for (int pass = 0; pass < 2; pass++) {
            double pms[TCU_PROF_N];
            int pn[TCU_PROF_N];
            op.moe = pass ? moe0 | TCU_MOE_TC | TCU_MOE_TC_ALL : moe0 & ~(TCU_MOE_TC | TCU_MOE_TC_ALL);
            tcu_prof_start();
            for (int l = 0; l < depth; l++)
                KCU((cudaError_t)tcu_moe(&ex[l % KB_LAYERS], &s, x, ng, 1e-6f, xn, T, &op, st));
            const int prc = tcu_prof_stop(pms, pn);
            if (!prc)
                printf("  %-4s T=%-3d eager, timed, %s: gate %.2f, gate/up %.2f, down %.2f us a layer (%.1f MB, "
                       "%.1f experts)\n",
                       kind == TCU_Q4 ? "q4" : "bf16", T, pass ? "tensor-core GEMM" : "warp kernels",
                       1e3 * pms[TCU_PROF_MOE_GATE] / depth, 1e3 * pms[TCU_PROF_MOE_GU] / depth,
                       1e3 * pms[TCU_PROF_MOE_DOWN] / depth, bytes / 1e6, groups);
        }
        op.moe = moe0;
        /* the graph of depth layers, per tcu_opts.moe variant: its result
         * after one replay from x0 (against the first variant's), its time */
        static const int variants[] = {0,
                                       TCU_MOE_DOWN_EARLY,
                                       TCU_MOE_WAVES,
                                       TCU_MOE_WAVES | TCU_MOE_DOWN_EARLY,
                                       TCU_MOE_WAVES | TCU_MOE_DOWN_ROWS4,
                                       TCU_MOE_WAVES | TCU_MOE_DOWN_ROWS4 | TCU_MOE_DOWN_EARLY,
                                       TCU_MOE_WAVES | TCU_MOE_DOWN_EARLY | TCU_MOE_FUSED,
                                       TCU_MOE_WAVES | TCU_MOE_DOWN_EARLY | TCU_MOE_FUSED | TCU_MOE_TC |
                                           TCU_MOE_TC_PF,
                                       TCU_MOE_WAVES | TCU_MOE_DOWN_EARLY | TCU_MOE_FUSED | TCU_MOE_TC |
                                           TCU_MOE_TC_ALL,
                                       TCU_MOE_WAVES | TCU_MOE_DOWN_EARLY | TCU_MOE_FUSED | TCU_MOE_TC |
                                           TCU_MOE_TC_ALL | TCU_MOE_TC_PF};
        for (int vi = 0; vi < (int)(sizeof variants / sizeof *variants); vi++) {
            op.moe = variants[vi];
            KCU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < depth; l++)
                if (tcu_moe(&ex[l % KB_LAYERS], &s, x, ng, 1e-6f, xn, T, &op, st))
                    break;
            KCU(cudaStreamEndCapture(st, &graph));
            KCU(cudaGraphInstantiate(&exec, graph, 0));
            KCU(cudaMemcpyAsync(x, x0, (size_t)T * KB_DIM * sizeof(float), cudaMemcpyDeviceToDevice, st));
            KCU(cudaGraphLaunch(exec, st));
            KCU(cudaMemcpyAsync(vi ? xh : xh0, x, (size_t)T * KB_DIM * sizeof(float), cudaMemcpyDeviceToHost, st));
            KCU(cudaStreamSynchronize(st));
            /* the tensor-core GEMM (when it ran: TC_ALL, or T from its
             * threshold) rounds the activations to bf16: its relative
             * difference from moe 0, failing the run only past 2e-2 */
            const int tc = (variants[vi] & TCU_MOE_TC) &&
                           (T >= (kind == TCU_Q4 ? TCU_MOE_TC_MIN_T_Q4 : TCU_MOE_TC_MIN_T_BF16) ||
                            (variants[vi] & TCU_MOE_TC_ALL));
            double dd = 0, dr = 0;
            for (size_t i = 0; tc && i < (size_t)T * KB_DIM; i++) {
                dd += ((double)xh[i] - xh0[i]) * ((double)xh[i] - xh0[i]);
                dr += (double)xh0[i] * xh0[i];
            }
            const double rel = tc ? sqrt(dd / (dr > 0 ? dr : 1)) : 0;
            const int same = !vi || (tc ? rel < 2e-2 : !memcmp(xh, xh0, (size_t)T * KB_DIM * sizeof(float)));
            char note[64] = "";
            if (tc)
                snprintf(note, sizeof note, " (tensor cores: rel diff %.2g)", rel);
            KCU(cudaGraphLaunch(exec, st));
            const int reps = 20;
            KCU(cudaEventRecord(e0, st));
            for (int r = 0; r < reps; r++)
                KCU(cudaGraphLaunch(exec, st));
            KCU(cudaEventRecord(e1, st));
            KCU(cudaEventSynchronize(e1));
            float ms = 0;
            KCU(cudaEventElapsedTime(&ms, e0, e1));
            const double us = 1e3 * ms / reps / depth;
            printf("  %-4s T=%-3d moe %d: %7.2f us a layer (%d-layer graph), %.0f GB/s = %.0f%% of the copy "
                   "bandwidth%s%s\n",
                   kind == TCU_Q4 ? "q4" : "bf16", T, variants[vi], us, depth, bytes / us / 1e3,
                   100 * bytes / (us * 1e-6) / bw, note, same ? "" : "; RESULT DIFFERS from moe 0");
            fflush(stdout);
            fails += !same;
            cudaGraphExecDestroy(exec);
            cudaGraphDestroy(graph);
            exec = NULL;
            graph = NULL;
        }
        op.moe = moe0;
    }
    rc = fails > 0;
out:
    if (st)
        cudaStreamSynchronize(st);
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    for (int l = 0; l < KB_LAYERS; l++) {
        for (int k = 0; k < 3; k++) {
            cudaFree(w[l][k]);
            cudaFree(sb[l][k]);
        }
        cudaFree(router[l]);
    }
    void *bufs[] = {tab_dev, x, x0, xn, ng, s.rl, s.wt, s.h, s.y, s.sel, s.meta, s.cnt};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        cudaFree(bufs[i]);
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    if (st)
        cudaStreamDestroy(st);
    free(tab);
    free(xh);
    free(xh0);
    cudaGetLastError();
    return rc;
}

static int kernels_main(int depth, const int *Ts, int n_T)
{
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10);
    printf("sparse layers alone: dim %d, %d experts of width %d, top %d; copy bandwidth %.0f GB/s\n", KB_DIM, KB_E,
           KB_FF, KB_K, bw / 1e9);
    if (bw <= 0)
        return 1;
    return kb_run(TCU_BF16, depth, Ts, n_T, bw) || kb_run(TCU_Q4, depth, Ts, n_T, bw);
}
#endif

int main(int argc, char **argv)
{
#ifndef TERN_CUDA
    (void)argc;
    (void)argv;
    fprintf(stderr, "bench_moe: this tern was built without CUDA (make CUDA=1)\n");
    return 2;
#else
    int n_prompt = 128, steps = 66, where = MODEL_EXPERTS_MAPPED, batches[8] = {1, 32}, n_b = 2;
    size_t cache = 0;
    const char *dir = NULL;
    kv_type kvt = KV_F32;
    int kv_given = 0;
    int kernels = 0, depth = 48, batch_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (a[0] != '-') {
            dir = a;
            continue;
        }
        if (!strcmp(a, "--kernels")) {
            kernels = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "bench_moe: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--prompt"))
            n_prompt = atoi(v);
        else if (!strcmp(a, "--tokens"))
            steps = atoi(v);
        else if (!strcmp(a, "--depth") && atoi(v) > 0)
            depth = atoi(v);
        else if (!strcmp(a, "--experts-in") && !strcmp(v, "host"))
            where = MODEL_EXPERTS_HOST;
        else if (!strcmp(a, "--expert-cache") && !parse_size(v, &cache))
            ;
        else if (!strcmp(a, "--kv-type")) {
            tern_err e = {0};
            if (kv_type_parse(v, &kvt, &e))
                return die(&e);
            kv_given = 1;
        }
        else if (!strcmp(a, "--batch")) {
            n_b = 0;
            batch_set = 1;
            for (const char *p = v; *p && n_b < 8; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p))
                batches[n_b++] = atoi(p);
        } else {
            fprintf(stderr, "bench_moe: bad option %s %s\n", a, v);
            return 2;
        }
    }
    if (kernels) {
        if (!batch_set) { /* the warp kernels' one-token step and the tensor cores' thresholds */
            static const int def[] = {1, 2, 4, 8, 32, 128};
            n_b = (int)(sizeof def / sizeof *def);
            memcpy(batches, def, sizeof def);
        }
        if (model_cuda_device_count() <= 0) {
            fprintf(stderr, "bench_moe: no GPU\n");
            return 2;
        }
        for (int i = 0; i < n_b; i++)
            if (batches[i] < 1 || batches[i] > 4096) {
                fprintf(stderr, "bench_moe: batch %d out of range\n", batches[i]);
                return 2;
            }
        return kernels_main(depth, batches, n_b);
    }
    if (!dir || n_prompt < 1 || steps < 3) {
        fprintf(stderr, "usage: bench_moe [--experts-in host] [--expert-cache SIZE] [--prompt N] [--tokens N] "
                        "[--batch B,...] [--kv-type T] MODEL_DIR\n       bench_moe --kernels [--depth N] [--batch B,...]\n");
        return 2;
    }
    if (model_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_moe: no GPU\n");
        return 2;
    }
    if (where == MODEL_EXPERTS_HOST)
        model_experts_opts_set(MODEL_EXPERTS_HOST, cache);
    tern_err err = {0};
    model_load_opts o = {0, "cuda"};
    double tl = now_s();
    tern_model *m = model_load_ex(dir, &o, &err);
    if (!m)
        return die(&err);
    tl = now_s() - tl;
    const model_config *c = model_config_get(m);
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10), wb = (double)model_weight_bytes(m);
    printf("%s: %d layers, %d experts (%d a token), load %.1f s; active weights %.1f MB a token, copy bandwidth %.0f "
           "GB/s, roofline %.1f tok/s; experts in %s%s; %s KV\n",
           dir, c->n_layer, c->n_expert, c->n_expert_used, tl, wb / 1e6, bw / 1e9, bw / wb,
           where == MODEL_EXPERTS_HOST ? "host memory" : "device memory",
           where == MODEL_EXPERTS_HOST ? " behind a device cache" : "", kv_type_name(kvt));
    int maxb = 1;
    for (int i = 0; i < n_b; i++)
        maxb = batches[i] > maxb ? batches[i] : maxb;
    const int bs = 16, per = (n_prompt + steps + bs - 1) / bs + 1;
    kv_pool kv;
    kv_spec spec;
    kv_spec_init(&spec, kvt);
    if (kv_given ? model_kv_pool_init(m, &kv, &spec, bs, maxb * per + 8, 0, 0, &err) || model_kv_bind(m, &kv, &err)
                 : kv_pool_init(&kv, c->n_layer, model_kv_dim(m), bs, maxb * per + 8, &err)) /* host f32, as before */
        return die(&err);
    int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_prompt);
    tern_rng r;
    tern_rng_seed(&r, 42, 0);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)(tern_rng_f32(&r) * (c->n_vocab - 1));
    for (int i = 0; i < n_b; i++) {
        model_experts_stats x0, x1;
        memset(&x0, 0, sizeof x0);
        double dt = decode_run(m, &kv, batches[i], n_prompt, steps, prompt, &x0, &err);
        if (dt < 0)
            return die(&err);
        double tps = (double)batches[i] * (steps - 2) / dt;
        printf("  b%-3d %9.1f tok/s", batches[i], tps);
        if (batches[i] == 1)
            printf(" (%.0f%% of the roofline)", 100.0 * tps / (bw / wb));
        if (model_experts_stats_get(m, &x1) == 0 && x1.where == MODEL_EXPERTS_HOST) {
            double h = (double)(x1.hits - x0.hits), ms = (double)(x1.misses - x0.misses);
            double gb = (x1.streamed_bytes - x0.streamed_bytes) / 1e9, s = x1.stream_seconds - x0.stream_seconds;
            printf("; experts: hit rate %.1f%% of %.0f picks, %.2f GB copied into the cache at %.1f GB/s, %.2f of "
                   "%.2f GB cached",
                   h + ms > 0 ? 100 * h / (h + ms) : 0.0, h + ms, gb, s > 0 ? gb / s : 0.0, x1.resident_bytes / 1e9,
                   x1.cache_bytes / 1e9);
        }
        printf("\n");
        fflush(stdout);
    }
    kv_pool_free(&kv);
    free(prompt);
    model_free(m);
    return 0;
#endif
}
