/* cmd_demo.c - `strata demo`: write the demo model (RANDOM weights) and optionally a config. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "services/strata/cmd.h"
#include "services/strata/demo.h"

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata demo --out DIR [--seed S] [--config FILE --name NAME --run-dir RUN --port PORT]\n\n"
            "Write the demo model: a tiny Mixtral-shaped model whose weights are RANDOM (its text is\n"
            "gibberish), generated locally. DIR/hf is an HF folder (config.json, model.safetensors,\n"
            "tokenizer.json: byte-level BPE, 256 byte tokens + %d merges + <s> </s>, vocab %d);\n"
            "DIR/model is the same model packed (bf16). Nothing is written if DIR/model exists.\n"
            "`strata up --demo` does this itself; tests and benchmarks use this command.\n\n"
            "  --out DIR       where to write hf/ and model/\n"
            "  --seed S        weight seed (default %u)\n"
            "  --config FILE   also write a group config for DIR/model (needs --name, --run-dir, --port)\n"
            "  -h, --help      this help\n\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 usage.\n",
            DEMO_MERGES, DEMO_VOCAB, DEMO_SEED);
}

int cmd_demo(int argc, char **argv)
{
    const char *out = NULL, *config = NULL, *name = NULL, *run_dir = NULL;
    unsigned long long seed = DEMO_SEED;
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
        else if (!strcmp(a, "--seed")) {
            seed = strtoull(v, &end, 0);
            if (*end || !*v) {
                fprintf(stderr, "strata demo: --seed '%s' is not a number\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--port")) {
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
    if (demo_model_write(out, seed, &eb) < 0) {
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
