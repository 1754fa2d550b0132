/* The integer-product kernels of each ISA (contracts: kernels.h,
 * tern_quant_act_fn and tern_iqmatmul_fn), for the tables in kernels_*.c. */
#ifndef TERN_TENSOR_CPU_INTDOT_H
#define TERN_TENSOR_CPU_INTDOT_H

#include <stdint.h>

void tern_iq_avx2_quant(const float *X, long T, long n_in, int group, int bits, int8_t *Q, float *qs);
void tern_iq_avx2_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1);
void tern_iq_avx2_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1);
void tern_iq16_avx2_q4(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1);
void tern_iq16_avx2_q8(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1);
/* AVX-512 VNNI (vpdpbusd): only for CPUs with avx512_vnni. */
void tern_iq_vnni_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1);
void tern_iq_vnni_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, float *Y,
                     long T, long n_in, long ldy, long r0, long r1);
void tern_iq16_vnni_q4(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1);
void tern_iq16_vnni_q8(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1);
/* One token, 4-/8-bit, a row at a time with 256-bit vpdpbusd (AVX-512 VNNI + VL). */
void tern_iq16_v256_q4(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1);
void tern_iq16_v256_q8(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,
                       float *Y, long n_in, long r0, long r1);
/* The panel products (kernels.h, tern_iqpanel_fn), AVX-512 VNNI. */
void tern_iq_panels_q4(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T, long n_in,
                       long ldy, long r0, long r1);
void tern_iq_panels_q8(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T, long n_in,
                       long ldy, long r0, long r1);
/* The same, AVX2 (no VNNI: vpmaddubsw, the 8-bit sign trick). */
void tern_iq_panels_avx2_q4(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T,
                            long n_in, long ldy, long r0, long r1);
void tern_iq_panels_avx2_q8(const uint8_t *P, int group, const int8_t *A, const float *qs, float *Y, long T,
                            long n_in, long ldy, long r0, long r1);
/* One row's words of a whole chunk (8 blocks of blk bytes at w, nw words a
 * block, nw a multiple of 8) into the panel layout (kernels.h): word k of
 * block j at dst + k * 128 + 4 * j. AVX2: 8 x 8 word transposes. */
void tern_iq_panel_words_avx2(const uint8_t *w, long blk, long nw, uint8_t *dst);
/* The panel products' inputs (kernels.h, iq_panel_acts), AVX2: every table with panels. */
void tern_iq_panel_acts(const int8_t *Q, long T, long n_in, int group, int bits, int8_t *A);

/* AVX-512 BF16 (vdpbf16ps, bf16dot_avx512.c): only for CPUs with avx512_bf16. */
void tern_bf16dot_avx512(const void *W, const uint16_t *Xb, float *Y, long T, long n_in, long ldy, long r0, long r1);
void tern_bf16_act_avx512(const float *X, long n, uint16_t *Xb);
/* AMX-BF16 tiles (bf16dot_amx.c): only where tern_cpu()->amx_bf16. */
void tern_bf16dot_amx(const void *Wt, const uint16_t *Xb, float *Y, long T, long n_in, long ldy, long r0, long r1);
/* AMX-INT8 tiles (intdot_amx.c): only where tern_cpu()->amx_int8. */
void tern_i8_pack_amx(const int8_t *Q, const float *qs, long T, long n_in, long ngp, int8_t *Qp, float *qsp, long p0,
                      long p1);
void tern_iq_amx_q4(const uint8_t *Wq, const float *sb, int group, const int8_t *Qp, const float *qsp, float *Y,
                    long T, long n_in, long ldy, long r0, long r1);
void tern_iq_amx_q8(const uint8_t *Wq, const float *sb, int group, const int8_t *Qp, const float *qsp, float *Y,
                    long T, long n_in, long ldy, long r0, long r1);

/* FP8 E4M3 weights times f32 inputs (contract: kernels.h, tern_f8matmul_fn):
 * AVX2 + FMA + F16C (f8dot_avx2.c) and AVX-512 F/BW/VL (f8dot_avx512.c). */
void tern_f8_avx2(const uint8_t *W, const float *fs, int fs_rows, int fs_cols, const float *X, float *Y, long T,
                  long n_in, long ldy, long r0, long r1);
void tern_f8_avx512(const uint8_t *W, const float *fs, int fs_rows, int fs_cols, const float *X, float *Y, long T,
                    long n_in, long ldy, long r0, long r1);

/* MXFP4 weights times f32 inputs (contract: kernels.h, tern_mxmatmul_fn):
 * AVX2 + FMA (mxdot_avx2.c), also the AVX-512 table's. */
void tern_mx_avx2(const uint8_t *W, const uint8_t *E, const float *X, float *Y, long T, long n_in, long ldy, long r0,
                  long r1);
/* The integer MXFP4 product (kernels.h, tern_imxmatmul_fn), AVX2. */
void tern_imx_avx2(const uint8_t *W, const uint8_t *E, const int8_t *Q, const float *qs, float *Y, long T, long n_in,
                   long ldy, long r0, long r1);
/* int16 activations and the MXFP4 product on them (tern_quant_act16_fn, tern_imx16matmul_fn), AVX2. */
void tern_q16_avx2(const float *X, long T, long n_in, int16_t *Q, float *qs);
void tern_imx16_avx2(const uint8_t *W, const uint8_t *E, const int16_t *Q, const float *qs, float *Y, long T,
                     long n_in, long ldy, long r0, long r1);

#endif
