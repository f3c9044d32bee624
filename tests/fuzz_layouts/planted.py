#!/usr/bin/env python3
"""A planted bug is found by `trident fuzz` within its default budget and shrunk to a small layout whose printed
repro line fails alone (docs/fuzz.md section 5).

Usage: planted.py TRIDENT WORKDIR NAME -- FUZZ_ARGS...
Runs `trident fuzz FUZZ_ARGS --json WORKDIR/NAME.json`, expects exit 1 and a failure of the bits property shrunk to
at most 4 ranks and 1 step, then runs the failure's repro line (`trident emulate ...`) alone and expects exit 1 with
a MISMATCH line. Prints what it found; exit 1 on any miss.
"""
import json
import os
import shlex
import subprocess
import sys


def main():
    trident, workdir, name = sys.argv[1], sys.argv[2], sys.argv[3]
    args = sys.argv[sys.argv.index("--") + 1:]
    os.makedirs(workdir, exist_ok=True)
    out = os.path.join(workdir, name + ".json")
    p = subprocess.run([trident, "fuzz", *args, "--json", out, "--quiet"], capture_output=True, text=True)
    sys.stdout.write(p.stdout + p.stderr)
    bad = []
    if p.returncode != 1:
        bad.append(f"trident fuzz exited {p.returncode}, expected 1 (a property failed)")
    else:
        j = json.load(open(out))
        f = j["failures"][0] if j["failures"] else None
        if f is None:
            bad.append("no failure in the --json file")
        else:
            print(f"found at case {f['case']}: property {f['property']}, shrunk in {f['shrink_tries']} tries to "
                  f"{f['ranks']} rank(s), {f['steps']} step(s), {f['sequences']} x {f['seq_len']} tokens")
            if f["property"] != "bits":
                bad.append(f"property {f['property']} failed, expected bits")
            if f["ranks"] > 4 or f["steps"] != 1:
                bad.append(f"shrunk to {f['ranks']} ranks and {f['steps']} steps; expected <= 4 ranks, 1 step")
            line = f["repro"]
            if not line.startswith("trident emulate "):
                bad.append(f"repro is not a `trident emulate` line: {line}")
            else:
                argv = shlex.split(line)
                r = subprocess.run([trident, *argv[1:]], capture_output=True, text=True)
                print(f"repro alone: exit {r.returncode}")
                if r.returncode != 1 or "MISMATCH" not in r.stdout:
                    sys.stdout.write(r.stdout + r.stderr)
                    bad.append(f"the repro line exited {r.returncode} without a MISMATCH (expected 1)")
    for b in bad:
        print("FAIL: " + b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
