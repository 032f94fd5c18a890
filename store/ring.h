/* ring.h - the data plane between an executor and one prefetcher: a shm ring of expert jobs.
 *
 * One segment per prefetcher, "/strata-<group>-<token>-ring-<N>", under the same token as its
 * arena (common/shm.h: names, and who may own a segment; header: magic, version,
 * layout hash, size, owner pid, ready last). The prefetcher creates it at its first start and
 * takes it over on a restart, as it does its arena; the executor attaches it and, on the GPU,
 * registers it with cudaHostRegister, so hidden rows and expert outputs move by DMA.
 *
 * A job is one MoE layer's experts that this prefetcher computes for one step:
 *   executor:   writes the descriptor (ring_job_t, ring_item_t[]) and the input rows, then
 *               stores `req` = the job's sequence number (release) and wakes the futex;
 *   prefetcher: sees `req` change (acquire), copies the descriptor, checks every field against
 *               the ring's geometry (it is input from another process), runs each item's FFN on
 *               the input rows, writes the output rows and the result, then stores `done` (release)
 *               and wakes that futex;
 *   executor:   waits, bounded, for `done` to carry its sequence number with its generation.
 * Rows: item i covers rows [row0, row0 + n) of both areas, x and y, [max_rows][hidden] fp32 each.
 *
 * Stale results. `gen` is bumped by every prefetcher that takes the ring over. A job carries the
 * generation the executor saw when it posted; a prefetcher serves only jobs of its own
 * generation, and the executor accepts a result only with its job's sequence number and
 * generation. A result of a dead or restarted peer, or of a job the executor gave up on, is
 * never used: the executor posts the next job with a new sequence number.
 *
 * Liveness. The prefetcher refreshes `heartbeat_ns` (CLOCK_MONOTONIC) at least every
 * RING_BEAT_MS while it serves, from a thread of its own, so a long job beats too. The
 * executor treats the peer as down when its owner pid is gone or the heartbeat is older than
 * its stale limit (a SIGSTOPped peer), both before posting and while it waits, so no wait
 * outlasts that limit.
 *
 * Ordering with a peer that comes back (SIGCONT) in the middle of a job the executor gave up on:
 * it may read inputs the executor is overwriting and write outputs of that job, but it serves
 * jobs one at a time, so the outputs of a later job are written after those and before that
 * job's `done`, which is what the executor reads them after.
 */
#ifndef STRATA_RING_H
#define STRATA_RING_H

#include <stdbool.h>
#include <stdint.h>

#include "common/shm.h"
#include "common/strata.h"

#define RING_MAGIC 0x474e495241525453ull /* "STRARING" */
#define RING_VERSION 2u
#define RING_BEAT_MS 10           /* the prefetcher's heartbeat period, at most */
#define RING_SPIN_US 1000         /* the prefetcher spins this long for a job before its futex */
#define RING_PAUSE_US 50          /* a ring_wait spins on its core alone this long, then yields it */
#define RING_MAX_ITEMS 1024       /* experts of one layer in one job */
#define RING_MAX_HINTS 256        /* experts of the layers ahead a job may name for the disk tier's read-ahead */
#define RING_AHEAD_DEPTH 4        /* MoE layers ahead those hints come from by default ([executor] prefetch_depth
                                   * on the CPU backend): twice the GPU's for split experts, as a disk read takes
                                   * longer than a copy */

/* What a ring holds, from the model and the scheduler's token budget. */
typedef struct {
    int32_t hidden;               /* floats per row */
    int32_t max_rows;             /* rows per area: the step's tokens x top_k */
    int32_t max_items;            /* experts per job */
} ring_geom_t;

typedef struct {
    int32_t expert;               /* expert index in the job's layer */
    int32_t row0, n;              /* its rows in x and y */
    int32_t reserved;
} ring_item_t;

/* An expert of a layer ahead that the executor's gates predict: read it from disk now. */
typedef struct {
    int32_t layer, expert;
} ring_hint_t;

typedef struct {
    uint64_t seq;                 /* executor's job number, > 0, strictly increasing */
    uint64_t gen;                 /* the peer generation it was posted to */
    uint64_t step;                /* the step id, for logs and counters */
    int32_t layer;
    int32_t n_items;
    int32_t n_rows;               /* rows used: sum of items' n */
    int32_t act;                  /* cpu_act_t the FFNs run with */
    int32_t n_hints;              /* entries of ring_ctl_t.hints for this job, [0, RING_MAX_HINTS] */
    int32_t reserved;
} ring_job_t;

typedef struct {
    uint64_t seq, gen;            /* the job this answers */
    int32_t status;               /* 0, or a negative strata_err_t */
    int32_t reserved;
    uint64_t compute_ns;          /* the job's time on the prefetcher */
    uint64_t bytes;               /* expert weight bytes it read */
    char error[256];              /* with a status < 0: what failed, e.g. the file and offset of a bad read */
} ring_result_t;

/* At shm_payload(seg). Each futex word on a cache line of its own. */
typedef struct {
    uint64_t magic;               /* RING_MAGIC */
    uint32_t version;             /* RING_VERSION */
    int32_t node;
    ring_geom_t geom;
    int32_t reserved0;
    uint64_t x_off, y_off;        /* payload offsets of the two row areas, 4 KiB aligned */
    uint64_t gen;                 /* atomic: the serving prefetcher's generation */
    int32_t pf_pid;               /* atomic: its pid */
    int32_t reserved1;
    uint64_t heartbeat_ns;        /* atomic: CLOCK_MONOTONIC, refreshed while serving */
    uint64_t served, failed;      /* jobs answered, with status 0 and not */
    _Alignas(64) uint32_t req;    /* futex: low 32 bits of the last posted job's seq */
    _Alignas(64) uint32_t done;   /* futex: low 32 bits of the last answered job's seq */
    _Alignas(64) ring_job_t job;
    ring_result_t res;
    ring_item_t items[RING_MAX_ITEMS];
    ring_hint_t hints[RING_MAX_HINTS]; /* the job's read-ahead hints, written with its items */
} ring_ctl_t;

typedef struct {
    shm_seg_t seg;
    ring_ctl_t *ctl;
    float *x, *y;                 /* [max_rows][hidden] each */
    uint64_t gen;                 /* server: its own generation; client: the one it posts to */
    uint64_t seq;                 /* client: the last posted job */
    uint32_t seen;                /* server: the last `req` it handled */
    int32_t n_hints;              /* client: hints written into ctl->hints for the next post */
} ring_t;

/* The geometry both sides derive from the model and the group config: rows for every
 * (token, expert) pair of a step of max_tokens tokens, items for every expert of a layer. */
static inline ring_geom_t ring_geom(int32_t hidden, int32_t top_k, int32_t n_experts, int32_t max_tokens)
{
    return (ring_geom_t){.hidden = hidden, .max_rows = max_tokens * top_k,
                         .max_items = n_experts < RING_MAX_ITEMS ? n_experts : RING_MAX_ITEMS};
}

/* Segment name of node's ring in namespace ns ("<group>-<token>", shm_ns_read):
 * "/strata-<ns>-ring-<node>". */
int ring_shm_name(char *buf, size_t n, const char *ns, int node);
/* Bytes of a ring segment of geometry g, header included. */
uint64_t ring_bytes(const ring_geom_t *g);

/* Prefetcher side: take over the ring of g if one of that layout exists (a restart), else
 * create it, bound to numa_node; bump the generation and publish. A segment at name that
 * shm_attach refuses (another owner, a mode others may write, a symlink) is left alone: -EPERM. */
int ring_serve_open(ring_t *r, const char *name, const ring_geom_t *g, int node, int numa_node, strata_errbuf_t *eb);
/* Refresh the heartbeat (cheap: one clock read and one store). */
void ring_beat(ring_t *r);
/* Wait up to timeout_ms for a job of this generation; refreshes the heartbeat meanwhile. 1 with
 * *job, items[] and hints[] (job->n_hints of them; NULL: not copied) copied out, every field
 * checked (a job that does not fit the geometry is answered with STRATA_EINVAL_INPUT by the call
 * itself and not returned; a hint's layer and expert are the caller's to check), 0 on timeout. */
int ring_serve_wait(ring_t *r, ring_job_t *job, ring_item_t *items, ring_hint_t *hints, int timeout_ms);
/* Answer job with status and counters: the output rows must be written. error: with a status
 * < 0, what failed (NULL: none), copied into the result (truncated). */
void ring_serve_done(ring_t *r, const ring_job_t *job, int status, uint64_t compute_ns, uint64_t bytes, const char *error);

/* Executor side: attach the ring of g read-write (-ENOENT if the prefetcher has not made it). */
int ring_attach(ring_t *r, const char *name, const ring_geom_t *g, strata_errbuf_t *eb);
/* True if the peer is alive and its heartbeat is younger than stale_ms. */
bool ring_peer_up(const ring_t *r, int stale_ms);
/* Post a job: items[0..n_items) and their input rows must be written into r->ctl->items and
 * r->x already, and r->n_hints hints into r->ctl->hints (then reset to 0). Sets seq and gen. */
void ring_post(ring_t *r, int32_t layer, int32_t n_items, int32_t n_rows, int32_t act, uint64_t step);
/* Wait for the posted job's result, spinning spin_us first (after RING_PAUSE_US, yielding the
 * core between looks), then on the futex; gives up when the
 * peer is down (see ring_peer_up) or after timeout_ms. 0 with *res, STRATA_ETIMEOUT or
 * STRATA_EIO (the peer died), or the job's own negative status (*res then has its error text). */
int ring_wait(ring_t *r, int spin_us, int stale_ms, int timeout_ms, ring_result_t *res);
/* Unmap. Safe on a zeroed r. */
void ring_close(ring_t *r);

#endif
