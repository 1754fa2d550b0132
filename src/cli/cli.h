/* The tern command line: one file per subcommand, dispatched from main.c. */
#ifndef TERN_CLI_H
#define TERN_CLI_H

/* Each returns the process exit code (0 ok, 1 error, 2 usage). argv[0] is the
 * subcommand name. */
int cmd_run(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_grammar(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Parses "--flag value" or "--flag=value"; returns the value or NULL and
 * advances *i when it consumed the next argument. */
const char *cli_flag_value(int argc, char **argv, int *i, const char *flag);
int cli_parse_int(const char *s, long long lo, long long hi, long long *out);
int cli_parse_double(const char *s, double lo, double hi, double *out);

/* Loads a draft model for speculative decoding and checks that it shares
 * the target's tokenizer. NULL with err set. */
#include "model/model.h"
#include "tokenizer/tokenizer.h"
tern_model *cli_load_draft(const char *dir, const tern_tokenizer *target_tok, const model_load_opts *lo,
                          tern_err *err);
/* Resolves a --device value (NULL = "auto") into buf: "auto" becomes
 * "cuda:0" when a GPU is usable, else "cpu"; others are copied. Logs the
 * choice (info level). Returns buf. */
#include <stddef.h>
const char *cli_device_resolve(const char *dev, char *buf, size_t cap);

#endif
