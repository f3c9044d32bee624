#!/usr/bin/env python3
"""`trident emulate --json/--trace/--timeline` and `trident train --json`: the JSON parses, holds what
docs/timeline.md section 6 documents, and agrees with the text output (loss per step, the repro line); the trace
file is trace-event JSON (tests/sim/test_timeline.cpp validates the format in depth)."""
import json
import os
import re
import subprocess
import sys

trident, work = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args):
    p = subprocess.run([trident] + args, capture_output=True, text=True, timeout=240)
    if p.returncode != 0:
        print(p.stdout, p.stderr)
        sys.exit(f"trident {' '.join(args)} exited {p.returncode}")
    return p.stdout


def losses(text):
    return [float(m) for m in re.findall(r"^step +\d+/\d+ +loss ([0-9.]+)", text, re.M)]


mesh = "d_rep=1,fsdp=2,cp=2,e_fsdp=2,ep=2"
js, tr, svg = (os.path.join(work, n) for n in ("emulate.json", "emulate.trace.json", "emulate.svg"))
out = run(["emulate", "--preset", "tiny", "--mesh", mesh, "--steps", "2", "--chunks", "2", "--hardware", "h100",
           "--json", js, "--trace", tr, "--timeline", svg])
d = json.load(open(js))
for k in ("schema", "command", "repro", "mesh", "ranks", "steps", "peak_memory_bytes", "collectives", "timeline"):
    check(k in d, f"emulate --json has '{k}'")
check(d["schema"] == "trident.run/1" and d["command"] == "emulate", "schema and command")
check(d["ranks"] == 4 and len(d["peak_memory_bytes"]) == 4, "one peak per rank")
check(all(b > 0 for b in d["peak_memory_bytes"]), "peaks positive")
check([round(s["loss"], 6) for s in d["steps"]] == losses(out), "losses equal the printed ones")
check([s["step"] for s in d["steps"]] == [1, 2], "step numbers")
check(f"repro: {d['repro']}" in out, "the repro line is the printed one")
check("--json" in d["repro"] and "--hardware h100" in d["repro"], "the repro line holds the output flags")
rows = {(c["comm"], c["op"]): c for c in d["collectives"]}
check(rows[("d_rep", "all_reduce")]["noop"] and rows[("d_rep", "all_reduce")]["ranks"] == 1, "d_rep is a no-op")
check(rows[("fsdp*cp", "all_gather")]["bytes"] > 0 and rows[("fsdp*cp", "all_gather")]["exact_bytes"] == 0,
      "weight gathers move the real dtype")
check(rows[("fsdp*cp", "reduce_scatter")]["exact_bytes"] > 0, "gradient reduce-scatters move exact accumulators")
check(all("busbw_GBps" in c for c in d["collectives"]), "times with --hardware")
t = d["timeline"]
check(t["hardware"] == "h100" and t["makespan_s"] > 0 and "ep" in t["exposed"], "timeline summary")
check(abs(t["critical_path"]["compute_s"] + sum(t["critical_path"]["comm_s"].values()) - t["makespan_s"])
      <= 1e-9 * t["makespan_s"], "the critical path sums to the makespan")
check(t["ranks_per_domain"] == 8 and t["mem_peak_bytes"]["max"] >= t["mem_peak_bytes"]["median"] > 0,
      "domain and memory over simulated time")
check("peak device memory over simulated time" in out, "memory over simulated time printed")
check(t["trace_entries"] > 0 and 40 * t["trace_entries"] <= t["trace_bytes"] <= 200 * t["trace_entries"],
      "the trace's memory: 40 bytes per entry at least (parallel/trace.h)")
check(t["planner_dtypes"] is False, "collectives at the run's dtypes by default")
ev = json.load(open(tr))["traceEvents"]
check({e["ph"] for e in ev} == {"M", "X", "s", "f"}, "trace phases")
check(len({e["pid"] for e in ev}) == 4, "one process per rank")
check(open(svg).read().startswith("<svg"), "svg written")

# without --hardware: no timeline, no times; a collective table all the same
run(["emulate", "--preset", "tiny", "--mesh", mesh, "--steps", "1", "--json", js])
d2 = json.load(open(js))
check("timeline" not in d2 and all("busbw_GBps" not in c for c in d2["collectives"]), "no timeline by default")
check(len(d2["collectives"]) == len(d["collectives"]), "same table rows")

tj = os.path.join(work, "train.json")
out = run(["train", "--preset", "tiny", "--steps", "2", "--json", tj])
d = json.load(open(tj))
check(d["command"] == "train" and d["ranks"] == 1 and d["collectives"] == [], "train --json")
check([round(s["loss"], 6) for s in d["steps"]] == losses(out), "train losses")
check(f"repro: {d['repro']}" in out, "train repro")

# --planner-dtypes: the same trace and bytes, the collectives timed at bf16 / fp32 (docs/timeline.md section 2)
pj = os.path.join(work, "planner.json")
run(["emulate", "--preset", "tiny", "--mesh", mesh, "--steps", "2", "--chunks", "2", "--hardware", "h100",
     "--planner-dtypes", "--json", pj])
dp = json.load(open(pj))
check(dp["timeline"]["planner_dtypes"] is True and "--planner-dtypes" in dp["repro"], "--planner-dtypes recorded")
check(dp["timeline"]["trace_entries"] == t["trace_entries"], "the same trace")
rp = {(c["comm"], c["op"]): c for c in dp["collectives"]}
check(all(rp[k]["bytes"] == rows[k]["bytes"] and rp[k]["exact_bytes"] == rows[k]["exact_bytes"] for k in rows),
      "the same recorded bytes")
check(rp[("fsdp*cp", "reduce_scatter")]["sim_seconds"] < rows[("fsdp*cp", "reduce_scatter")]["sim_seconds"],
      "exact reductions timed as fp32 take less time")
check(dp["timeline"]["makespan_s"] <= t["makespan_s"], "no slower at the planner's dtypes")

# bad input: one clear error line naming the flag
p = subprocess.run([trident, "emulate", "--preset", "tiny", "--mesh", mesh, "--hardware", "a100"],
                   capture_output=True, text=True)
check(p.returncode != 0 and "trident: error:" in p.stderr and "--hardware" in p.stderr, "unknown --hardware")
p = subprocess.run([trident, "emulate", "--preset", "tiny", "--mesh", mesh, "--json", "/nonexistent/dir/x.json"],
                   capture_output=True, text=True)
check(p.returncode != 0 and "--json" in p.stderr and "step" not in p.stdout, "unwritable --json fails first")

p = subprocess.run([trident, "emulate", "--preset", "tiny", "--mesh", mesh, "--no-fixed-costs"],
                   capture_output=True, text=True)
check(p.returncode != 0 and "trident: error:" in p.stderr and "--hardware" in p.stderr, "--no-fixed-costs alone")
p = subprocess.run([trident, "emulate", "--preset", "tiny", "--mesh", mesh, "--planner-dtypes"],
                   capture_output=True, text=True)
check(p.returncode != 0 and p.stderr.strip().count("\n") == 0 and "--hardware" in p.stderr, "--planner-dtypes alone")
p = subprocess.run([trident, "emulate", "--preset", "tiny", "--mesh", mesh, "--hardware", "h100",
                    "--ranks-per-domain", "0"], capture_output=True, text=True)
check(p.returncode != 0 and p.stderr.strip().count("\n") == 0 and "--ranks-per-domain 0" in p.stderr,
      "--ranks-per-domain 0: one error line")
p = subprocess.run([trident, "emulate", "--preset", "tiny", "--mesh", mesh, "--timeline-ranks", "2"],
                   capture_output=True, text=True)
check(p.returncode != 0 and "--timeline" in p.stderr, "--timeline-ranks alone")
p = subprocess.run([trident, "emulate", "--preset", "tiny", "--mesh", mesh, "--trace", os.path.join(work, "t.json"),
                    "--backend", "mpi"], capture_output=True, text=True)
check(p.returncode != 0 and "trident: error:" in p.stderr, "--trace with --backend mpi")

print(f"{len(failures)} failures")
sys.exit(1 if failures else 0)
