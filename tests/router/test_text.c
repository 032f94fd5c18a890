/* test_text.c - services/router/text.c: UTF-8 repair and stop strings over any byte split. */
#include <string.h>

#include "services/router/text.h"
#include "tests/unit/check.h"

/* Push `in` split at random points, take after every push; return everything taken. */
static int s_run(const char *in, size_t n, const char **stops, int n_stop, uint64_t *seed, char *out, size_t cap,
                 bool *stopped)
{
    msg_str_t st[8];
    for (int i = 0; i < n_stop; i++) st[i] = msg_str(stops[i]);
    text_stream_t t;
    T_CHECK(text_stream_init(&t, st, n_stop) == 0, "init");
    size_t o = 0, i = 0;
    *stopped = false;
    while (i < n) {
        size_t k = 1 + t_rng_next(seed) % 4;
        if (k > n - i) k = n - i;
        text_stream_push(&t, in + i, k);
        i += k;
        const char *p;
        size_t l;
        *stopped |= text_stream_take(&t, false, &p, &l);
        T_CHECK(o + l < cap, "overflow");
        memcpy(out + o, p, l);
        o += l;
    }
    const char *p;
    size_t l;
    *stopped |= text_stream_take(&t, true, &p, &l);
    memcpy(out + o, p, l);
    o += l;
    out[o] = 0;
    T_CHECK(t.emitted == o, "emitted counter %llu != %zu", (unsigned long long)t.emitted, o);
    text_stream_free(&t);
    return (int)o;
}

static bool s_valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : 9;
        if (k == 9 || i + k >= n + (k ? 0 : 1)) return false;
        for (size_t j = 1; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        i += k + 1;
    }
    return true;
}

int main(void)
{
    uint64_t seed = t_seed();
    char out[4096];
    bool stopped;
    for (int rep = 0; rep < 200; rep++) {
        const char *s1 = "héllo wörld — ok";
        int n = s_run(s1, strlen(s1), NULL, 0, &seed, out, sizeof out, &stopped);
        T_CHECK(n == (int)strlen(s1) && !strcmp(out, s1) && !stopped, "passthrough: '%s'", out);

        const char *stops[] = {"User:", "\n\n"};
        const char *s2 = "answer one\nUse it. User: next";
        s_run(s2, strlen(s2), stops, 2, &seed, out, sizeof out, &stopped);
        T_CHECK(stopped && !strcmp(out, "answer one\nUse it. "), "stop cut: '%s'", out);

        const char *s3 = "a\n\nb User:";
        s_run(s3, strlen(s3), stops, 2, &seed, out, sizeof out, &stopped);
        T_CHECK(stopped && !strcmp(out, "a"), "earliest stop wins: '%s'", out);

        const char *s4 = "ends with Use";
        s_run(s4, strlen(s4), stops, 2, &seed, out, sizeof out, &stopped);
        T_CHECK(!stopped && !strcmp(out, s4), "held-back prefix flushed at the end: '%s'", out);

        const char *st3[] = {"ö"};
        const char *s5 = "abcö";
        s_run(s5, strlen(s5), st3, 1, &seed, out, sizeof out, &stopped);
        T_CHECK(stopped && !strcmp(out, "abc"), "multi-byte stop string: '%s'", out);

        /* invalid bytes become U+FFFD; a truncated sequence at the end too */
        const char s6[] = "a\xff" "b\xe2\x82" "c\xf0\x9f\x98\x80" "\xe2\x82";
        n = s_run(s6, sizeof s6 - 1, NULL, 0, &seed, out, sizeof out, &stopped);
        T_CHECK(!strcmp(out, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD" "c\xf0\x9f\x98\x80\xEF\xBF\xBD"), "repair: '%s'", out);
        T_CHECK(s_valid_utf8((const unsigned char *)out, (size_t)n), "repaired text is valid UTF-8");
        /* overlong and surrogate encodings are invalid */
        const char s7[] = "\xc0\xaf\xed\xa0\x80x";
        s_run(s7, sizeof s7 - 1, NULL, 0, &seed, out, sizeof out, &stopped);
        T_CHECK(s_valid_utf8((const unsigned char *)out, strlen(out)) && out[strlen(out) - 1] == 'x', "overlong/surrogate");
    }
    /* random bytes: always valid UTF-8 out, and ASCII-only inputs pass unchanged */
    for (int rep = 0; rep < 2000; rep++) {
        char in[64];
        size_t n = 1 + t_rng_next(&seed) % 63;
        for (size_t i = 0; i < n; i++) in[i] = (char)t_rng_next(&seed);
        int o = s_run(in, n, NULL, 0, &seed, out, sizeof out, &stopped);
        T_CHECK(s_valid_utf8((const unsigned char *)out, (size_t)o), "random bytes -> valid UTF-8");
    }
    return t_done("test_text");
}
