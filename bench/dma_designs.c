/* dma_designs - who should issue the host-to-device copy of an expert into the executor's
 * expert slots (ARCHITECTURE.md "Who issues the DMA"). Both designs copy from one
 * POSIX-shm weight arena, page-locked with cudaHostRegister, under the same request pattern:
 *
 *   P  a prefetcher process (this binary, --role prefetcher, started with posix_spawn) attaches
 *      the arena read-only and registers it, opens the executor's slot allocation and a pool of
 *      interprocess events through CUDA IPC handles, copies on its own stream, records the
 *      event and replies over a ZeroMQ PAIR socket (ipc://, as the services talk); on the reply
 *      the executor makes its compute stream wait on the event;
 *   E  the executor copies on its own copy stream and records an ordinary event, which its
 *      compute stream waits on (what model/gpu_slots.c does).
 *
 * After the wait, a one-thread kernel on the compute stream reads the copy's last byte and
 * counts it if it is not what the arena holds (so the dependency is real, and checked), then
 * an ordinary event tells the executor the copy is usable. The figures are defined in
 * bench/README.md ("dma_designs").
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "common/service.h"
#include "common/shm.h"
#include "common/strata.h"
#include "kernels/cuda/cuda_ipc.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/probe.h"

#define DMAB_MAGIC 0x42414d44u            /* "DMAB" in little-endian bytes */
#define DMAB_VERSION 1u
#define DMAB_ALIGN (2ull << 20)           /* experts in the arena, slots on the GPU: 2 MiB-aligned */
#define DMAB_MAX_INFLIGHT 64              /* events in the pool: the most copies in flight */
#define DMAB_MISSES 8                     /* copies of the miss test */
#define DMAB_HBM_BYTES (1ull << 30)       /* what each --hbm-load pass (one finite kernel) reads once */
#define DMAB_HBM_DEPTH 2                  /* --hbm-load passes enqueued and unfinished at a time */
#define DMAB_HBM_STOP_MS 5000             /* wait for the last passes after the test */
#define DMAB_START_S 30                   /* seconds the prefetcher may take to attach and register */
#define DMAB_STALL_S 20                   /* seconds without a finished copy before a test fails */
/* Mixtral-8x7B int4 g32: gate, up and down of 14336 x 4096, nibbles plus an fp16 scale a group */
#define DMAB_MIXTRAL_EXPERT (3ull * 14336 * 4096 / 2 + 3ull * 14336 * 4096 / 32 * 2)

/* ---- messages between the two roles ----------------------------------------------------- */

/* Every message starts with this. Both ends are this binary on one host, so the structs travel
 * as they are in memory; a receiver checks magic, version, type and the exact size. */
typedef struct {
    uint32_t magic;   /* DMAB_MAGIC */
    uint16_t version; /* DMAB_VERSION */
    uint16_t type;    /* dmab_type_t */
} dmab_hdr_t;

typedef enum {
    DMAB_SETUP = 1, /* executor -> prefetcher: dmab_setup_t, the first message */
    DMAB_READY,     /* prefetcher -> executor: attached, registered, handles open (header only) */
    DMAB_COPY,      /* executor -> prefetcher: dmab_copy_t */
    DMAB_DONE,      /* prefetcher -> executor: the dmab_copy_t back; its copy and event record are enqueued */
    DMAB_STOP,      /* executor -> prefetcher: close everything, exit 0 (header only) */
    DMAB_ERROR,     /* prefetcher -> executor: dmab_error_t, then it exits 1 */
} dmab_type_t;

typedef struct {
    dmab_hdr_t h;
    uint32_t expert;   /* arena expert index */
    uint32_t slot;     /* slot index */
    uint32_t event;    /* pool index of the event to record after the copy */
    uint32_t reserved;
    uint64_t id;       /* copy number */
    uint64_t bytes;    /* the expert's first `bytes` go to the slot's start, 1..expert_bytes */
} dmab_copy_t;

typedef struct {
    dmab_hdr_t h;
    uint32_t n_events;                   /* handles used in events[] */
    uint32_t n_slots;
    uint64_t n_experts;                  /* in the arena */
    uint64_t expert_bytes;               /* bytes of one expert */
    uint64_t slot_stride;                /* bytes between slots (DMAB_ALIGN multiple) */
    char arena[SHM_NAME_MAX];            /* shm name, NUL-terminated */
    cuda_ipc_handle_t slots;             /* the slot allocation, [n_slots][slot_stride] bytes */
    cuda_ipc_handle_t events[DMAB_MAX_INFLIGHT];
} dmab_setup_t;

typedef struct {
    dmab_hdr_t h;
    char text[256];                      /* NUL-terminated */
} dmab_error_t;

typedef union {
    dmab_hdr_t h;
    dmab_copy_t copy;
    dmab_setup_t setup;
    dmab_error_t err;
} dmab_msg_t;

static void s_hdr(dmab_hdr_t *h, dmab_type_t t)
{
    h->magic = DMAB_MAGIC;
    h->version = DMAB_VERSION;
    h->type = (uint16_t)t;
}

static size_t s_msg_size(int type)
{
    switch (type) {
    case DMAB_SETUP: return sizeof(dmab_setup_t);
    case DMAB_COPY:
    case DMAB_DONE: return sizeof(dmab_copy_t);
    case DMAB_ERROR: return sizeof(dmab_error_t);
    case DMAB_READY:
    case DMAB_STOP: return sizeof(dmab_hdr_t);
    default: return 0;
    }
}

/* Send len bytes of m as one frame, never blocking: a PAIR socket blocks when its peer is gone,
 * and no more than DMAB_MAX_INFLIGHT + 1 messages are ever queued, far below the high-water
 * mark. 0 or STRATA_EZMQ (logged; EAGAIN: the peer is gone). */
static int s_send(void *sock, const void *m, size_t len)
{
    if (zmq_send(sock, m, len, ZMQ_DONTWAIT) == (int)len) return 0;
    log_error("zmq_send: %s", zmq_strerror(zmq_errno()));
    return STRATA_EZMQ;
}

/* Receive one message without waiting. Returns its type after the checks, 0 if none was there
 * (or interrupted), STRATA_EFORMAT for a malformed one, STRATA_EZMQ on a socket error. */
static int s_recv(void *sock, dmab_msg_t *m)
{
    int n = zmq_recv(sock, m, sizeof *m, ZMQ_DONTWAIT);
    if (n < 0) {
        if (zmq_errno() == EAGAIN || zmq_errno() == EINTR) return 0;
        log_error("zmq_recv: %s", zmq_strerror(zmq_errno()));
        return STRATA_EZMQ;
    }
    if ((size_t)n < sizeof m->h || m->h.magic != DMAB_MAGIC || m->h.version != DMAB_VERSION ||
        (size_t)n != s_msg_size(m->h.type)) {
        log_error("malformed message (%d bytes, type %u)", n, (size_t)n < sizeof m->h ? 0u : m->h.type);
        return STRATA_EFORMAT;
    }
    if (m->h.type == DMAB_ERROR) m->err.text[sizeof m->err.text - 1] = 0;
    return m->h.type;
}

/* s_recv after waiting up to ms for something to arrive. */
static int s_recv_wait(void *sock, dmab_msg_t *m, long ms)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, ms) < 0 && zmq_errno() != EINTR) {
        log_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
        return STRATA_EZMQ;
    }
    return it.revents & ZMQ_POLLIN ? s_recv(sock, m) : 0;
}

/* A PAIR socket with no linger, bound (bind) or connected to ep. NULL on failure (logged). */
static void *s_socket(void *zctx, const char *ep, bool bind)
{
    int zero = 0;
    void *s = zmq_socket(zctx, ZMQ_PAIR);
    if (s && zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) == 0 &&
        (bind ? zmq_bind(s, ep) : zmq_connect(s, ep)) == 0)
        return s;
    log_error("%s %s: %s", bind ? "bind" : "connect", ep, zmq_strerror(zmq_errno()));
    if (s) zmq_close(s);
    return NULL;
}

/* ---- the arena ---------------------------------------------------------------------------- */

static uint64_t s_round(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Expert e starts at segment offset DMAB_ALIGN + e * stride (the shm header sits in the first
 * 2 MiB), so every expert is 2 MiB-aligned in memory too (shm.h). */
static uint64_t s_arena_bytes(uint64_t n_experts, uint64_t expert_bytes)
{
    return DMAB_ALIGN + n_experts * s_round(expert_bytes, DMAB_ALIGN);
}

static const uint8_t *s_arena_expert(const shm_seg_t *a, uint64_t e, uint64_t expert_bytes)
{
    return a->base + DMAB_ALIGN + e * s_round(expert_bytes, DMAB_ALIGN);
}

/* Every byte of expert e: never 0 (the value of a cleared slot), and different for experts
 * next to each other, so a read that beats its copy sees another value. */
static uint8_t s_pattern(uint64_t e) { return (uint8_t)(1 + e * 97 % 255); }

/* The arena's shm layout hash: the format version and what it holds (FNV-1a). */
static uint64_t s_layout_hash(uint64_t n_experts, uint64_t expert_bytes)
{
    const uint64_t v[3] = {DMAB_VERSION, n_experts, expert_bytes};
    const uint8_t *p = (const uint8_t *)v;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof v; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ---- the prefetcher role ------------------------------------------------------------------ */

typedef struct {
    dmab_setup_t s;                          /* as received and checked */
    cuda_ctx_t *cx;                          /* copies on its CUDA_STREAM_COPY */
    shm_seg_t arena;                         /* read-only */
    bool registered;
    uint8_t *slots;                          /* the executor's slot allocation, mapped here */
    cuda_event_t *ev[DMAB_MAX_INFLIGHT];     /* the executor's interprocess events, opened */
} pf_t;

static void s_pf_usage(FILE *f)
{
    fprintf(f,
            "usage: dma_designs --role prefetcher --endpoint EP [--device D]\n\n"
            "The prefetcher side of design P; dma_designs starts it itself (posix_spawn). It connects a\n"
            "ZeroMQ PAIR socket to EP, takes the arena's shm name and the CUDA IPC handles of the\n"
            "executor's slots and events from the first message, attaches the arena read-only and\n"
            "registers it, then copies experts into the slots on request until told to stop.\n\n"
            "  --endpoint EP  the executor's socket (ipc://...)\n"
            "  --device D     CUDA device (default 0)\n"
            "  -h, --help     this help\n\n"
            "Exit codes: 0 stopped by the executor, 1 a failure, 2 bad usage.\n");
}

/* Check a setup message: what the executor sent is outside input here. 0 or
 * STRATA_EINVAL_INPUT with eb filled. */
static int s_pf_check(const dmab_setup_t *s, strata_errbuf_t *eb)
{
    const char *bad = NULL;
    if (s->n_events < 1 || s->n_events > DMAB_MAX_INFLIGHT) bad = "event count";
    else if (s->n_slots < 1 || s->n_experts < 1 || s->n_experts > UINT32_MAX) bad = "slot or expert count";
    else if (s->expert_bytes < 1 || s->expert_bytes > (1ull << 40) || s->slot_stride < s->expert_bytes) bad = "sizes";
    else if (!memchr(s->arena, 0, sizeof s->arena)) bad = "arena name";
    return bad ? strata_seterr(eb, STRATA_EINVAL_INPUT, "setup message: bad %s", bad) : 0;
}

/* Attach and register the arena, open the slot and event handles of setup s. 0, or <0 with
 * eb filled (s_pf_close undoes what was done). */
static int s_pf_open(pf_t *p, const dmab_setup_t *s, int device, strata_errbuf_t *eb)
{
    int rc;
    p->s = *s;
    if ((rc = s_pf_check(s, eb))) return rc;
    if ((rc = shm_attach(&p->arena, s->arena, s_layout_hash(s->n_experts, s->expert_bytes), 0, eb))) return rc;
    if (p->arena.size < s_arena_bytes(s->n_experts, s->expert_bytes))
        return strata_seterr(eb, STRATA_EFORMAT, "shm %s: %zu bytes, too small for the setup", s->arena, p->arena.size);
    strata_seterr(eb, STRATA_ECUDA, "CUDA set-up failed (see the prefetcher's log)");
    CHECK(cuda_ctx_create(&p->cx, device));
    CHECK(cuda_host_register(p->arena.base, p->arena.size));
    p->registered = true;
    CHECK(cuda_ipc_mem_open(&s->slots, (void **)&p->slots));
    for (uint32_t i = 0; i < s->n_events; i++) CHECK(cuda_ipc_event_open(&s->events[i], &p->ev[i]));
    return 0;
fail:
    return rc;
}

static void s_pf_close(pf_t *p)
{
    if (p->slots) cuda_ipc_mem_close(p->slots); /* waits for copies still in flight */
    for (int i = 0; i < DMAB_MAX_INFLIGHT; i++) cuda_event_destroy(p->ev[i]);
    if (p->registered) cuda_host_unregister(p->arena.base);
    shm_detach(&p->arena);
    cuda_ctx_destroy(p->cx);
}

static void s_pf_error(void *sock, const char *text)
{
    dmab_error_t e = {{0}};
    s_hdr(&e.h, DMAB_ERROR);
    snprintf(e.text, sizeof e.text, "%s", text);
    (void)s_send(sock, &e, sizeof e);
}

/* One request: check it, enqueue the copy and the event record, reply with it. */
static int s_pf_copy(pf_t *p, void *sock, dmab_copy_t *m)
{
    const dmab_setup_t *s = &p->s;
    int rc;
    if (m->expert >= s->n_experts || m->slot >= s->n_slots || m->event >= s->n_events || m->bytes < 1 ||
        m->bytes > s->expert_bytes) {
        log_error("copy %llu: expert %u, slot %u, event %u or %llu bytes out of range", (unsigned long long)m->id,
                  m->expert, m->slot, m->event, (unsigned long long)m->bytes);
        return STRATA_EINVAL_INPUT;
    }
    if ((rc = cuda_h2d_async(p->cx, CUDA_STREAM_COPY, p->slots + m->slot * s->slot_stride,
                             s_arena_expert(&p->arena, m->expert, s->expert_bytes), m->bytes)) ||
        (rc = cuda_event_record(p->cx, p->ev[m->event], CUDA_STREAM_COPY)))
        return rc;
    s_hdr(&m->h, DMAB_DONE);
    return s_send(sock, m, sizeof *m);
}

/* Serve copy requests until STOP (0), a signal (0) or a failure (<0, reported to the executor). */
static int s_pf_serve(pf_t *p, void *sock, volatile sig_atomic_t *stop, pid_t ppid)
{
    dmab_msg_t m;
    while (!*stop) {
        int t = s_recv_wait(sock, &m, 200);
        if (t == DMAB_STOP) return 0;
        if (t == 0 && getppid() != ppid) {
            log_error("the executor (pid %d) is gone", (int)ppid);
            return STRATA_EIO;
        }
        if (t == 0) continue;
        int rc = t == DMAB_COPY ? s_pf_copy(p, sock, &m.copy) : t < 0 ? t : STRATA_EFORMAT;
        if (rc) {
            s_pf_error(sock, "copy request failed (see the prefetcher's log)");
            return rc;
        }
    }
    return 0;
}

/* Wait for the setup message: 1 (in m), 0 stopped, <0 (timeout, parent gone, socket). */
static int s_pf_setup_msg(void *sock, dmab_msg_t *m, volatile sig_atomic_t *stop, pid_t ppid)
{
    const uint64_t deadline = strata_now_ns() + DMAB_START_S * 1000000000ull;
    while (!*stop) {
        int t = s_recv_wait(sock, m, 200);
        if (t == DMAB_SETUP) return 1;
        if (t == DMAB_STOP) return 0;
        if (t != 0) return t < 0 ? t : STRATA_EFORMAT;
        if (getppid() != ppid || strata_now_ns() > deadline) {
            log_error("no setup message from the executor (pid %d)", (int)ppid);
            return STRATA_ETIMEOUT;
        }
    }
    return 0;
}

/* Parse the prefetcher's arguments: SERVICE_RUN, SERVICE_EXIT_OK (--help) or SERVICE_EXIT_CONFIG. */
static int s_pf_args(int argc, char **argv, const char **ep, int *device)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *e = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            s_pf_usage(stdout);
            return SERVICE_EXIT_OK;
        } else if (v && !strcmp(a, "--role")) {
            i++;
        } else if (v && !strcmp(a, "--endpoint")) {
            *ep = argv[++i];
        } else if (v && !strcmp(a, "--device")) {
            long d = strtol(v, &e, 10);
            if (*e || e == v || d < 0 || d > 1023) {
                fprintf(stderr, "dma_designs: --device '%s': want a device number\n", v);
                return SERVICE_EXIT_CONFIG;
            }
            *device = (int)d;
            i++;
        } else {
            fprintf(stderr, "dma_designs --role prefetcher: unexpected argument '%s' (see --help)\n", a);
            return SERVICE_EXIT_CONFIG;
        }
    }
    if (*ep) return SERVICE_RUN;
    fprintf(stderr, "dma_designs --role prefetcher: --endpoint is required\n");
    return SERVICE_EXIT_CONFIG;
}

static int s_prefetcher_main(int argc, char **argv)
{
    const char *ep = NULL;
    int device = 0, rc = s_pf_args(argc, argv, &ep, &device);
    if (rc != SERVICE_RUN) return rc;
    log_set_role("dma_designs/prefetcher");
    volatile sig_atomic_t *stop = service_signals();
    const pid_t ppid = getppid();
    void *zctx = zmq_ctx_new(), *sock = zctx ? s_socket(zctx, ep, false) : NULL;
    dmab_msg_t m;
    pf_t p = {0};
    strata_errbuf_t eb = {{0}};
    rc = sock ? s_pf_setup_msg(sock, &m, stop, ppid) : STRATA_EZMQ;
    if (rc == 1) {
        rc = s_pf_open(&p, &m.setup, device, &eb);
        if (rc) {
            log_error("%s", eb.msg);
            s_pf_error(sock, eb.msg);
        } else {
            s_hdr(&m.h, DMAB_READY);
            rc = s_send(sock, &m.h, sizeof m.h);
        }
        if (!rc) rc = s_pf_serve(&p, sock, stop, ppid);
    }
    s_pf_close(&p);
    if (sock) zmq_close(sock);
    if (zctx) zmq_ctx_term(zctx);
    return rc < 0 ? SERVICE_EXIT_FAIL : SERVICE_EXIT_OK;
}

/* ---- the executor role: options ------------------------------------------------------------ */

typedef struct {
    int64_t expert_bytes, experts, slots, copies, small_bytes, small_copies, inflight, seed, device;
    bool hbm_load;
    const char *json;
} opts_t;

static const struct {
    const char *flag;
    bool bytes; /* a byte count with K/M/G suffixes */
    int64_t lo, hi;
    size_t off; /* of the int64_t in opts_t */
} s_flags[] = {
    {"--expert-bytes", true, 1, 64ll << 30, offsetof(opts_t, expert_bytes)},
    {"--experts", false, 1, 4096, offsetof(opts_t, experts)},
    {"--slots", false, 1, 4096, offsetof(opts_t, slots)},
    {"--copies", false, 1, 1 << 24, offsetof(opts_t, copies)},
    {"--small-bytes", true, 1, 64ll << 30, offsetof(opts_t, small_bytes)},
    {"--small-copies", false, 1, 1 << 24, offsetof(opts_t, small_copies)},
    {"--inflight", false, 1, DMAB_MAX_INFLIGHT, offsetof(opts_t, inflight)},
    {"--seed", false, 0, INT64_MAX, offsetof(opts_t, seed)},
    {"--device", false, 0, 1023, offsetof(opts_t, device)},
};

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: dma_designs [--expert-bytes B] [--experts N] [--slots S] [--copies K] [--small-bytes B]\n"
            "                   [--small-copies K2] [--inflight F] [--hbm-load] [--seed N] [--device D]\n"
            "                   [--json FILE]\n"
            "       dma_designs --role prefetcher --help   (the process dma_designs starts for design P)\n\n"
            "Who should issue the host->GPU copy of an expert into the executor's slots:\n"
            "  P  a prefetcher process, through CUDA IPC handles of the slots and of interprocess events,\n"
            "     saying over ZeroMQ (ipc://) when each copy is enqueued;\n"
            "  E  the executor itself, on its copy stream.\n"
            "Both copy from one registered POSIX-shm arena with the same requests (seeded random experts,\n"
            "round-robin slots). Per design: bulk GB/s, small-copy latency, miss time, next to the pinned\n"
            "host->GPU bandwidth measured in the same run. A line on stdout as each test ends, a table at\n"
            "the end; --json FILE too, also after a failed test (with what was measured before it).\n\n"
            "  --expert-bytes B   bytes of an expert, K/M/G suffixes (default %llu: Mixtral-8x7B int4 g32)\n"
            "  --experts N        experts in the arena (default 16)\n"
            "  --slots S          expert slots on the GPU, at least F (default 4)\n"
            "  --copies K         expert copies of the bulk test (default 64)\n"
            "  --small-bytes B    bytes of a latency-test copy, at most an expert (default 64K)\n"
            "  --small-copies K2  copies of the latency test, one at a time (default 2000)\n"
            "  --inflight F       most copies in flight in the bulk test, 1-%d (default 2, as the\n"
            "                     executor's GPU_MAX_INFLIGHT)\n"
            "  --hbm-load         the bulk test again while kernels read GPU memory beside it (1 GiB\n"
            "                     passes, %d enqueued at a time)\n"
            "  --seed N           seed of the expert choice (default 1)\n"
            "  --device D         CUDA device (default 0)\n"
            "  --json FILE        also write the figures there\n"
            "  -h, --help         this help\n\n"
            "Exit codes: 0 done, 1 no GPU or a failure (also: a read beat its copy), 2 bad usage.\n",
            (unsigned long long)DMAB_MIXTRAL_EXPERT, DMAB_MAX_INFLIGHT, DMAB_HBM_DEPTH);
}

/* Parse the value v of s_flags[k] into o. 0, or SERVICE_EXIT_CONFIG after one line naming it. */
static int s_flag_value(opts_t *o, int k, const char *v)
{
    int64_t x = 0;
    char *e = NULL;
    bool ok;
    if (s_flags[k].bytes) {
        ok = strata_parse_bytes(v, &x) == 0;
    } else {
        errno = 0;
        x = strtoll(v, &e, 10);
        ok = errno == 0 && e != v && !*e;
    }
    if (ok && x >= s_flags[k].lo && x <= s_flags[k].hi) {
        *(int64_t *)((char *)o + s_flags[k].off) = x;
        return 0;
    }
    fprintf(stderr, "dma_designs: %s '%s': want %s in %lld..%lld\n", s_flags[k].flag, v,
            s_flags[k].bytes ? "a byte count" : "a whole number", (long long)s_flags[k].lo, (long long)s_flags[k].hi);
    return SERVICE_EXIT_CONFIG;
}

/* One argument at argv[*i] (its value, if any, consumed). 0 or SERVICE_EXIT_CONFIG. */
static int s_arg(opts_t *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--hbm-load")) {
        o->hbm_load = true;
        return 0;
    }
    bool valued = !strcmp(a, "--json") || !strcmp(a, "--role");
    int k = -1;
    for (size_t j = 0; j < sizeof s_flags / sizeof s_flags[0]; j++)
        if (!strcmp(a, s_flags[j].flag)) k = (int)j;
    if (!valued && k < 0) {
        fprintf(stderr, "dma_designs: unexpected argument '%s' (see --help)\n", a);
        return SERVICE_EXIT_CONFIG;
    }
    if (!v) {
        fprintf(stderr, "dma_designs: %s needs a value\n", a);
        return SERVICE_EXIT_CONFIG;
    }
    (*i)++;
    if (!strcmp(a, "--json")) o->json = v;
    return k >= 0 ? s_flag_value(o, k, v) : 0; /* --role: main has read it */
}

/* SERVICE_RUN, SERVICE_EXIT_OK (--help) or SERVICE_EXIT_CONFIG. */
static int s_args(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.expert_bytes = (int64_t)DMAB_MIXTRAL_EXPERT, .experts = 16, .slots = 4, .copies = 64,
                  .small_bytes = 64 << 10, .small_copies = 2000, .inflight = 2, .seed = 1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_usage(stdout);
            return SERVICE_EXIT_OK;
        }
        if (s_arg(o, argc, argv, &i)) return SERVICE_EXIT_CONFIG;
    }
    if (o->slots < o->inflight) {
        fprintf(stderr, "dma_designs: --slots %lld: want at least --inflight (%lld)\n", (long long)o->slots,
                (long long)o->inflight);
        return SERVICE_EXIT_CONFIG;
    }
    if (o->small_bytes > o->expert_bytes) {
        fprintf(stderr, "dma_designs: --small-bytes %lld: want at most --expert-bytes (%lld)\n",
                (long long)o->small_bytes, (long long)o->expert_bytes);
        return SERVICE_EXIT_CONFIG;
    }
    return SERVICE_RUN;
}

/* ---- the executor role: set-up and tear-down ---------------------------------------------- */

typedef struct {
    opts_t o;
    volatile sig_atomic_t *stop;            /* SIGINT / SIGTERM */
    char host[128], gpu[128];
    size_t gpu_mem;                         /* bytes */
    double bound;                           /* pinned host->GPU bytes/s, cuda_probe_h2d */
    shm_seg_t arena;                        /* [DMAB_ALIGN][experts][2 MiB-rounded expert_bytes], s_pattern(e) */
    bool registered;                        /* the arena is page-locked in this process too (design E) */
    cuda_ctx_t *cx;
    uint8_t *slots;                         /* [slots][setup.slot_stride] device bytes */
    unsigned *bad;                          /* device: touch kernels that read a byte their copy had not written */
    cuda_event_t *ipc_ev[DMAB_MAX_INFLIGHT];  /* P: interprocess; the prefetcher records, the compute stream waits */
    cuda_event_t *copy_ev[DMAB_MAX_INFLIGHT]; /* E: recorded on the copy stream after a copy */
    cuda_event_t *done_ev[DMAB_MAX_INFLIGHT]; /* both: recorded on the compute stream after the touch kernel */
    dmab_setup_t setup;                     /* what the prefetcher is sent */
    void *zctx, *sock;
    pid_t child;                            /* the prefetcher; 0 once reaped, or never started */
    bool hung;                              /* a test failed: its GPU work may never finish */
    char err[448];                          /* why the current step failed, where known better than its code */
} bench_t;

/* Create and fill the arena: expert e's bytes all s_pattern(e). */
static int s_arena_create(bench_t *b)
{
    const opts_t *o = &b->o;
    char name[SHM_NAME_MAX];
    strata_errbuf_t eb = {{0}};
    snprintf(name, sizeof name, "/strata-dmabench-%d-arena-0", (int)getpid());
    int rc = shm_create(&b->arena, name, s_arena_bytes((uint64_t)o->experts, (uint64_t)o->expert_bytes),
                        s_layout_hash((uint64_t)o->experts, (uint64_t)o->expert_bytes), -1, &eb);
    if (rc) {
        log_error("%s", eb.msg);
        return rc;
    }
    for (int64_t e = 0; e < o->experts; e++) {
        if (*b->stop) return STRATA_ECANCELED;
        memset((uint8_t *)s_arena_expert(&b->arena, (uint64_t)e, (uint64_t)o->expert_bytes), s_pattern((uint64_t)e),
               (size_t)o->expert_bytes);
    }
    shm_publish(&b->arena);
    return 0;
}

/* The context, the slots, the counter and the event pools; fills the setup message's handles. */
static int s_gpu_open(bench_t *b)
{
    const opts_t *o = &b->o;
    dmab_setup_t *s = &b->setup;
    int rc;
    s_hdr(&s->h, DMAB_SETUP);
    s->n_events = (uint32_t)o->inflight;
    s->n_slots = (uint32_t)o->slots;
    s->n_experts = (uint64_t)o->experts;
    s->expert_bytes = (uint64_t)o->expert_bytes;
    s->slot_stride = s_round((uint64_t)o->expert_bytes, DMAB_ALIGN); /* 2 MiB multiples: see cuda_ipc_mem_export */
    snprintf(s->arena, sizeof s->arena, "%s", b->arena.name);
    CHECK(cuda_ctx_create(&b->cx, (int)o->device));
    CHECK(cuda_malloc((void **)&b->slots, s->slot_stride * s->n_slots));
    CHECK(cuda_ipc_mem_export(b->slots, &s->slots));
    CHECK(cuda_malloc((void **)&b->bad, sizeof *b->bad));
    for (int i = 0; i < o->inflight; i++) {
        CHECK(cuda_ipc_event_create(&b->ipc_ev[i], &s->events[i]));
        CHECK(cuda_event_create(&b->copy_ev[i]));
        CHECK(cuda_event_create(&b->done_ev[i]));
    }
    return 0;
fail:
    return rc;
}

/* Whether the prefetcher has exited (reaped now if so; an exit is logged). */
static bool s_child_gone(bench_t *b)
{
    int st = 0;
    if (b->child <= 0) return true;
    pid_t p = waitpid(b->child, &st, WNOHANG);
    if (p == 0 || (p < 0 && errno == EINTR)) return false;
    if (p == b->child && WIFEXITED(st)) log_error("the prefetcher (pid %d) exited with %d", (int)p, WEXITSTATUS(st));
    else if (p == b->child) log_error("the prefetcher (pid %d) was killed by signal %d", (int)p, WTERMSIG(st));
    b->child = 0;
    return true;
}

/* Reap the prefetcher within ms milliseconds (ms < 0: however long it takes). */
static void s_child_reap(bench_t *b, int ms)
{
    for (int t = 0; b->child > 0; t += 10) {
        int st;
        pid_t p = waitpid(b->child, &st, ms < 0 ? 0 : WNOHANG);
        if (p == b->child || (p < 0 && errno != EINTR)) b->child = 0;
        else if (ms >= 0 && t >= ms) return;
        else if (p == 0) usleep(10000);
    }
}

/* Ask the prefetcher to stop and reap it: SIGTERM after 5 s, SIGKILL after 2 more (after a
 * failed test, 1 s and 0.5 s: its CUDA tear-down may wait for ever). */
static void s_child_stop(bench_t *b)
{
    static const int sig[3] = {0, SIGTERM, SIGKILL}, wait_ms[2][3] = {{5000, 2000, -1}, {1000, 500, -1}};
    const int *ms = wait_ms[b->hung];
    dmab_hdr_t h;
    if (b->child <= 0) return;
    s_hdr(&h, DMAB_STOP);
    (void)zmq_send(b->sock, &h, sizeof h, ZMQ_DONTWAIT);
    for (int i = 0; i < 3 && b->child > 0; i++) {
        if (sig[i]) kill(b->child, sig[i]);
        s_child_reap(b, ms[i]);
    }
}

/* 0 while there is time left to wait for the prefetcher; <0 when not (logged). */
static int s_child_wait(bench_t *b, uint64_t deadline_ns, const char *what)
{
    if (*b->stop) return STRATA_ECANCELED;
    if (s_child_gone(b)) return STRATA_EIO;
    if (strata_now_ns() < deadline_ns) return 0;
    log_error("the prefetcher did not %s within %d s", what, DMAB_START_S);
    return STRATA_ETIMEOUT;
}

/* Send the setup message once the prefetcher has connected (a PAIR socket refuses to queue
 * before), then wait for READY. */
static int s_child_handshake(bench_t *b)
{
    const uint64_t deadline = strata_now_ns() + DMAB_START_S * 1000000000ull;
    dmab_msg_t m;
    int rc;
    while (zmq_send(b->sock, &b->setup, sizeof b->setup, ZMQ_DONTWAIT) < 0) {
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) {
            log_error("zmq_send: %s", zmq_strerror(zmq_errno()));
            return STRATA_EZMQ;
        }
        if ((rc = s_child_wait(b, deadline, "connect"))) return rc;
        usleep(10000);
    }
    for (;;) {
        int t = s_recv_wait(b->sock, &m, 100);
        if (t == DMAB_READY) return 0;
        if (t == DMAB_ERROR) log_error("prefetcher: %s", m.err.text);
        if (t != 0) return t < 0 ? t : STRATA_EIO;
        if ((rc = s_child_wait(b, deadline, "attach the arena and open the handles"))) return rc;
    }
}

/* Bind the socket, start the prefetcher (posix_spawn of this binary: no fork of a process with
 * CUDA state) and hand it the setup. */
static int s_child_start(bench_t *b)
{
    char ep[64], dev[16];
    snprintf(ep, sizeof ep, "ipc://@strata-dmabench-%d", (int)getpid()); /* abstract: no socket file to remove */
    snprintf(dev, sizeof dev, "%lld", (long long)b->o.device);
    if (!(b->zctx = zmq_ctx_new()) || !(b->sock = s_socket(b->zctx, ep, true))) return STRATA_EZMQ;
    char *argv[] = {"dma_designs", "--role", "prefetcher", "--endpoint", ep, "--device", dev, NULL};
    int e = posix_spawn(&b->child, "/proc/self/exe", NULL, NULL, argv, environ);
    if (e) {
        b->child = 0;
        log_error("posix_spawn(/proc/self/exe): %s", strerror(e));
        return -e;
    }
    return s_child_handshake(b);
}

static int s_open(bench_t *b)
{
    const opts_t *o = &b->o;
    const size_t probe = (size_t)(o->expert_bytes < (1ll << 30) ? o->expert_bytes : 1ll << 30);
    int rc;
    gethostname(b->host, sizeof b->host - 1);
    CHECK(cuda_probe_device((int)o->device, b->gpu, sizeof b->gpu, &b->gpu_mem));
    CHECK(cuda_probe_h2d((int)o->device, probe, 5, &b->bound));
    CHECK(s_arena_create(b));
    CHECK(s_gpu_open(b));
    CHECK(s_child_start(b));
    /* The prefetcher has attached: drop the name now, so that the segment goes with the last
     * mapping even if this process is killed (the mappings stay valid). */
    shm_remove(b->arena.name);
    CHECK(cuda_host_register(b->arena.base, b->arena.size));
    b->registered = true;
    return 0;
fail:
    return rc;
}

/* Undo s_open, whatever it reached. The prefetcher goes first: it must close the event and
 * memory handles before they are destroyed here. After a failed test the GPU side is left to
 * the process exit: every release below may wait for work that never finishes. */
static void s_close(bench_t *b)
{
    s_child_stop(b);
    if (b->sock) zmq_close(b->sock);
    if (b->zctx) zmq_ctx_term(b->zctx);
    if (b->hung) {
        if (b->arena.base) shm_remove(b->arena.name);
        return;
    }
    if (b->cx) (void)cuda_sync(b->cx);
    for (int i = 0; i < DMAB_MAX_INFLIGHT; i++) {
        cuda_event_destroy(b->ipc_ev[i]);
        cuda_event_destroy(b->copy_ev[i]);
        cuda_event_destroy(b->done_ev[i]);
    }
    cuda_free(b->bad);
    cuda_free(b->slots);
    if (b->registered) cuda_host_unregister(b->arena.base);
    if (b->arena.base) shm_remove(b->arena.name);
    shm_detach(&b->arena);
    cuda_ctx_destroy(b->cx);
}

/* ---- the executor role: copies ------------------------------------------------------------- */

typedef enum { DESIGN_E, DESIGN_P } design_t;
static const char *const s_design_name[2] = {"executor", "prefetcher"};

/* The tests, in the order each design runs them (every T_LOAD last, after both designs' others:
 * a failure under load loses nothing measured before). */
typedef enum { T_WARMUP, T_BULK, T_LATENCY, T_MISS, T_LOAD, T_N } test_t;
static const char *const s_test_key[T_N] = {"warmup", "bulk", "latency", "miss", "bulk_hbm_load"};
static const char *const s_test_label[T_N] = {"warm-up", "bulk", "latency", "miss", "bulk under HBM load"};

/* One test: n copies of the first `bytes` of random experts into round-robin slots, at most
 * `inflight` at a time. */
typedef struct {
    design_t d;
    test_t t;
    int64_t n, inflight;
    uint64_t bytes;
    uint64_t rng;          /* expert choice state, seeded with --seed: the same requests for both designs */
    double *lat_us;        /* [n] per copy: issue to the executor seeing the touch kernel done; or NULL */
    cuda_ipc_load_t *load; /* T_LOAD: pumped while the copies run */
    double wall_s;         /* out: first issue to last completion */
} run_t;

/* A copy in flight. Its index in the pool names its events (ipc_ev / copy_ev / done_ev). */
typedef struct {
    enum { CP_FREE, CP_ASKED, CP_QUEUED } state; /* ASKED: P, request sent, no reply yet */
    int64_t k;                                   /* copy number in the run */
    uint32_t expert, slot;
    uint64_t t0_ns;
} copy_t;

static uint8_t *s_slot(const bench_t *b, uint32_t s) { return b->slots + s * b->setup.slot_stride; }

/* The compute-stream side of a copy whose data is ready after `ready`: wait on it, read the
 * copy's last byte, record the done event. */
static int s_queue(bench_t *b, const run_t *r, copy_t *c, cuda_event_t *ready, int ev)
{
    int rc;
    if ((rc = cuda_stream_wait_event(b->cx, CUDA_STREAM_COMPUTE, ready)) ||
        (rc = cuda_ipc_touch(b->cx, s_slot(b, c->slot) + r->bytes - 1, s_pattern(c->expert), b->bad)) ||
        (rc = cuda_event_record(b->cx, b->done_ev[ev], CUDA_STREAM_COMPUTE)))
        return rc;
    c->state = CP_QUEUED;
    return 0;
}

/* Start copy k in pool entry ev. Slot reuse is safe: copies finish in issue order (one copy
 * stream, one compute stream, replies in order), so when copy k is issued the ones still in
 * flight are among k-F+1..k-1, none of them in slot k % S as F <= S. */
static int s_issue(bench_t *b, run_t *r, copy_t *c, int ev, int64_t k)
{
    const opts_t *o = &b->o;
    int rc;
    *c = (copy_t){.k = k, .expert = (uint32_t)(strata_splitmix64(&r->rng) % (uint64_t)o->experts),
                  .slot = (uint32_t)(k % o->slots), .t0_ns = strata_now_ns()};
    if (r->d == DESIGN_P) {
        dmab_copy_t m = {.expert = c->expert, .slot = c->slot, .event = (uint32_t)ev, .id = (uint64_t)k,
                         .bytes = r->bytes};
        s_hdr(&m.h, DMAB_COPY);
        c->state = CP_ASKED;
        return s_send(b->sock, &m, sizeof m);
    }
    if ((rc = cuda_h2d_async(b->cx, CUDA_STREAM_COPY, s_slot(b, c->slot),
                             s_arena_expert(&b->arena, c->expert, (uint64_t)o->expert_bytes), r->bytes)) ||
        (rc = cuda_event_record(b->cx, b->copy_ev[ev], CUDA_STREAM_COPY)))
        return rc;
    return s_queue(b, r, c, b->copy_ev[ev], ev);
}

/* P: take every reply that has come (without waiting) and queue its compute side. */
static int s_replies(bench_t *b, run_t *r, copy_t *cp)
{
    dmab_msg_t m;
    int t, rc;
    while ((t = s_recv(b->sock, &m)) > 0) {
        if (t == DMAB_ERROR) {
            log_error("prefetcher: %s", m.err.text);
            snprintf(b->err, sizeof b->err, "the prefetcher failed: %s", m.err.text);
            return STRATA_EIO;
        }
        const uint32_t ev = m.copy.event;
        if (t != DMAB_DONE || ev >= (uint32_t)r->inflight || cp[ev].state != CP_ASKED ||
            m.copy.id != (uint64_t)cp[ev].k) {
            log_error("unexpected message from the prefetcher (type %d)", t);
            return STRATA_EFORMAT;
        }
        if ((rc = s_queue(b, r, &cp[ev], b->ipc_ev[ev], (int)ev))) return rc;
    }
    return t;
}

/* Retire every queued copy whose done event has completed. How many, or <0. */
static int s_retire(bench_t *b, run_t *r, copy_t *cp)
{
    int got = 0;
    for (int i = 0; i < r->inflight; i++) {
        if (cp[i].state != CP_QUEUED) continue;
        int d = cuda_event_done(b->done_ev[i]);
        if (d < 0) return d;
        if (!d) continue;
        if (r->lat_us) r->lat_us[cp[i].k] = (double)(strata_now_ns() - cp[i].t0_ns) * 1e-3;
        cp[i].state = CP_FREE;
        got++;
    }
    return got;
}

/* Say in b->err what the copies still in flight wait for: a reply from the prefetcher, the copy
 * itself (its event on the copy stream), or the compute stream's wait and touch kernel after a
 * complete copy; and how far the HBM load got. */
static void s_stall_why(bench_t *b, const run_t *r, const copy_t *cp, int64_t done)
{
    int n[4] = {0}; /* asked, copying, touching, unreadable */
    const char *const what[4] = {"copy request(s) the prefetcher has not answered",
                                 r->d == DESIGN_P ? "copy(ies) not complete on the prefetcher's copy stream"
                                                  : "copy(ies) not complete on the executor's copy stream",
                                 "compute-stream wait(s) + touch kernel(s) not done after a complete copy",
                                 "copy(ies) whose state could not be read"};
    size_t at;
    for (int i = 0; i < r->inflight; i++) {
        if (cp[i].state == CP_ASKED) n[0]++;
        if (cp[i].state != CP_QUEUED) continue;
        const int d = cuda_event_done(r->d == DESIGN_P ? b->ipc_ev[i] : b->copy_ev[i]);
        n[d < 0 ? 3 : d ? 2 : 1]++;
    }
    at = (size_t)snprintf(b->err, sizeof b->err, "no copy finished in %d s (%lld of %lld done); waiting for", DMAB_STALL_S,
                          (long long)done, (long long)r->n);
    for (int k = 0, first = 1; k < 4 && at < sizeof b->err; k++) {
        if (!n[k]) continue;
        at += (size_t)snprintf(b->err + at, sizeof b->err - at, "%s %d %s", first ? ":" : ",", n[k], what[k]);
        first = 0;
    }
    if (r->load && at < sizeof b->err) {
        long long issued, finished;
        cuda_ipc_load_count(r->load, &issued, &finished);
        snprintf(b->err + at, sizeof b->err - at, "; the HBM load: %lld passes finished, %lld enqueued and unfinished",
                 finished, issued - finished);
    }
}

/* 0 while copies may still finish; <0 (b->err set) if the prefetcher died or nothing finished
 * for DMAB_STALL_S. Looked at only after 100 ms without a finished copy (a waitpid every spin
 * would slow the loop). */
static int s_stalled(bench_t *b, const run_t *r, const copy_t *cp, int64_t done, uint64_t last_ns)
{
    const uint64_t idle = strata_now_ns() - last_ns;
    if (idle < 100000000ull) return 0;
    if (s_child_gone(b)) {
        snprintf(b->err, sizeof b->err, "the prefetcher process exited (%lld of %lld copies done)", (long long)done,
                 (long long)r->n);
        return STRATA_EIO;
    }
    if (idle < DMAB_STALL_S * 1000000000ull) return 0;
    s_stall_why(b, r, cp, done);
    return STRATA_ETIMEOUT;
}

/* Run r, spinning (both designs alike): issue while fewer than r->inflight are out, take the
 * prefetcher's replies, retire finished copies, keep the HBM load's passes coming. */
static int s_run(bench_t *b, run_t *r)
{
    copy_t cp[DMAB_MAX_INFLIGHT] = {{0}};
    int64_t issued = 0, done = 0;
    const uint64_t t0 = strata_now_ns();
    uint64_t last = t0;
    int rc;
    while (done < r->n) {
        if (*b->stop) {
            snprintf(b->err, sizeof b->err, "interrupted");
            return STRATA_ECANCELED;
        }
        if (r->load && (rc = cuda_ipc_load_pump(r->load))) return rc;
        for (int i = 0; i < r->inflight && issued < r->n; i++)
            if (cp[i].state == CP_FREE && (rc = s_issue(b, r, &cp[i], i, issued++))) return rc;
        if (r->d == DESIGN_P && (rc = s_replies(b, r, cp)) < 0) return rc;
        if ((rc = s_retire(b, r, cp)) < 0) return rc;
        done += rc;
        if (rc > 0) last = strata_now_ns();
        else if ((rc = s_stalled(b, r, cp, done, last))) return rc;
    }
    r->wall_s = (double)(strata_now_ns() - t0) * 1e-9;
    return 0;
}

/* ---- the executor role: figures ------------------------------------------------------------ */

typedef struct {
    bool ok[T_N];                       /* measured */
    double bulk_gbs, bulk_s;            /* expert bytes / wall, 1e9 bytes/s; the wall */
    double load_bulk_gbs, load_s;       /* --hbm-load: bulk GB/s; the load's GPU time, first pass to last */
    double load_hbm_gbs;                /* what the load's kernels counted they read / load_s */
    long long load_passes;
    double lat_p50_us, lat_p99_us, lat_mean_us;
    double miss_ms;                     /* mean of DMAB_MISSES */
    unsigned bad;                       /* touch kernels that read a byte their copy had not written */
    test_t failed;                      /* T_N: none */
    char error[512];                    /* "<test>: why", when one failed */
} figures_t;

static double s_mean(const double *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return n ? s / (double)n : 0;
}

/* p50, p99 (nearest rank) and mean of v[n], sorted here. */
static void s_latency(double *v, int64_t n, figures_t *f)
{
    f->lat_p50_us = strata_percentile(v, (size_t)n, 0.50);
    f->lat_p99_us = strata_percentile(v, (size_t)n, 0.99);
    f->lat_mean_us = s_mean(v, n);
}

static run_t s_run_of(const bench_t *b, design_t d, test_t t, int64_t n, uint64_t bytes, int64_t inflight, double *lat)
{
    return (run_t){.d = d, .t = t, .n = n, .inflight = inflight, .bytes = bytes, .rng = (uint64_t)b->o.seed,
                   .lat_us = lat};
}

/* The bulk test while finite kernels read device memory beside it, DMAB_HBM_DEPTH enqueued at
 * a time: the first ones before the first copy, the rest as s_run pumps. */
static int s_bulk_loaded(bench_t *b, run_t *r, figures_t *f)
{
    cuda_ipc_load_t *l = NULL;
    double bytes = 0, secs = 0;
    long long passes = 0;
    int rc = cuda_ipc_load_create((int)b->o.device, DMAB_HBM_BYTES, DMAB_HBM_DEPTH, &l);
    if (rc) return rc;
    r->load = l;
    if (!(rc = cuda_ipc_load_pump(l))) rc = s_run(b, r);
    const int rs = cuda_ipc_load_stop(l, DMAB_HBM_STOP_MS, &bytes, &secs, &passes);
    if (rs == STRATA_ETIMEOUT && !rc)
        snprintf(b->err, sizeof b->err, "the HBM load's kernels did not finish within %d ms of the test's end",
                 DMAB_HBM_STOP_MS);
    if (rc || rs) return rc ? rc : rs;
    f->load_bulk_gbs = (double)r->n * (double)r->bytes / r->wall_s / 1e9;
    f->load_hbm_gbs = secs > 0 ? bytes / secs / 1e9 : 0;
    f->load_s = secs;
    f->load_passes = passes;
    return 0;
}

/* Test t's copies, its figures into f. */
static int s_test_run(bench_t *b, design_t d, test_t t, figures_t *f, double *lat)
{
    const opts_t *o = &b->o;
    const uint64_t eb = (uint64_t)o->expert_bytes;
    run_t r;
    int rc;
    switch (t) {
    case T_WARMUP: /* every slot once */
        r = s_run_of(b, d, t, o->slots, eb, o->inflight, NULL);
        return s_run(b, &r);
    case T_BULK:
        r = s_run_of(b, d, t, o->copies, eb, o->inflight, NULL);
        if ((rc = s_run(b, &r))) return rc;
        f->bulk_gbs = (double)r.n * (double)eb / r.wall_s / 1e9;
        f->bulk_s = r.wall_s;
        return 0;
    case T_LOAD:
        r = s_run_of(b, d, t, o->copies, eb, o->inflight, NULL);
        return s_bulk_loaded(b, &r, f);
    case T_LATENCY:
        r = s_run_of(b, d, t, o->small_copies, (uint64_t)o->small_bytes, 1, lat);
        if ((rc = s_run(b, &r))) return rc;
        s_latency(lat, r.n, f);
        return 0;
    case T_MISS:
        r = s_run_of(b, d, t, DMAB_MISSES, eb, 1, lat);
        if ((rc = s_run(b, &r))) return rc;
        f->miss_ms = s_mean(lat, DMAB_MISSES) * 1e-3;
        return 0;
    default: return STRATA_EINVAL_INPUT;
    }
}

/* Test t's line on stdout, flushed at once. */
static void s_test_line(const bench_t *b, design_t d, test_t t, const figures_t *f, unsigned bad)
{
    const opts_t *o = &b->o;
    const double bound = b->bound / 1e9;
    char v[320];
    switch (t) {
    case T_BULK:
        snprintf(v, sizeof v, "%.2f GB/s, %.3f of the bound (%lld x %lld bytes in %.3f s)", f->bulk_gbs,
                 f->bulk_gbs / bound, (long long)o->copies, (long long)o->expert_bytes, f->bulk_s);
        break;
    case T_LOAD:
        snprintf(v, sizeof v, "%.2f GB/s, %.3f of the bound; the load read %.1f GB/s (%lld passes of %llu MiB in %.3f s)",
                 f->load_bulk_gbs, f->load_bulk_gbs / bound, f->load_hbm_gbs, f->load_passes, DMAB_HBM_BYTES >> 20,
                 f->load_s);
        break;
    case T_LATENCY:
        snprintf(v, sizeof v, "p50 %.1f us, p99 %.1f us, mean %.1f us (%lld x %lld bytes, one at a time)", f->lat_p50_us,
                 f->lat_p99_us, f->lat_mean_us, (long long)o->small_copies, (long long)o->small_bytes);
        break;
    case T_MISS: snprintf(v, sizeof v, "%.3f ms (mean of %d experts, one at a time)", f->miss_ms, DMAB_MISSES); break;
    default: snprintf(v, sizeof v, "done (%lld copies)", (long long)o->slots); break;
    }
    printf("%-10s %-20s %s", s_design_name[d], s_test_label[t], v);
    if (bad) printf("; %u reads beat their copy", bad);
    printf("\n");
    fflush(stdout);
}

/* Run test t of design d on cleared slots and counter, add its order violations to f->bad,
 * print its line. On failure, f->failed and f->error say which and why (also on stdout). */
static int s_test(bench_t *b, design_t d, test_t t, figures_t *f, double *lat)
{
    unsigned bad = 0;
    int rc;
    b->err[0] = 0;
    if (!(rc = cuda_memset(b->cx, b->slots, 0, b->setup.slot_stride * b->setup.n_slots)) &&
        !(rc = cuda_memset(b->cx, b->bad, 0, sizeof *b->bad)) && !(rc = cuda_sync(b->cx)) &&
        !(rc = s_test_run(b, d, t, f, lat)))
        rc = cuda_d2h(b->cx, &bad, b->bad, sizeof bad);
    if (rc) {
        b->hung = true; /* copies may be left in flight, waiting on a prefetcher that is stuck or gone */
        f->failed = t;
        snprintf(f->error, sizeof f->error, "%s: %s", s_test_label[t],
                 b->err[0] ? b->err : rc == STRATA_ECANCELED ? "interrupted" : strata_strerror(rc));
        printf("%-10s %-20s FAILED: %s\n", s_design_name[d], s_test_label[t], f->error + strlen(s_test_label[t]) + 2);
        fflush(stdout);
        return rc;
    }
    f->ok[t] = true;
    f->bad += bad;
    if (t != T_WARMUP || bad) s_test_line(b, d, t, f, bad);
    return 0;
}

/* Every test of both designs, stopping at the first failure; the loaded bulk tests last. */
static int s_measure(bench_t *b, figures_t f[2])
{
    static const test_t plain[] = {T_WARMUP, T_BULK, T_LATENCY, T_MISS};
    const opts_t *o = &b->o;
    double *lat = calloc((size_t)(o->small_copies > DMAB_MISSES ? o->small_copies : DMAB_MISSES), sizeof *lat);
    int rc = 0;
    if (!lat) return STRATA_ENOMEM;
    for (int d = 0; d < 2 && !rc; d++)
        for (size_t i = 0; i < sizeof plain / sizeof plain[0] && !rc; i++) rc = s_test(b, (design_t)d, plain[i], &f[d], lat);
    for (int d = 0; d < 2 && !rc && o->hbm_load; d++) rc = s_test(b, (design_t)d, T_LOAD, &f[d], lat);
    free(lat);
    return rc;
}

/* ---- the executor role: report ------------------------------------------------------------- */

/* Which design wins test t (higher bulk GB/s or lower miss time), or NULL unless both measured it. */
static const char *s_winner(const figures_t f[2], test_t t)
{
    if (!f[DESIGN_E].ok[t] || !f[DESIGN_P].ok[t]) return NULL;
    return s_design_name[t == T_MISS ? f[DESIGN_P].miss_ms < f[DESIGN_E].miss_ms
                                     : f[DESIGN_P].bulk_gbs > f[DESIGN_E].bulk_gbs];
}

/* "executor", "prefetcher" (wins both bulk GB/s and miss time), "mixed", or NULL if either is
 * missing. */
static const char *s_faster(const figures_t f[2], const char **bulk, const char **miss)
{
    *bulk = s_winner(f, T_BULK);
    *miss = s_winner(f, T_MISS);
    return !*bulk || !*miss ? NULL : *bulk == *miss ? *bulk : "mixed";
}

static void s_header(const bench_t *b)
{
    const opts_t *o = &b->o;
    printf("dma_designs on %s, %s (device %lld): expert %lld bytes, %lld in the arena, %lld slots, "
           "%lld in flight, seed %lld\n", b->host, b->gpu, (long long)o->device, (long long)o->expert_bytes,
           (long long)o->experts, (long long)o->slots, (long long)o->inflight, (long long)o->seed);
    printf("pinned host->GPU bound (cuda_probe_h2d): %.2f GB/s\n\n", b->bound / 1e9);
    fflush(stdout);
}

/* A table row: e and p of test t (T_N: always measured), "failed" or "-" where not measured. */
static void s_row(const char *label, const figures_t f[2], test_t t, double e, double p, int prec)
{
    char c[2][32];
    for (int d = 0; d < 2; d++) {
        if (t == T_N || f[d].ok[t]) snprintf(c[d], sizeof c[d], "%.*f", prec, d ? p : e);
        else snprintf(c[d], sizeof c[d], "%s", f[d].failed == t ? "failed" : "-");
    }
    printf("%-44s %14s %14s\n", label, c[0], c[1]);
}

static void s_table(const bench_t *b, const figures_t f[2])
{
    const opts_t *o = &b->o;
    const double bound = b->bound / 1e9;
    const char *fb, *fm, *fast = s_faster(f, &fb, &fm);
    char l[128];
    printf("\n%-44s %14s %14s\n", "", "executor (E)", "prefetcher (P)");
    snprintf(l, sizeof l, "bulk GB/s (%lld experts)", (long long)o->copies);
    s_row(l, f, T_BULK, f[0].bulk_gbs, f[1].bulk_gbs, 2);
    s_row("  / bound", f, T_BULK, f[0].bulk_gbs / bound, f[1].bulk_gbs / bound, 3);
    if (o->hbm_load) {
        s_row("bulk GB/s under HBM load", f, T_LOAD, f[0].load_bulk_gbs, f[1].load_bulk_gbs, 2);
        s_row("  / bound", f, T_LOAD, f[0].load_bulk_gbs / bound, f[1].load_bulk_gbs / bound, 3);
        s_row("  HBM GB/s read by the load kernels", f, T_LOAD, f[0].load_hbm_gbs, f[1].load_hbm_gbs, 1);
    }
    snprintf(l, sizeof l, "latency p50 us (%lld x %lld bytes)", (long long)o->small_copies, (long long)o->small_bytes);
    s_row(l, f, T_LATENCY, f[0].lat_p50_us, f[1].lat_p50_us, 1);
    s_row("latency p99 us", f, T_LATENCY, f[0].lat_p99_us, f[1].lat_p99_us, 1);
    s_row("latency mean us", f, T_LATENCY, f[0].lat_mean_us, f[1].lat_mean_us, 1);
    snprintf(l, sizeof l, "miss ms (mean of %d experts)", DMAB_MISSES);
    s_row(l, f, T_MISS, f[0].miss_ms, f[1].miss_ms, 3);
    s_row("reads that beat their copy (tests run)", f, T_N, f[0].bad, f[1].bad, 0);
    if (fast) printf("\nfaster: %s (bulk: %s, miss: %s)\n", fast, fb, fm);
    else printf("\nfaster: not known (bulk: %s, miss: %s)\n", fb ? fb : "-", fm ? fm : "-");
    fflush(stdout);
}

/* v if test t was measured, else null. */
static json_t *s_jnum(const figures_t *f, test_t t, double v) { return f->ok[t] ? json_real(v) : json_null(); }

static json_t *s_figures_json(const bench_t *b, const figures_t *f)
{
    const double bound = b->bound / 1e9;
    json_t *j = json_object();
    if (!j) return NULL;
    json_object_set_new(j, "bulk_gb_s", s_jnum(f, T_BULK, f->bulk_gbs));
    json_object_set_new(j, "bulk_ratio", s_jnum(f, T_BULK, f->bulk_gbs / bound));
    json_object_set_new(j, "latency_p50_us", s_jnum(f, T_LATENCY, f->lat_p50_us));
    json_object_set_new(j, "latency_p99_us", s_jnum(f, T_LATENCY, f->lat_p99_us));
    json_object_set_new(j, "latency_mean_us", s_jnum(f, T_LATENCY, f->lat_mean_us));
    json_object_set_new(j, "miss_ms", s_jnum(f, T_MISS, f->miss_ms));
    json_object_set_new(j, "order_violations", json_integer((json_int_t)f->bad));
    json_object_set_new(j, "hbm_load_bulk_gb_s", s_jnum(f, T_LOAD, f->load_bulk_gbs));
    json_object_set_new(j, "hbm_load_bulk_ratio", s_jnum(f, T_LOAD, f->load_bulk_gbs / bound));
    json_object_set_new(j, "hbm_load_read_gb_s", s_jnum(f, T_LOAD, f->load_hbm_gbs));
    json_object_set_new(j, "hbm_load_passes", f->ok[T_LOAD] ? json_integer(f->load_passes) : json_null());
    json_object_set_new(j, "failed_test", f->failed < T_N ? json_string(s_test_key[f->failed]) : json_null());
    json_object_set_new(j, "error", f->failed < T_N ? json_string(f->error) : json_null());
    return j;
}

/* The JSON report: whatever was measured, null for the rest; error says what failed (null if
 * nothing did). */
static int s_json(const bench_t *b, const figures_t f[2], const char *error)
{
    const opts_t *o = &b->o;
    const char *fb, *fm, *fast = s_faster(f, &fb, &fm);
    json_t *j = json_pack("{s:{s:s,s:s,s:I,s:I},s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:b,s:I,s:o,s:{s:o,s:o},s:o,s:o,s:o,"
                          "s:o}",
                          "machine", "hostname", b->host, "gpu", b->gpu, "gpu_mem", (json_int_t)b->gpu_mem, "device",
                          (json_int_t)o->device, "expert_bytes", (json_int_t)o->expert_bytes, "experts",
                          (json_int_t)o->experts, "slots", (json_int_t)o->slots, "copies", (json_int_t)o->copies,
                          "small_bytes", (json_int_t)o->small_bytes, "small_copies", (json_int_t)o->small_copies,
                          "inflight", (json_int_t)o->inflight, "seed", (json_int_t)o->seed, "hbm_load", o->hbm_load,
                          "hbm_load_pass_bytes", (json_int_t)DMAB_HBM_BYTES, "bound_h2d_gb_s",
                          b->bound > 0 ? json_real(b->bound / 1e9) : json_null(), "designs", "executor",
                          s_figures_json(b, &f[DESIGN_E]), "prefetcher", s_figures_json(b, &f[DESIGN_P]), "faster",
                          fast ? json_string(fast) : json_null(), "faster_bulk", fb ? json_string(fb) : json_null(),
                          "faster_miss", fm ? json_string(fm) : json_null(), "error",
                          error ? json_string(error) : json_null());
    int rc = j && json_dump_file(j, o->json, JSON_INDENT(2)) == 0 ? 0 : STRATA_EIO;
    if (rc) fprintf(stderr, "dma_designs: --json %s: cannot write it\n", o->json);
    json_decref(j);
    return rc;
}

static int s_executor_main(int argc, char **argv)
{
    bench_t b = {0};
    figures_t f[2] = {{.failed = T_N}, {.failed = T_N}};
    char error[600] = "";
    int rc = s_args(argc, argv, &b.o);
    if (rc != SERVICE_RUN) return rc;
    log_set_role("dma_designs");
    const int n = cuda_device_count();
    if (n <= 0) {
        fprintf(stderr, "dma_designs: no CUDA device (the CUDA runtime sees none)\n");
        return SERVICE_EXIT_FAIL;
    }
    if (b.o.device >= n) {
        fprintf(stderr, "dma_designs: --device %lld: there are %d CUDA devices\n", (long long)b.o.device, n);
        return SERVICE_EXIT_CONFIG;
    }
    b.stop = service_signals();
    /* Report before s_close: after a timed-out test its tear-down may take seconds. */
    if ((rc = s_open(&b))) {
        snprintf(error, sizeof error, "set-up: %s",
                 b.err[0] ? b.err : rc == STRATA_ECANCELED ? "interrupted" : strata_strerror(rc));
    } else {
        s_header(&b);
        if ((rc = s_measure(&b, f)))
            for (int d = 0; d < 2; d++)
                if (f[d].failed < T_N)
                    snprintf(error, sizeof error, "design %c (%s), %s", "EP"[d], s_design_name[d], f[d].error);
        s_table(&b, f);
    }
    const int jrc = b.o.json ? s_json(&b, f, rc ? error : NULL) : 0;
    s_close(&b);
    if (rc) {
        fprintf(stderr, "dma_designs: %s\n", error);
        return SERVICE_EXIT_FAIL;
    }
    if (jrc) return SERVICE_EXIT_FAIL;
    if (f[0].bad || f[1].bad) {
        fprintf(stderr, "dma_designs: %u (E) and %u (P) reads beat their copy: an event wait did not hold\n", f[0].bad,
                f[1].bad);
        return SERVICE_EXIT_FAIL;
    }
    return SERVICE_EXIT_OK;
}

int main(int argc, char **argv)
{
    const char *role = "executor";
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--role")) role = argv[i + 1];
    if (!strcmp(role, "prefetcher")) return s_prefetcher_main(argc, argv);
    if (strcmp(role, "executor")) {
        fprintf(stderr, "dma_designs: --role '%s': want executor or prefetcher\n", role);
        return SERVICE_EXIT_CONFIG;
    }
    return s_executor_main(argc, argv);
}
