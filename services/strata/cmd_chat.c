/* cmd_chat.c - `strata chat`: an interactive chat in the terminal against a running group,
 * over rclient.h's connection: each line typed is a turn, the answer streams as it comes, and
 * the turns so far are the next turn's context until /reset.
 *
 * Chat templates are not rendered by this build (no template engine yet), so every turn is a
 * completion: the conversation is kept as plain text (each turn's line, then the answer), which
 * the model continues. The model folder is looked at once to say so: whether it ships a chat
 * template (chat_template.jinja, or chat_template in tokenizer_config.json) that is not used. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "services/strata/cli_util.h"
#include "services/strata/group_state.h"
#include "services/strata/rclient.h"

static const char *const C = "chat";

#define HISTORY_MAX (1 << 20) /* bytes of conversation kept; beyond, the oldest turns go */

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata chat [--endpoint E] [--model DIR] [options]\n"
            "\n"
            "Chat with a running group in the terminal: each line is a turn, the answer streams\n"
            "as it comes, and the conversation so far is the context of the next turn. Commands:\n"
            "/reset forgets the conversation, /help lists the commands, /quit or Ctrl-D ends.\n"
            "This build does not render chat templates: every turn is a completion of the\n"
            "conversation's text, and the chat says at the start whether the model ships a template\n"
            "it does not use. Without --endpoint it talks to the one group this user runs (as\n"
            "`strata client`), else to the one `strata up --demo` serves.\n"
            "\n"
            "  --endpoint E        router endpoint (default: the running group's, or " RC_DEFAULT_ENDPOINT ")\n"
            "  --model DIR         the model folder, to look for its chat template (default: the\n"
            "                      running group's [group] model)\n"
            "  --max-tokens N      tokens an answer may take (default 128)\n"
            "%s"
            "  --stats             print finish reason, usage and timings after each answer\n"
            "  --timeout S         give up on an answer after S seconds (default 300)\n"
            "  -h, --help          this help\n"
            "\n"
            "Exit codes: 0 ended (Ctrl-D, /quit), 1 runtime failure, 2 bad usage.\n",
            cli_sampling_help);
}

/* Whether the model folder ships a chat template. */
static bool s_has_template(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    if (access(path, R_OK) == 0) return true;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *o = json_load_file(path, 0, NULL);
    bool has = o && json_object_get(o, "chat_template") != NULL;
    json_decref(o);
    return has;
}

/* The conversation: text, growing; a turn's answer is appended as it streams. */
typedef struct {
    char *s;
    size_t len, cap;
    bool stats;
} s_hist_t;

static int s_append(s_hist_t *h, const char *p, size_t n)
{
    if (h->len + n + 1 > h->cap) {
        size_t cap = (h->len + n + 1) * 2;
        char *s = realloc(h->s, cap);
        if (!s) return -1;
        h->s = s;
        h->cap = cap;
    }
    memcpy(h->s + h->len, p, n);
    h->len += n;
    h->s[h->len] = 0;
    return 0;
}

/* Drop whole turns from the front until the conversation is at most HISTORY_MAX bytes. */
static void s_trim(s_hist_t *h)
{
    size_t cut = 0;
    while (h->len - cut > HISTORY_MAX) {
        const char *nl = memchr(h->s + cut, '\n', h->len - cut);
        cut = nl ? (size_t)(nl - h->s) + 1 : h->len;
    }
    if (!cut) return;
    memmove(h->s, h->s + cut, h->len - cut + 1);
    h->len -= cut;
}

static void s_on_tokens(void *ctx, const msg_tokens_t *t)
{
    s_hist_t *h = ctx;
    fwrite(t->text.s, 1, t->text.len, stdout);
    fflush(stdout);
    (void)s_append(h, t->text.s, t->text.len);
}

static void s_on_done(void *ctx, const msg_done_t *d)
{
    s_hist_t *h = ctx;
    printf("\n");
    fflush(stdout);
    if (h->stats)
        fprintf(stderr, "finish=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%.2f total_ms=%.2f\n", msg_finish_name(d->finish),
                d->prompt_tokens, d->completion_tokens, d->ttft_ms, d->total_ms);
}

int cmd_chat(int argc, char **argv)
{
    const char *v, *model_arg = NULL;
    char endpoint[512], model[512] = "";
    bool endpoint_given = false, stats = false;
    int64_t max_tokens = 128;
    float timeout_s = 300.0f;
    sampler_params_t sp;
    sampler_params_default(&sp);
    snprintf(endpoint, sizeof endpoint, "%s", RC_DEFAULT_ENDPOINT);
    int r;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = cli_sampling_opt(C, argc, argv, &i, &sp))) {
            if (r == 2) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--endpoint", &v))) {
            if (r < 0) return 2;
            snprintf(endpoint, sizeof endpoint, "%s", v);
            endpoint_given = true;
        } else if ((r = cli_opt(C, argc, argv, &i, "--model", &v))) {
            if (r < 0) return 2;
            model_arg = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--max-tokens", &v))) {
            if (r < 0 || cli_parse_i64(C, "--max-tokens", v, 1, MSG_MAX_MAX_TOKENS, &max_tokens)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--timeout", &v))) {
            if (r < 0 || cli_parse_f32(C, "--timeout", v, 0.1f, 1e6f, &timeout_s)) return 2;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = true;
        } else {
            cli_error(C, "unexpected argument '%s' (see --help)", argv[i]);
            return 2;
        }
    }
    if (!endpoint_given && (r = gs_find_router(C, endpoint, sizeof endpoint, model, sizeof model))) return r;
    if (model_arg) snprintf(model, sizeof model, "%s", model_arg);
    if (model[0])
        fprintf(stderr, "strata chat: %s %s; each turn continues the conversation's text. /help for the commands.\n", model,
                s_has_template(model) ? "ships a chat template, which this build does not render"
                                      : "has no chat template");
    else fprintf(stderr, "strata chat: no chat template is used; each turn continues the conversation's text.\n");

    rc_conn_t *c = NULL;
    int rc = rc_open(&c, C, endpoint);
    if (rc) return rc;
    s_hist_t h = {.stats = stats};
    const bool tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t lcap = 0;
    for (;;) {
        if (tty) {
            printf("> ");
            fflush(stdout);
        }
        ssize_t n = getline(&line, &lcap, stdin);
        if (n < 0) { /* Ctrl-D */
            if (tty) printf("\n");
            break;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            h.len = 0;
            if (h.s) h.s[0] = 0;
            printf("(the conversation is forgotten)\n");
            continue;
        }
        if (!strcmp(line, "/help")) {
            printf("/reset  forget the conversation\n/quit   end (or Ctrl-D)\n");
            continue;
        }
        if (line[0] == '/') {
            printf("unknown command %s (/help)\n", line);
            continue;
        }
        if ((h.len && s_append(&h, "\n", 1)) || s_append(&h, line, (size_t)n) || s_append(&h, "\n", 1)) {
            cli_error(C, "out of memory");
            rc = 1;
            break;
        }
        s_trim(&h);
        const rc_req_t q = {.prompt = h.s, .max_tokens = max_tokens, .sp = sp, .stream = true, .timeout_s = timeout_s,
                            .resume_after = 5.0f, .gone_after = 3.0f};
        const rc_cb_t cb = {s_on_tokens, s_on_done, &h};
        /* a refused or failed turn is reported and the chat goes on */
        (void)rc_generate(c, &q, &cb);
    }
    free(line);
    free(h.s);
    rc_close(c);
    return rc;
}
