/* `tern tokenize DIR [--no-special] [--jsonl]` and
 * `tern detokenize DIR [--skip-special] [--jsonl]`: stdin to stdout through
 * the tokenizer of DIR (a model folder or a tokenizer-only folder).
 * --jsonl: one JSON value per input line (a string to tokenize, an id array
 * to detokenize), one JSON line out per input line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "base/json.h"
#include "cli.h"
#include "tokenizer/tokenizer.h"

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static void print_ids(const int32_t *ids, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", ids[i]);
    fputs("]\n", stdout);
}

static void print_json_string(const char *s, size_t len)
{
    size_t need = tern_json_escape(NULL, 0, s, len);
    char *b = malloc(need + 1);
    if (!b)
        return;
    tern_json_escape(b, need + 1, s, len);
    fwrite(b, 1, need, stdout);
    putchar('\n');
    free(b);
}

static int parse_args(int argc, char **argv, const char *flag, const char **dir, int *flag_on, int *jsonl)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], flag))
            *flag_on = 1;
        else if (!strcmp(argv[i], "--jsonl"))
            *jsonl = 1;
        else if (argv[i][0] == '-' || *dir)
            return -1;
        else
            *dir = argv[i];
    }
    return *dir ? 0 : -1;
}

/* Ids of a JSON array of integers; -1 on a malformed value. */
static int json_ids(json_object *o, int32_t **ids, size_t *n)
{
    if (!o || !json_object_is_type(o, json_type_array))
        return -1;
    size_t k = json_object_array_length(o);
    *ids = malloc((k ? k : 1) * sizeof **ids);
    if (!*ids)
        return -1;
    for (size_t i = 0; i < k; i++) {
        json_object *v = json_object_array_get_idx(o, i);
        int64_t x;
        if (!v || !json_object_is_type(v, json_type_int) || (x = json_object_get_int64(v)) < INT32_MIN || x > INT32_MAX) {
            free(*ids);
            return -1;
        }
        (*ids)[i] = (int32_t)x;
    }
    *n = k;
    return 0;
}

/* "tern tokenize" or "tern detokenize": the start of every error line. */
static const char *who = "tern";

/* Calls fn on every line of stdin; stops at the first failure. */
static int each_line(int (*fn)(tern_tokenizer *, const char *, size_t, int, size_t), tern_tokenizer *tok, int flag)
{
    size_t len;
    char *all = read_all(stdin, &len);
    if (!all) {
        fprintf(stderr, "%s: cannot read stdin\n", who);
        return 1;
    }
    int rc = 0;
    size_t line = 0;
    for (size_t i = 0; i < len && !rc;) {
        char *nl = memchr(all + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - all) : len;
        line++;
        if (e > i)
            rc = fn(tok, all + i, e - i, flag, line);
        i = e + 1;
    }
    free(all);
    return rc;
}

static int encode_line(tern_tokenizer *tok, const char *s, size_t n, int add_special, size_t line)
{
    tern_err err = {0};
    json_object *o = tern_json_parse(s, n, &err);
    if (!o || !json_object_is_type(o, json_type_string)) {
        fprintf(stderr, "%s: line %zu: expected a JSON string%s%s\n", who, line, o ? "" : ": ", o ? "" : err.msg);
        json_object_put(o);
        return 1;
    }
    int32_t *ids;
    size_t k;
    int rc = tokenizer_encode(tok, json_object_get_string(o), (size_t)json_object_get_string_len(o), add_special, &ids,
                              &k, &err);
    json_object_put(o);
    if (rc) {
        fprintf(stderr, "%s: line %zu: %s\n", who, line, err.msg);
        return 1;
    }
    print_ids(ids, k);
    free(ids);
    return 0;
}

static int decode_line(tern_tokenizer *tok, const char *s, size_t n, int skip, size_t line)
{
    tern_err err = {0};
    json_object *o = tern_json_parse(s, n, &err);
    int32_t *ids;
    size_t k;
    if (json_ids(o, &ids, &k)) {
        fprintf(stderr, "%s: line %zu: expected a JSON array of ids\n", who, line);
        json_object_put(o);
        return 1;
    }
    json_object_put(o);
    char *text;
    size_t len;
    int rc = tokenizer_decode(tok, ids, k, skip, &text, &len, &err);
    free(ids);
    if (rc) {
        fprintf(stderr, "%s: line %zu: %s\n", who, line, err.msg);
        return 1;
    }
    print_json_string(text, len);
    free(text);
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL;
    int no_special = 0, jsonl = 0;
    who = "tern tokenize";
    if (parse_args(argc, argv, "--no-special", &dir, &no_special, &jsonl)) {
        fprintf(stderr, "usage: tern tokenize DIR [--no-special] [--jsonl] < text\n");
        return 2;
    }
    tern_err err = {0};
    tern_tokenizer *tok = tokenizer_load(dir, &err);
    if (!tok) {
        fprintf(stderr, "%s: %s\n", who, err.msg);
        return 1;
    }
    int rc = 0;
    if (jsonl) {
        rc = each_line(encode_line, tok, !no_special);
    } else {
        size_t len;
        char *text = read_all(stdin, &len);
        int32_t *ids;
        size_t n;
        if (!text) {
            fprintf(stderr, "%s: cannot read stdin\n", who);
            rc = 1;
        } else if (tokenizer_encode(tok, text, len, !no_special, &ids, &n, &err)) {
            fprintf(stderr, "%s: %s\n", who, err.msg);
            rc = 1;
        } else {
            print_ids(ids, n);
            free(ids);
        }
        free(text);
    }
    tokenizer_free(tok);
    return fflush(stdout) ? 1 : rc;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *dir = NULL;
    int skip = 0, jsonl = 0;
    who = "tern detokenize";
    if (parse_args(argc, argv, "--skip-special", &dir, &skip, &jsonl)) {
        fprintf(stderr, "usage: tern detokenize DIR [--skip-special] [--jsonl] < ids.json\n");
        return 2;
    }
    tern_err err = {0};
    tern_tokenizer *tok = tokenizer_load(dir, &err);
    if (!tok) {
        fprintf(stderr, "%s: %s\n", who, err.msg);
        return 1;
    }
    int rc = 0;
    if (jsonl) {
        rc = each_line(decode_line, tok, skip);
    } else {
        size_t len;
        char *in = read_all(stdin, &len);
        json_object *o = in ? tern_json_parse(in, len, &err) : NULL;
        int32_t *ids;
        size_t n;
        char *text;
        size_t tl;
        if (json_ids(o, &ids, &n)) {
            fprintf(stderr, "%s: expected a JSON array of ids on stdin\n", who);
            rc = 1;
        } else {
            if (tokenizer_decode(tok, ids, n, skip, &text, &tl, &err)) {
                fprintf(stderr, "%s: %s\n", who, err.msg);
                rc = 1;
            } else {
                fwrite(text, 1, tl, stdout);
                free(text);
            }
            free(ids);
        }
        json_object_put(o);
        free(in);
    }
    tokenizer_free(tok);
    return fflush(stdout) ? 1 : rc;
}
