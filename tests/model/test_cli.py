#!/usr/bin/env python3
"""`strata eval` / `strata generate` as a user meets them: help, exit codes, one-line errors,
token files, chunked prefill and seeded sampling. Uses the first fixture under
tests/fixtures/*/ref.json as the model (fails if there is none)."""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

failures = []


def check(cond, what):
    print("%-4s %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def run(*cmd):
    p = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def one_error_line(err):
    lines = [l for l in err.splitlines() if l.strip()]
    return len(lines) == 1 and lines[0].startswith("strata ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixtures", required=True)
    a = ap.parse_args()
    S = a.strata
    refs = sorted(glob.glob(os.path.join(a.fixtures, "*", "ref.json")))
    if not refs:
        print("FAIL: no fixtures under %s" % a.fixtures)
        return 1
    d = os.path.dirname(refs[0])
    ref = json.load(open(refs[0]))
    toks = ref["tokens"]
    V = int(ref["vocab_size"])
    tl = ",".join(map(str, toks))
    print("model: %s" % d)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "l.f32")
        for cmd in ("eval", "generate"):
            lo = ["--logits-out", out] if cmd == "eval" else []
            rc, so, _ = run(S, cmd, "--help")
            check(rc == 0 and "usage: strata " + cmd in so, "%s --help exits 0 with usage" % cmd)
            rc, _, se = run(S, cmd)
            check(rc == 2 and one_error_line(se), "%s without arguments: exit 2, one line" % cmd)
            rc, _, se = run(S, cmd, d, "--tokens", "1,x,3", *lo)
            check(rc == 2 and one_error_line(se) and "'x'" in se, "%s bad token list: exit 2, names it" % cmd)
            rc, _, se = run(S, cmd, os.path.join(tmp, "nope"), "--tokens", "1", *lo)
            check(rc == 2 and one_error_line(se) and "nope" in se,
                  "%s missing model folder: exit 2, one line naming it (%s)" % (cmd, se.strip()))
            rc, _, se = run(S, cmd, d, "--tokens", "1,%d" % V, *lo)
            check(rc == 2 and one_error_line(se) and str(V) in se, "%s token outside vocab: exit 2" % cmd)
            rc, _, se = run(S, cmd, d, "--tokens", "1", "--frobnicate")
            check(rc == 2 and one_error_line(se), "%s unknown option: exit 2" % cmd)
            rc, _, se = run(S, cmd, d, "--tokens", "1", "--threads", "-3", *lo)
            check(rc == 2 and one_error_line(se), "%s bad --threads: exit 2" % cmd)
        rc, _, se = run(S, "eval", d, "--tokens", "1,2", "--prefill", "3", "--logits-out", out)
        check(rc == 2 and one_error_line(se), "eval --prefill beyond the tokens: exit 2")
        rc, _, se = run(S, "eval", d, "--tokens", tl, "--logits-out", os.path.join(tmp, "no", "dir", "x"))
        check(rc == 2 and one_error_line(se), "eval unwritable output: exit 2")

        # full prefill, chunked prefill, token file: same logits
        rc, _, se = run(S, "eval", d, "--tokens", tl, "--logits-out", out)
        check(rc == 0, "eval full prefill: exit 0 %s" % se.strip())
        full = np.fromfile(out, dtype="<f4")
        check(full.size == len(toks) * V, "eval writes [n_tokens][vocab] floats")
        tf = os.path.join(tmp, "tokens.txt")
        with open(tf, "w") as f:
            f.write("\n".join(" ".join(map(str, toks[i:i + 7])) for i in range(0, len(toks), 7)) + "\n")
        rc, _, se = run(S, "eval", d, "--tokens-file", tf, "--chunk", "5", "--logits-out", out)
        ch = np.fromfile(out, dtype="<f4")
        ok = rc == 0 and ch.size == full.size
        err = float(np.abs(ch - full).max() / np.abs(full).max()) if ok else -1
        check(ok and err < 1e-5, "eval --tokens-file --chunk 5 equals one prefill (max diff %.3g)" % err)

        # sampling: same seed same tokens, another seed other tokens, greedy by default
        base = ["--tokens", tl, "--max-tokens", "16", "--ignore-eos"]
        r1 = run(S, "generate", d, *base, "--temperature", "3", "--seed", "7")
        r2 = run(S, "generate", d, *base, "--temperature", "3", "--seed", "7")
        r3 = run(S, "generate", d, *base, "--temperature", "3", "--seed", "8")
        check(r1[0] == 0 and len(r1[1].split()) == 16, "generate prints 16 ids on one line")
        check(r1[1] == r2[1], "generate: same seed, same tokens")
        check(r1[1] != r3[1], "generate: other seed, other tokens")
        r4 = run(S, "generate", d, *base, "--top-k", "1", "--temperature", "3", "--seed", "9")
        r5 = run(S, "generate", d, *base)
        check(r4[0] == 0 and r4[1] == r5[1], "generate --top-k 1 equals greedy")
        rc, _, se = run(S, "generate", d, *base, "--top-p", "0")
        check(rc == 2 and one_error_line(se), "generate --top-p 0: exit 2")
        rc, so, _ = run(S, "generate", d, "--tokens", tl, "--max-tokens", "0")
        check(rc == 0 and so.strip() == "", "generate --max-tokens 0 prints an empty line")

    print("%d failed" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
