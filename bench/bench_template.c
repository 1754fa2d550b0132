/* Chat template throughput: parses a model's chat template and renders a
 * synthetic conversation of N messages (with tools and tool calls) many
 * times. Usage: bench_template DIR [N_MESSAGES=64] [ITERS=200] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "template/template.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static json_object *conversation(int n)
{
    json_object *req = json_object_new_object(), *msgs = json_object_new_array();
    json_object *sys = json_object_new_object();
    json_object_object_add(sys, "role", json_object_new_string("system"));
    json_object_object_add(sys, "content", json_object_new_string("You are a helpful assistant."));
    json_object_array_add(msgs, sys);
    for (int i = 0; i < n; i++) {
        json_object *m = json_object_new_object();
        char text[256];
        snprintf(text, sizeof text, "Message %d: the quick brown fox jumps over the lazy dog, again and again.", i);
        json_object_object_add(m, "role", json_object_new_string(i % 2 ? "assistant" : "user"));
        json_object_object_add(m, "content", json_object_new_string(text));
        json_object_array_add(msgs, m);
    }
    json_object_object_add(req, "messages", msgs);
    json_object_object_add(req, "add_generation_prompt", json_object_new_boolean(1));
    return req;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: bench_template DIR [N_MESSAGES] [ITERS]\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 64, iters = argc > 3 ? atoi(argv[3]) : 200;
    tern_err err = {0};
    tern_chat_template ct;
    double t0 = now_s();
    if (tern_chat_template_load(argv[1], &ct, &err)) {
        fprintf(stderr, "bench_template: %s\n", err.msg);
        return 1;
    }
    double t_load = now_s() - t0;
    json_object *req = conversation(n);
    size_t len = 0;
    t0 = now_s();
    for (int i = 0; i < iters; i++) {
        char *out = tern_chat_template_apply(&ct, req, NULL, &len, &err);
        if (!out) {
            fprintf(stderr, "bench_template: %s\n", err.msg);
            return 1;
        }
        free(out);
    }
    double dt = (now_s() - t0) / iters;
    printf("template %s: load+parse %.3f ms; render %d messages -> %zu bytes: %.3f ms/render (%.1f MB/s)\n",
           argv[1], t_load * 1e3, n + 1, len, dt * 1e3, len / dt / 1e6);
    json_object_put(req);
    tern_chat_template_free(&ct);
    return 0;
}
