/* tern template DIR [--jsonl]: renders chat requests read from stdin with the
 * chat template of a model or tokenizer folder, exactly as transformers'
 * apply_chat_template(tokenize=False) would. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "cli.h"
#include "template/template.h"

/* Reads all of stdin (bounded: a chat request over 256 MiB is a mistake). */
static char *read_stdin(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap >= (256u << 20)) {
                free(buf);
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, stdin);
        n += k;
        if (k == 0)
            break;
    }
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

static void print_json_line(const char *key, const char *s, size_t len)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, key, json_object_new_string_len(s, (int)len));
    fputs(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE), stdout);
    fputc('\n', stdout);
    json_object_put(o);
}

static int render_one(const tern_chat_template *ct, const char *buf, size_t len, int jsonl)
{
    tern_err err = {0};
    json_object *req = tern_json_parse(buf, len, &err);
    char *text = NULL;
    size_t tlen = 0;
    if (req && !json_object_is_type(req, json_type_object))
        tern_err_set(&err, TERN_EINVAL, "request must be a JSON object");
    else if (req)
        text = tern_chat_template_apply(ct, req, NULL, &tlen, &err);
    json_object_put(req);
    if (!text) {
        if (jsonl)
            print_json_line("error", err.msg, strlen(err.msg));
        else
            fprintf(stderr, "tern template: %s\n", err.msg);
        return 1;
    }
    if (jsonl)
        print_json_line("text", text, tlen);
    else
        fwrite(text, 1, tlen, stdout);
    free(text);
    return 0;
}

int cmd_template(int argc, char **argv)
{
    const char *dir = NULL;
    int jsonl = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--jsonl"))
            jsonl = 1;
        else if (argv[i][0] == '-' || dir) {
            fprintf(stderr, "usage: tern template DIR [--jsonl] < request.json\n");
            return 2;
        } else
            dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: tern template DIR [--jsonl] < request.json\n");
        return 2;
    }
    tern_err err = {0};
    tern_chat_template ct;
    if (tern_chat_template_load(dir, &ct, &err)) {
        fprintf(stderr, "tern template: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (!jsonl) {
        size_t len;
        char *buf = read_stdin(&len);
        if (!buf) {
            fprintf(stderr, "tern template: cannot read stdin\n");
            rc = 1;
        } else {
            rc = render_one(&ct, buf, len, 0);
            free(buf);
        }
    } else {
        char *line = NULL;
        size_t cap = 0;
        ssize_t n;
        while ((n = getline(&line, &cap, stdin)) > 0) {
            size_t len = (size_t)n;
            while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
                len--;
            if (!len)
                continue;
            render_one(&ct, line, len, 1);
            fflush(stdout);
        }
        free(line);
    }
    tern_chat_template_free(&ct);
    return rc;
}
