/* test_safetensors.c - the safetensors reader (common/safetensors.c): good files from memory
 * and disk, and every kind of bad header, each refused with a message naming the file and
 * the field; then random valid files round-trip and random corruptions never crash. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/safetensors.h"
#include "tests/unit/check.h"

/* A file image: 8-byte length, header (padded with spaces to pad), data. */
static uint8_t *s_image(const char *hdr, size_t pad, const void *data, size_t dlen, size_t *len)
{
    size_t h = strlen(hdr), hp = h + pad;
    uint8_t *b = malloc(8 + hp + dlen + 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)hp >> (8 * i));
    memcpy(b + 8, hdr, h);
    memset(b + 8 + h, ' ', pad);
    if (dlen) memcpy(b + 8 + hp, data, dlen);
    *len = 8 + hp + dlen;
    return b;
}

/* Parse hdr+data from memory; expect failure with a message holding `want` (and the name). */
static void s_bad(const char *what, const char *hdr, size_t dlen, const char *want)
{
    uint8_t data[256] = {0};
    size_t len;
    uint8_t *img = s_image(hdr, 0, data, dlen, &len);
    st_file_t *f = (st_file_t *)1;
    strata_errbuf_t eb = {{0}};
    int rc = st_parse(&f, img, len, "bad.safetensors", &eb);
    T_CHECK(rc < 0, "%s: accepted", what);
    T_CHECK(f == NULL, "%s: *f not cleared", what);
    T_CHECK(strstr(eb.msg, "bad.safetensors") != NULL, "%s: message lacks the file: %s", what, eb.msg);
    T_CHECK(strstr(eb.msg, want) != NULL, "%s: message lacks '%s': %s", what, want, eb.msg);
    free(img);
}

static void test_good(void)
{
    /* a: F32 [2,3] (24 bytes), b: BF16 [4] (8 bytes), c: I8 [] scalar (1 byte), z: F16 [0]. */
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                      "\"z\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[32,32]},"
                      "\"c\":{\"dtype\":\"I8\",\"shape\":[],\"data_offsets\":[32,33]}}";
    uint8_t data[33];
    for (int i = 0; i < 33; i++) data[i] = (uint8_t)(i * 7 + 1);
    size_t len;
    uint8_t *img = s_image(hdr, 5, data, sizeof data, &len);
    st_file_t *f = NULL;
    strata_errbuf_t eb = {{0}};
    int rc = st_parse(&f, img, len, "good.safetensors", &eb);
    T_CHECK(rc == 0, "good file refused: %s", eb.msg);
    if (rc) return;
    T_CHECK(st_count(f) == 4, "count %zu", st_count(f));
    T_CHECK(!strcmp(st_tensor(f, 0)->name, "a") && !strcmp(st_tensor(f, 3)->name, "z"), "name order");
    const st_tensor_t *a = st_find(f, "a"), *b = st_find(f, "b"), *c = st_find(f, "c");
    T_CHECK(a && a->dtype == ST_F32 && a->ndim == 2 && a->shape[0] == 2 && a->shape[1] == 3 && a->nbytes == 24,
            "tensor a");
    T_CHECK(a && a->data == img + len - 33 && !memcmp(a->data, data, 24), "tensor a data");
    T_CHECK(b && b->dtype == ST_BF16 && b->ndim == 1 && b->shape[0] == 4 && b->begin == 24 && b->end == 32,
            "tensor b");
    T_CHECK(b && !memcmp(b->data, data + 24, 8), "tensor b data");
    T_CHECK(c && c->ndim == 0 && c->nbytes == 1 && *(const uint8_t *)c->data == data[32], "scalar c");
    T_CHECK(st_find(f, "zz") == NULL && st_find(f, "") == NULL, "absent names");
    T_CHECK(st_metadata(f, "format") && !strcmp(st_metadata(f, "format"), "pt"), "metadata");
    T_CHECK(st_metadata(f, "nope") == NULL, "absent metadata");
    T_CHECK(!strcmp(st_path(f), "good.safetensors"), "path");
    void *addr;
    size_t ml;
    T_CHECK(st_take_mapping(f, &addr, &ml) == -EINVAL, "take mapping of a memory image");
    st_close(f);
    free(img);

    /* An empty file: no tensors, no data. */
    img = s_image("{}", 0, NULL, 0, &len);
    rc = st_parse(&f, img, len, "empty.safetensors", &eb);
    T_CHECK(rc == 0 && st_count(f) == 0, "empty header refused: %s", eb.msg);
    if (!rc) st_close(f);
    free(img);
}

static void test_bad(void)
{
    st_file_t *f;
    strata_errbuf_t eb = {{0}};
    uint8_t tiny[5] = {1, 2, 3, 4, 5};
    T_CHECK(st_parse(&f, tiny, 5, "bad.safetensors", &eb) < 0 && strstr(eb.msg, "truncated"), "5 bytes: %s", eb.msg);

    /* header length longer than the file */
    size_t len;
    uint8_t *img = s_image("{}", 0, NULL, 0, &len);
    img[0] = 200;
    T_CHECK(st_parse(&f, img, len, "bad.safetensors", &eb) < 0 && strstr(eb.msg, "header length 200"),
            "long header: %s", eb.msg);
    /* absurd header length */
    memset(img, 0xff, 8);
    T_CHECK(st_parse(&f, img, len, "bad.safetensors", &eb) < 0 && strstr(eb.msg, "limit"), "huge header: %s", eb.msg);
    free(img);

    const char *t1 = "\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char hdr[512];
    snprintf(hdr, sizeof hdr, "{%s}", t1);
    s_bad("data cut short", hdr, 4, "outside the data area");
    s_bad("trailing bytes", hdr, 12, "data area is 12 bytes but the tensors cover 8");
    s_bad("offsets beyond", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[100,108]}}", 8,
          "outside the data area");
    s_bad("end before begin", "{\"t\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "end before begin");
    s_bad("overlap",
          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
          12, "overlap");
    s_bad("hole",
          "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
          12, "hole");
    s_bad("not from zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole");
    s_bad("shape/dtype mismatch", "{\"t\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
          "need 4");
    s_bad("shape too big", "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12");
    s_bad("unknown dtype", "{\"t\":{\"dtype\":\"F17\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype");
    s_bad("dtype not string", "{\"t\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype");
    s_bad("negative dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    s_bad("real dim", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    s_bad("shape not a list", "{\"t\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", 8, "shape");
    s_bad("too many dims",
          "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, "dims");
    s_bad("product overflow",
          "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflow");
    s_bad("byte size overflow",
          "{\"t\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,8]}}", 8, "overflow");
    s_bad("three offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8, "data_offsets");
    s_bad("negative offset", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8, "data_offsets");
    s_bad("missing offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets");
    s_bad("entry not object", "{\"t\":[1,2]}", 8, "not a JSON object");
    s_bad("empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "empty name");
    s_bad("metadata not strings", "{\"__metadata__\":{\"a\":1}}", 0, "__metadata__.a");
    s_bad("metadata not object", "{\"__metadata__\":[]}", 0, "__metadata__");
    s_bad("duplicate name",
          "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
          8, "duplicate");
    s_bad("bad JSON", "{\"t\":", 0, "header JSON");
    s_bad("not an object", "[1,2]", 0, "JSON object");
}

static char s_dir[256];

static void s_write(const char *path, const void *b, size_t n)
{
    FILE *fp = fopen(path, "wb");
    T_CHECK(fp != NULL, "cannot write %s", path);
    if (!fp) return;
    fwrite(b, 1, n, fp);
    fclose(fp);
}

static void test_disk(void)
{
    char path[512];
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    float w[4] = {1, -2, 3.5f, 4};
    size_t len;
    uint8_t *img = s_image(hdr, 3, w, sizeof w, &len);
    snprintf(path, sizeof path, "%s/ok.safetensors", s_dir);
    s_write(path, img, len);
    st_file_t *f = NULL;
    strata_errbuf_t eb = {{0}};
    int rc = st_open(&f, path, &eb);
    T_CHECK(rc == 0, "open: %s", eb.msg);
    if (!rc) {
        const st_tensor_t *t = st_find(f, "w");
        T_CHECK(t && !memcmp(t->data, w, 16), "disk data");
        void *addr;
        size_t ml;
        T_CHECK(st_take_mapping(f, &addr, &ml) == 0 && ml == len, "take mapping");
        T_CHECK(st_take_mapping(f, &addr, &ml) == -EINVAL, "take mapping twice");
        st_close(f);
        /* the mapping outlives st_close */
        T_CHECK(!memcmp((uint8_t *)addr + len - 16, w, 16), "mapping after close");
        munmap(addr, ml);
    }

    /* truncated on disk: the data area is cut */
    snprintf(path, sizeof path, "%s/cut.safetensors", s_dir);
    s_write(path, img, len - 4);
    rc = st_open(&f, path, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "cut.safetensors") && strstr(eb.msg, "'w'"), "cut file: %s", eb.msg);
    /* shorter than the length field */
    s_write(path, img, 3);
    rc = st_open(&f, path, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "truncated"), "3-byte file: %s", eb.msg);
    s_write(path, img, 0);
    rc = st_open(&f, path, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "truncated"), "empty file: %s", eb.msg);
    /* header cut */
    s_write(path, img, 20);
    rc = st_open(&f, path, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "header length"), "header cut: %s", eb.msg);
    free(img);

    snprintf(path, sizeof path, "%s/none.safetensors", s_dir);
    rc = st_open(&f, path, &eb);
    T_CHECK(rc == -ENOENT && strstr(eb.msg, "none.safetensors"), "missing file: %d %s", rc, eb.msg);
    rc = st_open(&f, s_dir, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "not a regular file"), "directory: %s", eb.msg);
}

/* Random valid files parse back exactly; random corruptions of them never crash. */
static void test_random(uint64_t seed)
{
    static const st_dtype_t dts[] = {ST_F32, ST_BF16, ST_F16, ST_I8, ST_U8, ST_I64, ST_F64, ST_BOOL};
    for (int iter = 0; iter < 300; iter++) {
        int n = (int)(t_rng_next(&seed) % 12);
        char *hdr = malloc(16384);
        size_t ho = 0, off = 0;
        int order[12];
        struct {
            st_dtype_t dt;
            int nd;
            int64_t sh[4];
            size_t begin, nb;
        } t[12];
        for (int i = 0; i < n; i++) order[i] = i;
        for (int i = n - 1; i > 0; i--) { /* data order differs from header order */
            int j = (int)(t_rng_next(&seed) % (uint64_t)(i + 1)), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        for (int k = 0; k < n; k++) {
            int i = order[k];
            t[i].dt = dts[t_rng_next(&seed) % 8];
            t[i].nd = (int)(t_rng_next(&seed) % 4);
            size_t ne = 1;
            for (int d = 0; d < t[i].nd; d++) {
                t[i].sh[d] = (int64_t)(t_rng_next(&seed) % 5);
                ne *= (size_t)t[i].sh[d];
            }
            t[i].begin = off;
            t[i].nb = ne * st_dtype_size(t[i].dt);
            off += t[i].nb;
        }
        ho += (size_t)snprintf(hdr + ho, 16384 - ho, "{");
        for (int i = 0; i < n; i++) {
            ho += (size_t)snprintf(hdr + ho, 16384 - ho, "%s\"t%d\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", i,
                                   st_dtype_name(t[i].dt));
            for (int d = 0; d < t[i].nd; d++)
                ho += (size_t)snprintf(hdr + ho, 16384 - ho, "%s%lld", d ? "," : "", (long long)t[i].sh[d]);
            ho += (size_t)snprintf(hdr + ho, 16384 - ho, "],\"data_offsets\":[%zu,%zu]}", t[i].begin,
                                   t[i].begin + t[i].nb);
        }
        snprintf(hdr + ho, 16384 - ho, "}");
        uint8_t *data = malloc(off + 1);
        for (size_t i = 0; i < off; i++) data[i] = (uint8_t)t_rng_next(&seed);
        size_t len;
        uint8_t *img = s_image(hdr, (size_t)(t_rng_next(&seed) % 8), data, off, &len);
        st_file_t *f;
        strata_errbuf_t eb = {{0}};
        int rc = st_parse(&f, img, len, "rand.safetensors", &eb);
        T_CHECK(rc == 0, "random file %d refused: %s", iter, eb.msg);
        if (!rc) {
            T_CHECK(st_count(f) == (size_t)n, "count");
            for (int i = 0; i < n; i++) {
                char nm[16];
                snprintf(nm, sizeof nm, "t%d", i);
                const st_tensor_t *x = st_find(f, nm);
                T_CHECK(x && x->dtype == t[i].dt && x->ndim == t[i].nd && x->nbytes == t[i].nb &&
                            x->begin == t[i].begin && (!x->nbytes || !memcmp(x->data, data + t[i].begin, x->nbytes)),
                        "random tensor %s", nm);
            }
            st_close(f);
        }
        /* corrupt a few bytes (header or length) and parse again: must not crash, and any
         * accepted tensor must lie inside the image */
        for (int k = 0; k < 20; k++) {
            uint8_t *bad = malloc(len);
            memcpy(bad, img, len);
            int flips = 1 + (int)(t_rng_next(&seed) % 3);
            for (int j = 0; j < flips; j++) bad[t_rng_next(&seed) % (8 + ho + 1 < len ? 8 + ho + 1 : len)] ^=
                (uint8_t)(1u << (t_rng_next(&seed) % 8));
            size_t blen = len - (t_rng_next(&seed) % 4 == 0 ? t_rng_next(&seed) % (len + 1) : 0);
            if (st_parse(&f, bad, blen, "rand.safetensors", &eb) == 0) {
                for (size_t i = 0; i < st_count(f); i++) {
                    const st_tensor_t *x = st_tensor(f, i);
                    T_CHECK((const uint8_t *)x->data >= bad && (const uint8_t *)x->data + x->nbytes <= bad + blen,
                            "accepted tensor outside the image");
                }
                st_close(f);
            } else {
                T_CHECK(strstr(eb.msg, "rand.safetensors") != NULL, "message lacks the file: %s", eb.msg);
            }
            free(bad);
        }
        free(img);
        free(data);
        free(hdr);
    }
}

int main(void)
{
    uint64_t seed = t_seed();
    snprintf(s_dir, sizeof s_dir, "/tmp/strata-test-st-%d", (int)getpid());
    mkdir(s_dir, 0700);
    test_good();
    test_bad();
    test_disk();
    test_random(seed);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", s_dir);
    if (system(cmd)) fprintf(stderr, "cleanup of %s failed\n", s_dir);
    return t_done("test_safetensors");
}
