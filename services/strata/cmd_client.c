/* cmd_client.c - `strata client`: send one generate request to a router and stream the
 * answer's text to stdout, over rclient.h's connection (which resumes an answer across a
 * router restart: --resume-after, --gone-after). With --messages the request is a chat: the
 * JSON is checked here (an array of objects) and sent as it is; the router renders it with the
 * model's chat template. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/msg.h"
#include "services/strata/cli_util.h"
#include "services/strata/group_state.h"
#include "services/strata/rclient.h"

static const char *const C = "client";

static void s_help(FILE *f)
{
    fprintf(f,
            "usage: strata client [--endpoint E] (--prompt TEXT | --tokens IDS | --messages FILE) [options]\n"
            "\n"
            "Send one request to a running group's router and stream the answer's text to stdout.\n"
            "With --messages it is a chat, which the router renders with the model's chat template\n"
            "(a model without one refuses it: exit 2).\n"
            "Without --endpoint it is the router of the one group this user runs (the groups that\n"
            "`strata up` records; with several it lists them and exits 2), else the one\n"
            "`strata up --demo` serves.\n"
            "\n"
            "  --endpoint E        router endpoint (default " RC_DEFAULT_ENDPOINT ")\n"
            "  --prompt TEXT       prompt text (tokenized by the router)\n"
            "  --tokens IDS        prompt token ids instead, separated by commas or spaces\n"
            "  --messages FILE     a chat instead: a JSON array of OpenAI-style messages\n"
            "                      ([{\"role\": \"user\", \"content\": \"...\"}, ...]); - reads stdin\n"
            "  --template-vars JSON  (with --messages) a JSON object of further template variables\n"
            "                      (e.g. '{\"enable_thinking\": false}')\n"
            "  --no-add-generation-prompt  (with --messages) render without the assistant turn's\n"
            "                      opening (add_generation_prompt=false; --add-generation-prompt,\n"
            "                      the default, asks for it)\n"
            "  --max-tokens N      tokens to generate (default 16)\n"
            "%s"
            "  --stop S            stop string (repeat for several; at most %d)\n"
            "  --ids               print the generated token ids (space-separated) instead of text\n"
            "  --no-stream         ask for one final answer instead of a stream\n"
            "  --stats             print finish reason, usage and timings on stderr\n"
            "  --timeout S         give up after S seconds in total (default 300)\n"
            "  --resume-after S    silence after which to reconnect and resume (default 5)\n"
            "  --gone-after S      give up when no router accepts the connection for S seconds (default 3)\n"
            "%s"
            "  -h, --help          this help\n"
            "\n"
            "%s"
            "with the file to check, after --gone-after seconds (exit 1).\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure (timeout, busy, unavailable), 2 bad input or usage\n"
            "(including a request the router refused as invalid).\n",
            cli_sampling_help, MSG_MAX_STOP, rc_curve_help, rc_curve_note);
}

/* How the answer is printed: text as it streams, or with --ids the token ids. */
typedef struct {
    bool ids, stream, stats;
} s_out_t;

static void s_on_tokens(void *ctx, const msg_tokens_t *t)
{
    const s_out_t *o = ctx;
    if (o->ids)
        for (int32_t i = 0; i < t->n_tokens; i++) printf("%s%d", t->index + i ? " " : "", t->tokens[i]);
    else fwrite(t->text.s, 1, t->text.len, stdout);
    fflush(stdout);
}

static void s_on_done(void *ctx, const msg_done_t *d)
{
    const s_out_t *o = ctx;
    if (!o->stream) {
        if (o->ids)
            for (int32_t i = 0; i < d->n_tokens; i++) printf("%s%d", i ? " " : "", d->tokens[i]);
        else if (d->text.s)
            fwrite(d->text.s, 1, d->text.len, stdout);
    }
    printf("\n");
    fflush(stdout);
    if (o->stats)
        fprintf(stderr, "finish=%s prompt_tokens=%d completion_tokens=%d queue_ms=%.2f ttft_ms=%.2f total_ms=%.2f\n",
                msg_finish_name(d->finish), d->prompt_tokens, d->completion_tokens, d->queue_ms, d->ttft_ms, d->total_ms);
}

/* The whole of path ("-": stdin) as a malloc'd NUL-terminated string in *out. Returns 0 or 2
 * (message printed). */
static int s_read_text(const char *path, char **out)
{
    *out = NULL;
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        cli_error(C, "--messages: cannot open %s: %s", path, strerror(errno));
        return 2;
    }
    size_t len = 0, cap = 4096;
    char *s = malloc(cap);
    while (s) {
        if (len + 1 >= cap) {
            char *t = realloc(s, cap * 2);
            if (!t) break;
            s = t;
            cap *= 2;
        }
        size_t n = fread(s + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) break;
    }
    const bool bad = !s || ferror(f);
    if (f != stdin) fclose(f);
    if (bad) {
        cli_error(C, "--messages: cannot read %s%s", strcmp(path, "-") ? path : "stdin", s ? "" : ": out of memory");
        free(s);
        return 2;
    }
    s[len] = 0;
    if (strlen(s) != len) {
        cli_error(C, "--messages: %s holds a NUL byte", strcmp(path, "-") ? path : "stdin");
        free(s);
        return 2;
    }
    *out = s;
    return 0;
}

/* Check text (from `what`) is JSON of the given type (JSON_ARRAY of objects, or JSON_OBJECT).
 * Returns 0 or 2 (message printed, with the line and column of a syntax error). */
static int s_check_json(const char *flag, const char *what, const char *text, json_type type)
{
    json_error_t je;
    json_t *v = json_loads(text, 0, &je);
    if (!v) {
        cli_error(C, "%s: %s is not valid JSON: %s (line %d, column %d)", flag, what, je.text, je.line, je.column);
        return 2;
    }
    int rc = 0;
    if (json_typeof(v) != type) {
        cli_error(C, "%s: %s is not a JSON %s", flag, what,
                  type == JSON_ARRAY ? "array of messages ([{\"role\": ..., \"content\": ...}, ...])" : "object");
        rc = 2;
    } else if (type == JSON_ARRAY) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_object(e) || !json_is_string(json_object_get(e, "role"))) {
                cli_error(C, "%s: %s: message %zu is not an object with a string \"role\"", flag, what, i);
                rc = 2;
                break;
            }
        }
    }
    json_decref(v);
    return rc;
}

/* `strata client`; returns the exit code. */
int cmd_client(int argc, char **argv)
{
    const char *prompt = NULL, *tokens_arg = NULL, *messages_arg = NULL, *template_vars = NULL, *v;
    char *messages = NULL;
    bool add_generation_prompt = true;
    const char *stops[MSG_MAX_STOP];
    int n_stop = 0;
    int64_t max_tokens = 16;
    float timeout_s = 300, resume_after = 5, gone_after = 3;
    bool ids = false, stream = true, stats = false;
    sampler_params_t sp;
    sampler_params_default(&sp);
    rc_opts_t ro = {.sp = &sp};
    char endpoint[512];
    int32_t *tok = NULL, n_tok = 0;
    int rc = 0, r;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            s_help(stdout);
            return 0;
        }
        if ((r = rc_opt(C, argc, argv, &i, &ro))) {
            if (r == 2) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--prompt", &v))) {
            if (r < 0) return 2;
            prompt = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--tokens", &v))) {
            if (r < 0) return 2;
            tokens_arg = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--messages", &v))) {
            if (r < 0) return 2;
            messages_arg = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--template-vars", &v))) {
            if (r < 0) return 2;
            template_vars = v;
        } else if (!strcmp(argv[i], "--add-generation-prompt")) {
            add_generation_prompt = true;
        } else if (!strcmp(argv[i], "--no-add-generation-prompt")) {
            add_generation_prompt = false;
        } else if ((r = cli_opt(C, argc, argv, &i, "--max-tokens", &v))) {
            if (r < 0 || cli_parse_i64(C, "--max-tokens", v, 1, MSG_MAX_MAX_TOKENS, &max_tokens)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--stop", &v))) {
            if (r < 0) return 2;
            if (n_stop == MSG_MAX_STOP || !v[0] || strlen(v) > MSG_MAX_STOP_LEN) {
                cli_error(C, "--stop: at most %d non-empty strings of at most %d bytes", MSG_MAX_STOP, MSG_MAX_STOP_LEN);
                return 2;
            }
            stops[n_stop++] = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--timeout", &v))) {
            if (r < 0 || cli_parse_f32(C, "--timeout", v, 0.1f, 1e6f, &timeout_s)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--resume-after", &v))) {
            if (r < 0 || cli_parse_f32(C, "--resume-after", v, 0.1f, 1e6f, &resume_after)) return 2;
        } else if ((r = cli_opt(C, argc, argv, &i, "--gone-after", &v))) {
            if (r < 0 || cli_parse_f32(C, "--gone-after", v, 0.1f, 1e6f, &gone_after)) return 2;
        } else if (!strcmp(argv[i], "--ids")) {
            ids = true;
        } else if (!strcmp(argv[i], "--no-stream")) {
            stream = false;
        } else if (!strcmp(argv[i], "--stats")) {
            stats = true;
        } else {
            cli_error(C, "unexpected argument '%s' (see --help)", argv[i]);
            return 2;
        }
    }
    if ((prompt != NULL) + (tokens_arg != NULL) + (messages_arg != NULL) != 1) {
        cli_error(C, "give exactly one of --prompt, --tokens and --messages (see --help)");
        return 2;
    }
    if (template_vars && !messages_arg) {
        cli_error(C, "--template-vars goes with --messages");
        return 2;
    }
    if (template_vars && (rc = s_check_json("--template-vars", "the value", template_vars, JSON_OBJECT))) return rc;
    if (messages_arg) {
        if ((rc = s_read_text(messages_arg, &messages))) return rc;
        if ((rc = s_check_json("--messages", strcmp(messages_arg, "-") ? messages_arg : "stdin", messages, JSON_ARRAY))) {
            free(messages);
            return rc;
        }
    }
    if (tokens_arg && (rc = cli_parse_tokens(C, "--tokens", tokens_arg, &tok, &n_tok))) return rc;
    rc_conn_t *c = NULL;
    snprintf(endpoint, sizeof endpoint, "%s", ro.endpoint ? ro.endpoint : RC_DEFAULT_ENDPOINT);
    if (!ro.endpoint && (rc = gs_find_router(C, endpoint, sizeof endpoint, NULL, 0))) goto done;

    if ((rc = rc_open(&c, C, endpoint, &ro.keys))) goto done;
    const rc_req_t q = {.prompt = prompt, .tokens = tok, .n_tokens = n_tok, .messages = messages,
                        .template_vars = template_vars, .add_generation_prompt = add_generation_prompt,
                        .max_tokens = max_tokens, .sp = sp,
                        .stops = stops, .n_stop = n_stop, .stream = stream, .timeout_s = timeout_s,
                        .resume_after = resume_after, .gone_after = gone_after};
    s_out_t out = {ids, stream, stats};
    const rc_cb_t cb = {s_on_tokens, s_on_done, &out};
    rc = rc_generate(c, &q, &cb);
done:
    free(tok);
    free(messages);
    rc_close(c);
    return rc;
}
