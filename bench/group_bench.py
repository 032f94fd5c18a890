#!/usr/bin/python3
"""group_bench.py - the process group under load: requests per second and time to first token
with 1, 8 and 32 concurrent clients, and the control-plane cost per step.

It writes the demo model (tiny, RANDOM weights) to a temp dir, starts a real group with
`strata up` (prefetcher, executor, scheduler, router; every service real), and drives it
through the router's client protocol with the Python client (one DEALER per client thread).
Each client sends its requests back to back (prompt of --prompt tokens, --max-tokens tokens
generated, greedy, ignore_eos). Time to first token is measured at the client: from sending
`generate` to receiving the first `token` event.

Control plane per step, from the scheduler's counters over each run:
  ctrl   round trip scheduler -> executor -> scheduler minus the executor's forward and
         sampling time: ZeroMQ both ways and msgpack encode/decode of the plan and the result
  plan   building the plan, encoding it and handing it to ZeroMQ
  apply  receiving and decoding the result, applying it, and encoding the token events
  total  ctrl + plan + apply (wall time: on a busy machine it includes waiting for a core)
  cpu    CPU time per step of every scheduler thread, the executor's ZeroMQ threads (both
         from /proc/PID/task/*/schedstat) and the executor's message handling without forward
         and sampling (its ctrl_cpu_us counter): what the control plane costs in CPU, without
         the waits for a core that a busy machine adds to the wall time

usage: group_bench.py --build BUILD_DIR [--clients 1,8,32] [--requests N] [--json FILE]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "group"))
sys.path.insert(0, os.path.join(HERE, "..", "proto", "python"))
import grouplib as gl  # noqa: E402
from strata_client import StrataClient  # noqa: E402


def pct(v, p):
    v = sorted(v)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    i = int(k)
    return v[i] if i + 1 >= len(v) else v[i] + (v[i + 1] - v[i]) * (k - i)


def sched_stats(port):
    with StrataClient("tcp://127.0.0.1:%d" % port, timeout=10.0) as c:
        st = c.stats()
    return {k[len("scheduler."):]: v for k, v in st.items() if k.startswith("scheduler.")}


def cpu_ns(pid, zmq_threads):
    """CPU time in ns of the threads of process pid: ZeroMQ's background threads if zmq_threads,
    else the others; from /proc/PID/task/*/schedstat."""
    t = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                if f.read().startswith("ZMQbg") != zmq_threads:
                    continue
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                t += int(f.read().split()[0])
        except OSError:
            pass
    return t


def ctrl_cpu_us(pids, st):
    """Control-plane CPU so far, in parts: the scheduler's own thread and its ZeroMQ threads,
    the executor's message handling (its counter, which leaves out forward and sampling) and
    its ZeroMQ threads."""
    return [cpu_ns(pids[0], False) / 1e3, cpu_ns(pids[0], True) / 1e3, st.get("executor.ctrl_cpu_us_total", 0),
            cpu_ns(pids[1], True) / 1e3]


def run_level(port, n_clients, n_requests, prompt_len, max_tokens, seed, pids):
    rnd = random.Random(seed)
    prompts = [[rnd.randrange(0, 286) for _ in range(prompt_len)] for _ in range(n_requests)]
    lock = threading.Lock()
    nxt = [0]
    ttft, lat, toks, errs = [], [], [0], []
    go = threading.Barrier(n_clients + 1)

    def client():
        with StrataClient("tcp://127.0.0.1:%d" % port, timeout=120.0, resume_after=60.0) as c:
            go.wait(30)
            while True:
                with lock:
                    i = nxt[0]
                    nxt[0] += 1
                if i >= n_requests:
                    return
                t0 = time.perf_counter()
                first = None
                n = 0
                try:
                    for ev in c.generate(tokens=prompts[i], max_tokens=max_tokens, ignore_eos=True):
                        if first is None:
                            first = time.perf_counter()
                        n += len(ev["tokens"])
                except Exception as e:  # noqa: BLE001 - counted and reported
                    with lock:
                        errs.append(repr(e))
                    continue
                t1 = time.perf_counter()
                with lock:
                    ttft.append((first - t0) * 1e3)
                    lat.append((t1 - t0) * 1e3)
                    toks[0] += n

    s0 = sched_stats(port)
    c0 = ctrl_cpu_us(pids, s0)
    th = [threading.Thread(target=client) for _ in range(n_clients)]
    for t in th:
        t.start()
    go.wait(30)
    t0 = time.perf_counter()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    s1 = sched_stats(port)
    c1 = ctrl_cpu_us(pids, s1)
    d = {k: s1[k] - s0.get(k, 0) for k in s1}
    steps = max(d.get("steps_timed", 0), 1)
    ctrl = (d["step_rtt_us_total"] - d["step_forward_us_total"] - d["step_sample_us_total"]) / steps
    plan = d["step_plan_us_total"] / steps
    apply_ = d["step_apply_us_total"] / steps
    cpu_parts = [(b - a) / steps for a, b in zip(c0, c1)]
    cpu = sum(cpu_parts)
    return {
        "clients": n_clients,
        "requests": len(lat),
        "errors": len(errs),
        "error_samples": errs[:3],
        "wall_s": wall,
        "req_per_s": len(lat) / wall,
        "tok_per_s": toks[0] / wall,
        "ttft_ms_p50": pct(ttft, 50),
        "ttft_ms_p99": pct(ttft, 99),
        "latency_ms_p50": pct(lat, 50),
        "latency_ms_p99": pct(lat, 99),
        "steps": int(d.get("steps", 0)),
        "seqs_per_step": (d.get("prefill_tokens", 0) + d.get("decode_tokens", 0)) and
                         d.get("generated_tokens", 0) / max(d.get("steps", 1), 1),
        "step_forward_us": d["step_forward_us_total"] / steps,
        "step_sample_us": d["step_sample_us_total"] / steps,
        "ctrl_us_per_step": ctrl,
        "plan_us_per_step": plan,
        "apply_us_per_step": apply_,
        "control_plane_us_per_step": ctrl + plan + apply_,
        "control_plane_cpu_us_per_step": cpu,
        "cpu_us_per_step_scheduler": cpu_parts[0],
        "cpu_us_per_step_scheduler_zmq": cpu_parts[1],
        "cpu_us_per_step_executor": cpu_parts[2],
        "cpu_us_per_step_executor_zmq": cpu_parts[3],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="meson build dir holding services/*/strata-*")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default max(48, 6 * clients))")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--executor-threads", type=int, default=1,
                    help="executor worker threads (default 1: the tiny model gains nothing from a pool on a small host)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()
    b = os.path.abspath(a.build)
    args = argparse.Namespace(strata=b + "/services/strata/strata")
    for svc in ("prefetcher", "executor", "scheduler", "router"):
        setattr(args, svc, "%s/services/%s/strata-%s" % (b, svc, svc))
    args.fake = args.executor
    work = tempfile.mkdtemp(prefix="strata-bench-model-")
    out = []
    try:
        r = subprocess.run([args.strata, "demo", "--out", work], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            sys.exit("strata demo failed: %s" % r.stderr)
        args.model = r.stdout.strip()
        sections = {"scheduler": {"max_batch_tokens": "256", "max_seqs": "64", "kv_blocks": "2048"},
                    "executor": {"threads": str(a.executor_threads)},
                    "router": {"max_inflight_per_client": "64", "max_queue": "1024"}}
        with gl.Group(args, kind="real", sections=sections) as g:
            g.start()
            pids = [g.svc("scheduler")["pid"], g.svc("executor")["pid"]]
            run_level(g.port, 2, 8, a.prompt, a.max_tokens, 1, pids)  # warm up
            for i, n in enumerate(int(x) for x in a.clients.split(",")):
                reqs = a.requests or max(48, 6 * n)
                out.append(run_level(g.port, n, reqs, a.prompt, a.max_tokens, 100 + i, pids))
        host = {"cpus": os.cpu_count(), "model": "demo (tiny Mixtral shape, random weights, bf16)",
                "prompt_tokens": a.prompt, "max_tokens": a.max_tokens}
    finally:
        subprocess.run(["rm", "-rf", work])
    print("group bench: demo model (random weights), prompt %d tokens, %d generated, %d cpus" % (a.prompt, a.max_tokens,
                                                                                               os.cpu_count()))
    print("%7s %8s %8s %8s %10s %10s %10s %8s %10s %10s" % ("clients", "requests", "req/s", "tok/s", "ttft p50", "ttft p99",
                                                            "lat p50", "seq/step", "fwd us", "ctrl us"))
    for r in out:
        print("%7d %8d %8.1f %8.0f %8.1f ms %7.1f ms %7.1f ms %8.1f %10.0f %10.0f" % (
            r["clients"], r["requests"], r["req_per_s"], r["tok_per_s"], r["ttft_ms_p50"], r["ttft_ms_p99"],
            r["latency_ms_p50"], r["seqs_per_step"], r["step_forward_us"], r["control_plane_us_per_step"]))
        if r["errors"]:
            print("        %d errors, e.g. %s" % (r["errors"], r["error_samples"]))
    print("ctrl us = control plane per step (ZeroMQ + msgpack both ways, planning, applying), wall and CPU:")
    for r in out:
        print("  %2d clients: %.0f us wall (round trip minus compute %.0f, plan %.0f, apply + events %.0f); "
              "%.0f us CPU (scheduler %.0f + its ZeroMQ thread %.0f, executor %.0f + its ZeroMQ thread %.0f)" % (
                  r["clients"], r["control_plane_us_per_step"], r["ctrl_us_per_step"], r["plan_us_per_step"],
                  r["apply_us_per_step"], r["control_plane_cpu_us_per_step"], r["cpu_us_per_step_scheduler"],
                  r["cpu_us_per_step_scheduler_zmq"], r["cpu_us_per_step_executor"], r["cpu_us_per_step_executor_zmq"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"host": host, "levels": out}, f, indent=1)
    sys.exit(1 if any(r["errors"] for r in out) else 0)


if __name__ == "__main__":
    main()
