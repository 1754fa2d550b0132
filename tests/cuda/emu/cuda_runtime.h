/* A CPU stand-in for the parts of the CUDA runtime that sample.cu's kernels
 * use, so that tests/cuda/sample_emu.cpp can run the kernel source on a
 * machine without a GPU: one block at a time, its threads as pthreads,
 * __syncthreads a barrier, __shared__ variables function statics (shared by
 * the block's threads), atomics the compiler's. Not a CUDA emulator: warp
 * shuffles abort (sample_rows_kernel uses none). */
#pragma once
#include <pthread.h>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

struct emu_dim {
    unsigned x;
};
struct float4 {
    float x, y, z, w;
};
extern thread_local emu_dim threadIdx, blockIdx;
extern emu_dim blockDim;
extern pthread_barrier_t emu_bar;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
typedef int cudaError_t;
typedef void *cudaStream_t;
enum { cudaErrorInvalidValue = 1 };
static inline void __syncthreads() { pthread_barrier_wait(&emu_bar); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline unsigned __float_as_uint(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
static inline unsigned long long __double2ull_rn(double d) { return (unsigned long long)nearbyint(d); }
/* one IEEE operation each (volatile: no contraction into an FMA) */
static inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int)
{
    abort();
    return v;
}
