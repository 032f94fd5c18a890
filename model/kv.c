/* kv.c - the paged fp32 KV cache (layout in model.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* Allocate n_blocks blocks of block_size tokens for every layer of c. Returns 0 or <0. */
int kv_cache_init(kv_cache_t *kv, const model_config_t *c, int32_t n_blocks, int32_t block_size)
{
    memset(kv, 0, sizeof(*kv));
    if (n_blocks <= 0 || block_size <= 0 || c->n_layers <= 0 || c->n_kv_heads <= 0 || c->head_dim <= 0)
        return STRATA_EINVAL_INPUT;
    /* elements per layer and in total; refuse sizes whose byte count overflows size_t */
    size_t per_block = (size_t)c->n_kv_heads * (size_t)block_size * (size_t)c->head_dim;
    size_t n = (size_t)c->n_layers * (size_t)n_blocks;
    if (per_block == 0 || n > SIZE_MAX / per_block || n * per_block > SIZE_MAX / sizeof(float))
        return STRATA_ETOOLARGE;
    n *= per_block;
    /* calloc: large caches come from mmap and are only touched as blocks fill */
    kv->k = calloc(n, sizeof(float));
    kv->v = calloc(n, sizeof(float));
    if (!kv->k || !kv->v) {
        kv_cache_free(kv);
        return STRATA_ENOMEM;
    }
    kv->n_layers = c->n_layers;
    kv->n_blocks = n_blocks;
    kv->block_size = block_size;
    kv->n_kv_heads = c->n_kv_heads;
    kv->head_dim = c->head_dim;
    return 0;
}

/* Release the cache's buffers; kv may be zeroed or already freed. */
void kv_cache_free(kv_cache_t *kv)
{
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    memset(kv, 0, sizeof(*kv));
}
