#!/usr/bin/python3
"""test_dma_designs.py - bench/dma_designs without a GPU: --help of both roles, one
clear line naming the flag and exit 2 for each bad argument, and with no CUDA device visible
(CUDA_VISIBLE_DEVICES empty, so this holds on a GPU host too) a one-line error, exit 1, and no
shm segment left behind (nor a child: communicate() returns only once every holder of the
output pipes has exited). The measurement itself runs on the GPU host.

usage: test_dma_designs.py DMA_DESIGNS
"""
import os
import subprocess
import sys

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


def run(args, env=None):
    print("$ " + " ".join(args), file=sys.stderr)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = p.communicate(timeout=30)
    sys.stderr.write(out + err)
    return p.pid, p.returncode, out, err


def usage_errors(exe):
    bad = [(["--experts", "0"], "--experts"), (["--expert-bytes", "12Q"], "--expert-bytes"),
           (["--copies", "x"], "--copies"), (["--inflight", "65"], "--inflight"), (["--seed"], "--seed"),
           (["--slots", "1", "--inflight", "2"], "--slots"),
           (["--small-bytes", "2M", "--expert-bytes", "1M"], "--small-bytes"), (["--bogus"], "--bogus"),
           (["--role", "router"], "--role"), (["--role", "prefetcher"], "--endpoint"),
           (["--role", "prefetcher", "--endpoint", "ipc://@x", "--device", "-1"], "--device")]
    for args, flag in bad:
        _, rc, out, err = run([exe] + args)
        check(rc == 2, "%s: exit %d, want 2" % (" ".join(args), rc))
        lines = err.strip().splitlines()
        check(len(lines) == 1 and flag in lines[0],
              "%s: want one stderr line naming %s, got %r" % (" ".join(args), flag, err))
        check(out == "", "%s: nothing on stdout, got %r" % (" ".join(args), out))


def main():
    exe = sys.argv[1]
    _, rc, out, _ = run([exe, "--help"])
    check(rc == 0 and out.startswith("usage: dma_designs") and "--hbm-load" in out,
          "--help: exit %d, usage %r" % (rc, out[:60]))
    _, rc, out, _ = run([exe, "--role", "prefetcher", "--help"])
    check(rc == 0 and out.startswith("usage: dma_designs --role prefetcher"), "prefetcher --help: exit %d" % rc)
    usage_errors(exe)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    pid, rc, out, err = run([exe, "--experts", "2", "--expert-bytes", "1M"], env=env)
    check(rc == 1, "no GPU: exit %d, want 1" % rc)
    check(len(err.strip().splitlines()) == 1 and "no CUDA device" in err, "no GPU: want one line, got %r" % err)
    check(not os.path.exists("/dev/shm/strata-dmabench-%d-arena-0" % pid), "no GPU: the arena was left behind")
    print("%d failures" % len(failures), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
