/* tokenizer.h - Hugging Face tokenizer.json, encoded and decoded id for id like the
 * `tokenizers` library.
 *
 * What is supported (docs/TOKENIZER.md has the full list and the known differences):
 *   model          BPE: merges as "a b" strings or ["a","b"] pairs, unk_token, fuse_unk,
 *                  byte_fallback (<0xNN>), ignore_merges, continuing_subword_prefix,
 *                  end_of_word_suffix (dropout is ignored: encoding is deterministic)
 *   normalizer     NFC NFD NFKC NFKD Lowercase Strip StripAccents Replace Prepend
 *                  BertNormalizer ByteLevel Sequence
 *   pre_tokenizer  ByteLevel Split Metaspace Digits Whitespace WhitespaceSplit Punctuation
 *                  BertPreTokenizer CharDelimiterSplit Sequence
 *   post_processor TemplateProcessing ByteLevel RobertaProcessing BertProcessing Sequence
 *   decoder        ByteLevel Metaspace Replace ByteFallback Fuse Strip BPEDecoder WordPiece
 *                  Sequence
 *   added_tokens   special, single_word, lstrip, rstrip, normalized; matched before the model
 *   truncation, padding (single sequence)
 * Regexes (Split, Replace) are Oniguruma patterns; they run on PCRE2 (UTF + UCP, JIT) after a
 * translation of the escapes whose meaning differs (\s \w \h ...).
 *
 * Input text that is not valid UTF-8 is read as Python's bytes.decode("utf-8", "replace")
 * reads it: each maximal invalid subpart becomes U+FFFD.
 *
 * Threads: a loaded tok_t is immutable. Any number of threads may call tok_encode,
 * tok_decode and the accessors on one tok_t at once (each call borrows a private workspace
 * from a small locked pool). A tok_stream_t belongs to one thread at a time.
 */
#ifndef STRATA_TOKENIZER_H
#define STRATA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strata.h"

typedef struct tok tok_t;
typedef struct tok_stream tok_stream_t;

/* Load PATH: a tokenizer.json file, or a model folder holding one. tokenizer_config.json
 * (next to the file) adds BOS/EOS and any added tokens missing from tokenizer.json; the
 * folder's generation_config.json, else config.json, supplies BOS/EOS ids when it names none.
 * On error returns <0 and eb names the file and the JSON field. */
int tok_load(tok_t **out, const char *path_or_dir, strata_errbuf_t *eb);

/* Load from a tokenizer.json held in memory; `name` is used in error messages. No
 * tokenizer_config.json is read. For tests and fuzzing. */
int tok_load_json(tok_t **out, const char *json, size_t len, const char *name, strata_errbuf_t *eb);

/* Free a tokenizer (NULL is fine). No encode/decode call may be running on it. */
void tok_free(tok_t *tok);

/* Encode len bytes of text. add_special adds what the post-processor adds (as
 * add_special_tokens=True does). On success *ids is a malloc'd array of *n ids (free()
 * it; may be NULL when *n == 0). Returns 0 or <0 (STRATA_ENOMEM; STRATA_EINVAL_INPUT when
 * the tokenizer needs an unk token it does not have; STRATA_ETOOLARGE for len >= 16 MiB or a regex that
 * hits PCRE2's match limit). */
int tok_encode(const tok_t *tok, const char *text, size_t len, bool add_special, int32_t **ids,
               size_t *n);

/* Decode n ids to text, as tokenizers' decode(ids, skip_special_tokens) does. Unknown ids
 * are skipped. On success *text is malloc'd, NUL-terminated, valid UTF-8, *len bytes long
 * (free() it). Returns 0 or <0. */
int tok_decode(const tok_t *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
               size_t *len);

/* Ids of the BOS / EOS tokens: tokenizer_config.json's, else the first id the tokenizer knows of
 * generation_config.json's bos_token_id / eos_token_id, else of config.json's; -1 if unknown.
 * One id: the set of ids that end a generation is the model's (model_config_t.eos_ids). */
int32_t tok_bos(const tok_t *tok);
int32_t tok_eos(const tok_t *tok);
/* Largest id the tokenizer can produce or decode, plus one (model vocab and added tokens). */
size_t tok_vocab_size(const tok_t *tok);
/* The token string of an id (added tokens first, then the model vocab), NULL if none.
 * *len gets its length. The pointer lives as long as tok. */
const char *tok_id_to_token(const tok_t *tok, int32_t id, size_t *len);
/* The id of a token string (added tokens first, then the model vocab), -1 if none. */
int32_t tok_token_to_id(const tok_t *tok, const char *s, size_t len);
/* Whether id is an added token marked special (skipped by skip_special decoding). */
bool tok_is_special(const tok_t *tok, int32_t id);

/* Streaming decoder: push ids one at a time and get back only text that is final. The
 * concatenation of everything returned by push and flush equals tok_decode() of all the
 * pushed ids, every returned piece is valid UTF-8 on its own, and no returned text is ever
 * revised. Text may be held back while it can still change (an incomplete UTF-8 sequence, a
 * byte-fallback run, a trailing space a Strip decoder may remove). */
int tok_stream_new(const tok_t *tok, bool skip_special, tok_stream_t **out);
/* Push one id. *text / *len receive the newly final bytes (possibly zero); the pointer is
 * valid until the next call on st. Returns 0 or <0 (STRATA_ENOMEM). */
int tok_stream_push(tok_stream_t *st, int32_t id, const char **text, size_t *len);
/* End of stream: returns the rest of the text the same way, and resets st for reuse. */
int tok_stream_flush(tok_stream_t *st, const char **text, size_t *len);
/* Free a stream (NULL is fine). */
void tok_stream_free(tok_stream_t *st);

#endif
