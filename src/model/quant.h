/* MLX affine quantization of weight rows, as mlx-community publishes it:
 * per group of `group` consecutive inputs, w ~ scale * q + bias with q in
 * [0, 2^bits - 1] and scale, bias stored in the model's dtype. The writer
 * starts from scale = (max - min) / (2^bits - 1), bias = min (rounded to that
 * dtype), q = round((w - bias) / scale) clamped, and refits scale and bias
 * by least squares to the codes while that lowers the group's squared
 * error (model_quant_row). q values are packed little-endian into uint32
 * words, 32 / bits per word, the first value in the lowest bits. */
#ifndef TERN_MODEL_QUANT_H
#define TERN_MODEL_QUANT_H

#include <stdint.h>

#include "tensor/dtype.h"

/* Quantizes w[n] (n a multiple of group; bits 4 or 8): words[n * bits / 32],
 * scales[n / group] and biases[n / group] as f32 values already rounded to
 * sdtype (f32, bf16 or f16). */
void model_quant_row(const float *w, int n, int bits, int group, tern_dtype sdtype, uint32_t *words, float *scales,
                     float *biases);

/* Rounds v to the nearest value representable in dtype (f32: unchanged). */
float model_quant_round(float v, tern_dtype dtype);

#endif
