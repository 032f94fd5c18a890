/* tok_regex.c - Oniguruma regexes (what tokenizers uses) on PCRE2.
 *
 * tokenizers compiles Split / Replace patterns with Oniguruma (Ruby-like syntax, UTF-8,
 * Unicode classes). PCRE2 in UTF + UCP mode agrees on almost everything; the escapes whose
 * Unicode meaning differs are rewritten to explicit classes before compiling:
 *   \s  Onig: U+0009-000D, U+0085, Z*        PCRE2 also matches U+180E
 *   \w  Onig: Alphabetic, M, Nd, Pc; outside a class also ²³¹¼½¾ (its Latin-1 table)
 *                                            PCRE2 10.42: L, N, '_'
 *   \b \B  Onig: boundaries of its \w       -> lookarounds on that class
 *   \p{Script}  Onig: Script                 PCRE2: Script_Extensions -> \p{sc:Script}
 *   \h  Onig: a hex digit                    PCRE2: horizontal space
 *   [:punct:] [:alpha:] [:space:] [:word:] [:alnum:] [:digit:] [:upper:] [:lower:]
 *       Onig: Unicode properties (punct is P and S)    PCRE2: mostly ASCII-minded
 *   \uHHHH  Onig only                        -> \x{HHHH}
 *   (?m)    Onig: dot matches newline        -> (?s)
 *   Unicode version  tokenizers 0.23.3's Onig has Unicode 16.0, PCRE2 10.42 14.0, utf8proc 2.8
 *       15.0: the code points assigned since 14.0 (s_ucd_new, s_ucd_new_sc) are added to the
 *       \p{category}, \p{Script}, \d, \w and POSIX classes that hold them, and to the
 *       hand-written matchers' classes (not to a negated class inside [...])
 * and ^ / $ always match at line boundaries in Onig (PCRE2_MULTILINE). Inside a character
 * class the negated forms (\S \W \H) keep PCRE2's meaning, which is close. The search loop
 * reproduces Onig's find_iter: an empty match right where the previous match ended is
 * skipped by advancing one character. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/tok_int.h"

#include <utf8proc.h>

#define WS_CLASS "\\t-\\r\\x{85}\\p{Z}"
#define UWORD "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}"
#define WORD_CLASS UWORD "\\x{B2}\\x{B3}\\x{B9}\\x{BC}-\\x{BE}"
#define HEX_CLASS "0-9a-fA-F"

static int s_put(tk_buf_t *b, const char *s) { return tk_buf_put(b, s, strlen(s)); }

/* Code points unassigned in Unicode 14.0 (PCRE2 10.42's tables) that the Oniguruma of
 * tokenizers 0.23.3 (Unicode 16.0) assigns, with its general category: [lo, hi], ascending and
 * disjoint. Written by tests/tokenizer/gen_ucd_table.py from the library's own answers; with a
 * newer PCRE2 or utf8proc they change nothing (the same code points, the same categories).
 * U+1171E, Mn in 14.0 and Mc in 16.0, is not patched (both are \p{M}). */
static const struct s_ucd_range {
    uint32_t lo, hi;
    char cat[3];
} s_ucd_new[] = {
/* BEGIN gen_ucd_table.py */
    {0x00897, 0x00897, "Mn"},
    {0x00CF3, 0x00CF3, "Mc"},
    {0x00ECE, 0x00ECE, "Mn"},
    {0x01B4E, 0x01B4F, "Po"},
    {0x01B7F, 0x01B7F, "Po"},
    {0x01C89, 0x01C89, "Lu"},
    {0x01C8A, 0x01C8A, "Ll"},
    {0x02427, 0x02429, "So"},
    {0x02FFC, 0x02FFF, "So"},
    {0x031E4, 0x031E5, "So"},
    {0x031EF, 0x031EF, "So"},
    {0x0A7CB, 0x0A7CC, "Lu"},
    {0x0A7CD, 0x0A7CD, "Ll"},
    {0x0A7DA, 0x0A7DA, "Lu"},
    {0x0A7DB, 0x0A7DB, "Ll"},
    {0x0A7DC, 0x0A7DC, "Lu"},
    {0x105C0, 0x105F3, "Lo"},
    {0x10D40, 0x10D49, "Nd"},
    {0x10D4A, 0x10D4D, "Lo"},
    {0x10D4E, 0x10D4E, "Lm"},
    {0x10D4F, 0x10D4F, "Lo"},
    {0x10D50, 0x10D65, "Lu"},
    {0x10D69, 0x10D6D, "Mn"},
    {0x10D6E, 0x10D6E, "Pd"},
    {0x10D6F, 0x10D6F, "Lm"},
    {0x10D70, 0x10D85, "Ll"},
    {0x10D8E, 0x10D8F, "Sm"},
    {0x10EC2, 0x10EC4, "Lo"},
    {0x10EFC, 0x10EFF, "Mn"},
    {0x1123F, 0x11240, "Lo"},
    {0x11241, 0x11241, "Mn"},
    {0x11380, 0x11389, "Lo"},
    {0x1138B, 0x1138B, "Lo"},
    {0x1138E, 0x1138E, "Lo"},
    {0x11390, 0x113B5, "Lo"},
    {0x113B7, 0x113B7, "Lo"},
    {0x113B8, 0x113BA, "Mc"},
    {0x113BB, 0x113C0, "Mn"},
    {0x113C2, 0x113C2, "Mc"},
    {0x113C5, 0x113C5, "Mc"},
    {0x113C7, 0x113CA, "Mc"},
    {0x113CC, 0x113CD, "Mc"},
    {0x113CE, 0x113CE, "Mn"},
    {0x113CF, 0x113CF, "Mc"},
    {0x113D0, 0x113D0, "Mn"},
    {0x113D1, 0x113D1, "Lo"},
    {0x113D2, 0x113D2, "Mn"},
    {0x113D3, 0x113D3, "Lo"},
    {0x113D4, 0x113D5, "Po"},
    {0x113D7, 0x113D8, "Po"},
    {0x113E1, 0x113E2, "Mn"},
    {0x116D0, 0x116E3, "Nd"},
    {0x11B00, 0x11B09, "Po"},
    {0x11BC0, 0x11BE0, "Lo"},
    {0x11BE1, 0x11BE1, "Po"},
    {0x11BF0, 0x11BF9, "Nd"},
    {0x11F00, 0x11F01, "Mn"},
    {0x11F02, 0x11F02, "Lo"},
    {0x11F03, 0x11F03, "Mc"},
    {0x11F04, 0x11F10, "Lo"},
    {0x11F12, 0x11F33, "Lo"},
    {0x11F34, 0x11F35, "Mc"},
    {0x11F36, 0x11F3A, "Mn"},
    {0x11F3E, 0x11F3F, "Mc"},
    {0x11F40, 0x11F40, "Mn"},
    {0x11F41, 0x11F41, "Mc"},
    {0x11F42, 0x11F42, "Mn"},
    {0x11F43, 0x11F4F, "Po"},
    {0x11F50, 0x11F59, "Nd"},
    {0x11F5A, 0x11F5A, "Mn"},
    {0x1342F, 0x1342F, "Lo"},
    {0x13439, 0x1343F, "Cf"},
    {0x13440, 0x13440, "Mn"},
    {0x13441, 0x13446, "Lo"},
    {0x13447, 0x13455, "Mn"},
    {0x13460, 0x143FA, "Lo"},
    {0x16100, 0x1611D, "Lo"},
    {0x1611E, 0x16129, "Mn"},
    {0x1612A, 0x1612C, "Mc"},
    {0x1612D, 0x1612F, "Mn"},
    {0x16130, 0x16139, "Nd"},
    {0x16D40, 0x16D42, "Lm"},
    {0x16D43, 0x16D6A, "Lo"},
    {0x16D6B, 0x16D6C, "Lm"},
    {0x16D6D, 0x16D6F, "Po"},
    {0x16D70, 0x16D79, "Nd"},
    {0x18CFF, 0x18CFF, "Lo"},
    {0x1B132, 0x1B132, "Lo"},
    {0x1B155, 0x1B155, "Lo"},
    {0x1CC00, 0x1CCEF, "So"},
    {0x1CCF0, 0x1CCF9, "Nd"},
    {0x1CD00, 0x1CEB3, "So"},
    {0x1D2C0, 0x1D2D3, "No"},
    {0x1DF25, 0x1DF2A, "Ll"},
    {0x1E030, 0x1E06D, "Lm"},
    {0x1E08F, 0x1E08F, "Mn"},
    {0x1E4D0, 0x1E4EA, "Lo"},
    {0x1E4EB, 0x1E4EB, "Lm"},
    {0x1E4EC, 0x1E4EF, "Mn"},
    {0x1E4F0, 0x1E4F9, "Nd"},
    {0x1E5D0, 0x1E5ED, "Lo"},
    {0x1E5EE, 0x1E5EF, "Mn"},
    {0x1E5F0, 0x1E5F0, "Lo"},
    {0x1E5F1, 0x1E5FA, "Nd"},
    {0x1E5FF, 0x1E5FF, "Po"},
    {0x1F6DC, 0x1F6DC, "So"},
    {0x1F774, 0x1F776, "So"},
    {0x1F77B, 0x1F77F, "So"},
    {0x1F7D9, 0x1F7D9, "So"},
    {0x1F8B2, 0x1F8BB, "So"},
    {0x1F8C0, 0x1F8C1, "So"},
    {0x1FA75, 0x1FA77, "So"},
    {0x1FA87, 0x1FA89, "So"},
    {0x1FA8F, 0x1FA8F, "So"},
    {0x1FAAD, 0x1FAAF, "So"},
    {0x1FABB, 0x1FABF, "So"},
    {0x1FAC6, 0x1FAC6, "So"},
    {0x1FACE, 0x1FACF, "So"},
    {0x1FADA, 0x1FADC, "So"},
    {0x1FADF, 0x1FADF, "So"},
    {0x1FAE8, 0x1FAE9, "So"},
    {0x1FAF7, 0x1FAF8, "So"},
    {0x1FBCB, 0x1FBEF, "So"},
    {0x2B739, 0x2B739, "Lo"},
    {0x2EBF0, 0x2EE5D, "Lo"},
    {0x31350, 0x323AF, "Lo"},
/* END gen_ucd_table.py */
};
#define UCD_NEW_N (sizeof s_ucd_new / sizeof s_ucd_new[0])

/* Those of them in the scripts tokenizer patterns name (\p{Han} ...), with the script. */
static const struct s_ucd_sc_range {
    uint32_t lo, hi;
    char sc[12];
} s_ucd_new_sc[] = {
/* BEGIN gen_ucd_table.py scripts */
    {0x00897, 0x00897, "Arabic"},
    {0x01C89, 0x01C8A, "Cyrillic"},
    {0x0A7CB, 0x0A7CD, "Latin"},
    {0x0A7DA, 0x0A7DC, "Latin"},
    {0x10EC2, 0x10EC4, "Arabic"},
    {0x10EFC, 0x10EFF, "Arabic"},
    {0x11B00, 0x11B09, "Devanagari"},
    {0x1B132, 0x1B132, "Hiragana"},
    {0x1B155, 0x1B155, "Katakana"},
    {0x1DF25, 0x1DF2A, "Latin"},
    {0x1E030, 0x1E06D, "Cyrillic"},
    {0x1E08F, 0x1E08F, "Cyrillic"},
    {0x2B739, 0x2B739, "Han"},
    {0x2EBF0, 0x2EE5D, "Han"},
    {0x31350, 0x323AF, "Han"},
/* END gen_ucd_table.py scripts */
};

/* Whether general category cat ("Lo") is in the class name ("L", "Lo", "L&"/"LC"). */
static bool s_cat_in(const char *cat, const char *name, size_t n)
{
    if (n == 1) return cat[0] == name[0];
    if (n == 2 && (!memcmp(name, "L&", 2) || !memcmp(name, "LC", 2)))
        return cat[0] == 'L' && (cat[1] == 'u' || cat[1] == 'l' || cat[1] == 't');
    return n == 2 && cat[0] == name[0] && cat[1] == name[1];
}

/* Append "\x{lo}-\x{hi}" for the s_ucd_new ranges in any of the classes names[] (NULL-ended). */
static int s_put_new(tk_buf_t *out, const char *const *names)
{
    for (size_t r = 0; r < UCD_NEW_N; r++)
        for (const char *const *nm = names; *nm; nm++)
            if (s_cat_in(s_ucd_new[r].cat, *nm, strlen(*nm))) {
                char tmp[40];
                snprintf(tmp, sizeof tmp, "\\x{%X}-\\x{%X}", s_ucd_new[r].lo, s_ucd_new[r].hi);
                if (s_put(out, tmp)) return STRATA_ENOMEM;
                break;
            }
    return 0;
}

/* Whether any s_ucd_new range is in class name (n bytes). */
static bool s_has_new(const char *name, size_t n)
{
    for (size_t r = 0; r < UCD_NEW_N; r++)
        if (s_cat_in(s_ucd_new[r].cat, name, n)) return true;
    return false;
}

/* Append "\x{lo}-\x{hi}" for the s_ucd_new_sc ranges of script name (n bytes); *any tells
 * whether there are some (out may be NULL to only ask). */
static int s_put_new_sc(tk_buf_t *out, const char *name, size_t n, bool *any)
{
    *any = false;
    for (size_t r = 0; r < sizeof s_ucd_new_sc / sizeof s_ucd_new_sc[0]; r++)
        if (strlen(s_ucd_new_sc[r].sc) == n && !memcmp(s_ucd_new_sc[r].sc, name, n)) {
            *any = true;
            char tmp[40];
            snprintf(tmp, sizeof tmp, "\\x{%X}-\\x{%X}", s_ucd_new_sc[r].lo, s_ucd_new_sc[r].hi);
            if (out && s_put(out, tmp)) return STRATA_ENOMEM;
        }
    return 0;
}

/* General category ("Lo") of a code point unassigned in Unicode 14.0 that the library's
 * Unicode 16.0 assigns (s_ucd_new), else NULL. tok_util.c's character classes use it too. */
const char *tk_ucd_new_cat(uint32_t c)
{
    size_t lo = 0, hi = UCD_NEW_N;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < s_ucd_new[mid].lo) hi = mid;
        else if (c > s_ucd_new[mid].hi) lo = mid + 1;
        else return s_ucd_new[mid].cat;
    }
    return NULL;
}

/* Onig's \w as a class body: UWORD (latin1: WORD_CLASS) and the new letters, marks, digits. */
static int s_put_word(tk_buf_t *out, bool latin1)
{
    static const char *const word[] = {"L", "M", "Nd", "Nl", "Pc", NULL};
    if (s_put(out, latin1 ? WORD_CLASS : UWORD)) return STRATA_ENOMEM;
    return s_put_new(out, word);
}

/* The strings of parts (NULL-ended) in turn, an empty one standing for the \w class body. */
static int s_put_with_word(tk_buf_t *out, const char *const *parts)
{
    for (const char *const *p = parts; *p; p++) {
        int rc = **p ? s_put(out, *p) : s_put_word(out, true);
        if (rc) return rc;
    }
    return 0;
}

static int s_hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* \p{NAME} / \P{NAME}: a name PCRE2 reads as a script means Script in Onig but
 * Script_Extensions in PCRE2, so it becomes sc:NAME; general categories and binary
 * properties stay, and a general category gets the s_ucd_new ranges it holds (but not a
 * negated one inside a class, which PCRE2 cannot subtract from). */
static int s_property(tk_buf_t *out, char pp, const char *name, size_t n, bool in_class)
{
    static const char *const keep[] = {
        "L", "Lu", "Ll", "Lt", "Lm", "Lo", "L&", "LC", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No", "P", "Pc",
        "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So", "Z", "Zs", "Zl", "Zp", "C", "Cc",
        "Cf", "Cs", "Co", "Cn", "Any",
    };
    const char *nm = name;
    size_t nn = n;
    if (nn && nm[0] == '^') {
        nm++;
        nn--;
    }
    bool script = nn > 0 && nn < 64 && !memchr(nm, ':', nn) && !memchr(nm, '=', nn);
    for (size_t k = 0; script && k < sizeof keep / sizeof keep[0]; k++)
        if (strlen(keep[k]) == nn && !memcmp(keep[k], nm, nn)) script = false;
    if (script) { /* only if PCRE2 knows it as a script */
        char pat[80];
        int e;
        PCRE2_SIZE eo;
        snprintf(pat, sizeof pat, "\\p{sc:%.*s}", (int)nn, nm);
        pcre2_code *c = pcre2_compile((PCRE2_SPTR)pat, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &e, &eo, NULL);
        script = c != NULL;
        pcre2_code_free(c);
    }
    bool neg = (pp == 'P') != (nm != name), sc_new = false;
    if (script) s_put_new_sc(NULL, nm, nn, &sc_new);
    /* the C categories hold the unassigned code points, which PCRE2 cannot take out */
    bool cat_new = !script && nn <= 2 && nm[0] != 'C' && nm[0] != 'Z' && s_has_new(nm, nn);
    if ((cat_new || sc_new) && !(in_class && neg)) {
        char one[3] = {0};
        memcpy(one, nm, nn < 2 ? nn : 2);
        const char *const names[] = {one, NULL};
        bool any;
        if (s_put(out, in_class ? "" : neg ? "[^" : "[") || s_put(out, script ? "\\p{sc:" : "\\p{") ||
            tk_buf_put(out, nm, nn) || s_put(out, "}") ||
            (script ? s_put_new_sc(out, nm, nn, &any) : s_put_new(out, names)) || s_put(out, in_class ? "" : "]"))
            return STRATA_ENOMEM;
        return 0;
    }
    char head[4] = {'\\', pp, '{', 0};
    if (s_put(out, head)) return STRATA_ENOMEM;
    if (script && (tk_buf_put(out, name, n - nn) || s_put(out, "sc:"))) return STRATA_ENOMEM;
    if (tk_buf_put(out, nm, nn) || tk_buf_put(out, "}", 1)) return STRATA_ENOMEM;
    return 0;
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
            case 'w': {
                static const char *const w[] = {"[", "", "]", NULL};
                rc = in_class ? s_put_word(out, false) : s_put_with_word(out, w);
                break;
            }
            case 'b': {
                static const char *const b[] = {"(?:(?<=[", "", "])(?![", "", "])|(?<![", "", "])(?=[", "",
                                                "]))", NULL};
                rc = in_class ? s_put(out, "\\b") : s_put_with_word(out, b);
                break;
            }
            case 'B': {
                static const char *const b[] = {"(?:(?<=[", "", "])(?=[", "", "])|(?<![", "", "])(?![", "",
                                                "]))", NULL};
                rc = in_class ? s_put(out, "\\B") : s_put_with_word(out, b);
                break;
            }
            case 'p':
            case 'P':
                if (i + 1 < n && p[i + 1] == '{') {
                    const char *close = memchr(p + i + 2, '}', n - i - 2);
                    if (close) {
                        size_t nl = (size_t)(close - (p + i + 2));
                        rc = s_property(out, d, p + i + 2, nl, in_class);
                        i += nl + 2;
                        break;
                    }
                }
                rc = tk_buf_put(out, d == 'p' ? "\\p" : "\\P", 2);
                break;
            case 'd':
            case 'D': { /* Onig's \d is Nd, with the new digits */
                static const char *const nd[] = {"Nd", NULL};
                if (in_class && d == 'D') rc = s_put(out, "\\D");
                else if (s_put(out, in_class ? "\\d" : d == 'd' ? "[\\d" : "[^\\d") || s_put_new(out, nd) ||
                         s_put(out, in_class ? "" : "]"))
                    rc = STRATA_ENOMEM;
                break;
            }
            case 'W': {
                static const char *const w[] = {"[^", "", "]", NULL};
                rc = in_class ? s_put(out, "\\W") : s_put_with_word(out, w);
                break;
            }
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
            /* POSIX class [:name:]: the Unicode meaning Onig gives it, else copied through */
            static const char *const posix[][4] = { /* name, class body, new code points in */
                {"[:punct:]", "\\p{P}\\p{S}", "P", "S"}, {"[:alpha:]", "\\p{Alphabetic}", "L", "Nl"},
                {"[:space:]", WS_CLASS}, {"[:word:]", ""}, {"[:alnum:]", "\\p{Alphabetic}\\p{Nd}", "L", "N"},
                {"[:digit:]", "\\p{Nd}", "Nd"}, {"[:upper:]", "\\p{Uppercase}", "Lu"},
                {"[:lower:]", "\\p{Lowercase}", "Ll"},
            };
            const char *end = NULL;
            for (size_t j = i + 2; j + 1 < n; j++)
                if (p[j] == ':' && p[j + 1] == ']') {
                    end = p + j + 2;
                    break;
                }
            if (end) {
                size_t len = (size_t)(end - (p + i));
                const char *const *rep = NULL;
                for (size_t k = 0; k < sizeof posix / sizeof posix[0]; k++)
                    if (strlen(posix[k][0]) == len && !memcmp(p + i, posix[k][0], len)) rep = posix[k];
                const char *const extra[] = {rep ? rep[2] : NULL, rep && rep[2] ? rep[3] : NULL, NULL};
                int rc = !rep ? tk_buf_put(out, p + i, len)
                         : !*rep[1] ? s_put_word(out, true)
                                    : s_put(out, rep[1]) || s_put_new(out, extra);
                if (rc) return STRATA_ENOMEM;
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

const char tk_re_gpt2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char s_re_cl100k_n1[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char s_re_cl100k_n3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

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
    if (literal && n) {
        if (!(re->lit = malloc(n))) {
            rc = STRATA_ENOMEM;
            goto fail;
        }
        memcpy(re->lit, pat, n);
        re->lit_n = n;
    }
    if (!literal && n == strlen(tk_re_gpt2) && !memcmp(pat, tk_re_gpt2, n)) re->fast = RE_GPT2;
    if (!literal && n == strlen(s_re_cl100k_n1) && !memcmp(pat, s_re_cl100k_n1, n)) re->fast = RE_CL100K_N1;
    if (!literal && n == strlen(s_re_cl100k_n3) && !memcmp(pat, s_re_cl100k_n3, n)) re->fast = RE_CL100K_N3;
    rc = 0;
fail:
    pcre2_compile_context_free(cc);
    tk_buf_free(&tb);
    return rc;
}

void tk_re_free(tk_re_t *re)
{
    if (re->code) pcre2_code_free(re->code);
    free(re->lit);
    memset(re, 0, sizeof *re);
}

/* ---------------------------------------------------------------- hand-written matchers
 * Classes as the translated regex sees them: L = \p{L}, N = \p{N} (both with s_ucd_new),
 * S = \s (U+0009-000D, U+0085, Z*). Every char is L, N, S or "other", and each pattern matches at every position,
 * so the matches cover the subject with no gaps; a matcher returns the end of the match at i,
 * taking the alternatives in order, with the backtracking the regex engine would do. */
enum { CL_L = 1, CL_N = 2, CL_S = 4 };

/* ASCII classes */
#define A_L CL_L, CL_L, CL_L, CL_L, CL_L, CL_L, CL_L, CL_L, CL_L, CL_L, CL_L, CL_L, CL_L
static const unsigned char s_ascii_cls[128] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, CL_S, CL_S, CL_S, CL_S, CL_S, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    CL_S, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    CL_N, CL_N, CL_N, CL_N, CL_N, CL_N, CL_N, CL_N, CL_N, CL_N, 0, 0, 0, 0, 0, 0,
    0, A_L, A_L, 0, 0, 0, 0, 0,
    0, A_L, A_L, 0, 0, 0, 0, 0,
};

static inline int s_class(uint32_t c)
{
    if (c < 0x80) return s_ascii_cls[c];
    if (c == 0x85) return CL_S;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: return CL_L;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO: return CL_N;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: return CL_S;
    case UTF8PROC_CATEGORY_CN: { /* assigned since utf8proc's Unicode version? */
        const char *cat = tk_ucd_new_cat(c);
        return !cat ? 0 : cat[0] == 'L' ? CL_L : cat[0] == 'N' ? CL_N : 0;
    }
    default: return 0;
    }
}

/* Class of the char at i (n > i), and its length. */
static inline int s_cls_at(const unsigned char *p, size_t n, size_t i, int *len)
{
    if (p[i] < 0x80) {
        *len = 1;
        return s_class(p[i]);
    }
    return s_class(tk_utf8_dec(p + i, n - i, len));
}

/* End of the run of chars of class k (0 = other) starting at i, at most max chars. */
static inline size_t s_run(const unsigned char *p, size_t n, size_t i, int k, size_t max)
{
    size_t cnt = 0;
    if (max == SIZE_MAX)
        while (i < n && p[i] < 0x80 && s_ascii_cls[p[i]] == k) i++;
    while (i < n && cnt < max) {
        int l;
        if (s_cls_at(p, n, i, &l) != k) break;
        i += (size_t)l;
        cnt++;
    }
    return i;
}

/* \s+(?!\S) | \s+ at i (p[i] is S). */
static size_t s_space_tail(const unsigned char *p, size_t n, size_t i)
{
    size_t j = i, last = i;
    while (j < n) {
        int l;
        if (s_cls_at(p, n, j, &l) != CL_S) break;
        last = j;
        j += (size_t)l;
    }
    if (j == n) return j;             /* (?!\S) holds at the end */
    return last > i ? last : j;       /* give back one char, unless that leaves nothing */
}

static size_t s_gpt2_at(const unsigned char *p, size_t n, size_t i)
{
    if (p[i] == '\'' && i + 1 < n) {
        unsigned char a = p[i + 1];
        if (a == 's' || a == 't') return i + 2;
        if (i + 2 < n && ((a == 'r' && p[i + 2] == 'e') || (a == 'v' && p[i + 2] == 'e'))) return i + 3;
        if (a == 'm') return i + 2;
        if (i + 2 < n && a == 'l' && p[i + 2] == 'l') return i + 3;
        if (a == 'd') return i + 2;
    }
    int l;
    int k = s_cls_at(p, n, i, &l);
    if (p[i] == ' ' && i + 1 < n) {
        int l2;
        int k2 = s_cls_at(p, n, i + 1, &l2);
        if (k2 != CL_S) return s_run(p, n, i + 1, k2, SIZE_MAX); /* " ?" + L+, N+ or other+ */
    }
    if (k != CL_S) return s_run(p, n, i, k, SIZE_MAX);
    return s_space_tail(p, n, i);
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d): the letter(s) after p[i] == '\'', case-insensitively (U+017F
 * LONG S folds to s). Returns the match end or 0. */
static size_t s_contraction_ci(const unsigned char *p, size_t n, size_t i)
{
    if (i + 1 >= n) return 0;
    unsigned char a = p[i + 1], b = i + 2 < n ? p[i + 2] : 0;
    unsigned char la = (unsigned char)(a | 0x20), lb = (unsigned char)(b | 0x20);
    if (la >= 'a' && la <= 'z') {
        if (la == 's' || la == 't') return i + 2;
        if ((la == 'r' || la == 'v') && lb == 'e') return i + 3;
        if (la == 'm') return i + 2;
        if (la == 'l' && lb == 'l') return i + 3;
        if (la == 'd') return i + 2;
    }
    if (a == 0xC5 && b == 0xBF) return i + 3; /* 'ſ */
    return 0;
}

static size_t s_cl100k_at(const unsigned char *p, size_t n, size_t i, size_t nmax)
{
    if (p[i] == '\'') {
        size_t e = s_contraction_ci(p, n, i);
        if (e) return e;
    }
    int l;
    int k = s_cls_at(p, n, i, &l);
    size_t next = i + (size_t)l;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (k == CL_L) return s_run(p, n, i, CL_L, SIZE_MAX);
    if (k != CL_N && p[i] != '\r' && p[i] != '\n' && next < n) {
        int l2;
        if (s_cls_at(p, n, next, &l2) == CL_L) return s_run(p, n, next, CL_L, SIZE_MAX);
    }
    /* \p{N} or \p{N}{1,3} */
    if (k == CL_N) return s_run(p, n, i, CL_N, nmax);
    /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
    size_t o = 0;
    if (p[i] == ' ' && next < n) {
        int l2;
        if (s_cls_at(p, n, next, &l2) == 0) o = s_run(p, n, next, 0, SIZE_MAX);
    }
    if (!o && k == 0) o = s_run(p, n, i, 0, SIZE_MAX);
    if (o) {
        while (o < n && (p[o] == '\r' || p[o] == '\n')) o++;
        return o;
    }
    /* p[i] is S: \s*[\r\n]+ , then \s+(?!\S) , then \s+ */
    size_t j = i, lastnl = SIZE_MAX;
    while (j < n) {
        int l2;
        if (s_cls_at(p, n, j, &l2) != CL_S) break;
        if (p[j] == '\r' || p[j] == '\n') lastnl = j;
        j += (size_t)l2;
    }
    if (lastnl != SIZE_MAX) return lastnl + 1;
    return s_space_tail(p, n, i);
}

static int s_fast_matches(int kind, const char *subj, size_t n, tk_matches_t *mt)
{
    const unsigned char *p = (const unsigned char *)subj;
    size_t i = 0;
    while (i < n) {
        size_t e = kind == RE_GPT2 ? s_gpt2_at(p, n, i) : s_cl100k_at(p, n, i, kind == RE_CL100K_N1 ? 1 : 3);
        if (e <= i) e = i + (size_t)tk_utf8_len(p[i]); /* cannot happen: every char matches */
        if (tk_mt_push(mt, (uint32_t)i, (uint32_t)e, true)) return STRATA_ENOMEM;
        i = e;
    }
    return 0;
}

int tk_re_find_matches(tk_ws_t *ws, const tk_re_t *re, const char *subj, size_t n, tk_matches_t *mt)
{
    mt->n = 0;
    if (n == 0) return tk_mt_push(mt, 0, 0, false);
    if (re->fast) return s_fast_matches(re->fast, subj, n, mt);
    if (re->lit) { /* leftmost non-overlapping occurrences of a non-empty literal */
        size_t prev = 0, i = 0;
        while (i + re->lit_n <= n) {
            const char *f = re->lit_n == 1 ? memchr(subj + i, re->lit[0], n - i)
                                           : memmem(subj + i, n - i, re->lit, re->lit_n);
            if (!f) break;
            size_t s = (size_t)(f - subj);
            if (prev != s && tk_mt_push(mt, (uint32_t)prev, (uint32_t)s, false)) return STRATA_ENOMEM;
            if (tk_mt_push(mt, (uint32_t)s, (uint32_t)(s + re->lit_n), true)) return STRATA_ENOMEM;
            i = prev = s + re->lit_n;
        }
        if (prev != n && tk_mt_push(mt, (uint32_t)prev, (uint32_t)n, false)) return STRATA_ENOMEM;
        return 0;
    }
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
        if (prev != s && tk_mt_push(mt, (uint32_t)prev, (uint32_t)s, false)) return STRATA_ENOMEM;
        if (tk_mt_push(mt, (uint32_t)s, (uint32_t)e, true)) return STRATA_ENOMEM;
        prev = e;
    }
    if (prev != n && tk_mt_push(mt, (uint32_t)prev, (uint32_t)n, false)) return STRATA_ENOMEM;
    return 0;
}
