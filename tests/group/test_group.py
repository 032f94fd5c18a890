#!/usr/bin/python3
"""test_group.py - the process group end to end with every real service (prefetcher,
executor, scheduler, router) on the demo model (random weights), through `strata up`.

Cases:
  executor_restart  kill -9 of the executor: it restarts from the arena without reading the
                    model from disk (measured: /proc/PID/io rchar of the new executor, no model
                    file in /proc/PID/maps, the arena mapped read-only), and answers the same
  prefetcher_kill   kill -9 of the prefetcher while 8 clients stream: it restarts, reattaches
                    its arena, and every request completes with the tokens it has without the
                    crash
  stop_under_load   SIGTERM to the launcher while clients stream: every process gone within
                    5 s, no shm segment, no socket file; no client hangs
  pinning           every thread of every real service runs on its configured cpus with its
                    NUMA policy (/proc/PID/task/*/status, /proc/PID/numa_maps)
  two_arenas        two prefetchers: the weight files split over two arenas, the executor
                    built over both, same answers; kill -9 of one prefetcher
  demo              `strata up --demo` (detached) + `strata client` + `strata status` +
                    `strata down`, in a temp run dir on a free port
  cpu_experts       two prefetchers with [executor] expert_path = cpu: each computes the experts
                    of its own arena over its shm ring; answers equal the executor computing every
                    expert itself (pcie), and the counters show the prefetchers did the work
  cpu_experts_kill  kill -9 of one of them while 8 clients stream: the executor computes that
                    node's experts itself until the prefetcher is back; no request lost, every
                    answer identical; the restarted prefetcher serves jobs again
  cpu_experts_stop  SIGSTOP of one of them while 8 clients stream: no hang (bounded wait, then the
                    fallback), every answer identical; after SIGCONT it serves again
  planted_arena     a live arena chowned to nobody with mode 0666 and its prefetcher killed, then
                    nobody writing 1 MiB into it: refused, rebuilt under a new name, the answers
                    unchanged (root: nobody through setpriv)
  nonroot           the group as nobody, as the systemd units run it: its own 0700 / 0600 files,
                    and names another user planted (the old fixed ones, and its own arena's once
                    that is gone) refused without blocking it (root: setpriv)

usage: test_group.py --strata BIN --prefetcher BIN --executor BIN --scheduler BIN --router BIN
                     --client-py DIR CASE...
"""
import argparse
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grouplib as gl  # noqa: E402

A = None
PROMPTS = [[1 + i, 40 + 3 * i, 100 + i, 7, 250 - i] for i in range(8)]
N_TOKENS = 40


def client(g):
    from strata_client import StrataClient
    return StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=60.0)


def answer(g, prompt, n=N_TOKENS):
    with client(g) as c:
        _, toks, done = c.complete(tokens=prompt, max_tokens=n, ignore_eos=True)
    return toks


def proc_io(pid):
    out = {}
    with open("/proc/%d/io" % pid) as f:
        for line in f:
            k, v = line.split(":")
            out[k.strip()] = int(v)
    return out


def maps(pid):
    with open("/proc/%d/maps" % pid) as f:
        return f.read().splitlines()


def model_bytes():
    return sum(os.path.getsize(os.path.join(A.model, f)) for f in os.listdir(A.model))


def concurrent(g, prompts, during=None):
    """Stream every prompt from its own client thread; call during() once the first tokens
    arrived. Returns {index: tokens or exception}."""
    res, started = {}, threading.Event()

    def run(i, p):
        try:
            from strata_client import StrataClient
            with StrataClient("tcp://127.0.0.1:%d" % g.port, timeout=60.0) as c:
                toks = []
                for ev in c.generate(tokens=p, max_tokens=N_TOKENS, ignore_eos=True):
                    toks.extend(ev["tokens"])
                    if len(toks) >= 4:
                        started.set()
                res[i] = toks
        except Exception as e:  # noqa: BLE001 - reported per client
            res[i] = e
            started.set()

    th = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    for t in th:
        t.start()
    if during:
        started.wait(60)
        during()
    for t in th:
        t.join(120)
    assert not any(t.is_alive() for t in th), "a client hung"
    return res


def case_executor_restart():
    with gl.Group(A, kind="real") as g:
        g.start()
        pf = g.svc("prefetcher.0")
        before = answer(g, PROMPTS[0])
        assert len(before) == N_TOKENS, before
        old = g.svc("executor")["pid"]
        os.kill(old, signal.SIGKILL)
        s = g.wait_svc("executor", lambda s: s["pid"] not in (0, old) and s["state"] == "ready", timeout=60)
        io = proc_io(s["pid"])
        pf_io = proc_io(pf["pid"])
        m = maps(s["pid"])
        mb = model_bytes()
        model_maps = [l for l in m if A.model in l]
        arena_maps = [l for l in m if "/dev/shm/strata-%s-" % g.name in l and "-arena-" in l]
        restart_ms = (s["ready_unix"] - s["started_unix"]) * 1000
        print("  model files %.1f MiB; prefetcher read %.1f MiB filling the arena; restarted executor read %.1f KiB "
              "(rchar, all files), %d KiB from the block device, ready %.0f ms after spawn"
              % (mb / 2**20, pf_io["rchar"] / 2**20, io["rchar"] / 1024, io["read_bytes"] // 1024, restart_ms))
        assert not model_maps, "the executor maps model files: %s" % model_maps
        assert arena_maps and all(l.split()[1].startswith("r") and "w" not in l.split()[1] for l in arena_maps), arena_maps
        assert pf_io["rchar"] >= mb * 0.9, "the prefetcher read the model (%d of %d)" % (pf_io["rchar"], mb)
        assert io["rchar"] < min(mb // 8, 1 << 20), "the restarted executor read %d bytes (model %d)" % (io["rchar"], mb)
        after = answer(g, PROMPTS[0])
        assert after == before, (before, after)
        assert g.svc("prefetcher.0")["restarts"] == 0


def case_prefetcher_kill():
    with gl.Group(A, kind="real") as g:
        g.start()
        want = {i: answer(g, p) for i, p in enumerate(PROMPTS)}
        old = g.svc("prefetcher.0")["pid"]
        got = concurrent(g, PROMPTS, during=lambda: os.kill(old, signal.SIGKILL))
        bad = {i: r for i, r in got.items() if r != want[i]}
        assert not bad, "requests changed or lost: %s" % bad
        s = g.wait_svc("prefetcher.0", lambda s: s["pid"] not in (0, old) and s["state"] == "ready")
        assert s["restarts"] == 1, s
        assert "reattached" in g.read_log()
        assert all(g.svc(n)["restarts"] == 0 for n in ("executor", "scheduler", "router"))


def case_stop_under_load():
    with gl.Group(A, kind="real") as g:
        g.start()
        pids = g.pids()
        t = {}

        def stop():
            t["t0"] = time.time()
            g.proc.send_signal(signal.SIGTERM)

        got = concurrent(g, PROMPTS[:4], during=stop)
        rc = g.proc.wait(10)
        while any(gl.alive(p) for p in pids.values()) and time.time() - t["t0"] < 10:
            time.sleep(0.02)
        dt = time.time() - t["t0"]
        print("  stop under load: %.2fs; clients: %s" % (dt, {i: (len(r) if isinstance(r, list) else type(r).__name__) for i, r in got.items()}))
        assert rc == 0 and dt < 5.0, (rc, dt)
        assert not [n for n, p in pids.items() if gl.alive(p)]
        assert not gl.shm_segments(g.name)
        assert not [p for p in os.listdir(g.run_dir) if p.endswith(".sock")]


def case_pinning():
    allowed = sorted(os.sched_getaffinity(0))
    a, b = allowed[0], allowed[-1]
    want = {"prefetcher.0": [a], "executor": sorted({a, b}), "scheduler": [a], "router": [b]}
    secs = {n: {"cpus": gl.cpulist(c), "numa_node": "0"} for n, c in want.items()}
    with gl.Group(A, kind="real", sections=secs) as g:
        g.start()
        answer(g, PROMPTS[1], n=4)  # every service has started its threads
        for name, pid in g.pids().items():
            for tid in gl.task_ids(pid):
                got = gl.proc_status(tid, "Cpus_allowed_list")
                assert got == gl.cpulist(want[name]), "%s task %d: %s want %s" % (name, tid, got, gl.cpulist(want[name]))
            assert "0" in gl.proc_status(pid, "Mems_allowed_list")
            assert "bind:0" in gl.numa_policies(pid), "%s: %s" % (name, gl.numa_policies(pid))


def case_two_arenas():
    """Two prefetchers (nodes 0 and 1; no memory binding, this box may have one node): two
    arenas sharing the weight files, the executor built over both, same answers as one arena;
    kill -9 of prefetcher 1 reattaches its arena."""
    with gl.Group(A, kind="real") as g:
        g.start()
        want = answer(g, PROMPTS[2])
    secs = {"prefetcher.0": {"numa_node": "-1"}, "prefetcher.1": {"numa_node": "-1"}}
    with gl.Group(A, kind="real", sections=secs) as g:
        g.start()
        segs = [gl.arena_path(g, 0), gl.arena_path(g, 1)]
        assert sorted(p for p in gl.shm_segments(g.name) if "-arena-" in p) == sorted(segs), (segs, gl.shm_segments(g.name))
        sizes = [gl.shm_header(p)["size"] for p in segs]
        assert all(s < model_bytes() for s in sizes), "each arena holds part of the weights: %s vs %d" % (sizes, model_bytes())
        m = maps(g.svc("executor")["pid"])
        assert all(any(os.path.basename(p) in l for l in m) for p in segs), "executor maps both arenas"
        assert answer(g, PROMPTS[2]) == want
        old = g.svc("prefetcher.1")["pid"]
        os.kill(old, signal.SIGKILL)
        g.wait_svc("prefetcher.1", lambda s: s["pid"] not in (0, old) and s["state"] == "ready")
        assert answer(g, PROMPTS[2]) == want
        print("  two arenas: %s bytes" % sizes)


TWO_NODES = {"prefetcher.0": {"numa_node": "-1"}, "prefetcher.1": {"numa_node": "-1"}}


def cpu_sections(path, **executor):
    secs = {k: dict(v) for k, v in TWO_NODES.items()}
    secs["executor"] = dict({"expert_path": path}, **executor)
    return secs


def ex_stats(g):
    with client(g) as c:
        st = c.stats()
    return {k[len("scheduler.executor."):]: v for k, v in st.items() if k.startswith("scheduler.executor.")}


def reference_answers():
    """Every prompt's answer with each expert computed by the executor itself."""
    with gl.Group(A, kind="real", sections=cpu_sections("pcie")) as g:
        g.start()
        assert "cpu_expert_uses" not in ex_stats(g)
        return {i: answer(g, p) for i, p in enumerate(PROMPTS)}


def case_cpu_experts():
    want = reference_answers()
    with gl.Group(A, kind="real", sections=cpu_sections("cpu")) as g:
        g.start()
        rings = sorted(p for p in gl.shm_segments(g.name) if "-ring-" in p)
        assert sorted(p.replace("-arena-", "-ring-") for p in (gl.arena_path(g, 0), gl.arena_path(g, 1))) == rings, rings
        got = {i: answer(g, p) for i, p in enumerate(PROMPTS)}
        st = ex_stats(g)
        print("  cpu experts: %s" % {k: v for k, v in st.items() if k.startswith("cpu_expert")})
        assert got == want, "answers differ from the executor's own experts"
        assert st["cpu_experts_owned"] > 0 and st["cpu_expert_peers_up"] == 2, st
        assert st["cpu_expert_jobs"] > 0 and st["cpu_expert_uses"] > 0 and st["cpu_expert_bytes"] > 0, st
        assert st["cpu_expert_fallbacks"] == 0, st
        # concurrent streams share steps: still the same tokens
        got = concurrent(g, PROMPTS)
        assert got == want, {i: r for i, r in got.items() if r != want[i]}


def stream_with_fault(fault, after):
    """8 clients stream with expert_path = cpu; fault(g) once the first tokens came; every answer
    must equal the executor's own; then after(g, want, stats)."""
    want = reference_answers()
    with gl.Group(A, kind="real", sections=cpu_sections("cpu", cpu_expert_timeout_ms="2000")) as g:
        g.start()
        t0 = time.monotonic()
        got = concurrent(g, PROMPTS, during=lambda: fault(g))
        took = time.monotonic() - t0
        bad = {i: r for i, r in got.items() if r != want[i]}
        assert not bad, "requests changed or lost: %s" % bad
        st = ex_stats(g)
        print("  %.1f s; %s" % (took, {k: v for k, v in st.items() if k.startswith("cpu_expert")}))
        assert st["cpu_expert_fallbacks"] > 0, st
        after(g, want, st)


def served_again(g, want, st):
    """The faulty prefetcher is up again and serves jobs."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and ex_stats(g)["cpu_expert_peers_up"] < 2:
        time.sleep(0.1)
    assert answer(g, PROMPTS[3]) == want[3]
    now = ex_stats(g)
    assert now["cpu_expert_peers_up"] == 2 and now["cpu_expert_jobs"] > st["cpu_expert_jobs"], now


def case_cpu_experts_kill():
    old = {}

    def kill(g):
        old["pid"] = g.svc("prefetcher.1")["pid"]
        os.kill(old["pid"], signal.SIGKILL)

    def after(g, want, st):
        s = g.wait_svc("prefetcher.1", lambda s: s["pid"] not in (0, old["pid"]) and s["state"] == "ready", timeout=60)
        assert s["restarts"] == 1, s
        assert all(g.svc(n)["restarts"] == 0 for n in ("executor", "scheduler", "router", "prefetcher.0"))
        served_again(g, want, st)

    stream_with_fault(kill, after)


def case_cpu_experts_stop():
    stopped = {}

    def stop(g):
        stopped["pid"] = g.svc("prefetcher.1")["pid"]
        os.kill(stopped["pid"], signal.SIGSTOP)

    def after(g, want, st):
        os.kill(stopped["pid"], signal.SIGCONT)
        assert g.svc("prefetcher.1")["pid"] == stopped["pid"], "the stopped prefetcher was restarted"
        served_again(g, want, st)

    try:
        stream_with_fault(stop, after)
    finally:
        if "pid" in stopped:
            try:
                os.kill(stopped["pid"], signal.SIGCONT)
            except ProcessLookupError:
                pass


def uid_of(pid):
    return int(gl.proc_status(pid, "Uid").split()[1])


def as_nobody(code):
    """Run python code as nobody; returns the CompletedProcess."""
    return subprocess.run(gl.as_user("nobody") + [sys.executable, "-c", code], capture_output=True, text=True, timeout=30)


def case_planted_arena():
    """The probe, as it was found: a live group's arena chowned to nobody with mode 0666, its
    prefetcher killed, then nobody writing 1 MiB of zeros over the weights in it. The restarted
    prefetcher refuses the segment with a line naming it and its owner, leaves it as it is and
    fills a new arena from the model files under a new token (a name nobody could have
    guessed); the launcher moves the executor to it. So nobody's write lands in a segment no
    process of the group maps: every answer stays as it was, and nobody cannot open the new
    arena for writing. Before the start nobody had planted the fixed names older builds used:
    the group never looks at them."""
    gl.need_root("acting as a second uid (nobody)")
    with gl.Group(A, kind="real") as g:
        fixed = ["/dev/shm/strata-%s-arena-0" % g.name, "/dev/shm/strata-%s-ring-0" % g.name]
        for p in fixed:
            r = as_nobody("import os; fd = os.open(%r, os.O_CREAT | os.O_WRONLY, 0o666); os.fchmod(fd, 0o666); os.ftruncate(fd, 8 << 20)" % p)
            assert r.returncode == 0, r
        g.start()
        want = {i: answer(g, p) for i, p in enumerate(PROMPTS[:3])}
        arena = gl.arena_path(g)
        assert arena and arena not in fixed, (arena, fixed)
        assert all(os.stat(p).st_uid == 65534 and os.stat(p).st_size == 8 << 20 for p in fixed), "the planted files are untouched"
        st = os.stat(arena)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        pf, ex = g.svc("prefetcher.0")["pid"], g.svc("executor")["pid"]
        os.chown(arena, 65534, 65534)
        os.chmod(arena, 0o666)
        os.kill(pf, signal.SIGKILL)
        g.wait_svc("prefetcher.0", lambda s: s["pid"] not in (0, pf) and s["state"] == "ready")
        e = g.wait_svc("executor", lambda s: s["pid"] not in (0, ex) and s["state"] == "ready", timeout=60)
        log = g.read_log()
        seg = arena[len("/dev/shm"):]
        refused = [l for l in log.splitlines() if seg in l and "refused" in l]
        assert refused and "owned by uid 65534 (nobody)" in refused[0], log
        print("  " + refused[0].strip())
        assert "reattached" not in log, "nothing was reattached"
        new = gl.arena_path(g)
        assert new != arena and ("arena %s: filled" % new[len("/dev/shm"):]) in log, (new, log)
        st = os.stat(new)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600, oct(st.st_mode)
        assert os.stat(arena).st_uid == 65534, "the refused segment is left as it is"
        m = maps(e["pid"])
        assert any(new in l for l in m) and not any(arena in l for l in m), "the executor maps the new arena only"
        # what the probe did next: 1 MiB of zeros from the first weight file's image on
        off, _ = gl.arena_files(arena)["resident.bin"]
        r = as_nobody("f = open(%r, 'r+b'); f.seek(%d); f.write(bytes(1 << 20)); f.close()" % (arena, off))
        assert r.returncode == 0, r
        with open(arena, "rb") as f:
            f.seek(off)
            assert f.read(1 << 20) == bytes(1 << 20), "nobody's write landed in the refused segment"
        r = as_nobody("open(%r, 'r+b')" % new)
        assert r.returncode != 0 and "Permission denied" in r.stderr, r
        got = {i: answer(g, p) for i, p in enumerate(PROMPTS[:3])}
        assert got == want, "the answers changed: %s" % {i: (want[i], got[i]) for i in got if got[i] != want[i]}
        assert g.svc("executor")["restarts"] == 1 and g.svc("prefetcher.0")["restarts"] == 1


def case_nonroot():
    """The group as a non-root user, as the systemd units run it (nobody, through setpriv):
    every process runs as that uid, and its run dir, token and segments are its own, 0700 and
    0600. Names another user planted do not block it: root's files at the fixed names older
    builds used, which nobody cannot unlink from the sticky /dev/shm (O_EXCL would refuse to
    create them), are never looked at; and once the group's own arena is gone while its token
    stays (after a reboot /dev/shm is empty, a run dir on disk is not), a file root plants at
    that name is refused with a line naming it and its owner, left as it is, and the arena is
    rebuilt under a new name. The answers do not change."""
    gl.need_root("switching to nobody")
    with gl.Group(A, kind="real", user="nobody") as g:
        fixed = ["/dev/shm/strata-%s-arena-0" % g.name, "/dev/shm/strata-%s-ring-0" % g.name]
        for p in fixed:
            with open(p, "wb") as f:
                f.write(b"planted")
            os.chmod(p, 0o644)
        g.start()
        pids = g.pids()
        assert all(uid_of(p) == 65534 for p in list(pids.values()) + [g.proc.pid]), {n: uid_of(p) for n, p in pids.items()}
        want = answer(g, PROMPTS[0])
        arena = gl.arena_path(g)
        tok = os.path.join(g.run_dir, "shm-0.token")
        for p, mode in [(g.run_dir, 0o700), (tok, 0o600), (arena, 0o600), (arena.replace("-arena-", "-ring-"), 0o600)]:
            st = os.stat(p)
            assert st.st_uid == 65534 and stat.S_IMODE(st.st_mode) == mode, (p, st.st_uid, oct(st.st_mode))
        # the launcher dies; its services follow; arena and token stay
        g.proc.kill()
        g.proc.wait()
        t0 = time.time()
        while any(gl.alive(p) for p in pids.values()) and time.time() - t0 < 5:
            time.sleep(0.02)
        # /dev/shm emptied of the group's segments, the token kept; root plants the arena's name
        for p in gl.shm_segments(g.name):
            if os.stat(p).st_uid == 65534:
                os.unlink(p)
        with open(arena, "wb") as f:
            f.write(b"planted")
        os.chmod(arena, 0o644)
        g.proc = None
        g.start()
        log = g.read_log()
        refused = [l for l in log.splitlines() if arena[len("/dev/shm"):] in l and "refused" in l]
        assert refused and "owned by uid 0 (root)" in refused[0], log
        print("  " + refused[0].strip())
        new = gl.arena_path(g)
        assert new != arena and os.stat(new).st_uid == 65534, new
        assert open(arena, "rb").read() == b"planted", "root's file is left as it is"
        assert answer(g, PROMPTS[0]) == want
        dt, rc = g.stop()
        assert rc == 0, rc
        left = gl.shm_segments(g.name)
        assert sorted(left) == sorted(fixed + [arena]), "the group removed its own segments, no one else's: %s" % left


def case_demo():
    d = tempfile.mkdtemp(prefix="strata-demo-")
    port = gl.free_port()
    name = "demo%d" % os.getpid()
    try:
        up = subprocess.run([A.strata, "up", "--demo", "--run-dir", d, "--name", name, "--port", str(port), "--bin-dir",
                             A.bin_dir], capture_output=True, text=True, timeout=120)
        assert up.returncode == 0 and "ready" in up.stdout, up
        out = subprocess.run([A.strata, "client", "--endpoint", "tcp://127.0.0.1:%d" % port, "--prompt", "Hello", "--max-tokens",
                              "8"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out
        st = subprocess.run([A.strata, "status", "--demo", "--run-dir", d], capture_output=True, text=True)
        assert st.returncode == 0 and st.stdout.count(" ready ") == 5, st.stdout  # prefetcher, executor, scheduler, router, http
        dn = subprocess.run([A.strata, "down", "--demo", "--run-dir", d], capture_output=True, text=True, timeout=30)
        assert dn.returncode == 0, dn
        assert not gl.shm_segments(name)
    finally:
        subprocess.run([A.strata, "down", "--demo", "--run-dir", d], capture_output=True)
        for p in gl.shm_segments(name):
            os.unlink(p)
        subprocess.run(["rm", "-rf", d])


def case_damaged_block():
    """A byte flipped inside an expert block of the packed model on disk: the prefetcher that
    reads it into its arena finds the block's crc32 wrong, names the file and the block, and
    exits 2 (it would not read better again), so the group stops with that error instead of
    serving, or retrying, a model it cannot trust."""
    work = tempfile.mkdtemp(prefix="strata-damaged-")
    try:
        model = os.path.join(work, "model")
        shutil.copytree(A.model, model)
        with open(os.path.join(model, "strata-manifest.json")) as f:
            man = json.load(f)
        blk = man["experts"][len(man["experts"]) // 2]
        assert "crc32" in blk, blk
        path = os.path.join(model, blk["file"])
        at = blk["offset"] + blk["bytes"] // 2
        with open(path, "r+b") as f:
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x20]))
        a = argparse.Namespace(**dict(vars(A), model=model))
        g = gl.Group(a, kind="real")
        try:
            g.start(wait=False)
            rc = g.proc.wait(60)
            log = g.read_log()
            want = "the block of layer %d expert %d at offset %d" % (blk["layer"], blk["expert"], blk["offset"])
            assert rc != 0, "strata up exited 0 over a damaged block; log:\n%s" % log
            assert want in log and blk["file"] in log and "damaged" in log, "no '%s' in the log:\n%s" % (want, log)
            assert log.count(want) <= 2, "the prefetcher was restarted over the damaged block:\n%s" % log
            print("  strata up exit %d: %s" % (rc, [l for l in log.splitlines() if want in l][0].strip()))
        finally:
            g.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}


def main():
    global A
    A = gl.real_group_args()
    A.bin_dir = os.path.dirname(A.strata)
    work = tempfile.mkdtemp(prefix="strata-model-")
    try:
        # bin dir with the real services side by side (what --bin-dir expects)
        A.bin_dir = os.path.join(work, "bin")
        os.mkdir(A.bin_dir)
        for k in ("prefetcher", "executor", "scheduler", "router"):
            os.symlink(getattr(A, k), os.path.join(A.bin_dir, "strata-" + k))
        out = subprocess.run([A.strata, "demo", "--out", os.path.join(work, "demo")], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out
        A.model = out.stdout.strip()
        gl.run_cases(CASES, A.cases or list(CASES))
    finally:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
