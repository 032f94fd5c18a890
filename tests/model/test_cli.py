#!/usr/bin/env python3
"""`strata eval` / `strata generate` as a user meets them: help, exit codes, one-line errors,
token files, chunked prefill and seeded sampling. Uses the first fixture under
tests/fixtures/*/ref.json as the model (fails if there is none). The eos ids: generation stops
at any id of generation_config.json's eos_token_id list (else config.json's), on an HF folder
and on its pack, checked on the mixtral fixture (or the first) against its greedy tokens."""

import argparse
import glob
import json
import os
import shutil
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

        check_eos_set(S, a.fixtures, refs, tmp)

    print("%d failed" % len(failures))
    return 1 if failures else 0


def check_eos_set(S, fixtures, refs, tmp):
    """A model with several eos ids: generate stops right after the first greedy token that is any
    of them; generation_config.json's list wins over config.json's; --ignore-eos ignores every one."""
    mix = os.path.join(fixtures, "mixtral", "ref.json")
    rp = mix if mix in refs else refs[0]
    src = os.path.dirname(rp)
    ref = json.load(open(rp))
    V, g = int(ref["vocab_size"]), ref["greedy"]
    tl = ",".join(map(str, ref["tokens"]))
    n = len(g)
    # the 5th greedy token (or the first later one not seen before it) as the second eos id, and an
    # id the greedy run never produces as the first
    k = next(i for i in range(4, n) if g[i] not in g[:i])
    other = next(t for t in range(V - 1, 0, -1) if t not in g)
    m = os.path.join(tmp, "eos-model")
    os.makedirs(m)
    for f in os.listdir(src):
        if f.endswith(".json") and f != "ref.json" or f.endswith(".safetensors"):
            shutil.copy(os.path.join(src, f), m)
    cfg = json.load(open(os.path.join(m, "config.json")))
    gcf = os.path.join(m, "generation_config.json")

    def write(path, obj):
        with open(path, "w") as f:
            json.dump(obj, f)

    def gen(model, *extra):
        rc, so, se = run(S, "generate", model, "--tokens", tl, "--max-tokens", str(n), *extra)
        return rc, [int(x) for x in so.split()] if rc == 0 else None, se

    print("eos ids: %s, greedy %s, second eos id %d (greedy token %d)" % (src, g, g[k], k + 1))
    rc, got, se = gen(m, "--ignore-eos")
    check(rc == 0 and got == g, "eos: the copy's greedy tokens are the fixture's (%s)" % (got,))
    cfg_eos = cfg.get("eos_token_id")
    check(cfg_eos not in g, "eos: config.json's eos id %r is not among the greedy tokens" % cfg_eos)

    # generation_config.json lists an unrelated id first, the k-th greedy token second, and an id
    # past the vocabulary (dropped with a warning)
    write(gcf, {"bos_token_id": 1, "eos_token_id": [other, g[k], V + 7], "do_sample": False})
    rc, got, se = gen(m)
    check(rc == 0 and got == g[:k + 1], "eos: generate stops right after the second eos id: %s (want %d tokens)"
          % (got, k + 1))
    check("outside the vocabulary" in se and str(V + 7) in se, "eos: an id past the vocabulary is warned about")
    rc, got, _ = gen(m, "--ignore-eos")
    check(rc == 0 and got == g, "eos: --ignore-eos goes past every eos id (%d tokens)" % len(got or []))
    rc, got, _ = gen(m, "--temperature", "1e-6", "--seed", "3")
    check(rc == 0 and got == g[:k + 1], "eos: sampling stops at it too (%s)" % (got,))

    # precedence: config.json's list when the folder has no generation_config.json (or one without
    # eos_token_id); generation_config.json's when it sets one
    os.remove(gcf)
    write(os.path.join(m, "config.json"), dict(cfg, eos_token_id=[other, g[k]]))
    rc, got, _ = gen(m)
    check(rc == 0 and got == g[:k + 1], "eos: config.json's list without a generation_config.json (%s)" % (got,))
    write(gcf, {"temperature": 0.7})
    rc, got, _ = gen(m)
    check(rc == 0 and got == g[:k + 1], "eos: a generation_config.json without eos_token_id keeps config.json's")
    write(gcf, {"eos_token_id": other})
    rc, got, _ = gen(m)
    check(rc == 0 and got == g, "eos: generation_config.json's id replaces config.json's list (%d tokens)"
          % len(got or []))
    write(gcf, {"eos_token_id": list(range(100, 117))})
    rc, _, se = gen(m)
    check(rc == 2 and one_error_line(se) and "generation_config.json" in se and "at most 16" in se,
          "eos: 17 eos ids are refused, naming the file: %s" % se.strip())

    # a pack carries generation_config.json: the same set
    write(os.path.join(m, "config.json"), cfg)
    write(gcf, {"eos_token_id": [other, g[k]]})
    p = os.path.join(tmp, "eos-pack")
    rc, _, se = run(S, "pack", m, p, "--format", "f32", "--attn-format", "f32", "--quiet")
    check(rc == 0, "eos: strata pack --format f32: %s" % se.strip())
    if rc == 0:
        rc, gp, _ = gen(p, "--ignore-eos")
        rc2, got, _ = gen(p)
        check(rc == 0 and gp == g, "eos: the f32 pack's greedy tokens are the fixture's (%s)" % (gp,))
        check(rc2 == 0 and got == g[:k + 1], "eos: the pack stops at the same eos id (%s)" % (got,))


if __name__ == "__main__":
    sys.exit(main())
