/* test_tok_regex.c - the hand-written pre-tokenizer matchers (GPT-2, Qwen2, Llama 3 patterns)
 * give exactly PCRE2's matches of the same regex, on random strings (STRATA_SEED) built from
 * the characters where the alternatives differ: spaces of every kind, newlines, letters,
 * digits of several scripts, apostrophes and contraction letters, marks, emoji, letters and
 * digits newer than PCRE2's and utf8proc's Unicode tables (common/tok_regex.c's s_ucd_new). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tok_int.h"
#include "tests/unit/check.h"

static const uint32_t s_pool[] = {
    ' ', ' ', ' ', '\t', '\n', '\n', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x1680, 0x2000, 0x2009, 0x2028, 0x2029,
    0x202F, 0x3000, 0x180E, 0x200B, 'a', 'b', 'z', 'A', 'Q', 's', 'S', 't', 'T', 'r', 'R', 'e', 'E', 'v',
    'V', 'm', 'M', 'l', 'L', 'd', 'D', 0x17F, 0xE9, 0x3B1, 0x416, 0x4E2D, 0x6587, 0xAC00, 0x5D0, 0x627,
    '0', '1', '9', 0x663, 0xB2, 0x216B, 0xBD, 0x2460, '\'', '\'', '\'', '"', '.', ',', '!', '?', '-', '_',
    '(', '$', '<', '>', '/', 0x2019, 0x301, 0x308, 0x200D, 0x1F600, 0x1F44D, 0x1F3FD, 0xFFFD, 0x0, 0x7F,
    0x31350, 0x2EBF0, 0x13460, 0x1C89, 0x1CCF0, 0x11F50, 0x1E4D0, 0x323B0, /* new in Unicode 15-16, unassigned */
};

static const char s_n1[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                           "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char s_n3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                           "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int main(void)
{
    uint64_t seed = t_seed();
    const char *pats[] = {tk_re_gpt2, s_n1, s_n3};
    const int kinds[] = {RE_GPT2, RE_CL100K_N1, RE_CL100K_N3};
    static const char good[] = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}";
    tok_t *tok = NULL;
    strata_errbuf_t eb;
    T_CHECK(tok_load_json(&tok, good, strlen(good), "t.json", &eb) == 0, "load: %s", eb.msg);
    if (!tok) return t_done("tok_regex");
    tk_ws_t *ws = tk_ws_get(tok);
    tk_matches_t a = {0}, b = {0};
    for (int k = 0; k < 3; k++) {
        tk_re_t fast, slow;
        char msg[128];
        T_CHECK(tk_re_compile(&fast, pats[k], strlen(pats[k]), false, msg, sizeof msg) == 0, "compile %d", k);
        T_CHECK(tk_re_compile(&slow, pats[k], strlen(pats[k]), false, msg, sizeof msg) == 0, "compile %d", k);
        T_CHECK(fast.fast == kinds[k], "pattern %d is not recognised for the fast path", k);
        slow.fast = RE_PCRE;
        int bad = 0;
        for (int it = 0; it < 20000; it++) {
            char s[256];
            size_t n = 0, len = t_rng_next(&seed) % 24;
            for (size_t i = 0; i < len; i++) n += (size_t)tk_utf8_enc(s_pool[t_rng_next(&seed) % (sizeof s_pool / 4)], s + n);
            if (tk_re_find_matches(ws, &fast, s, n, &a) || tk_re_find_matches(ws, &slow, s, n, &b)) {
                T_CHECK(0, "find_matches failed");
                break;
            }
            bool same = a.n == b.n;
            for (size_t i = 0; same && i < a.n; i++)
                same = a.v[i].s == b.v[i].s && a.v[i].e == b.v[i].e && a.v[i].m == b.v[i].m;
            if (!same && bad++ < 5) {
                fprintf(stderr, "pattern %d differs on:", k);
                for (size_t i = 0; i < n; i++) fprintf(stderr, " %02x", (unsigned char)s[i]);
                fprintf(stderr, "\n  fast:");
                for (size_t i = 0; i < a.n; i++) fprintf(stderr, " [%u,%u)%s", a.v[i].s, a.v[i].e, a.v[i].m ? "" : "-");
                fprintf(stderr, "\n  pcre:");
                for (size_t i = 0; i < b.n; i++) fprintf(stderr, " [%u,%u)%s", b.v[i].s, b.v[i].e, b.v[i].m ? "" : "-");
                fprintf(stderr, "\n");
            }
        }
        T_CHECK(bad == 0, "pattern %d: %d of 20000 strings differ between the fast matcher and PCRE2", k, bad);
        tk_re_free(&fast);
        tk_re_free(&slow);
    }
    free(a.v);
    free(b.v);
    tk_ws_put(tok, ws);
    tok_free(tok);
    return t_done("tok_regex");
}
