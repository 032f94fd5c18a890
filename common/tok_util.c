/* tok_util.c - tokenizer building blocks: buffers, hash maps, UTF-8 and character classes. */
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "common/tok_int.h"

/* ---------------------------------------------------------------- buffer */

int tk_buf_reserve(tk_buf_t *b, size_t extra)
{
    if (b->n + extra + 1 <= b->cap) return 0;
    /* offsets into these buffers are 32-bit (NFKC can grow text 18x) */
    if (extra > UINT32_MAX / 2 || b->n + extra + 1 > UINT32_MAX / 2) return STRATA_ETOOLARGE;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return STRATA_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk_buf_put(tk_buf_t *b, const void *p, size_t n)
{
    int rc = tk_buf_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

void tk_buf_free(tk_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---------------------------------------------------------------- string map */

static int s_map_grow_slots(tk_map_t *m)
{
    uint32_t scap = m->scap ? m->scap * 2 : 64;
    uint32_t *slot = calloc(scap, sizeof *slot);
    if (!slot) return STRATA_ENOMEM;
    for (uint32_t e = 0; e < m->n; e++) {
        uint32_t i = m->khash[e] & (scap - 1);
        while (slot[i]) i = (i + 1) & (scap - 1);
        slot[i] = e + 1;
    }
    free(m->slot);
    m->slot = slot;
    m->scap = scap;
    return 0;
}

int64_t tk_map_find(const tk_map_t *m, const char *k, size_t n)
{
    if (!m->scap) return -1;
    uint32_t h = (uint32_t)tk_hash64(k, n);
    uint32_t mask = m->scap - 1, i = h & mask;
    for (;;) {
        uint32_t s = m->slot[i];
        if (!s) return -1;
        uint32_t e = s - 1;
        if (m->khash[e] == h && m->klen[e] == n && !memcmp(m->arena + m->koff[e], k, n)) return e;
        i = (i + 1) & mask;
    }
}

int tk_map_set(tk_map_t *m, const char *k, size_t n, int32_t v)
{
    int64_t f = tk_map_find(m, k, n);
    if (f >= 0) {
        m->val[f] = v;
        return (int)f;
    }
    if (n > UINT32_MAX / 2 || m->n >= INT32_MAX / 2) return STRATA_ETOOLARGE;
    if ((m->n + 1) * 2 > m->scap && s_map_grow_slots(m)) return STRATA_ENOMEM;
    if (m->n == m->ncap) {
        uint32_t nc = m->ncap ? m->ncap * 2 : 64;
        uint32_t *ko = realloc(m->koff, nc * sizeof *ko);
        if (!ko) return STRATA_ENOMEM;
        m->koff = ko;
        uint32_t *kl = realloc(m->klen, nc * sizeof *kl);
        if (!kl) return STRATA_ENOMEM;
        m->klen = kl;
        uint32_t *kh = realloc(m->khash, nc * sizeof *kh);
        if (!kh) return STRATA_ENOMEM;
        m->khash = kh;
        int32_t *va = realloc(m->val, nc * sizeof *va);
        if (!va) return STRATA_ENOMEM;
        m->val = va;
        m->ncap = nc;
    }
    if (m->arena_n + n + 1 > m->arena_cap) {
        size_t c = m->arena_cap ? m->arena_cap : 4096;
        while (c < m->arena_n + n + 1) c *= 2;
        if (c > UINT32_MAX) return STRATA_ETOOLARGE;
        char *a = realloc(m->arena, c);
        if (!a) return STRATA_ENOMEM;
        m->arena = a;
        m->arena_cap = c;
    }
    uint32_t e = m->n++;
    m->koff[e] = (uint32_t)m->arena_n;
    m->klen[e] = (uint32_t)n;
    m->khash[e] = (uint32_t)tk_hash64(k, n);
    m->val[e] = v;
    if (n) memcpy(m->arena + m->arena_n, k, n);
    m->arena[m->arena_n + n] = 0; /* keys stay NUL-terminated */
    m->arena_n += n + 1;
    uint32_t i = m->khash[e] & (m->scap - 1);
    while (m->slot[i]) i = (i + 1) & (m->scap - 1);
    m->slot[i] = e + 1;
    return (int)e;
}

void tk_map_free(tk_map_t *m)
{
    free(m->arena);
    free(m->koff);
    free(m->klen);
    free(m->khash);
    free(m->val);
    free(m->slot);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- pair map */

static int s_pair_grow(tk_pairmap_t *m)
{
    uint32_t cap = m->cap ? m->cap * 2 : 1024;
    uint64_t *key = malloc((size_t)cap * sizeof *key);
    uint32_t *rank = malloc((size_t)cap * sizeof *rank);
    int32_t *nid = malloc((size_t)cap * sizeof *nid);
    if (!key || !rank || !nid) {
        free(key);
        free(rank);
        free(nid);
        return STRATA_ENOMEM;
    }
    memset(key, 0xff, (size_t)cap * sizeof *key);
    for (uint32_t j = 0; j < m->cap; j++) {
        if (m->key[j] == UINT64_MAX) continue;
        uint64_t h = m->key[j] * 0x9E3779B97F4A7C15ull;
        uint32_t i = (uint32_t)(h >> 32) & (cap - 1);
        while (key[i] != UINT64_MAX) i = (i + 1) & (cap - 1);
        key[i] = m->key[j];
        rank[i] = m->rank[j];
        nid[i] = m->new_id[j];
    }
    free(m->key);
    free(m->rank);
    free(m->new_id);
    m->key = key;
    m->rank = rank;
    m->new_id = nid;
    m->cap = cap;
    return 0;
}

int tk_pair_set(tk_pairmap_t *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id)
{
    if ((m->n + 1) * 2 > m->cap && s_pair_grow(m)) return STRATA_ENOMEM;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    uint32_t mask = m->cap - 1, i = (uint32_t)(h >> 32) & mask;
    while (m->key[i] != UINT64_MAX && m->key[i] != k) i = (i + 1) & mask;
    if (m->key[i] == UINT64_MAX) m->n++;
    m->key[i] = k;
    m->rank[i] = rank;
    m->new_id[i] = new_id;
    return 0;
}

void tk_pair_free(tk_pairmap_t *m)
{
    free(m->key);
    free(m->rank);
    free(m->new_id);
    memset(m, 0, sizeof *m);
}

/* ---------------------------------------------------------------- UTF-8 */

int tk_utf8_enc(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unicode Table 3-7 (well-formed UTF-8): the lead byte fixes the length and the range of the
 * second byte; later bytes are 80..BF. A maximal subpart of an ill-formed sequence is the
 * longest prefix of a well-formed one, or one byte; each becomes one U+FFFD. */
size_t tk_utf8_subpart(const unsigned char *p, size_t n, bool *valid, bool *incomplete)
{
    unsigned c = p[0];
    *incomplete = false;
    if (c < 0x80) {
        *valid = true;
        return 1;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c == 0xE0) { need = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 3;
    else if (c == 0xED) { need = 3; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 3;
    else if (c == 0xF0) { need = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 4;
    else if (c == 0xF4) { need = 4; hi = 0x8F; }
    else {
        *valid = false;
        return 1;
    }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n) {
            *valid = false;
            *incomplete = true;
            return i;
        }
        unsigned b = p[i];
        unsigned l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *valid = false;
            return i;
        }
    }
    *valid = true;
    return need;
}

size_t tk_utf8_valid_prefix(const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            i += tk_ascii_prefix(p + i, n - i);
            continue;
        }
        bool v, inc;
        size_t l = tk_utf8_subpart(p + i, n - i, &v, &inc);
        if (!v) return i;
        i += l;
    }
    return i;
}

int tk_utf8_lossy(tk_buf_t *out, const unsigned char *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t v0 = tk_utf8_valid_prefix(p + i, n - i);
        if (v0 && tk_buf_put(out, p + i, v0)) return STRATA_ENOMEM;
        i += v0;
        if (i >= n) break;
        bool v, inc;
        i += tk_utf8_subpart(p + i, n - i, &v, &inc);
        if (tk_buf_put(out, "\xEF\xBF\xBD", 3)) return STRATA_ENOMEM;
    }
    return 0;
}

/* ---------------------------------------------------------------- character classes */

bool tk_is_whitespace(uint32_t c)
{
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int s_cat(uint32_t c) { return c > 0x10FFFF ? UTF8PROC_CATEGORY_CN : utf8proc_category((utf8proc_int32_t)c); }


/* s_cat, but what utf8proc leaves unassigned gets the category the library's Unicode 16.0 gives
 * it (tok_regex.c's s_ucd_new): for what tokenizers asks of Rust's std and regex crate, which
 * have 16.0 (is_numeric, \w; difftest.py checks both on letters and digits of 15.0 and 16.0).
 * Marks and punctuation stay on s_cat: tokenizers takes those from other crates, whose tables
 * are older still (StripAccents keeps U+07FD, a mark since Unicode 11). */
static int s_cat16(uint32_t c)
{
    static const char names[][3] = {"Cn", "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc",
                                    "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp",
                                    "Cc", "Cf", "Cs", "Co"}; /* utf8proc_category_t order */
    int k = s_cat(c);
    const char *n = k == UTF8PROC_CATEGORY_CN && c <= 0x10FFFF ? tk_ucd_new_cat(c) : NULL;
    for (int i = 1; n && i < (int)(sizeof names / sizeof names[0]); i++)
        if (names[i][0] == n[0] && names[i][1] == n[1]) return i;
    return k;
}

bool tk_is_numeric(uint32_t c)
{
    if (c < 0x80) return c >= '0' && c <= '9';
    int k = s_cat16(c);
    return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool tk_is_punct(uint32_t c)
{
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                         (c >= 0x7B && c <= 0x7E);
    int k = s_cat(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

bool tk_is_word(uint32_t c)
{
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true; /* Join_Control */
    /* Alphabetic symbols (Other_Alphabetic in So): circled and squared Latin letters */
    if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
        (c >= 0x1F170 && c <= 0x1F189))
        return true;
    int k = s_cat16(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
           (k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_PC;
}

bool tk_is_mn(uint32_t c) { return c >= 0x300 && s_cat(c) == UTF8PROC_CATEGORY_MN; }

bool tk_is_mark(uint32_t c)
{
    if (c < 0x300) return false;
    int k = s_cat(c);
    return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}

/* ---------------------------------------------------------------- byte-level alphabet */

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes
 * to 256.. in byte order. */
const uint16_t tk_byte_cp[256] = {
    256, 257, 258, 259, 260, 261, 262, 263, 264, 265, 266, 267, 268, 269, 270, 271,
    272, 273, 274, 275, 276, 277, 278, 279, 280, 281, 282, 283, 284, 285, 286, 287,
    288, 33,  34,  35,  36,  37,  38,  39,  40,  41,  42,  43,  44,  45,  46,  47,
    48,  49,  50,  51,  52,  53,  54,  55,  56,  57,  58,  59,  60,  61,  62,  63,
    64,  65,  66,  67,  68,  69,  70,  71,  72,  73,  74,  75,  76,  77,  78,  79,
    80,  81,  82,  83,  84,  85,  86,  87,  88,  89,  90,  91,  92,  93,  94,  95,
    96,  97,  98,  99,  100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111,
    112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 289,
    290, 291, 292, 293, 294, 295, 296, 297, 298, 299, 300, 301, 302, 303, 304, 305,
    306, 307, 308, 309, 310, 311, 312, 313, 314, 315, 316, 317, 318, 319, 320, 321,
    322, 161, 162, 163, 164, 165, 166, 167, 168, 169, 170, 171, 172, 323, 174, 175,
    176, 177, 178, 179, 180, 181, 182, 183, 184, 185, 186, 187, 188, 189, 190, 191,
    192, 193, 194, 195, 196, 197, 198, 199, 200, 201, 202, 203, 204, 205, 206, 207,
    208, 209, 210, 211, 212, 213, 214, 215, 216, 217, 218, 219, 220, 221, 222, 223,
    224, 225, 226, 227, 228, 229, 230, 231, 232, 233, 234, 235, 236, 237, 238, 239,
    240, 241, 242, 243, 244, 245, 246, 247, 248, 249, 250, 251, 252, 253, 254, 255,
};

int tk_cp_byte(uint32_t cp)
{
    if (cp < 256) {
        if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174) return (int)cp;
        return -1;
    }
    if (cp > 323) return -1;
    /* 256.. are, in order: bytes 0..32, 127..160, 173 */
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;
    if (k < 67) return (int)(127 + k - 33);
    return 173;
}
