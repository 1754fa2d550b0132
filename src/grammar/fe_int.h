/* Private helpers shared by the grammar front ends (schema.c, regex.c,
 * frontend.c): a bounded string builder, a rule table that writes EBNF
 * rules with fresh names, codepoint sets and their EBNF forms (raw text or
 * the inside of a JSON string literal), and decimal digit-range grammars. */
#ifndef TERN_GRAMMAR_FE_INT_H
#define TERN_GRAMMAR_FE_INT_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* ---- string builder; sticky error: after a failure every put is a no-op
 * and err holds TERN_ENOMEM or TERN_EFULL. */
typedef struct gfe_buf {
    char *s;
    size_t len, cap;
    size_t max; /* hard cap on len (bytes); 0 = none */
    int err;
} gfe_buf;

void gfe_buf_init(gfe_buf *b, size_t max);
void gfe_buf_free(gfe_buf *b);
void gfe_buf_put(gfe_buf *b, const char *s, size_t n);
void gfe_buf_puts(gfe_buf *b, const char *s);
void gfe_buf_printf(gfe_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Takes the text out (NUL-terminated, caller frees); the buffer is reset. */
char *gfe_buf_take(gfe_buf *b);

/* Appends an EBNF string literal ("...") matching exactly the bytes s[0..n)
 * (which must be UTF-8; non-printable ASCII is written as \xHH). */
void gfe_buf_lit(gfe_buf *b, const char *s, size_t n);

/* ---- rule table: rules are appended to one text; names are p<n>. Identical
 * bodies share one rule. */
#define GFE_NAME_MAX 24
typedef struct gfe_rules {
    gfe_buf out;   /* "name ::= body\n" lines, root last */
    unsigned next; /* next rule number */
    int has_ws;    /* the `ws` rule is defined */
    struct gfe_rule_slot { uint64_t h; char *body; char name[GFE_NAME_MAX]; } *tab;
    size_t tab_cap, tab_n;
} gfe_rules;

void gfe_rules_init(gfe_rules *r, size_t max_bytes);
void gfe_rules_free(gfe_rules *r);
/* Adds `name ::= body` (a fresh or shared name written to name_out) and
 * returns 0, or the sticky buffer error. */
int gfe_rule_add(gfe_rules *r, const char *body, char name_out[GFE_NAME_MAX]);
/* Reserves a fresh name for a rule defined later with gfe_rule_define (for
 * recursion). */
void gfe_rule_reserve(gfe_rules *r, char name_out[GFE_NAME_MAX]);
int gfe_rule_define(gfe_rules *r, const char *name, const char *body);

/* ---- codepoint sets: sorted, disjoint, non-adjacent ranges. */
typedef struct gfe_range { uint32_t lo, hi; } gfe_range;
typedef struct gfe_cset { gfe_range *r; size_t n, cap; int oom; } gfe_cset;

#define GFE_CP_MAX 0x10FFFFu
void gfe_cset_free(gfe_cset *c);
void gfe_cset_add(gfe_cset *c, uint32_t lo, uint32_t hi); /* keeps it normalized */
void gfe_cset_add_set(gfe_cset *c, const gfe_cset *o);
void gfe_cset_negate(gfe_cset *c);           /* complement within 0..0x10FFFF */
void gfe_cset_sub(gfe_cset *c, uint32_t lo, uint32_t hi);
int gfe_cset_has(const gfe_cset *c, uint32_t cp);
int gfe_cset_copy(gfe_cset *dst, const gfe_cset *src);
/* Adds the case variants of ASCII letters already in the set. */
void gfe_cset_fold_ascii(gfe_cset *c);

/* Writes an EBNF expression for one codepoint of c as raw text (a
 * character class, or a literal for a single codepoint). Empty sets are the
 * caller's problem (check c->n first). */
void gfe_cset_emit_raw(gfe_buf *b, const gfe_cset *c);
/* Writes an EBNF expression matching one JSON-string character unit
 * (inside the quotes) that decodes to a codepoint of c: the raw character
 * where JSON allows it, and every escape form (\" \\ \/ \b \f \n \r \t,
 * \uXXXX in either case, surrogate pairs for codepoints past U+FFFF). */
void gfe_cset_emit_json(gfe_buf *b, const gfe_cset *c);

/* ---- digit-range grammars. Writes an expression matching the decimal
 * texts (no sign, no leading zeros) of the integers in [lo, hi]; hi < 0
 * means unbounded above. */
void gfe_emit_uint_range(gfe_buf *b, int64_t lo, int64_t hi);
/* Writes an expression for exactly `width` base-16 digits (either case)
 * whose value lies in [lo, hi]. */
void gfe_emit_hex_range(gfe_buf *b, uint32_t lo, uint32_t hi, int width);

/* ---- regex (regex.c). Parses re[0..len) and writes into *out an EBNF
 * expression for it. json_mode: match the inside of a JSON string literal
 * whose decoded text matches (escapes allowed) instead of raw text. search:
 * JSON Schema `pattern` semantics (unanchored unless ^ / $ anchor an end);
 * otherwise the regex must match the whole text. *never is set when the
 * regex matches nothing (out is then untouched). */
int gfe_regex_emit(gfe_buf *out, const char *re, size_t len, int json_mode, int search,
                   int *never, tern_err *err);
/* Same, intersected with a length range in codepoints [min_len, max_len]
 * (max_len -1 = none): exact when at most one part of each alternative
 * varies in length and it repeats single characters; TERN_EUNSUPPORTED
 * otherwise. */
int gfe_regex_emit_len(gfe_buf *out, const char *re, size_t len, int json_mode, int search,
                       long min_len, long max_len, int *never, tern_err *err);

/* Regexes (JSON Schema `pattern` semantics, JSON-string mode), each
 * required to match or (neg) not to match, and a length range in
 * codepoints [min_len, max_len] (max_len -1 = none), intersected exactly
 * (regex_nfa.c): each term made deterministic, their product with a
 * counter, one rule per live state, added to r; *name is the entry rule,
 * or *never is set (nothing added) when no string is in the intersection.
 * r NULL: only *never is set (an emptiness test). TERN_EUNSUPPORTED past
 * the size bounds. */
typedef struct gfe_re_term {
    const char *re;
    size_t len;
    int neg;
} gfe_re_term;
#define GFE_RE_MAX_TERMS 8
int gfe_regex_emit_terms(gfe_rules *r, const gfe_re_term *t, int n, long min_len, long max_len,
                         char name[GFE_NAME_MAX], int *never, tern_err *err);

/* The same terms without lengths as a deterministic automaton over
 * codepoints (the live states of the product: every state can still reach
 * an accepting one; state 0 is the start): what the run-time length
 * tracker (unique.c) follows to refuse a token that leaves no way to
 * end the string within its bounds. */
typedef struct gfe_cpmove { uint32_t lo, hi; int32_t to; } gfe_cpmove;
typedef struct gfe_cpdfa {
    int32_t n;
    uint32_t *off;   /* [n + 1]: moves of q are mv[off[q] .. off[q + 1]), sorted */
    gfe_cpmove *mv;
    uint8_t *acc;    /* [n] */
} gfe_cpdfa;
/* 0 with *out (NULL and *never set when nothing matches), or the error. */
int gfe_regex_terms_dfa(const gfe_re_term *t, int n, gfe_cpdfa **out, int *never, tern_err *err);
void gfe_cpdfa_free(gfe_cpdfa *d);
/* The state after cp, or -1. */
int gfe_cpdfa_step(const gfe_cpdfa *d, int q, uint32_t cp);

/* ---- JSON building blocks (frontend.c). Whitespace between tokens is
 * the rule `ws` (defined by gfe_json_define_ws) or nothing in compact
 * mode; gfe_json_ws returns the text to splice between two tokens: " ws "
 * or " ". */
typedef struct gfe_json_style {
    int any_whitespace; /* 0: compact */
    int max_whitespace; /* -1: unlimited */
} gfe_json_style;
const char *gfe_json_ws(const gfe_json_style *st);
/* Defines `ws` (if any_whitespace) and the rules for any JSON value, any
 * string, any number; returns the names through the out-parameters (any of
 * which may be NULL). Safe to call more than once per table: rules are
 * shared. */
int gfe_json_define(gfe_rules *r, const gfe_json_style *st, char value[GFE_NAME_MAX],
                    char string[GFE_NAME_MAX], char number[GFE_NAME_MAX]);

/* Encodes cp as UTF-8 into out (4 bytes max); returns the length. Decodes
 * one UTF-8 codepoint from s[0..n) into *cp, returns its length or -1. */
int gfe_utf8_put(char *out, uint32_t cp);
int gfe_utf8_get(const char *s, size_t n, uint32_t *cp);

#endif
