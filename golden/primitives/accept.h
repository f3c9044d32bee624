// The derived acceptance rule of the primitive goldens (docs/numerics.md "Acceptance rule", docs/golden.md): for every
// floating output of a case, data computed once in fp64 from the case's inputs when the golden is written, so that
// every checker (trident check, the fast tier, the Python package) applies the same rule:
//   oracle  the op evaluated in fp64 (the case widened: f32 inputs as doubles, policy fp64; bf16 policy: the GEMM
//           operands rounded to bf16 first, as both sides round them)
//   bound   per element, the largest |got - oracle| a correct implementation may show (any summation order and
//           blocking, truncating accumulation, its own elementary functions within 4 ulps): the tolerance table's
//           "accept" rows (reference/tolerances.h) turned into numbers by this file's per-op chains
//   floor   the relative test's floor: rms(got - oracle) <= k_rel * rms(golden - oracle) + floor
// An output whose value a correct implementation cannot change (a copy, one IEEE rounding of an add, an integer or a
// selection) has the rule "exact": bits. An output with no derived chain yet keeps the bitwise comparison and the
// report says so.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "golden/primitives/bounds.h"
#include "golden/primitives/primitives.h"

namespace trident::golden {

// The rule's constant: rms(got - oracle) may be k_rel times the reference's own (the relative test).
inline constexpr double kAcceptRelK = 4.0;

// The GEMM, attention-core and linear-CE outputs' magnitudes (golden/primitives/bounds.h) of a case, by output name;
// empty for other ops. The bound rule's numbers for these ops; the fast tier's tests read them too.
std::map<std::string, ElemBounds> elem_bounds(const PrimCase& c);

// Fills c.oracle, c.bound and c.accept for every output of the case (called by the recorder after the outputs).
void complete_accept(PrimCase& c);

// The case in fp64: every f32 input widened (bf16 policy: GEMM operands rounded to bf16 first), the policy fp64.
PrimCase widened_case(const PrimCase& c);

// The verdict of one output of one case under the rule the golden stores for it.
struct OutputVerdict {
  std::string rule;         // "bound" (per element + relative), "exact", "sum_abs" (older goldens), "bitwise"
  bool pass = true;
  int64_t index = -1;       // worst element (bound) or first differing element (bits)
  double got = 0, want = 0, bound = 0;
  double worst_ratio = 0;   // max |got - oracle| / bound (bound rule), max |got - want| / bound (sum_abs rule)
  double rel_ratio = -1;    // rms(got - oracle) / (k_rel rms(want - oracle) + floor); -1: not run
  std::string message;      // one line when !pass
};
// Compares `got` with the case's golden output `want` (same name, shape and dtype). bitwise: bits whatever the
// golden stores; else the stored rule (accept data, or an older golden's sum_abs bound, or bits where neither).
OutputVerdict judge_output(const PrimCase& c, const NamedTensor& got, const NamedTensor& want, bool bitwise);

void add_to_report(OutputReport& r, const PrimCase& c, const std::string& output, const OutputVerdict& v);
nlohmann::json report_json(const OutputReport& r);
// The text table: op, output, rule, cases, passed, worst |err|/bound, worst relative ratio, PASS/FAIL.
std::string report_text(const OutputReport& r);

}  // namespace trident::golden
