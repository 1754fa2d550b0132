/* Flat lists of the vocabulary and merges of tokenizer.json, filled either
 * by the fast scanner (tok_json.c) or from json-c objects (tok_load.c). */
#ifndef TERN_TOKENIZER_FAST_H
#define TERN_TOKENIZER_FAST_H

#include "tok_int.h"

typedef struct tok_vent {
    size_t off; /* into the list's text, NUL-terminated there */
    uint32_t len;
    int32_t id;
} tok_vent;

typedef struct tok_vlist {
    tok_vent *v;
    size_t n, cap;
    tok_buf text;
} tok_vlist;

typedef struct tok_ment {
    size_t a; /* offsets into text; the pair is text[a, a+al) + text[b, b+bl) */
    uint32_t al;
    size_t b;
    uint32_t bl;
} tok_ment;

typedef struct tok_mlist {
    tok_ment *v;
    size_t n, cap;
    tok_buf text;
} tok_mlist;

void tok_vlist_free(tok_vlist *l);
void tok_mlist_free(tok_mlist *l);

/* Takes model.vocab (an object) and model.merges out of the tokenizer.json
 * text b of *n bytes (NUL-terminated): both are cut out in place, leaving
 * {} and [], and *n gets the new length. Returns 0 if it declined (nothing
 * taken, b untouched), 1 if it took the vocabulary, 3 if it took the
 * vocabulary and merges. */
int tok_fast_scan(char *b, size_t *n, tok_vlist *vocab, tok_mlist *merges);

#endif
