/* JSON-Schema-Test-Suite through the schema front end and the grammar core.
 * For every test: the schema compiles, or is rejected as unsupported with
 * a message; a compiled schema's grammar accepts the instance's canonical
 * JSON text (Python json.dumps) exactly when `valid` is true. Fails on any
 * wrongly accepted instance, on a generated grammar the core rejects, or
 * when passes drop below the floors below. Semantics: JSON Schema's own
 * (strict = 0), formats enforced (tern's choice, docs/json-schema.md).
 * A schema that no value satisfies is rejected at compile time (TERN_EINVAL
 * "no JSON value satisfies"): its instances count as rejected.
 * TERN_JSTS_DUMP=FILE also writes every group's grammar and instances as
 * JSON lines (tests/grammar/jsts_xgrammar.cjs replays them in xgrammar). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/schema.h"

/* Floors: measured passes minus a small margin (see docs/json-schema.md
 * for the measured figures). Raise them when support grows. */
static const struct { const char *set; int floor; } k_floors[] = {
    {"draft2020-12/required", 1086}, {"draft7/required", 865},
    {"draft2020-12/optional", 725}, {"draft7/optional", 595},
};
#define N_SETS 4

typedef struct tally { int pass, wrong_accept, wrong_reject, unsupported, total; } tally;

static int set_index(const char *s)
{
    for (int i = 0; i < N_SETS; i++)
        if (!strcmp(s, k_floors[i].set))
            return i;
    return -1;
}

static void test_jsts(void **state)
{
    (void)state;
    const char *shared = getenv("TERN_SHARED");
    if (!shared)
        shared = "../shared";
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 tests/grammar/jsts_prep.py '%s/data/json-schema-test-suite/tests'",
             shared);
    FILE *in = popen(cmd, "r");
    assert_non_null(in);
    const char *dump_path = getenv("TERN_JSTS_DUMP");
    FILE *dump = dump_path ? fopen(dump_path, "w") : NULL;
    tally t[N_SETS];
    memset(t, 0, sizeof t);
    int n_core_err = 0, n_groups = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, in)) > 0) {
        json_object *g = json_tokener_parse(line);
        assert_non_null(g);
        n_groups++;
        int si = set_index(json_object_get_string(json_object_object_get(g, "set")));
        assert_true(si >= 0);
        json_object *tests = json_object_object_get(g, "tests");
        size_t n = json_object_array_length(tests);
        t[si].total += (int)n;
        grammar_schema_opts o;
        grammar_schema_opts_init(&o);
        o.strict = 0;
        o.draft = json_object_get_int(json_object_object_get(g, "draft"));
        char *ebnf = NULL;
        tern_err err;
        int rc = grammar_schema_to_ebnf(json_object_object_get(g, "schema"), &o, &ebnf, &err);
        const char *file = json_object_get_string(json_object_object_get(g, "file"));
        int gi = json_object_get_int(json_object_object_get(g, "group"));
        if (rc) {
            assert_true(err.msg[0] != 0); /* rejected with a message */
            if (getenv("TERN_JSTS_VERBOSE"))
                printf("unsupported %s #%d (%zu tests): %s\n", file, gi, n, err.msg);
            int unsat = rc == TERN_EINVAL && strstr(err.msg, "no JSON value satisfies");
            for (size_t i = 0; i < n; i++) {
                int valid = json_object_get_boolean(
                    json_object_object_get(json_object_array_get_idx(tests, i), "valid"));
                if (!unsat)
                    t[si].unsupported++;
                else if (valid)
                    t[si].wrong_reject++;
                else
                    t[si].pass++;
            }
            json_object_put(g);
            continue;
        }
        grammar *gr = grammar_from_ebnf(ebnf, strlen(ebnf), "root", NULL, &err);
        if (!gr) {
            printf("CORE REJECTED GRAMMAR %s #%d: %s\n", file, gi, err.msg);
            n_core_err++;
        }
        json_object *res = dump ? json_object_new_array() : NULL;
        for (size_t i = 0; gr && i < n; i++) {
            json_object *ti = json_object_array_get_idx(tests, i);
            const char *text = json_object_get_string(json_object_object_get(ti, "text"));
            int valid = json_object_get_boolean(json_object_object_get(ti, "valid"));
            int acc = grammar_check_text(gr, text, strlen(text));
            if (acc < 0) {
                t[si].unsupported++;
                continue;
            }
            if (res)
                json_object_array_add(res, json_object_new_boolean(acc));
            if (acc == valid) {
                t[si].pass++;
            } else if (acc) {
                t[si].wrong_accept++;
                printf("WRONGLY ACCEPTED %s #%d (%s): %s\n", file, gi,
                       json_object_get_string(json_object_object_get(ti, "desc")), text);
            } else {
                t[si].wrong_reject++;
                if (getenv("TERN_JSTS_VERBOSE"))
                    printf("wrongly rejected %s #%d (%s): %s\n", file, gi,
                           json_object_get_string(json_object_object_get(ti, "desc")), text);
            }
        }
        if (dump) {
            json_object_object_add(g, "ebnf", json_object_new_string(ebnf));
            json_object_object_add(g, "tern_accepts", res ? res : json_object_new_array());
            fprintf(dump, "%s\n", json_object_to_json_string_ext(g, JSON_C_TO_STRING_PLAIN));
        }
        grammar_free(gr);
        free(ebnf);
        json_object_put(g);
    }
    free(line);
    assert_int_equal(pclose(in), 0);
    if (dump)
        fclose(dump);
    printf("%-24s %6s %6s %8s %8s %8s\n", "set", "total", "passed", "wr.acc", "wr.rej", "unsupp");
    int bad = 0;
    for (int i = 0; i < N_SETS; i++) {
        printf("%-24s %6d %6d %8d %8d %8d  (floor %d)\n", k_floors[i].set, t[i].total, t[i].pass,
               t[i].wrong_accept, t[i].wrong_reject, t[i].unsupported, k_floors[i].floor);
        bad |= t[i].wrong_accept > 0 || t[i].pass < k_floors[i].floor;
    }
    assert_true(n_groups > 500);
    assert_int_equal(n_core_err, 0);
    assert_false(bad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_jsts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
