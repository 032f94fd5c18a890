#!/usr/bin/python3
"""test_chat.py - `strata chat` driven through a pseudo-terminal: two turns (the second one's prompt
carries the first turn and its answer: more prompt tokens), /reset (the next turn's prompt is as
short as the first's again), then Ctrl-D, which ends it with exit 0. The group is found without
--endpoint (a temporary STRATA_REGISTRY).

  text      the demo group (no chat template): each turn continues the conversation's text, as
            the chat says at the start; `strata client --messages` is refused by the router
            (exit 2, "no chat template"); with --endpoint only (no model folder known) the first
            turn finds out from the router, says so once and goes on as text
  template  the demo model with a ChatML-like chat_template.jinja added, packed by `strata pack`
            (which carries the template along): the chat goes as messages, which the router
            renders (the first turn's prompt_tokens are the rendered text's tokens);
            `strata client --messages` (file and stdin), --no-add-generation-prompt,
            --template-vars, and its errors for bad JSON and a JSON value that is not an array

usage: test_chat.py --strata BIN [text|template]
"""
import argparse
import json
import os
import pty
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time


def read_until(fd, want, timeout=60):
    """Output from the pty up to and including the first match of regex want."""
    buf, t0 = b"", time.time()
    while time.time() - t0 < timeout:
        r, _, _ = select.select([fd], [], [], 0.5)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            if re.search(want, buf):
                return buf
    raise RuntimeError("no %r in the chat's output within %d s: %r" % (want, timeout, buf[-400:]))


# The template of the "template" case: ChatML-like, on one line (so that the rendered text's tokens
# can be counted with `strata tokenize`, which reads line by line), with one extra variable.
TEMPLATE = ("{% if prefix is defined %}{{ prefix }}{% endif %}"
            "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|>{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def render(messages, add_generation_prompt=True, prefix=None):
    """TEMPLATE rendered, written out by hand."""
    s = prefix or ""
    for m in messages:
        s += "<|im_start|>%s %s<|im_end|>" % (m["role"], m["content"])
    return s + ("<|im_start|>assistant " if add_generation_prompt else "")


def n_tokens(a, model, text, env):
    """The number of tokens of text (one line) without special tokens, by `strata tokenize`."""
    out = subprocess.run([a.strata, "tokenize", model, "--no-special"], input=text + "\n", capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    return len(out.stdout.split())


def chat_pty(a, env, banner):
    """Drive `strata chat` (found through the registry) in a pty; the prompt tokens of its turns."""
    master, slave = pty.openpty()
    p = subprocess.Popen([a.strata, "chat", "--max-tokens", "6", "--stats"], stdin=slave, stdout=slave, stderr=slave,
                         env=env, close_fds=True)
    os.close(slave)
    try:
        read_until(master, banner + rb".*\n(.|\n)*> ")
        prompts = []
        for turn in (b"Hello there\n", b"And then?\n", b"/reset\n", b"Hello there\n"):
            os.write(master, turn)
            if turn == b"/reset\n":
                read_until(master, rb"forgotten(.|\n)*> ")
                continue
            out = read_until(master, rb"prompt_tokens=(\d+)(.|\n)*> ")
            prompts.append(int(re.search(rb"prompt_tokens=(\d+)", out).group(1)))
        assert prompts[1] > prompts[0], "the second turn did not carry the first: %s" % prompts
        assert prompts[2] == prompts[0], "after /reset the prompt is not the first turn's again: %s" % prompts
        os.write(master, b"\x04")  # Ctrl-D
        rc = p.wait(30)
        assert rc == 0, "exit %d after Ctrl-D" % rc
        return prompts
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)


def client(a, env, args, stdin=None):
    return subprocess.run([a.strata, "client", "--max-tokens", "4", "--stats"] + args, input=stdin, capture_output=True,
                          text=True, timeout=60, env=env)


def prompt_tokens(out):
    m = re.search(r"prompt_tokens=(\d+)", out.stderr)
    assert out.returncode == 0 and m, (out.returncode, out.stderr)
    return int(m.group(1))


def case_text(a, d, env, port):
    rd = os.path.join(d, "run")
    try:
        out = subprocess.run([a.strata, "up", "--demo", "--run-dir", rd, "--name", "chat%d" % os.getpid(), "--port", str(port)],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        prompts = chat_pty(a, env, rb"no chat template")
        # a chat request: the router's refusal
        msgs = os.path.join(d, "m.json")
        with open(msgs, "w") as f:
            json.dump([{"role": "user", "content": "Hello there"}], f)
        out = client(a, env, ["--messages", msgs])
        assert out.returncode == 2 and "invalid_param" in out.stderr and "no chat template" in out.stderr, out
        # no model folder known: the first turn asks the router, which says there is no template
        out = subprocess.run([a.strata, "chat", "--endpoint", "tcp://127.0.0.1:%d" % port, "--max-tokens", "6", "--stats"],
                             input="Hello there\nAnd then?\n", capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out
        assert out.stderr.count("has no chat template") == 1, out.stderr
        got = [int(x) for x in re.findall(r"prompt_tokens=(\d+)", out.stderr)]
        assert got == prompts[:2], "the turns after the fallback differ from the chat's: %s, %s" % (got, prompts)
        print("test_chat text: ok (prompt tokens %s)" % prompts)
    finally:
        subprocess.run([a.strata, "down", "--demo", "--run-dir", rd], capture_output=True, timeout=60, env=env)


def case_template(a, d, env, port):
    out = subprocess.run([a.strata, "demo", "--out", os.path.join(d, "demo")], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    t = os.path.join(d, "t")
    hf, model = os.path.join(t, "hf"), os.path.join(t, "model")
    os.makedirs(t)
    shutil.copytree(os.path.join(d, "demo", "hf"), hf)
    with open(os.path.join(hf, "chat_template.jinja"), "w") as f:
        f.write(TEMPLATE)
    out = subprocess.run([a.strata, "pack", hf, model, "--format", "bf16", "--quiet"], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 0, out.stderr
    with open(os.path.join(model, "chat_template.jinja")) as f:
        assert f.read() == TEMPLATE, "strata pack did not carry chat_template.jinja along"
    ini, rd = os.path.join(t, "strata.ini"), os.path.join(t, "run")
    out = subprocess.run([a.strata, "demo", "--out", t, "--config", ini, "--name", "chatt%d" % os.getpid(), "--run-dir", rd,
                          "--port", str(port)], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    try:
        out = subprocess.run([a.strata, "up", "--config", ini], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        prompts = chat_pty(a, env, rb"has a chat template")
        hello = [{"role": "user", "content": "Hello there"}]
        want = n_tokens(a, model, render(hello), env)
        assert prompts[0] == want, "the first turn's prompt is not the rendered chat: %d tokens, want %d" % (prompts[0], want)
        # strata client --messages: from a file and from stdin, the rendered prompt's tokens
        msgs = os.path.join(d, "m.json")
        with open(msgs, "w") as f:
            json.dump(hello, f)
        assert prompt_tokens(client(a, env, ["--messages", msgs])) == want
        assert prompt_tokens(client(a, env, ["--messages", "-"], stdin=json.dumps(hello))) == want
        n = n_tokens(a, model, render(hello, add_generation_prompt=False), env)
        assert prompt_tokens(client(a, env, ["--messages", msgs, "--no-add-generation-prompt"])) == n
        n = n_tokens(a, model, render(hello, prefix="Be brief. "), env)
        assert prompt_tokens(client(a, env, ["--messages", msgs, "--template-vars", '{"prefix": "Be brief. "}'])) == n
        # what the client refuses before sending anything
        for stdin, args, word in (('[{"role": "user"', [], "not valid JSON"), ('{"role": "user"}', [], "not a JSON array"),
                                  ('[1]', [], "not an object"), (json.dumps(hello), ["--template-vars", "[]"], "not a JSON object"),
                                  (json.dumps(hello), ["--prompt", "x"], "exactly one of")):
            out = client(a, env, ["--messages", "-"] + args, stdin=stdin)
            assert out.returncode == 2 and word in out.stderr, (stdin, args, out.stderr)
        print("test_chat template: ok (prompt tokens %s, the rendered chat's %d)" % (prompts, want))
    finally:
        subprocess.run([a.strata, "down", "--config", ini], capture_output=True, timeout=60, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("case", nargs="?", default="text", choices=("text", "template"))
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="strata-chat-")
    env = dict(os.environ, STRATA_REGISTRY=os.path.join(d, "registry"))
    os.makedirs(env["STRATA_REGISTRY"], mode=0o700)
    port = 20000 + random.randrange(20000)
    try:
        (case_text if a.case == "text" else case_template)(a, d, env, port)
        return 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
