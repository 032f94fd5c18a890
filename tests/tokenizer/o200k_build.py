#!/usr/bin/env python3
"""Build gpt-oss's tokenizer.json (o200k_harmony) from the o200k_base ranks a PyPI package ships.

    /tmp/tokvenv/bin/pip install tokenizers
    /tmp/tokvenv/bin/python tests/tokenizer/o200k_build.py [--wheel W | --tiktoken F] [--expected] [OUT]

gpt-oss's tokenizer.json (27 MB, not committed) is what transformers' GptOssConverter
(models/gpt_oss/convert_gpt_oss_weights_to_hf.py) makes from tiktoken's o200k_base: the byte-level
vocabulary of the 199,998 ranks, the merges read off the ranks (every split of a token into two
tokens, ordered by the token's rank, then by the two parts' ranks: 446,189 of them), BPE with
ignore_merges, no normalizer, the o200k pattern as a Split(Isolated) then ByteLevel(use_regex=False),
a ByteLevel decoder and post-processor, and the harmony specials 199998..200018 (the named ones and
<|reserved_N|> between them, <|endofprompt|> at 200018) as special added tokens. The model's
embedding has 201,088 rows; ids 200019..201087 are in tiktoken's o200k_harmony but not in the
tokenizer.json.

The ranks come from the quicktok-v1 wheel (data/o200k.vocab: u32 count, then u16 length, bytes,
u32 rank), fetched with `pip download` unless --wheel or --tiktoken (a .tiktoken file) is given.
They are written back as o200k_base.tiktoken and must hash to the sha256 that tiktoken's
openai_public.py expects of OpenAI's published file, so what is built does not depend on the
package that carried it.

Writes OUT/o200k_harmony/tokenizer.json (default OUT: tests/tokenizer/o200k, where the file is
git-ignored). test_tokenizer then checks it against OUT/o200k_harmony/expected.json, and
test_tok_corpus against the corpus hashes; both tests are skipped while the file is absent.
With --expected it also rewrites those expected outputs (the library's, on the built file):
OUT/corpus.json, OUT/o200k_harmony/expected.json and the o200k_harmony ids in
tests/tokenizer/split/expected.json.
"""
import argparse
import base64
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_fixtures as gf  # noqa: E402  (O200K: the pattern, HARMONY: the specials, the corpus)
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"  # tiktoken_ext/openai_public.py
WHEEL = "quicktok-v1==0.4.0"

# GptOssConverter's special_tokens_map, then <|reserved_k|> for the free ids up to 200017
HARMONY = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
           "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008,
           "<|call|>": 200012, "<|endofprompt|>": 200018}


def harmony_specials():
    m = dict(HARMONY)
    for k in range(199999, 200018):
        if k not in m.values():
            m.setdefault("<|reserved_%d|>" % k, k)
    out = [t for t, _ in sorted(m.items(), key=lambda kv: kv[1])]
    assert out == gf.HARMONY
    return out


def ranks_from_wheel(path):
    with zipfile.ZipFile(path) as z:
        d = z.read("quicktok/data/o200k.vocab")
    n, = struct.unpack_from("<I", d, 0)
    o, ranks = 4, {}
    for _ in range(n):
        ln, = struct.unpack_from("<H", d, o)
        tok = d[o + 2:o + 2 + ln]
        r, = struct.unpack_from("<I", d, o + 2 + ln)
        o += 6 + ln
        ranks[tok] = r
    if o != len(d):
        sys.exit("%s: o200k.vocab has %d trailing bytes" % (path, len(d) - o))
    return ranks


def ranks_from_tiktoken(path):
    ranks = {}
    for line in open(path, "rb"):
        if line.strip():
            t, r = line.split()
            ranks[base64.b64decode(t)] = int(r)
    return ranks


def tiktoken_bytes(ranks):
    return b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n"
                    for t, r in sorted(ranks.items(), key=lambda kv: kv[1]))


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def vocab_merges(ranks):
    """TikTokenConverter.extract_vocab_merges_from_model, as transformers has it."""
    enc = bytes_to_unicode()
    s = lambda b: "".join(enc[x] for x in b)  # noqa: E731
    vocab, merges = {}, []
    for tok, rank in ranks.items():
        vocab[s(tok)] = rank
        if len(tok) == 1:
            continue
        local = [(tok[:i], tok[i:], rank) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        local.sort(key=lambda x: (ranks[x[0]], ranks[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda v: v[2])
    return vocab, [(s(a), s(b)) for a, b, _ in merges]


def build(ranks):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    vocab, merges = vocab_merges(ranks)
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tok.model.ignore_merges = True
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(gf.O200K), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in harmony_specials()])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, len(merges)


def check_pattern():
    """gen_fixtures.O200K against tiktoken's own pattern, when tiktoken is installed."""
    try:
        from tiktoken_ext import openai_public
    except ImportError:
        return
    src = open(openai_public.__file__, encoding="utf-8").read()  # it joins the parts with "|"
    for part in gf.O200K.split("|"):
        if part not in src:
            sys.exit("the o200k pattern differs from tiktoken's: %r not in %s" % (part, openai_public.__file__))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(HERE, "o200k"))
    ap.add_argument("--wheel")
    ap.add_argument("--tiktoken")
    ap.add_argument("--expected", action="store_true")
    a = ap.parse_args()
    check_pattern()
    if a.tiktoken:
        ranks = ranks_from_tiktoken(a.tiktoken)
    else:
        wheel = a.wheel
        if not wheel:
            tmp = tempfile.mkdtemp()
            subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                                   "--python-version", "3.11", "--platform", "manylinux2014_x86_64",
                                   "-d", tmp, WHEEL])
            wheel = os.path.join(tmp, [f for f in os.listdir(tmp) if f.endswith(".whl")][0])
        ranks = ranks_from_wheel(wheel)
    raw = tiktoken_bytes(ranks)
    digest = hashlib.sha256(raw).hexdigest()
    if digest != O200K_SHA256:
        sys.exit("the ranks hash to %s, not o200k_base's %s" % (digest, O200K_SHA256))
    tok, nmerges = build(ranks)
    d = os.path.join(a.out, "o200k_harmony")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    print("%s: %d ranks (sha256 %s), %d merges, %d tokens" % (path, len(ranks), digest[:16], nmerges,
                                                               tok.get_vocab_size(with_added_tokens=True)))
    if a.expected:
        import random

        import gen_split_corpus as gs
        from tokenizers import Tokenizer
        lines = [gf.as_bytes(x) for x in gf.CORPUS]
        with open(os.path.join(a.out, "corpus.json"), "w") as f:
            json.dump({"tokenizers_version": gf.tokenizers.__version__, "tokenizers": ["o200k_harmony"],
                       "optional": "o200k_build.py", "lines": [l.hex() for l in lines]}, f, indent=0)
            f.write("\n")
        tok = Tokenizer.from_file(path)
        gf.write_expected(d, tok, lines, random.Random(1234))
        gs.update_ids("o200k_harmony", tok)


if __name__ == "__main__":
    main()
