/* exec_model.c - the executor's model over the weight arenas (see exec_model.h). */
#include "services/executor/exec_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zlib.h>

#include "model/packed.h"

int exec_model_from_arenas(model_t *m, const arena_set_t *s, strata_errbuf_t *eb)
{
    int rc = 0;
    packed_manifest_t pm = {0};
    packed_slot_t *slots = NULL;
    int32_t n_slots = 0, *idx = NULL;
    const unsigned char **maps = NULL;
    uint64_t mlen = 0, clen = 0;

    memset(m, 0, sizeof *m);
    const char *mtext = arena_set_file(s, PACKED_MANIFEST, &mlen);
    const char *ctext = arena_set_file(s, "config.json", &clen);
    if (!mtext || !ctext) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: no %s in the weight arenas (the model folder is not packed)",
                             !mtext ? PACKED_MANIFEST : "config.json");
    }
    if ((rc = packed_manifest_parse(&pm, mtext, (size_t)mlen, "arena:" PACKED_MANIFEST, eb)) < 0) goto fail;
    if ((rc = model_config_parse(&m->cfg, ctext, (size_t)clen, "arena:config.json", eb)) < 0) goto fail;
    uint32_t ccrc = (uint32_t)crc32(crc32(0, Z_NULL, 0), (const Bytef *)ctext, (uInt)clen);
    if (ccrc != pm.config_crc32) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "arena:config.json: crc32 0x%08x does not match field 'config_crc32' (0x%08x) of %s",
                           (unsigned)ccrc, (unsigned)pm.config_crc32, PACKED_MANIFEST);
        goto fail;
    }
    maps = calloc((size_t)pm.n_files, sizeof *maps);
    if (!maps) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    for (int32_t i = 0; i < pm.n_files; i++) {
        uint64_t bytes = 0;
        maps[i] = arena_set_file(s, pm.files[i].name, &bytes);
        if (!maps[i]) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: weight file '%s' (field 'files[%d].name' of %s) is in no arena",
                               pm.files[i].name, i, PACKED_MANIFEST);
            goto fail;
        }
        if (bytes != pm.files[i].bytes) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: '%s' holds %" PRIu64 " bytes but field 'files[%d].bytes' of %s says %" PRIu64,
                               pm.files[i].name, bytes, i, PACKED_MANIFEST, pm.files[i].bytes);
            goto fail;
        }
    }
    if ((rc = packed_slots(&m->cfg, NULL, &slots, &n_slots)) < 0) goto fail;
    idx = malloc(((size_t)n_slots + 1) * sizeof *idx);
    if (!idx) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    if ((rc = packed_manifest_check(&pm, &m->cfg, "arena:" PACKED_MANIFEST, idx, eb)) < 0) goto fail;
    free(slots);
    slots = NULL;

    m->layers = calloc((size_t)m->cfg.n_layers, sizeof *m->layers);
    if (!m->layers || model_own_buffer(m, m->layers) < 0) {
        free(m->layers);
        m->layers = NULL;
        rc = STRATA_ENOMEM;
        goto fail;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (!m->cfg.layer_sparse[l]) continue;
        ffn_t *x = calloc((size_t)m->cfg.n_experts, sizeof *x);
        if (!x || model_own_buffer(m, x) < 0) {
            free(x);
            rc = STRATA_ENOMEM;
            goto fail;
        }
        m->layers[l].experts = x;
    }
    if ((rc = packed_slots(&m->cfg, m, &slots, &n_slots)) < 0) goto fail;
    for (int32_t k = 0; k < n_slots; k++) {
        const packed_tensor_t *t = &pm.tensors[idx[k]];
        /* the arena maps are read-only; qmat_t and the vector slots are const in use */
        unsigned char *base = (unsigned char *)(uintptr_t)maps[t->file];
        if (slots[k].q) {
            qmat_t *q = slots[k].q;
            q->fmt = t->fmt;
            q->rows = t->rows;
            q->cols = t->cols;
            q->group = t->fmt == WF_INT4 ? t->group : 0;
            q->data = base + t->offset;
            q->scales = t->scale_bytes ? base + t->scale_offset : NULL;
        } else {
            STRATA_ASSERT(slots[k].v);
            *slots[k].v = (float *)(void *)(base + t->offset);
        }
    }
    if (m->cfg.tie_embeddings) m->lm_head = m->embed;
    rc = 0;
    goto done;
fail:
    model_free(m);
    memset(m, 0, sizeof *m);
done:
    free(slots);
    free(idx);
    free(maps);
    packed_manifest_free(&pm);
    return rc;
}

int exec_model_open(exec_model_t *em, const strata_config_t *cfg, double wait_s, volatile sig_atomic_t *stop,
                    strata_errbuf_t *eb)
{
    int rc = 0;
    memset(em, 0, sizeof *em);
    double t0 = strata_now();
    if (cfg->n_prefetchers == 0 || !packed_is_packed(cfg->model)) {
        log_warn("%s: loading the model from disk (%s)", cfg->model,
                 cfg->n_prefetchers == 0 ? "the config has no [prefetcher.N], so there is no weight arena"
                                         : "not a packed model; the arenas serve packed models only");
        if ((rc = model_load(&em->m, cfg->model, eb)) < 0) return rc;
        em->load_ms = (strata_now() - t0) * 1e3;
        return 0;
    }
    /* A prefetcher that is (re)building its arena makes the attach fail for a while: absent
     * (ENOENT), being filled (EBUSY), just created (EFORMAT) or still the stale arena of other
     * model files (EVERSION) until the prefetcher replaces it. Wait for it, bounded. A model
     * folder that cannot be planned (EINVAL_INPUT) is final. */
    for (int tries = 0;; tries++) {
        rc = arena_set_attach(&em->arenas, cfg, eb);
        if (rc == 0) break;
        if (rc == STRATA_EINVAL_INPUT || rc == STRATA_ENOMEM || strata_now() - t0 > wait_s || (stop && *stop)) return rc;
        if (tries == 0) log_info("waiting for the weight arenas: %s", eb ? eb->msg : strata_strerror(rc));
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    em->from_arena = true;
    for (int i = 0; i < em->arenas.n; i++) em->arena_bytes += em->arenas.seg[i].size;
    rc = exec_model_from_arenas(&em->m, &em->arenas, eb);
    if (rc < 0) {
        arena_set_detach(&em->arenas);
        em->from_arena = false;
        return rc;
    }
    em->load_ms = (strata_now() - t0) * 1e3;
    return 0;
}

void exec_model_close(exec_model_t *em)
{
    model_free(&em->m);
    arena_set_detach(&em->arenas);
    memset(em, 0, sizeof *em);
}
