/* render.c - renders chat templates for the tests in this folder.
 *
 *   render TEMPLATE VARS.json [NOW]
 *       TEMPLATE rendered with the variables of the JSON object in VARS.json (the engine
 *       alone, common/jinja.h). Prints the output; on error prints "error: ..." to stderr
 *       and exits 1 (2 when the template does not parse).
 *   render --dir DIR --cases CASES.jsonl
 *       DIR's chat template (common/chat_template.h), once per line of CASES.jsonl, each an
 *       object {"messages": [...], "extra": {...} or null, "add_generation_prompt": bool,
 *       "now": seconds}. Prints one JSON line a case: {"ok": true, "out": "..."} or
 *       {"ok": false, "error": "..."}. Exits 2 when the template does not load.
 *   render --dir DIR --messages M.json [--extra E.json] [--add-generation-prompt] [--now N]
 *       One render through chat_template_render; prints the output, or the error and exit 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/chat_template.h"
#include "common/jinja.h"

static char *s_slurp(const char *path, size_t *len)
{
    strata_errbuf_t eb = {{0}};
    char *buf = NULL;
    if (strata_read_file(path, 256u << 20, &buf, len, &eb) < 0) {
        fprintf(stderr, "error: %s\n", eb.msg);
        return NULL;
    }
    return buf;
}

static int s_engine(const char *tpath, const char *vpath, int64_t now)
{
    size_t tl, vl;
    char *src = s_slurp(tpath, &tl), *vars = src ? s_slurp(vpath, &vl) : NULL;
    if (!src || !vars) {
        free(src);
        return 2;
    }
    strata_errbuf_t eb = {{0}};
    jinja_template_t *t = NULL;
    int rc = jinja_parse(src, tl, &t, &eb);
    free(src);
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", eb.msg);
        free(vars);
        return 2;
    }
    jinja_ctx_t *c = jinja_ctx_new(NULL);
    jinja_val_t *v = NULL;
    if (!c || jinja_from_json(c, vars, vl, vpath, &v, &eb) < 0 || jinja_set_each(c, v) < 0) {
        fprintf(stderr, "error: %s\n", eb.msg[0] ? eb.msg : "bad variables");
        free(vars);
        jinja_ctx_free(c);
        jinja_free(t);
        return 2;
    }
    free(vars);
    char *out = NULL;
    size_t n = 0;
    rc = jinja_render(t, c, now, &out, &n, &eb);
    if (rc < 0) fprintf(stderr, "error: %s\n", eb.msg);
    else fwrite(out, 1, n, stdout);
    free(out);
    jinja_ctx_free(c);
    jinja_free(t);
    return rc < 0 ? 1 : 0;
}

static int s_cases(chat_template_t *ct, const char *cpath)
{
    FILE *f = fopen(cpath, "r");
    if (!f) {
        fprintf(stderr, "error: cannot open %s\n", cpath);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, f)) > 0) {
        json_error_t je;
        json_t *cs = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        if (!cs) {
            fprintf(stderr, "error: %s: %s\n", cpath, je.text);
            rc = 2;
            break;
        }
        char *msgs = json_dumps(json_object_get(cs, "messages"), JSON_ENCODE_ANY | JSON_COMPACT);
        json_t *ex = json_object_get(cs, "extra");
        char *extra = ex && !json_is_null(ex) ? json_dumps(ex, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
        bool agp = json_is_true(json_object_get(cs, "add_generation_prompt"));
        int64_t now = (int64_t)json_integer_value(json_object_get(cs, "now"));
        char *out = NULL;
        strata_errbuf_t eb = {{0}};
        int r = chat_template_render(ct, msgs ? msgs : "null", extra, agp, now, &out, &eb);
        json_t *res = r < 0 ? json_pack("{s:b,s:s}", "ok", 0, "error", eb.msg)
                            : json_pack("{s:b,s:s%}", "ok", 1, "out", out, strlen(out));
        if (!res) res = json_pack("{s:b,s:s}", "ok", 0, "error", "the output is not valid UTF-8");
        char *js = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
        puts(js);
        free(js);
        json_decref(res);
        free(out);
        free(msgs);
        free(extra);
        json_decref(cs);
    }
    free(line);
    fclose(f);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--dir")) return s_engine(argv[1], argv[2], argc > 3 ? strtoll(argv[3], NULL, 10) : 0);
    const char *dir = NULL, *cases = NULL, *mpath = NULL, *epath = NULL;
    bool agp = false;
    int64_t now = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--cases") && i + 1 < argc) cases = argv[++i];
        else if (!strcmp(argv[i], "--messages") && i + 1 < argc) mpath = argv[++i];
        else if (!strcmp(argv[i], "--extra") && i + 1 < argc) epath = argv[++i];
        else if (!strcmp(argv[i], "--now") && i + 1 < argc) now = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--add-generation-prompt")) agp = true;
        else {
            fprintf(stderr, "usage: render TEMPLATE VARS.json [NOW] | render --dir DIR (--cases F | --messages F ...)\n");
            return 2;
        }
    }
    if (!dir || (!cases && !mpath)) {
        fprintf(stderr, "usage: render TEMPLATE VARS.json [NOW] | render --dir DIR (--cases F | --messages F ...)\n");
        return 2;
    }
    chat_template_t *ct = NULL;
    strata_errbuf_t eb = {{0}};
    if (chat_template_load(dir, &ct, &eb) < 0) {
        fprintf(stderr, "error: %s\n", eb.msg);
        return 2;
    }
    if (!ct) {
        fprintf(stderr, "error: %s has no chat template\n", dir);
        return 2;
    }
    int rc;
    if (cases) {
        rc = s_cases(ct, cases);
    } else {
        size_t ml, el;
        char *m = s_slurp(mpath, &ml), *e = epath ? s_slurp(epath, &el) : NULL;
        char *out = NULL;
        rc = m && (!epath || e) ? chat_template_render(ct, m, e, agp, now, &out, &eb) : -1;
        if (rc < 0) fprintf(stderr, "error: %s\n", eb.msg[0] ? eb.msg : "cannot read the input");
        else fputs(out, stdout);
        rc = rc < 0 ? 1 : 0;
        free(out);
        free(m);
        free(e);
    }
    chat_template_free(ct);
    return rc;
}
