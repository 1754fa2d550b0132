/* bench_cuda: the CUDA backend's speed next to the roofline, and its logits
 * next to the CPU backend's.
 *
 *   bench_cuda [--prompt N] [--tokens N] [--check N] [--prefill N] [--only-b1 1] [--only-batch N] [--exact-products]
 *              [--kv-type T] MODEL_DIR...
 *   bench_cuda --gemv [KERNELS] [--no-stage] [--model 8b|1b] [--kinds bf16,q4g64,q8g64]
 *   bench_cuda --q4 [--model 8b|1b] [--tiles 1,2,17,s4,...]
 *   bench_cuda --lt [--model 8b|1b]
 *
 * --lt (no model files): the cuBLASLt products of a throughput-mode bf16
 * step (the backend's algorithm choice) at T = 8, 32, 128, q/k/v and
 * gate/up a GEMM a matrix against one GEMM a group (tcu_opts.lt_cat; the
 * GLU kernel included): us per layer, ms per step (the layers and the
 * head), and whether the merged outputs are the separate ones' bits and a
 * merged GEMM's tokens the same at T = 8 and T.
 *
 * --q4 (no model files): the 4-bit tensor-core GEMM (tcu_q4_mm, with its
 * input kernel; gate/up with the SwiGLU fused) against the tensor-core GEMV on the
 * same shapes, 4-bit g64, T = 8, 16, 32, 64, 128: us per product by T and
 * with each tile configuration (tcu_opts.q4_tile) or input split
 * (tcu_opts.q4_split, with the tile by T) forced, every tile's
 * bits against the default's, the relative difference to the GEMV, and
 * the products of a step per model. --tiles: only those tiles and splits
 * (sN: split N) besides the GEMV and the tile by T.
 *
 * --gemv (no model files): every GEMV kernel (TCU_GEMV_*) on random
 * weights of the Llama 8B and 1B shapes (fused q/k/v and gate/up with the
 * RMSNorm before them - fused or not, as the kernel does it in the model -
 * and gate/up's SwiGLU epilogue, o, down, lm_head), bf16 / 4-bit / 8-bit g64, T = 1, 8, 32:
 * time per launch in a CUDA graph of 20 launches (as a decode step runs
 * them), GB/s of weight bytes next to the copy bandwidth, relative
 * error of sampled rows against a double CPU reference, bitwise batch
 * invariance (T = 1 and T = 32 against T = 8), then the GEMV-only decode
 * step per model and kernel. KERNELS ("staged,tensor") runs only those;
 * --no-stage gives the tensor-core kernel no stage (each block splits its
 * own activations); --model and --kinds run only those shapes and kinds.
 * The options come from tcu_opts_init and TERN_CUDA_*.
 *
 * Per model: weight bytes one decode step reads (model_weight_bytes), the
 * device-to-device copy bandwidth (bytes read + written per second), the
 * roofline bandwidth / weight bytes, batch-1 decode tokens/s after an
 * N-token prompt, aggregate decode tokens/s at batch 8, 32 and 128 (each row
 * its own sequence; each step's greedy ids are picked on the device and
 * only they come back, as in the engine), and prefill tokens/s of a
 * --prefill-token prompt (default 512) in one batch; eager profiles of
 * batches 1, 32 and 128 and of the prefill. --exact-products: the exact
 * products on both backends (tcu_opts.exact; the CPU's f32-activation
 * kernels), else the throughput mode.
 * --check N first runs an N-token prompt and 4 greedy steps on both the CPU
 * and the GPU and prints the logits' relative L2 error and whether the
 * greedy ids agree (0 skips it). --kv-type T (bf16 - the server's CUDA
 * default -, f16, q8, ...): the timed runs use a device pool of that type
 * (model_kv_bind) instead of the host f32 pool the check uses. Without a
 * CUDA build it says so. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "model/backend.h"
#include "model/backend_cuda.h"
#include "model/model.h"
#include "tensor/kernels.h"
#ifdef TERN_CUDA
#include <cuda_runtime_api.h>

#include "model/backend_cuda_lt.h"
#include "tensor/cuda/cuda_kernels.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die(const tern_err *e)
{
    fprintf(stderr, "bench_cuda: %s\n", e->msg);
    return 1;
}

static int argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

static int g_prof; /* decode_run profiles its timed steps (tcu_prof_start) */

/* Appends the per-category kernel times (ms and launch counts over `reps`
 * repetitions, per repetition) and their sum to buf[0 .. len). */
static void prof_line(char *buf, size_t cap, int len, const double *ms, const int *cnt, int reps, const char *unit,
                      int failed)
{
    static const char *const names[TCU_PROF_N] = {"gemv", "attention", "qkv_post", "rmsnorm", "embed", "other",
                                                   "moe_gate", "moe_gu", "moe_down"};
    double sum = 0;
    for (int c = 0; c < TCU_PROF_N && !failed; c++) {
        sum += ms[c];
        len += snprintf(buf + len, cap - (size_t)len, " %s %.3f (%d)", names[c], ms[c] / reps, cnt[c] / reps);
    }
    snprintf(buf + len, cap - (size_t)len, "; sum %.3f %s%s", sum / reps, unit, failed ? " (profile failed)" : "");
}

/* Prefill n_prompt tokens of B sequences (one batch each), then `steps`
 * decode steps of all B together; seconds spent in the steps after the
 * first two (graph capture, warm-up). A mixture of experts' sequences get
 * distinct prompts and tokens (each id moved by 7919 s, mod the vocabulary):
 * B copies of one sequence would route every row to the same experts, which
 * no real batch does. */
static double decode_run(tern_model *m, kv_pool *kv, int B, int n_prompt, int steps, const int32_t *prompt,
                         float *logits, tern_err *err)
{
    kv_seq *seq = calloc((size_t)B, sizeof *seq);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)(n_prompt > B ? n_prompt : B));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)B), *rows = malloc(sizeof(int32_t) * (size_t)B),
            *ids = malloc(sizeof(int32_t) * (size_t)B);
    kv_seq **sp = malloc(sizeof(kv_seq *) * (size_t)(n_prompt > B ? n_prompt : B));
    double t0 = 0, dt = -1;
    int V = model_config_get(m)->n_vocab, moe = model_config_get(m)->n_expert > 0;
    int32_t *ps = malloc(sizeof(int32_t) * (size_t)n_prompt);
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
            ps[i] = moe ? (int32_t)((prompt[i] + 7919ll * s) % V) : prompt[i];
        }
        int32_t last = n_prompt - 1;
        fwd_batch b = {n_prompt, ps, pos, sp, 1, &last};
        if (model_forward(m, kv, &b, logits + (size_t)s * V, err))
            goto out;
        tok[s] = argmax(logits + (size_t)s * V, V);
    }
    for (int st = 0; st < steps; st++) {
        if (st == 2) {
            if (g_prof)
                tcu_prof_start();
            t0 = now_s();
        }
        for (int s = 0; s < B; s++) {
            pos[s] = n_prompt + st;
            sp[s] = &seq[s];
            rows[s] = s;
        }
        fwd_batch b = {B, tok, pos, sp, B, rows};
        model_caps caps;
        model_caps_get(m, &caps);
        if (caps.device_argmax) {
            /* as the engine's greedy steps: the device picks, only ids come back */
            if (model_forward_start(m, kv, &b, err) || model_forward_argmax(m, NULL, 0, NULL, ids, err))
                goto out;
        } else {
            if (model_forward(m, kv, &b, logits, err))
                goto out;
            for (int s = 0; s < B; s++)
                ids[s] = argmax(logits + (size_t)s * V, V);
        }
        for (int s = 0; s < B; s++)
            tok[s] = moe ? (int32_t)((ids[s] + 7919ll * s) % V) : ids[s];
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
    free(ids);
    free(sp);
    return dt;
}

/* Batch-B eager steps - a warm-up run, then one with every launch timed
 * (10 steps each) - written to buf: the eager step time, the graph step's
 * (graph_s seconds) and the kernels' time by category. -1 when a run
 * failed. */
static int eager_profile(tern_model *m, kv_pool *kv, int B, int n_prompt, const int32_t *prompt, float *logits,
                         double graph_s, char *buf, size_t cap, tern_err *err)
{
    double te = decode_run(m, kv, B, n_prompt, 12, prompt, logits, err);
    g_prof = 1;
    double tpf = te >= 0 ? decode_run(m, kv, B, n_prompt, 12, prompt, logits, err) : -1;
    g_prof = 0;
    double ms[TCU_PROF_N];
    int cnt[TCU_PROF_N];
    int rc = tcu_prof_stop(ms, cnt);
    if (tpf < 0)
        return -1;
    int len = snprintf(buf, cap, "eager step %.3f ms (profiled %.3f), graph step %.3f ms; kernels:", te / 10 * 1e3,
                       tpf / 10 * 1e3, graph_s * 1e3);
    prof_line(buf, cap, len, ms, cnt, 10, "ms/step", rc);
    return 0;
}

static double prefill_run(tern_model *m, kv_pool *kv, int n, const int32_t *prompt, float *logits, tern_err *err)
{
    kv_seq seq = {0};
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), last = n - 1;
    kv_seq **sp = malloc(sizeof(kv_seq *) * (size_t)n);
    double best = -1;
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        sp[i] = &seq;
    }
    if (!kv_seq_reserve(kv, &seq, n, err))
        for (int rep = 0; rep < 3; rep++) {
            fwd_batch b = {n, prompt, pos, sp, 1, &last};
            double t = now_s();
            if (model_forward(m, kv, &b, logits, err)) {
                best = -1;
                break;
            }
            t = now_s() - t;
            if (rep > 0 && (best < 0 || t < best))
                best = t;
        }
    kv_seq_free(kv, &seq);
    free(pos);
    free(sp);
    return best;
}

/* n-token prompt + 4 greedy steps on the current backend; logits [5][V]. */
static int check_run(tern_model *m, kv_pool *kv, int n, const int32_t *prompt, float *lg, int32_t *ids, tern_err *err)
{
    kv_seq seq = {0};
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), last = n - 1;
    kv_seq **sp = malloc(sizeof(kv_seq *) * (size_t)n);
    int V = model_config_get(m)->n_vocab, rc;
    if (!pos || !sp) {
        free(pos);
        free(sp);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    if ((rc = kv_seq_reserve(kv, &seq, n + 4, err))) {
        free(pos);
        free(sp);
        return rc;
    }
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        sp[i] = &seq;
    }
    fwd_batch b = {n, prompt, pos, sp, 1, &last};
    if ((rc = model_forward(m, kv, &b, lg, err)))
        goto out;
    for (int s = 0; s < 4; s++) {
        ids[s] = argmax(lg + (size_t)s * V, V);
        int32_t p = n + s, zero = 0;
        kv_seq *q = &seq;
        fwd_batch d = {1, &ids[s], &p, &q, 1, &zero};
        if ((rc = model_forward(m, kv, &d, lg + (size_t)(s + 1) * V, err)))
            goto out;
    }
out:
    kv_seq_free(kv, &seq);
    free(pos);
    free(sp);
    return rc;
}
/* ---- --gemv: the GEMV kernels alone on random weights (no model files) ---- */

typedef struct gv_shape {
    const char *model, *name;
    int n_out, n_in, glu, count; /* count: launches of this shape per decode step */
    int norm;                    /* RMSNorm of the inputs first (fused where the kernel can; lm_head: the final norm) */
} gv_shape;

static const gv_shape gv_shapes[] = {
    {"8b", "qkv", 6144, 4096, 0, 32, 1},    {"8b", "o", 4096, 4096, 0, 32, 0},
    {"8b", "gate_up", 14336, 4096, 1, 32, 1}, {"8b", "down", 4096, 14336, 0, 32, 0},
    {"8b", "lm_head", 128256, 4096, 0, 1, 1}, {"1b", "qkv", 3072, 2048, 0, 16, 1},
    {"1b", "o", 2048, 2048, 0, 16, 0},      {"1b", "gate_up", 8192, 2048, 1, 16, 1},
    {"1b", "down", 2048, 8192, 0, 16, 0},   {"1b", "lm_head", 128256, 2048, 0, 1, 1},
};
#define GV_EPS 1e-5f
#define GV_NSHAPE (int)(sizeof gv_shapes / sizeof *gv_shapes)
static const int gv_kinds[3] = {TCU_BF16, TCU_Q4, TCU_Q8};
static const char *const gv_kind_names[3] = {"bf16", "q4g64", "q8g64"};
static const int gv_Ts[3] = {1, 8, 32};
#define GV_GROUP 64
#define GV_REPS 20

static int cu_ok(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "bench_cuda: %s: %s\n", what, cudaGetErrorString((cudaError_t)rc));
    return rc == 0;
}

static size_t gv_row_bytes(int kind, int n_in) { return kind == TCU_Q4 ? (size_t)n_in / 2 : kind == TCU_Q8 ? (size_t)n_in : (size_t)n_in * 2; }

static double gv_weight(const uint8_t *row, const float *sb, int kind, int i)
{
    if (kind == TCU_BF16) {
        uint32_t b = (uint32_t)((const uint16_t *)row)[i] << 16;
        float f;
        memcpy(&f, &b, 4);
        return f;
    }
    int q = kind == TCU_Q8 ? row[i] : (row[i / 2] >> ((i & 1) * 4)) & 15;
    int g = i / GV_GROUP;
    return (double)sb[2 * g] * q + sb[2 * g + 1];
}

static void gv_point(tcu_gemv_args *a, int c, void *const *w, float *const *sb, size_t wstride, size_t sbstride)
{
    for (int k = 0; k < (a->glu ? 2 : 1); k++) {
        a->m[k].w = (const char *)w[c] + k * wstride;
        a->m[k].sb = sb[c] ? sb[c] + k * sbstride : NULL;
    }
}

/* ms per launch of a captured graph g of GV_REPS launches on st: best of
 * three replays (-1 when !ok or a call fails); g is destroyed */
static double graph_best(int ok, cudaGraph_t g, cudaStream_t st, cudaEvent_t *ev)
{
    cudaGraphExec_t ge = NULL;
    double best = -1;
    ok = ok && cu_ok(cudaGraphInstantiate(&ge, g, 0), "graph");
    for (int k = 0; k < 3 && ok; k++) {
        float ms = 0.0f;
        ok = cu_ok(cudaEventRecord(ev[0], st), "event") && cu_ok(cudaGraphLaunch(ge, st), "graph launch") &&
             cu_ok(cudaEventRecord(ev[1], st), "event") && cu_ok(cudaEventSynchronize(ev[1]), "graph run") &&
             cu_ok(cudaEventElapsedTime(&ms, ev[0], ev[1]), "event");
        if (ok && (best < 0 || ms / GV_REPS < best))
            best = ms / GV_REPS;
    }
    if (ge)
        cudaGraphExecDestroy(ge);
    if (g)
        cudaGraphDestroy(g);
    return ok ? best : -1;
}

/* ms per launch: GV_REPS launches rotating over nc copies of the weights,
 * captured in one CUDA graph as a decode step runs them (launches timed
 * one by one between events would count each launch's overhead); best of
 * three replays, after three eager warm-up launches */
static double gv_time(tcu_gemv_args *a, const tcu_opts *o, int nc, void *const *w, float *const *sb, size_t wstride,
                      size_t sbstride, cudaEvent_t *ev)
{
    cudaStream_t st;
    cudaGraph_t g = NULL;
    double best;
    if (!cu_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream"))
        return -1;
    int ok = 1;
    for (int r = 0; r < 3 && ok; r++) {
        gv_point(a, r % nc, w, sb, wstride, sbstride);
        ok = cu_ok(tcu_gemv(a, o, (tcu_stream)st), "gemv");
    }
    ok = ok && cu_ok(cudaStreamSynchronize(st), "gemv warm-up") &&
         cu_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
    if (ok) {
        for (int r = 0; r < GV_REPS && ok; r++) {
            gv_point(a, r % nc, w, sb, wstride, sbstride);
            ok = cu_ok(tcu_gemv(a, o, (tcu_stream)st), "gemv");
        }
        ok = cu_ok(cudaStreamEndCapture(st, &g), "capture") && ok;
    }
    best = graph_best(ok, g, st, ev);
    cudaStreamDestroy(st);
    return best;
}

/* list: the kernels to run ("staged,tensor"; NULL: all); stage: hand the
 * tensor-core kernel a stage as the backend does */
static int gemv_bench(const char *list, int use_stage, const char *only_model, const char *only_kinds)
{
    int nv = TCU_GEMV_N, bad = 0;
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10);
    printf("== gemv micro-benchmark: device copy bandwidth (read + write) %.0f GB/s; time per launch in a graph of %d "
           "launches (best of 3 replays), weights rotated over >= 256 MB\n",
           bw / 1e9, GV_REPS);
    int want[TCU_GEMV_N];
    const char *wl = list;
    for (int v = 0; v < nv; v++)
        want[v] = !(wl && *wl);
    for (const char *p = wl; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        int v = 0;
        while (v < nv &&
               !(strlen(tcu_gemv_name(v)) == strcspn(p, ",") && !strncmp(p, tcu_gemv_name(v), strcspn(p, ","))))
            v++;
        if (v == nv) {
            fprintf(stderr, "bench_cuda: --gemv %s: kernels are plain, staged, by-shape, tensor, auto\n", wl);
            return 2;
        }
        want[v] = 1;
    }
    for (int v = 0; v < nv; v++)
        printf("   kernel %s%s\n", tcu_gemv_name(v), want[v] ? "" : " (not run)");
    /* ms[shape][kind][kernel][T] */
    static double ms[GV_NSHAPE][3][TCU_GEMV_N][3];
    static int vbad[3][TCU_GEMV_N]; /* failed a check: never "best" */
    cudaEvent_t ev[2 * GV_REPS];
    for (int i = 0; i < 2 * GV_REPS; i++)
        cudaEventCreate(&ev[i]);
    float *x = NULL, *y = NULL;
    const int TMAX = 32, NIN_MAX = 14336, NOUT_MAX = 128256;
    if (!cu_ok(cudaMalloc((void **)&x, sizeof(float) * TMAX * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&y, sizeof(float) * 3 * TMAX * NOUT_MAX), "alloc"))
        return 1;
    float *gain = NULL, *nout = NULL; /* RMSNorm gain, and the unfused norm's output */
    if (!cu_ok(cudaMalloc((void **)&gain, sizeof(float) * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&nout, sizeof(float) * TMAX * NIN_MAX), "alloc"))
        return 1;
    /* the tensor-core kernel's stage, as the backend passes it (--no-stage: none, each block splits) */
    void *stage = NULL;
    const size_t stage_bytes = (size_t)NIN_MAX * 204;
    if (use_stage && !cu_ok(cudaMalloc(&stage, stage_bytes), "alloc"))
        return 1;
    float *hx = malloc(sizeof(float) * TMAX * NIN_MAX), *hy = malloc(sizeof(float) * 3 * TMAX * NOUT_MAX);
    float *hg = malloc(sizeof(float) * NIN_MAX);
    printf("%-4s %-8s %-6s %3s %-8s %9s %8s %6s %9s %s\n", "mdl", "shape", "kind", "T", "gemv", "us", "GB/s", "%copy",
           "relerr", "batch-invariant");
    for (int si = 0; si < GV_NSHAPE; si++) {
        const gv_shape *sh = &gv_shapes[si];
        for (int ki = 0; ki < 3; ki++) {
            if ((only_model && strcmp(only_model, sh->model)) || (only_kinds && !strstr(only_kinds, gv_kind_names[ki]))) {
                for (int v = 0; v < nv; v++) /* not asked for: no numbers */
                    for (int ti = 0; ti < 3; ti++)
                        ms[si][ki][v][ti] = NAN;
                continue;
            }
            int kind = gv_kinds[ki], nm = sh->glu ? 2 : 1, q = kind != TCU_BF16;
            size_t wb = (size_t)sh->n_out * gv_row_bytes(kind, sh->n_in), ng = (size_t)sh->n_out * (sh->n_in / GV_GROUP);
            size_t sbn = q ? ng * 2 : 0, bytes = nm * (wb + sbn * sizeof(float));
            int nc = (int)(((size_t)256 << 20) / bytes) + 1;
            nc = nc > 16 ? 16 : nc;
            void *w[16] = {0};
            float *sb[16] = {0};
            for (int c = 0; c < nc; c++) {
                if (!cu_ok(cudaMalloc(&w[c], nm * wb), "alloc") ||
                    (q && !cu_ok(cudaMalloc((void **)&sb[c], nm * sbn * sizeof(float)), "alloc")))
                    return 1;
                tcu_fill_random(w[c], kind == TCU_BF16 ? nm * wb / 2 : nm * wb, kind == TCU_BF16 ? TCU_BF16 : TCU_Q4,
                                1000 + c, 0.05f, NULL);
                if (q)
                    tcu_fill_random(sb[c], nm * sbn, TCU_F32, 2000 + c, 0.01f, NULL);
            }
            tcu_fill_random(x, (size_t)TMAX * sh->n_in, TCU_F32, 7 + si, 1.0f, NULL);
            tcu_fill_random(gain, (size_t)sh->n_in, TCU_F32, 77 + si, 0.5f, NULL);
            if (!cu_ok(cudaDeviceSynchronize(), "fill"))
                return 1;
            cudaMemcpy(hx, x, sizeof(float) * TMAX * sh->n_in, cudaMemcpyDeviceToHost);
            cudaMemcpy(hg, gain, sizeof(float) * sh->n_in, cudaMemcpyDeviceToHost);
            if (sh->norm) /* the reference's inputs: (x * r) * g as the kernels round it */
                for (int t = 0; t < 8; t++) {
                    float *xr = hx + (size_t)t * sh->n_in;
                    double ss = 0;
                    for (int i = 0; i < sh->n_in; i++)
                        ss += (double)xr[i] * xr[i];
                    float rr = (float)(1.0 / sqrt(ss / sh->n_in + GV_EPS));
                    for (int i = 0; i < sh->n_in; i++)
                        xr[i] = (xr[i] * rr) * hg[i];
                }
            /* CPU reference (double) of 64 sampled rows for the first 8 tokens */
            enum { NR = 64, NT = 8 };
            static double ref[NR][NT];
            uint8_t *hrow = malloc(gv_row_bytes(kind, sh->n_in));
            float *hsb = malloc(sizeof(float) * 2 * (sh->n_in / GV_GROUP) + 8);
            for (int ri = 0; ri < NR; ri++) {
                int r = (int)((long)ri * (sh->n_out - 1) / (NR - 1));
                double d[2][NT] = {{0}};
                for (int k = 0; k < nm; k++) {
                    cudaMemcpy(hrow, (const char *)w[0] + k * wb + (size_t)r * gv_row_bytes(kind, sh->n_in),
                               gv_row_bytes(kind, sh->n_in), cudaMemcpyDeviceToHost);
                    if (q)
                        cudaMemcpy(hsb, sb[0] + k * sbn + (size_t)r * 2 * (sh->n_in / GV_GROUP),
                                   sizeof(float) * 2 * (sh->n_in / GV_GROUP), cudaMemcpyDeviceToHost);
                    for (int i = 0; i < sh->n_in; i++) {
                        double wv = gv_weight(hrow, hsb, kind, i);
                        for (int t = 0; t < NT; t++)
                            d[k][t] += wv * hx[(size_t)t * sh->n_in + i];
                    }
                }
                for (int t = 0; t < NT; t++)
                    ref[ri][t] = sh->glu ? d[0][t] / (1.0 + exp(-d[0][t])) * d[1][t] : d[0][t];
            }
            free(hrow);
            free(hsb);
            for (int v = 0; v < nv; v++) {
                if (!want[v]) { /* not asked for: no numbers, never "best" */
                    for (int ti = 0; ti < 3; ti++)
                        ms[si][ki][v][ti] = NAN;
                    vbad[ki][v] = 1;
                    continue;
                }
                tcu_opts o; /* the defaults and TERN_CUDA_* */
                tern_err oerr = {0};
                if (model_cuda_opts_from_env(&o, &oerr)) {
                    fprintf(stderr, "bench_cuda: %s\n", oerr.msg);
                    return 2;
                }
                o.gemv_bf16 = o.gemv_q4 = o.gemv_q8 = v;
                tcu_gemv_args a;
                memset(&a, 0, sizeof a);
                a.n = nm;
                a.glu = sh->glu;
                a.x = x;
                a.n_in = sh->n_in;
                a.stage = stage;
                a.stage_bytes = stage ? stage_bytes : 0;
                if (sh->norm) {
                    a.norm_g = gain;
                    a.norm_out = nout;
                    a.norm_eps = GV_EPS;
                }
                for (int k = 0; k < nm; k++) {
                    a.m[k].kind = kind;
                    a.m[k].group = q ? GV_GROUP : 0;
                    a.m[k].n_out = sh->n_out;
                }
                float *ys[3] = {y, y + (size_t)TMAX * NOUT_MAX, y + (size_t)2 * TMAX * NOUT_MAX};
                for (int ti = 0; ti < 3; ti++) {
                    a.T = gv_Ts[ti];
                    a.m[0].y = ys[ti];
                    a.m[1].y = ys[ti] + (size_t)TMAX * sh->n_out; /* glu: unused */
                    ms[si][ki][v][ti] = gv_time(&a, &o, nc, w, sb, wb, sbn, ev);
                }
                /* correctness on copy 0: T = 8 against the reference; T = 1
                 * (token 5 alone) and T = 32 (first 8 tokens) bitwise against T = 8 */
                for (int k = 0; k < nm; k++) {
                    a.m[k].w = (const char *)w[0] + k * wb;
                    a.m[k].sb = q ? sb[0] + k * sbn : NULL;
                }
                cudaMemset(y, 0xff, sizeof(float) * 3 * TMAX * NOUT_MAX); /* NaN poison */
                int Ts[3] = {8, 1, 32};
                for (int ti = 0; ti < 3; ti++) {
                    a.T = Ts[ti];
                    a.x = x + (Ts[ti] == 1 ? (size_t)5 * sh->n_in : 0);
                    a.m[0].y = ys[ti];
                    a.m[1].y = ys[ti] + (size_t)TMAX * sh->n_out;
                    cu_ok(tcu_gemv(&a, &o, NULL), "gemv");
                }
                a.x = x;
                if (!cu_ok(cudaDeviceSynchronize(), "gemv check"))
                    return 1;
                float *h8 = hy, *h1 = hy + (size_t)TMAX * NOUT_MAX, *h32 = hy + (size_t)2 * TMAX * NOUT_MAX;
                cudaMemcpy(h8, ys[0], sizeof(float) * 8 * sh->n_out, cudaMemcpyDeviceToHost);
                cudaMemcpy(h1, ys[1], sizeof(float) * sh->n_out, cudaMemcpyDeviceToHost);
                cudaMemcpy(h32, ys[2], sizeof(float) * 8 * sh->n_out, cudaMemcpyDeviceToHost);
                double num = 0, den = 0;
                for (int ri = 0; ri < NR; ri++) {
                    int r = (int)((long)ri * (sh->n_out - 1) / (NR - 1));
                    for (int t = 0; t < NT; t++) {
                        double g = h8[(size_t)t * sh->n_out + r], dd = g - ref[ri][t];
                        num += isfinite(g) ? dd * dd : INFINITY;
                        den += ref[ri][t] * ref[ri][t];
                    }
                }
                double rel = sqrt(num / (den > 0 ? den : 1));
                int inv1 = !memcmp(h1, h8 + (size_t)5 * sh->n_out, sizeof(float) * sh->n_out);
                int inv32 = !memcmp(h32, h8, sizeof(float) * 8 * sh->n_out);
                if (!(rel <= 2e-5) || !inv1 || !inv32) {
                    bad++;
                    vbad[ki][v] = 1;
                }
                for (int ti = 0; ti < 3; ti++) {
                    double t_ms = ms[si][ki][v][ti], gbs = bytes / (t_ms * 1e-3) / 1e9;
                    printf("%-4s %-8s %-6s %3d %-8s %9.1f %8.0f %5.0f%% %9.2e %s\n", sh->model, sh->name,
                           gv_kind_names[ki], gv_Ts[ti], tcu_gemv_name(v), t_ms * 1e3, gbs, 100 * gbs * 1e9 / bw, rel,
                           ti              ? ""
                           : inv1 && inv32 ? "yes"
                           : !inv1         ? "NO (T=1 vs T=8)"
                                           : "NO (T=32 vs T=8)");
                }
            }
            for (int c = 0; c < nc; c++) {
                cudaFree(w[c]);
                cudaFree(sb[c]);
            }
            fflush(stdout);
        }
    }
    /* compact: GB/s of every kernel per shape, kind and T */
    printf("== GB/s of weight bytes per kernel (copy bandwidth %.0f GB/s)\n%-4s %-8s %-6s %3s", bw / 1e9, "mdl",
           "shape", "kind", "T");
    for (int v = 0; v < nv; v++)
        printf(" %8s", tcu_gemv_name(v));
    printf("\n");
    for (int si = 0; si < GV_NSHAPE; si++)
        for (int ki = 0; ki < 3; ki++)
            for (int ti = 0; ti < 3; ti++) {
                const gv_shape *sh = &gv_shapes[si];
                int kind = gv_kinds[ki], nm = sh->glu ? 2 : 1;
                double bytes = (double)nm * ((size_t)sh->n_out * gv_row_bytes(kind, sh->n_in) +
                                             (kind == TCU_BF16 ? 0 : (size_t)sh->n_out * (sh->n_in / GV_GROUP) * 8));
                printf("%-4s %-8s %-6s %3d", sh->model, sh->name, gv_kind_names[ki], gv_Ts[ti]);
                for (int v = 0; v < nv; v++)
                    printf(" %8.0f", bytes / (ms[si][ki][v][ti] * 1e-3) / 1e9);
                printf("\n");
            }
    /* GEMV-only decode step per model: sum over the shapes of count * time */
    printf("== GEMV-only decode step (sum of the model's GEMV launches; tok/s = T / step; %%roof = weight bytes / "
           "step / copy bandwidth)\n");
    printf("%-4s %-6s %3s", "mdl", "kind", "T");
    for (int v = 0; v < nv; v++)
        printf(" %8s tok/s %%roof", tcu_gemv_name(v));
    printf("  best\n");
    const char *models[2] = {"8b", "1b"};
    for (int mi = 0; mi < 2; mi++)
        for (int ki = 0; ki < 3; ki++)
            for (int ti = 0; ti < 3; ti++) {
                printf("%-4s %-6s %3d", models[mi], gv_kind_names[ki], gv_Ts[ti]);
                int best = 0;
                double bt = 1e30;
                for (int v = 0; v < nv; v++) {
                    double step = 0, bytes = 0;
                    for (int si = 0; si < GV_NSHAPE; si++) {
                        const gv_shape *sh = &gv_shapes[si];
                        if (strcmp(sh->model, models[mi]))
                            continue;
                        int kind = gv_kinds[ki], nm = sh->glu ? 2 : 1;
                        size_t wb = (size_t)sh->n_out * gv_row_bytes(kind, sh->n_in);
                        size_t sbb = kind == TCU_BF16 ? 0 : (size_t)sh->n_out * (sh->n_in / GV_GROUP) * 8;
                        step += sh->count * ms[si][ki][v][ti] * 1e-3;
                        bytes += (double)sh->count * nm * (wb + sbb);
                    }
                    printf("  %14.0f %4.0f%%", gv_Ts[ti] / step, 100 * bytes / step / bw);
                    if (step < bt && !vbad[ki][v]) {
                        bt = step;
                        best = v;
                    }
                }
                printf("  %s\n", tcu_gemv_name(best));
            }
    printf("== gemv check: %s\n", bad ? "FAILED (see relerr / batch-invariant columns)"
                                      : "all kernels within 2e-5 of "
                                        "the reference, batch-invariant");
    for (int i = 0; i < 2 * GV_REPS; i++)
        cudaEventDestroy(ev[i]);
    cudaFree(x);
    cudaFree(y);
    cudaFree(gain);
    cudaFree(stage);
    cudaFree(nout);
    free(hg);
    free(hx);
    free(hy);
    return bad ? 1 : 0;
}

/* ---- --q4: the 4-bit tensor-core GEMM (gemm_q4.cu) against the tensor-core GEMV ---- */

#define Q4B_NT 5
static const int q4b_Ts[Q4B_NT] = {8, 16, 32, 64, 128};
#define Q4B_TILES 24 /* tcu_opts.q4_tile 1..24; 0 = by T */
#define Q4B_SPLITS 4 /* tcu_opts.q4_split 1, 2, 4, 8 with the tile by T */

typedef struct q4b_job {
    const gv_shape *sh;
    int path; /* 0 the GEMV (throughput mode, tcu_gemv_args.wide), 1 the 4-bit GEMM */
    tcu_gemv_args a;
    tcu_opts o;
    uint16_t *xb;
    float *xs;
} q4b_job;

/* one product as the model's step runs it: the GEMV with the norm and the
 * SwiGLU fused, or tcu_q4_prep (the norm) + tcu_q4_mm (the SwiGLU fused) */
static int q4b_issue(q4b_job *j, cudaStream_t st)
{
    tcu_gemv_args *a = &j->a;
    if (j->path == 0)
        return tcu_gemv(a, &j->o, (tcu_stream)st);
    int rc = tcu_q4_prep(a->x, NULL, a->norm_g, a->norm_out, a->norm_eps, a->T, a->n_in, GV_GROUP, j->xb, j->xs, &j->o,
                         (tcu_stream)st);
    if (!rc)
        rc = tcu_q4_mm(a->n, a->m, a->n_in, j->xb, j->xs, a->T, 0, a->glu, &j->o, (tcu_stream)st);
    return rc;
}

/* ms per product: GV_REPS of them over nc weight copies in one graph, best of 3 replays */
static double q4b_time(q4b_job *j, int nc, void *const *w, float *const *sb, size_t wb, size_t sbn, cudaEvent_t *ev)
{
    cudaStream_t st;
    cudaGraph_t g = NULL;
    double best;
    if (!cu_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream"))
        return -1;
    int ok = 1;
    for (int r = 0; r < 3 && ok; r++) {
        gv_point(&j->a, r % nc, w, sb, wb, sbn);
        ok = cu_ok(q4b_issue(j, st), "product");
    }
    ok = ok && cu_ok(cudaStreamSynchronize(st), "warm-up") &&
         cu_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
    if (ok) {
        for (int r = 0; r < GV_REPS && ok; r++) {
            gv_point(&j->a, r % nc, w, sb, wb, sbn);
            ok = cu_ok(q4b_issue(j, st), "product");
        }
        ok = cu_ok(cudaStreamEndCapture(st, &g), "capture") && ok;
    }
    best = graph_best(ok, g, st, ev);
    cudaStreamDestroy(st);
    return best;
}

/* The 8B / 1B shapes, 4-bit g64, T = 8..128: the GEMV path and the 4-bit
 * GEMM by T (tile 0) and with every tile configuration forced; each GEMM
 * result bitwise against tile 0's, tile 0's relative error against the
 * GEMV's, each token of T = 128 against its T = 8 row; then the products
 * of a step per model. */
static int q4_bench(const char *only_model, const char *tiles)
{
    int want[Q4B_TILES + 1 + Q4B_SPLITS]; /* tiles 1..24, then the splits 1, 2, 4, 8 */
    for (int k = 0; k <= Q4B_TILES + Q4B_SPLITS; k++)
        want[k] = !tiles;
    for (const char *p = tiles; p && *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        const int k = p[0] == 's' ? Q4B_TILES + 1 + (atoi(p + 1) == 8 ? 3 : atoi(p + 1) / 2) : atoi(p);
        if (k >= 1 && k <= Q4B_TILES + Q4B_SPLITS)
            want[k] = 1;
    }
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10);
    printf("== 4-bit GEMM (tcu_q4_mm) against the tensor-core GEMV, q4 g64: us per product (norm / SwiGLU included) in "
           "a graph of %d, best of 3; copy bandwidth %.0f GB/s\n",
           GV_REPS, bw / 1e9);
    static double ms[GV_NSHAPE][Q4B_NT][Q4B_TILES + 2 + Q4B_SPLITS]; /* [.][.][0] GEMV, [1] tile 0, [1 + k] tile k,
                                                                     * [2 + TILES + i] split 2^i */
    cudaEvent_t ev[2];
    cudaEventCreate(&ev[0]);
    cudaEventCreate(&ev[1]);
    const int TMAX = 128, NIN_MAX = 14336, NOUT_MAX = 128256;
    float *x = NULL, *y = NULL, *gain = NULL, *nout = NULL, *xs = NULL;
    uint16_t *xb = NULL;
    void *stage = NULL;
    const size_t stage_bytes = (size_t)NIN_MAX * 204 * 4;
    if (!cu_ok(cudaMalloc((void **)&x, sizeof(float) * TMAX * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&y, sizeof(float) * 2 * TMAX * NOUT_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&gain, sizeof(float) * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&nout, sizeof(float) * TMAX * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&xb, sizeof(uint16_t) * TMAX * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&xs, sizeof(float) * TMAX * NIN_MAX / 32), "alloc") ||
        !cu_ok(cudaMalloc(&stage, stage_bytes), "alloc"))
        return 1;
    float *h0 = malloc(sizeof(float) * TMAX * NOUT_MAX), *h1 = malloc(sizeof(float) * TMAX * NOUT_MAX);
    if (!h0 || !h1)
        return 1;
    tcu_opts base;
    tern_err oerr = {0};
    if (model_cuda_opts_from_env(&base, &oerr)) {
        fprintf(stderr, "bench_cuda: %s\n", oerr.msg);
        return 2;
    }
    base.exact = 0;
    int bad = 0;
    printf("%-4s %-8s %3s %8s %8s %6s", "mdl", "shape", "T", "gemv", "q4gemm", "x");
    for (int k = 1; k <= Q4B_TILES; k++)
        printf(" %6s%2d", "tile", k);
    for (int i = 0; i < Q4B_SPLITS; i++)
        printf(" %7s%d", "split", 1 << i);
    printf(" %9s %s\n", "rel/gemv", "bits");
    for (int si = 0; si < GV_NSHAPE; si++) {
        const gv_shape *sh = &gv_shapes[si];
        if (only_model && strcmp(only_model, sh->model)) {
            for (int ti = 0; ti < Q4B_NT; ti++)
                for (int k = 0; k < Q4B_TILES + 2 + Q4B_SPLITS; k++)
                    ms[si][ti][k] = NAN;
            continue;
        }
        const int nm = sh->glu ? 2 : 1;
        const size_t wb = (size_t)sh->n_out * sh->n_in / 2, sbn = (size_t)sh->n_out * (sh->n_in / GV_GROUP) * 2;
        const size_t bytes = nm * (wb + sbn * sizeof(float));
        int nc = (int)(((size_t)256 << 20) / bytes) + 1;
        nc = nc > 16 ? 16 : nc;
        void *w[16] = {0};
        float *sb[16] = {0};
        for (int c = 0; c < nc; c++) {
            if (!cu_ok(cudaMalloc(&w[c], nm * wb), "alloc") ||
                !cu_ok(cudaMalloc((void **)&sb[c], nm * sbn * sizeof(float)), "alloc"))
                return 1;
            tcu_fill_random(w[c], nm * wb, TCU_Q4, 1000 + c, 0.05f, NULL);
            tcu_fill_random(sb[c], nm * sbn, TCU_F32, 2000 + c, 0.01f, NULL);
        }
        tcu_fill_random(x, (size_t)TMAX * sh->n_in, TCU_F32, 7 + si, 1.0f, NULL);
        tcu_fill_random(gain, (size_t)sh->n_in, TCU_F32, 77 + si, 0.5f, NULL);
        if (!cu_ok(cudaDeviceSynchronize(), "fill"))
            return 1;
        for (int ti = 0; ti < Q4B_NT; ti++) {
            const int T = q4b_Ts[ti];
            q4b_job j;
            memset(&j, 0, sizeof j);
            j.sh = sh;
            j.o = base;
            j.xb = xb;
            j.xs = xs;
            tcu_gemv_args *a = &j.a;
            a->n = nm;
            a->glu = sh->glu;
            a->x = x;
            a->n_in = sh->n_in;
            a->T = T;
            a->wide = 1;
            a->stage = stage;
            a->stage_bytes = stage_bytes;
            if (sh->norm) {
                a->norm_g = gain;
                a->norm_out = nout;
                a->norm_eps = GV_EPS;
            }
            for (int k = 0; k < nm; k++) {
                a->m[k].kind = TCU_Q4;
                a->m[k].group = GV_GROUP;
                a->m[k].n_out = sh->n_out;
                a->m[k].y = y + (size_t)k * TMAX * NOUT_MAX;
            }
            for (int v = 0; v < Q4B_TILES + 2 + Q4B_SPLITS; v++) {
                if (v >= 2 && !want[v - 1]) {
                    ms[si][ti][v] = NAN;
                    continue;
                }
                j.path = v > 0;
                j.o.q4_tile = v > 0 && v < Q4B_TILES + 2 ? v - 1 : 0;
                j.o.q4_split = v >= Q4B_TILES + 2 ? 1 << (v - Q4B_TILES - 2) : 0;
                ms[si][ti][v] = q4b_time(&j, nc, w, sb, wb, sbn, ev);
            }
            j.o.q4_split = 0;
            /* bits: copy 0, the GEMV's output, then tile 0's and every tile's */
            gv_point(a, 0, w, sb, wb, sbn);
            j.path = 0;
            j.o.q4_tile = 0;
            if (!cu_ok(q4b_issue(&j, NULL), "gemv") || !cu_ok(cudaDeviceSynchronize(), "gemv"))
                return 1;
            cudaMemcpy(h0, a->m[0].y, sizeof(float) * T * sh->n_out, cudaMemcpyDeviceToHost);
            j.path = 1;
            if (!cu_ok(q4b_issue(&j, NULL), "q4") || !cu_ok(cudaDeviceSynchronize(), "q4"))
                return 1;
            cudaMemcpy(h1, a->m[0].y, sizeof(float) * T * sh->n_out, cudaMemcpyDeviceToHost);
            double num = 0, den = 0;
            for (size_t i = 0; i < (size_t)T * sh->n_out; i++) {
                const double d = (double)h1[i] - h0[i];
                num += isfinite(h1[i]) ? d * d : INFINITY;
                den += (double)h0[i] * h0[i];
            }
            const double rel = sqrt(num / (den > 0 ? den : 1));
            int same = 1;
            for (int k = 1; k <= Q4B_TILES && same; k++) {
                if (!want[k])
                    continue;
                j.o.q4_tile = k;
                if (!cu_ok(q4b_issue(&j, NULL), "q4") || !cu_ok(cudaDeviceSynchronize(), "q4"))
                    return 1;
                cudaMemcpy(h0, a->m[0].y, sizeof(float) * T * sh->n_out, cudaMemcpyDeviceToHost);
                same = !memcmp(h0, h1, sizeof(float) * T * sh->n_out);
            }
            if (same && T > 8) { /* the first 8 tokens alone as a batch of 8 */
                j.o.q4_tile = 0;
                a->T = 8;
                if (!cu_ok(q4b_issue(&j, NULL), "q4") || !cu_ok(cudaDeviceSynchronize(), "q4"))
                    return 1;
                a->T = T;
                cudaMemcpy(h0, a->m[0].y, sizeof(float) * 8 * sh->n_out, cudaMemcpyDeviceToHost);
                same = !memcmp(h0, h1, sizeof(float) * 8 * sh->n_out);
            }
            if (!same || !(rel <= 1e-2))
                bad++;
            printf("%-4s %-8s %3d %8.1f %8.1f %5.2fx", sh->model, sh->name, T, ms[si][ti][0] * 1e3, ms[si][ti][1] * 1e3,
                   ms[si][ti][0] / ms[si][ti][1]);
            for (int k = 1; k <= Q4B_TILES + Q4B_SPLITS; k++)
                printf(" %8.1f", ms[si][ti][1 + k] * 1e3);
            printf(" %9.2e %s\n", rel, same ? "same" : "DIFFER");
            fflush(stdout);
        }
        for (int c = 0; c < nc; c++) {
            cudaFree(w[c]);
            cudaFree(sb[c]);
        }
    }
    printf("== products of a step (sum of count x us over the model's shapes), ms: gemv / q4gemm (tile by T) / "
           "q4gemm (best tile per shape) - and the best tile and split (with the tile by T) per shape\n");
    const char *models[2] = {"8b", "1b"};
    for (int mi = 0; mi < 2; mi++)
        for (int ti = 0; ti < Q4B_NT; ti++) {
            double s0 = 0, s1 = 0, sb = 0;
            char bestl[256] = "";
            int len = 0;
            for (int si = 0; si < GV_NSHAPE; si++) {
                const gv_shape *sh = &gv_shapes[si];
                if (strcmp(sh->model, models[mi]))
                    continue;
                int bk = 1;
                for (int k = 1; k <= Q4B_TILES; k++)
                    if (ms[si][ti][1 + k] < ms[si][ti][1 + bk] || isnan(ms[si][ti][1 + bk]))
                        bk = k;
                s0 += sh->count * ms[si][ti][0];
                s1 += sh->count * ms[si][ti][1];
                sb += sh->count * ms[si][ti][1 + bk];
                int bs = 0;
                for (int i = 1; i < Q4B_SPLITS; i++)
                    if (ms[si][ti][2 + Q4B_TILES + i] < ms[si][ti][2 + Q4B_TILES + bs] ||
                        isnan(ms[si][ti][2 + Q4B_TILES + bs]))
                        bs = i;
                len += snprintf(bestl + len, sizeof bestl - (size_t)len, " %s:tile %d/split %d", sh->name, bk, 1 << bs);
            }
            if (isnan(s0))
                continue;
            printf("%-4s T %3d: gemv %.3f ms, q4gemm %.3f ms (%.2fx), best tiles %.3f ms (%.2fx);%s\n", models[mi],
                   q4b_Ts[ti], s0, s1, s0 / s1, sb, s0 / sb, bestl);
        }
    printf("== q4 check: %s\n", bad ? "FAILED (rel/gemv over 1e-2 or bits DIFFER)" : "every tile the same bits, "
                                                                                      "within 1e-2 of the GEMV");
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    cudaFree(x);
    cudaFree(y);
    cudaFree(gain);
    cudaFree(nout);
    cudaFree(xb);
    cudaFree(xs);
    cudaFree(stage);
    free(h0);
    free(h1);
    return bad ? 1 : 0;
}

/* ---- --lt: a step's cuBLASLt products, q/k/v and gate/up one GEMM each or a GEMM a matrix ---- */

/* The layer's dense shapes of a Llama model (tcu_opts.lt_cat merges q/k/v and gate/up). */
typedef struct lb_model {
    const char *name;
    int dim, qd, kvd, n_ff, n_vocab, n_layer;
} lb_model;
static const lb_model lb_models[] = {{"8b", 4096, 4096, 1024, 14336, 128256, 32},
                                     {"1b", 2048, 2048, 512, 8192, 128256, 16}};
#define LB_NT 3
static const int lb_Ts[LB_NT] = {8, 32, 128};

/* One product group as a cuBLASLt step runs it: n GEMMs over consecutive
 * row blocks of one weight buffer (rows[k] rows each; outputs [T][rows[k]]
 * one after the other in y), glu 1: then tcu_glu_half over the two outputs
 * (gate in place), glu 2: one GEMM of gate's and up's rows side by side,
 * then tcu_glu_half over its [T][2 n_ff] rows into act. */
typedef struct lb_job {
    cu_lt *lt;
    int n, rows[3], n_in, T, glu;
    const uint16_t *x;
    float *y, *act;
    uint16_t *yh;
} lb_job;

static int lb_issue(const lb_job *j, const uint16_t *w, cudaStream_t st)
{
    tern_err err = {0};
    size_t off = 0;
    float *y = j->y;
    for (int k = 0; k < j->n; k++) {
        if (cu_lt_matmul(j->lt, w + off * j->n_in, 0, j->x, y, j->rows[k], j->n_in, j->T, 0, &err)) {
            fprintf(stderr, "bench_cuda: %s\n", err.msg);
            return -1;
        }
        off += (size_t)j->rows[k];
        y += (size_t)j->T * j->rows[k];
    }
    if (j->glu == 1)
        return cu_ok(tcu_glu_half(j->y, j->y, j->y + (size_t)j->T * j->rows[0], j->rows[0], j->yh, j->T, j->rows[0], 0,
                                  0, NULL, (tcu_stream)st),
                     "glu")
                   ? 0
                   : -1;
    if (j->glu == 2) {
        const int nf = j->rows[0] / 2;
        return cu_ok(tcu_glu_half(j->act, j->y, j->y + nf, 2 * (long)nf, j->yh, j->T, nf, 0, 0, NULL, (tcu_stream)st),
                     "glu")
                   ? 0
                   : -1;
    }
    return 0;
}

/* ms per issue of j: GV_REPS of them rotating over nc weight copies (wb
 * halves apart) in one graph on the handle's stream st, best of 3 replays */
static double lb_time(const lb_job *j, const uint16_t *w, int nc, size_t wb, cudaStream_t st, cudaEvent_t *ev)
{
    cudaGraph_t g = NULL;
    int ok = 1;
    for (int r = 0; r < 3 && ok; r++)
        ok = lb_issue(j, w + (size_t)(r % nc) * wb, st) == 0;
    ok = ok && cu_ok(cudaStreamSynchronize(st), "warm-up") &&
         cu_ok(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "capture");
    if (ok) {
        for (int r = 0; r < GV_REPS && ok; r++)
            ok = lb_issue(j, w + (size_t)(r % nc) * wb, st) == 0;
        ok = cu_ok(cudaStreamEndCapture(st, &g), "capture") && ok;
    }
    return graph_best(ok, g, st, ev);
}

/* n floats of two device buffers: bitwise the same? */
static int lb_same(const float *a, const float *b, size_t n, float *ha, float *hb)
{
    if (!cu_ok(cudaMemcpy(ha, a, n * sizeof(float), cudaMemcpyDeviceToHost), "copy") ||
        !cu_ok(cudaMemcpy(hb, b, n * sizeof(float), cudaMemcpyDeviceToHost), "copy"))
        return 0;
    return !memcmp(ha, hb, n * sizeof(float));
}

/* The 8B / 1B bf16 products of a throughput-mode step on cuBLASLt (the
 * backend's algorithm choice: split-K off, the heuristic's first), T = 8,
 * 32, 128: q/k/v as three GEMMs and as one, gate/up as two plus
 * tcu_glu_half and as one plus the strided tcu_glu_half, o, down and
 * lm_head; per layer and per step (n_layer layers and the head), and the
 * bits: merged outputs against the separate ones, and a merged GEMM's
 * first 8 tokens at T = 128 against T = 8. */
static int lt_bench(const char *only_model)
{
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10);
    printf("== cuBLASLt products (bf16 in, f32 out, split-K as tcu_opts.lt_splitk): q/k/v and gate/up a GEMM a matrix against one GEMM "
           "a group (tcu_opts.lt_cat); us per layer in a graph of %d, best of 3; copy bandwidth %.0f GB/s\n",
           GV_REPS, bw / 1e9);
    cudaStream_t st;
    cudaEvent_t ev[2];
    tern_err err = {0};
    cu_lt *lt = NULL;
    tcu_opts lo;
    if (model_cuda_opts_from_env(&lo, &err))
        return die(&err);
    if (!cu_ok(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream") ||
        cu_lt_new(&lt, st, lo.lt_splitk, &err)) {
        fprintf(stderr, "bench_cuda: %s\n", err.msg[0] ? err.msg : "cuBLASLt");
        return 1;
    }
    cudaEventCreate(&ev[0]);
    cudaEventCreate(&ev[1]);
    const int TMAX = 128, NIN_MAX = 14336;
    const size_t YMAX = (size_t)TMAX * 128256;
    uint16_t *x = NULL, *yh = NULL;
    float *y = NULL, *y2 = NULL, *act = NULL;
    if (!cu_ok(cudaMalloc((void **)&x, sizeof(uint16_t) * TMAX * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&yh, sizeof(uint16_t) * TMAX * NIN_MAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&y, sizeof(float) * YMAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&y2, sizeof(float) * YMAX), "alloc") ||
        !cu_ok(cudaMalloc((void **)&act, sizeof(float) * TMAX * NIN_MAX), "alloc"))
        return 1;
    float *ha = malloc(sizeof(float) * YMAX), *hb = malloc(sizeof(float) * YMAX);
    if (!ha || !hb)
        return 1;
    tcu_fill_random(x, (size_t)TMAX * NIN_MAX, TCU_BF16, 5, 1.0f, NULL);
    int bad = 0;
    printf("%-4s %3s %9s %9s %6s %11s %11s %6s %8s %8s %8s | %-22s %s\n", "mdl", "T", "qkv x3", "qkv x1", "gain",
           "gu x2+glu", "gu x1+glu", "gain", "o", "down", "head", "step ms: a matrix / merged", "bits");
    for (size_t mi = 0; mi < sizeof lb_models / sizeof *lb_models; mi++) {
        const lb_model *md = &lb_models[mi];
        if (only_model && strcmp(only_model, md->name))
            continue;
        /* weights: q/k/v rows, gate/up rows, o, down, head - each group nc copies past L2 */
        const int M = md->qd + 2 * md->kvd;
        const size_t wq = (size_t)M * md->dim, wg = (size_t)2 * md->n_ff * md->dim, wo = (size_t)md->dim * md->qd,
                     wd = (size_t)md->dim * md->n_ff, wh = (size_t)md->n_vocab * md->dim;
        const size_t wsz[5] = {wq, wg, wo, wd, wh};
        uint16_t *w[5];
        int nc[5];
        for (int k = 0; k < 5; k++) {
            nc[k] = (int)(((size_t)256 << 20) / (wsz[k] * 2)) + 1;
            nc[k] = nc[k] > 16 ? 16 : nc[k];
            if (!cu_ok(cudaMalloc((void **)&w[k], wsz[k] * 2 * nc[k]), "alloc"))
                return 1;
            tcu_fill_random(w[k], wsz[k] * nc[k], TCU_BF16, 100 + 10 * mi + k, 0.05f, NULL);
        }
        if (!cu_ok(cudaDeviceSynchronize(), "fill"))
            return 1;
        for (int ti = 0; ti < LB_NT; ti++) {
            const int T = lb_Ts[ti];
            lb_job qkv3 = {lt, 3, {md->qd, md->kvd, md->kvd}, md->dim, T, 0, x, y, NULL, yh};
            lb_job qkv1 = {lt, 1, {M, 0, 0}, md->dim, T, 0, x, y2, NULL, yh};
            lb_job gu2 = {lt, 2, {md->n_ff, md->n_ff, 0}, md->dim, T, 1, x, y, NULL, yh};
            /* (merged: no f32 activation, as the backend when down reads the 16-bit copy) */
            lb_job gu1 = {lt, 1, {2 * md->n_ff, 0, 0}, md->dim, T, 2, x, y2, NULL, yh};
            lb_job o = {lt, 1, {md->dim, 0, 0}, md->qd, T, 0, x, y, NULL, yh};
            lb_job dn = {lt, 1, {md->dim, 0, 0}, md->n_ff, T, 0, x, y, NULL, yh};
            lb_job hd = {lt, 1, {md->n_vocab, 0, 0}, md->dim, T, 0, x, y, NULL, yh};
            const lb_job *jobs[7] = {&qkv3, &qkv1, &gu2, &gu1, &o, &dn, &hd};
            const int wk[7] = {0, 0, 1, 1, 2, 3, 4};
            double us[7];
            for (int k = 0; k < 7; k++)
                us[k] = lb_time(jobs[k], w[wk[k]], nc[wk[k]], wsz[wk[k]], st, ev) * 1e3;
            const double common = md->n_layer * (us[4] + us[5]) + us[6];
            const double step_sep = (md->n_layer * (us[0] + us[2]) + common) / 1e3,
                         step_cat = (md->n_layer * (us[1] + us[3]) + common) / 1e3;
            /* bits: copy 0 of each, separate against merged, and the merged
             * GEMM's first 8 tokens alone */
            int ok = lb_issue(&qkv3, w[0], st) == 0 && lb_issue(&qkv1, w[0], st) == 0 &&
                     cu_ok(cudaStreamSynchronize(st), "bits");
            int same_qkv = ok, same_gu = ok, inv = ok;
            if (ok) {
                if (!cu_ok(cudaMemcpy(ha, y2, sizeof(float) * T * M, cudaMemcpyDeviceToHost), "copy") ||
                    !cu_ok(cudaMemcpy(hb, y, sizeof(float) * T * M, cudaMemcpyDeviceToHost), "copy"))
                    return 1;
                for (int t = 0; t < T && same_qkv; t++) {
                    const size_t r[3] = {(size_t)md->qd, (size_t)md->kvd, (size_t)md->kvd};
                    size_t base = 0, col = 0;
                    for (int k = 0; k < 3; k++) {
                        same_qkv &= !memcmp(ha + (size_t)t * M + col, hb + base + (size_t)t * r[k], r[k] * 4);
                        base += (size_t)T * r[k];
                        col += r[k];
                    }
                }
                /* merged q/k/v at T = 8 against the first 8 tokens at T (in ha) */
                lb_job q8 = qkv1;
                q8.T = 8;
                q8.y = y;
                ok = lb_issue(&q8, w[0], st) == 0 && cu_ok(cudaStreamSynchronize(st), "bits") &&
                     cu_ok(cudaMemcpy(hb, y, sizeof(float) * 8 * M, cudaMemcpyDeviceToHost), "copy");
                inv = ok && !memcmp(ha, hb, sizeof(float) * 8 * M);
                lb_job gb = gu1;
                gb.act = act;
                ok = ok && lb_issue(&gu2, w[1], st) == 0 && lb_issue(&gb, w[1], st) == 0 &&
                     cu_ok(cudaStreamSynchronize(st), "bits");
                same_gu = ok && lb_same(y, act, (size_t)T * md->n_ff, ha, hb);
            }
            bad += !ok || !inv;
            printf("%-4s %3d %9.1f %9.1f %5.2fx %11.1f %11.1f %5.2fx %8.1f %8.1f %8.1f | %7.3f / %7.3f (%5.2fx) "
                   "q/k/v %s, gate/up %s, T=8 of %d %s\n",
                   md->name, T, us[0], us[1], us[0] / us[1], us[2], us[3], us[2] / us[3], us[4], us[5], us[6],
                   step_sep, step_cat, step_sep / step_cat, same_qkv ? "same" : "differ", same_gu ? "same" : "differ",
                   T, inv ? "same" : "DIFFER");
            fflush(stdout);
        }
        for (int k = 0; k < 5; k++)
            cudaFree(w[k]);
    }
    printf("== lt check: %s\n", bad ? "FAILED (a merged GEMM's token differs between T = 8 and T)"
                                    : "merged GEMMs batch-invariant (T = 8 rows = T rows)");
    cudaEventDestroy(ev[0]);
    cudaEventDestroy(ev[1]);
    cu_lt_free(lt);
    cudaStreamDestroy(st);
    cudaFree(x);
    cudaFree(yh);
    cudaFree(y);
    cudaFree(y2);
    cudaFree(act);
    free(ha);
    free(hb);
    return bad ? 1 : 0;
}
#endif

int main(int argc, char **argv)
{
    int n_prompt = 128, steps = 64, check = 32, n_prefill = 512, only_b1 = 0, kv_given = 0;
    kv_type kvt = KV_F32;
    int first = 1;
    if (argc >= 2 && !strcmp(argv[1], "--q4")) {
#ifdef TERN_CUDA
        if (model_cuda_device_count() <= 0) {
            fprintf(stderr, "bench_cuda: no GPU\n");
            return 2;
        }
        const char *only_model = NULL, *tiles = NULL;
        for (int i = 2; i + 1 < argc; i += 2) {
            if (!strcmp(argv[i], "--model"))
                only_model = argv[i + 1];
            else if (!strcmp(argv[i], "--tiles"))
                tiles = argv[i + 1];
        }
        return q4_bench(only_model, tiles);
#else
        fprintf(stderr, "bench_cuda: this tern was built without CUDA (make CUDA=1)\n");
        return 2;
#endif
    }
    if (argc >= 2 && !strcmp(argv[1], "--lt")) {
        const char *only_model = argc >= 4 && !strcmp(argv[2], "--model") ? argv[3] : NULL;
#ifdef TERN_CUDA
        if (model_cuda_device_count() <= 0) {
            fprintf(stderr, "bench_cuda: no GPU\n");
            return 2;
        }
        return lt_bench(only_model);
#else
        (void)only_model;
        fprintf(stderr, "bench_cuda: this tern was built without CUDA (make CUDA=1)\n");
        return 2;
#endif
    }
    if (argc >= 2 && !strcmp(argv[1], "--gemv")) {
        const char *list = NULL, *only_model = NULL, *only_kinds = NULL;
        int use_stage = 1;
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "--no-stage"))
                use_stage = 0;
            else if (!strcmp(argv[i], "--model") && i + 1 < argc)
                only_model = argv[++i];
            else if (!strcmp(argv[i], "--kinds") && i + 1 < argc)
                only_kinds = argv[++i];
            else if (!list && argv[i][0] != '-')
                list = argv[i];
            else {
                fprintf(stderr, "usage: bench_cuda --gemv [KERNELS] [--no-stage] [--model 8b|1b] [--kinds "
                                "bf16,q4g64,q8g64]\n");
                return 2;
            }
        }
#ifndef TERN_CUDA
        (void)list;
        (void)use_stage;
        (void)only_model;
        (void)only_kinds;
        fprintf(stderr, "bench_cuda: this tern was built without CUDA (make CUDA=1)\n");
        return 2;
#else
        if (model_cuda_device_count() <= 0) {
            fprintf(stderr, "bench_cuda: no GPU\n");
            return 2;
        }
        return gemv_bench(list, use_stage, only_model, only_kinds);
#endif
    }
    for (; first < argc && argv[first][0] == '-'; first += 2) {
        if (first + 1 >= argc)
            break;
        if (!strcmp(argv[first], "--prompt"))
            n_prompt = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--tokens"))
            steps = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--check"))
            check = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--prefill"))
            n_prefill = atoi(argv[first + 1]);
        else if (!strcmp(argv[first], "--only-b1"))
            only_b1 = atoi(argv[first + 1]) != 0;
        else if (!strcmp(argv[first], "--only-batch"))
            only_b1 = atoi(argv[first + 1]) > 1 ? atoi(argv[first + 1]) : atoi(argv[first + 1]) != 0;
        else if (!strcmp(argv[first], "--kv-type")) {
            tern_err e = {0};
            if (kv_type_parse(argv[first + 1], &kvt, &e)) {
                fprintf(stderr, "bench_cuda: %s\n", e.msg);
                return 2;
            }
            kv_given = 1;
        } else if (!strcmp(argv[first], "--exact-products")) {
            tern_kernels_exact_set(1);
            first--; /* no value */
        } else
            break;
    }
    if (first >= argc || n_prompt < 1 || n_prompt > 512 || steps < 4 || check < 0 || check > 500 || n_prefill < 1 ||
        n_prefill > 16384 || only_b1 < 0 || only_b1 > 128) {
        fprintf(stderr, "usage: bench_cuda [--prompt N<=512] [--tokens N>=4] [--check N] [--prefill N<=16384] "
                        "[--only-b1 0|1] [--only-batch N<=128] [--kv-type T] MODEL_DIR...\n");
        return 2;
    }
#ifndef TERN_CUDA
    (void)only_b1;
    (void)kv_given;
    fprintf(stderr, "bench_cuda: this tern was built without CUDA (make CUDA=1)\n");
    return 2;
#else
    if (model_cuda_device_count() <= 0) {
        fprintf(stderr, "bench_cuda: no GPU\n");
        return 2;
    }
    tern_err oerr = {0};
    tcu_opts opts; /* the defaults with the environment's overrides, as the backend takes them */
    if (model_cuda_opts_from_env(&opts, &oerr))
        return die(&oerr);
    char desc[1024];
    tcu_opts_format(&opts, desc, sizeof desc);
    double bw = tcu_copy_bandwidth((size_t)2 << 30, 10);
    printf("device copy bandwidth (read + write): %.0f GB/s; options: %s\n", bw / 1e9, desc);
    printf("%-28s %8s %9s %9s %7s %9s %9s %9s %9s %9s %10s %s\n", "model", "weightGB", "roof t/s", "b1 t/s", "%roof",
           "b8 t/s", "b32 t/s", "b128 t/s", "b8 blas", "b32 blas", "prefill/s", "check");
    for (int a = first; a < argc; a++) {
        tern_err err = {0};
        model_load_opts o = {0, "cpu"};
        tern_model *m = model_load_ex(argv[a], &o, &err);
        if (!m)
            return die(&err);
        model_backend *cpu = model_backend_get(m), *gpu = model_backend_cuda_new_opts(m, 0, &opts, &err);
        if (!gpu)
            return die(&err);
        const model_config *c = model_config_get(m);
        int V = c->n_vocab, maxlen = 512 + 8;
        if (n_prompt + steps > maxlen)
            maxlen = n_prompt + steps;
        int bs = 16, per = (maxlen + bs - 1) / bs + 1, n_tok = n_prefill > 512 ? n_prefill : 512;
        kv_pool kv;
        if (kv_pool_init(&kv, c->n_layer, model_kv_dim(m), bs, 128 * per + n_tok / bs + 64, &err))
            return die(&err);
        int32_t *prompt = malloc(sizeof(int32_t) * (size_t)n_tok);
        float *logits = malloc((size_t)128 * V * sizeof(float)), *lc = malloc((size_t)5 * V * sizeof(float));
        if (!prompt || !logits || !lc) {
            fprintf(stderr, "bench_cuda: out of memory\n");
            return 1;
        }
        tern_rng r;
        tern_rng_seed(&r, 42, 0);
        for (int i = 0; i < n_tok; i++)
            prompt[i] = (int32_t)(tern_rng_f32(&r) * (V - 1));
        char chk[96] = "-";
        if (check > 0) {
            int32_t idc[4], idg[4];
            model_backend_swap(m, cpu);
            if (check_run(m, &kv, check, prompt, lc, idc, &err))
                return die(&err);
            model_backend_swap(m, gpu);
            if (check_run(m, &kv, check, prompt, logits, idg, &err))
                return die(&err);
            double num = 0, den = 0, num0 = 0, den0 = 0;
            for (size_t i = 0; i < (size_t)5 * V; i++) {
                double d = (double)logits[i] - lc[i];
                num += d * d;
                den += (double)lc[i] * lc[i];
                if (i < (size_t)V) {
                    num0 += d * d;
                    den0 += (double)lc[i] * lc[i];
                }
            }
            snprintf(chk, sizeof chk, "prefill rel %.2e, 5 steps rel %.2e, greedy %s", sqrt(num0 / den0),
                     sqrt(num / den), memcmp(idc, idg, sizeof idc) ? "DIFFER" : "same");
        }
        model_backend_swap(m, gpu);
        if (kv_given) { /* the timed runs on a device pool of that type */
            kv_spec spec;
            kv_spec_init(&spec, kvt);
            kv_pool_free(&kv);
            if (model_kv_pool_init(m, &kv, &spec, bs, 128 * per + n_tok / bs + 64, 0, 0, &err) ||
                model_kv_bind(m, &kv, &err))
                return die(&err);
        }
        double wb = (double)model_weight_bytes(m);
        if (only_b1 > 1) { /* --only-batch N: batch N and the check only */
            const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
            double tn = decode_run(m, &kv, only_b1, n_prompt, steps, prompt, logits, &err);
            if (tn < 0)
                return die(&err);
            printf("%-28s %8.2f %9.0f %9s b%d %.1f tok/s (batch %d only) %s\n", name, wb / 1e9, bw / wb, "-",
                   only_b1, only_b1 * (steps - 2) / tn, only_b1, chk);
            goto next_model;
        }
        double t1 = decode_run(m, &kv, 1, n_prompt, steps, prompt, logits, &err);
        if (only_b1 && t1 >= 0) { /* --only-b1 1: batch 1 and the check only */
            const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
            double b1 = (steps - 2) / t1, roof = bw / wb;
            printf("%-28s %8.2f %9.0f %9.1f %6.0f%% (batch 1 only) %s\n", name, wb / 1e9, roof, b1, 100 * b1 / roof,
                   chk);
            goto next_model;
        }
        double t8 = t1 >= 0 ? decode_run(m, &kv, 8, n_prompt, steps, prompt, logits, &err) : -1;
        double t32 = t8 >= 0 ? decode_run(m, &kv, 32, n_prompt, steps, prompt, logits, &err) : -1;
        double t128 = t32 >= 0 ? decode_run(m, &kv, 128, n_prompt, steps, prompt, logits, &err) : -1;
        double tp = t128 >= 0 ? prefill_run(m, &kv, n_prefill, prompt, logits, &err) : -1;
        if (tp < 0)
            return die(&err);
        /* batches through cuBLAS (gemm_min_t 2): not batch-invariant */
        tcu_opts ob = opts;
        ob.gemm_min_t = 2;
        ob.tc_max_t = 0;
        model_backend *blas = model_backend_cuda_new_opts(m, 0, &ob, &err);
        if (!blas)
            return die(&err);
        model_backend_swap(m, blas);
        double c8 = decode_run(m, &kv, 8, n_prompt, steps, prompt, logits, &err);
        double c32 = c8 >= 0 ? decode_run(m, &kv, 32, n_prompt, steps, prompt, logits, &err) : -1;
        model_backend_swap(m, gpu);
        blas->free(blas);
        if (c32 < 0)
            return die(&err);
        /* eager (no graph) batch-1 and batch-32 runs with every launch timed: where a
         * decode step's time goes */
        tcu_opts oe = opts;
        oe.graphs = 0;
        model_backend *eager = model_backend_cuda_new_opts(m, 0, &oe, &err);
        if (!eager)
            return die(&err);
        model_backend_swap(m, eager);
        char prof[400], prof32[400], prof128[400], pprof[400];
        int ok = !eager_profile(m, &kv, 1, n_prompt, prompt, logits, t1 / (steps - 2), prof, sizeof prof, &err) &&
                 !eager_profile(m, &kv, 32, n_prompt, prompt, logits, t32 / (steps - 2), prof32, sizeof prof32, &err) &&
                 !eager_profile(m, &kv, 128, n_prompt, prompt, logits, t128 / (steps - 2), prof128, sizeof prof128,
                                &err);
        /* and one eager prefill (3 repetitions): where its time goes */
        double fms[TCU_PROF_N];
        int fn[TCU_PROF_N];
        tcu_prof_start();
        double tpe = ok ? prefill_run(m, &kv, n_prefill, prompt, logits, &err) : -1;
        int frc = tcu_prof_stop(fms, fn);
        model_backend_swap(m, gpu);
        eager->free(eager);
        if (tpe < 0)
            return die(&err);
        int len = snprintf(pprof, sizeof pprof, "eager %d-token prefill %.3f ms; kernels:", n_prefill, tpe * 1e3);
        prof_line(pprof, sizeof pprof, len, fms, fn, 3, "ms", frc);
        const char *name = strrchr(argv[a], '/') ? strrchr(argv[a], '/') + 1 : argv[a];
        double b1 = (steps - 2) / t1, roof = bw / wb;
        printf("%-28s %8.2f %9.0f %9.1f %6.0f%% %9.0f %9.0f %9.0f %9.0f %9.0f %10.0f %s\n", name, wb / 1e9, roof, b1,
               100 * b1 / roof, 8 * (steps - 2) / t8, 32 * (steps - 2) / t32, 128 * (steps - 2) / t128,
               8 * (steps - 2) / c8, 32 * (steps - 2) / c32, n_prefill / tp, chk);
        printf("  %s b1 profile: %s\n", name, prof);
        printf("  %s b32 profile: %s\n", name, prof32);
        printf("  %s b128 profile: %s\n", name, prof128);
        printf("  %s prefill profile: %s\n", name, pprof);
    next_model:
        fflush(stdout);
        model_backend_swap(m, cpu);
        gpu->free(gpu);
        kv_pool_free(&kv);
        free(logits);
        free(lc);
        free(prompt);
        model_free(m);
    }
    return 0;
#endif
}
