/* Counters: /stats (JSON: engine + server) and /metrics (Prometheus text
 * exposition format 0.0.4). Server counters are lock-free atomics bumped on
 * the connection threads; engine counters come from engine_stats_get. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server_int.h"

void metrics_count_response(tern_server *s, srv_route route, unsigned status)
{
    int cls = status >= 100 && status < 600 ? (int)(status / 100) : 0;
    atomic_fetch_add(&s->met.http[route][cls], 1);
}

static void pf(api_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Bucket upper bounds in seconds, per srv_hist_kind (SRV_HIST_BUCKETS
 * each, then +Inf): from a fast local model's token (a millisecond) to a
 * long generation behind a full queue (minutes). */
static const double hist_le[HIST_N][SRV_HIST_BUCKETS] = {
    [HIST_TTFT] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
    [HIST_ITL] = {0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5},
    [HIST_DURATION] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300},
    [HIST_QUEUE] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
};
static const char *const hist_name[HIST_N] = {
    [HIST_TTFT] = "time_to_first_token_seconds",
    [HIST_ITL] = "inter_token_latency_seconds",
    [HIST_DURATION] = "request_duration_seconds",
    [HIST_QUEUE] = "queue_time_seconds",
};
static const char *const hist_help[HIST_N] = {
    [HIST_TTFT] = "Request arrival to its first generated token.",
    [HIST_ITL] = "Time between two generated tokens of a choice.",
    [HIST_DURATION] = "Generation request arrival to the end of its response.",
    [HIST_QUEUE] = "Time an engine request waited for a batch row.",
};

void metrics_observe(srv_model *mm, srv_hist_kind k, double seconds)
{
    if (!mm || seconds < 0)
        return;
    srv_hist *h = &mm->met.hist[k];
    int b = 0;
    while (b < SRV_HIST_BUCKETS && seconds > hist_le[k][b])
        b++;
    atomic_fetch_add(&h->n[b], 1);
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_ns, (long long)(seconds * 1e9));
}

/* The histograms in Prometheus' form: cumulative buckets per model. */
static void hist_prometheus(tern_server *s, api_buf *b)
{
    for (int k = 0; k < HIST_N; k++) {
        pf(b, "# HELP tern_%s %s\n# TYPE tern_%s histogram\n", hist_name[k], hist_help[k], hist_name[k]);
        for (int m = 0; m < s->n_models; m++) {
            srv_model *mm = s->models[m];
            const srv_hist *h = &mm->met.hist[k];
            char name[192]; /* the label value: \\, \" and newline escaped */
            size_t o = 0;
            for (const char *p = mm->name; *p && o + 3 < sizeof name; p++) {
                if (*p == '\\' || *p == '"' || *p == '\n')
                    name[o++] = '\\';
                name[o++] = *p == '\n' ? 'n' : *p;
            }
            name[o] = 0;
            long long cum = 0;
            for (int i = 0; i <= SRV_HIST_BUCKETS; i++) {
                cum += atomic_load(&h->n[i]);
                if (i < SRV_HIST_BUCKETS)
                    pf(b, "tern_%s_bucket{model=\"%s\",le=\"%g\"} %lld\n", hist_name[k], name, hist_le[k][i], cum);
                else
                    pf(b, "tern_%s_bucket{model=\"%s\",le=\"+Inf\"} %lld\n", hist_name[k], name, cum);
            }
            pf(b, "tern_%s_sum{model=\"%s\"} %.9g\ntern_%s_count{model=\"%s\"} %lld\n", hist_name[k], name,
               (double)atomic_load(&h->sum_ns) * 1e-9, hist_name[k], name, (long long)atomic_load(&h->count));
        }
    }
}

/* The prefix cache's tiers: memory always, disk when configured. */
static json_object *kv_tiers_json(const engine_stats *st)
{
    json_object *t = json_object_new_object(), *mem = json_object_new_object();
#define TI(o, k, v) json_object_object_add(o, k, json_object_new_int64((long long)(v)))
#define TD(o, k, v) json_object_object_add(o, k, json_object_new_double(v))
    TI(mem, "hit_tokens", st->kv_mem_hit_tokens);
    TI(mem, "blocks", st->kv_blocks_cached);
    TI(mem, "bytes", st->kv_mem_cached_bytes);
    TD(mem, "read_s", st->kv_mem_lookup_s);
    TD(mem, "write_s", st->kv_mem_insert_s);
    json_object_object_add(t, "memory", mem);
    if (st->kv_disk_on) {
        const kvdisk_stats *d = &st->kv_disk;
        json_object *dk = json_object_new_object();
        json_object_object_add(dk, "enabled", json_object_new_boolean(d->enabled));
        TI(dk, "hit_tokens", st->kv_disk_hit_tokens);
        TI(dk, "hit_blocks", d->hits);
        TI(dk, "blocks", d->n_blocks);
        TI(dk, "bytes", d->bytes_used);
        TI(dk, "budget_bytes", d->budget_bytes);
        TI(dk, "read_bytes", d->hit_bytes);
        TD(dk, "read_s", d->read_s);
        TI(dk, "written_blocks", d->writes);
        TI(dk, "written_bytes", d->write_bytes);
        TD(dk, "write_s", d->write_s);
        TI(dk, "dropped_blocks", d->dropped);
        TI(dk, "evicted_blocks", d->evicted);
        TI(dk, "corrupt_blocks", d->corrupt);
        TI(dk, "torn_files", d->torn);
        json_object_object_add(t, "disk", dk);
    }
#undef TI
#undef TD
    return t;
}

char *metrics_stats_json(tern_server *s)
{
    engine_stats st;
    json_object *models = models_stats_json(s, &st); /* st: every model's engines summed */
    json_object *o = json_object_new_object(), *eng = json_object_new_object(), *srv = json_object_new_object();
    const char *name = s->models[0]->name; /* the default model */
    json_object_object_add(o, "model", api_json_string(name, strlen(name)));
    json_object_object_add(o, "uptime_s", json_object_new_int64((long long)time(NULL) - s->started));
#define EI(k, v) json_object_object_add(eng, k, json_object_new_int64((long long)(v)))
    EI("queue_len", st.queue_len);
    EI("running", st.running);
    EI("requests_total", st.requests_total);
    EI("requests_finished", st.requests_finished);
    EI("requests_cancelled", st.requests_cancelled);
    EI("requests_rejected", st.requests_rejected);
    EI("tokens_prefilled", st.tokens_prefilled);
    EI("tokens_decoded", st.tokens_decoded);
    EI("prefix_hit_tokens", st.prefix_hit_tokens);
    EI("spec_drafted", st.spec_drafted);
    EI("spec_accepted", st.spec_accepted);
    EI("spec_target_forwards", st.spec_target_forwards);
    EI("jump_forward_tokens", st.jump_tokens);
    EI("steps", st.steps);
    EI("kv_blocks_total", st.kv_blocks_total);
    EI("kv_blocks_used", st.kv_blocks_used);
    EI("kv_blocks_cached", st.kv_blocks_cached);
    EI("kv_bytes_total", st.kv_bytes_total);
#undef EI
    json_object_object_add(eng, "last_ttft_s", json_object_new_double(st.last_ttft_s));
    json_object_object_add(eng, "last_decode_tps", json_object_new_double(st.last_decode_tps));
    json_object_object_add(eng, "kv_tiers", kv_tiers_json(&st));
#define SI(k, v) json_object_object_add(srv, k, json_object_new_int64((long long)atomic_load(&s->met.v)))
    SI("generations_started", gen_started);
    SI("generations_finished", gen_finished);
    SI("generations_failed", gen_failed);
    SI("generations_disconnected", gen_disconnected);
    SI("generations_active", gens_active);
    SI("streams_active", streams_active);
    SI("prompt_tokens", prompt_tokens);
    SI("completion_tokens", completion_tokens);
    SI("cached_tokens", cached_tokens);
    SI("connections_evicted", conn_evicted);
    SI("connections_refused", conn_refused);
    SI("connections_past_deadline", conn_deadline);
    SI("grammar_compiles", compiles);
    SI("grammar_compiles_cancelled", compile_cancelled);
    SI("grammar_compiles_rejected", compile_rejected);
#undef SI
    int n_queued, n_running;
    srv_compile_pool_counts(s, &n_queued, &n_running);
    json_object_object_add(srv, "grammar_compiles_queued", json_object_new_int(n_queued));
    json_object_object_add(srv, "grammar_compiles_running", json_object_new_int(n_running));
    json_object *http = json_object_new_object();
    for (int r = 0; r < ROUTE_N; r++) {
        json_object *per = json_object_new_object();
        for (int c = 0; c < 6; c++) {
            long long v = atomic_load(&s->met.http[r][c]);
            if (!v)
                continue;
            char k[16];
            if (c)
                snprintf(k, sizeof k, "%dxx", c);
            else
                snprintf(k, sizeof k, "dropped");
            json_object_object_add(per, k, json_object_new_int64(v));
        }
        json_object_object_add(http, srv_route_names[r], per);
    }
    json_object_object_add(srv, "http_responses", http);
    json_object_object_add(o, "engine", eng);
    json_object_object_add(o, "server", srv);
    json_object_object_add(o, "models", models);
    json_object_object_add(o, "lora_adapters", adapters_stats_json(s));
    return api_json_take(o);
}

static void pf(api_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pf(api_buf *b, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n > 0)
        api_buf_append(b, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

static void metric(api_buf *b, const char *name, const char *type, const char *help, double v)
{
    pf(b, "# HELP tern_%s %s\n# TYPE tern_%s %s\ntern_%s %.17g\n", name, help, name, type, name, v);
}

/* The gauges prefix-aware routers (llm-d, the vLLM production stack, Dynamo)
 * read, under vLLM's names: running and waiting requests and the share of
 * the KV cache in use (0..1), over every model's engine. */
static void router_gauges(api_buf *b, const engine_stats *st)
{
    double usage = st->kv_blocks_total ? (double)st->kv_blocks_used / st->kv_blocks_total : 0;
    pf(b, "# HELP vllm:num_requests_running Requests in the running batch (vLLM's name, for routers).\n"
          "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running %d\n", st->running);
    pf(b, "# HELP vllm:num_requests_waiting Requests waiting for admission (vLLM's name, for routers).\n"
          "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting %d\n", st->queue_len);
    pf(b, "# HELP vllm:kv_cache_usage_perc KV cache usage, 1 = full (vLLM's name, for routers).\n"
          "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc %.6f\n", usage);
    pf(b, "# HELP vllm:gpu_cache_usage_perc KV cache usage, 1 = full (vLLM's older name).\n"
          "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc %.6f\n", usage);
}

static void tier_metric(api_buf *b, const char *name, const char *type, const char *help, double mem, int disk_on,
                        double disk)
{
    pf(b, "# HELP tern_%s %s\n# TYPE tern_%s %s\ntern_%s{tier=\"memory\"} %.17g\n", name, help, name, type, name,
       mem);
    if (disk_on)
        pf(b, "tern_%s{tier=\"disk\"} %.17g\n", name, disk);
}

/* The prefix cache's tiers (labels tier="memory", tier="disk"), then the
 * disk tier's own counters. */
static void kv_tiers_prometheus(api_buf *b, const engine_stats *st)
{
    const kvdisk_stats *d = &st->kv_disk;
    int on = st->kv_disk_on;
    tier_metric(b, "kv_tier_hit_tokens_total", "counter", "Prompt tokens whose KV came from this prefix-cache tier.",
                (double)st->kv_mem_hit_tokens, on, (double)st->kv_disk_hit_tokens);
    tier_metric(b, "kv_tier_bytes", "gauge", "Bytes of KV blocks this tier holds.", (double)st->kv_mem_cached_bytes,
                on, (double)d->bytes_used);
    tier_metric(b, "kv_tier_read_seconds_total", "counter",
                "Seconds finding (memory) or reading and checking (disk) cached blocks.", st->kv_mem_lookup_s, on,
                d->read_s);
    tier_metric(b, "kv_tier_write_seconds_total", "counter",
                "Seconds adding blocks to the tier (disk: the writer thread's file writes).", st->kv_mem_insert_s,
                on, d->write_s);
    if (!on)
        return;
    metric(b, "kv_disk_enabled", "gauge", "1 while the disk tier writes blocks, 0 after a write failure.",
           d->enabled);
    metric(b, "kv_disk_blocks", "gauge", "Block files in the disk tier.", (double)d->n_blocks);
    metric(b, "kv_disk_budget_bytes", "gauge", "The disk tier's budget.", (double)d->budget_bytes);
    metric(b, "kv_disk_read_blocks_total", "counter", "Blocks read back from disk.", (double)d->hits);
    metric(b, "kv_disk_read_bytes_total", "counter", "Bytes read back from disk.", (double)d->hit_bytes);
    metric(b, "kv_disk_written_blocks_total", "counter", "Blocks written to disk.", (double)d->writes);
    metric(b, "kv_disk_written_bytes_total", "counter", "Bytes written to disk.", (double)d->write_bytes);
    metric(b, "kv_disk_dropped_blocks_total", "counter", "Evicted blocks not written (queue full or tier off).",
           (double)d->dropped);
    metric(b, "kv_disk_evicted_blocks_total", "counter", "Block files deleted for the budget.", (double)d->evicted);
    metric(b, "kv_disk_corrupt_blocks_total", "counter",
           "Block files that failed a check (deleted, the block recomputed).", (double)d->corrupt);
    metric(b, "kv_disk_torn_files_total", "counter", "Partial writes found and deleted at start.", (double)d->torn);
}

char *metrics_prometheus(tern_server *s, size_t *len)
{
    engine_stats st;
    json_object_put(models_stats_json(s, &st)); /* every model's engines summed */
    api_buf b = {0};
    metric(&b, "queue_length", "gauge", "Requests waiting for admission.", st.queue_len);
    metric(&b, "running_requests", "gauge", "Requests in the running batch.", st.running);
    metric(&b, "engine_requests_total", "counter", "Requests submitted to the engine.", (double)st.requests_total);
    metric(&b, "engine_requests_finished_total", "counter", "Engine requests finished.",
           (double)st.requests_finished);
    metric(&b, "engine_requests_cancelled_total", "counter", "Engine requests cancelled.",
           (double)st.requests_cancelled);
    metric(&b, "engine_requests_rejected_total", "counter", "Engine requests rejected (queue full).",
           (double)st.requests_rejected);
    metric(&b, "prompt_tokens_prefilled_total", "counter", "Prompt tokens run through the model.",
           (double)st.tokens_prefilled);
    metric(&b, "tokens_decoded_total", "counter", "Tokens generated.", (double)st.tokens_decoded);
    metric(&b, "prefix_cache_hit_tokens_total", "counter", "Prompt tokens reused from the prefix cache.",
           (double)st.prefix_hit_tokens);
    metric(&b, "engine_steps_total", "counter", "Batched forward steps.", (double)st.steps);
    metric(&b, "spec_drafted_tokens_total", "counter", "Tokens proposed by speculative drafting.",
           (double)st.spec_drafted);
    metric(&b, "spec_accepted_tokens_total", "counter", "Drafted tokens the target accepted.",
           (double)st.spec_accepted);
    metric(&b, "spec_target_forwards_total", "counter", "Target forwards of speculating requests.",
           (double)st.spec_target_forwards);
    metric(&b, "jump_forward_tokens_total", "counter", "Tokens appended by grammar jump-forward.",
           (double)st.jump_tokens);
    metric(&b, "kv_blocks_total", "gauge", "KV cache blocks in the pool.", st.kv_blocks_total);
    metric(&b, "kv_blocks_used", "gauge", "KV cache blocks in use.", st.kv_blocks_used);
    metric(&b, "kv_blocks_cached", "gauge", "KV cache blocks held by the prefix cache.", st.kv_blocks_cached);
    metric(&b, "kv_bytes_total", "gauge", "Bytes of the KV cache pool.", (double)st.kv_bytes_total);
    kv_tiers_prometheus(&b, &st);
    metric(&b, "last_ttft_seconds", "gauge", "Time to first token of the last request.", st.last_ttft_s);
    metric(&b, "last_decode_tokens_per_second", "gauge", "Decode speed of the last request.",
           st.last_decode_tps);
    metric(&b, "streams_active", "gauge", "Open SSE streams.", atomic_load(&s->met.streams_active));
    metric(&b, "generations_active", "gauge", "HTTP generation requests in flight.",
           atomic_load(&s->met.gens_active));
    metric(&b, "generations_disconnected_total", "counter", "Generations cancelled because the client left.",
           (double)atomic_load(&s->met.gen_disconnected));
    metric(&b, "generations_failed_total", "counter", "Generations that ended in an engine error.",
           (double)atomic_load(&s->met.gen_failed));
    metric(&b, "prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
           (double)atomic_load(&s->met.prompt_tokens));
    metric(&b, "completion_tokens_total", "counter", "Completion tokens returned.",
           (double)atomic_load(&s->met.completion_tokens));
    int n_queued, n_running;
    srv_compile_pool_counts(s, &n_queued, &n_running);
    metric(&b, "grammar_compiles_queued", "gauge", "Grammar compiles waiting for a worker.", n_queued);
    metric(&b, "grammar_compiles_running", "gauge", "Grammar compiles running on the workers.", n_running);
    metric(&b, "grammar_compiles_total", "counter", "Grammar compile jobs finished (cache hits included).",
           (double)atomic_load(&s->met.compiles));
    metric(&b, "grammar_compile_seconds_total", "counter", "Time the compile workers spent on jobs.",
           (double)atomic_load(&s->met.compile_us) / 1e6);
    metric(&b, "grammar_compiles_cancelled_total", "counter", "Compiles cancelled (client left, shutdown).",
           (double)atomic_load(&s->met.compile_cancelled));
    metric(&b, "grammar_compiles_rejected_total", "counter", "Compiles refused because the queue was full.",
           (double)atomic_load(&s->met.compile_rejected));
    pf(&b, "# HELP tern_connections_closed_total Connections the server closed or refused to keep slots free.\n"
           "# TYPE tern_connections_closed_total counter\n"
           "tern_connections_closed_total{reason=\"evicted\"} %lld\n"
           "tern_connections_closed_total{reason=\"refused\"} %lld\n"
           "tern_connections_closed_total{reason=\"deadline\"} %lld\n",
       (long long)atomic_load(&s->met.conn_evicted), (long long)atomic_load(&s->met.conn_refused),
       (long long)atomic_load(&s->met.conn_deadline));
    pf(&b, "# HELP tern_http_responses_total HTTP responses by route and status class.\n"
           "# TYPE tern_http_responses_total counter\n");
    for (int r = 0; r < ROUTE_N; r++)
        for (int c = 0; c < 6; c++) {
            long long v = atomic_load(&s->met.http[r][c]);
            if (v)
                pf(&b, "tern_http_responses_total{route=\"%s\",status=\"%s\"} %lld\n", srv_route_names[r],
                   c ? (const char *[]){"", "1xx", "2xx", "3xx", "4xx", "5xx"}[c] : "dropped", v);
        }
    models_prometheus(s, &b);
    router_gauges(&b, &st);
    adapters_prometheus(s, &b);
    hist_prometheus(s, &b);
    *len = b.len;
    return b.data;
}
