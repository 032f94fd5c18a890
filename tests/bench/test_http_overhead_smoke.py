#!/usr/bin/python3
"""test_http_overhead_smoke.py - bench/http_overhead.py end to end on a tiny run (the demo model,
1 and 2 streams, one round, a few tokens), with each client (bench/stream_client, and the
script's own Python loop): it exits 0 and its JSON has the machine, the targets and, per
concurrency, every figure. No speed target is checked here (bench/README.md).

usage: test_http_overhead_smoke.py --build DIR --source DIR
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    bench = os.path.join(a.source, "bench", "http_overhead.py")
    for client in ("c", "python"):
        with tempfile.TemporaryDirectory(prefix="strata-httpbench-test-") as d:
            out_json = os.path.join(d, "out.json")
            r = subprocess.run([sys.executable, bench, "--build", a.build, "--concurrency", "1,2", "--rounds", "1",
                                "--ttft-samples", "3", "--max-tokens", "6", "--threads", "1", "--client", client, "--json", out_json],
                               capture_output=True, text=True, timeout=240)
            assert r.returncode == 0, "%s client: exit %d\n%s\n%s" % (client, r.returncode, r.stdout, r.stderr)
            assert "| streams |" in r.stdout, r.stdout
            with open(out_json) as f:
                doc = json.load(f)
        assert doc.get("client") == client, doc.get("client")
        check(doc)
    return 0


def check(doc):
    for k in ("bench", "date", "commit", "command", "machine", "model", "backend", "request", "targets", "results", "meets_targets"):
        assert k in doc, "no %r in the JSON" % k
    assert doc["bench"] == "http_overhead" and isinstance(doc["meets_targets"], bool)
    for k in ("desc", "cpu", "cpus", "ram_bytes", "hostname", "kernel"):
        assert k in doc["machine"], "no machine.%s" % k
    assert doc["targets"] == {"per_token_added_p50_us": 50.0, "ttft_added_p50_ms": 1.0}, doc["targets"]
    assert [r["concurrency"] for r in doc["results"]] == [1, 2], doc["results"]
    for row in doc["results"]:
        for k in ("per_token_added_us", "ttft_added_ms", "ttft_ms", "tpot_ms", "step_offsets", "meets_targets",
                  "twins_with_different_text", "streams_per_path", "ttft_samples"):
            assert k in row, "no %r in the row of %d streams" % (k, row["concurrency"])
        pt = row["per_token_added_us"]
        assert pt["n"] > 0 and isinstance(pt["p50"], float) and isinstance(pt["p99"], float), pt
        assert all(isinstance(row["ttft_added_ms"][q], float) for q in ("p50", "p99")), row["ttft_added_ms"]
        for path in ("http", "zmq"):
            # one-path runs until each path has --ttft-samples 3 first tokens: 3 runs of 1 stream, 2 of 2
            want = row["concurrency"] * -(-3 // row["concurrency"])
            assert row["ttft_ms"][path]["n"] == want and row["ttft_samples"] == want, row
            assert row["ttft_ms"][path]["p50"] > 0, row["ttft_ms"]
            # tokens that reach a busy client together share one poll's stamp: a gap of 0 is a real figure
            assert row["tpot_ms"][path]["n"] > 0 and row["tpot_ms"][path]["p50"] >= 0, row["tpot_ms"]
        assert sum(row["step_offsets"].values()) == row["streams_per_path"], row["step_offsets"]
        assert set(row["meets_targets"]) == set(doc["targets"]), row["meets_targets"]
    print("test_http_overhead_smoke: %s client ok (%s)" % (doc["client"], "; ".join("%d streams: %.1f us, %.3f ms" % (
        r["concurrency"], r["per_token_added_us"]["p50"], r["ttft_added_ms"]["p50"]) for r in doc["results"])))


if __name__ == "__main__":
    sys.exit(main())
