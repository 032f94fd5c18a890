#!/usr/bin/env python3
"""Make the tokenizer fixtures with the Hugging Face `tokenizers` library.

    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
    /tmp/tokvenv/bin/python tests/tokenizer/gen_fixtures.py [--keep] [OUT_DIR]

Trains small tokenizers of the styles Strata must read (byte-level BPE with Qwen2's,
GPT-2's and Llama 3's pre-tokenizer regexes, and gpt-oss's layout with the o200k regex and
the harmony specials; SentencePiece-style BPE with byte fallback,
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
reference reads them as bytes.decode("utf-8", "replace")). The byte-level ones are
deterministic for a given tokenizers version (recorded in corpus.json); the trainers with
limit_alphabet break ties between equally rare characters differently run to run, so --keep
reads every NAME/tokenizer.json already in OUT_DIR instead of training it again and only
writes the expected outputs (what to run after a change to the corpus).
"""
import json
import os
import random
import sys

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
KEEP = "--keep" in sys.argv[1:]
_args = [a for a in sys.argv[1:] if a != "--keep"]
OUT = _args[0] if _args else os.path.join(HERE, "fixtures")

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k_base / o200k_harmony (gpt-oss), as tiktoken_ext/openai_public.py joins it
O200K = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
# gpt-oss's specials (GptOssConverter): the harmony names, <|reserved_N|> between them
HARMONY = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
           "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
           "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>", "<|reserved_200013|>",
           "<|reserved_200014|>", "<|reserved_200015|>", "<|reserved_200016|>", "<|reserved_200017|>",
           "<|endofprompt|>"]

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
# more scripts and shapes for the o200k-style fixture (its pattern treats case and marks apart)
MULTI_O200K = [
    "السلام عليكم ورحمة الله. هذه جملة عربية قصيرة، وفيها أرقام ١٢٣ و٤٥٦.",
    "हिन्दी में एक छोटा वाक्य है। यह परीक्षण के लिए है, और इसमें मात्राएँ हैं।",
    "ภาษาไทยเขียนติดกันโดยไม่มีช่องว่างระหว่างคำ และมีวรรณยุกต์",
    "Ελληνικά: Η ΓΛΩΣΣΑ ΕΊΝΑΙ ΩΡΑΊΑ. Русский: МОСКВА — столица России.",
    "Tiếng Việt có nhiều dấu: Người Việt Nam rất hiếu khách.",
    "HTTPServer XMLHttpRequest getElementById parseJSON IOError McDonald's O'Neill'S",
    "WE'LL SEE. They'RE here, it'S fine; YOU'VE GOT IT, I'D SAY, I'M OK.",
    "path/to/file.txt ./src/*.c https://example.com/a/b?c=d 1/2/3 a//b ,/ ;//",
    "中文，日本語、한국어。混合テキストと English words 与数字 12345。",
    "emoji 👩‍💻 🇯🇵 ✅ 🤔🤔 and marks e\u0301 o\u0308 n\u0303 \u1e9b\u0323",
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
    # the o200k pattern: case runs, marks, contractions after any case, slashes after punctuation
    "HELLO'S WORLD'LL Hello'S hELLO'll McDONALD'S O'NEIL'd",
    "XMLHttpRequest HTTPServer getHTTPResponseCode iPhone eBay ABCdef ABC'S",
    "\u01c4\u01c5\u01c6 titlecase \u01c5ungla \u1f88\u1f89 \u02b0\u02b2 modifier \u3005\u3006",
    "A\u0301B\u0301c\u0301 \u0301\u0301 lone marks \u0915\u094d\u0937 \u0e01\u0e34\u0e48",
    "a/b ./c ../d e// f/ /g .// -/- !/\n?/\r\n,/\n/",
    "x  \r\n\r\n  y\t\r\n\tz \n \n w   \n",
    "\uff11\uff12\uff13\uff14 fullwidth \u0661\u0662\u0663\u0664 1234567 12.345.678",
    "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
    "<|startoftext|><|start|>assistant<|channel|>analysis<|message|>think<|end|><|call|><|constrain|>json",
    "<|reserved_200000|> <|endofprompt|> <|endoftext|>tail",
    # letters and digits newer than PCRE2's / utf8proc's tables (CJK Ext H, Egyptian Ext-A, outlined
    # and Kawi digits): a letter to the library, so the contraction stays whole
    "x\U00031350's \U00013460ABC'S \U0001CCF0\U0001CCF1\U0001CCF2\U0001CCF3 \U00011F50\U00011F51 \U0002EBF0\U0002EBF1!",
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


def o200k_style():
    """gpt-oss's layout (transformers' GptOssConverter) on a small trained vocabulary: BPE with
    ignore_merges, no normalizer, the o200k Split then ByteLevel(use_regex=False), ByteLevel
    decoder and post-processor, the 21 harmony specials right after the vocabulary."""
    tok = Tokenizer(models.BPE(fuse_unk=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tr = trainers.BpeTrainer(vocab_size=3000, special_tokens=[], show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_text() + MULTI_O200K * 3, tr)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in HARMONY])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
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
        "bl_o200k": o200k_style(),
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


def write_corpus(out, names, lines):
    with open(os.path.join(out, "corpus.json"), "w") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "tokenizers": list(names),
                   "lines": [l.hex() for l in lines]}, f, indent=0)
        f.write("\n")


def write_expected(d, tok, lines, rng):
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(expected(tok, lines, rng), f, separators=(",", ":"))
        f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = [as_bytes(x) for x in CORPUS]
    built = build_all()
    write_corpus(OUT, built, lines)
    rng = random.Random(1234)
    for name, j in built.items():
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "tokenizer.json")
        if not (KEEP and os.path.exists(path)):
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
        write_expected(d, tok, lines, rng)
        print(name, tok.get_vocab_size(), "tokens")


if __name__ == "__main__":
    main()
