/* strata-prefetcher - owns one NUMA node's weight arena (store/arena.h).
 *
 * First the run dir: made 0700 if absent, and refused (exit 2) unless this user owns it and no
 * other may write it (shm_check_run_dir). The node's segments are named after a random token
 * kept there, RUN_DIR/shm-<N>.token (common/shm.h): "/strata-<group>-<token>-arena-<N>" and
 * "-ring-<N>". At start it looks for the arena the token names:
 *   - present, this user's and no one else's to write (shm_attach), complete and built from
 *     the same model files (layout hash + index): it takes ownership and serves it as is. This
 *     is the normal case after a crash or restart of the prefetcher: nothing is read from disk.
 *   - present but half-filled (its filler died) or built from other files: removed, rebuilt.
 *   - present but another user's, writable by others or a symlink (planted), or the ring's name
 *     is: refused and left alone (it is not ours to remove), rebuilt under a new token.
 *   - absent, or no token yet: rebuilt.
 * Rebuilding draws a new token first, so the arena is created (O_EXCL) at a name nobody could
 * have seen, bound to the node with mbind, filled from the model folder by threads that
 * inherit this process's pinning (the launcher pins it to the node's cpus), then published
 * (ready flag written last).
 * A virtual synthetic model folder (`strata synth --synthetic`: model/synth_fast.h) has only
 * sparse placeholders for its weight files; their bytes are generated into the arena instead
 * of read, so an 80 GB synthetic model needs no disk.
 * Then it serves the executor's CPU-expert jobs on its shm ring (xserve.h: the experts of its own
 * arena, computed on its cores), binds a ZeroMQ ROUTER socket at its endpoint and answers
 * "status" requests (proto/msg.h MSG_PF_STATUS).
 *
 * The arena deliberately outlives this process: a clean stop leaves it for the next start.
 * `strata up` removes it when the whole group stops; under systemd `--remove` drops it, the
 * ring and the token.
 *
 * Exit codes: 0 clean stop, 1 runtime failure (restart me), 2 bad config or usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <numa.h>
#include <unistd.h>
#include <zmq.h>

#include "store/arena.h"
#include "store/ring.h"
#include "common/config.h"
#include "common/notify.h"
#include "common/shm.h"
#include "kernels/cpu/threadpool.h"
#include "model/packed.h"
#include "model/synth_fast.h"
#include "proto/msg.h"
#include "proto/zmsg.h"
#include "services/prefetcher/xserve.h"

#define FILL_CHUNK (16u << 20) /* bytes per copy task */

static volatile sig_atomic_t s_stop;

static void s_on_signal(int sig)
{
    (void)sig;
    s_stop = 1;
}

typedef struct {
    const arena_plan_t *plan;
    shm_seg_t *seg;
    const synth_gen_t *gen;    /* virtual synthetic model (model/synth_fast.h): its generator, else NULL */
    int32_t *gen_file;         /* [n_files] the generator's index of each weight file, -1 = read from disk */
    int *fds;                  /* [n_files] open model files */
    int64_t *chunk_file;       /* [n_chunks] file index */
    uint64_t *chunk_off;       /* [n_chunks] offset in the file */
    int err;                   /* first error (-errno), atomic */
    int err_file;
} s_fill_t;

static void s_fill_chunk(void *ctx, int64_t i0, int64_t i1, int tid)
{
    s_fill_t *f = ctx;
    for (int64_t c = i0; c < i1; c++) {
        if (__atomic_load_n(&f->err, __ATOMIC_RELAXED)) return;
        int fi = (int)f->chunk_file[c];
        const arena_entry_t *e = &f->plan->files[fi];
        uint64_t off = f->chunk_off[c];
        uint64_t len = e->bytes - off < FILL_CHUNK ? e->bytes - off : FILL_CHUNK;
        uint8_t *dst = f->seg->base + e->offset + off;
        if (f->gen && f->gen_file[fi] >= 0) { /* the file on disk is a placeholder: generate its bytes */
            synth_gen_fill(f->gen, f->gen_file[fi], off, dst, (size_t)len);
            continue;
        }
        uint64_t done = 0;
        while (done < len) {
            ssize_t r = pread(f->fds[fi], dst + done, len - done, (off_t)(off + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) {
                int zero = 0;
                int e2 = r < 0 ? -errno : STRATA_EIO; /* r == 0: the file shrank */
                if (__atomic_compare_exchange_n(&f->err, &zero, e2, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) f->err_file = fi;
                return;
            }
            done += (uint64_t)r;
        }
        /* the bytes now live in the arena: do not keep a second copy in the page cache */
        (void)posix_fadvise(f->fds[fi], (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    }
}

/* A packed model's expert blocks that came from disk, checked against their crc32s in the
 * manifest (its image in seg) before anything computes on them: a damaged file fails the fill,
 * naming the block. The blocks of generated files are what the manifest describes by
 * construction. */
static int s_check_read(shm_seg_t *seg, const arena_plan_t *plan, const int32_t *gen_file, tpool_t *pool,
                        strata_errbuf_t *eb)
{
    const arena_entry_t *man = NULL;
    for (uint32_t i = 0; i < plan->n_files && !man; i++)
        if (!strcmp(plan->files[i].name, PACKED_MANIFEST)) man = &plan->files[i];
    if (!man) return 0; /* not a packed folder */
    packed_manifest_t pm;
    char where[600];
    snprintf(where, sizeof where, "%s/%s", plan->model_dir, PACKED_MANIFEST);
    int rc = packed_manifest_parse(&pm, (const char *)seg->base + man->offset, man->bytes, where, eb);
    if (rc < 0) return rc;
    const double t0 = strata_now();
    int checked = 0;
    for (uint32_t i = 0; i < plan->n_files && rc >= 0; i++) {
        if (gen_file[i] >= 0 || (plan->files[i].flags & ARENA_F_DISK)) continue; /* disk files: checked at each read */
        strata_errbuf_t beb = {{0}};
        if ((rc = packed_check_blocks(&pm, plan->files[i].name, seg->base + plan->files[i].offset, pool, &beb)) < 0)
            strata_seterr(eb, rc, "%s/%s", plan->model_dir, beb.msg);
        else checked += rc;
    }
    if (rc > 0) rc = 0;
    if (rc == 0 && checked)
        log_info("arena: %d expert blocks match their crc32s (%.1f ms)", checked, (strata_now() - t0) * 1e3);
    packed_manifest_free(&pm);
    return rc;
}

/* The expert slots of a tiered arena (plan->tiered), from its host budget. */
typedef struct {
    uint64_t budget;           /* resolved, bytes */
    uint64_t slot_bytes;
    uint32_t n_slots;
    int32_t n_disk;            /* expert blocks in the plan's disk files */
} s_slots_t;

/* Free memory of NUMA node numa_node (-1: of the machine). */
static uint64_t s_free_mem(int numa_node)
{
    long long fr = 0;
    if (numa_node >= 0 && numa_available() >= 0 && numa_node <= numa_max_node() && numa_node_size64(numa_node, &fr) > 0 && fr > 0)
        return (uint64_t)fr;
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

/* A plan's host budget in bytes: host_mem, or host_frac of numa_node's free memory now. */
static uint64_t s_budget(const arena_plan_t *plan, int numa_node)
{
    return plan->host_mem > 0 ? (uint64_t)plan->host_mem : (uint64_t)(plan->host_frac * (double)s_free_mem(numa_node));
}

/* Size the slots of a tiered plan: its budget (host_mem, or host_frac of the node's free memory
 * now), less the imaged files, in slots of the largest expert block of its disk files (from the
 * manifest on disk), at most one per such block. */
static int s_size_slots(const arena_plan_t *plan, int numa_node, s_slots_t *o, strata_errbuf_t *eb)
{
    memset(o, 0, sizeof *o);
    char path[1024], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", plan->model_dir, PACKED_MANIFEST);
    int rc = strata_read_file(path, 256u << 20, &text, &len, eb);
    if (rc < 0) return rc;
    packed_manifest_t pm;
    rc = packed_manifest_parse(&pm, text, len, path, eb);
    free(text);
    if (rc < 0) return rc;
    uint64_t max_block = 0;
    for (int32_t b = 0; b < pm.n_blocks; b++) {
        const char *fname = pm.files[pm.blocks[b].file].name;
        for (uint32_t i = 0; i < plan->n_files; i++)
            if ((plan->files[i].flags & ARENA_F_DISK) && !strcmp(plan->files[i].name, fname)) {
                o->n_disk++;
                if (pm.blocks[b].bytes > max_block) max_block = pm.blocks[b].bytes;
            }
    }
    packed_manifest_free(&pm);
    if (o->n_disk == 0 || max_block == 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: host_mem is set, but the manifest lists no expert block in %s's files",
                             plan->model_dir, "this arena");
    o->slot_bytes = (max_block + 4095) / 4096 * 4096;
    o->budget = s_budget(plan, numa_node);
    uint64_t fixed = plan->seg_bytes;
    if (o->budget < fixed + o->slot_bytes)
        return strata_seterr(eb, STRATA_EINVAL_INPUT,
                             "host_mem %.1f MiB%s is less than the resident tensors and metadata (%.1f MiB) plus one expert slot "
                             "(%.1f MiB)", o->budget / 1048576.0, plan->host_frac > 0 ? " (of free memory)" : "", fixed / 1048576.0,
                             o->slot_bytes / 1048576.0);
    uint64_t n = (o->budget - fixed) / o->slot_bytes;
    o->n_slots = (uint32_t)(n < (uint64_t)o->n_disk ? n : (uint64_t)o->n_disk);
    return 0;
}

/* Copy every planned file into seg and write the index (its slots from sl, tiered); ready is
 * published by the caller. */
static int s_fill(shm_seg_t *seg, const arena_plan_t *plan, const s_slots_t *sl, int threads, strata_errbuf_t *eb)
{
    int rc = 0;
    tpool_t *pool = NULL;
    s_fill_t f = {.plan = plan, .seg = seg};
    int64_t n_chunks = 0;
    synth_gen_t *gen = NULL;
    f.fds = malloc(sizeof(int) * (plan->n_files ? plan->n_files : 1));
    f.gen_file = malloc(sizeof(int32_t) * (plan->n_files ? plan->n_files : 1));
    if (!f.fds || !f.gen_file) {
        free(f.fds);
        free(f.gen_file);
        return STRATA_ENOMEM;
    }
    for (uint32_t i = 0; i < plan->n_files; i++) f.fds[i] = -1, f.gen_file[i] = -1;
    /* A virtual synthetic folder (`strata synth --synthetic`) holds sparse placeholders of its
     * weight files: their bytes are generated here, straight into the arena, from the folder's
     * config, manifest and seed, so a model of any size needs no disk. */
    if (synth_is_synthetic(plan->model_dir)) {
        bool virt = false;
        if ((rc = synth_dir_open(&gen, plan->model_dir, &virt, eb)) < 0) goto fail;
        if (!virt) {
            synth_gen_free(gen);
            gen = NULL;
        } else {
            if (plan->tiered) {
                rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                                   "%s is a virtual synthetic model: its expert files are placeholders, and a host budget "
                                   "(host_mem) reads experts from disk; write it with `strata synth` without --synthetic",
                                   plan->model_dir);
                goto fail;
            }
            for (uint32_t i = 0; i < plan->n_files; i++) f.gen_file[i] = synth_gen_file_index(gen, plan->files[i].name);
            f.gen = gen;
            log_info("%s is a virtual synthetic model: generating its weight files into the arena", plan->model_dir);
        }
    }
    for (uint32_t i = 0; i < plan->n_files; i++) {
        if (plan->files[i].flags & ARENA_F_DISK) continue; /* read into slots on demand (dtier.h) */
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", plan->model_dir, plan->files[i].name);
        f.fds[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (f.fds[i] < 0) {
            rc = strata_seterr(eb, -errno, "model file %s: %s", path, strerror(errno));
            goto fail;
        }
        struct stat st;
        if (fstat(f.fds[i], &st) < 0 || (uint64_t)st.st_size != plan->files[i].bytes) {
            rc = strata_seterr(eb, STRATA_EIO, "model file %s changed size while loading", path);
            goto fail;
        }
        n_chunks += (int64_t)((plan->files[i].bytes + FILL_CHUNK - 1) / FILL_CHUNK);
    }
    f.chunk_file = malloc(sizeof(int64_t) * (size_t)(n_chunks + 1));
    f.chunk_off = malloc(sizeof(uint64_t) * (size_t)(n_chunks + 1));
    if (!f.chunk_file || !f.chunk_off) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    int64_t c = 0;
    for (uint32_t i = 0; i < plan->n_files; i++)
        for (uint64_t off = 0; !(plan->files[i].flags & ARENA_F_DISK) && off < plan->files[i].bytes; off += FILL_CHUNK) {
            f.chunk_file[c] = i;
            f.chunk_off[c++] = off;
        }
    if (threads <= 0) {
        cpu_set_t set;
        threads = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    }
    if (threads > n_chunks) threads = (int)(n_chunks > 0 ? n_chunks : 1);
    if (threads > 1) pool = tpool_create(threads); /* NULL: runs inline */
    tpool_run(pool, n_chunks, 1, s_fill_chunk, &f);
    if (f.err) {
        rc = strata_seterr(eb, f.err, "reading %s/%s: %s", plan->model_dir, plan->files[f.err_file].name, strata_strerror(f.err));
        goto fail;
    }
    if ((rc = s_check_read(seg, plan, f.gen_file, pool, eb)) < 0) goto fail;
    arena_index_t *ix = (arena_index_t *)shm_payload(seg);
    memset(ix, 0, sizeof *ix);
    ix->magic = ARENA_MAGIC;
    ix->version = ARENA_VERSION;
    ix->n_files = plan->n_files;
    ix->part = plan->part;
    ix->parts = plan->parts;
    ix->node = plan->node;
    ix->data_bytes = plan->data_bytes;
    ix->disk_bytes = plan->disk_bytes;
    if (plan->tiered) {
        ix->host_budget = sl->budget;
        ix->slots_off = plan->seg_bytes;
        ix->slot_bytes = sl->slot_bytes;
        ix->n_slots = sl->n_slots;
    }
    snprintf(ix->model_dir, sizeof ix->model_dir, "%s", plan->model_dir);
    memcpy(ix->files, plan->files, sizeof(arena_entry_t) * plan->n_files);
fail:
    if (pool) tpool_destroy(pool);
    for (uint32_t i = 0; i < plan->n_files; i++)
        if (f.fds[i] >= 0) close(f.fds[i]);
    free(f.fds);
    free(f.gen_file);
    synth_gen_free(gen);
    free(f.chunk_file);
    free(f.chunk_off);
    return rc;
}

typedef struct {
    shm_seg_t seg;
    char ns[SHM_NS_MAX];       /* the node's namespace "<group>-<token>" (common/shm.h) */
    char name[SHM_NAME_MAX];   /* the arena's segment name */
    bool reattached;
    double fill_ms;
} s_arena_t;

/* Reattach the arena the node's token names if it passes every check and matches plan, else
 * build it under a new token. */
static int s_arena_open(s_arena_t *a, const strata_config_t *cfg, int node, const arena_plan_t *plan, int numa_node, int threads,
                        strata_errbuf_t *eb)
{
    int rc;
    strata_errbuf_t aeb = {{0}};
    memset(a, 0, sizeof *a);
    char ring[SHM_NAME_MAX];
    const char *name = a->name;
    rc = shm_ns_read(a->ns, sizeof a->ns, cfg->run_dir, cfg->name, node, eb);
    if (rc == -ENOENT) goto build;
    if (rc == STRATA_EFORMAT) { /* our own file, not a token: replace it */
        log_warn("%s; drawing a new token", eb->msg);
        goto build;
    }
    if (rc < 0) return rc;
    if (arena_shm_name(a->name, sizeof a->name, a->ns, node) < 0 || ring_shm_name(ring, sizeof ring, a->ns, node) < 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "group name '%s' too long for a segment name", cfg->name);
    /* the ring shares the token: if its name is refused, both move to a new token */
    if (shm_check_name(ring, &aeb) < 0) {
        log_warn("%s; left as it is: building the arena anew under a new name", aeb.msg);
        goto retire;
    }
    rc = shm_attach(&a->seg, a->name, plan->layout_hash, SHM_WRITE | SHM_ALLOW_NOT_READY, &aeb);
    if (rc == -EPERM) {
        /* not ours, or others may write it: nothing of it is used, and it is not ours to remove */
        log_warn("%s; left as it is: building the arena anew under a new name", aeb.msg);
        goto retire;
    }
    if (rc == 0) {
        bool ready = __atomic_load_n(&a->seg.hdr->ready, __ATOMIC_ACQUIRE) == 1u;
        if (ready && arena_check(&a->seg, plan, &aeb) == 0) {
            pid_t prev = a->seg.hdr->owner_pid;
            if (prev != getpid() && shm_owner_alive(&a->seg)) {
                /* another live prefetcher serves this arena: two instances for one node */
                shm_detach(&a->seg);
                return strata_seterr(eb, STRATA_EBUSY, "arena %s is owned by live pid %d (another prefetcher for this node?)", name, prev);
            }
            shm_take_ownership(&a->seg);
            a->reattached = true;
            log_info("arena %s: reattached (%zu bytes, %u files, previous owner pid %d); nothing read from disk", name, a->seg.size,
                     plan->n_files, prev);
            return 0;
        }
        if (!ready && shm_owner_alive(&a->seg) && a->seg.hdr->owner_pid != getpid()) {
            pid_t prev = a->seg.hdr->owner_pid;
            shm_detach(&a->seg);
            return strata_seterr(eb, STRATA_EBUSY, "arena %s is being filled by live pid %d", name, prev);
        }
        log_warn("arena %s: %s; rebuilding", name, ready ? aeb.msg : "left half-filled by a dead owner");
        shm_detach(&a->seg);
    } else if (rc != -ENOENT) {
        log_warn("arena %s: %s; rebuilding", name, aeb.msg);
    }
    if (rc != -ENOENT && (rc = shm_remove(name)) < 0) return strata_seterr(eb, rc, "shm_unlink(%s): %s", name, strata_strerror(rc));
retire:
    /* the old token's ring, if it is ours (a planted one stays: shm_remove leaves it) */
    (void)shm_remove(ring);
build:
    /* A new token before the segment exists: the name it creates was never visible, so nobody
     * can have put a file there first, and O_EXCL below refuses one that got there anyway. */
    if ((rc = shm_ns_new(a->ns, sizeof a->ns, cfg->run_dir, cfg->name, node, eb)) < 0) return rc;
    if (arena_shm_name(a->name, sizeof a->name, a->ns, node) < 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "group name '%s' too long for a segment name", cfg->name);
    double t0 = strata_now();
    s_slots_t sl = {0};
    if (plan->tiered) {
        if ((rc = s_size_slots(plan, numa_node, &sl, eb)) < 0) return rc;
        log_info("host budget %.1f MiB: %.1f MiB of resident tensors and metadata, %u expert slots of %.1f MiB for %d experts "
                 "(%.1f MiB) on disk", sl.budget / 1048576.0, plan->seg_bytes / 1048576.0, sl.n_slots, sl.slot_bytes / 1048576.0,
                 sl.n_disk, plan->disk_bytes / 1048576.0);
    }
    rc = shm_create(&a->seg, name, plan->seg_bytes + (uint64_t)sl.n_slots * sl.slot_bytes, plan->layout_hash, numa_node, eb);
    if (rc < 0) return rc;
    rc = s_fill(&a->seg, plan, &sl, threads, eb);
    if (rc < 0) {
        shm_detach(&a->seg);
        shm_remove(name);
        return rc;
    }
    shm_publish(&a->seg);
    a->fill_ms = (strata_now() - t0) * 1e3;
    log_info("arena %s: filled %.1f MiB (%u files) from %s in %.1f ms (%.2f GB/s), node %d", name, plan->data_bytes / 1048576.0,
             plan->n_files, plan->model_dir, a->fill_ms, a->fill_ms > 0 ? plan->data_bytes / (a->fill_ms * 1e6) : 0.0, numa_node);
    return 0;
}

static void s_usage(FILE *f)
{
    fprintf(f,
            "usage: strata-prefetcher --config FILE --node N [--remove]\n\n"
            "Owns NUMA node N's weight arena (shm /strata-<group>-<token>-arena-<N>, the token in\n"
            "RUN_DIR/shm-<N>.token): reattaches it if it survived and is this user's alone, else\n"
            "fills it from [group] model under a new token. Then it computes the executor's CPU experts\n"
            "whose weights lie in this arena on its cores ([prefetcher.N] threads), over the shm ring\n"
            "/strata-<group>-<token>-ring-<N>, and serves status on [prefetcher.N] endpoint.\n"
            "With [prefetcher.N] host_mem (bytes, or a fraction of the node's free memory) the arena holds\n"
            "the resident tensors and expert slots only, and the experts are read from the packed files\n"
            "on disk into the slots as jobs need them (io_uring), each block checked against its crc32.\n"
            "Reports READY=1 / WATCHDOG=1 / STOPPING=1 through sd_notify (NOTIFY_SOCKET).\n\n"
            "  --config FILE   group config (INI)\n"
            "  --node N        which [prefetcher.N] section this process is\n"
            "  --remove        remove this node's arena and ring segments and its token, and exit\n"
            "  --help          this text\n\n"
            "Exit codes: 0 clean stop, 1 runtime failure, 2 bad config or usage.\n");
}

/* The disk tier's counters into st (zeros without a host budget). */
static void s_disk_status(const xserve_t *xs, msg_pf_status_t *st)
{
    dtier_stats_t d;
    xserve_disk_stats(xs, &d);
    st->slots = (int32_t)d.n_slots;
    st->slot_bytes = d.slot_bytes;
    st->experts_disk = d.experts;
    st->experts_host = d.resident;
    st->host_hits = d.hits;
    st->host_misses = d.misses;
    st->disk_bytes = d.disk_bytes;
    st->disk_s = d.disk_s;
    st->disk_errors = d.errors;
    st->read_ahead = d.ahead_reads;
    st->read_ahead_used = d.ahead_used;
}

/* Answer one request on the ROUTER socket: frames [routing id][message]. */
static void s_serve_one(void *sock, const msg_pf_status_t *st, msg_buf_t *b)
{
    zmq_msg_t id, body;
    zmq_msg_init(&id);
    zmq_msg_init(&body);
    if (zmq_msg_recv(&id, sock, ZMQ_DONTWAIT) < 0) goto out;
    if (!zmq_msg_more(&id)) goto out; /* ROUTER always prefixes an id frame; nothing else came */
    if (zmq_msg_recv(&body, sock, 0) < 0) goto out;
    if (zmq_msg_more(&body)) { /* extra frames: drain them, then refuse the message */
        int more = 1;
        while (more) {
            zmq_msg_t x;
            zmq_msg_init(&x);
            more = zmq_msg_recv(&x, sock, 0) >= 0 && zmq_msg_more(&x);
            zmq_msg_close(&x);
        }
        zmsg_send_error(sock, zmq_msg_data(&id), zmq_msg_size(&id), MSG_ERROR, false, 0, MSG_E_MALFORMED,
                        "one frame per message", b, ZMQ_DONTWAIT);
        goto out;
    }
    msg_t m;
    msg_err_t err;
    int rc = msg_decode(MSG_FAM_PF_IN, zmq_msg_data(&body), zmq_msg_size(&body), &m, &err);
    if (rc < 0) {
        zmsg_send_error(sock, zmq_msg_data(&id), zmq_msg_size(&id), MSG_ERROR, m.has_id, m.id, err.code, err.text, b, ZMQ_DONTWAIT);
        msg_free(&m);
        goto out;
    }
    if (m.type == MSG_PF_STATUS) {
        msg_t r;
        msg_init(&r, MSG_PF_STATUS_REPLY);
        r.has_id = m.has_id;
        r.id = m.id;
        r.u.pf_status = *st;
        zmsg_send(sock, zmq_msg_data(&id), zmq_msg_size(&id), &r, b, ZMQ_DONTWAIT);
    } else {
        zmsg_send_error(sock, zmq_msg_data(&id), zmq_msg_size(&id), MSG_ERROR, m.has_id, m.id, MSG_E_UNKNOWN_TYPE,
                        "the prefetcher serves only status", b, ZMQ_DONTWAIT);
    }
    msg_free(&m);
out:
    zmq_msg_close(&id);
    zmq_msg_close(&body);
}

int main(int argc, char **argv)
{
    const char *config_path = NULL;
    int node = -1;
    bool remove = false;
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"node", required_argument, 0, 'n'},
        {"remove", no_argument, 0, 'r'},       {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "c:n:rh", opts, NULL)) != -1) {
        switch (o) {
        case 'c': config_path = optarg; break;
        case 'n': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v < 0 || v > 1023) {
                fprintf(stderr, "strata-prefetcher: --node '%s' is not a node number\n", optarg);
                return 2;
            }
            node = (int)v;
            break;
        }
        case 'r': remove = true; break;
        case 'h': s_usage(stdout); return 0;
        default: s_usage(stderr); return 2;
        }
    }
    if (!config_path || node < 0 || optind != argc) {
        s_usage(stderr);
        return 2;
    }
    static char role[32];
    snprintf(role, sizeof role, "prefetcher.%d", node);
    log_set_role(role);

    strata_config_t *cfg = malloc(sizeof *cfg);
    arena_plan_t *plan = malloc(sizeof *plan);
    if (!cfg || !plan) return 1;
    strata_errbuf_t eb = {{0}};
    if (config_load(cfg, config_path, &eb) < 0) {
        log_error("%s", eb.msg);
        return 2;
    }
    int part = -1;
    for (int i = 0; i < cfg->n_prefetchers; i++)
        if (cfg->prefetcher[i].node == node) part = i;
    if (part < 0) {
        log_error("%s: no [prefetcher.%d] section (the config's prefetchers are its NUMA nodes)", config_path, node);
        return 2;
    }
    /* The run dir holds the token that names this node's segments, and the ipc socket. The
     * launcher makes it; under systemd RuntimeDirectory= does; by hand, this does. One that
     * another user owns or may write is refused: whoever may write it chooses our names. */
    if (mkdir(cfg->run_dir, 0700) < 0 && errno != EEXIST) {
        log_error("%s: [group] run_dir %s: %s", config_path, cfg->run_dir, strerror(errno));
        return 2;
    }
    if (shm_check_run_dir(cfg->run_dir, &eb) < 0) {
        log_error("%s: [group] run_dir: %s", config_path, eb.msg);
        return 2;
    }
    if (remove) {
        char ns[SHM_NS_MAX], name[SHM_NAME_MAX];
        int r = shm_ns_read(ns, sizeof ns, cfg->run_dir, cfg->name, node, &eb);
        if (r == -ENOENT) {
            log_info("node %d has no token in %s: no arena to remove", node, cfg->run_dir);
            return 0;
        }
        if (r < 0) {
            log_error("%s", eb.msg);
            return 2;
        }
        for (int k = 0; k < 2 && r >= 0; k++) {
            if (k == 0) arena_shm_name(name, sizeof name, ns, node);
            else ring_shm_name(name, sizeof name, ns, node);
            if ((r = shm_remove(name)) < 0) log_error("shm_unlink(%s): %s", name, strata_strerror(r));
            else log_info("%s removed", name);
        }
        if (r >= 0) r = shm_ns_remove(cfg->run_dir, node);
        return r < 0 ? 1 : 0;
    }

    struct sigaction sa = {.sa_handler = s_on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = arena_plan(plan, cfg->model, part, cfg->n_prefetchers, node, cfg->prefetcher[part].host_mem,
                        cfg->prefetcher[part].host_mem_frac, &eb);
    if (rc < 0) {
        log_error("%s: [group] model: %s", config_path, eb.msg);
        return 2;
    }
    if ((plan->host_mem > 0 || plan->host_frac > 0) && !plan->tiered) {
        /* a budget with no expert file to leave on disk: the whole folder must fit it */
        double budget = (double)s_budget(plan, cfg->prefetcher[part].place.numa_node);
        if ((double)plan->seg_bytes > budget) {
            log_error("%s: [prefetcher.%d] host_mem: the arena needs %.1f MiB, over the budget of %.1f MiB, and %s has no "
                      "expert file (experts-*.bin) that the disk tier could leave on disk: pack it with `strata pack`",
                      config_path, node, plan->seg_bytes / 1048576.0, budget / 1048576.0, plan->model_dir);
            return 2;
        }
        log_info("host budget %.1f MiB holds all of this arena's %.1f MiB: no disk tier", budget / 1048576.0,
                 plan->seg_bytes / 1048576.0);
    }
    s_arena_t arena;
    rc = s_arena_open(&arena, cfg, node, plan, cfg->prefetcher[part].place.numa_node, cfg->prefetcher[part].threads, &eb);
    if (rc < 0) {
        log_error("%s", eb.msg);
        /* a virtual synthetic model whose marker, config or manifest is bad will not get better */
        return rc == STRATA_EINVAL_INPUT || rc == STRATA_EVERSION || rc == STRATA_EFORMAT ? 2 : 1;
    }
    const char *name = arena.name;

    /* xserve names its ring after the config's group name (ring_shm_name): it gets a copy whose
     * name is this node's namespace, so the ring lives under the arena's token */
    strata_config_t *xcfg = malloc(sizeof *xcfg);
    if (!xcfg) return 1;
    *xcfg = *cfg;
    snprintf(xcfg->name, sizeof xcfg->name, "%s", arena.ns);
    xserve_t *xs = NULL;
    rc = xserve_start(&xs, xcfg, part, &arena.seg, cfg->prefetcher[part].threads, &eb);
    free(xcfg);
    if (rc < 0) {
        log_error("cpu experts: %s", eb.msg);
        shm_detach(&arena.seg);
        return rc == STRATA_EINVAL_INPUT || rc == STRATA_EFORMAT ? 2 : 1;
    }

    int exit_code = 0;
    void *ctx = zmq_ctx_new();
    void *sock = ctx ? zmq_socket(ctx, ZMQ_ROUTER) : NULL;
    int zero = 0;
    if (!sock || zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) < 0 || zmq_bind(sock, cfg->prefetcher[part].endpoint) < 0) {
        log_error("bind %s: %s", cfg->prefetcher[part].endpoint, zmq_strerror(zmq_errno()));
        exit_code = 1;
        goto out;
    }
    uint64_t instance = 0;
    if (getrandom(&instance, sizeof instance, 0) != sizeof instance) instance = strata_now_ns() ^ (uint64_t)getpid();
    msg_pf_status_t st = {
        .node = node,
        .arena = msg_str(name),
        .bytes = arena.seg.size,
        .state = msg_str("ready"),
        .fill_ms = arena.fill_ms,
        .reattached = arena.reattached,
        .pid = (int32_t)getpid(),
        .instance = instance,
        .host_budget = ((const arena_index_t *)shm_payload(&arena.seg))->host_budget,
    };
    msg_buf_t b = {0};
    notify_status("arena %s %s, %zu bytes", name, arena.reattached ? "reattached" : "filled", arena.seg.size);
    notify_ready();
    log_info("ready: serving %s on %s", name, cfg->prefetcher[part].endpoint);
    while (!s_stop) {
        zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
        int n = zmq_poll(&it, 1, 200);
        if (n < 0 && zmq_errno() != EINTR) {
            log_error("zmq_poll: %s", zmq_strerror(zmq_errno()));
            exit_code = 1;
            break;
        }
        if (n > 0 && (it.revents & ZMQ_POLLIN))
            for (int k = 0; k < 64 && !s_stop; k++) {
                int ev = 0;
                size_t evl = sizeof ev;
                if (zmq_getsockopt(sock, ZMQ_EVENTS, &ev, &evl) < 0 || !(ev & ZMQ_POLLIN)) break;
                s_disk_status(xs, &st);
                s_serve_one(sock, &st, &b);
            }
        notify_watchdog();
    }
    notify_stopping();
    log_info("stopping (arena %s stays for the next start)", name);
    msg_buf_free(&b);
out:
    xserve_stop(xs);
    if (sock) zmq_close(sock);
    if (ctx) zmq_ctx_term(ctx);
    /* libzmq removes a bound ipc socket file when the socket closes cleanly; make sure ours is
     * gone even if it did not (after a crash the next bind or the launcher's clean-up does it) */
    if (!strncmp(cfg->prefetcher[part].endpoint, "ipc://", 6)) unlink(cfg->prefetcher[part].endpoint + 6);
    shm_detach(&arena.seg);
    free(plan);
    free(cfg);
    return exit_code;
}
