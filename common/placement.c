/* placement.c - cpulist parsing, sched_setaffinity and the libnuma memory policy. */
#include "common/placement.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int s_num(const char **p, long *out)
{
    const char *s = *p;
    if (*s < '0' || *s > '9') return -1;
    long v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v > PLACEMENT_MAX_CPU) return -1;
        s++;
    }
    *out = v;
    *p = s;
    return 0;
}

int cpulist_parse(const char *s, cpu_set_t *set, strata_errbuf_t *eb)
{
    CPU_ZERO(set);
    const char *p = s;
    while (*p == ' ' || *p == '\t') p++;
    if (!*p) return 0;
    for (;;) {
        long a, b;
        const char *item = p;
        if (s_num(&p, &a) < 0)
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "bad cpulist '%s' at '%s' (expected cpu numbers 0-%d like \"0-3,8\")",
                                 s, item, PLACEMENT_MAX_CPU);
        b = a;
        if (*p == '-') {
            p++;
            if (s_num(&p, &b) < 0 || b < a)
                return strata_seterr(eb, STRATA_EINVAL_INPUT, "bad cpulist '%s' at '%s' (range must be LOW-HIGH)", s, item);
        }
        for (long c = a; c <= b; c++) CPU_SET((int)c, set);
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        if (*p != ',') return strata_seterr(eb, STRATA_EINVAL_INPUT, "bad cpulist '%s' at '%s' (expected ',')", s, p);
        p++;
        while (*p == ' ' || *p == '\t') p++;
    }
    return CPU_COUNT(set);
}

int cpulist_format(const cpu_set_t *set, char *buf, size_t n)
{
    size_t len = 0;
    if (n == 0) return -ENOSPC;
    buf[0] = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, set)) continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set)) e++;
        int w = e > c ? snprintf(buf + len, n - len, "%s%d-%d", len ? "," : "", c, e)
                      : snprintf(buf + len, n - len, "%s%d", len ? "," : "", c);
        if (w < 0 || (size_t)w >= n - len) return -ENOSPC;
        len += (size_t)w;
        c = e;
    }
    return (int)len;
}

int placement_numa_nodes(void)
{
    if (numa_available() < 0) return 1;
    return numa_num_configured_nodes();
}

bool placement_node_exists(int node)
{
    if (node < 0) return false;
    if (numa_available() < 0) return node == 0;
    return node <= numa_max_node() && numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node);
}

int placement_apply(const config_placement_t *p, strata_errbuf_t *eb)
{
    int rc;
    if (p->cpus[0]) {
        cpu_set_t want, online;
        rc = cpulist_parse(p->cpus, &want, eb);
        if (rc < 0) return rc;
        if (rc > 0) {
            /* Only cpus this process may use (its cpuset), so a typo fails loudly instead of
             * the kernel silently dropping cpus that do not exist. */
            if (sched_getaffinity(0, sizeof online, &online) < 0) return -errno;
            cpu_set_t missing;
            CPU_XOR(&missing, &want, &online);
            CPU_AND(&missing, &missing, &want);
            if (CPU_COUNT(&missing) > 0) {
                char have[256], miss[256];
                cpulist_format(&online, have, sizeof have);
                cpulist_format(&missing, miss, sizeof miss);
                return strata_seterr(eb, STRATA_EINVAL_INPUT, "cpus '%s': cpu(s) %s not available here (allowed: %s)",
                                     p->cpus, miss, have);
            }
            if (sched_setaffinity(0, sizeof want, &want) < 0)
                return strata_seterr(eb, -errno, "sched_setaffinity(%s): %s", p->cpus, strerror(errno));
        }
    }
    if (p->numa_node >= 0) {
        if (numa_available() < 0)
            return strata_seterr(eb, STRATA_EUNSUPPORTED, "numa_node %d: NUMA is not available on this machine (libnuma)",
                                 p->numa_node);
        if (p->numa_node > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)p->numa_node))
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "numa_node %d: no such node with memory here (max node %d)",
                                 p->numa_node, numa_max_node());
        struct bitmask *bm = numa_allocate_nodemask();
        if (!bm) return STRATA_ENOMEM;
        numa_bitmask_setbit(bm, (unsigned)p->numa_node);
        /* MPOL_BIND: inherited by threads and children, kept across execve. numaif.h's
         * set_mempolicy (from libnuma) reports errors, unlike the void numa_set_membind. */
        int e = set_mempolicy(MPOL_BIND, bm->maskp, bm->size + 1) < 0 ? errno : 0;
        numa_bitmask_free(bm);
        if (e) return strata_seterr(eb, -e, "set_mempolicy(MPOL_BIND, node %d): %s", p->numa_node, strerror(e));
    }
    return 0;
}
