/* tok_decode.c - ids to text: the batch decoder and the streaming decoder.
 *
 * Batch: a literal port of tokenizers' decoders. Each decoder maps a list of token strings
 * to a new list (decode_chain); the final list is joined with "" (or " " when the
 * tokenizer has no decoder).
 *
 * Streaming: the same chain run as a pipeline over one token at a time. Decoders before
 * the first "fusing" decoder (Fuse or ByteLevel, or the final join) see whole tokens; a few
 * need state: Metaspace and WordPiece count tokens, ByteFallback holds a run of <0xNN>
 * tokens until it ends (an invalid run turns every byte into U+FFFD, so no byte of it is
 * final before then), BPEDecoder holds the last token (its suffix becomes "" only at the
 * end). After the fuse point there is one growing string; ByteLevel holds an incomplete
 * UTF-8 tail, Strip holds trailing strip chars, a literal Replace holds a partial match.
 * A chain with any other decoder after the fuse point is streamed by holding all ids and
 * decoding them at flush: still exact, just not incremental. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_int.h"

/* ---------------------------------------------------------------- token lists */

typedef struct {
    tk_buf_t t;      /* the strings back to back */
    size_t *off;     /* [n] */
    size_t *len;     /* [n] */
    size_t n, cap;
    size_t open;     /* start of the item being built */
} s_lst_t;

static void s_lst_reset(s_lst_t *l)
{
    l->t.n = 0;
    l->n = 0;
}

static void s_lst_free(s_lst_t *l)
{
    tk_buf_free(&l->t);
    free(l->off);
    free(l->len);
    memset(l, 0, sizeof *l);
}

static void s_item_begin(s_lst_t *l) { l->open = l->t.n; }

static int s_item_end(s_lst_t *l)
{
    if (l->n == l->cap) {
        size_t c = l->cap ? l->cap * 2 : 64;
        size_t *o = realloc(l->off, c * sizeof *o);
        if (!o) return STRATA_ENOMEM;
        l->off = o;
        size_t *n = realloc(l->len, c * sizeof *n);
        if (!n) return STRATA_ENOMEM;
        l->len = n;
        l->cap = c;
    }
    l->off[l->n] = l->open;
    l->len[l->n] = l->t.n - l->open;
    l->n++;
    return 0;
}

static int s_lst_add(s_lst_t *l, const char *p, size_t n)
{
    s_item_begin(l);
    if (tk_buf_put(&l->t, p, n)) return STRATA_ENOMEM;
    return s_item_end(l);
}

/* ---------------------------------------------------------------- per-token transforms */

/* Rust str::replace / replacen: non-overlapping, left to right; an empty pattern matches at
 * every char boundary. max 0 = all. */
static int s_str_replace(tk_buf_t *out, const char *s, size_t n, const char *pat, size_t pn, const char *rep,
                         size_t rn, size_t max)
{
    size_t count = 0, i = 0, last = 0;
    if (!pn) {
        for (;;) {
            if (max && count == max) break;
            if (tk_buf_put(out, rep, rn)) return STRATA_ENOMEM;
            count++;
            if (i >= n) break;
            size_t l = (size_t)tk_utf8_len((unsigned char)s[i]);
            if (tk_buf_put(out, s + i, l)) return STRATA_ENOMEM;
            i += l;
        }
        return tk_buf_put(out, s + i, n - i);
    }
    while (i + pn <= n && (!max || count < max)) {
        const char *f = memmem(s + i, n - i, pat, pn);
        if (!f) break;
        size_t at = (size_t)(f - s);
        if (tk_buf_put(out, s + last, at - last) || tk_buf_put(out, rep, rn)) return STRATA_ENOMEM;
        i = last = at + pn;
        count++;
    }
    return tk_buf_put(out, s + last, n - last);
}

static int s_metaspace_tok(tk_buf_t *out, const tk_dec_t *d, const char *s, size_t n, bool first)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t cp = tk_utf8_dec(u + i, n - i, &l);
        if (cp == d->cp) {
            if (!(first && d->prepend_scheme != PREPEND_NEVER) && tk_buf_put(out, " ", 1)) return STRATA_ENOMEM;
        } else if (tk_buf_put(out, s + i, (size_t)l)) {
            return STRATA_ENOMEM;
        }
        i += (size_t)l;
    }
    return 0;
}

static int s_replace_tok(tk_ws_t *ws, tk_buf_t *out, const tk_dec_t *d, const char *s, size_t n)
{
    int rc = tk_re_find_matches(ws, &d->re, s, n, &ws->mt);
    if (rc) return rc;
    for (size_t i = 0; i < ws->mt.n; i++) {
        tk_match_t m = ws->mt.v[i];
        rc = m.m ? tk_buf_put(out, d->str, d->str_n) : tk_buf_put(out, s + m.s, m.e - m.s);
        if (rc) return rc;
    }
    return 0;
}

static int s_strip_tok(tk_buf_t *out, const tk_dec_t *d, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n;
    for (size_t k = 0; k < d->start && a < n; k++) {
        int l;
        if (tk_utf8_dec(u + a, n - a, &l) != d->cp) break;
        a += (size_t)l;
    }
    for (size_t k = 0; k < d->stop && b > a; k++) {
        size_t j = b - 1;
        while (j > a && (u[j] & 0xC0) == 0x80) j--;
        int l;
        if (tk_utf8_dec(u + j, b - j, &l) != d->cp) break;
        b = j;
    }
    return tk_buf_put(out, s + a, b - a);
}

static int s_wordpiece_tok(tk_buf_t *out, tk_buf_t *tmp, const tk_dec_t *d, const char *s, size_t n, bool first)
{
    tmp->n = 0;
    if (!first) {
        if (n >= d->str_n && !memcmp(s, d->str, d->str_n)) {
            if (s_str_replace(tmp, s, n, d->str, d->str_n, "", 0, 1)) return STRATA_ENOMEM;
        } else if (tk_buf_put(tmp, " ", 1) || tk_buf_put(tmp, s, n)) {
            return STRATA_ENOMEM;
        }
    } else if (tk_buf_put(tmp, s, n)) {
        return STRATA_ENOMEM;
    }
    if (!d->cleanup) return tk_buf_put(out, tmp->p, tmp->n);
    static const char *const pairs[][2] = {
        {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
        {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
    };
    tk_buf_t a = {0}, b = {0};
    int rc = tk_buf_put(&a, tmp->p, tmp->n);
    for (size_t i = 0; !rc && i < sizeof pairs / sizeof pairs[0]; i++) {
        b.n = 0;
        rc = s_str_replace(&b, a.p, a.n, pairs[i][0], strlen(pairs[i][0]), pairs[i][1], strlen(pairs[i][1]), 0);
        tk_buf_t t = a;
        a = b;
        b = t;
    }
    if (!rc) rc = tk_buf_put(out, a.p, a.n);
    tk_buf_free(&a);
    tk_buf_free(&b);
    return rc;
}

/* "<0xNN>" -> byte, as tokenizers parses it (u8::from_str_radix accepts a leading '+'). */
static int s_byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    static const signed char hv[256] = {
        ['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7, ['7'] = 8, ['8'] = 9,
        ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15, ['f'] = 16, ['A'] = 11,
        ['B'] = 12, ['C'] = 13, ['D'] = 14, ['E'] = 15, ['F'] = 16,
    };
    int h = hv[(unsigned char)s[3]], l = hv[(unsigned char)s[4]];
    if (s[3] == '+' && l) return l - 1;
    if (!h || !l) return -1;
    return (h - 1) * 16 + (l - 1);
}

/* ByteLevel: a token's chars back to bytes, or its raw bytes if any char is not in the map. */
static int s_bytelevel_tok(tk_buf_t *out, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t start = out->n;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t cp = tk_utf8_dec(u + i, n - i, &l);
        int b = tk_cp_byte(cp);
        if (b < 0) {
            out->n = start;
            return tk_buf_put(out, s, n);
        }
        unsigned char c = (unsigned char)b;
        if (tk_buf_put(out, &c, 1)) return STRATA_ENOMEM;
        i += (size_t)l;
    }
    return 0;
}

/* ---------------------------------------------------------------- batch decode */

static int s_apply_step(const tok_t *tok, tk_ws_t *ws, const tk_dec_t *d, const s_lst_t *in, s_lst_t *out)
{
    int rc = 0;
    s_lst_reset(out);
    switch (d->kind) {
    case DEC_BYTELEVEL: {
        tk_buf_t bytes = {0};
        for (size_t i = 0; !rc && i < in->n; i++) rc = s_bytelevel_tok(&bytes, in->t.p + in->off[i], in->len[i]);
        s_item_begin(out);
        if (!rc) rc = tk_utf8_lossy(&out->t, (const unsigned char *)bytes.p, bytes.n);
        if (!rc) rc = s_item_end(out);
        tk_buf_free(&bytes);
        return rc;
    }
    case DEC_FUSE:
        s_item_begin(out);
        for (size_t i = 0; !rc && i < in->n; i++) rc = tk_buf_put(&out->t, in->t.p + in->off[i], in->len[i]);
        return rc ? rc : s_item_end(out);
    case DEC_BYTE_FALLBACK: {
        tk_buf_t run = {0};
        for (size_t i = 0; !rc && i <= in->n; i++) {
            int b = i < in->n ? s_byte_token(in->t.p + in->off[i], in->len[i]) : -1;
            if (b >= 0) {
                unsigned char c = (unsigned char)b;
                rc = tk_buf_put(&run, &c, 1);
                continue;
            }
            if (run.n) {
                if (tk_utf8_valid_prefix((const unsigned char *)run.p, run.n) == run.n) {
                    rc = s_lst_add(out, run.p, run.n);
                } else {
                    for (size_t j = 0; !rc && j < run.n; j++) rc = s_lst_add(out, "\xEF\xBF\xBD", 3);
                }
                run.n = 0;
            }
            if (!rc && i < in->n) rc = s_lst_add(out, in->t.p + in->off[i], in->len[i]);
        }
        tk_buf_free(&run);
        return rc;
    }
    default: break;
    }
    for (size_t i = 0; !rc && i < in->n; i++) {
        const char *s = in->t.p + in->off[i];
        size_t n = in->len[i];
        s_item_begin(out);
        switch (d->kind) {
        case DEC_METASPACE: rc = s_metaspace_tok(&out->t, d, s, n, i == 0); break;
        case DEC_REPLACE: rc = s_replace_tok(ws, &out->t, d, s, n); break;
        case DEC_STRIP: rc = s_strip_tok(&out->t, d, s, n); break;
        case DEC_BPE: rc = s_str_replace(&out->t, s, n, d->str, d->str_n, i + 1 == in->n ? "" : " ", i + 1 == in->n ? 0 : 1, 0); break;
        case DEC_WORDPIECE: rc = s_wordpiece_tok(&out->t, &ws->tmp, d, s, n, i == 0); break;
        default: rc = STRATA_EUNSUPPORTED; break;
        }
        if (!rc) rc = s_item_end(out);
    }
    (void)tok;
    return rc;
}

int tk_decode_tokens(const tok_t *tok, const char *const *tok_s, const size_t *tok_n, size_t n, tk_buf_t *out)
{
    s_lst_t a = {0}, b = {0};
    tk_ws_t *ws = NULL;
    int rc = 0;
    out->n = 0;
    if (!tok->has_decoder) {
        for (size_t i = 0; !rc && i < n; i++) {
            if (i) rc = tk_buf_put(out, " ", 1);
            if (!rc) rc = tk_buf_put(out, tok_s[i], tok_n[i]);
        }
        if (!rc) rc = tk_buf_reserve(out, 0);
        return rc;
    }
    ws = tk_ws_get(tok);
    if (!ws) return STRATA_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if ((rc = s_lst_add(&a, tok_s[i], tok_n[i]))) goto fail;
    for (size_t k = 0; k < tok->ndec; k++) {
        if ((rc = s_apply_step(tok, ws, &tok->dec[k], &a, &b))) goto fail;
        s_lst_t t = a;
        a = b;
        b = t;
    }
    for (size_t i = 0; i < a.n; i++)
        if ((rc = tk_buf_put(out, a.t.p + a.off[i], a.len[i]))) goto fail;
    rc = tk_buf_reserve(out, 0);
fail:
    tk_ws_put(tok, ws);
    s_lst_free(&a);
    s_lst_free(&b);
    return rc;
}

/* The token strings of ids (unknown ids and, if asked, special tokens dropped). */
static int s_collect(const tok_t *tok, const int32_t *ids, size_t n, bool skip_special, const char ***ps,
                     size_t **pn, size_t *cnt)
{
    *ps = malloc((n ? n : 1) * sizeof **ps);
    *pn = malloc((n ? n : 1) * sizeof **pn);
    if (!*ps || !*pn) return STRATA_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *s = tok_id_to_token(tok, ids[i], &l);
        if (!s || (skip_special && tok->id_special[ids[i]])) continue;
        (*ps)[k] = s;
        (*pn)[k] = l;
        k++;
    }
    *cnt = k;
    return 0;
}

int tok_decode(const tok_t *tok, const int32_t *ids, size_t n, bool skip_special, char **text, size_t *len)
{
    const char **ps = NULL;
    size_t *pn = NULL, cnt = 0;
    tk_buf_t out = {0};
    *text = NULL;
    *len = 0;
    int rc = s_collect(tok, ids, n, skip_special, &ps, &pn, &cnt);
    if (!rc) rc = tk_decode_tokens(tok, ps, pn, cnt, &out);
    if (!rc) rc = tk_buf_reserve(&out, 0);
    if (!rc) out.p[out.n] = 0;
    free(ps);
    free(pn);
    if (rc) {
        tk_buf_free(&out);
        return rc;
    }
    *text = out.p;
    *len = out.n;
    return 0;
}

/* ---------------------------------------------------------------- streaming */

enum { FUSE_JOIN, FUSE_JOIN_SPACE, FUSE_BYTELEVEL, FUSE_FUSE };

typedef struct {
    size_t count;      /* tokens seen (Metaspace, WordPiece) */
    tk_buf_t hold;     /* ByteFallback run, BPEDecoder last token, Replace partial match */
    bool has_hold;
    size_t left_seen;  /* Strip: leading chars removed */
    bool left_done;
    size_t held;       /* Strip: trailing strip chars held back */
    tk_buf_t tmp;
} s_sstep_t;

struct tok_stream {
    const tok_t *tok;
    bool skip_special;
    bool hold_all;
    int32_t *ids;      /* [nids] hold-all mode */
    size_t nids, capids;
    size_t fuse;       /* index of the fusing decoder, ndec if the join fuses */
    int fuse_kind;
    size_t njoined;    /* tokens through a " " join */
    s_sstep_t *st;     /* [ndec] */
    tk_buf_t bl;       /* ByteLevel bytes not yet final */
    tk_buf_t out;      /* text returned by the current call */
    tk_buf_t scratch;  /* WordPiece */
};

int tok_stream_new(const tok_t *tok, bool skip_special, tok_stream_t **out)
{
    tok_stream_t *st = calloc(1, sizeof *st);
    *out = NULL;
    if (!st) return STRATA_ENOMEM;
    st->tok = tok;
    st->skip_special = skip_special;
    st->st = calloc(tok->ndec ? tok->ndec : 1, sizeof *st->st);
    if (!st->st) {
        tok_stream_free(st);
        return STRATA_ENOMEM;
    }
    st->fuse = tok->ndec;
    st->fuse_kind = tok->has_decoder ? FUSE_JOIN : FUSE_JOIN_SPACE;
    for (size_t k = 0; k < tok->ndec; k++) {
        if (tok->dec[k].kind == DEC_BYTELEVEL || tok->dec[k].kind == DEC_FUSE) {
            st->fuse = k;
            st->fuse_kind = tok->dec[k].kind == DEC_BYTELEVEL ? FUSE_BYTELEVEL : FUSE_FUSE;
            break;
        }
    }
    for (size_t k = st->fuse + 1; k < tok->ndec; k++) {
        const tk_dec_t *d = &tok->dec[k];
        bool ok = d->kind == DEC_FUSE || d->kind == DEC_METASPACE || d->kind == DEC_STRIP ||
                  (d->kind == DEC_REPLACE && d->literal && d->pat_n > 0);
        if (!ok) st->hold_all = true;
    }
    *out = st;
    return 0;
}

void tok_stream_free(tok_stream_t *st)
{
    if (!st) return;
    if (st->st)
        for (size_t k = 0; k < st->tok->ndec; k++) {
            tk_buf_free(&st->st[k].hold);
            tk_buf_free(&st->st[k].tmp);
        }
    free(st->st);
    free(st->ids);
    tk_buf_free(&st->bl);
    tk_buf_free(&st->out);
    tk_buf_free(&st->scratch);
    free(st);
}

/* After the fuse point: one growing string, fed in pieces of whole chars. */
static int s_post_in(tok_stream_t *st, size_t k, const char *p, size_t n)
{
    const tok_t *tok = st->tok;
    if (k >= tok->ndec) return tk_buf_put(&st->out, p, n);
    const tk_dec_t *d = &tok->dec[k];
    s_sstep_t *S = &st->st[k];
    const unsigned char *u = (const unsigned char *)p;
    S->tmp.n = 0;
    switch (d->kind) {
    case DEC_FUSE: return s_post_in(st, k + 1, p, n);
    case DEC_METASPACE:
        if (s_metaspace_tok(&S->tmp, d, p, n, true)) return STRATA_ENOMEM;
        break;
    case DEC_STRIP: {
        char enc[4];
        int el = tk_utf8_enc(d->cp, enc);
        for (size_t i = 0; i < n;) {
            int l;
            uint32_t cp = tk_utf8_dec(u + i, n - i, &l);
            i += (size_t)l;
            if (!S->left_done) {
                if (S->left_seen < d->start && cp == d->cp) {
                    S->left_seen++;
                    continue;
                }
                S->left_done = true;
            }
            if (d->stop && cp == d->cp) {
                if (++S->held > d->stop) {
                    S->held--;
                    if (tk_buf_put(&S->tmp, enc, (size_t)el)) return STRATA_ENOMEM;
                }
                continue;
            }
            for (; S->held; S->held--)
                if (tk_buf_put(&S->tmp, enc, (size_t)el)) return STRATA_ENOMEM;
            if (tk_buf_put(&S->tmp, p + i - (size_t)l, (size_t)l)) return STRATA_ENOMEM;
        }
        break;
    }
    case DEC_REPLACE: {
        if (tk_buf_put(&S->hold, p, n)) return STRATA_ENOMEM;
        const char *h = S->hold.p;
        size_t hn = S->hold.n, i = 0;
        while (i < hn) {
            size_t rem = hn - i;
            if (rem >= d->pat_n && !memcmp(h + i, d->pat, d->pat_n)) {
                if (tk_buf_put(&S->tmp, d->str, d->str_n)) return STRATA_ENOMEM;
                i += d->pat_n;
                continue;
            }
            if (rem < d->pat_n && !memcmp(h + i, d->pat, rem)) break; /* may become a match */
            if (tk_buf_put(&S->tmp, h + i, 1)) return STRATA_ENOMEM;
            i++;
        }
        memmove(S->hold.p, h + i, hn - i);
        S->hold.n = hn - i;
        break;
    }
    default: return STRATA_EUNSUPPORTED;
    }
    return S->tmp.n ? s_post_in(st, k + 1, S->tmp.p, S->tmp.n) : 0;
}

/* Emit what the ByteLevel bytes make final: all but an incomplete UTF-8 tail. */
static int s_bl_emit(tok_stream_t *st, bool end)
{
    const unsigned char *p = (const unsigned char *)st->bl.p;
    size_t n = st->bl.n, i = 0;
    tk_buf_t *o = &st->st[st->fuse].tmp;
    o->n = 0;
    while (i < n) {
        size_t v = tk_utf8_valid_prefix(p + i, n - i);
        if (v) {
            if (tk_buf_put(o, p + i, v)) return STRATA_ENOMEM;
            i += v;
            continue;
        }
        bool valid, inc;
        size_t l = tk_utf8_subpart(p + i, n - i, &valid, &inc);
        if (inc && !end) break;
        if (tk_buf_put(o, "\xEF\xBF\xBD", 3)) return STRATA_ENOMEM;
        i += l;
    }
    memmove(st->bl.p, st->bl.p + i, n - i);
    st->bl.n = n - i;
    return o->n ? s_post_in(st, st->fuse + 1, o->p, o->n) : 0;
}

static int s_fuse_in(tok_stream_t *st, const char *p, size_t n)
{
    switch (st->fuse_kind) {
    case FUSE_BYTELEVEL:
        if (s_bytelevel_tok(&st->bl, p, n)) return STRATA_ENOMEM;
        return s_bl_emit(st, false);
    case FUSE_JOIN_SPACE:
        if (st->njoined++ && s_post_in(st, st->fuse + 1, " ", 1)) return STRATA_ENOMEM;
        return s_post_in(st, st->fuse + 1, p, n);
    default: return s_post_in(st, st->fuse + 1, p, n);
    }
}

static int s_pre_in(tok_stream_t *st, size_t k, const char *p, size_t n);

/* End a ByteFallback run: its text, or one U+FFFD per byte when it is not valid UTF-8. */
static int s_bf_flush(tok_stream_t *st, size_t k)
{
    s_sstep_t *S = &st->st[k];
    if (!S->hold.n) return 0;
    tk_buf_t run = S->hold;
    memset(&S->hold, 0, sizeof S->hold);
    int rc = 0;
    if (tk_utf8_valid_prefix((const unsigned char *)run.p, run.n) == run.n) rc = s_pre_in(st, k + 1, run.p, run.n);
    else
        for (size_t j = 0; !rc && j < run.n; j++) rc = s_pre_in(st, k + 1, "\xEF\xBF\xBD", 3);
    run.n = 0;
    if (!S->hold.p) S->hold = run; /* keep the allocation */
    else tk_buf_free(&run);
    return rc;
}

/* Before the fuse point: whole tokens. */
static int s_pre_in(tok_stream_t *st, size_t k, const char *p, size_t n)
{
    const tok_t *tok = st->tok;
    if (k >= st->fuse) return s_fuse_in(st, p, n);
    const tk_dec_t *d = &tok->dec[k];
    s_sstep_t *S = &st->st[k];
    int rc = 0;
    S->tmp.n = 0;
    switch (d->kind) {
    case DEC_METASPACE: rc = s_metaspace_tok(&S->tmp, d, p, n, S->count++ == 0); break;
    case DEC_REPLACE: { /* a workspace (regex match data) only for the call */
        tk_ws_t *ws = tk_ws_get(tok);
        if (!ws) return STRATA_ENOMEM;
        rc = s_replace_tok(ws, &S->tmp, d, p, n);
        tk_ws_put(tok, ws);
        break;
    }
    case DEC_STRIP: rc = s_strip_tok(&S->tmp, d, p, n); break;
    case DEC_WORDPIECE: rc = s_wordpiece_tok(&S->tmp, &st->scratch, d, p, n, S->count++ == 0); break;
    case DEC_BYTE_FALLBACK: {
        int b = s_byte_token(p, n);
        if (b >= 0) {
            unsigned char c = (unsigned char)b;
            return tk_buf_put(&S->hold, &c, 1);
        }
        if ((rc = s_bf_flush(st, k))) return rc;
        return s_pre_in(st, k + 1, p, n);
    }
    case DEC_BPE:
        if (S->has_hold) {
            rc = s_str_replace(&S->tmp, S->hold.p, S->hold.n, d->str, d->str_n, " ", 1, 0);
            if (!rc) rc = s_pre_in(st, k + 1, S->tmp.p, S->tmp.n);
        }
        S->hold.n = 0;
        if (!rc) rc = tk_buf_put(&S->hold, p, n);
        S->has_hold = true;
        return rc;
    default: return STRATA_EUNSUPPORTED;
    }
    if (rc) return rc;
    return s_pre_in(st, k + 1, S->tmp.p ? S->tmp.p : "", S->tmp.n);
}

static void s_stream_reset(tok_stream_t *st)
{
    for (size_t k = 0; k < st->tok->ndec; k++) {
        s_sstep_t *S = &st->st[k];
        S->count = 0;
        S->hold.n = 0;
        S->has_hold = false;
        S->left_seen = 0;
        S->left_done = false;
        S->held = 0;
    }
    st->bl.n = 0;
    st->nids = 0;
    st->njoined = 0;
}

int tok_stream_push(tok_stream_t *st, int32_t id, const char **text, size_t *len)
{
    const tok_t *tok = st->tok;
    int rc = 0;
    st->out.n = 0;
    size_t l;
    const char *s = tok_id_to_token(tok, id, &l);
    if (s && !(st->skip_special && tok->id_special[id])) {
        if (st->hold_all) {
            if (st->nids == st->capids) {
                size_t c = st->capids ? st->capids * 2 : 64;
                int32_t *v = realloc(st->ids, c * sizeof *v);
                if (!v) return STRATA_ENOMEM;
                st->ids = v;
                st->capids = c;
            }
            st->ids[st->nids++] = id;
        } else {
            rc = s_pre_in(st, 0, s, l);
        }
    }
    if (!rc) rc = tk_buf_reserve(&st->out, 0);
    *text = st->out.p;
    *len = rc ? 0 : st->out.n;
    return rc;
}

int tok_stream_flush(tok_stream_t *st, const char **text, size_t *len)
{
    const tok_t *tok = st->tok;
    int rc = 0;
    st->out.n = 0;
    if (st->hold_all) {
        char *t = NULL;
        size_t tn = 0;
        rc = tok_decode(tok, st->ids, st->nids, false, &t, &tn);
        if (!rc) rc = tk_buf_put(&st->out, t, tn);
        free(t);
    } else {
        for (size_t k = 0; !rc && k < st->fuse; k++) {
            const tk_dec_t *d = &tok->dec[k];
            s_sstep_t *S = &st->st[k];
            if (d->kind == DEC_BYTE_FALLBACK) {
                rc = s_bf_flush(st, k);
            } else if (d->kind == DEC_BPE && S->has_hold) {
                S->tmp.n = 0;
                rc = s_str_replace(&S->tmp, S->hold.p, S->hold.n, d->str, d->str_n, "", 0, 0);
                S->has_hold = false;
                if (!rc) rc = s_pre_in(st, k + 1, S->tmp.p ? S->tmp.p : "", S->tmp.n);
            }
        }
        if (!rc && st->fuse_kind == FUSE_BYTELEVEL) rc = s_bl_emit(st, true);
        for (size_t k = st->fuse + 1; !rc && k < tok->ndec; k++) {
            const tk_dec_t *d = &tok->dec[k];
            s_sstep_t *S = &st->st[k];
            if (d->kind == DEC_REPLACE && S->hold.n) {
                tk_buf_t h = S->hold;
                memset(&S->hold, 0, sizeof S->hold);
                rc = s_post_in(st, k + 1, h.p, h.n);
                tk_buf_free(&h);
            }
        }
    }
    s_stream_reset(st);
    if (!rc) rc = tk_buf_reserve(&st->out, 0);
    *text = st->out.p;
    *len = rc ? 0 : st->out.n;
    return rc;
}
