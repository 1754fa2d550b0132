/* CUDA kernels of the CUDA backend (src/model/backend_cuda.c), behind plain
 * C launchers so that the host glue stays C17. Every pointer here is a
 * device pointer unless its comment says otherwise; every launcher queues
 * work on `stream` and returns the launch's cudaError_t as an int (0 = ok).
 * Activations are f32; weights stay in their stored form (f32, bf16, f16,
 * or MLX affine 4/8-bit with f32 {scale, bias} pairs, the CPU layout). */
#ifndef TERN_TENSOR_CUDA_KERNELS_H
#define TERN_TENSOR_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *tcu_stream;

/* Weight storage kinds. */
enum { TCU_F32 = 0, TCU_BF16 = 1, TCU_F16 = 2, TCU_Q4 = 3, TCU_Q8 = 4 };

#define TCU_MM_MAX 4

typedef struct tcu_mat {
    const void *w;   /* dense [n_out][n_in], or packed bytes [n_out][n_in * bits / 8] */
    const float *sb; /* quantized: [n_out][n_in / group][2] {scale, bias}; else NULL */
    float *y;        /* [T][n_out] */
    int n_out, kind, group;
} tcu_mat;

/* GEMV-style product for small T: y_k[t][r] (=, or += when accumulate)
 * sum_i W_k[r][i] x[t][i] for k < n (all of one kind, sharing n_in). One
 * warp per output row, f32 accumulation in a fixed order per (row, token),
 * so a row's result never depends on T. glu = 1 (SiLU) or 2 (GELU-tanh):
 * n = 2 and m[0].y[t][r] = act(gate) * up, m[1].y unused. n_in must be a
 * multiple of 32. */
typedef struct tcu_gemv_args {
    int n;
    tcu_mat m[TCU_MM_MAX];
    const float *x; /* [T][n_in] */
    int n_in, T, accumulate, glu;
    /* optional RMSNorm of the inputs first (norm_g != NULL): the product
     * uses (x * r) * g, r = 1 / sqrt(mean(x^2) + eps) per token, as
     * tcu_rmsnorm computes it. Variants that stage activations in shared
     * memory fuse it; the others run tcu_rmsnorm into norm_out ([T][n_in])
     * first. */
    const float *norm_g;
    float *norm_out;
    float norm_eps;
    const int32_t *norm_rows; /* with norm_g, may be set: token t's input is x row norm_rows[t] */
    /* the step carries two or more sequences: variant 17 then takes the
     * tensor-core kernel (16), else 4 */
    int wide;
    /* optional device scratch of stage_bytes: the tensor-core variant (16)
     * splits a step's activations into it once per launch above 2 tokens
     * (else, or when it is too small, every block splits its own; the
     * same bits) - 192 bytes per input at 32 tokens, 4-bit + 384 per group */
    void *stage;
    size_t stage_bytes;
    /* the launch follows a kernel that leaves the memory partly idle (down
     * after the ragged last wave of gate/up): with programmatic dependent
     * launch the one-token shared-memory GEMV requests its first weight
     * chunks before it waits for that kernel, as the 4/8-bit ones always
     * do */
    int early;
    /* one token of bf16 weights: the weights stream through a ring of
     * shared memory (gemv_ring.cu), requested from the block's start */
    int ring;
} tcu_gemv_args;
int tcu_gemv(const tcu_gemv_args *a, tcu_stream stream);
/* launches that took the shared-memory ring (tcu_gemv_args.ring), for tests */
int tcu_gemv_ring_count(void);

/* GEMV kernel variants (gemv.cu and gemv_tc.cu say what each does; every one keeps
 * the contract above). The choice is process-wide and per weight kind
 * (never per T: that would break batch invariance; variant 17 looks only
 * at `wide`): TCU_GEMV_DEFAULT,
 * overridden by TERN_CUDA_GEMV at the first launch, both "k" (every kind)
 * or "kb,k4,k8" (bf16, 4-bit, 8-bit), or tcu_gemv_set_variant(kind, k)
 * (kind -1 = all; takes effect for launches and graph captures after it;
 * -1 when k is out of range). f32/f16 take the bf16 entry but run variant
 * 0 whatever it says. */
/* "17,17,15": bf16 and 4-bit 17 = the fastest kernel alone for a step of
 * one sequence (bf16 4: 2 rows a warp; 4-bit 15: rows a warp by shape -
 * gemv.cu gemv_by_shape), the tensor-core variant 16 (2-4x faster at
 * 8-32 sequences, slower alone) for a step of two or more (`wide`): a
 * request's greedy tokens may differ at floating-point knife-edges
 * between running alone and in a batch; "4,15,15" keeps every step on
 * one kernel (bitwise batch-invariant). 8-bit 15 (docs/cuda.md). */
#define TCU_GEMV_DEFAULT "17,17,15" /* the default variant(s): change here */
#define TCU_GEMV_N_VARIANTS 18
int tcu_gemv_variant(int kind);
int tcu_gemv_set_variant(int kind, int v);
/* back to TCU_GEMV_DEFAULT / TERN_CUDA_GEMV */
void tcu_gemv_variant_reset(void);
const char *tcu_gemv_variant_name(int v);

/* Programmatic dependent launch: a launch may start while the one before
 * it finishes (kernels wait for their inputs on the device). Modes: 0 off,
 * 1 every launch (GEMVs request their first weight chunks before waiting),
 * 2 the shared-memory GEMV launches of 4/8-bit weights only, 3 every
 * launch, the shared-memory GEMVs of 16-bit weights requesting nothing
 * before the wait and one-wave ones spread over the SMs, 4 every launch but
 * the GEMVs of 16-bit weights (the default before 3; measured at batch 1 on
 * the H200: 8B bf16 3 against 4 +3%, 1 against 4 -2% - docs/cuda.md).
 * TCU_PDL_DEFAULT, overridden by TERN_CUDA_PDL=0..4 at the first launch or
 * tcu_pdl_set. */
#define TCU_PDL_DEFAULT 3
void tcu_pdl_set(int mode);
int tcu_pdl(void); /* the mode */

/* Dense copy of a weight for the cuBLAS path: out[n_out][n_in] as bf16
 * (TCU_BF16 out) or f16 (kind TCU_F16 stays f16). Quantized -> bf16. */
int tcu_dequant_bf16(const tcu_mat *m, int n_in, uint16_t *out, tcu_stream stream);
/* x[n] f32 -> out[n] bf16 (to_f16 = 0) or f16 (to_f16 = 1), round to nearest. */
int tcu_f32_to_half(const float *x, uint16_t *out, long n, int to_f16, tcu_stream stream);

/* Row-gathered embedding: x[i] = scale * row tokens[i] of w (scale 0 = 1). */
int tcu_embed(const tcu_mat *w, int n_in, const int32_t *tokens, int T, float scale, float *x, tcu_stream stream);

/* RMSNorm of rows: out[j] (= or += when add) x[rows ? rows[j] : j] * r * g,
 * r = 1 / sqrt(mean(x^2) + eps), for j < n_rows rows of length n. */
int tcu_rmsnorm(const float *x, const int32_t *rows, const float *g, float *out, int n_rows, int n, float eps,
                int add, tcu_stream stream);

/* act (= gate) = silu(gate) * up, or gelu_tanh when gelu. */
int tcu_glu(float *gate, const float *up, long n, int gelu, tcu_stream stream);
/* x = c * tanh(x / c). */
int tcu_softcap(float *x, long n, float c, tcu_stream stream);

/* The paged KV pool on the device, the host pool's layout:
 * k, v [n_layer][n_blocks][block_size][kv_dim] f32. A token's block table is
 * blk + bt_off[i] (block ids of its sequence). */
typedef struct tcu_kv {
    float *k, *v;
    int n_blocks, block_size, kv_dim;
} tcu_kv;

/* After the q/k/v product of one layer, per token i: optional biases, per-
 * head RMSNorm (qn/kn, may be NULL), RoPE at pos[i] with inv_freq (rotate-
 * half pairs), then K and V of the token written to the cache. q is
 * [T][n_head*hd] (rotated in place), k/v [T][n_kv*hd]. */
typedef struct tcu_qkv_args {
    float *q, *k, *v;
    const float *bq, *bk, *bv, *qn, *kn, *inv_freq;
    const int32_t *pos, *bt_off, *blk;
    tcu_kv kv;
    int layer, T, n_head, n_kv_head, hd;
    float eps;
} tcu_qkv_args;
int tcu_qkv_post(const tcu_qkv_args *a, tcu_stream stream);

/* Paged attention (flash-decoding): each (token, head) splits its positions
 * max(0, pos - window + 1) .. pos (len of them) over n_split blocks, or
 * with split_len > 0 over min(n_split, len / split_len + 1) - its own length
 * alone decides, whatever the other tokens of the launch (many short splits
 * are fastest for one token, few for many) - each with an online
 * softmax; the last block of a (token, head) to finish merges the parts
 * (arrival counters per stream; a second kernel merges them where no
 * counter slot is free). part is scratch of
 * T * n_head * n_split * (hd + 2) floats. hd a multiple of 32, <= 256. */
typedef struct tcu_attn_args {
    const float *q;
    float *out, *part;
    const int32_t *pos, *bt_off, *blk;
    tcu_kv kv;
    int layer, T, n_head, n_kv_head, hd, window, n_split;
    float scale, softcap;
    int split_len;
} tcu_attn_args;
int tcu_attention(const tcu_attn_args *a, tcu_stream stream);
/* tcu_qkv_post and tcu_attention in one launch (a.q: post's unrotated q,
 * left as it is), for steps whose tokens are each of another sequence: no
 * token reads the K/V that another token of the step writes. The same
 * values as the two launches. */
int tcu_qkv_attention(const tcu_qkv_args *post, const tcu_attn_args *a, tcu_stream stream);
/* The stream is about to be destroyed: its counter slot (tcu_attention's
 * merge, tcu_step's barrier - both left at zero after every launch) goes
 * back to the pool. */
void tcu_stream_forget(tcu_stream stream);

/* One layer's weights and vectors for tcu_step (device pointers; bf16
 * weights [n_out][n_in]; norms, biases and q/k norms as in tcu_qkv_args,
 * NULL when absent). */
typedef struct tcu_step_layer {
    const uint16_t *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *qn, *kn, *rope;
    int window;
} tcu_step_layer;

/* The layers of a decode step of one token in one launch: per layer x's
 * RMSNorm and the q/k/v product, tcu_qkv_attention, x += o(att), the
 * norm and gate/up with act(gate) * up into gate, x += down(gate) - the
 * values of those launches with the bf16 GEMV variant 4 (bit for bit).
 * One block a multiprocessor, all resident (a cooperative launch), a grid
 * barrier between the steps: the weights of the next product are in
 * flight while the barrier waits, and the o weights are brought into L2
 * during the attention. post and attn describe the token as for
 * tcu_qkv_attention (T = 1; their per-layer fields are taken from
 * layers[l]); post.q/k/v are the product's outputs, attn.out the
 * attention's. Returns -1 with nothing queued when the shape is not
 * covered (head_dim 32, 64 or 128; every n_in a multiple of 8; the
 * activations within shared memory; up to 256 layers). */
typedef struct tcu_step_args {
    const tcu_step_layer *layers; /* device array [n_layer] */
    int n_layer, dim, n_ff, glu;  /* glu 1 SiLU, 2 GELU-tanh */
    float *x, *gate;              /* residual [dim]; [n_ff] scratch */
    float eps;
    tcu_qkv_args post;
    tcu_attn_args attn;
    int pf_o;  /* percent of the o weights brought into L2 during the attention */
    int pf_kb; /* KiB a warp brings into L2 of its next product before a barrier */
    int u;     /* 16-byte weight loads in flight per lane: 8 or 16 */
    int trace; /* 1: the first block times the launch's steps (tcu_step_trace) */
} tcu_step_args;
int tcu_step(const tcu_step_args *a, tcu_stream stream);
int tcu_step_count(void); /* tcu_step launches queued (or captured) so far */
/* The last traced tcu_step (synchronizes): the mean microseconds of each
 * of a layer's five steps (q/k/v, attention, o, gate/up, down, each up to
 * the grid barrier after it) and the launch's total in us[5]. */
int tcu_step_trace(int n_layer, double us[6]);

/* The same attention for prefill chunks, tiled: tiles[2 j], tiles[2 j + 1]
 * = first token and count (<= TCU_ATTN_TILE_Q) of tile j, tokens of one
 * sequence at consecutive positions; each block keeps one tile's queries of
 * one head in shared memory and streams the keys through it (a K/V row is
 * read once per tile, not once per token). Two kernels: tensor cores
 * (mma.sync TF32: Q, K, V and P rounded to TF32, f32 accumulation - the
 * default) or f32 CUDA cores; both sum in another order than tcu_attention,
 * so they are used only where products are not batch-invariant anyway (the
 * cuBLAS path). hd 64, 128 or 256; -1 (nothing queued) for other head dims.
 * part is unused. tcu_attention_tiled_set(1) picks the f32 kernel, (2) the
 * tensor cores (TERN_CUDA_ATTN_TILED=1 at the first launch: f32). */
#define TCU_ATTN_TILE_Q 64
int tcu_attention_tiled(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, tcu_stream stream);
void tcu_attention_tiled_set(int mode);

/* Device-to-device copy bandwidth (bytes read + written per second) over a
 * buffer of `bytes`, best of reps; 0 on failure. Synchronizes. */
double tcu_copy_bandwidth(size_t bytes, int reps);

/* Per-launch profile for benchmarks: between tcu_prof_start and
 * tcu_prof_stop every launcher above brackets its launches with events
 * (eager streams only, not graph captures); stop synchronizes and returns
 * milliseconds and launch counts per category. Not thread-safe. */
enum { TCU_PROF_GEMV, TCU_PROF_ATTN, TCU_PROF_QKV, TCU_PROF_NORM, TCU_PROF_EMBED, TCU_PROF_OTHER, TCU_PROF_N };
void tcu_prof_start(void);
int tcu_prof_stop(double ms[TCU_PROF_N], int count[TCU_PROF_N]);

/* Benchmark data: n elements at p of kind `what` - TCU_BF16 or TCU_F32
 * uniform in [-scale, scale], anything else random bytes - from a hash of
 * (seed, index). */
int tcu_fill_random(void *p, size_t n, int what, uint64_t seed, float scale, tcu_stream stream);

#ifdef __cplusplus
}
#endif

#endif
