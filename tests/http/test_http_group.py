#!/usr/bin/python3
"""test_http_group.py - strata-http as one service of the group.

  kill9    32 clients stream answers; strata-http gets SIGKILL in the middle; the launcher starts
           it again; clients that retry get complete answers (greedy: the same text as before the
           kill); no other service restarted
  netns    in a network namespace of its own (unshare --user --net --map-root-user, lo up, an
           address of the namespace's own on lo): a non-loopback [http] host without a key is
           refused at start-up (exit 2, `strata up --check` and strata-http alike); with
           api_key it serves, 401 for a wrong or missing key; insecure = true serves without one
           and warns
  config   `strata up --check` prints the [http] section; bad [http] values are refused with
           exit 2 naming the key; `strata status` lists the http service
  template a chat template the engine refuses is refused by `strata up` and by the router at
           start-up (exit 2, the construct and its line named); a model without a
           template serves completions and refuses chat with 400

usage: test_http_group.py --build DIR --source DIR CASE
"""
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
import httplib  # noqa: E402

A = None


def stream_once(g, body, timeout=60):
    """The text of one streamed completion, or raise on a broken stream."""
    import http.client
    c = http.client.HTTPConnection(g.host, g.http_port, timeout=timeout)
    try:
        c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise OSError("status %d: %s" % (r.status, r.read()[:200]))
        text, done = "", False
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            ch = json.loads(line[6:])
            if "error" in ch:
                raise OSError("error event: %s" % ch["error"])
            text += ch["choices"][0]["text"] if ch["choices"] else ""
        if not done:
            raise OSError("stream cut before [DONE]")
        return text
    finally:
        c.close()


def case_kill9():
    with httplib.HttpGroup(A, sections={"scheduler": {"max_context": "1024"}}) as g:
        g.start(timeout=60)
        g.wait_health()
        body = {"prompt": "Tell", "max_tokens": 800, "temperature": 0, "stream": True, "ignore_eos": True}
        want = stream_once(g, body)
        results, retries, errors = [None] * 32, [0] * 32, []
        started = threading.Barrier(33)

        def worker(i):
            first = True
            for attempt in range(50):
                try:
                    if first:
                        first = False
                        started.wait(30)
                    results[i] = stream_once(g, body)
                    return
                except (OSError, ValueError) as e:
                    retries[i] += 1
                    last = e
                    time.sleep(0.1)
            errors.append("client %d: %s" % (i, last))

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
        for t in ts:
            t.start()
        started.wait(30)
        time.sleep(0.3)  # the streams are under way
        before = g.pids()
        http_pid = before["http"]
        os.kill(http_pid, signal.SIGKILL)
        for t in ts:
            t.join(120)
        assert not errors, errors
        assert all(r == want for r in results), "an answer differs after the restart"
        assert sum(retries) > 0, "no client saw the kill (the answers ended before it)"
        g.wait_svc("http", lambda s: s["state"] == "ready" and s["pid"] != http_pid)
        for name in ("prefetcher.0", "executor", "scheduler", "router"):
            s = g.svc(name)
            assert s["restarts"] == 0 and s["pid"] == before[name], "%s restarted: %s" % (name, s)
        assert g.svc("http")["restarts"] == 1, g.svc("http")
        # the restarted service serves, and the group's work of the killed one is gone
        st, _, _ = httplib.request(g, "GET", "/health")
        assert st == 200, st
        t0 = time.time()
        while httplib.router_stats(g).get("scheduler.running", 0) > 0:
            assert time.time() - t0 < 15, "requests of the killed service still run"
            time.sleep(0.2)
        print("  %d of 32 clients retried (%d retries in all); every answer complete and equal" %
              (sum(1 for r in retries if r), sum(retries)))


def case_config():
    with httplib.HttpGroup(A, http={"model_name": "tiny-moe", "max_body_bytes": "64K"}) as g:
        out = subprocess.run([g.strata, "up", "--config", g.config, "--check"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "[http]" in out.stdout and "model_name = tiny-moe" in out.stdout and "max_body_bytes = 65536" in out.stdout, out.stdout
        g.start(timeout=60)
        g.wait_health()
        st, _, b = httplib.request(g, "GET", "/v1/models")
        assert st == 200 and json.loads(b)["data"][0]["id"] == "tiny-moe", b
        st, _, b = httplib.request(g, "POST", "/v1/completions", {"model": "tiny-moe", "prompt": "a", "max_tokens": 2})
        assert st == 200 and json.loads(b)["model"] == "tiny-moe", b
        out = subprocess.run([g.strata, "status", "--config", g.config], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and any(l.split()[:1] == ["http"] for l in out.stdout.splitlines()), out.stdout
    for kv, word in ((("port", "0"), "port"), (("insecure", "maybe"), "insecure"), (("max_body_bytes", "12"), "max_body_bytes"),
                     (("host", "[::1]"), "host"), (("colour", "blue"), "colour"), (("api_key", "a b"), "api_key")):
        with httplib.HttpGroup(A, http=dict([kv])) as g:
            out = subprocess.run([g.strata, "up", "--config", g.config, "--check"], capture_output=True, text=True, timeout=60)
            assert out.returncode == 2 and "[http] " + word in out.stderr, (kv, out.stderr)
    with httplib.HttpGroup(A, http={"api_key": "k", "api_key_file": "/x"}) as g:
        out = subprocess.run([g.strata, "up", "--config", g.config, "--check"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "not both" in out.stderr, out.stderr
    # strata-http itself: --help, and a config without [http]
    h = httplib.group_args(A).http
    out = subprocess.run([h, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "/v1/chat/completions" in out.stdout, out
    d = tempfile.mkdtemp()
    try:
        ini = os.path.join(d, "x.ini")
        with open(ini, "w") as f:
            f.write("[group]\nname = x\nrun_dir = %s\n" % d)
        out = subprocess.run([h, "--config", ini], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "no [http] section" in out.stderr, out
    finally:
        shutil.rmtree(d, ignore_errors=True)


NS_ADDR = httplib.NS_ADDR


def case_netns():
    if not httplib.enter_netns(A, __file__, "netns"):
        return
    # no key: refused before anything starts, by the launcher and by strata-http itself
    with httplib.HttpGroup(A, http={"host": NS_ADDR}) as g:
        out = subprocess.run([g.strata, "up", "--config", g.config, "--bin-dir", g.bin_dir, "--foreground"], capture_output=True,
                             text=True, timeout=60)
        assert out.returncode == 2 and "not a loopback address" in out.stderr, out
        out = subprocess.run([httplib.group_args(A).http, "--config", g.config], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "not a loopback address" in out.stderr and "api_key" in out.stderr, out
    # a key in a file: served with it, 401 without or with a wrong one
    d = tempfile.mkdtemp()
    try:
        kf = os.path.join(d, "key")
        with open(kf, "w") as f:
            f.write("sk-ns-secret\n")
        os.chmod(kf, 0o644)
        with httplib.HttpGroup(A, http={"host": NS_ADDR, "api_key_file": kf}) as g:
            out = subprocess.run([httplib.group_args(A).http, "--config", g.config], capture_output=True, text=True, timeout=30)
            assert out.returncode == 2 and "chmod 600" in out.stderr, out
            os.chmod(kf, 0o600)
            g.start(timeout=60)
            g.wait_health()
            body = {"prompt": "a", "max_tokens": 2}
            st, _, b = httplib.request(g, "POST", "/v1/completions", body, {"Authorization": "Bearer sk-ns-secret"})
            assert st == 200, (st, b)
            for hd in ({}, {"Authorization": "Bearer sk-ns-wrong"}):
                st, _, b = httplib.request(g, "POST", "/v1/completions", body, hd)
                assert st == 401 and json.loads(b)["error"]["code"] == "invalid_api_key", (st, b)
            # loopback is not where it listens
            try:
                httplib.request(g, "GET", "/health", host="127.0.0.1", timeout=3)
                raise AssertionError("it answers on 127.0.0.1 too")
            except ConnectionRefusedError:
                pass
    finally:
        shutil.rmtree(d, ignore_errors=True)
    # insecure = true: served without a key, with a warning at start
    with httplib.HttpGroup(A, http={"host": NS_ADDR, "insecure": "true"}) as g:
        g.start(timeout=60)
        g.wait_health()
        st, _, _ = httplib.request(g, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
        assert st == 200, st
        assert "insecure = true: serving %s" % NS_ADDR in g.read_log(), "no warning logged"


def case_template():
    work = tempfile.mkdtemp(prefix="strata-httpmodel-")
    try:
        model = httplib.make_model(os.path.join(work, "model"), A.source)
        with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
            json.dump({"bos_token": "<s>", "eos_token": "</s>",
                       "chat_template": "{% for m in messages %}{{ m.content }}\n{% endfor %}\n{% extends 'base.html' %}"}, f)
        with httplib.HttpGroup(A, model=model) as g:
            # the launcher refuses it before anything starts; the router itself (as systemd runs it) exits 2
            out = subprocess.run([g.strata, "up", "--config", g.config, "--check"], capture_output=True, text=True, timeout=60)
            assert out.returncode == 2 and "extends" in out.stderr and "line 3" in out.stderr, out
            g.start(wait=False)
            rc = g.proc.wait(60)
            assert rc == 2, "launcher exit %d\n%s" % (rc, g.read_log())
            out = subprocess.run([httplib.group_args(A).router, "--config", g.config], capture_output=True, text=True, timeout=60)
            assert out.returncode == 2 and "extends" in out.stderr and "line 3" in out.stderr, out
        os.unlink(os.path.join(model, "tokenizer_config.json"))
        with httplib.HttpGroup(A, model=model) as g:
            g.start(timeout=60)
            g.wait_health()
            st, _, b = httplib.request(g, "POST", "/v1/completions", {"prompt": "a", "max_tokens": 2})
            assert st == 200, (st, b)
            st, _, b = httplib.request(g, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}]})
            assert st == 400 and "no chat template" in json.loads(b)["error"]["message"], (st, b)
    finally:
        shutil.rmtree(work, ignore_errors=True)


CASES = {"kill9": case_kill9, "netns": case_netns, "config": case_config, "template": case_template}


def main():
    global A
    A = httplib.case_args(one_of=CASES)
    return httplib.run_case(CASES, A.case)


if __name__ == "__main__":
    sys.exit(main())
