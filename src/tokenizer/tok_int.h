/* Private types of the tokenizer: the loaded pipeline (normalizer,
 * pre-tokenizer, model, post-processor, decoder) as tagged trees, plus the
 * small containers (byte buffers, string→id and pair→merge hash maps, piece
 * lists) the stages pass between them. Only src/tokenizer/ includes this. */
#ifndef TERN_TOKENIZER_INT_H
#define TERN_TOKENIZER_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/err.h"
#include "tokenizer.h"

/* ---- growable byte buffer ---------------------------------------------- */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;

int tok_buf_reserve(tok_buf *b, size_t extra);
int tok_buf_add(tok_buf *b, const void *s, size_t n);
int tok_buf_addc(tok_buf *b, char c);
void tok_buf_free(tok_buf *b);

/* ---- string -> int32 map (open addressing; keys borrowed) -------------- */
typedef struct tok_map_slot {
    const char *key; /* borrowed; NULL = empty */
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tok_map_slot;

typedef struct tok_map {
    tok_map_slot *slots;
    size_t cap, n; /* cap is a power of two */
} tok_map;

uint32_t tok_hash(const void *s, size_t n);
int tok_map_init(tok_map *m, size_t expect);
/* Inserts or overwrites. */
int tok_map_put(tok_map *m, const char *key, size_t len, int32_t val);
int32_t tok_map_get(const tok_map *m, const char *key, size_t len); /* -1 if absent */
void tok_map_free(tok_map *m);

/* ---- (left id, right id) -> (rank, merged id) -------------------------- */
typedef struct tok_merge_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0 = empty */
    uint32_t rank;
    int32_t id;
} tok_merge_slot;

typedef struct tok_merges {
    tok_merge_slot *slots;
    size_t cap, n;
} tok_merges;

int tok_merges_init(tok_merges *m, size_t expect);
int tok_merges_put(tok_merges *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
/* 1 and fills rank/id if the pair merges, else 0. */
int tok_merges_get(const tok_merges *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id);
void tok_merges_free(tok_merges *m);

/* ---- UTF-8 and Unicode helpers ----------------------------------------- */
/* Decodes one code point at s (n >= 1 bytes available, valid UTF-8
 * assumed); returns its length. */
int tok_utf8_dec(const char *s, size_t n, uint32_t *cp);
int tok_utf8_enc(uint32_t cp, char out[4]);
/* Length of a valid sequence starting at s, 0 if invalid/incomplete. */
int tok_utf8_valid_len(const char *s, size_t n);
/* Appends s with every invalid sequence replaced by U+FFFD the way Rust's
 * String::from_utf8_lossy does (one per maximal invalid prefix). */
int tok_utf8_lossy(tok_buf *out, const char *s, size_t n);
int tok_is_whitespace(uint32_t cp); /* Rust char::is_whitespace */
int tok_is_word(uint32_t cp);       /* regex \w (Unicode) */
int tok_is_alnum(uint32_t cp);      /* Rust char::is_alphanumeric */
int tok_is_numeric(uint32_t cp);    /* Rust char::is_numeric */
int tok_is_punct(uint32_t cp);      /* ASCII punctuation or Unicode P* */
int tok_is_control(uint32_t cp);    /* BERT's notion: Cc/Cf except \t\n\r */
int tok_is_cjk(uint32_t cp);        /* BERT's CJK ideograph ranges */

/* ---- patterns (String or Regex as in tokenizer.json) ------------------- */
typedef struct tok_pattern {
    char *lit; /* literal string (owned) or NULL */
    size_t lit_len;
    pcre2_code *re; /* compiled with UTF|UCP, JIT'ed when available */
} tok_pattern;

/* Parses {"String": s} / {"Regex": r} (or a bare string = literal). */
struct json_object;
int tok_pattern_parse(tok_pattern *p, struct json_object *o, const char *what, tern_err *err);
void tok_pattern_free(tok_pattern *p);
/* Finds the next match in s[from..n): 1 and fills [*ms, *me), 0 if none,
 * negative on a matcher error. Empty matches are reported (callers step). */
int tok_pattern_find(const tok_pattern *p, const char *s, size_t n, size_t from, size_t *ms, size_t *me,
                     pcre2_match_data *md);

/* ---- normalizers ------------------------------------------------------- */
enum tok_norm_type {
    NORM_SEQUENCE,
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_LOWERCASE,
    NORM_PREPEND,
    NORM_REPLACE,
    NORM_STRIP,
    NORM_STRIP_ACCENTS,
    NORM_BERT,
};

typedef struct tok_norm {
    int type;
    struct tok_norm **subs; /* NORM_SEQUENCE */
    size_t n_subs;
    char *str; /* PREPEND text, REPLACE content (owned) */
    size_t str_len;
    tok_pattern pat; /* REPLACE */
    int left, right; /* STRIP */
    int clean_text, chinese, strip_accents, lowercase; /* BERT */
} tok_norm;

/* ---- pre-tokenizers ---------------------------------------------------- */
enum tok_split_behavior { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum tok_prepend_scheme { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

enum tok_pre_type {
    PRE_SEQUENCE,
    PRE_BYTELEVEL,
    PRE_SPLIT,
    PRE_METASPACE,
    PRE_DIGITS,
    PRE_PUNCTUATION,
    PRE_WHITESPACE,
    PRE_WHITESPACE_SPLIT,
    PRE_BERT,
    PRE_CHAR_DELIMITER,
};

typedef struct tok_pre {
    int type;
    struct tok_pre **subs;
    size_t n_subs;
    tok_pattern pat; /* SPLIT, BYTELEVEL regex, WHITESPACE regex */
    int behavior, invert;
    int add_prefix_space, use_regex; /* BYTELEVEL */
    char repl[8];                    /* METASPACE replacement (UTF-8) */
    size_t repl_len;
    int prepend_scheme, split; /* METASPACE */
    int individual_digits;     /* DIGITS */
    uint32_t delim;            /* CHAR_DELIMITER */
} tok_pre;

/* ---- decoders ---------------------------------------------------------- */
enum tok_dec_type {
    DEC_SEQUENCE,
    DEC_BYTELEVEL,
    DEC_METASPACE,
    DEC_BYTEFALLBACK,
    DEC_FUSE,
    DEC_STRIP,
    DEC_REPLACE,
    DEC_WORDPIECE,
    DEC_BPE,
};

typedef struct tok_dec {
    int type;
    struct tok_dec **subs;
    size_t n_subs;
    tok_pattern pat; /* REPLACE */
    char *str;       /* REPLACE content / WORDPIECE prefix / BPE suffix (owned) */
    size_t str_len;
    char repl[8]; /* METASPACE replacement / STRIP content */
    size_t repl_len;
    int prepend_scheme; /* METASPACE */
    int start, stop;    /* STRIP */
    int cleanup;        /* WORDPIECE */
} tok_dec;

/* ---- post-processor ---------------------------------------------------- */
/* Flattened: the ids before and after the single sequence. */
typedef struct tok_post {
    int present;      /* adds something (template / roberta / bert) */
    int32_t *pre_ids; /* owned */
    size_t n_pre;
    int32_t *post_ids;
    size_t n_post;
} tok_post;

/* ---- added tokens ------------------------------------------------------ */
typedef struct tok_added {
    int32_t id;
    char *content; /* owned */
    size_t len;
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* A byte trie over added-token contents; leftmost-longest matching walks it
 * from each position (bounded by the longest token). */
typedef struct tok_trie {
    int32_t *term;   /* node -> added index or -1 */
    size_t n_nodes;  /* node 0 = root */
    tok_merges edges; /* (node, byte) -> child, reusing the pair map */
    uint8_t first[256];
    int empty;
} tok_trie;

/* ---- model ------------------------------------------------------------- */
enum tok_model_type { MODEL_BPE, MODEL_WORDPIECE, MODEL_UNIGRAM };

typedef struct tok_cache tok_cache;

/* ---- the tokenizer ----------------------------------------------------- */
struct tern_tokenizer {
    /* vocabulary: id -> string (into arena), string -> id */
    char **id_str;       /* [n_ids] NULL for holes */
    uint32_t *id_len;    /* [n_ids] */
    int32_t n_ids;
    tok_map vocab;       /* model vocabulary */
    tok_map added_map;   /* added token content -> id */
    uint8_t *id_flags;   /* [n_ids] bit0 special added, bit1 added */
    char *strings;       /* arena holding every vocabulary string */

    int model_type;
    /* BPE */
    tok_merges merges;
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    char *cont_prefix, *eow_suffix; /* NULL if none */
    size_t cont_prefix_len, eow_suffix_len;
    int32_t byte_ids[256]; /* <0xAB> ids when byte_fallback, else -1 */
    /* WordPiece */
    int max_input_chars;
    /* Unigram */
    double *scores; /* [n_ids] */
    double min_score;
    size_t max_piece_len;

    tok_norm *norm;
    tok_pre *pre;
    tok_dec *dec;
    tok_post post;

    tok_added *added; /* [n_added] */
    size_t n_added;
    tok_trie trie_raw, trie_norm;

    int32_t bos_id, eos_id;
    char *bos_str, *eos_str, *chat_template;

    /* token_bytes: per-id byte strings (into tb_arena) */
    char **tb_str;
    uint32_t *tb_len;

    tok_cache *cache;
};

/* Stage entry points (tok_*.c). */
int tok_normalize(const tok_norm *n, const char *s, size_t len, tok_buf *out, pcre2_match_data *md, tern_err *err);

typedef struct tok_piece {
    size_t off, len;   /* into the owning tok_pieces text */
    int32_t id;        /* >= 0: an added token, left alone by later stages */
    uint8_t first;     /* starts at offset 0 of the original input */
} tok_piece;

typedef struct tok_pieces {
    tok_piece *v;
    size_t n, cap;
    tok_buf text;
} tok_pieces;

int tok_pieces_push(tok_pieces *p, const char *s, size_t len, int32_t id, int first);
void tok_pieces_free(tok_pieces *p);
int tok_pretokenize(const tok_pre *pre, tok_pieces *in, tok_pieces *scratch, pcre2_match_data *md, tern_err *err);

/* Model: appends the ids of one pre-token to out. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int tok_ids_push(tok_ids *x, int32_t id);
int tok_model_encode(const tern_tokenizer *t, const char *s, size_t len, tok_ids *out);

/* Added tokens: splits s into pieces, matching with trie tr. */
int tok_trie_build(tok_trie *tr, const tern_tokenizer *t, int normalized, const tok_norm *norm, tern_err *err);
void tok_trie_free(tok_trie *tr);
int tok_added_split(const tern_tokenizer *t, const tok_trie *tr, const char *s, size_t len, int first,
                    tok_pieces *out);

/* Decoder chain over a piece list (ids unused). */
int tok_decode_chain(const tok_dec *d, tok_pieces *toks, tok_pieces *scratch, pcre2_match_data *md);

/* Component parsers (tok_load_parts.c). */
int tok_norm_parse(tok_norm **out, struct json_object *o, tern_err *err);
void tok_norm_free(tok_norm *n);
int tok_pre_parse(tok_pre **out, struct json_object *o, tern_err *err);
void tok_pre_free(tok_pre *p);
int tok_dec_parse(tok_dec **out, struct json_object *o, tern_err *err);
void tok_dec_free(tok_dec *d);

/* Pre-token -> ids cache (tok_encode.c). */
tok_cache *tok_cache_new(void);
void tok_cache_free(tok_cache *c);

/* Reads a one-character string field of o (dflt if absent) into out. */
int tok_parse_char(struct json_object *o, const char *key, const char *dflt, char out[8], size_t *len, tern_err *err);
/* "<0xAB>" -> 0xAB, else -1. */
int tok_byte_token(const char *s, size_t n);
/* Fills t->tb_len and the arena behind tokenizer_token_bytes; offs[id]
 * gets each token's offset in arena. */
int tok_token_bytes_build(tern_tokenizer *t, tok_buf *arena, size_t *offs);

/* GPT-2 byte <-> char map. */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp); /* -1 if not a byte char */

#endif
