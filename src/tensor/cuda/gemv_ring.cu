// One-token GEMV of bf16 weights streamed through a ring of shared memory
// by bulk copies (tcu_gemv_args.ring): one block a multiprocessor, a
// producer warp that keeps the ring full from the block's first moment -
// before the launch waits for the kernel before it, since no kernel writes
// weights - and consumer warps that sum each row as TCU_GEMV_STAGED does
// (lane L adds chunks L, L + 32, ... in order, the warp's butterfly, the
// fused norm's 256-thread double sums), so the bits are those of the
// staged kernel. The ring keeps ~128 KiB a multiprocessor in flight without a
// register for it, and one block a multiprocessor has no waves: the
// one-token gate/up product (4.5 waves of register-kernel blocks) loses
// its ramp and ragged last wave, and down (where its rows fit 8 slots)
// its ramp (docs/cuda.md).
#include "tensor/cuda/gemv.cuh"

#define RG_WARPS 16          /* consumer warps; one more warp produces */
#define RG_NORM_THREADS 256 /* the fused norm's sums: as rmsnorm_kernel */
#define RG_MAX_SLOTS 64
/* fewer slots starve the stream: gate/up of 8B in 4 slots (64 KiB in
 * flight a SM) ran at 218 tok/s against 249 in 8; down of 8B (3 slots of
 * 28 KiB) lost 4% - those launches keep the register kernel */
#define RG_MIN_SLOTS 8
/* dynamic shared memory a block: activations (and norm weights) + ring.
 * Measured at 8B bf16 batch 1 (gate/up on the ring): 8 slots in 160 KiB
 * 249 tok/s, 11 slots in 208 KiB 235, 4 in 96 KiB 218. Likely the
 * carveout: 160 KiB stays in the one the neighbouring launches use (two
 * 77 KiB o / down blocks a SM), larger blocks make the SMs reconfigure
 * between launches. */
#define RG_SMEM (160 * 1024)

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint64_t *b, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(smem_u32(b)), "r"(parity)
                     : "memory");
    } while (!done);
}
// bytes (a multiple of 16) global -> shared, counted on mbarrier b, with
// L2 policy pol (the weights are read once a step: evict-first - without
// it 8B bf16 lost 1.5%).
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *b, uint64_t pol)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
                 "[%0], [%1], %2, [%3], %4;" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(b)), "l"(pol)
                 : "memory");
}

// The first RG_NORM_THREADS consumers (named barrier 1) and all consumer
// warps (barrier 2).
struct rg_norm_grp {
    __device__ int tid() const { return threadIdx.x; }
    __device__ int size() const { return RG_NORM_THREADS; }
    __device__ void sync() const { asm volatile("bar.sync 1, %0;" ::"n"(RG_NORM_THREADS) : "memory"); }
};
__device__ __forceinline__ void rg_consumers_sync()
{
    asm volatile("bar.sync 2, %0;" ::"n"(RG_WARPS * WARP) : "memory");
}

// Block b sums items [rows * b / grid, rows * (b + 1) / grid): an item is
// an output row (a gate/up pair when GLU), its weights one slot of the
// ring of nslot slots.
// KIND: TCU_BF16, or TCU_F8 (each chunk times its row's block scale, read
// from the launch's scale pairs as the register kernel reads them).
template <int KIND, bool GLU>
__global__ void __launch_bounds__((RG_WARPS + 1) * WARP, 1) gemv_ring_kernel(const tcu_gemv_args a, int nslot)
{
    static_assert(RG_WARPS * WARP >= RG_NORM_THREADS, "the norm's threads are consumers");
    constexpr int NV = chunk_traits<KIND>::NV;
    constexpr bool F8 = KIND == TCU_F8;
    extern __shared__ __align__(128) unsigned char rg_smem[];
    __shared__ uint64_t full[RG_MAX_SLOTS], empty[RG_MAX_SLOTS];
    __shared__ double sh[32];
    __shared__ float rnorm;
    const int n_in = a.n_in, nch = n_in / NV;
    const uint32_t rb = (uint32_t)n_in * (F8 ? 1 : 2), ib = GLU ? 2 * rb : rb;
    float *xs = reinterpret_cast<float *>(rg_smem);
    float *gs = xs + n_in;
    unsigned char *ring = rg_smem + (size_t)(a.norm_g ? 2 : 1) * n_in * sizeof(float);
    const long rows = gv_out_rows(a, GLU);
    const long i0 = rows * blockIdx.x / gridDim.x;
    const int n = (int)(rows * (blockIdx.x + 1) / gridDim.x - i0);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    if (threadIdx.x == 0) {
        for (int s = 0; s < nslot; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == RG_WARPS) { /* the producer: the weights need no wait */
        if (lane == 0) {
            uint64_t pol;
            asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
            for (int j = 0; j < n; j++) {
                const int s = j % nslot;
                if (j >= nslot)
                    mbar_wait(&empty[s], (uint32_t)((j / nslot - 1) & 1));
                mbar_expect_tx(&full[s], ib);
                unsigned char *dst = ring + (size_t)s * ib;
                const long gr = i0 + j;
                if (GLU) {
                    bulk_copy(dst, (const char *)a.m[0].w + (size_t)gr * rb, rb, &full[s], pol);
                    bulk_copy(dst + rb, (const char *)a.m[1].w + (size_t)gr * rb, rb, &full[s], pol);
                } else {
                    long off;
                    const int k = gv_mat_of(a, gr, &off);
                    bulk_copy(dst, (const char *)a.m[k].w + (size_t)(gr - off) * rb, rb, &full[s], pol);
                }
            }
        }
        return;
    }

    /* the consumers: the norm weights (no kernel writes them) before the
     * wait, the activations after it, as the register kernel stages them */
    if (a.norm_g)
        for (int v = threadIdx.x * 4; v < n_in; v += RG_WARPS * WARP * 4)
            cp_async16(gs + v, a.norm_g + v, 16);
    pdl_wait();
    pdl_trigger();
    {
        const size_t xrow = a.norm_g && a.norm_rows ? (size_t)a.norm_rows[0] : 0;
        for (int v = threadIdx.x * 4; v < n_in; v += RG_WARPS * WARP * 4) {
            const int cc = v / NV, p = (v % NV) / 4;
            cp_async16(xs + cc * NV + ((p ^ gv_swz<NV>(cc)) * 4), a.x + xrow * n_in + v, 16);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
        asm volatile("cp.async.wait_group 0;" ::: "memory");
        rg_consumers_sync();
    }
    if (a.norm_g) {
        if (threadIdx.x < RG_NORM_THREADS) {
            const float r = gv_staged_rnorm<NV>(xs, n_in, a.norm_eps, threadIdx.x, RG_NORM_THREADS,
                                                [&](double v) { return grp_sum_d(rg_norm_grp{}, v, sh); });
            if (threadIdx.x == 0)
                rnorm = r;
        }
        rg_consumers_sync();
        const float r = rnorm;
        for (int e = threadIdx.x; e < n_in; e += RG_WARPS * WARP) {
            const int q = gv_pos<NV>(e);
            xs[q] = __fmul_rn(__fmul_rn(xs[q], r), gs[e]);
        }
        rg_consumers_sync();
    }

    /* warp w alone consumes the slots s = w (mod nc), each in turn, so that
     * a slot's phases are waited for in order */
    const int nc = nslot < RG_WARPS ? nslot : RG_WARPS;
    for (int j = warp; warp < nc && j < n; j += nc) {
        const int s = j % nslot;
        mbar_wait(&full[s], (uint32_t)((j / nslot) & 1));
        const uint4 *w = reinterpret_cast<const uint4 *>(ring + (size_t)s * ib);
        float acc = 0.0f, acc_u = 0.0f;
        const float2 *sg = nullptr, *su = nullptr; /* F8: the row's scales */
        int grp = NV;
        if constexpr (F8) {
            const long gr = i0 + j;
            long off = 0;
            const int k = GLU ? 0 : gv_mat_of(a, gr, &off);
            grp = a.m[k].group;
            const size_t row0 = (size_t)(gr - off) * ((n_in + grp - 1) / grp);
            sg = reinterpret_cast<const float2 *>(a.m[k].sb) + row0;
            if (GLU)
                su = reinterpret_cast<const float2 *>(a.m[1].sb) + row0;
        }
#pragma unroll 4
        for (int c = lane; c < nch; c += WARP) {
            float xv[NV];
            const int sw = gv_swz<NV>(c);
            const float *xr = xs + c * NV;
#pragma unroll
            for (int p = 0; p < NV / 4; p++) {
                const float4 v = *reinterpret_cast<const float4 *>(xr + ((p ^ sw) * 4));
                xv[4 * p] = v.x;
                xv[4 * p + 1] = v.y;
                xv[4 * p + 2] = v.z;
                xv[4 * p + 3] = v.w;
            }
            const float sc = F8 ? __ldg(sg + c * NV / grp).x : 0.0f;
            acc = __fadd_rn(acc, chunk_dot_v<KIND>(w[c], xv, 0.0f, sc, 0.0f));
            if (GLU)
                acc_u = __fadd_rn(acc_u, chunk_dot_v<KIND>(w[nch + c], xv, 0.0f, F8 ? __ldg(su + c * NV / grp).x : 0.0f,
                                                            0.0f));
        }
        __syncwarp();
        if (lane == 0)
            mbar_arrive(&empty[s]);
        acc = warp_sum(acc);
        if (GLU)
            acc_u = warp_sum(acc_u);
        if (lane == 0) {
            const long gr = i0 + j;
            if (GLU) {
                a.m[0].y[gr] = (a.glu == 2 ? gelu_f(acc) : silu_f(acc)) * acc_u;
            } else {
                long off;
                const int k = gv_mat_of(a, gr, &off);
                float *y = a.m[k].y + (gr - off);
                *y = a.accumulate ? *y + acc : acc;
            }
        }
    }
}

static int ring_launches;
extern "C" int tcu_gemv_ring_count(void) { return ring_launches; }

// -1 when the launch does not suit the ring (not one token of bf16 or FP8
// weights, all of one kind, or no room for RG_MIN_SLOTS slots).
int gemv_ring(const tcu_gemv_args *a, long rows, cudaStream_t s, bool pdl)
{
    if (a->T != 1 || (a->glu && a->n != 2))
        return -1;
    const int kind = a->m[0].kind;
    if (kind != TCU_BF16 && kind != TCU_F8)
        return -1;
    for (int k = 1; k < a->n; k++)
        if (a->m[k].kind != kind || (kind == TCU_F8 && a->glu && a->m[k].group != a->m[0].group))
            return -1;
    static bool raised = false;
    if (!raised) {
        for (auto k : {gemv_ring_kernel<TCU_BF16, false>, gemv_ring_kernel<TCU_BF16, true>,
                       gemv_ring_kernel<TCU_F8, false>, gemv_ring_kernel<TCU_F8, true>})
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, RG_SMEM);
        raised = true;
    }
    const bool glu = a->glu != 0;
    const size_t xs = (size_t)(a->norm_g ? 2 : 1) * a->n_in * sizeof(float);
    const size_t ib = (size_t)a->n_in * (kind == TCU_F8 ? 1 : 2) * (glu ? 2 : 1);
    if (xs + RG_MIN_SLOTS * ib > RG_SMEM)
        return -1;
    int nslot = (int)((RG_SMEM - xs) / ib);
    if (nslot > RG_MAX_SLOTS)
        nslot = RG_MAX_SLOTS;
    if (nslot > RG_WARPS) /* a multiple of the consumer warps */
        nslot -= nslot % RG_WARPS;
    const long grid = rows < sm_count() ? rows : sm_count();
    const size_t smem = xs + (size_t)nslot * ib;
    ring_launches++;
    const dim3 g((unsigned)grid), b((RG_WARPS + 1) * WARP);
    if (kind == TCU_F8)
        return glu ? launch_pdl(pdl, gemv_ring_kernel<TCU_F8, true>, g, b, smem, s, *a, nslot)
                   : launch_pdl(pdl, gemv_ring_kernel<TCU_F8, false>, g, b, smem, s, *a, nslot);
    return glu ? launch_pdl(pdl, gemv_ring_kernel<TCU_BF16, true>, g, b, smem, s, *a, nslot)
               : launch_pdl(pdl, gemv_ring_kernel<TCU_BF16, false>, g, b, smem, s, *a, nslot);
}
