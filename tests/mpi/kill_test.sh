#!/usr/bin/env bash
# A process of an MPI run dies (SIGKILL) or hangs (SIGSTOP) mid-run: every other process must exit non-zero within
# 10 s with an error naming the lost rank. Usage: kill_test.sh TRIDENT MPIRUN KILL|STOP
set -u
trident=$1 mpirun=$2 sig=$3
out=$(mktemp)
# --enable-recovery: mpirun would otherwise end the whole job as soon as one process dies, so the survivors' own
# detection (heartbeats) would not be what is tested. Each process prints its exit code ("exit RANK CODE").
# A marker in every process's environment: the victim is searched among this run's processes only (another run of
# this test, or any other MPI job on the machine, also has a process with OMPI_COMM_WORLD_RANK=2).
tag="trident-kill-test-$$-$sig"
"$mpirun" -np 4 --enable-recovery -x TRIDENT_KILL_TEST_TAG="$tag" sh -c '"$0" "$@"; echo "exit $OMPI_COMM_WORLD_RANK $?"' \
  "$trident" emulate --backend mpi --mesh fsdp=2,cp=2,e_fsdp=2,ep=2 --steps 100000 >"$out" 2>&1 &
mp=$!
cleanup() {
  [ -n "${victim:-}" ] && kill -9 "$victim" 2>/dev/null
  kill -9 "$mp" 2>/dev/null
  rm -f "$out"
}
trap cleanup EXIT
for _ in $(seq 600); do grep -q "step   2/" "$out" && break; sleep 0.1; done
grep -q "step   2/" "$out" || { echo "run did not start:"; cat "$out"; exit 1; }
victim=""
for d in /proc/[0-9]*; do  # the trident process of this run whose environment says rank 2
  [ "$(readlink "$d/exe" 2>/dev/null)" = "$(readlink -f "$trident")" ] || continue
  env_d=$(tr '\0' '\n' <"$d/environ" 2>/dev/null)
  grep -qx "TRIDENT_KILL_TEST_TAG=$tag" <<<"$env_d" && grep -qx OMPI_COMM_WORLD_RANK=2 <<<"$env_d" && victim=${d#/proc/}
done
[ -n "$victim" ] || { echo "no process with rank 2 among the children of mpirun $mp"; exit 1; }
t0=$(date +%s%N)
kill -"$sig" "$victim"
survivors_done() { for r in 0 1 3; do grep -q "^exit $r " "$out" || return 1; done; }
for _ in $(seq 150); do survivors_done && break; sleep 0.1; done
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
t=$(awk -v ms="$ms" 'BEGIN { printf "%.1f", ms / 1000 }')
echo "--- output (SIG$sig to rank 2 after step 2; the other processes ended after $t s)"
grep -v "^step " "$out" | grep -v "PMIX ERROR" | head -40
survivors_done || { echo "FAIL: some other process was still running 15 s after rank 2 got SIG$sig"; exit 1; }
for r in 0 1 3; do
  grep -q "^exit $r [1-9]" "$out" || { echo "FAIL: rank $r exited with code 0"; exit 1; }
done
n=$(grep -c "trident: error: .*rank 2 (process 2) sent nothing for" "$out")
[ "$n" -ge 3 ] || { echo "FAIL: $n error lines name rank 2, want one per surviving process (3)"; exit 1; }
[ "$ms" -lt 10000 ] || { echo "FAIL: took $t s (limit 10 s)"; exit 1; }
echo "PASS: the 3 other processes exited non-zero naming rank 2 within $t s"
