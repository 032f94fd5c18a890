/* cmd_tokenize.c - `strata tokenize`: text to token ids (or ids to text) with a tokenizer.json,
 * one output line per input line. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer.h"
#include "services/strata/cli_util.h"

static const char *const C = "tokenize";

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata tokenize PATH [--file TEXT] [--no-special] [--decode [--keep-special] [--stream]]\n"
            "\n"
            "PATH is a tokenizer.json or a model folder holding one (tokenizer_config.json next to it adds\n"
            "BOS/EOS and added tokens). Reads TEXT (default: stdin; '-' is stdin) line by line and prints,\n"
            "for each input line, one line of space-separated token ids, equal to what the Hugging Face\n"
            "`tokenizers` library gives for Tokenizer.from_file(...).encode(line).ids. Lines end at \\n\n"
            "only (a \\r stays part of the line); bytes that are not UTF-8 read as U+FFFD, as Python's\n"
            "errors=\"replace\" reads them.\n"
            "\n"
            "  --file TEXT     input file (default stdin)\n"
            "  --no-special    do not add the special tokens the post-processor adds\n"
            "                  (add_special_tokens=False); with --decode, drop special tokens\n"
            "  --decode        the reverse: each line holds ids, print the decoded text\n"
            "                  (skip_special_tokens=True, the library's default)\n"
            "  --keep-special  with --decode, keep special tokens (skip_special_tokens=False)\n"
            "  --stream        with --decode, decode through the streaming decoder and print each\n"
            "                  piece as soon as it is final (the output is the same)\n"
            "  -h, --help      this help\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure, 2 bad input or usage.\n");
}

/* Parse one line of ids ("1 2 3", commas and tabs also separate). Returns 0 or 2. */
static int s_parse_ids(const char *line, size_t n, size_t lineno, int32_t **ids, size_t *nids, size_t *cap)
{
    *nids = 0;
    size_t i = 0;
    while (i < n) {
        char c = line[i];
        if (c == ' ' || c == '\t' || c == ',' || c == '\r') {
            i++;
            continue;
        }
        if (c < '0' || c > '9') {
            cli_error(C, "line %zu: '%c' is not part of a token id", lineno, c);
            return 2;
        }
        int64_t v = 0;
        while (i < n && line[i] >= '0' && line[i] <= '9') {
            v = v * 10 + (line[i] - '0');
            if (v > INT32_MAX) {
                cli_error(C, "line %zu: token id too large", lineno);
                return 2;
            }
            i++;
        }
        if (strata_grow(ids, cap, *nids, sizeof **ids, 64)) {
            cli_error(C, "out of memory");
            return 1;
        }
        (*ids)[(*nids)++] = (int32_t)v;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv);

int cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL, *file = NULL;
    bool no_special = false, decode = false, keep_special = false, stream = false;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        int r;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = cli_opt(C, argc, argv, &i, "--file", &file))) {
            if (r < 0) return 2;
            continue;
        }
        if (!strcmp(argv[i], "--no-special")) no_special = true;
        else if (!strcmp(argv[i], "--decode")) decode = true;
        else if (!strcmp(argv[i], "--keep-special")) keep_special = true;
        else if (!strcmp(argv[i], "--stream")) stream = true;
        else if (argv[i][0] == '-' && argv[i][1]) {
            cli_error(C, "unknown option '%s' (see --help)", argv[i]);
            return 2;
        } else if (!path) path = argv[i];
        else {
            cli_error(C, "unexpected argument '%s' (see --help)", argv[i]);
            return 2;
        }
    }
    if (!path) {
        s_help(stderr);
        return 2;
    }
    if ((keep_special || stream) && !decode) {
        cli_error(C, "--keep-special and --stream go with --decode");
        return 2;
    }
    cli_quiet_logs();
    tok_t *tok = NULL;
    tok_stream_t *ts = NULL;
    strata_errbuf_t eb = {{0}};
    FILE *in = NULL;
    char *line = NULL;
    size_t linecap = 0, lineno = 0, idcap = 0;
    int32_t *ids = NULL;
    int err = tok_load(&tok, path, &eb);
    if (err) {
        cli_error(C, "%s", eb.msg[0] ? eb.msg : strata_strerror(err));
        return cli_exit_code(err);
    }
    in = (!file || !strcmp(file, "-")) ? stdin : fopen(file, "rb");
    if (!in) {
        cli_error(C, "%s: cannot open: %s", file, strerror(errno));
        rc = 2;
        goto done;
    }
    bool skip = decode && !keep_special;
    if (stream && (err = tok_stream_new(tok, skip, &ts))) {
        cli_error(C, "%s", strata_strerror(err));
        rc = 1;
        goto done;
    }
    ssize_t got;
    while ((got = getline(&line, &linecap, in)) >= 0) {
        size_t n = (size_t)got;
        lineno++;
        if (n && line[n - 1] == '\n') n--;
        if (!decode) {
            int32_t *out = NULL;
            size_t nout = 0;
            if ((err = tok_encode(tok, line, n, !no_special, &out, &nout))) {
                cli_error(C, "line %zu: %s", lineno, strata_strerror(err));
                rc = cli_exit_code(err);
                goto done;
            }
            for (size_t k = 0; k < nout; k++) printf(k ? " %d" : "%d", out[k]);
            putchar('\n');
            free(out);
            continue;
        }
        size_t nids = 0;
        if ((rc = s_parse_ids(line, n, lineno, &ids, &nids, &idcap))) goto done;
        if (ts) {
            const char *piece;
            size_t pn;
            for (size_t k = 0; k <= nids; k++) {
                err = k < nids ? tok_stream_push(ts, ids[k], &piece, &pn) : tok_stream_flush(ts, &piece, &pn);
                if (err) break;
                fwrite(piece, 1, pn, stdout);
                fflush(stdout);
            }
        } else {
            char *text = NULL;
            size_t tn = 0;
            if (!(err = tok_decode(tok, ids, nids, skip, &text, &tn))) fwrite(text, 1, tn, stdout);
            free(text);
        }
        if (err) {
            cli_error(C, "line %zu: %s", lineno, strata_strerror(err));
            rc = 1;
            goto done;
        }
        putchar('\n');
    }
    if (ferror(in)) {
        cli_error(C, "%s: read error", file ? file : "stdin");
        rc = 1;
    }
done:
    if (fflush(stdout) && !rc) rc = 1;
    if (in && in != stdin) fclose(in);
    free(line);
    free(ids);
    tok_stream_free(ts);
    tok_free(tok);
    return rc;
}
