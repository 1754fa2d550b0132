/* The prefix cache's disk tier (see kv_disk.h).
 *
 * Layout: DIR/<fingerprint as 16 hex digits>/<chain hash as 16 hex>.kvb, one
 * file per block, written as <hash>.tmp and renamed, so a crash leaves a
 * .tmp file (deleted and counted as torn at the next open) rather than a
 * half-written block under its final name. The file is
 *
 *   header (kvd_header below, little-endian, 72 bytes)
 *   int32 tokens[block_size]           the block's tokens (collision check)
 *   payload[stored_len]                raw or zstd-compressed block bytes
 *
 * where the raw block bytes are, for every pool in order, kv_block_save's
 * bytes (per layer, K rows then V rows, as stored: the KV type's format;
 * flag 2 marks a sink block's format, loaded only into a sink block), and
 * checksum is XXH3-64 over the header (checksum field zero), the tokens and
 * the stored payload. A file that is short, long, of another fingerprint,
 * hash, parent or token content, or whose checksum or decompressed length
 * differ, is never served: it is deleted and counted as corrupt.
 *
 * Threads: the engine thread calls put (copies the block, queues it), get
 * and has; the writer thread writes queued blocks and deletes least recently
 * used files past the budget. The index, the queue and the counters are
 * under d->mu; file I/O happens outside it. */
#include "engine/kv_disk.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include <zstd.h>

#include "base/log.h"

#define KVD_MAGIC "TERNKVB"
#define KVD_VERSION 1u
#define KVD_FLAG_ZSTD 1u
#define KVD_FLAG_SINK 2u
/* The default writer queue: a few hundred blocks of a small model, a few
 * dozen of an 8B one - enough to absorb an eviction burst, small next to
 * the KV pool itself. */
#define KVD_QUEUE_DEFAULT ((size_t)64 << 20)

typedef struct kvd_header {
    char magic[8];
    uint32_t version, flags;
    uint64_t fingerprint, hash, parent;
    uint32_t block_size, reserved;
    uint64_t raw_len, stored_len;
    uint64_t checksum;
} kvd_header;

enum { ENT_PENDING = 1, ENT_ON_DISK = 2 };

typedef struct kvd_ent {
    uint64_t hash;
    long long size;               /* file bytes (ON_DISK) */
    int state;
    struct kvd_ent *hnext;        /* hash bucket chain */
    struct kvd_ent *prev, *next;  /* LRU list (ON_DISK only), oldest first */
} kvd_ent;

typedef struct kvd_job {
    uint64_t hash, parent;
    int sink;                     /* the block's format: a sink block's */
    size_t len;                   /* raw bytes (d->raw_kind[sink]) */
    struct kvd_job *next;
    int32_t *tokens;              /* [block_size], in the same allocation */
    unsigned char *payload;       /* [raw_len], same allocation */
} kvd_job;

struct kvdisk {
    char path[PATH_MAX];          /* DIR/<fingerprint> */
    kvdisk_opts o;
    int block_size;
    size_t raw_len;               /* raw bytes of the larger block kind (buffers) */
    size_t raw_kind[2];           /* raw bytes of a regular (0) and a sink (1) block */
    int32_t kind_id[2];           /* a block id of each kind (-1: none in the pool) */
    int rd_sink;                  /* kvdisk_read's block, for kvdisk_scatter */
    const unsigned char *rd_pay;
    double rd_s;
    size_t file_max;              /* largest valid file */
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_room;
    pthread_t th;
    int stop, writes_on;
    kvd_ent **buckets;
    size_t n_buckets, n_ent;
    kvd_ent *lru_head, *lru_tail;
    kvd_job *q_head, *q_tail;
    size_t q_bytes;
    kvdisk_stats st;
    unsigned char *rbuf, *dbuf;   /* engine thread: file read, decompressed */
    unsigned char *wbuf;          /* writer thread: the file */
};

/* ---- fingerprints ---- */

uint64_t kvdisk_fingerprint(uint64_t model_id, const void *config_bytes, size_t config_len, const char *kv_type,
                            kv_pool *const *pools, int n_pools)
{
    XXH3_state_t *s = XXH3_createState();
    if (!s)
        return 0;
    XXH3_64bits_reset(s);
    uint32_t v = KVD_VERSION;
    XXH3_64bits_update(s, &v, sizeof v);
    XXH3_64bits_update(s, &model_id, sizeof model_id);
    if (config_bytes)
        XXH3_64bits_update(s, config_bytes, config_len);
    XXH3_64bits_update(s, kv_type, strlen(kv_type) + 1);
    for (int i = 0; i < n_pools; i++) {
        int32_t shape[3] = {pools[i]->n_layer, pools[i]->kv_dim, pools[i]->block_size};
        XXH3_64bits_update(s, shape, sizeof shape);
    }
    uint64_t h = XXH3_64bits_digest(s);
    XXH3_freeState(s);
    return h ? h : 1;
}

static int hash_file_part(XXH3_state_t *s, const char *path, tern_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tern_err_set(err, TERN_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0) {
        rc = tern_err_set(err, TERN_EIO, "cannot stat %s: %s", path, strerror(errno));
        goto out_close;
    }
    uint64_t size = (uint64_t)sb.st_size;
    XXH3_64bits_update(s, &size, sizeof size);
    static const size_t head = (size_t)1 << 20, tail = (size_t)64 << 10;
    unsigned char *buf = malloc(head);
    if (!buf) {
        rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out_close;
    }
    ssize_t n = pread(fd, buf, head, 0);
    if (n > 0)
        XXH3_64bits_update(s, buf, (size_t)n);
    if (size > head + tail && (n = pread(fd, buf, tail, (off_t)(size - tail))) > 0)
        XXH3_64bits_update(s, buf, (size_t)n);
    free(buf);
out_close:
    close(fd);
    return rc;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int kvdisk_model_id(const char *dir, uint64_t *id, tern_err *err)
{
    *id = 0;
    char path[PATH_MAX];
    char **names = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    XXH3_state_t *s = XXH3_createState();
    DIR *dh = opendir(dir);
    if (!s || !dh) {
        rc = s ? tern_err_set(err, TERN_EIO, "cannot read %s: %s", dir, strerror(errno))
               : tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out;
    }
    XXH3_64bits_reset(s);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = hash_file_part(s, path, err)))
        goto out;
    for (struct dirent *de; (de = readdir(dh));) {
        size_t l = strlen(de->d_name);
        if (l < 12 || strcmp(de->d_name + l - 12, ".safetensors"))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nn = realloc(names, cap * sizeof *nn);
            if (!nn) {
                rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
                goto out;
            }
            names = nn;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto out;
        }
        n++;
    }
    if (n)
        qsort(names, n, sizeof *names, name_cmp);
    for (size_t i = 0; i < n && !rc; i++) {
        XXH3_64bits_update(s, names[i], strlen(names[i]));
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        rc = hash_file_part(s, path, err);
    }
    if (!rc)
        *id = XXH3_64bits_digest(s);
out:
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (dh)
        closedir(dh);
    XXH3_freeState(s);
    return rc;
}

/* ---- the index (under mu) ---- */

static size_t bucket_of(const kvdisk *d, uint64_t h)
{
    return (size_t)(h ^ (h >> 29)) & (d->n_buckets - 1);
}

static kvd_ent *ent_find(kvdisk *d, uint64_t h)
{
    for (kvd_ent *e = d->buckets[bucket_of(d, h)]; e; e = e->hnext)
        if (e->hash == h)
            return e;
    return NULL;
}

static void lru_unlink(kvdisk *d, kvd_ent *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else if (d->lru_head == e)
        d->lru_head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else if (d->lru_tail == e)
        d->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_append(kvdisk *d, kvd_ent *e)
{
    e->prev = d->lru_tail;
    e->next = NULL;
    if (d->lru_tail)
        d->lru_tail->next = e;
    else
        d->lru_head = e;
    d->lru_tail = e;
}

/* A new entry (not in the LRU list yet); NULL when out of memory. */
static kvd_ent *ent_add(kvdisk *d, uint64_t h, int state)
{
    if (d->n_ent >= d->n_buckets) { /* keep chains short: grow at load 1 */
        size_t nb = d->n_buckets * 2;
        kvd_ent **b = calloc(nb, sizeof *b);
        if (b) {
            kvd_ent **old = d->buckets;
            size_t on = d->n_buckets;
            d->buckets = b;
            d->n_buckets = nb;
            for (size_t i = 0; i < on; i++)
                for (kvd_ent *e = old[i], *nx; e; e = nx) {
                    nx = e->hnext;
                    size_t k = bucket_of(d, e->hash);
                    e->hnext = b[k];
                    b[k] = e;
                }
            free(old);
        }
    }
    kvd_ent *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->hash = h;
    e->state = state;
    size_t k = bucket_of(d, h);
    e->hnext = d->buckets[k];
    d->buckets[k] = e;
    d->n_ent++;
    return e;
}

/* Removes e from the index (and its bytes from the total). */
static void ent_del(kvdisk *d, kvd_ent *e)
{
    for (kvd_ent **pp = &d->buckets[bucket_of(d, e->hash)]; *pp; pp = &(*pp)->hnext)
        if (*pp == e) {
            *pp = e->hnext;
            break;
        }
    if (e->state == ENT_ON_DISK) {
        lru_unlink(d, e);
        d->st.n_blocks--;
        d->st.bytes_used -= e->size;
    }
    d->n_ent--;
    free(e);
}

static void file_path(const kvdisk *d, char *buf, size_t cap, uint64_t h, const char *ext)
{
    snprintf(buf, cap, "%s/%016" PRIx64 ".%s", d->path, h, ext);
}

/* Deletes the least recently used files until the total fits the budget
 * (takes mu, unlinks outside it). */
static void budget_enforce(kvdisk *d)
{
    for (;;) {
        pthread_mutex_lock(&d->mu);
        kvd_ent *e = d->lru_head;
        if (!e || d->st.bytes_used <= d->st.budget_bytes) {
            pthread_mutex_unlock(&d->mu);
            return;
        }
        uint64_t h = e->hash;
        ent_del(d, e);
        d->st.evicted++;
        pthread_mutex_unlock(&d->mu);
        char p[PATH_MAX + 32];
        file_path(d, p, sizeof p, h, "kvb");
        unlink(p);
    }
}

/* ---- the block bytes ---- */

static size_t kind_bytes(const kvdisk_opts *o, int32_t id)
{
    size_t n = 0;
    for (int i = 0; id >= 0 && i < o->n_pools; i++)
        n += kv_block_bytes(o->pools[i], id);
    return n;
}

static void block_gather(const kvdisk *d, int32_t blk, unsigned char *out)
{
    for (int i = 0; i < d->o.n_pools; i++) {
        kv_block_save(d->o.pools[i], blk, out);
        out += kv_block_bytes(d->o.pools[i], blk);
    }
}

static int block_scatter(const kvdisk *d, int32_t blk, const unsigned char *in)
{
    int rc = 0;
    for (int i = 0; i < d->o.n_pools && !rc; i++) {
        size_t n = kv_block_bytes(d->o.pools[i], blk);
        rc = kv_block_load(d->o.pools[i], blk, in, n);
        in += n;
    }
    return rc;
}

static uint64_t file_checksum(const kvd_header *hd, const void *tokens, size_t tok_len, const void *payload,
                              size_t len)
{
    kvd_header z = *hd;
    z.checksum = 0;
    XXH3_state_t s;
    XXH3_64bits_reset(&s);
    XXH3_64bits_update(&s, &z, sizeof z);
    XXH3_64bits_update(&s, tokens, tok_len);
    XXH3_64bits_update(&s, payload, len);
    return XXH3_64bits_digest(&s);
}

/* ---- the writer thread ---- */

static void writes_off(kvdisk *d, const char *what, int errnum)
{
    pthread_mutex_lock(&d->mu);
    int was = d->writes_on;
    d->writes_on = 0;
    d->st.enabled = 0;
    pthread_mutex_unlock(&d->mu);
    if (was)
        TERN_WARN("kv-disk: %s in %s failed (%s): the disk tier writes no more blocks; serving continues", what,
                  d->path, strerror(errnum));
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -1 : (errno = ENOSPC, -1);
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Writes one block file; the file's size, or -1 with errno and `what`. */
static long long job_write(kvdisk *d, const kvd_job *j, const char **what)
{
    size_t tok_len = (size_t)d->block_size * sizeof(int32_t);
    kvd_header *hd = (kvd_header *)d->wbuf;
    memset(hd, 0, sizeof *hd);
    memcpy(hd->magic, KVD_MAGIC, 8);
    hd->version = KVD_VERSION;
    hd->fingerprint = d->o.fingerprint;
    hd->hash = j->hash;
    hd->parent = j->parent;
    hd->block_size = (uint32_t)d->block_size;
    hd->raw_len = j->len;
    if (j->sink)
        hd->flags |= KVD_FLAG_SINK;
    unsigned char *tok = d->wbuf + sizeof *hd, *pay = tok + tok_len;
    memcpy(tok, j->tokens, tok_len);
    size_t stored = j->len;
    if (d->o.zstd_level > 0) {
        size_t z = ZSTD_compress(pay, d->file_max - sizeof *hd - tok_len, j->payload, j->len, d->o.zstd_level);
        if (!ZSTD_isError(z) && z < j->len) {
            stored = z;
            hd->flags |= KVD_FLAG_ZSTD;
        }
    }
    if (!(hd->flags & KVD_FLAG_ZSTD))
        memcpy(pay, j->payload, j->len);
    hd->stored_len = stored;
    hd->checksum = file_checksum(hd, tok, tok_len, pay, stored);
    size_t total = sizeof *hd + tok_len + stored;
    char tmp[PATH_MAX + 32], fin[PATH_MAX + 32];
    file_path(d, tmp, sizeof tmp, j->hash, "tmp");
    file_path(d, fin, sizeof fin, j->hash, "kvb");
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        *what = "creating a block file";
        return -1;
    }
    if (write_all(fd, d->wbuf, total) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        errno = e;
        *what = "writing a block file";
        return -1;
    }
    if (close(fd) != 0 || rename(tmp, fin) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        *what = "finishing a block file";
        return -1;
    }
    return (long long)total;
}

static void *writer_main(void *arg)
{
    kvdisk *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->q_head && !d->stop)
            pthread_cond_wait(&d->cv_job, &d->mu);
        kvd_job *j = d->q_head;
        if (!j)
            break; /* stop, and the queue is drained */
        d->q_head = j->next;
        if (!d->q_head)
            d->q_tail = NULL;
        int on = d->writes_on;
        pthread_mutex_unlock(&d->mu);
        double t0 = tern_time_s();
        const char *what = NULL;
        long long size = on ? job_write(d, j, &what) : -1;
        int errnum = errno;
        double dt = tern_time_s() - t0;
        if (on && size < 0)
            writes_off(d, what, errnum);
        pthread_mutex_lock(&d->mu);
        d->q_bytes -= j->len;
        pthread_cond_broadcast(&d->cv_room);
        kvd_ent *e = ent_find(d, j->hash);
        if (e && e->state == ENT_PENDING) {
            if (size >= 0) {
                e->state = ENT_ON_DISK;
                e->size = size;
                lru_append(d, e);
                d->st.n_blocks++;
                d->st.bytes_used += size;
                d->st.writes++;
                d->st.write_bytes += size;
                d->st.write_s += dt;
            } else {
                ent_del(d, e);
                d->st.dropped++;
            }
        }
        pthread_mutex_unlock(&d->mu);
        free(j);
        if (size >= 0)
            budget_enforce(d);
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- open: scan ---- */

typedef struct scan_item {
    uint64_t hash;
    long long size;
    struct timespec mtime;
} scan_item;

static int scan_cmp(const void *a, const void *b)
{
    const scan_item *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec)
        return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    if (x->mtime.tv_nsec != y->mtime.tv_nsec)
        return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : 1;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* Indexes the directory's block files, oldest first; deletes .tmp files. */
static int dir_scan(kvdisk *d, tern_err *err)
{
    DIR *dh = opendir(d->path);
    if (!dh)
        return tern_err_set(err, TERN_EIO, "cannot read %s: %s", d->path, strerror(errno));
    scan_item *it = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    char p[PATH_MAX + 32];
    for (struct dirent *de; (de = readdir(dh));) {
        const char *nm = de->d_name;
        char *end;
        if (strlen(nm) != 20 || nm[16] != '.')
            continue;
        uint64_t h = strtoull(nm, &end, 16);
        if (end != nm + 16)
            continue;
        const char *ext = !strcmp(nm + 17, "tmp") ? "tmp" : !strcmp(nm + 17, "kvb") ? "kvb" : NULL;
        if (!ext)
            continue;
        file_path(d, p, sizeof p, h, ext); /* lowercase: another spelling fails stat below */
        if (ext[0] == 't') {
            if (unlink(p) == 0)
                d->st.torn++;
            continue;
        }
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            scan_item *ni = realloc(it, cap * sizeof *ni);
            if (!ni) {
                rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
                goto out;
            }
            it = ni;
        }
        it[n++] = (scan_item){h, (long long)sb.st_size, sb.st_mtim};
    }
    if (n)
        qsort(it, n, sizeof *it, scan_cmp);
    for (size_t i = 0; i < n; i++) {
        kvd_ent *e = ent_add(d, it[i].hash, ENT_ON_DISK);
        if (!e) {
            rc = tern_err_set(err, TERN_ENOMEM, "out of memory");
            goto out;
        }
        e->size = it[i].size;
        lru_append(d, e);
        d->st.n_blocks++;
        d->st.bytes_used += e->size;
    }
out:
    free(it);
    closedir(dh);
    return rc;
}

static int mkdir_p(char *path)
{
    for (char *s = path + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            int r = mkdir(path, 0755);
            *s = '/';
            if (r != 0 && errno != EEXIST)
                return -1;
        }
    return mkdir(path, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

kvdisk *kvdisk_open(const kvdisk_opts *o, tern_err *err)
{
    if (!o->dir || !o->dir[0] || o->n_pools < 1 || o->n_pools > 2) {
        tern_err_set(err, TERN_EINVAL, "kv-disk: no directory or no pool");
        return NULL;
    }
    for (int i = 0; i < o->n_pools; i++)
        if (!o->pools[i]->mem_k || o->pools[i]->block_size != o->pools[0]->block_size ||
            o->pools[i]->n_blocks != o->pools[0]->n_blocks) {
            tern_err_set(err, TERN_EUNSUPPORTED, "kv-disk: the KV pool has no host storage (a device backend)");
            return NULL;
        }
    kvdisk *d = calloc(1, sizeof *d);
    if (!d) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        return NULL;
    }
    d->o = *o;
    d->o.dir = NULL;
    if (!d->o.queue_bytes)
        d->o.queue_bytes = KVD_QUEUE_DEFAULT;
    d->block_size = o->pools[0]->block_size;
    const kv_pool *p0 = o->pools[0];
    d->kind_id[1] = p0->n_sink > 0 ? 0 : -1;
    d->kind_id[0] = p0->n_blocks > p0->n_sink ? p0->n_sink : -1;
    for (int k = 0; k < 2; k++) {
        d->raw_kind[k] = kind_bytes(&d->o, d->kind_id[k]);
        if (d->raw_kind[k] > d->raw_len)
            d->raw_len = d->raw_kind[k];
    }
    if (d->o.queue_bytes < d->raw_len)
        d->o.queue_bytes = d->raw_len;
    size_t bound = ZSTD_compressBound(d->raw_len);
    d->file_max = sizeof(kvd_header) + (size_t)d->block_size * sizeof(int32_t) + (bound > d->raw_len ? bound : d->raw_len);
    d->st.budget_bytes = (long long)o->budget_bytes;
    d->st.block_file_bytes = (long long)(sizeof(kvd_header) + (size_t)d->block_size * sizeof(int32_t) +
                                         (d->raw_kind[0] ? d->raw_kind[0] : d->raw_len));
    d->writes_on = d->st.enabled = 1;
    d->n_buckets = 1024;
    d->buckets = calloc(d->n_buckets, sizeof *d->buckets);
    d->rbuf = malloc(d->file_max);
    d->dbuf = malloc(d->raw_len);
    d->wbuf = malloc(d->file_max);
    if (!d->buckets || !d->rbuf || !d->dbuf || !d->wbuf) {
        tern_err_set(err, TERN_ENOMEM, "out of memory");
        goto out_free;
    }
    if ((size_t)snprintf(d->path, sizeof d->path, "%s/%016" PRIx64, o->dir, o->fingerprint) >= sizeof d->path) {
        tern_err_set(err, TERN_EINVAL, "kv-disk: the directory name is too long");
        goto out_free;
    }
    if (mkdir_p(d->path) != 0) {
        tern_err_set(err, TERN_EIO, "kv-disk: cannot create %s: %s", d->path, strerror(errno));
        goto out_free;
    }
    char probe[PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/.probe", d->path);
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1) {
        tern_err_set(err, TERN_EIO, "kv-disk: %s is not writable: %s", d->path, strerror(errno));
        if (fd >= 0)
            close(fd);
        goto out_free;
    }
    close(fd);
    unlink(probe);
    if (dir_scan(d, err))
        goto out_free;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_job, NULL);
    pthread_cond_init(&d->cv_room, NULL);
    if (pthread_create(&d->th, NULL, writer_main, d) != 0) {
        tern_err_set(err, TERN_ENOMEM, "kv-disk: cannot start the writer thread");
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv_job);
        pthread_cond_destroy(&d->cv_room);
        goto out_free;
    }
    budget_enforce(d);
    return d;
out_free:
    for (size_t i = 0; d->buckets && i < d->n_buckets; i++)
        for (kvd_ent *e = d->buckets[i], *nx; e; e = nx) {
            nx = e->hnext;
            free(e);
        }
    free(d->buckets);
    free(d->rbuf);
    free(d->dbuf);
    free(d->wbuf);
    free(d);
    return NULL;
}

void kvdisk_close(kvdisk *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_signal(&d->cv_job);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->th, NULL);
    for (size_t i = 0; i < d->n_buckets; i++)
        for (kvd_ent *e = d->buckets[i], *nx; e; e = nx) {
            nx = e->hnext;
            free(e);
        }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_job);
    pthread_cond_destroy(&d->cv_room);
    free(d->buckets);
    free(d->rbuf);
    free(d->dbuf);
    free(d->wbuf);
    free(d);
}

/* ---- the engine thread's side ---- */

int kvdisk_has(kvdisk *d, uint64_t hash)
{
    pthread_mutex_lock(&d->mu);
    int r = ent_find(d, hash) != NULL;
    pthread_mutex_unlock(&d->mu);
    return r;
}

int kvdisk_put(kvdisk *d, uint64_t hash, uint64_t parent, const int32_t *tokens, int32_t blk, int wait)
{
    int sink = blk < d->o.pools[0]->n_sink;
    size_t len = d->raw_kind[sink];
    pthread_mutex_lock(&d->mu);
    int skip = ent_find(d, hash) != NULL, on = d->writes_on;
    if (!skip && (!on || (!wait && d->q_bytes + len > d->o.queue_bytes))) {
        d->st.dropped++;
        skip = 1;
    }
    pthread_mutex_unlock(&d->mu);
    if (skip)
        return 0;
    size_t tok_len = (size_t)d->block_size * sizeof(int32_t);
    kvd_job *j = malloc(sizeof *j + tok_len + len);
    if (!j)
        return 0;
    j->sink = sink;
    j->len = len;
    j->hash = hash;
    j->parent = parent;
    j->next = NULL;
    j->tokens = (int32_t *)(j + 1);
    j->payload = (unsigned char *)j->tokens + tok_len;
    memcpy(j->tokens, tokens, tok_len);
    block_gather(d, blk, j->payload);
    pthread_mutex_lock(&d->mu);
    while (wait && d->writes_on && d->q_bytes + len > d->o.queue_bytes)
        pthread_cond_wait(&d->cv_room, &d->mu);
    kvd_ent *e = d->writes_on ? ent_add(d, hash, ENT_PENDING) : NULL;
    if (!e) {
        d->st.dropped++;
        pthread_mutex_unlock(&d->mu);
        free(j);
        return 0;
    }
    if (d->q_tail)
        d->q_tail->next = j;
    else
        d->q_head = j;
    d->q_tail = j;
    d->q_bytes += len;
    pthread_cond_signal(&d->cv_job);
    pthread_mutex_unlock(&d->mu);
    return 1;
}

/* Drops a file that failed a check: out of the index, deleted, counted. */
static int file_corrupt(kvdisk *d, uint64_t hash, const char *path, const char *why)
{
    pthread_mutex_lock(&d->mu);
    kvd_ent *e = ent_find(d, hash);
    if (e && e->state == ENT_ON_DISK)
        ent_del(d, e);
    d->st.corrupt++;
    pthread_mutex_unlock(&d->mu);
    unlink(path);
    TERN_WARN("kv-disk: %s: %s; deleted, the block is recomputed", path, why);
    return TERN_EFORMAT;
}

int kvdisk_read(kvdisk *d, uint64_t hash, uint64_t parent, const int32_t *tokens, int *sink)
{
    pthread_mutex_lock(&d->mu);
    kvd_ent *e = ent_find(d, hash);
    if (!e || e->state != ENT_ON_DISK) {
        pthread_mutex_unlock(&d->mu);
        return TERN_ENOTFOUND;
    }
    lru_unlink(d, e); /* most recently used */
    lru_append(d, e);
    pthread_mutex_unlock(&d->mu);
    double t0 = tern_time_s();
    char p[PATH_MAX + 32];
    file_path(d, p, sizeof p, hash, "kvb");
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) /* deleted for the budget meanwhile */
        return TERN_ENOTFOUND;
    struct stat sb;
    size_t got = 0;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return TERN_EIO;
    }
    size_t size = (size_t)sb.st_size;
    if (size <= d->file_max)
        while (got < size) {
            ssize_t r = read(fd, d->rbuf + got, size - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            got += (size_t)r;
        }
    futimens(fd, NULL); /* the LRU order survives a restart */
    close(fd);
    size_t tok_len = (size_t)d->block_size * sizeof(int32_t), hl = sizeof(kvd_header);
    if (size > d->file_max || size < hl + tok_len)
        return file_corrupt(d, hash, p, "wrong size");
    if (got != size)
        return TERN_EIO;
    kvd_header hd;
    memcpy(&hd, d->rbuf, hl);
    const unsigned char *tok = d->rbuf + hl, *pay = tok + tok_len;
    int k = (hd.flags & KVD_FLAG_SINK) != 0;
    size_t raw = d->raw_kind[k];
    if (memcmp(hd.magic, KVD_MAGIC, 8) || hd.version != KVD_VERSION || hd.fingerprint != d->o.fingerprint ||
        hd.block_size != (uint32_t)d->block_size || d->kind_id[k] < 0 || hd.raw_len != raw)
        return file_corrupt(d, hash, p, "bad header");
    if (hd.stored_len != size - hl - tok_len)
        return file_corrupt(d, hash, p, "truncated or too long");
    if (file_checksum(&hd, tok, tok_len, pay, hd.stored_len) != hd.checksum)
        return file_corrupt(d, hash, p, "checksum mismatch");
    if (hd.hash != hash || hd.parent != parent || memcmp(tok, tokens, tok_len))
        return file_corrupt(d, hash, p, "another block under this name");
    if (hd.flags & KVD_FLAG_ZSTD) {
        size_t z = ZSTD_decompress(d->dbuf, raw, pay, hd.stored_len);
        if (ZSTD_isError(z) || z != raw)
            return file_corrupt(d, hash, p, "bad compressed data");
        pay = d->dbuf;
    } else if (hd.stored_len != raw) {
        return file_corrupt(d, hash, p, "wrong payload length");
    }
    d->rd_sink = *sink = k;
    d->rd_pay = pay;
    d->rd_s = tern_time_s() - t0;
    pthread_mutex_lock(&d->mu);
    d->st.hit_bytes += (long long)size;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

int kvdisk_scatter(kvdisk *d, int32_t blk)
{
    double t0 = tern_time_s();
    if (!d->rd_pay || (blk < d->o.pools[0]->n_sink) != d->rd_sink)
        return TERN_EINVAL;
    int rc = block_scatter(d, blk, d->rd_pay);
    d->rd_pay = NULL;
    if (rc)
        return rc;
    double dt = tern_time_s() - t0 + d->rd_s;
    pthread_mutex_lock(&d->mu);
    d->st.hits++;
    d->st.read_s += dt;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

void kvdisk_stats_get(kvdisk *d, kvdisk_stats *st)
{
    pthread_mutex_lock(&d->mu);
    *st = d->st;
    pthread_mutex_unlock(&d->mu);
}
