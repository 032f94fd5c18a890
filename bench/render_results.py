#!/usr/bin/env python3
"""render_results.py - bench/RESULTS.md from the results rows in bench/results/*.json.

A results file holds JSON lines (one row a line) or one JSON array of rows; a row is a tool's
row with the envelope of bench/README.md, "Results" (case, date, commit, machine, command,
model, gpu_budget, figure, unit, bound, bound_name, ratio). For each case the latest row is
shown: the greatest date, on a tie the later file (by name), then the later line.

usage: render_results.py [--results DIR] [--out FILE] [--check]
  --results DIR  the rows (default: results/ next to this script)
  --out FILE     the table (default: RESULTS.md next to this script)
  --check        write nothing; exit 1 if FILE is not what the rows render to
Exit codes: 0 ok, 1 stale (--check), 2 bad rows or usage.
"""
import argparse
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d+)?)?Z)?$")
BOUNDS = {
    "pcie_only": "PCIe only: every missed expert crosses PCIe, the GPU computes it",
    "bw_added": "PCIe + CPU, bandwidths added: the copy and the CPU path each at its alone-rate",
    "host_shared": "PCIe + CPU, host memory shared: the copy's and the CPU's reads capped together",
    "cpu_memory": "CPU backend: every byte read from host memory",
    "three_tier": "three tiers: host memory shared, and the experts it lacks read from disk first",
}


class RowError(Exception):
    pass


def load_rows(results_dir):
    """Every row of every results file, each as (row, file_index, line_index)."""
    rows = []
    files = sorted(glob.glob(os.path.join(results_dir, "*.json")))
    for fi, path in enumerate(files):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if text.lstrip().startswith("["):
            try:
                items = [(i + 1, r) for i, r in enumerate(json.loads(text))]
            except ValueError as e:
                raise RowError("%s: not a JSON array: %s" % (name, e))
        else:
            items = []
            for ln, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    items.append((ln, json.loads(line)))
                except ValueError as e:
                    raise RowError("%s:%d: not a JSON object: %s" % (name, ln, e))
        for ln, r in items:
            where = "%s:%d" % (name, ln)
            if not isinstance(r, dict):
                raise RowError("%s: a row is a JSON object" % where)
            for k in ("case", "date", "unit"):
                if not isinstance(r.get(k), str) or not r[k]:
                    raise RowError("%s: '%s' must be a non-empty string" % (where, k))
            if not DATE.match(r["date"]):
                raise RowError("%s: date %r is not ISO 8601 UTC (YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ)" % (where, r["date"]))
            for k in ("figure", "bound", "ratio"):
                v = r.get(k)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                    raise RowError("%s: '%s' must be a number or null" % (where, k))
            if r.get("bound") is not None and r.get("bound_name") not in BOUNDS:
                raise RowError("%s: bound_name %r is not one of %s" % (where, r.get("bound_name"), ", ".join(BOUNDS)))
            rows.append((r, fi, ln))
    return rows, files


def latest(rows):
    """case -> (its latest row, how many rows it has)."""
    best, count = {}, {}
    for r, fi, ln in rows:
        c = r["case"]
        count[c] = count.get(c, 0) + 1
        # a date alone sorts before any time of that day
        key = (r["date"], fi, ln)
        if c not in best or key > best[c][0]:
            best[c] = (key, r)
    return {c: (best[c][1], count[c]) for c in best}


def cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def num(v, fmt):
    return "-" if v is None else fmt % v


def fig(v):
    """Two decimals below 1000, one above (7166.3 tok/s, 214.04 tok/s)."""
    return "-" if v is None else "%.2f" % v if abs(v) < 1000 else "%.1f" % v


def render(rows, n_files):
    cases = latest(rows)
    machines = []
    for c in sorted(cases):
        m = cases[c][0].get("machine") or "unknown"
        if m not in machines:
            machines.append(m)
    out = ["# Results", "",
           "Rendered by `python3 bench/render_results.py` from `bench/results/*.json` (%d rows in %d file%s; "
           "bench/README.md, \"Results\", says what each field is). For each case, the latest row. Do not edit "
           "this file: add rows to `bench/results/` and render it again." % (len(rows), n_files, "" if n_files == 1 else "s"),
           "",
           "| case | figure | unit | bound | bound name | ratio | date | commit | machine | rows |",
           "|---|---:|---|---:|---|---:|---|---|---|---:|"]
    for c in sorted(cases):
        r, n = cases[c]
        out.append("| %s | %s | %s | %s | %s | %s | %s | %s | m%d | %d |" % (
            cell(c), fig(r.get("figure")), cell(r["unit"]), fig(r.get("bound")),
            cell(r.get("bound_name") or "-"), num(r.get("ratio"), "%.4f"), cell(r["date"]),
            cell(r.get("commit") or "-"), machines.index(r.get("machine") or "unknown") + 1, n))
    out += ["", "Bounds (bench/roofline.h):", ""]
    out += ["- `%s`: %s" % (k, v) for k, v in BOUNDS.items()]
    out += ["", "Machines:", ""]
    out += ["- m%d: %s" % (i + 1, cell(m)) for i, m in enumerate(machines)]
    out += ["", "Commands:", ""]
    for c in sorted(cases):
        r = cases[c][0]
        line = "- %s: `%s`" % (cell(c), r.get("command") or "?")
        made = (r.get("model") or {}).get("made_by") if isinstance(r.get("model"), dict) else None
        if made:
            line += "; the model from `%s`" % made
        out.append(line)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description="render bench/RESULTS.md from bench/results/*.json")
    ap.add_argument("--results", default=os.path.join(HERE, "results"))
    ap.add_argument("--out", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--check", action="store_true", help="exit 1 if --out is stale; write nothing")
    a = ap.parse_args()
    try:
        rows, files = load_rows(a.results)
    except (RowError, OSError) as e:
        print("render_results: %s" % e, file=sys.stderr)
        return 2
    text = render(rows, len(files))
    if a.check:
        try:
            with open(a.out, encoding="utf-8") as f:
                old = f.read()
        except OSError:
            old = None
        if old != text:
            print("render_results: %s is stale; run python3 bench/render_results.py" % a.out, file=sys.stderr)
            return 1
        return 0
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("render_results: %d cases from %d rows -> %s" % (len(latest(rows)), len(rows), a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
