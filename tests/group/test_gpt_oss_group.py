#!/usr/bin/python3
"""gpt-oss through a real group on the CPU backend, against transformers' greedy tokens.

  hf      the downloaded-folder layout (tests/fixtures/gpt_oss, fp32, sliding windows shorter
          than the prompt): a group without prefetchers loads it as it is
  mxfp4   tests/fixtures/gpt_oss_mxfp4 packed with --format mxfp4 (its MXFP4 bytes kept), one
          prefetcher arena, [executor] expert_path = cpu: every expert runs on the prefetcher's
          cores with its biases and the clamped activation; the executor's log must show jobs
          and no expert computed locally after a failure
Each streams the fixture's 40 prompt ids greedily (ignore_eos) through `strata client --ids`
and must give ref.json's 16 greedy tokens.

usage: test_gpt_oss_group.py --strata BIN --fixtures DIR
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    print("%-4s %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def run_case(a, tmp, name, model, extra, ref):
    env = dict(os.environ, STRATA_REGISTRY=os.path.join(tmp, name + "-reg"))
    os.makedirs(env["STRATA_REGISTRY"], mode=0o700)
    port = free_port()
    cfg = os.path.join(tmp, name + ".ini")
    run_dir = os.path.join(tmp, name + "-run")
    with open(cfg, "w") as f:
        f.write("[group]\nname = gptoss%s%d\nrun_dir = %s\nmodel = %s\n\n[router]\nendpoint = tcp://127.0.0.1:%d\n"
                "cpus =\n\n[executor]\nbackend = cpu\nthreads = 2\n%s" % (name, os.getpid(), run_dir, model, port, extra))
    r = subprocess.run([a.strata, "up", "--config", cfg], capture_output=True, text=True, timeout=120, env=env)
    check(r.returncode == 0, "%s: strata up (exit %d: %s)" % (name, r.returncode, r.stderr.strip()[-300:]))
    if r.returncode:
        return None
    try:
        r = subprocess.run([a.strata, "client", "--endpoint", "tcp://127.0.0.1:%d" % port, "--tokens",
                            ",".join(map(str, ref["tokens"])), "--max-tokens", str(len(ref["greedy"])), "--ids",
                            "--temperature", "0", "--ignore-eos"], capture_output=True, text=True, timeout=120, env=env)
        got = [int(t) for t in r.stdout.split()] if r.returncode == 0 else None
        check(got == ref["greedy"], "%s: greedy through the group %s equals transformers' %s" % (name, got, ref["greedy"]))
    finally:
        subprocess.run([a.strata, "down", "--config", cfg], capture_output=True, timeout=120, env=env)
    return open(os.path.join(run_dir, "logs", "executor.log")).read()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixtures", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="strata-gptoss-group-") as tmp:
        hf = os.path.join(a.fixtures, "gpt_oss")
        run_case(a, tmp, "hf", hf, "", json.load(open(os.path.join(hf, "ref.json"))))
        mx = os.path.join(a.fixtures, "gpt_oss_mxfp4")
        pk = os.path.join(tmp, "pk")
        r = subprocess.run([a.strata, "pack", mx, pk, "--format", "mxfp4", "--quiet"], capture_output=True, text=True,
                           timeout=120)
        check(r.returncode == 0, "pack --format mxfp4 (exit %d: %s)" % (r.returncode, r.stderr.strip()[-300:]))
        log = run_case(a, tmp, "mxfp4", pk, "expert_path = cpu\n\n[prefetcher.0]\nnuma_node = -1\n",
                       json.load(open(os.path.join(mx, "ref.json"))))
        m = re.search(r"cpu experts (\d+) in (\d+) jobs, (\d+) computed here", log or "")
        check(m is not None and int(m.group(2)) > 0 and int(m.group(3)) == 0,
              "mxfp4: the prefetcher ran the experts: %s" % (m.group(0) if m else "no totals line in executor.log"))
    print("test_gpt_oss_group: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
