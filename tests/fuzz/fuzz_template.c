/* fuzz_template.c - libFuzzer target for the chat template engine (common/jinja.h).
 *
 * The first byte picks the mode:
 *   b & 1 == 0   the rest is a template: it parses or is refused with a "line N: " message; a
 *                parsed one renders against a small fixed context (messages with tool calls,
 *                tools, numbers, Unicode) under tight limits, and renders the same bytes a
 *                second time.
 *   otherwise    the rest is a JSON text for the variable `messages`, rendered by a built-in
 *                template that walks it the way chat templates do.
 * Either way the output must be valid UTF-8 and within the output limit, and an error must
 * say why. Any violation aborts; ASan/UBSan/LeakSanitizer catch the rest. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jinja.h"
#include "tests/fuzz/fuzz_utf8.h"

static const jinja_limits_t s_lim = {
    .max_output = 1u << 20,
    .max_memory = 64u << 20,
    .max_iters = 20000,
    .max_steps = 500000,
    .max_depth = 32,
};

static const char s_ctx_json[] =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief. \\u4f60\\u597d\"},"
    "{\"role\":\"user\",\"content\":\"What's the weather? \\ud83d\\ude00 \\\"q\\\" \\\\ \\n x\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
    "\"function\":{\"name\":\"get\",\"arguments\":{\"city\":\"Paris\",\"n\":[1,2.5,true,null]}}}]},"
    "{\"role\":\"tool\",\"content\":\"{\\\"t\\\": 20}\",\"tool_call_id\":\"call_1\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>hm</think>It is 20.\",\"reasoning_content\":\"r\"}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}],"
    "\"add_generation_prompt\":true,\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"enable_thinking\":false,"
    "\"n\":-9223372036854775807,\"f\":1e-7,\"big\":1.7976931348623157e308,\"empty\":\"\",\"d\":{}}";

static const char s_walker[] =
    "{%- set ns = namespace(last=-1) %}{% for m in messages[::-1] %}{% if m.role == 'user' and ns.last < 0 %}"
    "{% set ns.last = loop.revindex0 %}{% endif %}{% endfor %}"
    "{{ bos_token }}{% for m in messages %}{% if m is mapping %}"
    "<{{ m.role }}>{% if m.content is string %}{{ m.content|trim }}{{ m.content.split('</think>')[-1] }}"
    "{% elif m.content is mapping or m.content is iterable %}{{ m.content|tojson }}{% else %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}{{ c.function.name if c.function is defined else c }}"
    "{{ c.function.arguments|tojson(indent=1) if c.function is defined }}{% endfor %}"
    "{% if loop.index0 > ns.last %}*{% endif %}{% else %}{{ m|string|length }}{% endif %}{% endfor %}"
    "{{ messages|selectattr('role', 'defined')|map(attribute='role')|unique|join(',') }}";

static jinja_template_t *s_walker_t;

/* Render t with c; returns the output or NULL (error checked). */
static char *s_render(const jinja_template_t *t, jinja_ctx_t *c, size_t *n)
{
    char *out = NULL;
    strata_errbuf_t eb = {{0}};
    int rc = jinja_render(t, c, 1700000000, &out, n, &eb);
    if (rc < 0) {
        if (out || !eb.msg[0]) abort();
        return NULL;
    }
    if (!out || out[*n] || *n > s_lim.max_output || !fuzz_valid_utf8((const unsigned char *)out, *n)) abort();
    return out;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    strata_errbuf_t eb;
    if (jinja_parse(s_walker, strlen(s_walker), &s_walker_t, &eb) < 0) {
        fprintf(stderr, "built-in template: %s\n", eb.msg);
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 1 << 16) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    jinja_ctx_t *c = jinja_ctx_new(&s_lim);
    if (!c) abort();
    strata_errbuf_t eb = {{0}};
    jinja_val_t *v = NULL;
    if ((data[0] & 1) == 0) {
        jinja_template_t *t = NULL;
        int rc = jinja_parse(text, n, &t, &eb);
        if (rc < 0) {
            if (t || strncmp(eb.msg, "line ", 5)) abort();
        } else {
            if (jinja_from_json(c, s_ctx_json, sizeof s_ctx_json - 1, "context", &v, &eb) < 0 || jinja_set_each(c, v) < 0)
                abort();
            size_t n1 = 0, n2 = 0;
            char *o1 = s_render(t, c, &n1);
            if (o1) {
                /* a second render of the same context gives the same bytes (cyclers and
                 * namespaces are made anew by the template, so there is no carried state) */
                char *o2 = s_render(t, c, &n2);
                if (o2 && (n1 != n2 || memcmp(o1, o2, n1))) abort();
                free(o2);
            }
            free(o1);
            jinja_free(t);
        }
    } else {
        if (jinja_from_json(c, text, n, "messages", &v, &eb) == 0) {
            if (jinja_set(c, "messages", v) < 0 || jinja_set(c, "bos_token", jinja_str(c, "<s>", 3)) < 0) abort();
            size_t len = 0;
            free(s_render(s_walker_t, c, &len));
        } else if (!eb.msg[0]) {
            abort();
        }
    }
    jinja_ctx_free(c);
    return 0;
}
