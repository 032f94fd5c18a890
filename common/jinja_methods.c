/* jinja_methods.c - the methods of Python's str, list, tuple and dict that templates call,
 * as CPython 3.11 defines them and ImmutableSandboxedEnvironment allows them, and the
 * template globals. A method that would change a list or dict is an unsafe attribute, as in
 * the sandbox: it prints as "" and calling it is an error. A method Python has and this file
 * does not implement is an error at the lookup, naming it. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jinja_int.h"

#define MAX_RANGE 100000 /* jinja2.sandbox.MAX_RANGE */

enum { M_STR, M_LIST, M_TUPLE, M_DICT, M_NUM, M_VIEW, M_RANGE };
enum { MS_OK, MS_UNSAFE, MS_REFUSE };

typedef struct {
    const char *name;
    uint8_t cls, status;
} mdef_t;

static const mdef_t s_methods[] = {
    /* str */
    {"capitalize", M_STR, MS_OK}, {"casefold", M_STR, MS_REFUSE}, {"center", M_STR, MS_OK},
    {"count", M_STR, MS_OK}, {"encode", M_STR, MS_REFUSE}, {"endswith", M_STR, MS_OK},
    {"expandtabs", M_STR, MS_REFUSE}, {"find", M_STR, MS_OK}, {"format", M_STR, MS_OK},
    {"format_map", M_STR, MS_REFUSE}, {"index", M_STR, MS_OK}, {"isalnum", M_STR, MS_OK},
    {"isalpha", M_STR, MS_OK}, {"isascii", M_STR, MS_OK}, {"isdecimal", M_STR, MS_OK},
    {"isdigit", M_STR, MS_OK}, {"isidentifier", M_STR, MS_REFUSE}, {"islower", M_STR, MS_OK},
    {"isnumeric", M_STR, MS_REFUSE}, {"isprintable", M_STR, MS_REFUSE}, {"isspace", M_STR, MS_OK},
    {"istitle", M_STR, MS_REFUSE}, {"isupper", M_STR, MS_OK}, {"join", M_STR, MS_OK},
    {"ljust", M_STR, MS_OK}, {"lower", M_STR, MS_OK}, {"lstrip", M_STR, MS_OK},
    {"maketrans", M_STR, MS_REFUSE}, {"partition", M_STR, MS_OK}, {"removeprefix", M_STR, MS_OK},
    {"removesuffix", M_STR, MS_OK}, {"replace", M_STR, MS_OK}, {"rfind", M_STR, MS_OK},
    {"rindex", M_STR, MS_OK}, {"rjust", M_STR, MS_OK}, {"rpartition", M_STR, MS_OK},
    {"rsplit", M_STR, MS_OK}, {"rstrip", M_STR, MS_OK}, {"split", M_STR, MS_OK},
    {"splitlines", M_STR, MS_OK}, {"startswith", M_STR, MS_OK}, {"strip", M_STR, MS_OK},
    {"swapcase", M_STR, MS_OK}, {"title", M_STR, MS_OK}, {"translate", M_STR, MS_REFUSE},
    {"upper", M_STR, MS_OK}, {"zfill", M_STR, MS_OK},
    /* list */
    {"append", M_LIST, MS_UNSAFE}, {"clear", M_LIST, MS_REFUSE}, {"copy", M_LIST, MS_OK},
    {"count", M_LIST, MS_OK}, {"extend", M_LIST, MS_UNSAFE}, {"index", M_LIST, MS_OK},
    {"insert", M_LIST, MS_UNSAFE}, {"pop", M_LIST, MS_REFUSE}, {"remove", M_LIST, MS_UNSAFE},
    {"reverse", M_LIST, MS_UNSAFE}, {"sort", M_LIST, MS_UNSAFE},
    /* tuple */
    {"count", M_TUPLE, MS_OK}, {"index", M_TUPLE, MS_OK},
    /* dict */
    {"clear", M_DICT, MS_UNSAFE}, {"copy", M_DICT, MS_OK}, {"fromkeys", M_DICT, MS_REFUSE},
    {"get", M_DICT, MS_OK}, {"items", M_DICT, MS_OK}, {"keys", M_DICT, MS_OK}, {"pop", M_DICT, MS_UNSAFE},
    {"popitem", M_DICT, MS_UNSAFE}, {"setdefault", M_DICT, MS_UNSAFE}, {"update", M_DICT, MS_UNSAFE},
    {"values", M_DICT, MS_OK},
    /* int, float, bool */
    {"real", M_NUM, MS_REFUSE}, {"imag", M_NUM, MS_REFUSE}, {"numerator", M_NUM, MS_REFUSE},
    {"denominator", M_NUM, MS_REFUSE}, {"conjugate", M_NUM, MS_REFUSE}, {"bit_length", M_NUM, MS_REFUSE},
    {"bit_count", M_NUM, MS_REFUSE}, {"to_bytes", M_NUM, MS_REFUSE}, {"from_bytes", M_NUM, MS_REFUSE},
    {"as_integer_ratio", M_NUM, MS_REFUSE}, {"is_integer", M_NUM, MS_REFUSE}, {"hex", M_NUM, MS_REFUSE},
    {"fromhex", M_NUM, MS_REFUSE},
    /* dict views, range */
    {"isdisjoint", M_VIEW, MS_REFUSE}, {"mapping", M_VIEW, MS_REFUSE},
    {"start", M_RANGE, MS_REFUSE}, {"stop", M_RANGE, MS_REFUSE}, {"step", M_RANGE, MS_REFUSE},
    {"count", M_RANGE, MS_REFUSE}, {"index", M_RANGE, MS_REFUSE},
};
#define N_METHODS (sizeof s_methods / sizeof s_methods[0])

static const char *const s_markup_extra[] = {"escape", "unescape", "striptags", NULL};

static int s_class(jv_t v)
{
    switch (v.kind) {
    case JV_STR: return M_STR;
    case JV_LIST: return v.flags & JVF_VIEW ? M_VIEW : M_LIST;
    case JV_TUPLE: return M_TUPLE;
    case JV_DICT: return M_DICT;
    case JV_INT: case JV_FLOAT: case JV_BOOL: return M_NUM;
    case JV_RANGE: return M_RANGE;
    default: return -1;
    }
}

int jmethod_lookup(jctx_t *c, int line, jv_t obj, const char *name, jv_t *out)
{
    int cls = s_class(obj);
    if (cls < 0) return 0;
    for (size_t i = 0; i < N_METHODS; i++) {
        const mdef_t *m = &s_methods[i];
        if (m->cls != cls || strcmp(m->name, name)) continue;
        if (cls == M_STR && obj.flags & JVF_MARKUP)
            return jerr(c, line, "the method '%s' of a safe (Markup) string is not supported", name);
        if (m->status == MS_REFUSE)
            return jerr(c, line, "the %s method or attribute '%s' is not supported", jv_type_name(obj), name);
        if (m->status == MS_UNSAFE) {
            *out = jv_undef_msg(c, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
            out->flags |= JVF_UNSAFE;
            return c->failed ? -1 : 1;
        }
        jfunc_t *fn = ja_alloc(&c->a, sizeof *fn);
        jv_t *self = ja_alloc(&c->a, sizeof *self);
        if (!fn || !self) return jerr_oom(c, line);
        *self = obj;
        fn->id = JF_METHOD_BASE + (int)i;
        fn->name = m->name;
        fn->self = self;
        *out = jv_of(JV_FUNC, fn);
        return 1;
    }
    if (cls == M_STR && obj.flags & JVF_MARKUP)
        for (const char *const *p = s_markup_extra; *p; p++)
            if (!strcmp(*p, name)) return jerr(c, line, "the method '%s' of a safe (Markup) string is not supported", name);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* string operations shared with the filters */

static jv_t s_sv(jstr_t *s) { return s ? jv_str(s) : jv_undef(); }

static bool s_in_chars(const jstr_t *chars, uint32_t cp)
{
    for (size_t i = 0; i < chars->len;)
        if (ju8_next(chars->p, chars->len, &i) == cp) return true;
    return false;
}

int jstr_strip(jctx_t *c, const jstr_t *s, const jstr_t *chars, int which, jv_t *out)
{
    size_t a = 0, b = s->len;
    if (which & 1)
        while (a < b) {
            size_t k = a;
            uint32_t cp = ju8_next(s->p, b, &k);
            if (chars ? !s_in_chars(chars, cp) : !jpy_isspace(cp)) break;
            a = k;
        }
    if (which & 2)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)s->p[st] & 0xC0) == 0x80) st--;
            size_t k = st;
            uint32_t cp = ju8_next(s->p, b, &k);
            if (chars ? !s_in_chars(chars, cp) : !jpy_isspace(cp)) break;
            b = st;
        }
    *out = s_sv(js_new(c, s->p + a, b - a));
    return c->failed ? -1 : 0;
}

int jstr_replace(jctx_t *c, int line, const jstr_t *s, const jstr_t *old, const jstr_t *new_, int64_t count,
                 jv_t *out)
{
    jbuf_t b = {0};
    if (count < 0) count = INT64_MAX;
    if (!old->len) {
        /* an empty old inserts new before every character and at the end */
        int64_t k = 0;
        for (size_t i = 0; i <= s->len;) {
            if (k < count) {
                if (jb_put(c, &b, new_->p, new_->len)) return -1;
                k++;
            }
            if (i == s->len) break;
            size_t st = i;
            ju8_next(s->p, s->len, &i);
            if (jb_put(c, &b, s->p + st, i - st)) return -1;
        }
    } else {
        size_t i = 0;
        int64_t k = 0;
        while (i < s->len) {
            const char *hit = k < count ? memmem(s->p + i, s->len - i, old->p, old->len) : NULL;
            if (!hit) {
                if (jb_put(c, &b, s->p + i, s->len - i)) return -1;
                break;
            }
            size_t at = (size_t)(hit - s->p);
            if (jb_put(c, &b, s->p + i, at - i) || jb_put(c, &b, new_->p, new_->len)) return -1;
            i = at + old->len;
            k++;
        }
    }
    (void)line;
    *out = s_sv(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

int jstr_splitlines(jctx_t *c, const jstr_t *s, bool keepends, jlist_t **out)
{
    jlist_t *l = jl_new(c, 0);
    if (!l) return -1;
    size_t st = 0;
    for (size_t i = 0; i < s->len;) {
        size_t at = i;
        uint32_t cp = ju8_next(s->p, s->len, &i);
        if (!jpy_is_linebreak(cp)) continue;
        if (cp == '\r' && i < s->len && s->p[i] == '\n') i++;
        jstr_t *ln = js_new(c, s->p + st, (keepends ? i : at) - st);
        if (!ln || jl_push(c, l, jv_str(ln))) return -1;
        st = i;
    }
    if (st < s->len) {
        jstr_t *ln = js_new(c, s->p + st, s->len - st);
        if (!ln || jl_push(c, l, jv_str(ln))) return -1;
    }
    *out = l;
    return 0;
}

/* Clamp Python-style [start, end) code point bounds of s; b0/b1 give byte offsets. */
static int s_bounds(jctx_t *c, int line, const jstr_t *s, const jv_t *start, const jv_t *end, int64_t *a, int64_t *b)
{
    int64_t n = (int64_t)s->ncp;
    *a = 0;
    *b = n;
    for (int k = 0; k < 2; k++) {
        const jv_t *v = k ? end : start;
        if (!v || v->kind == JV_NONE) continue;
        if (!jv_is_intlike(*v)) return jerr(c, line, "slice indices must be integers or None");
        int64_t x = v->u.i;
        if (x < 0) {
            x += n;
            if (x < 0) x = 0;
        } else if (x > n) {
            x = n;
        }
        *(k ? b : a) = x;
    }
    return 0;
}

static int64_t s_cp_index(const jstr_t *s, size_t byte)
{
    if (s->ncp == s->len) return (int64_t)byte;
    return (int64_t)ju8_count(s->p, byte);
}

/* find/rfind/index/rindex/count over s[a:b]: returns the code point index or -1; count mode counts. */
static int64_t s_find(const jstr_t *s, const jstr_t *sub, int64_t a, int64_t b, bool rev, bool count)
{
    if (a > b) return count ? 0 : -1;
    size_t x = ju8_offset(s, a), y = ju8_offset(s, b);
    if (count) {
        if (!sub->len) return b - a + 1;
        int64_t k = 0;
        for (size_t i = x; i + sub->len <= y;) {
            const char *h = memmem(s->p + i, y - i, sub->p, sub->len);
            if (!h) break;
            k++;
            i = (size_t)(h - s->p) + sub->len;
        }
        return k;
    }
    if (sub->len > y - x) return -1;
    if (!rev) {
        const char *h = memmem(s->p + x, y - x, sub->p, sub->len);
        return h ? s_cp_index(s, (size_t)(h - s->p)) : -1;
    }
    for (size_t i = y - sub->len + 1; i-- > x;)
        if (!memcmp(s->p + i, sub->p, sub->len)) return s_cp_index(s, i);
    return -1;
}

static bool s_ws_at(const jstr_t *s, size_t i, size_t *next)
{
    size_t k = i;
    uint32_t cp = ju8_next(s->p, s->len, &k);
    *next = k;
    return jpy_isspace(cp);
}

static int s_split(jctx_t *c, int line, const jstr_t *s, const jstr_t *sep, int64_t maxsplit, bool rev, jv_t *out)
{
    jlist_t *l = jl_new(c, 0);
    if (!l) return -1;
    if (maxsplit < 0) maxsplit = INT64_MAX;
    if (sep && !sep->len) return jerr(c, line, "empty separator");
    if (!sep) {
        /* runs of whitespace; no empty strings */
        if (!rev) {
            size_t i = 0, nx;
            int64_t k = 0;
            while (i < s->len) {
                while (i < s->len && s_ws_at(s, i, &nx)) i = nx;
                if (i >= s->len) break;
                size_t st = i;
                if (k >= maxsplit) {
                    /* the rest, as it is (its trailing whitespace kept) */
                    jstr_t *w = js_new(c, s->p + st, s->len - st);
                    if (!w || jl_push(c, l, jv_str(w))) return -1;
                    break;
                }
                while (i < s->len && !s_ws_at(s, i, &nx)) i = nx;
                jstr_t *w = js_new(c, s->p + st, i - st);
                if (!w || jl_push(c, l, jv_str(w))) return -1;
                k++;
            }
        } else {
            /* from the right: collect pieces, then reverse */
            size_t e = s->len, nx;
            int64_t k = 0;
            while (e > 0) {
                while (e > 0) {
                    size_t p = e - 1;
                    while (p > 0 && ((unsigned char)s->p[p] & 0xC0) == 0x80) p--;
                    if (!s_ws_at(s, p, &nx)) break;
                    e = p;
                }
                if (!e) break;
                if (k >= maxsplit) {
                    jstr_t *w = js_new(c, s->p, e);
                    if (!w || jl_push(c, l, jv_str(w))) return -1;
                    break;
                }
                size_t st = e;
                while (st > 0) {
                    size_t p = st - 1;
                    while (p > 0 && ((unsigned char)s->p[p] & 0xC0) == 0x80) p--;
                    if (s_ws_at(s, p, &nx)) break;
                    st = p;
                }
                jstr_t *w = js_new(c, s->p + st, e - st);
                if (!w || jl_push(c, l, jv_str(w))) return -1;
                e = st;
                k++;
            }
            for (size_t i = 0; i < l->n / 2; i++) {
                jv_t t = l->v[i];
                l->v[i] = l->v[l->n - 1 - i];
                l->v[l->n - 1 - i] = t;
            }
        }
        *out = jv_of(JV_LIST, l);
        return 0;
    }
    if (!rev) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *h = k < maxsplit ? memmem(s->p + i, s->len - i, sep->p, sep->len) : NULL;
            size_t e = h ? (size_t)(h - s->p) : s->len;
            jstr_t *w = js_new(c, s->p + i, e - i);
            if (!w || jl_push(c, l, jv_str(w))) return -1;
            if (!h) break;
            i = e + sep->len;
            k++;
        }
    } else {
        size_t e = s->len;
        int64_t k = 0;
        for (;;) {
            size_t hit = SIZE_MAX;
            if (k < maxsplit && e >= sep->len)
                for (size_t i = e - sep->len + 1; i-- > 0;)
                    if (!memcmp(s->p + i, sep->p, sep->len)) { hit = i; break; }
            size_t st = hit == SIZE_MAX ? 0 : hit + sep->len;
            jstr_t *w = js_new(c, s->p + st, e - st);
            if (!w || jl_push(c, l, jv_str(w))) return -1;
            if (hit == SIZE_MAX) break;
            e = hit;
            k++;
        }
        for (size_t i = 0; i < l->n / 2; i++) {
            jv_t t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    }
    *out = jv_of(JV_LIST, l);
    return 0;
}

/* str.format as the sandbox's SandboxedFormatter runs it: {}, {0}, {name}, .attr and [key]
 * fields, !s and !r; a format spec after ':' is refused. */
static int s_format(jctx_t *c, int line, const jstr_t *f, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv,
                    size_t nkw, jv_t *out)
{
    jbuf_t b = {0};
    size_t auto_idx = 0;
    bool used_auto = false, used_manual = false;
    for (size_t i = 0; i < f->len; i++) {
        char ch = f->p[i];
        if (ch == '}') {
            if (i + 1 < f->len && f->p[i + 1] == '}') { if (jb_putc(c, &b, '}')) return -1; i++; continue; }
            return jerr(c, line, "Single '}' encountered in format string");
        }
        if (ch != '{') { if (jb_putc(c, &b, ch)) return -1; continue; }
        if (i + 1 < f->len && f->p[i + 1] == '{') { if (jb_putc(c, &b, '{')) return -1; i++; continue; }
        size_t j = i + 1;
        while (j < f->len && f->p[j] != '}' && f->p[j] != '!' && f->p[j] != ':' && f->p[j] != '{') j++;
        if (j >= f->len || f->p[j] == '{') return jerr(c, line, "unmatched '{' in format string");
        /* field: first part up to '.' or '[' */
        size_t fe = j, k = i + 1;
        while (k < fe && f->p[k] != '.' && f->p[k] != '[') k++;
        jv_t v;
        if (k == i + 1) {
            if (used_manual) return jerr(c, line, "cannot switch from manual field specification to automatic field numbering");
            used_auto = true;
            if (auto_idx >= nargs) return jerr(c, line, "Replacement index %zu out of range for positional args tuple", auto_idx);
            v = args[auto_idx++];
        } else if (f->p[i + 1] >= '0' && f->p[i + 1] <= '9') {
            if (used_auto) return jerr(c, line, "cannot switch from automatic field numbering to manual field specification");
            used_manual = true;
            size_t idx = 0;
            for (size_t q = i + 1; q < k; q++) {
                if (f->p[q] < '0' || f->p[q] > '9') return jerr(c, line, "a format field name is not supported");
                idx = idx * 10 + (size_t)(f->p[q] - '0');
                if (idx > 1000000) return jerr(c, line, "format index too large");
            }
            if (idx >= nargs) return jerr(c, line, "Replacement index %zu out of range for positional args tuple", idx);
            v = args[idx];
        } else {
            size_t q;
            for (q = 0; q < nkw; q++)
                if (strlen(kwn[q]) == k - i - 1 && !memcmp(kwn[q], f->p + i + 1, k - i - 1)) break;
            if (q == nkw) return jerr(c, line, "KeyError in str.format: '%.*s'", (int)(k - i - 1), f->p + i + 1);
            v = kwv[q];
        }
        /* .attr / [key] chain */
        while (k < fe) {
            if (f->p[k] == '.') {
                size_t e = k + 1;
                while (e < fe && f->p[e] != '.' && f->p[e] != '[') e++;
                jstr_t *nm = js_new(c, f->p + k + 1, e - k - 1);
                if (!nm || jeval_getattr(c, line, v, nm->p, &v)) return -1;
                k = e;
            } else {
                size_t e = k + 1;
                while (e < fe && f->p[e] != ']') e++;
                if (e >= fe) return jerr(c, line, "Missing ']' in format string");
                jv_t key;
                bool digits = e > k + 1;
                for (size_t q = k + 1; q < e; q++)
                    if (f->p[q] < '0' || f->p[q] > '9') digits = false;
                if (digits) {
                    key = jv_int(strtoll(f->p + k + 1, NULL, 10));
                } else {
                    jstr_t *ks = js_new(c, f->p + k + 1, e - k - 1);
                    if (!ks) return -1;
                    key = jv_str(ks);
                }
                if (jeval_getitem(c, line, v, key, &v)) return -1;
                k = e + 1;
            }
        }
        char conv = 's';
        size_t e = j;
        if (f->p[e] == '!') {
            if (e + 1 >= f->len) return jerr(c, line, "end of string while looking for conversion specifier");
            conv = f->p[e + 1];
            e += 2;
            if (conv != 's' && conv != 'r') return jerr(c, line, "the format conversion '!%c' is not supported", conv);
        }
        if (e < f->len && f->p[e] == ':') {
            if (e + 1 < f->len && f->p[e + 1] == '}') e++;
            else return jerr(c, line, "format specs in str.format are not supported");
        }
        if (e >= f->len || f->p[e] != '}') return jerr(c, line, "expected '}' before end of string");
        if (conv == 'r' ? jv_repr(c, line, v, &b) : jv_to_str(c, line, v, &b)) return -1;
        i = e;
    }
    *out = s_sv(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

static int s_pad(jctx_t *c, int line, const jstr_t *s, jv_t *args, size_t nargs, int how, jv_t *out)
{
    if (nargs < 1 || nargs > 2 || !jv_is_intlike(args[0])) return jerr(c, line, "expected an integer width");
    const char *fill = " ";
    size_t fl = 1;
    if (nargs == 2) {
        if (args[1].kind != JV_STR || args[1].u.s->ncp != 1) return jerr(c, line, "The fill character must be exactly one character long");
        fill = args[1].u.s->p;
        fl = args[1].u.s->len;
    }
    int64_t w = args[0].u.i, n = (int64_t)s->ncp;
    if (w <= n) { *out = jv_str((jstr_t *)s); return 0; }
    if (w > 1 << 20) return jerr(c, line, "padding wider than 1M is not supported");
    int64_t pad = w - n, left = how == 'l' ? 0 : how == 'r' ? pad : pad / 2 + (pad & w & 1);
    jbuf_t b = {0};
    for (int64_t i = 0; i < left; i++) if (jb_put(c, &b, fill, fl)) return -1;
    if (jb_put(c, &b, s->p, s->len)) return -1;
    for (int64_t i = 0; i < pad - left; i++) if (jb_put(c, &b, fill, fl)) return -1;
    *out = s_sv(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

static int s_is(jctx_t *c, int line, const jstr_t *s, const char *what, jv_t *out)
{
    if (!s->len && strcmp(what, "isascii")) { *out = jv_bool(false); return 0; }
    if (!strcmp(what, "islower") || !strcmp(what, "isupper")) {
        bool upper = what[2] == 'u', any = false;
        for (size_t i = 0; i < s->len;) {
            uint32_t cp = ju8_next(s->p, s->len, &i);
            int k = jpy_cp_category(cp);
            bool up = cp < 0x80 ? (cp >= 'A' && cp <= 'Z') : k == 1 || k == 3;
            bool lo = cp < 0x80 ? (cp >= 'a' && cp <= 'z') : k == 2;
            if (upper ? lo : up) { *out = jv_bool(false); return 0; }
            if (upper ? up : lo) any = true;
        }
        *out = jv_bool(any);
        return 0;
    }
    bool r = true;
    for (size_t i = 0; i < s->len && r;) {
        uint32_t cp = ju8_next(s->p, s->len, &i);
        int k = jpy_cp_category(cp);
        bool alpha = cp < 0x80 ? ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') : k >= 1 && k <= 5;
        bool dec = cp < 0x80 ? (cp >= '0' && cp <= '9') : k == 9;
        if (cp >= 0x80 && (k == 10 || k == 11) && strcmp(what, "isalpha") && strcmp(what, "isdecimal") &&
            strcmp(what, "isspace") && strcmp(what, "isascii"))
            return jerr(c, line, "str.%s() of U+%04X is not supported", what, cp);
        if (!strcmp(what, "isascii")) r = cp < 0x80;
        else if (!strcmp(what, "isspace")) r = jpy_isspace(cp);
        else if (!strcmp(what, "isalpha")) r = alpha;
        else if (!strcmp(what, "isdecimal") || !strcmp(what, "isdigit")) r = dec;
        else r = alpha || dec; /* isalnum */
    }
    *out = jv_bool(r);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* method calls */

static int s_nokw(jctx_t *c, int line, const char *name, size_t nkw)
{
    return nkw ? jerr(c, line, "%s() takes no keyword arguments", name) : 0;
}

static int s_argc(jctx_t *c, int line, const char *name, size_t n, size_t lo, size_t hi)
{
    if (n < lo || n > hi) return jerr(c, line, "%s() takes %zu to %zu arguments (%zu given)", name, lo, hi, n);
    return 0;
}

static int s_str_arg(jctx_t *c, int line, const char *name, jv_t v, jstr_t **out)
{
    if (v.kind != JV_STR) {
        if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
        return jerr(c, line, "%s() argument must be str, not %s", name, jv_type_name(v));
    }
    *out = v.u.s;
    return 0;
}

static int s_list_find(jctx_t *c, int line, const jlist_t *l, jv_t x, jv_t *args, size_t nargs, bool count, jv_t *out)
{
    int64_t n = (int64_t)l->n, a = 0, b = n;
    for (size_t k = 1; k < nargs && k < 3; k++) {
        if (!jv_is_intlike(args[k])) return jerr(c, line, "slice indices must be integers");
        int64_t v = args[k].u.i;
        if (v < 0) { v += n; if (v < 0) v = 0; } else if (v > n) v = n;
        if (k == 1) a = v; else b = v;
    }
    int64_t k = 0;
    for (int64_t i = count ? 0 : a; i < (count ? n : b); i++) {
        bool eq;
        if (jv_eq(c, l->v[i], x, &eq)) return -1;
        if (!eq) continue;
        if (!count) { *out = jv_int(i); return 0; }
        k++;
    }
    if (count) { *out = jv_int(k); return 0; }
    return jerr(c, line, "value is not in the list");
}

static int s_view(jctx_t *c, const jdict_t *d, int which, jv_t *out)
{
    jlist_t *l = jl_new(c, d->n);
    if (!l) return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (which == 0) {
            jlist_t *t = jl_new(c, 2);
            if (!t) return -1;
            t->v[0] = d->k[i];
            t->v[1] = d->v[i];
            t->n = 2;
            l->v[l->n++] = jv_of(JV_TUPLE, t);
        } else {
            l->v[l->n++] = which == 1 ? d->k[i] : d->v[i];
        }
    }
    *out = jv_of(JV_LIST, l);
    out->flags = which == 0 ? JVF_VIEW_ITEMS : which == 1 ? JVF_VIEW_KEYS : JVF_VIEW_VALUES;
    return 0;
}

int jmethod_call(jctx_t *c, int line, jfunc_t *fn, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv, size_t nkw,
                 jv_t *out)
{
    const mdef_t *m = &s_methods[fn->id - JF_METHOD_BASE];
    const char *nm = m->name;
    jv_t self = *fn->self;
    if (m->cls == M_STR) {
        const jstr_t *s = self.u.s;
        jstr_t *x = NULL, *y = NULL;
        if (!strcmp(nm, "format")) return s_format(c, line, s, args, nargs, kwn, kwv, nkw, out);
        if (!strcmp(nm, "split") || !strcmp(nm, "rsplit")) {
            jv_t sep = jv_none(), maxs = jv_int(-1);
            if (nargs > 2) return jerr(c, line, "%s() takes at most 2 arguments", nm);
            if (nargs > 0) sep = args[0];
            if (nargs > 1) maxs = args[1];
            for (size_t k = 0; k < nkw; k++) {
                if (!strcmp(kwn[k], "sep") && nargs < 1) sep = kwv[k];
                else if (!strcmp(kwn[k], "maxsplit") && nargs < 2) maxs = kwv[k];
                else return jerr(c, line, "%s() got an unexpected keyword argument '%s'", nm, kwn[k]);
            }
            if (sep.kind != JV_NONE && s_str_arg(c, line, nm, sep, &x)) return -1;
            if (!jv_is_intlike(maxs)) return jerr(c, line, "maxsplit must be an integer");
            return s_split(c, line, s, x, maxs.u.i, nm[0] == 'r', out);
        }
        if (!strcmp(nm, "splitlines")) {
            bool keep = false;
            if (nargs > 1) return jerr(c, line, "splitlines() takes at most 1 argument");
            if (nargs) keep = jv_truthy(args[0]);
            for (size_t k = 0; k < nkw; k++) {
                if (strcmp(kwn[k], "keepends")) return jerr(c, line, "splitlines() got an unexpected keyword argument '%s'", kwn[k]);
                keep = jv_truthy(kwv[k]);
            }
            jlist_t *l;
            if (jstr_splitlines(c, s, keep, &l)) return -1;
            *out = jv_of(JV_LIST, l);
            return 0;
        }
        if (s_nokw(c, line, nm, nkw)) return -1;
        if (!strcmp(nm, "strip") || !strcmp(nm, "lstrip") || !strcmp(nm, "rstrip")) {
            if (s_argc(c, line, nm, nargs, 0, 1)) return -1;
            if (nargs && args[0].kind != JV_NONE && s_str_arg(c, line, nm, args[0], &x)) return -1;
            return jstr_strip(c, s, x, nm[0] == 'l' ? 1 : nm[0] == 'r' ? 2 : 3, out);
        }
        if (!strcmp(nm, "upper") || !strcmp(nm, "lower") || !strcmp(nm, "title") || !strcmp(nm, "capitalize") ||
            !strcmp(nm, "swapcase")) {
            if (s_argc(c, line, nm, nargs, 0, 0)) return -1;
            int mode = nm[0] == 'u' ? JCASE_UPPER : nm[0] == 'l' ? JCASE_LOWER : nm[0] == 't' ? JCASE_TITLE :
                       nm[0] == 'c' ? JCASE_CAPITALIZE : JCASE_SWAPCASE;
            jbuf_t b = {0};
            if (jpy_case(c, line, s, mode, &b)) return -1;
            *out = s_sv(jb_str(c, &b));
            return c->failed ? -1 : 0;
        }
        if (!strcmp(nm, "startswith") || !strcmp(nm, "endswith")) {
            if (s_argc(c, line, nm, nargs, 1, 3)) return -1;
            int64_t a, b;
            if (s_bounds(c, line, s, nargs > 1 ? &args[1] : NULL, nargs > 2 ? &args[2] : NULL, &a, &b)) return -1;
            const jv_t *cands = &args[0];
            size_t nc = 1;
            if (args[0].kind == JV_TUPLE) {
                cands = args[0].u.l->v;
                nc = args[0].u.l->n;
            } else if (args[0].kind != JV_STR) {
                return jerr(c, line, "%s first arg must be str or a tuple of str, not %s", nm, jv_type_name(args[0]));
            }
            bool r = false;
            size_t xa = ju8_offset(s, a), xb = ju8_offset(s, b);
            for (size_t k = 0; k < nc && !r; k++) {
                if (cands[k].kind != JV_STR) return jerr(c, line, "tuple for %s must only contain str", nm);
                const jstr_t *p = cands[k].u.s;
                if (a > b || p->len > xb - xa) continue;
                r = nm[0] == 's' ? !memcmp(s->p + xa, p->p, p->len) : !memcmp(s->p + xb - p->len, p->p, p->len);
            }
            *out = jv_bool(r);
            return 0;
        }
        if (!strcmp(nm, "find") || !strcmp(nm, "rfind") || !strcmp(nm, "index") || !strcmp(nm, "rindex") ||
            !strcmp(nm, "count")) {
            if (s_argc(c, line, nm, nargs, 1, 3) || s_str_arg(c, line, nm, args[0], &x)) return -1;
            int64_t a, b;
            if (s_bounds(c, line, s, nargs > 1 ? &args[1] : NULL, nargs > 2 ? &args[2] : NULL, &a, &b)) return -1;
            bool count = !strcmp(nm, "count"), rev = nm[0] == 'r';
            int64_t r = s_find(s, x, a, b, rev, count);
            if (!count && r < 0 && strstr(nm, "index")) return jerr(c, line, "substring not found");
            *out = jv_int(r);
            return 0;
        }
        if (!strcmp(nm, "replace")) {
            if (s_argc(c, line, nm, nargs, 2, 3) || s_str_arg(c, line, nm, args[0], &x) || s_str_arg(c, line, nm, args[1], &y))
                return -1;
            int64_t count = -1;
            if (nargs > 2) {
                if (!jv_is_intlike(args[2])) return jerr(c, line, "replace() count must be an integer");
                count = args[2].u.i;
            }
            return jstr_replace(c, line, s, x, y, count, out);
        }
        if (!strcmp(nm, "join")) {
            if (s_argc(c, line, nm, nargs, 1, 1)) return -1;
            jlist_t *l;
            if (args[0].kind == JV_UNDEF) return jv_undef_error(c, line, args[0]);
            if (jeval_iter_begin(c, line, args[0], &l)) return -1;
            jbuf_t b = {0};
            for (size_t k = 0; k < l->n; k++) {
                if (l->v[k].kind != JV_STR)
                    return jerr(c, line, "sequence item %zu: expected str instance, %s found", k, jv_type_name(l->v[k]));
                if ((k && jb_put(c, &b, s->p, s->len)) || jb_put(c, &b, l->v[k].u.s->p, l->v[k].u.s->len)) return -1;
            }
            *out = s_sv(jb_str(c, &b));
            return c->failed ? -1 : 0;
        }
        if (!strcmp(nm, "partition") || !strcmp(nm, "rpartition")) {
            if (s_argc(c, line, nm, nargs, 1, 1) || s_str_arg(c, line, nm, args[0], &x)) return -1;
            if (!x->len) return jerr(c, line, "empty separator");
            int64_t at = s_find(s, x, 0, (int64_t)s->ncp, nm[0] == 'r', false);
            jlist_t *t = jl_new(c, 3);
            if (!t) return -1;
            jstr_t *empty = js_new(c, "", 0);
            if (!empty) return -1;
            if (at < 0) {
                t->v[0] = nm[0] == 'r' ? jv_str(empty) : jv_str((jstr_t *)s);
                t->v[1] = jv_str(empty);
                t->v[2] = nm[0] == 'r' ? jv_str((jstr_t *)s) : jv_str(empty);
            } else {
                size_t o = ju8_offset(s, at);
                jstr_t *l = js_new(c, s->p, o), *r = js_new(c, s->p + o + x->len, s->len - o - x->len);
                if (!l || !r) return -1;
                t->v[0] = jv_str(l);
                t->v[1] = jv_str(x);
                t->v[2] = jv_str(r);
            }
            t->n = 3;
            *out = jv_of(JV_TUPLE, t);
            return 0;
        }
        if (!strcmp(nm, "removeprefix") || !strcmp(nm, "removesuffix")) {
            if (s_argc(c, line, nm, nargs, 1, 1) || s_str_arg(c, line, nm, args[0], &x)) return -1;
            bool pre = nm[6] == 'p';
            if (x->len <= s->len && !memcmp(pre ? s->p : s->p + s->len - x->len, x->p, x->len))
                *out = s_sv(js_new(c, pre ? s->p + x->len : s->p, s->len - x->len));
            else
                *out = self;
            return c->failed ? -1 : 0;
        }
        if (!strcmp(nm, "ljust")) return s_pad(c, line, s, args, nargs, 'l', out);
        if (!strcmp(nm, "rjust")) return s_pad(c, line, s, args, nargs, 'r', out);
        if (!strcmp(nm, "center")) return s_pad(c, line, s, args, nargs, 'c', out);
        if (!strcmp(nm, "zfill")) {
            if (s_argc(c, line, nm, nargs, 1, 1) || !jv_is_intlike(args[0])) return jerr(c, line, "zfill() takes an integer");
            int64_t w = args[0].u.i, n = (int64_t)s->ncp;
            if (w <= n) { *out = self; return 0; }
            if (w > 1 << 20) return jerr(c, line, "zfill() wider than 1M is not supported");
            jbuf_t b = {0};
            size_t st = 0;
            if (s->len && (s->p[0] == '+' || s->p[0] == '-')) { if (jb_putc(c, &b, s->p[0])) return -1; st = 1; }
            for (int64_t i = 0; i < w - n; i++) if (jb_putc(c, &b, '0')) return -1;
            if (jb_put(c, &b, s->p + st, s->len - st)) return -1;
            *out = s_sv(jb_str(c, &b));
            return c->failed ? -1 : 0;
        }
        if (!strncmp(nm, "is", 2)) {
            if (s_argc(c, line, nm, nargs, 0, 0)) return -1;
            return s_is(c, line, s, nm, out);
        }
        return jerr(c, line, "the str method '%s' is not supported", nm);
    }
    if (s_nokw(c, line, nm, nkw)) return -1;
    if (m->cls == M_LIST || m->cls == M_TUPLE) {
        const jlist_t *l = self.u.l;
        if (!strcmp(nm, "copy")) {
            if (s_argc(c, line, nm, nargs, 0, 0)) return -1;
            jlist_t *r = jl_new(c, l->n);
            if (!r) return -1;
            for (size_t i = 0; i < l->n; i++) r->v[r->n++] = l->v[i];
            *out = jv_of(JV_LIST, r);
            return 0;
        }
        if (!strcmp(nm, "count")) {
            if (s_argc(c, line, nm, nargs, 1, 1)) return -1;
            return s_list_find(c, line, l, args[0], args, 1, true, out);
        }
        if (!strcmp(nm, "index")) {
            if (s_argc(c, line, nm, nargs, 1, 3)) return -1;
            return s_list_find(c, line, l, args[0], args, nargs, false, out);
        }
    }
    if (m->cls == M_DICT) {
        const jdict_t *d = self.u.d;
        if (!strcmp(nm, "get")) {
            if (s_argc(c, line, nm, nargs, 1, 2)) return -1;
            if (!jv_hashable(args[0])) return jerr(c, line, "unhashable type: '%s'", jv_type_name(args[0]));
            jv_t *v = jd_get(d, args[0]);
            *out = v ? *v : nargs > 1 ? args[1] : jv_none();
            return 0;
        }
        if (s_argc(c, line, nm, nargs, 0, 0)) return -1;
        if (!strcmp(nm, "items")) return s_view(c, d, 0, out);
        if (!strcmp(nm, "keys")) return s_view(c, d, 1, out);
        if (!strcmp(nm, "values")) return s_view(c, d, 2, out);
        if (!strcmp(nm, "copy")) {
            jdict_t *r = jd_new(c, d->n);
            if (!r) return -1;
            for (size_t i = 0; i < d->n; i++) { r->k[i] = d->k[i]; r->v[i] = d->v[i]; }
            r->n = d->n;
            *out = jv_of(JV_DICT, r);
            return 0;
        }
    }
    return jerr(c, line, "the method '%s' is not supported", nm);
}

/* ------------------------------------------------------------------------------------------ */
/* globals */

static const struct {
    const char *name;
    int id;
} s_globals[] = {
    {"range", JF_RANGE}, {"dict", JF_DICT}, {"namespace", JF_NAMESPACE}, {"raise_exception", JF_RAISE},
    {"strftime_now", JF_STRFTIME}, {"cycler", JF_CYCLER}, {"joiner", JF_JOINER}, {"lipsum", -1},
};

int jglobal_lookup(const char *name, jv_t *out, jctx_t *c)
{
    for (size_t i = 0; i < sizeof s_globals / sizeof s_globals[0]; i++)
        if (!strcmp(s_globals[i].name, name)) {
            jfunc_t *fn = ja_alloc(&c->a, sizeof *fn);
            if (!fn) return 0;
            fn->id = s_globals[i].id;
            fn->name = s_globals[i].name;
            fn->self = NULL;
            *out = jv_of(JV_FUNC, fn);
            return 1;
        }
    return 0;
}

/* dict(*args, **kwargs) into d */
static int s_dict_args(jctx_t *c, int line, const char *what, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv,
                       size_t nkw, jdict_t *d)
{
    if (nargs > 1) return jerr(c, line, "%s expected at most 1 argument, got %zu", what, nargs);
    if (nargs == 1) {
        jv_t src = args[0];
        if (src.kind == JV_DICT || src.kind == JV_NS) {
            for (size_t i = 0; i < src.u.d->n; i++)
                if (jd_set(c, d, src.u.d->k[i], src.u.d->v[i])) return -1;
        } else {
            jlist_t *l;
            if (jeval_iter_begin(c, line, src, &l)) return -1;
            for (size_t i = 0; i < l->n; i++) {
                jlist_t *pair;
                jv_t it = l->v[i];
                if (it.kind != JV_LIST && it.kind != JV_TUPLE && it.kind != JV_STR)
                    return jerr(c, line, "cannot convert %s sequence element #%zu to a sequence", what, i);
                if (jeval_iter_begin(c, line, it, &pair)) return -1;
                if (pair->n != 2)
                    return jerr(c, line, "%s sequence element #%zu has length %zu; 2 is required", what, i, pair->n);
                if (!jv_hashable(pair->v[0])) return jerr(c, line, "unhashable type: '%s'", jv_type_name(pair->v[0]));
                if (jd_set(c, d, pair->v[0], pair->v[1])) return -1;
            }
        }
    }
    for (size_t k = 0; k < nkw; k++) {
        jv_t key = jv_cstr(c, kwn[k]);
        if (c->failed || jd_set(c, d, key, kwv[k])) return -1;
    }
    return 0;
}

static int s_strftime(jctx_t *c, int line, jv_t fmtv, jv_t *out)
{
    if (fmtv.kind != JV_STR) return jerr(c, line, "strftime() argument 1 must be str, not %s", jv_type_name(fmtv));
    const jstr_t *f = fmtv.u.s;
    /* datetime.strftime: %f, %z and %Z are datetime's own (naive: "000000", "", "") */
    jbuf_t fb = {0};
    for (size_t i = 0; i < f->len; i++) {
        if (f->p[i] == '%' && i + 1 < f->len) {
            char k = f->p[i + 1];
            if (k == 'f') { if (jb_put(c, &fb, "000000", 6)) return -1; i++; continue; }
            if (k == 'z' || k == 'Z') { i++; continue; }
            if (jb_put(c, &fb, f->p + i, 2)) return -1;
            i++;
            continue;
        }
        if (jb_putc(c, &fb, f->p[i])) return -1;
    }
    if (!fb.n) {
        *out = jv_cstr(c, "");
        return c->failed ? -1 : 0;
    }
    if (memchr(fb.p, 0, fb.n)) return jerr(c, line, "embedded null character in strftime format");
    time_t t = (time_t)c->now_unix;
    struct tm tm;
    if (!localtime_r(&t, &tm)) return jerr(c, line, "timestamp out of range");
    size_t cap = 256 + fb.n * 8;
    if (cap > c->lim.max_output) cap = c->lim.max_output;
    char *buf = ja_alloc(&c->a, cap);
    if (!buf) return jerr_oom(c, line);
    /* a leading space tells an empty result from an overflow */
    char *fmt2 = ja_alloc(&c->a, fb.n + 2);
    if (!fmt2) return jerr_oom(c, line);
    fmt2[0] = ' ';
    memcpy(fmt2 + 1, fb.p, fb.n + 1);
    size_t n = strftime(buf, cap, fmt2, &tm);
    if (!n) return jerr(c, line, "strftime result too long");
    if (!ju8_valid(buf + 1, n - 1)) return jerr(c, line, "strftime gave text that is not UTF-8");
    *out = s_sv(js_new(c, buf + 1, n - 1));
    return c->failed ? -1 : 0;
}

int jglobal_call(jctx_t *c, int line, jfunc_t *fn, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv, size_t nkw,
                 jv_t *out)
{
    switch (fn->id) {
    case JF_RANGE: {
        if (s_nokw(c, line, "range", nkw) || s_argc(c, line, "range", nargs, 1, 3)) return -1;
        int64_t v[3] = {0, 0, 1};
        for (size_t i = 0; i < nargs; i++) {
            if (args[i].kind == JV_UNDEF) return jv_undef_error(c, line, args[i]);
            if (!jv_is_intlike(args[i]))
                return jerr(c, line, "'%s' object cannot be interpreted as an integer", jv_type_name(args[i]));
        }
        if (nargs == 1) v[1] = args[0].u.i;
        else {
            v[0] = args[0].u.i;
            v[1] = args[1].u.i;
            if (nargs == 3) v[2] = args[2].u.i;
        }
        if (!v[2]) return jerr(c, line, "range() arg 3 must not be zero");
        __int128 len = v[2] > 0 ? (v[1] > v[0] ? ((__int128)v[1] - v[0] + v[2] - 1) / v[2] : 0)
                                : (v[0] > v[1] ? ((__int128)v[0] - v[1] - v[2] - 1) / -(__int128)v[2] : 0);
        if (len > MAX_RANGE)
            return jerr(c, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d) (the limit).", MAX_RANGE);
        jrange_t *r = ja_alloc(&c->a, sizeof *r);
        if (!r) return jerr_oom(c, line);
        r->start = v[0];
        r->stop = v[1];
        r->step = v[2];
        r->len = (int64_t)len;
        *out = jv_of(JV_RANGE, r);
        return 0;
    }
    case JF_DICT: case JF_NAMESPACE: {
        jdict_t *d = jd_new(c, 0);
        if (!d) return -1;
        if (s_dict_args(c, line, fn->id == JF_DICT ? "dict" : "namespace", args, nargs, kwn, kwv, nkw, d)) return -1;
        if (fn->id == JF_NAMESPACE)
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].kind != JV_STR) return jerr(c, line, "namespace() attribute names must be strings");
        *out = jv_of(fn->id == JF_DICT ? JV_DICT : JV_NS, d);
        return 0;
    }
    case JF_RAISE: {
        if (s_nokw(c, line, "raise_exception", nkw) || s_argc(c, line, "raise_exception", nargs, 1, 1)) return -1;
        jstr_t *m = jv_strv(c, line, args[0]);
        if (!m) return -1;
        return jerr(c, line, "%s", m->p);
    }
    case JF_STRFTIME:
        if (s_nokw(c, line, "strftime_now", nkw) || s_argc(c, line, "strftime_now", nargs, 1, 1)) return -1;
        return s_strftime(c, line, args[0], out);
    case JF_CYCLER: {
        if (s_nokw(c, line, "cycler", nkw)) return -1;
        if (!nargs) return jerr(c, line, "at least one item has to be provided");
        jcycler_t *cy = ja_alloc(&c->a, sizeof *cy);
        jlist_t *l = jl_new(c, nargs);
        if (!cy || !l) return jerr_oom(c, line);
        for (size_t i = 0; i < nargs; i++) l->v[l->n++] = args[i];
        cy->items = l;
        cy->pos = 0;
        *out = jv_of(JV_CYCLER, cy);
        return 0;
    }
    case JF_JOINER: {
        jv_t sep = nargs ? args[0] : jv_none();
        if (nargs > 1) return jerr(c, line, "joiner() takes at most 1 argument");
        for (size_t k = 0; k < nkw; k++) {
            if (strcmp(kwn[k], "sep") || nargs) return jerr(c, line, "joiner() got an unexpected keyword argument '%s'", kwn[k]);
            sep = kwv[k];
        }
        jjoiner_t *jo = ja_alloc(&c->a, sizeof *jo);
        if (!jo) return jerr_oom(c, line);
        jo->used = false;
        jo->sep = sep.kind == JV_NONE ? js_new(c, ", ", 2) : jv_strv(c, line, sep);
        if (!jo->sep) return -1;
        *out = jv_of(JV_JOINER, jo);
        return 0;
    }
    case JF_LOOP_CYCLE: {
        if (s_nokw(c, line, "cycle", nkw)) return -1;
        if (!nargs) return jerr(c, line, "no items for cycling given");
        *out = args[fn->self->u.lp->i % nargs];
        return 0;
    }
    case JF_LOOP_CHANGED: {
        if (s_nokw(c, line, "changed", nkw)) return -1;
        jloop_t *lp = fn->self->u.lp;
        jlist_t *t = jl_new(c, nargs);
        if (!t) return -1;
        for (size_t i = 0; i < nargs; i++) t->v[t->n++] = args[i];
        jv_t now = jv_of(JV_TUPLE, t);
        bool same = false;
        if (lp->last_changed && jv_eq(c, *lp->last_changed, now, &same)) return -1;
        if (same) {
            *out = jv_bool(false);
            return 0;
        }
        if (!lp->last_changed && !(lp->last_changed = ja_alloc(&c->a, sizeof(jv_t)))) return jerr_oom(c, line);
        *lp->last_changed = now;
        *out = jv_bool(true);
        return 0;
    }
    case JF_CYCLER_NEXT: case JF_CYCLER_RESET: {
        if (s_nokw(c, line, fn->name, nkw) || s_argc(c, line, fn->name, nargs, 0, 0)) return -1;
        jcycler_t *cy = fn->self->u.cy;
        if (fn->id == JF_CYCLER_RESET) {
            cy->pos = 0;
            *out = jv_none();
            return 0;
        }
        *out = cy->items->v[cy->pos];
        cy->pos = (cy->pos + 1) % cy->items->n;
        return 0;
    }
    default:
        return jerr(c, line, "the global '%s' is not supported", fn->name);
    }
}
