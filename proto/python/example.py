#!/usr/bin/python3
"""Stream one answer from a running Strata group (start one with `strata up --demo`).

    /usr/bin/python3 proto/python/example.py --prompt "Hello" --max-tokens 32
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from strata_client import DEFAULT_ENDPOINT, StrataClient, StrataError  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--tokens", help="comma-separated token ids instead of --prompt")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stop", action="append", default=[])
    a = ap.parse_args()

    with StrataClient(a.endpoint, timeout=120) as c:
        try:
            print("models:", c.models(), file=sys.stderr)
            kw = dict(max_tokens=a.max_tokens, temperature=a.temperature, top_p=a.top_p, top_k=a.top_k,
                      seed=a.seed, stop=a.stop)
            if a.tokens:
                kw["tokens"] = [int(t) for t in a.tokens.split(",")]
            for ev in c.generate(None if a.tokens else a.prompt, **kw):
                sys.stdout.write(ev["text"] if ev["text"] or not a.tokens else " ".join(map(str, ev["tokens"])) + " ")
                sys.stdout.flush()
            d = c.last_done
            print(file=sys.stdout)
            print("finish=%s usage=%s timings=%s" % (d["finish_reason"], d["usage"], d["timings"]), file=sys.stderr)
        except StrataError as e:
            print("error:", e, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
