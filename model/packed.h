/* packed.h - the packed model format: manifest, loader and writer.
 *
 * A packed model is a folder holding strata-manifest.json, the HF config.json it was made
 * from, and weight files (resident.bin, experts-LLL.bin). docs/PACKED_FORMAT.md is the
 * specification; this header is its C face:
 *   - packed_slots() lists every tensor a config needs, with its canonical name and shape;
 *   - packed_manifest_parse() / packed_manifest_check() read and validate a manifest;
 *   - model_load_packed() (model/model.h) maps the files and fills a model_t (zero copy);
 *   - model_load_packed_mem() does the same over files already in memory (the executor's arenas);
 *   - packed_write() quantizes a loaded model_t into a new packed folder (strata pack).
 */
#ifndef STRATA_PACKED_H
#define STRATA_PACKED_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strata.h"
#include "kernels/cpu/qmat.h"
#include "kernels/cpu/threadpool.h"
#include "model/model.h"
#include "store/arena.h"

#define PACKED_MANIFEST "strata-manifest.json"
#define PACKED_MAGIC "strata-packed"
#define PACKED_VERSION 1
#define PACKED_TENSOR_ALIGN 64u               /* every data and scale offset, bytes */
#define PACKED_DEFAULT_ALIGN (2u << 20)       /* expert block alignment, bytes */
#define PACKED_MIN_ALIGN 4096u
#define PACKED_MAX_ALIGN (1u << 30)
#define PACKED_NAME_MAX 80
#define PACKED_MAX_META_BYTES (1ull << 30)    /* a manifest or config.json is read whole up to this */

/* What a tensor is; decides which formats the loader accepts for it. */
typedef enum {
    PC_EMBED = 0,    /* [vocab][hidden]: F32 or BF16 */
    PC_LM_HEAD,      /* [vocab][hidden]: any format */
    PC_NORM,         /* vector, F32 */
    PC_BIAS,         /* vector, F32 */
    PC_ATTN,         /* q/k/v/o projections: any format */
    PC_ROUTER,       /* [n_experts][hidden], F32 */
    PC_SHARED_GATE,  /* [1][hidden], F32 */
    PC_EXPERT,       /* routed expert gate/up/down: any format, in an expert block */
    PC_SHARED,       /* shared expert gate/up/down: any format */
    PC_DENSE,        /* dense MLP gate/up/down: any format */
    PC_COUNT
} packed_class_t;

/* One tensor a config needs. Vectors have ndim 1, rows 1, cols = length. */
typedef struct {
    char name[PACKED_NAME_MAX];  /* canonical name, e.g. "layers.3.experts.7.down" */
    packed_class_t cls;
    int32_t layer, expert;       /* -1 where not applicable */
    int32_t ndim, rows, cols;
    qmat_t *q;                   /* matrix destination/source in a model_t, or NULL */
    float **v;                   /* vector destination/source in a model_t, or NULL */
} packed_slot_t;

/* One record of the manifest's "tensors" array. */
typedef struct {
    char name[PACKED_NAME_MAX];
    wfmt_t fmt;
    int32_t ndim, rows, cols;    /* vectors: ndim 1, rows 1 */
    int32_t group;               /* INT4: columns per scale; 0 otherwise */
    int32_t file;                /* index into files */
    uint64_t offset, bytes;      /* data: [offset, offset+bytes) of the file */
    uint64_t scale_offset, scale_bytes; /* scales, 0/0 if the format has none */
} packed_tensor_t;

typedef struct {
    char name[64];               /* plain file name inside the folder */
    uint64_t bytes;              /* exact file size */
    uint32_t crc32;              /* zlib crc32 of the whole file */
} packed_file_t;

/* One routed expert's block: its gate, up and down tensors (data and scales) lie inside. */
typedef struct {
    int32_t layer, expert, file;
    uint64_t offset, bytes;      /* offset is a multiple of the manifest alignment */
    uint32_t crc32;              /* zlib crc32 of the block's bytes, when has_crc */
    bool has_crc;                /* a manifest written before block crc32s has none: not checked */
} packed_block_t;

typedef struct {
    int32_t version;
    char arch[64];               /* config.json "architectures"[0], informational + checked */
    wfmt_t fmt;                  /* format of experts, shared expert and dense MLPs */
    int32_t group;               /* INT4 group asked for (0 otherwise) */
    wfmt_t attn_fmt;             /* attention projections and lm_head */
    wfmt_t embed_fmt;
    uint64_t alignment;          /* expert block alignment, power of two */
    uint32_t config_crc32;       /* crc32 of config.json as stored in the folder */
    int32_t n_files, n_tensors, n_blocks;
    packed_file_t *files;        /* [n_files] */
    packed_tensor_t *tensors;    /* [n_tensors] */
    packed_block_t *blocks;      /* [n_blocks] */
} packed_manifest_t;

/* Canonical tensor list for config c, in file order. If m is not NULL, slots point at its
 * fields (m->layers and each sparse layer's experts must be allocated). *out is malloc'd.
 * Returns 0 or -ENOMEM. */
int packed_slots(const model_config_t *c, model_t *m, packed_slot_t **out, int32_t *n_out);

/* Parse manifest text: syntax, types, field ranges. On error <0, eb names `name` and the field. */
int packed_manifest_parse(packed_manifest_t *pm, const char *json, size_t len, const char *name,
                          strata_errbuf_t *eb);
/* Check a parsed manifest against config c: every needed tensor present with its shape and an
 * allowed format, sizes match the format, every range inside its file (files[].bytes), aligned,
 * no overlaps, expert blocks aligned and holding their tensors. On error <0 with eb set.
 * If idx is not NULL it receives, per slot of packed_slots(c), the tensor index. */
int packed_manifest_check(const packed_manifest_t *pm, const model_config_t *c, const char *name,
                          int32_t *idx, strata_errbuf_t *eb);
/* Write pm as JSON to path (via a temporary file and rename). */
int packed_manifest_save(const packed_manifest_t *pm, const char *path, strata_errbuf_t *eb);
void packed_manifest_free(packed_manifest_t *pm);

/* Where model_load_packed_mem finds a packed model's config.json and the weight files its manifest
 * names: a folder (model_load_packed) or memory (the executor's weight arenas). Each callback
 * reports its own errors through eb, naming the file and the manifest field. */
typedef struct {
    const char *manifest_name;   /* the manifest in messages, e.g. "DIR/strata-manifest.json" */
    const char *config_name;     /* config.json in messages, e.g. "DIR/config.json" */
    void *ctx;                   /* passed to every callback */
    /* Parse config.json into *cfg and point *text, *len at its bytes (for the crc32 check; they
     * stay valid until model_load_packed_mem returns). 0 or <0. */
    int (*config)(void *ctx, model_config_t *cfg, const char **text, size_t *len, strata_errbuf_t *eb);
    /* Check that file pm->files[i] exists and holds exactly pm->files[i].bytes bytes. 0 or <0. */
    int (*check_file)(void *ctx, const packed_manifest_t *pm, int32_t i, strata_errbuf_t *eb);
    /* Point *data at the whole of pm->files[i]; called only after every check passed, and only for
     * files of 1 byte or more. A mapping made here is handed to m with model_own_mmap. 0 or <0.
     * NULL: only the checks run, and m comes back zeroed. */
    int (*map_file)(void *ctx, model_t *m, const packed_manifest_t *pm, int32_t i, const unsigned char **data,
                    strata_errbuf_t *eb);
} packed_source_t;

/* Build m from a manifest (len bytes of JSON) and the files src gives, with every check of
 * model_load_packed (manifest fields, config crc32, file sizes, packed_manifest_check), pointing
 * every qmat_t and vector straight into the file bytes (zero copy: they must outlive m). Order:
 * parse manifest, config, check_file of every file, check against the config, map_file, build.
 * On error <0 with m zeroed and eb naming the file and the field. */
int model_load_packed_mem(model_t *m, const char *manifest, size_t len, const packed_source_t *src,
                          strata_errbuf_t *eb);

/* Build m over the packed model's files inside the weight arenas s (store/arena.h), with every
 * check of model_load_packed_mem: config.json and the manifest come from the arenas, every qmat_t
 * points into them (zero copy; they must outlive m). Reads nothing from disk. partial: s holds
 * some of the weight files only (one prefetcher's own arena); the others are reserved address
 * space with no access, so only tensors of s's files may be read. A file that a host budget left
 * on disk (arena_set_disk_file) is reserved the same way. bases (NULL: not wanted) gets, for each
 * manifest file i, where its bytes are or are reserved, so a tensor's offset in its file is
 * its data pointer minus bases[i]. On error <0, eb set. */
int model_load_arenas(model_t *m, const arena_set_t *s, bool partial, const unsigned char **bases, strata_errbuf_t *eb);
/* Index in s of the arena whose mapping holds p, or -1. */
int model_arena_of(const arena_set_t *s, const void *p);

/* Point m (its cfg set, nothing else) at pm's tensors inside files, where files[i] holds the bytes
 * of pm->files[i] (NULL for a file of 0 bytes) and idx is what packed_manifest_check of pm against
 * m->cfg gave: allocates the layer and expert tables (owned by m), fills every qmat_t and vector
 * slot (zero copy) and ties lm_head. The last step of model_load_packed_mem, for writers that hold
 * a checked manifest and its files in memory. Returns 0 or -ENOMEM (m then holds what model_free
 * releases). */
int packed_model_build(model_t *m, const packed_manifest_t *pm, const int32_t *idx, const unsigned char *const *files);

/* Re-read every weight file of the packed folder dir and compare size and crc32 with pm, and each
 * expert block's crc32 where pm has one; with set_blocks (a writer, before it saves pm) every
 * block's crc32 is set from the bytes re-read instead, once their file's crc32 matched. */
int packed_verify(const char *dir, packed_manifest_t *pm, bool set_blocks, strata_errbuf_t *eb);
/* The indices of the expert blocks of pm in file fi, by offset, into out (pm->n_blocks entries
 * at most); returns their count. */
int32_t packed_file_blocks(const packed_manifest_t *pm, int32_t fi, int32_t *out);
/* Check one block's bytes at data against its crc32 (a block without one passes): 0, or
 * STRATA_EFORMAT with eb naming where (the file), the layer, the expert, the offset and both crc32s. */
int packed_check_block(const packed_block_t *b, const char *where, const unsigned char *data, strata_errbuf_t *eb);
/* Check the crc32 of every expert block of pm that lies in weight file `file` (pm->files[] name),
 * whose bytes are at data, on pool (NULL: this thread). A block without a crc32 passes. Returns
 * how many blocks were checked, or on a mismatch <0, eb naming the file, the block's layer,
 * expert and offset, and both crc32s. */
int packed_check_blocks(const packed_manifest_t *pm, const char *file, const unsigned char *data, tpool_t *pool,
                        strata_errbuf_t *eb);

/* Copy the file src to dst (created 0644, fdatasync'd); a missing src is an error when required,
 * else nothing is done. *crc_out (if not NULL) gets the crc32 of the bytes copied. */
int packed_copy_file(const char *src, const char *dst, bool required, uint32_t *crc_out, strata_errbuf_t *eb);

/* Copy config.json (required) and the tokenizer/generation side files that exist from src_dir
 * to dst_dir; *config_crc (if not NULL) gets the crc32 of config.json. */
int packed_copy_side_files(const char *src_dir, const char *dst_dir, uint32_t *config_crc, strata_errbuf_t *eb);

/* Every check of model_load_packed on the folder dir (manifest, config crc32, file sizes, the
 * manifest against the config), reading no weight. 0 or <0 with eb set. */
int packed_check_dir(const char *dir, strata_errbuf_t *eb);
/* True if dir holds a packed manifest. */
bool packed_is_packed(const char *dir);

typedef struct {
    wfmt_t fmt;          /* experts, shared expert, dense MLPs */
    int32_t group;       /* INT4 group (32, 64, 128); ignored otherwise */
    wfmt_t attn_fmt;     /* attention projections and lm_head (strata pack default: BF16) */
    wfmt_t embed_fmt;    /* F32 or BF16; used when embed_as_source is false */
    bool embed_as_source;/* embeddings keep the source's precision: BF16 stays BF16, others F32 */
    uint64_t alignment;  /* expert block alignment (default PACKED_DEFAULT_ALIGN) */
    int threads;         /* quantization threads; <= 0 = all CPUs */
    bool progress;       /* log per-layer progress */
} packed_write_opts_t;

typedef struct {
    uint64_t file_bytes;     /* sum of file sizes (padding included) */
    uint64_t payload_bytes;  /* data + scales of every tensor */
    uint64_t params;         /* weights of every tensor */
    uint64_t ffn_bytes, ffn_params; /* experts, shared expert and dense MLPs only */
    int32_t fallbacks;       /* tensors stored with a smaller group or INT8 (shape did not fit) */
    double seconds;
} packed_write_stats_t;

/* Defaults for fmt: BF16 attention/lm_head (F32 if fmt is F32), embeddings in the source's
 * precision (BF16 if the source has BF16, else F32), group 32, 2 MiB alignment, all CPUs, no
 * progress. */
void packed_write_opts_default(packed_write_opts_t *o, wfmt_t fmt);

/* Plan the packed layout of a model with config c under o, writing nothing: every manifest
 * record (formats, files, offsets, expert blocks) exactly as packed_write lays it out, checked
 * with packed_manifest_check; crc32 fields are 0 and o->embed_as_source is ignored (embeddings
 * take o->embed_fmt). For writers that make the bytes themselves (model/synth_fast.c). *fallbacks
 * (if not NULL) counts int4 tensors stored with a smaller group or int8. Returns 0 or <0, eb set. */
int packed_plan(const model_config_t *c, const packed_write_opts_t *o, packed_manifest_t *pm, int32_t *fallbacks,
                strata_errbuf_t *eb);

/* Pack src (any loaded model) into out_dir, which must exist and hold no manifest. Copies
 * config.json and the tokenizer files from src_dir, writes the weight files, re-reads them and
 * checks their crc32, then writes the manifest last. Returns 0 or <0 with eb set. */
int packed_write(const model_t *src, const char *src_dir, const char *out_dir,
                 const packed_write_opts_t *o, packed_write_stats_t *st, strata_errbuf_t *eb);

#endif
