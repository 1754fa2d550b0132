/* Scalar reference kernels: the specification the SIMD kernels are tested
 * against. Plain loops, f32 accumulation in index order. */
#include "tensor/kernels.h"

#include <math.h>

#include "tensor/dtype.h"

#define SCALAR_MATMUL(name, wtype, load)                                                          \
    static void name(const void *Wv, const float *X, float *Y, long T, long n_in, long ldy,       \
                     long r0, long r1)                                                            \
    {                                                                                             \
        const wtype *W = Wv;                                                                      \
        for (long r = r0; r < r1; r++) {                                                          \
            const wtype *w = W + r * n_in;                                                        \
            for (long t = 0; t < T; t++) {                                                        \
                const float *x = X + t * n_in;                                                    \
                float acc = 0.0f;                                                                 \
                for (long i = 0; i < n_in; i++)                                                   \
                    acc += load(w[i]) * x[i];                                                     \
                Y[t * ldy + r] = acc;                                                             \
            }                                                                                     \
        }                                                                                         \
    }

#define LOAD_F32(v) (v)
SCALAR_MATMUL(matmul_f32, float, LOAD_F32)
SCALAR_MATMUL(matmul_bf16, uint16_t, tern_bf16_to_f32)
SCALAR_MATMUL(matmul_f16, uint16_t, tern_f16_to_f32)

/* The specification of the quantized product (see kernels.h). */
#define SCALAR_QMATMUL(name, QV)                                                                  \
    static void name(const uint8_t *Wq, const float *sb, int group, const float *X, const float *xsum, \
                     float *Y, long T, long n_in, long ldy, long r0, long r1)                     \
    {                                                                                             \
        long ng = n_in / group;                                                                   \
        for (long r = r0; r < r1; r++) {                                                          \
            const uint8_t *w = Wq + r * n_in * BITS_##name / 8;                                    \
            const float *s = sb + r * ng * 2;                                                     \
            for (long t = 0; t < T; t++) {                                                        \
                const float *x = X + t * n_in;                                                    \
                float acc = 0.0f;                                                                 \
                for (long g = 0; g < ng; g++) {                                                   \
                    float d = 0.0f;                                                               \
                    for (long i = g * group; i < (g + 1) * group; i++)                            \
                        d += (float)(QV) * x[i];                                                  \
                    acc += s[2 * g] * d + s[2 * g + 1] * xsum[t * ng + g];                       \
                }                                                                                 \
                Y[t * ldy + r] = acc;                                                             \
            }                                                                                     \
        }                                                                                         \
    }

#define BITS_matmul_q4 4
#define BITS_matmul_q8 8
SCALAR_QMATMUL(matmul_q4, (w[i >> 1] >> ((i & 1) * 4)) & 15)
SCALAR_QMATMUL(matmul_q8, w[i])

/* The specification of the activation quantization (see kernels.h): per
 * token, blocks of B inputs. */
static void quant_act(const float *X, long T, long n_in, int group, int bits, int8_t *Q, float *qs)
{
    int B = tern_iq_ablock(group, bits);
    long nb = n_in / B, nbp = tern_iq_nbp(n_in, group, bits);
    for (long t = 0; t < T; t++) {
        float *d = qs + t * 2 * nbp, *A = d + nbp;
        for (long b = 0; b < nbp; b++) {
            d[b] = A[b] = 0.0f;
            if (b >= nb)
                continue;
            const float *x = X + t * n_in + b * B;
            int8_t *q = Q + t * n_in + b * B;
            float amax = 0.0f;
            for (int i = 0; i < B; i++)
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            int sum = 0;
            float id = amax >= 1e-30f ? 127.0f / amax : 0.0f;
            for (int i = 0; i < B; i++) {
                int v = id > 0 ? (int)nearbyintf(x[i] * id) : 0;
                /* bits 4: nibble order within each 32 (see kernels.h) */
                q[bits == 4 ? (i & ~31) + ((i & 31) >> 1) + (i & 1) * 16 : i] = (int8_t)v;
                sum += v;
            }
            if (id > 0) {
                d[b] = amax / 127.0f;
                A[b] = (float)sum;
            }
        }
    }
}

/* The specification of the integer product (see kernels.h): exact integer
 * block sums, then the f32 combination in the contract's order, each block
 * with its weight group's {scale, bias}. SB(g) reads group g's pair. */
#define SCALAR_IQ_ROW(BITS, QV, QI, SB, a, d, A, out)                                            \
    do {                                                                                          \
        float acc[8] = {0};                                                                       \
        for (long b = 0; b < nbp; b++) {                                                          \
            int32_t I = 0;                                                                        \
            float sw = 0.0f, bw = 0.0f;                                                           \
            if (b < nb) {                                                                         \
                for (long i = b * B; i < (b + 1) * B; i++)                                        \
                    I += (int32_t)(QV) * a[QI];                                                   \
                sw = SB(2 * (b / rep));                                                           \
                bw = SB(2 * (b / rep) + 1);                                                       \
            }                                                                                     \
            float u = fmaf(sw, (float)I, bw * A[b]);                                              \
            acc[b & 7] = fmaf(u, d[b], acc[b & 7]);                                               \
        }                                                                                         \
        out = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));  \
    } while (0)

#define SB_F32(k) s[k]
#define SB_BF16(k) tern_bf16_to_f32(s[k])

#define SCALAR_IQMATMUL(name, BITS, QV, QI)                                                           \
    static void name(const uint8_t *Wq, const float *sb, int group, const int8_t *Q, const float *qs, \
                     float *Y, long T, long n_in, long ldy, long r0, long r1)                     \
    {                                                                                             \
        int B = tern_iq_ablock(group, BITS);                                                      \
        long ng = n_in / group, nb = n_in / B, nbp = tern_iq_nbp(n_in, group, BITS), rep = group / B; \
        for (long r = r0; r < r1; r++) {                                                          \
            const uint8_t *w = Wq + r * n_in * BITS / 8;                                          \
            const float *s = sb + r * ng * 2;                                                     \
            for (long t = 0; t < T; t++) {                                                        \
                const int8_t *a = Q + t * n_in;                                                   \
                const float *d = qs + t * 2 * nbp, *A = d + nbp;                                  \
                SCALAR_IQ_ROW(BITS, QV, QI, SB_F32, a, d, A, Y[t * ldy + r]);                     \
            }                                                                                     \
        }                                                                                         \
    }

SCALAR_IQMATMUL(imatmul_q4, 4, (w[i >> 1] >> ((i & 1) * 4)) & 15, (i & ~31) + ((i & 31) >> 1) + (i & 1) * 16)
SCALAR_IQMATMUL(imatmul_q8, 8, w[i], i)

/* tern_iqmatmul16_fn by the same loop, each pair widened to f32 (exact). */
#define SCALAR_IQMATMUL16(name, BITS, QV, QI)                                                                 \
    static void name(const uint8_t *Wq, const uint16_t *sb16, int group, const int8_t *Q, const float *qs,   \
                     float *Y, long n_in, long r0, long r1)                                                 \
    {                                                                                                       \
        int B = tern_iq_ablock(group, BITS);                                                                \
        long ng = n_in / group, nb = n_in / B, nbp = tern_iq_nbp(n_in, group, BITS), rep = group / B;       \
        const float *d = qs, *A = qs + nbp;                                                                 \
        for (long r = r0; r < r1; r++) {                                                                    \
            const uint8_t *w = Wq + r * n_in * BITS / 8;                                                    \
            const uint16_t *s = sb16 + r * ng * 2;                                                          \
            SCALAR_IQ_ROW(BITS, QV, QI, SB_BF16, Q, d, A, Y[r]);                                            \
        }                                                                                                   \
    }

SCALAR_IQMATMUL16(imatmul_q4h, 4, (w[i >> 1] >> ((i & 1) * 4)) & 15, (i & ~31) + ((i & 31) >> 1) + (i & 1) * 16)
SCALAR_IQMATMUL16(imatmul_q8h, 8, w[i], i)

void tern_matmul_bf16b_ref(const void *Wv, const uint16_t *Xb, float *Y, long T, long n_in, long ldy, long r0,
                           long r1)
{
    const uint16_t *W = Wv;
    for (long r = r0; r < r1; r++)
        for (long t = 0; t < T; t++) {
            float acc = 0.0f;
            for (long i = 0; i < n_in; i++)
                acc += tern_bf16_to_f32(W[r * n_in + i]) * tern_bf16_to_f32(Xb[t * n_in + i]);
            Y[t * ldy + r] = acc;
        }
}

static void bf16_act(const float *X, long n, uint16_t *Xb)
{
    for (long i = 0; i < n; i++)
        Xb[i] = tern_f32_to_bf16(X[i]);
}

static float dot(const float *a, const float *b, long n)
{
    float acc = 0.0f;
    for (long i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

static void axpy(float a, const float *x, float *y, long n)
{
    for (long i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* The FP8 reference: each block's products summed in index order. */
void tern_matmul_f8_scalar(const uint8_t *W, const float *fs, int fs_rows, int fs_cols, const float *X, float *Y, long T,
                           long n_in, long ldy, long r0, long r1)
{
    long ncol = (n_in + fs_cols - 1) / fs_cols;
    for (long r = r0; r < r1; r++) {
        const uint8_t *w = W + r * n_in;
        const float *s = fs + (r / fs_rows) * ncol;
        for (long t = 0; t < T; t++) {
            const float *x = X + t * n_in;
            float y = 0.0f;
            for (long c = 0; c < ncol; c++) {
                float p = 0.0f;
                long e = (c + 1) * fs_cols < n_in ? (c + 1) * fs_cols : n_in;
                for (long i = c * fs_cols; i < e; i++)
                    p += tern_f8e4m3_to_f32(w[i]) * x[i];
                y += s[c] * p;
            }
            Y[t * ldy + r] = y;
        }
    }
}

/* The MXFP4 reference: each block's products (twice the E2M1 value, an
 * exact small integer, times the input) summed in index order, then scaled
 * by 2^(E - 128) and added in block order. */
void tern_matmul_mxfp4_scalar(const uint8_t *W, const uint8_t *E, const float *X, float *Y, long T, long n_in, long ldy,
                              long r0, long r1)
{
    long nb = n_in / 32;
    for (long r = r0; r < r1; r++) {
        const uint8_t *w = W + r * (n_in / 2), *e = E + r * nb;
        for (long t = 0; t < T; t++) {
            const float *x = X + t * n_in;
            float y = 0.0f;
            for (long b = 0; b < nb; b++) {
                float p = 0.0f;
                for (long i = 0; i < 32; i++)
                    p += (float)tern_mx_v2(w[b * 16 + i / 2] >> (i % 2 * 4)) * x[b * 32 + i];
                y += tern_mx_scale(e[b]) * p;
            }
            Y[t * ldy + r] = y;
        }
    }
}

/* The integer MXFP4 references (kernels.h, tern_imxmatmul_fn and
 * tern_imx16matmul_fn): Q (int8, or int16 when wide) in the nibble order of
 * tern_quant_act_fn's 4-bit layout. */
static void imatmul_mxfp4_q(const uint8_t *W, const uint8_t *E, const void *Q, int wide, const float *qs, float *Y,
                            long T, long n_in, long ldy, long r0, long r1)
{
    long nb = n_in / 32, nbp = tern_iq_nbp(n_in, 32, 4);
    for (long r = r0; r < r1; r++) {
        const uint8_t *w = W + r * (n_in / 2), *e = E + r * nb;
        for (long t = 0; t < T; t++) {
            const int8_t *q8 = (const int8_t *)Q + t * n_in;
            const int16_t *q16 = (const int16_t *)Q + t * n_in;
            const float *d = qs + t * 2 * nbp;
            float acc[8] = {0};
            for (long b = 0; b < nbp; b++) {
                float u = 0.0f;
                if (b < nb) {
                    int32_t I = 0;
                    for (int i = 0; i < 16; i++) { /* byte i: input 2i (low nibble, q[i]), 2i + 1 (high, q[16 + i]) */
                        const long k = b * 32 + i;
                        I += tern_mx_v2(w[b * 16 + i]) * (wide ? q16[k] : q8[k]) +
                             tern_mx_v2(w[b * 16 + i] >> 4) * (wide ? q16[k + 16] : q8[k + 16]);
                    }
                    u = tern_mx_scale(e[b]) * (float)I;
                }
                acc[b % 8] = fmaf(u, d[b], acc[b % 8]);
            }
            Y[t * ldy + r] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
        }
    }
}

static void imatmul_mxfp4(const uint8_t *W, const uint8_t *E, const int8_t *Q, const float *qs, float *Y, long T,
                          long n_in, long ldy, long r0, long r1)
{
    imatmul_mxfp4_q(W, E, Q, 0, qs, Y, T, n_in, ldy, r0, r1);
}

/* int16 activations (kernels.h, tern_quant_act16_fn). */
static void quant_act16(const float *X, long T, long n_in, int16_t *Q, float *qs)
{
    long nb = n_in / 32, nbp = tern_iq_nbp(n_in, 32, 4);
    for (long t = 0; t < T; t++) {
        float *d = qs + t * 2 * nbp;
        for (long b = 0; b < 2 * nbp; b++)
            d[b] = 0.0f;
        for (long b = 0; b < nb; b++) {
            const float *x = X + t * n_in + b * 32;
            int16_t *q = Q + t * n_in + b * 32;
            float amax = 0.0f;
            for (int i = 0; i < 32; i++)
                amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
            float id = amax >= 1e-30f ? 32767.0f / amax : 0.0f;
            for (int i = 0; i < 32; i++)
                q[(i >> 1) + (i & 1) * 16] = (int16_t)(id > 0 ? (int)nearbyintf(x[i] * id) : 0);
            if (id > 0)
                d[b] = amax / 32767.0f;
        }
    }
}

static void imatmul_mxfp4_16(const uint8_t *W, const uint8_t *E, const int16_t *Q, const float *qs, float *Y, long T,
                             long n_in, long ldy, long r0, long r1)
{
    imatmul_mxfp4_q(W, E, Q, 1, qs, Y, T, n_in, ldy, r0, r1);
}

static const tern_kernels k_scalar = {"scalar", matmul_f32, matmul_bf16, matmul_f16, matmul_q4, matmul_q8,
                                      quant_act, imatmul_q4, imatmul_q8, NULL, bf16_act, dot, axpy, NULL, NULL, NULL, NULL,
                                      imatmul_q4h, imatmul_q8h, 0, tern_matmul_f8_scalar, tern_matmul_mxfp4_scalar,
                                      imatmul_mxfp4, quant_act16, imatmul_mxfp4_16, NULL, NULL, NULL};

const tern_kernels *tern_kernels_scalar(void) { return &k_scalar; }
