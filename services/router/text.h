/* text.h - the text side of one streamed answer: decoded bytes in, safe text out.
 *
 * Bytes from the detokenizer arrive in any split (a token may end inside a UTF-8 sequence, a
 * byte-level model may emit invalid bytes). text_stream_t turns them into valid UTF-8 (each
 * invalid byte becomes U+FFFD; an incomplete sequence waits for its next bytes) and applies
 * the request's stop strings: text that might be the beginning of a stop string is held back
 * until it is decided, and on a match the text is cut before the stop string.
 */
#ifndef STRATA_ROUTER_TEXT_H
#define STRATA_ROUTER_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

typedef struct {
    char *raw;          /* [raw_len] bytes of an incomplete UTF-8 sequence (< 4) */
    size_t raw_len;
    char *pend;         /* [pend_len] valid UTF-8 not yet emitted */
    size_t pend_len, pend_cap;
    char *out;          /* [out_cap] what the last text_stream_take handed out, NUL-terminated */
    size_t out_cap;
    int n_stop;
    char **stop;        /* [n_stop] stop strings, NUL-terminated copies */
    size_t *stop_len;   /* [n_stop] bytes */
    bool stopped;       /* a stop string matched; nothing more is emitted */
    uint64_t emitted;   /* bytes handed out by text_stream_take so far */
} text_stream_t;

/* Set up with copies of the stop strings (may be 0). 0 or STRATA_ENOMEM. */
int text_stream_init(text_stream_t *t, const msg_str_t *stop, int n_stop);
void text_stream_free(text_stream_t *t);
/* Append decoded bytes (any bytes). Ignored once stopped. 0 or STRATA_ENOMEM. */
int text_stream_push(text_stream_t *t, const void *bytes, size_t n);
/* Hand out the text that is final: *out points into t (valid until the next take), *n bytes.
 * final = no more bytes will come (flushes held-back text and incomplete sequences).
 * Returns true if a stop string matched now or earlier. */
bool text_stream_take(text_stream_t *t, bool final, const char **out, size_t *n);

#endif
