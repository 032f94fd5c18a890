/* tok_norm.c - normalizers, on a string plus its alignment to the original text.
 *
 * tokenizers keeps, for every byte of the normalized string, the original range it came
 * from. We keep only the start of that range, and only when a Metaspace pre-tokenizer with
 * prepend_scheme "first" needs it (it asks whether a piece starts at original offset 0).
 * The rules follow NormalizedString::transform_range: a char that replaces or derives from
 * a source char takes that char's alignment; a char inserted by Replace takes the alignment
 * of the byte before the insertion point (or the segment start). NFC and friends map each
 * run "starter + following non-starters" as a unit. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "common/tok_int.h"

int tk_nstr_reserve(tk_nstr_t *ns, size_t extra)
{
    int rc = tk_buf_reserve(&ns->s, extra);
    if (rc) return rc;
    if (ns->track && ns->s.n + extra + 1 > ns->alcap) {
        size_t c = ns->alcap ? ns->alcap : 64;
        while (c < ns->s.n + extra + 1) c *= 2;
        uint32_t *a = realloc(ns->al, c * sizeof *a);
        if (!a) return STRATA_ENOMEM;
        ns->al = a;
        ns->alcap = c;
    }
    return 0;
}

void tk_nstr_free(tk_nstr_t *ns)
{
    tk_buf_free(&ns->s);
    free(ns->al);
    memset(ns, 0, sizeof *ns);
}

static inline bool s_room(const tk_nstr_t *o, size_t n)
{
    return o->s.n + n + 1 <= o->s.cap && (!o->track || o->s.n + n + 1 <= o->alcap);
}

/* Append n bytes, all aligned to a. */
static inline int s_put(tk_nstr_t *o, const char *p, size_t n, uint32_t a)
{
    if (!s_room(o, n)) {
        int rc = tk_nstr_reserve(o, n);
        if (rc) return rc;
    }
    memcpy(o->s.p + o->s.n, p, n);
    if (o->track)
        for (size_t i = 0; i < n; i++) o->al[o->s.n + i] = a;
    o->s.n += n;
    o->s.p[o->s.n] = 0;
    return 0;
}

/* Append in[off, off + n) with its alignment. */
static inline int s_copy(tk_nstr_t *o, const tk_nstr_t *in, size_t off, size_t n)
{
    if (!s_room(o, n)) {
        int rc = tk_nstr_reserve(o, n);
        if (rc) return rc;
    }
    memcpy(o->s.p + o->s.n, in->s.p + off, n);
    if (o->track) memcpy(o->al + o->s.n, in->al + off, n * sizeof *o->al);
    o->s.n += n;
    o->s.p[o->s.n] = 0;
    return 0;
}

static inline uint32_t s_al(const tk_nstr_t *in, size_t i) { return in->track ? in->al[i] : 0; }

static void s_begin(tk_nstr_t *o, const tk_nstr_t *in)
{
    o->s.n = 0;
    o->track = in->track;
    o->base = in->base;
    tk_nstr_reserve(o, in->s.n + in->s.n / 4 + 16); /* a hint; appends still check */
}

/* ---------------------------------------------------------------- NFC / NFD / NFKC / NFKD */

static int s_utf8proc(const char *p, size_t n, int opt, utf8proc_uint8_t **res, size_t *rn)
{
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)p, (utf8proc_ssize_t)n, res, (utf8proc_option_t)opt);
    if (r < 0) return r == UTF8PROC_ERROR_NOMEM ? STRATA_ENOMEM : STRATA_EFORMAT;
    *rn = (size_t)r;
    return 0;
}

static bool s_is_starter(uint32_t cp)
{
    if (cp < 0x300) return true;
    if (cp >= 0x1161 && cp <= 0x11FF) return false; /* Hangul vowels / trailing consonants compose */
    const utf8proc_property_t *pr = utf8proc_get_property((utf8proc_int32_t)cp);
    return pr->combining_class == 0 && !pr->comp_exclusion;
}

static int s_unicode(tk_nstr_t *o, const tk_nstr_t *in, tk_norm_kind_t kind)
{
    const unsigned char *p = (const unsigned char *)in->s.p;
    size_t n = in->s.n;
    uint32_t limit = kind == NORM_NFC ? 0x300 : 0x80; /* below this every char is stable */
    bool stable = true;
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        int l;
        uint32_t cp = tk_utf8_dec(p + i, n - i, &l);
        if (cp >= limit) {
            stable = false;
            break;
        }
        i += (size_t)l;
    }
    s_begin(o, in);
    if (stable) return s_copy(o, in, 0, n);
    int opt = UTF8PROC_STABLE;
    switch (kind) {
    case NORM_NFC: opt |= UTF8PROC_COMPOSE; break;
    case NORM_NFD: opt |= UTF8PROC_DECOMPOSE; break;
    case NORM_NFKC: opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_uint8_t *res = NULL;
    size_t rn = 0;
    int rc = s_utf8proc(in->s.p, n, opt, &res, &rn);
    if (rc) return rc;
    if (!in->track) {
        rc = s_put(o, (const char *)res, rn, 0);
        free(res);
        return rc;
    }
    /* Alignment: normalize each "starter + non-starters" run alone; if the runs put together
     * give the same text, each run's output takes the run's alignment. Otherwise (a rare
     * composition across runs) the whole output takes the first char's. */
    size_t done = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok;) {
        size_t j = i;
        int l;
        tk_utf8_dec(p + j, n - j, &l);
        j += (size_t)l;
        while (j < n) {
            uint32_t cp = tk_utf8_dec(p + j, n - j, &l);
            if (s_is_starter(cp)) break;
            j += (size_t)l;
        }
        utf8proc_uint8_t *part = NULL;
        size_t pn = 0;
        if ((rc = s_utf8proc(in->s.p + i, j - i, opt, &part, &pn))) {
            free(res);
            return rc;
        }
        if (done + pn > rn || memcmp(res + done, part, pn)) ok = false;
        else if ((rc = s_put(o, (const char *)part, pn, in->al[i]))) ok = false;
        free(part);
        if (rc) {
            free(res);
            return rc;
        }
        done += pn;
        i = j;
    }
    if (!ok || done != rn) {
        o->s.n = 0;
        rc = s_put(o, (const char *)res, rn, n ? in->al[0] : in->base);
    }
    free(res);
    return rc;
}

/* ---------------------------------------------------------------- per-char maps */

static int s_lowercase(tk_nstr_t *o, const tk_nstr_t *in)
{
    const unsigned char *p = (const unsigned char *)in->s.p;
    s_begin(o, in);
    for (size_t i = 0; i < in->s.n;) {
        if (p[i] < 0x80) {
            size_t run = tk_ascii_prefix(p + i, in->s.n - i);
            size_t at = o->s.n;
            if (s_copy(o, in, i, run)) return STRATA_ENOMEM;
            for (size_t k = at; k < at + run; k++)
                if ((unsigned char)(o->s.p[k] - 'A') < 26) o->s.p[k] = (char)(o->s.p[k] + 32);
            i += run;
            continue;
        }
        int l;
        uint32_t cp = tk_utf8_dec(p + i, in->s.n - i, &l);
        char tmp[8];
        int tn;
        if (cp == 0x130) { /* the one unconditional multi-char lowercase mapping */
            memcpy(tmp, "i\xCC\x87", 3);
            tn = 3;
        } else {
            tn = tk_utf8_enc((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), tmp);
        }
        if (s_put(o, tmp, (size_t)tn, s_al(in, i))) return STRATA_ENOMEM;
        i += (size_t)l;
    }
    return 0;
}

static int s_strip(tk_nstr_t *o, const tk_nstr_t *in, bool left, bool right)
{
    const unsigned char *p = (const unsigned char *)in->s.p;
    size_t a = 0, b = in->s.n;
    if (left)
        while (a < b) {
            int l;
            uint32_t cp = tk_utf8_dec(p + a, b - a, &l);
            if (!tk_is_whitespace(cp)) break;
            a += (size_t)l;
        }
    if (right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && (p[k] & 0xC0) == 0x80) k--;
            int l;
            uint32_t cp = tk_utf8_dec(p + k, b - k, &l);
            if (!tk_is_whitespace(cp)) break;
            b = k;
        }
    s_begin(o, in);
    return s_copy(o, in, a, b - a);
}

/* StripAccents drops every combining mark (M*); BertNormalizer only nonspacing ones (Mn). */
static int s_strip_accents(tk_nstr_t *o, const tk_nstr_t *in, bool only_mn)
{
    const unsigned char *p = (const unsigned char *)in->s.p;
    s_begin(o, in);
    for (size_t i = 0; i < in->s.n;) {
        if (p[i] < 0x80) { /* ASCII has no marks */
            size_t run = tk_ascii_prefix(p + i, in->s.n - i);
            if (s_copy(o, in, i, run)) return STRATA_ENOMEM;
            i += run;
            continue;
        }
        int l = 1;
        uint32_t cp = tk_utf8_dec(p + i, in->s.n - i, &l);
        bool drop = only_mn ? tk_is_mn(cp) : tk_is_mark(cp);
        if (!drop && s_copy(o, in, i, (size_t)l)) return STRATA_ENOMEM;
        i += (size_t)l;
    }
    return 0;
}

static int s_replace(tk_ws_t *ws, tk_nstr_t *o, const tk_nstr_t *in, const tk_norm_t *nm)
{
    if (nm->re.lit && nm->re.lit_n == 1 && !in->track) {
        /* one byte for a string (Llama's ' ' -> U+2581): a direct copy */
        s_begin(o, in);
        size_t need = in->s.n * (nm->str_n > 1 ? nm->str_n : 1) + 1;
        int rc = tk_nstr_reserve(o, need);
        if (rc) return rc;
        const char *p = in->s.p, *end = p + in->s.n;
        char *w = o->s.p;
        char c = nm->re.lit[0];
        while (p < end) {
            const char *f = memchr(p, c, (size_t)(end - p));
            size_t run = f ? (size_t)(f - p) : (size_t)(end - p);
            memcpy(w, p, run);
            w += run;
            if (!f) break;
            memcpy(w, nm->str, nm->str_n);
            w += nm->str_n;
            p = f + 1;
        }
        o->s.n = (size_t)(w - o->s.p);
        o->s.p[o->s.n] = 0;
        return 0;
    }
    int rc = tk_re_find_matches(ws, &nm->re, in->s.p, in->s.n, &ws->mt);
    if (rc) return rc;
    s_begin(o, in);
    for (size_t k = 0; k < ws->mt.n; k++) {
        tk_match_t m = ws->mt.v[k];
        if (!m.m) {
            if (s_copy(o, in, m.s, m.e - m.s)) return STRATA_ENOMEM;
            continue;
        }
        uint32_t a = m.e > m.s ? s_al(in, m.e - 1) : (o->s.n && o->track ? o->al[o->s.n - 1] : in->base);
        if (s_put(o, nm->str, nm->str_n, a)) return STRATA_ENOMEM;
    }
    return 0;
}

static int s_prepend(tk_nstr_t *o, const tk_nstr_t *in, const char *s, size_t n)
{
    s_begin(o, in);
    if (!in->s.n) return 0;
    if (s_put(o, s, n, s_al(in, 0))) return STRATA_ENOMEM;
    return s_copy(o, in, 0, in->s.n);
}

static bool s_is_chinese(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int s_bert_clean(tk_nstr_t *o, const tk_nstr_t *in, bool clean, bool chinese)
{
    const unsigned char *p = (const unsigned char *)in->s.p;
    s_begin(o, in);
    for (size_t i = 0; i < in->s.n;) {
        if (p[i] >= 0x20 && p[i] < 0x7F) { /* printable ASCII: kept as is */
            size_t j = i + 1;
            while (j < in->s.n && p[j] >= 0x20 && p[j] < 0x7F) j++;
            if (s_copy(o, in, i, j - i)) return STRATA_ENOMEM;
            i = j;
            continue;
        }
        int l;
        uint32_t cp = tk_utf8_dec(p + i, in->s.n - i, &l);
        uint32_t a = s_al(in, i);
        if (clean) {
            int k = cp > 0x10FFFF ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)cp);
            bool ws = cp == '\t' || cp == '\n' || cp == '\r' || cp == ' ' || k == UTF8PROC_CATEGORY_ZS;
            bool ctl = !(cp == '\t' || cp == '\n' || cp == '\r') &&
                       (k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF ||
                        k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS);
            if (cp == 0 || cp == 0xFFFD || ctl) {
                i += (size_t)l;
                continue;
            }
            if (ws) {
                if (s_put(o, " ", 1, a)) return STRATA_ENOMEM;
                i += (size_t)l;
                continue;
            }
        }
        if (chinese && s_is_chinese(cp)) {
            if (s_put(o, " ", 1, a) || s_copy(o, in, i, (size_t)l) || s_put(o, " ", 1, a)) return STRATA_ENOMEM;
        } else if (s_copy(o, in, i, (size_t)l)) {
            return STRATA_ENOMEM;
        }
        i += (size_t)l;
    }
    return 0;
}

static int s_bytelevel(tk_nstr_t *o, const tk_nstr_t *in)
{
    const unsigned char *p = (const unsigned char *)in->s.p;
    s_begin(o, in);
    for (size_t i = 0; i < in->s.n; i++) {
        char tmp[4];
        int tn = tk_utf8_enc(tk_byte_cp[p[i]], tmp);
        if (s_put(o, tmp, (size_t)tn, s_al(in, i))) return STRATA_ENOMEM;
    }
    return 0;
}

static void s_swap(tk_nstr_t *a, tk_nstr_t *b)
{
    tk_nstr_t t = *a;
    *a = *b;
    *b = t;
}

/* One normalizer step: ns -> ws->n3, then swapped into ns. */
static int s_apply(const tk_norm_t *nm, tk_ws_t *ws, tk_nstr_t *ns)
{
    tk_nstr_t *o = &ws->n3;
    int rc = 0;
    switch (nm->kind) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD: rc = s_unicode(o, ns, nm->kind); break;
    case NORM_LOWERCASE: rc = s_lowercase(o, ns); break;
    case NORM_STRIP: rc = s_strip(o, ns, nm->left, nm->right); break;
    case NORM_STRIP_ACCENTS: rc = s_strip_accents(o, ns, false); break;
    case NORM_REPLACE: rc = s_replace(ws, o, ns, nm); break;
    case NORM_PREPEND: rc = s_prepend(o, ns, nm->str, nm->str_n); break;
    case NORM_BYTELEVEL: rc = s_bytelevel(o, ns); break;
    case NORM_BERT:
        if (nm->clean_text || nm->chinese) {
            if ((rc = s_bert_clean(o, ns, nm->clean_text, nm->chinese))) return rc;
            s_swap(ns, o);
        }
        if (nm->strip_accents) {
            if ((rc = s_unicode(o, ns, NORM_NFD))) return rc;
            s_swap(ns, o);
            if ((rc = s_strip_accents(o, ns, true))) return rc;
            s_swap(ns, o);
        }
        if (nm->lowercase) {
            if ((rc = s_lowercase(o, ns))) return rc;
            s_swap(ns, o);
        }
        return 0;
    }
    if (rc) return rc;
    s_swap(ns, o);
    return 0;
}

int tk_normalize(const tok_t *tok, tk_ws_t *ws, tk_nstr_t *ns)
{
    for (size_t i = 0; i < tok->nnorm; i++) {
        int rc = s_apply(&tok->norm[i], ws, ns);
        if (rc) return rc;
    }
    return 0;
}

int tk_normalize_str(const tok_t *tok, const char *s, size_t n, tk_buf_t *out)
{
    tk_ws_t *ws = tk_ws_get(tok);
    if (!ws) return STRATA_ENOMEM;
    tk_nstr_t *ns = &ws->n1;
    ns->track = false;
    ns->base = 0;
    ns->s.n = 0;
    int rc = tk_nstr_reserve(ns, n);
    if (!rc) {
        memcpy(ns->s.p, s, n);
        ns->s.n = n;
        ns->s.p[n] = 0;
        rc = tk_normalize(tok, ws, ns);
    }
    out->n = 0;
    if (!rc) rc = tk_buf_put(out, ws->n1.s.p, ws->n1.s.n);
    tk_ws_put(tok, ws);
    return rc;
}
