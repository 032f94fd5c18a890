/* test_msg.c - proto/msg.c codecs: round trips of every message type, and refusals with the
 * right code and a message naming the field for each kind of bad input. */
#include <math.h>
#include <msgpack.h>
#include <string.h>

#include "proto/msg.h"
#include "tests/unit/check.h"

/* ---- a tiny msgpack builder for hand-made frames ---- */

typedef struct {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mb_t;

static void mb_init(mb_t *b)
{
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}
static void mb_free(mb_t *b) { msgpack_sbuffer_destroy(&b->sb); }
static void mb_str(mb_t *b, const char *s) { msgpack_pack_str_with_body(&b->pk, s, strlen(s)); }
static void mb_head(mb_t *b, size_t n_extra, const char *type)
{
    msgpack_pack_map(&b->pk, 2 + n_extra);
    mb_str(b, "v");
    msgpack_pack_int(&b->pk, PROTO_VERSION);
    mb_str(b, "type");
    mb_str(b, type);
}

/* Decode b in fam; expect failure with code and (if want_text) a substring of the error text. */
static void s_expect_fail(msg_family_t fam, const void *buf, size_t len, msg_errcode_t code, const char *want_text,
                          const char *what)
{
    msg_t m;
    msg_err_t err;
    int rc = msg_decode(fam, buf, len, &m, &err);
    T_CHECK(rc < 0, "%s: decoded but should fail", what);
    T_CHECK(err.code == code, "%s: code %s, want %s (%s)", what, msg_errcode_name(err.code), msg_errcode_name(code), err.text);
    if (want_text) T_CHECK(strstr(err.text, want_text) != NULL, "%s: text '%s' lacks '%s'", what, err.text, want_text);
    msg_free(&m);
}

/* encode -> decode -> encode: both encodings equal; returns the decoded message in out. */
static void s_roundtrip(const msg_t *m, msg_t *out, const char *what)
{
    msg_buf_t b1 = {0}, b2 = {0};
    msg_err_t err;
    int rc = msg_encode(m, &b1);
    T_CHECK(rc == 0, "%s: encode failed %d", what, rc);
    rc = msg_decode(msg_type_family(m->type), b1.data, b1.size, out, &err);
    T_CHECK(rc == 0, "%s: decode failed: %s", what, err.text);
    T_CHECK(out->type == m->type, "%s: type %d != %d", what, out->type, m->type);
    T_CHECK(out->has_id == m->has_id && out->id == m->id, "%s: id lost", what);
    rc = msg_encode(out, &b2);
    T_CHECK(rc == 0 && b1.size == b2.size && !memcmp(b1.data, b2.data, b1.size), "%s: re-encoding differs", what);
    msg_buf_free(&b1);
    msg_buf_free(&b2);
}

static void test_roundtrips(void)
{
    msg_t m, d;
    int32_t toks[] = {1, 2, 3, 40000};
    msg_str_t stops[] = {msg_str("\n\n"), msg_str("User:")};

    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = 42;
    m.u.generate.prompt = msg_str("héllo wörld");
    m.u.generate.max_tokens = 17;
    m.u.generate.samp = (msg_sampling_t){0.7f, 0.9f, 40, 123456789012345ull};
    m.u.generate.stop = stops;
    m.u.generate.n_stop = 2;
    m.u.generate.stream = false;
    s_roundtrip(&m, &d, "generate");
    T_CHECK(d.u.generate.prompt.len == strlen("héllo wörld") && !strcmp(d.u.generate.prompt.s, "héllo wörld"), "prompt");
    T_CHECK(d.u.generate.max_tokens == 17 && d.u.generate.samp.top_k == 40 && d.u.generate.samp.seed == 123456789012345ull,
            "generate scalars");
    T_CHECK(fabsf(d.u.generate.samp.temperature - 0.7f) < 1e-6f && fabsf(d.u.generate.samp.top_p - 0.9f) < 1e-6f, "floats");
    T_CHECK(d.u.generate.n_stop == 2 && !strcmp(d.u.generate.stop[1].s, "User:") && !d.u.generate.stream, "stop/stream");
    T_CHECK(d.u.generate.tokens == NULL, "tokens absent");
    msg_free(&d);

    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = 1;
    m.u.generate.tokens = toks;
    m.u.generate.n_tokens = 4;
    m.u.generate.max_tokens = 1;
    s_roundtrip(&m, &d, "generate tokens");
    T_CHECK(d.u.generate.n_tokens == 4 && d.u.generate.tokens[3] == 40000 && d.u.generate.prompt.s == NULL, "token prompt");
    T_CHECK(d.u.generate.stream && d.u.generate.samp.top_p == 1.0f, "defaults");
    msg_free(&d);

    msg_init(&m, MSG_TOKEN);
    m.has_id = true;
    m.id = 9;
    m.u.tokens.index = 5;
    m.u.tokens.tokens = toks;
    m.u.tokens.n_tokens = 2;
    m.u.tokens.text = msg_str("ab");
    s_roundtrip(&m, &d, "token");
    T_CHECK(d.u.tokens.index == 5 && d.u.tokens.n_tokens == 2 && d.u.tokens.text.len == 2, "token fields");
    msg_free(&d);

    msg_init(&m, MSG_DONE);
    m.has_id = true;
    m.id = 9;
    m.u.done.finish = MSG_FINISH_LENGTH;
    m.u.done.prompt_tokens = 3;
    m.u.done.completion_tokens = 4;
    m.u.done.queue_ms = 1.5;
    m.u.done.ttft_ms = 2.5;
    m.u.done.total_ms = 10;
    m.u.done.text = msg_str("xyz");
    m.u.done.tokens = toks;
    m.u.done.n_tokens = 4;
    s_roundtrip(&m, &d, "done");
    T_CHECK(d.u.done.finish == MSG_FINISH_LENGTH && d.u.done.completion_tokens == 4 && d.u.done.ttft_ms == 2.5, "done");
    T_CHECK(d.u.done.n_tokens == 4 && !strcmp(d.u.done.text.s, "xyz"), "done text");
    msg_free(&d);

    msg_init(&m, MSG_SCHED_DONE);
    m.has_id = true;
    m.id = 9;
    m.u.done.finish = MSG_FINISH_STOP;
    s_roundtrip(&m, &d, "sched done");
    msg_free(&d);

    msg_init(&m, MSG_ERROR);
    m.u.error.code = MSG_E_BUSY;
    m.u.error.message = msg_str("queue full");
    s_roundtrip(&m, &d, "error");
    T_CHECK(d.u.error.code == MSG_E_BUSY && !d.has_id, "error code");
    msg_free(&d);

    msg_stat_t st[] = {{msg_str("router.requests"), 12}, {msg_str("router.busy"), 0.5}};
    msg_init(&m, MSG_STATS_REPLY);
    m.u.stats.items = st;
    m.u.stats.n = 2;
    s_roundtrip(&m, &d, "stats");
    T_CHECK(d.u.stats.n == 2 && d.u.stats.items[1].value == 0.5 && !strcmp(d.u.stats.items[0].name.s, "router.requests"),
            "stats");
    msg_free(&d);

    msg_model_t mod = {msg_str("demo"), 512, 1024};
    msg_init(&m, MSG_MODELS_REPLY);
    m.u.models.models = &mod;
    m.u.models.n = 1;
    s_roundtrip(&m, &d, "models");
    T_CHECK(d.u.models.n == 1 && d.u.models.models[0].max_context == 1024, "models");
    msg_free(&d);

    msg_init(&m, MSG_HEALTH_REPLY);
    m.u.health.status = msg_str("ok");
    m.u.health.scheduler = true;
    m.u.health.uptime_s = 3;
    s_roundtrip(&m, &d, "health");
    msg_free(&d);

    unsigned char client[] = {0, 1, 2, 255};
    msg_init(&m, MSG_SUBMIT);
    m.has_id = true;
    m.id = msg_request_id(client, 4, 42);
    m.u.submit.client.s = (const char *)client;
    m.u.submit.client.len = 4;
    m.u.submit.cid = 42;
    m.u.submit.prompt = toks;
    m.u.submit.n_prompt = 3;
    m.u.submit.max_tokens = 8;
    s_roundtrip(&m, &d, "submit");
    T_CHECK(d.u.submit.client.len == 4 && !memcmp(d.u.submit.client.s, client, 4) && d.u.submit.n_prompt == 3, "submit");
    msg_free(&d);

    msg_init(&m, MSG_SCHED_HELLO_REPLY);
    m.u.hello.instance = 77;
    m.u.hello.pid = 100;
    m.u.hello.model = msg_str("m");
    m.u.hello.vocab = 300;
    m.u.hello.max_context = 256;
    s_roundtrip(&m, &d, "hello");
    T_CHECK(d.u.hello.eos_id == -1 && d.u.hello.vocab == 300, "hello defaults");
    msg_free(&d);

    int32_t blocks[] = {0, 5};
    msg_step_seq_t seqs[2] = {
        {.req = 1, .pos0 = 0, .n_tokens = 3, .tokens = toks, .n_blocks = 1, .blocks = blocks, .sample = true,
         .samp = {0.5f, 1.0f, 0, 9}, .n_sampled = 0},
        {.req = 2, .pos0 = 20, .n_tokens = 1, .tokens = toks + 3, .n_blocks = 2, .blocks = blocks, .sample = false,
         .samp = {0, 1.0f, 0, 0}, .n_sampled = 7, .last = true},
    };
    msg_init(&m, MSG_STEP);
    m.has_id = true;
    m.id = 1000;
    m.u.step.instance = 5;
    m.u.step.seqs = seqs;
    m.u.step.n_seqs = 2;
    s_roundtrip(&m, &d, "step");
    T_CHECK(d.u.step.n_seqs == 2 && d.u.step.seqs[1].pos0 == 20 && d.u.step.seqs[1].n_sampled == 7 &&
                d.u.step.seqs[1].blocks[1] == 5 && d.u.step.seqs[0].sample && !d.u.step.seqs[0].last &&
                d.u.step.seqs[1].last,
            "step");
    msg_free(&d);

    uint64_t reqs[] = {1, 2};
    int32_t out[] = {17, -1};
    msg_init(&m, MSG_STEP_RESULT);
    m.has_id = true;
    m.id = 1000;
    m.u.result.instance = 5;
    m.u.result.reqs = reqs;
    m.u.result.tokens = out;
    m.u.result.n_seqs = 2;
    m.u.result.forward_us = 12.5;
    s_roundtrip(&m, &d, "result");
    T_CHECK(d.u.result.n_seqs == 2 && d.u.result.tokens[1] == -1 && d.u.result.reqs[1] == 2, "result");
    msg_free(&d);

    uint64_t sreqs[] = {9, 1ull << 60, 3};
    int32_t sidx[] = {0, 41, 7}, stok[] = {5, 0, 286};
    msg_init(&m, MSG_SCHED_STEP_TOKENS);
    m.u.step_tokens = (msg_step_tokens_t){.n = 3, .reqs = sreqs, .index = sidx, .tokens = stok};
    s_roundtrip(&m, &d, "step_tokens");
    T_CHECK(d.u.step_tokens.n == 3 && d.u.step_tokens.reqs[1] == 1ull << 60 && d.u.step_tokens.index[1] == 41 &&
                d.u.step_tokens.tokens[2] == 286,
            "step_tokens");
    msg_free(&d);
    sidx[2] = -1; /* a negative index is refused by the encoder, as the decoder would */
    msg_buf_t sb = {0};
    T_CHECK(msg_encode(&m, &sb) == STRATA_EINVAL_INPUT, "encode step_tokens with index -1");
    msg_buf_free(&sb);

    msg_init(&m, MSG_PF_STATUS_REPLY);
    m.u.pf_status.node = 1;
    m.u.pf_status.arena = msg_str("/strata-x-arena-1");
    m.u.pf_status.bytes = 1ull << 33;
    m.u.pf_status.state = msg_str("ready");
    m.u.pf_status.reattached = true;
    s_roundtrip(&m, &d, "pf status");
    T_CHECK(d.u.pf_status.bytes == 1ull << 33 && d.u.pf_status.reattached, "pf");
    msg_free(&d);

    msg_type_t bare[] = {MSG_CANCEL, MSG_HEALTH, MSG_STATS, MSG_MODELS, MSG_SCHED_CANCEL, MSG_SCHED_STATS,
                         MSG_SCHED_HELLO, MSG_EXEC_HELLO, MSG_PF_STATUS};
    for (size_t i = 0; i < sizeof bare / sizeof bare[0]; i++) {
        msg_init(&m, bare[i]);
        m.has_id = true;
        m.id = i;
        s_roundtrip(&m, &d, msg_type_name(bare[i]));
        msg_free(&d);
    }

    /* the encoder refuses what the decoder would refuse */
    msg_buf_t b = {0};
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.u.generate.prompt = msg_str("x");
    m.u.generate.max_tokens = 0;
    T_CHECK(msg_encode(&m, &b) == STRATA_EINVAL_INPUT, "encode max_tokens 0");
    m.u.generate.max_tokens = 1;
    m.u.generate.samp.top_p = NAN;
    T_CHECK(msg_encode(&m, &b) == STRATA_EINVAL_INPUT, "encode NaN top_p");
    msg_init(&m, MSG_TOKEN);
    T_CHECK(msg_encode(&m, &b) == STRATA_EINVAL_INPUT, "encode token without id");
    msg_buf_free(&b);
}

static void test_bad_input(void)
{
    mb_t b;
    unsigned char raw[64];

    s_expect_fail(MSG_FAM_CLIENT, "", 0, MSG_E_MALFORMED, "empty", "empty");
    raw[0] = 0xc1;
    s_expect_fail(MSG_FAM_CLIENT, raw, 1, MSG_E_MALFORMED, NULL, "0xc1");
    /* array32 claiming 2^32-1 elements: refused before any allocation */
    memcpy(raw, "\xdd\xff\xff\xff\xff\x01", 6);
    s_expect_fail(MSG_FAM_CLIENT, raw, 6, MSG_E_MALFORMED, NULL, "huge array header");
    memcpy(raw, "\xdf\xff\xff\xff\xff", 5);
    s_expect_fail(MSG_FAM_CLIENT, raw, 5, MSG_E_MALFORMED, NULL, "huge map header");
    memcpy(raw, "\xdb\xff\xff\xff\xff", 5);
    s_expect_fail(MSG_FAM_CLIENT, raw, 5, MSG_E_MALFORMED, NULL, "huge str header");
    memset(raw, 0x91, 40); /* 40 nested arrays */
    raw[40] = 0x01;
    s_expect_fail(MSG_FAM_CLIENT, raw, 41, MSG_E_MALFORMED, "deeper", "too deep");
    raw[0] = 0x05;
    s_expect_fail(MSG_FAM_CLIENT, raw, 1, MSG_E_MALFORMED, "not a map", "integer frame");

    /* a valid generate, then variants */
    mb_init(&b);
    mb_head(&b, 3, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 7);
    mb_str(&b, "prompt"); mb_str(&b, "hi");
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    msg_t m;
    msg_err_t err;
    T_CHECK(msg_decode(MSG_FAM_CLIENT, b.sb.data, b.sb.size, &m, &err) == 0, "valid generate: %s", err.text);
    msg_free(&m);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size - 1, MSG_E_MALFORMED, NULL, "truncated");
    char *tr = malloc(b.sb.size + 1);
    memcpy(tr, b.sb.data, b.sb.size);
    tr[b.sb.size] = 0;
    s_expect_fail(MSG_FAM_CLIENT, tr, b.sb.size + 1, MSG_E_MALFORMED, "trailing", "trailing byte");
    free(tr);
    /* same bytes in the wrong family */
    s_expect_fail(MSG_FAM_SCHED_IN, b.sb.data, b.sb.size, MSG_E_UNKNOWN_TYPE, "generate", "wrong family");
    mb_free(&b);

    struct {
        const char *key;
        int kind; /* 0 int, 1 str, 2 float, 3 nil, 4 array of 20 strs, 5 bool */
        double val;
        const char *sval;
        msg_errcode_t code;
        const char *text;
    } cases[] = {
        {"max_tokens", 0, 0, NULL, MSG_E_INVALID_PARAM, "max_tokens"},
        {"max_tokens", 0, -5, NULL, MSG_E_INVALID_PARAM, "max_tokens"},
        {"max_tokens", 1, 0, "5", MSG_E_WRONG_TYPE, "max_tokens"},
        {"max_tokens", 2, 5.5, NULL, MSG_E_WRONG_TYPE, "max_tokens"},
        {"temperature", 2, -1, NULL, MSG_E_INVALID_PARAM, "temperature"},
        {"temperature", 2, 1e9, NULL, MSG_E_INVALID_PARAM, "temperature"},
        {"temperature", 2, NAN, NULL, MSG_E_INVALID_PARAM, "temperature"},
        {"temperature", 1, 0, "hot", MSG_E_WRONG_TYPE, "temperature"},
        {"top_p", 2, 0, NULL, MSG_E_INVALID_PARAM, "top_p"},
        {"top_p", 2, 1.5, NULL, MSG_E_INVALID_PARAM, "top_p"},
        {"top_k", 0, -1, NULL, MSG_E_INVALID_PARAM, "top_k"},
        {"top_k", 0, 1e9, NULL, MSG_E_INVALID_PARAM, "top_k"},
        {"seed", 0, -1, NULL, MSG_E_INVALID_PARAM, "seed"},
        {"stream", 0, 1, NULL, MSG_E_WRONG_TYPE, "stream"},
        {"stop", 4, 0, NULL, MSG_E_INVALID_PARAM, "stop"},
        {"stop", 1, 0, "x", MSG_E_WRONG_TYPE, "stop"},
        {"bogus_field", 0, 1, NULL, MSG_E_UNKNOWN_FIELD, "bogus_field"},
        {"tokens", 3, 0, NULL, MSG_E_WRONG_TYPE, "tokens"},
        {"prompt", 3, 0, NULL, MSG_E_WRONG_TYPE, "prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool replaces = !strcmp(cases[i].key, "max_tokens") || !strcmp(cases[i].key, "prompt");
        mb_init(&b);
        mb_head(&b, replaces ? 3 : 4, "generate");
        mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 99);
        if (strcmp(cases[i].key, "prompt")) { mb_str(&b, "prompt"); mb_str(&b, "hello"); }
        if (strcmp(cases[i].key, "max_tokens")) { mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4); }
        mb_str(&b, cases[i].key);
        switch (cases[i].kind) {
        case 0: msgpack_pack_int64(&b.pk, (int64_t)cases[i].val); break;
        case 1: mb_str(&b, cases[i].sval); break;
        case 2: msgpack_pack_double(&b.pk, cases[i].val); break;
        case 3: msgpack_pack_nil(&b.pk); break;
        case 4: msgpack_pack_array(&b.pk, 20); for (int k = 0; k < 20; k++) mb_str(&b, "s"); break;
        case 5: msgpack_pack_true(&b.pk); break;
        }
        char what[64];
        snprintf(what, sizeof what, "case %zu (%s)", i, cases[i].key);
        s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, cases[i].code, cases[i].text, what);
        /* the id is still readable for the error reply */
        T_CHECK(msg_decode(MSG_FAM_CLIENT, b.sb.data, b.sb.size, &m, &err) < 0 && m.has_id && m.id == 99, "%s: id kept", what);
        msg_free(&m);
        mb_free(&b);
    }

    /* version */
    mb_init(&b);
    msgpack_pack_map(&b.pk, 2);
    mb_str(&b, "v"); msgpack_pack_int(&b.pk, 2);
    mb_str(&b, "type"); mb_str(&b, "health");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_BAD_VERSION, "version 2", "v=2");
    mb_free(&b);
    mb_init(&b);
    msgpack_pack_map(&b.pk, 1);
    mb_str(&b, "type"); mb_str(&b, "health");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_BAD_VERSION, "'v'", "no v");
    mb_free(&b);
    mb_init(&b);
    msgpack_pack_map(&b.pk, 2);
    mb_str(&b, "v"); mb_str(&b, "1");
    mb_str(&b, "type"); mb_str(&b, "health");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_BAD_VERSION, NULL, "v str");
    mb_free(&b);
    /* type */
    mb_init(&b);
    mb_head(&b, 0, "fly");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_UNKNOWN_TYPE, "fly", "unknown type");
    mb_free(&b);
    /* missing */
    mb_init(&b);
    mb_head(&b, 1, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 7);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MISSING_FIELD, "max_tokens", "missing max_tokens");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 1, "cancel");
    mb_str(&b, "idx"); msgpack_pack_uint64(&b.pk, 7);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_UNKNOWN_FIELD, "idx", "cancel idx");
    mb_free(&b);
    /* both prompt and tokens; neither; empty; invalid UTF-8; duplicate key */
    mb_init(&b);
    mb_head(&b, 4, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 7);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "prompt"); mb_str(&b, "a");
    mb_str(&b, "tokens"); msgpack_pack_array(&b.pk, 1); msgpack_pack_int(&b.pk, 1);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "exactly one", "prompt+tokens");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 2, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 7);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MISSING_FIELD, "exactly one", "no prompt");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 3, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 7);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "prompt"); msgpack_pack_str_with_body(&b.pk, "a\xff\xfe", 3);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "UTF-8", "bad utf8");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 3, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 7);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 5);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MALFORMED, "twice", "duplicate key");
    mb_free(&b);
    /* non-string key */
    mb_init(&b);
    mb_head(&b, 1, "health");
    msgpack_pack_int(&b.pk, 3); msgpack_pack_int(&b.pk, 3);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MALFORMED, "key", "int key");
    mb_free(&b);
    /* result arrays of different lengths */
    mb_init(&b);
    mb_head(&b, 4, "result");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "instance"); msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "reqs"); msgpack_pack_array(&b.pk, 2); msgpack_pack_uint64(&b.pk, 1); msgpack_pack_uint64(&b.pk, 2);
    mb_str(&b, "tokens"); msgpack_pack_array(&b.pk, 1); msgpack_pack_int(&b.pk, 1);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "tokens", "result lengths");
    mb_free(&b);
    /* step seq with an unknown field inside */
    mb_init(&b);
    mb_head(&b, 3, "step");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "instance"); msgpack_pack_uint64(&b.pk, 0);
    mb_str(&b, "seqs"); msgpack_pack_array(&b.pk, 1); msgpack_pack_map(&b.pk, 1); mb_str(&b, "zzz"); msgpack_pack_nil(&b.pk);
    s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_UNKNOWN_FIELD, "step.seqs[0]: unknown field 'zzz'", "seq field");
    mb_free(&b);
}

/* ---- repeated keys ---- */

/* Re-pack o, appending to its map number `target` (pre-order) a second copy of its pair
 * number `key` (with value `nil_value` ? nil : the same value). *seen counts maps. */
static void s_pack_dup(msgpack_packer *pk, const msgpack_object *o, int target, uint32_t key, bool nil_value, int *seen)
{
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        msgpack_pack_array(pk, o->via.array.size);
        for (uint32_t i = 0; i < o->via.array.size; i++) s_pack_dup(pk, &o->via.array.ptr[i], target, key, nil_value, seen);
        return;
    }
    if (o->type != MSGPACK_OBJECT_MAP) {
        msgpack_pack_object(pk, *o);
        return;
    }
    bool here = (*seen)++ == target;
    msgpack_pack_map(pk, o->via.map.size + (here ? 1 : 0));
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        msgpack_pack_object(pk, o->via.map.ptr[i].key);
        s_pack_dup(pk, &o->via.map.ptr[i].val, target, key, nil_value, seen);
    }
    if (here) {
        msgpack_pack_object(pk, o->via.map.ptr[key].key);
        if (nil_value) msgpack_pack_nil(pk);
        else msgpack_pack_object(pk, o->via.map.ptr[key].val);
    }
}

/* The size of map number `target` of o (pre-order), or -1 when o has fewer maps. */
static int64_t s_map_size(const msgpack_object *o, int target, int *seen)
{
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            int64_t r = s_map_size(&o->via.array.ptr[i], target, seen);
            if (r >= 0) return r;
        }
        return -1;
    }
    if (o->type != MSGPACK_OBJECT_MAP) return -1;
    if ((*seen)++ == target) return o->via.map.size;
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        int64_t r = s_map_size(&o->via.map.ptr[i].val, target, seen);
        if (r >= 0) return r;
    }
    return -1;
}

/* Every key of every map of the encoded m, repeated once (with its value, then with nil):
 * each variant must be refused as malformed naming the key, and without an id. */
static int s_dup_every_key(const msg_t *m)
{
    msg_buf_t enc = {0};
    int variants = 0;
    T_CHECK(msg_encode(m, &enc) == 0, "%s: encode", msg_type_name(m->type));
    msgpack_zone zone;
    msgpack_zone_init(&zone, 4096);
    msgpack_object obj;
    size_t off = 0;
    T_CHECK(msgpack_unpack(enc.data, enc.size, &off, &zone, &obj) == MSGPACK_UNPACK_SUCCESS, "unpack");
    for (int target = 0;; target++) {
        int seen = 0;
        int64_t n = s_map_size(&obj, target, &seen);
        if (n < 0) break;
        for (uint32_t key = 0; key < (uint32_t)n; key++)
            for (int nil = 0; nil < 2; nil++) {
                mb_t b;
                mb_init(&b);
                seen = 0;
                s_pack_dup(&b.pk, &obj, target, key, nil, &seen);
                char what[96];
                snprintf(what, sizeof what, "%s: map %d key %u repeated%s", msg_type_name(m->type), target, key,
                         nil ? " as nil" : "");
                msg_t d;
                msg_err_t err;
                T_CHECK(msg_decode(msg_type_family(m->type), b.sb.data, b.sb.size, &d, &err) < 0, "%s: accepted", what);
                T_CHECK(err.code == MSG_E_MALFORMED && strstr(err.text, "appears twice"), "%s: %s (%s)", what,
                        msg_errcode_name(err.code), err.text);
                msg_free(&d);
                mb_free(&b);
                variants++;
            }
    }
    msgpack_zone_destroy(&zone);
    msg_buf_free(&enc);
    return variants;
}

static void test_repeated_keys(void)
{
    mb_t b;
    msg_t m;
    msg_err_t err;

    /* as found: a repeated id went through and the last one won */
    mb_init(&b);
    mb_head(&b, 4, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "prompt"); mb_str(&b, "hi");
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 2);
    T_CHECK(msg_decode(MSG_FAM_CLIENT, b.sb.data, b.sb.size, &m, &err) < 0, "generate with id 1 and id 2 accepted (id %llu)",
            (unsigned long long)m.id);
    T_CHECK(err.code == MSG_E_MALFORMED && strstr(err.text, "'id' appears twice"), "repeated id: %s (%s)",
            msg_errcode_name(err.code), err.text);
    T_CHECK(!m.has_id, "a repeated id names no request");
    msg_free(&m);
    mb_free(&b);

    /* v and type twice, even with equal values; a repeat before a bad value; a repeated unknown key */
    mb_init(&b);
    msgpack_pack_map(&b.pk, 3);
    mb_str(&b, "v"); msgpack_pack_int(&b.pk, 1);
    mb_str(&b, "v"); msgpack_pack_int(&b.pk, 1);
    mb_str(&b, "type"); mb_str(&b, "health");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MALFORMED, "'v' appears twice", "v twice");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 1, "health");
    mb_str(&b, "type"); mb_str(&b, "health");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MALFORMED, "'type' appears twice", "type twice");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 4, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "prompt"); mb_str(&b, "hi");
    mb_str(&b, "max_tokens"); mb_str(&b, "four");
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MALFORMED, "'max_tokens' appears twice", "bad value, then repeat");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 3, "cancel");
    mb_str(&b, "id"); mb_str(&b, "x");
    mb_str(&b, "stop"); msgpack_pack_nil(&b.pk);
    mb_str(&b, "stop"); msgpack_pack_nil(&b.pk);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MALFORMED, "'stop' appears twice", "unknown key twice");
    mb_free(&b);
    /* a map of many keys, one repeated far apart (the sorted path) */
    mb_init(&b);
    mb_head(&b, 1, "stats");
    mb_str(&b, "stats");
    msgpack_pack_map(&b.pk, 200);
    for (int i = 0; i < 200; i++) {
        char k[16];
        snprintf(k, sizeof k, "c%d", i == 199 ? 3 : i);
        mb_str(&b, k);
        msgpack_pack_int(&b.pk, i);
    }
    s_expect_fail(MSG_FAM_REPLY, b.sb.data, b.sb.size, MSG_E_MALFORMED, "'stats.c3' appears twice", "stats name twice");
    mb_free(&b);
    mb_init(&b);
    msgpack_pack_map(&b.pk, 2 + 40);
    mb_str(&b, "v"); msgpack_pack_int(&b.pk, 1);
    mb_str(&b, "type"); mb_str(&b, "health");
    for (int i = 0; i < 40; i++) {
        char k[16];
        snprintf(k, sizeof k, "u%d", i == 39 ? 0 : i);
        mb_str(&b, k);
        msgpack_pack_nil(&b.pk);
    }
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_MALFORMED, "'u0' appears twice", "40 unknown keys, one twice");
    mb_free(&b);

    /* every key of every map of one message of each type, in every family */
    int32_t toks[] = {1, 2, 3, 40000}, blocks[] = {0, 5}, eos2[] = {2, 7}, winb[] = {-1, 6};
    uint64_t reqs[] = {1, 2};
    msg_str_t stops[] = {msg_str("\n\n"), msg_str("User:")};
    msg_stat_t st[] = {{msg_str("router.requests"), 12}, {msg_str("router.busy"), 0.5}};
    msg_model_t mod = {msg_str("demo"), 512, 1024};
    unsigned char client[] = {'c', 1, 2};
    msg_step_seq_t seqs[2] = {
        {.req = 1, .pos0 = 0, .n_tokens = 3, .tokens = toks, .n_blocks = 1, .blocks = blocks, .sample = true,
         .samp = {0.5f, 0.9f, 4, 9}, .n_sampled = 2, .last = true},
        {.req = 2, .pos0 = 20, .n_tokens = 1, .tokens = toks + 3, .n_blocks = 2, .blocks = blocks, .samp = {0, 1, 0, 0},
         .n_win_blocks = 2, .win_blocks = winb},
    };
    msg_t all[32];
    int n = 0;
    for (int t = 0; t < 200; t++) {
        if (msg_type_family((msg_type_t)t) == MSG_FAM_COUNT) continue;
        msg_t *x = &all[n++];
        msg_init(x, (msg_type_t)t);
        x->has_id = true;
        x->id = 1000 + t;
        switch (t) {
        case MSG_GENERATE:
            x->u.generate.prompt = msg_str("hi");
            x->u.generate.max_tokens = 3;
            x->u.generate.samp = (msg_sampling_t){0.7f, 0.9f, 40, 5};
            x->u.generate.stop = stops;
            x->u.generate.n_stop = 2;
            x->u.generate.stream = false;
            x->u.generate.ignore_eos = true;
            break;
        case MSG_RESUME:
            x->u.resume = (msg_resume_t){.from = 3, .text_from = 7, .n_stop = 1, .stop = stops, .stream = false};
            break;
        case MSG_SCHED_RESUME: x->u.resume.from = 3; break;
        case MSG_TOKEN: x->u.tokens = (msg_tokens_t){2, 2, toks, msg_str("ab")}; break;
        case MSG_SCHED_TOKENS: x->u.tokens = (msg_tokens_t){2, 2, toks, {NULL, 0}}; break;
        case MSG_DONE:
            x->u.done = (msg_done_t){MSG_FINISH_LENGTH, 3, 4, 1.5, 2.5, 10, msg_str("xyz"), 2, toks};
            break;
        case MSG_SCHED_DONE: x->u.done = (msg_done_t){.finish = MSG_FINISH_STOP, .total_ms = 1}; break;
        case MSG_ERROR: case MSG_SCHED_ERROR: case MSG_EXEC_ERROR:
            x->u.error = (msg_error_t){MSG_E_BUSY, msg_str("full")};
            break;
        case MSG_HEALTH_REPLY: x->u.health = (msg_health_t){msg_str("ok"), true, 3, 1}; break;
        case MSG_STATS_REPLY: case MSG_SCHED_STATS_REPLY: case MSG_EXEC_STATS_REPLY:
            x->u.stats = (msg_stats_t){2, st};
            break;
        case MSG_MODELS_REPLY: x->u.models = (msg_models_t){1, &mod}; break;
        case MSG_SUBMIT:
            x->u.submit = (msg_submit_t){{(const char *)client, 3}, 7, 3, toks, 8, {0.5f, 0.9f, 2, 3}, true};
            break;
        case MSG_SCHED_HELLO_REPLY: case MSG_EXEC_HELLO_REPLY:
            x->u.hello = (msg_hello_t){77, 100, msg_str("m"), 300, 256, 1, 2, 64, 16, 3.5, 2, eos2, 128};
            break;
        case MSG_STEP: x->u.step = (msg_step_t){5, 2, seqs}; break;
        case MSG_STEP_RESULT: x->u.result = (msg_result_t){5, 2, reqs, toks, 12.5, 1.5}; break;
        case MSG_SCHED_STEP_TOKENS: x->u.step_tokens = (msg_step_tokens_t){2, reqs, blocks, toks}; break;
        case MSG_PF_STATUS_REPLY:
            x->u.pf_status = (msg_pf_status_t){1, msg_str("/strata-x-arena-1"), 1ull << 33, msg_str("ready"), 2.5, true, 9, 4};
            break;
        default: break; /* types without a body */
        }
    }
    int variants = 0;
    bool fam_seen[MSG_FAM_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        variants += s_dup_every_key(&all[i]);
        fam_seen[msg_type_family(all[i].type)] = true;
    }
    for (int f = 0; f < MSG_FAM_COUNT; f++) T_CHECK(fam_seen[f], "family %d has a message in the repeated-key sweep", f);
    fprintf(stderr, "repeated keys: one message of each of %d types, %d variants refused\n", n, variants);
}

/* ---- values and ranges in error messages ---- */

/* A generate (id 9, prompt "hi", max_tokens 4 unless key is max_tokens) with key set by
 * pack(); expect code and want in the error text. */
static void s_expect_gen(const char *key, void (*pack)(mb_t *, const void *), const void *arg, msg_errcode_t code,
                         const char *want, const char *what)
{
    mb_t b;
    mb_init(&b);
    bool mt = !strcmp(key, "max_tokens");
    mb_head(&b, mt ? 3 : 4, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 9);
    mb_str(&b, "prompt"); mb_str(&b, "hi");
    if (!mt) { mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4); }
    mb_str(&b, key);
    pack(&b, arg);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, code, want, what);
    mb_free(&b);
}
static void s_pk_f64(mb_t *b, const void *a) { msgpack_pack_double(&b->pk, *(const double *)a); }
static void s_pk_f32(mb_t *b, const void *a) { msgpack_pack_float(&b->pk, *(const float *)a); }
static void s_pk_i64(mb_t *b, const void *a) { msgpack_pack_int64(&b->pk, *(const int64_t *)a); }
static void s_pk_u64(mb_t *b, const void *a) { msgpack_pack_uint64(&b->pk, *(const uint64_t *)a); }
static void s_pk_toks(mb_t *b, const void *a)
{
    msgpack_pack_array(&b->pk, 2);
    msgpack_pack_int(&b->pk, 5);
    msgpack_pack_int64(&b->pk, *(const int64_t *)a);
}

static void test_error_values(void)
{
    /* as found: 100.0001 was printed as "got 100" */
    double d = 100.0001;
    s_expect_gen("temperature", s_pk_f64, &d, MSG_E_INVALID_PARAM, "must be in [0, 100], got 100.0001", "temperature 100.0001");
    float f = 100.0001f;
    s_expect_gen("temperature", s_pk_f32, &f, MSG_E_INVALID_PARAM, "got 100.0001", "float32 temperature 100.0001");
    d = 1.0000001;
    s_expect_gen("top_p", s_pk_f64, &d, MSG_E_INVALID_PARAM, "must be in (0, 1], got 1.0000001", "top_p 1.0000001");
    d = 1e-50; /* in range as a double, 0 as the float32 it is kept as */
    s_expect_gen("top_p", s_pk_f64, &d, MSG_E_INVALID_PARAM, "got 1e-50 (0 as a float32)", "top_p 1e-50");
    d = 123456789.5;
    s_expect_gen("temperature", s_pk_f64, &d, MSG_E_INVALID_PARAM, "got 123456789.5", "temperature 123456789.5");
    int64_t i = 1234567;
    s_expect_gen("temperature", s_pk_i64, &i, MSG_E_INVALID_PARAM, "got 1234567", "integer temperature 1234567");
    i = MSG_MAX_MAX_TOKENS + 1;
    s_expect_gen("max_tokens", s_pk_i64, &i, MSG_E_INVALID_PARAM, "must be in [1, 1048576], got 1048577", "max_tokens 2^20+1");
    uint64_t u = UINT64_MAX;
    s_expect_gen("top_k", s_pk_u64, &u, MSG_E_INVALID_PARAM, "got 18446744073709551615", "top_k 2^64-1");
    i = -7;
    s_expect_gen("tokens", s_pk_toks, &i, MSG_E_INVALID_PARAM, "'tokens[1]': must be in [0, 2147483647], got -7", "token -7");
    i = 1ll << 40;
    s_expect_gen("tokens", s_pk_toks, &i, MSG_E_INVALID_PARAM, "got 1099511627776", "token 2^40");

    /* as found: resume's `from` printed its range as [0, 9223372036854775808] (2^63) */
    mb_t b;
    int64_t froms[] = {-1, INT64_MIN};
    const char *want[] = {"resume: field 'from': must be in [0, 2^63-1], got -1", "got -9223372036854775808"};
    for (int k = 0; k < 2; k++) {
        mb_init(&b);
        mb_head(&b, 2, "resume");
        mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 9);
        mb_str(&b, "from"); msgpack_pack_int64(&b.pk, froms[k]);
        s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, want[k], "resume from");
        mb_free(&b);
    }
    mb_init(&b);
    mb_head(&b, 2, "resume");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 9);
    mb_str(&b, "from"); msgpack_pack_uint64(&b.pk, 1ull << 63);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "[0, 2^63-1], got 9223372036854775808",
                  "resume from 2^63");
    mb_free(&b);
    /* a packed element out of range names its value */
    mb_init(&b);
    mb_head(&b, 4, "step_tokens");
    int32_t idx[2] = {3, -5}, tok[2] = {1, 2};
    uint64_t rq[2] = {1, 2};
    mb_str(&b, "reqs"); msgpack_pack_bin_with_body(&b.pk, rq, sizeof rq);
    mb_str(&b, "index"); msgpack_pack_bin_with_body(&b.pk, idx, sizeof idx);
    mb_str(&b, "tokens"); msgpack_pack_bin_with_body(&b.pk, tok, sizeof tok);
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 1);
    s_expect_fail(MSG_FAM_SCHED_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'index[1]': must be in [0, 2147483647], got -5",
                  "packed index -5");
    mb_free(&b);
    /* the version as given */
    mb_init(&b);
    msgpack_pack_map(&b.pk, 2);
    mb_str(&b, "v"); msgpack_pack_double(&b.pk, 1.5);
    mb_str(&b, "type"); mb_str(&b, "health");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_BAD_VERSION, "must be the integer 1, got 1.5", "v 1.5");
    mb_free(&b);
    mb_init(&b);
    msgpack_pack_map(&b.pk, 2);
    mb_str(&b, "v"); msgpack_pack_int(&b.pk, -3);
    mb_str(&b, "type"); mb_str(&b, "health");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_BAD_VERSION, "got -3", "v -3");
    mb_free(&b);
}

/* Random byte flips of valid frames: decode must never crash and must either succeed or
 * report a code; successes must re-encode. */
static void test_mutations(uint64_t seed)
{
    msg_t m, d;
    msg_buf_t b = {0}, b2 = {0};
    msg_err_t err;
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = 3;
    m.u.generate.prompt = msg_str("The quick brown fox");
    m.u.generate.max_tokens = 10;
    msg_str_t stops[] = {msg_str("fox")};
    m.u.generate.stop = stops;
    m.u.generate.n_stop = 1;
    T_CHECK(msg_encode(&m, &b) == 0, "encode");
    int ok = 0, bad = 0;
    for (int it = 0; it < 20000; it++) {
        char buf[256];
        size_t n = b.size;
        memcpy(buf, b.data, n);
        int flips = 1 + (int)(t_rng_next(&seed) % 3);
        for (int k = 0; k < flips; k++) buf[t_rng_next(&seed) % n] = (char)t_rng_next(&seed);
        if (t_rng_next(&seed) % 4 == 0) n = t_rng_next(&seed) % n;
        int rc = msg_decode(MSG_FAM_CLIENT, buf, n, &d, &err);
        if (rc == 0) {
            ok++;
            T_CHECK(msg_encode(&d, &b2) == 0, "re-encode of accepted mutation");
        } else {
            bad++;
            T_CHECK(err.code > MSG_E_NONE && err.code < MSG_E_COUNT && err.text[0], "error without code/text");
        }
        msg_free(&d);
    }
    fprintf(stderr, "mutations: %d accepted, %d refused\n", ok, bad);
    T_CHECK(bad > 0, "some mutations must be refused");
    msg_buf_free(&b);
    msg_buf_free(&b2);
}

/* generate with messages: a str of JSON kept as it is; a msgpack array and map turned into JSON
 * text; exactly one of prompt / tokens / messages; template_vars only with messages. */
static void test_chat(void)
{
    msg_t m, d;
    msg_err_t err;
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = 3;
    m.u.generate.messages = msg_str("[{\"role\":\"user\",\"content\":\"hi\"}]");
    m.u.generate.template_vars = msg_str("{\"enable_thinking\":false}");
    m.u.generate.add_generation_prompt = false;
    m.u.generate.max_tokens = 4;
    s_roundtrip(&m, &d, "chat generate");
    T_CHECK(d.u.generate.messages.s && !strcmp(d.u.generate.messages.s, m.u.generate.messages.s), "messages kept");
    T_CHECK(!d.u.generate.add_generation_prompt && d.u.generate.template_vars.s, "chat fields");
    msg_free(&d);

    mb_t b;
    mb_init(&b);
    mb_head(&b, 4, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 8);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "messages");
    msgpack_pack_array(&b.pk, 1);
    msgpack_pack_map(&b.pk, 3);
    mb_str(&b, "role"); mb_str(&b, "user");
    mb_str(&b, "content"); mb_str(&b, "say \"x\"\n\x01");
    mb_str(&b, "n"); msgpack_pack_array(&b.pk, 4);
    msgpack_pack_int(&b.pk, -3); msgpack_pack_double(&b.pk, 0.5); msgpack_pack_true(&b.pk); msgpack_pack_nil(&b.pk);
    mb_str(&b, "template_vars");
    msgpack_pack_map(&b.pk, 1);
    mb_str(&b, "tools"); msgpack_pack_array(&b.pk, 0);
    T_CHECK(msg_decode(MSG_FAM_CLIENT, b.sb.data, b.sb.size, &d, &err) == 0, "msgpack messages: %s", err.text);
    T_CHECK(d.u.generate.messages.s &&
            !strcmp(d.u.generate.messages.s, "[{\"role\":\"user\",\"content\":\"say \\\"x\\\"\\n\\u0001\",\"n\":[-3,0.5,true,null]}]"),
            "messages as JSON: %s", d.u.generate.messages.s ? d.u.generate.messages.s : "(none)");
    T_CHECK(d.u.generate.template_vars.s && !strcmp(d.u.generate.template_vars.s, "{\"tools\":[]}"), "template_vars as JSON");
    T_CHECK(d.u.generate.add_generation_prompt, "add_generation_prompt defaults to true");
    msg_free(&d);
    mb_free(&b);

    mb_init(&b);
    mb_head(&b, 4, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 9);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "prompt"); mb_str(&b, "p");
    mb_str(&b, "messages"); mb_str(&b, "[]");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "exactly one", "prompt and messages");
    mb_free(&b);

    mb_init(&b);
    mb_head(&b, 3, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 10);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "messages"); msgpack_pack_array(&b.pk, 1); msgpack_pack_bin_with_body(&b.pk, "x", 1);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "bin", "bin in messages");
    mb_free(&b);

    mb_init(&b);
    mb_head(&b, 3, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 11);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "messages"); msgpack_pack_map(&b.pk, 0);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_WRONG_TYPE, "messages", "a map as messages");
    mb_free(&b);

    mb_init(&b);
    mb_head(&b, 4, "generate");
    mb_str(&b, "id"); msgpack_pack_uint64(&b.pk, 12);
    mb_str(&b, "max_tokens"); msgpack_pack_int(&b.pk, 4);
    mb_str(&b, "prompt"); mb_str(&b, "p");
    mb_str(&b, "template_vars"); mb_str(&b, "{}");
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "only with", "template_vars without messages");
    mb_free(&b);
}

/* Encode m expecting the encoder to refuse it (what a decoder would refuse). */
static void s_expect_encode_fail(const msg_t *m, const char *what)
{
    msg_buf_t b = {0};
    T_CHECK(msg_encode(m, &b) == STRATA_EINVAL_INPUT, "%s: encoded but should be refused", what);
    msg_buf_free(&b);
}

/* Log-probabilities: the ask (generate, submit, a step's sequence), the rows of result and
 * step_tokens (packed), one request's in token / tokens / done, and the cross-field rules. */
static void test_logprobs(void)
{
    msg_t m, d;
    /* generate: absent by default, top_logprobs only with logprobs */
    msg_init(&m, MSG_GENERATE);
    m.has_id = true;
    m.id = 1;
    m.u.generate.prompt = msg_str("x");
    m.u.generate.max_tokens = 2;
    msg_buf_t b0 = {0};
    T_CHECK(msg_encode(&m, &b0) == 0 && !memmem(b0.data, b0.size, "logprobs", 8), "generate without logprobs has no such key");
    msg_buf_free(&b0);
    m.u.generate.logprobs = true;
    m.u.generate.top_logprobs = 20;
    s_roundtrip(&m, &d, "generate logprobs");
    T_CHECK(d.u.generate.logprobs && d.u.generate.top_logprobs == 20, "generate logprobs kept");
    msg_free(&d);
    m.u.generate.logprobs = false;
    s_expect_encode_fail(&m, "top_logprobs without logprobs");
    mb_t b;
    mb_init(&b);
    mb_head(&b, 4, "generate");
    mb_str(&b, "id"), msgpack_pack_uint64(&b.pk, 3);
    mb_str(&b, "prompt"), mb_str(&b, "x");
    mb_str(&b, "max_tokens"), msgpack_pack_int(&b.pk, 2);
    mb_str(&b, "top_logprobs"), msgpack_pack_int(&b.pk, 2);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "only with 'logprobs'", "top_logprobs alone");
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 5, "generate");
    mb_str(&b, "id"), msgpack_pack_uint64(&b.pk, 3);
    mb_str(&b, "prompt"), mb_str(&b, "x");
    mb_str(&b, "max_tokens"), msgpack_pack_int(&b.pk, 2);
    mb_str(&b, "logprobs"), msgpack_pack_true(&b.pk);
    mb_str(&b, "top_logprobs"), msgpack_pack_int(&b.pk, 21);
    s_expect_fail(MSG_FAM_CLIENT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "top_logprobs", "top_logprobs 21");
    mb_free(&b);

    /* submit and a step's sequence carry the ask on */
    int32_t prompt[] = {1, 2};
    msg_init(&m, MSG_SUBMIT);
    m.has_id = true;
    m.id = 9;
    m.u.submit = (msg_submit_t){.client = msg_str("c"), .cid = 1, .n_prompt = 2, .prompt = prompt, .max_tokens = 3,
                                .samp = {0, 1, 0, 0}, .logprobs = true, .top_logprobs = 5};
    s_roundtrip(&m, &d, "submit logprobs");
    T_CHECK(d.u.submit.logprobs && d.u.submit.top_logprobs == 5, "submit logprobs kept");
    msg_free(&d);
    int32_t blocks[] = {0};
    msg_step_seq_t seq = {.req = 1, .pos0 = 0, .n_tokens = 2, .tokens = prompt, .n_blocks = 1, .blocks = blocks, .sample = true,
                          .samp = {0, 1, 0, 0}, .logprobs = true, .top_logprobs = 3};
    msg_init(&m, MSG_STEP);
    m.has_id = true;
    m.id = 4;
    m.u.step = (msg_step_t){.instance = 1, .n_seqs = 1, .seqs = &seq};
    s_roundtrip(&m, &d, "step logprobs");
    T_CHECK(d.u.step.seqs[0].logprobs && d.u.step.seqs[0].top_logprobs == 3, "step logprobs kept");
    msg_free(&d);
    seq.logprobs = false;
    s_expect_encode_fail(&m, "step: top_logprobs without logprobs");

    /* result: rows of 2, 0 and no alternatives; -0.0 and the float32 extremes survive */
    uint64_t reqs[] = {1, 2, 3};
    int32_t toks[] = {7, -1, 9}, top_n[] = {2, -1, 0}, top_tok[] = {7, 4};
    float lps[] = {-0.25f, 0, -0.0f}, top_lp[] = {-0.25f, -3.0e38f};
    msg_init(&m, MSG_STEP_RESULT);
    m.has_id = true;
    m.id = 4;
    m.u.result = (msg_result_t){.instance = 1, .n_seqs = 3, .reqs = reqs, .tokens = toks};
    m.u.result.lp = (msg_lp_rows_t){3, lps, 3, top_n, 2, 2, top_tok, top_lp};
    s_roundtrip(&m, &d, "result logprobs");
    const msg_lp_rows_t *rl = &d.u.result.lp;
    T_CHECK(rl->n_logprobs == 3 && rl->logprobs[0] == -0.25f && rl->top_n[1] == -1 && rl->n_top_tokens == 2 &&
                rl->top_tokens[1] == 4 && rl->top_logprobs[1] == -3.0e38f && signbit(rl->logprobs[2]),
            "result logprobs kept");
    msg_free(&d);
    top_n[2] = 1; /* the rows' counts add up to 3, not 2 */
    s_expect_encode_fail(&m, "result: alternatives of the wrong total");
    top_n[2] = 0;
    lps[0] = 0.5f;
    s_expect_encode_fail(&m, "result: a positive log-probability");
    lps[0] = NAN;
    s_expect_encode_fail(&m, "result: a NaN log-probability");
    lps[0] = -0.25f;
    m.u.result.lp.n_logprobs = 2;
    s_expect_encode_fail(&m, "result: fewer log-probabilities than rows");
    m.u.result.lp.n_logprobs = 3;
    m.u.result.lp.top_n = NULL;
    s_expect_encode_fail(&m, "result: log-probabilities without top_n");
    /* the same rows as a decoder sees a plain (unpacked) msgpack array */
    mb_init(&b);
    mb_head(&b, 6, "result");
    mb_str(&b, "id"), msgpack_pack_uint64(&b.pk, 4);
    mb_str(&b, "instance"), msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "reqs"), msgpack_pack_array(&b.pk, 1), msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "tokens"), msgpack_pack_array(&b.pk, 1), msgpack_pack_int(&b.pk, 7);
    mb_str(&b, "logprobs"), msgpack_pack_array(&b.pk, 1), msgpack_pack_double(&b.pk, -1.5);
    mb_str(&b, "top_n"), msgpack_pack_array(&b.pk, 1), msgpack_pack_int(&b.pk, 0);
    msg_err_t err;
    T_CHECK(msg_decode(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, &d, &err) == 0 && d.u.result.lp.logprobs[0] == -1.5f,
            "result logprobs as arrays: %s", err.text);
    msg_free(&d);
    mb_free(&b);
    mb_init(&b);
    mb_head(&b, 5, "result");
    mb_str(&b, "id"), msgpack_pack_uint64(&b.pk, 4);
    mb_str(&b, "instance"), msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "reqs"), msgpack_pack_array(&b.pk, 1), msgpack_pack_uint64(&b.pk, 1);
    mb_str(&b, "tokens"), msgpack_pack_array(&b.pk, 1), msgpack_pack_int(&b.pk, 7);
    mb_str(&b, "logprobs"), msgpack_pack_array(&b.pk, 1), msgpack_pack_double(&b.pk, 0.5);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "logprobs[0]", "result: logprob 0.5");
    mb_free(&b);

    /* step_tokens: the same rows */
    int32_t sidx[] = {0, 3, 1};
    msg_init(&m, MSG_SCHED_STEP_TOKENS);
    m.u.step_tokens = (msg_step_tokens_t){.n = 3, .reqs = reqs, .index = sidx, .tokens = top_tok};
    int32_t stok[] = {7, 4, 9};
    m.u.step_tokens.tokens = stok;
    m.u.step_tokens.lp = (msg_lp_rows_t){3, lps, 3, top_n, 2, 2, top_tok, top_lp};
    s_roundtrip(&m, &d, "step_tokens logprobs");
    T_CHECK(d.u.step_tokens.lp.top_n[0] == 2 && d.u.step_tokens.lp.top_tokens[0] == 7, "step_tokens logprobs kept");
    msg_free(&d);

    /* token: 2 tokens, 1 alternative each, with texts (one of them empty) */
    int32_t tt[] = {5, 6}, alt[] = {5, 8};
    float tlp[] = {-0.1f, -2.0f}, alp[] = {-0.1f, -0.5f};
    msg_str_t txt[] = {msg_str("a"), msg_str("")}, atxt[] = {msg_str("a"), msg_str("\xc3\xa9")};
    msg_init(&m, MSG_TOKEN);
    m.has_id = true;
    m.id = 2;
    m.u.tokens = (msg_tokens_t){.index = 0, .n_tokens = 2, .tokens = tt, .text = msg_str("a")};
    m.u.tokens.lp = (msg_logprobs_t){2, tlp, 1, 2, 2, alt, alp, 2, 2, txt, atxt};
    s_roundtrip(&m, &d, "token logprobs");
    const msg_logprobs_t *tl = &d.u.tokens.lp;
    T_CHECK(tl->n_logprobs == 2 && tl->logprobs[1] == -2.0f && tl->top_n == 1 && tl->top_tokens[1] == 8 &&
                tl->top_text[1].len == 2 && tl->token_text[1].len == 0,
            "token logprobs kept");
    msg_free(&d);
    m.u.tokens.lp.n_top_text = 1;
    s_expect_encode_fail(&m, "token: top_text of the wrong length");
    m.u.tokens.lp.n_top_text = 2;
    atxt[1] = (msg_str_t){"\xc3", 1};
    s_expect_encode_fail(&m, "token: top_text not UTF-8");
    atxt[1] = msg_str("x");
    m.u.tokens.lp.top_n = 2;
    s_expect_encode_fail(&m, "token: top_n 2 with 2 alternatives for 2 tokens");
    m.u.tokens.lp = (msg_logprobs_t){0};
    m.u.tokens.lp.top_tokens = alt;
    m.u.tokens.lp.n_top_tokens = 2;
    s_expect_encode_fail(&m, "token: alternatives without logprobs");
    /* tokens (scheduler family): packed, no texts */
    msg_init(&m, MSG_SCHED_TOKENS);
    m.has_id = true;
    m.id = 2;
    m.u.tokens = (msg_tokens_t){.index = 4, .n_tokens = 2, .tokens = tt};
    m.u.tokens.lp = (msg_logprobs_t){2, tlp, 1, 2, 2, alt, alp, 0, 0, NULL, NULL};
    s_roundtrip(&m, &d, "tokens logprobs");
    T_CHECK(d.u.tokens.lp.top_logprobs[1] == -0.5f && !d.u.tokens.lp.token_text, "tokens logprobs kept");
    msg_free(&d);
    /* done, stream=false: those of its tokens */
    msg_init(&m, MSG_DONE);
    m.has_id = true;
    m.id = 2;
    m.u.done = (msg_done_t){.finish = MSG_FINISH_LENGTH, .prompt_tokens = 1, .completion_tokens = 2, .text = msg_str("a"),
                            .n_tokens = 2, .tokens = tt};
    m.u.done.lp = (msg_logprobs_t){2, tlp, 0, 0, 0, NULL, NULL, 2, 0, txt, NULL};
    s_roundtrip(&m, &d, "done logprobs");
    T_CHECK(d.u.done.lp.n_logprobs == 2 && d.u.done.lp.top_n == 0 && d.u.done.lp.n_token_text == 2, "done logprobs kept");
    msg_free(&d);
    m.u.done.n_tokens = 1;
    s_expect_encode_fail(&m, "done: log-probabilities of more tokens than it has");
}

/* A hello with eos_id eos (< 0: left out) and eos_ids ids[n] (n < 0: left out), hand-packed. */
static void s_pack_hello(mb_t *b, int32_t eos, const int32_t *ids, int n)
{
    mb_init(b);
    mb_head(b, 5 + (eos >= 0) + (n >= 0), "hello");
    mb_str(b, "instance"); msgpack_pack_uint64(&b->pk, 7);
    mb_str(b, "pid"); msgpack_pack_int(&b->pk, 1);
    mb_str(b, "model"); mb_str(b, "m");
    mb_str(b, "vocab"); msgpack_pack_int(&b->pk, 300);
    mb_str(b, "max_context"); msgpack_pack_int(&b->pk, 256);
    if (eos >= 0) { mb_str(b, "eos_id"); msgpack_pack_int(&b->pk, eos); }
    if (n >= 0) {
        mb_str(b, "eos_ids");
        msgpack_pack_array(&b->pk, (size_t)n);
        for (int i = 0; i < n; i++) msgpack_pack_int(&b->pk, ids[i]);
    }
}

/* The stop set in a hello: eos_id (the first, read by any reader) and eos_ids (all of them). */
static void test_hello_eos(void)
{
    msg_t m, d;
    msg_err_t err;
    int32_t got[MSG_MAX_EOS];
    int32_t ids[MSG_MAX_EOS + 1] = {2, 7, 9};
    for (int fam = 0; fam < 2; fam++) {
        msg_init(&m, fam ? MSG_EXEC_HELLO_REPLY : MSG_SCHED_HELLO_REPLY);
        m.u.hello = (msg_hello_t){77, 100, msg_str("m"), 300, 256, 1, 2, 64, 16, 3.5, 3, ids};
        s_roundtrip(&m, &d, "hello with eos_ids");
        T_CHECK(d.u.hello.eos_id == 2 && d.u.hello.n_eos == 3 && d.u.hello.eos_ids[2] == 9, "hello eos_ids kept");
        T_CHECK(msg_hello_eos(&d.u.hello, got) == 3 && got[0] == 2 && got[1] == 7 && got[2] == 9, "msg_hello_eos: the list");
        msg_free(&d);
        /* the encoder refuses what a decoder would */
        m.u.hello.eos_id = 7;
        s_expect_encode_fail(&m, "hello: eos_id is not eos_ids[0]");
        m.u.hello.eos_id = 2;
        ids[2] = 2;
        s_expect_encode_fail(&m, "hello: a repeated eos id");
        ids[2] = 300;
        s_expect_encode_fail(&m, "hello: an eos id outside the vocab");
        ids[2] = 9;
        m.u.hello.n_eos = MSG_MAX_EOS + 1;
        s_expect_encode_fail(&m, "hello: 17 eos ids");
        m.u.hello.n_eos = 0;
        s_expect_encode_fail(&m, "hello: an empty eos_ids");
    }
    /* a hello without eos_ids (an older executor): the set is eos_id alone, or empty */
    mb_t b;
    s_pack_hello(&b, 5, NULL, -1);
    T_CHECK(msg_decode(MSG_FAM_SCHED_OUT, b.sb.data, b.sb.size, &d, &err) == 0, "hello with eos_id only: %s", err.text);
    T_CHECK(d.u.hello.eos_ids == NULL && msg_hello_eos(&d.u.hello, got) == 1 && got[0] == 5, "eos_id alone is the set");
    msg_free(&d);
    mb_free(&b);
    s_pack_hello(&b, -1, NULL, -1);
    T_CHECK(msg_decode(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, &d, &err) == 0 && msg_hello_eos(&d.u.hello, got) == 0,
            "hello without eos: no stop set");
    msg_free(&d);
    mb_free(&b);
    /* decoders check the list */
    int32_t bad[3] = {5, 9, 5};
    s_pack_hello(&b, 5, bad, 3);
    s_expect_fail(MSG_FAM_SCHED_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'eos_ids[2]'", "hello: repeated eos id");
    mb_free(&b);
    s_pack_hello(&b, 9, bad, 2);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'eos_id'", "hello: eos_id not first");
    mb_free(&b);
    s_pack_hello(&b, -1, bad, 2);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'eos_id'", "hello: eos_ids without eos_id");
    mb_free(&b);
    bad[1] = 300;
    s_pack_hello(&b, 5, bad, 2);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'eos_ids[1]'", "hello: eos id past the vocab");
    mb_free(&b);
    bad[1] = -2;
    s_pack_hello(&b, 5, bad, 2);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "eos_ids", "hello: negative eos id");
    mb_free(&b);
    s_pack_hello(&b, 5, bad, 0);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "eos_ids", "hello: empty eos_ids");
    mb_free(&b);
    for (int i = 0; i <= MSG_MAX_EOS; i++) ids[i] = i;
    s_pack_hello(&b, 0, ids, MSG_MAX_EOS + 1);
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "eos_ids", "hello: 17 eos ids");
    mb_free(&b);
    s_pack_hello(&b, 0, ids, MSG_MAX_EOS);
    T_CHECK(msg_decode(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, &d, &err) == 0 && msg_hello_eos(&d.u.hello, got) == MSG_MAX_EOS &&
                got[MSG_MAX_EOS - 1] == MSG_MAX_EOS - 1,
            "hello: 16 eos ids: %s", err.text);
    msg_free(&d);
    mb_free(&b);
}

/* A step of one sequence (pos0 32, one token, blocks [0, 1, 2]) with win_blocks packed by pack(). */
static void s_pack_win_step(mb_t *b, void (*pack)(mb_t *, const void *), const void *arg)
{
    mb_init(b);
    mb_head(b, 3, "step");
    mb_str(b, "id"); msgpack_pack_uint64(&b->pk, 1);
    mb_str(b, "instance"); msgpack_pack_uint64(&b->pk, 5);
    mb_str(b, "seqs");
    msgpack_pack_array(&b->pk, 1);
    msgpack_pack_map(&b->pk, 6);
    mb_str(b, "req"); msgpack_pack_uint64(&b->pk, 9);
    mb_str(b, "pos0"); msgpack_pack_int(&b->pk, 32);
    mb_str(b, "tokens"); msgpack_pack_array(&b->pk, 1); msgpack_pack_int(&b->pk, 4);
    mb_str(b, "blocks"); msgpack_pack_array(&b->pk, 3);
    for (int i = 0; i < 3; i++) msgpack_pack_int(&b->pk, i);
    mb_str(b, "sample"); msgpack_pack_true(&b->pk);
    mb_str(b, "win_blocks");
    pack(b, arg);
}
/* arg: int32_t[4] = {n, e0, e1, e2}: an array of n elements (n <= 3) */
static void s_pk_win_arr(mb_t *b, const void *a)
{
    const int32_t *v = a;
    msgpack_pack_array(&b->pk, (size_t)v[0]);
    for (int i = 0; i < v[0]; i++) msgpack_pack_int(&b->pk, v[1 + i]);
}
/* arg: int32_t[4] as above, sent as a bin of n int32 (7 bytes when n < 0) */
static void s_pk_win_bin(mb_t *b, const void *a)
{
    const int32_t *v = a;
    if (v[0] < 0) {
        msgpack_pack_bin_with_body(&b->pk, v + 1, 7); /* not a multiple of 4 */
        return;
    }
    msgpack_pack_bin_with_body(&b->pk, v + 1, (size_t)v[0] * 4);
}
static void s_pk_str_x(mb_t *b, const void *a) { (void)a; mb_str(b, "x"); }
static void s_pk_win_big(mb_t *b, const void *a)
{
    (void)a;
    msgpack_pack_array(&b->pk, 3);
    msgpack_pack_int(&b->pk, -1);
    msgpack_pack_int(&b->pk, 4);
    msgpack_pack_uint64(&b->pk, 1ull << 31);
}
static void s_pk_win_float(mb_t *b, const void *a)
{
    (void)a;
    msgpack_pack_array(&b->pk, 3);
    msgpack_pack_double(&b->pk, 1.5);
    msgpack_pack_int(&b->pk, 4);
    msgpack_pack_int(&b->pk, 5);
}

/* A hand-packed hello of six fields, five written: its last key and value are the caller's. */
static void s_hello_head(mb_t *b)
{
    mb_init(b);
    mb_head(b, 6, "hello");
    mb_str(b, "instance"); msgpack_pack_uint64(&b->pk, 7);
    mb_str(b, "pid"); msgpack_pack_int(&b->pk, 1);
    mb_str(b, "model"); mb_str(b, "m");
    mb_str(b, "vocab"); msgpack_pack_int(&b->pk, 300);
    mb_str(b, "max_context"); msgpack_pack_int(&b->pk, 256);
}

/* A model with sliding-window layers: the hello's sliding_window and a step's window tables
 * (win_blocks, -1 where freed, as long as blocks). */
static void test_window(void)
{
    msg_t m, d;
    msg_err_t err;
    mb_t b;
    int32_t toks[] = {4, 5}, blocks[] = {0, 1, 2}, win[] = {-1, 7, 8};
    msg_init(&m, MSG_EXEC_HELLO_REPLY);
    m.u.hello = (msg_hello_t){.instance = 7, .pid = 1, .model = msg_str("m"), .vocab = 300, .max_context = 256,
                              .bos_id = -1, .eos_id = -1, .sliding_window = 128};
    s_roundtrip(&m, &d, "hello with sliding_window");
    T_CHECK(d.u.hello.sliding_window == 128, "hello: sliding_window %d", d.u.hello.sliding_window);
    msg_free(&d);
    m.u.hello.sliding_window = 0;
    s_roundtrip(&m, &d, "hello without sliding_window");
    T_CHECK(d.u.hello.sliding_window == 0, "hello: no sliding_window is 0");
    msg_free(&d);
    m.u.hello.sliding_window = -1;
    s_expect_encode_fail(&m, "hello: sliding_window -1");
    /* hand-packed: a string, a negative window */
    s_hello_head(&b);
    mb_str(&b, "sliding_window"); mb_str(&b, "128");
    s_expect_fail(MSG_FAM_EXEC_OUT, b.sb.data, b.sb.size, MSG_E_WRONG_TYPE, "sliding_window", "hello: sliding_window a string");
    mb_free(&b);
    s_hello_head(&b);
    mb_str(&b, "sliding_window"); msgpack_pack_int(&b.pk, -8);
    s_expect_fail(MSG_FAM_SCHED_OUT, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'sliding_window': must be in [0,",
                  "hello: sliding_window -8");
    mb_free(&b);

    /* a step: the encoder packs win_blocks beside blocks, -1 kept */
    msg_step_seq_t seqs[2] = {
        {.req = 1, .pos0 = 32, .n_tokens = 1, .tokens = toks, .n_blocks = 3, .blocks = blocks, .sample = true,
         .samp = {0, 1, 0, 0}, .n_win_blocks = 3, .win_blocks = win},
        {.req = 2, .pos0 = 0, .n_tokens = 1, .tokens = toks + 1, .n_blocks = 1, .blocks = blocks, .samp = {0, 1, 0, 0}},
    };
    msg_init(&m, MSG_STEP);
    m.has_id = true;
    m.id = 3;
    m.u.step = (msg_step_t){5, 2, seqs};
    s_roundtrip(&m, &d, "step with win_blocks");
    T_CHECK(d.u.step.seqs[0].n_win_blocks == 3 && d.u.step.seqs[0].win_blocks[0] == -1 && d.u.step.seqs[0].win_blocks[2] == 8 &&
                d.u.step.seqs[1].win_blocks == NULL && d.u.step.seqs[1].n_win_blocks == 0,
            "step: win_blocks kept, absent stays absent");
    msg_free(&d);
    seqs[0].n_win_blocks = 2;
    s_expect_encode_fail(&m, "step: win_blocks shorter than blocks");
    seqs[0].n_win_blocks = 3;
    win[1] = -2;
    s_expect_encode_fail(&m, "step: win_blocks entry -2");
    win[1] = 7;
    blocks[0] = -1; /* -1 is a window table's only */
    s_expect_encode_fail(&m, "step: blocks entry -1");
    blocks[0] = 0;

    /* decoders: both forms, each kind of bad value */
    const int32_t ok[4] = {3, -1, 7, 8};
    for (int packed = 0; packed < 2; packed++) {
        void (*pk)(mb_t *, const void *) = packed ? s_pk_win_bin : s_pk_win_arr;
        s_pack_win_step(&b, pk, ok);
        T_CHECK(msg_decode(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, &d, &err) == 0 && d.u.step.seqs[0].win_blocks[0] == -1 &&
                    d.u.step.seqs[0].win_blocks[2] == 8,
                "step: win_blocks %s: %s", packed ? "packed" : "as an array", err.text);
        msg_free(&d);
        mb_free(&b);
        const int32_t neg[4] = {3, -1, -2, 8};
        s_pack_win_step(&b, pk, neg);
        s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'win_blocks[1]': must be in [-1,",
                      "step: win_blocks entry -2");
        mb_free(&b);
        const int32_t shorter[4] = {2, -1, 7, 0};
        s_pack_win_step(&b, pk, shorter);
        s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'win_blocks': 2 entries, 'blocks' has 3",
                      "step: win_blocks shorter than blocks");
        mb_free(&b);
        const int32_t empty[4] = {0, 0, 0, 0};
        s_pack_win_step(&b, pk, empty);
        s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "win_blocks", "step: empty win_blocks");
        mb_free(&b);
    }
    const int32_t odd[4] = {-1, 1, 2, 3};
    s_pack_win_step(&b, s_pk_win_bin, odd);
    s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'win_blocks': packed length 7",
                  "step: win_blocks of 7 bytes");
    mb_free(&b);
    s_pack_win_step(&b, s_pk_str_x, NULL);
    s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_WRONG_TYPE, "win_blocks", "step: win_blocks a string");
    mb_free(&b);
    s_pack_win_step(&b, s_pk_win_big, NULL);
    s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_INVALID_PARAM, "'win_blocks[2]'", "step: win_blocks entry 2^31");
    mb_free(&b);
    s_pack_win_step(&b, s_pk_win_float, NULL);
    s_expect_fail(MSG_FAM_EXEC_IN, b.sb.data, b.sb.size, MSG_E_WRONG_TYPE, "'win_blocks[0]'", "step: win_blocks entry 1.5");
    mb_free(&b);
}

int main(void)
{
    uint64_t seed = t_seed();
    test_hello_eos();
    test_window();
    test_chat();
    test_roundtrips();
    test_logprobs();
    test_bad_input();
    test_repeated_keys();
    test_error_values();
    test_mutations(seed);
    T_CHECK(msg_request_id("a", 1, 1) != msg_request_id("a", 1, 2), "request ids differ by cid");
    T_CHECK(msg_request_id("a", 1, 1) != msg_request_id("b", 1, 1), "request ids differ by client");
    T_CHECK(msg_request_id("a", 1, 1) == msg_request_id("a", 1, 1), "request ids are stable");
    return t_done("test_msg");
}
