#!/usr/bin/python3
"""Write the seed corpora of the proto/msg.c fuzz targets (tests/fuzz/corpus/msg_*/).

    /usr/bin/python3 tests/fuzz/make_msg_corpus.py

One file per seed: a valid message of each type of the family (two-direction targets get a
leading byte, 0 = towards the service, 1 = from it), plus a few near misses, among them maps
with a repeated key (which a Python dict cannot hold: see `rep`).
"""
import os
import struct

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))


def p(m):
    d = {"v": 1}
    d.update(m)
    return msgpack.packb(d, use_bin_type=True)


class Pairs(list):
    """A map as a list of (key, value) pairs, in order, repeats allowed (a dict cannot repeat a key)."""


def pack_pairs(x):
    if isinstance(x, Pairs):
        n = len(x)
        head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
        return head + b"".join(pack_pairs(k) + pack_pairs(v) for k, v in x)
    if isinstance(x, list):
        n = len(x)
        head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
        return head + b"".join(pack_pairs(e) for e in x)
    return msgpack.packb(x, use_bin_type=True)


def rep(pairs):
    """A message map with a repeated key somewhere; `v` goes first."""
    return pack_pairs(Pairs([("v", 1)] + list(pairs)))


samp = {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "seed": 12345}
usage = {"prompt_tokens": 3, "completion_tokens": 4}
timings = {"queue_ms": 0.5, "ttft_ms": 3.0, "total_ms": 9.5}
hello = {"type": "hello", "instance": 99, "pid": 1234, "model": "demo", "vocab": 512, "max_context": 1024,
         "bos_id": 1, "eos_id": 2, "kv_blocks": 64, "block_size": 16, "load_ms": 3.5}
# a model with several eos ids (gpt-oss, Llama 3 instruct): eos_id is the first of eos_ids
hello_eos = dict(hello, eos_id=200, eos_ids=[200, 2, 499])

corpora = {
    "msg_client": [
        p(dict(type="generate", id=1, prompt="Hello, wörld", max_tokens=16, stop=["\n\n", "User:"], stream=True, **samp)),
        p(dict(type="generate", id=2, tokens=[1, 2, 3], max_tokens=4, ignore_eos=True, stream=False)),
        p({"type": "cancel", "id": 3}),
        p({"type": "resume", "id": 4, "from": 5, "text_from": 17, "stop": ["x"], "stream": True}),
        p({"type": "health"}), p({"type": "stats", "id": 9}), p({"type": "models"}),
        p({"type": "generate", "id": 5, "prompt": "x", "max_tokens": 0}),
        p({"type": "generate", "id": 6, "prompt": "x", "max_tokens": 3, "bogus": 1}),
        msgpack.packb({"v": 2, "type": "health"}),
        rep([("type", "generate"), ("id", 1), ("prompt", "hi"), ("max_tokens", 4), ("id", 2)]),
        rep([("type", "resume"), ("id", 4), ("from", "x"), ("from", 5)]),
    ],
    "msg_reply": [
        p({"type": "token", "id": 1, "index": 0, "tokens": [5, 6], "text": "ab"}),
        p({"type": "done", "id": 1, "finish_reason": "length", "usage": usage, "timings": timings}),
        p({"type": "done", "id": 1, "finish_reason": "stop", "usage": usage, "timings": timings, "text": "abc",
           "tokens": [1, 2]}),
        p({"type": "error", "id": 1, "code": "busy", "message": "queue full"}),
        p({"type": "health", "status": "ok", "scheduler": True, "uptime_s": 1.5, "queue": 0}),
        p({"type": "stats", "stats": {"router.requests": 3, "scheduler.steps": 9.5}}),
        p({"type": "models", "models": [{"name": "demo", "vocab": 512, "max_context": 1024}]}),
        rep([("type", "done"), ("id", 1), ("finish_reason", "stop"), ("timings", timings),
             ("usage", Pairs([("prompt_tokens", 3), ("completion_tokens", 4), ("prompt_tokens", 5)]))]),
        rep([("type", "stats"), ("stats", Pairs([("a", 1), ("b", 2), ("a", 3)]))]),
    ],
    "msg_sched": [
        b"\0" + p(dict(type="submit", id=77, client=b"cli-1", cid=5, prompt=[1, 2, 3], max_tokens=8, ignore_eos=False,
                       **samp)),
        b"\0" + p({"type": "cancel", "id": 77}),
        b"\0" + p({"type": "resume", "id": 77, "from": 0}),
        b"\0" + p({"type": "stats", "id": 1}),
        b"\0" + p({"type": "hello"}),
        b"\1" + p({"type": "tokens", "id": 77, "index": 3, "tokens": [9]}),
        b"\1" + p({"type": "done", "id": 77, "finish_reason": "cancel", "usage": usage, "timings": timings}),
        b"\1" + p({"type": "error", "id": 77, "code": "duplicate", "message": "live"}),
        b"\1" + p({"type": "stats", "id": 1, "stats": {"steps": 10, "batch_tokens": 31.5}}),
        b"\1" + p(hello),
        b"\1" + p({"type": "step_tokens", "reqs": struct.pack("<2Q", 77, 78), "index": struct.pack("<2i", 3, 0),
                   "tokens": struct.pack("<2i", 9, 11)}),
        b"\1" + p({"type": "step_tokens", "reqs": [77], "index": [4], "tokens": [12]}),
        b"\0" + rep([("type", "submit"), ("id", 77), ("client", b"cli-1"), ("cid", 5), ("prompt", [1]),
                      ("max_tokens", 8), ("cid", 6)]),
        b"\1" + rep([("type", "tokens"), ("id", 77), ("id", 78), ("index", 3), ("tokens", [9])]),
        b"\1" + p(hello_eos),
    ],
    "msg_exec": [
        b"\0" + p({"type": "hello"}),
        b"\0" + p({"type": "step", "id": 1000, "instance": 99, "seqs": [
            dict(req=1, pos0=0, tokens=[1, 2, 3], blocks=[0], sample=True, n_sampled=0, **samp),
            {"req": 2, "pos0": 17, "tokens": [4], "blocks": [1, 2], "sample": False}]}),
        b"\1" + p(hello),
        b"\1" + p({"type": "result", "id": 1000, "instance": 99, "reqs": [1, 2], "tokens": [17, -1],
                   "forward_us": 812.5, "sample_us": 3.0}),
        b"\1" + p({"type": "error", "id": 1000, "code": "unavailable", "message": "stale instance"}),
        # the packed form the C encoder writes: int32 / uint64 little-endian in a bin
        b"\0" + p({"type": "step", "id": 1001, "instance": 99, "seqs": [
            {"req": 3, "pos0": 40, "tokens": struct.pack("<2i", 5, 6), "blocks": struct.pack("<3i", 0, 7, 9),
             "sample": True, "temperature": 0.5}]}),
        b"\1" + p({"type": "result", "id": 1001, "instance": 99, "reqs": struct.pack("<2Q", 3, 4),
                   "tokens": struct.pack("<2i", 17, -1)}),
        b"\0" + rep([("type", "step"), ("id", 1002), ("instance", 99),
                      ("seqs", [Pairs([("req", 3), ("pos0", 0), ("tokens", [5]), ("blocks", [0]), ("req", 4)])])]),
        b"\1" + rep([("type", "result"), ("id", 1002), ("instance", 99), ("reqs", [3]), ("tokens", [17]),
                      ("instance", 98)]),
        b"\1" + p(hello_eos),
        # a model with sliding-window layers: its hello, and a step with window tables (-1: freed)
        b"\1" + p(dict(hello, sliding_window=128)),
        b"\0" + p({"type": "step", "id": 1003, "instance": 99, "seqs": [
            {"req": 5, "pos0": 300, "tokens": struct.pack("<2i", 5, 6), "blocks": struct.pack("<19i", *range(19)),
             "win_blocks": struct.pack("<19i", *([-1] * 10 + list(range(20, 29)))), "sample": True},
            {"req": 6, "pos0": 0, "tokens": [7], "blocks": [40], "win_blocks": [41], "sample": False}]}),
    ],
    "msg_prefetch": [
        b"\0" + p({"type": "status", "id": 1}),
        b"\1" + p({"type": "status", "id": 1, "node": 0, "arena": "/strata-demo-arena-0", "bytes": 1 << 30,
                   "state": "ready", "fill_ms": 812.0, "reattached": False, "pid": 4321, "instance": 7}),
        b"\1" + rep([("type", "status"), ("node", 0), ("arena", "/strata-demo-arena-0"), ("bytes", 1 << 30),
                      ("state", "ready"), ("node", 1)]),
    ],
}

for name, seeds in corpora.items():
    d = os.path.join(HERE, "corpus", name)
    os.makedirs(d, exist_ok=True)
    for i, s in enumerate(seeds):
        with open(os.path.join(d, "seed%02d" % i), "wb") as f:
            f.write(s)
    print("%s: %d seeds" % (d, len(seeds)))
