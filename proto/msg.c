/* msg.c - msgpack codecs of every control-plane message (see msg.h, PROTOCOL.md).
 *
 * Both directions are driven by one table per message type (s_types): a list of fields with
 * their wire name, kind, place in the body struct and schema range. The decoder and the
 * encoder walk the same table, so what one emits the other accepts, and every range check
 * is written once.
 *
 * Decoding outside input safely: msgpack-c's unpacker allocates
 * n * sizeof(msgpack_object) as soon as it reads an array or map header, before it knows
 * whether n elements follow; a 5-byte frame claiming 2^32 elements would ask for ~100 GB.
 * s_scan() therefore walks the frame first, without allocating, and refuses any header whose
 * count exceeds the bytes left (every element takes at least one byte) and any nesting
 * deeper than MSG_MAX_DEPTH. Once it passes, the unpacker allocates at most ~24 bytes per
 * input byte.
 */
#include "proto/msg.h"

#include <math.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- decoded-message memory: a chain of bump chunks, freed at once by msg_free ---- */

struct msg_mem {
    struct msg_mem *next;
    size_t used, cap;    /* bytes of data[] */
    _Alignas(16) char data[];
};

static void *s_alloc(msg_t *m, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    msg_mem_t *c = m->mem;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 4096 ? n : 4096;
        c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = m->mem;
        c->used = 0;
        c->cap = cap;
        m->mem = c;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

/* Start the chain with an empty chunk of cap bytes (decoders size it from the frame). */
static int s_reserve(msg_t *m, size_t cap)
{
    msg_mem_t *c = malloc(sizeof *c + cap);
    if (!c) return STRATA_ENOMEM;
    c->next = m->mem;
    c->used = 0;
    c->cap = cap;
    m->mem = c;
    return 0;
}

void msg_init(msg_t *m, msg_type_t type)
{
    memset(m, 0, sizeof *m);
    m->type = type;
    switch (type) {
    case MSG_GENERATE:
        m->u.generate.samp.top_p = 1.0f;
        m->u.generate.stream = true;
        m->u.generate.add_generation_prompt = true;
        break;
    case MSG_RESUME: m->u.resume.stream = true; break;
    case MSG_SUBMIT: m->u.submit.samp.top_p = 1.0f; break;
    case MSG_SCHED_HELLO_REPLY:
    case MSG_EXEC_HELLO_REPLY:
        m->u.hello.bos_id = -1;
        m->u.hello.eos_id = -1;
        break;
    default: break;
    }
}

void msg_free(msg_t *m)
{
    msg_mem_t *c = m->mem;
    while (c) {
        msg_mem_t *n = c->next;
        free(c);
        c = n;
    }
    memset(m, 0, sizeof *m);
}

int32_t msg_hello_eos(const msg_hello_t *h, int32_t *ids)
{
    if (h->eos_ids) {
        STRATA_ASSERT(h->n_eos >= 1 && h->n_eos <= MSG_MAX_EOS); /* the decoder and encoder check it */
        memcpy(ids, h->eos_ids, (size_t)h->n_eos * sizeof *ids);
        return h->n_eos;
    }
    if (h->eos_id < 0) return 0;
    ids[0] = h->eos_id;
    return 1;
}

/* ---- names ---- */

static const char *const s_errnames[MSG_E_COUNT] = {
    [MSG_E_NONE] = "none",
    [MSG_E_MALFORMED] = "malformed",
    [MSG_E_BAD_VERSION] = "bad_version",
    [MSG_E_UNKNOWN_TYPE] = "unknown_type",
    [MSG_E_WRONG_TYPE] = "wrong_type",
    [MSG_E_UNKNOWN_FIELD] = "unknown_field",
    [MSG_E_MISSING_FIELD] = "missing_field",
    [MSG_E_INVALID_PARAM] = "invalid_param",
    [MSG_E_TOO_LARGE] = "too_large",
    [MSG_E_CONTEXT_OVERFLOW] = "context_overflow",
    [MSG_E_BUSY] = "busy",
    [MSG_E_NOT_FOUND] = "not_found",
    [MSG_E_DUPLICATE] = "duplicate",
    [MSG_E_UNAVAILABLE] = "unavailable",
    [MSG_E_INTERNAL] = "internal",
    [MSG_E_SHUTTING_DOWN] = "shutting_down",
};

const char *msg_errcode_name(msg_errcode_t c)
{
    if ((unsigned)c >= MSG_E_COUNT) return "internal";
    return s_errnames[c];
}

msg_errcode_t msg_errcode_parse(const char *s, size_t len)
{
    for (int i = 1; i < MSG_E_COUNT; i++)
        if (strlen(s_errnames[i]) == len && !memcmp(s_errnames[i], s, len)) return (msg_errcode_t)i;
    return MSG_E_NONE;
}

static const char *const s_finish_names[] = {"none", "stop", "length", "cancel"};

const char *msg_finish_name(msg_finish_t f)
{
    if ((unsigned)f > MSG_FINISH_CANCEL) return "none";
    return s_finish_names[f];
}

msg_str_t msg_str(const char *s)
{
    msg_str_t r = {s, s ? strlen(s) : 0};
    return r;
}

uint64_t msg_request_id(const void *client, size_t client_len, uint64_t cid)
{
    /* FNV-1a over the routing id, then a splitmix64 finaliser mixing in cid. */
    const unsigned char *p = client;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < client_len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    uint64_t z = h ^ (cid + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

/* ---- schema tables ---- */

typedef enum {
    F_U64,      /* uint64_t */
    F_I64,      /* int64_t, range lo..hi */
    F_I32,      /* int32_t, range lo..hi */
    F_F32,      /* float, range lo..hi (lo exclusive with FL_LOEX) */
    F_F64,      /* double, range lo..hi */
    F_BOOL,     /* bool */
    F_STR,      /* msg_str_t, UTF-8 str; length lo..hi */
    F_BIN,      /* msg_str_t, bin (str also accepted); length lo..hi */
    F_I32S,     /* const int32_t * + int32_t count at cnt; count lo..hi, elements elo..ehi */
    F_U64S,     /* const uint64_t * + count at cnt; count lo..hi */
    F_F32S,     /* const float * + int32_t count at cnt; count lo..hi, elements elo..ehi (NaN never) */
    F_STRS,     /* const msg_str_t * + count at cnt; count lo..hi; each length elo..ehi */
    F_FINISH,   /* msg_finish_t, wire string */
    F_ERRCODE,  /* msg_errcode_t, wire string */
    F_STATMAP,  /* msg_stats_t body: map name -> number */
    F_OBJ,      /* nested map whose fields (sub) live in the same body struct */
    F_OBJARR,   /* array of maps: pointer + count at cnt, element size esz, fields sub */
    F_JSON,     /* msg_str_t of JSON text: a str (length lo..hi), or a msgpack array (map with FL_JSONMAP)
                 * converted to JSON text; always sent as a str */
} fkind_t;

#define FL_REQ 1u   /* required */
#define FL_LOEX 2u  /* lower bound exclusive (floats) */
#define FL_SHCNT 4u /* count shared with another array: lengths must agree */
#define FL_DEF1 8u  /* optional scalar whose default is 1 (else 0 / false); see s_emitted */
#define FL_DEFM1 16u /* optional scalar whose default is -1 */
#define FL_PACKED 32u /* F_I32S / F_U64S / F_F32S sent as one msgpack bin of little-endian values (the
                       * per-step arrays: one header instead of one object per element);
                       * a decoder also accepts the plain array form */
#define FL_JSONMAP 64u /* F_JSON: the msgpack form is a map (else an array) */

typedef struct fdesc fdesc_t;
struct fdesc {
    const char *name;
    fkind_t kind;
    unsigned flags;
    size_t off;       /* offset of the value inside the body */
    size_t cnt;       /* arrays: offset of the int32_t count */
    double lo, hi;    /* value range, or count / length range */
    double elo, ehi;  /* element range (F_I32S) or element length (F_STRS) */
    const fdesc_t *sub; /* F_OBJ, F_OBJARR */
    size_t esz;         /* F_OBJARR element size */
};

#define END_FIELDS {NULL, 0, 0, 0, 0, 0, 0, 0, 0, NULL, 0}
#define I32MAX 2147483647.0
#define I64MAX 9223372036854775807.0

#define SAMPLING_FIELDS(T, m)                                                                    \
    {"temperature", F_F32, 0, offsetof(T, m.temperature), 0, 0, MSG_MAX_TEMPERATURE, 0, 0, NULL, 0}, \
    {"top_p", F_F32, FL_LOEX | FL_DEF1, offsetof(T, m.top_p), 0, 0, 1, 0, 0, NULL, 0},                    \
    {"top_k", F_I32, 0, offsetof(T, m.top_k), 0, 0, MSG_MAX_TOP_K, 0, 0, NULL, 0},               \
    {"seed", F_U64, 0, offsetof(T, m.seed), 0, 0, 0, 0, 0, NULL, 0}

/* Log-probabilities of one request's tokens (msg_logprobs_t): packed internally, plain arrays and
 * with the tokens' texts towards clients; the counts are checked against each other and the
 * tokens in s_check_type. */
#define LP_MAX_TOP ((double)MSG_MAX_TOKENS_ARRAY * MSG_MAX_TOP_LOGPROBS)
#define LP_FIELDS(T, m, fl)                                                                                              \
    {"logprobs", F_F32S, fl, offsetof(T, m.logprobs), offsetof(T, m.n_logprobs), 0, MSG_MAX_TOKENS_ARRAY, -INFINITY, 0, NULL, 0}, \
    {"top_n", F_I32, 0, offsetof(T, m.top_n), 0, 0, MSG_MAX_TOP_LOGPROBS, 0, 0, NULL, 0},                                \
    {"top_tokens", F_I32S, fl, offsetof(T, m.top_tokens), offsetof(T, m.n_top_tokens), 0, LP_MAX_TOP, 0, I32MAX, NULL, 0}, \
    {"top_logprobs", F_F32S, fl, offsetof(T, m.top_logprobs), offsetof(T, m.n_top_logprobs), 0, LP_MAX_TOP, -INFINITY, 0, NULL, 0}
#define LP_TEXT_FIELDS(T, m)                                                                                             \
    {"token_text", F_STRS, 0, offsetof(T, m.token_text), offsetof(T, m.n_token_text), 0, MSG_MAX_TOKENS_ARRAY, 0, MSG_MAX_TOKEN_TEXT, NULL, 0}, \
    {"top_text", F_STRS, 0, offsetof(T, m.top_text), offsetof(T, m.n_top_text), 0, LP_MAX_TOP, 0, MSG_MAX_TOKEN_TEXT, NULL, 0}
/* Log-probabilities of many rows (msg_lp_rows_t), always packed. */
#define LP_ROWS_MAX_TOP ((double)MSG_MAX_STEP_SEQS * MSG_MAX_TOP_LOGPROBS)
#define LP_ROWS_FIELDS(T, m)                                                                                             \
    {"logprobs", F_F32S, FL_PACKED, offsetof(T, m.logprobs), offsetof(T, m.n_logprobs), 1, MSG_MAX_STEP_SEQS, -INFINITY, 0, NULL, 0}, \
    {"top_n", F_I32S, FL_PACKED, offsetof(T, m.top_n), offsetof(T, m.n_top_n), 1, MSG_MAX_STEP_SEQS, -1, MSG_MAX_TOP_LOGPROBS, NULL, 0}, \
    {"top_tokens", F_I32S, FL_PACKED, offsetof(T, m.top_tokens), offsetof(T, m.n_top_tokens), 0, LP_ROWS_MAX_TOP, 0, I32MAX, NULL, 0}, \
    {"top_logprobs", F_F32S, FL_PACKED, offsetof(T, m.top_logprobs), offsetof(T, m.n_top_logprobs), 0, LP_ROWS_MAX_TOP, -INFINITY, 0, NULL, 0}
/* A request's ask for log-probabilities (generate, submit, a step's sequence). */
#define LP_ASK_FIELDS(T)                                                                                 \
    {"logprobs", F_BOOL, 0, offsetof(T, logprobs), 0, 0, 0, 0, 0, NULL, 0},                              \
    {"top_logprobs", F_I32, 0, offsetof(T, top_logprobs), 0, 0, MSG_MAX_TOP_LOGPROBS, 0, 0, NULL, 0}

static const fdesc_t s_f_none[] = {END_FIELDS};

static const fdesc_t s_f_generate[] = {
    {"prompt", F_STR, 0, offsetof(msg_generate_t, prompt), 0, 0, 1e18, 0, 0, NULL, 0},
    {"messages", F_JSON, 0, offsetof(msg_generate_t, messages), 0, 2, 1e18, 0, 0, NULL, 0},
    {"template_vars", F_JSON, FL_JSONMAP, offsetof(msg_generate_t, template_vars), 0, 2, 1e18, 0, 0, NULL, 0},
    {"add_generation_prompt", F_BOOL, FL_DEF1, offsetof(msg_generate_t, add_generation_prompt), 0, 0, 0, 0, 0, NULL, 0},
    {"tokens", F_I32S, 0, offsetof(msg_generate_t, tokens), offsetof(msg_generate_t, n_tokens), 1, MSG_MAX_TOKENS_ARRAY, 0, I32MAX, NULL, 0},
    {"max_tokens", F_I32, FL_REQ, offsetof(msg_generate_t, max_tokens), 0, 1, MSG_MAX_MAX_TOKENS, 0, 0, NULL, 0},
    SAMPLING_FIELDS(msg_generate_t, samp),
    {"stop", F_STRS, 0, offsetof(msg_generate_t, stop), offsetof(msg_generate_t, n_stop), 0, MSG_MAX_STOP, 1, MSG_MAX_STOP_LEN, NULL, 0},
    {"stream", F_BOOL, FL_DEF1, offsetof(msg_generate_t, stream), 0, 0, 0, 0, 0, NULL, 0},
    {"ignore_eos", F_BOOL, 0, offsetof(msg_generate_t, ignore_eos), 0, 0, 0, 0, 0, NULL, 0},
    LP_ASK_FIELDS(msg_generate_t),
    END_FIELDS};

static const fdesc_t s_f_resume[] = {
    {"from", F_I64, FL_REQ, offsetof(msg_resume_t, from), 0, 0, I64MAX, 0, 0, NULL, 0},
    {"text_from", F_I64, 0, offsetof(msg_resume_t, text_from), 0, 0, I64MAX, 0, 0, NULL, 0},
    {"stop", F_STRS, 0, offsetof(msg_resume_t, stop), offsetof(msg_resume_t, n_stop), 0, MSG_MAX_STOP, 1, MSG_MAX_STOP_LEN, NULL, 0},
    {"stream", F_BOOL, FL_DEF1, offsetof(msg_resume_t, stream), 0, 0, 0, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_sched_resume[] = {
    {"from", F_I64, FL_REQ, offsetof(msg_resume_t, from), 0, 0, I64MAX, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_token[] = {
    {"index", F_I64, FL_REQ, offsetof(msg_tokens_t, index), 0, 0, I64MAX, 0, 0, NULL, 0},
    {"tokens", F_I32S, FL_REQ, offsetof(msg_tokens_t, tokens), offsetof(msg_tokens_t, n_tokens), 0, MSG_MAX_TOKENS_ARRAY, 0, I32MAX, NULL, 0},
    {"text", F_STR, FL_REQ, offsetof(msg_tokens_t, text), 0, 0, 1e18, 0, 0, NULL, 0},
    LP_FIELDS(msg_tokens_t, lp, 0),
    LP_TEXT_FIELDS(msg_tokens_t, lp),
    END_FIELDS};

static const fdesc_t s_f_tokens[] = {
    {"index", F_I64, FL_REQ, offsetof(msg_tokens_t, index), 0, 0, I64MAX, 0, 0, NULL, 0},
    {"tokens", F_I32S, FL_REQ, offsetof(msg_tokens_t, tokens), offsetof(msg_tokens_t, n_tokens), 0, MSG_MAX_TOKENS_ARRAY, 0, I32MAX, NULL, 0},
    LP_FIELDS(msg_tokens_t, lp, FL_PACKED),
    END_FIELDS};

static const fdesc_t s_f_usage[] = {
    {"prompt_tokens", F_I32, FL_REQ, offsetof(msg_done_t, prompt_tokens), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"completion_tokens", F_I32, FL_REQ, offsetof(msg_done_t, completion_tokens), 0, 0, I32MAX, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_timings[] = {
    {"queue_ms", F_F64, FL_REQ, offsetof(msg_done_t, queue_ms), 0, 0, 1e12, 0, 0, NULL, 0},
    {"ttft_ms", F_F64, FL_REQ, offsetof(msg_done_t, ttft_ms), 0, 0, 1e12, 0, 0, NULL, 0},
    {"total_ms", F_F64, FL_REQ, offsetof(msg_done_t, total_ms), 0, 0, 1e12, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_done[] = {
    {"finish_reason", F_FINISH, FL_REQ, offsetof(msg_done_t, finish), 0, 0, 0, 0, 0, NULL, 0},
    {"usage", F_OBJ, FL_REQ, 0, 0, 0, 0, 0, 0, s_f_usage, 0},
    {"timings", F_OBJ, FL_REQ, 0, 0, 0, 0, 0, 0, s_f_timings, 0},
    {"text", F_STR, 0, offsetof(msg_done_t, text), 0, 0, 1e18, 0, 0, NULL, 0},
    {"tokens", F_I32S, 0, offsetof(msg_done_t, tokens), offsetof(msg_done_t, n_tokens), 0, MSG_MAX_TOKENS_ARRAY, 0, I32MAX, NULL, 0},
    LP_FIELDS(msg_done_t, lp, 0),
    LP_TEXT_FIELDS(msg_done_t, lp),
    END_FIELDS};

static const fdesc_t s_f_sched_done[] = {
    {"finish_reason", F_FINISH, FL_REQ, offsetof(msg_done_t, finish), 0, 0, 0, 0, 0, NULL, 0},
    {"usage", F_OBJ, FL_REQ, 0, 0, 0, 0, 0, 0, s_f_usage, 0},
    {"timings", F_OBJ, FL_REQ, 0, 0, 0, 0, 0, 0, s_f_timings, 0},
    END_FIELDS};

static const fdesc_t s_f_error[] = {
    {"code", F_ERRCODE, FL_REQ, offsetof(msg_error_t, code), 0, 0, 0, 0, 0, NULL, 0},
    {"message", F_STR, FL_REQ, offsetof(msg_error_t, message), 0, 0, 4096, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_health[] = {
    {"status", F_STR, FL_REQ, offsetof(msg_health_t, status), 0, 1, 32, 0, 0, NULL, 0},
    {"scheduler", F_BOOL, FL_REQ, offsetof(msg_health_t, scheduler), 0, 0, 0, 0, 0, NULL, 0},
    {"uptime_s", F_F64, FL_REQ, offsetof(msg_health_t, uptime_s), 0, 0, 1e12, 0, 0, NULL, 0},
    {"queue", F_I32, FL_REQ, offsetof(msg_health_t, queue), 0, 0, I32MAX, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_stats[] = {
    {"stats", F_STATMAP, FL_REQ, 0, 0, 0, MSG_MAX_STATS, 1, 128, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_model[] = {
    {"name", F_STR, FL_REQ, offsetof(msg_model_t, name), 0, 1, 256, 0, 0, NULL, 0},
    {"vocab", F_I32, FL_REQ, offsetof(msg_model_t, vocab), 0, 1, I32MAX, 0, 0, NULL, 0},
    {"max_context", F_I32, FL_REQ, offsetof(msg_model_t, max_context), 0, 1, I32MAX, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_models[] = {
    {"models", F_OBJARR, FL_REQ, offsetof(msg_models_t, models), offsetof(msg_models_t, n), 0, 64, 0, 0, s_f_model, sizeof(msg_model_t)},
    END_FIELDS};

static const fdesc_t s_f_submit[] = {
    {"client", F_BIN, FL_REQ, offsetof(msg_submit_t, client), 0, 0, MSG_MAX_CLIENT_ID, 0, 0, NULL, 0},
    {"cid", F_U64, FL_REQ, offsetof(msg_submit_t, cid), 0, 0, 0, 0, 0, NULL, 0},
    {"prompt", F_I32S, FL_REQ, offsetof(msg_submit_t, prompt), offsetof(msg_submit_t, n_prompt), 1, MSG_MAX_TOKENS_ARRAY, 0, I32MAX, NULL, 0},
    {"max_tokens", F_I32, FL_REQ, offsetof(msg_submit_t, max_tokens), 0, 1, MSG_MAX_MAX_TOKENS, 0, 0, NULL, 0},
    SAMPLING_FIELDS(msg_submit_t, samp),
    {"ignore_eos", F_BOOL, 0, offsetof(msg_submit_t, ignore_eos), 0, 0, 0, 0, 0, NULL, 0},
    LP_ASK_FIELDS(msg_submit_t),
    END_FIELDS};

static const fdesc_t s_f_hello[] = {
    {"instance", F_U64, FL_REQ, offsetof(msg_hello_t, instance), 0, 0, 0, 0, 0, NULL, 0},
    {"pid", F_I32, FL_REQ, offsetof(msg_hello_t, pid), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"model", F_STR, FL_REQ, offsetof(msg_hello_t, model), 0, 0, 256, 0, 0, NULL, 0},
    {"vocab", F_I32, FL_REQ, offsetof(msg_hello_t, vocab), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"max_context", F_I32, FL_REQ, offsetof(msg_hello_t, max_context), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"bos_id", F_I32, FL_DEFM1, offsetof(msg_hello_t, bos_id), 0, -1, I32MAX, 0, 0, NULL, 0},
    {"eos_id", F_I32, FL_DEFM1, offsetof(msg_hello_t, eos_id), 0, -1, I32MAX, 0, 0, NULL, 0},
    {"kv_blocks", F_I32, 0, offsetof(msg_hello_t, kv_blocks), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"block_size", F_I32, 0, offsetof(msg_hello_t, block_size), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"load_ms", F_F64, 0, offsetof(msg_hello_t, load_ms), 0, 0, 1e12, 0, 0, NULL, 0},
    {"eos_ids", F_I32S, 0, offsetof(msg_hello_t, eos_ids), offsetof(msg_hello_t, n_eos), 1, MSG_MAX_EOS, 0, I32MAX, NULL, 0},
    {"sliding_window", F_I32, 0, offsetof(msg_hello_t, sliding_window), 0, 0, I32MAX, 0, 0, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_step_seq[] = {
    {"req", F_U64, FL_REQ, offsetof(msg_step_seq_t, req), 0, 0, 0, 0, 0, NULL, 0},
    {"pos0", F_I32, FL_REQ, offsetof(msg_step_seq_t, pos0), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"tokens", F_I32S, FL_REQ | FL_PACKED, offsetof(msg_step_seq_t, tokens), offsetof(msg_step_seq_t, n_tokens), 1, MSG_MAX_TOKENS_ARRAY, 0, I32MAX, NULL, 0},
    {"blocks", F_I32S, FL_REQ | FL_PACKED, offsetof(msg_step_seq_t, blocks), offsetof(msg_step_seq_t, n_blocks), 1, MSG_MAX_TOKENS_ARRAY, 0, I32MAX, NULL, 0},
    {"sample", F_BOOL, FL_REQ, offsetof(msg_step_seq_t, sample), 0, 0, 0, 0, 0, NULL, 0},
    SAMPLING_FIELDS(msg_step_seq_t, samp),
    {"n_sampled", F_U64, 0, offsetof(msg_step_seq_t, n_sampled), 0, 0, 0, 0, 0, NULL, 0},
    {"last", F_BOOL, 0, offsetof(msg_step_seq_t, last), 0, 0, 0, 0, 0, NULL, 0},
    LP_ASK_FIELDS(msg_step_seq_t),
    {"win_blocks", F_I32S, FL_PACKED, offsetof(msg_step_seq_t, win_blocks), offsetof(msg_step_seq_t, n_win_blocks), 1, MSG_MAX_TOKENS_ARRAY, -1, I32MAX, NULL, 0},
    END_FIELDS};

static const fdesc_t s_f_step[] = {
    {"instance", F_U64, FL_REQ, offsetof(msg_step_t, instance), 0, 0, 0, 0, 0, NULL, 0},
    {"seqs", F_OBJARR, FL_REQ, offsetof(msg_step_t, seqs), offsetof(msg_step_t, n_seqs), 1, MSG_MAX_STEP_SEQS, 0, 0, s_f_step_seq, sizeof(msg_step_seq_t)},
    END_FIELDS};

static const fdesc_t s_f_result[] = {
    {"instance", F_U64, FL_REQ, offsetof(msg_result_t, instance), 0, 0, 0, 0, 0, NULL, 0},
    {"reqs", F_U64S, FL_REQ | FL_SHCNT | FL_PACKED, offsetof(msg_result_t, reqs), offsetof(msg_result_t, n_seqs), 1, MSG_MAX_STEP_SEQS, 0, 0, NULL, 0},
    {"tokens", F_I32S, FL_REQ | FL_SHCNT | FL_PACKED, offsetof(msg_result_t, tokens), offsetof(msg_result_t, n_seqs), 1, MSG_MAX_STEP_SEQS, -1, I32MAX, NULL, 0},
    {"forward_us", F_F64, 0, offsetof(msg_result_t, forward_us), 0, 0, 1e15, 0, 0, NULL, 0},
    {"sample_us", F_F64, 0, offsetof(msg_result_t, sample_us), 0, 0, 1e15, 0, 0, NULL, 0},
    LP_ROWS_FIELDS(msg_result_t, lp),
    END_FIELDS};

static const fdesc_t s_f_step_tokens[] = {
    {"reqs", F_U64S, FL_REQ | FL_SHCNT | FL_PACKED, offsetof(msg_step_tokens_t, reqs), offsetof(msg_step_tokens_t, n), 1, MSG_MAX_STEP_SEQS, 0, 0, NULL, 0},
    {"index", F_I32S, FL_REQ | FL_SHCNT | FL_PACKED, offsetof(msg_step_tokens_t, index), offsetof(msg_step_tokens_t, n), 1, MSG_MAX_STEP_SEQS, 0, I32MAX, NULL, 0},
    {"tokens", F_I32S, FL_REQ | FL_SHCNT | FL_PACKED, offsetof(msg_step_tokens_t, tokens), offsetof(msg_step_tokens_t, n), 1, MSG_MAX_STEP_SEQS, 0, I32MAX, NULL, 0},
    LP_ROWS_FIELDS(msg_step_tokens_t, lp),
    END_FIELDS};

static const fdesc_t s_f_pf_status[] = {
    {"node", F_I32, FL_REQ, offsetof(msg_pf_status_t, node), 0, 0, 4095, 0, 0, NULL, 0},
    {"arena", F_STR, FL_REQ, offsetof(msg_pf_status_t, arena), 0, 0, 256, 0, 0, NULL, 0},
    {"bytes", F_U64, FL_REQ, offsetof(msg_pf_status_t, bytes), 0, 0, 0, 0, 0, NULL, 0},
    {"state", F_STR, FL_REQ, offsetof(msg_pf_status_t, state), 0, 1, 32, 0, 0, NULL, 0},
    {"fill_ms", F_F64, 0, offsetof(msg_pf_status_t, fill_ms), 0, 0, 1e12, 0, 0, NULL, 0},
    {"reattached", F_BOOL, 0, offsetof(msg_pf_status_t, reattached), 0, 0, 0, 0, 0, NULL, 0},
    {"pid", F_I32, 0, offsetof(msg_pf_status_t, pid), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"instance", F_U64, 0, offsetof(msg_pf_status_t, instance), 0, 0, 0, 0, 0, NULL, 0},
    {"host_budget", F_U64, 0, offsetof(msg_pf_status_t, host_budget), 0, 0, 0, 0, 0, NULL, 0},
    {"slots", F_I32, 0, offsetof(msg_pf_status_t, slots), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"slot_bytes", F_U64, 0, offsetof(msg_pf_status_t, slot_bytes), 0, 0, 0, 0, 0, NULL, 0},
    {"experts_disk", F_I32, 0, offsetof(msg_pf_status_t, experts_disk), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"experts_host", F_I32, 0, offsetof(msg_pf_status_t, experts_host), 0, 0, I32MAX, 0, 0, NULL, 0},
    {"host_hits", F_U64, 0, offsetof(msg_pf_status_t, host_hits), 0, 0, 0, 0, 0, NULL, 0},
    {"host_misses", F_U64, 0, offsetof(msg_pf_status_t, host_misses), 0, 0, 0, 0, 0, NULL, 0},
    {"disk_bytes", F_U64, 0, offsetof(msg_pf_status_t, disk_bytes), 0, 0, 0, 0, 0, NULL, 0},
    {"disk_s", F_F64, 0, offsetof(msg_pf_status_t, disk_s), 0, 0, 1e12, 0, 0, NULL, 0},
    {"disk_errors", F_U64, 0, offsetof(msg_pf_status_t, disk_errors), 0, 0, 0, 0, 0, NULL, 0},
    {"read_ahead", F_U64, 0, offsetof(msg_pf_status_t, read_ahead), 0, 0, 0, 0, 0, NULL, 0},
    {"read_ahead_used", F_U64, 0, offsetof(msg_pf_status_t, read_ahead_used), 0, 0, 0, 0, 0, NULL, 0},
    END_FIELDS};

typedef struct {
    msg_type_t type;
    msg_family_t fam;
    const char *name;
    const fdesc_t *fields;
    bool id_required;
} tdesc_t;

static const tdesc_t s_types[] = {
    {MSG_GENERATE, MSG_FAM_CLIENT, "generate", s_f_generate, true},
    {MSG_CANCEL, MSG_FAM_CLIENT, "cancel", s_f_none, true},
    {MSG_RESUME, MSG_FAM_CLIENT, "resume", s_f_resume, true},
    {MSG_HEALTH, MSG_FAM_CLIENT, "health", s_f_none, false},
    {MSG_STATS, MSG_FAM_CLIENT, "stats", s_f_none, false},
    {MSG_MODELS, MSG_FAM_CLIENT, "models", s_f_none, false},
    {MSG_TOKEN, MSG_FAM_REPLY, "token", s_f_token, true},
    {MSG_DONE, MSG_FAM_REPLY, "done", s_f_done, true},
    {MSG_ERROR, MSG_FAM_REPLY, "error", s_f_error, false},
    {MSG_HEALTH_REPLY, MSG_FAM_REPLY, "health", s_f_health, false},
    {MSG_STATS_REPLY, MSG_FAM_REPLY, "stats", s_f_stats, false},
    {MSG_MODELS_REPLY, MSG_FAM_REPLY, "models", s_f_models, false},
    {MSG_SUBMIT, MSG_FAM_SCHED_IN, "submit", s_f_submit, true},
    {MSG_SCHED_CANCEL, MSG_FAM_SCHED_IN, "cancel", s_f_none, true},
    {MSG_SCHED_RESUME, MSG_FAM_SCHED_IN, "resume", s_f_sched_resume, true},
    {MSG_SCHED_STATS, MSG_FAM_SCHED_IN, "stats", s_f_none, false},
    {MSG_SCHED_HELLO, MSG_FAM_SCHED_IN, "hello", s_f_none, false},
    {MSG_SCHED_TOKENS, MSG_FAM_SCHED_OUT, "tokens", s_f_tokens, true},
    {MSG_SCHED_DONE, MSG_FAM_SCHED_OUT, "done", s_f_sched_done, true},
    {MSG_SCHED_ERROR, MSG_FAM_SCHED_OUT, "error", s_f_error, false},
    {MSG_SCHED_STATS_REPLY, MSG_FAM_SCHED_OUT, "stats", s_f_stats, false},
    {MSG_SCHED_HELLO_REPLY, MSG_FAM_SCHED_OUT, "hello", s_f_hello, false},
    {MSG_SCHED_STEP_TOKENS, MSG_FAM_SCHED_OUT, "step_tokens", s_f_step_tokens, false},
    {MSG_EXEC_HELLO, MSG_FAM_EXEC_IN, "hello", s_f_none, false},
    {MSG_STEP, MSG_FAM_EXEC_IN, "step", s_f_step, true},
    {MSG_EXEC_STATS, MSG_FAM_EXEC_IN, "stats", s_f_none, false},
    {MSG_EXEC_HELLO_REPLY, MSG_FAM_EXEC_OUT, "hello", s_f_hello, false},
    {MSG_STEP_RESULT, MSG_FAM_EXEC_OUT, "result", s_f_result, true},
    {MSG_EXEC_ERROR, MSG_FAM_EXEC_OUT, "error", s_f_error, false},
    {MSG_EXEC_STATS_REPLY, MSG_FAM_EXEC_OUT, "stats", s_f_stats, false},
    {MSG_PF_STATUS, MSG_FAM_PF_IN, "status", s_f_none, false},
    {MSG_PF_STATUS_REPLY, MSG_FAM_PF_OUT, "status", s_f_pf_status, false},
};
#define N_TYPES (sizeof s_types / sizeof s_types[0])

static const tdesc_t *s_type_desc(msg_type_t t)
{
    for (size_t i = 0; i < N_TYPES; i++)
        if (s_types[i].type == t) return &s_types[i];
    return NULL;
}

const char *msg_type_name(msg_type_t t)
{
    const tdesc_t *d = s_type_desc(t);
    return d ? d->name : "invalid";
}

msg_family_t msg_type_family(msg_type_t t)
{
    const tdesc_t *d = s_type_desc(t);
    return d ? d->fam : MSG_FAM_COUNT;
}

/* ---- shared checks ---- */

static bool s_utf8_valid(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        unsigned min;
        if ((c & 0xE0) == 0xC0) { k = 1; min = 0x80; c &= 0x1F; }
        else if ((c & 0xF0) == 0xE0) { k = 2; min = 0x800; c &= 0x0F; }
        else if ((c & 0xF8) == 0xF0) { k = 3; min = 0x10000; c &= 0x07; }
        else return false;
        if (n - i <= k) return false;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            c = (c << 6) | (s[i + j] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
        i += k + 1;
    }
    return true;
}

static int s_fail(msg_err_t *err, msg_errcode_t code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int s_fail(msg_err_t *err, msg_errcode_t code, const char *fmt, ...)
{
    if (err) {
        err->code = code;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->text, sizeof err->text, fmt, ap);
        va_end(ap);
    }
    switch (code) {
    case MSG_E_MALFORMED: return STRATA_EFORMAT;
    case MSG_E_BAD_VERSION: return STRATA_EVERSION;
    case MSG_E_TOO_LARGE: return STRATA_ETOOLARGE;
    default: return STRATA_EINVAL_INPUT;
    }
}

static bool s_in_range(const fdesc_t *f, double v)
{
    if (f->flags & FL_LOEX) return v > f->lo && v <= f->hi;
    return v >= f->lo && v <= f->hi;
}

/* A request's logprobs / top_logprobs (generate, submit, a step's sequence). */
static int s_check_ask(bool logprobs, int32_t top, const char *ctx, msg_err_t *err)
{
    if (top > 0 && !logprobs) return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'top_logprobs': only with 'logprobs' true", ctx);
    return 0;
}

/* The log-probabilities of n tokens of one request: every array as long as the tokens (the
 * alternatives top_n times as long), and none without 'logprobs'. */
static int s_check_lp(const msg_logprobs_t *lp, int32_t n, const char *ctx, msg_err_t *err)
{
    if (!lp->logprobs) {
        if (lp->top_n || lp->top_tokens || lp->top_logprobs || lp->token_text || lp->top_text)
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: fields 'top_n', 'top_tokens', 'top_logprobs', 'token_text' and "
                                                    "'top_text' only with 'logprobs'", ctx);
        return 0;
    }
    const int64_t nt = (int64_t)n * lp->top_n;
    if (lp->n_logprobs != n)
        return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'logprobs': %d entries for %d tokens", ctx, lp->n_logprobs, n);
    if (lp->n_top_tokens != nt || lp->n_top_logprobs != nt || (nt > 0 && (!lp->top_tokens || !lp->top_logprobs)))
        return s_fail(err, MSG_E_INVALID_PARAM, "%s: fields 'top_tokens' and 'top_logprobs': %d and %d entries, need %d tokens x top_n %d",
                      ctx, lp->n_top_tokens, lp->n_top_logprobs, n, lp->top_n);
    if (lp->token_text && lp->n_token_text != n)
        return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'token_text': %d entries for %d tokens", ctx, lp->n_token_text, n);
    if ((lp->top_text && (!lp->token_text || lp->n_top_text != nt)) || (lp->token_text && nt > 0 && !lp->top_text))
        return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'top_text': %d entries, need %lld (with 'token_text')", ctx,
                      lp->n_top_text, (long long)nt);
    for (int32_t i = 0; lp->token_text && i < n; i++)
        if (!s_utf8_valid((const unsigned char *)lp->token_text[i].s, lp->token_text[i].len))
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'token_text[%d]': not valid UTF-8", ctx, i);
    for (int64_t i = 0; lp->top_text && i < nt; i++)
        if (!s_utf8_valid((const unsigned char *)lp->top_text[i].s, lp->top_text[i].len))
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'top_text[%lld]': not valid UTF-8", ctx, (long long)i);
    return 0;
}

/* The log-probabilities of n rows: top_n for each row, the alternatives as many as they add up to. */
static int s_check_rows(const msg_lp_rows_t *lp, int32_t n, const char *ctx, msg_err_t *err)
{
    if (!lp->logprobs) {
        if (lp->top_n || lp->top_tokens || lp->top_logprobs)
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: fields 'top_n', 'top_tokens' and 'top_logprobs' only with 'logprobs'", ctx);
        return 0;
    }
    if (lp->n_logprobs != n || !lp->top_n || lp->n_top_n != n)
        return s_fail(err, MSG_E_INVALID_PARAM, "%s: fields 'logprobs' and 'top_n': %d and %d entries for %d rows", ctx, lp->n_logprobs,
                      lp->top_n ? lp->n_top_n : 0, n);
    int64_t sum = 0;
    for (int32_t i = 0; i < n; i++) sum += lp->top_n[i] > 0 ? lp->top_n[i] : 0;
    if (lp->n_top_tokens != sum || lp->n_top_logprobs != sum || (sum > 0 && (!lp->top_tokens || !lp->top_logprobs)))
        return s_fail(err, MSG_E_INVALID_PARAM, "%s: fields 'top_tokens' and 'top_logprobs': %d and %d entries, the rows' top_n add up to %lld",
                      ctx, lp->n_top_tokens, lp->n_top_logprobs, (long long)sum);
    return 0;
}

/* Checks shared by decoder and encoder that involve more than one field. */
static int s_check_type(msg_type_t t, const void *body, const char *ctx, msg_err_t *err)
{
    int rc = 0;
    switch (t) {
    case MSG_SUBMIT: rc = s_check_ask(((const msg_submit_t *)body)->logprobs, ((const msg_submit_t *)body)->top_logprobs, ctx, err); break;
    case MSG_STEP: {
        const msg_step_t *st = body;
        for (int32_t i = 0; i < st->n_seqs && rc == 0; i++) {
            const msg_step_seq_t *q = &st->seqs[i];
            rc = s_check_ask(q->logprobs, q->top_logprobs, ctx, err);
            /* the window table is indexed as blocks: as long (which ids a step needs is the
             * executor's check, it knows the window and the block size) */
            if (rc == 0 && q->win_blocks && q->n_win_blocks != q->n_blocks)
                rc = s_fail(err, MSG_E_INVALID_PARAM, "%s: seqs[%d] field 'win_blocks': %d entries, 'blocks' has %d", ctx, i,
                            q->n_win_blocks, q->n_blocks);
        }
        break;
    }
    case MSG_TOKEN:
    case MSG_SCHED_TOKENS: rc = s_check_lp(&((const msg_tokens_t *)body)->lp, ((const msg_tokens_t *)body)->n_tokens, ctx, err); break;
    case MSG_DONE: rc = s_check_lp(&((const msg_done_t *)body)->lp, ((const msg_done_t *)body)->n_tokens, ctx, err); break;
    case MSG_STEP_RESULT: rc = s_check_rows(&((const msg_result_t *)body)->lp, ((const msg_result_t *)body)->n_seqs, ctx, err); break;
    case MSG_SCHED_STEP_TOKENS:
        rc = s_check_rows(&((const msg_step_tokens_t *)body)->lp, ((const msg_step_tokens_t *)body)->n, ctx, err);
        break;
    default: break;
    }
    if (rc < 0) return rc;
    if (t == MSG_GENERATE) {
        const msg_generate_t *g = body;
        if ((rc = s_check_ask(g->logprobs, g->top_logprobs, ctx, err)) < 0) return rc;
        int given = (g->prompt.s != NULL) + (g->tokens != NULL) + (g->messages.s != NULL);
        if (given != 1)
            return s_fail(err, given ? MSG_E_INVALID_PARAM : MSG_E_MISSING_FIELD,
                          "%s: exactly one of 'prompt', 'tokens' and 'messages' is required", ctx);
        if (g->template_vars.s && !g->messages.s)
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'template_vars': only with 'messages'", ctx);
        if (g->messages.s && !s_utf8_valid((const unsigned char *)g->messages.s, g->messages.len))
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'messages': not valid UTF-8", ctx);
        if (g->template_vars.s && !s_utf8_valid((const unsigned char *)g->template_vars.s, g->template_vars.len))
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'template_vars': not valid UTF-8", ctx);
        if (g->prompt.s && g->prompt.len == 0)
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'prompt': empty", ctx);
        if (g->prompt.s && !s_utf8_valid((const unsigned char *)g->prompt.s, g->prompt.len))
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'prompt': not valid UTF-8", ctx);
        for (int i = 0; i < g->n_stop; i++)
            if (!s_utf8_valid((const unsigned char *)g->stop[i].s, g->stop[i].len))
                return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'stop[%d]': not valid UTF-8", ctx, i);
    }
    if (t == MSG_SCHED_HELLO_REPLY || t == MSG_EXEC_HELLO_REPLY) {
        const msg_hello_t *h = body;
        for (int32_t i = 0; h->eos_ids && i < h->n_eos; i++) {
            if (h->eos_ids[i] >= h->vocab)
                return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'eos_ids[%d]': %d is outside the vocab (%d)", ctx, i,
                              h->eos_ids[i], h->vocab);
            for (int32_t k = 0; k < i; k++)
                if (h->eos_ids[k] == h->eos_ids[i])
                    return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'eos_ids[%d]': %d repeats eos_ids[%d]", ctx, i,
                                  h->eos_ids[i], k);
        }
        if (h->eos_ids && h->eos_id != h->eos_ids[0])
            return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'eos_id': %d, but eos_ids[0] is %d", ctx, h->eos_id,
                          h->eos_ids[0]);
    }
    if (t == MSG_RESUME) {
        const msg_resume_t *r = body;
        for (int i = 0; i < r->n_stop; i++)
            if (!s_utf8_valid((const unsigned char *)r->stop[i].s, r->stop[i].len))
                return s_fail(err, MSG_E_INVALID_PARAM, "%s: field 'stop[%d]': not valid UTF-8", ctx, i);
    }
    return 0;
}

/* ---- pre-scan (see the top comment) ---- */

/* Total size in bytes of a fixed-size scalar led by byte b, 0 for anything else. */
static const unsigned char s_fixed_len[256] = {
    [0x00 ... 0x7f] = 1, [0xe0 ... 0xff] = 1, [0xc0] = 1, [0xc2] = 1, [0xc3] = 1,
    [0xca] = 5, [0xcb] = 9, [0xcc] = 2, [0xcd] = 3, [0xce] = 5, [0xcf] = 9,
    [0xd0] = 2, [0xd1] = 3, [0xd2] = 5, [0xd3] = 9,
};

static int s_scan(const unsigned char **pp, const unsigned char *end, int depth)
{
    const unsigned char *p = *pp;
    if (p >= end) return -1;
    if (depth > MSG_MAX_DEPTH) return -2;
    unsigned b = *p++;
    size_t left = (size_t)(end - p);
    uint64_t n = 0;
    int kind = 0; /* 0 scalar of n bytes, 1 array of n, 2 map of n pairs */
#define NEED(k) do { if (left < (k)) return -1; } while (0)
#define BE(k) ({ uint64_t v_ = 0; NEED(k); for (int i_ = 0; i_ < (k); i_++) v_ = (v_ << 8) | p[i_]; p += (k); left -= (k); v_; })
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) n = 0;
    else if (b >= 0x80 && b <= 0x8f) { kind = 2; n = b & 0x0f; }
    else if (b >= 0x90 && b <= 0x9f) { kind = 1; n = b & 0x0f; }
    else if (b >= 0xa0 && b <= 0xbf) n = b & 0x1f;
    else switch (b) {
    case 0xc4: case 0xd9: n = BE(1); break;
    case 0xc5: case 0xda: n = BE(2); break;
    case 0xc6: case 0xdb: n = BE(4); break;
    case 0xc7: n = BE(1) + 1; break;
    case 0xc8: n = BE(2) + 1; break;
    case 0xc9: n = BE(4) + 1; break;
    case 0xca: n = 4; break;
    case 0xcb: n = 8; break;
    case 0xcc: case 0xd0: n = 1; break;
    case 0xcd: case 0xd1: n = 2; break;
    case 0xce: case 0xd2: n = 4; break;
    case 0xcf: case 0xd3: n = 8; break;
    case 0xd4: n = 2; break;
    case 0xd5: n = 3; break;
    case 0xd6: n = 5; break;
    case 0xd7: n = 9; break;
    case 0xd8: n = 17; break;
    case 0xdc: kind = 1; n = BE(2); break;
    case 0xdd: kind = 1; n = BE(4); break;
    case 0xde: kind = 2; n = BE(2); break;
    case 0xdf: kind = 2; n = BE(4); break;
    default: return -1; /* 0xc1 is never used */
    }
#undef BE
#undef NEED
    if (kind == 0) {
        if (left < n) return -1;
        p += n;
    } else {
        uint64_t items = kind == 2 ? 2 * n : n;
        if (items > left) return -1;
        for (uint64_t i = 0; i < items; i++) {
            /* fast path for fixed-size scalars (ints, floats, nil, bools): token ids, blocks */
            if (p < end) {
                unsigned k = s_fixed_len[*p];
                if (*p >= 0xa0 && *p <= 0xbf) k = 1 + (*p & 0x1f); /* fixstr: keys, short strings */
                if (k) {
                    if ((size_t)(end - p) < k) return -1;
                    p += k;
                    continue;
                }
            }
            int r = s_scan(&p, end, depth + 1);
            if (r < 0) return r;
        }
    }
    *pp = p;
    return 0;
}

/* ---- decoding ---- */

typedef struct {
    msg_t *m;
    msg_err_t *err;
    msg_type_t type;
    const char *tname;          /* the message type's wire name */
    const msgpack_object *id;   /* the top-level id, or NULL */
} dctx_t;

/* Where in the message a field is ("step.seqs[3].tokens"), rendered only for error text. */
typedef struct path {
    const struct path *up;
    const char *name;
    int64_t index;   /* -1: not an array element */
} path_t;

static const char *s_path(const path_t *p, char *buf, size_t n)
{
    if (!p) return "";
    char up[192];
    const char *u = p->up ? s_path(p->up, up, sizeof up) : NULL;
    int k;
    if (p->index >= 0) k = snprintf(buf, n, "%s%s%s[%lld]", u ? u : "", u ? "." : "", p->name, (long long)p->index);
    else k = snprintf(buf, n, "%s%s%s", u ? u : "", u ? "." : "", p->name);
    if (k < 0) buf[0] = 0; /* a truncated path is still a useful message */
    return buf;
}

static const char *s_kind_name(fkind_t k)
{
    switch (k) {
    case F_U64: return "a non-negative integer";
    case F_I64: case F_I32: return "an integer";
    case F_F32: case F_F64: return "a number";
    case F_BOOL: return "a boolean";
    case F_STR: case F_FINISH: case F_ERRCODE: return "a string";
    case F_BIN: return "bytes";
    case F_I32S: case F_U64S: return "an array of integers";
    case F_F32S: return "an array of numbers";
    case F_STRS: return "an array of strings";
    case F_STATMAP: case F_OBJ: return "a map";
    case F_OBJARR: return "an array of maps";
    case F_JSON: return "a string of JSON or an array or map";
    }
    return "?";
}

static const char *s_obj_type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "integer";
    case MSGPACK_OBJECT_FLOAT32: case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "string";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_EXT: return "ext";
    }
    return "?";
}

/* ---- numbers in error messages ---- */

/* Text of number buffers: the longest is a uint64 or a %.17g double, with sign and NUL. */
typedef struct {
    char s[32];
} numtext_t;

/* v in the fewest significant digits (6 to 17) that read back as the same double, or as the
 * same float when f32: 100.0001 stays 100.0001 instead of %g's 100, 1 stays 1. */
static const char *s_fmt_double(double v, bool f32, numtext_t *t)
{
    if (!isfinite(v)) {
        snprintf(t->s, sizeof t->s, "%s", isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf");
        return t->s;
    }
    for (int p = 6; p <= 17; p++) {
        snprintf(t->s, sizeof t->s, "%.*g", p, v);
        if (f32 ? strtof(t->s, NULL) == (float)v : strtod(t->s, NULL) == v) break;
    }
    return t->s;
}

/* A scalar as it came on the wire: integers exactly, floats as s_fmt_double (a float32 in
 * float32 digits), anything else as its type. */
static const char *s_fmt_given(const msgpack_object *o, numtext_t *t)
{
    switch (o->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: snprintf(t->s, sizeof t->s, "%llu", (unsigned long long)o->via.u64); break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: snprintf(t->s, sizeof t->s, "%lld", (long long)o->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32: return s_fmt_double(o->via.f64, true, t);
    case MSGPACK_OBJECT_FLOAT64: return s_fmt_double(o->via.f64, false, t);
    default: snprintf(t->s, sizeof t->s, "%s", s_obj_type_name(o)); break;
    }
    return t->s;
}

/* A schema bound: integers exactly, the int64 maximum (stored as the double 2^63) as
 * 2^63-1, other values as s_fmt_double. */
static const char *s_fmt_bound(double b, numtext_t *t)
{
    if (b >= 9223372036854775807.0) snprintf(t->s, sizeof t->s, "2^63-1");
    else if (b == floor(b) && fabs(b) < 9007199254740992.0) snprintf(t->s, sizeof t->s, "%.0f", b);
    else s_fmt_double(b, false, t);
    return t->s;
}

/* "[lo, hi]" ("(lo, hi]" with an exclusive lower bound) for error messages. */
typedef struct {
    char s[72];
} rangetext_t;

static const char *s_fmt_range(double lo, double hi, bool lo_excl, rangetext_t *t)
{
    numtext_t a, b;
    snprintf(t->s, sizeof t->s, "%c%s, %s]", lo_excl ? '(' : '[', s_fmt_bound(lo, &a), s_fmt_bound(hi, &b));
    return t->s;
}

/* A signed view of an integer object; false if not an integer or beyond int64. */
static bool s_int(const msgpack_object *o, int64_t *v)
{
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) return false;
        *v = (int64_t)o->via.u64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    return false;
}

static bool s_is_int(const msgpack_object *o)
{
    return o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
}

/* The current field's path as text; only evaluated on the error paths. */
#define CTX s_path(path, pb, sizeof pb)

static int s_copy_str(dctx_t *d, const char *p, size_t n, msg_str_t *out)
{
    char *s = s_alloc(d->m, n + 1);
    if (!s) return STRATA_ENOMEM;
    if (n) memcpy(s, p, n);
    s[n] = 0;
    out->s = s;
    out->len = n;
    return 0;
}

/* A key as printable text for an error message: at most 64 bytes, non-printables as '?'. */
static const char *s_safe_key(const msgpack_object *k, char out[65])
{
    size_t n = k->via.str.size < 64 ? k->via.str.size : 64;
    for (size_t c = 0; c < n; c++) {
        char ch = k->via.str.ptr[c];
        out[c] = (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    }
    out[n] = 0;
    return out;
}

/* Order of two string keys (length first), for s_repeated_key. */
static int s_str_order(const msgpack_object *x, const msgpack_object *y)
{
    if (x->via.str.size != y->via.str.size) return x->via.str.size < y->via.str.size ? -1 : 1;
    return x->via.str.size ? memcmp(x->via.str.ptr, y->via.str.ptr, x->via.str.size) : 0;
}

static int s_key_cmp(const void *a, const void *b)
{
    return s_str_order(*(const msgpack_object *const *)a, *(const msgpack_object *const *)b);
}

/* The index of a string key of the map that another string key repeats, -1 if none, -2 out
 * of memory. Small maps compare every pair; larger ones (a stats map, a map padded with
 * unknown keys) sort the keys, so a frame of many keys costs n log n, not n^2. */
static int64_t s_repeated_key(const msgpack_object *map)
{
    const msgpack_object_kv *kv = map->via.map.ptr;
    uint32_t n = map->via.map.size;
    if (n <= 16) {
        for (uint32_t i = 1; i < n; i++) {
            if (kv[i].key.type != MSGPACK_OBJECT_STR) continue;
            for (uint32_t j = 0; j < i; j++)
                if (kv[j].key.type == MSGPACK_OBJECT_STR && !s_str_order(&kv[i].key, &kv[j].key)) return i;
        }
        return -1;
    }
    const msgpack_object **keys = malloc(n * sizeof *keys);
    if (!keys) return -2;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (kv[i].key.type == MSGPACK_OBJECT_STR) keys[m++] = &kv[i].key;
    qsort(keys, m, sizeof *keys, s_key_cmp);
    int64_t r = -1;
    for (uint32_t i = 1; i < m && r < 0; i++)
        if (!s_key_cmp(&keys[i - 1], &keys[i])) /* a key is the first member of its pair */
            r = (const msgpack_object_kv *)(const void *)keys[i] - kv;
    free(keys);
    return r;
}

static int s_decode_fields(dctx_t *d, const msgpack_object *map, const fdesc_t *fields, char *body,
                           const path_t *path, bool top);

/* An element of an F_F32S field as stored: NaN and values outside elo..ehi are refused. */
static bool s_f32_ok(const fdesc_t *f, float v) { return v >= f->elo && v <= f->ehi; }

/* An F_I32S / F_U64S / F_F32S field sent packed: a bin of n little-endian int32 / uint64 / float32 values. */
static int s_decode_packed(dctx_t *d, const fdesc_t *f, const msgpack_object *o, char *body, const path_t *path)
{
    char pb[192];
    rangetext_t rt;
    numtext_t nt;
    size_t esz = f->kind == F_U64S ? 8 : 4;
    const unsigned char *p = (const unsigned char *)o->via.bin.ptr;
    size_t bytes = o->via.bin.size;
    if (bytes % esz)
        return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': packed length %zu is not a multiple of %zu", CTX,
                      f->name, bytes, esz);
    size_t n = bytes / esz;
    if ((double)n < f->lo || (double)n > f->hi)
        return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': array must have %s elements, got %zu", CTX,
                      f->name, s_fmt_range(f->lo, f->hi, false, &rt), n);
    int32_t *cnt = (int32_t *)(body + f->cnt);
    if ((f->flags & FL_SHCNT) && *cnt != 0 && *cnt != (int32_t)n)
        return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': length %zu differs from a sibling array's %d", CTX,
                      f->name, n, *cnt);
    char *arr = s_alloc(d->m, esz * (n ? n : 1));
    if (!arr) return STRATA_ENOMEM;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (n) memcpy(arr, p, bytes); /* the wire order is the host order */
    if (f->kind == F_F32S)
        for (size_t i = 0; i < n; i++) {
            float v = ((const float *)arr)[i];
            if (!s_f32_ok(f, v))
                return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s[%zu]': must be in %s, got %s", CTX, f->name, i,
                              s_fmt_range(f->elo, f->ehi, false, &rt), s_fmt_double(v, true, &nt));
        }
    else if (esz == 4)
        for (size_t i = 0; i < n; i++) {
            int32_t v = ((const int32_t *)arr)[i];
            if ((double)v < f->elo || (double)v > f->ehi)
                return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s[%zu]': must be in %s, got %d", CTX, f->name, i,
                              s_fmt_range(f->elo, f->ehi, false, &rt), v);
        }
    n = 0; /* done: skip the portable loop below */
#endif
    for (size_t i = 0; i < n; i++, p += esz) {
        if (f->kind == F_F32S) {
            uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
            float v;
            memcpy(&v, &u, 4);
            if (!s_f32_ok(f, v))
                return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s[%zu]': must be in %s, got %s", CTX, f->name, i,
                              s_fmt_range(f->elo, f->ehi, false, &rt), s_fmt_double(v, true, &nt));
            ((float *)arr)[i] = v;
        } else if (esz == 4) {
            int32_t v = (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
            if ((double)v < f->elo || (double)v > f->ehi)
                return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s[%zu]': must be in %s, got %d", CTX, f->name, i,
                              s_fmt_range(f->elo, f->ehi, false, &rt), v);
            ((int32_t *)arr)[i] = v;
        } else {
            uint64_t v = 0;
            for (int k = 7; k >= 0; k--) v = v << 8 | p[k];
            ((uint64_t *)arr)[i] = v;
        }
    }
    *(void **)(body + f->off) = arr;
    *cnt = (int32_t)(bytes / esz);
    return 0;
}

/* JSON text of a msgpack value (F_JSON), into a growing buffer. */
typedef struct {
    char *p;
    size_t n, cap;
} jbuf_t;

static int s_jput(jbuf_t *b, const char *s, size_t n)
{
    if (b->cap - b->n < n + 1) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n < n + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) return STRATA_ENOMEM;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

static int s_jstr(jbuf_t *b, const char *s, size_t n, char *why, size_t wn)
{
    if (!s_utf8_valid((const unsigned char *)s, n)) {
        snprintf(why, wn, "a string is not valid UTF-8");
        return STRATA_EINVAL_INPUT;
    }
    int rc = s_jput(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        rc = s_jput(b, s + i - run, run);
        run = 0;
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n') snprintf(esc, sizeof esc, "\\n");
        else if (c == '\t') snprintf(esc, sizeof esc, "\\t");
        else if (c == '\r') snprintf(esc, sizeof esc, "\\r");
        else snprintf(esc, sizeof esc, "\\u%04x", c);
        if (rc == 0) rc = s_jput(b, esc, strlen(esc));
    }
    if (rc == 0) rc = s_jput(b, s + n - run, run);
    return rc ? rc : s_jput(b, "\"", 1);
}

static int s_to_json(jbuf_t *b, const msgpack_object *o, int depth, char *why, size_t wn)
{
    char num[40];
    int rc;
    if (depth > MSG_MAX_JSON_DEPTH) {
        snprintf(why, wn, "nested deeper than %d", MSG_MAX_JSON_DEPTH);
        return STRATA_EINVAL_INPUT;
    }
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return s_jput(b, "null", 4);
    case MSGPACK_OBJECT_BOOLEAN: return o->via.boolean ? s_jput(b, "true", 4) : s_jput(b, "false", 5);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        snprintf(num, sizeof num, "%llu", (unsigned long long)o->via.u64);
        return s_jput(b, num, strlen(num));
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)o->via.i64);
        return s_jput(b, num, strlen(num));
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!isfinite(o->via.f64)) {
            snprintf(why, wn, "a number is not finite (JSON has no NaN or infinity)");
            return STRATA_EINVAL_INPUT;
        }
        snprintf(num, sizeof num, "%.17g", o->via.f64);
        if (!strpbrk(num, ".eE")) strcat(num, ".0");
        return s_jput(b, num, strlen(num));
    case MSGPACK_OBJECT_STR: return s_jstr(b, o->via.str.ptr, o->via.str.size, why, wn);
    case MSGPACK_OBJECT_ARRAY:
        if ((rc = s_jput(b, "[", 1))) return rc;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i && (rc = s_jput(b, ",", 1))) return rc;
            if ((rc = s_to_json(b, &o->via.array.ptr[i], depth + 1, why, wn))) return rc;
        }
        return s_jput(b, "]", 1);
    case MSGPACK_OBJECT_MAP:
        if ((rc = s_jput(b, "{", 1))) return rc;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR) {
                snprintf(why, wn, "a map key is not a string");
                return STRATA_EINVAL_INPUT;
            }
            if (i && (rc = s_jput(b, ",", 1))) return rc;
            if ((rc = s_jstr(b, kv->key.via.str.ptr, kv->key.via.str.size, why, wn)) || (rc = s_jput(b, ":", 1)) ||
                (rc = s_to_json(b, &kv->val, depth + 1, why, wn)))
                return rc;
        }
        return s_jput(b, "}", 1);
    default:
        snprintf(why, wn, "bin and ext values have no JSON form");
        return STRATA_EINVAL_INPUT;
    }
}

static int s_decode_value(dctx_t *d, const fdesc_t *f, const msgpack_object *o, char *body, const path_t *path)
{
    char pb[192];
    rangetext_t rt;
    numtext_t nt;
    void *at = body + f->off;
    int64_t iv;
#define WRONG() s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field '%s': expected %s, got %s", CTX, f->name, \
                       s_kind_name(f->kind), s_obj_type_name(o))
    switch (f->kind) {
    case F_U64:
        if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': must be >= 0, got %lld", CTX, f->name,
                          (long long)o->via.i64);
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return WRONG();
        *(uint64_t *)at = o->via.u64;
        return 0;
    case F_I64:
    case F_I32:
        if (!s_is_int(o)) return WRONG();
        if (!s_int(o, &iv) || !s_in_range(f, (double)iv) || (f->kind == F_I32 && (iv < INT32_MIN || iv > INT32_MAX)))
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': must be in %s, got %s", CTX, f->name,
                          s_fmt_range(f->lo, f->hi, false, &rt), s_fmt_given(o, &nt));
        if (f->kind == F_I32) *(int32_t *)at = (int32_t)iv;
        else *(int64_t *)at = iv;
        return 0;
    case F_F32:
    case F_F64: {
        double v;
        if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) v = o->via.f64;
        else if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) v = (double)o->via.u64;
        else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) v = (double)o->via.i64;
        else return WRONG();
        /* check the value as it will be stored: a double that rounds to 0 as a float must
         * not pass an exclusive lower bound of 0; the message gives the value as sent */
        double given = v;
        if (f->kind == F_F32) v = (double)(float)v;
        if (!s_in_range(f, v)) {
            numtext_t kept;
            bool rounded = f->kind == F_F32 && s_in_range(f, given);
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': must be in %s, got %s%s%s%s", CTX, f->name,
                          s_fmt_range(f->lo, f->hi, f->flags & FL_LOEX, &rt), s_fmt_given(o, &nt), rounded ? " (" : "",
                          rounded ? s_fmt_double(v, true, &kept) : "", rounded ? " as a float32)" : "");
        }
        if (f->kind == F_F32) *(float *)at = (float)v;
        else *(double *)at = v;
        return 0;
    }
    case F_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN) return WRONG();
        *(bool *)at = o->via.boolean;
        return 0;
    case F_STR:
    case F_BIN: {
        const char *p;
        size_t n;
        if (o->type == MSGPACK_OBJECT_STR) { p = o->via.str.ptr; n = o->via.str.size; }
        else if (f->kind == F_BIN && o->type == MSGPACK_OBJECT_BIN) { p = o->via.bin.ptr; n = o->via.bin.size; }
        else return WRONG();
        if ((double)n < f->lo || (double)n > f->hi)
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': length must be in %s, got %zu", CTX,
                          f->name, s_fmt_range(f->lo, f->hi, false, &rt), n);
        return s_copy_str(d, p, n, at);
    }
    case F_JSON: {
        if (o->type == MSGPACK_OBJECT_STR) {
            size_t n = o->via.str.size;
            if ((double)n < f->lo || (double)n > f->hi)
                return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': length must be in %s, got %zu", CTX,
                              f->name, s_fmt_range(f->lo, f->hi, false, &rt), n);
            return s_copy_str(d, o->via.str.ptr, n, at);
        }
        if (o->type != ((f->flags & FL_JSONMAP) ? MSGPACK_OBJECT_MAP : MSGPACK_OBJECT_ARRAY)) return WRONG();
        jbuf_t jb = {0};
        char why[160] = "";
        int rc = s_to_json(&jb, o, 0, why, sizeof why);
        if (rc == 0) rc = s_copy_str(d, jb.p ? jb.p : "", jb.n, at);
        free(jb.p);
        if (rc == STRATA_EINVAL_INPUT)
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': %s", CTX, f->name, why);
        return rc;
    }
    case F_FINISH:
    case F_ERRCODE: {
        if (o->type != MSGPACK_OBJECT_STR) return WRONG();
        const char *p = o->via.str.ptr;
        size_t n = o->via.str.size;
        if (f->kind == F_ERRCODE) {
            msg_errcode_t c = msg_errcode_parse(p, n);
            if (c == MSG_E_NONE)
                return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': unknown error code", CTX, f->name);
            *(msg_errcode_t *)at = c;
        } else {
            int found = 0;
            for (int i = MSG_FINISH_STOP; i <= MSG_FINISH_CANCEL; i++)
                if (strlen(s_finish_names[i]) == n && !memcmp(s_finish_names[i], p, n)) found = i;
            if (!found)
                return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': must be stop, length or cancel", CTX, f->name);
            *(msg_finish_t *)at = (msg_finish_t)found;
        }
        return 0;
    }
    case F_I32S:
    case F_U64S:
    case F_F32S:
        if ((f->flags & FL_PACKED) && o->type == MSGPACK_OBJECT_BIN) return s_decode_packed(d, f, o, body, path);
        /* fall through */
    case F_STRS:
    case F_OBJARR: {
        if (o->type != MSGPACK_OBJECT_ARRAY) return WRONG();
        uint32_t n = o->via.array.size;
        if ((double)n < f->lo || (double)n > f->hi)
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': array must have %s elements, got %u", CTX,
                          f->name, s_fmt_range(f->lo, f->hi, false, &rt), n);
        int32_t *cnt = (int32_t *)(body + f->cnt);
        if ((f->flags & FL_SHCNT) && *cnt != 0 && *cnt != (int32_t)n)
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': length %u differs from a sibling array's %d",
                          CTX, f->name, n, *cnt);
        const msgpack_object *e = o->via.array.ptr;
        size_t esz = f->kind == F_I32S || f->kind == F_F32S ? 4 : f->kind == F_U64S ? 8 : f->kind == F_STRS ? sizeof(msg_str_t) : f->esz;
        char *arr = s_alloc(d->m, esz * (n ? n : 1));
        if (!arr) return STRATA_ENOMEM;
        if (f->kind == F_OBJARR) memset(arr, 0, esz * n);
        for (uint32_t i = 0; i < n; i++) {
            if (f->kind == F_I32S) {
                if (!s_is_int(&e[i]))
                    return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field '%s[%u]': expected an integer, got %s", CTX,
                                  f->name, i, s_obj_type_name(&e[i]));
                if (!s_int(&e[i], &iv) || (double)iv < f->elo || (double)iv > f->ehi)
                    return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s[%u]': must be in %s, got %s", CTX,
                                  f->name, i, s_fmt_range(f->elo, f->ehi, false, &rt), s_fmt_given(&e[i], &nt));
                ((int32_t *)arr)[i] = (int32_t)iv;
            } else if (f->kind == F_F32S) {
                double v;
                if (e[i].type == MSGPACK_OBJECT_FLOAT32 || e[i].type == MSGPACK_OBJECT_FLOAT64) v = e[i].via.f64;
                else if (e[i].type == MSGPACK_OBJECT_POSITIVE_INTEGER) v = (double)e[i].via.u64;
                else if (e[i].type == MSGPACK_OBJECT_NEGATIVE_INTEGER) v = (double)e[i].via.i64;
                else
                    return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field '%s[%u]': expected a number, got %s", CTX, f->name, i,
                                  s_obj_type_name(&e[i]));
                if (!s_f32_ok(f, (float)v))
                    return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s[%u]': must be in %s, got %s", CTX, f->name, i,
                                  s_fmt_range(f->elo, f->ehi, false, &rt), s_fmt_given(&e[i], &nt));
                ((float *)arr)[i] = (float)v;
            } else if (f->kind == F_U64S) {
                if (e[i].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                    return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field '%s[%u]': expected a non-negative integer, got %s",
                                  CTX, f->name, i, s_obj_type_name(&e[i]));
                ((uint64_t *)arr)[i] = e[i].via.u64;
            } else if (f->kind == F_STRS) {
                if (e[i].type != MSGPACK_OBJECT_STR)
                    return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field '%s[%u]': expected a string, got %s", CTX,
                                  f->name, i, s_obj_type_name(&e[i]));
                size_t len = e[i].via.str.size;
                if ((double)len < f->elo || (double)len > f->ehi)
                    return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s[%u]': length must be in %s, got %zu",
                                  CTX, f->name, i, s_fmt_range(f->elo, f->ehi, false, &rt), len);
                int rc = s_copy_str(d, e[i].via.str.ptr, len, &((msg_str_t *)arr)[i]);
                if (rc < 0) return rc;
            } else {
                char *elem = arr + esz * i;
                if (f->sub == s_f_step_seq) ((msg_step_seq_t *)elem)->samp.top_p = 1.0f;
                path_t sub = {path, f->name, (int64_t)i};
                if (e[i].type != MSGPACK_OBJECT_MAP)
                    return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: expected a map, got %s", s_path(&sub, pb, sizeof pb),
                                  s_obj_type_name(&e[i]));
                int rc = s_decode_fields(d, &e[i], f->sub, elem, &sub, false);
                if (rc < 0) return rc;
            }
        }
        *(void **)at = arr;
        *cnt = (int32_t)n;
        return 0;
    }
    case F_STATMAP: {
        if (o->type != MSGPACK_OBJECT_MAP) return WRONG();
        uint32_t n = o->via.map.size;
        int64_t rep = s_repeated_key(o);
        if (rep == -2) return STRATA_ENOMEM;
        if (rep >= 0) {
            char safe[65];
            return s_fail(d->err, MSG_E_MALFORMED, "%s: field '%s.%s' appears twice", CTX, f->name,
                          s_safe_key(&o->via.map.ptr[rep].key, safe));
        }
        if ((double)n > f->hi)
            return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field '%s': at most %s entries, got %u", CTX, f->name,
                          s_fmt_bound(f->hi, &nt), n);
        msg_stat_t *items = s_alloc(d->m, sizeof(msg_stat_t) * (n ? n : 1));
        if (!items) return STRATA_ENOMEM;
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
            if (k->type != MSGPACK_OBJECT_STR || k->via.str.size < f->elo || k->via.str.size > f->ehi)
                return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field '%s': keys must be strings of 1..128 bytes", CTX, f->name);
            double val;
            if (v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64) val = v->via.f64;
            else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) val = (double)v->via.u64;
            else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) val = (double)v->via.i64;
            else
                return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field '%s.%.*s': expected a number, got %s", CTX, f->name,
                              (int)k->via.str.size, k->via.str.ptr, s_obj_type_name(v));
            int rc = s_copy_str(d, k->via.str.ptr, k->via.str.size, &items[i].name);
            if (rc < 0) return rc;
            items[i].value = val;
        }
        msg_stats_t *st = (msg_stats_t *)at;
        st->items = items;
        st->n = (int32_t)n;
        return 0;
    }
    case F_OBJ:
        if (o->type != MSGPACK_OBJECT_MAP) return WRONG();
        {
            path_t sub = {path, f->name, -1};
            return s_decode_fields(d, o, f->sub, body, &sub, false);
        }
    }
#undef WRONG
    return s_fail(d->err, MSG_E_INTERNAL, "%s: field '%s': bad schema", CTX, f->name);
}

/* The top-level id, once the keys are known to be unique: a non-negative integer. */
static int s_check_id(dctx_t *d)
{
    const msgpack_object *id = d->id;
    if (!id || id->type == MSGPACK_OBJECT_POSITIVE_INTEGER) return 0;
    if (id->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return s_fail(d->err, MSG_E_INVALID_PARAM, "%s: field 'id': must be >= 0, got %lld", d->tname,
                      (long long)id->via.i64);
    return s_fail(d->err, MSG_E_WRONG_TYPE, "%s: field 'id': expected a non-negative integer, got %s", d->tname,
                  s_obj_type_name(id));
}

/* Seen-mask bits of the keys every top-level map has besides its fields. */
#define BIT_V 61
#define BIT_TYPE 62
#define BIT_ID 63

/* Decode one map of the message against its field table. Two passes: the first looks at the
 * keys alone (each a string, none repeated, each one the table defines), so a repeated key is
 * refused as malformed whatever its values are and wherever it sits; the second decodes the
 * values. top: the message's own map, which also holds v, type and id. */
static int s_decode_fields(dctx_t *d, const msgpack_object *map, const fdesc_t *fields, char *body,
                           const path_t *path, bool top)
{
    char pb[192], safe[65];
    uint64_t seen = 0;
    size_t nf = 0;
    while (fields[nf].name) nf++;
    STRATA_ASSERT(nf <= BIT_V);
    const msgpack_object_kv *kv = map->via.map.ptr;
    uint32_t n = map->via.map.size;
    uint8_t idx[BIT_V + 3]; /* [n] field index (or BIT_*) of key i; n fits once pass 1 passes */
    int64_t unknown = -1;   /* the first key the table does not define */
    size_t hint = 0;        /* encoders write fields in table order: try the next one first */
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *k = &kv[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return s_fail(d->err, MSG_E_MALFORMED, "%s: a key is a %s, not a string", CTX, s_obj_type_name(k));
        const char *kn = k->via.str.ptr;
        size_t kl = k->via.str.size;
        size_t j;
        if (top && kl == 1 && kn[0] == 'v') j = BIT_V;
        else if (top && kl == 4 && !memcmp(kn, "type", 4)) j = BIT_TYPE;
        else if (top && kl == 2 && !memcmp(kn, "id", 2)) j = BIT_ID;
        else {
#define NAME_IS(nm) (kl > 0 && (nm)[0] == kn[0] && strnlen((nm), kl + 1) == kl && !memcmp((nm), kn, kl))
            j = hint < nf && NAME_IS(fields[hint].name) ? hint : nf;
            if (j == nf)
                for (j = 0; j < nf; j++)
                    if (NAME_IS(fields[j].name)) break;
#undef NAME_IS
            if (j == nf) {
                if (unknown < 0) unknown = i;
                continue;
            }
            hint = j + 1;
        }
        if (seen & (1ull << j)) return s_fail(d->err, MSG_E_MALFORMED, "%s: field '%s' appears twice", CTX, s_safe_key(k, safe));
        seen |= 1ull << j;
        if (i < sizeof idx) idx[i] = (uint8_t)j;
    }
    if (unknown >= 0) {
        /* refused either way; a repeat among the unknown keys is still a malformed map */
        int64_t rep = s_repeated_key(map);
        if (rep == -2) return STRATA_ENOMEM;
        if (rep >= 0)
            return s_fail(d->err, MSG_E_MALFORMED, "%s: field '%s' appears twice", CTX, s_safe_key(&kv[rep].key, safe));
        return s_fail(d->err, MSG_E_UNKNOWN_FIELD, "%s: unknown field '%s'", CTX, s_safe_key(&kv[unknown].key, safe));
    }
    /* every key known and none twice: at most nf + 3 of them */
    STRATA_ASSERT(n <= sizeof idx);
    if (top) {
        int rc = s_check_id(d);
        if (rc < 0) return rc;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (idx[i] >= BIT_V) continue;
        int rc = s_decode_value(d, &fields[idx[i]], &kv[i].val, body, path);
        if (rc < 0) return rc;
    }
    for (size_t j = 0; j < nf; j++)
        if ((fields[j].flags & FL_REQ) && !(seen & (1ull << j)))
            return s_fail(d->err, MSG_E_MISSING_FIELD, "%s: missing field '%s'", CTX, fields[j].name);
    return 0;
}

static const msgpack_object *s_map_get(const msgpack_object *map, const char *key, int *dup)
{
    size_t kl = strlen(key);
    const msgpack_object *r = NULL;
    *dup = 0;
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == kl && !memcmp(k->via.str.ptr, key, kl)) {
            if (r) *dup = 1;
            r = &map->via.map.ptr[i].val;
        }
    }
    return r;
}

int msg_decode(msg_family_t fam, const void *buf, size_t len, msg_t *m, msg_err_t *err)
{
    int rc = 0;
    msgpack_zone zone;
    msgpack_object obj;
    bool have_zone = false;
    dctx_t d = {m, err, MSG_INVALID, NULL, NULL};
    msg_init(m, MSG_INVALID);
    if (err) {
        err->code = MSG_E_NONE;
        err->text[0] = 0;
    }
    if ((unsigned)fam >= MSG_FAM_COUNT) return s_fail(err, MSG_E_INTERNAL, "bad family %d", (int)fam);
    if (len == 0) return s_fail(err, MSG_E_MALFORMED, "empty frame");

    const unsigned char *p = buf, *end = p + len;
    int sr = s_scan(&p, end, 0);
    if (sr == -2) return s_fail(err, MSG_E_MALFORMED, "msgpack nested deeper than %d", MSG_MAX_DEPTH);
    if (sr < 0) return s_fail(err, MSG_E_MALFORMED, "not valid msgpack (truncated or bad header)");
    if (p != end) return s_fail(err, MSG_E_MALFORMED, "%zu trailing bytes after the message", (size_t)(end - p));

    /* One zone sized for this frame (the scan bounds the objects at one per byte, 24 bytes
     * each), and one chunk of our own sized likewise: small messages then live in two small
     * allocations instead of msgpack-c's default 8 KiB chunk. */
    size_t zc = 24 * len + 256;
    if (zc > (1u << 20)) zc = 1u << 20;
    if (!msgpack_zone_init(&zone, zc)) return STRATA_ENOMEM;
    have_zone = true;
    if (s_reserve(m, len * 6 + 64 < 4096 ? len * 6 + 64 : 4096) < 0) { rc = STRATA_ENOMEM; goto fail; }
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack(buf, len, &off, &zone, &obj);
    if (ur != MSGPACK_UNPACK_SUCCESS || off != len) {
        rc = ur == MSGPACK_UNPACK_NOMEM_ERROR ? STRATA_ENOMEM : s_fail(err, MSG_E_MALFORMED, "not valid msgpack");
        goto fail;
    }
    const msgpack_object *o = &obj;
    if (o->type != MSGPACK_OBJECT_MAP) {
        rc = s_fail(err, MSG_E_MALFORMED, "message is a %s, not a map", s_obj_type_name(o));
        goto fail;
    }
    /* id first, so that every later error can still name the request (unless the id is
     * itself repeated: then there is no one id to name). Each lookup has its own repeat flag. */
    int dup_id, dup_v, dup_ty;
    const msgpack_object *id = s_map_get(o, "id", &dup_id);
    if (id && !dup_id && id->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        m->has_id = true;
        m->id = id->via.u64;
    }
    const msgpack_object *v = s_map_get(o, "v", &dup_v);
    if (v && dup_v) { rc = s_fail(err, MSG_E_MALFORMED, "field 'v' appears twice"); goto fail; }
    if (!v) { rc = s_fail(err, MSG_E_BAD_VERSION, "missing field 'v' (protocol version, %d)", PROTO_VERSION); goto fail; }
    int64_t vv;
    if (!s_int(v, &vv) || vv != PROTO_VERSION) {
        if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            rc = s_fail(err, MSG_E_BAD_VERSION, "protocol version %llu is not supported (this is %d)",
                        (unsigned long long)v->via.u64, PROTO_VERSION);
        else {
            numtext_t nt;
            rc = s_fail(err, MSG_E_BAD_VERSION, "field 'v' must be the integer %d, got %s", PROTO_VERSION,
                        s_is_int(v) || v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64
                            ? s_fmt_given(v, &nt)
                            : s_obj_type_name(v));
        }
        goto fail;
    }
    const msgpack_object *ty = s_map_get(o, "type", &dup_ty);
    if (ty && dup_ty) { rc = s_fail(err, MSG_E_MALFORMED, "field 'type' appears twice"); goto fail; }
    if (!ty || ty->type != MSGPACK_OBJECT_STR) {
        rc = s_fail(err, MSG_E_UNKNOWN_TYPE, "field 'type' %s", !ty ? "is missing" : "is not a string");
        goto fail;
    }
    const tdesc_t *td = NULL;
    for (size_t i = 0; i < N_TYPES; i++) {
        const tdesc_t *t = &s_types[i];
        if (t->fam == fam && strlen(t->name) == ty->via.str.size && !memcmp(t->name, ty->via.str.ptr, ty->via.str.size)) {
            td = t;
            break;
        }
    }
    if (!td) {
        char safe[65];
        rc = s_fail(err, MSG_E_UNKNOWN_TYPE, "unknown message type '%s'", s_safe_key(ty, safe));
        goto fail;
    }
    msg_mem_t *mem = m->mem; /* msg_init clears the struct; keep the reserved chunk */
    msg_init(m, td->type);
    m->mem = mem;
    m->has_id = id && !dup_id && id->type == MSGPACK_OBJECT_POSITIVE_INTEGER;
    m->id = m->has_id ? id->via.u64 : 0;
    d.type = td->type;
    d.tname = td->name;
    d.id = id;
    /* refuses any repeated key (id included) as malformed, then a bad id, then the fields */
    path_t top = {NULL, td->name, -1};
    rc = s_decode_fields(&d, o, td->fields, (char *)&m->u, &top, true);
    if (rc < 0) goto fail;
    if (td->id_required && !id) { rc = s_fail(err, MSG_E_MISSING_FIELD, "%s: missing field 'id'", td->name); goto fail; }
    rc = s_check_type(td->type, &m->u, td->name, err);
    if (rc < 0) goto fail;
    msgpack_zone_destroy(&zone);
    return 0;
fail:
    if (have_zone) msgpack_zone_destroy(&zone);
    return rc;
}

/* ---- encoding ---- */

static int s_buf_write(void *data, const char *p, size_t n)
{
    msg_buf_t *b = data;
    if (b->cap - b->size < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->size < n) cap *= 2;
        char *nd = realloc(b->data, cap);
        if (!nd) return -1;
        b->data = nd;
        b->cap = cap;
    }
    memcpy(b->data + b->size, p, n);
    b->size += n;
    return 0;
}

void msg_buf_free(msg_buf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* Does this field go on the wire? Required ones always; optional strings and arrays when
 * present; optional scalars when they differ from their default (the decoder fills the
 * default back in), which keeps a greedy step plan small. */
static bool s_emitted(const fdesc_t *f, const char *body)
{
    const void *at = body + f->off;
    bool req = f->flags & FL_REQ;
    double def = (f->flags & FL_DEF1) ? 1 : (f->flags & FL_DEFM1) ? -1 : 0;
    switch (f->kind) {
    case F_STR: case F_BIN: case F_JSON: return ((const msg_str_t *)at)->s != NULL;
    case F_I32S: case F_U64S: case F_F32S: case F_STRS: case F_OBJARR: return req || *(const void *const *)at != NULL;
    case F_U64: return req || *(const uint64_t *)at != 0;
    case F_I64: return req || (double)*(const int64_t *)at != def;
    case F_I32: return req || (double)*(const int32_t *)at != def;
    case F_F32: return req || (double)*(const float *)at != def;
    case F_F64: return req || *(const double *)at != def;
    case F_BOOL: return req || (double)*(const bool *)at != def;
    default: return true;
    }
}

typedef struct {
    msgpack_packer pk;
    msg_err_t err;
    const char *tname;
} ectx_t;

static int s_encode_fields(ectx_t *e, const fdesc_t *fields, const char *body);

#define PK(x) do { if ((x) != 0) return STRATA_ENOMEM; } while (0)

static int s_encode_value(ectx_t *e, const fdesc_t *f, const char *body)
{
    const void *at = body + f->off;
    msgpack_packer *pk = &e->pk;
    switch (f->kind) {
    case F_U64: PK(msgpack_pack_uint64(pk, *(const uint64_t *)at)); return 0;
    case F_I64:
    case F_I32: {
        int64_t v = f->kind == F_I32 ? *(const int32_t *)at : *(const int64_t *)at;
        if (!s_in_range(f, (double)v))
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s' out of range: %lld", e->tname, f->name, (long long)v);
        PK(msgpack_pack_int64(pk, v));
        return 0;
    }
    case F_F32: {
        float v = *(const float *)at;
        if (!s_in_range(f, v)) {
            numtext_t t;
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s' out of range: %s", e->tname, f->name,
                          s_fmt_double(v, true, &t));
        }
        PK(msgpack_pack_float(pk, v));
        return 0;
    }
    case F_F64: {
        double v = *(const double *)at;
        if (!s_in_range(f, v)) {
            numtext_t t;
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s' out of range: %s", e->tname, f->name,
                          s_fmt_double(v, false, &t));
        }
        PK(msgpack_pack_double(pk, v));
        return 0;
    }
    case F_BOOL: PK(*(const bool *)at ? msgpack_pack_true(pk) : msgpack_pack_false(pk)); return 0;
    case F_STR:
    case F_BIN:
    case F_JSON: {
        const msg_str_t *s = at;
        if ((double)s->len < f->lo || (double)s->len > f->hi)
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s': bad length %zu", e->tname, f->name, s->len);
        if (f->kind == F_BIN) PK(msgpack_pack_bin_with_body(pk, s->s, s->len));
        else PK(msgpack_pack_str_with_body(pk, s->s, s->len));
        return 0;
    }
    case F_FINISH: {
        msg_finish_t fi = *(const msg_finish_t *)at;
        if (fi < MSG_FINISH_STOP || fi > MSG_FINISH_CANCEL)
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s': no finish reason", e->tname, f->name);
        PK(msgpack_pack_str_with_body(pk, s_finish_names[fi], strlen(s_finish_names[fi])));
        return 0;
    }
    case F_ERRCODE: {
        msg_errcode_t c = *(const msg_errcode_t *)at;
        if (c <= MSG_E_NONE || c >= MSG_E_COUNT)
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s': no error code", e->tname, f->name);
        PK(msgpack_pack_str_with_body(pk, s_errnames[c], strlen(s_errnames[c])));
        return 0;
    }
    case F_I32S:
    case F_U64S:
    case F_F32S:
    case F_STRS:
    case F_OBJARR: {
        int32_t n = *(const int32_t *)(body + f->cnt);
        const char *arr = *(const char *const *)at;
        if ((double)n < f->lo || (double)n > f->hi || (n > 0 && !arr))
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s': bad element count %d", e->tname, f->name, n);
        if (f->flags & FL_PACKED) {
            size_t esz = f->kind == F_U64S ? 8 : 4;
            if (f->kind == F_F32S)
                for (int32_t i = 0; i < n; i++)
                    if (!s_f32_ok(f, ((const float *)arr)[i])) {
                        numtext_t t;
                        return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s[%d]' out of range: %s", e->tname, f->name, i,
                                      s_fmt_double(((const float *)arr)[i], true, &t));
                    }
            PK(msgpack_pack_bin(pk, esz * (size_t)n));
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            if (f->kind == F_I32S)
                for (int32_t i = 0; i < n; i++) {
                    int32_t x = ((const int32_t *)arr)[i];
                    if ((double)x < f->elo || (double)x > f->ehi)
                        return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s[%d]' out of range: %d", e->tname,
                                      f->name, i, x);
                }
            if (n) PK(msgpack_pack_bin_body(pk, arr, esz * (size_t)n)); /* the host order is the wire order */
            return 0;
#endif
            unsigned char tmp[256];
            size_t k = 0;
            for (int32_t i = 0; i < n; i++) {
                uint64_t v;
                if (f->kind == F_I32S) {
                    int32_t x = ((const int32_t *)arr)[i];
                    if ((double)x < f->elo || (double)x > f->ehi)
                        return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s[%d]' out of range: %d", e->tname,
                                      f->name, i, x);
                    v = (uint32_t)x;
                } else if (f->kind == F_F32S) {
                    uint32_t u;
                    memcpy(&u, &((const float *)arr)[i], 4);
                    v = u;
                } else {
                    v = ((const uint64_t *)arr)[i];
                }
                for (size_t b = 0; b < esz; b++) tmp[k++] = (unsigned char)(v >> (8 * b));
                if (k + 8 > sizeof tmp || i == n - 1) {
                    PK(msgpack_pack_bin_body(pk, tmp, k));
                    k = 0;
                }
            }
            return 0;
        }
        PK(msgpack_pack_array(pk, (size_t)n));
        for (int32_t i = 0; i < n; i++) {
            if (f->kind == F_I32S) {
                int32_t v = ((const int32_t *)arr)[i];
                if ((double)v < f->elo || (double)v > f->ehi)
                    return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s[%d]' out of range: %d", e->tname, f->name, i, v);
                PK(msgpack_pack_int32(pk, v));
            } else if (f->kind == F_U64S) {
                PK(msgpack_pack_uint64(pk, ((const uint64_t *)arr)[i]));
            } else if (f->kind == F_F32S) {
                float v = ((const float *)arr)[i];
                if (!s_f32_ok(f, v)) {
                    numtext_t t;
                    return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s[%d]' out of range: %s", e->tname, f->name, i,
                                  s_fmt_double(v, true, &t));
                }
                PK(msgpack_pack_float(pk, v));
            } else if (f->kind == F_STRS) {
                const msg_str_t *s = &((const msg_str_t *)arr)[i];
                if (!s->s || (double)s->len < f->elo || (double)s->len > f->ehi)
                    return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s[%d]': bad length", e->tname, f->name, i);
                PK(msgpack_pack_str_with_body(pk, s->s, s->len));
            } else {
                int rc = s_encode_fields(e, f->sub, arr + f->esz * (size_t)i);
                if (rc < 0) return rc;
            }
        }
        return 0;
    }
    case F_STATMAP: {
        const msg_stats_t *st = at;
        if (st->n < 0 || (double)st->n > f->hi || (st->n > 0 && !st->items))
            return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s': bad entry count %d", e->tname, f->name, st->n);
        PK(msgpack_pack_map(pk, (size_t)st->n));
        for (int32_t i = 0; i < st->n; i++) {
            const msg_str_t *nm = &st->items[i].name;
            if (!nm->s || (double)nm->len < f->elo || (double)nm->len > f->ehi)
                return s_fail(&e->err, MSG_E_INVALID_PARAM, "%s: field '%s[%d]': bad name", e->tname, f->name, i);
            PK(msgpack_pack_str_with_body(pk, nm->s, nm->len));
            PK(msgpack_pack_double(pk, st->items[i].value));
        }
        return 0;
    }
    case F_OBJ: return s_encode_fields(e, f->sub, body);
    }
    return s_fail(&e->err, MSG_E_INTERNAL, "bad schema");
}

static int s_encode_fields(ectx_t *e, const fdesc_t *fields, const char *body)
{
    size_t n = 0;
    for (const fdesc_t *f = fields; f->name; f++) n += s_emitted(f, body);
    PK(msgpack_pack_map(&e->pk, n));
    for (const fdesc_t *f = fields; f->name; f++) {
        if (!s_emitted(f, body)) continue;
        PK(msgpack_pack_str_with_body(&e->pk, f->name, strlen(f->name)));
        int rc = s_encode_value(e, f, body);
        if (rc < 0) return rc;
    }
    return 0;
}

int msg_encode(const msg_t *m, msg_buf_t *b)
{
    b->size = 0;
    const tdesc_t *td = s_type_desc(m->type);
    if (!td) return STRATA_EINVAL_INPUT;
    if (td->id_required && !m->has_id) return STRATA_EINVAL_INPUT;
    const char *body = (const char *)&m->u;
    ectx_t e;
    e.tname = td->name;
    msgpack_packer_init(&e.pk, b, s_buf_write);
    int rc = s_check_type(m->type, body, td->name, &e.err);
    if (rc < 0) return rc;
    size_t n = 2 + (m->has_id ? 1 : 0);
    for (const fdesc_t *f = td->fields; f->name; f++) n += s_emitted(f, body);
    PK(msgpack_pack_map(&e.pk, n));
    PK(msgpack_pack_str_with_body(&e.pk, "v", 1));
    PK(msgpack_pack_int(&e.pk, PROTO_VERSION));
    PK(msgpack_pack_str_with_body(&e.pk, "type", 4));
    PK(msgpack_pack_str_with_body(&e.pk, td->name, strlen(td->name)));
    if (m->has_id) {
        PK(msgpack_pack_str_with_body(&e.pk, "id", 2));
        PK(msgpack_pack_uint64(&e.pk, m->id));
    }
    for (const fdesc_t *f = td->fields; f->name; f++) {
        if (!s_emitted(f, body)) continue;
        PK(msgpack_pack_str_with_body(&e.pk, f->name, strlen(f->name)));
        rc = s_encode_value(&e, f, body);
        if (rc < 0) {
            if (rc != STRATA_ENOMEM) log_debug("msg_encode: %s", e.err.text);
            return rc;
        }
    }
    return 0;
}

int msg_lp_reserve(float **lp, int32_t **top_tokens, float **top_logprobs, size_t cap, int32_t top_n)
{
    const size_t k = (size_t)(top_n > 0 ? top_n : 1);
    float *l = realloc(*lp, cap * sizeof *l);
    if (l) *lp = l;
    int32_t *t = realloc(*top_tokens, cap * k * sizeof *t);
    if (t) *top_tokens = t;
    float *p = realloc(*top_logprobs, cap * k * sizeof *p);
    if (p) *top_logprobs = p;
    return l && t && p ? 0 : STRATA_ENOMEM;
}
