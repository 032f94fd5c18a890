/* msg.h - every control-plane message of the process group, and its msgpack codecs.
 *
 * The wire format is documented in proto/PROTOCOL.md. In short: one ZeroMQ frame carries one
 * msgpack map with "v" (PROTO_VERSION), "type" (a string), an optional "id" (uint64) and the
 * fields of that type. Decoders are strict: unknown fields, wrong value types, missing
 * required fields, values out of the schema's range and any other version are refused with
 * a msg_err_t naming the field. Limits that depend on the config or the model (context
 * length, vocab, frame size) are checked by the services, not here.
 *
 * Messages are grouped into families by direction; a decoder is given the family it expects,
 * so one wire name ("cancel", "error", "hello", ...) can mean different things in different
 * families. A decoded msg_t owns its arrays and strings; msg_free() releases them. Encoders
 * read caller-owned data and never keep pointers.
 */
#ifndef STRATA_PROTO_MSG_H
#define STRATA_PROTO_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strata.h"

#define PROTO_VERSION 1

/* Schema limits (absolute; services apply tighter ones from the config and the model). */
#define MSG_MAX_TOKENS_ARRAY (1 << 22) /* ids in one array field */
#define MSG_MAX_STOP 16                /* stop strings per request */
#define MSG_MAX_STOP_LEN 256           /* bytes per stop string */
#define MSG_MAX_CLIENT_ID 255          /* bytes of a ZeroMQ routing id */
#define MSG_MAX_MAX_TOKENS (1 << 20)   /* upper bound of max_tokens */
#define MSG_MAX_TEMPERATURE 100.0f
#define MSG_MAX_TOP_K (1 << 20)
#define MSG_MAX_STEP_SEQS 4096         /* sequences in one step plan */
#define MSG_MAX_STATS 1024             /* entries in a stats reply */
#define MSG_MAX_DEPTH 16               /* msgpack nesting accepted by decoders */
#define MSG_MAX_JSON_DEPTH 12          /* nesting of a messages / template_vars value given as msgpack */
#define MSG_MAX_TOP_LOGPROBS 20        /* most likely alternatives returned per token */
#define MSG_MAX_TOKEN_TEXT 65536       /* bytes of one token's text in token_text / top_text */
#define MSG_MAX_EOS 16                 /* end-of-sequence ids in a hello (eos_ids) */

typedef enum {
    MSG_FAM_CLIENT = 0,   /* client -> router */
    MSG_FAM_REPLY,        /* router -> client */
    MSG_FAM_SCHED_IN,     /* router -> scheduler */
    MSG_FAM_SCHED_OUT,    /* scheduler -> router */
    MSG_FAM_EXEC_IN,      /* scheduler -> executor */
    MSG_FAM_EXEC_OUT,     /* executor -> scheduler */
    MSG_FAM_PF_IN,        /* anyone -> prefetcher */
    MSG_FAM_PF_OUT,       /* prefetcher -> requester */
    MSG_FAM_COUNT
} msg_family_t;

/* Message types; the comment gives the family and the wire "type" string. */
typedef enum {
    MSG_INVALID = 0,
    /* client -> router */
    MSG_GENERATE = 1,         /* "generate"  body: generate; id required */
    MSG_CANCEL,               /* "cancel"    no body; id required */
    MSG_RESUME,               /* "resume"    body: resume; id required */
    MSG_HEALTH,               /* "health"    no body */
    MSG_STATS,                /* "stats"     no body */
    MSG_MODELS,               /* "models"    no body */
    /* router -> client */
    MSG_TOKEN = 20,           /* "token"     body: tokens (with text) */
    MSG_DONE,                 /* "done"      body: done */
    MSG_ERROR,                /* "error"     body: error; id present when the request's id was readable */
    MSG_HEALTH_REPLY,         /* "health"    body: health */
    MSG_STATS_REPLY,          /* "stats"     body: stats */
    MSG_MODELS_REPLY,         /* "models"    body: models */
    /* router -> scheduler; id = the internal request id (see PROTOCOL.md) */
    MSG_SUBMIT = 40,          /* "submit"    body: submit */
    MSG_SCHED_CANCEL,         /* "cancel"    no body */
    MSG_SCHED_RESUME,         /* "resume"    body: resume */
    MSG_SCHED_STATS,          /* "stats"     no body */
    MSG_SCHED_HELLO,          /* "hello"     no body */
    /* scheduler -> router */
    MSG_SCHED_TOKENS = 60,    /* "tokens"    body: tokens (text absent) */
    MSG_SCHED_DONE,           /* "done"      body: done (text/tokens absent) */
    MSG_SCHED_ERROR,          /* "error"     body: error */
    MSG_SCHED_STATS_REPLY,    /* "stats"     body: stats */
    MSG_SCHED_HELLO_REPLY,    /* "hello"     body: hello */
    MSG_SCHED_STEP_TOKENS,    /* "step_tokens" body: step_tokens; one token each for many requests */
    /* scheduler -> executor */
    MSG_EXEC_HELLO = 80,      /* "hello"     no body */
    MSG_STEP,                 /* "step"      body: step; id = step number */
    MSG_EXEC_STATS,           /* "stats"     no body */
    /* executor -> scheduler */
    MSG_EXEC_HELLO_REPLY = 100, /* "hello"   body: hello */
    MSG_STEP_RESULT,          /* "result"    body: result; id = the plan's step number */
    MSG_EXEC_ERROR,           /* "error"     body: error; id = the plan's step number if known */
    MSG_EXEC_STATS_REPLY,     /* "stats"     body: stats (executor counters, incl. the GPU expert cache) */
    /* anyone -> prefetcher, prefetcher -> requester */
    MSG_PF_STATUS = 120,      /* "status"    no body */
    MSG_PF_STATUS_REPLY,      /* "status"    body: pf_status */
} msg_type_t;

/* Error codes carried by "error" messages and returned by the decoders (wire: the string). */
typedef enum {
    MSG_E_NONE = 0,
    MSG_E_MALFORMED,        /* "malformed"        not msgpack, not a map, trailing bytes, too deep, repeated key */
    MSG_E_BAD_VERSION,      /* "bad_version"      "v" missing or not PROTO_VERSION */
    MSG_E_UNKNOWN_TYPE,     /* "unknown_type"     "type" missing or not known in this family */
    MSG_E_WRONG_TYPE,       /* "wrong_type"       a field has the wrong msgpack type */
    MSG_E_UNKNOWN_FIELD,    /* "unknown_field"    a field this type does not have */
    MSG_E_MISSING_FIELD,    /* "missing_field"    a required field is absent */
    MSG_E_INVALID_PARAM,    /* "invalid_param"    a value out of range (max_tokens <= 0, top_p > 1, ...) */
    MSG_E_TOO_LARGE,        /* "too_large"        frame over the configured size limit */
    MSG_E_CONTEXT_OVERFLOW, /* "context_overflow" prompt (+ max_tokens) longer than the context */
    MSG_E_BUSY,             /* "busy"             queue full or per-client in-flight limit reached */
    MSG_E_NOT_FOUND,        /* "not_found"        cancel/resume of an unknown request id */
    MSG_E_DUPLICATE,        /* "duplicate"        generate with an id already in flight */
    MSG_E_UNAVAILABLE,      /* "unavailable"      a backend service is down; retry later */
    MSG_E_INTERNAL,         /* "internal"         a bug or runtime failure */
    MSG_E_SHUTTING_DOWN,    /* "shutting_down"    the service is stopping */
    MSG_E_COUNT
} msg_errcode_t;

typedef enum {
    MSG_FINISH_NONE = 0,
    MSG_FINISH_STOP,    /* "stop"    eos token or a stop string */
    MSG_FINISH_LENGTH,  /* "length"  max_tokens reached, or the context is full */
    MSG_FINISH_CANCEL,  /* "cancel"  canceled by the client, or the client went away */
} msg_finish_t;

/* A byte string; s == NULL means absent. Decoded strings are also NUL-terminated. */
typedef struct {
    const char *s;
    size_t len;  /* bytes, without the NUL */
} msg_str_t;

/* Sampling parameters. Schema ranges: temperature [0, 100] (0 = greedy); top_p (0, 1]
 * (1 = off); top_k [0, MSG_MAX_TOP_K] (0 = off). Defaults: 0, 1, 0, seed 0. */
typedef struct {
    float temperature;
    float top_p;
    int32_t top_k;
    uint64_t seed;
} msg_sampling_t;

/* generate: exactly one of prompt / tokens / messages. */
typedef struct {
    msg_str_t prompt;           /* UTF-8 text, or absent */
    msg_str_t messages;         /* chat: JSON text of an array of message objects, which the router renders
                                   with the model's chat template into the prompt; on the wire a str of
                                   JSON or a msgpack array (decoded to JSON text); or absent */
    msg_str_t template_vars;    /* chat only: JSON text of an object of further template variables (tools,
                                   enable_thinking, ...); a str of JSON or a msgpack map on the wire; or absent */
    bool add_generation_prompt; /* chat only: default true */
    const int32_t *tokens;      /* [n_tokens] token ids >= 0, or NULL */
    int32_t n_tokens;
    int32_t max_tokens;         /* [1, MSG_MAX_MAX_TOKENS]; required */
    msg_sampling_t samp;
    int32_t n_stop;             /* [0, MSG_MAX_STOP] */
    const msg_str_t *stop;      /* [n_stop] stop strings, 1..MSG_MAX_STOP_LEN bytes each */
    bool stream;                /* default true: token events; false: one done with text */
    bool ignore_eos;            /* default false: keep going past the model's eos token */
    bool logprobs;              /* default false: return each generated token's log-probability */
    int32_t top_logprobs;       /* [0, MSG_MAX_TOP_LOGPROBS], only with logprobs: and that many most
                                   likely tokens at each position */
} msg_generate_t;

/* resume: send the rest of a request. Client family: after a router restart the client
 * re-sends what it knows (PROTOCOL.md, "Resume"); scheduler family: only `from` is used. */
typedef struct {
    int64_t from;               /* generated tokens the client already has, >= 0 */
    int64_t text_from;          /* client only: bytes of text it already has, >= 0 (default 0) */
    int32_t n_stop;             /* client only: the request's stop strings again */
    const msg_str_t *stop;      /* [n_stop] */
    bool stream;                /* client only: default true */
} msg_resume_t;

/* Log-probabilities of the tokens of one message of one request (token, tokens, done), present
 * only when the request asked for them (PROTOCOL.md "Log-probabilities"): the model's own
 * distribution at each position, log-softmax of the raw logits (before temperature, top-k and
 * top-p). Absent: logprobs NULL, every count 0. With them, for the message's n tokens:
 * n_logprobs = n, n_top_tokens = n_top_logprobs = n * top_n, and in the client family
 * n_token_text = n and n_top_text = n * top_n (or 0 when the router has no tokenizer). */
typedef struct {
    int32_t n_logprobs;
    const float *logprobs;      /* [n] each token's log-probability, <= 0 */
    int32_t top_n;              /* alternatives per token: the request's top_logprobs, at most the vocab */
    int32_t n_top_tokens, n_top_logprobs;
    const int32_t *top_tokens;  /* [n][top_n] the most likely ids at each position, most likely first */
    const float *top_logprobs;  /* [n][top_n] theirs */
    int32_t n_token_text, n_top_text;
    const msg_str_t *token_text; /* client family: [n] each token decoded on its own (UTF-8) */
    const msg_str_t *top_text;  /* client family: [n][top_n] each alternative decoded on its own */
} msg_logprobs_t;

/* Grows a holder's log-probability arrays to cap tokens: lp [cap], top_tokens and top_logprobs
 * [cap][max(top_n, 1)], each realloc'd (one that fails keeps its old block). 0 or STRATA_ENOMEM. */
int msg_lp_reserve(float **lp, int32_t **top_tokens, float **top_logprobs, size_t cap, int32_t top_n);

/* token (router -> client) and tokens (scheduler -> router). */
typedef struct {
    int64_t index;              /* index of tokens[0] among the request's generated tokens */
    int32_t n_tokens;
    const int32_t *tokens;      /* [n_tokens] */
    msg_str_t text;             /* token only: UTF-8 text newly final (may be empty); absent internally */
    msg_logprobs_t lp;          /* of tokens[], when the request asked */
} msg_tokens_t;

typedef struct {
    msg_finish_t finish;
    int32_t prompt_tokens;      /* usage */
    int32_t completion_tokens;
    double queue_ms;            /* timings: submit -> first step that included the request */
    double ttft_ms;             /* submit -> first generated token */
    double total_ms;            /* submit -> done */
    msg_str_t text;             /* client, stream=false only: the whole answer; else absent */
    int32_t n_tokens;           /* client, stream=false only: the generated ids; else 0 */
    const int32_t *tokens;
    msg_logprobs_t lp;          /* client, stream=false only, when the request asked: of tokens[] */
} msg_done_t;

typedef struct {
    msg_errcode_t code;
    msg_str_t message;          /* one line, names the field or the limit */
} msg_error_t;

typedef struct {
    msg_str_t status;           /* "ok" or "degraded" */
    bool scheduler;             /* the router hears from the scheduler */
    double uptime_s;
    int32_t queue;              /* requests in flight at the router */
} msg_health_t;

typedef struct {
    msg_str_t name;             /* "router.requests", "scheduler.steps", ... */
    double value;
} msg_stat_t;

typedef struct {
    int32_t n;
    const msg_stat_t *items;    /* [n] */
} msg_stats_t;

typedef struct {
    msg_str_t name;
    int32_t vocab;
    int32_t max_context;        /* tokens: prompt + generated */
} msg_model_t;

typedef struct {
    int32_t n;
    const msg_model_t *models;  /* [n] */
} msg_models_t;

/* submit: router -> scheduler. id = internal request id = msg_request_id(client, cid). */
typedef struct {
    msg_str_t client;           /* the client's ZeroMQ routing id (bytes, <= MSG_MAX_CLIENT_ID) */
    uint64_t cid;               /* the client's own request id */
    int32_t n_prompt;           /* >= 1 */
    const int32_t *prompt;      /* [n_prompt] token ids */
    int32_t max_tokens;         /* [1, MSG_MAX_MAX_TOKENS] */
    msg_sampling_t samp;
    bool ignore_eos;            /* do not stop at the model's eos token */
    bool logprobs;              /* return each token's log-probability (msg_generate_t) */
    int32_t top_logprobs;       /* [0, MSG_MAX_TOP_LOGPROBS], only with logprobs */
} msg_submit_t;

/* hello reply: a service describes itself (executor -> scheduler, scheduler -> router). */
typedef struct {
    uint64_t instance;          /* random per process start; changes on every restart */
    int32_t pid;
    msg_str_t model;            /* model name (folder base name) */
    int32_t vocab;
    int32_t max_context;        /* tokens */
    int32_t bos_id, eos_id;     /* -1 if none; eos_id = eos_ids[0] when eos_ids is given */
    int32_t kv_blocks;          /* KV blocks the executor holds (0 if unknown) */
    int32_t block_size;         /* tokens per KV block */
    double load_ms;             /* time to build the model at start (arena attach, not disk) */
    int32_t n_eos;              /* [1, MSG_MAX_EOS] when eos_ids is given */
    const int32_t *eos_ids;     /* [n_eos] every id that ends a generation, distinct, in [0, vocab); NULL:
                                   absent, the set is {eos_id} (or none when eos_id is -1) */
    int32_t sliding_window;     /* tokens a sliding-window layer attends to, itself included (gpt-oss);
                                   0: no layer slides. The scheduler then gives each sequence a window
                                   table (msg_step_seq_t.win_blocks) */
} msg_hello_t;

/* The stop set of a hello into ids[MSG_MAX_EOS]: eos_ids when given, else eos_id alone when it is
 * >= 0. Returns how many (0: the model has no eos). */
int32_t msg_hello_eos(const msg_hello_t *h, int32_t *ids);

/* One sequence of a step plan. Its tokens sit at positions pos0 .. pos0+n_tokens-1; the
 * executor writes their K/V into blocks[] and, if sample, samples the next token from the
 * logits of the last one with RNG stream (samp.seed, n_sampled). With win_blocks (a model with
 * sliding-window layers), the sliding layers write and read their K/V through win_blocks
 * instead, indexed as blocks (position p in entry p / block_size); entries below every later
 * query's window are -1 (freed). */
typedef struct {
    uint64_t req;               /* scheduler request id */
    int32_t pos0;               /* >= 0 */
    int32_t n_tokens;           /* >= 1 */
    const int32_t *tokens;      /* [n_tokens] input ids */
    int32_t n_blocks;           /* >= ceil((pos0+n_tokens)/block_size) */
    const int32_t *blocks;      /* [n_blocks] KV block ids >= 0 */
    bool sample;
    msg_sampling_t samp;
    uint64_t n_sampled;         /* tokens already sampled for this request (RNG counter) */
    bool last;                  /* sample, and the token is the request's last (its length limit): no
                                   step of this sequence follows */
    bool logprobs;              /* sample: also return the sampled token's log-probability */
    int32_t top_logprobs;       /* [0, MSG_MAX_TOP_LOGPROBS], with logprobs: and that many most likely */
    int32_t n_win_blocks;       /* n_blocks when win_blocks is given, else 0 */
    const int32_t *win_blocks;  /* [n_win_blocks] the window table: KV block ids >= 0 of the sliding layers,
                                   -1 where freed; NULL: absent (the sliding layers use blocks) */
} msg_step_seq_t;

/* step: scheduler -> executor. id = step number (increasing). */
typedef struct {
    uint64_t instance;          /* executor instance the plan was made for; 0 = any */
    int32_t n_seqs;             /* [1, MSG_MAX_STEP_SEQS] */
    const msg_step_seq_t *seqs; /* [n_seqs] */
} msg_step_t;

/* Log-probabilities of many rows, one token each of many requests (result, step_tokens), present
 * only when some row's request asked: n_logprobs = n_top_n = the rows; top_n[i] is row i's count
 * of alternatives, or -1 where row i has none (its request did not ask, or it sampled nothing;
 * logprobs[i] is then 0); row i's alternatives follow those of the rows before it, so
 * n_top_tokens = n_top_logprobs = the sum of the top_n[i] >= 0. */
typedef struct {
    int32_t n_logprobs;
    const float *logprobs;      /* [rows] the row's token's log-probability, <= 0 */
    int32_t n_top_n;
    const int32_t *top_n;       /* [rows] -1 .. MSG_MAX_TOP_LOGPROBS */
    int32_t n_top_tokens, n_top_logprobs;
    const int32_t *top_tokens;  /* [sum top_n] most likely first within a row */
    const float *top_logprobs;  /* [sum top_n] */
} msg_lp_rows_t;

/* step_tokens: scheduler -> router, one step's new tokens of many requests in one message
 * (instead of one `tokens` event each): request reqs[i] got token tokens[i] at generated
 * index index[i]. Same meaning as n `tokens` events with one token each, in array order. */
typedef struct {
    int32_t n;                  /* [1, MSG_MAX_STEP_SEQS] */
    const uint64_t *reqs;       /* [n] internal request ids */
    const int32_t *index;       /* [n] >= 0 */
    const int32_t *tokens;      /* [n] >= 0 */
    msg_lp_rows_t lp;           /* of the n tokens, when some request asked */
} msg_step_tokens_t;

/* result: executor -> scheduler. tokens are in plan order; -1 where sample was false. */
typedef struct {
    uint64_t instance;          /* the executor's instance */
    int32_t n_seqs;
    const uint64_t *reqs;       /* [n_seqs] request ids, as in the plan */
    const int32_t *tokens;      /* [n_seqs] sampled token or -1 */
    double forward_us;          /* time in model_forward */
    double sample_us;           /* time sampling */
    msg_lp_rows_t lp;           /* of the sampled tokens, when some sequence asked (msg_step_seq_t.logprobs) */
} msg_result_t;

/* status reply: prefetcher -> requester. */
typedef struct {
    int32_t node;               /* NUMA node */
    msg_str_t arena;            /* shm name, "/strata-<group>-<token>-arena-<N>" */
    uint64_t bytes;             /* arena size */
    msg_str_t state;            /* "filling", "ready" or "failed" */
    double fill_ms;             /* time the fill took (0 when the arena was reattached) */
    bool reattached;            /* the arena survived from an earlier prefetcher run */
    int32_t pid;
    uint64_t instance;
    /* the disk tier (a host budget; all 0 without one) */
    uint64_t host_budget;       /* bytes */
    int32_t slots;              /* expert slots */
    uint64_t slot_bytes;
    int32_t experts_disk;       /* experts in this arena's files on disk */
    int32_t experts_host;       /* of those, in a slot now */
    uint64_t host_hits;         /* expert fetches a slot served */
    uint64_t host_misses;       /* ... and read from disk */
    uint64_t disk_bytes;        /* read from disk */
    double disk_s;              /* time on those reads */
    uint64_t disk_errors;       /* blocks that failed a read or their crc32 */
    uint64_t read_ahead;        /* experts read ahead on the executor's prediction */
    uint64_t read_ahead_used;   /* ... that a job then used */
} msg_pf_status_t;

typedef struct msg_mem msg_mem_t;

typedef struct {
    msg_type_t type;
    bool has_id;
    uint64_t id;
    union {
        msg_generate_t generate;
        msg_resume_t resume;
        msg_tokens_t tokens;
        msg_done_t done;
        msg_error_t error;
        msg_health_t health;
        msg_stats_t stats;
        msg_models_t models;
        msg_submit_t submit;
        msg_hello_t hello;
        msg_step_t step;
        msg_result_t result;
        msg_step_tokens_t step_tokens;
        msg_pf_status_t pf_status;
    } u;
    msg_mem_t *mem;             /* allocations of a decoded message; NULL for built ones */
} msg_t;

/* Decoder failure: code plus one line naming the field. */
typedef struct {
    msg_errcode_t code;
    char text[256];
} msg_err_t;

/* Growable output buffer for encoders; reuse it across messages (msg_encode clears it). */
typedef struct {
    char *data;   /* [size] bytes of the last encoded message */
    size_t size;
    size_t cap;
} msg_buf_t;

/* Zero m and set its type and defaults (sampling: top_p 1; generate: stream true). */
void msg_init(msg_t *m, msg_type_t type);
/* Release what a decoder allocated; m is reset to MSG_INVALID. Safe on built messages. */
void msg_free(msg_t *m);

/* Decode one frame expected in family fam. On success returns 0 and m owns its data.
 * On failure returns STRATA_EFORMAT / STRATA_EVERSION / STRATA_EINVAL_INPUT, err says why,
 * and m->type / m->has_id / m->id hold what could be read (so an error reply can name the
 * request); call msg_free(m) in both cases. */
int msg_decode(msg_family_t fam, const void *buf, size_t len, msg_t *m, msg_err_t *err);

/* Encode m into b (cleared first). Returns 0, STRATA_ENOMEM, or STRATA_EINVAL_INPUT if m's
 * type is unknown or a field is outside the schema (the encoder never emits what a decoder
 * would refuse). */
int msg_encode(const msg_t *m, msg_buf_t *b);
void msg_buf_free(msg_buf_t *b);

/* Names on the wire. */
const char *msg_type_name(msg_type_t t);
msg_family_t msg_type_family(msg_type_t t);
const char *msg_errcode_name(msg_errcode_t c);
/* Code for a wire name, or MSG_E_NONE if unknown. */
msg_errcode_t msg_errcode_parse(const char *s, size_t len);
const char *msg_finish_name(msg_finish_t f);

/* A msg_str_t of a C string (NULL stays absent). */
msg_str_t msg_str(const char *s);

/* The internal request id of (client routing id, client request id): a 64-bit hash, so a
 * restarted router finds a request again from what the client re-sends. */
uint64_t msg_request_id(const void *client, size_t client_len, uint64_t cid);

#endif
