#!/bin/sh
# device_check_dry_run (ctest): the dry run from a staged bundle alone, as the device machine runs it. Passes when
# the script passes (GPU steps skipped, CPU steps passed) and what it leaves in the output folder is what the device
# tool brings back: at most 8 files, none over 16 MiB, the logs' archive holding every step's report.
#   device_check_dry_run.sh BUNDLE OUT
set -eu
bundle="$1"
out="$2"
rm -rf "$out"
"$bundle/device-check" --dry-run --out "$out"
n=$(find "$out" -mindepth 1 | wc -l)
echo "returned files: $n ($(ls "$out" | tr '\n' ' '))"
[ "$n" -le 8 ] || { echo "error: $n files in $out (the device tool returns 8)" >&2; exit 1; }
[ -z "$(find "$out" -size +16M)" ] || { echo "error: a file over 16 MiB in $out" >&2; exit 1; }
for f in device-check.json device-check.txt; do [ -s "$out/$f" ] || { echo "error: no $f" >&2; exit 1; }; done
tar -tzf "$out/device-check-logs.tar.gz" > "$out.list"
for f in fake_nccl.log cuda_ref.log cuda_ref.json check_cuda_ref.json check_cuda_fast_tiny-packed.json; do
  grep -q "$f\$" "$out.list" || { echo "error: $f is not in the logs' archive" >&2; exit 1; }
done
grep -q '"complete": true' "$out/device-check.json" || { echo "error: device-check.json is not complete" >&2; exit 1; }
rm -f "$out.list"
echo "device_check_dry_run: ok"
