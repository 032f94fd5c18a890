#!/usr/bin/python3
"""test_chat.py - `strata chat` driven through a pseudo-terminal against the demo group: two turns
(the second one's prompt carries the first turn and its answer: more prompt tokens), /reset (the
next turn's prompt is as short as the first's again), then Ctrl-D, which ends it with exit 0.
The group is found without --endpoint (a temporary STRATA_REGISTRY).

usage: test_chat.py --strata BIN
"""
import argparse
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="strata-chat-")
    env = dict(os.environ, STRATA_REGISTRY=os.path.join(d, "registry"))
    os.makedirs(env["STRATA_REGISTRY"], mode=0o700)
    rd = os.path.join(d, "run")
    port = 20000 + random.randrange(20000)
    try:
        out = subprocess.run([a.strata, "up", "--demo", "--run-dir", rd, "--name", "chat%d" % os.getpid(), "--port", str(port)],
                             capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        master, slave = pty.openpty()
        p = subprocess.Popen([a.strata, "chat", "--max-tokens", "6", "--stats"], stdin=slave, stdout=slave, stderr=slave,
                             env=env, close_fds=True)
        os.close(slave)
        out = read_until(master, rb"no chat template.*\n(.|\n)*> ")
        prompts = []
        for turn in (b"Hello there\n", b"And then?\n", b"/reset\n", b"Hello there\n"):
            os.write(master, turn)
            if turn == b"/reset\n":
                out = read_until(master, rb"forgotten(.|\n)*> ")
                continue
            out = read_until(master, rb"prompt_tokens=(\d+)(.|\n)*> ")
            prompts.append(int(re.search(rb"prompt_tokens=(\d+)", out).group(1)))
        assert prompts[1] > prompts[0], "the second turn did not carry the first: %s" % prompts
        assert prompts[2] == prompts[0], "after /reset the prompt is not the first turn's again: %s" % prompts
        os.write(master, b"\x04")  # Ctrl-D
        rc = p.wait(30)
        assert rc == 0, "exit %d after Ctrl-D" % rc
        os.close(master)
        print("test_chat: ok (prompt tokens %s)" % prompts)
        return 0
    finally:
        subprocess.run([a.strata, "down", "--demo", "--run-dir", rd], capture_output=True, timeout=60, env=env)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
