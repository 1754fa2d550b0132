/* bf16 weights times bf16 activations on AMX tiles (kernels.h,
 * matmul_bf16t): TDPBF16PS multiplies a tile of tokens (A: up to 16 tokens
 * x 32 inputs, read in place from the bf16 inputs, n_in apart) by a tile of
 * weights (B: 32 inputs x 16 rows, one 1 KB line of the weight's tile
 * layout, tern_bf16_tiles_make) into tokens x 16 rows of f32 sums - up to
 * 8192 multiply-adds an instruction. Every (token, row) sum is the chain of
 * TDPBF16PS over inputs 0, 32, .. from zero whatever the tile shape, the
 * token count or the row range (the element's result depends only on its
 * own A row, B column and C element), so a token's bits never depend on
 * the batch. One token reads a weight line in one 1 KB stream, as fast as
 * the vector kernel (measured: 90 GB/s on 16 Xeon threads either way).
 * Only called where tern_cpu() reports amx_bf16 (the OS granted the tile
 * state). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"

/* ldtilecfg's 64-byte block, palette 1. */
typedef struct tile_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

/* Tiles 0 and 1: tokens (nt rows of 32 bf16); 2 and 3: weights (16 input
 * pairs x 16 rows); 4-7: sums (nt tokens x 16 rows of f32). */
static void tiles_config(int nt)
{
    tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.colsb[i] = 64;
        c.rows[i] = (uint8_t)(i == 2 || i == 3 ? 16 : nt);
    }
    _tile_loadconfig(&c);
}

/* Where a sum tile goes: tokens t .. t + nt, rows [r0, r1) of Y. */
typedef struct out_t {
    float *Y;
    long ldy, r0, r1;
    float *buf; /* 16 x 16 f32, 64-byte aligned: a block cut by r0 or r1 */
} out_t;

/* The part of block b's sums (in o->buf, nt x 16) inside [r0, r1). */
static void put_part(const out_t *o, long t, long nt, long b)
{
    long lo = b * 16 > o->r0 ? b * 16 : o->r0, hi = b * 16 + 16 < o->r1 ? b * 16 + 16 : o->r1;
    for (long n = 0; n < nt; n++)
        memcpy(o->Y + (t + n) * o->ldy + lo, o->buf + n * 16 + (lo - b * 16), (size_t)(hi - lo) * sizeof(float));
}

/* Sum tile TC (tokens t .. t + nt) of row block B into Y. */
#define STORE(TC, t, nt, B)                                                                                            \
    do {                                                                                                               \
        long r_ = (B) * 16;                                                                                            \
        if (r_ >= o->r0 && r_ + 16 <= o->r1) {                                                                         \
            _tile_stored(TC, o->Y + (t) * o->ldy + r_, o->ldy * (long)sizeof(float));                                  \
        } else {                                                                                                       \
            _tile_stored(TC, o->buf, 64);                                                                              \
            put_part(o, t, nt, B);                                                                                     \
        }                                                                                                              \
    } while (0)

/* The four sum tiles from zero. */
static inline void zero_sums(void)
{
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
}

/* One token tile (x: its first token, nt configured) x row blocks b .. b + 3. */
static void t1r4(const uint16_t *Wt, long n_in, const uint16_t *x, long t, long nt, long b, const out_t *o)
{
    long bs = 16 * n_in; /* a block's elements */
    const uint16_t *w = Wt + b * bs;
    zero_sums();
    for (long k = 0; k < n_in; k += 32) {
        _tile_loadd(0, x + k, n_in * 2);
        _tile_loadd(2, w + k * 16, 64);
        _tile_dpbf16ps(4, 0, 2);
        _tile_loadd(3, w + bs + k * 16, 64);
        _tile_dpbf16ps(5, 0, 3);
        _tile_loadd(2, w + 2 * bs + k * 16, 64);
        _tile_dpbf16ps(6, 0, 2);
        _tile_loadd(3, w + 3 * bs + k * 16, 64);
        _tile_dpbf16ps(7, 0, 3);
    }
    STORE(4, t, nt, b);
    STORE(5, t, nt, b + 1);
    STORE(6, t, nt, b + 2);
    STORE(7, t, nt, b + 3);
}

/* One token tile x row block b. */
static void t1r1(const uint16_t *Wt, long n_in, const uint16_t *x, long t, long nt, long b, const out_t *o)
{
    const uint16_t *w = Wt + b * 16 * n_in;
    _tile_zero(4);
    for (long k = 0; k < n_in; k += 32) {
        _tile_loadd(0, x + k, n_in * 2);
        _tile_loadd(2, w + k * 16, 64);
        _tile_dpbf16ps(4, 0, 2);
    }
    STORE(4, t, nt, b);
}

/* Two full token tiles (tokens t .. t + 32) x row blocks b, b + 1. */
static void t2r2(const uint16_t *Wt, long n_in, const uint16_t *x, long t, long b, const out_t *o)
{
    long bs = 16 * n_in;
    const uint16_t *w = Wt + b * bs;
    zero_sums();
    for (long k = 0; k < n_in; k += 32) {
        _tile_loadd(0, x + k, n_in * 2);
        _tile_loadd(1, x + 16 * n_in + k, n_in * 2);
        _tile_loadd(2, w + k * 16, 64);
        _tile_loadd(3, w + bs + k * 16, 64);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(5, 0, 3);
        _tile_dpbf16ps(6, 1, 2);
        _tile_dpbf16ps(7, 1, 3);
    }
    STORE(4, t, 16, b);
    STORE(5, t, 16, b + 1);
    STORE(6, t + 16, 16, b);
    STORE(7, t + 16, 16, b + 1);
}

/* One token tile (tokens t .. t + nt, the tiles configured for nt) against
 * row blocks [b0, b1), four at a time: the tile's inputs are loaded once
 * per four weight lines. */
static void one_tile(const uint16_t *Wt, long n_in, const uint16_t *Xb, long t, long nt, long b0, long b1,
                     const out_t *o)
{
    long b = b0;
    for (; b + 4 <= b1; b += 4)
        t1r4(Wt, n_in, Xb + t * n_in, t, nt, b, o);
    for (; b < b1; b++)
        t1r1(Wt, n_in, Xb + t * n_in, t, nt, b, o);
}

/* Rows [r0, r1) of the weight (tiles Wtv) times the T bf16 inputs Xb into
 * Y[t * ldy + r]. n_in a multiple of 32 (tern_bf16t_ok). Full token tiles
 * go in groups of ~1 MB of inputs (in L2), each group against two row
 * blocks at a time (32 tokens x 32 rows a step, the two blocks' weight
 * lines reused by the group's tiles); a last odd tile and the last partial
 * one (fewer than 16 tokens, the whole product when T < 16) against four
 * row blocks at a time. A block cut by r0 or r1 is computed whole and only
 * its rows in range are written. */
void tern_bf16dot_amx(const void *Wtv, const uint16_t *Xb, float *Y, long T, long n_in, long ldy, long r0, long r1)
{
    const uint16_t *Wt = Wtv;
    float buf[256] __attribute__((aligned(64)));
    out_t o = {Y, ldy, r0, r1, buf};
    long b0 = r0 / 16, b1 = (r1 + 15) / 16, tf = T / 16 * 16; /* tokens in full tiles */
    long tg = ((1L << 20) / (n_in * 2)) & ~31L;
    if (tg < 32)
        tg = 32;
    if (tf) {
        tiles_config(16);
        for (long t0 = 0; t0 < tf; t0 += tg) {
            long t1 = t0 + tg < tf ? t0 + tg : tf, tp = t0 + (t1 - t0) / 32 * 32; /* [t0, tp): tile pairs */
            if (tp > t0) {
                long b = b0;
                for (; b + 2 <= b1; b += 2)
                    for (long t = t0; t < tp; t += 32)
                        t2r2(Wt, n_in, Xb + t * n_in, t, b, &o);
                for (; b < b1; b++)
                    for (long t = t0; t < tp; t += 16)
                        t1r1(Wt, n_in, Xb + t * n_in, t, 16, b, &o);
            }
            if (tp < t1)
                one_tile(Wt, n_in, Xb, tp, 16, b0, b1, &o);
        }
    }
    if (T > tf) {
        tiles_config((int)(T - tf));
        one_tile(Wt, n_in, Xb, tf, T - tf, b0, b1, &o);
    }
    _tile_release();
}
