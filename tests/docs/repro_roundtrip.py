#!/usr/bin/env python3
"""Every command's printed repro line reproduces the run.

For each case: run `trident ARGS` (non-default flags of every kind), take the `repro: trident ...` line it prints,
check that it names every flag given (and the --config path), run it, and demand the same output, line for line,
with wall-clock numbers masked. Then the repro line of the repro run must be the same line (a fixed point).
Usage: repro_roundtrip.py TRIDENT_BINARY REPO_ROOT
"""
import re
import shlex
import subprocess
import sys

CASES = [
    # train from a preset: every run flag and both seeds
    "train --preset tiny-gqa --steps 2 --seqs 2 --seq-len 16 --lr 0.002 --seed 5 --data-seed 3 --token-chunk 8 "
    "--policy bf16 --recompute",
    # train from a config file
    "train --config golden/data/micro.json --steps 1 --seqs 2 --seq-len 16 --policy fp64",
    # emulate from a config file, with the flags EmulateSpec::repro() used to drop (--config, --lr, --data-seed,
    # --token-chunk) and the deferred device
    "emulate --config golden/data/micro.json --tile 4 --seed 9 --mesh d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2 --steps 1 "
    "--seq-len 16 --lr 0.001 --data-seed 5 --token-chunk 8 --chunks 2 --device deferred --device-seed 3 "
    "--check-reference --verbose",
    # emulate from a preset with model overrides, vocabulary slices, the i64 lowering and the hazard checker
    "emulate --preset tiny --mesh fsdp=2,cp=2,e_fsdp=2,ep=2 --steps 2 --experts 4 --top-k 1 --layers 2 "
    "--vocab-chunk 64 --vocab-slices 3 --lower-exact-sum --check-hazards --policy bf16",
    # packed sequences (train and emulate) and a 2D-CP mesh with its NVLink domain size
    "train --preset tiny --steps 2 --seqs 2 --seq-len 16 --docs-per-seq 3",
    "emulate --preset tiny --mesh cp=4,ep=4,cp_inner=2 --nvl 4 --seq-len 64 --steps 1 --docs-per-seq 5 "
    "--check-reference",
    # emulate with the simulated timeline and its output files (docs/timeline.md)
    "emulate --preset tiny --mesh fsdp=2,cp=2,e_fsdp=2,ep=2 --steps 1 --hardware gb200-nvl72 --no-fixed-costs "
    "--json /tmp/trident_repro_roundtrip.json --trace /tmp/trident_repro_roundtrip.trace.json "
    "--timeline /tmp/trident_repro_roundtrip.svg --timeline-ranks 2",
    # selfcheck with both of its flags
    "selfcheck --seed 7 --threads 2",
    # plan with every flag that changes the text report
    "plan planner/examples/nvl72_1m_search.toml --world 128 --top 2 --search",
    # checkpoints: a resumed run's line names its --resume (and --save) source (SETUP made the checkpoints)
    "train --preset tiny --steps 2 --resume /tmp/trident_repro_roundtrip_ck --save /tmp/trident_repro_roundtrip_ck2",
    "emulate --preset tiny --mesh fsdp=2,ep=2 --seqs 8 --steps 1 --resume /tmp/trident_repro_roundtrip_eck",
    # primitive goldens, their check and a paired run of two kernel sets on them
    "golden --preset tiny --mesh fsdp=2,ep=2 --cases-per-op 1 --out /tmp/trident_repro_roundtrip_golden",
    "check /tmp/trident_repro_roundtrip_golden --backend cuda-ref-host --op mm --rank 1",
    "paired cpu cpu-ulp:mm:0 --preset tiny-gqa --seqs 4",
]

# Commands run once before the cases (the checkpoints the resume cases start from).
SETUP = [
    "train --preset tiny --steps 1 --save /tmp/trident_repro_roundtrip_ck",
    "emulate --preset tiny --mesh fsdp=2,ep=2 --seqs 8 --steps 1 --save /tmp/trident_repro_roundtrip_eck",
]

# Wall-clock numbers ("0.08s", "0.75s/step", "wall time 0.08 s (0.08 s/step)") are masked before comparing.
TIMING = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?\s*(?:s/step|s\b|ms\b|us\b)")
# Resident-set sizes of the process ("peak RSS of this process: 21.84 MiB") vary between runs too.
RSS = re.compile(r"(peak RSS[^:]*:).*")


# `paired` prints a row of measured times ("time (s)   0.0897   0.0458   0.510777").
TIME_ROW = re.compile(r"^(time\b[^0-9]*).*")


def mask(line):
    return TIME_ROW.sub(r"\1<times>", RSS.sub(r"\1 <rss>", TIMING.sub("<t>", line)))


def run(trident, root, args):
    p = subprocess.run([trident] + args, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=300)
    return p.returncode, p.stdout


def repro_of(out):
    lines = [l[len("repro: "):] for l in out.splitlines() if l.startswith("repro: ")]
    return lines[0] if lines else None


def main(argv):
    trident, root = argv[1], argv[2]
    failures = 0
    for cmd in SETUP:
        rc, out = run(trident, root, shlex.split(cmd))
        if rc != 0:
            print(f"FAIL setup `trident {cmd}` exited {rc}:\n{out}")
            return 1
    for case in CASES:
        args = shlex.split(case)
        rc, out = run(trident, root, args)
        line = repro_of(out)
        print(f"[ case ] trident {case}\n         repro: {line}")
        if rc != 0 or line is None:
            print(f"FAIL exit {rc} or no repro line; output:\n{out}")
            failures += 1
            continue
        words = shlex.split(line)
        if words[0] != "trident" or words[1] != args[0]:
            print(f"FAIL the repro line does not start with 'trident {args[0]}'")
            failures += 1
            continue
        # Every flag given is in the line (values may be normalised, e.g. the mesh spec), and so is the config path.
        missing = [a for a in args if a.startswith("--") and a not in words]
        if "--config" in args and args[args.index("--config") + 1] not in words:
            missing.append("the --config path")
        if missing:
            print(f"FAIL the repro line lacks {missing}")
            failures += 1
        rc2, out2 = run(trident, root, words[1:])
        # "  ... step 1/3: 10 s so far" lines come from the clock (long steps), not from the run
        a = [mask(l) for l in out.splitlines() if not l.startswith("  ... ")]
        b = [mask(l) for l in out2.splitlines() if not l.startswith("  ... ")]
        if rc2 != rc or a != b:
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"FAIL the repro run differs (exit {rc2} vs {rc}); first different line {diff + 1}:\n"
                  f"  run:   {a[diff] if diff < len(a) else '<end>'}\n  repro: {b[diff] if diff < len(b) else '<end>'}")
            failures += 1
            continue
        print(f"[  ok  ] same output ({len(a)} lines, exit {rc}) and the same repro line")
    print(f"repro round trip: {len(CASES) - failures}/{len(CASES)} cases reproduce")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
