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
    /* The attention's batched forms (backend_cpu.c), g query heads against n
     * stored heads of one type (rows[r]: a head's bytes), each row read once
     * for all g: scores sets sc[j * ps + r] = q_j . decode(rows[r]) (q_j at
     * q + j * head_dim); wsum adds p[j * ps + r] * decode(rows[r]) to o_j
     * (at o + j * head_dim) for r in order, so one call over n rows gives
     * the bits of calls over any split of them in order. */
    void (*scores)(kv_type t, int head_dim, int g, int n, const float *q, const uint8_t *const *rows, float *sc,
                   int ps);
    void (*wsum)(kv_type t, int head_dim, int g, int n, const float *p, int ps, const uint8_t *const *rows, float *o);
    /* A chunk's softmax numerators in place: s[r] = scale * s[r] (then
     * softcap * tanh(s[r] / softcap) when softcap > 0), *max = their max,
     * s[r] = exp(s[r] - *max); returns their sum. */
    float (*softmax)(float *s, int n, float scale, float softcap, float *max);
} kv_reader;

/* The scalar reference of scores / wsum (kv_head_dot / kv_head_axpy per
 * head and row) and softmax (expf). */
float kv_softmax_part(float *s, int n, float scale, float softcap, float *max);
void kv_heads_scores(kv_type t, int head_dim, int g, int n, const float *q, const uint8_t *const *rows, float *sc,
                     int ps);
void kv_heads_wsum(kv_type t, int head_dim, int g, int n, const float *p, int ps, const uint8_t *const *rows,
                   float *o);

extern const kv_reader kv_reader_scalar;
#ifdef __x86_64__
extern const kv_reader kv_reader_avx2;
#endif
/* The best table for this CPU (decided once). */
const kv_reader *kv_reader_best(void);

#endif
