/* test_chat_template.c - chat_template_load and chat_template_render on model folders made
 * here: where the template comes from (chat_template.jinja, tokenizer_config.json as a string
 * or a named list, chat_template.json), the special tokens, and each way loading fails, with
 * the file and, for an unsupported construct, the construct and its line in the message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/chat_template.h"
#include "tests/unit/check.h"

static char s_root[256];

static const char *s_dir(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", s_root, name);
    mkdir(path, 0755);
    return path;
}

static void s_write(const char *dir, const char *file, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* Load dir and render messages; returns the output (malloc'd) or NULL with eb set. */
static char *s_render(const char *dir, const char *messages, const char *extra, bool agp, strata_errbuf_t *eb)
{
    chat_template_t *t = NULL;
    if (chat_template_load(dir, &t, eb) < 0 || !t) return NULL;
    char *out = NULL;
    int rc = chat_template_render(t, messages, extra, agp, 86400 * 365, &out, eb);
    chat_template_free(t);
    return rc < 0 ? NULL : out;
}

int main(void)
{
    setenv("TZ", "UTC", 1);
    snprintf(s_root, sizeof s_root, "/tmp/strata-chat-template-XXXXXX");
    if (!mkdtemp(s_root)) {
        perror("mkdtemp");
        return 1;
    }
    strata_errbuf_t eb;
    char *out;
    const char *msgs = "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]";

    /* tokenizer_config.json with a string template and AddedToken special tokens */
    const char *d = s_dir("string");
    s_write(d, "tokenizer_config.json",
            "{\"bos_token\":{\"__type\":\"AddedToken\",\"content\":\"<s>\"},\"eos_token\":\"</s>\",\"pad_token\":\"\","
            "\"additional_special_tokens\":[\"<x>\",{\"content\":\"<y>\"}],"
            "\"chat_template\":\"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
            "{% if add_generation_prompt %}+{% endif %}{{ eos_token }}{{ pad_token is defined }}"
            "{{ additional_special_tokens|join(',') }}{{ tools }}{{ documents }}{{ extra_var|default('-') }}\"}");
    out = s_render(d, msgs, NULL, true, &eb);
    T_CHECK(out && !strcmp(out, "<s>[user:hi][assistant:yo]+</s>False<x>,<y>NoneNone-"), "%s", out ? out : eb.msg);
    free(out);
    out = s_render(d, msgs, "{\"extra_var\":[1,2.5,\"\\u00e9\"],\"tools\":[{\"type\":\"function\"}]}", false, &eb);
    T_CHECK(out && !strcmp(out, "<s>[user:hi][assistant:yo]</s>False<x>,<y>[{'type': 'function'}]None[1, 2.5, 'é']"), "%s",
            out ? out : eb.msg);
    free(out);
    /* messages and add_generation_prompt come from the caller's own arguments */
    out = s_render(d, msgs, "{\"messages\":[]}", false, &eb);
    T_CHECK(!out && strstr(eb.msg, "messages"), "%s", eb.msg);
    out = s_render(d, "{\"role\":\"user\"}", NULL, false, &eb);
    T_CHECK(!out && strstr(eb.msg, "not a JSON array"), "%s", eb.msg);
    out = s_render(d, "[{\"role\":", NULL, false, &eb);
    T_CHECK(!out && strstr(eb.msg, "messages: bad JSON"), "%s", eb.msg);
    out = s_render(d, msgs, "[1]", false, &eb);
    T_CHECK(!out && strstr(eb.msg, "extra variables"), "%s", eb.msg);

    /* chat_template.jinja wins over tokenizer_config.json */
    d = s_dir("jinja_file");
    s_write(d, "tokenizer_config.json", "{\"eos_token\":\"E\",\"chat_template\":\"from config\"}");
    s_write(d, "chat_template.jinja", "from file {{ eos_token }}\n");
    out = s_render(d, msgs, NULL, false, &eb);
    T_CHECK(out && !strcmp(out, "from file E"), "%s", out ? out : eb.msg);
    free(out);

    /* chat_template.jinja alone, no tokenizer_config.json: no special tokens */
    d = s_dir("jinja_only");
    s_write(d, "chat_template.jinja", "{{ bos_token is defined }}{{ messages|length }}");
    out = s_render(d, msgs, NULL, false, &eb);
    T_CHECK(out && !strcmp(out, "False2"), "%s", out ? out : eb.msg);
    free(out);

    /* the list form: the entry named "default" */
    d = s_dir("list");
    s_write(d, "tokenizer_config.json",
            "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"},{\"name\":\"default\",\"template\":\"D\"}]}");
    out = s_render(d, msgs, NULL, false, &eb);
    T_CHECK(out && !strcmp(out, "D"), "%s", out ? out : eb.msg);
    free(out);
    d = s_dir("list_no_default");
    s_write(d, "tokenizer_config.json", "{\"chat_template\":[{\"name\":\"tool_use\",\"template\":\"T\"}]}");
    chat_template_t *t = NULL;
    int rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc < 0 && !t && strstr(eb.msg, "tokenizer_config.json") && strstr(eb.msg, "default"), "%d %s", rc, eb.msg);
    d = s_dir("list_bad");
    s_write(d, "tokenizer_config.json", "{\"chat_template\":[{\"name\":\"default\"}]}");
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "chat_template[0]"), "%d %s", rc, eb.msg);
    d = s_dir("wrong_type");
    s_write(d, "tokenizer_config.json", "{\"chat_template\":5}");
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "must be a string"), "%d %s", rc, eb.msg);

    /* chat_template.json */
    d = s_dir("processor");
    s_write(d, "tokenizer_config.json", "{\"eos_token\":\"E\"}");
    s_write(d, "chat_template.json", "{\"chat_template\":\"P{{ eos_token }}\"}");
    out = s_render(d, msgs, NULL, false, &eb);
    T_CHECK(out && !strcmp(out, "PE"), "%s", out ? out : eb.msg);
    free(out);

    /* no template at all: 0 with NULL */
    d = s_dir("none");
    s_write(d, "tokenizer_config.json", "{\"eos_token\":\"E\"}");
    t = (chat_template_t *)1;
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc == 0 && t == NULL, "%d", rc);
    d = s_dir("empty");
    t = (chat_template_t *)1;
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc == 0 && t == NULL, "no tokenizer_config.json: %d", rc);

    /* failures */
    rc = chat_template_load("/nonexistent/strata/model", &t, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "/nonexistent/strata/model"), "%d %s", rc, eb.msg);
    d = s_dir("bad_json");
    s_write(d, "tokenizer_config.json", "{\"chat_template\": \"x\",");
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "tokenizer_config.json") && strstr(eb.msg, "bad JSON"), "%d %s", rc, eb.msg);
    d = s_dir("not_object");
    s_write(d, "tokenizer_config.json", "[1, 2]");
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc < 0 && strstr(eb.msg, "not a JSON object"), "%d %s", rc, eb.msg);
    d = s_dir("unsupported");
    s_write(d, "chat_template.jinja", "{% for m in messages %}\n{{ m|tojson }}\n{{ m|xmlattr }}\n{% endfor %}");
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc == STRATA_EUNSUPPORTED && strstr(eb.msg, "chat_template.jinja: chat template line 3: the filter 'xmlattr' is not supported"),
            "%d %s", rc, eb.msg);
    d = s_dir("syntax");
    s_write(d, "chat_template.jinja", "ok\n{% if x %}unclosed");
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc == STRATA_EFORMAT && strstr(eb.msg, "chat template line"), "%d %s", rc, eb.msg);
    d = s_dir("unsupported_tag");
    s_write(d, "tokenizer_config.json", "{\"chat_template\":\"a\\n\\n{% include 'x' %}\"}");
    rc = chat_template_load(d, &t, &eb);
    T_CHECK(rc == STRATA_EUNSUPPORTED && strstr(eb.msg, "tokenizer_config.json: chat template line 3: the tag 'include' is not supported"),
            "%d %s", rc, eb.msg);

    /* raise_exception's message surfaces; so does a method refused only at render */
    d = s_dir("raises");
    s_write(d, "chat_template.jinja",
            "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
            "{% endif %}{% endfor %}{{ messages[0].content.casefold() if messages[0].content == 'x' }}");
    out = s_render(d, "[{\"role\":\"system\",\"content\":\"s\"}]", NULL, false, &eb);
    T_CHECK(!out && strstr(eb.msg, "chat template line 1: System role not supported"), "%s", eb.msg);
    out = s_render(d, "[{\"role\":\"user\",\"content\":\"x\"}]", NULL, false, &eb);
    T_CHECK(!out && strstr(eb.msg, "'casefold' is not supported"), "%s", eb.msg);
    out = s_render(d, "[{\"role\":\"user\",\"content\":\"y\"}]", NULL, false, &eb);
    T_CHECK(out && !strcmp(out, ""), "%s", out ? out : eb.msg);
    free(out);

    /* strftime_now formats now_unix in local time */
    d = s_dir("clock");
    s_write(d, "chat_template.jinja", "{{ strftime_now('%Y-%m-%d %H:%M') }}");
    out = s_render(d, "[]", NULL, false, &eb);
    T_CHECK(out && !strcmp(out, "1971-01-01 00:00"), "%s", out ? out : eb.msg);
    free(out);

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_root);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", s_root);
    return t_done("chat_template");
}
