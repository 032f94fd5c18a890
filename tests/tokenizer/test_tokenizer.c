/* test_tokenizer.c - the tokenizer against the Hugging Face `tokenizers` library.
 *
 *   test_tokenizer [FIXTURE_DIR]   (default: the committed tests/tokenizer/fixtures)
 *
 * For every fixture tokenizer (made by gen_fixtures.py) and every corpus line: the ids with
 * and without special tokens equal the library's; both decodes equal the library's; the
 * line round-trips wherever the library round-trips it; the streaming decoder's pieces are
 * each valid UTF-8 and add up to the full decode. Random id sequences (the library's decodes
 * are in the fixture, plus fresh ones at STRATA_SEED for the stream), random bytes, two
 * threads at once, a model folder with tokenizer_config.json, and broken tokenizer.json files
 * whose errors must name the field. A corpus.json with "optional": "SCRIPT" names fixtures
 * whose tokenizer.json SCRIPT builds (gpt-oss's real one, tests/tokenizer/o200k): while one is
 * missing the test is skipped (exit 77). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/tokenizer.h"
#include "tests/unit/check.h"

#ifndef TOK_FIXTURES
#define TOK_FIXTURES "tests/tokenizer/fixtures"
#endif

static const char *s_dir = TOK_FIXTURES;

/* hex string -> malloc'd bytes */
static unsigned char *s_unhex(const char *h, size_t *n)
{
    size_t l = strlen(h);
    unsigned char *b = malloc(l / 2 + 1);
    for (size_t i = 0; i < l / 2; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        b[i] = (unsigned char)v;
    }
    *n = l / 2;
    return b;
}

static bool s_valid_utf8(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t need;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) need = 2;
        else if (c == 0xE0) { need = 3; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) need = 3;
        else if (c == 0xED) { need = 3; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) need = 3;
        else if (c == 0xF0) { need = 4; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) need = 4;
        else if (c == 0xF4) { need = 4; hi = 0x8F; }
        else return false;
        if (i + need > n) return false;
        for (size_t k = 1; k < need; k++) {
            unsigned b = p[i + k];
            if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return false;
        }
        i += need;
    }
    return true;
}

static json_t *s_load_json(const char *path)
{
    json_error_t je;
    json_t *j = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!j) fprintf(stderr, "cannot read %s: %s\n", path, je.text);
    return j;
}

static void s_print_ids(const char *what, const int32_t *ids, size_t n)
{
    fprintf(stderr, "  %s (%zu):", what, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

static bool s_ids_eq(const int32_t *a, size_t na, json_t *b)
{
    if (na != json_array_size(b)) return false;
    for (size_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(b, i))) return false;
    return true;
}

static int32_t *s_json_ids(json_t *a, size_t *n)
{
    *n = json_array_size(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    for (size_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return v;
}

/* Stream the ids; the pieces must be valid UTF-8 and add up to tok_decode's text. */
static void s_check_stream(const tok_t *tok, const int32_t *ids, size_t n, bool skip, const char *ctx)
{
    char *full = NULL;
    size_t fn = 0;
    if (tok_decode(tok, ids, n, skip, &full, &fn)) {
        T_CHECK(0, "%s: decode failed", ctx);
        return;
    }
    tok_stream_t *st = NULL;
    T_CHECK(tok_stream_new(tok, skip, &st) == 0, "%s: stream_new", ctx);
    if (!st) {
        free(full);
        return;
    }
    char *cat = malloc(fn + 1);
    size_t cn = 0;
    bool ok = true, valid = true;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *p;
        size_t pn;
        int rc = i < n ? tok_stream_push(st, ids[i], &p, &pn) : tok_stream_flush(st, &p, &pn);
        if (rc) {
            ok = false;
            break;
        }
        if (!s_valid_utf8((const unsigned char *)p, pn)) valid = false;
        if (cn + pn > fn || memcmp(full + cn, p, pn)) ok = false;
        else {
            memcpy(cat + cn, p, pn);
            cn += pn;
        }
    }
    T_CHECK(ok && cn == fn, "%s: stream (skip=%d) is not a prefix-exact split of the decode (%zu of %zu bytes)", ctx,
            skip, cn, fn);
    T_CHECK(valid, "%s: stream (skip=%d) emitted invalid UTF-8", ctx, skip);
    /* the stream is reusable after flush */
    const char *p;
    size_t pn;
    T_CHECK(tok_stream_flush(st, &p, &pn) == 0 && pn == 0, "%s: second flush not empty", ctx);
    tok_stream_free(st);
    free(cat);
    free(full);
}

static void s_check_decode(const tok_t *tok, const int32_t *ids, size_t n, bool skip, const char *hex,
                           const char *ctx)
{
    if (!hex) return; /* difftest: the library could not decode these */
    char *text = NULL;
    size_t tn = 0;
    size_t en;
    unsigned char *exp = s_unhex(hex, &en);
    int rc = tok_decode(tok, ids, n, skip, &text, &tn);
    bool ok = rc == 0 && tn == en && !memcmp(text, exp, en) && text[tn] == 0;
    T_CHECK(ok, "%s: decode(skip=%d) differs from tokenizers", ctx, skip);
    if (!ok) fprintf(stderr, "  ours:   '%.*s'\n  theirs: '%.*s'\n", (int)tn, text ? text : "", (int)en, exp);
    free(text);
    free(exp);
}

static int s_fixture(const char *name, json_t *corpus, int *lines_ok, int *lines_total)
{
    char path[1024], ctx[1200];
    snprintf(path, sizeof path, "%s/%s", s_dir, name);
    tok_t *tok = NULL;
    strata_errbuf_t eb = {{0}};
    int rc = tok_load(&tok, path, &eb);
    T_CHECK(rc == 0, "%s: load failed: %s", name, eb.msg);
    if (rc) return 1;
    snprintf(path, sizeof path, "%s/%s/expected.json", s_dir, name);
    json_t *exp = s_load_json(path);
    T_CHECK(exp != NULL, "%s: no expected.json", name);
    if (!exp) {
        tok_free(tok);
        return 1;
    }
    json_t *lines = json_object_get(exp, "lines");
    T_CHECK(json_array_size(lines) == json_array_size(corpus), "%s: expected.json does not match corpus", name);
    int bad = 0;
    for (size_t i = 0; i < json_array_size(lines) && i < json_array_size(corpus); i++) {
        json_t *e = json_array_get(lines, i);
        size_t n;
        unsigned char *text = s_unhex(json_string_value(json_array_get(corpus, i)), &n);
        snprintf(ctx, sizeof ctx, "%s line %zu", name, i);
        int32_t *ids = NULL, *plain = NULL;
        size_t nids = 0, nplain = 0;
        int r1 = tok_encode(tok, (const char *)text, n, true, &ids, &nids);
        int r2 = tok_encode(tok, (const char *)text, n, false, &plain, &nplain);
        bool ok1 = r1 == 0 && s_ids_eq(ids, nids, json_object_get(e, "ids"));
        bool ok2 = r2 == 0 && s_ids_eq(plain, nplain, json_object_get(e, "plain"));
        T_CHECK(ok1, "%s: ids (add_special) differ from tokenizers", ctx);
        T_CHECK(ok2, "%s: ids (no special) differ from tokenizers", ctx);
        if (!ok1 || !ok2) {
            size_t en;
            int32_t *ev = s_json_ids(json_object_get(e, ok1 ? "plain" : "ids"), &en);
            fprintf(stderr, "  text: '%.*s'\n", (int)(n > 200 ? 200 : n), text);
            s_print_ids("ours  ", ok1 ? plain : ids, ok1 ? nplain : nids);
            s_print_ids("theirs", ev, en);
            free(ev);
            bad++;
        }
        (*lines_total)++;
        if (ok1 && ok2) (*lines_ok)++;
        /* decodes of the library's ids, so a decode bug shows even if encode differs */
        size_t en;
        int32_t *ev = s_json_ids(json_object_get(e, "ids"), &en);
        s_check_decode(tok, ev, en, false, json_string_value(json_object_get(e, "dec")), ctx);
        s_check_decode(tok, ev, en, true, json_string_value(json_object_get(e, "dec_skip")), ctx);
        s_check_stream(tok, ev, en, false, ctx);
        s_check_stream(tok, ev, en, true, ctx);
        free(ev);
        if (json_is_true(json_object_get(e, "rt")) && s_valid_utf8(text, n) && r2 == 0) {
            char *back = NULL;
            size_t bn = 0;
            T_CHECK(tok_decode(tok, plain, nplain, false, &back, &bn) == 0 && bn == n && !memcmp(back, text, n),
                    "%s: decode(encode(x)) != x where tokenizers round-trips", ctx);
            free(back);
        }
        free(ids);
        free(plain);
        free(text);
    }
    json_t *rnd = json_object_get(exp, "random");
    for (size_t i = 0; i < json_array_size(rnd); i++) {
        json_t *e = json_array_get(rnd, i);
        size_t n;
        int32_t *ids = s_json_ids(json_object_get(e, "ids"), &n);
        snprintf(ctx, sizeof ctx, "%s random ids %zu", name, i);
        s_check_decode(tok, ids, n, false, json_string_value(json_object_get(e, "dec")), ctx);
        s_check_decode(tok, ids, n, true, json_string_value(json_object_get(e, "dec_skip")), ctx);
        s_check_stream(tok, ids, n, false, ctx);
        s_check_stream(tok, ids, n, true, ctx);
        free(ids);
    }
    json_decref(exp);
    tok_free(tok);
    return bad;
}

/* Fresh random ids (stream vs batch) and random bytes (encode must work, decode is UTF-8). */
static void s_random(const char *name, uint64_t *seed)
{
    char path[1024], ctx[256];
    snprintf(path, sizeof path, "%s/%s/tokenizer.json", s_dir, name);
    tok_t *tok = NULL;
    strata_errbuf_t eb;
    if (tok_load(&tok, path, &eb)) return;
    int32_t vs = (int32_t)tok_vocab_size(tok);
    for (int k = 0; k < 150; k++) {
        int32_t ids[64];
        size_t n = 1 + t_rng_next(seed) % 63;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = t_rng_next(seed);
            /* bias towards low ids: byte tokens and specials live there */
            ids[i] = (int32_t)(r % 4 == 0 ? (r >> 8) % 300 : (r >> 8) % (uint64_t)(vs + 2));
        }
        snprintf(ctx, sizeof ctx, "%s fresh ids %d", name, k);
        s_check_stream(tok, ids, n, false, ctx);
        s_check_stream(tok, ids, n, true, ctx);
    }
    for (int k = 0; k < 150; k++) {
        unsigned char buf[96];
        size_t n = t_rng_next(seed) % sizeof buf;
        for (size_t i = 0; i < n; i++) {
            uint64_t r = t_rng_next(seed);
            buf[i] = (unsigned char)(r % 3 == 0 ? ' ' + (r >> 8) % 95 : r >> 8);
        }
        int32_t *ids = NULL, *ids2 = NULL;
        size_t ni = 0, ni2 = 0;
        snprintf(ctx, sizeof ctx, "%s random bytes %d", name, k);
        int rc = tok_encode(tok, (const char *)buf, n, true, &ids, &ni);
        T_CHECK(rc == 0, "%s: encode failed (%d)", ctx, rc);
        rc = tok_encode(tok, (const char *)buf, n, true, &ids2, &ni2);
        T_CHECK(rc == 0 && ni == ni2 && (!ni || !memcmp(ids, ids2, ni * sizeof *ids)), "%s: encode not repeatable",
                ctx);
        char *text = NULL;
        size_t tn = 0;
        T_CHECK(tok_decode(tok, ids, ni, false, &text, &tn) == 0 && s_valid_utf8((unsigned char *)text, tn),
                "%s: decode not valid UTF-8", ctx);
        free(text);
        free(ids);
        free(ids2);
    }
    tok_free(tok);
}

/* ---------------------------------------------------------------- threads */

struct s_thr {
    const tok_t *tok;
    json_t *corpus, *lines;
    int bad;
};

static void *s_thread(void *arg)
{
    struct s_thr *t = arg;
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < json_array_size(t->corpus); i++) {
            size_t n;
            unsigned char *text = s_unhex(json_string_value(json_array_get(t->corpus, i)), &n);
            int32_t *ids = NULL;
            size_t ni = 0;
            if (tok_encode(t->tok, (const char *)text, n, true, &ids, &ni) ||
                !s_ids_eq(ids, ni, json_object_get(json_array_get(t->lines, i), "ids")))
                t->bad++;
            free(ids);
            free(text);
        }
    return NULL;
}

static void s_threads(json_t *corpus)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/bl_qwen2/tokenizer.json", s_dir);
    tok_t *tok = NULL;
    strata_errbuf_t eb;
    if (tok_load(&tok, path, &eb)) return;
    snprintf(path, sizeof path, "%s/bl_qwen2/expected.json", s_dir);
    json_t *exp = s_load_json(path);
    struct s_thr a = {tok, corpus, json_object_get(exp, "lines"), 0}, b = a;
    pthread_t ta, tb;
    pthread_create(&ta, NULL, s_thread, &a);
    pthread_create(&tb, NULL, s_thread, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    T_CHECK(a.bad == 0 && b.bad == 0, "two threads on one tok_t: %d + %d lines differ", a.bad, b.bad);
    json_decref(exp);
    tok_free(tok);
}

/* ---------------------------------------------------------------- folder, bad input */

static void s_folder(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/sp_llama", s_dir);
    tok_t *tok = NULL;
    strata_errbuf_t eb = {{0}};
    T_CHECK(tok_load(&tok, path, &eb) == 0, "folder load: %s", eb.msg);
    if (!tok) return;
    T_CHECK(tok_bos(tok) == 1 && tok_eos(tok) == 2, "bos/eos from tokenizer_config.json: %d %d", tok_bos(tok),
            tok_eos(tok));
    size_t l;
    const char *s = tok_id_to_token(tok, 1, &l);
    T_CHECK(s && l == 3 && !memcmp(s, "<s>", 3) && tok_is_special(tok, 1) && !tok_is_special(tok, 10),
            "id_to_token / is_special");
    T_CHECK(tok_token_to_id(tok, "</s>", 4) == 2 && tok_token_to_id(tok, "no such token", 13) == -1,
            "token_to_id");
    T_CHECK(tok_vocab_size(tok) >= 259, "vocab size %zu", tok_vocab_size(tok));
    tok_free(tok);
    T_CHECK(tok_load(&tok, "/nonexistent/tokenizer.json", &eb) < 0 && strstr(eb.msg, "/nonexistent"),
            "missing file error: %s", eb.msg);
}

static const char s_base_model[] = "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"
                                   "\"merges\":[\"a b\"]}";

static void s_bad(const char *json, const char *field, const char *what)
{
    tok_t *tok = NULL;
    strata_errbuf_t eb = {{0}};
    int rc = tok_load_json(&tok, json, strlen(json), "bad.json", &eb);
    T_CHECK(rc < 0 && !tok, "%s: accepted", what);
    T_CHECK(strstr(eb.msg, field) != NULL && !strncmp(eb.msg, "bad.json: ", 10),
            "%s: message '%s' does not name '%s' in bad.json", what, eb.msg, field);
    tok_free(tok);
}

static void s_bad_inputs(void)
{
    char j[2048];
    s_bad("{\"version\":\"1.0\",\"added_tokens\":[]}", "model: missing", "missing model");
    s_bad("{\"model\":null}", "model: missing", "null model");
    s_bad("{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "model.type", "unsupported model type");
    s_bad("{\"model\":{\"type\":\"BPE\",\"merges\":[]}}", "model.vocab: missing", "missing vocab");
    snprintf(j, sizeof j, "{%s,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Bogus\"}]}}",
             s_base_model);
    s_bad(j, "pre_tokenizer.pretokenizers[0].type", "unknown pre_tokenizer type");
    snprintf(j, sizeof j, "{%s,\"normalizer\":{\"type\":\"Nope\"}}", s_base_model);
    s_bad(j, "normalizer.type", "unknown normalizer type");
    snprintf(j, sizeof j, "{%s,\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{}]}}",
             s_base_model);
    s_bad(j, "decoder.decoders[1].type: missing", "decoder without type");
    snprintf(j, sizeof j, "{%s,\"post_processor\":{\"type\":\"Weird\"}}", s_base_model);
    s_bad(j, "post_processor.type", "unknown post_processor type");
    snprintf(j, sizeof j,
             "{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed[\"},"
             "\"behavior\":\"Isolated\",\"invert\":false}}",
             s_base_model);
    s_bad(j, "pre_tokenizer.pattern.Regex: bad regex", "bad regex");
    snprintf(j, sizeof j, "{%s,\"normalizer\":{\"type\":\"Replace\",\"pattern\":{\"Regex\":\"a{2,1}\"},\"content\":\"\"}}",
             s_base_model);
    s_bad(j, "normalizer.pattern.Regex", "bad regex in a normalizer");
    snprintf(j, sizeof j, "{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"x\"},\"behavior\":\"Sideways\"}}",
             s_base_model);
    s_bad(j, "pre_tokenizer.behavior", "unknown split behavior");
    s_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a c\"]}}",
          "model.merges[0]: merge token 'c' is not in model.vocab", "merge with an unknown token");
    s_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[[\"a\",\"b\"],[\"q\",\"a\"]]}}",
          "model.merges[1]: merge token 'q'", "pair merge with an unknown token");
    s_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}",
          "model.merges[0]: merged token 'ab' is not in model.vocab", "merge result not in vocab");
    s_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a a a\"]}}", "model.merges[0]",
          "merge line with two spaces");
    s_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-3},\"merges\":[]}}", "model.vocab[\"a\"]", "negative id");
    s_bad("{\"model\":", "line 1", "truncated JSON");
    snprintf(j, sizeof j, "{%s,\"added_tokens\":[{\"id\":5}]}", s_base_model);
    s_bad(j, "added_tokens[0].content: missing", "added token without content");
    snprintf(j, sizeof j, "{%s,\"decoder\":{\"type\":\"Strip\",\"content\":\"ab\",\"start\":1,\"stop\":0}}",
             s_base_model);
    s_bad(j, "decoder.content", "Strip content of two chars");
    snprintf(j, sizeof j,
             "{%s,\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}},"
             "{\"Sequence\":{\"id\":\"A\"}}],\"special_tokens\":{}}}",
             s_base_model);
    s_bad(j, "post_processor.single[0].SpecialToken.id", "template token missing from special_tokens");
    /* and a minimal good one */
    tok_t *tok = NULL;
    strata_errbuf_t eb = {{0}};
    snprintf(j, sizeof j, "{%s}", s_base_model);
    T_CHECK(tok_load_json(&tok, j, strlen(j), "good.json", &eb) == 0, "minimal tokenizer: %s", eb.msg);
    int32_t *ids = NULL;
    size_t n = 0;
    T_CHECK(tok && tok_encode(tok, "abab", 4, true, &ids, &n) == 0 && n == 2 && ids[0] == 2 && ids[1] == 2,
            "minimal tokenizer encodes 'abab' as [2, 2]");
    free(ids);
    tok_free(tok);
}

int main(int argc, char **argv)
{
    if (argc > 1) s_dir = argv[1];
    uint64_t seed = t_seed();
    char path[1024];
    snprintf(path, sizeof path, "%s/corpus.json", s_dir);
    json_t *cj = s_load_json(path);
    T_CHECK(cj != NULL, "no corpus");
    if (!cj) return t_done("tokenizer");
    json_t *corpus = json_object_get(cj, "lines");
    int lines_ok = 0, lines_total = 0;
    json_t *names = json_object_get(cj, "tokenizers");
    /* a fixture whose tokenizer.json is built, not committed (tests/tokenizer/o200k): skipped */
    const char *builder = json_string_value(json_object_get(cj, "optional"));
    for (size_t i = 0; builder && i < json_array_size(names); i++) {
        snprintf(path, sizeof path, "%s/%s/tokenizer.json", s_dir, json_string_value(json_array_get(names, i)));
        FILE *f = fopen(path, "rb");
        if (!f) {
            fprintf(stderr, "SKIP: no %s (tests/tokenizer/%s builds it)\n", path, builder);
            json_decref(cj);
            return 77;
        }
        fclose(f);
    }
    T_CHECK(json_array_size(names) > 0, "corpus.json lists no tokenizers");
    for (size_t i = 0; i < json_array_size(names); i++) {
        const char *name = json_string_value(json_array_get(names, i));
        int bad = s_fixture(name, corpus, &lines_ok, &lines_total);
        fprintf(stderr, "%-11s %s\n", name, bad ? "MISMATCH" : "ids match tokenizers on every line");
        s_random(name, &seed);
    }
    fprintf(stderr, "lines: %d of %d equal to tokenizers %s\n", lines_ok, lines_total,
            json_string_value(json_object_get(cj, "tokenizers_version")));
    if (json_array_size(names) && !strcmp(json_string_value(json_array_get(names, 0)), "bl_qwen2")) {
        s_threads(corpus);
        s_folder();
    }
    s_bad_inputs();
    json_decref(cj);
    return t_done("tokenizer");
}
