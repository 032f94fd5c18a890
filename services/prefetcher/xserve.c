/* xserve.c - CPU experts on the prefetcher's cores (see xserve.h). */
#include "services/prefetcher/xserve.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/threadpool.h"
#include "model/packed.h"
#include "store/arena.h"
#include "store/ring.h"
#include "services/prefetcher/dtier.h"

#define SUB_ROWS 256        /* rows of one cpu_ffn_swiglu_many call: bounds the scratch */

struct xserve {
    arena_set_t own;        /* this prefetcher's arena alone (not detached here: the caller owns it) */
    model_t m;              /* over own, partial */
    packed_manifest_t pm;   /* the arena's manifest, when it has a disk tier */
    const unsigned char **bases; /* [pm.n_files] where m's files are or are reserved */
    dtier_t *dt;            /* its disk tier (host budget), or NULL */
    ffn_t *views;           /* [max_items] a wave's disk experts, over their slots */
    int32_t *wave_e;        /* [max_items] */
    bool *disk;             /* [max_items] the job's items that come from the disk tier */
    ring_hint_t *next_h;    /* [max_items] the next wave's experts, read ahead */
    char err[256];          /* the failed job's error */
    ring_t ring;
    tpool_t *pool;
    float *scratch;         /* [2 * SUB_ROWS * max_inter] */
    int32_t max_inter;
    pthread_t th, beat;
    bool running, beating;
    int stop;               /* atomic */
};

static size_t s_qbytes(const qmat_t *q)
{
    return qmat_data_bytes(q->fmt, q->rows, q->cols) + qmat_scale_bytes(q->fmt, q->rows, q->cols, q->group);
}

/* Every item of [i0, i1) over its rows of x into y, with the tensors of E[i] (its view over a
 * slot, or the arena's). */
static void s_compute(xserve_t *x, const layer_t *L, const ring_item_t *items, const ffn_t *const *E, int i0, int i1, bool ex,
                      uint64_t *bytes)
{
    int H = x->ring.ctl->geom.hidden;
    cpu_ffn_item_t sub[CPU_FFN_MANY_MAX];
    cpu_ffn_opts_t opts[CPU_FFN_MANY_MAX];
    int ns = 0;
    int32_t rows = 0;
    for (int i = i0; i < i1; i++) {
        *bytes += s_qbytes(&E[i]->gate) + s_qbytes(&E[i]->up) + s_qbytes(&E[i]->down);
        for (int32_t r0 = 0; r0 < items[i].n;) {
            int32_t n = items[i].n - r0;
            if (n > SUB_ROWS - rows) n = SUB_ROWS - rows;
            size_t at = (size_t)(items[i].row0 + r0) * (size_t)H;
            if (ex) opts[ns] = forward_expert_opts(&x->m, L, items[i].expert);
            sub[ns] = (cpu_ffn_item_t){.x = x->ring.x + at, .out = x->ring.y + at, .n = n, .gate = &E[i]->gate,
                                       .up = &E[i]->up, .down = &E[i]->down, .opts = ex ? &opts[ns] : NULL};
            ns++;
            rows += n;
            r0 += n;
            if (rows == SUB_ROWS || ns == CPU_FFN_MANY_MAX) {
                cpu_ffn_swiglu_many(x->pool, sub, ns, x->scratch);
                ns = 0;
                rows = 0;
            }
        }
    }
    if (ns) cpu_ffn_swiglu_many(x->pool, sub, ns, x->scratch);
}

/* Run one job: every item's FFN over its rows of x into y. 0, or STRATA_EINVAL_INPUT for a job
 * that names a layer or expert this arena does not hold, or the disk tier's error (x->err).
 * Experts of the disk tier go in one wave when they fit its slots, else in waves of half of
 * them: a wave's blocks are read into slots (dtier_fetch), the next wave's read ahead, then the
 * wave computed, before the next fetch may evict its slots. */
static int s_run(xserve_t *x, const ring_job_t *j, const ring_item_t *items, const ring_hint_t *hints, uint64_t *bytes)
{
    const model_config_t *c = &x->m.cfg;
    x->err[0] = 0;
    if (j->layer >= c->n_layers || !c->layer_sparse[j->layer] || (j->act != CPU_ACT_F32 && j->act != CPU_ACT_Q8))
        return STRATA_EINVAL_INPUT;
    const layer_t *L = &x->m.layers[j->layer];
    /* gpt-oss's expert biases are resident tensors: an arena without them cannot run its experts */
    if (c->expert_bias && (!L->egate_b || !L->eup_b || !L->edown_b)) return STRATA_EINVAL_INPUT;
    const bool ex = c->expert_bias || c->ffn_act != FFN_ACT_SILU;
    for (int i = 0; i < j->n_items; i++) {
        if (items[i].expert >= c->n_experts) return STRATA_EINVAL_INPUT;
        const ffn_t *E = &L->experts[items[i].expert];
        x->disk[i] = dtier_holds(x->dt, j->layer, items[i].expert);
        if (!x->disk[i] && (model_arena_of(&x->own, E->gate.data) != 0 || model_arena_of(&x->own, E->up.data) != 0 ||
                            model_arena_of(&x->own, E->down.data) != 0))
            return STRATA_EINVAL_INPUT; /* another node's expert: its bytes are not mapped here */
    }
    cpu_ops_set_act((cpu_act_t)j->act);
    *bytes = 0;
    const ffn_t *E[RING_MAX_ITEMS];
    const int slots = dtier_slots(x->dt);
    int n_disk = 0;
    for (int i = 0; i < j->n_items; i++) n_disk += x->disk[i];
    /* more than the slots: waves of half of them, so that the next wave's blocks are read while
     * this one computes */
    const int wave = n_disk <= slots ? slots : slots >= 2 ? slots / 2 : 1;
    for (int i0 = 0; i0 < j->n_items;) {
        int nd = 0, i1 = i0;
        for (; i1 < j->n_items && (!x->disk[i1] || nd < wave); i1++)
            if (x->disk[i1]) x->wave_e[nd++] = items[i1].expert;
        if (nd) {
            strata_errbuf_t eb = {{0}};
            int rc = dtier_fetch(x->dt, j->layer, x->wave_e, nd, x->views, &eb);
            if (rc < 0) {
                snprintf(x->err, sizeof x->err, "%.255s", eb.msg);
                return rc;
            }
        }
        if (i1 < j->n_items) { /* the next wave, read ahead into slots this one leaves */
            int nn = 0;
            for (int i = i1; i < j->n_items && nn < wave; i++)
                if (x->disk[i]) x->next_h[nn++] = (ring_hint_t){.layer = j->layer, .expert = items[i].expert};
            dtier_ahead(x->dt, x->next_h, nn, false);
        } else if (i0 == 0 && j->n_hints > 0) {
            /* a job in one wave leaves the slots it does not use to the read-ahead of the layers
             * ahead, which the disk reads while this wave computes */
            dtier_ahead(x->dt, hints, j->n_hints, true);
        }
        for (int i = i0, d = 0; i < i1; i++) E[i] = x->disk[i] ? &x->views[d++] : &L->experts[items[i].expert];
        s_compute(x, L, items, E, i0, i1, ex, bytes);
        i0 = i1;
    }
    return 0;
}

/* The heartbeat from a thread of its own: a long job (a prefill's experts) beats too, and only a
 * stopped or dead process goes stale. */
static void *s_beat(void *arg)
{
    xserve_t *x = arg;
    while (!__atomic_load_n(&x->stop, __ATOMIC_ACQUIRE)) {
        ring_beat(&x->ring);
        usleep(RING_BEAT_MS * 1000 / 2);
    }
    return NULL;
}

static void *s_main(void *arg)
{
    xserve_t *x = arg;
    ring_job_t j;
    static ring_item_t items[RING_MAX_ITEMS];
    static ring_hint_t hints[RING_MAX_HINTS];
    while (!__atomic_load_n(&x->stop, __ATOMIC_ACQUIRE)) {
        if (ring_serve_wait(&x->ring, &j, items, hints, 200) <= 0) continue;
        uint64_t t0 = strata_now_ns(), bytes = 0;
        int rc = s_run(x, &j, items, hints, &bytes);
        if (rc == STRATA_EINVAL_INPUT)
            snprintf(x->err, sizeof x->err, "expert job %llu of layer %d: an expert this arena does not hold, or a bad layer",
                     (unsigned long long)j.seq, j.layer);
        if (rc < 0) log_warn("%s: refused", x->err);
        ring_serve_done(&x->ring, &j, rc, strata_now_ns() - t0, bytes, x->err);
    }
    return NULL;
}

int xserve_start(xserve_t **out, const strata_config_t *cfg, int part, const shm_seg_t *arena, int threads,
                 strata_errbuf_t *eb)
{
    int rc;
    *out = NULL;
    if (!packed_is_packed(cfg->model)) return 0;
    xserve_t *x = calloc(1, sizeof *x);
    if (!x) return STRATA_ENOMEM;
    x->own.n = 1;
    x->own.seg[0] = *arena;
    x->own.idx[0] = (const arena_index_t *)shm_payload(arena);
    const bool tiered = x->own.idx[0]->n_slots > 0;
    if (tiered) {
        uint64_t mlen = 0;
        const char *mtext = arena_set_file(&x->own, PACKED_MANIFEST, &mlen);
        if (!mtext) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "disk tier: no %s in the arena", PACKED_MANIFEST);
            goto fail;
        }
        if ((rc = packed_manifest_parse(&x->pm, mtext, (size_t)mlen, "arena:" PACKED_MANIFEST, eb)) < 0) goto fail;
        if (!(x->bases = calloc((size_t)(x->pm.n_files > 0 ? x->pm.n_files : 1), sizeof *x->bases))) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
    }
    if ((rc = model_load_arenas(&x->m, &x->own, true, x->bases, eb)) < 0) goto fail;
    const model_config_t *c = &x->m.cfg;
    if (c->n_experts <= 0) { /* a dense model: nothing to serve */
        xserve_stop(x);
        return 0;
    }
    if (tiered) {
        double t0 = strata_now();
        if ((rc = dtier_open(&x->dt, arena, &x->m, &x->pm, x->bases, x->own.idx[0]->model_dir, eb)) < 0) goto fail;
        x->views = malloc(sizeof *x->views * (size_t)c->n_experts);
        x->wave_e = malloc(sizeof *x->wave_e * (size_t)c->n_experts);
        x->next_h = malloc(sizeof *x->next_h * (size_t)c->n_experts);
        if (!x->views || !x->wave_e || !x->next_h) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
        int filled = dtier_prefill(x->dt);
        dtier_stats_t ds;
        dtier_stats(x->dt, &ds);
        log_info("disk tier: %u slots of %.1f MiB for %d experts on disk; %d read ahead in %.2f s (%s)", ds.n_slots,
                 ds.slot_bytes / 1048576.0, ds.experts, filled, strata_now() - t0, ds.uring ? "io_uring" : "pread");
    }
    if (!(x->disk = calloc((size_t)c->n_experts, sizeof *x->disk))) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    for (int l = 0; l < c->n_layers; l++)
        if (c->layer_sparse[l])
            for (int e = 0; e < c->n_experts; e++)
                if (x->m.layers[l].experts[e].gate.rows > x->max_inter) x->max_inter = x->m.layers[l].experts[e].gate.rows;
    x->scratch = malloc(sizeof(float) * 2 * SUB_ROWS * (size_t)(x->max_inter > 0 ? x->max_inter : 1));
    if (!x->scratch) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "cpu experts: scratch");
        goto fail;
    }
    if (threads <= 0) {
        /* every core it may use but one, which the executor's host thread (spinning on the GPU's
         * stream, or computing) keeps: a spinning worker that preempts it stalls every layer */
        cpu_set_t set;
        threads = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) - 1 : 1;
        if (threads < 1) threads = 1;
    }
    if (threads > 1 && !(x->pool = tpool_create(threads))) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "cpu experts: %d threads", threads);
        goto fail;
    }
    /* the workers wait for the next job as long as the ring thread does: a job comes once a MoE
     * layer, and a futex wake-up of every worker would add its latency to each */
    tpool_set_idle_spin(x->pool, (int64_t)RING_SPIN_US * 1000);
    cpu_ops_init();
    char name[SHM_NAME_MAX];
    if (ring_shm_name(name, sizeof name, cfg->name, cfg->prefetcher[part].node) < 0) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "group name '%s' too long for a ring name", cfg->name);
        goto fail;
    }
    ring_geom_t g = ring_geom(c->hidden, c->top_k, c->n_experts, cfg->scheduler.max_batch_tokens);
    if ((rc = ring_serve_open(&x->ring, name, &g, cfg->prefetcher[part].node, cfg->prefetcher[part].place.numa_node, eb)) < 0)
        goto fail;
    if (pthread_create(&x->th, NULL, s_main, x) != 0) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "cpu experts: cannot start the ring thread");
        goto fail;
    }
    x->running = true;
    if (pthread_create(&x->beat, NULL, s_beat, x) != 0) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "cpu experts: cannot start the heartbeat thread");
        goto fail;
    }
    x->beating = true;
    log_info("cpu experts: serving %s (generation %llu, %d threads, %s, rows of %d floats, up to %d a job)", name,
             (unsigned long long)x->ring.gen, threads, cpu_isa_name(cpu_ops_init()), g.hidden, g.max_rows);
    *out = x;
    return 0;
fail:
    xserve_stop(x);
    return rc;
}

void xserve_stop(xserve_t *x)
{
    if (!x) return;
    __atomic_store_n(&x->stop, 1, __ATOMIC_RELEASE);
    if (x->running) pthread_join(x->th, NULL);
    if (x->beating) pthread_join(x->beat, NULL);
    ring_close(&x->ring);
    if (x->pool) tpool_destroy(x->pool);
    free(x->scratch);
    dtier_close(x->dt);
    free(x->views);
    free(x->wave_e);
    free(x->disk);
    free(x->next_h);
    model_free(&x->m);
    free(x->bases);
    if (x->pm.files) packed_manifest_free(&x->pm);
    free(x);
}

void xserve_disk_stats(const xserve_t *x, dtier_stats_t *st)
{
    if (x) dtier_stats(x->dt, st);
    else memset(st, 0, sizeof *st);
}
