/* chat_template.c - a model folder's chat template, loaded and rendered as transformers'
 * apply_chat_template does: the template is dir/chat_template.jinja, else "chat_template" in
 * tokenizer_config.json (a string, or a list of {name, template} of which "default" is
 * used), else "chat_template" in chat_template.json; the special tokens of
 * tokenizer_config.json (bos_token ... mask_token, additional_special_tokens) are template
 * variables, as tokenizer.special_tokens_map makes them (empty ones left out). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "common/chat_template.h"
#include "common/jinja.h"

#define CT_MAX_FILE (16u << 20)

static const char *const s_tok_names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                          "pad_token", "cls_token", "mask_token"};
#define N_TOK (sizeof s_tok_names / sizeof s_tok_names[0])

struct chat_template {
    jinja_template_t *t;
    char *where;        /* the file the template came from, for messages */
    char *tok[N_TOK];   /* special tokens, NULL when unset */
    char **extra_tok;   /* additional_special_tokens */
    size_t n_extra_tok;
    bool has_extra_tok;
};

void chat_template_free(chat_template_t *t)
{
    if (!t) return;
    jinja_free(t->t);
    free(t->where);
    for (size_t i = 0; i < N_TOK; i++) free(t->tok[i]);
    for (size_t i = 0; i < t->n_extra_tok; i++) free(t->extra_tok[i]);
    free(t->extra_tok);
    free(t);
}

/* A token as tokenizer_config.json writes it: a string or an AddedToken object. */
static const char *s_token_text(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) {
        const json_t *c = json_object_get(v, "content");
        if (json_is_string(c)) return json_string_value(c);
    }
    return NULL;
}

static bool s_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int chat_template_load(const char *dir, chat_template_t **out, strata_errbuf_t *eb)
{
    *out = NULL;
    int rc = 0;
    char path[4200], cfg_path[4200];
    char *src = NULL;
    size_t src_len = 0;
    json_t *cfg = NULL;
    chat_template_t *t = NULL;
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return strata_seterr(eb, STRATA_EINVAL_INPUT, "%s: not a model folder (%s)", dir, strerror(errno ? errno : ENOTDIR));

    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    if (s_is_file(cfg_path)) {
        json_error_t je;
        cfg = json_load_file(cfg_path, JSON_DECODE_ANY, &je);
        if (!cfg) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: bad JSON at line %d: %s", cfg_path, je.line, je.text);
            goto fail;
        }
        if (!json_is_object(cfg)) {
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: not a JSON object", cfg_path);
            goto fail;
        }
    }

    t = calloc(1, sizeof *t);
    if (!t) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "out of memory");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (s_is_file(path)) {
        if ((rc = strata_read_file(path, CT_MAX_FILE, &src, &src_len, eb)) < 0) goto fail;
    } else {
        const json_t *ct = cfg ? json_object_get(cfg, "chat_template") : NULL;
        json_t *ctj = NULL;
        if (!ct || json_is_null(ct)) {
            /* chat_template.json (processor configs keep the template there) */
            snprintf(path, sizeof path, "%s/chat_template.json", dir);
            if (s_is_file(path)) {
                json_error_t je;
                ctj = json_load_file(path, 0, &je);
                if (!ctj) {
                    rc = strata_seterr(eb, STRATA_EFORMAT, "%s: bad JSON at line %d: %s", path, je.line, je.text);
                    goto fail;
                }
                ct = json_object_get(ctj, "chat_template");
                if (!json_is_string(ct)) {
                    json_decref(ctj);
                    rc = strata_seterr(eb, STRATA_EFORMAT, "%s: \"chat_template\" must be a string", path);
                    goto fail;
                }
            } else {
                chat_template_free(t);
                json_decref(cfg);
                return 0; /* no chat template */
            }
        } else {
            snprintf(path, sizeof path, "%s", cfg_path);
        }
        if (json_is_array(ct)) {
            size_t i;
            const json_t *e, *found = NULL;
            json_array_foreach(ct, i, e)
            {
                const json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
                if (!json_is_object(e) || !json_is_string(nm) || !json_is_string(tp)) {
                    rc = strata_seterr(eb, STRATA_EFORMAT,
                                       "%s: chat_template[%zu] must be an object with string \"name\" and \"template\"",
                                       path, i);
                    goto fail;
                }
                if (!strcmp(json_string_value(nm), "default")) found = tp;
            }
            if (!found) {
                rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                                   "%s: chat_template is a list of named templates without one named \"default\"", path);
                goto fail;
            }
            ct = found;
        } else if (!json_is_string(ct)) {
            json_decref(ctj);
            rc = strata_seterr(eb, STRATA_EFORMAT, "%s: \"chat_template\" must be a string or a list of {name, template}",
                               path);
            goto fail;
        }
        src_len = json_string_length(ct);
        src = malloc(src_len + 1);
        if (!src) {
            json_decref(ctj);
            rc = strata_seterr(eb, STRATA_ENOMEM, "out of memory");
            goto fail;
        }
        memcpy(src, json_string_value(ct), src_len + 1);
        json_decref(ctj);
    }
    t->where = strdup(path);
    if (!t->where) {
        rc = strata_seterr(eb, STRATA_ENOMEM, "out of memory");
        goto fail;
    }

    strata_errbuf_t je = {{0}};
    if ((rc = jinja_parse(src, src_len, &t->t, &je)) < 0) {
        strata_seterr(eb, rc, "%s: chat template %s", path, je.msg);
        goto fail;
    }

    if (cfg) {
        for (size_t i = 0; i < N_TOK; i++) {
            const char *s = s_token_text(json_object_get(cfg, s_tok_names[i]));
            if (s && *s && !(t->tok[i] = strdup(s))) {
                rc = strata_seterr(eb, STRATA_ENOMEM, "out of memory");
                goto fail;
            }
        }
        const json_t *add = json_object_get(cfg, "additional_special_tokens");
        if (json_is_array(add) && json_array_size(add)) {
            t->extra_tok = calloc(json_array_size(add), sizeof(char *));
            if (!t->extra_tok) {
                rc = strata_seterr(eb, STRATA_ENOMEM, "out of memory");
                goto fail;
            }
            size_t i;
            const json_t *e;
            json_array_foreach(add, i, e)
            {
                const char *s = s_token_text(e);
                if (!s) {
                    rc = strata_seterr(eb, STRATA_EFORMAT, "%s: additional_special_tokens[%zu] is not a token", cfg_path, i);
                    goto fail;
                }
                if (!(t->extra_tok[t->n_extra_tok] = strdup(s))) {
                    rc = strata_seterr(eb, STRATA_ENOMEM, "out of memory");
                    goto fail;
                }
                t->n_extra_tok++;
            }
            t->has_extra_tok = true;
        }
    }
    free(src);
    json_decref(cfg);
    *out = t;
    return 0;
fail:
    free(src);
    json_decref(cfg);
    chat_template_free(t);
    return rc < 0 ? rc : STRATA_EFORMAT;
}

int chat_template_render(const chat_template_t *t, const char *messages_json, const char *extra_json,
                         bool add_generation_prompt, int64_t now_unix, char **out, strata_errbuf_t *eb)
{
    *out = NULL;
    int rc = 0;
    jinja_ctx_t *c = jinja_ctx_new(NULL);
    if (!c) return strata_seterr(eb, STRATA_ENOMEM, "out of memory");
    strata_errbuf_t je = {{0}};
    jinja_val_t *msgs = NULL, *extra = NULL;
    if ((rc = jinja_from_json(c, messages_json, strlen(messages_json), "messages", &msgs, &je)) < 0) {
        strata_seterr(eb, rc, "%s", je.msg);
        goto done;
    }
    if (!jinja_is_list(msgs)) {
        rc = strata_seterr(eb, STRATA_EINVAL_INPUT, "messages: not a JSON array");
        goto done;
    }
    for (size_t i = 0; i < N_TOK; i++)
        if (t->tok[i] && (rc = jinja_set(c, s_tok_names[i], jinja_str(c, t->tok[i], strlen(t->tok[i])))) < 0) goto oom;
    if (t->has_extra_tok) {
        jinja_val_t *l = jinja_list(c);
        for (size_t i = 0; i < t->n_extra_tok; i++)
            if ((rc = jinja_list_push(c, l, jinja_str(c, t->extra_tok[i], strlen(t->extra_tok[i])))) < 0) goto oom;
        if ((rc = jinja_set(c, "additional_special_tokens", l)) < 0) goto oom;
    }
    if ((rc = jinja_set(c, "tools", jinja_none(c))) < 0 || (rc = jinja_set(c, "documents", jinja_none(c))) < 0) goto oom;
    if (extra_json) {
        if ((rc = jinja_from_json(c, extra_json, strlen(extra_json), "extra variables", &extra, &je)) < 0) {
            strata_seterr(eb, rc, "%s", je.msg);
            goto done;
        }
        if (jinja_dict_get(extra, "messages") || jinja_dict_get(extra, "add_generation_prompt")) {
            rc = strata_seterr(eb, STRATA_EINVAL_INPUT,
                               "extra variables: messages and add_generation_prompt are the caller's own arguments");
            goto done;
        }
        if ((rc = jinja_set_each(c, extra)) < 0) {
            strata_seterr(eb, rc, "extra variables: not a JSON object");
            goto done;
        }
    }
    if ((rc = jinja_set(c, "messages", msgs)) < 0 ||
        (rc = jinja_set(c, "add_generation_prompt", jinja_bool(c, add_generation_prompt))) < 0)
        goto oom;
    size_t len;
    if ((rc = jinja_render(t->t, c, now_unix, out, &len, &je)) < 0) {
        strata_seterr(eb, rc, "chat template %s", je.msg);
        goto done;
    }
    rc = 0;
    goto done;
oom:
    rc = strata_seterr(eb, STRATA_ENOMEM, "out of memory building the template values");
done:
    jinja_ctx_free(c);
    return rc;
}
