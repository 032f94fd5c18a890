/* shared_probe.c - the copy loop and the CPU reads at once, over one window (see
 * shared_probe.h). */
#include "bench/shared_probe.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/roofline.h"
#include "common/strata.h"

typedef struct {
    int device;
    size_t bytes;
    volatile int stop, started, failed; /* through __atomic builtins: two threads */
    double copied, seconds;
} s_copier_t;

/* The copy thread: every CUDA call of the loop, open to close, on this one thread. */
static void *s_copier(void *arg)
{
    s_copier_t *c = arg;
    shared_probe_h2d_t *l = NULL;
    if (shared_probe_h2d_open(c->device, c->bytes, &l) < 0 ||
        shared_probe_h2d_run(l, &c->stop, &c->started, &c->copied, &c->seconds) < 0)
        __atomic_store_n(&c->failed, 1, __ATOMIC_RELEASE);
    shared_probe_h2d_close(l);
    __atomic_store_n(&c->started, 1, __ATOMIC_RELEASE); /* also on failure, so the waiter never hangs */
    return NULL;
}

int shared_probe_run(tpool_t *pool, int device, size_t h2d_bytes, size_t cpu_bytes, int windows, double window_s,
                     shared_probe_t *out)
{
    memset(out, 0, sizeof *out);
    cpu_bytes &= ~(size_t)(16 * 1024 - 1);
    void *buf = NULL;
    if (cpu_bytes == 0 || posix_memalign(&buf, 4096, cpu_bytes) != 0) return STRATA_ENOMEM;
    memset(buf, 1, cpu_bytes);
    int rc = 0;
    for (int w = 0; w < windows; w++) {
        s_copier_t c = {.device = device, .bytes = h2d_bytes};
        pthread_t th;
        if (pthread_create(&th, NULL, s_copier, &c) != 0) {
            rc = STRATA_ENOMEM;
            break;
        }
        /* The copies start first (the pinned buffer is allocated and touched in the thread,
         * outside the window); the CPU reads whole passes of its own buffer until the window
         * has passed, then stops the copies, which count only what ended before that. */
        while (!__atomic_load_n(&c.started, __ATOMIC_ACQUIRE)) usleep(100);
        double t0 = strata_now(), t = 0, read = 0;
        if (!__atomic_load_n(&c.failed, __ATOMIC_ACQUIRE))
            do {
                roofline_cpu_read(pool, buf, cpu_bytes);
                read += (double)cpu_bytes;
                t = strata_now() - t0;
            } while (t < window_s);
        __atomic_store_n(&c.stop, 1, __ATOMIC_RELEASE);
        pthread_join(th, NULL);
        if (c.failed || !(c.seconds > 0) || !(t > 0)) {
            rc = STRATA_ECUDA;
            break;
        }
        double h2d = c.copied / c.seconds, cpu = read / t;
        if (h2d + cpu > out->host_bw) {
            out->h2d_bw = h2d;
            out->cpu_bw = cpu;
            out->host_bw = h2d + cpu;
            out->window_s = t;
        }
    }
    free(buf);
    if (rc) memset(out, 0, sizeof *out);
    return rc;
}
