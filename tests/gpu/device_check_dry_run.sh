#!/bin/sh
# device_check_dry_run (ctest): the dry run from a staged bundle alone, as the device machine runs it. Passes when
# the script passes (GPU steps skipped, CPU steps passed) and what it leaves in the output folder is what the device
# tool brings back: at most 8 files, none over 16 MiB, the logs' archive holding every step's report. Then a run
# with a stand-in nvidia-smi listing a GPU: the GPU tests' skips must fail it.
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
# A run (not dry) where nvidia-smi lists a GPU but CUDA finds none (a stand-in nvidia-smi here): the GPU tests'
# skips fail the run ("skipped_with_gpu"), never pass as skips. A short budget: only the first steps matter.
fake="$out.fakebin"
mkdir -p "$fake"
cat > "$fake/nvidia-smi" <<'EOS'
#!/bin/sh
case "$1" in -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-stand-in)" ;; *) printf 'name\nNVIDIA H200\n' ;; esac
EOS
chmod +x "$fake/nvidia-smi"
if PATH="$fake:$PATH" "$bundle/device-check" --budget 12 --out "$out.gpu" > "$out.gpu.txt" 2>&1; then
  echo "error: a run with a GPU listed and every GPU test skipped passed" >&2; cat "$out.gpu.txt" >&2; exit 1
fi
grep -q '"step": "gpu_kernels", "status": "skipped_with_gpu"' "$out.gpu/device-check.json" ||
  { echo "error: gpu_kernels was not skipped_with_gpu" >&2; cat "$out.gpu.txt" >&2; exit 1; }
rm -rf "$fake" "$out.gpu" "$out.gpu.txt"
echo "device_check_dry_run: ok"
