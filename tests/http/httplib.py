"""httplib.py - what the strata-http tests share: a model folder with a tokenizer and a chat
template, a real group with an [http] section (tests/group/grouplib.py's Group), small HTTP
functions over raw sockets and http.client, the router's stats over ZeroMQ, the command line
and case loop of a test (require, case_args, run_cases for cases that share one group, run_case
for one case a call, openai_client), and a network namespace of a case's own (enter_netns).

The model is the transformers fixture tests/fixtures/mixtral (random weights, vocab 512) with a
byte-level tokenizer written here: ids 0-255 are the bytes, 256 is <s>, 257 is </s>; its
tokenizer_config.json carries a small ChatML chat template."""
import argparse
import http.client
import importlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "group"))
import grouplib  # noqa: E402

NS_ADDR = "192.0.2.10"  # an address of a test's own network namespace (on its lo), reachable from nowhere else

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


def require(*names):
    """Import the named modules (a dotted name: that module of its package) and return their
    packages. A missing one is a failure, not a skip (CI installs them): exit 1, saying what to
    install."""
    try:
        for n in names:
            importlib.import_module(n)
    except ImportError as e:
        print("FAIL: %s (pip install %s; .ci/run does)" % (e, " ".join(n.split(".")[0] for n in names)))
        sys.exit(1)
    return [sys.modules[n.split(".")[0]] for n in names]


def case_args(one_of=None):
    """A test's command line: --build DIR --source DIR, then the cases to run on one group
    (args.cases, none: all), or with one_of the one case of them to run (args.case)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    if one_of is None:
        ap.add_argument("cases", nargs="*")
    else:
        ap.add_argument("case", choices=sorted(one_of))
    return ap.parse_args()


def run_case(cases, name):
    """Run one case (it raises on failure) and print "ok CASE SECONDS"; returns 0."""
    t0 = time.time()
    cases[name]()
    print("ok   %s %.1fs" % (name, time.time() - t0))
    return 0


def run_cases(g, cases, names):
    """Start g, wait for its /health, run the named cases (every case without names) with
    grouplib.run_cases, the tail of the group's log after a failure; g closed at the end. Exits
    0, or 1 when a case failed."""
    try:
        g.start(timeout=60)
        g.wait_health()
        grouplib.run_cases(cases, names or list(cases), after_failure=lambda: print(g.read_log()[-4000:]))
    finally:
        g.close()


def openai_client(g):
    """An OpenAI SDK client of g's strata-http (no retries: a failure shows at once)."""
    import openai
    return openai.OpenAI(base_url=g.base_url, api_key="unused", max_retries=0, timeout=60)


def enter_netns(a, script, case):
    """A case that needs a network namespace of its own. Outside one: run `script --build --source
    case` again inside a new one (unshare --user --net --map-root-user) and return False, the case
    done (AssertionError if it failed there; exit 77 where no namespace can be made here, 1
    without unshare). Inside it (STRATA_TEST_NETNS=1): lo up with NS_ADDR on it; True, the case
    goes on."""
    if os.environ.get("STRATA_TEST_NETNS") != "1":
        unshare = shutil.which("unshare")
        if not unshare:
            print("FAIL: no unshare(1) (util-linux) to make a network namespace")
            sys.exit(1)
        probe = subprocess.run([unshare, "--user", "--net", "--map-root-user", "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            why = probe.stderr.strip()
            limited = ""
            for p in ("/proc/sys/kernel/unprivileged_userns_clone", "/proc/sys/user/max_user_namespaces"):
                try:
                    with open(p) as f:
                        if f.read().strip() == "0":
                            limited = "%s is 0" % p
                except OSError:
                    pass
            if limited or "Operation not permitted" in why:
                # a container or a kernel that forbids namespaces to this user: not this code's failure
                print("skipped: cannot make a network namespace here (%s%s%s)" % (why, "; " if limited else "", limited))
                sys.exit(77)
            print("FAIL: unshare --user --net --map-root-user failed: %s" % why)
            sys.exit(1)
        env = dict(os.environ, STRATA_TEST_NETNS="1")
        r = subprocess.run([unshare, "--user", "--net", "--map-root-user", sys.executable, os.path.abspath(script),
                            "--build", a.build, "--source", a.source, case], env=env, timeout=170)
        if r.returncode:
            raise AssertionError("the test inside the namespace failed (exit %d)" % r.returncode)
        return False
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", NS_ADDR + "/32", "dev", "lo"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, "%s: %s" % (" ".join(cmd), r.stderr)
    return True
