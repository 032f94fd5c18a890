/* rtok.c - tokenizer adapter over common/tokenizer.h (see rtok.h). */
#include "services/router/rtok.h"

#include <stdlib.h>

#include "common/tokenizer.h"

struct rtok {
    tok_t *tok;
    char **piece;          /* [n_piece] rtok_piece's text of each id, NULL until asked */
    size_t *piece_len;     /* [n_piece] */
    size_t n_piece;
};

struct rtok_stream {
    tok_stream_t *st;
};

int rtok_open(const char *path, rtok_t **out, strata_errbuf_t *eb)
{
    rtok_t *t = calloc(1, sizeof *t);
    if (!t) return STRATA_ENOMEM;
    int rc = tok_load(&t->tok, path, eb);
    if (rc < 0) {
        free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void rtok_close(rtok_t *t)
{
    if (!t) return;
    for (size_t i = 0; i < t->n_piece; i++) free(t->piece[i]);
    free(t->piece);
    free(t->piece_len);
    tok_free(t->tok);
    free(t);
}

int rtok_piece(rtok_t *t, int32_t id, const char **s, size_t *n)
{
    *s = "";
    *n = 0;
    if (id < 0 || (size_t)id >= tok_vocab_size(t->tok)) return 0;
    if (!t->piece) {
        t->n_piece = tok_vocab_size(t->tok);
        t->piece = calloc(t->n_piece, sizeof *t->piece);
        t->piece_len = calloc(t->n_piece, sizeof *t->piece_len);
        if (!t->piece || !t->piece_len) {
            free(t->piece);
            free(t->piece_len);
            t->piece = NULL;
            t->piece_len = NULL;
            t->n_piece = 0;
            return STRATA_ENOMEM;
        }
    }
    if (!t->piece[id]) {
        char *text = NULL;
        size_t len = 0;
        int rc = tok_decode(t->tok, &id, 1, false, &text, &len);
        if (rc < 0) return rc;
        t->piece[id] = text;
        t->piece_len[id] = len;
    }
    *s = t->piece[id];
    *n = t->piece_len[id];
    return 0;
}

static int s_encode(rtok_t *t, const char *text, size_t len, bool add_special, int32_t **ids, int32_t *n)
{
    size_t nn = 0;
    int rc = tok_encode(t->tok, text, len, add_special, ids, &nn);
    if (rc < 0) return rc;
    if (nn > INT32_MAX) {
        free(*ids);
        *ids = NULL;
        return STRATA_ETOOLARGE;
    }
    *n = (int32_t)nn;
    return 0;
}

int rtok_encode_prompt(rtok_t *t, const char *text, size_t len, int32_t **ids, int32_t *n)
{
    return s_encode(t, text, len, true, ids, n);
}

int rtok_encode_chat(rtok_t *t, const char *text, size_t len, int32_t **ids, int32_t *n)
{
    return s_encode(t, text, len, false, ids, n);
}

rtok_stream_t *rtok_stream_new(rtok_t *t)
{
    rtok_stream_t *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (tok_stream_new(t->tok, true, &s->st) < 0) {
        free(s);
        return NULL;
    }
    return s;
}

int rtok_stream_push(rtok_stream_t *s, int32_t id, const char **bytes, size_t *n)
{
    return tok_stream_push(s->st, id, bytes, n);
}

int rtok_stream_flush(rtok_stream_t *s, const char **bytes, size_t *n)
{
    return tok_stream_flush(s->st, bytes, n);
}

void rtok_stream_free(rtok_stream_t *s)
{
    if (!s) return;
    tok_stream_free(s->st);
    free(s);
}
