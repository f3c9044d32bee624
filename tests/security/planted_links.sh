#!/usr/bin/env bash
# Every writer of the CLI with symbolic links planted where another local user could put them: at the output's own
# name and at the temporary names writers used before (.NAME.tmp.PID for this and the next few hundred process
# ids), all pointing at a victim file. Each command must leave the victim untouched and either write a regular file
# (the planted link at the output replaced, not followed) or fail with one error line. docs/security.md section 1.
# Usage: planted_links.sh TRIDENT REPO_ROOT
set -uo pipefail
T=$1
ROOT=$2
W=$(mktemp -d "${TMPDIR:-/tmp}/trident-links-XXXXXX")
trap 'rm -rf "$W"' EXIT
VICTIM=$W/victim
echo precious > "$VICTIM"
fails=0

# plant DIR NAME: links at DIR/NAME and at its old temporary names
plant() {
  local d=$1 n=$2
  mkdir -p "$d"
  links "$VICTIM" "$d/$n" "$d/.$n.tmp.%d" "$d/$n.tmp.%d"
}

# links TARGET NAME [PATTERN...]: NAME and every PATTERN (%d: this and the next 400 process ids) -> TARGET
links() {
  python3 - "$$" "$@" <<'PY'
import os, sys
pid, target, name, pats = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
for p in [name] + [q % i for q in pats for i in range(pid, pid + 401)]:
    if os.path.lexists(p):
        os.unlink(p)
    os.symlink(target, p)
PY
}

# check LABEL PATH...: the victim is untouched and every PATH is a regular file, not a link
check() {
  local label=$1; shift
  if [ "$(cat "$VICTIM")" != precious ]; then
    echo "FAIL $label: the victim file was overwritten through a planted link"; fails=$((fails + 1))
    echo precious > "$VICTIM"
    return
  fi
  local p
  for p in "$@"; do
    if [ -L "$p" ] || [ ! -f "$p" ]; then
      echo "FAIL $label: $p is not a regular file"; fails=$((fails + 1)); return
    fi
  done
  echo "ok   $label"
}

# run LABEL CMD...: must succeed
run() {
  local label=$1; shift
  "$@" > "$W/out.txt" 2> "$W/err.txt"
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "FAIL $label: exit $rc ($(head -c 300 "$W/err.txt"))"; fails=$((fails + 1)); return 1
  fi
}

D=$W/d
plant "$D" state.h5
plant "$D" train.json
run "train --dump --json" "$T" train --preset tiny --steps 1 --dump "$D/state.h5" --json "$D/train.json" &&
  check "train --dump, --json" "$D/state.h5" "$D/train.json"

plant "$D" t.json
plant "$D" t.svg
plant "$D" run.json
run "emulate --trace --timeline --json" "$T" emulate --preset tiny --mesh fsdp=2,ep=2 --steps 1 --hardware h100 \
    --trace "$D/t.json" --timeline "$D/t.svg" --json "$D/run.json" &&
  check "emulate --trace, --timeline, --json" "$D/t.json" "$D/t.svg" "$D/run.json"

G=$D/golden
plant "$G" primitives.h5
plant "$G" state.h5
run "golden --out" "$T" golden --preset tiny --cases-per-op 1 --out "$G" &&
  check "golden --out (primitives.h5, state.h5)" "$G/primitives.h5" "$G/state.h5"

plant "$D" report.json
run "check --report" "$T" check "$G" --backend cpu --report "$D/report.json" &&
  check "check --report" "$D/report.json"

plant "$D" plan.svg
run "plan --svg" "$T" plan "$ROOT/planner/examples/nvl72_1m.json" --svg "$D/plan.svg" &&
  check "plan --svg" "$D/plan.svg"

# checkpoints: a link at DIR pointing at a victim directory (one holding a file, one empty), and links at the
# temporary names checkpoints used before
for kind in full empty; do
  VD=$W/victim-$kind
  rm -rf "$VD" "$D/ck"
  mkdir -p "$VD" "$D"
  [ $kind = full ] && echo precious > "$VD/keep"
  before=$(ls -A "$VD")
  links "$VD" "$D/ck" "$D/.ck.tmp-%d-0" "$D/.ck.old-%d-0"
  if "$T" train --preset tiny --steps 1 --save "$D/ck" > "$W/out.txt" 2> "$W/err.txt"; then
    if [ "$(ls -A "$VD")" = "$before" ] && [ ! -L "$D/ck" ] && [ -f "$D/ck/manifest.json" ]; then
      echo "ok   train --save over a link to a $kind directory: the link replaced by the checkpoint"
    else
      echo "FAIL train --save ($kind): the victim directory changed or DIR is not the checkpoint"; fails=$((fails + 1))
    fi
  else
    lines=$(grep -c . "$W/err.txt")
    if [ "$(ls -A "$VD")" = "$before" ] && [ "$lines" = 1 ] && grep -q "^trident: error: " "$W/err.txt"; then
      echo "ok   train --save over a link to a $kind directory refused: $(cat "$W/err.txt")"
    else
      echo "FAIL train --save ($kind): $(cat "$W/err.txt")"; fails=$((fails + 1))
    fi
  fi
  [ $kind = full ] && [ "$(cat "$VD/keep")" != precious ] && { echo "FAIL train --save: victim file changed"; fails=$((fails + 1)); }
done

# nothing left behind: every entry of D is a planted link, an output, or a directory this script made
left=$(find "$D" -maxdepth 2 -name '.*' ! -type l | grep -v "^$D/golden$" || true)
if [ -n "$left" ]; then echo "FAIL temporary files left behind: $left"; fails=$((fails + 1)); else echo "ok   nothing left behind"; fi

if [ "$fails" -ne 0 ]; then echo "$fails writer(s) failed"; exit 1; fi
echo "every writer refused to follow a planted link"
