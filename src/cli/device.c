/* --device for tern run, serve and logits: cpu, cuda, cuda:N or auto. With
 * no flag the environment's TERN_DEVICE applies, else auto: the first GPU
 * when this tern was built with CUDA and one is present, else the CPU - and
 * the CPU as well when the GPU backend cannot run the model's shape (an
 * explicit cuda reports that as an error instead). model_load_ex takes the
 * same strings; resolving here lets the choice be logged and shared with a
 * draft model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
