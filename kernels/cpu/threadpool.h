/* threadpool.h - a fixed pool of worker threads for data-parallel loops. */
#ifndef STRATA_THREADPOOL_H
#define STRATA_THREADPOOL_H

#include <stdint.h>

typedef struct tpool tpool_t;

/* fn(ctx, i0, i1, thread_index): process items [i0, i1). */
typedef void (*tpool_fn_t)(void *ctx, int64_t i0, int64_t i1, int tid);

/* Create a pool of n threads (the caller counts as one; n <= 0 means all online CPUs,
 * or STRATA_THREADS). Returns NULL on failure. */
tpool_t *tpool_create(int n);
void tpool_destroy(tpool_t *p);
int tpool_size(const tpool_t *p);
/* How long an idle worker waits for the next job before it sleeps on the futex (default 100 us,
 * spent spinning): a longer wait yields the core between looks (sched_yield), so a job that
 * comes within it starts without a futex wake-up, and another thread that wants the core gets it. */
void tpool_set_idle_spin(tpool_t *p, int64_t ns);
/* Split [0, n) into chunks of at least `grain` items and run fn over them on all threads;
 * returns when every chunk is done. pool may be NULL (runs inline). Not reentrant. */
void tpool_run(tpool_t *p, int64_t n, int64_t grain, tpool_fn_t fn, void *ctx);

#endif
