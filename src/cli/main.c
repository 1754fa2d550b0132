/* tern: entry point and subcommand table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "cli.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"run", cmd_run, "run MODEL_DIR --prompt TEXT [--max-tokens N] [--temperature T] [--seed S] [--device D] [--exact-products]"},
    {"chat", cmd_chat, "chat MODEL_DIR [--system TEXT] [--think on|off] [--device D]  (interactive chat)"},
    {"logits", cmd_logits, "logits MODEL_DIR (--prompt TEXT | --ids 1,2,3) [--top K] [--device D] [--exact-products]"},
    {"perplexity", cmd_perplexity, "perplexity MODEL_DIR --file TEXT [--ctx N] [--chunks N] [--save-logits F | --kl-base F] [--exact-products]"},
    {"convert", cmd_convert, "convert IN_DIR OUT_DIR --bits 4|8 [--group-size 64]  (MLX affine quantization)"},
    {"template", cmd_template, "template DIR [--jsonl] < request.json  (renders the chat template)"},
    {"grammar", cmd_grammar, "grammar compile|check|masks|bench SPEC ... (tern grammar --help)"},
    {"tokenize", cmd_tokenize, "tokenize DIR [--no-special] [--jsonl] < text  (prints the id array)"},
    {"detokenize", cmd_detokenize, "detokenize DIR [--skip-special] [--jsonl] < ids.json"},
    {"bench", cmd_bench, "bench MODEL_DIR [--draft DIR] [--out DIR] [--quick] [--compare URL] [--device D]"},
    {"serve", cmd_serve, "serve MODEL_DIR [--host H] [--port P] [--api-key KEY] [--model-name NAME] [--ctx-size N] [--kv-budget GB] [--max-batch N] [--cors ORIGIN] [--device cpu|cuda|cuda:N|auto] [--exact-products]"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: tern COMMAND [ARGS]   (tern COMMAND --help: its options and their defaults;\n"
               "                              tern --version)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        const char *what = cli_help_what(commands[i].name);
        fprintf(f, "  %-11s %s\n", commands[i].name, what ? what : "");
    }
}

const char *cli_flag_value(int argc, char **argv, int *i, const char *flag)
{
    size_t n = strlen(flag);
    if (strncmp(argv[*i], flag, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "tern: %s needs a value\n", flag);
        return NULL;
    }
    (*i)++;
    return argv[*i];
}

int cli_parse_int(const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return -1;
    *out = v;
    return 0;
}

int cli_parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (mul > 1 && (*end == 'B' || *end == 'b' || *end == 'i'))
        end += *end == 'i' && (end[1] == 'B' || end[1] == 'b') ? 2 : 1;
    if (errno || end == s || *end || !(v > 0) || v * mul > 1e18)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        cli_version_print(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            /* `tern CMD --help` (or -h), anywhere among its arguments */
            for (int j = 2; j < argc; j++)
                if (!strcmp(argv[j], "--help") || !strcmp(argv[j], "-h"))
                    return cli_help_print(commands[i].name, stdout) ? 2 : 0;
            return commands[i].fn(argc - 1, argv + 1);
        }
    fprintf(stderr, "tern: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
