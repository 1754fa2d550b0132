/* CPU feature detection through cpuid + xgetbv (OS must save the registers). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cpu.h"

#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static tern_cpu_features g_feat;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static unsigned long long xgetbv0(void)
{
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static void detect(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    int osxsave = (c >> 27) & 1;
    int avx = (c >> 28) & 1;
    if (!osxsave || !avx)
        return;
    unsigned long long xcr0 = xgetbv0();
    int ymm_ok = (xcr0 & 0x6) == 0x6;
    int zmm_ok = (xcr0 & 0xe6) == 0xe6;
    g_feat.fma = ymm_ok && ((c >> 12) & 1);
    g_feat.f16c = ymm_ok && ((c >> 29) & 1);
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return;
    g_feat.avx2 = ymm_ok && ((b >> 5) & 1);
    g_feat.avx512f = zmm_ok && ((b >> 16) & 1);
    g_feat.avx512bw = zmm_ok && ((b >> 30) & 1);
    g_feat.avx512vl = zmm_ok && ((b >> 31) & 1);
    g_feat.avx512_vnni = zmm_ok && ((c >> 11) & 1);
    int amx_tile = (d >> 24) & 1, amx_bf16 = (d >> 22) & 1, amx_int8 = (d >> 25) & 1;
    /* the OS saves the tile state (XCR0 bits 17, 18) and grants it to this
     * process (ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18) */
    if (amx_tile && zmm_ok && (xcr0 & 0x60000) == 0x60000 && syscall(SYS_arch_prctl, 0x1023, 18) == 0) {
        g_feat.amx_bf16 = amx_bf16;
        g_feat.amx_int8 = amx_int8;
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d))
        g_feat.avx512_bf16 = zmm_ok && ((a >> 5) & 1);
    unsigned vendor[3];
    if (__get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]) && __get_cpuid(1, &a, &b, &c, &d)) {
        int amd = !memcmp(vendor, "AuthenticAMD", 12);
        unsigned family = ((a >> 8) & 15) + (((a >> 8) & 15) == 15 ? (a >> 20) & 255 : 0);
        g_feat.avx512_halves = amd && family == 0x19 && g_feat.avx512f;
    }
}

const tern_cpu_features *tern_cpu(void)
{
    pthread_once(&g_once, detect);
    return &g_feat;
}

int tern_cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

/* One integer from a sysfs file, or -1. */
static long sysfs_long(const char *fmt, int cpu)
{
    char path[128];
    snprintf(path, sizeof path, fmt, cpu);
    FILE *f = fopen(path, "r");
    long v = -1;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

int tern_cpu_physical_count(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return tern_cpu_count();
    enum { MAX_CORES = 1024 };
    long seen[MAX_CORES];
    int n = 0, logical = 0;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &set))
            continue;
        logical++;
        long core = sysfs_long("/sys/devices/system/cpu/cpu%d/topology/core_id", cpu);
        long pkg = sysfs_long("/sys/devices/system/cpu/cpu%d/topology/physical_package_id", cpu);
        if (core < 0 || pkg < 0)
            return logical > 0 ? tern_cpu_count() : 1;
        long key = pkg * 1000000 + core;
        int dup = 0;
        for (int i = 0; i < n && !dup; i++)
            dup = seen[i] == key;
        if (!dup && n < MAX_CORES)
            seen[n++] = key;
    }
    return n > 0 ? n : 1;
}
