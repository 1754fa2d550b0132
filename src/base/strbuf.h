/* A growable NUL-terminated string for building text (EBNF, cache keys,
 * prompts). Allocation failure is sticky: later appends are ignored and
 * `oom` stays set, so callers check once at the end. */
#ifndef TERN_BASE_STRBUF_H
#define TERN_BASE_STRBUF_H

#include <stddef.h>

typedef struct tern_sbuf {
    char *s;    /* owned; NULL until the first append */
    size_t n;   /* bytes, without the NUL */
    size_t cap;
    int oom;
} tern_sbuf;

void tern_sbuf_put(tern_sbuf *b, const char *s, size_t n);
void tern_sbuf_str(tern_sbuf *b, const char *s);

#endif
