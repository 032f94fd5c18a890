#!/usr/bin/python3
"""test_http_bad.py - bad requests to strata-http, each answered with its status code and an
OpenAI-shaped error ({"error": {"message", "type", "param", "code"}}), and the service still
answering /health afterwards: malformed JSON, wrong types, values out of range or not supported,
invalid UTF-8, unknown models, paths and methods, missing and wrong keys, wrong content types,
bodies over max_body_bytes (declared and chunked), a prompt over the context, 10,000 messages,
slowloris clients (closed at timeout_s, while others are served), 1,000 connections at once, a
client that drops its stream (canceled upstream).

usage: test_http_bad.py --build DIR --source DIR
"""
import argparse
import json
import os
import resource
import selectors
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import httplib  # noqa: E402

KEY = "sk-test-0123456789"
AUTH = {"Authorization": "Bearer " + KEY}


def check_error(st, h, body, want, code=None, what=""):
    assert st == want, "%s: status %d, wanted %d: %r" % (what, st, want, body[:300])
    assert h.get("content-type", "").startswith("application/json"), (what, h)
    e = json.loads(body)["error"]
    assert isinstance(e["message"], str) and e["message"], (what, e)
    assert isinstance(e["type"], str) and e["type"], (what, e)
    assert "param" in e and "code" in e, (what, e)
    if code:
        assert e["code"] == code, "%s: code %r, wanted %r (%s)" % (what, e["code"], code, e["message"])
    return e


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    g = httplib.HttpGroup(a, http={"api_key": KEY, "max_body_bytes": "1M", "timeout_s": "2", "max_connections": "2048"})
    kinds = 0
    try:
        g.start(timeout=60)
        g.wait_health()

        def post(path, body, headers=None, want=400, code=None, what=None):
            nonlocal kinds
            hd = dict(AUTH)
            hd.update(headers or {})
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            hd.setdefault("Content-Type", "application/json")
            st, h, b = httplib.request(g, "POST", path, body, hd)
            e = check_error(st, h, b, want, code, what or repr(body[:80]))
            kinds += 1
            return e

        C, X = "/v1/completions", "/v1/chat/completions"
        M = [{"role": "user", "content": "hi"}]
        # -- the body as JSON
        post(C, b'{"prompt": ', what="truncated JSON")
        post(C, b"[1, 2]", what="an array body")
        post(C, b'"hello"', what="a string body")
        post(C, b"", what="an empty body")
        post(C, b'{"prompt": "a"} trailing', what="bytes after the object")
        post(C, b'{"prompt": "a", "prompt": "b"}', what="a repeated key")
        post(C, b'{"prompt": "caf\xe9"}', what="invalid UTF-8 in a string")
        post(C, b'{"prompt": "a"\xff}', what="invalid UTF-8 outside strings")
        post(C, b'{"prompt": "a\\u0000b"}', what="a NUL escape")
        post(C, b'{"prompt": "a", "max_tokens": 99999999999999999999999}', what="an integer beyond int64")
        # -- prompts
        post(C, {"max_tokens": 4}, what="no prompt")
        post(C, {"prompt": 5}, what="a number prompt")
        post(C, {"prompt": ""}, what="an empty prompt")
        post(C, {"prompt": ["a", "b"]}, code="unsupported_parameter", what="two prompts")
        post(C, {"prompt": [1, -2]}, what="a negative token id")
        post(C, {"prompt": [1, 100000]}, what="a token id outside the vocab")
        post(C, {"prompt": [1, "x"]}, what="a mixed token array")
        # -- messages
        post(X, {"max_tokens": 4}, what="no messages")
        post(X, {"messages": "hi"}, what="messages not an array")
        post(X, {"messages": []}, what="no message")
        post(X, {"messages": [{"content": "hi"}]}, what="a message without role")
        post(X, {"messages": [{"role": "wizard", "content": "hi"}]}, what="an unknown role")
        post(X, {"messages": [{"role": "user", "content": 5}]}, what="a number content")
        post(X, {"messages": [{"role": "user"}]}, what="a user message without content")
        post(X, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
             code="unsupported_parameter", what="an image part")
        post(X, {"messages": ["hi"]}, what="a message that is a string")
        # -- sampling and limits
        post(C, {"prompt": "a", "max_tokens": 0}, what="max_tokens 0")
        post(C, {"prompt": "a", "max_tokens": "8"}, what="max_tokens a string")
        post(C, {"prompt": "a", "max_tokens": 1.5}, what="max_tokens a float")
        post(C, {"prompt": "a", "temperature": 3}, what="temperature 3")
        post(C, {"prompt": "a", "temperature": "hot"}, what="temperature a string")
        post(C, {"prompt": "a", "top_p": 1.5}, what="top_p 1.5")
        post(C, {"prompt": "a", "top_k": -5}, what="top_k -5")
        post(C, {"prompt": "a", "seed": "s"}, what="seed a string")
        post(C, {"prompt": "a", "stop": ["x"] * 17}, what="17 stop strings")
        post(C, {"prompt": "a", "stop": [""]}, what="an empty stop string")
        post(C, {"prompt": "a", "stop": 5}, what="a number stop")
        post(C, {"prompt": "a", "stop": "x" * 300}, what="a stop string of 300 bytes")
        post(C, {"prompt": "a", "n": 2}, code="unsupported_parameter", what="n 2")
        # -- log-probabilities: OpenAI's ranges and types
        post(X, {"messages": M, "top_logprobs": 3}, what="top_logprobs without logprobs")
        post(X, {"messages": M, "logprobs": True, "top_logprobs": 21}, what="top_logprobs 21")
        post(X, {"messages": M, "logprobs": True, "top_logprobs": -1}, what="top_logprobs -1")
        post(X, {"messages": M, "logprobs": 1}, what="chat logprobs an integer")
        post(C, {"prompt": "a", "logprobs": 6}, what="completion logprobs 6")
        post(C, {"prompt": "a", "logprobs": True}, what="completion logprobs a boolean")
        post(C, {"prompt": "a", "logprobs": 1, "return_tokens_as_token_ids": "yes"}, what="return_tokens_as_token_ids a string")
        post(C, {"prompt": "a", "presence_penalty": 0.5}, code="unsupported_parameter", what="presence_penalty")
        post(C, {"prompt": "a", "frequency_penalty": 1}, code="unsupported_parameter", what="frequency_penalty")
        post(C, {"prompt": "a", "frequency_penalty": 9}, what="frequency_penalty out of range")
        post(C, {"prompt": "a", "logit_bias": {"1": 5}}, code="unsupported_parameter", what="logit_bias")
        post(C, {"prompt": "a", "stream": "yes"}, what="stream a string")
        post(C, {"prompt": "a", "stream_options": {"include_usage": True}}, what="stream_options without stream")
        post(C, {"prompt": "a", "echo": True}, code="unsupported_parameter", what="echo")
        post(X, {"messages": M, "response_format": {"type": "json_object"}}, code="unsupported_parameter", what="json mode")
        post(X, {"messages": M, "tool_choice": "required", "tools": []}, code="unsupported_parameter", what="tool_choice required")
        post(C, {"prompt": "a", "user": 5}, what="user a number")
        post(C, {"prompt": "a", "model": 5}, what="model a number")
        post(C, {"prompt": "a", "model": "gpt-4"}, want=404, code="model_not_found", what="an unknown model")
        # -- the context and big requests
        post(C, {"prompt": "x" * 300, "max_tokens": 4}, code="context_length_exceeded", what="a prompt over the context")
        many = [{"role": "user" if i % 2 == 0 else "assistant", "content": "message %d" % i} for i in range(10000)]
        e = post(X, {"messages": many, "max_tokens": 4}, code="context_length_exceeded", what="10,000 messages")
        big = json.dumps({"prompt": "x" * (1 << 20)}).encode()
        # declared over the limit: refused from the headers, before any of the body is read (the
        # connection then closes, so only the headers are sent here)
        rep = httplib.raw(g, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n" % (KEY.encode(), len(big)))
        head, _, body = rep.partition(b"\r\n\r\n")
        check_error(int(head.split(b" ")[1]), {"content-type": "application/json"} if b"application/json" in head else {}, body, 413,
                    "request_too_large", "a declared body over max_body_bytes")
        kinds += 1
        # chunked, no Content-Length: counted as it arrives
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 65536]), big[i:i + 65536]) for i in range(0, len(big), 65536)) + b"0\r\n\r\n"
        rep = httplib.raw(g, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                          b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" % KEY.encode() + chunks)
        head, _, body = rep.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head[:200]
        assert json.loads(body.split(b"\r\n")[1] if b"chunked" in head.lower() else body)["error"]["code"] == "request_too_large", body[:200]
        kinds += 1
        # -- headers, paths, methods, keys
        post(C, b'{"prompt": "a"}', headers={"Content-Type": "text/plain"}, want=415, what="text/plain")
        post(C, b'prompt=a', headers={"Content-Type": "application/x-www-form-urlencoded"}, want=415, what="a form")
        for method, path, want in (("GET", "/v1/nothing", 404), ("GET", "/", 404), ("POST", "/v2/completions", 404),
                                   ("GET", C, 405), ("PUT", X, 405), ("POST", "/v1/models", 405), ("DELETE", "/health", 405)):
            st, h, b = httplib.request(g, method, path, b"{}" if method in ("POST", "PUT") else None, dict(AUTH))
            check_error(st, h, b, want, None, "%s %s" % (method, path))
            kinds += 1
        for hd, what in (({}, "no key"), ({"Authorization": "Bearer wrong"}, "a wrong key"), ({"Authorization": "Basic " + KEY}, "Basic"),
                         ({"Authorization": "Bearer " + KEY + "x"}, "a longer key")):
            st, h, b = httplib.request(g, "POST", C, {"prompt": "a", "max_tokens": 1}, hd)
            check_error(st, h, b, 401, "invalid_api_key", what)
            assert h.get("www-authenticate") == "Bearer", h
            kinds += 1
        st, h, b = httplib.request(g, "GET", "/v1/models", None, {})
        check_error(st, h, b, 401, "invalid_api_key", "models without a key")
        kinds += 1
        # unknown fields are ignored, as OpenAI does
        st, h, b = httplib.request(g, "POST", C, {"prompt": "a", "max_tokens": 2, "frobnicate": {"x": 1}, "metadata": None}, AUTH)
        assert st == 200, (st, b)
        # -- slowloris: half a request line, half the headers, half a body: closed at timeout_s while others are served
        slow = []
        for part in (b"POST /v1/comp", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bea",
                     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n{\"prompt\""):
            s = socket.create_connection((g.host, g.http_port), timeout=8)
            s.sendall(part)
            slow.append(s)
        t0 = time.time()
        st, _, _ = httplib.request(g, "GET", "/health")
        assert st == 200, st
        for s in slow:
            try:
                data = s.recv(4096)
            except (ConnectionResetError, socket.timeout):
                data = b""
            waited = time.time() - t0
            assert waited < 6, "a stalled connection was kept %.1f s (timeout_s = 2)" % waited
            assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:100]
            s.close()
        kinds += 3
        # -- a malformed request line: libmicrohttpd answers it (status only; not an OpenAI error)
        rep = httplib.raw(g, b"NOT HTTP AT ALL\r\n\r\n")
        assert rep == b"" or rep.split(b" ")[1] in (b"400", b"505"), rep[:100]
        kinds += 1
        # -- a client that drops its stream: canceled upstream
        before = httplib.router_stats(g).get("router.canceled", 0)
        s = socket.create_connection((g.host, g.http_port), timeout=10)
        body = json.dumps({"prompt": "go", "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (KEY.encode(), len(body), body))
        got = b""
        while got.count(b"data: ") < 2:
            got += s.recv(4096)
        s.close()
        t0 = time.time()
        while httplib.router_stats(g).get("router.canceled", 0) <= before:
            assert time.time() - t0 < 10, "no cancel counted after the client left"
            time.sleep(0.1)
        kinds += 1
        # -- 1,000 connections at once, each asking /health
        sel = selectors.DefaultSelector()
        conns, answered, refused = [], 0, 0
        for i in range(1000):
            c = socket.socket()
            c.setblocking(False)
            c.connect_ex((g.host, g.http_port))
            conns.append(c)
            sel.register(c, selectors.EVENT_WRITE, [b""])
        t0 = time.time()
        pending = len(conns)
        while pending and time.time() - t0 < 60:
            for key, ev in sel.select(timeout=1):
                c, buf = key.fileobj, key.data
                if ev & selectors.EVENT_WRITE:
                    try:
                        c.send(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    except OSError:
                        refused += 1
                        pending -= 1
                        sel.unregister(c)
                        continue
                    sel.modify(c, selectors.EVENT_READ, buf)
                    continue
                try:
                    k = c.recv(65536)
                except OSError:
                    k = b""
                buf[0] += k
                if not k:
                    if buf[0].startswith(b"HTTP/1.1 200"):
                        answered += 1
                    else:
                        refused += 1
                    pending -= 1
                    sel.unregister(c)
        for c in conns:
            c.close()
        assert pending == 0, "%d connections without an answer after 60 s" % pending
        assert answered == 1000, "of 1,000 connections %d were answered, %d refused" % (answered, refused)
        kinds += 1
        st, _, _ = httplib.request(g, "GET", "/health")
        assert st == 200, "no /health after the bad requests: %d" % st
        pids = g.pids()
        assert g.svc("http")["restarts"] == 0, "strata-http restarted: %s" % g.svc("http")
        print("test_http_bad: ok: %d kinds of bad request answered; /health 200; strata-http pid %d never restarted" % (kinds, pids["http"]))
        assert kinds >= 40, kinds
        return 0
    except Exception:
        print(g.read_log()[-5000:])
        raise
    finally:
        g.close()


if __name__ == "__main__":
    sys.exit(main())
