#!/usr/bin/python3
"""test_http_openai.py - strata-http through the official `openai` Python SDK against a real group
(CPU backend, the fixture model with a byte-level tokenizer and a chat template: httplib.py):
completions and chat, streamed and not; max_tokens and usage; stop strings; seeds that repeat;
greedy text equal to `strata client` over ZeroMQ and its ids to `strata generate` in one
process; /v1/models; a client that drops a stream mid-answer has its request canceled upstream
(the router's stats count the cancel); /metrics parsed by prometheus_client.

The openai and prometheus_client packages must be importable: without them the test fails (CI
installs them, .ci/run).

usage: test_http_openai.py --build DIR --source DIR [CASE...]
"""
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import httplib  # noqa: E402

openai, prometheus_client = httplib.require("openai", "prometheus_client.parser")

A = None
G = None


def client():
    return httplib.openai_client(G)


def model_name():
    return client().models.list().data[0].id


def case_models():
    ms = client().models.list().data
    assert len(ms) == 1 and ms[0].id == "model", ms
    m = client().models.retrieve("model")
    assert m.id == "model"
    try:
        client().models.retrieve("nope")
        raise AssertionError("unknown model retrieved")
    except openai.NotFoundError:
        pass


def case_completion():
    c = client()
    r = c.completions.create(model=model_name(), prompt="Hello", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.id.startswith("cmpl-"), r
    ch = r.choices[0]
    assert ch.index == 0 and ch.finish_reason == "length", ch
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 8 and r.usage.total_tokens == 13, r.usage
    # streamed: the same text, the usage chunk, [DONE]
    parts, usage, fins = [], None, []
    for chunk in c.completions.create(model=model_name(), prompt="Hello", max_tokens=8, temperature=0, stream=True,
                                      stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        if chunk.usage:
            usage = chunk.usage
        for x in chunk.choices:
            parts.append(x.text)
            if x.finish_reason:
                fins.append(x.finish_reason)
    assert "".join(parts) == ch.text, ("".join(parts), ch.text)
    assert fins == ["length"], fins
    assert usage and (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (5, 8, 13), usage
    # a list of one prompt, and token ids
    r2 = c.completions.create(model=model_name(), prompt=["Hello"], max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert r2.choices[0].text == ch.text
    r3 = c.completions.create(model=model_name(), prompt=list(b"Hello"), max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert r3.choices[0].text == ch.text and r3.usage.prompt_tokens == 5


def case_max_tokens():
    c = client()
    for n in (1, 3, 17):
        r = c.completions.create(model=model_name(), prompt="ab", max_tokens=n, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == n and r.choices[0].finish_reason == "length", (n, r.usage)
    # without max_tokens: OpenAI's default of 16
    r = c.completions.create(model=model_name(), prompt="ab", temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16, r.usage
    # more than the context holds: clamped to what is left of it
    r = c.completions.create(model=model_name(), prompt="ab", max_tokens=100000, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens + r.usage.completion_tokens == A.context, r.usage


def case_stop():
    c = client()
    full = c.completions.create(model=model_name(), prompt="The", max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    text = full.choices[0].text
    # a stop string cut from the middle of the answer
    for k in range(3, len(text) - 2):
        stop = text[k:k + 2]
        if stop.isprintable() and "\ufffd" not in stop:
            break
    else:
        raise AssertionError("no usable stop string in %r" % text)
    want = text[:text.find(stop)]
    for st in (stop, [stop, "never-in-it"]):
        r = c.completions.create(model=model_name(), prompt="The", max_tokens=40, temperature=0, stop=st,
                                 extra_body={"ignore_eos": True})
        assert r.choices[0].text == want and r.choices[0].finish_reason == "stop", (st, r.choices[0], want)
    parts = [x.choices[0].text for x in c.completions.create(model=model_name(), prompt="The", max_tokens=40, temperature=0,
                                                              stop=stop, stream=True, extra_body={"ignore_eos": True})
             if x.choices]
    assert "".join(parts) == want, ("".join(parts), want)


def case_seed():
    c = client()

    def once(seed):
        return c.completions.create(model=model_name(), prompt="Once", max_tokens=12, temperature=1.0, seed=seed,
                                    extra_body={"ignore_eos": True}).choices[0].text

    a, b = once(42), once(42)
    assert a == b, (a, b)
    others = {once(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "every seed gave the same text: %r" % a
    # chat too
    m = [{"role": "user", "content": "hi"}]
    x = [c.chat.completions.create(model=model_name(), messages=m, max_tokens=10, temperature=0.9, seed=7,
                                   extra_body={"ignore_eos": True}).choices[0].message.content for _ in range(2)]
    assert x[0] == x[1], x


def case_greedy_equals_cli():
    """Greedy over HTTP == `strata client` over ZeroMQ (text); its ids == `strata generate` (one process)."""
    ids = [72, 101, 108, 108, 111, 44, 32]
    c = client()
    r = c.completions.create(model=model_name(), prompt=ids, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    ep = "tcp://127.0.0.1:%d" % G.port
    tok = ",".join(map(str, ids))
    cli = subprocess.run([G.strata, "client", "--endpoint", ep, "--tokens", tok, "--max-tokens", "24", "--ignore-eos"],
                         capture_output=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.decode().rstrip("\n") == r.choices[0].text, (cli.stdout, r.choices[0].text)
    cli_ids = subprocess.run([G.strata, "client", "--endpoint", ep, "--tokens", tok, "--max-tokens", "24", "--ignore-eos", "--ids"],
                             capture_output=True, text=True, timeout=60)
    gen = subprocess.run([G.strata, "generate", G.model, "--tokens", tok, "--max-tokens", "24", "--ignore-eos", "--threads", "1"],
                         capture_output=True, text=True, timeout=60)
    assert gen.returncode == 0, gen.stderr
    assert cli_ids.stdout.split() == gen.stdout.split(), (cli_ids.stdout, gen.stdout)
    # the same through the chat route: its rendered prompt as a completion gives the same text
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    chat = c.chat.completions.create(model=model_name(), messages=msgs, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    rendered = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in msgs) + "<|im_start|>assistant\n"
    comp = c.completions.create(model=model_name(), prompt=rendered, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == comp.choices[0].text, (chat.choices[0].message.content, comp.choices[0].text)
    assert chat.usage.prompt_tokens == comp.usage.prompt_tokens == len(rendered.encode()), (chat.usage, comp.usage)


def case_chat():
    c = client()
    msgs = [{"role": "user", "content": "Say something."}]
    r = c.chat.completions.create(model=model_name(), messages=msgs, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r
    ch = r.choices[0]
    assert ch.message.role == "assistant" and ch.finish_reason == "length" and isinstance(ch.message.content, str), ch
    assert r.usage.completion_tokens == 6 and r.usage.total_tokens == r.usage.prompt_tokens + 6, r.usage
    text, roles, usage, fins = "", [], None, []
    for chunk in c.chat.completions.create(model=model_name(), messages=msgs, max_tokens=6, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage:
            usage = chunk.usage
        for x in chunk.choices:
            if x.delta.role:
                roles.append(x.delta.role)
            text += x.delta.content or ""
            if x.finish_reason:
                fins.append(x.finish_reason)
    assert roles == ["assistant"] and fins == ["length"], (roles, fins)
    assert text == ch.message.content, (text, ch.message.content)
    assert usage.prompt_tokens == r.usage.prompt_tokens and usage.completion_tokens == 6, usage
    # text parts are joined; max_completion_tokens wins over max_tokens
    r2 = c.chat.completions.create(model=model_name(), messages=[{"role": "user", "content": [{"type": "text", "text": "Say something."}]}],
                                   max_tokens=50, max_completion_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    assert r2.choices[0].message.content == ch.message.content and r2.usage.completion_tokens == 6


def case_disconnect_cancels():
    before = httplib.router_stats(G).get("router.canceled", 0)
    c = client()
    with c.completions.create(model=model_name(), prompt="Go on", max_tokens=100000, temperature=0, stream=True,
                              extra_body={"ignore_eos": True}) as s:
        it = iter(s)
        next(it)
        next(it)
    # closed after two chunks of an answer of thousands of tokens: the request is canceled upstream
    t0 = time.time()
    while time.time() - t0 < 10:
        st = httplib.router_stats(G)
        if st.get("router.canceled", 0) > before:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the router counted no cancel: %s" % {k: v for k, v in st.items() if k.startswith("router.")})
    assert st.get("scheduler.running", 0) == 0, "still running upstream: %s" % st.get("scheduler.running")
    page = httplib.request(G, "GET", "/metrics")[2].decode()
    fam = {f.name: f for f in prometheus_client.parser.text_string_to_metric_families(page)}
    assert fam["strata_http_client_disconnects"].samples[0].value >= 1, fam["strata_http_client_disconnects"]


def case_metrics():
    c = client()
    c.completions.create(model=model_name(), prompt="Hi", max_tokens=4, temperature=0)
    st, h, body = httplib.request(G, "GET", "/metrics")
    assert st == 200 and h["content-type"].startswith("text/plain; version=0.0.4"), (st, h)
    fams = {f.name: f for f in prometheus_client.parser.text_string_to_metric_families(body.decode())}
    for name, typ in (("strata_http_requests", "counter"), ("strata_requests", "counter"), ("strata_generation_tokens", "counter"),
                      ("strata_time_to_first_token_seconds", "histogram"), ("strata_inter_token_latency_seconds", "histogram"),
                      ("strata_request_queue_time_seconds", "histogram"), ("strata_e2e_request_latency_seconds", "histogram"),
                      ("strata_running_sequences", "gauge"), ("strata_waiting_sequences", "gauge"), ("strata_kv_blocks_in_use", "gauge"),
                      ("strata_service_restarts", "counter"), ("strata_up", "gauge")):
        assert name in fams, "no %s in /metrics: %s" % (name, sorted(fams))
        assert fams[name].type == typ, (name, fams[name].type)
    ttft = {s.labels.get("le"): s.value for s in fams["strata_time_to_first_token_seconds"].samples if s.name.endswith("_bucket")}
    assert ttft["+Inf"] >= 1, ttft
    svc = {s.labels["service"] for s in fams["strata_service_restarts"].samples}
    assert {"router", "scheduler", "executor", "http", "prefetcher.0"} <= svc, svc
    ok = [s for s in fams["strata_http_requests"].samples if s.labels.get("route") == "/v1/completions" and s.labels.get("status") == "2xx"]
    assert ok and ok[0].value >= 1, ok


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    global A, G
    A = httplib.case_args()
    A.context = 1024
    G = httplib.HttpGroup(A, sections={"scheduler": {"max_context": str(A.context)}})
    httplib.run_cases(G, CASES, A.cases)


if __name__ == "__main__":
    sys.exit(main())
