/* jinja_filters.c - jinja2's filters and tests, the methods of Python's str, list, tuple and
 * dict that the sandbox allows, and the globals (range, dict, namespace, cycler, joiner,
 * raise_exception, strftime_now), each as jinja2 3.1 and CPython define them.
 *
 * What jinja2 has and this file does not is refused by name: at parse time for filters and
 * tests, at the attribute lookup for methods. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/jinja_int.h"

#define MAX_RANGE 100000

static bool s_isdigit(char ch) { return ch >= '0' && ch <= '9'; }

/* Bytes of Python whitespace that end p[0..n). */
static size_t s_ws_trailing(const char *p, size_t n)
{
    size_t j = n;
    while (j > 0) {
        size_t st = j - 1;
        while (st > 0 && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
        size_t k = st;
        if (!jpy_isspace(ju8_next(p, n, &k))) break;
        j = st;
    }
    return j;
}

/* str(v) for filters that take a string (jinja2's soft_str): a Markup value stays Markup,
 * which changes what the string methods return; those filters refuse it. */
static int s_soft_str(jctx_t *c, int line, jv_t v, const char *fname, jstr_t **out)
{
    if (v.kind == JV_STR && v.flags & JVF_MARKUP)
        return jerr(c, line, "the filter '%s' on a safe (Markup) string is not supported", fname);
    if (v.kind == JV_UNDEF && v.flags & JVF_UNSAFE) {
        *out = js_new(c, "", 0);
        return *out ? 0 : -1;
    }
    *out = jv_strv(c, line, v);
    return *out ? 0 : -1;
}

static jv_t s_s(jstr_t *s) { return s ? jv_str(s) : jv_undef(); }

static int s_need_int(jctx_t *c, int line, jv_t v, const char *what, int64_t *out)
{
    if (jv_is_intlike(v)) {
        *out = v.u.i;
        return 0;
    }
    if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
    return jerr(c, line, "%s must be an integer, not '%s'", what, jv_type_name(v));
}

static int s_need_str(jctx_t *c, int line, jv_t v, const char *what, jstr_t **out)
{
    if (v.kind == JV_STR) {
        *out = v.u.s;
        return 0;
    }
    if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
    return jerr(c, line, "%s must be str, not %s", what, jv_type_name(v));
}

/* jinja2's make_attrgetter: "a.b.0" looked up part by part with getitem semantics. */
static int s_attrget(jctx_t *c, int line, jv_t item, jv_t attr, const jv_t *dflt, bool lower, jv_t *out)
{
    jv_t v = item;
    if (attr.kind == JV_STR) {
        const char *p = attr.u.s->p, *end = p + attr.u.s->len;
        while (p <= end) {
            const char *q = memchr(p, '.', (size_t)(end - p));
            if (!q) q = end;
            size_t n = (size_t)(q - p);
            bool digits = n > 0;
            for (size_t i = 0; i < n; i++)
                if (p[i] < '0' || p[i] > '9') digits = false;
            jv_t key;
            if (digits && n < 18) {
                key = jv_int(strtoll(p, NULL, 10));
            } else {
                jstr_t *k = js_new(c, p, n);
                if (!k) return -1;
                key = jv_str(k);
            }
            if (jeval_getitem(c, line, v, key, &v)) return -1;
            if (dflt && dflt->kind != JV_NONE && v.kind == JV_UNDEF) v = *dflt;
            p = q + 1;
        }
    } else if (attr.kind != JV_NONE) {
        if (jeval_getitem(c, line, v, attr, &v)) return -1;
        if (dflt && dflt->kind != JV_NONE && v.kind == JV_UNDEF) v = *dflt;
    }
    if (lower && v.kind == JV_STR) {
        jbuf_t b = {0};
        if (jpy_case(c, line, v.u.s, JCASE_LOWER, &b)) return -1;
        jstr_t *s = jb_str(c, &b);
        if (!s) return -1;
        v = jv_str(s);
    }
    *out = v;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* generators */

static jgen_t *s_gen(jctx_t *c, int line, const char *what, jgen_fn fill, jv_t src, jargs_t *a, int mode)
{
    jgen_t *g = ja_alloc(&c->a, sizeof *g);
    jv_t *sp = ja_alloc(&c->a, sizeof *sp);
    if (!g || !sp) {
        jerr_oom(c, line);
        return NULL;
    }
    memset(g, 0, sizeof *g);
    *sp = src;
    g->src = sp;
    g->what = what;
    g->fill = fill;
    g->line = line;
    g->mode = mode;
    if (a) {
        /* the given parameters, then the extra positionals */
        g->args = ja_alloc(&c->a, (JF_MAXP + a->nextra + 1) * sizeof(jv_t));
        if (!g->args) {
            jerr_oom(c, line);
            return NULL;
        }
        size_t k = 0;
        for (size_t i = 0; i < JF_MAXP && a->present[i]; i++) g->args[k++] = a->p[i];
        for (size_t i = 0; i < a->nextra; i++) g->args[k++] = a->extra[i];
        g->nargs = k;
        g->kwn = a->kwn;
        g->kwv = a->kwv;
        g->nkw = a->nkw;
    }
    return g;
}

static int s_gen_list(jctx_t *c, jgen_t *g, jlist_t **src)
{
    if (!jv_truthy(*g->src) && g->mode != 2) {
        /* jinja2's map/select start with `if value:` */
        if (!(g->items = jl_new(c, 0))) return -1;
        *src = NULL;
        return 0;
    }
    if (!(g->items = jl_new(c, 0))) return -1;
    return jeval_iter_begin(c, g->line, *g->src, src);
}

static const jv_t *s_kw(jgen_t *g, const char *name)
{
    for (size_t i = 0; i < g->nkw; i++)
        if (!strcmp(g->kwn[i], name)) return &g->kwv[i];
    return NULL;
}

static int s_fill_map(jctx_t *c, jgen_t *g)
{
    jlist_t *src;
    if (s_gen_list(c, g, &src)) return -1;
    if (!src) return 0;
    const jv_t *attr = s_kw(g, "attribute");
    if (!g->nargs && attr) {
        const jv_t *dflt = s_kw(g, "default");
        for (size_t i = 0; i < g->nkw; i++)
            if (strcmp(g->kwn[i], "attribute") && strcmp(g->kwn[i], "default"))
                return jerr(c, g->line, "Unexpected keyword argument '%s'", g->kwn[i]);
        for (size_t i = 0; i < src->n; i++) {
            jv_t v;
            if (s_attrget(c, g->line, src->v[i], *attr, dflt, false, &v) || jl_push(c, g->items, v)) return -1;
        }
        return 0;
    }
    if (!g->nargs) return jerr(c, g->line, "map requires a filter argument");
    jstr_t *name = NULL;
    if (s_need_str(c, g->line, g->args[0], "the filter name", &name)) return -1;
    const jfilter_def_t *d = jfilter_find(name->p);
    if (!d) return jerr(c, g->line, "no filter named '%s' (or it is not supported)", name->p);
    for (size_t i = 0; i < src->n; i++) {
        jv_t v;
        if (jeval_apply_filter(c, g->line, d, src->v[i], g->args + 1, g->nargs - 1, g->kwn, g->kwv, g->nkw, &v) ||
            jl_push(c, g->items, v))
            return -1;
    }
    return 0;
}

/* select / reject / selectattr / rejectattr; mode bit 1: reject, bit 2: attr */
static int s_fill_select(jctx_t *c, jgen_t *g)
{
    bool reject = g->mode & 1, attr = g->mode & 4;
    jlist_t *src;
    int saved = g->mode;
    g->mode = 0;
    int r = s_gen_list(c, g, &src);
    g->mode = saved;
    if (r) return -1;
    if (!src) return 0;
    size_t off = 0;
    if (attr) {
        if (!g->nargs) return jerr(c, g->line, "Missing parameter for attribute name");
        off = 1;
    }
    const jfilter_def_t *t = NULL;
    if (g->nargs > off) {
        jstr_t *name = NULL;
        if (s_need_str(c, g->line, g->args[off], "the test name", &name)) return -1;
        if (!(t = jtest_find(name->p))) return jerr(c, g->line, "no test named '%s' (or it is not supported)", name->p);
    }
    for (size_t i = 0; i < src->n; i++) {
        jv_t v = src->v[i];
        if (attr && s_attrget(c, g->line, v, g->args[0], NULL, false, &v)) return -1;
        bool ok;
        if (t) {
            if (jeval_apply_test(c, g->line, t, v, g->args + off + 1, g->nargs - off - 1, g->kwn, g->kwv, g->nkw, &ok))
                return -1;
        } else {
            ok = jv_truthy(v);
        }
        if (ok != reject && jl_push(c, g->items, src->v[i])) return -1;
    }
    return 0;
}

static int s_fill_copy(jctx_t *c, jgen_t *g)
{
    /* items computed when the generator was made (reverse, items, batch) */
    (void)c;
    (void)g;
    return 0;
}

static int s_fill_unique(jctx_t *c, jgen_t *g)
{
    jlist_t *src;
    if (!(g->items = jl_new(c, 0)) || jeval_iter_begin(c, g->line, *g->src, &src)) return -1;
    bool cs = g->nargs > 0 && jv_truthy(g->args[0]);
    jv_t attr = g->nargs > 1 ? g->args[1] : jv_none();
    jlist_t *seen = jl_new(c, 0);
    if (!seen) return -1;
    for (size_t i = 0; i < src->n; i++) {
        jv_t key;
        if (s_attrget(c, g->line, src->v[i], attr, NULL, !cs, &key)) return -1;
        if (!jv_hashable(key)) return jerr(c, g->line, "unhashable type: '%s'", jv_type_name(key));
        bool dup = false;
        for (size_t k = 0; k < seen->n && !dup; k++) {
            bool eq;
            if (jv_eq(c, seen->v[k], key, &eq)) return -1;
            dup = eq;
        }
        if (dup) continue;
        if (jl_push(c, seen, key) || jl_push(c, g->items, src->v[i])) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* sorting (stable merge sort, as Python's sorted() is stable) */

typedef struct {
    jv_t key, item;
} kv_t;

static int s_msort(jctx_t *c, int line, kv_t *v, kv_t *tmp, size_t n, bool rev)
{
    if (n < 2) return 0;
    size_t h = n / 2;
    if (s_msort(c, line, v, tmp, h, rev) || s_msort(c, line, v + h, tmp, n - h, rev)) return -1;
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int r;
        /* take from the right only when it is strictly before the left */
        if (rev ? jv_cmp(c, line, v[i].key, v[j].key, &r) : jv_cmp(c, line, v[j].key, v[i].key, &r)) return -1;
        tmp[k++] = r < 0 ? v[j++] : v[i++];
    }
    while (i < h) tmp[k++] = v[i++];
    while (j < n) tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
    return 0;
}

static int s_sorted(jctx_t *c, int line, kv_t *v, size_t n, bool rev)
{
    kv_t *tmp = ja_alloc(&c->a, (n ? n : 1) * sizeof *tmp);
    if (!tmp) return jerr_oom(c, line);
    return s_msort(c, line, v, tmp, n, rev);
}

/* ------------------------------------------------------------------------------------------ */
/* Python number parsing (int(), float()) */

/* int(s, base) as Python parses it: 1 ok, 0 ValueError, <0 error (unsupported). */
static int s_parse_int(jctx_t *c, int line, const jstr_t *s, int64_t base, int64_t *out)
{
    size_t a = 0, b = s->len;
    while (a < b) {
        size_t k = a;
        if (!jpy_isspace(ju8_next(s->p, b, &k))) break;
        a = k;
    }
    b = a + s_ws_trailing(s->p + a, b - a);
    const char *p = s->p + a;
    size_t n = b - a;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80) {
            size_t k = i;
            uint32_t cp = ju8_next(p, n, &k);
            if (jpy_cp_category(cp) == 9 /* Nd */) return jerr(c, line, "int() of non-ASCII digits is not supported");
            return 0;
        }
    bool neg = false;
    size_t i = 0;
    if (i < n && (p[i] == '+' || p[i] == '-')) neg = p[i++] == '-';
    if (base == 0 || base == 16 || base == 8 || base == 2) {
        if (i + 1 < n && p[i] == '0') {
            char x = (char)(p[i + 1] | 0x20);
            int64_t pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
            if (pb && (base == 0 || base == pb)) {
                base = pb;
                i += 2;
                if (i < n && p[i] == '_') i++;
            }
        }
        if (base == 0) {
            base = 10;
            /* base 0 refuses leading zeros in a non-zero decimal */
            if (i < n && p[i] == '0') {
                for (size_t k = i; k < n; k++)
                    if (p[k] != '0' && p[k] != '_') return 0;
            }
        }
    }
    if (base < 2 || base > 36) return jerr(c, line, "int() base must be >= 2 and <= 36, or 0");
    if (i >= n) return 0;
    unsigned __int128 acc = 0;
    bool prev_digit = false;
    for (; i < n; i++) {
        char ch = p[i];
        if (ch == '_') {
            if (!prev_digit || i + 1 >= n) return 0;
            prev_digit = false;
            continue;
        }
        int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 0x20) >= 'a' && (ch | 0x20) <= 'z' ? (ch | 0x20) - 'a' + 10 : 99;
        if (d >= base) return 0;
        acc = acc * (unsigned)base + (unsigned)d;
        if (acc > (unsigned __int128)INT64_MAX + 1) return jerr(c, line, "integers beyond 64 bits are not supported");
        prev_digit = true;
    }
    if (!prev_digit) return 0;
    if (!neg && acc > INT64_MAX) return jerr(c, line, "integers beyond 64 bits are not supported");
    *out = neg ? (int64_t)(0 - (uint64_t)acc) : (int64_t)acc;
    return 1;
}

/* float(s) as Python parses it: 1 ok, 0 ValueError. */
/* Digits from p[*i] into tmp at *k, single underscores allowed between two digits (Python's
 * float() literal). Returns the digits taken, or -1 at a misplaced underscore. */
static int s_digit_run(const char *p, size_t n, size_t *i, char *tmp, size_t *k)
{
    int nd = 0;
    bool prev = false;
    for (; *i < n && (s_isdigit(p[*i]) || p[*i] == '_'); (*i)++) {
        if (p[*i] == '_') {
            if (!prev || *i + 1 >= n || !s_isdigit(p[*i + 1])) return -1;
            prev = false;
            continue;
        }
        tmp[(*k)++] = p[*i];
        nd++;
        prev = true;
    }
    return nd;
}

static int s_parse_float(jctx_t *c, int line, const jstr_t *s, double *out)
{
    size_t a = 0, b = s->len;
    while (a < b) {
        size_t k = a;
        if (!jpy_isspace(ju8_next(s->p, b, &k))) break;
        a = k;
    }
    b = a + s_ws_trailing(s->p + a, b - a);
    const char *p = s->p + a;
    size_t n = b - a;
    if (n > 400) return jerr(c, line, "float() of a string this long is not supported");
    char tmp[512];
    size_t k = 0, i = 0;
    for (size_t j = 0; j < n; j++)
        if ((unsigned char)p[j] >= 0x80) {
            size_t q = j;
            uint32_t cp = ju8_next(p, n, &q);
            if (jpy_cp_category(cp) == 9) return jerr(c, line, "float() of non-ASCII digits is not supported");
            return 0;
        }
    if (i < n && (p[i] == '+' || p[i] == '-')) tmp[k++] = p[i++];
    size_t rest = n - i;
    const char *r = p + i;
    if ((rest == 3 && !strncasecmp(r, "inf", 3)) || (rest == 8 && !strncasecmp(r, "infinity", 8)) ||
        (rest == 3 && !strncasecmp(r, "nan", 3))) {
        memcpy(tmp + k, r, rest);
        tmp[k + rest] = 0;
        *out = strtod(tmp, NULL);
        return 1;
    }
    /* digits [. digits] [e [sign] digits], with single underscores between digits */
    int nd = s_digit_run(p, n, &i, tmp, &k);
    if (nd < 0) return 0;
    if (i < n && p[i] == '.') {
        tmp[k++] = p[i++];
        const int nf = s_digit_run(p, n, &i, tmp, &k);
        if (nf < 0) return 0;
        nd += nf;
    }
    if (!nd) return 0;
    if (i < n && (p[i] | 0x20) == 'e') {
        tmp[k++] = 'e';
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-')) tmp[k++] = p[i++];
        const int ne = s_digit_run(p, n, &i, tmp, &k);
        if (ne <= 0) return 0;
    }
    if (i != n) return 0;
    tmp[k] = 0;
    *out = strtod(tmp, NULL);
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* filters */

#define FARG(i) (a->present[i] ? a->p[i] : jv_none())
#define FHAS(i) (a->present[i])

static int f_abs(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    if (jv_is_intlike(v)) {
        if (v.u.i == INT64_MIN) return jerr(c, line, "integer overflow: results beyond 64 bits are not supported");
        *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        return 0;
    }
    if (v.kind == JV_FLOAT) { *out = jv_float(fabs(v.u.f)); return 0; }
    return jerr(c, line, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static int f_length(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    int64_t n;
    if (jv_len(c, line, v, &n)) return -1;
    *out = jv_int(n);
    return 0;
}

static int f_default(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)line;
    jv_t d = a->present[0] ? a->p[0] : jv_cstr(c, "");
    if (v.kind == JV_UNDEF || (a->present[1] && jv_truthy(a->p[1]) && !jv_truthy(v))) *out = d;
    else *out = v;
    return c->failed ? -1 : 0;
}

static int f_case(jctx_t *c, int line, jv_t v, int mode, const char *name, jv_t *out)
{
    jstr_t *s = NULL;
    if (s_soft_str(c, line, v, name, &s)) return -1;
    jbuf_t b = {0};
    if (jpy_case(c, line, s, mode, &b)) return -1;
    *out = s_s(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

static int f_upper(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)a; return f_case(c, line, v, JCASE_UPPER, "upper", out); }
static int f_lower(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)a; return f_case(c, line, v, JCASE_LOWER, "lower", out); }
static int f_capitalize(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)a; return f_case(c, line, v, JCASE_CAPITALIZE, "capitalize", out); }

/* jinja2's title: split on runs of [-\s({\[<], each piece item[0].upper() + item[1:].lower() */
static int f_title(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    jstr_t *s = NULL;
    if (s_soft_str(c, line, v, "title", &s)) return -1;
    jbuf_t b = {0};
    bool at_start = true;
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        uint32_t cp = ju8_next(s->p, s->len, &i);
        bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jpy_isspace(cp);
        jstr_t one = {.p = s->p + st, .len = i - st, .ncp = 1};
        if (sep) {
            if (jb_put(c, &b, one.p, one.len)) return -1;
            at_start = true;
            continue;
        }
        if (jpy_case(c, line, &one, at_start ? JCASE_UPPER : JCASE_LOWER, &b)) return -1;
        at_start = false;
    }
    *out = s_s(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

static int f_trim(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jstr_t *s = NULL, *chars = NULL;
    if (s_soft_str(c, line, v, "trim", &s)) return -1;
    if (FHAS(0) && a->p[0].kind != JV_NONE && s_need_str(c, line, a->p[0], "trim() chars", &chars)) return -1;
    return jstr_strip(c, s, chars, 3, out);
}

static int f_string(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    if (v.kind == JV_STR) { *out = v; return 0; }
    *out = s_s(jv_strv(c, line, v));
    return c->failed ? -1 : 0;
}

static int f_safe(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    if (v.kind != JV_STR) {
        jstr_t *s = jv_strv(c, line, v);
        if (!s) return -1;
        v = jv_str(s);
    }
    *out = v;
    out->flags = JVF_MARKUP;
    return 0;
}

static int f_escape(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    if (v.kind == JV_STR && v.flags & JVF_MARKUP) { *out = v; return 0; }
    jstr_t *s = jv_strv(c, line, v);
    if (!s) return -1;
    jbuf_t b = {0};
    if (jv_markup_escape(c, s, &b)) return -1;
    jstr_t *r = jb_str(c, &b);
    if (!r) return -1;
    *out = jv_str(r);
    out->flags = JVF_MARKUP;
    return 0;
}

static int f_first(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    if (v.kind == JV_GEN) {
        jgen_t *g = v.u.g;
        if (g->broken) return jerr(c, line, "using a %s again after a loop left it part-way is not supported", g->what);
        if (!g->items && g->fill(c, g)) return -1;
        if (g->pos < g->items->n) {
            *out = g->items->v[g->pos++];
            return 0;
        }
        *out = jv_undef_msg(c, "No first item, sequence was empty.");
        return c->failed ? -1 : 0;
    }
    jlist_t *l;
    if (v.kind == JV_STR && v.u.s->len) {
        size_t i = 0;
        ju8_next(v.u.s->p, v.u.s->len, &i);
        *out = s_s(js_new(c, v.u.s->p, i));
        return c->failed ? -1 : 0;
    }
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    if (l->n) *out = l->v[0];
    else *out = jv_undef_msg(c, "No first item, sequence was empty.");
    return c->failed ? -1 : 0;
}

static int f_last(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    if (v.kind == JV_GEN) return jerr(c, line, "'%s' object is not reversible", v.u.g->what);
    if (v.kind != JV_LIST && v.kind != JV_TUPLE && v.kind != JV_STR && v.kind != JV_DICT && v.kind != JV_RANGE &&
        v.kind != JV_UNDEF)
        return jerr(c, line, "'%s' object is not reversible", jv_type_name(v));
    if (v.kind == JV_STR && v.u.s->len) {
        size_t i = v.u.s->len - 1;
        while (i > 0 && ((unsigned char)v.u.s->p[i] & 0xC0) == 0x80) i--;
        *out = s_s(js_new(c, v.u.s->p + i, v.u.s->len - i));
        return c->failed ? -1 : 0;
    }
    jlist_t *l;
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    if (l->n) *out = l->v[l->n - 1];
    else *out = jv_undef_msg(c, "No last item, sequence was empty.");
    return c->failed ? -1 : 0;
}

static int f_join(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jstr_t *d = NULL;
    if (FHAS(0)) {
        if (!(d = jv_strv(c, line, a->p[0]))) return -1;
    }
    jlist_t *l;
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    jbuf_t b = {0};
    for (size_t i = 0; i < l->n; i++) {
        jv_t x = l->v[i];
        if (FHAS(1) && a->p[1].kind != JV_NONE && s_attrget(c, line, x, a->p[1], NULL, false, &x)) return -1;
        if (i && d && jb_put(c, &b, d->p, d->len)) return -1;
        if (jv_to_str(c, line, x, &b)) return -1;
    }
    *out = s_s(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

static int f_list(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    jlist_t *l;
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    jlist_t *r = jl_new(c, l->n);
    if (!r) return -1;
    for (size_t i = 0; i < l->n; i++) r->v[r->n++] = l->v[i];
    *out = jv_of(JV_LIST, r);
    return 0;
}

static int f_int(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jv_t dflt = FHAS(0) ? a->p[0] : jv_int(0);
    int64_t base = 10;
    if (FHAS(1) && s_need_int(c, line, a->p[1], "int() base", &base)) return -1;
    if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
    if (jv_is_intlike(v)) { *out = jv_int(v.u.i); return 0; }
    double f;
    if (v.kind == JV_FLOAT) {
        f = v.u.f;
    } else if (v.kind == JV_STR) {
        int64_t i = 0;
        int r = s_parse_int(c, line, v.u.s, base, &i);
        if (r < 0) return -1;
        if (r) { *out = jv_int(i); return 0; }
        r = s_parse_float(c, line, v.u.s, &f);
        if (r < 0) return -1;
        if (!r) { *out = dflt; return 0; }
    } else {
        *out = dflt;
        return 0;
    }
    if (isnan(f)) { *out = dflt; return 0; }
    if (isinf(f)) return jerr(c, line, "cannot convert float infinity to integer");
    double t = trunc(f);
    if (t >= 9223372036854775808.0 || t < -9223372036854775808.0) return jerr(c, line, "integers beyond 64 bits are not supported");
    *out = jv_int((int64_t)t);
    return 0;
}

static int f_float(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jv_t dflt = FHAS(0) ? a->p[0] : jv_float(0.0);
    if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
    if (jv_is_intlike(v)) { *out = jv_float((double)v.u.i); return 0; }
    if (v.kind == JV_FLOAT) { *out = v; return 0; }
    if (v.kind == JV_STR) {
        double f;
        int r = s_parse_float(c, line, v.u.s, &f);
        if (r < 0) return -1;
        *out = r ? jv_float(f) : dflt;
        return 0;
    }
    *out = dflt;
    return 0;
}

static double s_pow10(int64_t p) { return pow(10.0, (double)p); }

static int f_round(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    int64_t prec = 0;
    if (FHAS(0) && s_need_int(c, line, a->p[0], "round() precision", &prec)) return -1;
    const char *method = "common";
    jstr_t *ms = NULL;
    if (FHAS(1)) {
        if (s_need_str(c, line, a->p[1], "round() method", &ms)) return -1;
        method = ms->p;
    }
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return jerr(c, line, "method must be common, ceil or floor");
    if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
    if (!jv_is_num(v)) return jerr(c, line, "type %s doesn't define __round__ method", jv_type_name(v));
    if (!strcmp(method, "common")) {
        if (jv_is_intlike(v)) {
            if (prec >= 0) { *out = jv_int(v.u.i); return 0; }
            return jerr(c, line, "round() of an integer to negative precision is not supported");
        }
        if (prec < 0 || prec > 300) return jerr(c, line, "round() to precision %" PRId64 " is not supported", prec);
        if (!isfinite(v.u.f)) { *out = v; return 0; }
        char tmp[400];
        snprintf(tmp, sizeof tmp, "%.*f", (int)prec, v.u.f);
        *out = jv_float(strtod(tmp, NULL));
        return 0;
    }
    if (prec < -300 || prec > 300) return jerr(c, line, "round() to precision %" PRId64 " is not supported", prec);
    double x = (v.kind == JV_FLOAT ? v.u.f : (double)v.u.i) * s_pow10(prec);
    double r = method[0] == 'c' ? ceil(x) : floor(x);
    if (!isfinite(r) || fabs(r) >= 9007199254740992.0) return jerr(c, line, "round() of a value this large is not supported");
    *out = jv_float(r / s_pow10(prec));
    return 0;
}

static int f_replace(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    if (!FHAS(0) || !FHAS(1)) return jerr(c, line, "replace() takes old and new");
    jstr_t *s = jv_strv(c, line, v), *o = jv_strv(c, line, a->p[0]), *n = jv_strv(c, line, a->p[1]);
    if (!s || !o || !n) return -1;
    int64_t count = -1;
    if (FHAS(2) && a->p[2].kind != JV_NONE && s_need_int(c, line, a->p[2], "replace() count", &count)) return -1;
    return jstr_replace(c, line, s, o, n, count, out);
}

static int f_reverse(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    if (v.kind == JV_STR) {
        jbuf_t b = {0};
        const jstr_t *s = v.u.s;
        for (size_t i = s->len; i > 0;) {
            size_t st = i - 1;
            while (st > 0 && ((unsigned char)s->p[st] & 0xC0) == 0x80) st--;
            if (jb_put(c, &b, s->p + st, i - st)) return -1;
            i = st;
        }
        *out = s_s(jb_str(c, &b));
        return c->failed ? -1 : 0;
    }
    jlist_t *l;
    const char *what;
    switch (v.kind) {
    case JV_LIST: what = v.flags & JVF_VIEW ? "dict_reverseiterator" : "list_reverseiterator"; break;
    case JV_TUPLE: what = "reversed"; break;
    case JV_DICT: what = "dict_reversekeyiterator"; break;
    case JV_RANGE: what = "range_iterator"; break;
    case JV_UNDEF: what = "reversed"; break;
    case JV_GEN: {
        /* reversed() refuses it; jinja2 then reverses list(value) and returns the list */
        if (jeval_iter_begin(c, line, v, &l)) return -1;
        jlist_t *r = jl_new(c, l->n);
        if (!r) return -1;
        for (size_t i = l->n; i-- > 0;) r->v[r->n++] = l->v[i];
        *out = jv_of(JV_LIST, r);
        return 0;
    }
    default:
        return jerr(c, line, "argument must be iterable");
    }
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    jgen_t *g = s_gen(c, line, what, s_fill_copy, v, NULL, 0);
    if (!g || !(g->items = jl_new(c, l->n))) return -1;
    for (size_t i = l->n; i-- > 0;) g->items->v[g->items->n++] = l->v[i];
    *out = jv_of(JV_GEN, g);
    return 0;
}

static int f_items(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    jgen_t *g = s_gen(c, line, "generator", s_fill_copy, v, NULL, 0);
    if (!g || !(g->items = jl_new(c, 0))) return -1;
    if (v.kind != JV_UNDEF) {
        if (v.kind != JV_DICT) return jerr(c, line, "Can only get item pairs from a mapping.");
        for (size_t i = 0; i < v.u.d->n; i++) {
            jlist_t *t = jl_new(c, 2);
            if (!t) return -1;
            t->v[0] = v.u.d->k[i];
            t->v[1] = v.u.d->v[i];
            t->n = 2;
            if (jl_push(c, g->items, jv_of(JV_TUPLE, t))) return -1;
        }
    }
    *out = jv_of(JV_GEN, g);
    return 0;
}

static int f_map(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jgen_t *g = s_gen(c, line, "generator", s_fill_map, v, a, 0);
    if (!g) return -1;
    *out = jv_of(JV_GEN, g);
    return 0;
}

static int s_select_gen(jctx_t *c, int line, jv_t v, jargs_t *a, int mode, jv_t *out)
{
    jgen_t *g = s_gen(c, line, "generator", s_fill_select, v, a, mode);
    if (!g) return -1;
    *out = jv_of(JV_GEN, g);
    return 0;
}
static int f_select(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_select_gen(c, line, v, a, 0, out); }
static int f_reject(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_select_gen(c, line, v, a, 1, out); }
static int f_selectattr(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_select_gen(c, line, v, a, 4, out); }
static int f_rejectattr(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_select_gen(c, line, v, a, 5, out); }

static int f_unique(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jargs_t b = *a;
    b.present[0] = b.present[1] = true;
    if (!a->present[0]) b.p[0] = jv_bool(false);
    if (!a->present[1]) b.p[1] = jv_none();
    jgen_t *g = s_gen(c, line, "generator", s_fill_unique, v, &b, 0);
    if (!g) return -1;
    *out = jv_of(JV_GEN, g);
    return 0;
}

static int f_batch(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    int64_t n = 0;
    if (!FHAS(0)) return jerr(c, line, "batch() needs a line count");
    if (s_need_int(c, line, a->p[0], "batch() line count", &n)) return -1;
    jlist_t *l;
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    jgen_t *g = s_gen(c, line, "generator", s_fill_copy, v, NULL, 0);
    if (!g || !(g->items = jl_new(c, 0))) return -1;
    if (n <= 0 && l->n) return jerr(c, line, "batch() with a line count below 1 is not supported");
    for (size_t i = 0; i < l->n; i += (size_t)n) {
        jlist_t *row = jl_new(c, (size_t)n);
        if (!row) return -1;
        for (size_t k = i; k < l->n && k < i + (size_t)n; k++) row->v[row->n++] = l->v[k];
        if (row->n < (size_t)n && FHAS(1) && a->p[1].kind != JV_NONE)
            while (row->n < (size_t)n) row->v[row->n++] = a->p[1];
        if (jl_push(c, g->items, jv_of(JV_LIST, row))) return -1;
    }
    *out = jv_of(JV_GEN, g);
    return 0;
}

static int f_sort(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    bool rev = FHAS(0) && jv_truthy(a->p[0]), cs = FHAS(1) && jv_truthy(a->p[1]);
    jv_t attr = FHAS(2) ? a->p[2] : jv_none();
    jlist_t *l;
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    kv_t *kv = ja_alloc(&c->a, (l->n ? l->n : 1) * sizeof *kv);
    if (!kv) return jerr_oom(c, line);
    for (size_t i = 0; i < l->n; i++) {
        kv[i].item = l->v[i];
        if (attr.kind == JV_STR && memchr(attr.u.s->p, ',', attr.u.s->len)) {
            /* make_multi_attrgetter: "a,b" sorts by the list of both */
            jlist_t *keys = jl_new(c, 0);
            if (!keys) return -1;
            const char *p = attr.u.s->p, *end = p + attr.u.s->len;
            while (p <= end) {
                const char *q = memchr(p, ',', (size_t)(end - p));
                if (!q) q = end;
                jstr_t *part = js_new(c, p, (size_t)(q - p));
                jv_t k;
                if (!part || s_attrget(c, line, l->v[i], jv_str(part), NULL, !cs, &k) || jl_push(c, keys, k)) return -1;
                p = q + 1;
            }
            kv[i].key = jv_of(JV_LIST, keys);
        } else if (s_attrget(c, line, l->v[i], attr, NULL, !cs, &kv[i].key)) {
            return -1;
        }
    }
    if (s_sorted(c, line, kv, l->n, rev)) return -1;
    jlist_t *r = jl_new(c, l->n);
    if (!r) return -1;
    for (size_t i = 0; i < l->n; i++) r->v[r->n++] = kv[i].item;
    *out = jv_of(JV_LIST, r);
    return 0;
}

static int f_dictsort(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    bool cs = FHAS(0) && jv_truthy(a->p[0]), rev = FHAS(2) && jv_truthy(a->p[2]);
    int pos = 0;
    if (FHAS(1)) {
        jstr_t *by = NULL;
        if (s_need_str(c, line, a->p[1], "dictsort() by", &by)) return -1;
        if (!strcmp(by->p, "value")) pos = 1;
        else if (strcmp(by->p, "key")) return jerr(c, line, "You can only sort by either \"key\" or \"value\"");
    }
    if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
    if (v.kind != JV_DICT) return jerr(c, line, "'%s' object has no attribute 'items'", jv_type_name(v));
    const jdict_t *d = v.u.d;
    kv_t *kv = ja_alloc(&c->a, (d->n ? d->n : 1) * sizeof *kv);
    if (!kv) return jerr_oom(c, line);
    for (size_t i = 0; i < d->n; i++) {
        jlist_t *t = jl_new(c, 2);
        if (!t) return -1;
        t->v[0] = d->k[i];
        t->v[1] = d->v[i];
        t->n = 2;
        kv[i].item = jv_of(JV_TUPLE, t);
        if (s_attrget(c, line, pos ? d->v[i] : d->k[i], jv_none(), NULL, !cs, &kv[i].key)) return -1;
    }
    if (s_sorted(c, line, kv, d->n, rev)) return -1;
    jlist_t *r = jl_new(c, d->n);
    if (!r) return -1;
    for (size_t i = 0; i < d->n; i++) r->v[r->n++] = kv[i].item;
    *out = jv_of(JV_LIST, r);
    return 0;
}

static int s_minmax(jctx_t *c, int line, jv_t v, jargs_t *a, bool max, jv_t *out)
{
    bool cs = FHAS(0) && jv_truthy(a->p[0]);
    jv_t attr = FHAS(1) ? a->p[1] : jv_none();
    jlist_t *l;
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    if (!l->n) {
        *out = jv_undef_msg(c, "No aggregated item, sequence was empty.");
        return c->failed ? -1 : 0;
    }
    jv_t best = l->v[0], bk;
    if (s_attrget(c, line, best, attr, NULL, !cs, &bk)) return -1;
    for (size_t i = 1; i < l->n; i++) {
        jv_t k;
        int r;
        if (s_attrget(c, line, l->v[i], attr, NULL, !cs, &k) || jv_cmp(c, line, k, bk, &r)) return -1;
        if (max ? r > 0 : r < 0) {
            best = l->v[i];
            bk = k;
        }
    }
    *out = best;
    return 0;
}
static int f_min(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_minmax(c, line, v, a, false, out); }
static int f_max(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_minmax(c, line, v, a, true, out); }

static int f_sum(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jv_t acc = FHAS(1) ? a->p[1] : jv_int(0);
    jlist_t *l;
    if (jeval_iter_begin(c, line, v, &l)) return -1;
    if (acc.kind == JV_STR) return jerr(c, line, "sum() can't sum strings [use ''.join(seq) instead]");
    for (size_t i = 0; i < l->n; i++) {
        jv_t x = l->v[i];
        if (FHAS(0) && a->p[0].kind != JV_NONE && s_attrget(c, line, x, a->p[0], NULL, false, &x)) return -1;
        if (jeval_binop(c, line, OP_ADD, acc, x, &acc)) return -1;
    }
    *out = acc;
    return 0;
}

static int f_wordcount(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    jstr_t *s = NULL;
    if (s_soft_str(c, line, v, "wordcount", &s)) return -1;
    int64_t n = 0;
    bool in = false;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = ju8_next(s->p, s->len, &i);
        bool w = cp == '_' || jpy_isalnum_cp(cp);
        if (w && !in) n++;
        in = w;
    }
    *out = jv_int(n);
    return 0;
}

static int f_indent(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jstr_t *s = NULL, *ind = NULL;
    if (s_soft_str(c, line, v, "indent", &s)) return -1;
    if (FHAS(0) && a->p[0].kind == JV_STR) {
        ind = a->p[0].u.s;
    } else {
        int64_t w = 4;
        if (FHAS(0) && s_need_int(c, line, a->p[0], "indent() width", &w)) return -1;
        if (w < 0) w = 0;
        if (w > 4096) return jerr(c, line, "indent() wider than 4096 is not supported");
        char *sp = ja_alloc(&c->a, (size_t)w + 1);
        if (!sp) return jerr_oom(c, line);
        memset(sp, ' ', (size_t)w);
        sp[w] = 0;
        if (!(ind = js_take(c, sp, (size_t)w))) return -1;
    }
    bool first = FHAS(1) && jv_truthy(a->p[1]), blank = FHAS(2) && jv_truthy(a->p[2]);
    /* s += "\n"; lines = s.splitlines() */
    jbuf_t t = {0};
    if (jb_put(c, &t, s->p, s->len) || jb_putc(c, &t, '\n')) return -1;
    jstr_t *s2 = jb_str(c, &t);
    jlist_t *lines;
    if (!s2 || jstr_splitlines(c, s2, false, &lines)) return -1;
    jbuf_t b = {0};
    if (first && jb_put(c, &b, ind->p, ind->len)) return -1;
    for (size_t i = 0; i < lines->n; i++) {
        const jstr_t *ln = lines->v[i].u.s;
        if (i) {
            if (jb_putc(c, &b, '\n')) return -1;
            if ((blank || ln->len) && jb_put(c, &b, ind->p, ind->len)) return -1;
        }
        if (jb_put(c, &b, ln->p, ln->len)) return -1;
    }
    *out = s_s(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

static int f_center(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jstr_t *s = NULL;
    int64_t w = 80;
    if (s_soft_str(c, line, v, "center", &s)) return -1;
    if (FHAS(0) && s_need_int(c, line, a->p[0], "center() width", &w)) return -1;
    int64_t n = (int64_t)s->ncp;
    if (w <= n) { *out = jv_str(s); return 0; }
    if (w > 1 << 20) return jerr(c, line, "center() wider than 1M is not supported");
    int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
    jbuf_t b = {0};
    for (int64_t i = 0; i < left; i++) if (jb_putc(c, &b, ' ')) return -1;
    if (jb_put(c, &b, s->p, s->len)) return -1;
    for (int64_t i = 0; i < pad - left; i++) if (jb_putc(c, &b, ' ')) return -1;
    *out = s_s(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

static int f_tojson(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jjson_opts_t o = {0};
    o.ensure_ascii = FHAS(0) && jv_truthy(a->p[0]);
    o.sort_keys = FHAS(3) && jv_truthy(a->p[3]);
    if (FHAS(1) && a->p[1].kind != JV_NONE) {
        jv_t in = a->p[1];
        o.has_indent = true;
        if (in.kind == JV_STR) {
            o.indent = in.u.s;
        } else if (jv_is_intlike(in)) {
            int64_t w = in.u.i < 0 ? 0 : in.u.i;
            if (w > 4096) return jerr(c, line, "tojson indent wider than 4096 is not supported");
            char *sp = ja_alloc(&c->a, (size_t)w + 1);
            if (!sp) return jerr_oom(c, line);
            memset(sp, ' ', (size_t)w);
            sp[w] = 0;
            if (!(o.indent = js_take(c, sp, (size_t)w))) return -1;
        } else {
            return jerr(c, line, "can't multiply sequence by non-int of type '%s'", jv_type_name(in));
        }
    }
    if (FHAS(2) && a->p[2].kind != JV_NONE) {
        jv_t sp = a->p[2];
        if ((sp.kind != JV_LIST && sp.kind != JV_TUPLE) || sp.u.l->n != 2 || sp.u.l->v[0].kind != JV_STR ||
            sp.u.l->v[1].kind != JV_STR)
            return jerr(c, line, "tojson separators must be a pair of strings");
        o.item_sep = sp.u.l->v[0].u.s;
        o.key_sep = sp.u.l->v[1].u.s;
    } else {
        o.item_sep = js_new(c, o.has_indent ? "," : ", ", o.has_indent ? 1 : 2);
        o.key_sep = js_new(c, ": ", 2);
        if (!o.item_sep || !o.key_sep) return -1;
    }
    jbuf_t b = {0};
    if (jv_tojson(c, line, v, &o, &b)) return -1;
    *out = s_s(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

/* printf-style formatting for |format: %s %r %d %i %% only */
static int f_format(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    jstr_t *fmt = NULL;
    if (s_soft_str(c, line, v, "format", &fmt)) return -1;
    if (a->nkw) return jerr(c, line, "the filter 'format' with keyword arguments is not supported");
    jbuf_t b = {0};
    size_t k = 0;
    for (size_t i = 0; i < fmt->len; i++) {
        if (fmt->p[i] != '%') {
            if (jb_putc(c, &b, fmt->p[i])) return -1;
            continue;
        }
        char spec = i + 1 < fmt->len ? fmt->p[++i] : 0;
        if (spec == '%') { if (jb_putc(c, &b, '%')) return -1; continue; }
        if (spec != 's' && spec != 'r' && spec != 'd' && spec != 'i')
            return jerr(c, line, "the format conversion '%%%c' is not supported", spec ? spec : ' ');
        if (k >= a->nextra) return jerr(c, line, "not enough arguments for format string");
        jv_t x = a->extra[k++];
        if (spec == 's') {
            if (jv_to_str(c, line, x, &b)) return -1;
        } else if (spec == 'r') {
            if (jv_repr(c, line, x, &b)) return -1;
        } else {
            if (x.kind == JV_FLOAT) {
                if (!isfinite(x.u.f)) return jerr(c, line, "cannot convert float to integer");
                x = jv_int((int64_t)trunc(x.u.f));
            }
            if (!jv_is_intlike(x)) return jerr(c, line, "%%d format: a real number is required, not %s", jv_type_name(x));
            if (jb_printf(c, &b, "%" PRId64, x.u.i)) return -1;
        }
    }
    if (k < a->nextra) return jerr(c, line, "not all arguments converted during string formatting");
    *out = s_s(jb_str(c, &b));
    return c->failed ? -1 : 0;
}

/* ------------------------------------------------------------------------------------------ */
/* tests */

static int s_int_test(jctx_t *c, int line, jv_t v, int64_t m, int want, jv_t *out)
{
    if (v.kind == JV_UNDEF) return jv_undef_error(c, line, v);
    if (jv_is_intlike(v)) {
        int64_t r = v.u.i % m;
        if (r < 0) r += m < 0 ? -m : m;
        *out = jv_bool(want < 0 ? r == 0 : r == want);
        return 0;
    }
    if (v.kind == JV_FLOAT) {
        double r = fmod(v.u.f, (double)m);
        if (r != 0 && (r < 0) != (m < 0)) r += (double)m;
        *out = jv_bool(want < 0 ? r == 0 : r == (double)want);
        return 0;
    }
    return jerr(c, line, "unsupported operand type(s) for %%: '%s' and 'int'", jv_type_name(v));
}

static int t_odd(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)a; return s_int_test(c, line, v, 2, 1, out); }
static int t_even(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)a; return s_int_test(c, line, v, 2, 0, out); }
static int t_divisibleby(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    int64_t m = 1;
    if (!FHAS(0)) return jerr(c, line, "divisibleby needs a number");
    if (s_need_int(c, line, a->p[0], "divisibleby", &m)) return -1;
    if (!m) return jerr(c, line, "integer division or modulo by zero");
    return s_int_test(c, line, v, m, -1, out);
}
static int t_defined(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind != JV_UNDEF); return 0; }
static int t_undefined(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_UNDEF); return 0; }
static int t_none(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_NONE); return 0; }
static int t_boolean(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_BOOL); return 0; }
static int t_false(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_BOOL && !v.u.i); return 0; }
static int t_true(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_BOOL && v.u.i); return 0; }
static int t_integer(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_INT); return 0; }
static int t_float(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_FLOAT); return 0; }
static int t_number(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(jv_is_num(v)); return 0; }
static int t_string(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_STR); return 0; }
static int t_mapping(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_DICT); return 0; }
static int t_escaped(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { (void)c; (void)line; (void)a; *out = jv_bool(v.kind == JV_STR && v.flags & JVF_MARKUP); return 0; }

static int t_sequence(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)c; (void)line; (void)a;
    bool r = v.kind == JV_STR || v.kind == JV_DICT || v.kind == JV_RANGE || v.kind == JV_UNDEF || v.kind == JV_LOOP ||
             ((v.kind == JV_LIST || v.kind == JV_TUPLE) && !(v.flags & JVF_VIEW));
    *out = jv_bool(r);
    return 0;
}

static int t_iterable(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)c; (void)line; (void)a;
    bool r = v.kind == JV_STR || v.kind == JV_LIST || v.kind == JV_TUPLE || v.kind == JV_DICT || v.kind == JV_RANGE ||
             v.kind == JV_UNDEF || v.kind == JV_GEN || v.kind == JV_LOOP;
    *out = jv_bool(r);
    return 0;
}

static int t_callable(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)c; (void)line; (void)a;
    *out = jv_bool(v.kind == JV_MACRO || v.kind == JV_FUNC || v.kind == JV_JOINER || v.kind == JV_UNDEF);
    return 0;
}

static bool s_has_upper_lower(const jstr_t *s, bool upper)
{
    /* Python's isupper()/islower(): some cased character, and none of the other case */
    bool any = false;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = ju8_next(s->p, s->len, &i);
        int k = jpy_cp_category(cp);
        bool up = cp < 0x80 ? (cp >= 'A' && cp <= 'Z') : k == 1 || k == 3;
        bool lo = cp < 0x80 ? (cp >= 'a' && cp <= 'z') : k == 2;
        if (upper ? lo : up) return false;
        if (upper ? up : lo) any = true;
    }
    return any;
}

static int t_lower(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    jstr_t *s = jv_strv(c, line, v);
    if (!s) return -1;
    *out = jv_bool(s_has_upper_lower(s, false));
    return 0;
}

static int t_upper(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)a;
    jstr_t *s = jv_strv(c, line, v);
    if (!s) return -1;
    *out = jv_bool(s_has_upper_lower(s, true));
    return 0;
}

static int t_sameas(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)c; (void)line;
    jv_t o = FARG(0);
    bool r;
    if (v.kind != o.kind) r = false;
    else if (v.kind == JV_NONE || v.kind == JV_BOOL) r = v.kind == JV_NONE || v.u.i == o.u.i;
    else if (v.kind == JV_INT) return jerr(c, line, "'sameas' on integers is not supported (it depends on CPython's small-int cache)");
    else if (v.kind == JV_FLOAT || v.kind == JV_STR) return jerr(c, line, "'sameas' on %s values is not supported", jv_type_name(v));
    else r = v.u.p == o.u.p;
    *out = jv_bool(r);
    return 0;
}

static int t_in(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    bool r;
    if (jv_contains(c, line, FARG(0), v, &r)) return -1;
    *out = jv_bool(r);
    return 0;
}

static int s_cmp_test(jctx_t *c, int line, jv_t v, jargs_t *a, int op, jv_t *out)
{
    jv_t o = FARG(0);
    bool r;
    if (op == CMP_EQ || op == CMP_NE) {
        if (jv_eq(c, v, o, &r)) return -1;
        if (op == CMP_NE) r = !r;
    } else {
        int k;
        if (jv_cmp(c, line, v, o, &k)) return -1;
        r = op == CMP_LT ? k < 0 : op == CMP_LE ? k <= 0 : op == CMP_GT ? k > 0 : k >= 0;
    }
    *out = jv_bool(r);
    return 0;
}
static int t_eq(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_cmp_test(c, line, v, a, CMP_EQ, out); }
static int t_ne(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_cmp_test(c, line, v, a, CMP_NE, out); }
static int t_lt(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_cmp_test(c, line, v, a, CMP_LT, out); }
static int t_le(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_cmp_test(c, line, v, a, CMP_LE, out); }
static int t_gt(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_cmp_test(c, line, v, a, CMP_GT, out); }
static int t_ge(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out) { return s_cmp_test(c, line, v, a, CMP_GE, out); }

static int t_filter(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)c; (void)line; (void)a;
    *out = jv_bool(v.kind == JV_STR && (jfilter_find(v.u.s->p) || jfilter_known_unsupported(v.u.s->p)));
    return 0;
}

static int t_test(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out)
{
    (void)c; (void)line; (void)a;
    *out = jv_bool(v.kind == JV_STR && (jtest_find(v.u.s->p) || jtest_known_unsupported(v.u.s->p)));
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* tables */

static const jfilter_def_t s_filters[] = {
    {"abs", f_abs, {NULL}, false},
    {"batch", f_batch, {"linecount", "fill_with", NULL}, false},
    {"capitalize", f_capitalize, {NULL}, false},
    {"center", f_center, {"width", NULL}, false},
    {"count", f_length, {NULL}, false},
    {"d", f_default, {"default_value", "boolean", NULL}, false},
    {"default", f_default, {"default_value", "boolean", NULL}, false},
    {"dictsort", f_dictsort, {"case_sensitive", "by", "reverse", NULL}, false},
    {"e", f_escape, {NULL}, false},
    {"escape", f_escape, {NULL}, false},
    {"first", f_first, {NULL}, false},
    {"float", f_float, {"default", NULL}, false},
    {"format", f_format, {NULL}, true},
    {"indent", f_indent, {"width", "first", "blank", NULL}, false},
    {"int", f_int, {"default", "base", NULL}, false},
    {"items", f_items, {NULL}, false},
    {"join", f_join, {"d", "attribute", NULL}, false},
    {"last", f_last, {NULL}, false},
    {"length", f_length, {NULL}, false},
    {"list", f_list, {NULL}, false},
    {"lower", f_lower, {NULL}, false},
    {"map", f_map, {NULL}, true},
    {"max", f_max, {"case_sensitive", "attribute", NULL}, false},
    {"min", f_min, {"case_sensitive", "attribute", NULL}, false},
    {"reject", f_reject, {NULL}, true},
    {"rejectattr", f_rejectattr, {NULL}, true},
    {"replace", f_replace, {"old", "new", "count", NULL}, false},
    {"reverse", f_reverse, {NULL}, false},
    {"round", f_round, {"precision", "method", NULL}, false},
    {"safe", f_safe, {NULL}, false},
    {"select", f_select, {NULL}, true},
    {"selectattr", f_selectattr, {NULL}, true},
    {"sort", f_sort, {"reverse", "case_sensitive", "attribute", NULL}, false},
    {"string", f_string, {NULL}, false},
    {"sum", f_sum, {"attribute", "start", NULL}, false},
    {"title", f_title, {NULL}, false},
    {"tojson", f_tojson, {"ensure_ascii", "indent", "separators", "sort_keys", NULL}, false},
    {"trim", f_trim, {"chars", NULL}, false},
    {"unique", f_unique, {"case_sensitive", "attribute", NULL}, false},
    {"upper", f_upper, {NULL}, false},
    {"wordcount", f_wordcount, {NULL}, false},
};

static const char *const s_filters_refused[] = {"attr", "filesizeformat", "forceescape", "groupby", "pprint",
                                                "random", "slice", "striptags", "truncate", "urlencode", "urlize",
                                                "wordwrap", "xmlattr", NULL};

static const jfilter_def_t s_tests[] = {
    {"!=", t_ne, {"other", NULL}, false},
    {"<", t_lt, {"other", NULL}, false},
    {"<=", t_le, {"other", NULL}, false},
    {"==", t_eq, {"other", NULL}, false},
    {">", t_gt, {"other", NULL}, false},
    {">=", t_ge, {"other", NULL}, false},
    {"boolean", t_boolean, {NULL}, false},
    {"callable", t_callable, {NULL}, false},
    {"defined", t_defined, {NULL}, false},
    {"divisibleby", t_divisibleby, {"num", NULL}, false},
    {"eq", t_eq, {"other", NULL}, false},
    {"equalto", t_eq, {"other", NULL}, false},
    {"escaped", t_escaped, {NULL}, false},
    {"even", t_even, {NULL}, false},
    {"false", t_false, {NULL}, false},
    {"filter", t_filter, {NULL}, false},
    {"float", t_float, {NULL}, false},
    {"ge", t_ge, {"other", NULL}, false},
    {"greaterthan", t_gt, {"other", NULL}, false},
    {"gt", t_gt, {"other", NULL}, false},
    {"in", t_in, {"seq", NULL}, false},
    {"integer", t_integer, {NULL}, false},
    {"iterable", t_iterable, {NULL}, false},
    {"le", t_le, {"other", NULL}, false},
    {"lessthan", t_lt, {"other", NULL}, false},
    {"lower", t_lower, {NULL}, false},
    {"lt", t_lt, {"other", NULL}, false},
    {"mapping", t_mapping, {NULL}, false},
    {"ne", t_ne, {"other", NULL}, false},
    {"none", t_none, {NULL}, false},
    {"number", t_number, {NULL}, false},
    {"odd", t_odd, {NULL}, false},
    {"sameas", t_sameas, {"other", NULL}, false},
    {"sequence", t_sequence, {NULL}, false},
    {"string", t_string, {NULL}, false},
    {"test", t_test, {NULL}, false},
    {"true", t_true, {NULL}, false},
    {"undefined", t_undefined, {NULL}, false},
    {"upper", t_upper, {NULL}, false},
};

const jfilter_def_t *jfilter_find(const char *name)
{
    for (size_t i = 0; i < sizeof s_filters / sizeof s_filters[0]; i++)
        if (!strcmp(s_filters[i].name, name)) return &s_filters[i];
    return NULL;
}

const jfilter_def_t *jtest_find(const char *name)
{
    for (size_t i = 0; i < sizeof s_tests / sizeof s_tests[0]; i++)
        if (!strcmp(s_tests[i].name, name)) return &s_tests[i];
    return NULL;
}

bool jfilter_known_unsupported(const char *name)
{
    for (const char *const *p = s_filters_refused; *p; p++)
        if (!strcmp(*p, name)) return true;
    return false;
}

bool jtest_known_unsupported(const char *name) { (void)name; return false; }
