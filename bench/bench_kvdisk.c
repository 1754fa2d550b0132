/* bench_kvdisk: time to first token of one long prompt whose prefix is
 * cold, in the prefix cache's memory tier, and in its disk tier.
 *
 *   bench_kvdisk MODEL_DIR [--prompt-len 4096] [--dir PARENT] [--zstd LEVEL] [--threads N]
 *
 * One engine runs the prompt cold, then again (memory); it is freed (the
 * cache is flushed to the disk tier); a new engine runs it (disk, the files
 * in the page cache); the block files are then dropped from the page cache
 * (fsync + POSIX_FADV_DONTNEED) and a third engine runs it (disk, read from
 * the device as far as the kernel lets go of the pages). Each run generates
 * one token. The model's max_position_embeddings must exceed the prompt. */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "engine/engine.h"

static void make_prompt(int32_t *ids, int n, int n_vocab)
{
    for (int i = 0; i < n; i++)
        ids[i] = 10 + (int32_t)(((unsigned)(i + 1) * 2654435761u) % (unsigned)(n_vocab - 20));
}

/* Submits the prompt for one token; its TTFT and cached positions. */
static int run_once(tern_engine *e, const int32_t *ids, int n, double *ttft, int *cached)
{
    tern_err err = {0};
    engine_params p;
    engine_params_default(&p);
    p.prompt = ids;
    p.n_prompt = (size_t)n;
    p.max_tokens = 1;
    p.ignore_eos = 1;
    p.sample.temperature = 0;
    engine_req *r = engine_submit(e, &p, NULL, NULL, &err);
    if (!r) {
        fprintf(stderr, "bench_kvdisk: %s\n", err.msg);
        return 1;
    }
    engine_event ev;
    int rc = 1;
    while (engine_req_next(r, &ev, -1)) {
        int fin = ev.kind == ENGINE_EV_FINISH;
        if (fin) {
            *ttft = ev.usage.ttft_s;
            *cached = ev.usage.n_cached;
            rc = ev.finish == ENGINE_FINISH_ERROR;
        }
        engine_event_clear(&ev);
        if (fin)
            break;
    }
    engine_req_release(r);
    return rc;
}

/* Drops every block file under dir/<fingerprint>/ from the page cache, or
 * (remove) deletes them and the directories. */
static void walk_files(const char *dir, int remove)
{
    DIR *top = opendir(dir);
    char sub[PATH_MAX], f[PATH_MAX * 2];
    for (struct dirent *a; top && (a = readdir(top));) {
        if (a->d_name[0] == '.')
            continue;
        snprintf(sub, sizeof sub, "%s/%s", dir, a->d_name);
        DIR *d = opendir(sub);
        for (struct dirent *b; d && (b = readdir(d));) {
            snprintf(f, sizeof f, "%s/%s", sub, b->d_name);
            if (remove) {
                unlink(f);
                continue;
            }
            int fd = open(f, O_RDONLY);
            if (fd < 0)
                continue;
            fsync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        if (d)
            closedir(d);
        if (remove)
            rmdir(sub);
    }
    if (top)
        closedir(top);
    if (remove)
        rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_kvdisk MODEL_DIR [--prompt-len N] [--dir PARENT] [--zstd LEVEL] [--threads N]\n");
        return 2;
    }
    const char *model_dir = argv[1], *parent = "/tmp";
    int n = 4096, zstd = 0, threads = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--prompt-len"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir"))
            parent = argv[i + 1];
        else if (!strcmp(argv[i], "--zstd"))
            zstd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads"))
            threads = atoi(argv[i + 1]);
    }
    tern_log_set_level(TERN_LOG_WARN);
    tern_err err = {0};
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/bench-kvdisk-XXXXXX", parent);
    tern_model *m = model_load(model_dir, threads, &err);
    tern_tokenizer *tok = m ? tokenizer_load(model_dir, &err) : NULL;
    if (!m || !tok || !mkdtemp(dir)) {
        fprintf(stderr, "bench_kvdisk: %s\n", err.msg[0] ? err.msg : "cannot create the directory");
        return 1;
    }
    if (n + 1 >= model_config_get(m)->max_pos) {
        fprintf(stderr, "bench_kvdisk: the prompt needs max_position_embeddings > %d (the model has %d)\n", n + 1,
                model_config_get(m)->max_pos);
        return 1;
    }
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    make_prompt(ids, n, model_config_get(m)->n_vocab);
    engine_opts o;
    engine_opts_default(&o);
    o.max_batch = 1;
    o.kv_disk_dir = dir;
    o.kv_disk_zstd = zstd;
    if (kvdisk_model_id(model_dir, &o.kv_disk_model_id, &err)) {
        fprintf(stderr, "bench_kvdisk: %s\n", err.msg);
        return 1;
    }
    const char *names[4] = {"cold (prefill)", "memory tier", "disk tier (page cache)", "disk tier (dropped cache)"};
    double t[4] = {0};
    int c[4] = {0};
    for (int run = 0, k = 0; run < 3; run++) {
        if (run == 2)
            walk_files(dir, 0);
        tern_engine *e = engine_new(m, tok, &o, &err);
        if (!e) {
            fprintf(stderr, "bench_kvdisk: %s\n", err.msg);
            return 1;
        }
        if (run_once(e, ids, n, &t[k], &c[k]))
            return 1;
        k++;
        if (run == 0) {
            if (run_once(e, ids, n, &t[k], &c[k]))
                return 1;
            k++;
        }
        engine_free(e); /* flushes the memory tier to disk */
    }
    printf("prompt %d tokens, %d threads, zstd %d\n", n, model_n_threads(m), zstd);
    printf("%-28s %10s %8s %12s\n", "source", "TTFT ms", "cached", "vs cold");
    for (int k = 0; k < 4; k++)
        printf("%-28s %10.1f %8d %11.1fx\n", names[k], t[k] * 1e3, c[k], t[k] > 0 ? t[0] / t[k] : 0);
    walk_files(dir, 1);
    free(ids);
    tokenizer_free(tok);
    model_free(m);
    return 0;
}
