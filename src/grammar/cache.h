/* The compile cache: compiled grammars of one vocabulary, keyed by a
 * normalized spec string (the caller's choice: kind + canonical text +
 * options), evicted least-recently-used by estimated memory. Identical
 * concurrent compiles run once: the first caller compiles, the others wait
 * for its result. Failures are cached too (a pathological schema costs its
 * time bound once, not once per request). Thread-safe. */
#ifndef TERN_GRAMMAR_CACHE_H
#define TERN_GRAMMAR_CACHE_H

#include <stddef.h>

#include "base/err.h"
#include "grammar/grammar.h"

typedef struct grammar_cache grammar_cache;
typedef struct grammar_cache_ref grammar_cache_ref;

/* Produces the EBNF text of a spec on a miss: *ebnf_out malloc'd (the
 * cache frees it). Returns 0 or a negative TERN_E* with err set. */
typedef int (*grammar_cache_build_fn)(void *user, char **ebnf_out, tern_err *err);

/* vocab is borrowed and must outlive the cache. max_bytes: the memory
 * budget of cached grammars (0 = 256 MiB; grammars in use are never freed,
 * so the budget may be exceeded while they run). limits (copied; NULL =
 * defaults) bound every compile. */
grammar_cache *grammar_cache_new(const grammar_vocab *vocab, size_t max_bytes, const grammar_limits *limits,
                                 tern_err *err);
/* Frees the cache. Every reference must have been released. */
void grammar_cache_free(grammar_cache *c);

/* The compiled grammar for key[0..key_len): cached, or built with build(user)
 * and compiled (or waited for when another thread is compiling the same
 * key). On success returns a reference (release with grammar_cache_release)
 * and sets *hit to 1 if no compile ran in this call (0 if it did) and
 * *compile_ms to the time spent here (compile or wait). On failure returns
 * NULL with err set to the compile's error (cached: the same key fails at
 * once the next time). */
grammar_cache_ref *grammar_cache_get(grammar_cache *c, const char *key, size_t key_len, grammar_cache_build_fn build,
                                     void *user, int *hit, double *compile_ms, tern_err *err);
/* The compiled grammar of a reference: borrowed, valid until the release.
 * Matchers over it may run in any thread. */
grammar_compiled *grammar_cache_ref_compiled(grammar_cache_ref *r);
/* Takes one more reference on r (each engine row holds its own). */
void grammar_cache_ref_retain(grammar_cache *c, grammar_cache_ref *r);
/* Drops a reference (NULL is a no-op). The grammar's memory estimate is
 * refreshed here (its token sets fill lazily while matchers run) and the
 * cache trims itself to its budget. */
void grammar_cache_release(grammar_cache *c, grammar_cache_ref *r);

typedef struct grammar_cache_stats {
    long long hits, misses, waits, failures, evictions;
    size_t n_entries, bytes;
} grammar_cache_stats;
void grammar_cache_stats_get(grammar_cache *c, grammar_cache_stats *st);

/* Estimated bytes held by a compiled grammar (automaton + token sets
 * computed so far). */
size_t grammar_compiled_mem_bytes(grammar_compiled *cg);

#endif
