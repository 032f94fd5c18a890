#!/usr/bin/env python3
"""Make the demo model's training corpus from Debian's `fortunes` package (fortune-mod's data
files, BSD licence: see SOURCE.md beside this file).

    apt-get download fortunes        # fortunes_1%3a1.99.1-7.3_all.deb on Debian 12
    dpkg -x fortunes_*.deb pkg
    python3 make_corpus.py pkg/usr/share/games/fortunes corpus.txt

Only the files of general English prose are used (no ASCII art, no shell or Perl snippets).
Each fortune becomes one paragraph: its lines joined by single spaces, the attribution kept
("-- Mark Twain"), and paragraphs separated by a blank line. Fortunes that are mostly not
letters, or not ASCII, are dropped. The output is deterministic (files and fortunes in order).
"""
import re
import sys

FILES = ["cookie", "definitions", "education", "food", "fortunes", "goedel", "humorists", "kids",
         "law", "literature", "love", "magic", "medicine", "men-women", "miscellaneous", "news",
         "paradoxum", "people", "pets", "platitudes", "politics", "pratchett", "riddles", "science",
         "songs-poems", "sports", "tao", "wisdom", "work"]


def paragraphs(text):
    for raw in text.split("\n%\n"):
        s = re.sub(r"\s+", " ", raw.replace("%", " ")).strip()
        if len(s) < 30 or not s.isascii():
            continue
        letters = sum(c.isalpha() or c == " " for c in s)
        if letters < 0.85 * len(s):
            continue
        yield s


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_corpus.py FORTUNES_DIR OUT.txt")
    src, out = sys.argv[1], sys.argv[2]
    n, total = 0, 0
    with open(out, "w") as f:
        for name in FILES:
            with open("%s/%s" % (src, name), encoding="latin-1") as g:
                for p in paragraphs(g.read()):
                    f.write(p + "\n\n")
                    n += 1
                    total += len(p) + 2
    print("%s: %d paragraphs, %d bytes" % (out, n, total))


if __name__ == "__main__":
    main()
