/* dtype tables and scalar conversions (see dtype.h). */
#include "dtype.h"

#include <math.h>

size_t tern_dtype_size(tern_dtype t)
{
    static const size_t sz[TERN_DTYPE_COUNT] = {4, 2, 2, 4, 4, 8, 1, 1};
    return (unsigned)t < TERN_DTYPE_COUNT ? sz[t] : 0;
}

const char *tern_dtype_name(tern_dtype t)
{
    static const char *nm[TERN_DTYPE_COUNT] = {"F32", "BF16", "F16", "U32", "I32", "I64", "U8", "F8_E4M3"};
    return (unsigned)t < TERN_DTYPE_COUNT ? nm[t] : "?";
}

int tern_dtype_from_safetensors(const char *s)
{
    for (int t = 0; t < TERN_DTYPE_COUNT; t++)
        if (!strcmp(s, tern_dtype_name((tern_dtype)t)))
            return t;
    return -1;
}

float tern_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalize */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ff;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t tern_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    if (((u >> 23) & 0xff) == 0xff)
        return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10)
            return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is the right rounding */
    return (uint16_t)h;
}

uint8_t tern_f32_to_f8e4m3(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80);
    float a = fabsf(f);
    if (a != a)
        return (uint8_t)(sign | 0x7f);
    if (a >= 448.0f)
        return (uint8_t)(sign | 0x7e);
    if (a < 0.015625f) /* below E4M3's smallest normal 2^-6: multiples of 2^-9, the scaling exact */
        return (uint8_t)(sign | (uint8_t)lrintf(a * 512.0f));
    /* normal: round the f32 mantissa to 3 bits, to nearest even (a carry
     * into the exponent is the next binade's first code); the exponent
     * rebiased from 127 to 7. Below 448 the result is at most 448 (0x7e). */
    uint32_t v;
    memcpy(&v, &a, 4);
    v += 0x7ffff + ((v >> 20) & 1);
    return (uint8_t)(sign | ((((v >> 23) - 120) << 3) | ((v >> 20) & 7)));
}

void tern_to_f32(tern_dtype t, const void *src, float *dst, size_t n)
{
    switch (t) {
    case TERN_F32:
        memcpy(dst, src, n * 4);
        break;
    case TERN_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = tern_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case TERN_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = tern_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case TERN_F8E4M3:
        for (size_t i = 0; i < n; i++)
            dst[i] = tern_f8e4m3_to_f32(((const uint8_t *)src)[i]);
        break;
    default:
        for (size_t i = 0; i < n; i++)
            dst[i] = 0.0f;
    }
}
