// Shared by the kernel-tier properties (prop_cuda_ref, prop_cuda_fast): a random policy and its element type, and
// random attention-core dimensions.
#pragma once
#include <rapidcheck.h>

#include <cstdint>

#include "reference/model/attention.h"
#include "reference/policy.h"

namespace trident::proptest {

// Draws fp32, bf16 or fp64 and calls f(T{}, policy) with T = double for fp64, float otherwise.
template <class F>
void with_random_policy(F&& f) {
  const Policy pol = *rc::gen::element(Policy::fp32, Policy::bf16, Policy::fp64);
  if (pol == Policy::fp64) f(double{}, pol);
  else f(float{}, pol);
}

// MLA (one group, values inside the key payload) or GQA (G groups of separate keys and values) core dimensions:
// Dq in [1, dq_end), Dv in [1, Dq] (MLA) or [1, dv_end) (GQA); scale left to the caller.
inline model::CoreDims random_core_dims(int dq_end, int dv_end) {
  model::CoreDims cd;
  const bool mla = *rc::gen::arbitrary<bool>();
  cd.G = mla ? 1 : *rc::gen::inRange(1, 3);
  cd.H = cd.G * *rc::gen::inRange(1, 3);
  cd.Dq = *rc::gen::inRange(1, dq_end);
  cd.Dv = mla ? *rc::gen::inRange<int64_t>(1, cd.Dq + 1) : *rc::gen::inRange<int64_t>(1, dv_end);
  cd.P = mla ? cd.Dq : cd.G * (cd.Dq + cd.Dv);
  cd.val_base = mla ? 0 : cd.G * cd.Dq;
  return cd;
}

}  // namespace trident::proptest
