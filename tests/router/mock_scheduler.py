"""A stand-in for strata-scheduler that speaks the router<->scheduler protocol
(proto/PROTOCOL.md) with deterministic fake generation, so the router can be tested alone.

Token i of a request is a pure function of (prompt, seed, i), like the real group's
deterministic sampling; a prompt starting with token EOS_TRIGGER ends with eos after 3
tokens (the last id of the eos set); with seed ECHO_SEED the answer repeats the prompt's tokens
(text tests), and ends at any id of the eos set it echoes. `eos` is one id (-1: none) or a list
of them (set_eos changes it; the hello then carries eos_ids, as an executor's does for a model
with several). One token
per live request every `tick` seconds. Finished requests are kept for resume, and a cancel
of one answers its done again. A done's timings count from the submission, as the real
scheduler's do. Knobs for tests: drop_every (drop every n-th tokens event: the router must
notice the gap), drop_last (drop each request's last tokens event: only its done shows the
gap), restart() (new instance, all state lost), paused.
"""
import os
import threading
import time

import msgpack
import zmq

VOCAB = 300
MAX_CONTEXT = 64
EOS = 2
EOS_TRIGGER = 1
ECHO_SEED = 4242


def token_at(prompt, seed, i, vocab=VOCAB):
    if seed == ECHO_SEED:
        return prompt[i % len(prompt)]
    return (sum(prompt) * 31 + seed * 7 + i * 17) % (vocab - 10) + 5


class MockScheduler(threading.Thread):
    def __init__(self, endpoint, tick=0.005, vocab=VOCAB, eos=EOS):
        super().__init__(daemon=True)
        self.vocab = vocab
        self.set_eos(eos)
        self.hellos = 0         # hello replies sent
        self.endpoint = endpoint
        self.tick = tick
        self.instance = int.from_bytes(os.urandom(7), "little") + 1
        self.reqs = {}          # id -> dict, finished ones included (kept for resume)
        self.live = {}          # id -> dict, the unfinished ones only (what a tick walks)
        self.cancels = []       # ids canceled (for assertions)
        self.submits = 0
        self.max_live = {}      # client routing id -> most requests live at once
        self.resumes = []
        self.drop_every = 0
        self.drop_last = False  # drop each request's last tokens event: its done shows the gap
        self._events = 0
        self.paused = False
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self._restart = False
        self.ready = threading.Event()

    def set_eos(self, eos):
        """The model's eos ids: one id (-1: none) or a list; the next hello reply carries them."""
        self.eos_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if e >= 0]
        self.eos = self.eos_ids[-1] if self.eos_ids else -1

    def stop(self):
        self._halt.set()
        self.join(5)

    def restart(self):
        """Act as a freshly started scheduler: new instance, no requests."""
        with self._lock:
            self._restart = True

    def _send(self, sock, msg):
        m = {"v": 1}
        m.update(msg)
        try:
            sock.send_multipart([b"router", msgpack.packb(m, use_bin_type=True)], flags=zmq.DONTWAIT)
        except zmq.ZMQError:
            pass  # no router connected: drop, as the real scheduler does

    def _tokens(self, sock, rid, index, toks):
        self._events += 1
        if self.drop_every and self._events % self.drop_every == 0:
            return
        self._send(sock, {"type": "tokens", "id": rid, "index": index, "tokens": toks})

    def _done(self, sock, rid, r):
        # timings from the request's submission here, as the real scheduler counts them
        t0 = r["t_submit"]
        ms = lambda t: max(0.0, (t - t0) * 1e3) if t else 0.0  # noqa: E731
        self._send(sock, {"type": "done", "id": rid, "finish_reason": r["finish"],
                          "usage": {"prompt_tokens": len(r["prompt"]), "completion_tokens": len(r["gen"])},
                          "timings": {"queue_ms": ms(r["t_first"]), "ttft_ms": ms(r["t_first"]),
                                      "total_ms": ms(r["t_done"])}})

    def run(self):
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.LINGER, 0)
        # as the real scheduler: a burst of events must not hit the default HWM of 1000 (the
        # send would fail with EAGAIN and the event would be dropped)
        sock.setsockopt(zmq.SNDHWM, 100000)
        sock.setsockopt(zmq.RCVHWM, 100000)
        sock.bind(self.endpoint)
        self.ready.set()
        next_tick = time.monotonic()
        while not self._halt.is_set():
            with self._lock:
                if self._restart:
                    self._restart = False
                    self.instance += 1
                    self.reqs.clear()
                    self.live.clear()
            if sock.poll(2):
                frames = sock.recv_multipart()
                self._handle(sock, frames[-1])
                continue
            now = time.monotonic()
            if now < next_tick or self.paused:
                continue
            next_tick = now + self.tick
            for rid, r in list(self.live.items()):
                i = len(r["gen"])
                if r["prompt"][0] == EOS_TRIGGER and i == 3 and r["seed"] != ECHO_SEED:
                    t = self.eos
                else:
                    t = token_at(r["prompt"], r["seed"], i, self.vocab)
                r["gen"].append(t)
                if r["t_first"] is None:
                    r["t_first"] = time.monotonic()
                if t in self.eos_ids and not r["ignore_eos"]:
                    r["finish"] = "stop"
                elif len(r["gen"]) >= r["max_tokens"]:
                    r["finish"] = "length"
                if not (r["finish"] and self.drop_last):
                    self._tokens(sock, rid, i, [t])
                if r["finish"]:
                    r["t_done"] = time.monotonic()
                    del self.live[rid]
                    self._done(sock, rid, r)
        sock.close(0)

    def _handle(self, sock, frame):
        m = msgpack.unpackb(frame, raw=False)
        t, rid = m["type"], m.get("id")
        if t == "hello":
            h = {"type": "hello", "instance": self.instance, "pid": os.getpid(), "model": "mock", "vocab": self.vocab,
                 "max_context": MAX_CONTEXT, "bos_id": -1, "eos_id": self.eos_ids[0] if self.eos_ids else -1,
                 "kv_blocks": 0, "block_size": 16, "load_ms": 0.0}
            if len(self.eos_ids) > 1:
                h["eos_ids"] = list(self.eos_ids)
            self._send(sock, h)
            self.hellos += 1
        elif t == "submit":
            self.submits += 1
            if rid in self.reqs and not self.reqs[rid]["finish"]:
                self._send(sock, {"type": "error", "id": rid, "code": "duplicate", "message": "live"})
                return
            self.reqs[rid] = {"prompt": m["prompt"], "seed": m.get("seed", 0), "max_tokens": m["max_tokens"], "gen": [],
                              "finish": None, "cid": m["cid"], "client": m["client"],
                              "ignore_eos": m.get("ignore_eos", False), "t_submit": time.monotonic(),
                              "t_first": None, "t_done": None}
            self.live[rid] = self.reqs[rid]
            live = sum(1 for r in self.live.values() if r["client"] == m["client"])
            self.max_live[m["client"]] = max(self.max_live.get(m["client"], 0), live)
        elif t == "cancel":
            self.cancels.append(rid)
            r = self.reqs.get(rid)
            if r is None:
                self._send(sock, {"type": "error", "id": rid, "code": "not_found", "message": "unknown request"})
            else:
                # a finished request's done again, as the real scheduler answers
                if not r["finish"]:
                    r["finish"], r["t_done"] = "cancel", time.monotonic()
                    del self.live[rid]
                self._done(sock, rid, r)
        elif t == "resume":
            self.resumes.append((rid, m["from"]))
            r = self.reqs.get(rid)
            if r is None:
                self._send(sock, {"type": "error", "id": rid, "code": "not_found", "message": "unknown request"})
                return
            self._send(sock, {"type": "tokens", "id": rid, "index": m["from"], "tokens": r["gen"][m["from"]:]})
            if r["finish"]:
                self._done(sock, rid, r)
        elif t == "stats":
            self._send(sock, {"type": "stats", "id": rid, "stats": {"requests": len(self.reqs), "steps": 1}})
