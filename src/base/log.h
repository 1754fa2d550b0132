/* Diagnostics to stderr with a level threshold; stdout stays for program
 * output. Lines are whole and ordered (one lock), as text ("tern: [time]
 * level: message") or one JSON object per line; a progress line that a
 * terminal rewrites in place stays below them and is never cut into. */
#ifndef TERN_BASE_LOG_H
#define TERN_BASE_LOG_H

enum tern_log_level { TERN_LOG_DEBUG, TERN_LOG_INFO, TERN_LOG_WARN, TERN_LOG_ERROR, TERN_LOG_QUIET };
/* TEXT: "tern: level: message"; JSON: {"time","level","msg", fields...} per line. */
enum tern_log_format { TERN_LOG_TEXT, TERN_LOG_JSON };

void tern_log_set_level(enum tern_log_level lvl);
enum tern_log_level tern_log_get_level(void);
void tern_log_set_format(enum tern_log_format f);
enum tern_log_format tern_log_get_format(void);
/* 1: text lines carry an ISO 8601 UTC time with milliseconds (JSON always does). */
void tern_log_set_timestamps(int on);
void tern_log(enum tern_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A line with fields: text mode appends fields_text ("k=v k=v"), JSON mode
 * adds fields_json (members without braces: "\"k\":1,\"s\":\"v\"", already
 * escaped). Either may be NULL. */
void tern_log_record(enum tern_log_level lvl, const char *msg, const char *fields_text, const char *fields_json);
/* An unconditional line (no level tag in text mode: text as is; JSON: an info record). */
void tern_log_line(const char *text);
/* A progress line: on a terminal (text mode) it is rewritten in place and
 * log lines printed meanwhile go above it; otherwise a line of its own.
 * tern_log_progress_end finishes it. */
void tern_log_progress(const char *text);
void tern_log_progress_end(void);
/* Now, as "2026-01-31T12:34:56.789Z" (UTC). */
void tern_log_time_iso(char out[32]);

#define TERN_DEBUG(...) tern_log(TERN_LOG_DEBUG, __VA_ARGS__)
#define TERN_INFO(...) tern_log(TERN_LOG_INFO, __VA_ARGS__)
#define TERN_WARN(...) tern_log(TERN_LOG_WARN, __VA_ARGS__)
#define TERN_ERROR(...) tern_log(TERN_LOG_ERROR, __VA_ARGS__)

/* Monotonic clock in seconds / nanoseconds. */
double tern_time_s(void);
long long tern_time_ns(void);

#endif
