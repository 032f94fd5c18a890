/* arena_model.c - a packed model built over weight arenas (model_load_arenas, packed.h). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "model/packed.h"

typedef struct {
    const arena_set_t *s;
    bool partial;
    const unsigned char **bases; /* [n_files] where each file's bytes are (or are reserved), or NULL */
} s_src_t;

/* model_load_packed_mem's source: the packed folder's files inside the attached arenas. */
static int s_arena_config(void *ctx, model_config_t *cfg, const char **text, size_t *len, strata_errbuf_t *eb)
{
    const s_src_t *src = ctx;
    uint64_t clen = 0;
    *text = arena_set_file(src->s, "config.json", &clen);
    *len = (size_t)clen;
    STRATA_ASSERT(*text); /* model_load_arenas checked it is there */
    return model_config_parse(cfg, *text, *len, "arena:config.json", eb);
}

static int s_arena_check_file(void *ctx, const packed_manifest_t *pm, int32_t i, strata_errbuf_t *eb)
{
    const s_src_t *src = ctx;
    uint64_t bytes = 0;
    if (!arena_set_file(src->s, pm->files[i].name, &bytes)) {
        int a = arena_set_disk_file(src->s, pm->files[i].name);
        if (a >= 0) { /* left on disk by a host budget: its prefetcher reads and computes it */
            for (uint32_t j = 0; j < src->s->idx[a]->n_files; j++)
                if (!strcmp(src->s->idx[a]->files[j].name, pm->files[i].name)) bytes = src->s->idx[a]->files[j].bytes;
            if (bytes == pm->files[i].bytes) return 0;
        } else if (src->partial) {
            return 0; /* another node's file: reserved, never read (model_load_arenas) */
        } else {
            return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: weight file '%s' (field 'files[%d].name' of %s) is in no arena",
                                 pm->files[i].name, i, PACKED_MANIFEST);
        }
    }
    if (bytes != pm->files[i].bytes) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: '%s' holds %" PRIu64 " bytes but field 'files[%d].bytes' of %s says %" PRIu64,
                             pm->files[i].name, bytes, i, PACKED_MANIFEST, pm->files[i].bytes);
    }
    return 0;
}

static int s_arena_map_file(void *ctx, model_t *m, const packed_manifest_t *pm, int32_t i, const unsigned char **data,
                            strata_errbuf_t *eb)
{
    const s_src_t *src = ctx;
    uint64_t bytes = 0;
    *data = arena_set_file(src->s, pm->files[i].name, &bytes);
    if (*data) {
        STRATA_ASSERT(bytes == pm->files[i].bytes); /* s_arena_check_file passed */
        if (src->bases) src->bases[i] = *data;
        return 0;
    }
    STRATA_ASSERT(src->partial || arena_set_disk_file(src->s, pm->files[i].name) >= 0);
    /* Address space only, with no access: a tensor of this file is never read through it (its
     * bytes are in another arena, or read into slots), and a read by mistake faults instead of
     * computing on garbage. */
    void *p = mmap(NULL, (size_t)pm->files[i].bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return strata_seterr(eb, STRATA_ENOMEM, "arena: reserving %s: out of address space", pm->files[i].name);
    if (model_own_mmap(m, p, (size_t)pm->files[i].bytes) < 0) {
        munmap(p, (size_t)pm->files[i].bytes);
        return strata_seterr(eb, STRATA_ENOMEM, "arena: out of memory");
    }
    *data = p;
    if (src->bases) src->bases[i] = p;
    return 0;
}

int model_load_arenas(model_t *m, const arena_set_t *s, bool partial, const unsigned char **bases, strata_errbuf_t *eb)
{
    uint64_t mlen = 0, clen = 0;
    s_src_t ctx = {s, partial, bases};
    const packed_source_t src = {.manifest_name = "arena:" PACKED_MANIFEST, .config_name = "arena:config.json",
                                 .ctx = &ctx, .config = s_arena_config,
                                 .check_file = s_arena_check_file, .map_file = s_arena_map_file};

    memset(m, 0, sizeof *m);
    const char *mtext = arena_set_file(s, PACKED_MANIFEST, &mlen);
    const char *ctext = arena_set_file(s, "config.json", &clen);
    if (!mtext || !ctext) {
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "arena: no %s in the weight arenas (the model folder is not packed)",
                             !mtext ? PACKED_MANIFEST : "config.json");
    }
    return model_load_packed_mem(m, mtext, (size_t)mlen, &src, eb);
}

int model_arena_of(const arena_set_t *s, const void *p)
{
    for (int i = 0; i < s->n; i++)
        if ((const uint8_t *)p >= s->seg[i].base && (const uint8_t *)p < s->seg[i].base + s->seg[i].size) return i;
    return -1;
}
