#!/usr/bin/python3
"""test_render_results.py - bench/render_results.py on a results folder written here: JSON lines
and a JSON array, the latest row of a case wins (by date, then by file, then by line), --check
finds a stale table, bad rows are refused with exit 2. With --tree, also that the tree's own
bench/RESULTS.md is what its bench/results/ renders to.

usage: test_render_results.py RENDER_RESULTS_PY [--tree]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


def row(case, date, figure, bound=None, bound_name=None, commit="abc1234", machine="test machine", command="cmd"):
    return {"case": case, "date": date, "commit": commit, "machine": machine, "command": command,
            "model": {"shape": "tiny", "format": "int4-g32", "attn_format": "int4", "route_skew": "uniform"},
            "gpu_budget": None, "figure": figure, "unit": "decode tok/s (aggregate)", "bound": bound,
            "bound_name": bound_name, "ratio": figure / bound if bound else None}


def render(script, d, *extra):
    p = subprocess.run([sys.executable, script, "--results", os.path.join(d, "results"), "--out",
                        os.path.join(d, "RESULTS.md")] + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=60)
    sys.stderr.write(p.stdout + p.stderr)
    return p


def table(d):
    """case -> the row's cells, from the rendered table."""
    out = {}
    for line in open(os.path.join(d, "RESULTS.md")).read().splitlines():
        if line.startswith("| ") and not line.startswith("| case | figure "):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            out[cells[0]] = cells
    return out


def write_lines(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write("\n")  # a blank line is allowed


def main():
    script = os.path.abspath(sys.argv[1])
    d = tempfile.mkdtemp(prefix="strata-results-")
    try:
        res = os.path.join(d, "results")
        os.mkdir(res)
        # a.json, JSON lines: case A twice (the later date wins, though it comes first), case B;
        # case C twice on the same date (the later line wins)
        write_lines(os.path.join(res, "a.json"), [
            row("case A", "2026-02-01T10:00:00Z", 20.0, 40.0, "pcie_only", commit="new0001"),
            row("case A", "2026-01-01", 10.0, 40.0, "pcie_only", commit="old0001"),
            row("case B", "2026-01-05", 7166.3),
            row("case C", "2026-01-05", 1.0, 2.0, "host_shared", commit="first"),
            row("case C", "2026-01-05", 1.5, 2.0, "host_shared", commit="second")])
        # b.json, one JSON array: case A again on a date alone before a.json's time of that day
        # (loses), case D; case B on the same date as a.json's, in a later file (wins)
        with open(os.path.join(res, "b.json"), "w") as f:
            json.dump([row("case A", "2026-02-01", 30.0, 40.0, "pcie_only", commit="day0001"),
                       row("case B", "2026-01-05", 8000.0, machine="other machine", commit="later"),
                       row("case D", "2025-12-31T23:59:59Z", 3.25, 4.0, "bw_added")], f)
        p = render(script, d)
        check(p.returncode == 0, "render exit %d" % p.returncode)
        t = table(d)
        check(sorted(t) == ["case A", "case B", "case C", "case D"], "cases %r" % sorted(t))
        # columns: case figure unit bound bound-name ratio date commit machine rows
        a = t.get("case A", [])
        check(a[1:9] == ["20.00", "decode tok/s (aggregate)", "40.00", "pcie_only", "0.5000", "2026-02-01T10:00:00Z",
                         "new0001", "m1"] and a[9] == "3", "case A (latest by date): %r" % a)
        b = t.get("case B", [])
        check(b[1] == "8000.0" and b[3:6] == ["-", "-", "-"] and b[7] == "later" and b[9] == "2",
              "case B (a tie: the later file): %r" % b)
        c = t.get("case C", [])
        check(c[1] == "1.50" and c[4] == "host_shared" and c[7] == "second", "case C (a tie: the later line): %r" % c)
        dd = t.get("case D", [])
        check(dd[1:7] == ["3.25", "decode tok/s (aggregate)", "4.00", "bw_added", "0.8125", "2025-12-31T23:59:59Z"],
              "case D: %r" % dd)
        text = open(os.path.join(d, "RESULTS.md")).read()
        check("- m1: test machine" in text and "- m2: other machine" in text, "machines list")
        check("- case A: `cmd`" in text, "commands list")
        # fresh, then stale after a newer row, fresh again after rendering
        check(render(script, d, "--check").returncode == 0, "--check on a fresh table")
        with open(os.path.join(res, "a.json"), "a") as f:
            f.write(json.dumps(row("case A", "2026-03-01T00:00:00Z", 25.0, 40.0, "pcie_only", commit="newest")) + "\n")
        before = open(os.path.join(d, "RESULTS.md")).read()
        check(render(script, d, "--check").returncode == 1, "--check on a stale table")
        check(open(os.path.join(d, "RESULTS.md")).read() == before, "--check wrote the table")
        check(render(script, d).returncode == 0 and table(d).get("case A", [None] * 8)[7] == "newest",
              "the newest row after rendering again")
        check(render(script, d, "--check").returncode == 0, "--check after rendering again")
        os.remove(os.path.join(d, "RESULTS.md"))
        check(render(script, d, "--check").returncode == 1, "--check without a table")
        # bad rows: exit 2, naming the file and line
        for bad, what in [("{not json", "not a JSON object"), (json.dumps({"case": "x", "date": "2026-01-01"}), "'unit'"),
                          (json.dumps(dict(row("x", "30/11/2026", 1.0))), "ISO 8601"),
                          (json.dumps(row("x", "2026-01-01", 1.0, 2.0, "nonsense")), "bound_name"),
                          (json.dumps(dict(row("x", "2026-01-01", 1.0), figure="fast")), "'figure'")]:
            with open(os.path.join(res, "c.json"), "w") as f:
                f.write(bad + "\n")
            p = render(script, d)
            check(p.returncode == 2 and "c.json:1" in p.stderr and what in p.stderr, "bad row %r: exit %d, %r" % (
                bad, p.returncode, p.stderr))
        os.remove(os.path.join(res, "c.json"))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if "--tree" in sys.argv[2:]:
        # the committed table is what the committed rows render to
        p = subprocess.run([sys.executable, script, "--check"], stderr=subprocess.PIPE, text=True, timeout=60)
        check(p.returncode == 0, "bench/RESULTS.md is stale: run python3 bench/render_results.py (%s)" % p.stderr.strip())
    print("render_results: %d failures" % len(failures), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
