/* Private to the engine's constraints: the trigger tables behind lazy
 * constraints (constraint_trigger.c), read by constraint.c. */
#ifndef TERN_ENGINE_CONSTRAINT_INT_H
#define TERN_ENGINE_CONSTRAINT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/constraint.h"

typedef struct trig_text {
    char *s;
    size_t len;
    /* [n_cand] tokens that can complete s, by group: group 0 (cand[grp[0]
     * .. grp[1])) holds s inside them, group k (1 <= k < len) starts with
     * s[k..len), which completes s after text ending in s[0..k). */
    int32_t *cand;
    size_t n_cand;
    size_t grp[CONSTRAINT_TRIGGER_MAX + 1];
} trig_text;

struct constraint_triggers {
    trig_text *texts; /* [n_texts] */
    size_t n_texts;
    size_t max_len;   /* longest text trigger */
    int32_t *ids;     /* [n_ids] special-token triggers */
    size_t n_ids;
    int at_start;     /* text triggers count only at the first non-whitespace byte */
    int32_t n_vocab;  /* the vocabulary's mask width */
};

/* 1 if id is one of t's token triggers. */
int constraint_trigger_is_id(const constraint_triggers *t, int32_t id);
/* Offset of the first non-whitespace byte of text[0..n) (n if none). */
size_t constraint_trigger_first_text(const char *text, size_t n);
/* Where the first text trigger that ends after n_old starts in
 * text[0..n_new) (text[0..n_old) held none), or -1. With at_start only an
 * occurrence at the first non-whitespace byte counts. */
long constraint_trigger_find(const constraint_triggers *t, const char *text, size_t n_old, size_t n_new);
/* 1 when no trigger can start any more (at_start, and the text's first
 * non-whitespace bytes are no prefix of any trigger). */
int constraint_trigger_dead(const constraint_triggers *t, const char *text, size_t n);

#endif
