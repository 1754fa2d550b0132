/* Containers and text helpers shared by the tokenizer stages: byte buffers,
 * the string->id and pair->merge hash maps, UTF-8 coding with Rust-style
 * lossy repair, Unicode predicates matching Rust's char methods, String /
 * Regex patterns (PCRE2 with JIT) and the GPT-2 byte<->char table. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>
#include <utf8proc.h>

#include "tok_int.h"

/* ---- tok_buf ----------------------------------------------------------- */
int tok_buf_reserve(tok_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return TERN_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tok_buf_add(tok_buf *b, const void *s, size_t n)
{
    if (tok_buf_reserve(b, n))
        return TERN_ENOMEM;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

int tok_buf_addc(tok_buf *b, char c) { return tok_buf_add(b, &c, 1); }

void tok_buf_free(tok_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- hashing ----------------------------------------------------------- */
/* FNV-1a over 8-byte words then bytes, finished with a murmur mix: the keys
 * are short (vocabulary strings), so a simple hash is fastest. */
uint32_t tok_hash(const void *s, size_t n)
{
    const unsigned char *p = s;
    uint64_t h = 0xcbf29ce484222325ull;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    while (n--) {
        h = (h ^ *p++) * 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (uint32_t)h;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

int tok_map_init(tok_map *m, size_t expect)
{
    m->cap = pow2_at_least(expect * 2 + 1);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : TERN_ENOMEM;
}

static int tok_map_grow(tok_map *m)
{
    tok_map nm = {calloc(m->cap * 2, sizeof *m->slots), m->cap * 2, m->n};
    if (!nm.slots)
        return TERN_ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        tok_map_slot *s = &m->slots[i];
        if (!s->key)
            continue;
        size_t j = s->hash & (nm.cap - 1);
        while (nm.slots[j].key)
            j = (j + 1) & (nm.cap - 1);
        nm.slots[j] = *s;
    }
    free(m->slots);
    *m = nm;
    return 0;
}

int tok_map_put(tok_map *m, const char *key, size_t len, int32_t val)
{
    if ((m->n + 1) * 2 > m->cap && tok_map_grow(m))
        return TERN_ENOMEM;
    uint32_t h = tok_hash(key, len);
    size_t j = h & (m->cap - 1);
    for (;; j = (j + 1) & (m->cap - 1)) {
        tok_map_slot *s = &m->slots[j];
        if (!s->key) {
            *s = (tok_map_slot){key, (uint32_t)len, h, val};
            m->n++;
            return 0;
        }
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            s->val = val;
            return 0;
        }
    }
}

int32_t tok_map_get(const tok_map *m, const char *key, size_t len)
{
    if (!m->cap)
        return -1;
    uint32_t h = tok_hash(key, len);
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const tok_map_slot *s = &m->slots[j];
        if (!s->key)
            return -1;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len))
            return s->val;
    }
}

void tok_map_free(tok_map *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- merges ------------------------------------------------------------ */
static inline size_t merge_slot(uint64_t key, size_t cap)
{
    key *= 0x9e3779b97f4a7c15ull;
    return (size_t)(key >> 32) & (cap - 1);
}

int tok_merges_init(tok_merges *m, size_t expect)
{
    m->cap = pow2_at_least(expect * 2 + 1);
    m->n = 0;
    m->slots = calloc(m->cap, sizeof *m->slots);
    return m->slots ? 0 : TERN_ENOMEM;
}

int tok_merges_put(tok_merges *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
    if ((m->n + 1) * 2 > m->cap) {
        tok_merges nm = {calloc(m->cap * 2, sizeof *m->slots), m->cap * 2, m->n};
        if (!nm.slots)
            return TERN_ENOMEM;
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->slots[i].key)
                continue;
            size_t j = merge_slot(m->slots[i].key, nm.cap);
            while (nm.slots[j].key)
                j = (j + 1) & (nm.cap - 1);
            nm.slots[j] = m->slots[i];
        }
        free(m->slots);
        *m = nm;
    }
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (size_t j = merge_slot(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
        tok_merge_slot *s = &m->slots[j];
        if (!s->key) {
            *s = (tok_merge_slot){key, rank, id};
            m->n++;
            return 0;
        }
        if (s->key == key) {
            s->rank = rank;
            s->id = id;
            return 0;
        }
    }
}

int tok_merges_get(const tok_merges *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
    if (!m->cap)
        return 0;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (size_t j = merge_slot(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
        const tok_merge_slot *s = &m->slots[j];
        if (!s->key)
            return 0;
        if (s->key == key) {
            *rank = s->rank;
            *id = s->id;
            return 1;
        }
    }
}

void tok_merges_free(tok_merges *m)
{
    free(m->slots);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ------------------------------------------------------------- */
int tok_utf8_dec(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    if (u[0] < 0x80 || n < 2) {
        *cp = u[0];
        return 1;
    }
    if (u[0] < 0xE0) {
        *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
        return 2;
    }
    if (u[0] < 0xF0 || n < 4) {
        if (n < 3) {
            *cp = u[0];
            return 1;
        }
        *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
          (u[3] & 0x3F);
    return 4;
}

int tok_utf8_enc(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Returns the length of the valid sequence at s, or 0; *bad gets the number
 * of bytes forming the maximal invalid prefix (Unicode "substitution of
 * maximal subparts", which Rust follows) when invalid. */
static int utf8_check(const unsigned char *s, size_t n, size_t *bad)
{
    unsigned c = s[0];
    if (c < 0x80)
        return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i <= (size_t)need; i++) {
        if (i >= n) {
            *bad = i;
            return 0;
        }
        unsigned b = s[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *bad = i;
            return 0;
        }
    }
    return need + 1;
}

int tok_utf8_valid_len(const char *s, size_t n)
{
    size_t bad;
    return n ? utf8_check((const unsigned char *)s, n, &bad) : 0;
}

int tok_utf8_lossy(tok_buf *out, const char *s, size_t n)
{
    size_t i = 0, run = 0;
    while (i < n) {
        size_t bad = 0;
        int l = utf8_check((const unsigned char *)s + i, n - i, &bad);
        if (l) {
            i += (size_t)l;
            continue;
        }
        if (tok_buf_add(out, s + run, i - run) || tok_buf_add(out, "\xEF\xBF\xBD", 3))
            return TERN_ENOMEM;
        i += bad;
        run = i;
    }
    return tok_buf_add(out, s + run, n - run);
}

/* ---- Unicode predicates ------------------------------------------------ */
int tok_is_whitespace(uint32_t cp)
{
    return (cp >= 9 && cp <= 13) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

int tok_is_word(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_';
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_NL:
        return 1;
    default:
        return cp == 0x200C || cp == 0x200D;
    }
}

int tok_is_numeric(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    int c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

int tok_is_alnum(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
    int c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || tok_is_numeric(cp);
}

int tok_is_punct(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) || (cp >= 123 && cp <= 126);
    int c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

int tok_is_control(uint32_t cp)
{
    if (cp == '\t' || cp == '\n' || cp == '\r')
        return 0;
    int c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CN ||
           c == UTF8PROC_CATEGORY_CO;
}

int tok_is_cjk(uint32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) ||
           (cp >= 0x2B820 && cp <= 0x2CEAF) || (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* ---- patterns ---------------------------------------------------------- */
/* Oniguruma's (and Rust regex's) Unicode \w: Alphabetic, marks, decimal
 * digits, connector punctuation, joiners. PCRE2 10.42's \w with UCP is only
 * letters, digits and '_', so \w and \W are rewritten with this set. */
#define WORD_SET "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{24B6}-\\x{24E9}\\x{200C}\\x{200D}"

static int translate_regex(const char *s, size_t n, tok_buf *out)
{
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            char d = s[i + 1];
            int rc;
            if (d == 'w')
                rc = in_class ? tok_buf_add(out, WORD_SET, sizeof WORD_SET - 1)
                              : tok_buf_add(out, "[" WORD_SET "]", sizeof WORD_SET + 1);
            else if (d == 'W' && !in_class)
                rc = tok_buf_add(out, "[^" WORD_SET "]", sizeof WORD_SET + 2);
            else
                rc = tok_buf_add(out, s + i, 2);
            if (rc)
                return rc;
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            if (tok_buf_addc(out, c))
                return TERN_ENOMEM;
            /* a leading ']' (after an optional '^') is literal */
            if (i + 1 < n && s[i + 1] == '^') {
                if (tok_buf_addc(out, '^'))
                    return TERN_ENOMEM;
                i++;
            }
            if (i + 1 < n && s[i + 1] == ']') {
                if (tok_buf_addc(out, ']'))
                    return TERN_ENOMEM;
                i++;
            }
            continue;
        }
        if (c == ']' && in_class)
            in_class = 0;
        if (tok_buf_addc(out, c))
            return TERN_ENOMEM;
    }
    return tok_buf_add(out, "", 0);
}

int tok_pattern_parse(tok_pattern *p, json_object *o, const char *what, tern_err *err)
{
    memset(p, 0, sizeof *p);
    json_object *v = NULL;
    const char *s = NULL;
    size_t n = 0;
    int regex = 0;
    if (o && json_object_is_type(o, json_type_string)) {
        v = o;
    } else if (o && json_object_is_type(o, json_type_object)) {
        if (json_object_object_get_ex(o, "Regex", &v))
            regex = 1;
        else if (!json_object_object_get_ex(o, "String", &v))
            v = NULL;
    }
    if (!v || !json_object_is_type(v, json_type_string))
        return tern_err_set(err, TERN_EFORMAT, "%s: pattern must be {\"String\": ..} or {\"Regex\": ..}", what);
    s = json_object_get_string(v);
    n = (size_t)json_object_get_string_len(v);
    if (!regex) {
        p->lit = malloc(n + 1);
        if (!p->lit)
            return tern_err_set(err, TERN_ENOMEM, "out of memory");
        memcpy(p->lit, s, n);
        p->lit[n] = 0;
        p->lit_len = n;
        return 0;
    }
    int ec;
    PCRE2_SIZE eo;
    tok_buf rx = {0};
    if (translate_regex(s, n, &rx))
        return tern_err_set(err, TERN_ENOMEM, "out of memory");
    p->re = pcre2_compile((PCRE2_SPTR)rx.p, rx.len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    tok_buf_free(&rx);
    if (!p->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return tern_err_set(err, TERN_EFORMAT, "%s: bad regex at offset %zu: %s", what, (size_t)eo, (char *)msg);
    }
    pcre2_jit_compile(p->re, PCRE2_JIT_COMPLETE); /* falls back to the interpreter if JIT is unavailable */
    return 0;
}

void tok_pattern_free(tok_pattern *p)
{
    free(p->lit);
    if (p->re)
        pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

int tok_pattern_find(const tok_pattern *p, const char *s, size_t n, size_t from, size_t *ms, size_t *me,
                     pcre2_match_data *md)
{
    if (from > n)
        return 0;
    if (!p->re) {
        if (p->lit_len == 0 || p->lit_len > n - from)
            return 0;
        const char *f = memmem(s + from, n - from, p->lit, p->lit_len);
        if (!f)
            return 0;
        *ms = (size_t)(f - s);
        *me = *ms + p->lit_len;
        return 1;
    }
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0)
        return TERN_EINTERNAL;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    *ms = ov[0];
    *me = ov[1];
    if (*me < *ms) /* \K tricks; treat as empty */
        *me = *ms;
    return 1;
}

/* ---- GPT-2 byte <-> char map ------------------------------------------- */
/* Printable bytes map to themselves; the other 68 to U+0100.. in order. */
const uint16_t tok_byte_to_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
    48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63,
    64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79,
    80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

static int16_t cp_inv[324];
static pthread_once_t cp_inv_once = PTHREAD_ONCE_INIT;

static void cp_inv_init(void)
{
    for (int i = 0; i < 324; i++)
        cp_inv[i] = -1;
    for (int b = 0; b < 256; b++)
        cp_inv[tok_byte_to_cp[b]] = (int16_t)b;
}

int tok_cp_to_byte(uint32_t cp)
{
    if (cp >= 324)
        return -1;
    pthread_once(&cp_inv_once, cp_inv_init);
    return cp_inv[cp];
}
