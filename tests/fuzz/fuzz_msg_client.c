/* fuzz_msg_client.c - libFuzzer target: the router's decoder of client requests
 * (MSG_FAM_CLIENT), then the router's text stream (services/router/text.c) over the
 * decoded prompt with the decoded stop strings: its output must be valid UTF-8 and must
 * never contain a stop string. */
#include "services/router/text.h"
#include "tests/fuzz/fuzz_msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool s_utf8_ok(const unsigned char *s, size_t n)
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_msg_one(MSG_FAM_CLIENT, data, size);

    msg_t m;
    msg_err_t err;
    if (msg_decode(MSG_FAM_CLIENT, data, size, &m, &err) == 0 && m.type == MSG_GENERATE && m.u.generate.prompt.s) {
        const msg_generate_t *g = &m.u.generate;
        text_stream_t t;
        STRATA_ASSERT(text_stream_init(&t, g->stop, g->n_stop) == 0);
        char *all = malloc(3 * g->prompt.len + 4);
        size_t n = 0, step = 1 + (size % 5);
        for (size_t i = 0; i <= g->prompt.len; i += step) {
            size_t k = g->prompt.len - i < step ? g->prompt.len - i : step;
            bool final = i + k >= g->prompt.len;
            text_stream_push(&t, g->prompt.s + i, k);
            const char *p;
            size_t l;
            bool hit = text_stream_take(&t, final, &p, &l);
            memcpy(all + n, p, l);
            n += l;
            if (hit || final) break;
        }
        STRATA_ASSERT(s_utf8_ok((const unsigned char *)all, n));
        for (int i = 0; i < g->n_stop; i++) STRATA_ASSERT(!memmem(all, n, g->stop[i].s, g->stop[i].len));
        free(all);
        text_stream_free(&t);
    }
    msg_free(&m);
    return 0;
}
