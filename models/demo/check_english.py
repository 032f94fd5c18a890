#!/usr/bin/env python3
"""Whether continuations read as English, by the measure tests/demo applies to the demo model:
at least 8 words of three or more letters, at least 80% of them in a word list (Debian's
wamerican: /usr/share/dict/american-english), and at least half of them distinct.

    python3 check_english.py [--words FILE] samples.json      (train.py's output)
prints one line per prompt and exits 1 if one of the first five fails.
"""
import argparse
import json
import re
import sys


def load_words(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return set(w.strip().lower() for w in f if w.strip())


def words_of(text):
    """The words of three or more letters (an apostrophe's suffix kept: don't, there's)."""
    return [w.lower() for w in re.findall(r"[A-Za-z]+(?:'[A-Za-z]+)?", text) if len(w.split("'")[0]) >= 3]


def judge(text, words):
    ws = words_of(text)
    n = len(ws)
    known = sum(w in words for w in ws)
    ok = n >= 8 and known >= 0.8 * n and len(set(ws)) * 2 >= n
    return ok, n, known / n if n else 0.0, len(set(ws)) / n if n else 0.0, [w for w in ws if w not in words]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--words", default="/usr/share/dict/american-english")
    ap.add_argument("samples")
    a = ap.parse_args()
    words = load_words(a.words)
    bad = 0
    score = 0.0
    for i, p in enumerate(json.load(open(a.samples))["prompts"]):
        ok, n, kn, di, unk = judge(p["text"], words)
        score += kn
        if i < 5 and not ok:
            bad += 1
        print("%s %-28s %2d words, %.2f known, %.2f distinct, unknown: %s" % ("ok  " if ok else "FAIL", p["prompt"], n, kn, di,
                                                                          " ".join(unk)))
    print("score %.3f, %d of the first five fail" % (score, bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
