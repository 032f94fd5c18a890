#!/usr/bin/python3
"""http_overhead.py - what strata-http (the OpenAI API, services/http) adds to the ZeroMQ path:
per streamed token and to the time to first token, at 1 and 64 concurrent streams.

It starts a real group on the CPU backend (`strata up` of a config written here: the model of
--model, default the demo model that `strata demo` writes; an [http] section on loopback) and
sends the same greedy request (--prompt, --max-tokens tokens, ignore_eos) two ways: as
POST /v1/completions with "stream": true (server-sent events over HTTP/1.1, raw sockets), and as
a `generate` straight to the router (proto/PROTOCOL.md). Each path's streams are driven by client
processes of their own (--client-procs a path at most, the streams split among them), as separate
clients would be: one client reading both paths would stamp whichever arrived second late by its
own time spent on the first. A client drives its streams with one poll loop: each arrival is
stamped with the time the poll returned (CLOCK_MONOTONIC, the same clock in every process) and
kept raw; SSE, chunked encoding and msgpack are parsed here after the run, so that both paths cost
a client the same little per arrival. The clients are bench/stream_client (C, about a microsecond
an arrival; --client c, the default) or this script's own loop (--client python: pyzmq, tens of
microseconds an arrival, which land in the figures of whichever stream it reads second).

Two figures, each measured the way that isolates it:

  per-token added  twin runs: C streams over HTTP and C over ZeroMQ, all in the scheduler's
                   batch, so token j of an HTTP stream and token j of its ZeroMQ twin (same
                   prompt, greedy: the same text) come out of the same decode step. The requests
                   are sent one at a time, --pace-us apart, twin after twin (which path goes
                   first alternates), so the scheduler admits them in that order and a step's
                   tokens leave the router with twins side by side. The added latency of a token
                   is its HTTP arrival minus its twin's arrival. A twin admitted one step earlier
                   or later (a step boundary may fall between them) is matched at that offset:
                   the offset k in [-3, 3] whose median difference is smallest; the offsets are
                   reported. Tokens after the first.
  TTFT added       HTTP-only and ZeroMQ-only runs of C streams each, alternated round by round:
                   the p50 (p99) of HTTP's TTFT minus the p50 (p99) of ZeroMQ's. TTFT is from
                   sending the request (the TCP connection is opened before) to the first event
                   with text.

The inter-token time (time per streamed token) of both paths in the twin runs is reported too.
Targets (bench/README.md): HTTP adds < 50 us p50 per streamed token and < 1 ms p50 to TTFT.
The clients' own time per arrival is part of both paths' figures, and on a small machine they
compete with the group for the cores (the machine is in the JSON).

usage: http_overhead.py --build BUILD_DIR [--model DIR] [--concurrency 1,64] [--rounds N]
                        [--ttft-samples N] [--max-tokens N] [--prompt TEXT] [--threads N] [--http-threads N]
                        [--client-procs N] [--pace-us US] [--client c|python]
                        [--json FILE]
"""
import argparse
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "proto", "python"))
import strata_client  # noqa: E402  (encode / decode of the ZeroMQ protocol)
import msgpack  # noqa: E402
import zmq  # noqa: E402

TARGETS = {"per_token_added_p50_us": 50.0, "ttft_added_p50_ms": 1.0}


def pct(v, p):
    v = sorted(v)
    if not v:
        return None
    k = (len(v) - 1) * p / 100.0
    i = int(k)
    return v[i] if i + 1 >= len(v) else v[i] + (v[i + 1] - v[i]) * (k - i)


def dist(v, scale):
    """p50 / p99 / n of v, times scale."""
    p50, p99 = pct(v, 50), pct(v, 99)
    return {"p50": None if p50 is None else round(p50 * scale, 3), "p99": None if p99 is None else round(p99 * scale, 3),
            "n": len(v)}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def machine():
    """The machine in words and fields: CPU model, CPUs, RAM, kernel, Python."""
    cpu, mem = platform.processor() or "?", 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    n = os.cpu_count() or 0
    desc = "%s, %d CPUs, %.1f GiB RAM, %s %s" % (cpu, n, mem / 2**30, platform.system(), platform.release())
    return {"desc": desc, "cpu": cpu, "cpus": n, "usable_cpus": len(os.sched_getaffinity(0)), "ram_bytes": mem,
            "hostname": socket.gethostname(), "kernel": platform.release(), "python": platform.python_version()}


class Group:
    """A group of the model with strata-http, under a temporary run dir and registry."""

    def __init__(self, a, max_seqs):
        self.strata = os.path.join(a.build, "services", "strata", "strata")
        self.work = tempfile.mkdtemp(prefix="strata-httpbench-")
        self.env = dict(os.environ, STRATA_REGISTRY=os.path.join(self.work, "registry"))
        os.makedirs(self.env["STRATA_REGISTRY"], mode=0o700)
        self.model = a.model
        if not self.model:
            out = subprocess.run([self.strata, "demo", "--out", os.path.join(self.work, "demo")], capture_output=True,
                                 text=True, timeout=300, env=self.env)
            if out.returncode:
                raise RuntimeError("strata demo: %s" % out.stderr.strip())
            self.model = out.stdout.strip().splitlines()[-1]
        self.port, self.http_port = free_port(), free_port()
        self.config = os.path.join(self.work, "strata.ini")
        run_dir = os.path.join(self.work, "run")
        with open(self.config, "w") as f:
            f.write("[group]\nname = httpbench%d\nrun_dir = %s\nmodel = %s\n\n" % (os.getpid(), run_dir, self.model))
            f.write("[router]\nendpoint = tcp://127.0.0.1:%d\ncpus =\n\n" % self.port)
            f.write("[scheduler]\nmax_batch_tokens = %d\nmax_seqs = %d\nkv_blocks = %d\nblock_size = 16\n\n" %
                    (max(256, 16 * max_seqs), max_seqs, max(1024, max_seqs * (a.max_tokens + 64) // 16 + 64)))
            f.write("[executor]\nbackend = cpu\nthreads = %d\n\n[prefetcher.0]\nnuma_node = -1\n\n" % a.threads)
            f.write("[http]\nhost = 127.0.0.1\nport = %d\ncpus =\nthreads = %d\n" % (self.http_port, a.http_threads))
        self.up = False

    def start(self):
        out = subprocess.run([self.strata, "up", "--config", self.config], capture_output=True, text=True, timeout=300,
                             env=self.env)
        if out.returncode:
            raise RuntimeError("strata up: %s" % out.stderr.strip())
        self.up = True
        t0 = time.time()
        while time.time() - t0 < 60:
            try:
                s = socket.create_connection(("127.0.0.1", self.http_port), timeout=2)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                r = s.recv(64)
                s.close()
                if r.startswith(b"HTTP/1.1 200"):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("strata-http does not serve /health within 60 s")

    def close(self):
        if self.up:
            subprocess.run([self.strata, "down", "--config", self.config], capture_output=True, timeout=120, env=self.env)
        shutil.rmtree(self.work, ignore_errors=True)


class HttpStream:
    def __init__(self, g, body):
        self.sock = socket.create_connection(("127.0.0.1", g.http_port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        b = json.dumps(body).encode()
        self.req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(b)) + b
        self.raw, self.tail, self.done, self.t0 = [], b"", False, None

    def send(self):
        self.t0 = time.perf_counter()
        self.sock.setblocking(True)
        self.sock.sendall(self.req)
        self.sock.setblocking(False)

    @classmethod
    def done_with(cls, t0, raw):
        """A finished stream as a client process sent it back: its start and raw arrivals."""
        h = cls.__new__(cls)
        h.t0, h.raw, h.done = t0, raw, True
        return h

    def on_readable(self, t):
        try:
            d = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        if not d:
            self.done = True
            return
        self.raw.append((t, d))
        self.tail = (self.tail + d)[-7:]
        if self.tail == b"\r\n0\r\n\r\n":  # the last chunk of the chunked body
            self.done = True

    def arrivals(self):
        """[(time, text bytes so far)] of the events with text, and the whole text."""
        buf, body, events, state, need = b"", b"", [], "head", 0
        out, cum, text = [], 0, b""
        for t, d in self.raw:
            buf += d
            while True:
                if state == "head":
                    i = buf.find(b"\r\n\r\n")
                    if i < 0:
                        break
                    head = buf[:i]
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError("HTTP: %r" % (head + buf[i:i + 300]))
                    buf, state = buf[i + 4:], "size"
                elif state == "size":
                    i = buf.find(b"\r\n")
                    if i < 0:
                        break
                    need = int(buf[:i].split(b";")[0], 16)
                    buf, state = buf[i + 2:], "data" if need else "end"
                elif state == "data":
                    if len(buf) < need + 2:
                        break
                    body += buf[:need]
                    buf, state = buf[need + 2:], "size"
                    while b"\n\n" in body:
                        ev, body = body.split(b"\n\n", 1)
                        events.append((t, ev))
                else:
                    break
        for t, ev in events:
            for line in ev.split(b"\n"):
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                ch = json.loads(line[6:])
                if "error" in ch:
                    raise RuntimeError("HTTP error event: %s" % ch["error"])
                s = "".join(c.get("text") or "" for c in ch.get("choices", [])).encode()
                if s:
                    cum += len(s)
                    text += s
                    out.append((t, cum))
        return out, text


class ZmqStream:
    def __init__(self, sock, rid, msg):
        self.sock, self.rid, self.msg = sock, rid, msg
        self.frames, self.done, self.t0 = [], False, None

    @classmethod
    def done_with(cls, t0, frames):
        """A finished stream as a client process sent it back: its start and raw frames."""
        z = cls.__new__(cls)
        z.t0, z.frames, z.done = t0, frames, True
        return z

    def send(self):
        f = strata_client.encode(self.msg)
        self.t0 = time.perf_counter()
        self.sock.send(f)

    def arrivals(self):
        out, cum, text = [], 0, b""
        for t, f in self.frames:
            m = strata_client.decode(f)
            if m["type"] == "error":
                raise RuntimeError("router error: %s %s" % (m.get("code"), m.get("message")))
            if m["type"] == "token" and m.get("text"):
                s = m["text"].encode()
                cum += len(s)
                text += s
                out.append((t, cum))
        return out, text


def http_body(a):
    """The POST /v1/completions body of every HTTP stream."""
    return {"prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}


def client(g, kind, n, a, barrier, out, timeout, at=None):
    """One client process: n streams of one kind ("http" or "zmq"), sent when every client is
    ready (barrier), or each at its time of at (perf_counter seconds), read to their end; their
    raw arrivals go back through out."""
    body = http_body(a)
    poller = zmq.Poller()  # zmq_poll over the HTTP sockets' descriptors, or the DEALER
    dealer, by_fd, zs = None, {}, {}
    if kind == "http":
        streams = [HttpStream(g, body) for _ in range(n)]
        for h in streams:
            poller.register(h.sock.fileno(), zmq.POLLIN)
            by_fd[h.sock.fileno()] = h
    else:
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.RCVHWM, 1000000)
        dealer.connect("tcp://127.0.0.1:%d" % g.port)
        base = int.from_bytes(os.urandom(3), "little") << 20
        for i in range(n):
            msg = {"type": "generate", "id": base + i, "prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0.0,
                   "ignore_eos": True, "stream": True}
            zs[base + i] = ZmqStream(dealer, base + i, msg)
        streams = list(zs.values())
        poller.register(dealer, zmq.POLLIN)
    time.sleep(0.05)  # connections up
    barrier.wait()
    for i, st in enumerate(streams):
        if at:
            while time.perf_counter() < at[i]:
                time.sleep(max(0.0, min(0.001, at[i] - time.perf_counter() - 0.0002)))
        st.send()
    left = n
    deadline = time.perf_counter() + timeout
    while left:
        ready = poller.poll(100)
        t = time.perf_counter()
        if t > deadline:
            raise RuntimeError("streams not done within %d s" % timeout)
        for sock, _ in ready:
            if sock is dealer:
                while True:
                    try:
                        f = dealer.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    m = msgpack.unpackb(f)  # the id and the type only; checked after the run
                    z = zs.get(m.get("id")) if isinstance(m, dict) else None
                    if z is None:
                        continue
                    z.frames.append((t, f))
                    if m.get("type") in ("done", "error") and not z.done:
                        z.done = True
                        left -= 1
                continue
            h = by_fd.get(sock)
            if h is None or h.done:
                continue
            h.on_readable(t)
            if h.done:
                poller.unregister(sock)
                left -= 1
    out.send([(st.t0, st.raw if kind == "http" else st.frames) for st in streams])
    for st in streams:
        if kind == "http":
            st.sock.close()
    if dealer is not None:
        dealer.close()


def c_client_bin(a):
    """bench/stream_client of the build, or on PATH."""
    p = os.path.join(a.build, "bench", "stream_client")
    return p if os.access(p, os.X_OK) else shutil.which("stream_client")


def c_client_parse(out):
    """stream_client's stdout: [(send time, [(time, bytes), ...]), ...] in stream order."""
    res, i, cur = [], 0, None
    while i < len(out):
        j = out.index(b"\n", i)
        line = out[i:j].split()
        i = j + 1
        if line[0] == b"S":
            cur = (float(line[1]), [])
            res.append(cur)
        elif line[0] == b"A":
            n = int(line[2])
            cur[1].append((float(line[1]), out[i:i + n]))
            i += n
        elif line[0] != b"E":
            raise RuntimeError("stream_client: unexpected output %r" % out[i - 40:i])
    return res


def run_c(g, jobs, a, timeout):
    """The jobs [(kind, n, at)] as stream_client processes, started together (at: their send
    times, else all at a start time 1 s ahead): ([HTTP], [ZeroMQ]) streams."""
    exe = c_client_bin(a)
    if not exe:
        raise RuntimeError("no stream_client under %s/bench or on PATH (build it, or --client python)" % a.build)
    start = time.perf_counter() + 1.0
    body = json.dumps(http_body(a))
    procs = []
    for kind, n, at in jobs:
        spec = {"kind": kind, "port": g.http_port if kind == "http" else g.port, "n": n, "start": start, "at": at,
                "timeout": timeout, "body": body, "prompt": a.prompt, "max_tokens": a.max_tokens,
                "id_base": int.from_bytes(os.urandom(3), "little") << 20}
        p = subprocess.Popen([exe], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        p.stdin.write(json.dumps(spec).encode())
        p.stdin.close()
        procs.append((kind, p))
    hs, zl = [], []
    for kind, p in procs:
        out = p.stdout.read()
        if p.wait() != 0:
            raise RuntimeError("a %s stream_client failed (exit %d; its error is above)" % (kind, p.returncode))
        for t0, raw in c_client_parse(out):
            (hs if kind == "http" else zl).append(HttpStream.done_with(t0, raw) if kind == "http" else ZmqStream.done_with(t0, raw))
    return hs, zl


def run(g, n_http, n_zmq, a, paced=False, timeout=600):
    """Start n_http HTTP and n_zmq ZeroMQ streams, each path from its own client processes
    (--client-procs of them a path at most), all to their end: ([HTTP], [ZeroMQ]) streams with
    their arrivals. At once, or paced (twins, n_http == n_zmq): the requests one at a time
    --pace-us apart, each pair of twins together (which goes first alternates), so that the
    scheduler admits them in that order and twins leave the router side by side in every step
    (sent at once, the HTTP requests, which take longer to reach the router, would be admitted
    after all the ZeroMQ ones, and each step's HTTP tokens would leave the router last)."""
    mp = multiprocessing.get_context("fork")
    jobs = []
    t0 = time.perf_counter() + 1.0  # the clients are up by then
    for kind, n in (("http", n_http), ("zmq", n_zmq)):
        k = min(a.client_procs, n)
        first = 0
        for i in range(k):
            m = n // k + (i < n % k)
            at = None
            if paced:  # pair j: slots 2j and 2j + 1, HTTP first in even pairs
                at = [t0 + a.pace_us * 1e-6 * (2 * j + ((kind == "http") == (j % 2 == 1))) for j in range(first, first + m)]
            jobs.append((kind, m, at))
            first += m
    if a.client == "c":
        return run_c(g, jobs, a, timeout)
    barrier = mp.Barrier(len(jobs))
    procs = []
    for kind, n, at in jobs:
        rx, tx = mp.Pipe(duplex=False)
        p = mp.Process(target=client, args=(g, kind, n, a, barrier, tx, timeout, at))
        p.start()
        tx.close()
        procs.append((kind, p, rx))
    hs, zl = [], []
    for kind, p, rx in procs:
        try:
            res = rx.recv()
        except EOFError:
            raise RuntimeError("a %s client process failed (its error is above)" % kind)
        for t0, raw in res:
            (hs if kind == "http" else zl).append(HttpStream.done_with(t0, raw) if kind == "http" else ZmqStream.done_with(t0, raw))
        p.join()
    return hs, zl


def twin_added(h, z):
    """Per-token added latency (s) of HTTP stream h over its twin z, and the step offset used."""
    ha, ht = h.arrivals()
    za, zt = z.arrivals()
    zm = dict((c, t) for t, c in za)
    common = [(t, c) for t, c in ha if c in zm]
    th = [t for t, _ in common]
    tz_all = [t for t, _ in za]
    idx = {c: i for i, (_, c) in enumerate(za)}
    zi = [idx[c] for _, c in common]
    best = None
    for k in range(-3, 4):
        d = [th[j] - tz_all[zi[j] + k] for j in range(1, len(th)) if 0 <= zi[j] + k < len(tz_all)]
        if len(d) < max(1, (len(th) - 1) // 2):
            continue
        m = abs(statistics.median(d))
        if best is None or m < best[0]:
            best = (m, k, d)
    same = ht[:len(zt)] == zt[:len(ht)]
    return (best[2] if best else []), (best[1] if best else None), same


def gaps(arr):
    return [arr[i][0] - arr[i - 1][0] for i in range(1, len(arr))]


def measure(g, c, a):
    """The figures at concurrency c."""
    added, offsets, tpot_h, tpot_z, ttft_h, ttft_z, differ = [], {}, [], [], [], [], 0
    for r in range(a.rounds):
        hs, zl = run(g, c, c, a, paced=True)
        for h, z in zip(hs, zl):
            d, k, same = twin_added(h, z)
            added += d
            offsets[str(k)] = offsets.get(str(k), 0) + 1
            differ += not same
            tpot_h += gaps(h.arrivals()[0])
            tpot_z += gaps(z.arrivals()[0])
    # TTFT: enough one-path runs that each path has --ttft-samples first tokens (at one stream, the
    # rounds alone would give a median of 3)
    for r in range(max(a.rounds, -(-a.ttft_samples // c))):
        order = (("http", c, 0), ("zmq", 0, c)) if r % 2 == 0 else (("zmq", 0, c), ("http", c, 0))
        for name, nh, nz in order:
            hs, zl = run(g, nh, nz, a)
            for s in hs + zl:
                arr = s.arrivals()[0]
                if arr:
                    (ttft_h if name == "http" else ttft_z).append(arr[0][0] - s.t0)
    row = {"concurrency": c, "rounds": a.rounds, "streams_per_path": c * a.rounds, "ttft_samples": len(ttft_h),
           "per_token_added_us": dist(added, 1e6), "step_offsets": offsets, "twins_with_different_text": differ,
           "tpot_ms": {"http": dist(tpot_h, 1e3), "zmq": dist(tpot_z, 1e3)},
           "ttft_ms": {"http": dist(ttft_h, 1e3), "zmq": dist(ttft_z, 1e3)}}
    th, tz = row["ttft_ms"]["http"], row["ttft_ms"]["zmq"]
    row["ttft_added_ms"] = {q: (None if th[q] is None or tz[q] is None else round(th[q] - tz[q], 3)) for q in ("p50", "p99")}
    p = row["per_token_added_us"]["p50"]
    row["meets_targets"] = {
        "per_token_added_p50_us": p is not None and p < TARGETS["per_token_added_p50_us"],
        "ttft_added_p50_ms": row["ttft_added_ms"]["p50"] is not None and row["ttft_added_ms"]["p50"] < TARGETS["ttft_added_p50_ms"]}
    return row


def table(rows):
    def f(x):
        return "-" if x is None else "%.3f" % x
    lines = ["| streams | per-token added p50 / p99 (us) | TTFT added p50 / p99 (ms) | TTFT http / zmq p50 (ms) | "
             "time per token http / zmq p50 (ms) | step offsets | targets met |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        pt, ta = r["per_token_added_us"], r["ttft_added_ms"]
        lines.append("| %d | %s / %s | %s / %s | %s / %s | %s / %s | %s | %s |" % (
            r["concurrency"], f(pt["p50"]), f(pt["p99"]), f(ta["p50"]), f(ta["p99"]), f(r["ttft_ms"]["http"]["p50"]),
            f(r["ttft_ms"]["zmq"]["p50"]), f(r["tpot_ms"]["http"]["p50"]), f(r["tpot_ms"]["zmq"]["p50"]),
            " ".join("%s:%d" % kv for kv in sorted(r["step_offsets"].items())),
            "yes" if all(r["meets_targets"].values()) else "no"))
    return "\n".join(lines)


def commit():
    if os.environ.get("STRATA_COMMIT"):
        return os.environ["STRATA_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", HERE, "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description="what strata-http adds to the ZeroMQ path, per streamed token and to TTFT")
    ap.add_argument("--build", required=True, help="the meson build dir (its services/*/strata-* binaries)")
    ap.add_argument("--model", help="model folder (HF or packed); default: the demo model, written by `strata demo`")
    ap.add_argument("--concurrency", default="1,64", help="concurrent streams per path, comma-separated (default 1,64)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per concurrency and kind (default 3)")
    ap.add_argument("--ttft-samples", type=int, default=24,
                    help="first tokens per path for the TTFT figures at each concurrency, at least (default 24: "
                         "more one-path runs than --rounds where the streams are few)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens per stream (default 64)")
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--threads", type=int, default=0, help="[executor] threads (default 0: all CPUs)")
    ap.add_argument("--http-threads", type=int, default=0,
                    help="[http] threads, strata-http's workers (default 0: the service's default, half the cpus up to 8)")
    ap.add_argument("--pace-us", type=float, default=500.0,
                    help="twin runs: microseconds between one request and the next (default 500)")
    ap.add_argument("--client-procs", type=int, default=4,
                    help="client processes a path at most, the streams split among them (default 4)")
    ap.add_argument("--client", choices=("c", "python"), default="c",
                    help="the client processes: c (bench/stream_client, about a microsecond an arrival; default) "
                         "or python (this script's own loop, tens of microseconds an arrival)")
    ap.add_argument("--json", default="http_overhead.json", help="where to write the JSON (default http_overhead.json)")
    a = ap.parse_args()
    cs = [int(x) for x in a.concurrency.split(",") if x]
    if not cs or min(cs) < 1 or a.rounds < 1 or a.max_tokens < 2 or a.client_procs < 1 or a.pace_us < 0 or a.ttft_samples < 1:
        ap.error("--concurrency, --rounds, --ttft-samples, --client-procs and --max-tokens must be positive (--max-tokens >= 2)")
    g = Group(a, max_seqs=max(64, 2 * max(cs)))
    try:
        g.start()
        run(g, 1, 1, argparse.Namespace(prompt=a.prompt, max_tokens=4, client_procs=1, client=a.client,
                                        build=a.build))  # warm up both paths
        rows = []
        for c in cs:
            rows.append(measure(g, c, a))
            print("  %d streams: per-token added p50 %s us, TTFT added p50 %s ms" %
                  (c, rows[-1]["per_token_added_us"]["p50"], rows[-1]["ttft_added_ms"]["p50"]), file=sys.stderr)
    finally:
        g.close()
    doc = {"bench": "http_overhead", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit(),
           "command": " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]), "machine": machine(),
           "model": a.model or "demo", "backend": "cpu", "executor_threads": a.threads,
           "http_threads": a.http_threads, "client_procs": a.client_procs, "pace_us": a.pace_us,
           "client": a.client,
           "request": {"prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True},
           "targets": TARGETS, "results": rows,
           "meets_targets": all(all(r["meets_targets"].values()) for r in rows)}
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(table(rows))
    print("machine: %s; JSON: %s" % (doc["machine"]["desc"], a.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
