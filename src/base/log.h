/* Diagnostics to stderr with a level threshold; stdout stays for program output. */
#ifndef TERN_BASE_LOG_H
#define TERN_BASE_LOG_H

enum tern_log_level { TERN_LOG_DEBUG, TERN_LOG_INFO, TERN_LOG_WARN, TERN_LOG_ERROR, TERN_LOG_QUIET };

void tern_log_set_level(enum tern_log_level lvl);
enum tern_log_level tern_log_get_level(void);
void tern_log(enum tern_log_level lvl, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define TERN_DEBUG(...) tern_log(TERN_LOG_DEBUG, __VA_ARGS__)
#define TERN_INFO(...) tern_log(TERN_LOG_INFO, __VA_ARGS__)
#define TERN_WARN(...) tern_log(TERN_LOG_WARN, __VA_ARGS__)
#define TERN_ERROR(...) tern_log(TERN_LOG_ERROR, __VA_ARGS__)

/* Monotonic clock in seconds / nanoseconds. */
double tern_time_s(void);
long long tern_time_ns(void);

#endif
