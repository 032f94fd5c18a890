/* cmd.h - subcommands of the `strata` tool. Each returns the process exit code:
 * 0 ok, 1 runtime failure, 2 bad input or usage (do not retry). */
#ifndef STRATA_CMD_H
#define STRATA_CMD_H

typedef int (*strata_cmd_fn)(int argc, char **argv);

typedef struct {
    const char *name;
    strata_cmd_fn fn;
    const char *summary;
} strata_cmd_t;

#endif
