/* Residency of mixture-of-experts weights (model_int.h). */
#include "model/model_int.h"

void model_experts_touch(tern_model *m, int layer, int expert)
{
    (void)layer;
    (void)expert;
    if (!m->xc)
        return;
}
