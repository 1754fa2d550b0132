/* Error names and messages from TERN_ERRNO_MAP (include/tern.h), and the
 * tern_err formatting of err.h. */
#include "err.h"

#include <stdio.h>
#include <string.h>

const char *tern_err_name(int code)
{
    switch (code) {
#define X(name, value, msg) case value: return #name;
        TERN_ERRNO_MAP(X)
#undef X
    }
    return "EUNKNOWN";
}

const char *tern_strerror(int code)
{
    switch (code) {
#define X(name, value, msg) case value: return msg;
        TERN_ERRNO_MAP(X)
#undef X
    }
    return "unknown error";
}

int tern_err_setv(tern_err *e, int code, const char *fmt, va_list ap)
{
    if (!e)
        return code;
    e->code = code;
    e->pos = -1;
    if (fmt)
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    else
        snprintf(e->msg, sizeof e->msg, "%s", tern_err_str(code));
    return code;
}

int tern_err_set(tern_err *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tern_err_setv(e, code, fmt, ap);
    va_end(ap);
    return code;
}

int tern_err_set_pos(tern_err *e, int code, long pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tern_err_setv(e, code, fmt, ap);
    va_end(ap);
    if (e)
        e->pos = pos;
    return code;
}

int tern_err_wrap(tern_err *e, const char *fmt, ...)
{
    if (!e)
        return TERN_EINTERNAL;
    char prefix[TERN_ERR_MSG_MAX], old[TERN_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, e->msg, sizeof old);
    size_t n = strlen(prefix);
    if (n > sizeof e->msg - 3)
        n = sizeof e->msg - 3;
    memcpy(e->msg, prefix, n);
    memcpy(e->msg + n, ": ", 2);
    size_t m = strlen(old);
    if (m > sizeof e->msg - n - 3)
        m = sizeof e->msg - n - 3;
    memcpy(e->msg + n + 2, old, m);
    e->msg[n + 2 + m] = '\0';
    return e->code;
}

void tern_err_clear(tern_err *e)
{
    if (!e)
        return;
    e->code = TERN_OK;
    e->pos = -1;
    e->msg[0] = '\0';
}
