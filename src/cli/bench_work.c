/* tern bench's workload: the conversation every cell sends (a shared system
 * prompt, the part a warm prefix cache holds, and rotating questions), the
 * three output constraints, and the checks that every constrained output
 * really obeys its constraint - done with json-c and PCRE2, not with the
 * grammar engine under test. Also the percentile and memory helpers. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <json-c/json.h>
#include <pcre2.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/json.h"
#include "bench.h"
#include "grammar/frontend.h"
#include "grammar/regex.h"
#include "grammar/schema.h"

static const char *const FEATURE_NAMES[BENCH_N_FEATURES] = {"plain", "json_schema", "regex", "choice"};
static const char *const SPEC_NAMES[BENCH_N_SPECS] = {"none", "draft", "ngram"};

const char *bench_feature_name(bench_feature f)
{
    return f >= 0 && f < BENCH_N_FEATURES ? FEATURE_NAMES[f] : "?";
}

const char *bench_spec_name(bench_spec s)
{
    return s >= 0 && s < BENCH_N_SPECS ? SPEC_NAMES[s] : "?";
}

int bench_feature_parse(const char *s, size_t len)
{
    for (int f = 0; f < BENCH_N_FEATURES; f++)
        if (strlen(FEATURE_NAMES[f]) == len && !strncmp(s, FEATURE_NAMES[f], len))
            return f;
    if (len == 4 && !strncmp(s, "json", 4))
        return BENCH_JSON;
    return -1;
}

/* Long enough (about 150 tokens) that a cached prefix is a visible share
 * of every prompt, as a real system prompt is. */
static const char *const SYSTEM_PROMPT =
    "You are a concise assistant for a travel agency. You answer questions about cities, weather, dates and "
    "travel plans. Keep every answer short and factual. When the user asks for JSON, answer with one JSON "
    "object and nothing else. When the user asks for a date, answer with the city name, a comma and the date "
    "in the form YYYY-MM-DD. When the user asks about the weather, answer with one word: sunny, cloudy, rainy "
    "or snowy. Never apologise, never add greetings, and never repeat the question. If you are not sure, give "
    "your best guess in the same form. The agency's customers read your answers on small screens, so brevity "
    "matters more than style.";

static const char *const MESSAGES[] = {
    "Tell me about Lisbon: its name, its population and whether it is sunny today.",
    "Describe Oslo in one object: city, population, sunny.",
    "What is the weather like in Madrid in July, and when is the next public holiday there?",
    "Repeat this text exactly: The river ran quietly past the mill, and the wheel turned slowly in the light.",
    "Give me the city of Kyoto with its population and whether it is sunny.",
    "When does the spring festival start in Vienna this year? Name the city and the date.",
    "Is it usually rainy in Bergen in October? Answer about the city and its weather.",
    "Repeat this text exactly: {\"city\": \"Porto\", \"population\": 231000, \"sunny\": true}",
};

const char *bench_system_prompt(void)
{
    return SYSTEM_PROMPT;
}

int bench_n_messages(void)
{
    return (int)(sizeof MESSAGES / sizeof MESSAGES[0]);
}

const char *bench_message(int i)
{
    return MESSAGES[i % bench_n_messages()];
}

/* Every string and number is bounded so that an output always completes
 * well inside 64 tokens: a truncated object would be a failed request. */
static const char *const JSON_SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
    "\"population\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9999999},\"sunny\":{\"type\":\"boolean\"}},"
    "\"required\":[\"city\",\"population\",\"sunny\"],\"additionalProperties\":false}";
static const char *const REGEX = "[A-Z][a-z]{2,11}, [0-9]{4}-[0-9]{2}-[0-9]{2}";
static const char *const CHOICES = "[\"sunny\",\"cloudy\",\"rainy\",\"snowy\"]";

const char *bench_feature_spec(bench_feature f)
{
    switch (f) {
    case BENCH_JSON:
        return JSON_SCHEMA;
    case BENCH_REGEX:
        return REGEX;
    case BENCH_CHOICE:
        return CHOICES;
    default:
        return NULL;
    }
}

int bench_feature_ebnf(void *user, char **ebnf_out, tern_err *err)
{
    bench_feature f = (bench_feature)(intptr_t)user;
    const char *spec = bench_feature_spec(f);
    if (f == BENCH_REGEX)
        return grammar_regex_to_ebnf(spec, strlen(spec), ebnf_out, err);
    if (f != BENCH_JSON && f != BENCH_CHOICE)
        return tern_err_set(err, TERN_EINVAL, "feature %s has no grammar", bench_feature_name(f));
    json_object *o = tern_json_parse(spec, strlen(spec), err);
    if (!o)
        return err->code;
    int rc;
    if (f == BENCH_CHOICE) {
        rc = grammar_choice_to_ebnf(o, ebnf_out, err);
    } else {
        grammar_schema_opts so;
        grammar_schema_opts_init(&so);
        so.any_whitespace = 0; /* compact: the model cannot spend the budget on blanks */
        rc = grammar_schema_to_ebnf(o, &so, ebnf_out, err);
    }
    json_object_put(o);
    return rc;
}

/* ---- validation ---- */

static int check_json(const char *text, size_t len, char *why, size_t cap)
{
    json_tokener *t = json_tokener_new();
    if (!t)
        return snprintf(why, cap, "out of memory"), -1;
    json_object *o = json_tokener_parse_ex(t, text, (int)len);
    int complete = json_tokener_get_error(t) == json_tokener_success && (size_t)json_tokener_get_parse_end(t) == len;
    json_tokener_free(t);
    int rc = -1;
    if (!o || !complete) {
        snprintf(why, cap, "not one complete JSON value");
        goto out;
    }
    if (!json_object_is_type(o, json_type_object)) {
        snprintf(why, cap, "not a JSON object");
        goto out;
    }
    json_object *city, *pop, *sunny;
    if (!json_object_object_get_ex(o, "city", &city) || !json_object_is_type(city, json_type_string) ||
        json_object_get_string_len(city) > 12 * 4) { /* maxLength counts code points: at most 4 bytes each */
        snprintf(why, cap, "\"city\" missing, not a string or too long");
        goto out;
    }
    if (!json_object_object_get_ex(o, "population", &pop) || !json_object_is_type(pop, json_type_int) ||
        json_object_get_int64(pop) < 0 || json_object_get_int64(pop) > 9999999) {
        snprintf(why, cap, "\"population\" missing, not an integer or out of [0, 9999999]");
        goto out;
    }
    if (!json_object_object_get_ex(o, "sunny", &sunny) || !json_object_is_type(sunny, json_type_boolean)) {
        snprintf(why, cap, "\"sunny\" missing or not a boolean");
        goto out;
    }
    if (json_object_object_length(o) != 3) {
        snprintf(why, cap, "properties beyond city, population, sunny");
        goto out;
    }
    rc = 0;
out:
    json_object_put(o);
    return rc;
}

static int check_regex(const char *text, size_t len, char *why, size_t cap)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)REGEX, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED | PCRE2_ENDANCHORED |
                                   PCRE2_UTF, &ec, &eo, NULL);
    if (!re)
        return snprintf(why, cap, "the reference regex does not compile"), -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = md ? pcre2_match(re, (PCRE2_SPTR)text, len, 0, 0, md, NULL) : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    if (rc < 0) {
        snprintf(why, cap, "does not match %s", REGEX);
        return -1;
    }
    return 0;
}

static int check_choice(const char *text, size_t len, char *why, size_t cap)
{
    static const char *const opts[] = {"sunny", "cloudy", "rainy", "snowy"};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
        if (strlen(opts[i]) == len && !memcmp(opts[i], text, len))
            return 0;
    snprintf(why, cap, "not one of %s", CHOICES);
    return -1;
}

int bench_output_check(bench_feature f, const char *text, size_t len, char *why, size_t cap)
{
    int rc = 0;
    if (f == BENCH_JSON)
        rc = check_json(text, len, why, cap);
    else if (f == BENCH_REGEX)
        rc = check_regex(text, len, why, cap);
    else if (f == BENCH_CHOICE)
        rc = check_choice(text, len, why, cap);
    if (rc) { /* quote the start of the output after the reason */
        size_t l = strlen(why);
        if (l + 8 < cap)
            snprintf(why + l, cap - l, ": \"%.*s%s\"", (int)(len < 60 ? len : 60), text, len > 60 ? "..." : "");
    }
    return rc;
}

/* ---- numbers ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_quantile(double *v, int n, double q)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int k = (int)(q * n + 0.999999) - 1; /* nearest rank: ceil(q n) - 1 */
    if (k < 0)
        k = 0;
    if (k >= n)
        k = n - 1;
    return v[k];
}

double bench_rss_mb(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = 0;
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE) / (1024.0 * 1024.0);
}
