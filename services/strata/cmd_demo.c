/* cmd_demo.c - `strata demo`: write the demo model (an HF copy and its packed form) and optionally a config. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/strata/cmd.h"
#include "services/strata/demo.h"

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata demo --out DIR [--config FILE --name NAME --run-dir RUN --port PORT]\n\n"
            "Write the demo model: a small Mixtral-shaped MoE (8 experts, top-2, a 4096-token byte-level\n"
            "BPE) trained on English text, shipped in models/demo (its training script, corpus and licence\n"
            "are named in models/demo/SOURCE.md). DIR/hf is a copy of that HF folder; DIR/model is the same\n"
            "model packed (bf16, lossless). Nothing is written if DIR/model exists. The folder is found in\n"
            "$STRATA_DEMO_MODEL, share/strata/demo-model beside the binary's bin/, the source tree, or the\n"
            "install prefix. `strata up --demo` does this itself; tests and benchmarks use this command.\n\n"
            "  --out DIR       where to write hf/ and model/\n"
            "  --config FILE   also write a group config for DIR/model (needs --name, --run-dir, --port)\n"
            "  -h, --help      this help\n\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage.\n");
}

int cmd_demo(int argc, char **argv)
{
    const char *out = NULL, *config = NULL, *name = NULL, *run_dir = NULL;
    long port = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_help(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "strata demo: unknown or incomplete option '%s'\n", a);
            return 2;
        }
        const char *v = argv[++i];
        char *end = NULL;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "--name")) name = v;
        else if (!strcmp(a, "--run-dir")) run_dir = v;
        else if (!strcmp(a, "--port")) {
            port = strtol(v, &end, 10);
            if (*end || port < 1 || port > 65535) {
                fprintf(stderr, "strata demo: --port '%s' is not a port\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "strata demo: unknown option '%s'\n", a);
            s_help(stderr);
            return 2;
        }
    }
    if (!out || (config && (!name || !run_dir || !port))) {
        s_help(stderr);
        return 2;
    }
    strata_errbuf_t eb = {{0}};
    if (demo_model_write(out, &eb) < 0) {
        fprintf(stderr, "strata demo: %s\n", eb.msg);
        return 1;
    }
    char real[PATH_MAX], model[PATH_MAX + 16];
    if (!realpath(out, real)) return 1;
    snprintf(model, sizeof model, "%s/model", real);
    if (config && demo_config_write(config, name, run_dir, model, (int)port, &eb) < 0) {
        fprintf(stderr, "strata demo: %s\n", eb.msg);
        return 1;
    }
    printf("%s\n", model);
    return 0;
}
