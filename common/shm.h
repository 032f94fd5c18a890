/* shm.h - POSIX shared-memory segments with a checked header, placed on a NUMA node.
 *
 * Every segment starts with shm_header_t (DESIGN.md "Shm header"): magic, version, layout
 * hash, size, owner pid and a ready flag. The creator writes the header with ready = 0, fills
 * the payload, then shm_publish() stores ready = 1 with release order, so an attacher that
 * reads ready == 1 with acquire order sees the whole payload. shm_attach() checks every field
 * and refuses a segment that is not ready unless asked.
 *
 * Segments are mapped at a 2 MiB-aligned address, so payload offsets aligned to 2 MiB inside
 * the segment are 2 MiB-aligned in memory too (huge pages, one-DMA experts).
 *
 * Names are POSIX shm names ("/strata-<group>-arena-<N>"): files under /dev/shm on Linux.
 */
#ifndef STRATA_SHM_H
#define STRATA_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strata.h"

#define SHM_MAGIC 0x314d485341525453ull /* "STRASHM1" in little-endian bytes */
#define SHM_VERSION 1u
#define SHM_HEADER_BYTES 4096u          /* the payload starts here */
#define SHM_MAP_ALIGN (2u << 20)        /* mapping address alignment */
#define SHM_NAME_MAX 128

/* The first bytes of every segment. Fixed layout: fields only ever appended, with a version bump. */
typedef struct {
    uint64_t magic;          /* SHM_MAGIC */
    uint32_t version;        /* SHM_VERSION */
    uint32_t header_bytes;   /* SHM_HEADER_BYTES: offset of the payload */
    uint64_t layout_hash;    /* creator-defined hash of what the payload holds and how */
    uint64_t size;           /* bytes of the whole segment, header included; == file size */
    int32_t owner_pid;       /* process that created or took over the segment */
    int32_t numa_node;       /* node the pages are bound to, -1 = none */
    uint64_t created_ns;     /* CLOCK_REALTIME at creation, ns */
    uint32_t ready;          /* 0 while being filled, 1 once complete; written last (release) */
    uint32_t reserved;
} shm_header_t;

typedef struct {
    char name[SHM_NAME_MAX];
    uint8_t *base;           /* [size] the mapping, 2 MiB aligned; base == (uint8_t *)hdr */
    size_t size;             /* bytes mapped (the whole segment) */
    shm_header_t *hdr;
    bool writable;
} shm_seg_t;

/* attach flags */
#define SHM_WRITE 1u          /* map read-write (default read-only) */
#define SHM_ALLOW_NOT_READY 2u /* accept ready == 0 (an owner inspecting a half-filled segment) */

/* Create segment `name` (must not exist: STRATA_EEXISTS) of `size` bytes (>= SHM_HEADER_BYTES),
 * bound to numa_node (-1: no binding) with mbind before any page is touched, space reserved
 * up front (ENOSPC now rather than SIGBUS later), mapped read-write. The header is written
 * with ready = 0 and owner_pid = getpid(). On failure nothing is left behind. */
int shm_create(shm_seg_t *s, const char *name, uint64_t size, uint64_t layout_hash, int numa_node,
               strata_errbuf_t *eb);
/* Mark s complete: ready = 1 with release order. Call after the payload is written. */
void shm_publish(shm_seg_t *s);
/* Attach an existing segment and check magic, version, header size, size against the file,
 * layout_hash (must equal), owner pid (> 0) and ready (acquire). Errors: -ENOENT (no such
 * segment), STRATA_EFORMAT (not a strata segment, or truncated), STRATA_EVERSION (version or
 * layout hash differs), STRATA_EBUSY (not ready); eb says which, with the segment name. */
int shm_attach(shm_seg_t *s, const char *name, uint64_t layout_hash, unsigned flags, strata_errbuf_t *eb);
/* True if the owner pid recorded in the header is a live process. */
bool shm_owner_alive(const shm_seg_t *s);
/* Record the calling process as the owner (segment attached with SHM_WRITE). */
void shm_take_ownership(shm_seg_t *s);
/* Unmap s (the segment itself stays). Safe on a zeroed s. */
void shm_detach(shm_seg_t *s);
/* Remove the segment's name (mappings stay valid until unmapped). 0 if removed or absent. */
int shm_remove(const char *name);
/* Remove every segment whose name starts with prefix ("/strata-g-"). Returns how many, or <0. */
int shm_remove_prefix(const char *prefix);
/* Count segments whose name starts with prefix (tests and `strata status`). */
int shm_count_prefix(const char *prefix);
/* Payload start (base + header_bytes). */
static inline uint8_t *shm_payload(const shm_seg_t *s) { return s->base + SHM_HEADER_BYTES; }

#endif
