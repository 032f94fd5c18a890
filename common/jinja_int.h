/* jinja_int.h - internals shared by the files of the template engine (common/jinja*.c).
 *
 * Memory: a parsed template owns one arena (its syntax tree and constants); a render
 * context owns another (every value, frame and buffer a render makes). Nothing is freed
 * one by one: values are immutable once built (namespaces, loop objects, cyclers, joiners
 * and lazy iterators are the few objects that change), so they are shared freely, and
 * freeing the arena frees all. The arena's byte budget is max_memory.
 *
 * Values are passed by value (jv_t, 16 bytes); strings and containers point into an arena.
 */
#ifndef STRATA_JINJA_INT_H
#define STRATA_JINJA_INT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jinja.h"

/* ---- arena ---- */

typedef struct jchunk {
    struct jchunk *next;
    size_t used, cap;
    max_align_t data[];
} jchunk_t;

typedef struct {
    jchunk_t *head;
    size_t total; /* bytes obtained from malloc */
    size_t cap;   /* budget for total; 0 = none */
} jarena_t;

void *ja_alloc(jarena_t *a, size_t n); /* 16-byte aligned; NULL when over budget or out of memory */
void *ja_grow(jarena_t *a, void *p, size_t old_n, size_t new_n);
void ja_release(jarena_t *a);

/* ---- values ---- */

typedef enum {
    JV_UNDEF = 0, /* u.hint: NULL, or the message an error about it gives */
    JV_NONE,
    JV_BOOL,  /* u.i 0 or 1; an int in arithmetic and comparisons, as in Python */
    JV_INT,   /* u.i */
    JV_FLOAT, /* u.f */
    JV_STR,   /* u.s */
    JV_LIST,  /* u.l */
    JV_TUPLE, /* u.l */
    JV_DICT,  /* u.d */
    JV_NS,    /* u.d: namespace() attributes */
    JV_RANGE, /* u.r */
    JV_GEN,   /* u.g: a one-pass iterator (map, select, reverse, ...) */
    JV_LOOP,  /* u.lp */
    JV_MACRO, /* u.m */
    JV_FUNC,  /* u.fn: a global function or a bound method */
    JV_CYCLER,
    JV_JOINER,
} jv_kind_t;

enum {
    JVF_MARKUP = 1,      /* JV_STR: markupsafe.Markup (from |safe or |escape) */
    JVF_VIEW_ITEMS = 2,  /* JV_LIST: dict.items() */
    JVF_VIEW_KEYS = 4,   /* JV_LIST: dict.keys() */
    JVF_VIEW_VALUES = 8, /* JV_LIST: dict.values() */
    JVF_UNSAFE = 16,     /* JV_UNDEF: an attribute the sandbox refuses; calling it is an error */
};
#define JVF_VIEW (JVF_VIEW_ITEMS | JVF_VIEW_KEYS | JVF_VIEW_VALUES)

typedef struct jstr {
    size_t len; /* bytes */
    size_t ncp; /* code points */
    char *p;    /* NUL-terminated UTF-8 */
} jstr_t;

typedef struct jlist {
    size_t n, cap;
    struct jv *v;
} jlist_t;

typedef struct jdict {
    size_t n, cap;
    struct jv *k; /* keys, in insertion order */
    struct jv *v;
} jdict_t;

typedef struct {
    int64_t start, stop, step, len;
} jrange_t;

struct jinja_ctx;
struct jgen;
typedef int (*jgen_fn)(struct jinja_ctx *c, struct jgen *g);

typedef struct jgen {
    jlist_t *items; /* NULL until first consumed */
    size_t pos;     /* items already taken */
    bool broken;    /* a for loop left it part-way: its position is unknown */
    const char *what; /* "generator", "list_reverseiterator", ... */
    jgen_fn fill;   /* computes items from the fields below */
    struct jv *src;
    struct jv *args;
    size_t nargs;
    const char **kwn;
    struct jv *kwv;
    size_t nkw;
    int line;
    int mode;
} jgen_t;

typedef struct jframe {
    struct jframe *parent;
    size_t n, cap;
    const char **names;
    struct jv *vals;
    bool captured; /* a macro closes over it: do not reuse it */
} jframe_t;

typedef struct jloop {
    jlist_t *items;
    size_t i; /* current index0 */
    int depth0;
    struct jv *last_changed; /* loop.changed() state; NULL before the first call */
} jloop_t;

struct jnode;
typedef struct jmacro {
    const struct jnode *def; /* S_MACRO or S_CALLBLOCK */
    jframe_t *closure;
    const char *name;
} jmacro_t;

typedef struct jfunc {
    int id;         /* JF_* */
    const char *name;
    struct jv *self; /* bound object, or NULL */
} jfunc_t;

typedef struct {
    jlist_t *items;
    size_t pos;
} jcycler_t;

typedef struct {
    jstr_t *sep;
    bool used;
} jjoiner_t;

typedef struct jv {
    uint8_t kind;
    uint8_t flags;
    union {
        int64_t i;
        double f;
        jstr_t *s;
        jlist_t *l;
        jdict_t *d;
        jrange_t *r;
        jgen_t *g;
        jloop_t *lp;
        jmacro_t *m;
        jfunc_t *fn;
        jcycler_t *cy;
        jjoiner_t *jo;
        jstr_t *hint;
        void *p;
    } u;
} jv_t;

static inline jv_t jv_undef(void) { jv_t v = {0}; return v; }
static inline jv_t jv_none(void) { jv_t v = {0}; v.kind = JV_NONE; return v; }
static inline jv_t jv_bool(bool b) { jv_t v = {0}; v.kind = JV_BOOL; v.u.i = b; return v; }
static inline jv_t jv_int(int64_t i) { jv_t v = {0}; v.kind = JV_INT; v.u.i = i; return v; }
static inline jv_t jv_float(double f) { jv_t v = {0}; v.kind = JV_FLOAT; v.u.f = f; return v; }
static inline jv_t jv_of(uint8_t kind, void *p) { jv_t v = {0}; v.kind = kind; v.u.p = p; return v; }
static inline bool jv_is_num(jv_t v) { return v.kind == JV_INT || v.kind == JV_BOOL || v.kind == JV_FLOAT; }
static inline bool jv_is_intlike(jv_t v) { return v.kind == JV_INT || v.kind == JV_BOOL; }
static inline bool jv_is_seq(jv_t v) { return v.kind == JV_LIST || v.kind == JV_TUPLE; }

/* ---- render context ---- */

typedef struct jbuf {
    char *p;
    size_t n, cap;
} jbuf_t;

typedef struct jinja_ctx {
    jarena_t a;
    jinja_limits_t lim;
    jframe_t *vars; /* the template's variables; parent of the top-level frame */
    /* per render */
    strata_errbuf_t *eb;
    bool failed;
    int depth; /* nested calls, against lim.max_depth */
    int rec;   /* C recursion of the evaluator */
    uint64_t steps, iters;
    int64_t now_unix;
    const struct jinja_template *tmpl;
} jctx_t;

/* Record an error "line N: msg" (the first one wins) and return -1. line 0 leaves it out. */
int jerr(jctx_t *c, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int jerr_oom(jctx_t *c, int line);

/* Strings. */
jstr_t *js_new(jctx_t *c, const char *p, size_t n);   /* copies; NULL: error already set */
jstr_t *js_take(jctx_t *c, char *p, size_t n);        /* p already in c's arena, NUL at p[n] */
jv_t jv_str(jstr_t *s);
jv_t jv_cstr(jctx_t *c, const char *s);                 /* JV_UNDEF on failure (error set) */
size_t ju8_count(const char *p, size_t n);              /* code points in valid UTF-8 */
bool ju8_valid(const char *p, size_t n);
uint32_t ju8_next(const char *p, size_t n, size_t *i);  /* decode at *i, advance */
size_t ju8_put(char *out, uint32_t cp);                 /* encode, 1..4 bytes */
size_t ju8_offset(const jstr_t *s, int64_t cpi);        /* byte offset of code point cpi */
bool jpy_isspace(uint32_t cp);                          /* Python's str.isspace() for one char */
bool jpy_is_linebreak(uint32_t cp);                     /* str.splitlines() boundaries */

/* Buffers (in the arena). */
int jb_put(jctx_t *c, jbuf_t *b, const char *p, size_t n);
int jb_putc(jctx_t *c, jbuf_t *b, char ch);
int jb_printf(jctx_t *c, jbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
jstr_t *jb_str(jctx_t *c, jbuf_t *b); /* the buffer as a string (no copy) */
/* s HTML-escaped as jinja2's escape (markupsafe) does it: & < > " ' */
int jv_markup_escape(jctx_t *c, const jstr_t *s, jbuf_t *b);

/* Containers. */
jlist_t *jl_new(jctx_t *c, size_t cap);
int jl_push(jctx_t *c, jlist_t *l, jv_t v);
jdict_t *jd_new(jctx_t *c, size_t cap);
int jd_set(jctx_t *c, jdict_t *d, jv_t k, jv_t v);       /* Python dict assignment */
jv_t *jd_get(const jdict_t *d, jv_t k);                  /* NULL when missing */
jv_t *jd_gets(const jdict_t *d, const char *k, size_t n);
bool jv_hashable(jv_t v);

/* Python semantics. */
bool jv_truthy(jv_t v);
const char *jv_type_name(jv_t v);                 /* Python's type(v).__name__ */
int jv_eq(jctx_t *c, jv_t a, jv_t b, bool *out);  /* == (errors only on depth) */
int jv_cmp(jctx_t *c, int line, jv_t a, jv_t b, int *out); /* <0 ==0 >0; TypeError as jinja2 */
int jv_to_str(jctx_t *c, int line, jv_t v, jbuf_t *b);     /* str(v) */
int jv_repr(jctx_t *c, int line, jv_t v, jbuf_t *b);       /* repr(v) */
jstr_t *jv_strv(jctx_t *c, int line, jv_t v);               /* str(v) as a string */
int jfmt_float(double f, char *out, size_t cap);           /* Python's repr(float) */
int jv_materialize(jctx_t *c, int line, jv_t v, jlist_t **out); /* list(v); JV_UNDEF gives [] */
int jv_len(jctx_t *c, int line, jv_t v, int64_t *out);     /* len(v) */
int jv_contains(jctx_t *c, int line, jv_t seq, jv_t item, bool *out); /* item in seq */
jv_t jv_undef_msg(jctx_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int jv_undef_error(jctx_t *c, int line, jv_t u);           /* raise UndefinedError for u */

/* json.dumps as transformers' tojson calls it. indent: NULL, or JV_INT/JV_STR. */
typedef struct {
    bool ensure_ascii;
    bool sort_keys;
    bool has_indent;
    jstr_t *indent; /* the indent string when has_indent */
    jstr_t *item_sep, *key_sep;
} jjson_opts_t;
int jv_tojson(jctx_t *c, int line, jv_t v, const jjson_opts_t *o, jbuf_t *b);

/* Case mapping and classification as Python's str methods; <0 with an error for the few
 * characters whose Python mapping is more than one character. */
int jpy_case(jctx_t *c, int line, const jstr_t *s, int mode, jbuf_t *b);
enum { JCASE_UPPER, JCASE_LOWER, JCASE_TITLE, JCASE_CAPITALIZE, JCASE_SWAPCASE };
int jpy_cp_category(uint32_t cp); /* utf8proc category */
bool jpy_isalnum_cp(uint32_t cp);

/* ---- syntax tree ---- */

typedef enum {
    /* statements */
    S_TEXT = 1, S_PRINT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK,
    S_WITH, S_BREAK, S_CONTINUE, S_GENERATION, S_PRINTS,
    /* expressions */
    E_CONST, E_NAME, E_GETATTR, E_GETITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NOT, E_NEG,
    E_POS, E_BIN, E_AND, E_OR, E_CMP, E_CONCAT, E_COND, E_LIST, E_TUPLE, E_DICT, E_NSREF,
    E_PARAM,
} jnode_kind_t;

enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW };
enum { CMP_EQ = 1, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

struct jfilter_def;

typedef struct jnode {
    uint8_t kind;
    uint8_t op;
    uint16_t flags;     /* S_MACRO: JM_* */
    int line;
    const char *name;   /* E_NAME, E_GETATTR, E_FILTER, E_TEST, S_MACRO, E_NSREF, E_PARAM */
    const char *name2;  /* E_NSREF: the attribute */
    jv_t cval;          /* E_CONST, S_TEXT */
    struct jnode *a, *b, *c;
    struct jnode **kids;  /* args, items, keys, body, operands */
    uint32_t nkids;
    struct jnode **kids2; /* else body, keyword values, dict values, macro params */
    uint32_t nkids2;
    const char **kwnames; /* keyword names (nkids2 of them) */
    uint8_t *ops;         /* E_CMP: one per operand */
    const struct jfilter_def *def; /* E_FILTER, E_TEST */
    /* Frame nodes (S_FOR body, S_MACRO, S_CALLBLOCK, S_SETBLOCK, S_FILTERBLOCK, S_WITH,
     * S_GENERATION): the names jinja2 starts that frame with as `missing` (assigned in it
     * before any read), so a read before the assignment, also from a nested frame, is
     * undefined rather than the outer value. undefs2: the else body of S_FOR. */
    const char **undefs;
    uint32_t nundefs;
    const char **undefs2;
    uint32_t nundefs2;
} jnode_t;

enum { JIF_ELIF = 1 }; /* S_IF made from an {% elif %} */

enum { JM_VARARGS = 1, JM_KWARGS = 2, JM_CALLER = 4 };

struct jinja_template {
    jarena_t a;
    jnode_t **body;
    uint32_t nbody;
    const char **undefs; /* as jnode_t.undefs, for the top-level frame */
    uint32_t nundefs;
};

/* Filters and tests: bound arguments in declaration order (JV_UNDEF with present[i] false
 * when not given). A filter with `vararg` takes extra positionals and keywords as given. */
#define JF_MAXP 6
typedef struct {
    jv_t p[JF_MAXP];
    bool present[JF_MAXP];
    jv_t *extra;        /* vararg filters: positionals after the declared ones */
    size_t nextra;
    const char **kwn;   /* vararg filters: all keywords */
    jv_t *kwv;
    size_t nkw;
} jargs_t;

typedef int (*jfilter_fn)(jctx_t *c, int line, jv_t v, jargs_t *a, jv_t *out);

typedef struct jfilter_def {
    const char *name;
    jfilter_fn fn;
    const char *params[JF_MAXP]; /* names after the value; NULL-terminated */
    bool vararg;
} jfilter_def_t;

const jfilter_def_t *jfilter_find(const char *name);
const jfilter_def_t *jtest_find(const char *name);
bool jfilter_known_unsupported(const char *name); /* a jinja2 filter this engine refuses */
bool jtest_known_unsupported(const char *name);

/* ---- evaluator services used by filters and methods ---- */
int jeval_call_value(jctx_t *c, int line, jv_t fn, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv,
                     size_t nkw, jv_t *out);
int jeval_getattr(jctx_t *c, int line, jv_t obj, const char *name, jv_t *out);
int jeval_getitem(jctx_t *c, int line, jv_t obj, jv_t key, jv_t *out);
int jeval_iter_begin(jctx_t *c, int line, jv_t v, jlist_t **out); /* items to iterate; consumes generators */
int jeval_apply_filter(jctx_t *c, int line, const jfilter_def_t *d, jv_t v, jv_t *args, size_t nargs,
                       const char **kwn, jv_t *kwv, size_t nkw, jv_t *out);
int jeval_apply_test(jctx_t *c, int line, const jfilter_def_t *d, jv_t v, jv_t *args, size_t nargs,
                     const char **kwn, jv_t *kwv, size_t nkw, bool *out);
int jeval_binop(jctx_t *c, int line, int op, jv_t a, jv_t b, jv_t *out); /* Python's a op b */
int jeval_tick(jctx_t *c, int line); /* one evaluation step against max_steps */
int jeval_enter(jctx_t *c, int line); /* depth + 1 against max_depth */
static inline void jeval_leave(jctx_t *c) { c->depth--; }

/* Methods of str, list, tuple and dict; globals. */
enum {
    JF_NONE = 0,
    /* globals */
    JF_RANGE, JF_DICT, JF_NAMESPACE, JF_RAISE, JF_STRFTIME, JF_CYCLER, JF_JOINER, JF_LOOP_CYCLE,
    JF_LOOP_CHANGED, JF_CYCLER_NEXT, JF_CYCLER_RESET,
    /* methods: the id of the first */
    JF_METHOD_BASE = 100,
};
/* The attribute `name` of a str/list/tuple/dict/number value as Python's getattr sees it:
 * 1 with *out set (a bound method, or an unsafe-attribute Undefined), 0 when Python has no
 * such attribute, <0 on error (an attribute Python has that this engine does not support). */
int jmethod_lookup(jctx_t *c, int line, jv_t obj, const char *name, jv_t *out);
int jmethod_call(jctx_t *c, int line, jfunc_t *fn, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv,
                 size_t nkw, jv_t *out);
int jglobal_lookup(const char *name, jv_t *out, jctx_t *c); /* 1 found */
int jglobal_call(jctx_t *c, int line, jfunc_t *fn, jv_t *args, size_t nargs, const char **kwn, jv_t *kwv,
                 size_t nkw, jv_t *out);

/* Python str methods shared with filters. */
int jstr_strip(jctx_t *c, const jstr_t *s, const jstr_t *chars, int which, jv_t *out); /* which: 1 left 2 right 3 both */
int jstr_replace(jctx_t *c, int line, const jstr_t *s, const jstr_t *old, const jstr_t *new_, int64_t count,
                 jv_t *out);
int jstr_splitlines(jctx_t *c, const jstr_t *s, bool keepends, jlist_t **out);

#endif
