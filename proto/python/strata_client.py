"""strata_client - a Python client for the Strata router (protocol: proto/PROTOCOL.md).

Uses Debian's python3-zmq and python3-msgpack only.

    from strata_client import StrataClient
    c = StrataClient("tcp://127.0.0.1:7757")
    for ev in c.generate("Once upon a time", max_tokens=32):
        print(ev["text"], end="", flush=True)
    print(c.last_done)                     # finish_reason, usage, timings

The client has a stable identity (ZMQ_ROUTING_ID). If the router goes silent in the middle
of an answer (it crashed or restarted), generate() reconnects with the same identity and
sends `resume` with what it already has, so the answer continues where it stopped; if the
router cannot resume it, a StrataError with code "not_found" or "unavailable" is raised.
"""

import itertools
import os
import time

import msgpack
import zmq

PROTO_VERSION = 1
DEFAULT_ENDPOINT = "tcp://127.0.0.1:7757"


class StrataError(Exception):
    """An `error` reply: code (e.g. "busy", "invalid_param") and message."""

    def __init__(self, code, message, id=None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.id = id


class StrataTimeout(StrataError):
    def __init__(self, message, id=None):
        super().__init__("timeout", message, id)


def encode(msg):
    """A message dict -> one frame. Adds "v"."""
    m = {"v": PROTO_VERSION}
    m.update(msg)
    return msgpack.packb(m, use_bin_type=True)


def decode(frame):
    """One frame -> a message dict (raises ValueError if it is not a versioned map)."""
    m = msgpack.unpackb(frame, raw=False, strict_map_key=False)
    if not isinstance(m, dict) or m.get("v") != PROTO_VERSION or not isinstance(m.get("type"), str):
        raise ValueError("not a protocol message: %r" % (m,))
    return m


class StrataClient:
    """One connection to a router. Not thread-safe: use one client per thread."""

    def __init__(self, endpoint=DEFAULT_ENDPOINT, identity=None, timeout=60.0, resume_after=5.0,
                 resume_tries=10, context=None):
        self.endpoint = endpoint
        self.identity = identity or ("py-" + os.urandom(8).hex()).encode()
        if self.identity[:1] == b"\0":
            raise ValueError("identity must not start with a zero byte")
        self.timeout = timeout
        self.resume_after = resume_after
        self.resume_tries = resume_tries
        self._ctx = context or zmq.Context.instance()
        self._ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 16)
        self._backlog = {}   # id -> [messages received for a request not being read now]
        self._sock = None
        self.last_done = None
        self._connect()

    # -- connection ------------------------------------------------------------------------

    def _connect(self):
        if self._sock is not None:
            self._sock.close(linger=0)
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, self.identity)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        s.connect(self.endpoint)
        self._sock = s

    def close(self):
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def next_id(self):
        return next(self._ids)

    def send(self, msg):
        """Send one message dict (low level)."""
        self._sock.send(encode(msg))

    def send_raw(self, frame):
        """Send raw bytes as a frame (for tests of bad input)."""
        self._sock.send(frame)

    def recv(self, timeout):
        """Next message from the router, or None after timeout seconds."""
        if self._sock.poll(int(timeout * 1000)) == 0:
            return None
        return decode(self._sock.recv())

    def _recv_for(self, rid, timeout):
        q = self._backlog.get(rid)
        if q:
            return q.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            m = self.recv(left)
            if m is None:
                return None
            if m.get("id") == rid:
                return m
            self._backlog.setdefault(m.get("id"), []).append(m)

    def request(self, msg, timeout=None):
        """Send msg (an "id" is added if missing) and return its single reply.
        Raises StrataError for an error reply, StrataTimeout after timeout."""
        msg = dict(msg)
        msg.setdefault("id", self.next_id())
        self.send(msg)
        m = self._recv_for(msg["id"], self.timeout if timeout is None else timeout)
        if m is None:
            raise StrataTimeout("no reply to %s" % msg.get("type"), msg["id"])
        if m["type"] == "error":
            raise StrataError(m["code"], m["message"], m.get("id"))
        return m

    # -- requests --------------------------------------------------------------------------

    def health(self):
        return self.request({"type": "health"})

    def stats(self):
        return self.request({"type": "stats"})["stats"]

    def models(self):
        return self.request({"type": "models"})["models"]

    def cancel(self, rid):
        """Ask the router to cancel request rid; its stream ends with done(cancel)."""
        self.send({"type": "cancel", "id": rid})

    def generate(self, prompt=None, *, tokens=None, max_tokens=16, temperature=0.0, top_p=1.0, top_k=0,
                 seed=0, stop=None, stream=True, ignore_eos=False, id=None, resume=True, extra=None):
        """Stream one answer. Yields each `token` event (dicts with "index", "tokens",
        "text"); when the answer ends, self.last_done holds the `done` message (with "text"
        and "tokens" too if stream=False, in which case nothing is yielded).
        Raises StrataError on an error reply. `extra` adds raw fields (tests)."""
        rid = self.next_id() if id is None else id
        msg = {"type": "generate", "id": rid, "max_tokens": max_tokens, "temperature": temperature,
               "top_p": top_p, "top_k": top_k, "seed": seed, "stream": stream}
        if ignore_eos:
            msg["ignore_eos"] = True
        if tokens is not None:
            msg["tokens"] = list(tokens)
        else:
            msg["prompt"] = prompt
        if stop:
            msg["stop"] = list(stop)
        if extra:
            msg.update(extra)
        self.last_done = None
        self.send(msg)
        n_tokens, n_text, tries = 0, 0, 0
        deadline = time.monotonic() + self.timeout
        wait = self.resume_after if resume else self.timeout
        while True:
            m = self._recv_for(rid, min(wait, max(0.0, deadline - time.monotonic())))
            if m is None:
                if not resume or tries >= self.resume_tries or time.monotonic() >= deadline:
                    raise StrataTimeout("no answer for request %d" % rid, rid)
                # the router may have restarted: reconnect with the same identity and resume
                tries += 1
                self._connect()
                r = {"type": "resume", "id": rid, "from": n_tokens, "text_from": n_text, "stream": stream}
                if stop:
                    r["stop"] = list(stop)
                self.send(r)
                continue
            t = m["type"]
            if t == "token":
                n_tokens = m["index"] + len(m["tokens"])
                n_text += len(m["text"].encode())
                yield m
            elif t == "done":
                self.last_done = m
                return
            elif t == "error":
                raise StrataError(m["code"], m["message"], m.get("id"))

    def complete(self, prompt=None, **kw):
        """Run generate() to the end; returns (text, tokens, done)."""
        text, toks = [], []
        for ev in self.generate(prompt, **kw):
            text.append(ev["text"])
            toks.extend(ev["tokens"])
        d = self.last_done
        if kw.get("stream", True) is False:
            return d.get("text", ""), d.get("tokens", []), d
        return "".join(text), toks, d
