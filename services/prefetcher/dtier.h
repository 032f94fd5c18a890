/* dtier.h - the disk tier of one prefetcher's arena (store/arena.h, a host budget): the expert
 * blocks of the packed files that the arena does not image are read into its slots on demand,
 * with io_uring (liburing), O_DIRECT where the file system allows it, and each block's crc32 is
 * checked against the manifest before anything computes on it.
 *
 * Only the prefetcher's ring thread uses a dtier, one job at a time: a fetch may evict only
 * slots that the job it serves does not use, and the job's compute has returned (every worker
 * done) before the next fetch, so a slot is never overwritten while it is read. The slot map
 * lives in this process: a restart begins with every slot empty.
 *
 * Read-ahead: a job may carry hints, the experts the executor's gates predict for the next MoE
 * layers ([executor] prefetch_depth, default RING_AHEAD_DEPTH); they are read without waiting into cold
 * slots while the job computes (dtier_ahead). A job with more disk experts than slots goes in
 * waves of half the slots, each wave's successor read ahead while it computes.
 *
 * Slot policy: frequency plus recency, from the experts the executor routes (every expert of a
 * disk file comes here, so the jobs are its per-layer statistics): a slot used in the last
 * n_layers jobs (about one step) is kept; among the others, the least used expert goes first.
 *
 * A read that fails or comes back short is retried once through a plain pread, then reported
 * with the file, the expert and the offset; so is a crc32 mismatch (after one re-read). The
 * slot is left empty, and the job fails: its step's requests get the error.
 */
#ifndef STRATA_DTIER_H
#define STRATA_DTIER_H

#include <stdint.h>

#include "common/shm.h"
#include "model/packed.h"
#include "store/ring.h"

typedef struct dtier dtier_t;

typedef struct {
    uint32_t n_slots;
    uint64_t slot_bytes;
    int32_t experts;          /* experts whose blocks are in this arena's disk files */
    int32_t resident;         /* slots that hold an expert now */
    uint64_t hits, misses;    /* expert fetches served by a slot, and read from disk */
    uint64_t disk_bytes;      /* bytes read from disk */
    double disk_s;            /* time spent on those reads */
    uint64_t errors;          /* blocks that failed a read or their crc32 after the retry */
    uint64_t ahead_reads;     /* read-aheads issued (dtier_ahead) */
    uint64_t ahead_used;      /* ... whose expert a fetch then found in its slot */
    int uring;                /* 1 io_uring, 0 pread (io_uring unavailable) */
} dtier_stats_t;

/* Open over arena (its index has slots), for the model m built over it with bases (see
 * model_load_arenas) and its parsed manifest pm, which must outlive the dtier. Opens the disk
 * files of the arena under model_dir. 0, or <0 with eb set (a file missing, or a block larger
 * than a slot). */
int dtier_open(dtier_t **out, const shm_seg_t *arena, const model_t *m, const packed_manifest_t *pm,
               const unsigned char *const *bases, const char *model_dir, strata_errbuf_t *eb);
/* Whether expert e of layer l lives in one of this arena's disk files. */
bool dtier_holds(const dtier_t *t, int l, int e);
/* Slots: the most distinct experts one fetch may ask for. */
int dtier_slots(const dtier_t *t);
/* Make the n distinct experts of layer l (n <= dtier_slots, each dtier_holds) resident and
 * point out[i] at expert[i]'s tensors in its slot. The views stay valid until the next fetch.
 * 0, or <0 with eb naming the file, the expert and the offset. */
int dtier_fetch(dtier_t *t, int l, const int32_t *experts, int n, ffn_t *out, strata_errbuf_t *eb);
/* Start reading ahead, without waiting, the experts that hints name (the executor's gates'
 * prediction for the layers ahead, or a job's next wave) and no slot holds: each into a slot
 * that the last fetch does not use (cold_only: and unused for about a step), at most AHEAD_MAX
 * (32) in flight. A later fetch reaps them (a whole block whose crc32 matches fills its slot;
 * any other leaves it empty) and waits for one it needs. Returns how many were issued (0
 * without io_uring). */
int dtier_ahead(dtier_t *t, const ring_hint_t *h, int n, bool cold_only);
/* Fill the empty slots with the first experts in layer order (at start: no statistics yet).
 * A block that fails is logged and left out. Returns the number of slots filled. */
int dtier_prefill(dtier_t *t);
/* Counters, safe to read from another thread while the ring thread fetches. */
void dtier_stats(const dtier_t *t, dtier_stats_t *st);
/* Close the files and free. Safe on NULL. */
void dtier_close(dtier_t *t);

#endif
