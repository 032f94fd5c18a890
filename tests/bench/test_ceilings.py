#!/usr/bin/python3
"""test_ceilings.py - the ceilings helper's CLI: the host probe alone, the disk probe on a file
(O_DIRECT, io_uring), and clear failures for a missing file or one too short to read.

usage: test_ceilings.py CEILINGS_BIN WORK_DIR"""
import json
import os
import subprocess
import sys
import tempfile


def run(*args):
    return subprocess.run([sys.argv[1], "--mib", "16", "--no-gpu"] + list(args), capture_output=True, text=True, timeout=120)


def main():
    out = run()
    assert out.returncode == 0, out
    j = json.loads(out.stdout)
    assert j["cpu_gb_s"] > 0 and j["disk_gb_s"] is None and j["disk_file"] is None, j
    d = tempfile.mkdtemp(dir=sys.argv[2])
    try:
        small, big = os.path.join(d, "small.bin"), os.path.join(d, "big.bin")
        with open(small, "wb") as f:
            f.write(b"\1" * 100000)
        with open(big, "wb") as f:
            f.write(os.urandom(8 << 20))
        out = run("--disk", os.path.join(d, "nope.bin"))
        assert out.returncode == 1 and "nope.bin: open: No such file" in out.stderr, out
        out = run("--disk", big, "--disk-mib", "4")
        if out.returncode != 0 and "O_DIRECT is not supported" in out.stderr:
            print("skipped: %s" % out.stderr.strip())
            sys.exit(77)
        assert out.returncode == 0, out
        j = json.loads(out.stdout)
        assert j["disk_gb_s"] > 0 and j["disk_file"] == big, j
        print("disk probe: %.2f GB/s on %s" % (j["disk_gb_s"], big))
        out = run("--disk", small)
        assert out.returncode == 1 and "shorter than one 2 MiB read" in out.stderr, out
        out = subprocess.run([sys.argv[1], "--disk-mib", "x"], capture_output=True, text=True)
        assert out.returncode == 2, out
    finally:
        subprocess.run(["rm", "-rf", d])
    print("ok")


if __name__ == "__main__":
    main()
