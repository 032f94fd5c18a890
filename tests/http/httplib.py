"""httplib.py - what the strata-http tests share: a model folder with a tokenizer and a chat
template, a real group with an [http] section (tests/group/grouplib.py's Group), small HTTP
functions over raw sockets and http.client, and the router's stats over ZeroMQ.

The model is the transformers fixture tests/fixtures/mixtral (random weights, vocab 512) with a
byte-level tokenizer written here: ids 0-255 are the bytes, 256 is <s>, 257 is </s>; its
tokenizer_config.json carries a small ChatML chat template."""
import http.client
import json
import os
import shutil
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "group"))
import grouplib  # noqa: E402

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def make_model(dst, source_root):
    """The fixture model with a byte-level tokenizer and a chat template, in dst."""
    src = os.path.join(source_root, "tests", "fixtures", "mixtral")
    os.makedirs(dst, exist_ok=True)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    b2u = _bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    vocab["<s>"] = 256
    vocab["</s>"] = 257
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
             for i, t in ((256, "<s>"), (257, "</s>"))]
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": bl, "post_processor": bl, "decoder": bl,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "", "end_of_word_suffix": "",
                     "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": []}}
    with open(os.path.join(dst, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(dst, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<s>", "eos_token": "</s>", "chat_template": CHAT_TEMPLATE}, f)
    return dst


class Args:
    pass


def group_args(a):
    """grouplib's args from this test's command line (--build, --source)."""
    g = Args()
    b = a.build
    g.strata = os.path.join(b, "services", "strata", "strata")
    for s in ("prefetcher", "executor", "scheduler", "router", "http"):
        setattr(g, s, os.path.join(b, "services", s, "strata-" + s))
    g.fake = os.path.join(b, "tests", "group", "fake_service")
    g.source = a.source
    return g


class HttpGroup(grouplib.Group):
    """A real group on the test model with strata-http on its own port."""

    def __init__(self, a, http=None, sections=None, model=None):
        ga = group_args(a)
        self._work = None
        if model is None:
            import tempfile
            self._work = tempfile.mkdtemp(prefix="strata-httpmodel-")
            model = make_model(os.path.join(self._work, "model"), a.source)
        ga.model = model
        self.http_port = grouplib.free_port()
        sec = {"scheduler": {"max_context": "256"}, "executor": {"threads": "1"},
               "http": dict({"host": "127.0.0.1", "port": str(self.http_port)}, **(http or {}))}
        for s, kv in (sections or {}).items():
            sec.setdefault(s, {}).update(kv)
        super().__init__(ga, kind="real", sections=sec)
        os.symlink(ga.http, os.path.join(self.bin_dir, "strata-http"))
        self.host = sec["http"]["host"]

    def close(self):
        super().close()
        if self._work:
            shutil.rmtree(self._work, ignore_errors=True)

    @property
    def base_url(self):
        h = "[%s]" % self.host if ":" in self.host else self.host
        return "http://%s:%d/v1" % (h, self.http_port)

    def wait_health(self, timeout=30):
        t0 = time.time()
        last = None
        while time.time() - t0 < timeout:
            try:
                st, _, body = request(self, "GET", "/health", timeout=2)
                if st == 200:
                    return
                last = (st, body)
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise AssertionError("/health not 200 within %ss: %s\n%s" % (timeout, last, self.read_log()))


def request(g, method, path, body=None, headers=None, timeout=30, host=None):
    """(status, headers dict, body bytes) of one request over http.client."""
    c = http.client.HTTPConnection(host or g.host, g.http_port, timeout=timeout)
    try:
        hdrs = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=hdrs)
        r = c.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        c.close()


def raw(g, data, timeout=10, read=True):
    """Send raw bytes on a fresh TCP connection; the reply bytes (until close or timeout)."""
    s = socket.create_connection((g.host, g.http_port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while True:
            try:
                k = s.recv(65536)
            except socket.timeout:
                break
            if not k:
                break
            out += k
            if b"\r\n\r\n" in out:
                head, _, rest = out.partition(b"\r\n\r\n")
                cl = [l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if cl and len(rest) >= int(cl[0].split(b":")[1]):
                    break
        return out
    finally:
        s.close()


def router_stats(g):
    """The router's stats map over ZeroMQ (proto/python/strata_client.py)."""
    sys.path.insert(0, os.path.join(g.args.source, "proto", "python"))
    import strata_client
    c = strata_client.StrataClient("tcp://127.0.0.1:%d" % g.port)
    try:
        return c.stats()
    finally:
        c.close()
