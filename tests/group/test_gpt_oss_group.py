#!/usr/bin/python3
"""gpt-oss through a real group on the CPU backend, against transformers' greedy tokens.

  hf      the downloaded-folder layout (tests/fixtures/gpt_oss, fp32, sliding windows shorter
          than the prompt): a group without prefetchers loads it as it is
  mxfp4   tests/fixtures/gpt_oss_mxfp4 packed with --format mxfp4 (its MXFP4 bytes kept), one
          prefetcher arena, [executor] expert_path = cpu: every expert runs on the prefetcher's
          cores with its biases and the clamped activation; the executor's log must show jobs
          and no expert computed locally after a failure
Each streams the fixture's 40 prompt ids greedily (ignore_eos) through `strata client --ids`
and must give ref.json's 16 greedy tokens. The prompt is longer than the window (8 tokens), so
the scheduler's window tables free blocks on the way: the scheduler's stats must show that a
sequence held at most ceil(8 / 16) + 1 = 2 window blocks, and none at the end.

  long    (case `long`) a 4096-token prompt through the hf group: the greedy tokens equal
          `strata generate`'s (in one process, the main block table alone, sliding layers
          honoured in attention); while a second such request decodes, the scheduler holds
          4096 / 16 = 256 main blocks for it and at most 2 window blocks

usage: test_gpt_oss_group.py --strata BIN --fixtures DIR --client-py DIR [fixtures|long]
"""
import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    print("%-4s %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def sched_stats(port):
    from strata_client import StrataClient
    with StrataClient("tcp://127.0.0.1:%d" % port, timeout=30.0) as c:
        st = c.stats()
    return {k[len("scheduler."):]: v for k, v in st.items() if k.startswith("scheduler.")}


def check_window_stats(name, port, window):
    """After the requests: the window tables held at most ceil(window / 16) + 1 blocks a sequence."""
    st = sched_stats(port)
    bound = (window + 15) // 16 + 1
    check(st.get("kv_sliding_window") == window and 1 <= st.get("kv_win_blocks_seq_max", -1) <= bound
          and st.get("kv_win_blocks_used") == 0 and st.get("kv_blocks_free") == st.get("kv_blocks"),
          "%s: window tables: window %s, at most %s blocks a sequence (bound %d), %s held now, %s of %s blocks free"
          % (name, st.get("kv_sliding_window"), st.get("kv_win_blocks_seq_max"), bound, st.get("kv_win_blocks_used"),
             st.get("kv_blocks_free"), st.get("kv_blocks")))


def start_group(a, tmp, name, model, extra):
    """strata up of one group; returns (config, env, port, run_dir), config None if it failed."""
    env = dict(os.environ, STRATA_REGISTRY=os.path.join(tmp, name + "-reg"))
    os.makedirs(env["STRATA_REGISTRY"], mode=0o700)
    port = free_port()
    cfg = os.path.join(tmp, name + ".ini")
    run_dir = os.path.join(tmp, name + "-run")
    with open(cfg, "w") as f:
        f.write("[group]\nname = gptoss%s%d\nrun_dir = %s\nmodel = %s\n\n[router]\nendpoint = tcp://127.0.0.1:%d\n"
                "cpus =\n\n[executor]\nbackend = cpu\nthreads = 2\n%s" % (name, os.getpid(), run_dir, model, port, extra))
    r = subprocess.run([a.strata, "up", "--config", cfg], capture_output=True, text=True, timeout=120, env=env)
    check(r.returncode == 0, "%s: strata up (exit %d: %s)" % (name, r.returncode, r.stderr.strip()[-300:]))
    return (cfg if r.returncode == 0 else None), env, port, run_dir


def run_case(a, tmp, name, model, extra, ref, window=0):
    cfg, env, port, run_dir = start_group(a, tmp, name, model, extra)
    if cfg is None:
        return None
    try:
        r = subprocess.run([a.strata, "client", "--endpoint", "tcp://127.0.0.1:%d" % port, "--tokens",
                            ",".join(map(str, ref["tokens"])), "--max-tokens", str(len(ref["greedy"])), "--ids",
                            "--temperature", "0", "--ignore-eos"], capture_output=True, text=True, timeout=120, env=env)
        got = [int(t) for t in r.stdout.split()] if r.returncode == 0 else None
        check(got == ref["greedy"], "%s: greedy through the group %s equals transformers' %s" % (name, got, ref["greedy"]))
        if window:
            check_window_stats(name, port, window)
    finally:
        subprocess.run([a.strata, "down", "--config", cfg], capture_output=True, timeout=120, env=env)
    return open(os.path.join(run_dir, "logs", "executor.log")).read()


def case_long(a, tmp):
    """A 4096-token prompt: greedy equal to strata generate's; the blocks in use while it decodes."""
    from strata_client import StrataClient
    hf = os.path.join(a.fixtures, "gpt_oss")
    window = json.load(open(os.path.join(hf, "config.json")))["sliding_window"]
    rnd = random.Random(4096)
    prompt = [rnd.randrange(500) for _ in range(4096)]
    pf = os.path.join(tmp, "long.txt")
    with open(pf, "w") as f:
        f.write(",".join(map(str, prompt)))
    r = subprocess.run([a.strata, "generate", hf, "--tokens-file", pf, "--max-tokens", "16", "--ignore-eos", "--threads", "2",
                        "--chunk", "256"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "long: strata generate (exit %d: %s)" % (r.returncode, r.stderr.strip()[-300:]))
    ref = [int(t) for t in r.stdout.split()] if r.returncode == 0 else None
    cfg, env, port, run_dir = start_group(a, tmp, "long", hf, "")
    if cfg is None:
        return
    try:
        with StrataClient("tcp://127.0.0.1:%d" % port, timeout=120.0) as c:
            _, got, _ = c.complete(tokens=prompt, max_tokens=16, temperature=0, ignore_eos=True)
            check(got == ref, "long: greedy after a 4096-token prompt through the group %s equals strata generate's %s"
                  % (got, ref))
            check_window_stats("long", port, window)
            # while a second one decodes: its main table holds every block of its positions, its
            # window table at most the window's blocks plus one
            rid = c.next_id()
            gen = c.generate(tokens=prompt, max_tokens=4000, temperature=0, ignore_eos=True, id=rid)
            first = next(gen)
            st = sched_stats(port)
            used = st["kv_blocks"] - st["kv_blocks_free"]
            bound = (window + 15) // 16 + 1
            check(first["index"] == 0 and st["running"] == 1 and st["kv_win_blocks_used"] <= bound
                  and used - st["kv_win_blocks_used"] >= 4096 // 16,
                  "long: decoding after the 4096-token prompt: %d blocks in use, %d of them window blocks (bound %d), "
                  "%d running" % (used, st["kv_win_blocks_used"], bound, st["running"]))
            c.cancel(rid)
            n = sum(len(ev["tokens"]) for ev in gen)
            check(c.last_done is not None and c.last_done["finish_reason"] == "cancel",
                  "long: the second request canceled after %d more tokens" % n)
        check_window_stats("long", port, window)
    finally:
        subprocess.run([a.strata, "down", "--config", cfg], capture_output=True, timeout=120, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--client-py", required=True)
    ap.add_argument("case", nargs="?", default="fixtures", choices=["fixtures", "long"])
    a = ap.parse_args()
    sys.path.insert(0, a.client_py)
    with tempfile.TemporaryDirectory(prefix="strata-gptoss-group-") as tmp:
        if a.case == "long":
            case_long(a, tmp)
            print("test_gpt_oss_group long: %d failure(s)" % len(failures))
            return 1 if failures else 0
        hf = os.path.join(a.fixtures, "gpt_oss")
        run_case(a, tmp, "hf", hf, "", json.load(open(os.path.join(hf, "ref.json"))),
                 window=json.load(open(os.path.join(hf, "config.json")))["sliding_window"])
        mx = os.path.join(a.fixtures, "gpt_oss_mxfp4")
        pk = os.path.join(tmp, "pk")
        r = subprocess.run([a.strata, "pack", mx, pk, "--format", "mxfp4", "--quiet"], capture_output=True, text=True,
                           timeout=120)
        check(r.returncode == 0, "pack --format mxfp4 (exit %d: %s)" % (r.returncode, r.stderr.strip()[-300:]))
        log = run_case(a, tmp, "mxfp4", pk, "expert_path = cpu\n\n[prefetcher.0]\nnuma_node = -1\n",
                       json.load(open(os.path.join(mx, "ref.json"))))
        m = re.search(r"cpu experts (\d+) in (\d+) jobs, (\d+) computed here", log or "")
        check(m is not None and int(m.group(2)) > 0 and int(m.group(3)) == 0,
              "mxfp4: the prefetcher ran the experts: %s" % (m.group(0) if m else "no totals line in executor.log"))
    print("test_gpt_oss_group: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
