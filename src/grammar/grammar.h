/* The grammar engine's core: EBNF text (xgrammar / GBNF dialect) -> grammar,
 * grammar x tokenizer vocabulary -> compiled grammar, and the matcher that
 * produces per-step token bitmasks. Front ends (schema.h, regex.h,
 * frontend.h) emit EBNF text that enters here. Design: docs/grammar.md.
 *
 * Lifetimes: a grammar_vocab is built once per tokenizer (it borrows
 * nothing after construction) and shared read-only by every compiled
 * grammar; a grammar_compiled owns its grammar and borrows its vocab; a
 * matcher borrows its compiled grammar. Compiled grammars and vocabs are
 * safe to share across threads (a lazily filled cache inside is locked);
 * a matcher belongs to one thread at a time. */
#ifndef TERN_GRAMMAR_H
#define TERN_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef struct grammar grammar;
typedef struct grammar_vocab grammar_vocab;
typedef struct grammar_compiled grammar_compiled;
typedef struct grammar_matcher grammar_matcher;
struct tern_tokenizer;

/* ---- grammar: EBNF text -> IR ------------------------------------------ */

typedef struct grammar_limits {
    /* Compile bounds: a pathological grammar is an error, never a hang.
     * max_states: automaton states after expanding repetitions ({m,n}
     * copies its body); max_ms: wall clock for parsing + building. */
    long max_states;
    long max_ms;
    /* alias_horizon: the longest token (bytes) the grammar will be masked
     * for. Copies of a repetition that no token of that length can tell
     * apart (x{0,500}: every copy more than horizon+1 copies from both
     * ends) share one token set; a vocabulary with longer tokens gets no
     * sharing. 0 = GRAMMAR_ALIAS_HORIZON; grammar_compile_ebnf sets it
     * to the vocabulary's longest token. */
    long alias_horizon;
    /* precompute: grammar_compile_ebnf computes the token sets of the
     * states that read many bytes (string contents, free text, wide
     * pattern classes: the walks of most of the vocabulary) before it
     * returns, up to this much work (trie nodes visited, a parser step
     * counting GRAMMAR_PRECOMPUTE_STEP), so first masks do not walk.
     * 0 = GRAMMAR_PRECOMPUTE, negative = none (all lazily, in masks). */
    long precompute;
} grammar_limits;

#define GRAMMAR_ALIAS_HORIZON 256
#define GRAMMAR_PRECOMPUTE 8000000
#define GRAMMAR_PRECOMPUTE_STEP 32

/* Defaults: 1,000,000 states, 2,000 ms, alias horizon 0 (the default). */
void grammar_limits_init(grammar_limits *l);

/* Compile control of the calling thread, for a server's compile workers:
 * while set, every compile phase on this thread (JSON-Schema and other
 * front ends, automaton build, token-set warm-up, waiting for another
 * thread's identical compile in grammar_cache_get) stops early once *cancel
 * is nonzero (TERN_ECANCELED) or the monotonic clock passes deadline_ms
 * (TERN_ETIMEOUT; a gclock value, see grammar_clock_ms; 0 = none), on top of
 * each phase's own limits. cancel is borrowed until the next call; NULL
 * and 0 turn the control off. A compile cancelled, or cut by the deadline
 * before it ran half its own limit, is not cached as a failure. */
void grammar_thread_control_set(const int *cancel, double deadline_ms);
/* 0 while the calling thread may go on, else TERN_ECANCELED or TERN_ETIMEOUT. */
int grammar_thread_stopped(void);
/* The monotonic clock the deadlines use, in milliseconds. */
double grammar_clock_ms(void);

/* Parses EBNF text[0..len) with start rule `root` (NULL = "root") and
 * builds the byte-level automaton. limits may be NULL (defaults). Errors:
 * TERN_EFORMAT (syntax; err->pos = byte offset), TERN_EINVAL (undefined
 * rule, left recursion, a rule that matches nothing), TERN_EFULL /
 * TERN_ETIMEOUT (bounds), TERN_ENOMEM. Returns NULL on error. */
grammar *grammar_from_ebnf(const char *text, size_t len, const char *root, const grammar_limits *limits,
                           tern_err *err);
void grammar_free(grammar *g);

/* The grammar printed back as normalized EBNF (one rule a line), malloc'd,
 * NUL-terminated; the caller frees it. NULL on OOM. */
char *grammar_to_ebnf(const grammar *g);

/* Byte-level membership: 1 if text[0..len) is a complete sentence of g
 * (accepted and the grammar may end there), 0 if not, negative TERN_E* on
 * error (parser state bound exceeded, OOM). The reference the token-level
 * matcher is checked against. */
int grammar_check_text(const grammar *g, const char *text, size_t len);

/* 1 if text[0..len) is a prefix of some sentence of g, 0 if not. */
int grammar_check_prefix(const grammar *g, const char *text, size_t len);

/* ---- vocabulary ---------------------------------------------------------- */

/* Prepares a tokenizer's vocabulary for masks (token bytes via
 * tokenizer_token_bytes, a sorted trie). mask_width = the model's logits
 * width, >= the tokenizer's vocab size (0 = vocab size); ids at or above
 * the vocab size are always masked. stop_ids (copied; NULL/0 = the
 * tokenizer's eos id) are the tokens allowed exactly where the grammar may
 * end. Special tokens never match grammar text. */
grammar_vocab *grammar_vocab_new(const struct tern_tokenizer *tok, int32_t mask_width, const int32_t *stop_ids,
                                 size_t n_stop, tern_err *err);

/* Same from raw token byte strings (tests, synthetic vocabularies):
 * bytes[i][0..lens[i]) is token i; is_special may be NULL. All copied. */
grammar_vocab *grammar_vocab_from_bytes(const char *const *bytes, const size_t *lens, const uint8_t *is_special,
                                        int32_t n_tokens, int32_t mask_width, const int32_t *stop_ids,
                                        size_t n_stop, tern_err *err);
void grammar_vocab_free(grammar_vocab *v);

int32_t grammar_vocab_mask_width(const grammar_vocab *v);
/* Number of uint32 words a bitmask needs: (mask_width + 31) / 32. */
size_t grammar_vocab_mask_words(const grammar_vocab *v);
/* Borrowed bytes of token id (NULL, len 0 for special / padded ids). */
const char *grammar_vocab_token(const grammar_vocab *v, int32_t id, size_t *len);
int grammar_vocab_is_stop(const grammar_vocab *v, int32_t id);

/* ---- compiled grammar ----------------------------------------------------- */

/* Binds g to a vocabulary. Takes ownership of g in every case (freed on
 * error too); vocab is borrowed and must outlive the result. Per-position
 * token sets are computed lazily on first use and cached inside. */
grammar_compiled *grammar_compile(grammar *g, const grammar_vocab *vocab, tern_err *err);
/* Convenience: grammar_from_ebnf + grammar_compile. */
grammar_compiled *grammar_compile_ebnf(const char *text, size_t len, const grammar_vocab *vocab,
                                       const grammar_limits *limits, tern_err *err);
void grammar_compiled_free(grammar_compiled *cg);
const grammar *grammar_compiled_grammar(const grammar_compiled *cg);
const grammar_vocab *grammar_compiled_vocab(const grammar_compiled *cg);

/* Work counters of a compiled grammar since it was made (read without the
 * lock: approximate while other threads compute). A "walk" is one trie
 * walk computing a token set; nodes counts the trie nodes they visited
 * one by one; class_walks the walks that took a loop class's runs
 * wholesale, count_walks those that took them by character count (a
 * chain of repetition copies); steps the parser-set transitions computed
 * (the memo's misses); class_builds the loop classes these walks split
 * the vocabulary trie for (the vocabulary caches them for every grammar)
 * and class_nodes the trie nodes those splits visited; merged the
 * children walked in their caller's caller at once (a child that would
 * pop nearly everywhere). */
typedef struct grammar_compiled_stats {
    long long entries, children, walk_nodes, shared_hits, class_walks, count_walks, steps;
    long long class_builds, class_nodes, merged;
    long long count_split_hits; /* counted walks of subtrees served by a cached class split */
    long long frame_steps; /* bytes stepped like an earlier byte of the same set by their frame pops */
} grammar_compiled_stats;
void grammar_compiled_stats_get(const grammar_compiled *cg, grammar_compiled_stats *out);

/* ---- matcher --------------------------------------------------------------- */

/* A parser positioned at the start of the grammar. cg is borrowed. */
grammar_matcher *grammar_matcher_new(grammar_compiled *cg, tern_err *err);
void grammar_matcher_free(grammar_matcher *m);
void grammar_matcher_reset(grammar_matcher *m);

/* Advances by one token. Returns 1 if accepted, 0 if rejected (state
 * unchanged), negative TERN_E* on error (state unchanged). A stop token is
 * accepted only where the grammar may end, and terminates the matcher.
 * Special non-stop tokens and padded ids are rejected. */
int grammar_matcher_accept_token(grammar_matcher *m, int32_t id);
/* Advances by raw bytes (counts as one step for rollback). Same returns. */
int grammar_matcher_accept_string(grammar_matcher *m, const char *s, size_t len);

/* Writes the allowed set for the next token into bitmask[0..n_words) (bit
 * i%32 of word i/32 = token i allowed); n_words must be >=
 * grammar_vocab_mask_words. Stop tokens are set exactly where the grammar
 * may end; after termination no bit is set. Returns the number of allowed
 * ids, or negative TERN_E*. No allocation in steady state. */
int grammar_matcher_fill_next_token_bitmask(grammar_matcher *m, uint32_t *bitmask, size_t n_words);

/* Starts the grammar over, as one more step (rollback undoes it): the next
 * segment of a structural tag. 0 or TERN_ENOMEM. */
int grammar_matcher_restart(grammar_matcher *m);

/* Undoes the last n accepted steps (tokens or strings). TERN_ERANGE if
 * fewer steps were taken. */
int grammar_matcher_rollback(grammar_matcher *m, int n);
/* Steps accepted so far (what rollback can undo). */
int grammar_matcher_n_steps(const grammar_matcher *m);

/* The longest string every continuation must start with (the unique forced
 * continuation; empty if the next byte is not forced or the grammar may end
 * here). Writes at most cap-1 bytes plus a NUL to out and returns the
 * length. The matcher is not advanced. May end inside a UTF-8 character. */
size_t grammar_matcher_find_jump_forward_string(grammar_matcher *m, char *out, size_t cap);

/* 1 after a stop token was accepted, or when the grammar is complete and
 * admits no further byte (then only stop tokens are allowed). */
int grammar_matcher_is_terminated(const grammar_matcher *m);
/* 1 if the text so far is a complete sentence (a stop token is allowed). */
int grammar_matcher_can_end(const grammar_matcher *m);

#endif
