/* Inside the KV codecs (kv_codec.c, kv_codec_avx2.c) and the attention
 * that reads them: the group size rule and the per-CPU fused readers. */
#ifndef TERN_MODEL_KV_INT_H
#define TERN_MODEL_KV_INT_H

#include "model/kv.h"

/* Bytes of one group of g elements of a quantized type (0 otherwise). */
size_t kv_group_bytes(kv_type t, int g);

/* The fused reads of one head (kv_head_dot / kv_head_axpy's contract), as
 * a table chosen for the CPU once: the scalar reference, or AVX2 + FMA +
 * F16C, which falls back to the scalar code for what it does not cover. */
typedef struct kv_reader {
    const char *name;
    float (*dot)(kv_type t, int head_dim, const float *q, const uint8_t *src);
    void (*axpy)(kv_type t, int head_dim, float w, const uint8_t *src, float *out);
} kv_reader;

extern const kv_reader kv_reader_scalar;
#ifdef __x86_64__
extern const kv_reader kv_reader_avx2;
#endif
/* The best table for this CPU (decided once). */
const kv_reader *kv_reader_best(void);

#endif
