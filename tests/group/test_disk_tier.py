#!/usr/bin/python3
"""test_disk_tier.py - the disk tier end to end: a group of every real service, CPU backend,
whose prefetcher has a host budget ([prefetcher.0] host_mem) four times smaller than the
model's experts, so most experts live only in the packed files and are read into the arena's
slots on demand. The model is `strata synth --shape disk-mixtral` (random int4 weights, many
wide experts, 4 KiB block alignment), written to disk.

Cases:
  same_answers   16 concurrent clients get exactly the tokens of the same model held whole in
                 memory; the counters show the disk reads; `strata up` and `strata status`
                 print the tiers; one request at a time, the prefetcher reads ahead the
                 experts the executor predicts for the next layers, with the same answers;
                 then kill -9 of the prefetcher with its slots overwritten
                 by garbage: the restarted one keeps no slot map (it reads the experts again)
                 and the answers are unchanged
  prefetcher_kill  kill -9 of the prefetcher while 8 clients stream: the executor posts its
                 jobs again once it is back; every answer complete and unchanged
  two_nodes      two prefetchers with a host budget each: the expert files split between
                 their arenas, each reads and computes its own; the same answers
  budget_errors  budgets that cannot work (below the resident tensors and a slot, on a virtual
                 synthetic model, on an HF folder larger than it) stop the group at start,
                 naming the cause
  damaged_block  a byte flipped inside an expert block on disk while the group runs: each
                 request either gets the exact tokens of the undamaged model or fails with an
                 error naming the file and the block; the group keeps serving the others
  truncated      an expert file cut inside its last block while the group runs: the same, with
                 an error that says the file ends early

usage: test_disk_tier.py --strata BIN --prefetcher BIN --executor BIN --scheduler BIN --router BIN
                         --client-py DIR CASE...
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grouplib as gl  # noqa: E402

A = None
N_TOKENS = 24
PROMPTS = [[1 + i, 40 + 3 * i, 100 + i, 7, 250 - i] for i in range(16)]
SHORT = [[3 + i, 9] for i in range(40)]  # one request at a time: each its own steps


def synth(work):
    model = os.path.join(work, "model")
    out = subprocess.run([A.strata, "synth", "--shape", "disk-mixtral", "--format", "int4", "--align", "4096", "--quiet",
                          model], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out
    with open(os.path.join(model, "strata-manifest.json")) as f:
        man = json.load(f)
    return model, man


def budget(man):
    """A host budget a quarter of the experts' bytes."""
    experts = sum(b["bytes"] for b in man["experts"])
    return experts // 4, experts


def group(model, host_mem=None):
    a = argparse.Namespace(**dict(vars(A), model=model))
    secs = {"prefetcher.0": {"numa_node": "-1"}}
    if host_mem:
        secs["prefetcher.0"]["host_mem"] = str(host_mem)
    return gl.Group(a, kind="real", sections=secs)


def client(g):
    from strata_client import StrataClient
    return StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=60.0)


def concurrent(g, prompts):
    from strata_client import StrataClient
    res = {}

    def run(i):
        try:
            with StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=60.0) as c:
                _, toks, _ = c.complete(tokens=prompts[i], max_tokens=N_TOKENS, ignore_eos=True)
            res[i] = toks
        except Exception as e:  # noqa: BLE001 - reported per client
            res[i] = e

    th = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join(120)
    assert not any(t.is_alive() for t in th), "a client hung"
    return res


def one_by_one(g, prompts):
    """Each prompt alone (so a failed step fails that request only): tokens or the error text."""
    from strata_client import StrataClient, StrataError
    out = {}
    for i, p in enumerate(prompts):
        try:
            with StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=60.0) as c:
                _, toks, _ = c.complete(tokens=p, max_tokens=4, ignore_eos=True)
            out[i] = toks
        except StrataError as e:
            out[i] = str(e)
    return out


def pf_status(g):
    import msgpack
    import zmq
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect("ipc://%s/prefetcher-0.sock" % g.run_dir)
    s.send(msgpack.packb({"v": 1, "type": "status", "id": 3}))
    assert s.poll(5000), "the prefetcher did not answer status"
    r = msgpack.unpackb(s.recv(), raw=False)
    s.close(0)
    return r


def reference(model, prompts, many):
    with group(model) as g:
        g.start()
        assert pf_status(g).get("slots", 0) == 0
        return concurrent(g, prompts) if many else one_by_one(g, prompts)


def case_same_answers():
    work = tempfile.mkdtemp(prefix="strata-dtier-")
    try:
        model, man = synth(work)
        host_mem, experts = budget(man)
        want = reference(model, PROMPTS, True)
        assert all(isinstance(v, list) and len(v) == N_TOKENS for v in want.values()), want
        with group(model, host_mem) as g:
            g.start()
            st0 = pf_status(g)
            assert st0["slots"] > 0 and st0["experts_disk"] == len(man["experts"]), st0
            assert experts >= 4 * st0["host_budget"], (experts, st0)
            got = concurrent(g, PROMPTS)
            bad = {i: r for i, r in got.items() if r != want[i]}
            assert not bad, "answers differ from the model in memory: %s" % bad
            st = pf_status(g)
            print("  experts %.1f MiB, budget %.1f MiB, %d slots: %d fetches from slots, %d from disk, %.1f MiB read" % (
                experts / 2**20, st["host_budget"] / 2**20, st["slots"], st["host_hits"], st["host_misses"],
                st["disk_bytes"] / 2**20))
            assert st["host_misses"] > 0 and st["disk_bytes"] > 0 and st.get("disk_errors", 0) == 0, st
            # one at a time, a job fits the slots, so it carries the next layers' predicted experts,
            # which the prefetcher reads ahead
            for i in range(4):
                with client(g) as c:
                    _, toks, _ = c.complete(tokens=PROMPTS[i], max_tokens=N_TOKENS, ignore_eos=True)
                assert toks == want[i], "request %d alone: %s, in memory %s" % (i, toks, want[i])
            st = pf_status(g)
            print("  one at a time: %d experts read ahead, %d of them used" % (st.get("read_ahead", 0),
                                                                             st.get("read_ahead_used", 0)))
            assert st.get("read_ahead", 0) > 0 and st.get("read_ahead_used", 0) > 0, st
            log = g.read_log()
            assert "disk (node 0)" in log and "host (node 0)" in log, "strata up printed no tiers:\n%s" % log
            out = subprocess.run([A.strata, "status", "--config", g.config], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0 and "hit rate" in out.stdout and "disk (node 0)" in out.stdout, out

            # a restart keeps no slot map: garbage in every slot, then kill -9; the new prefetcher
            # reads the experts again
            arena = gl.arena_path(g, 0)
            old = g.svc("prefetcher.0")["pid"]
            os.kill(old, signal.SIGSTOP)
            with open(arena, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                span = st["slots"] * st["slot_bytes"]
                f.seek(size - span)
                f.write(b"\xa5" * span)
            os.kill(old, signal.SIGKILL)
            g.wait_svc("prefetcher.0", lambda s: s["pid"] not in (0, old) and s["state"] == "ready", 30)
            st2 = pf_status(g)
            assert st2["reattached"], st2
            got = concurrent(g, PROMPTS)
            bad = {i: r for i, r in got.items() if r != want[i]}
            assert not bad, "answers after the restart differ: %s" % bad
            print("  after kill -9 with its slots overwritten: the same answers (%d fetches from disk)" % pf_status(g)["host_misses"])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def case_prefetcher_kill():
    """kill -9 of the prefetcher while 8 clients stream: its experts can run nowhere else, so the
    executor posts their jobs again once the launcher has restarted it; no request is lost and
    every answer is the model's in memory."""
    work = tempfile.mkdtemp(prefix="strata-dtier-")
    try:
        model, man = synth(work)
        host_mem, _ = budget(man)
        prompts = PROMPTS[:8]
        want = reference(model, prompts, True)
        with group(model, host_mem) as g:
            g.start()
            old = g.svc("prefetcher.0")["pid"]
            res, started = {}, threading.Event()

            def run(i):
                try:
                    with client(g) as c:
                        toks = []
                        for ev in c.generate(tokens=prompts[i], max_tokens=N_TOKENS, ignore_eos=True):
                            toks.extend(ev["tokens"])
                            if len(toks) >= 3:
                                started.set()
                        res[i] = toks
                except Exception as e:  # noqa: BLE001 - reported below
                    res[i] = e
                    started.set()

            th = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
            for t in th:
                t.start()
            started.wait(60)
            os.kill(old, signal.SIGKILL)
            for t in th:
                t.join(120)
            assert not any(t.is_alive() for t in th), "a client hung"
            bad = {i: r for i, r in res.items() if r != want[i]}
            assert not bad, "requests changed or lost: %s" % bad
            s = g.svc("prefetcher.0")
            assert s["restarts"] == 1 and s["pid"] != old, s
            assert all(x["restarts"] == 0 for x in g.state()["services"] if x["name"] != "prefetcher.0"), g.state()
            print("  kill -9 of the prefetcher mid-stream: all %d answers complete and unchanged" % len(prompts))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def case_two_nodes():
    """Two prefetchers, each with a host budget: the expert files split over their arenas, each
    reads and computes its own; the answers are those of the model in memory."""
    work = tempfile.mkdtemp(prefix="strata-dtier-")
    try:
        model, man = synth(work)
        host_mem, _ = budget(man)
        want = reference(model, PROMPTS[:8], True)
        a = argparse.Namespace(**dict(vars(A), model=model))
        secs = {"prefetcher.0": {"numa_node": "-1", "host_mem": str(host_mem // 2)},
                "prefetcher.1": {"numa_node": "-1", "host_mem": str(host_mem // 2)}}
        with gl.Group(a, kind="real", sections=secs) as g:
            g.start()
            got = concurrent(g, PROMPTS[:8])
            bad = {i: r for i, r in got.items() if r != want[i]}
            assert not bad, "answers differ from the model in memory: %s" % bad
            out = subprocess.run([A.strata, "status", "--config", g.config], capture_output=True, text=True, timeout=30)
            for n in (0, 1):
                assert ("disk (node %d)" % n) in out.stdout, "no disk tier on node %d:\n%s" % (n, out.stdout)
            print("  two prefetchers, %d bytes each: the same answers" % (host_mem // 2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def case_budget_errors():
    """Budgets that cannot work stop the group at start with the cause named (exit 2, no restart):
    one below the resident tensors plus one slot, one on a virtual synthetic model (its expert
    files are placeholders), and one on an HF folder too large for it (nothing to leave on disk)."""
    work = tempfile.mkdtemp(prefix="strata-dtier-")
    try:
        model, _ = synth(work)
        virt = os.path.join(work, "virtual")
        out = subprocess.run([A.strata, "synth", "--shape", "disk-mixtral", "--format", "int4", "--synthetic", "--quiet", virt],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out
        hf = os.path.join(os.path.dirname(os.path.dirname(A.client_py)), "models", "demo")  # the demo's HF folder
        for folder, mem, want in [(model, "1M", "less than the resident tensors and metadata"),
                                  (virt, "14M", "virtual synthetic model"),
                                  (hf, "2M", "no expert file (experts-*.bin)")]:
            with group(folder, mem) as g:
                g.start(wait=False)
                rc = g.proc.wait(60)
                log = g.read_log()
                assert rc != 0 and want in log, "host_mem %s on %s: exit %d, no '%s' in:\n%s" % (mem, folder, rc, want, log)
                assert log.count(want) <= 2, "the prefetcher was restarted:\n%s" % log
                print("  host_mem %s on %s: %s" % (mem, os.path.basename(folder),
                                                   [l for l in log.splitlines() if want in l][0].split("] ", 1)[-1][:150]))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def damage_while_serving(damage, expect):
    work = tempfile.mkdtemp(prefix="strata-dtier-")
    try:
        model, man = synth(work)
        host_mem, _ = budget(man)
        want = reference(model, SHORT, False)
        with group(model, host_mem) as g:
            g.start()
            where = damage(model, man)
            got = one_by_one(g, SHORT)
            failed = {i: r for i, r in got.items() if isinstance(r, str)}
            served = {i: r for i, r in got.items() if not isinstance(r, str)}
            wrong = {i: r for i, r in served.items() if r != want[i]}
            assert not wrong, "answers changed by the damage: %s" % wrong
            assert failed, "no request needed the damaged expert (%s); nothing was tested" % where
            assert served, "every request failed: %s" % failed
            for r in failed.values():
                assert where in r and expect in r, "unclear error %r (want '%s' and '%s')" % (r, where, expect)
            st = pf_status(g)
            assert st["disk_errors"] > 0, st
            assert all(s["restarts"] == 0 for s in g.state()["services"]), g.state()
            print("  %d of %d requests failed: %s" % (len(failed), len(SHORT), next(iter(failed.values()))))
            print("  the other %d got the undamaged model's tokens" % len(served))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def last_layer_block(man):
    """An expert block of the last layer: not among those read ahead into the slots at start."""
    last = max(b["layer"] for b in man["experts"])
    return [b for b in man["experts"] if b["layer"] == last][5]


def case_damaged_block():
    def flip(model, man):
        b = last_layer_block(man)
        at = b["offset"] + b["bytes"] // 2
        with open(os.path.join(model, b["file"]), "r+b") as f:
            f.seek(at)
            c = f.read(1)
            f.seek(at)
            f.write(bytes([c[0] ^ 0x20]))
        return "%s: the block of layer %d expert %d at offset %d" % (b["file"], b["layer"], b["expert"], b["offset"])

    damage_while_serving(flip, "damaged")


def case_truncated():
    def cut(model, man):
        f = last_layer_block(man)["file"]
        b = max((b for b in man["experts"] if b["file"] == f), key=lambda b: b["offset"])  # the file's last block
        path = os.path.join(model, b["file"])
        os.truncate(path, b["offset"] + b["bytes"] // 2)
        return b["file"]

    damage_while_serving(cut, "the file ends early")


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}


def main():
    global A
    A = gl.real_group_args()
    gl.run_cases(CASES, A.cases or list(CASES))


if __name__ == "__main__":
    main()
