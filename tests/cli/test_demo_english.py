#!/usr/bin/python3
"""test_demo_english.py - the demo model writes English through the whole group: `strata up
--demo`, then `strata client` greedy on five fixed English prompts. Each 48-token answer must
have at least 8 words of three or more letters, at least 80% of them in Debian's wamerican list
and at least half of them distinct (models/demo/check_english.py), and must equal the greedy
continuation transformers computed for the same prompt from the shipped weights
(models/demo/samples.json, written by models/demo/train.py).

usage: test_demo_english.py --strata BIN [--words /usr/share/dict/american-english]
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.join(HERE, "..", "..", "models", "demo")
sys.path.insert(0, DEMO)
import check_english  # noqa: E402


def run(args, env, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--words", default="/usr/share/dict/american-english")
    a = ap.parse_args()
    if not os.path.exists(a.words):
        print("test_demo_english: no word list at %s (Debian's wamerican package)" % a.words)
        return 1
    words = check_english.load_words(a.words)
    ref = json.load(open(os.path.join(DEMO, "samples.json")))["prompts"][:5]
    d = tempfile.mkdtemp(prefix="strata-english-")
    env = dict(os.environ, STRATA_REGISTRY=os.path.join(d, "registry"))
    os.makedirs(env["STRATA_REGISTRY"], mode=0o700)
    rd = os.path.join(d, "demo")
    port = 20000 + random.randrange(20000)
    failed = 0
    try:
        out = run([a.strata, "up", "--demo", "--run-dir", rd, "--name", "english%d" % os.getpid(), "--port", str(port)], env)
        if out.returncode != 0:
            print("FAIL strata up --demo: %s" % out.stderr.strip()[-600:])
            return 1
        for r in ref:
            out = run([a.strata, "client", "--endpoint", "tcp://127.0.0.1:%d" % port, "--prompt", r["prompt"], "--max-tokens",
                       "48", "--ignore-eos"], env)
            text = out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout  # the client ends its output with one
            ok, n, known, distinct, unknown = check_english.judge(text, words)
            same = text == r["text"]
            good = out.returncode == 0 and ok and same
            failed += not good
            print("%s %-26s %2d words, %.2f known, %.2f distinct%s: %r" % (
                "ok  " if good else "FAIL", r["prompt"], n, known, distinct,
                "" if same else " (transformers: %r)" % r["text"], text))
        print("test_demo_english: %d of %d prompts failed" % (failed, len(ref)))
        return 1 if failed else 0
    finally:
        run([a.strata, "down", "--demo", "--run-dir", rd], env)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
