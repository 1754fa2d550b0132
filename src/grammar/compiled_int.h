/* Private layout of grammar_compiled: the per-state token sets computed
 * lazily by compiled.c and read by the matcher's mask fill. */
#ifndef TERN_GRAMMAR_COMPILED_INT_H
#define TERN_GRAMMAR_COMPILED_INT_H

#include <pthread.h>

#include "grammar/grammar_int.h"
#include "grammar/vocab_int.h"

/* Token sets for a parser context. The context of a top-level entry is
 * one stack frame, a scannable state s with an unknown caller: then
 * - accepted tokens are read entirely inside the frame (or the frame's
 *   rule ends exactly at the token's end): valid whatever the caller;
 * - pops are vocabulary-trie nodes where the rule can end with bytes of
 *   the token left: for the tokens below such a node, the remaining
 *   suffix is the caller's business;
 * - every other token is rejected.
 * A child entry (E, t) continues E's pops in the caller's frame, whose
 * return state is t, again with an unknown caller below it; so for a real
 * stack s | t1 | t2 | ... the allowed set is the union of the accepted sets
 * along the chain E(s), E(s,t1), E(s,t1,t2), ... until no pop remains.
 * Children are created on demand and cached: the chains JSON grammars
 * produce are short and few. */
typedef struct gctx_entry gctx_entry;

/* Interned parser sets per compiled grammar (each holds a 1 KiB
 * transition row). */
#define GCOMP_MAX_SETS 200000
/* The transition rows live in pages of 2^GCOMP_TRANS_SHIFT sets (1 MiB):
 * one contiguous table doubled by realloc copied all of it inside the
 * mask that interned the next set (16 MiB at 16,384 sets, 5-15 ms on a
 * 2-core machine); pages are only added. The first page grows up to its
 * full size by realloc, so a small grammar's table stays small. */
#define GCOMP_TRANS_SHIFT 10

/* loop_flags: every ASCII byte is known one way or the other */
#define GLOOP_ASC_FULL 8
struct gctx_entry {
    uint64_t key;        /* structural key if shared through the vocab, else 0 */
    uint32_t *acc_bits;  /* [n_words] bitset for a large accepted set, or */
    int32_t *acc_ids;    /* the ids of a small one */
    int32_t n_acc;
    int32_t *pops;       /* vocab trie nodes with a suffix to pass on */
    int32_t n_pops;
};

void gctx_entry_free(gctx_entry *e);

/* (entry, caller return state) -> child entry, per compiled grammar */
typedef struct gchild_slot {
    const gctx_entry *parent;
    int32_t t, t2;      /* t2: the caller's caller for a merged child, else -1 */
    gctx_entry *child;
} gchild_slot;

struct grammar_compiled {
    grammar *g;                /* owned */
    const grammar_vocab *v;    /* borrowed */
    const int32_t *alias;      /* the state whose token sets s shares: g->st_alias when its horizon covers
                                * v's tokens, then g->st_equiv; NULL for none */
    int32_t *alias_own;
    pthread_mutex_t lock;      /* guards the precompute context and entries */
    gctx_entry **entries;      /* [n_states], filled lazily, published atomically */
    gchild_slot *children;     /* open-addressing map, cap a power of two */
    size_t n_children, cap_children;
    gctx_entry **owned;        /* entries not shared through the vocab */
    size_t n_owned, cap_owned;
    gshare_slot *lkeys;        /* owned entries with a key (the vocab's cache was full) */
    size_t n_lkeys, cap_lkeys;

    /* precompute context: stacks with unknown bottoms, interned sets of
     * them and a memo of set x byte -> set (a lazily built DFA) */
    gstk_pool pool;
    int32_t n_sets, cap_sets;
    int32_t *set_off;          /* [n_sets+1] into set_ids */
    int32_t *set_ids;
    size_t n_set_ids, cap_set_ids;
    int32_t *set_heads;        /* hash chains over sets */
    int32_t *set_next;
    uint32_t set_hmask;
    /* set x byte -> -1 unknown, else next*2 + popped: row sid (256 entries)
     * at trans_pg[sid >> GCOMP_TRANS_SHIFT], a page of sets that never
     * moves once allocated (gcomp_trans_row) */
    int32_t *trans_pg[(GCOMP_MAX_SETS >> GCOMP_TRANS_SHIFT) + 1];
    /* per set, filled on demand by the walk's loop skip: the ASCII bytes
     * known to lead back to the same set without a pop ([0..1]) and known
     * not to ([2..3]), and GLOOP_* flags */
    uint64_t (*loop_asc)[4];
    uint8_t *loop_flags;
    gstk_set tmp_in, tmp_out;
    /* walk scratch */
    uint32_t *scratch_bits;    /* [n_words] */
    uint64_t *scratch_sum;     /* [n_words / 64 + 1]: bit w = scratch_bits[w] may be set */
    int scratch_full;          /* a whole bitset was ORed in: every word may be set */
    int32_t *scratch_S;        /* [max_len+2] set per depth */
    uint8_t *scratch_pop;      /* [max_len+2] */
    int32_t *scratch_pops;
    int32_t n_scratch_pops, cap_scratch_pops;
    /* counted walks (compiled_chain.c): per set, -1 unknown, -2 none,
     * else its chain in chains[]; the chains' sets in chain_sets */
    int32_t *chain_of;         /* [cap_sets] */
    struct gchain *chains;
    int32_t n_chains, cap_chains;
    int32_t *chain_sets;
    size_t n_chain_sets, cap_chain_sets;
    long long chain_extends;   /* tests: chains verified further after their first use */
    /* per set, on demand: its UTF-8 character table (gcomp_utf8_table),
     * -1 none yet, else its offset in u8_tab */
    int32_t *u8_of;            /* [cap_sets] */
    int32_t *fpop_t;           /* [cap_sets] the last step with frame pops (gcomp_set_trans), -1 none, */
    uint64_t *fpop_mask;       /* [cap_sets] and its pops */
    uint8_t *rule_calls;       /* [n_rules] some state of the rule calls a rule */
    int32_t *u8_tab;
    size_t n_u8_tab, cap_u8_tab;
    int32_t *sub_ch;           /* [max_len+2] subtree walk: characters, */
    int8_t *sub_u;             /* UTF-8 state, */
    int32_t *sub_lb;           /* last boundary depth, */
    uint8_t *sub_b;            /* byte per depth */
    grammar_compiled_stats stats; /* guarded by lock */
    int32_t pop_cap;           /* child walks: give up past this many pops (0: never) */
    int pop_over;              /* ... and one was given up */
    long long step_cap;        /* merged children: give up at this step count (0: never) */
    int step_over;             /* ... and one was given up */
    int plain_walk;            /* tests: walk node by node (no loop skip, no classes), step every byte (no frames) */
};

/* A chain of sets (compiled_chain.c): X[0] = x and, for k < len, every
 * character of the class (ASCII bytes asc, every strict UTF-8 character
 * whose lead byte is in lead, see gvoc_class) found at position k or later of some vocabulary path leads
 * X[k] to X[k+1] through non-empty sets without a pop; past len:
 * GCHAIN_FULL no path has more characters, GCHAIN_LOOP X[len] reads the
 * whole class back to itself, GCHAIN_DEAD X[len] reads every such
 * character into the empty set. */
#define GCHAIN_FULL 0
#define GCHAIN_LOOP 1
#define GCHAIN_DEAD 2
/* verified for len levels so far (more on demand), or for len levels
 * only (a level after them breaks the chain): walks that need no more
 * levels use it (compiled_chain.c's chain_get) */
#define GCHAIN_OPEN 3
#define GCHAIN_STOP 4
typedef struct gchain {
    uint64_t asc[2];
    int32_t off;        /* X[k] = chain_sets[off + k], k in [0, len] */
    int32_t len;
    uint64_t lead;
    const gvoc_class *cls; /* the vocabulary's split of the class (lead bytes all or none) once found */
    uint8_t kind;
} gchain;

/* Walk-level helpers shared by compiled.c and compiled_chain.c (caller
 * holds cg->lock). gcomp_set_trans: set x byte -> next*2 + popped, -1 on
 * OOM / bound. gcomp_utf8_reaches: every strict UTF-8 character whose
 * lead byte b has bit b - 0xC0 in lead leads x to l through non-empty
 * sets without a pop (1 yes, 0 no, -1 OOM). gcomp_walk: the trie walk of
 * [lo, hi) below depth base from set sid0 into the scratch (0 / -1).
 * gcomp_count_walk: the counted class walk of [lo, hi) from x (1 done, 0
 * not applicable, -1 OOM); same preconditions as the class walk. */
int32_t gcomp_set_trans(grammar_compiled *cg, int32_t sid, uint8_t byte);
/* gcomp_utf8_table: per lead byte 0xC0 + i (i < GU8_LEADS), where x's
 * characters of that lead byte lead: a set z > 0 (all of them, through
 * non-empty sets without a pop), GU8_DEAD (the lead byte empties x
 * without a pop) or GU8_MIXED. NULL on OOM. */
#define GU8_LEADS 53
#define GU8_MIXED (-1)
#define GU8_DEAD (-2)
const int32_t *gcomp_utf8_table(grammar_compiled *cg, int32_t x);
int gcomp_utf8_reaches(grammar_compiled *cg, int32_t x, int32_t l, uint64_t lead);
int gcomp_walk(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t sid0);
/* gcomp_walk, but with whole = 0 the range itself is not handed to a
 * class or counted walk (a frontier subtree: its first node is read one
 * by one, so nested walks always make progress). */
int gcomp_walk_from(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t sid0, int whole);
int gcomp_count_walk(grammar_compiled *cg, int32_t lo, int32_t hi, int32_t base, int32_t x);
/* Builds x's chain now when a whole-trie walk from x would (the
 * precompute: see pre_calls); 1 built or known, 0 none, -1 OOM. */
int gcomp_chain_warm(grammar_compiled *cg, int32_t x);

/* Set sid's transition row (256 entries, one per byte). */
static inline int32_t *gcomp_trans_row(const grammar_compiled *cg, int32_t sid)
{
    return cg->trans_pg[sid >> GCOMP_TRANS_SHIFT] + ((size_t)(sid & ((1 << GCOMP_TRANS_SHIFT) - 1)) << 8);
}

/* Accepts token id into the walk's scratch (bitset and its word summary). */
static inline void gscratch_set(uint32_t *bits, uint64_t *sum, int32_t id)
{
    uint32_t w = (uint32_t)id >> 5;
    bits[w] |= 1u << (id & 31);
    sum[w >> 6] |= 1ull << (w & 63);
}

/* Walks below trie nodes smaller than this go node by node. */
#define GCOMP_CLASS_MIN_NODES 256
/* Counted walks of subtrees (split on the fly) start at this size. */
#define GCOMP_COUNT_MIN_NODES 8

/* Precompute (grammar_compile_ebnf): the entries of the states reading at
 * least this many byte values, within a work budget (grammar_limits). */
#define GCOMP_PRE_MIN_BYTES 16
/* ... and the masks of the closures holding at least this many top
 * states (an object's property names) */
#define GCOMP_PRE_MIN_TOPS 24
/* ... and the first characters of called character rules, for so many
 * calls of each calling rule */
#define GCOMP_PRE_CALLS 4
void gcompiled_precompute(grammar_compiled *cg, long budget);

/* The entry of state s, computing it on first use. NULL on OOM. */
const gctx_entry *gcompiled_entry(grammar_compiled *cg, int32_t s);
/* Past this many pops a child is not kept, past this many parser steps
 * a merged child neither (see gcompiled_child). */
#define GCOMP_HEAVY_POPS 4096
#define GCOMP_MERGE_MAX_STEPS 2048
/* The child of e for a caller returning to state t (computed on first
 * use), NULL on OOM. t2 is the return state of t's own caller (-1 none):
 * when the child of e for t would pop at more than
 * GCOMP_HEAVY_POPS trie nodes (a nullable rule called at every character,
 * the right recursion a pattern becomes: its pops are nearly every node
 * and the next child walks each of their subtrees), the pops of e are
 * continued in [t | t2 | unknown] at once instead (*used2 = 1): t's
 * frame ending hands the bytes to t2's inside one walk, whose sets loop.
 * Its accepted tokens are those of child(e, t) and its child for t2, its
 * pops those of the latter. A merged walk past GCOMP_MERGE_MAX_STEPS
 * steps (its sets do not loop: a counted pattern) is given up and the
 * child computed in full instead, once per (e, t). */
const gctx_entry *gcompiled_child(grammar_compiled *cg, const gctx_entry *e, int32_t t, int32_t t2, int *used2);

#endif
