/* Chooses the kernel table for this CPU once (see kernels.h). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/log.h"
#include "tensor/kernels.h"
#include "tensor/cpu/intdot.h"

const tern_kernels *tern_kernels_avx2_table(void);
#ifndef TERN_NO_AVX512
const tern_kernels *tern_kernels_avx512_table(void);
#endif

const tern_kernels *tern_kernels_avx2(void)
{
    const tern_cpu_features *f = tern_cpu();
    return f->avx2 && f->fma && f->f16c ? tern_kernels_avx2_table() : NULL;
}

#ifndef TERN_NO_AVX512
/* AVX-512 without VNNI: the AVX2 integer products (same bits, see kernels.h);
 * without BF16: no bf16-activation product (f32 activations stay). Where
 * AVX-512 runs as two 256-bit halves (Zen 4), the one-token integer products
 * (decode) go a row at a time on 256-bit vpdpbusd (one read stream a
 * thread): measured on a 2-core Zen 4, 1B-shaped model, alternating runs,
 * even AVX2's two-row kernels beat the 512-bit ones there (8-bit 18.5
 * against 17.7 t/s, 4-bit 36.5 against 32.9, medians), and these beat
 * AVX2's (8-bit 23.4-23.8 against 22.2-22.8 with AVX2's a row at a time,
 * 4-bit 40.3-40.8 against 37.2-40.2); on the Xeon the AVX-512 ones stay
 * (81.8 against 80.6, 142.7 against 138.8 at 16 threads; 8-bit a row at a
 * time 74.2 against 73.7). docs/benchmarks.md, 2026-12-04. */
static tern_kernels g_avx512_partial;
static pthread_once_t g_partial_once = PTHREAD_ONCE_INIT;
static void partial_init(void)
{
    const tern_cpu_features *f = tern_cpu();
    g_avx512_partial = *tern_kernels_avx512_table();
    if (f->avx512_vnni && f->avx512_halves) {
        g_avx512_partial.imatmul_q4h = tern_iq16_v256_q4;
        g_avx512_partial.imatmul_q8h = tern_iq16_v256_q8;
    }
    if (!f->avx512_vnni) {
        g_avx512_partial.imatmul_q4 = tern_iq_avx2_q4;
        g_avx512_partial.imatmul_q8 = tern_iq_avx2_q8;
        g_avx512_partial.imatmul_q4h = tern_iq16_avx2_q4;
        g_avx512_partial.imatmul_q8h = tern_iq16_avx2_q8;
        g_avx512_partial.imatmul_q4w = tern_iq_panels_avx2_q4;
        g_avx512_partial.imatmul_q8w = tern_iq_panels_avx2_q8;
        g_avx512_partial.iq_panel_acts = tern_iq_panel_acts;
    }
    if (!f->avx512_bf16) {
        g_avx512_partial.matmul_bf16b = NULL;
        g_avx512_partial.bf16_act = NULL;
    }
}

/* AMX: the full AVX-512 table with the integer products on AMX-INT8 tiles
 * (the same bits as every table) and the bf16 weights' products on
 * AMX-BF16 tiles (weights rearranged at load, kernels.h: every token count
 * of a weight runs on them, so batch invariance holds). */
static tern_kernels g_amx;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static void amx_init(void)
{
    const tern_cpu_features *f = tern_cpu();
    g_amx = *tern_kernels_avx512_table();
    g_amx.isa = "amx";
    g_amx.i8_pack = tern_i8_pack_amx;
    g_amx.imatmul_q4p = tern_iq_amx_q4;
    g_amx.imatmul_q8p = tern_iq_amx_q8;
    /* 8-bit rows stay as stored for the tiles: against the VNNI panels
     * (Xeon, 16 threads, four alternating runs, medians) their prefill 512
     * is ahead (752 against 714 t/s) where the bar is closest; 4-bit
     * weights take the panels - decode 140 against 129 t/s, 16 streams 623
     * against 541, prefill 953 against 1154 (still ~1.5x llama.cpp's) */
    g_amx.imatmul_q8w = NULL;
    if (f->amx_bf16)
        g_amx.matmul_bf16t = tern_bf16dot_amx;
}
#endif

const tern_kernels *tern_kernels_amx(void)
{
#ifndef TERN_NO_AVX512
    if (tern_cpu()->amx_int8 && tern_kernels_avx512() == tern_kernels_avx512_table()) {
        pthread_once(&g_amx_once, amx_init);
        return &g_amx;
    }
#endif
    return NULL;
}

const tern_kernels *tern_kernels_avx512(void)
{
#ifndef TERN_NO_AVX512
    const tern_cpu_features *f = tern_cpu();
    if (f->avx512f && f->avx512bw && f->avx512vl && f->fma && f->f16c && f->avx2) {
        if (f->avx512_vnni && f->avx512_bf16 && !f->avx512_halves)
            return tern_kernels_avx512_table();
        pthread_once(&g_partial_once, partial_init);
        return &g_avx512_partial;
    }
#endif
    return NULL;
}

static int g_exact;
void tern_kernels_exact_set(int on) { g_exact = on; }
int tern_kernels_exact_get(void) { return g_exact; }

static const tern_kernels *g_best;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    const char *force = getenv("TERN_ISA");
    const tern_kernels *k = NULL;
    if (force && !strcmp(force, "scalar"))
        k = tern_kernels_scalar();
    else if (force && !strcmp(force, "avx2"))
        k = tern_kernels_avx2();
    else if (force && !strcmp(force, "avx512"))
        k = tern_kernels_avx512();
    else if (!force || !strcmp(force, "amx"))
        k = tern_kernels_amx();
    if (!k && (!force || (strcmp(force, "scalar") && strcmp(force, "avx2"))))
        k = tern_kernels_avx512();
    if (!k && (!force || strcmp(force, "scalar")))
        k = tern_kernels_avx2();
    if (!k)
        k = tern_kernels_scalar();
    if (force && strcmp(force, k->isa))
        TERN_WARN("TERN_ISA=%s is not available on this CPU; using %s", force, k->isa);
    g_best = k;
}

const tern_kernels *tern_kernels_best(void)
{
    pthread_once(&g_once, choose);
    return g_best;
}

size_t tern_bf16_tiles_len(long n_out, long n_in) { return (size_t)((n_out + 15) / 16) * 16 * (size_t)n_in; }

void tern_bf16_tiles_make(const uint16_t *W, long n_out, long n_in, uint16_t *Wt, long b0, long b1)
{
    for (long b = b0; b < b1; b++)
        for (long n = 0; n < 16; n++) {
            long r = b * 16 + n;
            uint16_t *dst = Wt + b * 16 * n_in + 2 * n;
            for (long p = 0; p < n_in / 2; p++) { /* a pair of inputs at a time */
                if (r < n_out)
                    memcpy(dst + p * 32, W + r * n_in + 2 * p, 2 * sizeof *dst);
                else
                    memset(dst + p * 32, 0, 2 * sizeof *dst);
            }
        }
}

size_t tern_iq_panels_len(long n_out, long n_in, int group, int bits)
{
    return (size_t)((n_out + 3) / 4) * (size_t)(tern_iq_nbp(n_in, group, bits) / 8 * tern_iq_panel_cb(group, bits));
}

void tern_iq_panels_make(const uint8_t *Wq, const uint16_t *sb16, long n_out, long n_in, int group, int bits,
                         uint8_t *P, long q0, long q1)
{
    long B = tern_iq_ablock(group, bits), rep = group / B, nb = n_in / B, ng = n_in / group;
    long blk = B * bits / 8, rowb = n_in * bits / 8, per = 8 / rep; /* bytes a block, a row; pairs a row and chunk */
    long nc = tern_iq_nbp(n_in, group, bits) / 8, nw = tern_iq_panel_nw(group, bits), cb = tern_iq_panel_cb(group, bits);
    int fast = nw % 8 == 0 && tern_cpu()->avx2; /* whole chunks by 8 x 8 word transposes */
    for (long q = q0; q < q1; q++)
        for (long c = 0; c < nc; c++) {
            uint8_t *ch = P + (q * nc + c) * cb;
            int whole = fast && 4 * q + 4 <= n_out && 8 * c + 8 <= nb;
            memset(whole ? ch + 2 * nw * 64 : ch, 0, (size_t)(whole ? cb - 2 * nw * 64 : cb));
            for (long i = 0; i < 4; i++) { /* quad row i: pair i / 2, half i % 2 */
                long r = 4 * q + i;
                if (r >= n_out)
                    continue;
                if (whole)
                    tern_iq_panel_words_avx2(Wq + r * rowb + 8 * c * blk, blk, nw,
                                             ch + (i / 2) * 64 + (i % 2) * 32);
                else
                    for (long k = 0; k < nw; k++)
                        for (long j = 0; j < 8 && 8 * c + j < nb; j++)
                            memcpy(ch + k * 128 + (i / 2) * 64 + (i % 2) * 32 + 4 * j,
                                   Wq + r * rowb + (8 * c + j) * blk + 4 * k, 4);
                for (long s = 0; s < per && 8 * c / rep + s < ng; s++) {
                    const uint16_t *p = sb16 + (r * ng + 8 * c / rep + s) * 2;
                    uint32_t v = p[0] | (uint32_t)p[1] << 16;
                    memcpy(ch + 2 * nw * 64 + (i * per + s) * 4, &v, 4);
                }
            }
        }
}
