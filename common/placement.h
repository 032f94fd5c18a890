/* placement.h - CPU pinning (cpulists) and NUMA memory policy for a process.
 *
 * A cpulist is the kernel's notation ("0-3,8,10-11", as in /proc/PID/status
 * Cpus_allowed_list); "" means not pinned. Parsing does not consult the machine, so a config
 * written for a bigger host parses here; placement_apply checks it against this machine.
 */
#ifndef STRATA_PLACEMENT_H
#define STRATA_PLACEMENT_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/config.h"
#include "common/strata.h"

#define PLACEMENT_MAX_CPU 1023 /* highest cpu number a cpulist may name (CPU_SETSIZE - 1) */

/* Parse a cpulist into set. Returns the number of cpus (0 for ""), or STRATA_EINVAL_INPUT
 * with eb naming the offending part. */
int cpulist_parse(const char *s, cpu_set_t *set, strata_errbuf_t *eb);
/* Format set as a canonical cpulist ("0-3,8") into buf. Returns the length or -ENOSPC. */
int cpulist_format(const cpu_set_t *set, char *buf, size_t n);

/* Apply p to the calling thread (and so to everything it later creates or execs):
 * sched_setaffinity to p->cpus when not empty, and set_mempolicy(MPOL_BIND, {numa_node})
 * through libnuma when numa_node >= 0. Refuses cpus this machine does not have, and nodes
 * that do not exist or hold no memory, with eb saying which. */
int placement_apply(const config_placement_t *p, strata_errbuf_t *eb);

/* Number of NUMA nodes with memory on this machine (1 if libnuma reports NUMA unavailable). */
int placement_numa_nodes(void);
/* True if node is a NUMA node with memory here (node 0 always exists, NUMA or not). */
bool placement_node_exists(int node);

#endif
