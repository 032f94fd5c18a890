/* test_shm.c - shm segments (common/shm.c), who may own them, the run dir and the tokens that
 * name them, and weight arena layout (store/arena.c). The checks against another owner run as
 * root only (they chown to nobody, uid 65534); the mode and symlink checks run as anyone. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/arena.h"
#include "common/config.h"
#include "common/shm.h"
#include "tests/unit/check.h"

static char s_prefix[64];

/* The permission and policy of the mapping that contains addr, from /proc/self/{maps,numa_maps}. */
static void s_mapping(const void *addr, char perms[8], char policy[32])
{
    perms[0] = policy[0] = 0;
    char line[1024];
    FILE *f = fopen("/proc/self/maps", "r");
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a, b;
        char p[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, p) == 3 && (uintptr_t)addr >= a && (uintptr_t)addr < b) snprintf(perms, 8, "%s", p);
    }
    if (f) fclose(f);
    f = fopen("/proc/self/numa_maps", "r");
    while (f && fgets(line, sizeof line, f)) {
        unsigned long a;
        char pol[32];
        if (sscanf(line, "%lx %31s", &a, pol) == 2 && a == (uintptr_t)addr) snprintf(policy, 32, "%s", pol);
    }
    if (f) fclose(f);
}

static void test_segment(void)
{
    char name[96];
    snprintf(name, sizeof name, "%sseg", s_prefix);
    shm_seg_t s, r;
    strata_errbuf_t eb = {{0}};
    const uint64_t size = 3u << 20, hash = 0x1234abcdull;
    int rc = shm_create(&s, name, size, hash, 0, &eb);
    T_CHECK(rc == 0, "create: %d %s", rc, eb.msg);
    if (rc) return;
    T_CHECK(((uintptr_t)s.base & (SHM_MAP_ALIGN - 1)) == 0, "base %p 2 MiB aligned", (void *)s.base);
    T_CHECK(s.hdr->magic == SHM_MAGIC && s.hdr->version == SHM_VERSION && s.hdr->size == size && s.hdr->layout_hash == hash &&
                s.hdr->owner_pid == getpid() && s.hdr->ready == 0 && s.hdr->numa_node == 0,
            "header fields");
    char perms[8], pol[32];
    s_mapping(s.base, perms, pol);
    T_CHECK(!strcmp(pol, "bind:0"), "numa policy of the segment: '%s'", pol);
    T_CHECK(shm_create(&r, name, size, hash, -1, &eb) == STRATA_EEXISTS, "create twice -> EEXISTS");

    /* not ready yet */
    rc = shm_attach(&r, name, hash, 0, &eb);
    T_CHECK(rc == STRATA_EBUSY && strstr(eb.msg, "not ready"), "attach before publish: %d %s", rc, eb.msg);
    rc = shm_attach(&r, name, hash, SHM_ALLOW_NOT_READY, &eb);
    T_CHECK(rc == 0, "attach not ready allowed: %d", rc);
    shm_detach(&r);

    memset(shm_payload(&s), 0x5a, 1000);
    shm_publish(&s);
    rc = shm_attach(&r, name, hash, 0, &eb);
    T_CHECK(rc == 0 && r.size == size && shm_payload(&r)[999] == 0x5a && !r.writable, "attach ready: %d %s", rc, eb.msg);
    if (rc == 0) {
        s_mapping(r.base, perms, pol);
        T_CHECK(!strcmp(perms, "r--s"), "read-only shared mapping: %s", perms);
        T_CHECK(shm_owner_alive(&r), "owner alive");
        shm_detach(&r);
    }
    rc = shm_attach(&r, name, hash + 1, 0, &eb);
    T_CHECK(rc == STRATA_EVERSION && strstr(eb.msg, "layout hash"), "hash mismatch: %d %s", rc, eb.msg);

    /* owner that died */
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    s.hdr->owner_pid = child;
    rc = shm_attach(&r, name, hash, SHM_WRITE, &eb);
    T_CHECK(rc == 0 && !shm_owner_alive(&r), "dead owner seen");
    if (rc == 0) {
        shm_take_ownership(&r);
        T_CHECK(s.hdr->owner_pid == getpid(), "take ownership visible through the other mapping");
        shm_detach(&r);
    }

    /* corrupt fields, one at a time */
    s.hdr->version = 99;
    rc = shm_attach(&r, name, hash, 0, &eb);
    T_CHECK(rc == STRATA_EVERSION, "bad version: %d %s", rc, eb.msg);
    s.hdr->version = SHM_VERSION;
    s.hdr->size = size * 2;
    rc = shm_attach(&r, name, hash, 0, &eb);
    T_CHECK(rc == STRATA_EFORMAT && strstr(eb.msg, "header size"), "bad size: %d %s", rc, eb.msg);
    s.hdr->size = size;
    s.hdr->owner_pid = 0;
    rc = shm_attach(&r, name, hash, 0, &eb);
    T_CHECK(rc == STRATA_EFORMAT && strstr(eb.msg, "owner"), "bad owner: %d %s", rc, eb.msg);
    s.hdr->owner_pid = getpid();
    s.hdr->magic ^= 1;
    rc = shm_attach(&r, name, hash, 0, &eb);
    T_CHECK(rc == STRATA_EFORMAT && strstr(eb.msg, "magic"), "bad magic: %d %s", rc, eb.msg);
    s.hdr->magic ^= 1;
    shm_detach(&s);

    /* a segment too small to hold a header */
    char small[96];
    snprintf(small, sizeof small, "%ssmall", s_prefix);
    int fd = shm_open(small, O_RDWR | O_CREAT | O_EXCL, 0600);
    T_CHECK(fd >= 0 && ftruncate(fd, 100) == 0, "make small segment");
    if (fd >= 0) close(fd);
    rc = shm_attach(&r, small, hash, 0, &eb);
    T_CHECK(rc == STRATA_EFORMAT && strstr(eb.msg, "smaller than its header"), "truncated: %d %s", rc, eb.msg);
    rc = shm_attach(&r, "/strata-test-does-not-exist-xyz", hash, 0, &eb);
    T_CHECK(rc == -ENOENT, "absent: %d", rc);
    T_CHECK(shm_create(&r, "no-slash", size, hash, -1, &eb) == STRATA_EINVAL_INPUT, "bad name");

    T_CHECK(shm_count_prefix(s_prefix) == 2, "count %d", shm_count_prefix(s_prefix));
    T_CHECK(shm_remove_prefix(s_prefix) == 2, "remove prefix");
    T_CHECK(shm_count_prefix(s_prefix) == 0, "none left");
    T_CHECK(shm_remove(name) == 0, "remove absent is ok");
}

/* Who may own and write a segment: refused before anything of it is read. */
static void test_trust(void)
{
    char name[96], link[96], path[128], lpath[128];
    snprintf(name, sizeof name, "%strust", s_prefix);
    snprintf(link, sizeof link, "%slink", s_prefix);
    snprintf(path, sizeof path, "/dev/shm%s", name);
    snprintf(lpath, sizeof lpath, "/dev/shm%s", link);
    shm_seg_t s, r;
    strata_errbuf_t eb = {{0}};
    const uint64_t hash = 77;
    T_CHECK(shm_create(&s, name, 1u << 20, hash, -1, &eb) == 0, "create: %s", eb.msg);
    shm_publish(&s);
    struct stat st;
    T_CHECK(stat(path, &st) == 0 && (st.st_mode & 07777) == 0600 && st.st_uid == geteuid(), "created 0600, ours: 0%o",
            (unsigned)st.st_mode);
    T_CHECK(shm_check_name(name, &eb) == 0, "own segment passes: %s", eb.msg);
    int rc = shm_attach(&r, name, hash, SHM_WRITE, &eb);
    T_CHECK(rc == 0, "attach own: %d %s", rc, eb.msg);
    if (rc == 0) shm_detach(&r);

    /* writable by others: refused, whichever way it is attached */
    chmod(path, 0666);
    for (int w = 0; w < 2; w++) {
        rc = shm_attach(&r, name, hash, w ? SHM_WRITE : 0, &eb);
        T_CHECK(rc == -EPERM && strstr(eb.msg, name) && strstr(eb.msg, "mode 0666") && strstr(eb.msg, "refused"),
                "0666 refused (write %d): %d %s", w, rc, eb.msg);
    }
    T_CHECK(shm_check_name(name, &eb) == -EPERM && strstr(eb.msg, "mode 0666"), "check_name 0666: %s", eb.msg);
    chmod(path, 0620);
    T_CHECK(shm_attach(&r, name, hash, 0, &eb) == -EPERM && strstr(eb.msg, "mode 0620"), "group-writable refused: %s", eb.msg);
    chmod(path, 0600);

    /* a symbolic link to our own segment: refused, and removing it removes only the link */
    T_CHECK(symlink(path, lpath) == 0, "symlink");
    rc = shm_attach(&r, link, hash, 0, &eb);
    T_CHECK(rc == -EPERM && strstr(eb.msg, link) && strstr(eb.msg, "symbolic link"), "symlink refused: %d %s", rc, eb.msg);
    T_CHECK(shm_check_name(link, &eb) == -EPERM && strstr(eb.msg, "symbolic link"), "check_name symlink: %s", eb.msg);
    T_CHECK(shm_remove(link) == 0 && access(path, F_OK) == 0, "the link removed, its target kept");

    if (geteuid() == 0) {
        /* another user's segment (what a planted one is): refused, and never removed */
        T_CHECK(chown(path, 65534, 65534) == 0, "chown");
        rc = shm_attach(&r, name, hash, SHM_WRITE, &eb);
        T_CHECK(rc == -EPERM && strstr(eb.msg, name) && strstr(eb.msg, "owned by uid 65534") && strstr(eb.msg, "refused"),
                "another owner refused: %d %s", rc, eb.msg);
        T_CHECK(shm_check_name(name, &eb) == -EPERM && strstr(eb.msg, "uid 65534"), "check_name owner: %s", eb.msg);
        T_CHECK(shm_remove(name) == -EPERM && access(path, F_OK) == 0, "shm_remove leaves another user's segment");
        T_CHECK(shm_count_prefix(s_prefix) == 0 && shm_remove_prefix(s_prefix) == 0 && access(path, F_OK) == 0,
                "prefix scans skip another user's segment");
        T_CHECK(chown(path, 0, 0) == 0, "chown back");
    } else {
        fprintf(stderr, "test_trust: not root: the other-owner checks are skipped\n");
    }
    shm_detach(&s);
    T_CHECK(shm_remove(name) == 0 && access(path, F_OK) != 0, "own segment removed");
}

static void s_write_text(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd >= 0) {
        if (write(fd, text, strlen(text)) < 0) perror(path);
        fchmod(fd, mode);
        close(fd);
    }
}

/* The run dir and the token files in it. */
static void test_run_dir(void)
{
    char top[] = "/tmp/test_rundir_XXXXXX";
    T_CHECK(mkdtemp(top) != NULL, "mkdtemp");
    char rd[128], sub[160], lnk[128], tok[200], other[128];
    snprintf(rd, sizeof rd, "%s/run", top);
    snprintf(sub, sizeof sub, "%s/run/sub", top);
    snprintf(lnk, sizeof lnk, "%s/link", top);
    snprintf(tok, sizeof tok, "%s/run/shm-3.token", top);
    strata_errbuf_t eb = {{0}};
    T_CHECK(shm_check_run_dir(rd, &eb) == -ENOENT, "absent: -ENOENT");
    mkdir(rd, 0700);
    T_CHECK(shm_check_run_dir(rd, &eb) == 0, "0700: %s", eb.msg);
    chmod(rd, 0755);
    T_CHECK(shm_check_run_dir(rd, &eb) == 0, "0755 (others may read, not write): %s", eb.msg);
    chmod(rd, 0777);
    int rc = shm_check_run_dir(rd, &eb);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, rd) && strstr(eb.msg, "mode 0777"), "0777 refused: %d %s", rc, eb.msg);
    chmod(rd, 0700);
    T_CHECK(symlink(rd, lnk) == 0, "symlink");
    rc = shm_check_run_dir(lnk, &eb);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, lnk) && strstr(eb.msg, "symbolic link"), "symlink refused: %s", eb.msg);
    /* a folder above it that others may write (not sticky): they could swap the run dir */
    mkdir(sub, 0700);
    chmod(rd, 0777);
    rc = shm_check_run_dir(sub, &eb);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, "above it") && strstr(eb.msg, rd), "writable folder above: %s", eb.msg);
    chmod(rd, 01777);
    T_CHECK(shm_check_run_dir(sub, &eb) == 0, "sticky folder above, as /tmp: %s", eb.msg);
    chmod(rd, 0700);
    rmdir(sub);
    if (geteuid() == 0) {
        T_CHECK(chown(rd, 65534, 65534) == 0, "chown");
        rc = shm_check_run_dir(rd, &eb);
        T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, "owned by uid 65534"), "another owner refused: %s", eb.msg);
        T_CHECK(shm_ns_read(other, sizeof other, rd, "g", 3, &eb) == STRATA_EINVAL_INPUT, "no token read from it");
        T_CHECK(chown(rd, 0, 0) == 0, "chown back");
    }

    /* tokens */
    char ns[SHM_NS_MAX], ns2[SHM_NS_MAX];
    T_CHECK(shm_ns_read(ns, sizeof ns, rd, "grp", 3, &eb) == -ENOENT, "no token yet");
    T_CHECK(shm_ns_new(ns, sizeof ns, rd, "grp", 3, &eb) == 0, "new token: %s", eb.msg);
    T_CHECK(strlen(ns) == 4 + SHM_TOKEN_CHARS && !strncmp(ns, "grp-", 4) && strspn(ns + 4, "0123456789abcdef") == SHM_TOKEN_CHARS,
            "namespace '%s'", ns);
    struct stat st;
    T_CHECK(stat(tok, &st) == 0 && (st.st_mode & 07777) == 0600, "token file 0600");
    T_CHECK(shm_ns_read(ns2, sizeof ns2, rd, "grp", 3, &eb) == 0 && !strcmp(ns, ns2), "read back: %s %s", ns, ns2);
    T_CHECK(shm_ns_new(ns2, sizeof ns2, rd, "grp", 3, &eb) == 0 && strcmp(ns, ns2), "a new token each time: %s %s", ns, ns2);
    chmod(tok, 0666);
    rc = shm_ns_read(ns, sizeof ns, rd, "grp", 3, &eb);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, tok) && strstr(eb.msg, "mode 0666"), "writable token refused: %s", eb.msg);
    s_write_text(tok, "0123456789abcdeZ\n", 0600);
    T_CHECK(shm_ns_read(ns, sizeof ns, rd, "grp", 3, &eb) == STRATA_EFORMAT, "not a token: %s", eb.msg);
    s_write_text(tok, "0123456789abcdef\n", 0600);
    T_CHECK(shm_ns_read(ns, sizeof ns, rd, "grp", 3, &eb) == 0 && !strcmp(ns, "grp-0123456789abcdef"), "written by hand: %s", ns);
    unlink(tok);
    char target[200];
    snprintf(target, sizeof target, "%s/elsewhere", top);
    s_write_text(target, "0123456789abcdef\n", 0600);
    T_CHECK(symlink(target, tok) == 0, "token symlink");
    rc = shm_ns_read(ns, sizeof ns, rd, "grp", 3, &eb);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, "symbolic link"), "token symlink refused: %s", eb.msg);
    T_CHECK(shm_ns_remove(rd, 3) == 0 && shm_ns_read(ns, sizeof ns, rd, "grp", 3, &eb) == -ENOENT, "token removed");
    T_CHECK(shm_ns_remove(rd, 3) == 0, "removing an absent token is ok");

    /* the group scan: this group's segments with a token, not another group's */
    char a[96], b[96], c2[96];
    snprintf(a, sizeof a, "/strata-tg%d-0123456789abcdef-arena-0", (int)getpid());
    snprintf(b, sizeof b, "/strata-tg%d-arena-1", (int)getpid());
    snprintf(c2, sizeof c2, "/strata-tg%d-x-0123456789abcdef-arena-0", (int)getpid());
    char grp[32];
    snprintf(grp, sizeof grp, "tg%d", (int)getpid());
    for (int i = 0; i < 3; i++) {
        int fd = shm_open(i == 0 ? a : i == 1 ? b : c2, O_RDWR | O_CREAT, 0600);
        if (fd >= 0) close(fd);
    }
    T_CHECK(shm_remove_group(grp) == 2, "group scan removes its own two");
    T_CHECK(shm_remove(c2) == 0, "another group's segment was left");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", top);
    T_CHECK(system(cmd) == 0, "cleanup");
}

static int s_write_file(const char *dir, const char *name, size_t n, uint64_t *rng)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    uint8_t *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)t_rng_next(rng);
    FILE *f = fopen(path, "wb");
    size_t w = f ? fwrite(b, 1, n, f) : 0;
    if (f) fclose(f);
    free(b);
    return w == n ? 0 : -1;
}

/* Build the arena of `part` by hand, as the prefetcher does: plan, create, copy, index, publish. */
static int s_build(const strata_config_t *c, int part, arena_plan_t *p)
{
    strata_errbuf_t eb = {{0}};
    char name[SHM_NAME_MAX], ns[SHM_NS_MAX];
    shm_seg_t s;
    if (shm_ns_new(ns, sizeof ns, c->run_dir, c->name, c->prefetcher[part].node, &eb) < 0) {
        fprintf(stderr, "build: %s\n", eb.msg);
        return -1;
    }
    arena_shm_name(name, sizeof name, ns, c->prefetcher[part].node);
    if (arena_plan(p, c->model, part, c->n_prefetchers, c->prefetcher[part].node, 0, 0, &eb) < 0 ||
        shm_create(&s, name, p->seg_bytes, p->layout_hash, -1, &eb) < 0) {
        fprintf(stderr, "build: %s\n", eb.msg);
        return -1;
    }
    arena_index_t *ix = (arena_index_t *)shm_payload(&s);
    ix->magic = ARENA_MAGIC;
    ix->version = ARENA_VERSION;
    ix->n_files = p->n_files;
    ix->part = p->part;
    ix->parts = p->parts;
    ix->node = p->node;
    snprintf(ix->model_dir, sizeof ix->model_dir, "%s", p->model_dir);
    memcpy(ix->files, p->files, sizeof(arena_entry_t) * p->n_files);
    for (uint32_t i = 0; i < p->n_files; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", p->model_dir, p->files[i].name);
        FILE *f = fopen(path, "rb");
        size_t got = f ? fread(s.base + p->files[i].offset, 1, p->files[i].bytes, f) : 0;
        if (f) fclose(f);
        if (got != p->files[i].bytes) {
            fprintf(stderr, "build: read %s: %zu of %llu\n", path, got, (unsigned long long)p->files[i].bytes);
            return -1;
        }
    }
    shm_publish(&s);
    shm_detach(&s);
    return 0;
}

static void test_arena(uint64_t *rng)
{
    char dir[] = "/tmp/test_arena_XXXXXX";
    T_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    const char *files[] = {"config.json", "strata-manifest.json", "tokenizer.json", "resident.bin", "experts-000.bin",
                           "experts-001.bin", "experts-002.bin"};
    size_t sizes[7];
    for (int i = 0; i < 7; i++) {
        sizes[i] = (size_t)(t_rng_next(rng) % (3u << 20)) + (i == 2 ? 0 : 1);
        T_CHECK(s_write_file(dir, files[i], sizes[i], rng) == 0, "write %s", files[i]);
    }
    mkdir(strcat(strcpy((char[600]){0}, dir), "/subdir"), 0700); /* folders are skipped */
    s_write_file(dir, ".hidden", 10, rng);                         /* hidden files too */

    char run[] = "/tmp/test_arena_run_XXXXXX";
    T_CHECK(mkdtemp(run) != NULL, "mkdtemp run dir");
    char text[1024];
    snprintf(text, sizeof text, "[group]\nname = t%d\nmodel = %s\nrun_dir = %s\n[prefetcher.0]\n[prefetcher.3]\n", (int)getpid(), dir,
             run);
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    T_CHECK(config_parse(&c, text, "arena.ini", &eb) == 0, "config: %s", eb.msg);
    arena_set_t set;
    int rc = arena_set_attach(&set, &c, &eb);
    T_CHECK(rc == -ENOENT && strstr(eb.msg, "no token"), "no token yet: %d %s", rc, eb.msg);

    arena_plan_t p0, p1, p;
    T_CHECK(arena_plan(&p0, dir, 0, 2, 0, 0, 0, &eb) == 0 && arena_plan(&p1, dir, 1, 2, 3, 0, 0, &eb) == 0, "plan: %s", eb.msg);
    /* 3 metadata files in both, 4 weight files split 2 + 2 by sorted name */
    T_CHECK(p0.n_files == 5 && p1.n_files == 5, "files per part %u %u", p0.n_files, p1.n_files);
    int in0 = 0, in1 = 0;
    for (uint32_t i = 0; i < p0.n_files; i++) in0 += !strcmp(p0.files[i].name, "experts-000.bin") || !strcmp(p0.files[i].name, "experts-002.bin");
    for (uint32_t i = 0; i < p1.n_files; i++) in1 += !strcmp(p1.files[i].name, "experts-001.bin") || !strcmp(p1.files[i].name, "resident.bin");
    T_CHECK(in0 == 2 && in1 == 2, "round robin split");
    for (uint32_t i = 0; i < p0.n_files; i++) {
        const arena_entry_t *f = &p0.files[i];
        bool w = strstr(f->name, ".bin") != NULL;
        T_CHECK(f->offset % (w ? ARENA_ALIGN : 4096) == 0 && f->offset >= SHM_HEADER_BYTES + sizeof(arena_index_t) &&
                    f->offset + f->bytes <= p0.seg_bytes,
                "offset of %s: %llu", f->name, (unsigned long long)f->offset);
        if (i) T_CHECK(f->offset >= p0.files[i - 1].offset + p0.files[i - 1].bytes, "no overlap");
    }
    T_CHECK(p0.layout_hash != p1.layout_hash, "parts hash differently");
    T_CHECK(arena_plan(&p, dir, 0, 2, 0, 0, 0, &eb) == 0 && p.layout_hash == p0.layout_hash, "hash is stable");
    /* a host budget: the expert files stay on disk (flagged, not imaged), the rest as before */
    T_CHECK(!p0.tiered && arena_is_disk_file("experts-000.bin") && !arena_is_disk_file("resident.bin") &&
                !arena_is_disk_file("experts.json") && !arena_is_disk_file("model.safetensors"),
            "which files a budget leaves on disk");
    arena_plan_t pt, pt2;
    T_CHECK(arena_plan(&pt, dir, 0, 2, 0, 64 << 20, 0, &eb) == 0 && pt.tiered && pt.n_files == p0.n_files, "tiered plan: %s", eb.msg);
    uint64_t disk = 0;
    for (uint32_t i = 0; i < pt.n_files; i++) {
        const arena_entry_t *f = &pt.files[i];
        bool d = arena_is_disk_file(f->name);
        T_CHECK(d == ((f->flags & ARENA_F_DISK) != 0) && (!d || f->offset == 0), "%s: flags %u offset %llu", f->name, f->flags,
                (unsigned long long)f->offset);
        if (d) disk += f->bytes;
    }
    T_CHECK(pt.disk_bytes == disk && disk > 0 && pt.seg_bytes < p0.seg_bytes && pt.data_bytes + disk == p0.data_bytes,
            "tiered sizes: disk %llu, segment %llu < %llu", (unsigned long long)disk, (unsigned long long)pt.seg_bytes,
            (unsigned long long)p0.seg_bytes);
    T_CHECK(pt.layout_hash != p0.layout_hash && arena_plan(&pt2, dir, 0, 2, 0, 0, 0.5, &eb) == 0 &&
                pt2.layout_hash != pt.layout_hash && arena_plan(&p, dir, 0, 2, 0, 64 << 20, 0, &eb) == 0 &&
                p.layout_hash == pt.layout_hash,
            "the budget as configured is in the layout hash");
    /* part 1 holds resident.bin and experts-001.bin: tiered too; a part without an expert file is not */
    T_CHECK(arena_plan(&p, dir, 1, 2, 3, 64 << 20, 0, &eb) == 0 && p.tiered, "part 1 tiered");
    T_CHECK(arena_plan(&p, dir, 0, 1, 0, 0, 0, &eb) == 0 && !p.tiered, "no budget: not tiered");

    /* build both arenas, attach as the executor would, compare every byte */
    T_CHECK(s_build(&c, 0, &p0) == 0 && s_build(&c, 1, &p1) == 0, "build arenas");
    rc = arena_set_attach(&set, &c, &eb);
    T_CHECK(rc == 0 && set.n == 2, "attach set: %d %s", rc, eb.msg);
    if (rc == 0) {
        for (int i = 0; i < 7; i++) {
            uint64_t n = 0;
            const uint8_t *img = arena_set_file(&set, files[i], &n);
            char path[600];
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            uint8_t *want = malloc(sizes[i] + 1);
            FILE *f = fopen(path, "rb");
            size_t got = f ? fread(want, 1, sizes[i], f) : 0;
            if (f) fclose(f);
            T_CHECK(img && n == sizes[i] && got == sizes[i] && memcmp(img, want, sizes[i]) == 0, "image of %s", files[i]);
            if (img && strstr(files[i], ".bin")) T_CHECK(((uintptr_t)img & (ARENA_ALIGN - 1)) == 0, "%s 2 MiB aligned in memory", files[i]);
            free(want);
        }
        T_CHECK(arena_set_file(&set, ".hidden", NULL) == NULL && arena_set_file(&set, "nope", NULL) == NULL, "absent files");
        arena_set_detach(&set);
    }
    /* touching a model file changes the layout hash: attach refuses the stale arena */
    char path[600];
    snprintf(path, sizeof path, "%s/experts-001.bin", dir);
    struct timespec ts[2] = {{.tv_sec = 1000000, .tv_nsec = 0}, {.tv_sec = 1000000, .tv_nsec = 0}};
    utimensat(AT_FDCWD, path, ts, 0);
    rc = arena_set_attach(&set, &c, &eb);
    T_CHECK(rc == STRATA_EVERSION && strstr(eb.msg, "layout hash"), "stale arena refused: %d %s", rc, eb.msg);
    /* a run dir others may write names nothing: the attach is refused at once (final, exit 2) */
    chmod(run, 0777);
    rc = arena_set_attach(&set, &c, &eb);
    T_CHECK(rc == STRATA_EINVAL_INPUT && strstr(eb.msg, run) && strstr(eb.msg, "mode 0777"), "run dir 0777: %d %s", rc, eb.msg);
    chmod(run, 0700);

    T_CHECK(shm_remove_group(c.name) == 2, "remove arenas");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, run);
    T_CHECK(system(cmd) == 0, "cleanup");
}

int main(void)
{
    uint64_t rng = t_seed();
    snprintf(s_prefix, sizeof s_prefix, "/strata-test%d-", (int)getpid());
    test_segment();
    test_trust();
    test_run_dir();
    test_arena(&rng);
    shm_remove_prefix(s_prefix);
    return t_done("test_shm");
}
