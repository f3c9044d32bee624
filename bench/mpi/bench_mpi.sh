#!/usr/bin/env bash
# The MPI backend against the emulator on one machine (docs/mpi.md section 6): two steps of the tiny-e64 mesh, for
# each configuration RANKS:PROCS run
#   (a) as PROCS MPI processes x RANKS/PROCS ranks each (fibers),
#   (b) on the in-process emulator (baseline), same mesh,
# in the same run of this script, printing per run the wall time per step, the CPU time (user + sys) of the whole
# run (every process, mpirun's included) and of step 2 alone (as trident prints it: the steady step, without the
# first step's setup and first touch of memory), the peak RSS summed over processes and the same with the pages
# every process maps (program, libraries, MPI's shared memory) counted once, as the machine holds them; then the
# ratios MPI / emulator. The goals of docs/mpi.md section 6 are on CPU per step (step 2) and RSS counted once; the
# others are printed beside them. The machine may be shared, so CPU is the steadier measure than wall time. PAIRS > 1
# runs the two alternately PAIRS times per configuration and prints the medians of the pairs' ratios (one run's CPU
# moves by +-15% here, most of it the kernel's first touch of fresh pages).
# Usage: bench/mpi/bench_mpi.sh [TRIDENT=build/release/trident] [CONFIGS="256:1 1024:8"] [PAIRS=1]
# RANKS: 1024 (mesh d_rep=16,fsdp=4,cp=16,e_fsdp=16,ep=64, 64 sequences), 256 (d_rep=4,...,e_fsdp=4, 16) or 64.
set -euo pipefail
trident=${1:-build/release/trident}
configs=${2:-"256:1 1024:8"}
pairs=${3:-1}
[[ "$pairs" =~ ^[1-9][0-9]?$ ]] || { echo "bench_mpi: PAIRS must be 1-99 (got $pairs)" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
mpirun=$here/../../tests/mpi/mpirun.sh
command -v /usr/bin/time >/dev/null || { echo "bench_mpi: needs /usr/bin/time (GNU time)" >&2; exit 1; }
out=$(mktemp)
tim=$(mktemp)
trap 'rm -f "$out" "$tim"' EXIT

# run NAME CMD...: prints one line NAME step_s cpu_s step2_cpu_s rss_mib rss_once_mib loss
run() {
  local name=$1
  shift
  /usr/bin/time -o "$tim" -f "%U %S" "$@" >"$out" 2>&1 ||
    { echo "bench_mpi: $name failed:" >&2; grep -m 3 "error" "$out" >&2; exit 1; }
  local wall rss once loss cpu step2
  wall=$(sed -n 's/^wall time [0-9.]* s (\([0-9.]*\) s\/step).*/\1/p' "$out")
  step2=$(sed -n 's/^CPU time .*; step 2: \([0-9.]*\) s\/step).*/\1/p' "$out")
  rss=$(sed -n -e 's/^peak RSS per process: .* processes \([0-9.]*\) MiB.*/\1/p' \
               -e 's/^peak RSS of this process: \([0-9.]*\) MiB.*/\1/p' "$out")
  once=$(sed -n -e 's/^peak RSS per process: .*; \([0-9.]*\) MiB with shared pages counted once.*/\1/p' \
                -e 's/^peak RSS of this process: \([0-9.]*\) MiB.*/\1/p' "$out")
  loss=$(sed -n 's/^step .*loss \([0-9.]*\) .*/\1/p' "$out" | tail -1)
  cpu=$(awk 'END { printf "%.2f", $1 + $2 }' "$tim")
  [ -n "$wall" ] && [ -n "$step2" ] && [ -n "$rss" ] && [ -n "$once" ] && [ -n "$loss" ] ||
    { echo "bench_mpi: $name: could not read the figures from its output" >&2; exit 1; }
  echo "$name $wall $cpu $step2 $rss $once $loss"
}

# ratio X Y: X / Y to 3 decimals
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { printf "%.3f", x / y }'; }

# A process with many ranks on an oversubscribed machine can go seconds without its progress thread being
# scheduled: a longer peer timeout than the default 6 s keeps that from counting as a dead process.
mpi=(--backend mpi --mpi-peer-timeout 120)
echo "bench_mpi: tiny-e64, seq-len 256, EP chunks 2, 2 steps; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
printf "%-10s %-6s %8s %8s %12s %9s %10s %10s\n" run ranks "s/step" "CPU s" "step 2 CPU s" "RSS MiB" "RSS once" \
  "loss"
summary=()
for c in $configs; do
  ranks=${c%%:*}
  procs=${c##*:}
  case "$ranks" in
    1024) mesh="d_rep=16,fsdp=4,cp=16,e_fsdp=16,ep=64" seqs=64 ;;
    256) mesh="d_rep=4,fsdp=4,cp=16,e_fsdp=4,ep=64" seqs=16 ;;
    64) mesh="d_rep=1,fsdp=4,cp=16,e_fsdp=1,ep=64" seqs=4 ;;
    *) echo "bench_mpi: RANKS must be 64, 256 or 1024 (got $c)" >&2; exit 1 ;;
  esac
  [ "$procs" -ge 1 ] && [ $((ranks % procs)) -eq 0 ] || { echo "bench_mpi: PROCS must divide RANKS ($c)" >&2; exit 1; }
  args=(emulate --preset tiny-e64 --mesh "$mesh" --seqs "$seqs" --seq-len 256 --chunks 2 --steps 2)
  cpu_r=() s2_r=() step_r=() rss_r=() once_r=()
  for ((p = 0; p < pairs; ++p)); do
    a=$(run "${procs}x$((ranks / procs))" "$mpirun" -np "$procs" "$trident" "${args[@]}" "${mpi[@]}" \
          --ranks-per-process $((ranks / procs)))
    b=$(run "emulator" "$trident" "${args[@]}")
    for l in "$a" "$b"; do
      read -r n w cp c2 r o lo <<<"$l"
      printf "%-10s %-6s %8s %8s %12s %9s %10s %10s\n" "$n" "$ranks" "$w" "$cp" "$c2" "$r" "$o" "$lo"
    done
    read -r na wa ca c2a ra oa la <<<"$a"
    read -r _ wb cb c2b rb ob lb <<<"$b"
    [ "$la" = "$lb" ] || echo "bench_mpi: WARNING: losses differ ($la / $lb)"
    cpu_r+=("$(ratio "$ca" "$cb")")
    s2_r+=("$(ratio "$c2a" "$c2b")")
    step_r+=("$(ratio "$wa" "$wb")")
    rss_r+=("$(ratio "$ra" "$rb")")
    once_r+=("$(ratio "$oa" "$ob")")
  done
  # median LIST...: the middle value (the mean of the two middle ones for an even count) and the range
  median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'; }
  if [ "$pairs" -eq 1 ]; then
    summary+=("ratio $na / emulator: CPU per step (step 2) ${s2_r[0]:0:4}, RSS counted once ${once_r[0]:0:4}; \
whole run's CPU ${cpu_r[0]:0:4}, s/step ${step_r[0]:0:4}, RSS summed ${rss_r[0]:0:4}")
  else
    summary+=("ratio $na / emulator, medians of $pairs pairs: CPU per step (step 2) $(median "${s2_r[@]}"), RSS \
counted once $(median "${once_r[@]}"); whole run's CPU $(median "${cpu_r[@]}"), s/step $(median "${step_r[@]}"), \
RSS summed $(median "${rss_r[@]}")")
  fi
done
printf "%s\n" "${summary[@]}"
