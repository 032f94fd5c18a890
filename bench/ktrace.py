#!/usr/bin/env python3
"""ktrace.py - per-kernel shares of a step from a bench/ktrace.c trace.

A step runs from the end of one marker kernel (by default the argmax that ends every greedy
decode step) to the end of the next. Inside a step, a kernel's share is its end minus the
latest end before it (or minus its own start, when it started after that: the difference is
the step's idle time, "gap", mostly the host between graph launches). With programmatic
dependent launch a kernel starts before the one before it ends, so its own duration says
little; its share is what it adds to the step. Shares and gaps add up to the step.

  ktrace.py TRACE [--steps N] [--end NAME] [--per L] [--top N] [--timeline N] [--link]

Prints the step time, the gap, and a row per kernel (name, grid, block): its share a step,
launches a step and share a launch (or a layer with --per L). --timeline N prints the first N
kernels of the last step instead, with start, end and share in microseconds from the step's
beginning. --link (a trace taken with STRATA_KTRACE_MEMCPY=1) prints what the host-to-device
copies made of the PCIe link instead: bytes and copies a step, the time the link was busy (any
copy in flight) and idle, how far into a step the first copy of 1 MB or more starts and how
long before the step's end the last one ends (the steps that have one), and the rate of those
copies (each copy's bytes over its own duration).
"""
import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys


def parse(path, copies=None):
    """The kernels, sorted; with a list for copies, the host-to-device copies (start, end, bytes)."""
    kernels = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.startswith("M ") and copies is not None:
                p = line.split()
                if len(p) != 6:
                    sys.exit("ktrace.py: %s:%d: not a copy line" % (path, n))
                if p[5] == "1":  # CUPTI_ACTIVITY_MEMCPY_KIND_HTOD
                    copies.append((int(p[1]), int(p[2]), int(p[4])))
            if not line.startswith("K "):
                continue
            p = line.rstrip("\n").split(" ", 8)
            if len(p) != 9:
                sys.exit("ktrace.py: %s:%d: not a kernel line" % (path, n))
            kernels.append((int(p[1]), int(p[2]), "%sx%sx%s" % (p[4], p[5], p[6]), int(p[7]), p[8]))
    kernels.sort()
    if copies is not None:
        copies.sort()
    return kernels


def demangle(names):
    """Readable names: c++filt where there is one, else the mangled names."""
    names = sorted(set(names))
    if not names or not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names) + "\n", capture_output=True, text=True).stdout
    lines = out.split("\n")
    return {n: (lines[i] if i < len(lines) and lines[i] else n) for i, n in enumerate(names)}


def short(name, width=70):
    """The function name and its template arguments, without the parameter list."""
    m = re.match(r"(?:void )?([^(]*)", name)
    s = m.group(1) if m and m.group(1) else name
    return s if len(s) <= width else s[: width - 3] + "..."


def steps_of(kernels, end, n):
    """(first, last) kernel index ranges of the last n steps: each ends with a marker kernel."""
    marks = [i for i, k in enumerate(kernels) if end in k[4]]
    if len(marks) < 2:
        sys.exit("ktrace.py: fewer than two '%s' kernels: no whole step in the trace" % end)
    marks = marks[-(n + 1):]
    return [(a, b) for a, b in zip(marks[:-1], marks[1:])]


def walk(kernels, a, b):
    """The kernels of step (a, b) with what each adds to it: (kernel, share ns, gap ns before it)."""
    prev = kernels[a][1]
    for k in kernels[a + 1: b + 1]:
        yield k, max(0, k[1] - max(prev, k[0])), max(0, k[0] - prev)
        prev = max(prev, k[1])


def summarize(kernels, ranges):
    """Per (name, grid, block): [launches, share ns]; and the total step and gap ns."""
    acc = collections.defaultdict(lambda: [0, 0])
    total = gap = 0
    for a, b in ranges:
        total += kernels[b][1] - kernels[a][1]
        for k, share, g in walk(kernels, a, b):
            gap += g
            key = (k[4], k[2], k[3])
            acc[key][0] += 1
            acc[key][1] += share
    return acc, total, gap


def link(kernels, ranges, copies):
    """The link's share of each step: totals over the steps of bytes, copies, busy and idle (ns);
    over the steps with a big copy (1 MB or more) their number, the first one's start and the
    last one's end from the step's ends; and each big copy's rate (bytes/ns = GB/s)."""
    t = collections.Counter()
    rates = []
    for a, b in ranges:
        s0, s1 = kernels[a][1], kernels[b][1]
        mine = [c for c in copies if c[1] > s0 and c[0] < s1]
        big = [c for c in mine if c[2] >= 1 << 20]
        t["step"] += s1 - s0
        t["bytes"] += sum(c[2] for c in mine)
        t["copies"] += len(mine)
        rates += [c[2] / (c[1] - c[0]) for c in big if c[1] > c[0]]
        if big:
            t["big_steps"] += 1
            t["head"] += max(0, big[0][0] - s0)
            t["tail"] += max(0, s1 - max(c[1] for c in big))
        busy_to = s0
        for c0, c1, _ in mine:
            lo, hi = max(c0, s0), min(c1, s1)
            if lo > busy_to:
                t["idle"] += lo - busy_to
            busy_to = max(busy_to, hi)
        t["idle"] += s1 - busy_to
    t["busy"] = t["step"] - t["idle"]
    return t, sorted(rates)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("trace", help="file written by libstrata_ktrace.so (STRATA_KTRACE_OUT)")
    ap.add_argument("--steps", type=int, default=32, help="the last N steps (default 32)")
    ap.add_argument("--end", default="k_argmax", help="the kernel that ends a step (default k_argmax)")
    ap.add_argument("--per", type=int, default=0, help="also give shares a layer: L layers a step")
    ap.add_argument("--top", type=int, default=40, help="rows to print (default 40)")
    ap.add_argument("--timeline", type=int, default=0, help="print the first N kernels of the last step")
    ap.add_argument("--link", action="store_true", help="the host-to-device copies' use of the link (M lines)")
    o = ap.parse_args()
    if o.steps < 1:
        ap.error("--steps must be at least 1")
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
    copies = [] if o.link else None
    kernels = parse(o.trace, copies)
    ranges = steps_of(kernels, o.end, o.steps)
    if o.link:
        if not copies:
            sys.exit("ktrace.py: no host-to-device copies in the trace (take it with STRATA_KTRACE_MEMCPY=1)")
        t, rates = link(kernels, ranges, copies)
        n = len(ranges)
        print("steps %d: %.1f us a step; host-to-device %.2f MB in %.1f copies a step" %
              (n, t["step"] / n / 1e3, t["bytes"] / n / 1e6, t["copies"] / n))
        print("link busy %.1f us a step (%.1f%%), idle %.1f us" %
              (t["busy"] / n / 1e3, 100.0 * t["busy"] / t["step"], t["idle"] / n / 1e3))
        if rates:
            q = lambda f: rates[min(len(rates) - 1, int(f * len(rates)))]
            nb = t["big_steps"]
            print("copies of 1 MB or more: %d, GB/s p10 %.1f p50 %.1f p90 %.1f; in %d steps the first starts %.1f us "
                  "into the step, the last ends %.1f us before its end" %
                  (len(rates), q(0.1), q(0.5), q(0.9), nb, t["head"] / nb / 1e3, t["tail"] / nb / 1e3))
        return
    names = demangle(k[4] for k in kernels)
    if o.timeline:
        a, b = ranges[-1]
        t0 = kernels[a][1]
        print("%9s %9s %8s  %s" % ("start us", "end us", "share", "kernel (grid, block)"))
        for k, share, _ in walk(kernels, a, min(b, a + o.timeline)):
            print("%9.2f %9.2f %8.2f  %s (%s, %d)" % ((k[0] - t0) / 1e3, (k[1] - t0) / 1e3, share / 1e3,
                                                      short(names[k[4]]), k[2], k[3]))
        return
    acc, total, gap = summarize(kernels, ranges)
    n = len(ranges)
    print("steps %d: %.1f us a step (%.1f a second), of which gap %.1f us" %
          (n, total / n / 1e3, 1e9 * n / total if total else 0.0, gap / n / 1e3))
    per = " a layer" if o.per else " a launch"
    print("%10s %8s %10s  %s" % ("us a step", "launches", "us" + per, "kernel (grid, block)"))
    rows = sorted(acc.items(), key=lambda kv: -kv[1][1])[: o.top]
    for (name, grid, block), (count, share) in rows:
        unit = share / n / o.per if o.per else share / count
        print("%10.1f %8.1f %10.2f  %s (%s, %d)" % (share / n / 1e3, count / n, unit / 1e3, short(names[name]), grid,
                                                   block))


if __name__ == "__main__":
    main()
