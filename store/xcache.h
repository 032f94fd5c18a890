/* xcache.h - the expert cache's policy (host side, no CUDA): which (layer, expert) each slot
 * holds, which experts the current layer routes to and the next layers are predicted to, the
 * experts' decayed popularity, and the choice of a victim. model/gpu_slots.c moves the bytes
 * and records the copies' events; this decides.
 *
 * Victim rule (Belady on average): the evictable slot whose expert is expected to be needed
 * last, xcache_next_use: its layer's distance ahead in the cyclic order of the MoE layers (a
 * full cycle for the current layer), one cycle more when the prediction window covers its
 * layer and does not name it, and one cycle for each step that its popularity (uses per step,
 * decayed by XCACHE_POP_DECAY a step) expects it to be skipped. Under uniform routing this
 * evicts the layers just computed, where LRU or LFU would evict the ones needed next. The
 * experts of the pinned MoE layers (xcache_pin: the first always, no gate earlier in a step
 * predicts it; the others spread over the step) come before every other; a prefetch never
 * evicts them, and a miss only when nothing else is left. Never evictable: a slot the current
 * layer routes to, or one whose copy has not landed.
 */
#ifndef STRATA_XCACHE_H
#define STRATA_XCACHE_H

#include <stdbool.h>
#include <stdint.h>

/* a step's use counts 1, decayed by this factor a step (a ~256-step window) */
#define XCACHE_POP_DECAY (1.0f - 1.0f / 256)

typedef enum { XC_FREE = 0, XC_READY = 1, XC_LOADING = 2 } xc_state_t;

typedef struct {
    int32_t layer, expert;   /* what the slot holds, -1 when free */
    xc_state_t state;
    bool prefetched;         /* arrived by prefetch and not used yet */
} xc_slot_t;

typedef struct {
    int32_t n_layers, n_experts, n_moe, n_slots;
    uint8_t *pinned;         /* [n_moe] by ordinal: the layer's experts are kept over the rest */
    int32_t *pin_order;      /* [n_moe] the ordinals in the order xcache_pin pins them */
    int32_t *moe_ord;        /* [n_layers] index among the MoE layers, -1 for a dense layer */
    int32_t *moe_layer;      /* [n_moe] layer index by ordinal */
    xc_slot_t *slot;         /* [n_slots] */
    int32_t *slot_of;        /* [n_layers][n_experts] slot index or -1 */
    uint8_t *need;           /* [n_experts] experts the current layer routes to */
    uint8_t *pneed;          /* [n_layers][n_experts] experts predicted in the window (2: predicted, but left to
                                the CPU by model/gpu_cpu.c, so not prefetched) */
    int32_t win_lo, win_n;   /* MoE ordinals [win_lo, win_lo + win_n) that pneed covers */
    float *pop;              /* [n_layers][n_experts] decayed uses per step */
    float *pop_wait;         /* [n_layers][n_experts] the popularity's term of xcache_next_use, kept with pop */
    int32_t *ord_d;          /* [n_moe] xcache_victim's scratch: each ordinal's distance ahead */
    float *vic_t;            /* [n_slots] xcache_victims' scratch: the chosen slots' next use */
    /* 1 when the copy into slot s has landed, 0 if not, <0 on error; NULL: always landed */
    int (*landed)(void *ctx, int s);
    void *ctx;
} xcache_t;

/* Slots for n_slots experts of a model of n_layers layers (sparse[l]: MoE layer) with
 * n_experts experts each, top_k routed a token; popularity starts at the uniform k/E a step.
 * Every slot starts free. n_slots may be 0, with the slots given later by xcache_set_slots
 * (the layout, moe_ord / moe_layer, is then already there). Returns 0 or -ENOMEM. */
int xcache_init(xcache_t *c, int32_t n_layers, const bool *sparse, int32_t n_experts, int32_t top_k, int32_t n_slots);
/* Replace the (free) slots by n_slots free ones. Returns 0 or -ENOMEM. */
int xcache_set_slots(xcache_t *c, int32_t n_slots);
void xcache_free(xcache_t *c);

/* Pin the first n ordinals of pin_order (at least 1, at most n_moe): ordinal 0, then
 * ordinals that halve the largest gap between those pinned so far and the end of the step
 * (n_moe = 32: 0, 16, 8, 24, 4, 12, ...), so a smaller set is part of a larger one and the
 * pinned layers sit where the link has later layers to copy while they compute. */
void xcache_pin(xcache_t *c, int n);
/* Slot s now holds expert e of layer l (its previous expert, if any, is no longer resident). */
void xcache_assign(xcache_t *c, int s, int l, int e);
/* Expected MoE-layer steps until expert e of layer l is used again, seen from MoE ordinal cur
 * (-1: before the first layer of a step). */
float xcache_next_use(const xcache_t *c, int l, int e, int cur);
/* The evictable slot needed last, seen from MoE ordinal cur: a free slot first; never one that
 * layer_now (-1: none) routes to (need) or one still loading; with keep_pred not one predicted
 * in the window. -1 if none, or if the best is needed no later than `before` (pass a negative
 * value for no such limit). Loading slots found landed become READY. */
int xcache_victim(xcache_t *c, int layer_now, int cur, bool keep_pred, float before);
/* The m evictable slots needed last, best first, as m calls of xcache_victim (before < 0) would
 * give them with each one's slot assigned to an expert layer_now routes to in between: free
 * slots first (by index), then by xcache_next_use, the lower index first among equal ones. One
 * scan for a layer's misses. Writes out[0..k) and returns k <= m. */
int xcache_victims(xcache_t *c, int layer_now, int cur, bool keep_pred, int32_t *out, int m);
/* Slots still loading (asks landed). */
int xcache_inflight(xcache_t *c);
/* Layer l routes to idx[0..n_idx) this step: sets need, updates the layer's popularity. */
void xcache_route(xcache_t *c, int l, const int32_t *idx, int n_idx);
/* The prediction for the D MoE layers from ordinal first on: pidx[n][D][top_k] (entries outside
 * [0, n_experts) ignored) becomes the window. D = 0 clears it. */
void xcache_predicted(xcache_t *c, int first, int D, const int32_t *pidx, int n, int top_k);

#endif
