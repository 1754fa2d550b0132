/* bf16 weights times bf16 activations on AMX tiles (kernels.h,
 * tern_bf16_pack_fn / matmul_bf16p): TDPBF16PS multiplies a 16 x 32 bf16
 * tile of weights (16 rows, 32 inputs: read in place, the rows n_in apart)
 * by a 32 x 16 tile of inputs (16 tokens, packed as the instruction wants
 * them: pairs of inputs side by side, bf16_pack) into 16 x 16 f32 sums -
 * 8192 multiply-adds an instruction. Only called where tern_cpu() reports
 * amx_bf16 (the CPU has it and Linux granted the tile state). */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"

/* ldtilecfg's 64-byte block, palette 1: every tile 16 rows x 64 bytes
 * (A: 16 weight rows x 32 bf16; B: 16 input pairs x 16 tokens; C: 16 rows x
 * 16 f32). */
typedef struct tile_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

static void tiles_config(void)
{
    tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    _tile_loadconfig(&c);
}

void tern_bf16_pack_amx(const uint16_t *Xb, long T, long n_in, uint16_t *Xp)
{
    const uint32_t *x = (const uint32_t *)Xb; /* a pair of inputs as one 32-bit unit */
    uint32_t *p = (uint32_t *)Xp;
    long np = n_in / 2;
    for (long b = 0; b * 16 < T; b++) {
        uint32_t *dst = p + b * 16 * np;
        long nt = T - b * 16 < 16 ? T - b * 16 : 16;
        for (long n = 0; n < nt; n++) {
            const uint32_t *src = x + (b * 16 + n) * np;
            for (long q = 0; q < np; q++)
                dst[q * 16 + n] = src[q];
        }
        for (long n = nt; n < 16; n++)
            for (long q = 0; q < np; q++)
                dst[q * 16 + n] = 0;
    }
}

/* C tile [16 rows][16 tokens] into Y for the rows r .. r + nr and tokens
 * t .. t + nt. */
static void put(const float *c, float *Y, long ldy, long r, long nr, long t, long nt)
{
    for (long n = 0; n < nt; n++)
        for (long m = 0; m < nr; m++)
            Y[(t + n) * ldy + r + m] = c[m * 16 + n];
}

/* 32 weight rows (W, rows n_in apart) x 16 or 32 tokens (packed blocks at
 * B0, B1; B1 NULL: one block): every (row, token) sum is the chain of
 * TDPBF16PS over k = 0, 32, .. from zero - the same whatever the tile. */
static void block32(const uint16_t *W, long n_in, const uint16_t *B0, const uint16_t *B1, float *c)
{
    long sw = n_in * 2;
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    if (B1) {
        for (long k = 0; k < n_in; k += 32) {
            _tile_loadd(0, W + k, sw);
            _tile_loadd(1, W + 16 * n_in + k, sw);
            _tile_loadd(2, B0 + k * 16, 64);
            _tile_loadd(3, B1 + k * 16, 64);
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(5, 0, 3);
            _tile_dpbf16ps(6, 1, 2);
            _tile_dpbf16ps(7, 1, 3);
        }
    } else {
        for (long k = 0; k < n_in; k += 32) {
            _tile_loadd(0, W + k, sw);
            _tile_loadd(1, W + 16 * n_in + k, sw);
            _tile_loadd(2, B0 + k * 16, 64);
            _tile_dpbf16ps(4, 0, 2);
            _tile_dpbf16ps(6, 1, 2);
        }
    }
    _tile_stored(4, c, 64);
    _tile_stored(5, c + 256, 64);
    _tile_stored(6, c + 512, 64);
    _tile_stored(7, c + 768, 64);
}

/* Rows r0 .. r1 of W times the packed inputs Xp (T tokens from a block
 * boundary) into Y[t * ldy + r]. n_in a multiple of 32 (the table's users
 * check tern_bf16p_ok). Token tiles of 128 (256 KB of inputs at n_in 1024,
 * in L2 with the 32 weight rows), rows in blocks of 32; a last block of
 * fewer rows goes through a zero-padded copy, so that every row's sums come
 * from the same instructions. */
void tern_bf16dot_amx(const void *Wv, const uint16_t *Xp, float *Y, long T, long n_in, long ldy, long r0, long r1)
{
    const uint16_t *W = Wv;
    float c[1024] __attribute__((aligned(64)));
    uint16_t *pad = NULL;
    long nb = (T + 15) / 16;
    tiles_config();
    for (long tb0 = 0; tb0 < nb; tb0 += 8) {
        long tb1 = tb0 + 8 < nb ? tb0 + 8 : nb;
        for (long r = r0; r < r1; r += 32) {
            long nr = r1 - r < 32 ? r1 - r : 32;
            const uint16_t *w = W + r * n_in;
            if (nr < 32) {
                if (!pad && !(pad = aligned_alloc(64, (size_t)32 * n_in * sizeof *pad)))
                    abort();
                memcpy(pad, w, (size_t)nr * n_in * sizeof *pad);
                memset(pad + nr * n_in, 0, (size_t)(32 - nr) * n_in * sizeof *pad);
                w = pad;
            }
            for (long b = tb0; b < tb1; b += 2) {
                const uint16_t *B0 = Xp + b * 16 * n_in, *B1 = b + 1 < tb1 ? B0 + 16 * n_in : NULL;
                block32(w, n_in, B0, B1, c);
                long t = b * 16, nt0 = T - t < 16 ? T - t : 16;
                put(c, Y, ldy, r, nr < 16 ? nr : 16, t, nt0);
                if (nr > 16)
                    put(c + 512, Y, ldy, r + 16, nr - 16, t, nt0);
                if (B1) {
                    long nt1 = T - t - 16 < 16 ? T - t - 16 : 16;
                    put(c + 256, Y, ldy, r, nr < 16 ? nr : 16, t + 16, nt1);
                    if (nr > 16)
                        put(c + 768, Y, ldy, r + 16, nr - 16, t + 16, nt1);
                }
            }
        }
    }
    _tile_release();
    free(pad);
}
