/* tern grammar: compile / check / masks / bench over the grammar engine.
 *   tern grammar compile SPEC                       print the compiled EBNF
 *   tern grammar check SPEC --input FILE|-          exit 0 accepted, 1 rejected (and why), 2 bad SPEC
 *   tern grammar masks --tokenizer DIR SPEC --input FILE [--list] [--final]
 *     one JSON line per input token (mask before accepting it); stops after a
 *     rejected token; --final adds the mask after the last token, --list the
 *     allowed ids themselves
 *   tern grammar bench --tokenizer DIR --data DIR [--limit N] [--match STR] [--jsonl [--slow-us N]]
 * SPEC: --schema FILE | --ebnf FILE | --regex RE | --choice JSON_ARRAY | --json,
 * plus --any-whitespace=false and --max-whitespace N|none. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/json.h"
#include "cli/cli.h"
#include "cli/cmd_grammar.h"
#include "grammar/frontend.h"
#include "grammar/grammar.h"
#include "grammar/regex.h"
#include "grammar/schema.h"
#include "tokenizer/tokenizer.h"

void grammar_spec_init(grammar_spec *s)
{
    memset(s, 0, sizeof *s);
    s->any_whitespace = 1;
    s->max_whitespace = 20;
}

/* Parses one SPEC flag at argv[*i]; 1 if consumed, 0 if not a SPEC flag,
 * -1 on a bad value. */
int grammar_spec_parse_flag(grammar_spec *s, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v;
    if (!strcmp(a, "--json")) {
        s->kind = GSPEC_JSON;
        return 1;
    }
    if (!strcmp(a, "--any-whitespace") || !strcmp(a, "--any-whitespace=true")) {
        s->any_whitespace = 1;
        return 1;
    }
    if (!strcmp(a, "--any-whitespace=false")) {
        s->any_whitespace = 0;
        return 1;
    }
    static const struct {
        const char *flag;
        int kind;
    } kinds[] = {{"--schema", GSPEC_SCHEMA}, {"--ebnf", GSPEC_EBNF}, {"--regex", GSPEC_REGEX},
                 {"--choice", GSPEC_CHOICE}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        size_t n = strlen(kinds[k].flag);
        if (strncmp(a, kinds[k].flag, n) || (a[n] && a[n] != '='))
            continue;
        if (!(v = cli_flag_value(argc, argv, i, kinds[k].flag)))
            return -1;
        s->kind = kinds[k].kind;
        s->arg = v;
        return 1;
    }
    if (!strncmp(a, "--max-whitespace", 16) && (a[16] == 0 || a[16] == '=')) {
        if (!(v = cli_flag_value(argc, argv, i, "--max-whitespace")))
            return -1;
        long long n;
        if (!strcmp(v, "none")) {
            s->max_whitespace = -1;
        } else if (cli_parse_int(v, 0, 1 << 20, &n) == 0) {
            s->max_whitespace = (int)n;
        } else {
            fprintf(stderr, "tern grammar: --max-whitespace wants a number or 'none'\n");
            return -1;
        }
        return 1;
    }
    return 0;
}


int grammar_spec_to_ebnf(const grammar_spec *s, char **ebnf_out, tern_err *err)
{
    *ebnf_out = NULL;
    switch (s->kind) {
    case GSPEC_EBNF: {
        size_t len;
        char *t = tern_file_read(s->arg, &len, 64u << 20, err);
        if (!t)
            return err ? err->code : TERN_EIO;
        *ebnf_out = t;
        return 0;
    }
    case GSPEC_REGEX:
        return grammar_regex_to_ebnf(s->arg, strlen(s->arg), ebnf_out, err);
    case GSPEC_CHOICE: {
        json_object *arr = tern_json_parse(s->arg, strlen(s->arg), err);
        if (!arr)
            return tern_err_wrap(err, "--choice");
        int rc = grammar_choice_to_ebnf(arr, ebnf_out, err);
        json_object_put(arr);
        return rc;
    }
    case GSPEC_JSON:
        *ebnf_out = grammar_json_builtin_ebnf(GRAMMAR_JSON_ANY_VALUE, s->any_whitespace, s->max_whitespace);
        return *ebnf_out ? 0 : tern_err_set(err, TERN_ENOMEM, "built-in JSON grammar: out of memory");
    case GSPEC_SCHEMA: {
        json_object *sch = tern_json_parse_file(s->arg, err);
        if (!sch)
            return err ? err->code : TERN_EIO;
        int rc = grammar_spec_schema_to_ebnf(s, sch, ebnf_out, err);
        json_object_put(sch);
        return rc;
    }
    }
    return tern_err_set(err, TERN_EINVAL, "no grammar given (--schema, --ebnf, --regex, --choice or --json)");
}

int grammar_spec_schema_to_ebnf(const grammar_spec *s, json_object *schema, char **ebnf_out, tern_err *err)
{
    grammar_schema_opts o;
    grammar_schema_opts_init(&o);
    o.any_whitespace = s->any_whitespace;
    o.max_whitespace = s->max_whitespace;
    return grammar_schema_to_ebnf(schema, &o, ebnf_out, err);
}

static grammar *spec_grammar(const grammar_spec *s, tern_err *err)
{
    char *ebnf = NULL;
    if (grammar_spec_to_ebnf(s, &ebnf, err))
        return NULL;
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), NULL, NULL, err);
    free(ebnf);
    return g;
}

static void usage(void)
{
    fprintf(stderr, "usage: tern grammar compile SPEC\n"
                    "       tern grammar check SPEC --input FILE|-   (- reads stdin; a trailing newline is allowed)\n"
                    "       tern grammar masks --tokenizer DIR SPEC --input FILE [--list] [--final]\n"
                    "       tern grammar bench --tokenizer DIR --data DIR [--limit N] [--match STR] [--jsonl [--slow-us N]]\n"
                    "SPEC: --schema FILE | --ebnf FILE | --regex RE | --choice JSON_ARRAY | --json\n"
                    "      [--any-whitespace=false] [--max-whitespace N|none]\n");
}

/* Shared argument parsing for the subcommands. */
typedef struct gargs {
    grammar_spec spec;
    const char *input, *tokenizer, *data;
    const char *match;
    long long limit, slow_us;
    int list, jsonl, final;
} gargs;

static int parse_args(gargs *a, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    grammar_spec_init(&a->spec);
    a->limit = -1;
    a->slow_us = -1;
    for (int i = 2; i < argc; i++) {
        int r = grammar_spec_parse_flag(&a->spec, argc, argv, &i);
        if (r < 0)
            return -1;
        if (r)
            continue;
        const char *v;
        if (!strcmp(argv[i], "--list")) {
            a->list = 1;
        } else if (!strcmp(argv[i], "--final")) {
            a->final = 1;
        } else if (!strcmp(argv[i], "--jsonl")) {
            a->jsonl = 1;
        } else if ((v = cli_flag_value(argc, argv, &i, "--input"))) {
            a->input = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--tokenizer"))) {
            a->tokenizer = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--data"))) {
            a->data = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--match"))) {
            a->match = v;
        } else if ((v = cli_flag_value(argc, argv, &i, "--slow-us"))) {
            if (cli_parse_int(v, 0, 1LL << 40, &a->slow_us))
                return -1;
        } else if ((v = cli_flag_value(argc, argv, &i, "--limit"))) {
            if (cli_parse_int(v, 0, 1LL << 40, &a->limit))
                return -1;
        } else {
            fprintf(stderr, "tern grammar: unknown argument '%s'\n", argv[i]);
            return -1;
        }
    }
    return 0;
}

static int cmd_compile(gargs *a)
{
    tern_err err = {0};
    grammar *g = spec_grammar(&a->spec, &err);
    if (!g) {
        fprintf(stderr, "tern grammar: %s\n", err.msg);
        return 2;
    }
    char *t = grammar_to_ebnf(g);
    grammar_free(g);
    if (!t) {
        fprintf(stderr, "tern grammar: out of memory\n");
        return 2;
    }
    fputs(t, stdout);
    free(t);
    return 0;
}

static char *read_stdin(size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    while (b) {
        size_t r = fread(b + n, 1, cap - n, stdin);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb)
                free(b);
            b = nb;
        }
    }
    if (b && ferror(stdin)) {
        free(b);
        b = NULL;
    }
    *len = n;
    return b;
}

/* Says why text[0..len) is rejected: the first byte no sentence can have
 * there (the longest accepted prefix, by bisection: every prefix of an
 * accepted prefix is accepted), or that the text stops short. */
static void explain_reject(const grammar *g, const char *text, size_t len)
{
    if (grammar_check_prefix(g, text, len) == 1) {
        fprintf(stderr, "tern grammar: rejected: the text ends before the grammar allows (after %zu bytes)\n", len);
        return;
    }
    size_t lo = 0, hi = len; /* prefix lo is accepted, prefix hi is not */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (grammar_check_prefix(g, text, mid) == 1)
            lo = mid;
        else
            hi = mid;
    }
    size_t line = 1, col = 1;
    for (size_t i = 0; i < lo; i++, col++)
        if (text[i] == '\n') {
            line++;
            col = 0;
        }
    size_t from = lo > 20 ? lo - 20 : 0;
    fprintf(stderr, "tern grammar: rejected at byte %zu (line %zu, column %zu): '%.*s' cannot be followed by ", lo,
            line, col, (int)(lo - from), text + from);
    unsigned char ch = (unsigned char)text[lo];
    if (ch >= 0x20 && ch < 0x7f)
        fprintf(stderr, "'%c'\n", ch);
    else
        fprintf(stderr, "byte 0x%02x\n", ch);
}

static int cmd_check(gargs *a)
{
    tern_err err = {0};
    if (!a->input) {
        usage();
        return 2;
    }
    grammar *g = spec_grammar(&a->spec, &err);
    if (!g) {
        fprintf(stderr, "tern grammar: %s\n", err.msg);
        return 2;
    }
    size_t len;
    char *text = !strcmp(a->input, "-") ? read_stdin(&len) : tern_file_read(a->input, &len, 0, &err);
    if (!text) {
        grammar_free(g);
        fprintf(stderr, "tern grammar: %s\n", !strcmp(a->input, "-") ? "cannot read stdin" : err.msg);
        return 2;
    }
    int rc = grammar_check_text(g, text, len);
    /* a file or a here-string ends with a newline the grammar need not allow */
    size_t n = len;
    while (rc == 0 && n && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        rc = grammar_check_text(g, text, --n);
    if (rc == 0)
        explain_reject(g, text, n);
    free(text);
    grammar_free(g);
    if (rc < 0) {
        fprintf(stderr, "tern grammar: check failed: %s\n", tern_err_str(rc));
        return 1;
    }
    return rc == 1 ? 0 : 1;
}

uint64_t grammar_mask_fnv1a(const grammar_vocab *v, const uint32_t *mask, int32_t *count_out)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    int32_t cnt = 0, w = grammar_vocab_mask_width(v);
    for (int32_t id = 0; id < w; id++) {
        if (!((mask[id / 32] >> (id % 32)) & 1))
            continue;
        size_t len;
        /* non-special = has grammar bytes (stop ids and padding excluded) */
        if (!grammar_vocab_token(v, id, &len))
            continue;
        uint8_t b[4] = {(uint8_t)id, (uint8_t)(id >> 8), (uint8_t)(id >> 16), (uint8_t)(id >> 24)};
        for (int k = 0; k < 4; k++) {
            h ^= b[k];
            h *= 0x100000001b3ULL;
        }
        cnt++;
    }
    if (count_out)
        *count_out = cnt;
    return h;
}

static int cmd_masks(gargs *a)
{
    tern_err err = {0};
    int rc = 2;
    if (!a->input || !a->tokenizer) {
        usage();
        return 2;
    }
    tern_tokenizer *tok = NULL;
    grammar_vocab *v = NULL;
    grammar_compiled *cg = NULL;
    grammar_matcher *m = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    uint32_t *mask = NULL;
    grammar *g = spec_grammar(&a->spec, &err);
    if (!g)
        goto fail;
    rc = 1;
    if (!(tok = tokenizer_load(a->tokenizer, &err)))
        goto fail;
    if (!(v = grammar_vocab_new(tok, 0, NULL, 0, &err)))
        goto fail;
    cg = grammar_compile(g, v, &err);
    g = NULL;
    if (!cg || !(m = grammar_matcher_new(cg, &err)))
        goto fail;
    size_t len, n_ids;
    if (!(text = tern_file_read(a->input, &len, 0, &err)))
        goto fail;
    if (tokenizer_encode(tok, text, len, 0, &ids, &n_ids, &err))
        goto fail;
    size_t nw = grammar_vocab_mask_words(v);
    mask = calloc(nw, sizeof *mask);
    if (!mask)
        goto fail;
    int alive = 1;
    for (size_t i = 0; alive && i <= n_ids; i++) {
        if (i == n_ids && !a->final)
            break;
        int n = grammar_matcher_fill_next_token_bitmask(m, mask, nw);
        if (n < 0) {
            tern_err_set(&err, n, "mask failed: %s", tern_err_str(n));
            goto fail;
        }
        int32_t cnt;
        uint64_t h = grammar_mask_fnv1a(v, mask, &cnt);
        int32_t id = i < n_ids ? ids[i] : -1;
        int acc = 0;
        if (i < n_ids && alive) {
            int r = grammar_matcher_accept_token(m, id);
            if (r < 0) {
                tern_err_set(&err, r, "accept failed: %s", tern_err_str(r));
                goto fail;
            }
            acc = r == 1;
            alive = acc;
        }
        if (i == n_ids)
            printf("{\"step\": %zu, \"token\": null, \"accepted\": null, \"can_end\": %s, \"allowed_count\": %d, "
                   "\"allowed_fnv1a64\": \"%016llx\"",
                   i, alive && grammar_matcher_can_end(m) ? "true" : "false", cnt, (unsigned long long)h);
        else
            printf("{\"step\": %zu, \"token\": %d, \"accepted\": %s, \"allowed_count\": %d, "
                   "\"allowed_fnv1a64\": \"%016llx\"",
                   i, id, acc ? "true" : "false", cnt, (unsigned long long)h);
        if (a->list) {
            printf(", \"allowed\": [");
            int first = 1;
            for (int32_t t = 0; t < grammar_vocab_mask_width(v); t++) {
                size_t tl;
                if (((mask[t / 32] >> (t % 32)) & 1) && grammar_vocab_token(v, t, &tl)) {
                    printf(first ? "%d" : ",%d", t);
                    first = 0;
                }
            }
            printf("]");
        }
        printf("}\n");
    }
    rc = 0;
    goto out;
fail:
    fprintf(stderr, "tern grammar: %s\n", err.msg[0] ? err.msg : "out of memory");
out:
    free(mask);
    free(ids);
    free(text);
    grammar_matcher_free(m);
    grammar_compiled_free(cg);
    grammar_free(g);
    grammar_vocab_free(v);
    tokenizer_free(tok);
    return rc;
}

int cmd_grammar(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    gargs a;
    if (parse_args(&a, argc, argv)) {
        usage();
        return 2;
    }
    if (!strcmp(argv[1], "compile"))
        return cmd_compile(&a);
    if (!strcmp(argv[1], "check"))
        return cmd_check(&a);
    if (!strcmp(argv[1], "masks"))
        return cmd_masks(&a);
    if (!strcmp(argv[1], "bench")) {
        if (!a.tokenizer || !a.data) {
            usage();
            return 2;
        }
        grammar_bench_opts o = {.tokenizer = a.tokenizer, .data = a.data, .match = a.match, .limit = a.limit,
                                .slow_us = a.slow_us, .jsonl = a.jsonl};
        return grammar_bench_run(&a.spec, &o);
    }
    fprintf(stderr, "tern grammar: unknown subcommand '%s'\n", argv[1]);
    usage();
    return 2;
}
