/* shm.c - shared-memory segments: create with NUMA binding, publish, attach with checks. */
#include "common/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(shm_header_t) <= SHM_HEADER_BYTES, "shm header fits its page");

/* Map fd at a SHM_MAP_ALIGN-aligned address: reserve size + align of address space, then map
 * the segment over the aligned part with MAP_FIXED and give back the slack on both sides. */
static void *s_map_aligned(int fd, size_t size, int prot)
{
    size_t span = size + SHM_MAP_ALIGN;
    uint8_t *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED) return MAP_FAILED;
    uint8_t *al = (uint8_t *)(((uintptr_t)res + SHM_MAP_ALIGN - 1) & ~(uintptr_t)(SHM_MAP_ALIGN - 1));
    void *p = mmap(al, size, prot, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(res, span);
        errno = e;
        return MAP_FAILED;
    }
    if (al > res) munmap(res, (size_t)(al - res));
    size_t tail = (size_t)((res + span) - (al + size));
    if (tail) munmap(al + size, tail);
    return p;
}

static int s_check_name(const char *name, strata_errbuf_t *eb)
{
    size_t n = strlen(name);
    if (n < 2 || n >= SHM_NAME_MAX || name[0] != '/' || strchr(name + 1, '/'))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "shm name '%s' must be '/' then 1-%d characters without '/'", name,
                             SHM_NAME_MAX - 2);
    return 0;
}

int shm_create(shm_seg_t *s, const char *name, uint64_t size, uint64_t layout_hash, int numa_node,
               strata_errbuf_t *eb)
{
    int rc, fd = -1;
    void *p = MAP_FAILED;
    memset(s, 0, sizeof *s);
    if ((rc = s_check_name(name, eb)) < 0) return rc;
    if (size < SHM_HEADER_BYTES || size > (uint64_t)SIZE_MAX / 2)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "shm %s: bad size %llu", name, (unsigned long long)size);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = errno == EEXIST ? STRATA_EEXISTS : -errno;
        return strata_seterr(eb, rc, "shm_open(%s, O_CREAT|O_EXCL): %s", name, strerror(errno));
    }
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = strata_seterr(eb, -errno, "ftruncate(%s, %llu): %s", name, (unsigned long long)size, strerror(errno));
        goto fail;
    }
    p = s_map_aligned(fd, (size_t)size, PROT_READ | PROT_WRITE);
    if (p == MAP_FAILED) {
        rc = strata_seterr(eb, -errno, "mmap(%s, %llu): %s", name, (unsigned long long)size, strerror(errno));
        goto fail;
    }
    if (numa_node >= 0) {
        /* On a shmem mapping mbind sets the object's shared policy: every page of the segment
         * is allocated on the node, whoever touches it first. Must precede any touch. */
        if (numa_available() < 0 || numa_node > numa_max_node()) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "shm %s: numa node %d not available here", name, numa_node);
            goto fail;
        }
        struct bitmask *bm = numa_allocate_nodemask();
        if (!bm) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
        numa_bitmask_setbit(bm, (unsigned)numa_node);
        int r = mbind(p, (size_t)size, MPOL_BIND, bm->maskp, bm->size + 1, 0);
        int e = errno;
        numa_bitmask_free(bm);
        if (r < 0) {
            rc = strata_seterr(eb, -e, "mbind(%s, node %d): %s", name, numa_node, strerror(e));
            goto fail;
        }
    }
    /* Huge pages where the kernel allows them for shmem (shmem_enabled=advise); best effort. */
    (void)madvise(p, (size_t)size, MADV_HUGEPAGE);
    int fr = posix_fallocate(fd, 0, (off_t)size);
    if (fr != 0) {
        rc = strata_seterr(eb, -fr, "shm %s: reserving %llu bytes: %s", name, (unsigned long long)size, strerror(fr));
        goto fail;
    }
    close(fd);
    fd = -1;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->base = p;
    s->size = (size_t)size;
    s->hdr = (shm_header_t *)p;
    s->writable = true;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    *s->hdr = (shm_header_t){
        .magic = SHM_MAGIC,
        .version = SHM_VERSION,
        .header_bytes = SHM_HEADER_BYTES,
        .layout_hash = layout_hash,
        .size = size,
        .owner_pid = (int32_t)getpid(),
        .numa_node = numa_node,
        .created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
        .ready = 0,
    };
    return 0;
fail:
    if (p != MAP_FAILED) munmap(p, (size_t)size);
    if (fd >= 0) close(fd);
    shm_unlink(name);
    memset(s, 0, sizeof *s);
    return rc;
}

void shm_publish(shm_seg_t *s)
{
    STRATA_ASSERT(s->writable && s->hdr);
    __atomic_store_n(&s->hdr->ready, 1u, __ATOMIC_RELEASE);
}

int shm_attach(shm_seg_t *s, const char *name, uint64_t layout_hash, unsigned flags, strata_errbuf_t *eb)
{
    int rc, fd = -1;
    void *p = MAP_FAILED;
    size_t size = 0;
    memset(s, 0, sizeof *s);
    if ((rc = s_check_name(name, eb)) < 0) return rc;
    bool wr = flags & SHM_WRITE;
    fd = shm_open(name, (wr ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
    if (fd < 0) return strata_seterr(eb, -errno, "shm %s: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = strata_seterr(eb, -errno, "shm %s: fstat: %s", name, strerror(errno));
        goto fail;
    }
    if (st.st_size < (off_t)SHM_HEADER_BYTES) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "shm %s: %lld bytes, smaller than its header", name, (long long)st.st_size);
        goto fail;
    }
    size = (size_t)st.st_size;
    p = s_map_aligned(fd, size, PROT_READ | (wr ? PROT_WRITE : 0));
    if (p == MAP_FAILED) {
        rc = strata_seterr(eb, -errno, "shm %s: mmap: %s", name, strerror(errno));
        goto fail;
    }
    const shm_header_t *h = p;
    if (h->magic != SHM_MAGIC) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "shm %s: bad magic 0x%016llx (not a strata segment)", name, (unsigned long long)h->magic);
        goto fail;
    }
    if (h->version != SHM_VERSION || h->header_bytes != SHM_HEADER_BYTES) {
        rc = strata_seterr(eb, STRATA_EVERSION, "shm %s: version %u header %u, expected %u/%u", name, h->version, h->header_bytes,
                           SHM_VERSION, SHM_HEADER_BYTES);
        goto fail;
    }
    if (h->size != (uint64_t)st.st_size) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "shm %s: header size %llu but the segment has %lld bytes", name,
                           (unsigned long long)h->size, (long long)st.st_size);
        goto fail;
    }
    if (h->layout_hash != layout_hash) {
        rc = strata_seterr(eb, STRATA_EVERSION, "shm %s: layout hash %016llx, expected %016llx (built for another model or build)",
                           name, (unsigned long long)h->layout_hash, (unsigned long long)layout_hash);
        goto fail;
    }
    if (h->owner_pid <= 0) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "shm %s: bad owner pid %d", name, h->owner_pid);
        goto fail;
    }
    if (!(flags & SHM_ALLOW_NOT_READY) && __atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) != 1u) {
        rc = strata_seterr(eb, STRATA_EBUSY, "shm %s: not ready (owner pid %d still filling it, or died doing so)", name, h->owner_pid);
        goto fail;
    }
    close(fd);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->base = p;
    s->size = size;
    s->hdr = (shm_header_t *)p;
    s->writable = wr;
    return 0;
fail:
    if (p != MAP_FAILED) munmap(p, size);
    if (fd >= 0) close(fd);
    return rc;
}

bool shm_owner_alive(const shm_seg_t *s)
{
    pid_t pid = s->hdr->owner_pid;
    if (pid <= 0) return false;
    if (pid == getpid()) return true;
    return kill(pid, 0) == 0 || errno == EPERM;
}

void shm_take_ownership(shm_seg_t *s)
{
    STRATA_ASSERT(s->writable && s->hdr);
    __atomic_store_n(&s->hdr->owner_pid, (int32_t)getpid(), __ATOMIC_RELEASE);
}

void shm_detach(shm_seg_t *s)
{
    if (s->base) munmap(s->base, s->size);
    memset(s, 0, sizeof *s);
}

int shm_remove(const char *name)
{
    if (shm_unlink(name) < 0 && errno != ENOENT) return -errno;
    return 0;
}

static int s_scan(const char *prefix, bool remove)
{
    if (prefix[0] != '/') return STRATA_EINVAL_INPUT;
    DIR *d = opendir("/dev/shm");
    if (!d) return -errno;
    int n = 0, rc = 0;
    size_t pl = strlen(prefix + 1);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix + 1, pl)) continue;
        n++;
        if (remove) {
            char nm[sizeof e->d_name + 2];
            snprintf(nm, sizeof nm, "/%s", e->d_name);
            if (shm_unlink(nm) < 0 && errno != ENOENT) rc = -errno;
        }
    }
    closedir(d);
    return rc < 0 ? rc : n;
}

int shm_remove_prefix(const char *prefix) { return s_scan(prefix, true); }
int shm_count_prefix(const char *prefix) { return s_scan(prefix, false); }
