/* test_xcache.c - the expert cache's policy (store/xcache.h), without a GPU.
 *
 *   - layout: MoE ordinals skip dense layers; every slot starts free and a free slot is the
 *     first victim; assigning moves an expert in and its predecessor out;
 *   - the victim is the expert needed last: under equal popularity the current layer's unused
 *     experts (a whole cycle away) before the layer just behind, never the one the current
 *     layer routes to; a window layer's experts the prediction does not name go first, the
 *     predicted ones are kept (keep_pred) and `before` refuses victims needed sooner; the
 *     first MoE layer's experts (nothing predicts them) go last and never to a prefetch;
 *   - a loading slot is neither a victim nor landed until the callback says so, then READY;
 *   - pins: ordinal 0, then the midpoints of the largest gaps (32 MoE layers: 0 16 8 24 4 12 20
 *     28 ...), every ordinal once, a smaller set inside a larger one; a pinned mid-step layer's
 *     experts rank with the first layer's;
 *   - popularity: an expert used every step outlives one never used in the same layer;
 *   - a simulation under uniform random routing with the next layers' routing known (perfect
 *     prediction): the experts copied per step stay within 10% of what a cache holding the same
 *     share of experts pays on average, uses x (1 - slots / experts), and below what evicting
 *     the least recently used expert pays (the rule LRU caches use, which under a cyclic layer
 *     order evicts exactly the experts needed next); and as the split-expert cache of tails
 *     runs (29 slots of 256, the next 2 layers known, 2 layers pinned; 53 slots with 5): within
 *     5% of the same share-of-slots traffic, with no copy into the pinned layers after the
 *     warm-up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/xcache.h"
#include "tests/unit/check.h"

static int s_land_ok[64];
static int s_land(void *ctx, int s)
{
    (void)ctx;
    return s_land_ok[s];
}

static void test_layout(void)
{
    bool sparse[5] = {true, false, true, true, true};
    xcache_t c;
    T_CHECK(xcache_init(&c, 5, sparse, 4, 1, 6) == 0, "init");
    T_CHECK(c.n_moe == 4 && c.moe_ord[1] == -1 && c.moe_ord[2] == 1 && c.moe_layer[3] == 4, "ordinals %d %d %d %d",
            c.n_moe, c.moe_ord[1], c.moe_ord[2], c.moe_layer[3]);
    T_CHECK(xcache_victim(&c, -1, -1, true, -1) == 0, "a free slot first");
    xcache_assign(&c, 0, 0, 2);
    c.slot[0].state = XC_READY;
    T_CHECK(c.slot_of[0 * 4 + 2] == 0, "slot_of after assign");
    xcache_assign(&c, 0, 3, 1);
    T_CHECK(c.slot_of[0 * 4 + 2] == -1 && c.slot_of[3 * 4 + 1] == 0, "the previous expert leaves");
    xcache_free(&c);
}

/* 4 MoE layers x 4 experts, 16 slots all full: layers 0 .. 3 whole. */
static void s_fill(xcache_t *c)
{
    bool sparse[4] = {true, true, true, true};
    xcache_init(c, 4, sparse, 4, 1, 16);
    for (int l = 0; l < 4; l++)
        for (int e = 0; e < 4; e++) {
            xcache_assign(c, l * 4 + e, l, e);
            c->slot[l * 4 + e].state = XC_READY;
        }
}

static void test_victim_order(void)
{
    xcache_t c;
    s_fill(&c);
    /* layer 2 computes and routes to expert 0 */
    int32_t r = 0;
    xcache_route(&c, 2, &r, 1);
    int v = xcache_victim(&c, 2, 2, true, -1);
    T_CHECK(v >= 0 && c.slot[v].layer == 2 && c.slot[v].expert != 0, "victim layer %d expert %d (want layer 2, not 0)",
            v >= 0 ? c.slot[v].layer : -1, v >= 0 ? c.slot[v].expert : -1);
    T_CHECK(xcache_next_use(&c, 1, 1, 2) > xcache_next_use(&c, 3, 1, 2), "the layer behind after the one ahead");
    /* the first MoE layer, which nothing predicts, comes before every other */
    T_CHECK(xcache_next_use(&c, 0, 1, 2) < xcache_next_use(&c, 3, 1, 2), "the first layer after the next one");
    /* the window covers layer 3 and names expert 3: its other experts go first, 3 is kept */
    int32_t p = 3;
    xcache_predicted(&c, 3, 1, &p, 1, 1);
    v = xcache_victim(&c, 2, 2, true, -1);
    T_CHECK(v >= 0 && c.slot[v].layer == 3 && c.slot[v].expert != 3, "window victim layer %d expert %d",
            v >= 0 ? c.slot[v].layer : -1, v >= 0 ? c.slot[v].expert : -1);
    /* a prefetch for layer 3 (before: 1 layer ahead) never evicts the first layer's experts;
     * slots marked loading stay so (nothing lands) */
    c.landed = s_land;
    memset(s_land_ok, 0, sizeof s_land_ok);
    for (int k = 0; k < 16; k++) {
        v = xcache_victim(&c, 2, 2, true, 1.0f);
        T_CHECK(!(v >= 0 && c.slot[v].layer == 0), "a prefetch evicted the first layer's expert %d", c.slot[v].expert);
        if (v < 0) break;
        c.slot[v].state = XC_LOADING;
    }
    for (int s = 0; s < 16; s++) c.slot[s].state = XC_READY;
    int last = -1, n_v = 0;
    for (int k = 0; k < 16; k++) {
        v = xcache_victim(&c, 2, 2, true, -1);
        T_CHECK(!(v >= 0 && c.slot[v].layer == 3 && c.slot[v].expert == 3), "a predicted expert evicted");
        T_CHECK(!(v >= 0 && c.slot[v].layer == 2 && c.slot[v].expert == 0), "the routed expert evicted");
        if (v < 0) break;
        last = v, n_v++;
        c.slot[v].state = XC_LOADING; /* in flight: not a victim again */
    }
    T_CHECK(n_v == 14 && last >= 0 && c.slot[last].layer == 0, "%d victims, the last of layer %d (want 14, layer 0)", n_v,
            last >= 0 ? c.slot[last].layer : -1);
    c.landed = NULL;
    /* before: nothing is needed later than 1000 steps */
    memset(s_land_ok, 0, sizeof s_land_ok);
    xcache_free(&c);
    s_fill(&c);
    T_CHECK(xcache_victim(&c, -1, 0, false, 1e6f) == -1, "before refuses every victim");
    xcache_free(&c);
}

static void test_landed(void)
{
    xcache_t c;
    s_fill(&c);
    c.landed = s_land;
    memset(s_land_ok, 0, sizeof s_land_ok);
    for (int s = 0; s < 16; s++) c.slot[s].state = XC_LOADING;
    T_CHECK(xcache_inflight(&c) == 16, "16 in flight");
    T_CHECK(xcache_victim(&c, -1, 0, false, -1) == -1, "no victim while everything loads");
    s_land_ok[5] = 1;
    T_CHECK(xcache_inflight(&c) == 15 && c.slot[5].state == XC_READY, "slot 5 landed");
    T_CHECK(xcache_victim(&c, -1, 0, false, -1) == 5, "the landed slot is the only victim");
    xcache_free(&c);
}

/* MoE layers pinned */
static int s_npinned(const xcache_t *c)
{
    int n = 0;
    for (int o = 0; o < c->n_moe; o++) n += c->pinned[o];
    return n;
}

static void test_pins(void)
{
    bool sparse[33];
    for (int l = 0; l < 33; l++) sparse[l] = l != 5; /* one dense layer: 32 MoE layers */
    xcache_t c;
    T_CHECK(xcache_init(&c, 33, sparse, 8, 2, 0) == 0, "init");
    const int want[8] = {0, 16, 8, 24, 4, 12, 20, 28};
    for (int i = 0; i < 8; i++) T_CHECK(c.pin_order[i] == want[i], "pin %d: ordinal %d, want %d", i, c.pin_order[i], want[i]);
    int seen[32] = {0};
    for (int i = 0; i < 32; i++) seen[c.pin_order[i]]++;
    for (int o = 0; o < 32; o++) T_CHECK(seen[o] == 1, "ordinal %d pinned %d times over the order", o, seen[o]);
    int n = s_npinned(&c);
    T_CHECK(n == 1 && c.pinned[0] && !c.pinned[16], "one pinned by default: %d", n);
    xcache_pin(&c, 5);
    n = s_npinned(&c);
    T_CHECK(n == 5 && c.pinned[0] && c.pinned[4] && c.pinned[8] && c.pinned[16] && c.pinned[24], "5 pinned: %d", n);
    /* ordinal 16 is layer 17 (layer 5 is dense); seen from ordinal 10 it ranks with ordinal 0 */
    T_CHECK(xcache_next_use(&c, 17, 3, 10) == 0.0f && xcache_next_use(&c, 0, 3, 10) == 0.0f &&
                xcache_next_use(&c, 18, 3, 10) > 0.0f, "pinned ranks first");
    xcache_pin(&c, 0);
    n = s_npinned(&c);
    T_CHECK(n == 1 && c.pinned[0] && !c.pinned[4], "at least one pinned: %d", n);
    xcache_pin(&c, 99);
    n = s_npinned(&c);
    T_CHECK(n == 32, "at most every MoE layer: %d", n);
    xcache_free(&c);
    bool one = true;
    T_CHECK(xcache_init(&c, 1, &one, 4, 1, 2) == 0 && c.pin_order[0] == 0 && c.pinned[0], "one MoE layer");
    xcache_free(&c);
}

static void test_popularity(void)
{
    xcache_t c;
    s_fill(&c);
    for (int step = 0; step < 300; step++) {
        int32_t r = 2;
        xcache_route(&c, 1, &r, 1);
    }
    T_CHECK(xcache_next_use(&c, 1, 2, 2) < xcache_next_use(&c, 1, 1, 2), "hot %.1f, cold %.1f",
            xcache_next_use(&c, 1, 2, 2), xcache_next_use(&c, 1, 1, 2));
    int v = xcache_victim(&c, -1, 2, false, -1);
    T_CHECK(v >= 0 && !(c.slot[v].layer == 1 && c.slot[v].expert == 2), "the hot expert evicted");
    xcache_free(&c);
}

/* k distinct experts of E, uniformly. */
static void s_route(uint64_t *rng, int E, int k, int32_t *out)
{
    for (int i = 0; i < k; i++) {
        int e, dup;
        do {
            e = (int)(t_rng_next(rng) % (uint64_t)E);
            dup = 0;
            for (int j = 0; j < i; j++) dup |= out[j] == e;
        } while (dup);
        out[i] = e;
    }
}

/* Experts copied per step over `steps` steps: L MoE layers of E experts, top-k, S slots, the
 * next D layers' routing known, `pin` layers pinned (xcache_pin). lru: evict the least
 * recently used instead. *pinned_copies (may be NULL): copies into the pinned layers after the
 * warm-up. */
static double s_simulate(int L, int E, int k, int S, int D, int pin, int steps, bool lru, uint64_t seed,
                         long *pinned_copies)
{
    bool sparse[64];
    for (int l = 0; l < L; l++) sparse[l] = true;
    xcache_t c;
    xcache_init(&c, L, sparse, E, k, S);
    xcache_pin(&c, pin);
    long pinned = 0;
    int32_t *route = malloc(sizeof(int32_t) * (size_t)L * k), *pidx = malloc(sizeof(int32_t) * (size_t)L * k);
    uint64_t *last = calloc((size_t)S, sizeof *last), clock = 0;
    uint64_t rng = seed;
    long copies = 0, counted_steps = 0;
    for (int step = 0; step < steps; step++) {
        for (int l = 0; l < L; l++) s_route(&rng, E, k, route + (size_t)l * k);
        long before = copies;
        for (int l = 0; l < L; l++) {
            xcache_route(&c, l, route + (size_t)l * k, k);
            for (int e = 0; e < E; e++) {
                if (!c.need[e]) continue;
                int s = c.slot_of[(size_t)l * E + e];
                if (s < 0) {
                    if (lru) {
                        s = -1;
                        for (int t = 0; t < S; t++) {
                            if (c.slot[t].state == XC_FREE) { s = t; break; }
                            if (c.slot[t].layer == l && c.need[c.slot[t].expert]) continue;
                            if (s < 0 || last[t] < last[s]) s = t;
                        }
                    } else {
                        s = xcache_victim(&c, l, l, true, -1);
                        if (s < 0) s = xcache_victim(&c, l, l, false, -1);
                    }
                    xcache_assign(&c, s, l, e);
                    c.slot[s].state = XC_READY;
                    copies++;
                    pinned += c.pinned[l] && step >= steps / 4;
                }
                last[s] = ++clock;
            }
            int d = L - 1 - l < D ? L - 1 - l : D;
            if (lru || d <= 0) continue;
            for (int j = 0; j < d; j++) memcpy(pidx + (size_t)j * k, route + (size_t)(l + 1 + j) * k, sizeof(int32_t) * k);
            xcache_predicted(&c, l + 1, d, pidx, 1, k);
            for (int j = 0; j < d; j++)
                for (int i = 0; i < k; i++) {
                    int nl = l + 1 + j, e = pidx[(size_t)j * k + i];
                    if (c.slot_of[(size_t)nl * E + e] >= 0) continue;
                    int s = xcache_victim(&c, l, l, true, (float)(j + 1));
                    if (s < 0) continue;
                    xcache_assign(&c, s, nl, e);
                    c.slot[s].state = XC_READY;
                    last[s] = ++clock;
                    copies++;
                }
        }
        if (step < steps / 4) copies = before; /* warm-up */
        else counted_steps++;
    }
    free(route), free(pidx), free(last);
    xcache_free(&c);
    if (pinned_copies) *pinned_copies = pinned;
    return (double)copies / (double)counted_steps;
}

static void test_simulation(void)
{
    const int L = 32, E = 8, k = 2, steps = 400;
    const int slots[] = {239, 246, 200};
    for (int i = 0; i < 3; i++) {
        int S = slots[i];
        double uses = (double)L * k, expect = uses * (1.0 - (double)S / (L * E));
        double ours = s_simulate(L, E, k, S, 16, 1, steps, false, 7 + i, NULL);
        double lru = s_simulate(L, E, k, S, 16, 1, steps, true, 7 + i, NULL);
        fprintf(stderr, "xcache sim: %d slots of %d: copies per step %.2f (share-of-slots expectation %.2f, LRU %.2f)\n", S,
                L * E, ours, expect, lru);
        T_CHECK(ours <= 1.10 * expect, "%d slots: %.2f copies a step, expected about %.2f", S, ours, expect);
        T_CHECK(ours < lru, "%d slots: %.2f copies a step, LRU %.2f", S, ours, lru);
    }
    /* split experts' tails at 24 GiB (model/gpu_model.c): 29 slots for 256 tails with 2
     * layers pinned (gpu_decode), 53 with 5 (strata bench), the next 2 layers known: the same
     * share-of-slots traffic, and after the warm-up no copy into the pinned layers */
    const int tail_slots[2] = {29, 53}, tail_pins[2] = {2, 5};
    for (int i = 0; i < 2; i++) {
        long pinned = -1;
        double ours = s_simulate(L, E, k, tail_slots[i], 2, tail_pins[i], steps, false, 11, &pinned);
        double expect = (double)L * k * (1.0 - (double)tail_slots[i] / (L * E));
        fprintf(stderr, "xcache sim: %d tail slots, %d layers pinned: copies per step %.2f (expectation %.2f), %ld into "
                "the pinned layers\n", tail_slots[i], tail_pins[i], ours, expect, pinned);
        T_CHECK(ours <= 1.05 * expect && pinned == 0, "tails: %.2f copies a step (about %.2f), %ld into the pinned layers",
                ours, expect, pinned);
    }
}

/* xcache_victims gives what m calls of xcache_victim give with each slot assigned in between,
 * over random caches: some slots free, loading or pinned, a window with predictions, popularity
 * from random routing, equal next uses among them (ties by the lower slot), with and without
 * keep_pred, m from 1 to past the evictable slots. */
static void test_victims(void)
{
    enum { L = 6, E = 8, S = 40 };
    uint64_t rng = 77;
    bool sparse[L] = {true, true, false, true, true, true};
    int bad = 0, runs = 0;
    for (int round = 0; round < 200; round++) {
        xcache_t a, b;
        int32_t now[2];
        xcache_t *cs[2] = {&a, &b};
        for (int w = 0; w < 2; w++) {
            uint64_t r = rng; /* the same cache twice */
            xcache_t *c = cs[w];
            xcache_init(c, L, sparse, E, 2, S);
            xcache_pin(c, 1 + (int)(t_rng_next(&r) % 3));
            for (int s = 0; s < S; s++) {
                const uint64_t v = t_rng_next(&r);
                if (v % 7 == 0) continue; /* free */
                int l, e;
                do l = (int)(t_rng_next(&r) % L), e = (int)(t_rng_next(&r) % E);
                while (!sparse[l] || c->slot_of[l * E + e] >= 0);
                xcache_assign(c, s, l, e);
                c->slot[s].state = v % 11 == 0 ? XC_LOADING : XC_READY;
            }
            for (int st = 0; st < 3; st++)
                for (int l = 0; l < L; l++) {
                    if (!sparse[l]) continue;
                    int32_t idx[2] = {(int32_t)(t_rng_next(&r) % E), (int32_t)(t_rng_next(&r) % E)};
                    if (t_rng_next(&r) % 3) xcache_route(c, l, idx, 2);
                }
            int32_t pidx[2 * 2];
            for (int i = 0; i < 4; i++) pidx[i] = (int32_t)(t_rng_next(&r) % E);
            xcache_predicted(c, 1, 2, pidx, 1, 2);
            now[0] = (int32_t)(t_rng_next(&r) % E), now[1] = (int32_t)(t_rng_next(&r) % E);
            xcache_route(c, 3, now, 2);
            if (w == 1) rng = r;
        }
        const bool keep = round & 1;
        const int m = 1 + round % 45, cur = a.moe_ord[3];
        int32_t got[S], want[S];
        const int k = xcache_victims(&a, 3, cur, keep, got, m);
        int n = 0;
        for (; n < m; n++) { /* the sequential way, each victim given an expert layer 3 routes to */
            const int s = xcache_victim(&b, 3, cur, keep, -1.0f);
            if (s < 0) break;
            want[n] = s;
            b.slot[s].layer = 3, b.slot[s].expert = now[0], b.slot[s].state = XC_READY;
        }
        bad += k != n || memcmp(got, want, sizeof *got * (size_t)(k < n ? k : n)) != 0;
        runs++;
        xcache_free(&a);
        xcache_free(&b);
    }
    T_CHECK(bad == 0, "xcache_victims differs from xcache_victim in turn in %d of %d caches", bad, runs);
}

int main(void)
{
    test_layout();
    test_victim_order();
    test_landed();
    test_pins();
    test_popularity();
    test_simulation();
    test_victims();
    return t_done("xcache");
}
