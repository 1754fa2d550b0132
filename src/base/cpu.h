/* CPU feature detection, done once at start-up; kernels are chosen from it. */
#ifndef TERN_BASE_CPU_H
#define TERN_BASE_CPU_H

typedef struct tern_cpu_features {
    int avx2, fma, f16c;
    int avx512f, avx512bw, avx512vl, avx512_bf16, avx512_vnni;
    /* AMX tiles with bf16 / int8 products, and the OS lets this process use
     * them (Linux: the tile data state is granted once per process through
     * arch_prctl(ARCH_REQ_XCOMP_PERM), asked for at detection). */
    int amx_bf16, amx_int8;
    /* AVX-512 issued as two 256-bit halves (AMD family 19h: Zen 4), where
     * some 512-bit kernels lose to 256-bit ones (kernels.c). */
    int avx512_halves;
} tern_cpu_features;

const tern_cpu_features *tern_cpu(void);
/* Number of online logical CPUs (>= 1). */
int tern_cpu_count(void);
/* Physical cores this process may run on (>= 1): the CPUs of its affinity
 * mask counted once per (package, core) pair from sysfs topology, so SMT
 * siblings count once. Falls back to tern_cpu_count() where the topology
 * cannot be read. The default thread count: a second hyperthread shares
 * the core's vector units, which the products already keep busy. */
int tern_cpu_physical_count(void);

#endif
