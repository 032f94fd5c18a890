/* exec_remote.c - experts computed by the prefetchers over shm rings (see exec_remote.h). */
#include "services/executor/exec_remote.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/ops.h"
#include "model/packed.h"
#include "store/ring.h"

#define SPIN_US 3000        /* spin this long on `done` before sleeping on the futex: a job takes
                               about a MoE layer's CPU experts, up to a few ms, and a futex wake-up
                               after it would add its latency to every layer */
#define REATTACH_S 0.2      /* how often a ring that is down is attached again */

typedef struct {
    char name[SHM_NAME_MAX];    /* the ring's segment name, as of the last attach attempt */
    int node;                   /* its prefetcher's [prefetcher.N] */
    ring_t ring;
    bool attached;
    double t_try;           /* last attach attempt (strata_now) */
    bool warned;            /* its fallback was logged since it was last up */
} s_dest_t;

struct exec_remote {
    moe_remote_t iface;
    int8_t *owner;          /* [n_layers][n_experts] */
    uint8_t *pinned;        /* [n_layers][n_experts] experts of a disk tier: only their prefetcher reads them */
    bool dest_pinned[CONFIG_MAX_PREFETCHERS]; /* the destination has pinned experts: waited for, never replaced */
    char err[320];          /* the last failure, for the step's error */
    bool peer_failed[CONFIG_MAX_PREFETCHERS]; /* the last wait failed for the prefetcher, not its job */
    ring_geom_t geom;
    int timeout_ms;
    int stale_ms;           /* a heartbeat older than this: the prefetcher is stopped or gone (timeout / 2: a
                               loaded machine may not run the beat thread for a while, which only costs a fallback) */
    int n_dest;
    s_dest_t dest[CONFIG_MAX_PREFETCHERS];
    char run_dir[256], group[64]; /* where the rings' tokens are (common/shm.h), and the group */
    exec_remote_stats_t st;
};

/* Attach dest d's ring if it is not, or if its peer is down and it may have made a new one. */
static bool s_ready(exec_remote_t *x, int d)
{
    s_dest_t *D = &x->dest[d];
    if (D->attached && ring_peer_up(&D->ring, x->stale_ms)) {
        D->warned = false;
        return true;
    }
    double now = strata_now();
    if (now - D->t_try < REATTACH_S) return false;
    D->t_try = now;
    strata_errbuf_t eb = {{0}};
    ring_t r;
    /* the name again: a prefetcher that rebuilt its arena drew a new token, and its ring moved */
    char ns[SHM_NS_MAX];
    int rc = shm_ns_read(ns, sizeof ns, x->run_dir, x->group, D->node, &eb);
    if (rc == -ENOENT) strata_seterr(&eb, rc, "no token in %s", x->run_dir);
    if (rc == 0) ring_shm_name(D->name, sizeof D->name, ns, D->node);
    if (rc < 0 || ring_attach(&r, D->name, &x->geom, &eb) < 0) {
        if (!D->warned) log_warn("prefetcher ring %s: %s; computing its experts here", D->name, eb.msg);
        D->warned = true;
        return false;
    }
    if (D->attached) {
        r.seq = D->ring.seq > r.seq ? D->ring.seq : r.seq;
        ring_close(&D->ring);
    }
    D->ring = r;
    D->attached = true;
    if (ring_peer_up(&D->ring, x->stale_ms)) {
        D->warned = false;
        return true;
    }
    if (!D->warned) log_warn("prefetcher ring %s: its prefetcher is down; computing its experts here", D->name);
    D->warned = true;
    return false;
}

static float *s_rows(void *ctx, int d)
{
    exec_remote_t *x = ctx;
    if (s_ready(x, d)) return x->dest[d].ring.x;
    if (x->dest_pinned[d]) {
        /* its experts can run nowhere else: wait for it (a restart), bounded */
        double t0 = strata_now();
        while (strata_now() - t0 < x->timeout_ms * 1e-3) {
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            x->dest[d].t_try = -1e9;
            if (s_ready(x, d)) return x->dest[d].ring.x;
        }
        snprintf(x->err, sizeof x->err, "the prefetcher of [prefetcher.%d], whose disk tier holds this layer's experts, is down",
                 x->dest[d].node);
        return NULL;
    }
    x->st.fallbacks++;
    return NULL;
}

static const char *s_error(void *ctx) { return ((const exec_remote_t *)ctx)->err; }

static bool s_retry(void *ctx, int d) { return ((const exec_remote_t *)ctx)->peer_failed[d]; }

static void s_hint(void *ctx, int d, const int32_t *layers, const int32_t *experts, int n)
{
    exec_remote_t *x = ctx;
    ring_t *r = &x->dest[d].ring;
    if (!x->dest[d].attached) return;
    if (n > RING_MAX_HINTS) n = RING_MAX_HINTS;
    for (int i = 0; i < n; i++) r->ctl->hints[i] = (ring_hint_t){.layer = layers[i], .expert = experts[i]};
    r->n_hints = n;
}

static int s_post(void *ctx, int d, int layer, const int32_t *experts, const int32_t *counts, int n, uint64_t step)
{
    exec_remote_t *x = ctx;
    ring_t *r = &x->dest[d].ring;
    STRATA_ASSERT(x->dest[d].attached && n > 0 && n <= x->geom.max_items);
    int32_t row = 0;
    for (int i = 0; i < n; i++) {
        r->ctl->items[i] = (ring_item_t){.expert = experts[i], .row0 = row, .n = counts[i]};
        row += counts[i];
    }
    STRATA_ASSERT(row <= x->geom.max_rows);
    ring_post(r, layer, n, row, (int32_t)cpu_ops_act(), step);
    return 0;
}

static int s_wait(void *ctx, int d, const float **out)
{
    exec_remote_t *x = ctx;
    s_dest_t *D = &x->dest[d];
    ring_result_t res = {0}; /* seq 0: no answer, unless ring_wait got this job's */
    double t0 = strata_now();
    int rc = ring_wait(&D->ring, SPIN_US, x->stale_ms, x->timeout_ms, &res);
    x->st.wait_us += (strata_now() - t0) * 1e6;
    if (rc < 0) {
        /* the job's own failure carries its text (a disk tier's bad read: file and offset) */
        bool own = res.seq == D->ring.seq && res.gen == D->ring.gen && res.status == rc;
        x->peer_failed[d] = !own;
        snprintf(x->err, sizeof x->err, "prefetcher of [prefetcher.%d]: %s", D->node,
                 own ? (res.error[0] ? res.error : strata_strerror(rc)) : rc == STRATA_EIO ? "the prefetcher is gone"
                                                                             : strata_strerror(rc));
        if (x->dest_pinned[d]) {
            log_error("prefetcher ring %s: job %llu: %s", D->name, (unsigned long long)D->ring.seq, x->err);
        } else {
            x->st.fallbacks++;
            log_warn("prefetcher ring %s: job %llu: %s; computing its experts here", D->name, (unsigned long long)D->ring.seq,
                     x->err);
        }
        if (!own) {
            D->warned = true;
            D->t_try = strata_now(); /* give it REATTACH_S before the next try */
        }
        return rc;
    }
    const ring_job_t *j = &D->ring.ctl->job;
    x->st.jobs++;
    x->st.experts += (uint64_t)j->n_items;
    x->st.rows += (uint64_t)j->n_rows;
    x->st.bytes += res.bytes;
    x->st.compute_us += (double)res.compute_ns * 1e-3;
    *out = D->ring.y;
    return 0;
}

/* Pin every expert whose block lies in a file that an arena leaves on disk (arena_set_disk_file)
 * to that arena's prefetcher: *n of them. The manifest, from the arenas, says where each is. */
static int s_pin_disk(exec_remote_t *x, const exec_model_t *em, int *n, strata_errbuf_t *eb)
{
    const model_config_t *c = &em->m.cfg;
    *n = 0;
    bool any = false;
    for (int a = 0; a < em->arenas.n; a++) any |= em->arenas.idx[a]->n_slots > 0;
    if (!any) return 0;
    uint64_t len = 0;
    const char *text = arena_set_file(&em->arenas, PACKED_MANIFEST, &len);
    packed_manifest_t pm;
    int rc = text ? packed_manifest_parse(&pm, text, (size_t)len, "arena:" PACKED_MANIFEST, eb)
                  : strata_seterr(eb, STRATA_EINVAL_INPUT, "disk tier: no %s in the arenas", PACKED_MANIFEST);
    if (rc < 0) return rc;
    for (int32_t b = 0; b < pm.n_blocks; b++) {
        const packed_block_t *B = &pm.blocks[b];
        if (B->layer < 0 || B->layer >= c->n_layers || B->expert < 0 || B->expert >= c->n_experts) continue;
        int a = arena_set_disk_file(&em->arenas, pm.files[B->file].name);
        if (a < 0) continue;
        size_t k = (size_t)B->layer * c->n_experts + B->expert;
        x->owner[k] = (int8_t)a;
        x->pinned[k] = 1;
        x->dest_pinned[a] = true;
        (*n)++;
    }
    packed_manifest_free(&pm);
    return 0;
}

int exec_remote_create(exec_remote_t **out, const strata_config_t *cfg, const exec_model_t *em, strata_errbuf_t *eb)
{
    *out = NULL;
    int rc = 0;
    const model_config_t *c = &em->m.cfg;
    /* on the GPU the CPU is the alternative to a copy, on one node too: every arena's experts
     * may go there, and the cost model (model/gpu_cpu.c) chooses */
    const bool gpu = !strcmp(cfg->executor.backend, "cuda");
    bool all = !strcmp(cfg->executor.expert_path, "cpu") || gpu;
    if (!em->from_arena || c->n_experts <= 0) return 0;
    exec_remote_t *x = calloc(1, sizeof *x);
    if (!x) return STRATA_ENOMEM;
    const size_t ne = (size_t)c->n_layers * (size_t)c->n_experts;
    x->owner = malloc(ne);
    x->pinned = calloc(ne, 1);
    if (!x->owner || !x->pinned) {
        exec_remote_free(x);
        return STRATA_ENOMEM;
    }
    memset(x->owner, -1, ne);
    /* experts a host budget left on disk: their prefetcher alone reads them, whatever the path */
    int own = 0, pinned = 0;
    if ((rc = s_pin_disk(x, em, &pinned, eb)) < 0) {
        exec_remote_free(x);
        return rc;
    }
    own = pinned; /* none on cuda: config_load refuses a host budget there */
    /* on the GPU, auto copies every miss: the cost model (cost) loses to the copies where the
     * experts are small (bench/RESULTS.md: Qwen3-30B-A3B at 6 GiB) */
    bool none = !strcmp(cfg->executor.expert_path, "pcie") || (gpu && !strcmp(cfg->executor.expert_path, "auto"));
    for (int l = 0; l < c->n_layers && !none; l++) {
        if (!c->layer_sparse[l]) continue;
        for (int e = 0; e < c->n_experts; e++) {
            int a = model_arena_of(&em->arenas, em->m.layers[l].experts[e].gate.data);
            if (a < 0) continue;
            int node = cfg->prefetcher[a].place.numa_node;
            if (all || (node >= 0 && cfg->executor.place.numa_node >= 0 && node != cfg->executor.place.numa_node)) {
                x->owner[(size_t)l * c->n_experts + e] = (int8_t)a;
                own++;
            }
        }
    }
    if (own == 0) {
        exec_remote_free(x);
        return 0;
    }
    x->geom = ring_geom(c->hidden, c->top_k, c->n_experts, cfg->scheduler.max_batch_tokens);
    x->timeout_ms = cfg->executor.cpu_expert_timeout_ms;
    x->stale_ms = x->timeout_ms / 2 > 20 ? x->timeout_ms / 2 : 20;
    x->n_dest = cfg->n_prefetchers;
    snprintf(x->run_dir, sizeof x->run_dir, "%s", cfg->run_dir);
    snprintf(x->group, sizeof x->group, "%s", cfg->name);
    for (int d = 0; d < x->n_dest; d++) {
        x->dest[d].node = cfg->prefetcher[d].node;
        snprintf(x->dest[d].name, sizeof x->dest[d].name, "of [prefetcher.%d]", x->dest[d].node); /* until attached */
        x->dest[d].t_try = -1e9;
        (void)s_ready(x, d);
    }
    x->st.experts_owned = own;
    x->iface = (moe_remote_t){.ctx = x, .n_dest = x->n_dest, .owner = x->owner, .pinned = pinned ? x->pinned : NULL,
                              .rows = s_rows, .post = s_post, .wait = s_wait, .error = s_error,
                              .hint_depth = pinned ? (cfg->executor.prefetch_depth >= 0 ? cfg->executor.prefetch_depth
                                                                                        : RING_AHEAD_DEPTH) : 0,
                              .hint = pinned ? s_hint : NULL, .retry = pinned ? s_retry : NULL};
    log_info("cpu experts: %d of the model's experts run on their prefetchers' cores (expert_path = %s%s)", own,
             cfg->executor.expert_path, pinned ? "; those of the disk tier always" : "");
    *out = x;
    return 0;
}

const moe_remote_t *exec_remote_iface(const exec_remote_t *x) { return x ? &x->iface : NULL; }

void exec_remote_stats(const exec_remote_t *x, exec_remote_stats_t *st)
{
    memset(st, 0, sizeof *st);
    if (!x) return;
    *st = x->st;
    for (int d = 0; d < x->n_dest; d++) st->dests_up += x->dest[d].attached && ring_peer_up(&x->dest[d].ring, x->stale_ms);
}

void exec_remote_free(exec_remote_t *x)
{
    if (!x) return;
    for (int d = 0; d < x->n_dest; d++)
        if (x->dest[d].attached) ring_close(&x->dest[d].ring);
    free(x->owner);
    free(x->pinned);
    free(x);
}
