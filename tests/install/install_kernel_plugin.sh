#!/usr/bin/env bash
# install_kernel_plugin.sh BUILD SOURCE WORK CMAKE CTEST [CCACHE]: installs BUILD into WORK/prefix, builds
# examples/kernel_plugin against it (find_package(Trident)) and checks its kernel set on the tiny golden:
#   the library call (check_kernels) passes, `PREFIX/bin/trident check --backend plugin:libexample_kernels.so` passes,
#   the plugin with mm off by 1% fails with a FAIL line and a repro line.
# mm compares under the golden's stored bound (--tolerance); the example's rmsnorm_forward is not bit-identical
# to the reference, and such outputs are compared bit for bit, so the checks cover mm (docs/plugins.md).
set -uo pipefail
BUILD=$1 SOURCE=$2 WORK=$3 CMAKE=$4 CTEST=$5 CCACHE=${6:-}
PREFIX=$WORK/prefix EX=$WORK/ex GOLDEN=$SOURCE/golden/data/primitives/tiny
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
[ -n "$CCACHE" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CCACHE")
run 0 configure "$CMAKE" -S "$SOURCE/examples/kernel_plugin" -B "$EX" -DCMAKE_PREFIX_PATH="$PREFIX" "${launcher[@]}"
expect configure "Build files have been written"
run 0 build "$CMAKE" --build "$EX" -j2

# (a) the library call
run 0 check_kernels "$EX/check_kernels" "$GOLDEN" --tolerance --op mm
expect check_kernels "^xview: mm/c0 C +f32 \[[0-9]+, [0-9]+\]"
expect check_kernels "^check_kernels .*: 1/1 cases of 1 ops passed with ExampleKernels"
# (b) the installed trident with the plugin
run 0 "trident check (plugin)" "$PREFIX/bin/trident" check "$GOLDEN" --backend "plugin:$EX/libexample_kernels.so" \
  --tolerance --op mm
expect "trident check (plugin)" "--backend plugin:$EX/libexample_kernels.so: 1/1 cases of 1 ops passed"
# The wrong plugin fails, with the command that reruns the failing case.
run 1 "trident check (wrong plugin)" "$PREFIX/bin/trident" check "$GOLDEN" \
  --backend "plugin:$EX/libexample_kernels_wrong.so" --tolerance --op mm
expect "trident check (wrong plugin)" "^FAIL mm/c0 \(rank 0\): output 'C' element [0-9]+: .* > bound"
expect "trident check (wrong plugin)" \
  "^  repro: trident check $GOLDEN --backend plugin:$EX/libexample_kernels_wrong.so --tolerance --op mm --case c0$"
expect "trident check (wrong plugin)" ": 0/1 cases of 1 ops passed"
# The example's own ctest (the same three checks, on the installed tiny golden).
run 0 "example ctest" "$CTEST" --test-dir "$EX" --output-on-failure
expect "example ctest" "100% tests passed, 0 tests failed out of 3"
echo "install_kernel_plugin: OK"
