/* Shared pieces of the `tern grammar` subcommands (cmd_grammar.c,
 * cmd_grammar_bench.c): the SPEC options and turning them into EBNF. */
#ifndef TERN_CLI_CMD_GRAMMAR_H
#define TERN_CLI_CMD_GRAMMAR_H

#include <json-c/json.h>
#include <stdint.h>

#include "base/err.h"
#include "grammar/grammar.h"

enum grammar_spec_kind { GSPEC_NONE, GSPEC_SCHEMA, GSPEC_EBNF, GSPEC_REGEX, GSPEC_CHOICE, GSPEC_JSON };

typedef struct grammar_spec {
    int kind;
    const char *arg;      /* file or literal, borrowed from argv */
    int any_whitespace;   /* default 1 */
    int max_whitespace;   /* default 20; -1 = unlimited */
} grammar_spec;

void grammar_spec_init(grammar_spec *s);
int grammar_spec_parse_flag(grammar_spec *s, int argc, char **argv, int *i);
/* SPEC -> malloc'd EBNF text. */
int grammar_spec_to_ebnf(const grammar_spec *s, char **ebnf_out, tern_err *err);
/* A schema (borrowed) with the spec's whitespace options -> EBNF. */
int grammar_spec_schema_to_ebnf(const grammar_spec *s, json_object *schema, char **ebnf_out, tern_err *err);
/* 64-bit FNV-1a over the sorted allowed non-special ids (4 LE bytes each). */
uint64_t grammar_mask_fnv1a(const grammar_vocab *v, const uint32_t *mask, int32_t *count_out);
/* MaskBench run options: the first `limit` files (-1: all) of `data` whose
 * name contains `match` (NULL: any); with jsonl a record per file, and per
 * mask slower than slow_us CPU microseconds (-1: none). */
typedef struct grammar_bench_opts {
    const char *tokenizer, *data, *match;
    long long limit, slow_us;
    int jsonl;
} grammar_bench_opts;
/* MaskBench run; returns the exit code. */
int grammar_bench_run(const grammar_spec *spec, const grammar_bench_opts *o);

#endif
