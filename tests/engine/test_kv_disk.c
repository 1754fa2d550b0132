/* The prefix cache's disk tier on its own (kv_disk.c): blocks of random KV
 * written and read back byte for byte (raw and zstd, across a reopen), every
 * check that keeps a wrong block from being served (another parent, other
 * tokens, a flipped byte, a truncated file, a torn .tmp), the LRU budget
 * (a block read back is kept over an older one), fingerprints, and a
 * directory that cannot be created. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/kv_disk.h"

#define N_LAYER 3
#define KV_DIM 8
#define BS 16
#define N_BLOCKS 8

static char g_dir[256];

static void pool_fill(kv_pool *p, unsigned seed)
{
    size_t n = (size_t)p->n_layer * p->n_blocks * p->block_size * p->kv_dim;
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p->k[i] = (float)(seed >> 8) / 65536.0f - 128.0f;
        seed = seed * 1103515245u + 12345u;
        p->v[i] = (float)(seed >> 8) / 65536.0f - 128.0f;
    }
}

/* Whether block a and block b of p hold the same K and V in every layer. */
static int block_equal(const kv_pool *p, int a, int b)
{
    size_t slab = (size_t)p->block_size * p->kv_dim;
    for (int l = 0; l < p->n_layer; l++) {
        size_t oa = ((size_t)l * p->n_blocks + a) * slab, ob = ((size_t)l * p->n_blocks + b) * slab;
        if (memcmp(p->k + oa, p->k + ob, slab * sizeof(float)) || memcmp(p->v + oa, p->v + ob, slab * sizeof(float)))
            return 0;
    }
    return 1;
}

static void tokens_of(int32_t *t, int blk)
{
    for (int i = 0; i < BS; i++)
        t[i] = 100 * blk + i;
}

static kvdisk *open_tier(kv_pool *p, size_t budget, int zstd)
{
    kvdisk_opts o = {0};
    o.dir = g_dir;
    o.budget_bytes = budget;
    o.zstd_level = zstd;
    o.fingerprint = 0x1234;
    o.pools[0] = p;
    o.n_pools = 1;
    tern_err err = {0};
    kvdisk *d = kvdisk_open(&o, &err);
    if (!d)
        fprintf(stderr, "%s\n", err.msg);
    assert_non_null(d);
    return d;
}

/* Reads block h and writes it into block blk (a regular block). */
static int kvdisk_get(kvdisk *d, uint64_t h, uint64_t parent, const int32_t *t, int32_t blk)
{
    int sink = -1;
    int rc = kvdisk_read(d, h, parent, t, &sink);
    if (rc)
        return rc;
    assert_int_equal(sink, 0);
    return kvdisk_scatter(d, blk);
}

static void wait_writes(kvdisk *d, long long n)
{
    kvdisk_stats st;
    for (int i = 0; i < 2000; i++) {
        kvdisk_stats_get(d, &st);
        if (st.writes >= n)
            return;
        usleep(1000);
    }
    fail_msg("the writer wrote %lld of %lld blocks", st.writes, n);
}

static void file_of(char *buf, size_t cap, uint64_t h, const char *ext)
{
    snprintf(buf, cap, "%s/%016llx/%016llx.%s", g_dir, 0x1234ull, (unsigned long long)h, ext);
}

static void clear_dir(void)
{
    char sub[512], f[1024];
    snprintf(sub, sizeof sub, "%s/%016llx", g_dir, 0x1234ull);
    DIR *d = opendir(sub);
    for (struct dirent *e; d && (e = readdir(d));)
        if (e->d_name[0] != '.') {
            snprintf(f, sizeof f, "%s/%s", sub, e->d_name);
            unlink(f);
        }
    if (d)
        closedir(d);
}

static void roundtrip(int zstd)
{
    clear_dir();
    kv_pool p;
    assert_int_equal(kv_pool_init(&p, N_LAYER, KV_DIM, BS, N_BLOCKS, NULL), 0);
    pool_fill(&p, 7);
    if (zstd) /* compressible: the zstd path must be taken */
        for (size_t i = 0; i < (size_t)N_LAYER * N_BLOCKS * BS * KV_DIM; i++)
            p.k[i] = (float)(i % 5), p.v[i] = (float)(i % 3) + (float)(i / (BS * KV_DIM)); /* per-block values */
    kvdisk *d = open_tier(&p, 1 << 20, zstd);
    int32_t t[BS];
    for (int b = 0; b < 4; b++) {
        tokens_of(t, b);
        assert_int_equal(kvdisk_put(d, 1000 + b, b ? 1000 + b - 1 : 0, t, b, 1), 1);
    }
    tokens_of(t, 0);
    assert_int_equal(kvdisk_put(d, 1000, 0, t, 0, 1), 0); /* already queued or written */
    kvdisk_close(d);

    d = open_tier(&p, 1 << 20, zstd); /* a restart: the index comes from the directory */
    kvdisk_stats st;
    kvdisk_stats_get(d, &st);
    assert_int_equal(st.n_blocks, 4);
    for (int b = 0; b < 4; b++) {
        int dst = 4 + b;
        assert_false(block_equal(&p, b, dst));
        tokens_of(t, b);
        assert_int_equal(kvdisk_get(d, 1000 + b, b ? 1000 + b - 1 : 0, t, dst), 0);
        assert_true(block_equal(&p, b, dst));
    }
    kvdisk_stats_get(d, &st);
    assert_int_equal(st.hits, 4);
    assert_int_equal(st.corrupt, 0);
    if (zstd == 0)
        assert_int_equal(st.hit_bytes, 4 * st.block_file_bytes);
    else
        assert_true(st.hit_bytes < 2 * st.block_file_bytes);
    assert_int_equal(kvdisk_get(d, 999, 0, t, 5), TERN_ENOTFOUND);
    kvdisk_close(d);
    kv_pool_free(&p);
}

static void test_roundtrip_raw(void **state)
{
    (void)state;
    roundtrip(0);
}

static void test_roundtrip_zstd(void **state)
{
    (void)state;
    roundtrip(3);
}

static void test_never_serves_a_wrong_block(void **state)
{
    (void)state;
    clear_dir();
    kv_pool p;
    assert_int_equal(kv_pool_init(&p, N_LAYER, KV_DIM, BS, N_BLOCKS, NULL), 0);
    pool_fill(&p, 11);
    kvdisk *d = open_tier(&p, 1 << 20, 0);
    int32_t t[BS];
    for (int b = 0; b < 5; b++) {
        tokens_of(t, b);
        kvdisk_put(d, 2000 + b, 0, t, b, 1);
    }
    wait_writes(d, 5);
    kvdisk_close(d);
    char f[1024];
    /* a flipped byte in the KV, a truncated file, a partial write */
    file_of(f, sizeof f, 2002, "kvb");
    FILE *fp = fopen(f, "r+b");
    assert_non_null(fp);
    fseek(fp, 72 + BS * 4 + 500, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, 72 + BS * 4 + 500, SEEK_SET);
    fputc(c ^ 0x01, fp);
    fclose(fp);
    file_of(f, sizeof f, 2003, "kvb");
    assert_int_equal(truncate(f, 200), 0);
    file_of(f, sizeof f, 2009, "tmp");
    fp = fopen(f, "wb");
    fputs("partial", fp);
    fclose(fp);

    pool_fill(&p, 11);
    d = open_tier(&p, 1 << 20, 0);
    kvdisk_stats st;
    kvdisk_stats_get(d, &st);
    assert_int_equal(st.torn, 1);
    assert_int_equal(access(f, F_OK), -1); /* the .tmp is gone */
    tokens_of(t, 0);
    assert_int_equal(kvdisk_get(d, 2000, 1, t, 6), TERN_EFORMAT); /* another parent */
    tokens_of(t, 1);
    t[3]++;
    assert_int_equal(kvdisk_get(d, 2001, 0, t, 6), TERN_EFORMAT); /* other tokens */
    tokens_of(t, 2);
    assert_int_equal(kvdisk_get(d, 2002, 0, t, 6), TERN_EFORMAT); /* bit flip */
    tokens_of(t, 3);
    assert_int_equal(kvdisk_get(d, 2003, 0, t, 6), TERN_EFORMAT); /* truncated */
    tokens_of(t, 4);
    assert_int_equal(kvdisk_get(d, 2004, 0, t, 6), 0);
    assert_true(block_equal(&p, 4, 6));
    kvdisk_stats_get(d, &st);
    assert_int_equal(st.corrupt, 4);
    assert_int_equal(st.n_blocks, 1);
    file_of(f, sizeof f, 2002, "kvb");
    assert_int_equal(access(f, F_OK), -1); /* deleted */
    tokens_of(t, 2);
    assert_int_equal(kvdisk_get(d, 2002, 0, t, 6), TERN_ENOTFOUND); /* and never tried again */
    kvdisk_close(d);
    kv_pool_free(&p);
}

static void test_lru_budget(void **state)
{
    (void)state;
    clear_dir();
    kv_pool p;
    assert_int_equal(kv_pool_init(&p, N_LAYER, KV_DIM, BS, N_BLOCKS, NULL), 0);
    pool_fill(&p, 3);
    kvdisk *d = open_tier(&p, 1 << 20, 0);
    kvdisk_stats st;
    kvdisk_stats_get(d, &st);
    long long fb = st.block_file_bytes;
    kvdisk_close(d);
    clear_dir();
    d = open_tier(&p, (size_t)(fb * 3 + fb / 2), 0); /* room for 3 files */
    int32_t t[BS];
    for (int b = 0; b < 3; b++) {
        tokens_of(t, b);
        kvdisk_put(d, 3000 + b, 0, t, b, 1);
        wait_writes(d, b + 1);
    }
    tokens_of(t, 0);
    assert_int_equal(kvdisk_get(d, 3000, 0, t, 7), 0); /* 3000 is now the most recent */
    tokens_of(t, 3);
    kvdisk_put(d, 3003, 0, t, 3, 1);
    wait_writes(d, 4);
    kvdisk_close(d); /* drains the writer and its budget pass */
    d = open_tier(&p, (size_t)(fb * 3 + fb / 2), 0);
    kvdisk_stats_get(d, &st);
    assert_int_equal(st.n_blocks, 3);
    assert_true(st.bytes_used <= st.budget_bytes);
    tokens_of(t, 1);
    assert_int_equal(kvdisk_get(d, 3001, 0, t, 7), TERN_ENOTFOUND); /* the least recently used went */
    for (int b = 0; b < 4; b += b == 0 ? 2 : 1) {
        tokens_of(t, b);
        assert_int_equal(kvdisk_get(d, 3000 + b, 0, t, 7), 0);
        assert_true(block_equal(&p, b, 7));
    }
    kvdisk_close(d);
    kv_pool_free(&p);
}

/* A q8 pool with 16-bit sink blocks: each block's stored bytes go to disk
 * and come back into a block of its own kind, byte for byte. */
static void test_typed_pool_and_sinks(void **state)
{
    (void)state;
    clear_dir();
    kv_spec spec;
    kv_spec_init(&spec, KV_Q8);
    spec.quant_start = BS;
    kv_pool p;
    tern_err err = {0};
    assert_int_equal(kv_pool_init_spec(&p, &spec, 2, 128, 64, BS, 8, 2, 1, &err), 0);
    assert_int_equal(p.n_sink, 2);
    for (size_t i = 0; i < kv_pool_bytes(&p) / 2; i++) /* any bytes: the tier copies formats as stored */
        p.mem_k[i] = (uint8_t)(i * 7 + 1), p.mem_v[i] = (uint8_t)(i * 13 + 5);
    kvdisk *d = open_tier(&p, 1 << 20, 0);
    int32_t t[BS];
    int32_t src[2] = {0, 5}; /* a sink block, a regular one */
    size_t len[2] = {kv_block_bytes(&p, 0), kv_block_bytes(&p, 5)};
    assert_true(len[0] > len[1]); /* 16-bit sink rows are larger than q8 ones */
    unsigned char *want[2], *got = malloc(len[0]);
    for (int k = 0; k < 2; k++) {
        want[k] = malloc(len[k]);
        kv_block_save(&p, src[k], want[k]);
        tokens_of(t, k);
        assert_int_equal(kvdisk_put(d, 4000 + k, 0, t, src[k], 1), 1);
    }
    kvdisk_close(d);
    d = open_tier(&p, 1 << 20, 0);
    int32_t dst[2] = {1, 6};
    for (int k = 0; k < 2; k++) {
        int sink = -1;
        tokens_of(t, k);
        assert_int_equal(kvdisk_read(d, 4000 + k, 0, t, &sink), 0);
        assert_int_equal(sink, k == 0);
        assert_int_equal(kvdisk_scatter(d, dst[1 - k]), TERN_EINVAL); /* a block of the other kind */
        assert_int_equal(kvdisk_read(d, 4000 + k, 0, t, &sink), 0);
        assert_int_equal(kvdisk_scatter(d, dst[k]), 0);
        kv_block_save(&p, dst[k], got);
        assert_memory_equal(got, want[k], len[k]);
        free(want[k]);
    }
    free(got);
    kvdisk_close(d);
    kv_pool_free(&p);
}

static void test_fingerprint_and_bad_dir(void **state)
{
    (void)state;
    kv_pool p, q;
    assert_int_equal(kv_pool_init(&p, N_LAYER, KV_DIM, BS, 2, NULL), 0);
    assert_int_equal(kv_pool_init(&q, N_LAYER, KV_DIM * 2, BS, 2, NULL), 0);
    kv_pool *pp[1] = {&p}, *qq[1] = {&q};
    int cfg = 1;
    uint64_t f0 = kvdisk_fingerprint(1, &cfg, sizeof cfg, "f32", pp, 1);
    assert_int_equal(f0, kvdisk_fingerprint(1, &cfg, sizeof cfg, "f32", pp, 1));
    assert_int_not_equal(f0, kvdisk_fingerprint(2, &cfg, sizeof cfg, "f32", pp, 1));
    assert_int_not_equal(f0, kvdisk_fingerprint(1, &cfg, sizeof cfg, "q8", pp, 1));
    assert_int_not_equal(f0, kvdisk_fingerprint(1, &cfg, sizeof cfg, "f32", qq, 1));
    cfg = 2;
    assert_int_not_equal(f0, kvdisk_fingerprint(1, &cfg, sizeof cfg, "f32", pp, 1));
    /* a directory under a regular file cannot be created */
    char file[300], sub[320];
    snprintf(file, sizeof file, "%s/plain", g_dir);
    FILE *fp = fopen(file, "w");
    fclose(fp);
    snprintf(sub, sizeof sub, "%s/kv", file);
    kvdisk_opts o = {0};
    o.dir = sub;
    o.budget_bytes = 1 << 20;
    o.fingerprint = 1;
    o.pools[0] = &p;
    o.n_pools = 1;
    tern_err err = {0};
    assert_null(kvdisk_open(&o, &err));
    assert_int_equal(err.code, TERN_EIO);
    assert_non_null(strstr(err.msg, "cannot create"));
    unlink(file);
    kv_pool_free(&p);
    kv_pool_free(&q);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "%s/tern-kvdisk-test-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    clear_dir();
    char sub[512];
    snprintf(sub, sizeof sub, "%s/%016llx", g_dir, 0x1234ull);
    rmdir(sub);
    rmdir(g_dir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_raw),
        cmocka_unit_test(test_roundtrip_zstd),
        cmocka_unit_test(test_never_serves_a_wrong_block),
        cmocka_unit_test(test_lru_budget),
        cmocka_unit_test(test_typed_pool_and_sinks),
        cmocka_unit_test(test_fingerprint_and_bad_dir),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
