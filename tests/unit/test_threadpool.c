/* test_threadpool.c - tpool_run covers every item of a job exactly once, with more threads than
 * cores (workers descheduled mid-job, or asleep on the futex when a job comes), jobs back to back
 * of different sizes and grains, and chunks that take long enough for a job to end while some
 * workers have not woken for it yet. */
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/threadpool.h"
#include "tests/unit/check.h"

#define MAX_N 20000

typedef struct {
    _Atomic int hits[MAX_N];
    _Atomic int bad_tid;
    int threads;
    int sleep_every; /* a chunk whose first item is a multiple of this sleeps a little (0: none) */
} job_t;

static void s_mark(void *ctx, int64_t i0, int64_t i1, int tid)
{
    job_t *j = ctx;
    if (tid < 0 || tid >= j->threads) atomic_fetch_add(&j->bad_tid, 1);
    for (int64_t i = i0; i < i1; i++) atomic_fetch_add_explicit(&j->hits[i], 1, memory_order_relaxed);
    if (j->sleep_every && i0 % j->sleep_every == 0) usleep(50);
}

/* One job of n items at grain over pool p: every item once, and every tid in range. */
static void s_job(tpool_t *p, job_t *j, int64_t n, int64_t grain, const char *what)
{
    for (int64_t i = 0; i < n; i++) atomic_store_explicit(&j->hits[i], 0, memory_order_relaxed);
    atomic_store(&j->bad_tid, 0);
    tpool_run(p, n, grain, s_mark, j);
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (atomic_load_explicit(&j->hits[i], memory_order_relaxed) != 1) {
            if (first < 0) first = i;
            wrong++;
        }
    T_CHECK(wrong == 0, "%s: n %lld grain %lld: %lld items not run exactly once (first %lld: %d times)", what,
            (long long)n, (long long)grain, (long long)wrong, (long long)first,
            first >= 0 ? atomic_load(&j->hits[first]) : 0);
    T_CHECK(atomic_load(&j->bad_tid) == 0, "%s: a thread index outside [0, %d)", what, j->threads);
}

int main(void)
{
    uint64_t seed = t_seed();
    static job_t j;
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const int counts[] = {1, 2, 3, (int)(cores > 0 ? cores : 1), (int)(cores > 0 ? 4 * cores : 8)};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        tpool_t *p = tpool_create(counts[c]);
        T_CHECK(p != NULL, "tpool_create(%d)", counts[c]);
        if (!p) continue;
        j.threads = tpool_size(p);
        T_CHECK(j.threads == counts[c], "tpool_size %d, asked %d", j.threads, counts[c]);
        char what[64];
        snprintf(what, sizeof what, "%d threads", counts[c]);
        /* back to back: the workers that spin see each job; sizes around the chunk boundaries */
        for (int r = 0; r < 3000; r++) {
            int64_t n = 1 + (int64_t)(t_rng_next(&seed) % (r % 10 == 0 ? MAX_N : 300));
            int64_t grain = 1 + (int64_t)(t_rng_next(&seed) % 40);
            j.sleep_every = r % 7 == 0 ? 3 : 0;
            s_job(p, &j, n, grain, what);
        }
        /* jobs after the idle spin: the workers sleep on the futex and must be woken */
        for (int r = 0; r < 5; r++) {
            usleep(2000);
            j.sleep_every = 0;
            s_job(p, &j, MAX_N, 1, what);
        }
        /* a longer idle spin (the yielding phase), then jobs that come within it */
        tpool_set_idle_spin(p, 5000000);
        for (int r = 0; r < 200; r++) {
            if (r % 50 == 0) usleep(300);
            s_job(p, &j, 1 + (int64_t)(t_rng_next(&seed) % MAX_N), 4, what);
        }
        tpool_destroy(p);
    }
    /* a NULL pool, or one thread, runs inline with thread index 0 */
    j.threads = 1;
    j.sleep_every = 0;
    s_job(NULL, &j, 1000, 3, "no pool");
    tpool_t *one = tpool_create(1);
    s_job(one, &j, 1000, 3, "one thread");
    tpool_destroy(one);
    return t_done("threadpool");
}
