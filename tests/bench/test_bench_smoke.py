#!/usr/bin/python3
"""test_bench_smoke.py - the benchmark harness end to end on a tiny model through the CPU
backend, as CI runs it. No timing assertions: every figure must be present, be a
number where the CPU backend has one (null where it has none: cache hit rate, PCIe), and obey
the invariants that hold at any speed (p99 >= p50, request counts, nothing left behind).

usage: test_bench_smoke.py --strata STRATA CASE
  closed    strata synth, then strata bench --batch 1,3 starting its own group: rows, results rows, PNG,
            cleanup
  open      open loop (Poisson arrivals)
  endpoint  strata bench --endpoint against a group started with strata up, which keeps running
  virtual   a group on a virtual synthetic folder (prefetcher generates the arena) answers like the
            CPU on the same model written to disk
  cpu_experts  --prefetchers 2 --expert-path cpu: the experts computed by the two prefetchers are
            reported (per step, GB/s, share, no fallbacks); --expert-path pcie reports none
  cli       strata synth / strata bench usage errors, --help, --list, --force, --synthetic
"""
import argparse
import glob
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

REQUIRED = ["machine", "host", "model_shape", "format", "gpu_mem", "batch", "decode_tok_s", "prefill_tok_s",
            "ttft_p50_ms", "itl_p99_ms", "hit_rate", "pcie_gb_s", "prefetch_accuracy", "bound_tok_s", "ratio",
            "bound_pcie_only_tok_s", "bound_bw_added_tok_s", "bound_host_shared_tok_s", "ratio_pcie_only",
            "ratio_bw_added", "ratio_host_shared", "cpu_expert_share", "prefetcher_expert_share", "cpu_experts_per_step",
            "cpu_tokens_per_step", "cpu_ms_per_step", "cpu_wait_ms_per_step", "cpu_gb_s", "cpu_expert_fallbacks",
            "expert_path", "prefetchers"]
# the figures of the experts the prefetchers computed (null when the group reports none)
CPU_EXPERTS = ["prefetcher_expert_share", "cpu_experts_per_step", "cpu_tokens_per_step", "cpu_ms_per_step",
               "cpu_wait_ms_per_step", "cpu_gb_s"]
# the results envelope (bench/README.md, "Results"), first in every row
ENVELOPE = ["case", "date", "commit", "machine", "command", "model", "gpu_budget", "figure", "unit", "bound",
            "bound_name", "ratio"]

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, file=sys.stderr)


def run(cmd, timeout=300, **kw):
    print("$ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, **kw)
    sys.stderr.write(p.stdout)
    sys.stderr.write(p.stderr)
    return p


def positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def synth(strata, out, shape="tiny-mixtral", extra=()):
    p = run([strata, "synth", "--shape", shape, "--format", "int4", "--align", "65536", "--quiet", out] + list(extra))
    check(p.returncode == 0, "strata synth %s exit %d" % (shape, p.returncode))


def check_rows(rows, n, load, batches=None, shape="tiny-mixtral", bound=("cpu_memory", "bound_tok_s")):
    """bound: the envelope's bound_name and the row's field it is."""
    check(isinstance(rows, list) and len(rows) == n, "%d rows expected, got %r" % (n, rows))
    for i, r in enumerate(rows if isinstance(rows, list) else []):
        for k in REQUIRED:
            check(k in r, "row %d lacks '%s'" % (i, k))
        check(r.get("model_shape") == shape, "row %d model_shape %r" % (i, r.get("model_shape")))
        check(r.get("format") == "int4-g32", "row %d format %r" % (i, r.get("format")))
        check(r.get("gpu_mem") == 0 and r.get("load") == load, "row %d gpu_mem/load" % i)
        check(r.get("errors") == 0, "row %d: %r errors, first %r" % (i, r.get("errors"), r.get("first_error")))
        for k in ["decode_tok_s", "decode_tok_s_per_seq", "prefill_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms",
                  "itl_p99_ms", "bound_tok_s", "ratio", "bound_rtx3090_tok_s", "bound_rtx4090_tok_s"]:
            check(positive(r.get(k)), "row %d: %s = %r is not a positive number" % (i, k, r.get(k)))
        # the CPU backend has no expert cache and no PCIe traffic; every expert runs on the CPU
        check(r.get("hit_rate") is None and r.get("pcie_gb_s") is None and r.get("prefetch_accuracy") is None,
              "row %d: cache figures on the CPU backend" % i)
        check("bound_pcie_only_tok_s" in r and r["bound_pcie_only_tok_s"] is None and r.get("ratio_pcie_only") is None,
              "row %d: a PCIe-only bound on the CPU backend: %r" % (i, r.get("bound_pcie_only_tok_s")))
        check(r.get("cpu_expert_share") == 1.0, "row %d: cpu_expert_share %r" % (i, r.get("cpu_expert_share")))
        if positive(r.get("ttft_p50_ms")) and positive(r.get("ttft_p99_ms")):
            check(r["ttft_p99_ms"] >= r["ttft_p50_ms"], "row %d: ttft p99 < p50" % i)
        if positive(r.get("itl_p50_ms")) and positive(r.get("itl_p99_ms")):
            check(r["itl_p99_ms"] >= r["itl_p50_ms"], "row %d: itl p99 < p50" % i)
        if positive(r.get("decode_tok_s")) and positive(r.get(bound[1])) and positive(r.get("ratio")):
            check(abs(r["ratio"] - r["decode_tok_s"] / r[bound[1]]) < 1e-6 * r["ratio"] + 1e-12,
                  "row %d: ratio is not measured / bound" % i)
        check(r.get("bound_limit") == "cpu memory", "row %d: bound_limit %r" % (i, r.get("bound_limit")))
        # one reader on the CPU backend: bandwidths added and host memory shared are the same bound
        check(positive(r.get("bound_bw_added_tok_s")) and r.get("bound_bw_added_tok_s") == r.get("bound_tok_s") and
              r.get("bound_host_shared_tok_s") == r.get("bound_bw_added_tok_s") and
              r.get("ratio_host_shared") == r.get("ratio_bw_added"), "row %d: the CPU backend's bounds" % i)
        check(list(r)[:len(ENVELOPE)] == ENVELOPE, "row %d: the envelope is not first: %r" % (i, list(r)[:12]))
        check(r.get("figure") == r.get("decode_tok_s") and r.get("bound") == r.get(bound[1]) and
              r.get("bound_name") == bound[0] and r.get("unit") == "decode tok/s (aggregate)",
              "row %d: envelope figure/bound %r" % (i, {k: r.get(k) for k in ENVELOPE}))
        check(isinstance(r.get("case"), str) and (shape + " int4") in r["case"] and "[strata bench" in r["case"],
              "row %d: case %r" % (i, r.get("case")))
        check(re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$", r.get("date") or "") is not None,
              "row %d: date %r" % (i, r.get("date")))
        check(isinstance(r.get("command"), str) and r["command"].startswith("strata bench "),
              "row %d: command %r" % (i, r.get("command")))
        check(isinstance(r.get("machine"), str) and "CPUs" in r["machine"], "row %d: machine %r" % (i, r.get("machine")))
        if batches:
            check(r.get("batch") == batches[i], "row %d: batch %r, expected %r" % (i, r.get("batch"), batches[i]))
            check(r.get("requests") == max(2 * batches[i], 4), "row %d: %r measured requests" % (i, r.get("requests")))


def no_leftovers(stderr):
    """The group this bench started (named in its stderr) left no run dir and no shm segment."""
    m = re.search(r"starting the group \((/tmp/strata-bench-(\d+))/bench\.ini\)", stderr)
    check(m is not None, "bench did not say which group it started")
    if not m:
        return
    check(not os.path.exists(m.group(1)), "run dir left behind: %s" % m.group(1))
    left = glob.glob("/dev/shm/strata-bench%d-*" % (int(m.group(2)) % 100000))
    check(not left, "shm segments left behind: %r" % left)


def no_leftovers_shm(stderr):
    """The group this bench started in a --run-dir of the test's left no shm segment (arenas, rings)."""
    m = re.search(r"starting the group \(.*/bench\.ini\)", stderr)
    g = re.search(r"group 'bench(\d+)' ready", stderr)
    check(m is not None and g is not None, "bench did not say which group it started")
    if g:
        left = glob.glob("/dev/shm/strata-bench%s-*" % g.group(1))
        check(not left, "shm segments left behind: %r" % left)


def case_closed(strata, tmp):
    model = os.path.join(tmp, "m")
    synth(strata, model)
    js = os.path.join(tmp, "out.json")
    res = os.path.join(tmp, "results.json")
    with open(res, "w") as f:  # --results appends to what is there
        f.write(json.dumps({"case": "an older row"}) + "\n")
    p = run([strata, "bench", "--model", model, "--batch", "1,3", "--prompt", "12", "--gen", "8", "--json", js,
             "--threads", "2", "--probe-mib", "32", "--results", res, "--max-batch-tokens", "64"],
            env=dict(os.environ, STRATA_COMMIT="feedbee"))
    check(p.returncode == 0, "strata bench exit %d" % p.returncode)
    rows = json.load(open(js)) if os.path.exists(js) else None
    check_rows(rows, 2, "closed", batches=[1, 3])
    lines = open(res).read().splitlines() if os.path.exists(res) else []
    check(len(lines) == 3 and json.loads(lines[0]) == {"case": "an older row"}, "results file: %d lines" % len(lines))
    for i, line in enumerate(lines[1:]):
        r = json.loads(line)
        check(rows and r == rows[i], "results row %d differs from the --json row" % i)
        check(r.get("commit") == "feedbee" and r.get("max_batch_tokens") == 64, "results row %d: commit %r, budget %r" % (
            i, r.get("commit"), r.get("max_batch_tokens")))
        check(r.get("case") == "tiny-mixtral int4 attn bf16 resident batch %d decode, max-batch-tokens 64, prompt 12 gen 8 "
              "[strata bench cpu]" % [1, 3][i], "results row %d: case %r" % (i, r.get("case")))
    png = os.path.join(tmp, "out.png")
    check(os.path.exists(png) and open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n", "no PNG plot at %s" % png)
    check("roofline (decode)" in p.stdout and "rtx3090" in p.stdout and "rtx4090" in p.stdout,
          "no roofline table with projections on stdout")
    no_leftovers(p.stderr)


def case_open(strata, tmp):
    model = os.path.join(tmp, "m")
    synth(strata, model)
    js = os.path.join(tmp, "open.json")
    p = run([strata, "bench", "--model", model, "--rate", "20", "--requests", "6", "--warmup", "2", "--prompt", "8",
             "--gen", "6", "--json", js, "--threads", "2", "--probe-mib", "32"])
    check(p.returncode == 0, "strata bench --rate exit %d" % p.returncode)
    rows = json.load(open(js)) if os.path.exists(js) else None
    check_rows(rows, 1, "open")
    if rows:
        check(rows[0].get("rate_rps") == 20 and rows[0].get("requests") == 6, "open row: %r" % rows[0])
        check(positive(rows[0].get("mean_concurrency")), "open row: mean_concurrency %r" % rows[0].get("mean_concurrency"))
    no_leftovers(p.stderr)


def case_endpoint(strata, tmp):
    model = os.path.join(tmp, "m")
    synth(strata, model)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    name = "bsmoke%d" % os.getpid()
    run_dir = os.path.join(tmp, "run")
    cfg = os.path.join(tmp, "g.ini")
    with open(cfg, "w") as f:
        f.write("[group]\nname = %s\nrun_dir = %s\nmodel = %s\n\n[router]\nendpoint = tcp://127.0.0.1:%d\n\n"
                "[scheduler]\nmax_seqs = 8\nkv_blocks = 128\n\n[executor]\nbackend = cpu\nthreads = 2\n\n"
                "[prefetcher.0]\nnuma_node = -1\n" % (name, run_dir, model, port))
    p = run([strata, "up", "--config", cfg], timeout=120)
    check(p.returncode == 0, "strata up exit %d" % p.returncode)
    try:
        js = os.path.join(tmp, "ep.json")
        p = run([strata, "bench", "--endpoint", "tcp://127.0.0.1:%d" % port, "--model", model, "--batch", "2",
                 "--prompt", "8", "--gen", "6", "--json", js, "--probe-mib", "32", "--no-plot"])
        check(p.returncode == 0, "strata bench --endpoint exit %d" % p.returncode)
        rows = json.load(open(js)) if os.path.exists(js) else []
        check(len(rows) == 1 and rows[0].get("errors") == 0 and positive(rows[0].get("decode_tok_s")),
              "endpoint rows %r" % rows)
        check(rows and rows[0].get("backend") is None, "endpoint row names a backend it did not start")
        # the group it did not start is still serving
        st = run([strata, "status", "--config", cfg])
        check(st.returncode == 0 and "router" in st.stdout and "running" in st.stdout, "group not running after bench")
        # a wrong endpoint fails cleanly, not after the whole timeout
        p = run([strata, "bench", "--endpoint", "tcp://127.0.0.1:1", "--batch", "1", "--no-probe", "--no-plot",
                 "--ready-timeout", "3"], timeout=60)
        check(p.returncode == 1 and "does not report a ready scheduler" in p.stderr, "bad endpoint: %d" % p.returncode)
    finally:
        run([strata, "down", "--config", cfg], timeout=60)


def case_virtual(strata, tmp):
    """A group on a virtual synthetic folder: the prefetcher generates the weights into its arena,
    and greedy answers equal the CPU forward pass over the same model written to disk."""
    real, virt = os.path.join(tmp, "real"), os.path.join(tmp, "virt")
    synth(strata, real, "tiny-qwen2", ["--seed", "5"])
    synth(strata, virt, "tiny-qwen2", ["--seed", "5", "--synthetic"])
    for f in glob.glob(os.path.join(virt, "*.bin")):
        check(os.stat(f).st_blocks * 512 < 65536, "%s is not a placeholder" % f)
    prompt = "3,1,4,1,5,9,2,6"
    g = run([strata, "generate", real, "--tokens", prompt, "--max-tokens", "12", "--ignore-eos"])
    check(g.returncode == 0 and len(g.stdout.split()) == 12, "generate on the written model")
    # loading the virtual folder from disk gives zeros, so its answer differs (the test can fail)
    z = run([strata, "generate", virt, "--tokens", prompt, "--max-tokens", "12", "--ignore-eos"])
    check(z.returncode == 0 and z.stdout.split() != g.stdout.split(), "placeholders read as the real weights?")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cfg = os.path.join(tmp, "v.ini")
    with open(cfg, "w") as f:
        f.write("[group]\nname = bvirt%d\nrun_dir = %s\nmodel = %s\n\n[router]\nendpoint = tcp://127.0.0.1:%d\n\n"
                "[executor]\nbackend = cpu\nthreads = 2\n\n[prefetcher.0]\nnuma_node = -1\n"
                % (os.getpid(), os.path.join(tmp, "vrun"), virt, port))
    p = run([strata, "up", "--config", cfg], timeout=120)
    check(p.returncode == 0, "strata up on the virtual folder: %d" % p.returncode)
    try:
        c = run([strata, "client", "--endpoint", "tcp://127.0.0.1:%d" % port, "--tokens", prompt, "--max-tokens", "12",
                 "--ignore-eos", "--ids"], timeout=120)
        check(c.returncode == 0, "strata client: %d" % c.returncode)
        check(c.stdout.split() == g.stdout.split(), "group on the virtual folder answers %r, the written model %r"
              % (c.stdout.split(), g.stdout.split()))
        log = open(os.path.join(tmp, "vrun", "logs", "prefetcher.0.log")).read() if os.path.exists(
            os.path.join(tmp, "vrun", "logs", "prefetcher.0.log")) else ""
        check("virtual synthetic model" in log, "the prefetcher log does not say it generated the weights")
    finally:
        run([strata, "down", "--config", cfg], timeout=60)


def case_cpu_experts(strata, tmp):
    """The model's experts split over two prefetchers, which compute them (expert_path = cpu):
    every routed (token, expert) pair is theirs, none falls back to the executor; with
    expert_path = pcie the executor computes them all and no figure says otherwise."""
    model = os.path.join(tmp, "m")
    synth(strata, model)
    js = os.path.join(tmp, "cpu.json")
    run_dir = os.path.join(tmp, "run")  # not the default, so bench leaves it (and its config) for us
    p = run([strata, "bench", "--model", model, "--backend", "cpu", "--prefetchers", "2", "--expert-path", "cpu",
             "--batch", "1,3", "--prompt", "12", "--gen", "8", "--json", js, "--threads", "2", "--probe-mib", "32",
             "--no-plot", "--run-dir", run_dir])
    check(p.returncode == 0, "strata bench --prefetchers 2 --expert-path cpu exit %d" % p.returncode)
    ini = open(os.path.join(run_dir, "bench.ini")).read() if os.path.exists(os.path.join(run_dir, "bench.ini")) else ""
    check("[prefetcher.0]" in ini and "[prefetcher.1]" in ini and "[prefetcher.2]" not in ini and
          re.search(r"^expert_path = cpu$", ini, re.M), "the group's config: %r" % ini)
    check(os.path.exists(os.path.join(run_dir, "logs", "prefetcher.1.log")), "no second prefetcher ran")
    rows = json.load(open(js)) if os.path.exists(js) else None
    check_rows(rows, 2, "closed", batches=[1, 3])
    for i, r in enumerate(rows or []):
        print("row %d (batch %r): %s" % (i, r.get("batch"), json.dumps({k: r.get(k) for k in CPU_EXPERTS +
                                                                          ["cpu_expert_fallbacks"]})), file=sys.stderr)
        check(r.get("expert_path") == "cpu" and r.get("prefetchers") == 2, "row %d: expert_path %r prefetchers %r" % (
            i, r.get("expert_path"), r.get("prefetchers")))
        check("expert-path cpu, 2 prefetchers" in (r.get("case") or ""), "row %d: case %r" % (i, r.get("case")))
        for k in ["cpu_experts_per_step", "cpu_tokens_per_step", "cpu_ms_per_step", "cpu_gb_s"]:
            check(positive(r.get(k)), "row %d: %s = %r is not a positive number" % (i, k, r.get(k)))
        w = r.get("cpu_wait_ms_per_step")
        check(isinstance(w, (int, float)) and math.isfinite(w) and w >= 0, "row %d: cpu_wait_ms_per_step %r" % (i, w))
        check(r.get("cpu_expert_fallbacks") == 0, "row %d: %r fallbacks" % (i, r.get("cpu_expert_fallbacks")))
        # each expert a prefetcher computed has at least one token row
        if positive(r.get("cpu_tokens_per_step")) and positive(r.get("cpu_experts_per_step")):
            check(r["cpu_tokens_per_step"] >= r["cpu_experts_per_step"], "row %d: fewer rows than experts" % i)
        sh = r.get("prefetcher_expert_share")
        check(positive(sh) and sh <= 1, "row %d: prefetcher_expert_share %r not in (0, 1]" % (i, sh))
        # expert_path = cpu and no fallback: every pair of every MoE layer went to a prefetcher (the
        # rows and the executor's tokens come from one stats reply, so this is exact)
        check(positive(sh) and abs(sh - 1) < 1e-9, "row %d: prefetcher_expert_share %r, expected 1" % (i, sh))
        check(r.get("cpu_expert_share") == 1.0, "row %d: cpu_expert_share %r" % (i, r.get("cpu_expert_share")))
    no_leftovers_shm(p.stderr)
    # pcie on the CPU backend: the executor computes every expert itself
    js = os.path.join(tmp, "pcie.json")
    p = run([strata, "bench", "--model", model, "--backend", "cpu", "--prefetchers", "2", "--expert-path", "pcie",
             "--batch", "2", "--prompt", "12", "--gen", "8", "--json", js, "--threads", "2", "--no-probe", "--no-plot"])
    check(p.returncode == 0, "strata bench --expert-path pcie exit %d" % p.returncode)
    rows = json.load(open(js)) if os.path.exists(js) else []
    check(len(rows) == 1, "pcie rows %r" % rows)
    for r in rows:
        print("pcie row: %s" % json.dumps({k: r.get(k) for k in CPU_EXPERTS + ["cpu_expert_fallbacks"]}), file=sys.stderr)
        check(r.get("errors") == 0 and positive(r.get("decode_tok_s")), "pcie row: errors %r" % r.get("errors"))
        check(r.get("expert_path") == "pcie", "pcie row: expert_path %r" % r.get("expert_path"))
        for k in CPU_EXPERTS:
            check(r.get(k) in (None, 0), "pcie row: %s = %r" % (k, r.get(k)))
    no_leftovers(p.stderr)


def case_disk_tier(strata, tmp):
    """--host-mem: the group's prefetcher gets the host budget (the disk tier), the ceilings probe
    the disk on the model's first expert file, and every row carries the disk tier's figures and
    the three-tier bound it is measured against."""
    model = os.path.join(tmp, "m")
    p = run([strata, "synth", "--shape", "disk-mixtral", "--format", "int4", "--align", "4096", "--quiet", model])
    check(p.returncode == 0, "strata synth disk-mixtral exit %d" % p.returncode)
    js = os.path.join(tmp, "disk.json")
    run_dir = os.path.join(tmp, "run")
    p = run([strata, "bench", "--model", model, "--backend", "cpu", "--host-mem", "14M", "--batch", "1,4", "--prompt", "8",
             "--gen", "8", "--json", js, "--threads", "2", "--probe-mib", "32", "--no-plot", "--run-dir", run_dir])
    check(p.returncode == 0, "strata bench --host-mem exit %d" % p.returncode)
    ini = open(os.path.join(run_dir, "bench.ini")).read() if os.path.exists(os.path.join(run_dir, "bench.ini")) else ""
    check(re.search(r"^host_mem = 14M$", ini, re.M), "the group's config: %r" % ini)
    rows = json.load(open(js)) if os.path.exists(js) else None
    direct = all((r.get("ceilings") or {}).get("disk_gb_s") is not None for r in rows or [])
    check_rows(rows, 2, "closed", batches=[1, 4], shape="disk-mixtral",
               bound=("three_tier", "bound_three_tier_tok_s") if direct else ("cpu_memory", "bound_tok_s"))
    for i, r in enumerate(rows or []):
        print("row %d: %s" % (i, json.dumps({k: r.get(k) for k in ["host_mem", "host_slots", "host_hit_rate", "disk_read_gb_s",
                                                                   "bound_three_tier_tok_s", "bound_three_tier_limit",
                                                                   "ratio_three_tier", "ceilings"]})), file=sys.stderr)
        check(r.get("host_mem") == "14M" and positive(r.get("host_slots")), "row %d: host_mem %r slots %r" % (
            i, r.get("host_mem"), r.get("host_slots")))
        h = r.get("host_hit_rate")
        check(isinstance(h, (int, float)) and 0 <= h <= 1, "row %d: host_hit_rate %r" % (i, h))
        check(positive(r.get("disk_read_gb_s")), "row %d: disk_read_gb_s %r" % (i, r.get("disk_read_gb_s")))
        check("host-mem 14M" in (r.get("case") or ""), "row %d: case %r" % (i, r.get("case")))
        if not direct:  # no O_DIRECT on this file system: no disk rate, so no three-tier bound
            check(r.get("bound_three_tier_tok_s") is None, "row %d: a three-tier bound without a disk rate" % i)
            continue
        check(positive(r.get("bound_three_tier_tok_s")) and positive(r.get("ratio_three_tier")) and
              r.get("bound_three_tier_limit") in ("disk", "cpu memory"), "row %d: three-tier bound %r (%r)" % (
                  i, r.get("bound_three_tier_tok_s"), r.get("bound_three_tier_limit")))
        check(r.get("bound_name") == "three_tier" and r.get("bound") == r.get("bound_three_tier_tok_s"),
              "row %d: measured against %r" % (i, r.get("bound_name")))
    check("three tiers on" in p.stdout or not direct, "no three-tier line in the roofline report:\n%s" % p.stdout)
    no_leftovers_shm(p.stderr)


def case_cli(strata, tmp):
    p = run([strata, "bench", "--help"])
    check(p.returncode == 0 and "--endpoint" in p.stdout and "--rate" in p.stdout and "--results" in p.stdout and
          "--max-batch-tokens" in p.stdout and "--expert-path" in p.stdout and "--prefetchers" in p.stdout, "bench --help")
    p = run([strata, "synth", "--help"])
    check(p.returncode == 0 and "--route-skew" in p.stdout and "--synthetic" in p.stdout, "synth --help")
    p = run([strata, "synth", "--list"])
    check(p.returncode == 0 and all(s in p.stdout for s in
                                    ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b",
                                     "qwen2-57b-a14b", "olmoe-1b-7b", "tiny-mixtral"]), "synth --list")
    for args, what in [([], "no args"), (["--batch", "0", "--model", "x"], "batch 0"),
                       (["--model", "x", "--backend", "gpu"], "backend"), (["--model", "x", "--gpu-mem", "3Q"], "gpu-mem"),
                       (["--model", os.path.join(tmp, "nope")], "missing model"), (["--model", "x", "--zzz"], "unknown"),
                       (["--model", "x", "--max-batch-tokens", "0"], "max-batch-tokens 0"),
                       (["--model", "x", "--expert-path", "gpu"], "expert-path gpu"),
                       (["--model", "x", "--prefetchers", "0"], "prefetchers 0"),
                       (["--model", "x", "--prefetchers", "9"], "prefetchers 9")]:
        p = run([strata, "bench"] + args)
        check(p.returncode == 2 and p.stderr.strip().startswith("strata bench:"), "bench %s: exit %d" % (what, p.returncode))
    out = os.path.join(tmp, "s")
    for args, what in [(["--shape", "nope", "--format", "int4", out], "shape"),
                       (["--shape", "tiny-olmoe", "--format", "f16", out], "format"),
                       (["--shape", "tiny-olmoe", "--format", "int4", "--route-skew", "zipf:-1", out], "skew"),
                       (["--shape", "tiny-olmoe", "--format", "int4", "--group", "48", out], "group"),
                       (["--shape", "tiny-olmoe", "--format", "int4"], "no out")]:
        p = run([strata, "synth"] + args)
        check(p.returncode == 2 and p.stderr.strip().startswith("strata synth:"), "synth %s: exit %d" % (what, p.returncode))
    synth(strata, out, "tiny-olmoe")
    # a token budget below the batch cannot hold one decode token of every sequence
    p = run([strata, "bench", "--model", out, "--batch", "4", "--max-batch-tokens", "2", "--no-probe"])
    check(p.returncode == 2 and "below the largest batch" in p.stderr, "bench --max-batch-tokens 2 --batch 4: %d"
          % p.returncode)
    p = run([strata, "synth", "--shape", "tiny-olmoe", "--format", "int4", out])
    check(p.returncode == 2 and "--force" in p.stderr, "synth over an existing folder: %d" % p.returncode)
    p = run([strata, "synth", "--shape", "tiny-qwen3", "--format", "fp8", "--force", "--quiet", out])
    check(p.returncode == 0, "synth --force: %d" % p.returncode)
    cfg = json.load(open(os.path.join(out, "config.json")))
    check(cfg.get("model_type") == "qwen3_moe", "--force did not replace the model")
    # the replaced folder is a loadable packed model
    p = run([strata, "generate", out, "--tokens", "1,2,3", "--max-tokens", "4", "--ignore-eos"])
    check(p.returncode == 0 and len(p.stdout.split()) == 4, "generate on the synthetic model: %r" % p.stdout)
    # --synthetic: placeholders take no space, and the marker says so
    v = os.path.join(tmp, "v")
    p = run([strata, "synth", "--shape", "tiny-mixtral", "--format", "int8", "--synthetic", "--quiet", v])
    check(p.returncode == 0, "synth --synthetic: %d" % p.returncode)
    mk = json.load(open(os.path.join(v, "strata-synthetic.json")))
    check(mk.get("virtual") is True and mk.get("shape") == "tiny-mixtral", "marker %r" % mk)
    for f in glob.glob(os.path.join(v, "*.bin")):
        st = os.stat(f)
        check(st.st_size > 0 and st.st_blocks * 512 < 65536, "%s is not a sparse placeholder" % f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("case", choices=["closed", "open", "endpoint", "virtual", "cpu_experts", "disk_tier", "cli"])
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="strata-bsmoke-")
    try:
        globals()["case_" + a.case](os.path.abspath(a.strata), tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%s: %d failures" % (a.case, len(failures)), file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
