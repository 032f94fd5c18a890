/* gpu_cpu.c - CPU experts on the GPU path: which missed experts the prefetchers compute instead
 * of a copy over PCIe (the cost model), their jobs, and their results onto the GPU's residual.
 *
 * With o.remote and a whole-expert cache, a step of up to GPU_CPU_ROWS tokens runs every MoE
 * layer's hand-off (gpu_step.c enqueues both ends):
 *   - right after the gate, before the prediction, one kernel of the segment stores the layer's
 *     normed rows (xn) and routing weights (tw) into pinned host memory (h_xn, h_tw), then sets
 *     the layer's flag (h_xflag; cuda_put_host);
 *   - the host, once the routing is there, decides each miss (gslots_ensure -> gcpu_plan): a
 *     copy into a slot, or the CPU, whose experts get an empty table entry that the expert
 *     kernel skips; it posts the CPU experts' rows to their prefetchers' rings at once
 *     (gcpu_post, after the flag), then places the GPU's experts, enqueues the next segment,
 *     starts the predicted copies, and then waits for the jobs (gcpu_finish): each token's
 *     results weighted and summed into h_cy, then the box;
 *   - the next segment runs the GPU's experts, then cuda_wait_add_rows, which waits for that box
 *     and adds h_cy's rows onto the residual, before anything reads it (the combine's fused
 *     RMSNorm is off in such steps).
 * The GPU computes its hits and copies while the prefetchers compute theirs; the stream waits
 * only for the slower side.
 *
 * The cost model. A miss copied costs copy_bytes at the link's rate (pcie_us_b, probed at
 * creation) behind the copies in flight; a miss on prefetcher d costs cpu_lat_us[d] once per job
 * plus its bytes, times 1 + GPU_CPU_ROW_COST per token beyond the first, at cpu_us_b[d]: the fixed
 * cost and the rate are fitted by least squares to every answered job's wall time (s_fit). A
 * share phi of the experts, fixed by a hash of (layer, expert) so that the window does not
 * prefetch them (gcpu_leave), is the CPU's side: the share its prefetchers finish, fixed cost
 * included, while the link moves the rest of what a layer moves on average (s_phi), none where
 * a layer's copies take less than that fixed cost. The other misses, most tokens first, each go
 * to the side that finishes it sooner, so both sides end together and the experts many tokens
 * share stay on the GPU. The layer's serial part counts only layers whose GPU was done with its
 * own experts when the box opened (the kernel's arrival word): else a GPU held up by copies
 * would make the serial part look long, which sends more to the link, which holds it up more.
 * The tuner (gcpu_tune) scales the CPU's cost by the factor that measured steps find fastest.
 *
 * Faults: a prefetcher that is down at the plan (moe_remote_t.rows NULL) gets no experts, so its
 * misses are copied until it is back; a job it fails or does not answer in time (the ring's
 * bounded wait) is computed here, by the CPU kernels, into cpu_fy.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "model/gpu_int.h"

#define GPU_CPU_ROW_COST 0.1   /* an expert's CPU time per token beyond the first, as a share */
#define GPU_CPU_LAT_US 40.0    /* a job's fixed cost at first: the ring's round trip, the dispatch */
#define GPU_CPU_GBS0 30.0      /* a prefetcher's rate at first, GB/s of expert bytes */
#define GPU_CPU_EMA 0.2        /* weight of a job's rate in the average */
#define GPU_CPU_TUNE_STEPS 8     /* steps of one size in a phase of the tuner */
#define GPU_CPU_TUNE_DITHER 1.08 /* its phases' kappa above and below the centre, a factor */
#define GPU_CPU_TUNE_FAC 1.4     /* the centre's largest move, a factor */
#define GPU_CPU_TUNE_MIN 1.04    /* and its smallest */
#define GPU_CPU_TUNE_LO 0.25     /* the centre's range */
#define GPU_CPU_TUNE_HI 4.0

bool gcpu_step(const gpu_model_t *g, int n) { return g->cpu_on && n > 0 && n <= GPU_CPU_ROWS; }

uint64_t *gcpu_box(const gpu_model_t *g, int k) { return g->h_cbox + (size_t)(k % GPU_RING) * GPU_CPU_BOX; }

int gcpu_probe(gpu_model_t *g)
{
    /* slot 0 is copied again with what it holds (the fill put the first layer's experts in
     * the first slots): another expert's bytes there would be computed under its name */
    const xc_slot_t *s0 = &g->xc.slot[0];
    const int l0 = s0->layer >= 0 ? s0->layer : g->xc.moe_layer[0], e0 = s0->layer >= 0 ? s0->expert : 0;
    int rc;
    double best = 1e30;
    for (int i = 0; i < 3; i++) {
        double t0 = strata_now();
        if ((rc = gslots_fill(g, 0, l0, e0, CUDA_STREAM_COMPUTE)) || (rc = cuda_sync(g->cx))) return rc;
        double t = strata_now() - t0;
        if (t < best) best = t;
    }
    g->pcie_us_b = best * 1e6 / (double)g->copy_bytes;
    for (int d = 0; d < GPU_CPU_DEST; d++) {
        g->cpu_us_b[d] = 1e-3 / GPU_CPU_GBS0;
        g->cpu_lat_us[d] = GPU_CPU_LAT_US;
    }
    for (int i = 0; i < GPU_CPU_CLASSES; i++) {
        g->cpu_kappa[i] = 1.0;
        g->cpu_kfac[i] = 1.15;
    }
    g->st.cpu_kappa = 1.0;
    return 0;
}

/* The bytes of one expert over cnt tokens, in the cost model's unit. */
static double s_cost_bytes(const gpu_model_t *g, int cnt)
{
    return (double)g->copy_bytes * (1.0 + GPU_CPU_ROW_COST * (cnt > 1 ? cnt - 1 : 0));
}

/* Whether expert e of layer l is on the CPU's side of a split that gives it share phi of the
 * experts: a fixed hash of (l, e) against phi, so the side of an expert does not change from one
 * prediction to the next (the window predicts a layer many times before it runs) nor with what
 * the link copied meanwhile. */
static bool s_cpu_side(int l, int e, int E, double phi)
{
    const uint32_t h = (uint32_t)((uint32_t)(l * E + e) * 2654435761u);
    return (double)h < phi * 4294967296.0;
}

static int s_size_class(int n) { return n <= 1 ? 0 : n <= 4 ? 1 : 2; }

/* us per byte of the prefetchers together for a step of n tokens, the tuner's factor applied */
static double s_cpu_us_b(const gpu_model_t *g, int d, int n) { return g->cpu_us_b[d] * gcpu_kappa(g, n); }

/* The CPU's side of the split: the share x of the experts a layer moves (M of them, as averaged
 * for steps of n tokens, each of B bytes in the model's unit) that the prefetchers finish, their fixed cost
 * L once, after the layer's serial part S (cpu_ser_us: the link copies through it, the CPU
 * cannot start before the layer's rows are there), in the time the link moves the rest:
 * S + L + x M B c = (1 - x) M B p, with c and p the us per byte of the prefetchers together and
 * of the link. Where one layer's copies take less than S + L (small experts at batch 1) that is
 * none: a hand-off to the CPU would only add its latency to every layer. Every miss with ALL. */
static double s_phi(const gpu_model_t *g, int n)
{
    if (g->o.cpu_policy == GPU_CPU_ALL) return 1.0;
    const model_config_t *c = &g->m->cfg;
    double rc = 0, lat = 1e30;
    for (int d = 0; d < g->o.remote->n_dest && d < GPU_CPU_DEST; d++) {
        rc += 1.0 / s_cpu_us_b(g, d, n);
        if (g->cpu_lat_us[d] < lat) lat = g->cpu_lat_us[d];
    }
    if (rc <= 0) return 0.0;
    const double M = g->cpu_miss[s_size_class(n)], p = g->pcie_us_b, cu = 1.0 / rc;
    const double tpe = (double)n * c->top_k / (c->n_experts > 0 ? c->n_experts : 1); /* tokens per expert */
    const double B = (double)g->copy_bytes * (1.0 + GPU_CPU_ROW_COST * (tpe > 1 ? tpe - 1 : 0));
    if (M <= 0) return p / (p + cu);
    const double x = (M * B * p - lat - g->cpu_ser_us) / (M * B * (p + cu));
    return x < 0 ? 0 : x > 1 ? 1 : x;
}

/* One answered job of prefetcher d: bytes (the model's unit) in us of wall time, into the
 * averages, then its fixed cost and rate by least squares over them (the jobs' sizes vary with
 * the routing); with too little spread in sizes yet, the rate alone, the fixed cost kept. */
static void s_fit(gpu_model_t *g, int d, double bytes, double us)
{
    double *f = g->cpu_fit[d];
    const double w = f[0] == 0 ? 1.0 : GPU_CPU_EMA;
    f[0] += w * (bytes - f[0]);
    f[1] += w * (us - f[1]);
    f[2] += w * (bytes * bytes - f[2]);
    f[3] += w * (bytes * us - f[3]);
    const double var = f[2] - f[0] * f[0], cov = f[3] - f[0] * f[1];
    if (var > 0.01 * f[0] * f[0] && cov > 0) {
        const double rate = cov / var, lat = f[1] - rate * f[0];
        if (lat >= 0) {
            g->cpu_us_b[d] = rate;
            g->cpu_lat_us[d] = lat;
            return;
        }
    }
    const double rest = f[1] - g->cpu_lat_us[d];
    g->cpu_us_b[d] = (rest > 1.0 ? rest : 1.0) / f[0];
}

void gcpu_plan(gpu_model_t *g, int l, int n, const int32_t *idx, const int32_t *misses, int nm)
{
    const model_config_t *c = &g->m->cfg;
    const moe_remote_t *r = g->o.remote;
    const int E = c->n_experts, K = c->top_k;
    memset(g->cpu_dest, -1, (size_t)E);
    g->cpu_n = 0;
    if (!gcpu_step(g, n)) return;
    /* the experts moved since the last layer's plan: its prefetches, misses and CPU experts
     * (the window prefetches most of a layer's experts before its routing is known: the misses
     * alone would leave out what the link is busy with) */
    const uint64_t moved = g->st.prefetches + g->st.misses + g->st.cpu_uses;
    double *avg = &g->cpu_miss[s_size_class(n)];
    if (g->cpu_moved && moved >= g->cpu_moved) *avg += (*avg == 0 ? 1.0 : 0.02) * ((double)(moved - g->cpu_moved) - *avg);
    g->cpu_moved = moved;
    if (nm == 0) return;
    const gpu_cpu_policy_t pol = g->o.cpu_policy;
    if (pol == GPU_CPU_STATIC && g->xc.moe_ord[l] >= g->cpu_static) return;
    const int8_t *own = r->owner + (size_t)l * E;
    memset(g->cpu_cnt, 0, (size_t)E * sizeof *g->cpu_cnt);
    for (int i = 0; i < n * K; i++) g->cpu_cnt[idx[i]]++;
    int8_t up[GPU_CPU_DEST]; /* -1 unknown, 0 down, 1 up: asked once a layer */
    memset(up, -1, sizeof up);
    /* the most tokens first: insertion sort of a few dozen */
    int32_t ord[GPU_CPU_MISS_MAX];
    for (int i = 0; i < nm; i++) {
        int j = i, e = misses[i];
        while (j > 0 && g->cpu_cnt[ord[j - 1]] < g->cpu_cnt[e]) ord[j] = ord[j - 1], j--;
        ord[j] = e;
    }
    double pcie = (double)xcache_inflight(&g->xc) * (double)g->copy_bytes * g->pcie_us_b, cpu[GPU_CPU_DEST];
    for (int d = 0; d < r->n_dest && d < GPU_CPU_DEST; d++) cpu[d] = g->cpu_lat_us[d];
    const double phi = s_phi(g, n);
    for (int i = 0; i < nm; i++) {
        const int e = ord[i], d = own[e];
        const double tp = pcie + (double)g->copy_bytes * g->pcie_us_b;
        if (d >= 0 && d < GPU_CPU_DEST && up[d] < 0) up[d] = r->rows(r->ctx, d) != NULL;
        if (d < 0 || d >= GPU_CPU_DEST || !up[d]) {
            pcie = tp;
            continue;
        }
        const double tc = cpu[d] + s_cost_bytes(g, g->cpu_cnt[e]) * s_cpu_us_b(g, d, n);
        /* the CPU's side of the split (gcpu_leave did not prefetch it) stays there; another
         * miss goes where it finishes first */
        if (pol == GPU_CPU_COST && !s_cpu_side(l, e, E, phi) && tc >= tp) {
            pcie = tp;
            continue;
        }
        cpu[d] = tc;
        g->cpu_dest[e] = (int8_t)d;
        g->cpu_n++;
    }
}

/* The tuner: the rates above leave out what the cost model does not see (the GPU's own work on
 * the hits, the copies ahead that share the link, the host memory that the copies and the CPU
 * share), so the CPU's cost per byte is scaled by kappa, one per step size class, found by
 * measuring: the steps run GPU_CPU_TUNE_STEPS at a time with kappa x d, then / d, / d, x d
 * (d = GPU_CPU_TUNE_DITHER; the order cancels a steady drift, such as the cache warming up),
 * and kappa then moves toward the faster side by a factor that grows while the direction
 * holds (to GPU_CPU_TUNE_FAC) and shrinks when it turns. A step's time is from its start to the
 * next one's, so only back-to-back steps of the same size count: a prefill between them, or a
 * gap over 8 times the last phase's mean, is left out. */
/* Whether phase ph of the tuner runs kappa above its centre (x d, / d, / d, x d). */
static bool s_tune_above(int ph) { return ph == 0 || ph == 3; }

double gcpu_kappa(const gpu_model_t *g, int n)
{
    const int c = s_size_class(n);
    return g->cpu_kappa[c] * (s_tune_above(g->cpu_kphase[c]) ? GPU_CPU_TUNE_DITHER : 1.0 / GPU_CPU_TUNE_DITHER);
}

void gcpu_tune(gpu_model_t *g, int n)
{
    const double now = strata_now(), t = g->cpu_tune_t;
    const int pn = g->cpu_tune_n;
    const bool on = gcpu_step(g, n) && g->o.cpu_policy == GPU_CPU_COST;
    g->cpu_tune_t = on ? now : 0;
    g->cpu_tune_n = n;
    if (!on || t <= 0 || pn != n) return;
    const int c = s_size_class(n), ph = g->cpu_kphase[c];
    const double dt = now - t;
    if (g->cpu_kmean[c] > 0 && dt > 8.0 * g->cpu_kmean[c]) return;
    g->cpu_kphsum[c] += dt;
    if (++g->cpu_kcnt[c] < GPU_CPU_TUNE_STEPS) return;
    g->cpu_kmean[c] = g->cpu_kphsum[c] / g->cpu_kcnt[c];
    g->cpu_ksum[c][s_tune_above(ph) ? 0 : 1] += g->cpu_kphsum[c];
    g->cpu_kphsum[c] = 0;
    g->cpu_kcnt[c] = 0;
    if (ph < 3) {
        g->cpu_kphase[c] = ph + 1;
        return;
    }
    g->cpu_kphase[c] = 0;
    const int dir = g->cpu_ksum[c][0] < g->cpu_ksum[c][1] ? 1 : -1; /* toward the faster side */
    g->cpu_ksum[c][0] = g->cpu_ksum[c][1] = 0;
    double *f = &g->cpu_kfac[c];
    if (dir == g->cpu_kdir[c]) *f = *f * 1.25 < GPU_CPU_TUNE_FAC ? *f * 1.25 : GPU_CPU_TUNE_FAC;
    else if (g->cpu_kdir[c]) *f = sqrt(*f) > GPU_CPU_TUNE_MIN ? sqrt(*f) : GPU_CPU_TUNE_MIN;
    g->cpu_kdir[c] = dir;
    double k = g->cpu_kappa[c] * (dir > 0 ? *f : 1.0 / *f);
    k = k < GPU_CPU_TUNE_LO ? GPU_CPU_TUNE_LO : k > GPU_CPU_TUNE_HI ? GPU_CPU_TUNE_HI : k;
    g->cpu_kappa[c] = k;
    g->st.cpu_kappa = k;
}

void gcpu_leave(gpu_model_t *g, int n)
{
    xcache_t *xc = &g->xc;
    const moe_remote_t *r = g->o.remote;
    const int E = xc->n_experts;
    if (!gcpu_step(g, n) || g->o.cpu_policy == GPU_CPU_STATIC) return;
    const double phi = s_phi(g, n);
    for (int d = 0; d < xc->win_n; d++) {
        const int l = xc->moe_layer[xc->win_lo + d];
        uint8_t *pn = xc->pneed + (size_t)l * E;
        const int32_t *so = xc->slot_of + (size_t)l * E;
        const int8_t *own = r->owner + (size_t)l * E;
        for (int e = 0; e < E; e++)
            if (pn[e] && so[e] < 0 && own[e] >= 0 && s_cpu_side(l, e, E, phi)) pn[e] = 2;
    }
}

/* Wait for flag (pinned host memory) to be set by the stream: an error on it, or 10 s, ends the
 * wait with an error. */
static int s_wait_flag(gpu_model_t *g, const uint64_t *flag)
{
    const double t0 = strata_now();
    for (int spin = 0;; spin++) {
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE)) return 0;
        int q = cuda_query(g->cx);
        if (q < 0) return q;
        if ((q == 1 && !__atomic_load_n(flag, __ATOMIC_ACQUIRE)) || (spin % 1024 == 1023 && strata_now() - t0 > 10.0)) {
            log_error("gpu: a MoE layer's rows never reached the host for its CPU experts");
            return STRATA_ECUDA;
        }
    }
}

int gcpu_post(gpu_model_t *g, int k, int n, const int32_t *idx)
{
    if (!gcpu_step(g, n)) return 0;
    const model_config_t *c = &g->m->cfg;
    const moe_remote_t *r = g->o.remote;
    const int E = c->n_experts, K = c->top_k, H = c->hidden, l = g->xc.moe_layer[k];
    memset(g->cpu_t_post, 0, sizeof g->cpu_t_post);
    if (g->cpu_n == 0) {
        /* nothing to add: every token's flag off (the entry's last use may have set some, and
         * h_cy holds that layer's sums), then the box */
        uint64_t *box = gcpu_box(g, k);
        for (int t = 0; t < n; t++) box[1 + t] = 0;
        __atomic_store_n(box, (uint64_t)1, __ATOMIC_RELEASE);
        return 0;
    }
    const double t0 = strata_now();
    int rc = s_wait_flag(g, g->h_xflag + (size_t)(k % GPU_RING) * 8);
    const double t1 = strata_now();
    g->st.host_us[GPU_HOST_FLAG] += (t1 - t0) * 1e6;
    if (rc) return rc;
    if (g->st.steps > 0 && (g->st.steps == 64 || g->st.steps % 4096 == 0) && g->cpu_log_step != g->st.steps) {
        g->cpu_log_step = g->st.steps; /* the step's first layer with CPU experts */
        log_info("cpu experts, the cost model at step %llu: the link %.1f GB/s, prefetcher 0 %.1f GB/s + %.0f us a job, "
                 "a layer's serial part %.0f us, the CPU's cost tuned x%.2f (1 token) x%.2f (2-4) x%.2f (more), "
                 "its share of this step's misses %.2f; the GPU waited for the CPU in %.0f%% of the layers",
                 (unsigned long long)g->st.steps, 1e-3 / g->pcie_us_b, 1e-3 / g->cpu_us_b[0], g->cpu_lat_us[0],
                 g->cpu_ser_us, g->cpu_kappa[0], g->cpu_kappa[1], g->cpu_kappa[2], s_phi(g, n),
                 g->st.cpu_layers_posted ? 100.0 * (double)g->st.cpu_gpu_waits / (double)g->st.cpu_layers_posted : 0.0);
    }
    if (g->cpu_t_box > 0 && g->cpu_k_box == k - 1 && g->cpu_step_box == g->st.steps && g->cpu_gpu_waited) {
        const double us = (strata_now() - g->cpu_t_box) * 1e6;
        g->cpu_ser_us += (g->cpu_ser_us == 0 ? 1.0 : GPU_CPU_EMA) * (us - g->cpu_ser_us);
    }
    int32_t ex[GPU_CPU_MISS_MAX], cnt[GPU_CPU_MISS_MAX];
    for (int i = 0; i < n * K; i++) g->cpu_row[i] = -1;
    for (int d = 0; d < r->n_dest && d < GPU_CPU_DEST; d++) {
        int ni = 0, row = 0;
        double bytes = 0;
        float *rows = NULL;
        bool any = false;
        for (int e = 0; e < E; e++) {
            if (g->cpu_dest[e] != d) continue;
            if (!any) {
                any = true;
                rows = r->rows(r->ctx, d); /* NULL: it went down since the plan; computed here */
            }
            for (int i = 0; i < n * K; i++) {
                if (idx[i] != e) continue;
                if (rows) memcpy(rows + (size_t)row * H, g->h_xn + (size_t)(i / K) * H, (size_t)H * 4);
                g->cpu_row[i] = row++;
            }
            ex[ni] = e;
            cnt[ni++] = g->cpu_cnt[e];
            bytes += s_cost_bytes(g, g->cpu_cnt[e]);
        }
        if (!any) continue;
        g->cpu_bytes[d] = bytes;
        g->cpu_t_post[d] = rows && r->post(r->ctx, d, l, ex, cnt, ni, g->st.steps) == 0 ? strata_now() : -1.0;
    }
    g->st.host_us[GPU_HOST_POST] += (strata_now() - t1) * 1e6;
    return 0;
}

/* Prefetcher d's experts of the layer computed here, each (token, expert) pair on its own into
 * cpu_fy at its row: the same kernels as the prefetcher's, whose outputs do not depend on the
 * rows beside them. */
static void s_compute_here(gpu_model_t *g, int l, int n, const int32_t *idx, int d)
{
    const model_config_t *c = &g->m->cfg;
    const int K = c->top_k, H = c->hidden;
    const layer_t *L = &g->m->layers[l];
    cpu_ffn_item_t it[CPU_FFN_MANY_MAX];
    cpu_ffn_opts_t op[CPU_FFN_MANY_MAX]; /* gpt-oss: the expert's biases and clamped activation */
    int ni = 0;
    for (int i = 0; i < n * K; i++) {
        if (g->cpu_row[i] < 0 || g->cpu_dest[idx[i]] != d) continue;
        const ffn_t *x = &L->experts[idx[i]];
        op[ni] = forward_expert_opts(g->m, L, idx[i]);
        it[ni] = (cpu_ffn_item_t){.x = g->h_xn + (size_t)(i / K) * H, .out = g->cpu_fy + (size_t)g->cpu_row[i] * H,
                                  .n = 1, .gate = &x->gate, .up = &x->up, .down = &x->down, .opts = &op[ni]};
        ni++;
        g->st.cpu_local++;
        if (ni == CPU_FFN_MANY_MAX) {
            cpu_ffn_swiglu_many(NULL, it, ni, g->cpu_scr);
            ni = 0;
        }
    }
    if (ni) cpu_ffn_swiglu_many(NULL, it, ni, g->cpu_scr);
}

int gcpu_finish(gpu_model_t *g, int k, int n, const int32_t *idx)
{
    if (!gcpu_step(g, n) || g->cpu_n == 0) return 0;
    const model_config_t *c = &g->m->cfg;
    const moe_remote_t *r = g->o.remote;
    const int K = c->top_k, H = c->hidden, l = g->xc.moe_layer[k];
    uint64_t *box = gcpu_box(g, k);
    const double t0 = strata_now();
    memset(g->h_cy, 0, (size_t)n * H * 4);
    for (int t = 0; t < n; t++) box[1 + t] = 0;
    for (int d = 0; d < r->n_dest && d < GPU_CPU_DEST; d++) {
        if (g->cpu_t_post[d] == 0) continue;
        const float *out = NULL;
        if (g->cpu_t_post[d] > 0 && r->wait(r->ctx, d, &out) == 0) {
            s_fit(g, d, g->cpu_bytes[d], (strata_now() - g->cpu_t_post[d]) * 1e6);
        } else {
            s_compute_here(g, l, n, idx, d);
            out = g->cpu_fy;
        }
        for (int i = 0; i < n * K; i++) {
            if (g->cpu_row[i] < 0 || g->cpu_dest[idx[i]] != d) continue;
            const int t = i / K;
            const float w = g->h_tw[i], *y = out + (size_t)g->cpu_row[i] * H;
            float *dst = g->h_cy + (size_t)t * H;
            for (int j = 0; j < H; j++) dst[j] += w * y[j];
            box[1 + t] = 1;
            g->st.cpu_rows++;
        }
    }
    g->st.cpu_uses += (uint64_t)g->cpu_n;
    g->st.host_us[GPU_HOST_CPU_WAIT] += (strata_now() - t0) * 1e6;
    /* whether the GPU had finished its own experts of the layer: then what follows the box until
     * the next layer's rows is the layer's serial part alone */
    g->cpu_gpu_waited = __atomic_load_n(box + GPU_CPU_ARRIVED, __ATOMIC_ACQUIRE) != 0;
    g->st.cpu_layers_posted++;
    g->st.cpu_gpu_waits += g->cpu_gpu_waited;
    __atomic_store_n(box, (uint64_t)1, __ATOMIC_RELEASE);
    g->cpu_t_box = strata_now();
    g->cpu_k_box = k;
    g->cpu_step_box = g->st.steps;
    return 0;
}
