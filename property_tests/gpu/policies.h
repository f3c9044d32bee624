// Shared by the kernel-tier properties (prop_cuda_ref, prop_cuda_fast): a random policy and its element type.
#pragma once
#include <rapidcheck.h>

#include "reference/policy.h"

namespace trident::proptest {

// Draws fp32, bf16 or fp64 and calls f(T{}, policy) with T = double for fp64, float otherwise.
template <class F>
void with_random_policy(F&& f) {
  const Policy pol = *rc::gen::element(Policy::fp32, Policy::bf16, Policy::fp64);
  if (pol == Policy::fp64) f(double{}, pol);
  else f(float{}, pol);
}

}  // namespace trident::proptest
