#!/usr/bin/env python3
"""Make the tokenizer fixtures with the Hugging Face `tokenizers` library.

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
    /tmp/tokvenv/bin/python tests/tokenizer/gen_fixtures.py [OUT_DIR]

Trains small tokenizers of the styles Strata must read (byte-level BPE with Qwen2's,
GPT-2's and Llama 3's pre-tokenizer regexes; SentencePiece-style BPE with byte fallback,
Llama/Mixtral's normalizer form, the current Mistral form (Metaspace "first", no split) and a
Metaspace form with split pieces; BPE with a continuing-subword prefix
and one with an end-of-word suffix) on tests/tokenizer/prose.txt plus a few multilingual
lines, and writes for each, under OUT_DIR (default tests/tokenizer/fixtures):

    NAME/tokenizer.json   the tokenizer (one with legacy "a b" merges, one with a
                          tokenizer_config.json next to it)
    NAME/expected.json    for every corpus line: ids with and without special tokens, the
                          decodes with and without skip_special_tokens (hex), whether the
                          library round-trips the line; and random id sequences with their
                          decodes
and corpus.json: the test corpus, each line as hex bytes (some are not valid UTF-8; the
reference reads them as bytes.decode("utf-8", "replace")). Deterministic for a given
tokenizers version (recorded in corpus.json).
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "fixtures")

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

MULTI = [
    "中文字符测试，这是一个简单的句子。我们喜欢学习新的语言。",
    "日本語のテキストです。東京は大きな都市です。",
    "한국어 텍스트입니다. 서울은 큰 도시입니다.",
    "Привет мир, как дела? Γειά σου Κόσμε. שלום עולם. مرحبا بالعالم",
    "नमस्ते दुनिया. สวัสดีครับ. Ünïcödé façade naïve café résumé.",
    "def main(argv):\n    for i in range(10):\n        print(i * 2)  # double\n    return 0\n",
    "int main(void) { int x = 42; if (x > 0) { return x; } return -1; }",
    "The year 2024 had 366 days; 3.14159, 2,718,281 and 1e-9 are numbers.",
    "😀 😃 😄 👍 🎉 emoji are fun 🙂",
]

# ---------------------------------------------------------------- corpus

CORPUS = [
    # ASCII prose and code
    "The quick brown fox jumps over the lazy dog.",
    "It's a test: don't, won't, I'll, we've, they're, she'd, I'm, IT'S, DON'T.",
    "This program is free software: you can redistribute it and/or modify it.",
    "def foo(x):\n    return x * 2  # comment\n",
    "for (int i = 0; i < n; i++) { sum += a[i]; }",
    "if x == 1 and y != 2: print(f\"{x!r} -> {y:>8}\")",
    "HTTP://EXAMPLE.COM/path?query=1&x=2#frag user@example.org",
    "CamelCaseIdentifier snake_case_name kebab-case-name __dunder__",
    "ALL CAPS SHOUTING AND Mixed Case 'S 'T 'Re 'VE",
    # spaces, tabs, newlines
    "    indented code with\ttabs\tand  double  spaces",
    "   leading spaces",
    "trailing spaces   ",
    "\t\ttabs only\t",
    "\n\n\nnewlines\n\n",
    "line one\nline two\r\nline three\rend",
    " ",
    "",
    "  \n  \n",
    "a\u00a0b nbsp x\u2003y em-space z\u3000w ideographic a\u180eb mongolian",
    "word    \t   \n   word",
    # digits
    "1234567890",
    "3.14159 and 2,718,281 and 1e-9 and 0x1F",
    "Phone: +1 (555) 012-3456, year 2024, 100%",
    "12345678901234567890123",
    "\u0663\u0664\u0665 Arabic-Indic digits, \u0967\u0968 Devanagari",
    "\u216b roman \u00b2 superscript \u00bd half \u2460 circled",
    # CJK and other scripts
    "中文字符测试",
    "日本語のテキストです。カタカナ ひらがな",
    "한국어 텍스트",
    "混合 mixed 中文 text 和 English",
    "Привет мир! Γειά σου Κόσμε ΣΑΣ. שלום עולם. مرحبا بالعالم",
    "नमस्ते दुनिया สวัสดีครับ",
    "İstanbul ıi Straße ǅ",
    # emoji, ZWJ sequences
    "😀😃😄",
    "👨\u200d👩\u200d👧\u200d👦 family",
    "🏳️\u200d🌈 flag and 👩🏽\u200d💻 coder",
    "👍🏽 skin tone 🇺🇸🇫🇷 flags",
    "emoji😀inside😀words",
    # combining marks
    "e\u0301 (e + combining acute) vs \u00e9",
    "\u00c5 vs A\u030a vs \u212b",
    "\ufb01 ligature \ufb02",
    "Zalgo: Z\u0351\u0308a\u0325l\u0306g\u0323o",
    "n\u0303 vs \u00f1, \u1112\u1161\u11ab jamo",
    "a\u0300\u0301\u0302\u0303\u0304 stacked",
    # invalid UTF-8 (bytes)
    b"bad \xff byte",
    b"\xc3\x28 invalid second byte",
    b"truncated \xe2\x82",
    b"\xed\xa0\x80 surrogate",
    b"\xf0\x9f\x98 partial emoji \xf0\x9f\x98\x80",
    b"\xc0\xaf overlong \xe0\x80\xaf",
    b"\xf8\x88\x80\x80\x80 five-byte",
    b"end \xe2",
    b"\x80\x80\x80 lone continuation",
    # added and special tokens in the middle of text
    "Hello<|endoftext|>world",
    "<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
    "<s>hi</s> and <s> spaced </s>",
    "a<unk>b",
    "use <tool> here and x   <tool>   y",
    "[MASK] is [MASK]ed and a[MASK]b [MASK]",
    "hello w\u00f6rld and wo\u0308rld",
    "<|begin_of_text|>Hi<|eot_id|>",
    "<|sep|>first<|sep|> second",
    "special phrase here and the special phrase",
    "<|tool|>call<|tool|>",
    "[INST] What is 2+2? [/INST] 4</s>[INST]again[/INST]",
    "a  b   c    d        e                        f",
    "</s></s><s>",
    "<|im_start|><|im_end|>",
    # odds and ends
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "a\x00b NUL and \x01\x02\x1b[31m control",
    "\ufeffBOM at start",
    "zero\u200bwidth\u200cjoin\u200dhere",
    "\u2581 literal metaspace \u2581\u2581 and \u0120 G-dot",
    "<0x41> literal byte token text",
    "Ġhello Ċnewline",
    "don't stop 'til 'tis",
]
PROSE = open(os.path.join(HERE, "prose.txt"), encoding="utf-8").read()
_paras = [p.replace("\n", " ") for p in PROSE.split("\n\n") if len(p) > 200]
CORPUS += [_paras[3][:1500], _paras[40][:600] + "\n" + _paras[41][:600], "  ".join(_paras[7:9])[:2000]]


def as_bytes(x):
    return x if isinstance(x, bytes) else x.encode("utf-8")


# ---------------------------------------------------------------- tokenizers

def train_text():
    return [l for l in PROSE.splitlines() if l.strip()] + MULTI * 3


def byte_level(name, regex, post, ignore_merges=False, legacy_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizers.NFC()
    if regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    specials = {"bl_qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                "bl_olmoe": ["<|endoftext|>", "<|padding|>"],
                "bl_llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]}[name]
    tr = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_text(), tr)
    if name == "bl_qwen2":
        tok.add_tokens([AddedToken("<tool>", special=True, lstrip=True, rstrip=True, normalized=False),
                        AddedToken("[MASK]", single_word=True, normalized=False),
                        AddedToken("w\u00f6rld", normalized=True)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    elif name == "bl_olmoe":
        # GPT-NeoX style: runs of spaces are added tokens, matched on the normalized text
        tok.add_tokens([AddedToken(" " * k, normalized=True) for k in (24, 8, 4, 3, 2)])
        tok.post_processor = processors.TemplateProcessing(
            single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", tok.token_to_id("<|endoftext|>"))])
    else:
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
    j = json.loads(tok.to_str())
    if name == "bl_qwen2":  # as Qwen2's file has them
        j["model"]["continuing_subword_prefix"] = ""
        j["model"]["end_of_word_suffix"] = ""
    if legacy_merges:
        j["model"]["merges"] = [a + " " + b for a, b in j["model"]["merges"]]
    return j


def sentencepiece(name):
    """BPE with byte fallback: Llama/Mixtral layout (<unk> <s> </s> <0x00>..<0xFF> first)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tr = trainers.BpeTrainer(vocab_size=600 + 3, special_tokens=["<unk>", "<s>", "</s>"],
                             limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(train_text(), tr)
    j = json.loads(tok.to_str())
    old = j["model"]["vocab"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for t, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    m = j["model"]
    m["vocab"] = vocab
    m["byte_fallback"] = True
    m["fuse_unk"] = True
    j["added_tokens"] = [
        {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))]
    if name == "sp_llama":
        j["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        j["pre_tokenizer"] = None
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
        extra = [("<|tool|>", True, False), ("special phrase", False, True)]
    elif name == "sp_mistral":  # the current Mistral/Mixtral layout: Metaspace "first", no split
        j["normalizer"] = None
        j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                              "split": False}
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
        extra = [("[INST]", True, False), ("[/INST]", True, False)]
    else:  # sp_meta: Metaspace "first", digits split, NFKC
        j["normalizer"] = {"type": "NFKC"}
        j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}
        j["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"},
            {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}
        extra = [("<|sep|>", True, False)]
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    for content, special, normalized in extra:
        j["added_tokens"].append({"id": len(vocab) + len(j["added_tokens"]) - 3, "content": content,
                                  "single_word": False, "lstrip": False, "rstrip": False,
                                  "normalized": normalized, "special": special})
    return j


def prefix_suffix(name):
    """BPE with a continuing-subword prefix (Bert parts) or an end-of-word suffix."""
    if name == "bert_bpe":
        tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=None, lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                 continuing_subword_prefix="##", limit_alphabet=100, show_progress=False)
        tok.train_from_iterator(train_text(), tr)
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
        tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                       ("[CLS]", tok.token_to_id("[CLS]")))
    else:
        tok = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>", fuse_unk=False))
        tok.normalizer = normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(),
                                               normalizers.Lowercase(), normalizers.Strip()])
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                     pre_tokenizers.Punctuation(behavior="isolated"),
                                                     pre_tokenizers.Digits(individual_digits=False)])
        tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                 end_of_word_suffix="</w>", limit_alphabet=80, show_progress=False)
        tok.train_from_iterator(train_text(), tr)
        tok.decoder = decoders.BPEDecoder(suffix="</w>")
        tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")),
                                                          ("<s>", tok.token_to_id("<s>")))
        tok.add_tokens([AddedToken("special phrase", single_word=True, normalized=True),
                        AddedToken("[MASK]", lstrip=True, normalized=False)])
    return json.loads(tok.to_str())


def build_all():
    return {
        "bl_qwen2": byte_level("bl_qwen2", QWEN2, None),
        "bl_olmoe": byte_level("bl_olmoe", None, None, legacy_merges=True),
        "bl_llama3": byte_level("bl_llama3", LLAMA3, None, ignore_merges=True),
        "sp_llama": sentencepiece("sp_llama"),
        "sp_mistral": sentencepiece("sp_mistral"),
        "sp_meta": sentencepiece("sp_meta"),
        "bert_bpe": prefix_suffix("bert_bpe"),
        "suffix_bpe": prefix_suffix("suffix_bpe"),
    }


def expected(tok, lines, rng):
    out = {"lines": [], "random": []}
    for raw in lines:
        text = raw.decode("utf-8", "replace")
        ids = tok.encode(text).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        dec = tok.decode(ids, skip_special_tokens=False)
        dec_skip = tok.decode(ids, skip_special_tokens=True)
        rt = tok.decode(plain, skip_special_tokens=False) == text
        out["lines"].append({"ids": ids, "plain": plain, "dec": dec.encode().hex(),
                             "dec_skip": dec_skip.encode().hex(), "rt": rt})
    n = tok.get_vocab_size(with_added_tokens=True)
    specials = [t.content for t in tok.get_added_tokens_decoder().values()]
    for k in range(60):
        length = rng.randrange(1, 40)
        ids = [rng.randrange(0, n + 3) for _ in range(length)]  # a few unknown ids too
        if k % 3 == 0:  # runs of byte tokens / specials
            ids += [tok.token_to_id(s) for s in specials[:2] if tok.token_to_id(s) is not None]
            ids = ids[::-1]
        out["random"].append({"ids": ids,
                              "dec": tok.decode(ids, skip_special_tokens=False).encode().hex(),
                              "dec_skip": tok.decode(ids, skip_special_tokens=True).encode().hex()})
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = [as_bytes(x) for x in CORPUS]
    built = build_all()
    with open(os.path.join(OUT, "corpus.json"), "w") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "tokenizers": list(built),
                   "lines": [l.hex() for l in lines]}, f, indent=0)
        f.write("\n")
    rng = random.Random(1234)
    for name, j in built.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        tok = Tokenizer.from_file(path)
        if name == "sp_llama":
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump({"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True},
                           "add_bos_token": True, "model_max_length": 4096,
                           "added_tokens_decoder": {"0": {"content": "<unk>", "special": True},
                                                    "1": {"content": "<s>", "special": True},
                                                    "2": {"content": "</s>", "special": True}}},
                          f, indent=1)
                f.write("\n")
        with open(os.path.join(d, "expected.json"), "w") as f:
            json.dump(expected(tok, lines, rng), f, separators=(",", ":"))
            f.write("\n")
        print(name, tok.get_vocab_size(), "tokens")


if __name__ == "__main__":
    main()
