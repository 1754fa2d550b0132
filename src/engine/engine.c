/* The step loop (see engine.h). Each iteration:
 *   1. admit waiting requests while a row is free and their projected KV
 *      (prompt + max_tokens) fits the pool - queue rather than run out;
 *   2. plan one batch: every running row feeds its not-yet-computed tokens,
 *      prompts in chunks under a per-step prefill budget, decode rows 1 token;
 *   3. one model_forward over the whole batch;
 *   4. sample each row whose input is complete, emit text, check stops;
 *   5. retire finished rows (their blocks go to the prefix cache).
 * Only this thread touches the model, the KV pool and row state. */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/engine_int.h"

void engine_opts_default(engine_opts *o)
{
    memset(o, 0, sizeof *o);
    o->max_batch = 64;
    o->prefill_chunk = 512;
    o->max_queue = 1024;
    o->prefix_cache = 1;
}

void engine_params_default(engine_params *p)
{
    memset(p, 0, sizeof *p);
    sample_params_default(&p->sample);
    p->skip_special = 1;
}

static size_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    size_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %zu kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* ---- text: detokenize, hold back possible stop strings ---- */

static int hold_append(engine_req *r, const char *s, size_t n)
{
    if (r->hold_len + n + 1 > r->hold_cap) {
        size_t cap = r->hold_cap ? r->hold_cap : 64;
        while (cap < r->hold_len + n + 1)
            cap *= 2;
        char *nb = realloc(r->hold, cap);
        if (!nb)
            return TERN_ENOMEM;
        r->hold = nb;
        r->hold_cap = cap;
    }
    memcpy(r->hold + r->hold_len, s, n);
    r->hold_len += n;
    r->hold[r->hold_len] = '\0';
    return 0;
}

/* Moves the first n held bytes into a new string for an event. */
static char *hold_take(engine_req *r, size_t n, size_t *len)
{
    char *t = malloc(n + 1);
    if (!t) {
        *len = 0;
        return NULL;
    }
    if (n) /* hold is NULL until the first text */
        memcpy(t, r->hold, n);
    t[n] = '\0';
    if (r->hold_len > n)
        memmove(r->hold, r->hold + n, r->hold_len - n);
    r->hold_len -= n;
    *len = n;
    return t;
}

/* Where the earliest stop string starts in the held text (-1 if none), and
 * how many trailing bytes could still begin one. */
static long stop_find(const engine_req *r, size_t *keep_tail, size_t *stop_len)
{
    long best = -1;
    *keep_tail = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t sl = strlen(r->stop[i]);
        const char *p = memmem(r->hold, r->hold_len, r->stop[i], sl);
        if (p && (best < 0 || p - r->hold < best)) {
            best = p - r->hold;
            *stop_len = sl;
        }
        for (size_t k = sl - 1; k > *keep_tail; k--)
            if (k <= r->hold_len && !memcmp(r->hold + r->hold_len - k, r->stop[i], k)) {
                *keep_tail = k;
                break;
            }
    }
    return best;
}

/* ---- finishing ---- */

void engine_row_finish(tern_engine *e, engine_req *r, engine_finish why, const char *msg)
{
    engine_event ev = {0};
    ev.kind = ENGINE_EV_FINISH;
    ev.finish = why;
    if ((why == ENGINE_FINISH_STOP || why == ENGINE_FINISH_LENGTH) && !r->pool.mode) {
        /* nothing more will come: release held text (not a stop string) */
        const char *piece;
        size_t pl;
        if (r->detok && detok_flush(r->detok, &piece, &pl, NULL) == 0 && pl)
            hold_append(r, piece, pl);
        ev.text = hold_take(r, r->hold_len, &ev.text_len);
    }
    if (msg)
        snprintf(ev.error, sizeof ev.error, "%s", msg);
    if (r->pool.mode && why == ENGINE_FINISH_STOP) {
        ev.embedding = malloc((size_t)r->pool.dim * sizeof *ev.embedding);
        if (ev.embedding) {
            embed_pool_finish(&r->pool, r->embed_normalize, ev.embedding);
            ev.n_embedding = r->pool.dim;
        } else {
            ev.finish = ENGINE_FINISH_ERROR;
            snprintf(ev.error, sizeof ev.error, "out of memory for the embedding");
        }
    }
    ev.usage.n_prompt = r->n_prompt;
    ev.usage.n_cached = r->n_cached;
    ev.usage.n_generated = r->n_generated;
    ev.usage.ttft_s = r->started ? r->t_first - r->t_submit : 0;
    ev.usage.queue_s = r->t_admit > 0 ? r->t_admit - r->t_submit : -1;
    ev.usage.decode_s = r->started ? r->t_last - r->t_first : 0;
    ev.usage.n_drafted = r->n_drafted;
    ev.usage.n_accepted = r->n_accepted;
    ev.usage.n_target_forwards = r->n_target_forwards;
    ev.usage.n_jump = r->n_jump;
    memcpy(ev.usage.accepted_by_pos, r->accepted_by_pos, sizeof r->accepted_by_pos);

    /* Keep the computed KV for later prompts, up to the cache boundary
     * (not an embedding's: no KV is kept after one). */
    if (e->o.prefix_cache && why != ENGINE_FINISH_ERROR && !r->pool.mode) {
        int n = r->n_past;
        if (r->cache_boundary > 0 && r->cache_boundary < n)
            n = r->cache_boundary;
        e->pc.salt = r->lora ? model_lora_id(r->lora) : 0; /* an adapter's KV is its own */
        pcache_insert(&e->pc, &r->seq, r->tokens, n);
        e->pc.salt = 0;
    }
    kv_seq_free(&e->kv, &r->seq);
    e->kv_committed -= r->blocks_committed;
    r->blocks_committed = 0;
    sample_state_free(&r->ss);
    embed_pool_free(&r->pool);
    free(r->q);
    r->q = NULL;
    detok_free(r->detok);
    r->detok = NULL;
    if (r->cops) {
        r->cops->free(r->cctx);
        r->cops = NULL;
    }
    pthread_mutex_lock(&e->mu);
    e->st.requests_finished++;
    e->st.spec_drafted += r->n_drafted;
    e->st.spec_accepted += r->n_accepted;
    e->st.spec_target_forwards += r->n_target_forwards;
    e->st.jump_tokens += r->n_jump;
    if (why == ENGINE_FINISH_CANCELLED)
        e->st.requests_cancelled++;
    if (r->started) {
        e->st.last_ttft_s = ev.usage.ttft_s;
        e->st.last_decode_tps = ev.usage.decode_s > 0 ? (r->n_generated - 1) / ev.usage.decode_s : 0;
    }
    pthread_mutex_unlock(&e->mu);
    r->done = 1;
    req_push_event(r, &ev);
}

/* ---- admission ---- */

static int blocks_for(const tern_engine *e, int n_tokens)
{
    return (n_tokens + e->kv.block_size - 1) / e->kv.block_size;
}

/* Projected blocks for a request: the whole context it may reach, plus one
 * for a copy-on-write of a shared last prefix block. */
static int projected_blocks(const tern_engine *e, const engine_req *r)
{
    int total = r->n_prompt + r->max_tokens + (r->no_spec ? 0 : e->n_draft); /* drafts run past the end */
    if (total > e->o.ctx_size)
        total = e->o.ctx_size;
    return blocks_for(e, total) + 1;
}

/* Tries to start r; 1 if admitted, 0 if it must wait. */
static int admit(tern_engine *e, engine_req *r)
{
    int need = projected_blocks(e, r);
    int avail = e->kv.n_free + pcache_evictable(&e->pc) - e->kv_committed;
    if (need > avail)
        return 0;
    tern_err err = {0};
    if (e->o.prefix_cache && !r->pool.mode) {
        /* keep at least the last prompt token to compute its logits */
        int n_disk = 0;
        e->pc.salt = r->lora ? model_lora_id(r->lora) : 0;
        int m = pcache_match(&e->pc, &r->seq, r->tokens, r->n_prompt - 1, &n_disk);
        e->pc.salt = 0;
        r->n_cached = r->n_past = m;
        pthread_mutex_lock(&e->mu);
        e->st.kv_disk_hit_tokens += n_disk;
        e->st.kv_mem_hit_tokens += m - n_disk;
        pthread_mutex_unlock(&e->mu);
    }
    r->t_admit = tern_time_s();
    int have = r->seq.n_blocks;
    r->blocks_committed = need - have > 0 ? need - have : 0;
    e->kv_committed += r->blocks_committed;
    if (r->pool.mode) { /* an embedding: nothing to sample or detokenize */
        if (embed_pool_init(&r->pool, r->pool.mode, r->pool.dim)) {
            engine_row_finish(e, r, ENGINE_FINISH_ERROR, "out of memory for the embedding");
            req_unref(r);
            return 1;
        }
    } else if (sample_state_init(&r->ss, &r->sp, e->n_vocab, r->tokens, (size_t)r->n_prompt, &err) ||
               !(r->detok = detok_new(e->tok, r->tokens, (size_t)r->n_prompt, r->skip_special, &err))) {
        engine_row_finish(e, r, ENGINE_FINISH_ERROR, err.msg);
        req_unref(r);
        return 1;
    }
    e->running[e->n_running++] = r;
    pthread_mutex_lock(&e->mu);
    e->st.prefix_hit_tokens += r->n_cached;
    pthread_mutex_unlock(&e->mu);
    return 1;
}

/* Reserves KV for positions [0, n) of r, evicting cached blocks if needed.
 * A shared block that gets a private copy has its draft part copied too. */
int engine_reserve(tern_engine *e, engine_req *r, int n)
{
    int need = kv_seq_blocks_needed(&e->kv, &r->seq, n);
    if (need > e->kv.n_free)
        pcache_evict(&e->pc, need);
    int before = e->kv.n_free, first = r->seq.n_tokens / e->kv.block_size;
    int32_t old[64];
    int n_old = 0;
    if (e->o.draft)
        for (int b = first; b < r->seq.n_blocks && n_old < 64; b++)
            old[n_old++] = r->seq.blocks[b];
    int rc = kv_seq_reserve(&e->kv, &r->seq, n, NULL);
    if (rc == 0 || rc == TERN_EIO) { /* EIO (a failed device copy): the table changed all the same */
        for (int i = 0; i < n_old && first + i < r->seq.n_blocks; i++)
            if (r->seq.blocks[first + i] != old[i] && spec_block_copy(e, r->seq.blocks[first + i], old[i]))
                rc = TERN_EIO;
        int took = before - e->kv.n_free;
        int c = took < r->blocks_committed ? took : r->blocks_committed;
        r->blocks_committed -= c;
        e->kv_committed -= c;
    }
    return rc;
}

/* ---- one step ---- */

static void emit_token(tern_engine *e, engine_req *r, int32_t id, const sample_result *res)
{
    engine_event ev = {0};
    ev.kind = ENGINE_EV_TOKEN;
    ev.token = id;
    if (r->sp.n_logprobs >= 0 && res) {
        ev.has_logprob = 1;
        ev.lp = *res;
    }
    const char *piece = NULL;
    size_t pl = 0;
    int is_eos = 0;
    if (!r->ignore_eos) {
        const model_config *c = model_config_get(e->m);
        for (int i = 0; i < c->n_eos; i++)
            is_eos |= id == c->eos_ids[i];
    }
    for (int i = 0; i < r->n_stop_ids; i++)
        is_eos |= id == r->stop_ids[i];
    if (!is_eos && detok_push(r->detok, id, &piece, &pl, NULL) == 0 && pl)
        hold_append(r, piece, pl);
    size_t tail = 0, stop_len = 0;
    /* before min_tokens no stop string is matched (vLLM) */
    long at = r->n_stop && r->n_generated >= r->min_tokens ? stop_find(r, &tail, &stop_len) : -1;
    if (at >= 0) {
        ev.text = hold_take(r, (size_t)at + (r->include_stop_str ? stop_len : 0), &ev.text_len);
        r->hold_len = 0; /* the stop string and anything after it is dropped */
        req_push_event(r, &ev);
        engine_row_finish(e, r, ENGINE_FINISH_STOP, NULL);
        return;
    }
    ev.text = hold_take(r, r->hold_len - tail, &ev.text_len);
    req_push_event(r, &ev);
    if (is_eos)
        engine_row_finish(e, r, ENGINE_FINISH_STOP, NULL);
    else if (r->cops && r->cops->is_terminated(r->cctx))
        engine_row_finish(e, r, ENGINE_FINISH_STOP, NULL);
    else if ((r->max_tokens > 0 && r->n_generated >= r->max_tokens) || r->n_tokens >= e->o.ctx_size)
        engine_row_finish(e, r, ENGINE_FINISH_LENGTH, NULL);
}

/* Appends the tokens of the text the grammar forces next (jump-forward):
 * no sampling, and the next step feeds them as one multi-token chunk. */
static void jump_forward(tern_engine *e, engine_req *r)
{
    char buf[256];
    size_t n = r->cops->jump_forward(r->cctx, buf, sizeof buf);
    if (n == 0)
        return;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tokenizer_encode(e->tok, buf, n, 0, &ids, &n_ids, NULL) == 0)
        for (size_t i = 0; i < n_ids && !r->done; i++) {
            if (r->n_tokens >= r->cap_tokens || r->cops->accept(r->cctx, ids[i]))
                break; /* the grammar takes only whole forced tokens */
            sample_state_accept(&r->ss, ids[i]);
            r->tokens[r->n_tokens++] = ids[i];
            r->n_generated++;
            r->n_jump++;
            emit_token(e, r, ids[i], NULL);
        }
    free(ids);
}

void engine_row_emit(tern_engine *e, engine_req *r, int32_t id, const sample_result *res)
{
    if (r->cops && r->cops->accept(r->cctx, id)) {
        engine_row_finish(e, r, ENGINE_FINISH_ERROR, "grammar rejected the sampled token");
        return;
    }
    sample_state_accept(&r->ss, id);
    double now = tern_time_s();
    if (!r->started) {
        r->started = 1;
        r->t_first = now;
    }
    r->t_last = now;
    r->tokens[r->n_tokens++] = id;
    r->n_generated++;
    emit_token(e, r, id, res);
    if (!r->done && e->o.grammar_jump && r->cops && r->cops->jump_forward && r->sp.n_logprobs < 0 && r->n_spec == 0)
        jump_forward(e, r);
}

int engine_row_mask(tern_engine *e, engine_req *r, const engine_premask *pm, int i, const uint32_t **mask)
{
    int32_t nw = (e->n_vocab + 31) / 32;
    *mask = NULL;
    if (!r->cops)
        return 0;
    if (pm && pm->on[i]) {
        *mask = pm->masks + (size_t)i * nw;
        return 0;
    }
    if ((pm && pm->bad[i]) || r->cops->fill_mask(r->cctx, e->mask, nw)) {
        engine_row_finish(e, r, ENGINE_FINISH_ERROR, "grammar: cannot compute the token mask");
        return -1;
    }
    *mask = e->mask;
    return 0;
}

/* Before min_tokens: EOS and the stop ids (r->min_ids) cannot be sampled;
 * the device sampler masks the same list (device.c). */
static void min_tokens_suppress(engine_req *r, float *logits)
{
    if (r->n_generated >= r->min_tokens)
        return;
    for (int i = 0; i < r->n_min_ids; i++)
        logits[r->min_ids[i]] = -INFINITY;
}

/* r->min_ids: the ids min_tokens masks - the model's EOS ids within the
 * vocabulary (unless ignore_eos), then the request's stop ids. */
static int min_ids_build(tern_engine *e, engine_req *r)
{
    const model_config *c = model_config_get(e->m);
    int n = r->ignore_eos ? 0 : c->n_eos;
    if (r->min_tokens <= 0 || n + r->n_stop_ids == 0)
        return 0;
    if (!(r->min_ids = malloc((size_t)(n + r->n_stop_ids) * sizeof *r->min_ids)))
        return TERN_ENOMEM;
    for (int i = 0; i < n; i++)
        if (c->eos_ids[i] >= 0 && c->eos_ids[i] < e->n_vocab)
            r->min_ids[r->n_min_ids++] = c->eos_ids[i];
    for (int i = 0; i < r->n_stop_ids; i++)
        r->min_ids[r->n_min_ids++] = r->stop_ids[i];
    return 0;
}

/* Samples the row's next token from its logits and emits it. */
static void sample_and_emit(tern_engine *e, engine_req *r, float *logits, const engine_premask *pm)
{
    sample_result res = {0};
    int32_t id;
    const uint32_t *mask = NULL;
    min_tokens_suppress(r, logits);
    if (engine_row_mask(e, r, pm, 0, &mask))
        return;
    if (!mask && sample_params_is_greedy_plain(&r->sp)) {
        id = sample_argmax(logits, e->n_vocab);
    } else {
        if (sample_row(&r->ss, &r->sp, logits, mask, &res)) {
            engine_row_finish(e, r, ENGINE_FINISH_ERROR, "no token is allowed at this position");
            return;
        }
        id = res.id;
    }
    engine_row_emit(e, r, id, &res);
}

/* Removes finished rows from running[] and drops the engine's reference. */
static void drop_done(tern_engine *e)
{
    for (int i = 0; i < e->n_running;) {
        engine_req *r = e->running[i];
        if (r->done) {
            e->running[i] = e->running[--e->n_running];
            req_unref(r);
        } else {
            i++;
        }
    }
}

/* Pools the step's hidden rows into their embedding requests and finishes
 * the requests whose every position is now computed. */
static void embed_rows_finish(tern_engine *e, int n_hid)
{
    int dim = model_hidden_dim(e->m);
    for (int j = 0; j < n_hid; j++)
        if (!e->hid_req[j]->done)
            embed_pool_add(&e->hid_req[j]->pool, e->hidden + (size_t)j * dim);
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        if (r->pool.mode && !r->done && r->n_past >= r->n_tokens)
            engine_row_finish(e, r, ENGINE_FINISH_STOP, NULL);
    }
}

static void step(tern_engine *e)
{
    /* cancellations first: they free rows and KV */
    for (int i = 0; i < e->n_running; i++)
        if (atomic_load(&e->running[i]->cancel))
            engine_row_finish(e, e->running[i], ENGINE_FINISH_CANCELLED, NULL);
    drop_done(e);
    if (e->n_draft > 0)
        spec_draft(e); /* sets n_spec (and the drafts) of the rows that speculate */
    int n = 0, n_out = 0, n_hid = 0, n_lora = 0, budget = e->o.prefill_chunk;
    tern_err err = {0};
    for (int i = 0; i < e->n_running; i++) {
        engine_req *r = e->running[i];
        if (r->done)
            continue;
        int todo = r->n_tokens - r->n_past;
        if (todo > 1) { /* prompt or jump-forward text: a chunk under the step's prefill budget */
            if (budget <= 0)
                continue;
            if (todo > budget)
                todo = budget;
            budget -= todo;
        }
        if (engine_reserve(e, r, r->n_past + todo + r->n_spec)) {
            /* cannot happen when admission holds; fail the row, not the engine */
            engine_row_finish(e, r, ENGINE_FINISH_ERROR, "kv cache exhausted");
            continue;
        }
        for (int k = 0; k < todo; k++) {
            e->b_tok[n] = r->tokens[r->n_past + k];
            e->b_pos[n] = r->n_past + k;
            e->b_seq[n] = &r->seq;
            e->b_lora[n] = r->lora;
            n_lora += r->lora != NULL;
            n++;
        }
        if (r->pool.mode) { /* an embedding: the hidden states its pooling reads, no logits */
            for (int k = 0; k < todo; k++)
                if (embed_pool_wants(r->pool.mode, r->n_past + k, r->n_tokens)) {
                    e->b_hid[n_hid] = n - todo + k;
                    e->hid_req[n_hid++] = r;
                }
            r->n_past += todo;
            continue;
        }
        r->n_past += todo;
        r->n_target_forwards++;
        if (r->n_past < r->n_tokens)
            continue;
        /* verification rows: the drafts follow the last real token, and every
         * one of the K + 1 positions gets logits */
        for (int k = 0; k < r->n_spec; k++) {
            e->b_tok[n] = r->draft[k];
            e->b_pos[n] = r->n_past + k;
            e->b_seq[n] = &r->seq;
            e->b_lora[n] = r->lora; /* the target verifies under the row's adapter */
            n++;
        }
        for (int k = 0; k <= r->n_spec; k++) {
            e->b_out[n_out] = n - 1 - r->n_spec + k;
            e->out_req[n_out++] = k == 0 ? r : NULL;
        }
    }
    if (n == 0)
        return;
    fwd_batch b = {n, e->b_tok, e->b_pos, e->b_seq, n_out, e->b_out};
    fwd_hidden hid = {n_hid, e->b_hid, e->hidden};
    /* on a device (e->ids set): masks overlap the forward; steps whose rows
     * the device can sample sample there */
    int dev = e->ids != NULL, mode = dev ? engine_device_mode(e, n_out) : ENGINE_DEV_HOST;
    int rc = dev ? engine_device_forward(e, &b, n_lora ? e->b_lora : NULL, mode, &err)
                 : model_forward_lora(e->m, &e->kv, &b, n_lora ? e->b_lora : NULL, e->logits, &hid, &err);
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.tokens_prefilled += n - n_out;
    e->st.tokens_decoded += n_out;
    pthread_mutex_unlock(&e->mu);
    if (rc) { /* a forward error fails every row of the step */
        for (int i = 0; i < e->n_running; i++)
            if (!e->running[i]->done)
                engine_row_finish(e, e->running[i], ENGINE_FINISH_ERROR, err.msg);
    } else {
        /* on the host, several constrained rows: their masks together
         * (masks.c) before the rows sample */
        int pre = dev;
        if (!dev && engine_masks_count(e, n_out) >= 2 && !engine_masks_reserve(e)) {
            engine_masks_ahead(e, n_out);
            pre = 1;
        }
        for (int j = 0; j < n_out; j++) {
            engine_req *r = e->out_req[j];
            if (!r)
                continue;
            float *lg = e->logits + (size_t)j * e->n_vocab;
            engine_premask pm = {pre ? e->masks + (size_t)j * ((e->n_vocab + 31) / 32) : NULL,
                                 pre ? e->mask_on + j : NULL, pre ? e->mask_bad + j : NULL};
            if (mode != ENGINE_DEV_HOST && r->n_spec > 0)
                spec_verify_ids(e, r, e->ids + j, e->mask_bad + j,
                                mode == ENGINE_DEV_SAMPLE && r->sp.n_logprobs >= 0 ? e->sres + j : NULL);
            else if (mode != ENGINE_DEV_HOST)
                engine_device_emit(e, r, j);
            else if (r->n_spec > 0)
                spec_verify(e, r, lg, pre ? &pm : NULL);
            else
                sample_and_emit(e, r, lg, pre ? &pm : NULL);
        }
        embed_rows_finish(e, n_hid);
    }
    drop_done(e);
}

/* ---- the thread ---- */

/* The KV pool and prefix cache belong to this thread; their gauges reach
 * engine_stats_get through e->st (caller holds e->mu). */
static void publish_kv_gauges(tern_engine *e)
{
    e->st.kv_blocks_used = e->kv.n_blocks - e->kv.n_free;
    e->st.kv_blocks_cached = e->pc.n;
    e->st.kv_mem_cached_bytes = (size_t)e->pc.n * e->block_bytes;
    e->st.kv_mem_lookup_s = e->pc.mem_lookup_s;
    e->st.kv_mem_insert_s = e->pc.mem_insert_s;
}

static void *engine_main(void *arg)
{
    tern_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop && e->n_waiting == 0 && e->n_running == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->stop) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        /* Admit in arrival order; the head waits until its KV fits. Only
         * this thread removes from the queue, so the head is stable. */
        while (e->n_waiting > 0 && e->n_running < e->o.max_batch) {
            engine_req *r = e->waiting[0];
            pthread_mutex_unlock(&e->mu);
            int ok = 1;
            if (atomic_load(&r->cancel)) {
                engine_row_finish(e, r, ENGINE_FINISH_CANCELLED, NULL);
                req_unref(r);
            } else {
                ok = admit(e, r);
            }
            pthread_mutex_lock(&e->mu);
            if (!ok)
                break;
            memmove(e->waiting, e->waiting + 1, (size_t)(--e->n_waiting) * sizeof *e->waiting);
        }
        e->st.queue_len = e->n_waiting;
        e->st.running = e->n_running;
        publish_kv_gauges(e);
        pthread_mutex_unlock(&e->mu);
        step(e);
        kv_events_flush(e->kv_ev);
        pthread_mutex_lock(&e->mu);
        e->st.running = e->n_running;
        publish_kv_gauges(e);
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* How many KV blocks of per_block bytes the pool gets: --kv-budget, or by
 * default no more than every row at full context - on the host within half
 * of free memory; on a device backend (*on_dev set: the pool lives in device
 * memory, the host keeps only the block bookkeeping) within what the device
 * has left once both models' weights and forward scratch for cap_tok tokens
 * and `rows` logits rows (reserved here) are there, less a reserve. At
 * least 2, or a negative error. */
/* The pool's blocks within the KV budget: n_blocks (returned) of which
 * *n_sink are 16-bit sink blocks (per_sink bytes each, the rest per_block):
 * with --kv-quant-start, enough for twice the running rows' starts (the
 * prefix cache keeps some), at most half the budget; a sequence that finds
 * none free takes a regular block. */
static int kv_plan(tern_engine *e, size_t per_block, size_t per_sink, int cap_tok, int rows, int *on_dev,
                   int *n_sink, tern_err *err)
{
    model_caps caps, dcaps = {0};
    model_caps_get(e->m, &caps);
    if (e->o.draft)
        model_caps_get(e->o.draft, &dcaps);
    *on_dev = caps.device_kv;
    size_t dev_free = 0, dev_total = 0;
    int rc, maxb = e->o.max_batch;
    if (*on_dev && dcaps.device_kv &&
        (rc = model_mem_reserve(e->o.draft, e->o.prefill_chunk + maxb, maxb, &dev_free, &dev_total, err)))
        return rc;
    if (*on_dev && (rc = model_mem_reserve(e->m, cap_tok, rows, &dev_free, &dev_total, err)))
        return rc;
    size_t budget = e->o.kv_budget_bytes;
    /* no more than every row at full context */
    size_t want = per_block * (size_t)((e->o.ctx_size + KV_BLOCK_DEFAULT - 1) / KV_BLOCK_DEFAULT + 1) *
                  (size_t)e->o.max_batch;
    if (*on_dev) {
        /* keep a reserve for the runtime, graphs and library workspaces */
        size_t margin = ((size_t)256 << 20) + dev_total / 50;
        size_t room = dev_free > margin ? dev_free - margin : 0;
        if (budget == 0) {
            budget = want < room ? want : room;
        } else if (budget > room) {
            return tern_err_set(err, TERN_ENOMEM,
                                "the KV budget (%.2f GB) does not fit in GPU memory: %.2f GB free after the weights, "
                                "%.2f GB of it kept in reserve; lower --kv-budget (or leave it out to use what fits)",
                                budget / 1073741824.0, dev_free / 1073741824.0, margin / 1073741824.0);
        }
    } else if (budget == 0) {
        /* half of free memory */
        budget = mem_available() / 2;
        if (budget > want || budget == 0)
            budget = want;
    }
    *n_sink = 0;
    int qs = e->o.kv.quant_start;
    if (qs > 0 && per_sink != per_block) {
        size_t want_sink = (size_t)2 * e->o.max_batch * (size_t)((qs + KV_BLOCK_DEFAULT - 1) / KV_BLOCK_DEFAULT);
        size_t cap_sink = budget / 2 / per_sink;
        *n_sink = (int)(want_sink < cap_sink ? want_sink : cap_sink);
        budget -= (size_t)*n_sink * per_sink;
    }
    size_t n_reg = budget / per_block;
    int n_blocks = n_reg + *n_sink > (size_t)1 << 30 ? 1 << 30 : (int)(n_reg + *n_sink);
    if (n_blocks < 2)
        return tern_err_set(err, TERN_ERANGE, "KV budget of %zu bytes holds less than 2 blocks of %d positions%s",
                            budget, KV_BLOCK_DEFAULT, *on_dev ? " (GPU memory is full)" : "");
    return n_blocks;
}

/* Opens the prefix cache's disk tier for the pool (and the draft's view),
 * under a fingerprint of the model, its config and the KV layout; a
 * directory that cannot be used is one warning and no tier. */
static void disk_open(tern_engine *e)
{
    kvdisk_opts o = {0};
    o.dir = e->o.kv_disk_dir;
    o.budget_bytes = e->o.kv_disk_budget_bytes ? e->o.kv_disk_budget_bytes : (size_t)10 << 30;
    o.zstd_level = e->o.kv_disk_zstd;
    o.pools[o.n_pools++] = &e->kv;
    if (e->o.draft)
        o.pools[o.n_pools++] = &e->dkv;
    const model_config *c = model_config_get(e->m);
    uint64_t id = e->o.kv_disk_model_id;
    if (e->o.draft) { /* the draft's part of each block depends on it too */
        const model_config *dc = model_config_get(e->o.draft);
        id ^= kvdisk_fingerprint(0, dc, sizeof *dc, "draft", NULL, 0);
    }
    char kv_desc[1024]; /* the KV types per layer and the 16-bit start */
    kv_spec_describe(&e->o.kv, c->n_layer, kv_desc, sizeof kv_desc);
    o.fingerprint = kvdisk_fingerprint(id, c, sizeof *c, kv_desc, o.pools, o.n_pools);
    tern_err err = {0};
    e->disk = kvdisk_open(&o, &err);
    if (!e->disk) {
        TERN_WARN("%s; serving continues without the disk tier", err.msg);
        return;
    }
    pcache_disk_set(&e->pc, e->disk);
    kvdisk_stats st;
    kvdisk_stats_get(e->disk, &st);
    TERN_INFO("kv-disk: %lld blocks (%.1f MB of %.1f MB) in %s/%016llx%s", st.n_blocks, st.bytes_used / 1048576.0,
              st.budget_bytes / 1048576.0, e->o.kv_disk_dir, (unsigned long long)o.fingerprint,
              st.torn ? ", partial writes deleted" : "");
}

/* Frees the pools and scratch of e and e itself (the thread is gone). */
static void engine_free_memory(tern_engine *e)
{
    pcache_free(&e->pc); /* flushes to the disk tier: before the draft's KV goes */
    kvdisk_close(e->disk);
    spec_free(e);
    kv_events_src_free(e->kv_ev); /* the last batch (AllBlocksCleared) goes out */
    kv_pool_free(&e->kv);
    free(e->waiting);
    free(e->running);
    free(e->b_tok);
    free(e->b_pos);
    free(e->b_seq);
    free(e->b_lora);
    free(e->b_out);
    free(e->out_req);
    free(e->logits);
    free(e->mask);
    engine_device_free(e);
    free(e->b_hid);
    free(e->hid_req);
    free(e->hidden);
    free(e);
}

tern_engine *engine_new(tern_model *m, const tern_tokenizer *tok, const engine_opts *o, tern_err *err)
{
    tern_engine *e = calloc(1, sizeof *e);
    if (!e) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    e->m = m;
    e->tok = tok;
    e->o = *o;
    const model_config *c = model_config_get(m);
    e->n_vocab = c->n_vocab;
    if (e->o.max_batch <= 0)
        e->o.max_batch = 64;
    if (e->o.prefill_chunk <= 0)
        e->o.prefill_chunk = 512;
    if (e->o.max_queue <= 0)
        e->o.max_queue = 1024;
    if (e->o.ctx_size <= 0 || e->o.ctx_size > c->max_pos)
        e->o.ctx_size = c->max_pos;
    e->n_draft = 0;
    if (e->o.draft || e->o.spec_ngram) {
        e->n_draft = e->o.n_draft > 0 ? e->o.n_draft : 4;
        if (e->n_draft > ENGINE_MAX_DRAFT)
            e->n_draft = ENGINE_MAX_DRAFT;
    }
    if (e->o.draft) {
        const model_config *dc = model_config_get(e->o.draft);
        if (dc->n_vocab != c->n_vocab) {
            tern_err_set(err, TERN_EINVAL, "the draft model's vocabulary (%d) differs from the target's (%d)",
                         dc->n_vocab, c->n_vocab);
            free(e);
            return NULL;
        }
    }
    if (!e->o.kv_type_given)
        e->o.kv.type = model_kv_type_default(m);
    if (model_kv_spec_check(m, &e->o.kv, err)) {
        free(e);
        return NULL;
    }
    /* real bytes per block: the regular blocks, and the 16-bit sink blocks
     * that hold positions below --kv-quant-start */
    size_t per_block = kv_spec_block_bytes(&e->o.kv, c->n_layer, c->n_kv_head, c->head_dim, KV_BLOCK_DEFAULT, 0) +
                       spec_block_bytes(e, 0);
    size_t per_sink = kv_spec_block_bytes(&e->o.kv, c->n_layer, c->n_kv_head, c->head_dim, KV_BLOCK_DEFAULT, 1) +
                      spec_block_bytes(e, 1);
    int maxb = e->o.max_batch, rows = maxb * (e->n_draft + 1), cap_tok = e->o.prefill_chunk + rows;
    int on_dev = 0, n_sink = 0, n_blocks = kv_plan(e, per_block, per_sink, cap_tok, rows, &on_dev, &n_sink, err);
    if (n_blocks < 0) {
        free(e);
        return NULL;
    }
    if (model_kv_pool_init(m, &e->kv, &e->o.kv, KV_BLOCK_DEFAULT, n_blocks, n_sink, !on_dev, err) ||
        (on_dev && model_kv_bind(m, &e->kv, err)) || pcache_init(&e->pc, &e->kv, err) || spec_init(e, err))
        goto fail;
    if (e->o.kv_events && !(e->pc.events = e->kv_ev = kv_events_src_new(e->o.kv_events, e->o.kv_events_topic,
                                                                        KV_BLOCK_DEFAULT, on_dev ? "GPU" : "CPU"))) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    e->block_bytes = per_block;
    if (e->o.kv_disk_dir && e->o.prefix_cache)
        disk_open(e);
    e->waiting = calloc((size_t)e->o.max_queue, sizeof *e->waiting);
    e->running = calloc((size_t)maxb, sizeof *e->running);
    e->b_tok = malloc((size_t)cap_tok * sizeof *e->b_tok);
    e->b_pos = malloc((size_t)cap_tok * sizeof *e->b_pos);
    e->b_seq = malloc((size_t)cap_tok * sizeof *e->b_seq);
    e->b_lora = malloc((size_t)cap_tok * sizeof *e->b_lora);
    e->b_out = malloc((size_t)rows * sizeof *e->b_out);
    e->out_req = malloc((size_t)rows * sizeof *e->out_req);
    e->logits = malloc((size_t)rows * e->n_vocab * sizeof *e->logits);
    e->mask = malloc((size_t)((e->n_vocab + 31) / 32) * sizeof *e->mask);
    if (!e->waiting || !e->running || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_lora || !e->b_out || !e->out_req ||
        !e->logits || !e->mask) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto fail;
    }
    if (model_hidden_supported(m)) {
        e->b_hid = malloc((size_t)cap_tok * sizeof *e->b_hid);
        e->hid_req = malloc((size_t)cap_tok * sizeof *e->hid_req);
        e->hidden = malloc((size_t)cap_tok * model_hidden_dim(m) * sizeof *e->hidden);
        if (!e->b_hid || !e->hid_req || !e->hidden) {
            tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto fail;
        }
    }
    if (engine_device_init(e, rows, err))
        goto fail;
    e->st.kv_blocks_total = n_blocks;
    e->st.kv_bytes_total = (size_t)(n_blocks - n_sink) * per_block + (size_t)n_sink * per_sink;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    if (pthread_create(&e->th, NULL, engine_main, e) != 0) {
        tern_err_set(err, TERN_ENOMEM, "cannot start the engine thread");
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        goto fail;
    }
    TERN_INFO("engine: %d KV blocks (%zu MB%s), batch %d, context %d%s", n_blocks, e->st.kv_bytes_total >> 20,
              on_dev ? " of GPU memory" : "", maxb, e->o.ctx_size, e->srows ? ", sampling on the device"
              : e->ids ? ", greedy sampling on the device" : "");
    return e;
fail:
    engine_free_memory(e);
    return NULL;
}

void engine_free(tern_engine *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    for (int i = 0; i < e->n_running; i++)
        if (!e->running[i]->done)
            engine_row_finish(e, e->running[i], ENGINE_FINISH_CANCELLED, "engine stopped");
    drop_done(e);
    for (int i = 0; i < e->n_waiting; i++) {
        engine_row_finish(e, e->waiting[i], ENGINE_FINISH_CANCELLED, "engine stopped");
        req_unref(e->waiting[i]);
    }
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    engine_free_memory(e);
}

engine_req *engine_submit(tern_engine *e, const engine_params *p, void (*notify)(void *user), void *user,
                          tern_err *err)
{
    if (p->n_prompt == 0) {
        tern_err_set(err, TERN_EINVAL, "the prompt is empty");
        return NULL;
    }
    int embed = p->embed_pooling != EMBED_POOL_NONE;
    if (p->lora && model_lora_supported(e->m, err))
        return NULL;
    if (embed && p->constraint) {
        tern_err_set(err, TERN_EINVAL, "an embedding request takes no constraint");
        return NULL;
    }
    if (embed && !e->hidden) {
        tern_err_set(err, TERN_EUNSUPPORTED, "embeddings need the CPU backend (the %s forward returns no hidden states)",
                     model_backend_name(e->m));
        return NULL;
    }
    if (embed ? p->n_prompt > (size_t)e->o.ctx_size : p->n_prompt >= (size_t)e->o.ctx_size) {
        tern_err_set(err, TERN_ERANGE, "the prompt has %zu tokens; the context holds %d%s", p->n_prompt,
                     e->o.ctx_size, embed ? "" : " (including at least one generated token)");
        return NULL;
    }
    for (size_t i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || p->prompt[i] >= e->n_vocab) {
            tern_err_set(err, TERN_ERANGE, "prompt token %d is outside the vocabulary", p->prompt[i]);
            return NULL;
        }
    if (!embed && sample_params_check(&p->sample, e->n_vocab, err))
        return NULL;
    engine_req *r = calloc(1, sizeof *r);
    if (!r)
        goto nomem;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 2);
    atomic_init(&r->cancel, 0);
    r->e = e;
    r->sp = p->sample;
    r->n_prompt = (int)p->n_prompt;
    r->max_tokens = p->max_tokens > 0 ? p->max_tokens : e->o.ctx_size - r->n_prompt;
    if (r->max_tokens > e->o.ctx_size - r->n_prompt)
        r->max_tokens = e->o.ctx_size - r->n_prompt;
    r->ignore_eos = p->ignore_eos;
    r->no_spec = p->no_speculation || p->min_tokens > 0;
    if (p->lora) {
        r->lora = (struct model_lora *)p->lora; /* our own reference, dropped in req_unref */
        model_lora_retain(r->lora);
    }
    r->min_tokens = p->min_tokens;
    r->include_stop_str = p->include_stop_str;
    if (embed) { /* the pool's memory comes at admission */
        r->max_tokens = 0;
        r->no_spec = 1;
        r->pool.mode = p->embed_pooling;
        r->pool.dim = model_hidden_dim(e->m);
        r->embed_normalize = p->embed_normalize;
    }
    r->skip_special = p->skip_special;
    r->cache_boundary = (int)p->cache_boundary;
    r->notify = notify;
    r->user = user;
    r->t_submit = tern_time_s();
    r->cap_tokens = r->n_prompt + r->max_tokens + ENGINE_MAX_DRAFT + 1;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    if (!r->tokens)
        goto nomem_req;
    memcpy(r->tokens, p->prompt, p->n_prompt * sizeof *r->tokens);
    r->n_tokens = r->n_prompt;
    if (p->sample.n_bias > 0) {
        r->bias = malloc((size_t)p->sample.n_bias * sizeof *r->bias);
        if (!r->bias)
            goto nomem_req;
        memcpy(r->bias, p->sample.bias, (size_t)p->sample.n_bias * sizeof *r->bias);
        r->sp.bias = r->bias;
    }
    if (p->n_stop_ids > 0) {
        if (!(r->stop_ids = malloc((size_t)p->n_stop_ids * sizeof *r->stop_ids)))
            goto nomem_req;
        for (int i = 0; i < p->n_stop_ids; i++)
            if (p->stop_ids[i] < 0 || p->stop_ids[i] >= e->n_vocab) {
                tern_err_set(err, TERN_EINVAL, "stop token id %d is outside the vocabulary", p->stop_ids[i]);
                goto fail_req;
            }
        memcpy(r->stop_ids, p->stop_ids, (size_t)p->n_stop_ids * sizeof *r->stop_ids);
        r->n_stop_ids = p->n_stop_ids;
    }
    if (min_ids_build(e, r))
        goto nomem_req;
    if (p->n_stop > 0) {
        r->stop = calloc((size_t)p->n_stop, sizeof *r->stop);
        if (!r->stop)
            goto nomem_req;
        for (int i = 0; i < p->n_stop; i++) {
            if (!p->stop[i] || !p->stop[i][0]) {
                tern_err_set(err, TERN_EINVAL, "stop strings must not be empty");
                goto fail_req;
            }
            if (!(r->stop[i] = strdup(p->stop[i])))
                goto nomem_req;
            r->n_stop = i + 1;
        }
    }
    if (projected_blocks(e, r) > e->kv.n_blocks) {
        tern_err_set(err, TERN_ERANGE, "the request needs %d tokens of KV cache; the budget holds %d",
                     r->n_prompt + r->max_tokens, (e->kv.n_blocks - 1) * e->kv.block_size);
        goto fail_req;
    }
    pthread_mutex_lock(&e->mu);
    if (e->n_waiting >= e->o.max_queue || e->stop) {
        e->st.requests_rejected++;
        pthread_mutex_unlock(&e->mu);
        tern_err_set(err, TERN_EFULL, "the request queue is full (%d waiting)", e->o.max_queue);
        goto fail_req;
    }
    /* the constraint is owned from here on */
    r->cops = p->constraint;
    r->cctx = p->constraint_ctx;
    e->waiting[e->n_waiting++] = r;
    e->st.requests_total++;
    e->st.queue_len = e->n_waiting;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return r;
nomem_req:
    tern_err_set(err, TERN_ENOMEM, "out of memory");
fail_req:
    atomic_store(&r->refs, 1);
    req_unref(r);
    return NULL;
nomem:
    tern_err_set(err, TERN_ENOMEM, "out of memory");
    return NULL;
}

void engine_req_cancel(engine_req *r)
{
    if (!r)
        return;
    atomic_store(&r->cancel, 1);
    tern_engine *e = r->e;
    pthread_mutex_lock(&e->mu);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void engine_stats_get(tern_engine *e, engine_stats *st)
{
    pthread_mutex_lock(&e->mu);
    *st = e->st;
    pthread_mutex_unlock(&e->mu);
    st->kv_disk_on = e->disk != NULL;
    if (e->disk)
        kvdisk_stats_get(e->disk, &st->kv_disk);
}

void engine_stats_tiers_add(engine_stats *a, const engine_stats *b, int gauges)
{
    a->kv_mem_hit_tokens += b->kv_mem_hit_tokens;
    a->kv_disk_hit_tokens += b->kv_disk_hit_tokens;
    a->kv_mem_lookup_s += b->kv_mem_lookup_s;
    a->kv_mem_insert_s += b->kv_mem_insert_s;
    kvdisk_stats *x = &a->kv_disk;
    const kvdisk_stats *y = &b->kv_disk;
    x->hits += y->hits;
    x->hit_bytes += y->hit_bytes;
    x->read_s += y->read_s;
    x->writes += y->writes;
    x->write_bytes += y->write_bytes;
    x->write_s += y->write_s;
    x->dropped += y->dropped;
    x->corrupt += y->corrupt;
    x->torn += y->torn;
    x->evicted += y->evicted;
    if (!gauges)
        return;
    a->kv_mem_cached_bytes += b->kv_mem_cached_bytes;
    if (b->kv_disk_on) {
        x->enabled = a->kv_disk_on ? x->enabled && y->enabled : y->enabled;
        a->kv_disk_on = 1;
        x->n_blocks += y->n_blocks;
        x->bytes_used += y->bytes_used;
        x->budget_bytes += y->budget_bytes;
        x->block_file_bytes = y->block_file_bytes;
    }
}
