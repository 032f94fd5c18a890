/* roofline.c - decode bound arithmetic and ceilings (see roofline.h). */
#include "bench/roofline.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define GIB (1024.0 * 1024.0 * 1024.0)

const machine_t roofline_rtx3090 = {"rtx3090+pcie3+2xE5-2699v4", 24.0 * GIB, 936e9, 12e9, 120e9};
const machine_t roofline_rtx4090 = {"rtx4090+pcie4+ddr5", 24.0 * GIB, 1008e9, 25e9, 80e9};

/* A layer's bias vectors of all its experts, [n_experts][...] each (packed_slots'
 * layers.N.experts_{gate,up,down}_bias): resident, but a step reads the touched experts' rows. */
static bool s_expert_vec(const char *name)
{
    size_t n = strlen(name);
    return strstr(name, ".experts_") && n > 5 && !strcmp(name + n - 5, "_bias");
}

void roofline_model_from_manifest(roofline_model_t *rm, const model_config_t *c, const packed_manifest_t *pm)
{
    memset(rm, 0, sizeof *rm);
    int first = -1; /* the first MoE layer: its expert 0 is the expert counted */
    for (int k = 0; k < c->n_layers && first < 0; k++)
        if (c->layer_sparse[k]) first = k;
    for (int32_t i = 0; i < pm->n_tensors; i++) {
        const packed_tensor_t *t = &pm->tensors[i];
        double b = (double)(t->bytes + t->scale_bytes);
        bool in_first = !strncmp(t->name, "layers.", 7) && atoi(t->name + 7) == first;
        if (!strcmp(t->name, "embed")) {
            rm->embed_bytes += b;
        } else if (s_expert_vec(t->name)) {
            if (in_first && c->n_experts > 0) rm->expert_vec_bytes += b / c->n_experts;
        } else if (strstr(t->name, ".experts.")) {
            /* one expert: the largest block's tensors (all experts share one shape) */
            if (in_first && strstr(t->name, ".experts.0.")) rm->expert_bytes += b;
        } else {
            rm->resident_bytes += b;
        }
    }
    if (c->tie_embeddings) rm->resident_bytes += rm->embed_bytes; /* lm_head reads the table */
    for (int l = 0; l < c->n_layers; l++) rm->n_moe_layers += c->layer_sparse[l] ? 1 : 0;
    rm->n_experts = c->n_experts;
    rm->top_k = c->top_k;
    rm->n_experts_total = (int64_t)rm->n_moe_layers * c->n_experts;
    const double kv_layer = 2.0 * c->n_kv_heads * c->head_dim * sizeof(float);
    rm->kv_bytes_per_token = c->n_layers * kv_layer;
    if (c->sliding_window > 0) {
        for (int l = 0; l < c->n_layers; l++) rm->kv_window_bytes_per_token += c->layer_sliding[l] ? kv_layer : 0;
        rm->sliding_window = c->sliding_window;
    }
}

int roofline_model_from_config(roofline_model_t *rm, const model_config_t *c, wfmt_t fmt, int group, wfmt_t attn_fmt,
                               strata_errbuf_t *eb)
{
    packed_write_opts_t o;
    packed_manifest_t pm;
    packed_write_opts_default(&o, fmt);
    o.group = group;
    o.attn_fmt = attn_fmt;
    o.embed_fmt = fmt == WF_F32 ? WF_F32 : WF_BF16;
    o.embed_as_source = false;
    int rc = packed_plan(c, &o, &pm, NULL, eb);
    if (rc < 0) return rc;
    roofline_model_from_manifest(rm, c, &pm);
    packed_manifest_free(&pm);
    return 0;
}

double roofline_host_bw(const machine_t *mc, bool *assumed)
{
    if (assumed) *assumed = !(mc->host_bw > 0);
    if (mc->host_bw > 0) return mc->host_bw;
    double p = mc->pcie_bw > 0 ? mc->pcie_bw : 0, c = mc->cpu_bw > 0 ? mc->cpu_bw : 0;
    double h = ROOFLINE_HOST_SHARED_FRACTION * (p + c);
    if (p > h) h = p;
    if (c > h) h = c;
    return h;
}

void roofline_run_default(roofline_run_t *r)
{
    memset(r, 0, sizeof *r);
    r->batch = 1;
    r->slots = -1;
    r->hit_rate = -1;
    r->host_experts = -1;
}

/* three_tier from host_shared: the bytes from host memory (from_host) less the share host memory
 * holds come from disk first. */
static void s_three_tier(const roofline_model_t *m, const machine_t *mc, const roofline_run_t *r, double from_host,
                         roofline_t *out)
{
    double fh = 1;
    if (r->host_experts >= 0 && m->n_experts_total > 0) fh = r->host_experts / (double)m->n_experts_total;
    if (fh > 1) fh = 1;
    out->host_fraction = fh;
    out->disk_bytes = from_host * (1 - fh);
    out->three_tier_step_s = out->host_shared_step_s;
    out->three_tier_limit = out->host_shared_limit;
    if (out->disk_bytes > 0) {
        if (!(mc->disk_bw > 0)) {
            out->three_tier_step_s = 0;
            out->three_tier_limit = "disk (rate unknown)";
        } else if (out->disk_bytes / mc->disk_bw > out->three_tier_step_s) {
            out->three_tier_step_s = out->disk_bytes / mc->disk_bw;
            out->three_tier_limit = "disk";
        }
    }
    out->three_tier_tok_s = out->three_tier_step_s > 0 ? r->batch / out->three_tier_step_s : 0;
}

int roofline_decode(const roofline_model_t *m, const machine_t *mc, const roofline_run_t *r, roofline_t *out)
{
    memset(out, 0, sizeof *out);
    if (r->batch < 1) return STRATA_EINVAL_INPUT;
    const double B = r->batch, E = m->n_experts, k = m->top_k;
    /* distinct experts per MoE layer: each of E is missed by one token with probability 1 - k/E */
    out->distinct_experts = E > 0 ? E * (1.0 - pow(1.0 - k / E, B)) : 0.0;
    const double touched = m->n_moe_layers * out->distinct_experts * m->expert_bytes;
    const double touched_vec = m->n_moe_layers * out->distinct_experts * m->expert_vec_bytes;
    /* a sliding-window layer reads at most its window of each sequence's positions */
    const double win = m->sliding_window > 0 && m->sliding_window < r->context ? m->sliding_window : r->context;
    out->kv_bytes = B * (r->context * (m->kv_bytes_per_token - m->kv_window_bytes_per_token) +
                         win * m->kv_window_bytes_per_token);
    out->bytes_per_token = (m->resident_bytes + out->kv_bytes + touched + touched_vec) / B;
    out->host_bw = roofline_host_bw(mc, &out->host_bw_assumed);

    if (r->cpu_backend) {
        if (!(mc->cpu_bw > 0)) return STRATA_EINVAL_INPUT;
        out->slots = (double)m->n_experts_total;
        out->hit_rate = 1.0;
        out->hit_bytes = touched;
        out->gpu_bytes = 0;
        out->cpu_share = 1.0;
        /* one reader: the CPU alone, so bandwidths added and host memory shared are the same */
        out->bw_added_step_s = out->host_shared_step_s =
            (m->resident_bytes + out->kv_bytes + touched + touched_vec) / mc->cpu_bw;
        out->bw_added_limit = out->host_shared_limit = "cpu memory";
        out->bw_added_tok_s = out->host_shared_tok_s = B / out->bw_added_step_s;
        out->pcie_only_limit = "none";
        s_three_tier(m, mc, r, touched, out);
        return 0;
    }
    if (!(mc->hbm_bw > 0) || !(mc->pcie_bw > 0 || mc->cpu_bw > 0)) return STRATA_EINVAL_INPUT;
    double budget = r->gpu_mem > 0 ? r->gpu_mem : mc->gpu_mem;
    double slots;
    if (r->slots >= 0) {
        slots = r->slots;
    } else {
        /* every expert's bias vectors are held on the GPU with the resident weights */
        double left = budget - m->resident_bytes - (double)m->n_experts_total * m->expert_vec_bytes - r->reserved_bytes;
        if (budget > 0 && left < 0) return STRATA_EINVAL_INPUT;
        slots = budget > 0 && m->expert_bytes > 0 ? floor(left / m->expert_bytes) : (double)m->n_experts_total;
    }
    if (slots > (double)m->n_experts_total) slots = (double)m->n_experts_total;
    out->slots = slots;
    double h = r->hit_rate >= 0 ? r->hit_rate : (m->n_experts_total ? slots / (double)m->n_experts_total : 1.0);
    if (h > 1) h = 1;
    out->hit_rate = h;
    out->hit_bytes = h * touched;
    const double M = touched - out->hit_bytes;
    out->miss_bytes = M;
    out->gpu_bytes = m->resident_bytes + out->kv_bytes + touched + touched_vec;

    /* min over x of max(a + b(1-x), c(1-x), d x): a = fixed GPU reads (with the hit experts' bias
     * vectors), b = missed bytes read again by the GPU, c = transfer, d = CPU. The max of the two
     * decreasing lines meets the increasing one at the larger of their separate crossings. */
    const double a = (m->resident_bytes + out->kv_bytes + out->hit_bytes + h * touched_vec) / mc->hbm_bw;
    const double b = M / mc->hbm_bw;
    if (M <= 0) {
        out->pcie_only_step_s = out->bw_added_step_s = out->host_shared_step_s = a;
        out->pcie_only_limit = out->bw_added_limit = out->host_shared_limit = "hbm";
    } else {
        const double c = mc->pcie_bw > 0 ? M / mc->pcie_bw : INFINITY;
        const double d = mc->cpu_bw > 0 ? M / mc->cpu_bw : INFINITY;
        if (isfinite(c)) {
            out->pcie_only_step_s = a + b > c ? a + b : c;
            out->pcie_only_limit = a + b >= c ? "hbm" : "pcie";
        }
        double x;
        if (!isfinite(d)) x = 0; /* no CPU path */
        else if (!isfinite(c)) x = 1; /* no transfer path */
        else {
            double x1 = (a + b) / (b + d), x2 = c / (c + d);
            x = x1 > x2 ? x1 : x2;
            if (x > 1) x = 1;
        }
        double t1 = a + b * (1 - x), t2 = isfinite(c) ? c * (1 - x) : (x < 1 ? INFINITY : 0), t3 = isfinite(d) ? d * x : 0;
        double t = t1 > t2 ? t1 : t2;
        if (t3 > t) t = t3;
        out->bw_added_step_s = t;
        out->cpu_share = x;
        out->bw_added_limit = t1 >= t2 && t1 >= t3 ? "hbm" : !isfinite(d) ? "pcie" : "pcie+cpu";
        /* host memory shared: the copy reads (1-x) M and the CPU x M of host memory, M together
         * at any split, so the cap is one constant term and the best split of bw_added stays a
         * best split: max(T_bw_added, M / host) */
        const double th = out->host_bw > 0 ? M / out->host_bw : 0;
        out->host_shared_step_s = th > t ? th : t;
        out->host_shared_limit = th > t ? "host memory" : out->bw_added_limit;
    }
    out->pcie_only_tok_s = out->pcie_only_step_s > 0 ? B / out->pcie_only_step_s : 0;
    if (!out->pcie_only_limit) out->pcie_only_limit = "none";
    out->bw_added_tok_s = B / out->bw_added_step_s;
    out->host_shared_tok_s = B / out->host_shared_step_s;
    s_three_tier(m, mc, r, M, out);
    return 0;
}

/* ---- host memory bandwidth --------------------------------------------------------------- */

typedef long long s_v2i __attribute__((vector_size(16)));

typedef struct {
    const s_v2i *buf;
    s_v2i sink[64]; /* per-thread results, so the loads are not optimized away */
} s_bw_t;

static void s_bw_chunk(void *ctx, int64_t i0, int64_t i1, int tid)
{
    s_bw_t *c = ctx;
    s_v2i a0 = {0, 0}, a1 = a0, a2 = a0, a3 = a0;
    const s_v2i *p = c->buf;
    for (int64_t i = i0 * 1024; i < i1 * 1024; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    c->sink[tid & 63] += a0 + a1 + a2 + a3;
}

double roofline_cpu_read(tpool_t *pool, const void *buf, size_t bytes)
{
    s_bw_t c;
    memset(&c, 0, sizeof c);
    c.buf = buf;
    int64_t items = (int64_t)(bytes / (1024 * sizeof(s_v2i))); /* items of 16 KiB */
    double t0 = strata_now();
    tpool_run(pool, items, 16, s_bw_chunk, &c);
    return strata_now() - t0;
}

double roofline_cpu_membw(tpool_t *pool, size_t bytes, int passes)
{
    s_v2i *buf = NULL;
    bytes &= ~(size_t)(16 * 1024 - 1);
    if (bytes == 0 || posix_memalign((void **)&buf, 4096, bytes) != 0) return 0;
    memset(buf, 1, bytes);
    double best = 0;
    for (int i = 0; i < passes; i++) {
        double bw = (double)bytes / roofline_cpu_read(pool, buf, bytes);
        if (bw > best) best = bw;
    }
    free(buf);
    return best;
}

void roofline_print(FILE *f, const roofline_model_t *m, const machine_t *here, const roofline_run_t *r,
                    double measured_tok_s)
{
    const machine_t *ms[3] = {here, &roofline_rtx3090, &roofline_rtx4090};
    fprintf(f, "%-28s %9s %7s %7s %7s %8s %7s %6s %6s %10s %10s %12s %12s", "roofline (decode)", "gpu_mem", "hbm",
            "pcie", "cpu", "host", "slots", "hit", "cpu%", "pcie-only", "bw-added", "host-shared", "limit");
    if (measured_tok_s > 0) fprintf(f, "  ratio: pcie-only bw-added host-shared");
    fprintf(f, "\n");
    for (int i = 0; i < 3; i++) {
        const machine_t *mc = ms[i];
        roofline_run_t rr = *r;
        if (i > 0) { /* projection: same run, that machine's memory and a uniform-routing cache */
            rr.cpu_backend = false;
            rr.slots = -1;
            rr.hit_rate = -1;
            if (rr.gpu_mem <= 0 || rr.gpu_mem > mc->gpu_mem) rr.gpu_mem = mc->gpu_mem;
        }
        roofline_t o;
        if (roofline_decode(m, mc, &rr, &o) < 0) {
            fprintf(f, "%-28s (does not fit or lacks a bandwidth)\n", mc->name);
            continue;
        }
        double gm = rr.cpu_backend ? 0 : (rr.gpu_mem > 0 ? rr.gpu_mem : mc->gpu_mem);
        char host[16], po[16];
        snprintf(host, sizeof host, "%.1fG%s", o.host_bw / 1e9, o.host_bw_assumed ? "*" : "");
        if (o.pcie_only_tok_s > 0) snprintf(po, sizeof po, "%.1f", o.pcie_only_tok_s);
        else snprintf(po, sizeof po, "-");
        fprintf(f, "%-28s %8.1fG %6.0fG %6.1fG %6.1fG %8s %7.1f %6.3f %5.1f%% %10s %10.1f %12.1f %12s", mc->name,
                gm / GIB, mc->hbm_bw / 1e9, mc->pcie_bw / 1e9, mc->cpu_bw / 1e9, host, o.slots, o.hit_rate,
                100 * o.cpu_share, po, o.bw_added_tok_s, o.host_shared_tok_s, o.host_shared_limit);
        if (i == 0 && measured_tok_s > 0) {
            if (o.pcie_only_tok_s > 0) fprintf(f, "  %16.3f", measured_tok_s / o.pcie_only_tok_s);
            else fprintf(f, "  %16s", "-");
            fprintf(f, " %8.3f %11.3f", measured_tok_s / o.bw_added_tok_s, measured_tok_s / o.host_shared_tok_s);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "(bounds in tok/s; host: the copy and the CPU reading host memory at once%s)\n",
            "; * = not measured, ROOFLINE_HOST_SHARED_FRACTION of pcie + cpu");
    roofline_t o;
    if (r->host_experts >= 0 && roofline_decode(m, here, r, &o) == 0) {
        fprintf(f, "three tiers on %s: host memory holds %.0f of %lld experts (%.1f%%), %.1f MiB a step from disk at ", here->name,
                r->host_experts < (double)m->n_experts_total ? r->host_experts : (double)m->n_experts_total,
                (long long)m->n_experts_total, 100 * o.host_fraction, o.disk_bytes / 1048576.0);
        if (here->disk_bw > 0) fprintf(f, "%.2f GB/s: %.2f tok/s (%s)", here->disk_bw / 1e9, o.three_tier_tok_s, o.three_tier_limit);
        else fprintf(f, "an unknown rate (ceilings --disk FILE measures it): no bound");
        if (measured_tok_s > 0 && o.three_tier_tok_s > 0) fprintf(f, "; ratio %.3f", measured_tok_s / o.three_tier_tok_s);
        fprintf(f, "\n");
    }
}
