#!/usr/bin/python3
"""test_http_logprobs.py - log-probabilities through strata-http (the official `openai` SDK) and
over ZeroMQ (proto/python/strata_client.py), against a real group (CPU backend, the fixture model
with a byte-level tokenizer: httplib.py).

  chat        choices[].logprobs.content[] with token, logprob, bytes and top_logprobs, streamed
              and not: finite, <= 0, the alternatives most likely first, their exps adding up to
              at most 1, at temperature 0 the sampled token the top one with the same logprob;
              every value equal (1e-4) to a log-softmax of the logits `strata eval` writes for the
              same tokens (numpy, float64); tokens as text ("token" and "bytes" of the byte each
              id stands for) and as "token_id:N" (return_tokens_as_token_ids)
  completion  the legacy shape: tokens, token_logprobs, top_logprobs ({token: logprob}: the
              `logprobs` most likely and the sampled token), text_offset; streamed and not,
              logprobs 0 and 5, against `strata eval` too
  temperature at temperature 1.5 (and top-k, top-p) the values are still the model's own
              distribution, before temperature: equal to the raw log-softmax
  absent      a request without logprobs gets "logprobs": null (chat and completions, streamed
              and not), and costs the executor no log-probability row
  zmq         over ZeroMQ: a generate without logprobs has no log-probability field in any token
              event or done; with them every event carries logprobs, top_n, top_tokens,
              top_logprobs, token_text and top_text of consistent lengths, streamed and not

usage: test_http_logprobs.py --build DIR --source DIR [CASE...]
"""
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import httplib  # noqa: E402

_, np = httplib.require("openai", "numpy")

A = None
G = None
TOL = 1e-4
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119]  # "Hello, w"
CHAT = [{"role": "user", "content": "Tell me."}]


def client():
    return httplib.openai_client(G)


def rendered_chat(msgs):
    """The chat template of httplib.py rendered by hand: the prompt's bytes are its token ids."""
    text = "".join("<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"]) for m in msgs) + "<|im_start|>assistant\n"
    return list(text.encode())


def ref_logprobs(prompt, gen):
    """log-softmax (float64) of the logits `strata eval` gives at each generated position of
    prompt + gen: [len(gen)][vocab]. The prompt in one step, then a token a step, as the
    executor runs it."""
    seq = list(prompt) + list(gen[:-1])
    with tempfile.NamedTemporaryFile(suffix=".f32") as f:
        out = subprocess.run([G.strata, "eval", G.model, "--tokens", ",".join(map(str, seq)), "--logits-out", f.name,
                              "--prefill", str(len(prompt)), "--threads", "1"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        lg = np.fromfile(f.name, dtype="<f4").astype(np.float64)
    lg = lg.reshape(len(seq), -1)[len(prompt) - 1:]
    mx = lg.max(axis=1, keepdims=True)
    return lg - (mx + np.log(np.exp(lg - mx).sum(axis=1, keepdims=True)))


def ids_of(names):
    """Token ids from "token_id:N" names (return_tokens_as_token_ids)."""
    out = []
    for n in names:
        assert n.startswith("token_id:"), n
        out.append(int(n[len("token_id:"):]))
    return out


def piece(t):
    """The text of token t on its own with httplib.py's tokenizer: ids 0-255 the bytes (U+FFFD for
    one that is not ASCII), then <s> and </s>; the model's ids beyond are not the tokenizer's."""
    return chr(t) if t < 128 else "\ufffd" if t < 256 else {256: "<s>", 257: "</s>"}.get(t, "")


def check_entry_values(lp, tops, what):
    """One token's value and alternatives: finite, <= 0, most likely first, exps adding up to <= 1."""
    assert math.isfinite(lp) and lp <= 0, (what, lp)
    vals = [t for t in tops]
    assert all(math.isfinite(v) and v <= 0 for v in vals), (what, vals)
    assert vals == sorted(vals, reverse=True), (what, "alternatives not most likely first", vals)
    assert sum(math.exp(v) for v in vals) <= 1 + 1e-6, (what, "alternatives' probabilities add up to more than 1", vals)


def check_against_ref(prompt, gen, lps, top_ids, top_lps, what):
    """The values against `strata eval`: the sampled token's and the alternatives' (ids and values)."""
    ref = ref_logprobs(prompt, gen)
    worst = 0.0
    for i, t in enumerate(gen):
        d = abs(ref[i][t] - lps[i])
        worst = max(worst, d)
        assert d < TOL, (what, "token %d (%d): logprob %r, recomputed %r" % (i, t, lps[i], ref[i][t]))
        order = sorted(range(ref.shape[1]), key=lambda v: (-ref[i][v], v))
        k = len(top_ids[i])
        for j in range(k):
            # ties within rounding may swap: compare the value at each rank, and the id where it is clear
            assert abs(ref[i][order[j]] - top_lps[i][j]) < TOL, (what, "token %d alternative %d: %r vs %r" % (
                i, j, top_lps[i][j], ref[i][order[j]]))
            assert abs(ref[i][top_ids[i][j]] - top_lps[i][j]) < TOL, (what, "token %d alternative %d: id %d" % (i, j, top_ids[i][j]))
    print("     %s: %d tokens within %.1e of strata eval" % (what, len(gen), worst), flush=True)


def case_chat():
    c = client()
    kw = dict(model="model", messages=CHAT, max_tokens=12, temperature=0, logprobs=True, top_logprobs=5)
    ids_body = {"ignore_eos": True, "return_tokens_as_token_ids": True}
    r = c.chat.completions.create(**kw, extra_body=ids_body)
    ch = r.choices[0]
    content = ch.logprobs.content
    assert len(content) == r.usage.completion_tokens == 12, (len(content), r.usage)
    gen = ids_of([e.token for e in content])
    for i, e in enumerate(content):
        assert len(e.top_logprobs) == 5, e
        check_entry_values(e.logprob, [t.logprob for t in e.top_logprobs], "chat %d" % i)
        # greedy: the sampled token is the most likely one, with the same value
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob, (i, e)
        assert isinstance(e.bytes, list) and all(isinstance(b, int) and 0 <= b < 256 for b in e.bytes), e
    check_against_ref(rendered_chat(CHAT), gen, [e.logprob for e in content],
                      [ids_of([t.token for t in e.top_logprobs]) for e in content],
                      [[t.logprob for t in e.top_logprobs] for e in content], "chat")
    # the same as text: the byte each id stands for (U+FFFD and its bytes for one that is not ASCII)
    r2 = c.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    named = r2.choices[0].logprobs.content
    assert [e.logprob for e in named] == [e.logprob for e in content], "text names changed the values"
    for e, t in zip(named, gen):
        want = piece(t)
        assert e.token == want and e.bytes == list(want.encode()), (t, e.token, e.bytes)
        for alt in e.top_logprobs:
            assert alt.bytes == list(alt.token.encode()), alt
    assert r2.choices[0].message.content == ch.message.content
    # streamed: the same entries, a chunk's for its own tokens, content "" where text is held back
    got, n_chunks = [], 0
    for chunk in c.chat.completions.create(**kw, stream=True, extra_body=ids_body):
        for x in chunk.choices:
            if x.logprobs is not None and x.logprobs.content:
                n_chunks += 1
                got.extend(x.logprobs.content)
    assert [e.token for e in got] == [e.token for e in content], ([e.token for e in got], [e.token for e in content])
    assert [e.logprob for e in got] == [e.logprob for e in content]
    assert [[t.token for t in e.top_logprobs] for e in got] == [[t.token for t in e.top_logprobs] for e in content]
    assert n_chunks >= 2, n_chunks
    # top_logprobs 0 and 20
    r3 = c.chat.completions.create(model="model", messages=CHAT, max_tokens=3, temperature=0, logprobs=True,
                                   extra_body={"ignore_eos": True})
    assert all(e.top_logprobs == [] for e in r3.choices[0].logprobs.content), r3.choices[0].logprobs
    assert [e.logprob for e in r3.choices[0].logprobs.content] == [e.logprob for e in content[:3]]
    r4 = c.chat.completions.create(model="model", messages=CHAT, max_tokens=3, temperature=0, logprobs=True, top_logprobs=20,
                                   extra_body={"ignore_eos": True})
    for e in r4.choices[0].logprobs.content:
        assert len(e.top_logprobs) == 20
        check_entry_values(e.logprob, [t.logprob for t in e.top_logprobs], "top 20")


def case_completion():
    c = client()
    kw = dict(model="model", prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3)
    ids_body = {"ignore_eos": True, "return_tokens_as_token_ids": True}
    r = c.completions.create(**kw, extra_body=ids_body)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10, lp
    gen = ids_of(lp.tokens)
    off = 0
    for i in range(10):
        assert lp.text_offset[i] == off, (i, lp.text_offset)
        off += len(lp.tokens[i])
        d = lp.top_logprobs[i]
        # greedy: the sampled token is among the 3 most likely, so it adds no fourth entry
        assert len(d) == 3 and d[lp.tokens[i]] == lp.token_logprobs[i], (i, d, lp.tokens[i])
        assert lp.token_logprobs[i] == max(d.values())
        check_entry_values(lp.token_logprobs[i], sorted(d.values(), reverse=True), "completion %d" % i)
    tops = [sorted(d.items(), key=lambda kv: -kv[1]) for d in lp.top_logprobs]
    check_against_ref(PROMPT, gen, lp.token_logprobs, [ids_of([k for k, _ in t]) for t in tops], [[v for _, v in t] for t in tops],
                      "completion")
    # streamed: the same four lists, text_offset running on across chunks
    toks, vals, offs = [], [], []
    for chunk in c.completions.create(**kw, stream=True, extra_body=ids_body):
        for x in chunk.choices:
            if x.logprobs is not None:
                toks += x.logprobs.tokens
                vals += x.logprobs.token_logprobs
                offs += x.logprobs.text_offset
    assert (toks, vals, offs) == (lp.tokens, lp.token_logprobs, lp.text_offset), (toks, offs)
    # as text: text_offset counts the token strings' characters
    r2 = c.completions.create(**kw, extra_body={"ignore_eos": True})
    l2 = r2.choices[0].logprobs
    assert l2.token_logprobs == lp.token_logprobs
    assert l2.text_offset == [sum(len(t) for t in l2.tokens[:i]) for i in range(10)], (l2.tokens, l2.text_offset)
    # logprobs 0: the sampled token alone; 5 (the most OpenAI takes)
    r3 = c.completions.create(model="model", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0, extra_body=ids_body)
    l3 = r3.choices[0].logprobs
    assert all(d == {t: v} for d, t, v in zip(l3.top_logprobs, l3.tokens, l3.token_logprobs)), l3
    r4 = c.completions.create(model="model", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=5, extra_body=ids_body)
    assert all(len(d) == 5 for d in r4.choices[0].logprobs.top_logprobs), r4.choices[0].logprobs


def case_temperature():
    """The values are the model's own distribution, whatever the sampling: equal to the raw
    log-softmax, and not to the temperature's."""
    c = client()
    r = c.completions.create(model="model", prompt=PROMPT, max_tokens=12, temperature=1.5, top_p=0.9, seed=11, logprobs=2,
                             extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True, "top_k": 40})
    lp = r.choices[0].logprobs
    gen = ids_of(lp.tokens)
    # the 2 most likely; a sampled token outside them is the third entry, and the least likely
    tops = [sorted(d.items(), key=lambda kv: -kv[1])[:2] for d in lp.top_logprobs]
    ref = ref_logprobs(PROMPT, gen)
    scaled_off = 0
    for i, t in enumerate(gen):
        assert abs(ref[i][t] - lp.token_logprobs[i]) < TOL, (i, lp.token_logprobs[i], ref[i][t])
        z = ref[i] / 1.5
        z = z - (z.max() + np.log(np.exp(z - z.max()).sum()))
        scaled_off = max(scaled_off, abs(z[t] - lp.token_logprobs[i]))
        assert len(lp.top_logprobs[i]) in (2, 3), lp.top_logprobs[i]
    assert scaled_off > 1e-3, "the values look like the temperature's distribution"
    check_against_ref(PROMPT, gen, lp.token_logprobs, [ids_of([k for k, _ in t]) for t in tops], [[v for _, v in t] for t in tops],
                      "temperature 1.5")
    sampled_not_top = sum(1 for d, t in zip(lp.top_logprobs, lp.tokens) if len(d) == 3)
    print("     temperature 1.5: %d of %d sampled tokens outside the top 2" % (sampled_not_top, len(gen)), flush=True)


def case_absent():
    c = client()
    before = httplib.router_stats(G).get("scheduler.executor.logprob_rows")
    assert before is not None, "no scheduler.executor.logprob_rows in the stats"
    r = c.completions.create(model="model", prompt=PROMPT, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].logprobs is None, r.choices[0]
    r = c.chat.completions.create(model="model", messages=CHAT, max_tokens=4, temperature=0.7, extra_body={"ignore_eos": True})
    assert r.choices[0].logprobs is None, r.choices[0]
    r = c.chat.completions.create(model="model", messages=CHAT, max_tokens=4, temperature=0, logprobs=False,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].logprobs is None, r.choices[0]
    for chunk in c.chat.completions.create(model="model", messages=CHAT, max_tokens=4, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True}):
        assert all(x.logprobs is None for x in chunk.choices), chunk
    for chunk in c.completions.create(model="model", prompt=PROMPT, max_tokens=4, temperature=0, stream=True,
                                      extra_body={"ignore_eos": True}):
        assert all(x.logprobs is None for x in chunk.choices), chunk
    after = httplib.router_stats(G).get("scheduler.executor.logprob_rows")
    assert after == before, "requests without logprobs made %s log-probability rows" % (after - before)
    c.completions.create(model="model", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=1, extra_body={"ignore_eos": True})
    t0 = time.time()
    while httplib.router_stats(G).get("scheduler.executor.logprob_rows") != before + 3:
        assert time.time() - t0 < 5, "a request with logprobs did not count its 3 rows"
        time.sleep(0.1)


def case_zmq():
    sys.path.insert(0, os.path.join(A.source, "proto", "python"))
    from strata_client import StrataClient
    lp_keys = {"logprobs", "top_n", "top_tokens", "top_logprobs", "token_text", "top_text"}
    with StrataClient("tcp://127.0.0.1:%d" % G.port, timeout=60) as c:
        evs = list(c.generate(tokens=PROMPT, max_tokens=6, ignore_eos=True))
        assert evs and all(not (lp_keys & set(e)) for e in evs), evs
        assert not (lp_keys & set(c.last_done)), c.last_done
        assert set(evs[0]) == {"v", "type", "id", "index", "tokens", "text"}, evs[0]
        _, toks, done = c.complete(tokens=PROMPT, max_tokens=6, ignore_eos=True, stream=False)
        assert not (lp_keys & set(done)), done
        # with them: every event, lengths consistent
        n = 0
        lps = []
        for e in c.generate(tokens=PROMPT, max_tokens=6, ignore_eos=True, logprobs=True, top_logprobs=4):
            k = len(e["tokens"])
            if k == 0:
                continue
            assert lp_keys <= set(e), e
            assert len(e["logprobs"]) == len(e["token_text"]) == k and e["top_n"] == 4, e
            assert len(e["top_tokens"]) == len(e["top_logprobs"]) == len(e["top_text"]) == 4 * k, e
            assert all(v <= 0 for v in e["logprobs"] + e["top_logprobs"]), e
            n += k
            lps += e["logprobs"]
        assert n == 6, n
        assert not (lp_keys & set(c.last_done)), c.last_done
        _, toks2, done = c.complete(tokens=PROMPT, max_tokens=6, ignore_eos=True, stream=False, logprobs=True)
        assert toks2 == toks and done["logprobs"] == lps and len(done["token_text"]) == 6, done
        assert "top_tokens" not in done or done["top_tokens"] == [], done
        assert [piece(t) for t in toks] == done["token_text"], (toks, done["token_text"])


CASES = {n[5:]: f for n, f in globals().items() if n.startswith("case_")}


def main():
    global A, G
    A = httplib.case_args()
    G = httplib.HttpGroup(A, sections={"scheduler": {"max_context": "512"}})
    httplib.run_cases(G, CASES, A.cases)


if __name__ == "__main__":
    sys.exit(main())
