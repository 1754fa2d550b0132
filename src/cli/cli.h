/* The tern command line: one file per subcommand, dispatched from main.c. */
#ifndef TERN_CLI_H
#define TERN_CLI_H

/* Each returns the process exit code (0 ok, 1 error, 2 usage). argv[0] is the
 * subcommand name. */
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);

/* Parses "--flag value" or "--flag=value"; returns the value or NULL and
 * advances *i when it consumed the next argument. */
const char *cli_flag_value(int argc, char **argv, int *i, const char *flag);
int cli_parse_int(const char *s, long long lo, long long hi, long long *out);
int cli_parse_double(const char *s, double lo, double hi, double *out);
/* A byte size: a number with an optional K, M, G or T (powers of 1024,
 * optionally followed by B or iB): "512M", "20G", "1.5GiB". */
int cli_parse_size(const char *s, size_t *out);

/* Loads a draft model for speculative decoding and checks that it shares
 * the target's tokenizer. NULL with err set. */
#include "model/model.h"
#include "tokenizer/tokenizer.h"
tern_model *cli_load_draft(const char *dir, const tern_tokenizer *target_tok, const model_load_opts *lo,
                          tern_err *err);
/* Loads a model on a --device value (NULL: $TERN_DEVICE, else "auto").
 * "auto" is "cuda:0" when a GPU is usable, else "cpu", and falls back to
 * the CPU when the GPU backend does not support the model. The device used
 * is left in dev_buf (for a draft model) and logged (info level). */
#include <stddef.h>
#include <stdio.h>
tern_model *cli_load_model(const char *dir, const char *device, int n_threads, char *dev_buf, size_t cap,
                           tern_err *err);

/* --experts-in host|disk and --expert-cache SIZE (bytes, with an optional
 * K, M, G or T suffix, powers of 1024; alone it implies disk) for the
 * models loaded next (model_experts_opts_set). Returns 1 when argv[*i] was
 * one of them (advancing *i past its value), 0 when not, -1 on a bad value
 * (the message printed for cmd). */
int cli_experts_flag(int argc, char **argv, int *i, const char *cmd);
/* The expert residency counters of m, one line on f ("" for a model
 * without managed experts). */
void cli_experts_report(const tern_model *m, FILE *f);
/* kv_flags.c: consumes --kv-type T, --kv-type-layers SPEC or
 * --kv-quant-start N at argv[*i] into s (*given = 1 when a type was named):
 * 1 when consumed, 0 when argv[*i] is none of them, -1 on a bad value (the
 * message, naming the flag, printed). */
int cli_kv_flag(int argc, char **argv, int *i, kv_spec *s, int *given);
/* A one-sequence host pool of n_blocks for m under s (logits and
 * perplexity: their default is f32, the exact forward they measure). */
int cli_kv_pool_init(const tern_model *m, kv_pool *kv, const kv_spec *s, int n_blocks, tern_err *err);

/* help.c: `tern --version`; `tern CMD --help` (-1 for an unknown CMD); the
 * one-line description of CMD (NULL if unknown). */
void cli_version_print(FILE *f);
int cli_help_print(const char *cmd, FILE *f);
const char *cli_help_what(const char *cmd);

#endif
