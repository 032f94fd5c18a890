/* exec_model.c - the executor's model over the weight arenas (see exec_model.h). */
#include "services/executor/exec_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/packed.h"

/* model_load_packed_mem's source: the packed folder's files inside the attached arenas. */
static int s_arena_config(void *ctx, model_config_t *cfg, const char **text, size_t *len, strata_errbuf_t *eb)
{
    uint64_t clen = 0;
    *text = arena_set_file(ctx, "config.json", &clen);
    *len = (size_t)clen;
    STRATA_ASSERT(*text); /* exec_model_from_arenas checked it is there */
    return model_config_parse(cfg, *text, *len, "arena:config.json", eb);
}

static int s_arena_check_file(void *ctx, const packed_manifest_t *pm, int32_t i, strata_errbuf_t *eb)
{
    uint64_t bytes = 0;
    if (!arena_set_file(ctx, pm->files[i].name, &bytes)) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: weight file '%s' (field 'files[%d].name' of %s) is in no arena",
                             pm->files[i].name, i, PACKED_MANIFEST);
    }
    if (bytes != pm->files[i].bytes) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: '%s' holds %" PRIu64 " bytes but field 'files[%d].bytes' of %s says %" PRIu64,
                             pm->files[i].name, bytes, i, PACKED_MANIFEST, pm->files[i].bytes);
    }
    return 0;
}

static int s_arena_map_file(void *ctx, model_t *m, const packed_manifest_t *pm, int32_t i, const unsigned char **data,
                            strata_errbuf_t *eb)
{
    uint64_t bytes = 0;
    *data = arena_set_file(ctx, pm->files[i].name, &bytes);
    STRATA_ASSERT(*data && bytes == pm->files[i].bytes); /* s_arena_check_file passed */
    return 0;
}

int exec_model_from_arenas(model_t *m, const arena_set_t *s, strata_errbuf_t *eb)
{
    uint64_t mlen = 0, clen = 0;
    const packed_source_t src = {.manifest_name = "arena:" PACKED_MANIFEST, .config_name = "arena:config.json",
                                 .ctx = (void *)(uintptr_t)s, .config = s_arena_config,
                                 .check_file = s_arena_check_file, .map_file = s_arena_map_file};

    memset(m, 0, sizeof *m);
    const char *mtext = arena_set_file(s, PACKED_MANIFEST, &mlen);
    const char *ctext = arena_set_file(s, "config.json", &clen);
    if (!mtext || !ctext) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: no %s in the weight arenas (the model folder is not packed)",
                             !mtext ? PACKED_MANIFEST : "config.json");
    }
    return model_load_packed_mem(m, mtext, (size_t)mlen, &src, eb);
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
