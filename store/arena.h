/* arena.h - the per-NUMA-node weight arenas: a model folder's files in shared memory.
 *
 * The prefetcher of node N owns shm segment "/strata-<group>-<token>-arena-<N>" (common/shm.h:
 * the token, in the run dir, is drawn anew each time the prefetcher creates the arena). Its
 * payload is an arena_index_t followed by file images: metadata files (json, tokenizer) at
 * 4 KiB-aligned offsets right after the index, then weight files at 2 MiB-aligned offsets:
 *
 *   [shm_header_t | arena_index_t][config.json][manifest]...[pad][resident.bin][pad][experts-000.bin]...
 *
 * Which files: every regular, non-hidden file of the model folder (a packed folder: manifest,
 * config.json, tokenizer files, resident.bin, experts-LLL.bin; an HF folder works the same).
 * With P prefetchers, metadata files (anything not *.bin / *.safetensors) are in every arena;
 * weight files, sorted by name, go round-robin: weight file k lives in the arena of the
 * prefetcher at index k % P of the config's [prefetcher.N] list. So P nodes share the weights
 * instead of each holding a copy, and the placement is a pure function of the config.
 *
 * A host budget ([prefetcher.N] host_mem) makes the arena a cache over the disk: the packed
 * model's expert files (experts-*.bin) are not imaged. They are listed with ARENA_F_DISK and
 * offset 0, and a region of n_slots slots of slot_bytes each follows the images, at slots_off
 * (an ARENA_ALIGN multiple). The prefetcher reads expert blocks from those files into slots
 * on demand (services/prefetcher/dtier.h) and alone uses them: it computes every expert of a
 * disk file itself, so no other process ever reads a slot, and its slot map lives in its own
 * memory. A restarted prefetcher starts with every slot empty.
 *
 *   [shm_header_t | arena_index_t][config.json][manifest]...[pad][resident.bin][pad][slot 0][slot 1]...
 *
 * The layout hash in the shm header covers: this format's version, the index struct size,
 * (part, parts), the host budget as configured (bytes or fraction), the model folder's real
 * path and every file's name, size and mtime. An
 * attacher computes it from stat() alone (no file is read), so an executor can check that an
 * arena matches its config without touching the model on disk.
 */
#ifndef STRATA_ARENA_H
#define STRATA_ARENA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"
#include "common/shm.h"
#include "common/strata.h"

#define ARENA_MAGIC 0x414e455241525453ull /* "STRARENA" */
#define ARENA_VERSION 2u
#define ARENA_ALIGN (2u << 20)            /* weight file image alignment inside the segment, bytes */
#define ARENA_MAX_FILES 512
#define ARENA_FILE_NAME 64

typedef struct {
    char name[ARENA_FILE_NAME]; /* plain file name in the model folder */
    uint64_t offset;            /* segment offset of the image (weights: ARENA_ALIGN multiple; others 4096) */
    uint64_t bytes;             /* file size */
    int64_t mtime_ns;           /* file mtime when copied */
    uint32_t flags;             /* ARENA_F_* */
    uint32_t reserved;
} arena_entry_t;

#define ARENA_F_DISK 1u         /* not imaged: its expert blocks are read into slots on demand (offset 0) */

/* At shm_payload(seg). */
typedef struct {
    uint64_t magic;             /* ARENA_MAGIC */
    uint32_t version;           /* ARENA_VERSION */
    uint32_t n_files;           /* entries used in files[] */
    int32_t part, parts;        /* this arena's index in the config's prefetcher list, and the count */
    int32_t node;               /* NUMA node */
    int32_t reserved;
    uint64_t data_bytes;        /* sum of the imaged files' sizes */
    uint64_t disk_bytes;        /* sum of the ARENA_F_DISK files' sizes */
    uint64_t host_budget;       /* the resolved host budget, bytes; 0 = none (every file imaged) */
    uint64_t slots_off;         /* segment offset of slot 0 (ARENA_ALIGN multiple); 0 = no slots */
    uint64_t slot_bytes;        /* bytes a slot, a multiple of 4096: the largest expert block */
    uint32_t n_slots;
    uint32_t reserved2;
    char model_dir[512];        /* real path of the model folder */
    arena_entry_t files[ARENA_MAX_FILES];
} arena_index_t;

/* What one arena will hold, from stat() of the model folder. */
typedef struct {
    char model_dir[512];        /* real path */
    int32_t part, parts, node;
    uint32_t n_files;
    arena_entry_t files[ARENA_MAX_FILES];  /* offsets filled in */
    uint64_t data_bytes;        /* sum of the imaged files' sizes */
    uint64_t disk_bytes;        /* sum of the ARENA_F_DISK files' sizes */
    bool tiered;                /* a host budget is set: expert files stay on disk */
    int64_t host_mem;           /* the budget as configured: bytes, or 0 */
    double host_frac;           /* ... or a fraction of the node's free memory, or 0 */
    uint64_t seg_bytes;         /* whole segment size (tiered: up to the slots, which the prefetcher adds) */
    uint64_t layout_hash;
} arena_plan_t;

/* Segment name of node's arena in namespace ns ("<group>-<token>", shm_ns_read) into buf:
 * "/strata-<ns>-arena-<node>". */
int arena_shm_name(char *buf, size_t n, const char *ns, int node);
/* Plan arena `part` of `parts` (node = its NUMA node) for model_dir, with the host budget
 * host_mem bytes or host_frac of free memory (both 0: none; [prefetcher.N] host_mem). Reads
 * directory entries and stat()s files only. Errors name the folder or file. */
int arena_plan(arena_plan_t *p, const char *model_dir, int part, int parts, int node, int64_t host_mem, double host_frac,
               strata_errbuf_t *eb);
/* True for a file that a host budget leaves on disk: a packed model's expert file. */
bool arena_is_disk_file(const char *name);
/* Check that seg's payload is an arena index matching plan p (same files, sizes, offsets, and
 * slots that lie inside the segment). */
int arena_check(const shm_seg_t *seg, const arena_plan_t *p, strata_errbuf_t *eb);

/* All arenas of a group, attached read-only (executor side). */
typedef struct {
    int n;
    shm_seg_t seg[CONFIG_MAX_PREFETCHERS];
    const arena_index_t *idx[CONFIG_MAX_PREFETCHERS];
} arena_set_t;

/* Attach the arena of every [prefetcher.N] in c, read-only: its name from the node's token in
 * c->run_dir (shm_ns_read; -ENOENT while there is none), then who owns and may write it, header,
 * layout hash (computed from stat() of c->model) and index. No model file is read. */
int arena_set_attach(arena_set_t *s, const strata_config_t *c, strata_errbuf_t *eb);
/* Pointer to the image of file `name` (searched in every arena) and its size, or NULL (also
 * for a file that is on disk: see arena_set_disk_file). */
const void *arena_set_file(const arena_set_t *s, const char *name, uint64_t *bytes);
/* The index of the arena whose slots cache file `name` (ARENA_F_DISK), or -1. */
int arena_set_disk_file(const arena_set_t *s, const char *name);
/* Unmap everything. Safe on a zeroed s. */
void arena_set_detach(arena_set_t *s);

#endif
