/* shm.c - shared-memory segments: create with NUMA binding, publish, attach with checks;
 * the run dir and token checks that make a group's segment names its own. */
#include "common/shm.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <numa.h>
#include <numaif.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR "/dev/shm"

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

/* "uid 65534 (nobody)", or "uid 1234" for a uid without a passwd entry. */
static const char *s_who(uid_t uid, char *buf, size_t cap)
{
    struct passwd pw, *res = NULL;
    char tmp[1024];
    if (getpwuid_r(uid, &pw, tmp, sizeof tmp, &res) == 0 && res) snprintf(buf, cap, "uid %u (%s)", (unsigned)uid, res->pw_name);
    else snprintf(buf, cap, "uid %u", (unsigned)uid);
    return buf;
}

/* Who may write the file st describes: refused unless a regular file (what: "shm", "token
 * file") this user owns and neither group nor others may write. rc is the refusal's code. */
static int s_check_owner(const char *what, const char *name, const struct stat *st, int rc, strata_errbuf_t *eb)
{
    char a[96], b[96];
    if (S_ISLNK(st->st_mode))
        return strata_seterr(eb, rc, "%s %s: a symbolic link (owned by %s); refused", what, name, s_who(st->st_uid, a, sizeof a));
    if (!S_ISREG(st->st_mode))
        return strata_seterr(eb, rc, "%s %s: not a regular file (mode 0%o, owned by %s); refused", what, name,
                             (unsigned)st->st_mode, s_who(st->st_uid, a, sizeof a));
    if (st->st_uid != geteuid())
        return strata_seterr(eb, rc, "%s %s: owned by %s, not by this user (%s); refused", what, name, s_who(st->st_uid, a, sizeof a),
                             s_who(geteuid(), b, sizeof b));
    if (st->st_mode & (S_IWGRP | S_IWOTH))
        return strata_seterr(eb, rc, "%s %s: mode 0%03o lets group or others write it (owned by %s); refused", what, name,
                             (unsigned)(st->st_mode & 07777), s_who(st->st_uid, a, sizeof a));
    return 0;
}

/* lstat of segment name's file. */
static int s_lstat(const char *name, struct stat *st)
{
    char path[SHM_NAME_MAX + sizeof SHM_DIR];
    snprintf(path, sizeof path, SHM_DIR "%s", name);
    return lstat(path, st) < 0 ? -errno : 0;
}

int shm_check_name(const char *name, strata_errbuf_t *eb)
{
    int rc;
    if ((rc = s_check_name(name, eb)) < 0) return rc;
    struct stat st;
    if ((rc = s_lstat(name, &st)) < 0) return rc == -ENOENT ? 0 : strata_seterr(eb, rc, "shm %s: %s", name, strerror(-rc));
    return s_check_owner("shm", name, &st, -EPERM, eb);
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
    /* glibc's shm_open adds O_NOFOLLOW: a symbolic link fails with ELOOP */
    fd = shm_open(name, (wr ? O_RDWR : O_RDONLY) | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        struct stat ls;
        if ((e == ELOOP || e == EACCES) && s_lstat(name, &ls) == 0 && s_check_owner("shm", name, &ls, -EPERM, eb) < 0) return -EPERM;
        return strata_seterr(eb, -e, "shm %s: %s", name, strerror(e));
    }
    /* Who may write it, from the file this fd is: nothing is read from a segment before these
     * checks, and the mapping below is of this same file, whatever the name points at later. */
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = strata_seterr(eb, -errno, "shm %s: fstat: %s", name, strerror(errno));
        goto fail;
    }
    if ((rc = s_check_owner("shm", name, &st, -EPERM, eb)) < 0) goto fail;
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
    struct stat st;
    int rc = s_lstat(name, &st);
    if (rc == -ENOENT) return 0;
    if (rc < 0) return rc;
    if (st.st_uid != geteuid()) return -EPERM; /* not ours: a planted name stays as it is */
    if (shm_unlink(name) < 0 && errno != ENOENT) return -errno;
    return 0;
}

/* True if file name f (no '/') is one of group's segments: "strata-<group>-" then a token and
 * '-', or "arena-" / "ring-" (names without a token). */
static bool s_of_group(const char *f, const char *group)
{
    size_t gl = strlen(group);
    if (strncmp(f, "strata-", 7) || strncmp(f + 7, group, gl) || f[7 + gl] != '-') return false;
    const char *r = f + 8 + gl;
    if (!strncmp(r, "arena-", 6) || !strncmp(r, "ring-", 5)) return true;
    for (int i = 0; i < SHM_TOKEN_CHARS; i++)
        if (!((r[i] >= '0' && r[i] <= '9') || (r[i] >= 'a' && r[i] <= 'f'))) return false;
    return r[SHM_TOKEN_CHARS] == '-';
}

/* Count (and remove) this user's segments whose file name starts with prefix (group NULL) or
 * belongs to group. */
static int s_scan(const char *prefix, const char *group, bool remove)
{
    DIR *d = opendir(SHM_DIR);
    if (!d) return -errno;
    int n = 0, rc = 0;
    size_t pl = prefix ? strlen(prefix) : 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (prefix ? strncmp(e->d_name, prefix, pl) != 0 : !s_of_group(e->d_name, group)) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_uid != geteuid()) continue;
        n++;
        if (remove && unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT) rc = -errno;
    }
    closedir(d);
    return rc < 0 ? rc : n;
}

int shm_remove_prefix(const char *prefix) { return prefix[0] == '/' ? s_scan(prefix + 1, NULL, true) : STRATA_EINVAL_INPUT; }
int shm_count_prefix(const char *prefix) { return prefix[0] == '/' ? s_scan(prefix + 1, NULL, false) : STRATA_EINVAL_INPUT; }
int shm_remove_group(const char *group) { return s_scan(NULL, group, true); }

/* ---- the run dir and the tokens -------------------------------------------------------- */

int shm_check_run_dir(const char *run_dir, strata_errbuf_t *eb)
{
    char a[96], b[96];
    struct stat st;
    if (lstat(run_dir, &st) < 0) {
        int e = errno;
        return e == ENOENT ? -ENOENT : strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: %s", run_dir, strerror(e));
    }
    if (S_ISLNK(st.st_mode))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: a symbolic link (owned by %s); refused", run_dir,
                             s_who(st.st_uid, a, sizeof a));
    if (!S_ISDIR(st.st_mode)) return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: not a directory; refused", run_dir);
    if (st.st_uid != geteuid())
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: owned by %s, not by this user (%s); refused", run_dir,
                             s_who(st.st_uid, a, sizeof a), s_who(geteuid(), b, sizeof b));
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: mode 0%03o lets group or others write it; refused", run_dir,
                             (unsigned)(st.st_mode & 07777));
    /* The folders above it: whoever may rename entries in one of them may swap the run dir for
     * their own after this check. Only root or this user may own them, and one that group or
     * others may write must be sticky (/tmp), where only an entry's owner may rename it. */
    char real[PATH_MAX];
    if (!realpath(run_dir, real)) return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: %s", run_dir, strerror(errno));
    for (char *slash = strrchr(real, '/'); slash; slash = strrchr(real, '/')) {
        if (slash == real) slash[1] = 0;
        else *slash = 0;
        if (stat(real, &st) < 0) return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: %s: %s", run_dir, real, strerror(errno));
        if (st.st_uid != 0 && st.st_uid != geteuid())
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: the folder %s above it is owned by %s, who could replace it; refused",
                                 run_dir, real, s_who(st.st_uid, a, sizeof a));
        if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
            return strata_seterr(eb, STRATA_EINVAL_INPUT,
                                 "run dir %s: the folder %s above it has mode 0%03o: group or others could replace it; refused", run_dir,
                                 real, (unsigned)(st.st_mode & 07777));
        if (slash == real) break;
    }
    return 0;
}

static int s_token_path(char *buf, size_t cap, const char *run_dir, int node, const char *pre, const char *post)
{
    int w = snprintf(buf, cap, "%s/%sshm-%d.token%s", run_dir, pre, node, post);
    return w < 0 || (size_t)w >= cap ? -ENAMETOOLONG : 0;
}

static int s_ns(char *ns, size_t cap, const char *group, const char *tok, strata_errbuf_t *eb)
{
    int w = snprintf(ns, cap, "%s-%s", group, tok);
    return w < 0 || (size_t)w >= cap ? strata_seterr(eb, STRATA_EINVAL_INPUT, "group name '%s' too long for a segment name", group) : 0;
}

int shm_ns_read(char *ns, size_t cap, const char *run_dir, const char *group, int node, strata_errbuf_t *eb)
{
    char path[PATH_MAX];
    int rc = shm_check_run_dir(run_dir, eb);
    if (rc < 0) return rc;
    if (s_token_path(path, sizeof path, run_dir, node, "", "") < 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: path too long", run_dir);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return -ENOENT;
        if (e == ELOOP && lstat(path, &st) == 0) return s_check_owner("token file", path, &st, STRATA_EINVAL_INPUT, eb);
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "token file %s: %s", path, strerror(e));
    }
    char buf[SHM_TOKEN_CHARS + 2];
    ssize_t n = -1;
    if (fstat(fd, &st) < 0) rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "token file %s: %s", path, strerror(errno));
    else if ((rc = s_check_owner("token file", path, &st, STRATA_EINVAL_INPUT, eb)) == 0) n = read(fd, buf, sizeof buf);
    close(fd);
    if (rc < 0) return rc;
    bool ok = n == SHM_TOKEN_CHARS || (n == SHM_TOKEN_CHARS + 1 && buf[SHM_TOKEN_CHARS] == '\n');
    for (int i = 0; ok && i < SHM_TOKEN_CHARS; i++) ok = (buf[i] >= '0' && buf[i] <= '9') || (buf[i] >= 'a' && buf[i] <= 'f');
    if (!ok) return strata_seterr(eb, STRATA_EFORMAT, "token file %s: not %d hex digits", path, SHM_TOKEN_CHARS);
    buf[SHM_TOKEN_CHARS] = 0;
    return s_ns(ns, cap, group, buf, eb);
}

int shm_ns_new(char *ns, size_t cap, const char *run_dir, const char *group, int node, strata_errbuf_t *eb)
{
    char path[PATH_MAX], tmp[PATH_MAX], suffix[24], tok[SHM_TOKEN_CHARS + 2];
    int rc = shm_check_run_dir(run_dir, eb);
    if (rc == -ENOENT) return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: does not exist", run_dir);
    if (rc < 0) return rc;
    uint64_t r;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) return strata_seterr(eb, -errno, "getrandom: %s", strerror(errno));
    snprintf(tok, sizeof tok, "%016llx", (unsigned long long)r);
    if ((rc = s_ns(ns, cap, group, tok, eb)) < 0) return rc;
    snprintf(suffix, sizeof suffix, ".%d", (int)getpid());
    if (s_token_path(path, sizeof path, run_dir, node, "", "") < 0 || s_token_path(tmp, sizeof tmp, run_dir, node, ".", suffix) < 0)
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "run dir %s: path too long", run_dir);
    unlink(tmp); /* ours, left by a process of this pid that died here */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return strata_seterr(eb, -errno, "token file %s: %s", tmp, strerror(errno));
    tok[SHM_TOKEN_CHARS] = '\n';
    bool ok = write(fd, tok, SHM_TOKEN_CHARS + 1) == SHM_TOKEN_CHARS + 1;
    int e = errno;
    if (close(fd) < 0 && ok) ok = false, e = errno;
    if (ok && rename(tmp, path) < 0) ok = false, e = errno;
    if (!ok) {
        unlink(tmp);
        return strata_seterr(eb, -e, "token file %s: %s", path, strerror(e));
    }
    return 0;
}

int shm_ns_remove(const char *run_dir, int node)
{
    char path[PATH_MAX];
    if (s_token_path(path, sizeof path, run_dir, node, "", "") < 0) return -ENAMETOOLONG;
    return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
}
