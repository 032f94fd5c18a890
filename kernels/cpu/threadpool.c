/* threadpool.c - persistent worker threads with low-latency dispatch.
 *
 * Dispatch protocol. The pool has one job slot (fn, ctx, n, chunk), a claim word and a
 * generation counter `gen`, which is also the futex word. tpool_run fills the slot, resets
 * `done`, stores the claim word (the generation, the job's chunk count, the next chunk: 0)
 * with release, then stores the new `gen`. Workers spin on `gen` for a short while (SPIN_NS),
 * yield the core between looks until the pool's idle spin has passed (if it is longer), and
 * then sleep in futex_wait(gen, seen). Each worker, and the caller, claims chunks by a
 * compare-and-swap of the claim word that holds the generation it woke for, runs them, and
 * counts each in `done`; the caller returns once `done` is the job's chunk count.
 *
 * So a job waits only for the chunks claimed, never for a worker that has not woken yet (one
 * descheduled on a busy machine, or asleep): that worker's late claim finds another
 * generation, or no chunk left, and does nothing. A claim that succeeds is of a chunk the job
 * still waits for, so the slot it reads then is that job's: the caller rewrites the slot only
 * after every chunk is done, and the word it claimed from was stored after the slot.
 *
 * Lost wake-ups: a worker increments `sleepers` and then futex_waits on the generation it
 * has seen; the caller stores the new generation and then reads `sleepers`. Both sides use
 * seq_cst, so either the caller sees the sleeper and wakes it, or futex_wait sees the new
 * generation and returns at once (EAGAIN).
 */
#include "kernels/cpu/threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/strata.h"

#define SPIN_NS 100000 /* spin this long before sleeping: decode issues a job every few us */

/* The claim word: the low 24 bits of the generation, the job's chunk count and the next chunk
 * to claim, 20 bits each (a job has at most 4 chunks a thread, and at most 4096 threads). */
#define CLAIM_BITS 20
#define CLAIM_MASK ((1u << CLAIM_BITS) - 1)
#define GEN_MASK 0xffffffu
#define CLAIM(g, n, k) (((uint64_t)((g) & GEN_MASK) << (2 * CLAIM_BITS)) | ((uint64_t)(n) << CLAIM_BITS) | (uint64_t)(k))
#define CLAIM_GEN(c) ((uint32_t)((c) >> (2 * CLAIM_BITS)) & GEN_MASK)
#define CLAIM_N(c) ((uint32_t)((c) >> CLAIM_BITS) & CLAIM_MASK)
#define CLAIM_NEXT(c) ((uint32_t)(c) & CLAIM_MASK)

struct tpool {
    int n;              /* threads including the caller */
    pthread_t *th;      /* [n - 1] workers */
    int n_started;
    _Atomic int64_t idle_ns;            /* tpool_set_idle_spin: spin, then yield, this long */
    /* job slot, written by the caller before publishing gen */
    tpool_fn_t fn;
    void *ctx;
    int64_t n_items, chunk;
    _Alignas(64) _Atomic uint32_t gen;   /* futex word: job generation */
    _Atomic int sleepers;                /* workers inside futex_wait */
    _Atomic int stop;
    _Alignas(64) _Atomic uint64_t claim; /* CLAIM(generation, chunks, next chunk) */
    _Alignas(64) _Atomic int64_t done;   /* chunks of the current job finished */
    _Atomic int busy;                    /* a tpool_run is in progress (not reentrant) */
};

typedef struct {
    tpool_t *p;
    int tid;
} s_worker_arg_t;

static long s_futex(_Atomic uint32_t *addr, int op, uint32_t val)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, NULL, NULL, 0);
}

static inline void s_pause(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Claim and run chunks of generation g's job until none is left, or the job is another's. */
static void s_work(tpool_t *p, uint32_t g, int tid)
{
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_relaxed);
    for (;;) {
        if (CLAIM_GEN(c) != (g & GEN_MASK) || CLAIM_NEXT(c) >= CLAIM_N(c)) return;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acquire, memory_order_relaxed))
            continue;
        const int64_t n = p->n_items, i0 = (int64_t)CLAIM_NEXT(c) * p->chunk;
        const int64_t i1 = i0 + p->chunk < n ? i0 + p->chunk : n;
        p->fn(p->ctx, i0, i1, tid);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
        c = atomic_load_explicit(&p->claim, memory_order_relaxed);
    }
}

static void *s_worker(void *arg)
{
    s_worker_arg_t a = *(s_worker_arg_t *)arg;
    free(arg);
    tpool_t *p = a.p;
    uint32_t seen = 0;
    for (;;) {
        uint32_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g == seen) {
            const uint64_t t0 = strata_now_ns(), idle = (uint64_t)atomic_load_explicit(&p->idle_ns, memory_order_relaxed);
            bool yield = false;
            for (int i = 1; g == seen; i++) {
                if (yield) sched_yield();
                else s_pause();
                g = atomic_load_explicit(&p->gen, memory_order_acquire);
                if (!yield && (i & 255) != 0) continue;
                const uint64_t dt = strata_now_ns() - t0;
                if (dt > idle) break;
                yield = dt > SPIN_NS;
            }
            if (g == seen) {
                atomic_fetch_add(&p->sleepers, 1);
                s_futex(&p->gen, FUTEX_WAIT_PRIVATE, seen);
                atomic_fetch_sub(&p->sleepers, 1);
                continue;
            }
        }
        seen = g;
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        s_work(p, g, a.tid);
    }
    return NULL;
}

static int s_default_threads(void)
{
    const char *e = getenv("STRATA_THREADS");
    if (e && *e) {
        char *end;
        long v = strtol(e, &end, 10);
        if (*end == 0 && v > 0 && v <= 4096) return (int)v;
        log_warn("STRATA_THREADS=%s is not a thread count in 1..4096; using all cpus", e);
    }
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

tpool_t *tpool_create(int n)
{
    if (n <= 0) n = s_default_threads();
    if (n > 4096) n = 4096; /* the claim word's bound (CLAIM_BITS) */
    tpool_t *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->n = n;
    p->idle_ns = SPIN_NS;
    if (n > 1) {
        p->th = calloc((size_t)n - 1, sizeof(pthread_t));
        if (!p->th) goto fail;
    }
    for (int i = 1; i < n; i++) {
        s_worker_arg_t *a = malloc(sizeof(*a));
        if (!a) goto fail;
        a->p = p;
        a->tid = i;
        int rc = pthread_create(&p->th[i - 1], NULL, s_worker, a);
        if (rc != 0) {
            free(a);
            log_error("pthread_create: %s", strata_strerror(-rc));
            goto fail;
        }
        p->n_started++;
    }
    return p;
fail:
    tpool_destroy(p);
    return NULL;
}

void tpool_destroy(tpool_t *p)
{
    if (!p) return;
    atomic_store(&p->stop, 1);
    atomic_fetch_add(&p->gen, 1);
    s_futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
    for (int i = 0; i < p->n_started; i++) pthread_join(p->th[i], NULL);
    free(p->th);
    free(p);
}

int tpool_size(const tpool_t *p)
{
    return p ? p->n : 1;
}

void tpool_set_idle_spin(tpool_t *p, int64_t ns)
{
    if (p) atomic_store_explicit(&p->idle_ns, ns > SPIN_NS ? ns : SPIN_NS, memory_order_relaxed);
}

void tpool_run(tpool_t *p, int64_t n, int64_t grain, tpool_fn_t fn, void *ctx)
{
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!p || p->n == 1 || n <= grain) {
        fn(ctx, 0, n, 0);
        return;
    }
    STRATA_ASSERT(atomic_exchange(&p->busy, 1) == 0); /* not reentrant */
    /* About 4 chunks per thread balances a core that is busy elsewhere, without making the
     * chunks so small that the per-chunk overhead shows. */
    int64_t chunk = (n + (int64_t)p->n * 4 - 1) / ((int64_t)p->n * 4);
    if (chunk < grain) chunk = grain;
    const int64_t n_chunks = (n + chunk - 1) / chunk;
    STRATA_ASSERT(n_chunks <= (int64_t)CLAIM_MASK);
    p->fn = fn;
    p->ctx = ctx;
    p->n_items = n;
    p->chunk = chunk;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&p->claim, CLAIM(g, n_chunks, 0), memory_order_release); /* publishes the slot */
    atomic_store(&p->gen, g); /* seq_cst: then read sleepers */
    if (atomic_load(&p->sleepers) > 0) s_futex(&p->gen, FUTEX_WAKE_PRIVATE, INT_MAX);
    s_work(p, g, 0);
    for (int i = 1; atomic_load_explicit(&p->done, memory_order_acquire) < n_chunks; i++) {
        s_pause();
        if ((i & 1023) == 0) sched_yield(); /* a worker that claimed a chunk may be descheduled */
    }
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}
