/* Element types of weights and their conversions to f32. bf16 and f16 are kept
 * as uint16_t bit patterns (no __bf16: gcc 12 lacks it). */
#ifndef TERN_TENSOR_DTYPE_H
#define TERN_TENSOR_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum tern_dtype {
    TERN_F32,
    TERN_BF16,
    TERN_F16,
    TERN_U32, /* packed quantized words (MLX affine layout) */
    TERN_I32,
    TERN_I64,
    TERN_U8,
    TERN_F8E4M3, /* OCP FP8 E4M3 ("e4m3fn": no infinities, 0x7f/0xff NaN, max 448) */
    TERN_DTYPE_COUNT
} tern_dtype;

/* Bytes per element; 0 for an invalid dtype. */
size_t tern_dtype_size(tern_dtype t);
const char *tern_dtype_name(tern_dtype t);
/* Safetensors dtype string ("F32", "BF16", ...) to enum; -1 if unknown. */
int tern_dtype_from_safetensors(const char *s);

static inline float tern_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, NaN kept quiet. */
static inline uint16_t tern_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float tern_f16_to_f32(uint16_t h);
uint16_t tern_f32_to_f16(float f);

/* FP8 E4M3 to f32, exact: the byte's 7 low bits shifted up by 7 are an f16 of
 * 1/256 the value (the exponent biases differ by 8; subnormals map to f16
 * subnormals), so the value is that f16 times 256. NaN codes give NaN. */
static inline float tern_f8e4m3_to_f32(uint8_t b)
{
    float v = (b & 0x7f) == 0x7f ? __builtin_nanf("") : tern_f16_to_f32((uint16_t)((b & 0x7f) << 7)) * 256.0f;
    return b & 0x80 ? -v : v;
}
/* f32 to FP8 E4M3, round to nearest even, saturating at +-448 (the
 * quantizers' convention: they scale into range first); NaN stays NaN.
 * Uses the rounding mode in force (the default: to nearest even). */
uint8_t tern_f32_to_f8e4m3(float f);
/* Converts n elements of src (type t) to f32. */
void tern_to_f32(tern_dtype t, const void *src, float *dst, size_t n);

#endif
