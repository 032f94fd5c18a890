#!/usr/bin/python3
"""test_find_group.py - `strata status`, `strata down` and `strata client` with no --config find the
running group: `strata up` records each group it starts in the registry (here a temporary
STRATA_REGISTRY, so that groups other tests start do not count), and with one group running the
commands act on it; with two they list both and exit 2; with none they say so (exit 2), and a
record whose launcher was killed is dropped.

usage: test_find_group.py --strata BIN
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile


def run(args, env, timeout=120):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="strata-find-")
    env = dict(os.environ, STRATA_REGISTRY=os.path.join(d, "registry"))
    os.makedirs(env["STRATA_REGISTRY"], mode=0o700)
    base = 20000 + random.randrange(20000)
    groups = []
    try:
        out = run([a.strata, "status"], env)
        assert out.returncode == 2 and "no running group" in out.stderr, out
        for k, name in enumerate(("finda%d" % os.getpid(), "findb%d" % os.getpid())):
            rd = os.path.join(d, name)
            out = run([a.strata, "up", "--demo", "--run-dir", rd, "--name", name, "--port", str(base + k)], env)
            assert out.returncode == 0, out.stderr
            groups.append((name, rd))
            if k == 0:
                # one group: status, and client without --endpoint, act on it
                out = run([a.strata, "status"], env)
                assert out.returncode == 0 and name in out.stdout, out
                out = run([a.strata, "client", "--tokens", "1,2,3", "--max-tokens", "4", "--ids", "--ignore-eos"], env)
                assert out.returncode == 0 and len(out.stdout.split()) == 4, out
        # two: each command lists both and exits 2
        for cmd in (["status"], ["down"], ["client", "--tokens", "1", "--max-tokens", "1"]):
            out = run([a.strata] + cmd, env)
            assert out.returncode == 2 and all(n in out.stderr for n, _ in groups), (cmd, out)
        out = run([a.strata, "down", "--demo", "--run-dir", groups[1][1]], env)
        assert out.returncode == 0, out.stderr
        # one again: down with no arguments stops it
        out = run([a.strata, "down"], env)
        assert out.returncode == 0, out.stderr
        out = run([a.strata, "status"], env)
        assert out.returncode == 2 and "no running group" in out.stderr, out
        # a record whose launcher is gone is stale: dropped, not acted on
        with open(os.path.join(env["STRATA_REGISTRY"], "ghost"), "w") as f:
            f.write('{"group": "ghost", "run_dir": "%s/ghost", "config": "%s/ghost.ini"}' % (d, d))
        out = run([a.strata, "status"], env)
        assert out.returncode == 2 and "no running group" in out.stderr, out
        assert not os.path.exists(os.path.join(env["STRATA_REGISTRY"], "ghost"))
        print("test_find_group: ok")
        return 0
    finally:
        for _, rd in groups:
            run([a.strata, "down", "--demo", "--run-dir", rd], env)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
