#!/usr/bin/env bash
# One optimizer step of the 1 T-parameter MoE (preset kimi-k2) at 1 M tokens of context on 2,048 emulated ranks,
# shapes only (docs/emulator.md section 9), on this machine, replayed on GB200 NVL72 racks of 64 used GPUs with the
# collectives at the planner's dtypes (docs/timeline.md section 2): wall and CPU time, peak resident memory, every
# rank's device peak against the memory estimate, the simulated step time and exposed communication per mesh
# dimension, and the bytes the schedule recorded per mesh dimension against the planner's formulas for the same
# mesh (planner/examples/kimi_k2_nvl72_1m.toml), after the documented dtype conversions (docs/emulator.md section
# 9.4). A benchmark, not a test: it prints; it fails only when the run fails or a device peak exceeds the estimate.
#
# Usage: bench/shapes/bench_shapes.sh [TRIDENT]   (default build/release/trident; about 4-8 minutes, 13.6 GiB)
#        SHAPES_SCALE=small bench/shapes/bench_shapes.sh   (the same model on 128 ranks, 16 K context: seconds;
#        no planner comparison, which is for the 1 M layout)
#        SHAPES_WRITE=1 bench/shapes/bench_shapes.sh   (also puts the output in docs/seeds.md, between the
#        <!--bench_shapes--> markers)
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${1:-build/release/trident}
PY=/usr/bin/python3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [ "${SHAPES_SCALE:-full}" = small ]; then
  mesh=d_rep=2,fsdp=1,cp=64,e_fsdp=2,ep=64 seqs=2 seq=16384
else
  mesh=d_rep=32,fsdp=1,cp=64,e_fsdp=32,ep=64 seqs=32 seq=1048576
fi
cmd=("$T" emulate --preset kimi-k2 --mesh "$mesh" --seqs "$seqs" --seq-len "$seq" --steps 1 --chunks 2 --recompute
     --shapes-only --hardware gb200-nvl72 --ranks-per-domain 64 --planner-dtypes --json "$out/run.json")
echo "bench_shapes: ${cmd[*]}"
/usr/bin/time -f "%e %U %S %M" -o "$out/time" "${cmd[@]}" > "$out/log" 2>&1 || { cat "$out/log"; exit 1; }
"$T" plan planner/examples/kimi_k2_nvl72_1m.toml --json > "$out/plan.json"
status=0
"$PY" - "$out" > "$out/report" <<'PYEOF' || status=$?
import json, statistics, sys
out = sys.argv[1]
run = json.load(open(f"{out}/run.json"))
plan = json.load(open(f"{out}/plan.json"))
wall, user, sys_s, rss_kb = open(f"{out}/time").read().split()
W = run["ranks"]
m = run["mesh"]
print(f"ranks {W}, mesh {m}: wall {float(wall):.1f} s, CPU {float(user) + float(sys_s):.1f} s, "
      f"peak resident {int(rss_kb) / 1024**2:.2f} GiB (this machine)")
peaks = run["device_peak_bytes"]
est = run["device_estimate_bytes"]
ok = max(peaks) <= est
print(f"device peak per rank: max {max(peaks) / 2**30:.1f} GiB, median {statistics.median(peaks) / 2**30:.1f} GiB; "
      f"estimate {est / 2**30:.1f} GiB: {'within' if ok else 'OVER'}", flush=True)
tl = run["timeline"]
print(f"simulated step on {tl['hardware']} ({tl['ranks_per_domain']} ranks per NVLink domain, collectives at the "
      f"planner's dtypes): {tl['makespan_s']:.3f} s; {tl['trace_entries']:,} trace entries "
      f"({tl['trace_entries'] / W:,.0f} per rank, {tl['trace_bytes'] / 2**30:.2f} GiB in memory, "
      f"{tl['trace_bytes'] / tl['trace_entries']:.1f} B each); peak over simulated time max "
      f"{tl['mem_peak_bytes']['max'] / 2**30:.1f} GiB")
print(f"{'exposed communication':24s} {'max over ranks s':>17s} {'critical rank s':>16s} {'busy s':>10s}")
for name, e in tl["exposed"].items():
    print(f"{name:24s} {e['max_s']:17.3f} {e['critical_rank_s']:16.3f} {e['critical_rank_busy_s']:10.3f}")
cp = tl["critical_path"]
print(f"critical path: compute {cp['compute_s']:.3f} s, " +
      ", ".join(f"{k} {v:.3f} s" for k, v in cp["comm_s"].items() if v > 0))
# Per GPU and layer: the run's bytes (fp32 values, 56-byte exact accumulators) in the planner's dtypes (bf16 gathers
# and all-to-alls, fp32 reductions): x 2/4 for fp32 -> bf16, x 4/56 for exact -> fp32.
if W != 2048:
    sys.exit(0 if ok else 1)
coll = {(c["comm"], c["op"]): c for c in run["collectives"]}
L, L_moe = 61, 60
def per(comm, op, key, layers): return coll[(comm, op)][key] / W / layers
P = plan
GB = 1e9
rows = [
  ("e_fsdp all_gather (fwd + bwd), bf16", per("e_fsdp", "all_gather", "bytes", L_moe) / 2,
   2 * P["expert_layer_gb_per_rank"] * GB, "MoE layers; planner: params/61 x (1 - dense) x 2 B / ep, twice"),
  ("e_fsdp reduce_scatter, fp32", per("e_fsdp", "reduce_scatter", "exact_bytes", L_moe) * 4 / 56,
   2 * P["expert_layer_gb_per_rank"] * GB, "planner: the same layer in fp32"),
  ("cp all_gather of KV (fwd + recompute), bf16", per("cp", "all_gather", "bytes", L) / 2,
   2 * P["cp_kv_gb_per_layer"] * GB, "planner: context x 1152 B per token, twice"),
  ("cp reduce_scatter of the key side, fp32", per("cp", "reduce_scatter", "exact_bytes", L) * 4 / 56,
   2 * P["cp_kv_gb_per_layer"] * GB, "planner: the KV in fp32"),
  ("ep all_to_allv (6 passes), bf16", per("ep", "all_to_allv", "bytes", L_moe) / 2,
   P["ep_a2a_gb_per_layer"] * GB, "planner: tokens x top_k x hidden x 2 B x 6"),
]
print(f"{'per GPU and layer':46s} {'emulated GB':>12s} {'planner GB':>12s} {'ratio':>8s}")
for name, got, want, note in rows:
    print(f"{name:46s} {got / GB:12.4f} {want / GB:12.4f} {got / want:8.4f}   {note}")
sys.exit(0 if ok else 1)
PYEOF
cat "$out/report"
if [ "${SHAPES_WRITE:-0}" = 1 ] && [ "${SHAPES_SCALE:-full}" = full ]; then
  "$PY" - "$out/report" docs/seeds.md "${cmd[*]}" <<'PYEOF'
import re, sys
report, doc, cmd = sys.argv[1:]
body = "bench_shapes: " + cmd.replace(re.search(r"--json (\S+)", cmd).group(1), "run.json") + "\n" + open(report).read()
s = open(doc).read()
new = re.sub(r"(<!--bench_shapes-->\n```\n).*?(```\n<!--/bench_shapes-->)", lambda m: m.group(1) + body + m.group(2), s,
             flags=re.S)
if new == s and body not in s:
    sys.exit("bench_shapes: no <!--bench_shapes--> block in " + doc)
open(doc, "w").write(new)
print("bench_shapes: wrote the output into " + doc)
PYEOF
fi
exit $status
