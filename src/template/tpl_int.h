/* Private header of the Jinja interpreter: arena, value type, tokens, AST,
 * and the shared error/unwind context. See README.md for the tour.
 *
 * Error handling inside the interpreter is by unwinding: tpl_fail() fills
 * the tern_err and longjmps to the public entry point (parse or render).
 * That is safe because every allocation made while parsing or rendering
 * comes from one arena that the entry point frees (or keeps) as a whole;
 * nothing on the unwound stack owns memory of its own. */
#ifndef TERN_TEMPLATE_TPL_INT_H
#define TERN_TEMPLATE_TPL_INT_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

/* ---- arena ------------------------------------------------------------- */

typedef struct tpl_block {
    struct tpl_block *next;
    size_t used, cap;
    max_align_t data[]; /* cap bytes */
} tpl_block;

typedef struct tpl_arena {
    tpl_block *head;
    size_t total; /* bytes reserved so far */
    size_t limit; /* 0 = no limit; past it tpl_alloc fails the render */
} tpl_arena;

void tpl_arena_free(tpl_arena *a);

/* ---- unwind context ------------------------------------------------------ */

typedef struct tpl_ctx {
    jmp_buf jb;
    tern_err *err;
    tpl_arena *arena;
    const char *src; /* normalized template source, for line/column */
    size_t src_len;
} tpl_ctx;

/* Fills c->err with "line L, column C: msg" (pos < 0: no position) and
 * unwinds to the entry point. */
_Noreturn void tpl_fail(tpl_ctx *c, int code, long pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Same, but the message is used verbatim (raise_exception). */
_Noreturn void tpl_fail_raw(tpl_ctx *c, int code, long pos, const char *msg);

/* Arena allocation; fails the render (TERN_EFULL) past the arena limit. */
void *tpl_alloc(tpl_ctx *c, size_t n);
void *tpl_zalloc(tpl_ctx *c, size_t n);

/* ---- values ------------------------------------------------------------- */

typedef enum tv_type {
    TV_UNDEF, /* Jinja Undefined: prints "", iterates empty, fails on use */
    TV_NONE,
    TV_BOOL,
    TV_INT,
    TV_FLOAT,
    TV_STR,
    TV_LIST,  /* list or tuple (flag), immutable once built */
    TV_DICT,  /* insertion-ordered mapping */
    TV_NS,    /* namespace(): the one mutable object */
    TV_FUNC,  /* builtin global or bound method */
    TV_MACRO, /* {% macro %} or a call block's caller */
    TV_LOOP,  /* the `loop` object of a for loop */
} tv_type;

typedef struct tstr {
    size_t len;   /* bytes, UTF-8 */
    char s[];     /* len bytes + NUL */
} tstr;

typedef struct tv {
    uint8_t t;
    union {
        int64_t i;          /* TV_INT, TV_BOOL */
        double f;           /* TV_FLOAT */
        tstr *s;            /* TV_STR */
        struct tlist *l;    /* TV_LIST */
        struct tdict *d;    /* TV_DICT, TV_NS */
        struct tfunc *fn;   /* TV_FUNC */
        struct tmacro *m;   /* TV_MACRO */
        struct tloop *lp;   /* TV_LOOP */
        const char *hint;   /* TV_UNDEF: error text when used, or NULL */
    } u;
} tv;

typedef struct tlist {
    size_t n;
    int tuple; /* prints as (a, b) */
    tv *items;
} tlist;

typedef struct tdict {
    size_t n, cap;
    tv *keys;
    tv *vals;
} tdict;

struct tpl_render;
typedef tv (*tfunc_impl)(struct tpl_render *r, struct tfunc *self, tv *args, int n_args,
                         tstr **kw_names, tv *kw_vals, int n_kw, long pos);

typedef struct tfunc {
    const char *name;
    tfunc_impl fn;
    tv self; /* bound object for methods, TV_UNDEF for globals */
} tfunc;

typedef struct tloop {
    tlist *items;
    size_t index0;
    int depth0;
} tloop;

struct tnode;
struct tframe;
typedef struct tmacro {
    const struct tnode *def; /* S_MACRO or S_CALL_BLOCK node */
    struct tframe *closure;
    tv caller;               /* TV_MACRO of a call block, or TV_UNDEF */
} tmacro;

static inline tv tv_undef(const char *hint) { tv v; v.t = TV_UNDEF; v.u.hint = hint; return v; }
static inline tv tv_none(void) { tv v; v.t = TV_NONE; v.u.i = 0; return v; }
static inline tv tv_bool(int b) { tv v; v.t = TV_BOOL; v.u.i = b != 0; return v; }
static inline tv tv_int(int64_t i) { tv v; v.t = TV_INT; v.u.i = i; return v; }
static inline tv tv_float(double f) { tv v; v.t = TV_FLOAT; v.u.f = f; return v; }
static inline tv tv_str(tstr *s) { tv v; v.t = TV_STR; v.u.s = s; return v; }
static inline tv tv_list(tlist *l) { tv v; v.t = TV_LIST; v.u.l = l; return v; }
static inline tv tv_dict(tdict *d) { tv v; v.t = TV_DICT; v.u.d = d; return v; }

/* Growable byte buffer in the arena (outputs, captures, string building). */
typedef struct tbuf {
    char *p;
    size_t len, cap;
    size_t limit; /* 0 = none; past it the render fails with TERN_EFULL */
} tbuf;

void tbuf_put(tpl_ctx *c, tbuf *b, const char *s, size_t n);
void tbuf_puts(tpl_ctx *c, tbuf *b, const char *s);
void tbuf_putc(tpl_ctx *c, tbuf *b, char ch);
tstr *tbuf_str(tpl_ctx *c, tbuf *b); /* copies into a tstr */

tstr *tstr_new(tpl_ctx *c, const char *s, size_t n);
tstr *tstr_cstr(tpl_ctx *c, const char *s);
tlist *tlist_new(tpl_ctx *c, size_t n);
tdict *tdict_new(tpl_ctx *c, size_t cap);
void tdict_set(tpl_ctx *c, tdict *d, tv key, tv val); /* replaces an equal key */
void tdict_append(tpl_ctx *c, tdict *d, tv key, tv val); /* key known to be new */
tv *tdict_get(tdict *d, tv key);                      /* NULL if absent */
tv *tdict_get_str(tdict *d, const char *key, size_t len);

int tv_truthy(tv v);
int tv_eq(tv a, tv b);                 /* Python == */
/* Python <, >; returns -1/0/1; fails the render on unorderable types. */
int tv_cmp(tpl_ctx *c, tv a, tv b, long pos);
const char *tv_type_name(tv v);        /* Python type name: "str", "dict" ... */
int tv_is_number(tv v);                /* int, float or bool */
double tv_num(tv v);

/* Python str() and repr() appended to b. */
void tv_str_to(tpl_ctx *c, tbuf *b, tv v);
void tv_repr_to(tpl_ctx *c, tbuf *b, tv v);
tstr *tv_to_tstr(tpl_ctx *c, tv v);   /* str(v); shares the string if v is one */
/* Python float repr ("1.0", "1e-05", "inf"). */
void tpl_float_repr(double f, char out[32]);

/* json.dumps(v, ensure_ascii, indent, separators, sort_keys).
 * indent: NULL = compact one-line form. */
typedef struct tjson_opts {
    const char *indent; /* NULL or the indent unit */
    const char *item_sep, *key_sep;
    int sort_keys;
    int ensure_ascii; /* escape non-ASCII as \\uXXXX */
} tjson_opts;
void tv_tojson_to(tpl_ctx *c, tbuf *b, tv v, const tjson_opts *o, long pos);

/* json-c object to a value (deep copy into the arena). */
struct json_object;
tv tv_from_json(tpl_ctx *c, struct json_object *o);

/* ---- UTF-8 / Python string helpers (tpl_str.c) --------------------------- */

/* Python str.isspace() of the code point at s (n bytes left); *clen gets its
 * byte length. Returns 1 when it is whitespace. */
int py_space_at(const char *s, size_t n, size_t *clen);
size_t utf8_len(const char *s, size_t n);            /* code points */
size_t utf8_offset(const char *s, size_t n, size_t cp); /* byte offset of cp-th */
int32_t utf8_decode(const char *s, size_t n, size_t *clen); /* -1 on bad byte */
void utf8_put(tpl_ctx *c, tbuf *b, int32_t cp);
int py_isprintable(int32_t cp);

/* ---- tokens and AST ---------------------------------------------------- */

enum tok_type {
    TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
};

/* Operator codes (TK_OP and binary/unary node ops). */
enum tok_op {
    OP_NONE, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
    OP_TILDE, OP_LBRACKET, OP_RBRACKET, OP_LPAREN, OP_RPAREN, OP_LBRACE,
    OP_RBRACE, OP_EQ, OP_NE, OP_GT, OP_GE, OP_LT, OP_LE, OP_ASSIGN, OP_DOT,
    OP_COLON, OP_PIPE, OP_COMMA, OP_SEMICOLON,
    /* node-only operators */
    OP_AND, OP_OR, OP_NOT, OP_IN, OP_NOTIN, OP_NEG, OP_POS,
};

typedef struct tok {
    uint8_t type;
    uint8_t op;   /* TK_OP */
    long pos;     /* byte offset in the normalized source */
    tstr *s;      /* TK_TEXT, TK_NAME, TK_STRING */
    int64_t i;    /* TK_INT */
    double f;     /* TK_FLOAT */
} tok;

typedef struct tok_array {
    tok *v;
    size_t n, cap;
} tok_array;

/* Tokenizes src (normalized: "\n" newlines, one trailing newline dropped)
 * with HF's settings: trim_blocks and lstrip_blocks on. Raw blocks become
 * TK_TEXT. */
void tpl_lex(tpl_ctx *c, const char *src, size_t len, tok_array *out);

enum node_kind {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_ATTR, N_ITEM, N_SLICE, N_CALL,
    N_FILTER, N_TEST, N_UNARY, N_BINOP, N_COMPARE, N_COND,
    /* statements */
    S_TEXT, S_OUTPUT, S_IF, S_FOR, S_SET, S_SET_BLOCK, S_MACRO, S_CALL_BLOCK,
    S_FILTER_BLOCK, S_BREAK, S_CONTINUE, S_WITH,
};

typedef struct tnode {
    uint8_t kind;
    uint8_t op;     /* N_UNARY/N_BINOP op; N_TEST negated; S_FOR recursive */
    long pos;
    tv val;         /* N_CONST */
    tstr *name;     /* N_NAME, N_ATTR, N_FILTER, N_TEST, S_MACRO, S_SET attr */
    struct tnode *a, *b, *c; /* children: object/left/cond, right/iter, else */
    struct tnode **list; int n;     /* items, positional args, body */
    struct tnode **list2; int n2;   /* kwarg values, dict values, else body */
    tstr **names; int n_names;      /* kwarg names, targets, params */
    uint8_t *ops;                   /* N_COMPARE: op per list item */
} tnode;

/* Parses tokens into a body; fails through c on syntax errors. */
typedef struct tpl_body {
    tnode **stmts;
    int n;
} tpl_body;
void tpl_parse(tpl_ctx *c, const tok_array *toks, tpl_body *out);

/* ---- evaluation ---------------------------------------------------------- */

typedef struct tframe {
    struct tframe *parent;
    tdict *vars;
} tframe;

typedef struct tpl_render {
    tpl_ctx c; /* first: a tpl_render* is a tpl_ctx* */
    tbuf *out;
    long steps, max_steps;
    int depth, max_depth;
    int eval_depth; /* nested tpl_eval calls */
    size_t max_output;
    int loop_ctl; /* 0, CTL_BREAK or CTL_CONTINUE */
    tframe *globals;
    long now; /* time for strftime_now, seconds since epoch */
} tpl_render;

enum { CTL_BREAK = 1, CTL_CONTINUE = 2 };

void tpl_exec_body(tpl_render *r, tnode **stmts, int n, tframe *f);
tv tpl_eval(tpl_render *r, const tnode *e, tframe *f);
void tpl_step(tpl_render *r, long pos);      /* counts one unit of work */
tv tpl_getattr(tpl_render *r, tv obj, const char *name, size_t len, long pos);
tv tpl_getitem(tpl_render *r, tv obj, tv key, long pos);
tv tpl_call(tpl_render *r, tv callee, tv *args, int n_args, tstr **kw_names, tv *kw_vals,
            int n_kw, tv caller, long pos);
/* Iterates a value as Jinja does (dict: keys, str: characters, undefined:
 * nothing); fails on non-iterables. */
tlist *tpl_iter(tpl_render *r, tv v, long pos);
_Noreturn void tpl_undefined_fail(tpl_render *r, tv v, long pos);

/* Filters, tests, methods, globals (tpl_filters.c, tpl_methods.c). */
tv tpl_filter(tpl_render *r, const char *name, tv v, tv *args, int n_args, tstr **kw_names,
              tv *kw_vals, int n_kw, long pos);
int tpl_test(tpl_render *r, const char *name, tv v, tv *args, int n_args, long pos);
/* Whether a filter/test name is known (the parser rejects unknown ones, as
 * jinja2 does at compile time). */
int tpl_filter_exists(const char *name);
int tpl_test_exists(const char *name);
/* Method lookup for str/dict/list objects: returns TV_FUNC or TV_UNDEF. */
tv tpl_method(tpl_render *r, tv obj, const char *name, size_t len);
void tpl_add_globals(tpl_render *r, tdict *g);
/* str % args (printf-style subset). */
tv tpl_percent_format(tpl_render *r, tstr *fmt, tv args, long pos);

/* Binds positional and keyword arguments to named parameters; missing ones
 * are TV_UNDEF (so defaults apply); unknown keywords fail. */
void tpl_bind_args(tpl_render *r, const char *what, const char *const *params, int n_params,
                   tv *args, int n_args, tstr **kw_names, tv *kw_vals, int n_kw, tv *out,
                   long pos);

/* Number of items of a clamped slice [lo, hi) by step (overflow-safe). */
static inline size_t slice_count(int64_t lo, int64_t hi, int64_t step)
{
    if (step > 0)
        return hi > lo ? (size_t)((uint64_t)(hi - lo - 1) / (uint64_t)step + 1) : 0;
    if (lo <= hi)
        return 0;
    uint64_t us = step == INT64_MIN ? (uint64_t)1 << 63 : (uint64_t)(-step);
    return (size_t)((uint64_t)(lo - hi - 1) / us + 1);
}

/* Python string operations used by filters and methods. */
tstr *py_strip(tpl_ctx *c, tstr *s, tv chars, int left, int right);
tstr *py_replace(tpl_ctx *c, tstr *s, tstr *old, tstr *new_, int64_t count);
tstr *py_case(tpl_ctx *c, tstr *s, int mode); /* 'u','l','t' (str.title),'c','j' (jinja title) */
tlist *py_split(tpl_ctx *c, tstr *s, tv sep, int64_t maxsplit, int from_right, long pos);
tlist *py_splitlines(tpl_ctx *c, tstr *s);
tstr *py_slice_str(tpl_ctx *c, tstr *s, int64_t start, int64_t stop, int64_t step, int has_start,
                   int has_stop);

#endif
