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
    // ---- the fast GPU tier (gpu/fast, docs/gpu.md "cuda-fast"): fast vs the reference, direction "gpu" ---------
    // bound = the two sides' error bounds added (|fast - ref| <= |fast - exact| + |ref - exact|); sum_abs and n_terms
    // per output element are computed in fp64 from the case's inputs (gpu/fast/bounds.h); u is the accumulation
    // type's (the bf16 policy uses the fp32 rows, plus the bf16 rows for the roundings to bf16 inside the op). The
    // fast side may sum in any order, with FMA, and (tensor cores) with truncating accumulation: 2u per operation.
    {"gemm", "fp32", "accept", 2.0, 3.0,
     "reference: in-order chain of K rounded products, gamma_K (1 per term); fast (cuBLAS / Eigen): any order, "
     "truncating accumulation at worst 2u per add (2 per term); +2u for 1/(1-Ku) on both sides. n_terms = K, "
     "sum_abs = sum_k |a*b| (bf16 policy: of the bf16 operands, identical on both sides)"},
    {"gemm", "fp64", "accept", 2.0, 3.0, "as gemm/fp32/gpu with fp64's u (cublasGemmEx CUBLAS_COMPUTE_64F, Eigen double)"},
    {"tile_wgrad", "fp32", "accept", 3.0, 3.0,
     "per tile: the reference's in-order partial (1 per term) and the fast GEMM's partial (2 per term), added "
     "exactly, each side rounded once (+u each); +u slack. n_terms = the longest tile, sum_abs = sum_r |x*dy|"},
    {"tile_wgrad", "fp64", "accept", 3.0, 3.0, "as tile_wgrad/fp32/gpu with fp64's u"},
    {"attn_core", "fp32", "accept", 16.0, 5.0,
     "online softmax vs two-pass: per side, score errors (Dq+1)u*S_max shift p by at most twice that (softmax is "
     "2-Lipschitz in max-norm), the sum chains of l and o (1 per key each), the rescales (one per block of 32 keys) "
     "and ~8 single roundings (exp, division, scale); both sides: 4 per key + 4 per score term + 16. n_terms = keys "
     "+ Dq + 1 (backward: + Dv, and for dkv twice the tile's (row, head) terms), sum_abs = (1 + S_max) * the output's "
     "magnitude (forward: sum_j p_j |v_j|; backward: through |ds| and p bounds, gpu/fast/bounds.h)"},
    {"attn_core", "fp64", "accept", 16.0, 5.0, "as attn_core/fp32/gpu with fp64's u"},
    {"attn_core", "bf16", "accept", 2.0, 0.0,
     "bf16 policy, added to the fp32 row: p (forward; the fast side rounds the unnormalised exp) and p, ds "
     "(backward) are rounded to bf16 as value / key / query operands on both sides: <= u_bf16 relative each, "
     "sum_abs = sum |p v| (o), sum |ds k| (dq), sum |ds q| + |p dO| (dkv)"},
    {"linear_ce", "fp32", "accept", 16.0, 6.0,
     "per side: logit errors (2d u sum|h W|, fast: any order / truncating), the chunked logsumexp (4 + 3 per "
     "column and 6 per chunk merge, the table's linear_ce_lse), dlogit's exp of a shifted argument; backward: the "
     "dhidden chain over the columns (fast: GEMM per chunk, accumulating) and the dW tile chains. n_terms = d + "
     "columns + 1 (forward: + 2 chunks; dW: longest tile + d + 1), sum_abs = the magnitudes of gpu/fast/bounds.h"},
    {"linear_ce", "fp64", "accept", 16.0, 6.0, "as linear_ce/fp32/gpu with fp64's u"},
    {"linear_ce", "bf16", "accept", 2.0, 0.0,
     "bf16 policy, added to the fp32 row: dlogit is rounded to bf16 as a GEMM operand on both sides (<= u_bf16 "
     "relative each); sum_abs = sum_j |dlogit*W| (dhidden), sum_r |h*dlogit| (dW); the forward has no bf16 rounding "
     "beyond the operands (identical on both sides)"},
    // ---- the derived acceptance rule's other rows (golden/primitives/accept.h, docs/numerics.md "Acceptance rule") --
    {"sum", "fp32", "accept", 2.0, 2.0,
     "a sum of n terms (or of n rounded products) in any order, against the fp64 oracle: each partial sum is at most "
     "sum|terms| and each add (and product) rounds with at most 2u (truncating accumulation), so |err| <= 2n u "
     "sum|terms|; +2u for 1/(1-nu) and the oracle. sum_abs = the op replayed in fp64 on |inputs|, n = the op's "
     "longest sum (rows of a tile sum, K of a combine, d of a dot product)"},
    {"sum", "fp64", "accept", 2.0, 2.0, "as sum/fp32/accept with fp64's u"},
    {"composite", "fp32", "accept", 2.0, 4.0,
     "a first-order running error bound of the op's formula in fp64 from its inputs: each rounding u relative to its "
     "result, each elementary function (exp, sigmoid, silu, sqrt, rsqrt, division) within k_per_term = 4 ulps of "
     "its result, each sum of n terms 2n u sum|terms|, and each intermediate's bound propagated through |derivative| "
     "(golden/primitives/accept.cpp states each op's chain); the total times k_const = 2 for another association "
     "order of the same formula and for second-order terms"},
    {"composite", "fp64", "accept", 2.0, 4.0, "as composite/fp32/accept with fp64's u"},
    {"composite", "bf16", "accept", 2.0, 0.0,
     "bf16 policy, added to the fp32 chain: an intermediate rounded to bf16 as a GEMM operand (SwiGLU's h for the down "
     "projection, dug and duu for dx) moves each term by at most u_bf16 relative, at whichever value each side rounds "
     "it (the oracle rounds nothing inside); k_const 2 as the composite row's. sum_abs = the GEMM's sum |terms|"},
    // The whole step with the fast tier vs the reference (gpu/fast/step_check.h; both from the same parameters each
    // step): relative differences with sum_abs = 1, n_terms = the step's longest reduction (max of vocab, d_model, FFN
    // widths, tile, seq_len). A budget over per-op bounds, not a proof: element-wise each fast op is within its row
    // ((k_const + k_per_term n) u relative to its terms' magnitude, k_per_term <= 6); a gradient passes through the
    // fast ops of its layer and of every later layer, and the differences propagate with the model's conditioning,
    // which no row states. Routing flips (a token's top-k changing under a tiny difference of its router input) are
    // not covered: the tiny presets' margins are reported by the check (docs/gpu.md "cuda-fast", measured).
    {"step_grad", "fp32", "gpu", 0.0, 64.0,
     "norm-wise ||g_fast - g_ref|| / ||g_ref|| per gradient tensor: 64 n u = the per-op per-term factor (<= 6) "
     "times ~10 fast ops on a gradient's path in a 3-layer model, rounded up to a power of two"},
    {"step_grad", "fp64", "gpu", 0.0, 64.0, "as step_grad/fp32/gpu with fp64's u"},
    {"step_grad", "bf16", "gpu", 4.0, 0.0,
     "bf16 policy, added to the fp32 row: the bf16 roundings of p, ds (attention) and dlogit (linear CE) happen at "
     "slightly different values on the two sides: <= u_bf16 relative per rounded term and side, 2 u_bf16 per op "
     "norm-wise, twice for the ops a gradient passes through: 4 u_bf16 = 0.0156 (< TE's 2.5e-2, < llm.c's 0.079)"},
    {"step_loss", "fp32", "gpu", 0.0, 64.0,
     "|loss_fast - loss_ref| / |loss_ref|: the forward's fast ops (attention, GEMMs, linear CE: <= 6 per term each) "
     "over the layers, as step_grad"},
    {"step_loss", "fp64", "gpu", 0.0, 64.0, "as step_loss/fp32/gpu with fp64's u"},
    {"step_loss", "bf16", "gpu", 2.0, 0.0,
     "bf16 policy, added to the fp32 row: the forward's bf16 roundings of p at different values on the two sides "
     "(<= u_bf16 relative each)"},
    {"relative", "fp32", "accept", 4.0, 2.0,
     "the relative test: rms(fast - fp64 oracle) <= k_const * rms(reference - oracle) + floor per output, floor = "
     "k_per_term * (u * rms(sum_abs) + u_bf16 * rms(sum_abs_bf16)) with the gpu rows' magnitudes (bf16 part: bf16 "
     "policy only); the oracle is the reference op in fp64 on the same (bf16 policy: bf16-rounded) GEMM operands. "
     "The fast side's worst-case bound is at most twice the reference's per term (truncating adds) plus the online "
     "rescales: 4. The floor is two roundings of the terms' magnitude: below it the two errors are rounding noise "
     "that no ratio orders (cancellation: an exact result of 0 with both sides at u * sum|terms|; a few bf16 "
     "roundings per element that happen to cancel on the reference's side). fp64 kernel sets: the oracle would be "
     "the reference itself; only the bound rows apply"},
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
