/* jinja_value.c - the template engine's values: arena, strings, containers, and the Python
 * semantics of truth, equality, ordering, str(), repr() and json.dumps(). */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "common/jinja_int.h"
#include "common/tok_int.h"

/* ------------------------------------------------------------------------------------------ */
/* arena */

#define JA_CHUNK (64 * 1024)

void *ja_alloc(jarena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    jchunk_t *h = a->head;
    if (h && h->cap - h->used >= n) {
        void *p = (char *)h->data + h->used;
        h->used += n;
        return p;
    }
    size_t cap = n > JA_CHUNK / 2 ? n : JA_CHUNK;
    if (a->cap && a->total + cap + sizeof(jchunk_t) > a->cap) return NULL;
    jchunk_t *k = malloc(sizeof(jchunk_t) + cap);
    if (!k) return NULL;
    a->total += cap + sizeof(jchunk_t);
    k->cap = cap;
    k->used = n;
    if (h && n > JA_CHUNK / 2) {
        /* a big block gets its own chunk behind the current one, which stays open */
        k->next = h->next;
        h->next = k;
    } else {
        k->next = h;
        a->head = k;
    }
    return k->data;
}

void *ja_grow(jarena_t *a, void *p, size_t old_n, size_t new_n)
{
    if (new_n <= old_n) return p;
    jchunk_t *h = a->head;
    size_t o16 = (old_n + 15) & ~(size_t)15, n16 = (new_n + 15) & ~(size_t)15;
    /* the last block of the open chunk grows in place */
    if (p && h && (char *)p + o16 == (char *)h->data + h->used && h->cap - h->used >= n16 - o16) {
        h->used += n16 - o16;
        return p;
    }
    void *q = ja_alloc(a, new_n);
    if (q && p && old_n) memcpy(q, p, old_n);
    return q;
}

void ja_release(jarena_t *a)
{
    jchunk_t *k = a->head;
    while (k) {
        jchunk_t *n = k->next;
        free(k);
        k = n;
    }
    a->head = NULL;
    a->total = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* errors */

int jerr(jctx_t *c, int line, const char *fmt, ...)
{
    if (c->failed) return -1;
    c->failed = true;
    if (!c->eb) return -1;
    char msg[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0) snprintf(c->eb->msg, sizeof c->eb->msg, "line %d: %s", line, msg);
    else snprintf(c->eb->msg, sizeof c->eb->msg, "%s", msg);
    return -1;
}

int jerr_oom(jctx_t *c, int line)
{
    if (c->lim.max_memory && c->a.total + JA_CHUNK >= c->lim.max_memory)
        return jerr(c, line, "the render needs more than %zu bytes of memory (the limit)", c->lim.max_memory);
    return jerr(c, line, "out of memory");
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 */

bool ju8_valid(const char *s, size_t n)
{
    return tk_utf8_valid_prefix((const unsigned char *)s, n) == n; /* the tokenizer's strict check */
}

size_t ju8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

uint32_t ju8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *p = (const unsigned char *)s + *i;
    size_t left = n - *i;
    uint32_t c = p[0];
    if (c < 0x80 || left < 2) { *i += 1; return c; }
    if (c < 0xE0) { *i += 2; return (c & 0x1F) << 6 | (p[1] & 0x3F); }
    if (c < 0xF0 || left < 4) {
        if (left < 3) { *i += left; return 0xFFFD; }
        *i += 3;
        return (c & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    }
    *i += 4;
    return (c & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

size_t ju8_put(char *o, uint32_t cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t ju8_offset(const jstr_t *s, int64_t cpi)
{
    if (cpi <= 0) return 0;
    if (s->ncp == s->len) return (size_t)cpi < s->len ? (size_t)cpi : s->len;
    size_t k = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (((unsigned char)s->p[i] & 0xC0) != 0x80) {
            if (k == (size_t)cpi) return i;
            k++;
        }
    }
    return s->len;
}

bool jpy_isspace(uint32_t c)
{
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool jpy_is_linebreak(uint32_t c)
{
    return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
}

int jpy_cp_category(uint32_t cp) { return cp > 0x10FFFF ? 0 : (int)utf8proc_category((utf8proc_int32_t)cp); }

bool jpy_isalnum_cp(uint32_t cp)
{
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    int k = jpy_cp_category(cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* ------------------------------------------------------------------------------------------ */
/* strings and buffers */

jstr_t *js_take(jctx_t *c, char *p, size_t n)
{
    if (c->lim.max_output && n > c->lim.max_output) {
        jerr(c, 0, "a string of %zu bytes is over the limit of %zu", n, c->lim.max_output);
        return NULL;
    }
    jstr_t *s = ja_alloc(&c->a, sizeof *s);
    if (!s) { jerr_oom(c, 0); return NULL; }
    s->p = p;
    s->len = n;
    s->ncp = ju8_count(p, n);
    return s;
}

jstr_t *js_new(jctx_t *c, const char *p, size_t n)
{
    if (c->lim.max_output && n > c->lim.max_output) {
        jerr(c, 0, "a string of %zu bytes is over the limit of %zu", n, c->lim.max_output);
        return NULL;
    }
    char *q = ja_alloc(&c->a, n + 1);
    if (!q) { jerr_oom(c, 0); return NULL; }
    if (n) memcpy(q, p, n);
    q[n] = 0;
    return js_take(c, q, n);
}

jv_t jv_str(jstr_t *s) { return jv_of(JV_STR, s); }

jv_t jv_cstr(jctx_t *c, const char *s)
{
    jstr_t *x = js_new(c, s, strlen(s));
    return x ? jv_str(x) : jv_undef();
}

static int jb_reserve(jctx_t *c, jbuf_t *b, size_t more)
{
    if (b->n + more + 1 <= b->cap) return 0;
    if (c->lim.max_output && b->n + more > c->lim.max_output)
        return jerr(c, 0, "the output is over the limit of %zu bytes", c->lim.max_output);
    size_t nc = b->cap ? b->cap * 2 : 64;
    while (nc < b->n + more + 1) nc *= 2;
    char *p = ja_grow(&c->a, b->p, b->cap, nc);
    if (!p) return jerr_oom(c, 0);
    b->p = p;
    b->cap = nc;
    return 0;
}

int jb_put(jctx_t *c, jbuf_t *b, const char *p, size_t n)
{
    if (!n) return 0;
    if (jb_reserve(c, b, n)) return -1;
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int jb_putc(jctx_t *c, jbuf_t *b, char ch) { return jb_put(c, b, &ch, 1); }

int jb_printf(jctx_t *c, jbuf_t *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return jerr(c, 0, "format failed");
    if ((size_t)n < sizeof tmp) return jb_put(c, b, tmp, (size_t)n);
    if (jb_reserve(c, b, (size_t)n)) return -1;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
    return 0;
}

jstr_t *jb_str(jctx_t *c, jbuf_t *b)
{
    if (!b->p) return js_new(c, "", 0);
    return js_take(c, b->p, b->n);
}

/* ------------------------------------------------------------------------------------------ */
/* containers */

jlist_t *jl_new(jctx_t *c, size_t cap)
{
    jlist_t *l = ja_alloc(&c->a, sizeof *l);
    if (!l) { jerr_oom(c, 0); return NULL; }
    l->n = 0;
    l->cap = cap;
    l->v = NULL;
    if (cap) {
        l->v = ja_alloc(&c->a, cap * sizeof(jv_t));
        if (!l->v) { jerr_oom(c, 0); return NULL; }
    }
    return l;
}

int jl_push(jctx_t *c, jlist_t *l, jv_t v)
{
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        if (nc > ((size_t)1 << 26)) return jerr(c, 0, "a list of more than %zu items is over the limit", nc / 2);
        jv_t *p = ja_grow(&c->a, l->v, l->cap * sizeof(jv_t), nc * sizeof(jv_t));
        if (!p) return jerr_oom(c, 0);
        l->v = p;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return 0;
}

jdict_t *jd_new(jctx_t *c, size_t cap)
{
    jdict_t *d = ja_alloc(&c->a, sizeof *d);
    if (!d) { jerr_oom(c, 0); return NULL; }
    memset(d, 0, sizeof *d);
    if (cap) {
        d->k = ja_alloc(&c->a, cap * sizeof(jv_t));
        d->v = ja_alloc(&c->a, cap * sizeof(jv_t));
        if (!d->k || !d->v) { jerr_oom(c, 0); return NULL; }
        d->cap = cap;
    }
    return d;
}

bool jv_hashable(jv_t v)
{
    switch (v.kind) {
    case JV_LIST: case JV_DICT: case JV_UNDEF:
        return false;
    case JV_TUPLE:
        for (size_t i = 0; i < v.u.l->n; i++)
            if (!jv_hashable(v.u.l->v[i])) return false;
        return true;
    default:
        return true;
    }
}

/* Dict-key equality: Python's hash-and-== for the hashable kinds. */
static bool s_key_eq(jv_t a, jv_t b)
{
    if (a.kind == JV_STR && b.kind == JV_STR)
        return a.u.s->len == b.u.s->len && !memcmp(a.u.s->p, b.u.s->p, a.u.s->len);
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) return a.u.i == b.u.i;
        double x = a.kind == JV_FLOAT ? a.u.f : (double)a.u.i, y = b.kind == JV_FLOAT ? b.u.f : (double)b.u.i;
        return x == y;
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_NONE: return true;
    case JV_TUPLE:
        if (a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!s_key_eq(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    default:
        return a.u.p == b.u.p;
    }
}

jv_t *jd_get(const jdict_t *d, jv_t k)
{
    for (size_t i = 0; i < d->n; i++)
        if (s_key_eq(d->k[i], k)) return &d->v[i];
    return NULL;
}

jv_t *jd_gets(const jdict_t *d, const char *k, size_t n)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].kind == JV_STR && d->k[i].u.s->len == n && !memcmp(d->k[i].u.s->p, k, n)) return &d->v[i];
    return NULL;
}

int jd_set(jctx_t *c, jdict_t *d, jv_t k, jv_t v)
{
    jv_t *old = jd_get(d, k);
    if (old) {
        *old = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jv_t *nk = ja_grow(&c->a, d->k, d->cap * sizeof(jv_t), nc * sizeof(jv_t));
        if (!nk) return jerr_oom(c, 0);
        d->k = nk;
        jv_t *nv = ja_grow(&c->a, d->v, d->cap * sizeof(jv_t), nc * sizeof(jv_t));
        if (!nv) return jerr_oom(c, 0);
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* truth, names */

bool jv_truthy(jv_t v)
{
    switch (v.kind) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->len != 0;
    case JV_LIST: case JV_TUPLE: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    case JV_RANGE: return v.u.r->len != 0;
    case JV_LOOP: return v.u.lp->items->n != 0;
    default: return true;
    }
}

const char *jv_type_name(jv_t v)
{
    switch (v.kind) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v.flags & JVF_MARKUP ? "Markup" : "str";
    case JV_LIST:
        if (v.flags & JVF_VIEW_ITEMS) return "dict_items";
        if (v.flags & JVF_VIEW_KEYS) return "dict_keys";
        if (v.flags & JVF_VIEW_VALUES) return "dict_values";
        return "list";
    case JV_TUPLE: return "tuple";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_RANGE: return "range";
    case JV_GEN: return v.u.g->what;
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return v.u.fn->self ? "builtin_function_or_method" : "function";
    case JV_CYCLER: return "Cycler";
    case JV_JOINER: return "Joiner";
    }
    return "object";
}

jv_t jv_undef_msg(jctx_t *c, const char *fmt, ...)
{
    char tmp[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    jv_t u = jv_undef();
    u.u.hint = js_new(c, tmp, strlen(tmp));
    return u;
}

int jv_undef_error(jctx_t *c, int line, jv_t u)
{
    if (u.u.hint) return jerr(c, line, "%s", u.u.hint->p);
    return jerr(c, line, "undefined value");
}

/* ------------------------------------------------------------------------------------------ */
/* equality and ordering */

int jv_eq(jctx_t *c, jv_t a, jv_t b, bool *out)
{
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) *out = a.u.i == b.u.i;
        else if (a.kind == JV_FLOAT && b.kind == JV_FLOAT) *out = a.u.f == b.u.f;
        else {
            double f = a.kind == JV_FLOAT ? a.u.f : b.u.f;
            int64_t i = a.kind == JV_FLOAT ? b.u.i : a.u.i;
            /* exact: the float must be integral and equal to i */
            *out = isfinite(f) && f == floor(f) && f >= -9223372036854775808.0 && f < 9223372036854775808.0 &&
                   (int64_t)f == i;
        }
        return 0;
    }
    if (a.kind != b.kind) {
        *out = false;
        return 0;
    }
    switch (a.kind) {
    case JV_UNDEF: case JV_NONE: *out = true; return 0;
    case JV_STR:
        *out = a.u.s->len == b.u.s->len && !memcmp(a.u.s->p, b.u.s->p, a.u.s->len);
        return 0;
    case JV_LIST: case JV_TUPLE: {
        if ((a.flags | b.flags) & JVF_VIEW) return jerr(c, 0, "comparing dict views is not supported");
        if (a.u.l->n != b.u.l->n) { *out = false; return 0; }
        if (jeval_enter(c, 0)) return -1;
        *out = true;
        for (size_t i = 0; i < a.u.l->n && *out; i++)
            if (jv_eq(c, a.u.l->v[i], b.u.l->v[i], out)) { jeval_leave(c); return -1; }
        jeval_leave(c);
        return 0;
    }
    case JV_DICT: {
        if (a.u.d->n != b.u.d->n) { *out = false; return 0; }
        if (jeval_enter(c, 0)) return -1;
        *out = true;
        for (size_t i = 0; i < a.u.d->n && *out; i++) {
            jv_t *o = jd_get(b.u.d, a.u.d->k[i]);
            if (!o) *out = false;
            else if (jv_eq(c, a.u.d->v[i], *o, out)) { jeval_leave(c); return -1; }
        }
        jeval_leave(c);
        return 0;
    }
    case JV_RANGE: {
        const jrange_t *x = a.u.r, *y = b.u.r;
        if (x->len != y->len) *out = false;
        else if (!x->len) *out = true;
        else if (x->start != y->start) *out = false;
        else *out = x->len == 1 || x->step == y->step;
        return 0;
    }
    default:
        *out = a.u.p == b.u.p;
        return 0;
    }
}

int jv_cmp(jctx_t *c, int line, jv_t a, jv_t b, int *out)
{
    if (a.kind == JV_UNDEF) return jv_undef_error(c, line, a);
    if (b.kind == JV_UNDEF) return jv_undef_error(c, line, b);
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) *out = (a.u.i > b.u.i) - (a.u.i < b.u.i);
        else {
            double x = a.kind == JV_FLOAT ? a.u.f : (double)a.u.i, y = b.kind == JV_FLOAT ? b.u.f : (double)b.u.i;
            if (isnan(x) || isnan(y)) return jerr(c, line, "comparing with nan is not supported");
            *out = (x > y) - (x < y);
        }
        return 0;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int r = memcmp(a.u.s->p, b.u.s->p, n);
        *out = r ? (r > 0 ? 1 : -1) : (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
        return 0;
    }
    if (a.kind == b.kind && (a.kind == JV_LIST || a.kind == JV_TUPLE) && !((a.flags | b.flags) & JVF_VIEW)) {
        if (jeval_enter(c, line)) return -1;
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            bool eq;
            if (jv_eq(c, a.u.l->v[i], b.u.l->v[i], &eq)) { jeval_leave(c); return -1; }
            if (!eq) {
                int r = jv_cmp(c, line, a.u.l->v[i], b.u.l->v[i], out);
                jeval_leave(c);
                return r;
            }
        }
        jeval_leave(c);
        *out = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return 0;
    }
    return jerr(c, line, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a), jv_type_name(b));
}

/* ------------------------------------------------------------------------------------------ */
/* str() and repr() */

int jfmt_float(double f, char *out, size_t cap)
{
    if (isnan(f)) return snprintf(out, cap, "nan");
    if (isinf(f)) return snprintf(out, cap, f < 0 ? "-inf" : "inf");
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e is [-]d[.ddd]e(+|-)XX: take the digits and the exponent */
    char digits[24];
    int nd = 0;
    const char *p = e;
    bool neg = false;
    if (*p == '-') { neg = true; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    int decpt = exp10 + 1;
    char buf[64];
    int k = 0;
    if (neg) buf[k++] = '-';
    if (decpt <= -4 || decpt > 16) {
        buf[k++] = digits[0];
        if (nd > 1) {
            buf[k++] = '.';
            memcpy(buf + k, digits + 1, (size_t)nd - 1);
            k += nd - 1;
        }
        k += snprintf(buf + k, sizeof buf - (size_t)k, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    } else if (decpt <= 0) {
        buf[k++] = '0';
        buf[k++] = '.';
        for (int i = 0; i < -decpt; i++) buf[k++] = '0';
        memcpy(buf + k, digits, (size_t)nd);
        k += nd;
    } else if (decpt >= nd) {
        memcpy(buf + k, digits, (size_t)nd);
        k += nd;
        for (int i = nd; i < decpt; i++) buf[k++] = '0';
        buf[k++] = '.';
        buf[k++] = '0';
    } else {
        memcpy(buf + k, digits, (size_t)decpt);
        k += decpt;
        buf[k++] = '.';
        memcpy(buf + k, digits + decpt, (size_t)(nd - decpt));
        k += nd - decpt;
    }
    buf[k] = 0;
    return snprintf(out, cap, "%s", buf);
}

static bool s_printable(uint32_t cp)
{
    if (cp == ' ') return true;
    int k = jpy_cp_category(cp);
    return !(k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
             k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
             k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS);
}

static int s_repr_str(jctx_t *c, const jstr_t *s, jbuf_t *b)
{
    bool sq = memchr(s->p, '\'', s->len) != NULL, dq = memchr(s->p, '"', s->len) != NULL;
    char q = sq && !dq ? '"' : '\'';
    if (jb_putc(c, b, q)) return -1;
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        uint32_t cp = ju8_next(s->p, s->len, &i);
        char tmp[16];
        if (cp == (uint32_t)q || cp == '\\') { tmp[0] = '\\'; tmp[1] = (char)cp; if (jb_put(c, b, tmp, 2)) return -1; }
        else if (cp == '\t') { if (jb_put(c, b, "\\t", 2)) return -1; }
        else if (cp == '\n') { if (jb_put(c, b, "\\n", 2)) return -1; }
        else if (cp == '\r') { if (jb_put(c, b, "\\r", 2)) return -1; }
        else if (cp < ' ' || cp == 0x7F) { if (jb_printf(c, b, "\\x%02x", cp)) return -1; }
        else if (cp < 0x7F || s_printable(cp)) { if (jb_put(c, b, s->p + st, i - st)) return -1; }
        else if (cp <= 0xFF) { if (jb_printf(c, b, "\\x%02x", cp)) return -1; }
        else if (cp <= 0xFFFF) { if (jb_printf(c, b, "\\u%04x", cp)) return -1; }
        else if (jb_printf(c, b, "\\U%08x", cp)) return -1;
    }
    return jb_putc(c, b, q);
}

static int s_repr_items(jctx_t *c, int line, const jv_t *v, size_t n, jbuf_t *b)
{
    for (size_t i = 0; i < n; i++) {
        if (i && jb_put(c, b, ", ", 2)) return -1;
        if (jv_repr(c, line, v[i], b)) return -1;
    }
    return 0;
}

static int s_repr_dict(jctx_t *c, int line, const jdict_t *d, jbuf_t *b)
{
    if (jb_putc(c, b, '{')) return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (i && jb_put(c, b, ", ", 2)) return -1;
        if (jv_repr(c, line, d->k[i], b) || jb_put(c, b, ": ", 2) || jv_repr(c, line, d->v[i], b)) return -1;
    }
    return jb_putc(c, b, '}');
}

static int s_str_common(jctx_t *c, int line, jv_t v, jbuf_t *b, bool repr)
{
    char tmp[64];
    switch (v.kind) {
    case JV_UNDEF:
        if (v.flags & JVF_UNSAFE && !repr) return 0;
        return repr ? jb_put(c, b, "Undefined", 9) : 0;
    case JV_NONE: return jb_put(c, b, "None", 4);
    case JV_BOOL: return v.u.i ? jb_put(c, b, "True", 4) : jb_put(c, b, "False", 5);
    case JV_INT: return jb_printf(c, b, "%" PRId64, v.u.i);
    case JV_FLOAT: jfmt_float(v.u.f, tmp, sizeof tmp); return jb_put(c, b, tmp, strlen(tmp));
    case JV_STR:
        if (!repr) return jb_put(c, b, v.u.s->p, v.u.s->len);
        if (v.flags & JVF_MARKUP) {
            if (jb_put(c, b, "Markup(", 7) || s_repr_str(c, v.u.s, b)) return -1;
            return jb_putc(c, b, ')');
        }
        return s_repr_str(c, v.u.s, b);
    case JV_LIST: {
        if (jeval_enter(c, line)) return -1;
        const char *pre = "[", *post = "]";
        if (v.flags & JVF_VIEW_ITEMS) { pre = "dict_items(["; post = "])"; }
        else if (v.flags & JVF_VIEW_KEYS) { pre = "dict_keys(["; post = "])"; }
        else if (v.flags & JVF_VIEW_VALUES) { pre = "dict_values(["; post = "])"; }
        int r = jb_put(c, b, pre, strlen(pre)) || s_repr_items(c, line, v.u.l->v, v.u.l->n, b) ||
                jb_put(c, b, post, strlen(post));
        jeval_leave(c);
        return r ? -1 : 0;
    }
    case JV_TUPLE: {
        if (jeval_enter(c, line)) return -1;
        int r = jb_putc(c, b, '(') || s_repr_items(c, line, v.u.l->v, v.u.l->n, b) ||
                (v.u.l->n == 1 && jb_putc(c, b, ',')) || jb_putc(c, b, ')');
        jeval_leave(c);
        return r ? -1 : 0;
    }
    case JV_DICT: {
        if (jeval_enter(c, line)) return -1;
        int r = s_repr_dict(c, line, v.u.d, b);
        jeval_leave(c);
        return r;
    }
    case JV_NS: {
        if (jeval_enter(c, line)) return -1;
        int r = jb_put(c, b, "<Namespace ", 11) || s_repr_dict(c, line, v.u.d, b) || jb_putc(c, b, '>');
        jeval_leave(c);
        return r ? -1 : 0;
    }
    case JV_RANGE:
        if (v.u.r->step == 1) return jb_printf(c, b, "range(%" PRId64 ", %" PRId64 ")", v.u.r->start, v.u.r->stop);
        return jb_printf(c, b, "range(%" PRId64 ", %" PRId64 ", %" PRId64 ")", v.u.r->start, v.u.r->stop, v.u.r->step);
    case JV_MACRO:
        return jb_printf(c, b, "<Macro '%s'>", v.u.m->name);
    case JV_LOOP:
        return jb_printf(c, b, "<LoopContext %zu/%zu>", v.u.lp->i + 1, v.u.lp->items->n);
    default:
        return jerr(c, line, "printing a %s object is not supported (Python prints its address)", jv_type_name(v));
    }
}

int jv_to_str(jctx_t *c, int line, jv_t v, jbuf_t *b) { return s_str_common(c, line, v, b, false); }
int jv_repr(jctx_t *c, int line, jv_t v, jbuf_t *b) { return s_str_common(c, line, v, b, true); }

jstr_t *jv_strv(jctx_t *c, int line, jv_t v)
{
    if (v.kind == JV_STR) return v.u.s;
    jbuf_t b = {0};
    if (jv_to_str(c, line, v, &b)) return NULL;
    return jb_str(c, &b);
}

/* ------------------------------------------------------------------------------------------ */
/* len, in, list() */

int jv_len(jctx_t *c, int line, jv_t v, int64_t *out)
{
    switch (v.kind) {
    case JV_UNDEF: *out = 0; return 0;
    case JV_STR: *out = (int64_t)v.u.s->ncp; return 0;
    case JV_LIST: case JV_TUPLE: *out = (int64_t)v.u.l->n; return 0;
    case JV_DICT: *out = (int64_t)v.u.d->n; return 0;
    case JV_RANGE: *out = v.u.r->len; return 0;
    case JV_LOOP: *out = (int64_t)v.u.lp->items->n; return 0;
    default: return jerr(c, line, "object of type '%s' has no len()", jv_type_name(v));
    }
}

int jv_contains(jctx_t *c, int line, jv_t seq, jv_t item, bool *out)
{
    switch (seq.kind) {
    case JV_STR:
        if (item.kind != JV_STR)
            return jerr(c, line, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        *out = item.u.s->len == 0 || memmem(seq.u.s->p, seq.u.s->len, item.u.s->p, item.u.s->len) != NULL;
        return 0;
    case JV_DICT:
        if (!jv_hashable(item)) return jerr(c, line, "unhashable type: '%s'", jv_type_name(item));
        *out = jd_get(seq.u.d, item) != NULL;
        return 0;
    case JV_UNDEF:
        *out = false;
        return 0;
    case JV_RANGE: {
        const jrange_t *r = seq.u.r;
        *out = false;
        if (jv_is_intlike(item)) {
            int64_t x = item.u.i;
            if (r->step > 0 ? (x >= r->start && x < r->stop) : (x <= r->start && x > r->stop))
                *out = (x - r->start) % r->step == 0;
            return 0;
        }
        jlist_t *l;
        if (jv_materialize(c, line, seq, &l)) return -1;
        seq = jv_of(JV_LIST, l);
    }
        /* fall through */
    case JV_LIST: case JV_TUPLE: case JV_GEN: {
        jlist_t *l = seq.kind == JV_GEN ? NULL : seq.u.l;
        if (!l && jeval_iter_begin(c, line, seq, &l)) return -1;
        *out = false;
        for (size_t i = 0; i < l->n; i++) {
            bool eq;
            if (jv_eq(c, l->v[i], item, &eq)) return -1;
            if (eq) {
                *out = true;
                /* Python stops consuming here: where the iterator is now is not tracked */
                if (seq.kind == JV_GEN && i + 1 < l->n) seq.u.g->broken = true;
                break;
            }
        }
        return 0;
    }
    default:
        return jerr(c, line, "argument of type '%s' is not iterable", jv_type_name(seq));
    }
}

int jv_materialize(jctx_t *c, int line, jv_t v, jlist_t **out) { return jeval_iter_begin(c, line, v, out); }

/* ------------------------------------------------------------------------------------------ */
/* json.dumps */

static int s_json_str(jctx_t *c, const jstr_t *s, bool ascii, jbuf_t *b)
{
    if (jb_putc(c, b, '"')) return -1;
    size_t run = 0;
    for (size_t i = 0; i < s->len;) {
        size_t st = i;
        uint32_t cp = ju8_next(s->p, s->len, &i);
        const char *esc = NULL;
        char tmp[16];
        switch (cp) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (cp < 0x20 || (ascii && cp > 0x7E)) {
                if (cp >= 0x10000) {
                    uint32_t v = cp - 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
                } else {
                    snprintf(tmp, sizeof tmp, "\\u%04x", cp);
                }
                esc = tmp;
            }
        }
        if (esc) {
            if (jb_put(c, b, s->p + st - run, run) || jb_put(c, b, esc, strlen(esc))) return -1;
            run = 0;
        } else {
            run += i - st;
        }
    }
    if (jb_put(c, b, s->p + s->len - run, run)) return -1;
    return jb_putc(c, b, '"');
}

static int s_json_newline(jctx_t *c, const jjson_opts_t *o, int level, jbuf_t *b)
{
    if (jb_putc(c, b, '\n')) return -1;
    for (int i = 0; i < level; i++)
        if (jb_put(c, b, o->indent->p, o->indent->len)) return -1;
    return 0;
}

static int s_json(jctx_t *c, int line, jv_t v, const jjson_opts_t *o, int level, jbuf_t *b);

/* A dict key as json.dumps writes it: str as is; int, float, bool, None converted. */
static int s_json_key(jctx_t *c, int line, jv_t k, const jjson_opts_t *o, jbuf_t *b)
{
    char tmp[64];
    switch (k.kind) {
    case JV_STR: return s_json_str(c, k.u.s, o->ensure_ascii, b);
    case JV_BOOL: return jb_put(c, b, k.u.i ? "\"true\"" : "\"false\"", k.u.i ? 6 : 7);
    case JV_NONE: return jb_put(c, b, "\"null\"", 6);
    case JV_INT: return jb_printf(c, b, "\"%" PRId64 "\"", k.u.i);
    case JV_FLOAT:
        if (isnan(k.u.f)) return jb_put(c, b, "\"NaN\"", 5);
        if (isinf(k.u.f)) return k.u.f > 0 ? jb_put(c, b, "\"Infinity\"", 10) : jb_put(c, b, "\"-Infinity\"", 11);
        jfmt_float(k.u.f, tmp, sizeof tmp);
        return jb_printf(c, b, "\"%s\"", tmp);
    default:
        return jerr(c, line, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int s_json_dict(jctx_t *c, int line, const jdict_t *d, const jjson_opts_t *o, int level, jbuf_t *b)
{
    if (!d->n) return jb_put(c, b, "{}", 2);
    size_t *ord = ja_alloc(&c->a, d->n * sizeof *ord);
    if (!ord) return jerr_oom(c, line);
    for (size_t i = 0; i < d->n; i++) ord[i] = i;
    if (o->sort_keys) {
        /* insertion sort by key, Python's ordering (stable; mixed types are a TypeError) */
        for (size_t i = 1; i < d->n; i++) {
            size_t x = ord[i], j = i;
            while (j > 0) {
                int r;
                if (jv_cmp(c, line, d->k[x], d->k[ord[j - 1]], &r)) return -1;
                if (r >= 0) break;
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = x;
        }
    }
    if (jb_putc(c, b, '{')) return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (i && jb_put(c, b, o->item_sep->p, o->item_sep->len)) return -1;
        if (o->has_indent && s_json_newline(c, o, level + 1, b)) return -1;
        if (s_json_key(c, line, d->k[ord[i]], o, b) || jb_put(c, b, o->key_sep->p, o->key_sep->len) ||
            s_json(c, line, d->v[ord[i]], o, level + 1, b))
            return -1;
    }
    if (o->has_indent && s_json_newline(c, o, level, b)) return -1;
    return jb_putc(c, b, '}');
}

static int s_json(jctx_t *c, int line, jv_t v, const jjson_opts_t *o, int level, jbuf_t *b)
{
    char tmp[64];
    switch (v.kind) {
    case JV_NONE: return jb_put(c, b, "null", 4);
    case JV_BOOL: return v.u.i ? jb_put(c, b, "true", 4) : jb_put(c, b, "false", 5);
    case JV_INT: return jb_printf(c, b, "%" PRId64, v.u.i);
    case JV_FLOAT:
        if (isnan(v.u.f)) return jb_put(c, b, "NaN", 3);
        if (isinf(v.u.f)) return v.u.f > 0 ? jb_put(c, b, "Infinity", 8) : jb_put(c, b, "-Infinity", 9);
        jfmt_float(v.u.f, tmp, sizeof tmp);
        return jb_put(c, b, tmp, strlen(tmp));
    case JV_STR: return s_json_str(c, v.u.s, o->ensure_ascii, b);
    case JV_LIST: case JV_TUPLE: {
        if (v.flags & JVF_VIEW) break;
        if (!v.u.l->n) return jb_put(c, b, "[]", 2);
        if (jeval_enter(c, line)) return -1;
        if (jb_putc(c, b, '[')) return -1;
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i && jb_put(c, b, o->item_sep->p, o->item_sep->len)) return -1;
            if (o->has_indent && s_json_newline(c, o, level + 1, b)) return -1;
            if (s_json(c, line, v.u.l->v[i], o, level + 1, b)) return -1;
        }
        if (o->has_indent && s_json_newline(c, o, level, b)) return -1;
        jeval_leave(c);
        return jb_putc(c, b, ']');
    }
    case JV_DICT: {
        if (jeval_enter(c, line)) return -1;
        int r = s_json_dict(c, line, v.u.d, o, level, b);
        jeval_leave(c);
        return r;
    }
    default:
        break;
    }
    return jerr(c, line, "Object of type %s is not JSON serializable", jv_type_name(v));
}

int jv_tojson(jctx_t *c, int line, jv_t v, const jjson_opts_t *o, jbuf_t *b) { return s_json(c, line, v, o, 0, b); }

/* ------------------------------------------------------------------------------------------ */
/* case mapping */

/* Characters whose Python case mapping is not the one-character simple mapping (SpecialCasing
 * and the final-sigma rule), or differs between Unicode versions in ways not worth tracking. */
static bool s_special_case(uint32_t cp)
{
    return cp == 0xDF || cp == 0x130 || cp == 0x149 || cp == 0x1F0 || cp == 0x390 || cp == 0x3A3 || cp == 0x3B0 ||
           cp == 0x587 || (cp >= 0x1E96 && cp <= 0x1E9A) || (cp >= 0x1F50 && cp <= 0x1F57) ||
           (cp >= 0x1F80 && cp <= 0x1FFF) || (cp >= 0xFB00 && cp <= 0xFB06) || (cp >= 0xFB13 && cp <= 0xFB17);
}

static bool s_cased(uint32_t cp)
{
    if (cp < 0x80) return ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
    int k = jpy_cp_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

static uint32_t s_map(uint32_t cp, int how)
{
    if (cp < 0x80) {
        if (how == 'u' || how == 't') return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
        return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    }
    if (how == 'u') return (uint32_t)utf8proc_toupper((utf8proc_int32_t)cp);
    if (how == 't') return (uint32_t)utf8proc_totitle((utf8proc_int32_t)cp);
    return (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

int jpy_case(jctx_t *c, int line, const jstr_t *s, int mode, jbuf_t *b)
{
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->len;) {
        uint32_t cp = ju8_next(s->p, s->len, &i);
        if (cp >= 0x80 && s_special_case(cp))
            return jerr(c, line, "changing the case of U+%04X is not supported", cp);
        uint32_t m = cp;
        switch (mode) {
        case JCASE_UPPER: m = s_map(cp, 'u'); break;
        case JCASE_LOWER: m = s_map(cp, 'l'); break;
        case JCASE_TITLE: m = s_map(cp, prev_cased ? 'l' : 't'); prev_cased = s_cased(cp); break;
        case JCASE_CAPITALIZE: m = s_map(cp, first ? 't' : 'l'); break;
        case JCASE_SWAPCASE: {
            int k = cp < 0x80 ? -1 : jpy_cp_category(cp);
            bool up = cp < 0x80 ? (cp >= 'A' && cp <= 'Z') : k == UTF8PROC_CATEGORY_LU;
            bool lo = cp < 0x80 ? (cp >= 'a' && cp <= 'z') : k == UTF8PROC_CATEGORY_LL;
            m = up ? s_map(cp, 'l') : lo ? s_map(cp, 'u') : cp;
            break;
        }
        }
        first = false;
        char tmp[4];
        if (jb_put(c, b, tmp, ju8_put(tmp, m))) return -1;
    }
    return 0;
}
