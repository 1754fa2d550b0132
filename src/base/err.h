/* Error values for all of tern: a code from one X-macro table plus a message.
 * Every fallible function returns int (0 ok, negative TERN_E*) or a pointer
 * with NULL, and fills an optional tern_err out-parameter. */
#ifndef TERN_BASE_ERR_H
#define TERN_BASE_ERR_H

#include <stdarg.h>
#include <stddef.h>

/* The codes, their names and messages: TERN_ERRNO_MAP in include/tern.h,
 * the one table (the public API returns the same values). */
#include "tern.h"

/* Message buffers are fixed so an error can be reported with no allocation
 * (the out-of-memory path included). 512 bytes holds a path plus context. */
#define TERN_ERR_MSG_MAX 512

typedef struct tern_err {
    int code;                   /* TERN_OK or a negative TERN_E* */
    long pos;                   /* byte offset / line in the input, -1 if none */
    char msg[TERN_ERR_MSG_MAX]; /* human readable, one line */
} tern_err;

/* Name ("EINVAL") and default message of a code: tern_err_name and
 * tern_strerror of tern.h. Never NULL. */
static inline const char *tern_err_str(int code)
{
    return tern_strerror(code);
}

/* Fills *e (if non-NULL) and returns code, so callers can write
 * `return tern_err_set(e, TERN_EFORMAT, "bad header in %s", path);`. */
int tern_err_set(tern_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tern_err_setv(tern_err *e, int code, const char *fmt, va_list ap);
/* Same with a position. */
int tern_err_set_pos(tern_err *e, int code, long pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prefixes the existing message with context ("loading X: <old msg>"). */
int tern_err_wrap(tern_err *e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void tern_err_clear(tern_err *e);

#endif
