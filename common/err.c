/* err.c - error names, logging, invariant failures, and the small shared helpers of strata.h
 * (byte counts, whole-file reads, clocks). */
#include "common/strata.h"

#include <ctype.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

const char *strata_strerror(int err)
{
    switch (err) {
    case STRATA_OK: return "ok";
    case STRATA_EINVAL_INPUT: return "invalid input";
    case STRATA_EFORMAT: return "malformed data";
    case STRATA_EUNSUPPORTED: return "unsupported";
    case STRATA_ENOMEM: return "out of memory";
    case STRATA_EIO: return "i/o error";
    case STRATA_EEXISTS: return "already exists";
    case STRATA_ECUDA: return "cuda error";
    case STRATA_EZMQ: return "zeromq error";
    case STRATA_EBUSY: return "busy";
    case STRATA_ETIMEOUT: return "timed out";
    case STRATA_EVERSION: return "version mismatch";
    case STRATA_ECANCELED: return "canceled";
    case STRATA_ETOOLARGE: return "too large";
    default: break;
    }
    if (err < 0 && err > -4096) return strerror(-err);
    return "unknown error";
}

static const char *s_role = "strata";
static log_level_t s_level = (log_level_t)-1;

void log_set_role(const char *role) { s_role = role; }
void log_set_level(log_level_t lvl) { s_level = lvl; }

static log_level_t s_get_level(void)
{
    if ((int)s_level < 0) {
        const char *e = getenv("STRATA_LOG");
        s_level = LOG_INFO;
        if (e) {
            if (!strcmp(e, "debug")) s_level = LOG_DEBUG;
            else if (!strcmp(e, "warn")) s_level = LOG_WARN;
            else if (!strcmp(e, "error")) s_level = LOG_ERROR;
        }
    }
    return s_level;
}

bool log_enabled(log_level_t lvl) { return lvl >= s_get_level(); }

void log_msg(log_level_t lvl, const char *file, int line, const char *fmt, ...)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    if (!log_enabled(lvl)) return;
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s[%d] %s: ", s_role, (int)getpid(), names[lvl]);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof buf - 40) n = (int)sizeof buf - 40;
    if (lvl >= LOG_ERROR || s_get_level() == LOG_DEBUG)
        n += snprintf(buf + n, sizeof buf - (size_t)n, " (%s:%d)", file, line);
    buf[n++] = '\n';
    (void)!write(2, buf, (size_t)n);
}

void strata_backtrace(void)
{
    void *frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, 2);
}

void strata_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "%s[%d]: assertion failed: %s (%s:%d)\n", s_role, (int)getpid(), expr, file, line);
    strata_backtrace();
    abort();
}

int strata_seterr(strata_errbuf_t *eb, int code, const char *fmt, ...)
{
    if (eb) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

int strata_parse_bytes(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE) return -ERANGE;
    if (errno || end == s || !(v >= 0) || isspace((unsigned char)*s)) return -EINVAL;
    int shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: break;
    }
    if (shift && (!strcmp(end, "iB") || !strcmp(end, "B"))) end += strlen(end);
    if (*end) return -EINVAL;
    const double b = ldexp(v, shift);
    if (b >= 9223372036854775808.0) return -ERANGE;
    if (b != floor(b)) return -EINVAL;
    *out = (int64_t)b;
    return 0;
}

int strata_read_file(const char *path, uint64_t max, char **out, size_t *len, strata_errbuf_t *eb)
{
    int rc = 0;
    char *buf = NULL;
    struct stat stt;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: cannot open: %s", path, strerror(errno));
    if (fstat(fd, &stt) < 0 || !S_ISREG(stt.st_mode) || (uint64_t)stt.st_size > max) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: not a regular file of at most %" PRIu64 " bytes", path, max);
        goto fail;
    }
    buf = malloc((size_t)stt.st_size + 1);
    if (!buf) {
        rc = -ENOMEM;
        goto fail;
    }
    size_t got = 0;
    while (got < (size_t)stt.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)stt.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = strata_seterr(eb, STRATA_EIO, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "short read");
            goto fail;
        }
        got += (size_t)r;
    }
    buf[got] = 0;
    close(fd);
    *out = buf;
    *len = got;
    return 0;
fail:
    free(buf);
    close(fd);
    return rc;
}

int strata_grow(void *pp, size_t *cap, size_t n, size_t elem, size_t first)
{
    if (n < *cap) return 0;
    const size_t c = *cap ? *cap * 2 : first;
    void *old, *v;
    memcpy(&old, pp, sizeof old);
    if (c <= n || c > SIZE_MAX / elem || !(v = realloc(old, c * elem))) return STRATA_ENOMEM;
    memcpy(pp, &v, sizeof v);
    *cap = c;
    return 0;
}

double strata_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t strata_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int s_cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double strata_percentile(double *v, size_t n, double q)
{
    if (!n) return NAN;
    qsort(v, n, sizeof *v, s_cmp_double);
    size_t k = (size_t)ceil(q * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}
