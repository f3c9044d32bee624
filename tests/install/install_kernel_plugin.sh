#!/usr/bin/env bash
# install_kernel_plugin.sh BUILD SOURCE WORK CMAKE CTEST [CCACHE]: installs BUILD into WORK/prefix, builds
# examples/kernel_plugin against it (find_package(Trident)) and checks its kernel set, every op, on the tiny golden
# and the bf16-policy tiny-bf16 golden:
#   the library call (check_kernels) and `PREFIX/bin/trident check --backend plugin:libexample_kernels.so` pass by
#   the golden's acceptance rule (the default for a plugin), with mm's and rmsnorm_forward's rows of the report
#   table `bound ... PASS`; --bitwise fails rmsnorm_forward (it rounds twice: correct, not the reference's bits);
#   the plugin with mm off by 1% fails with a FAIL line and a repro line (docs/plugins.md).
# Where nvcc exists (on the PATH or /usr/local/cuda/bin/nvcc) the example's CUDA variant must build too
# (libexample_cuda_kernels.so: mm as a CUDA kernel); its `trident check --op mm` passes by the rule where a CUDA
# device is seen, and elsewhere it refuses with its one line and this script reports the skip.
set -uo pipefail
BUILD=$1 SOURCE=$2 WORK=$3 CMAKE=$4 CTEST=$5 CCACHE=${6:-}
PREFIX=$WORK/prefix EX=$WORK/ex GOLDEN=$SOURCE/golden/data/primitives/tiny
GOLDEN_BF16=$SOURCE/golden/data/primitives/tiny-bf16
die() { echo "install_kernel_plugin: FAILED: $*" >&2; exit 1; }
# run EXPECTED_RC NAME CMD...: runs CMD, prints its output, returns it in $OUT; dies on another exit status.
run() {
  local want=$1 name=$2; shift 2
  echo "\$ $*"
  OUT=$("$@" 2>&1); local rc=$?
  echo "$OUT"
  [ "$rc" = "$want" ] || die "$name exited $rc, expected $want"
}
expect() { grep -Eq -- "$2" <<<"$OUT" || die "$1: the output does not match: $2"; }

rm -rf "$PREFIX" "$EX/CMakeCache.txt"
run 0 install "$CMAKE" --install "$BUILD" --prefix "$PREFIX"
[ -x "$PREFIX/bin/trident" ] || die "no $PREFIX/bin/trident"
[ -f "$PREFIX/lib/cmake/Trident/TridentConfig.cmake" ] || die "no TridentConfig.cmake"
[ -f "$PREFIX/include/trident/golden/plugin.h" ] || die "no golden/plugin.h"

launcher=()
[ -n "$CCACHE" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CCACHE" -DCMAKE_CUDA_COMPILER_LAUNCHER="$CCACHE")
run 0 configure "$CMAKE" -S "$SOURCE/examples/kernel_plugin" -B "$EX" -DCMAKE_PREFIX_PATH="$PREFIX" "${launcher[@]}"
expect configure "Build files have been written"
run 0 build "$CMAKE" --build "$EX" -j2

# expect_rows NAME: mm's and rmsnorm_forward's outputs are judged by the rule and pass.
expect_rows() {
  expect "$1" "^mm +C +bound +[0-9]+ .* PASS$"
  expect "$1" "^rmsnorm_forward +rinv +bound +[0-9]+ .* PASS$"
  expect "$1" "^rmsnorm_forward +y +bound +[0-9]+ .* PASS$"
}
RULE="\(the golden's acceptance rule: derived bounds where stored, else bits\)"
PLUGIN=plugin:$EX/libexample_kernels.so WRONG=plugin:$EX/libexample_kernels_wrong.so

# (a) the library call, every op, by the rule
run 0 check_kernels "$EX/check_kernels" "$GOLDEN"
expect check_kernels "^xview: mm/c0 C +f32 \[[0-9]+, [0-9]+\]"
expect check_kernels "^xview: mm/c0 max \|C - oracle\| / bound = [0-9.e-]+ \(policy fp32\)$"
expect_rows check_kernels
expect check_kernels "^check_kernels $GOLDEN: 45/45 cases of 33 ops passed with ExampleKernels $RULE$"
# bit for bit, rmsnorm_forward fails
run 1 "check_kernels --bitwise" "$EX/check_kernels" "$GOLDEN" --bitwise
expect "check_kernels --bitwise" "^FAIL rmsnorm_forward/c0 \(rank 0\): output 'y' differs at element [0-9]+: .*\(bitwise contract\)$"
expect "check_kernels --bitwise" \
  "^  repro: trident check $GOLDEN --backend $PLUGIN --bitwise --op rmsnorm_forward --case c0$"
expect "check_kernels --bitwise" ": 44/45 cases of 33 ops passed with ExampleKernels \(bitwise\)$"
run 2 "check_kernels --bitwise --tolerance" "$EX/check_kernels" "$GOLDEN" --bitwise --tolerance
expect "check_kernels --bitwise --tolerance" "^check_kernels: error: --tolerance and --bitwise: choose one$"

# (b) the installed trident with the plugin, every op, by the rule (its default for a plugin)
run 0 "trident check (plugin)" "$PREFIX/bin/trident" check "$GOLDEN" --backend "$PLUGIN"
expect_rows "trident check (plugin)"
expect "trident check (plugin)" "--backend $PLUGIN: 45/45 cases of 33 ops passed $RULE$"
# bit for bit: rmsnorm_forward fails, with the command that reruns it; every other op passes
run 1 "trident check --bitwise (plugin)" "$PREFIX/bin/trident" check "$GOLDEN" --backend "$PLUGIN" --bitwise
expect "trident check --bitwise (plugin)" "^FAIL rmsnorm_forward/c0 \(rank 0\): output 'y' differs at element [0-9]+: .*\(bitwise contract\)$"
expect "trident check --bitwise (plugin)" \
  "^  repro: trident check $GOLDEN --backend $PLUGIN --bitwise --op rmsnorm_forward --case c0$"
expect "trident check --bitwise (plugin)" "--backend $PLUGIN: 44/45 cases of 33 ops passed \(bitwise\)$"
# The wrong plugin fails by the rule (mm only), with the command that reruns the failing case.
run 1 "trident check (wrong plugin)" "$PREFIX/bin/trident" check "$GOLDEN" --backend "$WRONG"
expect "trident check (wrong plugin)" "^mm +C +bound +1 .* FAIL \(1 of 1\)$"
expect "trident check (wrong plugin)" "^FAIL mm/c0 \(rank 0\): output 'C' element [0-9]+: .* > bound [^ ]+ \(gemm rule\)$"
expect "trident check (wrong plugin)" "^  repro: trident check $GOLDEN --backend $WRONG --op mm --case c0$"
expect "trident check (wrong plugin)" "--backend $WRONG: 44/45 cases of 33 ops passed $RULE$"
[ "$(grep -c '^FAIL ' <<<"$OUT")" = 1 ] || die "trident check (wrong plugin): another op than mm failed"

# (c) the bf16-policy golden: the example's mm rounds its inputs to bf16 under the bf16 policy, and passes the rule
run 0 "check_kernels (bf16)" "$EX/check_kernels" "$GOLDEN_BF16"
expect "check_kernels (bf16)" "^xview: mm/c0 max \|C - oracle\| / bound = [0-9.e-]+ \(policy bf16\)$"
expect_rows "check_kernels (bf16)"
expect "check_kernels (bf16)" "^check_kernels $GOLDEN_BF16: 33/33 cases of 33 ops passed with ExampleKernels $RULE$"
run 0 "trident check (plugin, bf16)" "$PREFIX/bin/trident" check "$GOLDEN_BF16" --backend "$PLUGIN"
expect_rows "trident check (plugin, bf16)"
expect "trident check (plugin, bf16)" "--backend $PLUGIN: 33/33 cases of 33 ops passed $RULE$"

# (d) the CUDA variant, where nvcc exists: it is built; with a CUDA device its mm passes the rule on tiny and
# tiny-bf16, without one the plugin refuses with one line (exit 1) and the checks are skipped.
NTESTS=7 CUDA_SKIP=0
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  NTESTS=9
  CUDA_PLUGIN=plugin:$EX/libexample_cuda_kernels.so
  [ -f "$EX/libexample_cuda_kernels.so" ] || die "nvcc exists but the CUDA variant was not built: no $EX/libexample_cuda_kernels.so"
  echo "\$ $PREFIX/bin/trident check $GOLDEN --backend $CUDA_PLUGIN --op mm"
  OUT=$("$PREFIX/bin/trident" check "$GOLDEN" --backend "$CUDA_PLUGIN" --op mm 2>&1); rc=$?
  echo "$OUT"
  if [ "$rc" = 1 ] && [ "$(wc -l <<<"$OUT")" = 1 ] &&
     grep -Eq "^trident: error: --backend $CUDA_PLUGIN: trident_kernels_v1 threw: the example CUDA kernels need a CUDA device: none found \(.+\)$" <<<"$OUT"; then
    CUDA_SKIP=1
    echo "install_kernel_plugin: SKIP: the CUDA variant's checks (built; no CUDA device here, the plugin refused with its one line)"
  else
    [ "$rc" = 0 ] || die "trident check (CUDA plugin) exited $rc, expected 0 (or 1 with the no-device line)"
    expect "trident check (CUDA plugin)" "^mm +C +bound +[0-9]+ .* PASS$"
    expect "trident check (CUDA plugin)" "--backend $CUDA_PLUGIN: [0-9]+/[0-9]+ cases of 1 ops passed $RULE$"
    run 0 "trident check (CUDA plugin, bf16)" "$PREFIX/bin/trident" check "$GOLDEN_BF16" --backend "$CUDA_PLUGIN" --op mm
    expect "trident check (CUDA plugin, bf16)" "^mm +C +bound +[0-9]+ .* PASS$"
  fi
fi

# The example's own ctest (the same checks, on the installed tiny and tiny-bf16 goldens; the CUDA ones skipped
# without a device).
run 0 "example ctest" "$CTEST" --test-dir "$EX" --output-on-failure
expect "example ctest" "100% tests passed, 0 tests failed out of $NTESTS"
if [ "$CUDA_SKIP" = 1 ]; then
  expect "example ctest" "example_cuda_trident_check_mm \(Skipped\)"
  expect "example ctest" "example_cuda_trident_check_mm_bf16 \(Skipped\)"
elif [ "$NTESTS" = 9 ]; then
  grep -q "(Skipped)" <<<"$OUT" && die "example ctest: a CUDA check was skipped where the plugin found a device"
fi
if [ "$CUDA_SKIP" = 1 ]; then
  echo "install_kernel_plugin: OK (the CUDA variant built; its checks skipped: no CUDA device)"
else
  echo "install_kernel_plugin: OK"
fi
