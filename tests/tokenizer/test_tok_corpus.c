/* test_tok_corpus.c - pre-tokenizer regexes and whole encodes on a 1.2 MB corpus, against the
 * `tokenizers` library's answers that gen_split_corpus.py hashed per record.
 *
 *   test_tok_corpus SPLIT_DIR [--splits] [--optional] [NAME=TOKENIZER ...]
 *
 * SPLIT_DIR holds corpus.txt.gz (records separated by NUL bytes) and expected.json. With
 * --splits, every pattern under "splits" (o200k, Qwen2, Llama 3) is compiled as a Split
 * pre-tokenizer's regex and run on each record (PCRE2 for o200k, the hand-written matchers for
 * the other two); the [start, end) byte offsets of the non-empty pieces, as little-endian u32
 * pairs, must hash (FNV-1a 64) to the library's pre_tokenize_str pieces. Each NAME=TOKENIZER
 * loads TOKENIZER and checks tok_encode(record, add_special=false) against "ids"."NAME" the
 * same way. With --optional a TOKENIZER that does not exist skips the test (exit 77): the real
 * o200k_harmony is built by o200k_build.py, not committed. A mismatch names the record;
 * `gen_split_corpus.py --show N` prints the library's pieces of record N. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>
#include <zlib.h>

#include "common/tok_int.h"
#include "tests/unit/check.h"

static uint64_t s_fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001B3ull;
    return h;
}
#define FNV0 0xCBF29CE484222325ull

/* The whole of a gzip file, malloc'd; NULL on error. */
static char *s_gunzip(const char *path, size_t *n)
{
    gzFile g = gzopen(path, "rb");
    if (!g) return NULL;
    size_t cap = 1 << 20, len = 0;
    char *b = malloc(cap);
    for (;;) {
        if (len == cap) {
            char *nb = realloc(b, cap *= 2);
            if (!nb) break;
            b = nb;
        }
        int r = gzread(g, b + len, (unsigned)(cap - len));
        if (r <= 0) {
            if (r < 0) len = SIZE_MAX;
            break;
        }
        len += (size_t)r;
    }
    gzclose(g);
    if (len == SIZE_MAX) {
        free(b);
        return NULL;
    }
    *n = len;
    return b;
}

typedef struct {
    const char *p;
    size_t n;
} s_rec_t;

/* Hex hash k of a concatenation of 16-digit hashes. */
static uint64_t s_hash_at(const char *hex, size_t k)
{
    char tmp[17];
    memcpy(tmp, hex + 16 * k, 16);
    tmp[16] = 0;
    return strtoull(tmp, NULL, 16);
}

static void s_show(const char *what, const s_rec_t *r, size_t k)
{
    fprintf(stderr, "  %s: record %zu differs (gen_split_corpus.py --show %zu has the library's pieces): '%.*s'\n",
            what, k, k, (int)(r->n > 160 ? 160 : r->n), r->p);
}

static void s_splits(json_t *splits, const s_rec_t *recs, size_t nrec)
{
    static const char good[] = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}";
    tok_t *tok = NULL;
    strata_errbuf_t eb;
    T_CHECK(tok_load_json(&tok, good, strlen(good), "t.json", &eb) == 0, "load: %s", eb.msg);
    if (!tok) return;
    tk_ws_t *ws = tk_ws_get(tok);
    tk_matches_t mt = {0};
    const char *name;
    json_t *e;
    json_object_foreach(splits, name, e) {
        const char *pat = json_string_value(json_object_get(e, "regex"));
        const char *hex = json_string_value(json_object_get(e, "hash"));
        T_CHECK(pat && hex && strlen(hex) == 16 * nrec, "%s: expected.json has no regex or %zu hashes", name, nrec);
        if (!pat || !hex || strlen(hex) != 16 * nrec) continue;
        tk_re_t re;
        char msg[256];
        T_CHECK(tk_re_compile(&re, pat, strlen(pat), false, msg, sizeof msg) == 0, "%s: compile: %s", name, msg);
        size_t bad = 0, pieces = 0;
        for (size_t k = 0; k < nrec; k++) {
            if (tk_re_find_matches(ws, &re, recs[k].p, recs[k].n, &mt)) {
                T_CHECK(0, "%s: find_matches failed on record %zu", name, k);
                break;
            }
            uint64_t h = FNV0;
            for (size_t i = 0; i < mt.n; i++) {
                if (mt.v[i].e <= mt.v[i].s) continue; /* Split drops empty pieces */
                uint32_t se[2] = {mt.v[i].s, mt.v[i].e};
                unsigned char le[8];
                for (int b = 0; b < 4; b++) {
                    le[b] = (unsigned char)(se[0] >> (8 * b));
                    le[4 + b] = (unsigned char)(se[1] >> (8 * b));
                }
                h = s_fnv(h, le, 8);
                pieces++;
            }
            if (h != s_hash_at(hex, k) && bad++ < 5) {
                s_show(name, &recs[k], k);
                fprintf(stderr, "  ours:");
                for (size_t i = 0; i < mt.n && i < 40; i++)
                    fprintf(stderr, " '%.*s'", (int)(mt.v[i].e - mt.v[i].s), recs[k].p + mt.v[i].s);
                fprintf(stderr, "\n");
            }
        }
        json_int_t want = json_integer_value(json_object_get(e, "pieces"));
        T_CHECK(bad == 0, "%s: %zu of %zu records split unlike tokenizers", name, bad, nrec);
        T_CHECK((json_int_t)pieces == want, "%s: %zu pieces, tokenizers %lld", name, pieces, (long long)want);
        fprintf(stderr, "split %-8s %zu records, %zu pieces: %s\n", name, nrec, pieces,
                bad ? "MISMATCH" : "equal to tokenizers");
        tk_re_free(&re);
    }
    free(mt.v);
    tk_ws_put(tok, ws);
    tok_free(tok);
}

static void s_ids(const char *name, const char *path, json_t *e, const s_rec_t *recs, size_t nrec)
{
    const char *hex = json_string_value(json_object_get(e, "hash"));
    T_CHECK(hex && strlen(hex) == 16 * nrec, "%s: expected.json has no ids hashes for %zu records", name, nrec);
    if (!hex || strlen(hex) != 16 * nrec) return;
    tok_t *tok = NULL;
    strata_errbuf_t eb = {{0}};
    T_CHECK(tok_load(&tok, path, &eb) == 0, "%s: load: %s", name, eb.msg);
    if (!tok) return;
    size_t bad = 0, total = 0;
    for (size_t k = 0; k < nrec; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tok_encode(tok, recs[k].p, recs[k].n, false, &ids, &n)) {
            T_CHECK(0, "%s: encode failed on record %zu", name, k);
            break;
        }
        unsigned char *le = malloc(4 * n + 1);
        for (size_t i = 0; i < n; i++)
            for (int b = 0; b < 4; b++) le[4 * i + b] = (unsigned char)((uint32_t)ids[i] >> (8 * b));
        if (s_fnv(FNV0, le, 4 * n) != s_hash_at(hex, k) && bad++ < 5) {
            s_show(name, &recs[k], k);
            fprintf(stderr, "  ours (%zu):", n);
            for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        total += n;
        free(le);
        free(ids);
    }
    json_int_t want = json_integer_value(json_object_get(e, "tokens"));
    T_CHECK(bad == 0, "%s: %zu of %zu records encode unlike tokenizers", name, bad, nrec);
    T_CHECK((json_int_t)total == want, "%s: %zu ids, tokenizers %lld", name, total, (long long)want);
    fprintf(stderr, "ids   %-13s %zu records, %zu ids: %s\n", name, nrec, total, bad ? "MISMATCH" : "equal to tokenizers");
    tok_free(tok);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_tok_corpus SPLIT_DIR [--splits] [--optional] [NAME=TOKENIZER ...]\n");
        return 2;
    }
    bool splits = false, optional = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--splits")) splits = true;
        else if (!strcmp(argv[i], "--optional")) optional = true;
    }
    for (int i = 2; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        struct stat st;
        if (argv[i][0] != '-' && eq && stat(eq + 1, &st) != 0 && optional) {
            fprintf(stderr, "SKIP: no %s (tests/tokenizer/o200k_build.py builds it)\n", eq + 1);
            return 77;
        }
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/corpus.txt.gz", argv[1]);
    size_t len = 0;
    char *data = s_gunzip(path, &len);
    T_CHECK(data != NULL, "cannot read %s", path);
    snprintf(path, sizeof path, "%s/expected.json", argv[1]);
    json_error_t je;
    json_t *exp = json_load_file(path, 0, &je);
    T_CHECK(exp != NULL, "cannot read %s: %s", path, je.text);
    if (!data || !exp) {
        free(data);
        json_decref(exp);
        return t_done("tok_corpus");
    }
    T_CHECK((json_int_t)len == json_integer_value(json_object_get(exp, "bytes")), "corpus is %zu bytes, not %lld", len,
            (long long)json_integer_value(json_object_get(exp, "bytes")));
    char fh[17];
    snprintf(fh, sizeof fh, "%016llx", (unsigned long long)s_fnv(FNV0, data, len));
    const char *want = json_string_value(json_object_get(exp, "fnv64"));
    T_CHECK(want && !strcmp(fh, want), "corpus hash %s, expected.json says %s", fh, want ? want : "nothing");
    size_t nrec = 1;
    for (size_t i = 0; i < len; i++) nrec += data[i] == 0;
    s_rec_t *recs = malloc(nrec * sizeof *recs);
    size_t k = 0, start = 0;
    for (size_t i = 0; i <= len; i++)
        if (i == len || data[i] == 0) {
            recs[k++] = (s_rec_t){data + start, i - start};
            start = i + 1;
        }
    T_CHECK((json_int_t)nrec == json_integer_value(json_object_get(exp, "records")), "%zu records", nrec);
    fprintf(stderr, "corpus: %zu bytes in %zu records (tokenizers %s)\n", len, nrec,
            json_string_value(json_object_get(exp, "tokenizers_version")));
    if (splits) s_splits(json_object_get(exp, "splits"), recs, nrec);
    for (int i = 2; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (argv[i][0] == '-' || !eq) continue;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(eq - argv[i]), argv[i]);
        json_t *e = json_object_get(json_object_get(exp, "ids"), name);
        T_CHECK(e != NULL, "expected.json has no ids for %s", name);
        if (e) s_ids(name, eq + 1, e, recs, nrec);
    }
    free(recs);
    free(data);
    json_decref(exp);
    return t_done("tok_corpus");
}
