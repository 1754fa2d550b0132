/* CUDA kernels of the CUDA backend (src/model/backend_cuda.c), behind plain
 * C launchers so that the host glue stays C17. Every pointer here is a
 * device pointer unless its comment says otherwise; every launcher queues
 * work on `stream` and returns the launch's cudaError_t as an int (0 = ok).
 * Activations are f32; weights stay in their stored form (f32, bf16, f16,
 * or MLX affine 4/8-bit with f32 {scale, bias} pairs, the CPU layout). */
#ifndef TERN_TENSOR_CUDA_KERNELS_H
#define TERN_TENSOR_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CUstream_st *tcu_stream;

/* Weight storage kinds. */
enum {
    TCU_F32 = 0, TCU_BF16 = 1, TCU_F16 = 2, TCU_Q4 = 3, TCU_Q8 = 4,
    TCU_F8 = 5, /* FP8 E4M3, block scales */
    TCU_MX4 = 6 /* MXFP4 (experts only): E2M1 codes, an E8M0 scale byte per 32 */
};

/* The GEMV kernels (gemv.cu, gemv_tc.cu), one chosen per weight kind
 * (tcu_opts.gemv_*). Every one keeps tcu_gemv's contract; each sums a row
 * in an order fixed by the kernel and n_in, never by T, so a row does not
 * depend on the batch - but two kernels may differ in the last bits. */
enum {
    /* one warp a row, activations read through L1: f32/f16 weights always
     * (every other choice falls back to it for them) */
    TCU_GEMV_PLAIN = 0,
    /* two rows a warp, the activations (and a fused RMSNorm) staged in
     * shared memory; one token: loads of the next pass in flight while a
     * half is summed */
    TCU_GEMV_STAGED,
    /* STAGED with the rows a warp picked by the launch's shape (2, 3, 4 or
     * 6; gemv.cu gemv_by_shape) and 4-bit codes read as 1 + q/16 */
    TCU_GEMV_BY_SHAPE,
    /* tensor cores for bf16 and 4-bit (mma columns, split-K over a
     * thread-block cluster): tcu_opts.exact - each activation split
     * exactly into three bf16 parts; else rounded once to bf16 (the
     * throughput mode, a third of the tensor work); 8-bit: BY_SHAPE */
    TCU_GEMV_TENSOR,
    /* by the step: one sequence - STAGED for bf16, BY_SHAPE for 4/8-bit;
     * two or more (tcu_gemv_args.wide) - TENSOR. With tcu_opts.exact:
     * TENSOR for every step, one sequence too (and no ring), so a request's
     * tokens are the same alone and in any batch */
    TCU_GEMV_AUTO,
    TCU_GEMV_N
};
/* "plain", "staged", "by-shape", "tensor", "auto" (or "?") */
const char *tcu_gemv_name(int gemv);

/* The products of a layer, as bits of tcu_opts.early / .ring. */
enum { TCU_PROD_O = 1, TCU_PROD_GU = 2, TCU_PROD_DOWN = 4, TCU_PROD_QKV = 8, TCU_PROD_LM = 16 };
/* tcu_opts.moe bits (cuda_moe.h): the experts' down kernel for short rows
 * requests its weights before the PDL wait / holds 4 rows a warp; the
 * expert kernels' grids are about one wave for a step of one token (few
 * groups), each warp striding over rows; a step of one token with 4-bit
 * experts runs gate/up, down and the sum in one launch (moe.cu); TC: in
 * the throughput mode, steps of TCU_MOE_TC_MIN_T_* tokens or more take the
 * tensor-core grouped GEMM (moe_tc.cu: bf16, MLX 4-bit, MXFP4 experts),
 * TC_ALL: every step does (tests: a token alone through that kernel);
 * TC_PF: its bf16 tiles load the next steps' weights while the current
 * ones' mma run (the default: bf16 T 8-128 1.2-1.3x; the same bits) */
enum {
    TCU_MOE_DOWN_EARLY = 1,
    TCU_MOE_DOWN_ROWS4 = 2,
    TCU_MOE_WAVES = 4,
    TCU_MOE_FUSED = 8,
    TCU_MOE_TC = 16,
    TCU_MOE_TC_ALL = 32,
    TCU_MOE_TC_PF = 64
};

/* The prefill attention kernel (tcu_opts.attn_tiled). */
enum {
    TCU_ATTN_TILED_OFF = 0, /* none: prefill chunks take the per-token kernel (tcu_attention) */
    TCU_ATTN_TILED_F32 = 1, /* f32 CUDA cores */
    TCU_ATTN_TILED_TF32 = 2 /* TF32 tensor cores */
};

/* The CUDA options: filled once when the backend is created (tcu_opts_init,
 * then the backend's overrides - src/model/backend_cuda.c), read-only after,
 * handed to every launcher below (NULL = tcu_opts_init's values). The
 * defaults are the measured best on the H200 (docs/cuda.md); the others are
 * kept for A/B measurements and tests. */
typedef struct tcu_opts {
    /* -- read by the launchers -- */
    int gemv_bf16, gemv_q4, gemv_q8; /* TCU_GEMV_* per weight kind (f32/f16 take gemv_bf16, run PLAIN) */
    /* programmatic dependent launch (Hopper): every launch may start while
     * the one before it ends, each kernel waiting for its inputs on the
     * device (griddepcontrol.wait); 4/8-bit GEMVs request their first
     * weight chunks before that wait, 16-bit ones nothing (their
     * activations' copies queued behind such requests), except
     * tcu_gemv_args.early. 1 on, 0 off */
    int pdl;
    int attn_early;      /* the fused decode attention loads its positions, block table, first K/V rows and
                          * RoPE factors before its wait: 1, or everything after it: 0 */
    int attn_merge_last; /* the attention's last block of a (token, head) merges the splits: 1, or a merge
                          * kernel: 0 */
    int attn_gqa;        /* a typed pool's decode attention: one block a kv head (its q heads share each K/V
                          * row's load and decoding): 1, or one block a q head: 0 */
    int attn_tiled;      /* TCU_ATTN_TILED_*: prefill attention (the backend's cuBLAS-sized steps) */
    /* the products' precision (--exact-products): 1 - f32-exact activations
     * everywhere (the tensor-core GEMV's three bf16 parts, AUTO = TENSOR at
     * every step, cuBLAS never: the backend's gemm_min_t default becomes
     * INT_MAX, and one attention split rule), bit-identical alone and
     * batched; 0 (default) - throughput: the tensor-core GEMV rounds
     * activations once to bf16 (each row still batch-invariant) */
    int exact;
    int moe; /* TCU_MOE_* bits (mixture-of-experts kernels, moe.cu) */
    int q4_tile;  /* tcu_q4_mm's tile configuration: 0 by T (the default), 1-24 one of gemm_q4.cu's (every one
                   * gives the same bits; for measurements and tests) */
    int q4_split; /* tcu_q4_mm's chunks of the inputs: 0 by the launch's shape (the default); 1, 2, 4 or 8 forced
                   * (another order of sums: measurements only) */
    /* -- read by the backend (src/model/backend_cuda.c) -- */
    int gemm_min_t;  /* steps of at least this many tokens take cuBLAS, the rest the GEMVs */
    int tc_max_t;    /* throughput mode: steps of several sequences up to this many tokens (at most 128)
                      * take the GEMVs (the tensor-core kernel for bf16 / 4-bit) whatever gemm_min_t */
    int attn_tiles;  /* throughput mode, steps of several sequences: the tiled decode attention
                      * (tcu_attn_args.tiles) 3 (16-bit pools on the copy-ahead kernel with tensor-core
                      * products, others 1's), 2 (the same kernel with f32 products), 1 (rows decoded
                      * into shared memory), or the per-head / grouped kernels 0 */
    int attn_z;      /* tiles 2, 3: blocks a (kv head, token) walking its splits (0: by the step's size;
                      * n: n, each block taking splits z, z + n, ... - the same sums) */
    int lt;          /* throughput mode: 16-bit weights' products of steps of several sequences and of
                      * cuBLAS-sized steps on cuBLASLt without split-K (batch-invariant): 1, or the
                      * tensor-core GEMV up to tc_max_t and cublasGemmEx above: 0 */
    int q4_tc;       /* throughput mode: 4-bit weights' steps of several sequences up to tc_max_t tokens on the
                      * 4-bit tensor-core GEMM (tcu_q4_mm) - 1, or on the tensor-core GEMV - 0; 2: prefill-sized
                      * steps above tc_max_t too (instead of dequantizing for cuBLASLt) */
    int f8_tc;       /* throughput mode: FP8 weights' steps up to tc_max_t tokens on the FP8 tensor cores with
                      * activations quantized per token and 128 inputs (tcu_f8_mm) - 2: every such step,
                      * 1: but a step of one sequence and token (the exact GEMV), 0: none (the exact GEMV
                      * for one token, several sequences dequantized to bf16 for cuBLASLt) */
    int graphs;      /* decode steps replayed as CUDA graphs: 1, or launched one by one: 0 */
    int qkv_fuse;    /* small steps of distinct sequences: q/k/v post-processing inside the attention */
    int gemv_stage;  /* the tensor-core GEMV gets a scratch to split a step's activations into once */
    int early;       /* TCU_PROD_* bits: products whose one-token launch gets tcu_gemv_args.early */
    int ring;        /* TCU_PROD_* bits: ... tcu_gemv_args.ring */
    int split_len1;  /* attention positions a split for a step of one token (0: always the most splits) */
    int split_len;   /* ... for steps of several sequences (and TCU_INV_ATTN): each token's splits from its
                      * own length */
    /* -- steps of one sequence as batched (issue 27) -- */
    int invariant; /* read by the backend, TCU_INV_* bits: throughput mode, a step of one sequence takes the
                    * batched steps' products (tensor-core GEMV, no ring) and attention splits (per token):
                    * with both, a sequence's logits are the same bits alone and in any batch of up to
                    * tc_max_t tokens */
    /* read by the backend, TCU_CAT_* bits: 16-bit weights' cuBLASLt steps take q/k/v (1) and gate/up (2) as
     * one GEMM each over the rows stored side by side (one allocation a group, made at upload) - fewer,
     * fuller launches; 0: a GEMM a matrix */
    int lt_cat;
    /* read by the backend: cuBLASLt products split over K as its heuristic splits each shape at both 8 and 128
     * tokens (the lesser split), the same split at every T (batch-invariant: a row's K ranges and their order
     * do not depend on T; 8B: down in 2) - 1; 0: never split */
    int lt_splitk;
} tcu_opts;
enum { TCU_INV_PRODUCTS = 1, TCU_INV_ATTN = 2 };
enum { TCU_CAT_QKV = 1, TCU_CAT_GU = 2 };
/* Launches so far of tcu_qkv_post with ld > 0 and of tcu_glu_half with
 * ld > n (the merged products' outputs; graph replays not counted): for
 * tests that want to know the merged path ran. */
int tcu_cat_launches(void);
/* The defaults, measured (docs/cuda.md): GEMVs auto / auto / by-shape, PDL
 * on, the attention's early loads and last-block merge on, TF32 prefill
 * attention, throughput products (exact 0), cuBLAS from 33 tokens but for
 * steps of several sequences up to 128, graphs, q/k/v fusion and the stage on,
 * down early, gate/up and down on the ring, 16 positions a split. */
void tcu_opts_init(tcu_opts *o);
/* o in words (every field) into buf of n bytes, for logs and benchmarks. */
void tcu_opts_format(const tcu_opts *o, char *buf, size_t n);

#define TCU_MM_MAX 4

typedef struct tcu_mat {
    const void *w;   /* dense [n_out][n_in], or packed bytes [n_out][n_in * bits / 8] */
    const float *sb; /* quantized: [n_out][n_in / group][2] {scale, bias}; TCU_F8: [n_out][ceil(n_in / group)][2]
                      * {scale, 0} - group the scales' column block, each row's scale of the block it is in */
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
     * tcu_rmsnorm computes it. The kernels that stage activations in
     * shared memory (all but TCU_GEMV_PLAIN) fuse it; PLAIN runs
     * tcu_rmsnorm into norm_out ([T][n_in]) first. */
    const float *norm_g;
    float *norm_out;
    float norm_eps;
    const int32_t *norm_rows; /* with norm_g, may be set: token t's input is x row norm_rows[t] */
    /* the step carries two or more sequences (TCU_GEMV_AUTO then takes
     * the tensor cores) */
    int wide;
    /* optional device scratch of stage_bytes: the tensor-core GEMV
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
/* o->gemv_* picks the kernel; o->pdl how it is launched. */
int tcu_gemv(const tcu_gemv_args *a, const tcu_opts *o, tcu_stream stream);
/* launches that took the shared-memory ring (tcu_gemv_args.ring), for tests */
int tcu_gemv_ring_count(void);

/* The launchers below that take `o` read only o->pdl unless they say. */

/* Dense copy of a weight for the cuBLAS path: out[n_out][n_in] as bf16
 * (TCU_BF16 out) or f16 (kind TCU_F16 stays f16). Quantized -> bf16. */
int tcu_dequant_bf16(const tcu_mat *m, int n_in, uint16_t *out, const tcu_opts *o, tcu_stream stream);
/* FP8 tensor-core products (gemm_f8.cu). tcu_quant_f8: x [T][n_in] (n_in a
 * multiple of 128; with g, first RMSNormed as tcu_rmsnorm does - token t
 * read from row rows[t] when rows - and the normed rows written to xn) to E4M3 codes x8 [T][n_in] with a scale a token and 128
 * inputs, xs [T][n_in / 128] = max|x| / 448 (1 for a zero block), codes =
 * x / scale rounded to nearest even. tcu_f8_mm: m->y [T][n_out] (=, or +=
 * when accumulate) = x @ W^T for a TCU_F8 matrix whose scale blocks are a
 * multiple of 128 inputs or the whole row: per (row, token) the 128-input
 * blocks' mma sums from zero, each times (weight scale * activation scale),
 * added in an order fixed by the shape (batch-invariant). */
int tcu_quant_f8(const float *x, const int32_t *rows, const float *g, float *xn, float eps, int T, int n_in,
                 uint8_t *x8, float *xs, const tcu_opts *o, tcu_stream stream);
int tcu_f8_mm(const tcu_mat *m, int n_in, const uint8_t *x8, const float *xs, int T, int accumulate,
              const tcu_opts *o, tcu_stream stream);
/* 4-bit tensor-core products (gemm_q4.cu), the throughput mode's batches.
 * tcu_q4_mm_ok: whether they take n_in / group (n_in a multiple of 128,
 * groups of 32, 64 or 128). tcu_q4_prep: x [T][n_in] (with g, first
 * RMSNormed as tcu_quant_f8 does - token t read from row rows[t] when rows
 * - and the normed rows written to xn) rounded to bf16 (nearest even) into
 * xb [T][n_in], each 8 inputs as the pairs (i, i + 4), and xsum [T][n_in /
 * group] = each group's sum of the rounded values (a fixed order).
 * tcu_q4_mm: m[k].y [T][n_out] (=, or += when accumulate) = x @ W_k^T for
 * n TCU_Q4 matrices of one group size in one launch: per (row, token) each
 * group's scale * (mma sum of codes x rounded inputs) + bias * xsum, the
 * groups in an order fixed by the launch's shape (the matrices' rows and
 * n_in), never by T - batch-invariant. glu = 1 (SiLU) or 2 (GELU-tanh):
 * n = 2 (gate, up; one n_out), m[0].y = act(gate) * up as tcu_glu computes
 * it, m[1].y unused (accumulate 0). Reads o->q4_tile, o->q4_split and
 * o->pdl. */
int tcu_q4_mm_ok(int n_in, int group);
int tcu_q4_prep(const float *x, const int32_t *rows, const float *g, float *xn, float eps, int T, int n_in, int group,
                uint16_t *xb, float *xsum, const tcu_opts *o, tcu_stream stream);
int tcu_q4_mm(int n, const tcu_mat *m, int n_in, const uint16_t *xb, const float *xsum, int T, int accumulate,
              int glu, const tcu_opts *o, tcu_stream stream);
/* x[n] f32 -> out[n] bf16 (to_f16 = 0) or f16 (to_f16 = 1), round to nearest. */
int tcu_f32_to_half(const float *x, uint16_t *out, long n, int to_f16, const tcu_opts *o, tcu_stream stream);

/* Row-gathered embedding: x[i] = scale * row tokens[i] of w (scale 0 = 1). */
int tcu_embed(const tcu_mat *w, int n_in, const int32_t *tokens, int T, float scale, float *x, const tcu_opts *o,
              tcu_stream stream);

/* RMSNorm of rows: out[j] (= or += when add) x[rows ? rows[j] : j] * r * g,
 * r = 1 / sqrt(mean(x^2) + eps), for j < n_rows rows of length n. */
int tcu_rmsnorm(const float *x, const int32_t *rows, const float *g, float *out, int n_rows, int n, float eps,
                int add, const tcu_opts *o, tcu_stream stream);

/* tcu_rmsnorm (add 0) into out, also writing each value rounded to bf16
 * (f16 when to_f16) into outh [n_rows][n]. */
int tcu_rmsnorm_half(const float *x, const int32_t *rows, const float *g, float *out, uint16_t *outh, int n_rows,
                     int n, float eps, int to_f16, const tcu_opts *o, tcu_stream stream);

/* act (= gate) = silu(gate) * up, or gelu_tanh when gelu. */
int tcu_glu(float *gate, const float *up, long n, int gelu, const tcu_opts *o, tcu_stream stream);
/* act[t][e] = silu(gate[t][e]) * up[t][e] (gelu_tanh when gelu) for t <
 * n_rows, e < n, written as f32 into act ([n_rows][n]) and rounded to bf16
 * (f16 when to_f16) into outh ([n_rows][n]): tcu_glu's arithmetic. gate
 * and up rows are ld floats apart (ld >= n): gate = up = a product's
 * [n_rows][n] outputs (ld n; act may be gate), or gate = gu, up = gu + n,
 * ld 2 n for gate and up as one product's [n_rows][2 n] rows (act then
 * another buffer, or NULL: the 16-bit copy alone). */
int tcu_glu_half(float *act, const float *gate, const float *up, long ld, uint16_t *outh, int n_rows, int n, int gelu,
                 int to_f16, const tcu_opts *o, tcu_stream stream);
/* x[t][e] += b[e] for t < n_rows, e < n (a bias on the rows of a product
 * that accumulated into x). */
int tcu_add_bias(float *x, const float *b, int n_rows, int n, const tcu_opts *o, tcu_stream stream);
/* x = c * tanh(x / c). */
int tcu_softcap(float *x, long n, float c, const tcu_opts *o, tcu_stream stream);

/* KV storage types of the device pool: the values of kv.h's kv_type, the
 * same bytes as the CPU's codecs (src/model/kv_codec.c): bf16, IEEE f16,
 * q8 (per group of `group` along a head: f16 scale, f16 min, one byte a
 * code), q4 (f16 scale, f16 min, byte j holding codes j and j + group/2
 * in its low and high nibble), r4 (the head rotated - tcu_kv.rot - then
 * an f16 scale and q4's nibbles, x = scale * (c - 7.5)) and r3 (rotated,
 * an f16 scale, group/4 bytes of 2-bit low parts and group/8 bytes of high
 * bits, x = scale * (c - 3.5)). */
enum { TCU_KV_F32 = 0, TCU_KV_BF16 = 1, TCU_KV_F16 = 2, TCU_KV_Q8 = 3, TCU_KV_Q4 = 4, TCU_KV_R4 = 5, TCU_KV_R3 = 6, TCU_KV_F8 = 7 };
/* The longest head a typed pool takes (the attention's bound too). */
#define TCU_KV_HEAD_MAX 256

/* The paged KV pool on the device, the host pool's layout. A token's block
 * table is blk + bt_off[i] (block ids of its sequence).
 *  - typed 0 (every layer f32, no sink blocks): k, v [n_layer][n_blocks]
 *    [block_size][kv_dim] f32; kernels add the launch's layer.
 *  - typed 1: one layer, already chosen (the launch's layer is not used):
 *    lk, lv its K and V bytes, [n_sink][block_size][sink_row] (block ids
 *    below n_sink, type sink_type) then [n_blocks - n_sink][block_size][row]
 *    (type `type`); a row is n_kv_head heads of hb (sink_hb) bytes each;
 *    `group` the quantized type's group. The KV writes encode on the
 *    device, bit for bit as kv_head_encode does. */
typedef struct tcu_kv {
    float *k, *v;
    int n_blocks, block_size, kv_dim;
    int typed;
    uint8_t *lk, *lv;
    int type, sink_type, n_sink, row, sink_row, hb, sink_hb, group;
    /* the layer stores every head (sink rows too) rotated by kv.h's
     * kv_rotate: the KV write rotates K and V before encoding them, and the
     * caller rotates q before the attention and the output back after it
     * (tcu_kv_rotate) - q.k and p.v are exact in the rotated basis */
    int rot;
} tcu_kv;

/* Copies block src to block dst in one typed layer of the pool (K and V),
 * re-encoding each head when their formats differ (a sink block and a
 * regular one: decoded, then encoded as kv_head_encode would); hd the head
 * dim. Same formats: a device copy. */
int tcu_kv_block_copy(const tcu_kv *kv, int hd, int32_t dst, int32_t src, tcu_stream stream);
/* n heads of hd floats at x (consecutive) rotated in place as kv_rotate
 * does (inverse 1: kv_unrotate), bit for bit. hd <= TCU_KV_HEAD_MAX. */
int tcu_kv_rotate(float *x, long n, int hd, int inverse, const tcu_opts *o, tcu_stream stream);

/* After the q/k/v product of one layer, per token i: optional biases, per-
 * head RMSNorm (qn/kn, may be NULL), RoPE at pos[i] with inv_freq (rotate-
 * half pairs), then K and V of the token written to the cache. q is
 * [T][n_head*hd] (rotated in place), k/v [T][n_kv*hd]; with ld > 0, token
 * i's q, k and v rows start ld floats after token i - 1's (q, k, v the
 * column offsets of one product's [T][ld] outputs, q + k + v rows side by
 * side: ld = (n_head + 2 n_kv) hd) and the rotated q goes to q_out
 * ([T][n_head*hd], contiguous, as the attention reads it). ld 0: q_out
 * unused. tcu_qkv_attention takes ld 0 only. */
typedef struct tcu_qkv_args {
    float *q, *k, *v;
    const float *bq, *bk, *bv, *qn, *kn, *inv_freq;
    const int32_t *pos, *bt_off, *blk;
    tcu_kv kv;
    int layer, T, n_head, n_kv_head, hd;
    float eps;
    /* RoPE's cos and sin are scaled by it (YaRN's attention factor, as the
     * CPU's rope does); 0 - what a caller that leaves it out passes - reads
     * as 1, no factor */
    float rope_af;
    int ld;       /* row stride of q, k and v (0: n_head*hd for q, n_kv*hd for k and v, q rotated in place) */
    float *q_out; /* ld > 0: where the rotated q goes, [T][n_head*hd] */
} tcu_qkv_args;
int tcu_qkv_post(const tcu_qkv_args *a, const tcu_opts *o, tcu_stream stream);

/* Paged attention (flash-decoding): each (token, head) splits its positions
 * max(0, pos - window + 1) .. pos (len of them) over n_split blocks, or
 * with split_len > 0 over min(n_split, len / split_len + 1) - its own length
 * alone decides, whatever the other tokens of the launch (many short splits
 * are fastest for one token, few for many) - each with an online
 * softmax; the last block of a (token, head) to finish merges the parts
 * (arrival counters per stream; a second kernel merges them where no
 * counter slot is free). part is scratch of
 * T * n_head * n_split * (hd + 2) floats. hd a multiple of 32, <= 256.
 * Reads o->attn_merge_last (and o->attn_early when fused, below). */
typedef struct tcu_attn_args {
    const float *q;
    float *out, *part;
    const int32_t *pos, *bt_off, *blk;
    tcu_kv kv;
    int layer, T, n_head, n_kv_head, hd, window, n_split;
    float scale, softcap;
    int split_len;
    /* a step of several sequences - one block per (kv head, token,
     * split) over tiles of positions (head dims 64 and 128; else as 0):
     * 1 rows decoded into shared memory, 2 a 16-bit pool's rows copied as
     * stored ahead of their use (other pools as 1), 3 as 2 with the two
     * products on tensor cores (q and p as two 16-bit parts each) */
    int tiles;
    /* [n_head] learned sink logits (gpt_oss) or NULL: sink h joins each of
     * head h's softmax denominators once, its probability dropped -
     * out = sum_j e^(s_j - M) v_j / (sum_j e^(s_j - M) + e^(sink - M)),
     * M = max(max_j s_j, sink); added where the splits are merged (and at
     * the end of the prefill tiles), after every position is folded in */
    const float *sinks;
    /* or NULL: the output rounded to bf16 (out_h_f16: f16) here too, the
     * next product's inputs (decode kernels only, not tcu_attention_tiled) */
    uint16_t *out_h;
    int out_h_f16;
} tcu_attn_args;
int tcu_attention(const tcu_attn_args *a, const tcu_opts *o, tcu_stream stream);
/* tcu_qkv_post and tcu_attention in one launch (a.q: post's unrotated q,
 * left as it is), for steps whose tokens are each of another sequence: no
 * token reads the K/V that another token of the step writes. The same
 * values as the two launches. */
int tcu_qkv_attention(const tcu_qkv_args *post, const tcu_attn_args *a, const tcu_opts *o, tcu_stream stream);
/* The stream is about to be destroyed: its counter slot (tcu_attention's
 * merge, left at zero after every launch) goes back to the pool. */
void tcu_stream_forget(tcu_stream stream);

/* The same attention for prefill chunks, tiled: tiles[2 j], tiles[2 j + 1]
 * = first token and count (<= TCU_ATTN_TILE_Q) of tile j, tokens of one
 * sequence at consecutive positions; each block keeps one tile's queries of
 * one head in shared memory and streams the keys through it (a K/V row is
 * read once per tile, not once per token). Two kernels: tensor cores
 * (mma.sync TF32: Q, K, V and P rounded to TF32, f32 accumulation - the
 * default) or f32 CUDA cores; both sum in another order than tcu_attention,
 * so they are used only where products are not batch-invariant anyway (the
 * cuBLAS path). hd 64, 128 or 256; -1 (nothing queued) for other head dims
 * and for o->attn_tiled TCU_ATTN_TILED_OFF. part is unused. o->attn_tiled
 * picks the kernel. */
#define TCU_ATTN_TILE_Q 64
int tcu_attention_tiled(const tcu_attn_args *a, const int32_t *tiles, int n_tiles, const tcu_opts *o,
                        tcu_stream stream);

/* Device-to-device copy bandwidth (bytes read + written per second) over a
 * buffer of `bytes`, best of reps; 0 on failure. Synchronizes. */
double tcu_copy_bandwidth(size_t bytes, int reps);

/* Per-launch profile for benchmarks: between tcu_prof_start and
 * tcu_prof_stop every launcher above brackets its launches with events
 * (eager streams only, not graph captures); stop synchronizes and returns
 * milliseconds and launch counts per category. Not thread-safe. */
enum {
    TCU_PROF_GEMV, TCU_PROF_ATTN, TCU_PROF_QKV, TCU_PROF_NORM, TCU_PROF_EMBED, TCU_PROF_OTHER,
    TCU_PROF_MOE_GATE, /* a sparse layer's norm, router and routing (cuda_moe.h) */
    TCU_PROF_MOE_GU,   /* its experts' gate/up products */
    TCU_PROF_MOE_DOWN, /* their down products and the weighted sum */
    TCU_PROF_N
};
void tcu_prof_start(void);
int tcu_prof_stop(double ms[TCU_PROF_N], int count[TCU_PROF_N]);

/* Benchmark data: n elements at p of kind `what` - TCU_BF16 or TCU_F32
 * uniform in [-scale, scale], anything else random bytes - from a hash of
 * (seed, index). Launched without PDL. */
int tcu_fill_random(void *p, size_t n, int what, uint64_t seed, float scale, tcu_stream stream);

#ifdef __cplusplus
}
#endif

#endif
