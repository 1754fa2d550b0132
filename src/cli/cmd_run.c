/* tern run / tern logits: generate from a model folder, or dump logits. */
#include <stdio.h>

#include "cli.h"

int cmd_run(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tern run: not built yet\n");
    return 1;
}

