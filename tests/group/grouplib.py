"""grouplib.py - helpers for the multi-process tests: temp groups, the launcher, /proc checks.

Every group gets its own run dir under /tmp, a unique group name (so its shm segments are
/strata-<name>-<token>-*, the token of node N in RUN_DIR/shm-N.token) and, where a router runs,
its own port. Group(user=NAME) runs the whole group as that user (root only: setpriv), from
copies of the binaries and the model it can read. Group.close() stops the launcher, kills any
process of the group still alive, and removes its shm segments and run dir, so a failing test
leaves nothing behind.
"""
import argparse
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

SHM_MAGIC = 0x314D485341525453
_counter = [0]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def alive(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def proc_status(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    return None


def task_ids(pid):
    return [int(t) for t in os.listdir("/proc/%d/task" % pid)]


def numa_policies(pid):
    """Set of memory policies over the process's mappings, from /proc/PID/numa_maps."""
    pols = set()
    try:
        with open("/proc/%d/numa_maps" % pid) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2:
                    pols.add(parts[1])
    except OSError:
        pass
    return pols


def cpulist(cpus):
    """Format a set of ints as a kernel cpulist."""
    cpus = sorted(cpus)
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else "%d-%d" % (cpus[i], cpus[j]))
        i = j + 1
    return ",".join(out)


def shm_segments(group):
    return sorted(glob.glob("/dev/shm/strata-%s-*" % group))


def token(run_dir, node=0):
    """Node's segment token (RUN_DIR/shm-N.token), or None."""
    try:
        with open(os.path.join(run_dir, "shm-%d.token" % node)) as f:
            return f.read().strip()
    except OSError:
        return None


def arena_path(g, node=0):
    """The file of node's arena as its token names it now, or None."""
    t = token(g.run_dir, node)
    return "/dev/shm/strata-%s-%s-arena-%d" % (g.name, t, node) if t else None


def arena_files(path):
    """{file name: (offset, bytes)} from a ready arena's index (store/arena.h arena_index_t)."""
    with open(path, "rb") as f:
        f.seek(4096)
        b = f.read(592)  # through model_dir: the entries follow
        n = struct.unpack_from("<I", b, 12)[0]
        out = {}
        for i in range(n):
            e = f.read(96)  # name[64], offset, bytes, mtime_ns, flags, reserved
            name = e[:64].split(b"\0")[0].decode()
            out[name] = struct.unpack_from("<QQ", e, 64)
    return out


def need_root(why):
    """Re-run this test as root through `sudo -n` when it is not root and that works; else exit 77
    (meson: skipped)."""
    if os.geteuid() == 0:
        return
    if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0:
        sys.stdout.flush()
        os.execvp("sudo", ["sudo", "-n", sys.executable] + [os.path.abspath(sys.argv[0])] + sys.argv[1:])
    print("skipped: %s needs root (or sudo -n)" % why)
    sys.exit(77)


def as_user(user):
    """The command prefix that runs a program as user, with that user's groups only."""
    pw = pwd.getpwnam(user)
    return ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--clear-groups", "--"]


def chown_tree(path, user):
    pw = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for n in [root] + [os.path.join(root, x) for x in dirs + files]:
            os.lchown(n, pw.pw_uid, pw.pw_gid)


def shm_header(path):
    """dict of common/shm.h shm_header_t, or None if the file is too short."""
    with open(path, "rb") as f:
        b = f.read(56)
    if len(b) < 56:
        return None
    k = ("magic", "version", "header_bytes", "layout_hash", "size", "owner_pid", "numa_node", "created_ns", "ready", "reserved")
    return dict(zip(k, struct.unpack("<QIIQQiiQII", b)))


def shm_write_header(path, size, owner_pid, ready, layout_hash=0):
    """A segment file with a strata header (for stale/half-filled arena tests)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<QIIQQiiQII", SHM_MAGIC, 1, 4096, layout_hash, size, owner_pid, -1, 0, ready, 0))
        f.truncate(size)


class Group:
    """A process group in a temp run dir. kind: 'fake' (real prefetcher, stand-in executor,
    scheduler, router) or 'real' (every real service)."""

    def __init__(self, args, kind="fake", extra=None, fake_env=None, sections=None, user=None, default_run_dir=False):
        _counter[0] += 1
        self.args = args
        self.user = user
        self.name = "t%dx%d" % (os.getpid(), _counter[0])
        self.dir = tempfile.mkdtemp(prefix="strata-%s-" % self.name)
        # default_run_dir: the config names none, so it is the predictable /tmp/strata-<name>, made by up
        self.default_run_dir = default_run_dir
        self.run_dir = "/tmp/strata-" + self.name if default_run_dir else os.path.join(self.dir, "run")
        if not default_run_dir:
            os.mkdir(self.run_dir, 0o700)
        self.port = free_port()
        self.proc = None
        self.log_path = os.path.join(self.dir, "launcher.log")
        self.env = dict(os.environ)
        self.env.pop("NOTIFY_SOCKET", None)
        if user:  # nothing of the test user's: its runtime dir and registry are not this user's
            for k in ("XDG_RUNTIME_DIR", "STRATA_REGISTRY"):
                self.env.pop(k, None)
            self.env["HOME"] = self.dir
        for k, v in (fake_env or {}).items():
            self.env["STRATA_FAKE_" + k.upper()] = v
        self.bin_dir = os.path.join(self.dir, "bin")
        os.mkdir(self.bin_dir)
        for svc in ("prefetcher", "executor", "scheduler", "router"):
            real = getattr(args, svc, None)
            src = real if (kind == "real" or svc == "prefetcher") else args.fake
            if user:  # the build tree may not be this user's to read
                shutil.copy(src, os.path.join(self.bin_dir, "strata-" + svc))
            else:
                os.symlink(src, os.path.join(self.bin_dir, "strata-" + svc))
        self.strata = args.strata
        model = args.model
        if user:
            self.strata = os.path.join(self.bin_dir, "strata")
            shutil.copy(args.strata, self.strata)
            model = os.path.join(self.dir, "model")
            shutil.copytree(args.model, model)
        self.model = model
        self.config = os.path.join(self.dir, "group.ini")
        sec = {
            "group": dict({"name": self.name, "model": model}, **({} if default_run_dir else {"run_dir": self.run_dir})),
            "router": {"endpoint": "tcp://127.0.0.1:%d" % self.port, "cpus": ""},
            "launcher": {"restart_backoff_ms": "100", "restart_backoff_max_ms": "1000", "ready_timeout_s": "20"},
            "prefetcher.0": {"numa_node": "-1"},
        }
        for s, kv in (sections or {}).items():
            sec.setdefault(s, {}).update(kv)
        with open(self.config, "w") as f:
            for s, kv in sec.items():
                f.write("[%s]\n" % s)
                for k, v in kv.items():
                    f.write("%s = %s\n" % (k, v))
        self.extra = extra or []
        if user:
            chown_tree(self.dir, user)

    # -- launcher --
    def start(self, wait=True, foreground=True, timeout=30):
        cmd = (as_user(self.user) if self.user else []) + [self.strata, "up", "--config", self.config, "--bin-dir", self.bin_dir]
        cmd += self.extra
        if foreground:
            cmd.append("--foreground")
        try:  # a state file from an earlier launcher of this group must not look current
            os.unlink(os.path.join(self.run_dir, "state.json"))
        except OSError:
            pass
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        if wait:
            self.wait_state("running", timeout)
        return self

    def state(self):
        try:
            with open(os.path.join(self.run_dir, "state.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def svc(self, name):
        st = self.state()
        for s in (st or {}).get("services", []):
            if s["name"] == name:
                return s
        return None

    def wait_state(self, want, timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            st = self.state()
            if st and st["state"] == want:
                return st
            if self.proc is not None and self.proc.poll() is not None and want != "stopped":
                raise AssertionError("launcher exited (%s) before '%s'; log:\n%s" % (self.proc.returncode, want, self.read_log()))
            time.sleep(0.05)
        raise AssertionError("group not '%s' within %ss (state %s); log:\n%s" % (want, timeout, self.state(), self.read_log()))

    def wait_svc(self, name, pred, timeout=20):
        t0 = time.time()
        while time.time() - t0 < timeout:
            s = self.svc(name)
            if s and pred(s):
                return s
            time.sleep(0.05)
        raise AssertionError("%s: condition not met in %ss: %s\nlog:\n%s" % (name, timeout, self.svc(name), self.read_log()))

    def pids(self):
        return {s["name"]: s["pid"] for s in self.state()["services"] if s["pid"] > 0}

    def read_log(self):
        out = ""
        for p in [self.log_path] + sorted(glob.glob(os.path.join(self.run_dir, "logs", "*.log"))) + [
            os.path.join(self.run_dir, "launcher.log")
        ]:
            try:
                with open(p, "rb") as f:
                    data = f.read()[-6000:].decode(errors="replace")
                out += "--- %s\n%s" % (p, data)
            except OSError:
                pass
        return out

    def stop(self, timeout=10):
        """SIGTERM the launcher; returns (seconds until it exited, exit code)."""
        t0 = time.time()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        return time.time() - t0, rc

    def close(self):
        pids = []
        st = self.state()
        if st:
            pids = [s["pid"] for s in st["services"] if s["pid"] > 0]
            if st.get("launcher_pid", 0) > 0 and (self.proc is None or st["launcher_pid"] != self.proc.pid):
                pids.append(st["launcher_pid"])
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for p in pids:
            if alive(p):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        for p in shm_segments(self.name):
            try:
                os.unlink(p)
            except OSError:
                pass
        if getattr(self, "log", None):
            self.log.close()
        if self.default_run_dir and os.path.islink(self.run_dir):
            os.unlink(self.run_dir)
        elif self.default_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()


def real_group_args():
    """The command line of the tests that run every real service: --strata, --prefetcher,
    --executor, --scheduler, --router (binaries, made absolute), --client-py (proto/python, put
    on sys.path) and the case names. fake is None: no service is a stand-in."""
    ap = argparse.ArgumentParser()
    keys = ("strata", "prefetcher", "executor", "scheduler", "router", "client_py")
    for k in keys:
        ap.add_argument("--" + k.replace("_", "-"), required=True)
    ap.add_argument("cases", nargs="*")
    a = ap.parse_args()
    for k in keys:
        setattr(a, k, os.path.abspath(getattr(a, k)))
    a.fake = None
    sys.path.insert(0, a.client_py)
    return a


def run_cases(cases, names, after_failure=None):
    """Run the named test functions; print a line each; exit 1 if any failed (after calling
    after_failure, when given: e.g. to print a log)."""
    failed = 0
    for n in names:
        t0 = time.time()
        try:
            cases[n]()
            print("ok   %-28s %.1fs" % (n, time.time() - t0), flush=True)
        except Exception as e:  # noqa: BLE001 - report every failure the same way
            failed += 1
            print("FAIL %-28s %.1fs: %s" % (n, time.time() - t0, e), flush=True)
    if failed and after_failure:
        after_failure()
    sys.exit(1 if failed else 0)
