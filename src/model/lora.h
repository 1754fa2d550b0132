/* LoRA adapters in PEFT's format, applied per batch row: one forward can mix
 * rows of the base model and rows of several adapters (the S-LoRA / Punica
 * idea). An adapter is loaded against one base model (shapes checked then),
 * reference counted so requests can hold it while it is unloaded, and read
 * only by the forward. docs/lora.md has the design and the PEFT fields.
 *
 * Folder format (PEFT's save_pretrained):
 *   adapter_config.json      {"peft_type": "LORA", "r": 8, "lora_alpha": 16,
 *                             "target_modules": ["q_proj", ...],
 *                             "use_rslora": false, "rank_pattern": {},
 *                             "alpha_pattern": {}, ...}
 *   adapter_model.safetensors
 *     base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight [r][n_in]
 *     base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight [n_out][r]
 *     (likewise k/v/o_proj, mlp.gate/up/down_proj)
 * A target's output becomes W x + (B (A x)) * scale, with scale =
 * alpha / r, or alpha / sqrt(r) under rsLoRA (r and alpha per module from
 * rank_pattern / alpha_pattern when a key matches the module's name). */
#ifndef TERN_MODEL_LORA_H
#define TERN_MODEL_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"
#include "model/embed.h"
#include "model/model.h"

typedef struct model_lora model_lora;

/* The adapted products, in the order of a layer. */
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N_MOD };

/* Loads the PEFT adapter folder dir for base model m (borrowed; the adapter
 * must not outlive it). Every config field that changes the math is read or
 * refused: an unsupported one (DoRA, bias, modules_to_save, fan_in_fan_out,
 * a regular-expression target, ...) is TERN_EUNSUPPORTED naming the field; a
 * tensor whose shape does not fit the base, a missing one or one the config
 * does not explain is TERN_EFORMAT naming the tensor. The adapter starts
 * with one reference. NULL with err set on failure. */
model_lora *model_lora_load(tern_model *m, const char *dir, tern_err *err);
/* Another reference (a request holding the adapter). */
void model_lora_retain(model_lora *a);
/* Drops one reference; the last frees the adapter. NULL is a no-op. */
void model_lora_release(model_lora *a);

/* Largest rank among the adapter's modules. */
int model_lora_rank(const model_lora *a);
/* Bytes of f32 A and B matrices the adapter holds. */
size_t model_lora_bytes(const model_lora *a);
/* The adapter's content hash, never 0: its prefix-cache key (the same
 * adapter loaded twice, or in another process, has the same id). */
uint64_t model_lora_id(const model_lora *a);
/* Whether module mod of layer l is adapted. */
int model_lora_has(const model_lora *a, int l, int mod);

/* Whether m's backend runs adapters: the host forward and the CUDA
 * forward do; a device forward without adapter products says so
 * (TERN_EUNSUPPORTED). */
int model_lora_supported(const tern_model *m, tern_err *err);

/* model_forward_hidden with an adapter per batch row: lora[i] (borrowed)
 * is row i's adapter, NULL for the base (lora NULL: every row the base).
 * A row's logits do not depend on the other rows of the batch or their
 * adapters. TERN_EUNSUPPORTED when a row has an adapter and the backend
 * does not run them (model_lora_supported). */
int model_forward_lora(tern_model *m, kv_pool *kv, const fwd_batch *b, const model_lora *const *lora, float *logits,
                       const fwd_hidden *hid, tern_err *err);

/* model_forward_start (model.h) with an adapter per batch row, as
 * model_forward_lora: the device halves of an adapted forward. */
int model_forward_start_lora(tern_model *m, kv_pool *kv, const fwd_batch *b, const model_lora *const *lora,
                             tern_err *err);

/* Adds the adapter's update to row r of layer l's module mod as f32
 * (w_row[n_in] += scale * sum_k B[r][k] A[k][:], PEFT's merge), for
 * `tern convert --merge-lora`. A module the adapter leaves alone is
 * unchanged. */
void model_lora_merge_row(const model_lora *a, int l, int mod, int r, float *w_row);

/* PEFT's name of module mod ("q_proj", ...). */
const char *model_lora_mod_name(int mod);

#endif
