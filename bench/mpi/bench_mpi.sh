#!/usr/bin/env bash
# The MPI backend at scale (docs/mpi.md section 6): one step of the tiny-e64 mesh of RANKS ranks run
#   (a) as PROCS MPI processes x RANKS/PROCS ranks each (threads),
#   (b) as 1 MPI process x RANKS ranks,
#   (c) on the in-process emulator (baseline),
# each in the same run of this script, printing wall time, peak RSS (summed over processes) and the ratios.
# Usage: bench/mpi/bench_mpi.sh [TRIDENT=build/release/trident] [RANKS=1024] [PROCS=8]
# RANKS: 1024 (mesh d_rep=16,fsdp=4,cp=16,e_fsdp=16,ep=64, 64 sequences) or 256 (d_rep=4,...,e_fsdp=4, 16).
set -euo pipefail
trident=${1:-build/release/trident}
ranks=${2:-1024}
procs=${3:-8}
case "$ranks" in
  1024) mesh="d_rep=16,fsdp=4,cp=16,e_fsdp=16,ep=64" seqs=64 ;;
  256) mesh="d_rep=4,fsdp=4,cp=16,e_fsdp=4,ep=64" seqs=16 ;;
  64) mesh="d_rep=1,fsdp=4,cp=16,e_fsdp=1,ep=64" seqs=4 ;;
  *) echo "bench_mpi: RANKS must be 64, 256 or 1024" >&2; exit 1 ;;
esac
[ $((ranks % procs)) -eq 0 ] || { echo "bench_mpi: PROCS must divide RANKS" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
mpirun=$here/../../tests/mpi/mpirun.sh
args=(emulate --preset tiny-e64 --mesh "$mesh" --seqs "$seqs" --seq-len 256 --chunks 2 --steps 1)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# run NAME CMD...: prints one line NAME wall_s total_s rss_mib loss
run() {
  local name=$1
  shift
  local t0 t1
  t0=$(date +%s%N)
  "$@" >"$out" 2>&1 || { echo "bench_mpi: $name failed:" >&2; grep -m 3 "error" "$out" >&2; exit 1; }
  t1=$(date +%s%N)
  local wall rss loss
  wall=$(sed -n 's/^wall time \([0-9.]*\) s.*/\1/p' "$out")
  rss=$(sed -n -e 's/^peak RSS per process: .* processes \([0-9.]*\) MiB.*/\1/p' \
               -e 's/^peak RSS of this process: \([0-9.]*\) MiB.*/\1/p' "$out")
  loss=$(sed -n 's/^step .*loss \([0-9.]*\) .*/\1/p' "$out")
  echo "$name $wall $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e9 }') $rss $loss"
}

echo "bench_mpi: tiny-e64, mesh $mesh ($ranks ranks), $seqs x 256 tokens, EP chunks 2, 1 step; $(nproc) cores, load $(cut -d' ' -f1 /proc/loadavg)"
# A process with hundreds of rank threads on an oversubscribed machine can go seconds without its progress thread
# being scheduled: a longer peer timeout than the default 6 s keeps that from counting as a dead process.
mpi=(--backend mpi --mpi-peer-timeout 120)
a=$(run "${procs}x$((ranks / procs))" "$mpirun" -np "$procs" "$trident" "${args[@]}" "${mpi[@]}" --ranks-per-process $((ranks / procs)))
b=$(run "1x$ranks" "$mpirun" -np 1 "$trident" "${args[@]}" "${mpi[@]}" --ranks-per-process "$ranks")
c=$(run "emulator" "$trident" "${args[@]}")
printf "%-12s %10s %10s %14s %10s\n" run "step s" "total s" "RSS MiB (sum)" loss
for l in "$a" "$b" "$c"; do printf "%-12s %10s %10s %14s %10s\n" $l; done
read -r _ wa ta ra la <<<"$a"
read -r _ wb tb rb lb <<<"$b"
read -r _ wc tc rc lc <<<"$c"
[ "$la" = "$lb" ] && [ "$lb" = "$lc" ] || echo "bench_mpi: WARNING: losses differ ($la / $lb / $lc)"
awk -v wa="$wa" -v wb="$wb" -v wc="$wc" -v ra="$ra" -v rb="$rb" -v rc="$rc" -v p="$procs" -v n="$ranks" 'BEGIN {
  printf "ratio %dx%d / 1x%d: step time %.2f, RSS %.2f\n", p, n / p, n, wa / wb, ra / rb
  printf "ratio %dx%d / emulator: step time %.2f, RSS %.2f;  1x%d / emulator: step time %.2f, RSS %.2f\n",
         p, n / p, wa / wc, ra / rc, n, wb / wc, rb / rc }'
