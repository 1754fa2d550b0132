/* tern_chat_template_apply from several threads at once on one loaded chat
 * template, as the server's connection threads do. The template's special
 * tokens (eos_token, ...) are shared json-c objects; json-c's reference
 * counts are plain (non-atomic) integers, so an apply that took references
 * to them raced with the other threads: lost updates freed a special token
 * while the template still held it, and the server later crashed (at the
 * latest in tern_chat_template_free at shutdown). Here the reference count
 * of eos_token must come out exact: after the threads and the template are
 * gone, dropping our own reference must be the one that frees it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "template/template.h"

#define N_THREADS 4
#define N_APPLIES 20000

typedef struct job {
    const tern_chat_template *ct;
    int id;
    int bad; /* wrong or failed renders */
} job;

static void *apply_thread(void *arg)
{
    job *j = arg;
    char want[128], body[160];
    for (int i = 0; i < N_APPLIES; i++) {
        snprintf(want, sizeof want, "<E>|<P>|<a>,<b>|t%d-%d", j->id, i);
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"t%d-%d\"}]}", j->id, i);
        tern_err e = {0};
        json_object *req = tern_json_parse(body, strlen(body), &e);
        size_t len = 0;
        char *out = req ? tern_chat_template_apply(j->ct, req, NULL, &len, &e) : NULL;
        if (!out || strcmp(out, want) != 0)
            j->bad++;
        free(out);
        json_object_put(req);
    }
    return NULL;
}

static void test_apply_from_threads(void **state)
{
    (void)state;
    static const char src[] = "{{ eos_token }}|{{ pad_token }}|{{ additional_special_tokens | join(',') }}|"
                              "{{ messages[0].content }}";
    static const char cfg_text[] =
        "{\"eos_token\": \"<E>\", \"pad_token\": {\"content\": \"<P>\"}, \"additional_special_tokens\": [\"<a>\", \"<b>\"]}";
    tern_err e = {0};
    json_object *cfg = tern_json_parse(cfg_text, strlen(cfg_text), &e);
    assert_non_null(cfg);
    tern_chat_template ct;
    assert_int_equal(tern_chat_template_from_source(src, strlen(src), cfg, &ct, &e), 0);
    json_object_put(cfg);
    json_object *eos = NULL;
    assert_true(json_object_object_get_ex(ct.special, "eos_token", &eos));
    json_object_get(eos); /* ours, taken before any thread runs */

    pthread_t th[N_THREADS];
    job jobs[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        jobs[i] = (job){&ct, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, apply_thread, &jobs[i]), 0);
    }
    int bad = 0;
    for (int i = 0; i < N_THREADS; i++) {
        pthread_join(th[i], NULL);
        bad += jobs[i].bad;
    }
    assert_int_equal(bad, 0);
    tern_chat_template_free(&ct);
    /* exactly one reference left (ours): no increment or decrement was lost */
    assert_int_equal(json_object_put(eos), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_apply_from_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
