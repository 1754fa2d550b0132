/* Tokenizer benchmark: load time and single-thread encode throughput.
 * Usage: bench_tokenizer DIR CORPUS.jsonl [RUNS]
 * CORPUS.jsonl holds one JSON string per line (tests/tokenizer/gen_corpus.py
 * writes one). Prints the load time, then MB/s for a cold first pass (empty
 * pre-token cache) and the best of RUNS warm passes, encoding each line
 * separately with add_special. bench/bench_tokenizer.sh runs it next to the
 * HF oracle on the same corpus. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <json-c/json.h>

#include "base/file.h"
#include "base/json.h"
#include "tokenizer/tokenizer.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer DIR CORPUS.jsonl [RUNS]\n");
        return 2;
    }
    int runs = argc > 3 ? atoi(argv[3]) : 3;
    tern_err e = {0};
    size_t len;
    char *all = tern_file_read(argv[2], &len, 0, &e);
    if (!all) {
        fprintf(stderr, "bench_tokenizer: %s\n", e.msg);
        return 1;
    }
    /* decode the JSON lines once, outside the timing */
    size_t n = 0, cap = 1024, bytes = 0;
    char **texts = malloc(cap * sizeof *texts);
    size_t *lens = malloc(cap * sizeof *lens);
    for (char *p = all; p && *p;) {
        char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        json_object *o = l ? tern_json_parse(p, l, NULL) : NULL;
        if (o && json_object_is_type(o, json_type_string)) {
            if (n == cap) {
                cap *= 2;
                texts = realloc(texts, cap * sizeof *texts);
                lens = realloc(lens, cap * sizeof *lens);
            }
            lens[n] = (size_t)json_object_get_string_len(o);
            texts[n] = malloc(lens[n] + 1);
            memcpy(texts[n], json_object_get_string(o), lens[n] + 1);
            bytes += lens[n];
            n++;
        }
        json_object_put(o);
        p = nl ? nl + 1 : NULL;
    }
    free(all);
    double t0 = now();
    tern_tokenizer *tok = tokenizer_load(argv[1], &e);
    double t_load = now() - t0;
    if (!tok) {
        fprintf(stderr, "bench_tokenizer: %s\n", e.msg);
        return 1;
    }
    double best = 1e30, cold = 0;
    size_t n_ids = 0;
    for (int r = 0; r <= runs; r++) {
        t0 = now();
        n_ids = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t *ids;
            size_t k;
            if (tokenizer_encode(tok, texts[i], lens[i], 1, &ids, &k, &e)) {
                fprintf(stderr, "bench_tokenizer: %s\n", e.msg);
                return 1;
            }
            n_ids += k;
            free(ids);
        }
        double dt = now() - t0;
        if (r == 0)
            cold = dt;
        else if (dt < best)
            best = dt;
    }
    printf("tern    %-40s load %.3f s  encode cold %.1f MB/s  warm %.1f MB/s  (%zu lines, %.2f MB, %zu ids)\n",
           argv[1], t_load, bytes / cold / 1e6, bytes / best / 1e6, n, bytes / 1e6, n_ids);
    tokenizer_free(tok);
    for (size_t i = 0; i < n; i++)
        free(texts[i]);
    free(texts);
    free(lens);
    return 0;
}
