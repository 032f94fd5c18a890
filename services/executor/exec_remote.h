/* exec_remote.h - the executor's side of the CPU-expert path: experts computed by the
 * prefetchers, each on the cores of the node whose arena holds it, over one shm ring per
 * prefetcher (store/ring.h). It implements model/model.h's moe_remote_t.
 *
 * Which experts go there ([executor] expert_path), CPU backend:
 *   cpu   every expert whose bytes lie in a prefetcher's arena runs on that prefetcher;
 *   auto  only those whose arena sits on another NUMA node than the executor's (on one node,
 *         the executor's own threads read the same memory without a round trip);
 *   pcie  none (a GPU term; on the CPU backend it means every expert runs here).
 * CUDA backend: with cpu, cost and static every arena's expert may go to its prefetcher, and
 * model/gpu_cpu.c decides which misses do; with auto and pcie none (the path is not created).
 * The owner of an expert is found from where its weights are mapped (model_arena_of), so it is
 * the arena placement of store/arena.h by construction.
 *
 * Faults: a prefetcher that is gone (its pid), stopped (a heartbeat older than half of
 * [executor] cpu_expert_timeout_ms) or slower than that timeout has its experts computed here, by the same kernels, so the
 * tokens do not change; it is used again once its heartbeat is fresh, and its ring is attached
 * again if the prefetcher made a new one.
 */
#ifndef STRATA_EXEC_REMOTE_H
#define STRATA_EXEC_REMOTE_H

#include <stdint.h>

#include "common/config.h"
#include "model/model.h"
#include "services/executor/exec_model.h"

typedef struct exec_remote exec_remote_t;

typedef struct {
    uint64_t jobs, experts, rows;  /* jobs answered by prefetchers, their experts and token rows */
    uint64_t fallbacks;            /* jobs (or posts refused) whose experts ran here instead */
    uint64_t bytes;                /* expert weight bytes the prefetchers read */
    double wait_us, compute_us;    /* executor's time waiting, the prefetchers' compute time */
    int32_t experts_owned;         /* experts routed to the prefetchers */
    int32_t dests_up;              /* prefetchers whose rings are attached and alive now */
} exec_remote_stats_t;

/* The remote path for em's model under cfg, or *out = NULL when no expert goes to a prefetcher
 * (no arenas, expert_path, one node). Rings that do not exist yet are attached when first
 * needed. 0 or <0 with eb set. */
int exec_remote_create(exec_remote_t **out, const strata_config_t *cfg, const exec_model_t *em, strata_errbuf_t *eb);
/* The moe_remote_t to hand to forward_set_remote. */
const moe_remote_t *exec_remote_iface(const exec_remote_t *x);
void exec_remote_stats(const exec_remote_t *x, exec_remote_stats_t *st);
/* Safe on NULL. */
void exec_remote_free(exec_remote_t *x);

#endif
