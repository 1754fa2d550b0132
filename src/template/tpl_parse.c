/* Recursive-descent parser: tokens to AST. The expression grammar and its
 * precedence follow jinja2's parser (lowest first):
 *   cond (a if c else b) > or > and > not > compare (== != < > <= >= in,
 *   not in) > + - > ~ > * / // % > ** > unary - + > primary with postfix
 *   (.attr [sub] (call)) and then filters (|f) and tests (is t).
 * Statements: if/elif/else, for (with else, if filter), set (plain, tuple,
 * namespace attribute, block), macro, call, filter, with, break, continue,
 * generation (HF's AssistantTracker block, rendered as its body). */
#include <string.h>

#include "tpl_int.h"

/* Nesting bound for expressions and blocks: deep enough for any real
 * template, shallow enough that recursion stays far from the stack limit. */
#define TPL_MAX_NEST 200

typedef struct parser {
    tpl_ctx *c;
    const tok *t;
    size_t n, i;
    int depth;
    int loops; /* enclosing for loops, for break/continue */
} parser;

static const tok *cur(parser *p) { return &p->t[p->i]; }
static const tok *peek(parser *p, size_t k) { return &p->t[p->i + k < p->n ? p->i + k : p->n - 1]; }
static void adv(parser *p)
{
    if (p->i + 1 < p->n)
        p->i++;
}

static int is_name(const tok *t, const char *w)
{
    return t->type == TK_NAME && t->s->len == strlen(w) && !memcmp(t->s->s, w, t->s->len);
}
static int is_op(const tok *t, int op) { return t->type == TK_OP && t->op == op; }

static const char *tok_desc(const tok *t)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_TEXT: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_NAME: return t->s->s;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: return "operator";
    }
}

_Noreturn static void unexpected(parser *p, const char *want)
{
    tpl_fail(p->c, TERN_EFORMAT, cur(p)->pos, "unexpected %s, expected %s", tok_desc(cur(p)), want);
}

static void expect_op(parser *p, int op, const char *what)
{
    if (!is_op(cur(p), op))
        unexpected(p, what);
    adv(p);
}

static tstr *expect_name(parser *p)
{
    if (cur(p)->type != TK_NAME)
        unexpected(p, "a name");
    tstr *s = cur(p)->s;
    adv(p);
    return s;
}

static void expect_block_end(parser *p)
{
    if (cur(p)->type != TK_BLOCK_END)
        unexpected(p, "'%}'");
    adv(p);
}

static tnode *mk(parser *p, int kind, long pos)
{
    tnode *n = tpl_zalloc(p->c, sizeof *n);
    n->kind = (uint8_t)kind;
    n->pos = pos;
    return n;
}

/* Growable node/name vectors in the arena. */
typedef struct nvec {
    tnode **v;
    int n, cap;
} nvec;

static void nvec_push(parser *p, nvec *v, tnode *x)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        tnode **nv = tpl_alloc(p->c, (size_t)cap * sizeof *nv);
        if (v->n)
            memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

typedef struct svec {
    tstr **v;
    int n, cap;
} svec;

static void svec_push(parser *p, svec *v, tstr *x)
{
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        tstr **nv = tpl_alloc(p->c, (size_t)cap * sizeof *nv);
        if (v->n)
            memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static void enter(parser *p)
{
    if (++p->depth > TPL_MAX_NEST)
        tpl_fail(p->c, TERN_ERANGE, cur(p)->pos, "template nested too deeply");
}
static void leave(parser *p) { p->depth--; }

/* ---- expressions ---------------------------------------------------------- */

static tnode *parse_expr(parser *p, int with_cond);
static tnode *parse_or(parser *p);
static tnode *parse_unary(parser *p, int with_filter);
static tnode *parse_tuple(parser *p, int with_cond, int explicit_parens, const char *extra_end);

static void parse_call_args(parser *p, tnode *n)
{
    expect_op(p, OP_LPAREN, "'('");
    nvec args = {0}, kwv = {0};
    svec kwn = {0};
    while (!is_op(cur(p), OP_RPAREN)) {
        if (args.n + kwv.n)
            expect_op(p, OP_COMMA, "','");
        if (is_op(cur(p), OP_RPAREN))
            break;
        if (is_op(cur(p), OP_MUL) || is_op(cur(p), OP_POW))
            tpl_fail(p->c, TERN_EUNSUPPORTED, cur(p)->pos, "*args and **kwargs in calls are not supported");
        if (cur(p)->type == TK_NAME && is_op(peek(p, 1), OP_ASSIGN)) {
            svec_push(p, &kwn, cur(p)->s);
            adv(p);
            adv(p);
            nvec_push(p, &kwv, parse_expr(p, 1));
        } else {
            if (kwv.n)
                tpl_fail(p->c, TERN_EFORMAT, cur(p)->pos, "positional argument follows keyword argument");
            nvec_push(p, &args, parse_expr(p, 1));
        }
    }
    adv(p);
    n->list = args.v;
    n->n = args.n;
    n->list2 = kwv.v;
    n->n2 = kwv.n;
    n->names = kwn.v;
    n->n_names = kwn.n;
}

static tnode *parse_filter(parser *p, tnode *operand)
{
    /* at the name after '|' */
    long pos = cur(p)->pos;
    tnode *n = mk(p, N_FILTER, pos);
    n->a = operand;
    n->name = expect_name(p);
    while (is_op(cur(p), OP_DOT)) { /* dotted filter names: keep the last part */
        adv(p);
        n->name = expect_name(p);
    }
    if (!tpl_filter_exists(n->name->s))
        tpl_fail(p->c, TERN_EFORMAT, pos, "no filter named '%s'", n->name->s);
    if (is_op(cur(p), OP_LPAREN))
        parse_call_args(p, n);
    return n;
}

static tnode *parse_primary(parser *p);
static tnode *parse_postfix(parser *p, tnode *node);

static tnode *parse_test(parser *p, tnode *operand)
{
    long pos = cur(p)->pos;
    adv(p); /* 'is' */
    tnode *n = mk(p, N_TEST, pos);
    n->a = operand;
    if (is_name(cur(p), "not")) {
        n->op = 1;
        adv(p);
    }
    n->name = expect_name(p);
    if (!tpl_test_exists(n->name->s))
        tpl_fail(p->c, TERN_EFORMAT, pos, "no test named '%s'", n->name->s);
    const tok *t = cur(p);
    if (is_op(t, OP_LPAREN)) {
        parse_call_args(p, n);
    } else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT ||
                is_op(t, OP_LPAREN) || is_op(t, OP_LBRACKET) || is_op(t, OP_LBRACE)) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and") && !is_name(t, "if")) {
        if (is_name(t, "is"))
            tpl_fail(p->c, TERN_EFORMAT, t->pos, "you cannot chain multiple tests with is");
        tnode *arg = parse_postfix(p, parse_primary(p));
        n->list = tpl_alloc(p->c, sizeof(tnode *));
        n->list[0] = arg;
        n->n = 1;
    }
    return n;
}

static tnode *parse_subscript(parser *p, tnode *obj, long pos)
{
    /* after '[' */
    tnode *parts[3] = {NULL, NULL, NULL};
    int is_slice = 0;
    if (!is_op(cur(p), OP_COLON))
        parts[0] = parse_expr(p, 1);
    if (is_op(cur(p), OP_COLON)) {
        is_slice = 1;
        adv(p);
        if (!is_op(cur(p), OP_RBRACKET) && !is_op(cur(p), OP_COLON))
            parts[1] = parse_expr(p, 1);
        if (is_op(cur(p), OP_COLON)) {
            adv(p);
            if (!is_op(cur(p), OP_RBRACKET))
                parts[2] = parse_expr(p, 1);
        }
    }
    expect_op(p, OP_RBRACKET, "']'");
    tnode *n;
    if (is_slice) {
        n = mk(p, N_SLICE, pos);
        n->list = tpl_alloc(p->c, 3 * sizeof(tnode *));
        memcpy(n->list, parts, sizeof parts);
        n->n = 3;
    } else {
        n = mk(p, N_ITEM, pos);
        n->b = parts[0];
    }
    n->a = obj;
    return n;
}

static tnode *parse_postfix(parser *p, tnode *node)
{
    for (;;) {
        const tok *t = cur(p);
        if (is_op(t, OP_DOT)) {
            adv(p);
            if (cur(p)->type == TK_NAME) {
                tnode *n = mk(p, N_ATTR, t->pos);
                n->a = node;
                n->name = cur(p)->s;
                adv(p);
                node = n;
            } else if (cur(p)->type == TK_INT) {
                tnode *n = mk(p, N_ITEM, t->pos);
                n->a = node;
                n->b = mk(p, N_CONST, cur(p)->pos);
                n->b->val = tv_int(cur(p)->i);
                adv(p);
                node = n;
            } else {
                unexpected(p, "an attribute name");
            }
        } else if (is_op(t, OP_LBRACKET)) {
            adv(p);
            node = parse_subscript(p, node, t->pos);
        } else if (is_op(t, OP_LPAREN)) {
            tnode *n = mk(p, N_CALL, node->pos);
            n->a = node;
            parse_call_args(p, n);
            node = n;
        } else {
            return node;
        }
    }
}

static tnode *parse_filter_expr(parser *p, tnode *node)
{
    for (;;) {
        if (is_op(cur(p), OP_PIPE)) {
            adv(p);
            node = parse_filter(p, node);
        } else if (is_name(cur(p), "is")) {
            node = parse_test(p, node);
        } else if (is_op(cur(p), OP_LPAREN)) {
            tnode *n = mk(p, N_CALL, cur(p)->pos);
            n->a = node;
            parse_call_args(p, n);
            node = n;
        } else {
            return node;
        }
    }
}

static tnode *parse_primary(parser *p)
{
    const tok *t = cur(p);
    tnode *n;
    enter(p);
    switch (t->type) {
    case TK_NAME:
        n = mk(p, N_CONST, t->pos);
        if (is_name(t, "true") || is_name(t, "True"))
            n->val = tv_bool(1);
        else if (is_name(t, "false") || is_name(t, "False"))
            n->val = tv_bool(0);
        else if (is_name(t, "none") || is_name(t, "None"))
            n->val = tv_none();
        else {
            n->kind = N_NAME;
            n->name = t->s;
        }
        adv(p);
        break;
    case TK_STRING: {
        n = mk(p, N_CONST, t->pos);
        tstr *s = t->s;
        adv(p);
        if (cur(p)->type == TK_STRING) { /* adjacent literals concatenate */
            tbuf b = {0};
            tbuf_put(p->c, &b, s->s, s->len);
            while (cur(p)->type == TK_STRING) {
                tbuf_put(p->c, &b, cur(p)->s->s, cur(p)->s->len);
                adv(p);
            }
            s = tbuf_str(p->c, &b);
        }
        n->val = tv_str(s);
        break;
    }
    case TK_INT:
        n = mk(p, N_CONST, t->pos);
        n->val = tv_int(t->i);
        adv(p);
        break;
    case TK_FLOAT:
        n = mk(p, N_CONST, t->pos);
        n->val = tv_float(t->f);
        adv(p);
        break;
    case TK_OP:
        if (t->op == OP_LPAREN) {
            adv(p);
            n = parse_tuple(p, 1, 1, NULL);
            expect_op(p, OP_RPAREN, "')'");
        } else if (t->op == OP_LBRACKET) {
            adv(p);
            nvec items = {0};
            while (!is_op(cur(p), OP_RBRACKET)) {
                if (items.n)
                    expect_op(p, OP_COMMA, "','");
                if (is_op(cur(p), OP_RBRACKET))
                    break;
                nvec_push(p, &items, parse_expr(p, 1));
            }
            adv(p);
            n = mk(p, N_LIST, t->pos);
            n->list = items.v;
            n->n = items.n;
        } else if (t->op == OP_LBRACE) {
            adv(p);
            nvec keys = {0}, vals = {0};
            while (!is_op(cur(p), OP_RBRACE)) {
                if (keys.n)
                    expect_op(p, OP_COMMA, "','");
                if (is_op(cur(p), OP_RBRACE))
                    break;
                nvec_push(p, &keys, parse_expr(p, 1));
                expect_op(p, OP_COLON, "':'");
                nvec_push(p, &vals, parse_expr(p, 1));
            }
            adv(p);
            n = mk(p, N_DICT, t->pos);
            n->list = keys.v;
            n->n = keys.n;
            n->list2 = vals.v;
            n->n2 = vals.n;
        } else {
            unexpected(p, "an expression");
        }
        break;
    default:
        unexpected(p, "an expression");
    }
    leave(p);
    return n;
}

static tnode *parse_unary(parser *p, int with_filter)
{
    const tok *t = cur(p);
    tnode *n;
    enter(p);
    if (is_op(t, OP_SUB) || is_op(t, OP_ADD)) {
        adv(p);
        n = mk(p, N_UNARY, t->pos);
        n->op = t->op == OP_SUB ? OP_NEG : OP_POS;
        n->a = parse_unary(p, 0);
    } else {
        n = parse_primary(p);
    }
    n = parse_postfix(p, n);
    if (with_filter)
        n = parse_filter_expr(p, n);
    leave(p);
    return n;
}

static tnode *binop(parser *p, int op, long pos, tnode *a, tnode *b)
{
    tnode *n = mk(p, N_BINOP, pos);
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static tnode *parse_pow(parser *p)
{
    tnode *l = parse_unary(p, 1);
    while (is_op(cur(p), OP_POW)) {
        long pos = cur(p)->pos;
        adv(p);
        l = binop(p, OP_POW, pos, l, parse_unary(p, 1));
    }
    return l;
}

static tnode *parse_math2(parser *p)
{
    tnode *l = parse_pow(p);
    while (is_op(cur(p), OP_MUL) || is_op(cur(p), OP_DIV) || is_op(cur(p), OP_FLOORDIV) ||
           is_op(cur(p), OP_MOD)) {
        int op = cur(p)->op;
        long pos = cur(p)->pos;
        adv(p);
        l = binop(p, op, pos, l, parse_pow(p));
    }
    return l;
}

static tnode *parse_concat(parser *p)
{
    tnode *l = parse_math2(p);
    while (is_op(cur(p), OP_TILDE)) {
        long pos = cur(p)->pos;
        adv(p);
        l = binop(p, OP_TILDE, pos, l, parse_math2(p));
    }
    return l;
}

static tnode *parse_math1(parser *p)
{
    tnode *l = parse_concat(p);
    while (is_op(cur(p), OP_ADD) || is_op(cur(p), OP_SUB)) {
        int op = cur(p)->op;
        long pos = cur(p)->pos;
        adv(p);
        l = binop(p, op, pos, l, parse_concat(p));
    }
    return l;
}

static tnode *parse_compare(parser *p)
{
    long pos = cur(p)->pos;
    tnode *first = parse_math1(p);
    nvec ops = {0};
    uint8_t opc[64];
    for (;;) {
        const tok *t = cur(p);
        int op = 0;
        if (t->type == TK_OP && (t->op == OP_EQ || t->op == OP_NE || t->op == OP_LT ||
                                 t->op == OP_LE || t->op == OP_GT || t->op == OP_GE)) {
            op = t->op;
            adv(p);
        } else if (is_name(t, "in")) {
            op = OP_IN;
            adv(p);
        } else if (is_name(t, "not") && is_name(peek(p, 1), "in")) {
            op = OP_NOTIN;
            adv(p);
            adv(p);
        } else {
            break;
        }
        if (ops.n >= (int)sizeof opc)
            tpl_fail(p->c, TERN_ERANGE, t->pos, "comparison chain too long");
        opc[ops.n] = (uint8_t)op;
        nvec_push(p, &ops, parse_math1(p));
    }
    if (!ops.n)
        return first;
    tnode *n = mk(p, N_COMPARE, pos);
    n->a = first;
    n->list = ops.v;
    n->n = ops.n;
    n->ops = tpl_alloc(p->c, (size_t)ops.n);
    memcpy(n->ops, opc, (size_t)ops.n);
    return n;
}

static tnode *parse_not(parser *p)
{
    if (is_name(cur(p), "not")) {
        long pos = cur(p)->pos;
        adv(p);
        enter(p);
        tnode *n = mk(p, N_UNARY, pos);
        n->op = OP_NOT;
        n->a = parse_not(p);
        leave(p);
        return n;
    }
    return parse_compare(p);
}

static tnode *parse_and(parser *p)
{
    tnode *l = parse_not(p);
    while (is_name(cur(p), "and")) {
        long pos = cur(p)->pos;
        adv(p);
        l = binop(p, OP_AND, pos, l, parse_not(p));
    }
    return l;
}

static tnode *parse_or(parser *p)
{
    tnode *l = parse_and(p);
    while (is_name(cur(p), "or")) {
        long pos = cur(p)->pos;
        adv(p);
        l = binop(p, OP_OR, pos, l, parse_and(p));
    }
    return l;
}

static tnode *parse_expr(parser *p, int with_cond)
{
    enter(p);
    tnode *e = parse_or(p);
    if (with_cond) {
        while (is_name(cur(p), "if")) {
            long pos = cur(p)->pos;
            adv(p);
            tnode *n = mk(p, N_COND, pos);
            n->b = e;
            n->a = parse_or(p);
            if (is_name(cur(p), "else")) {
                adv(p);
                n->c = parse_expr(p, 1);
            }
            e = n;
        }
    }
    leave(p);
    return e;
}

static int tuple_end(parser *p, const char *extra_end)
{
    const tok *t = cur(p);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF || is_op(t, OP_RPAREN))
        return 1;
    return extra_end && is_name(t, extra_end);
}

static tnode *parse_tuple(parser *p, int with_cond, int explicit_parens, const char *extra_end)
{
    long pos = cur(p)->pos;
    nvec items = {0};
    int saw_comma = 0;
    for (;;) {
        if (items.n) {
            if (!is_op(cur(p), OP_COMMA))
                break;
            adv(p);
            saw_comma = 1;
        }
        if (tuple_end(p, extra_end))
            break;
        nvec_push(p, &items, parse_expr(p, with_cond));
    }
    if (!saw_comma && items.n == 1)
        return items.v[0];
    if (!items.n && !explicit_parens)
        unexpected(p, "an expression");
    tnode *n = mk(p, N_TUPLE, pos);
    n->list = items.v;
    n->n = items.n;
    return n;
}

/* ---- statements ------------------------------------------------------------ */

static void parse_body(parser *p, const char *const *ends, nvec *out, int *which);

/* `name`, `name.attr` (namespace) or `a, b` targets. */
static void parse_targets(parser *p, svec *names, tstr **attr, int allow_attr, const char *stop)
{
    for (;;) {
        svec_push(p, names, expect_name(p));
        if (allow_attr && names->n == 1 && is_op(cur(p), OP_DOT)) {
            adv(p);
            *attr = expect_name(p);
            return;
        }
        if (!is_op(cur(p), OP_COMMA))
            return;
        adv(p);
        if (stop && is_name(cur(p), stop))
            return;
    }
}

static tnode *parse_if(parser *p, long pos)
{
    tnode *n = mk(p, S_IF, pos);
    n->a = parse_tuple(p, 1, 0, NULL);
    expect_block_end(p);
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    nvec body = {0};
    int which;
    parse_body(p, ends, &body, &which);
    n->list = body.v;
    n->n = body.n;
    if (which == 0) { /* elif: nested if in the else branch */
        tnode *e = parse_if(p, cur(p)->pos);
        n->list2 = tpl_alloc(p->c, sizeof(tnode *));
        n->list2[0] = e;
        n->n2 = 1;
        return n;
    }
    expect_block_end(p);
    if (which == 1) {
        static const char *const ends2[] = {"endif", NULL};
        nvec eb = {0};
        parse_body(p, ends2, &eb, &which);
        expect_block_end(p);
        n->list2 = eb.v;
        n->n2 = eb.n;
    }
    return n;
}

static tnode *parse_for(parser *p, long pos)
{
    tnode *n = mk(p, S_FOR, pos);
    svec names = {0};
    parse_targets(p, &names, NULL, 0, "in");
    n->names = names.v;
    n->n_names = names.n;
    if (!is_name(cur(p), "in"))
        unexpected(p, "'in'");
    adv(p);
    n->b = parse_tuple(p, 0, 0, "recursive");
    if (is_name(cur(p), "if")) {
        adv(p);
        n->a = parse_expr(p, 1);
    }
    if (is_name(cur(p), "recursive"))
        tpl_fail(p->c, TERN_EUNSUPPORTED, cur(p)->pos, "recursive for loops are not supported");
    expect_block_end(p);
    static const char *const ends[] = {"else", "endfor", NULL};
    nvec body = {0};
    int which;
    p->loops++;
    parse_body(p, ends, &body, &which);
    p->loops--;
    expect_block_end(p);
    n->list = body.v;
    n->n = body.n;
    if (which == 0) {
        static const char *const ends2[] = {"endfor", NULL};
        nvec eb = {0};
        parse_body(p, ends2, &eb, &which);
        expect_block_end(p);
        n->list2 = eb.v;
        n->n2 = eb.n;
    }
    return n;
}

/* Filter chain for {% filter %} and {% set x | f %}: innermost operand NULL. */
static tnode *parse_filter_chain(parser *p)
{
    tnode *f = parse_filter(p, NULL);
    while (is_op(cur(p), OP_PIPE)) {
        adv(p);
        f = parse_filter(p, f);
    }
    return f;
}

static tnode *parse_set(parser *p, long pos)
{
    svec names = {0};
    tstr *attr = NULL;
    parse_targets(p, &names, &attr, 1, NULL);
    tnode *n;
    if (is_op(cur(p), OP_ASSIGN)) {
        adv(p);
        n = mk(p, S_SET, pos);
        n->b = parse_tuple(p, 1, 0, NULL);
        expect_block_end(p);
    } else {
        if (names.n != 1)
            unexpected(p, "'='");
        n = mk(p, S_SET_BLOCK, pos);
        if (is_op(cur(p), OP_PIPE)) {
            adv(p);
            n->a = parse_filter_chain(p);
        }
        expect_block_end(p);
        static const char *const ends[] = {"endset", NULL};
        nvec body = {0};
        int which;
        parse_body(p, ends, &body, &which);
        expect_block_end(p);
        n->list = body.v;
        n->n = body.n;
    }
    n->names = names.v;
    n->n_names = names.n;
    n->name = attr;
    return n;
}

/* "(a, b=default, ...)" parameter list of macro and call blocks. */
static void parse_params(parser *p, tnode *n)
{
    svec names = {0};
    nvec defs = {0};
    expect_op(p, OP_LPAREN, "'('");
    while (!is_op(cur(p), OP_RPAREN)) {
        if (names.n)
            expect_op(p, OP_COMMA, "','");
        if (is_op(cur(p), OP_RPAREN))
            break;
        svec_push(p, &names, expect_name(p));
        if (is_op(cur(p), OP_ASSIGN)) {
            adv(p);
            nvec_push(p, &defs, parse_expr(p, 1));
        } else {
            if (defs.n && defs.v[defs.n - 1])
                tpl_fail(p->c, TERN_EFORMAT, cur(p)->pos, "non-default argument follows default argument");
            nvec_push(p, &defs, NULL);
        }
    }
    adv(p);
    n->names = names.v;
    n->n_names = names.n;
    n->list2 = defs.v;
    n->n2 = defs.n;
}

static tnode *parse_macro(parser *p, long pos)
{
    tnode *n = mk(p, S_MACRO, pos);
    n->name = expect_name(p);
    parse_params(p, n);
    expect_block_end(p);
    static const char *const ends[] = {"endmacro", NULL};
    nvec body = {0};
    int which, loops = p->loops;
    p->loops = 0;
    parse_body(p, ends, &body, &which);
    p->loops = loops;
    if (cur(p)->type == TK_NAME) /* {% endmacro name %} */
        adv(p);
    expect_block_end(p);
    n->list = body.v;
    n->n = body.n;
    return n;
}

static tnode *parse_call_block(parser *p, long pos)
{
    tnode *n = mk(p, S_CALL_BLOCK, pos);
    if (is_op(cur(p), OP_LPAREN))
        parse_params(p, n);
    n->a = parse_expr(p, 1);
    if (n->a->kind != N_CALL)
        tpl_fail(p->c, TERN_EFORMAT, pos, "expected call");
    expect_block_end(p);
    static const char *const ends[] = {"endcall", NULL};
    nvec body = {0};
    int which;
    parse_body(p, ends, &body, &which);
    expect_block_end(p);
    n->list = body.v;
    n->n = body.n;
    return n;
}

static tnode *parse_with(parser *p, long pos)
{
    tnode *n = mk(p, S_WITH, pos);
    svec names = {0};
    nvec vals = {0};
    while (cur(p)->type != TK_BLOCK_END) {
        if (names.n)
            expect_op(p, OP_COMMA, "','");
        svec_push(p, &names, expect_name(p));
        expect_op(p, OP_ASSIGN, "'='");
        nvec_push(p, &vals, parse_expr(p, 1));
    }
    adv(p);
    static const char *const ends[] = {"endwith", NULL};
    nvec body = {0};
    int which;
    parse_body(p, ends, &body, &which);
    expect_block_end(p);
    n->names = names.v;
    n->n_names = names.n;
    n->list2 = vals.v;
    n->n2 = vals.n;
    n->list = body.v;
    n->n = body.n;
    return n;
}

/* Parses one {% ... %} statement (at the name after '{%'). Returns NULL for
 * statements that render as their body (generation), appending it. */
static tnode *parse_stmt(parser *p, nvec *out)
{
    const tok *t = cur(p);
    long pos = t->pos;
    if (t->type != TK_NAME)
        unexpected(p, "a statement name");
    adv(p);
    tnode *n = NULL;
    enter(p);
    if (is_name(t, "if"))
        n = parse_if(p, pos);
    else if (is_name(t, "for"))
        n = parse_for(p, pos);
    else if (is_name(t, "set"))
        n = parse_set(p, pos);
    else if (is_name(t, "macro"))
        n = parse_macro(p, pos);
    else if (is_name(t, "call"))
        n = parse_call_block(p, pos);
    else if (is_name(t, "with"))
        n = parse_with(p, pos);
    else if (is_name(t, "filter")) {
        n = mk(p, S_FILTER_BLOCK, pos);
        n->a = parse_filter_chain(p);
        expect_block_end(p);
        static const char *const ends[] = {"endfilter", NULL};
        nvec body = {0};
        int which;
        parse_body(p, ends, &body, &which);
        expect_block_end(p);
        n->list = body.v;
        n->n = body.n;
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        if (!p->loops)
            tpl_fail(p->c, TERN_EFORMAT, pos, "'%s' outside of a loop", t->s->s);
        n = mk(p, is_name(t, "break") ? S_BREAK : S_CONTINUE, pos);
        expect_block_end(p);
    } else if (is_name(t, "generation")) {
        expect_block_end(p);
        static const char *const ends[] = {"endgeneration", NULL};
        int which;
        parse_body(p, ends, out, &which);
        expect_block_end(p);
    } else if (is_name(t, "include") || is_name(t, "extends") || is_name(t, "import") ||
               is_name(t, "from") || is_name(t, "block")) {
        tpl_fail(p->c, TERN_EUNSUPPORTED, pos, "'%s' is not supported in chat templates", t->s->s);
    } else {
        tpl_fail(p->c, TERN_EFORMAT, pos, "encountered unknown tag '%s'", t->s->s);
    }
    leave(p);
    return n;
}

/* Parses statements until a block tag named in ends (NULL-terminated; NULL
 * ends = until end of template). On return the parser is just past that
 * name and *which is its index. */
static void parse_body(parser *p, const char *const *ends, nvec *out, int *which)
{
    for (;;) {
        const tok *t = cur(p);
        if (t->type == TK_EOF) {
            if (!ends) {
                *which = -1;
                return;
            }
        {
            int k = 0;
            while (ends[k + 1])
                k++;
            tpl_fail(p->c, TERN_EFORMAT, t->pos, "unexpected end of template, expected '%s'", ends[k]);
        }
        }
        if (t->type == TK_TEXT) {
            tnode *n = mk(p, S_TEXT, t->pos);
            n->val = tv_str(t->s);
            nvec_push(p, out, n);
            adv(p);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(p);
            tnode *n = mk(p, S_OUTPUT, t->pos);
            n->a = parse_tuple(p, 1, 0, NULL);
            if (cur(p)->type != TK_VAR_END)
                unexpected(p, "'}}'");
            adv(p);
            nvec_push(p, out, n);
        } else if (t->type == TK_BLOCK_BEGIN) {
            adv(p);
            const tok *nt = cur(p);
            if (ends && nt->type == TK_NAME)
                for (int k = 0; ends[k]; k++)
                    if (is_name(nt, ends[k])) {
                        adv(p);
                        *which = k;
                        return;
                    }
            if (nt->type == TK_NAME &&
                (is_name(nt, "endif") || is_name(nt, "endfor") || is_name(nt, "else") ||
                 is_name(nt, "elif") || is_name(nt, "endset") || is_name(nt, "endmacro") ||
                 is_name(nt, "endcall") || is_name(nt, "endfilter") || is_name(nt, "endwith") ||
                 is_name(nt, "endgeneration")))
                tpl_fail(p->c, TERN_EFORMAT, nt->pos, "unexpected '%s'", nt->s->s);
            tnode *n = parse_stmt(p, out);
            if (n)
                nvec_push(p, out, n);
        } else {
            unexpected(p, "template data or a tag");
        }
    }
}

void tpl_parse(tpl_ctx *c, const tok_array *toks, tpl_body *out)
{
    parser p = {c, toks->v, toks->n, 0, 0, 0};
    nvec body = {0};
    int which;
    parse_body(&p, NULL, &body, &which);
    out->stmts = body.v;
    out->n = body.n;
}
