/* xserve.h - the prefetcher's CPU experts: a thread that serves the executor's expert jobs on
 * this node's ring (store/ring.h), running each expert's FFN on the node's cores with the
 * weights read in place from this prefetcher's own arena (no copy, every packed format).
 *
 * Only experts whose bytes lie in this arena are computed here: the model view is built over
 * this arena alone (model_load_arenas, partial), and a job naming an expert of another node's
 * arena is refused. Kernels: kernels/cpu's cpu_ffn_swiglu_many, whose fast paths are chosen at
 * run time (AVX-512, AVX2), with the executor's activation mode per job, so an expert's output
 * is bit for bit what the executor's own CPU backend computes for it.
 */
#ifndef STRATA_XSERVE_H
#define STRATA_XSERVE_H

#include "services/prefetcher/dtier.h"

#include "common/config.h"
#include "common/shm.h"

typedef struct xserve xserve_t;

/* Start serving on the ring of [prefetcher.<part>] for the packed model in *arena (which must
 * outlive the server), with `threads` compute threads (<= 0: the cpus this process may use). A
 * model folder that is not packed has no expert layout to serve: *out = NULL, 0. 0 or <0, eb set. */
int xserve_start(xserve_t **out, const strata_config_t *cfg, int part, const shm_seg_t *arena, int threads,
                 strata_errbuf_t *eb);
/* Stop the thread and free. Safe on NULL. */
void xserve_stop(xserve_t *x);
/* The disk tier's counters (all zero without a host budget, or for NULL). */
void xserve_disk_stats(const xserve_t *x, dtier_stats_t *st);

#endif
