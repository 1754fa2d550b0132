/* Fast path for the two big members of tokenizer.json, model.vocab (an
 * object of "token": id) and model.merges (an array of "a b" strings or
 * [a, b] pairs): they hold hundreds of thousands of entries, and building
 * json-c objects for them dominated load time. tok_fast_scan finds them,
 * decodes them straight into flat lists, then blanks them out of the buffer
 * ({} / []) so json-c parses only the small remainder. Anything unexpected
 * makes it decline (return 0 with nothing taken), and the json-c path then
 * reads the file as before and reports errors itself. */
#include <stdlib.h>
#include <string.h>

#include "tok_fast.h"

static size_t ws(const char *b, size_t n, size_t i)
{
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r'))
        i++;
    return i;
}

/* Skips a string starting at b[i] == '"'; returns the index after it or 0. */
static size_t skip_string(const char *b, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        if (b[i] == '\\')
            i++;
        else if (b[i] == '"')
            return i + 1;
    }
    return 0;
}

/* Skips any value; returns the index after it, or 0 on malformed input. */
static size_t skip_value(const char *b, size_t n, size_t i)
{
    if (i >= n)
        return 0;
    if (b[i] == '"')
        return skip_string(b, n, i);
    if (b[i] == '{' || b[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            char c = b[i];
            if (c == '"') {
                size_t e = skip_string(b, n, i);
                if (!e)
                    return 0;
                i = e - 1;
            } else if (c == '{' || c == '[') {
                depth++;
            } else if (c == '}' || c == ']') {
                if (--depth == 0)
                    return i + 1;
            }
        }
        return 0;
    }
    while (i < n && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\t' &&
           b[i] != '\r')
        i++;
    return i;
}

static int hex4(const char *s, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v * 16 + (uint32_t)d;
    }
    return 0;
}

/* Decodes the string at b[i] == '"' into out (NUL-terminated); returns the
 * index after it or 0. *len gets the decoded length. */
static size_t read_string(const char *b, size_t n, size_t i, tok_buf *out, uint32_t *len)
{
    size_t start = out->len;
    i++;
    while (i < n) {
        size_t run = i;
        while (i < n && b[i] != '"' && b[i] != '\\' && (unsigned char)b[i] >= 0x20)
            i++;
        if (i > run && tok_buf_add(out, b + run, i - run))
            return 0;
        if (i >= n || (unsigned char)b[i] < 0x20)
            return 0;
        if (b[i] == '"') {
            *len = (uint32_t)(out->len - start);
            return tok_buf_addc(out, 0) ? 0 : i + 1;
        }
        if (i + 1 >= n)
            return 0;
        char e = b[i + 1], c;
        i += 2;
        switch (e) {
        case '"': c = '"'; break;
        case '\\': c = '\\'; break;
        case '/': c = '/'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'n': c = '\n'; break;
        case 'r': c = '\r'; break;
        case 't': c = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (i + 4 > n || hex4(b + i, &cp))
                return 0;
            i += 4;
            if (cp >= 0xD800 && cp < 0xDC00) {
                if (i + 6 > n || b[i] != '\\' || b[i + 1] != 'u' || hex4(b + i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return 0;
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp < 0xE000) {
                return 0;
            }
            char u[4];
            if (tok_buf_add(out, u, (size_t)tok_utf8_enc(cp, u)))
                return 0;
            continue;
        }
        default:
            return 0;
        }
        if (tok_buf_addc(out, c))
            return 0;
    }
    return 0;
}

static int vlist_push(tok_vlist *l, size_t off, uint32_t len, int32_t id)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        tok_vent *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (tok_vent){off, len, id};
    return 0;
}

static int mlist_push(tok_mlist *l, size_t a, uint32_t al, size_t b, uint32_t bl)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 1024;
        tok_ment *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (tok_ment){a, al, b, bl};
    return 0;
}

void tok_vlist_free(tok_vlist *l)
{
    free(l->v);
    tok_buf_free(&l->text);
    memset(l, 0, sizeof *l);
}

void tok_mlist_free(tok_mlist *l)
{
    free(l->v);
    tok_buf_free(&l->text);
    memset(l, 0, sizeof *l);
}

/* {"tok": id, ...} at b[i]; returns the index after it or 0. */
static size_t parse_vocab(const char *b, size_t n, size_t i, tok_vlist *out)
{
    i = ws(b, n, i + 1);
    if (i < n && b[i] == '}')
        return i + 1;
    for (;;) {
        if (i >= n || b[i] != '"')
            return 0;
        size_t off = out->text.len;
        uint32_t len;
        if (!(i = read_string(b, n, i, &out->text, &len)))
            return 0;
        i = ws(b, n, i);
        if (i >= n || b[i] != ':')
            return 0;
        i = ws(b, n, i + 1);
        int64_t id = 0;
        size_t d = i;
        while (i < n && b[i] >= '0' && b[i] <= '9' && id < (1 << 24))
            id = id * 10 + (b[i++] - '0');
        if (i == d || id >= (1 << 24) || vlist_push(out, off, len, (int32_t)id))
            return 0;
        i = ws(b, n, i);
        if (i < n && b[i] == ',') {
            i = ws(b, n, i + 1);
            continue;
        }
        return i < n && b[i] == '}' ? i + 1 : 0;
    }
}

/* ["a b", ...] or [["a", "b"], ...] at b[i]. */
static size_t parse_merges(const char *b, size_t n, size_t i, tok_mlist *out)
{
    i = ws(b, n, i + 1);
    if (i < n && b[i] == ']')
        return i + 1;
    for (;;) {
        if (i >= n)
            return 0;
        size_t a = out->text.len, c;
        uint32_t al, cl;
        if (b[i] == '"') {
            uint32_t len;
            if (!(i = read_string(b, n, i, &out->text, &len)))
                return 0;
            const char *s = out->text.p + a;
            const char *sp = memchr(s, ' ', len);
            if (!sp)
                return 0;
            al = (uint32_t)(sp - s);
            c = a + al + 1;
            cl = len - al - 1;
        } else if (b[i] == '[') {
            i = ws(b, n, i + 1);
            if (i >= n || b[i] != '"' || !(i = read_string(b, n, i, &out->text, &al)))
                return 0;
            i = ws(b, n, i);
            if (i >= n || b[i] != ',')
                return 0;
            i = ws(b, n, i + 1);
            c = out->text.len;
            if (i >= n || b[i] != '"' || !(i = read_string(b, n, i, &out->text, &cl)))
                return 0;
            i = ws(b, n, i);
            if (i >= n || b[i] != ']')
                return 0;
            i++;
        } else {
            return 0;
        }
        if (mlist_push(out, a, al, c, cl))
            return 0;
        i = ws(b, n, i);
        if (i < n && b[i] == ',') {
            i = ws(b, n, i + 1);
            continue;
        }
        return i < n && b[i] == ']' ? i + 1 : 0;
    }
}

/* Calls fn on each member of the object at b[i]; stops early on nonzero. */
static int key_is(const char *b, size_t ks, size_t ke, const char *k)
{
    size_t kl = strlen(k);
    return ke - ks == kl + 2 && !memcmp(b + ks + 1, k, kl);
}

/* Parses the members of the model object at b[i] == '{', taking vocab and
 * merges; returns the index after the object or 0. */
static size_t scan_model(const char *b, size_t n, size_t i, tok_vlist *vocab, tok_mlist *merges, size_t span[4])
{
    i = ws(b, n, i + 1);
    while (i < n && b[i] == '"') {
        size_t ke = skip_string(b, n, i);
        if (!ke)
            return 0;
        size_t v = ws(b, n, ke);
        if (v >= n || b[v] != ':')
            return 0;
        v = ws(b, n, v + 1);
        size_t ve;
        if (key_is(b, i, ke, "vocab") && v < n && b[v] == '{' && !span[1]) {
            ve = parse_vocab(b, n, v, vocab);
            span[0] = v;
            span[1] = ve;
        } else if (key_is(b, i, ke, "merges") && v < n && b[v] == '[' && !span[3]) {
            ve = parse_merges(b, n, v, merges);
            span[2] = v;
            span[3] = ve;
        } else {
            ve = skip_value(b, n, v);
        }
        if (!ve)
            return 0;
        i = ws(b, n, ve);
        if (i < n && b[i] == ',')
            i = ws(b, n, i + 1);
    }
    return i < n && b[i] == '}' ? i + 1 : 0;
}

int tok_fast_scan(char *b, size_t *np, tok_vlist *vocab, tok_mlist *merges)
{
    size_t n = *np;
    size_t i = ws(b, n, 0);
    if (i >= n || b[i] != '{')
        return 0;
    i = ws(b, n, i + 1);
    size_t span[4] = {0, 0, 0, 0};
    int seen_model = 0;
    while (i < n && b[i] == '"') {
        size_t ke = skip_string(b, n, i);
        if (!ke)
            goto decline;
        size_t v = ws(b, n, ke);
        if (v >= n || b[v] != ':')
            goto decline;
        v = ws(b, n, v + 1);
        size_t ve;
        if (key_is(b, i, ke, "model") && v < n && b[v] == '{' && !seen_model) {
            seen_model = 1;
            ve = scan_model(b, n, v, vocab, merges, span);
        } else {
            ve = skip_value(b, n, v);
        }
        if (!ve)
            goto decline;
        i = ws(b, n, ve);
        if (i < n && b[i] == ',')
            i = ws(b, n, i + 1);
    }
    if (!span[1])
        goto decline;
    /* cut both values out (in file order), leaving {} and [] */
    size_t cut[2][2] = {{span[0], span[1]}, {span[2], span[3]}};
    char open[2] = {'{', '['}, close[2] = {'}', ']'};
    int order[2] = {0, 1};
    if (span[3] && span[2] < span[0]) {
        order[0] = 1;
        order[1] = 0;
    }
    size_t w = 0, r = 0;
    for (int k = 0; k < 2; k++) {
        int c = order[k];
        if (!cut[c][1])
            continue;
        size_t a = cut[c][0], e = cut[c][1];
        memmove(b + w, b + r, a - r);
        w += a - r;
        b[w++] = open[c];
        b[w++] = close[c];
        r = e;
    }
    memmove(b + w, b + r, n - r);
    w += n - r;
    b[w] = 0;
    *np = w;
    return span[3] ? 3 : 1;
decline:
    tok_vlist_free(vocab);
    tok_mlist_free(merges);
    return 0;
}
