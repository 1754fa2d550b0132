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

void model_quant_row(const float *w, int n, int bits, int group, tern_dtype sdtype, uint32_t *words, float *scales,
                     float *biases)
{
    int per = 32 / bits, qmax = (1 << bits) - 1;
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
        scales[g] = scale;
        biases[g] = bias;
        for (int i = 0; i < group; i++) {
            /* A constant group (scale 0) is all bias: q = 0. */
            float qf = scale > 0 ? rintf((x[i] - bias) / scale) : 0.0f;
            int q = qf < 0 ? 0 : qf > (float)qmax ? qmax : (int)qf;
            int k = g * group + i;
            words[k / per] |= (uint32_t)q << ((k % per) * bits);
        }
    }
}
