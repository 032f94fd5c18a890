/* test_shm.c - shm segments (common/shm.c) and weight arena layout (store/arena.c). */
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
    char name[SHM_NAME_MAX];
    shm_seg_t s;
    arena_shm_name(name, sizeof name, c->name, c->prefetcher[part].node);
    if (arena_plan(p, c->model, part, c->n_prefetchers, c->prefetcher[part].node, &eb) < 0 ||
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

    char text[1024];
    snprintf(text, sizeof text, "[group]\nname = t%d\nmodel = %s\n[prefetcher.0]\n[prefetcher.3]\n", (int)getpid(), dir);
    strata_config_t c;
    strata_errbuf_t eb = {{0}};
    T_CHECK(config_parse(&c, text, "arena.ini", &eb) == 0, "config: %s", eb.msg);

    arena_plan_t p0, p1, p;
    T_CHECK(arena_plan(&p0, dir, 0, 2, 0, &eb) == 0 && arena_plan(&p1, dir, 1, 2, 3, &eb) == 0, "plan: %s", eb.msg);
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
    T_CHECK(arena_plan(&p, dir, 0, 2, 0, &eb) == 0 && p.layout_hash == p0.layout_hash, "hash is stable");

    /* build both arenas, attach as the executor would, compare every byte */
    T_CHECK(s_build(&c, 0, &p0) == 0 && s_build(&c, 1, &p1) == 0, "build arenas");
    arena_set_t set;
    int rc = arena_set_attach(&set, &c, &eb);
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

    char prefix[96];
    snprintf(prefix, sizeof prefix, "/strata-%s-", c.name);
    T_CHECK(shm_remove_prefix(prefix) == 2, "remove arenas");
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    T_CHECK(system(cmd) == 0, "cleanup");
}

int main(void)
{
    uint64_t rng = t_seed();
    snprintf(s_prefix, sizeof s_prefix, "/strata-test%d-", (int)getpid());
    test_segment();
    test_arena(&rng);
    shm_remove_prefix(s_prefix);
    return t_done("test_shm");
}
