/* Sampling on the device: when the model's backend keeps a forward's
 * outputs on the device (model_caps_get), a step starts the forward,
 * computes its rows' grammar masks while the device runs it, and finishes
 * it the cheapest way its rows allow - the device's masked argmax when
 * every output row is plain greedy (and past its min_tokens), the device's
 * sampler (with logprobs and the min_tokens stop set) when every row is
 * device-sampleable, else the logits come down for the host's sampler
 * (engine.c's step then samples as on the CPU, with the masks computed
 * here). Only the engine thread calls these. */
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"

int engine_device_init(tern_engine *e, int rows, tern_err *err)
{
    model_caps caps;
    model_caps_get(e->m, &caps);
    const char *gs = getenv("TERN_GPU_SAMPLING"); /* 0: the host samples (a developer's comparison) */
    if (!caps.device_argmax || (gs && !strcmp(gs, "0")))
        return 0;
    e->masks = malloc((size_t)rows * ((e->n_vocab + 31) / 32) * sizeof *e->masks);
    e->mask_on = malloc((size_t)rows);
    e->mask_bad = malloc((size_t)rows);
    e->ids = malloc((size_t)rows * sizeof *e->ids);
    if (!e->masks || !e->mask_on || !e->mask_bad || !e->ids || engine_masks_reserve(e) ||
        (caps.device_sample && (!(e->srows = malloc((size_t)rows * sizeof *e->srows)) ||
                                !(e->sres = malloc((size_t)rows * sizeof *e->sres))))) {
        engine_device_free(e);
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    }
    return 0;
}

void engine_device_free(tern_engine *e)
{
    free(e->masks);
    free(e->mask_on);
    free(e->mask_bad);
    free(e->ids);
    free(e->srows);
    free(e->sres);
    engine_masks_free(e);
    e->masks = NULL;
    e->mask_on = e->mask_bad = NULL;
    e->ids = NULL;
    e->srows = NULL;
    e->sres = NULL;
}

/* Whether the device's sampler can take r's output rows this step: its
 * distribution depends only on the logits, bias, penalties, min_tokens
 * stop set, mask and truncations, and so do its logprobs; a speculating
 * row is greedy (a sampled one needs p(d) of every position, and the
 * draft's q, for accept/reject: the host) and has no penalties (its K + 1
 * positions would each need the counts after the drafts before them). */
static int row_device_sampleable(const engine_req *r)
{
    const sample_params *p = &r->sp;
    int pen = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    return r->n_spec == 0 || (p->temperature == 0.0f && !pen);
}

/* Before its min_tokens: the row's stop set must be masked (sampler only). */
static int row_before_min(const engine_req *r) { return r->n_generated < r->min_tokens && r->n_min_ids > 0; }

int engine_device_mode(const tern_engine *e, int n_out)
{
    int greedy = 1;
    for (int j = 0; j < n_out; j++) {
        const engine_req *r = e->out_req[j];
        if (!r || (sample_params_is_greedy_plain(&r->sp) && !row_before_min(r)))
            continue;
        greedy = 0;
        if (!e->srows || !row_device_sampleable(r))
            return ENGINE_DEV_HOST;
    }
    return greedy ? ENGINE_DEV_ARGMAX : ENGINE_DEV_SAMPLE;
}

/* The device sampler's rows: each output row's parameters (a speculating
 * row's K + 1 positions share them, each with its own logprobs slot) and,
 * for a sampled row, its one uniform of this step from its own stream, as
 * sample_row would draw it; before min_tokens its stop set (rows that
 * speculate have none: min_tokens turns speculation off). */
static void sample_rows_fill(tern_engine *e, int n_out)
{
    const engine_req *r = NULL;
    for (int j = 0; j < n_out; j++) {
        dev_sample_row *d = &e->srows[j];
        if (e->out_req[j])
            r = e->out_req[j];
        if (!r) { /* not for a planned step: every row starts with its request */
            memset(d, 0, sizeof *d);
            continue;
        }
        const sample_params *p = &r->sp;
        d->temperature = p->temperature;
        d->top_k = p->top_k;
        d->top_p = p->top_p;
        d->min_p = p->min_p;
        d->bias = p->bias;
        d->n_bias = p->n_bias;
        d->u = e->out_req[j] && p->temperature > 0.0f ? sample_uniform(&e->out_req[j]->ss) : 0.0;
        d->rep = p->repetition_penalty;
        d->pres = p->presence_penalty;
        d->freq = p->frequency_penalty;
        d->pen_ids = r->ss.seen_ids; /* NULL without penalties */
        d->n_pen = r->ss.seen_ids ? r->ss.n_seen : 0;
        d->count = r->ss.out_count;
        d->stop = r->min_ids;
        d->n_stop = r->n_spec == 0 && row_before_min(r) ? r->n_min_ids : 0;
        d->lp = p->n_logprobs >= 0 ? &e->sres[j] : NULL;
        d->n_top = p->n_logprobs >= 0 ? p->n_logprobs : 0;
    }
}

int engine_device_forward(tern_engine *e, const fwd_batch *b, const struct model_lora *const *lora, int mode,
                          tern_err *err)
{
    int rc = model_forward_start_lora(e->m, &e->kv, b, lora, err);
    if (rc)
        return rc;
    engine_masks_ahead(e, b->n_out); /* masks.c: all rows together */
    if (mode == ENGINE_DEV_ARGMAX)
        return model_forward_argmax(e->m, e->masks, (e->n_vocab + 31) / 32, e->mask_on, e->ids, err);
    if (mode == ENGINE_DEV_SAMPLE) {
        sample_rows_fill(e, b->n_out);
        return model_forward_sample(e->m, e->srows, e->masks, (e->n_vocab + 31) / 32, e->mask_on, e->ids, err);
    }
    return model_forward_logits(e->m, e->logits, err);
}

void engine_device_emit(tern_engine *e, engine_req *r, int j)
{
    if (e->mask_bad[j])
        engine_row_finish(e, r, ENGINE_FINISH_ERROR, "grammar: cannot compute the token mask");
    else if (e->ids[j] < 0)
        engine_row_finish(e, r, ENGINE_FINISH_ERROR, "no token is allowed at this position");
    else
        engine_row_emit(e, r, e->ids[j], e->srows && r->sp.n_logprobs >= 0 ? &e->sres[j] : NULL);
}
