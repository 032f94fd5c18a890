/* model.h - model configuration, weights and the forward pass.
 *
 * A model_t is loaded either from a Hugging Face checkpoint folder (config.json plus
 * *.safetensors) or from a packed folder (see docs/PACKED_FORMAT.md). Both yield the same
 * in-memory structure: every matrix is a qmat_t pointing into mmapped files or owned
 * buffers; the forward pass does not know where the weights came from.
 */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strata.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/qmat.h"
#include "kernels/cpu/threadpool.h"

typedef enum { ARCH_MIXTRAL = 0, ARCH_QWEN2_MOE = 1, ARCH_QWEN3_MOE = 2, ARCH_OLMOE = 3, ARCH_GPT_OSS = 4 } arch_t;

/* Most end-of-sequence ids a model may list (model_config_t.eos_ids; the hello's eos_ids). */
#define MODEL_MAX_EOS 16

typedef enum {
    FFN_ACT_SILU = 0,   /* h = silu(g) * u */
    FFN_ACT_GPT_OSS = 1 /* g = min(g, limit), u = clamp(u, -limit, limit), h = (u + 1) * g * sigmoid(alpha g) */
} ffn_act_t;

typedef enum {
    QK_NORM_NONE = 0,
    QK_NORM_HEAD = 1, /* Qwen3-MoE: RMSNorm over head_dim, weight [head_dim], per head */
    QK_NORM_FULL = 2, /* OLMoE: RMSNorm over the whole projection, weight [n_heads*head_dim] */
} qk_norm_t;

typedef struct {
    arch_t arch;
    char arch_name[64];       /* "MixtralForCausalLM", ... */
    int32_t vocab;
    int32_t hidden;
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;         /* hidden / n_heads unless the config says otherwise */
    int32_t max_pos;          /* max_position_embeddings */
    float rms_eps;
    /* RoPE */
    float rope_theta;
    int32_t rot_dim;          /* rotary dims per head (head_dim * partial_rotary_factor) */
    float inv_freq[512];      /* [rot_dim/2], scaling already applied */
    float attn_factor;        /* multiplies cos/sin (1 unless a scaling type says otherwise) */
    /* attention */
    bool qkv_bias;
    bool o_bias;
    qk_norm_t qk_norm;
    bool attn_sinks;          /* gpt-oss: a learned logit per head joins each softmax */
    int32_t sliding_window;   /* tokens a sliding layer attends to (itself included); 0 = none */
    bool layer_sliding[256];  /* [n_layers] true = the layer attends only to the last sliding_window */
    /* MoE */
    int32_t n_experts;
    int32_t top_k;
    bool norm_topk;
    int32_t moe_inter;        /* expert intermediate size */
    int32_t shared_inter;     /* shared expert intermediate size; 0 = none */
    int32_t dense_inter;      /* intermediate size of dense MLP layers */
    bool layer_sparse[256];   /* [n_layers] true = MoE layer, false = dense MLP */
    bool router_bias;         /* gpt-oss: the router has a bias [n_experts] */
    bool expert_bias;         /* gpt-oss: experts have gate/up/down biases */
    ffn_act_t ffn_act;
    float act_limit, act_alpha; /* FFN_ACT_GPT_OSS: 7.0 and 1.702 */
    bool experts_mxfp4[256];  /* [n_layers] the checkpoint ships this layer's experts in MXFP4
                               * (quantization_config quant_method mxfp4) */
    bool tie_embeddings;
    int32_t bos_id, eos_id;   /* -1 if absent; eos_id = eos_ids[0] */
    /* The ids that end a generation, as transformers' generate() stops: eos_token_id of
     * generation_config.json when the folder has one that sets it, else config.json's (an id or
     * a list). Distinct, in [0, vocab), in the order listed; listed ids outside the vocabulary
     * are dropped with a warning (the model can never emit them). */
    int32_t n_eos;                  /* [0, MODEL_MAX_EOS] */
    int32_t eos_ids[MODEL_MAX_EOS]; /* [n_eos] */
} model_config_t;

/* True when tok ends a generation: one of c->eos_ids. */
static inline bool model_is_eos(const model_config_t *c, int32_t tok)
{
    for (int32_t i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == tok) return true;
    return false;
}

/* The layer's window when layer l slides (attends to its last sliding_window positions), else 0. */
static inline int32_t model_layer_window(const model_config_t *c, int32_t l)
{
    return l >= 0 && l < 256 && c->layer_sliding[l] ? c->sliding_window : 0;
}

/* The model's sliding window when some layer slides, else 0. */
static inline int32_t model_sliding_window(const model_config_t *c)
{
    for (int32_t l = 0; l < c->n_layers; l++)
        if (model_layer_window(c, l) > 0) return c->sliding_window;
    return 0;
}

/* Parse config.json at path into c, then the generation_config.json beside it when there is
 * one (model_config_apply_generation). Every field of a real config is honoured or refused:
 * on error returns <0 and eb names the file and the field. */
int model_config_load(model_config_t *c, const char *path, strata_errbuf_t *eb);
/* Parse config.json text into c (for fuzzing, tests and the arenas, which then apply their
 * generation_config.json themselves); `name` is used in messages. */
int model_config_parse(model_config_t *c, const char *json, size_t len, const char *name, strata_errbuf_t *eb);
/* Apply generation_config.json text to a parsed c: its eos_token_id (an id or a list of at most
 * MODEL_MAX_EOS), when present and not null, replaces c's stop set (eos_id, eos_ids); other keys
 * are a request's defaults and are not read. 0, or <0 with eb naming `name` and the field and c
 * unchanged. */
int model_config_apply_generation(model_config_t *c, const char *json, size_t len, const char *name,
                                  strata_errbuf_t *eb);

typedef struct {
    qmat_t gate, up, down; /* gate/up: [inter][hidden]; down: [hidden][inter] */
} ffn_t;

typedef struct {
    float *attn_norm;            /* [hidden] */
    qmat_t wq, wk, wv, wo;       /* [n_heads*hd][hidden], [n_kv*hd][hidden] x2, [hidden][n_heads*hd] */
    float *bq, *bk, *bv, *bo;    /* biases or NULL */
    float *q_norm, *k_norm;      /* [head_dim] (HEAD) or [n_heads*hd] / [n_kv*hd] (FULL), or NULL */
    float *sinks;                /* [n_heads] attention sink logits, or NULL */
    float *ffn_norm;             /* [hidden] */
    /* MoE layer */
    qmat_t router;               /* [n_experts][hidden], F32 */
    float *router_b;             /* [n_experts] router bias, or NULL */
    ffn_t *experts;              /* [n_experts] */
    float *egate_b, *eup_b;      /* [n_experts][moe_inter] expert gate / up biases, or NULL */
    float *edown_b;              /* [n_experts][hidden] expert down biases, or NULL */
    ffn_t shared;                /* shared expert (if cfg.shared_inter) */
    qmat_t shared_gate;          /* [1][hidden] F32, sigmoid gate of the shared expert */
    /* dense layer */
    ffn_t dense;
} layer_t;

typedef struct model {
    model_config_t cfg;
    qmat_t embed;                /* [vocab][hidden], F32 or BF16 */
    float *final_norm;           /* [hidden] */
    qmat_t lm_head;              /* [vocab][hidden]; same data as embed when tied */
    layer_t *layers;             /* [n_layers] */
    /* ownership: mmaps and buffers, freed by model_free */
    void *priv;
} model_t;

/* Load from an HF folder or a packed folder (detected by its manifest). On error returns <0
 * and eb holds one line naming the file and the field. */
/* What model_load would refuse in folder dir without reading a weight: config.json, and a
 * packed manifest with every file at its size and every tensor in range, or the safetensors
 * files and their headers (the index's shards all present). 0 or <0 with eb naming the file. */
int model_check(const char *dir, strata_errbuf_t *eb);
int model_load(model_t *m, const char *dir, strata_errbuf_t *eb);
void model_free(model_t *m);

/* Hand a malloc'd buffer, or a mapping, to the model; model_free releases it. 0 or -ENOMEM. */
int model_own_buffer(model_t *m, void *p);
int model_own_mmap(model_t *m, void *addr, size_t len);

/* Implemented by the packed-format loader (model/packed.c); model_load calls it when dir
 * holds a packed manifest. */
int model_load_packed(model_t *m, const char *dir, strata_errbuf_t *eb);

/* Paged KV cache, fp32. Block b of layer l: k[l][b][n_kv_heads][block_size][head_dim]. */
typedef struct {
    int32_t n_layers, n_blocks, block_size, n_kv_heads, head_dim;
    float *k, *v;
} kv_cache_t;

int kv_cache_init(kv_cache_t *kv, const model_config_t *c, int32_t n_blocks, int32_t block_size);
void kv_cache_free(kv_cache_t *kv);

/* One step's tokens. Tokens of one sequence appear in increasing position order; every token
 * first writes its K/V at (seq, pos), then attends over positions 0..pos of its sequence (a
 * sliding layer: max(0, pos - sliding_window + 1)..pos), so a prefill chunk, decode tokens of
 * many sequences, or a mix of both share one step. With win_tables, the sliding layers write and
 * read their K/V through them and the other layers through block_tables; both are indexed alike
 * (position p in entry p / block_size), and a sliding layer never reads an entry wholly below a
 * token's window, which may be -1. */
typedef struct {
    int32_t n_tokens;
    const int32_t *tokens;             /* [n_tokens] */
    const int32_t *pos;                /* [n_tokens] position in its sequence */
    const int32_t *seq;                /* [n_tokens] index into block_tables */
    const int32_t *const *block_tables;/* [n_seqs] -> block ids, enough for pos/block_size+1 */
    int32_t n_logits;                  /* rows that need logits */
    const int32_t *logit_rows;         /* [n_logits] indices into tokens */
    const int32_t *const *win_tables;  /* [n_seqs] block ids of the sliding layers (-1: freed, out of every
                                          later query's window), or NULL: the sliding layers use block_tables */
} batch_t;

typedef struct forward_ctx forward_ctx_t;

/* Scratch buffers for up to max_tokens tokens a step. pool may be NULL. */
forward_ctx_t *forward_ctx_create(const model_t *m, int32_t max_tokens, tpool_t *pool);
void forward_ctx_free(forward_ctx_t *f);
/* Expert picks per layer, [n_layers][n_experts] (rows of dense layers stay 0), counted since
 * creation. */
const int64_t *forward_route_counts(const forward_ctx_t *f);
/* Experts computed by other processes: the prefetchers, each on the cores of the node whose
 * arena holds the expert, over a shm ring (store/ring.h; the executor implements this in
 * services/executor/exec_remote.c). A MoE layer posts each destination's experts first, runs
 * its own meanwhile, then waits; a destination that is down, or does not answer in time, has its
 * experts computed by the caller with the same kernels, except pinned ones: their job is posted
 * again once the destination is back, and fails the step (model_forward returns <0) if it does
 * not come back or the job fails by itself. */
typedef struct {
    void *ctx;
    int n_dest;
    const int8_t *owner;  /* [n_layers][n_experts]: the destination of each expert, -1 = here */
    const uint8_t *pinned;/* [n_layers][n_experts]: 1 = only its destination can read its bytes (a
                           * prefetcher's disk tier): never computed here; NULL = none */
    /* The input rows of dest's next job ([max_rows][hidden] fp32), or NULL if dest is down now
     * (its experts then run here). */
    float *(*rows)(void *ctx, int dest);
    /* Post dest's job: n experts of layer, counts[i] rows each, laid out back to back in rows(). */
    int (*post)(void *ctx, int dest, int layer, const int32_t *experts, const int32_t *counts, int n, uint64_t step);
    /* Wait for it: 0 with *out the output rows in the same layout, or <0 (then computed here). */
    int (*wait)(void *ctx, int dest, const float **out);
    /* What the last failed rows() or wait() met, for the step's error ("" none). */
    const char *(*error)(void *ctx);
    /* Read-ahead for pinned experts (a disk tier): each job to a destination with pinned experts
     * first gets, through hint(), the pinned experts of its own that the routers of the next
     * hint_depth MoE layers pick for this layer's rows (0 or NULL: none). */
    int hint_depth;
    void (*hint)(void *ctx, int dest, const int32_t *layers, const int32_t *experts, int n);
    /* After a failed wait(): whether the destination itself failed (died, stalled, restarted),
     * so a job of pinned experts is posted again once it is back; false for a job that failed
     * by itself (a bad read), which fails the step. NULL: never. */
    bool (*retry)(void *ctx, int dest);
} moe_remote_t;

/* What expert e of layer L adds to plain SwiGLU: its biases (gpt-oss) and the model's activation.
 * The pointers are into L; with neither, the result is all zero (plain SwiGLU). */
cpu_ffn_opts_t forward_expert_opts(const model_t *m, const layer_t *L, int e);

/* Route the experts r->owner names to r (NULL: every expert runs here). r must outlive f.
 * Returns 0 or -ENOMEM. */
int forward_set_remote(forward_ctx_t *f, const moe_remote_t *r);

/* Run one step. logits: [n_logits][vocab]. Returns 0 or <0. */
int model_forward(forward_ctx_t *f, kv_cache_t *kv, const batch_t *b, float *logits);

#endif
