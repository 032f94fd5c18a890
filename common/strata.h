/* strata.h - project-wide errors, logging, checks and invariants.
 *
 * Functions return 0 on success or a negative strata_err_t (which includes
 * negative errno values for system errors). strata_strerror() names any of them.
 * Library code never calls exit(); only main() decides to.
 */
#ifndef STRATA_H
#define STRATA_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    STRATA_OK = 0,
    /* Project errors live below -1000 so they never collide with -errno. */
    STRATA_EINVAL_INPUT = -1001, /* bad outside input: file, message, config */
    STRATA_EFORMAT      = -1002, /* malformed file or message */
    STRATA_EUNSUPPORTED = -1003, /* valid but not supported (architecture, field value) */
    STRATA_ENOMEM       = -1004,
    STRATA_EIO          = -1005,
    STRATA_EEXISTS      = -1006,
    STRATA_ECUDA        = -1007,
    STRATA_EZMQ         = -1008,
    STRATA_EBUSY        = -1009,
    STRATA_ETIMEOUT     = -1010,
    STRATA_EVERSION     = -1011, /* protocol or file version mismatch */
    STRATA_ECANCELED    = -1012,
    STRATA_ETOOLARGE    = -1013,
} strata_err_t;

/* Human-readable name of a strata_err_t or a negative errno. */
const char *strata_strerror(int err);

/* Logging. Level from STRATA_LOG=debug|info|warn|error (default info); output to stderr,
 * prefixed with the process role set by log_set_role(). */
typedef enum { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 } log_level_t;
void log_set_role(const char *role);
void log_set_level(log_level_t lvl);
bool log_enabled(log_level_t lvl);
void log_msg(log_level_t lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define log_debug(...) log_msg(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

/* Print a backtrace of the calling thread to stderr. */
void strata_backtrace(void);
/* Report a failed invariant with a backtrace, then abort(). */
void strata_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));

/* Invariants: always on, NDEBUG does not remove them. Never use for outside input. */
#define STRATA_ASSERT(x) do { if (__builtin_expect(!(x), 0)) strata_assert_fail(#x, __FILE__, __LINE__); } while (0)

/* The one generic check: if `failed` (an expression over the result `r`), log the
 * statement with file and line and the error text, then run `action` (return / goto). */
#define STRATA_CHECK_GEN(stmt, rtype, failed, errtext, action)                                  \
    do {                                                                                       \
        rtype r_ = (stmt);                                                                     \
        if (__builtin_expect(failed, 0)) {                                                     \
            log_msg(LOG_ERROR, __FILE__, __LINE__, "%s failed: %s", #stmt, (errtext));         \
            action;                                                                            \
        }                                                                                      \
    } while (0)

/* SYS_CHECK: a libc call returning -1 with errno; on failure `rc = -errno; goto fail`. */
#define SYS_CHECK(stmt)                                                                        \
    do {                                                                                       \
        if (__builtin_expect((stmt) == -1, 0)) {                                               \
            rc = -errno;                                                                       \
            log_msg(LOG_ERROR, __FILE__, __LINE__, "%s failed: %s", #stmt, strata_strerror(rc)); \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

/* CHECK: a strata call returning <0 on error; on failure `rc = r; goto fail`. */
#define CHECK(stmt) STRATA_CHECK_GEN(stmt, int, r_ < 0, strata_strerror(r_), { rc = r_; goto fail; })

/* Error detail for outside input: one clear line naming the file and the field. */
typedef struct {
    char msg[512];
} strata_errbuf_t;
/* Format into eb (if not NULL) and return code; helper for `return strata_seterr(...)`. */
int strata_seterr(strata_errbuf_t *eb, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* A byte count: a non-negative number with an optional binary suffix K, M, G or T, itself
 * optionally followed by "B" or "iB" ("512M", "16GiB", "1.5G"; the result must be whole).
 * Returns 0, -EINVAL (not a byte count) or -ERANGE (over INT64_MAX). */
int strata_parse_bytes(const char *s, int64_t *out);

/* Read the whole regular file path (at most max bytes) into a malloc'd buffer with a NUL after
 * its *len bytes. 0, or <0 with eb naming the file: STRATA_EINVAL_INPUT (cannot open, not a
 * regular file, larger than max), STRATA_EIO (read failed), -ENOMEM. */
int strata_read_file(const char *path, uint64_t max, char **out, size_t *len, strata_errbuf_t *eb);

/* Room for element n of the growable array *pp (a T ** passed as void *) of capacity *cap
 * elements of elem bytes: when n reaches *cap the array is reallocated to twice *cap (first
 * when *cap is 0). 0, or STRATA_ENOMEM with *pp and *cap unchanged. */
int strata_grow(void *pp, size_t *cap, size_t n, size_t elem, size_t first);

/* Monotonic clock in seconds / nanoseconds. */
double strata_now(void);
uint64_t strata_now_ns(void);

/* splitmix64: the next value of the sequence whose state is *x (advances it). Any state,
 * 0 included, gives well-mixed output; seeds other generators and drives simple random tests. */
static inline uint64_t strata_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Percentile q in [0, 1] of v[n], nearest rank (v is sorted in place); NAN if n == 0. */
double strata_percentile(double *v, size_t n, double q);

#ifdef __cplusplus
}
#endif

#endif
