/* tok_int.h - internals of the tokenizer, shared by common/tok_*.c and common/tokenizer.c.
 * Nothing outside those files includes this. */
#ifndef STRATA_TOK_INT_H
#define STRATA_TOK_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/tokenizer.h"

/* Largest id we accept in a file; bounds the id -> token table. */
#define TK_MAX_ID (1u << 24)

/* ---------------------------------------------------------------- growable byte buffer */
typedef struct {
    char *p;    /* [cap] bytes, p[n] kept 0 when there is room */
    size_t n, cap;
} tk_buf_t;

int tk_buf_reserve(tk_buf_t *b, size_t extra);
int tk_buf_put(tk_buf_t *b, const void *p, size_t n);
void tk_buf_free(tk_buf_t *b);

/* ---------------------------------------------------------------- string -> int32 map */
typedef struct {
    char *arena;        /* [arena_n] every key back to back */
    size_t arena_n, arena_cap;
    uint32_t *koff;     /* [n] key offset into arena */
    uint32_t *klen;     /* [n] key length, bytes */
    uint32_t *khash;    /* [n] key hash */
    int32_t *val;       /* [n] value */
    uint32_t n, ncap;
    uint32_t *slot;     /* [scap] entry index + 1, 0 = empty; scap a power of two */
    uint32_t scap;
} tk_map_t;

/* A fast 64-bit hash of n bytes (never 0). */
static inline uint64_t tk_hash64(const void *p, size_t n)
{
    const unsigned char *s = (const unsigned char *)p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t v;
        __builtin_memcpy(&v, s, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    if (n >= 4) {
        uint32_t a, b;
        __builtin_memcpy(&a, s, 4);
        __builtin_memcpy(&b, s + n - 4, 4);
        v = ((uint64_t)a << 32) | b;
    } else if (n) {
        v = ((uint64_t)s[0] << 16) | ((uint64_t)s[n >> 1] << 8) | s[n - 1];
    }
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 32;
    return h ? h : 1;
}
/* Insert or overwrite; returns entry index or <0. */
int tk_map_set(tk_map_t *m, const char *k, size_t n, int32_t v);
/* Entry index of k, or -1. */
int64_t tk_map_find(const tk_map_t *m, const char *k, size_t n);
static inline int32_t tk_map_get(const tk_map_t *m, const char *k, size_t n, int32_t dflt)
{
    int64_t e = tk_map_find(m, k, n);
    return e < 0 ? dflt : m->val[e];
}
void tk_map_free(tk_map_t *m);

/* ---------------------------------------------------------------- pair -> merge map */
typedef struct {
    uint64_t *key;      /* [cap] (a << 32 | b), UINT64_MAX = empty */
    uint32_t *rank;     /* [cap] merge rank (line number) */
    int32_t *new_id;    /* [cap] id of the merged token */
    uint32_t cap, n;    /* cap a power of two */
} tk_pairmap_t;

/* Insert or overwrite (a, b) -> (rank, new_id). */
int tk_pair_set(tk_pairmap_t *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
/* Find (a, b); returns false when absent. */
static inline bool tk_pair_get(const tk_pairmap_t *m, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id)
{
    if (!m->cap) return false;
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    uint32_t mask = m->cap - 1, i = (uint32_t)(h >> 32) & mask;
    for (;;) {
        uint64_t kk = m->key[i];
        if (kk == k) {
            *rank = m->rank[i];
            *new_id = m->new_id[i];
            return true;
        }
        if (kk == UINT64_MAX) return false;
        i = (i + 1) & mask;
    }
}
void tk_pair_free(tk_pairmap_t *m);

/* ---------------------------------------------------------------- regex (Oniguruma semantics) */
/* Pre-tokenizer regexes common enough to get a hand-written matcher (same matches as the
 * regex; tests/tokenizer/test_tok_regex.c checks them against PCRE2). */
enum { RE_PCRE = 0, RE_GPT2, RE_CL100K_N1 /* Qwen2 */, RE_CL100K_N3 /* Llama 3, cl100k */ };

typedef struct {
    pcre2_code *code;
    bool jit;
    int fast;            /* RE_* : which matcher find_matches uses */
    char *lit;           /* a non-empty literal pattern: found with memmem, not PCRE2 */
    size_t lit_n;
} tk_re_t;

/* One piece of a find_matches() result: [s, e) of the subject, whether the pattern matched. */
typedef struct {
    uint32_t s, e;
    bool m;
} tk_match_t;

typedef struct {
    tk_match_t *v;
    size_t n, cap;
} tk_matches_t;

/* Append the match [s, e) (m: matched, else the text between matches). 0 or STRATA_ENOMEM. */
static inline int tk_mt_push(tk_matches_t *mt, uint32_t s, uint32_t e, bool m)
{
    if (__builtin_expect(mt->n == mt->cap, 0) && strata_grow(&mt->v, &mt->cap, mt->n, sizeof *mt->v, 64))
        return STRATA_ENOMEM;
    mt->v[mt->n++] = (tk_match_t){s, e, m};
    return 0;
}

/* Compile an Oniguruma regex (literal: the pattern is a plain string). On error fills msg. */
int tk_re_compile(tk_re_t *re, const char *pat, size_t n, bool literal, char *msg, size_t msgcap);
/* The GPT-2 pattern (ByteLevel's use_regex). */
extern const char tk_re_gpt2[];
void tk_re_free(tk_re_t *re);

/* ---------------------------------------------------------------- components */
enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };

typedef enum {
    NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_STRIP, NORM_STRIP_ACCENTS,
    NORM_REPLACE, NORM_PREPEND, NORM_BERT, NORM_BYTELEVEL,
} tk_norm_kind_t;

typedef struct {
    tk_norm_kind_t kind;
    bool left, right;                 /* Strip */
    tk_re_t re;                       /* Replace */
    char *str;                        /* Replace content / Prepend text, NUL-terminated */
    size_t str_n;
    bool clean_text, chinese, strip_accents, lowercase; /* BertNormalizer */
} tk_norm_t;

typedef enum {
    PT_BYTELEVEL, PT_SPLIT, PT_METASPACE, PT_DIGITS, PT_WHITESPACE, PT_WHITESPACE_SPLIT,
    PT_PUNCTUATION, PT_BERT, PT_CHAR_DELIMITER,
} tk_pt_kind_t;

typedef struct {
    tk_pt_kind_t kind;
    bool add_prefix_space, use_regex; /* ByteLevel */
    tk_re_t re;                       /* Split; ByteLevel and Whitespace use the shared ones */
    int behavior;                     /* SPLIT_* */
    bool invert;
    uint32_t repl_cp;                 /* Metaspace replacement; CharDelimiterSplit delimiter */
    char repl[4];
    int repl_n;
    int prepend_scheme;               /* PREPEND_* */
    bool split;                       /* Metaspace */
    bool individual_digits;
} tk_pt_t;

typedef enum {
    DEC_BYTELEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP,
    DEC_BPE, DEC_WORDPIECE,
} tk_dec_kind_t;

typedef struct {
    tk_dec_kind_t kind;
    tk_re_t re;                       /* Replace */
    bool literal;                     /* Replace pattern was a String */
    char *pat;                        /* Replace String pattern, NUL-terminated */
    size_t pat_n;
    char *str;                        /* Replace content, BPEDecoder suffix, WordPiece prefix */
    size_t str_n;
    uint32_t cp;                      /* Strip content, Metaspace replacement */
    size_t start, stop;               /* Strip */
    int prepend_scheme;               /* Metaspace */
    bool cleanup;                     /* WordPiece */
} tk_dec_t;

typedef enum { PP_TEMPLATE, PP_BYTELEVEL, PP_ROBERTA, PP_BERT } tk_pp_kind_t;

/* One piece of a template: sequence A, sequence B, or special ids. */
typedef struct {
    int what;         /* 0 = $A, 1 = $B, 2 = special token */
    int32_t *ids;     /* [n] special token ids */
    size_t n;
} tk_tpl_item_t;

/* A post-processor. tokenizers runs them on a list of encodings (one per input sequence);
 * a template emits one encoding per piece, so a later processor of a Sequence can see two
 * and take its pair template. */
typedef struct {
    tk_pp_kind_t kind;
    tk_tpl_item_t *single, *pair;  /* [nsingle] / [npair] TemplateProcessing */
    size_t nsingle, npair;
    int32_t cls, sep;              /* RobertaProcessing / BertProcessing */
    size_t n_added;                /* special ids it adds to one sequence (truncation room) */
} tk_pp_t;

typedef struct {
    char *content;    /* NUL-terminated */
    size_t len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
    char *dec;        /* what id_to_token gives: the normalized content when normalized, else
                       * NULL (= content); byid[] entries only */
    size_t dec_len;
} tk_added_t;

/* Byte trie over added-token patterns, for leftmost-longest matching. */
typedef struct {
    struct tk_trie_node {
        int32_t term;    /* added id that ends here, -1 none */
        int32_t child;   /* first child node, -1 none */
        int32_t sib;     /* next sibling node, -1 none */
        uint8_t byte;    /* byte on the edge into this node */
    } *node;             /* [nnode]; node 0 is the root */
    uint32_t nnode, cap;
    int32_t root[256];   /* child of the root per byte, -1 none */
    uint8_t first[256];  /* 1 for bytes that start a pattern */
    int nfirst;          /* how many distinct first bytes */
    uint8_t first1;      /* the first byte when nfirst == 1 */
    uint8_t firsts[4];   /* the first bytes when nfirst <= 4 */
} tk_trie_t;

typedef struct {
    tk_map_t vocab;          /* token -> id */
    tk_pairmap_t merges;
    int32_t unk_id;          /* -1 no unk_token; -2 unk_token set but not in vocab */
    char *unk_token;
    char *prefix, *suffix;   /* continuing_subword_prefix / end_of_word_suffix or NULL */
    size_t prefix_n, suffix_n;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_id[256];    /* "<0xNN>" ids, -1 when missing */
    int32_t *cp_id;          /* [TK_CP_FAST] id of the one-char token for small code points */
    int32_t byte_sym[256];   /* id of the one-char token of byte b's byte-level char, -1 none */
    /* Char pairs that occur inside some vocab token ((cp1 << 32) | cp2, value 1). A long piece
     * may be cut between two in-vocab chars that form no such pair: no merge can cross there,
     * so BPE of the parts equals BPE of the whole. Built only when pieces can be long. */
    tk_pairmap_t joinable;
    bool can_chunk;
} tk_bpe_t;

#define TK_CP_FAST 0x10000 /* the BMP: 256 KiB per tokenizer */

struct tk_ws;

struct tok {
    char name[256];          /* file name for messages */
    tk_bpe_t bpe;
    tk_norm_t *norm;         /* [nnorm] flattened Sequence */
    size_t nnorm;
    tk_pt_t *pt;             /* [npt] flattened Sequence */
    size_t npt;
    tk_dec_t *dec;           /* [ndec] flattened Sequence */
    size_t ndec;
    bool has_decoder;
    tk_pp_t *pp;             /* [npp] flattened Sequence */
    size_t npp;

    /* Added tokens, as tokenizers' AddedVocabulary holds them. */
    tk_added_t *spec;        /* [nspec] special_tokens list, in insertion order */
    tk_added_t *classic;     /* [nclassic] added_tokens list (non-special), in order */
    size_t nspec, nclassic, capspec, capclassic;
    tk_added_t *byid;        /* [nbyid] latest token given each added id */
    size_t nbyid, capbyid;
    tk_map_t added_ids;      /* content -> added id */
    tk_pairmap_t byid_idx;   /* (added id, 0) -> byid[] index (rank field) */
    int32_t max_added_id;    /* -1 while there is none */
    tk_map_t special_set;    /* contents of special tokens -> 1 */
    tk_trie_t trie_raw;      /* patterns of tokens with normalized=false */
    tk_trie_t trie_norm;     /* normalized patterns of tokens with normalized=true */

    /* id -> token string */
    int32_t *id_vocab;       /* [id_cap] bpe.vocab entry or -1 */
    int32_t *id_added;       /* [id_cap] byid[] index or -1 */
    uint8_t *id_special;     /* [id_cap] 1 when skip_special decoding drops the id */
    uint32_t id_cap;

    bool track_align;        /* a Metaspace pre-tokenizer uses prepend_scheme "first" */
    bool bl_last;            /* the last pre-tokenizer is ByteLevel and BPE has no prefix/suffix:
                              * pieces stay raw bytes, BPE maps them itself (byte_sym) */
    bool norm_unicode_only;  /* every normalizer is NFC/NFD/NFKC/NFKD */
    uint32_t norm_stable_below; /* ... and chars below this code point never change */
    tk_re_t re_bytelevel;    /* GPT-2 regex of the ByteLevel pre-tokenizer */

    /* truncation / padding (single sequence) */
    bool trunc;
    size_t trunc_max;
    bool trunc_left;
    bool pad;
    size_t pad_fixed;        /* 0 = batch longest */
    size_t pad_multiple;
    bool pad_left;
    int32_t pad_id;

    int32_t bos, eos;

    struct tk_pool {
        pthread_mutex_t mu;
        struct tk_ws *free;  /* idle workspaces, reused by later calls */
    } *pool;
};

/* ---------------------------------------------------------------- unicode helpers */
/* Decode one UTF-8 char of valid text at p (n bytes left); *len gets its length. */
static inline uint32_t tk_utf8_dec(const unsigned char *p, size_t n, int *len)
{
    uint32_t c = p[0];
    if (c < 0x80 || n < 2) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return ((c & 0x1F) << 6) | (p[1] & 0x3F); }
    if (c < 0xF0 || n < 4) {
        *len = 3;
        return ((c & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    }
    *len = 4;
    return ((c & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) | ((uint32_t)(p[2] & 0x3F) << 6) |
           (p[3] & 0x3F);
}
static inline int tk_utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
/* Encode cp into out (4 bytes room); returns length. */
int tk_utf8_enc(uint32_t cp, char *out);
/* Length of the longest prefix of p[0..n) that is valid UTF-8. */
size_t tk_utf8_valid_prefix(const unsigned char *p, size_t n);
/* Length of the longest all-ASCII prefix of p[0..n). */
static inline size_t tk_ascii_prefix(const unsigned char *p, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        __builtin_memcpy(&v, p + i, 8);
        if (v & 0x8080808080808080ull) break;
    }
    while (i < n && p[i] < 0x80) i++;
    return i;
}
/* Length of the maximal subpart at p (a valid char or the bytes an invalid sequence spans,
 * as Python and Rust's from_utf8_lossy count them); *valid says which. n >= 1. When the
 * sequence is a proper prefix of a valid char cut by the end of the buffer, *incomplete. */
size_t tk_utf8_subpart(const unsigned char *p, size_t n, bool *valid, bool *incomplete);
/* Append the lossy UTF-8 reading of p[0..n) to out. */
int tk_utf8_lossy(tk_buf_t *out, const unsigned char *p, size_t n);

bool tk_is_whitespace(uint32_t cp);   /* Rust char::is_whitespace (White_Space) */
bool tk_is_numeric(uint32_t cp);      /* Rust char::is_numeric (N*) */
bool tk_is_punct(uint32_t cp);        /* ASCII punctuation or P* */
bool tk_is_word(uint32_t cp);         /* Rust regex \w */
bool tk_is_mn(uint32_t cp);           /* Mn */
bool tk_is_mark(uint32_t cp);         /* M* */

/* The byte-level alphabet: byte -> code point, and the inverse (-1 when not in it). */
extern const uint16_t tk_byte_cp[256];
int tk_cp_byte(uint32_t cp);

/* ---------------------------------------------------------------- encode pipeline */
typedef struct {
    uint32_t off, len;   /* byte range in the current text (tk_ws_t.t[ti]) */
    int32_t id;          /* >= 0: an added token, final; -1: text still to process */
} tk_split_t;

typedef struct {
    tk_split_t *v;
    size_t n, cap;
} tk_splits_t;

/* A normalized string: text plus alignment (al NULL / untouched when untracked). */
typedef struct {
    tk_buf_t s;
    uint32_t *al;        /* [alcap] original byte offset of each byte of s */
    size_t alcap;
    bool track;
    uint32_t base;       /* original offset of the segment start ("(0, 0)" in tokenizers) */
} tk_nstr_t;

/* One cached piece. Keys of up to 16 bytes and results of one id live in the entry itself;
 * longer ones in cache_arena. */
typedef struct {
    uint64_t h;            /* hash of the key; 0 = empty slot */
    uint16_t klen;         /* key length, bytes */
    uint16_t nids;         /* ids in the result */
    int32_t id0;           /* the result when nids == 1 */
    uint32_t koff;         /* key in cache_arena when klen > 16 */
    uint32_t voff;         /* ids (int32) in cache_arena when nids > 1, byte offset */
    char key[16];          /* the key when klen <= 16 */
} tk_cache_ent_t;

typedef struct tk_ws {
    struct tk_ws *next;
    tk_nstr_t t[2];          /* current and next text of the pre-tokenized string */
    tk_splits_t sl[2];       /* current and next split list */
    int ti, si;              /* which of t[] / sl[] is current */
    tk_nstr_t n1, n3;        /* one segment being normalized, and the normalizer's output */
    tk_matches_t mt, mt2, mt3; /* find_matches results; split-behavior scratch; Bert scratch */
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *jst;
    /* BPE scratch */
    struct tk_sym { int32_t id; int32_t prev, next; uint32_t len; } *sym;
    size_t nsym_cap;
    struct tk_heap { uint32_t rank; uint32_t pos; int32_t new_id; } *heap;
    size_t heap_cap;
    tk_buf_t tmp, tmp2;
    bool raw_bytes;          /* the current text splits are raw bytes (see tok_t.bl_last) */
    /* word cache: piece bytes -> ids */
    tk_cache_ent_t *cache;   /* [cache_cap] h == 0 empty */
    uint32_t cache_cap, cache_n;
    tk_buf_t cache_arena;
    /* output */
    int32_t *ids;
    size_t nids, ids_cap;
    int32_t *pp_ids[2];      /* post-processing: the encodings' ids back to back */
    size_t pp_cap[2];
} tk_ws_t;

tk_ws_t *tk_ws_get(const tok_t *tok);
void tk_ws_put(const tok_t *tok, tk_ws_t *ws);
void tk_ws_free(tk_ws_t *ws);

/* Run regex over subject (valid UTF-8) with Oniguruma's find_iter semantics and fill mt with
 * the whole-subject cover: matches and the gaps between them (tokenizers' find_matches). */
int tk_re_find_matches(tk_ws_t *ws, const tk_re_t *re, const char *subj, size_t n, tk_matches_t *mt);

/* Apply the normalizer chain to ns in place (using ws scratch). */
int tk_normalize(const tok_t *tok, tk_ws_t *ws, tk_nstr_t *ns);
/* Normalize a plain string with the chain (added-token patterns); result in out. */
int tk_normalize_str(const tok_t *tok, const char *s, size_t n, tk_buf_t *out);

int tk_nstr_reserve(tk_nstr_t *ns, size_t extra);
void tk_nstr_free(tk_nstr_t *ns);

/* Load-time helpers (tok_load.c) used by tokenizer.c. */
/* General category ("Lo", "Nd", ...) of a code point that PCRE2's and utf8proc's older Unicode
 * tables leave unassigned but the tokenizers library's Unicode 16.0 assigns, else NULL
 * (tok_regex.c, generated by tests/tokenizer/gen_ucd_table.py). */
const char *tk_ucd_new_cat(uint32_t c);
int tk_parse_tokenizer(tok_t *tok, const char *json, size_t len, strata_errbuf_t *eb);
int tk_add_token(tok_t *tok, const tk_added_t *t);
int tk_build_added(tok_t *tok);
void tk_release(tok_t *tok);

/* Decode helpers (tok_decode.c). */
int tk_decode_tokens(const tok_t *tok, const char *const *tok_s, const size_t *tok_n, size_t n,
                     tk_buf_t *out);

#endif
