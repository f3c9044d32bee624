// The one table of tolerances (STYLE.md habit 4). Tests hold no literal tolerances: they look up an entry
// by (primitive, dtype, direction) and get an error bound computed alongside the reference:
//
//     bound = (k_const + k_per_term * n_terms) * u(dtype) * sum_abs
//
// where sum_abs is the sum of |terms| of the reduction (e.g. sum_k |a_mk * b_kn| for a GEMM element),
// n_terms the length of the longest in-order (rounded) chain, and u the unit roundoff of `dtype`
// (fp64 2^-53, fp32 2^-24, bf16 2^-8). Every entry states why its factors are what they are.
//
// To add an entry: append one line to kTolerances (keys are plain strings; keep them lower-case:
// primitive = the reference function name, dtype = fp64|fp32|bf16, direction = fwd|bwd|vs_fp64|gpu|...).
#pragma once
#include <cstdint>
#include <string_view>

#include "reference/check.h"

namespace trident {

struct Tolerance {
  std::string_view primitive;
  std::string_view dtype;
  std::string_view direction;
  double k_const;
  double k_per_term;
  std::string_view reason;
};

inline constexpr Tolerance kTolerances[] = {
    // primitive, dtype, direction, k_const, k_per_term, reason
    {"gemm", "fp32", "vs_fp64", 2.0, 1.0,
     "in-order sum of K rounded fp32 products: |err| <= gamma_K * sum|a*b| (Higham 3.1), gamma_K ~ K*u; "
     "+2u covers 1/(1-Ku) and the fp64 oracle's own rounding"},
    {"gemm", "fp64", "vs_fp64", 0.0, 0.0,
     "the fp64 gemm is compared bitwise against the documented-order loop; never with a tolerance"},
    {"tile_wgrad", "fp32", "vs_fp64", 3.0, 1.0,
     "each tile partial is an in-order fp32 sum of T rounded products (gamma_T), tile partials are added "
     "exactly and rounded once (+u); n_terms = tile length; +2u slack for the fp64 oracle"},
    {"tile_sum", "fp32", "vs_fp64", 3.0, 1.0,
     "in-order fp32 sum inside a tile (gamma_T, n_terms = tile length), exact merge, one final rounding (+u)"},
    {"exact_acc", "fp32", "vs_exact", 1.0, 0.0,
     "one correct rounding of the exact sum: |err| <= u * |sum| <= u * sum|terms| (tests use bitwise MPFR)"},
    // Linear cross-entropy (reference/model/linear_ce.h, docs/optimizer_and_loss.md "Error bounds"); dtype = the
    // accumulation type (the bf16 policy uses the fp32 entries: its rounded operands are the oracle's operands),
    // except linear_ce_dlogit/bf16, which covers bf16's extra rounding of dlogit.
    {"linear_ce_logits", "fp64", "vs_fp64", 2.0, 1.0,
     "logit = in-order gemm sum over d rounded products: gamma_d * sum_k|h*W| (n_terms = d, sum_abs = "
     "sum_k|h*W|); +2u for 1/(1-du) and the long-double oracle"},
    {"linear_ce_logits", "fp32", "vs_fp64", 2.0, 1.0,
     "logit = in-order gemm sum over d rounded products: gamma_d * sum_k|h*W| (n_terms = d, sum_abs = "
     "sum_k|h*W|); +2u for 1/(1-du) and the long-double oracle"},
    {"linear_ce_lse", "fp64", "vs_fp64", 4.0, 3.0,
     "lse error beyond the largest logit error (LSE is 1-Lipschitz in max-norm; the test adds that term): per "
     "term one exp rounding, the argument's rounding (p*|l-m| <= 1/e) and one add; chunk merges add 2 more "
     "(n_terms = V + 2*chunks); log and the final add cost u*(1+|lse|) (sum_abs = 1 + |lse|)"},
    {"linear_ce_lse", "fp32", "vs_fp64", 4.0, 3.0,
     "lse error beyond the largest logit error (LSE is 1-Lipschitz in max-norm; the test adds that term): per "
     "term one exp rounding, the argument's rounding (p*|l-m| <= 1/e) and one add; chunk merges add 2 more "
     "(n_terms = V + 2*chunks); log and the final add cost u*(1+|lse|) (sum_abs = 1 + |lse|)"},
    {"linear_ce_dlogit", "fp64", "vs_fp64", 3.0, 0.0,
     "dlogit = (exp(l - lse) - onehot) * scale beyond the propagated logit/lse error: rounding of l - lse "
     "(relative u|l-lse| in p), exp, the subtraction and the scaling; sum_abs = scale*p*(1+|l-lse|) + |dlogit|"},
    {"linear_ce_dlogit", "fp32", "vs_fp64", 3.0, 0.0,
     "dlogit = (exp(l - lse) - onehot) * scale beyond the propagated logit/lse error: rounding of l - lse "
     "(relative u|l-lse| in p), exp, the subtraction and the scaling; sum_abs = scale*p*(1+|l-lse|) + |dlogit|"},
    {"linear_ce_dlogit", "bf16", "vs_fp64", 1.01, 0.0,
     "bf16 policy: dlogit is rounded (RNE) to bf16 as a GEMM operand (relative error <= u_bf16 = 2^-8, 8 "
     "significant bits); the fp32 terms (3 * 2^-24) fit in the 0.01 u_bf16 slack; sum_abs as for fp32"},
    {"linear_ce_dhidden", "fp64", "vs_fp64", 2.0, 1.0,
     "dhidden = one in-order sum over all V of rounded dlogit*W products: gamma_V * sum_j|dlogit*W| (n_terms = "
     "V); the test adds the propagated dlogit error sum_j |d dlogit|*|W|"},
    {"linear_ce_dhidden", "fp32", "vs_fp64", 2.0, 1.0,
     "dhidden = one in-order sum over all V of rounded dlogit*W products: gamma_V * sum_j|dlogit*W| (n_terms = "
     "V); the test adds the propagated dlogit error sum_j |d dlogit|*|W|"},
    {"linear_ce_dw", "fp64", "vs_fp64", 3.0, 1.0,
     "dW = tile reduction: in-tile in-order sums (gamma_T, n_terms = longest tile), exact merge, one rounding "
     "(+u); +2u slack; the test adds the propagated dlogit error sum_i |h|*|d dlogit|"},
    {"linear_ce_dw", "fp32", "vs_fp64", 3.0, 1.0,
     "dW = tile reduction: in-tile in-order sums (gamma_T, n_terms = longest tile), exact merge, one rounding "
     "(+u); +2u slack; the test adds the propagated dlogit error sum_i |h|*|d dlogit|"},
    {"model_grad", "fp64", "vs_fd", 9007199254.740992, 0.0,
     "manual backward vs Richardson-extrapolated central differences (steps h and h/2, h = 1e-3) of the fp64 "
     "model loss: truncation O(h^4) and roundoff ~u*|loss|/h are both ~1e-12; the bound is the issue's 1e-6 "
     "relative (= 9.007e9 u) with sum_abs = max(|g|, 1e-5) (entries with |g| < 1e-5 are judged absolutely)"},
    {"mla_absorbed", "fp64", "vs_direct", 64.0, 4.0,
     "MLA absorbed form (q_nope W_uk^T against the latent, latent through W_uv) vs the direct form "
     "(k_nope = c_kv W_uk, v = c_kv W_uv), both fp64: the two re-associate chains of length "
     "n_terms = H*Dv + S + r (output GEMM, softmax sum, latent dim); 4u per term covers both sides, "
     "and 64u the rope/norm/exp differences (dm:: vs libm, ~1 ulp each) propagated into sum|terms| of W_o"},
    {"model_grad", "bf16", "vs_fp32", 8.0, 0.0,
     "norm-wise per parameter tensor, whole-model backward under bf16 operand rounding vs fp32, with every "
     "expert selected (no routing flips): each GEMM operand carries a relative error <= u_bf16 (2^-8) and the "
     "errors partly cancel norm-wise; measured worst 0.0076 (~2 u_bf16) on tiny/tiny-gqa; 8 u_bf16 = 0.031 "
     "leaves 4x margin while any misplaced rounding or operand stride gives O(1)"},
};

inline double unit_roundoff(std::string_view dtype) {
  if (dtype == "fp64") return 0x1p-53;
  if (dtype == "fp32") return 0x1p-24;
  if (dtype == "bf16") return 0x1p-8;
  fail(fmt::format("unit_roundoff: unknown dtype '{}' (expected fp64, fp32 or bf16)", dtype));
}

inline const Tolerance& tolerance(std::string_view primitive, std::string_view dtype, std::string_view direction) {
  for (const Tolerance& t : kTolerances)
    if (t.primitive == primitive && t.dtype == dtype && t.direction == direction) return t;
  fail(fmt::format("no tolerance entry for ({}, {}, {}) in reference/tolerances.h", primitive, dtype, direction));
}

// Error bound k * u * sum|terms| for one output element.
inline double tolerance_bound(std::string_view primitive, std::string_view dtype, std::string_view direction,
                              int64_t n_terms, double sum_abs) {
  const Tolerance& t = tolerance(primitive, dtype, direction);
  return (t.k_const + t.k_per_term * static_cast<double>(n_terms)) * unit_roundoff(dtype) * sum_abs;
}

}  // namespace trident
