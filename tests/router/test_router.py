#!/usr/bin/python3
"""The real strata-router process against a mock scheduler (mock_scheduler.py).

    test_router.py ROUTER_BIN bad_input   malformed msgpack, wrong types, unknown version,
                                          unknown fields, frames over the limit, prompts
                                          longer than the context, max_tokens <= 0, absurd
                                          sampling, a client flooding 10,000 requests; other
                                          clients are unaffected and the router survives
    test_router.py ROUTER_BIN resume STRATA_BIN
                                          streaming, stream=false, cancel, client gone,
                                          router kill -9 + resume (Python client and
                                          `strata client`), no router -> unavailable,
                                          scheduler restart, lost events, SIGTERM
    test_router.py ROUTER_BIN churn     20,000 short connections (connect, one request, close,
                                          600 at a time): the router's RSS after them is
                                          within 1.25x of its RSS after the first 1,000,
                                          and its fds are back where they started
    test_router.py ROUTER_BIN text STRATA_BIN TOKENIZER_JSON
                                          the router's tokenizer: text prompts, streamed
                                          text (never broken UTF-8), stop strings, resume
                                          with text, `strata client --prompt`

Every check prints PASS/FAIL; the exit status is the number of failures (capped).
"""
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "proto", "python"))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "group"))
from mock_scheduler import ECHO_SEED, EOS, EOS_TRIGGER, MAX_CONTEXT, MockScheduler, token_at  # noqa: E402
from strata_client import StrataClient, StrataError, decode  # noqa: E402
from grouplib import free_port  # noqa: E402

FAILS = 0


def check(cond, what):
    global FAILS
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILS += 1


class Group:
    """A temp run dir, a config, the mock scheduler thread and the router process."""

    def __init__(self, router_bin, tick=0.005, max_frame=4096, max_queue=256, per_client=8, tokenizer=None,
                 vocab=300, eos=EOS):
        self.bin = router_bin
        self.dir = tempfile.mkdtemp(prefix="strata-rt-")
        self.port = free_port()
        self.endpoint = "tcp://127.0.0.1:%d" % self.port
        self.cfg = os.path.join(self.dir, "group.ini")
        with open(self.cfg, "w") as f:
            f.write("[group]\nname = rt%d\nrun_dir = %s\n" % (os.getpid(), self.dir))
            if tokenizer:
                f.write("tokenizer = %s\n" % tokenizer)
            f.write("[router]\nendpoint = %s\nmax_frame_bytes = %d\nmax_queue = %d\nmax_inflight_per_client = %d\n"
                    % (self.endpoint, max_frame, max_queue, per_client))
            f.write("[scheduler]\nendpoint = ipc://{run_dir}/scheduler.sock\n")
        self.mock = MockScheduler("ipc://%s/scheduler.sock" % self.dir, tick=tick, vocab=vocab, eos=eos)
        self.mock.start()
        self.mock.ready.wait(5)
        self.proc = None
        self.start_router()

    def start_router(self):
        self.log = open(os.path.join(self.dir, "router.log"), "ab")
        self.proc = subprocess.Popen([self.bin, "--config", self.cfg], stdout=self.log, stderr=subprocess.STDOUT)
        # ready when it answers health with the scheduler up
        deadline = time.monotonic() + 10
        with StrataClient(self.endpoint, timeout=1, resume_after=1) as c:
            while time.monotonic() < deadline:
                try:
                    if c.health()["scheduler"]:
                        return
                except StrataError:
                    c._connect()
                time.sleep(0.05)
        raise RuntimeError("router did not become ready; log in %s" % self.dir)

    def client(self, **kw):
        kw.setdefault("timeout", 20)
        return StrataClient(self.endpoint, **kw)

    def close(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.mock.stop()
        if FAILS:
            try:
                sys.stdout.write(open(os.path.join(self.dir, "router.log")).read()[-4000:])
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


def expected(prompt, seed, n):
    return [token_at(prompt, seed, i) for i in range(n)]


def raw_reply(g, frame, frames=None, timeout=5):
    """Send raw frame(s) from a fresh DEALER; return the decoded reply or None."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(g.endpoint)
    if frames:
        s.send_multipart(frames)
    else:
        s.send(frame)
    r = None
    if s.poll(int(timeout * 1000)):
        r = msgpack.unpackb(s.recv(), raw=False)
    s.close(0)
    return r


def pack(m):
    return msgpack.packb(m, use_bin_type=True)


def expect_error(g, what, frame, code, text=None, rid=None, frames=None):
    r = raw_reply(g, frame, frames)
    ok = r is not None and r.get("type") == "error" and r.get("code") == code and r.get("v") == 1
    if ok and text:
        ok = text in r.get("message", "")
    if ok and rid is not None:
        ok = r.get("id") == rid
    check(ok, "%s -> error %s%s (got %r)" % (what, code, " naming '%s'" % text if text else "", r))


def pairs(*kv):
    """A message map of (key, value) pairs in order; unlike a dict it can repeat a key."""
    return bytes([0x80 | len(kv)]) + b"".join(pack(k) + pack(v) for k, v in kv)


def gen(**kw):
    m = {"v": 1, "type": "generate", "id": 77, "tokens": [5, 6, 7], "max_tokens": 4}
    m.update(kw)
    return {k: v for k, v in m.items() if v is not None}


def test_bad_input(g):
    pid = g.proc.pid
    expect_error(g, "empty frame", b"", "malformed")
    expect_error(g, "0xc1 byte", b"\xc1", "malformed")
    expect_error(g, "text, not msgpack", b"hello there", "malformed")
    expect_error(g, "truncated map", pack(gen())[:-3], "malformed")
    expect_error(g, "array, not a map", pack([1, 2, 3]), "malformed", "not a map")
    expect_error(g, "array32 header claiming 4G elements", b"\xdd\xff\xff\xff\xff", "malformed")
    expect_error(g, "nesting 100 deep", b"\x91" * 100 + b"\x01", "malformed")
    expect_error(g, "two payload frames", None, "malformed", frames=[pack(gen()), pack(gen())])
    expect_error(g, "version 2", pack(gen(v=2)), "bad_version", "version 2", rid=77)
    expect_error(g, "no version", pack({"type": "health"}), "bad_version")
    expect_error(g, "version as string", pack(gen(v="1")), "bad_version")
    expect_error(g, "unknown type", pack({"v": 1, "type": "explode", "id": 5}), "unknown_type", "explode", rid=5)
    expect_error(g, "type not a string", pack({"v": 1, "type": 3}), "unknown_type")
    expect_error(g, "unknown field", pack(gen(temprature=0.5)), "unknown_field", "temprature", rid=77)
    # a repeated key is malformed, whatever its values; a repeated id used to pass (the last one won)
    base = (("v", 1), ("type", "generate"), ("tokens", [5]), ("max_tokens", 2))
    r = raw_reply(g, pairs(*base, ("id", 77), ("id", 78)))
    check(r is not None and r.get("type") == "error" and r.get("code") == "malformed" and "'id' appears twice"
          in r.get("message", "") and "id" not in r, "id twice -> error malformed without an id (got %r)" % r)
    expect_error(g, "max_tokens twice", pairs(*base, ("id", 77), ("max_tokens", "x")), "malformed",
                 "'max_tokens' appears twice", rid=77)
    expect_error(g, "v twice", pairs(("v", 1), *base[1:], ("id", 77), ("v", 1)), "malformed", "'v' appears twice")
    try:
        decode(pairs(("v", 1), ("type", "done"), ("id", 1), ("id", 2)))
        check(False, "the Python client refuses a reply that repeats a key")
    except ValueError:
        check(True, "the Python client refuses a reply that repeats a key")
    expect_error(g, "max_tokens as string", pack(gen(max_tokens="5")), "wrong_type", "max_tokens", rid=77)
    expect_error(g, "max_tokens as float", pack(gen(max_tokens=5.0)), "wrong_type", "max_tokens")
    expect_error(g, "tokens as string", pack(gen(tokens="1 2 3")), "wrong_type", "tokens")
    expect_error(g, "token id as string", pack(gen(tokens=[1, "2"])), "wrong_type", "tokens[1]")
    expect_error(g, "stream as string", pack(gen(stream="yes")), "wrong_type", "stream")
    expect_error(g, "stop as string", pack(gen(stop="\n")), "wrong_type", "stop")
    expect_error(g, "id as string", pack(gen(id="abc")), "wrong_type", "id")
    expect_error(g, "id negative", pack(gen(id=-4)), "invalid_param", "id")
    expect_error(g, "no id", pack({"v": 1, "type": "generate", "tokens": [1], "max_tokens": 2}), "missing_field", "id")
    expect_error(g, "no max_tokens", pack({"v": 1, "type": "generate", "id": 3, "tokens": [1]}), "missing_field",
                 "max_tokens")
    expect_error(g, "neither prompt nor tokens", pack({"v": 1, "type": "generate", "id": 3, "max_tokens": 2}),
                 "missing_field")
    expect_error(g, "max_tokens 0", pack(gen(max_tokens=0)), "invalid_param", "max_tokens", rid=77)
    expect_error(g, "max_tokens -1", pack(gen(max_tokens=-1)), "invalid_param", "max_tokens")
    expect_error(g, "max_tokens 2^40", pack(gen(max_tokens=1 << 40)), "invalid_param", "max_tokens")
    expect_error(g, "temperature 1e9", pack(gen(temperature=1e9)), "invalid_param", "temperature")
    expect_error(g, "temperature -1", pack(gen(temperature=-1.0)), "invalid_param", "temperature")
    # the value as sent, not rounded: 100.0001 used to read "got 100"
    expect_error(g, "temperature 100.0001", pack(gen(temperature=100.0001)), "invalid_param",
                 "must be in [0, 100], got 100.0001")
    expect_error(g, "top_p 1.0000001", pack(gen(top_p=1.0000001)), "invalid_param", "must be in (0, 1], got 1.0000001")
    expect_error(g, "temperature NaN", pack(gen(temperature=math.nan)), "invalid_param", "temperature")
    expect_error(g, "temperature inf", pack(gen(temperature=math.inf)), "invalid_param", "temperature")
    expect_error(g, "top_p 0", pack(gen(top_p=0.0)), "invalid_param", "top_p")
    expect_error(g, "top_p 2", pack(gen(top_p=2.0)), "invalid_param", "top_p")
    expect_error(g, "top_k -5", pack(gen(top_k=-5)), "invalid_param", "top_k")
    expect_error(g, "top_k 1e12", pack(gen(top_k=10 ** 12)), "invalid_param", "top_k")
    expect_error(g, "seed -1", pack(gen(seed=-1)), "invalid_param", "seed")
    expect_error(g, "17 stop strings", pack(gen(stop=["x"] * 17)), "invalid_param", "stop")
    expect_error(g, "empty stop string", pack(gen(stop=[""])), "invalid_param", "stop[0]")
    expect_error(g, "token id beyond the vocab", pack(gen(tokens=[5, 1000])), "invalid_param", "tokens[1]")
    expect_error(g, "negative token id", pack(gen(tokens=[5, -1])), "invalid_param", "tokens[1]")
    expect_error(g, "prompt longer than the context", pack(gen(tokens=[5] * MAX_CONTEXT)), "context_overflow",
                 "context")
    expect_error(g, "prompt far longer than the context", pack(gen(tokens=[5] * 900)), "context_overflow")
    bad = {"v": 1, "type": "generate", "id": 77, "prompt": b"ok \xff\xfe", "max_tokens": 4}
    expect_error(g, "prompt not UTF-8", msgpack.packb(bad, use_bin_type=False), "invalid_param", "UTF-8")
    expect_error(g, "prompt as bin", pack(gen(tokens=None, prompt=b"abc")), "wrong_type", "prompt")
    expect_error(g, "frame over max_frame_bytes", pack(gen(tokens=[5000] * 2000)), "too_large", "4096")
    expect_error(g, "cancel of an unknown id", pack({"v": 1, "type": "cancel", "id": 123456}), "not_found", rid=123456)
    expect_error(g, "resume of an unknown id", pack({"v": 1, "type": "resume", "id": 99999, "from": 0}), "not_found",
                 rid=99999)
    # a readable range: it used to read [0, 9223372036854775808]
    expect_error(g, "resume from -1", pack({"v": 1, "type": "resume", "id": 9, "from": -1}), "invalid_param",
                 "resume: field 'from': must be in [0, 2^63-1], got -1", rid=9)
    # a frame far over the limit is cut by libzmq (connection dropped, no reply)
    r = raw_reply(g, b"\xc4" + b"x" * 300000, timeout=1)
    check(r is None, "frame over ZMQ_MAXMSGSIZE: connection dropped without reply")

    # a prompt as text needs the tokenizer; this config has none
    with g.client() as c:
        try:
            c.complete("hello", max_tokens=2)
            check(False, "text prompt without a tokenizer is refused")
        except StrataError as e:
            check(e.code == "invalid_param" and "tokenizer" in e.message, "text prompt without a tokenizer: %s" % e)

    # duplicate id while in flight
    with g.client() as c:
        c.send({"type": "generate", "id": 5, "tokens": [9, 9], "max_tokens": 50})
        c.send({"type": "generate", "id": 5, "tokens": [9, 9], "max_tokens": 50})
        seen = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            m = c.recv(5)
            if m is None:
                break
            if m["type"] != "token":
                seen.append(m)
            if m["type"] == "done":
                break
        check(len(seen) == 2 and seen[0]["type"] == "error" and seen[0]["code"] == "duplicate"
              and seen[1]["type"] == "done", "same id twice in flight -> duplicate, first completes (%r)" % seen)

    # context clamp: prompt + max_tokens beyond the context ends with length at the context
    with g.client() as c:
        p = [7] * (MAX_CONTEXT - 3)
        text, toks, d = c.complete(tokens=p, max_tokens=100)
        check(d["finish_reason"] == "length" and len(toks) == 3 and toks == expected(p, 0, 3),
              "max_tokens is clamped to the context (%d tokens, %s)" % (len(toks), d["finish_reason"]))

    # after all that: the same router process serves a normal request exactly
    with g.client() as c:
        text, toks, d = c.complete(tokens=[11, 12], max_tokens=10, seed=3)
        check(toks == expected([11, 12], 3, 10) and d["finish_reason"] == "length"
              and d["usage"] == {"prompt_tokens": 2, "completion_tokens": 10},
              "a good request after the bad ones is served exactly")
    check(g.proc.poll() is None and g.proc.pid == pid, "the router never crashed")


def test_flood(g):
    """Client A floods 10,000 requests; client B's stream is unaffected."""
    N = 10000
    per_client = 8
    a = g.client(timeout=60)
    b = g.client(timeout=60)
    flood_prompt = [21, 22]
    t0 = time.monotonic()
    sent = [0]

    replies = []

    def flood():  # A floods from its own thread while B streams, reading what comes back
        for i in range(N):
            a.send({"type": "generate", "id": i + 1, "tokens": flood_prompt, "max_tokens": 5})
            sent[0] = i + 1
            while a._sock.poll(0):
                replies.append(a.recv(0))

    fa = threading.Thread(target=flood)
    fa.start()
    while sent[0] < 500:
        time.sleep(0.001)
    tb = time.monotonic()
    text, toks, d = b.complete(tokens=[31, 32, 33], max_tokens=40, seed=9)
    b_time = time.monotonic() - tb
    print("flood: client B finished with A %s" % ("still sending (%d sent)" % sent[0] if sent[0] < N else "done sending"))
    fa.join()
    t_sent = time.monotonic() - t0
    check(toks == expected([31, 32, 33], 9, 40) and d["finish_reason"] == "length",
          "client B gets its full exact stream during the flood (%.2fs)" % b_time)
    check(b_time < 10, "client B is not starved (%.2fs for 40 tokens at 5 ms/step)" % b_time)
    # every one of A's requests gets exactly one final answer: done or busy
    final = {}
    busy = done = other = 0
    deadline = time.monotonic() + 60
    while len(final) < N and time.monotonic() < deadline:
        m = replies.pop(0) if replies else a.recv(5)
        if m is None:
            break
        if m["type"] == "token":
            continue
        rid = m.get("id")
        if rid in final:
            other += 1
            continue
        final[rid] = m
        if m["type"] == "done":
            done += 1
            if m["usage"]["completion_tokens"] != 5:
                other += 1
        elif m["type"] == "error" and m["code"] == "busy":
            busy += 1
        else:
            other += 1
    print("flood: sent %d in %.2fs; %d done, %d busy, %d other" % (N, t_sent, done, busy, other))
    check(len(final) == N and other == 0, "each of the %d flood requests got exactly one final reply (%d)" % (N, len(final)))
    check(busy >= N // 2 and done >= per_client, "the flood got busy errors (%d busy, %d served)" % (busy, done))
    live = g.mock.max_live.get(a.identity, 0)
    check(0 < live <= per_client, "the flooding client never had more than %d requests at the scheduler (%d)"
          % (per_client, live))
    with g.client() as c:
        st = c.stats()
        check(st.get("router.busy", 0) >= busy and st.get("scheduler.steps") == 1,
              "stats count the busy refusals and carry the scheduler's counters")
        check(c.health()["status"] == "ok", "router healthy after the flood")
    a.close()
    b.close()


def test_resume(g, strata_bin):
    # plain streaming and stream=false
    with g.client() as c:
        evs = list(c.generate(tokens=[3, 4, 5], max_tokens=12, seed=1))
        toks = [t for e in evs for t in e["tokens"]]
        idx_ok = all(e["index"] == sum(len(x["tokens"]) for x in evs[:k]) for k, e in enumerate(evs))
        check(toks == expected([3, 4, 5], 1, 12) and idx_ok, "streamed tokens exact, indices contiguous")
        d = c.last_done
        check(d["finish_reason"] == "length" and d["timings"]["total_ms"] > 0 and d["timings"]["ttft_ms"] > 0,
              "done has finish_reason, usage and timings (%r)" % d)
        text, toks, d = c.complete(tokens=[3, 4, 5], max_tokens=12, seed=1, stream=False)
        check(toks == expected([3, 4, 5], 1, 12) and "text" in d, "stream=false: one done with all tokens")
        text, toks, d = c.complete(tokens=[EOS_TRIGGER, 4], max_tokens=12)
        check(d["finish_reason"] == "stop" and len(toks) == 4 and toks[-1] == EOS, "eos ends with stop (%r)" % toks)
        m = c.models()
        check(m == [{"name": "mock", "vocab": 300, "max_context": MAX_CONTEXT}], "models: %r" % m)

    # cancel
    with g.client() as c:
        rid = c.next_id()
        got = 0
        for ev in c.generate(tokens=[8, 8], max_tokens=60, id=rid):
            got += len(ev["tokens"])
            if got >= 5 and got - len(ev["tokens"]) < 5:
                c.cancel(rid)
        check(c.last_done["finish_reason"] == "cancel" and got < 60, "cancel -> done(cancel) after %d tokens" % got)

    # client goes away: the router cancels at the scheduler
    c = g.client()
    rid = c.next_id()
    c.send({"type": "generate", "id": rid, "tokens": [44, 45], "max_tokens": 60})
    first = c.recv(5)
    n_cancel = len(g.mock.cancels)
    c.close()
    t0 = time.monotonic()
    while len(g.mock.cancels) == n_cancel and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    check(first is not None and len(g.mock.cancels) > n_cancel,
          "client gone -> canceled at the scheduler in %.2fs" % (time.monotonic() - t0))

    # router kill -9 in the middle of an answer; the client resumes with its identity
    g.mock.tick = 0.02
    with g.client(resume_after=1.0, timeout=30) as c:
        toks, killed = [], False
        t_sent = time.monotonic()
        for ev in c.generate(tokens=[50, 51, 52], max_tokens=60, seed=5):
            if not toks:
                t_first = time.monotonic()
            toks.extend(ev["tokens"])
            if len(toks) >= 10 and not killed:
                killed = True
                t_kill = time.monotonic()
                g.proc.kill()
                g.proc.wait()
                time.sleep(0.3)
                g.start_router()
        t_done = time.monotonic()
        check(killed and toks == expected([50, 51, 52], 5, 60) and c.last_done["finish_reason"] == "length",
              "router kill -9: the client resumed and got every token exactly once (%d)" % len(toks))
        # the done's timings count from the first submission, not from the resume (they used
        # to: total_ms 0.46 for a stream of 370 ms)
        tm = c.last_done["timings"]
        check((t_kill - t_sent) * 1e3 <= tm["total_ms"] <= (t_done - t_sent) * 1e3 + 5
              and 0 < tm["ttft_ms"] <= (t_first - t_sent) * 1e3 + 5 and tm["queue_ms"] <= tm["ttft_ms"]
              and c.last_done["usage"]["prompt_tokens"] == 3,
              "router kill -9: the resumed done counts from the submission (%r; %.0f ms to the kill, %.0f ms in all, "
              "first token at %.0f ms)" % (c.last_done, (t_kill - t_sent) * 1e3, (t_done - t_sent) * 1e3,
                                           (t_first - t_sent) * 1e3))
    # the same with `strata client`: it resumes when its connection comes back
    p = subprocess.Popen([strata_bin, "client", "--endpoint", g.endpoint, "--tokens", "55,56", "--max-tokens", "50",
                          "--ids"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.4)
    g.proc.kill()
    g.proc.wait()
    time.sleep(0.3)
    g.start_router()
    out, err = p.communicate(timeout=60)
    got = [int(x) for x in out.split()]
    check(p.returncode == 0 and got == expected([55, 56], 0, 50),
          "router kill -9: `strata client` resumed, exact stream (rc %d, %d tokens) %s" % (p.returncode, len(got), err))
    # resume after the request finished while the router was down
    with g.client(resume_after=1.0, timeout=30) as c:
        rid = c.next_id()
        c.send({"type": "generate", "id": rid, "tokens": [60, 61], "max_tokens": 20, "seed": 2})
        m = c.recv(5)
        g.proc.kill()
        g.proc.wait()
        time.sleep(20 * 0.02 + 0.3)  # the request finishes meanwhile
        g.start_router()
        c._connect()
        got = m["tokens"] if m and m["type"] == "token" else []
        c.send({"type": "resume", "id": rid, "from": len(got), "text_from": 0})
        while True:
            m = c.recv(5)
            if m is None or m["type"] != "token":
                break
            got.extend(m["tokens"])
        check(m is not None and m["type"] == "done" and got == expected([60, 61], 2, 20),
              "resume of a request that finished during the router's absence delivers the rest")

    # no router at all: both clients give up with `unavailable` after gone_after, not timeout
    dead = "tcp://127.0.0.1:%d" % free_port()
    t0 = time.monotonic()
    try:
        with StrataClient(dead, timeout=60, gone_after=1.0) as c:
            c.complete(tokens=[1], max_tokens=2)
        check(False, "no router: the Python client raises")
    except StrataError as e:
        check(e.code == "unavailable" and time.monotonic() - t0 < 5, "no router: Python client: %s in %.1fs"
              % (e, time.monotonic() - t0))
    t0 = time.monotonic()
    p = subprocess.run([strata_bin, "client", "--endpoint", dead, "--tokens", "1", "--max-tokens", "2", "--gone-after",
                        "1"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 1 and "unavailable" in p.stderr and time.monotonic() - t0 < 5,
          "no router: strata client exits 1 with unavailable (%s)" % p.stderr.strip())
    # scheduler restart: the router resubmits; deterministic tokens, no repeats
    with g.client(timeout=30) as c:
        toks, restarted = [], False
        for ev in c.generate(tokens=[70, 71], max_tokens=50, seed=8):
            toks.extend(ev["tokens"])
            if len(toks) >= 10 and not restarted:
                restarted = True
                g.mock.restart()
        check(restarted and toks == expected([70, 71], 8, 50),
              "scheduler restart: resubmitted, the stream is exact (%d tokens)" % len(toks))

    # lost events between scheduler and router: the router asks to resume from the gap
    g.mock.tick = 0.005
    g.mock.drop_every = 7
    with g.client() as c:
        text, toks, d = c.complete(tokens=[80, 81], max_tokens=40, seed=4)
        check(toks == expected([80, 81], 4, 40) and len(g.mock.resumes) > 0,
              "lost events are recovered through resume (%d resumes)" % len(g.mock.resumes))
    g.mock.drop_every = 0
    g.mock.drop_last = True
    n_res = len(g.mock.resumes)
    with g.client() as c:
        text, toks, d = c.complete(tokens=[82, 83], max_tokens=12, seed=4)
        check(toks == expected([82, 83], 4, 12) and d["usage"]["completion_tokens"] == 12
              and len(g.mock.resumes) > n_res,
              "a done that shows lost tokens is not passed on: the router resumes (%d tokens)" % len(toks))
    g.mock.drop_last = False

    # SIGTERM: in-flight clients get shutting_down, exit 0 within 2 s
    g.mock.tick = 0.02
    with g.client() as c:
        rid = c.next_id()
        c.send({"type": "generate", "id": rid, "tokens": [90], "max_tokens": 60})
        c.recv(5)
        t0 = time.monotonic()
        g.proc.send_signal(signal.SIGTERM)
        rc = g.proc.wait(5)
        dt = time.monotonic() - t0
        last = None
        while True:
            m = c.recv(1)
            if m is None:
                break
            last = m
        check(rc == 0 and dt < 2.0, "SIGTERM: exit 0 in %.2fs" % dt)
        check(last is not None and last["type"] == "error" and last["code"] == "shutting_down",
              "in-flight client told shutting_down (%r)" % last)


def proc_rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def proc_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def test_churn(g, cycles=20000, window=600, first=1000):
    """Connection churn: every cycle is a new DEALER (a new identity: every other one a
    stable one of its own, the rest generated by ZeroMQ) that connects, sends one small
    generate (one token, stream=false, so one reply), reads the reply and closes. `window`
    of them are in flight at a time (raw pyzmq sockets under one poller: a client object
    per cycle, or one at a time, would take minutes). RSS is read at two quiet points, after
    the first `first` cycles and after all of them, each once the router holds no client
    connection (its fd count is back to the start's) and 1.5 s later, the same way both
    times. Before the router trimmed its heap, 600 at a time took it from 7.8 MB at start to
    21-25 MB after 1,000 cycles and 29-33 MB after 20,000 (1.27-1.6x), nearly all of it free
    memory that glibc kept in the arena of ZeroMQ's I/O thread; now 8.5 MB both times. The
    RSS after all cycles is also held to 1.25x of the start's, which the old router missed
    by 3.6-4.6x."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * window + 256  # a socket's connection and its mailbox
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
        soft = min(want, hard)
    window = min(window, (soft - 256) // 2)
    ctx = zmq.Context()
    ctx.setsockopt(zmq.MAX_SOCKETS, window + 64)
    pid = g.proc.pid
    fds0 = proc_fds(pid)

    def quiet_rss():
        t = time.monotonic()
        while proc_fds(pid) > fds0 and time.monotonic() - t < 10:
            time.sleep(0.02)
        time.sleep(1.5)
        return proc_rss_kb(pid), proc_fds(pid)

    poller = zmq.Poller()
    live = {}
    started = finished = bad = 0
    marks = {}
    t0 = time.monotonic()
    rss0 = proc_rss_kb(pid)
    for stop in (first, cycles):
        last = time.monotonic()
        while finished < stop:
            while len(live) < window and started < stop:
                s = ctx.socket(zmq.DEALER)
                s.setsockopt(zmq.LINGER, 0)
                if started % 2 == 0:
                    s.setsockopt(zmq.ROUTING_ID, b"churn-%d-" % started + os.urandom(4))
                s.connect(g.endpoint)
                s.send(pack({"v": 1, "type": "generate", "id": started + 1, "tokens": [5], "max_tokens": 1,
                             "stream": False}))
                poller.register(s, zmq.POLLIN)
                live[s] = started
                started += 1
            ready = poller.poll(1000)
            for s, _ in ready:
                m = msgpack.unpackb(s.recv(), raw=False)
                if m.get("type") != "done" or m.get("id") != live[s] + 1:
                    bad += 1
                poller.unregister(s)
                del live[s]
                s.close(0)
                finished += 1
            if ready:
                last = time.monotonic()
            elif time.monotonic() - last > 20:
                break  # replies stopped coming: reported below
        marks[stop] = quiet_rss()
        print("churn: %d cycles in %.1fs, RSS %d kB, %d fds" % (finished, time.monotonic() - t0, marks[stop][0],
                                                                marks[stop][1]), flush=True)
    for s in live:
        s.close(0)
    ctx.term()
    check(finished == cycles and bad == 0, "churn: %d connect-request-close cycles, each answered by its done "
          "(%d finished, %d bad replies, %d at a time)" % (cycles, finished, bad, window))
    (r1, f1), (r2, f2) = marks[first], marks[cycles]
    check(r2 <= 1.25 * r1, "churn: RSS after %d cycles %d kB is within 1.25x of %d kB after %d (%.2fx; %d kB at start)"
          % (cycles, r2, r1, first, r2 / r1, rss0))
    check(r2 <= 1.25 * rss0, "churn: RSS after %d cycles %d kB is within 1.25x of %d kB at start (%.2fx)"
          % (cycles, r2, rss0, r2 / rss0))
    check(f1 <= fds0 and f2 <= fds0, "churn: no fd left behind (%d at start, %d, %d)" % (fds0, f1, f2))
    with g.client() as c:
        st = c.stats()
        check(c.health()["status"] == "ok", "churn: router healthy after it (%d heap trims)"
              % st.get("router.malloc_trims", 0))


def test_text(g, strata_bin):
    def text_of(c, prompt, **kw):
        evs = list(c.generate(prompt, **kw))
        return "".join(e["text"] for e in evs), [t for e in evs for t in e["tokens"]], c.last_done

    with g.client() as c:
        prompt = "Hello there, naïve café 😀 — ok"
        # the mock echoes the prompt's tokens: the streamed text must be the prompt again
        text, toks, d = text_of(c, prompt, max_tokens=200, seed=ECHO_SEED)
        n = d["usage"]["prompt_tokens"]
        check(n > 0 and text.startswith(prompt), "text prompt tokenized, answer detokenized (%r...)" % text[:40])
        text, toks, d = text_of(c, prompt, max_tokens=n, seed=ECHO_SEED)
        check(text == prompt and len(toks) == n, "exactly the prompt's %d tokens give back the prompt text" % n)
        text2, toks2, d2 = c.complete(prompt, max_tokens=n, seed=ECHO_SEED, stream=False)
        check(text2 == prompt and toks2 == toks and d2["finish_reason"] == "length", "stream=false: same text")

        # stop strings: cut before the match, finish stop, the scheduler told to cancel
        n_cancel = len(g.mock.cancels)
        text, toks, d = text_of(c, "one two. User: three four five six", max_tokens=60, seed=ECHO_SEED,
                                stop=["User:"])
        check(text == "one two. " and d["finish_reason"] == "stop", "stop string cuts the text (%r, %s)"
              % (text, d["finish_reason"]))
        time.sleep(0.1)
        check(len(g.mock.cancels) > n_cancel, "a stop string cancels the request at the scheduler")
        text, toks, d = text_of(c, "abc déf ghi", max_tokens=60, seed=ECHO_SEED, stop=["éf g", "zzz"])
        check(text == "abc d" and d["finish_reason"] == "stop", "stop string with multi-byte text (%r)" % text)
        text, toks, d = text_of(c, "abc déf", max_tokens=60, seed=ECHO_SEED, stop=["xyz"])
        check(d["finish_reason"] == "length" and text.startswith("abc déf"), "no match: full text, length")

        # a text prompt longer than the context
        try:
            c.complete("word " * 200, max_tokens=4)
            check(False, "a text prompt longer than the context is refused")
        except StrataError as e:
            check(e.code == "context_overflow", "text prompt longer than the context: %s" % e)

    # router kill -9 while streaming text: resume with text_from gives the exact text
    g.mock.tick = 0.02
    prompt = "Quick ünïcödé ✓ 😀 fox."
    with g.client(resume_after=1.0, timeout=30) as c:
        ref = c.complete(prompt, max_tokens=45, seed=ECHO_SEED)[0]
        full, killed = [], False
        for ev in c.generate(prompt, max_tokens=45, seed=ECHO_SEED):
            full.append(ev["text"])
            if len("".join(full)) > 10 and not killed:
                killed = True
                g.proc.kill()
                g.proc.wait()
                time.sleep(0.3)
                g.start_router()
        got = "".join(full)
        check(killed and got == ref and ref.startswith(prompt) and c.last_done["finish_reason"] == "length",
              "router kill -9 mid-text: resumed text is exact (%d chars): %r vs %r %r" % (len(got), got, ref, c.last_done))
        # the same, ending by a stop string that matches after the resume: the router finishes
        # it, with the scheduler's timings (from the submission) and prompt size
        full, killed = [], False
        t_sent = time.monotonic()
        for ev in c.generate(prompt, max_tokens=45, seed=ECHO_SEED, stop=["fox"]):
            full.append(ev["text"])
            if len("".join(full)) > 5 and not killed:
                killed = True
                t_kill = time.monotonic()
                g.proc.kill()
                g.proc.wait()
                time.sleep(0.3)
                g.start_router()
        t_done = time.monotonic()
        got, d = "".join(full), c.last_done
        tm = d["timings"]
        check(killed and got == prompt[:prompt.index("fox")] and d["finish_reason"] == "stop"
              and (t_kill - t_sent) * 1e3 <= tm["total_ms"] <= (t_done - t_sent) * 1e3 + 5
              and 0 < tm["ttft_ms"] <= tm["total_ms"] and d["usage"]["prompt_tokens"] > 0,
              "router kill -9, then a stop string: text cut, done counts from the submission (%r, %r; %.0f ms to "
              "the kill, %.0f ms in all)" % (got, d, (t_kill - t_sent) * 1e3, (t_done - t_sent) * 1e3))
    g.mock.tick = 0.005

    # strata client --prompt streams the text to stdout
    p = subprocess.run([strata_bin, "client", "--endpoint", g.endpoint, "--prompt", "Bonjour à tous",
                        "--max-tokens", "64", "--seed", str(ECHO_SEED), "--stop", "tous"],
                       capture_output=True, text=True, timeout=30)
    check(p.returncode == 0 and p.stdout == "Bonjour à \n", "strata client --prompt --stop: %r rc=%d %s"
          % (p.stdout, p.returncode, p.stderr.strip()))
    p = subprocess.run([strata_bin, "client", "--endpoint", g.endpoint, "--prompt", "x", "--max-tokens", "2",
                        "--top-p", "7"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2, "strata client refuses --top-p 7 (rc=%d, %s)" % (p.returncode, p.stderr.strip()))

    test_text_eos_set(g)


def set_mock_eos(g, eos):
    """Give the mock these eos ids and wait until it has said so in a hello (the router asks every
    second); the router reads that reply before any later event of the scheduler socket."""
    n = g.mock.hellos
    g.mock.set_eos(eos)
    t0 = time.monotonic()
    while g.mock.hellos <= n and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    return g.mock.hellos > n


def test_text_eos_set(g):
    """A model with several eos ids (the scheduler's hello carries eos_ids): the answer ends at the
    second one, and the router shows no text for it; with ignore_eos it is text like any token."""
    with g.client() as c:
        prompt = "alpha beta gamma delta epsilon"
        _, toks, d = c.complete(prompt, max_tokens=64, seed=ECHO_SEED)  # the echo: the prompt's tokens
        n = d["usage"]["prompt_tokens"]
        toks = toks[:n]
        k = next((i for i in range(1, n) if toks[i] < 1000 and toks.count(toks[i]) == 1), None)
        check(k is not None, "a prompt token to use as the second eos id (%r)" % toks)
        if k is None:
            return
        other = next(t for t in range(900, 1000) if t not in toks)
        before = c.complete(prompt, max_tokens=k, seed=ECHO_SEED)[0]          # the text of toks[:k]
        with_eos = c.complete(prompt, max_tokens=k + 1, seed=ECHO_SEED)[0]    # ... and of toks[k]
        check(before != with_eos, "token %d has text of its own (%r vs %r)" % (toks[k], before, with_eos))
        check(set_mock_eos(g, [other, toks[k]]), "the mock's hello carries eos_ids [%d, %d]" % (other, toks[k]))
        text, got, d = c.complete(prompt, max_tokens=64, seed=ECHO_SEED)
        check(d["finish_reason"] == "stop" and got == toks[:k + 1] and text == before,
              "ends at the second eos id, which has no text (%s, %r, %r)" % (d["finish_reason"], got, text))
        text, got, d = c.complete(prompt, max_tokens=k + 1, seed=ECHO_SEED, stream=False)
        check(d["finish_reason"] == "stop" and text == before, "stream=false: the same text (%r)" % text)
        text, got, d = c.complete(prompt, max_tokens=k + 1, seed=ECHO_SEED, ignore_eos=True)
        check(d["finish_reason"] == "length" and got == toks[:k + 1] and text == with_eos,
              "ignore_eos: the eos id is text like any token (%r)" % text)
        check(set_mock_eos(g, -1), "the mock back to no eos")


def main():
    if len(sys.argv) < 3 or sys.argv[2] not in ("bad_input", "resume", "text", "churn") or \
            (sys.argv[2] == "text" and len(sys.argv) != 5) or (sys.argv[2] == "resume" and len(sys.argv) != 4):
        print(__doc__)
        return 2
    if sys.argv[2] == "text":
        g = Group(sys.argv[1], tokenizer=os.path.abspath(sys.argv[4]), vocab=1000, eos=-1)
    elif sys.argv[2] == "churn":
        g = Group(sys.argv[1], max_queue=2048)
    else:
        g = Group(sys.argv[1])
    try:
        if sys.argv[2] == "bad_input":
            test_bad_input(g)
            test_flood(g)
        elif sys.argv[2] == "text":
            test_text(g, sys.argv[3])
        elif sys.argv[2] == "churn":
            test_churn(g)
        else:
            test_resume(g, sys.argv[3])
    finally:
        g.close()
    print("%s: %d failed" % (sys.argv[2], FAILS))
    return min(FAILS, 100)


if __name__ == "__main__":
    sys.exit(main())
