/* jinja_parse.c - template source to syntax tree, as jinja2 3.1's lexer and parser do it.
 *
 * Lexing follows jinja2.lexer with trim_blocks and lstrip_blocks on: the source's newlines
 * are normalised (\r\n and \r become \n) and one trailing newline is dropped; "{%-", "{{-"
 * and "{#-" strip the whitespace before the tag, "-%}", "-}}" and "-#}" the whitespace after
 * it; a block or comment tag alone on its line (after spaces and tabs only) takes that
 * indentation away unless it starts "{%+"; a newline right after "%}" or "#}" is dropped
 * unless the tag ends "+%}". Whitespace means Python's str.isspace() characters.
 *
 * Parsing follows jinja2.parser's grammar and operator precedence. Filter and test names are
 * resolved here, so a template using one this engine lacks is refused before any render.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja_int.h"

#define J_MAX_NEST 64 /* nested expressions, and nested blocks */

typedef enum {
    T_EOF = 0, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT,
    /* operators */
    T_ADD, T_SUB, T_DIV, T_FLOORDIV, T_MUL, T_MOD, T_POW, T_TILDE, T_LBRACKET, T_RBRACKET, T_LPAREN, T_RPAREN,
    T_LBRACE, T_RBRACE, T_EQ, T_NE, T_GT, T_GTEQ, T_LT, T_LTEQ, T_ASSIGN, T_DOT, T_COLON, T_PIPE, T_COMMA,
    T_SEMICOLON,
} tok_kind_t;

typedef struct {
    uint8_t kind;
    int line;
    const char *s; /* T_NAME: interned name; T_STRING/T_DATA: text (s, n) */
    size_t n;
    int64_t i;
    double f;
} tok_t;

typedef struct {
    jinja_template_t *t;
    strata_errbuf_t *eb;
    int err; /* 0, or the error code recorded */
    const char *src;
    size_t len;
    tok_t *toks;
    size_t ntok, cap;
    size_t pos; /* parser position */
    int nest;
    int loop_depth; /* for loops around the current statement, within the current macro */
} P;

static int s_fail(P *p, int code, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int s_fail(P *p, int code, int line, const char *fmt, ...)
{
    if (p->err) return -1;
    p->err = code;
    char msg[440];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->eb) snprintf(p->eb->msg, sizeof p->eb->msg, "line %d: %s", line, msg);
    return -1;
}

static void *s_alloc(P *p, size_t n)
{
    void *q = ja_alloc(&p->t->a, n);
    if (!q) s_fail(p, STRATA_ENOMEM, 0, "out of memory");
    else memset(q, 0, n);
    return q;
}

static const char *s_intern(P *p, const char *s, size_t n)
{
    char *q = s_alloc(p, n + 1);
    if (!q) return NULL;
    memcpy(q, s, n);
    q[n] = 0;
    return q;
}

/* ------------------------------------------------------------------------------------------ */
/* lexer */

static int s_push(P *p, tok_t t)
{
    if (p->ntok == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        tok_t *q = ja_grow(&p->t->a, p->toks, p->cap * sizeof(tok_t), nc * sizeof(tok_t));
        if (!q) return s_fail(p, STRATA_ENOMEM, t.line, "out of memory");
        p->toks = q;
        p->cap = nc;
    }
    p->toks[p->ntok++] = t;
    return 0;
}

static int s_lines(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* Length of the run of Python whitespace at s[i..n). */
static size_t s_ws_run(const char *s, size_t n, size_t i)
{
    size_t j = i;
    while (j < n) {
        size_t k = j;
        uint32_t cp = ju8_next(s, n, &k);
        if (!jpy_isspace(cp)) break;
        j = k;
    }
    return j - i;
}

/* Start of the whitespace that ends s[0..n). */
static size_t s_rstrip_at(const char *s, size_t n)
{
    size_t j = n;
    while (j > 0) {
        size_t st = j - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t k = st;
        uint32_t cp = ju8_next(s, n, &k);
        if (!jpy_isspace(cp)) break;
        j = st;
    }
    return j;
}

static bool s_is_raw_begin(const char *s, size_t n, size_t i, size_t *end, char *sign)
{
    /* "{%" [-+]? \s* "raw" \s* ("-%}" \s* | "%}") */
    size_t j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    j += s_ws_run(s, n, j);
    if (j + 3 > n || memcmp(s + j, "raw", 3)) return false;
    j += 3;
    j += s_ws_run(s, n, j);
    if (j + 3 <= n && !memcmp(s + j, "-%}", 3)) {
        j += 3;
        j += s_ws_run(s, n, j);
    } else if (j + 2 <= n && !memcmp(s + j, "%}", 2)) {
        j += 2;
    } else {
        return false;
    }
    *end = j;
    return true;
}

static bool s_is_endraw(const char *s, size_t n, size_t i, size_t *end, char *sign)
{
    /* "{%" [-+]? \s* "endraw" \s* ("+%}" | "-%}" \s* | "%}" \n?) */
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%') return false;
    size_t j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    j += s_ws_run(s, n, j);
    if (j + 6 > n || memcmp(s + j, "endraw", 6)) return false;
    j += 6;
    j += s_ws_run(s, n, j);
    if (j + 3 <= n && !memcmp(s + j, "+%}", 3)) j += 3;
    else if (j + 3 <= n && !memcmp(s + j, "-%}", 3)) { j += 3; j += s_ws_run(s, n, j); }
    else if (j + 2 <= n && !memcmp(s + j, "%}", 2)) { j += 2; if (j < n && s[j] == '\n') j++; }
    else return false;
    *end = j;
    return true;
}

/* Emit text s[a..b) as data, after the whitespace control the next tag asks for. */
static int s_emit_data(P *p, size_t a, size_t b, char sign, bool lstrip_ok, bool line_starting, int line)
{
    const char *s = p->src;
    size_t e = b;
    if (sign == '-') {
        e = a + s_rstrip_at(s + a, b - a);
    } else if (sign != '+' && lstrip_ok) {
        size_t lpos = a;
        for (size_t k = b; k > a; k--)
            if (s[k - 1] == '\n') { lpos = k; break; }
        if ((lpos > a || line_starting) && lpos < b && s_ws_run(s, b, lpos) == b - lpos) e = lpos;
    }
    if (e > a) {
        tok_t t = {.kind = T_DATA, .line = line, .s = s + a, .n = e - a};
        return s_push(p, t);
    }
    return 0;
}

static int s_unescape(P *p, int line, const char *s, size_t n, const char **out, size_t *outn)
{
    char *o = s_alloc(p, n + 1);
    if (!o) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            o[k++] = s[i++];
            continue;
        }
        if (i + 1 >= n) return s_fail(p, STRATA_EFORMAT, line, "\\ at end of string");
        char e = s[i + 1];
        i += 2;
        uint32_t cp;
        int nd;
        switch (e) {
        case '\n': continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = '\a'; continue;
        case 'b': o[k++] = '\b'; continue;
        case 'f': o[k++] = '\f'; continue;
        case 'n': o[k++] = '\n'; continue;
        case 'r': o[k++] = '\r'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'v': o[k++] = '\v'; continue;
        case 'x': nd = 2; goto hex;
        case 'u': nd = 4; goto hex;
        case 'U': nd = 8; goto hex;
        case 'N':
            return s_fail(p, STRATA_EUNSUPPORTED, line, "the \\N{...} string escape is not supported");
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && i < n && s[i] >= '0' && s[i] <= '7'; d++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += ju8_put(o + k, cp);
                continue;
            }
            if ((unsigned char)e >= 0x80)
                return s_fail(p, STRATA_EUNSUPPORTED, line, "a backslash before a non-ASCII character is not supported");
            o[k++] = '\\';
            o[k++] = e;
            continue;
        }
    hex:
        cp = 0;
        for (int d = 0; d < nd; d++) {
            char h = i < n ? s[i] : 0;
            int v = h >= '0' && h <= '9' ? h - '0' : (h | 0x20) >= 'a' && (h | 0x20) <= 'f' ? (h | 0x20) - 'a' + 10 : -1;
            if (v < 0) return s_fail(p, STRATA_EFORMAT, line, "truncated \\%c escape in a string", e);
            cp = cp * 16 + (uint32_t)v;
            i++;
        }
        if (cp > 0x10FFFF) return s_fail(p, STRATA_EFORMAT, line, "illegal Unicode character in a string");
        if (cp >= 0xD800 && cp <= 0xDFFF)
            return s_fail(p, STRATA_EUNSUPPORTED, line, "a surrogate code point in a string is not supported");
        k += ju8_put(o + k, cp);
    }
    o[k] = 0;
    *out = o;
    *outn = k;
    return 0;
}

static bool s_isdig(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at s[i..); returns the end, or i when it does not match. */
static size_t s_digits(const char *s, size_t n, size_t i)
{
    size_t j = i;
    if (j >= n || !s_isdig(s[j])) return i;
    while (j < n && s_isdig(s[j])) j++;
    while (j + 1 < n && s[j] == '_' && s_isdig(s[j + 1])) {
        j++;
        while (j < n && s_isdig(s[j])) j++;
    }
    return j;
}

static size_t s_match_float(const char *s, size_t n, size_t i)
{
    if (i > 0 && s[i - 1] == '.') return 0;
    size_t j = s_digits(s, n, i);
    if (j == i) return 0;
    size_t fr = j;
    if (j < n && s[j] == '.') {
        size_t k = s_digits(s, n, j + 1);
        if (k > j + 1) fr = k;
    }
    /* exponent */
    size_t ex = fr;
    if (ex < n && (s[ex] | 0x20) == 'e') {
        size_t k = ex + 1;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        size_t m = s_digits(s, n, k);
        if (m > k) return m - i;
    }
    if (fr > j) return fr - i;
    return 0;
}

static size_t s_match_int(const char *s, size_t n, size_t i, int *base)
{
    *base = 10;
    if (s[i] == '0' && i + 1 < n) {
        char x = (char)(s[i + 1] | 0x20);
        int b = x == 'b' ? 2 : x == 'o' ? 8 : x == 'x' ? 16 : 0;
        if (b) {
            size_t j = i + 2;
            size_t k = j;
            for (;;) {
                size_t m = k;
                if (m < n && s[m] == '_') m++;
                char h = m < n ? (char)(s[m] | 0x20) : 0;
                int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : 99;
                if (v >= b) break;
                k = m + 1;
            }
            if (k > j) {
                *base = b;
                return k - i;
            }
        }
    }
    if (s[i] >= '1' && s[i] <= '9') {
        size_t k = i + 1;
        for (;;) {
            size_t m = k;
            if (m < n && s[m] == '_') m++;
            if (m < n && s_isdig(s[m])) k = m + 1;
            else break;
        }
        return k - i;
    }
    if (s[i] == '0') {
        size_t k = i + 1;
        for (;;) {
            size_t m = k;
            if (m < n && s[m] == '_') m++;
            if (m < n && s[m] == '0') k = m + 1;
            else break;
        }
        return k - i;
    }
    return 0;
}

static const struct {
    const char *s;
    uint8_t kind;
} s_ops[] = {
    {"//", T_FLOORDIV}, {"**", T_POW}, {"==", T_EQ}, {"!=", T_NE}, {">=", T_GTEQ}, {"<=", T_LTEQ},
    {"+", T_ADD}, {"-", T_SUB}, {"/", T_DIV}, {"*", T_MUL}, {"%", T_MOD}, {"~", T_TILDE}, {"[", T_LBRACKET},
    {"]", T_RBRACKET}, {"(", T_LPAREN}, {")", T_RPAREN}, {"{", T_LBRACE}, {"}", T_RBRACE}, {">", T_GT},
    {"<", T_LT}, {"=", T_ASSIGN}, {".", T_DOT}, {":", T_COLON}, {"|", T_PIPE}, {",", T_COMMA}, {";", T_SEMICOLON},
};

/* Tokens of one {{ }} or {% %} tag from *ip; stops after the end delimiter. */
static int s_lex_tag(P *p, size_t *ip, int *line, bool block, bool *line_starting)
{
    const char *s = p->src;
    size_t n = p->len, i = *ip;
    char stack[J_MAX_NEST * 4];
    int sp = 0;
    int start_line = *line;
    while (i < n) {
        if (sp == 0) {
            size_t e = 0;
            if (block) {
                if (i + 3 <= n && !memcmp(s + i, "+%}", 3)) e = i + 3;
                else if (i + 3 <= n && !memcmp(s + i, "-%}", 3)) { e = i + 3; e += s_ws_run(s, n, e); }
                else if (i + 2 <= n && !memcmp(s + i, "%}", 2)) { e = i + 2; if (e < n && s[e] == '\n') e++; }
            } else {
                if (i + 3 <= n && !memcmp(s + i, "-}}", 3)) { e = i + 3; e += s_ws_run(s, n, e); }
                else if (i + 2 <= n && !memcmp(s + i, "}}", 2)) e = i + 2;
            }
            if (e) {
                tok_t t = {.kind = block ? T_BLOCK_END : T_VAR_END, .line = *line};
                if (s_push(p, t)) return -1;
                *line += s_lines(s + i, e - i);
                *line_starting = s[e - 1] == '\n';
                *ip = e;
                return 0;
            }
        }
        size_t w = s_ws_run(s, n, i);
        if (w) {
            *line += s_lines(s + i, w);
            i += w;
            continue;
        }
        unsigned char ch = (unsigned char)s[i];
        tok_t t = {.line = *line};
        size_t m;
        int base;
        if ((m = s_match_float(s, n, i))) {
            char tmp[128];
            size_t k = 0;
            for (size_t j = i; j < i + m && k + 1 < sizeof tmp; j++)
                if (s[j] != '_') tmp[k++] = s[j];
            tmp[k] = 0;
            t.kind = T_FLOAT;
            t.f = strtod(tmp, NULL);
            i += m;
        } else if ((m = s_match_int(s, n, i, &base))) {
            char tmp[128];
            size_t k = 0, j0 = base == 10 ? i : i + 2;
            for (size_t j = j0; j < i + m && k + 1 < sizeof tmp; j++)
                if (s[j] != '_') tmp[k++] = s[j];
            tmp[k] = 0;
            errno = 0;
            unsigned long long v = strtoull(tmp, NULL, base);
            if (errno || v > INT64_MAX || k + 1 >= sizeof tmp)
                return s_fail(p, STRATA_EUNSUPPORTED, *line, "integers beyond 64 bits are not supported");
            t.kind = T_INT;
            t.i = (int64_t)v;
            i += m;
        } else if (ch == '_' || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z')) {
            size_t j = i;
            while (j < n && (s[j] == '_' || s_isdig(s[j]) || ((s[j] | 0x20) >= 'a' && (s[j] | 0x20) <= 'z'))) j++;
            if (j < n && (unsigned char)s[j] >= 0x80 && !s_ws_run(s, n, j))
                return s_fail(p, STRATA_EUNSUPPORTED, *line, "non-ASCII names are not supported");
            t.kind = T_NAME;
            t.s = s_intern(p, s + i, j - i);
            if (!t.s) return -1;
            i = j;
        } else if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < n && (unsigned char)s[j] != ch) j += s[j] == '\\' ? 2 : 1;
            if (j >= n) return s_fail(p, STRATA_EFORMAT, *line, "unterminated string");
            t.kind = T_STRING;
            if (s_unescape(p, *line, s + i + 1, j - i - 1, &t.s, &t.n)) return -1;
            *line += s_lines(s + i, j - i);
            i = j + 1;
        } else {
            size_t k;
            for (k = 0; k < sizeof s_ops / sizeof s_ops[0]; k++) {
                size_t l = strlen(s_ops[k].s);
                if (i + l <= n && !memcmp(s + i, s_ops[k].s, l)) break;
            }
            if (k == sizeof s_ops / sizeof s_ops[0]) {
                if (ch >= 0x80) return s_fail(p, STRATA_EFORMAT, *line, "unexpected non-ASCII character in a tag");
                return s_fail(p, STRATA_EFORMAT, *line, "unexpected char '%c'", ch);
            }
            t.kind = s_ops[k].kind;
            char o = s_ops[k].s[0];
            if (t.kind == T_LBRACE || t.kind == T_LPAREN || t.kind == T_LBRACKET) {
                if (sp >= (int)sizeof stack) return s_fail(p, STRATA_ETOOLARGE, *line, "brackets nested too deeply");
                stack[sp++] = o == '{' ? '}' : o == '(' ? ')' : ']';
            } else if (t.kind == T_RBRACE || t.kind == T_RPAREN || t.kind == T_RBRACKET) {
                if (!sp) return s_fail(p, STRATA_EFORMAT, *line, "unexpected '%c'", o);
                if (stack[sp - 1] != o) return s_fail(p, STRATA_EFORMAT, *line, "unexpected '%c', expected '%c'", o, stack[sp - 1]);
                sp--;
            }
            i += strlen(s_ops[k].s);
        }
        if (s_push(p, t)) return -1;
    }
    return s_fail(p, STRATA_EFORMAT, start_line, "unexpected end of template: the tag is not closed");
}

static int s_lex(P *p)
{
    const char *s = p->src;
    size_t n = p->len, i = 0;
    int line = 1;
    bool line_starting = true;
    while (i < n) {
        /* earliest tag start at or after i */
        size_t q = i;
        int kind = 0; /* '{', '%', '#', 'r' */
        size_t raw_end = 0;
        char sign = 0;
        for (; q + 1 < n; q++) {
            if (s[q] != '{') continue;
            char c2 = s[q + 1];
            if (c2 == '%') {
                char rs;
                if (s_is_raw_begin(s, n, q, &raw_end, &rs)) { kind = 'r'; sign = rs; break; }
                kind = '%';
            } else if (c2 == '{' || c2 == '#') {
                kind = c2;
            } else {
                continue;
            }
            sign = q + 2 < n && (s[q + 2] == '-' || s[q + 2] == '+') ? s[q + 2] : 0;
            break;
        }
        if (!kind) {
            tok_t t = {.kind = T_DATA, .line = line, .s = s + i, .n = n - i};
            return s_push(p, t);
        }
        if (s_emit_data(p, i, q, sign, kind != '{', line_starting, line)) return -1;
        line += s_lines(s + i, q - i);
        if (kind == 'r') {
            /* raw body: data up to {% endraw %} */
            line_starting = s[raw_end - 1] == '\n';
            line += s_lines(s + q, raw_end - q);
            size_t b = raw_end, e = 0;
            char es = 0;
            size_t r;
            for (r = b; r + 1 < n; r++)
                if (s_is_endraw(s, n, r, &e, &es)) break;
            if (!e) return s_fail(p, STRATA_EFORMAT, line, "missing end of raw directive");
            if (s_emit_data(p, b, r, es, true, line_starting, line)) return -1;
            line += s_lines(s + b, e - b);
            line_starting = s[e - 1] == '\n';
            i = e;
            continue;
        }
        size_t after = q + 2 + (sign ? 1 : 0);
        line_starting = false;
        if (kind == '#') {
            size_t r, e = 0;
            for (r = after; r < n; r++) {
                if (r + 3 <= n && !memcmp(s + r, "+#}", 3)) { e = r + 3; break; }
                if (r + 3 <= n && !memcmp(s + r, "-#}", 3)) { e = r + 3; e += s_ws_run(s, n, e); break; }
                if (r + 2 <= n && !memcmp(s + r, "#}", 2)) { e = r + 2; if (e < n && s[e] == '\n') e++; break; }
            }
            if (!e) return s_fail(p, STRATA_EFORMAT, line, "missing end of comment tag");
            line += s_lines(s + q, e - q);
            line_starting = s[e - 1] == '\n';
            i = e;
            continue;
        }
        tok_t t = {.kind = kind == '%' ? T_BLOCK_BEGIN : T_VAR_BEGIN, .line = line};
        if (s_push(p, t)) return -1;
        i = after;
        if (s_lex_tag(p, &i, &line, kind == '%', &line_starting)) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* parser */

static tok_t *s_cur(P *p) { return &p->toks[p->pos]; }
static tok_t *s_look(P *p) { return &p->toks[p->pos + 1 < p->ntok ? p->pos + 1 : p->pos]; }
static void s_next(P *p) { if (p->pos + 1 < p->ntok) p->pos++; }
static bool s_is_name(P *p, const char *name) { return s_cur(p)->kind == T_NAME && !strcmp(s_cur(p)->s, name); }

static const char *s_describe(const tok_t *t)
{
    switch (t->kind) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "begin of print statement";
    case T_VAR_END: return "end of print statement";
    case T_BLOCK_BEGIN: return "begin of statement block";
    case T_BLOCK_END: return "end of statement block";
    case T_NAME: return t->s;
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    default:
        for (size_t k = 0; k < sizeof s_ops / sizeof s_ops[0]; k++)
            if (s_ops[k].kind == t->kind) return s_ops[k].s;
        return "token";
    }
}

static int s_expect(P *p, uint8_t kind, const char *what)
{
    if (s_cur(p)->kind != kind)
        return s_fail(p, STRATA_EFORMAT, s_cur(p)->line, "expected %s, got '%s'", what, s_describe(s_cur(p)));
    s_next(p);
    return 0;
}

static jnode_t *s_node(P *p, int kind, int line)
{
    jnode_t *n = s_alloc(p, sizeof *n);
    if (n) {
        n->kind = (uint8_t)kind;
        n->line = line;
    }
    return n;
}

typedef struct {
    jnode_t **v;
    uint32_t n, cap;
} nvec_t;

static int s_nv_push(P *p, nvec_t *v, jnode_t *x)
{
    if (!x) return -1;
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        jnode_t **q = ja_grow(&p->t->a, v->v, v->cap * sizeof(jnode_t *), nc * sizeof(jnode_t *));
        if (!q) return s_fail(p, STRATA_ENOMEM, 0, "out of memory");
        v->v = q;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 0;
}

static jnode_t *s_expr(P *p, bool with_cond);
static jnode_t *s_tuple(P *p, bool simplified, bool with_cond, const char *extra_end, bool explicit_parens);
static jnode_t *s_unary(P *p, bool with_filter);
static jnode_t *s_primary(P *p);
static jnode_t *s_postfix(P *p, jnode_t *n);
static jnode_t *s_filter(P *p, jnode_t *n, bool start_inline);
static int s_subparse(P *p, const char *const *end, nvec_t *body);

static int s_enter(P *p)
{
    if (++p->nest > J_MAX_NEST)
        return s_fail(p, STRATA_ETOOLARGE, s_cur(p)->line, "expressions or blocks nested more than %d deep", J_MAX_NEST);
    return 0;
}

/* (args, kwargs) of a call; *args and **kwargs are refused. */
static int s_call_args(P *p, jnode_t *n)
{
    int line = s_cur(p)->line;
    if (s_expect(p, T_LPAREN, "'('")) return -1;
    nvec_t args = {0}, kwv = {0};
    const char **kwn = NULL;
    uint32_t kwcap = 0;
    bool req_comma = false;
    while (s_cur(p)->kind != T_RPAREN) {
        if (req_comma) {
            if (s_expect(p, T_COMMA, "','")) return -1;
            if (s_cur(p)->kind == T_RPAREN) break;
        }
        if (s_cur(p)->kind == T_MUL || s_cur(p)->kind == T_POW)
            return s_fail(p, STRATA_EUNSUPPORTED, s_cur(p)->line, "*args and **kwargs in calls are not supported");
        if (s_cur(p)->kind == T_NAME && s_look(p)->kind == T_ASSIGN) {
            const char *key = s_cur(p)->s;
            s_next(p);
            s_next(p);
            jnode_t *v = s_expr(p, true);
            if (!v) return -1;
            if (kwv.n == kwcap) {
                uint32_t nc = kwcap ? kwcap * 2 : 4;
                const char **q = ja_grow(&p->t->a, kwn, kwcap * sizeof(char *), nc * sizeof(char *));
                if (!q) return s_fail(p, STRATA_ENOMEM, line, "out of memory");
                kwn = q;
                kwcap = nc;
            }
            kwn[kwv.n] = key;
            if (s_nv_push(p, &kwv, v)) return -1;
        } else {
            if (kwv.n) return s_fail(p, STRATA_EFORMAT, line, "invalid syntax for function call expression");
            if (s_nv_push(p, &args, s_expr(p, true))) return -1;
        }
        req_comma = true;
    }
    if (s_expect(p, T_RPAREN, "')'")) return -1;
    n->kids = args.v;
    n->nkids = args.n;
    n->kids2 = kwv.v;
    n->nkids2 = kwv.n;
    n->kwnames = kwn;
    return 0;
}

static jnode_t *s_subscribed(P *p)
{
    int line = s_cur(p)->line;
    jnode_t *a = NULL, *b = NULL, *c = NULL;
    if (s_cur(p)->kind == T_COLON) {
        s_next(p);
    } else {
        jnode_t *e = s_expr(p, true);
        if (!e) return NULL;
        if (s_cur(p)->kind != T_COLON) return e;
        s_next(p);
        a = e;
    }
    if (s_cur(p)->kind != T_COLON && s_cur(p)->kind != T_RBRACKET && s_cur(p)->kind != T_COMMA) {
        if (!(b = s_expr(p, true))) return NULL;
    }
    if (s_cur(p)->kind == T_COLON) {
        s_next(p);
        if (s_cur(p)->kind != T_RBRACKET && s_cur(p)->kind != T_COMMA) {
            if (!(c = s_expr(p, true))) return NULL;
        }
    }
    jnode_t *n = s_node(p, E_SLICE, line);
    if (n) { n->a = a; n->b = b; n->c = c; }
    return n;
}

static jnode_t *s_subscript(P *p, jnode_t *obj)
{
    tok_t *t = s_cur(p);
    int line = t->line;
    s_next(p);
    if (t->kind == T_DOT) {
        tok_t *at = s_cur(p);
        s_next(p);
        if (at->kind == T_NAME) {
            jnode_t *n = s_node(p, E_GETATTR, line);
            if (n) { n->a = obj; n->name = at->s; }
            return n;
        }
        if (at->kind != T_INT) {
            s_fail(p, STRATA_EFORMAT, at->line, "expected name or number");
            return NULL;
        }
        jnode_t *k = s_node(p, E_CONST, at->line), *n = s_node(p, E_GETITEM, line);
        if (!k || !n) return NULL;
        k->cval = jv_int(at->i);
        n->a = obj;
        n->b = k;
        return n;
    }
    nvec_t args = {0};
    while (s_cur(p)->kind != T_RBRACKET) {
        if (args.n && s_expect(p, T_COMMA, "','")) return NULL;
        if (s_nv_push(p, &args, s_subscribed(p))) return NULL;
    }
    if (s_expect(p, T_RBRACKET, "']'")) return NULL;
    if (!args.n) {
        s_fail(p, STRATA_EFORMAT, line, "expected an expression in []");
        return NULL;
    }
    jnode_t *key = args.v[0];
    if (args.n > 1) {
        key = s_node(p, E_TUPLE, line);
        if (!key) return NULL;
        key->kids = args.v;
        key->nkids = args.n;
    }
    jnode_t *n = s_node(p, E_GETITEM, line);
    if (n) { n->a = obj; n->b = key; }
    return n;
}

static jnode_t *s_postfix(P *p, jnode_t *n)
{
    while (n) {
        uint8_t k = s_cur(p)->kind;
        if (k == T_DOT || k == T_LBRACKET) {
            n = s_subscript(p, n);
        } else if (k == T_LPAREN) {
            jnode_t *c = s_node(p, E_CALL, s_cur(p)->line);
            if (!c) return NULL;
            c->a = n;
            if (s_call_args(p, c)) return NULL;
            n = c;
        } else {
            break;
        }
    }
    return n;
}

static const char *s_dotted_name(P *p)
{
    tok_t *t = s_cur(p);
    if (t->kind != T_NAME) {
        s_fail(p, STRATA_EFORMAT, t->line, "expected a name, got '%s'", s_describe(t));
        return NULL;
    }
    s_next(p);
    const char *name = t->s;
    while (s_cur(p)->kind == T_DOT) {
        s_next(p);
        tok_t *u = s_cur(p);
        if (u->kind != T_NAME) {
            s_fail(p, STRATA_EFORMAT, u->line, "expected a name");
            return NULL;
        }
        s_next(p);
        size_t a = strlen(name), b = strlen(u->s);
        char *q = s_alloc(p, a + b + 2);
        if (!q) return NULL;
        memcpy(q, name, a);
        q[a] = '.';
        memcpy(q + a + 1, u->s, b + 1);
        name = q;
    }
    return name;
}

static jnode_t *s_filter(P *p, jnode_t *n, bool start_inline)
{
    while (s_cur(p)->kind == T_PIPE || start_inline) {
        if (!start_inline) s_next(p);
        start_inline = false;
        int line = s_cur(p)->line;
        const char *name = s_dotted_name(p);
        if (!name) return NULL;
        const jfilter_def_t *d = jfilter_find(name);
        if (!d) {
            if (jfilter_known_unsupported(name))
                s_fail(p, STRATA_EUNSUPPORTED, line, "the filter '%s' is not supported", name);
            else
                s_fail(p, STRATA_EFORMAT, line, "no filter named '%s'", name);
            return NULL;
        }
        jnode_t *f = s_node(p, E_FILTER, line);
        if (!f) return NULL;
        f->a = n;
        f->name = name;
        f->def = d;
        if (s_cur(p)->kind == T_LPAREN && s_call_args(p, f)) return NULL;
        n = f;
    }
    return n;
}

static jnode_t *s_test(P *p, jnode_t *n)
{
    int line = s_cur(p)->line;
    s_next(p); /* is */
    bool negated = false;
    if (s_is_name(p, "not")) {
        s_next(p);
        negated = true;
    }
    int nline = s_cur(p)->line;
    const char *name = s_dotted_name(p);
    if (!name) return NULL;
    const jfilter_def_t *d = jtest_find(name);
    if (!d) {
        if (jtest_known_unsupported(name)) s_fail(p, STRATA_EUNSUPPORTED, nline, "the test '%s' is not supported", name);
        else s_fail(p, STRATA_EFORMAT, nline, "no test named '%s'", name);
        return NULL;
    }
    jnode_t *t = s_node(p, E_TEST, line);
    if (!t) return NULL;
    t->a = n;
    t->name = name;
    t->def = d;
    uint8_t k = s_cur(p)->kind;
    if (k == T_LPAREN) {
        if (s_call_args(p, t)) return NULL;
    } else if ((k == T_NAME || k == T_STRING || k == T_INT || k == T_FLOAT || k == T_LBRACKET || k == T_LBRACE) &&
               !s_is_name(p, "else") && !s_is_name(p, "or") && !s_is_name(p, "and")) {
        if (s_is_name(p, "is")) {
            s_fail(p, STRATA_EFORMAT, s_cur(p)->line, "You cannot chain multiple tests with is");
            return NULL;
        }
        jnode_t *arg = s_postfix(p, s_primary(p));
        if (!arg) return NULL;
        t->kids = s_alloc(p, sizeof(jnode_t *));
        if (!t->kids) return NULL;
        t->kids[0] = arg;
        t->nkids = 1;
    }
    if (negated) {
        jnode_t *nn = s_node(p, E_NOT, line);
        if (nn) nn->a = t;
        return nn;
    }
    return t;
}

static jnode_t *s_filter_expr(P *p, jnode_t *n)
{
    while (n) {
        uint8_t k = s_cur(p)->kind;
        if (k == T_PIPE) n = s_filter(p, n, false);
        else if (k == T_NAME && !strcmp(s_cur(p)->s, "is")) n = s_test(p, n);
        else if (k == T_LPAREN) {
            jnode_t *c = s_node(p, E_CALL, s_cur(p)->line);
            if (!c) return NULL;
            c->a = n;
            if (s_call_args(p, c)) return NULL;
            n = c;
        } else break;
    }
    return n;
}

static jnode_t *s_list(P *p, int kind, uint8_t close)
{
    int line = s_cur(p)->line;
    s_next(p);
    nvec_t items = {0}, vals = {0};
    while (s_cur(p)->kind != close) {
        if (items.n && s_expect(p, T_COMMA, "','")) return NULL;
        if (s_cur(p)->kind == close) break;
        if (s_nv_push(p, &items, s_expr(p, true))) return NULL;
        if (kind == E_DICT) {
            if (s_expect(p, T_COLON, "':'")) return NULL;
            if (s_nv_push(p, &vals, s_expr(p, true))) return NULL;
        }
    }
    s_next(p);
    jnode_t *n = s_node(p, kind, line);
    if (!n) return NULL;
    n->kids = items.v;
    n->nkids = items.n;
    n->kids2 = vals.v;
    n->nkids2 = vals.n;
    return n;
}

static jnode_t *s_primary(P *p)
{
    tok_t *t = s_cur(p);
    jnode_t *n;
    switch (t->kind) {
    case T_NAME:
        s_next(p);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True") || !strcmp(t->s, "false") || !strcmp(t->s, "False")) {
            n = s_node(p, E_CONST, t->line);
            if (n) n->cval = jv_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) {
            n = s_node(p, E_CONST, t->line);
            if (n) n->cval = jv_none();
        } else {
            n = s_node(p, E_NAME, t->line);
            if (n) n->name = t->s;
        }
        return n;
    case T_STRING: {
        size_t total = 0, k = p->pos;
        while (p->toks[k].kind == T_STRING) total += p->toks[k++].n;
        char *buf = s_alloc(p, total + 1);
        jstr_t *s = s_alloc(p, sizeof *s);
        if (!buf || !s) return NULL;
        size_t o = 0;
        while (s_cur(p)->kind == T_STRING) {
            memcpy(buf + o, s_cur(p)->s, s_cur(p)->n);
            o += s_cur(p)->n;
            s_next(p);
        }
        buf[o] = 0;
        s->p = buf;
        s->len = o;
        s->ncp = ju8_count(buf, o);
        n = s_node(p, E_CONST, t->line);
        if (n) n->cval = jv_str(s);
        return n;
    }
    case T_INT: case T_FLOAT:
        s_next(p);
        n = s_node(p, E_CONST, t->line);
        if (n) n->cval = t->kind == T_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    case T_LPAREN:
        s_next(p);
        if (s_enter(p)) return NULL;
        n = s_tuple(p, false, true, NULL, true);
        p->nest--;
        if (!n || s_expect(p, T_RPAREN, "')'")) return NULL;
        return n;
    case T_LBRACKET:
        if (s_enter(p)) return NULL;
        n = s_list(p, E_LIST, T_RBRACKET);
        p->nest--;
        return n;
    case T_LBRACE:
        if (s_enter(p)) return NULL;
        n = s_list(p, E_DICT, T_RBRACE);
        p->nest--;
        return n;
    default:
        s_fail(p, STRATA_EFORMAT, t->line, "unexpected '%s'", s_describe(t));
        return NULL;
    }
}

static jnode_t *s_unary(P *p, bool with_filter)
{
    tok_t *t = s_cur(p);
    jnode_t *n;
    if (t->kind == T_SUB || t->kind == T_ADD) {
        s_next(p);
        if (s_enter(p)) return NULL;
        jnode_t *x = s_unary(p, false);
        p->nest--;
        if (!x) return NULL;
        n = s_node(p, t->kind == T_SUB ? E_NEG : E_POS, t->line);
        if (!n) return NULL;
        n->a = x;
    } else {
        n = s_primary(p);
    }
    n = s_postfix(p, n);
    if (with_filter) n = s_filter_expr(p, n);
    return n;
}

static jnode_t *s_bin(P *p, int op, jnode_t *a, jnode_t *b, int line)
{
    if (!a || !b) return NULL;
    jnode_t *n = s_node(p, E_BIN, line);
    if (n) { n->op = (uint8_t)op; n->a = a; n->b = b; }
    return n;
}

static jnode_t *s_pow(P *p)
{
    int line = s_cur(p)->line;
    jnode_t *l = s_unary(p, true);
    while (l && s_cur(p)->kind == T_POW) {
        s_next(p);
        l = s_bin(p, OP_POW, l, s_unary(p, true), line);
        line = s_cur(p)->line;
    }
    return l;
}

static jnode_t *s_math2(P *p)
{
    int line = s_cur(p)->line;
    jnode_t *l = s_pow(p);
    for (;;) {
        uint8_t k = s_cur(p)->kind;
        int op = k == T_MUL ? OP_MUL : k == T_DIV ? OP_DIV : k == T_FLOORDIV ? OP_FLOORDIV : k == T_MOD ? OP_MOD : 0;
        if (!op || !l) break;
        s_next(p);
        l = s_bin(p, op, l, s_pow(p), line);
        line = s_cur(p)->line;
    }
    return l;
}

static jnode_t *s_concat(P *p)
{
    int line = s_cur(p)->line;
    jnode_t *first = s_math2(p);
    if (!first || s_cur(p)->kind != T_TILDE) return first;
    nvec_t args = {0};
    if (s_nv_push(p, &args, first)) return NULL;
    while (s_cur(p)->kind == T_TILDE) {
        s_next(p);
        if (s_nv_push(p, &args, s_math2(p))) return NULL;
    }
    jnode_t *n = s_node(p, E_CONCAT, line);
    if (n) { n->kids = args.v; n->nkids = args.n; }
    return n;
}

static jnode_t *s_math1(P *p)
{
    int line = s_cur(p)->line;
    jnode_t *l = s_concat(p);
    while (l && (s_cur(p)->kind == T_ADD || s_cur(p)->kind == T_SUB)) {
        int op = s_cur(p)->kind == T_ADD ? OP_ADD : OP_SUB;
        s_next(p);
        l = s_bin(p, op, l, s_concat(p), line);
        line = s_cur(p)->line;
    }
    return l;
}

static jnode_t *s_compare(P *p)
{
    int line = s_cur(p)->line;
    jnode_t *e = s_math1(p);
    if (!e) return NULL;
    nvec_t ops = {0};
    uint8_t opc[64];
    for (;;) {
        uint8_t k = s_cur(p)->kind;
        int op = k == T_EQ ? CMP_EQ : k == T_NE ? CMP_NE : k == T_LT ? CMP_LT : k == T_LTEQ ? CMP_LE :
                 k == T_GT ? CMP_GT : k == T_GTEQ ? CMP_GE : 0;
        if (op) {
            s_next(p);
        } else if (s_is_name(p, "in")) {
            s_next(p);
            op = CMP_IN;
        } else if (s_is_name(p, "not") && s_look(p)->kind == T_NAME && !strcmp(s_look(p)->s, "in")) {
            s_next(p);
            s_next(p);
            op = CMP_NOTIN;
        } else {
            break;
        }
        if (ops.n >= sizeof opc) {
            s_fail(p, STRATA_ETOOLARGE, line, "too many chained comparisons");
            return NULL;
        }
        opc[ops.n] = (uint8_t)op;
        if (s_nv_push(p, &ops, s_math1(p))) return NULL;
    }
    if (!ops.n) return e;
    jnode_t *n = s_node(p, E_CMP, line);
    if (!n) return NULL;
    n->a = e;
    n->kids = ops.v;
    n->nkids = ops.n;
    n->ops = s_alloc(p, ops.n);
    if (!n->ops) return NULL;
    memcpy(n->ops, opc, ops.n);
    return n;
}

static jnode_t *s_not(P *p)
{
    if (s_is_name(p, "not")) {
        int line = s_cur(p)->line;
        s_next(p);
        if (s_enter(p)) return NULL;
        jnode_t *x = s_not(p);
        p->nest--;
        if (!x) return NULL;
        jnode_t *n = s_node(p, E_NOT, line);
        if (n) n->a = x;
        return n;
    }
    return s_compare(p);
}

/* `a word b word c ...` as left-nested nodes of kind (E_AND, E_OR), operands from next. */
static jnode_t *s_bool_chain(P *p, const char *word, int kind, jnode_t *(*next)(P *))
{
    int line = s_cur(p)->line;
    jnode_t *l = next(p);
    while (l && s_is_name(p, word)) {
        s_next(p);
        jnode_t *r = next(p);
        if (!r) return NULL;
        jnode_t *n = s_node(p, kind, line);
        if (!n) return NULL;
        n->a = l;
        n->b = r;
        l = n;
        line = s_cur(p)->line;
    }
    return l;
}

static jnode_t *s_and(P *p) { return s_bool_chain(p, "and", E_AND, s_not); }

static jnode_t *s_or(P *p) { return s_bool_chain(p, "or", E_OR, s_and); }

static jnode_t *s_condexpr(P *p)
{
    int line = s_cur(p)->line;
    jnode_t *e1 = s_or(p);
    while (e1 && s_is_name(p, "if")) {
        s_next(p);
        jnode_t *e2 = s_or(p), *e3 = NULL;
        if (!e2) return NULL;
        if (s_is_name(p, "else")) {
            s_next(p);
            if (s_enter(p)) return NULL;
            e3 = s_condexpr(p);
            p->nest--;
            if (!e3) return NULL;
        }
        jnode_t *n = s_node(p, E_COND, line);
        if (!n) return NULL;
        n->a = e2;
        n->b = e1;
        n->c = e3;
        e1 = n;
        line = s_cur(p)->line;
    }
    return e1;
}

static jnode_t *s_expr(P *p, bool with_cond)
{
    if (s_enter(p)) return NULL;
    jnode_t *n = with_cond ? s_condexpr(p) : s_or(p);
    p->nest--;
    return n;
}

static bool s_tuple_end(P *p, const char *extra)
{
    uint8_t k = s_cur(p)->kind;
    if (k == T_VAR_END || k == T_BLOCK_END || k == T_RPAREN) return true;
    return extra && s_is_name(p, extra);
}

static jnode_t *s_tuple(P *p, bool simplified, bool with_cond, const char *extra_end, bool explicit_parens)
{
    int line = s_cur(p)->line;
    nvec_t args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && s_expect(p, T_COMMA, "','")) return NULL;
        if (s_tuple_end(p, extra_end)) break;
        jnode_t *e = simplified ? s_primary(p) : s_expr(p, with_cond);
        if (s_nv_push(p, &args, e)) return NULL;
        if (s_cur(p)->kind == T_COMMA) is_tuple = true;
        else break;
        line = s_cur(p)->line;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) {
            s_fail(p, STRATA_EFORMAT, s_cur(p)->line, "Expected an expression, got '%s'", s_describe(s_cur(p)));
            return NULL;
        }
    }
    jnode_t *n = s_node(p, E_TUPLE, line);
    if (n) { n->kids = args.v; n->nkids = args.n; }
    return n;
}

/* ---- statements ---- */

static bool s_assignable(const jnode_t *n)
{
    if (n->kind == E_NAME) return true;
    if (n->kind != E_TUPLE) return false;
    for (uint32_t i = 0; i < n->nkids; i++)
        if (!s_assignable(n->kids[i])) return false;
    return true;
}

static bool s_names_loop(const jnode_t *n)
{
    if (n->kind == E_NAME) return !strcmp(n->name, "loop");
    for (uint32_t i = 0; i < n->nkids; i++)
        if (s_names_loop(n->kids[i])) return true;
    return false;
}

static jnode_t *s_assign_target(P *p, const char *extra_end, bool with_ns)
{
    tok_t *t = s_cur(p);
    if (with_ns && t->kind == T_NAME && s_look(p)->kind == T_DOT) {
        s_next(p);
        s_next(p);
        tok_t *a = s_cur(p);
        if (a->kind != T_NAME) {
            s_fail(p, STRATA_EFORMAT, a->line, "expected a name after '.'");
            return NULL;
        }
        s_next(p);
        jnode_t *n = s_node(p, E_NSREF, t->line);
        if (n) { n->name = t->s; n->name2 = a->s; }
        return n;
    }
    jnode_t *n = s_tuple(p, true, true, extra_end, false);
    if (!n) return NULL;
    if (!s_assignable(n)) {
        s_fail(p, STRATA_EFORMAT, n->line, "can't assign to this expression");
        return NULL;
    }
    return n;
}

/* Parse statements up to one of end (the name after "{%"), which stays current. */
static int s_body(P *p, const char *const *end, nvec_t *body)
{
    if (s_cur(p)->kind == T_COLON) s_next(p);
    if (s_expect(p, T_BLOCK_END, "end of statement block")) return -1;
    if (s_enter(p)) return -1;
    int r = s_subparse(p, end, body);
    p->nest--;
    if (r) return -1;
    if (s_cur(p)->kind == T_EOF) {
        return s_fail(p, STRATA_EFORMAT, s_cur(p)->line, "unexpected end of template: expected '%s'", end[0]);
    }
    return 0;
}

static int s_end_tag(P *p, const char *name)
{
    if (!s_is_name(p, name)) return s_fail(p, STRATA_EFORMAT, s_cur(p)->line, "expected '%s'", name);
    s_next(p);
    return 0;
}

static void s_scan_names(const jnode_t *n, uint16_t *flags)
{
    if (!n) return;
    if (n->kind == E_NAME) {
        if (!strcmp(n->name, "varargs")) *flags |= JM_VARARGS;
        else if (!strcmp(n->name, "kwargs")) *flags |= JM_KWARGS;
        else if (!strcmp(n->name, "caller")) *flags |= JM_CALLER;
    }
    s_scan_names(n->a, flags);
    s_scan_names(n->b, flags);
    s_scan_names(n->c, flags);
    for (uint32_t i = 0; i < n->nkids; i++) s_scan_names(n->kids[i], flags);
    for (uint32_t i = 0; i < n->nkids2; i++) s_scan_names(n->kids2[i], flags);
}

static int s_signature(P *p, jnode_t *n)
{
    if (s_expect(p, T_LPAREN, "'('")) return -1;
    nvec_t params = {0};
    bool defaults = false;
    while (s_cur(p)->kind != T_RPAREN) {
        if (params.n && s_expect(p, T_COMMA, "','")) return -1;
        tok_t *t = s_cur(p);
        if (t->kind != T_NAME) return s_fail(p, STRATA_EFORMAT, t->line, "expected a parameter name");
        s_next(p);
        jnode_t *prm = s_node(p, E_PARAM, t->line);
        if (!prm) return -1;
        prm->name = t->s;
        if (s_cur(p)->kind == T_ASSIGN) {
            s_next(p);
            if (!(prm->a = s_expr(p, true))) return -1;
            defaults = true;
        } else if (defaults) {
            return s_fail(p, STRATA_EFORMAT, t->line, "non-default argument follows default argument");
        }
        if (s_nv_push(p, &params, prm)) return -1;
    }
    s_next(p);
    n->kids2 = params.v;
    n->nkids2 = params.n;
    return 0;
}

static jnode_t *s_statement(P *p)
{
    tok_t *t = s_cur(p);
    int line = t->line;
    if (t->kind != T_NAME) {
        s_fail(p, STRATA_EFORMAT, line, "tag name expected");
        return NULL;
    }
    const char *k = t->s;
    s_next(p);
    jnode_t *n;
    if (!strcmp(k, "if")) {
        jnode_t *root = NULL, *cur = NULL;
        for (;;) {
            jnode_t *x = s_node(p, S_IF, line);
            if (!x) return NULL;
            if (!(x->a = s_tuple(p, false, false, NULL, false))) return NULL;
            static const char *const end[] = {"elif", "else", "endif", NULL};
            nvec_t body = {0};
            if (s_body(p, end, &body)) return NULL;
            x->kids = body.v;
            x->nkids = body.n;
            if (!root) root = x;
            else {
                x->flags |= JIF_ELIF;
                cur->kids2 = s_alloc(p, sizeof(jnode_t *));
                if (!cur->kids2) return NULL;
                cur->kids2[0] = x;
                cur->nkids2 = 1;
            }
            cur = x;
            tok_t *e = s_cur(p);
            line = e->line;
            s_next(p);
            if (!strcmp(e->s, "elif")) continue;
            if (!strcmp(e->s, "else")) {
                static const char *const end2[] = {"endif", NULL};
                nvec_t eb = {0};
                if (s_body(p, end2, &eb) || s_end_tag(p, "endif")) return NULL;
                cur->kids2 = eb.v;
                cur->nkids2 = eb.n;
            }
            break;
        }
        return root;
    }
    if (!strcmp(k, "for")) {
        n = s_node(p, S_FOR, line);
        if (!n) return NULL;
        if (!(n->a = s_assign_target(p, "in", false))) return NULL;
        if (s_names_loop(n->a)) {
            s_fail(p, STRATA_EFORMAT, line, "can't assign to special loop variable in for-loop target");
            return NULL;
        }
        if (!s_is_name(p, "in")) {
            s_fail(p, STRATA_EFORMAT, s_cur(p)->line, "expected 'in'");
            return NULL;
        }
        s_next(p);
        if (!(n->b = s_tuple(p, false, false, "recursive", false))) return NULL;
        if (s_is_name(p, "if")) {
            s_next(p);
            if (!(n->c = s_expr(p, true))) return NULL;
        }
        if (s_is_name(p, "recursive")) {
            s_fail(p, STRATA_EUNSUPPORTED, s_cur(p)->line, "recursive for loops are not supported");
            return NULL;
        }
        static const char *const end[] = {"endfor", "else", NULL};
        nvec_t body = {0}, eb = {0};
        p->loop_depth++;
        int r = s_body(p, end, &body);
        p->loop_depth--;
        if (r) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
        bool has_else = !strcmp(s_cur(p)->s, "else");
        s_next(p);
        if (has_else) {
            static const char *const end2[] = {"endfor", NULL};
            if (s_body(p, end2, &eb) || s_end_tag(p, "endfor")) return NULL;
            n->kids2 = eb.v;
            n->nkids2 = eb.n;
        }
        return n;
    }
    if (!strcmp(k, "set")) {
        jnode_t *target = s_assign_target(p, NULL, true);
        if (!target) return NULL;
        if (s_cur(p)->kind == T_ASSIGN) {
            s_next(p);
            n = s_node(p, S_SET, line);
            if (!n) return NULL;
            n->a = target;
            if (!(n->b = s_tuple(p, false, true, NULL, false))) return NULL;
            return n;
        }
        n = s_node(p, S_SETBLOCK, line);
        if (!n) return NULL;
        n->a = target;
        if (s_cur(p)->kind == T_PIPE && !(n->b = s_filter(p, NULL, false))) return NULL;
        static const char *const end[] = {"endset", NULL};
        nvec_t body = {0};
        if (s_body(p, end, &body) || s_end_tag(p, "endset")) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
        return n;
    }
    if (!strcmp(k, "macro") || !strcmp(k, "call")) {
        bool is_call = k[0] == 'c';
        n = s_node(p, is_call ? S_CALLBLOCK : S_MACRO, line);
        if (!n) return NULL;
        if (is_call) {
            if (s_cur(p)->kind == T_LPAREN && s_signature(p, n)) return NULL;
            n->name = "caller";
            if (!(n->a = s_expr(p, true))) return NULL;
            if (n->a->kind != E_CALL) {
                s_fail(p, STRATA_EFORMAT, line, "expected call");
                return NULL;
            }
        } else {
            tok_t *nm = s_cur(p);
            if (nm->kind != T_NAME) {
                s_fail(p, STRATA_EFORMAT, nm->line, "expected a macro name");
                return NULL;
            }
            s_next(p);
            n->name = nm->s;
            if (s_signature(p, n)) return NULL;
        }
        static const char *const end_m[] = {"endmacro", NULL}, *const end_c[] = {"endcall", NULL};
        nvec_t body = {0};
        int saved = p->loop_depth;
        p->loop_depth = 0;
        int r = s_body(p, is_call ? end_c : end_m, &body);
        p->loop_depth = saved;
        if (r || s_end_tag(p, is_call ? "endcall" : "endmacro")) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
        for (uint32_t i = 0; i < n->nkids; i++) s_scan_names(n->kids[i], &n->flags);
        for (uint32_t i = 0; i < n->nkids2; i++) s_scan_names(n->kids2[i]->a, &n->flags);
        return n;
    }
    if (!strcmp(k, "filter")) {
        n = s_node(p, S_FILTERBLOCK, line);
        if (!n || !(n->a = s_filter(p, NULL, true))) return NULL;
        static const char *const end[] = {"endfilter", NULL};
        nvec_t body = {0};
        if (s_body(p, end, &body) || s_end_tag(p, "endfilter")) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
        return n;
    }
    if (!strcmp(k, "with")) {
        n = s_node(p, S_WITH, line);
        if (!n) return NULL;
        nvec_t sets = {0};
        while (s_cur(p)->kind != T_BLOCK_END) {
            if (sets.n && s_expect(p, T_COMMA, "','")) return NULL;
            jnode_t *st = s_node(p, S_SET, s_cur(p)->line);
            if (!st || !(st->a = s_assign_target(p, NULL, false))) return NULL;
            if (s_expect(p, T_ASSIGN, "'='") || !(st->b = s_expr(p, true))) return NULL;
            if (s_nv_push(p, &sets, st)) return NULL;
        }
        static const char *const end[] = {"endwith", NULL};
        nvec_t body = {0};
        if (s_body(p, end, &body) || s_end_tag(p, "endwith")) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
        n->kids2 = sets.v;
        n->nkids2 = sets.n;
        return n;
    }
    if (!strcmp(k, "generation")) {
        n = s_node(p, S_GENERATION, line);
        if (!n) return NULL;
        static const char *const end[] = {"endgeneration", NULL};
        nvec_t body = {0};
        int saved = p->loop_depth;
        p->loop_depth = 0; /* the body is a macro of its own in jinja2 */
        int r = s_body(p, end, &body);
        p->loop_depth = saved;
        if (r || s_end_tag(p, "endgeneration")) return NULL;
        n->kids = body.v;
        n->nkids = body.n;
        return n;
    }
    if (!strcmp(k, "break") || !strcmp(k, "continue")) {
        if (!p->loop_depth) {
            s_fail(p, STRATA_EFORMAT, line, "'%s' outside a for loop", k);
            return NULL;
        }
        return s_node(p, k[0] == 'b' ? S_BREAK : S_CONTINUE, line);
    }
    if (!strcmp(k, "print")) {
        n = s_node(p, S_PRINTS, line);
        if (!n) return NULL;
        nvec_t ex = {0};
        while (s_cur(p)->kind != T_BLOCK_END) {
            if (ex.n && s_expect(p, T_COMMA, "','")) return NULL;
            if (s_nv_push(p, &ex, s_expr(p, true))) return NULL;
        }
        n->kids = ex.v;
        n->nkids = ex.n;
        return n;
    }
    static const char *const unsupported[] = {"block", "extends", "include", "import", "from", "autoescape", "do",
                                              "trans", "pluralize", "debug", NULL};
    for (const char *const *u = unsupported; *u; u++)
        if (!strcmp(k, *u)) {
            s_fail(p, STRATA_EUNSUPPORTED, line, "the tag '%s' is not supported", k);
            return NULL;
        }
    s_fail(p, STRATA_EFORMAT, line, "unknown tag '%s'", k);
    return NULL;
}

static int s_subparse(P *p, const char *const *end, nvec_t *body)
{
    for (;;) {
        tok_t *t = s_cur(p);
        if (t->kind == T_EOF) return 0;
        if (t->kind == T_DATA) {
            jnode_t *n = s_node(p, S_TEXT, t->line);
            jstr_t *s = s_alloc(p, sizeof *s);
            if (!n || !s) return -1;
            s->p = (char *)s_intern(p, t->s, t->n);
            if (!s->p) return -1;
            s->len = t->n;
            s->ncp = ju8_count(t->s, t->n);
            n->cval = jv_str(s);
            if (s_nv_push(p, body, n)) return -1;
            s_next(p);
        } else if (t->kind == T_VAR_BEGIN) {
            s_next(p);
            jnode_t *n = s_node(p, S_PRINT, t->line);
            if (!n || !(n->a = s_tuple(p, false, true, NULL, false))) return -1;
            if (s_expect(p, T_VAR_END, "end of print statement")) return -1;
            if (s_nv_push(p, body, n)) return -1;
        } else if (t->kind == T_BLOCK_BEGIN) {
            s_next(p);
            if (end && s_cur(p)->kind == T_NAME)
                for (const char *const *e = end; *e; e++)
                    if (!strcmp(s_cur(p)->s, *e)) return 0;
            jnode_t *n = s_statement(p);
            if (!n) return -1;
            if (s_nv_push(p, body, n)) return -1;
            if (s_expect(p, T_BLOCK_END, "end of statement block")) return -1;
        } else {
            return s_fail(p, STRATA_EFORMAT, t->line, "unexpected '%s'", s_describe(t));
        }
    }
}


/* ------------------------------------------------------------------------------------------ */
/* scopes: jinja2's idtracking, to find the names a frame starts as `missing`
 *
 * jinja2 compiles each frame (the template, a loop body, a macro, ...) into Python locals. A
 * name the frame assigns before it reads it (in visiting order, an if counting as assigned
 * only when all three of its branches - body, elifs, else - assign it) starts as `missing`,
 * and every nested frame that reads the name reads that local. So until the assignment runs,
 * the name is undefined in the frame and below it, whatever an outer scope or the context
 * holds. Other names read the outer value or the context, which the evaluator's lookup
 * through the frame chain already gives. */

enum { SYM_RESOLVE = 1, SYM_ALIAS, SYM_UNDEF, SYM_PARAM };

typedef struct syms {
    const struct syms *parent;
    const char **names;
    uint8_t *act;
    size_t n, cap;
    const char **stores;
    size_t ns, scap;
} syms_t;

static int y_idx(const syms_t *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) return (int)i;
    return -1;
}

static bool y_find(const syms_t *s, const char *name)
{
    for (; s; s = s->parent)
        if (y_idx(s, name) >= 0) return true;
    return false;
}

static int y_define(P *p, syms_t *s, const char *name, uint8_t act)
{
    int i = y_idx(s, name);
    if (i >= 0) {
        s->act[i] = act;
        return 0;
    }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const char **nn = ja_grow(&p->t->a, s->names, s->cap * sizeof(char *), nc * sizeof(char *));
        uint8_t *na = nn ? ja_grow(&p->t->a, s->act, s->cap, nc) : NULL;
        if (!nn || !na) return s_fail(p, STRATA_ENOMEM, 0, "out of memory");
        s->names = nn;
        s->act = na;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->act[s->n] = act;
    s->n++;
    return 0;
}

static bool y_stored(const syms_t *s, const char *name)
{
    for (size_t i = 0; i < s->ns; i++)
        if (!strcmp(s->stores[i], name)) return true;
    return false;
}

static int y_add_store(P *p, syms_t *s, const char *name)
{
    if (y_stored(s, name)) return 0;
    if (s->ns == s->scap) {
        size_t nc = s->scap ? s->scap * 2 : 8;
        const char **q = ja_grow(&p->t->a, s->stores, s->scap * sizeof(char *), nc * sizeof(char *));
        if (!q) return s_fail(p, STRATA_ENOMEM, 0, "out of memory");
        s->stores = q;
        s->scap = nc;
    }
    s->stores[s->ns++] = name;
    return 0;
}

static int y_load(P *p, syms_t *s, const char *name) { return y_find(s, name) ? 0 : y_define(p, s, name, SYM_RESOLVE); }

static int y_store(P *p, syms_t *s, const char *name)
{
    if (y_add_store(p, s, name)) return -1;
    if (y_idx(s, name) >= 0) return 0;
    return y_define(p, s, name, s->parent && y_find(s->parent, name) ? SYM_ALIAS : SYM_UNDEF);
}

static int y_param(P *p, syms_t *s, const char *name) { return y_add_store(p, s, name) || y_define(p, s, name, SYM_PARAM); }

static int y_copy(P *p, const syms_t *s, syms_t *o)
{
    *o = *s;
    o->names = NULL; o->act = NULL; o->stores = NULL;
    o->n = o->cap = o->ns = o->scap = 0;
    for (size_t i = 0; i < s->n; i++)
        if (y_define(p, o, s->names[i], s->act[i])) return -1;
    for (size_t i = 0; i < s->ns; i++)
        if (y_add_store(p, o, s->stores[i])) return -1;
    return 0;
}

static int y_expr(P *p, syms_t *s, const jnode_t *n)
{
    if (!n) return 0;
    if (n->kind == E_NAME) return y_load(p, s, n->name);
    if (y_expr(p, s, n->a) || y_expr(p, s, n->b) || y_expr(p, s, n->c)) return -1;
    for (uint32_t i = 0; i < n->nkids; i++)
        if (y_expr(p, s, n->kids[i])) return -1;
    for (uint32_t i = 0; i < n->nkids2; i++)
        if (y_expr(p, s, n->kids2[i])) return -1;
    return 0;
}

static int y_target(P *p, syms_t *s, const jnode_t *t, bool param)
{
    if (t->kind == E_NAME) return param ? y_param(p, s, t->name) : y_store(p, s, t->name);
    if (t->kind == E_NSREF) return y_load(p, s, t->name);
    for (uint32_t i = 0; i < t->nkids; i++)
        if (y_target(p, s, t->kids[i], param)) return -1;
    return 0;
}

static int y_stmts(P *p, syms_t *s, jnode_t *const *body, uint32_t n);

/* jinja2's branch_update over the three branch tables of an if */
static int y_branches(P *p, syms_t *s, syms_t br[3])
{
    const char *names[256];
    int counts[256];
    size_t nn = 0;
    for (int b = 0; b < 3; b++)
        for (size_t i = 0; i < br[b].ns; i++) {
            const char *nm = br[b].stores[i];
            if (y_stored(s, nm)) continue;
            size_t k;
            for (k = 0; k < nn; k++)
                if (!strcmp(names[k], nm)) break;
            if (k == nn) {
                if (nn == 256) return s_fail(p, STRATA_ETOOLARGE, 0, "too many names assigned in one if");
                names[nn] = nm;
                counts[nn++] = 0;
            }
            counts[k]++;
        }
    for (int b = 0; b < 3; b++) {
        for (size_t i = 0; i < br[b].n; i++)
            if (y_define(p, s, br[b].names[i], br[b].act[i])) return -1;
        for (size_t i = 0; i < br[b].ns; i++)
            if (y_add_store(p, s, br[b].stores[i])) return -1;
    }
    for (size_t k = 0; k < nn; k++) {
        if (counts[k] == 3) continue;
        if (y_define(p, s, names[k], s->parent && y_find(s->parent, names[k]) ? SYM_ALIAS : SYM_RESOLVE)) return -1;
    }
    return 0;
}

/* An if in jinja2's shape: the elif chain is one branch, the final else another. */
static int y_if(P *p, syms_t *s, const jnode_t *n)
{
    if (y_expr(p, s, n->a)) return -1;
    syms_t br[3];
    if (y_copy(p, s, &br[0]) || y_stmts(p, &br[0], n->kids, n->nkids)) return -1;
    const jnode_t *elif = n->nkids2 == 1 && n->kids2[0]->kind == S_IF && n->kids2[0]->flags & JIF_ELIF ? n->kids2[0] : NULL;
    if (y_copy(p, s, &br[1]) || y_copy(p, s, &br[2])) return -1;
    const jnode_t *last = n;
    for (const jnode_t *e = elif; e;) {
        /* each elif is an if of its own (no else) inside the elif branch */
        if (y_expr(p, &br[1], e->a)) return -1;
        syms_t eb[3];
        if (y_copy(p, &br[1], &eb[0]) || y_stmts(p, &eb[0], e->kids, e->nkids) || y_copy(p, &br[1], &eb[1]) ||
            y_copy(p, &br[1], &eb[2]) || y_branches(p, &br[1], eb))
            return -1;
        last = e;
        e = e->nkids2 == 1 && e->kids2[0]->kind == S_IF && e->kids2[0]->flags & JIF_ELIF ? e->kids2[0] : NULL;
    }
    if (y_stmts(p, &br[2], last->kids2, last == n && elif ? 0 : last->nkids2)) return -1;
    return y_branches(p, s, br);
}

static int y_stmts(P *p, syms_t *s, jnode_t *const *body, uint32_t nb)
{
    for (uint32_t k = 0; k < nb; k++) {
        const jnode_t *n = body[k];
        switch (n->kind) {
        case S_PRINT: if (y_expr(p, s, n->a)) return -1; break;
        case S_PRINTS: for (uint32_t i = 0; i < n->nkids; i++) if (y_expr(p, s, n->kids[i])) return -1; break;
        case S_IF: if (y_if(p, s, n)) return -1; break;
        case S_FOR: if (y_expr(p, s, n->b)) return -1; break;
        case S_SET: if (y_expr(p, s, n->b) || y_target(p, s, n->a, false)) return -1; break;
        case S_SETBLOCK: if (y_target(p, s, n->a, false)) return -1; break;
        case S_MACRO: if (y_store(p, s, n->name)) return -1; break;
        case S_CALLBLOCK: if (y_expr(p, s, n->a)) return -1; break;
        case S_FILTERBLOCK: if (y_expr(p, s, n->a)) return -1; break;
        case S_WITH: for (uint32_t i = 0; i < n->nkids2; i++) if (y_expr(p, s, n->kids2[i]->b)) return -1; break;
        default: break;
        }
    }
    return 0;
}

static int y_result(P *p, const syms_t *s, const char ***out, uint32_t *nout)
{
    uint32_t k = 0;
    for (size_t i = 0; i < s->n; i++) k += s->act[i] == SYM_UNDEF;
    *nout = k;
    *out = NULL;
    if (!k) return 0;
    if (!(*out = s_alloc(p, k * sizeof(char *)))) return -1;
    k = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->act[i] == SYM_UNDEF) (*out)[k++] = s->names[i];
    return 0;
}

static int y_nested(P *p, const syms_t *s, jnode_t *const *body, uint32_t nb);

/* Analyse the frame of node n (or the template body) under parent, then its nested frames. */
static int y_frame(P *p, const syms_t *parent, jnode_t *n, jnode_t *const *body, uint32_t nb, const char ***out,
                   uint32_t *nout)
{
    syms_t s = {.parent = parent};
    if (n) {
        switch (n->kind) {
        case S_FOR:
            if (y_target(p, &s, n->a, true) || y_param(p, &s, "loop")) return -1;
            break;
        case S_MACRO: case S_CALLBLOCK:
            for (uint32_t i = 0; i < n->nkids2; i++)
                if (y_param(p, &s, n->kids2[i]->name)) return -1;
            for (uint32_t i = 0; i < n->nkids2; i++)
                if (y_expr(p, &s, n->kids2[i]->a)) return -1;
            if ((n->flags & JM_CALLER && y_param(p, &s, "caller")) || (n->flags & JM_KWARGS && y_param(p, &s, "kwargs")) ||
                (n->flags & JM_VARARGS && y_param(p, &s, "varargs")))
                return -1;
            break;
        case S_WITH:
            for (uint32_t i = 0; i < n->nkids2; i++)
                if (y_target(p, &s, n->kids2[i]->a, true)) return -1;
            break;
        default:
            break;
        }
    }
    if (y_stmts(p, &s, body, nb)) return -1;
    if (n && n->kind == S_FILTERBLOCK && y_expr(p, &s, n->a)) return -1;
    if (y_result(p, &s, out, nout)) return -1;
    return y_nested(p, &s, body, nb);
}

static int y_nested(P *p, const syms_t *s, jnode_t *const *body, uint32_t nb)
{
    for (uint32_t k = 0; k < nb; k++) {
        jnode_t *n = body[k];
        switch (n->kind) {
        case S_IF:
            if (y_nested(p, s, n->kids, n->nkids) || y_nested(p, s, n->kids2, n->nkids2)) return -1;
            break;
        case S_FOR:
            if (y_frame(p, s, n, n->kids, n->nkids, &n->undefs, &n->nundefs)) return -1;
            if (n->nkids2 && y_frame(p, s, NULL, n->kids2, n->nkids2, &n->undefs2, &n->nundefs2)) return -1;
            break;
        case S_MACRO: case S_CALLBLOCK: case S_SETBLOCK: case S_FILTERBLOCK: case S_WITH: case S_GENERATION:
            if (y_frame(p, s, n, n->kids, n->nkids, &n->undefs, &n->nundefs)) return -1;
            break;
        default:
            break;
        }
    }
    return 0;
}

int jinja_parse(const char *src, size_t len, jinja_template_t **out, strata_errbuf_t *eb)
{
    *out = NULL;
    if (!ju8_valid(src, len)) return strata_seterr(eb, STRATA_EFORMAT, "line 1: the template is not valid UTF-8");
    jinja_template_t *t = calloc(1, sizeof *t);
    if (!t) return strata_seterr(eb, STRATA_ENOMEM, "out of memory");
    P p = {.t = t, .eb = eb};
    /* newlines to \n; one trailing newline dropped (keep_trailing_newline=False) */
    char *s = ja_alloc(&t->a, len + 1);
    if (!s) {
        free(t);
        return strata_seterr(eb, STRATA_ENOMEM, "out of memory");
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[n++] = src[i];
        }
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    p.src = s;
    p.len = n;
    int rc = s_lex(&p);
    if (!rc) {
        tok_t e = {.kind = T_EOF, .line = p.ntok ? p.toks[p.ntok - 1].line : 1};
        rc = s_push(&p, e);
    }
    if (!rc) {
        nvec_t body = {0};
        rc = s_subparse(&p, NULL, &body);
        if (!rc && s_cur(&p)->kind != T_EOF) rc = s_fail(&p, STRATA_EFORMAT, s_cur(&p)->line, "unexpected tag");
        t->body = body.v;
        t->nbody = body.n;
        if (!rc) rc = y_frame(&p, NULL, NULL, t->body, t->nbody, &t->undefs, &t->nundefs);
    }
    if (rc) {
        int code = p.err ? p.err : STRATA_EFORMAT;
        jinja_free(t);
        return code;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_template_t *t)
{
    if (!t) return;
    ja_release(&t->a);
    free(t);
}
