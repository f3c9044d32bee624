#!/usr/bin/env bash
# The MPI backend against the emulator on one machine (docs/mpi.md section 6): one step of the tiny-e64 mesh, for
# each configuration RANKS:PROCS run
#   (a) as PROCS MPI processes x RANKS/PROCS ranks each (fibers),
#   (b) on the in-process emulator (baseline), same mesh,
# in the same run of this script, printing the step's wall time, the whole run's CPU time (user + sys of every
# process, mpirun's included: the machine may be shared, so CPU is the steadier measure), peak RSS (summed over
# processes) and the ratios MPI / emulator. PAIRS > 1 runs the two alternately PAIRS times per configuration and adds
# the medians of the pairs' ratios (one run's CPU moves by +-15% here, most of it the kernel's first touch of fresh
# pages, so a single pair can land on either side of a goal).
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

# run NAME CMD...: prints one line NAME step_s cpu_s rss_mib loss
run() {
  local name=$1
  shift
  /usr/bin/time -o "$tim" -f "%U %S" "$@" >"$out" 2>&1 ||
    { echo "bench_mpi: $name failed:" >&2; grep -m 3 "error" "$out" >&2; exit 1; }
  local wall rss loss cpu
  wall=$(sed -n 's/^wall time \([0-9.]*\) s.*/\1/p' "$out")
  rss=$(sed -n -e 's/^peak RSS per process: .* processes \([0-9.]*\) MiB.*/\1/p' \
               -e 's/^peak RSS of this process: \([0-9.]*\) MiB.*/\1/p' "$out")
  loss=$(sed -n 's/^step .*loss \([0-9.]*\) .*/\1/p' "$out")
  cpu=$(awk 'END { printf "%.2f", $1 + $2 }' "$tim")
  echo "$name $wall $cpu $rss $loss"
}

# A process with many ranks on an oversubscribed machine can go seconds without its progress thread being
# scheduled: a longer peer timeout than the default 6 s keeps that from counting as a dead process.
mpi=(--backend mpi --mpi-peer-timeout 120)
echo "bench_mpi: tiny-e64, seq-len 256, EP chunks 2, 1 step; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
printf "%-10s %-9s %8s %8s %14s %10s\n" run ranks "step s" "CPU s" "RSS MiB (sum)" loss
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
  args=(emulate --preset tiny-e64 --mesh "$mesh" --seqs "$seqs" --seq-len 256 --chunks 2 --steps 1)
  cpu_r=() step_r=() rss_r=()
  for ((p = 0; p < pairs; ++p)); do
    a=$(run "${procs}x$((ranks / procs))" "$mpirun" -np "$procs" "$trident" "${args[@]}" "${mpi[@]}" \
          --ranks-per-process $((ranks / procs)))
    b=$(run "emulator" "$trident" "${args[@]}")
    for l in "$a" "$b"; do
      read -r n w cp r lo <<<"$l"
      printf "%-10s %-9s %8s %8s %14s %10s\n" "$n" "$ranks" "$w" "$cp" "$r" "$lo"
    done
    read -r na wa ca ra la <<<"$a"
    read -r _ wb cb rb lb <<<"$b"
    [ "$la" = "$lb" ] || echo "bench_mpi: WARNING: losses differ ($la / $lb)"
    cpu_r+=("$(awk -v x="$ca" -v y="$cb" 'BEGIN { printf "%.3f", x / y }')")
    step_r+=("$(awk -v x="$wa" -v y="$wb" 'BEGIN { printf "%.3f", x / y }')")
    rss_r+=("$(awk -v x="$ra" -v y="$rb" 'BEGIN { printf "%.3f", x / y }')")
  done
  # median LIST...: the middle value (the mean of the two middle ones for an even count) and the range
  median() { printf "%s\n" "$@" | sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.2f (%.2f-%.2f)", m, v[1], v[NR] }'; }
  if [ "$pairs" -eq 1 ]; then
    summary+=("ratio $na / emulator: CPU ${cpu_r[0]:0:4}, step time ${step_r[0]:0:4}, RSS ${rss_r[0]:0:4}")
  else
    summary+=("ratio $na / emulator, medians of $pairs pairs: CPU $(median "${cpu_r[@]}"), step time \
$(median "${step_r[@]}"), RSS $(median "${rss_r[@]}")")
  fi
done
printf "%s\n" "${summary[@]}"
