/* check.h - a minimal assertion harness for unit tests.
 * Each CHECK counts; the test exits non-zero if any failed. Randomised tests take their seed
 * from STRATA_SEED (printed at start) so a failure can be replayed. */
#ifndef STRATA_TEST_CHECK_H
#define STRATA_TEST_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "common/strata.h"

static int t_checks, t_failed;

#define T_CHECK(cond, ...)                                                                   \
    do {                                                                                     \
        t_checks++;                                                                          \
        if (!(cond)) {                                                                       \
            t_failed++;                                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                 \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)

/* Seed from STRATA_SEED or the clock; printed so the run can be repeated. */
static inline uint64_t t_seed(void)
{
    const char *e = getenv("STRATA_SEED");
    uint64_t s = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL);
    fprintf(stderr, "seed: STRATA_SEED=%" PRIu64 "\n", s);
    return s;
}

static inline uint64_t t_rng_next(uint64_t *s) { return strata_splitmix64(s); }
/* Uniform in [-1, 1). */
static inline float t_randf(uint64_t *s) { return (float)((t_rng_next(s) >> 40) * (2.0 / 16777216.0) - 1.0); }

/* ||a-b|| / ||b|| */
static inline double t_relerr(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline int t_done(const char *name)
{
    fprintf(stderr, "%s: %d checks, %d failed\n", name, t_checks, t_failed);
    return t_failed ? 1 : 0;
}

#endif
