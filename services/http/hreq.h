/* hreq.h - an OpenAI request body (POST /v1/chat/completions, /v1/completions), parsed and
 * checked into what the router's `generate` takes, without any I/O (fuzzed: tests/fuzz).
 *
 * What is accepted follows OpenAI's API: unknown fields are ignored, a known field of the wrong
 * JSON type is refused, and a known field whose value this engine cannot honour (n > 1,
 * penalties other than 0, logit_bias, echo, several prompts, images, ...) is refused with a
 * message naming it instead of being ignored. Log-probabilities are taken as OpenAI takes them:
 * chat `logprobs` (bool) with `top_logprobs` 0..20, completions `logprobs` 0..5 (the legacy
 * integer); vLLM's `return_tokens_as_token_ids` too. Every refusal is an herr_t: the HTTP status and
 * OpenAI's error fields. */
#ifndef STRATA_HTTP_HREQ_H
#define STRATA_HTTP_HREQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

#define HREQ_MAX_MESSAGES 100000     /* messages in one chat request */
#define HREQ_DEFAULT_COMPLETION_TOKENS 16 /* /v1/completions without max_tokens, as OpenAI's */
#define HREQ_MAX_CHAT_TOP_LOGPROBS 20     /* chat top_logprobs, as OpenAI's */
#define HREQ_MAX_COMPLETION_LOGPROBS 5    /* completions logprobs, as OpenAI's */

typedef enum { HREQ_CHAT = 0, HREQ_COMPLETION } hreq_kind_t;

/* An error as the client sees it: {"error": {"message", "type", "param", "code"}}. */
typedef struct {
    int status;             /* HTTP status */
    const char *type;       /* "invalid_request_error", "authentication_error", "server_error", ... */
    char param[64];         /* the field at fault, "" for none (JSON null) */
    char code[40];          /* "context_length_exceeded", "model_not_found", ...; "" for none */
    char message[512];
} herr_t;

/* A parsed request. Strings and arrays are malloc'd; hreq_free releases them. */
typedef struct {
    hreq_kind_t kind;
    char *model;                /* "model", or NULL when absent */
    char *prompt;               /* completion: the prompt text, or NULL with tokens */
    int32_t *tokens;            /* completion: [n_tokens] token ids, or NULL */
    int32_t n_tokens;
    char *messages;             /* chat: compact JSON of the messages, text parts joined into strings */
    char *template_vars;        /* chat: compact JSON object of tools and chat_template_kwargs, or NULL */
    bool add_generation_prompt; /* chat: default true */
    int32_t max_tokens;         /* 1..MSG_MAX_MAX_TOKENS; the router clamps it to the context */
    float temperature;          /* [0, 2]; default 1 */
    float top_p;                /* (0, 1]; default 1 */
    int32_t top_k;              /* 0 = off */
    bool has_seed;
    uint64_t seed;
    int n_stop;
    char *stop[MSG_MAX_STOP];
    bool stream;
    bool include_usage;         /* stream_options.include_usage */
    bool ignore_eos;            /* vLLM's extension */
    bool logprobs;              /* return the sampled tokens' log-probabilities */
    int32_t top_logprobs;       /* with logprobs: alternatives a token (chat top_logprobs, completions logprobs) */
    bool tokens_as_ids;         /* vLLM's return_tokens_as_token_ids: tokens as "token_id:N" */
} hreq_t;

/* Parse body[len] (not NUL-terminated) as a request of kind. 0 with *q filled (hreq_free it), or
 * -1 with *e filled (400: not JSON, not UTF-8, a wrong type, a value out of range or not
 * supported). */
int hreq_parse(hreq_kind_t kind, const char *body, size_t len, hreq_t *q, herr_t *e);
void hreq_free(hreq_t *q);

/* Fill *e and return -1. */
int herr_set(herr_t *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/* The HTTP status and error fields for a router error of code (busy -> 429, context_overflow ->
 * 400 context_length_exceeded, too_large -> 413, unavailable -> 503, ...), message as given. */
void herr_from_router(herr_t *e, msg_errcode_t code, const char *message, hreq_kind_t kind);

/* The error body {"error": {...}} as malloc'd compact JSON, or NULL when out of memory. */
char *herr_json(const herr_t *e);

#endif
