/* exec_model.c - the executor's model over the weight arenas (see exec_model.h). */
#include "services/executor/exec_model.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/packed.h"

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
    /* A prefetcher that is (re)building its arena makes the attach fail for a while: no token
     * or no segment yet (ENOENT), being filled (EBUSY), just created (EFORMAT), still the stale
     * arena of other model files (EVERSION), or a segment at the token's name that is not ours
     * alone (EPERM, refused) until the prefetcher builds it under a new token. Wait for it,
     * bounded. A model folder that cannot be planned, or a run dir or token file that another
     * user owns or may write (EINVAL_INPUT), is final. */
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
    rc = model_load_arenas(&em->m, &em->arenas, false, NULL, eb);
    /* model_load_arenas parses config.json alone; the folder's generation_config.json (copied
     * by strata pack, and in the arena with every other file) sets the stop set, as
     * model_config_load does for a folder on disk */
    if (rc == 0) {
        uint64_t glen = 0;
        const char *gtext = arena_set_file(&em->arenas, "generation_config.json", &glen);
        if (gtext &&
            (rc = model_config_apply_generation(&em->m.cfg, gtext, (size_t)glen, "arena:generation_config.json", eb)) < 0)
            model_free(&em->m);
    }
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
