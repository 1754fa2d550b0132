/* The CUDA backend's device mirror of a paged KV pool (backend_cuda_kv.c):
 * the host pool's layout byte for byte - per layer, the sink blocks' rows
 * then the regular blocks' rows, each row as kv_codec.c stores it - so a
 * block id means the same bytes on both sides, and what a launch of one
 * layer's attention or KV write takes (tcu_kv). Only with TERN_CUDA. */
#ifndef TERN_MODEL_BACKEND_CUDA_KV_H
#define TERN_MODEL_BACKEND_CUDA_KV_H

#ifdef TERN_CUDA

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/kv.h"
#include "tensor/cuda/cuda_kernels.h"

typedef struct cu_kvm {
    const kv_pool *host; /* the pool mirrored (NULL: none yet) */
    int n_layer, n_blocks, block_size, kv_dim, head_dim, n_sink;
    int typed;           /* some layer is not f32, or the pool has sink blocks */
    uint8_t *k, *v;      /* device storage: cu_kvm_bytes each (the caller's) */
    size_t bytes;        /* of k (and of v) */
    uint8_t *fmt;        /* [n_layer][2] each layer's type and sink type (a pool made anew at the same
                            address and shape but other types is not the same mirror) */
    size_t *off;         /* [n_layer] byte offset of layer l in k and in v */
    tcu_kv *layers;      /* [n_layer] what a launch of layer l takes */
} cu_kvm;

/* The KV types the device kernels read (a bit per kv_type): f32, bf16,
 * f16, q8, q4, r4. */
unsigned cu_kvm_types(void);
/* Bytes of device storage for kv's K (and as many for V). */
size_t cu_kvm_bytes(const kv_pool *kv);
/* m already mirrors kv in its current shape and types. */
int cu_kvm_matches(const cu_kvm *m, const kv_pool *kv);
/* m describes kv over device storage k, v (cu_kvm_bytes each): clears m's
 * table first. TERN_ENOMEM; TERN_EUNSUPPORTED for a type the kernels do
 * not read or a head above TCU_KV_HEAD_MAX. */
int cu_kvm_set(cu_kvm *m, const kv_pool *kv, void *k, void *v, tern_err *err);
/* Frees m's tables (not k, v) and zeroes it. */
void cu_kvm_clear(cu_kvm *m);
/* The tcu_kv of layer l. */
tcu_kv cu_kvm_layer(const cu_kvm *m, int l);
/* Queues block src -> dst over every layer (re-encoding between formats).
 * 0 or a cudaError_t. */
int cu_kvm_block_copy(const cu_kvm *m, int32_t dst, int32_t src, tcu_stream stream);
/* Queues the host pool's bytes of block blk of layer l (K and V) up to the
 * mirror (the table path). 0 or a cudaError_t. */
int cu_kvm_block_upload(const cu_kvm *m, const kv_pool *host, int l, int32_t blk, tcu_stream stream);

/* Mirrors of live pools that the forward of another pool displaced (a
 * device-KV pool has no other copy of its K/V): parked until their pool
 * comes back (cu_kvm_park_take) or is freed (kv_pool.dev_release, then
 * cu_kvm_park_take too), never dropped while the pool lives - beyond
 * CU_KVM_PARKED pools on one backend the oldest is. */
#define CU_KVM_PARKED 8
typedef struct cu_kvm_park {
    cu_kvm m[CU_KVM_PARKED];
    int n;
} cu_kvm_park;
/* Moves *cur (a mirror with storage) into the park and zeroes *cur. With
 * the park full the oldest mirror moves out to *dropped (its storage the
 * caller's to free; its pool's K/V are lost): returns 1 then, else 0. */
int cu_kvm_park_put(cu_kvm_park *pk, cu_kvm *cur, cu_kvm *dropped);
/* Moves the parked mirror of pool kv (same address; shape checked by the
 * caller with cu_kvm_matches) out to *out: 1, or 0 when none is parked. */
int cu_kvm_park_take(cu_kvm_park *pk, const kv_pool *kv, cu_kvm *out);
/* The parked mirror of pool kv (still parked), or NULL. */
const cu_kvm *cu_kvm_park_find(const cu_kvm_park *pk, const kv_pool *kv);

#endif
#endif
