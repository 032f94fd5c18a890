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
With --cache whole|split, each fixture is packed first (--formats, f32 and bf16 by default), a
prefetcher serves it from its arena, and [executor] gpu_mem is the smallest budget that holds one
layer's experts beside everything else (found from the executor's own refusals, which name what did
not fit and by how much): every step then misses, and the group runs through the expert cache, its
copies and its evictions. The same 95% teacher-forced criterion applies, against the fp32 reference.
With --expert-path cpu|pcie|cost (--cache whole) the executor's [executor] expert_path is set: cpu
hands every miss of a decode-shaped step to the prefetcher's cores (model/gpu_cpu.c), pcie copies
every one, cost lets the cost model split them. The run then checks, from the totals the executor
logs at its stop, that the path was taken: CPU experts for cpu (the prompts' prefills, longer than
GPU_CPU_ROWS, copy theirs), none for pcie.
Needs a GPU; run by tests/gpu/run, never by the CPU CI.

usage: test_group_greedy.py --strata BIN [--fixtures DIR] [--only NAME,...] [--backend cuda|cpu]
                            [--cache whole|split [--formats f32,bf16] [--expert-path cpu|pcie|cost]]
"""
import argparse
import json
import os
import re
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


GIB = 1 << 30


def write_ini(ini, run_dir, model, endpoint, backend, cache, budget, path=None):
    with open(ini, "w") as f:
        f.write("[group]\nname = gg%d\nrun_dir = %s\nmodel = %s\n\n[router]\nendpoint = %s\n\n"
                "[scheduler]\nkv_blocks = 64\nblock_size = 16\n\n[executor]\nbackend = %s\n"
                % (os.getpid() % 100000, run_dir, model, endpoint, backend))
        if cache:
            f.write("gpu_mem = %d\nexpert_cache = %s\n" % (budget, cache))
            if path:
                f.write("expert_path = %s\n" % path)
            f.write("\n[prefetcher.0]\nnuma_node = -1\n")
        f.write("\n[launcher]\nready_timeout_s = 120\n")


def executor_log(run_dir):
    p = os.path.join(run_dir, "logs", "executor.log")
    return open(p).read() if os.path.exists(p) else ""


def start(strata, ini, run_dir, model, endpoint, backend, cache, path=None):
    """strata up; with a cache, at a budget that holds one layer's experts and not all of them:
    from an all-resident start, the budget shrinks by the slots beyond one layer's (the layout line
    gives their size), and a refusal names what no longer fits and by how much. Returns the
    executor's layout line."""
    n_layer = n_moe_experts(model)
    budget = 64 << 20
    for _ in range(24):
        write_ini(ini, run_dir, model, endpoint, backend, cache, budget, path)
        up = subprocess.run([strata, "up", "--config", ini], capture_output=True, text=True, timeout=300)
        log = executor_log(run_dir)
        if os.path.exists(os.path.join(run_dir, "logs", "executor.log")):
            os.truncate(os.path.join(run_dir, "logs", "executor.log"), 0)
        if up.returncode == 0:
            m = re.findall(r"gpu: resident .*", log)
            layout = m[-1] if m else ""
            res = re.search(r"(\d+) expert slots x ([\d.]+) MB \(all resident\), budget ([\d.]+) of", layout)
            if not cache or not res or int(res.group(1)) <= n_layer:
                return layout  # with one MoE layer, every budget that holds a layer holds all
            subprocess.run([strata, "down", "--config", ini], capture_output=True, text=True, timeout=120)
            n, size, used = int(res.group(1)), float(res.group(2)) * 1e6, float(res.group(3)) * 1e6
            smaller = int(used - (n - n_layer - 0.5) * size)
            budget = smaller if smaller < budget else budget - int(size)
            continue
        subprocess.run([strata, "down", "--config", ini], capture_output=True, text=True, timeout=120)
        short = re.findall(r"needs (\d+) bytes but only (-?\d+) of --gpu-mem", log)
        slots = re.findall(r"room for (\d+) expert slots of (\d+) bytes; one layer needs (\d+)", log)
        if cache and slots:
            have, size, need = map(int, slots[-1])
            budget += (need - have) * size + size // 2
        elif cache and short:
            need, left = map(int, short[-1])
            budget += need - left + (64 << 10)
        else:
            raise RuntimeError("strata up failed: %s\n%s" % (up.stderr.strip()[-400:], log[-800:]))
    raise RuntimeError("no budget found that holds one layer's experts and not all (last %d bytes)" % budget)


class Skip(Exception):
    """A fixture this mode cannot exercise."""


def n_moe_experts(fdir):
    """Experts of one MoE layer, from config.json."""
    cfg = json.load(open(os.path.join(fdir, "config.json")))
    return cfg.get("num_local_experts") or cfg.get("num_experts") or 0


def check_path(path, log):
    """That the executor took the expert path asked for, from the totals it logs at a clean stop;
    a note on what it did."""
    m = re.findall(r"totals: .* expert cache (\d+) hits, (\d+) misses copied; cpu experts (\d+) in", log)
    if not m:
        raise RuntimeError("the executor logged no totals at its stop")
    hits, misses, uses = map(int, m[-1])
    note = "cpu experts %d, misses copied %d, hits %d" % (uses, misses, hits)
    if path == "cpu" and uses <= 0:
        raise RuntimeError("expert_path = cpu, but %s" % note)
    if path == "pcie" and uses:
        raise RuntimeError("expert_path = pcie, but %s" % note)
    return note


def run_fixture(strata, fdir, backend, cache=None, fmt=None, path=None):
    ref = json.load(open(os.path.join(fdir, "ref.json")))
    tokens, greedy = ref["tokens"], ref["greedy"]
    run_dir = tempfile.mkdtemp(prefix="strata-gpu-greedy-")
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    ini = os.path.join(run_dir, "group.ini")
    model = os.path.abspath(fdir)
    if cache:
        model = os.path.join(run_dir, "packed")
        pk = subprocess.run([strata, "pack", os.path.abspath(fdir), model, "--format", fmt], capture_output=True, text=True,
                            timeout=300)
        if pk.returncode != 0:
            raise RuntimeError("strata pack --format %s failed: %s" % (fmt, pk.stderr.strip()[-400:]))
    try:
        layout = start(strata, ini, run_dir, model, endpoint, backend, cache, path)
        if cache and not ("(cached)" in layout or "tail slots" in layout):
            if re.search(r"\b%d expert slots x .*all resident" % n_moe_experts(fdir), layout):
                raise Skip("one MoE layer: a budget that holds a layer's experts holds them all")
            raise RuntimeError("the budget left every expert resident: %s" % layout)
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
        gen = subprocess.run([strata, "generate", model, "--tokens", ",".join(map(str, tokens)),
                              "--max-tokens", str(n), "--ignore-eos"] + SAMPLED,
                             capture_output=True, text=True, timeout=300)
        cpu = [int(x) for x in gen.stdout.split()] if gen.returncode == 0 else []
        sprefix = 0
        while sprefix < min(len(s1), len(cpu)) and s1[sprefix] == cpu[sprefix]:
            sprefix += 1
        if path:
            subprocess.run([strata, "down", "--config", ini], capture_output=True, text=True, timeout=120)
            layout += "; " + check_path(path, executor_log(run_dir))
        return same, n, prefix, sprefix, layout
    finally:
        subprocess.run([strata, "down", "--config", ini], capture_output=True, text=True, timeout=120)
        subprocess.run(["rm", "-rf", run_dir])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixtures", default=os.path.join(HERE, "..", "fixtures"))
    ap.add_argument("--only", default="")
    ap.add_argument("--backend", default="cuda", help="cuda (default); cpu checks the plumbing without a GPU")
    ap.add_argument("--cache", choices=("whole", "split"), help="packed, from a prefetcher, a budget of one layer's experts")
    ap.add_argument("--formats", default="f32,bf16", help="with --cache: the packed formats")
    ap.add_argument("--expert-path", choices=("cpu", "pcie", "cost"), help="with --cache whole: [executor] expert_path")
    a = ap.parse_args()
    names = sorted(d for d in os.listdir(a.fixtures) if os.path.exists(os.path.join(a.fixtures, d, "ref.json")))
    if a.only:
        names = [n for n in names if n in a.only.split(",")]
    runs = [(n, f) for n in names for f in (a.formats.split(",") if a.cache else [None])]
    failed = skipped = 0
    for n, fmt in runs:
        label = n if not fmt else "%s/%s" % (n, fmt)
        try:
            same, total, prefix, sprefix, layout = run_fixture(a.strata, os.path.join(a.fixtures, n), a.backend, a.cache, fmt,
                                                               a.expert_path)
        except Skip as e:
            print("skip %-22s %s" % (label, e))
            skipped += 1
            continue
        except Exception as e:  # one fixture's failure must not hide the others
            print("FAIL %-22s %s" % (label, e))
            failed += 1
            continue
        ok = same * 100 >= total * 95
        failed += not ok
        print("%s %-22s teacher-forced %d/%d positions equal, free-running %d/%d before the first difference, "
              "sampled twice the same, %d/%d as strata generate's before the first difference"
              % ("ok  " if ok else "FAIL", label, same, total, prefix, total, sprefix, total))
        if a.cache:
            print("     %s" % layout.split("gpu: ", 1)[-1])
    print("test_group_greedy: %d runs, %d failed, %d skipped" % (len(runs), failed, skipped))
    return 1 if failed or skipped == len(runs) else 0


if __name__ == "__main__":
    sys.exit(main())
