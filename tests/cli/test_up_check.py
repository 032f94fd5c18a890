#!/usr/bin/python3
"""test_up_check.py - `strata up` and `strata up --check` refuse, with exit code 2 and the cause on
the first line of stderr, the config and model errors that no restart can fix:
  - a model folder that does not exist (up used to exit 1 naming only "prefetcher.0 exited with
    code 2 (see launcher.log)");
  - a packed model whose weight file is truncated, and an HF folder without its safetensors;
  - an ipc endpoint in a directory that does not exist (the scheduler was restarted 8 times and up
    gave up after 60 s with exit code 1);
  - a tcp endpoint with a port out of range (accepted: zmq listened elsewhere) or without a port;
  - a service that exits 2 at start (the executor's backend = cuda without a device here, or a
    budget that holds nothing on a GPU): up exits 2 with the service's own error;
and `--check` passes on a good model (the demo model).

usage: test_up_check.py --strata BIN
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def ini(d, model, extra=""):
    p = os.path.join(d, "g.ini")
    with open(p, "w") as f:
        f.write("[group]\nname = upcheck%d\nrun_dir = %s/run\nmodel = %s\n%s" % (os.getpid(), d, model, extra))
    return p


def refused(strata, cfg, want, check, detach=False):
    args = [strata, "up", "--config", cfg] + (["--check"] if check else [] if detach else ["--foreground"])
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    first = out.stderr.strip().splitlines()[0] if out.stderr.strip() else ""
    assert out.returncode == 2, "%s: exit %d, want 2: %s" % (" ".join(args[1:]), out.returncode, out.stderr[-400:])
    for w in want:
        assert w in first, "%s: first line %r lacks %r" % (" ".join(args[1:]), first, w)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="strata-upcheck-")
    try:
        # the demo writes an HF folder (hf/) and its packed form (model/, printed)
        out = subprocess.run([a.strata, "demo", "--out", os.path.join(d, "demo")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        packed = out.stdout.strip()
        demo = os.path.join(d, "demo", "hf")
        for model in (demo, packed):
            out = subprocess.run([a.strata, "up", "--check", "--config", ini(d, model)], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, "--check on %s: %s" % (model, out.stderr)
        missing = os.path.join(d, "no-such-model")
        for check in (True, False):
            refused(a.strata, ini(d, missing), ["model folder", missing], check)
        # a truncated weight file of a packed folder
        bad = os.path.join(d, "truncated")
        shutil.copytree(packed, bad)
        w = sorted(f for f in os.listdir(bad) if f.endswith(".bin"))[0]
        with open(os.path.join(bad, w), "r+b") as f:
            f.truncate(os.path.getsize(os.path.join(bad, w)) - 1)
        for check in (True, False):
            refused(a.strata, ini(d, bad), [w, "bytes"], check)
        # an HF folder without its weights
        hf = os.path.join(d, "noweights")
        shutil.copytree(demo, hf)
        for f in os.listdir(hf):
            if f.endswith(".safetensors") or f.endswith(".index.json"):
                os.remove(os.path.join(hf, f))
        refused(a.strata, ini(d, hf), ["model.safetensors"], True)
        # endpoints
        refused(a.strata, ini(d, demo, "[scheduler]\nendpoint = ipc://%s/nodir/s.sock\n" % d), ["[scheduler] endpoint", "nodir"], True)
        refused(a.strata, ini(d, demo, "[scheduler]\nendpoint = ipc://%s/nodir/s.sock\n" % d), ["[scheduler] endpoint"], False)
        refused(a.strata, ini(d, demo, "[router]\nendpoint = tcp://127.0.0.1:99999\n"), ["endpoint", "99999"], True)
        refused(a.strata, ini(d, demo, "[router]\nendpoint = tcp://127.0.0.1\n"), ["endpoint", "no port"], True)
        # a service that refuses its config at start (exit 2: no CUDA device here, or on a GPU a
        # budget that holds nothing): up exits 2 too, its cause on the first line (it exited 1,
        # naming only the service's exit)
        cfg = ini(d, packed, "[router]\nendpoint = tcp://127.0.0.1:%d\n[executor]\nbackend = cuda\ngpu_mem = 1M\n"
                  "[launcher]\nready_timeout_s = 60\n" % (20000 + os.getpid() % 20000))
        try:
            refused(a.strata, cfg, ["executor exited with code 2 (bad config or usage): executor: "], False, detach=True)
        finally:
            subprocess.run([a.strata, "down", "--config", cfg], capture_output=True, text=True, timeout=60)
        print("test_up_check: ok")
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
