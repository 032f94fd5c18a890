/* tok_load.c - tokenizer.json -> tok_t. Every field is checked; an error names the file and
 * the JSON path of the field ("model.merges[12]", "pre_tokenizer.pretokenizers[0].type"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/tok_int.h"

#define PATHMAX 256

static int s_fail(const tok_t *tok, strata_errbuf_t *eb, int code, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int s_fail(const tok_t *tok, strata_errbuf_t *eb, int code, const char *path, const char *fmt, ...)
{
    char detail[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return strata_seterr(eb, code, "%s: %s: %s", tok->name, path, detail);
}

/* path + ".key" / path + "[i]", cut at PATHMAX */
static void s_sub(char *out, const char *path, const char *key)
{
    if (snprintf(out, PATHMAX, "%s.%s", path, key) >= PATHMAX) out[PATHMAX - 1] = 0;
}
static void s_idx(char *out, const char *path, size_t i)
{
    if (snprintf(out, PATHMAX, "%s[%zu]", path, i) >= PATHMAX) out[PATHMAX - 1] = 0;
}

/* ---------------------------------------------------------------- field readers */

static int s_bool(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *key, const char *path, bool dflt,
                  bool *out)
{
    json_t *v = json_object_get(o, key);
    *out = dflt;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) {
        char p[PATHMAX];
        s_sub(p, path, key);
        return s_fail(tok, eb, STRATA_EFORMAT, p, "expected true or false");
    }
    *out = json_is_true(v);
    return 0;
}

/* A string field; *out NULL when absent or null and !required. */
static int s_str(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *key, const char *path, bool required,
                 const char **out, size_t *n)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (n) *n = 0;
    char p[PATHMAX];
    s_sub(p, path, key);
    if (!v || json_is_null(v)) {
        if (required) return s_fail(tok, eb, STRATA_EFORMAT, p, "missing");
        return 0;
    }
    if (!json_is_string(v)) return s_fail(tok, eb, STRATA_EFORMAT, p, "expected a string");
    *out = json_string_value(v);
    if (n) *n = json_string_length(v);
    return 0;
}

static int s_uint(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *key, const char *path, bool required,
                  size_t dflt, size_t max, size_t *out)
{
    json_t *v = json_object_get(o, key);
    char p[PATHMAX];
    s_sub(p, path, key);
    *out = dflt;
    if (!v || json_is_null(v)) return required ? s_fail(tok, eb, STRATA_EFORMAT, p, "missing") : 0;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return s_fail(tok, eb, STRATA_EFORMAT, p, "expected an integer in [0, %zu]", max);
    *out = (size_t)json_integer_value(v);
    return 0;
}

/* The object's "type" string (or NULL when there is none). */
static int s_type(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, const char **type)
{
    *type = NULL;
    if (!json_is_object(o)) return s_fail(tok, eb, STRATA_EFORMAT, path, "expected an object");
    return s_str(tok, eb, o, "type", path, false, type, NULL);
}

static int s_behavior(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, int dflt, int *out)
{
    const char *s;
    char p[PATHMAX];
    int rc = s_str(tok, eb, o, "behavior", path, false, &s, NULL);
    if (rc) return rc;
    *out = dflt;
    if (!s) return 0;
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    s_sub(p, path, "behavior");
    return s_fail(tok, eb, STRATA_EFORMAT, p, "unknown behavior '%s'", s);
}

static int s_scheme(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, int *out)
{
    const char *s;
    int rc = s_str(tok, eb, o, "prepend_scheme", path, false, &s, NULL);
    if (rc) return rc;
    bool aps;
    if ((rc = s_bool(tok, eb, o, "add_prefix_space", path, true, &aps))) return rc;
    *out = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
    if (!s) return 0;
    if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
    else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
    else {
        char p[PATHMAX];
        s_sub(p, path, "prepend_scheme");
        return s_fail(tok, eb, STRATA_EFORMAT, p, "unknown prepend_scheme '%s'", s);
    }
    return 0;
}

/* A one-char string field (Metaspace replacement, Strip content, CharDelimiterSplit). */
static int s_char(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *key, const char *path, uint32_t *cp)
{
    const char *s;
    size_t n;
    int rc = s_str(tok, eb, o, key, path, true, &s, &n);
    if (rc) return rc;
    int l = 0;
    if (n) *cp = tk_utf8_dec((const unsigned char *)s, n, &l);
    if (!n || (size_t)l != n) {
        char p[PATHMAX];
        s_sub(p, path, key);
        return s_fail(tok, eb, STRATA_EFORMAT, p, "expected exactly one character");
    }
    return 0;
}

/* {"String": s} or {"Regex": r}. */
static int s_pattern(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, tk_re_t *re, bool *literal,
                     char **lit, size_t *litn)
{
    char p[PATHMAX], q[PATHMAX];
    s_sub(p, path, "pattern");
    json_t *v = json_object_get(o, "pattern");
    if (!v) return s_fail(tok, eb, STRATA_EFORMAT, p, "missing");
    json_t *str = json_object_get(v, "String"), *rx = json_object_get(v, "Regex");
    if (!json_is_object(v) || (!str == !rx))
        return s_fail(tok, eb, STRATA_EFORMAT, p, "expected {\"String\": ...} or {\"Regex\": ...}");
    json_t *s = str ? str : rx;
    s_sub(q, p, str ? "String" : "Regex");
    if (!json_is_string(s)) return s_fail(tok, eb, STRATA_EFORMAT, q, "expected a string");
    char msg[300] = "";
    int rc = tk_re_compile(re, json_string_value(s), json_string_length(s), str != NULL, msg, sizeof msg);
    if (rc == STRATA_ENOMEM) return rc;
    if (rc) return s_fail(tok, eb, STRATA_EFORMAT, q, "bad regex: %s", msg);
    if (literal) *literal = str != NULL;
    if (lit) {
        *litn = json_string_length(s);
        *lit = malloc(*litn + 1);
        if (!*lit) return STRATA_ENOMEM;
        memcpy(*lit, json_string_value(s), *litn + 1);
    }
    return 0;
}

static char *s_dup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

static int s_unknown(const tok_t *tok, strata_errbuf_t *eb, const char *path, const char *type, const char *what)
{
    char p[PATHMAX];
    s_sub(p, path, "type");
    if (!type) return s_fail(tok, eb, STRATA_EFORMAT, p, "missing");
    return s_fail(tok, eb, STRATA_EUNSUPPORTED, p, "unknown %s type '%s'", what, type);
}

/* ---------------------------------------------------------------- normalizers */

static int s_norm_push(tok_t *tok, tk_norm_t **out)
{
    tk_norm_t *v = realloc(tok->norm, (tok->nnorm + 1) * sizeof *v);
    if (!v) return STRATA_ENOMEM;
    tok->norm = v;
    *out = &v[tok->nnorm++];
    memset(*out, 0, sizeof **out);
    return 0;
}

static int s_parse_norm(tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, int depth)
{
    const char *type;
    int rc = s_type(tok, eb, o, path, &type);
    if (rc) return rc;
    if (depth > 16) return s_fail(tok, eb, STRATA_EFORMAT, path, "nested too deep");
    if (type && !strcmp(type, "Sequence")) {
        char p[PATHMAX], q[PATHMAX];
        s_sub(p, path, "normalizers");
        json_t *a = json_object_get(o, "normalizers");
        if (!json_is_array(a)) return s_fail(tok, eb, STRATA_EFORMAT, p, "expected an array");
        for (size_t i = 0; i < json_array_size(a); i++) {
            s_idx(q, p, i);
            if ((rc = s_parse_norm(tok, eb, json_array_get(a, i), q, depth + 1))) return rc;
        }
        return 0;
    }
    static const struct { const char *name; tk_norm_kind_t kind; } simple[] = {
        {"NFC", NORM_NFC}, {"NFD", NORM_NFD}, {"NFKC", NORM_NFKC}, {"NFKD", NORM_NFKD},
        {"Lowercase", NORM_LOWERCASE}, {"StripAccents", NORM_STRIP_ACCENTS}, {"ByteLevel", NORM_BYTELEVEL},
    };
    tk_norm_t *nm;
    for (size_t i = 0; type && i < sizeof simple / sizeof simple[0]; i++)
        if (!strcmp(type, simple[i].name)) {
            if ((rc = s_norm_push(tok, &nm))) return rc;
            nm->kind = simple[i].kind;
            return 0;
        }
    if (type && !strcmp(type, "Strip")) {
        if ((rc = s_norm_push(tok, &nm))) return rc;
        nm->kind = NORM_STRIP;
        if ((rc = s_bool(tok, eb, o, "strip_left", path, true, &nm->left))) return rc;
        return s_bool(tok, eb, o, "strip_right", path, true, &nm->right);
    }
    if (type && !strcmp(type, "Replace")) {
        const char *c;
        size_t cn;
        if ((rc = s_norm_push(tok, &nm))) return rc;
        nm->kind = NORM_REPLACE;
        if ((rc = s_pattern(tok, eb, o, path, &nm->re, NULL, NULL, NULL))) return rc;
        if ((rc = s_str(tok, eb, o, "content", path, true, &c, &cn))) return rc;
        if (!(nm->str = s_dup(c, cn))) return STRATA_ENOMEM;
        nm->str_n = cn;
        return 0;
    }
    if (type && !strcmp(type, "Prepend")) {
        const char *c;
        size_t cn;
        if ((rc = s_norm_push(tok, &nm))) return rc;
        nm->kind = NORM_PREPEND;
        if ((rc = s_str(tok, eb, o, "prepend", path, true, &c, &cn))) return rc;
        if (!(nm->str = s_dup(c, cn))) return STRATA_ENOMEM;
        nm->str_n = cn;
        return 0;
    }
    if (type && !strcmp(type, "BertNormalizer")) {
        if ((rc = s_norm_push(tok, &nm))) return rc;
        nm->kind = NORM_BERT;
        if ((rc = s_bool(tok, eb, o, "clean_text", path, true, &nm->clean_text))) return rc;
        if ((rc = s_bool(tok, eb, o, "handle_chinese_chars", path, true, &nm->chinese))) return rc;
        if ((rc = s_bool(tok, eb, o, "lowercase", path, true, &nm->lowercase))) return rc;
        return s_bool(tok, eb, o, "strip_accents", path, nm->lowercase, &nm->strip_accents);
    }
    return s_unknown(tok, eb, path, type, "normalizer");
}

/* ---------------------------------------------------------------- pre-tokenizers */

static int s_pt_push(tok_t *tok, tk_pt_t **out)
{
    tk_pt_t *v = realloc(tok->pt, (tok->npt + 1) * sizeof *v);
    if (!v) return STRATA_ENOMEM;
    tok->pt = v;
    *out = &v[tok->npt++];
    memset(*out, 0, sizeof **out);
    return 0;
}

static int s_parse_pt(tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, int depth)
{
    const char *type;
    int rc = s_type(tok, eb, o, path, &type);
    if (rc) return rc;
    if (depth > 16) return s_fail(tok, eb, STRATA_EFORMAT, path, "nested too deep");
    tk_pt_t *pt;
    if (type && !strcmp(type, "Sequence")) {
        char p[PATHMAX], q[PATHMAX];
        s_sub(p, path, "pretokenizers");
        json_t *a = json_object_get(o, "pretokenizers");
        if (!json_is_array(a)) return s_fail(tok, eb, STRATA_EFORMAT, p, "expected an array");
        for (size_t i = 0; i < json_array_size(a); i++) {
            s_idx(q, p, i);
            if ((rc = s_parse_pt(tok, eb, json_array_get(a, i), q, depth + 1))) return rc;
        }
        return 0;
    }
    if (type && !strcmp(type, "ByteLevel")) {
        if ((rc = s_pt_push(tok, &pt))) return rc;
        pt->kind = PT_BYTELEVEL;
        if ((rc = s_bool(tok, eb, o, "add_prefix_space", path, true, &pt->add_prefix_space))) return rc;
        if ((rc = s_bool(tok, eb, o, "use_regex", path, true, &pt->use_regex))) return rc;
        char msg[64];
        if (pt->use_regex && !tok->re_bytelevel.code &&
            (rc = tk_re_compile(&tok->re_bytelevel, tk_re_gpt2, strlen(tk_re_gpt2), false, msg, sizeof msg)))
            return rc;
        bool trim;
        return s_bool(tok, eb, o, "trim_offsets", path, true, &trim);
    }
    if (type && !strcmp(type, "Split")) {
        if ((rc = s_pt_push(tok, &pt))) return rc;
        pt->kind = PT_SPLIT;
        if ((rc = s_pattern(tok, eb, o, path, &pt->re, NULL, NULL, NULL))) return rc;
        if ((rc = s_behavior(tok, eb, o, path, SPLIT_ISOLATED, &pt->behavior))) return rc;
        return s_bool(tok, eb, o, "invert", path, false, &pt->invert);
    }
    if (type && !strcmp(type, "Metaspace")) {
        if ((rc = s_pt_push(tok, &pt))) return rc;
        pt->kind = PT_METASPACE;
        if ((rc = s_char(tok, eb, o, "replacement", path, &pt->repl_cp))) return rc;
        pt->repl_n = tk_utf8_enc(pt->repl_cp, pt->repl);
        if ((rc = s_scheme(tok, eb, o, path, &pt->prepend_scheme))) return rc;
        if (pt->prepend_scheme == PREPEND_FIRST) tok->track_align = true;
        return s_bool(tok, eb, o, "split", path, true, &pt->split);
    }
    if (type && !strcmp(type, "Digits")) {
        if ((rc = s_pt_push(tok, &pt))) return rc;
        pt->kind = PT_DIGITS;
        return s_bool(tok, eb, o, "individual_digits", path, false, &pt->individual_digits);
    }
    if (type && !strcmp(type, "Punctuation")) {
        if ((rc = s_pt_push(tok, &pt))) return rc;
        pt->kind = PT_PUNCTUATION;
        return s_behavior(tok, eb, o, path, SPLIT_ISOLATED, &pt->behavior);
    }
    if (type && !strcmp(type, "CharDelimiterSplit")) {
        if ((rc = s_pt_push(tok, &pt))) return rc;
        pt->kind = PT_CHAR_DELIMITER;
        return s_char(tok, eb, o, "delimiter", path, &pt->repl_cp);
    }
    static const struct { const char *name; tk_pt_kind_t kind; } simple[] = {
        {"Whitespace", PT_WHITESPACE}, {"WhitespaceSplit", PT_WHITESPACE_SPLIT}, {"BertPreTokenizer", PT_BERT},
    };
    for (size_t i = 0; type && i < sizeof simple / sizeof simple[0]; i++)
        if (!strcmp(type, simple[i].name)) {
            if ((rc = s_pt_push(tok, &pt))) return rc;
            pt->kind = simple[i].kind;
            return 0;
        }
    return s_unknown(tok, eb, path, type, "pre_tokenizer");
}

/* ---------------------------------------------------------------- decoders */

static int s_dec_push(tok_t *tok, tk_dec_t **out)
{
    tk_dec_t *v = realloc(tok->dec, (tok->ndec + 1) * sizeof *v);
    if (!v) return STRATA_ENOMEM;
    tok->dec = v;
    *out = &v[tok->ndec++];
    memset(*out, 0, sizeof **out);
    return 0;
}

static int s_parse_dec(tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, int depth)
{
    const char *type;
    int rc = s_type(tok, eb, o, path, &type);
    if (rc) return rc;
    if (depth > 16) return s_fail(tok, eb, STRATA_EFORMAT, path, "nested too deep");
    tk_dec_t *d;
    const char *c;
    size_t cn;
    if (type && !strcmp(type, "Sequence")) {
        char p[PATHMAX], q[PATHMAX];
        s_sub(p, path, "decoders");
        json_t *a = json_object_get(o, "decoders");
        if (!json_is_array(a)) return s_fail(tok, eb, STRATA_EFORMAT, p, "expected an array");
        for (size_t i = 0; i < json_array_size(a); i++) {
            s_idx(q, p, i);
            if ((rc = s_parse_dec(tok, eb, json_array_get(a, i), q, depth + 1))) return rc;
        }
        return 0;
    }
    if (type && (!strcmp(type, "ByteLevel") || !strcmp(type, "ByteFallback") || !strcmp(type, "Fuse"))) {
        if ((rc = s_dec_push(tok, &d))) return rc;
        d->kind = type[4] == 'L' ? DEC_BYTELEVEL : type[4] == 'F' ? DEC_BYTE_FALLBACK : DEC_FUSE;
        return 0;
    }
    if (type && !strcmp(type, "Metaspace")) {
        if ((rc = s_dec_push(tok, &d))) return rc;
        d->kind = DEC_METASPACE;
        if ((rc = s_char(tok, eb, o, "replacement", path, &d->cp))) return rc;
        return s_scheme(tok, eb, o, path, &d->prepend_scheme);
    }
    if (type && !strcmp(type, "Replace")) {
        if ((rc = s_dec_push(tok, &d))) return rc;
        d->kind = DEC_REPLACE;
        if ((rc = s_pattern(tok, eb, o, path, &d->re, &d->literal, &d->pat, &d->pat_n))) return rc;
        if ((rc = s_str(tok, eb, o, "content", path, true, &c, &cn))) return rc;
        if (!(d->str = s_dup(c, cn))) return STRATA_ENOMEM;
        d->str_n = cn;
        return 0;
    }
    if (type && !strcmp(type, "Strip")) {
        if ((rc = s_dec_push(tok, &d))) return rc;
        d->kind = DEC_STRIP;
        if ((rc = s_char(tok, eb, o, "content", path, &d->cp))) return rc;
        if ((rc = s_uint(tok, eb, o, "start", path, false, 0, 1u << 30, &d->start))) return rc;
        return s_uint(tok, eb, o, "stop", path, false, 0, 1u << 30, &d->stop);
    }
    if (type && (!strcmp(type, "BPEDecoder") || !strcmp(type, "WordPiece"))) {
        bool bpe = type[0] == 'B';
        if ((rc = s_dec_push(tok, &d))) return rc;
        d->kind = bpe ? DEC_BPE : DEC_WORDPIECE;
        if ((rc = s_str(tok, eb, o, bpe ? "suffix" : "prefix", path, false, &c, &cn))) return rc;
        if (!c) {
            c = bpe ? "</w>" : "##";
            cn = strlen(c);
        }
        if (!(d->str = s_dup(c, cn))) return STRATA_ENOMEM;
        d->str_n = cn;
        return bpe ? 0 : s_bool(tok, eb, o, "cleanup", path, true, &d->cleanup);
    }
    return s_unknown(tok, eb, path, type, "decoder");
}

/* ---------------------------------------------------------------- post-processors */

static int s_pp_push(tok_t *tok, tk_pp_t **out)
{
    tk_pp_t *v = realloc(tok->pp, (tok->npp + 1) * sizeof *v);
    if (!v) return STRATA_ENOMEM;
    tok->pp = v;
    *out = &v[tok->npp++];
    memset(*out, 0, sizeof **out);
    return 0;
}

/* RobertaProcessing / BertProcessing "cls" / "sep": ["token", id]. */
static int s_tok_pair(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *key, const char *path,
                      int32_t *id)
{
    char p[PATHMAX];
    s_sub(p, path, key);
    json_t *v = json_object_get(o, key);
    json_t *i = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_string(json_array_get(v, 0)) ||
        !json_is_integer(i) || json_integer_value(i) < 0 || json_integer_value(i) >= TK_MAX_ID)
        return s_fail(tok, eb, STRATA_EFORMAT, p, "expected [\"token\", id]");
    *id = (int32_t)json_integer_value(i);
    return 0;
}

/* One template ("single" or "pair") into items. */
static int s_parse_tpl(tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *key, const char *path,
                       tk_tpl_item_t **out, size_t *nout, size_t *n_added)
{
    char p[PATHMAX], q[PATHMAX], r[PATHMAX];
    json_t *tpl = json_object_get(o, key), *sp = json_object_get(o, "special_tokens");
    s_sub(p, path, key);
    if (!json_is_array(tpl)) return s_fail(tok, eb, STRATA_EFORMAT, p, "expected an array");
    if (sp && !json_is_object(sp)) {
        s_sub(q, path, "special_tokens");
        return s_fail(tok, eb, STRATA_EFORMAT, q, "expected an object");
    }
    size_t n = json_array_size(tpl);
    *out = calloc(n ? n : 1, sizeof **out);
    if (!*out) return STRATA_ENOMEM;
    *nout = n;
    for (size_t i = 0; i < n; i++) {
        json_t *it = json_array_get(tpl, i);
        tk_tpl_item_t *t = &(*out)[i];
        s_idx(q, p, i);
        json_t *st = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
        if (!json_is_object(it) || (!st == !sq))
            return s_fail(tok, eb, STRATA_EFORMAT, q, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
        const char *id;
        int rc;
        if (sq) {
            s_sub(r, q, "Sequence");
            if ((rc = s_str(tok, eb, sq, "id", r, true, &id, NULL))) return rc;
            if (strcmp(id, "A") && strcmp(id, "B")) {
                s_sub(q, r, "id");
                return s_fail(tok, eb, STRATA_EFORMAT, q, "expected \"A\" or \"B\"");
            }
            t->what = id[0] == 'A' ? 0 : 1;
            continue;
        }
        s_sub(r, q, "SpecialToken");
        if ((rc = s_str(tok, eb, st, "id", r, true, &id, NULL))) return rc;
        json_t *ids = json_object_get(json_object_get(sp, id), "ids");
        if (!json_is_array(ids)) {
            s_sub(q, r, "id");
            return s_fail(tok, eb, STRATA_EFORMAT, q, "'%s' is not in special_tokens (or has no ids)", id);
        }
        t->what = 2;
        t->n = json_array_size(ids);
        t->ids = malloc((t->n ? t->n : 1) * sizeof *t->ids);
        if (!t->ids) return STRATA_ENOMEM;
        for (size_t j = 0; j < t->n; j++) {
            json_t *v = json_array_get(ids, j);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TK_MAX_ID) {
                if (snprintf(q, sizeof q, "%s.special_tokens.%.60s.ids[%zu]", path, id, j) >= (int)sizeof q)
                    q[sizeof q - 1] = 0;
                return s_fail(tok, eb, STRATA_EFORMAT, q, "expected a token id");
            }
            t->ids[j] = (int32_t)json_integer_value(v);
        }
        if (n_added) *n_added += t->n;
    }
    return 0;
}

/* tokenizers reads a post-processor as the first of Roberta, Bert, ByteLevel, Template and
 * Sequence whose fields it has, without checking "type" for the first ones: an object with
 * sep and cls is a RobertaProcessing when it also has trim_offsets and add_prefix_space, a
 * BertProcessing otherwise, whatever its type says. */
static int s_parse_pp(tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, int depth)
{
    const char *type;
    int rc = s_type(tok, eb, o, path, &type);
    if (rc) return rc;
    if (depth > 16) return s_fail(tok, eb, STRATA_EFORMAT, path, "nested too deep");
    tk_pp_t *pp;
    if (json_object_get(o, "sep") && json_object_get(o, "cls")) {
        bool roberta = json_is_boolean(json_object_get(o, "trim_offsets")) &&
                       json_is_boolean(json_object_get(o, "add_prefix_space"));
        if ((rc = s_pp_push(tok, &pp))) return rc;
        pp->kind = roberta ? PP_ROBERTA : PP_BERT;
        pp->n_added = 2;
        if ((rc = s_tok_pair(tok, eb, o, "cls", path, &pp->cls))) return rc;
        return s_tok_pair(tok, eb, o, "sep", path, &pp->sep);
    }
    if (type && !strcmp(type, "ByteLevel")) {
        if ((rc = s_pp_push(tok, &pp))) return rc;
        pp->kind = PP_BYTELEVEL;
        return 0;
    }
    if (json_object_get(o, "single")) {
        if ((rc = s_pp_push(tok, &pp))) return rc;
        pp->kind = PP_TEMPLATE;
        if ((rc = s_parse_tpl(tok, eb, o, "single", path, &pp->single, &pp->nsingle, &pp->n_added))) return rc;
        if (!json_object_get(o, "pair")) return 0;
        return s_parse_tpl(tok, eb, o, "pair", path, &pp->pair, &pp->npair, NULL);
    }
    if (type && !strcmp(type, "Sequence")) {
        char p[PATHMAX], q[PATHMAX];
        s_sub(p, path, "processors");
        json_t *a = json_object_get(o, "processors");
        if (!json_is_array(a)) return s_fail(tok, eb, STRATA_EFORMAT, p, "expected an array");
        for (size_t i = 0; i < json_array_size(a); i++) {
            s_idx(q, p, i);
            if ((rc = s_parse_pp(tok, eb, json_array_get(a, i), q, depth + 1))) return rc;
        }
        return 0;
    }
    return s_unknown(tok, eb, path, type, "post_processor");
}

/* ---------------------------------------------------------------- model */

static int s_parse_model(tok_t *tok, strata_errbuf_t *eb, json_t *o)
{
    const char *path = "model";
    char p[PATHMAX], q[PATHMAX];
    tk_bpe_t *m = &tok->bpe;
    const char *type;
    int rc;
    if (!o || json_is_null(o)) return s_fail(tok, eb, STRATA_EFORMAT, path, "missing");
    if ((rc = s_type(tok, eb, o, path, &type))) return rc;
    if (type ? strcmp(type, "BPE") != 0 : !json_object_get(o, "merges")) {
        if (!type) return s_unknown(tok, eb, path, type, "model");
        s_sub(p, path, "type");
        return s_fail(tok, eb, STRATA_EUNSUPPORTED, p, "unsupported model type '%s' (only BPE)", type);
    }
    const char *s;
    size_t n;
    if ((rc = s_str(tok, eb, o, "unk_token", path, false, &s, &n))) return rc;
    if (s && !(m->unk_token = s_dup(s, n))) return STRATA_ENOMEM;
    /* an empty prefix or suffix (Qwen2 has "") changes nothing: the same as none */
    if ((rc = s_str(tok, eb, o, "continuing_subword_prefix", path, false, &s, &n))) return rc;
    if (s && n && !(m->prefix = s_dup(s, n))) return STRATA_ENOMEM;
    m->prefix_n = m->prefix ? n : 0;
    if ((rc = s_str(tok, eb, o, "end_of_word_suffix", path, false, &s, &n))) return rc;
    if (s && n && !(m->suffix = s_dup(s, n))) return STRATA_ENOMEM;
    m->suffix_n = m->suffix ? n : 0;
    if ((rc = s_bool(tok, eb, o, "fuse_unk", path, false, &m->fuse_unk))) return rc;
    if ((rc = s_bool(tok, eb, o, "byte_fallback", path, false, &m->byte_fallback))) return rc;
    if ((rc = s_bool(tok, eb, o, "ignore_merges", path, false, &m->ignore_merges))) return rc;

    json_t *vocab = json_object_get(o, "vocab");
    s_sub(p, path, "vocab");
    if (!json_is_object(vocab)) return s_fail(tok, eb, STRATA_EFORMAT, p, vocab ? "expected an object" : "missing");
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(vocab, key, klen, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= TK_MAX_ID) {
            if (snprintf(q, sizeof q, "%s[\"%.80s\"]", p, key) >= (int)sizeof q) q[sizeof q - 1] = 0;
            return s_fail(tok, eb, STRATA_EFORMAT, q, "expected a token id in [0, %u)", TK_MAX_ID);
        }
        if ((rc = tk_map_set(&m->vocab, key, klen, (int32_t)json_integer_value(v))) < 0) return rc;
    }

    json_t *merges = json_object_get(o, "merges");
    s_sub(p, path, "merges");
    if (!json_is_array(merges)) return s_fail(tok, eb, STRATA_EFORMAT, p, merges ? "expected an array" : "missing");
    tk_buf_t nt = {0};
    uint32_t rank = 0;
    for (size_t i = 0; i < json_array_size(merges); i++) {
        json_t *e = json_array_get(merges, i);
        const char *a, *b;
        size_t an, bn;
        s_idx(q, p, i);
        if (json_is_string(e)) {
            const char *line = json_string_value(e);
            size_t ln = json_string_length(e);
            if (ln >= 8 && !memcmp(line, "#version", 8)) continue;
            const char *sp = memchr(line, ' ', ln);
            if (!sp || memchr(sp + 1, ' ', ln - (size_t)(sp + 1 - line))) {
                tk_buf_free(&nt);
                return s_fail(tok, eb, STRATA_EFORMAT, q, "expected \"a b\" (two tokens, one space)");
            }
            a = line;
            an = (size_t)(sp - line);
            b = sp + 1;
            bn = ln - an - 1;
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) {
            a = json_string_value(json_array_get(e, 0));
            an = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bn = json_string_length(json_array_get(e, 1));
        } else {
            tk_buf_free(&nt);
            return s_fail(tok, eb, STRATA_EFORMAT, q, "expected \"a b\" or [\"a\", \"b\"]");
        }
        int32_t ia = tk_map_get(&m->vocab, a, an, -1), ib = tk_map_get(&m->vocab, b, bn, -1);
        if (ia < 0 || ib < 0) {
            tk_buf_free(&nt);
            return s_fail(tok, eb, STRATA_EFORMAT, q, "merge token '%.*s' is not in model.vocab",
                          (int)(ia < 0 ? (an > 80 ? 80 : an) : (bn > 80 ? 80 : bn)), ia < 0 ? a : b);
        }
        nt.n = 0;
        if (m->prefix_n > bn || tk_buf_put(&nt, a, an) || tk_buf_put(&nt, b + m->prefix_n, bn - m->prefix_n)) {
            tk_buf_free(&nt);
            if (m->prefix_n > bn) return s_fail(tok, eb, STRATA_EFORMAT, q, "second token shorter than the prefix");
            return STRATA_ENOMEM;
        }
        int32_t inew = tk_map_get(&m->vocab, nt.p, nt.n, -1);
        if (inew < 0) {
            rc = s_fail(tok, eb, STRATA_EFORMAT, q, "merged token '%.*s' is not in model.vocab",
                        (int)(nt.n > 80 ? 80 : nt.n), nt.p);
            tk_buf_free(&nt);
            return rc;
        }
        if ((rc = tk_pair_set(&m->merges, ia, ib, rank++, inew))) {
            tk_buf_free(&nt);
            return rc;
        }
    }
    tk_buf_free(&nt);

    m->unk_id = -1;
    if (m->unk_token) m->unk_id = tk_map_get(&m->vocab, m->unk_token, strlen(m->unk_token), -2);
    for (int b = 0; b < 256; b++) {
        char k[8];
        snprintf(k, sizeof k, "<0x%02X>", b);
        m->byte_id[b] = tk_map_get(&m->vocab, k, 6, -1);
    }
    m->cp_id = malloc(TK_CP_FAST * sizeof *m->cp_id);
    if (!m->cp_id) return STRATA_ENOMEM;
    memset(m->cp_id, 0xff, TK_CP_FAST * sizeof *m->cp_id);
    for (uint32_t e = 0; e < m->vocab.n; e++) {
        const unsigned char *k = (const unsigned char *)m->vocab.arena + m->vocab.koff[e];
        int l;
        if (!m->vocab.klen[e]) continue;
        uint32_t c = tk_utf8_dec(k, m->vocab.klen[e], &l);
        if ((size_t)l == m->vocab.klen[e] && c < TK_CP_FAST) m->cp_id[c] = m->vocab.val[e];
    }
    return 0;
}

/* ---------------------------------------------------------------- added tokens */

int tk_add_token(tok_t *tok, const tk_added_t *t)
{
    if (!t->len) return 0;
    int32_t prev = tk_map_get(&tok->added_ids, t->content, t->len, -1);
    uint32_t r;
    int32_t bi;
    if (prev >= 0 && tk_pair_get(&tok->byid_idx, prev, 0, &r, &bi)) {
        const tk_added_t *e = &tok->byid[r];
        if (e->single_word == t->single_word && e->lstrip == t->lstrip && e->rstrip == t->rstrip &&
            e->normalized == t->normalized && e->special == t->special)
            return 0; /* the very same token */
    }
    tk_added_t c = *t;
    bool in_special = tk_map_find(&tok->special_set, t->content, t->len) >= 0;
    if (t->special && !in_special) {
        if (tk_map_set(&tok->special_set, t->content, t->len, 1) < 0) return STRATA_ENOMEM;
        if (tok->nspec == tok->capspec) {
            size_t cap = tok->capspec ? tok->capspec * 2 : 16;
            tk_added_t *v = realloc(tok->spec, cap * sizeof *v);
            if (!v) return STRATA_ENOMEM;
            tok->spec = v;
            tok->capspec = cap;
        }
        if (!(c.content = s_dup(t->content, t->len))) return STRATA_ENOMEM;
        tok->spec[tok->nspec++] = c;
        in_special = true;
    }
    int32_t id = prev >= 0 ? prev : tk_map_get(&tok->bpe.vocab, t->content, t->len, -1);
    if (id < 0) {
        int32_t vs = (int32_t)tok->bpe.vocab.n;
        if (tok->max_added_id < 0) id = vs;
        else id = (tok->max_added_id >= vs || vs == 0) ? tok->max_added_id + 1 : vs;
    }
    if (id >= (int32_t)TK_MAX_ID) return STRATA_ETOOLARGE;
    if (tk_map_set(&tok->added_ids, t->content, t->len, id) < 0) return STRATA_ENOMEM;
    if (id > tok->max_added_id) tok->max_added_id = id;
    c = *t;
    c.id = id;
    if (!(c.content = s_dup(t->content, t->len))) return STRATA_ENOMEM;
    c.dec = NULL;
    if (tk_pair_get(&tok->byid_idx, id, 0, &r, &bi)) {
        free(tok->byid[r].content);
        tok->byid[r] = c;
    } else {
        if (tok->nbyid == tok->capbyid) {
            size_t cap = tok->capbyid ? tok->capbyid * 2 : 16;
            tk_added_t *v = realloc(tok->byid, cap * sizeof *v);
            if (!v) {
                free(c.content);
                return STRATA_ENOMEM;
            }
            tok->byid = v;
            tok->capbyid = cap;
        }
        if (tk_pair_set(&tok->byid_idx, id, 0, (uint32_t)tok->nbyid, 0)) {
            free(c.content);
            return STRATA_ENOMEM;
        }
        tok->byid[tok->nbyid++] = c;
    }
    if (!in_special) {
        if (tok->nclassic == tok->capclassic) {
            size_t cap = tok->capclassic ? tok->capclassic * 2 : 16;
            tk_added_t *v = realloc(tok->classic, cap * sizeof *v);
            if (!v) return STRATA_ENOMEM;
            tok->classic = v;
            tok->capclassic = cap;
        }
        c = *t;
        if (!(c.content = s_dup(t->content, t->len))) return STRATA_ENOMEM;
        tok->classic[tok->nclassic++] = c;
    }
    return 0;
}

static int s_trie_insert(tk_trie_t *tr, const unsigned char *p, size_t n, int32_t id)
{
    if (!n) return 0;
    if (!tr->node) memset(tr->root, 0xff, sizeof tr->root);
    int32_t node = -1;
    for (size_t j = 0; j < n; j++) {
        int32_t c = j == 0 ? tr->root[p[0]] : tr->node[node].child;
        while (j > 0 && c >= 0 && tr->node[c].byte != p[j]) c = tr->node[c].sib;
        if (c < 0) {
            if (tr->nnode == tr->cap) {
                uint32_t cap = tr->cap ? tr->cap * 2 : 64;
                struct tk_trie_node *v = realloc(tr->node, cap * sizeof *v);
                if (!v) return STRATA_ENOMEM;
                tr->node = v;
                tr->cap = cap;
            }
            c = (int32_t)tr->nnode++;
            tr->node[c] = (struct tk_trie_node){-1, -1, -1, p[j]};
            if (j == 0) {
                tr->root[p[0]] = c;
            } else {
                tr->node[c].sib = tr->node[node].child;
                tr->node[node].child = c;
            }
        }
        node = c;
    }
    if (tr->node[node].term < 0) tr->node[node].term = id;
    if (!tr->first[p[0]]) {
        tr->first[p[0]] = 1;
        tr->first1 = p[0];
        if (tr->nfirst < 4) tr->firsts[tr->nfirst] = p[0];
        tr->nfirst++;
    }
    return 0;
}

int tk_build_added(tok_t *tok)
{
    int rc;
    tk_buf_t norm = {0};
    /* id tables */
    uint32_t cap = 0;
    for (uint32_t e = 0; e < tok->bpe.vocab.n; e++)
        if ((uint32_t)tok->bpe.vocab.val[e] + 1 > cap) cap = (uint32_t)tok->bpe.vocab.val[e] + 1;
    for (size_t i = 0; i < tok->nbyid; i++)
        if ((uint32_t)tok->byid[i].id + 1 > cap) cap = (uint32_t)tok->byid[i].id + 1;
    tok->id_cap = cap;
    /* a normalized added token reads back as its normalized form (tokenizers does so) */
    for (size_t i = 0; i < tok->nbyid; i++) {
        tk_added_t *t = &tok->byid[i];
        if (!t->normalized || t->dec) continue;
        if ((rc = tk_normalize_str(tok, t->content, t->len, &norm))) {
            tk_buf_free(&norm);
            return rc;
        }
        if (!(t->dec = s_dup(norm.p ? norm.p : "", norm.n))) {
            tk_buf_free(&norm);
            return STRATA_ENOMEM;
        }
        t->dec_len = norm.n;
    }
    tok->id_vocab = malloc((cap ? cap : 1) * sizeof *tok->id_vocab);
    tok->id_added = malloc((cap ? cap : 1) * sizeof *tok->id_added);
    tok->id_special = calloc(cap ? cap : 1, 1);
    if (!tok->id_vocab || !tok->id_added || !tok->id_special) return STRATA_ENOMEM;
    memset(tok->id_vocab, 0xff, (cap ? cap : 1) * sizeof *tok->id_vocab);
    memset(tok->id_added, 0xff, (cap ? cap : 1) * sizeof *tok->id_added);
    for (uint32_t e = 0; e < tok->bpe.vocab.n; e++) tok->id_vocab[tok->bpe.vocab.val[e]] = (int32_t)e;
    for (size_t i = 0; i < tok->nbyid; i++) tok->id_added[tok->byid[i].id] = (int32_t)i;
    for (uint32_t id = 0; id < cap; id++) {
        size_t l;
        const char *s = tok_id_to_token(tok, (int32_t)id, &l);
        tok->id_special[id] = s && tk_map_find(&tok->special_set, s, l) >= 0;
    }
    /* tries: special tokens first, then the others, as tokenizers orders its patterns */
    for (size_t pass = 0; pass < 2; pass++) {
        const tk_added_t *list = pass ? tok->classic : tok->spec;
        size_t n = pass ? tok->nclassic : tok->nspec;
        for (size_t i = 0; i < n; i++) {
            const tk_added_t *t = &list[i];
            int32_t id = tk_map_get(&tok->added_ids, t->content, t->len, -1);
            if (id < 0) continue;
            if (!t->normalized) {
                rc = s_trie_insert(&tok->trie_raw, (const unsigned char *)t->content, t->len, id);
            } else {
                rc = tk_normalize_str(tok, t->content, t->len, &norm);
                if (!rc) rc = s_trie_insert(&tok->trie_norm, (const unsigned char *)norm.p, norm.n, id);
            }
            if (rc) {
                tk_buf_free(&norm);
                return rc;
            }
        }
    }
    tk_buf_free(&norm);
    return 0;
}

static int s_parse_added(tok_t *tok, strata_errbuf_t *eb, json_t *a)
{
    const char *path = "added_tokens";
    char p[PATHMAX];
    if (!a || json_is_null(a)) return 0;
    if (!json_is_array(a)) return s_fail(tok, eb, STRATA_EFORMAT, path, "expected an array");
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *o = json_array_get(a, i);
        s_idx(p, path, i);
        if (!json_is_object(o)) return s_fail(tok, eb, STRATA_EFORMAT, p, "expected an object");
        tk_added_t t = {0};
        const char *c;
        int rc;
        if ((rc = s_str(tok, eb, o, "content", p, true, &c, &t.len))) return rc;
        t.content = (char *)c;
        if ((rc = s_bool(tok, eb, o, "special", p, false, &t.special))) return rc;
        if ((rc = s_bool(tok, eb, o, "single_word", p, false, &t.single_word))) return rc;
        if ((rc = s_bool(tok, eb, o, "lstrip", p, false, &t.lstrip))) return rc;
        if ((rc = s_bool(tok, eb, o, "rstrip", p, false, &t.rstrip))) return rc;
        if ((rc = s_bool(tok, eb, o, "normalized", p, !t.special, &t.normalized))) return rc;
        if ((rc = tk_add_token(tok, &t))) return rc == STRATA_ENOMEM ? rc : s_fail(tok, eb, rc, p, "cannot add");
    }
    return 0;
}

/* ---------------------------------------------------------------- truncation / padding */

static int s_dir(const tok_t *tok, strata_errbuf_t *eb, json_t *o, const char *path, bool *left)
{
    const char *s;
    int rc = s_str(tok, eb, o, "direction", path, false, &s, NULL);
    if (rc) return rc;
    *left = false;
    if (!s || !strcmp(s, "Right")) return 0;
    if (!strcmp(s, "Left")) {
        *left = true;
        return 0;
    }
    char p[PATHMAX];
    s_sub(p, path, "direction");
    return s_fail(tok, eb, STRATA_EFORMAT, p, "expected \"Left\" or \"Right\"");
}

static int s_parse_trunc_pad(tok_t *tok, strata_errbuf_t *eb, json_t *root)
{
    json_t *t = json_object_get(root, "truncation"), *p = json_object_get(root, "padding");
    int rc;
    if (t && !json_is_null(t)) {
        if (!json_is_object(t)) return s_fail(tok, eb, STRATA_EFORMAT, "truncation", "expected an object or null");
        tok->trunc = true;
        if ((rc = s_uint(tok, eb, t, "max_length", "truncation", true, 0, SIZE_MAX >> 2, &tok->trunc_max))) return rc;
        if ((rc = s_dir(tok, eb, t, "truncation", &tok->trunc_left))) return rc;
    }
    if (p && !json_is_null(p)) {
        if (!json_is_object(p)) return s_fail(tok, eb, STRATA_EFORMAT, "padding", "expected an object or null");
        tok->pad = true;
        json_t *s = json_object_get(p, "strategy");
        if (json_is_object(s)) {
            if ((rc = s_uint(tok, eb, s, "Fixed", "padding.strategy", true, 0, 1u << 24, &tok->pad_fixed))) return rc;
        } else if (s && !(json_is_string(s) && !strcmp(json_string_value(s), "BatchLongest"))) {
            return s_fail(tok, eb, STRATA_EFORMAT, "padding.strategy", "expected \"BatchLongest\" or {\"Fixed\": n}");
        }
        if ((rc = s_dir(tok, eb, p, "padding", &tok->pad_left))) return rc;
        if ((rc = s_uint(tok, eb, p, "pad_to_multiple_of", "padding", false, 0, 1u << 24, &tok->pad_multiple)))
            return rc;
        size_t id;
        if ((rc = s_uint(tok, eb, p, "pad_id", "padding", false, 0, TK_MAX_ID - 1, &id))) return rc;
        tok->pad_id = (int32_t)id;
    }
    return 0;
}

/* Facts the encoder's fast paths use, derived from the parsed components. */
static int s_derive(tok_t *tok)
{
    tk_bpe_t *m = &tok->bpe;
    for (int b = 0; b < 256; b++) m->byte_sym[b] = m->cp_id[tk_byte_cp[b]];
    tok->bl_last = tok->npt && tok->pt[tok->npt - 1].kind == PT_BYTELEVEL && !m->prefix && !m->suffix;
    tok->norm_unicode_only = tok->nnorm > 0;
    tok->norm_stable_below = 0x300;
    for (size_t i = 0; i < tok->nnorm; i++) {
        tk_norm_kind_t k = tok->norm[i].kind;
        if (k != NORM_NFC && k != NORM_NFD && k != NORM_NFKC && k != NORM_NFKD) tok->norm_unicode_only = false;
        if (k != NORM_NFC) tok->norm_stable_below = 0x80;
    }
    /* Pieces can be long when no pre-tokenizer splits the text (Llama/Mixtral's layout). */
    bool splits = false;
    for (size_t i = 0; i < tok->npt; i++) {
        const tk_pt_t *pt = &tok->pt[i];
        if (!((pt->kind == PT_METASPACE && !pt->split) || (pt->kind == PT_BYTELEVEL && !pt->use_regex))) splits = true;
    }
    if (splits || m->prefix || m->suffix) return 0;
    for (uint32_t e = 0; e < m->vocab.n; e++) {
        const unsigned char *k = (const unsigned char *)m->vocab.arena + m->vocab.koff[e];
        size_t n = m->vocab.klen[e], i = 0;
        uint32_t prev = UINT32_MAX;
        while (i < n) {
            int l = 1;
            uint32_t cp = tk_utf8_dec(k + i, n - i, &l); /* JSON keys are valid UTF-8 */
            if (prev != UINT32_MAX && tk_pair_set(&m->joinable, (int32_t)prev, (int32_t)cp, 0, 1)) return STRATA_ENOMEM;
            prev = cp;
            i += (size_t)l;
        }
    }
    m->can_chunk = true;
    return 0;
}

/* ---------------------------------------------------------------- the file */

int tk_parse_tokenizer(tok_t *tok, const char *json, size_t len, strata_errbuf_t *eb)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &je);
    int rc;
    if (!root)
        return strata_seterr(eb, STRATA_EFORMAT, "%s: line %d column %d: %s", tok->name, je.line, je.column, je.text);
    if (!json_is_object(root)) {
        rc = s_fail(tok, eb, STRATA_EFORMAT, "(root)", "expected an object");
        goto fail;
    }
    json_t *v = json_object_get(root, "version");
    if (v && !(json_is_string(v) && !strcmp(json_string_value(v), "1.0"))) {
        rc = s_fail(tok, eb, STRATA_EVERSION, "version", "unknown tokenizer version (expected \"1.0\")");
        goto fail;
    }
    if ((rc = s_parse_model(tok, eb, json_object_get(root, "model")))) goto fail;
    if ((v = json_object_get(root, "normalizer")) && !json_is_null(v) && (rc = s_parse_norm(tok, eb, v, "normalizer", 0)))
        goto fail;
    if ((v = json_object_get(root, "pre_tokenizer")) && !json_is_null(v) &&
        (rc = s_parse_pt(tok, eb, v, "pre_tokenizer", 0)))
        goto fail;
    tok->has_decoder = (v = json_object_get(root, "decoder")) && !json_is_null(v);
    if (tok->has_decoder && (rc = s_parse_dec(tok, eb, v, "decoder", 0))) goto fail;
    if ((v = json_object_get(root, "post_processor")) && !json_is_null(v) &&
        (rc = s_parse_pp(tok, eb, v, "post_processor", 0)))
        goto fail;
    if ((rc = s_parse_trunc_pad(tok, eb, root))) goto fail;
    rc = s_parse_added(tok, eb, json_object_get(root, "added_tokens"));
    if (!rc) rc = s_derive(tok);
fail:
    json_decref(root);
    return rc;
}

static void s_added_free(tk_added_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(v[i].content);
        free(v[i].dec);
    }
    free(v);
}

void tk_release(tok_t *tok)
{
    tk_map_free(&tok->bpe.vocab);
    tk_pair_free(&tok->bpe.merges);
    tk_pair_free(&tok->bpe.joinable);
    free(tok->bpe.unk_token);
    free(tok->bpe.prefix);
    free(tok->bpe.suffix);
    free(tok->bpe.cp_id);
    for (size_t i = 0; i < tok->nnorm; i++) {
        tk_re_free(&tok->norm[i].re);
        free(tok->norm[i].str);
    }
    free(tok->norm);
    for (size_t i = 0; i < tok->npt; i++) tk_re_free(&tok->pt[i].re);
    free(tok->pt);
    for (size_t i = 0; i < tok->ndec; i++) {
        tk_re_free(&tok->dec[i].re);
        free(tok->dec[i].pat);
        free(tok->dec[i].str);
    }
    free(tok->dec);
    for (size_t i = 0; i < tok->npp; i++) {
        for (size_t k = 0; k < tok->pp[i].nsingle; k++) free(tok->pp[i].single[k].ids);
        for (size_t k = 0; k < tok->pp[i].npair; k++) free(tok->pp[i].pair[k].ids);
        free(tok->pp[i].single);
        free(tok->pp[i].pair);
    }
    free(tok->pp);
    s_added_free(tok->spec, tok->nspec);
    s_added_free(tok->classic, tok->nclassic);
    s_added_free(tok->byid, tok->nbyid);
    tk_map_free(&tok->added_ids);
    tk_map_free(&tok->special_set);
    tk_pair_free(&tok->byid_idx);
    free(tok->trie_raw.node);
    free(tok->trie_norm.node);
    free(tok->id_vocab);
    free(tok->id_added);
    free(tok->id_special);
    tk_re_free(&tok->re_bytelevel);
}
