/* cmd_chat.c - `strata chat`: an interactive chat in the terminal against a running group,
 * over rclient.h's connection: each line typed is a turn, the answer streams as it comes, and
 * the turns so far are the next turn's context until /reset.
 *
 * The conversation is kept twice: as chat messages (a JSON array of {role, content}) and as
 * plain text (each turn's line, then the answer). A model with a chat template gets the
 * messages, which the router renders with the template (PROTOCOL.md, "Chat"); this command
 * never renders one itself. A model without one gets the text as a completion, which the model
 * continues. Which of the two is decided once: by the model folder when it is known here
 * (--model, or the running group's [group] model: chat_template.jinja, or chat_template in
 * tokenizer_config.json), else by the first turn, sent as a chat: the router's "no chat
 * template" refusal switches the chat to text, said once, and the turn is sent again as text. */
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
            "When the model has a chat template, the conversation goes to the router as chat\n"
            "messages, which it renders with the template; without one (said once) every turn is\n"
            "a completion of the conversation's text. Without --endpoint it talks to the one group\n"
            "this user runs (as `strata client`), else to the one `strata up --demo` serves.\n"
            "\n"
            "  --endpoint E        router endpoint (default: the running group's, or " RC_DEFAULT_ENDPOINT ")\n"
            "  --model DIR         the model folder, to look for its chat template (default: the\n"
            "                      running group's [group] model; with neither, the first turn\n"
            "                      asks the router)\n"
            "  --max-tokens N      tokens an answer may take (default 128)\n"
            "%s"
            "  --stats             print finish reason, usage and timings after each answer\n"
            "  --timeout S         give up on an answer after S seconds (default 300)\n"
            "%s"
            "  -h, --help          this help\n"
            "\n"
            "%s"
            "with the file to check, after 3 seconds (exit 1).\n"
            "\n"
            "Exit codes: 0 ended (Ctrl-D, /quit), 1 runtime failure, 2 bad usage.\n",
            cli_sampling_help, rc_curve_help, rc_curve_note);
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

/* Growing text. */
typedef struct {
    char *s;
    size_t len, cap;
} s_hist_t;

/* The conversation: its text, growing (a turn's answer is appended as it streams), and its
 * messages, with the answer of the turn in progress apart until it is complete. */
typedef struct {
    s_hist_t h;          /* the conversation as text */
    s_hist_t answer;     /* the answer of the turn in progress */
    json_t *msgs;        /* [{role, content}], the complete turns and the pending user line */
    size_t msgs_bytes;   /* content bytes in msgs */
    bool stats;
    bool no_template;    /* the router refused a chat: the model has no chat template */
} s_conv_t;

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

/* Drop the oldest turns (a user message and what follows it up to the next) until the messages'
 * content is at most HISTORY_MAX bytes; the last user message stays. */
static void s_trim_msgs(s_conv_t *v)
{
    while (v->msgs_bytes > HISTORY_MAX && json_array_size(v->msgs) > 1) {
        do {
            v->msgs_bytes -= strlen(json_string_value(json_object_get(json_array_get(v->msgs, 0), "content")));
            json_array_remove(v->msgs, 0);
        } while (json_array_size(v->msgs) > 1 &&
                 strcmp(json_string_value(json_object_get(json_array_get(v->msgs, 0), "role")), "user"));
    }
}

/* Append {role, content: text[0..n)} to the messages. Returns 0, or -1 (text not UTF-8, or no memory). */
static int s_add_msg(s_conv_t *v, const char *role, const char *text, size_t n)
{
    json_t *content = json_stringn(text, n);
    json_t *m = content ? json_pack("{s:s, s:o}", "role", role, "content", content) : NULL;
    if (!m || json_array_append_new(v->msgs, m) < 0) return -1;
    v->msgs_bytes += n;
    return 0;
}

/* Remove the last message (a turn that failed). */
static void s_pop_msg(s_conv_t *v)
{
    size_t n = json_array_size(v->msgs);
    if (!n) return;
    v->msgs_bytes -= strlen(json_string_value(json_object_get(json_array_get(v->msgs, n - 1), "content")));
    json_array_remove(v->msgs, n - 1);
}

static void s_on_tokens(void *ctx, const msg_tokens_t *t)
{
    s_conv_t *v = ctx;
    fwrite(t->text.s, 1, t->text.len, stdout);
    fflush(stdout);
    (void)s_append(&v->h, t->text.s, t->text.len);
    (void)s_append(&v->answer, t->text.s, t->text.len);
}

/* The router's "no chat template" refusal is taken over (the turn goes again as text); any
 * other error is printed by rc_generate. */
static bool s_on_error(void *ctx, const msg_error_t *e)
{
    s_conv_t *v = ctx;
    if (e->code != MSG_E_INVALID_PARAM || !e->message.s || !memmem(e->message.s, e->message.len, "no chat template", 16))
        return false;
    v->no_template = true;
    return true;
}

static void s_on_done(void *ctx, const msg_done_t *d)
{
    s_conv_t *v = ctx;
    printf("\n");
    fflush(stdout);
    if (v->stats)
        fprintf(stderr, "finish=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%.2f total_ms=%.2f\n", msg_finish_name(d->finish),
                d->prompt_tokens, d->completion_tokens, d->ttft_ms, d->total_ms);
}

int cmd_chat(int argc, char **argv)
{
    const char *v, *model_arg = NULL;
    char endpoint[512], model[512] = "";
    bool stats = false;
    int64_t max_tokens = 128;
    float timeout_s = 300.0f;
    sampler_params_t sp;
    sampler_params_default(&sp);
    rc_opts_t ro = {.sp = &sp};
    int r;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = rc_opt(C, argc, argv, &i, &ro))) {
            if (r == 2) return 2;
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
    snprintf(endpoint, sizeof endpoint, "%s", ro.endpoint ? ro.endpoint : RC_DEFAULT_ENDPOINT);
    if (!ro.endpoint && (r = gs_find_router(C, endpoint, sizeof endpoint, model, sizeof model))) return r;
    if (model_arg) snprintf(model, sizeof model, "%s", model_arg);
    /* chat: the conversation goes as messages (the router renders them); else as text */
    bool chat = true;
    if (model[0]) {
        chat = s_has_template(model);
        if (chat)
            fprintf(stderr, "strata chat: %s has a chat template; the router renders each turn with it. /help for the commands.\n",
                    model);
        else
            fprintf(stderr, "strata chat: %s has no chat template; each turn continues the conversation's text. /help for the commands.\n",
                    model);
    } else {
        fprintf(stderr, "strata chat: each turn goes to the router as chat messages, rendered with the model's chat template "
                        "(if it has none, the first turn says so). /help for the commands.\n");
    }

    rc_conn_t *c = NULL;
    int rc = rc_open(&c, C, endpoint, &ro.keys);
    if (rc) return rc;
    s_conv_t cv = {.stats = stats, .msgs = json_array()};
    s_hist_t *const h = &cv.h;
    if (!cv.msgs) {
        cli_error(C, "out of memory");
        rc_close(c);
        return 1;
    }
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
            h->len = 0;
            if (h->s) h->s[0] = 0;
            json_array_clear(cv.msgs);
            cv.msgs_bytes = 0;
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
        if (memchr(line, 0, (size_t)n)) {
            printf("(a line with a NUL byte is not sent)\n");
            continue;
        }
        s_trim(h);
        const size_t h_len0 = h->len;
        if ((h->len && s_append(h, "\n", 1)) || s_append(h, line, (size_t)n) || s_append(h, "\n", 1)) {
            cli_error(C, "out of memory");
            rc = 1;
            break;
        }
        cv.answer.len = 0;
        const rc_cb_t cb = {s_on_tokens, s_on_done, &cv, s_on_error};
        if (chat) {
            if (s_add_msg(&cv, "user", line, (size_t)n) < 0) {
                printf("(the line is not valid UTF-8 and is not sent)\n");
                continue;
            }
            s_trim_msgs(&cv);
            char *js = json_dumps(cv.msgs, JSON_COMPACT);
            if (!js) {
                cli_error(C, "out of memory");
                rc = 1;
                break;
            }
            const rc_req_t q = {.messages = js, .add_generation_prompt = true, .max_tokens = max_tokens, .sp = sp,
                                .stream = true, .timeout_s = timeout_s, .resume_after = 5.0f, .gone_after = 3.0f};
            /* a refused or failed turn is reported, it leaves no trace, and the chat goes on */
            int r2 = rc_generate(c, &q, &cb);
            free(js);
            if (!r2 && s_append(&cv.answer, "", 0) == 0 && s_add_msg(&cv, "assistant", cv.answer.s, cv.answer.len) == 0)
                continue;
            s_pop_msg(&cv);
            if (!cv.no_template) {
                if (h->len >= h_len0) h->s[h->len = h_len0] = 0; /* nor in the text */
                continue;
            }
            /* the router says the model has no chat template: text from now on, this turn too */
            chat = false;
            fprintf(stderr, "strata chat: the model has no chat template; each turn continues the conversation's text.\n");
        }
        s_trim(h);
        const rc_req_t q = {.prompt = h->s, .max_tokens = max_tokens, .sp = sp, .stream = true, .timeout_s = timeout_s,
                            .resume_after = 5.0f, .gone_after = 3.0f};
        (void)rc_generate(c, &q, &cb);
    }
    free(line);
    free(h->s);
    free(cv.answer.s);
    json_decref(cv.msgs);
    rc_close(c);
    return rc;
}
