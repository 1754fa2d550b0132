/* Helpers shared by test programs: locating ../shared and the repository. */
#ifndef TERN_TEST_UTIL_H
#define TERN_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* Path under $TERN_SHARED (ctest sets it; default ../shared). Static buffer. */
static inline const char *shared_path(const char *rel)
{
    static char buf[4][1024];
    static int k;
    const char *root = getenv("TERN_SHARED");
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root ? root : "../shared", rel);
    return buf[k];
}

static inline const char *repo_path(const char *rel)
{
    static char buf[4][1024];
    static int k;
    const char *root = getenv("TERN_ROOT");
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root ? root : ".", rel);
    return buf[k];
}

#endif
