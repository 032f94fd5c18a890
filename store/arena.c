/* arena.c - weight arena layout: plan from stat(), check, attach the set. */
#include "store/arena.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


int arena_shm_name(char *buf, size_t n, const char *ns, int node)
{
    int w = snprintf(buf, n, "/strata-%s-arena-%d", ns, node);
    return (w < 0 || (size_t)w >= n) ? -ENAMETOOLONG : 0;
}

static uint64_t s_fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool s_is_weight(const char *name)
{
    size_t n = strlen(name);
    return (n > 4 && !strcmp(name + n - 4, ".bin")) || (n > 12 && !strcmp(name + n - 12, ".safetensors"));
}

static int s_cmp_entry(const void *a, const void *b)
{
    return strcmp(((const arena_entry_t *)a)->name, ((const arena_entry_t *)b)->name);
}

bool arena_is_disk_file(const char *name)
{
    size_t n = strlen(name);
    return n > 12 && !strncmp(name, "experts-", 8) && !strcmp(name + n - 4, ".bin");
}

int arena_plan(arena_plan_t *p, const char *model_dir, int part, int parts, int node, int64_t host_mem, double host_frac,
               strata_errbuf_t *eb)
{
    int rc = 0;
    DIR *d = NULL;
    memset(p, 0, sizeof *p);
    if (parts < 1 || part < 0 || part >= parts) return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena part %d of %d", part, parts);
    if (!model_dir[0]) return strata_seterr(eb, STRATA_EINVAL_INPUT, "[group] model is not set");
    char real[PATH_MAX];
    if (!realpath(model_dir, real)) return strata_seterr(eb, -errno, "model folder %s: %s", model_dir, strerror(errno));
    if (strlen(real) >= sizeof p->model_dir) return strata_seterr(eb, STRATA_EINVAL_INPUT, "model folder path too long: %s", real);
    snprintf(p->model_dir, sizeof p->model_dir, "%s", real);
    p->part = part;
    p->parts = parts;
    p->node = node;
    p->host_mem = host_mem > 0 ? host_mem : 0;
    p->host_frac = host_frac > 0 ? host_frac : 0;
    p->tiered = p->host_mem > 0 || p->host_frac > 0;
    d = opendir(real);
    if (!d) return strata_seterr(eb, -errno, "model folder %s: %s", real, strerror(errno));
    /* all candidate files, sorted, then keep the ones of this part */
    arena_entry_t *all = calloc(ARENA_MAX_FILES, sizeof *all);
    if (!all) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    uint32_t n_all = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", real, e->d_name);
        struct stat st;
        if (stat(path, &st) < 0) {
            rc = strata_seterr(eb, -errno, "model file %s: %s", path, strerror(errno));
            goto fail;
        }
        if (!S_ISREG(st.st_mode)) continue;
        if (strlen(e->d_name) >= ARENA_FILE_NAME) {
            rc = strata_seterr(eb, STRATA_EUNSUPPORTED, "model file %s: name longer than %d characters", path, ARENA_FILE_NAME - 1);
            goto fail;
        }
        if (n_all == ARENA_MAX_FILES) {
            rc = strata_seterr(eb, STRATA_EUNSUPPORTED, "model folder %s: more than %d files", real, ARENA_MAX_FILES);
            goto fail;
        }
        arena_entry_t *a = &all[n_all++];
        snprintf(a->name, sizeof a->name, "%s", e->d_name);
        a->bytes = (uint64_t)st.st_size;
        a->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec;
    }
    if (n_all == 0) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "model folder %s holds no files", real);
        goto fail;
    }
    qsort(all, n_all, sizeof *all, s_cmp_entry);
    /* Metadata files (small: json, tokenizer) are page-aligned right after the index; weight
     * files start on ARENA_ALIGN boundaries. */
    uint64_t off = SHM_HEADER_BYTES + sizeof(arena_index_t);
    int k = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t i = 0; i < n_all; i++) {
            bool weight = s_is_weight(all[i].name);
            if (weight != (pass == 1)) continue;
            if (weight && (k++ % parts) != part) continue;
            arena_entry_t *f = &p->files[p->n_files++];
            *f = all[i];
            if (p->tiered && weight && arena_is_disk_file(f->name)) {
                f->flags = ARENA_F_DISK;
                f->offset = 0;
                p->disk_bytes += f->bytes;
                continue;
            }
            uint64_t al = weight ? ARENA_ALIGN : 4096;
            off = (off + al - 1) / al * al;
            f->offset = off;
            p->data_bytes += f->bytes;
            off += f->bytes;
        }
    }
    if (p->disk_bytes == 0) p->tiered = false; /* no expert file in this part: a budget has nothing to leave on disk */
    p->seg_bytes = (off + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    uint64_t h = 0xcbf29ce484222325ull;
    const char tag[] = "strata-arena-v2";
    h = s_fnv(h, tag, sizeof tag);
    uint64_t v[4] = {sizeof(arena_index_t), (uint64_t)part, (uint64_t)parts, ARENA_ALIGN};
    h = s_fnv(h, v, sizeof v);
    h = s_fnv(h, &p->host_mem, sizeof p->host_mem);
    h = s_fnv(h, &p->host_frac, sizeof p->host_frac);
    h = s_fnv(h, p->model_dir, strlen(p->model_dir) + 1);
    for (uint32_t i = 0; i < p->n_files; i++) {
        const arena_entry_t *f = &p->files[i];
        h = s_fnv(h, f->name, strlen(f->name) + 1);
        h = s_fnv(h, &f->bytes, sizeof f->bytes);
        h = s_fnv(h, &f->mtime_ns, sizeof f->mtime_ns);
        h = s_fnv(h, &f->flags, sizeof f->flags);
    }
    p->layout_hash = h;
fail:
    free(all);
    if (d) closedir(d);
    return rc;
}

int arena_check(const shm_seg_t *seg, const arena_plan_t *p, strata_errbuf_t *eb)
{
    const arena_index_t *ix = (const arena_index_t *)shm_payload(seg);
    if (seg->size < p->seg_bytes || seg->size < SHM_HEADER_BYTES + sizeof *ix)
        return strata_seterr(eb, STRATA_EFORMAT, "arena %s: %zu bytes, expected %llu", seg->name, seg->size,
                             (unsigned long long)p->seg_bytes);
    if (ix->magic != ARENA_MAGIC || ix->version != ARENA_VERSION)
        return strata_seterr(eb, STRATA_EFORMAT, "arena %s: bad index magic/version", seg->name);
    if (ix->n_files != p->n_files || ix->part != p->part || ix->parts != p->parts || strcmp(ix->model_dir, p->model_dir))
        return strata_seterr(eb, STRATA_EFORMAT, "arena %s: index describes another model or partition (%s, part %d/%d, %u files)",
                             seg->name, ix->model_dir, ix->part, ix->parts, ix->n_files);
    for (uint32_t i = 0; i < p->n_files; i++) {
        const arena_entry_t *a = &ix->files[i], *b = &p->files[i];
        if (strcmp(a->name, b->name) || a->offset != b->offset || a->bytes != b->bytes || a->mtime_ns != b->mtime_ns ||
            a->flags != b->flags || (!(a->flags & ARENA_F_DISK) && a->offset + a->bytes > seg->size))
            return strata_seterr(eb, STRATA_EFORMAT, "arena %s: file %u (%s) differs from the model folder", seg->name, i, b->name);
    }
    bool slots_ok = p->tiered ? ix->slots_off == p->seg_bytes && ix->n_slots > 0 && ix->slot_bytes > 0 &&
                                    ix->slot_bytes % 4096 == 0 &&
                                    ix->slots_off + (uint64_t)ix->n_slots * ix->slot_bytes <= seg->size
                              : ix->slots_off == 0 && ix->n_slots == 0;
    if (!slots_ok)
        return strata_seterr(eb, STRATA_EFORMAT, "arena %s: its expert slots (%u of %llu bytes at %llu) do not fit %s", seg->name,
                             ix->n_slots, (unsigned long long)ix->slot_bytes, (unsigned long long)ix->slots_off,
                             p->tiered ? "the segment" : "an arena without a host budget");
    return 0;
}

int arena_set_attach(arena_set_t *s, const strata_config_t *c, strata_errbuf_t *eb)
{
    int rc = 0;
    memset(s, 0, sizeof *s);
    arena_plan_t *plan = malloc(sizeof *plan);
    if (!plan) return STRATA_ENOMEM;
    for (int i = 0; i < c->n_prefetchers; i++) {
        char name[SHM_NAME_MAX], ns[SHM_NS_MAX];
        if ((rc = shm_ns_read(ns, sizeof ns, c->run_dir, c->name, c->prefetcher[i].node, eb)) < 0) {
            if (rc == -ENOENT) strata_seterr(eb, rc, "arena of [prefetcher.%d]: no token in %s yet (its prefetcher has not made it)",
                                             c->prefetcher[i].node, c->run_dir);
            goto fail;
        }
        if ((rc = arena_shm_name(name, sizeof name, ns, c->prefetcher[i].node)) < 0) goto fail;
        if ((rc = arena_plan(plan, c->model, i, c->n_prefetchers, c->prefetcher[i].node, c->prefetcher[i].host_mem,
                             c->prefetcher[i].host_mem_frac, eb)) < 0)
            goto fail;
        if ((rc = shm_attach(&s->seg[i], name, plan->layout_hash, 0, eb)) < 0) goto fail;
        s->n = i + 1;
        if ((rc = arena_check(&s->seg[i], plan, eb)) < 0) goto fail;
        s->idx[i] = (const arena_index_t *)shm_payload(&s->seg[i]);
    }
    free(plan);
    return 0;
fail:
    free(plan);
    arena_set_detach(s);
    return rc;
}

const void *arena_set_file(const arena_set_t *s, const char *name, uint64_t *bytes)
{
    for (int i = 0; i < s->n; i++) {
        const arena_index_t *ix = s->idx[i];
        for (uint32_t j = 0; j < ix->n_files; j++) {
            if (strcmp(ix->files[j].name, name)) continue;
            if (ix->files[j].flags & ARENA_F_DISK) return NULL;
            if (bytes) *bytes = ix->files[j].bytes;
            return s->seg[i].base + ix->files[j].offset;
        }
    }
    return NULL;
}

int arena_set_disk_file(const arena_set_t *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        for (uint32_t j = 0; j < s->idx[i]->n_files; j++)
            if ((s->idx[i]->files[j].flags & ARENA_F_DISK) && !strcmp(s->idx[i]->files[j].name, name)) return i;
    return -1;
}

void arena_set_detach(arena_set_t *s)
{
    for (int i = 0; i < s->n; i++) shm_detach(&s->seg[i]);
    memset(s, 0, sizeof *s);
}
