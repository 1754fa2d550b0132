/* stderr logging (see log.h). Thread-safe: one fprintf per line. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static enum tern_log_level g_level = TERN_LOG_WARN;

void tern_log_set_level(enum tern_log_level lvl) { g_level = lvl; }
enum tern_log_level tern_log_get_level(void) { return g_level; }

void tern_log(enum tern_log_level lvl, const char *fmt, ...)
{
    static const char *tag[] = {"debug", "info", "warn", "error", ""};
    if (lvl < g_level)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "tern: %s: %s\n", tag[lvl], line);
}

long long tern_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double tern_time_s(void) { return (double)tern_time_ns() * 1e-9; }
