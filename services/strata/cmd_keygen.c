/* cmd_keygen.c - `strata keygen`: a new ZeroMQ CURVE keypair in two Z85 text files, for the
 * router's client endpoint ([router] curve_secret_key_file) and for its clients.
 *
 * Each file is written whole under a temporary name in the same directory (mkstemp: mode 0600
 * from the start, so the secret is never readable by others, not even for a moment), then put
 * in place: without --force by link(2), which fails if the name exists, so an existing key is
 * never replaced; with --force by rename(2). Both names are checked before either file is
 * written, so a refused run leaves nothing behind. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "common/config.h"
#include "services/strata/cli_util.h"

#define C "keygen"

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata keygen [--force] PREFIX\n\n"
            "Write a new ZeroMQ CURVE keypair: PREFIX.key (the public key, mode 0644) and\n"
            "PREFIX.secret (the secret key, mode 0600), each one line of 40 Z85 characters after a\n"
            "'#' comment line. The public key is also printed on stdout.\n\n"
            "For the router: [router] curve_secret_key_file = PREFIX.secret; give PREFIX.key to its\n"
            "clients. For a client: add its PREFIX.key to the router's [router] curve_clients_file\n"
            "(one key a line, then optionally a name), and connect with the router's public key and\n"
            "the client's PREFIX.secret (strata: STRATA_CURVE_SERVER_KEY=FILE and\n"
            "STRATA_CURVE_CLIENT_KEY=FILE; strata bench: --curve-server-key, --curve-client-key).\n\n"
            "  --force   replace PREFIX.key and PREFIX.secret if they exist (else that is an error)\n"
            "  --help    this text\n\n"
            "Exit codes: 0 written, 1 the files could not be written, 2 bad usage or a file exists.\n");
}

/* Write text to a temporary file beside path with mode, then move it to path (link without
 * force: EEXIST if path exists). 0, or the exit code after the printed error. */
static int s_put(const char *path, const char *text, mode_t mode, bool force)
{
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= sizeof tmp) {
        cli_error(C, "%s: path too long", path);
        return 2;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        cli_error(C, "cannot create a file beside %s: %s", path, strerror(errno));
        return 1;
    }
    size_t n = strlen(text);
    bool ok = fchmod(fd, mode) == 0 && write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
    int e = errno;
    if (close(fd) < 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok) {
        if (force) {
            if (rename(tmp, path) == 0) return 0;
        } else if (link(tmp, path) == 0) {
            unlink(tmp);
            return 0;
        }
        e = errno;
    }
    unlink(tmp);
    if (e == EEXIST) {
        cli_error(C, "%s exists; give --force to replace it", path);
        return 2;
    }
    cli_error(C, "cannot write %s: %s", path, strerror(e));
    return 1;
}

int cmd_keygen(int argc, char **argv)
{
    const char *prefix = NULL;
    bool force = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--force")) {
            force = true;
            continue;
        }
        int r = cli_positional(C, argv[i], (const char **const[]){&prefix}, 1, "one PREFIX expected");
        if (r) return r;
    }
    if (!prefix || !prefix[0]) {
        cli_error(C, "give PREFIX: the files written are PREFIX.key and PREFIX.secret (see --help)");
        return 2;
    }
    char pub_path[PATH_MAX], sec_path[PATH_MAX];
    if ((size_t)snprintf(pub_path, sizeof pub_path, "%s.key", prefix) >= sizeof pub_path - 8 ||
        (size_t)snprintf(sec_path, sizeof sec_path, "%s.secret", prefix) >= sizeof sec_path - 8) {
        cli_error(C, "%s: path too long", prefix);
        return 2;
    }
    if (!force) {
        const char *paths[2] = {pub_path, sec_path};
        for (int i = 0; i < 2; i++) {
            struct stat st;
            if (lstat(paths[i], &st) == 0) {
                cli_error(C, "%s exists; give --force to replace it", paths[i]);
                return 2;
            }
        }
    }
    char pub[CONFIG_CURVE_KEY_LEN + 1], sec[CONFIG_CURVE_KEY_LEN + 1];
    if (zmq_curve_keypair(pub, sec) < 0) {
        cli_error(C, "zmq_curve_keypair: %s (libzmq without CURVE?)", zmq_strerror(zmq_errno()));
        return 1;
    }
    char pub_text[160], sec_text[200];
    snprintf(pub_text, sizeof pub_text, "# strata CURVE public key (Z85), written by `strata keygen`\n%s\n", pub);
    snprintf(sec_text, sizeof sec_text, "# strata CURVE secret key (Z85), written by `strata keygen`: keep it to this user\n%s\n", sec);
    int rc = s_put(sec_path, sec_text, 0600, force);
    if (rc == 0 && (rc = s_put(pub_path, pub_text, 0644, force)) != 0 && !force) unlink(sec_path);
    explicit_bzero(sec, sizeof sec);
    explicit_bzero(sec_text, sizeof sec_text);
    if (rc) return rc;
    printf("%s\n", pub);
    fprintf(stderr, "strata keygen: wrote %s (public) and %s (secret, mode 0600)\n", pub_path, sec_path);
    return 0;
}
