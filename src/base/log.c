/* stderr logging (see log.h). One mutex orders every line and the progress
 * line: a log line never lands inside another, nor inside a progress bar
 * that a terminal shows rewritten in place (the bar is cleared, the line
 * printed, the bar drawn again below it). */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static enum tern_log_level g_level = TERN_LOG_WARN;
static enum tern_log_format g_format = TERN_LOG_TEXT;
static int g_stamps;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_progress[256]; /* the open progress line on a terminal ("" = none) */

static const char *const g_tag[] = {"debug", "info", "warn", "error", ""};

void tern_log_set_level(enum tern_log_level lvl) { g_level = lvl; }
enum tern_log_level tern_log_get_level(void) { return g_level; }
void tern_log_set_format(enum tern_log_format f) { g_format = f; }
enum tern_log_format tern_log_get_format(void) { return g_format; }
void tern_log_set_timestamps(int on) { g_stamps = on; }

void tern_log_time_iso(char out[32])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 24, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 32 - n, ".%03dZ", (int)(ts.tv_nsec / 1000000L) % 1000);
}

/* s as the body of a JSON string (quotes, backslashes and controls escaped). */
static void json_escape(char *dst, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            dst[o++] = '\\';
            dst[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(dst + o, cap - o, "\\u%04x", ch);
        } else {
            dst[o++] = (char)ch;
        }
    }
    dst[o] = 0;
}

/* Writes one finished line (mu held), keeping a terminal's progress line below it. */
static void emit_locked(const char *line)
{
    if (g_progress[0])
        fputs("\r\033[K", stderr);
    fputs(line, stderr);
    fputc('\n', stderr);
    if (g_progress[0])
        fputs(g_progress, stderr);
    fflush(stderr);
}

static void record(const char *tag, const char *msg, const char *fields_text, const char *fields_json)
{
    char t[32] = "";
    if (g_stamps || g_format == TERN_LOG_JSON)
        tern_log_time_iso(t);
    char line[2048];
    if (g_format == TERN_LOG_JSON) {
        char m[1024];
        json_escape(m, sizeof m, msg);
        snprintf(line, sizeof line, "{\"time\":\"%s\",\"level\":\"%s\",\"msg\":\"%s\"%s%s}", t, tag, m,
                 fields_json && fields_json[0] ? "," : "", fields_json ? fields_json : "");
    } else {
        snprintf(line, sizeof line, "tern: %s%s%s: %s%s%s", t, t[0] ? " " : "", tag, msg,
                 fields_text && fields_text[0] ? " " : "", fields_text ? fields_text : "");
    }
    pthread_mutex_lock(&g_mu);
    emit_locked(line);
    pthread_mutex_unlock(&g_mu);
}

void tern_log_record(enum tern_log_level lvl, const char *msg, const char *fields_text, const char *fields_json)
{
    if (lvl < g_level || lvl >= TERN_LOG_QUIET)
        return;
    record(g_tag[lvl], msg, fields_text, fields_json);
}

void tern_log(enum tern_log_level lvl, const char *fmt, ...)
{
    if (lvl < g_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tern_log_record(lvl, msg, NULL, NULL);
}

void tern_log_progress(const char *text)
{
    int tty = isatty(2) && g_format == TERN_LOG_TEXT;
    if (!tty) { /* a line of its own */
        tern_log_line(text);
        return;
    }
    pthread_mutex_lock(&g_mu);
    snprintf(g_progress, sizeof g_progress, "%s", text);
    fputs("\r\033[K", stderr);
    fputs(g_progress, stderr);
    fflush(stderr);
    pthread_mutex_unlock(&g_mu);
}

void tern_log_progress_end(void)
{
    pthread_mutex_lock(&g_mu);
    if (g_progress[0]) {
        fputc('\n', stderr);
        fflush(stderr);
        g_progress[0] = 0;
    }
    pthread_mutex_unlock(&g_mu);
}

void tern_log_line(const char *text)
{
    if (g_format == TERN_LOG_JSON) {
        record("info", strncmp(text, "tern: ", 6) ? text : text + 6, NULL, NULL);
        return;
    }
    pthread_mutex_lock(&g_mu);
    emit_locked(text);
    pthread_mutex_unlock(&g_mu);
}

long long tern_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

double tern_time_s(void) { return (double)tern_time_ns() * 1e-9; }
