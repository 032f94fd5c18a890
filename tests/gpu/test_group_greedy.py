#!/usr/bin/python3
"""test_group_greedy.py - the process group on the GPU against the transformers fixtures.

For every fixture folder (tests/fixtures/NAME: config.json, safetensors, ref.json with the prompt
`tokens` and the fp32 reference's greedy continuation `greedy`), a group (router, scheduler and an
executor with `backend = cuda`; no prefetcher, so the executor loads the HF folder from disk) is
started with `strata up`, and:
  - teacher-forced: for each position i of the continuation, one greedy request of one token
    whose prompt is tokens + greedy[:i]; the answer must equal greedy[i] on at least 95% of the
    positions of every fixture (the issue's criterion);
  - free-running: one greedy request of len(greedy) tokens from the prompt, reported (a single
    early divergence changes every later token, so this one is not scored by position);
  - sampled (temperature 0.8, top-k 20, top-p 0.9, seed 7; drawn on the GPU by the executor):
    twice, which must give the same ids, all inside the vocabulary; how far they agree with
    `strata generate` on the CPU with the same parameters is reported, not scored (a logit that
    differs in its last bits may move a draw across a mass boundary).
Needs a GPU; run by tests/gpu/run, never by the CPU CI.

usage: test_group_greedy.py --strata BIN [--fixtures DIR] [--only NAME,...] [--backend cuda|cpu]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "group"))
from grouplib import free_port  # noqa: E402


SAMPLED = ["--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--seed", "7"]


def client(strata, endpoint, prompt, n, extra=()):
    out = subprocess.run([strata, "client", "--endpoint", endpoint, "--tokens", ",".join(map(str, prompt)),
                          "--max-tokens", str(n), "--ignore-eos", "--ids", "--timeout", "120"] + list(extra),
                         capture_output=True, text=True, timeout=180)
    if out.returncode != 0:
        raise RuntimeError("strata client failed (%d): %s" % (out.returncode, out.stderr.strip()[-400:]))
    return [int(x) for x in out.stdout.split()]


def run_fixture(strata, fdir, backend):
    ref = json.load(open(os.path.join(fdir, "ref.json")))
    tokens, greedy = ref["tokens"], ref["greedy"]
    run_dir = tempfile.mkdtemp(prefix="strata-gpu-greedy-")
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    ini = os.path.join(run_dir, "group.ini")
    with open(ini, "w") as f:
        f.write("[group]\nname = gg%d\nrun_dir = %s\nmodel = %s\n\n[router]\nendpoint = %s\n\n"
                "[scheduler]\nkv_blocks = 64\nblock_size = 16\n\n[executor]\nbackend = %s\n\n"
                "[launcher]\nready_timeout_s = 120\n" % (os.getpid() % 100000, run_dir, os.path.abspath(fdir), endpoint, backend))
    up = subprocess.run([strata, "up", "--config", ini], capture_output=True, text=True, timeout=300)
    try:
        if up.returncode != 0:
            log = ""
            logs = os.path.join(run_dir, "logs", "executor.log")
            if os.path.exists(logs):
                log = open(logs).read()[-800:]
            raise RuntimeError("strata up failed: %s\n%s" % (up.stderr.strip()[-400:], log))
        same = 0
        for i in range(len(greedy)):
            got = client(strata, endpoint, tokens + greedy[:i], 1)
            same += len(got) == 1 and got[0] == greedy[i]
        free = client(strata, endpoint, tokens, len(greedy))
        prefix = 0
        while prefix < len(free) and prefix < len(greedy) and free[prefix] == greedy[prefix]:
            prefix += 1
        n = len(greedy)
        s1 = client(strata, endpoint, tokens, n, SAMPLED)
        s2 = client(strata, endpoint, tokens, n, SAMPLED)
        vocab = json.load(open(os.path.join(fdir, "config.json")))["vocab_size"]
        if s1 != s2 or len(s1) != n or not all(0 <= t < vocab for t in s1):
            raise RuntimeError("sampled: %s then %s (want the same %d ids under %d)" % (s1, s2, n, vocab))
        gen = subprocess.run([strata, "generate", os.path.abspath(fdir), "--tokens", ",".join(map(str, tokens)),
                              "--max-tokens", str(n), "--ignore-eos"] + SAMPLED,
                             capture_output=True, text=True, timeout=300)
        cpu = [int(x) for x in gen.stdout.split()] if gen.returncode == 0 else []
        sprefix = 0
        while sprefix < min(len(s1), len(cpu)) and s1[sprefix] == cpu[sprefix]:
            sprefix += 1
        return same, n, prefix, sprefix
    finally:
        subprocess.run([strata, "down", "--config", ini], capture_output=True, text=True, timeout=120)
        subprocess.run(["rm", "-rf", run_dir])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixtures", default=os.path.join(HERE, "..", "fixtures"))
    ap.add_argument("--only", default="")
    ap.add_argument("--backend", default="cuda", help="cuda (default); cpu checks the plumbing without a GPU")
    a = ap.parse_args()
    names = sorted(d for d in os.listdir(a.fixtures) if os.path.exists(os.path.join(a.fixtures, d, "ref.json")))
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    failed = 0
    for n in names:
        try:
            same, total, prefix, sprefix = run_fixture(a.strata, os.path.join(a.fixtures, n), a.backend)
        except Exception as e:  # one fixture's failure must not hide the others
            print("FAIL %-22s %s" % (n, e))
            failed += 1
            continue
        ok = same * 100 >= total * 95
        failed += not ok
        print("%s %-22s teacher-forced %d/%d positions equal, free-running %d/%d before the first difference, "
              "sampled twice the same, %d/%d as strata generate's before the first difference"
              % ("ok  " if ok else "FAIL", n, same, total, prefix, total, sprefix, total))
    print("test_group_greedy: %d fixtures, %d failed" % (len(names), failed))
    return 1 if failed or not names else 0


if __name__ == "__main__":
    sys.exit(main())
