/* safetensors.h - read-only access to .safetensors files.
 *
 * File layout (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
 * length N, then N bytes of JSON, then the data area. The JSON maps each tensor name to
 * {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]} with offsets relative to the
 * data area; the optional "__metadata__" entry is a string-to-string map.
 *
 * st_open() maps the file read-only and validates everything before returning: the header
 * length fits in the file (and in 100 MB), the JSON is an object without duplicate keys,
 * every dtype is known, every shape is non-negative with product * dtype size == end -
 * begin (no overflow), and, sorted by begin, the tensors tile the data area exactly: the
 * first begins at 0, each begins where the previous ends (no overlap, no hole), the last ends
 * at the end of the file. Any failure is one line in eb naming the file and the field.
 */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/strata.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u << 20) /* bytes; the reference implementation's limit */

typedef enum {
    ST_BOOL = 0,
    ST_U8,
    ST_I8,
    ST_F8_E5M2,
    ST_F8_E4M3,
    ST_I16,
    ST_U16,
    ST_F16,
    ST_BF16,
    ST_I32,
    ST_U32,
    ST_F32,
    ST_F64,
    ST_I64,
    ST_U64,
    ST_DTYPE_COUNT
} st_dtype_t;

typedef struct {
    const char *name;             /* NUL-terminated, owned by the st_file_t */
    st_dtype_t dtype;
    int32_t ndim;                 /* 0 (scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];   /* [ndim], elements; unused dims are 0 */
    uint64_t begin, end;          /* byte offsets into the data area */
    const void *data;             /* begin + data area start (no alignment promised) */
    size_t nbytes;                /* end - begin */
} st_tensor_t;

typedef struct st_file st_file_t;

/* Map and validate the file at path. On error returns <0, *f is NULL, eb names file and field. */
int st_open(st_file_t **f, const char *path, strata_errbuf_t *eb);
/* Validate a whole file image held in memory (buf stays owned by the caller and must outlive
 * *f; tensor data points into it). `name` is used in messages. Same checks as st_open. */
int st_parse(st_file_t **f, const void *buf, size_t len, const char *name, strata_errbuf_t *eb);
/* Release the file (and its mapping, unless st_take_mapping took it). NULL is a no-op. */
void st_close(st_file_t *f);

/* The tensor called name, or NULL. O(log n). */
const st_tensor_t *st_find(const st_file_t *f, const char *name);
/* Number of tensors, and the i-th in name order (i < st_count). */
size_t st_count(const st_file_t *f);
const st_tensor_t *st_tensor(const st_file_t *f, size_t i);
/* The path (or name) given to st_open / st_parse. */
const char *st_path(const st_file_t *f);
/* A "__metadata__" value, or NULL. */
const char *st_metadata(const st_file_t *f, const char *key);

/* Hand the mapping to the caller (e.g. model_own_mmap): afterwards st_close leaves it mapped
 * and tensor data stays valid until the caller munmaps it. Returns 0, or -EINVAL when f was
 * made by st_parse or the mapping was already taken. */
int st_take_mapping(st_file_t *f, void **addr, size_t *len);

/* "F32", "BF16", ...; and the size of one element in bytes. */
const char *st_dtype_name(st_dtype_t t);
size_t st_dtype_size(st_dtype_t t);

#endif
