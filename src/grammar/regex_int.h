/* The regex syntax tree (regex.c parses it; regex_nfa.c turns it into a
 * position automaton for intersections). Private to the front ends. */
#ifndef TERN_GRAMMAR_REGEX_INT_H
#define TERN_GRAMMAR_REGEX_INT_H

#include "fe_int.h"

enum rx_kind { RX_SET, RX_CAT, RX_ALT, RX_REP, RX_EMPTY, RX_BOL, RX_EOL };

typedef struct rx {
    enum rx_kind kind;
    gfe_cset set;      /* RX_SET */
    struct rx **kids;  /* RX_CAT, RX_ALT; RX_REP has kids[0] */
    int n_kids, cap_kids;
    int min, max;      /* RX_REP; max -1 = unbounded */
} rx;

/* Parses re[0..len) (ECMAScript syntax): an RX_ALT of RX_CATs, or NULL
 * with *err set. json_mode: `.` excludes ECMAScript line terminators. */
rx *gfe_rx_parse(const char *re, size_t len, int json_mode, tern_err *err);
void gfe_rx_free(rx *x);

#endif
