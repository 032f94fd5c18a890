/* jinja_json.c - JSON text to template values (jansson parses; objects keep their key
 * order, integers stay integers, other numbers become floats), as Python's json.loads
 * gives them to transformers. */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "common/jinja_int.h"

#define J_MAX_JSON_DEPTH 256

static jinja_val_t *s_conv(jinja_ctx_t *c, json_t *j, int depth, strata_errbuf_t *eb, const char *what)
{
    if (depth > J_MAX_JSON_DEPTH) {
        strata_seterr(eb, STRATA_ETOOLARGE, "%s: JSON nested more than %d deep", what, J_MAX_JSON_DEPTH);
        return NULL;
    }
    jinja_val_t *v = NULL;
    switch (json_typeof(j)) {
    case JSON_NULL: v = jinja_none(c); break;
    case JSON_TRUE: v = jinja_bool(c, true); break;
    case JSON_FALSE: v = jinja_bool(c, false); break;
    case JSON_INTEGER: v = jinja_int(c, (int64_t)json_integer_value(j)); break;
    case JSON_REAL: v = jinja_float(c, json_real_value(j)); break;
    case JSON_STRING: v = jinja_str(c, json_string_value(j), json_string_length(j)); break;
    case JSON_ARRAY: {
        v = jinja_list(c);
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x)
        {
            jinja_val_t *e = s_conv(c, x, depth + 1, eb, what);
            if (!e || jinja_list_push(c, v, e)) return NULL;
        }
        break;
    }
    case JSON_OBJECT: {
        v = jinja_dict(c);
        const char *k;
        size_t kl;
        json_t *x;
        json_object_keylen_foreach(j, k, kl, x)
        {
            jinja_val_t *e = s_conv(c, x, depth + 1, eb, what);
            if (!e || jinja_dict_set(c, v, k, kl, e)) return NULL;
        }
        break;
    }
    }
    if (!v && !eb->msg[0]) strata_seterr(eb, STRATA_ENOMEM, "%s: out of memory building the template values", what);
    return v;
}

int jinja_from_json(jinja_ctx_t *c, const char *json, size_t len, const char *what, jinja_val_t **out,
                    strata_errbuf_t *eb)
{
    *out = NULL;
    json_error_t je;
    json_t *j = json_loadb(json, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j) return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: bad JSON at line %d: %s", what, je.line, je.text);
    strata_errbuf_t local = {{0}};
    strata_errbuf_t *e = eb ? eb : &local;
    e->msg[0] = 0;
    *out = s_conv(c, j, 0, e, what);
    json_decref(j);
    if (*out) return 0;
    return strstr(e->msg, "nested") ? STRATA_ETOOLARGE : STRATA_ENOMEM;
}
