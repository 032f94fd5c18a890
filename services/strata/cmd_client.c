/* cmd_client.c - `strata client`: send one generate request to a router and stream the
 * answer's text to stdout, over rclient.h's connection (which resumes an answer across a
 * router restart: --resume-after, --gone-after). */
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
            "usage: strata client [--endpoint E] (--prompt TEXT | --tokens IDS) [options]\n"
            "\n"
            "Send one request to a running group's router and stream the answer's text to stdout.\n"
            "Without --endpoint it is the router of the one group this user runs (the groups that\n"
            "`strata up` records; with several it lists them and exits 2), else the one\n"
            "`strata up --demo` serves.\n"
            "\n"
            "  --endpoint E        router endpoint (default " RC_DEFAULT_ENDPOINT ")\n"
            "  --prompt TEXT       prompt text (tokenized by the router)\n"
            "  --tokens IDS        prompt token ids instead, separated by commas or spaces\n"
            "  --max-tokens N      tokens to generate (default 16)\n"
            "%s"
            "  --stop S            stop string (repeat for several; at most %d)\n"
            "  --ids               print the generated token ids (space-separated) instead of text\n"
            "  --no-stream         ask for one final answer instead of a stream\n"
            "  --stats             print finish reason, usage and timings on stderr\n"
            "  --timeout S         give up after S seconds in total (default 300)\n"
            "  --resume-after S    silence after which to reconnect and resume (default 5)\n"
            "  --gone-after S      give up when no router accepts the connection for S seconds (default 3)\n"
            "  -h, --help          this help\n"
            "\n"
            "Exit codes: 0 ok, 1 runtime failure (timeout, busy, unavailable), 2 bad input or usage\n"
            "(including a request the router refused as invalid).\n",
            cli_sampling_help, MSG_MAX_STOP);
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

/* `strata client`; returns the exit code. */
int cmd_client(int argc, char **argv)
{
    const char *prompt = NULL, *tokens_arg = NULL, *v;
    const char *stops[MSG_MAX_STOP];
    int n_stop = 0;
    int64_t max_tokens = 16;
    float timeout_s = 300, resume_after = 5, gone_after = 3;
    bool ids = false, stream = true, stats = false;
    sampler_params_t sp;
    sampler_params_default(&sp);
    char endpoint[512];
    int32_t *tok = NULL, n_tok = 0;
    int rc = 0, r;
    snprintf(endpoint, sizeof endpoint, "%s", RC_DEFAULT_ENDPOINT);
    bool endpoint_given = false;

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
        } else if ((r = cli_opt(C, argc, argv, &i, "--prompt", &v))) {
            if (r < 0) return 2;
            prompt = v;
        } else if ((r = cli_opt(C, argc, argv, &i, "--tokens", &v))) {
            if (r < 0) return 2;
            tokens_arg = v;
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
    if (!prompt == !tokens_arg) {
        cli_error(C, "give exactly one of --prompt and --tokens (see --help)");
        return 2;
    }
    if (tokens_arg && (rc = cli_parse_tokens(C, "--tokens", tokens_arg, &tok, &n_tok))) return rc;
    if (!endpoint_given && (rc = gs_find_router(C, endpoint, sizeof endpoint, NULL, 0))) {
        free(tok);
        return rc;
    }

    rc_conn_t *c = NULL;
    if ((rc = rc_open(&c, C, endpoint))) goto done;
    const rc_req_t q = {.prompt = prompt, .tokens = tok, .n_tokens = n_tok, .max_tokens = max_tokens, .sp = sp,
                        .stops = stops, .n_stop = n_stop, .stream = stream, .timeout_s = timeout_s,
                        .resume_after = resume_after, .gone_after = gone_after};
    s_out_t out = {ids, stream, stats};
    const rc_cb_t cb = {s_on_tokens, s_on_done, &out};
    rc = rc_generate(c, &q, &cb);
done:
    free(tok);
    rc_close(c);
    return rc;
}
