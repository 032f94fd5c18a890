/* ring.c - the executor-prefetcher job ring (see ring.h). */
#include "store/ring.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define RING_AREA_ALIGN 4096u

static inline void s_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t s_round(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/* Payload offsets of the two row areas, after the control block. */
static void s_offsets(const ring_geom_t *g, uint64_t *x_off, uint64_t *y_off, uint64_t *end)
{
    uint64_t area = (uint64_t)g->max_rows * (uint64_t)g->hidden * sizeof(float);
    *x_off = s_round(sizeof(ring_ctl_t), RING_AREA_ALIGN);
    *y_off = s_round(*x_off + area, RING_AREA_ALIGN);
    *end = s_round(*y_off + area, RING_AREA_ALIGN);
}

static uint64_t s_layout_hash(const ring_geom_t *g)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const uint64_t v[5] = {RING_VERSION, sizeof(ring_ctl_t), (uint64_t)g->hidden, (uint64_t)g->max_rows, (uint64_t)g->max_items};
    const uint8_t *b = (const uint8_t *)v;
    for (size_t i = 0; i < sizeof v; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t s_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The futex words live in a MAP_SHARED segment: shared (not _PRIVATE) futex operations. */
static void s_futex_wait(uint32_t *addr, uint32_t val, int timeout_us)
{
    struct timespec ts = {timeout_us / 1000000, (long)(timeout_us % 1000000) * 1000};
    syscall(SYS_futex, addr, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void s_futex_wake(uint32_t *addr) { syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0); }

int ring_shm_name(char *buf, size_t n, const char *ns, int node)
{
    int w = snprintf(buf, n, "/strata-%s-ring-%d", ns, node);
    return (w < 0 || (size_t)w >= n) ? -ENAMETOOLONG : 0;
}

uint64_t ring_bytes(const ring_geom_t *g)
{
    uint64_t x, y, end;
    s_offsets(g, &x, &y, &end);
    return SHM_HEADER_BYTES + end;
}

static int s_check_geom(const ring_geom_t *g, const char *name, strata_errbuf_t *eb)
{
    if (g->hidden <= 0 || g->hidden > (1 << 20) || g->max_rows <= 0 || g->max_rows > (1 << 24) || g->max_items <= 0 ||
        g->max_items > RING_MAX_ITEMS || (uint64_t)g->max_rows * (uint64_t)g->hidden > (1ull << 36))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "ring %s: bad geometry (hidden %d, %d rows, %d items)", name, g->hidden,
                             g->max_rows, g->max_items);
    return 0;
}

/* Point r's fields into its mapped segment and check the control block against g. */
static int s_bind(ring_t *r, const ring_geom_t *g, strata_errbuf_t *eb)
{
    ring_ctl_t *c = (ring_ctl_t *)shm_payload(&r->seg);
    uint64_t x, y, end;
    s_offsets(g, &x, &y, &end);
    if (c->magic != RING_MAGIC || c->version != RING_VERSION || c->geom.hidden != g->hidden ||
        c->geom.max_rows != g->max_rows || c->geom.max_items != g->max_items || c->x_off != x || c->y_off != y ||
        SHM_HEADER_BYTES + end > r->seg.size)
        return strata_seterr(eb, STRATA_EFORMAT, "ring %s: control block does not match its layout", r->seg.name);
    r->ctl = c;
    r->x = (float *)(shm_payload(&r->seg) + x);
    r->y = (float *)(shm_payload(&r->seg) + y);
    return 0;
}

int ring_serve_open(ring_t *r, const char *name, const ring_geom_t *g, int node, int numa_node, strata_errbuf_t *eb)
{
    int rc;
    strata_errbuf_t aeb = {{0}};
    memset(r, 0, sizeof *r);
    if ((rc = s_check_geom(g, name, eb)) < 0) return rc;
    uint64_t hash = s_layout_hash(g);
    rc = shm_attach(&r->seg, name, hash, SHM_WRITE, &aeb);
    if (rc == -EPERM) return strata_seterr(eb, rc, "%s", aeb.msg); /* not ours: neither used nor removed */
    if (rc == 0 && s_bind(r, g, &aeb) == 0) {
        if (r->seg.hdr->owner_pid != getpid() && shm_owner_alive(&r->seg)) {
            pid_t prev = r->seg.hdr->owner_pid;
            shm_detach(&r->seg);
            return strata_seterr(eb, STRATA_EBUSY, "ring %s is served by live pid %d", name, prev);
        }
        shm_take_ownership(&r->seg);
    } else {
        if (rc == 0) shm_detach(&r->seg);
        if (rc != -ENOENT) log_warn("ring %s: %s; making a new one", name, aeb.msg);
        if ((rc = shm_remove(name)) < 0) return strata_seterr(eb, rc, "shm_unlink(%s): %s", name, strata_strerror(rc));
        if ((rc = shm_create(&r->seg, name, ring_bytes(g), hash, numa_node, eb)) < 0) return rc;
        ring_ctl_t *c = (ring_ctl_t *)shm_payload(&r->seg);
        c->magic = RING_MAGIC;
        c->version = RING_VERSION;
        c->node = node;
        c->geom = *g;
        uint64_t end;
        s_offsets(g, &c->x_off, &c->y_off, &end);
        if ((rc = s_bind(r, g, eb)) < 0) {
            shm_detach(&r->seg);
            shm_remove(name);
            return rc;
        }
        shm_publish(&r->seg);
    }
    /* A new generation: jobs posted to the previous server are never answered by this one. Any
     * job still in `req` belongs to it, so it counts as seen. */
    r->gen = __atomic_add_fetch(&r->ctl->gen, 1, __ATOMIC_ACQ_REL);
    r->seen = __atomic_load_n(&r->ctl->req, __ATOMIC_ACQUIRE);
    __atomic_store_n(&r->ctl->pf_pid, (int32_t)getpid(), __ATOMIC_RELEASE);
    ring_beat(r);
    return 0;
}

void ring_beat(ring_t *r) { __atomic_store_n(&r->ctl->heartbeat_ns, s_mono_ns(), __ATOMIC_RELEASE); }

/* Check a job's descriptor against the geometry; 0 or STRATA_EINVAL_INPUT. */
static int s_check_job(const ring_t *r, const ring_job_t *j, const ring_item_t *items)
{
    const ring_geom_t *g = &r->ctl->geom;
    if (j->n_items < 0 || j->n_items > g->max_items || j->n_rows < 0 || j->n_rows > g->max_rows || j->layer < 0 ||
        j->n_hints < 0 || j->n_hints > RING_MAX_HINTS)
        return STRATA_EINVAL_INPUT;
    int64_t rows = 0;
    for (int i = 0; i < j->n_items; i++) {
        const ring_item_t *it = &items[i];
        if (it->expert < 0 || it->n <= 0 || it->row0 < 0 || it->row0 > j->n_rows - it->n) return STRATA_EINVAL_INPUT;
        rows += it->n;
    }
    return rows <= j->n_rows ? 0 : STRATA_EINVAL_INPUT;
}

int ring_serve_wait(ring_t *r, ring_job_t *job, ring_item_t *items, ring_hint_t *hints, int timeout_ms)
{
    uint64_t spin0 = s_mono_ns(), deadline = spin0 + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        ring_beat(r);
        uint32_t req = __atomic_load_n(&r->ctl->req, __ATOMIC_ACQUIRE);
        if (req != r->seen) {
            r->seen = req;
            *job = r->ctl->job;
            if (job->gen != r->gen || (uint32_t)job->seq != req) continue; /* for another server, or torn: not ours */
            int n = job->n_items;
            if (n > 0 && n <= r->ctl->geom.max_items) memcpy(items, r->ctl->items, sizeof(ring_item_t) * (size_t)n);
            if (hints && job->n_hints > 0 && job->n_hints <= RING_MAX_HINTS)
                memcpy(hints, r->ctl->hints, sizeof(ring_hint_t) * (size_t)job->n_hints);
            if (s_check_job(r, job, items) < 0) {
                log_warn("ring %s: job %llu of layer %d does not fit the ring: refused", r->seg.name, (unsigned long long)job->seq,
                         job->layer);
                ring_serve_done(r, job, STRATA_EINVAL_INPUT, 0, 0, "a job that does not fit the ring's geometry");
                continue;
            }
            return 1;
        }
        uint64_t now = s_mono_ns();
        if (now >= deadline) return 0;
        /* the next job comes a MoE layer later: spin that long before the futex, whose wake-up
         * would add its latency to every layer */
        if (now - spin0 < RING_SPIN_US * 1000ull) {
            s_relax();
            continue;
        }
        uint64_t left_us = (deadline - now) / 1000;
        s_futex_wait(&r->ctl->req, req, (int)(left_us < RING_BEAT_MS * 1000u ? left_us : RING_BEAT_MS * 1000u));
    }
}

void ring_serve_done(ring_t *r, const ring_job_t *job, int status, uint64_t compute_ns, uint64_t bytes, const char *error)
{
    ring_ctl_t *c = r->ctl;
    c->res.seq = job->seq;
    c->res.gen = job->gen;
    c->res.status = status;
    c->res.reserved = 0;
    c->res.compute_ns = compute_ns;
    c->res.bytes = bytes;
    snprintf(c->res.error, sizeof c->res.error, "%s", status < 0 && error ? error : "");
    __atomic_add_fetch(status == 0 ? &c->served : &c->failed, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&c->done, (uint32_t)job->seq, __ATOMIC_RELEASE);
    s_futex_wake(&c->done);
    ring_beat(r);
}

int ring_attach(ring_t *r, const char *name, const ring_geom_t *g, strata_errbuf_t *eb)
{
    int rc;
    memset(r, 0, sizeof *r);
    if ((rc = s_check_geom(g, name, eb)) < 0) return rc;
    if ((rc = shm_attach(&r->seg, name, s_layout_hash(g), SHM_WRITE, eb)) < 0) return rc;
    if ((rc = s_bind(r, g, eb)) < 0) {
        shm_detach(&r->seg);
        return rc;
    }
    /* job numbers go on from the ring's last one, so a restarted executor never reuses one */
    r->seq = r->ctl->job.seq;
    return 0;
}

bool ring_peer_up(const ring_t *r, int stale_ms)
{
    int32_t pid = __atomic_load_n(&r->ctl->pf_pid, __ATOMIC_ACQUIRE);
    if (pid <= 0 || (kill(pid, 0) < 0 && errno != EPERM)) return false;
    uint64_t beat = __atomic_load_n(&r->ctl->heartbeat_ns, __ATOMIC_ACQUIRE), now = s_mono_ns();
    return now < beat || now - beat < (uint64_t)stale_ms * 1000000ull;
}

void ring_post(ring_t *r, int32_t layer, int32_t n_items, int32_t n_rows, int32_t act, uint64_t step)
{
    ring_ctl_t *c = r->ctl;
    r->gen = __atomic_load_n(&c->gen, __ATOMIC_ACQUIRE);
    if ((uint32_t)(r->seq + 1) == 0) r->seq++; /* keep the futex word's value non-zero after a wrap */
    r->seq++;
    c->job = (ring_job_t){.seq = r->seq, .gen = r->gen, .step = step, .layer = layer, .n_items = n_items, .n_rows = n_rows,
                          .act = act, .n_hints = r->n_hints};
    r->n_hints = 0;
    __atomic_store_n(&c->req, (uint32_t)r->seq, __ATOMIC_RELEASE);
    s_futex_wake(&c->req);
}

int ring_wait(ring_t *r, int spin_us, int stale_ms, int timeout_ms, ring_result_t *res)
{
    ring_ctl_t *c = r->ctl;
    uint64_t t0 = s_mono_ns(), spin_end = t0 + (uint64_t)spin_us * 1000ull, deadline = t0 + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        uint32_t d = __atomic_load_n(&c->done, __ATOMIC_ACQUIRE);
        if (d == (uint32_t)r->seq) {
            *res = c->res;
            if (res->seq == r->seq && res->gen == r->gen) return res->status;
        }
        uint64_t now = s_mono_ns();
        if (now < spin_end) {
            /* the first RING_PAUSE_US on the core alone, then yielding it between looks */
            if (now - t0 < RING_PAUSE_US * 1000ull) s_relax();
            else sched_yield();
            continue;
        }
        if (__atomic_load_n(&c->gen, __ATOMIC_ACQUIRE) != r->gen) return STRATA_EIO; /* restarted: the job is lost */
        if (!ring_peer_up(r, stale_ms)) return STRATA_EIO;
        if (now >= deadline) return STRATA_ETIMEOUT;
        s_futex_wait(&c->done, d, 1000);
    }
}

void ring_close(ring_t *r)
{
    shm_detach(&r->seg);
    memset(r, 0, sizeof *r);
}
