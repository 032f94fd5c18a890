/* jinja.h - the subset of Jinja2 that chat templates use, rendered as transformers renders
 * them: jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
 * loopcontrols extension ({% break %}, {% continue %}), the {% generation %} block (its body
 * is rendered), transformers' `tojson` filter (json.dumps, not HTML-escaped) and the
 * `raise_exception` and `strftime_now` globals.
 *
 * Values follow Python's semantics, as the template sees them in jinja2: JSON objects are
 * dicts that keep their key order, integers stay integers (int64 here; an overflow is an
 * error), `{{ true }}` prints True, lists and dicts print as Python's repr, floats as
 * Python's repr, strings index and measure by code point. A missing attribute or key is
 * jinja2's default Undefined: it prints as "", is falsy, fails `is defined`, and raises when
 * an attribute of it is taken or it takes part in arithmetic.
 *
 * Statements: if/elif/else, for (tuple targets, `if` filter, else, the loop object, break,
 * continue), set (also `set ns.attr` and the block form with filters), macro (defaults,
 * varargs, kwargs, caller), call, filter blocks, with, print, raw, generation. Everything
 * else (extends, block, include, import, recursive loops, ...) and every filter, test or
 * method outside the supported lists is refused with an error naming it and its line: at
 * parse time where the name alone decides it, else when it is reached while rendering.
 * Nothing unsupported is rendered silently.
 *
 * Limits (jinja_limits_t) bound every render: output size, memory, loop iterations,
 * evaluation steps and call depth. Reaching one is an error naming it. range() refuses more
 * than 100000 items, as jinja2's sandbox does.
 *
 * Threads: a parsed template is immutable and may be rendered by many threads at once, each
 * with its own jinja_ctx_t. */
#ifndef STRATA_JINJA_H
#define STRATA_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strata.h"

typedef struct jinja_template jinja_template_t;
typedef struct jinja_ctx jinja_ctx_t;
/* A value built for a render; it lives in the jinja_ctx_t that made it. */
typedef struct jv jinja_val_t;

/* Bounds on one render. A field left 0 takes the default in brackets. */
typedef struct {
    size_t max_output;     /* bytes of output and of any one string [16 MiB] */
    size_t max_memory;     /* bytes the render may allocate in all [512 MiB] */
    uint64_t max_iters;    /* loop iterations in all [1000000] */
    uint64_t max_steps;    /* expressions and statements evaluated [50000000] */
    int max_depth;         /* nested macro calls, filters and comparisons [64] */
} jinja_limits_t;

/* Parse len bytes of template source (UTF-8). name is used in messages. Returns 0 with *out
 * set, or <0 with eb saying "line N: ..." (STRATA_EFORMAT: a syntax error jinja2 also
 * reports; STRATA_EUNSUPPORTED: a construct this engine does not render). */
int jinja_parse(const char *src, size_t len, jinja_template_t **out, strata_errbuf_t *eb);

/* Safe on NULL. */
void jinja_free(jinja_template_t *t);

/* A render context: its variables and the memory of every value made for it. lim may be
 * NULL. Returns NULL when out of memory. */
jinja_ctx_t *jinja_ctx_new(const jinja_limits_t *lim);
/* Safe on NULL; frees every value made in c. */
void jinja_ctx_free(jinja_ctx_t *c);

/* Values. Each returns NULL when out of memory or over max_memory; the other functions
 * take NULL as that failure and pass it on. Strings are copied and must be valid UTF-8. */
jinja_val_t *jinja_none(jinja_ctx_t *c);
jinja_val_t *jinja_bool(jinja_ctx_t *c, bool b);
jinja_val_t *jinja_int(jinja_ctx_t *c, int64_t i);
jinja_val_t *jinja_float(jinja_ctx_t *c, double f);
jinja_val_t *jinja_str(jinja_ctx_t *c, const char *s, size_t n);
jinja_val_t *jinja_list(jinja_ctx_t *c);
jinja_val_t *jinja_dict(jinja_ctx_t *c);
/* Append item to list. 0 or <0. */
int jinja_list_push(jinja_ctx_t *c, jinja_val_t *list, const jinja_val_t *item);
/* Set dict[key] = val (a new key goes last; an existing one keeps its place). 0 or <0. */
int jinja_dict_set(jinja_ctx_t *c, jinja_val_t *dict, const char *key, size_t keylen, const jinja_val_t *val);

/* Parse a JSON text into a value (objects to dicts in key order, arrays to lists, integers
 * to int, other numbers to float). 0, or <0 with eb naming `what`. */
int jinja_from_json(jinja_ctx_t *c, const char *json, size_t len, const char *what, jinja_val_t **out,
                    strata_errbuf_t *eb);

/* Set the template variable name (replacing an earlier one). 0 or <0. */
int jinja_set(jinja_ctx_t *c, const char *name, const jinja_val_t *val);
/* Set a variable for each key of dict (keys must be strings). 0 or <0. */
int jinja_set_each(jinja_ctx_t *c, const jinja_val_t *dict);
/* Whether v is a list; the value of key in dict v, or NULL (also when v is no dict). */
bool jinja_is_list(const jinja_val_t *v);
const jinja_val_t *jinja_dict_get(const jinja_val_t *v, const char *key);

/* Render t with c's variables. now_unix is the time strftime_now() formats, in local time
 * (as Python's datetime.now() does). On success *out is a malloc'd NUL-terminated string of
 * *len bytes. On error returns <0 with eb saying "line N: ..."; the template's
 * raise_exception(msg) gives msg. A context may be rendered more than once. */
int jinja_render(const jinja_template_t *t, jinja_ctx_t *c, int64_t now_unix, char **out, size_t *len,
                 strata_errbuf_t *eb);

#endif
