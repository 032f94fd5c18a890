#!/usr/bin/env python3
"""Chat templates rendered by the C engine against jinja2 itself.

    test_template_diff.py RENDER TEMPLATE_DIR [--cases N] [--only NAME]

For every templates/*.jinja in TEMPLATE_DIR, a model folder is made (chat_template.jinja and a
tokenizer_config.json with that model's special tokens) and N message lists (default 300) are
generated from a fixed seed per template (printed; STRATA_SEED adds to it): with and without
a system message, 1..5 turns, tools and assistant tool calls (arguments as objects and as JSON
strings), tool results, reasoning, text with CJK, emoji, combining marks, right-to-left
scripts, quotes, backslashes, newlines and odd whitespace, empty content, and a share of
malformed lists (wrong role order, missing or null content, ...). add_generation_prompt and
enable_thinking vary. The clock is pinned: TZ=UTC and a fixed Unix time per case.

Each case is rendered with jinja_ref (jinja2 as transformers sets it up) and with
`RENDER --dir` (chat_template_load + chat_template_render). Where jinja2 renders, the C output
must be byte-identical; where jinja2 raises, the C side must fail too, and a message given to
raise_exception must appear in its error. A few failing cases also go through the one-case
mode, which must exit non-zero with an error on stderr.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ["TZ"] = "UTC"
import time  # noqa: E402

time.tzset()
import jinja_ref  # noqa: E402

PROFILES = {
    "mixtral-8x7b-instruct-v0.1": dict(tokens={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, style="alternate"),
    "qwen3": dict(tokens={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, style="qwen"),
    "olmoe-1b-7b-instruct": dict(tokens={"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|padding|>"}, style="plain"),
    "gpt-oss": dict(tokens={"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}, style="harmony"),
    "deepseek-v3": dict(tokens={"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}, style="deepseek"),
    "llama-3.2-instruct": dict(tokens={"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, style="llama"),
    "zephyr": dict(tokens={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, style="plain"),
    "mistral-v3-tools": dict(tokens={"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, style="mistral"),
}
REQUIRED = ["mixtral-8x7b-instruct-v0.1", "qwen3", "olmoe-1b-7b-instruct", "gpt-oss", "deepseek-v3"]

FRAGMENTS = [
    "Hello", "world", "What is the weather in Paris?", "Sure, here you go.", "  leading spaces", "trailing spaces  ",
    "\n", "\n\n", "line one\nline two", "tab\there", "你好，世界", "日本語のテキスト", "한국어", "😀", "🎉👩‍💻", "🇫🇷",
    "e\u0301", "Cafe\u0301", "مرحبا بالعالم", "שלום עולם", "\u200f\u202e", "quote \" inside", "single ' quote",
    "back\\slash", "\\n literal", "{{ not a tag }}", "{% raw %}", "<|im_end|>", "<think>", "</think>",
    "<tool_response>", "</tool_response>", "[INST]", "\u00a0nbsp\u00a0", "\u3000ideographic", "\u2028sep", "\u200bzwsp",
    "null", "0", "-1.5", "x" * 300, "Ünïcödé", "Ω≈ç√∫", "\x01\x02ctl", "end.",
]


def text(rng, allow_empty=True):
    if allow_empty and rng.random() < 0.08:
        return ""
    parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(1, 4))]
    return rng.choice(["", " "]).join(parts)


def json_value(rng, depth=0):
    k = rng.randint(0, 7 if depth < 2 else 4)
    if k == 0:
        return text(rng)
    if k == 1:
        return rng.choice([0, 1, -7, 42, 2**40, -(2**53)])
    if k == 2:
        return rng.choice([0.5, 1.0, -2.25, 1e-7, 123456.789, 3.0e20, 0.1])
    if k == 3:
        return rng.choice([True, False])
    if k == 4:
        return None
    if k in (5, 6):
        return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{i}_{rng.choice(['a', 'é', '键'])}": json_value(rng, depth + 1) for i in range(rng.randint(0, 3))}


def param_schema(rng, depth=0):
    t = rng.choice(["string", "string", "number", "integer", "boolean", "array", "object"] if depth < 2 else ["string", "number", "boolean"])
    p = {"type": t}
    if rng.random() < 0.8:
        p["description"] = text(rng, allow_empty=False)
    if t == "string" and rng.random() < 0.3:
        p["enum"] = [text(rng, allow_empty=False) for _ in range(rng.randint(1, 3))]
    if t == "array":
        p["items"] = param_schema(rng, depth + 1)
    if t == "object" and rng.random() < 0.7:
        p["properties"] = {f"f{i}": param_schema(rng, depth + 1) for i in range(rng.randint(1, 3))}
        p["required"] = [k for k in p["properties"] if rng.random() < 0.5]
    if rng.random() < 0.2:
        p["nullable"] = True
    if rng.random() < 0.2 and t in ("string", "number", "integer", "boolean"):
        p["default"] = {"string": "dflt", "number": 1.5, "integer": 3, "boolean": False}[t]
    return p


def tool_def(rng, i):
    props = {f"arg{j}": param_schema(rng) for j in range(rng.randint(0, 4))}
    fn = {"name": f"tool_{i}_{rng.choice(['get', 'set', 'find'])}", "description": text(rng, allow_empty=False)}
    if props or rng.random() < 0.5:
        fn["parameters"] = {"type": "object", "properties": props, "required": [k for k in props if rng.random() < 0.5]}
    return {"type": "function", "function": fn}


def tool_call(rng, style, tools, idx):
    name = rng.choice(tools)["function"]["name"] if tools and rng.random() < 0.9 else "unknown_tool"
    args = {f"a{j}": json_value(rng) for j in range(rng.randint(0, 3))}
    as_string = style == "deepseek" or (style == "qwen" and rng.random() < 0.4)
    if style == "deepseek" and rng.random() < 0.05:
        as_string = False  # a dict where the template concatenates: jinja2 raises
    fn = {"name": name, "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5) if as_string else args}
    call = {"type": "function", "function": fn}
    if style == "mistral":
        call["id"] = "".join(rng.choice("abcdefghij0123456789") for _ in range(9 if rng.random() < 0.9 else 5))
    elif rng.random() < 0.7:
        call["id"] = f"call_{idx}"
    if style == "qwen" and rng.random() < 0.15:
        call = dict(fn)  # no "function" wrapper: the template accepts both
    return call


def conversation(rng, style, tools):
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "developer" if style == "harmony" and rng.random() < 0.3 else "system", "content": text(rng)})
    nturns = rng.randint(1, 5)
    k = 0
    for t in range(nturns):
        msgs.append({"role": "user", "content": text(rng)})
        if tools is not None and style not in ("alternate", "plain") and rng.random() < 0.45:
            ncalls = 1 if style in ("llama", "harmony") else rng.randint(1, 3)
            calls = [tool_call(rng, style, tools, k + i) for i in range(ncalls)]
            k += ncalls
            a = {"role": "assistant", "tool_calls": calls}
            if style == "deepseek":
                a["content"] = None
            elif style == "harmony":
                r = rng.random()
                if r < 0.3:
                    a["thinking"] = text(rng)
                elif r < 0.6:
                    a["content"] = text(rng)
            elif style == "mistral":
                pass
            else:
                a["content"] = text(rng) if rng.random() < 0.5 else ""
            msgs.append(a)
            for c in calls:
                res = {"role": "tool", "content": text(rng) if rng.random() < 0.8 else json.dumps(json_value(rng))}
                if style == "mistral":
                    res["tool_call_id"] = c.get("id", "x")
                elif "id" in c:
                    res["tool_call_id"] = c["id"]
                if style == "llama" and rng.random() < 0.3:
                    res["content"] = json_value(rng)
                msgs.append(res)
        if t < nturns - 1 or rng.random() < 0.5:
            a = {"role": "assistant", "content": text(rng)}
            if style == "qwen":
                r = rng.random()
                if r < 0.3:
                    a["reasoning_content"] = text(rng)
                elif r < 0.5:
                    a["content"] = "<think>\n" + text(rng) + "\n</think>\n\n" + text(rng)
            if style == "harmony" and rng.random() < 0.4:
                a["thinking"] = text(rng)
            msgs.append(a)
    return msgs


def perturb(rng, msgs):
    """Malformed lists: the reference decides whether they render."""
    kind = rng.randint(0, 8)
    if not msgs:
        return msgs
    i = rng.randrange(len(msgs))
    if kind == 0:
        msgs[i]["role"] = rng.choice(["user", "assistant", "tool", "system", "narrator"])
    elif kind == 1:
        msgs[i].pop("content", None)
    elif kind == 2:
        msgs[i]["content"] = None
    elif kind == 3:
        msgs[i]["content"] = rng.choice([5, 1.5, True, ["list"], {"type": "text", "text": "x"}])
    elif kind == 4:
        msgs.insert(i, {"role": "user", "content": text(rng)})
    elif kind == 5:
        del msgs[i]
    elif kind == 6:
        msgs[:] = []
    elif kind == 7:
        msgs.append({"role": "assistant", "content": "<|channel|>final<|message|>x"})
    else:
        msgs[i]["extra_field"] = json_value(rng)
    return msgs


def make_case(rng, name, style, n):
    tools = None
    if style not in ("alternate", "plain") and rng.random() < 0.5:
        tools = [tool_def(rng, i) for i in range(rng.randint(1, 3))]
    msgs = conversation(rng, style, tools)
    if rng.random() < 0.25:
        msgs = perturb(rng, msgs)
    extra = {}
    if tools is not None:
        extra["tools"] = tools
    if style == "qwen" and rng.random() < 0.7:
        extra["enable_thinking"] = rng.random() < 0.5
    if style == "harmony":
        if rng.random() < 0.3:
            extra["reasoning_effort"] = rng.choice(["low", "medium", "high"])
        if rng.random() < 0.2:
            extra["model_identity"] = text(rng, allow_empty=False)
        if rng.random() < 0.3:
            extra["builtin_tools"] = rng.sample(["browser", "python"], rng.randint(1, 2))
    if style == "llama":
        if rng.random() < 0.3:
            extra["tools_in_user_message"] = rng.random() < 0.5
        if rng.random() < 0.2:
            extra["date_string"] = "01 Jan 2030"
    now = 1700000000 + n * 86400 * 13 + rng.randint(0, 86399)
    return {"messages": msgs, "extra": extra or None, "add_generation_prompt": rng.random() < 0.6, "now": now}


def main():
    render = sys.argv[1]
    tdir = sys.argv[2]
    ncases = 300
    only = None
    args = sys.argv[3:]
    while args:
        a = args.pop(0)
        if a == "--cases":
            ncases = int(args.pop(0))
        elif a == "--only":
            only = args.pop(0)
    base_seed = int(os.environ.get("STRATA_SEED", "0"))
    print(f"seed: STRATA_SEED={base_seed} (added to a fixed seed per template)", file=sys.stderr)
    names = sorted(f[:-6] for f in os.listdir(os.path.join(tdir, "templates")) if f.endswith(".jinja"))
    missing = [r for r in REQUIRED if r not in names]
    if missing:
        print(f"FAIL: templates missing: {missing}")
        return 1
    failures = 0
    total_same = total_err = 0
    tmp = tempfile.mkdtemp(prefix="strata-tmpl-")
    env = dict(os.environ, TZ="UTC")
    for name in names:
        if only and name != only:
            continue
        prof = PROFILES.get(name, dict(tokens={"bos_token": "<s>", "eos_token": "</s>"}, style="plain"))
        src = open(os.path.join(tdir, "templates", name + ".jinja"), encoding="utf-8").read()
        mdir = os.path.join(tmp, name)
        os.makedirs(mdir)
        with open(os.path.join(mdir, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(src)
        cfg = dict(prof["tokens"])
        # one token as an AddedToken object, as many tokenizer_config.json files write them
        k0 = sorted(cfg)[0]
        cfg_json = dict(cfg)
        cfg_json[k0] = {"__type": "AddedToken", "content": cfg[k0], "lstrip": False, "normalized": False,
                        "rstrip": False, "single_word": False}
        cfg_json["model_max_length"] = 32768
        with open(os.path.join(mdir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg_json, f)
        seed = zlib.crc32(name.encode()) + base_seed
        rng = random.Random(seed)
        cases = [make_case(rng, name, prof["style"], i) for i in range(ncases)]
        cpath = os.path.join(tmp, name + ".jsonl")
        with open(cpath, "w", encoding="utf-8") as f:
            for c in cases:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        p = subprocess.run([render, "--dir", mdir, "--cases", cpath], capture_output=True, env=env, timeout=300)
        if p.returncode != 0:
            print(f"FAIL {name}: render exited {p.returncode}: {p.stderr.decode(errors='replace')[:500]}")
            failures += 1
            continue
        results = [json.loads(l) for l in p.stdout.decode().splitlines()]
        if len(results) != len(cases):
            print(f"FAIL {name}: {len(results)} results for {len(cases)} cases")
            failures += 1
            continue
        same = err_both = bad = 0
        first_err_case = None
        for i, (c, r) in enumerate(zip(cases, results)):
            ok, ref = jinja_ref.render_chat(src, cfg, c["messages"], c["extra"], c["add_generation_prompt"], c["now"])
            if ok and r["ok"] and r["out"] == ref:
                same += 1
                continue
            if not ok and not r["ok"]:
                msg = ref.split(": ", 1)[1] if ref.startswith("TemplateError: ") else None
                if msg and msg not in r["error"]:
                    bad += 1
                    if bad <= 3:
                        print(f"FAIL {name} case {i}: raise_exception message lost: want {msg!r}, got {r['error']!r}")
                    continue
                err_both += 1
                if first_err_case is None:
                    first_err_case = c
                continue
            bad += 1
            if bad <= 3:
                print(f"FAIL {name} case {i} (seed {seed}):")
                print("  messages:", json.dumps(c["messages"], ensure_ascii=False)[:1500])
                print("  extra:", json.dumps(c["extra"], ensure_ascii=False)[:500], "agp:", c["add_generation_prompt"])
                print("  jinja2:", "ok" if ok else "error", repr(ref)[:1500])
                print("  C     :", "ok" if r["ok"] else "error", repr(r.get("out", r.get("error")))[:1500])
        # the one-case mode on a failing case: non-zero exit and an error on stderr
        if first_err_case is not None:
            mp, ep = os.path.join(tmp, name + ".m.json"), os.path.join(tmp, name + ".e.json")
            with open(mp, "w", encoding="utf-8") as f:
                json.dump(first_err_case["messages"], f)
            argv = [render, "--dir", mdir, "--messages", mp, "--now", str(first_err_case["now"])]
            if first_err_case["extra"] is not None:
                with open(ep, "w", encoding="utf-8") as f:
                    json.dump(first_err_case["extra"], f)
                argv += ["--extra", ep]
            if first_err_case["add_generation_prompt"]:
                argv.append("--add-generation-prompt")
            q = subprocess.run(argv, capture_output=True, env=env, timeout=60)
            if q.returncode == 0 or b"error" not in q.stderr:
                print(f"FAIL {name}: a failing case exited {q.returncode} with stderr {q.stderr[:200]!r}")
                bad += 1
        status = "ok" if bad == 0 else "FAILED"
        print(f"{name}: {len(cases)} cases: {same} identical, {err_both} refused by both, {bad} different: {status}")
        total_same += same
        total_err += err_both
        failures += bad
        if name in REQUIRED and same < 200:
            print(f"FAIL {name}: only {same} rendered cases compared (want >= 200)")
            failures += 1
    shutil.rmtree(tmp, ignore_errors=True)
    ntmpl = len([n for n in names if not only or n == only])
    print(f"summary: {ntmpl} templates x {ncases} cases: {total_same} identical, {total_err} errors on both sides, "
          f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
