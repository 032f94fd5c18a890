#!/usr/bin/python3
"""`strata pack` / `strata unpack` as a user meets them: help, usage errors, the --force rule,
and broken packed folders, which every loading command must refuse with exit code 2 and one
line naming the file and the field.

Packs the first fixture found in tests/fixtures/*/ref.json (int4 group 32) and breaks copies of
it: wrong version, offset out of range, missing tensor, truncated weight file, missing weight
file. Each broken copy goes through `strata unpack` and `strata eval`. Fails when no fixture is
found.
  --strata PATH --fixtures DIR
"""

import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

FAILS = []


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    print("%s %s" % ("ok  " if cond else "FAIL", what))
    if not cond:
        FAILS.append(what)


def expect(cmd, rc_want, what, *needles):
    rc, out, err = run(cmd)
    text = err.strip()
    good = rc == rc_want and all(n in text for n in needles)
    check(good, "%s: exit %d%s" % (what, rc, (" (want %d)" % rc_want) if rc != rc_want else ""))
    if not good or needles:
        print("     stderr: %s" % (text.replace("\n", "\n             ") or "(empty)"))
        if not good and needles:
            print("     wanted all of: %s" % (needles,))
    return rc, out, err


def put_nan(d):
    """Overwrite the first element of layer 0 expert 0's gate matrix with a NaN, in place."""
    names = ("model.layers.0.block_sparse_moe.experts.0.w1.weight", "model.layers.0.mlp.experts.0.gate_proj.weight",
             "model.layers.0.mlp.experts.gate_up_proj")  # gpt-oss: [E][hidden][2 inter], element 0 is gate row 0
    nan = {"F32": struct.pack("<I", 0x7FC00000), "BF16": struct.pack("<H", 0x7FC0), "F16": struct.pack("<H", 0x7E00)}
    for f in glob.glob(os.path.join(d, "*.safetensors")):
        with open(f, "r+b") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            for name in names:
                if name in hdr and hdr[name]["dtype"] in nan:
                    fh.seek(8 + n + hdr[name]["data_offsets"][0])
                    fh.write(nan[hdr[name]["dtype"]])
                    return True
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strata", required=True)
    ap.add_argument("--fixtures", required=True)
    a = ap.parse_args()
    S = a.strata
    refs = sorted(glob.glob(os.path.join(a.fixtures, "*", "ref.json")))
    if not refs:
        print("FAIL: no fixture (no %s/*/ref.json)" % a.fixtures)
        return 1
    fx = os.path.dirname(refs[0])
    ref = json.load(open(refs[0]))
    toks = ",".join(map(str, ref["tokens"][:8]))

    scratch = os.environ.get("TMPDIR") or ("/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    with tempfile.TemporaryDirectory(prefix="strata-pack-cli-", dir=scratch) as tmp:
        # help and usage
        rc, out, _ = run([S, "pack", "--help"])
        check(rc == 0 and "--format" in out and "--force" in out, "pack --help")
        rc, out, _ = run([S, "unpack", "--help"])
        check(rc == 0 and "PACKED" in out, "unpack --help")
        expect([S, "pack", fx, os.path.join(tmp, "x")], 2, "pack without --format", "--format")
        expect([S, "pack", fx, os.path.join(tmp, "x"), "--format", "int5"], 2, "pack --format int5", "int5")
        expect([S, "pack", fx, os.path.join(tmp, "x"), "--format", "int4", "--group", "48"], 2, "pack --group 48",
               "--group")
        expect([S, "pack", os.path.join(tmp, "nothing"), os.path.join(tmp, "x"), "--format", "bf16"], 2,
               "pack of a missing folder", "nothing")
        check(not os.path.exists(os.path.join(tmp, "x")), "failed packs leave no output folder")
        expect([S, "unpack", fx, os.path.join(tmp, "u")], 2, "unpack of an HF folder", "not a packed model")

        # a good pack, and the --force rule
        good = os.path.join(tmp, "good")
        rc, out, err = run([S, "pack", fx, good, "--format", "int4", "--group", "32"])
        check(rc == 0, "pack int4 g32 (exit %d)" % rc)
        check("layer" in err and "MB/s" in err and "verified" in err, "pack shows per-layer progress, MB/s, verify")
        check("bits/weight" in out, "pack prints a summary with bits per weight")
        if rc != 0:
            print(err)
            return 1
        mtime = os.path.getmtime(os.path.join(good, "strata-manifest.json"))
        expect([S, "pack", fx, good, "--format", "bf16", "--quiet"], 2, "pack onto an existing folder",
               "already exists", "--force")
        check(os.path.getmtime(os.path.join(good, "strata-manifest.json")) == mtime,
              "refused pack left the folder alone")
        again = os.path.join(tmp, "again")
        shutil.copytree(good, again)
        expect([S, "pack", fx, again, "--format", "bf16", "--quiet", "--force"], 0, "pack --force over a packed folder")
        m = json.load(open(os.path.join(again, "strata-manifest.json")))
        check(m["format"] == "bf16", "--force rewrote the folder (format %s)" % m["format"])
        expect([S, "pack", again, again, "--format", "int8", "--force"], 2, "pack a folder onto itself", "HF_DIR")
        u = os.path.join(tmp, "u")
        expect([S, "unpack", good, u], 0, "unpack")
        expect([S, "unpack", good, u], 2, "unpack onto an existing folder", "already exists")
        expect([S, "unpack", good, u, "--force"], 0, "unpack --force")
        # a packed folder can itself be the source of a pack
        expect([S, "pack", good, os.path.join(tmp, "repack"), "--format", "int8", "--quiet"], 0, "repack")
        expect([S, "eval", good, "--tokens", toks, "--logits-out", os.path.join(tmp, "l.f32")], 0, "eval packed")

        # a source with a NaN weight in an expert: refused, naming the tensor
        nan_src = os.path.join(tmp, "nan-src")
        shutil.copytree(fx, nan_src)
        check(put_nan(nan_src), "planted a NaN in expert 0 of layer 0")
        expect([S, "pack", nan_src, os.path.join(tmp, "nan-out"), "--format", "int8", "--quiet"], 2,
               "pack of a model with a NaN weight", "layers.0.experts.0.gate", "NaN")
        check(not os.path.exists(os.path.join(tmp, "nan-out")), "a failed pack removes the folder it created")

        # broken copies: exit 2 and one line naming the file and the field
        man = json.load(open(os.path.join(good, "strata-manifest.json")))

        def broken(tag, edit):
            d = os.path.join(tmp, "bad-" + tag)
            shutil.copytree(good, d)
            mm = json.loads(json.dumps(man))
            edit(d, mm)
            with open(os.path.join(d, "strata-manifest.json"), "w") as f:
                json.dump(mm, f, indent=1)
            return d

        def set_version(d, mm):
            mm["version"] = 99

        def offset_out(d, mm):
            t = next(t for t in mm["tensors"] if ".experts." in t["name"])
            t["offset"] = 1 << 40

        def drop_tensor(d, mm):
            mm["tensors"] = [t for t in mm["tensors"] if t["name"] != "layers.0.wo"]

        def truncate(d, mm):
            f = next(f for f in mm["files"] if f["name"].startswith("experts-"))
            with open(os.path.join(d, f["name"]), "r+b") as fh:
                fh.truncate(f["bytes"] - 100)

        def remove_file(d, mm):
            os.unlink(os.path.join(d, "resident.bin"))

        cases = [
            ("version", set_version, ["strata-manifest.json", "'version'"]),
            ("offset", offset_out, ["strata-manifest.json", ".offset'", "outside file"]),
            ("missing", drop_tensor, ["strata-manifest.json", "layers.0.wo", "missing"]),
            ("truncated", truncate, ["experts-", "'files[", "truncated"]),
            ("nofile", remove_file, ["resident.bin", "'files[0].name'"]),
        ]
        for tag, edit, needles in cases:
            d = broken(tag, edit)
            for cmd in ([S, "unpack", d, os.path.join(tmp, "u-" + tag)],
                        [S, "eval", d, "--tokens", toks, "--logits-out", os.path.join(tmp, "l-" + tag)]):
                rc, out, err = expect(cmd, 2, "%s on %s" % (cmd[1], tag), *needles)
                lines = [l for l in err.strip().split("\n") if l]
                check(len(lines) == 1, "%s on %s: one line of error (%d)" % (cmd[1], tag, len(lines)))

    print("%s (%d failed)" % ("PASS" if not FAILS else "FAIL", len(FAILS)))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
