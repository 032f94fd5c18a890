#!/usr/bin/python3
"""test_curve.py - ZeroMQ CURVE on the router's client endpoint, and `strata keygen`.

  keygen    `strata keygen PREFIX`: PREFIX.key (0644) and PREFIX.secret (0600, whatever the
            umask), one Z85 key each, a real keypair; an existing file is never replaced
            without --force (exit 2, both files unchanged), --force replaces both; --help
  config    strata-router refuses at start-up (exit 2, before it binds): a non-loopback
            endpoint without curve_secret_key_file (the message names the endpoint and the
            keys to set), curve_clients_file without a secret key, a secret key file others
            may read, a key file that is not Z85, a clients file others may write or with a
            bad line
  loopback  the router alone (mock scheduler) with CURVE on 127.0.0.1: a client with the
            router's public key and a listed key is served (Python client and `strata client`
            with STRATA_CURVE_*); no keys, an unlisted key, or a wrong server key get no
            answer (a clean timeout); a key added to the clients file is served without a
            restart
  flags     the same router: `strata client` and `strata chat` with --curve-server-key and
            --curve-client-key (in their --help) are served; a flag wins over its
            STRATA_CURVE_* variable either way; an unlisted client key, a server key that is not
            the router's, and no keys at all are each refused with exit 1, within --gone-after
            plus a little (no hang), and one line saying it timed out and which key file to
            check; --curve-client-key alone and a key file that is not one are exit 2
  netns     in a network namespace of its own (unshare --user --net --map-root-user, lo up, an
            address of the namespace's own on lo), the whole group (strata-http too): a
            non-loopback endpoint without CURVE is refused (exit 2, `strata up` and the router
            alike); with CURVE, clients with the right keys are served (Python, `strata client`
            with STRATA_CURVE_* and without them for the running group, strata-http), others
            get no answer; insecure = true serves plaintext and warns at every start

usage: test_curve.py --build DIR --source DIR CASE
"""
import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import zmq
import zmq.utils.z85

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "http"))
sys.path.insert(0, HERE)
import httplib  # noqa: E402
import grouplib  # noqa: E402  (on the path through httplib)
from mock_scheduler import MockScheduler, token_at  # noqa: E402
from strata_client import StrataClient, StrataError, read_key_file  # noqa: E402

A = None
Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
NS_ADDR = httplib.NS_ADDR


def strata():
    return os.path.join(A.build, "services", "strata", "strata")


def router_bin():
    return os.path.join(A.build, "services", "router", "strata-router")


def keygen(prefix, *extra, umask=None):
    old = os.umask(umask) if umask is not None else None
    try:
        return subprocess.run([strata(), "keygen", *extra, prefix], capture_output=True, text=True, timeout=30)
    finally:
        if old is not None:
            os.umask(old)


def key_lines(path):
    with open(path) as f:
        return [l.strip() for l in f if l.strip() and not l.startswith("#")]


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def expect_silence(c, what):
    """A client the router does not serve: its request ends in a clean timeout or unavailable."""
    t0 = time.monotonic()
    try:
        c.health()
    except StrataError as e:
        assert e.code in ("timeout", "unavailable"), (what, e.code, e)
        assert time.monotonic() - t0 < 10, (what, "took %.1f s" % (time.monotonic() - t0))
        return
    raise AssertionError("%s: the router answered" % what)


def case_keygen():
    d = tempfile.mkdtemp(prefix="strata-keygen-")
    try:
        out = subprocess.run([strata(), "keygen", "--help"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "PREFIX.secret" in out.stdout and "--force" in out.stdout, out
        out = subprocess.run([strata(), "keygen"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "PREFIX" in out.stderr, out
        out = subprocess.run([strata(), "keygen", "--colour", "x"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2, out
        p = os.path.join(d, "router")
        out = keygen(p, umask=0)  # a permissive umask must not make the secret readable
        assert out.returncode == 0, out
        assert mode(p + ".key") == 0o644 and mode(p + ".secret") == 0o600, (oct(mode(p + ".key")), oct(mode(p + ".secret")))
        pub, sec = key_lines(p + ".key"), key_lines(p + ".secret")
        assert len(pub) == 1 and len(sec) == 1 and len(pub[0]) == 40 and len(sec[0]) == 40, (pub, sec)
        assert set(pub[0]) <= Z85 and set(sec[0]) <= Z85, (pub, sec)
        assert len(zmq.utils.z85.decode(pub[0])) == 32 and len(zmq.utils.z85.decode(sec[0])) == 32
        assert zmq.curve_public(sec[0].encode()) == pub[0].encode(), "not a keypair"
        assert out.stdout.strip() == pub[0], out.stdout
        assert read_key_file(p + ".key") == pub[0].encode() and read_key_file(p + ".secret", secret=True) == sec[0].encode()
        # no overwrite without --force: exit 2, the files as they were
        for pre in (p, p):
            out = keygen(pre)
            assert out.returncode == 2 and "exists" in out.stderr and "--force" in out.stderr, out
        assert key_lines(p + ".key") == pub and key_lines(p + ".secret") == sec
        q = os.path.join(d, "half")
        with open(q + ".secret", "w") as f:  # one of the two names taken: nothing written
            f.write("x\n")
        out = keygen(q)
        assert out.returncode == 2 and not os.path.exists(q + ".key"), out
        # --force: a new pair, in place, same modes (a secret made 0644 by hand comes back 0600)
        os.chmod(p + ".secret", 0o644)
        out = keygen(p, "--force", umask=0o022)
        assert out.returncode == 0, out
        pub2, sec2 = key_lines(p + ".key"), key_lines(p + ".secret")
        assert pub2 != pub and sec2 != sec and zmq.curve_public(sec2[0].encode()) == pub2[0].encode()
        assert mode(p + ".key") == 0o644 and mode(p + ".secret") == 0o600
        assert sorted(os.listdir(d)) == ["half.secret", "router.key", "router.secret"], os.listdir(d)  # no temporary left
        out = keygen(os.path.join(d, "no", "such", "dir", "k"))
        assert out.returncode == 1, out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def write_config(d, endpoint, router=None):
    cfg = os.path.join(d, "group.ini")
    with open(cfg, "w") as f:
        f.write("[group]\nname = cv%d\nrun_dir = %s\n" % (os.getpid(), d))
        f.write("[router]\nendpoint = %s\ncpus =\n" % endpoint)
        for k, v in (router or {}).items():
            f.write("%s = %s\n" % (k, v))
        f.write("[scheduler]\nendpoint = ipc://{run_dir}/scheduler.sock\n")
    return cfg


def run_router(cfg, timeout=20):
    return subprocess.run([router_bin(), "--config", cfg], capture_output=True, text=True, timeout=timeout)


def case_config():
    d = tempfile.mkdtemp(prefix="strata-curvecfg-")
    try:
        port = grouplib.free_port()
        keygen(os.path.join(d, "r"))
        keygen(os.path.join(d, "c"))
        sec = os.path.join(d, "r.secret")
        clients = os.path.join(d, "clients")
        shutil.copy(os.path.join(d, "c.key"), clients)
        os.chmod(clients, 0o644)
        for ep in ("tcp://0.0.0.0:%d" % port, "tcp://*:%d" % port, "tcp://[::]:%d" % port):
            out = run_router(write_config(d, ep))
            assert out.returncode == 2, (ep, out)
            assert ep in out.stderr and "not a loopback address" in out.stderr, (ep, out.stderr)
            assert "curve_secret_key_file" in out.stderr and "curve_clients_file" in out.stderr and "insecure" in out.stderr, out.stderr
        bad = {
            "needs curve_secret_key_file": {"curve_clients_file": clients},
            "[router] insecure": {"insecure": "maybe"},
            "[router] colour": {"colour": "blue"},
        }
        for want, kv in bad.items():
            out = run_router(write_config(d, "tcp://127.0.0.1:%d" % port, kv))
            assert out.returncode == 2 and want in out.stderr, (kv, out)
        # key files: a secret others may read, one that is no key, a public key where the secret goes
        lo = "tcp://127.0.0.1:%d" % port
        os.chmod(sec, 0o640)
        out = run_router(write_config(d, lo, {"curve_secret_key_file": sec}))
        assert out.returncode == 2 and "chmod 600" in out.stderr and sec in out.stderr, out
        os.chmod(sec, 0o600)
        junk = os.path.join(d, "junk.secret")
        with open(junk, "w") as f:
            f.write("# not a key\nhello\n")
        os.chmod(junk, 0o600)
        out = run_router(write_config(d, lo, {"curve_secret_key_file": junk}))
        assert out.returncode == 2 and "not a CURVE key" in out.stderr and junk + ":2" in out.stderr, out
        with open(junk, "w") as f:
            f.write("%s\n%s\n" % (key_lines(sec)[0], key_lines(sec)[0]))
        out = run_router(write_config(d, lo, {"curve_secret_key_file": junk}))
        assert out.returncode == 2 and "a second key" in out.stderr, out
        out = run_router(write_config(d, lo, {"curve_secret_key_file": os.path.join(d, "absent")}))
        assert out.returncode == 2 and "No such file" in out.stderr, out
        # a clients file others may write, or with a line that is not a key
        os.chmod(clients, 0o666)
        out = run_router(write_config(d, lo, {"curve_secret_key_file": sec, "curve_clients_file": clients}))
        assert out.returncode == 2 and "not writable by group or others" in out.stderr, out
        os.chmod(clients, 0o644)
        with open(clients, "a") as f:
            f.write("\n# a comment\n%s  bob\nnot-a-key carol\n" % key_lines(os.path.join(d, "c.key"))[0])
        out = run_router(write_config(d, lo, {"curve_secret_key_file": sec, "curve_clients_file": clients}))
        assert out.returncode == 2 and clients + ":6" in out.stderr and "not a public key" in out.stderr, out
        out = subprocess.run([router_bin(), "--help"], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "curve_secret_key_file" in out.stdout and "insecure" in out.stdout, out
    finally:
        shutil.rmtree(d, ignore_errors=True)


def client_run(endpoint, env_keys, tokens="1,2,3", timeout=20, extra_env=None):
    """`strata client --tokens` (ids out); env_keys: (server key file, client secret file) or None."""
    env = dict(os.environ)
    env.pop("STRATA_CURVE_SERVER_KEY", None)
    env.pop("STRATA_CURVE_CLIENT_KEY", None)
    if env_keys:
        env["STRATA_CURVE_SERVER_KEY"], env["STRATA_CURVE_CLIENT_KEY"] = env_keys
    env.update(extra_env or {})
    cmd = [strata(), "client"] + (["--endpoint", endpoint] if endpoint else [])
    cmd += ["--tokens", tokens, "--max-tokens", "4", "--ids", "--timeout", "8", "--gone-after", "3"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def make_keys(d, clients_text=None):
    """Keypairs of router, alice and mallory (`strata keygen`) in d, and d/clients (mode 0644,
    whatever the umask: no other user may write it) listing alice: clients_text with "%s" for her
    public key, or a copy of alice.key. Returns the paths of router.key, alice.key, alice.secret,
    mallory.secret and clients."""
    for n in ("router", "alice", "mallory"):
        assert keygen(os.path.join(d, n)).returncode == 0
    clients = os.path.join(d, "clients")
    if clients_text is None:
        shutil.copy(os.path.join(d, "alice.key"), clients)
    else:
        with open(clients, "w") as f:
            f.write(clients_text % key_lines(os.path.join(d, "alice.key"))[0])
    os.chmod(clients, 0o644)
    return tuple(os.path.join(d, n) for n in ("router.key", "alice.key", "alice.secret", "mallory.secret", "clients"))


@contextlib.contextmanager
def curve_router(d, clients):
    """strata-router alone on a loopback endpoint with CURVE (d/router.secret and the clients
    file), over a mock scheduler (vocab 300), its log in d/router.log; yields (endpoint, config,
    process) once a client with alice's keys sees the scheduler, and kills both at the end."""
    mock = None
    proc = None
    try:
        ep = "tcp://127.0.0.1:%d" % grouplib.free_port()
        cfg = write_config(d, ep, {"curve_secret_key_file": os.path.join(d, "router.secret"), "curve_clients_file": clients})
        mock = MockScheduler("ipc://%s/scheduler.sock" % d, tick=0.005, vocab=300)
        mock.start()
        mock.ready.wait(5)
        log = open(os.path.join(d, "router.log"), "ab")
        proc = subprocess.Popen([router_bin(), "--config", cfg], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        rkey, asec = os.path.join(d, "router.key"), os.path.join(d, "alice.secret")
        with StrataClient(ep, timeout=1, curve_server_key=rkey, curve_client_key=asec) as c:
            while True:
                try:
                    if c.health()["scheduler"]:
                        break
                except StrataError:
                    pass
                assert time.monotonic() < deadline and proc.poll() is None, open(os.path.join(d, "router.log")).read()
        yield ep, cfg, proc
    finally:
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        if mock:
            mock.stop()


def case_loopback():
    d = tempfile.mkdtemp(prefix="strata-curvelo-")
    try:
        rkey, akey, asec, msec, clients = make_keys(d, "# who may connect\n%s alice\n")
        with curve_router(d, clients) as (ep, _, proc):
            with StrataClient(ep, timeout=1, curve_server_key=rkey, curve_client_key=asec) as c:
                got = [t for ev in c.generate(tokens=[5, 6, 7], max_tokens=4) for t in ev["tokens"]]
                assert got == [token_at([5, 6, 7], 0, i, 300) for i in range(4)], got
            out = client_run(ep, (rkey, asec))
            assert out.returncode == 0 and len(out.stdout.split()) >= 4, out
            # refused: no keys at all, a keypair made on the spot, mallory's unlisted key, the wrong server key
            for what, kw in (("plaintext", {}), ("ephemeral key", {"curve_server_key": rkey}),
                             ("unlisted key", {"curve_server_key": rkey, "curve_client_key": msec}),
                             ("wrong server key", {"curve_server_key": akey, "curve_client_key": asec})):
                with StrataClient(ep, timeout=3, gone_after=3, **kw) as c:
                    expect_silence(c, what)
            out = client_run(ep, (rkey, msec))
            assert out.returncode == 1 and out.stdout.strip() == "", out
            out = client_run(ep, None)
            assert out.returncode == 1 and out.stdout.strip() == "", out
            assert proc.poll() is None, "the router died"
            # mallory's key added: served at the next handshake, no restart
            time.sleep(0.05)
            with open(clients, "a") as f:
                f.write("%s mallory\n" % key_lines(os.path.join(d, "mallory.key"))[0])
            with StrataClient(ep, timeout=5, curve_server_key=rkey, curve_client_key=msec) as c:
                assert c.health()["status"] in ("ok", "degraded")
            text = open(os.path.join(d, "router.log")).read()
            assert "refused" in text and "not in [router] curve_clients_file" in text, text
            assert "2 client keys" in text, text
    finally:
        shutil.rmtree(d, ignore_errors=True)


def keyed_run(cmd, endpoint, flags=None, env_keys=None, stdin=None, gone_after=2, timeout=30):
    """`strata client --tokens` (ids out) or `strata chat` (stdin) with --curve-* flags (server, client) and/or
    STRATA_CURVE_* (server, client); None leaves one out. Returns (CompletedProcess, seconds)."""
    env = dict(os.environ)
    env.pop("STRATA_CURVE_SERVER_KEY", None)
    env.pop("STRATA_CURVE_CLIENT_KEY", None)
    for var, val in zip(("STRATA_CURVE_SERVER_KEY", "STRATA_CURVE_CLIENT_KEY"), env_keys or (None, None)):
        if val:
            env[var] = val
    args = [strata(), cmd, "--endpoint", endpoint]
    for flag, val in zip(("--curve-server-key", "--curve-client-key"), flags or (None, None)):
        if val:
            args += [flag, val]
    if cmd == "client":
        args += ["--tokens", "1,2,3", "--max-tokens", "4", "--ids", "--timeout", "20", "--gone-after", str(gone_after)]
    t0 = time.monotonic()
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, input=stdin)
    return out, time.monotonic() - t0


def case_flags():
    d = tempfile.mkdtemp(prefix="strata-curveflags-")
    try:
        rkey, akey, asec, msec, clients = make_keys(d, "%s alice\n")
        for cmd in ("client", "chat"):
            out = subprocess.run([strata(), cmd, "--help"], capture_output=True, text=True, timeout=30)
            assert out.returncode == 0 and "--curve-server-key FILE" in out.stdout and "--curve-client-key FILE" in out.stdout, out
        with curve_router(d, clients) as (ep, cfg, proc):
            with StrataClient(ep, timeout=1, curve_server_key=rkey, curve_client_key=asec) as c:
                want = " ".join(str(t) for t in c.complete(tokens=[1, 2, 3], max_tokens=4)[1])
            # served: the flags alone; the flags over wrong variables
            for what, flags, env in (("flags", (rkey, asec), None), ("flags over the variables", (rkey, asec), (akey, msec)),
                                     ("a client flag with the server variable", (None, asec), (rkey, None))):
                out, _ = keyed_run("client", ep, flags, env)
                assert out.returncode == 0 and out.stdout.split() == want.split(), (what, out)
            # strata chat: the router answers the turn (it has no tokenizer, so it refuses the chat:
            # an answer all the same, over an authenticated connection)
            out, _ = keyed_run("chat", ep, (rkey, asec), (akey, msec), stdin="hello\n")
            assert out.returncode == 0 and "no tokenizer" in out.stderr and "timed out" not in out.stderr, out
            # refused: each with exit 1, soon, and one line that says why and what to check
            for what, flags, env, says in (
                    ("an unlisted client key", (rkey, msec), None, ["curve_clients_file", "--curve-client-key"]),
                    ("the variables' right keys under wrong flags", (rkey, msec), (rkey, asec), ["curve_clients_file", "--curve-client-key"]),
                    ("a key made for this run", (rkey, None), None, ["curve_clients_file", "made for this run"]),
                    ("a server key that is not the router's", (akey, asec), None, ["--curve-server-key", "not the public key"]),
                    ("no keys", None, None, ["serves CURVE", "--curve-server-key"])):
                out, took = keyed_run("client", ep, flags, env, gone_after=2)
                assert out.returncode == 1 and out.stdout.strip() == "", (what, out)
                err = out.stderr.strip()
                assert err.count("\n") == 0 and "timed out after 2.0 s" in err and all(w in err for w in says), (what, err)
                assert took < 10, (what, "took %.1f s" % took)
            out, took = keyed_run("chat", ep, (rkey, msec), None, stdin="hello\n")
            assert "timed out" in out.stderr and "curve_clients_file" in out.stderr and took < 15, (out, took)
            # bad usage: a client key without the server's, a file that is no key
            out, _ = keyed_run("client", ep, (None, asec))
            assert out.returncode == 2 and "--curve-client-key" in out.stderr and "--curve-server-key" in out.stderr, out
            out, _ = keyed_run("client", ep, (cfg, asec))
            assert out.returncode == 2 and "--curve-server-key" in out.stderr, out
            assert proc.poll() is None, "the router died"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def case_netns():
    if not httplib.enter_netns(A, __file__, "netns"):
        return
    keys = tempfile.mkdtemp(prefix="strata-curvekeys-")
    # the groups of this test only, for `strata client` finding the running group
    os.environ["STRATA_REGISTRY"] = os.path.join(keys, "registry")
    try:
        rkey, _, asec, msec, clients = make_keys(keys)
        ep = "tcp://%s:%d" % (NS_ADDR, grouplib.free_port())
        # no CURVE: refused before the router binds, by the launcher's group and the router itself
        with httplib.HttpGroup(A, sections={"router": {"endpoint": ep}}) as g:
            out = subprocess.run([g.strata, "up", "--config", g.config, "--bin-dir", g.bin_dir, "--foreground"],
                                 capture_output=True, text=True, timeout=90)
            assert out.returncode == 2 and "not a loopback address" in out.stdout + out.stderr + g.read_log(), out
            out = subprocess.run([httplib.group_args(A).router, "--config", g.config], capture_output=True, text=True, timeout=30)
            assert out.returncode == 2 and ep in out.stderr and "curve_secret_key_file" in out.stderr, out
        # CURVE with an allow-list: the right keys are served, the others hear nothing
        sec = {"router": {"endpoint": ep, "curve_secret_key_file": os.path.join(keys, "router.secret"),
                          "curve_clients_file": clients}}
        with httplib.HttpGroup(A, sections=sec) as g:
            g.start(timeout=90)
            g.wait_health()  # strata-http reached the router with the group's key
            st, _, b = httplib.request(g, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
            assert st == 200, (st, b)
            with StrataClient(ep, timeout=20, curve_server_key=rkey, curve_client_key=asec) as c:
                assert c.health()["scheduler"]
                _, toks, done = c.complete(tokens=[97, 98], max_tokens=3, ignore_eos=True)
                assert len(toks) == 3 and done["finish_reason"] == "length", done
            out = client_run(ep, (rkey, asec), tokens="97,98")
            assert out.returncode == 0 and len(out.stdout.split()) >= 1, out
            out = client_run(None, None, tokens="97,98")  # the running group of this user: its keys
            assert out.returncode == 0 and len(out.stdout.split()) >= 1, out
            for what, kw in (("plaintext", {}), ("unlisted key", {"curve_server_key": rkey, "curve_client_key": msec})):
                with StrataClient(ep, timeout=3, gone_after=3, **kw) as c:
                    expect_silence(c, what)
            out = client_run(ep, (rkey, msec), tokens="97,98")
            assert out.returncode == 1 and out.stdout.strip() == "", out
            # loopback is not where it listens
            with StrataClient(ep.replace(NS_ADDR, "127.0.0.1"), timeout=2, gone_after=2, curve_server_key=rkey,
                              curve_client_key=asec) as c:
                expect_silence(c, "127.0.0.1")
            assert g.svc("router")["restarts"] == 0, g.svc("router")
        # insecure = true: plaintext to anyone, with a warning at every start
        with httplib.HttpGroup(A, sections={"router": {"endpoint": ep, "insecure": "true"}}) as g:
            g.start(timeout=90)
            with StrataClient(ep, timeout=20) as c:
                assert c.health()["status"] in ("ok", "degraded")
            warn = "insecure = true: serving %s without CURVE" % ep
            assert warn in g.read_log(), g.read_log()
    finally:
        shutil.rmtree(keys, ignore_errors=True)


CASES = {"keygen": case_keygen, "config": case_config, "loopback": case_loopback, "flags": case_flags, "netns": case_netns}


def main():
    global A
    A = httplib.case_args(one_of=CASES)
    return httplib.run_case(CASES, A.case)


if __name__ == "__main__":
    sys.exit(main())
