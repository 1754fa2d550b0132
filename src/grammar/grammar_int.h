/* Private structures of the grammar core: the EBNF syntax tree, the
 * byte-level automaton every rule compiles to, and the persistent parser
 * stacks the matcher, the checker and the token-set precompute share.
 * Public API: grammar.h. Design: docs/grammar.md. */
#ifndef TERN_GRAMMAR_INT_H
#define TERN_GRAMMAR_INT_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/grammar.h"

/* ---- syntax tree (ebnf.c) ------------------------------------------------ */

enum gast_kind { GAST_EMPTY, GAST_BYTES, GAST_CLASS, GAST_REF, GAST_SEQ, GAST_ALT, GAST_REP };

typedef struct gast gast;
struct gast {
    int kind;
    int n;                   /* kids (SEQ/ALT), bytes (BYTES), ranges (CLASS) */
    union {
        gast **kids;         /* SEQ, ALT */
        uint8_t *bytes;      /* BYTES: UTF-8 */
        struct {
            uint32_t *ranges; /* [n][2] inclusive code point ranges, sorted, merged */
            int negated;      /* printed form only: ranges are already complemented */
        } cls;
        int32_t ref;         /* REF: rule index */
        struct {
            gast *kid;
            int32_t min, max; /* max -1 = unbounded */
        } rep;
    } u;
};

/* A simple bump arena for the tree (freed all at once). */
typedef struct garena_blk garena_blk;
typedef struct garena {
    garena_blk *head;
} garena;
void *garena_alloc(garena *a, size_t n);
void garena_free(garena *a);

/* ---- automaton --------------------------------------------------------------- */

typedef struct gbyte_edge {
    uint8_t lo, hi;  /* inclusive byte range */
    int32_t target;  /* state */
} gbyte_edge;

typedef struct grule_edge {
    int32_t rule;    /* rule called */
    int32_t target;  /* state to continue at when it returns */
} grule_edge;

struct grammar {
    garena arena;
    int32_t n_rules;
    char **rule_names;    /* [n_rules], in arena */
    gast **rule_bodies;   /* [n_rules], in arena */
    int32_t root;

    /* Every rule is an epsilon-free NFA over bytes whose edges either read
     * a byte range or call a rule. States are numbered globally. */
    int32_t n_states;
    int32_t *rule_start;  /* [n_rules] start state (-1 if unused) */
    int32_t *st_rule;     /* [n_states] owning rule */
    uint8_t *st_final;    /* [n_states] the rule may end here */
    int32_t *be_off;      /* [n_states+1] byte edges of s: be[be_off[s]..be_off[s+1]) */
    gbyte_edge *be;
    int32_t *re_off;      /* [n_states+1] rule edges */
    grule_edge *re;

    /* Structural signatures for sharing token sets across grammars: a rule
     * whose body and (acyclic) callees print the same gets the same
     * rule_sig and the same state layout, so (rule_sig, s - rule_first)
     * names a state's behaviour independently of the grammar. 0 = none
     * (rules in or above a recursion cycle). */
    uint64_t *rule_sig;   /* [n_rules] */
    int32_t *rule_first;  /* [n_rules] first state of the rule, -1 if unused */

    /* Repetition copies no token up to alias_horizon bytes can tell apart:
     * st_alias[s] is the lowest state with s's token sets (s itself when
     * none). Only token sets use it; parsing runs on the real states. */
    int32_t *st_alias;    /* [n_states] */
    long alias_horizon;
    /* st_equiv[s]: the lowest state of s's rule with the same finality
     * and the same edges (targets taken up to this equivalence): the same
     * future, so the same token sets, for every vocabulary (a class read
     * as UTF-8 ends in one state per sequence length, all alike). */
    int32_t *st_equiv;    /* [n_states] */

    /* [n_rules] or NULL: the length tracker's automaton of a length rule
     * (unique_int.h guq_grammar_prepare), NULL for other rules. */
    struct guq_lre **len_re;
};

/* grammar.c: fills rule_sig / rule_first (after gbuild_automaton). */
int grammar_compute_sigs(grammar *g);
/* grammar.c: fills st_equiv (after gbuild_automaton). 0 or TERN_ENOMEM. */
int grammar_compute_equiv(grammar *g);
/* Signature of state s's behaviour, 0 if it has none. */
uint64_t grammar_state_sig(const grammar *g, int32_t s);

/* ebnf.c: parse text into g's rule names/bodies (root resolved). */
int gebnf_parse(grammar *g, const char *text, size_t len, const char *root, tern_err *err);
/* build.c: tree -> automaton with bounds. */
int gbuild_automaton(grammar *g, const grammar_limits *lim, double t0, tern_err *err);

/* ---- parser stacks (stack.c) ---------------------------------------------- */

/* Bottom markers of a stack node's parent. */
#define GSTK_ROOT (-1)    /* below is nothing: popping here ends the sentence */
#define GSTK_UNKNOWN (-2) /* context-free precompute: the caller is unknown */

/* Bounds on the parser state (never a runaway): stack depth and the number
 * of simultaneous stacks. Exceeding them drops paths (sound: nothing
 * invalid is ever accepted) and sets the overflow flag. */
#define GSTK_MAX_DEPTH 2048
#define GSTK_MAX_SET 4096
#define GSTK_MAX_NODES (1L << 25)

/* Hash-consed persistent stacks: node = (state, parent). Identical stacks
 * are one id, so sets of stacks dedupe by id. Nodes are added in LIFO order
 * and can be truncated back to a mark (scratch work, rollback). */
typedef struct gstk_pool {
    int32_t *state, *parent, *next, *depth; /* [cap] */
    int32_t n, cap;
    int32_t *heads;                         /* [hmask+1] chain heads */
    uint32_t hmask;
    uint32_t *stamp;                        /* [cap] visit marks */
    uint32_t epoch;
    int32_t *work;                          /* closure worklist */
    int32_t work_cap;
    long max_nodes;                         /* GSTK_MAX_NODES unless lowered */
} gstk_pool;

int gstk_pool_init(gstk_pool *p);
void gstk_pool_free(gstk_pool *p);
/* Node id, or -1 (out of memory / node bound). */
int32_t gstk_intern(gstk_pool *p, int32_t state, int32_t parent);
void gstk_truncate(gstk_pool *p, int32_t mark);

/* A set of stacks whose top states read bytes, plus flags. */
typedef struct gstk_set {
    int32_t *ids;
    int32_t n, cap;
    uint8_t can_end;   /* a path popped the root: the sentence may end */
    uint8_t hit_unknown; /* a path popped below an unknown bottom */
    uint8_t overflow;  /* a bound dropped paths */
    uint8_t oom;
} gstk_set;

void gstk_set_free(gstk_set *s);
void gstk_set_clear(gstk_set *s);
/* Adds the closure of node x (pushes rule calls, pops finished rules) to
 * out. Call gstk_begin before a batch of closures that share dedup. */
void gstk_begin(gstk_pool *p);
void gstk_closure(const grammar *g, gstk_pool *p, int32_t x, gstk_set *out);
/* out = closure of every stack of in after reading byte b. */
void gstk_step(const grammar *g, gstk_pool *p, const gstk_set *in, uint8_t b, gstk_set *out);
/* The initial set of g (root rule at its start). */
void gstk_start(const grammar *g, gstk_pool *p, gstk_set *out);
int gstk_set_copy(gstk_set *dst, const gstk_set *src);

double gclock_ms(void);

#endif
