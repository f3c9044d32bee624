// Precision policies of the numerics contract (docs/numerics.md section "Policies").
//   fp64: everything double (finite differences, external oracles).
//   fp32: everything float.
//   bf16: mirrors a GPU mixed-precision run: fp32 master weights / optimizer state / activations;
//         every GEMM operand is rounded to bf16 (RNE) before the fp32-accumulating GEMM; norms, softmax,
//         rope and activations in fp32. The product of two bf16 values is exact in fp32, so a bf16 GEMM is
//         "round operands, then the fp32 GEMM".
#pragma once
#include <string>
#include <string_view>

#include "reference/check.h"

namespace trident {

enum class Policy { fp64, fp32, bf16 };

inline std::string_view to_string(Policy p) {
  switch (p) {
    case Policy::fp64: return "fp64";
    case Policy::fp32: return "fp32";
    case Policy::bf16: return "bf16";
  }
  return "?";
}

inline Policy parse_policy(std::string_view s) {
  if (s == "fp64") return Policy::fp64;
  if (s == "fp32") return Policy::fp32;
  if (s == "bf16") return Policy::bf16;
  fail(fmt::format("unknown precision policy '{}' (expected fp64, fp32 or bf16)", s));
}

// Compute type of a policy: double for fp64, float for fp32 and bf16.
template <Policy P>
using compute_t = std::conditional_t<P == Policy::fp64, double, float>;

}  // namespace trident
