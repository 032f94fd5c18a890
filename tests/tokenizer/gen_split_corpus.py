#!/usr/bin/env python3
"""A large corpus split by the `tokenizers` library, for test_tok_corpus.

    /tmp/tokvenv/bin/python tests/tokenizer/gen_split_corpus.py          # write split/
    /tmp/tokvenv/bin/python tests/tokenizer/gen_split_corpus.py --show N # the library's pieces of record N

Writes tests/tokenizer/split/:
    corpus.txt.gz   about 1.1 MB of UTF-8 text in records separated by NUL bytes: the prose of
                    prose.txt, a copy of the repository's documents and of some of its C sources,
                    and generated text drawn from every general category the o200k pattern tells
                    apart (Lu Lt Lm Lo Ll M N, combining marks, CJK, Arabic, Devanagari, Thai,
                    Hangul, emoji with ZWJ and skin tones), digit runs of several scripts,
                    contractions in every case ('S 'LL 'rE, also after CJK and marks), CRLF, lone
                    CR, tabs, trailing spaces, the Unicode spaces, slashes and newlines after
                    punctuation, and code points unassigned in Python's Unicode tables
    expected.json   per record, a 64-bit FNV-1a hash of what the library gives:
                    splits.NAME: Split(Regex(pattern), "isolated").pre_tokenize_str(record), the
                      pieces' [start, end) byte offsets as little-endian u32 pairs, for the o200k,
                      Qwen2 and Llama 3 patterns;
                    ids.NAME: Tokenizer.encode(record, add_special_tokens=False).ids as
                      little-endian i32, for fixtures/bl_o200k and (when o200k_build.py has built
                      it) the real o200k_harmony.
The hashes are the library's; Strata only recomputes them in test_tok_corpus.c.
"""
import gzip
import hashlib
import json
import os
import random
import struct
import sys
import unicodedata

import tokenizers
from tokenizers import Regex, Tokenizer, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(HERE, "split")
sys.path.insert(0, HERE)
import gen_fixtures as gf  # noqa: E402

PATTERNS = {"o200k": gf.O200K, "qwen2": gf.QWEN2, "llama3": gf.LLAMA3}
TOKENIZERS = {"bl_o200k": os.path.join(HERE, "fixtures", "bl_o200k", "tokenizer.json"),
              "o200k_harmony": os.path.join(HERE, "o200k", "o200k_harmony", "tokenizer.json")}
DOCS = ["README.md", "ARCHITECTURE.md", "docs"]
CODE = ["common/tok_encode.c", "common/tok_load.c", "common/tok_regex.c", "common/tok_decode.c",
        "common/tok_norm.c", "common/tok_util.c", "common/tokenizer.h", "tests/tokenizer/gen_fixtures.py"]
SEED = 20250805


def fnv64(b):
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# ---------------------------------------------------------------- the text

def chunks(text, size):
    """Records of about size chars, cut at line ends."""
    out, cur = [], []
    n = 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        n += len(line)
        if n >= size:
            out.append("".join(cur))
            cur, n = [], 0
    if cur:
        out.append("".join(cur))
    return out


def repo_text():
    docs, code = [], []
    for d in DOCS:
        p = os.path.join(ROOT, d)
        files = [p] if os.path.isfile(p) else sorted(
            os.path.join(r, f) for r, _, fs in os.walk(p) for f in fs if f.endswith(".md"))
        docs += [open(f, encoding="utf-8").read() for f in files]
    for c in CODE:
        code.append(open(os.path.join(ROOT, c), encoding="utf-8").read())
    return docs, code


def pools():
    cats = {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000 or cp == 0:
            continue
        cats.setdefault(unicodedata.category(chr(cp)), []).append(chr(cp))
    return cats


SPACES = [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\t\n", "   \r\n", "\x0b", "\x0c",
          "\x85", "\xa0", "\u1680", "\u2000", "\u2003", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f",
          "\u205f", "\u3000", "\u180e", "\u200b", "\ufeff", " \u3000 "]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'Re",
                "'rE", "'Ve", "'vE", "'Ll", "'lL", "\u2019s", "'", "''", "'x", "'\u017f", "'\u212a"]
PUNCT = [".", ",", "!", "?", ";", ":", "-", "--", "...", "(", ")", "[", "]", "{", "}", "<", ">", "/", "//",
         "\\", "|", "\"", "#", "$", "%", "&", "*", "+", "=", "@", "^", "_", "`", "~", "\u2014", "\u00ab", "\u00bb",
         "\u3002", "\u3001", "\uff0c", "\u060c", "\u0964", "./", "?/", "!/\n", ")/\r\n", "*/", "/*", "->", "=>",
         "::", "&&", "||", "#!/", "https://", ".//", "/\r", "\u00a9", "\u2122", "\u20ac", "\u00b0"]
SCRIPTS = {  # (first, last) code point ranges of letters and their marks
    "cjk": [(0x4E00, 0x9FFF)], "kana": [(0x3041, 0x3096), (0x30A1, 0x30FA)], "hangul": [(0xAC00, 0xD7A3)],
    "arabic": [(0x0621, 0x064A), (0x064B, 0x0652)], "devanagari": [(0x0905, 0x0939), (0x093E, 0x094D)],
    "thai": [(0x0E01, 0x0E30), (0x0E31, 0x0E3A), (0x0E47, 0x0E4E)], "hebrew": [(0x05D0, 0x05EA), (0x05B0, 0x05BD)],
    "cyrillic": [(0x0410, 0x044F)], "greek": [(0x0391, 0x03A9), (0x03B1, 0x03C9), (0x1F00, 0x1FFC)],
    "latin": [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xFF), (0x100, 0x24F)],
}
EMOJI = ["\U0001F600", "\U0001F44D", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467",
         "\U0001F1FA\U0001F1F8", "\u2764\ufe0f", "\U0001F3F3\ufe0f\u200d\U0001F308", "\u2705", "\U0001F914",
         "\U0001F9D1\U0001F3FF\u200d\U0001F52C", "#\ufe0f\u20e3", "\u263a", "\U0001FAE0", "\U0001F408\u200d\u2b1b"]
DIGITS = ["0123456789", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669",
          "\u0966\u0967\u0968\u0969\u096a\u096b\u096c\u096d\u096e\u096f", "\uff10\uff11\uff12\uff13\uff14\uff15",
          "\u0e50\u0e51\u0e52\u0e53", "\u00b2\u00b3\u00b9\u00bc\u00bd\u00be", "\u2160\u2161\u2162\u216b",
          "\u2460\u2461\u2462", "\U0001D7CE\U0001D7CF", "\u3007\u4e00"]


def gen_record(rng, cats):
    def one(cat):
        return rng.choice(cats[cat])

    def script_word():
        rs = SCRIPTS[rng.choice(list(SCRIPTS))]
        return "".join(chr(rng.randint(*rng.choice(rs))) for _ in range(rng.randint(1, 8)))

    def cased_word():
        # runs of upper / title / modifier / other letters and marks, then lower ones
        shape = rng.choice(["Ul", "U", "l", "UlU", "lUl", "tl", "Uml", "lm", "oM", "UMl", "lMM", "Ut", "mU"])
        w = []
        for k in shape:
            n = rng.randint(1, 5)
            if k == "U":
                w += [rng.choice(cats["Lu"]) if rng.random() < 0.3 else chr(rng.randint(0x41, 0x5A)) for _ in range(n)]
            elif k == "l":
                w += [rng.choice(cats["Ll"]) if rng.random() < 0.3 else chr(rng.randint(0x61, 0x7A)) for _ in range(n)]
            elif k == "t":
                w.append(one("Lt"))
            elif k == "m":
                w += [one("Lm") for _ in range(rng.randint(1, 2))]
            elif k == "o":
                w += [one("Lo") for _ in range(n)]
            else:
                w += [one(rng.choice(["Mn", "Mn", "Mc", "Me"])) for _ in range(rng.randint(1, 3))]
        return "".join(w)

    parts = []
    for _ in range(rng.randint(20, 120)):
        r = rng.random()
        if r < 0.22:
            parts.append(cased_word())
        elif r < 0.34:
            parts.append(script_word())
        elif r < 0.44:
            parts.append(rng.choice(CONTRACTIONS))
        elif r < 0.54:
            parts.append(rng.choice(PUNCT))
        elif r < 0.60:
            d = rng.choice(DIGITS)
            parts.append("".join(rng.choice(d) for _ in range(rng.randint(1, 9))))
        elif r < 0.64:
            parts.append(rng.choice(EMOJI))
        elif r < 0.70:  # any char of a category the pattern cares about, or of none
            cat = rng.choice(["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
                              "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Cf", "Co", "Cn", "Cc"])
            parts.append("".join(one(cat) for _ in range(rng.randint(1, 4))))
        else:
            parts.append(rng.choice(SPACES))
        if rng.random() < 0.5:
            parts.append(" ")
    return "".join(parts)


def build_records():
    rng = random.Random(SEED)
    cats = pools()
    prose = [p for p in gf.PROSE.split("\n\n") if p.strip()]
    recs = []
    cur = ""
    for p in prose:  # prose in records of ~1 KB, keeping its newlines and blank lines
        cur += p + "\n\n"
        if len(cur) > 1000:
            recs.append(cur)
            cur = ""
    if cur:
        recs.append(cur)
    docs, code = repo_text()
    for t in docs:
        recs += chunks(t, 1000)
    for t in code:
        recs += chunks(t, 1200)
    for k in range(1400):
        r = gen_record(rng, cats)
        if k % 5 == 0:
            r = r.replace("\n", "\r\n")
        if k % 7 == 0:
            r = r.upper()
        recs.append(r)
    for k in range(len(gf.CORPUS)):  # the fixtures' corpus, valid lines only
        x = gf.CORPUS[k]
        if isinstance(x, str):
            recs.append(x)
    return [r.replace("\0", "") for r in recs]


# ---------------------------------------------------------------- the library's answers

def split_hashes(pattern, recs):
    pt = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    out, total = [], 0
    for r in recs:
        pos = [0]
        for ch in r:
            pos.append(pos[-1] + len(ch.encode("utf-8")))
        pieces = pt.pre_tokenize_str(r)
        total += len(pieces)
        out.append("%016x" % fnv64(b"".join(struct.pack("<II", pos[s], pos[e]) for _, (s, e) in pieces)))
    return {"regex": pattern, "pieces": total, "hash": "".join(out)}


def id_hashes(tok, recs):
    out, total = [], 0
    for r in recs:
        ids = tok.encode(r, add_special_tokens=False).ids
        total += len(ids)
        out.append("%016x" % fnv64(struct.pack("<%di" % len(ids), *ids)))
    return {"tokens": total, "hash": "".join(out)}


def read_records():
    data = gzip.open(os.path.join(OUT, "corpus.txt.gz")).read()
    return [r.decode("utf-8") for r in data.split(b"\0")]


def write_expected(exp):
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(exp, f, indent=1, sort_keys=True)
        f.write("\n")


def update_ids(name, tok):
    """Set ids.NAME in expected.json for the committed corpus (o200k_build.py --expected)."""
    exp = json.load(open(os.path.join(OUT, "expected.json")))
    exp["ids"][name] = id_hashes(tok, read_records())
    write_expected(exp)
    print("split/expected.json: ids of", name, exp["ids"][name]["tokens"], "tokens")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--show":
        r = read_records()[int(sys.argv[2])]
        for name, pat in PATTERNS.items():
            pt = pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False)
            print(name, [p for p, _ in pt.pre_tokenize_str(r)])
        return
    os.makedirs(OUT, exist_ok=True)
    recs = build_records()
    data = "\0".join(recs).encode("utf-8")
    with open(os.path.join(OUT, "corpus.txt.gz"), "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as g:
            g.write(data)
    exp = {"tokenizers_version": tokenizers.__version__, "records": len(recs), "bytes": len(data),
           "fnv64": "%016x" % fnv64(data), "sha256": hashlib.sha256(data).hexdigest(),
           "splits": {name: split_hashes(pat, recs) for name, pat in PATTERNS.items()}, "ids": {}}
    for name, path in TOKENIZERS.items():
        if os.path.exists(path):
            exp["ids"][name] = id_hashes(Tokenizer.from_file(path), recs)
        else:
            print("no %s (o200k_build.py makes it): its ids are left out" % path, file=sys.stderr)
    write_expected(exp)
    print("%d records, %d bytes; pieces %s; ids %s" % (
        len(recs), len(data), {k: v["pieces"] for k, v in exp["splits"].items()},
        {k: v["tokens"] for k, v in exp["ids"].items()}))


if __name__ == "__main__":
    main()
