/* gpu_slots.c - the expert slots of the model on one GPU: how a slot holds an expert or a tail,
 * the copies into slots, prefetch issue, and the miss path.
 *
 * Owns the slot layout (gslots_pieces .. gslots_expert_at), the staging of split experts' heads
 * and tails (gslots_split_upload), the copies into slots and their events (gslots_fill,
 * gslots_landed), the prefetches (gslots_issue) and the placing of a layer's routed experts
 * (gslots_ensure): there a routed expert that is not resident is decided, to wait for its copy
 * in flight, copy it on demand, read it from host memory, or (gpu_cpu.c's cost model) leave it
 * to the CPU, with an empty entry the expert kernel skips, and the layer's expert table is
 * refreshed. It allocates nothing and sizes nothing (gpu_model.c does, at creation), launches
 * no step kernel and enqueues no segment (gpu_step.c); the only mailbox it writes is the one
 * gslots_ensure is handed.
 *
 * Split experts (gpu_model.c's s_split_plan): the tails are staged once in pinned host memory
 * in slot layout, rows then scales (host_tails), so a copy is one DMA; and a step of up to
 * GPU_HOST_READ_ROWS tokens reads a tail that is neither resident nor in flight straight from
 * there, over PCIe, in the expert kernel (a host-read miss), instead of queueing a DMA behind
 * the prefetches on the copy engine. Whole experts: when every expert is one span of the
 * model's memory with the same layout (a packed model, the weight arena: gslots_span_layout), a
 * whole-expert slot holds that span as it is, and copies read the model's memory, page-locked
 * (gpu_model.c's s_lock_spans); else a slot is
 * [gate.data|gate.scales|up.data|up.scales|down.data|down.scales], every piece 256-byte
 * aligned, and copies read a pinned copy of every expert in that layout.
 *
 * Between a step's segments (gpu_step.c) the host makes the routed experts resident
 * (gslots_ensure), then starts copies of predicted experts that are not resident
 * (gslots_issue), alternating between two copy streams, nearest layer first and at most
 * max_inflight at a time. The compute stream waits on a copy's event only when a layer actually
 * uses that expert; a routed expert that is neither resident nor in flight loads on demand on
 * the compute stream, ordered before the expert kernel (or, a split tail in a small step, is
 * read from host memory).
 *
 * Eviction safety: when layer L's routing has landed, every kernel up to layer L's gate has
 * completed (each kernel waits for the one before it, pdl_enter), and until the host enqueues
 * (or lets go, through its mailbox) the segment after layer L + 1's routing the GPU reads no
 * slot but those layer L routes to, so
 * any slot that layer L does not use and that is not in flight can be overwritten at once, by
 * either stream. Which one is store/xcache.h's decision (the expert
 * expected to be needed last, Belady's rule on average); a prefetch evicts only an expert
 * needed later than the one it brings.
 */
#include <stdint.h>
#include <string.h>

#include "model/gpu_int.h"

/* The six pieces of expert e in host memory, in slot order: gate, its scales, up, its scales,
 * down, its scales (n[i] == 0: none). */
void gslots_pieces(const ffn_t *e, const uint8_t *p[6], size_t n[6])
{
    const qmat_t *q[3] = {&e->gate, &e->up, &e->down};
    for (int i = 0; i < 3; i++) {
        p[2 * i] = q[i]->data;
        n[2 * i] = qmat_data_bytes(q[i]->fmt, q[i]->rows, q[i]->cols);
        p[2 * i + 1] = q[i]->scales;
        n[2 * i + 1] = q[i]->scales ? qmat_scale_bytes(q[i]->fmt, q[i]->rows, q[i]->cols, q[i]->group) : 0;
    }
}

/* Pieces of n[i] bytes laid out one after another, each 256-byte aligned: their offsets;
 * returns the total. */
size_t gslots_layout(const size_t n[6], size_t off[6])
{
    size_t o = 0;
    for (int i = 0; i < 6; i++) {
        off[i] = o;
        o += ALIGN256(n[i]);
    }
    return o;
}

/* The slot layout of whole experts shaped as e. */
void gslots_expert_layout(gpu_model_t *g, const ffn_t *e)
{
    const uint8_t *p[6];
    size_t n[6];
    gslots_pieces(e, p, n);
    g->expert_bytes = g->copy_bytes = gslots_layout(n, g->off);
}

/* The span layout: when every routed expert's pieces lie in one span of host memory, at the
 * same 16-byte aligned offsets from its start, and the span is not much more than the pieces
 * (a packed model, the weight arena), a slot holds the span as it is, so a copy is one DMA
 * straight from the model's memory. Else (pieces scattered, as an HF checkpoint loads) the
 * slot layout of gslots_expert_layout stays. */
void gslots_span_layout(gpu_model_t *g)
{
    const model_config_t *c = &g->m->cfg;
    size_t off0[6] = {0}, span0 = 0;
    bool first = true;
    for (int l = 0; l < c->n_layers; l++) {
        if (!c->layer_sparse[l]) continue;
        for (int e = 0; e < c->n_experts; e++) {
            const uint8_t *p[6];
            size_t n[6], off[6];
            gslots_pieces(&g->m->layers[l].experts[e], p, n);
            uintptr_t lo = UINTPTR_MAX, hi = 0;
            for (int i = 0; i < 6; i++)
                if (n[i]) {
                    lo = (uintptr_t)p[i] < lo ? (uintptr_t)p[i] : lo;
                    hi = (uintptr_t)p[i] + n[i] > hi ? (uintptr_t)p[i] + n[i] : hi;
                }
            for (int i = 0; i < 6; i++) {
                off[i] = n[i] ? (uintptr_t)p[i] - lo : 0;
                if (off[i] % 16) return;
            }
            if (first) {
                memcpy(off0, off, sizeof off);
                span0 = hi - lo;
                first = false;
            } else if (memcmp(off, off0, sizeof off) || hi - lo != span0) {
                return;
            }
        }
    }
    if (first || span0 > g->expert_bytes + g->expert_bytes / 8) return;
    g->span_layout = true;
    memcpy(g->off, off0, sizeof off0);
    g->copy_bytes = g->span_bytes = span0;
    g->expert_bytes = ALIGN256(span0);
}

/* The start of expert e's bytes as a slot holds them (the span layout's span). */
const uint8_t *gslots_span_start(const gpu_model_t *g, const ffn_t *e)
{
    return (const uint8_t *)e->gate.data - g->off[0];
}

/* Pack expert e into dst (host) in slot layout. */
void gslots_expert_pack(const gpu_model_t *g, uint8_t *dst, const ffn_t *e)
{
    if (g->span_layout) {
        memcpy(dst, gslots_span_start(g, e), g->span_bytes);
        return;
    }
    const uint8_t *p[6];
    size_t n[6];
    gslots_pieces(e, p, n);
    for (int i = 0; i < 6; i++)
        if (n[i]) memcpy(dst + g->off[i], p[i], n[i]);
}

/* Split experts: where the head of expert (layer l, expert e) lives on the device. */
static uint8_t *s_head(const gpu_model_t *g, int l, int e)
{
    return g->heads_dev + ((size_t)g->xc.moe_ord[l] * g->m->cfg.n_experts + e) * g->head_bytes;
}

/* Split experts: where the tail of expert (layer l, expert e) is staged in pinned host memory. */
static uint8_t *s_host_tail(const gpu_model_t *g, int l, int e)
{
    return g->host_tails + ((size_t)g->xc.moe_ord[l] * g->m->cfg.n_experts + e) * g->slot_bytes;
}

/* Device qmats of the expert (layer l, expert e) if it (split: its tail) sat in slot s; with
 * split experts, s < 0 reads the tail from its staged host copy over PCIe. */
cuda_expert_t gslots_expert_at(const gpu_model_t *g, int l, int e, int s)
{
    const ffn_t *src = &g->m->layers[l].experts[e];
    uint8_t *b = s < 0 ? s_host_tail(g, l, e) : g->slots_dev + (size_t)s * g->slot_bytes;
    cuda_expert_t x = {src->gate, src->up, src->down, {0}, 0};
    const size_t *off = g->off;
    if (g->split) {
        uint8_t *t = b;
        b = s_head(g, l, e);
        off = g->hoff;
        x.split = g->split;
        x.down_tail = src->down;
        x.down_tail.data = t - (size_t)g->split * g->d_row;
        x.down_tail.scales = src->down.scales ? t + ALIGN256(g->tail_data) - (size_t)g->split * g->ds_row : NULL;
    }
    x.gate.data = b + off[0];
    x.gate.scales = x.gate.scales ? b + off[1] : NULL;
    x.up.data = b + off[2];
    x.up.scales = x.up.scales ? b + off[3] : NULL;
    x.down.data = b + off[4];
    x.down.scales = x.down.scales ? b + off[5] : NULL;
    return x;
}

/* Split experts: upload the head of expert (l, e) from the model's memory and stage its tail
 * (down rows split.. and their scales) in host_tails. */
int gslots_split_upload(gpu_model_t *g, int l, int e)
{
    uint8_t *b = s_head(g, l, e), *t = s_host_tail(g, l, e);
    const uint8_t *p[6];
    size_t n[6];
    gslots_pieces(&g->m->layers[l].experts[e], p, n);
    memcpy(t, p[4] + (size_t)g->split * g->d_row, g->tail_data);
    if (p[5]) memcpy(t + ALIGN256(g->tail_data), p[5] + (size_t)g->split * g->ds_row, g->copy_bytes - g->tail_data);
    n[4] = (size_t)g->split * g->d_row;
    n[5] = (size_t)g->split * g->ds_row;
    int rc = 0;
    for (int i = 0; i < 6 && !rc; i++)
        if (n[i]) rc = cuda_h2d(g->cx, b + g->hoff[i], p[i], n[i]);
    return rc;
}

/* Where copies of whole expert (l, e) read it: its span of the model's memory, page-locked
 * (st.from_model), or its pinned copy in host_experts. */
const uint8_t *gslots_host_expert(const gpu_model_t *g, int l, int e)
{
    if (g->st.from_model) return gslots_span_start(g, &g->m->layers[l].experts[e]);
    return g->host_experts + ((size_t)l * g->m->cfg.n_experts + e) * g->expert_bytes;
}

/* Copy expert (l, e), or its tail, into slot s on the given stream. */
int gslots_fill(gpu_model_t *g, int s, int l, int e, int stream)
{
    uint8_t *dst = g->slots_dev + (size_t)s * g->slot_bytes;
    if (!g->split) return cuda_h2d_async(g->cx, stream, dst, gslots_host_expert(g, l, e), g->copy_bytes);
    /* the staged tail: its rows, the padding to 256 bytes, their scales */
    return cuda_h2d_async(g->cx, stream, dst, s_host_tail(g, l, e), ALIGN256(g->tail_data) + g->copy_bytes - g->tail_data);
}

/* gslots_fill, counted in the statistics. */
static int s_copy_in(gpu_model_t *g, int s, int l, int e, int stream)
{
    g->st.bytes_h2d += g->copy_bytes;
    return gslots_fill(g, s, l, e, stream);
}

/* The cache's landed callback (xcache_t.landed, ctx the model): whether slot s's last copy has
 * landed, 1, or not, 0; <0 on error. */
int gslots_landed(void *ctx, int s) { return cuda_event_done(((gpu_model_t *)ctx)->ev[s]); }

/* Start copies of predicted experts that are not resident (the window of xc), on the copy
 * stream, nearest layer first, until max_inflight copies are in flight, while layer cur
 * (its routed experts flagged in xc.need) computes. A copy evicts only an expert needed later
 * than the one it brings. past_cur: cur is being placed (gslots_ensure), so the window's layers up
 * to cur are left alone (a routed expert it has found without a slot stays so). */
int gslots_issue(gpu_model_t *g, int cur, bool past_cur)
{
    xcache_t *xc = &g->xc;
    const int E = xc->n_experts, cur_ord = xc->moe_ord[cur];
    int rc, inflight = xcache_inflight(xc);
    for (int d = past_cur && xc->win_lo <= cur_ord ? cur_ord + 1 - xc->win_lo : 0; d < xc->win_n && inflight < g->max_inflight;
         d++) {
        int l = g->xc.moe_layer[xc->win_lo + d];
        for (int e = 0; e < E && inflight < g->max_inflight; e++) {
            /* 2: predicted, but left to the CPU (gcpu_leave) */
            if (xc->pneed[(size_t)l * E + e] != 1 || xc->slot_of[(size_t)l * E + e] >= 0) continue;
            int s = xcache_victim(xc, cur, cur_ord, true, (float)(xc->win_lo + d - cur_ord));
            if (s < 0) return 0; /* nothing evictable that is needed later: the miss path will load it */
            xcache_assign(xc, s, l, e);
            /* the copy engine runs them in order either way; queued on two streams, the next
             * starts sooner (Mixtral 24 GiB batch 1: 179.6 -> 180.5 and 180.7 -> 181.7 tok/s) */
            const int stream = g->n_copies++ & 1 ? CUDA_STREAM_COPY2 : CUDA_STREAM_COPY;
            if ((rc = s_copy_in(g, s, l, e, stream))) return rc;
            if ((rc = cuda_event_record(g->cx, g->ev[s], stream))) return rc;
            xc->slot[s].state = XC_LOADING;
            xc->slot[s].prefetched = true;
            inflight++;
            g->st.prefetches++;
            g->lst[l].prefetches++;
        }
    }
    return 0;
}

_Static_assert(sizeof(cuda_expert_t) % 8 == 0, "gslots_ensure patches the expert table in 64-bit words");

/* Host wait for event ev, with placing >= 0 (layer placing is being placed: a prelaunched step,
 * whose stream cannot wait on a copy) keeping the copy streams fed meanwhile from the window's
 * layers after it (gslots_issue): a prefetch that lands while the host waits for the other is
 * followed at once by the next (the link idled until the layer's table went up, 34 us at a
 * time, in a 24 GiB trace). */
int gslots_wait_event(gpu_model_t *g, cuda_event_t *ev, int placing)
{
    int d;
    while ((d = cuda_event_done(ev)) == 0)
        if (placing >= 0 && g->xc.win_n > 0 && (d = gslots_issue(g, placing, true))) return d;
    return d < 0 ? d : 0;
}

/* Make every expert routed in layer l (idx[n][top_k], the host's copy of its routing) resident
 * and refresh the layer's table. With box, the table's changed words go to the mailbox the
 * segment's cuda_wait_patch polls, else on the stream. The stream waits for the copies the
 * layer uses on their events, or with host_waits (a prelaunched step: the layer's kernels are
 * enqueued already) the host does, before it fills the mailbox. */
int gslots_ensure(gpu_model_t *g, int l, int n, const int32_t *idx, uint64_t *box, bool host_waits)
{
    const model_config_t *c = &g->m->cfg;
    const int E = c->n_experts;
    glayer_t *L = &g->L[l];
    xcache_t *xc = &g->xc;
    int rc;
    for (int i = 0; i < n * c->top_k; i++) STRATA_ASSERT(idx[i] >= 0 && idx[i] < E);
    xcache_route(xc, l, idx, n * c->top_k);
    /* a pinned layer's miss takes a slot (a DMA): the window never prefetches the pinned
     * layers, so a tail host-read there would be host-read at every step */
    const bool host_read = g->split && n <= GPU_HOST_READ_ROWS && !xc->pinned[xc->moe_ord[l]];
    /* the misses the CPU takes (gpu_cpu.c's cost model) get no slot and an empty entry */
    if (g->cpu_on) {
        int32_t miss[GPU_CPU_MISS_MAX];
        int nm = 0;
        for (int e = 0; e < E && nm < GPU_CPU_MISS_MAX; e++)
            if (xc->need[e] && xc->slot_of[(size_t)l * E + e] < 0) miss[nm++] = e;
        gcpu_plan(g, l, n, idx, miss, nm);
        /* the CPU's jobs out first: the slots and copies below run while it computes */
        if ((rc = gcpu_post(g, xc->moe_ord[l], n, idx))) return rc;
    }
    /* The copied misses first: their slots in one scan (xcache_victims gives what a scan a
     * miss would), kept predictions first, then any, all assigned before the first copy, so
     * that the prefetches a host wait issues (gslots_wait_event) take none of them. */
    int32_t *copy_e = g->ens_miss, *copy_s = g->ens_vic;
    int n_miss = 0;
    for (int e = 0; e < E && !host_read; e++)
        if (xc->need[e] && !(g->cpu_on && g->cpu_dest[e] >= 0) && xc->slot_of[(size_t)l * E + e] < 0) copy_e[n_miss++] = e;
    if (n_miss) {
        /* READY at once (a free slot no longer free), as after its copy: the GPU reads it only
         * once the table goes up, after every copy below */
        const int n_vic = xcache_victims(xc, l, xc->moe_ord[l], true, copy_s, n_miss);
        for (int i = 0; i < n_vic; i++) xcache_assign(xc, copy_s[i], l, copy_e[i]), xc->slot[copy_s[i]].state = XC_READY;
        if (n_vic < n_miss) {
            const int more = xcache_victims(xc, l, xc->moe_ord[l], false, copy_s + n_vic, n_miss - n_vic);
            STRATA_ASSERT(more == n_miss - n_vic); /* n_slots >= n_experts of one layer, checked at create */
            for (int i = n_vic; i < n_miss; i++) xcache_assign(xc, copy_s[i], l, copy_e[i]), xc->slot[copy_s[i]].state = XC_READY;
        }
    }
    for (int i = 0; i < n_miss; i++) {
        const int e = copy_e[i], s = copy_s[i];
        g->st.expert_uses++;
        g->lst[l].uses++;
        /* the host waits on a copy stream's event: the compute stream holds the layer's
         * kernels already */
        if ((rc = s_copy_in(g, s, l, e, host_waits ? CUDA_STREAM_COPY : CUDA_STREAM_COMPUTE))) return rc;
        if (host_waits && ((rc = cuda_event_record(g->cx, g->ev[s], CUDA_STREAM_COPY)) || (rc = gslots_wait_event(g, g->ev[s], l))))
            return rc;
        xc->slot[s].state = XC_READY;
        xc->slot[s].prefetched = false;
        g->st.misses++;
        g->lst[l].misses++;
    }
    for (int e = 0, i = 0; e < E; e++) {
        if (!xc->need[e]) continue;
        if (g->cpu_on && g->cpu_dest[e] >= 0) continue; /* counted by gpu_cpu.c */
        if (i < n_miss && copy_e[i] == e) { /* copied above */
            i++;
            continue;
        }
        g->st.expert_uses++;
        g->lst[l].uses++;
        int s = xc->slot_of[(size_t)l * E + e];
        if (s >= 0) {
            xc_slot_t *sl = &xc->slot[s];
            if (sl->state == XC_LOADING) {
                if ((rc = host_waits ? gslots_wait_event(g, g->ev[s], l) : cuda_stream_wait_event(g->cx, CUDA_STREAM_COMPUTE, g->ev[s])))
                    return rc;
                sl->state = XC_READY;
            }
            if (sl->prefetched) {
                g->st.prefetch_used++;
                g->lst[l].prefetch_used++;
                sl->prefetched = false;
            }
            g->st.hits++;
            g->lst[l].hits++;
        } else {
            /* host_read: the kernels read the staged tail over PCIe (below): no slot, and no
             * DMA queued behind the prefetches */
            g->st.bytes_h2d += g->copy_bytes;
            g->st.misses++;
            g->st.host_reads++;
            g->lst[l].misses++;
        }
    }
    /* The routed experts' entries: their slots, or (a routed expert with no slot) the staged
     * tail in host memory, a host-read miss. Nothing reads the other entries this step (slots
     * still loading for this layer that nobody routed to stay in flight, and become READY when
     * next used). Only the words that changed go up: as a kernel's parameters
     * (cuda_patch_words), which reads nothing over the busy link, or, more than it takes, the
     * whole table (cuda_h2d_small); or through the mailbox. */
    int np = 0;
    for (int e = 0; e < E; e++) {
        if (!xc->need[e]) continue;
        const cuda_expert_t x = g->cpu_on && g->cpu_dest[e] >= 0 ? (cuda_expert_t){0}
                                                                 : gslots_expert_at(g, l, e, xc->slot_of[(size_t)l * E + e]);
        uint64_t w[sizeof x / 8], *old = (uint64_t *)&L->table_host[e];
        memcpy(w, &x, sizeof w);
        for (size_t i = 0; i < sizeof x / 8; i++) {
            if (w[i] == old[i]) continue;
            g->patch_dst[np] = (uint64_t *)&L->table_dev[e] + i;
            g->patch_val[np++] = old[i] = w[i];
        }
    }
    if (box) {
        for (int i = 0; i < np; i++) box[2 + 2 * i] = (uint64_t)(uintptr_t)g->patch_dst[i], box[3 + 2 * i] = g->patch_val[i];
        __atomic_store_n(box, (uint64_t)np + 1, __ATOMIC_RELEASE);
        return 0;
    }
    if (np <= CUDA_PATCH_MAX) return cuda_patch_words(g->cx, np, g->patch_dst, g->patch_val);
    return cuda_h2d_small(g->cx, L->table_dev, L->table_host, (size_t)E * sizeof(cuda_expert_t));
}
