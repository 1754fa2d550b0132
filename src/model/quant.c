/* MLX affine quantization (see quant.h): the writer side, used by
 * `tern convert`; the readers are the quantized kernels. */
#include "model/quant.h"

#include <math.h>
#include <string.h>

float model_quant_round(float v, tern_dtype dtype)
{
    if (dtype == TERN_BF16)
        return tern_bf16_to_f32(tern_f32_to_bf16(v));
    if (dtype == TERN_F16)
        return tern_f16_to_f32(tern_f32_to_f16(v));
    return v;
}

/* The codes of a group against scale/bias (rounded to nearest, clamped)
 * and their squared error. */
static double group_codes(const float *x, int group, int qmax, float scale, float bias, uint8_t *q)
{
    double err = 0;
    for (int i = 0; i < group; i++) {
        /* A constant group (scale 0) is all bias: q = 0. */
        float qf = scale > 0 ? rintf((x[i] - bias) / scale) : 0.0f;
        int c = qf < 0 ? 0 : qf > (float)qmax ? qmax : (int)qf;
        q[i] = (uint8_t)c;
        double d = (double)x[i] - ((double)scale * c + bias);
        err += d * d;
    }
    return err;
}

/* Per group: the min/max grid, then least-squares refits while they lower
 * the group's squared error - given the codes, the scale and bias that fit
 * the values best (s = (g Σcx - Σc Σx) / (g Σc² - (Σc)²), b = (Σx - s Σc)
 * / g, each rounded to the scales' dtype), and the codes again. */
#define QUANT_REFITS 4

void model_quant_row(const float *w, int n, int bits, int group, tern_dtype sdtype, uint32_t *words, float *scales,
                     float *biases)
{
    int per = 32 / bits, qmax = (1 << bits) - 1;
    uint8_t q[256], qt[256]; /* group <= 256 */
    memset(words, 0, (size_t)(n / per) * sizeof *words);
    for (int g = 0; g < n / group; g++) {
        const float *x = w + (size_t)g * group;
        float lo = x[0], hi = x[0];
        for (int i = 1; i < group; i++) {
            lo = x[i] < lo ? x[i] : lo;
            hi = x[i] > hi ? x[i] : hi;
        }
        float scale = model_quant_round((hi - lo) / (float)qmax, sdtype);
        float bias = model_quant_round(lo, sdtype);
        double best = group_codes(x, group, qmax, scale, bias, q);
        for (int it = 0; it < QUANT_REFITS && best > 0 && group <= 256; it++) {
            double sc = 0, scc = 0, sx = 0, scx = 0;
            for (int i = 0; i < group; i++) {
                sc += q[i];
                scc += (double)q[i] * q[i];
                sx += x[i];
                scx += (double)q[i] * x[i];
            }
            double det = group * scc - sc * sc;
            if (det <= 0)
                break;
            float s2 = model_quant_round((float)((group * scx - sc * sx) / det), sdtype);
            if (!(s2 > 0))
                break;
            float b2 = model_quant_round((float)((sx - (double)s2 * sc) / group), sdtype);
            double err = group_codes(x, group, qmax, s2, b2, qt);
            if (!(err < best))
                break;
            best = err;
            scale = s2;
            bias = b2;
            memcpy(q, qt, (size_t)group);
        }
        scales[g] = scale;
        biases[g] = bias;
        for (int i = 0; i < group; i++) {
            int k = g * group + i;
            words[k / per] |= (uint32_t)q[i] << ((k % per) * bits);
        }
    }
}
