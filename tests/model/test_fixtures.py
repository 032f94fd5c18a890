#!/usr/bin/env python3
"""Check `strata eval` and `strata generate` against the HF transformers fixtures.

Every folder tests/fixtures/*/ holding a ref.json is a fixture (config.json, *.safetensors,
ref.json with tokens[40] and greedy[16], logits.f32 [40][vocab] float32 little-endian).
  --mode eval      one prefill step, logits of every position; per-position relative error
                   ||d|| / ||ref|| below 1e-4 (fp32 fixtures) or 1e-3 (bf16 / f16 fixtures)
  --mode prefill   the same with --prefill 8: 8 tokens in one step, then one-token decodes
  --mode generate  16 greedy tokens (--ignore-eos, as the reference) equal ref.json greedy
The test fails when no fixture is found. Exit 0 only if every fixture passes.
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
import compare  # noqa: E402  (tests/fixtures/compare.py: load / compare logits files)

BOUND = {"float32": 1e-4, "bfloat16": 1e-3, "float16": 1e-3}


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr


def check_logits(strata, d, ref, threads, extra, tmp):
    tokens = ref["tokens"]
    V = int(ref.get("vocab_size") or json.load(open(os.path.join(d, "config.json")))["vocab_size"])
    want = compare.load(os.path.join(d, "logits.f32"), V, "reference")
    if want.shape[0] != len(tokens):
        return False, "logits.f32 has %d rows, want %d" % (want.shape[0], len(tokens))
    out = os.path.join(tmp, os.path.basename(d) + ".logits")
    cmd = [strata, "eval", d, "--tokens", ",".join(map(str, tokens)), "--logits-out", out,
           "--threads", str(threads)] + extra
    rc, _, err = run(cmd)
    if rc != 0:
        return False, "strata eval exit %d: %s" % (rc, err.strip())
    got = compare.load(out, V, "strata eval")  # raises on a bad size or a non-finite value
    if got.shape != want.shape:
        return False, "strata wrote %d rows, want %d" % (got.shape[0], want.shape[0])
    res = compare.compare(want, got)
    rel = res["row_rel"]
    argmax_agree = int((res["top_ref"] == res["top_out"]).sum())
    bound = BOUND.get(ref.get("dtype", "float32"), 1e-4)
    worst = int(np.argmax(rel))
    msg = "max rel err %.3g at pos %d (bound %g, %s), median %.3g, argmax agrees %d/%d" % (
        rel[worst], worst, bound, ref.get("dtype", "float32"), float(np.median(rel)), argmax_agree,
        len(tokens))
    return bool(rel.max() < bound), msg


def check_generate(strata, d, ref, threads):
    tokens, want = ref["tokens"], ref["greedy"]
    cmd = [strata, "generate", d, "--tokens", ",".join(map(str, tokens)), "--max-tokens",
           str(len(want)), "--ignore-eos", "--threads", str(threads)]
    rc, out, err = run(cmd)
    if rc != 0:
        return False, "strata generate exit %d: %s" % (rc, err.strip())
    try:
        got = [int(x) for x in out.split()]
    except ValueError:
        return False, "unparsable output %r" % out[:200]
    agree = 0
    for a, b in zip(got, want):
        if a != b:
            break
        agree += 1
    msg = "greedy agrees on %d/%d tokens%s" % (agree, len(want),
                                                "" if got == want else "; got %s want %s" % (got, want))
    return got == want, msg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True, help="the strata binary")
    ap.add_argument("--fixtures", required=True, help="folder holding one folder per fixture")
    ap.add_argument("--mode", required=True, choices=["eval", "prefill", "generate"])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    dirs = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(a.fixtures, "*", "ref.json")))
    if not dirs:
        print("FAIL: no fixtures (no %s/*/ref.json)" % a.fixtures)
        return 1
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for d in dirs:
            name = os.path.basename(d)
            try:
                ref = json.load(open(os.path.join(d, "ref.json")))
                if a.mode == "generate":
                    ok, msg = check_generate(a.strata, d, ref, a.threads)
                else:
                    extra = ["--prefill", "8"] if a.mode == "prefill" else []
                    ok, msg = check_logits(a.strata, d, ref, a.threads, extra, tmp)
            except Exception as e:  # a broken fixture or binary fails this fixture, loudly
                ok, msg = False, "%s: %s" % (type(e).__name__, e)
            print("%-4s %-24s %s" % ("ok" if ok else "FAIL", name, msg), flush=True)
            failed += not ok
    print("%s: %d fixtures, %d failed" % (a.mode, len(dirs), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
