"""strata_client - a Python client for the Strata router (protocol: proto/PROTOCOL.md).

Uses Debian's python3-zmq and python3-msgpack only.

    from strata_client import StrataClient
    c = StrataClient("tcp://127.0.0.1:7757")
    for ev in c.generate("Once upon a time", max_tokens=32):
        print(ev["text"], end="", flush=True)
    print(c.last_done)                     # finish_reason, usage, timings

The client has a stable identity (ZMQ_ROUTING_ID) and watches its connection (a ZeroMQ
socket monitor). If the router goes away in the middle of an answer (it crashed and the
launcher restarted it), generate() sends `resume` with what it already has as soon as the
connection is back, so the answer continues where it stopped; if the router cannot resume
it, a StrataError with code "not_found" is raised. If no router accepts the connection for
`gone_after` seconds (the group was stopped), any call raises StrataError "unavailable"
instead of waiting for its timeout.

A router with ZeroMQ CURVE ([router] curve_secret_key_file) needs its public key, and one with
[router] curve_clients_file a client keypair whose public key it lists; both are files as
`strata keygen PREFIX` writes them (PREFIX.key public, PREFIX.secret secret, Z85):

    c = StrataClient("tcp://host:7757", curve_server_key="router.key", curve_client_key="me.secret")

A client whose key the router refuses gets no connection: its calls end with "unavailable" or
a timeout.

Log-probabilities (PROTOCOL.md "Log-probabilities"): generate(..., logprobs=True, top_logprobs=k)
adds to each `token` event (and to the `done` of stream=False) "logprobs" (one per token, the
model's own distribution before temperature, top-k and top-p), "top_n", "top_tokens" and
"top_logprobs" (k per token, most likely first) and "token_text" / "top_text" (each token
decoded on its own). A request without them gets none of these keys.
"""

import itertools
import os
import time

import msgpack
import zmq
from zmq.utils.monitor import recv_monitor_message

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


def _unique_pairs(pairs):
    d = dict(pairs)
    if len(d) != len(pairs):
        raise ValueError("a map repeats a key: %r" % (pairs,))
    return d


def decode(frame):
    """One frame -> a message dict (raises ValueError if it is not a versioned map, or if any
    of its maps repeats a key)."""
    m = msgpack.unpackb(frame, raw=False, strict_map_key=False, object_pairs_hook=_unique_pairs)
    if not isinstance(m, dict) or m.get("v") != PROTO_VERSION or not isinstance(m.get("type"), str):
        raise ValueError("not a protocol message: %r" % (m,))
    return m


def read_key_file(path, secret=False):
    """The key of a key file of `strata keygen` (one line of 40 Z85 characters; '#' lines and
    blank lines are ignored), as bytes. secret: the file must not be readable by other users."""
    keys = []
    with open(path, "rb") as f:
        if secret and os.fstat(f.fileno()).st_mode & 0o077:
            raise ValueError("%s: other users may read this secret key; chmod 600 it" % path)
        for line in f.read().decode("ascii").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    if len(keys) != 1 or len(keys[0]) != 40:
        raise ValueError("%s: not a key file (one line of 40 Z85 characters, as `strata keygen` writes)" % path)
    return keys[0].encode("ascii")


class StrataClient:
    """One connection to a router. Not thread-safe: use one client per thread.

    curve_server_key: the router's public key file (CURVE); curve_client_key: this client's
    secret key file (without it, a keypair made here, which a router with curve_clients_file
    refuses)."""

    def __init__(self, endpoint=DEFAULT_ENDPOINT, identity=None, timeout=60.0, resume_after=5.0,
                 resume_tries=10, gone_after=3.0, context=None, curve_server_key=None, curve_client_key=None):
        self.endpoint = endpoint
        self._curve = None
        if curve_server_key:
            if curve_client_key:
                secret = read_key_file(curve_client_key, secret=True)
                public = zmq.curve_public(secret)
            else:
                public, secret = zmq.curve_keypair()
            self._curve = (read_key_file(curve_server_key), public, secret)
        elif curve_client_key:
            raise ValueError("curve_client_key needs curve_server_key (the router's public key file)")
        self.identity = identity or ("py-" + os.urandom(8).hex()).encode()
        if self.identity[:1] == b"\0":
            raise ValueError("identity must not start with a zero byte")
        self.timeout = timeout
        self.resume_after = resume_after
        self.resume_tries = resume_tries
        self.gone_after = gone_after
        self._ctx = context or zmq.Context.instance()
        self._ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 16)
        self._backlog = {}   # id -> [messages received for a request not being read now]
        self._sock = None
        self._mon = None
        self.last_done = None
        self._connect()

    # -- connection ------------------------------------------------------------------------

    def _connect(self):
        self._close_socket()
        s = self._ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.ROUTING_ID, self.identity)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        # Let ZeroMQ's I/O thread keep reading while the application does not: otherwise the
        # router's heartbeats stall behind queued replies and it drops this connection.
        s.setsockopt(zmq.RCVHWM, 100000)
        if self._curve:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = self._curve
        self._mon = s.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._connected = False
        self._down_since = time.monotonic()
        self._was_lost = False    # the connection dropped since the last reconnect
        self._back = False        # ... and came back: a stream in progress must resume
        s.connect(self.endpoint)
        self._sock = s

    def _close_socket(self):
        if self._sock is not None:
            self._sock.disable_monitor()
            self._mon.close(linger=0)
            self._sock.close(linger=0)
            self._sock = self._mon = None

    def close(self):
        self._close_socket()

    def _events(self):
        """Apply pending connection events; raise "unavailable" once no router has accepted
        the connection for gone_after seconds."""
        while self._mon.poll(0):
            ev = recv_monitor_message(self._mon)["event"]
            if ev == zmq.EVENT_CONNECTED:
                self._connected, self._down_since = True, None
                if self._was_lost:
                    self._was_lost, self._back = False, True
            elif ev == zmq.EVENT_DISCONNECTED:
                self._connected, self._down_since, self._was_lost = False, time.monotonic(), True
        if self._down_since is not None and time.monotonic() - self._down_since > self.gone_after:
            raise StrataError("unavailable", "no router at %s (not reachable for %.1f s)" % (self.endpoint, self.gone_after))

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

    def recv(self, timeout, wake_on_reconnect=False):
        """Next message from the router, or None after timeout seconds (or, with
        wake_on_reconnect, early when the connection came back after a loss). Raises
        StrataError "unavailable" if the router is gone for gone_after seconds."""
        deadline = time.monotonic() + timeout
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._mon, zmq.POLLIN)
        while True:
            self._events()
            if self._back and wake_on_reconnect:
                return None
            if self._sock.poll(0):
                return decode(self._sock.recv())
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            poller.poll(int(min(left, 0.25) * 1000) + 1)

    def _recv_for(self, rid, timeout, wake_on_reconnect=False):
        q = self._backlog.get(rid)
        if q:
            return q.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            m = self.recv(left, wake_on_reconnect)
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
                 seed=0, stop=None, stream=True, ignore_eos=False, logprobs=False, top_logprobs=0, id=None,
                 resume=True, extra=None):
        """Stream one answer. Yields each `token` event (dicts with "index", "tokens",
        "text", and with logprobs=True their log-probabilities: see the module's doc); when
        the answer ends, self.last_done holds the `done` message (with "text" and "tokens"
        too if stream=False, in which case nothing is yielded).
        Raises StrataError on an error reply. `extra` adds raw fields (tests)."""
        rid = self.next_id() if id is None else id
        msg = {"type": "generate", "id": rid, "max_tokens": max_tokens, "temperature": temperature,
               "top_p": top_p, "top_k": top_k, "seed": seed, "stream": stream}
        if ignore_eos:
            msg["ignore_eos"] = True
        if logprobs:
            msg["logprobs"] = True
            if top_logprobs:
                msg["top_logprobs"] = top_logprobs
        if tokens is not None:
            msg["tokens"] = list(tokens)
        else:
            msg["prompt"] = prompt
        if stop:
            msg["stop"] = list(stop)
        if extra:
            msg.update(extra)
        self.last_done = None
        self._back = False
        self.send(msg)
        n_tokens, n_text, tries = 0, 0, 0
        deadline = time.monotonic() + self.timeout
        wait = self.resume_after if resume else self.timeout
        while True:
            m = self._recv_for(rid, min(wait, max(0.0, deadline - time.monotonic())), True)
            if m is None:
                back, self._back = self._back, False
                if not resume or tries >= self.resume_tries or time.monotonic() >= deadline:
                    raise StrataTimeout("no answer for request %d" % rid, rid)
                # The connection came back after a loss (the router restarted), or the router
                # has been silent too long: resume with what we have, under the same identity.
                tries += 1
                if not back:
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
