#!/usr/bin/env python3
"""`strata tokenize` against the fixtures' expected ids and decodes (made with HF tokenizers).

    test_cli.py STRATA_BINARY FIXTURE_DIR

Every corpus line without a newline goes through the command in one file: ids with the
post-processor's special tokens (the default) and without (--no-special); then the reference
ids go back through --decode, --decode --keep-special and --decode --stream. Also: a model
folder and a tokenizer.json path, stdin, --help, and errors (exit code 2, field named).
"""
import json
import os
import subprocess
import sys
import tempfile

strata, fixtures = sys.argv[1], sys.argv[2]
failed = 0
checks = 0


def check(cond, msg):
    global failed, checks
    checks += 1
    if not cond:
        failed += 1
        print("FAIL", msg, file=sys.stderr)


def run(args, stdin=None):
    p = subprocess.run([strata, "tokenize"] + args, input=stdin, capture_output=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


corpus = json.load(open(os.path.join(fixtures, "corpus.json")))
lines = [bytes.fromhex(h) for h in corpus["lines"]]
keep = [i for i, l in enumerate(lines) if b"\n" not in l]
tmp = tempfile.mkdtemp(prefix="strata-tok-cli-")
text_path = os.path.join(tmp, "lines.txt")
with open(text_path, "wb") as f:
    f.write(b"\n".join(lines[i] for i in keep) + b"\n")

for name in corpus["tokenizers"]:
    d = os.path.join(fixtures, name)
    exp = json.load(open(os.path.join(d, "expected.json")))["lines"]
    for target, flags, key in ((d, [], "ids"), (os.path.join(d, "tokenizer.json"), ["--no-special"], "plain")):
        rc, out, err = run([target, "--file", text_path] + flags)
        check(rc == 0, f"{name} {flags}: exit {rc}: {err.decode(errors='replace')}")
        got = out.decode().split("\n")
        check(len(got) == len(keep) + 1 and got[-1] == "", f"{name} {flags}: {len(got) - 1} output lines for {len(keep)}")
        bad = 0
        for k, i in enumerate(keep):
            want = " ".join(map(str, exp[i][key]))
            if k >= len(got) or got[k] != want:
                bad += 1
                if bad <= 3:
                    print(f"  {name} line {i}: ours   {got[k] if k < len(got) else None}\n"
                          f"  {name} line {i}: theirs {want}", file=sys.stderr)
        check(bad == 0, f"{name} {flags}: {bad} lines differ from tokenizers")
    # decode the reference ids, for lines whose decodes hold no newline
    dl = [i for i in keep if b"\n" not in bytes.fromhex(exp[i]["dec"])]
    ids_path = os.path.join(tmp, name + ".ids")
    with open(ids_path, "w") as f:
        f.write("".join(" ".join(map(str, exp[i]["ids"])) + "\n" for i in dl))
    for flags, key in ((["--keep-special"], "dec"), ([], "dec_skip"), (["--stream"], "dec_skip"),
                       (["--stream", "--keep-special"], "dec")):
        rc, out, err = run([d, "--decode", "--file", ids_path] + flags)
        check(rc == 0, f"{name} --decode {flags}: exit {rc}: {err.decode(errors='replace')}")
        want = b"".join(bytes.fromhex(exp[i][key]) + b"\n" for i in dl)
        check(out == want, f"{name} --decode {flags}: output differs from tokenizers' decodes")

# stdin, and '-' for stdin
d = os.path.join(fixtures, "bl_qwen2")
exp = json.load(open(os.path.join(d, "expected.json")))["lines"]
rc, out, _ = run([d], stdin=lines[0] + b"\n")
check(rc == 0 and out.decode() == " ".join(map(str, exp[0]["ids"])) + "\n", "stdin input")
rc, out, _ = run([d, "--file", "-"], stdin=lines[0])
check(rc == 0 and out.decode() == " ".join(map(str, exp[0]["ids"])) + "\n", "--file - without a final newline")

# help and errors
rc, out, _ = run(["--help"])
check(rc == 0 and b"usage: strata tokenize" in out, "--help")
rc, _, err = run([os.path.join(tmp, "missing.json"), "--file", text_path])
check(rc == 2 and b"missing.json" in err, f"missing tokenizer: exit {rc} {err!r}")
bad = os.path.join(tmp, "bad.json")
with open(bad, "w") as f:
    json.dump({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}, f)
rc, _, err = run([bad, "--file", text_path])
check(rc == 2 and b"model.merges[0]" in err, f"bad merges: exit {rc} {err!r}")
rc, _, err = run([d, "--decode"], stdin=b"1 2 x\n")
check(rc == 2 and b"line 1" in err, f"bad id line: exit {rc} {err!r}")
rc, _, err = run([d, "--bogus"])
check(rc == 2, "unknown option")

for f in os.listdir(tmp):
    os.unlink(os.path.join(tmp, f))
os.rmdir(tmp)
print(f"tokenizer_cli: {checks} checks, {failed} failed", file=sys.stderr)
sys.exit(1 if failed else 0)
