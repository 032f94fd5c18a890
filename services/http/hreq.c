/* hreq.c - OpenAI request bodies, parsed and checked (see hreq.h).
 *
 * JSON null counts as absent for every optional field, as OpenAI's API takes it. Numbers are
 * checked as JSON numbers (an integer field refuses 1.5 and "1"); ranges are OpenAI's where
 * they are narrower than the router's (temperature [0, 2]). */
#include "services/http/hreq.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int herr_set(herr_t *e, int status, const char *type, const char *param, const char *code, const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof e->message) { /* cut: never inside a UTF-8 sequence */
        size_t k = strlen(e->message);
        size_t cont = 0;
        while (k > 0 && ((unsigned char)e->message[k - 1] & 0xC0) == 0x80) k--, cont++;
        if (k > 0 && (unsigned char)e->message[k - 1] >= 0xC0) {
            unsigned char lead = (unsigned char)e->message[k - 1];
            size_t need = lead >= 0xF0 ? 3 : lead >= 0xE0 ? 2 : 1;
            if (cont < need) e->message[k - 1] = 0;
        }
    }
    return -1;
}

#define BAD(param, ...) herr_set(e, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define UNSUPPORTED(param, ...) herr_set(e, 400, "invalid_request_error", param, "unsupported_parameter", __VA_ARGS__)

static const char *s_jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* The field key of o, NULL when absent or null. */
static json_t *s_get(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int s_wrong(herr_t *e, const char *key, const char *want, const json_t *v)
{
    return BAD(key, "'%s' must be %s, got %s", key, want, s_jtype(v));
}

/* Optional number in [lo, hi] into *out (untouched when absent). */
static int s_num(json_t *o, const char *key, double lo, double hi, double *out, herr_t *e)
{
    json_t *v = s_get(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return s_wrong(e, key, "a number", v);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) return BAD(key, "'%s' must be in [%g, %g], got %g", key, lo, hi, d);
    *out = d;
    return 0;
}

/* Optional integer in [lo, hi] into *out; *given says whether it was there. */
static int s_intf(json_t *o, const char *key, long long lo, long long hi, long long *out, bool *given, herr_t *e)
{
    json_t *v = s_get(o, key);
    if (given) *given = v != NULL;
    if (!v) return 0;
    if (!json_is_integer(v)) return s_wrong(e, key, "an integer", v);
    long long n = json_integer_value(v);
    if (n < lo || n > hi) return BAD(key, "'%s' must be in [%lld, %lld], got %lld", key, lo, hi, n);
    *out = n;
    return 0;
}

static int s_boolf(json_t *o, const char *key, bool *out, herr_t *e)
{
    json_t *v = s_get(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return s_wrong(e, key, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

static int s_strf(json_t *o, const char *key, const char **out, herr_t *e)
{
    json_t *v = s_get(o, key);
    *out = NULL;
    if (!v) return 0;
    if (!json_is_string(v)) return s_wrong(e, key, "a string", v);
    *out = json_string_value(v);
    return 0;
}

static int s_stop(json_t *o, hreq_t *q, herr_t *e)
{
    json_t *v = s_get(o, "stop");
    if (!v) return 0;
    json_t *one[1] = {v};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > MSG_MAX_STOP) return BAD("stop", "'stop' may hold at most %d strings, got %zu", MSG_MAX_STOP, n);
        items = NULL;
    } else if (!json_is_string(v)) {
        return s_wrong(e, "stop", "a string or an array of strings", v);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = items ? items[i] : json_array_get(v, i);
        if (!json_is_string(s)) return BAD("stop", "'stop[%zu]' must be a string, got %s", i, s_jtype(s));
        size_t len = json_string_length(s);
        if (len == 0) return BAD("stop", "'stop' strings may not be empty");
        if (len > MSG_MAX_STOP_LEN) return BAD("stop", "a 'stop' string may have at most %d bytes, got %zu", MSG_MAX_STOP_LEN, len);
        if (memchr(json_string_value(s), 0, len)) return BAD("stop", "a 'stop' string may not hold NUL");
        if (!(q->stop[q->n_stop++] = strdup(json_string_value(s)))) return herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return 0;
}

/* The message's content as one string: a string as it is, an array of text parts joined by
 * newlines (as vLLM does); NULL for null. -1 on an unsupported part. */
static int s_content(json_t *c, size_t i, json_t **out, herr_t *e)
{
    *out = NULL;
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c)) return BAD("messages", "'messages[%zu].content' must be a string or an array of parts, got %s", i, s_jtype(c));
    size_t n = json_array_size(c), total = 0;
    for (size_t k = 0; k < n; k++) {
        json_t *p = json_array_get(c, k), *t = json_is_object(p) ? json_object_get(p, "type") : NULL;
        if (!json_is_object(p) || !json_is_string(t))
            return BAD("messages", "'messages[%zu].content[%zu]' must be an object with a string 'type'", i, k);
        if (strcmp(json_string_value(t), "text"))
            return UNSUPPORTED("messages", "'messages[%zu].content[%zu]': content parts of type '%s' are not supported (text only)", i,
                               k, json_string_value(t));
        json_t *tx = json_object_get(p, "text");
        if (!json_is_string(tx)) return BAD("messages", "'messages[%zu].content[%zu].text' must be a string", i, k);
        total += json_string_length(tx) + 1;
    }
    char *buf = malloc(total + 1);
    if (!buf) return herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
    size_t at = 0;
    for (size_t k = 0; k < n; k++) {
        json_t *tx = json_object_get(json_array_get(c, k), "text");
        if (k) buf[at++] = '\n';
        memcpy(buf + at, json_string_value(tx), json_string_length(tx));
        at += json_string_length(tx);
    }
    *out = json_stringn_nocheck(buf, at);
    free(buf);
    return *out ? 0 : herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

static int s_messages(json_t *o, hreq_t *q, herr_t *e)
{
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    json_t *v = s_get(o, "messages");
    if (!v) return BAD("messages", "'messages' is required");
    if (!json_is_array(v)) return s_wrong(e, "messages", "an array of message objects", v);
    size_t n = json_array_size(v);
    if (n == 0) return BAD("messages", "'messages' is empty");
    if (n > HREQ_MAX_MESSAGES) return BAD("messages", "'messages' may hold at most %d messages, got %zu", HREQ_MAX_MESSAGES, n);
    json_t *out = json_array();
    if (!out) return herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *m = json_array_get(v, i);
        if (!json_is_object(m)) {
            rc = BAD("messages", "'messages[%zu]' must be an object, got %s", i, s_jtype(m));
            break;
        }
        json_t *role = json_object_get(m, "role");
        if (!json_is_string(role)) {
            rc = BAD("messages", "'messages[%zu].role' must be a string", i);
            break;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof roles / sizeof roles[0]; k++) known |= !strcmp(json_string_value(role), roles[k]);
        if (!known) {
            rc = BAD("messages", "'messages[%zu].role' must be one of system, developer, user, assistant, tool, function; got '%.40s'",
                     i, json_string_value(role));
            break;
        }
        json_t *content = NULL;
        if ((rc = s_content(json_object_get(m, "content"), i, &content, e))) break;
        bool is_assistant = !strcmp(json_string_value(role), "assistant");
        if (!content && !is_assistant) {
            rc = BAD("messages", "'messages[%zu].content' is required for role '%s'", i, json_string_value(role));
            break;
        }
        json_t *copy = json_copy(m);
        if (!copy || json_object_set_new(copy, "content", content ? content : json_null()) || json_array_append_new(out, copy)) {
            json_decref(copy);
            rc = herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
        }
    }
    if (rc == 0 && !(q->messages = json_dumps(out, JSON_COMPACT))) rc = herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
    json_decref(out);
    return rc;
}

/* tools and chat_template_kwargs, for the template. */
static int s_template_vars(json_t *o, hreq_t *q, herr_t *e)
{
    json_t *tools = s_get(o, "tools"), *kw = s_get(o, "chat_template_kwargs"), *tc = s_get(o, "tool_choice");
    if (tools && !json_is_array(tools)) return s_wrong(e, "tools", "an array", tools);
    if (kw && !json_is_object(kw)) return s_wrong(e, "chat_template_kwargs", "an object", kw);
    if (tc) {
        if (!json_is_string(tc) && !json_is_object(tc)) return s_wrong(e, "tool_choice", "a string or an object", tc);
        if (!json_is_string(tc) || (strcmp(json_string_value(tc), "none") && strcmp(json_string_value(tc), "auto")))
            return UNSUPPORTED("tool_choice", "'tool_choice' may only be \"none\" or \"auto\": tool calls are not parsed from the output");
    }
    if (!tools && !kw) return 0;
    json_t *vars = kw ? json_deep_copy(kw) : json_object();
    if (!vars || (tools && json_object_set(vars, "tools", tools))) {
        json_decref(vars);
        return herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    q->template_vars = json_dumps(vars, JSON_COMPACT);
    json_decref(vars);
    return q->template_vars ? 0 : herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
}

static int s_token_array(json_t *a, hreq_t *q, herr_t *e)
{
    size_t n = json_array_size(a);
    if (n == 0) return BAD("prompt", "'prompt' is empty");
    if (n > MSG_MAX_TOKENS_ARRAY) return BAD("prompt", "'prompt' has %zu token ids, at most %d allowed", n, MSG_MAX_TOKENS_ARRAY);
    q->tokens = malloc(n * sizeof *q->tokens);
    if (!q->tokens) return herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t)) return BAD("prompt", "'prompt[%zu]' must be a token id (an integer), got %s", i, s_jtype(t));
        long long id = json_integer_value(t);
        if (id < 0 || id > INT32_MAX) return BAD("prompt", "'prompt[%zu]': token id %lld is out of range", i, id);
        q->tokens[i] = (int32_t)id;
    }
    q->n_tokens = (int32_t)n;
    return 0;
}

static int s_prompt(json_t *o, hreq_t *q, herr_t *e)
{
    json_t *v = s_get(o, "prompt");
    if (!v) return BAD("prompt", "'prompt' is required");
    if (json_is_array(v) && json_array_size(v) == 1 && (json_is_string(json_array_get(v, 0)) || json_is_array(json_array_get(v, 0))))
        v = json_array_get(v, 0); /* a list of one prompt */
    if (json_is_string(v)) {
        if (json_string_length(v) == 0) return BAD("prompt", "'prompt' is empty");
        if (memchr(json_string_value(v), 0, json_string_length(v))) return BAD("prompt", "'prompt' may not hold NUL");
        q->prompt = strdup(json_string_value(v));
        return q->prompt ? 0 : herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (!json_is_array(v)) return s_wrong(e, "prompt", "a string, an array of token ids or a list of one of those", v);
    json_t *first = json_array_get(v, 0);
    if (first && (json_is_string(first) || json_is_array(first)))
        return UNSUPPORTED("prompt", "'prompt' holds %zu prompts; send one prompt per request", json_array_size(v));
    return s_token_array(v, q, e);
}

/* Log-probabilities: chat logprobs (bool) + top_logprobs (0..20); completions logprobs (0..5:
 * the sampled token's and that many alternatives); return_tokens_as_token_ids. */
static int s_logprobs(json_t *o, hreq_t *q, herr_t *e)
{
    long long n = 0;
    bool given = false;
    if (q->kind == HREQ_COMPLETION) {
        if (s_intf(o, "logprobs", 0, HREQ_MAX_COMPLETION_LOGPROBS, &n, &given, e)) return -1;
        q->logprobs = given;
    } else {
        if (s_boolf(o, "logprobs", &q->logprobs, e)) return -1;
        if (s_intf(o, "top_logprobs", 0, HREQ_MAX_CHAT_TOP_LOGPROBS, &n, &given, e)) return -1;
        if (n > 0 && !q->logprobs) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs' to be true");
    }
    q->top_logprobs = (int32_t)n;
    return s_boolf(o, "return_tokens_as_token_ids", &q->tokens_as_ids, e);
}

/* Fields that ask for what this engine does not do: refused rather than ignored. */
static int s_unsupported(json_t *o, hreq_kind_t kind, herr_t *e)
{
    long long n = 1;
    double pen = 0;
    bool b = false;
    if (s_intf(o, "n", 1, 128, &n, NULL, e)) return -1;
    if (n != 1) return UNSUPPORTED("n", "'n' must be 1: one choice per request");
    if (kind == HREQ_COMPLETION) {
        if (s_intf(o, "best_of", 1, 128, &n, NULL, e)) return -1;
        if (n != 1) return UNSUPPORTED("best_of", "'best_of' must be 1");
        if (s_boolf(o, "echo", &b, e)) return -1;
        if (b) return UNSUPPORTED("echo", "'echo' is not supported");
        const char *suffix;
        if (s_strf(o, "suffix", &suffix, e)) return -1;
        if (suffix && *suffix) return UNSUPPORTED("suffix", "'suffix' is not supported");
    } else {
        json_t *rf = s_get(o, "response_format");
        if (rf) {
            json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
            if (!json_is_string(t)) return BAD("response_format", "'response_format' must be an object with a string 'type'");
            if (strcmp(json_string_value(t), "text"))
                return UNSUPPORTED("response_format", "'response_format' of type '%s' is not supported (only text)", json_string_value(t));
        }
    }
    static const char *const pens[] = {"presence_penalty", "frequency_penalty"};
    for (int i = 0; i < 2; i++) {
        pen = 0;
        if (s_num(o, pens[i], -2, 2, &pen, e)) return -1;
        if (pen != 0) return UNSUPPORTED(pens[i], "'%s' is not supported; only 0 is accepted", pens[i]);
    }
    pen = 1;
    if (s_num(o, "repetition_penalty", 0, 100, &pen, e)) return -1;
    if (pen != 1) return UNSUPPORTED("repetition_penalty", "'repetition_penalty' is not supported; only 1 is accepted");
    json_t *lb = s_get(o, "logit_bias");
    if (lb && !json_is_object(lb)) return s_wrong(e, "logit_bias", "an object", lb);
    if (lb && json_object_size(lb)) return UNSUPPORTED("logit_bias", "'logit_bias' is not supported");
    const char *user;
    if (s_strf(o, "user", &user, e)) return -1;
    return 0;
}

int hreq_parse(hreq_kind_t kind, const char *body, size_t len, hreq_t *q, herr_t *e)
{
    memset(q, 0, sizeof *q);
    q->kind = kind;
    q->temperature = 1.0f;
    q->top_p = 1.0f;
    q->add_generation_prompt = true;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return BAD(NULL, "the body is not valid JSON: %s (at byte %d)", je.text, je.position);
    int rc = -1;
    if (!json_is_object(o)) {
        BAD(NULL, "the body must be a JSON object, got %s", s_jtype(o));
        goto done;
    }
    const char *model;
    if (s_strf(o, "model", &model, e)) goto done;
    if (model && !(q->model = strdup(model))) goto nomem;
    if (kind == HREQ_CHAT) {
        if (s_messages(o, q, e) || s_template_vars(o, q, e) || s_boolf(o, "add_generation_prompt", &q->add_generation_prompt, e))
            goto done;
    } else if (s_prompt(o, q, e)) {
        goto done;
    }
    if (s_unsupported(o, kind, e) || s_logprobs(o, q, e)) goto done;
    long long mt = 0, mct = 0;
    bool has_mt = false, has_mct = false;
    if (s_intf(o, "max_tokens", 1, INT64_MAX, &mt, &has_mt, e)) goto done;
    if (kind == HREQ_CHAT && s_intf(o, "max_completion_tokens", 1, INT64_MAX, &mct, &has_mct, e)) goto done;
    if (has_mct) mt = mct, has_mt = true;
    if (!has_mt) mt = kind == HREQ_CHAT ? MSG_MAX_MAX_TOKENS : HREQ_DEFAULT_COMPLETION_TOKENS;
    q->max_tokens = mt > MSG_MAX_MAX_TOKENS ? MSG_MAX_MAX_TOKENS : (int32_t)mt; /* the router clamps it to the context */
    double t = 1, p = 1;
    if (s_num(o, "temperature", 0, 2, &t, e) || s_num(o, "top_p", 0, 1, &p, e)) goto done;
    q->temperature = (float)t;
    q->top_p = (float)p;
    if (p == 0) { /* the smallest nucleus: the most likely token */
        q->temperature = 0;
        q->top_p = 1;
    }
    long long k = 0;
    if (s_intf(o, "top_k", -1, MSG_MAX_TOP_K, &k, NULL, e)) goto done;
    q->top_k = k < 0 ? 0 : (int32_t)k;
    json_t *seed = s_get(o, "seed");
    if (seed) {
        if (!json_is_integer(seed)) {
            s_wrong(e, "seed", "an integer", seed);
            goto done;
        }
        q->has_seed = true;
        q->seed = (uint64_t)json_integer_value(seed);
    }
    if (s_stop(o, q, e)) goto done;
    if (s_boolf(o, "stream", &q->stream, e) || s_boolf(o, "ignore_eos", &q->ignore_eos, e)) goto done;
    json_t *so = s_get(o, "stream_options");
    if (so) {
        if (!json_is_object(so)) {
            s_wrong(e, "stream_options", "an object", so);
            goto done;
        }
        if (!q->stream) {
            BAD("stream_options", "'stream_options' is only allowed when 'stream' is true");
            goto done;
        }
        if (s_boolf(so, "include_usage", &q->include_usage, e)) goto done;
    }
    rc = 0;
    goto done;
nomem:
    herr_set(e, 500, "server_error", NULL, NULL, "out of memory");
done:
    json_decref(o);
    if (rc < 0) hreq_free(q);
    return rc;
}

void hreq_free(hreq_t *q)
{
    free(q->model);
    free(q->prompt);
    free(q->tokens);
    free(q->messages);
    free(q->template_vars);
    for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
    memset(q, 0, sizeof *q);
}

void herr_from_router(herr_t *e, msg_errcode_t code, const char *message, hreq_kind_t kind)
{
    switch (code) {
    case MSG_E_CONTEXT_OVERFLOW:
        herr_set(e, 400, "invalid_request_error", kind == HREQ_CHAT ? "messages" : "prompt", "context_length_exceeded", "%s", message);
        break;
    case MSG_E_TOO_LARGE: herr_set(e, 413, "invalid_request_error", NULL, "request_too_large", "%s", message); break;
    case MSG_E_BUSY: herr_set(e, 429, "rate_limit_error", NULL, "rate_limit_exceeded", "%s", message); break;
    case MSG_E_UNAVAILABLE:
    case MSG_E_SHUTTING_DOWN: herr_set(e, 503, "server_error", NULL, "service_unavailable", "%s", message); break;
    case MSG_E_MALFORMED:
    case MSG_E_WRONG_TYPE:
    case MSG_E_UNKNOWN_FIELD:
    case MSG_E_MISSING_FIELD:
    case MSG_E_INVALID_PARAM: herr_set(e, 400, "invalid_request_error", NULL, NULL, "%s", message); break;
    default: herr_set(e, 500, "server_error", NULL, NULL, "%s", message); break;
    }
}

char *herr_json(const herr_t *e)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->message, "type", e->type ? e->type : "server_error",
                          "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code[0] ? json_string(e->code) : json_null());
    if (!o) { /* a message that is not UTF-8 (cannot happen: every message is built here) */
        return strdup("{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}
