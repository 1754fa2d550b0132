/* Integer products for MLX affine weights on AMX-INT8 tiles (kernels.h,
 * tern_i8_pack_fn / imatmul_q4p, imatmul_q8p): TDPBUSD multiplies a 16 x K
 * tile of unsigned weight values (16 rows, K inputs) by a K x 16 tile of
 * the int8 activations (16 tokens, packed by i8_pack) into 16 x 16 exact
 * int32 sums. One sum tile per activation block (kernels.h's B) gives its
 * I_b (two blocks in flight, in sum tiles 2 and 5): 4-bit groups of 64 and
 * 128 in steps of K = 64 (16384 multiply-adds an instruction), 8-bit blocks
 * of 32 in one step of K = 32 (a 16 x 32 weight tile, an 8-row activation
 * tile). The sums are exact, so the f32
 * combination that follows (kernels.h's order, 16 tokens a vector) gives
 * the scalar reference's bits (tern_iqp_ok says which weights). Only
 * called where tern_cpu() reports amx_int8. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"

typedef struct tile_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_cfg;

/* Tiles 0 and 3 (weights: 16 rows x K bytes), 1 and 4 (activations: K / 4
 * rows x 64 bytes), 2 and 5 (sums: 16 rows x 64 bytes), for steps of K
 * inputs: two activation blocks in flight. */
static void tiles_config(int K)
{
    tile_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 6; i++) {
        c.colsb[i] = 64;
        c.rows[i] = 16;
    }
    c.colsb[0] = c.colsb[3] = (uint16_t)K;
    c.rows[1] = c.rows[4] = (uint8_t)(K / 4);
    _tile_loadconfig(&c);
}

void tern_i8_pack_amx(const int8_t *Q, const float *qs, long T, long n_in, long ngp, int8_t *Qp, float *qsp, long p0,
                      long p1)
{
    for (long b = 0; b * 16 < T; b++) {
        long nt = T - b * 16 < 16 ? T - b * 16 : 16;
        uint32_t *dst = (uint32_t *)(Qp + b * 16 * n_in);
        const int8_t *src = Q + b * 16 * n_in;
        for (long p = p0; p < p1; p++) /* a 64-byte line of 16 tokens' 4-byte words, written once */
            for (long n = 0; n < 16; n++) {
                uint32_t v = 0; /* 4 activations as one 32-bit unit; past the tokens, zeros */
                if (n < nt)
                    memcpy(&v, src + n * n_in + 4 * p, 4);
                dst[p * 16 + n] = v;
            }
        if (p0)
            continue;
        float *ds = qsp + b * 16 * 2 * ngp;
        for (long n = 0; n < 16; n++)
            for (long g = 0; g < 2 * ngp; g++)
                ds[g * 16 + n] = n < nt ? qs[(b * 16 + n) * 2 * ngp + g] : 0.0f;
    }
}

/* nr rows of 4-bit values (n_in / 2 bytes each) as bytes, in the
 * activations' nibble order (each 32 inputs: the 16 low nibbles, then the 16
 * high ones); rows nr .. 15 zero. */
static void unpack_q4(const uint8_t *w, long n_in, long nr, uint8_t *u)
{
    const __m256i lo = _mm256_set1_epi8(15);
    for (long m = 0; m < nr; m++)
        for (long i = 0; i < n_in; i += 32) {
            __m128i v = _mm_loadu_si128((const __m128i *)(w + m * n_in / 2 + i / 2));
            __m256i x = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
            _mm256_storeu_si256((__m256i *)(u + m * n_in + i), _mm256_and_si256(x, lo));
        }
    memset(u + nr * n_in, 0, (size_t)(16 - nr) * n_in);
}

/* The 16 tokens of one block for rows r .. r + nr: I[g][m][n] from the
 * tiles (nb activation blocks, rep a weight group, nw groups a row), then
 * the contract's f32 combination, 16 tokens a vector: per row eight
 * accumulators, block g going to slot g & 7 in g order, summed in a fixed
 * tree. The slots run one at a time with all 16 rows' accumulators in
 * registers, so a block's d and A are loaded once for the rows (measured
 * on the Xeon with the two blocks in flight below: 8-bit prefill 512
 * 687-701 -> 807-895 t/s, 4-bit 1091-1097 -> 1130-1209). */
static void combine(const int32_t *I, const float *sb, const float *qsb, long nw, long rep, long nb, long ngp,
                     float *Y, long ldy, long r, long nr, long t, long nt)
{
    int sh = rep == 4 ? 2 : rep == 2 ? 1 : 0;
    float part[16][8][16] __attribute__((aligned(64)));
    const float *s[16];
    for (int m = 0; m < 16; m++) /* rows past nr read row r's pairs; their sums are never written */
        s[m] = sb + (r + (m < nr ? m : 0)) * nw * 2;
    for (int k = 0; k < 8; k++) {
        __m512 acc[16];
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++)
            acc[m] = _mm512_setzero_ps();
        for (long g = k; g < ngp; g += 8) {
            __m512 d = _mm512_loadu_ps(qsb + g * 16), A = _mm512_loadu_ps(qsb + (ngp + g) * 16);
            if (g < nb) {
#pragma GCC unroll 16
                for (int m = 0; m < 16; m++) {
                    __m512 If = _mm512_cvtepi32_ps(_mm512_load_si512((const void *)(I + (g * 16 + m) * 16)));
                    __m512 sw = _mm512_set1_ps(s[m][2 * (g >> sh)]), bw = _mm512_set1_ps(s[m][2 * (g >> sh) + 1]);
                    acc[m] = _mm512_fmadd_ps(_mm512_fmadd_ps(sw, If, _mm512_mul_ps(bw, A)), d, acc[m]);
                }
            } else { /* padding: combine's zeros, the same operations */
                __m512 z = _mm512_setzero_ps(), u = _mm512_fmadd_ps(z, z, _mm512_mul_ps(z, A));
#pragma GCC unroll 16
                for (int m = 0; m < 16; m++)
                    acc[m] = _mm512_fmadd_ps(u, d, acc[m]);
            }
        }
#pragma GCC unroll 16
        for (int m = 0; m < 16; m++)
            _mm512_store_ps(part[m][k], acc[m]);
    }
    for (long m = 0; m < nr; m++) {
        __m512 a[8];
        for (int k = 0; k < 8; k++)
            a[k] = _mm512_load_ps(part[m][k]);
        __m512 y = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                 _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
        float out[16] __attribute__((aligned(64)));
        _mm512_store_ps(out, y);
        for (long n = 0; n < nt; n++)
            Y[(t + n) * ldy + r + m] = out[n];
    }
}

static void iq_amx(int bits, const uint8_t *Wq, const float *sb, int group, const int8_t *Qp, const float *qsp,
                   float *Y, long T, long n_in, long ldy, long r0, long r1)
{
    /* ng: activation blocks of ab inputs (kernels.h's B), K inputs a tile step */
    int ab = tern_iq_ablock(group, bits), K = ab < 64 ? ab : 64;
    long nw = n_in / group, ng = n_in / ab, ngp = tern_iq_ngp(ng), nb = (T + 15) / 16, steps = ab / K;
    uint8_t *u = aligned_alloc(64, (size_t)16 * n_in);
    int32_t *I = aligned_alloc(64, (size_t)ng * 256 * sizeof *I);
    if (!u || !I)
        abort();
    tiles_config(K);
    for (long tb0 = 0; tb0 < nb; tb0 += 8) {
        long tb1 = tb0 + 8 < nb ? tb0 + 8 : nb;
        for (long r = r0; r < r1; r += 16) {
            long nr = r1 - r < 16 ? r1 - r : 16;
            const uint8_t *a = u;
            if (bits == 4) {
                unpack_q4(Wq + r * n_in / 2, n_in, nr, u);
            } else if (nr == 16) {
                a = Wq + r * n_in; /* 8-bit rows are the tile's rows as stored */
            } else {
                memcpy(u, Wq + r * n_in, (size_t)nr * n_in);
                memset(u + nr * n_in, 0, (size_t)(16 - nr) * n_in);
            }
            for (long b = tb0; b < tb1; b++) {
                const int8_t *B = Qp + b * 16 * n_in;
                long g = 0;
                for (; g + 2 <= ng; g += 2) { /* two blocks in flight (tiles 2 and 5) */
                    _tile_zero(2);
                    _tile_zero(5);
                    for (long st = 0; st < steps; st++) {
                        long k = g * ab + st * K;
                        _tile_loadd(0, a + k, n_in);
                        _tile_loadd(1, B + k * 16, 64);
                        _tile_loadd(3, a + k + ab, n_in);
                        _tile_loadd(4, B + (k + ab) * 16, 64);
                        _tile_dpbusd(2, 0, 1);
                        _tile_dpbusd(5, 3, 4);
                    }
                    _tile_stored(2, I + g * 256, 64);
                    _tile_stored(5, I + (g + 1) * 256, 64);
                }
                for (; g < ng; g++) {
                    _tile_zero(2);
                    for (long st = 0; st < steps; st++) {
                        long k = g * ab + st * K;
                        _tile_loadd(0, a + k, n_in);
                        _tile_loadd(1, B + k * 16, 64);
                        _tile_dpbusd(2, 0, 1);
                    }
                    _tile_stored(2, I + g * 256, 64);
                }
                long t = b * 16;
                combine(I, sb, qsp + t * 2 * ngp, nw, group / ab, ng, ngp, Y, ldy, r, nr, t, T - t < 16 ? T - t : 16);
            }
        }
    }
    _tile_release();
    free(u);
    free(I);
}

void tern_iq_amx_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Qp, const float *qsp, float *Y,
                    long T, long n_in, long ldy, long r0, long r1)
{
    iq_amx(4, Wq, sb, group, Qp, qsp, Y, T, n_in, ldy, r0, r1);
}

void tern_iq_amx_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Qp, const float *qsp, float *Y,
                    long T, long n_in, long ldy, long r0, long r1)
{
    iq_amx(8, Wq, sb, group, Qp, qsp, Y, T, n_in, ldy, r0, r1);
}
