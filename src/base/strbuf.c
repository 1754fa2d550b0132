/* Growable strings (see strbuf.h). */
#include "strbuf.h"

#include <stdlib.h>
#include <string.h>

void tern_sbuf_put(tern_sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

void tern_sbuf_str(tern_sbuf *b, const char *s) { tern_sbuf_put(b, s, strlen(s)); }
