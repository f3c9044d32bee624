#!/usr/bin/env bash
# install_kernel_plugin.sh BUILD SOURCE WORK CMAKE CTEST [CCACHE]: installs BUILD into WORK/prefix, builds
# examples/kernel_plugin against it (find_package(Trident)) and checks its kernel set, every op, on the tiny golden
# and the bf16-policy tiny-bf16 golden:
#   the library call (check_kernels) and `PREFIX/bin/trident check --backend plugin:libexample_kernels.so` pass by
#   the golden's acceptance rule (the default for a plugin), with mm's and rmsnorm_forward's rows of the report
#   table `bound ... PASS`; --bitwise fails rmsnorm_forward (it rounds twice: correct, not the reference's bits);
#   the plugin with mm off by 1% fails with a FAIL line and a repro line (docs/plugins.md).
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
[ -n "$CCACHE" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$CCACHE")
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

# The example's own ctest (the same checks, on the installed tiny and tiny-bf16 goldens).
run 0 "example ctest" "$CTEST" --test-dir "$EX" --output-on-failure
expect "example ctest" "100% tests passed, 0 tests failed out of 7"
echo "install_kernel_plugin: OK"
