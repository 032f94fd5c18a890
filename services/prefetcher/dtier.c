/* dtier.c - expert blocks from disk into the arena's slots (see dtier.h). */
#include "services/prefetcher/dtier.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/arena.h"

#define QD 64                 /* io_uring entries: reads in flight at once */
#define AHEAD_MAX (QD / 2)    /* read-ahead reads in flight at most */
#define HINT_BIT (1ull << 63) /* a completion's user data: a read-ahead into slot (low bits), else a fetch's read */
#define DIO_ALIGN 4096u       /* O_DIRECT offset, length and buffer alignment */

struct dtier {
    const model_t *m;
    const packed_manifest_t *pm;
    const unsigned char *const *bases; /* [pm->n_files] (model_load_arenas) */
    char model_dir[512];
    uint8_t *slots;
    uint32_t n_slots;
    uint64_t slot_bytes;
    int32_t n_layers, n_experts;
    int32_t *blk;             /* [n_layers][n_experts] block index in pm, -1: not a disk expert here */
    int32_t *map;             /* [n_layers][n_experts] slot, -1: on disk only */
    uint32_t *freq;           /* [n_layers][n_experts] fetches, halved every 65536 fetches */
    int32_t *key;             /* [n_slots] the expert it holds (l * n_experts + e), -1: empty */
    uint64_t *last;           /* [n_slots] tick of its last use */
    uint64_t *pin;            /* [n_slots] the fetch that uses it: not evicted by that fetch */
    bool *inflight;           /* [n_slots] a read-ahead is filling it (key and map already say whose) */
    bool *ahead;              /* [n_slots] filled by a read-ahead and not fetched since */
    int n_inflight;
    uint64_t tick;            /* fetches so far */
    int *fd, *fdd;            /* [pm->n_files] buffered, O_DIRECT (-1: none) */
    struct io_uring ring;
    bool uring;
    int32_t *rd_slot, *rd_blk, *rd_key; /* [n_slots] one fetch's reads */
    int64_t *rd_got;
    dtier_stats_t st;         /* counters: written by the ring thread with atomic stores */
    uint64_t disk_ns;         /* st.disk_s, counted in ns */
    uint64_t resident;        /* st.resident */
};

static void s_add(uint64_t *c, uint64_t v) { __atomic_store_n(c, __atomic_load_n(c, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED); }

/* pread until n bytes or end of file: bytes read, or -errno. */
static int64_t s_pread_full(int fd, uint8_t *dst, uint64_t n, uint64_t off)
{
    uint64_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, dst + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) break;
        done += (uint64_t)r;
    }
    return (int64_t)done;
}

static bool s_direct(const dtier_t *t, const packed_block_t *b) { return t->fdd[b->file] >= 0 && b->offset % DIO_ALIGN == 0; }

static uint8_t *s_slot(const dtier_t *t, int32_t s) { return t->slots + (uint64_t)s * t->slot_bytes; }

/* Queue the read of block b into slot s on sqe, tagged ud: O_DIRECT (the length rounded up to
 * DIO_ALIGN, which the slot has room for) where the file and the offset allow it. */
static void s_prep_read(const dtier_t *t, struct io_uring_sqe *sqe, const packed_block_t *b, int32_t s, uint64_t ud)
{
    const bool d = s_direct(t, b);
    const uint64_t len = d ? (b->bytes + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN : b->bytes;
    io_uring_prep_read(sqe, d ? t->fdd[b->file] : t->fd[b->file], s_slot(t, s), (unsigned)len, b->offset);
    io_uring_sqe_set_data64(sqe, ud);
}

/* Empty slot s: the expert it held is on disk only again. */
static void s_evict(dtier_t *t, int32_t s)
{
    if (t->key[s] < 0) return;
    t->map[t->key[s]] = -1;
    t->key[s] = -1;
    s_add(&t->resident, (uint64_t)-1);
}

/* Slot s now holds expert key (its block read and checked). */
static void s_install(dtier_t *t, int32_t s, int32_t key)
{
    t->key[s] = key;
    t->map[key] = s;
    s_add(&t->resident, 1);
}

/* A read-ahead into slot s ended with res (bytes or -errno): the slot holds its expert if the
 * bytes came back whole and match their crc32, else it is empty again (a fetch that needs the
 * expert reads it itself, and reports what fails). */
static void s_ahead_done(dtier_t *t, uint32_t s, int res)
{
    t->inflight[s] = false;
    t->n_inflight--;
    int32_t key = t->key[s];
    const packed_block_t *b = &t->pm->blocks[t->blk[key]];
    if (res > 0) s_add(&t->st.disk_bytes, (uint64_t)res);
    if (res >= 0 && (uint64_t)res >= b->bytes && packed_check_block(b, "", s_slot(t, (int32_t)s), NULL) == 0) {
        t->ahead[s] = true;
        s_add(&t->resident, 1);
        return;
    }
    t->map[key] = -1;
    t->key[s] = -1;
}

/* Completed read-aheads: every one that has ended (wait_slot < 0), or until slot wait_slot's has
 * (blocking), then those that have ended too. */
static void s_reap(dtier_t *t, int32_t wait_slot)
{
    while (t->n_inflight > 0) {
        struct io_uring_cqe *cqe;
        bool block = wait_slot >= 0 && t->inflight[wait_slot];
        int r = block ? io_uring_wait_cqe(&t->ring, &cqe) : io_uring_peek_cqe(&t->ring, &cqe);
        if (r < 0) {
            if (block) { /* cannot happen with reads in flight; do not spin on it */
                log_error("disk tier: waiting for a read-ahead: %s", strerror(-r));
                t->inflight[wait_slot] = false;
                t->n_inflight--;
                t->map[t->key[wait_slot]] = -1;
                t->key[wait_slot] = -1;
                continue;
            }
            return;
        }
        uint64_t ud = io_uring_cqe_get_data64(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&t->ring, cqe);
        if (ud & HINT_BIT) s_ahead_done(t, (uint32_t)ud, res);
    }
}

/* The k reads of rd_*: through io_uring where it is up, else pread; rd_got[i] = bytes or -errno. */
static void s_read_raw(dtier_t *t, int k)
{
    int i = 0;
    while (t->uring && i < k) {
        int n = 0;
        for (; i + n < k && n < QD; n++) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
            if (!sqe) break;
            s_prep_read(t, sqe, &t->pm->blocks[t->rd_blk[i + n]], t->rd_slot[i + n], (uint64_t)(i + n));
        }
        int sub = io_uring_submit_and_wait(&t->ring, (unsigned)n);
        if (sub < n) { /* could not submit: what did not go in is read by pread below */
            for (int j = sub > 0 ? sub : 0; j < n; j++) t->rd_got[i + j] = INT64_MIN;
            if (sub <= 0) {
                log_warn("disk tier: io_uring submit failed (%s); reading with pread from now on", strerror(-sub));
                io_uring_queue_exit(&t->ring);
                t->uring = false;
                t->st.uring = 0;
                break;
            }
        }
        for (int got = 0; got < (sub > 0 ? sub : 0);) {
            struct io_uring_cqe *cqe;
            if (io_uring_wait_cqe(&t->ring, &cqe) < 0) break;
            uint64_t ud = io_uring_cqe_get_data64(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&t->ring, cqe);
            if (ud & HINT_BIT) { /* a read-ahead that ended meanwhile */
                s_ahead_done(t, (uint32_t)ud, res);
                continue;
            }
            t->rd_got[ud] = res;
            got++;
        }
        i += n;
    }
    for (int j = 0; j < k; j++) {
        if (t->uring && t->rd_got[j] != INT64_MIN) continue;
        const packed_block_t *b = &t->pm->blocks[t->rd_blk[j]];
        t->rd_got[j] = s_pread_full(t->fd[b->file], s_slot(t, t->rd_slot[j]), b->bytes, b->offset);
    }
}

/* Read blocks rd_blk[0..k) into slots rd_slot[], checked: ok[i] set for the good ones. 0, or the
 * first failure (after its retry), with eb naming it; every failure is logged. */
static int s_read(dtier_t *t, int k, bool *ok, strata_errbuf_t *eb)
{
    int rc = 0;
    double t0 = strata_now();
    for (int i = 0; i < k; i++) t->rd_got[i] = INT64_MIN;
    s_read_raw(t, k);
    uint64_t bytes = 0;
    for (int i = 0; i < k; i++) {
        const packed_block_t *b = &t->pm->blocks[t->rd_blk[i]];
        uint8_t *dst = s_slot(t, t->rd_slot[i]);
        const char *where = t->pm->files[b->file].name; /* short: the error travels to the client */
        strata_errbuf_t feb = {{0}};
        int64_t got = t->rd_got[i];
        int frc = 0;
        for (int attempt = 0; attempt < 2; attempt++) {
            if (attempt == 1) { /* once more, past the page cache's copy */
                (void)posix_fadvise(t->fd[b->file], (off_t)b->offset, (off_t)b->bytes, POSIX_FADV_DONTNEED);
                got = s_pread_full(t->fd[b->file], dst, b->bytes, b->offset);
            }
            if (got < 0)
                frc = strata_seterr(&feb, STRATA_EIO, "%s: reading the block of layer %d expert %d at offset %" PRIu64 ": %s", where,
                                    b->layer, b->expert, b->offset, strerror((int)-got));
            else if ((uint64_t)got < b->bytes)
                frc = strata_seterr(&feb, STRATA_EIO,
                                    "%s: the block of layer %d expert %d at offset %" PRIu64 " (%" PRIu64 " bytes) came back "
                                    "with %" PRId64 " bytes: the file ends early (truncated?)",
                                    where, b->layer, b->expert, b->offset, b->bytes, got);
            else
                frc = packed_check_block(b, where, dst, &feb);
            if (frc == 0) break;
        }
        if (frc == 0) {
            ok[i] = true;
            bytes += b->bytes;
            continue;
        }
        ok[i] = false;
        s_add(&t->st.errors, 1);
        log_error("disk tier: %s (in %s)", feb.msg, t->model_dir);
        if (rc == 0) {
            rc = frc;
            strata_seterr(eb, frc, "%s", feb.msg);
        }
    }
    s_add(&t->st.disk_bytes, bytes);
    s_add(&t->disk_ns, (uint64_t)((strata_now() - t0) * 1e9));
    return rc;
}

/* An evictable slot for fetch `pin`: empty first; then one not used in about a step (n_layers
 * fetches), the least used expert; then (unless cold_only: a read-ahead takes no slot in use) the
 * least used of the rest. Never one the fetch uses or a read-ahead is filling. -1 if none. */
static int32_t s_victim(const dtier_t *t, uint64_t pin, bool cold_only)
{
    int32_t best = -1;
    bool best_recent = true;
    uint32_t best_f = UINT32_MAX;
    for (uint32_t s = 0; s < t->n_slots; s++) {
        if (t->pin[s] == pin || t->inflight[s]) continue;
        if (t->key[s] < 0) return (int32_t)s;
        bool recent = t->tick - t->last[s] < (uint64_t)t->n_layers;
        if (recent && cold_only) continue;
        uint32_t f = t->freq[t->key[s]];
        if (best < 0 || (best_recent && !recent) || (recent == best_recent && f < best_f)) {
            best = (int32_t)s;
            best_recent = recent;
            best_f = f;
        }
    }
    return best;
}

static void s_view(const qmat_t *q, const uint8_t *base, const packed_block_t *b, const uint8_t *slot, qmat_t *o)
{
    *o = *q;
    o->data = slot + ((const uint8_t *)q->data - base - b->offset);
    if (q->scales) o->scales = slot + ((const uint8_t *)q->scales - base - b->offset);
}

/* A tensor of the expert lies inside its block: [p, p + bytes) within [offset, offset + bytes). */
static bool s_inside(const void *p, size_t bytes, const uint8_t *base, const packed_block_t *b)
{
    if (!p) return bytes == 0;
    uint64_t off = (uint64_t)((const uint8_t *)p - base);
    return off >= b->offset && off + bytes <= b->offset + b->bytes;
}

static bool s_expert_inside(const ffn_t *E, const uint8_t *base, const packed_block_t *b)
{
    const qmat_t *q[3] = {&E->gate, &E->up, &E->down};
    for (int i = 0; i < 3; i++) {
        if (!s_inside(q[i]->data, qmat_data_bytes(q[i]->fmt, q[i]->rows, q[i]->cols), base, b)) return false;
        size_t sb = qmat_scale_bytes(q[i]->fmt, q[i]->rows, q[i]->cols, q[i]->group);
        if (sb && !s_inside(q[i]->scales, sb, base, b)) return false;
    }
    return true;
}

int dtier_open(dtier_t **out, const shm_seg_t *arena, const model_t *m, const packed_manifest_t *pm,
               const unsigned char *const *bases, const char *model_dir, strata_errbuf_t *eb)
{
    int rc = 0;
    *out = NULL;
    const arena_index_t *ix = (const arena_index_t *)shm_payload(arena);
    dtier_t *t = calloc(1, sizeof *t);
    if (!t) return STRATA_ENOMEM;
    t->m = m;
    t->pm = pm;
    t->bases = bases;
    snprintf(t->model_dir, sizeof t->model_dir, "%s", model_dir);
    t->slots = arena->base + ix->slots_off;
    t->n_slots = ix->n_slots;
    t->slot_bytes = ix->slot_bytes;
    t->n_layers = m->cfg.n_layers;
    t->n_experts = m->cfg.n_experts;
    size_t ne = (size_t)t->n_layers * (size_t)(t->n_experts > 0 ? t->n_experts : 1), nf = (size_t)(pm->n_files > 0 ? pm->n_files : 1);
    t->blk = malloc(ne * sizeof *t->blk);
    t->map = malloc(ne * sizeof *t->map);
    t->freq = calloc(ne, sizeof *t->freq);
    t->key = malloc(t->n_slots * sizeof *t->key);
    t->last = calloc(t->n_slots, sizeof *t->last);
    t->pin = calloc(t->n_slots, sizeof *t->pin);
    t->inflight = calloc(t->n_slots, sizeof *t->inflight);
    t->ahead = calloc(t->n_slots, sizeof *t->ahead);
    t->fd = malloc(nf * sizeof *t->fd);
    t->fdd = malloc(nf * sizeof *t->fdd);
    t->rd_slot = malloc(t->n_slots * sizeof *t->rd_slot);
    t->rd_blk = malloc(t->n_slots * sizeof *t->rd_blk);
    t->rd_key = malloc(t->n_slots * sizeof *t->rd_key);
    t->rd_got = malloc(t->n_slots * sizeof *t->rd_got);
    if (!t->blk || !t->map || !t->freq || !t->key || !t->last || !t->pin || !t->inflight || !t->ahead || !t->fd || !t->fdd || !t->rd_slot || !t->rd_blk ||
        !t->rd_key || !t->rd_got) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < ne; i++) t->blk[i] = t->map[i] = -1;
    for (uint32_t s = 0; s < t->n_slots; s++) t->key[s] = -1;
    for (size_t i = 0; i < nf; i++) t->fd[i] = t->fdd[i] = -1;
    t->st.n_slots = t->n_slots;
    t->st.slot_bytes = t->slot_bytes;
    for (int32_t i = 0; i < pm->n_files; i++) {
        bool disk = false;
        for (uint32_t j = 0; j < ix->n_files && !disk; j++)
            disk = (ix->files[j].flags & ARENA_F_DISK) && !strcmp(ix->files[j].name, pm->files[i].name);
        if (!disk) continue;
        char path[1100];
        snprintf(path, sizeof path, "%s/%s", model_dir, pm->files[i].name);
        if ((t->fd[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
            rc = strata_seterr(eb, -errno, "disk tier: %s: %s", path, strerror(errno));
            goto fail;
        }
        t->fdd[i] = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT); /* -1 where the file system has no O_DIRECT (tmpfs) */
    }
    for (int32_t bi = 0; bi < pm->n_blocks; bi++) {
        const packed_block_t *b = &pm->blocks[bi];
        if (t->fd[b->file] < 0 || b->layer < 0 || b->layer >= t->n_layers || b->expert < 0 || b->expert >= t->n_experts ||
            !m->cfg.layer_sparse[b->layer])
            continue;
        if (b->bytes > t->slot_bytes) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "disk tier: the block of layer %d expert %d is %" PRIu64 " bytes, a slot %" PRIu64,
                               b->layer, b->expert, b->bytes, t->slot_bytes);
            goto fail;
        }
        if (!s_expert_inside(&m->layers[b->layer].experts[b->expert], bases[b->file], b)) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "disk tier: %s: the tensors of layer %d expert %d are not inside its block",
                               pm->files[b->file].name, b->layer, b->expert);
            goto fail;
        }
        t->blk[(size_t)b->layer * t->n_experts + b->expert] = bi;
        t->st.experts++;
    }
    int urc = io_uring_queue_init(QD, &t->ring, 0);
    t->uring = urc == 0;
    t->st.uring = t->uring;
    if (!t->uring) log_warn("disk tier: io_uring unavailable (%s); reading with pread", strerror(-urc));
    *out = t;
    return 0;
fail:
    dtier_close(t);
    return rc;
}

bool dtier_holds(const dtier_t *t, int l, int e)
{
    return t && l >= 0 && l < t->n_layers && e >= 0 && e < t->n_experts && t->blk[(size_t)l * t->n_experts + e] >= 0;
}

int dtier_slots(const dtier_t *t) { return t ? (int)t->n_slots : 0; }

/* A slot a read-ahead is filling (there is one). */
static int32_t s_any_inflight(const dtier_t *t)
{
    for (uint32_t s = 0; s < t->n_slots; s++)
        if (t->inflight[s]) return (int32_t)s;
    return -1;
}

int dtier_fetch(dtier_t *t, int l, const int32_t *experts, int n, ffn_t *out, strata_errbuf_t *eb)
{
    const uint64_t pin = ++t->tick;
    if ((t->tick & 0xffff) == 0) /* frequency decays: old habits fade */
        for (size_t i = 0; i < (size_t)t->n_layers * t->n_experts; i++) t->freq[i] >>= 1;
    STRATA_ASSERT(n >= 0 && (uint32_t)n <= t->n_slots);
    if (t->uring) s_reap(t, -1);
    int k = 0;
    for (int i = 0; i < n; i++) {
        int32_t key = l * t->n_experts + experts[i];
        STRATA_ASSERT(dtier_holds(t, l, experts[i]));
        if (t->freq[key] < UINT32_MAX) t->freq[key]++;
        int32_t s = t->map[key];
        if (s >= 0 && t->inflight[s]) {
            s_reap(t, s); /* read ahead and still on its way: wait for it */
            s = t->map[key]; /* -1 if it failed */
        }
        if (s >= 0) {
            t->pin[s] = pin;
            t->last[s] = pin;
            if (t->ahead[s]) s_add(&t->st.ahead_used, 1);
            t->ahead[s] = false;
            continue;
        }
        while ((s = s_victim(t, pin, false)) < 0 && t->n_inflight > 0) s_reap(t, s_any_inflight(t));
        STRATA_ASSERT(s >= 0); /* n <= n_slots, and the experts are distinct */
        s_evict(t, s); /* empty until its read checks out */
        t->ahead[s] = false;
        t->pin[s] = pin;
        t->rd_slot[k] = s;
        t->rd_blk[k] = t->blk[key];
        t->rd_key[k++] = key;
    }
    s_add(&t->st.hits, (uint64_t)(n - k));
    s_add(&t->st.misses, (uint64_t)k);
    int rc = 0;
    if (k) {
        bool ok[k];
        rc = s_read(t, k, ok, eb);
        for (int i = 0; i < k; i++) {
            if (!ok[i]) continue;
            s_install(t, t->rd_slot[i], t->rd_key[i]);
            t->last[t->rd_slot[i]] = pin;
        }
    }
    if (rc < 0) return rc;
    for (int i = 0; i < n; i++) {
        int32_t key = l * t->n_experts + experts[i];
        const packed_block_t *b = &t->pm->blocks[t->blk[key]];
        const uint8_t *slot = s_slot(t, t->map[key]);
        const ffn_t *E = &t->m->layers[l].experts[experts[i]];
        const uint8_t *base = t->bases[b->file];
        s_view(&E->gate, base, b, slot, &out[i].gate);
        s_view(&E->up, base, b, slot, &out[i].up);
        s_view(&E->down, base, b, slot, &out[i].down);
    }
    return 0;
}

int dtier_ahead(dtier_t *t, const ring_hint_t *h, int n, bool cold_only)
{
    if (!t || !t->uring) return 0;
    s_reap(t, -1);
    int issued = 0;
    for (int i = 0; i < n && t->n_inflight < AHEAD_MAX; i++) {
        if (!dtier_holds(t, h[i].layer, h[i].expert)) continue;
        int32_t key = h[i].layer * t->n_experts + h[i].expert;
        if (t->map[key] >= 0) continue; /* in a slot, or on its way */
        int32_t s = s_victim(t, t->tick, cold_only);
        if (s < 0) break; /* every slot is in use, or being filled */
        struct io_uring_sqe *sqe = io_uring_get_sqe(&t->ring);
        if (!sqe) break;
        s_evict(t, s);
        s_prep_read(t, sqe, &t->pm->blocks[t->blk[key]], s, HINT_BIT | (uint64_t)s);
        t->key[s] = key; /* counted resident once its read checks out (s_ahead_done) */
        t->map[key] = s;
        t->pin[s] = t->tick; /* the later hints of this batch leave it */
        t->last[s] = t->tick;
        t->inflight[s] = true;
        t->ahead[s] = false;
        t->n_inflight++;
        issued++;
    }
    if (issued) {
        int r = io_uring_submit(&t->ring);
        if (r < 0) log_warn("disk tier: read-ahead submit: %s", strerror(-r)); /* the reads stay queued for the next submit */
        s_add(&t->st.ahead_reads, (uint64_t)issued);
    }
    return issued;
}

int dtier_prefill(dtier_t *t)
{
    if (!t) return 0;
    int filled = 0;
    uint32_t s = 0;
    double t0 = strata_now(), t_log = t0;
    for (int32_t key = 0; key < t->n_layers * t->n_experts && s < t->n_slots;) {
        if (strata_now() - t_log > 5) { /* a large budget takes a while: say how far it got */
            t_log = strata_now();
            log_info("disk tier: filled %d of %u slots (%.1f s)", filled, t->n_slots, t_log - t0);
        }
        int k = 0;
        for (; key < t->n_layers * t->n_experts && s < t->n_slots && k < QD; key++) {
            if (t->blk[key] < 0 || t->map[key] >= 0) continue;
            while (s < t->n_slots && t->key[s] >= 0) s++;
            if (s == t->n_slots) break;
            t->rd_slot[k] = (int32_t)s++;
            t->rd_blk[k] = t->blk[key];
            t->rd_key[k++] = key;
        }
        if (!k) break;
        bool ok[k];
        strata_errbuf_t eb = {{0}};
        (void)s_read(t, k, ok, &eb); /* failures are logged; their slots stay empty */
        for (int i = 0; i < k; i++) {
            if (!ok[i]) continue;
            s_install(t, t->rd_slot[i], t->rd_key[i]);
            filled++;
        }
    }
    return filled;
}

void dtier_stats(const dtier_t *t, dtier_stats_t *st)
{
    memset(st, 0, sizeof *st);
    if (!t) return;
    st->n_slots = t->st.n_slots;
    st->slot_bytes = t->st.slot_bytes;
    st->experts = t->st.experts;
    st->uring = t->st.uring;
    st->hits = __atomic_load_n(&t->st.hits, __ATOMIC_RELAXED);
    st->misses = __atomic_load_n(&t->st.misses, __ATOMIC_RELAXED);
    st->disk_bytes = __atomic_load_n(&t->st.disk_bytes, __ATOMIC_RELAXED);
    st->errors = __atomic_load_n(&t->st.errors, __ATOMIC_RELAXED);
    st->ahead_reads = __atomic_load_n(&t->st.ahead_reads, __ATOMIC_RELAXED);
    st->ahead_used = __atomic_load_n(&t->st.ahead_used, __ATOMIC_RELAXED);
    st->disk_s = (double)__atomic_load_n(&t->disk_ns, __ATOMIC_RELAXED) * 1e-9;
    st->resident = (int32_t)__atomic_load_n(&t->resident, __ATOMIC_RELAXED);
}

void dtier_close(dtier_t *t)
{
    if (!t) return;
    if (t->uring) {
        while (t->n_inflight > 0) s_reap(t, s_any_inflight(t)); /* the kernel writes into the arena until they end */
        io_uring_queue_exit(&t->ring);
    }
    if (t->fd)
        for (int32_t i = 0; i < t->pm->n_files; i++) {
            if (t->fd[i] >= 0) close(t->fd[i]);
            if (t->fdd[i] >= 0) close(t->fdd[i]);
        }
    free(t->blk);
    free(t->map);
    free(t->freq);
    free(t->key);
    free(t->last);
    free(t->pin);
    free(t->inflight);
    free(t->ahead);
    free(t->fd);
    free(t->fdd);
    free(t->rd_slot);
    free(t->rd_blk);
    free(t->rd_key);
    free(t->rd_got);
    free(t);
}
