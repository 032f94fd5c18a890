#!/usr/bin/python3
"""Broken MXFP4 checkpoints are refused with one line naming the tensor.

Starts from the gpt_oss_mxfp4 fixture (tests/fixtures, an MXFP4 checkpoint as gpt-oss ships
it) and writes copies with one fault each: blocks or scales of the wrong shape, a scale byte of
0xFF (NaN in e8m0), a missing scale tensor, blocks of the wrong dtype, a quantization method
that is not mxfp4. `strata eval` on each must exit 2 with a single error line that names the
tensor (or the field). The unbroken copy must load, so a fault is what the refusal is about.

usage: test_mxfp4_bad.py --strata BIN --fixtures DIR
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    print("%-4s %s" % ("ok" if cond else "FAIL", what), flush=True)
    if not cond:
        failures.append(what)


def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    hdr = json.loads(raw[8:8 + n])
    meta = hdr.pop("__metadata__", None)
    base = 8 + n
    ts = {k: [v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]]] for k, v in hdr.items()}
    return ts, meta


def write_st(path, ts, meta):
    hdr, off, blobs = {}, 0, []
    if meta is not None:
        hdr["__metadata__"] = meta
    for k in sorted(ts):
        dt, shape, data = ts[k]
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixtures", required=True)
    a = ap.parse_args()
    src = os.path.join(a.fixtures, "gpt_oss_mxfp4")
    ref = json.load(open(os.path.join(src, "ref.json")))
    tokens = ",".join(str(t) for t in ref["tokens"][:4])
    base_ts, meta = read_st(os.path.join(src, "model.safetensors"))
    blk = "model.layers.1.mlp.experts.down_proj_blocks"
    scl = "model.layers.0.mlp.experts.gate_up_proj_scales"
    assert blk in base_ts and scl in base_ts, sorted(base_ts)[:8]

    def bad_scale(ts):
        dt, shape, data = ts[scl]
        ts[scl] = [dt, shape, data[:5] + b"\xff" + data[6:]]

    def short_blocks(ts):
        dt, shape, data = ts[blk]
        row = shape[2] * shape[3]
        ts[blk] = [dt, [shape[0], shape[1] - 1] + shape[2:], data[:len(data) - shape[0] * row]]

    def scales_shape(ts):
        dt, shape, data = ts[scl]
        ts[scl] = [dt, [shape[0], shape[1] * shape[2]], data]

    def no_scales(ts):
        del ts[scl]

    def blocks_dtype(ts):
        dt, shape, data = ts[blk]
        ts[blk] = ["I8", shape, data]

    cases = [("scale 0xFF", bad_scale, None, [scl, "0xFF"]),
             ("blocks with a row missing", short_blocks, None, [blk]),
             ("scales of the wrong rank", scales_shape, None, [scl]),
             ("scales missing", no_scales, None, [scl, "missing"]),
             ("blocks of dtype I8", blocks_dtype, None, [blk, "I8"]),
             ("quant_method fp8", None, {"quant_method": "fp8"}, ["quantization_config.quant_method", "fp8"]),
             ("quantization_config a string", None, "mxfp4", ["quantization_config"])]
    with tempfile.TemporaryDirectory(prefix="strata-mxfp4-bad-") as tmp:
        ok_dir = os.path.join(tmp, "ok")
        shutil.copytree(src, ok_dir)
        write_st(os.path.join(ok_dir, "model.safetensors"), {k: list(v) for k, v in base_ts.items()}, meta)
        r = subprocess.run([a.strata, "eval", ok_dir, "--tokens", tokens, "--logits-out", os.path.join(tmp, "ok.logits")], capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, "the rewritten, unbroken copy loads (exit %d: %s)" % (r.returncode, r.stderr.strip()[-300:]))
        for i, (what, fault, qc, want) in enumerate(cases):
            d = os.path.join(tmp, "case%d" % i)
            shutil.copytree(src, d)
            ts = {k: list(v) for k, v in base_ts.items()}
            if fault:
                fault(ts)
            write_st(os.path.join(d, "model.safetensors"), ts, meta)
            if qc is not None:
                cfg = json.load(open(os.path.join(d, "config.json")))
                cfg["quantization_config"] = qc
                json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
            r = subprocess.run([a.strata, "eval", d, "--tokens", tokens, "--logits-out", d + ".logits"], capture_output=True, text=True, timeout=120)
            lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
            check(r.returncode == 2, "%s: exit %d (want 2)" % (what, r.returncode))
            check(len(lines) == 1 and all(w in lines[0] for w in want),
                  "%s: one line naming %s: %r" % (what, " and ".join(want), r.stderr.strip()[:400]))
    print("test_mxfp4_bad: %d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
