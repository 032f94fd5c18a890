/* rtok.h - the router's view of the tokenizer: prompt text to ids, and ids to text bytes
 * one token at a time. A thin adapter over common/tokenizer.h, so the router's streaming
 * logic does not depend on the tokenizer's API details. */
#ifndef STRATA_ROUTER_RTOK_H
#define STRATA_ROUTER_RTOK_H

#include <stddef.h>
#include <stdint.h>

#include "common/strata.h"

typedef struct rtok rtok_t;
typedef struct rtok_stream rtok_stream_t;

/* Load tokenizer.json at path (or a folder holding one). 0 and *out, or <0 with eb naming
 * the file and the problem. */
int rtok_open(const char *path, rtok_t **out, strata_errbuf_t *eb);
void rtok_close(rtok_t *t);
/* Tokenize a prompt (UTF-8, len bytes) as the model expects it (bos added when the
 * tokenizer says so). *ids is malloc'd ([*n]). 0 or <0. */
int rtok_encode_prompt(rtok_t *t, const char *text, size_t len, int32_t **ids, int32_t *n);
/* Tokenize a rendered chat template: no special tokens added (the template wrote them), as
 * transformers' apply_chat_template(tokenize=True) does. 0 or <0. */
int rtok_encode_chat(rtok_t *t, const char *text, size_t len, int32_t **ids, int32_t *n);
/* The text of token id decoded on its own, special tokens included, as transformers'
 * tokenizer.decode([id]) gives it (valid UTF-8: a token that ends inside a UTF-8 sequence reads
 * as U+FFFD); cached per id, so *s lives as long as t. An id the tokenizer does not know is "".
 * 0 or STRATA_ENOMEM. */
int rtok_piece(rtok_t *t, int32_t id, const char **s, size_t *n);
/* Incremental detokenizer for one answer. NULL on out of memory. */
rtok_stream_t *rtok_stream_new(rtok_t *t);
/* Bytes that token id adds to the text (*bytes valid until the next call; may be 0 bytes,
 * may end inside a UTF-8 sequence). 0 or <0. */
int rtok_stream_push(rtok_stream_t *s, int32_t id, const char **bytes, size_t *n);
/* Bytes still held back at the end of the answer. 0 or <0. */
int rtok_stream_flush(rtok_stream_t *s, const char **bytes, size_t *n);
void rtok_stream_free(rtok_stream_t *s);

#endif
