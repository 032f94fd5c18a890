/* cli_util.c - parsing helpers shared by the `strata` subcommands (see cli_util.h). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/ops.h"
#include "model/packed.h"
#include "services/strata/cli_util.h"

/* LOG_WARN unless STRATA_LOG is set. */
void cli_quiet_logs(void)
{
    if (!getenv("STRATA_LOG")) log_set_level(LOG_WARN);
}

/* Print "strata CMD: message" as one line on stderr. */
void cli_error(const char *cmd, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    /* keep it one line even when a loader message carries a newline */
    for (char *p = buf; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    fprintf(stderr, "strata %s: %s\n", cmd, buf);
}

/* 2 for outside-input errors, 1 for everything else. */
int cli_exit_code(int err)
{
    switch (err) {
    case STRATA_EINVAL_INPUT:
    case STRATA_EFORMAT:
    case STRATA_EUNSUPPORTED:
    case STRATA_EVERSION:
    case STRATA_ETOOLARGE:
    case -ENOENT:
    case -ENOTDIR:
    case -EISDIR:
    case -EACCES:
    case -EINVAL:
        return 2;
    default:
        return 1;
    }
}

/* --name VALUE or --name=VALUE at argv[*i]. */
int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        cli_error(cmd, "%s needs a value", name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

/* A signed integer in [lo, hi], nothing else in the string. */
int cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        cli_error(cmd, "%s: '%s' is not an integer in [%lld, %lld]", flag, s, (long long)lo, (long long)hi);
        return 2;
    }
    *out = v;
    return 0;
}

/* An unsigned 64-bit integer (decimal or 0x hex). */
int cli_parse_u64(const char *cmd, const char *flag, const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (*s == '-') errno = ERANGE;
    unsigned long long v = errno ? 0 : strtoull(s, &end, 0);
    if (errno || end == s || *end) {
        cli_error(cmd, "%s: '%s' is not an unsigned 64-bit integer", flag, s);
        return 2;
    }
    *out = v;
    return 0;
}

/* A finite float in [lo, hi]. */
int cli_parse_f32(const char *cmd, const char *flag, const char *s, float lo, float hi, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
        cli_error(cmd, "%s: '%s' is not a number in [%g, %g]", flag, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

/* An unknown option, or the next positional argument. */
int cli_positional(const char *cmd, const char *arg, const char **const *pos, int n, const char *expected)
{
    if (arg[0] == '-' && arg[1]) {
        cli_error(cmd, "unknown option '%s' (see --help)", arg);
        return 2;
    }
    for (int k = 0; k < n; k++) {
        if (!*pos[k]) {
            *pos[k] = arg;
            return 0;
        }
    }
    cli_error(cmd, "unexpected argument '%s' (%s)", arg, expected);
    return 2;
}

/* The options of eval and generate, then MODEL. */
int cli_model_arg(const char *cmd, int argc, char **argv, int *i, cli_model_args_t *a)
{
    const char *v;
    int r;
    if ((r = cli_opt(cmd, argc, argv, i, "--tokens", &v))) {
        if (r < 0) return 2;
        a->tokens = v;
    } else if ((r = cli_opt(cmd, argc, argv, i, "--tokens-file", &v))) {
        if (r < 0) return 2;
        a->tokens_file = v;
    } else if ((r = cli_opt(cmd, argc, argv, i, "--chunk", &v))) {
        if (r < 0 || cli_parse_i64(cmd, "--chunk", v, 1, INT32_MAX, &a->chunk)) return 2;
    } else if ((r = cli_opt(cmd, argc, argv, i, "--threads", &v))) {
        if (r < 0 || cli_parse_i64(cmd, "--threads", v, 0, 4096, &a->threads)) return 2;
    } else if ((r = cli_opt(cmd, argc, argv, i, "--cpu-act", &v))) {
        int act = r < 0 ? -1 : cpu_act_parse(v);
        if (act < 0) {
            if (r > 0) cli_error(cmd, "--cpu-act: '%s' is not f32 or q8", v);
            return 2;
        }
        cpu_ops_set_act((cpu_act_t)act); /* process-wide, as STRATA_CPU_ACT */
    } else {
        return cli_positional(cmd, argv[*i], (const char **const[]){&a->model_dir}, 1, "one MODEL folder expected");
    }
    return 0;
}

/* --tokens, else --tokens-file. */
int cli_model_tokens(const char *cmd, const cli_model_args_t *a, int32_t **out, int32_t *n)
{
    if (a->tokens) return cli_parse_tokens(cmd, "--tokens", a->tokens, out, n);
    return cli_read_tokens_file(cmd, a->tokens_file, out, n);
}

static bool s_is_sep(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* Ids separated by commas or whitespace; empty fields between commas are errors. */
int cli_parse_tokens(const char *cmd, const char *what, const char *text, int32_t **out, int32_t *n)
{
    int32_t *v = NULL, cap = 0, cnt = 0;
    const char *p = text;
    *out = NULL;
    *n = 0;
    for (;;) {
        while (*p && s_is_sep(*p)) p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || x < 0 || x > INT32_MAX || (*end && !s_is_sep(*end))) {
            int len = 0;
            while (p[len] && !s_is_sep(p[len]) && len < 40) len++;
            cli_error(cmd, "%s: token %d '%.*s' is not a non-negative integer id", what, cnt, len, p);
            free(v);
            return 2;
        }
        if (cnt == cap) {
            cap = cap ? cap * 2 : 64;
            int32_t *nv = realloc(v, (size_t)cap * sizeof(int32_t));
            if (!nv) {
                cli_error(cmd, "out of memory reading tokens");
                free(v);
                return 1;
            }
            v = nv;
        }
        v[cnt++] = (int32_t)x;
        p = end;
    }
    if (cnt == 0) {
        cli_error(cmd, "%s: no token ids", what);
        free(v);
        return 2;
    }
    *out = v;
    *n = cnt;
    return 0;
}

/* Read a whole file and parse it with cli_parse_tokens. */
int cli_read_tokens_file(const char *cmd, const char *path, int32_t **out, int32_t *n)
{
    FILE *fp = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    if (!fp) {
        cli_error(cmd, "%s: %s", path, strerror(errno));
        return 2;
    }
    for (;;) {
        if (cap - len < 4096) {
            cap = cap ? cap * 2 : 65536;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                cli_error(cmd, "%s: out of memory", path);
                free(buf);
                fclose(fp);
                return 1;
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) break;
    }
    int err = ferror(fp);
    fclose(fp);
    if (err) {
        cli_error(cmd, "%s: read error", path);
        free(buf);
        return 2;
    }
    buf[len] = '\0';
    if (strlen(buf) != len) {
        cli_error(cmd, "%s: contains a NUL byte; expected token ids", path);
        free(buf);
        return 2;
    }
    int rc = cli_parse_tokens(cmd, path, buf, out, n);
    free(buf);
    return rc;
}

/* Every id inside the vocabulary. */
int cli_check_tokens(const char *cmd, const int32_t *tok, int32_t n, int32_t vocab)
{
    for (int32_t i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= vocab) {
            cli_error(cmd, "token %d (id %d) is outside the vocabulary of %d", i, tok[i], vocab);
            return 2;
        }
    }
    return 0;
}

const char cli_sampling_help[] =
    "  --temperature T   sampling temperature; 0 = greedy (default 0)\n"
    "  --top-k K         keep the K most likely tokens; 0 = off (default 0)\n"
    "  --top-p P         nucleus sampling mass in (0, 1]; 1 = off (default 1)\n"
    "  --seed S          sampler seed, any unsigned 64-bit value (default 0)\n"
    "  --ignore-eos      do not stop at the model's EOS token\n";

/* The sampling flags shared by generate and the services' clients. */
int cli_sampling_opt(const char *cmd, int argc, char **argv, int *i, sampler_params_t *p)
{
    const char *v;
    int r;
    int64_t iv;
    if (!strcmp(argv[*i], "--ignore-eos")) {
        p->ignore_eos = true;
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--temperature", &v))) {
        if (r < 0) return 2;
        return cli_parse_f32(cmd, "--temperature", v, 0.0f, 1e6f, &p->temperature) ? 2 : 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--top-k", &v))) {
        if (r < 0 || cli_parse_i64(cmd, "--top-k", v, 0, INT32_MAX, &iv)) return 2;
        p->top_k = (int32_t)iv;
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--top-p", &v))) {
        if (r < 0 || cli_parse_f32(cmd, "--top-p", v, 0.0f, 1.0f, &p->top_p)) return 2;
        if (p->top_p <= 0.0f) {
            cli_error(cmd, "--top-p: must be greater than 0");
            return 2;
        }
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--seed", &v))) {
        if (r < 0) return 2;
        return cli_parse_u64(cmd, "--seed", v, &p->seed) ? 2 : 1;
    }
    return 0;
}

/* model_load with its one-line error printed. */
int cli_load_model(const char *cmd, model_t *m, const char *dir)
{
    strata_errbuf_t eb;
    eb.msg[0] = '\0';
    int rc = model_load(m, dir, &eb);
    if (rc < 0) {
        if (eb.msg[0])
            cli_error(cmd, "%s", eb.msg);
        else
            cli_error(cmd, "%s: cannot load model: %s", dir, strata_strerror(rc));
        return cli_exit_code(rc);
    }
    return 0;
}

/* The manifest, then the files `ours` names. */
int cli_clear_out(const char *cmd, const char *dir, bool (*ours)(const char *name))
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, PACKED_MANIFEST);
    if (unlink(path) < 0 && errno != ENOENT) {
        cli_error(cmd, "%s: cannot remove: %s", path, strerror(errno));
        return 1;
    }
    DIR *d = opendir(dir);
    if (!d) {
        cli_error(cmd, "%s: cannot open: %s", dir, strerror(errno));
        return 2;
    }
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (!ours(e->d_name)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) < 0) {
            cli_error(cmd, "%s: cannot remove: %s", path, strerror(errno));
            rc = 1;
            break;
        }
    }
    closedir(d);
    return rc;
}

/* tpool_create with a message on failure. */
tpool_t *cli_pool(const char *cmd, int threads)
{
    tpool_t *p = tpool_create(threads);
    if (!p) cli_error(cmd, "cannot start %d threads", threads);
    return p;
}
