/* tokenizer.c - loading a tokenizer from a file or a model folder, and the accessors.
 * The pipeline itself lives in tok_load.c (JSON), tok_norm.c, tok_regex.c, tok_encode.c and
 * tok_decode.c; tok_int.h holds the shared structures. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/tok_int.h"

static tok_t *s_alloc(const char *name)
{
    tok_t *tok = calloc(1, sizeof *tok);
    if (!tok) return NULL;
    tok->pool = calloc(1, sizeof *tok->pool);
    if (!tok->pool || pthread_mutex_init(&tok->pool->mu, NULL)) {
        free(tok->pool);
        free(tok);
        return NULL;
    }
    if (snprintf(tok->name, sizeof tok->name, "%s", name ? name : "tokenizer.json") >= (int)sizeof tok->name)
        tok->name[sizeof tok->name - 1] = 0;
    tok->max_added_id = -1;
    tok->bos = tok->eos = -1;
    return tok;
}

void tok_free(tok_t *tok)
{
    if (!tok) return;
    tk_release(tok);
    if (tok->pool) {
        tk_ws_t *ws = tok->pool->free;
        while (ws) {
            tk_ws_t *next = ws->next;
            tk_ws_free(ws);
            ws = next;
        }
        pthread_mutex_destroy(&tok->pool->mu);
        free(tok->pool);
    }
    free(tok);
}

/* Largest tokenizer.json read (real ones are 2-12 MB). */
#define TOK_MAX_FILE_BYTES ((uint64_t)1 << 30)

int tok_load_json(tok_t **out, const char *json, size_t len, const char *name, strata_errbuf_t *eb)
{
    int rc;
    tok_t *tok = s_alloc(name);
    *out = NULL;
    if (!tok) return STRATA_ENOMEM;
    if ((rc = tk_parse_tokenizer(tok, json, len, eb))) goto fail;
    if ((rc = tk_build_added(tok))) goto fail;
    *out = tok;
    return 0;
fail:
    if (rc == STRATA_ENOMEM) strata_seterr(eb, rc, "%s: out of memory", tok->name);
    tok_free(tok);
    return rc;
}

/* A token reference in tokenizer_config.json: "text" or {"content": "text", ...}. */
static const char *s_tok_ref(json_t *v, size_t *n)
{
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return NULL;
    *n = json_string_length(v);
    return json_string_value(v);
}

/* The first id of v (an id, or a list of ids as eos_token_id may be) that the tokenizer knows,
 * or -1. */
static int32_t s_first_id(const tok_t *tok, json_t *v)
{
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (json_is_integer(e) && json_integer_value(e) >= 0 && json_integer_value(e) < (json_int_t)tok->id_cap)
            return (int32_t)json_integer_value(e);
    }
    return -1;
}

/* bos_token_id / eos_token_id of generation_config.json or config.json, for a tokenizer that names
 * none: called for generation_config.json first, so its ids win, as transformers' generate()
 * prefers them (the model's whole stop set is model_config_t.eos_ids; a tokenizer has one eos). */
static void s_ids_from(const char *dir, const char *file, tok_t *tok)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    json_t *root = json_load_file(path, 0, NULL);
    if (!root) return;
    if (tok->bos < 0) tok->bos = s_first_id(tok, json_object_get(root, "bos_token_id"));
    if (tok->eos < 0) tok->eos = s_first_id(tok, json_object_get(root, "eos_token_id"));
    json_decref(root);
}

/* tokenizer_config.json: added tokens missing from tokenizer.json (as transformers adds them),
 * and the BOS / EOS tokens. */
static int s_load_config(tok_t *tok, const char *dir, strata_errbuf_t *eb)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat sb;
    if (stat(path, &sb)) return 0;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_ALLOW_NUL, &je);
    if (!root) return strata_seterr(eb, STRATA_EFORMAT, "%s: line %d: %s", path, je.line, je.text);
    int rc = 0;
    json_t *dec = json_object_get(root, "added_tokens_decoder");
    if (dec && !json_is_object(dec)) {
        rc = strata_seterr(eb, STRATA_EFORMAT, "%s: added_tokens_decoder: expected an object", path);
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(dec, key, v)
    {
        size_t n = 0;
        const char *c = s_tok_ref(v, &n);
        if (!c) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: added_tokens_decoder.%s.content: expected a string", path, key);
            goto fail;
        }
        if (tk_map_find(&tok->added_ids, c, n) >= 0) continue; /* tokenizer.json has it */
        tk_added_t t = {.content = (char *)c, .len = n};
        t.special = json_is_true(json_object_get(v, "special"));
        t.single_word = json_is_true(json_object_get(v, "single_word"));
        t.lstrip = json_is_true(json_object_get(v, "lstrip"));
        t.rstrip = json_is_true(json_object_get(v, "rstrip"));
        json_t *nz = json_object_get(v, "normalized");
        t.normalized = json_is_boolean(nz) ? json_is_true(nz) : !t.special;
        if ((rc = tk_add_token(tok, &t))) {
            strata_seterr(eb, rc, "%s: added_tokens_decoder.%s: cannot add the token", path, key);
            goto fail;
        }
    }
    size_t n;
    const char *s;
    if ((s = s_tok_ref(json_object_get(root, "bos_token"), &n))) tok->bos = tok_token_to_id(tok, s, n);
    if ((s = s_tok_ref(json_object_get(root, "eos_token"), &n))) tok->eos = tok_token_to_id(tok, s, n);
fail:
    json_decref(root);
    return rc;
}

int tok_load(tok_t **out, const char *path_or_dir, strata_errbuf_t *eb)
{
    char dir[4096], file[4200];
    struct stat sb;
    char *json = NULL;
    size_t len = 0;
    tok_t *tok = NULL;
    int rc;
    *out = NULL;
    if (stat(path_or_dir, &sb)) return strata_seterr(eb, -errno, "%s: %s", path_or_dir, strerror(errno));
    if (S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path_or_dir);
        snprintf(file, sizeof file, "%s/tokenizer.json", path_or_dir);
    } else {
        snprintf(file, sizeof file, "%s", path_or_dir);
        snprintf(dir, sizeof dir, "%s", path_or_dir);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    if ((rc = strata_read_file(file, TOK_MAX_FILE_BYTES, &json, &len, eb))) return rc;
    tok = s_alloc(file);
    if (!tok) {
        rc = STRATA_ENOMEM;
        goto fail;
    }
    if ((rc = tk_parse_tokenizer(tok, json, len, eb))) goto fail;
    if ((rc = s_load_config(tok, dir, eb))) goto fail;
    if ((rc = tk_build_added(tok))) goto fail;
    if (tok->bos < 0 || tok->eos < 0) {
        s_ids_from(dir, "generation_config.json", tok);
        s_ids_from(dir, "config.json", tok);
    }
    free(json);
    *out = tok;
    return 0;
fail:
    if (rc == STRATA_ENOMEM) strata_seterr(eb, rc, "%s: out of memory", file);
    free(json);
    tok_free(tok);
    return rc;
}

int32_t tok_bos(const tok_t *tok) { return tok->bos; }
int32_t tok_eos(const tok_t *tok) { return tok->eos; }
size_t tok_vocab_size(const tok_t *tok) { return tok->id_cap; }

const char *tok_id_to_token(const tok_t *tok, int32_t id, size_t *len)
{
    if (id < 0 || (uint32_t)id >= tok->id_cap) return NULL;
    int32_t a = tok->id_added[id];
    if (a >= 0) {
        const tk_added_t *t = &tok->byid[a];
        *len = t->dec ? t->dec_len : t->len;
        return t->dec ? t->dec : t->content;
    }
    int32_t e = tok->id_vocab[id];
    if (e < 0) return NULL;
    *len = tok->bpe.vocab.klen[e];
    return tok->bpe.vocab.arena + tok->bpe.vocab.koff[e];
}

int32_t tok_token_to_id(const tok_t *tok, const char *s, size_t len)
{
    int32_t id = tk_map_get(&tok->added_ids, s, len, -1);
    return id >= 0 ? id : tk_map_get(&tok->bpe.vocab, s, len, -1);
}

bool tok_is_special(const tok_t *tok, int32_t id)
{
    return id >= 0 && (uint32_t)id < tok->id_cap && tok->id_special[id];
}
