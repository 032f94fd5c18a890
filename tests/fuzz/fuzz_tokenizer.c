/* fuzz_tokenizer.c - libFuzzer target for the tokenizer (common/tokenizer.h).
 *
 * The first byte picks the mode:
 *   b & 3 == 0   the rest is a tokenizer.json: it loads or is refused with a message naming
 *                fuzz.json; a loaded one must encode a few strings and decode what it made.
 *   otherwise    the second byte picks one of the fixture tokenizers (tests/tokenizer/fixtures,
 *                relative to the working directory, or $STRATA_TOK_FIXTURES; a built-in one
 *                when they are missing) and the rest is text: it must encode; the ids and the
 *                text read as 16-bit ids must decode to valid UTF-8, and the streaming decoder
 *                must give exactly the batch decode.
 * Any violation aborts; ASan/UBSan/LeakSanitizer catch the rest. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tokenizer.h"
#include "tests/fuzz/fuzz_utf8.h"

static const char *const s_names[] = {"bl_qwen2", "bl_olmoe", "bl_llama3",  "sp_llama", "sp_mistral",
                                      "sp_meta",  "bert_bpe", "suffix_bpe", "bl_o200k"};
static tok_t *s_tok[sizeof s_names / sizeof s_names[0]];
static int s_ntok;

static const char s_builtin[] =
    "{\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":{\"<s>\":0,\"a\":1,\"b\":2,\"ab\":3,\"\\u2581\":4,"
    "\"\\u2581a\":5,\"<0x41>\":6,\"<0xE4>\":7,\"<0xB8>\":8,\"<0xAD>\":9},\"merges\":[\"a b\",[\"\\u2581\",\"a\"]]},"
    "\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFKC\"},{\"type\":\"Prepend\",\"prepend\":"
    "\"\\u2581\"},{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]},"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\",\"content\":\" \","
    "\"start\":1,\"stop\":0}]},\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true}]}";

/* Batch decode, and the stream: same bytes, valid UTF-8 piece by piece. */
static void s_decode_both(const tok_t *tok, const int32_t *ids, size_t n, bool skip)
{
    char *full = NULL;
    size_t fn = 0;
    if (tok_decode(tok, ids, n, skip, &full, &fn)) abort();
    if (!fuzz_valid_utf8((const unsigned char *)full, fn) || full[fn]) abort();
    tok_stream_t *st = NULL;
    if (tok_stream_new(tok, skip, &st)) abort();
    size_t at = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pn;
        if (i < n ? tok_stream_push(st, ids[i], &p, &pn) : tok_stream_flush(st, &p, &pn)) abort();
        if (!fuzz_valid_utf8((const unsigned char *)p, pn)) abort();
        if (at + pn > fn || memcmp(full + at, p, pn)) abort();
        at += pn;
    }
    if (at != fn) abort();
    tok_stream_free(st);
    free(full);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *dir = getenv("STRATA_TOK_FIXTURES");
    if (!dir) dir = "tests/tokenizer/fixtures";
    for (size_t i = 0; i < sizeof s_names / sizeof s_names[0]; i++) {
        char path[1024];
        strata_errbuf_t eb;
        snprintf(path, sizeof path, "%s/%s", dir, s_names[i]);
        if (!tok_load(&s_tok[s_ntok], path, &eb)) s_ntok++;
    }
    if (!s_ntok) {
        strata_errbuf_t eb;
        if (tok_load_json(&s_tok[0], s_builtin, strlen(s_builtin), "builtin.json", &eb)) abort();
        s_ntok = 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 1 << 16) return 0;
    if ((data[0] & 3) == 0) {
        tok_t *tok = NULL;
        strata_errbuf_t eb = {{0}};
        int rc = tok_load_json(&tok, (const char *)data + 1, size - 1, "fuzz.json", &eb);
        if (rc < 0) {
            if (tok || !strstr(eb.msg, "fuzz.json")) abort();
            return 0;
        }
        static const char *const texts[] = {"Hello world", " a  b\t\nc ", "\xe4\xb8\xad\xff x", ""};
        for (size_t t = 0; t < 4; t++) {
            int32_t *ids = NULL;
            size_t n = 0;
            rc = tok_encode(tok, texts[t], strlen(texts[t]), t & 1, &ids, &n);
            if (rc && rc != STRATA_EINVAL_INPUT && rc != STRATA_ETOOLARGE) abort();
            if (!rc) s_decode_both(tok, ids, n, t & 2);
            free(ids);
        }
        int32_t some[40];
        for (int i = 0; i < 40; i++) some[i] = i * 7 % 50 - 2;
        s_decode_both(tok, some, 40, false);
        tok_free(tok);
        return 0;
    }
    const tok_t *tok = s_tok[data[1] % s_ntok];
    const char *text = (const char *)data + 2;
    size_t n = size - 2;
    int32_t *ids = NULL;
    size_t ni = 0;
    int rc = tok_encode(tok, text, n, data[0] & 4, &ids, &ni);
    if (rc && rc != STRATA_EINVAL_INPUT) abort(); /* EINVAL_INPUT: an unk_token missing from the vocab */
    if (!rc) s_decode_both(tok, ids, ni, data[0] & 8);
    free(ids);
    size_t nr = n / 2;
    int32_t *rid = malloc((nr ? nr : 1) * sizeof *rid);
    if (!rid) abort();
    for (size_t i = 0; i < nr; i++) rid[i] = (int32_t)(((uint16_t)(uint8_t)text[2 * i] | (uint16_t)(uint8_t)text[2 * i + 1] << 8) % 1100) - 50;
    s_decode_both(tok, rid, nr, data[0] & 16);
    free(rid);
    return 0;
}
