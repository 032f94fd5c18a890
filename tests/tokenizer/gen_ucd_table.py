#!/usr/bin/env python3
"""The code points the `tokenizers` library's Oniguruma assigns but PCRE2 10.42 does not.

    /tmp/tokvenv/bin/python tests/tokenizer/gen_ucd_table.py [--check]

tokenizers 0.23.3 matches \\p{..} with Unicode 16.0 tables; Debian 12's PCRE2 (10.42) has
Unicode 14.0 and utf8proc 2.8 has 15.0, so a letter added in 15.0 or 16.0 (CJK extensions H and
I, Egyptian hieroglyphs extended A, Garay, ...) is \\p{Lo} to the library and unassigned to
Strata. This asks the library for the general category of every code point (Split on \\p{Xx}
for each category), keeps those that Python's unicodedata (it must be 14.0, as in Python 3.11,
no newer than PCRE2's) has as unassigned, and writes them as ranges into common/tok_regex.c
between the BEGIN/END lines of s_ucd_new, and those of them in the scripts patterns name
(\\p{Han} ...) into s_ucd_new_sc. tok_regex.c adds them to the \\p{..}, \\d, \\w and POSIX
classes it translates and to its hand-written matchers; tok_util.c to the classes tokenizers
takes from Rust's std (is_numeric, \\w). With --check it only says whether the table in
tok_regex.c is what the library gives. Recategorised code points (assigned in both, in
another category) are printed and left out.
"""
import os
import sys
import unicodedata

from tokenizers import Regex, pre_tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "common", "tok_regex.c")
CATS = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
        "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co"]
SCRIPTS = ["Han", "Hiragana", "Katakana", "Hangul", "Latin", "Cyrillic", "Greek", "Arabic", "Hebrew", "Thai",
           "Devanagari"]  # the scripts tokenizer patterns name
BEGIN = "/* BEGIN gen_ucd_table.py */\n"
END = "/* END gen_ucd_table.py */\n"
BEGIN_SC = "/* BEGIN gen_ucd_table.py scripts */\n"
END_SC = "/* END gen_ucd_table.py scripts */\n"


def onig_categories():
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c < 0xE000]
    s = "".join(map(chr, cps))
    cat = {}
    for k in CATS:
        kept = bytearray(len(s))
        for _, (a, b) in pre_tokenizers.Split(Regex(r"\p{%s}" % k), behavior="removed").pre_tokenize_str(s):
            kept[a:b] = b"\1" * (b - a)
        for i in range(len(s)):
            if not kept[i]:
                cat[cps[i]] = k
    return cat


def member(cps, pattern):
    s = "".join(map(chr, cps))
    kept = bytearray(len(s))
    for _, (a, b) in pre_tokenizers.Split(Regex(pattern), behavior="removed").pre_tokenize_str(s):
        kept[a:b] = b"\1" * (b - a)
    return [cps[i] for i in range(len(s)) if not kept[i]]


def as_ranges(cps_tags):
    out = []
    for c, t in cps_tags:
        if out and out[-1][1] == c - 1 and out[-1][2] == t:
            out[-1][1] = c
        else:
            out.append([c, c, t])
    return out


def main():
    if unicodedata.unidata_version != "14.0.0":
        sys.exit("needs Python's Unicode 14.0 tables (Python 3.11), not %s" % unicodedata.unidata_version)
    import tokenizers
    cat = onig_categories()
    ranges, moved = [], []
    for c in sorted(cat):
        py = unicodedata.category(chr(c))
        if py != "Cn":
            if py != cat[c]:
                moved.append("U+%04X %s -> %s" % (c, py, cat[c]))
            continue
        if ranges and ranges[-1][1] == c - 1 and ranges[-1][2] == cat[c]:
            ranges[-1][1] = c
        else:
            ranges.append([c, c, cat[c]])
    new = [a for r in ranges for a in range(r[0], r[1] + 1)]
    sc = sorted((c, name) for name in SCRIPTS for c in member(new, r"\p{%s}" % name))
    body = "".join("    {0x%05X, 0x%05X, \"%s\"},\n" % (a, b, k) for a, b, k in ranges)
    body_sc = "".join("    {0x%05X, 0x%05X, \"%s\"},\n" % (a, b, k) for a, b, k in as_ranges(sc))
    src = open(SRC, encoding="utf-8").read()
    i, j = src.index(BEGIN) + len(BEGIN), src.index(END)
    k, m = src.index(BEGIN_SC) + len(BEGIN_SC), src.index(END_SC)
    print("tokenizers %s: %d code points in %d ranges, %d of them in %s; recategorised, left out: %s" % (
        tokenizers.__version__, len(new), len(ranges), len(sc), "/".join(SCRIPTS), ", ".join(moved) or "none"))
    if "--check" in sys.argv:
        ok = src[i:j] == body and src[k:m] == body_sc
        sys.exit(0 if ok else "common/tok_regex.c: s_ucd_new / s_ucd_new_sc differ from the library's tables")
    assert j < k
    open(SRC, "w", encoding="utf-8").write(src[:i] + body + src[j:k] + body_sc + src[m:])


if __name__ == "__main__":
    main()
