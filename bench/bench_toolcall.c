/* bench_toolcall: the per-token cost of tool-call grammars.
 *
 *   bench_toolcall TOKENIZER_DIR [--steps N]
 *
 * Builds the Hermes calls' grammar for two sample tools over the
 * tokenizer's vocabulary (as `tern serve` does for tool_choice) and times
 * one token mask (fill_mask) per step, single thread:
 *   - auto, free text: the lazy constraint before any trigger, over the
 *     tokens of an ordinary paragraph (every id allowed except the few that
 *     would complete "<tool_call>" with bytes the grammar refuses);
 *   - auto, after the trigger / required: the grammar's masks along a call;
 * plus the one-off costs: the trigger tables' vocabulary scan and the
 * grammar compile (its token sets are filled by a warm-up call first, as
 * the server's compile cache does before a grammar's first use). Prints
 * microseconds; a program, not a test. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/constraint.h"
#include "grammar/grammar.h"
#include "server/api.h"
#include "server/toolcall.h"
#include "server/toolfmt.h"
#include "tokenizer/tokenizer.h"

static const char *TOOLS =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": [\"celsius\", \"fahrenheit\"]}}, "
    "\"required\": [\"city\"]}}}, {\"type\": \"function\", \"function\": {\"name\": \"search\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\"}, \"limit\": {\"type\": \"integer\"}, "
    "\"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}}}, \"required\": [\"query\"]}}}]";

static const char *FREE_TEXT =
    "The weather in Paris is mild in spring. I can look it up for you if you like, or search your notes "
    "about the trip: the museum opens at nine, and the train leaves at <noon> from the east station. ";

static const char *CALL = "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"trip to Paris\", "
                          "\"limit\": 5, \"tags\": [\"travel\", \"spring\"]}}\n</tool_call>";

/* Times fill_mask + accept over ids; returns microseconds per mask. */
static double run(const engine_constraint_ops *ops, void *ctx, const int32_t *ids, size_t n, uint32_t *mask,
                  int32_t n_words, int *n_done)
{
    double t0 = tern_time_s();
    size_t i = 0;
    for (; i < n; i++) {
        if (ops->fill_mask(ctx, mask, n_words) || ops->accept(ctx, ids[i]))
            break;
    }
    *n_done = (int)i;
    return i ? (tern_time_s() - t0) * 1e6 / (double)i : 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_toolcall TOKENIZER_DIR [--steps N]\n");
        return 2;
    }
    int steps = 2000;
    for (int i = 2; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[++i]);
    tern_err err = {0};
    tern_tokenizer *tok = tokenizer_load(argv[1], &err);
    if (!tok) {
        fprintf(stderr, "bench_toolcall: %s\n", err.msg);
        return 1;
    }
    int32_t n_vocab = tokenizer_vocab_size(tok);
    grammar_vocab *v = grammar_vocab_new(tok, n_vocab, NULL, 0, &err);
    json_object *tools = json_tokener_parse(TOOLS);
    char *ebnf = NULL;
    api_error e;
    const toolfmt *f = toolfmt_get(TOOLFMT_HERMES);
    if (!v || !tools || toolcall_grammar(f, tools, NULL, 1, 0, NULL, &ebnf, &e)) {
        fprintf(stderr, "bench_toolcall: setup failed\n");
        return 1;
    }
    double t0 = tern_time_s();
    grammar_compiled *cg = grammar_compile_ebnf(ebnf, strlen(ebnf), v, NULL, &err);
    double t_compile = tern_time_s() - t0;
    t0 = tern_time_s();
    const char *texts[] = {"<tool_call>"};
    constraint_triggers *trig = constraint_triggers_new(v, texts, 1, NULL, 0, 0, &err);
    double t_trig = tern_time_s() - t0;
    if (!cg || !trig) {
        fprintf(stderr, "bench_toolcall: %s\n", err.msg);
        return 1;
    }
    int32_t n_words = (n_vocab + 31) / 32;
    uint32_t *mask = malloc((size_t)n_words * sizeof *mask);
    int32_t *free_ids = NULL, *call_ids = NULL;
    size_t n_free = 0, n_call = 0;
    tokenizer_encode(tok, FREE_TEXT, strlen(FREE_TEXT), 0, &free_ids, &n_free, &err);
    tokenizer_encode(tok, CALL, strlen(CALL), 0, &call_ids, &n_call, &err);

    /* warm-up: the compiled grammar fills its per-state token sets lazily
     * (the server's compile cache fills them before first use) */
    const engine_constraint_ops *ops;
    void *ctx;
    int done = 0;
    constraint_grammar_new(cg, NULL, n_vocab, NULL, NULL, &ops, &ctx, &err);
    run(ops, ctx, call_ids, n_call, mask, n_words, &done);
    ops->free(ctx);

    /* free text: repeat the paragraph to `steps` tokens */
    int32_t *ids = malloc((size_t)steps * sizeof *ids);
    for (int i = 0; i < steps; i++)
        ids[i] = free_ids[(size_t)i % n_free];
    constraint_lazy lz = {.triggers = trig};
    constraint_grammar_new_lazy(cg, NULL, &lz, n_vocab, NULL, NULL, &ops, &ctx, &err);
    double us_free = run(ops, ctx, ids, (size_t)steps, mask, n_words, &done);
    ops->free(ctx);
    int done_free = done;

    /* a call: lazy from the trigger on (the first masks include the free ones before it) */
    constraint_grammar_new_lazy(cg, NULL, &lz, n_vocab, NULL, NULL, &ops, &ctx, &err);
    double us_lazy_call = run(ops, ctx, call_ids, n_call, mask, n_words, &done);
    ops->free(ctx);
    int done_lazy = done;

    /* forced (required): the grammar from the first token */
    constraint_grammar_new(cg, NULL, n_vocab, NULL, NULL, &ops, &ctx, &err);
    double us_forced = run(ops, ctx, call_ids, n_call, mask, n_words, &done);
    ops->free(ctx);

    printf("vocabulary %d tokens; grammar compile %.1f ms; trigger tables %.1f ms (one scan per server)\n", n_vocab,
           t_compile * 1e3, t_trig * 1e3);
    printf("auto, free text:        %7.2f us/mask over %d tokens\n", us_free, done_free);
    printf("auto, a call (lazy):    %7.2f us/mask over %d of %zu tokens\n", us_lazy_call, done_lazy, n_call);
    printf("required (forced call): %7.2f us/mask over %d of %zu tokens\n", us_forced, done, n_call);
    free(ids);
    free(free_ids);
    free(call_ids);
    free(mask);
    free(ebnf);
    json_object_put(tools);
    constraint_triggers_free(trig);
    grammar_compiled_free(cg);
    grammar_vocab_free(v);
    tokenizer_free(tok);
    return 0;
}
