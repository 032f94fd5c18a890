/* cli_util.h - parsing helpers shared by the `strata` subcommands.
 *
 * Every helper that fails prints one line "strata CMD: what is wrong" on stderr and returns
 * the exit code the subcommand should return (2 bad input, 1 runtime failure), so a command
 * body reads `if ((rc = cli_...(...))) goto done;`.
 */
#ifndef STRATA_CLI_UTIL_H
#define STRATA_CLI_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strata.h"
#include "kernels/cpu/threadpool.h"
#include "model/generate.h"
#include "model/model.h"

/* Quiet the info logs (loader progress) unless STRATA_LOG asks for them: a command's
 * stderr then holds warnings and its one error line only. */
void cli_quiet_logs(void);

/* Print "strata CMD: <message>" on stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Exit code for an error value: 2 for bad input (format, unsupported, missing file), else 1. */
int cli_exit_code(int err);

/* Match option `name` at argv[*i] as "--name VALUE" or "--name=VALUE".
 * Returns 1 (matched: *val set, *i advanced past the value), 0 (not this option),
 * or -1 (matched but no value; message printed). */
int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val);

/* Parse whole-string numbers in [lo, hi]; 0 or 2 (message names the flag). */
int cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
int cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out);
int cli_parse_f32(const char *cmd, const char *flag, const char *s, float lo, float hi, float *out);

/* A positional argument, or what is left after a command tried its options on argv[i]: an
 * unknown option ("-x", "--x"; a lone "-" is an argument) is an error, else arg fills the first
 * NULL slot of pos[0..n), and an argument with no slot left is an error whose message ends with
 * `expected` (e.g. "HF_DIR and OUT_DIR expected"). Returns 0 or 2 (message printed). */
int cli_positional(const char *cmd, const char *arg, const char **const *pos, int n, const char *expected);

/* What `strata eval` and `strata generate` share on their command lines. */
typedef struct {
    const char *model_dir;       /* MODEL, the one positional argument */
    const char *tokens;          /* --tokens IDS, or NULL */
    const char *tokens_file;     /* --tokens-file FILE, or NULL */
    int64_t chunk;               /* --chunk C in [1, 2^31), 0 if not given */
    int64_t threads;             /* --threads T in [0, 4096], 0 = all CPUs */
} cli_model_args_t;

/* argv[*i] after the command tried its own options: --tokens, --tokens-file, --chunk, --threads,
 * --cpu-act (applied at once: cpu_ops_set_act) (with their values; *i moves past them), or else
 * cli_positional with MODEL. Returns 0 or 2. */
int cli_model_arg(const char *cmd, int argc, char **argv, int *i, cli_model_args_t *a);
/* The tokens of --tokens or, if that was not given, --tokens-file (cli_parse_tokens /
 * cli_read_tokens_file). Returns 0 or the exit code. */
int cli_model_tokens(const char *cmd, const cli_model_args_t *a, int32_t **out, int32_t *n);

/* Parse token ids separated by commas, spaces, tabs or newlines into a malloc'd array
 * (*out, *n >= 1). `what` names the source in messages. Returns 0 or 2. */
int cli_parse_tokens(const char *cmd, const char *what, const char *text, int32_t **out, int32_t *n);
/* Same, from a file. Returns 0, 2 (bad content or unreadable file). */
int cli_read_tokens_file(const char *cmd, const char *path, int32_t **out, int32_t *n);
/* Check every id is in [0, vocab). Returns 0 or 2. */
int cli_check_tokens(const char *cmd, const int32_t *tok, int32_t n, int32_t vocab);

/* The sampling flags --temperature T --top-k K --top-p P --seed S --ignore-eos.
 * Returns 1 (consumed argv[*i], and its value), 0 (not a sampling flag), or 2 (bad value). */
int cli_sampling_opt(const char *cmd, int argc, char **argv, int *i, sampler_params_t *p);
/* Usage lines for the sampling flags. */
extern const char cli_sampling_help[];

/* Load a model (HF or packed folder); on failure prints the loader's message as one line
 * and returns the exit code (2 bad input, 1 other). Returns 0 on success. */
int cli_load_model(const char *cmd, model_t *m, const char *dir);

/* --force of a command that writes a packed folder: remove dir's manifest first (the folder stops
 * being a loadable model at once, whatever happens next), then every file whose name `ours`
 * claims. Returns 0, 1 (a file could not be removed) or 2 (dir cannot be read), message printed. */
int cli_clear_out(const char *cmd, const char *dir, bool (*ours)(const char *name));

/* A thread pool of `threads` (0 = all CPUs); NULL with a message if it cannot start. */
tpool_t *cli_pool(const char *cmd, int threads);

#endif
