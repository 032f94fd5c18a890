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
 * Names are POSIX shm names: files under /dev/shm on Linux, a folder every user may write.
 * A group's names cannot be guessed: node N of group G names its segments
 * "/strata-<G>-<T>-arena-<N>" and "/strata-<G>-<T>-ring-<N>", where T (SHM_TOKEN_CHARS random
 * hex digits) lives in RUN_DIR/shm-<N>.token. The prefetcher of node N draws a new T whenever it
 * creates its arena (shm_ns_new), so no name it creates was ever visible before; every other
 * process reads T from the run dir (shm_ns_read). "<G>-<T>" is the node's namespace (ns).
 *
 * Trust. A segment, a token file and the run dir are used only if this user (the effective
 * uid) owns them, neither group nor others may write them, and no symbolic link leads to them:
 * shm_attach, shm_ns_read and shm_check_run_dir refuse anything else with one line naming it
 * and its owner or mode. A refused segment is never unlinked or written to.
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
#define SHM_TOKEN_CHARS 16              /* hex digits of the random part of a node's segment names */
#define SHM_NS_MAX 64                   /* "<group>-<token>": a 40-character group name fits */

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
/* Attach an existing segment. First who may write it: a regular file, not a symbolic link,
 * owned by this user, mode without group or other write bits; then, in the mapping of that same
 * file, magic, version, header size, size against the file, layout_hash (must equal), owner pid
 * (> 0) and ready (acquire). Errors: -ENOENT (no such segment), -EPERM (refused: another
 * owner, a mode others may write, a symlink; eb names the owner or mode), STRATA_EFORMAT (not a
 * strata segment, or truncated), STRATA_EVERSION (version or layout hash differs), STRATA_EBUSY
 * (not ready); eb says which, with the segment name. */
int shm_attach(shm_seg_t *s, const char *name, uint64_t layout_hash, unsigned flags, strata_errbuf_t *eb);
/* The owner and mode checks of shm_attach on name without opening it: 0 if it passes or does not
 * exist, -EPERM with eb naming it and its owner or mode. */
int shm_check_name(const char *name, strata_errbuf_t *eb);
/* True if the owner pid recorded in the header is a live process. */
bool shm_owner_alive(const shm_seg_t *s);
/* Record the calling process as the owner (segment attached with SHM_WRITE). */
void shm_take_ownership(shm_seg_t *s);
/* Unmap s (the segment itself stays). Safe on a zeroed s. */
void shm_detach(shm_seg_t *s);
/* Remove the segment's name (mappings stay valid until unmapped). 0 if removed or absent;
 * -EPERM, leaving it, if this user does not own it. */
int shm_remove(const char *name);
/* Remove every segment of this user whose name starts with prefix ("/strata-g-"). Returns how
 * many, or <0. Other users' files are left alone. */
int shm_remove_prefix(const char *prefix);
/* Count this user's segments whose name starts with prefix (tests and `strata status`). */
int shm_count_prefix(const char *prefix);
/* Remove every segment of this user that belongs to group: "/strata-<group>-<token>-..." (and
 * the names without a token that older builds used). Returns how many, or <0. */
int shm_remove_group(const char *group);

/* Check that run_dir may hold the group's sockets, state and tokens: a directory (lstat: not a
 * symbolic link) owned by this user that neither group nor others may write, below folders that
 * only root or this user may change (a folder others may write needs the sticky bit, as /tmp
 * has). 0, -ENOENT if it does not exist, else STRATA_EINVAL_INPUT with one line in eb naming the
 * folder and its owner or mode. */
int shm_check_run_dir(const char *run_dir, strata_errbuf_t *eb);
/* Node `node`'s namespace "<group>-<token>" into ns[cap], the token read from
 * run_dir/shm-<node>.token after shm_check_run_dir and the same checks on the file (O_NOFOLLOW,
 * owner, mode). -ENOENT while the node has no token; STRATA_EINVAL_INPUT (untrusted run dir or
 * token file), STRATA_EFORMAT (not a token) with eb set. */
int shm_ns_read(char *ns, size_t cap, const char *run_dir, const char *group, int node, strata_errbuf_t *eb);
/* Draw a new token for node (getrandom), write it to run_dir/shm-<node>.token (0600, through a
 * temporary file and rename, so a reader sees the old token or the new one) and put the new
 * namespace into ns. */
int shm_ns_new(char *ns, size_t cap, const char *run_dir, const char *group, int node, strata_errbuf_t *eb);
/* Remove node's token file. 0 if removed or absent. */
int shm_ns_remove(const char *run_dir, int node);
/* Payload start (base + header_bytes). */
static inline uint8_t *shm_payload(const shm_seg_t *s) { return s->base + SHM_HEADER_BYTES; }

#endif
