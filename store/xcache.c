/* xcache.c - the expert cache's policy (see xcache.h). */
#include "store/xcache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The popularity's term of xcache_next_use for entry i of pop: a cycle per step its decayed
 * popularity expects it skipped. */
static void s_pop_wait(xcache_t *c, size_t i)
{
    float p = c->pop[i] * (1.0f - XCACHE_POP_DECAY);
    p = p < 1e-3f ? 1e-3f : p > 1.0f ? 1.0f : p;
    c->pop_wait[i] = (float)c->n_moe * (1.0f / p - 1.0f);
}

int xcache_init(xcache_t *c, int32_t n_layers, const bool *sparse, int32_t n_experts, int32_t top_k, int32_t n_slots)
{
    memset(c, 0, sizeof *c);
    c->n_layers = n_layers;
    c->n_experts = n_experts;
    size_t le = (size_t)n_layers * (size_t)n_experts;
    c->moe_ord = malloc(sizeof *c->moe_ord * (size_t)n_layers);
    c->moe_layer = malloc(sizeof *c->moe_layer * (size_t)n_layers);
    c->slot_of = malloc(sizeof *c->slot_of * (le ? le : 1));
    c->need = calloc((size_t)(n_experts > 0 ? n_experts : 1), 1);
    c->pneed = calloc(le ? le : 1, 1);
    c->pop = malloc(sizeof *c->pop * (le ? le : 1));
    c->pop_wait = malloc(sizeof *c->pop_wait * (le ? le : 1));
    c->ord_d = malloc(sizeof *c->ord_d * (size_t)(n_layers > 0 ? n_layers : 1));
    c->pinned = calloc((size_t)(n_layers > 0 ? n_layers : 1), 1);
    c->pin_order = malloc(sizeof *c->pin_order * (size_t)(n_layers > 0 ? n_layers : 1));
    if (!c->moe_ord || !c->moe_layer || !c->slot_of || !c->need || !c->pneed || !c->pop || !c->pop_wait || !c->ord_d || !c->pinned || !c->pin_order ||
        xcache_set_slots(c, n_slots)) {
        xcache_free(c);
        return -ENOMEM;
    }
    for (int32_t l = 0; l < n_layers; l++) {
        c->moe_ord[l] = sparse[l] ? c->n_moe : -1;
        if (sparse[l]) c->moe_layer[c->n_moe++] = l;
    }
    /* pin order: 0, then the midpoint of the largest gap (the earliest of equal ones) between
     * the ordinals taken so far and n_moe; pinned marks them taken meanwhile */
    for (int32_t i = 0; i < c->n_moe; i++) {
        int32_t best = 0, best_gap = 0, prev = 0;
        for (int32_t o = 1; i > 0 && o <= c->n_moe; o++) {
            if (o < c->n_moe && !c->pinned[o]) continue;
            if (o - prev > best_gap) best_gap = o - prev, best = prev + (o - prev) / 2;
            prev = o;
        }
        c->pin_order[i] = best;
        c->pinned[best] = 1;
    }
    xcache_pin(c, 1);
    for (size_t i = 0; i < le; i++) {
        c->slot_of[i] = -1;
        c->pop[i] = n_experts > 0 ? (float)top_k / (float)n_experts / (1.0f - XCACHE_POP_DECAY) : 0.0f;
        s_pop_wait(c, i);
    }
    return 0;
}

int xcache_set_slots(xcache_t *c, int32_t n_slots)
{
    free(c->slot);
    c->n_slots = 0;
    c->slot = calloc((size_t)(n_slots > 0 ? n_slots : 1), sizeof *c->slot);
    free(c->vic_t);
    c->vic_t = malloc(sizeof *c->vic_t * (size_t)(n_slots > 0 ? n_slots : 1));
    if (!c->slot || !c->vic_t) return -ENOMEM;
    c->n_slots = n_slots;
    for (int32_t s = 0; s < n_slots; s++) c->slot[s].layer = c->slot[s].expert = -1;
    return 0;
}

void xcache_free(xcache_t *c)
{
    free(c->moe_ord);
    free(c->moe_layer);
    free(c->slot);
    free(c->vic_t);
    free(c->slot_of);
    free(c->need);
    free(c->pneed);
    free(c->pop);
    free(c->pop_wait);
    free(c->ord_d);
    free(c->pinned);
    free(c->pin_order);
    memset(c, 0, sizeof *c);
}

void xcache_pin(xcache_t *c, int n)
{
    if (n > c->n_moe) n = c->n_moe;
    if (n < 1) n = 1;
    memset(c->pinned, 0, (size_t)c->n_moe);
    for (int i = 0; i < n && i < c->n_moe; i++) c->pinned[c->pin_order[i]] = 1;
}

void xcache_assign(xcache_t *c, int s, int l, int e)
{
    xc_slot_t *sl = &c->slot[s];
    if (sl->state != XC_FREE && sl->layer >= 0) c->slot_of[(size_t)sl->layer * c->n_experts + sl->expert] = -1;
    sl->layer = l;
    sl->expert = e;
    c->slot_of[(size_t)l * c->n_experts + e] = s;
}

/* MoE ordinal o's distance ahead of cur in the cyclic order, 1 to n_moe (n_moe for o itself);
 * -1 for a pinned ordinal. */
static int s_dist(const xcache_t *c, int o, int cur)
{
    const int nm = c->n_moe;
    if (c->pinned[o]) return -1;
    int d = o - cur;
    if (cur < -1 || cur >= nm) d = (d % nm + nm) % nm;
    return d <= 0 ? d + nm : d;
}

/* xcache_next_use of entry i (MoE ordinal o) from its ordinal's s_dist d. */
static float s_next_use(const xcache_t *c, size_t i, int o, int d)
{
    if (d < 0) return 0.0f; /* pinned: kept over the rest (xcache.h) */
    if (o >= c->win_lo && o < c->win_lo + c->win_n && !c->pneed[i]) d += c->n_moe;
    return (float)d + c->pop_wait[i];
}

float xcache_next_use(const xcache_t *c, int l, int e, int cur)
{
    const int o = c->moe_ord[l];
    return s_next_use(c, (size_t)l * c->n_experts + e, o, s_dist(c, o, cur));
}

/* 1 if slot s's copy has landed (a loading slot found landed becomes READY), 0 if not. */
static int s_landed(xcache_t *c, int s)
{
    if (c->slot[s].state != XC_LOADING) return 1;
    if (c->landed && c->landed(c->ctx, s) != 1) return 0;
    c->slot[s].state = XC_READY;
    return 1;
}

/* xcache_next_use over every slot, its terms by ordinal computed once: the scan runs for each
 * copy the host starts, over thousands of slots for small experts (Qwen3-30B-A3B at 6 GiB). */
static void s_ord_dist(xcache_t *c, int cur)
{
    for (int o = 0; o < c->n_moe; o++) c->ord_d[o] = s_dist(c, o, cur);
}

/* Slot s's xcache_next_use (s_ord_dist done for cur), or -1 when it may not be evicted. */
static float s_evict_t(xcache_t *c, int s, int layer_now, bool keep_pred)
{
    xc_slot_t *sl = &c->slot[s];
    if (sl->state == XC_LOADING && !s_landed(c, s)) return -1.0f;
    if (sl->layer == layer_now && c->need[sl->expert]) return -1.0f;
    const size_t i = (size_t)sl->layer * c->n_experts + sl->expert;
    if (keep_pred && c->pneed[i]) return -1.0f;
    const int o = c->moe_ord[sl->layer];
    return s_next_use(c, i, o, c->ord_d[o]);
}

int xcache_victim(xcache_t *c, int layer_now, int cur, bool keep_pred, float before)
{
    s_ord_dist(c, cur);
    int best = -1;
    float best_t = before;
    for (int s = 0; s < c->n_slots; s++) {
        if (c->slot[s].state == XC_FREE) return s;
        const float t = s_evict_t(c, s, layer_now, keep_pred);
        if (t >= 0.0f && t > best_t) best = s, best_t = t;
    }
    return best;
}

int xcache_victims(xcache_t *c, int layer_now, int cur, bool keep_pred, int32_t *out, int m)
{
    int k = 0;
    for (int s = 0; s < c->n_slots && k < m; s++)
        if (c->slot[s].state == XC_FREE) out[k++] = s;
    if (k == m || m <= 0) return k;
    const int nf = k; /* the free ones stay first; the rest sorted by t, best first */
    float *tk = c->vic_t;
    s_ord_dist(c, cur);
    for (int s = 0; s < c->n_slots; s++) {
        if (c->slot[s].state == XC_FREE) continue;
        const float t = s_evict_t(c, s, layer_now, keep_pred);
        if (t < 0.0f || (k == m && t <= tk[m - 1])) continue;
        int j = k < m ? k++ : m - 1; /* a full list drops its last */
        for (; j > nf && tk[j - 1] < t; j--) tk[j] = tk[j - 1], out[j] = out[j - 1];
        tk[j] = t, out[j] = s;
    }
    return k;
}

int xcache_inflight(xcache_t *c)
{
    int k = 0;
    for (int s = 0; s < c->n_slots; s++) k += !s_landed(c, s);
    return k;
}

void xcache_route(xcache_t *c, int l, const int32_t *idx, int n_idx)
{
    const int E = c->n_experts;
    memset(c->need, 0, (size_t)E);
    for (int i = 0; i < n_idx; i++)
        if (idx[i] >= 0 && idx[i] < E) c->need[idx[i]] = 1;
    float *pop = c->pop + (size_t)l * E;
    for (int e = 0; e < E; e++) {
        pop[e] = pop[e] * XCACHE_POP_DECAY + (c->need[e] ? 1.0f : 0.0f);
        s_pop_wait(c, (size_t)l * E + e);
    }
}

void xcache_predicted(xcache_t *c, int first, int D, const int32_t *pidx, int n, int top_k)
{
    const int E = c->n_experts;
    memset(c->pneed, 0, (size_t)c->n_layers * E);
    c->win_lo = first;
    c->win_n = D > 0 ? D : 0;
    for (int t = 0; t < n && D > 0; t++)
        for (int d = 0; d < D; d++)
            for (int j = 0; j < top_k; j++) {
                int e = pidx[((size_t)t * D + d) * top_k + j];
                if (e >= 0 && e < E) c->pneed[(size_t)c->moe_layer[first + d] * E + e] = 1;
            }
}
