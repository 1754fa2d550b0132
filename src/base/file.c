/* File helpers (see file.h). */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

char *tern_file_read(const char *path, size_t *len_out, size_t max_len, tern_err *err)
{
    if (max_len == 0)
        max_len = (size_t)1 << 30;
    FILE *f = fopen(path, "rb");
    if (!f) {
        tern_err_set(err, TERN_EIO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf)
        goto out_nomem;
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max_len) {
                tern_err_set(err, TERN_ERANGE, "%s is larger than %zu bytes", path, max_len);
                goto out_free;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                goto out_nomem;
            buf = nb;
            cap *= 2;
        }
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f)) {
        tern_err_set(err, TERN_EIO, "cannot read %s", path);
        goto out_free;
    }
    if (len > max_len) {
        tern_err_set(err, TERN_ERANGE, "%s is larger than %zu bytes", path, max_len);
        goto out_free;
    }
    buf[len] = '\0';
    fclose(f);
    if (len_out)
        *len_out = len;
    return buf;
out_nomem:
    tern_err_set(err, TERN_ENOMEM, "out of memory reading %s", path);
out_free:
    free(buf);
    fclose(f);
    return NULL;
}

int tern_mmap_open(tern_mmap *m, const char *path, tern_err *err)
{
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tern_err_set(err, TERN_EIO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return tern_err_set(err, TERN_EIO, "%s is not a regular file", path);
    }
    m->len = (size_t)st.st_size;
    if (m->len > 0) {
        m->data = mmap(NULL, m->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m->data == MAP_FAILED) {
            m->data = NULL;
            close(fd);
            return tern_err_set(err, TERN_EIO, "cannot map %s: %s", path, strerror(errno));
        }
    }
    close(fd);
    return 0;
}

void tern_mmap_close(tern_mmap *m)
{
    if (m && m->data)
        munmap(m->data, m->len);
    if (m) {
        m->data = NULL;
        m->len = 0;
    }
}

char *tern_path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a > 0 && dir[a - 1] != '/')
        p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

int tern_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
