/* fuzz_http_request.c - libFuzzer target for strata-http's request parser (services/http/hreq.c):
 * the first byte picks chat or completion, the rest is the body. A body that parses is one the
 * router's generate schema takes (it encodes, and decodes back); every refusal is a 4xx or 5xx
 * with a message, and its error JSON is valid. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/msg.h"
#include "services/http/hreq.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 16) return 0;
    hreq_kind_t kind = data[0] & 1 ? HREQ_CHAT : HREQ_COMPLETION;
    hreq_t q;
    herr_t e;
    if (hreq_parse(kind, (const char *)data + 1, size - 1, &q, &e) < 0) {
        if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type) abort();
        char *j = herr_json(&e);
        json_t *o = j ? json_loads(j, 0, NULL) : NULL;
        if (!o || !json_is_string(json_object_get(json_object_get(o, "error"), "message"))) abort();
        json_decref(o);
        free(j);
        return 0;
    }
    if (q.max_tokens < 1 || q.max_tokens > MSG_MAX_MAX_TOKENS || q.n_stop < 0 || q.n_stop > MSG_MAX_STOP) abort();
    if (!(q.temperature >= 0 && q.temperature <= 2) || !(q.top_p > 0 && q.top_p <= 1) || q.top_k < 0) abort();
    if (kind == HREQ_CHAT) {
        json_t *m = q.messages ? json_loads(q.messages, 0, NULL) : NULL;
        if (!json_is_array(m) || json_array_size(m) == 0) abort();
        json_decref(m);
    } else if (!q.prompt == !q.tokens) {
        abort();
    }
    msg_str_t stops[MSG_MAX_STOP];
    for (int i = 0; i < q.n_stop; i++) stops[i] = msg_str(q.stop[i]);
    msg_t m;
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = 1;
    msg_generate_t *g = &m.u.generate;
    g->prompt = msg_str(q.prompt);
    g->tokens = q.tokens;
    g->n_tokens = q.n_tokens;
    g->messages = msg_str(q.messages);
    g->template_vars = msg_str(q.template_vars);
    g->add_generation_prompt = q.add_generation_prompt;
    g->max_tokens = q.max_tokens;
    g->samp.temperature = q.temperature;
    g->samp.top_p = q.top_p;
    g->samp.top_k = q.top_k;
    g->samp.seed = q.seed;
    g->stop = stops;
    g->n_stop = q.n_stop;
    g->stream = q.stream;
    msg_buf_t b = {0};
    if (msg_encode(&m, &b) < 0) abort(); /* what the parser lets through, the router's schema takes */
    msg_t back;
    msg_err_t err;
    if (msg_decode(MSG_FAM_CLIENT, b.data, b.size, &back, &err) < 0) abort();
    msg_free(&back);
    msg_buf_free(&b);
    hreq_free(&q);
    return 0;
}
