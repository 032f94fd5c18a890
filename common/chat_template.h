/* chat_template.h - a model's chat template, read from its folder and rendered the way
 * transformers renders it (apply_chat_template: jinja2's ImmutableSandboxedEnvironment with
 * trim_blocks and lstrip_blocks, the loopcontrols extension, and transformers' own `tojson`,
 * `raise_exception` and `strftime_now`), by the C template engine in common/jinja.h.
 *
 * The template comes from dir/chat_template.jinja, else from "chat_template" in
 * dir/tokenizer_config.json (a string, or a list of {name, template}: the one named "default"),
 * else from "chat_template" in dir/chat_template.json. The special tokens (bos_token, eos_token,
 * unk/sep/pad/cls/mask_token, additional_special_tokens) come from tokenizer_config.json (each a
 * string or an AddedToken object; empty ones are left out, as tokenizer.special_tokens_map
 * leaves them out). Variables at render: the special tokens, tools = None, documents = None,
 * then extra_json's, then messages and add_generation_prompt.
 * A template that uses a construct the engine does not support is refused at load, with the
 * construct and its line named in the error. */
#ifndef STRATA_CHAT_TEMPLATE_H
#define STRATA_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/strata.h"

typedef struct chat_template chat_template_t;

/* Load the chat template of the model folder dir (HF or packed). Returns 0 with *out set, or 0
 * with *out NULL when the folder has no chat template, or <0 with eb naming the file and, for a
 * template the engine cannot render, the construct and line. */
int chat_template_load(const char *dir, chat_template_t **out, strata_errbuf_t *eb);

/* Render messages_json (a JSON array of message objects, as OpenAI's chat API sends them) with
 * add_generation_prompt, and extra_json (NULL or a JSON object of further template variables:
 * tools, enable_thinking, ...). now_unix is the time strftime_now formats (seconds since the epoch,
 * shown in local time as Python's datetime.now() is; tests pin it and TZ). *out is a malloc'd NUL-terminated string. Returns 0, or <0 with eb saying
 * why (bad JSON, or the template's raise_exception message). */
int chat_template_render(const chat_template_t *t, const char *messages_json, const char *extra_json,
                         bool add_generation_prompt, int64_t now_unix, char **out, strata_errbuf_t *eb);

/* Safe on NULL. */
void chat_template_free(chat_template_t *t);

#endif
