#!/usr/bin/env python3
"""bench/ktrace.py on hand-made traces: shares, gaps and step times are what the kernels'
start and end times give; --per, --timeline, --end; a trace without two markers is refused."""
import os
import subprocess
import sys
import tempfile

KTRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "ktrace.py")
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL", what)


def run(trace_lines, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(trace_lines) + "\n")
        path = f.name
    try:
        p = subprocess.run([sys.executable, KTRACE, path, *args], capture_output=True, text=True)
    finally:
        os.unlink(path)
    return p.returncode, p.stdout, p.stderr


def k(start_us, end_us, name, grid="8x1x1", block=256):
    gx, gy, gz = grid.split("x")
    return "K %d %d 7 %s %s %s %d %s" % (start_us * 1000, end_us * 1000, gx, gy, gz, block, name)


# Three steps of 20 us each. A step: a 2 us host gap, kernel A (starts after the gap, ends 6 us
# in: share 4), kernel B launched early under PDL (starts at 3 us, before A ends, ends at 14:
# share 8), kernel A again (ends 16: share 2), then the marker (ends 20: share 4). Shares + gap
# = 20 a step.
lines = ["M 0 1000 3 4096 1"]
t = 0
lines.append(k(0, 0, "_Z8k_argmaxv"))
for s in range(3):
    lines += [k(t + 2, t + 6, "_Z3k_av"), k(t + 3, t + 14, "_Z3k_bv", "4x2x1", 128), k(t + 14, t + 16, "_Z3k_av"),
              k(t + 16, t + 20, "_Z8k_argmaxv", "1x1x1", 32)]
    t += 20
rc, out, err = run(lines, "--steps", "2")
check(rc == 0, "summary exit 0 (%d: %s)" % (rc, err))
check("steps 2: 20.0 us a step (50000.0 a second), of which gap 2.0 us" in out, "step line: " + out)
rows = {}
for line in out.splitlines()[2:]:
    f = line.split()
    rows[" ".join(f[3:])] = (float(f[0]), float(f[1]), float(f[2]))
a = [v for key, v in rows.items() if key.startswith("k_a (")]
b = [v for key, v in rows.items() if key.startswith("k_b (")]
m = [v for key, v in rows.items() if key.startswith("k_argmax (")]
check(len(a) == 1 and a[0] == (6.0, 2.0, 3.0), "kernel A: 6 us a step, 2 launches, 3 a launch: %s" % a)
check(len(b) == 1 and b[0] == (8.0, 1.0, 8.0), "kernel B: 8 us a step under PDL: %s" % b)
check(len(m) == 1 and m[0] == (4.0, 1.0, 4.0), "marker: 4 us a step: %s" % m)
check(any("(4x2x1, 128)" in key for key in rows), "grid and block in the key: %s" % list(rows))
check(round(sum(v[0] for v in rows.values()) + 2.0, 6) == 20.0, "shares and gap add up to the step")

rc, out, _ = run(lines, "--steps", "5", "--per", "2")
check(rc == 0 and "steps 3:" in out, "asking for more steps than there are takes all: " + out)
check(any(line.split()[2] == "3.00" and "k_a (" in line for line in out.splitlines()), "--per 2: 3 us a layer")

rc, out, _ = run(lines, "--timeline", "2")
tl = out.splitlines()
check(rc == 0 and len(tl) == 3, "timeline of 2 kernels: " + out)
check(tl[1].split()[:3] == ["2.00", "6.00", "4.00"], "timeline row: " + tl[1])
check(tl[2].split()[:3] == ["3.00", "14.00", "8.00"], "timeline row under PDL: " + tl[2])

rc, out, _ = run(lines, "--end", "k_b", "--steps", "1")
check(rc == 0 and "steps 1: 20.0 us a step" in out, "--end k_b: " + out)

# --link: two steps (20 us each) with host-to-device copies (kind 1; a kind-2 copy is not counted):
# step 1 (0..20 us after the first marker): 2 MB at 4..8 and 1 MB at 7..10 (overlapping copies
# count once), busy 6, idle 14 (4 before, 10 after); step 2 (20..40): none, idle 20
lk = [k(0, 0, "_Z8k_argmaxv"), k(19, 20, "_Z8k_argmaxv"), k(39, 40, "_Z8k_argmaxv"),
      "M 4000 8000 9 2097152 1", "M 7000 10000 9 1048576 1", "M 5000 6000 9 999 2"]
rc, out, err = run(lk, "--link", "--steps", "2")
ll = out.splitlines()
check(rc == 0 and len(ll) == 3, "--link: three lines: %s %s" % (out, err))
check(ll and ll[0] == "steps 2: 20.0 us a step; host-to-device 1.57 MB in 1.0 copies a step", "--link bytes: " + out)
check(len(ll) > 1 and ll[1] == "link busy 3.0 us a step (15.0%), idle 17.0 us", "--link busy and idle: " + out)
check(len(ll) > 2 and ll[2] == "copies of 1 MB or more: 2, GB/s p10 349.5 p50 524.3 p90 524.3; in 1 steps the first "
      "starts 4.0 us into the step, the last ends 10.0 us before its end", "--link rates and ends: " + out)
rc, _, err = run(lines[1:], "--link")
check(rc != 0 and "STRATA_KTRACE_MEMCPY" in err, "--link without copies is refused: " + err)

rc, _, err = run(lines[:3], "--steps", "1")
check(rc != 0 and "no whole step" in err, "one marker is refused: " + err)
rc, _, err = run(["K 1 2 3"])
check(rc != 0 and "not a kernel line" in err, "a bad line is refused: " + err)
rc, _, err = run(lines, "--steps", "0")
check(rc == 2, "--steps 0 is a usage error")

print("ktrace: %d failed" % failures)
sys.exit(1 if failures else 0)
