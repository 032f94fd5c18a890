/* tok_encode.c - text to ids, step for step as tokenizers' TokenizerImpl::encode does it:
 *   1. invalid UTF-8 -> U+FFFD (Python's errors="replace");
 *   2. added tokens with normalized=false are cut out of the raw text;
 *   3. each remaining segment is normalized, then tokens with normalized=true are cut out;
 *   4. the pre-tokenizers split (and ByteLevel / Metaspace rewrite) the segments;
 *   5. BPE turns each piece into ids (with a per-workspace cache of pieces);
 *   6. truncation, the post-processors (special tokens), padding.
 * The pre-tokenized string is one text buffer plus a list of (offset, length, id) splits;
 * stages that only split write a new list over the same text, stages that rewrite text
 * write the other text buffer. */
#include <stdlib.h>
#include <string.h>

#include "common/tok_int.h"

#define TK_MAX_INPUT (16u << 20) /* bounds the worst case of NFKC (18x) and alignment arrays */
#define TK_CACHE_CAP 16384u     /* slots; cleared when half full */
#define TK_CACHE_MAX_KEY 256    /* tokenizers caches pieces shorter than this */

/* ---------------------------------------------------------------- workspaces */

static tk_ws_t *s_ws_new(void)
{
    tk_ws_t *ws = calloc(1, sizeof *ws);
    if (!ws) return NULL;
    ws->md = pcre2_match_data_create(16, NULL);
    ws->mctx = pcre2_match_context_create(NULL);
    ws->jst = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
    if (!ws->md || !ws->mctx || !ws->jst) {
        tk_ws_free(ws);
        return NULL;
    }
    pcre2_jit_stack_assign(ws->mctx, NULL, ws->jst);
    return ws;
}

tk_ws_t *tk_ws_get(const tok_t *tok)
{
    tk_ws_t *ws = NULL;
    pthread_mutex_lock(&tok->pool->mu);
    if (tok->pool->free) {
        ws = tok->pool->free;
        tok->pool->free = ws->next;
    }
    pthread_mutex_unlock(&tok->pool->mu);
    return ws ? ws : s_ws_new();
}

void tk_ws_put(const tok_t *tok, tk_ws_t *ws)
{
    pthread_mutex_lock(&tok->pool->mu);
    ws->next = tok->pool->free;
    tok->pool->free = ws;
    pthread_mutex_unlock(&tok->pool->mu);
}

void tk_ws_free(tk_ws_t *ws)
{
    if (!ws) return;
    for (int i = 0; i < 2; i++) {
        tk_nstr_free(&ws->t[i]);
        free(ws->sl[i].v);
    }
    tk_nstr_free(&ws->n1);
    tk_nstr_free(&ws->n3);
    free(ws->mt.v);
    free(ws->mt2.v);
    free(ws->mt3.v);
    if (ws->md) pcre2_match_data_free(ws->md);
    if (ws->mctx) pcre2_match_context_free(ws->mctx);
    if (ws->jst) pcre2_jit_stack_free(ws->jst);
    free(ws->sym);
    free(ws->heap);
    tk_buf_free(&ws->tmp);
    tk_buf_free(&ws->tmp2);
    free(ws->cache);
    tk_buf_free(&ws->cache_arena);
    free(ws->ids);
    free(ws->pp_ids[0]);
    free(ws->pp_ids[1]);
    free(ws);
}

/* ---------------------------------------------------------------- small helpers */

static int s_sp_add(tk_splits_t *l, size_t off, size_t len, int32_t id)
{
    if (l->n == l->cap && strata_grow(&l->v, &l->cap, l->n, sizeof *l->v, 64)) return STRATA_ENOMEM;
    l->v[l->n++] = (tk_split_t){(uint32_t)off, (uint32_t)len, id};
    return 0;
}

static int s_push_id(tk_ws_t *ws, int32_t id)
{
    if (ws->nids == ws->ids_cap && strata_grow(&ws->ids, &ws->ids_cap, ws->nids, sizeof *ws->ids, 256))
        return STRATA_ENOMEM;
    ws->ids[ws->nids++] = id;
    return 0;
}

/* Append text (and alignment) to a text buffer. al NULL: every byte aligned to a. */
static int s_text_put(tk_nstr_t *t, const char *p, size_t n, const uint32_t *al, uint32_t a)
{
    int rc = tk_nstr_reserve(t, n);
    if (rc) return rc;
    memcpy(t->s.p + t->s.n, p, n);
    if (t->track) {
        if (al) memcpy(t->al + t->s.n, al, n * sizeof *al);
        else
            for (size_t i = 0; i < n; i++) t->al[t->s.n + i] = a;
    }
    t->s.n += n;
    t->s.p[t->s.n] = 0;
    return 0;
}

/* Begin writing the next text / split list. */
static tk_nstr_t *s_next_text(tk_ws_t *ws)
{
    tk_nstr_t *t = &ws->t[!ws->ti];
    t->s.n = 0;
    t->track = ws->t[ws->ti].track;
    t->base = 0;
    return t;
}

static tk_splits_t *s_next_splits(tk_ws_t *ws)
{
    tk_splits_t *l = &ws->sl[!ws->si];
    l->n = 0;
    return l;
}

static uint32_t s_last_cp(const char *s, size_t end)
{
    size_t k = end - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    int l;
    return tk_utf8_dec((const unsigned char *)s + k, end - k, &l);
}

/* ---------------------------------------------------------------- added tokens */

/* Longest pattern of tr that starts at p; returns its id (or -1) and its length. */
static int32_t s_trie_longest(const tk_trie_t *tr, const unsigned char *p, size_t n, size_t *mlen)
{
    int32_t node = tr->root[p[0]], best = -1;
    size_t j = 1;
    while (node >= 0) {
        if (tr->node[node].term >= 0) {
            best = tr->node[node].term;
            *mlen = j;
        }
        if (j >= n) break;
        int32_t c = tr->node[node].child;
        while (c >= 0 && tr->node[c].byte != p[j]) c = tr->node[c].sib;
        node = c;
        j++;
    }
    return best;
}

/* AddedVocabulary::find_matches on the sentence s[0..n) at offset base of the current text:
 * appends the splits (token or plain text) to out. Like the Aho-Corasick iterator, a match
 * that is discarded (single_word) still consumes its bytes. */
static int s_added_find(const tok_t *tok, const tk_trie_t *tr, const char *s, size_t n, size_t base,
                        tk_splits_t *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t start_offset = 0, i = 0;
    size_t next[4] = {0, 0, 0, 0}; /* next occurrence of each first byte at or after i */
    bool few = tr->nfirst <= 4;
    for (int k = 0; few && k < tr->nfirst; k++) {
        const unsigned char *f = memchr(u, tr->firsts[k], n);
        next[k] = f ? (size_t)(f - u) : SIZE_MAX;
    }
    while (i < n) {
        if (!tr->first[u[i]]) { /* skip to the next byte that can start a pattern */
            if (few) {
                size_t best = SIZE_MAX;
                for (int k = 0; k < tr->nfirst; k++) {
                    if (next[k] < i) {
                        const unsigned char *f = memchr(u + i, tr->firsts[k], n - i);
                        next[k] = f ? (size_t)(f - u) : SIZE_MAX;
                    }
                    if (next[k] < best) best = next[k];
                }
                if (best == SIZE_MAX) break;
                i = best;
            } else {
                while (i < n && !tr->first[u[i]]) i++;
                if (i == n) break;
            }
        }
        size_t ml = 0;
        int32_t id = s_trie_longest(tr, u + i, n - i, &ml);
        if (id < 0) {
            i++;
            continue;
        }
        size_t start = i, stop = i + ml;
        i = stop;
        const tk_added_t *t = &tok->byid[tok->id_added[id]];
        if (t->single_word) {
            bool start_space = start == 0 || !tk_is_word(s_last_cp(s, start));
            bool stop_space = true;
            if (stop < n) {
                int l;
                stop_space = !tk_is_word(tk_utf8_dec(u + stop, n - stop, &l));
            }
            if (!start_space || !stop_space) continue;
        }
        if (t->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t k = ns - 1;
                while (k > 0 && (u[k] & 0xC0) == 0x80) k--;
                int l;
                if (!tk_is_whitespace(tk_utf8_dec(u + k, ns - k, &l))) break;
                ns = k;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (t->rstrip) {
            while (stop < n) {
                int l;
                if (!tk_is_whitespace(tk_utf8_dec(u + stop, n - stop, &l))) break;
                stop += (size_t)l;
            }
        }
        if (start_offset < start && s_sp_add(out, base + start_offset, start - start_offset, -1)) return STRATA_ENOMEM;
        if (s_sp_add(out, base + start, stop - start, id)) return STRATA_ENOMEM;
        start_offset = stop;
    }
    if (start_offset < n && s_sp_add(out, base + start_offset, n - start_offset, -1)) return STRATA_ENOMEM;
    return 0;
}

static int s_stage_added_raw(const tok_t *tok, tk_ws_t *ws)
{
    const tk_nstr_t *t = &ws->t[ws->ti];
    const tk_splits_t *in = &ws->sl[ws->si];
    tk_splits_t *out = s_next_splits(ws);
    for (size_t k = 0; k < in->n; k++) {
        tk_split_t sp = in->v[k];
        int rc = sp.id >= 0 ? s_sp_add(out, sp.off, sp.len, sp.id)
                            : s_added_find(tok, &tok->trie_raw, t->s.p + sp.off, sp.len, sp.off, out);
        if (rc) return rc;
    }
    ws->si = !ws->si;
    return 0;
}

/* Whether the normalizer chain leaves s unchanged for sure (NFC and friends on text whose
 * chars are all below tok->norm_stable_below). */
static bool s_norm_noop(const tok_t *tok, const char *s, size_t n)
{
    if (!tok->nnorm) return true;
    if (!tok->norm_unicode_only) return false;
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i += tk_ascii_prefix(u + i, n - i);
            continue;
        }
        int l;
        if (tk_utf8_dec(u + i, n - i, &l) >= tok->norm_stable_below) return false;
        i += (size_t)l;
    }
    return true;
}

/* Normalize every text split, then cut out the normalized added tokens. */
static int s_stage_normalize(const tok_t *tok, tk_ws_t *ws)
{
    {
        /* fast path: nothing to normalize, only (maybe) normalized added tokens to find */
        const tk_nstr_t *t = &ws->t[ws->ti];
        const tk_splits_t *in = &ws->sl[ws->si];
        bool noop = true;
        for (size_t k = 0; noop && k < in->n; k++)
            if (in->v[k].id < 0) noop = s_norm_noop(tok, t->s.p + in->v[k].off, in->v[k].len);
        if (noop) {
            if (!tok->trie_norm.nnode) return 0;
            tk_splits_t *out = s_next_splits(ws);
            for (size_t k = 0; k < in->n; k++) {
                tk_split_t sp = in->v[k];
                int rc = sp.id >= 0 ? s_sp_add(out, sp.off, sp.len, sp.id)
                                    : s_added_find(tok, &tok->trie_norm, t->s.p + sp.off, sp.len, sp.off, out);
                if (rc) return rc;
            }
            ws->si = !ws->si;
            return 0;
        }
    }
    const tk_nstr_t *t = &ws->t[ws->ti];
    const tk_splits_t *in = &ws->sl[ws->si];
    tk_nstr_t *t2 = s_next_text(ws);
    tk_splits_t *out = s_next_splits(ws);
    tk_nstr_t *ns = &ws->n1;
    for (size_t k = 0; k < in->n; k++) {
        tk_split_t sp = in->v[k];
        int rc;
        if (sp.id >= 0) {
            if ((rc = s_sp_add(out, 0, 0, sp.id))) return rc;
            continue;
        }
        ns->s.n = 0;
        ns->track = t->track;
        ns->base = t->track ? t->al[sp.off] : 0;
        if ((rc = s_text_put(ns, t->s.p + sp.off, sp.len, t->track ? t->al + sp.off : NULL, 0))) return rc;
        if ((rc = tk_normalize(tok, ws, ns))) return rc;
        size_t off = t2->s.n;
        if ((rc = s_text_put(t2, ns->s.p, ns->s.n, ns->track ? ns->al : NULL, 0))) return rc;
        if (tok->trie_norm.nnode) rc = s_added_find(tok, &tok->trie_norm, t2->s.p + off, ns->s.n, off, out);
        else if (ns->s.n) rc = s_sp_add(out, off, ns->s.n, -1);
        if (rc) return rc;
    }
    ws->ti = !ws->ti;
    ws->si = !ws->si;
    return 0;
}

/* ---------------------------------------------------------------- splitting */

/* NormalizedString::split: turn a find_matches cover of the piece at base into splits. */
static int s_split_by(tk_ws_t *ws, tk_splits_t *out, size_t base, const tk_matches_t *mt, int behavior)
{
    tk_matches_t *acc = &ws->mt2; /* m = keep */
    acc->n = 0;
    bool prev = false;
    switch (behavior) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < mt->n; i++) {
            tk_match_t m = mt->v[i];
            if (m.e > m.s && s_sp_add(out, base + m.s, m.e - m.s, -1)) return STRATA_ENOMEM;
        }
        return 0;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < mt->n; i++)
            if (tk_mt_push(acc, mt->v[i].s, mt->v[i].e, !mt->v[i].m)) return STRATA_ENOMEM;
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < mt->n; i++) {
            tk_match_t m = mt->v[i];
            if (m.m == prev && acc->n) acc->v[acc->n - 1].e = m.e;
            else if (tk_mt_push(acc, m.s, m.e, true)) return STRATA_ENOMEM;
            prev = m.m;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < mt->n; i++) {
            tk_match_t m = mt->v[i];
            if (m.m && !prev && acc->n) acc->v[acc->n - 1].e = m.e;
            else if (tk_mt_push(acc, m.s, m.e, true)) return STRATA_ENOMEM;
            prev = m.m;
        }
        break;
    case SPLIT_MERGED_NEXT:
        for (size_t i = mt->n; i-- > 0;) {
            tk_match_t m = mt->v[i];
            if (m.m && !prev && acc->n) acc->v[acc->n - 1].s = m.s;
            else if (tk_mt_push(acc, m.s, m.e, true)) return STRATA_ENOMEM;
            prev = m.m;
        }
        for (size_t i = 0, j = acc->n ? acc->n - 1 : 0; i < j; i++, j--) {
            tk_match_t x = acc->v[i];
            acc->v[i] = acc->v[j];
            acc->v[j] = x;
        }
        break;
    }
    for (size_t i = 0; i < acc->n; i++) {
        tk_match_t m = acc->v[i];
        if (m.m && m.e > m.s && s_sp_add(out, base + m.s, m.e - m.s, -1)) return STRATA_ENOMEM;
    }
    return 0;
}

typedef bool (*s_pred_fn)(uint32_t cp, uint32_t arg);

static bool s_pred_eq(uint32_t cp, uint32_t arg) { return cp == arg; }
static bool s_pred_ws(uint32_t cp, uint32_t arg) { (void)arg; return tk_is_whitespace(cp); }
static bool s_pred_num(uint32_t cp, uint32_t arg) { (void)arg; return tk_is_numeric(cp); }
static bool s_pred_punct(uint32_t cp, uint32_t arg) { (void)arg; return tk_is_punct(cp); }

/* ASCII answers of the predicates (pred_eq has none). */
static uint8_t s_tab_ws[128], s_tab_num[128], s_tab_punct[128];
static pthread_once_t s_tab_once = PTHREAD_ONCE_INIT;

static void s_tab_init(void)
{
    for (uint32_t c = 0; c < 128; c++) {
        s_tab_ws[c] = tk_is_whitespace(c);
        s_tab_num[c] = tk_is_numeric(c);
        s_tab_punct[c] = tk_is_punct(c);
    }
}

/* find_matches of a char predicate: each matching char is one match. tab: the predicate on
 * ASCII, or NULL. */
static int s_char_matches(const char *s, size_t n, s_pred_fn pred, uint32_t arg, const uint8_t *tab,
                          tk_matches_t *mt)
{
    mt->n = 0;
    if (!n) return tk_mt_push(mt, 0, 0, false);
    const unsigned char *u = (const unsigned char *)s;
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        if (tab && u[i] < 0x80 && !tab[u[i]]) {
            i++;
            continue;
        }
        int l = 1;
        uint32_t cp = u[i] < 0x80 ? u[i] : tk_utf8_dec(u + i, n - i, &l);
        if (tab && cp < 0x80 ? tab[cp] : pred(cp, arg)) {
            if (last < i && tk_mt_push(mt, (uint32_t)last, (uint32_t)i, false)) return STRATA_ENOMEM;
            if (tk_mt_push(mt, (uint32_t)i, (uint32_t)(i + (size_t)l), true)) return STRATA_ENOMEM;
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (n > last && tk_mt_push(mt, (uint32_t)last, (uint32_t)n, false)) return STRATA_ENOMEM;
    return 0;
}

/* The Whitespace pre-tokenizer: Rust regex \w+|[^\w\s]+, keeping the matches. */
static int s_whitespace_pieces(const char *s, size_t n, size_t base, tk_splits_t *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l;
        uint32_t cp = tk_utf8_dec(u + i, n - i, &l);
        int cls = tk_is_word(cp) ? 1 : tk_is_whitespace(cp) ? 0 : 2;
        if (!cls) {
            i += (size_t)l;
            continue;
        }
        size_t j = i + (size_t)l;
        while (j < n) {
            uint32_t c2 = tk_utf8_dec(u + j, n - j, &l);
            int k2 = tk_is_word(c2) ? 1 : tk_is_whitespace(c2) ? 0 : 2;
            if (k2 != cls) break;
            j += (size_t)l;
        }
        if (s_sp_add(out, base + i, j - i, -1)) return STRATA_ENOMEM;
        i = j;
    }
    return 0;
}

/* Pre-tokenizers that only split (no text change). */
static int s_stage_split(const tok_t *tok, tk_ws_t *ws, const tk_pt_t *pt)
{
    const tk_nstr_t *t = &ws->t[ws->ti];
    const tk_splits_t *in = &ws->sl[ws->si];
    tk_splits_t *out = s_next_splits(ws);
    for (size_t k = 0; k < in->n; k++) {
        tk_split_t sp = in->v[k];
        int rc = 0;
        if (sp.id >= 0) {
            if ((rc = s_sp_add(out, sp.off, sp.len, sp.id))) return rc;
            continue;
        }
        const char *s = t->s.p + sp.off;
        switch (pt->kind) {
        case PT_SPLIT:
            if ((rc = tk_re_find_matches(ws, &pt->re, s, sp.len, &ws->mt))) return rc;
            if (pt->invert)
                for (size_t i = 0; i < ws->mt.n; i++) ws->mt.v[i].m = !ws->mt.v[i].m;
            rc = s_split_by(ws, out, sp.off, &ws->mt, pt->behavior);
            break;
        case PT_DIGITS:
            if ((rc = s_char_matches(s, sp.len, s_pred_num, 0, s_tab_num, &ws->mt))) return rc;
            rc = s_split_by(ws, out, sp.off, &ws->mt, pt->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS);
            break;
        case PT_WHITESPACE: rc = s_whitespace_pieces(s, sp.len, sp.off, out); break;
        case PT_WHITESPACE_SPLIT:
            if ((rc = s_char_matches(s, sp.len, s_pred_ws, 0, s_tab_ws, &ws->mt))) return rc;
            rc = s_split_by(ws, out, sp.off, &ws->mt, SPLIT_REMOVED);
            break;
        case PT_PUNCTUATION:
            if ((rc = s_char_matches(s, sp.len, s_pred_punct, 0, s_tab_punct, &ws->mt))) return rc;
            rc = s_split_by(ws, out, sp.off, &ws->mt, pt->behavior);
            break;
        case PT_CHAR_DELIMITER:
            if ((rc = s_char_matches(s, sp.len, s_pred_eq, pt->repl_cp, NULL, &ws->mt))) return rc;
            rc = s_split_by(ws, out, sp.off, &ws->mt, SPLIT_REMOVED);
            break;
        case PT_BERT: {
            /* whitespace (removed), then punctuation (isolated) in each piece */
            if ((rc = s_char_matches(s, sp.len, s_pred_ws, 0, s_tab_ws, &ws->mt))) return rc;
            for (size_t i = 0; i < ws->mt.n; i++) {
                tk_match_t m = ws->mt.v[i];
                if (m.m || m.e == m.s) continue;
                rc = s_char_matches(s + m.s, m.e - m.s, s_pred_punct, 0, s_tab_punct, &ws->mt3);
                if (!rc) rc = s_split_by(ws, out, sp.off + m.s, &ws->mt3, SPLIT_ISOLATED);
                if (rc) return rc;
            }
            break;
        }
        default: break;
        }
        if (rc) return rc;
    }
    ws->si = !ws->si;
    return 0;
}

/* Append the byte-level form of ns[s, e) to t2 as one split. */
static int s_put_bytelevel(tk_nstr_t *t2, tk_splits_t *out, const tk_nstr_t *ns, size_t s, size_t e)
{
    size_t off = t2->s.n;
    int rc = tk_nstr_reserve(t2, 2 * (e - s));
    if (rc) return rc;
    unsigned char *o = (unsigned char *)t2->s.p + t2->s.n;
    const unsigned char *p = (const unsigned char *)ns->s.p;
    size_t w = 0;
    for (size_t i = s; i < e; i++) {
        uint32_t cp = tk_byte_cp[p[i]];
        if (t2->track) {
            t2->al[t2->s.n + w] = ns->al[i];
            if (cp >= 0x80) t2->al[t2->s.n + w + 1] = ns->al[i];
        }
        if (cp < 0x80) {
            o[w++] = (unsigned char)cp;
        } else {
            o[w++] = (unsigned char)(0xC0 | (cp >> 6));
            o[w++] = (unsigned char)(0x80 | (cp & 0x3F));
        }
    }
    t2->s.n += w;
    t2->s.p[t2->s.n] = 0;
    return s_sp_add(out, off, w, -1);
}

/* ByteLevel: optional prefix space, the GPT-2 regex (Isolated), then bytes -> chars. When it
 * is the last pre-tokenizer (tok->bl_last) the pieces stay raw bytes and BPE maps them. */
static int s_stage_bytelevel(const tok_t *tok, tk_ws_t *ws, const tk_pt_t *pt)
{
    const tk_nstr_t *t = &ws->t[ws->ti];
    const tk_splits_t *in = &ws->sl[ws->si];
    bool raw = tok->bl_last && pt == &tok->pt[tok->npt - 1];
    bool prefix = pt->add_prefix_space;
    bool copy = !raw || prefix;
    tk_nstr_t *t2 = copy ? s_next_text(ws) : NULL;
    tk_splits_t *out = s_next_splits(ws);
    tk_nstr_t *ns = &ws->n1;
    for (size_t k = 0; k < in->n; k++) {
        tk_split_t sp = in->v[k];
        int rc;
        if (sp.id >= 0) {
            if ((rc = s_sp_add(out, 0, 0, sp.id))) return rc;
            continue;
        }
        const char *s = t->s.p + sp.off;
        size_t n = sp.len, base = sp.off;
        if (copy) {
            ns->s.n = 0;
            ns->track = t->track;
            const uint32_t *al = t->track ? t->al + sp.off : NULL;
            if (prefix && s[0] != ' ' && (rc = s_text_put(ns, " ", 1, NULL, al ? al[0] : 0))) return rc;
            if ((rc = s_text_put(ns, s, n, al, 0))) return rc;
            s = ns->s.p;
            n = ns->s.n;
        }
        if (raw && copy) { /* raw bytes with the prefix: into the next text as they are */
            base = t2->s.n;
            if ((rc = s_text_put(t2, s, n, ns->track ? ns->al : NULL, 0))) return rc;
            s = t2->s.p + base;
        }
        if (!pt->use_regex) {
            rc = raw ? s_sp_add(out, base, n, -1) : s_put_bytelevel(t2, out, ns, 0, n);
            if (rc) return rc;
            continue;
        }
        if ((rc = tk_re_find_matches(ws, &tok->re_bytelevel, s, n, &ws->mt))) return rc;
        for (size_t i = 0; i < ws->mt.n; i++) {
            tk_match_t m = ws->mt.v[i];
            if (m.e <= m.s) continue;
            rc = raw ? s_sp_add(out, base + m.s, m.e - m.s, -1) : s_put_bytelevel(t2, out, ns, m.s, m.e);
            if (rc) return rc;
        }
    }
    if (copy) ws->ti = !ws->ti;
    ws->si = !ws->si;
    ws->raw_bytes = raw;
    return 0;
}

/* Metaspace: ' ' -> replacement, prepend by scheme, split before each replacement char
 * (MergedWithNext on single-char matches is exactly "a piece starts at each one"). */
static int s_stage_metaspace(const tok_t *tok, tk_ws_t *ws, const tk_pt_t *pt)
{
    (void)tok;
    const tk_nstr_t *t = &ws->t[ws->ti];
    const tk_splits_t *in = &ws->sl[ws->si];
    tk_nstr_t *t2 = s_next_text(ws);
    tk_splits_t *out = s_next_splits(ws);
    const size_t rn = (size_t)pt->repl_n;
    for (size_t k = 0; k < in->n; k++) {
        tk_split_t sp = in->v[k];
        int rc;
        if (sp.id >= 0) {
            if ((rc = s_sp_add(out, 0, 0, sp.id))) return rc;
            continue;
        }
        const char *s = t->s.p + sp.off;
        const uint32_t *al = t->track ? t->al + sp.off : NULL;
        bool starts_repl = s[0] == ' ' || (sp.len >= rn && !memcmp(s, pt->repl, rn));
        bool prepend = !starts_repl && (pt->prepend_scheme == PREPEND_ALWAYS ||
                                        (pt->prepend_scheme == PREPEND_FIRST && al && al[0] == 0));
        size_t off = t2->s.n;
        if ((rc = tk_nstr_reserve(t2, sp.len * rn + rn))) return rc;
        /* room is reserved: write directly */
        char *o = t2->s.p;
        uint32_t *oal = t2->track ? t2->al : NULL;
        size_t w = off;
        if (prepend) {
            memcpy(o + w, pt->repl, rn);
            if (oal)
                for (size_t k2 = 0; k2 < rn; k2++) oal[w + k2] = al[0];
            w += rn;
        }
        size_t run = 0;
        while (run <= sp.len) {
            const char *sp_at = run < sp.len ? memchr(s + run, ' ', sp.len - run) : NULL;
            size_t i = sp_at ? (size_t)(sp_at - s) : sp.len;
            memcpy(o + w, s + run, i - run);
            if (oal) memcpy(oal + w, al + run, (i - run) * sizeof *oal);
            w += i - run;
            if (i == sp.len) break;
            memcpy(o + w, pt->repl, rn);
            if (oal)
                for (size_t k2 = 0; k2 < rn; k2++) oal[w + k2] = al[i];
            w += rn;
            run = i + 1;
        }
        t2->s.n = w;
        o[w] = 0;
        size_t end = w;
        if (!pt->split) {
            if ((rc = s_sp_add(out, off, end - off, -1))) return rc;
            continue;
        }
        size_t start = off;
        for (size_t i = off + 1; i + rn <= end; i++) {
            if (o[i] != pt->repl[0] || memcmp(o + i, pt->repl, rn)) continue;
            if ((rc = s_sp_add(out, start, i - start, -1))) return rc;
            start = i;
            i += rn - 1;
        }
        if ((rc = s_sp_add(out, start, end - start, -1))) return rc;
    }
    ws->ti = !ws->ti;
    ws->si = !ws->si;
    return 0;
}

/* ---------------------------------------------------------------- BPE */

static inline bool s_same(const char *a, const char *b, size_t n)
{
    if (n > 16) return !memcmp(a, b, n);
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static int s_cache_get(tk_ws_t *ws, uint64_t h, const char *p, size_t n)
{
    if (!ws->cache) return 0;
    uint32_t mask = TK_CACHE_CAP - 1, i = (uint32_t)h & mask;
    for (;;) {
        const tk_cache_ent_t *e = &ws->cache[i];
        if (!e->h) return 0;
        if (e->h == h && e->klen == n && s_same(n <= 16 ? e->key : ws->cache_arena.p + e->koff, p, n)) {
            if (e->nids == 1) return s_push_id(ws, e->id0) ? STRATA_ENOMEM : 1;
            const char *v = ws->cache_arena.p + e->voff;
            if (ws->nids + e->nids > ws->ids_cap) {
                size_t c = ws->ids_cap ? ws->ids_cap : 256;
                while (c < ws->nids + e->nids) c *= 2;
                int32_t *nv = realloc(ws->ids, c * sizeof *nv);
                if (!nv) return STRATA_ENOMEM;
                ws->ids = nv;
                ws->ids_cap = c;
            }
            memcpy(ws->ids + ws->nids, v, (size_t)e->nids * 4);
            ws->nids += e->nids;
            return 1;
        }
        i = (i + 1) & mask;
    }
}

static void s_cache_put(tk_ws_t *ws, uint64_t h, const char *p, size_t n, const int32_t *ids, size_t nids)
{
    if (nids > UINT16_MAX) return;
    if (!ws->cache) {
        ws->cache = calloc(TK_CACHE_CAP, sizeof *ws->cache);
        if (!ws->cache) return;
    }
    if (ws->cache_n * 2 >= TK_CACHE_CAP || ws->cache_arena.n > (64u << 20)) {
        memset(ws->cache, 0, TK_CACHE_CAP * sizeof *ws->cache);
        ws->cache_n = 0;
        ws->cache_arena.n = 0;
    }
    tk_cache_ent_t e = {.h = h, .klen = (uint16_t)n, .nids = (uint16_t)nids, .id0 = nids ? ids[0] : -1};
    if (n <= 16) {
        memcpy(e.key, p, n);
    } else {
        e.koff = (uint32_t)ws->cache_arena.n;
        if (tk_buf_put(&ws->cache_arena, p, n)) return;
    }
    if (nids > 1) {
        size_t pad = (4 - ws->cache_arena.n % 4) % 4;
        if (tk_buf_put(&ws->cache_arena, "\0\0\0", pad)) return;
        e.voff = (uint32_t)ws->cache_arena.n;
        if (tk_buf_put(&ws->cache_arena, ids, nids * 4)) return;
    }
    uint32_t mask = TK_CACHE_CAP - 1, i = (uint32_t)h & mask;
    while (ws->cache[i].h) i = (i + 1) & mask;
    ws->cache[i] = e;
    ws->cache_n++;
}

static int s_sym_add(tk_ws_t *ws, size_t *nsym, int32_t id, uint32_t len)
{
    if (*nsym == ws->nsym_cap && strata_grow(&ws->sym, &ws->nsym_cap, *nsym, sizeof *ws->sym, 256))
        return STRATA_ENOMEM;
    size_t i = (*nsym)++;
    ws->sym[i] = (struct tk_sym){id, (int32_t)i - 1, (int32_t)i + 1, len};
    return 0;
}

static inline bool s_heap_less(const struct tk_heap *a, const struct tk_heap *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int s_heap_push(tk_ws_t *ws, size_t *hn, uint32_t rank, uint32_t pos, int32_t new_id)
{
    if (*hn == ws->heap_cap && strata_grow(&ws->heap, &ws->heap_cap, *hn, sizeof *ws->heap, 256)) return STRATA_ENOMEM;
    struct tk_heap *h = ws->heap, x = {rank, pos, new_id};
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!s_heap_less(&x, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
    return 0;
}

static struct tk_heap s_heap_pop(tk_ws_t *ws, size_t *hn)
{
    struct tk_heap *h = ws->heap, top = h[0], x = h[--*hn];
    size_t n = *hn, i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && s_heap_less(&h[c + 1], &h[c])) c++;
        if (!s_heap_less(&h[c], &x)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = x;
    return top;
}

/* Word::merge_all: repeatedly apply the lowest-ranked merge, leftmost first. */
static int s_merge_all(const tk_bpe_t *m, tk_ws_t *ws, size_t nsym)
{
    struct tk_sym *sy = ws->sym;
    if (nsym) sy[nsym - 1].next = -1;
    size_t hn = 0;
    uint32_t rank;
    int32_t nid;
    for (size_t i = 0; i + 1 < nsym; i++)
        if (tk_pair_get(&m->merges, sy[i].id, sy[i + 1].id, &rank, &nid) &&
            s_heap_push(ws, &hn, rank, (uint32_t)i, nid))
            return STRATA_ENOMEM;
    while (hn) {
        struct tk_heap top = s_heap_pop(ws, &hn);
        struct tk_sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int32_t np = cur->next;
        struct tk_sym right = sy[np];
        if (!tk_pair_get(&m->merges, cur->id, right.id, &rank, &nid) || nid != top.new_id) continue;
        cur->id = top.new_id;
        cur->len += right.len;
        cur->next = right.next;
        sy[np].len = 0;
        if (right.next >= 0 && (size_t)right.next < nsym) sy[right.next].prev = (int32_t)top.pos;
        if (cur->prev >= 0 && tk_pair_get(&m->merges, sy[cur->prev].id, cur->id, &rank, &nid) &&
            s_heap_push(ws, &hn, rank, (uint32_t)cur->prev, nid))
            return STRATA_ENOMEM;
        if (cur->next >= 0 && (size_t)cur->next < nsym &&
            tk_pair_get(&m->merges, cur->id, sy[cur->next].id, &rank, &nid) &&
            s_heap_push(ws, &hn, rank, top.pos, nid))
            return STRATA_ENOMEM;
    }
    return 0;
}

/* Append the byte-level form of raw bytes to out. */
static int s_map_bytes(tk_buf_t *out, const char *p, size_t n)
{
    out->n = 0;
    if (tk_buf_reserve(out, 2 * n)) return STRATA_ENOMEM;
    unsigned char *o = (unsigned char *)out->p;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = tk_byte_cp[(unsigned char)p[i]];
        if (cp < 0x80) {
            o[out->n++] = (unsigned char)cp;
        } else {
            o[out->n++] = (unsigned char)(0xC0 | (cp >> 6));
            o[out->n++] = (unsigned char)(0x80 | (cp & 0x3F));
        }
    }
    out->p[out->n] = 0;
    return 0;
}

/* merge_all for a short word, then its ids appended to ws->ids. The same result as the heap:
 * symbols only ever absorb their right neighbour, so a heap entry that is still valid always
 * describes the pair now at its position, and the heap's order (rank, then position) is the
 * lowest rank, leftmost first, which a scan over the pairs finds directly. */
static int s_merge_small(const tk_bpe_t *m, tk_ws_t *ws, size_t n)
{
    int32_t id[48], nid[48];
    uint32_t rk[48];
    for (size_t i = 0; i < n; i++) id[i] = ws->sym[i].id;
    for (size_t i = 0; i + 1 < n; i++)
        if (!tk_pair_get(&m->merges, id[i], id[i + 1], &rk[i], &nid[i])) rk[i] = UINT32_MAX;
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rk[i] < rk[best]) best = i;
        if (rk[best] == UINT32_MAX) break;
        id[best] = nid[best];
        for (size_t i = best + 1; i + 1 < n; i++) {
            id[i] = id[i + 1];
            rk[i] = rk[i + 1];
            nid[i] = nid[i + 1];
        }
        n--;
        if (best > 0 && !tk_pair_get(&m->merges, id[best - 1], id[best], &rk[best - 1], &nid[best - 1]))
            rk[best - 1] = UINT32_MAX;
        if (best + 1 < n && !tk_pair_get(&m->merges, id[best], id[best + 1], &rk[best], &nid[best]))
            rk[best] = UINT32_MAX;
    }
    if (ws->nids + n > ws->ids_cap) {
        size_t c = ws->ids_cap ? ws->ids_cap : 256;
        while (c < ws->nids + n) c *= 2;
        int32_t *v = realloc(ws->ids, c * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        ws->ids = v;
        ws->ids_cap = c;
    }
    memcpy(ws->ids + ws->nids, id, n * sizeof *id);
    ws->nids += n;
    return 0;
}

/* BPE::merge_word + word_to_tokens of one piece (no cache); appends ids to ws->ids.
 * raw: p holds raw bytes whose byte-level chars are the symbols. */
static int s_bpe_word(const tok_t *tok, tk_ws_t *ws, const char *p, size_t n, bool raw)
{
    const tk_bpe_t *m = &tok->bpe;
    size_t nsym = 0;
    bool special_syms = false; /* unk or byte-fallback symbols: their strings are not the text */
    int rc;
    if (raw) {
        bool all = true;
        for (size_t i = 0; i < n && all; i++) all = m->byte_sym[(unsigned char)p[i]] >= 0;
        if (all) {
            for (size_t i = 0; i < n; i++)
                if ((rc = s_sym_add(ws, &nsym, m->byte_sym[(unsigned char)p[i]], 1))) return rc;
            goto merge;
        }
        if ((rc = s_map_bytes(&ws->tmp2, p, n))) return rc; /* a char missing: the general path */
        p = ws->tmp2.p;
        n = ws->tmp2.n;
    }
    const unsigned char *u = (const unsigned char *)p;
    bool have_unk = false;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < n;) {
        int l;
        uint32_t cp = tk_utf8_dec(u + i, n - i, &l);
        bool first = i == 0, last = i + (size_t)l == n;
        bool plain = (first || !m->prefix) && (!last || !m->suffix);
        int32_t id = -1;
        const char *key = p + i;
        size_t keyn = (size_t)l;
        if (plain && cp < TK_CP_FAST) {
            id = m->cp_id[cp];
        } else {
            if (!plain) {
                ws->tmp.n = 0;
                if ((!first && m->prefix && tk_buf_put(&ws->tmp, m->prefix, m->prefix_n)) ||
                    tk_buf_put(&ws->tmp, p + i, (size_t)l) ||
                    (last && m->suffix && tk_buf_put(&ws->tmp, m->suffix, m->suffix_n)))
                    return STRATA_ENOMEM;
                key = ws->tmp.p;
                keyn = ws->tmp.n;
            }
            id = tk_map_get(&m->vocab, key, keyn, -1);
        }
        if (id >= 0) {
            if (have_unk && (rc = s_sym_add(ws, &nsym, m->unk_id, unk_len))) return rc;
            have_unk = false;
            if ((rc = s_sym_add(ws, &nsym, id, (uint32_t)l))) return rc;
            i += (size_t)l;
            continue;
        }
        if (m->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < keyn; j++)
                if (m->byte_id[(unsigned char)key[j]] < 0) all = false;
            if (all) {
                special_syms = true;
                /* the pending unk (if any) stays pending, as in tokenizers */
                for (size_t j = 0; j < keyn; j++)
                    if ((rc = s_sym_add(ws, &nsym, m->byte_id[(unsigned char)key[j]], 1))) return rc;
                i += (size_t)l;
                continue;
            }
        }
        if (m->unk_id == -2) return STRATA_EINVAL_INPUT; /* unk_token not in the vocab */
        if (m->unk_id >= 0) {
            special_syms = true;
            if (have_unk && m->fuse_unk) {
                unk_len += (uint32_t)l;
            } else {
                if (have_unk && (rc = s_sym_add(ws, &nsym, m->unk_id, unk_len))) return rc;
                have_unk = true;
                unk_len = (uint32_t)l;
            }
        }
        i += (size_t)l;
    }
    if (have_unk && (rc = s_sym_add(ws, &nsym, m->unk_id, unk_len))) return rc;
merge:
    if (nsym <= 48 && !special_syms) return s_merge_small(m, ws, nsym);
    if ((rc = s_merge_all(m, ws, nsym))) return rc;
    for (size_t i = 0; i < nsym; i++)
        if (ws->sym[i].len && (rc = s_push_id(ws, ws->sym[i].id))) return rc;
    return 0;
}

/* s_bpe_word behind the piece cache; with check_vocab, the ignore_merges lookup of the whole
 * piece runs first on a miss (its result is cached too). */
static int s_bpe_cached(const tok_t *tok, tk_ws_t *ws, const char *p, size_t n, bool raw, bool check_vocab)
{
    uint64_t h = 0;
    if (n < TK_CACHE_MAX_KEY) {
        h = tk_hash64(p, n);
        int r = s_cache_get(ws, h, p, n);
        if (r) return r < 0 ? r : 0;
    }
    size_t first = ws->nids;
    int rc = 0;
    int32_t id = -1;
    if (check_vocab) {
        const char *k = p;
        size_t kn = n;
        if (raw) {
            if (s_map_bytes(&ws->tmp2, p, n)) return STRATA_ENOMEM;
            k = ws->tmp2.p;
            kn = ws->tmp2.n;
        }
        id = tk_map_get(&tok->bpe.vocab, k, kn, -1);
    }
    rc = id >= 0 ? s_push_id(ws, id) : s_bpe_word(tok, ws, p, n, raw);
    if (!rc && n < TK_CACHE_MAX_KEY) s_cache_put(ws, h, p, n, ws->ids + first, ws->nids - first);
    return rc;
}

/* The next char of a piece for chunking: its code point and whether it is a one-char token. */
static inline uint32_t s_chunk_char(const tk_bpe_t *m, const unsigned char *u, size_t n, bool raw, int *len,
                                    bool *known)
{
    if (raw) {
        *len = 1;
        *known = m->byte_sym[u[0]] >= 0;
        return tk_byte_cp[u[0]];
    }
    uint32_t cp = tk_utf8_dec(u, n, len);
    *known = cp < TK_CP_FAST ? m->cp_id[cp] >= 0 : tk_map_find(&m->vocab, (const char *)u, (size_t)*len) >= 0;
    return cp;
}

/* BPE::tokenize of one piece; appends ids to ws->ids. A long piece is cut where no merge can
 * cross (see tk_bpe_t.joinable) and the parts go through the cache one by one. */
static int s_bpe(const tok_t *tok, tk_ws_t *ws, const char *p, size_t n, bool raw)
{
    const tk_bpe_t *m = &tok->bpe;
    if (!n) return 0;
    bool chunk = m->can_chunk && n > 32;
    /* Chunks are pure BPE: when they may share the cache with whole pieces, the whole-piece
     * vocab lookup of ignore_merges stays out of the cache. */
    if (m->ignore_merges && m->can_chunk) {
        const char *k = p;
        size_t kn = n;
        if (raw) {
            if (s_map_bytes(&ws->tmp2, p, n)) return STRATA_ENOMEM;
            k = ws->tmp2.p;
            kn = ws->tmp2.n;
        }
        int32_t id = tk_map_get(&m->vocab, k, kn, -1);
        if (id >= 0) return s_push_id(ws, id);
    }
    if (!chunk) return s_bpe_cached(tok, ws, p, n, raw, m->ignore_merges && !m->can_chunk);
    /* Cut candidates: before a word-start char (SentencePiece's U+2581, a space, GPT-2's U+0120,
     * a newline or tab), or anywhere once 256 bytes passed without a cut. Each is checked
     * against the joinable pairs; the cuts only bound the work, any set of them is exact. */
    static const uint8_t cand_byte[256] = {[' '] = 1, ['\n'] = 1, ['\t'] = 1, [0xE2] = 2, [0xC4] = 3};
    const unsigned char *u = (const unsigned char *)p;
    size_t start = 0, i = raw ? 1 : (size_t)tk_utf8_len(u[0]);
    while (i < n) {
        size_t lim = start + 256 < n ? start + 256 : n;
        while (i < lim && !cand_byte[u[i]]) i++; /* continuation bytes are never candidates */
        if (i >= n) break;
        unsigned char b = u[i];
        int c = cand_byte[b];
        bool forced = i - start >= 256;
        if (!raw && (b & 0xC0) == 0x80) { /* inside a char */
            i++;
            continue;
        }
        if (!forced && (!c || (!raw && c == 2 && !(i + 2 < n && u[i + 1] == 0x96 && u[i + 2] == 0x81)) ||
                        (!raw && c == 3 && !(i + 1 < n && u[i + 1] == 0xA0)) || (raw && c > 1))) {
            i++;
            continue;
        }
        /* the char before i, and the one at i */
        size_t j = i - 1;
        while (!raw && j > start && (u[j] & 0xC0) == 0x80) j--;
        int lp, l;
        bool known_prev, known;
        uint32_t prev = s_chunk_char(m, u + j, i - j, raw, &lp, &known_prev);
        uint32_t cp = s_chunk_char(m, u + i, n - i, raw, &l, &known);
        uint32_t rk;
        int32_t v;
        if (known && known_prev && !tk_pair_get(&m->joinable, (int32_t)prev, (int32_t)cp, &rk, &v)) {
            int rc = s_bpe_cached(tok, ws, p + start, i - start, raw, false);
            if (rc) return rc;
            start = i;
        }
        i += (size_t)l;
    }
    return s_bpe_cached(tok, ws, p + start, n - start, raw, false);
}

/* ---------------------------------------------------------------- post-processing */

/* The encodings between post-processors: ids back to back in one of ws->pp_ids, split in
 * at most PP_MAX encodings. */
#define PP_MAX 64
typedef struct {
    tk_ws_t *ws;
    int which;          /* the ws->pp_ids buffer holding ids */
    int32_t *ids;
    size_t n;
    size_t start[PP_MAX], len[PP_MAX];
    size_t count;
} s_encs_t;

static int s_enc_begin(tk_ws_t *ws, int which, s_encs_t *e, size_t need)
{
    if (ws->pp_cap[which] < need) {
        int32_t *v = realloc(ws->pp_ids[which], need * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        ws->pp_ids[which] = v;
        ws->pp_cap[which] = need;
    }
    e->ws = ws;
    e->which = which;
    e->ids = ws->pp_ids[which];
    e->n = e->count = 0;
    return 0;
}

/* Append one encoding made of up to three parts (the sources are never in e's buffer). */
static int s_enc_add(s_encs_t *e, const int32_t *a, size_t na, const int32_t *b, size_t nb, const int32_t *c,
                     size_t nc)
{
    if (e->count == PP_MAX) return STRATA_EUNSUPPORTED;
    size_t need = e->n + na + nb + nc;
    if (need > e->ws->pp_cap[e->which]) {
        size_t cap = 2 * need;
        int32_t *v = realloc(e->ws->pp_ids[e->which], cap * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        e->ws->pp_ids[e->which] = e->ids = v;
        e->ws->pp_cap[e->which] = cap;
    }
    e->start[e->count] = e->n;
    if (na) memcpy(e->ids + e->n, a, na * sizeof *a);
    e->n += na;
    if (nb) memcpy(e->ids + e->n, b, nb * sizeof *b);
    e->n += nb;
    if (nc) memcpy(e->ids + e->n, c, nc * sizeof *c);
    e->n += nc;
    e->len[e->count] = e->n - e->start[e->count];
    e->count++;
    return 0;
}

/* PostProcessor::process: the processors in turn over the list of encodings, then merged. */
static int s_post_process(const tok_t *tok, tk_ws_t *ws, bool add_special)
{
    int rc, cur = 0;
    /* The usual case: one template "specials $A specials" (and ByteLevel ones): in place. */
    const tk_pp_t *only = NULL;
    size_t ntpl = 0;
    for (size_t i = 0; i < tok->npp; i++)
        if (tok->pp[i].kind != PP_BYTELEVEL) {
            only = &tok->pp[i];
            ntpl++;
        }
    if (!ntpl) return 0;
    if (ntpl == 1 && only->kind == PP_TEMPLATE) {
        size_t na = 0, pre = 0, post = 0;
        for (size_t k = 0; k < only->nsingle; k++) {
            const tk_tpl_item_t *t = &only->single[k];
            if (t->what == 0) na++;
            else if (t->what == 1) na = 2; /* $B: the general path refuses it */
            else if (add_special && na) post += t->n;
            else if (add_special) pre += t->n;
        }
        if (na == 1) {
            size_t n0 = ws->nids, total = pre + n0 + post;
            if (total > ws->ids_cap) {
                int32_t *v = realloc(ws->ids, total * sizeof *v);
                if (!v) return STRATA_ENOMEM;
                ws->ids = v;
                ws->ids_cap = total;
            }
            memmove(ws->ids + pre, ws->ids, n0 * sizeof *ws->ids);
            size_t at = 0;
            for (size_t k = 0; k < only->nsingle; k++) {
                const tk_tpl_item_t *t = &only->single[k];
                if (t->what == 0) {
                    at = pre + n0;
                } else if (add_special) {
                    memcpy(ws->ids + at, t->ids, t->n * sizeof *t->ids);
                    at += t->n;
                }
            }
            ws->nids = total;
            return 0;
        }
    }
    size_t bound = 2 * ws->nids + 64;
    s_encs_t e;
    if ((rc = s_enc_begin(ws, cur, &e, bound))) return rc;
    if ((rc = s_enc_add(&e, ws->ids, ws->nids, NULL, 0, NULL, 0))) return rc;
    for (size_t i = 0; i < tok->npp; i++) {
        const tk_pp_t *pp = &tok->pp[i];
        if (pp->kind == PP_BYTELEVEL || (pp->kind != PP_TEMPLATE && !add_special)) continue;
        s_encs_t o;
        if ((rc = s_enc_begin(ws, !cur, &o, bound))) return rc;
        if (pp->kind == PP_TEMPLATE) {
            const tk_tpl_item_t *tpl = e.count == 1 ? pp->single : pp->pair;
            size_t nt = e.count == 1 ? pp->nsingle : pp->npair;
            if (e.count > 2 || (e.count == 2 && !pp->pair)) return STRATA_EUNSUPPORTED;
            for (size_t k = 0; k < nt; k++) {
                const tk_tpl_item_t *t = &tpl[k];
                if (t->what == 2) {
                    if (add_special && (rc = s_enc_add(&o, t->ids, t->n, NULL, 0, NULL, 0))) return rc;
                    continue;
                }
                if ((size_t)t->what >= e.count) return STRATA_EUNSUPPORTED; /* $B with one sequence */
                rc = s_enc_add(&o, e.ids + e.start[t->what], e.len[t->what], NULL, 0, NULL, 0);
                if (rc) return rc;
            }
        } else { /* Roberta: <s> A </s>, </s> B </s>; Bert: [CLS] A [SEP], B [SEP] */
            for (size_t k = 0; k < e.count; k++) {
                const int32_t *first = k == 0 ? &pp->cls : &pp->sep;
                bool lead = k == 0 || pp->kind == PP_ROBERTA;
                rc = s_enc_add(&o, lead ? first : NULL, lead, e.ids + e.start[k], e.len[k], &pp->sep, 1);
                if (rc) return rc;
            }
        }
        e = o;
        cur = !cur;
    }
    if (e.n > ws->ids_cap) {
        int32_t *v = realloc(ws->ids, e.n * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        ws->ids = v;
        ws->ids_cap = e.n;
    }
    memcpy(ws->ids, e.ids, e.n * sizeof *e.ids);
    ws->nids = e.n;
    return 0;
}

/* ---------------------------------------------------------------- the pipeline */

static int s_encode(const tok_t *tok, tk_ws_t *ws, const char *text, size_t len, bool add_special)
{
    int rc;
    ws->ti = ws->si = 0;
    ws->raw_bytes = false;
    tk_nstr_t *t = &ws->t[0];
    t->s.n = 0;
    t->track = tok->track_align;
    t->base = 0;
    size_t v = tk_utf8_valid_prefix((const unsigned char *)text, len);
    if (v == len) {
        if ((rc = s_text_put(t, text, len, NULL, 0))) return rc;
    } else {
        if ((rc = tk_utf8_lossy(&t->s, (const unsigned char *)text, len))) return rc;
        if ((rc = tk_nstr_reserve(t, 0))) return rc;
    }
    if (t->track)
        for (size_t i = 0; i < t->s.n; i++) t->al[i] = (uint32_t)i;
    /* size the buffers once for this input (a warm workspace already is) */
    for (int i = 0; i < 2; i++) {
        ws->t[i].track = t->track;
        size_t keep = ws->t[i].s.n;
        ws->t[i].s.n = 0;
        if ((rc = tk_nstr_reserve(&ws->t[i], 3 * t->s.n + 64))) return rc;
        ws->t[i].s.n = keep;
        if (ws->sl[i].cap < t->s.n / 2 + 16) {
            tk_split_t *v = realloc(ws->sl[i].v, (t->s.n / 2 + 16) * sizeof *v);
            if (!v) return STRATA_ENOMEM;
            ws->sl[i].v = v;
            ws->sl[i].cap = t->s.n / 2 + 16;
        }
    }
    if (ws->ids_cap < t->s.n / 2 + 16) {
        int32_t *v = realloc(ws->ids, (t->s.n / 2 + 16) * sizeof *v);
        if (!v) return STRATA_ENOMEM;
        ws->ids = v;
        ws->ids_cap = t->s.n / 2 + 16;
    }
    tk_splits_t *l = &ws->sl[0];
    l->n = 0;
    if (t->s.n && (rc = s_sp_add(l, 0, t->s.n, -1))) return rc;

    if (tok->trie_raw.nnode && (rc = s_stage_added_raw(tok, ws))) return rc;
    if ((tok->nnorm || tok->trie_norm.nnode) && (rc = s_stage_normalize(tok, ws))) return rc;
    for (size_t i = 0; i < tok->npt; i++) {
        const tk_pt_t *pt = &tok->pt[i];
        if (pt->kind == PT_BYTELEVEL) rc = s_stage_bytelevel(tok, ws, pt);
        else if (pt->kind == PT_METASPACE) rc = s_stage_metaspace(tok, ws, pt);
        else rc = s_stage_split(tok, ws, pt);
        if (rc) return rc;
    }

    ws->nids = 0;
    t = &ws->t[ws->ti];
    l = &ws->sl[ws->si];
    for (size_t k = 0; k < l->n; k++) {
        tk_split_t sp = l->v[k];
        rc = sp.id >= 0 ? s_push_id(ws, sp.id) : s_bpe(tok, ws, t->s.p + sp.off, sp.len, ws->raw_bytes);
        if (rc) return rc;
    }

    /* truncation leaves room for the special tokens the post-processors add */
    size_t n_added = 0;
    if (add_special)
        for (size_t i = 0; i < tok->npp; i++) n_added += tok->pp[i].n_added;
    if (tok->trunc) {
        if (n_added > tok->trunc_max) return STRATA_EINVAL_INPUT;
        size_t max = tok->trunc_max - n_added;
        if (ws->nids > max) {
            if (tok->trunc_left) memmove(ws->ids, ws->ids + (ws->nids - max), max * sizeof *ws->ids);
            ws->nids = max;
        }
    }
    if (tok->npp && (rc = s_post_process(tok, ws, add_special))) return rc;
    if (tok->pad) {
        size_t target = tok->pad_fixed ? tok->pad_fixed : ws->nids;
        if (tok->pad_multiple && target % tok->pad_multiple) target += tok->pad_multiple - target % tok->pad_multiple;
        if (ws->nids < target) {
            size_t n0 = ws->nids, add = target - n0;
            for (size_t j = 0; j < add; j++)
                if ((rc = s_push_id(ws, tok->pad_id))) return rc;
            if (tok->pad_left) {
                memmove(ws->ids + add, ws->ids, n0 * sizeof *ws->ids);
                for (size_t j = 0; j < add; j++) ws->ids[j] = tok->pad_id;
            }
        }
    }
    return 0;
}

int tok_encode(const tok_t *tok, const char *text, size_t len, bool add_special, int32_t **ids, size_t *n)
{
    pthread_once(&s_tab_once, s_tab_init);
    *ids = NULL;
    *n = 0;
    if (len >= TK_MAX_INPUT) return STRATA_ETOOLARGE;
    if (len && !text) return STRATA_EINVAL_INPUT;
    tk_ws_t *ws = tk_ws_get(tok);
    if (!ws) return STRATA_ENOMEM;
    int rc = s_encode(tok, ws, text ? text : "", len, add_special);
    if (!rc && ws->nids) {
        *ids = malloc(ws->nids * sizeof **ids);
        if (!*ids) rc = STRATA_ENOMEM;
        else {
            memcpy(*ids, ws->ids, ws->nids * sizeof **ids);
            *n = ws->nids;
        }
    }
    tk_ws_put(tok, ws);
    return rc;
}
