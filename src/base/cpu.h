/* CPU feature detection, done once at start-up; kernels are chosen from it. */
#ifndef TERN_BASE_CPU_H
#define TERN_BASE_CPU_H

typedef struct tern_cpu_features {
    int avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni;
} tern_cpu_features;

const tern_cpu_features *tern_cpu(void);
/* Number of online cores (>= 1). */
int tern_cpu_count(void);

#endif
