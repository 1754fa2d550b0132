/* Fuzz entry point of the tool-call grammar (src/server/toolcall.c): the
 * input is a chat request body; when it parses with tools, the calls'
 * grammar is built for every format (all tools, one named tool, with and
 * without parallel calls, with an alternative answer grammar) and must be
 * EBNF the grammar core parses - a syntax error there means the rule
 * renaming or the literal escaping broke. A tool whose schema does not
 * compile must be a 400 naming a tool. Never a crash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "server/api.h"
#include "server/toolcall.h"
#include "server/toolfmt.h"

static void check(const toolfmt *f, json_object *tools, const char *only, int parallel, size_t skip, const char *alt)
{
    char *ebnf = NULL;
    api_error e;
    memset(&e, 0, sizeof e);
    if (toolcall_grammar(f, tools, only, parallel, skip, alt, &ebnf, &e)) {
        if (e.status != 400 || strncmp(e.param, "tools[", 6) != 0)
            abort();
        return;
    }
    grammar_limits lim;
    grammar_limits_init(&lim);
    lim.max_states = 200000; /* the fuzzer's budget, not a product bound */
    tern_err err;
    grammar *g = grammar_from_ebnf(ebnf, strlen(ebnf), NULL, &lim, &err);
    if (!g && err.code == TERN_EFORMAT)
        abort();
    grammar_free(g);
    free(ebnf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    api_request r;
    api_error e;
    api_limits lim = {.n_vocab = 8192, .model_name = NULL};
    if (api_parse(&r, API_CHAT, (const char *)data, size, &lim, &e))
        return 0;
    if (r.tools) {
        const char *alt = "root ::= \"{\" [a-z]* \"}\"";
        const char *first = api_tool_name(json_object_array_get_idx(r.tools, 0));
        for (int k = 1; k < TOOLFMT_N; k++) {
            const toolfmt *f = toolfmt_get((toolfmt_kind)k);
            check(f, r.tools, NULL, 1, 0, NULL);
            check(f, r.tools, first, 0, strlen(f->begin) / 2, alt);
        }
    }
    api_request_free(&r);
    return 0;
}
