/* safetensors.c - map and validate .safetensors files (see safetensors.h). */
#include "common/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    char *key, *val;
} st_meta_t;

struct st_file {
    char *path;
    void *map;              /* mmap of the whole file, NULL for st_parse */
    size_t map_len;
    bool map_taken;         /* st_take_mapping handed it to the caller */
    const uint8_t *data;    /* start of the data area */
    size_t data_len;        /* bytes */
    st_tensor_t *t;         /* [n], sorted by name */
    size_t n;
    st_meta_t *meta;        /* [n_meta] */
    size_t n_meta;
};

static const struct {
    const char *name;
    size_t size;
} s_dtypes[ST_DTYPE_COUNT] = {
    [ST_BOOL] = {"BOOL", 1},    [ST_U8] = {"U8", 1},   [ST_I8] = {"I8", 1},
    [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1},
    [ST_I16] = {"I16", 2},      [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2},
    [ST_BF16] = {"BF16", 2},    [ST_I32] = {"I32", 4}, [ST_U32] = {"U32", 4},
    [ST_F32] = {"F32", 4},      [ST_F64] = {"F64", 8}, [ST_I64] = {"I64", 8},
    [ST_U64] = {"U64", 8},
};

/* Name of a dtype as the format spells it ("?" if out of range). */
const char *st_dtype_name(st_dtype_t t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? s_dtypes[t].name : "?";
}

/* Bytes per element of a dtype (0 if out of range). */
size_t st_dtype_size(st_dtype_t t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? s_dtypes[t].size : 0;
}

static int s_dtype_parse(const char *s)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (!strcmp(s, s_dtypes[i].name)) return i;
    return -1;
}

static int s_cmp_name(const void *a, const void *b)
{
    return strcmp(((const st_tensor_t *)a)->name, ((const st_tensor_t *)b)->name);
}

static int s_cmp_begin(const void *a, const void *b)
{
    const st_tensor_t *x = *(const st_tensor_t *const *)a, *y = *(const st_tensor_t *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* Read a JSON integer >= 0 into *out; false if it is not one. */
static bool s_get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < 0) return false;
    *out = (uint64_t)i;
    return true;
}

/* Parse one tensor entry {"dtype", "shape", "data_offsets"} into t (name already set). */
static int s_parse_entry(st_tensor_t *t, const json_t *v, const char *path, size_t data_len,
                         strata_errbuf_t *eb)
{
    if (!json_is_object(v))
        return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': entry is not a JSON object", path, t->name);
    const json_t *jd = json_object_get(v, "dtype");
    if (!json_is_string(jd))
        return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': dtype missing or not a string", path, t->name);
    int dt = s_dtype_parse(json_string_value(jd));
    if (dt < 0)
        return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': unknown dtype '%.40s'", path, t->name,
                             json_string_value(jd));
    t->dtype = (st_dtype_t)dt;

    const json_t *js = json_object_get(v, "shape");
    if (!json_is_array(js))
        return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': shape missing or not an array", path, t->name);
    size_t nd = json_array_size(js);
    if (nd > ST_MAX_DIMS)
        return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': shape has %zu dims (max %d)", path, t->name,
                             nd, ST_MAX_DIMS);
    t->ndim = (int32_t)nd;
    uint64_t nelem = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (!s_get_u64(json_array_get(js, i), &d) || d > INT64_MAX)
            return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': shape[%zu] is not a non-negative integer",
                                 path, t->name, i);
        t->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(nelem, d, &nelem))
            return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': shape product overflows", path, t->name);
    }
    uint64_t nbytes;
    if (__builtin_mul_overflow(nelem, (uint64_t)st_dtype_size(t->dtype), &nbytes))
        return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': byte size overflows", path, t->name);

    const json_t *jo = json_object_get(v, "data_offsets");
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !s_get_u64(json_array_get(jo, 0), &t->begin) ||
        !s_get_u64(json_array_get(jo, 1), &t->end))
        return strata_seterr(eb, STRATA_EFORMAT,
                             "%s: tensor '%.200s': data_offsets must be two non-negative integers", path, t->name);
    if (t->begin > t->end)
        return strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': data_offsets [%llu, %llu] end before begin",
                             path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end);
    if (t->end > data_len)
        return strata_seterr(eb, STRATA_EFORMAT,
                             "%s: tensor '%.200s': data_offsets [%llu, %llu] outside the data area (%zu bytes)", path,
                             t->name, (unsigned long long)t->begin, (unsigned long long)t->end, data_len);
    if (t->end - t->begin != nbytes)
        return strata_seterr(eb, STRATA_EFORMAT,
                             "%s: tensor '%.200s': data_offsets span %llu bytes but dtype %s and shape need %llu", path,
                             t->name, (unsigned long long)(t->end - t->begin), st_dtype_name(t->dtype),
                             (unsigned long long)nbytes);
    t->nbytes = (size_t)nbytes;
    return 0;
}

static int s_parse_metadata(st_file_t *f, const json_t *v, strata_errbuf_t *eb)
{
    if (!json_is_object(v))
        return strata_seterr(eb, STRATA_EFORMAT, "%s: __metadata__ is not a JSON object", f->path);
    f->meta = calloc(json_object_size(v) + 1, sizeof *f->meta);
    if (!f->meta) return STRATA_ENOMEM;
    const char *k;
    json_t *mv;
    json_object_foreach((json_t *)v, k, mv) {
        if (!json_is_string(mv))
            return strata_seterr(eb, STRATA_EFORMAT, "%s: __metadata__.%.200s is not a string", f->path, k);
        st_meta_t *m = &f->meta[f->n_meta];
        m->key = strdup(k);
        m->val = strdup(json_string_value(mv));
        f->n_meta++;
        if (!m->key || !m->val) return STRATA_ENOMEM;
    }
    return 0;
}

/* Validate the file image base[len] into f (f->path set). */
static int s_parse(st_file_t *f, const uint8_t *base, size_t len, strata_errbuf_t *eb)
{
    int rc = 0;
    json_t *root = NULL;
    st_tensor_t **by_begin = NULL;

    if (len < 8) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: truncated: %zu bytes, shorter than the 8-byte header length",
                           f->path, len);
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > ST_MAX_HEADER) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: header length %llu exceeds the %u-byte limit", f->path,
                           (unsigned long long)hlen, ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > len - 8) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: header length %llu is longer than the file (%zu bytes after it)",
                           f->path, (unsigned long long)hlen, len - 8);
        goto fail;
    }
    if (hlen < 2 || base[8] != '{') {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: header does not start with a JSON object", f->path);
        goto fail;
    }
    f->data = base + 8 + hlen;
    f->data_len = len - 8 - (size_t)hlen;

    json_error_t jerr;
    root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: header JSON: %s (line %d, column %d)", f->path, jerr.text,
                           jerr.line, jerr.column);
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: header is not a JSON object", f->path);
        goto fail;
    }

    size_t cap = json_object_size(root);
    f->t = calloc(cap ? cap : 1, sizeof *f->t);
    if (!f->t) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) {
            if ((rc = s_parse_metadata(f, val, eb)) < 0) goto fail;
            continue;
        }
        st_tensor_t *t = &f->t[f->n];
        t->name = strdup(key);
        if (!t->name) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
        f->n++;
        if (!key[0]) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: a tensor has an empty name", f->path);
            goto fail;
        }
        if ((rc = s_parse_entry(t, val, f->path, f->data_len, eb)) < 0) goto fail;
        t->data = f->data + t->begin;
    }

    /* The tensors must tile the data area: sorted by begin, each starts where the last ended. */
    by_begin = malloc((f->n ? f->n : 1) * sizeof *by_begin);
    if (!by_begin) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < f->n; i++) by_begin[i] = &f->t[i];
    qsort(by_begin, f->n, sizeof *by_begin, s_cmp_begin);
    uint64_t pos = 0;
    for (size_t i = 0; i < f->n; i++) {
        const st_tensor_t *t = by_begin[i];
        if (t->begin < pos) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': data_offsets [%llu, %llu] overlap tensor '%.200s'",
                               f->path, t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                               by_begin[i - 1]->name);
            goto fail;
        }
        if (t->begin > pos) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: tensor '%.200s': data_offsets begin at %llu, leaving a hole after byte %llu",
                               f->path, t->name, (unsigned long long)t->begin, (unsigned long long)pos);
            goto fail;
        }
        pos = t->end;
    }
    if (pos != f->data_len) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: data area is %zu bytes but the tensors cover %llu", f->path,
                           f->data_len, (unsigned long long)pos);
        goto fail;
    }
    qsort(f->t, f->n, sizeof *f->t, s_cmp_name);
    free(by_begin);
    json_decref(root);
    return 0;
fail:
    free(by_begin);
    json_decref(root);
    return rc;
}

static void s_free(st_file_t *f)
{
    if (!f) return;
    for (size_t i = 0; i < f->n; i++) free((char *)f->t[i].name);
    free(f->t);
    for (size_t i = 0; i < f->n_meta; i++) {
        free(f->meta[i].key);
        free(f->meta[i].val);
    }
    free(f->meta);
    if (f->map && !f->map_taken) munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

/* Validate a file image in memory; tensor data points into buf. 0 or <0 with eb set. */
int st_parse(st_file_t **out, const void *buf, size_t len, const char *name, strata_errbuf_t *eb)
{
    int rc = 0;
    *out = NULL;
    st_file_t *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "<memory>"))) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    if ((rc = s_parse(f, buf, len, eb)) < 0) goto fail;
    *out = f;
    return 0;
fail:
    if (rc == STRATA_ENOMEM) strata_seterr(eb, rc, "%s: out of memory", name ? name : "<memory>");
    s_free(f);
    return rc;
}

/* Map path read-only and validate it. 0 or <0 with eb naming the file and the field. */
int st_open(st_file_t **out, const char *path, strata_errbuf_t *eb)
{
    int rc = 0, fd = -1;
    *out = NULL;
    st_file_t *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = strata_seterr(eb, -errno, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = strata_seterr(eb, -errno, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: not a regular file", path);
        goto fail;
    }
    if (st.st_size < 8) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: truncated: %lld bytes, shorter than the 8-byte header length",
                           path, (long long)st.st_size);
        goto fail;
    }
    f->map_len = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        rc = strata_seterr(eb, -errno, "%s: cannot mmap %zu bytes: %s", path, f->map_len, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    rc = s_parse(f, f->map, f->map_len, eb);
    if (rc == STRATA_ENOMEM) strata_seterr(eb, rc, "%s: out of memory", path);
    if (rc < 0) goto fail;
    *out = f;
    return 0;
fail:
    if (fd >= 0) close(fd);
    s_free(f);
    return rc;
}

/* Free f and unmap its file unless st_take_mapping took the mapping. */
void st_close(st_file_t *f) { s_free(f); }

/* The tensor called name, or NULL (binary search over the name-sorted table). */
const st_tensor_t *st_find(const st_file_t *f, const char *name)
{
    st_tensor_t key = {.name = name};
    return bsearch(&key, f->t, f->n, sizeof *f->t, s_cmp_name);
}

/* Number of tensors (the __metadata__ entry is not one). */
size_t st_count(const st_file_t *f) { return f->n; }

/* The i-th tensor in name order; i < st_count(f). */
const st_tensor_t *st_tensor(const st_file_t *f, size_t i)
{
    STRATA_ASSERT(i < f->n);
    return &f->t[i];
}

/* The path or name the file was opened with. */
const char *st_path(const st_file_t *f) { return f->path; }

/* A __metadata__ value, or NULL. */
const char *st_metadata(const st_file_t *f, const char *key)
{
    for (size_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[i].key, key)) return f->meta[i].val;
    return NULL;
}

/* Transfer the mapping to the caller; 0, or -EINVAL if there is none to give. */
int st_take_mapping(st_file_t *f, void **addr, size_t *len)
{
    if (!f->map || f->map_taken) return -EINVAL;
    f->map_taken = true;
    *addr = f->map;
    *len = f->map_len;
    return 0;
}
