/* exec_model.h - the executor's weights: a model_t built over the node weight arenas.
 *
 * The prefetchers own the arenas (store/arena.h): POSIX shm segments holding the packed
 * model's files. The executor maps them read-only and points every qmat_t of its model_t
 * straight into them (zero copy) with model_load_arenas (model/packed.h), the loader that model_load_packed
 * runs over mmapped files (so the same checks apply). An executor (re)start reads nothing of the
 * model from disk: config.json and the manifest come from the arena too; the model folder is
 * only stat()ed to check the layout hash.
 *
 * Fallback: a group without [prefetcher.N] sections, or a model folder that is not packed
 * (an HF folder), is loaded from disk with model_load(); the log says so.
 */
#ifndef STRATA_EXEC_MODEL_H
#define STRATA_EXEC_MODEL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "store/arena.h"
#include "common/config.h"
#include "model/model.h"

typedef struct {
    model_t m;
    arena_set_t arenas;     /* attached arenas (from_arena), else zeroed */
    bool from_arena;
    double load_ms;         /* time to attach and build the model */
    uint64_t arena_bytes;   /* bytes of the attached arena segments */
} exec_model_t;

/* Open the group's model: from the arenas of cfg (waiting up to wait_s seconds for them to be
 * ready, checking *stop), or from disk (see above). On error <0 with eb set; STRATA_EINVAL_INPUT
 * means the model or config is bad (do not restart). */
int exec_model_open(exec_model_t *em, const strata_config_t *cfg, double wait_s, volatile sig_atomic_t *stop,
                    strata_errbuf_t *eb);
/* Free the model, then unmap the arenas. Safe on a zeroed em. */
void exec_model_close(exec_model_t *em);

#endif
