/* bench_kernels: single-thread throughput of the quantized products, the
 * f32-activation kernels (--exact-products) against the integer ones, in
 * thread CPU time so that a busy shared machine changes the numbers little.
 *
 *   bench_kernels [--rows N] [--in N] [--group G] [--tokens T,T,...] [--reps N]
 *
 * Per bits (8, 4) and token count: a [rows][in] MLX affine matrix (random
 * values; default 2048 x 8192, Llama-3.2-1B's down projection: 16.8 MB at
 * 8 bits, larger than the caches) times T input rows; prints weight GB/s
 * and G multiply-adds/s for each path (the integer path's time includes
 * quantizing the inputs), and the ratio, and where the table has them the
 * weights as panels made once (kernels.h, tern_iq_panels_make); then the dense bf16 product (f32
 * activations) on the same shape; the FP8 product (128 x 128 block scales,
 * f32 activations) in the backend's cache tiles; the MXFP4 product (f32
 * activations) the same way; where the table has tile
 * products (AMX), their stages' times (activations, packing, product) next
 * to the vector kernel's rate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/rng.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long rows = 2048, n_in = 8192, reps = 0;
    int group = 64, tokens[16] = {1, 2, 8, 64}, n_tok = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            rows = atol(argv[++i]);
        else if (!strcmp(argv[i], "--in") && i + 1 < argc)
            n_in = atol(argv[++i]);
        else if (!strcmp(argv[i], "--group") && i + 1 < argc)
            group = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc) {
            n_tok = 0;
            for (char *s = argv[++i]; *s && n_tok < 16; s += *s == ',') {
                char *e;
                tokens[n_tok++] = (int)strtol(s, &e, 10);
                s = e;
            }
        } else {
            fprintf(stderr, "usage: bench_kernels [--rows N] [--in N] [--group 32|64|128] [--tokens T,T,...] "
                            "[--reps N]\n");
            return 2;
        }
    }
    if (rows < 1 || n_in < group || n_in % group || (group != 32 && group != 64 && group != 128) || n_tok < 1) {
        fprintf(stderr, "bench_kernels: bad shape\n");
        return 2;
    }
    const tern_kernels *k = tern_kernels_best();
    int max_t = 1;
    for (int i = 0; i < n_tok; i++)
        max_t = tokens[i] > max_t ? tokens[i] : max_t;
    long ng = n_in / group, ngp = tern_iq_ngp(n_in / 32); /* qs room for the smallest activation blocks */
    tern_rng rng;
    tern_rng_seed(&rng, 1, 1);
    uint8_t *w = malloc((size_t)(rows * n_in));
    float *sb = malloc((size_t)(rows * ng * 2) * sizeof(float)), *x = malloc((size_t)max_t * n_in * sizeof(float));
    float *xs = malloc((size_t)max_t * ng * sizeof(float)), *y = malloc((size_t)max_t * rows * sizeof(float));
    float *qs = malloc((size_t)max_t * 2 * ngp * sizeof(float));
    int8_t *q = malloc((size_t)max_t * n_in);
    if (!w || !sb || !x || !xs || !y || !qs || !q)
        return 1;
    for (long i = 0; i < rows * n_in; i++)
        w[i] = (uint8_t)tern_rng_u32(&rng);
    for (long i = 0; i < rows * ng * 2; i++)
        sb[i] = tern_rng_f32(&rng) * 0.01f;
    for (long i = 0; i < (long)max_t * n_in; i++)
        x[i] = tern_rng_f32(&rng) * 2 - 1;
    for (long i = 0; i < (long)max_t * ng; i++)
        xs[i] = 0.5f;
    printf("isa %s, matrix %ld x %ld, group %d, single thread (thread CPU time)\n", k->isa, rows, n_in, group);
    printf("%4s %6s %14s %14s %14s %14s %7s %14s\n", "bits", "tokens", "f32 GB/s", "f32 GMAC/s", "int8 GB/s",
           "int8 GMAC/s", "ratio", "panel GMAC/s");
    /* the weights as panels where the table has them (made once, as at load; bf16 pairs) */
    uint16_t *s16 = malloc((size_t)(rows * ng * 2) * sizeof(uint16_t));
    long span = tern_iq_panel_span(n_in, group, 4) > tern_iq_panel_span(n_in, group, 8) ? tern_iq_panel_span(n_in, group, 4)
                                                                                       : tern_iq_panel_span(n_in, group, 8);
    int8_t *qa = malloc((size_t)(max_t * span));
    if (!s16 || !qa)
        return 1;
    for (long i = 0; i < rows * ng * 2; i++)
        s16[i] = tern_f32_to_bf16(sb[i]);
    for (int bits = 8; bits >= 4; bits -= 4) {
        uint8_t *P = NULL;
        if (tern_iq_panels_ok(k, group, bits, n_in)) {
            P = aligned_alloc(64, (tern_iq_panels_len(rows, n_in, group, bits) + 63) / 64 * 64);
            if (!P)
                return 1;
            tern_iq_panels_make(w, s16, rows, n_in, group, bits, P, 0, (rows + 3) / 4);
        }
        for (int ti = 0; ti < n_tok; ti++) {
            long T = tokens[ti];
            double bytes = (double)rows * n_in * bits / 8 + (double)rows * ng * 8, macs = (double)rows * n_in * T;
            long n_rep = reps ? reps : (long)(4e9 / (macs + bytes * 8)) + 1;
            double t[3] = {0, 0, 0};
            for (int path = 0; path < 3 && (path < 2 || P); path++) {
                double t0 = cpu_s();
                for (long r = 0; r < n_rep; r++) {
                    if (path == 0) {
                        (bits == 4 ? k->matmul_q4 : k->matmul_q8)(w, sb, group, x, xs, y, T, n_in, rows, 0, rows);
                    } else if (path == 1) {
                        k->quant_act(x, T, n_in, group, bits, q, qs);
                        (bits == 4 ? k->imatmul_q4 : k->imatmul_q8)(w, sb, group, q, qs, y, T, n_in, rows, 0, rows);
                    } else {
                        k->quant_act(x, T, n_in, group, bits, q, qs);
                        k->iq_panel_acts(q, T, n_in, group, bits, qa);
                        (bits == 4 ? k->imatmul_q4w : k->imatmul_q8w)(P, group, qa, qs, y, T, n_in, rows, 0, rows);
                    }
                }
                t[path] = (cpu_s() - t0) / n_rep;
            }
            printf("%4d %6ld %14.2f %14.2f %14.2f %14.2f %6.2fx", bits, T, bytes / t[0] / 1e9, macs / t[0] / 1e9,
                   bytes / t[1] / 1e9, macs / t[1] / 1e9, t[0] / t[1]);
            if (P)
                printf(" %14.2f", macs / t[2] / 1e9);
            printf("\n");
        }
        free(P);
    }
    free(s16);
    free(qa);
    /* the dense bf16 product (f32 activations) on the same shape */
    uint16_t *wb = malloc((size_t)(rows * n_in) * sizeof(uint16_t));
    if (!wb)
        return 1;
    for (long i = 0; i < rows * n_in; i++)
        wb[i] = (uint16_t)(0x3c00 + (tern_rng_u32(&rng) & 0x3ff)); /* bf16 values in [2^-7, 2^-6) */
    /* and with bf16 activations (vdpbf16ps, where the table has it; the
     * time includes rounding the inputs to bf16) */
    uint16_t *xb = malloc((size_t)max_t * n_in * sizeof(uint16_t));
    if (!xb)
        return 1;
    printf("%4s %6s %14s %14s %14s %14s %7s\n", "bf16", "tokens", "f32 GB/s", "f32 GMAC/s", "bf16x GB/s",
           "bf16x GMAC/s", "ratio");
    /* and on the tile layout where the table has a tile product (made once, as at load) */
    uint16_t *wt = NULL;
    if (tern_bf16t_ok(k, n_in)) {
        wt = aligned_alloc(64, (tern_bf16_tiles_len(rows, n_in) * sizeof(uint16_t) + 63) / 64 * 64);
        if (!wt)
            return 1;
        tern_bf16_tiles_make(wb, rows, n_in, wt, 0, (rows + 15) / 16);
        printf("(tile GMAC/s: the tile product, last column)\n");
    }
    for (int ti = 0; ti < n_tok; ti++) {
        long T = tokens[ti];
        double bytes = (double)rows * n_in * 2, macs = (double)rows * n_in * T;
        long n_rep = reps ? reps : (long)(4e9 / (macs + bytes * 4)) + 1;
        double t[3] = {0, 0, 0};
        for (int path = 0; path < 3 && (path == 0 || k->matmul_bf16b) && (path < 2 || wt); path++) {
            double t0 = cpu_s();
            for (long r = 0; r < n_rep; r++) {
                if (path == 0) {
                    k->matmul_bf16(wb, x, y, T, n_in, rows, 0, rows);
                } else {
                    k->bf16_act(x, T * n_in, xb);
                    if (path == 1)
                        k->matmul_bf16b(wb, xb, y, T, n_in, rows, 0, rows);
                    else
                        k->matmul_bf16t(wt, xb, y, T, n_in, rows, 0, rows);
                }
            }
            t[path] = (cpu_s() - t0) / n_rep;
        }
        if (t[1] > 0)
            printf("%4s %6ld %14.2f %14.2f %14.2f %14.2f %6.2fx", "", T, bytes / t[0] / 1e9, macs / t[0] / 1e9,
                   bytes / t[1] / 1e9, macs / t[1] / 1e9, t[0] / t[1]);
        if (t[2] > 0)
            printf(" %14.2f", macs / t[2] / 1e9);
        if (t[1] > 0)
            printf("\n");
        else
            printf("%4s %6ld %14.2f %14.2f %14s %14s\n", "", T, bytes / t[0] / 1e9, macs / t[0] / 1e9, "-", "-");
    }
    /* FP8 E4M3 weights with 128 x 128 block scales (f32 activations), in
     * the CPU backend's cache tiles (backend_cpu.c mm_tiled: ~64 KB of
     * weight rows times ~256 KB of inputs, or 96 rows x 64 tokens where the
     * kernels block for L1 themselves) */
    {
        long ncol = (n_in + 127) / 128, nfs = (rows + 127) / 128 * ncol;
        float *fs = malloc((size_t)nfs * sizeof(float));
        if (!fs)
            return 1;
        for (long i = 0; i < rows * n_in; i++)
            w[i] = (uint8_t)(tern_rng_u32(&rng) & 0x7e); /* no NaN codes */
        for (long i = 0; i < nfs; i++)
            fs[i] = 0.001f;
        long rb = 65536 / n_in > 0 ? 65536 / n_in : 1, tb = (262144 / (n_in * 4)) & ~1L;
        tb = tb < 2 ? 2 : tb;
        if (k->dense_blocked) { /* the kernel blocks for L1 itself: the backend's large blocks */
            rb = 96;
            tb = 64;
        }
        printf("%4s %6s %14s %14s\n", "fp8", "tokens", "GB/s", "GMAC/s");
        for (int ti = 0; ti < n_tok; ti++) {
            long T = tokens[ti];
            double bytes = (double)rows * n_in + nfs * 4.0, macs = (double)rows * n_in * T;
            long n_rep = reps ? reps : (long)(4e9 / (macs + bytes * 8)) + 1;
            double t0 = cpu_s();
            for (long r = 0; r < n_rep; r++) {
                if (T <= tb) {
                    k->matmul_f8(w, fs, 128, 128, x, y, T, n_in, rows, 0, rows);
                    continue;
                }
                for (long r0 = 0; r0 < rows; r0 += rb)
                    for (long t = 0; t < T; t += tb)
                        k->matmul_f8(w, fs, 128, 128, x + t * n_in, y + t * rows, T - t < tb ? T - t : tb, n_in, rows,
                                     r0, r0 + rb < rows ? r0 + rb : rows);
            }
            double dt = (cpu_s() - t0) / n_rep;
            printf("%4s %6ld %14.2f %14.2f\n", "", T, bytes / dt / 1e9, macs / dt / 1e9);
        }
        free(fs);
    }
    /* MXFP4 weights (gpt-oss's experts: E2M1 codes, an E8M0 scale per 32
     * inputs; f32 activations) in the backend's cache tiles (mm_tiled: ~64
     * KB of weight rows times ~256 KB of inputs) */
    {
        uint8_t *ws = malloc((size_t)rows * (n_in / 32));
        if (!ws)
            return 1;
        for (long i = 0; i < rows * n_in / 2; i++)
            w[i] = (uint8_t)tern_rng_u32(&rng);
        for (long i = 0; i < rows * (n_in / 32); i++)
            ws[i] = (uint8_t)(118 + tern_rng_u32(&rng) % 4);
        long rb = 65536 / (n_in / 2) > 0 ? 65536 / (n_in / 2) : 1, tb = (262144 / (n_in * 4)) & ~1L;
        tb = tb < 2 ? 2 : tb;
        int16_t *q16 = malloc((size_t)max_t * n_in * sizeof(int16_t));
        if (!q16)
            return 1;
        printf("%4s %6s %14s %14s %14s %14s %7s %14s %7s\n", "mxf4", "tokens", "f32 GB/s", "f32 GMAC/s", "int8 GB/s",
               "int8 GMAC/s", "ratio", "int16 GMAC/s", "ratio");
        for (int ti = 0; ti < n_tok; ti++) {
            long T = tokens[ti];
            double bytes = (double)rows * (n_in / 2 + n_in / 32), macs = (double)rows * n_in * T, dt[3];
            long n_rep = reps ? reps : (long)(4e9 / (macs + bytes * 8)) + 1;
            long nbp = tern_iq_nbp(n_in, 32, 4);
            for (int path = 0; path < 3; path++) { /* f32 activations (--exact-products), int8, int16 */
                double t0 = cpu_s();
                for (long r = 0; r < n_rep; r++) {
                    if (path == 2) { /* the backend quantizes int16 inputs inside each part */
                        k->quant_act16(x, T, n_in, q16, qs);
                        k->imatmul_mxfp4_16(w, ws, q16, qs, y, T, n_in, rows, 0, rows);
                        continue;
                    }
                    if (path) { /* the backend's integer path: all rows per tile, ~512 KB of int8 inputs */
                        k->quant_act(x, T, n_in, 32, 4, q, qs);
                        long tq = 524288 / n_in > 1 ? 524288 / n_in : 1;
                        for (long t = 0; t < T; t += tq)
                            k->imatmul_mxfp4(w, ws, q + t * n_in, qs + t * 2 * nbp, y + t * rows, T - t < tq ? T - t : tq,
                                             n_in, rows, 0, rows);
                        continue;
                    }
                    if (T <= tb) {
                        k->matmul_mxfp4(w, ws, x, y, T, n_in, rows, 0, rows);
                        continue;
                    }
                    for (long r0 = 0; r0 < rows; r0 += rb)
                        for (long t = 0; t < T; t += tb)
                            k->matmul_mxfp4(w, ws, x + t * n_in, y + t * rows, T - t < tb ? T - t : tb, n_in, rows,
                                            r0, r0 + rb < rows ? r0 + rb : rows);
                }
                dt[path] = (cpu_s() - t0) / n_rep;
            }
            printf("%4s %6ld %14.2f %14.2f %14.2f %14.2f %6.2fx %14.2f %6.2fx\n", "", T, bytes / dt[0] / 1e9,
                   macs / dt[0] / 1e9, bytes / dt[1] / 1e9, macs / dt[1] / 1e9, dt[0] / dt[1], macs / dt[2] / 1e9,
                   dt[0] / dt[2]);
        }
        free(q16);
        free(ws);
    }
    /* the tile products (AMX), where the table has them: each stage's time
     * per call (activation rounding or quantization, packing, the product)
     * and the product's GMAC/s against the vector kernel's */
    if (k->i8_pack || k->matmul_bf16t) {
        uint16_t *wt = malloc(tern_bf16_tiles_len(rows, n_in) * sizeof(uint16_t));
        int8_t *qp = malloc((size_t)(max_t + 15) / 16 * 16 * n_in);
        float *qsp = malloc((size_t)(max_t + 15) / 16 * 16 * 2 * ngp * sizeof(float));
        if (!wt || !qp || !qsp)
            return 1;
        if (k->matmul_bf16t && n_in % 32 == 0)
            tern_bf16_tiles_make(wb, rows, n_in, wt, 0, (rows + 15) / 16);
        printf("%4s %6s %10s %10s %10s %12s %12s\n", "tile", "tokens", "act ms", "pack ms", "prod ms", "tile GMAC/s",
               "vec GMAC/s");
        for (int kind = 0; kind < 3; kind++) {
            int bits = kind == 0 ? 16 : kind == 1 ? 8 : 4;
            if (bits == 16 ? !tern_bf16t_ok(k, n_in) : !k->i8_pack)
                continue;
            for (int ti = 0; ti < n_tok; ti++) {
                long T = tokens[ti];
                if (bits != 16 && !tern_iqp_ok(k, group, bits, T))
                    continue;
                double macs = (double)rows * n_in * T;
                long n_rep = reps ? reps : (long)(2e10 / (macs + (double)rows * n_in * 8)) + 1;
                double ta = 0, tp = 0, tm = 0, tv = 0;
                for (long r = 0; r < n_rep; r++) {
                    double t0 = cpu_s();
                    if (bits == 16)
                        k->bf16_act(x, T * n_in, xb);
                    else
                        k->quant_act(x, T, n_in, group, bits, q, qs);
                    double t1 = cpu_s();
                    if (bits != 16) /* bf16 tiles take the inputs as they are */
                        k->i8_pack(q, qs, T, n_in, tern_iq_nbp(n_in, group, bits), qp, qsp, 0, n_in / 4);
                    double t2 = cpu_s();
                    if (bits == 16)
                        k->matmul_bf16t(wt, xb, y, T, n_in, rows, 0, rows);
                    else
                        (bits == 4 ? k->imatmul_q4p : k->imatmul_q8p)(w, sb, group, qp, qsp, y, T, n_in, rows, 0, rows);
                    double t3 = cpu_s();
                    if (bits == 16)
                        k->matmul_bf16b(wb, xb, y, T, n_in, rows, 0, rows);
                    else
                        (bits == 4 ? k->imatmul_q4 : k->imatmul_q8)(w, sb, group, q, qs, y, T, n_in, rows, 0, rows);
                    tv += cpu_s() - t3;
                    ta += t1 - t0, tp += t2 - t1, tm += t3 - t2;
                }
                printf("%4d %6ld %10.3f %10.3f %10.3f %12.1f %12.1f\n", bits, T, ta / n_rep * 1e3, tp / n_rep * 1e3,
                       tm / n_rep * 1e3, macs / (tm / n_rep) / 1e9, macs / (tv / n_rep) / 1e9);
            }
        }
        free(wt), free(qp), free(qsp);
    }
    free(wb), free(xb), free(wt);
    free(w), free(sb), free(x), free(xs), free(y), free(qs), free(q);
    return 0;
}
