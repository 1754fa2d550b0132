/* The smallest program embedding tern, written against include/tern.h alone
 * and linked with the public libtern.a (build/examples/simple):
 *   simple MODEL_DIR PROMPT [MAX_TOKENS]
 * prints the prompt and its greedy continuation, then a newline; the token
 * count of the prompt goes to stderr. On an error it prints the code's name,
 * its default message and the specific one, and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tern.h"

static int on_token(void *user, int32_t token, const char *text, size_t text_len)
{
    (void)user;
    (void)token;
    fwrite(text, 1, text_len, stdout);
    return 0;
}

static int report(const tern_error *err)
{
    fprintf(stderr, "error %s (%s): %s\n", tern_err_name(err->code), tern_strerror(err->code), err->msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL_DIR PROMPT [MAX_TOKENS]\n", argv[0]);
        return 2;
    }
    tern_error err;
    tern_ctx *t = tern_open(argv[1], NULL, &err);
    if (!t)
        return report(&err);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *back = NULL;
    if (tern_tokenize(t, argv[2], 1, &ids, &n_ids, &err) || tern_detokenize(t, ids, n_ids, &back, &err)) {
        free(ids);
        tern_close(t);
        return report(&err);
    }
    fprintf(stderr, "%zu prompt tokens, read back as \"%s\"\n", n_ids, back);
    free(back);
    free(ids);

    tern_gen_opts o;
    tern_gen_opts_init(&o);
    o.temperature = 0;
    o.max_tokens = argc > 3 ? atoi(argv[3]) : 64;
    int n = 0;
    fputs(argv[2], stdout);
    int rc = tern_generate(t, argv[2], &o, on_token, NULL, &n, &err);
    fputc('\n', stdout);
    tern_close(t);
    if (rc)
        return report(&err);
    fprintf(stderr, "%d tokens generated\n", n);
    return 0;
}
