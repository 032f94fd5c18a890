#!/usr/bin/python3
"""test_launcher.py - multi-process tests of `strata up` / `strata status` / `strata down` and
of strata-prefetcher, with real processes.

The prefetcher is always the real one. In these tests the executor, scheduler and router are
the stand-in tests/group/fake_service (a real process that speaks the same readiness protocol
and can be told to crash, hang or refuse its config), so the launcher's behaviours (backoff,
exit code 2, ready timeout, watchdog, SIGKILL after the grace period) can be driven exactly.
tests/group/test_group.py runs the same checks over the real services end to end.

usage: test_launcher.py --strata BIN --prefetcher BIN --fake BIN --source DIR CASE...
"""
import argparse
import glob
import os
import re
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grouplib as gl  # noqa: E402

import msgpack  # noqa: E402
import zmq  # noqa: E402

A = None


def prefetcher_status(g, node=0, timeout_ms=3000):
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect("ipc://%s/prefetcher-%d.sock" % (g.run_dir, node))
    s.send(msgpack.packb({"v": 1, "type": "status", "id": 7}))
    if not s.poll(timeout_ms):
        s.close()
        raise AssertionError("no status reply from prefetcher.%d" % node)
    r = msgpack.unpackb(s.recv(), raw=False)
    s.close()
    # optional fields at their default are left off the wire (PROTOCOL.md)
    r.setdefault("reattached", False)
    r.setdefault("fill_ms", 0.0)
    return r


def sockets_in(d):
    return [p for p in glob.glob(os.path.join(d, "*")) if os.path.exists(p) and not os.path.isfile(p) and not os.path.isdir(p)]


def case_clean_stop():
    """SIGTERM to the launcher: every process gone within 5 s, no shm segment, no socket file."""
    with gl.Group(A) as g:
        g.start()
        pids = g.pids()
        assert len(pids) == 4, pids
        assert gl.shm_segments(g.name), "the arena exists while running"
        socks = sockets_in(g.run_dir)
        assert len(socks) >= 3, "ipc socket files while running: %s" % socks
        t0 = time.time()
        g.proc.send_signal(signal.SIGTERM)
        rc = g.proc.wait(10)
        while any(gl.alive(p) for p in pids.values()) and time.time() - t0 < 10:
            time.sleep(0.02)
        dt = time.time() - t0
        left = [n for n, p in pids.items() if gl.alive(p)]
        assert not left, "still alive after %.1fs: %s" % (dt, left)
        assert rc == 0, "launcher exit code %s" % rc
        assert dt < 5.0, "stop took %.2fs" % dt
        assert not gl.shm_segments(g.name), "shm left: %s" % gl.shm_segments(g.name)
        assert not sockets_in(g.run_dir), "socket files left: %s" % sockets_in(g.run_dir)
        assert g.state()["state"] == "stopped", g.state()["state"]
        print("  clean stop: %.2fs" % dt)


def case_stop_kill():
    """A service that ignores SIGTERM is SIGKILLed after the grace period; the stop still takes
    under 5 s and its leftover socket file is removed."""
    with gl.Group(A, fake_env={"executor": "ignore-term"}) as g:
        g.start()
        pids = g.pids()
        dt, rc = g.stop()
        print("  stop with a service ignoring SIGTERM: %.2fs" % dt)
        assert rc == 0, rc
        assert dt < 5.0, "stop took %.2fs" % dt
        assert dt > 2.5, "the executor ignored TERM, so the stop must have waited for the grace period (%.2fs)" % dt
        assert not gl.alive(pids["executor"]), "executor survived"
        assert not sockets_in(g.run_dir), "socket files left: %s" % sockets_in(g.run_dir)
        assert not gl.shm_segments(g.name)
        assert "SIGKILL" in g.read_log(), "the log says it killed the executor"


def case_pinning():
    """cpus and numa_node of every section are in effect in every process and thread."""
    allowed = sorted(os.sched_getaffinity(0))
    a, b = allowed[0], allowed[-1]
    want = {"prefetcher.0": [a], "executor": [b], "scheduler": [a], "router": sorted({a, b})}
    secs = {
        "prefetcher.0": {"cpus": gl.cpulist(want["prefetcher.0"]), "numa_node": "0"},
        "executor": {"cpus": gl.cpulist(want["executor"]), "numa_node": "0"},
        "scheduler": {"cpus": gl.cpulist(want["scheduler"]), "numa_node": "0"},
        "router": {"cpus": gl.cpulist(want["router"]), "numa_node": "-1"},
    }
    with gl.Group(A, sections=secs) as g:
        g.start()
        time.sleep(0.3)  # let services start their threads
        for name, pid in g.pids().items():
            for tid in gl.task_ids(pid):
                got = gl.proc_status(tid, "Cpus_allowed_list")
                assert got == gl.cpulist(want[name]), "%s task %d: Cpus_allowed_list %s, want %s" % (name, tid, got, gl.cpulist(want[name]))
            mems = gl.proc_status(pid, "Mems_allowed_list")
            assert mems is not None and "0" in mems, "%s: Mems_allowed_list %s" % (name, mems)
            pols = gl.numa_policies(pid)
            if secs[name]["numa_node"] == "0":
                # MPOL_BIND to node 0 shows on every mapping without its own policy
                assert "bind:0" in pols, "%s: numa_maps policies %s, want bind:0" % (name, pols)
            else:
                assert "default" in pols and "bind:0" not in pols, "%s: policies %s, want default" % (name, pols)
        # the arena itself is bound to the prefetcher's node (mbind on the segment)
        seg = [p for p in gl.shm_segments(g.name) if "-arena-" in p][0]
        hdr = gl.shm_header(seg)
        assert hdr["numa_node"] == 0 and hdr["ready"] == 1, hdr
        out = subprocess.run([A.strata, "status", "--config", g.config], capture_output=True, text=True)
        assert out.returncode == 0, out
        for name in want:
            line = [l for l in out.stdout.splitlines() if l.startswith(name)]
            assert line and gl.cpulist(want[name]) in line[0].split(), "status line for %s: %s" % (name, line)
            pol = "bind:0" if secs[name]["numa_node"] == "0" else "default"
            assert pol in line[0].split(), "status shows the memory policy %s: %s" % (pol, line)


def case_prefetcher_kill():
    """kill -9 of the prefetcher: restarted, arena reattached (not refilled), segment unchanged."""
    with gl.Group(A) as g:
        g.start()
        st0 = prefetcher_status(g)
        assert st0["type"] == "status" and st0["reattached"] is False and st0["fill_ms"] > 0, st0
        seg = [p for p in gl.shm_segments(g.name) if "-arena-" in p]
        assert len(seg) == 1, seg
        h0 = gl.shm_header(seg[0])
        old = g.svc("prefetcher.0")["pid"]
        os.kill(old, signal.SIGKILL)
        s = g.wait_svc("prefetcher.0", lambda s: s["pid"] not in (0, old) and s["state"] == "ready")
        assert s["restarts"] == 1 and s["last_exit"] == "signal 9", s
        st1 = prefetcher_status(g)
        assert st1["reattached"] is True and st1["fill_ms"] == 0 and st1["pid"] == s["pid"], st1
        h1 = gl.shm_header(seg[0])
        assert h1["created_ns"] == h0["created_ns"] and h1["owner_pid"] == s["pid"] and h1["ready"] == 1, (h0, h1)
        assert g.state()["state"] == "running"
        # the other services were not touched
        assert all(g.svc(n)["restarts"] == 0 for n in ("executor", "scheduler", "router"))


def case_prefetcher_rebuild():
    """A half-filled arena left by a dead owner is rebuilt; one built from other files too. Each
    rebuild is under a new token, so a new name; the old segment is removed (it was ours) and
    the executor, which mapped it, is restarted."""
    with gl.Group(A) as g:
        g.start()
        path = gl.arena_path(g)
        h0 = gl.shm_header(path)
        # make the segment look like its filler died half-way: ready = 0, owner = a dead pid
        p = subprocess.Popen(["true"])
        p.wait()
        with open(path, "r+b") as f:
            f.seek(32)
            f.write(p.pid.to_bytes(4, "little", signed=True))
            f.seek(48)
            f.write((0).to_bytes(4, "little"))
        old = g.svc("prefetcher.0")["pid"]
        os.kill(old, signal.SIGKILL)
        s = g.wait_svc("prefetcher.0", lambda s: s["pid"] not in (0, old) and s["state"] == "ready")
        st = prefetcher_status(g)
        assert st["reattached"] is False and st["fill_ms"] > 0, st
        new = gl.arena_path(g)
        assert new != path and not os.path.exists(path), (path, new, gl.shm_segments(g.name))
        h = gl.shm_header(new)
        assert h["ready"] == 1 and h["owner_pid"] == s["pid"] and h["created_ns"] != h0["created_ns"], (h0, h)
        assert "left half-filled by a dead owner; rebuilding" in g.read_log(), "the prefetcher says why it rebuilt"
        g.wait_svc("executor", lambda s: s["restarts"] == 1 and s["state"] == "ready")
        assert "rebuilt its arena under a new name" in g.read_log()
    with gl.Group(A) as g:
        tok = "0123456789abcdef"
        fd = os.open(os.path.join(g.run_dir, "shm-0.token"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, (tok + "\n").encode())
        os.close(fd)
        path = "/dev/shm/strata-%s-%s-arena-0" % (g.name, tok)
        gl.shm_write_header(path, 8 << 20, os.getpid(), ready=1, layout_hash=12345)
        g.start()
        st = prefetcher_status(g)
        assert st["reattached"] is False, st
        assert "layout hash" in g.read_log() and "rebuilding" in g.read_log()
        new = gl.arena_path(g)
        assert new != path and not os.path.exists(path), (path, new)
        h = gl.shm_header(new)
        assert h["ready"] == 1 and h["layout_hash"] != 12345, h


def case_run_dir_planted():
    """An existing run dir is checked, not trusted. At the default /tmp/strata-<name>: a folder
    of mode 0777 owned by another user (nobody; root only), as it was found holding a group's
    sockets and state.json; one of mode 0777 that is ours; a symlink to a folder of ours. Each is
    refused by strata up (and by the prefetcher alone, as systemd starts it) with exit 2 and
    one line naming it and its owner or mode, and nothing is written into it. Once it is gone,
    up makes it 0700 and the group starts."""
    with gl.Group(A, default_run_dir=True) as g:
        rd = g.run_dir
        assert rd == "/tmp/strata-" + g.name and not os.path.lexists(rd), rd
        elsewhere = os.path.join(g.dir, "elsewhere")
        os.mkdir(elsewhere, 0o700)
        variants = [("mode", "mode 0777"), ("symlink", "a symbolic link")]
        if os.geteuid() == 0:
            variants.insert(0, ("nobody", "owned by uid 65534 (nobody)"))
        else:
            print("  not root: the folder owned by another user is not tried")
        for kind, want in variants:
            if kind == "symlink":
                os.symlink(elsewhere, rd)
            else:
                os.mkdir(rd)
                os.chmod(rd, 0o777)
                if kind == "nobody":
                    os.chown(rd, 65534, 65534)
            out = subprocess.run([A.strata, "up", "--config", g.config, "--bin-dir", g.bin_dir, "--foreground"], capture_output=True,
                                 text=True, env=g.env, timeout=30)
            lines = out.stderr.strip().splitlines()
            assert out.returncode == 2 and len(lines) == 1 and rd in lines[0] and want in lines[0], (kind, out)
            print("  %s: %s" % (kind, lines[0]))
            pf = subprocess.run([A.prefetcher, "--config", g.config, "--node", "0"], capture_output=True, text=True, env=g.env,
                                timeout=30)
            assert pf.returncode == 2 and want in pf.stderr and len(pf.stderr.strip().splitlines()) == 1, (kind, pf)
            target = elsewhere if kind == "symlink" else rd
            assert not os.listdir(target), "%s: written into: %s" % (kind, os.listdir(target))
            assert not gl.shm_segments(g.name), gl.shm_segments(g.name)
            if kind == "symlink":
                os.unlink(rd)
            else:
                os.rmdir(rd)
        # the demo's --run-dir is checked the same way
        os.chmod(elsewhere, 0o777)
        out = subprocess.run([A.strata, "up", "--demo", "--run-dir", elsewhere, "--name", g.name, "--port", str(g.port)],
                             capture_output=True, text=True, env=g.env, timeout=30)
        assert out.returncode == 2 and "mode 0777" in out.stderr and elsewhere in out.stderr, out
        assert not os.listdir(elsewhere), os.listdir(elsewhere)
        g.start()
        st = os.lstat(rd)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)


def case_prefetcher_remove():
    """As systemd runs it: the prefetcher started alone fills its arena under a new token and
    leaves arena, ring and token at a clean stop; --remove (the unit's ExecStopPost) drops all
    three, and a second --remove finds nothing to do."""
    with gl.Group(A) as g:
        log = open(os.path.join(g.dir, "prefetcher.log"), "wb")
        p = subprocess.Popen([A.prefetcher, "--config", g.config, "--node", "0"], stdout=log, stderr=subprocess.STDOUT, env=g.env)
        t0 = time.time()
        while time.time() - t0 < 20 and not os.path.exists(os.path.join(g.run_dir, "prefetcher-0.sock")):
            time.sleep(0.02)
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        log.close()
        arena = gl.arena_path(g)
        assert arena and gl.shm_header(arena)["ready"] == 1, (arena, gl.shm_segments(g.name))
        assert sorted(gl.shm_segments(g.name)) == sorted([arena, arena.replace("-arena-", "-ring-")]), gl.shm_segments(g.name)
        for _ in range(2):
            out = subprocess.run([A.prefetcher, "--config", g.config, "--node", "0", "--remove"], capture_output=True, text=True,
                                 env=g.env, timeout=30)
            assert out.returncode == 0, out
            assert not gl.shm_segments(g.name) and gl.token(g.run_dir) is None, (gl.shm_segments(g.name), out)


def case_backoff():
    """A service that keeps crashing before ready is restarted with doubling delays up to the
    cap; the launcher gives up after ready_timeout_s with exit 1 and cleans up."""
    secs = {"launcher": {"restart_backoff_ms": "100", "restart_backoff_max_ms": "800", "ready_timeout_s": "5"}}
    with gl.Group(A, fake_env={"scheduler": "crash"}, sections=secs) as g:
        g.start(wait=False)
        rc = g.proc.wait(30)
        assert rc == 1, "launcher exit code %s" % rc
        with open(os.path.join(g.run_dir, "fake-scheduler.starts")) as f:
            t = [float(l.split()[1]) for l in f]
        # each start runs 0.1 s before crashing; the gap after that is the backoff
        waits = [round((t[i + 1] - t[i] - 0.1) * 1000) for i in range(len(t) - 1)]
        print("  backoff waits (ms): %s" % waits)
        assert len(waits) >= 4, waits
        want = [100, 200, 400, 800, 800, 800, 800]
        for w, e in zip(waits, want):
            assert e - 30 <= w <= e + 400, "waits %s, want about %s" % (waits, want[: len(waits)])
        assert "keeps failing" in g.read_log()
        assert not gl.shm_segments(g.name), "shm cleaned after a failed start"
        assert g.state()["state"] == "failed", g.state()["state"]


def case_crash_once():
    """A crash at start is retried; the group comes up and counts the restart."""
    with gl.Group(A, fake_env={"executor": "crash-once"}) as g:
        g.start()
        s = g.svc("executor")
        assert s["restarts"] == 1 and s["last_exit"] == "exit 1" and s["state"] == "ready", s


def case_exit2():
    """Exit code 2 (bad config) is not restarted: the launcher stops the group and exits 2 too
    (no restart fixes it)."""
    with gl.Group(A, fake_env={"executor": "exit2"}) as g:
        g.start(wait=False)
        rc = g.proc.wait(20)
        assert rc == 2, rc
        with open(os.path.join(g.run_dir, "fake-executor.starts")) as f:
            n = len(f.readlines())
        assert n == 1, "executor started %d times" % n
        log = g.read_log()
        assert "exited with 2" in log and "not restarting" in log, log
        assert not gl.shm_segments(g.name)
        assert g.svc("executor")["state"] == "failed"


def case_ready_timeout():
    """A service that never reports READY fails the start after ready_timeout_s."""
    with gl.Group(A, fake_env={"router": "noready"}, sections={"launcher": {"ready_timeout_s": "2"}}) as g:
        t0 = time.time()
        g.start(wait=False)
        rc = g.proc.wait(20)
        dt = time.time() - t0
        assert rc == 1 and 2.0 <= dt < 8, (rc, dt)
        assert "router not ready within ready_timeout_s = 2" in g.read_log()


def case_watchdog():
    """A service that opted in to the watchdog and goes silent is killed and restarted."""
    with gl.Group(A, fake_env={"scheduler": "hang"}, sections={"launcher": {"watchdog_s": "1"}}) as g:
        g.start()
        first = g.svc("scheduler")["pid"]
        s = g.wait_svc("scheduler", lambda s: s["restarts"] >= 1, timeout=10)
        assert s["last_exit"] == "signal 9", s
        assert not gl.alive(first)
        assert "watchdog" in g.read_log()
        # the others ping and are never killed
        assert g.svc("executor")["restarts"] == 0 and g.svc("prefetcher.0")["restarts"] == 0


def case_status_and_daemon():
    """`strata up` detaches once ready; `strata status` shows the table; `strata down` stops."""
    with gl.Group(A) as g:
        out = subprocess.run([A.strata, "up", "--config", g.config, "--bin-dir", g.bin_dir], capture_output=True, text=True,
                             env=g.env, timeout=60)
        assert out.returncode == 0 and "ready" in out.stdout, out
        st = g.state()
        assert st["state"] == "running" and gl.alive(st["launcher_pid"]), st
        out = subprocess.run([A.strata, "status", "--config", g.config], capture_output=True, text=True)
        assert out.returncode == 0, out
        lines = out.stdout.splitlines()
        for name in ("prefetcher.0", "executor", "scheduler", "router"):
            l = [x for x in lines if x.startswith(name + " ")]
            assert l, out.stdout
            f = l[0].split()
            assert int(f[1]) == g.svc(name)["pid"] and f[2] == "ready" and f[4] == "0", f
            assert re.match(r"^[0-9.]+[smh]$", f[3]), f
        # a second launcher for the same group is refused
        out2 = subprocess.run([A.strata, "up", "--config", g.config, "--bin-dir", g.bin_dir, "--foreground"], capture_output=True,
                              text=True, env=g.env, timeout=30)
        assert out2.returncode == 1 and "already running" in out2.stderr, out2
        pids = g.pids()
        t0 = time.time()
        out = subprocess.run([A.strata, "down", "--config", g.config], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "stopped" in out.stdout, out
        assert time.time() - t0 < 5.0
        assert not any(gl.alive(p) for p in pids.values())
        assert not gl.shm_segments(g.name) and not sockets_in(g.run_dir)
        out = subprocess.run([A.strata, "status", "--config", g.config], capture_output=True, text=True)
        assert out.returncode == 1 and "stopped" in out.stdout, out


def case_launcher_killed():
    """kill -9 of the launcher: every service gets SIGTERM (parent-death signal) and exits."""
    with gl.Group(A) as g:
        g.start()
        pids = g.pids()
        g.proc.kill()
        g.proc.wait()
        t0 = time.time()
        while any(gl.alive(p) for p in pids.values()) and time.time() - t0 < 5:
            time.sleep(0.02)
        left = [n for n, p in pids.items() if gl.alive(p)]
        assert not left, "orphans: %s" % left
        print("  services gone %.2fs after the launcher was killed" % (time.time() - t0))
        # the arena outlives everyone; a new launcher reattaches it
        assert gl.shm_segments(g.name)
        g.proc = None
        g.start()
        st = prefetcher_status(g)
        assert st["reattached"] is True, st


def case_config_errors():
    """Bad configs: exit 2, and the message names the file, the line and the key."""
    d = tempfile.mkdtemp(prefix="strata-cfg-")
    try:
        cases = [
            ("[group]\nname = x\nmodel = /m\n[router]\nmax_qeue = 3\n", ":5:", "max_qeue"),
            ("[group]\nname = x\n[executor]\ncpus = 0-z\n", ":4:", "cpus"),
            ("[group]\nname = x\n[shceduler]\n", ":3:", "shceduler"),
            ("[launcher]\nready_timeout_s = -1\n", ":2:", "ready_timeout_s"),
            ("[group]\nname = x\n[executor]\ncpus = 1000\n", "[executor] cpus", "not all of them are available"),
            ("[group]\nname = x\n[prefetcher.7]\nnuma_node = 7\n", "[prefetcher.7]", "numa_node = 7"),
        ]
        for i, (text, where, key) in enumerate(cases):
            p = os.path.join(d, "bad%d.ini" % i)
            with open(p, "w") as f:
                f.write(text)
            out = subprocess.run([A.strata, "up", "--config", p, "--foreground"], capture_output=True, text=True, timeout=30)
            assert out.returncode == 2, "case %d: exit %d: %s" % (i, out.returncode, out.stderr)
            assert p in out.stderr and where in out.stderr and key in out.stderr, "case %d: %s" % (i, out.stderr)
            # the services refuse the same file with 2 too
            if where.startswith(":"):
                out = subprocess.run([A.prefetcher, "--config", p, "--node", "0"], capture_output=True, text=True, timeout=30)
                assert out.returncode == 2 and where in out.stderr, "prefetcher, case %d: %s" % (i, out.stderr)
        out = subprocess.run([A.strata, "up", "--config", os.path.join(d, "missing.ini")], capture_output=True, text=True)
        assert out.returncode == 2 and "missing.ini" in out.stderr, out
        out = subprocess.run([A.strata, "up"], capture_output=True, text=True)
        assert out.returncode == 2, out
        for exe in (A.strata, A.prefetcher):
            out = subprocess.run([exe] + (["up"] if exe == A.strata else []) + ["--help"], capture_output=True, text=True)
            assert out.returncode == 0 and "usage" in out.stdout, out
    finally:
        subprocess.run(["rm", "-rf", d])


def case_deploy_configs():
    """The example configs in deploy/ pass --check once pointed at a model that exists, with their
    placement for their own machines taken out (cpus dropped, numa_node -1); as they are, --check
    refuses them here with the cause (the model folder, or cpus this machine lacks)."""
    files = sorted(glob.glob(os.path.join(A.source, "deploy", "*.ini")))
    assert len(files) >= 2, files
    d = tempfile.mkdtemp(prefix="strata-deploy-")
    try:
        texts = {}
        for p in files:
            out = subprocess.run([A.strata, "up", "--check", "--config", p], capture_output=True, text=True)
            assert out.returncode == 2 and ("model folder" in out.stderr or "cpus" in out.stderr), "%s: %s" % (p, out.stderr)
            lines = []
            for line in open(p):
                key = line.split("=")[0].strip()
                if key == "cpus":
                    continue
                lines.append("model = %s\n" % A.model if key == "model" else "numa_node = -1\n" if key == "numa_node" else line)
            q = os.path.join(d, os.path.basename(p))
            with open(q, "w") as f:
                f.writelines(lines)
            out = subprocess.run([A.strata, "up", "--check", "--config", q], capture_output=True, text=True)
            assert out.returncode == 0, "%s: %s" % (q, out.stderr)
            assert "prefetcher." in out.stdout, out.stdout
            texts[p] = out.stdout
        two = [p for p in files if "two" in os.path.basename(p)]
        assert two, files
        assert texts[two[0]].count("[prefetcher.") == 2, texts[two[0]]
    finally:
        subprocess.run(["rm", "-rf", d])


CASES = {k[5:]: v for k, v in globals().items() if k.startswith("case_")}


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--prefetcher", required=True)
    ap.add_argument("--fake", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("cases", nargs="*")
    A = ap.parse_args()
    A.strata, A.prefetcher, A.fake = (os.path.abspath(x) for x in (A.strata, A.prefetcher, A.fake))
    work = tempfile.mkdtemp(prefix="strata-model-")
    try:
        out = subprocess.run([A.strata, "demo", "--out", work], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out
        A.model = out.stdout.strip()
        gl.run_cases(CASES, A.cases or list(CASES))
    finally:
        subprocess.run(["rm", "-rf", work])


if __name__ == "__main__":
    main()
