/* rtok_none.c - tokenizer adapter for a build without common/tokenizer (see rtok.h).
 *
 * common/tokenizer.h is being written by another engineer; until it lands this build has no
 * tokenizer and the router accepts token-id prompts only (rtok_open gives NULL). */
#include "services/router/rtok.h"

#include <stdlib.h>

int rtok_open(const char *path, rtok_t **out, strata_errbuf_t *eb)
{
    (void)eb;
    log_warn("this build has no tokenizer; %s is not used and prompts must be token ids", path);
    *out = NULL;
    return 0;
}

void rtok_close(rtok_t *t) { (void)t; }

int rtok_encode_prompt(rtok_t *t, const char *text, size_t len, int32_t **ids, int32_t *n)
{
    (void)t; (void)text; (void)len;
    *ids = NULL;
    *n = 0;
    return STRATA_EUNSUPPORTED;
}

rtok_stream_t *rtok_stream_new(rtok_t *t) { (void)t; return NULL; }

int rtok_stream_push(rtok_stream_t *s, int32_t id, const char **bytes, size_t *n)
{
    (void)s; (void)id;
    *bytes = "";
    *n = 0;
    return 0;
}

int rtok_stream_flush(rtok_stream_t *s, const char **bytes, size_t *n)
{
    (void)s;
    *bytes = "";
    *n = 0;
    return 0;
}

void rtok_stream_free(rtok_stream_t *s) { (void)s; }
