/* --device for tern run, serve and logits: cpu, cuda, cuda:N or auto. With
 * no flag the environment's TERN_DEVICE applies, else auto: the first GPU
 * when this tern was built with CUDA and one is present, else the CPU - and
 * the CPU as well when the GPU backend cannot run the model's shape (an
 * explicit cuda reports that as an error instead). model_load_ex takes the
 * same strings; resolving here lets the choice be logged and shared with a
 * draft model. Also the options of where a mixture's experts live
 * (cli_experts_flag). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "cli.h"
#include "model/model.h"

tern_model *cli_load_model(const char *dir, const char *device, int n_threads, char *dev_buf, size_t cap,
                           tern_err *err)
{
    if (!device || !device[0])
        device = getenv("TERN_DEVICE");
    int is_auto = !device || !device[0] || !strcmp(device, "auto");
    if (is_auto)
        snprintf(dev_buf, cap, "%s", model_cuda_device_count() > 0 ? "cuda:0" : "cpu");
    else
        snprintf(dev_buf, cap, "%s", device);
    model_load_opts lo = {n_threads, dev_buf};
    tern_model *m = model_load_ex(dir, &lo, err);
    if (!m && is_auto && strcmp(dev_buf, "cpu") && err && err->code == TERN_EUNSUPPORTED) {
        TERN_WARN("device: %s cannot run this model (%s); using the CPU", dev_buf, err->msg);
        snprintf(dev_buf, cap, "cpu");
        m = model_load_ex(dir, &lo, err);
    }
    if (m)
        TERN_INFO("device: %s%s", dev_buf, is_auto ? " (auto)" : "");
    return m;
}

static int g_experts_where = MODEL_EXPERTS_MAPPED;
static size_t g_expert_cache = (size_t)-1; /* unset: half the memory */

static int parse_size(const char *v, size_t *out)
{
    char *end;
    double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1024.0 * 1024 * 1024, end++;
    else if (*end == 'T' || *end == 't')
        mul = 1024.0 * 1024 * 1024 * 1024, end++;
    if (end == v || *end || !(x >= 0) || x * mul > 1e18)
        return -1;
    *out = (size_t)(x * mul);
    return 0;
}

int cli_experts_flag(int argc, char **argv, int *i, const char *cmd)
{
    const char *v;
    if ((v = cli_flag_value(argc, argv, i, "--experts-in"))) {
        if (!strcmp(v, "host"))
            g_experts_where = MODEL_EXPERTS_HOST;
        else if (!strcmp(v, "disk"))
            g_experts_where = MODEL_EXPERTS_DISK;
        else {
            fprintf(stderr, "tern %s: --experts-in must be host or disk, not '%s'\n", cmd, v);
            return -1;
        }
    } else if ((v = cli_flag_value(argc, argv, i, "--expert-cache"))) {
        if (parse_size(v, &g_expert_cache)) {
            fprintf(stderr, "tern %s: --expert-cache must be a size such as 8G, 512M or 0, not '%s'\n", cmd, v);
            return -1;
        }
        if (g_experts_where == MODEL_EXPERTS_MAPPED)
            g_experts_where = MODEL_EXPERTS_DISK;
    } else {
        return 0;
    }
    size_t cache = g_expert_cache;
    if (cache == (size_t)-1) {
        long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
        cache = pages > 0 && pg > 0 ? (size_t)pages * (size_t)pg / 2 : (size_t)4 << 30;
    }
    model_experts_opts_set(g_experts_where, cache);
    return 1;
}

void cli_experts_report(const tern_model *m, FILE *f)
{
    model_experts_stats st;
    if (model_experts_stats_get(m, &st) || st.where == MODEL_EXPERTS_MAPPED)
        return;
    uint64_t picks = st.hits + st.misses;
    fprintf(f, "[experts in %s: %llu picks, hit rate %.1f%%, %.2f GB read in %.2f s (%.2f GB/s), %.2f of %.2f GB held%s]\n",
            st.where == MODEL_EXPERTS_DISK ? "disk" : "host", (unsigned long long)picks,
            picks ? 100.0 * (double)st.hits / (double)picks : 0.0, st.streamed_bytes / 1e9, st.stream_seconds,
            st.stream_seconds > 0 ? st.streamed_bytes / 1e9 / st.stream_seconds : 0.0, st.resident_bytes / 1e9,
            st.total_bytes / 1e9, st.where == MODEL_EXPERTS_DISK ? (st.locked ? ", locked" : ", not locked") : "");
}
