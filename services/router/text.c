/* text.c - UTF-8 repair and stop strings for streamed text (see text.h). */
#include "services/router/text.h"

#include <stdlib.h>
#include <string.h>

int text_stream_init(text_stream_t *t, const msg_str_t *stop, int n_stop)
{
    memset(t, 0, sizeof *t);
    t->raw = malloc(4);
    if (!t->raw) goto fail;
    if (n_stop > 0) {
        t->stop = calloc((size_t)n_stop, sizeof *t->stop);
        t->stop_len = calloc((size_t)n_stop, sizeof *t->stop_len);
        if (!t->stop || !t->stop_len) goto fail;
        t->n_stop = n_stop;
        for (int i = 0; i < n_stop; i++) {
            t->stop[i] = malloc(stop[i].len + 1);
            if (!t->stop[i]) goto fail;
            memcpy(t->stop[i], stop[i].s, stop[i].len);
            t->stop[i][stop[i].len] = 0;
            t->stop_len[i] = stop[i].len;
        }
    }
    return 0;
fail:
    text_stream_free(t);
    return STRATA_ENOMEM;
}

void text_stream_free(text_stream_t *t)
{
    for (int i = 0; i < t->n_stop; i++) free(t->stop ? t->stop[i] : NULL);
    free(t->stop);
    free(t->stop_len);
    free(t->raw);
    free(t->pend);
    free(t->out);
    memset(t, 0, sizeof *t);
}

static int s_pend_add(text_stream_t *t, const char *p, size_t n)
{
    if (t->pend_cap - t->pend_len < n) {
        size_t cap = t->pend_cap ? t->pend_cap : 256;
        while (cap - t->pend_len < n) cap *= 2;
        char *np = realloc(t->pend, cap);
        if (!np) return STRATA_ENOMEM;
        t->pend = np;
        t->pend_cap = cap;
    }
    memcpy(t->pend + t->pend_len, p, n);
    t->pend_len += n;
    return 0;
}

/* Length of the UTF-8 sequence led by c (0 = not a lead byte). */
static size_t s_seq_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

/* Is s[0..k) (k <= need) a valid start of a sequence of length need? Checks the second
 * byte's special ranges (overlongs, surrogates, > U+10FFFF). */
static bool s_valid_prefix(const unsigned char *s, size_t k)
{
    size_t need = s_seq_len(s[0]);
    if (need == 0) return false;
    for (size_t i = 1; i < k; i++) {
        unsigned char c = s[i];
        unsigned lo = 0x80, hi = 0xBF;
        if (i == 1) {
            if (s[0] == 0xE0) lo = 0xA0;
            else if (s[0] == 0xED) hi = 0x9F;
            else if (s[0] == 0xF0) lo = 0x90;
            else if (s[0] == 0xF4) hi = 0x8F;
        }
        if (c < lo || c > hi) return false;
    }
    return true;
}

static const char s_repl[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

int text_stream_push(text_stream_t *t, const void *bytes, size_t n)
{
    const unsigned char *p = bytes;
    if (t->stopped) return 0;
    for (size_t i = 0; i < n; i++) {
        t->raw[t->raw_len++] = (char)p[i];
        const unsigned char *r = (const unsigned char *)t->raw;
        /* Reduce raw until it is empty or a valid incomplete prefix. */
        while (t->raw_len > 0) {
            size_t need = s_seq_len(r[0]);
            if (need == 0) {
                if (s_pend_add(t, s_repl, 3) < 0) return STRATA_ENOMEM;
                memmove(t->raw, t->raw + 1, --t->raw_len);
                continue;
            }
            size_t have = t->raw_len < need ? t->raw_len : need;
            if (!s_valid_prefix(r, have)) {
                /* a bad byte after a valid start: the maximal valid start becomes one U+FFFD
                 * (as Python's decode(errors="replace") does); the bad byte is read again */
                size_t k = 1;
                while (k < have && s_valid_prefix(r, k + 1)) k++;
                if (s_pend_add(t, s_repl, 3) < 0) return STRATA_ENOMEM;
                memmove(t->raw, t->raw + k, t->raw_len - k);
                t->raw_len -= k;
                continue;
            }
            if (t->raw_len < need) break; /* wait for more */
            if (s_pend_add(t, t->raw, need) < 0) return STRATA_ENOMEM;
            memmove(t->raw, t->raw + need, t->raw_len - need);
            t->raw_len -= need;
        }
    }
    return 0;
}

bool text_stream_take(text_stream_t *t, bool final, const char **out, size_t *n)
{
    *out = t->out;
    *n = 0;
    if (t->stopped) {
        t->pend_len = 0;
        return true;
    }
    if (final && t->raw_len) {
        /* an incomplete sequence at the very end */
        t->raw_len = 0;
        if (s_pend_add(t, s_repl, 3) < 0) return false;
    }
    /* earliest stop string match */
    size_t cut = t->pend_len;
    bool hit = false;
    for (int i = 0; i < t->n_stop; i++) {
        size_t L = t->stop_len[i];
        if (L > t->pend_len) continue;
        char *m = memmem(t->pend, t->pend_len, t->stop[i], L);
        if (m && (size_t)(m - t->pend) < cut) {
            cut = (size_t)(m - t->pend);
            hit = true;
        }
    }
    if (hit) {
        t->stopped = true;
        t->raw_len = 0;
    } else if (!final) {
        /* hold back the longest suffix that is a proper prefix of a stop string */
        size_t hold = 0;
        for (int i = 0; i < t->n_stop; i++) {
            size_t L = t->stop_len[i];
            size_t maxk = L - 1 < t->pend_len ? L - 1 : t->pend_len;
            for (size_t k = maxk; k > hold; k--)
                if (!memcmp(t->pend + t->pend_len - k, t->stop[i], k)) {
                    hold = k;
                    break;
                }
        }
        cut = t->pend_len - hold;
    }
    /* Hand pend[0..cut) out through t->out, keep the rest (held back) at pend's front. */
    if (t->out_cap < cut + 1) {
        size_t cap = t->out_cap ? t->out_cap : 256;
        while (cap < cut + 1) cap *= 2;
        char *no = realloc(t->out, cap);
        if (!no) return hit;
        t->out = no;
        t->out_cap = cap;
    }
    if (cut) memcpy(t->out, t->pend, cut);
    t->out[cut] = 0;
    size_t rest = hit ? 0 : t->pend_len - cut;
    memmove(t->pend, t->pend + cut, rest);
    t->pend_len = rest;
    t->emitted += cut;
    *out = t->out;
    *n = cut;
    return hit;
}
