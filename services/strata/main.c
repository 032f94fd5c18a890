/* main.c - the `strata` command-line tool: dispatches to one subcommand per file. */
#include <stdio.h>
#include <string.h>

#include "common/strata.h"
#include "services/strata/cmd.h"

/* Subcommands: add one line here and one cmd_NAME.c file. */
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_unpack(int argc, char **argv);
int cmd_client(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_up(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_down(int argc, char **argv);
int cmd_pin(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_keygen(int argc, char **argv);
static const strata_cmd_t s_cmds[] = {
    {"eval", cmd_eval, "logits of every position of a token sequence, to a file"},
    {"generate", cmd_generate, "sample token ids after a prompt of token ids"},
    {"pack", cmd_pack, "quantize a model folder into a packed model (docs/PACKED_FORMAT.md)"},
    {"unpack", cmd_unpack, "a packed model back to an HF folder with F32 weights"},
    {"client", cmd_client, "send a prompt to a running group's router and stream the answer"},
    {"chat", cmd_chat, "an interactive chat with a running group in the terminal"},
    {"up", cmd_up, "start the process group (launcher): --config FILE or --demo"},
    {"status", cmd_status, "pid, state, uptime and restarts of every service of a group"},
    {"down", cmd_down, "stop a group started by `strata up`"},
    {"pin", cmd_pin, "run a program pinned to cpus and a NUMA node (used by strata up)"},
    {"demo", cmd_demo, "write the demo model (small, trained on English) and a config"},
    {"tokenize", cmd_tokenize, "text to token ids (or back) with a tokenizer.json, line by line"},
    {"synth", cmd_synth, "write a packed model with random weights and a real model's shapes"},
    {"bench", cmd_bench, "load generator over the client protocol, with the roofline bound"},
    {"keygen", cmd_keygen, "write a ZeroMQ CURVE keypair (Z85 files) for the router and its clients"},
    {NULL, NULL, NULL},
};

static void s_usage(FILE *f)
{
    fprintf(f, "usage: strata COMMAND [ARGS...]\n\nCommands:\n");
    for (const strata_cmd_t *c = s_cmds; c->name; c++) fprintf(f, "  %-10s %s\n", c->name, c->summary);
    fprintf(f, "\nRun `strata COMMAND --help` for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        s_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        s_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("strata %s\n", STRATA_VERSION);
        return 0;
    }
    for (const strata_cmd_t *c = s_cmds; c->name; c++) {
        if (!strcmp(argv[1], c->name)) {
            log_set_role("strata");
            return c->fn(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "strata: unknown command '%s'\n", argv[1]);
    s_usage(stderr);
    return 2;
}
