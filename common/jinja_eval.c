/* jinja_eval.c - rendering: scopes, statements, expressions, attribute and item access,
 * calls and macros, with jinja2's runtime semantics under ImmutableSandboxedEnvironment.
 *
 * Scopes follow jinja2's compiled frames: a for loop runs each iteration in a fresh frame
 * whose parent is the frame around the loop, so a `set` inside the body is gone at the next
 * iteration and after the loop; `if` opens no scope; a macro call opens a frame whose parent
 * is the frame the macro was defined in (read when it is called, not copied when defined);
 * set blocks, filter blocks, call bodies, with blocks and loop else bodies get a child frame.
 * Namespaces are the one way to carry a value out of a scope.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja_int.h"

#define J_MAX_NEST_EVAL 4096 /* C recursion of the evaluator */

enum { FLOW_OK = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

static int s_eval(jctx_t *c, jframe_t *f, const jnode_t *n, jv_t *out);
static int s_exec(jctx_t *c, jframe_t *f, jnode_t *const *body, uint32_t n, jbuf_t *out);

/* ------------------------------------------------------------------------------------------ */
/* limits */

int jeval_tick(jctx_t *c, int line)
{
    if (++c->steps > c->lim.max_steps)
        return jerr(c, line, "the render took more than %" PRIu64 " evaluation steps (the limit)", c->lim.max_steps);
    return 0;
}

int jeval_enter(jctx_t *c, int line)
{
    if (++c->depth > c->lim.max_depth) {
        c->depth--;
        return jerr(c, line, "calls or values nested more than %d deep (the limit)", c->lim.max_depth);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* frames */

static jframe_t *s_frame(jctx_t *c, jframe_t *parent)
{
    jframe_t *f = ja_alloc(&c->a, sizeof *f);
    if (!f) {
        jerr_oom(c, 0);
        return NULL;
    }
    memset(f, 0, sizeof *f);
    f->parent = parent;
    return f;
}

static int s_fset(jctx_t *c, jframe_t *f, const char *name, jv_t v)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 8;
        const char **nn = ja_grow(&c->a, f->names, f->cap * sizeof(char *), nc * sizeof(char *));
        if (!nn) return jerr_oom(c, 0);
        f->names = nn;
        jv_t *nv = ja_grow(&c->a, f->vals, f->cap * sizeof(jv_t), nc * sizeof(jv_t));
        if (!nv) return jerr_oom(c, 0);
        f->vals = nv;
        f->cap = nc;
    }
    f->names[f->n] = name;
    f->vals[f->n] = v;
    f->n++;
    return 0;
}

static bool s_fget(const jframe_t *f, const char *name, jv_t *out)
{
    for (; f; f = f->parent)
        for (size_t i = f->n; i-- > 0;)
            if (!strcmp(f->names[i], name)) {
                *out = f->vals[i];
                return true;
            }
    return false;
}

static int s_lookup(jctx_t *c, jframe_t *f, const char *name, jv_t *out)
{
    if (s_fget(f, name, out)) return 0;
    if (jglobal_lookup(name, out, c)) return 0;
    *out = jv_undef_msg(c, "'%s' is undefined", name);
    return c->failed ? -1 : 0;
}

/* A frame's names that start as `missing` (jinja_int.h, jnode_t.undefs). */
static int s_mark(jctx_t *c, jframe_t *f, const char *const *names, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        jv_t u = jv_undef_msg(c, "'%s' is undefined", names[i]);
        if (c->failed || s_fset(c, f, names[i], u)) return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* iteration */

int jeval_iter_begin(jctx_t *c, int line, jv_t v, jlist_t **out)
{
    switch (v.kind) {
    case JV_LIST: case JV_TUPLE:
        *out = v.u.l;
        return 0;
    case JV_DICT: {
        jlist_t *l = jl_new(c, v.u.d->n);
        if (!l) return -1;
        for (size_t i = 0; i < v.u.d->n; i++) l->v[l->n++] = v.u.d->k[i];
        *out = l;
        return 0;
    }
    case JV_STR: {
        const jstr_t *s = v.u.s;
        jlist_t *l = jl_new(c, s->ncp);
        if (!l) return -1;
        for (size_t i = 0; i < s->len;) {
            size_t st = i;
            ju8_next(s->p, s->len, &i);
            jstr_t *ch = js_new(c, s->p + st, i - st);
            if (!ch) return -1;
            l->v[l->n++] = jv_str(ch);
        }
        *out = l;
        return 0;
    }
    case JV_RANGE: {
        const jrange_t *r = v.u.r;
        jlist_t *l = jl_new(c, (size_t)r->len);
        if (!l) return -1;
        for (int64_t i = 0; i < r->len; i++) l->v[l->n++] = jv_int(r->start + i * r->step);
        *out = l;
        return 0;
    }
    case JV_UNDEF: {
        jlist_t *l = jl_new(c, 0);
        if (!l) return -1;
        *out = l;
        return 0;
    }
    case JV_GEN: {
        jgen_t *g = v.u.g;
        if (g->broken)
            return jerr(c, line, "using a %s again after a loop left it part-way is not supported", g->what);
        if (!g->items) {
            if (jeval_enter(c, line)) return -1;
            int r = g->fill(c, g);
            jeval_leave(c);
            if (r) return -1;
        }
        jlist_t *l = jl_new(c, 0);
        if (!l) return -1;
        l->v = g->items->v ? g->items->v + g->pos : NULL;
        l->n = l->cap = g->items->n - g->pos;
        g->pos = g->items->n;
        *out = l;
        return 0;
    }
    default:
        return jerr(c, line, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* Bind target (E_NAME or E_TUPLE) to v in frame f. */
static int s_assign(jctx_t *c, jframe_t *f, const jnode_t *t, jv_t v)
{
    if (t->kind == E_NAME) return s_fset(c, f, t->name, v);
    if (v.kind == JV_UNDEF) return jv_undef_error(c, t->line, v);
    jlist_t *items;
    if (v.kind != JV_LIST && v.kind != JV_TUPLE && v.kind != JV_STR && v.kind != JV_DICT && v.kind != JV_RANGE &&
        v.kind != JV_GEN)
        return jerr(c, t->line, "cannot unpack non-iterable %s object", jv_type_name(v));
    if (jeval_iter_begin(c, t->line, v, &items)) return -1;
    if (items->n > t->nkids) return jerr(c, t->line, "too many values to unpack (expected %u)", t->nkids);
    if (items->n < t->nkids)
        return jerr(c, t->line, "not enough values to unpack (expected %u, got %zu)", t->nkids, items->n);
    for (uint32_t i = 0; i < t->nkids; i++)
        if (s_assign(c, f, t->kids[i], items->v[i])) return -1;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* attributes and items */

static const char *s_obj_repr(jv_t v)
{
    switch (v.kind) {
    case JV_NONE: return "None";
    case JV_DICT: return "dict object";
    case JV_LIST: return "list object";
    case JV_TUPLE: return "tuple object";
    case JV_STR: return "str object";
    case JV_INT: return "int object";
    case JV_FLOAT: return "float object";
    case JV_BOOL: return "bool object";
    default: return "object";
    }
}

static int s_loop_attr(jctx_t *c, int line, jv_t obj, const char *name, jv_t *out)
{
    const jloop_t *lp = obj.u.lp;
    size_t i = lp->i, n = lp->items->n;
    if (!strcmp(name, "index")) *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
    else if (!strcmp(name, "last")) *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = jv_int((int64_t)n);
    else if (!strcmp(name, "depth")) *out = jv_int(lp->depth0 + 1);
    else if (!strcmp(name, "depth0")) *out = jv_int(lp->depth0);
    else if (!strcmp(name, "previtem")) *out = i ? lp->items->v[i - 1] : jv_undef_msg(c, "there is no previous item");
    else if (!strcmp(name, "nextitem")) *out = i + 1 < n ? lp->items->v[i + 1] : jv_undef_msg(c, "there is no next item");
    else if (!strcmp(name, "cycle") || !strcmp(name, "changed")) {
        jfunc_t *fn = ja_alloc(&c->a, sizeof *fn);
        jv_t *self = ja_alloc(&c->a, sizeof *self);
        if (!fn || !self) return jerr_oom(c, line);
        *self = obj;
        fn->id = name[1] == 'y' ? JF_LOOP_CYCLE : JF_LOOP_CHANGED;
        fn->name = name[1] == 'y' ? "cycle" : "changed";
        fn->self = self;
        *out = jv_of(JV_FUNC, fn);
    } else {
        *out = jv_undef_msg(c, "'LoopContext' object has no attribute '%s'", name);
    }
    return c->failed ? -1 : 0;
}

static int s_object_attr(jctx_t *c, int line, jv_t obj, const char *name, jv_t *out, bool *found)
{
    *found = true;
    if (obj.kind == JV_NS) {
        jv_t *v = jd_gets(obj.u.d, name, strlen(name));
        if (v) *out = *v;
        else *found = false;
        return 0;
    }
    if (obj.kind == JV_LOOP) return s_loop_attr(c, line, obj, name, out);
    if (obj.kind == JV_CYCLER) {
        if (!strcmp(name, "current")) {
            const jcycler_t *cy = obj.u.cy;
            *out = cy->items->v[cy->pos];
            return 0;
        }
        if (!strcmp(name, "next") || !strcmp(name, "reset")) {
            jfunc_t *fn = ja_alloc(&c->a, sizeof *fn);
            jv_t *self = ja_alloc(&c->a, sizeof *self);
            if (!fn || !self) return jerr_oom(c, line);
            *self = obj;
            fn->id = name[0] == 'n' ? JF_CYCLER_NEXT : JF_CYCLER_RESET;
            fn->name = name;
            fn->self = self;
            *out = jv_of(JV_FUNC, fn);
            return 0;
        }
        if (!strcmp(name, "items")) return jerr(c, line, "the attribute 'items' of a cycler is not supported");
    }
    if (obj.kind == JV_MACRO || obj.kind == JV_FUNC || obj.kind == JV_JOINER || obj.kind == JV_GEN) {
        /* the public attributes Python objects of these kinds have; any other is missing */
        static const char *const known[] = {"name", "arguments", "defaults", "catch_kwargs", "catch_varargs",
                                            "caller", "explicit_caller", "send", "throw", "close", "gi_code",
                                            "gi_frame", "gi_running", "gi_yieldfrom", "gi_suspended", "sep", "used",
                                            NULL};
        for (const char *const *k = known; *k; k++)
            if (!strcmp(*k, name))
                return jerr(c, line, "the attribute '%s' of a %s object is not supported", name, jv_type_name(obj));
        *found = false;
        return 0;
    }
    int r = jmethod_lookup(c, line, obj, name, out);
    if (r < 0) return -1;
    *found = r > 0;
    return 0;
}

int jeval_getattr(jctx_t *c, int line, jv_t obj, const char *name, jv_t *out)
{
    if (obj.kind == JV_UNDEF) {
        if (obj.flags & JVF_UNSAFE) return jv_undef_error(c, line, obj);
        if (obj.u.hint) return jv_undef_error(c, line, obj);
        return jerr(c, line, "'%s' is undefined", name);
    }
    if (name[0] == '_' && name[1] == '_') {
        *out = jv_undef_msg(c, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
        out->flags |= JVF_UNSAFE;
        return c->failed ? -1 : 0;
    }
    bool found;
    if (s_object_attr(c, line, obj, name, out, &found)) return -1;
    if (found) return 0;
    if (obj.kind == JV_DICT) {
        jv_t *v = jd_gets(obj.u.d, name, strlen(name));
        if (v) {
            *out = *v;
            return 0;
        }
    }
    *out = jv_undef_msg(c, "'%s' has no attribute '%s'", s_obj_repr(obj), name);
    return c->failed ? -1 : 0;
}

static bool s_index(int64_t n, jv_t key, int64_t *out)
{
    if (!jv_is_intlike(key)) return false;
    int64_t i = key.u.i;
    if (i < 0) i += n;
    if (i < 0 || i >= n) return false;
    *out = i;
    return true;
}

int jeval_getitem(jctx_t *c, int line, jv_t obj, jv_t key, jv_t *out)
{
    int64_t i;
    switch (obj.kind) {
    case JV_UNDEF:
        return jv_undef_error(c, line, obj);
    case JV_DICT:
        if (jv_hashable(key)) {
            jv_t *v = jd_get(obj.u.d, key);
            if (v) {
                *out = *v;
                return 0;
            }
        }
        break;
    case JV_LIST: case JV_TUPLE:
        if (obj.flags & JVF_VIEW) break;
        if (s_index((int64_t)obj.u.l->n, key, &i)) {
            *out = obj.u.l->v[i];
            return 0;
        }
        break;
    case JV_STR:
        if (s_index((int64_t)obj.u.s->ncp, key, &i)) {
            size_t a = ju8_offset(obj.u.s, i), b = a;
            ju8_next(obj.u.s->p, obj.u.s->len, &b);
            jstr_t *s = js_new(c, obj.u.s->p + a, b - a);
            if (!s) return -1;
            *out = jv_str(s);
            return 0;
        }
        break;
    case JV_RANGE:
        if (s_index(obj.u.r->len, key, &i)) {
            *out = jv_int(obj.u.r->start + i * obj.u.r->step);
            return 0;
        }
        break;
    default:
        break;
    }
    if (key.kind == JV_STR) {
        if (key.u.s->p[0] == '_' && key.u.s->p[1] == '_') {
            *out = jv_undef_msg(c, "access to attribute '%s' of '%s' object is unsafe.", key.u.s->p, jv_type_name(obj));
            out->flags |= JVF_UNSAFE;
            return c->failed ? -1 : 0;
        }
        bool found;
        if (s_object_attr(c, line, obj, key.u.s->p, out, &found)) return -1;
        if (found) return 0;
    }
    jbuf_t b = {0};
    if (key.kind <= JV_STR && key.kind != JV_UNDEF) {
        if (jv_repr(c, line, key, &b)) return -1;
    } else if (jb_put(c, &b, jv_type_name(key), strlen(jv_type_name(key)))) {
        return -1;
    }
    *out = jv_undef_msg(c, "%s has no element %s", s_obj_repr(obj), b.p ? b.p : "?");
    return c->failed ? -1 : 0;
}

/* Python's slice.indices() for a sequence of n items; sv[] are start, stop, step. */
static int s_slice_indices(jctx_t *c, int line, const jv_t *sv, int64_t n, int64_t *start, int64_t *stop,
                           int64_t *step, bool *type_ok)
{
    *type_ok = true;
    for (int k = 0; k < 3; k++)
        if (sv[k].kind != JV_NONE && !jv_is_intlike(sv[k])) {
            *type_ok = false;
            if (k == 2) return 0;
        }
    *step = sv[2].kind == JV_NONE ? 1 : sv[2].u.i;
    if (*type_ok == false && jv_is_intlike(sv[2]) && *step == 0) return jerr(c, line, "slice step cannot be zero");
    if (!*type_ok) return 0;
    if (*step == 0) return jerr(c, line, "slice step cannot be zero");
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    for (int k = 0; k < 2; k++) {
        int64_t *dst = k ? stop : start;
        if (sv[k].kind == JV_NONE) {
            *dst = *step < 0 ? (k ? lo : hi) : (k ? hi : lo);
            continue;
        }
        int64_t x = sv[k].u.i;
        if (x < 0) {
            x += n;
            if (x < lo) x = lo;
        } else if (x > hi) {
            x = hi;
        }
        *dst = x;
    }
    return 0;
}

/* obj[a:b:c]: jinja2 compiles slices to Python's own subscript (no sandbox getitem and no
 * Undefined fallback), so a bad object or bound is an error. */
static int s_slice(jctx_t *c, int line, jv_t obj, const jv_t *sv, jv_t *out)
{
    if (obj.kind == JV_UNDEF) return jv_undef_error(c, line, obj);
    int64_t n;
    switch (obj.kind) {
    case JV_STR: n = (int64_t)obj.u.s->ncp; break;
    case JV_LIST: case JV_TUPLE:
        if (obj.flags & JVF_VIEW) return jerr(c, line, "'%s' object is not subscriptable", jv_type_name(obj));
        n = (int64_t)obj.u.l->n;
        break;
    case JV_RANGE: n = obj.u.r->len; break;
    case JV_DICT: return jerr(c, line, "unhashable type: 'slice'");
    default: return jerr(c, line, "'%s' object is not subscriptable", jv_type_name(obj));
    }
    int64_t a = 0, b = 0, st = 1;
    bool ok;
    if (s_slice_indices(c, line, sv, n, &a, &b, &st, &ok)) return -1;
    if (!ok) return jerr(c, line, "slice indices must be integers or None or have an __index__ method");
    int64_t cnt = st > 0 ? (b > a ? (b - a + st - 1) / st : 0) : (a > b ? (a - b - st - 1) / -st : 0);
    if (obj.kind == JV_RANGE) {
        jrange_t *r = ja_alloc(&c->a, sizeof *r);
        if (!r) return jerr_oom(c, line);
        const jrange_t *o = obj.u.r;
        r->start = o->start + a * o->step;
        r->step = o->step * st;
        r->stop = o->start + b * o->step;
        r->len = cnt;
        *out = jv_of(JV_RANGE, r);
        return 0;
    }
    if (obj.kind == JV_STR) {
        const jstr_t *s = obj.u.s;
        jbuf_t buf = {0};
        if (st == 1) {
            size_t x = ju8_offset(s, a), y = ju8_offset(s, a + cnt);
            jstr_t *r = js_new(c, s->p + x, y - x);
            if (!r) return -1;
            *out = jv_str(r);
            out->flags = obj.flags & JVF_MARKUP;
            return 0;
        }
        /* offsets of every code point, then pick */
        size_t *off = ja_alloc(&c->a, ((size_t)n + 1) * sizeof *off);
        if (!off) return jerr_oom(c, line);
        size_t k = 0;
        for (size_t i = 0; i < s->len;) {
            off[k++] = i;
            ju8_next(s->p, s->len, &i);
        }
        off[k] = s->len;
        for (int64_t j = 0, x = a; j < cnt; j++, x += st)
            if (jb_put(c, &buf, s->p + off[x], off[x + 1] - off[x])) return -1;
        jstr_t *r = jb_str(c, &buf);
        if (!r) return -1;
        *out = jv_str(r);
        out->flags = obj.flags & JVF_MARKUP;
        return 0;
    }
    jlist_t *l = jl_new(c, (size_t)cnt);
    if (!l) return -1;
    for (int64_t j = 0, x = a; j < cnt; j++, x += st) l->v[l->n++] = obj.u.l->v[x];
    *out = jv_of(obj.kind, l);
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* arithmetic */

static double s_num(jv_t v) { return v.kind == JV_FLOAT ? v.u.f : (double)v.u.i; }

int jv_markup_escape(jctx_t *c, const jstr_t *s, jbuf_t *b)
{
    for (size_t i = 0; i < s->len; i++) {
        const char *e = NULL;
        switch (s->p[i]) {
        case '&': e = "&amp;"; break;
        case '<': e = "&lt;"; break;
        case '>': e = "&gt;"; break;
        case '"': e = "&#34;"; break;
        case '\'': e = "&#39;"; break;
        }
        if (e ? jb_put(c, b, e, strlen(e)) : jb_putc(c, b, s->p[i])) return -1;
    }
    return 0;
}

static int s_repeat(jctx_t *c, int line, jv_t seq, int64_t k, jv_t *out)
{
    if (k < 0) k = 0;
    if (seq.kind == JV_STR) {
        const jstr_t *s = seq.u.s;
        if (k && s->len && (uint64_t)k > c->lim.max_output / s->len)
            return jerr(c, line, "a string of more than %zu bytes is over the limit", c->lim.max_output);
        jbuf_t b = {0};
        for (int64_t i = 0; i < k; i++)
            if (jb_put(c, &b, s->p, s->len)) return -1;
        jstr_t *r = jb_str(c, &b);
        if (!r) return -1;
        *out = jv_str(r);
        out->flags = seq.flags & JVF_MARKUP;
        return 0;
    }
    const jlist_t *l = seq.u.l;
    if (k && l->n && (uint64_t)k > ((uint64_t)1 << 24) / l->n) return jerr(c, line, "a list of more than 16M items is over the limit");
    jlist_t *r = jl_new(c, (size_t)k * l->n);
    if (!r) return -1;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < l->n; j++) r->v[r->n++] = l->v[j];
    *out = jv_of(seq.kind, r);
    return 0;
}

static int s_type_err(jctx_t *c, int line, const char *op, jv_t a, jv_t b)
{
    return jerr(c, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a), jv_type_name(b));
}

int jeval_binop(jctx_t *c, int line, int op, jv_t a, jv_t b, jv_t *out)
{
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (a.kind == JV_UNDEF) return jv_undef_error(c, line, a);
    if (b.kind == JV_UNDEF) return jv_undef_error(c, line, b);
    bool ints = jv_is_intlike(a) && jv_is_intlike(b), nums = jv_is_num(a) && jv_is_num(b);
    int64_t r;
    switch (op) {
    case OP_ADD:
        if (ints) {
            if (__builtin_add_overflow(a.u.i, b.u.i, &r)) goto overflow;
            *out = jv_int(r);
            return 0;
        }
        if (nums) { *out = jv_float(s_num(a) + s_num(b)); return 0; }
        if (a.kind == JV_STR && b.kind == JV_STR) {
            jbuf_t buf = {0};
            bool ma = a.flags & JVF_MARKUP, mb = b.flags & JVF_MARKUP;
            if (ma != mb) {
                if (ma ? jb_put(c, &buf, a.u.s->p, a.u.s->len) : jv_markup_escape(c, a.u.s, &buf)) return -1;
                if (mb ? jb_put(c, &buf, b.u.s->p, b.u.s->len) : jv_markup_escape(c, b.u.s, &buf)) return -1;
            } else if (jb_put(c, &buf, a.u.s->p, a.u.s->len) || jb_put(c, &buf, b.u.s->p, b.u.s->len)) {
                return -1;
            }
            jstr_t *s = jb_str(c, &buf);
            if (!s) return -1;
            *out = jv_str(s);
            out->flags = (ma || mb) ? JVF_MARKUP : 0;
            return 0;
        }
        if (a.kind == b.kind && (a.kind == JV_LIST || a.kind == JV_TUPLE) && !((a.flags | b.flags) & JVF_VIEW)) {
            jlist_t *l = jl_new(c, a.u.l->n + b.u.l->n);
            if (!l) return -1;
            for (size_t i = 0; i < a.u.l->n; i++) l->v[l->n++] = a.u.l->v[i];
            for (size_t i = 0; i < b.u.l->n; i++) l->v[l->n++] = b.u.l->v[i];
            *out = jv_of(a.kind, l);
            return 0;
        }
        if (a.kind == JV_STR)
            return jerr(c, line, "can only concatenate str (not \"%s\") to str", jv_type_name(b));
        if (a.kind == JV_LIST)
            return jerr(c, line, "can only concatenate list (not \"%s\") to list", jv_type_name(b));
        return s_type_err(c, line, "+", a, b);
    case OP_SUB:
        if (ints) {
            if (__builtin_sub_overflow(a.u.i, b.u.i, &r)) goto overflow;
            *out = jv_int(r);
            return 0;
        }
        if (nums) { *out = jv_float(s_num(a) - s_num(b)); return 0; }
        return s_type_err(c, line, "-", a, b);
    case OP_MUL:
        if (ints) {
            if (__builtin_mul_overflow(a.u.i, b.u.i, &r)) goto overflow;
            *out = jv_int(r);
            return 0;
        }
        if (nums) { *out = jv_float(s_num(a) * s_num(b)); return 0; }
        if ((a.kind == JV_STR || a.kind == JV_LIST || a.kind == JV_TUPLE) && !(a.flags & JVF_VIEW) && jv_is_intlike(b))
            return s_repeat(c, line, a, b.u.i, out);
        if ((b.kind == JV_STR || b.kind == JV_LIST || b.kind == JV_TUPLE) && !(b.flags & JVF_VIEW) && jv_is_intlike(a))
            return s_repeat(c, line, b, a.u.i, out);
        return s_type_err(c, line, "*", a, b);
    case OP_DIV:
        if (!nums) return s_type_err(c, line, "/", a, b);
        if (s_num(b) == 0.0) return jerr(c, line, "division by zero");
        if (ints && (a.u.i > (1LL << 53) || a.u.i < -(1LL << 53) || b.u.i > (1LL << 53) || b.u.i < -(1LL << 53)))
            return jerr(c, line, "true division of integers beyond 2**53 is not supported");
        *out = jv_float(s_num(a) / s_num(b));
        return 0;
    case OP_FLOORDIV: case OP_MOD:
        if (!nums) {
            if (op == OP_MOD && a.kind == JV_STR) return jerr(c, line, "printf-style string formatting (%%) is not supported");
            return s_type_err(c, line, names[op], a, b);
        }
        if (ints) {
            if (!b.u.i) return jerr(c, line, op == OP_MOD ? "integer modulo by zero" : "integer division or modulo by zero");
            if (a.u.i == INT64_MIN && b.u.i == -1) {
                if (op == OP_MOD) { *out = jv_int(0); return 0; }
                goto overflow;
            }
            int64_t q = a.u.i / b.u.i, m = a.u.i % b.u.i;
            if (m && ((m < 0) != (b.u.i < 0))) { q--; m += b.u.i; }
            *out = jv_int(op == OP_MOD ? m : q);
            return 0;
        } else {
            double x = s_num(a), y = s_num(b);
            if (y == 0.0) return jerr(c, line, op == OP_MOD ? "float modulo" : "float floor division by zero");
            double mod = fmod(x, y), div = (x - mod) / y;
            if (mod != 0.0) {
                if ((y < 0) != (mod < 0)) { mod += y; div -= 1.0; }
            } else {
                mod = copysign(0.0, y);
            }
            double fl;
            if (div != 0.0) {
                fl = floor(div);
                if (div - fl > 0.5) fl += 1.0;
            } else {
                fl = copysign(0.0, x / y);
            }
            *out = jv_float(op == OP_MOD ? mod : fl);
            return 0;
        }
    case OP_POW:
        if (!nums) return s_type_err(c, line, "** or pow()", a, b);
        if (ints && b.u.i >= 0) {
            int64_t base = a.u.i, e = b.u.i, acc = 1;
            while (e) {
                if (e & 1 && __builtin_mul_overflow(acc, base, &acc)) goto overflow;
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) goto overflow;
            }
            *out = jv_int(acc);
            return 0;
        } else {
            double x = s_num(a), y = s_num(b);
            if (x == 0.0 && y < 0) return jerr(c, line, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) return jerr(c, line, "a negative number to a fractional power (a complex number) is not supported");
            double v = pow(x, y);
            if (isinf(v) && isfinite(x) && isfinite(y)) return jerr(c, line, "numerical result out of range");
            *out = jv_float(v);
            return 0;
        }
    }
    return jerr(c, line, "bad operator");
overflow:
    return jerr(c, line, "integer overflow: results beyond 64 bits are not supported");
}

/* ------------------------------------------------------------------------------------------ */
/* calls */

static int s_exec_macro(jctx_t *c, int line, const jmacro_t *m, jv_t *args, size_t nargs, const char **kwn,
                        jv_t *kwv, size_t nkw, jv_t *out)
{
    const jnode_t *d = m->def;
    if (jeval_enter(c, line)) return -1;
    jframe_t *f = s_frame(c, m->closure);
    if (!f || s_mark(c, f, d->undefs, d->nundefs)) return -1;
    uint32_t np = d->nkids2;
    bool *used = NULL;
    if (nkw) {
        used = ja_alloc(&c->a, nkw * sizeof *used);
        if (!used) return jerr_oom(c, line);
        memset(used, 0, nkw * sizeof *used);
    }
    for (uint32_t i = 0; i < np; i++) {
        const jnode_t *prm = d->kids2[i];
        jv_t v;
        bool have = false;
        if (i < nargs) {
            v = args[i];
            have = true;
        }
        for (size_t k = 0; k < nkw; k++)
            if (!strcmp(kwn[k], prm->name)) {
                if (have) return jerr(c, line, "macro '%s' got multiple values for argument '%s'", m->name, prm->name);
                v = kwv[k];
                used[k] = true;
                have = true;
            }
        if (!have) {
            if (prm->a) {
                if (s_eval(c, f, prm->a, &v)) return -1;
            } else {
                v = jv_undef_msg(c, "parameter '%s' was not provided", prm->name);
            }
        }
        if (s_fset(c, f, prm->name, v)) return -1;
    }
    if (nargs > np) {
        if (!(d->flags & JM_VARARGS))
            return jerr(c, line, "macro '%s' takes not more than %u argument(s)", m->name, np);
    }
    if (d->flags & JM_VARARGS) {
        jlist_t *va = jl_new(c, nargs > np ? nargs - np : 0);
        if (!va) return -1;
        for (size_t i = np; i < nargs; i++) va->v[va->n++] = args[i];
        if (s_fset(c, f, "varargs", jv_of(JV_TUPLE, va))) return -1;
    }
    jdict_t *kw = NULL;
    if (d->flags & JM_KWARGS && !(kw = jd_new(c, 0))) return -1;
    bool caller_set = false;
    for (size_t k = 0; k < nkw; k++) {
        if (used[k]) continue;
        if (!strcmp(kwn[k], "caller") && d->flags & JM_CALLER) {
            if (s_fset(c, f, "caller", kwv[k])) return -1;
            caller_set = true;
            continue;
        }
        if (!kw) return jerr(c, line, "macro '%s' takes no keyword argument '%s'", m->name, kwn[k]);
        jv_t key = jv_cstr(c, kwn[k]);
        if (c->failed || jd_set(c, kw, key, kwv[k])) return -1;
    }
    if (kw && s_fset(c, f, "kwargs", jv_of(JV_DICT, kw))) return -1;
    if (d->flags & JM_CALLER && !caller_set && d->kind == S_MACRO &&
        s_fset(c, f, "caller", jv_undef_msg(c, "No caller defined")))
        return -1;
    jbuf_t b = {0};
    int r = s_exec(c, f, d->kids, d->nkids, &b);
    if (r < 0) return -1;
    jeval_leave(c);
    jstr_t *s = jb_str(c, &b);
    if (!s) return -1;
    *out = jv_str(s);
    return 0;
}

int jeval_call_value(jctx_t *c, int line, jv_t fn, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv,
                     size_t nkw, jv_t *out)
{
    if (jeval_tick(c, line)) return -1;
    switch (fn.kind) {
    case JV_MACRO:
        return s_exec_macro(c, line, fn.u.m, args, nargs, kwn, kwv, nkw, out);
    case JV_FUNC:
        if (fn.u.fn->id >= JF_METHOD_BASE) return jmethod_call(c, line, fn.u.fn, args, nargs, kwn, kwv, nkw, out);
        return jglobal_call(c, line, fn.u.fn, args, nargs, kwn, kwv, nkw, out);
    case JV_JOINER:
        if (nargs || nkw) return jerr(c, line, "a joiner takes no arguments");
        if (!fn.u.jo->used) {
            fn.u.jo->used = true;
            *out = jv_cstr(c, "");
        } else {
            *out = jv_str(fn.u.jo->sep);
        }
        return c->failed ? -1 : 0;
    case JV_UNDEF:
        return jv_undef_error(c, line, fn);
    default:
        return jerr(c, line, "'%s' object is not callable", jv_type_name(fn));
    }
}

static int s_eval_args(jctx_t *c, jframe_t *f, const jnode_t *n, jv_t **args, jv_t **kwv)
{
    *args = NULL;
    *kwv = NULL;
    if (n->nkids) {
        *args = ja_alloc(&c->a, n->nkids * sizeof(jv_t));
        if (!*args) return jerr_oom(c, n->line);
        for (uint32_t i = 0; i < n->nkids; i++)
            if (s_eval(c, f, n->kids[i], &(*args)[i])) return -1;
    }
    if (n->nkids2) {
        *kwv = ja_alloc(&c->a, n->nkids2 * sizeof(jv_t));
        if (!*kwv) return jerr_oom(c, n->line);
        for (uint32_t i = 0; i < n->nkids2; i++)
            if (s_eval(c, f, n->kids2[i], &(*kwv)[i])) return -1;
    }
    return 0;
}

static int s_eval_call(jctx_t *c, jframe_t *f, const jnode_t *n, const jv_t *caller, jv_t *out)
{
    jv_t fn;
    if (s_eval(c, f, n->a, &fn)) return -1;
    jv_t *args, *kwv;
    if (s_eval_args(c, f, n, &args, &kwv)) return -1;
    const char **kwn = n->kwnames;
    size_t nkw = n->nkids2;
    if (caller) {
        const char **k2 = ja_alloc(&c->a, (nkw + 1) * sizeof(char *));
        jv_t *v2 = ja_alloc(&c->a, (nkw + 1) * sizeof(jv_t));
        if (!k2 || !v2) return jerr_oom(c, n->line);
        for (size_t i = 0; i < nkw; i++) { k2[i] = kwn[i]; v2[i] = kwv[i]; }
        k2[nkw] = "caller";
        v2[nkw] = *caller;
        kwn = k2;
        kwv = v2;
        nkw++;
    }
    return jeval_call_value(c, n->line, fn, args, n->nkids, kwn, kwv, nkw, out);
}

/* ------------------------------------------------------------------------------------------ */
/* filters and tests */

static int s_bind(jctx_t *c, int line, const char *what, const jfilter_def_t *d, jv_t *args, size_t nargs,
                  const char **kwn, jv_t *kwv, size_t nkw, jargs_t *a)
{
    memset(a, 0, sizeof *a);
    size_t np = 0;
    while (np < JF_MAXP && d->params[np]) np++;
    if (d->vararg) {
        size_t k = nargs < np ? nargs : np;
        for (size_t i = 0; i < k; i++) { a->p[i] = args[i]; a->present[i] = true; }
        a->extra = args ? args + k : NULL;
        a->nextra = nargs - k;
        a->kwn = kwn;
        a->kwv = kwv;
        a->nkw = nkw;
        return 0;
    }
    if (nargs > np) return jerr(c, line, "the %s '%s' takes at most %zu argument(s), got %zu", what, d->name, np, nargs);
    for (size_t i = 0; i < nargs; i++) { a->p[i] = args[i]; a->present[i] = true; }
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < np; i++)
            if (!strcmp(d->params[i], kwn[k])) break;
        if (i == np) return jerr(c, line, "the %s '%s' got an unexpected keyword argument '%s'", what, d->name, kwn[k]);
        if (a->present[i]) return jerr(c, line, "the %s '%s' got multiple values for argument '%s'", what, d->name, kwn[k]);
        a->p[i] = kwv[k];
        a->present[i] = true;
    }
    return 0;
}

int jeval_apply_filter(jctx_t *c, int line, const jfilter_def_t *d, jv_t v, jv_t *args, size_t nargs,
                       const char **kwn, jv_t *kwv, size_t nkw, jv_t *out)
{
    jargs_t a;
    if (jeval_tick(c, line) || s_bind(c, line, "filter", d, args, nargs, kwn, kwv, nkw, &a)) return -1;
    if (jeval_enter(c, line)) return -1;
    int r = d->fn(c, line, v, &a, out);
    jeval_leave(c);
    return r;
}

int jeval_apply_test(jctx_t *c, int line, const jfilter_def_t *d, jv_t v, jv_t *args, size_t nargs,
                     const char **kwn, jv_t *kwv, size_t nkw, bool *out)
{
    jargs_t a;
    if (jeval_tick(c, line) || s_bind(c, line, "test", d, args, nargs, kwn, kwv, nkw, &a)) return -1;
    jv_t r;
    if (jeval_enter(c, line)) return -1;
    int rc = d->fn(c, line, v, &a, &r);
    jeval_leave(c);
    if (rc) return -1;
    *out = jv_truthy(r);
    return 0;
}

/* A filter chain whose innermost operand is missing (filter blocks, set blocks): base. */
static int s_eval_filter(jctx_t *c, jframe_t *f, const jnode_t *n, const jv_t *base, jv_t *out)
{
    jv_t v;
    if (!n->a) {
        if (!base) return jerr(c, n->line, "filter without a value");
        v = *base;
    } else if (n->a->kind == E_FILTER) {
        if (s_eval_filter(c, f, n->a, base, &v)) return -1;
    } else if (s_eval(c, f, n->a, &v)) {
        return -1;
    }
    jv_t *args, *kwv;
    if (s_eval_args(c, f, n, &args, &kwv)) return -1;
    return jeval_apply_filter(c, n->line, n->def, v, args, n->nkids, n->kwnames, kwv, n->nkids2, out);
}

/* ------------------------------------------------------------------------------------------ */
/* expressions */

static int s_eval_node(jctx_t *c, jframe_t *f, const jnode_t *n, jv_t *out);

static int s_eval(jctx_t *c, jframe_t *f, const jnode_t *n, jv_t *out)
{
    if (++c->rec > J_MAX_NEST_EVAL) return jerr(c, n->line, "expressions nested too deeply");
    int r = jeval_tick(c, n->line) ? -1 : s_eval_node(c, f, n, out);
    c->rec--;
    return r;
}

static int s_eval_node(jctx_t *c, jframe_t *f, const jnode_t *n, jv_t *out)
{
    jv_t a, b;
    switch (n->kind) {
    case E_CONST:
        *out = n->cval;
        return 0;
    case E_NAME:
        return s_lookup(c, f, n->name, out);
    case E_GETATTR:
        if (s_eval(c, f, n->a, &a)) return -1;
        return jeval_getattr(c, n->line, a, n->name, out);
    case E_GETITEM:
        if (s_eval(c, f, n->a, &a)) return -1;
        if (n->b->kind == E_SLICE) {
            jv_t sv[3] = {jv_none(), jv_none(), jv_none()};
            const jnode_t *parts[3] = {n->b->a, n->b->b, n->b->c};
            for (int k = 0; k < 3; k++)
                if (parts[k] && s_eval(c, f, parts[k], &sv[k])) return -1;
            return s_slice(c, n->line, a, sv, out);
        }
        if (s_eval(c, f, n->b, &b)) return -1;
        return jeval_getitem(c, n->line, a, b, out);
    case E_SLICE:
        return jerr(c, n->line, "a slice outside []");
    case E_CALL:
        return s_eval_call(c, f, n, NULL, out);
    case E_FILTER:
        return s_eval_filter(c, f, n, NULL, out);
    case E_TEST: {
        if (s_eval(c, f, n->a, &a)) return -1;
        jv_t *args, *kwv;
        if (s_eval_args(c, f, n, &args, &kwv)) return -1;
        bool r;
        if (jeval_apply_test(c, n->line, n->def, a, args, n->nkids, n->kwnames, kwv, n->nkids2, &r)) return -1;
        *out = jv_bool(r);
        return 0;
    }
    case E_NOT:
        if (s_eval(c, f, n->a, &a)) return -1;
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case E_NEG: case E_POS:
        if (s_eval(c, f, n->a, &a)) return -1;
        if (a.kind == JV_UNDEF) return jv_undef_error(c, n->line, a);
        if (jv_is_intlike(a)) {
            if (n->kind == E_NEG && a.u.i == INT64_MIN) return jerr(c, n->line, "integer overflow: results beyond 64 bits are not supported");
            *out = jv_int(n->kind == E_NEG ? -a.u.i : a.u.i);
            return 0;
        }
        if (a.kind == JV_FLOAT) {
            *out = jv_float(n->kind == E_NEG ? -a.u.f : a.u.f);
            return 0;
        }
        return jerr(c, n->line, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(a));
    case E_BIN:
        if (s_eval(c, f, n->a, &a) || s_eval(c, f, n->b, &b)) return -1;
        return jeval_binop(c, n->line, n->op, a, b, out);
    case E_AND:
        if (s_eval(c, f, n->a, &a)) return -1;
        if (!jv_truthy(a)) { *out = a; return 0; }
        return s_eval(c, f, n->b, out);
    case E_OR:
        if (s_eval(c, f, n->a, &a)) return -1;
        if (jv_truthy(a)) { *out = a; return 0; }
        return s_eval(c, f, n->b, out);
    case E_CMP: {
        if (s_eval(c, f, n->a, &a)) return -1;
        for (uint32_t i = 0; i < n->nkids; i++) {
            if (s_eval(c, f, n->kids[i], &b)) return -1;
            bool r;
            int cmp;
            switch (n->ops[i]) {
            case CMP_EQ: if (jv_eq(c, a, b, &r)) return -1; break;
            case CMP_NE: if (jv_eq(c, a, b, &r)) return -1; r = !r; break;
            case CMP_IN: if (jv_contains(c, n->line, b, a, &r)) return -1; break;
            case CMP_NOTIN: if (jv_contains(c, n->line, b, a, &r)) return -1; r = !r; break;
            default:
                if (jv_cmp(c, n->line, a, b, &cmp)) return -1;
                r = n->ops[i] == CMP_LT ? cmp < 0 : n->ops[i] == CMP_LE ? cmp <= 0 : n->ops[i] == CMP_GT ? cmp > 0 : cmp >= 0;
            }
            if (!r) { *out = jv_bool(false); return 0; }
            a = b;
        }
        *out = jv_bool(true);
        return 0;
    }
    case E_CONCAT: {
        jbuf_t buf = {0};
        for (uint32_t i = 0; i < n->nkids; i++) {
            if (s_eval(c, f, n->kids[i], &a)) return -1;
            if (jv_to_str(c, n->line, a, &buf)) return -1;
        }
        jstr_t *s = jb_str(c, &buf);
        if (!s) return -1;
        *out = jv_str(s);
        return 0;
    }
    case E_COND:
        if (s_eval(c, f, n->a, &a)) return -1;
        if (jv_truthy(a)) return s_eval(c, f, n->b, out);
        if (n->c) return s_eval(c, f, n->c, out);
        *out = jv_undef_msg(c, "the inline if-expression on line %d evaluated to false and no else section was defined.", n->line);
        return c->failed ? -1 : 0;
    case E_LIST: case E_TUPLE: {
        jlist_t *l = jl_new(c, n->nkids);
        if (!l) return -1;
        for (uint32_t i = 0; i < n->nkids; i++)
            if (s_eval(c, f, n->kids[i], &l->v[l->n++])) return -1;
        *out = jv_of(n->kind == E_LIST ? JV_LIST : JV_TUPLE, l);
        return 0;
    }
    case E_DICT: {
        jdict_t *d = jd_new(c, n->nkids);
        if (!d) return -1;
        for (uint32_t i = 0; i < n->nkids; i++) {
            if (s_eval(c, f, n->kids[i], &a) || s_eval(c, f, n->kids2[i], &b)) return -1;
            if (!jv_hashable(a)) return jerr(c, n->line, "unhashable type: '%s'", jv_type_name(a));
            if (jd_set(c, d, a, b)) return -1;
        }
        *out = jv_of(JV_DICT, d);
        return 0;
    }
    default:
        return jerr(c, n->line, "unexpected node in an expression");
    }
}

/* ------------------------------------------------------------------------------------------ */
/* statements */

static int s_set(jctx_t *c, jframe_t *f, const jnode_t *target, jv_t v)
{
    if (target->kind == E_NSREF) {
        jv_t ns;
        if (!s_fget(f, target->name, &ns) && !jglobal_lookup(target->name, &ns, c)) ns = jv_undef();
        if (ns.kind != JV_NS) return jerr(c, target->line, "cannot assign attribute on non-namespace object");
        jv_t key = jv_cstr(c, target->name2);
        if (c->failed) return -1;
        return jd_set(c, ns.u.d, key, v);
    }
    return s_assign(c, f, target, v);
}

static int s_print(jctx_t *c, int line, jv_t v, jbuf_t *out) { return jv_to_str(c, line, v, out); }

static int s_for(jctx_t *c, jframe_t *f, const jnode_t *n, jbuf_t *out)
{
    jv_t it;
    if (s_eval(c, f, n->b, &it)) return -1;
    jlist_t *items;
    if (jeval_iter_begin(c, n->line, it, &items)) return -1;
    if (n->c) {
        jlist_t *kept = jl_new(c, items->n);
        if (!kept) return -1;
        jframe_t *ff = s_frame(c, f);
        if (!ff) return -1;
        for (size_t i = 0; i < items->n; i++) {
            ff->n = 0;
            if (s_assign(c, ff, n->a, items->v[i])) return -1;
            jv_t keep;
            if (s_eval(c, ff, n->c, &keep)) return -1;
            if (jv_truthy(keep)) kept->v[kept->n++] = items->v[i];
            if (ff->captured && !(ff = s_frame(c, f))) return -1;
        }
        items = kept;
    }
    if (!items->n) {
        if (!n->nkids2) return 0;
        jframe_t *ef = s_frame(c, f);
        if (!ef || s_mark(c, ef, n->undefs2, n->nundefs2)) return -1;
        int r = s_exec(c, ef, n->kids2, n->nkids2, out);
        return r < 0 ? -1 : 0;
    }
    jloop_t *lp = ja_alloc(&c->a, sizeof *lp);
    if (!lp) return jerr_oom(c, n->line);
    memset(lp, 0, sizeof *lp);
    lp->items = items;
    jframe_t *lf = NULL;
    for (size_t i = 0; i < items->n; i++) {
        if (++c->iters > c->lim.max_iters)
            return jerr(c, n->line, "the render ran more than %" PRIu64 " loop iterations (the limit)", c->lim.max_iters);
        if (!lf || lf->captured) {
            if (!(lf = s_frame(c, f))) return -1;
        } else {
            lf->n = 0;
        }
        lp->i = i;
        if (s_mark(c, lf, n->undefs, n->nundefs) || s_fset(c, lf, "loop", jv_of(JV_LOOP, lp)) || s_assign(c, lf, n->a, items->v[i])) return -1;
        int r = s_exec(c, lf, n->kids, n->nkids, out);
        if (r < 0) return -1;
        if (r == FLOW_BREAK) {
            if (it.kind == JV_GEN && i + 1 < items->n) it.u.g->broken = true;
            break;
        }
    }
    return 0;
}

static int s_exec(jctx_t *c, jframe_t *f, jnode_t *const *body, uint32_t nb, jbuf_t *out)
{
    for (uint32_t k = 0; k < nb; k++) {
        const jnode_t *n = body[k];
        if (jeval_tick(c, n->line)) return -1;
        jv_t v;
        switch (n->kind) {
        case S_TEXT:
            if (jb_put(c, out, n->cval.u.s->p, n->cval.u.s->len)) return -1;
            break;
        case S_PRINT:
            if (s_eval(c, f, n->a, &v) || s_print(c, n->line, v, out)) return -1;
            break;
        case S_PRINTS:
            for (uint32_t i = 0; i < n->nkids; i++)
                if (s_eval(c, f, n->kids[i], &v) || s_print(c, n->line, v, out)) return -1;
            break;
        case S_IF: {
            if (s_eval(c, f, n->a, &v)) return -1;
            int r = jv_truthy(v) ? s_exec(c, f, n->kids, n->nkids, out) : s_exec(c, f, n->kids2, n->nkids2, out);
            if (r) return r;
            break;
        }
        case S_FOR:
            if (++c->rec > J_MAX_NEST_EVAL) return jerr(c, n->line, "blocks nested too deeply");
            if (s_for(c, f, n, out)) return -1;
            c->rec--;
            break;
        case S_SET:
            if (s_eval(c, f, n->b, &v) || s_set(c, f, n->a, v)) return -1;
            break;
        case S_SETBLOCK: case S_FILTERBLOCK: {
            jframe_t *bf = s_frame(c, f);
            jbuf_t b = {0};
            if (!bf || s_mark(c, bf, n->undefs, n->nundefs)) return -1;
            int r = s_exec(c, bf, n->kids, n->nkids, &b);
            if (r) return r;
            jstr_t *s = jb_str(c, &b);
            if (!s) return -1;
            v = jv_str(s);
            const jnode_t *chain = n->kind == S_SETBLOCK ? n->b : n->a;
            if (chain && s_eval_filter(c, bf, chain, &v, &v)) return -1;
            if (n->kind == S_SETBLOCK) {
                if (s_set(c, f, n->a, v)) return -1;
            } else if (s_print(c, n->line, v, out)) {
                return -1;
            }
            break;
        }
        case S_MACRO: {
            jmacro_t *m = ja_alloc(&c->a, sizeof *m);
            if (!m) return jerr_oom(c, n->line);
            m->def = n;
            m->closure = f;
            m->name = n->name;
            f->captured = true;
            if (s_fset(c, f, n->name, jv_of(JV_MACRO, m))) return -1;
            break;
        }
        case S_CALLBLOCK: {
            jmacro_t *m = ja_alloc(&c->a, sizeof *m);
            if (!m) return jerr_oom(c, n->line);
            m->def = n;
            m->closure = f;
            m->name = "caller";
            f->captured = true;
            jv_t caller = jv_of(JV_MACRO, m);
            if (s_eval_call(c, f, n->a, &caller, &v) || s_print(c, n->line, v, out)) return -1;
            break;
        }
        case S_WITH: {
            jframe_t *wf = s_frame(c, f);
            if (!wf || s_mark(c, wf, n->undefs, n->nundefs)) return -1;
            /* the values are evaluated in the outer scope, as jinja2 does */
            for (uint32_t i = 0; i < n->nkids2; i++)
                if (s_eval(c, f, n->kids2[i]->b, &v) || s_assign(c, wf, n->kids2[i]->a, v)) return -1;
            int r = s_exec(c, wf, n->kids, n->nkids, out);
            if (r) return r;
            break;
        }
        case S_GENERATION: {
            jframe_t *gf = s_frame(c, f);
            if (!gf || s_mark(c, gf, n->undefs, n->nundefs) || s_exec(c, gf, n->kids, n->nkids, out) < 0) return -1;
            break;
        }
        case S_BREAK:
            return FLOW_BREAK;
        case S_CONTINUE:
            return FLOW_CONTINUE;
        default:
            return jerr(c, n->line, "unexpected statement");
        }
    }
    return FLOW_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* public API */

jinja_ctx_t *jinja_ctx_new(const jinja_limits_t *lim)
{
    jctx_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (lim) c->lim = *lim;
    if (!c->lim.max_output) c->lim.max_output = 16u << 20;
    if (!c->lim.max_memory) c->lim.max_memory = (size_t)512 << 20;
    if (!c->lim.max_iters) c->lim.max_iters = 1000000;
    if (!c->lim.max_steps) c->lim.max_steps = 50000000;
    if (!c->lim.max_depth) c->lim.max_depth = 64;
    c->a.cap = c->lim.max_memory;
    c->vars = s_frame(c, NULL);
    if (!c->vars) {
        ja_release(&c->a);
        free(c);
        return NULL;
    }
    return c;
}

void jinja_ctx_free(jinja_ctx_t *c)
{
    if (!c) return;
    ja_release(&c->a);
    free(c);
}

static jinja_val_t *s_box(jctx_t *c, jv_t v)
{
    if (c->failed) return NULL;
    jv_t *p = ja_alloc(&c->a, sizeof *p);
    if (p) *p = v;
    return p;
}

jinja_val_t *jinja_none(jinja_ctx_t *c) { return s_box(c, jv_none()); }
jinja_val_t *jinja_bool(jinja_ctx_t *c, bool b) { return s_box(c, jv_bool(b)); }
jinja_val_t *jinja_int(jinja_ctx_t *c, int64_t i) { return s_box(c, jv_int(i)); }
jinja_val_t *jinja_float(jinja_ctx_t *c, double f) { return s_box(c, jv_float(f)); }

jinja_val_t *jinja_str(jinja_ctx_t *c, const char *s, size_t n)
{
    if (!ju8_valid(s, n)) return NULL;
    jstr_t *x = js_new(c, s, n);
    return x ? s_box(c, jv_str(x)) : NULL;
}

jinja_val_t *jinja_list(jinja_ctx_t *c)
{
    jlist_t *l = jl_new(c, 0);
    return l ? s_box(c, jv_of(JV_LIST, l)) : NULL;
}

jinja_val_t *jinja_dict(jinja_ctx_t *c)
{
    jdict_t *d = jd_new(c, 0);
    return d ? s_box(c, jv_of(JV_DICT, d)) : NULL;
}

int jinja_list_push(jinja_ctx_t *c, jinja_val_t *list, const jinja_val_t *item)
{
    if (!list || !item || list->kind != JV_LIST) return STRATA_EINVAL_INPUT;
    return jl_push(c, list->u.l, *item) ? STRATA_ENOMEM : 0;
}

int jinja_dict_set(jinja_ctx_t *c, jinja_val_t *dict, const char *key, size_t keylen, const jinja_val_t *val)
{
    if (!dict || !val || dict->kind != JV_DICT || !ju8_valid(key, keylen)) return STRATA_EINVAL_INPUT;
    jstr_t *k = js_new(c, key, keylen);
    if (!k) return STRATA_ENOMEM;
    return jd_set(c, dict->u.d, jv_str(k), *val) ? STRATA_ENOMEM : 0;
}

int jinja_set(jinja_ctx_t *c, const char *name, const jinja_val_t *val)
{
    if (!val) return STRATA_EINVAL_INPUT;
    jstr_t *k = js_new(c, name, strlen(name));
    if (!k) return STRATA_ENOMEM;
    return s_fset(c, c->vars, k->p, *val) ? STRATA_ENOMEM : 0;
}

int jinja_set_each(jinja_ctx_t *c, const jinja_val_t *dict)
{
    if (!dict || dict->kind != JV_DICT) return STRATA_EINVAL_INPUT;
    const jdict_t *d = dict->u.d;
    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i].kind != JV_STR || memchr(d->k[i].u.s->p, 0, d->k[i].u.s->len)) return STRATA_EINVAL_INPUT;
        if (s_fset(c, c->vars, d->k[i].u.s->p, d->v[i])) return STRATA_ENOMEM;
    }
    return 0;
}

bool jinja_is_list(const jinja_val_t *v) { return v && v->kind == JV_LIST; }

const jinja_val_t *jinja_dict_get(const jinja_val_t *v, const char *key)
{
    if (!v || v->kind != JV_DICT) return NULL;
    return jd_gets(v->u.d, key, strlen(key));
}

int jinja_render(const jinja_template_t *t, jinja_ctx_t *c, int64_t now_unix, char **out, size_t *len,
                 strata_errbuf_t *eb)
{
    *out = NULL;
    if (len) *len = 0;
    c->eb = eb;
    c->failed = false;
    c->depth = 0;
    c->rec = 0;
    c->steps = c->iters = 0;
    c->now_unix = now_unix;
    c->tmpl = t;
    if (eb) eb->msg[0] = 0;
    jframe_t *top = s_frame(c, c->vars);
    jbuf_t b = {0};
    if (top && s_mark(c, top, t->undefs, t->nundefs)) top = NULL;
    int r = top ? s_exec(c, top, t->body, t->nbody, &b) : -1;
    if (r < 0 || c->failed) {
        int code = STRATA_EINVAL_INPUT;
        if (eb && (strstr(eb->msg, "(the limit)") || strstr(eb->msg, "over the limit"))) code = STRATA_ETOOLARGE;
        else if (eb && strstr(eb->msg, "not supported")) code = STRATA_EUNSUPPORTED;
        if (eb && !eb->msg[0]) snprintf(eb->msg, sizeof eb->msg, "render failed");
        c->eb = NULL;
        return code;
    }
    char *s = malloc(b.n + 1);
    if (!s) {
        c->eb = NULL;
        return strata_seterr(eb, STRATA_ENOMEM, "out of memory");
    }
    if (b.n) memcpy(s, b.p, b.n);
    s[b.n] = 0;
    *out = s;
    if (len) *len = b.n;
    c->eb = NULL;
    return 0;
}
