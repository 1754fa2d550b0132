/* --device for tern run, serve and logits: cpu, cuda, cuda:N or auto (the
 * default: the first GPU when this tern was built with CUDA and one is
 * present, else the CPU). model_load_ex takes the same strings; this only
 * resolves auto so that the choice can be logged and shared with a draft
 * model. */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "cli.h"
#include "model/backend.h"

const char *cli_device_resolve(const char *dev, char *buf, size_t cap)
{
    int is_auto = !dev || !strcmp(dev, "auto");
    if (is_auto)
        snprintf(buf, cap, "%s", model_cuda_device_count() > 0 ? "cuda:0" : "cpu");
    else
        snprintf(buf, cap, "%s", dev);
    TERN_INFO("device: %s%s", buf, is_auto ? " (auto)" : "");
    return buf;
}
