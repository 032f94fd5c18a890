/* tok_regex.c - Oniguruma regexes (what tokenizers uses) on PCRE2.
 *
 * tokenizers compiles Split / Replace patterns with Oniguruma (Ruby-like syntax, UTF-8,
 * Unicode classes). PCRE2 in UTF + UCP mode agrees on almost everything; the escapes whose
 * Unicode meaning differs are rewritten to explicit classes before compiling:
 *   \s  Onig: U+0009-000D, U+0085, Z*        PCRE2 also matches U+180E
 *   \w  Onig: L, M, N, Pc                    PCRE2 10.42: L, N, '_'
 *   \h  Onig: a hex digit                    PCRE2: horizontal space
 *   \uHHHH  Onig only                        -> \x{HHHH}
 *   (?m)    Onig: dot matches newline        -> (?s)
 * and ^ / $ always match at line boundaries in Onig (PCRE2_MULTILINE). Inside a character
 * class the negated forms (\S \W \H) keep PCRE2's meaning, which is close. The search loop
 * reproduces Onig's find_iter: an empty match right where the previous match ended is
 * skipped by advancing one character. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tok_int.h"

#define WS_CLASS "\\t-\\r\\x{85}\\p{Z}"
#define WORD_CLASS "\\p{L}\\p{M}\\p{N}\\p{Pc}"
#define HEX_CLASS "0-9a-fA-F"

static int s_put(tk_buf_t *b, const char *s) { return tk_buf_put(b, s, strlen(s)); }

static int s_hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Rewrite an Oniguruma pattern into out (see the file comment). */
static int s_translate(const char *p, size_t n, tk_buf_t *out)
{
    bool in_class = false;
    size_t class_start = 0; /* index just after '[' or '[^' */
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[++i];
            int rc = 0;
            switch (d) {
            case 's': rc = s_put(out, in_class ? WS_CLASS : "[" WS_CLASS "]"); break;
            case 'S': rc = s_put(out, in_class ? "\\S" : "[^" WS_CLASS "]"); break;
            case 'w': rc = s_put(out, in_class ? WORD_CLASS : "[" WORD_CLASS "]"); break;
            case 'W': rc = s_put(out, in_class ? "\\W" : "[^" WORD_CLASS "]"); break;
            case 'h': rc = s_put(out, in_class ? HEX_CLASS : "[" HEX_CLASS "]"); break;
            case 'H': rc = s_put(out, in_class ? "\\H" : "[^" HEX_CLASS "]"); break;
            case 'u':
                if (i + 4 < n && s_hexval(p[i + 1]) >= 0 && s_hexval(p[i + 2]) >= 0 && s_hexval(p[i + 3]) >= 0 &&
                    s_hexval(p[i + 4]) >= 0) {
                    char tmp[16];
                    snprintf(tmp, sizeof tmp, "\\x{%.4s}", p + i + 1);
                    rc = s_put(out, tmp);
                    i += 4;
                } else {
                    rc = tk_buf_put(out, "\\u", 2);
                }
                break;
            default: {
                char tmp[2] = {'\\', d};
                rc = tk_buf_put(out, tmp, 2);
            }
            }
            if (rc) return rc;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            if (tk_buf_put(out, "[", 1)) return STRATA_ENOMEM;
            if (i + 1 < n && p[i + 1] == '^') {
                i++;
                if (tk_buf_put(out, "^", 1)) return STRATA_ENOMEM;
            }
            class_start = i + 1;
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            /* POSIX class [:name:], copied through */
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (p[j] == ':' && p[j + 1] == ']') {
                    end = p + j + 2;
                    break;
                }
            if (end) {
                if (tk_buf_put(out, p + i, (size_t)(end - (p + i)))) return STRATA_ENOMEM;
                i = (size_t)(end - p) - 1;
                continue;
            }
        }
        if (in_class && c == ']' && i != class_start) {
            in_class = false;
            if (tk_buf_put(out, "]", 1)) return STRATA_ENOMEM;
            continue;
        }
        if (!in_class && c == '(' && i + 1 < n && p[i + 1] == '?') {
            /* inline options: Onig's m is PCRE2's s */
            size_t j = i + 2;
            while (j < n && (p[j] == 'i' || p[j] == 'm' || p[j] == 's' || p[j] == 'x' || p[j] == '-')) j++;
            if (j > i + 2 && j < n && (p[j] == ':' || p[j] == ')')) {
                if (tk_buf_put(out, "(?", 2)) return STRATA_ENOMEM;
                for (size_t k = i + 2; k < j; k++) {
                    char o = p[k] == 'm' ? 's' : p[k];
                    if (tk_buf_put(out, &o, 1)) return STRATA_ENOMEM;
                }
                i = j - 1;
                continue;
            }
        }
        if (tk_buf_put(out, &c, 1)) return STRATA_ENOMEM;
    }
    return 0;
}

int tk_re_compile(tk_re_t *re, const char *pat, size_t n, bool literal, char *msg, size_t msgcap)
{
    tk_buf_t tb = {0};
    pcre2_compile_context *cc = NULL;
    int rc = 0;
    memset(re, 0, sizeof *re);
    cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
    uint32_t opt = PCRE2_UTF;
    const char *src = pat;
    size_t srcn = n;
    if (literal) {
        opt |= PCRE2_LITERAL;
    } else {
        opt |= PCRE2_UCP | PCRE2_MULTILINE;
        if ((rc = s_translate(pat, n, &tb))) goto fail;
        src = tb.p ? tb.p : "";
        srcn = tb.n;
    }
    int err = 0;
    PCRE2_SIZE eoff = 0;
    re->code = pcre2_compile((PCRE2_SPTR)src, srcn, opt, &err, &eoff, cc);
    if (!re->code) {
        PCRE2_UCHAR ebuf[256];
        pcre2_get_error_message(err, ebuf, sizeof ebuf);
        snprintf(msg, msgcap, "%s at offset %zu", (const char *)ebuf, (size_t)eoff);
        rc = STRATA_EFORMAT;
        goto fail;
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    rc = 0;
fail:
    pcre2_compile_context_free(cc);
    tk_buf_free(&tb);
    return rc;
}

void tk_re_free(tk_re_t *re)
{
    if (re->code) pcre2_code_free(re->code);
    memset(re, 0, sizeof *re);
}

static int s_push(tk_matches_t *mt, uint32_t s, uint32_t e, bool m)
{
    if (mt->n == mt->cap) {
        size_t c = mt->cap ? mt->cap * 2 : 64;
        tk_match_t *v = realloc(mt->v, c * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        mt->v = v;
        mt->cap = c;
    }
    mt->v[mt->n++] = (tk_match_t){s, e, m};
    return 0;
}

int tk_re_find_matches(tk_ws_t *ws, const tk_re_t *re, const char *subj, size_t n, tk_matches_t *mt)
{
    mt->n = 0;
    if (n == 0) return s_push(mt, 0, 0, false);
    size_t prev = 0, last_end = 0, lme = 0;
    bool have_lme = false;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ws->md);
    while (last_end <= n) {
        int rc;
        if (re->jit)
            rc = pcre2_jit_match(re->code, (PCRE2_SPTR)subj, n, last_end, 0, ws->md, ws->mctx);
        else
            rc = pcre2_match(re->code, (PCRE2_SPTR)subj, n, last_end, PCRE2_NO_UTF_CHECK, ws->md, ws->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return STRATA_ETOOLARGE; /* match or stack limit: pathological input */
        size_t s = ov[0], e = ov[1];
        if (e < s) e = s; /* \K tricks */
        if (e == s && have_lme && lme == e) {
            last_end += last_end < n ? (size_t)tk_utf8_len((unsigned char)subj[last_end]) : 1;
            continue;
        }
        last_end = e;
        lme = e;
        have_lme = true;
        if (prev != s && s_push(mt, (uint32_t)prev, (uint32_t)s, false)) return STRATA_ENOMEM;
        if (s_push(mt, (uint32_t)s, (uint32_t)e, true)) return STRATA_ENOMEM;
        prev = e;
    }
    if (prev != n && s_push(mt, (uint32_t)prev, (uint32_t)n, false)) return STRATA_ENOMEM;
    return 0;
}
