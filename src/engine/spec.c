/* Speculative decoding inside the batch. Each step, the rows that speculate
 * get K drafted tokens - from a draft model run batched over those rows, or
 * by prompt lookup - and the target verifies them in the same forward as
 * every other row (engine.c feeds last token + drafts, K + 1 positions with
 * logits). spec_verify then walks the positions in order: greedy rows accept
 * while the target's choice equals the draft; sampled rows use the
 * accept/reject rule of Leviathan et al. / Chen et al. (accept d with
 * probability min(1, p(d)/q(d)), else draw from the normalized max(0, p - q)),
 * so the output distribution is exactly the target's. Grammar rows mask
 * every position with their matcher, which advances only on emitted tokens.
 * Their drafts are masked too: the draft proposes among the tokens the
 * row's grammar allows after the drafts before (the matcher advanced over
 * each draft, rolled back after the last), and a lookup's proposal ends at
 * the first token the grammar refuses - the verify step alone decides what
 * is emitted, so outputs are as without speculation, and acceptance no
 * longer falls to almost nothing on constrained rows.
 * Rejected positions are dropped by truncating the block table. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_int.h"

size_t spec_block_bytes(const tern_engine *e, int sink)
{
    if (!e->o.draft)
        return 0;
    const model_config *dc = model_config_get(e->o.draft);
    return kv_spec_block_bytes(&e->o.kv, dc->n_layer, dc->n_kv_head, dc->head_dim, KV_BLOCK_DEFAULT, sink);
}

int spec_init(tern_engine *e, tern_err *err)
{
    memset(&e->dkv, 0, sizeof e->dkv);
    if (e->n_draft == 0)
        return 0;
    e->probs = malloc((size_t)e->n_vocab * sizeof *e->probs);
    if (!e->probs)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    if (!e->o.draft)
        return 0;
    /* A view of the pool: same block ids, reference counts and free list;
     * the draft's own storage (its device mirror when its backend keeps
     * one, bound below). */
    int mb = e->o.max_batch > 0 ? e->o.max_batch : 1;
    e->d_logits = malloc((size_t)mb * e->n_vocab * sizeof *e->d_logits);
    e->d_masks = malloc((size_t)mb * ((e->n_vocab + 31) / 32) * sizeof *e->d_masks);
    e->d_mask_on = calloc((size_t)mb, 1);
    if (!e->d_logits || !e->d_masks || !e->d_mask_on)
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    model_caps caps;
    model_caps_get(e->o.draft, &caps);
    const model_config *dc = model_config_get(e->o.draft);
    int rc = model_kv_spec_check(e->o.draft, &e->o.kv, err);
    if (rc || (rc = kv_pool_view_init(&e->dkv, &e->kv, &e->o.kv, dc->n_layer, model_kv_dim(e->o.draft),
                                      dc->head_dim, !caps.device_kv, err)))
        return rc;
    if (caps.device_kv) /* the storage is the draft backend's device mirror */
        return model_kv_bind(e->o.draft, &e->dkv, err);
    return 0;
}

void spec_free(tern_engine *e)
{
    if (e->dkv.is_view) /* the view owns only its storage */
        kv_pool_free(&e->dkv);
    free(e->d_logits);
    free(e->d_masks);
    free(e->d_mask_on);
    free(e->probs);
    memset(&e->dkv, 0, sizeof e->dkv);
    e->d_logits = NULL;
    e->d_masks = NULL;
    e->d_mask_on = NULL;
    e->probs = NULL;
}

int spec_block_copy(tern_engine *e, int32_t dst, int32_t src)
{
    if (!e->o.draft)
        return 0;
    return kv_block_copy(&e->dkv, dst, src); /* host storage and/or the draft's device mirror */
}

/* Prompt lookup: the tokens that followed the latest earlier occurrence of
 * the row's last g tokens (g = 3, 2, 1). */
static int ngram_propose(const engine_req *r, int k_max, int32_t *out)
{
    int n = r->n_tokens;
    for (int g = n - 1 < 3 ? n - 1 : 3; g >= 1; g--) {
        const int32_t *suf = r->tokens + n - g;
        for (int i = n - g - 1; i >= 0; i--) {
            if (memcmp(r->tokens + i, suf, (size_t)g * sizeof *suf))
                continue;
            int k = 0;
            while (k < k_max && i + g + k < n) {
                out[k] = r->tokens[i + g + k];
                k++;
            }
            if (k > 0)
                return k;
        }
    }
    return 0;
}

/* The highest logit among the tokens mask allows (ties: the lowest id), -1
 * when none is allowed. */
static int32_t masked_argmax(const float *lg, const uint32_t *mask, int32_t n)
{
    int32_t best = -1;
    for (int32_t t = 0; t < n; t++)
        if ((mask[t >> 5] >> (t & 31) & 1u) && (best < 0 || lg[t] > lg[best]))
            best = t;
    return best;
}

/* A grammar row's proposal cut at the first token its grammar refuses
 * (the matcher walked over the rest and rolled back): the count kept, or
 * -1 when the matcher cannot be rolled back. */
static int grammar_cut(engine_req *r, int k)
{
    int adv = 0;
    while (adv < k && !r->cops->accept(r->cctx, r->draft[adv]))
        adv++;
    if (adv > 0 && r->cops->rollback(r->cctx, adv))
        return -1;
    return adv;
}

/* Runs the draft model over the rows' pending tokens; logits of each row's
 * last fed position land in e->d_logits[row]. When every row drafts
 * greedily and the draft's backend can, the device picks the argmax
 * instead - among the tokens of masks[row] where mask_on[row] (masks NULL:
 * no row has one): *ids is then set to the chosen ids (else NULL) and the
 * logits stay on the device. */
static int draft_forward(tern_engine *e, engine_req **rows, int n_rows, int first_iter, const uint32_t *masks,
                         const uint8_t *mask_on, const int32_t **ids)
{
    int n = 0, n_out = 0;
    for (int i = 0; i < n_rows; i++) {
        engine_req *r = rows[i];
        /* iteration 0 feeds the real tokens the draft has not seen (the
         * prompt tail was caught up in chunks before); later ones the
         * previous draft */
        int from = r->d_past, to = first_iter ? r->n_tokens : r->d_past + 1;
        for (int p = from; p < to; p++) {
            e->b_tok[n] = p < r->n_tokens ? r->tokens[p] : r->draft[p - r->n_tokens];
            e->b_pos[n] = p;
            e->b_seq[n] = &r->seq;
            n++;
        }
        r->d_past = to;
        e->b_out[n_out++] = n - 1;
    }
    fwd_batch b = {n, e->b_tok, e->b_pos, e->b_seq, n_out, e->b_out};
    model_caps caps;
    model_caps_get(e->o.draft, &caps);
    int greedy = e->ids && caps.device_argmax;
    for (int i = 0; greedy && i < n_rows; i++)
        greedy = rows[i]->sp.temperature == 0;
    *ids = NULL;
    if (!greedy)
        return model_forward(e->o.draft, &e->dkv, &b, e->d_logits, NULL);
    int rc = model_forward_start(e->o.draft, &e->dkv, &b, NULL);
    if (rc || (rc = model_forward_argmax(e->o.draft, masks, masks ? (e->n_vocab + 31) / 32 : 0,
                                         masks ? mask_on : NULL, e->ids, NULL)))
        return rc;
    *ids = e->ids;
    return 0;
}

/* Brings a row's draft KV up to n_tokens - 1 in chunks (new rows: the prompt). */
static int draft_catch_up(tern_engine *e, engine_req *r)
{
    while (r->n_tokens - 1 - r->d_past > 0) {
        int todo = r->n_tokens - 1 - r->d_past;
        if (todo > e->o.prefill_chunk)
            todo = e->o.prefill_chunk;
        for (int k = 0; k < todo; k++) {
            e->b_tok[k] = r->tokens[r->d_past + k];
            e->b_pos[k] = r->d_past + k;
            e->b_seq[k] = &r->seq;
        }
        fwd_batch b = {todo, e->b_tok, e->b_pos, e->b_seq, 0, NULL};
        if (model_forward(e->o.draft, &e->dkv, &b, NULL, NULL))
            return -1;
        r->d_past += todo;
    }
    return 0;
}

void spec_draft(tern_engine *e)
{
    engine_req *rows[e->o.max_batch > 0 ? e->o.max_batch : 1];
    int kk[e->o.max_batch > 0 ? e->o.max_batch : 1];
    int n_rows = 0, k_max = 0;
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        r->n_spec = 0;
        int left = r->max_tokens - r->n_generated;
        if (r->done || r->no_spec || r->n_tokens - r->n_past != 1 || left < 2)
            continue;
        int k = e->n_draft < left - 1 ? e->n_draft : left - 1;
        if (r->n_tokens + k + 1 > e->o.ctx_size)
            continue;
        if (!e->o.draft) {
            r->n_spec = ngram_propose(r, k, r->draft);
            if (r->cops && r->n_spec > 0 && (r->n_spec = grammar_cut(r, r->n_spec)) < 0) {
                r->n_spec = 0;
                engine_row_finish(e, r, ENGINE_FINISH_ERROR, "grammar: cannot roll back the matcher");
                continue;
            }
            r->n_drafted += r->n_spec;
            continue;
        }
        if (r->sp.temperature > 0 && !r->q && !(r->q = malloc((size_t)e->n_draft * e->n_vocab * sizeof *r->q)))
            continue;
        if (engine_reserve(e, r, r->n_tokens + k) || draft_catch_up(e, r))
            continue;
        rows[n_rows] = r;
        kk[n_rows++] = k;
        if (k > k_max)
            k_max = k;
    }
    /* K batched draft forwards over the rows still drafting; a grammar
     * row's matcher advances over each of its drafts (adv[i] of them),
     * rolled back at the end */
    int32_t nw = (e->n_vocab + 31) / 32;
    int adv[e->o.max_batch > 0 ? e->o.max_batch : 1];
    memset(adv, 0, sizeof adv);
    for (int j = 0; j < k_max; j++) {
        engine_req *act[e->o.max_batch > 0 ? e->o.max_batch : 1];
        int idx[e->o.max_batch > 0 ? e->o.max_batch : 1], n_act = 0, any_mask = 0;
        for (int i = 0; i < n_rows; i++)
            if (j < kk[i]) {
                idx[n_act] = i;
                act[n_act++] = rows[i];
            }
        for (int a = 0; a < n_act; a++) { /* the masks this position's drafts obey */
            engine_req *r = act[a];
            e->d_mask_on[a] = 0;
            if (!r->cops)
                continue;
            if (r->cops->fill_mask(r->cctx, e->d_masks + (size_t)a * nw, nw))
                kk[idx[a]] = j; /* no draft here: the verify step reports it */
            else
                e->d_mask_on[a] = any_mask = 1;
        }
        const int32_t *ids;
        if (draft_forward(e, act, n_act, j == 0, any_mask ? e->d_masks : NULL, e->d_mask_on, &ids)) {
            for (int i = 0; i < n_rows; i++)
                rows[i]->n_spec = 0; /* verify nothing; plain decoding this step */
            break;
        }
        for (int a = 0; a < n_act; a++) {
            engine_req *r = act[a];
            if (j >= kk[idx[a]])
                continue;
            float *lg = e->d_logits + (size_t)a * e->n_vocab;
            const uint32_t *mask = e->d_mask_on[a] ? e->d_masks + (size_t)a * nw : NULL;
            int32_t d;
            if (r->sp.temperature == 0) {
                d = ids ? ids[a] : mask ? masked_argmax(lg, mask, e->n_vocab) : sample_argmax(lg, e->n_vocab);
            } else { /* q: the row's own sampling distribution on the draft's logits (masked as p will be) */
                float *q = r->q + (size_t)j * e->n_vocab;
                d = sample_dist(&r->ss, &r->sp, lg, mask, q) ? -1 : sample_draw(&r->ss, q, e->n_vocab);
            }
            if (d < 0) { /* nothing allowed, or no distribution */
                kk[idx[a]] = j;
                continue;
            }
            r->draft[j] = d;
            r->n_spec = j + 1;
            if (r->cops && j + 1 < kk[idx[a]]) { /* the next draft's mask follows this one */
                if (r->cops->accept(r->cctx, d))
                    kk[idx[a]] = j + 1;
                else
                    adv[idx[a]]++;
            }
        }
    }
    for (int i = 0; i < n_rows; i++) {
        engine_req *r = rows[i];
        if (adv[i] > 0 && r->cops->rollback(r->cctx, adv[i])) {
            r->n_spec = 0;
            engine_row_finish(e, r, ENGINE_FINISH_ERROR, "grammar: cannot roll back the matcher");
            continue;
        }
        r->n_drafted += r->n_spec;
    }
}

static void verify_end(tern_engine *e, engine_req *r, int n, int a);

void spec_verify(tern_engine *e, engine_req *r, float *logits, const engine_premask *pm)
{
    int32_t V = e->n_vocab;
    int n = r->n_tokens, k = r->n_spec, a = 0;
    int greedy = r->sp.temperature == 0, want_lp = r->sp.n_logprobs >= 0;
    for (int i = 0; i <= k && !r->done; i++) {
        float *lg = logits + (size_t)i * V;
        const uint32_t *mask = NULL;
        if (engine_row_mask(e, r, pm, i, &mask))
            return;
        sample_result res = {0};
        int32_t t;
        int accepted = 0;
        if (greedy) {
            if (!mask && sample_params_is_greedy_plain(&r->sp))
                t = sample_argmax(lg, V);
            else if (sample_row(&r->ss, &r->sp, lg, mask, &res)) {
                engine_row_finish(e, r, ENGINE_FINISH_ERROR, "no token is allowed at this position");
                return;
            } else
                t = res.id;
            accepted = i < k && t == r->draft[i];
        } else {
            float *p = e->probs;
            if (sample_dist(&r->ss, &r->sp, lg, mask, p)) {
                engine_row_finish(e, r, ENGINE_FINISH_ERROR, "no token is allowed at this position");
                return;
            }
            if (i < k) {
                const float *q = e->o.draft ? r->q + (size_t)i * V : NULL;
                if (want_lp) /* the emitted token is distributed as p: keep it for logprobs */
                    memcpy(lg, p, (size_t)V * sizeof *p);
                t = sample_spec_step(&r->ss, p, q, r->draft[i], V, &accepted);
                if (want_lp)
                    sample_logprobs_from(lg, V, t, r->sp.n_logprobs, &res);
            } else {
                t = sample_draw(&r->ss, p, V);
                if (want_lp)
                    sample_logprobs_from(p, V, t, r->sp.n_logprobs, &res);
            }
        }
        engine_row_emit(e, r, t, want_lp ? &res : NULL);
        if (!accepted)
            break;
        a++;
        r->n_accepted++; /* counted here: the row may finish at the next emit */
        r->accepted_by_pos[i]++;
    }
    verify_end(e, r, n, a);
}

void spec_verify_ids(tern_engine *e, engine_req *r, const int32_t *ids, const uint8_t *bad, const sample_result *res)
{
    int n = r->n_tokens, k = r->n_spec, a = 0;
    for (int i = 0; i <= k && !r->done; i++) {
        if (bad[i]) {
            engine_row_finish(e, r, ENGINE_FINISH_ERROR, "grammar: cannot compute the token mask");
            return;
        }
        if (ids[i] < 0) {
            engine_row_finish(e, r, ENGINE_FINISH_ERROR, "no token is allowed at this position");
            return;
        }
        int accepted = i < k && ids[i] == r->draft[i];
        engine_row_emit(e, r, ids[i], res ? &res[i] : NULL);
        if (!accepted)
            break;
        a++;
        r->n_accepted++;
        r->accepted_by_pos[i]++;
    }
    verify_end(e, r, n, a);
}

/* After verification: n real tokens before the step, a drafts accepted. */
static void verify_end(tern_engine *e, engine_req *r, int n, int a)
{
    r->n_spec = 0;
    if (r->done)
        return;
    /* keep the KV of the real tokens: the last fed token and the accepted
     * drafts; everything after is dropped by a block-table edit */
    int keep = n + a;
    int before = r->seq.n_blocks;
    kv_seq_truncate(&e->kv, &r->seq, keep);
    r->n_past = keep;
    if (r->d_past > keep)
        r->d_past = keep;
    int freed = before - r->seq.n_blocks; /* they will be needed again later */
    r->blocks_committed += freed;
    e->kv_committed += freed;
}
